package testcap

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/pkg/bth"
)

const hostToGuest = captures + "/host-to-guest-rc.pcap"

// roceDatagrams returns the RoCE datagrams of records.
func roceDatagrams(recs []Record) []IPUDP {
	var out []IPUDP
	for i := range recs {
		if d, ok := DecodeIPUDP(&recs[i]); ok && d.DstPort == bth.UDPPort {
			out = append(out, d)
		}
	}
	return out
}

func TestReadStream(t *testing.T) {
	b, err := os.ReadFile(hostToGuest)
	if err != nil {
		t.Fatal(err)
	}
	all, err := ReadStream(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	// tcpdump counts 27 frames in this file (captures/README.md)
	if len(all) != 27 || all[0].LinkType != layers.LinkTypeEthernet {
		t.Fatalf("%d frames, link %d; want 27 Ethernet", len(all), all[0].LinkType)
	}
	// a file cut inside the last record yields the complete ones
	part, err := ReadStream(bytes.NewReader(b[:len(b)-3]))
	if err != nil || len(part) != 26 {
		t.Errorf("truncated file: %d frames, err %v; want 26", len(part), err)
	}
	// Read (a finished file) does not accept the cut
	p := t.TempDir() + "/cut.pcap"
	if err := os.WriteFile(p, b[:len(b)-3], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil {
		t.Error("Read accepted a file cut inside a record")
	}
	for _, junk := range [][]byte{nil, {1, 2, 3}, []byte("not a pcap file at all!!"), make([]byte, 24)} {
		if _, err := ReadStream(bytes.NewReader(junk)); !errors.Is(err, ErrCapture) {
			t.Errorf("%q: err %v, want ErrCapture", junk, err)
		}
	}
	// every captured RoCE packet has a valid ICRC over its real IP header
	wire := roceDatagrams(all)
	if len(wire) == 0 {
		t.Fatal("no RoCE datagrams")
	}
	for _, d := range wire {
		want, err := bth.ICRCFromIP(d.IP)
		if err != nil || bth.GetICRC(d.Payload) != want {
			t.Errorf("%v id %d: ICRC %#x, computed %#x (%v)", d.Src, d.ID, bth.GetICRC(d.Payload), want, err)
		}
	}
}

// TestReadStreamPcapng: the same records written as pcapng (pcapgo's NgWriter, two
// interfaces of different link types) read back with their link types and bytes.
func TestReadStreamPcapng(t *testing.T) {
	f, err := os.Open(hostToGuest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadStream(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := pcapgo.NewNgWriterInterface(&buf, pcapgo.NgInterface{LinkType: layers.LinkTypeEthernet, SnapLength: 65535}, pcapgo.DefaultNgWriterOptions)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := w.AddInterface(pcapgo.NgInterface{LinkType: layers.LinkTypeRaw, SnapLength: 65535})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]Record, len(recs))
	for i, r := range recs {
		ci := gopacket.CaptureInfo{Timestamp: r.Time, CaptureLength: len(r.Data), Length: r.OrigLen}
		want[i] = r
		if i%2 == 1 { // odd records as raw IP on the second interface
			want[i].LinkType, want[i].Data = layers.LinkTypeRaw, r.Data[14:]
			ci.InterfaceIndex, ci.CaptureLength, ci.Length = raw, len(r.Data)-14, r.OrigLen-14
			want[i].OrigLen = ci.Length
		}
		if err := w.WritePacket(ci, want[i].Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadStream(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.LinkType != w.LinkType || !bytes.Equal(g.Data, w.Data) || g.OrigLen != w.OrigLen || !g.Time.Equal(w.Time) {
			t.Fatalf("record %d: link %d len %d orig %d %v, want link %d len %d orig %d %v", i+1,
				g.LinkType, len(g.Data), g.OrigLen, g.Time, w.LinkType, len(w.Data), w.OrigLen, w.Time)
		}
	}
	if n, m := len(roceDatagrams(got)), len(roceDatagrams(recs)); n != m {
		t.Errorf("%d RoCE datagrams from the pcapng, %d from the pcap", n, m)
	}
}

// TestDecodeIPv6: kernel rxe's RoCEv2 over IPv6 (the lab's capture) decodes with its addresses,
// ports and UDP checksum 0, and every ICRC verifies over the real IPv6 header; raw IP frames
// decode too; truncations and extension headers do not.
func TestDecodeIPv6(t *testing.T) {
	f, err := os.Open(captures + "/guest-to-host-rc-ipv6.pcap")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadStream(f)
	if err != nil {
		t.Fatal(err)
	}
	wire := roceDatagrams(recs)
	if len(wire) != 26 {
		t.Fatalf("%d RoCE packets, want 26", len(wire))
	}
	guest, host := netip.MustParseAddr("2001:db8:198:18::2"), netip.MustParseAddr("2001:db8:198:18::1")
	for _, d := range wire {
		if d.Src != guest || d.Dst != host || d.UDPChecksum != 0 || d.ID != 0 || d.DF || d.TTL == 0 {
			t.Fatalf("%+v", d)
		}
		want, err := bth.ICRCFromIP(d.IP)
		if err != nil || bth.GetICRC(d.Payload) != want {
			t.Errorf("ICRC %#x, computed %#x (%v)", bth.GetICRC(d.Payload), want, err)
		}
	}
	for _, c := range []Record{{LinkType: layers.LinkTypeRaw, Data: wire[0].IP}, {LinkType: layers.LinkTypeIPv6, Data: wire[0].IP},
		{LinkType: layers.LinkTypeLinuxSLL2, Data: append(append([]byte{0x86, 0xDD}, make([]byte, 18)...), wire[0].IP...)}} {
		if d, ok := DecodeIPUDP(&c); !ok || d.Src != guest || !bytes.Equal(d.Payload, wire[0].Payload) {
			t.Errorf("link type %d: ok %v", c.LinkType, ok)
		}
	}
	frame := append(append(make([]byte, 12), 0x86, 0xDD), wire[0].IP...)
	for i := 0; i < len(frame); i++ {
		if _, ok := DecodeIPUDP(&Record{LinkType: layers.LinkTypeEthernet, Data: frame[:i]}); ok {
			t.Errorf("IPv6 frame truncated to %d bytes decoded", i)
		}
	}
	ext := bytes.Clone(frame)
	ext[14+6] = 0 // a hop-by-hop options header, not UDP
	if _, ok := DecodeIPUDP(&Record{LinkType: layers.LinkTypeEthernet, Data: ext}); ok {
		t.Error("IPv6 with an extension header decoded")
	}
}

func TestDecodeIPUDPRejects(t *testing.T) {
	f, err := os.Open(hostToGuest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadStream(f)
	if err != nil {
		t.Fatal(err)
	}
	wire := roceDatagrams(recs)
	eth := append(make([]byte, 12), 0x08, 0x00)
	frame := append(eth, wire[0].IP...)
	if _, ok := DecodeIPUDP(&Record{LinkType: layers.LinkTypeEthernet, Data: frame}); !ok {
		t.Fatal("rebuilt frame does not decode")
	}
	for i := 0; i < len(frame); i++ {
		f := Record{LinkType: layers.LinkTypeEthernet, Data: frame[:i]}
		if _, ok := DecodeIPUDP(&f); ok {
			t.Errorf("frame truncated to %d bytes decoded", i)
		}
	}
	frag := bytes.Clone(frame)
	frag[14+6] |= 0x20 // MF
	if _, ok := DecodeIPUDP(&Record{LinkType: layers.LinkTypeEthernet, Data: frag}); ok {
		t.Error("fragment decoded")
	}
	// the cooked headers: v1 (16 bytes, protocol at 14) and v2 (20 bytes, protocol at 0)
	sll := append(append(make([]byte, 14), 0x08, 0x00), wire[0].IP...)
	sll2 := append(append([]byte{0x08, 0x00}, make([]byte, 18)...), wire[0].IP...)
	for _, c := range []Record{{LinkType: layers.LinkTypeLinuxSLL, Data: sll}, {LinkType: layers.LinkTypeLinuxSLL2, Data: sll2}, {LinkType: layers.LinkTypeRaw, Data: wire[0].IP}} {
		d, ok := DecodeIPUDP(&c)
		if !ok || !bytes.Equal(d.IP, wire[0].IP) || d.ID != wire[0].ID {
			t.Errorf("link type %d: ok %v", c.LinkType, ok)
		}
	}
	if _, ok := DecodeIPUDP(&Record{LinkType: layers.LinkTypeLinuxSLL2, Data: sll}); ok {
		t.Error("an SLL v1 frame decoded as SLL2")
	}
}

// Remote input (captured frames) must never panic.

func FuzzDecodeIPUDP(f *testing.F) {
	b, err := os.ReadFile(hostToGuest)
	if err != nil {
		f.Fatal(err)
	}
	recs, err := ReadStream(bytes.NewReader(b))
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range recs {
		f.Add(r.Data, uint16(layers.LinkTypeEthernet))
	}
	if b, err = os.ReadFile(captures + "/guest-to-host-rc-ipv6.pcap"); err != nil {
		f.Fatal(err)
	}
	if recs, err = ReadStream(bytes.NewReader(b)); err != nil || len(recs) == 0 {
		f.Fatal(len(recs), err)
	}
	f.Add(recs[len(recs)-1].Data, uint16(layers.LinkTypeEthernet))
	f.Add([]byte{0x45}, uint16(layers.LinkTypeRaw))
	f.Add([]byte{0x60}, uint16(layers.LinkTypeRaw))
	f.Fuzz(func(t *testing.T, data []byte, link uint16) {
		r := Record{LinkType: layers.LinkType(link), Data: data}
		d, ok := DecodeIPUDP(&r)
		if ok && (len(d.Payload) > len(d.IP) || len(d.IP) > len(data)) {
			t.Fatalf("decoded slices exceed the frame: ip %d payload %d frame %d", len(d.IP), len(d.Payload), len(data))
		}
	})
}

func FuzzReadStream(f *testing.F) {
	b, err := os.ReadFile(hostToGuest)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b[:200])
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ReadStream(bytes.NewReader(data))
	})
}
