package rdmacm

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/pkg/roce"
)

// Option names an ID option of rdma_set_option at level RDMA_OPTION_ID (the
// RDMA_OPTION_ID_* values), for SetOption and the daemon protocol.
type Option uint32

// The ID options.
const (
	OptionTOS        Option = 0 // RDMA_OPTION_ID_TOS (uint8_t)
	OptionReuseAddr  Option = 1 // RDMA_OPTION_ID_REUSEADDR (int)
	OptionAFOnly     Option = 2 // RDMA_OPTION_ID_AFONLY (int)
	OptionAckTimeout Option = 3 // RDMA_OPTION_ID_ACK_TIMEOUT (uint8_t)
	// OptionSelectiveRepeat is softroce's own (no rdma_cm has it; far above the
	// RDMA_OPTION_ID_* values): value non-zero asks for selective repeat (SetOption).
	OptionSelectiveRepeat Option = 0x10000
)

// ErrUnsupported: an option softroce's rdma_cm does not honour.
var ErrUnsupported = errors.New("rdmacm: option not supported")

// idOptions are what SetOption recorded (guarded by ID.mu).
type idOptions struct {
	tos, ackTimeout       uint8
	tosSet, ackTimeoutSet bool
	afOnly                bool
	selectiveRepeat       bool
	// startPSN (passive side): the receive PSN the REP will announce, chosen when InitQPAttr
	// gives RTR attributes before Accept (0: the CM chooses at Accept)
	startPSN uint32
}

// SetOption sets an ID option as Linux rdma_cm does (rdma_set_option, level RDMA_OPTION_ID;
// ucma_set_option_id):
//
//   - OptionTOS: the connection's type of service, the route's traffic class: the GRH
//     traffic class (IBTA A17.4.5.2: the IP header's DS and ECN fields) of the QP's address
//     vector, taken by ResolveRoute (set it before).
//   - OptionAckTimeout: the local ACK timeout exponent (4.096 µs × 2^value, IBTA 9.7.6.1.3)
//     the QP gets at RTS, whether the CM moves it (CreateQP, CreateQPVerbs) or the program
//     does (InitQPAttr). RC IDs only (ErrInvalidArg in the UDP port space, as
//     rdma_set_ack_timeout).
//   - OptionAFOnly: value non-zero makes a listener bound to an unspecified address take only
//     requests of that address's family (IPV6_V6ONLY); before the ID is bound (ErrState
//     after, as rdma_set_afonly).
//   - OptionSelectiveRepeat (softroce's own): value non-zero asks for selective repeat on the
//     RC connection (qp.Attr.SelectiveRepeat, docs/reliability.md), negotiated in reserved
//     bits of the CM's REQ and REP (docs/cm.md): the QP gets it at RTR, whether the CM moves
//     it or the program does (InitQPAttr), exactly when the peer is a softroce ID that asked
//     too; with any other peer (kernel rxe, an RNIC, a softroce ID that did not ask) nothing
//     changes. On the active ID before Connect; on a listening ID, for every request it takes;
//     on a request's ID before Accept (and before InitQPAttr gives its RTR attributes).
//     ErrInvalidArg in the UDP port space, ErrState once connecting; through the daemon
//     ErrUnsupported with roce.ErrSelectiveRepeat and EOPNOTSUPP (the daemon's QPs do not
//     offer it).
//   - OptionReuseAddr: ErrUnsupported (the device's port table gives a port to one ID; after
//     binding ErrState, as rdma_set_reuseaddr).
//
// Any other option is ErrUnsupported.
func (id *ID) SetOption(o Option, value uint32) error {
	if id.rem != nil {
		if o == OptionSelectiveRepeat {
			return fmt.Errorf("%w: %w (through the daemon): %w", ErrUnsupported, roce.ErrSelectiveRepeat, syscall.EOPNOTSUPP)
		}
		return id.rem.r.CMSetOption(id.rh, o, value)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.state == stDestroyed {
		return ErrDestroyed
	}
	switch o {
	case OptionTOS:
		id.opt.tos, id.opt.tosSet = uint8(value), true
	case OptionAckTimeout:
		if id.ps != cm.PSTCP {
			return fmt.Errorf("%w: an ACK timeout in port space %#x", ErrInvalidArg, uint16(id.ps))
		}
		id.opt.ackTimeout, id.opt.ackTimeoutSet = uint8(value), true
	case OptionSelectiveRepeat:
		if id.ps != cm.PSTCP {
			return fmt.Errorf("%w: selective repeat in port space %#x", ErrInvalidArg, uint16(id.ps))
		}
		switch id.state {
		case stIdle, stBound, stAddrResolved, stRouteResolved, stListen, stConnectReq:
		default:
			return ErrState
		}
		id.opt.selectiveRepeat = value != 0
	case OptionAFOnly, OptionReuseAddr:
		if id.state != stIdle || id.ownsPort {
			return ErrState
		}
		if o == OptionReuseAddr {
			return fmt.Errorf("%w: REUSEADDR (a port belongs to one ID)", ErrUnsupported)
		}
		id.opt.afOnly = value != 0
	default:
		return fmt.Errorf("%w: option %d", ErrUnsupported, o)
	}
	return nil
}

// qpOptions are the QP attributes the ID's options set (id.mu held).
func (id *ID) qpOptions() cm.QPControlOptions {
	return cm.QPControlOptions{SGIDIndex: uint8(id.route.SGIDIndex), Timeout: id.opt.ackTimeout,
		TimeoutSet: id.opt.ackTimeoutSet}
}

// SelectiveRepeat reports whether the ID's connection uses selective repeat (OptionSelectiveRepeat
// on both sides): known on the active side at ESTABLISHED or CONNECT_RESPONSE, on the passive
// side once Accept ran.
func (id *ID) SelectiveRepeat() bool {
	id.mu.Lock()
	c := id.conn
	id.mu.Unlock()
	return c != nil && id.rem == nil && c.SelectiveRepeat()
}

// Establish completes a connection made for a QP the ID does not own (ConnParam.QPNum, no
// CreateQP), as rdma_establish: the active side gets CONNECT_RESPONSE (not ESTABLISHED) when
// the REP arrives, moves its QP to RTR and RTS itself (InitQPAttr), then calls Establish,
// which sends the RTU (IBTA 12.6.9); the passive side reports ESTABLISHED when the RTU (or
// the first packet) arrives. No event follows on the active side. ErrState for an ID that
// owns its QP (librdmacm: EINVAL) or before CONNECT_RESPONSE.
func (id *ID) Establish() error {
	if id.rem != nil {
		return id.rem.r.CMEstablish(id.rh)
	}
	id.mu.Lock()
	c, st, own := id.conn, id.state, id.qp != nil
	id.mu.Unlock()
	if own || c == nil || st != stConnect || id.ps != cm.PSTCP {
		return ErrState
	}
	if err := c.Establish(nil); err != nil {
		if errors.Is(err, cm.ErrState) {
			return fmt.Errorf("%w: %v", ErrState, err)
		}
		return err
	}
	id.mu.Lock()
	if id.state == stConnect {
		id.state = stConnected
	}
	id.mu.Unlock()
	return nil
}
