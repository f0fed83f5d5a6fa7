package pingpong

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/softroce/softroce/internal/mr"
	oobpp "github.com/softroce/softroce/internal/oob/pingpong"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/roce"
)

// ppCtx is struct pingpong_context: the verbs objects of one run.
type ppCtx struct {
	c    *Config
	ld   *cli.VerbsDev // the embedded device or the daemon (--daemon)
	pd   roce.ProtectionDomain
	mr   roce.MemoryRegion
	cq   roce.CompletionQueue
	srq  roce.SharedReceiveQueue
	qps  []roce.QueuePair
	ah   *qp.AH
	buf  []byte // from ld.V.AllocBuffer
	mine []oobpp.Dest
	peer []oobpp.Dest

	// srq: the buffer is numQP send buffers then rxDepth receive slots (see newPPCtx);
	// last holds the most recent message received, which the next SEND echoes.
	last     []byte
	haveLast bool
	posted   int // receives posted so far (srq: slot = posted % rxDepth)

	pending []int
	recvWR  [1]qp.RecvWR
	recvSGE [1]qp.SGE
	sendWR  [1]qp.SendWR
	sendSGE [1]qp.SGE
}

// newPPCtx is pp_init_ctx plus the initial receives and the local addresses.
func newPPCtx(c *Config, ld *cli.VerbsDev) (*ppCtx, error) {
	p := &ppCtx{c: c, ld: ld}
	d := ld.V
	n := c.Size
	fill := byte(0x7b) // rc/uc/ud: memset(ctx->buf, 0x7b, size); srq: memset(ctx->buf, 0, size)
	switch c.Tool {
	case oobpp.ToolUD:
		if mtu := ld.MTU.Bytes(); c.Size > mtu { // a UD message is one packet (IBTA 9.8.5)
			return nil, fmt.Errorf("Requested size larger than port MTU (%d)", mtu)
		}
		n += ppGRHSize
	case oobpp.ToolSRQ:
		fill = 0
	}
	if c.Tool == oobpp.ToolSRQ {
		// srq_pingpong receives into, and sends from, one buffer shared by every QP: the
		// receives of different QPs land in it while a SEND of another QP reads it (the
		// same bytes each time, so nothing shows on the wire). In Go that is a data race,
		// so each receive WR here gets its own slot and each QP its own send buffer; the
		// message last received is copied to a QP's send buffer when it posts its SEND.
		// The bytes on the wire are those of the C tool.
		if total := (c.NumQP + c.RxDepth) * c.Size; total > ppMaxSize {
			return nil, fmt.Errorf("%w: srq needs (num_qp + rx_depth) * size = %d bytes, more than %d", errPPUsage, total, ppMaxSize)
		}
		n = (c.NumQP + c.RxDepth) * c.Size
		p.last = make([]byte, c.Size)
	}
	var err error
	if p.buf, err = d.AllocBuffer(n); err != nil { // memory the daemon can map too
		return nil, fmt.Errorf("%w: Couldn't allocate work buf: %w", errPPVerbs, err)
	}
	for i := range p.buf {
		p.buf[i] = fill
	}
	if p.pd, err = d.AllocPD(); err != nil {
		return nil, fmt.Errorf("%w: Couldn't allocate PD: %w", errPPVerbs, err)
	}
	if p.mr, err = d.RegMR(p.pd, p.buf, ppIOVA, mr.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("%w: Couldn't register MR: %w", errPPVerbs, err)
	}
	cqe := c.RxDepth + 1
	if c.Tool == oobpp.ToolSRQ {
		cqe = c.RxDepth + c.NumQP
	}
	if p.cq, err = d.CreateCQ(cqe); err != nil {
		return nil, fmt.Errorf("%w: Couldn't create CQ: %w", errPPVerbs, err)
	}
	typ := qp.TypeRC
	caps := qp.Cap{MaxSendWR: 1, MaxRecvWR: uint32(c.RxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}
	switch c.Tool {
	case oobpp.ToolUC:
		typ = qp.TypeUC
	case oobpp.ToolUD:
		typ = qp.TypeUD
	case oobpp.ToolSRQ:
		if p.srq, err = d.CreateSRQ(qp.SRQOptions{MaxWR: c.RxDepth, MaxSGE: 1}); err != nil {
			return nil, fmt.Errorf("%w: Couldn't create SRQ: %w", errPPVerbs, err)
		}
		caps.MaxRecvWR, caps.MaxRecvSGE = 0, 0
	}
	for i := 0; i < c.NumQP; i++ {
		q, err := d.CreateQP(roce.VerbsQPInit{Type: typ, PD: p.pd, SendCQ: p.cq, RecvCQ: p.cq, SRQ: p.srq, Cap: caps})
		if err != nil {
			return nil, fmt.Errorf("%w: Couldn't create QP[%d]: %w", errPPVerbs, i, err)
		}
		p.qps = append(p.qps, q)
		a := qp.Attr{State: qp.StateInit, PKeyIndex: 0, Port: 1}
		mask := qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort
		if typ == qp.TypeUD {
			a.QKey, mask = ppUDQKey, mask|qp.AttrQKey
		} else {
			mask |= qp.AttrAccessFlags
		}
		if err := q.Modify(&a, mask); err != nil {
			return nil, fmt.Errorf("%w: Failed to modify QP[%d] to INIT: %w", errPPVerbs, i, err)
		}
	}
	rlen := n
	if p.srq != nil {
		rlen = c.Size
	}
	p.recvSGE[0] = qp.SGE{Addr: ppIOVA, Length: uint32(rlen), LKey: p.mr.LKey()}
	p.recvWR[0] = qp.RecvWR{WRID: ppRecvWRID, SGL: p.recvSGE[:]}
	off := uint64(0)
	if c.Tool == oobpp.ToolUD {
		off = ppGRHSize // ud_pingpong sends from buf + 40
	}
	p.sendSGE[0] = qp.SGE{Addr: ppIOVA + off, Length: uint32(c.Size), LKey: p.mr.LKey()}
	p.sendWR[0] = qp.SendWR{WRID: ppSendWRID, Opcode: qp.WRSend, SGL: p.sendSGE[:], Flags: qp.SendSignaled}
	if posted := p.postRecv(c.RxDepth); posted < c.RxDepth {
		return nil, fmt.Errorf("%w: Couldn't post receive (%d)", errPPVerbs, posted)
	}
	if c.Events {
		if err := p.cq.ReqNotify(false); err != nil {
			return nil, fmt.Errorf("%w: Couldn't request CQ notification: %w", errPPVerbs, err)
		}
	}
	for _, q := range p.qps {
		dst := oobpp.Dest{LID: d.PortAttr().LID, QPN: q.Num(), PSN: rand.Uint32() & 0xffffff}
		dst.GID = ld.GID()
		p.mine = append(p.mine, dst)
	}
	return p, nil
}

// close is pp_close_ctx: destroy everything; the device is closed by the caller.
func (p *ppCtx) close() error {
	var errs []error
	for i, q := range p.qps {
		if err := q.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy QP[%d]: %w", errPPVerbs, i, err))
		}
	}
	if p.srq != nil {
		if err := p.ld.V.DestroySRQ(p.srq); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy SRQ: %w", errPPVerbs, err))
		}
	}
	if p.cq != nil {
		if err := p.ld.V.DestroyCQ(p.cq); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't destroy CQ: %w", errPPVerbs, err))
		}
	}
	bufFree := true
	if p.mr != nil {
		if err := p.mr.Dereg(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't deregister MR: %w", errPPVerbs, err))
			bufFree = false // still registered: leave the memory mapped
		}
	}
	if p.buf != nil && bufFree {
		if err := p.ld.V.FreeBuffer(p.buf); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't free work buf: %w", errPPVerbs, err))
		}
		p.buf = nil
	}
	if p.pd != nil {
		if err := p.pd.Dealloc(); err != nil {
			errs = append(errs, fmt.Errorf("%w: Couldn't deallocate PD: %w", errPPVerbs, err))
		}
	}
	return errors.Join(errs...)
}

// postRecv is pp_post_recv: post up to n receives of the whole buffer; returns how many.
func (p *ppCtx) postRecv(n int) int {
	for i := 0; i < n; i++ {
		var err error
		if p.srq != nil {
			slot := p.posted % p.c.RxDepth
			p.recvWR[0].WRID = ppRecvWRID | uint64(slot)<<8
			p.recvSGE[0].Addr = ppIOVA + uint64((p.c.NumQP+slot)*p.c.Size)
			_, err = p.srq.Post(p.recvWR[:])
		} else {
			_, err = p.qps[0].PostRecv(p.recvWR[:])
		}
		if err != nil {
			return i
		}
		p.posted++
	}
	return n
}

// postSend is pp_post_send on QP i.
func (p *ppCtx) postSend(i int) error {
	if p.ah != nil {
		p.sendWR[0].AH, p.sendWR[0].RemoteQPN, p.sendWR[0].RemoteQKey = p.ah, p.peer[0].QPN, ppUDQKey
	}
	if p.srq != nil {
		if p.haveLast { // QP i's previous SEND completed: its buffer is free
			copy(p.sendBufOf(i), p.last)
		}
		p.sendSGE[0].Addr = ppIOVA + uint64(i*p.c.Size)
	}
	_, err := p.qps[i].PostSend(p.sendWR[:])
	return err
}

// connect is pp_connect_ctx: move the QPs to RTR and RTS toward the peer's records.
// tcpPeer is the exchange's remote address, used when the peer sent a zero GID.
func (p *ppCtx) connect(remote []oobpp.Dest, tcpPeer netip.Addr) error {
	c := p.c
	if len(remote) < c.NumQP {
		return fmt.Errorf("%w: %d records for %d QPs", errPPPeer, len(remote), c.NumQP)
	}
	p.peer = remote[:c.NumQP]
	for i, r := range p.peer {
		if r.QPN == 0 || r.QPN == 1 || r.QPN > 0xffffff {
			return fmt.Errorf("%w: record %d has QPN %#x (the peer uses fewer QPs than -q %d?)", errPPPeer, i, r.QPN, c.NumQP)
		}
	}
	// srq_pingpong uses the first record's GID for every QP (dest->gid).
	dgid := p.peer[0].Addr().Unmap()
	if p.peer[0].GID == ([16]byte{}) {
		dgid = tcpPeer.Unmap() // softroce: the tools would go without a GRH, impossible on RoCE
	}
	if !dgid.IsValid() || dgid.IsUnspecified() || dgid.Is4() != p.ld.Addr.Is4() {
		return fmt.Errorf("%w: GID %v cannot be reached from %v", errPPPeer, dgid, p.ld.Addr)
	}
	ah := qp.AHAttr{DGID: dgid, SGIDIndex: uint8(p.ld.GIDIndex), HopLimit: 1, SL: uint8(c.SL), Port: 1}
	if c.Tool == oobpp.ToolUD {
		q := p.qps[0]
		if err := q.Modify(&qp.Attr{State: qp.StateRTR}, qp.AttrState); err != nil {
			return fmt.Errorf("%w: Failed to modify QP to RTR: %w", errPPVerbs, err)
		}
		if err := q.Modify(&qp.Attr{State: qp.StateRTS, SQPSN: p.mine[0].PSN}, qp.AttrState|qp.AttrSQPSN); err != nil {
			return fmt.Errorf("%w: Failed to modify QP to RTS: %w", errPPVerbs, err)
		}
		var err error
		if p.ah, err = p.ld.V.CreateAH(p.pd, ah); err != nil {
			return fmt.Errorf("%w: Failed to create AH: %w", errPPVerbs, err)
		}
		return nil
	}
	for i, q := range p.qps {
		rtr := qp.Attr{State: qp.StateRTR, PathMTU: c.MTU, DestQPN: p.peer[i].QPN, RQPSN: p.peer[i].PSN, AH: ah}
		mask := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
		rts := qp.Attr{State: qp.StateRTS, SQPSN: p.mine[i].PSN}
		rtsMask := qp.AttrState | qp.AttrSQPSN
		if c.Tool != oobpp.ToolUC {
			rtr.MaxDestRDAtomic, rtr.MinRNRTimer = 1, 12
			mask |= qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
			if c.SelectiveRepeat {
				rtr.SelectiveRepeat = true // softroce's own: both sides gave --selective-repeat
				mask |= qp.AttrSelectiveRepeat
			}
			rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRDAtomic = 14, 7, 7, 1
			rtsMask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
		}
		if err := q.Modify(&rtr, mask); err != nil {
			return fmt.Errorf("%w: Failed to modify QP[%d] to RTR: %w", errPPVerbs, i, err)
		}
		if err := q.Modify(&rts, rtsMask); err != nil {
			return fmt.Errorf("%w: Failed to modify QP[%d] to RTS: %w", errPPVerbs, i, err)
		}
	}
	return nil
}
