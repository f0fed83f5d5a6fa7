package roce

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/udp"
)

// FastPathOptions select the data-path accelerations of a UDP device (docs/engine.md,
// "Pipeline"; docs/link.md, "GSO and GRO"). The zero value enables them all.
//
//   - GSO: the engine groups each burst into link.RunRule runs and computes the ICRC of the k-th
//     packet of a run with IPv4 ID k (IBTA A17.3.3; the kernel numbers the segments of one GSO
//     send 0, 1, 2, ...); the link sends each run as one UDP_SEGMENT message and rewrites the
//     ICRC for ID 0 if it ever has to send a run plainly (link.RunSender).
//   - GRO: UDP_GRO on the sockets: a train of same-size datagrams is one read, split by the
//     segment size; the receive goroutine checks each packet's ICRC (solving the IPv4 ID) and
//     places its payload right after the read.
type FastPathOptions struct {
	// Disable turns every acceleration off: no GSO (not even for IPv6), no GRO.
	Disable bool
	// NoGSO keeps GSO off (udp.GSOOff); NoGRO keeps GRO off.
	NoGSO, NoGRO bool
	// Workers is the number of receive workers (0 or 1: one). With n > 1 the device opens n
	// SO_REUSEPORT sockets per address (udp.ListenShards): the kernel steers each datagram
	// to worker DestQP mod n, which parses, checks and places it, and QP q sends through
	// socket q mod n, so n busy QPs use up to n cores.
	Workers int
	// Pin pins each receive worker to its own OS thread and CPU (Options.Pin).
	Pin bool
}

// apply sets the link options the fast path needs. An explicit Link.GSO other than GSOAuto is
// kept unless GSO is disabled.
func (f FastPathOptions) apply(o *udp.Options) {
	if f.Disable || f.NoGSO {
		o.GSO = udp.GSOOff
	}
	if !f.Disable && !f.NoGRO {
		o.GRO = true
	}
}

// rxState is one receive worker's scratch: the packet being handled, the pseudo-header CRC
// state of the last (endpoints, length) seen, and the GSO-run ID tables.
type rxState struct {
	pkt bth.Packet
	now time.Time // read once per received batch

	// phc holds the pseudo-header CRC states of the last two (endpoints, length) seen, most
	// recent first: a ping-pong's WRITEs and ACKs alternate between two lengths (pseudoHeader).
	phc  [2]icrcEntry
	ids  [2]idTable
	next int // the idTable to replace next

	// pending are the QPs that received packets of this batch with qp.ReceiveDeferred: each is
	// flushed once after the batch (coalesced ACKs, one burst of requests per batch of ACKs).
	pending  [8]*qp.QP
	npending int

	// splitting is set while the segments of an unsegmented GSO message are handled (no
	// second split), seg is the segment's datagram (superframe.go).
	splitting bool
	seg       link.Datagram
}

// icrcEntry is one cached pseudo-header CRC state (bth.PseudoHeaderCRC of ep and n bytes).
type icrcEntry struct {
	ep    bth.Endpoints
	n     int
	state uint32
	ok    bool
}

// icrcWithID is bth.ICRC of buf for ep (IPv4 ID 0) with IPv4 Identification id (IBTA A17.3.3),
// from the pseudo-header cache of ID 0 for every ID (bth.IPv4IDDelta): our DF senders' ID 0
// (and what a UDP socket assumes), and the IDs the AF_XDP path sees (kernel rxe's counting
// ones, a GSO message's ID + k).
func (rx *rxState) icrcWithID(ep *bth.Endpoints, buf []byte, id uint16) uint32 {
	return bth.ICRCContinue(rx.pseudoHeader(ep, len(buf))^bth.IPv4IDDelta(id), buf)
}

// pseudoHeader returns bth.PseudoHeaderCRC(ep, n) (IBTA A17.3.3: the ICRC's masked IP and UDP
// headers depend only on the endpoints and the length), from the two-entry cache when it holds
// it: a bulk flow's full-MTU packets and a latency test's alternating requests and ACKs both
// skip the 36-byte CRC.
func (rx *rxState) pseudoHeader(ep *bth.Endpoints, n int) uint32 {
	c := &rx.phc
	if c[0].ok && c[0].n == n && c[0].ep.Equal(ep) {
		return c[0].state
	}
	if c[1].ok && c[1].n == n && c[1].ep.Equal(ep) {
		c[0], c[1] = c[1], c[0]
		return c[0].state
	}
	c[1] = c[0]
	c[0] = icrcEntry{ep: *ep, n: n, state: bth.PseudoHeaderCRC(ep, n), ok: true}
	return c[0].state
}

// deferFlush records that q must be flushed after the batch (once).
func (rx *rxState) deferFlush(q *qp.QP) {
	for i := rx.npending - 1; i >= 0; i-- {
		if rx.pending[i] == q {
			return
		}
	}
	if rx.npending == len(rx.pending) {
		rx.flushPending()
	}
	rx.pending[rx.npending] = q
	rx.npending++
}

// flushPending flushes the QPs deferFlush recorded (qp.QP.FlushReceived).
func (rx *rxState) flushPending() {
	for i := 0; i < rx.npending; i++ {
		rx.pending[i].FlushReceived(rx.now)
		rx.pending[i] = nil
	}
	rx.npending = 0
}

// idTable lists, for one (endpoints, length), diff[k] = ICRC(ID k) ^ ICRC(ID 0) for k < 64: the
// IDs of the segments of a GSO run. The ICRC is linear in the ID bits for a fixed length (IBTA
// A17.3.3's CRC32 over the pseudo-header and the packet), so diff[k] is the XOR of the diffs of
// k's bits, and each of those is the CRC difference over a zero packet of that length: 6 CRCs per
// table, built when a (flow, length) first carries a non-zero ID.
type idTable struct {
	ep   bth.Endpoints
	n    int
	ok   bool
	hint int
	diff [link.MaxRunSegments]uint32
}

var zeroPacket [link.MaxDatagram]byte

// runID reports whether an IPv4 packet of n bytes whose ICRC with ID 0 differs from the one it
// carries by diff was sent as segment k (1 <= k < 64) of a GSO run: one table lookup instead of
// bth.SolveIPv4ID's second CRC pass. The hint (the previous k + 1) is tried first.
func (rx *rxState) runID(ep *bth.Endpoints, n int, diff uint32) bool {
	var t *idTable
	for i := range rx.ids {
		if rx.ids[i].ok && rx.ids[i].n == n && rx.ids[i].ep.Equal(ep) {
			t = &rx.ids[i]
			break
		}
	}
	if t == nil {
		t = &rx.ids[rx.next]
		rx.next = (rx.next + 1) % len(rx.ids)
		t.build(ep, n)
	}
	if k := t.hint; k > 0 && k < len(t.diff) && t.diff[k] == diff {
		t.hint = k + 1
		return true
	}
	for k := 1; k < len(t.diff); k++ {
		if t.diff[k] == diff {
			t.hint = k + 1
			return true
		}
	}
	return false
}

func (t *idTable) build(ep *bth.Endpoints, n int) {
	t.ep, t.n, t.ok, t.hint = *ep, n, true, 1
	z := zeroPacket[:min(n, len(zeroPacket))]
	e := *ep
	e.IPID = 0
	c0 := bth.ICRCContinue(bth.PseudoHeaderCRC(&e, n), z)
	t.diff[0] = 0
	for b := 1; b < len(t.diff); b <<= 1 {
		e.IPID = uint16(b)
		t.diff[b] = bth.ICRCContinue(bth.PseudoHeaderCRC(&e, n), z) ^ c0
	}
	for k := 1; k < len(t.diff); k++ {
		if low := k & -k; low != k {
			t.diff[k] = t.diff[k&(k-1)] ^ t.diff[low]
		}
	}
}

// pinWorker locks the calling goroutine to its OS thread (for good: the worker runs until the
// device closes) and pins the thread to CPU i mod the CPUs the process may use
// (sched_setaffinity). Failures leave the thread unpinned.
func pinWorker(i int) {
	runtime.LockOSThread()
	var allowed unix.CPUSet
	if unix.SchedGetaffinity(0, &allowed) != nil || allowed.Count() == 0 {
		return
	}
	k := i % allowed.Count()
	for cpu := 0; cpu < 1024; cpu++ {
		if allowed.IsSet(cpu) {
			if k == 0 {
				var one unix.CPUSet
				one.Set(cpu)
				_ = unix.SchedSetaffinity(0, &one)
				return
			}
			k--
		}
	}
}
