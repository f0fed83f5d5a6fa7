package layer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/pkg/bth"
)

const capturesDir = "../../../testdata/captures"

// readPcapFrames returns the records of a classic pcap file (the reference
// captures are little-endian, microsecond, Ethernet).
func readPcapFrames(tb testing.TB, path string) [][]byte {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 {
		tb.Fatalf("%s: not a little-endian pcap", path)
	}
	if lt := binary.LittleEndian.Uint32(b[20:]); lt != 1 {
		tb.Fatalf("%s: link type %d, want Ethernet", path, lt)
	}
	var out [][]byte
	for off := 24; off < len(b); {
		if off+16 > len(b) {
			tb.Fatalf("%s: truncated record header", path)
		}
		n := int(binary.LittleEndian.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) {
			tb.Fatalf("%s: truncated record", path)
		}
		out = append(out, b[off:off+n])
		off += n
	}
	return out
}

func captureFiles(tb testing.TB) []string {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(capturesDir, "*.pcap"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no captures in %s: %v", capturesDir, err)
	}
	return files
}

// wantRoCE is the number of RoCE packets per capture, from the table in
// testdata/captures' README (rxe-lab/captures/README.md) and, for the IPv6
// capture, its section there.
var wantRoCE = map[string]int{
	"guest-to-host-rc.pcap": 56, "host-to-guest-rc.pcap": 4, "ib_atomic_bw_cas.pcap": 10,
	"ib_atomic_bw_faa.pcap": 10, "ib_read_bw.pcap": 20, "ib_read_lat.pcap": 10,
	"ib_send_bw.pcap": 20, "ib_send_lat.pcap": 20, "ib_write_bw.pcap": 20,
	"ib_write_lat.pcap": 20, "rc_pingpong.pcap": 16, "rc_pingpong_small.pcap": 8,
	"rping.pcap": 29, "srq_pingpong.pcap": 10, "uc_pingpong.pcap": 12,
	"ucmatose.pcap": 13, "ud_pingpong.pcap": 4, "udaddy.pcap": 6,
	"guest-to-host-rc-ipv6.pcap": 26, "ipv6-rping.pcap": 95,
}

// TestDecodeEveryCaptureFrame: gopacket.NewPacket on every Ethernet frame of
// every capture yields Ethernet / IPv4|IPv6 / UDP / RoCE (/ Payload) for each
// UDP 4791 frame, with no decode failure, layers that tile the UDP payload,
// and the RoCE counts of the captures' README.
func TestDecodeEveryCaptureFrame(t *testing.T) {
	for _, f := range captureFiles(t) {
		name := filepath.Base(f)
		want, ok := wantRoCE[name]
		if !ok {
			t.Errorf("%s: no expected count (new capture?)", name)
		}
		got := 0
		for i, frame := range readPcapFrames(t, f) {
			pkt := gopacket.NewPacket(frame, layers.LinkTypeEthernet, gopacket.Default)
			udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
			if udp == nil || (udp.DstPort != bth.UDPPort && udp.SrcPort != bth.UDPPort) {
				if pkt.Layer(LayerTypeRoCE) != nil {
					t.Errorf("%s frame %d: RoCE layer on a non-4791 frame", name, i+1)
				}
				continue
			}
			got++
			if el := pkt.ErrorLayer(); el != nil {
				t.Errorf("%s frame %d: %v", name, i+1, el.Error())
				continue
			}
			ls := pkt.Layers()
			if len(ls) < 4 || ls[0].LayerType() != layers.LayerTypeEthernet ||
				(ls[1].LayerType() != layers.LayerTypeIPv4 && ls[1].LayerType() != layers.LayerTypeIPv6) ||
				ls[2].LayerType() != layers.LayerTypeUDP || ls[3].LayerType() != LayerTypeRoCE {
				t.Errorf("%s frame %d: layers %v", name, i+1, ls)
				continue
			}
			r := ls[3].(*RoCE)
			if len(r.Payload) > 0 {
				if len(ls) != 5 || ls[4].LayerType() != gopacket.LayerTypePayload || !bytes.Equal(ls[4].LayerContents(), r.Payload) {
					t.Errorf("%s frame %d: payload layer missing or different: %v", name, i+1, ls)
				}
			} else if len(ls) != 4 {
				t.Errorf("%s frame %d: extra layers after an empty payload: %v", name, i+1, ls)
			}
			var whole []byte
			whole = append(whole, r.LayerContents()...)
			whole = append(whole, r.LayerPayload()...)
			whole = append(whole, r.Trailer()...)
			if !bytes.Equal(whole, udp.Payload) {
				t.Errorf("%s frame %d: contents+payload+trailer != UDP payload", name, i+1)
			}
			if len(r.Contents) != r.Packet.Info.HdrLen || !bytes.Equal(r.Packet.ICRC, udp.Payload[len(udp.Payload)-4:]) {
				t.Errorf("%s frame %d: header length %d (want %d) or ICRC view wrong", name, i+1, len(r.Contents), r.Packet.Info.HdrLen)
			}
			if r.NextLayerType() == gopacket.LayerTypeZero && len(r.Payload) != 0 {
				t.Errorf("%s frame %d: NextLayerType zero with payload", name, i+1)
			}
		}
		if got != want {
			t.Errorf("%s: %d RoCE frames, README says %d", name, got, want)
		}
	}
}

// TestDecodingLayerParserZeroAlloc: decoding a RoCE frame with a reused
// DecodingLayerParser allocates nothing.
func TestDecodingLayerParserZeroAlloc(t *testing.T) {
	frames := readPcapFrames(t, filepath.Join(capturesDir, "ib_write_bw.pcap"))
	var frame []byte
	for _, fr := range frames {
		p := gopacket.NewPacket(fr, layers.LinkTypeEthernet, gopacket.Default)
		if r, ok := p.Layer(LayerTypeRoCE).(*RoCE); ok && r.Packet.RETH != nil {
			frame = fr
			break
		}
	}
	if frame == nil {
		t.Fatal("no RDMA WRITE First in ib_write_bw.pcap")
	}
	var (
		eth     layers.Ethernet
		ip4     layers.IPv4
		ip6     layers.IPv6
		udp     layers.UDP
		roce    RoCE
		payload gopacket.Payload
	)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip4, &ip6, &udp, &roce, &payload)
	decoded := make([]gopacket.LayerType, 0, 8)
	if err := parser.DecodeLayers(frame, &decoded); err != nil {
		t.Fatal(err)
	}
	if len(decoded) != 5 || decoded[3] != LayerTypeRoCE || roce.Packet.RETH.Fields().DMALen == 0 {
		t.Fatalf("decoded %v", decoded)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if err := parser.DecodeLayers(frame, &decoded); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decode, want 0", allocs)
	}
}

// TestDecodeMalformed: every truncation of a valid packet, a bad TVer and a
// reserved opcode give bth's sentinel errors, never a panic, and reset the layer.
func TestDecodeMalformed(t *testing.T) {
	// RC RDMA WRITE Only (0x0A): BTH + RETH + 8 bytes payload + ICRC.
	pkt := make([]byte, bth.BTHSize+bth.RETHSize+8+bth.ICRCSize)
	pkt[0] = 0x0A
	binary.BigEndian.PutUint16(pkt[2:], 0xffff)
	var r RoCE
	if err := r.DecodeFromBytes(pkt, gopacket.NilDecodeFeedback); err != nil {
		t.Fatalf("valid packet: %v", err)
	}
	for n := 0; n < bth.BTHSize+bth.RETHSize+bth.ICRCSize; n++ {
		r.DecodeFromBytes(pkt, gopacket.NilDecodeFeedback)
		var fb truncFeedback
		err := r.DecodeFromBytes(pkt[:n], &fb)
		if !errors.Is(err, bth.ErrTruncated) {
			t.Fatalf("len %d: err %v, want ErrTruncated", n, err)
		}
		if !fb.truncated || r.Packet.BTH != nil || r.Contents != nil || r.Payload != nil {
			t.Fatalf("len %d: truncated=%v, layer not reset", n, fb.truncated)
		}
	}
	bad := append([]byte(nil), pkt...)
	bad[1] = 0x01 // TVer 1
	if err := r.DecodeFromBytes(bad, nil); !errors.Is(err, bth.ErrBadTVer) {
		t.Fatalf("TVer 1: %v", err)
	}
	bad = append([]byte(nil), pkt...)
	bad[0] = 0x1F // reserved RC opcode
	if err := r.DecodeFromBytes(bad, nil); !errors.Is(err, bth.ErrUnknownOpcode) {
		t.Fatalf("opcode 0x1f: %v", err)
	}
	// Through NewPacket: a DecodeFailure layer, no RoCE layer.
	p := gopacket.NewPacket(bad, LayerTypeRoCE, gopacket.Default)
	if p.ErrorLayer() == nil || p.Layer(LayerTypeRoCE) != nil {
		t.Fatalf("NewPacket on a bad packet: %v", p.Layers())
	}
}

type truncFeedback struct{ truncated bool }

func (f *truncFeedback) SetTruncated() { f.truncated = true }

// TestSerializeEveryOpcode: for every defined opcode, a packet built from its
// OpInfo parses, and SerializeTo over the parsed layer reproduces it (so the
// header order of SerializeTo is the one bth.Parse expects).
func TestSerializeEveryOpcode(t *testing.T) {
	n := 0
	for op := 0; op < 256; op++ {
		info := bth.Opcode(op).Info()
		if !info.Valid {
			continue
		}
		n++
		plen := 0
		if info.Payload {
			plen = 8 // also the only legal ATOMIC WRITE length
		}
		pkt := make([]byte, info.HdrLen+plen+bth.ICRCSize)
		for i := range pkt {
			pkt[i] = byte(i*7 + op)
		}
		pkt[0] = byte(op)
		pkt[1] &^= 0x3f // PadCnt 0, TVer 0
		var r RoCE
		if err := r.DecodeFromBytes(pkt, nil); err != nil {
			t.Errorf("opcode %#x (%v): %v", op, bth.Opcode(op), err)
			continue
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, &r, gopacket.Payload(r.Payload)); err != nil {
			t.Errorf("opcode %#x: serialize: %v", op, err)
			continue
		}
		if !bytes.Equal(buf.Bytes(), pkt) {
			t.Errorf("opcode %#x: serialized\n% x\nwant\n% x", op, buf.Bytes(), pkt)
		}
	}
	if n < 30 {
		t.Fatalf("only %d defined opcodes", n)
	}
}

// TestSerializeFixLengths: FixLengths sets PadCnt for an odd payload and the
// result parses back with that payload.
func TestSerializeFixLengths(t *testing.T) {
	pkt := make([]byte, bth.BTHSize+4+bth.ICRCSize)
	pkt[0] = 0x04 // RC SEND Only
	var r RoCE
	if err := r.DecodeFromBytes(pkt, nil); err != nil {
		t.Fatal(err)
	}
	for plen := 0; plen < 9; plen++ {
		payload := bytes.Repeat([]byte{0xab}, plen)
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, &r, gopacket.Payload(payload)); err != nil {
			t.Fatal(err)
		}
		out := buf.Bytes()
		if len(out)%4 != 0 {
			t.Fatalf("payload %d: length %d not a multiple of 4", plen, len(out))
		}
		p, err := bth.Parse(out)
		if err != nil {
			t.Fatalf("payload %d: %v", plen, err)
		}
		if !bytes.Equal(p.Payload, payload) || p.Pad != (4-plen%4)%4 {
			t.Fatalf("payload %d: parsed payload %d pad %d", plen, len(p.Payload), p.Pad)
		}
	}
	// Without FixLengths the BTH PadCnt is kept (here 0, so 3 bytes stay unpadded).
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, &r, gopacket.Payload{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if got := len(buf.Bytes()); got != bth.BTHSize+3+bth.ICRCSize {
		t.Fatalf("length %d", got)
	}
}

func TestSerializeErrors(t *testing.T) {
	var r RoCE
	buf := gopacket.NewSerializeBuffer()
	if err := r.SerializeTo(buf, gopacket.SerializeOptions{}); !errors.Is(err, ErrNoBTH) {
		t.Fatalf("empty: %v", err)
	}
	r.Packet.BTH = make(bth.BTH, bth.BTHSize)
	r.Packet.BTH[0] = 0x0A // WRITE Only needs a RETH
	if err := r.SerializeTo(buf, gopacket.SerializeOptions{}); !errors.Is(err, ErrHeaderMismatch) {
		t.Fatalf("missing RETH: %v", err)
	}
}

// TestSerializeFramesAndFixICRC re-serializes every RoCE frame of the
// captures from its decoded layers with a zeroed ICRC, fixes the ICRC with
// FixICRC, and must get the captured frame back byte for byte.
func TestSerializeFramesAndFixICRC(t *testing.T) {
	count := 0
	for _, f := range captureFiles(t) {
		for i, frame := range readPcapFrames(t, f) {
			pkt := gopacket.NewPacket(frame, layers.LinkTypeEthernet, gopacket.Default)
			r, ok := pkt.Layer(LayerTypeRoCE).(*RoCE)
			if !ok {
				continue
			}
			count++
			var sl []gopacket.SerializableLayer
			for _, l := range pkt.Layers() {
				if r2, ok := l.(*RoCE); ok {
					c := *r2
					c.Packet.ICRC = nil // written as zero
					sl = append(sl, &c)
					continue
				}
				sl = append(sl, l.(gopacket.SerializableLayer))
			}
			buf := gopacket.NewSerializeBuffer()
			if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, sl...); err != nil {
				t.Fatalf("%s frame %d: %v", filepath.Base(f), i+1, err)
			}
			out := buf.Bytes()
			if bytes.Equal(out, frame) {
				t.Fatalf("%s frame %d: ICRC was not zeroed", filepath.Base(f), i+1)
			}
			if err := FixICRC(out[14:]); err != nil {
				t.Fatalf("%s frame %d: FixICRC: %v", filepath.Base(f), i+1, err)
			}
			if !bytes.Equal(out, frame) {
				t.Errorf("%s frame %d: re-serialized frame differs\n% x\n% x", filepath.Base(f), i+1, out, frame)
			}
			_ = r
		}
	}
	if count == 0 {
		t.Fatal("no RoCE frames")
	}
}

func TestFixICRCRejects(t *testing.T) {
	for _, b := range [][]byte{nil, {0x45}, make([]byte, 20), append([]byte{0x60}, make([]byte, 39)...), {0x50, 0, 0, 0}} {
		if err := FixICRC(b); err == nil {
			t.Errorf("FixICRC(% x) accepted", b)
		}
	}
	// Length field longer than the buffer.
	ip := make([]byte, 60)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 61)
	if err := FixICRC(ip); !errors.Is(err, ErrNotIP) {
		t.Errorf("long length field: %v", err)
	}
}

func TestLayerTypeRegistered(t *testing.T) {
	if got := layers.UDPPort(4791).LayerType(); got != LayerTypeRoCE {
		t.Fatalf("UDP 4791 -> %v", got)
	}
	if LayerTypeRoCE.String() != "RoCEv2" || int(LayerTypeRoCE) != LayerTypeID {
		t.Fatalf("layer type %v %d", LayerTypeRoCE, LayerTypeRoCE)
	}
	var r RoCE
	if r.CanDecode() != LayerTypeRoCE || r.LayerType() != LayerTypeRoCE || r.NextLayerType() != gopacket.LayerTypeZero || r.Trailer() != nil {
		t.Fatal("zero RoCE methods")
	}
	_ = fmt.Sprint(r)
}

// BenchmarkDecodingLayerParser decodes an Ethernet/IPv4/UDP/RoCE RDMA WRITE
// First frame with reused layers (run with -benchmem: 0 allocs/op).
func BenchmarkDecodingLayerParser(b *testing.B) {
	frames := readPcapFrames(b, filepath.Join(capturesDir, "ib_write_bw.pcap"))
	var (
		eth     layers.Ethernet
		ip4     layers.IPv4
		ip6     layers.IPv6
		udp     layers.UDP
		roce    RoCE
		payload gopacket.Payload
	)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip4, &ip6, &udp, &roce, &payload)
	decoded := make([]gopacket.LayerType, 0, 8)
	var frame []byte
	for _, fr := range frames {
		if err := parser.DecodeLayers(fr, &decoded); err == nil && len(decoded) >= 4 && decoded[3] == LayerTypeRoCE {
			frame = fr
			break
		}
	}
	if frame == nil {
		b.Fatal("no RoCE frame")
	}
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if err := parser.DecodeLayers(frame, &decoded); err != nil {
			b.Fatal(err)
		}
	}
}
