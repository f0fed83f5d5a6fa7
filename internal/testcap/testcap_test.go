package testcap

import (
	"bytes"
	"encoding/binary"
	"os"
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

// sll2Pcap rewrites the Ethernet capture at path as `tcpdump -i any` writes it today:
// LINKTYPE_LINUX_SLL2 (276), each frame's 14-byte Ethernet header replaced by the 20-byte
// cooked v2 header (protocol type, reserved, interface index, ARPHRD_ETHER, packet type,
// address length, address). The file is built byte by byte, independently of the reader.
func sll2Pcap(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if le.Uint32(b) != 0xa1b2c3d4 {
		t.Fatalf("%s: not a little-endian microsecond pcap", path)
	}
	out := append([]byte(nil), b[:24]...)
	le.PutUint32(out[20:], 276)
	for off := 24; off+16 <= len(b); {
		incl := int(le.Uint32(b[off+8:]))
		rec, data := b[off:off+16], b[off+16:off+16+incl]
		off += 16 + incl
		var sll2 [20]byte
		copy(sll2[0:2], data[12:14])              // protocol type: the EtherType
		binary.BigEndian.PutUint32(sll2[4:8], 2)  // interface index
		binary.BigEndian.PutUint16(sll2[8:10], 1) // ARPHRD_ETHER
		sll2[10], sll2[11] = 4, 6                 // PACKET_OUTGOING, 6-byte address
		copy(sll2[12:18], data[6:12])             // the source MAC
		frame := append(sll2[:], data[14:]...)
		h := append([]byte(nil), rec...)
		le.PutUint32(h[8:], uint32(len(frame)))
		le.PutUint32(h[12:], le.Uint32(rec[12:])+6)
		out = append(append(out, h...), frame...)
	}
	p := filepath.Join(t.TempDir(), "sll2.pcap")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadSLL2: a capture with the Linux cooked v2 link type (276, what `tcpdump -i any`
// writes) yields the same IP frames as the Ethernet capture it was made from. A link type
// kept in 8 bits (276 read as 20) would yield none.
func TestReadSLL2(t *testing.T) {
	src := filepath.Join(captures, "ib_write_bw.pcap")
	want, err := Read(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Read(sll2Pcap(t, src))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("SLL2 capture: %d IP frames, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Number != w.Number || !bytes.Equal(g.IP, w.IP) || !bytes.Equal(g.UDPPayload, w.UDPPayload) ||
			g.Src != w.Src || g.Dst != w.Dst || g.SrcPort != w.SrcPort || g.DstPort != w.DstPort || g.IPv4ID != w.IPv4ID {
			t.Fatalf("frame %d differs: got %+v, want %+v", w.Number, g, w)
		}
	}
}
