package daemon

import (
	"fmt"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
)

// mwObj is a client's memory window (ALLOC_MW). Binds, LOCAL_INV and SEND_WITH_INV are work
// requests: they name the window by its R_Key and run in the engine (internal/qp), where a
// bind is refused unless the binding QP, the window and the MR share one PD: a client's QPs
// reach only its own windows.
type mwObj struct {
	w  *mr.MW
	pd *pdObj
}

// mwCost is what a window is charged: one of the user's mrs (limits.go). A window holds one key
// of the device's key table, as an MR does, and the limit is what keeps a user from taking the
// table (the device's max_mw and max_mr are shared by everyone).
var mwCost = one(resMRs)

// allocMW is ibv_alloc_mw: a type 1 or type 2 window in a PD of the client; any other type is
// EINVAL (code MR_INVALID), as rxe refuses it (not EOPNOTSUPP: the device has windows).
func (ss *session) allocMW(r wire.AllocMWReq) (wire.AllocMWResp, error) {
	pd, err := get[*pdObj](ss, proto.Handle(r.PD))
	if err != nil {
		return wire.AllocMWResp{}, err
	}
	typ := mr.MWType(r.Type)
	if r.Type != uint32(mr.MWType1) && r.Type != uint32(mr.MWType2) {
		return wire.AllocMWResp{}, fmt.Errorf("%w: memory window type %d (the device has types 1 and 2)", mr.ErrInvalidArg, r.Type)
	}
	if err := ss.charge(mwCost); err != nil {
		return wire.AllocMWResp{}, err
	}
	w, err := ss.s.dev.MRTable().AllocMW(pd.pd, typ)
	if err != nil {
		ss.release(mwCost)
		return wire.AllocMWResp{}, err
	}
	pd.refs++
	ss.s.nMW.Add(1)
	h := ss.add(&mwObj{w: w, pd: pd})
	return wire.AllocMWResp{Handle: uint32(h), RKey: w.RKey()}, nil
}

// deallocMW is ibv_dealloc_mw: the window's R_Key becomes invalid at once, bound or not (a
// bound window lets go of its MR, which may then be deregistered).
func (ss *session) deallocMW(h proto.Handle) error {
	o, err := get[*mwObj](ss, h)
	if err != nil {
		return err
	}
	if err := ss.releaseMW(o); err != nil {
		return err
	}
	ss.del(h)
	return nil
}

func (ss *session) releaseMW(o *mwObj) error {
	if err := o.w.Dealloc(); err != nil {
		return err
	}
	o.pd.refs--
	ss.s.nMW.Add(-1)
	ss.release(mwCost)
	return nil
}

// mwSnapshot returns the session's windows (cleanup).
func (ss *session) mwSnapshot() []*mwObj {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var mws []*mwObj
	for _, o := range ss.objs {
		if w, ok := o.(*mwObj); ok {
			mws = append(mws, w)
		}
	}
	return mws
}
