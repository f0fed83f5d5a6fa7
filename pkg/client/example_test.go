package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/link/mem"
	"github.com/softroce/softroce/pkg/roce"
)

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// A program on the softroce daemon: client.Dial gives a roce.Verbs whose objects live in
// the daemon; memory from AllocBuffer is shared with it. Two RC QPs of the client, on the
// daemon's one device, carry an RDMA WRITE from one buffer to the other. (The example
// starts a daemon in-process on an in-memory link; a program dials the host's
// `softroce daemon` at client.DefaultSocket.)
func ExampleDial() {
	ip := netip.MustParseAddr("198.18.0.1")
	l, err := mem.NewNetwork(mem.Options{}).Attach(ip)
	check(err)
	dev, err := roce.Open(roce.Options{Link: l})
	check(err)
	defer dev.Close()
	srv, err := daemon.New(daemon.Options{Device: dev, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	check(err)
	dir, err := os.MkdirTemp("", "softroce-example")
	check(err)
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "softroce.sock")
	ln, err := daemon.Listen(sock, 0o600, -1)
	check(err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	}()

	v, err := client.Dial(sock)
	check(err)
	defer v.Close()
	pd, err := v.AllocPD()
	check(err)
	c, err := v.CreateCQ(16)
	check(err)
	buf, err := v.AllocBuffer(8192) // a sealed memfd, mapped by the daemon too
	check(err)
	m, err := v.RegMR(pd, buf, 0x1000, roce.AccessLocalWrite|roce.AccessRemoteWrite)
	check(err)
	qpCap := roce.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, err := v.CreateQP(roce.VerbsQPInit{Type: roce.TypeRC, PD: pd, SendCQ: c, RecvCQ: c, Cap: qpCap})
	check(err)
	b, err := v.CreateQP(roce.VerbsQPInit{Type: roce.TypeRC, PD: pd, SendCQ: c, RecvCQ: c, Cap: qpCap})
	check(err)
	for _, q := range []struct{ q, peer roce.QueuePair }{{a, b}, {b, a}} {
		check(q.q.Modify(&roce.QPAttr{State: roce.StateInit, Port: 1, AccessFlags: roce.AccessRemoteWrite},
			roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrAccessFlags))
		check(q.q.Modify(&roce.QPAttr{State: roce.StateRTR, AH: roce.AHAttr{DGID: ip, SGIDIndex: uint8(v.GIDIndex(ip))},
			PathMTU: roce.MTU1024, DestQPN: q.peer.Num(), RQPSN: 1, MinRNRTimer: 12},
			roce.AttrState|roce.AttrAV|roce.AttrPathMTU|roce.AttrDestQPN|roce.AttrRQPSN|roce.AttrMaxDestRDAtomic|roce.AttrMinRNRTimer))
		check(q.q.Modify(&roce.QPAttr{State: roce.StateRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
			roce.AttrState|roce.AttrSQPSN|roce.AttrTimeout|roce.AttrRetryCnt|roce.AttrRNRRetry|roce.AttrMaxQPRDAtomic))
	}

	msg := "through the daemon"
	copy(buf, msg)
	_, err = a.PostSend([]roce.SendWR{{WRID: 1, Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
		SGL:        []roce.SGE{{Addr: 0x1000, Length: uint32(len(msg)), LKey: m.LKey()}},
		RemoteAddr: 0x1000 + 4096, RKey: m.RKey()}})
	check(err)
	wc := make([]roce.WC, 1)
	for c.Poll(wc) == 0 { // reads the shared completion ring, no system call
		check(c.ReqNotify(false))
		if c.Poll(wc) > 0 {
			break
		}
		check(c.Wait()) // sleeps on the CQ's eventfd
	}
	fmt.Println(v.Name(), wc[0].WRID, wc[0].Status, wc[0].Opcode)
	fmt.Println(string(buf[4096 : 4096+len(msg)]))
	// Output:
	// softroce0 1 success RDMA_WRITE
	// through the daemon
}
