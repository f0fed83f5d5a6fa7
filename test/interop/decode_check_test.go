//go:build interop

package interop

// Every pairing's tap capture goes through the user-facing decoder too: `softroce decode
// FILE` (internal/tools/decode, docs/decode.md) must read the whole file (exit 0), count
// as many RoCE packets as the test's own pcap reader found, and report every one ICRC-clean
// (IBTA A17.3.3: the ICRC over the real IP header, IPv4 ID included) and none malformed.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
)

// decodeSummary is the last line of `softroce decode`: "# N RoCE packets (ICRC ok A, bad B),
// M malformed, K other frames", with ", rxe FLUSH ICRC C" after B when a FLUSH carried kernel
// rxe's ICRC (docs/decode.md).
type decodeSummary struct {
	RoCE, OK, Bad, Malformed, Other, RxeFlush int
}

var decodeSummaryRe = regexp.MustCompile(`(?m)^# (\d+) RoCE packets \(ICRC ok (\d+), bad (\d+)(?:, rxe FLUSH ICRC (\d+))?\), (\d+) malformed, (\d+) other frames$`)

// runDecode runs `softroce decode path` (bin: the CLI the pairings use) and parses its
// summary line; an exit status other than 0 or a missing summary is an error.
func runDecode(bin, path string) (decodeSummary, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "decode", path)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return decodeSummary{}, out.String(), fmt.Errorf("softroce decode %s: %v: %s", path, err, errb.String())
	}
	m := decodeSummaryRe.FindStringSubmatch(out.String())
	if m == nil {
		return decodeSummary{}, out.String(), fmt.Errorf("softroce decode %s: no summary line", path)
	}
	var n [6]int
	for i := range n {
		n[i], _ = strconv.Atoi(m[i+1]) // the absent rxe FLUSH count: 0
	}
	return decodeSummary{RoCE: n[0], OK: n[1], Bad: n[2], RxeFlush: n[3], Malformed: n[4], Other: n[5]}, out.String(), nil
}

// decodeClean is the capture check through `softroce decode`: exit 0, want RoCE packets
// (the number the test's own reader decoded, -1: any number > 0), all ICRC-clean, none
// malformed. It returns what the decoder counted.
func decodeClean(t *testing.T, path string, want int) decodeSummary {
	t.Helper()
	s, out, err := runDecode(buildSoftroce(t), path)
	if err != nil {
		t.Errorf("%v", err)
		return s
	}
	if s.Bad != 0 || s.Malformed != 0 || s.OK != s.RoCE || s.RoCE == 0 || (want >= 0 && s.RoCE != want) {
		bad := regexp.MustCompile(`(?m)^.*(BAD|malformed RoCE).*$`).FindAllString(out, 5)
		t.Errorf("softroce decode of the tap capture: %+v (want %d RoCE packets, all ICRC ok, none malformed); first bad lines: %q",
			s, want, bad)
	}
	t.Logf("softroce decode: %d RoCE packets, ICRC ok %d, bad %d, %d malformed", s.RoCE, s.OK, s.Bad, s.Malformed)
	return s
}

// TestDecodeCleanDetects proves the check can fail: a capture of rxe traffic
// (testdata/captures) is ICRC-clean for `softroce decode`; the same file with one RoCE
// payload byte flipped reports exactly one bad ICRC, and a file cut inside a record is
// refused (exit 2). Needs no VM, but runs in this package (TestMain attaches to the lab).
func TestDecodeCleanDetects(t *testing.T) {
	bin := buildSoftroce(t)
	src := filepath.Join("..", "..", "testdata", "captures", "host-to-guest-rc.pcap")
	good, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	frames, err := testcap.ReadStream(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	roce := 0
	for i := range frames {
		if d, ok := testcap.DecodeIPUDP(&frames[i]); ok && (d.DstPort == bth.UDPPort || d.SrcPort == bth.UDPPort) {
			roce++
		}
	}
	dir := t.TempDir()
	goodPath := filepath.Join(dir, "good.pcap")
	if err := os.WriteFile(goodPath, good, 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, err := runDecode(bin, goodPath)
	if err != nil || s.Bad != 0 || s.Malformed != 0 || s.RoCE != roce || roce == 0 {
		t.Fatalf("clean capture: %+v %v (our reader: %d RoCE packets)", s, err, roce)
	}

	// flip the last byte (the ICRC's) of the first RoCE frame, found in the file by its bytes
	bad := append([]byte(nil), good...)
	flipped := false
	for i := range frames {
		d, ok := testcap.DecodeIPUDP(&frames[i])
		if !ok || d.DstPort != bth.UDPPort {
			continue
		}
		if at := bytes.Index(bad, frames[i].Data); at >= 0 {
			bad[at+len(frames[i].Data)-1] ^= 0xff
			flipped = true
			break
		}
	}
	if !flipped {
		t.Fatal("no RoCE frame to corrupt")
	}
	badPath := filepath.Join(dir, "bad.pcap")
	if err := os.WriteFile(badPath, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, err = runDecode(bin, badPath)
	if err != nil || s.Bad != 1 || s.OK != roce-1 {
		t.Errorf("one corrupted ICRC: %+v %v, want bad 1 of %d", s, err, roce)
	}

	cutPath := filepath.Join(dir, "cut.pcap")
	if err := os.WriteFile(cutPath, good[:len(good)-3], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runDecode(bin, cutPath); err == nil {
		t.Error("a truncated capture passed the decode check")
	}
}
