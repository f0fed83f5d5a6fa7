package conform

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/pkg/cq"
	"github.com/softroce/softroce/pkg/mr"
	"github.com/softroce/softroce/pkg/qp"
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
}

// Softroce is the in-process DUT: a pkg/roce device on a UDP link.
type Softroce struct {
	dev  *roce.Device
	pd   *mr.PD
	addr netip.AddrPort
	gid  uint8 // GID index of addr

	mu   sync.Mutex
	mrs  map[int]*mr.MR
	bufs map[int][]byte
	next int
	qps  map[uint32]*softQP
}

type softQP struct {
	qp    *roce.QP
	cq    *cq.CQ
	bench netip.Addr
	ah    *qp.AH
}

// NewSoftroce opens the softroce DUT.
func NewSoftroce(o SoftroceOptions) (*Softroce, error) {
	mtu := o.MTU
	if mtu == 0 {
		mtu = 1024
	}
	dev, err := roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{o.Addr}, Port: o.Port, MTU: qp.MTUFromBytes(mtu), Name: "softroce-dut"})
	if err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		dev.Close()
		return nil, err
	}
	port := o.Port
	if port == 0 {
		port = 4791
	}
	gid := dev.GIDIndex(o.Addr)
	if gid < 0 {
		dev.Close()
		return nil, fmt.Errorf("%w: %v is not in the device's GID table %v", ErrDUT, o.Addr, dev.GIDs())
	}
	return &Softroce{dev: dev, pd: pd, addr: netip.AddrPortFrom(o.Addr, port), gid: uint8(gid),
		mrs: map[int]*mr.MR{}, bufs: map[int][]byte{}, next: 1, qps: map[uint32]*softQP{}}, nil
}

// Name implements DUT.
func (s *Softroce) Name() string { return "softroce" }

// Addr implements DUT.
func (s *Softroce) Addr() netip.AddrPort { return s.addr }

// Device returns the underlying device (counters, for diagnostics).
func (s *Softroce) Device() *roce.Device { return s.dev }

// RegMR implements DUT: a zeroed region. Region k lives at IOVA 0x1000_0000 * k (never 0, page aligned).
func (s *Softroce) RegMR(c MRConfig) (MRInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Size < 0 || c.Size > 64<<20 {
		return MRInfo{}, fmt.Errorf("%w: MR size %d", ErrDUT, c.Size)
	}
	id := s.next
	// The region is anonymous mmap'd memory, like the memory a NIC DMAs into: the device's
	// receive goroutine writes it while the bench (through this DUT) reads it back, ordered
	// by the network exchange (ACK first, then ReadMR), which the race detector cannot
	// see; memory outside the Go heap is not instrumented.
	buf := []byte{}
	if c.Size > 0 {
		var err error
		if buf, err = unix.Mmap(-1, 0, c.Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			return MRInfo{}, fmt.Errorf("%w: mmap %d bytes: %w", ErrDUT, c.Size, err)
		}
	}
	m, err := s.dev.RegMR(s.pd, buf, uint64(id)<<28, c.Access)
	if err != nil {
		unmap(buf)
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
	unmap(s.bufs[id])
	delete(s.mrs, id)
	delete(s.bufs, id)
	return nil
}

func unmap(b []byte) {
	if len(b) > 0 {
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
	ccq, err := s.dev.CreateCQ(1024)
	if err != nil {
		return 0, fmt.Errorf("%w: create_cq: %w", ErrDUT, err)
	}
	q, err := s.dev.CreateQP(roce.QPInit{Type: typ, PD: s.pd, SendCQ: ccq, RecvCQ: ccq,
		Cap: qp.Cap{MaxSendWR: 64, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		s.dev.DestroyCQ(ccq)
		return 0, fmt.Errorf("%w: create_qp: %w", ErrDUT, err)
	}
	fail := func(step string, err error) (uint32, error) {
		q.Destroy()
		s.dev.DestroyCQ(ccq)
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
		if sq.ah, err = s.dev.CreateAH(s.pd, av); err != nil {
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
	s.dev.DestroyCQ(q.cq)
	return nil
}

// Close closes the device and unmaps the regions still registered.
func (s *Softroce) Close() error {
	err := s.dev.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, b := range s.bufs {
		unmap(b)
		delete(s.bufs, id)
		delete(s.mrs, id)
	}
	return err
}
