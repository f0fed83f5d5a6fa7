package wire

import "syscall"

// Code is a detail code (sr_errcode): which softroce error a failure was. The
// errno next to it (Hdr.Status, CMEvent.Status) is what a C library reports.
type Code uint32

// Detail codes. Append only: a code keeps its number.
const (
	CodeNoObject      Code = 1
	CodeProtocol      Code = 2
	CodeUnsupported   Code = 3
	CodeNotShareable  Code = 4
	CodeDisconnected  Code = 5
	CodeDevClosed     Code = 6
	CodeNoLink        Code = 7
	CodeDevLimit      Code = 8
	CodeBadGIDIndex   Code = 9
	CodeDevInvalid    Code = 10
	CodeQPState       Code = 11
	CodeQueueFull     Code = 12
	CodeTooManySGE    Code = 13
	CodeInlineTooLong Code = 14
	CodeMsgTooLong    Code = 15
	CodeBadOpcode     Code = 16
	CodeBadWR         Code = 17
	CodeHasSRQ        Code = 18
	CodeQPDestroyed   Code = 19
	CodeQPModify      Code = 20
	CodeSRQFull       Code = 21
	CodeSRQArg        Code = 22
	CodeSRQDestroyed  Code = 23
	CodeWRTooManySGE  Code = 24
	CodeWRInlineSize  Code = 25
	CodeWRLength      Code = 26
	CodeWROpcode      Code = 27
	CodeWRAtomicAlign Code = 28
	CodeWRNoAH        Code = 29
	CodeWRNoBind      Code = 30
	CodeCQCapacity    Code = 31
	CodeCQError       Code = 32
	CodeCQClosed      Code = 33
	CodeMRBadKey      Code = 34
	CodeMRInvalidKey  Code = 35
	CodeMRWrongPD     Code = 36
	CodeMRWrongQP     Code = 37
	CodeMRAccess      Code = 38
	CodeMROverflow    Code = 39
	CodeMRBounds      Code = 40
	CodeMRAlign       Code = 41
	CodeBusy          Code = 42
	CodeMRLimit       Code = 43
	CodeMRInvalid     Code = 44
	CodeMRState       Code = 45
	CodeMRRand        Code = 46
	CodeQuota         Code = 47
	CodeCMState       Code = 48
	CodeCMInvalid     Code = 49
	CodeAddrInUse     Code = 50
	CodeNoAddr        Code = 51
	CodeCMNoQP        Code = 52
	CodeCMDestroyed   Code = 53
	CodeNoCM          Code = 54
	CodeTimeout       Code = 55
	CodeDevBusy       Code = 56
	CodeFault         Code = 57
	CodeVersion       Code = 58
	CodePermission    Code = 59
	codeEnd           Code = 60
)

// NumCodes is one more than the largest code.
const NumCodes = int(codeEnd)

var errnos = [codeEnd]syscall.Errno{
	CodeNoObject: syscall.EINVAL, CodeProtocol: syscall.EPROTO, CodeUnsupported: syscall.EOPNOTSUPP,
	CodeNotShareable: syscall.EFAULT, CodeDisconnected: syscall.ENOTCONN, CodeDevClosed: syscall.ENODEV,
	CodeNoLink: syscall.ENETDOWN, CodeDevLimit: syscall.ENOMEM, CodeBadGIDIndex: syscall.EINVAL,
	CodeDevInvalid: syscall.EINVAL, CodeQPState: syscall.EINVAL, CodeQueueFull: syscall.ENOMEM,
	CodeTooManySGE: syscall.EINVAL, CodeInlineTooLong: syscall.EINVAL, CodeMsgTooLong: syscall.EINVAL,
	CodeBadOpcode: syscall.EINVAL, CodeBadWR: syscall.EINVAL, CodeHasSRQ: syscall.EINVAL,
	CodeQPDestroyed: syscall.EINVAL, CodeQPModify: syscall.EINVAL, CodeSRQFull: syscall.ENOMEM,
	CodeSRQArg: syscall.EINVAL, CodeSRQDestroyed: syscall.EINVAL, CodeWRTooManySGE: syscall.EINVAL,
	CodeWRInlineSize: syscall.EINVAL, CodeWRLength: syscall.EINVAL, CodeWROpcode: syscall.EINVAL,
	CodeWRAtomicAlign: syscall.EINVAL, CodeWRNoAH: syscall.EINVAL, CodeWRNoBind: syscall.EINVAL,
	CodeCQCapacity: syscall.EINVAL, CodeCQError: syscall.EIO, CodeCQClosed: syscall.EINVAL,
	CodeMRBadKey: syscall.EINVAL, CodeMRInvalidKey: syscall.EINVAL, CodeMRWrongPD: syscall.EINVAL,
	CodeMRWrongQP: syscall.EINVAL, CodeMRAccess: syscall.EACCES, CodeMROverflow: syscall.EINVAL,
	CodeMRBounds: syscall.EINVAL, CodeMRAlign: syscall.EINVAL, CodeBusy: syscall.EBUSY,
	CodeMRLimit: syscall.ENOMEM, CodeMRInvalid: syscall.EINVAL, CodeMRState: syscall.EINVAL,
	CodeMRRand: syscall.EIO, CodeQuota: syscall.EDQUOT, CodeCMState: syscall.EINVAL,
	CodeCMInvalid: syscall.EINVAL, CodeAddrInUse: syscall.EADDRINUSE, CodeNoAddr: syscall.EADDRNOTAVAIL,
	CodeCMNoQP: syscall.EINVAL, CodeCMDestroyed: syscall.EINVAL, CodeNoCM: syscall.EOPNOTSUPP,
	CodeTimeout: syscall.ETIMEDOUT, CodeDevBusy: syscall.EBUSY, CodeFault: syscall.EFAULT,
	CodeVersion: syscall.EPROTONOSUPPORT, CodePermission: syscall.EPERM,
}

// Errno is the errno value a code is reported with (EIO for an unknown code).
func (c Code) Errno() syscall.Errno {
	if c > 0 && c < codeEnd {
		return errnos[c]
	}
	return syscall.EIO
}
