package decode

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A streaming reader for the two capture containers decode accepts: classic
// pcap (https://www.tcpdump.org/manpages/pcap-savefile.5.html) and pcapng
// (draft-ietf-opsawg-pcapng). The tests read captures with gopacket's pcapgo;
// decode keeps this reader because its input is a file from anywhere: every
// length the file claims is bounded (maxRecord) before a byte is buffered, the
// one buffer is reused for every record, and each malformed container is a
// distinct error (the decode tests and FuzzDecodeFile hold it to that).
// pcapgo accepts a record as long as the file's own snap length (up to 4 GiB)
// and buffers it whole.

// maxRecord bounds the bytes one record (pcap) or block (pcapng) may claim, so a
// hostile length field cannot make the reader allocate gigabytes.
const maxRecord = 1 << 24

var (
	errNotCapture   = errors.New("not a pcap or pcapng file")
	errTruncatedCap = errors.New("truncated capture file")
)

// captureReader returns the packets of a pcap or pcapng stream in file order.
type captureReader struct {
	r     *bufio.Reader
	ng    bool
	order binary.ByteOrder
	link  uint32   // pcap: the file's link type
	iface []uint32 // pcapng: link type per interface of the current section
	snap  []uint32 // pcapng: snap length per interface
	buf   []byte
}

func newCaptureReader(r io.Reader) (*captureReader, error) {
	c := &captureReader{r: bufio.NewReaderSize(r, 1<<16)}
	magic, err := c.r.Peek(4)
	if err != nil {
		return nil, errNotCapture
	}
	switch binary.LittleEndian.Uint32(magic) {
	case 0xa1b2c3d4, 0xa1b23c4d: // micro/nanosecond, little-endian file
		c.order = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		c.order = binary.BigEndian
	case 0x0a0d0d0a:
		c.ng = true
		// The section header block is read by the first next call; check it now
		// so that a bad file fails before any output.
		if err := c.readSHB(); err != nil {
			return nil, err
		}
		return c, nil
	default:
		return nil, errNotCapture
	}
	var h [24]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return nil, fmt.Errorf("%w (pcap header)", errTruncatedCap)
	}
	if major := c.order.Uint16(h[4:6]); major != 2 {
		return nil, fmt.Errorf("unsupported pcap version %d", major)
	}
	// Bits 0-15 are the link type; 16-27 reserved; 28-31 FCS information.
	c.link = c.order.Uint32(h[20:24]) & 0xffff
	return c, nil
}

// linkType of the pcap file (0 and false for pcapng, where it is per interface).
func (c *captureReader) fileLinkType() (uint32, bool) { return c.link, !c.ng }

// next returns the next packet's captured bytes (valid until the following
// call) and its link type; io.EOF at the clean end of the file.
func (c *captureReader) next() ([]byte, uint32, error) {
	if c.ng {
		return c.nextNg()
	}
	var h [16]byte
	n, err := io.ReadFull(c.r, h[:])
	if err == io.EOF && n == 0 {
		return nil, 0, io.EOF
	}
	if err != nil {
		return nil, 0, errTruncatedCap
	}
	incl := c.order.Uint32(h[8:12])
	if incl > maxRecord {
		return nil, 0, fmt.Errorf("record length %d too large", incl)
	}
	data, err := c.read(int(incl))
	if err != nil {
		return nil, 0, err
	}
	return data, c.link, nil
}

func (c *captureReader) read(n int) ([]byte, error) {
	if cap(c.buf) < n {
		c.buf = make([]byte, n)
	}
	b := c.buf[:n]
	if _, err := io.ReadFull(c.r, b); err != nil {
		return nil, errTruncatedCap
	}
	return b, nil
}

// pcapng block types.
const (
	ngSHB = 0x0a0d0d0a
	ngIDB = 0x00000001
	ngPB  = 0x00000002 // obsolete Packet Block
	ngSPB = 0x00000003
	ngEPB = 0x00000006
)

// readBlock reads one whole block and returns its type and body (without the
// type, the two lengths).
func (c *captureReader) readBlock() (uint32, []byte, error) {
	var h [8]byte
	n, err := io.ReadFull(c.r, h[:])
	if err == io.EOF && n == 0 {
		return 0, nil, io.EOF
	}
	if err != nil {
		return 0, nil, errTruncatedCap
	}
	typ := c.order.Uint32(h[0:4])
	if typ == ngSHB {
		return typ, nil, errors.New("unexpected section header") // handled by the caller
	}
	total := c.order.Uint32(h[4:8])
	if total < 12 || total%4 != 0 || total > maxRecord {
		return 0, nil, fmt.Errorf("bad pcapng block length %d", total)
	}
	b, err := c.read(int(total) - 8)
	if err != nil {
		return 0, nil, err
	}
	if c.order.Uint32(b[len(b)-4:]) != total {
		return 0, nil, errors.New("pcapng block lengths disagree")
	}
	return typ, b[:len(b)-4], nil
}

// readSHB reads a section header block (the byte order is set by its
// byte-order magic) and forgets the previous section's interfaces.
func (c *captureReader) readSHB() error {
	var h [12]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return fmt.Errorf("%w (pcapng section header)", errTruncatedCap)
	}
	switch binary.LittleEndian.Uint32(h[8:12]) {
	case 0x1a2b3c4d:
		c.order = binary.LittleEndian
	case 0x4d3c2b1a:
		c.order = binary.BigEndian
	default:
		return errors.New("bad pcapng byte-order magic")
	}
	total := c.order.Uint32(h[4:8])
	if total < 28 || total%4 != 0 || total > maxRecord {
		return fmt.Errorf("bad pcapng section header length %d", total)
	}
	if _, err := c.read(int(total) - 12); err != nil {
		return err
	}
	c.iface, c.snap = c.iface[:0], c.snap[:0]
	return nil
}

func (c *captureReader) nextNg() ([]byte, uint32, error) {
	for {
		b, err := c.r.Peek(4)
		if len(b) == 0 && err == io.EOF {
			return nil, 0, io.EOF
		}
		if err != nil {
			return nil, 0, errTruncatedCap
		}
		if binary.LittleEndian.Uint32(b) == ngSHB {
			if err := c.readSHB(); err != nil {
				return nil, 0, err
			}
			continue
		}
		typ, body, err := c.readBlock()
		if err != nil {
			return nil, 0, err
		}
		switch typ {
		case ngIDB:
			if len(body) < 8 {
				return nil, 0, errors.New("short pcapng interface block")
			}
			c.iface = append(c.iface, uint32(c.order.Uint16(body[0:2])))
			c.snap = append(c.snap, c.order.Uint32(body[4:8]))
		case ngEPB, ngPB:
			if len(body) < 20 {
				return nil, 0, errors.New("short pcapng packet block")
			}
			var id uint32
			if typ == ngEPB {
				id = c.order.Uint32(body[0:4])
			} else {
				id = uint32(c.order.Uint16(body[0:2]))
			}
			caplen := c.order.Uint32(body[12:16])
			if id >= uint32(len(c.iface)) {
				return nil, 0, fmt.Errorf("packet on undefined interface %d", id)
			}
			if uint64(caplen) > uint64(len(body)-20) {
				return nil, 0, errors.New("pcapng packet longer than its block")
			}
			return body[20 : 20+caplen], c.iface[id], nil
		case ngSPB:
			if len(body) < 4 {
				return nil, 0, errors.New("short pcapng simple packet block")
			}
			if len(c.iface) == 0 {
				return nil, 0, errors.New("simple packet block without an interface")
			}
			n := uint64(c.order.Uint32(body[0:4]))
			if s := uint64(c.snap[0]); s != 0 && n > s {
				n = s
			}
			if n > uint64(len(body)-4) {
				n = uint64(len(body) - 4)
			}
			return body[4 : 4+n], c.iface[0], nil
		}
		// Other blocks (statistics, name resolution, custom...) are skipped.
	}
}
