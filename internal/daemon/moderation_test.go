package daemon_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/udp"
	"github.com/softroce/softroce/pkg/roce"
)

// udpLoopDaemons starts two daemons on UDP loopback addresses of pair i.
func udpLoopDaemons(t *testing.T, i int) (*testDaemon, *testDaemon, netip.Addr, netip.Addr) {
	t.Helper()
	ipA, ipB := loopbackPair(i)
	la, err := udp.Listen(udp.Options{Addrs: []netip.Addr{ipA}})
	if err != nil {
		t.Skip(err)
	}
	lb, err := udp.Listen(udp.Options{Addrs: []netip.Addr{ipB}})
	if err != nil {
		t.Skip(err)
	}
	return startDaemon(t, la, "a", 0), startDaemon(t, lb, "b", 0), ipA, ipB
}

// streamWait streams n signaled WRITEs of size bytes from a to p with depth in flight,
// waiting with ReqNotify + Poll + Wait (or the channel) on a CQ moderated with m. It returns
// an error instead of failing, so a caller can run it in a goroutine under a timeout.
func streamWait(a, p *end, size, depth, n int, m cq.Moderation, channel bool) error {
	if err := a.v.ModifyCQ(a.cq, m); err != nil {
		return fmt.Errorf("ModifyCQ: %w", err)
	}
	wrs := make([]qp.SendWR, depth)
	for i := range wrs {
		wrs[i] = qp.SendWR{WRID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL:        []qp.SGE{{Addr: a.iova + uint64(i*size), Length: uint32(size), LKey: a.m.LKey()}},
			RemoteAddr: p.iova + uint64(i*size), RKey: p.m.RKey()}
	}
	wcs := make([]cq.WC, depth)
	posted := min(depth, n)
	if _, err := a.q.PostSend(wrs[:posted]); err != nil {
		return err
	}
	for done := 0; done < n; {
		k := a.cq.Poll(wcs)
		if k == 0 {
			if err := a.cq.ReqNotify(false); err != nil {
				return err
			}
			if k = a.cq.Poll(wcs); k == 0 {
				if channel {
					<-a.cq.Channel()
				} else if err := a.cq.Wait(); err != nil {
					return err
				}
				continue
			}
		}
		for _, wc := range wcs[:k] {
			if wc.Status != cq.StatusSuccess {
				return fmt.Errorf("completion %+v", wc)
			}
			done++
			if posted < n {
				if _, err := a.q.PostSend(wrs[wc.WRID : wc.WRID+1]); err != nil {
					return err
				}
				posted++
			}
		}
	}
	return nil
}

// TestModeratedWaitNoLostWakeup: WRITE streams through two daemons, the sender waiting in
// its own goroutine (Wait) or on the channel, with moderation off, by count with a period,
// and by count with a period shorter than the count takes — so the count, the period timer
// and the client's sleep race each other thousands of times. Every completion must arrive:
// a lost wakeup fails the test by its timeout instead of hanging. The same runs embedded.
func TestModeratedWaitNoLostWakeup(t *testing.T) {
	da, db, ipA, ipB := udpLoopDaemons(t, 40)
	ea, eb := udpDevicesT(t, 41)
	mods := []cq.Moderation{{}, {Count: 4, PeriodUS: 200}, {Count: 7, PeriodUS: 5}, {Count: 2, PeriodUS: 1}}
	for _, mode := range []string{"daemon", "embedded"} {
		var va, vb roce.Verbs
		var a, b netip.Addr
		if mode == "daemon" {
			va, vb, a, b = da.dial(t), db.dial(t), ipA, ipB
		} else {
			va, vb, a, b = ea.d.Verbs(), eb.d.Verbs(), ea.ip, eb.ip
		}
		const depth, size = 8, 256
		for _, m := range mods {
			for _, channel := range []bool{false, true} {
				name := fmt.Sprintf("%s/count%d-period%d/channel=%v", mode, m.Count, m.PeriodUS, channel)
				t.Run(name, func(t *testing.T) {
					s := newEnd(t, va, size*depth, depth, rcAccess)
					r := newEnd(t, vb, size*depth, depth, rcAccess)
					s.timeout, r.timeout = 16, 16 // 268 ms: a loaded machine (race detector, other suites) must not fail the run
					s.connect(t, b, r.q.Num(), uint8(va.GIDIndex(a)))
					r.connect(t, a, s.q.Num(), uint8(vb.GIDIndex(b)))
					res := make(chan error, 1)
					go func() { res <- streamWait(s, r, size, depth, 8000, m, channel) }()
					select {
					case err := <-res:
						if err != nil {
							t.Fatal(err)
						}
					case <-time.After(waitLimit):
						t.Fatal("stream stalled: a completion event was lost")
					}
				})
			}
		}
	}
}

type udpDev struct {
	d  *roce.Device
	ip netip.Addr
}

// udpDevicesT opens two embedded UDP devices on pair i (closed by the cleanup).
func udpDevicesT(t *testing.T, i int) (udpDev, udpDev) {
	t.Helper()
	ipA, ipB := loopbackPair(i)
	var out [2]udpDev
	for k, ip := range []netip.Addr{ipA, ipB} {
		d, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{ip}})
		if err != nil {
			t.Skip("UDP loopback unavailable:", err)
		}
		t.Cleanup(func() { d.Close() })
		out[k] = udpDev{d, ip}
	}
	return out[0], out[1]
}

// TestModifyCQIsolation: OpModifyCQ names the CQ by the client's handle: another client's
// CQ is refused (roce.ErrInvalidArg client-side; the daemon looks the handle up in the
// session's own table like every request).
func TestModifyCQIsolation(t *testing.T) {
	da, _, _, _ := udpLoopDaemons(t, 42)
	c1, c2 := da.dial(t), da.dial(t)
	q1, err := c1.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.ModifyCQ(q1, cq.Moderation{Count: 4, PeriodUS: 10}); err == nil {
		t.Fatal("a client modified another client's CQ")
	}
	if err := c1.ModifyCQ(q1, cq.Moderation{Count: 4, PeriodUS: 10}); err != nil {
		t.Fatal(err)
	}
	if err := c1.DestroyCQ(q1); err != nil {
		t.Fatal(err)
	}
	if err := c1.ModifyCQ(q1, cq.Moderation{}); err == nil {
		t.Fatal("ModifyCQ of a destroyed CQ succeeded")
	}
}
