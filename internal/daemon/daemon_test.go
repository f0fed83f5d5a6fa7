package daemon_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var (
	ipA = netip.MustParseAddr("10.9.0.1")
	ipB = netip.MustParseAddr("10.9.0.2")
)

// memPair starts two daemons on the in-memory network.
func memPair(t *testing.T) (*testDaemon, *testDaemon) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	la, err := nw.Attach(ipA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(ipB)
	if err != nil {
		t.Fatal(err)
	}
	return startDaemon(t, la, "a", 0), startDaemon(t, lb, "b", 0)
}

// TestClientRC runs RC WRITE, READ, SEND with immediate and an atomic
// between a client of daemon A and a client of daemon B, byte-exact, with
// completions read from the shared rings.
func TestClientRC(t *testing.T) {
	da, db := memPair(t)
	ca, cb := da.dial(t), db.dial(t)
	const size = 256 << 10
	a := newEnd(t, ca, size, 16, rcAccess)
	b := newEnd(t, cb, size, 16, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)

	// WRITE 64 KiB x 4: the bytes land in B's client buffer (the memfd both map).
	pattern(a.buf, 1)
	for i := 0; i < 4; i++ {
		a.write(t, uint64(i), i*65536, 65536, b, i*65536)
	}
	for _, wc := range a.wait(t, 4) {
		if wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpRDMAWrite {
			t.Fatalf("WRITE completion %+v", wc)
		}
	}
	if !bytes.Equal(a.buf, b.buf) {
		t.Fatal("WRITE: B's buffer differs from A's")
	}

	// READ back into the second half of A after B changes its buffer.
	pattern(b.buf[:65536], 2)
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 10, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled,
		SGL:        []qp.SGE{{Addr: a.iova + 131072, Length: 65536, LKey: a.m.LKey()}},
		RemoteAddr: b.iova, RKey: b.m.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpRDMARead || wc.ByteLen != 65536 {
		t.Fatalf("READ completion %+v", wc)
	}
	if !bytes.Equal(a.buf[131072:196608], b.buf[:65536]) {
		t.Fatal("READ: data differs")
	}

	// SEND with immediate into a posted receive.
	if _, err := b.q.PostRecv([]qp.RecvWR{{WRID: 77, SGL: []qp.SGE{{Addr: b.iova + 200000, Length: 4096, LKey: b.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	copy(a.buf[:11], "hello, RDMA")
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 11, Opcode: qp.WRSendWithImm, Flags: qp.SendSignaled, Imm: 0xdeadbeef,
		SGL: []qp.SGE{{Addr: a.iova, Length: 11, LKey: a.m.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 77 || wc.ByteLen != 11 ||
		wc.ImmData != 0xdeadbeef || wc.Flags&cq.FlagWithImm == 0 || wc.QPNum != b.q.Num() {
		t.Fatalf("RECV completion %+v", wc)
	}
	if string(b.buf[200000:200011]) != "hello, RDMA" {
		t.Fatalf("SEND payload %q", b.buf[200000:200011])
	}
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 11 {
		t.Fatalf("SEND completion %+v", wc)
	}

	// FETCH_ADD on B's memory.
	copy(b.buf[8:16], []byte{5, 0, 0, 0, 0, 0, 0, 0})
	if _, err := a.q.PostSend([]qp.SendWR{{WRID: 12, Opcode: qp.WRAtomicFetchAndAdd, Flags: qp.SendSignaled,
		SGL:        []qp.SGE{{Addr: a.iova + 1000, Length: 8, LKey: a.m.LKey()}},
		RemoteAddr: b.iova + 8, RKey: b.m.RKey(), CompareAdd: 3}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("atomic completion %+v", wc)
	}
	if b.buf[8] != 8 || a.buf[1000] != 5 {
		t.Fatalf("atomic: remote %d (want 8), original %d (want 5)", b.buf[8], a.buf[1000])
	}
}

// TestClientAndEmbeddedInterop: the same Verbs code on an embedded device
// (B) talks to a daemon client (A).
func TestClientAndEmbeddedInterop(t *testing.T) {
	nw := mem.NewNetwork(mem.Options{QueueDepth: 8192})
	la, _ := nw.Attach(ipA)
	lb, _ := nw.Attach(ipB)
	da := startDaemon(t, la, "a", 0)
	devB, err := roce.Open(roce.Options{Link: lb})
	if err != nil {
		t.Fatal(err)
	}
	defer devB.Close()
	var vb roce.Verbs = devB.Verbs() // the one line that differs from da.dial(t)
	a := newEnd(t, da.dial(t), 1<<20, 16, rcAccess)
	b := newEnd(t, vb, 1<<20, 16, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	pattern(b.buf, 3)
	for i := 0; i < 16; i++ {
		b.write(t, uint64(i), i*65536, 65536, a, i*65536)
	}
	for _, wc := range b.wait(t, 16) {
		if wc.Status != cq.StatusSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if !bytes.Equal(a.buf, b.buf) {
		t.Fatal("embedded -> client WRITE: data differs")
	}
}
