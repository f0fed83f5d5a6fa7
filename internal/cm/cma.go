package cm

import (
	"errors"
	"net/netip"
)

// PortSpace is an rdma_cm port space (enum rdma_ucm_port_space); it forms
// bytes 4-5 of the service ID (IBTA Annex A11, "RDMA IP CM Service").
type PortSpace uint16

// rdma_cm port spaces.
const (
	PSIPoIB PortSpace = 0x0002
	PSTCP   PortSpace = 0x0106 // connected (RC) rdma_cm IDs: rping, ucmatose
	PSUDP   PortSpace = 0x0111 // UD rdma_cm IDs resolved by SIDR: udaddy
	PSIB    PortSpace = 0x013F
)

// ServiceIDPrefix is the IBTA-assigned IP CM service ID range: service IDs
// 0x0000000001PPPPPP (IB_CMA_SERVICE_ID, mask 0xFFFFFFFFFF000000).
const (
	ServiceIDPrefix     = 0x0000000001000000
	serviceIDPrefixMask = 0xFFFFFFFFFF000000
)

// ServiceID returns the rdma_cm service ID for a port space and port:
// ps << 16 | port, e.g. 0x0000000001061C06 for TCP port 7174 (cma.c
// cma_get_service_id).
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// SplitServiceID splits an rdma_cm service ID into port space and port;
// ok is false if id is outside the IP CM range.
func SplitServiceID(id uint64) (ps PortSpace, port uint16, ok bool) {
	if id&serviceIDPrefixMask != ServiceIDPrefix {
		return 0, 0, false
	}
	return PortSpace(id >> 16), uint16(id), true
}

// CMAHeaderSize is the size of the rdma_cm private-data header.
const CMAHeaderSize = 36

// CMAVersion is the header version rdma_cm sends (CMA_VERSION).
const CMAVersion = 0x00

const (
	cmaVersion = 0 // major 4 | minor 4
	cmaIPVer   = 1 // IP version 4 | reserved 4
	cmaPort    = 2
	cmaSrc     = 4
	cmaDst     = 20
)

// CMAHeader is a view of the header rdma_cm puts at the start of REQ and
// SIDR_REQ private data (IBTA Annex A11 IP CM private data; struct cma_hdr
// in drivers/infiniband/core/cma.c):
//
//	 0 MajorVersion(4) MinorVersion(4) IPVersion(4) Reserved(4) SourcePort(16)
//	 4 SourceAddress (16 bytes; IPv4 in the last 4, the first 12 zero)
//	20 DestinationAddress (16 bytes)
//
// The destination port is not here: it is the low 16 bits of the service ID.
// User private data follows the header (56 bytes fit in a REQ).
type CMAHeader []byte

// CMAHeaderFields holds every field of the header.
type CMAHeaderFields struct {
	MajorVersion uint8 // 4 bits
	MinorVersion uint8 // 4 bits
	IPVersion    uint8 // 4 bits: 4 or 6
	Resv         uint8 // 4 bits
	SrcPort      uint16
	Src          [16]byte
	Dst          [16]byte
}

// Errors of ParsePrivateData and BuildPrivateData.
var (
	ErrCMAShort     = errors.New("cm: private data shorter than the CMA header")
	ErrCMAVersion   = errors.New("cm: unsupported CMA header version")
	ErrCMAIPVersion = errors.New("cm: CMA header IP version is neither 4 nor 6")
	ErrTooLong      = errors.New("cm: private data too long")
	ErrAddr         = errors.New("cm: invalid or mixed-family addresses")
)

// Version returns the version byte (major << 4 | minor).
func (h CMAHeader) Version() uint8 { return h[cmaVersion] }

// IPVersion returns the IP version (4 or 6).
func (h CMAHeader) IPVersion() uint8 { return bits(h[cmaIPVer], 4, 4) }

// SrcPort returns the active side's source port.
func (h CMAHeader) SrcPort() uint16 { return be.Uint16(h[cmaPort:]) }

// Src returns the source address (IPv4 from the last 4 bytes when IPVersion is 4).
func (h CMAHeader) Src() netip.Addr { return h.addr(cmaSrc) }

// Dst returns the destination address.
func (h CMAHeader) Dst() netip.Addr { return h.addr(cmaDst) }

func (h CMAHeader) addr(off int) netip.Addr {
	if h.IPVersion() == 4 {
		return netip.AddrFrom4([4]byte(h[off+12 : off+16]))
	}
	return netip.AddrFrom16([16]byte(h[off : off+16]))
}

// Encode writes every field of f into the header.
func (h CMAHeader) Encode(f *CMAHeaderFields) {
	_ = h[CMAHeaderSize-1]
	h[cmaVersion] = f.MajorVersion<<4 | f.MinorVersion&0xF
	h[cmaIPVer] = f.IPVersion<<4 | f.Resv&0xF
	be.PutUint16(h[cmaPort:], f.SrcPort)
	copy(h[cmaSrc:], f.Src[:])
	copy(h[cmaDst:], f.Dst[:])
}

// Fields returns every field of the header.
func (h CMAHeader) Fields() CMAHeaderFields {
	_ = h[CMAHeaderSize-1]
	f := CMAHeaderFields{MajorVersion: bits(h[cmaVersion], 4, 4), MinorVersion: bits(h[cmaVersion], 0, 4),
		IPVersion: h.IPVersion(), Resv: bits(h[cmaIPVer], 0, 4), SrcPort: h.SrcPort()}
	copy(f.Src[:], h[cmaSrc:cmaSrc+16])
	copy(f.Dst[:], h[cmaDst:cmaDst+16])
	return f
}

// NewCMAHeader returns the header rdma_cm builds for a connection from
// src:srcPort to dst (both IPv4 or both IPv6; IPv4-mapped counts as IPv4).
func NewCMAHeader(src, dst netip.Addr, srcPort uint16) (CMAHeaderFields, error) {
	src, dst = src.Unmap(), dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return CMAHeaderFields{}, ErrAddr
	}
	f := CMAHeaderFields{SrcPort: srcPort}
	if src.Is4() {
		f.IPVersion = 4
		s, d := src.As4(), dst.As4()
		copy(f.Src[12:], s[:])
		copy(f.Dst[12:], d[:])
	} else {
		f.IPVersion = 6
		f.Src, f.Dst = src.As16(), dst.As16()
	}
	return f, nil
}

// BuildPrivateData writes the CMA header h followed by user into dst (a
// message's private data area) and returns the bytes used. It fails with
// ErrTooLong if they do not fit.
func BuildPrivateData(dst []byte, h *CMAHeaderFields, user []byte) (int, error) {
	n := CMAHeaderSize + len(user)
	if n > len(dst) {
		return 0, ErrTooLong
	}
	CMAHeader(dst).Encode(h)
	copy(dst[CMAHeaderSize:], user)
	return n, nil
}

// ParsePrivateData splits REQ or SIDR_REQ private data into the CMA header
// and the user private data after it (views, no copy). The header must be
// version 0 with IP version 4 or 6.
func ParsePrivateData(pd []byte) (CMAHeader, []byte, error) {
	if len(pd) < CMAHeaderSize {
		return nil, nil, ErrCMAShort
	}
	h := CMAHeader(pd[:CMAHeaderSize])
	if h.Version() != CMAVersion {
		return nil, nil, ErrCMAVersion
	}
	if v := h.IPVersion(); v != 4 && v != 6 {
		return nil, nil, ErrCMAIPVersion
	}
	return h, pd[CMAHeaderSize:], nil
}
