package layer

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/pkg/bth"
)

// FuzzLayer feeds whole Ethernet frames (seeded with every RoCE frame of the
// reference captures, plus testdata/fuzz/FuzzLayer) through gopacket and,
// without gopacket's panic recovery, through RoCE.DecodeFromBytes on the UDP
// payload. A decoded packet must tile the UDP payload exactly and re-serialize
// to the same bytes (pad bytes are written as zeros).
func FuzzLayer(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(capturesDir, "*.pcap"))
	for _, file := range files {
		for _, frame := range readPcapFrames(f, file) {
			p := gopacket.NewPacket(frame, layers.LinkTypeEthernet, gopacket.Default)
			if p.Layer(LayerTypeRoCE) != nil {
				f.Add(frame)
			}
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		pkt := gopacket.NewPacket(frame, layers.LinkTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
		udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil {
			if pkt.Layer(LayerTypeRoCE) != nil {
				t.Fatal("RoCE layer without UDP")
			}
			return
		}
		data := udp.Payload
		var r RoCE
		err := r.DecodeFromBytes(data, gopacket.NilDecodeFeedback) // panics surface here
		if err != nil {
			if r.Packet.BTH != nil || r.Contents != nil || r.Payload != nil {
				t.Fatalf("layer not reset after %v", err)
			}
			return
		}
		tr := r.Trailer()
		if len(r.Contents)+len(r.Payload)+len(tr) != len(data) || len(tr) != r.Packet.Pad+bth.ICRCSize {
			t.Fatalf("layers do not tile: %d+%d+%d != %d", len(r.Contents), len(r.Payload), len(tr), len(data))
		}
		if !bytes.Equal(r.Contents, data[:len(r.Contents)]) || !bytes.Equal(r.Packet.ICRC, data[len(data)-4:]) {
			t.Fatal("views do not alias the packet")
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, &r, gopacket.Payload(r.Payload)); err != nil {
			t.Fatalf("serialize a parsed packet: %v", err)
		}
		out := buf.Bytes()
		if len(out) != len(data) {
			t.Fatalf("serialized %d bytes, parsed %d", len(out), len(data))
		}
		padStart := len(r.Contents) + len(r.Payload)
		padEnd := padStart + r.Packet.Pad
		if !bytes.Equal(out[:padStart], data[:padStart]) || !bytes.Equal(out[padEnd:], data[padEnd:]) {
			t.Fatalf("re-serialized packet differs\n% x\n% x", out, data)
		}
		for _, b := range out[padStart:padEnd] {
			if b != 0 {
				t.Fatal("pad not zero")
			}
		}
	})
}
