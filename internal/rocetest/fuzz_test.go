package rocetest

import (
	"bytes"
	"os"
	"testing"
)

// Remote input (captured frames, out-of-band records) must never panic.

func FuzzDecodeIPv4UDP(f *testing.F) {
	b, err := os.ReadFile("../../testdata/captures/host-to-guest-rc.pcap")
	if err != nil {
		f.Fatal(err)
	}
	frames, err := ReadPcap(bytes.NewReader(b))
	if err != nil {
		f.Fatal(err)
	}
	for _, fr := range frames {
		f.Add(fr.Data, uint32(LinkEthernet))
	}
	f.Add([]byte{0x45}, uint32(LinkRaw))
	f.Fuzz(func(t *testing.T, data []byte, link uint32) {
		fr := Frame{LinkType: link, Data: data}
		d, ok := DecodeIPv4UDP(&fr)
		if ok && (len(d.Payload) > len(d.IP) || len(d.IP) > len(data)) {
			t.Fatalf("decoded slices exceed the frame: ip %d payload %d frame %d", len(d.IP), len(d.Payload), len(data))
		}
	})
}

func FuzzReadPcap(f *testing.F) {
	b, err := os.ReadFile("../../testdata/captures/host-to-guest-rc.pcap")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b[:200])
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ReadPcap(bytes.NewReader(data))
	})
}

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
