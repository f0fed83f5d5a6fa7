package decode

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// FuzzDecodeFile feeds arbitrary bytes to the capture reader and decoder
// (text and JSON): any input must end in output or an error, never a panic.
// Seeds: a small pcap, its pcapng and big-endian forms, and cut versions.
func FuzzDecodeFile(f *testing.F) {
	recs := pcapRecords(f, "rc_pingpong_small.pcap")
	if len(recs) > 14 {
		recs = recs[10:14]
	}
	ifaces := make([]uint32, len(recs))
	seeds := [][]byte{
		writePcap(binary.LittleEndian, false, 1, recs),
		writePcap(binary.BigEndian, true, 276, recs),
		writePcapng(binary.LittleEndian, []uint16{1}, recs, ifaces),
		writePcapng(binary.BigEndian, []uint16{113, 101}, recs, ifaces),
	}
	for _, s := range seeds {
		f.Add(s)
		f.Add(s[:len(s)/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, js := range []bool{false, true} {
			_ = decodeStream(bytes.NewReader(b), io.Discard, decodeOptions{JSON: js})
		}
	})
}
