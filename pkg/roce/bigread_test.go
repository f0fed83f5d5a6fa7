package roce

import (
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// TestBigReadShallowLink: READs far larger than the link's queue (the
// in-memory network's default 1024 datagrams) complete without the
// queue ever overflowing, because the requester asks for them in chunks
// of MaxUnackedPSNs responses (internal/qp readChunk). Unchunked, the
// responder's burst overflowed the queue and only the ACK timeout
// recovered each lost tail (a 4 MiB READ: 3 timeouts, 209 ms).
func TestBigReadShallowLink(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	da, err := Open(Options{Link: la})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := Open(Options{Link: lb})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, b := newEnd(t, da, qp.TypeRC, 8<<20), newEnd(t, db, qp.TypeRC, 8<<20)
	connect(t, a, b, qp.MTU1024, 1, 2)
	for i, size := range []int{1 << 20, 4 << 20, 4<<20 - 333} {
		b.fill(0, size, byte(i))
		clear(a.buf[:size])
		post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRRDMARead, SGL: a.sgl(0, size, 3), Flags: qp.SendSignaled,
			RemoteAddr: b.va(0), RKey: b.mr.RKey()})
		checkWC(t, waitWC(t, a.scq, 1)[0], cq.WC{WRID: 1, Opcode: cq.OpRDMARead, ByteLen: uint32(size)})
		same(t, "read", a.buf[:size], b.buf[:size])
	}
	// The responses never overflowed the requester's 1024-datagram queue
	// (unchunked: 3 of the 4 MiB READ's 4096 responses were dropped at
	// every attempt). Retransmissions are not asserted: on a starved
	// machine (-race, load) a 67 ms ACK timeout may still fire.
	if st := la.(link.StatsLink).Stats(); st.Drops != 0 {
		t.Fatalf("requester's link dropped %d datagrams (queue full), want 0; counters %+v", st.Drops, da.Stats())
	}
	t.Logf("retransmitted_pkts %d completer_retry_err %d", da.Stats().RetransPkts, da.Stats().CompleterRetryErr)
}
