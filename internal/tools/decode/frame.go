package decode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/bth/layer"
)

// decodedPacket is one RoCE packet as printed; its JSON form is the --json
// schema of docs/decode.md. Flags are 0/1 numbers, like tshark's fields.
type decodedPacket struct {
	Frame      int            `json:"frame"`
	Src        string         `json:"src"`
	Dst        string         `json:"dst"`
	Sport      uint16         `json:"sport"`
	Dport      uint16         `json:"dport"`
	Opcode     uint8          `json:"opcode"`
	Opname     string         `json:"opname"`
	SE         uint8          `json:"se"`
	M          uint8          `json:"m"`
	Pad        uint8          `json:"pad"`
	TVer       uint8          `json:"tver"`
	PKey       uint16         `json:"pkey"`
	FECN       uint8          `json:"fecn"`
	BECN       uint8          `json:"becn"`
	DQPN       uint32         `json:"dqpn"`
	AckReq     uint8          `json:"ackreq"`
	PSN        uint32         `json:"psn"`
	FETH       *fethJSON      `json:"feth,omitempty"`
	RETH       *rethJSON      `json:"reth,omitempty"`
	AETH       *aethJSON      `json:"aeth,omitempty"`
	AtomicETH  *atomicETHJSON `json:"atomiceth,omitempty"`
	AtomicAck  *atomicAckJSON `json:"atomicack,omitempty"`
	Imm        *uint32        `json:"imm,omitempty"`
	IETH       *uint32        `json:"ieth,omitempty"`
	DETH       *dethJSON      `json:"deth,omitempty"`
	CM         *cmJSON        `json:"-"` // text form only: the --json schema is unchanged
	PayloadLen int            `json:"payload_len"`
	ICRC       uint32         `json:"icrc"`
	ICRCOK     bool           `json:"icrc_ok"`
	// ICRCVariant names a known non-standard ICRC the packet carries instead of A17.3.3's
	// ("rxe-flush": kernel rxe's FLUSH ICRC, its headers covered twice); icrc_ok stays false.
	ICRCVariant string `json:"icrc_variant,omitempty"`
}

// fethJSON is a FLUSH's FETH (IBTA A19.4.1): the placement type (1 global visibility, 2
// persistence) and the selectivity level (0 Memory Region Range, 1 Memory Region).
type fethJSON struct {
	Placement   uint8 `json:"placement"`
	Selectivity uint8 `json:"selectivity"`
}

type rethJSON struct {
	VA   uint64 `json:"va"`
	RKey uint32 `json:"rkey"`
	Len  uint32 `json:"len"`
}

type aethJSON struct {
	Syndrome uint8  `json:"syndrome"`
	MSN      uint32 `json:"msn"`
}

type atomicETHJSON struct {
	VA   uint64 `json:"va"`
	RKey uint32 `json:"rkey"`
	Swap uint64 `json:"swap"`
	Cmp  uint64 `json:"cmp"`
}

type atomicAckJSON struct {
	Orig uint64 `json:"orig"`
}

type dethJSON struct {
	QKey  uint32 `json:"qkey"`
	SrcQP uint32 `json:"srcqp"`
}

// cmJSON (text form only) names a CM message (IBTA 12.6, 12.11) carried by a UD SEND ONLY to QP1 and its
// key fields; present only for such packets whose payload parses as a CM MAD (internal/cm).
type cmJSON struct {
	Msg          string  `json:"msg"` // REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP
	TID          uint64  `json:"tid"`
	LocalCommID  uint32  `json:"local_comm_id"`            // SIDR: the request ID
	RemoteCommID *uint32 `json:"remote_comm_id,omitempty"` // not in REQ and SIDR
	ServiceID    *uint64 `json:"service_id,omitempty"`     // REQ, SIDR_REQ, SIDR_REP
	QPN          *uint32 `json:"qpn,omitempty"`            // REQ, REP: the sender's; DREQ: the receiver's; SIDR_REP
	StartingPSN  *uint32 `json:"starting_psn,omitempty"`   // REQ, REP
	Reason       *uint16 `json:"reason,omitempty"`         // REJ
	Status       *uint8  `json:"status,omitempty"`         // SIDR_REP
	QKey         *uint32 `json:"qkey,omitempty"`           // SIDR_REP
}

// decodeCM returns the CM message of a QP1 UD SEND, or nil.
func decodeCM(p *bth.Packet) *cmJSON {
	if p.BTH.DestQP() != cm.GSIQPN || p.BTH.Opcode() != bth.OpUDSendOnly || p.DETH == nil {
		return nil
	}
	m, err := cm.Parse(p.Payload)
	if err != nil {
		return nil
	}
	u32 := func(v uint32) *uint32 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	c := &cmJSON{Msg: m.Attr.String(), TID: m.MAD.TID()}
	switch {
	case m.REQ != nil:
		c.LocalCommID, c.ServiceID = m.REQ.LocalCommID(), u64(m.REQ.ServiceID())
		c.QPN, c.StartingPSN = u32(m.REQ.LocalQPN()), u32(m.REQ.StartingPSN())
	case m.MRA != nil:
		c.LocalCommID, c.RemoteCommID = m.MRA.LocalCommID(), u32(m.MRA.RemoteCommID())
	case m.REJ != nil:
		r := uint16(m.REJ.Reason())
		c.LocalCommID, c.RemoteCommID, c.Reason = m.REJ.LocalCommID(), u32(m.REJ.RemoteCommID()), &r
	case m.REP != nil:
		c.LocalCommID, c.RemoteCommID = m.REP.LocalCommID(), u32(m.REP.RemoteCommID())
		c.QPN, c.StartingPSN = u32(m.REP.LocalQPN()), u32(m.REP.StartingPSN())
	case m.RTU != nil:
		c.LocalCommID, c.RemoteCommID = m.RTU.LocalCommID(), u32(m.RTU.RemoteCommID())
	case m.DREQ != nil:
		c.LocalCommID, c.RemoteCommID, c.QPN = m.DREQ.LocalCommID(), u32(m.DREQ.RemoteCommID()), u32(m.DREQ.RemoteQPN())
	case m.DREP != nil:
		c.LocalCommID, c.RemoteCommID = m.DREP.LocalCommID(), u32(m.DREP.RemoteCommID())
	case m.SIDRReq != nil:
		c.LocalCommID, c.ServiceID = m.SIDRReq.RequestID(), u64(m.SIDRReq.ServiceID())
	case m.SIDRRep != nil:
		st := uint8(m.SIDRRep.Status())
		c.LocalCommID, c.ServiceID, c.Status = m.SIDRRep.RequestID(), u64(m.SIDRRep.ServiceID()), &st
		c.QPN, c.QKey = u32(m.SIDRRep.QPN()), u32(m.SIDRRep.QKey())
	}
	return c
}

// text is the cm[...] part of the text form.
func (c *cmJSON) text() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, " cm[%s tid=0x%x lcid=0x%08x", c.Msg, c.TID, c.LocalCommID)
	if c.RemoteCommID != nil {
		fmt.Fprintf(&sb, " rcid=0x%08x", *c.RemoteCommID)
	}
	if c.ServiceID != nil {
		fmt.Fprintf(&sb, " sid=0x%016x", *c.ServiceID)
	}
	if c.QPN != nil {
		fmt.Fprintf(&sb, " qpn=0x%06x", *c.QPN)
	}
	if c.StartingPSN != nil {
		fmt.Fprintf(&sb, " psn=%d", *c.StartingPSN)
	}
	if c.Reason != nil {
		fmt.Fprintf(&sb, " reason=%d(%s)", *c.Reason, cm.RejectReason(*c.Reason))
	}
	if c.Status != nil {
		fmt.Fprintf(&sb, " status=%d", *c.Status)
	}
	if c.QKey != nil {
		fmt.Fprintf(&sb, " qkey=0x%08x", *c.QKey)
	}
	sb.WriteString("]")
	return sb.String()
}

func b01(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

var errCutBySnaplen = errors.New("packet cut short by the capture's snap length")

// decodeFrame returns nil for a frame that is not RoCE (not UDP port 4791 on
// IP). For a UDP 4791 frame whose RoCE decode failed it returns the addresses
// and the decode error.
func decodeFrame(pkt gopacket.Packet, frame int) (*decodedPacket, error) {
	netl := pkt.NetworkLayer()
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if netl == nil || udp == nil {
		return nil, nil
	}
	d := &decodedPacket{Frame: frame, Sport: uint16(udp.SrcPort), Dport: uint16(udp.DstPort)}
	switch ip := netl.(type) {
	case *layers.IPv4:
		d.Src, d.Dst = addrString(ip.SrcIP), addrString(ip.DstIP)
	case *layers.IPv6:
		d.Src, d.Dst = addrString(ip.SrcIP), addrString(ip.DstIP)
	default:
		return nil, nil
	}
	rl, _ := pkt.Layer(layer.LayerTypeRoCE).(*layer.RoCE)
	if rl != nil && pkt.Metadata().Truncated {
		// The capture's snap length cut the packet: the last 4 bytes are not
		// the ICRC and the payload is short.
		return d, errCutBySnaplen
	}
	if rl == nil {
		if d.Sport != bth.UDPPort && d.Dport != bth.UDPPort {
			return nil, nil
		}
		if el := pkt.ErrorLayer(); el != nil {
			return d, el.Error()
		}
		return d, errors.New("no RoCE layer")
	}
	p := &rl.Packet
	f := p.BTH.Fields()
	d.Opcode = uint8(f.Opcode)
	d.Opname = f.Opcode.String()
	d.SE, d.M, d.Pad, d.TVer = b01(f.SE), b01(f.MigReq), f.PadCnt, f.TVer
	d.PKey, d.FECN, d.BECN, d.DQPN = f.PKey, b01(f.FECN), b01(f.BECN), f.DestQP
	d.AckReq, d.PSN = b01(f.AckReq), uint32(f.PSN)
	if p.FETH != nil {
		x := p.FETH.Fields()
		d.FETH = &fethJSON{Placement: x.Placement, Selectivity: x.Selectivity}
	}
	if p.RETH != nil {
		x := p.RETH.Fields()
		d.RETH = &rethJSON{VA: x.VA, RKey: x.RKey, Len: x.DMALen}
	}
	if p.AETH != nil {
		x := p.AETH.Fields()
		d.AETH = &aethJSON{Syndrome: x.Syndrome, MSN: x.MSN}
	}
	if p.AtomicETH != nil {
		x := p.AtomicETH.Fields()
		d.AtomicETH = &atomicETHJSON{VA: x.VA, RKey: x.RKey, Swap: x.SwapAdd, Cmp: x.Compare}
	}
	if p.AtomicAck != nil {
		d.AtomicAck = &atomicAckJSON{Orig: p.AtomicAck.Fields().OrigData}
	}
	if p.ImmDt != nil {
		v := p.ImmDt.Imm()
		d.Imm = &v
	}
	if p.IETH != nil {
		v := p.IETH.RKey()
		d.IETH = &v
	}
	if p.DETH != nil {
		x := p.DETH.Fields()
		d.DETH = &dethJSON{QKey: x.QKey, SrcQP: x.SrcQP}
		d.CM = decodeCM(p)
	}
	d.PayloadLen = len(p.Payload)
	if len(p.ICRC) == bth.ICRCSize {
		d.ICRC = binary.BigEndian.Uint32(p.ICRC)
		ipb := append(append([]byte(nil), netl.LayerContents()...), netl.LayerPayload()...)
		computed, err := bth.ICRCFromIP(ipb)
		stored := binary.LittleEndian.Uint32(p.ICRC)
		d.ICRCOK = err == nil && computed == stored
		// kernel rxe (6.2 up to at least 6.12) continues a FLUSH's ICRC over its BTH, FETH and
		// RETH a second time (pkg/roce, rxeflush.go)
		if udp := netl.LayerPayload(); !d.ICRCOK && err == nil && f.Opcode == bth.OpRCFlush && len(p.Payload) == 0 &&
			len(udp) >= 8+bth.ICRCSize && bth.RxeFlushICRC(computed, udp[8:]) == stored {
			d.ICRCVariant = "rxe-flush"
		}
	}
	return d, nil
}

// addrString formats an IP address like tshark's ip.src/ipv6.src.
func addrString(ip []byte) string {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return "?"
	}
	return a.String()
}

func hostPort(addr string, port uint16) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Sprintf("%s:%d", addr, port)
	}
	return netip.AddrPortFrom(a, port).String()
}

// writeText prints the one-line text form (docs/decode.md).
func writeText(w io.Writer, d *decodedPacket) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d %s > %s %s qp=0x%06x psn=%d", d.Frame,
		hostPort(d.Src, d.Sport), hostPort(d.Dst, d.Dport), d.Opname, d.DQPN, d.PSN)
	for _, fl := range []struct {
		on   uint8
		name string
	}{{d.AckReq, "ackreq"}, {d.SE, "se"}, {d.M, "mig"}, {d.FECN, "fecn"}, {d.BECN, "becn"}} {
		if fl.on != 0 {
			sb.WriteString(" " + fl.name)
		}
	}
	if d.PKey != 0xffff {
		fmt.Fprintf(&sb, " pkey=0x%04x", d.PKey)
	}
	if d.TVer != 0 {
		fmt.Fprintf(&sb, " tver=%d", d.TVer)
	}
	if d.DETH != nil {
		fmt.Fprintf(&sb, " deth[qkey=0x%08x srcqp=0x%06x]", d.DETH.QKey, d.DETH.SrcQP)
	}
	if d.FETH != nil {
		fmt.Fprintf(&sb, " feth[placement=%d selectivity=%d]", d.FETH.Placement, d.FETH.Selectivity)
	}
	if d.RETH != nil {
		fmt.Fprintf(&sb, " reth[va=0x%x rkey=0x%08x len=%d]", d.RETH.VA, d.RETH.RKey, d.RETH.Len)
	}
	if d.AtomicETH != nil {
		fmt.Fprintf(&sb, " atomiceth[va=0x%x rkey=0x%08x swap=0x%x cmp=0x%x]",
			d.AtomicETH.VA, d.AtomicETH.RKey, d.AtomicETH.Swap, d.AtomicETH.Cmp)
	}
	if d.AETH != nil {
		fmt.Fprintf(&sb, " aeth[syndrome=0x%02x msn=%d]", d.AETH.Syndrome, d.AETH.MSN)
	}
	if d.AtomicAck != nil {
		fmt.Fprintf(&sb, " atomicack[orig=0x%x]", d.AtomicAck.Orig)
	}
	if d.Imm != nil {
		fmt.Fprintf(&sb, " imm=0x%08x", *d.Imm)
	}
	if d.IETH != nil {
		fmt.Fprintf(&sb, " ieth=0x%08x", *d.IETH)
	}
	if d.CM != nil {
		sb.WriteString(d.CM.text())
	}
	icrc := "ok"
	if d.ICRCVariant != "" {
		icrc = d.ICRCVariant
	} else if !d.ICRCOK {
		icrc = "BAD"
	}
	fmt.Fprintf(&sb, " len=%d pad=%d icrc=0x%08x %s\n", d.PayloadLen, d.Pad, d.ICRC, icrc)
	io.WriteString(w, sb.String())
}
