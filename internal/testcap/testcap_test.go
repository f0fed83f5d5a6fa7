package testcap

import (
	"path/filepath"
	"testing"
)

const captures = "../../testdata/captures"

func TestReadWriteBW(t *testing.T) {
	fr, err := ReadRoCE(filepath.Join(captures, "ib_write_bw.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	// The README of the captures: 20 RoCE packets; tshark frame 20 is the
	// first, an RC RDMA Write First from 198.19.0.1 (1098-byte frame).
	if len(fr) != 20 {
		t.Fatalf("got %d RoCE frames, want 20", len(fr))
	}
	f := fr[0]
	if f.Number != 20 || f.Src.String() != "198.19.0.1" || f.Dst.String() != "198.19.0.2" {
		t.Fatalf("first frame %d %v -> %v", f.Number, f.Src, f.Dst)
	}
	if len(f.IP) != 1098-14 || len(f.UDPPayload) != 1098-14-28 {
		t.Fatalf("lengths ip %d udp payload %d", len(f.IP), len(f.UDPPayload))
	}
	if f.UDPPayload[0] != 0x06 || f.IPv4ID == 0 {
		t.Fatalf("opcode %#x id %#x", f.UDPPayload[0], f.IPv4ID)
	}
}

func TestReadIPv6(t *testing.T) {
	fr, err := ReadRoCE(filepath.Join(captures, "guest-to-host-rc-ipv6.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	if len(fr) == 0 {
		t.Fatal("no RoCE frames")
	}
	for _, f := range fr {
		if !f.IsIPv6 || !f.Src.Is6() || f.IPv4ID != 0 {
			t.Fatalf("frame %d not IPv6: %+v", f.Number, f.Src)
		}
	}
}

func TestParsePcapErrors(t *testing.T) {
	if _, _, err := parsePcap([]byte{1, 2, 3}); err == nil {
		t.Fatal("short header accepted")
	}
	if _, _, err := parsePcap(make([]byte, 24)); err == nil {
		t.Fatal("bad magic accepted")
	}
}
