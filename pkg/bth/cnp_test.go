package bth

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// connectX4LxCNP is a CNP a ConnectX-4 Lx sent, as an Ethernet frame: published with scapy's
// RoCE tests (test/contrib/roce.uts, "RoCE CNP captured on ConnectX-4 Lx"), whose layer
// recomputes the same ICRC (0x82fd002a) from it. IPv4 10.0.17.1 -> 10.0.18.1, TOS 0xc2 (DSCP 48,
// ECN ECT(0)), Identification 0x718c, DF, TTL 64; UDP source port 0 -> 4791, checksum 0;
// DestQP 0x000118.
const connectX4LxCNP = `
e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
003c 718c 4000 4011 9161 0a00 1101 0a00
1201 0000 12b7 0028 0000 8100 ffff 4000
0118 0000 0000 0000 0000 0000 0000 0000
0000 0000 0000 82fd 002a`

func hexFrame(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCNPGolden: the CNP softroce builds for the captured endpoints is the ConnectX-4 Lx's UDP
// payload byte for byte, ICRC included (IBTA A17.9.3, A17.3.3), and the captured one parses as
// a CNP with the fields the view reads.
func TestCNPGolden(t *testing.T) {
	frame := hexFrame(t, connectX4LxCNP)
	ip := frame[14:]
	udp := ip[20:]
	payload := udp[8:]
	if len(payload) != CNPSize {
		t.Fatalf("captured UDP payload %d bytes, want %d", len(payload), CNPSize)
	}
	if tos := ip[1]; tos>>2 != 48 || tos&3 != 2 {
		t.Fatalf("captured TOS %#x: want DSCP 48 with ECT(0)", tos)
	}
	ep := Endpoints{
		Src: netip.AddrFrom4([4]byte(ip[12:16])), Dst: netip.AddrFrom4([4]byte(ip[16:20])),
		SrcPort: binary.BigEndian.Uint16(udp[0:]), DstPort: binary.BigEndian.Uint16(udp[2:]),
		IPID: binary.BigEndian.Uint16(ip[4:]),
	}
	if ep.DstPort != UDPPort {
		t.Fatalf("captured destination port %d", ep.DstPort)
	}

	// the whole captured frame's ICRC, over its real IP header, and over the endpoints
	if got, err := ICRCFromIP(ip); err != nil || got != GetICRC(payload) {
		t.Fatalf("ICRCFromIP = %#x, %v; captured %#x", got, err, GetICRC(payload))
	}
	if !VerifyICRC(&ep, payload) {
		t.Fatal("captured CNP fails VerifyICRC")
	}

	// built by softroce
	buf := make([]byte, CNPSize+8)
	for i := range buf {
		buf[i] = 0xA5 // Encode must write every byte it owns
	}
	got := PutCNP(buf, &ep, &CNPFields{DestQP: 0x118, PKey: CNPPKey})
	if !bytes.Equal(got, payload) {
		t.Fatalf("built CNP\n%x\ncaptured\n%x", got, payload)
	}

	// parsed
	p, err := Parse(payload)
	if err != nil {
		t.Fatal(err)
	}
	if p.Info.Kind != KindCNP || p.Info.Transport != TransportCNP || p.Info.Request || p.Payload != nil {
		t.Fatalf("parsed %+v", p.Info)
	}
	c := CNP(payload)
	f := c.BTH().Fields()
	want := BTHFields{Opcode: OpCNP, PKey: 0xFFFF, BECN: true, DestQP: 0x118}
	if f != want || c.DestQP() != 0x118 || c.Fields() != (CNPFields{DestQP: 0x118, PKey: CNPPKey}) {
		t.Fatalf("fields %+v %+v", f, c.Fields())
	}
	if !bytes.Equal(c.Reserved(), make([]byte, CNPResvSize)) {
		t.Fatalf("reserved %x", c.Reserved())
	}
}

// TestCNPIPv6 builds a CNP over IPv6 and checks it with ICRCFromIP on a full IPv6 header whose
// traffic class, flow label and hop limit differ (masked, A17.3.3).
func TestCNPIPv6(t *testing.T) {
	ep := Endpoints{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"),
		SrcPort: 0xC123, DstPort: UDPPort}
	c := PutCNP(make([]byte, CNPSize), &ep, &CNPFields{DestQP: 0xABCDEF, PKey: CNPPKey})
	ip := make([]byte, 40+8+CNPSize)
	ip[0], ip[1], ip[2], ip[3] = 0x6C, 0x21, 0x23, 0x45 // traffic class 0xC2, a flow label
	binary.BigEndian.PutUint16(ip[4:], uint16(8+CNPSize))
	ip[6], ip[7] = 17, 3
	s, d := ep.Src.As16(), ep.Dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	binary.BigEndian.PutUint16(ip[40:], ep.SrcPort)
	binary.BigEndian.PutUint16(ip[42:], ep.DstPort)
	binary.BigEndian.PutUint16(ip[44:], uint16(8+CNPSize))
	copy(ip[48:], c)
	if got, err := ICRCFromIP(ip); err != nil || got != GetICRC(c) {
		t.Fatalf("ICRCFromIP = %#x, %v; built %#x", got, err, GetICRC(c))
	}
	if CNP(c).DestQP() != 0xABCDEF {
		t.Fatal("DestQP")
	}
}

// TestCNPTruncated: a CNP cut anywhere fails Parse with ErrTruncated; one with bytes after the
// reserved ones fails with ErrBadLength (a CNP carries no payload).
func TestCNPTruncated(t *testing.T) {
	ep := Endpoints{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2"),
		SrcPort: 50000, DstPort: UDPPort}
	c := PutCNP(make([]byte, CNPSize), &ep, &CNPFields{DestQP: 7, PKey: CNPPKey})
	for n := 0; n < CNPSize; n++ {
		if _, err := Parse(c[:n]); !errors.Is(err, ErrTruncated) {
			t.Fatalf("len %d: %v", n, err)
		}
	}
	long := append(append([]byte{}, c...), 0, 0, 0, 0)
	if _, err := Parse(long); !errors.Is(err, ErrBadLength) {
		t.Fatalf("CNP with 4 bytes more: %v", err)
	}
}
