package afxdp

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"golang.org/x/sys/unix"
)

// TestXDPPairs: A (AF_XDP, on a veth) sends engine-style runs of two — segment 1's ICRC for
// IPv4 ID 1 — through SendRuns to B, a plain UDP link. Where the kernel takes GSO in a
// virtio-net header (6.2+) each leaves as one AF_PACKET frame: B's socket gets both
// datagrams, intact; and with A's veth made to leave UDP segmentation to the kernel
// (tx-udp-segmentation off, so the kernel cuts the frame before the veth) a sniffer on B's interface sees two packets whose
// IDs are 0 and 1 and whose ICRCs verify over the real headers (IBTA A17.3.3). When the kernel
// refuses (an older kernel, or a refusal injected here) the pair leaves as two ring frames,
// the second's ICRC rewritten for ID 0, and pairs stay off.
func TestXDPPairs(t *testing.T) {
	x, y := netnstest.Veth(t, "srpra", "198.18.9.1/24", "srprb", "198.18.9.2/24", 1500)
	aIP, bIP := netip.MustParseAddr("198.18.9.1"), netip.MustParseAddr("198.18.9.2")
	a := listenXDPIn(t, x, aIP, Options{})
	defer a.Close()
	b, sniff := listenSniffed(t, y, bIP, "srprb")
	defer b.Close()
	defer unix.Close(sniff)
	aAP, bAP := netip.AddrPortFrom(aIP, link.UDPPort), netip.AddrPortFrom(bIP, link.UDPPort)
	if !a.PairGSO(aIP) {
		t.Fatal("PairGSO false on a veth's AF_XDP link")
	}

	// B -> A until A hears it: A learns B's MAC
	pa := newPollBatch(8)
	for try := 0; ; try++ {
		if err := b.Send(mkRun(bAP, aAP, 1, 64, 64, 1)); err != nil {
			t.Fatal(err)
		}
		if n, _ := tryRecvFor(a, pa, 10*time.Millisecond); n > 0 {
			break
		}
		if try == 200 {
			t.Fatal("A heard nothing from B")
		}
	}
	drain := func() {
		buf := make([]byte, 70000)
		for {
			if _, _, err := unix.Recvfrom(sniff, buf, unix.MSG_DONTWAIT); err != nil {
				return
			}
		}
	}
	drain()
	sendPair := func(seed byte) (sent, orig []link.Datagram) {
		t.Helper()
		sent = mkRun(aAP, bAP, 2, 40, 20, seed) // a WRITE's and an ACK's lengths
		for _, d := range sent {
			orig = append(orig, link.Datagram{Buf: slices.Clone(d.Buf), Src: d.Src, Dst: d.Dst})
		}
		if err := a.SendRuns(sent, []uint8{2}); err != nil {
			t.Fatal(err)
		}
		r := recvN(t, b, 2, 8)
		for k := range r {
			if r[k].Src != aAP || !bytes.Equal(r[k].Buf, sent[k].Buf) {
				t.Fatalf("B's datagram %d: %d bytes from %v, want the pair's %d from %v", k, len(r[k].Buf), r[k].Src, len(sent[k].Buf), aAP)
			}
		}
		return sent, orig
	}

	// Linux 6.2+ takes the frame; an older kernel refuses it (unless it has the feature
	// backported), and pairs are then off: the pair went as two ring frames
	sendPair(3)
	pairsWork := statsOf(a).XDPPairsOff == 0
	if !pairsWork && netnstest.KernelAtLeast(t, 6, 2) {
		t.Fatalf("A stats %+v: pairs refused on Linux 6.2 or later", statsOf(a))
	}
	if !pairsWork {
		if st := statsOf(a); st.XDPPairs != 0 || st.XDPPairsOff != 1 || st.XDPSent != 2 || a.PairGSO(aIP) {
			t.Fatalf("A stats %+v: want pairs refused once and off, the pair as two ring frames", st)
		}
	}
	if pairsWork {
		if st := statsOf(a); st.XDPPairs != 1 || st.XDPPairsOff != 0 || st.XDPSent != 2 || st.Sent != 2 {
			t.Fatalf("A stats %+v: want one pair as one frame", st)
		}
		drain() // B's interface saw the pair as one GSO packet (cut by B's UDP receive)
		if err := x.Do(func() error { return setFeature("srpra", "tx-udp-segmentation", false) }); err != nil {
			t.Fatal(err)
		}
		sent, orig := sendPair(4)
		w, err := readMatching(sniff, true, aAP, bAP, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkWire(w, sent, func(k int) uint16 { return uint16(k) }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(sent[1].Buf, orig[1].Buf) {
			t.Fatal("a pair sent as one frame had its buffers rewritten")
		}
		if st := statsOf(a); st.XDPPairs != 2 || st.XDPSent != 4 {
			t.Fatalf("A stats %+v: want two pairs", st)
		}
	}

	if pairsWork { // a passing failure (ENOBUFS): that pair as frames, pairs stay on
		pairSendErr = func() unix.Errno { return unix.ENOBUFS }
		st0 := statsOf(a)
		drain()
		sent, _ := sendPair(7)
		pairSendErr = nil
		w, err := readMatching(sniff, true, aAP, bAP, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkWire(w, sent, func(int) uint16 { return 0 }); err != nil {
			t.Fatal(err)
		}
		if st := statsOf(a); st.XDPPairs != st0.XDPPairs || st.XDPPairsOff != 0 || st.XDPSent != st0.XDPSent+2 || !a.PairGSO(aIP) {
			t.Fatalf("A stats %+v after ENOBUFS: want that pair as frames, pairs still on", st)
		}
		sendPair(8)
		if st := statsOf(a); st.XDPPairs != st0.XDPPairs+1 {
			t.Fatalf("A stats %+v: the next pair did not go as one frame", st)
		}
	}

	// refused: for good; the pair as two ring frames with ID 0 and ICRCs for it
	calls := 0
	pairSendErr = func() unix.Errno { calls++; return unix.EINVAL }
	defer func() { pairSendErr = nil }()
	st0 := statsOf(a)
	drain()
	sent, _ := sendPair(5)
	w, err := readMatching(sniff, true, aAP, bAP, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkWire(w, sent, func(int) uint16 { return 0 }); err != nil {
		t.Fatal(err)
	}
	ep := bth.Endpoints{Src: aIP, Dst: bIP, SrcPort: link.UDPPort, DstPort: link.UDPPort}
	if bth.GetICRC(sent[1].Buf) != bth.ICRC(&ep, sent[1].Buf) {
		t.Fatal("the second datagram's ICRC was not rewritten for IPv4 ID 0")
	}
	wantCalls := 1
	if !pairsWork {
		wantCalls = 0 // already off
	}
	st := statsOf(a)
	if calls != wantCalls || st.XDPPairsOff != 1 || st.XDPPairs != st0.XDPPairs || st.XDPSent != st0.XDPSent+2 || a.PairGSO(aIP) {
		t.Fatalf("A stats %+v (%d injected refusals, want %d): want pairs off for good, the pair through the ring", st, calls, wantCalls)
	}
	sendPair(6) // off: ring frames without asking again
	if calls != wantCalls || statsOf(a).XDPSent != st0.XDPSent+4 {
		t.Fatalf("after the refusal: %d pair sends tried, stats %+v", calls, statsOf(a))
	}
}

// setFeature turns the named offload feature of interface name on or off (the ethtool
// ioctls: the feature strings' index, then ETHTOOL_SFEATURES), in the calling thread's
// namespace.
func setFeature(name, feature string, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	type ifreq struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	ioctl := func(data unsafe.Pointer) error {
		var r ifreq
		copy(r.name[:], name)
		r.data = data
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&r))); e != 0 {
			return e
		}
		return nil
	}
	const ssFeatures = 4     // ETH_SS_FEATURES
	const ethGStringLen = 32 // ETH_GSTRING_LEN
	info := struct {
		cmd, _ uint32
		mask   uint64
		count  uint32
	}{cmd: unix.ETHTOOL_GSSET_INFO, mask: 1 << ssFeatures}
	if err := ioctl(unsafe.Pointer(&info)); err != nil {
		return err
	}
	n := int(info.count)
	strs := make([]byte, 12+n*ethGStringLen)
	*(*[3]uint32)(unsafe.Pointer(&strs[0])) = [3]uint32{unix.ETHTOOL_GSTRINGS, ssFeatures, uint32(n)}
	if err := ioctl(unsafe.Pointer(&strs[0])); err != nil {
		return err
	}
	bit := -1
	for i := range n {
		if unix.ByteSliceToString(strs[12+i*ethGStringLen:12+(i+1)*ethGStringLen]) == feature {
			bit = i
		}
	}
	if bit < 0 {
		return unix.ENOENT
	}
	words := (n + 31) / 32
	set := make([]uint32, 2+2*words) // cmd, size, {valid, requested} per 32 features
	set[0], set[1] = unix.ETHTOOL_SFEATURES, uint32(words)
	set[2+2*(bit/32)] = 1 << (bit % 32)
	if on {
		set[3+2*(bit/32)] = 1 << (bit % 32)
	}
	return ioctl(unsafe.Pointer(&set[0]))
}
