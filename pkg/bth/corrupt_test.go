package bth

import (
	"sort"
	"testing"
)

// TestCorruptEveryByteEveryCapture extends TestBitFlipEverywhere to every RoCE packet of every
// reference capture: each byte of the IP packet is corrupted twice, once in its ICRC-masked
// bits only (IBTA A17.3.3: IPv4 TOS/TTL/checksum, IPv6 traffic class/flow label/hop limit,
// UDP checksum, BTH byte 4 — the ICRC must not change) and once in its unmasked bits (the
// ICRC check over the real IP header must fail, or the packet no longer parse as RoCE IP).
func TestCorruptEveryByteEveryCapture(t *testing.T) {
	frames := captureFrames(t)
	names := make([]string, 0, len(frames))
	for n := range frames {
		names = append(names, n)
	}
	sort.Strings(names)
	pkts, masked, detected := 0, 0, 0
	for _, name := range names {
		for fi := range frames[name] {
			f := frames[name][fi]
			ip := f.IP
			want := GetICRC(f.UDPPayload)
			if got, err := ICRCFromIP(ip); err != nil || got != want {
				t.Fatalf("%s frame %d: baseline ICRC %#x %v, captured %#x", name, f.Number, got, err, want)
			}
			pkts++
			for i := range ip {
				m := ipMaskedBits(&f, i)
				if m != 0 {
					ip[i] ^= m
					got, err := ICRCFromIP(ip)
					ip[i] ^= m
					if err != nil || got != want {
						t.Fatalf("%s frame %d: corrupting the masked bits %#02x of byte %d changed the ICRC (%v)", name, f.Number, m, i, err)
					}
					masked++
				}
				if u := ^m; u != 0 {
					ip[i] ^= u
					got, err := ICRCFromIP(ip)
					stored := GetICRC(f.UDPPayload) // the corrupted packet's ICRC field
					ip[i] ^= u
					if err == nil && got == stored {
						t.Fatalf("%s frame %d: corrupting byte %d (bits %#02x) not detected", name, f.Number, i, u)
					}
					detected++
				}
			}
		}
	}
	if pkts < 314 {
		t.Fatalf("only %d RoCE packets", pkts)
	}
	t.Logf("%d packets of %d captures: %d masked corruptions kept the ICRC, %d others detected", pkts, len(names), masked, detected)
}

// referenceCaptures are the pcaps of ../shared/rxe-lab/captures (kernel rxe traffic recorded
// in the lab), copied into testdata/captures so no test reads ../shared at run time. Every
// golden test (TestGoldenCaptures, TestCorruptEveryByteEveryCapture, the layer and decode
// tests) globs testdata/captures; this test makes a lost copy fail.
var referenceCaptures = []string{
	"guest-to-host-rc-ipv6.pcap", "guest-to-host-rc.pcap", "host-to-guest-rc.pcap",
	"ib_atomic_bw_cas.pcap", "ib_atomic_bw_faa.pcap", "ib_read_bw.pcap", "ib_read_lat.pcap",
	"ib_send_bw.pcap", "ib_send_lat.pcap", "ib_write_bw.pcap", "ib_write_lat.pcap",
	"rc_pingpong.pcap", "rc_pingpong_small.pcap", "rping.pcap", "srq_pingpong.pcap",
	"uc_pingpong.pcap", "ucmatose.pcap", "ud_pingpong.pcap", "udaddy.pcap",
	// from the interop suite: softroce and kernel rxe over IPv6 (rdma_cm, SEND, READ, WRITE)
	"ipv6-rping.pcap",
}

func TestReferenceCapturesPresent(t *testing.T) {
	frames := captureFrames(t)
	for _, n := range referenceCaptures {
		if len(frames[n]) == 0 {
			t.Errorf("testdata/captures/%s missing or without RoCE packets", n)
		}
	}
}
