package roce

import (
	"bytes"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
)

// dmPair opens two polled devices on the AF_XDP path between two namespaces, b with a
// write responder and 64 KiB of device memory (root).
func dmPair(t *testing.T) (a, b *Device) {
	t.Helper()
	x, y := netnstest.Veth(t, "srdma", "198.18.8.1/24", "srdmb", "198.18.8.2/24", 1500)
	var la, lb link.Link
	if err := x.Do(func() (err error) {
		la, err = afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr("198.18.8.1")}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := y.Do(func() (err error) {
		lb, err = afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr("198.18.8.2")}}, WriteMemory: 64 << 10})
		return err
	}); err != nil {
		la.Close()
		t.Fatal(err)
	}
	return openPolled(t, la), openPolled(t, lb)
}

// dmEnd is newEnd over device memory: size bytes from AllocDM, registered with remote access.
func dmEnd(t *testing.T, d *Device, size int) *end {
	t.Helper()
	e := &end{dev: d, addr: d.Addrs()[0]}
	var err error
	if e.buf, err = d.AllocDM(size); err != nil {
		t.Fatal(err)
	}
	if e.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = d.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = d.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = d.RegMR(e.pd, e.buf, 0x5000_0000, mr.AccessLocalWrite|mr.AccessRemoteWrite|mr.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = d.CreateQP(QPInit{Type: qp.TypeRC, PD: e.pd, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: qp.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestDeviceMemoryWrites: RDMA WRITEs of 1..64 bytes into b's device memory are executed and
// ACKed by b's XDP program: a's WRITEs complete and the data is in b's memory while b never
// polls (its process runs nothing). What the program leaves — a WRITE over 64 bytes, one that
// crosses a page, one into ordinary memory — waits for b's Poll, and afterwards the program
// goes on from the PSN b's engine reached. A deregistered MR's R_Key gets the remote access
// NAK from b's engine. b's RemoteWrites counts both kinds, also after Close.
func TestDeviceMemoryWrites(t *testing.T) {
	da, db := dmPair(t)
	a := newEnd(t, da, qp.TypeRC, 1<<14)
	b := dmEnd(t, db, 3*4096)
	connect(t, a, b, qp.MTU1024, 100, 200)
	wr := func(id uint64, off, n int) qp.SendWR {
		return qp.SendWR{WRID: id, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(off, n)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(off), RKey: b.mr.RKey()}
	}
	id := uint64(0)
	// one WRITE; only a polls unless pollB: its completion, then b's memory and count
	write := func(off, n int, pollB bool) {
		t.Helper()
		id++
		a.fill(off, n, byte(id))
		before := b.qp.RemoteWrites()
		post(t, a, wr(id, off, n))
		devs := []*Device{da}
		if pollB {
			devs = append(devs, db)
		}
		if w := pollWC(t, a.scq, devs...); w.Status != cq.StatusSuccess || w.WRID != id {
			t.Fatalf("WRITE %d (%d bytes at %d): completion %+v", id, n, off, w)
		}
		if got := b.qp.RemoteWrites(); got != before+1 {
			t.Fatalf("WRITE %d: b's RemoteWrites %d, want %d", id, got, before+1)
		}
		if !bytes.Equal(b.buf[off:off+n], a.buf[off:off+n]) {
			t.Fatalf("WRITE %d (%d bytes at %d): b has %x, want %x", id, n, off, b.buf[off:off+n], a.buf[off:off+n])
		}
	}
	for i, n := range []int{8, 1, 3, 64, 8, 33} {
		write(64*i, n, false) // b's engine never runs
	}
	write(1000, 100, true) // over 64 bytes: b's engine
	write(1200, 8, false)  // the program again, from the PSN b's engine reached
	write(4090, 8, true)   // crosses a page: b's engine
	write(4200, 8, false)
	// an MR of ordinary memory in the same PD: b's engine
	plain := make([]byte, 4096)
	pm, err := db.RegMR(b.pd, plain, 0x6000_0000, mr.AccessLocalWrite|mr.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	id++
	a.fill(0, 8, byte(id))
	post(t, a, qp.SendWR{WRID: id, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(0, 8)}, Flags: qp.SendSignaled,
		RemoteAddr: 0x6000_0010, RKey: pm.RKey()})
	if w := pollWC(t, a.scq, da, db); w.Status != cq.StatusSuccess || !bytes.Equal(plain[16:24], a.buf[0:8]) {
		t.Fatalf("WRITE into ordinary memory: completion %+v, memory %x", w, plain[16:24])
	}
	write(4300, 8, false) // and the program after it
	ls, _ := db.LinkStats()
	// over 64 bytes, across a page, ordinary memory: 3 for b's ring, 9 for the program
	checkRing(t, ls.XDP, 12, 9, 0, da.Stats().RetransPkts)

	// device memory under an MR is not freed (ibv_free_dm: EBUSY)
	if err := db.FreeDM(b.buf); !errors.Is(err, ErrBusy) {
		t.Fatalf("FreeDM under a registered MR: %v, want ErrBusy", err)
	}
	// deregister b's MR: a's next WRITE gets NAK remote access error from b's engine
	if err := b.mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	id++
	post(t, a, wr(id, 0, 8))
	if w := pollWC(t, a.scq, da, db); w.Status != cq.StatusRemAccessErr {
		t.Fatalf("WRITE after Dereg: completion %+v, want remote access error", w)
	}
	if err := db.FreeDM(b.buf); err != nil {
		t.Fatalf("FreeDM after Dereg: %v", err)
	}
	n := b.qp.RemoteWrites()
	if n != 12 {
		t.Fatalf("b's RemoteWrites %d, want 12", n)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if got := b.qp.RemoteWrites(); got != n {
		t.Fatalf("RemoteWrites after Close: %d, want %d", got, n)
	}
	// device memory after Close: plain memory at the same addresses (a late access does not
	// fault: the process would die here if it were unmapped)
	b.buf[0], b.buf[len(b.buf)-1] = 0x42, 0x43
	if b.buf[0] != 0x42 || b.buf[len(b.buf)-1] != 0x43 {
		t.Fatal("device memory after Close does not hold what was written")
	}
}

// TestAllocDM: device memory comes in pages, zeroed, reused after FreeDM; a device without it
// says so.
func TestAllocDM(t *testing.T) {
	_, db := dmPair(t)
	m1, err := db.AllocDM(5000) // two pages
	if err != nil {
		t.Fatal(err)
	}
	m2, err := db.AllocDM(56 << 10) // the rest (64 KiB in all)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.AllocDM(1); !errors.Is(err, ErrLimit) {
		t.Fatalf("AllocDM with none left: %v, want ErrLimit", err)
	}
	if len(m1) != 5000 || cap(m1) != 5000 || len(m2) != 56<<10 {
		t.Fatalf("lengths %d/%d, %d", len(m1), cap(m1), len(m2))
	}
	m1[0], m1[4999] = 1, 2
	if err := db.FreeDM(m1[1:]); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("FreeDM of a slice inside: %v", err)
	}
	if err := db.FreeDM(make([]byte, 10)); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("FreeDM of other memory: %v", err)
	}
	if err := db.FreeDM(m1); err != nil {
		t.Fatal(err)
	}
	if err := db.FreeDM(m1); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("FreeDM twice: %v", err)
	}
	m3, err := db.AllocDM(8192)
	if err != nil {
		t.Fatal(err)
	}
	if &m3[0] != &m1[0] || m3[0] != 0 || m3[4999] != 0 {
		t.Fatal("the freed pages were not reused, or not zeroed")
	}
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("198.18.9.1"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(Options{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.AllocDM(8); !errors.Is(err, ErrNoDM) {
		t.Fatalf("AllocDM without device memory: %v", err)
	}
}

// ackDropLink loses the first ACK it receives once armed (a pollable link).
type ackDropLink struct {
	link.Link
	armed, dropped atomic.Bool
}

func (l *ackDropLink) TryRecv(b []link.Datagram) (int, error) {
	n, err := l.Link.(link.PollReceiver).TryRecv(b)
	if l.armed.Load() && !l.dropped.Load() {
		for i := 0; i < n; i++ {
			if len(b[i].Buf) > 0 && bth.Opcode(b[i].Buf[0]) == bth.OpRCAck {
				l.dropped.Store(true)
				copy(b[i:], b[i+1:n])
				n--
				break
			}
		}
	}
	return n, err
}

// TestDeviceMemoryLostACK: the ACK the XDP program sent is lost. The requester's timer resends
// the WRITE; the program leaves the duplicate to the responder's engine (its PSN is behind the
// one the program published), which re-ACKs it (IBTA C9-105) with the MSN it adopted: the
// requester completes, the WRITE counts once.
func TestDeviceMemoryLostACK(t *testing.T) {
	x, y := netnstest.Veth(t, "srdmc", "198.18.11.1/24", "srdmd", "198.18.11.2/24", 1500)
	var la, lb link.Link
	if err := x.Do(func() (err error) {
		la, err = afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr("198.18.11.1")}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := y.Do(func() (err error) {
		lb, err = afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr("198.18.11.2")}}, WriteMemory: 16 << 10})
		return err
	}); err != nil {
		la.Close()
		t.Fatal(err)
	}
	drop := &ackDropLink{Link: la}
	da, db := openPolled(t, drop), openPolled(t, lb)
	a := newEnd(t, da, qp.TypeRC, 4096)
	b := dmEnd(t, db, 4096)
	connect(t, a, b, qp.MTU1024, 10, 20)
	for id := uint64(1); id <= 3; id++ {
		if id == 2 {
			drop.armed.Store(true)
		}
		a.fill(int(8*id), 8, byte(id))
		post(t, a, qp.SendWR{WRID: id, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{a.sge(int(8*id), 8)}, Flags: qp.SendSignaled,
			RemoteAddr: b.va(int(8 * id)), RKey: b.mr.RKey()})
		if w := pollWC(t, a.scq, da, db); w.Status != cq.StatusSuccess || w.WRID != id {
			t.Fatalf("WRITE %d: completion %+v", id, w)
		}
		if !bytes.Equal(b.buf[8*id:8*id+8], a.buf[8*id:8*id+8]) {
			t.Fatalf("WRITE %d: b has %x", id, b.buf[8*id:8*id+8])
		}
	}
	if !drop.dropped.Load() {
		t.Fatal("no ACK was dropped")
	}
	if n := b.qp.RemoteWrites(); n != 3 {
		t.Fatalf("RemoteWrites %d, want 3", n)
	}
	ls, _ := db.LinkStats()
	resent := da.Stats().RetransPkts
	checkRing(t, ls.XDP, 3, 3, 1, resent)
	if c := db.Stats().DuplicateRequest; c < 1 || c > max(resent, 1) || (resent <= 1 && c != 1) {
		t.Fatalf("b's duplicate requests %d (a resent %d), want 1", c, resent)
	}
}

// checkRing checks what b's AF_XDP path saw of the writes WRITEs a sent: the program executed
// want of them, b's ring received the rest and dups resent duplicates. resent is what a's
// requester counted (retransmitted_pkts): beyond the dups the test causes, its ACK timer (67
// ms) fired on a stalled machine — a TCG guest under load — and each such resend is one more
// duplicate for b's ring; one that b's engine answers while the program's next WRITE arrives
// (the QP's word paused) leaves that WRITE to the engine too. Without them the counts are exact.
func checkRing(t *testing.T, st afxdp.Stats, writes, want, dups int, resent uint64) {
	t.Helper()
	extra := int(resent) - dups
	if extra <= 0 {
		if st.Writes != uint64(want) || st.Received != uint64(writes-want+dups) {
			t.Fatalf("b's ring received %d datagrams, the program executed %d WRITEs; want %d and %d (a resent %d)",
				st.Received, st.Writes, writes-want+dups, want, resent)
		}
		return
	}
	t.Logf("a resent %d request(s) beyond the test's %d: its ACK timer fired on a stalled machine", extra, dups)
	left := writes - int(st.Writes) // the WRITEs b's engine executed from the ring
	if int(st.Writes) > want || int(st.Writes) < want-extra || int(st.Received) < left+dups || int(st.Received) > left+int(resent) {
		t.Fatalf("b's ring received %d datagrams, the program executed %d WRITEs; want %d-%d executed and the rest plus %d-%d duplicates received",
			st.Received, st.Writes, want-extra, want, dups, resent)
	}
}
