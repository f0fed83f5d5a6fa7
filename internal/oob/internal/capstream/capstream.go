// Package capstream extracts the TCP out-of-band conversation from the
// reference captures and replays one side of it against an implementation
// of the other, for the tests of internal/oob/pingpong and internal/oob/perftest.
package capstream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/softroce/softroce/internal/testcap"
)

// Chunk is a run of bytes one side sent.
type Chunk struct {
	FromClient bool
	Frame      int // first frame of the run
	Data       []byte
}

// Script is the conversation on one TCP connection, in capture order.
type Script struct {
	Chunks  []Chunk // one per TCP segment with payload, retransmissions removed
	Missing []Range // stream ranges the capture lacks (filled by Load's fill function)
}

// Range is a byte range [Off, End) of one direction's stream.
type Range struct {
	FromClient bool
	Off, End   int
}

// missing reports whether stream offset off of the direction was not captured.
func (s *Script) missing(fromClient bool, off int) bool {
	for _, r := range s.Missing {
		if r.FromClient == fromClient && off >= r.Off && off < r.End {
			return true
		}
	}
	return false
}

// CapturesDir returns the repository's testdata/captures directory.
func CapturesDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "testdata", "captures")
}

// Load reads the TCP conversation to server port port from the capture
// name (e.g. "rc_pingpong.pcap") in CapturesDir. Segments are reassembled by
// sequence number. A gap (a segment tcpdump did not record) is an error
// unless fill is given: fill returns the n bytes at stream offset off that
// the sender must have sent; they are inserted and listed in Script.Missing,
// and Replay does not compare them.
func Load(name string, port uint16, fill func(fromClient bool, off, n int) []byte) (*Script, error) {
	frames, err := testcap.Read(filepath.Join(CapturesDir(), name))
	if err != nil {
		return nil, err
	}
	var next, isn [2]uint32
	var started [2]bool
	s := &Script{}
	for _, f := range frames {
		ip := f.IP
		if f.IsIPv6 || len(ip) < 20 || ip[9] != 6 {
			continue
		}
		ihl := int(ip[0]&0xf) * 4
		if len(ip) < ihl+20 {
			return nil, fmt.Errorf("frame %d: short TCP header", f.Number)
		}
		tcp := ip[ihl:]
		sport, dport := binary.BigEndian.Uint16(tcp[0:2]), binary.BigEndian.Uint16(tcp[2:4])
		if sport != port && dport != port {
			continue
		}
		dir := 0 // 0 = from client
		if sport == port {
			dir = 1
		}
		seq := binary.BigEndian.Uint32(tcp[4:8])
		off := int(tcp[12]>>4) * 4
		flags := tcp[13]
		if off < 20 || off > len(tcp) {
			return nil, fmt.Errorf("frame %d: bad TCP data offset", f.Number)
		}
		payload := tcp[off:]
		if flags&0x02 != 0 { // SYN
			next[dir], isn[dir], started[dir] = seq+1, seq+1, true
			continue
		}
		if len(payload) == 0 {
			continue
		}
		if !started[dir] {
			return nil, fmt.Errorf("frame %d: data before SYN", f.Number)
		}
		d := int32(seq - next[dir])
		if d > 0 {
			if fill == nil {
				return nil, fmt.Errorf("frame %d: gap of %d bytes", f.Number, d)
			}
			off := int(next[dir] - isn[dir])
			s.Missing = append(s.Missing, Range{FromClient: dir == 0, Off: off, End: off + int(d)})
			s.Chunks = append(s.Chunks, Chunk{FromClient: dir == 0, Frame: f.Number, Data: fill(dir == 0, off, int(d))})
			next[dir] += uint32(d)
			d = 0
		}
		if int(-d) >= len(payload) {
			continue // retransmission
		}
		payload = payload[-d:]
		next[dir] += uint32(len(payload))
		s.Chunks = append(s.Chunks, Chunk{FromClient: dir == 0, Frame: f.Number, Data: append([]byte(nil), payload...)})
	}
	if len(s.Chunks) == 0 {
		return nil, errors.New("no TCP payload on that port")
	}
	return s, nil
}

// Bytes returns everything one side sent, concatenated.
func (s *Script) Bytes(fromClient bool) []byte {
	var b []byte
	for _, c := range s.Chunks {
		if c.FromClient == fromClient {
			b = append(b, c.Data...)
		}
	}
	return b
}

// Merged returns the chunks with consecutive runs of the same direction
// joined, and with a trailing "done\0" of peer side (client if peerIsClient)
// moved after our side's last bytes: in the captures both perftest sides
// write "done" without reading, and a replay that wrote first could make our
// side close with unread data.
func (s *Script) Merged(peerIsClient bool) []Chunk {
	cs := append([]Chunk(nil), s.Chunks...)
	done := []byte("done\x00")
	lastPeer := -1
	for i, c := range cs {
		if c.FromClient == peerIsClient {
			lastPeer = i
		}
	}
	if lastPeer >= 0 && lastPeer < len(cs)-1 && bytes.Equal(cs[lastPeer].Data, done) {
		c := cs[lastPeer]
		cs = append(cs[:lastPeer], cs[lastPeer+1:]...)
		cs = append(cs, c)
	}
	var out []Chunk
	for _, c := range cs {
		if n := len(out); n > 0 && out[n-1].FromClient == c.FromClient {
			out[n-1].Data = append(append([]byte(nil), out[n-1].Data...), c.Data...)
			continue
		}
		out = append(out, Chunk{FromClient: c.FromClient, Frame: c.Frame, Data: append([]byte(nil), c.Data...)})
	}
	return out
}

// MismatchError reports bytes from the implementation under test that differ
// from the capture.
type MismatchError struct {
	Frame     int
	Off       int
	Want, Got []byte
}

// Error implements error.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("bytes for frame %d differ at offset %d:\n want %q\n got  %q", e.Frame, e.Off, e.Want, e.Got)
}

// Replay plays the peer's side of the script on c (the client's side if
// peerIsClient): it writes the peer's bytes and reads and compares ours. After
// the script it expects our side to close without sending more. A write of
// the final deferred "done" may fail (our side closed first); that is ignored.
func (s *Script) Replay(c net.Conn, peerIsClient bool, timeout time.Duration) error {
	chunks := s.Merged(peerIsClient)
	pos := 0 // stream offset of our side
	for i, ch := range chunks {
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if ch.FromClient == peerIsClient {
			if _, err := c.Write(ch.Data); err != nil {
				if i == len(chunks)-1 {
					return nil
				}
				return fmt.Errorf("replay write (frame %d): %w", ch.Frame, err)
			}
			continue
		}
		got := make([]byte, len(ch.Data))
		n, err := io.ReadFull(c, got)
		for off := range n {
			if got[off] != ch.Data[off] && !s.missing(!peerIsClient, pos+off) {
				return &MismatchError{Frame: ch.Frame, Off: off, Want: ch.Data, Got: got[:n]}
			}
		}
		if err != nil {
			return fmt.Errorf("replay read (frame %d): %d of %d bytes: %w", ch.Frame, n, len(ch.Data), err)
		}
		pos += n
	}
	// Nothing more may come: EOF (or a reset) only.
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var extra [64]byte
	n, err := c.Read(extra[:])
	if n > 0 {
		return fmt.Errorf("replay: %d unexpected bytes after the script: %q", n, extra[:n])
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("replay: after the script: %w", err)
	}
	return nil
}

// MarkFill returns n '?' bytes, so that a replay
// writing them is visibly synthetic. Tests that replay a stream with a gap
// pass their own reconstruction.
func MarkFill(_ bool, _, n int) []byte { return bytes.Repeat([]byte{'?'}, n) }
