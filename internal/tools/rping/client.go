package rping

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/softroce/softroce/pkg/rdmacm"
)

func (r *rpinger) client(local netip.Addr) error {
	c := r.c
	if err := r.id.ResolveAddr(local, netip.AddrPortFrom(c.Addr, c.Port), 2000*time.Millisecond); err != nil {
		return err
	}
	for _, want := range []rdmacm.EventType{rdmacm.EventAddrResolved, rdmacm.EventRouteResolved} {
		e, err := r.event()
		if err != nil {
			return err
		}
		if e.Type != want {
			r.cmError(e)
			fmt.Fprintf(r.errw, "waiting for addr/route resolution state %d\n", 11)
			return errRpingQuiet
		}
		if want == rdmacm.EventAddrResolved {
			if err := r.id.ResolveRoute(2000 * time.Millisecond); err != nil {
				return err
			}
		}
	}
	r.debugf("rdma_resolve_addr - rdma_resolve_route successful\n")
	if err := r.setup(r.id); err != nil {
		return err
	}
	r.conn = r.id
	if err := r.id.Connect(rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}); err != nil {
		return fmt.Errorf("rdma_connect: %w", err)
	}
	e, err := r.event()
	if err != nil {
		return err
	}
	if e.Type != rdmacm.EventEstablished {
		r.cmError(e)
		fmt.Fprintf(r.errw, "wait for CONNECTED state %d\n", 11)
		fmt.Fprintf(r.errw, "connect error %d\n", -1)
		return errRpingQuiet
	}
	r.debugf("rdma_connect successful\n")
	r.noteSelectiveRepeat(r.id)
	err = r.clientLoop()
	if !r.disconnected {
		_ = r.id.Disconnect()
		r.waitDisconnected()
	}
	return err
}

// waitDisconnected waits (bounded) for DISCONNECTED after our DREQ, printing rping's line.
func (r *rpinger) waitDisconnected() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		e, err := r.ch.Get(ctx)
		if err != nil {
			return
		}
		if e.Type == rdmacm.EventDisconnected {
			fmt.Fprintf(r.errw, "%s DISCONNECT EVENT...\n", map[bool]string{true: "server", false: "client"}[r.c.Server])
			r.disconnected = true
			return
		}
	}
}

func (r *rpinger) clientLoop() error {
	c := r.c
	start := byte(65)
	for ping := 0; c.Count == 0 || ping < c.Count; ping++ {
		n := copy(r.startBuf, fmt.Sprintf("rdma-ping-%d: ", ping))
		ch := start
		for i := n; i < c.Size; i++ {
			r.startBuf[i] = ch
			ch++
			if ch > 122 {
				ch = 65
			}
		}
		start++
		if start > 122 {
			start = 65
		}
		r.startBuf[c.Size-1] = 0
		if err := r.sendInfo(rpingStartVA, r.startMR); err != nil {
			return err
		}
		// wait for the server's go-ahead after its READ
		wc, err := r.completion()
		if err != nil || wc == nil {
			return r.clientStop(err, 7)
		}
		if err := r.postRecv(); err != nil {
			return err
		}
		if err := r.sendInfo(rpingRDMAVA, r.rdmaMR); err != nil {
			return err
		}
		// wait for the go-ahead after its WRITE
		wc, err = r.completion()
		if err != nil || wc == nil {
			return r.clientStop(err, 9)
		}
		if err := r.postRecv(); err != nil {
			return err
		}
		if c.Validate && !bytes.Equal(r.startBuf, r.rdmaBuf) {
			fmt.Fprintf(r.errw, "data mismatch!\n")
			return errRpingQuiet
		}
		if c.Verbose {
			fmt.Fprintf(r.out, "ping data: %s\n", cstr(r.rdmaBuf))
		}
	}
	return nil
}

func (r *rpinger) clientStop(err error, want int) error {
	if err != nil {
		return err
	}
	// DISCONNECTED: rping returns 0 when its state is DISCONNECTED
	fmt.Fprintf(r.errw, "wait for %s state %d\n", map[int]string{7: "RDMA_WRITE_ADV", 9: "RDMA_WRITE_COMPLETE"}[want], 10)
	return nil
}

func cstr(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
