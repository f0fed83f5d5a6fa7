package roce

import "testing"

type notEmbedded struct{ Verbs }

func TestDeviceOf(t *testing.T) {
	d := &Device{}
	if got := DeviceOf(d.Verbs()); got != d {
		t.Fatalf("DeviceOf(embedded) = %p, want %p", got, d)
	}
	if got := DeviceOf(notEmbedded{d.Verbs()}); got != nil {
		t.Fatalf("DeviceOf(other Verbs) = %p, want nil", got)
	}
	if got := DeviceOf(nil); got != nil {
		t.Fatalf("DeviceOf(nil) = %p, want nil", got)
	}
}
