package afxdp

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// The write responder's program is run with BPF_PROG_TEST_RUN: a frame in, the verdict and
// the frame out, the device memory and the QP's word read back.

const (
	xdpVerdictDrop, xdpVerdictPass, xdpVerdictTx = 1, 2, 3
)

// writeRig is a write responder and its program, loaded, without an interface.
type writeRig struct {
	l     *Link
	w     *xdpWrite
	prog  xdpLoaded
	st    *WriteState
	local [4]byte
}

var (
	rigLocal   = [4]byte{198, 18, 9, 1}
	rigPeer    = [4]byte{198, 18, 9, 2}
	rigMACA    = [6]byte{2, 0, 0, 0, 0, 0xa}
	rigMACB    = [6]byte{2, 0, 0, 0, 0, 0xb}
	rigQPN     = uint32(0x11)
	rigDestQPN = uint32(0x22)
	rigRKey    = uint32(0x1234)
	rigVA      = uint64(0x7f00_0000_1000)
)

// rigACK is the BTH and AETH of the rig QP's ACK, PSN 0, MSN 0.
func rigACK() (a [16]byte) {
	bth.BTH(a[:]).Encode(&bth.BTHFields{Opcode: bth.OpRCAck, PKey: 0xFFFF, DestQP: rigDestQPN})
	bth.AETH(a[bth.BTHSize:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F)})
	return a
}

func newWriteRig(t testing.TB, epsn, msn uint32) *writeRig {
	t.Helper()
	r := openWriteRig(t, epsn, msn)
	t.Cleanup(r.close)
	return r
}

func (r *writeRig) close() {
	r.w.close()
	r.prog.Close()
}

// openWriteRig is newWriteRig whose rig the caller closes (the fuzz target keeps one).
func openWriteRig(t testing.TB, epsn, msn uint32) *writeRig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF programs and maps)")
	}
	w, err := newXDPWrite(3 * xdpPage)
	if err != nil {
		t.Fatal(err)
	}
	x := &xdpSock{mac: rigMACA, addr4: rigLocal, writes: w}
	r := &writeRig{l: &Link{x: x}, w: w, local: rigLocal}
	fail := func(err error) {
		r.close()
		t.Fatal(err)
	}
	if r.prog, err = loadXDP(xdpConsts{addr: rigLocal, port: link.UDPPort, noSocket: xdpPass}, 0, w, false); err != nil {
		fail(err)
	}
	if r.st, err = r.l.addWriteQP(link.WriteQP{QPN: rigQPN, PD: 1, Peer: netip.AddrFrom4(rigPeer), SrcPort: 0xC011, TClass: 0x28, ACK: rigACK()}, epsn, msn, false); err != nil {
		fail(err)
	}
	// the MR: device memory [4096, 4096+6000), addressed from rigVA
	if err := r.l.AddWriteMR(rigRKey, 1, rigVA, 6000, xdpPage); err != nil {
		fail(err)
	}
	return r
}

// run runs the program over frame: its verdict and the frame it leaves.
func (r *writeRig) run(t testing.TB, frame []byte) (uint32, []byte) {
	t.Helper()
	opts := ebpf.RunOptions{Data: append([]byte(nil), frame...), DataOut: make([]byte, 4096), Repeat: 1}
	v, err := r.prog.Prog.Run(&opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return v, opts.DataOut
}

// runRepeat runs the program repeat times over frame in one BPF_PROG_TEST_RUN: its verdict
// and the kernel's average time per run.
func (r *writeRig) runRepeat(t testing.TB, frame []byte, repeat int) (uint32, time.Duration) {
	t.Helper()
	v, d, err := r.prog.Prog.Benchmark(frame, repeat, nil)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return v, d
}

// wframe describes a WRITE frame from the rig's peer.
type wframe struct {
	opcode  bth.Opcode
	qpn     uint32
	psn     uint32
	va      uint64
	rkey    uint32
	payload []byte
	ackReq  bool
	pkey    uint16
	tver    uint8
	pad     int // -1: the one the length needs
	dmaLen  int // -1: the payload's
	extra   int // bytes after the ICRC
	src     [4]byte
	dstMAC  *[6]byte // nil: the rig's (rigMACA)
	id      uint16
	ipLen   int // added to the IPv4 total length (with a correct ICRC for it)
	udpLen  int // added to the UDP length (likewise)
	ecn     uint8
}

func goodWrite(psn uint32, payload []byte) wframe {
	return wframe{opcode: bth.OpRCWriteOnly, qpn: rigQPN, psn: psn, va: rigVA + 16, rkey: rigRKey,
		payload: payload, ackReq: true, pkey: 0xFFFF, pad: -1, dmaLen: -1, src: rigPeer}
}

// frame builds f as an Ethernet frame: IPv4 (DF, TTL 64, ID f.id), UDP to 4791, BTH, RETH,
// payload, pad, a correct ICRC.
func (f wframe) frame() []byte {
	pad := f.pad
	if pad < 0 {
		pad = (4 - len(f.payload)%4) % 4
	}
	dma := f.dmaLen
	if dma < 0 {
		dma = len(f.payload)
	}
	n := fPayload + len(f.payload) + pad + 4
	b := make([]byte, n+f.extra)
	copy(b[0:6], rigMACA[:])
	if f.dstMAC != nil {
		copy(b[0:6], f.dstMAC[:])
	}
	copy(b[6:12], rigMACB[:])
	b[12], b[13] = 0x08, 0x00
	ip := b[14:34]
	ip[0], ip[1] = 0x45, 0x28|f.ecn
	binary.BigEndian.PutUint16(ip[2:], uint16(n-14+f.ipLen))
	binary.BigEndian.PutUint16(ip[4:], f.id)
	ip[6], ip[8], ip[9] = 0x40, 64, unix.IPPROTO_UDP
	copy(ip[12:16], f.src[:])
	copy(ip[16:20], rigLocal[:])
	ipChecksum(ip)
	binary.BigEndian.PutUint16(b[34:], 0xC022)
	binary.BigEndian.PutUint16(b[36:], link.UDPPort)
	binary.BigEndian.PutUint16(b[38:], uint16(n-34+f.udpLen))
	bth.BTH(b[fBTH:]).Encode(&bth.BTHFields{Opcode: f.opcode, PadCnt: uint8(pad), TVer: f.tver, PKey: f.pkey,
		DestQP: f.qpn, AckReq: f.ackReq, PSN: bth.PSN(f.psn)})
	bth.RETH(b[fRETH:]).Encode(&bth.RETHFields{VA: f.va, RKey: f.rkey, DMALen: uint32(dma)})
	copy(b[fPayload:], f.payload)
	var c uint32
	if f.ipLen == 0 && f.udpLen == 0 {
		var err error
		if c, err = bth.ICRCFromIP(b[14:n]); err != nil {
			panic(err)
		}
	} else { // lengths that disagree with the frame: the ICRC the sender would compute over them
		m := append(bytes.Repeat([]byte{0xff}, 8), b[14:n-4]...)
		for i := range m {
			if icrcMasked(i - 8 + 14) {
				m[i] = 0xff
			}
		}
		c = crc32.ChecksumIEEE(m)
	}
	bth.SetICRC(b[34+8:n], c)
	if f.extra > 0 { // the lengths take the bytes after the ICRC in
		binary.BigEndian.PutUint16(ip[2:], uint16(n+f.extra-14))
		binary.BigEndian.PutUint16(b[38:], uint16(n+f.extra-34))
		ipChecksum0(ip)
	}
	return b
}

// wantACK is the ACK the program must make of WRITE f, MSN msn.
func wantACK(f wframe, msn uint32) []byte { return ackFrame62(f.frame(), f.psn, msn) }

// memAt is the device memory the rig's MR maps at va, n bytes.
func (r *writeRig) memAt(va uint64, n int) []byte {
	off := xdpPage + int(va-rigVA)
	return r.w.memory[off : off+n]
}

func (r *writeRig) word() uint64 { return *(*uint64)(unsafe.Pointer(&r.w.state[r.st.slot*16])) }

// TestXDPWriteExecutes: a WRITE Only at the expected PSN is written to the device memory, the
// PSN and MSN advance, and the frame leaves as the ACK user space would send, with an ICRC
// that verifies. The next PSN goes the same way; no AckReq: written, dropped, no ACK.
func TestXDPWriteExecutes(t *testing.T) {
	r := newWriteRig(t, 100, 5)
	for i, size := range []int{8, 1, 3, 64} {
		payload := bytes.Repeat([]byte{byte(0xa0 + i)}, size)
		f := goodWrite(uint32(100+i), payload)
		v, out := r.run(t, f.frame())
		if v != xdpVerdictTx {
			t.Fatalf("size %d: verdict %d, want XDP_TX", size, v)
		}
		if want := wantACK(f, uint32(6+i)); !bytes.Equal(out, want) {
			t.Fatalf("size %d: ACK\n%x\nwant\n%x", size, out, want)
		}
		if got := r.memAt(f.va, size); !bytes.Equal(got, payload) {
			t.Fatalf("size %d: memory %x", size, got)
		}
		if r.memAt(f.va, size+1)[size] != 0 && size < 64 {
			t.Fatalf("size %d: wrote past the payload", size)
		}
		clear(r.memAt(f.va, size))
		if w := r.word(); w != uint64(101+i)|uint64(6+i)<<24 {
			t.Fatalf("size %d: word %#x", size, w)
		}
		if r.st.Executed() != uint64(i+1) {
			t.Fatalf("executed %d", r.st.Executed())
		}
	}
	f := goodWrite(104, []byte("no ack!!"))
	f.ackReq = false
	if v, _ := r.run(t, f.frame()); v != xdpVerdictDrop {
		t.Fatalf("no AckReq: verdict %d, want XDP_DROP", v)
	}
	if got := r.memAt(f.va, 8); string(got) != "no ack!!" || r.word() != 105|10<<24 {
		t.Fatalf("no AckReq: memory %q word %#x", got, r.word())
	}
	// a kernel rxe peer's IPv4 IDs count: the ICRC covers them
	f = goodWrite(105, []byte("rxe-id.."))
	f.id = 0x3c1f
	if v, _ := r.run(t, f.frame()); v != xdpVerdictTx {
		t.Fatalf("IPv4 ID %#x: verdict %d", f.id, v)
	}
	// to a broadcast MAC address: the ACK still leaves from the link's own
	f = goodWrite(106, []byte("bcast..."))
	f.dstMAC = &[6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if v, out := r.run(t, f.frame()); v != xdpVerdictTx || !bytes.Equal(out, wantACK(f, 12)) {
		t.Fatalf("broadcast destination: verdict %d, ACK %x", v, out)
	}
	// the last 64 bytes a page takes (the MR starts at device memory offset 4096: VA rigVA+4032
	// is page offset 4032)
	f = goodWrite(107, bytes.Repeat([]byte{0x77}, 64))
	f.va = rigVA + 4032
	if v, _ := r.run(t, f.frame()); v != xdpVerdictTx || !bytes.Equal(r.memAt(f.va, 64), f.payload) {
		t.Fatalf("64 bytes to the end of a page: verdict %d", v)
	}
	// an MR that ends where the device memory does: its last 64 bytes, and one byte past
	if err := r.l.AddWriteMR(0x5678, 1, 0x1000, xdpPage, 2*xdpPage); err != nil {
		t.Fatal(err)
	}
	f = goodWrite(108, bytes.Repeat([]byte{0x66}, 64))
	f.rkey, f.va = 0x5678, 0x1000+xdpPage-64
	if v, _ := r.run(t, f.frame()); v != xdpVerdictTx || !bytes.Equal(r.w.memory[3*xdpPage-64:], f.payload) {
		t.Fatalf("the device memory's last 64 bytes: verdict %d", v)
	}
	f = goodWrite(109, bytes.Repeat([]byte{0x55}, 64))
	f.rkey, f.va = 0x5678, 0x1000+xdpPage-63
	if v, _ := r.run(t, f.frame()); v != xdpVerdictPass {
		t.Fatalf("one byte past the MR and the device memory: verdict %d", v)
	}
}

// TestXDPWriteDeclines: whatever the program must not execute reaches the socket untouched
// (XDP_PASS here: the rig's XSKMAP is empty), memory and state unchanged.
func TestXDPWriteDeclines(t *testing.T) {
	r := newWriteRig(t, 7, 0)
	eight := []byte("12345678")
	cases := map[string]func(f *wframe){
		"duplicate PSN":      func(f *wframe) { f.psn = 6 },
		"PSN ahead":          func(f *wframe) { f.psn = 8 },
		"other QP":           func(f *wframe) { f.qpn = 0x12 },
		"other peer":         func(f *wframe) { f.src = [4]byte{198, 18, 9, 3} },
		"wrong R_Key":        func(f *wframe) { f.rkey = 0x1235 },
		"below the MR":       func(f *wframe) { f.va = rigVA - 1 },
		"past the MR":        func(f *wframe) { f.va = rigVA + 6000 - 7 },
		"VA wraps":           func(f *wframe) { f.va = ^uint64(0) - 3 },
		"crosses a page":     func(f *wframe) { f.va = rigVA + xdpPage - 4 },
		"WRITE First":        func(f *wframe) { f.opcode = bth.OpRCWriteFirst },
		"WRITE with imm":     func(f *wframe) { f.opcode = bth.OpRCWriteOnlyImm },
		"UC WRITE":           func(f *wframe) { f.opcode = bth.OpUCWriteOnly },
		"SEND":               func(f *wframe) { f.opcode = bth.OpRCSendOnly },
		"TVer 1":             func(f *wframe) { f.tver = 1 },
		"P_Key 0x8001":       func(f *wframe) { f.pkey = 0x8001 },
		"65 bytes":           func(f *wframe) { f.payload = make([]byte, 65) },
		"0 bytes":            func(f *wframe) { f.payload = nil },
		"DMA length longer":  func(f *wframe) { f.dmaLen = 12 },
		"DMA length shorter": func(f *wframe) { f.dmaLen = 4 },
		"pad 1":              func(f *wframe) { f.payload = []byte("1234567"); f.pad = 0 },
		"bytes after":        func(f *wframe) { f.extra = 4 },
		"short IP length":    func(f *wframe) { f.ipLen = -4 },
		"long IP length":     func(f *wframe) { f.ipLen = 4 },
		"short UDP length":   func(f *wframe) { f.udpLen = -4 },
		"long UDP length":    func(f *wframe) { f.udpLen = 4 },
		"marked CE":          func(f *wframe) { f.ecn = link.ECNCE },
	}
	for name, mod := range cases {
		f := goodWrite(7, eight)
		mod(&f)
		fr := f.frame()
		v, out := r.run(t, fr)
		if v != xdpVerdictPass || !bytes.Equal(out, fr) {
			t.Errorf("%s: verdict %d (frame changed: %v), want XDP_PASS untouched", name, v, !bytes.Equal(out, fr))
		}
	}
	// a wrong UDP checksum leaves the WRITE to user space, which drops it
	fr := goodWrite(7, eight).frame()
	partial := fold(onesSum(fr[26:34]) + 17 + uint64(len(fr)-34))
	right := ^fold(onesSum(fr[26:34]) + 17 + uint64(len(fr)-34) + onesSum(fr[34:]))
	for _, sum := range []uint16{1, partial + 1, right ^ 0x0010, right + 1} {
		withSum := append([]byte(nil), fr...)
		binary.BigEndian.PutUint16(withSum[40:], sum)
		if v, out := r.run(t, withSum); v != xdpVerdictPass || !bytes.Equal(out, withSum) {
			t.Errorf("UDP checksum %#04x (right %#04x, pseudo-header sum %#04x): verdict %d, want XDP_PASS untouched", sum, right, partial, v)
		}
	}
	// a bad ICRC, a flipped bit anywhere the ICRC covers unmasked
	for i := 14; i < len(fr); i++ {
		if icrcMasked(i) || (i >= 26 && i < 34) || i == fBTH || i == fBTH+1 {
			continue // masked, or the addresses and opcode (declined before the ICRC anyway)
		}
		bad := append([]byte(nil), fr...)
		bad[i] ^= 0x10
		if v, out := r.run(t, bad); v != xdpVerdictPass || !bytes.Equal(out, bad) {
			t.Fatalf("bit flipped at %d: verdict %d", i, v)
		}
	}
	// the masked fields do not count
	ok := append([]byte(nil), fr...)
	ok[15], ok[22], ok[fBTH+4] = link.ECNECT1, 7, 0xc0
	ipChecksum0(ok[14:34])
	// every truncation: declined
	for n := 0; n < len(fr); n++ {
		if n < 14 {
			continue // BPF_PROG_TEST_RUN takes an Ethernet header at least
		}
		if v, _ := r.run(t, fr[:n]); v != xdpVerdictPass {
			t.Fatalf("truncated to %d: verdict %d", n, v)
		}
	}
	if clear := make([]byte, 6000); !bytes.Equal(r.memAt(rigVA, 6000), clear) {
		t.Fatal("a declined WRITE touched the memory")
	}
	if r.word() != 7 || r.st.Executed() != 0 {
		t.Fatalf("word %#x executed %d", r.word(), r.st.Executed())
	}
	if v, _ := r.run(t, ok); v != xdpVerdictTx {
		t.Fatalf("masked fields changed: verdict %d, want XDP_TX", v)
	}
	// the pseudo-header's sum a local sender's socket leaves for checksum offload, and a right
	// checksum (a 3-byte payload: the pad in the sum), are executed
	next := goodWrite(8, eight).frame()
	binary.BigEndian.PutUint16(next[40:], fold(onesSum(next[26:34])+17+uint64(len(next)-34)))
	if v, _ := r.run(t, next); v != xdpVerdictTx {
		t.Fatalf("a local sender's partial UDP checksum: verdict %d, want XDP_TX", v)
	}
	next = goodWrite(9, []byte("abc")).frame()
	binary.BigEndian.PutUint16(next[40:], ^fold(onesSum(next[26:34])+17+uint64(len(next)-34)+onesSum(next[34:])))
	if v, _ := r.run(t, next); v != xdpVerdictTx {
		t.Fatalf("a right UDP checksum: verdict %d, want XDP_TX", v)
	}
}

// ipChecksum0 recomputes an IPv4 header's checksum.
func ipChecksum0(h []byte) {
	h[10], h[11] = 0, 0
	ipChecksum(h)
}

// TestXDPWritePause: a paused QP's WRITEs go to user space; Resume with a new PSN lets the
// program in at that PSN; RemoveWriteQP and RemoveWriteMR take them out.
func TestXDPWritePause(t *testing.T) {
	r := newWriteRig(t, 50, 3)
	psn, msn := r.st.Pause()
	if psn != 50 || msn != 3 {
		t.Fatalf("Pause: %d %d", psn, msn)
	}
	f := goodWrite(50, []byte("paused.."))
	if v, _ := r.run(t, f.frame()); v != xdpVerdictPass {
		t.Fatalf("paused: verdict %d", v)
	}
	r.st.Resume(51, 4, false) // user space executed 50
	if v, _ := r.run(t, f.frame()); v != xdpVerdictPass {
		t.Fatalf("50 again after resume at 51: verdict %d", v)
	}
	f = goodWrite(51, []byte("resumed!"))
	if v, out := r.run(t, f.frame()); v != xdpVerdictTx || !bytes.Equal(out, wantACK(f, 5)) {
		t.Fatalf("resumed: verdict %d", v)
	}
	r.l.RemoveWriteMR(rigRKey)
	if v, _ := r.run(t, goodWrite(52, []byte("no mr...")).frame()); v != xdpVerdictPass {
		t.Fatalf("MR removed: verdict %d", v)
	}
	if err := r.l.AddWriteMR(rigRKey, 2, rigVA, 6000, xdpPage); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.run(t, goodWrite(52, []byte("other pd")).frame()); v != xdpVerdictPass {
		t.Fatalf("MR of another PD: verdict %d", v)
	}
	if err := r.l.AddWriteMR(rigRKey, 1, rigVA, 6000, xdpPage); err != nil {
		t.Fatal(err)
	}
	r.l.RemoveWriteQP(r.st)
	if v, _ := r.run(t, goodWrite(52, []byte("no qp...")).frame()); v != xdpVerdictPass {
		t.Fatalf("QP removed: verdict %d", v)
	}
	if err := r.l.AddWriteMR(rigRKey, 1, rigVA, 1<<20, 0); err == nil {
		t.Fatal("an MR larger than the device memory was accepted")
	}
}

var (
	fuzzRigOnce sync.Once
	fuzzRig     *writeRig
)

// FuzzXDPWrite: frames are remote input. The program's verdict, the device memory and the
// QP's word after any frame agree with a model written from pkg/bth (not from the program's
// generator): it executes exactly the valid RC WRITE Only requests of 1..64 bytes at the
// expected PSN to the rig's MR, within a page, and touches nothing else. fix makes the frame's
// PSN the expected one and its ICRC correct (over its own lengths), so mutations reach the
// checks behind them.
func FuzzXDPWrite(f *testing.F) {
	for i, n := range []int{1, 8, 64, 3} {
		g := goodWrite(100, bytes.Repeat([]byte{byte(i)}, n))
		g.ackReq = i != 3
		f.Add(g.frame(), true)
		f.Add(g.frame(), false)
	}
	g := goodWrite(100, []byte("12345678"))
	g.va = rigVA + 4090
	f.Add(g.frame(), true)
	f.Add(make([]byte, 14), false)
	f.Fuzz(func(t *testing.T, frame []byte, fix bool) {
		fuzzRigOnce.Do(func() { fuzzRig = openWriteRig(t, 100, 0) }) // kept for the process
		r := fuzzRig
		if r == nil || len(frame) < 14 || len(frame) > 1500 {
			return
		}
		frame = append([]byte(nil), frame...)
		word := r.word()
		if fix && len(frame) >= fPayload+4 {
			psn := uint32(word & wordPSN)
			frame[fBTH+9], frame[fBTH+10], frame[fBTH+11] = byte(psn>>16), byte(psn>>8), byte(psn)
			if c, err := bth.ICRCFromIP(frame[14:]); err == nil {
				if tot := int(binary.BigEndian.Uint16(frame[16:])); tot >= 28+4 && 14+tot <= len(frame) {
					bth.SetICRC(frame[34+8:14+tot], c)
				}
			}
		}
		before := append([]byte(nil), r.w.memory...)
		exec, off, payload, ackReq := modelWrite(frame, word)
		v, out := r.run(t, frame)
		after := r.w.memory
		switch {
		case !exec && v != xdpVerdictPass:
			t.Fatalf("verdict %d for a frame the model leaves to user space:\n%x", v, frame)
		case exec && ackReq && v != xdpVerdictTx, exec && !ackReq && v != xdpVerdictDrop:
			t.Fatalf("verdict %d for a WRITE the model executes (AckReq %v):\n%x", v, ackReq, frame)
		}
		if exec {
			copy(before[off:], payload)
		}
		if !bytes.Equal(before, after) {
			t.Fatalf("device memory differs from the model's (executed %v at %d)", exec, off)
		}
		wantWord := word
		if exec {
			wantWord = (word+1)&wordPSN | ((word>>24+1)&wordPSN)<<24
		}
		if got := r.word(); got != wantWord {
			t.Fatalf("word %#x, want %#x", got, wantWord)
		}
		if v == xdpVerdictTx {
			psn := uint32(word & wordPSN)
			if want := ackFrame62(frame, psn, uint32(wantWord>>24)); !bytes.Equal(out, want) {
				t.Fatalf("ACK\n%x\nwant\n%x", out, want)
			}
		}
	})
}

// modelWrite decides, from pkg/bth, whether the rig's program must execute frame with the
// QP's word as given: where the payload goes (device memory offset) and whether an ACK is due.
func modelWrite(frame []byte, word uint64) (exec bool, off int, payload []byte, ackReq bool) {
	n := len(frame)
	if n < fPayload+4 || frame[12] != 0x08 || frame[13] != 0 || frame[14] != 0x45 || frame[23] != unix.IPPROTO_UDP ||
		binary.BigEndian.Uint16(frame[20:])&0x3fff != 0 || [4]byte(frame[30:34]) != rigLocal ||
		binary.BigEndian.Uint16(frame[36:]) != link.UDPPort || [4]byte(frame[26:30]) != rigPeer || frame[15]&link.ECNMask == link.ECNCE ||
		int(binary.BigEndian.Uint16(frame[16:])) != n-14 || int(binary.BigEndian.Uint16(frame[38:])) != n-34 {
		return
	}
	// UDP checksum none, the pseudo-header's sum (a local sender's, for offload) or right
	if c := binary.BigEndian.Uint16(frame[40:]); c != 0 && !udp4ChecksumOK(frame[26:34], frame[34:]) {
		return
	}
	b := bth.BTH(frame[fBTH:])
	re := bth.RETH(frame[fRETH:])
	l := int(re.DMALen())
	pad := int(b.PadCnt())
	if b.Opcode() != bth.OpRCWriteOnly || b.TVer() != 0 || b.DestQP() != rigQPN || b.PKey()&0x7fff != 0x7fff ||
		l < 1 || l > 64 || pad != (4-l%4)%4 || n != fPayload+l+pad+4 || uint32(b.PSN()) != uint32(word&wordPSN) ||
		word>>48 != 0 {
		return
	}
	if c, err := bth.ICRCFromIP(frame[14:]); err != nil || c != bth.GetICRC(frame[34+8:]) {
		return
	}
	var mrVA, mrLen, mrOff uint64
	switch re.RKey() {
	case rigRKey:
		mrVA, mrLen, mrOff = rigVA, 6000, xdpPage
	default:
		return
	}
	va := re.VA()
	if va < mrVA || va-mrVA > mrLen || uint64(l) > mrLen-(va-mrVA) {
		return
	}
	dev := mrOff + (va - mrVA)
	if dev%xdpPage > xdpPage-64 {
		return
	}
	return true, int(dev), frame[fPayload : fPayload+l], b.AckReq()
}

// ackFrame62 is the ACK the program must send for request frame (PSN psn, new MSN msn).
func ackFrame62(req []byte, psn, msn uint32) []byte {
	b := make([]byte, ackFrame)
	copy(b[0:6], req[6:12])
	copy(b[6:12], rigMACA[:])
	b[12], b[13] = 0x08, 0x00
	ip := b[14:34]
	ip[0], ip[1] = 0x45, 0x28
	binary.BigEndian.PutUint16(ip[2:], ackFrame-14)
	ip[6], ip[8], ip[9] = 0x40, 64, unix.IPPROTO_UDP
	copy(ip[12:16], rigLocal[:])
	copy(ip[16:20], rigPeer[:])
	ipChecksum(ip)
	binary.BigEndian.PutUint16(b[34:], 0xC011)
	binary.BigEndian.PutUint16(b[36:], link.UDPPort)
	binary.BigEndian.PutUint16(b[38:], ackFrame-34)
	bth.BTH(b[fBTH:]).Encode(&bth.BTHFields{Opcode: bth.OpRCAck, PKey: 0xFFFF, DestQP: rigDestQPN, PSN: bth.PSN(psn)})
	bth.AETH(b[fBTH+12:]).Encode(&bth.AETHFields{Syndrome: bth.SyndromeACK(0x1F), MSN: msn})
	c, err := bth.ICRCFromIP(b[14:])
	if err != nil {
		panic(err)
	}
	bth.SetICRC(b[42:], c)
	return b
}

// TestXDPWriteLayout: what the Go side assumes of the program's maps (xdp.c) holds: as many
// QP slots as page 0 has 16-byte words, page-sized device memory, the tables' values the
// generated types.
func TestXDPWriteLayout(t *testing.T) {
	spec, err := loadXdp()
	if err != nil {
		t.Fatal(err)
	}
	if m := spec.Maps[xdpMapQps]; m.MaxEntries != xdpWriteSlots || m.ValueSize != uint32(binary.Size(xdpQpEntry{})) {
		t.Errorf("QP table: %d entries of %d bytes, want %d of %d", m.MaxEntries, m.ValueSize, xdpWriteSlots, binary.Size(xdpQpEntry{}))
	}
	if m := spec.Maps[xdpMapMrs]; m.ValueSize != uint32(binary.Size(xdpMrEntry{})) || m.KeySize != 4 {
		t.Errorf("MR table: %d-byte keys, %d-byte values", m.KeySize, m.ValueSize)
	}
	if m := spec.Maps[xdpMapMem]; m.ValueSize != xdpPage || xdpWriteSlots*16 != xdpPage {
		t.Errorf("device memory: %d-byte pages, %d slots", m.ValueSize, xdpWriteSlots)
	}
}
