package roce

import (
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/link/udp"
)

// TestPollUsesLinkRecvLock: a polled device whose one link is a link.LockedPollReceiver (a UDP
// link) serialises its Polls with the link's receive lock (one lock per Poll, not two); a
// link that is not (here a wrapped one) gets the device's own lock.
func TestPollUsesLinkRecvLock(t *testing.T) {
	var l *udp.Link
	freePortPair(t, false, func(port uint16) (err error) { // not 4791: other tests' devices use it
		l, err = udp.Listen(udp.Options{Addrs: []netip.Addr{addrA}, Port: port})
		return err
	})
	d, err := Open(Options{Link: l, Polled: true})
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	defer d.Close()
	if d.pl.mu != l.RecvMutex() || d.pl.locked == nil {
		t.Fatal("the polled device does not use its UDP link's receive lock")
	}
	nw := mem.NewNetwork(mem.Options{})
	m, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	dm, err := Open(Options{Link: &pollLink{Link: m}, Polled: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	if dm.pl.mu != &dm.pl.own || dm.pl.locked != nil {
		t.Fatal("a device on a link without a receive lock does not use its own lock")
	}
}

// TestPolledLinkLockPingPong: ib_write_lat's loop between two polled devices on unwrapped UDP
// links (loopback, and the AF_XDP path between two namespaces as root), so Poll runs under the
// links' receive locks, with a second goroutine polling each device all along (Polls are
// serialised: run with -race) and closing them at the end while it polls (Poll then reports
// ErrClosed; nothing hangs).
func TestPolledLinkLockPingPong(t *testing.T) {
	for _, kind := range []string{"udp", "xdp"} {
		t.Run(kind, func(t *testing.T) {
			var l1, l2 link.Link
			var port uint16
			switch kind {
			case "udp":
				l1, l2, port = listenPair(t, true, addrA, addrB, listenUDP)
			case "xdp":
				x, y := netnstest.Veth(t, "srpa", "198.18.7.1/24", "srpb", "198.18.7.2/24", 1500)
				for _, s := range []struct {
					th *netnstest.Thread
					l  *link.Link
					a  string
				}{{x, &l1, "198.18.7.1"}, {y, &l2, "198.18.7.2"}} {
					if err := s.th.Do(func() (err error) {
						*s.l, err = afxdp.Open(afxdp.Options{UDP: udp.Options{Addrs: []netip.Addr{netip.MustParseAddr(s.a)}}})
						return err
					}); err != nil {
						t.Fatal(err)
					}
				}
			}
			da, err := Open(Options{Link: l1, Port: port, Polled: true})
			if err != nil {
				t.Fatal(err)
			}
			db, err := Open(Options{Link: l2, Port: port, Polled: true})
			if err != nil {
				da.Close()
				t.Fatal(err)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					da.Close()
					db.Close()
				}
			})
			if da.pl.locked == nil || db.pl.locked == nil {
				t.Fatal("the devices do not poll under their links' receive locks")
			}
			a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
			connect(t, a, b, qp.MTU1024, 100, 200)

			stop := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, d := range []*Device{da, db} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						if _, err := d.Poll(); err != nil {
							errs[i] = err
							return
						}
						select {
						case <-stop:
							return
						default:
						}
					}
				}()
			}
			const iters = 40
			for i := 1; i <= iters; i++ {
				off := 8 * (i % 64)
				a.fill(off, 8, byte(i))
				want := b.qp.RemoteWrites() + 1 // before the post: b's helper may execute it at once
				post(t, a, writeWR(a, b, uint64(i), off))
				pollUntil(t, func() bool { return b.qp.RemoteWrites() == want }, db)
				same(t, "a->b", b.buf[off:off+8], a.buf[off:off+8])
				b.fill(2048+off, 8, byte(i)^0x5a)
				want = a.qp.RemoteWrites() + 1
				post(t, b, writeWR(b, a, uint64(i), 2048+off))
				pollUntil(t, func() bool { return a.qp.RemoteWrites() == want }, da)
				same(t, "b->a", a.buf[2048+off:2048+off+8], b.buf[2048+off:2048+off+8])
				if w := pollWC(t, a.scq, da); w.Status != cq.StatusSuccess || w.WRID != uint64(i) {
					t.Fatalf("a's completion %+v at iteration %d", w, i)
				}
				if i > 1 {
					if w := pollWC(t, b.scq, db); w.Status != cq.StatusSuccess || w.WRID != uint64(i-1) {
						t.Fatalf("b's completion %+v at iteration %d", w, i)
					}
				}
			}
			// close both while the helpers poll: their Polls end with ErrClosed
			closed = true
			da.Close()
			db.Close()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second): // only when a Poll hangs (failure)
				close(stop)
				t.Fatal("a Poll did not return after Close")
			}
			for i, err := range errs {
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("device %d: helper's Poll ended with %v, want ErrClosed", i, err)
				}
			}
			if _, err := da.Poll(); !errors.Is(err, ErrClosed) {
				t.Fatalf("Poll after Close: %v", err)
			}
		})
	}
}

// TestPollReleasesLockOnPanic: application code that Poll runs (here a QP's RecvRefill, called
// with no QP lock held) panics and the application recovers: the device's poll lock (the
// link's receive lock) is released, so the next Poll and Close do not hang.
func TestPollReleasesLockOnPanic(t *testing.T) {
	da, db, _, _ := polledPair(t, "udp")
	a, b := newEnd(t, da, qp.TypeRC, 1<<12), newEnd(t, db, qp.TypeRC, 1<<12)
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	var err error
	if b.qp, err = db.CreateQP(QPInit{Type: qp.TypeRC, PD: b.pd, SendCQ: b.scq, RecvCQ: b.rcq,
		Cap:        qp.Cap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1},
		RecvRefill: func(*QP) bool { panic("application refill") }}); err != nil {
		t.Fatal(err)
	}
	connect(t, a, b, qp.MTU1024, 1, 2)
	post(t, a, qp.SendWR{WRID: 1, Opcode: qp.WRSend, SGL: []qp.SGE{a.sge(0, 8)}}) // b's RQ is empty
	panicked := false
	deadline := time.Now().Add(10 * time.Second)
	for !panicked && time.Now().Before(deadline) {
		func() {
			defer func() { panicked = recover() != nil }()
			db.Poll()
		}()
	}
	if !panicked {
		t.Fatal("RecvRefill was not called")
	}
	done := make(chan error, 1)
	go func() {
		_, err := db.Poll()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Poll after the panic: %v", err)
		}
	case <-time.After(10 * time.Second):
		db.pl.mu.Unlock() // let the hung Poll and the cleanup's Close finish
		<-done
		t.Fatal("Poll hung after a recovered panic: the poll lock was left held")
	}
}
