package client

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/roce"
)

// mrc is a client MR. ReregMR may change its iova and length (never its keys, but they are
// what the daemon answers), so they are atomic.
type mrc struct {
	c          *Conn
	h          proto.Handle
	lkey, rkey atomic.Uint32
	iova       atomic.Uint64
	n          atomic.Int64
}

func (m *mrc) LKey() uint32 { return m.lkey.Load() }
func (m *mrc) RKey() uint32 { return m.rkey.Load() }
func (m *mrc) IOVA() uint64 { return m.iova.Load() }
func (m *mrc) Len() int     { return int(m.n.Load()) }

// Dereg is ibv_dereg_mr.
func (m *mrc) Dereg() error { return m.c.handleOp(wire.OpDeregMR, m.h) }

// RegMR is ibv_reg_mr. Memory from AllocBuffer (or a sub-slice of it) is
// shared with the daemon, which maps it: RDMA lands in it with no copy.
// Any other memory of the program (a slice from make, memory from a C
// allocator) is registered where it is: the daemon reaches it by copying
// through this process's /proc/self/mem (docs/daemon-protocol.md, "Registered
// memory"), one copy per packet. The program keeps such memory alive (and
// referenced, for Go memory) until the MR is deregistered.
func (c *Conn) RegMR(p roce.ProtectionDomain, buf []byte, iova uint64, acc mr.Access) (roce.MemoryRegion, error) {
	h, err := c.handleOf(p)
	if err != nil {
		return nil, err
	}
	req := wire.RegMRReq{PD: uint32(h), Access: uint32(acc), Length: uint64(len(buf)), IOVA: iova}
	var fds []int
	if req.Source, req.Addr, req.Offset, fds, err = c.memory(buf); err != nil {
		return nil, err
	}
	var r wire.RegMRResp
	got, err := c.call(wire.OpRegMR, wire.Bytes(&req), wire.Bytes(&r), fds...)
	proto.CloseFDs(got)
	if err != nil {
		return nil, err
	}
	m := &mrc{c: c, h: proto.Handle(r.Handle)}
	m.lkey.Store(r.LKey)
	m.rkey.Store(r.RKey)
	m.iova.Store(iova)
	m.n.Store(int64(len(buf)))
	return m, nil
}

// memory says how the daemon reaches buf: through the memfd of an AllocBuffer buffer (source
// SR_MR_MEMFD, the offset in it, its fd to pass with the request), or as this process's own
// memory at its address (SR_MR_PROCESS).
func (c *Conn) memory(buf []byte) (source uint32, addr, off uint64, fds []int, err error) {
	if len(buf) > 0 {
		addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	if bf, off, ok := c.find(buf); ok {
		if l := c.limit.MappedBytes; l > 0 && int64(len(buf)) > l {
			return 0, 0, 0, nil, fmt.Errorf("%w: mapped_bytes: %d bytes asked, limit %d per user", proto.ErrQuota, len(buf), l)
		}
		// The daemon maps only populated memory (the pages are this process's, as ibv_reg_mr
		// pins them in the registering process): fault the range's pages in first.
		first := off &^ uint64(proto.PageSize-1)
		last := min(uint64(proto.RoundPage(int(off)+len(buf))), uint64(len(bf.mem)))
		if err := proto.Populate(bf.mem[first:last]); err != nil {
			return 0, 0, 0, nil, err
		}
		return wire.MRMemfd, addr, off, []int{bf.fd}, nil
	}
	if err := c.attachMem(); err != nil {
		return 0, 0, 0, nil, err
	}
	return wire.MRProcess, addr, 0, nil, nil
}

// Rereg is one re-registration (ReregMR, ibv_rereg_mr's arguments): Flags selects the fields
// that apply.
type Rereg struct {
	Flags roce.ReregFlags
	// PD is the new protection domain (roce.ReregPD), one of this connection's.
	PD roce.ProtectionDomain
	// Access is the new access (roce.ReregAccess).
	Access roce.Access
	// Buf is the new memory (roce.ReregTranslation), as RegMR takes it, addressed at IOVA.
	Buf  []byte
	IOVA uint64
}

// ReregMR is ibv_rereg_mr: what o.Flags selects — the memory (o.Buf, as RegMR takes it, at
// o.IOVA), the protection domain, the access flags — changes in place; the keys stay the
// same. Every access the daemon makes sees the old registration or the new one, and ReregMR
// returns once none of the old one is in flight: the old memory may then be reused.
// mr.ErrBusy is memory windows bound to the MR (nothing changed), or the wait for the old
// registration's accesses ended first (the new one is in effect, the old memory may still be
// touched until the MR is deregistered): as after ibv_rereg_mr's IBV_REREG_MR_ERR_CMD, the MR
// is then only deregistered.
func (c *Conn) ReregMR(x roce.MemoryRegion, o Rereg) error {
	m, ok := x.(*mrc)
	if !ok || m == nil || m.c != c {
		return roce.ErrInvalidArg
	}
	req := wire.ReregMRReq{Handle: uint32(m.h), Flags: uint32(o.Flags), Access: uint32(o.Access)}
	if o.Flags&mr.ReregPD != 0 {
		h, err := c.handleOf(o.PD)
		if err != nil {
			return err
		}
		req.PD = uint32(h)
	}
	var fds []int
	if o.Flags&mr.ReregTranslation != 0 {
		var err error
		if req.Source, req.Addr, req.Offset, fds, err = c.memory(o.Buf); err != nil {
			return err
		}
		req.Length, req.IOVA = uint64(len(o.Buf)), o.IOVA
	}
	var r wire.ReregMRResp
	got, err := c.call(wire.OpReregMR, wire.Bytes(&req), wire.Bytes(&r), fds...)
	proto.CloseFDs(got)
	if err != nil {
		return err
	}
	m.lkey.Store(r.LKey)
	m.rkey.Store(r.RKey)
	if o.Flags&mr.ReregTranslation != 0 {
		iova := o.IOVA
		if o.Flags&mr.ReregAccess != 0 && o.Access&mr.AccessZeroBased != 0 {
			iova = 0
		}
		m.iova.Store(iova)
		m.n.Store(int64(len(o.Buf)))
	}
	return nil
}

// attachMem passes the daemon this process's /proc/self/mem once (SR_OP_ATTACH_MEM).
func (c *Conn) attachMem() error {
	c.memMu.Lock()
	defer c.memMu.Unlock()
	if c.memAttached {
		return nil
	}
	fd, err := unix.Open("/proc/self/mem", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: /proc/self/mem: %v", proto.ErrNotShareable, err)
	}
	_, err = c.call(wire.OpAttachMem, nil, nil, fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	c.memAttached = true
	return nil
}
