package afxdp

// The XDP write responder (Options.WriteMemory; docs/link.md "XDP write responder").
//
// Kernel rxe executes a peer's RDMA WRITE and sends its ACK inside the peer's own transmit
// (the softirq of the sending CPU); a user-space responder can only do it once its process
// has read the packet, and then its ACK is one more frame through its kernel. On the AF_XDP
// path the link's XDP program can do what rxe does: for an RC RDMA WRITE Only (opcode 0x0A,
// 1..64 bytes (xdp.c WRITE_MAX), no immediate) to a QP and R_Key the device registered here, it checks
// the request (BTH, source address, P_Key, PSN, R_Key, protection domain, bounds, ICRC),
// copies the payload into *device memory* (a BPF array map mapped into the process: the only
// memory an XDP program can write, so the MR must lie in it, as with ibv_alloc_dm), advances
// the QP's expected PSN and MSN, and turns the frame into the ACK (XDP_TX) — in the sender's
// softirq, as rxe. Anything it does not take (another opcode, a PSN that is not the expected
// one, a check that fails, a paused QP) goes to the AF_XDP socket as before, and the device's
// user-space responder handles it with the same state.
//
// The state it shares with user space is one 64-bit word per QP in the first page of the
// memory map (bits 0-23 the expected PSN, 24-47 the MSN, bit 48 paused, bit 49 busy) and a
// count of the WRITEs it executed: the program claims a packet with a compare-and-swap of
// the word (unpaused, not busy, the packet's PSN) to busy, copies, then publishes PSN+1 and
// MSN+1; user space pauses the word (compare-and-swap, waiting out busy) before its responder
// runs and publishes its state after (WriteState). So every request is executed once, in PSN
// order, by one of the two.

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

const (
	// xdpWriteSlots is how many QPs the program serves (16-byte slots in the state page).
	xdpWriteSlots = xdpChunk / 16
	xdpPage       = 4096

	// a QP's word, shared with the program (xdp.c): the expected PSN, the MSN, two flags
	wordPSN    = 0xFFFFFF
	wordPaused = uint64(1) << 48
	wordBusy   = uint64(1) << 49

	// offsets in a frame: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16, payload
	fBTH     = ethIPv4UDP
	fRETH    = fBTH + 12
	fPayload = fRETH + 16
	ackFrame = fBTH + 12 + 4 + 4 // BTH, AETH, ICRC

)

// xdpWrite is the link's write responder: the program's tables and the device memory.
type xdpWrite struct {
	qps, mrs, crc, mem *ebpf.Map // the program's tables and the device memory (xdp.c)
	region             []byte
	state              []byte     // the first page of region: the QP slots
	memory             []byte     // the rest: device memory
	mu                 sync.Mutex // the tables' updates, the slots, closed
	live               [xdpWriteSlots]*WriteState
	// stale: a removed QP's slot, reused only after an RCU grace period (a program that
	// looked the QP up before its removal may still be running: rcuGrace)
	stale  [xdpWriteSlots]bool
	closed bool
	gone   uint64 // WRITEs executed for QPs removed since (under mu)
}

// executed counts the WRITEs the program executed, for every QP it had.
func (w *xdpWrite) executed() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.gone
	for _, s := range w.live {
		if s != nil {
			n += s.Executed()
		}
	}
	return n
}

// rcuGrace waits until every XDP program run that began before it has ended: programs run
// under the RCU read lock, and membarrier(MEMBARRIER_CMD_GLOBAL) is synchronize_rcu() in the
// kernel (kernel/sched/membarrier.c). Where it is refused (nohz_full), a pause far longer than
// any program run.
func rcuGrace() {
	const membarrierCmdGlobal = 1
	if _, _, e := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdGlobal, 0, 0); e != 0 {
		time.Sleep(50 * time.Millisecond)
	}
}

// newXDPWrite creates the tables and size bytes of device memory (rounded up to pages).
func newXDPWrite(size int) (_ *xdpWrite, err error) {
	if size <= 0 || size > 1<<30 {
		return nil, fmt.Errorf("XDP write responder: device memory of %d bytes: want 1 B to 1 GiB", size)
	}
	pages := (size + xdpPage - 1) / xdpPage
	spec, err := loadXdp()
	if err != nil {
		return nil, err
	}
	w := &xdpWrite{}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	// the hash tables without preallocation (xdp.c): a replaced or deleted element is freed
	// after an RCU grace period, so a program that looked it up reads it whole (a preallocated
	// table reuses elements at once: a program could read one entry's fields and another's)
	if w.qps, err = ebpf.NewMap(spec.Maps[xdpMapQps]); err != nil {
		return nil, fmt.Errorf("XDP write responder: QP table: %w", err)
	}
	if w.mrs, err = ebpf.NewMap(spec.Maps[xdpMapMrs]); err != nil {
		return nil, fmt.Errorf("XDP write responder: MR table: %w", err)
	}
	if w.crc, err = ebpf.NewMap(spec.Maps[xdpMapCrc]); err != nil {
		return nil, fmt.Errorf("XDP write responder: CRC table: %w", err)
	}
	ms := spec.Maps[xdpMapMem]
	ms.MaxEntries = uint32(1 + pages)
	if w.mem, err = ebpf.NewMap(ms); err != nil {
		return nil, fmt.Errorf("XDP write responder: device memory: %w", err)
	}
	var tab xdpCrcTable
	copy(tab.T[:], crc32.IEEETable[:])
	if err := w.crc.Update(uint32(0), &tab, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("XDP write responder: CRC table: %w", err)
	}
	if w.region, err = unix.Mmap(w.mem.FD(), 0, (1+pages)*xdpPage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("XDP write responder: map the device memory: %w", err)
	}
	w.state, w.memory = w.region[:xdpPage:xdpPage], w.region[xdpPage:]
	return w, nil
}

func (w *xdpWrite) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, s := range w.live {
		if s != nil {
			s.retire()
			w.gone += s.final.Load()
			w.live[i] = nil
		}
	}
	w.closed = true
	if w.region != nil {
		// Not unmapped: anonymous memory takes the map's place at the same addresses, so a
		// late access through a slice of it (an application's buffer, a receive in flight
		// while the device closes, a WriteState read racing Close) reads and writes harmless
		// memory instead of faulting; the map's pages go with its last reference below. The
		// address range stays reserved for the process's life.
		p := uintptr(unsafe.Pointer(&w.region[0]))
		if _, _, e := unix.Syscall6(unix.SYS_MMAP, p, uintptr(len(w.region)), unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0); e != 0 {
			_ = unix.Munmap(w.region) // only if the kernel refuses: then unmapped after all
		}
	}
	for _, m := range []**ebpf.Map{&w.qps, &w.mrs, &w.crc, &w.mem} {
		if *m != nil {
			(*m).Close()
			*m = nil
		}
	}
}

// icrcMasked reports whether frame byte off (from the IPv4 header on) counts as all ones in
// the ICRC (IBTA A17.3.3: IPv4 TOS, TTL, header checksum; UDP checksum; BTH byte 4).
func icrcMasked(off int) bool {
	switch off {
	case 14 + 1, 14 + 8, 14 + 10, 14 + 11, 34 + 6, 34 + 7, fBTH + 4:
		return true
	}
	return false
}

// writeResponder is the link's write responder, nil without.
func (l *Link) writeResponder() *xdpWrite {
	if l.x == nil {
		return nil
	}
	return l.x.writes
}

// DeviceMemory implements link.DeviceMemory: the write responder's device memory
// (Options.WriteMemory bytes, rounded up to pages), nil without it. When the link closes, anonymous memory replaces it at
// the same addresses: a late access does not fault, but nothing is shared any more.
func (l *Link) DeviceMemory() []byte {
	if w := l.writeResponder(); w != nil {
		return w.memory
	}
	return nil
}

// WriteState is one QP's state shared with the XDP program (link.WriteState). Once the QP is
// removed (or the link closed) it keeps the last state and count, and no longer reads the
// device memory.
type WriteState struct {
	w     *xdpWrite
	qpn   uint32
	slot  int
	word  *uint64
	count *uint64
	gone  atomic.Bool
	last  atomic.Uint64 // the word, once gone
	final atomic.Uint64 // the count, once gone
}

// retire keeps the state and count and stops reading the shared page (w.mu held).
func (s *WriteState) retire() {
	s.last.Store(atomic.LoadUint64(s.word))
	s.final.Store(atomic.LoadUint64(s.count))
	s.gone.Store(true)
}

// AddWriteQP implements link.WriteResponder: the program executes q's WRITEs from expected
// PSN epsn and MSN msn on. The QP starts paused if paused is set (Resume lets the program in).
// The state is a *WriteState.
func (l *Link) AddWriteQP(q link.WriteQP, epsn, msn uint32, paused bool) (link.WriteState, error) {
	s, err := l.addWriteQP(q, epsn, msn, paused)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (l *Link) addWriteQP(q link.WriteQP, epsn, msn uint32, paused bool) (*WriteState, error) {
	w := l.writeResponder()
	if w == nil {
		return nil, link.ErrNoWriteResponder
	}
	x := l.x
	if !q.Peer.Unmap().Is4() {
		return nil, fmt.Errorf("XDP write responder: peer %v is not IPv4", q.Peer)
	}
	if q.Local.IsValid() && q.Local.Unmap() != x.addr {
		return nil, fmt.Errorf("XDP write responder: QP address %v is not the link's %v", q.Local, x.addr)
	}
	dport := q.DstPort
	if dport == 0 {
		dport = link.UDPPort
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, net.ErrClosed
	}
	slot := w.freeSlot()
	if slot < 0 {
		return nil, fmt.Errorf("XDP write responder: all %d QP slots in use", xdpWriteSlots)
	}
	s := &WriteState{w: w, qpn: q.QPN & wordPSN, slot: slot,
		word:  (*uint64)(unsafe.Pointer(&w.state[slot*16])),
		count: (*uint64)(unsafe.Pointer(&w.state[slot*16+8]))}
	atomic.StoreUint64(s.count, 0)
	s.Resume(epsn, msn, paused)
	peer := q.Peer.Unmap().As4()
	e := xdpQpEntry{Slot: uint32(slot), Pd: q.PD, Peer: binary.NativeEndian.Uint32(peer[:])} // wire order, as the program reads it
	copy(e.Mac[:], x.mac[:])
	// the ACK as it leaves: IPv4 (ID 0, DF, TTL 64: the ring's), UDP (checksum 0), BTH, AETH
	f := make([]byte, ackFrame)
	copy(f[fBTH:], q.ACK[:])
	x.headers(f, [6]byte{}, peer, q.TClass, q.SrcPort, dport)
	copy(e.Tmpl[:], f[14:fBTH+16])
	masked := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, f[14:fBTH+9]...)
	for i := range masked {
		if icrcMasked(i - 8 + 14) {
			masked[i] = 0xff
		}
	}
	e.AckCrc = ^crc32.Update(0, crc32.IEEETable, masked)
	if err := w.qps.Update(q.QPN&wordPSN, &e, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("XDP write responder: QP table: %w", err)
	}
	w.live[slot] = s
	return s, nil
}

// RemoveWriteQP implements link.WriteResponder: it takes the QP out of the program (first
// paused: a WRITE the program has claimed is finished before this returns); its state stays
// readable. A state AddWriteQP did not return is ignored.
func (l *Link) RemoveWriteQP(ws link.WriteState) {
	s, _ := ws.(*WriteState)
	if s == nil || s.w == nil {
		return
	}
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if s.gone.Load() || w.live[s.slot] != s {
		return
	}
	s.Pause() // and it stays paused: a program that found the QP before the delete declines
	_ = w.qps.Delete(s.qpn)
	s.retire()
	w.gone += s.final.Load()
	w.live[s.slot] = nil
	w.stale[s.slot] = true
}

// freeSlot returns a free QP slot, after one RCU grace period for all removed QPs' slots if
// only those are left; -1: none (w.mu held).
func (w *xdpWrite) freeSlot() int {
	stale := -1
	for i, s := range w.live {
		if s == nil {
			if !w.stale[i] {
				return i
			}
			if stale < 0 {
				stale = i
			}
		}
	}
	if stale >= 0 {
		rcuGrace() // one grace period frees every removed QP's slot
		clear(w.stale[:])
	}
	return stale
}

// Pause stops the program from executing the QP's WRITEs (waiting out one it is executing)
// and returns the expected PSN and MSN. The QP's user-space responder pauses before it runs
// and resumes after.
func (s *WriteState) Pause() (epsn, msn uint32) {
	if s.gone.Load() {
		v := s.last.Load()
		return uint32(v & wordPSN), uint32(v >> 24 & wordPSN)
	}
	for {
		v := atomic.LoadUint64(s.word)
		if v&wordBusy != 0 {
			runtime.Gosched() // the program is between its claim and its publish
			continue
		}
		if v&wordPaused != 0 || atomic.CompareAndSwapUint64(s.word, v, v|wordPaused) {
			return uint32(v & wordPSN), uint32(v >> 24 & wordPSN)
		}
	}
}

// Resume publishes the responder's expected PSN and MSN; unless paused, the program then
// executes the WRITE at epsn and those after.
func (s *WriteState) Resume(epsn, msn uint32, paused bool) {
	v := uint64(epsn&wordPSN) | uint64(msn&wordPSN)<<24
	if paused || s.gone.Load() {
		v |= wordPaused
	}
	if s.gone.Load() {
		s.last.Store(v)
		return
	}
	atomic.StoreUint64(s.word, v)
}

// Executed is how many WRITEs the program executed for the QP.
func (s *WriteState) Executed() uint64 {
	if s.gone.Load() {
		return s.final.Load()
	}
	return atomic.LoadUint64(s.count)
}

// AddWriteMR implements link.WriteResponder: the program may write the MR rkey: length bytes at device memory offset off,
// which the requester addresses from va on, in protection domain pd (only MRs that allow
// remote writes belong here).
func (l *Link) AddWriteMR(rkey, pd uint32, va, length, off uint64) error {
	w := l.writeResponder()
	if w == nil {
		return link.ErrNoWriteResponder
	}
	if off > uint64(len(w.memory)) || length > uint64(len(w.memory))-off || va+length < va {
		return fmt.Errorf("XDP write responder: MR [%d, +%d) outside the %d bytes of device memory", off, length, len(w.memory))
	}
	var key [4]byte
	binary.BigEndian.PutUint32(key[:], rkey)
	e := xdpMrEntry{Pd: pd, Va: va, Length: length, Off: off}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return net.ErrClosed
	}
	if err := w.mrs.Update(key, &e, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("XDP write responder: MR table: %w", err)
	}
	return nil
}

// RemoveWriteMR implements link.WriteResponder: it takes R_Key rkey out of the program and returns once no program run can
// still write through it (an RCU grace period: IBTA 10.6.3.5, no access after deregistration).
func (l *Link) RemoveWriteMR(rkey uint32) {
	w := l.writeResponder()
	if w == nil {
		return
	}
	var key [4]byte
	binary.BigEndian.PutUint32(key[:], rkey)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if w.mrs.Delete(key) == nil {
		rcuGrace()
	}
}
