// Package event defines the asynchronous events a softroce device reports, numbered like
// ibv_event_type (libibverbs verbs.h), and the sink callback objects use to raise them.
//
// IBTA 11.6.3 (asynchronous events): affiliated events name a QP, CQ or SRQ; unaffiliated
// events name a port or the whole device.
package event

import "fmt"

// Type is an asynchronous event type in ibv_event_type numbering.
type Type uint8

// Event types (values equal the ibv_event_type enumerators).
const (
	CQErr            Type = 0  // IBV_EVENT_CQ_ERR: CQ overrun (IBTA 11.6.3.1)
	QPFatal          Type = 1  // IBV_EVENT_QP_FATAL: local work queue catastrophic error
	QPReqErr         Type = 2  // IBV_EVENT_QP_REQ_ERR: invalid request local WQ error
	QPAccessErr      Type = 3  // IBV_EVENT_QP_ACCESS_ERR: local access violation WQ error
	CommEst          Type = 4  // IBV_EVENT_COMM_EST: first packet received in RTR
	SQDrained        Type = 5  // IBV_EVENT_SQ_DRAINED: SQD reached with no outstanding WRs
	PathMig          Type = 6  // IBV_EVENT_PATH_MIG: path migrated
	PathMigErr       Type = 7  // IBV_EVENT_PATH_MIG_ERR
	DeviceFatal      Type = 8  // IBV_EVENT_DEVICE_FATAL: CA catastrophic error
	PortActive       Type = 9  // IBV_EVENT_PORT_ACTIVE
	PortErr          Type = 10 // IBV_EVENT_PORT_ERR
	LIDChange        Type = 11 // IBV_EVENT_LID_CHANGE
	PKeyChange       Type = 12 // IBV_EVENT_PKEY_CHANGE
	SMChange         Type = 13 // IBV_EVENT_SM_CHANGE
	SRQErr           Type = 14 // IBV_EVENT_SRQ_ERR
	SRQLimitReached  Type = 15 // IBV_EVENT_SRQ_LIMIT_REACHED (IBTA 10.2.9.4)
	QPLastWQEReached Type = 16 // IBV_EVENT_QP_LAST_WQE_REACHED (SRQ-attached QP left for ERR)
	ClientReregister Type = 17 // IBV_EVENT_CLIENT_REREGISTER
	GIDChange        Type = 18 // IBV_EVENT_GID_CHANGE
	WQFatal          Type = 19 // IBV_EVENT_WQ_FATAL
)

var names = [...]string{
	CQErr:            "CQ error",
	QPFatal:          "local work queue catastrophic error",
	QPReqErr:         "invalid request local work queue error",
	QPAccessErr:      "local access violation work queue error",
	CommEst:          "communication established",
	SQDrained:        "send queue drained",
	PathMig:          "path migrated",
	PathMigErr:       "path migration request error",
	DeviceFatal:      "local catastrophic error",
	PortActive:       "port active",
	PortErr:          "port error",
	LIDChange:        "LID change",
	PKeyChange:       "P_Key change",
	SMChange:         "SM change",
	SRQErr:           "SRQ catastrophic error",
	SRQLimitReached:  "SRQ limit reached",
	QPLastWQEReached: "last WQE reached",
	ClientReregister: "client reregistration",
	GIDChange:        "GID table change",
	WQFatal:          "WQ fatal",
}

// String returns the ibv_event_type_str text ("unknown" for values it does not define).
func (t Type) String() string {
	if int(t) < len(names) {
		return names[t]
	}
	return "unknown"
}

// GoString returns the Go constant-like name, for test output.
func (t Type) GoString() string { return fmt.Sprintf("event.Type(%d)", uint8(t)) }

// Event is one asynchronous event. Fields not meaningful for the Type are zero.
type Event struct {
	Type Type
	// Object is the affiliated object (*cq.CQ, *qp.SRQ, a QP, ...) or nil for
	// unaffiliated events. Storing a pointer in an interface does not allocate.
	Object any
	// QPN is the affiliated QP number for QP events.
	QPN uint32
	// Port is the port number for port events (always 1 on softroce).
	Port uint8
}

// Sink receives asynchronous events. It is called synchronously from the goroutine that
// detected the event (often the transport engine), so it must not block; the device API
// forwards events to the application's async-event queue.
type Sink func(Event)
