package event

import "testing"

func TestNumberingAndText(t *testing.T) {
	// ibv_event_type values and ibv_event_type_str text.
	want := []struct {
		t    Type
		v    uint8
		text string
	}{
		{CQErr, 0, "CQ error"}, {QPFatal, 1, "local work queue catastrophic error"},
		{CommEst, 4, "communication established"}, {SQDrained, 5, "send queue drained"},
		{DeviceFatal, 8, "local catastrophic error"}, {PortActive, 9, "port active"},
		{PortErr, 10, "port error"}, {SRQLimitReached, 15, "SRQ limit reached"},
		{QPLastWQEReached, 16, "last WQE reached"}, {WQFatal, 19, "WQ fatal"}, {Type(99), 99, "unknown"},
	}
	for _, w := range want {
		if uint8(w.t) != w.v || w.t.String() != w.text {
			t.Errorf("%d: %q, want %d %q", w.t, w.t.String(), w.v, w.text)
		}
	}
	for ty := CQErr; ty <= WQFatal; ty++ {
		if ty.String() == "" || ty.String() == "unknown" {
			t.Errorf("type %d unnamed", ty)
		}
	}
}
