package rdmacm

import (
	"bytes"
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

// spoofREQ builds the UD SEND ONLY to QP1 (Q_Key 0x80010000) carrying a REQ for service svc
// with comm ID, CA GUID and QP number from i (each REQ a new connection), from an rdma_cm
// header claiming src:sport -> dst. The CM timeouts are the largest the fields hold (31: 2.4
// hours, 15 retries): the passive side must not wait that long.
func spoofREQ(t *testing.T, i int, svc uint64, src, dst netip.Addr, ep *bth.Endpoints) []byte {
	t.Helper()
	mad := make([]byte, cm.MADSize)
	h := cm.CMHeader(cm.AttrREQ, uint64(i)+1)
	cm.MAD(mad).Encode(&h)
	f := cm.REQFields{LocalCommID: uint32(i)*2654435761 | 1, ServiceID: svc, LocalCAGUID: 0xbad0000000000000 | uint64(i),
		LocalQPN: uint32(0x100000 + i), ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 31,
		TransportServiceType: cm.TransportRC, StartingPSN: 1, LocalCMResponseTimeout: 31, RetryCount: 7,
		PKey: 0xFFFF, PathMTU: 3, RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: cm.PathFields{LocalGID: src.As16(), RemoteGID: dst.As16(), PacketRate: 3, LocalACKTimeout: 20}}
	cma, err := cm.NewCMAHeader(src, dst, 40000+uint16(i%20000))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cm.BuildPrivateData(f.PrivateData[:], &cma, []byte("spoofed")); err != nil {
		t.Fatal(err)
	}
	cm.REQ(mad[cm.MADHeaderSize:]).Encode(&f)
	spec := rocetest.Spec{Opcode: bth.OpUDSendOnly, DestQP: cm.GSIQPN, PSN: bth.PSN(i & 0xFFFFFF),
		DETH: &bth.DETHFields{QKey: cm.GSIQKey, SrcQP: cm.GSIQPN}, Payload: mad}
	pkt, err := spec.Append(nil, ep)
	if err != nil {
		t.Fatal(err)
	}
	return pkt
}

// TestREQFloodNoLockout: 10 000 spoofed connection requests (no peer behind them, the largest
// CM timeouts a REQ can ask for) reach a listening server, then a real client connects: it is
// established. The server is an application that takes every CONNECT_REQUEST from its
// channel, accepts the one whose private data it recognises and leaves the others unanswered
// (any application that takes its time over a request). The listener's backlog counts
// requests the application has not taken from its channel yet, and a request arriving at a
// full backlog makes room by dropping the oldest untaken one; the CM forgets an unanswered
// request once its sender must have given up (at most MaxREQWait) and keeps at most
// MaxPendingREQs of them. Before, the backlog held every request not yet accepted or rejected
// and a pending request never expired: the 16 oldest spoofed ones filled it for good and the
// real client got REJECTED.
func TestREQFloodNoLockout(t *testing.T) {
	addrC := netip.MustParseAddr("198.18.0.3")
	clk := qp.NewManualClock(time.Unix(1000, 0))
	nw := mem.NewNetwork(mem.Options{QueueDepth: 4096})
	la, err := nw.Attach(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := nw.Attach(addrB)
	if err != nil {
		t.Fatal(err)
	}
	inj, err := nw.Attach(addrC)
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	a, err := roce.Open(roce.Options{Link: la, Clock: clk, Name: "a", CM: roce.CMOptions{TimeWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := roce.Open(roce.Options{Link: lb, Clock: clk, Name: "b", CM: roce.CMOptions{TimeWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	srv, cli := newSide(t, b, cm.PSTCP), newSide(t, a, cm.PSTCP)
	const port = 7180
	if err := srv.id.BindAddr(netip.AddrPortFrom(netip.Addr{}, port)); err != nil {
		t.Fatal(err)
	}
	if err := srv.id.Listen(16); err != nil {
		t.Fatal(err)
	}

	// The server: takes every request, accepts the one that says "legit", ignores the rest.
	accepted := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvDone := make(chan struct{})
	go func() {
		defer close(srvDone)
		for {
			e, err := srv.ch.Get(ctx)
			if err != nil {
				return
			}
			if e.Type != EventConnectRequest || !bytes.HasPrefix(e.Param.PrivateData, []byte("legit")) {
				continue
			}
			q, err := e.ID.CreateQP(srv.pd, roce.QPInit{SendCQ: srv.cq, RecvCQ: srv.cq,
				Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err == nil {
				_ = q
				err = e.ID.Accept(nil)
			}
			accepted <- err
		}
	}()

	// The flood, in batches the link's queue holds, each handed to the CM before the next.
	const flood = 10000
	svc := cm.ServiceID(cm.PSTCP, port)
	ep := bth.Endpoints{Src: addrC, Dst: addrB, SrcPort: bth.UDSourcePort(cm.GSIQPN), DstPort: bth.UDPPort}
	base := b.CM().Stats().Received
	for i := 0; i < flood; {
		batch := make([]link.Datagram, 0, 512)
		for ; i < flood && len(batch) < cap(batch); i++ {
			batch = append(batch, link.Datagram{Buf: spoofREQ(t, i, svc, addrC, addrB, &ep),
				Src: netip.AddrPortFrom(addrC, ep.SrcPort), Dst: netip.AddrPortFrom(addrB, bth.UDPPort)})
		}
		if err := inj.Send(batch); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); b.CM().Stats().Received-base < uint64(i); {
			if time.Now().After(deadline) {
				t.Fatalf("the server's CM received %d of %d REQs", b.CM().Stats().Received-base, i)
			}
			runtime.Gosched()
		}
	}

	// The real client.
	connectTo(t, cli, port, ConnParam{PrivateData: []byte("legit"), RetryCount: 7, RNRRetryCount: 7})
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatal("Accept:", err)
		}
	case <-time.After(20 * time.Second):
		if e, ok := cli.ch.TryGet(); ok {
			t.Fatalf("the real request never reached the server application; the client got %v (%v)", e.Type, e.Status)
		}
		t.Fatal("the real request never reached the server application")
	}
	next(t, cli.ch, EventEstablished)
	st := b.CM().Stats()
	t.Logf("server CM after %d spoofed REQs and one real: %+v, pending %d", flood, st, b.CM().PendingREQs())
	if n := b.CM().PendingREQs(); n > cm.DefaultMaxPendingREQs {
		t.Fatalf("%d requests pending in the CM, bound %d", n, cm.DefaultMaxPendingREQs)
	}
	// once every sender must have given up, nothing of the flood is left
	clk.Advance(cm.DefaultMaxREQWait + time.Second)
	for deadline := time.Now().Add(5 * time.Second); b.CM().PendingREQs() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d spoofed requests still pending after %v", b.CM().PendingREQs(), cm.DefaultMaxREQWait)
		}
		runtime.Gosched()
	}
	cancel()
	<-srvDone
}
