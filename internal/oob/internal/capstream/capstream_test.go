package capstream

import (
	"bytes"
	"testing"
)

// TestLoadAll checks the reassembly against what the capture notes
// (captures/*.txt) list for each conversation.
func TestLoadAll(t *testing.T) {
	cases := []struct {
		name                 string
		clientLen, serverLen int
	}{
		{"rc_pingpong.pcap", 57, 52},
		{"rc_pingpong_small.pcap", 57, 52},
		{"uc_pingpong.pcap", 57, 52},
		{"ud_pingpong.pcap", 57, 52},
		{"srq_pingpong.pcap", 256*52 + 5, 256 * 52},
		{"ib_write_bw.pcap", 16 + 4 + 4 + 2 + 5*108 + 5*8 + 5, 16 + 4 + 4 + 2 + 5*108 + 5*8 + 5},
		{"ib_write_lat.pcap", 16 + 4 + 4 + 2 + 4*108, 16 + 4 + 4 + 2 + 4*108},
		{"ib_read_lat.pcap", 16 + 4 + 4 + 2 + 5*108 + 5, 16 + 4 + 4 + 2 + 5*108 + 5},
	}
	for _, c := range cases {
		s, err := Load(c.name, 18515, MarkFill)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := len(s.Bytes(true)); got != c.clientLen {
			t.Errorf("%s: client sent %d bytes, want %d", c.name, got, c.clientLen)
		}
		if got := len(s.Bytes(false)); got != c.serverLen {
			t.Errorf("%s: server sent %d bytes, want %d", c.name, got, c.serverLen)
		}
		// Merging keeps every byte, in order per direction.
		for _, peer := range []bool{true, false} {
			var cl, sv []byte
			for _, ch := range s.Merged(peer) {
				if ch.FromClient {
					cl = append(cl, ch.Data...)
				} else {
					sv = append(sv, ch.Data...)
				}
			}
			if !bytes.Equal(cl, s.Bytes(true)) || !bytes.Equal(sv, s.Bytes(false)) {
				t.Errorf("%s: Merged(%v) changed the streams", c.name, peer)
			}
		}
	}
}

// TestGap: srq_pingpong.pcap lacks one server segment; without a fill
// function that is an error, with one the gap is listed.
func TestGap(t *testing.T) {
	if _, err := Load("srq_pingpong.pcap", 18515, nil); err == nil {
		t.Fatal("no error for the missing segment")
	}
	s, err := Load("srq_pingpong.pcap", 18515, MarkFill)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Missing) != 1 || s.Missing[0].FromClient || s.Missing[0].End-s.Missing[0].Off != 1716 {
		t.Fatalf("Missing = %+v", s.Missing)
	}
}
