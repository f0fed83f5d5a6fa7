package client

import (
	"crypto/rand"
	"fmt"
	"sync/atomic"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// MW is a memory window the daemon holds for this client (ibv_mw; IBTA 10.6.7.2). A type 1
// window is bound with Bind; a type 2 window with a WRBindMW work request (roce.BindInfo:
// MWRKey the window's current R_Key, NewRKey the one the bind gives it, same index, another
// key byte) and invalidated by a WRLocalInv or a peer's WRSendWithInv.
type MW struct {
	c    *Conn
	h    proto.Handle
	typ  roce.MWType
	rkey atomic.Uint32
}

// AllocMW is ibv_alloc_mw: a window of type roce.MWType1 or roce.MWType2 in p, not bound
// (its R_Key refuses every access until a bind).
func (c *Conn) AllocMW(p roce.ProtectionDomain, typ roce.MWType) (*MW, error) {
	h, err := c.handleOf(p)
	if err != nil {
		return nil, err
	}
	var r wire.AllocMWResp
	if _, err := c.call(wire.OpAllocMW, wire.Bytes(&wire.AllocMWReq{PD: uint32(h), Type: uint32(typ)}), wire.Bytes(&r)); err != nil {
		return nil, err
	}
	w := &MW{c: c, h: proto.Handle(r.Handle), typ: typ}
	w.rkey.Store(r.RKey)
	return w, nil
}

// RKey is the window's R_Key: the one it was allocated with, the one the last Bind posted, or
// the one SetRKey set. (A type 2 window's binds are work requests of the program's own: it
// knows their keys.)
func (w *MW) RKey() uint32 { return w.rkey.Load() }

// SetRKey sets the R_Key the next Bind names the window by, as a C program assigns ibv_mw.rkey:
// after a bind that completed in error (MW_BIND_ERR, or WR_FLUSH_ERR), the window still has the
// R_Key it had before that Bind, and the program puts it back; otherwise every later Bind would
// name the window by a key it never took, and fail.
func (w *MW) SetRKey(rkey uint32) { w.rkey.Store(rkey) }

// Type is the window's type.
func (w *MW) Type() roce.MWType { return w.typ }

// Dealloc is ibv_dealloc_mw: the R_Key is invalid at once, bound or not.
func (w *MW) Dealloc() error { return w.c.handleOp(wire.OpDeallocMW, w.h) }

// Bind is ibv_bind_mw for a type 1 window: it posts a BIND_MW work request on q (an RC or UC
// QP in the window's PD) binding the window to [addr, addr+length) of m with remote access
// acc, under a new R_Key of a fresh random key byte, and returns that R_Key, the window's
// RKey from now on. The bind runs in send queue order and completes (roce.OpBindMW) as q's
// other work requests; if it completes in error (MW_BIND_ERR) the window keeps its previous
// R_Key, which the program then uses again (SetRKey), as with ibverbs. A nil m (or length 0)
// unbinds. A type 1 window is not zero-based (IBTA o10-36.2.2): roce.AccessZeroBased is
// refused at once, as ibv_bind_mw refuses it.
func (w *MW) Bind(q roce.QueuePair, wrID uint64, flags roce.SendFlags, m roce.MemoryRegion, addr, length uint64, acc roce.Access) (uint32, error) {
	if w.typ != mr.MWType1 {
		return 0, fmt.Errorf("%w: Bind is for type 1 windows (type 2: a WRBindMW work request)", roce.ErrInvalidArg)
	}
	if m != nil && length > 0 && acc&roce.AccessZeroBased != 0 {
		return 0, fmt.Errorf("%w: a type 1 window is not zero-based", roce.ErrInvalidArg)
	}
	cur := w.rkey.Load()
	var b [1]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	if b[0] == mr.KeyByte(cur) {
		b[0]++
	}
	next := mr.MakeKey(mr.KeyIndex(cur), b[0])
	bi := qp.BindInfo{MWRKey: cur, NewRKey: next, Addr: addr, Length: length, Access: uint32(acc)}
	if m != nil && length > 0 {
		bi.MRLKey = m.LKey()
	} else {
		bi.Addr, bi.Length = 0, 0
	}
	if _, err := q.PostSend([]qp.SendWR{{WRID: wrID, Opcode: qp.WRBindMW, Flags: flags, Bind: &bi}}); err != nil {
		return 0, err
	}
	w.rkey.Store(next)
	return next, nil
}
