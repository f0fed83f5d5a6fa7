// Package proto is the softroce daemon protocol (docs/daemon-protocol.md) as the
// daemon (internal/daemon) and the Go client (pkg/client) use it: message framing,
// errors as errno values and detail codes, the binary encoding of work requests,
// conversions between the wire structs (internal/daemon/proto/wire, the twin of
// clib/include/softroce/proto.h) and the engine's types, the shared-memory rings
// (completion ring.go, post ring postring.go, event ring events.go) and the memfd,
// eventfd and SCM_RIGHTS helpers (shm_linux.go).
//
// Framing: a unix SOCK_SEQPACKET socket, one message per sendmsg, file descriptors
// as SCM_RIGHTS. A message is a wire.Hdr then the op's body; a response with a
// non-zero status (an errno) carries wire.Err and a message text.
package proto

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// Version is the protocol version exchanged in HELLO.
const Version = wire.Version

// MaxMsg is the largest message either side sends or accepts.
const MaxMsg = wire.MaxMsg

// HdrSize is the size of the header every message starts with.
const HdrSize = 8

// Handle names an object of one client; handles are per client (another
// client's handle numbers name nothing, or that client's own objects).
type Handle uint32

// AppendRequest starts dst over with a request for op, followed by body.
func AppendRequest(dst []byte, op wire.Op, body []byte) []byte {
	h := wire.Hdr{Op: op}
	return append(wire.Append(dst[:0], &h), body...)
}

// AppendOK starts dst over with a successful response to op; the body follows.
func AppendOK(dst []byte, op wire.Op) []byte {
	h := wire.Hdr{Op: op}
	return wire.Append(dst[:0], &h)
}

// AppendError starts dst over with a failed response to op: err's errno and code,
// badWR (posts: WRs posted before the failing one), and err's text.
func AppendError(dst []byte, op wire.Op, err error, badWR int) []byte {
	code := CodeOf(err)
	h := wire.Hdr{Op: op, Status: int32(ErrnoOf(err))}
	e := wire.Err{Code: uint32(code), BadWR: uint32(badWR)}
	dst = wire.Append(wire.Append(dst[:0], &h), &e)
	msg := err.Error()
	if room := MaxMsg - len(dst); len(msg) > room {
		msg = msg[:room]
	}
	return append(dst, msg...)
}

// ParseHdr splits a message into its header and body.
func ParseHdr(b []byte) (wire.Hdr, []byte, bool) {
	var h wire.Hdr
	rest, ok := wire.Read(b, &h)
	return h, rest, ok
}

// ResponseError is the bad_wr and the error of a failed response (h.Status != 0).
func ResponseError(h wire.Hdr, body []byte) (badWR int, err error) {
	var e wire.Err
	rest, ok := wire.Read(body, &e)
	if !ok {
		return 0, &RemoteError{Errno: syscall.Errno(h.Status), Msg: "softroce daemon: " + syscall.Errno(h.Status).Error()}
	}
	return int(e.BadWR), newRemoteError(syscall.Errno(h.Status), wire.Code(e.Code), string(rest))
}

// Binary encoding of work requests (docs/daemon-protocol.md, "Work requests"):
//
//	[wire.Hdr][wire.Post{handle, num_wr}] then num_wr x
//	send:    wire.SendWR (96 bytes), then num_sge x wire.SGE, or inline_len bytes padded to 8
//	receive: wire.RecvWR (16 bytes), then num_sge x wire.SGE
const (
	postHdr    = HdrSize + 8
	sendWRSize = 96
	recvWRSize = 16
	sgeSize    = 16
)

// AppendPostSend encodes a post-send message (op OpPostSend or
// OpPostSendAsync) into dst (reused; no allocation once grown). An inline
// WR's data (SendWR.Inline) travels in the message; AH addresses are sent by
// value (the daemon resolves them again).
func AppendPostSend(dst []byte, op wire.Op, h Handle, wrs []qp.SendWR) ([]byte, error) {
	hd := wire.Hdr{Op: op}
	p := wire.Post{Handle: uint32(h), NumWR: uint32(len(wrs))}
	dst = wire.Append(wire.Append(dst[:0], &hd), &p)
	for i := range wrs {
		w := &wrs[i]
		if len(w.SGL) > 255 {
			return dst, qp.ErrWRTooManySGE
		}
		if w.Opcode == qp.WRBindMW && w.Bind == nil {
			return dst, qp.ErrWRNoBind
		}
		if len(w.Inline) > 0xFFFF || (w.Inline != nil && len(w.SGL) > 0) {
			return dst, qp.ErrWRInlineSize
		}
		sw := wire.SendWR{WRID: w.WRID, Opcode: uint8(w.Opcode), NumSGE: uint8(len(w.SGL)),
			InlineLen: uint16(len(w.Inline)), SendFlags: uint32(w.Flags), ImmData: w.Imm,
			InvalidateRKey: w.InvRKey, RemoteAddr: w.RemoteAddr, RKey: w.RKey, RemoteQPN: w.RemoteQPN,
			RemoteQKey: w.RemoteQKey, CompareAdd: w.CompareAdd, Swap: w.Swap}
		if w.Opcode == qp.WRFlush { // compare_add: the range length; swap: type | level << SR_FLUSH_LEVEL_SHIFT
			sw.CompareAdd, sw.Swap = uint64(w.FlushLength), uint64(w.FlushType)|uint64(w.FlushLevel)<<wire.FlushLevelShift
		}
		if w.Opcode == qp.WRBindMW { // the bind in the WR's fields (wire.SendWR); no SGEs, no data
			if len(w.SGL) > 0 || w.Inline != nil {
				return dst, fmt.Errorf("%w: a BIND_MW carries no data", qp.ErrWRTooManySGE)
			}
			b := w.Bind
			sw.InvalidateRKey, sw.RKey, sw.ImmData = b.MWRKey, b.NewRKey, b.MRLKey
			sw.RemoteAddr, sw.CompareAdd, sw.Swap = b.Addr, b.Length, uint64(b.Access)
		}
		if w.AH != nil {
			sw.HasAH = 1
			sw.AH = AHAttrToWire(&w.AH.AHAttr)
		}
		dst = wire.Append(dst, &sw)
		if len(w.Inline) > 0 {
			dst = append(dst, w.Inline...)
			for len(dst)%8 != 0 {
				dst = append(dst, 0)
			}
		}
		dst = appendSGL(dst, w.SGL)
	}
	if len(dst) > MaxMsg {
		return dst, ErrProtocol
	}
	return dst, nil
}

func appendSGL(dst []byte, sgl []qp.SGE) []byte {
	for i := range sgl {
		s := wire.SGE{Addr: sgl[i].Addr, Length: sgl[i].Length, LKey: sgl[i].LKey}
		dst = wire.Append(dst, &s)
	}
	return dst
}

// AppendPostRecv encodes a post-recv message (op OpPostRecv, OpPostRecvAsync or OpPostSRQRecv).
func AppendPostRecv(dst []byte, op wire.Op, h Handle, wrs []qp.RecvWR) ([]byte, error) {
	hd := wire.Hdr{Op: op}
	p := wire.Post{Handle: uint32(h), NumWR: uint32(len(wrs))}
	dst = wire.Append(wire.Append(dst[:0], &hd), &p)
	for i := range wrs {
		rw := wire.RecvWR{WRID: wrs[i].WRID, NumSGE: uint32(len(wrs[i].SGL))}
		dst = wire.Append(dst, &rw)
		dst = appendSGL(dst, wrs[i].SGL)
	}
	if len(dst) > MaxMsg {
		return dst, ErrProtocol
	}
	return dst, nil
}

// PostHeader reads a post message (b starts with its wire.Hdr): the op, the
// handle, the WR count and the WRs' bytes.
func PostHeader(b []byte) (op wire.Op, h Handle, n int, rest []byte, err error) {
	var hd wire.Hdr
	var p wire.Post
	rest, ok := wire.Read(b, &hd)
	if ok {
		rest, ok = wire.Read(rest, &p)
	}
	if !ok {
		return 0, 0, 0, nil, ErrProtocol
	}
	return hd.Op, Handle(p.Handle), int(p.NumWR), rest, nil
}

// SendDecoder decodes post-send messages into reused storage (no allocation
// once its buffers have grown to the batch and SGE counts). Inline data is
// not copied: the WRs alias the message.
type SendDecoder struct {
	WRs   []qp.SendWR
	AHs   []qp.AH
	Binds []qp.BindInfo
	sge   []qp.SGE
}

// Decode decodes n WRs from b. UD address handles are returned with an
// unresolved SGID, so the engine resolves SGIDIndex against the GID table.
func (d *SendDecoder) Decode(b []byte, n int) ([]qp.SendWR, error) {
	if n < 0 || n > len(b)/sendWRSize {
		return nil, ErrProtocol
	}
	if cap(d.WRs) < n {
		d.WRs = make([]qp.SendWR, n)
		d.AHs = make([]qp.AH, n)
		d.Binds = make([]qp.BindInfo, n)
	}
	// First pass: check the sizes and count SGEs to size the shared SGE buffer.
	var sw wire.SendWR
	total, p := 0, b
	for i := 0; i < n; i++ {
		rest, ok := wire.Read(p, &sw)
		if !ok {
			return nil, ErrProtocol
		}
		var need int
		if sw.InlineLen > 0 {
			if sw.NumSGE != 0 || qp.SendFlags(sw.SendFlags)&qp.SendInline == 0 {
				return nil, ErrProtocol
			}
			need = align8(int(sw.InlineLen))
		} else {
			need = int(sw.NumSGE) * sgeSize
			total += int(sw.NumSGE)
		}
		if len(rest) < need {
			return nil, ErrProtocol
		}
		p = rest[need:]
	}
	if len(p) != 0 {
		return nil, ErrProtocol
	}
	if cap(d.sge) < total {
		d.sge = make([]qp.SGE, total)
	}
	sges := d.sge[:total]
	wrs, ahs, binds := d.WRs[:n], d.AHs[:n], d.Binds[:n]
	p = b
	for i := 0; i < n; i++ {
		p, _ = wire.Read(p, &sw)
		w := &wrs[i]
		*w = qp.SendWR{WRID: sw.WRID, Opcode: qp.WROpcode(sw.Opcode), Flags: qp.SendFlags(sw.SendFlags),
			Imm: sw.ImmData, InvRKey: sw.InvalidateRKey, RemoteAddr: sw.RemoteAddr, RKey: sw.RKey,
			RemoteQPN: sw.RemoteQPN, RemoteQKey: sw.RemoteQKey, CompareAdd: sw.CompareAdd, Swap: sw.Swap}
		if w.Opcode == qp.WRBindMW {
			if err := decodeBind(w, &sw, &binds[i]); err != nil {
				return nil, err
			}
		}
		if w.Opcode == qp.WRFlush {
			w.FlushLength, w.FlushType, w.FlushLevel = uint32(sw.CompareAdd), qp.FlushType(sw.Swap), qp.FlushLevel(sw.Swap>>wire.FlushLevelShift)
			w.CompareAdd, w.Swap = 0, 0
		}
		if sw.HasAH != 0 {
			ahs[i] = qp.AH{AHAttr: AHAttrFromWire(&sw.AH)}
			w.AH = &ahs[i]
		}
		if sw.InlineLen > 0 {
			w.Inline = p[:sw.InlineLen:sw.InlineLen]
			p = p[align8(int(sw.InlineLen)):]
			continue
		}
		ns := int(sw.NumSGE)
		w.SGL = decodeSGL(sges[:ns:ns], p)
		sges = sges[ns:]
		p = p[ns*sgeSize:]
	}
	return wrs, nil
}

// decodeBind reads a BIND_MW's bind out of its fields (wire.SendWR). The new R_Key names the
// same window as the current one (a client always picks the new key byte: type 1 windows too,
// ibv_bind_mw returns it), so a new R_Key of 0 is refused here, never drawn by the device.
func decodeBind(w *qp.SendWR, sw *wire.SendWR, b *qp.BindInfo) error {
	if sw.NumSGE != 0 || sw.InlineLen != 0 || sw.Swap > 0xFFFFFFFF {
		return fmt.Errorf("%w: BIND_MW with data or access bits beyond 32", ErrProtocol)
	}
	*b = qp.BindInfo{MWRKey: sw.InvalidateRKey, NewRKey: sw.RKey, MRLKey: sw.ImmData, Addr: sw.RemoteAddr,
		Length: sw.CompareAdd, Access: uint32(sw.Swap)}
	if mr.KeyIndex(b.NewRKey) != mr.KeyIndex(b.MWRKey) {
		return fmt.Errorf("%w: BIND_MW's new R_Key %#x is not one of the window's (%#x)", mr.ErrInvalidArg, b.NewRKey, b.MWRKey)
	}
	w.Bind = b
	w.InvRKey, w.RKey, w.Imm, w.RemoteAddr, w.CompareAdd, w.Swap = 0, 0, 0, 0, 0, 0
	return nil
}

func decodeSGL(dst []qp.SGE, p []byte) []qp.SGE {
	var s wire.SGE
	for j := range dst {
		p, _ = wire.Read(p, &s)
		dst[j] = qp.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
	}
	return dst
}

// RecvDecoder decodes post-recv messages into reused storage.
type RecvDecoder struct {
	WRs []qp.RecvWR
	sge []qp.SGE
}

// Decode decodes n receive WRs from b.
func (d *RecvDecoder) Decode(b []byte, n int) ([]qp.RecvWR, error) {
	if n < 0 || n > len(b)/recvWRSize {
		return nil, ErrProtocol
	}
	if cap(d.WRs) < n {
		d.WRs = make([]qp.RecvWR, n)
	}
	var rw wire.RecvWR
	total, p := 0, b
	for i := 0; i < n; i++ {
		rest, ok := wire.Read(p, &rw)
		if !ok {
			return nil, ErrProtocol
		}
		if uint64(rw.NumSGE) > uint64(len(rest)/sgeSize) {
			return nil, ErrProtocol
		}
		total += int(rw.NumSGE)
		p = rest[int(rw.NumSGE)*sgeSize:]
	}
	if len(p) != 0 {
		return nil, ErrProtocol
	}
	if cap(d.sge) < total {
		d.sge = make([]qp.SGE, total)
	}
	sges := d.sge[:total]
	wrs := d.WRs[:n]
	p = b
	for i := 0; i < n; i++ {
		p, _ = wire.Read(p, &rw)
		ns := int(rw.NumSGE)
		wrs[i] = qp.RecvWR{WRID: rw.WRID, SGL: decodeSGL(sges[:ns:ns], p)}
		sges = sges[ns:]
		p = p[ns*sgeSize:]
	}
	return wrs, nil
}

// AppendPosted encodes a successful post response.
func AppendPosted(dst []byte, op wire.Op, n int) []byte {
	r := wire.PostResp{Posted: uint32(n)}
	return wire.Append(AppendOK(dst, op), &r)
}

// Posted decodes the count of a post response body.
func Posted(body []byte) (int, error) {
	var r wire.PostResp
	if _, ok := wire.Read(body, &r); !ok {
		return 0, ErrProtocol
	}
	return int(r.Posted), nil
}

// AHAttrToWire converts an address vector.
func AHAttrToWire(a *qp.AHAttr) wire.AHAttr {
	w := wire.AHAttr{FlowLabel: a.FlowLabel, SGIDIndex: a.SGIDIndex, HopLimit: a.HopLimit,
		TrafficClass: a.TrafficClass, SL: a.SL, PortNum: a.Port}
	if a.DGID.IsValid() {
		w.DGID = a.DGID.As16()
	}
	return w
}

// AHAttrFromWire converts an address vector (port 0 reads as 1; the zero
// GID as no address).
func AHAttrFromWire(w *wire.AHAttr) qp.AHAttr {
	a := qp.AHAttr{FlowLabel: w.FlowLabel, SGIDIndex: w.SGIDIndex, HopLimit: w.HopLimit,
		TrafficClass: w.TrafficClass, SL: w.SL, Port: w.PortNum}
	if a.Port == 0 {
		a.Port = 1
	}
	if w.DGID != ([16]byte{}) {
		a.DGID = netip.AddrFrom16(w.DGID).Unmap()
	}
	return a
}

// AddrToGID is an address as a GID (IPv4 as IPv4-mapped IPv6; the zero GID for none).
func AddrToGID(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}

// GIDToAddr is the address of a GID (IPv4-mapped ones as IPv4; the zero GID as none).
func GIDToAddr(g [16]byte) netip.Addr {
	if g == ([16]byte{}) {
		return netip.Addr{}
	}
	return netip.AddrFrom16(g).Unmap()
}
