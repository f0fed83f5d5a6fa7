package roce

// The GSI QP (QP1) and the Communication Manager on it.
//
// Every Device opens QP1 at Open (IBTA 13.4.3: the General Services
// Interface; softroce serves only the CM class on it, IBTA 12.6):
// an engine QP of type qp.TypeGSI, Q_Key 0x80010000 (IBTA 13.5.2), with its
// own memory table, CQs and receive ring so it takes nothing from the
// application's limits or key space. Sends go out as UD SEND ONLY to the
// peer's QP1 with P_Key 0xFFFF and the UD/GSI UDP source port
// (bth.UDSourcePort, as rxe). Received QP1 payloads are handed to a
// cm.Manager, the CM state machine of internal/cm, from the receive goroutine
// after the engine has checked them (Q_Key, single packet, P_Key). The
// engine's COMM_EST event (first packet on an RTR QP, IBTA 11.6.3 and 12.9)
// is forwarded to Manager.CommEstablished once the QP's lock is released.

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// CMOptions configure the device's GSI QP and Communication Manager.
type CMOptions struct {
	// Disable opens the device without QP1 and without a CM (QPN 1 packets
	// are then dropped, as before the CM existed).
	Disable bool
	// Rand is the source of communication IDs and starting PSNs
	// (nil = crypto/rand); tests set it for determinism.
	Rand io.Reader
	// TimeWait overrides the CM TIMEWAIT duration (0 = the Linux CM's:
	// the connection's local ACK timeout).
	TimeWait time.Duration
	// TIDHigh is the high half of the CM's transaction IDs (0 = 1).
	TIDHigh uint32
	// CAGUID is the CA GUID sent in REQ/REP (0 = the device's node GUID:
	// the EUI-64 of the interface's MAC, the interface ID of the link-local
	// GID at index 0, as rxe derives it).
	CAGUID uint64
	// RecvDepth is the number of MAD receive buffers on QP1 (0 = 64).
	RecvDepth int
	// MaxREQWait and MaxPendingREQs bound the received connection requests
	// waiting for an answer (cm.Options; 0 = cm.DefaultMaxREQWait,
	// cm.DefaultMaxPendingREQs).
	MaxREQWait     time.Duration
	MaxPendingREQs int
}

// ErrNoCM is returned when the device was opened with CMOptions.Disable.
var ErrNoCM = errors.New("roce: the device has no GSI QP / CM")

const (
	gsiSlot     = 40 + cm.MADSize // GRH + MAD (IBTA 11.4.1.2: UD receives start with the 40-byte GRH)
	gsiSendRing = 64
)

type gsi struct {
	d     *Device
	q     *QP
	tbl   *mr.Table
	pd    *mr.PD
	rcq   *cq.CQ
	scq   *cq.CQ
	rbuf  []byte
	rmr   *mr.MR
	mgr   *cm.Manager
	depth int

	sendMu  sync.Mutex
	sbuf    []byte
	smr     *mr.MR
	sNext   int
	sWC     [8]cq.WC
	sendErr atomic.Uint64

	rWC [16]cq.WC

	handler atomic.Pointer[func(cm.Event)]

	estMu   sync.Mutex
	estQPNs []uint32
	estAny  atomic.Bool
}

// openGSI creates QP1 and the CM Manager (called by Open before the
// receive goroutine starts).
func (d *Device) openGSI(o CMOptions) error {
	if o.Disable {
		return nil
	}
	g := &gsi{d: d, depth: o.RecvDepth}
	if g.depth <= 0 {
		g.depth = 64
	}
	g.tbl = mr.NewTable(mr.TableOptions{MaxMR: 4, MaxPD: 1, Rand: o.Rand})
	var err error
	if g.pd, err = g.tbl.AllocPD(); err != nil {
		return err
	}
	g.rbuf = make([]byte, g.depth*gsiSlot)
	if g.rmr, err = g.tbl.RegMR(g.pd, g.rbuf, 0x10000, mr.AccessLocalWrite); err != nil {
		return err
	}
	g.sbuf = make([]byte, gsiSendRing*cm.MADSize)
	if g.smr, err = g.tbl.RegMR(g.pd, g.sbuf, 0x1000000, 0); err != nil {
		return err
	}
	if g.rcq, err = cq.New(cq.Options{Capacity: g.depth}); err != nil {
		return err
	}
	if g.scq, err = cq.New(cq.Options{Capacity: gsiSendRing}); err != nil {
		return err
	}
	eq, err := qp.New(qp.Config{
		Type: qp.TypeGSI, QPN: 1, PD: g.pd, MRs: g.tbl, SendCQ: g.scq, RecvCQ: g.rcq,
		Cap: qp.Cap{MaxSendWR: gsiSendRing, MaxRecvWR: uint32(g.depth), MaxSendSGE: 1, MaxRecvSGE: 1},
		Out: d.link, Clock: d.clock, Resolve: d.resolve, DstPort: d.port, Device: &d.attr,
		Counters: &d.cnt, AtomicMu: &d.atomicMu, MTU: d.mtu,
	})
	if err != nil {
		return fmt.Errorf("roce: GSI QP: %w", err)
	}
	g.q = &QP{QP: eq, dev: d}
	// IBTA 10.3.1 / Table 93 (GSI column): INIT takes P_Key index and
	// Q_Key, RTR nothing, RTS the send PSN.
	steps := []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, QKey: qp.GSIQKey}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrQKey},
		{qp.Attr{State: qp.StateRTR}, qp.AttrState},
		{qp.Attr{State: qp.StateRTS}, qp.AttrState | qp.AttrSQPSN},
	}
	for i := range steps {
		if err := eq.Modify(&steps[i].a, steps[i].m); err != nil {
			eq.Destroy()
			return fmt.Errorf("roce: GSI QP: %w", err)
		}
	}
	for i := 0; i < g.depth; i++ {
		if err := g.postRecv(i); err != nil {
			eq.Destroy()
			return fmt.Errorf("roce: GSI QP: %w", err)
		}
	}
	guid := o.CAGUID
	if guid == 0 {
		guid = d.attr.NodeGUID
	}
	g.mgr, err = cm.NewManager(cm.Options{
		Transport: g, Clock: d.clock, Rand: o.Rand, CAGUID: guid, TimeWait: o.TimeWait,
		TIDHigh: o.TIDHigh, Events: g.event, MaxREQWait: o.MaxREQWait, MaxPendingREQs: o.MaxPendingREQs,
	})
	if err != nil {
		eq.Destroy()
		return err
	}
	d.g = g
	d.gsi.Store(g.q)
	return nil
}

func (g *gsi) postRecv(i int) error {
	_, err := g.q.PostRecv([]qp.RecvWR{{WRID: uint64(i),
		SGL: []qp.SGE{{Addr: g.rmr.IOVA() + uint64(i*gsiSlot), Length: gsiSlot, LKey: g.rmr.LKey()}}}})
	return err
}

func (g *gsi) event(e cm.Event) {
	if h := g.handler.Load(); h != nil {
		(*h)(e)
	}
}

// SendMAD implements cm.Transport: the 256-byte MAD goes out as a UD SEND
// ONLY from QP1 to dst's GSI QP (IBTA 13.5), DETH Q_Key 0x80010000.
func (g *gsi) SendMAD(dst cm.Addr, mad []byte) error {
	if len(mad) > cm.MADSize {
		return ErrInvalidArg
	}
	dgid := dst.GID.Unmap()
	sgid := -1
	for i, e := range g.d.gids.Entries() {
		if i > 0 && e.Addr.IsValid() && e.Addr.Is4() == dgid.Is4() && !e.Addr.IsLinkLocalUnicast() {
			sgid = i
			break
		}
	}
	if sgid < 0 {
		return fmt.Errorf("%w: no local GID for %v", ErrInvalidArg, dgid)
	}
	ah, err := g.d.CreateAH(g.pd, qp.AHAttr{DGID: dgid, SGIDIndex: uint8(sgid)})
	if err != nil {
		return err
	}
	qpn := dst.QPN
	if qpn == 0 {
		qpn = cm.GSIQPN
	}
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	// drop completions of failed sends (successful ones are unsignaled)
	for g.scq.Poll(g.sWC[:]) > 0 {
	}
	slot := g.sNext
	g.sNext = (g.sNext + 1) % gsiSendRing
	off := slot * cm.MADSize
	n := copy(g.sbuf[off:off+cm.MADSize], mad)
	_, err = g.q.PostSend([]qp.SendWR{{WRID: uint64(slot), Opcode: qp.WRSend,
		SGL: []qp.SGE{{Addr: g.smr.IOVA() + uint64(off), Length: uint32(n), LKey: g.smr.LKey()}},
		AH:  ah, RemoteQPN: qpn, RemoteQKey: cm.GSIQKey}})
	if err != nil {
		g.sendErr.Add(1)
	}
	return err
}

// poll hands the MADs QP1 has received to the CM and reposts their
// buffers (receive goroutine).
func (g *gsi) poll() {
	for {
		n := g.rcq.Poll(g.rWC[:])
		if n == 0 {
			return
		}
		for i := 0; i < n; i++ {
			wc := &g.rWC[i]
			slot := int(wc.WRID)
			if slot < 0 || slot >= g.depth {
				continue
			}
			if wc.Status == cq.StatusSuccess && wc.ByteLen == gsiSlot {
				b := g.rbuf[slot*gsiSlot : (slot+1)*gsiSlot]
				src := grhSource(b[:40])
				_ = g.mgr.HandleMAD(cm.Addr{GID: src, QPN: wc.SrcQP, PKey: 0xFFFF}, b[40:])
			}
			if g.d.closed.Load() {
				continue
			}
			_ = g.postRecv(slot)
		}
	}
}

// grhSource reads the source address from the 40 bytes a UD receive
// starts with (IBTA A17.4: for IPv4 the header sits in the last 20).
func grhSource(grh []byte) netip.Addr {
	if grh[0]>>4 == 6 {
		return netip.AddrFrom16([16]byte(grh[8:24])).Unmap()
	}
	return netip.AddrFrom4([4]byte(grh[32:36]))
}

// commEst records a COMM_EST event for the CM (called under the QP's
// lock: the Manager is told after the lock is released, in afterReceive).
func (g *gsi) commEst(e event.Event) {
	g.estMu.Lock()
	g.estQPNs = append(g.estQPNs, e.QPN)
	g.estMu.Unlock()
	g.estAny.Store(true)
}

// afterReceive runs on the receive goroutine after a packet was handed to
// QP qpn, with no QP lock held.
func (g *gsi) afterReceive(qpn uint32) {
	if qpn == 1 {
		g.poll()
	}
	if !g.estAny.Load() {
		return
	}
	g.estMu.Lock()
	qpns := g.estQPNs
	g.estQPNs = nil
	g.estAny.Store(false)
	g.estMu.Unlock()
	for _, n := range qpns {
		g.mgr.CommEstablished(n)
	}
}

// CM returns the device's Communication Manager (internal/cm), which sends and
// receives its MADs on QP1; nil if the device was opened without it.
func (d *Device) CM() *cm.Manager {
	if d.g == nil {
		return nil
	}
	return d.g.mgr
}

// SetCMEventHandler installs the function that receives the CM's events
// (pkg/rdmacm installs its dispatcher); nil removes it. The handler is
// called in order, never with the CM's lock held, and must not block.
func (d *Device) SetCMEventHandler(h func(cm.Event)) error {
	if d.g == nil {
		return ErrNoCM
	}
	if h == nil {
		d.g.handler.Store(nil)
	} else {
		d.g.handler.Store(&h)
	}
	return nil
}

// GSISendErrors reports QP1's send failures (MADs the engine refused).
func (d *Device) GSISendErrors() uint64 {
	if d.g == nil {
		return 0
	}
	return d.g.sendErr.Load()
}
