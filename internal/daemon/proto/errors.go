package proto

import (
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

func init() {
	// Order matters (the code is the index): append only. Specific errors
	// come before the ones they wrap (mr.ErrOverflow before mr.ErrBounds).
	Sentinels = []error{
		ErrNoObject, ErrProtocol, ErrUnsupported, ErrNotShareable, ErrDisconnected,
		roce.ErrClosed, roce.ErrNoLink, roce.ErrLimit, roce.ErrBadGIDIndex, roce.ErrInvalidArg,
		qp.ErrInvalidState, qp.ErrQueueFull, qp.ErrTooManySGE, qp.ErrInlineTooLong, qp.ErrMsgTooLong,
		qp.ErrBadOpcode, qp.ErrBadWR, qp.ErrHasSRQ, qp.ErrDestroyed, qp.ErrModify,
		qp.ErrSRQFull, qp.ErrSRQArg, qp.ErrSRQDestroyed,
		qp.ErrWRTooManySGE, qp.ErrWRInlineSize, qp.ErrWRLength, qp.ErrWROpcode, qp.ErrWRAtomicAlign,
		qp.ErrWRNoAH, qp.ErrWRNoBind,
		cq.ErrCapacity, cq.ErrCQError, cq.ErrClosed,
		mr.ErrBadKey, mr.ErrInvalidKey, mr.ErrWrongPD, mr.ErrWrongQP, mr.ErrAccess, mr.ErrOverflow,
		mr.ErrBounds, mr.ErrAlign, mr.ErrBusy, mr.ErrLimit, mr.ErrInvalidArg, mr.ErrState, mr.ErrRand,
		ErrQuota,
		rdmacm.ErrState, rdmacm.ErrInvalidArg, rdmacm.ErrAddrInUse, rdmacm.ErrNoAddr, rdmacm.ErrNoQP,
		rdmacm.ErrDestroyed, roce.ErrNoCM,
		ErrPermission,
	}
}
