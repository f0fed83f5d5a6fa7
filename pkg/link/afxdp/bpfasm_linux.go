package afxdp

import "fmt"

// bpfAsm is a small eBPF assembler for the link's XDP programs: instructions with symbolic
// jump targets (labels), resolved by done. Opcodes are spelled out where used (the kernel's
// include/uapi/linux/bpf.h, bpf_common.h).
type bpfAsm struct {
	p      []bpfInsn
	labels map[string]int
	fix    map[int]string // instruction index -> label it jumps to
}

func newBPFAsm() *bpfAsm {
	return &bpfAsm{labels: make(map[string]int), fix: make(map[int]string)}
}

// eBPF opcodes used by the programs (class | size/op | source).
const (
	bLdxB, bLdxH, bLdxW, bLdxDW = 0x71, 0x69, 0x61, 0x79
	bStxB, bStxH, bStxW, bStxDW = 0x73, 0x6b, 0x63, 0x7b
	bStW                        = 0x62 // *(u32 *)(dst + off) = imm
	bAddK, bAddX, bSubX         = 0x07, 0x0f, 0x1f
	bAndK, bOrX, bLshK, bRshK   = 0x57, 0x4f, 0x67, 0x77
	bXorX, bMovK, bMovX         = 0xaf, 0xb7, 0xbf
	bXor32K                     = 0xa4
	bToBE, bToLE                = 0xdc, 0xd4 // byte order: imm 16, 32 or 64
	bJa                         = 0x05
	bJeqK, bJneK, bJneX         = 0x15, 0x55, 0x5d
	bJgtK, bJgtX, bJgeK         = 0x25, 0x2d, 0x35
	bJltX, bJltK, bJleK         = 0xad, 0xa5, 0xb5
	bCall, bExit                = 0x85, 0x95
	bLdImm64                    = 0x18
	bAtomicDW                   = 0xdb // BPF_STX | BPF_ATOMIC | BPF_DW
	atomicAdd                   = 0x00
	atomicXchg                  = 0xe1 // BPF_XCHG | BPF_FETCH
	atomicCmpXchg               = 0xf1 // BPF_CMPXCHG | BPF_FETCH: r0 = expected, then old
	fnMapLookup                 = 1
	fnAdjustTail                = 65
	fnXDPLoadBytes              = 189
)

func (a *bpfAsm) op(code, dst, src uint8, off int16, imm int32) {
	a.p = append(a.p, insn(code, dst, src, off, imm))
}

// jmp emits a conditional (or, with bJa, unconditional) jump to label.
func (a *bpfAsm) jmp(code, dst, src uint8, imm int32, label string) {
	a.fix[len(a.p)] = label
	a.op(code, dst, src, 0, imm)
}

// label marks the next instruction.
func (a *bpfAsm) label(name string) {
	if _, dup := a.labels[name]; dup {
		panic("bpfAsm: label " + name + " defined twice")
	}
	a.labels[name] = len(a.p)
}

// mapFD loads map descriptor fd into register dst (a two-slot ld_imm64).
func (a *bpfAsm) mapFD(dst uint8, fd int) {
	a.op(bLdImm64, dst, 1 /* BPF_PSEUDO_MAP_FD */, 0, int32(fd))
	a.op(0, 0, 0, 0, 0)
}

// done resolves the jumps; a label used but never defined is a programming error.
func (a *bpfAsm) done() []bpfInsn {
	for i, l := range a.fix {
		to, ok := a.labels[l]
		if !ok {
			panic(fmt.Sprintf("bpfAsm: jump at %d to undefined label %q", i, l))
		}
		a.p[i].off = int16(to - i - 1)
	}
	return a.p
}
