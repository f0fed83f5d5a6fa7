package cm

import "github.com/softroce/softroce/internal/qp"

// QPModifier is the part of *qp.QP that NewQPControl uses.
type QPModifier interface {
	Type() qp.Type
	Modify(a *qp.Attr, mask qp.AttrMask) error
}

// QPControlOptions configure NewQPControl.
type QPControlOptions struct {
	SGIDIndex uint8 // GID table index of the local address (rdma_cm: the route's source GID)
	Port      uint8 // 0 = 1
	// Timeout, with TimeoutSet, replaces the negotiated local ACK timeout at RTS (rdma_cm's
	// RDMA_OPTION_ID_ACK_TIMEOUT, as rdma_init_qp_attr applies it).
	Timeout    uint8
	TimeoutSet bool
}

// NewQPControl adapts an engine QP (already in INIT, as rdma_create_qp leaves
// it) to QPControl: the attribute sets and masks are those of
// ib_cm_init_qp_attr for RC and UC (UC takes no RDMA-atomic, RNR or ACK
// attributes).
func NewQPControl(q QPModifier, o QPControlOptions) QPControl {
	if o.Port == 0 {
		o.Port = 1
	}
	return &qpControl{q: q, o: o}
}

type qpControl struct {
	q QPModifier
	o QPControlOptions
}

// ToRTR implements QPControl.
func (c *qpControl) ToRTR(p *RTRParams) error {
	a, m := RTRAttr(c.q.Type(), p, c.o)
	return c.q.Modify(&a, m)
}

// ToRTS implements QPControl.
func (c *qpControl) ToRTS(p *RTSParams) error {
	a, m := RTSAttr(c.q.Type(), p)
	if c.o.TimeoutSet {
		a.Timeout = c.o.Timeout
	}
	return c.q.Modify(&a, m)
}

// RTRAttr is the INIT -> RTR modification of a QP of type typ for the
// connection's parameters (ib_cm_init_qp_attr; UC takes no RDMA-atomic or RNR
// attributes).
func RTRAttr(typ qp.Type, p *RTRParams, o QPControlOptions) (qp.Attr, qp.AttrMask) {
	if o.Port == 0 {
		o.Port = 1
	}
	a := qp.Attr{State: qp.StateRTR, PathMTU: qp.MTU(p.PathMTU), DestQPN: p.DestQPN, RQPSN: p.RQPSN,
		MaxDestRDAtomic: p.MaxDestRDAtomic, MinRNRTimer: p.MinRNRTimer,
		AH: qp.AHAttr{DGID: p.Path.DGID, SGIDIndex: o.SGIDIndex, HopLimit: p.Path.HopLimit,
			TrafficClass: p.Path.TrafficClass, FlowLabel: p.Path.FlowLabel, SL: p.Path.SL, Port: o.Port}}
	m := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
	if typ == qp.TypeRC {
		m |= qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
		if p.SelectiveRepeat {
			// softroce's own attribute, negotiated in reserved CM bits (ext.go)
			a.SelectiveRepeat = true
			m |= qp.AttrSelectiveRepeat
		}
	}
	return a, m
}

// RTSAttr is the RTR -> RTS modification (UC takes no ACK, retry or RDMA-atomic attributes).
func RTSAttr(typ qp.Type, p *RTSParams) (qp.Attr, qp.AttrMask) {
	a := qp.Attr{State: qp.StateRTS, SQPSN: p.SQPSN, Timeout: p.Timeout, RetryCnt: p.RetryCnt,
		RNRRetry: p.RNRRetry, MaxRDAtomic: p.MaxRDAtomic}
	m := qp.AttrState | qp.AttrSQPSN
	if typ == qp.TypeRC {
		m |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
	}
	return a, m
}

// ToErr implements QPControl.
func (c *qpControl) ToErr() {
	a := qp.Attr{State: qp.StateErr}
	_ = c.q.Modify(&a, qp.AttrState)
}
