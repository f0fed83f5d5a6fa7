package qp

import (
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/pkg/bth"
)

// Affiliated asynchronous errors (IBTA 11.6.3.1) raised by the engine:
//
//   - a responder that NAKs a request and enters ERR raises the event of
//     the error class: invalid request -> IBV_EVENT_QP_REQ_ERR ("Invalid
//     Request Local Work Queue Error"), remote access error ->
//     IBV_EVENT_QP_ACCESS_ERR ("Local Access Violation Work Queue Error"),
//     remote operational error -> IBV_EVENT_QP_FATAL ("Local Work Queue
//     Catastrophic Error");
//   - a completion that cannot be queued (CQ overrun: the CQ itself raises
//     IBV_EVENT_CQ_ERR, internal/cq) leaves the QP unable to report its work:
//     it raises IBV_EVENT_QP_FATAL and enters ERR (rxe moves its responder
//     to ERR on RESPST_ERR_CQ_OVERFLOW).
//
// Requester errors are reported by their completion status only.

// raise sends an affiliated event about this QP to the device's sink.
func (q *QP) raise(t event.Type) {
	if q.cfg.Events != nil {
		q.cfg.Events(event.Event{Type: t, Object: q, QPN: q.num})
	}
}

// nakEvent is the affiliated event of a responder NAK code.
func nakEvent(code uint8) event.Type {
	switch code {
	case bth.NAKInvalidRequest:
		return event.QPReqErr
	case bth.NAKRemoteAccessErr:
		return event.QPAccessErr
	}
	return event.QPFatal
}

// cqOverrun handles a completion the CQ refused (overrun): QP fatal, ERR.
func (q *QP) cqOverrun() {
	if q.state == StateErr || q.state == StateReset {
		return
	}
	q.raise(event.QPFatal)
	q.enterError()
}
