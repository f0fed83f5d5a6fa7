package decode

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/bth/layer"
)

// roceFrame is an Ethernet/IPv4/UDP frame (198.18.0.2 -> 198.18.0.1, DF, ID 0) carrying
// udpPayload with the A17.3.3 ICRC; rxe: the ICRC continued over udpPayload's headers a second
// time instead, as kernel rxe sends a FLUSH.
func roceFrame(t *testing.T, udpPayload []byte, rxe bool) []byte {
	t.Helper()
	f := make([]byte, 14+20+8+len(udpPayload))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(udpPayload)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	copy(ip[12:], []byte{198, 18, 0, 2, 198, 18, 0, 1})
	binary.BigEndian.PutUint16(ip[20:], 0xc001)
	binary.BigEndian.PutUint16(ip[22:], bth.UDPPort)
	binary.BigEndian.PutUint16(ip[24:], uint16(8+len(udpPayload)))
	copy(ip[28:], udpPayload)
	if err := layer.FixICRC(ip); err != nil {
		t.Fatal(err)
	}
	if rxe {
		u := ip[28:]
		bth.SetICRC(u, bth.RxeFlushICRC(bth.GetICRC(u), u))
	}
	return f
}

// TestDecodeRxeFlushICRC: a FLUSH carrying kernel rxe's ICRC is named as that ("rxe-flush",
// icrc_variant in JSON, counted apart in the summary), not as BAD; the same ICRC on a WRITE,
// or on a FLUSH changed after it was computed, is BAD; a FLUSH with the A17.3.3 ICRC is ok.
func TestDecodeRxeFlushICRC(t *testing.T) {
	flush := make([]byte, bth.BTHSize+bth.FETHSize+bth.RETHSize+bth.ICRCSize)
	bth.BTH(flush).Encode(&bth.BTHFields{Opcode: bth.OpRCFlush, PKey: 0xffff, DestQP: 0x11, AckReq: true, PSN: 7})
	bth.FETH(flush[bth.BTHSize:]).Encode(&bth.FETHFields{Placement: bth.FlushGlobal, Selectivity: bth.FlushRange})
	bth.RETH(flush[bth.BTHSize+bth.FETHSize:]).Encode(&bth.RETHFields{VA: 0x1000, RKey: 0x1234, DMALen: 300})
	write := make([]byte, bth.BTHSize+bth.RETHSize+8+bth.ICRCSize)
	bth.BTH(write).Encode(&bth.BTHFields{Opcode: bth.OpRCWriteOnly, PKey: 0xffff, DestQP: 0x11, PSN: 8})
	bth.RETH(write[bth.BTHSize:]).Encode(&bth.RETHFields{VA: 0x1000, RKey: 0x1234, DMALen: 8})
	changed := roceFrame(t, flush, true)
	changed[len(changed)-bth.ICRCSize-1] ^= 1 // the RETH's DMA length
	p := writeTemp(t, "x.pcap", writePcap(binary.LittleEndian, false, 1, [][]byte{
		roceFrame(t, flush, false), roceFrame(t, flush, true), roceFrame(t, write, true), changed}))
	out, _, code := decode(t, p)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{" ok", " rxe-flush", " BAD", " BAD"}
	if len(lines) != 5 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	for i, w := range want {
		if !strings.HasSuffix(lines[i], w) {
			t.Errorf("frame %d: %q, want it to end in %q", i+1, lines[i], w)
		}
	}
	if s := "# 4 RoCE packets (ICRC ok 1, bad 2, rxe FLUSH ICRC 1), 0 malformed, 0 other frames"; lines[4] != s {
		t.Errorf("summary %q, want %q", lines[4], s)
	}
	js, _, _ := decode(t, "--json", p)
	jl := strings.Split(strings.TrimSuffix(js, "\n"), "\n")
	if len(jl) != 4 || !strings.Contains(jl[1], `"icrc_ok":false,"icrc_variant":"rxe-flush"`) ||
		strings.Contains(jl[0], "icrc_variant") || strings.Contains(jl[2], "icrc_variant") || strings.Contains(jl[3], "icrc_variant") {
		t.Errorf("json:\n%s", js)
	}
}

// TestDecodePlacementCaptures: the kernel rxe 6.12 captures of testdata/placement (ATOMIC
// WRITE and FLUSH between rxe and softroce) decode with every opcode named, each FLUSH with
// its FETH and rxe's ICRC variant (rxe's own FLUSHes, and softroce's sent with
// roce.Options.RxeFlushICRC), every other packet ICRC-clean.
func TestDecodePlacementCaptures(t *testing.T) {
	for _, c := range []struct {
		file    string
		flushes []string // the FETHs in order
		summary string
	}{
		{"rxe-to-softroce.pcap", []string{"feth[placement=1 selectivity=0]", "feth[placement=1 selectivity=1]"},
			"# 16 RoCE packets (ICRC ok 14, bad 0, rxe FLUSH ICRC 2), 0 malformed, 0 other frames"},
		{"softroce-to-rxe.pcap", []string{"feth[placement=1 selectivity=0]", "feth[placement=1 selectivity=1]", "feth[placement=1 selectivity=0]"},
			"# 16 RoCE packets (ICRC ok 13, bad 0, rxe FLUSH ICRC 3), 0 malformed, 0 other frames"},
	} {
		out, _, code := decode(t, "../../../testdata/placement/"+c.file)
		if code != 0 {
			t.Fatalf("%s: exit %d", c.file, code)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		var flushes []string
		atomics := 0
		for _, l := range lines[:len(lines)-1] {
			switch {
			case strings.Contains(l, " RC Flush "):
				if !strings.HasSuffix(l, " rxe-flush") {
					t.Errorf("%s: %q: want rxe's FLUSH ICRC", c.file, l)
				}
				if i := strings.Index(l, "feth["); i >= 0 {
					flushes = append(flushes, l[i:i+strings.Index(l[i:], "]")+1])
				}
			case strings.Contains(l, " RC Atomic Write "):
				atomics++
				fallthrough
			default:
				if !strings.HasSuffix(l, " ok") || strings.Contains(l, "Unknown") {
					t.Errorf("%s: %q", c.file, l)
				}
			}
		}
		if strings.Join(flushes, " ") != strings.Join(c.flushes, " ") || atomics != 3 {
			t.Errorf("%s: FLUSHes %q, %d ATOMIC WRITEs; want %q and 3", c.file, flushes, atomics, c.flushes)
		}
		if lines[len(lines)-1] != c.summary {
			t.Errorf("%s: summary %q, want %q", c.file, lines[len(lines)-1], c.summary)
		}
	}
}
