//go:build interop

package interop

// The IBTA 1.5 memory placement operations (RDMA ATOMIC WRITE 0x1D, FLUSH 0x1C; IBTA Vol. 1
// release 1.5, Annex A19) between softroce's engine (pkg/roce, opened in the lab netns) and
// kernel rxe, through the libibverbs peer test/interop/placement (built on the host into the
// lab share, run in the guest on rxe0):
//
//   - softroce->rxe: the peer (Debian 12's rdma-core 44) serves a 4096-byte region registered
//     with IBV_ACCESS_FLUSH_GLOBAL; softroce's requester places a WRITE, ATOMIC WRITEs and
//     global FLUSHes of both selectivity levels into it, reads back a placed word, and ends
//     with a range FLUSH outside the region that rxe must refuse (remote access error) where
//     the same request at the Memory Region level succeeded. The region the peer prints is
//     then compared byte for byte with what the sequence placed.
//   - rxe->softroce: softroce serves the same region (AccessFlushGlobal on the MR and the QP)
//     to the peer's client, built against Debian 13's rdma-core 56 (the first with
//     ibv_wr_flush; placementFlushPeer), whose WRITE, FLUSHes of both levels, ATOMIC WRITEs
//     and READs must all complete successfully; the region is compared byte for byte.
//
// rxe up to at least 6.12 computes a FLUSH's ICRC over its headers twice (rocetest.RxeFlushICRC)
// and drops a FLUSH carrying the one IBTA A17.3.3 defines (the conformance scenario
// rc-flush-icrc shows it). softroce accepts either on receive, and sends rxe's with
// roce.Options.RxeFlushICRC, which the softroce->rxe pairing sets.
// The tap capture is checked packet by packet (ICRC over the real IP header, rxe's variant
// on every FLUSH; each ATOMIC WRITE and FLUSH answered by an RDMA READ Response Only with an
// ACK AETH and no payload at its PSN, IBTA A19.4.1-A19.4.2) and through `softroce decode`.
//
// The lab's reference kernel (6.1) predates both operations: the pairings skip unless rxe0
// reports ATOMIC_WRITE and FLUSH_GLOBAL (device_cap_flags_ex bits 40 and 38), i.e. they run
// with RXE_LAB_TARGET=6.12 scripts/interop -run 'TestInterop/placement'.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/roce"
	conformlab "github.com/softroce/softroce/test/conform"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	pairings = append(pairings,
		pairing{Name: "placement", Direction: SoftroceToRxe, Run: placementToRxe},
		pairing{Name: "placement", Direction: RxeToSoftroce, Run: placementFromRxe},
	)
}

const (
	// plRegion is the peer's region size; plPort its TCP port (placement.c's defaults).
	plRegion = 4096
	plPort   = 18516
	// plBin is the peer's name in the lab share (/mnt/host in the guest).
	plBin = "softroce-placement"
	// device_cap_flags_ex bits (IB_DEVICE_FLUSH_GLOBAL, IB_DEVICE_ATOMIC_WRITE; qp.DevCap*).
	capFlushGlobal = uint64(qp.DevCapFlushGlobal)
	capAtomicWrite = uint64(qp.DevCapAtomicWrite)
)

// plPattern is the peer's initial region: byte i = i*7+3.
func plPattern() []byte {
	b := make([]byte, plRegion)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

var (
	plCapOnce sync.Once
	plCapErr  string // why the pairings skip; empty: the guest's rxe0 has both operations
	plBuilt   string
	plBuildE  error
)

var capFlagsExRe = regexp.MustCompile(`device_cap_flags_ex:\s*0x([0-9A-Fa-f]+)`)

// placementReady skips the test unless rxe0 has ATOMIC WRITE and FLUSH (global), then builds
// the peer into the lab share (once per test binary) and returns its guest path.
func placementReady(t *testing.T, lab *rxelab.Lab) string {
	t.Helper()
	plCapOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, st, err := lab.Exec(ctx, "uname -r; ibv_devinfo -v -d "+rxelab.GuestDev, rxelab.ExecOptions{Timeout: 30 * time.Second})
		if err != nil || st != 0 {
			plCapErr = fmt.Sprintf("ibv_devinfo in the guest: %v (status %d): %s", err, st, out)
			return
		}
		kver, _, _ := strings.Cut(string(out), "\n")
		m := capFlagsExRe.FindSubmatch(out)
		if m == nil {
			plCapErr = "kernel " + kver + ": ibv_devinfo prints no device_cap_flags_ex"
			return
		}
		flags, _ := strconv.ParseUint(string(m[1]), 16, 64)
		if want := capFlushGlobal | capAtomicWrite; flags&want != want {
			plCapErr = fmt.Sprintf("kernel %s: rxe0's device_cap_flags_ex %#x lacks ATOMIC_WRITE/FLUSH_GLOBAL (bits 40, 38); run with RXE_LAB_TARGET=6.12 (docs/lab.md)", kver, flags)
			return
		}
		share := conformlab.ShareDir()
		if err := os.MkdirAll(share, 0o755); err != nil {
			plBuildE = err
			return
		}
		out2 := filepath.Join(share, plBin)
		b, err := exec.CommandContext(ctx, filepath.Join("placement", "build"), out2+".tmp").CombinedOutput()
		if err != nil {
			plBuildE = fmt.Errorf("build the placement peer: %v: %s", err, b)
			return
		}
		plBuildE = os.Rename(out2+".tmp", out2)
		plBuilt = "stdbuf -oL /mnt/host/" + plBin
	})
	if plCapErr != "" {
		t.Skip(plCapErr)
	}
	if plBuildE != nil {
		t.Fatal(plBuildE)
	}
	return plBuilt
}

var (
	plFlushOnce sync.Once
	plFlushCmd  string
	plFlushErr  error
)

// plTrixieRoot is the FLUSH-capable peer's root in the lab share (build-flush).
const plTrixieRoot = "softroce-trixie"

// placementFlushPeer builds the FLUSH-capable peer (test/interop/placement/build-flush:
// placement.c with -DPLACEMENT_FLUSH against Debian 13's rdma-core 56, in a minimal trixie
// root) into the lab share, once per test binary, and returns the guest command that runs it:
// in a private mount namespace, the root gets the guest's /dev, /sys and /proc and the peer
// runs chrooted there, so that trixie's libibverbs and rxe provider drive the guest's rxe0.
func placementFlushPeer(t *testing.T) string {
	t.Helper()
	plFlushOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		root := filepath.Join(conformlab.ShareDir(), plTrixieRoot)
		b, err := exec.CommandContext(ctx, filepath.Join("placement", "build-flush"), root).CombinedOutput()
		if err != nil {
			plFlushErr = fmt.Errorf("build the FLUSH-capable placement peer (needs deb.debian.org once, then its cache): %v: %s", err, b)
			return
		}
		r := "/mnt/host/" + plTrixieRoot
		plFlushCmd = fmt.Sprintf(`unshare -m sh -c 'mount -o bind /dev %[1]s/dev && mount -o bind /sys %[1]s/sys && mount -t proc proc %[1]s/proc && exec chroot %[1]s /placement "$@"' placement`, r)
	})
	if plFlushErr != nil {
		t.Fatal(plFlushErr)
	}
	return plFlushCmd
}

// plPeer is one side's line of the peer's TCP exchange: "QPN PSN GID VA RKEY" (hex, the GID
// as 32 hex digits).
type plPeer struct {
	QPN, PSN, RKey uint32
	GID            netip.Addr
	VA             uint64
}

func (p plPeer) line() string {
	g := p.GID.As16()
	return fmt.Sprintf("%06x %06x %s %016x %08x\n", p.QPN, p.PSN, hex.EncodeToString(g[:]), p.VA, p.RKey)
}

func parsePlPeer(s string) (plPeer, error) {
	f := strings.Fields(s)
	if len(f) != 5 || len(f[2]) != 32 {
		return plPeer{}, fmt.Errorf("peer line %q: want QPN PSN GID VA RKEY", s)
	}
	var p plPeer
	var v [4]uint64
	for i, k := range []int{0, 1, 3, 4} {
		x, err := strconv.ParseUint(f[k], 16, 64)
		if err != nil {
			return plPeer{}, fmt.Errorf("peer line %q: %v", s, err)
		}
		v[i] = x
	}
	g, err := hex.DecodeString(f[2])
	if err != nil {
		return plPeer{}, fmt.Errorf("peer line %q: %v", s, err)
	}
	p.QPN, p.PSN, p.VA, p.RKey = uint32(v[0]), uint32(v[1]), v[2], uint32(v[3])
	p.GID = netip.AddrFrom16([16]byte(g))
	return p, nil
}

// plSide is softroce's end: a device in the lab netns, one RC QP, one CQ, one region.
type plSide struct {
	t   *testing.T
	dev *roce.Device
	q   *roce.QP
	scq *cq.CQ
	m   *mr.MR
	buf []byte
}

const plIOVA = 0x7f0000100000 // our region's iova (what we tell the peer as VA)

// openPlSide opens softroce's end; rxeFlush: its FLUSHes carry kernel rxe's ICRC
// (roce.Options.RxeFlushICRC), which rxe needs to answer them.
func openPlSide(t *testing.T, lab *rxelab.Lab, size int, access mr.Access, rxeFlush bool) *plSide {
	t.Helper()
	s := &plSide{t: t, buf: make([]byte, size)}
	if err := lab.InNetns(func() error {
		var err error
		s.dev, err = roce.OpenUDP(roce.UDPOptions{Addrs: []netip.Addr{hostIP}, MTU: qp.MTU1024, Name: "softroce0", RxeFlushICRC: rxeFlush})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.dev.Close() })
	pd, err := s.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if s.scq, err = s.dev.CreateCQ(32); err != nil {
		t.Fatal(err)
	}
	if s.m, err = s.dev.RegMR(pd, s.buf, plIOVA, access); err != nil {
		t.Fatal(err)
	}
	s.q, err = s.dev.CreateQP(roce.QPInit{Type: qp.TypeRC, PD: pd, SendCQ: s.scq, RecvCQ: s.scq,
		Cap: qp.Cap{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.q.Modify(&qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: access &^ mr.AccessLocalWrite},
		qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *plSide) me(psn uint32) plPeer {
	return plPeer{QPN: s.q.Num(), PSN: psn, GID: gidOf(hostIP), VA: s.m.IOVA(), RKey: s.m.RKey()}
}

// up takes the QP to RTS against the peer (placement.c's to_rts values, a longer ACK timeout:
// rxe on 6.12 under TCG answers slowly).
func (s *plSide) up(mine, theirs plPeer) error {
	if err := s.q.Modify(&qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: theirs.GID, SGIDIndex: uint8(s.dev.GIDIndex(hostIP)), Port: 1, HopLimit: 64},
		PathMTU: qp.MTU1024, DestQPN: theirs.QPN, RQPSN: theirs.PSN, MaxDestRDAtomic: 4, MinRNRTimer: 12},
		qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRDAtomic|qp.AttrMinRNRTimer); err != nil {
		return err
	}
	return s.q.Modify(&qp.Attr{State: qp.StateRTS, SQPSN: mine.PSN, Timeout: 17, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 4},
		qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRDAtomic)
}

// post posts one signaled WR and waits for its completion; false (reported) if it was not
// posted or did not complete by deadline.
func (s *plSide) post(wr qp.SendWR, deadline time.Time) (cq.WC, bool) {
	s.t.Helper()
	wr.Flags |= qp.SendSignaled
	if _, err := s.q.PostSend([]qp.SendWR{wr}); err != nil {
		s.t.Errorf("post %v: %v", wr.Opcode, err)
		return cq.WC{}, false
	}
	wcs := make([]cq.WC, 1)
	for {
		if s.scq.Poll(wcs) == 1 {
			return wcs[0], true
		}
		_ = s.scq.ReqNotify(false)
		if s.scq.Poll(wcs) == 1 {
			return wcs[0], true
		}
		select {
		case <-s.scq.Channel():
		case <-time.After(time.Until(deadline)):
			s.t.Errorf("no completion for %v (wr_id %d); QP %v, counters %v", wr.Opcode, wr.WRID, s.q.State(), s.dev.Stats().Map())
			return cq.WC{}, false
		}
	}
}

func (s *plSide) sge(off, n int) []qp.SGE {
	return []qp.SGE{{Addr: s.m.IOVA() + uint64(off), Length: uint32(n), LKey: s.m.LKey()}}
}

// plStartPeer starts the peer in the guest (run: the command up to its options, as
// placementReady or placementFlushPeer return it; args after -d/-g/-p) and, for the server,
// waits for its listening line. The job is killed on cleanup unless waited for.
func plStartPeer(t *testing.T, lab *rxelab.Lab, run, args, ready string) *guestJob {
	t.Helper()
	cmd := fmt.Sprintf("exec %s -d %s -g %d -p %d %s", run, rxelab.GuestDev, rxelab.GuestGIDIndex, plPort, args)
	job, err := lab.ExecBG(context.Background(), cmd, rxelab.ExecOptions{Timeout: 90 * time.Second})
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	g := &guestJob{job: job}
	t.Cleanup(func() {
		if !g.waited {
			_ = job.Kill()
			out, st, _ := job.Wait(context.Background())
			t.Logf("guest placement (killed) status %d:\n%s", st, out)
		}
	})
	if ready != "" {
		if err := waitGuestLine(context.Background(), job, ready); err != nil {
			out, _ := job.Log()
			t.Fatalf("guest placement: %v:\n%s", err, out)
		}
	}
	return g
}

// plWaitPeer waits for the peer to exit and returns its output; a status other than 0 fails.
func plWaitPeer(t *testing.T, g *guestJob) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, st, err := g.job.Wait(ctx)
	g.waited = true
	if err != nil {
		t.Fatalf("guest placement: %v", err)
	}
	t.Logf("guest placement (exit %d):\n%s", st, out)
	if st != 0 {
		t.Errorf("guest placement exit status %d, want 0", st)
	}
	return string(out)
}

var plMemRe = regexp.MustCompile(`(?m)^mem ([0-9a-f]{4}) ([0-9a-f]{128})$`)

// plRegionOf is the region the peer's server printed (64 lines "mem OFFSET HEX").
func plRegionOf(out string) ([]byte, error) {
	lines := plMemRe.FindAllStringSubmatch(out, -1)
	if len(lines) != plRegion/64 {
		return nil, fmt.Errorf("the peer printed %d region lines, want %d", len(lines), plRegion/64)
	}
	b := make([]byte, plRegion)
	for i, l := range lines {
		off, _ := strconv.ParseUint(l[1], 16, 32)
		if int(off) != i*64 {
			return nil, fmt.Errorf("region line %d has offset %#x", i, off)
		}
		if _, err := hex.Decode(b[off:off+64], []byte(l[2])); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// plCompare reports the first differing bytes of a region against the expected image.
func plCompare(t *testing.T, who string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		t.Logf("%s: all %d bytes as expected", who, len(want))
		return
	}
	n := 0
	for i := range want {
		if got[i] != want[i] {
			if n++; n <= 8 {
				t.Errorf("%s: byte %#x = %#02x, want %#02x", who, i, got[i], want[i])
			}
		}
	}
	t.Errorf("%s: %d bytes differ", who, n)
}

// plWords are the ATOMIC WRITE words of the softroce->rxe sequence.
const (
	plW1 = 0x1122334455667788
	plW2 = 0x0102030405060708
	plW3 = 0xdeadbeefcafef00d
)

// placementToRxe: softroce's requester against rxe's responder (see the file comment).
func placementToRxe(t *testing.T, lab *rxelab.Lab) {
	bin := placementReady(t, lab)
	stopCapture := plStartCapture(t, lab)
	deadline := time.Now().Add(120 * time.Second)
	// our buffer: [0, 300) the WRITE's data, [512, 536) the ATOMIC WRITE words, [1024, 1040)
	// the READ's landing area
	s := openPlSide(t, lab, 4096, mr.AccessLocalWrite, true)
	g := plStartPeer(t, lab, bin, "", "placement: listening")
	conn := dialInNetns(t, lab, net.JoinHostPort(rxelab.GuestIP, strconv.Itoa(plPort)), deadline)
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	mine := s.me(0x00abcd)
	if _, err := conn.Write([]byte(mine.line())); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	l, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("the peer's line: %v", err)
	}
	theirs, err := parsePlPeer(strings.TrimSpace(l))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.up(mine, theirs); err != nil {
		t.Fatal(err)
	}

	want := plPattern()
	for k := 0; k < 300; k++ {
		s.buf[k] = byte(0x5a ^ k)
	}
	copy(want[100:400], s.buf[:300])
	for i, w := range []uint64{plW1, plW2, plW3} {
		binary.LittleEndian.PutUint64(s.buf[512+8*i:], w)
	}
	copy(want[16:], s.buf[528:536])
	copy(want[plRegion-8:], s.buf[520:528])
	va := func(off int) uint64 { return theirs.VA + uint64(off) }
	outside := va(2 * plRegion) // a range wholly past the region
	type step struct {
		wr     qp.SendWR
		op     cq.Opcode
		status cq.Status
		what   string
	}
	steps := []step{
		{qp.SendWR{Opcode: qp.WRRDMAWrite, SGL: s.sge(0, 300), RemoteAddr: va(100), RKey: theirs.RKey},
			cq.OpRDMAWrite, cq.StatusSuccess, "WRITE 300 bytes at 100"},
		{qp.SendWR{Opcode: qp.WRAtomicWrite, SGL: s.sge(512, 8), RemoteAddr: va(16), RKey: theirs.RKey},
			cq.OpAtomicWrite, cq.StatusSuccess, "ATOMIC WRITE w1 at 16"},
		{qp.SendWR{Opcode: qp.WRAtomicWrite, SGL: s.sge(520, 8), RemoteAddr: va(plRegion - 8), RKey: theirs.RKey},
			cq.OpAtomicWrite, cq.StatusSuccess, "ATOMIC WRITE w2 at the region's last word"},
		{qp.SendWR{Opcode: qp.WRRDMARead, SGL: s.sge(1024, 16), RemoteAddr: va(plRegion - 16), RKey: theirs.RKey},
			cq.OpRDMARead, cq.StatusSuccess, "READ 16 bytes at 4080"},
		{qp.SendWR{Opcode: qp.WRAtomicWrite, SGL: s.sge(528, 8), RemoteAddr: va(16), RKey: theirs.RKey},
			cq.OpAtomicWrite, cq.StatusSuccess, "ATOMIC WRITE w3 at 16 (over w1)"},
		{qp.SendWR{Opcode: qp.WRFlush, RemoteAddr: va(100), RKey: theirs.RKey, FlushLength: 300, FlushType: qp.FlushGlobal, FlushLevel: qp.FlushRange},
			cq.OpFlush, cq.StatusSuccess, "FLUSH global, range [100, 400)"},
		// the Memory Region level flushes the whole region: the range is not used (A19.4.1.2)
		{qp.SendWR{Opcode: qp.WRFlush, RemoteAddr: outside, RKey: theirs.RKey, FlushLength: plRegion, FlushType: qp.FlushGlobal, FlushLevel: qp.FlushMR},
			cq.OpFlush, cq.StatusSuccess, "FLUSH global, whole region (range outside it)"},
		// the same range at the Memory Region Range level is checked: remote access error
		{qp.SendWR{Opcode: qp.WRFlush, RemoteAddr: outside, RKey: theirs.RKey, FlushLength: plRegion, FlushType: qp.FlushGlobal, FlushLevel: qp.FlushRange},
			cq.OpFlush, cq.StatusRemAccessErr, "FLUSH global, range outside the region"},
	}
	before := rxeCounters(t, lab)
	for i, st := range steps {
		st.wr.WRID = uint64(i + 1)
		wc, ok := s.post(st.wr, deadline)
		if !ok {
			break
		}
		t.Logf("%-48s wc wr_id=%d opcode=%v status=%v byte_len=%d", st.what, wc.WRID, wc.Opcode, wc.Status, wc.ByteLen)
		if wc.WRID != st.wr.WRID || wc.Status != st.status || (wc.Status == cq.StatusSuccess && wc.Opcode != st.op) {
			t.Errorf("%s: completion %+v, want opcode %v status %v", st.what, wc, st.op, st.status)
			break
		}
		if st.wr.Opcode == qp.WRRDMARead {
			exp := append(append([]byte(nil), plPattern()[plRegion-16:plRegion-8]...), s.buf[520:528]...)
			if got := s.buf[1024:1040]; !bytes.Equal(got, exp) {
				t.Errorf("READ after ATOMIC WRITE: % x, want % x", got, exp)
			}
		}
	}
	t.Logf("rxe counters:%s", counterDelta(before, rxeCounters(t, lab)))
	if q := s.q.State(); q != qp.StateErr {
		t.Errorf("QP %v after the refused FLUSH, want ERR", q)
	}
	if _, err := conn.Write([]byte("done\n")); err != nil {
		t.Fatal(err)
	}
	if l, err := rd.ReadString('\n'); err != nil || l != "bye\n" {
		t.Errorf("the peer's last line %q, %v; want bye", l, err)
	}
	out := plWaitPeer(t, g)
	if got, err := plRegionOf(out); err != nil {
		t.Error(err)
	} else {
		plCompare(t, "rxe's region", got, want)
	}
	wire, lost := stopCapture()
	plCheckWire(t, wire, lost, hostIP, []bth.Opcode{bth.OpRCWriteOnly, bth.OpRCAtomicWrite, bth.OpRCAtomicWrite,
		bth.OpRCReadRequest, bth.OpRCAtomicWrite, bth.OpRCFlush, bth.OpRCFlush, bth.OpRCFlush}, true)
}

// placementFromRxe: rxe's requester (the peer's client, built with FLUSH against Debian 13's
// rdma-core: placementFlushPeer) against softroce's responder.
func placementFromRxe(t *testing.T, lab *rxelab.Lab) {
	placementReady(t, lab) // the capability check
	bin := placementFlushPeer(t)
	stopCapture := plStartCapture(t, lab)
	deadline := time.Now().Add(120 * time.Second)
	s := openPlSide(t, lab, plRegion, mr.AccessLocalWrite|mr.AccessRemoteWrite|mr.AccessRemoteRead|mr.AccessFlushGlobal, false)
	copy(s.buf, plPattern())
	var ln net.Listener
	if err := lab.InNetns(func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(rxelab.HostIP, strconv.Itoa(plPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g := plStartPeer(t, lab, bin, rxelab.HostIP, "")
	_ = ln.(*net.TCPListener).SetDeadline(deadline)
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	rd := bufio.NewReader(conn)
	l, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("the peer's line: %v", err)
	}
	theirs, err := parsePlPeer(strings.TrimSpace(l))
	if err != nil {
		t.Fatal(err)
	}
	mine := s.me(0x00dcba)
	if err := s.up(mine, theirs); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(mine.line())); err != nil {
		t.Fatal(err)
	}
	if l, err := rd.ReadString('\n'); err != nil || l != "done\n" {
		t.Fatalf("the peer's done line %q, %v", l, err)
	}
	want := plClientImage()
	// the responder stores under the QP's lock: taking it orders those stores before the copy
	if st := s.q.State(); st != qp.StateRTS {
		t.Errorf("QP %v after the peer's sequence, want RTS", st)
	}
	counters := s.dev.Stats().Map()
	got := append([]byte(nil), s.buf...) // the peer is done: nothing writes the region now
	if _, err := conn.Write([]byte("bye\n")); err != nil {
		t.Fatal(err)
	}
	out := plWaitPeer(t, g)
	plCompare(t, "softroce's region", got, want)
	plCheckClient(t, "the peer's client", out)
	if counters["resp_remote_access_errors"] != 0 {
		t.Errorf("softroce counters: %v", counters)
	}
	wire, lost := stopCapture()
	plCheckWire(t, wire, lost, guestIP, []bth.Opcode{bth.OpRCWriteOnly, bth.OpRCFlush, bth.OpRCAtomicWrite, bth.OpRCAtomicWrite,
		bth.OpRCReadRequest, bth.OpRCAtomicWrite, bth.OpRCReadRequest, bth.OpRCFlush}, false)
}

// plClientImage is the server's region after placement.c's client sequence (the rdma-core 56
// build): WRITE 256 bytes (0xa5 ^ k) at 512, FLUSH of that range, ATOMIC WRITE
// 0x1122334455667788 at 8, 0x0102030405060708 at 4088, then 0x8877665544332211 at 8 (each
// stored as its little-endian bytes), and a FLUSH of the whole region (a range outside it,
// Memory Region level).
func plClientImage() []byte {
	want := plPattern()
	for k := 0; k < 256; k++ {
		want[512+k] = byte(0xa5 ^ k)
	}
	binary.LittleEndian.PutUint64(want[8:], 0x8877665544332211)
	binary.LittleEndian.PutUint64(want[plRegion-8:], 0x0102030405060708)
	return want
}

// plCheckClient checks the output of placement.c's client (the rdma-core 56 build): all 8
// completions successful, the 2 FLUSHes as IBV_WC_FLUSH (8 in rdma-core 56: IBV_WC_TSO + 1).
func plCheckClient(t *testing.T, who, out string) {
	t.Helper()
	if n, f := strings.Count(out, " status=0 (success)"), strings.Count(out, "opcode=8 status=0 (success)"); n != 8 || f != 2 ||
		!strings.Contains(out, "placement: client ok (8 operations)") {
		t.Errorf("%s: %d successful completions (want 8), %d of them IBV_WC_FLUSH (want 2), or no \"client ok (8 operations)\"", who, n, f)
	}
}
