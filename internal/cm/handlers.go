package cm

// HandleMAD processes one received MAD: the payload of a UD SEND that
// arrived on QP1, from the peer src (its GID, source QP from the DETH and
// P_Key from the BTH). Malformed MADs return a *ParseError and change
// nothing; messages that match no connection are dropped (or answered as
// IBTA 12.9 requires: REJ for unknown service IDs and stale connections,
// DREP for unknown DREQs). It never panics on remote input.
func (m *Manager) HandleMAD(src Addr, mad []byte) error {
	msg, err := Parse(mad)
	m.mu.Lock()
	defer m.unlock()
	if m.closed {
		return ErrClosed
	}
	if err != nil {
		m.stats.Malformed++
		return err
	}
	m.stats.Received++
	if src.QPN == 0 {
		src.QPN = GSIQPN
	}
	tid := msg.MAD.TID()
	switch msg.Attr {
	case AttrREQ:
		m.onREQ(src, tid, msg.REQ)
	case AttrMRA:
		m.onMRA(msg.MRA)
	case AttrREJ:
		m.onREJ(msg.REJ)
	case AttrREP:
		m.onREP(src, tid, msg.REP)
	case AttrRTU:
		m.onRTU(msg.RTU)
	case AttrDREQ:
		m.onDREQ(src, tid, msg.DREQ)
	case AttrDREP:
		m.onDREP(msg.DREP)
	case AttrSIDRReq:
		m.onSIDRReq(src, tid, msg.SIDRReq)
	case AttrSIDRRep:
		m.onSIDRRep(msg.SIDRRep)
	}
	return nil
}

func (m *Manager) drop()      { m.stats.Dropped++ }
func (m *Manager) duplicate() { m.stats.Duplicates++ }

// issueREJ answers a message that has no connection (cm_issue_rej).
func (m *Manager) issueREJ(dst Addr, tid uint64, remoteID uint32, which MsgType, reason RejectReason) {
	mad, d := newMAD(AttrREJ, tid)
	f := REJFields{RemoteCommID: remoteID, MessageRejected: which, Reason: reason}
	REJ(d).Encode(&f)
	m.send(dst, mad)
}

// staleConflict handles a REQ or REP naming a remote QP that already has a
// connection (IBTA 12.9, stale connection): the old connection is
// disconnected if established (cm.c does the same).
func (m *Manager) staleConflict(old *Conn) {
	if old.state == StateEstablished {
		m.sendDREQ(old, nil)
		m.disconnected(old, nil)
	}
}

// onREQ: passive side (IBTA 12.9, cm_req_handler).
func (m *Manager) onREQ(src Addr, tid uint64, r REQ) {
	rk := remoteKey{r.LocalCommID(), r.LocalCAGUID()}
	if c := m.remote[rk]; c != nil {
		// Duplicate REQ (cm_dup_req_handler).
		m.duplicate()
		switch c.state {
		case StateMRAREQSent:
			m.send(c.peer, c.lastResp)
		case StateTimewait:
			m.sendREJ(c, RejStaleConn, nil, nil)
		}
		return
	}
	if old := m.remoteQP[remoteKey{r.LocalQPN(), r.LocalCAGUID()}]; old != nil {
		m.issueREJ(src, tid, r.LocalCommID(), MsgREQ, RejStaleConn)
		m.staleConflict(old)
		return
	}
	l := m.listen[r.ServiceID()]
	if l == nil {
		m.stats.NoListener++
		m.issueREJ(src, tid, r.LocalCommID(), MsgREQ, RejInvalidServiceID)
		return
	}
	tt := r.TransportServiceType()
	if tt != TransportRC && tt != TransportUC {
		m.issueREJ(src, tid, r.LocalCommID(), MsgREQ, RejInvalidTransportType)
		return
	}
	id, err := m.newLocalID()
	if err != nil {
		m.issueREJ(src, tid, r.LocalCommID(), MsgREQ, RejNoResources)
		return
	}
	pf := r.Primary()
	// Seen from the passive side the path is reversed; the packet life time
	// is the REQ's local ACK timeout minus one (cm_format_paths_from_req).
	plt := pf.LocalACKTimeout()
	if plt > 0 {
		plt--
	}
	path := Path{SGID: pf.RemoteGID(), DGID: pf.LocalGID(), SLID: pf.RemoteLID(), DLID: pf.LocalLID(),
		PKey: r.PKey(), FlowLabel: pf.FlowLabel(), TrafficClass: pf.TrafficClass(), HopLimit: pf.HopLimit(),
		SL: pf.SL(), MTU: r.PathMTU(), PacketRate: pf.PacketRate(), PacketLifeTime: plt,
		LocalACKTimeout: pf.LocalACKTimeout(), SubnetLocal: pf.SubnetLocal()}
	c := &Conn{m: m, state: StateREQRcvd, localID: id, remoteID: r.LocalCommID(), remoteGUID: r.LocalCAGUID(),
		tid: tid, service: r.ServiceID(), peer: src, path: path, typ: tt, remoteQPN: r.LocalQPN(),
		sqPSN: r.StartingPSN(), retryCount: r.RetryCount(), rnrOut: r.RNRRetryCount(),
		maxCMRetries: r.MaxCMRetries(), srOffer: tt == TransportRC && r.SelectiveRepeat(),
		respTimeout: 2*CMTimeout(plt) + CMTimeout(r.LocalCMResponseTimeout())}
	if c.peer.PKey == 0 {
		c.peer.PKey = r.PKey()
	}
	c.req = ConnParam{ServiceID: r.ServiceID(), CAGUID: r.LocalCAGUID(), QPN: r.LocalQPN(),
		StartingPSN: r.StartingPSN(), Transport: tt, ResponderResources: r.ResponderResources(),
		InitiatorDepth: r.InitiatorDepth(), RetryCount: r.RetryCount(), RNRRetryCount: r.RNRRetryCount(),
		FlowControl: r.EndToEndFlowControl(), SRQ: r.SRQ(), PathMTU: r.PathMTU(), Path: path,
		SelectiveRepeat: c.srOffer}
	m.local[id] = c
	m.insertRemote(c)
	// it waits for its consumer at most as long as its sender waits for us (pending.go)
	m.pend(c, m.reqWait(r.RemoteCMResponseTimeout(), r.MaxCMRetries(), plt))
	m.event(c, Event{Type: EventConnectRequest, Listener: l, Remote: c.req, Src: src,
		PrivateData: copyBytes(r.PrivateData())})
}

// onREP: active side (IBTA 12.9, cm_rep_handler / cm_dup_rep_handler).
func (m *Manager) onREP(src Addr, tid uint64, r REP) {
	c := m.local[r.RemoteCommID()]
	if c == nil || c.ud {
		m.drop()
		return
	}
	if c.state != StateREQSent && c.state != StateMRAREQRcvd {
		if c.remoteID == r.LocalCommID() {
			m.duplicate()
			switch c.state {
			case StateEstablished, StateMRAREPSent:
				m.send(c.peer, c.lastResp) // RTU or MRA again
			}
			return
		}
		m.drop()
		return
	}
	if old := m.remoteQP[remoteKey{r.LocalQPN(), r.LocalCAGUID()}]; old != nil && old != c {
		m.issueREJ(src, tid, r.LocalCommID(), MsgREP, RejStaleConn)
		m.staleConflict(old)
		m.qpErr(c)
		m.enterTimewait(c)
		m.event(c, Event{Type: EventRejected, Reason: RejStaleConn})
		return
	}
	m.cancel(c)
	c.remoteID, c.remoteGUID, c.remoteQPN = r.LocalCommID(), r.LocalCAGUID(), r.LocalQPN()
	c.sqPSN, c.rnrOut = r.StartingPSN(), r.RNRRetryCount()
	// selective repeat only if we offered it and the peer accepted (ext.go)
	c.sr = c.srOffer && r.SelectiveRepeat()
	// Our RDMA READ depth cannot exceed the peer's responder resources.
	if r.ResponderResources() < c.initDepth {
		c.initDepth = r.ResponderResources()
	}
	m.insertRemote(c)
	c.state = StateREPRcvd
	remote := ConnParam{ServiceID: c.service, CAGUID: c.remoteGUID, QPN: c.remoteQPN, StartingPSN: c.sqPSN,
		Transport: c.typ, ResponderResources: r.ResponderResources(), InitiatorDepth: r.InitiatorDepth(),
		RNRRetryCount: r.RNRRetryCount(), FlowControl: r.EndToEndFlowControl(), SRQ: r.SRQ(), PathMTU: c.path.MTU,
		SelectiveRepeat: c.sr}
	pd := copyBytes(r.PrivateData())
	if c.manualRTU {
		m.event(c, Event{Type: EventConnectResponse, Remote: remote, PrivateData: pd})
		return
	}
	if m.establishActive(c, nil) == nil {
		m.event(c, Event{Type: EventEstablished, Remote: remote, PrivateData: pd})
	}
}

// onRTU: passive side completes (IBTA 12.9, cm_rtu_handler).
func (m *Manager) onRTU(r RTU) {
	c := m.local[r.RemoteCommID()]
	if c == nil || c.remoteID != r.LocalCommID() {
		m.drop()
		return
	}
	if c.state != StateREPSent && c.state != StateMRAREPRcvd {
		m.duplicate()
		return
	}
	m.cancel(c)
	c.state = StateEstablished
	m.event(c, Event{Type: EventEstablished, PrivateData: copyBytes(r.PrivateData())})
}

// onMRA: the peer needs more time (IBTA 12.6.6, cm_mra_handler). The wait
// for the response becomes ServiceTimeout + PacketLifeTime, for this and
// the remaining attempts.
func (m *Manager) onMRA(r MRA) {
	c := m.local[r.RemoteCommID()]
	if c == nil || c.ud {
		m.drop()
		return
	}
	which := r.MessageMRAed()
	if which != MsgREQ && c.remoteID != r.LocalCommID() {
		m.drop()
		return
	}
	switch {
	case c.state == StateREQSent && which == MsgREQ:
		c.state = StateMRAREQRcvd
	case c.state == StateREPSent && which == MsgREP:
		c.state = StateMRAREPRcvd
	case c.state == StateMRAREQRcvd || c.state == StateMRAREPRcvd:
		m.duplicate()
		return
	default:
		m.drop()
		return
	}
	c.timeout = CMTimeout(r.ServiceTimeout()) + CMTimeout(c.path.PacketLifeTime)
	m.arm(c, c.timeout)
}

// onREJ (IBTA 12.6.7, cm_rej_handler).
func (m *Manager) onREJ(r REJ) {
	var c *Conn
	switch {
	case r.Reason() == RejTimeout && r.ARILength() >= 8:
		c = m.remote[remoteKey{r.LocalCommID(), be.Uint64(r.ARI())}]
	case r.MessageRejected() == MsgREQ:
		c = m.local[r.RemoteCommID()]
	default:
		if c = m.local[r.RemoteCommID()]; c != nil && c.remoteID != r.LocalCommID() {
			c = nil
		}
	}
	if c == nil || c.ud {
		m.drop()
		return
	}
	ev := Event{Type: EventRejected, Reason: r.Reason(), PrivateData: copyBytes(r.PrivateData()), ARI: copyBytes(r.ARI())}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateREQRcvd, StateMRAREQSent:
		m.qpErr(c)
		if r.Reason() == RejStaleConn {
			m.enterTimewait(c)
		} else {
			m.toIdle(c)
		}
	case StateDREQSent, StateREPRcvd, StateMRAREPSent, StateEstablished:
		m.qpErr(c)
		m.enterTimewait(c)
	default:
		m.drop()
		return
	}
	m.event(c, ev)
}

// onDREQ (IBTA 12.6.10, 12.9; cm_dreq_handler). Simultaneous DREQs: a
// side in DREQ_SENT that receives the peer's DREQ answers it with a DREP
// and enters TIMEWAIT; the peer's DREP (or its own timeout) changes nothing.
func (m *Manager) onDREQ(src Addr, tid uint64, r DREQ) {
	c := m.local[r.RemoteCommID()]
	if c == nil || c.ud || c.remoteID != r.LocalCommID() {
		// Unknown connection: answer so the peer can leave DREQ_SENT (cm_issue_drep).
		m.drop()
		mad, d := newMAD(AttrDREP, tid)
		f := DREPFields{LocalCommID: r.RemoteCommID(), RemoteCommID: r.LocalCommID()}
		DREP(d).Encode(&f)
		m.send(src, mad)
		return
	}
	if c.localQPN != r.RemoteQPN() {
		m.drop()
		return
	}
	switch c.state {
	case StateREPSent, StateDREQSent, StateMRAREPRcvd, StateEstablished:
	case StateTimewait:
		m.duplicate()
		if c.lastResp != nil && MAD(c.lastResp).AttrID() == AttrDREP {
			m.send(c.peer, c.lastResp)
		} else {
			c.tid = tid
			m.sendDREP(c, nil)
		}
		return
	case StateDREQRcvd:
		m.duplicate()
		return
	default:
		m.drop()
		return
	}
	// The QP is left as it is: as with the kernel's CM, the consumer moves it
	// to ERR (Disconnect, rdma_disconnect). Packets that were on their way
	// before the DREQ, such as the ACK of this side's last SEND, still
	// complete their work requests instead of racing the DREQ to a flush.
	m.cancel(c)
	c.tid = tid
	c.state = StateDREQRcvd
	m.disconnected(c, copyBytes(r.PrivateData()))
	if !m.o.ManualDREP {
		m.sendDREP(c, nil)
		m.enterTimewait(c)
	}
}

// onDREP (IBTA 12.6.11; cm_drep_handler).
func (m *Manager) onDREP(r DREP) {
	c := m.local[r.RemoteCommID()]
	if c == nil || c.ud || c.remoteID != r.LocalCommID() {
		m.drop()
		return
	}
	if c.state != StateDREQSent && c.state != StateDREQRcvd {
		m.duplicate()
		return
	}
	m.enterTimewait(c)
	m.disconnected(c, copyBytes(r.PrivateData()))
}

// onSIDRReq: passive SIDR (IBTA 12.11; cm_sidr_req_handler).
func (m *Manager) onSIDRReq(src Addr, tid uint64, r SIDRReq) {
	k := sidrKey{r.RequestID(), src.GID}
	if m.sidr[k] != nil {
		m.duplicate()
		return
	}
	c := &Conn{m: m, state: StateSIDRREQRcvd, ud: true, remoteID: r.RequestID(), tid: tid,
		service: r.ServiceID(), peer: src}
	l := m.listen[r.ServiceID()]
	if l == nil {
		m.sendSIDRRep(c, &SIDRReplyOptions{Status: SIDRUnsupported})
		return
	}
	id, err := m.newLocalID()
	if err != nil {
		m.sendSIDRRep(c, &SIDRReplyOptions{Status: SIDRNoQP})
		return
	}
	c.localID = id
	m.local[id] = c
	m.sidr[k] = c
	m.pend(c, m.maxREQWait()) // a SIDR_REQ states no timeout (IBTA 12.11.2): the cap (pending.go)
	m.event(c, Event{Type: EventConnectRequest, Listener: l, Src: src,
		Remote:      ConnParam{ServiceID: r.ServiceID()},
		PrivateData: copyBytes(r.PrivateData())})
}

// onSIDRRep: active SIDR completes (cm_sidr_rep_handler).
func (m *Manager) onSIDRRep(r SIDRRep) {
	c := m.local[r.RequestID()]
	if c == nil || !c.ud || c.state != StateSIDRREQSent {
		m.drop()
		return
	}
	m.toIdle(c)
	pd := copyBytes(r.PrivateData())
	if r.Status() != SIDRSuccess {
		m.event(c, Event{Type: EventUnreachable, SIDRStatus: r.Status(), PrivateData: pd})
		return
	}
	m.event(c, Event{Type: EventEstablished, UD: UDParam{QPN: r.QPN(), QKey: r.QKey()}, PrivateData: pd})
}
