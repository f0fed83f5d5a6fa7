package afxdp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XDP instructions (struct bpf_insn) and the bpf(2) calls that load them.

type bpfInsn struct {
	code uint8
	regs uint8 // dst register in the low nibble, src in the high one
	off  int16
	imm  int32
}

func insn(code, dst, src uint8, off int16, imm int32) bpfInsn {
	return bpfInsn{code: code, regs: dst | src<<4, off: off, imm: imm}
}

// xdpProgram returns an XDP program that redirects IPv4 (header of 20 bytes, not a fragment)
// UDP datagrams to addr:port of at most maxFrame bytes (bpf_xdp_get_buff_len: all of the
// frame, also when a driver hands it over in several buffers) to the XSKMAP entry of the
// receive queue, and passes everything else (and everything, if the queue has no socket) to
// the stack. With w, RC WRITE Only requests that w's tables allow are executed in the program
// first (xdpwrite_linux.go); whatever it declines is redirected as before.
func xdpProgram(xmap int, addr [4]byte, port uint16, maxFrame int, w *xdpWrite) []bpfInsn {
	const xdpPassCode, redirectMap, getBuffLen = 2, 51, 188 // BPF_FUNC_redirect_map, BPF_FUNC_xdp_get_buff_len
	// packet loads are in the host's byte order: compare with the wire bytes loaded so
	ne := binary.NativeEndian
	addrC := int32(ne.Uint32(addr[:]))
	portC := int32(ne.Uint16([]byte{byte(port >> 8), byte(port)}))
	ipv4C := int32(ne.Uint16([]byte{0x08, 0x00}))
	fragC := int32(ne.Uint16([]byte{0x3f, 0xff})) // MF and the fragment offset
	a := newBPFAsm()
	a.op(bMovX, 6, 1, 0, 0) // r6 = ctx
	a.op(bCall, 0, 0, 0, getBuffLen)
	a.jmp(bJgtK, 0, 0, int32(maxFrame), "pass")
	if w != nil {
		a.op(bStxDW, 10, 0, wsFrameLen, 0)
	}
	a.op(bLdxW, 2, 6, 0, 0) // r2 = ctx->data
	a.op(bLdxW, 3, 6, 4, 0) // r3 = ctx->data_end
	a.op(bMovX, 4, 2, 0, 0)
	a.op(bAddK, 4, 0, 0, ethIPv4UDP)
	a.jmp(bJgtX, 4, 3, 0, "pass") // shorter than Ethernet + IPv4 + UDP
	a.op(bLdxH, 5, 2, 12, 0)
	a.jmp(bJneK, 5, 0, ipv4C, "pass") // EtherType 0x0800
	a.op(bLdxB, 5, 2, 14, 0)
	a.jmp(bJneK, 5, 0, 0x45, "pass") // IPv4, 20-byte header
	a.op(bLdxB, 5, 2, 23, 0)
	a.jmp(bJneK, 5, 0, unix.IPPROTO_UDP, "pass")
	a.op(bLdxH, 5, 2, 20, 0)
	a.op(bAndK, 5, 0, 0, fragC)
	a.jmp(bJneK, 5, 0, 0, "pass")
	a.op(bLdxW, 5, 2, 30, 0)
	a.jmp(0x56 /* jne32 K */, 5, 0, addrC, "pass")
	a.op(bLdxH, 5, 2, 36, 0)
	a.jmp(bJneK, 5, 0, portC, "pass")
	if w != nil {
		w.program(a, "redirect")
	}
	a.label("redirect")
	a.op(bLdxW, 2, 6, 16, 0) // r2 = ctx->rx_queue_index
	a.mapFD(1, xmap)
	a.op(bMovK, 3, 0, 0, xdpPassCode) // no socket on this queue: XDP_PASS
	a.op(bCall, 0, 0, 0, redirectMap)
	a.op(bExit, 0, 0, 0, 0)
	a.label("pass")
	a.op(bMovK, 0, 0, 0, xdpPassCode)
	a.op(bExit, 0, 0, 0, 0)
	return a.done()
}

func bpfCall(cmd int, attr unsafe.Pointer, size uintptr) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// bpfXSKMap creates an XSKMAP of n entries (queue index -> AF_XDP socket).
func bpfXSKMap(n int) (int, error) {
	fd, err := bpfMapCreate(unix.BPF_MAP_TYPE_XSKMAP, 4, 4, uint32(n), 0)
	if err != nil {
		return -1, fmt.Errorf("bpf: create XSKMAP: %w", err)
	}
	return fd, nil
}

func bpfMapSet(m int, key, val uint32) error {
	err := bpfMapUpdate(m, unsafe.Pointer(&key), unsafe.Pointer(&val))
	runtime.KeepAlive(&key)
	runtime.KeepAlive(&val)
	if err != nil {
		return fmt.Errorf("bpf: XSKMAP update: %w", err)
	}
	return nil
}

// bpfAttachXDP attaches prog to interface ifindex in generic (SKB) mode, or the driver's with
// native, as a BPF link (BPF_LINK_CREATE, Linux 5.9) and returns the link's descriptor.
func bpfAttachXDP(prog, ifindex int, native bool) (int, error) {
	mode := uint32(unix.XDP_FLAGS_SKB_MODE)
	if native {
		mode = unix.XDP_FLAGS_DRV_MODE
	}
	attr := struct{ prog, target, typ, flags uint32 }{uint32(prog), uint32(ifindex), unix.BPF_XDP, mode}
	fd, err := bpfCall(unix.BPF_LINK_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return -1, fmt.Errorf("bpf: BPF_LINK_CREATE: %w", err)
	}
	return fd, nil
}

// bpfLoadXDP loads prog as an XDP program (frags: one that accepts multi-buffer frames, which a
// driver hook with a large MTU requires); the verifier's log comes with a refusal.
func bpfLoadXDP(prog []bpfInsn, frags bool) (int, error) {
	fd, err := bpfLoadXDPLog(prog, frags, nil)
	if err == nil {
		return fd, nil
	}
	// again with the verifier's log (not the first time: a long program's log of a success
	// can overflow any buffer, which fails the load); its end says why
	vlog := make([]byte, 1<<20)
	if fd, err2 := bpfLoadXDPLog(prog, frags, vlog); err2 == nil {
		return fd, nil // refused once, not twice: take it
	}
	n := 0
	for n < len(vlog) && vlog[n] != 0 {
		n++
	}
	msg := vlog[:n]
	if len(msg) > 4096 {
		msg = msg[len(msg)-4096:]
	}
	return -1, fmt.Errorf("bpf: load XDP program: %w: %s", err, msg)
}

func bpfLoadXDPLog(prog []bpfInsn, frags bool, vlog []byte) (int, error) {
	license := []byte("Dual MIT/GPL\x00")
	attr := struct {
		typ, cnt       uint32
		insns, license uint64
		level, size    uint32
		log            uint64
		kver, flags    uint32
		name           [16]byte
		ifindex, eat   uint32
	}{typ: unix.BPF_PROG_TYPE_XDP, cnt: uint32(len(prog)), insns: uint64(uintptr(unsafe.Pointer(&prog[0]))),
		license: uint64(uintptr(unsafe.Pointer(&license[0])))}
	if vlog != nil {
		attr.level, attr.size, attr.log = 1, uint32(len(vlog)), uint64(uintptr(unsafe.Pointer(&vlog[0])))
	}
	copy(attr.name[:], "softroce_xsk")
	if frags {
		attr.flags = unix.BPF_F_XDP_HAS_FRAGS
	}
	fd, err := bpfCall(unix.BPF_PROG_LOAD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(prog)
	runtime.KeepAlive(license)
	runtime.KeepAlive(vlog)
	return fd, err
}
