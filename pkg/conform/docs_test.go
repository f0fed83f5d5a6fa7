package conform

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sectionRe is one IBTA reference: a Vol. 1 section ("9.7.5.1.1"), an annex section
// ("A17.3.3"), optionally with a compliance statement ("9.7.5.1.2 (C9-105)").
var sectionRe = regexp.MustCompile(`^(A?\d+(\.\d+)*)( \(C[\dA]+-\d+(\.\d+)?\))?$`)

// TestScenarioSections: every scenario cites IBTA sections in that form.
func TestScenarioSections(t *testing.T) {
	for _, s := range Scenarios() {
		for _, ref := range strings.Split(s.Section, ", ") {
			if !sectionRe.MatchString(ref) {
				t.Errorf("%s: section %q: %q is not an IBTA reference", s.Name, s.Section, ref)
			}
		}
	}
}

// docRowRe is one row of docs/conformance.md's results table:
// | # | `name` | IBTA | checks | softroce | rxe 6.1 |
var docRowRe = regexp.MustCompile("(?m)^\\| (\\d+) \\| `([a-z0-9-]+)` \\| ([^|]+) \\| .* \\| (pass|pass \\(deviation\\)|fail|skip) \\| (pass|pass \\(deviation\\)|fail|skip) \\|$")

// TestDocsListScenarios keeps docs/conformance.md current: its results table lists every
// scenario, in run order, with the section the code cites, the summary count matches, every
// result is a pass (rxe 6.1: a skip for scenarios that need a capability it lacks), "pass (deviation)" appears exactly where the scenario documents a
// deviation of that DUT, and every documented deviation or choice is in the deviations list.
func TestDocsListScenarios(t *testing.T) {
	b, err := os.ReadFile("../../docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	all := Scenarios()
	rows := docRowRe.FindAllStringSubmatch(doc, -1)
	if len(rows) != len(all) {
		t.Errorf("docs/conformance.md lists %d scenarios, the code has %d", len(rows), len(all))
	}
	for i, r := range rows {
		if i >= len(all) {
			break
		}
		s := all[i]
		if n, _ := strconv.Atoi(r[1]); n != i+1 || r[2] != s.Name || strings.TrimSpace(r[3]) != s.Section {
			t.Errorf("row %s `%s` (%s), want %d `%s` (%s)", r[1], r[2], r[3], i+1, s.Name, s.Section)
			continue
		}
		wantSoft, wantRxe := "pass", "pass"
		if s.SoftroceDeviation != "" {
			wantSoft = "pass (deviation)"
		}
		if s.RxeDeviation != "" {
			wantRxe = "pass (deviation)"
		}
		if s.Needs != 0 { // the rxe column is 6.1's, which lacks the IBTA 1.5 operations
			wantRxe = "skip"
		}
		if r[4] != wantSoft || r[5] != wantRxe {
			t.Errorf("%s: results softroce %q rxe %q, want %q %q", s.Name, r[4], r[5], wantSoft, wantRxe)
		}
	}
	if want := strconv.Itoa(len(all)) + " scenarios. **softroce: " + strconv.Itoa(len(all)) + " pass**"; !strings.Contains(doc, want) {
		t.Errorf("docs/conformance.md Results lacks %q", want)
	}
	dev := doc[strings.Index(doc, "## Deviations and choices"):]
	for _, s := range all {
		if (s.RxeDeviation != "" || s.SoftroceDeviation != "" || s.Softroce != "") && !strings.Contains(dev, "* `"+s.Name+"` (") {
			t.Errorf("%s documents a deviation or choice that docs/conformance.md's deviations list lacks", s.Name)
		}
	}
}
