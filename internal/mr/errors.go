package mr

// Error is the type of every error this package returns. The values are package variables,
// so returning one never allocates; compare with errors.Is.
type Error struct {
	msg  string
	base *Error // errors.Is(e, base) also holds (e.g. ErrOverflow is an ErrBounds)
}

func (e *Error) Error() string { return e.msg }

// Is reports whether e is target or refines it.
func (e *Error) Is(target error) bool {
	return target == error(e) || (e.base != nil && target == error(e.base))
}

var (
	errBounds = &Error{msg: "mr: address range outside the region (IBTA 10.6.3)"}
	errBusy   = &Error{msg: "mr: busy"}
)

// Errors.
var (
	// ErrBadKey: no object has this key (unknown index, or the key byte does not match: a
	// stale or guessed key), or an R_Key of a window was used as an L_Key.
	ErrBadKey error = &Error{msg: "mr: no such key"}
	// ErrInvalidKey: the key names an object whose key state is not Valid (IBTA 10.6.7:
	// deregistering, invalidated/free, or unbound).
	ErrInvalidKey error = &Error{msg: "mr: key not in the valid state"}
	// ErrWrongPD: the object belongs to another protection domain (IBTA 10.6.3.1).
	ErrWrongPD error = &Error{msg: "mr: protection domain mismatch"}
	// ErrWrongQP: a type 2 window is bound to another QP (IBTA 10.6.7.2.3).
	ErrWrongQP error = &Error{msg: "mr: type 2 memory window bound to another QP"}
	// ErrAccess: the access rights do not permit the operation (IBTA 10.6.3.1).
	ErrAccess error = &Error{msg: "mr: access not permitted"}
	// ErrBounds: [va, va+length) is not inside the region or window.
	ErrBounds error = errBounds
	// ErrOverflow: va+length wraps past 2^64 (also matches ErrBounds).
	ErrOverflow error = &Error{msg: "mr: va+length overflows 64 bits", base: errBounds}
	// ErrAlign: an atomic's address is not 8-byte aligned or its length is not 8 (IBTA 9.4.5).
	ErrAlign error = &Error{msg: "mr: atomic not 8-byte aligned or not 8 bytes"}
	// ErrBusy: the object is in use (in-flight accesses, bound windows, objects in a PD).
	ErrBusy error = errBusy
	// ErrDraining: Rereg published the new registration, which is in effect, but accesses
	// checked under the previous one were still in flight when its wait ended: the previous
	// memory may still be touched until they end (Dereg waits for them). Also matches ErrBusy.
	ErrDraining error = &Error{msg: "mr: re-registered, accesses of the previous registration still in flight", base: errBusy}
	// ErrLimit: a device limit (max MR, MW, PD, or the 24-bit index space) is reached.
	ErrLimit error = &Error{msg: "mr: resource limit reached"}
	// ErrInvalidArg: an argument is invalid (ibverbs EINVAL), e.g. REMOTE_WRITE without
	// LOCAL_WRITE.
	ErrInvalidArg error = &Error{msg: "mr: invalid argument"}
	// ErrState: the operation is not allowed in the object's current state or kind (fast-register
	// of a Valid MR, invalidate of a type 1 window or of an ordinary MR, ...).
	ErrState error = &Error{msg: "mr: operation not allowed in this state"}
	// ErrRand: the key random source failed.
	ErrRand error = &Error{msg: "mr: random source failed"}
	// ErrFault: the region's memory could not be read or written (a Memory the device copies
	// through, whose owner unmapped it or exited).
	ErrFault error = &Error{msg: "mr: registered memory not accessible"}
)
