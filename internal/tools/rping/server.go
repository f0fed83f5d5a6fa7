package rping

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
)

func (r *rpinger) server(local netip.Addr) error {
	c := r.c
	bind := netip.AddrPortFrom(c.Addr, c.Port)
	if !c.Addr.IsValid() {
		bind = netip.AddrPortFrom(local, c.Port)
	}
	if err := r.id.BindAddr(bind); err != nil {
		fmt.Fprintf(r.errw, "rdma_bind_addr: %v\n", err)
		return errRpingQuiet
	}
	r.debugf("rdma_bind_addr successful\n")
	if err := r.id.Listen(3); err != nil {
		fmt.Fprintf(r.errw, "rdma_listen: %v\n", err)
		return errRpingQuiet
	}
	r.debugf("rdma_listen\n") // after listening, so a harness can wait for it
	if r.c.OnListen != nil {
		r.c.OnListen()
	}
	for {
		err := r.serveOne()
		if !c.Persistent || err != nil {
			return err
		}
		r.reset()
	}
}

func (r *rpinger) reset() {
	r.release()
	*r = rpinger{c: r.c, out: r.out, errw: r.errw, v: r.v, ch: r.ch, id: r.id}
}

func (r *rpinger) serveOne() error {
	var e rdmacm.Event
	for {
		var err error
		if r.c.Persistent {
			e, err = r.ch.Get(context.Background())
		} else {
			e, err = r.event()
		}
		if err != nil {
			return err
		}
		if e.Type == rdmacm.EventConnectRequest {
			break
		}
		if e.Type == rdmacm.EventTimewaitExit || e.Type == rdmacm.EventDisconnected {
			continue
		}
		fmt.Fprintf(r.errw, "wait for CONNECT_REQUEST state %d\n", 1)
		return errRpingQuiet
	}
	child := e.ID
	r.conn = child
	r.debugf("child cma %p\n", child)
	defer child.Destroy()
	if err := r.setup(child); err != nil {
		fmt.Fprintf(r.errw, "setup_qp failed: %v\n", err)
		return errRpingQuiet
	}
	r.debugf("accepting client connection request\n")
	if err := child.Accept(nil); err != nil {
		fmt.Fprintf(r.errw, "rdma_accept: %v\n", err)
		return errRpingQuiet
	}
	r.noteSelectiveRepeat(child)
	err := r.serverLoop()
	if err != nil {
		fmt.Fprintf(r.errw, "rping server failed: %d\n", -1)
	}
	if !r.disconnected {
		_ = child.Disconnect()
		r.waitDisconnected()
	}
	return err
}

func (r *rpinger) serverLoop() error {
	for {
		// Wait for the client's start buffer (skipping our own ESTABLISHED).
		wc, err := r.completion()
		if err != nil {
			return err
		}
		if wc == nil {
			fmt.Fprintf(r.errw, "wait for RDMA_READ_ADV state %d\n", 10)
			return nil
		}
		raddr := binary.BigEndian.Uint64(r.recvBuf[0:])
		rkey := binary.BigEndian.Uint32(r.recvBuf[8:])
		rlen := binary.BigEndian.Uint32(r.recvBuf[12:])
		r.debugf("Received rkey %x addr %x len %d from peer\n", rkey, raddr, rlen)
		if err := r.postRecv(); err != nil {
			return err
		}
		if int(rlen) > len(r.rdmaBuf) {
			rlen = uint32(len(r.rdmaBuf))
		}
		if err := r.post(qp.SendWR{Opcode: qp.WRRDMARead, RemoteAddr: raddr, RKey: rkey,
			SGL: []qp.SGE{{Addr: rpingRDMAVA, Length: rlen, LKey: r.rdmaMR.LKey()}}}); err != nil {
			return err
		}
		r.debugf("server posted rdma read req \n")
		if wc, err = r.completion(); err != nil || wc == nil || wc.Opcode != cq.OpRDMARead {
			return r.serverStop(err, wc, "RDMA_READ_COMPLETE")
		}
		r.debugf("server received read complete\n")
		if r.c.Verbose {
			fmt.Fprintf(r.out, "server ping data: %s\n", cstr(r.rdmaBuf))
		}
		if err := r.sendGo(); err != nil {
			return err
		}
		r.debugf("server posted go ahead\n")
		// Wait for the client's sink buffer.
		if wc, err = r.completion(); err != nil || wc == nil || wc.Opcode != cq.OpRecv {
			return r.serverStop(err, wc, "RDMA_WRITE_ADV")
		}
		raddr = binary.BigEndian.Uint64(r.recvBuf[0:])
		rkey = binary.BigEndian.Uint32(r.recvBuf[8:])
		if err := r.postRecv(); err != nil {
			return err
		}
		n := len(cstr(r.rdmaBuf)) + 1
		if n > len(r.rdmaBuf) {
			n = len(r.rdmaBuf)
		}
		r.debugf("rdma write from lkey %x laddr %x len %d\n", r.rdmaMR.LKey(), uint64(rpingRDMAVA), n)
		if err := r.post(qp.SendWR{Opcode: qp.WRRDMAWrite, RemoteAddr: raddr, RKey: rkey,
			SGL: []qp.SGE{{Addr: rpingRDMAVA, Length: uint32(n), LKey: r.rdmaMR.LKey()}}}); err != nil {
			return err
		}
		if wc, err = r.completion(); err != nil || wc == nil || wc.Opcode != cq.OpRDMAWrite {
			return r.serverStop(err, wc, "RDMA_WRITE_COMPLETE")
		}
		r.debugf("server rdma write complete \n")
		if err := r.sendGo(); err != nil {
			return err
		}
		r.debugf("server posted go ahead\n")
	}
}

func (r *rpinger) serverStop(err error, wc *cq.WC, want string) error {
	if err != nil {
		return err
	}
	if wc == nil {
		fmt.Fprintf(r.errw, "wait for %s state %d\n", want, 10)
		return nil
	}
	fmt.Fprintf(r.errw, "wait for %s state %d\n", want, 11)
	return errRpingQuiet
}
