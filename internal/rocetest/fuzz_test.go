package rocetest

import (
	"testing"
)

// Remote input (out-of-band records) must never panic.

func FuzzParsePingpongDest(f *testing.F) {
	f.Add([]byte("0000:000012:3241ab:00000000000000000000ffffc6120002\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParsePingpongDest(data)
		if err != nil {
			return
		}
		// a record that parses re-parses to the same value after Marshal
		d2, err := ParsePingpongDest(d.Marshal())
		if err != nil || d2 != d {
			t.Fatalf("round trip %+v -> %q -> %+v, %v", d, d.Marshal(), d2, err)
		}
	})
}
