package conform

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// SoftroceOptions configure NewSoftroce.
type SoftroceOptions struct {
	// Addr is the DUT's local address (a loopback address in tests, or the lab netns).
	Addr netip.Addr
	// Port is the UDP port the DUT listens on and sends to (0 = 4791). The bench must use
	// the same port on another address.
	Port uint16
	// MTU is the device's active MTU in bytes (0 = 1024, as rxe on a 1500-byte link).
	MTU int
	// Verbs, if set, is the device the DUT's objects are created on instead of opening one:
	// an embedded device (roce.Device.Verbs) or a client of the softroce daemon
	// (pkg/client.Dial). Addr must then be one of its addresses and Port its UDP port;
	// MTU is ignored (the device's). Close releases the DUT's objects, not the device.
	Verbs roce.Verbs
}

// Softroce is the softroce DUT: a pkg/roce device on a UDP link, opened in process or given
// as a roce.Verbs (SoftroceOptions.Verbs: e.g. the softroce daemon).
type Softroce struct {
	v    roce.Verbs
	dev  *roce.Device // the device NewSoftroce opened (nil with SoftroceOptions.Verbs)
	pd   roce.ProtectionDomain
	addr netip.AddrPort
	gid  uint8 // GID index of addr

	mu   sync.Mutex
	mrs  map[int]roce.MemoryRegion
	bufs map[int][]byte
	next int
	qps  map[uint32]*softQP
}

type softQP struct {
	qp    roce.QueuePair
	cq    roce.CompletionQueue
	bench netip.Addr
	ah    *qp.AH
}

// NewSoftroce opens the softroce DUT.
func NewSoftroce(o SoftroceOptions) (*Softroce, error) {
	if o.Verbs != nil {
		return newSoftroceOn(o.Verbs, nil, o)
	}
	mtu := o.MTU
	if mtu == 0 {
		mtu = 1024
	}
	dev, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{o.Addr}, Port: o.Port, MTU: qp.MTUFromBytes(mtu), Name: "softroce-dut"})
	if err != nil {
		return nil, err
	}
	s, err := newSoftroceOn(dev.Verbs(), dev, o)
	if err != nil {
		dev.Close()
		return nil, err
	}
	return s, nil
}

// newSoftroceOn makes the DUT on v (dev: the device NewSoftroce opened, else nil).
func newSoftroceOn(v roce.Verbs, dev *roce.Device, o SoftroceOptions) (*Softroce, error) {
	port := o.Port
	if port == 0 {
		port = 4791
	}
	gid := v.GIDIndex(o.Addr)
	if gid < 0 {
		return nil, fmt.Errorf("%w: %v is not in the device's GID table %v", ErrDUT, o.Addr, v.GIDs())
	}
	pd, err := v.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("%w: alloc_pd: %w", ErrDUT, err)
	}
	return &Softroce{v: v, dev: dev, pd: pd, addr: netip.AddrPortFrom(o.Addr, port), gid: uint8(gid),
		mrs: map[int]roce.MemoryRegion{}, bufs: map[int][]byte{}, next: 1, qps: map[uint32]*softQP{}}, nil
}

// Name implements DUT.
func (s *Softroce) Name() string { return "softroce" }

// Addr implements DUT.
func (s *Softroce) Addr() netip.AddrPort { return s.addr }

// Device returns the device NewSoftroce opened (counters, for diagnostics); nil when the DUT
// runs on SoftroceOptions.Verbs (see Verbs).
func (s *Softroce) Device() *roce.Device { return s.dev }

// DeviceCaps implements DeviceCapper: the device's capability flags when NewSoftroce opened
// it (unknown on a daemon's device).
func (s *Softroce) DeviceCaps() (uint64, bool) {
	if s.dev == nil {
		return 0, false
	}
	return uint64(s.dev.Attr().DeviceCapFlags), true
}

// Verbs returns the device the DUT's objects live on.
func (s *Softroce) Verbs() roce.Verbs { return s.v }

// RegMR implements DUT: a zeroed region. Region k lives at IOVA 0x1000_0000 * k (never 0, page aligned).
func (s *Softroce) RegMR(c MRConfig) (MRInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Size < 0 || c.Size > 64<<20 {
		return MRInfo{}, fmt.Errorf("%w: MR size %d", ErrDUT, c.Size)
	}
	id := s.next
	buf, err := s.alloc(c.Size)
	if err != nil {
		return MRInfo{}, err
	}
	m, err := s.v.RegMR(s.pd, buf, uint64(id)<<28, c.Access)
	if err != nil {
		s.free(buf)
		return MRInfo{}, fmt.Errorf("%w: reg_mr: %w", ErrDUT, err)
	}
	s.next++
	s.mrs[id], s.bufs[id] = m, buf
	return MRInfo{ID: id, RKey: m.RKey(), LKey: m.LKey(), VA: m.IOVA(), Size: c.Size}, nil
}

func (s *Softroce) region(id, off, n int) ([]byte, error) {
	b, ok := s.bufs[id]
	if !ok {
		return nil, fmt.Errorf("%w: no MR %d", ErrDUT, id)
	}
	if off < 0 || n < 0 || off > len(b) || n > len(b)-off {
		return nil, fmt.Errorf("%w: MR %d [%d,+%d) out of range", ErrDUT, id, off, n)
	}
	return b[off : off+n], nil
}

// WriteMR implements DUT.
func (s *Softroce) WriteMR(id, off int, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.region(id, off, len(data))
	if err != nil {
		return err
	}
	copy(b, data)
	return nil
}

// ReadMR implements DUT.
func (s *Softroce) ReadMR(id, off, n int) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.region(id, off, n)
	if err != nil {
		return nil, err
	}
	return append([]byte{}, b...), nil
}

// DeregMR implements DUT.
func (s *Softroce) DeregMR(id int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.mrs[id]
	if !ok {
		return fmt.Errorf("%w: no MR %d", ErrDUT, id)
	}
	if err := m.Dereg(); err != nil {
		return fmt.Errorf("%w: dereg_mr: %w", ErrDUT, err)
	}
	s.free(s.bufs[id])
	delete(s.mrs, id)
	delete(s.bufs, id)
	return nil
}

// alloc returns a zeroed region of n bytes. On the device NewSoftroce opened it is anonymous
// mmap'd memory, like the memory a NIC DMAs into: the device's receive goroutine writes it
// while the bench (through this DUT) reads it back, ordered by the network exchange (ACK
// first, then ReadMR), which the race detector cannot see; memory outside the Go heap is not
// instrumented. On SoftroceOptions.Verbs it comes from Verbs.AllocBuffer (the daemon maps
// it), which has no empty buffers.
func (s *Softroce) alloc(n int) ([]byte, error) {
	if s.dev == nil {
		if n == 0 {
			return nil, fmt.Errorf("%w: an empty MR needs the DUT's own device (Verbs.AllocBuffer has no empty buffers)", ErrDUT)
		}
		b, err := s.v.AllocBuffer(n)
		if err != nil {
			return nil, fmt.Errorf("%w: alloc %d bytes: %w", ErrDUT, n, err)
		}
		return b, nil
	}
	if n == 0 {
		return []byte{}, nil
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("%w: mmap %d bytes: %w", ErrDUT, n, err)
	}
	return b, nil
}

// free releases a region from alloc (deregistered).
func (s *Softroce) free(b []byte) {
	switch {
	case len(b) == 0:
	case s.dev == nil:
		_ = s.v.FreeBuffer(b)
	default:
		_ = unix.Munmap(b)
	}
}

// CreateQP implements DUT: RESET -> INIT -> RTR -> RTS with c's attributes.
func (s *Softroce) CreateQP(c QPConfig) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var typ qp.Type
	switch c.Type {
	case RC:
		typ = qp.TypeRC
	case UC:
		typ = qp.TypeUC
	case UD:
		typ = qp.TypeUD
	default:
		return 0, fmt.Errorf("%w: QP type %v", ErrDUT, c.Type)
	}
	ccq, err := s.v.CreateCQ(1024)
	if err != nil {
		return 0, fmt.Errorf("%w: create_cq: %w", ErrDUT, err)
	}
	q, err := s.v.CreateQP(roce.VerbsQPInit{Type: typ, PD: s.pd, SendCQ: ccq, RecvCQ: ccq,
		Cap: qp.Cap{MaxSendWR: 64, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		s.v.DestroyCQ(ccq)
		return 0, fmt.Errorf("%w: create_qp: %w", ErrDUT, err)
	}
	fail := func(step string, err error) (uint32, error) {
		q.Destroy()
		s.v.DestroyCQ(ccq)
		return 0, fmt.Errorf("%w: modify_qp %s: %w", ErrDUT, step, err)
	}
	mtu := qp.MTUFromBytes(c.MTU)
	av := qp.AHAttr{DGID: c.BenchAddr, SGIDIndex: s.gid, HopLimit: 64, Port: 1}
	init := qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: c.Access, QKey: c.QKey}
	initMask := qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort
	rtr := qp.Attr{State: qp.StateRTR, AH: av, PathMTU: mtu, DestQPN: c.BenchQPN, RQPSN: uint32(c.BenchPSN),
		MaxDestRDAtomic: c.MaxDestRDAtomic, MinRNRTimer: c.MinRNRTimer}
	rtrMask := qp.AttrState
	rts := qp.Attr{State: qp.StateRTS, SQPSN: uint32(c.DUTPSN), Timeout: c.Timeout, RetryCnt: c.RetryCnt,
		RNRRetry: c.RNRRetry, MaxRDAtomic: c.MaxRDAtomic}
	rtsMask := qp.AttrState | qp.AttrSQPSN
	switch c.Type {
	case RC:
		initMask |= qp.AttrAccessFlags
		rtrMask |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
		rtsMask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
	case UC:
		initMask |= qp.AttrAccessFlags
		rtrMask |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
	case UD:
		initMask |= qp.AttrQKey
	}
	if err := q.Modify(&init, initMask); err != nil {
		return fail("INIT", err)
	}
	if err := q.Modify(&rtr, rtrMask); err != nil {
		return fail("RTR", err)
	}
	if err := q.Modify(&rts, rtsMask); err != nil {
		return fail("RTS", err)
	}
	sq := &softQP{qp: q, cq: ccq, bench: c.BenchAddr}
	if c.Type == UD {
		if sq.ah, err = s.v.CreateAH(s.pd, av); err != nil {
			return fail("AH", err)
		}
	}
	s.qps[q.Num()] = sq
	return q.Num(), nil
}

func (s *Softroce) qp(qpn uint32) (*softQP, error) {
	q, ok := s.qps[qpn]
	if !ok {
		return nil, fmt.Errorf("%w: no QP %#x", ErrDUT, qpn)
	}
	return q, nil
}

func (s *Softroce) sge(id, off, n int) ([]qp.SGE, error) {
	if n == 0 {
		return nil, nil
	}
	m, ok := s.mrs[id]
	if !ok {
		return nil, fmt.Errorf("%w: no MR %d", ErrDUT, id)
	}
	if off < 0 || n < 0 || off > m.Len() || n > m.Len()-off {
		return nil, fmt.Errorf("%w: MR %d [%d,+%d) out of range", ErrDUT, id, off, n)
	}
	return []qp.SGE{{Addr: m.IOVA() + uint64(off), Length: uint32(n), LKey: m.LKey()}}, nil
}

// PostRecv implements DUT.
func (s *Softroce) PostRecv(qpn uint32, r RecvConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.qp(qpn)
	if err != nil {
		return err
	}
	sgl, err := s.sge(r.MR, r.Off, r.Len)
	if err != nil {
		return err
	}
	if r.Count < 0 || r.Count > 4096 {
		return fmt.Errorf("%w: %d receive WRs (0..4096)", ErrDUT, r.Count)
	}
	wrs := make([]qp.RecvWR, r.Count)
	for i := range wrs {
		wrs[i] = qp.RecvWR{WRID: r.WRID + uint64(i), SGL: sgl}
	}
	if _, err := q.qp.PostRecv(wrs); err != nil {
		return fmt.Errorf("%w: post_recv: %w", ErrDUT, err)
	}
	return nil
}

// PostSend implements DUT.
func (s *Softroce) PostSend(qpn uint32, c SendConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.qp(qpn)
	if err != nil {
		return err
	}
	sgl, err := s.sge(c.MR, c.Off, c.Len)
	if err != nil {
		return err
	}
	wr := qp.SendWR{WRID: c.WRID, Opcode: qp.WROpcode(c.Op), SGL: sgl, Flags: qp.SendSignaled, Imm: c.Imm,
		RemoteAddr: c.RemoteVA, RKey: c.RKey, CompareAdd: c.CompareAdd, Swap: c.Swap,
		AH: q.ah, RemoteQPN: c.RemoteQPN, RemoteQKey: c.RemoteQKey}
	if _, err := q.qp.PostSend([]qp.SendWR{wr}); err != nil {
		return fmt.Errorf("%w: post_send: %w", ErrDUT, err)
	}
	return nil
}

// Poll implements DUT.
func (s *Softroce) Poll(qpn uint32, max int, wait time.Duration) ([]Completion, error) {
	s.mu.Lock()
	q, err := s.qp(qpn)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if max < 0 || max > 4096 || wait < 0 {
		return nil, fmt.Errorf("%w: poll of %d completions, wait %v", ErrDUT, max, wait)
	}
	out := []Completion{}
	buf := make([]cq.WC, 16)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		n := q.cq.Poll(buf[:min(len(buf), max-len(out))])
		for _, w := range buf[:n] {
			out = append(out, Completion{WRID: w.WRID, Status: w.Status, Opcode: w.Opcode, ByteLen: w.ByteLen,
				Imm: w.ImmData, Flags: w.Flags, SrcQP: w.SrcQP})
		}
		if len(out) >= max {
			return out, nil
		}
		if n > 0 {
			continue
		}
		if err := q.cq.ReqNotify(false); err != nil {
			return out, fmt.Errorf("%w: req_notify_cq: %w", ErrDUT, err)
		}
		if k := q.cq.Poll(buf[:min(len(buf), max-len(out))]); k > 0 {
			for _, w := range buf[:k] {
				out = append(out, Completion{WRID: w.WRID, Status: w.Status, Opcode: w.Opcode, ByteLen: w.ByteLen,
					Imm: w.ImmData, Flags: w.Flags, SrcQP: w.SrcQP})
			}
			continue
		}
		select {
		case <-q.cq.Channel():
		case <-timer.C:
			return out, nil
		}
	}
}

// State implements DUT.
func (s *Softroce) State(qpn uint32) (QPState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.qp(qpn)
	if err != nil {
		return 0, err
	}
	return QPState(q.qp.State()), nil
}

// DestroyQP implements DUT.
func (s *Softroce) DestroyQP(qpn uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := s.qp(qpn)
	if err != nil {
		return err
	}
	delete(s.qps, qpn)
	if err := q.qp.Destroy(); err != nil {
		return fmt.Errorf("%w: destroy_qp: %w", ErrDUT, err)
	}
	if err := s.v.DestroyCQ(q.cq); err != nil {
		return fmt.Errorf("%w: destroy_cq: %w", ErrDUT, err)
	}
	return nil
}

// Close closes the device NewSoftroce opened and unmaps the regions still registered; on
// SoftroceOptions.Verbs it destroys the DUT's QPs, CQs, MRs and PD and frees their memory,
// leaving the device open.
func (s *Softroce) Close() error {
	if s.dev != nil {
		err := s.dev.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for id, b := range s.bufs {
			s.free(b)
			delete(s.bufs, id)
			delete(s.mrs, id)
		}
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for n, q := range s.qps {
		errs = append(errs, q.qp.Destroy(), s.v.DestroyCQ(q.cq))
		delete(s.qps, n)
	}
	for id, m := range s.mrs {
		err := m.Dereg()
		if err == nil { // a region still registered stays allocated
			s.free(s.bufs[id])
		}
		errs = append(errs, err)
		delete(s.bufs, id)
		delete(s.mrs, id)
	}
	if s.pd != nil {
		errs = append(errs, s.pd.Dealloc())
		s.pd = nil
	}
	return errors.Join(errs...)
}
