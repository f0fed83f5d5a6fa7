package afxdp

import (
	"testing"

	"github.com/softroce/softroce/pkg/bth"
)

// TestExpectedLen: the length a packet's headers fix (split.go), for each kind.
func TestExpectedLen(t *testing.T) {
	pkt := func(op bth.Opcode, n int) []byte {
		b := make([]byte, n)
		bth.BTH(b).Encode(&bth.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 5})
		return b
	}
	write := func(op bth.Opcode, dma uint32) []byte {
		b := pkt(op, 64)
		bth.RETH(b[bth.BTHSize:]).SetDMALen(dma)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want int
	}{
		{"ACK", pkt(bth.OpRCAck, 64), 20},
		{"atomic ACK", pkt(bth.OpRCAtomicAck, 64), 12 + 4 + 8 + 4},
		{"READ request", pkt(bth.OpRCReadRequest, 64), 12 + 16 + 4},
		{"FETCH_ADD", pkt(bth.OpRCFetchAdd, 64), 12 + 28 + 4},
		{"WRITE Only, 8 bytes", write(bth.OpRCWriteOnly, 8), 12 + 16 + 8 + 4},
		{"WRITE Only, 5 bytes (padded)", write(bth.OpRCWriteOnly, 5), 12 + 16 + 8 + 4},
		{"WRITE Only, 0 bytes", write(bth.OpRCWriteOnly, 0), 12 + 16 + 4},
		{"WRITE Only Immediate, 8 bytes", write(bth.OpRCWriteOnlyImm, 8), 12 + 16 + 4 + 8 + 4},
		{"UC WRITE Only, 4 bytes", write(bth.OpUCWriteOnly, 4), 12 + 16 + 4 + 4},
		{"WRITE Only, a DMA length past a frame", write(bth.OpRCWriteOnly, MaxFrame+1), 0},
		{"WRITE First", write(bth.OpRCWriteFirst, 8), 0},
		{"SEND Only", pkt(bth.OpRCSendOnly, 64), 0},
		{"UD SEND Only", pkt(bth.OpUDSendOnly, 64), 0},
		{"ACK, truncated", pkt(bth.OpRCAck, 12), 0},
		{"invalid opcode", []byte{0xff, 0, 0xff, 0xff, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0},
	} {
		if got := ExpectedLen(c.b); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
