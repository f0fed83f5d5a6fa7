package proto

import (
	"errors"
	"syscall"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
	"github.com/softroce/softroce/pkg/roce"
)

// Protocol errors.
var (
	// ErrNoObject: a handle names no object of this client (or one of another type).
	ErrNoObject = errors.New("softroce daemon: no such object")
	// ErrProtocol: a malformed message.
	ErrProtocol = errors.New("softroce daemon: protocol error")
	// ErrUnsupported: an operation the daemon does not offer (e.g. on-demand paging).
	ErrUnsupported = errors.New("softroce daemon: operation not supported through the daemon")
	// ErrDisconnected: the daemon closed the connection (shutdown or protocol error).
	ErrDisconnected = errors.New("softroce daemon: disconnected")
	// ErrQuota: the request would take the client's user (uid) over one of the daemon's
	// per-user limits, or the daemon over its daemon-wide ceiling; the message names which.
	ErrQuota = errors.New("softroce daemon: limit reached")
	// ErrPermission: the operation is reserved to privileged users (a controlled Q_Key).
	ErrPermission = errors.New("softroce daemon: operation not permitted")
	// ErrVersion: the peer speaks another protocol version.
	ErrVersion = errors.New("softroce daemon: protocol version mismatch")
)

// codes lists each error that keeps its identity across the socket with its
// detail code, in match order: specific errors before the ones they wrap
// (mr.ErrOverflow before mr.ErrBounds).
var codes = []struct {
	err  error
	code wire.Code
}{
	{ErrNoObject, wire.CodeNoObject}, {ErrProtocol, wire.CodeProtocol}, {ErrUnsupported, wire.CodeUnsupported},
	{ErrNotShareable, wire.CodeNotShareable}, {ErrDisconnected, wire.CodeDisconnected},
	{roce.ErrClosed, wire.CodeDevClosed}, {roce.ErrNoLink, wire.CodeNoLink}, {roce.ErrLimit, wire.CodeDevLimit},
	{roce.ErrBadGIDIndex, wire.CodeBadGIDIndex}, {roce.ErrInvalidArg, wire.CodeDevInvalid},
	{qp.ErrInvalidState, wire.CodeQPState}, {qp.ErrQueueFull, wire.CodeQueueFull},
	{qp.ErrTooManySGE, wire.CodeTooManySGE}, {qp.ErrInlineTooLong, wire.CodeInlineTooLong},
	{qp.ErrMsgTooLong, wire.CodeMsgTooLong}, {qp.ErrBadOpcode, wire.CodeBadOpcode}, {qp.ErrBadWR, wire.CodeBadWR},
	{qp.ErrHasSRQ, wire.CodeHasSRQ}, {qp.ErrDestroyed, wire.CodeQPDestroyed}, {qp.ErrModify, wire.CodeQPModify},
	{qp.ErrSRQFull, wire.CodeSRQFull}, {qp.ErrSRQArg, wire.CodeSRQArg}, {qp.ErrSRQDestroyed, wire.CodeSRQDestroyed},
	{qp.ErrWRTooManySGE, wire.CodeWRTooManySGE}, {qp.ErrWRInlineSize, wire.CodeWRInlineSize},
	{qp.ErrWRLength, wire.CodeWRLength}, {qp.ErrWROpcode, wire.CodeWROpcode},
	{qp.ErrWRAtomicAlign, wire.CodeWRAtomicAlign}, {qp.ErrWRNoAH, wire.CodeWRNoAH}, {qp.ErrWRNoBind, wire.CodeWRNoBind},
	{cq.ErrCapacity, wire.CodeCQCapacity}, {cq.ErrCQError, wire.CodeCQError}, {cq.ErrClosed, wire.CodeCQClosed},
	{mr.ErrBadKey, wire.CodeMRBadKey}, {mr.ErrInvalidKey, wire.CodeMRInvalidKey}, {mr.ErrWrongPD, wire.CodeMRWrongPD},
	{mr.ErrWrongQP, wire.CodeMRWrongQP}, {mr.ErrAccess, wire.CodeMRAccess}, {mr.ErrOverflow, wire.CodeMROverflow},
	{mr.ErrBounds, wire.CodeMRBounds}, {mr.ErrAlign, wire.CodeMRAlign}, {mr.ErrBusy, wire.CodeBusy},
	{mr.ErrLimit, wire.CodeMRLimit}, {mr.ErrInvalidArg, wire.CodeMRInvalid}, {mr.ErrState, wire.CodeMRState},
	{mr.ErrRand, wire.CodeMRRand}, {ErrQuota, wire.CodeQuota},
	{rdmacm.ErrState, wire.CodeCMState}, {rdmacm.ErrInvalidArg, wire.CodeCMInvalid},
	{rdmacm.ErrAddrInUse, wire.CodeAddrInUse}, {rdmacm.ErrNoAddr, wire.CodeNoAddr}, {rdmacm.ErrNoQP, wire.CodeCMNoQP},
	{rdmacm.ErrDestroyed, wire.CodeCMDestroyed}, {roce.ErrNoCM, wire.CodeNoCM}, {cm.ErrTimeout, wire.CodeTimeout},
	{roce.ErrBusy, wire.CodeDevBusy}, {mr.ErrFault, wire.CodeFault}, {ErrVersion, wire.CodeVersion},
	{ErrPermission, wire.CodePermission},
}

// CodeOf returns the detail code of err (0 = none).
func CodeOf(err error) wire.Code {
	if err == nil {
		return 0
	}
	if r, ok := err.(*RemoteError); ok {
		return r.Code
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return 0
}

// ErrnoOf returns the errno value err is reported with: its code's, an errno
// it wraps, or EIO.
func ErrnoOf(err error) syscall.Errno {
	if c := CodeOf(err); c != 0 {
		return c.Errno()
	}
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}

// sentinelOf is the error a code stands for (nil if unknown).
func sentinelOf(c wire.Code) error {
	for _, x := range codes {
		if x.code == c {
			return x.err
		}
	}
	return nil
}

// RemoteError is an error returned by the daemon: errors.Is matches its
// sentinel (qp.ErrInvalidState, ...) and its errno (syscall.EINVAL, ...).
type RemoteError struct {
	Errno    syscall.Errno
	Code     wire.Code
	Sentinel error // nil if the code is 0 or unknown here
	Msg      string
}

func newRemoteError(errno syscall.Errno, code wire.Code, msg string) *RemoteError {
	return &RemoteError{Errno: errno, Code: code, Sentinel: sentinelOf(code), Msg: msg}
}

// ErrorFrom rebuilds an error from an errno and a detail code (a CM event's status).
func ErrorFrom(errno syscall.Errno, code wire.Code, msg string) error {
	return newRemoteError(errno, code, msg)
}

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap returns the sentinel, so errors.Is(err, qp.ErrInvalidState) works across the socket.
func (e *RemoteError) Unwrap() error { return e.Sentinel }

// Is matches the errno: errors.Is(err, syscall.EDQUOT).
func (e *RemoteError) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && t == e.Errno
}
