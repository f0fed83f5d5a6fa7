package daemon

import (
	"errors"
	"fmt"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
)

// ibv_access_flags the engine does not take: hints (ignored) and on-demand paging (refused).
const (
	accessOnDemand = 1 << 6
	accessHugeTLB  = 1 << 7
	accessOptional = (1<<30 - 1) &^ (1<<20 - 1) // IBV_ACCESS_OPTIONAL_RANGE
)

// maxMRLength bounds the length of a registration.
const maxMRLength = 1 << 40

type mrObj struct {
	m        *mr.MR
	pd       *pdObj
	mem      mrMemory   // the current registration's memory
	stale    []mrMemory // memory of registrations Rereg replaced whose accesses may still run
	released bool       // deregistered: no access to its memory can follow
}

// mrMemory is the memory of one registration as the daemon holds it: the engine's view of it
// (buf: a mapping of the client's memfd; mem: the client's own memory, mem.go), the daemon's
// mapping to unmap when no access can follow, and what that mapping is charged.
type mrMemory struct {
	buf     []byte
	mem     mr.Memory
	length  uint64
	mapping []byte
	cost    usage
}

// handleMR serves the MR requests (the session's dispatch, after the OK header): the
// response body goes to wbuf.
func (ss *session) handleMR(op wire.Op, body []byte, fds *[]int) error {
	switch op {
	case wire.OpRegMR:
		r, err := req[wire.RegMRReq](body)
		if err != nil {
			return err
		}
		resp, err := ss.regMR(r, fds)
		if err != nil {
			return err
		}
		reply(ss, &resp)
	case wire.OpReregMR:
		r, err := req[wire.ReregMRReq](body)
		if err != nil {
			return err
		}
		resp, err := ss.reregMR(r, fds)
		if err != nil {
			return err
		}
		reply(ss, &resp)
	default: // OpDeregMR
		r, err := req[wire.Handle](body)
		if err != nil {
			return err
		}
		return ss.deregMR(proto.Handle(r.Handle))
	}
	return nil
}

// access is the engine's access for a request's IBV_ACCESS_* flags: IBV_ACCESS_HUGETLB and the
// optional range (IBV_ACCESS_RELAXED_ORDERING, ...) are hints a device without them ignores, as
// the kernel does; on-demand paging is not offered.
func access(a uint32) (mr.Access, error) {
	if a&accessOnDemand != 0 {
		return 0, fmt.Errorf("%w: IBV_ACCESS_ON_DEMAND", proto.ErrUnsupported)
	}
	return mr.Access(a &^ (accessHugeTLB | accessOptional)), nil
}

// acquireMemory takes the memory a registration names: a memfd passed with the request
// (mapped here, zero copy; the memfd stays the request's: the request loop closes every
// descriptor a request came with), its mapping charged first, or memory of the client's
// process (SR_MR_PROCESS, mem.go).
func (ss *session) acquireMemory(source uint32, addr, length, offset uint64, fds *[]int) (mrMemory, error) {
	if length > maxMRLength {
		return mrMemory{}, fmt.Errorf("%w: length %d", mr.ErrInvalidArg, length)
	}
	switch source {
	case wire.MRMemfd:
		if len(*fds) != 1 {
			return mrMemory{}, fmt.Errorf("%w: SR_MR_MEMFD needs exactly one memfd", proto.ErrProtocol)
		}
		span, err := proto.MapSpan(offset, int(length))
		if err != nil {
			return mrMemory{}, err
		}
		cost := usage{resMappings: 1, resMappedBytes: span}
		if err := ss.charge(cost); err != nil {
			return mrMemory{}, err
		}
		mapping, view, err := proto.MapShared((*fds)[0], offset, int(length))
		if err != nil {
			ss.release(cost)
			return mrMemory{}, err
		}
		ss.s.mapped.Add(int64(len(mapping)))
		return mrMemory{buf: view, length: length, mapping: mapping, cost: cost}, nil
	case wire.MRProcess:
		m, err := ss.processMemory(addr, length)
		if err != nil {
			return mrMemory{}, err
		}
		return mrMemory{mem: m, length: length}, nil
	}
	return mrMemory{}, fmt.Errorf("%w: memory source %d", proto.ErrProtocol, source)
}

// dropMemory unmaps a registration's memory once no access can touch it.
func (ss *session) dropMemory(m mrMemory) {
	if m.mapping != nil {
		proto.Unmap(m.mapping)
		ss.s.mapped.Add(-int64(len(m.mapping)))
	}
	ss.release(m.cost)
}

// regMR registers client memory (ibv_reg_mr): a memfd or the client's own memory.
func (ss *session) regMR(r wire.RegMRReq, fds *[]int) (wire.RegMRResp, error) {
	var resp wire.RegMRResp
	pd, err := get[*pdObj](ss, proto.Handle(r.PD))
	if err != nil {
		return resp, err
	}
	if r.Length > maxMRLength {
		return resp, fmt.Errorf("%w: length %d", mr.ErrInvalidArg, r.Length)
	}
	acc, err := access(r.Access)
	if err != nil {
		return resp, err
	}
	if err := ss.charge(one(resMRs)); err != nil {
		return resp, err
	}
	mm, err := ss.acquireMemory(r.Source, r.Addr, r.Length, r.Offset, fds)
	if err != nil {
		ss.release(one(resMRs))
		return resp, err
	}
	var m *mr.MR
	if mm.mem != nil {
		m, err = ss.s.dev.RegMemory(pd.pd, mm.mem, r.Length, r.IOVA, acc)
	} else {
		m, err = ss.s.dev.RegMR(pd.pd, mm.buf, r.IOVA, acc)
	}
	if err != nil {
		ss.dropMemory(mm)
		ss.release(one(resMRs))
		return resp, err
	}
	pd.refs++
	ss.s.nMR.Add(1)
	h := ss.add(&mrObj{m: m, pd: pd, mem: mm})
	return wire.RegMRResp{Handle: uint32(h), LKey: m.LKey(), RKey: m.RKey()}, nil
}

// reregMR is OpReregMR (ibv_rereg_mr): the MR's memory, PD and/or access change in place
// (mr.MR.Rereg: the keys stay, every access sees the old registration or the new one, and the
// change returns once no access of the old one is in flight, so the old memory may be freed).
// Flags beyond IBV_REREG_MR_FLAGS_SUPPORTED, or none, are EINVAL, as the kernel answers them.
// If the wait for the old registration's accesses ends first (EBUSY, code BUSY), the new one
// is in effect and the old memory stays mapped here until the MR is deregistered; memory
// windows bound to the MR are EBUSY too, with nothing changed (mr.MR.Rereg).
func (ss *session) reregMR(r wire.ReregMRReq, fds *[]int) (wire.ReregMRResp, error) {
	var resp wire.ReregMRResp
	o, err := get[*mrObj](ss, proto.Handle(r.Handle))
	if err != nil {
		return resp, err
	}
	o2 := mr.ReregOptions{Flags: mr.ReregFlags(r.Flags)}
	if o2.Flags == 0 || o2.Flags&^mr.ReregAll != 0 {
		return resp, fmt.Errorf("%w: rereg flags %#x", mr.ErrInvalidArg, r.Flags)
	}
	pd := o.pd
	if o2.Flags&mr.ReregPD != 0 {
		if pd, err = get[*pdObj](ss, proto.Handle(r.PD)); err != nil {
			return resp, err
		}
		o2.PD = pd.pd
	}
	if o2.Flags&mr.ReregAccess != 0 {
		if o2.Access, err = access(r.Access); err != nil {
			return resp, err
		}
	}
	var mm mrMemory
	if o2.Flags&mr.ReregTranslation != 0 {
		if mm, err = ss.acquireMemory(r.Source, r.Addr, r.Length, r.Offset, fds); err != nil {
			return resp, err
		}
		o2.Buf, o2.IOVA = mm.buf, r.IOVA
	}
	err = o.m.ReregWith(o2, mm.mem, mm.length, mr.DeregOptions{})
	if err != nil && !errors.Is(err, mr.ErrDraining) {
		if o2.Flags&mr.ReregTranslation != 0 {
			ss.dropMemory(mm)
		}
		return resp, err
	}
	if pd != o.pd {
		o.pd.refs--
		pd.refs++
		o.pd = pd
	}
	if o2.Flags&mr.ReregTranslation != 0 {
		if err == nil {
			ss.dropMemory(o.mem) // no access of the old registration can follow
		} else {
			o.stale = append(o.stale, o.mem)
		}
		o.mem = mm
	}
	return wire.ReregMRResp{LKey: o.m.LKey(), RKey: o.m.RKey()}, err
}

func (ss *session) deregMR(h proto.Handle) error {
	o, err := get[*mrObj](ss, h)
	if err != nil {
		return err
	}
	if err := ss.releaseMR(o); err != nil {
		return err
	}
	ss.del(h)
	return nil
}

// releaseMR deregisters (waiting for in-flight users of every registration of the MR) and only
// then unmaps: after a successful Dereg no data path touches the memory.
func (ss *session) releaseMR(o *mrObj) error {
	if err := o.m.Dereg(); err != nil {
		return err
	}
	o.released = true
	ss.dropMemory(o.mem)
	for _, m := range o.stale {
		ss.dropMemory(m)
	}
	o.stale = nil
	o.pd.refs--
	ss.s.nMR.Add(-1)
	ss.release(one(resMRs))
	return nil
}
