package roce

import (
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/afxdp"
)

// splitGSO handles dg as an unsegmented GSO message of the AF_XDP path if it is one (a datagram
// of several RoCE packets: afxdp.SegmentSize) and reports whether it was; false leaves dg to be
// dropped by the caller.
func (d *Device) splitGSO(rx *rxState, dg *link.Datagram) bool {
	s := afxdp.SegmentSize(dg, rx.segmentICRC)
	if s == 0 {
		return false
	}
	d.handleSegments(rx, dg, s)
	return true
}

// segmentICRC is icrcWithID as an afxdp.ICRCFunc.
func (rx *rxState) segmentICRC(ep bth.Endpoints, seg []byte, id uint16) uint32 {
	return rx.icrcWithID(&ep, seg, id)
}

// handleSegments handles dg's segments of size s, which afxdp.SegmentSize found: each as a
// datagram with its IPv4 ID, its ICRC not checked again. rx.splitting is cleared however the
// handling ends (application code runs in it: a panic the application recovers from must not
// leave the next GSO message unsplit).
func (d *Device) handleSegments(rx *rxState, dg *link.Datagram, s int) {
	b, n := dg.Buf, len(dg.Buf)
	rx.splitting = true
	defer func() { rx.splitting, rx.seg = false, link.Datagram{} }()
	d.cnt.RcvdGSOSplit.Add(1)
	id := dg.IPv4ID
	for off := 0; off < n; off += s {
		end := min(off+s, n)
		rx.seg = link.Datagram{Buf: b[off:end:end], Src: dg.Src, Dst: dg.Dst, TClass: dg.TClass, HasIPv4ID: true, IPv4ID: id}
		d.handleChecked(rx, &rx.seg, true)
		id++
	}
}
