package bth

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/testcap"
)

// ipMasked reports whether byte i of an IP packet (header hl bytes) is one
// of the ICRC-masked fields of IBTA A17.3.3, and for IPv6 byte 0 which bits.
func ipMaskedBits(f *testcap.Frame, i int) byte {
	hl := 20
	if f.IsIPv6 {
		hl = 40
		switch {
		case i == 0:
			return 0x0F // traffic class high nibble (the version nibble counts)
		case i >= 1 && i <= 3: // traffic class low nibble, flow label
			return 0xFF
		case i == 7: // hop limit
			return 0xFF
		}
	} else {
		switch i {
		case 1, 8, 10, 11: // TOS, TTL, header checksum
			return 0xFF
		}
	}
	switch i - hl {
	case 6, 7: // UDP checksum
		return 0xFF
	case udpHdrSize + bthFECN: // BTH byte 4
		return 0xFF
	}
	return 0
}

// TestBitFlipEverywhere flips every bit of captured IP packets: outside the
// masked fields the ICRC check must fail, inside them the ICRC must not
// change.
func TestBitFlipEverywhere(t *testing.T) {
	frames := captureFrames(t)
	for _, name := range []string{"ib_read_lat.pcap", "udaddy.pcap", "guest-to-host-rc-ipv6.pcap", "ib_atomic_bw_faa.pcap"} {
		for fi := 0; fi < 2 && fi < len(frames[name]); fi++ {
			f := frames[name][fi]
			ip := f.IP
			want := GetICRC(f.UDPPayload)
			for i := range ip {
				m := ipMaskedBits(&f, i)
				for b := 0; b < 8; b++ {
					ip[i] ^= 1 << b
					got, err := ICRCFromIP(ip)
					ok := err == nil && got == GetICRC(f.UDPPayload)
					masked := m&(1<<b) != 0
					if masked && (!ok || got != want) {
						t.Fatalf("%s frame %d: flipping masked byte %d bit %d changed the ICRC (%v)", name, f.Number, i, b, err)
					}
					if !masked && ok {
						t.Fatalf("%s frame %d: flipping byte %d bit %d not detected", name, f.Number, i, b)
					}
					ip[i] ^= 1 << b
				}
			}
			// The same through the endpoints API, on the UDP payload.
			ep := endpointsOf(&f)
			p := f.UDPPayload
			for i := range p {
				for b := 0; b < 8; b++ {
					p[i] ^= 1 << b
					ok := VerifyICRC(&ep, p)
					if i == bthFECN && !ok {
						t.Fatalf("%s frame %d: BTH byte 4 bit %d is not masked", name, f.Number, b)
					}
					if i != bthFECN && ok {
						t.Fatalf("%s frame %d: flip of payload byte %d bit %d not detected", name, f.Number, i, b)
					}
					p[i] ^= 1 << b
				}
			}
		}
	}
}

func TestICRCFromIPErrors(t *testing.T) {
	f := captureFrames(t)["rc_pingpong.pcap"][0]
	cases := []struct {
		name string
		ip   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version 5", append([]byte{0x55}, f.IP[1:]...), ErrNotRoCEIP},
		{"ihl 4", append([]byte{0x44}, f.IP[1:]...), ErrNotRoCEIP},
		{"tcp", func() []byte { b := append([]byte(nil), f.IP...); b[9] = 6; return b }(), ErrNotRoCEIP},
		{"short", f.IP[:27], ErrTruncated},
		{"total length beyond", f.IP[:len(f.IP)-1], ErrTruncated},
		{"udp length too small", func() []byte { b := append([]byte(nil), f.IP...); b[24], b[25] = 0, 11; return b }(), ErrTruncated},
		{"ipv6 short", []byte{0x60, 0, 0, 0}, ErrTruncated},
	}
	for _, c := range cases {
		if _, err := ICRCFromIP(c.ip); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
	for n := 0; n < len(f.IP); n++ {
		if _, err := ICRCFromIP(f.IP[:n]); err == nil {
			t.Fatalf("truncated to %d accepted", n)
		}
	}
}

func TestICRCShortInputs(t *testing.T) {
	ep := Endpoints{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2")}
	for n := 0; n < 20; n++ {
		b := make([]byte, n)
		_ = ICRC(&ep, b) // must not panic
		SetICRC(b, 0xA1B2C3D4)
		if n >= 4 && GetICRC(b) != 0xA1B2C3D4 {
			t.Fatalf("len %d: Set/Get", n)
		}
		if n < 4 && GetICRC(b) != 0 {
			t.Fatalf("len %d: GetICRC of short input", n)
		}
		if n < BTHSize+ICRCSize && VerifyICRC(&ep, b) {
			t.Fatalf("len %d verified", n)
		}
	}
	b := make([]byte, 8)
	SetICRC(b, 0x04030201)
	if b[4] != 1 || b[7] != 4 {
		t.Fatalf("ICRC not little-endian: %x", b)
	}
}

// TestICRCIPv4MappedEqualsIPv4: IPv4-mapped addresses are IPv4.
func TestICRCIPv4Mapped(t *testing.T) {
	f := captureFrames(t)["rc_pingpong.pcap"][0]
	ep := endpointsOf(&f)
	ep.Src = netip.AddrFrom16(ep.Src.As16())
	ep.Dst = netip.AddrFrom16(ep.Dst.As16())
	if !VerifyICRC(&ep, f.UDPPayload) {
		t.Fatal("IPv4-mapped endpoints do not verify")
	}
}

// TestICRCAllocs: the data path allocates nothing.
func TestICRCAllocs(t *testing.T) {
	f := captureFrames(t)["ib_write_bw.pcap"][0]
	ep := endpointsOf(&f)
	p := f.UDPPayload
	if n := testing.AllocsPerRun(100, func() { _ = VerifyICRC(&ep, p) }); n != 0 {
		t.Fatalf("VerifyICRC: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() { SolveIPv4ID(&ep, p) }); n != 0 {
		t.Fatalf("SolveIPv4ID: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = ICRCFromIP(f.IP) }); n != 0 {
		t.Fatalf("ICRCFromIP: %v allocs", n)
	}
}

// TestICRCMixedFamilies: a mixed-family Endpoints must not panic.
func TestICRCMixedFamilies(t *testing.T) {
	b := make([]byte, 32)
	for _, ep := range []Endpoints{
		{Src: netip.MustParseAddr("1.2.3.4"), Dst: netip.MustParseAddr("2001:db8::1")},
		{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("1.2.3.4")},
		{},
	} {
		_ = ICRC(&ep, b)
		_, _ = SolveIPv4ID(&ep, b)
	}
}
