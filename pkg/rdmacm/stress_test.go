package rdmacm

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// TestConcurrentConnections: 16 clients on their own goroutines connect at once to one
// listener whose server goroutine accepts each request as it comes (CONNECT_REQUEST,
// CreateQP, Accept) while other requests and establishments arrive; every pair reaches
// ESTABLISHED, then the clients disconnect concurrently and every side sees DISCONNECTED.
// Run under -race it checks the API's locking against the CM's event delivery.
func TestConcurrentConnections(t *testing.T) {
	const n = 16
	nw := mem.NewNetwork(mem.Options{QueueDepth: 4096})
	la, _ := nw.Attach(addrA)
	lb, _ := nw.Attach(addrB)
	a, err := roce.Open(roce.Options{Link: la, Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := roce.Open(roce.Options{Link: lb, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	srv := newSide(t, b, cm.PSTCP)
	if err := srv.id.BindAddr(netip0(7000)); err != nil {
		t.Fatal(err)
	}
	if err := srv.id.Listen(n); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	serverDone := make(chan error, 1)
	go func() {
		est, disc := 0, 0
		for est < n || disc < n {
			e, err := srv.ch.Get(ctx)
			if err != nil {
				serverDone <- err
				return
			}
			switch e.Type {
			case EventConnectRequest:
				if _, err := e.ID.CreateQP(srv.pd, roce.QPInit{SendCQ: srv.cq, RecvCQ: srv.cq,
					Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
					serverDone <- err
					return
				}
				if err := e.ID.Accept(nil); err != nil {
					serverDone <- err
					return
				}
			case EventEstablished:
				est++
			case EventDisconnected:
				disc++
			}
		}
		serverDone <- nil
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch := NewEventChannel()
			id, err := CreateID(ch, IDOptions{Device: a})
			if err != nil {
				errs <- err
				return
			}
			defer id.Destroy()
			pd, _ := a.AllocPD()
			c, _ := a.CreateCQ(8)
			wait := func(want EventType) error {
				e, err := ch.Get(ctx)
				if err == nil && e.Type != want {
					err = e.Status
					if err == nil {
						err = ErrState
					}
				}
				return err
			}
			if err := id.ResolveAddr(netip0(0).Addr(), netipB(7000), time.Second); err != nil {
				errs <- err
				return
			}
			if err := wait(EventAddrResolved); err != nil {
				errs <- err
				return
			}
			if err := id.ResolveRoute(time.Second); err != nil {
				errs <- err
				return
			}
			if err := wait(EventRouteResolved); err != nil {
				errs <- err
				return
			}
			if _, err := id.CreateQP(pd, roce.QPInit{SendCQ: c, RecvCQ: c,
				Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
				errs <- err
				return
			}
			if err := id.Connect(ConnParam{RetryCount: 7, RNRRetryCount: 7}); err != nil {
				errs <- err
				return
			}
			if err := wait(EventEstablished); err != nil {
				errs <- err
				return
			}
			if err := id.Disconnect(); err != nil {
				errs <- err
				return
			}
			errs <- wait(EventDisconnected)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-serverDone; err != nil {
		t.Fatal(err)
	}
}

func netip0(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.Addr{}, port) }
func netipB(port uint16) netip.AddrPort { return netip.AddrPortFrom(addrB, port) }
