package link

// The XDP write responder (XDPOptions.WriteMemory; docs/link.md "XDP write responder").
//
// Kernel rxe executes a peer's RDMA WRITE and sends its ACK inside the peer's own transmit
// (the softirq of the sending CPU); a user-space responder can only do it once its process
// has read the packet, and then its ACK is one more frame through its kernel. On the AF_XDP
// path the link's XDP program can do what rxe does: for an RC RDMA WRITE Only (opcode 0x0A,
// 1..xdpWriteMax bytes, no immediate) to a QP and R_Key the device registered here, it checks
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
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// xdpWriteMax is the largest WRITE payload the program executes (the latency path's
	// small messages; larger ones go to user space).
	xdpWriteMax = 64
	// xdpWriteSlots is how many QPs the program serves (16-byte slots in the state page).
	xdpWriteSlots = xdpChunk / 16
	xdpPage       = 4096

	wordPSN    = 0xFFFFFF
	wordPaused = uint64(1) << 48
	wordBusy   = uint64(1) << 49

	// the program's stack slots (offsets from r10)
	wsKey      = -8
	wsN        = -16 // payload + pad bytes
	wsDst      = -24 // where the payload goes (map value pointer)
	wsLen      = -32 // the DMA length
	wsPSN      = -40
	wsWord     = -48 // the QP's state word (map value pointer)
	wsOld      = -56 // the word as claimed
	wsMSN      = -64 // the MSN after this WRITE
	wsFrameLen = -72 // bpf_xdp_get_buff_len
	wsTable    = -80 // the CRC table (map value pointer)

	// offsets in a frame: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16, payload
	fBTH     = ethIPv4UDP
	fRETH    = fBTH + 12
	fPayload = fRETH + 16
	ackFrame = fBTH + 12 + 4 + 4 // BTH, AETH, ICRC

	// the QP table's value (xdpQPEntry)
	qeSlot, qePD, qePeer, qeACKCRC, qeTemplate, qeMAC, qeSize = 0, 4, 8, 12, 16, 64, 72
	// the MR table's value (xdpMREntry)
	meSize = 32
)

// xdpQPEntry is the QP table's value, as the program reads it (host byte order but where the
// wire's is said).
type xdpQPEntry struct {
	Slot   uint32
	PD     uint32
	Peer   [4]byte  // the requester's IPv4 address (wire order)
	ACKCRC uint32   // CRC state (not inverted) over the ACK's bytes before its PSN
	Tmpl   [48]byte // the ACK's IPv4, UDP, BTH and AETH (44 bytes) as sent, PSN and MSN 0
	MAC    [8]byte  // the link's MAC address: the ACK's source
}

// xdpMREntry is the MR table's value.
type xdpMREntry struct {
	PD     uint32
	_      uint32
	VA     uint64 // the MR's first virtual address
	Length uint64
	Off    uint64 // where the MR starts in the device memory
}

// xdpWrite is the link's write responder: the program's tables and the device memory.
type xdpWrite struct {
	qps, mrs, crc, mem int // BPF map descriptors
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

func bpfMapCreate(typ, key, val, max, flags uint32) (int, error) {
	attr := struct{ typ, key, val, max, flags uint32 }{typ, key, val, max, flags}
	return bpfCall(unix.BPF_MAP_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
}

func bpfMapUpdate(m int, key, val unsafe.Pointer) error {
	attr := struct {
		fd, _           uint32
		key, val, flags uint64
	}{fd: uint32(m), key: uint64(uintptr(key)), val: uint64(uintptr(val))}
	_, err := bpfCall(unix.BPF_MAP_UPDATE_ELEM, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	return err
}

func bpfMapDelete(m int, key unsafe.Pointer) error {
	attr := struct {
		fd, _ uint32
		key   uint64
	}{fd: uint32(m), key: uint64(uintptr(key))}
	_, err := bpfCall(unix.BPF_MAP_DELETE_ELEM, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	return err
}

// newXDPWrite creates the tables and size bytes of device memory (rounded up to pages).
func newXDPWrite(size int) (_ *xdpWrite, err error) {
	if size <= 0 || size > 1<<30 {
		return nil, fmt.Errorf("XDP write responder: device memory of %d bytes: want 1 B to 1 GiB", size)
	}
	pages := (size + xdpPage - 1) / xdpPage
	w := &xdpWrite{qps: -1, mrs: -1, crc: -1, mem: -1}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	// the hash tables without preallocation: a replaced or deleted element is freed after an
	// RCU grace period, so a program that looked it up reads it whole (a preallocated table
	// reuses elements at once: a program could read one entry's fields and another's)
	const hash, array, mmapable, noPrealloc = unix.BPF_MAP_TYPE_HASH, unix.BPF_MAP_TYPE_ARRAY, unix.BPF_F_MMAPABLE, unix.BPF_F_NO_PREALLOC
	if w.qps, err = bpfMapCreate(hash, 4, qeSize, xdpWriteSlots, noPrealloc); err != nil {
		return nil, fmt.Errorf("XDP write responder: QP table: %w", err)
	}
	if w.mrs, err = bpfMapCreate(hash, 4, meSize, 4096, noPrealloc); err != nil {
		return nil, fmt.Errorf("XDP write responder: MR table: %w", err)
	}
	if w.crc, err = bpfMapCreate(array, 4, 1024, 1, 0); err != nil {
		return nil, fmt.Errorf("XDP write responder: CRC table: %w", err)
	}
	if w.mem, err = bpfMapCreate(array, 4, xdpPage, uint32(1+pages), mmapable); err != nil {
		return nil, fmt.Errorf("XDP write responder: device memory: %w", err)
	}
	var tab [256]uint32
	copy(tab[:], crc32.IEEETable[:])
	zero := uint32(0)
	if err := bpfMapUpdate(w.crc, unsafe.Pointer(&zero), unsafe.Pointer(&tab)); err != nil {
		return nil, fmt.Errorf("XDP write responder: CRC table: %w", err)
	}
	if w.region, err = unix.Mmap(w.mem, 0, (1+pages)*xdpPage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
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
	for _, fd := range []*int{&w.qps, &w.mrs, &w.crc, &w.mem} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// crcStep emits one byte of the reflected CRC-32: r4 = table[(r4 ^ r1) & 0xff] ^ (r4 >> 8),
// the table's pointer in r5, the byte in r1 (clobbered).
func crcStep(a *bpfAsm) {
	a.op(bXorX, 1, 4, 0, 0)
	a.op(bAndK, 1, 0, 0, 0xff)
	a.op(bLshK, 1, 0, 0, 2)
	a.op(bAddX, 1, 5, 0, 0)
	a.op(bLdxW, 1, 1, 0, 0)
	a.op(bRshK, 4, 0, 0, 8)
	a.op(bXorX, 4, 1, 0, 0)
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

// loadBE24 emits dst = the 24-bit big-endian number at frame offset off (r7: data), r1 scratch.
func loadBE24(a *bpfAsm, dst uint8, off int16) {
	a.op(bLdxB, dst, 7, off, 0)
	a.op(bLshK, dst, 0, 0, 16)
	a.op(bLdxB, 1, 7, off+1, 0)
	a.op(bLshK, 1, 0, 0, 8)
	a.op(bOrX, dst, 1, 0, 0)
	a.op(bLdxB, 1, 7, off+2, 0)
	a.op(bOrX, dst, 1, 0, 0)
}

// storeBE24 emits the low 24 bits of register src (clobbered) big-endian at frame offset off.
func storeBE24(a *bpfAsm, src uint8, off int16) {
	a.op(bStxB, 7, src, off+2, 0)
	a.op(bRshK, src, 0, 0, 8)
	a.op(bStxB, 7, src, off+1, 0)
	a.op(bRshK, src, 0, 0, 8)
	a.op(bStxB, 7, src, off, 0)
}

// program emits the responder after the program's framing checks (r6: ctx, the frame's
// length at wsFrameLen): it returns XDP_TX with the ACK, or XDP_DROP for a WRITE executed that
// asks for no ACK, or jumps to decline (the socket gets the frame, untouched).
func (w *xdpWrite) program(a *bpfAsm, decline string) {
	const xdpDrop, xdpTx = 1, 3
	ne := binary.NativeEndian
	pkeyC := int32(ne.Uint16([]byte{0x7f, 0xff})) // IBTA 10.9.3: the one P_Key, 0xFFFF (either membership)
	lookup := func(m int, onNil string) {         // r0 = &m[*(u32 *)(fp + wsKey)], nil: jump
		a.mapFD(1, m)
		a.op(bMovX, 2, 10, 0, 0)
		a.op(bAddK, 2, 0, 0, wsKey)
		a.op(bCall, 0, 0, 0, fnMapLookup)
		a.jmp(bJeqK, 0, 0, 0, onNil)
	}
	a.op(bLdxW, 7, 6, 0, 0) // r7 = data
	a.op(bLdxW, 8, 6, 4, 0) // r8 = data_end
	a.op(bMovX, 1, 7, 0, 0)
	a.op(bAddK, 1, 0, 0, fPayload+1+3+4) // the shortest WRITE it takes: 1 byte, 3 pad, ICRC
	a.jmp(bJgtX, 1, 8, 0, decline)
	a.op(bLdxB, 1, 7, fBTH, 0)
	a.jmp(bJneK, 1, 0, 0x0A, decline) // RC RDMA WRITE Only (IBTA 9.2: RC, opcode 01010)
	a.op(bLdxB, 1, 7, fBTH+1, 0)
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAndK, 2, 0, 0, 0x0f)
	a.jmp(bJneK, 2, 0, 0, decline) // TVer 0
	a.op(bRshK, 1, 0, 0, 4)
	a.op(bAndK, 1, 0, 0, 3) // r1 = PadCnt
	a.op(bLdxW, 2, 7, fRETH+12, 0)
	a.op(bToBE, 2, 0, 0, 32) // r2 = DMA length
	a.jmp(bJeqK, 2, 0, 0, decline)
	a.jmp(bJgtK, 2, 0, xdpWriteMax, decline)
	a.op(bMovK, 3, 0, 0, 0)
	a.op(bSubX, 3, 2, 0, 0)
	a.op(bAndK, 3, 0, 0, 3)
	a.jmp(bJneX, 3, 1, 0, decline) // the pad the length needs
	a.op(bStxDW, 10, 2, wsLen, 0)
	a.op(bAddX, 1, 2, 0, 0)
	a.op(bStxDW, 10, 1, wsN, 0) // payload and pad
	a.op(bAddK, 1, 0, 0, fPayload+4)
	a.op(bLdxDW, 2, 10, wsFrameLen, 0)
	a.jmp(bJneX, 1, 2, 0, decline) // the payload is the DMA length: nothing after the ICRC
	a.op(bLdxH, 3, 7, 16, 0)
	a.op(bToBE, 3, 0, 0, 16)
	a.op(bAddK, 3, 0, 0, 14)
	a.jmp(bJneX, 3, 2, 0, decline) // the IPv4 total length is the frame's (as user space reads it)
	a.op(bLdxH, 3, 7, 38, 0)
	a.op(bToBE, 3, 0, 0, 16)
	a.op(bAddK, 3, 0, 0, 34)
	a.jmp(bJneX, 3, 2, 0, decline) // and the UDP length
	loadBE24(a, 2, fBTH+5)
	a.op(bStxW, 10, 2, wsKey, 0)
	lookup(w.qps, decline) // the QP
	a.op(bMovX, 9, 0, 0, 0)
	a.op(bLdxW, 1, 7, 26, 0)
	a.op(bLdxW, 2, 9, qePeer, 0)
	a.jmp(bJneX, 1, 2, 0, decline) // from the QP's peer (RC: the path's address)
	a.op(bLdxH, 1, 7, fBTH+2, 0)
	a.op(bAndK, 1, 0, 0, pkeyC)
	a.jmp(bJneK, 1, 0, pkeyC, decline)
	a.op(bLdxW, 1, 7, fRETH+8, 0) // R_Key, wire order: the MR table's key
	a.op(bStxW, 10, 1, wsKey, 0)
	lookup(w.mrs, decline)
	a.op(bLdxW, 1, 0, 0, 0)
	a.op(bLdxW, 2, 9, qePD, 0)
	a.jmp(bJneX, 1, 2, 0, decline) // the MR's protection domain is the QP's
	a.op(bLdxDW, 1, 7, fRETH, 0)
	a.op(bToBE, 1, 0, 0, 64) // r1 = VA
	a.op(bLdxDW, 2, 0, 8, 0)
	a.jmp(bJltX, 1, 2, 0, decline)
	a.op(bSubX, 1, 2, 0, 0) // r1 = offset in the MR
	a.op(bLdxDW, 2, 0, 16, 0)
	a.jmp(bJgtX, 1, 2, 0, decline)
	a.op(bSubX, 2, 1, 0, 0) // r2 = room after it
	a.op(bLdxDW, 3, 10, wsLen, 0)
	a.jmp(bJgtX, 3, 2, 0, decline) // bounds (IBTA C9-88)
	a.op(bLdxDW, 2, 0, 24, 0)
	a.op(bAddX, 1, 2, 0, 0) // r1 = offset in the device memory
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAndK, 2, 0, 0, xdpPage-1)
	a.jmp(bJgtK, 2, 0, xdpPage-xdpWriteMax, decline) // may cross a page: user space does it
	a.op(bStxDW, 10, 2, wsDst, 0)
	a.op(bRshK, 1, 0, 0, 12)
	a.op(bAddK, 1, 0, 0, 1) // page 0 is the QP slots
	a.op(bStxW, 10, 1, wsKey, 0)
	lookup(w.mem, decline)
	a.op(bLdxDW, 1, 10, wsDst, 0)
	a.jmp(bJgtK, 1, 0, xdpPage-xdpWriteMax, decline)
	a.op(bAddX, 0, 1, 0, 0)
	a.op(bStxDW, 10, 0, wsDst, 0)
	a.op(bStW, 10, 0, wsKey, 0)
	lookup(w.mem, decline) // page 0
	a.op(bLdxW, 1, 9, qeSlot, 0)
	a.jmp(bJgeK, 1, 0, xdpWriteSlots, decline)
	a.op(bLshK, 1, 0, 0, 4)
	a.op(bAddX, 0, 1, 0, 0)
	a.op(bStxDW, 10, 0, wsWord, 0)
	a.op(bStW, 10, 0, wsKey, 0)
	lookup(w.crc, decline)
	a.op(bStxDW, 10, 0, wsTable, 0)

	// the ICRC (IBTA A17.3.3): 8 bytes of ones for the absent LRH, then the frame from the
	// IPv4 header to the ICRC, masked fields as ones
	a.op(bMovX, 5, 0, 0, 0)
	a.op(bMovK, 4, 0, 0, 0)
	a.op(bXor32K, 4, 0, 0, int32(crcLRHState()))
	for off := 14; off < fPayload; off++ {
		if icrcMasked(off) {
			a.op(bMovK, 1, 0, 0, 0xff)
		} else {
			a.op(bLdxB, 1, 7, int16(off), 0)
		}
		crcStep(a)
	}
	a.op(bLdxDW, 3, 10, wsN, 0)
	a.jmp(bJgtK, 3, 0, xdpWriteMax+3, decline)
	for i := 0; i < xdpWriteMax+3; i++ {
		a.jmp(bJleK, 3, 0, int32(i), "w_crcdone")
		a.op(bMovX, 1, 7, 0, 0)
		a.op(bAddK, 1, 0, 0, int32(fPayload+i+1))
		a.jmp(bJgtX, 1, 8, 0, decline)
		a.op(bLdxB, 1, 7, int16(fPayload+i), 0)
		crcStep(a)
	}
	a.label("w_crcdone")
	a.op(bMovX, 1, 7, 0, 0)
	a.op(bAddX, 1, 3, 0, 0)
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAddK, 2, 0, 0, fPayload+4)
	a.jmp(bJgtX, 2, 8, 0, decline)
	a.op(bLdxW, 1, 1, fPayload, 0)
	a.op(bToLE, 1, 0, 0, 32) // stored little-endian
	a.op(bXor32K, 4, 0, 0, -1)
	a.jmp(bJneX, 1, 4, 0, decline) // a bad ICRC: user space drops it (and counts it)

	// claim the PSN: the word must be this PSN, not paused, not busy
	loadBE24(a, 3, fBTH+9)
	a.op(bStxDW, 10, 3, wsPSN, 0)
	a.op(bLdxDW, 1, 10, wsWord, 0)
	a.op(bLdxDW, 0, 1, 0, 0)
	a.op(bMovX, 2, 0, 0, 0)
	a.op(bAndK, 2, 0, 0, wordPSN)
	a.jmp(bJneX, 2, 3, 0, decline) // not the expected PSN: a duplicate or a gap
	a.op(bMovX, 2, 0, 0, 0)
	a.op(bRshK, 2, 0, 0, 48)
	a.jmp(bJneK, 2, 0, 0, decline) // paused or busy
	a.op(bStxDW, 10, 0, wsOld, 0)
	a.op(bMovK, 2, 0, 0, 1)
	a.op(bLshK, 2, 0, 0, 49)
	a.op(bOrX, 2, 0, 0, 0)
	a.op(bAtomicDW, 1, 2, 0, atomicCmpXchg)
	a.op(bLdxDW, 3, 10, wsOld, 0)
	a.jmp(bJneX, 0, 3, 0, decline) // changed meanwhile: user space paused it

	// the payload into the device memory
	a.op(bMovX, 1, 6, 0, 0)
	a.op(bMovK, 2, 0, 0, fPayload)
	a.op(bLdxDW, 3, 10, wsDst, 0)
	a.op(bLdxDW, 4, 10, wsLen, 0)
	a.jmp(bJgtK, 4, 0, xdpWriteMax, "w_unclaim")
	a.jmp(bJltK, 4, 0, 1, "w_unclaim") // (not == 0: the 6.1 verifier learns no lower bound from it)
	a.op(bCall, 0, 0, 0, fnXDPLoadBytes)
	a.jmp(bJneK, 0, 0, 0, "w_unclaim")

	// publish PSN+1, MSN+1 (flags clear), then count the WRITE
	a.op(bLdxDW, 1, 10, wsOld, 0)
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAddK, 2, 0, 0, 1)
	a.op(bAndK, 2, 0, 0, wordPSN)
	a.op(bRshK, 1, 0, 0, 24)
	a.op(bAddK, 1, 0, 0, 1)
	a.op(bAndK, 1, 0, 0, wordPSN)
	a.op(bStxDW, 10, 1, wsMSN, 0)
	a.op(bLshK, 1, 0, 0, 24)
	a.op(bOrX, 2, 1, 0, 0)
	a.op(bLdxDW, 1, 10, wsWord, 0)
	a.op(bAtomicDW, 1, 2, 0, atomicXchg)
	a.op(bMovK, 2, 0, 0, 1)
	a.op(bAtomicDW, 1, 2, 8, atomicAdd)

	// no AckReq: nothing to send (IBTA 9.7.5.1: the ACK may be coalesced)
	a.op(bLdxB, 1, 7, fBTH+8, 0)
	a.op(bAndK, 1, 0, 0, 0x80)
	a.jmp(bJneK, 1, 0, 0, "w_ack")
	a.op(bMovK, 0, 0, 0, xdpDrop)
	a.op(bExit, 0, 0, 0, 0)

	// the ACK in place: the MAC addresses swapped, the QP's headers, the PSN, the MSN, the ICRC
	a.label("w_ack")
	a.op(bLdxW, 3, 7, 6, 0) // to the request's source, from the link's MAC address
	a.op(bLdxH, 4, 7, 10, 0)
	a.op(bStxW, 7, 3, 0, 0)
	a.op(bStxH, 7, 4, 4, 0)
	a.op(bLdxW, 1, 9, qeMAC, 0)
	a.op(bLdxH, 2, 9, qeMAC+4, 0)
	a.op(bStxW, 7, 1, 6, 0)
	a.op(bStxH, 7, 2, 10, 0)
	for k := int16(0); k < 48; k += 8 {
		a.op(bLdxDW, 1, 9, qeTemplate+k, 0)
		a.op(bStxDW, 7, 1, 14+k, 0)
	}
	a.op(bLdxDW, 1, 10, wsPSN, 0)
	storeBE24(a, 1, fBTH+9)
	a.op(bLdxDW, 1, 10, wsMSN, 0)
	storeBE24(a, 1, fBTH+12+1)
	a.op(bLdxDW, 5, 10, wsTable, 0)
	a.op(bLdxW, 4, 9, qeACKCRC, 0)
	for off := int16(fBTH + 9); off < fBTH+16; off++ {
		a.op(bLdxB, 1, 7, off, 0)
		crcStep(a)
	}
	a.op(bXor32K, 4, 0, 0, -1)
	a.op(bToLE, 4, 0, 0, 32)
	a.op(bStxW, 7, 4, fBTH+16, 0)
	a.op(bMovX, 1, 6, 0, 0)
	a.op(bMovK, 2, 0, 0, ackFrame)
	a.op(bLdxDW, 3, 10, wsFrameLen, 0)
	a.op(bSubX, 2, 3, 0, 0)
	a.op(bCall, 0, 0, 0, fnAdjustTail) // cut to the ACK's length
	a.jmp(bJneK, 0, 0, 0, "w_drop")
	a.op(bMovK, 0, 0, 0, xdpTx)
	a.op(bExit, 0, 0, 0, 0)
	a.label("w_drop") // the WRITE is done; its ACK lost (the requester's retry gets one)
	a.op(bMovK, 0, 0, 0, xdpDrop)
	a.op(bExit, 0, 0, 0, 0)

	a.label("w_unclaim") // give the PSN back as it was, then decline
	a.op(bLdxDW, 1, 10, wsWord, 0)
	a.op(bLdxDW, 2, 10, wsOld, 0)
	a.op(bAtomicDW, 1, 2, 0, atomicXchg)
	a.jmp(bJa, 0, 0, 0, decline)
}

// crcLRHState is the CRC-32 state (not inverted) after the ICRC's 8 bytes of ones.
func crcLRHState() uint32 {
	return ^crc32.Update(0, crc32.IEEETable, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
}

// writeResponder is the link's write responder, nil without.
func (l *UDPLink) writeResponder() *xdpWrite {
	if l.xdp == nil {
		return nil
	}
	return l.xdp.writes
}

// ErrNoWriteResponder: the link has no XDP write responder (XDPOptions.WriteMemory 0, or no
// AF_XDP path).
var ErrNoWriteResponder = errors.New("link: no XDP write responder")

// DeviceMemory is the XDP write responder's device memory (XDPOptions.WriteMemory bytes,
// rounded up to pages), nil without it. When the link closes, anonymous memory replaces it at
// the same addresses: a late access does not fault, but nothing is shared any more.
func (l *UDPLink) DeviceMemory() []byte {
	if w := l.writeResponder(); w != nil {
		return w.memory
	}
	return nil
}

// WriteQP describes an RC QP whose WRITE Only requests the XDP program may execute.
type WriteQP struct {
	QPN uint32
	// PD identifies its protection domain (equal to an MR's for the MR to be writable).
	PD uint32
	// Local is the QP's address (the link's; invalid: the link's), Peer the requester's (the
	// QP's path), SrcPort and DstPort the UDP ports its ACKs carry (DstPort 0: 4791), TClass
	// their traffic class.
	Local, Peer      netip.Addr
	SrcPort, DstPort uint16
	TClass           uint8
	// ACK is the BTH and AETH of the QP's ACK as its user-space responder builds it, with
	// PSN 0 and MSN 0 (the program fills them in).
	ACK [16]byte
}

// WriteState is one QP's state shared with the XDP program. Once the QP is removed (or the
// link closed) it keeps the last state and count, and no longer reads the device memory.
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

// AddWriteQP lets the program execute q's WRITEs from expected PSN epsn and MSN msn on. The
// QP starts paused if paused is set (Resume lets the program in).
func (l *UDPLink) AddWriteQP(q WriteQP, epsn, msn uint32, paused bool) (*WriteState, error) {
	w := l.writeResponder()
	if w == nil {
		return nil, ErrNoWriteResponder
	}
	x := l.xdp
	if !q.Peer.Unmap().Is4() {
		return nil, fmt.Errorf("XDP write responder: peer %v is not IPv4", q.Peer)
	}
	if q.Local.IsValid() && q.Local.Unmap() != x.addr {
		return nil, fmt.Errorf("XDP write responder: QP address %v is not the link's %v", q.Local, x.addr)
	}
	dport := q.DstPort
	if dport == 0 {
		dport = UDPPort
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
	e := xdpQPEntry{Slot: uint32(slot), PD: q.PD, Peer: q.Peer.Unmap().As4()}
	copy(e.MAC[:], x.mac[:])
	// the ACK as it leaves: IPv4 (ID 0, DF, TTL 64: the ring's), UDP (checksum 0), BTH, AETH
	f := make([]byte, ackFrame)
	copy(f[fBTH:], q.ACK[:])
	x.headers(f, [6]byte{}, e.Peer, q.TClass, q.SrcPort, dport)
	copy(e.Tmpl[:], f[14:fBTH+16])
	masked := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, f[14:fBTH+9]...)
	for i := range masked {
		if icrcMasked(i - 8 + 14) {
			masked[i] = 0xff
		}
	}
	e.ACKCRC = ^crc32.Update(0, crc32.IEEETable, masked)
	key := q.QPN & wordPSN
	if err := bpfMapUpdate(w.qps, unsafe.Pointer(&key), unsafe.Pointer(&e)); err != nil {
		return nil, fmt.Errorf("XDP write responder: QP table: %w", err)
	}
	runtime.KeepAlive(&e)
	w.live[slot] = s
	return s, nil
}

// RemoveWriteQP takes the QP out of the program (first paused: a WRITE the program has
// claimed is finished before this returns); its state stays readable.
func (l *UDPLink) RemoveWriteQP(s *WriteState) {
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
	key := s.qpn
	_ = bpfMapDelete(w.qps, unsafe.Pointer(&key))
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

// AddWriteMR lets the program write the MR rkey: length bytes at device memory offset off,
// which the requester addresses from va on, in protection domain pd (only MRs that allow
// remote writes belong here).
func (l *UDPLink) AddWriteMR(rkey, pd uint32, va, length, off uint64) error {
	w := l.writeResponder()
	if w == nil {
		return ErrNoWriteResponder
	}
	if off > uint64(len(w.memory)) || length > uint64(len(w.memory))-off || va+length < va {
		return fmt.Errorf("XDP write responder: MR [%d, +%d) outside the %d bytes of device memory", off, length, len(w.memory))
	}
	var key [4]byte
	binary.BigEndian.PutUint32(key[:], rkey)
	e := xdpMREntry{PD: pd, VA: va, Length: length, Off: off}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return net.ErrClosed
	}
	if err := bpfMapUpdate(w.mrs, unsafe.Pointer(&key), unsafe.Pointer(&e)); err != nil {
		return fmt.Errorf("XDP write responder: MR table: %w", err)
	}
	runtime.KeepAlive(&e)
	return nil
}

// RemoveWriteMR takes R_Key rkey out of the program and returns once no program run can
// still write through it (an RCU grace period: IBTA 10.6.3.5, no access after deregistration).
func (l *UDPLink) RemoveWriteMR(rkey uint32) {
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
	if bpfMapDelete(w.mrs, unsafe.Pointer(&key)) == nil {
		rcuGrace()
	}
}
