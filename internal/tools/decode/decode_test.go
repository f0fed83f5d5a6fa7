package decode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/decode")

const capDir = "../../../testdata/captures"

func decode(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = Main(context.Background(), args, &o, &e)
	return o.String(), e.String(), code
}

// TestDecodeGolden compares text and JSON output for several captures with
// testdata/decode/<capture>.{txt,jsonl} (go test -update rewrites them; the
// JSON values were checked against tshark by TestTsharkCompare).
func TestDecodeGolden(t *testing.T) {
	for _, name := range []string{"rc_pingpong_small", "ib_atomic_bw_cas", "udaddy", "ib_read_lat", "guest-to-host-rc-ipv6", "ipv6-rping"} {
		for _, mode := range []struct{ ext, flag string }{{"txt", ""}, {"jsonl", "--json"}} {
			args := []string{filepath.Join(capDir, name+".pcap")}
			if mode.flag != "" {
				args = append([]string{mode.flag}, args...)
			}
			out, errOut, code := decode(t, args...)
			if code != 0 || errOut != "" {
				t.Fatalf("%s %s: exit %d, stderr %q", name, mode.flag, code, errOut)
			}
			golden := filepath.Join("../../../testdata/decode", name+"."+mode.ext)
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Errorf("%s: output differs from %s\ngot:\n%s", name, golden, out)
			}
		}
	}
}

// TestDecodeJSONSchema: every line is one object with only the documented
// keys, the mandatory ones always present, numbers as numbers.
func TestDecodeJSONSchema(t *testing.T) {
	allowed := map[string]bool{}
	for _, k := range strings.Split("frame src dst sport dport opcode opname se m pad tver pkey fecn becn dqpn ackreq psn feth reth aeth atomiceth atomicack imm ieth deth payload_len icrc icrc_ok icrc_variant", " ") {
		allowed[k] = true
	}
	mandatory := strings.Split("frame src dst sport dport opcode opname se m pad tver pkey fecn becn dqpn ackreq psn payload_len icrc icrc_ok", " ")
	sub := map[string][]string{
		"reth": {"len", "rkey", "va"}, "aeth": {"msn", "syndrome"}, "atomiceth": {"cmp", "rkey", "swap", "va"},
		"atomicack": {"orig"}, "deth": {"qkey", "srcqp"},
	}
	files, _ := filepath.Glob(filepath.Join(capDir, "*.pcap"))
	lines := 0
	for _, f := range files {
		out, _, code := decode(t, "--json", f)
		if code != 0 {
			t.Fatalf("%s: exit %d", f, code)
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			lines++
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("%s: %q: %v", f, sc.Text(), err)
			}
			for k, v := range m {
				if !allowed[k] {
					t.Errorf("%s: unexpected key %q", f, k)
				}
				if want, ok := sub[k]; ok {
					obj, _ := v.(map[string]any)
					var keys []string
					for kk, vv := range obj {
						keys = append(keys, kk)
						if _, isNum := vv.(float64); !isNum {
							t.Errorf("%s: %s.%s is %T", f, k, kk, vv)
						}
					}
					sort.Strings(keys)
					if strings.Join(keys, ",") != strings.Join(want, ",") {
						t.Errorf("%s: %s keys %v, want %v", f, k, keys, want)
					}
				}
			}
			for _, k := range mandatory {
				v, ok := m[k]
				if !ok {
					t.Errorf("%s: missing %q in %s", f, k, sc.Text())
					continue
				}
				switch k {
				case "src", "dst", "opname":
					_, ok = v.(string)
				case "icrc_ok":
					_, ok = v.(bool)
				default:
					_, ok = v.(float64)
				}
				if !ok {
					t.Errorf("%s: %q has type %T", f, k, v)
				}
			}
		}
	}
	if lines < 250 {
		t.Fatalf("only %d RoCE lines over all captures", lines)
	}
}

// pcapRecords reads the records of one of the reference captures (classic
// little-endian pcap, Ethernet).
func pcapRecords(t testing.TB, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(capDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for off := 24; off+16 <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off+8:]))
		out = append(out, b[off+16:off+16+n])
		off += 16 + n
	}
	return out
}

// writePcap builds a classic pcap file.
func writePcap(order binary.ByteOrder, nano bool, linkType uint32, frames [][]byte) []byte {
	h := make([]byte, 24)
	magic := uint32(0xa1b2c3d4)
	if nano {
		magic = 0xa1b23c4d
	}
	order.PutUint32(h[0:], magic)
	order.PutUint16(h[4:], 2)
	order.PutUint16(h[6:], 4)
	order.PutUint32(h[16:], 262144)
	order.PutUint32(h[20:], linkType)
	out := h
	for i, f := range frames {
		r := make([]byte, 16)
		order.PutUint32(r[0:], uint32(1000+i))
		order.PutUint32(r[8:], uint32(len(f)))
		order.PutUint32(r[12:], uint32(len(f)))
		out = append(append(out, r...), f...)
	}
	return out
}

// writePcapng builds a pcapng file: SHB, one IDB per link type given, and
// one EPB per frame on interface iface[i].
func writePcapng(order binary.ByteOrder, linkTypes []uint16, frames [][]byte, iface []uint32) []byte {
	block := func(typ uint32, body []byte) []byte {
		for len(body)%4 != 0 {
			body = append(body, 0)
		}
		b := make([]byte, 8, 12+len(body))
		order.PutUint32(b[0:], typ)
		order.PutUint32(b[4:], uint32(12+len(body)))
		b = append(b, body...)
		var tail [4]byte
		order.PutUint32(tail[:], uint32(12+len(body)))
		return append(b, tail[:]...)
	}
	shb := make([]byte, 16)
	order.PutUint32(shb[0:], 0x1a2b3c4d)
	order.PutUint16(shb[4:], 1)
	binary.BigEndian.PutUint64(shb[8:], ^uint64(0))
	out := block(0x0a0d0d0a, shb)
	for _, lt := range linkTypes {
		idb := make([]byte, 8)
		order.PutUint16(idb[0:], lt)
		order.PutUint32(idb[4:], 262144)
		out = append(out, block(1, idb)...)
	}
	// A name-resolution block between packets must be skipped.
	out = append(out, block(4, []byte{0, 0, 0, 0})...)
	for i, f := range frames {
		epb := make([]byte, 20)
		order.PutUint32(epb[0:], iface[i])
		order.PutUint32(epb[12:], uint32(len(f)))
		order.PutUint32(epb[16:], uint32(len(f)))
		out = append(out, block(6, append(epb, f...))...)
	}
	return out
}

func writeTemp(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDecodeLinkTypes: the same frames re-wrapped as raw IP, Linux cooked
// v1/v2, big-endian and nanosecond pcap and pcapng decode to the same JSON
// as the Ethernet original.
func TestDecodeLinkTypes(t *testing.T) {
	eth := pcapRecords(t, "rping.pcap")
	want, _, code := decode(t, "--json", filepath.Join(capDir, "rping.pcap"))
	if code != 0 || want == "" {
		t.Fatalf("reference decode: exit %d", code)
	}
	strip := func(f func(fr []byte) []byte) [][]byte {
		var out [][]byte
		for _, fr := range eth {
			out = append(out, f(fr))
		}
		return out
	}
	raw := strip(func(fr []byte) []byte { return fr[14:] })
	sll := strip(func(fr []byte) []byte {
		h := make([]byte, 16)
		binary.BigEndian.PutUint16(h[2:], 1) // ARPHRD_ETHER
		binary.BigEndian.PutUint16(h[4:], 6) // address length
		copy(h[6:], fr[6:12])                // source MAC
		binary.BigEndian.PutUint16(h[14:], 0x0800)
		copy(h[14:], fr[12:14]) // protocol = EtherType
		return append(h, fr[14:]...)
	})
	sll2 := strip(func(fr []byte) []byte {
		h := make([]byte, 20)
		copy(h[0:], fr[12:14]) // protocol
		binary.BigEndian.PutUint32(h[4:], 2)
		binary.BigEndian.PutUint16(h[8:], 1)
		h[11] = 6
		copy(h[12:], fr[6:12])
		return append(h, fr[14:]...)
	})
	ifaces := make([]uint32, len(eth))
	mixed := make([][]byte, len(eth))
	for i := range eth {
		mixed[i] = eth[i]
		if i%2 == 1 {
			ifaces[i] = 1
			mixed[i] = raw[i]
		}
	}
	cases := []struct {
		name string
		file []byte
	}{
		{"raw101", writePcap(binary.LittleEndian, false, 101, raw)},
		{"raw12", writePcap(binary.LittleEndian, false, 12, raw)},
		{"raw14", writePcap(binary.LittleEndian, false, 14, raw)},
		{"ipv4-228", writePcap(binary.LittleEndian, false, 228, raw)},
		{"sll", writePcap(binary.LittleEndian, false, 113, sll)},
		{"sll2", writePcap(binary.LittleEndian, false, 276, sll2)},
		{"bigendian-nano", writePcap(binary.BigEndian, true, 1, eth)},
		{"pcapng-le", writePcapng(binary.LittleEndian, []uint16{1}, eth, make([]uint32, len(eth)))},
		{"pcapng-be-mixed", writePcapng(binary.BigEndian, []uint16{1, 101}, mixed, ifaces)},
	}
	for _, c := range cases {
		got, errOut, code := decode(t, "--json", writeTemp(t, c.name, c.file))
		if code != 0 {
			t.Errorf("%s: exit %d: %s", c.name, code, errOut)
			continue
		}
		if got != want {
			t.Errorf("%s: JSON differs from the Ethernet capture's\n%s", c.name, got)
		}
	}
	// IPv6 raw (LINKTYPE_IPV6 229).
	v6 := pcapRecords(t, "guest-to-host-rc-ipv6.pcap")
	want6, _, _ := decode(t, "--json", filepath.Join(capDir, "guest-to-host-rc-ipv6.pcap"))
	var raw6 [][]byte
	for _, fr := range v6 {
		raw6 = append(raw6, fr[14:])
	}
	if got, errOut, code := decode(t, "--json", writeTemp(t, "v6", writePcap(binary.LittleEndian, false, 229, raw6))); code != 0 || got != want6 {
		t.Errorf("ipv6-229: exit %d %s, equal %v", code, errOut, got == want6)
	}
}

// TestDecodeBadInputs: usage and bad files exit 2 with one clear line.
func TestDecodeBadInputs(t *testing.T) {
	good, err := os.ReadFile(filepath.Join(capDir, "rc_pingpong_small.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	recs := pcapRecords(t, "rc_pingpong_small.pcap")
	ng := writePcapng(binary.LittleEndian, []uint16{1}, recs, make([]uint32, len(recs)))
	cases := []struct {
		name     string
		args     []string
		file     []byte // written to a temp file appended to args when non-nil
		code     int
		stderr   string // substring
		stdoutOK bool   // some stdout expected (frames before the damage)
	}{
		{name: "no args", code: 2, stderr: "usage: softroce decode"},
		{name: "two files", args: []string{"a", "b"}, code: 2, stderr: "usage:"},
		{name: "unknown flag", args: []string{"--yaml", "x.pcap"}, code: 2, stderr: "unknown flag: --yaml"},
		{name: "go-style long flag", args: []string{"-json", "x.pcap"}, code: 2, stderr: "usage:"}, // -j -s -o -n in getopt style
		{name: "missing file", args: []string{"/nonexistent/x.pcap"}, code: 2, stderr: "no such file"},
		{name: "empty", file: []byte{}, code: 2, stderr: "not a pcap or pcapng file"},
		{name: "text file", file: []byte("hello, this is not a capture\n"), code: 2, stderr: "not a pcap or pcapng file"},
		{name: "short header", file: good[:10], code: 2, stderr: "truncated"},
		{name: "truncated record", file: good[:len(good)-7], code: 2, stderr: "truncated", stdoutOK: true},
		{name: "truncated record header", file: good[:24+16+len(recs[0])+5], code: 2, stderr: "frame 2: truncated"},
		{name: "unknown link type", file: writePcap(binary.LittleEndian, false, 147, recs), code: 2, stderr: "unsupported link type 147"},
		{name: "bad pcap version", file: append(append([]byte{}, good[:4]...), append([]byte{9, 0}, good[6:]...)...), code: 2, stderr: "unsupported pcap version 9"},
		{name: "huge record", file: func() []byte {
			b := append([]byte{}, good[:24+16]...)
			binary.LittleEndian.PutUint32(b[24+8:], 1<<31)
			return b
		}(), code: 2, stderr: "too large"},
		{name: "truncated pcapng", file: ng[:len(ng)-9], code: 2, stderr: "truncated", stdoutOK: true},
		{name: "pcapng bad interface", file: writePcapng(binary.LittleEndian, []uint16{1}, recs[:1], []uint32{3}), code: 2, stderr: "undefined interface 3"},
		{name: "pcapng unknown link type", file: writePcapng(binary.LittleEndian, []uint16{147}, recs[:1], []uint32{0}), code: 2, stderr: "unsupported link type 147"},
		{name: "help", args: []string{"-h"}, code: 0},
		{name: "help long", args: []string{"--help"}, code: 0},
	}
	for _, c := range cases {
		args := c.args
		if c.file != nil {
			args = append(args, writeTemp(t, "in", c.file))
		}
		out, errOut, code := decode(t, args...)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d (stderr %q)", c.name, code, c.code, errOut)
		}
		if !strings.Contains(errOut, c.stderr) {
			t.Errorf("%s: stderr %q lacks %q", c.name, errOut, c.stderr)
		}
		if c.code == 2 && c.name != "no args" && c.name != "two files" && c.name != "unknown flag" && c.name != "go-style long flag" && strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: stderr is not one line: %q", c.name, errOut)
		}
		if c.code == 2 && !c.stdoutOK && out != "" {
			t.Errorf("%s: unexpected stdout %q", c.name, out)
		}
		if c.stdoutOK && out == "" {
			t.Errorf("%s: the frames before the damage were not printed", c.name)
		}
	}
	// Main without arguments.
	var o, e bytes.Buffer
	if code := Main(context.Background(), nil, &o, &e); code != 2 {
		t.Errorf("softroce decode: exit %d", code)
	}
}

// TestDecodeICRCAndMalformed: a flipped payload byte makes the ICRC BAD; a
// UDP 4791 frame with TVer 1 is reported as malformed in text mode and left
// out of the JSON; non-RoCE frames are only counted.
func TestDecodeICRCAndMalformed(t *testing.T) {
	recs := pcapRecords(t, "rc_pingpong_small.pcap")
	var frames [][]byte
	var roce []int
	for i, r := range recs {
		c := append([]byte(nil), r...)
		frames = append(frames, c)
		if len(c) > 14+20+8 && binary.BigEndian.Uint16(c[14+20+2:]) == 4791 {
			roce = append(roce, i)
		}
	}
	if len(roce) != 8 {
		t.Fatalf("%d RoCE frames, want 8", len(roce))
	}
	bad := frames[roce[0]]
	bad[len(bad)-5] ^= 0x01 // last payload byte (before the ICRC)
	mal := frames[roce[1]]
	mal[14+20+8+1] |= 0x01 // TVer 1
	p := writeTemp(t, "x.pcap", writePcap(binary.LittleEndian, false, 1, frames))

	out, _, code := decode(t, p)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 9 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	if !strings.HasSuffix(lines[0], " BAD") || !strings.Contains(lines[1], "malformed RoCE") || !strings.HasSuffix(lines[2], " ok") {
		t.Errorf("lines:\n%s", out)
	}
	wantSum := "# 7 RoCE packets (ICRC ok 6, bad 1), 1 malformed, 11 other frames"
	if lines[8] != wantSum {
		t.Errorf("summary %q, want %q", lines[8], wantSum)
	}
	js, _, _ := decode(t, "--json", p)
	jl := strings.Split(strings.TrimSuffix(js, "\n"), "\n")
	if len(jl) != 7 || !strings.Contains(jl[0], `"icrc_ok":false`) || strings.Contains(jl[1], `"icrc_ok":false`) {
		t.Errorf("json:\n%s", js)
	}
}

// TestDecodeSnaplenAndEthernetPadding: a RoCE frame cut by the snap length is
// malformed (its last bytes are not the ICRC); Ethernet padding after the IP
// packet is ignored (the ICRC still verifies).
func TestDecodeSnaplenAndEthernetPadding(t *testing.T) {
	recs := pcapRecords(t, "rc_pingpong_small.pcap")
	var frames [][]byte
	for _, r := range recs {
		if len(r) > 14+20+8 && binary.BigEndian.Uint16(r[14+20+2:]) == 4791 {
			frames = append(frames, r)
		}
	}
	cut := frames[0][:len(frames[0])-10]
	padded := append(append([]byte(nil), frames[3]...), make([]byte, 6)...)
	p := writeTemp(t, "x.pcap", writePcap(binary.LittleEndian, false, 1, [][]byte{cut, padded}))
	out, _, code := decode(t, p)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "malformed RoCE: packet cut short") || !strings.HasSuffix(lines[1], " ok") ||
		lines[2] != "# 1 RoCE packets (ICRC ok 1, bad 0), 1 malformed, 0 other frames" {
		t.Fatalf("output:\n%s", out)
	}
}

// TestDecodeArgs: the command line in GNU getopt style.
func TestDecodeArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Config
	}{
		{[]string{"f.pcap"}, Config{Path: "f.pcap"}},
		{[]string{"-j", "f.pcap"}, Config{Path: "f.pcap", JSON: true}},
		{[]string{"f.pcap", "--json"}, Config{Path: "f.pcap", JSON: true}},
		{[]string{"--js", "f.pcap"}, Config{Path: "f.pcap", JSON: true}},
		{[]string{"--json", "--", "-f.pcap"}, Config{Path: "-f.pcap", JSON: true}},
	} {
		if c, err := ParseArgs(tc.args); err != nil || c != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.args, c, err, tc.want)
		}
	}
	for _, args := range [][]string{{}, {"a", "b"}, {"-x", "f"}, {"--json=maybe", "f"}} {
		if _, err := ParseArgs(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
