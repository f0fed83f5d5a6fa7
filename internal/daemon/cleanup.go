package daemon

import (
	"time"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
)

// snapshot returns the session's objects by kind (for flush, cleanup, metrics).
func (ss *session) snapshot() (qps []*qpObj, cqs []*cqObj, srqs []*srqObj, mrs []*mrObj, pds []*pdObj) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, o := range ss.objs {
		switch x := o.(type) {
		case *qpObj:
			qps = append(qps, x)
		case *cqObj:
			cqs = append(cqs, x)
		case *srqObj:
			srqs = append(srqs, x)
		case *mrObj:
			mrs = append(mrs, x)
		case *pdObj:
			pds = append(pds, x)
		}
	}
	return
}

// flush moves every QP of the session to ERR: the engine completes their
// outstanding work requests with WR_FLUSH_ERR (IBTA 10.3.1).
func (ss *session) flush() {
	qps, _, _, _, _ := ss.snapshot()
	for _, o := range qps {
		_ = o.q.Modify(&qp.Attr{State: qp.StateErr}, qp.AttrState)
	}
}

// waitDrained waits until every CQ's pending completions reached its ring
// (or the ring is full, or the deadline passes).
func (ss *session) waitDrained(deadline time.Time) {
	_, cqs, _, _, _ := ss.snapshot()
	for _, c := range cqs {
		for c.c.Len() > 0 && time.Now().Before(deadline) {
			if c.ring.Space(c.tail.Load()) == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// cleanup releases everything the client created, in the reverse order of the creates: QPs to
// ERR and destroyed, SRQs and CQs destroyed (ring unmapped, eventfds closed), memory windows
// deallocated, MRs deregistered and their memory unmapped, PDs deallocated.
func (ss *session) cleanup() {
	if ss.conn != nil {
		ss.conn.Close()
	}
	ss.stopRing(false)
	ss.cleanupCM() // before the QPs: connections are DREQ'd, not just dropped
	qps, cqs, srqs, mrs, pds := ss.snapshot()
	for _, o := range qps {
		_ = o.q.Modify(&qp.Attr{State: qp.StateErr}, qp.AttrState)
		ss.releaseQP(o)
	}
	for _, o := range srqs {
		ss.s.verb.DestroySRQ(o.s)
		ss.s.disown(o.s)
		ss.s.nSRQ.Add(-1)
		ss.release(o.cost)
	}
	for _, o := range cqs {
		ss.releaseCQ(o)
	}
	for _, o := range ss.mwSnapshot() { // before the MRs: a bound window holds its MR
		if err := o.w.Dealloc(); err != nil {
			ss.s.log.Error("MW dealloc failed", "client", ss.id, "err", err)
			continue
		}
		ss.s.nMW.Add(-1)
		ss.release(mwCost)
	}
	for _, o := range mrs {
		if err := ss.releaseMR(o); err != nil {
			// Still in use after the bounded wait: keep the mapping (a leak
			// is safe, unmapping memory the engine touches is not).
			ss.s.log.Error("MR dereg failed; memory kept mapped", "client", ss.id, "err", err)
		}
	}
	for _, o := range pds {
		if err := o.pd.Dealloc(); err != nil {
			ss.s.log.Error("PD dealloc failed", "client", ss.id, "err", err)
			continue
		}
		ss.s.nPD.Add(-1)
		ss.release(one(resPDs))
	}
	ss.releaseMem()
	ss.mu.Lock()
	ss.objs = map[proto.Handle]any{}
	ss.mu.Unlock()
}
