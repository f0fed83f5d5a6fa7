//go:build interop

package interop

// UDP GSO toward kernel rxe (docs/interop.md, "UDP GSO"). One sendmsg with UDP_SEGMENT
// carries all packets of a message; the kernel splits it (software GSO on the tap, which
// has no UDP segmentation offload) and numbers the IPv4 IDs of the segments upward from
// the ID of the whole send: 0 for an unconnected DF socket (inet_gso_segment, id++ per
// segment; only TCP has a fixed-ID mode). So segment k must carry an ICRC computed for
// IPv4 ID k. The capture cross-check in rawPingpong asserts those IDs on the wire and
// rxe's ACK shows it accepted them. The lab's tap runs with tx checksumming off: the
// host kernel (6.18 here) still accepts UDP GSO and checksums in software; older kernels
// answer EIO there (wireguard-go falls back to single sends on EIO), so a sender must keep
// that fallback.

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	pairings = append(pairings,
		pairing{Name: "raw-rc-send-gso-3000x2", Direction: SoftroceToRxe, Run: func(t *testing.T, lab *rxelab.Lab) {
			rawGSO(t, lab, rawOptions{Size: 3000, Iters: 2, Client: true, GSO: true})
		}},
		pairing{Name: "raw-rc-send-gso-3000x2", Direction: RxeToSoftroce, Run: func(t *testing.T, lab *rxelab.Lab) {
			rawGSO(t, lab, rawOptions{Size: 3000, Iters: 2, Client: false, GSO: true})
		}},
	)
}

// udpSegmentCmsg is the SOL_UDP/UDP_SEGMENT control message for segments of size bytes.
func udpSegmentCmsg(size int) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], uint16(size))
	return b
}

// sendGSO sends a multi-packet message in one UDP_SEGMENT sendmsg; segment k's ICRC
// covers IPv4 ID k.
func (s *rcSide) sendGSO(msg []byte, segs []rocetest.Segment) bth.PSN {
	s.t.Helper()
	ep := s.peer.Endpoints(guestEP)
	var buf []byte
	segSize := 0
	var last bth.PSN
	for i, seg := range segs {
		sp := rocetest.Spec{Opcode: seg.Opcode, DestQP: s.remote.QPN, PSN: s.sendPSN,
			AckReq: i == len(segs)-1, Payload: msg[seg.Off : seg.Off+seg.Len]}
		ep.IPID = uint16(i)
		n := len(buf)
		var err error
		if buf, err = sp.Append(buf, &ep); err != nil {
			s.t.Fatal(err)
		}
		if i == 0 {
			segSize = len(buf) - n
		} else if i < len(segs)-1 && len(buf)-n != segSize {
			s.t.Fatalf("GSO needs equal segments: %d then %d bytes", segSize, len(buf)-n)
		}
		s.sentIDs = append(s.sentIDs, uint16(i))
		last = s.sendPSN
		s.sendPSN = s.sendPSN.Add(1)
	}
	if _, _, err := s.peer.Conn.WriteMsgUDPAddrPort(buf, udpSegmentCmsg(segSize), guestEP); err != nil {
		s.t.Fatalf("GSO sendmsg (%d bytes, segments of %d): %v", len(buf), segSize, err)
	}
	return last
}

func rawGSO(t *testing.T, lab *rxelab.Lab, o rawOptions) {
	rawPingpong(t, lab, o)
}
