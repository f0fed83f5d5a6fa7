package conform

import (
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// knownFailures lists scenarios softroce fails today because of engine bugs (see
// docs/conformance.md): the test requires them to FAIL, so a fix flips the test and the
// entry must then be removed.
var knownFailures = map[string]string{}

func TestScenariosCount(t *testing.T) {
	all := Scenarios()
	if len(all) < 50 {
		t.Fatalf("%d scenarios, want at least 50", len(all))
	}
	seen := map[string]bool{}
	for _, s := range all {
		if s.Name == "" || s.Section == "" || s.Summary == "" || s.Run == nil {
			t.Errorf("scenario %q lacks a name, section, summary or body", s.Name)
		}
		if seen[s.Name] {
			t.Errorf("duplicate scenario %q", s.Name)
		}
		seen[s.Name] = true
		if s.RxeDeviation != "" && s.Softroce == "" {
			t.Errorf("%s: an rxe deviation must document softroce's behaviour", s.Name)
		}
	}
	for n := range knownFailures {
		if !seen[n] {
			t.Errorf("known failure %q is not a scenario", n)
		}
	}
}

// TestSoftroce runs every scenario against the in-process softroce DUT on loopback.
func TestSoftroce(t *testing.T) {
	b, err := NewLoopback(LoopbackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Reply = 2 * time.Second
	b.Quiet = 150 * time.Millisecond
	var results []Result
	for i, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			r := RunOne(b, &sc, i)
			results = append(results, r)
			checkResult(t, sc.Name, r)
		})
	}
	if testing.Verbose() {
		WriteTable(os.Stdout, results)
	}
}

// checkResult fails t unless scenario name passed, or failed as listed in knownFailures
// (a listed one that no longer fails is an error too: the list must shrink).
func checkResult(t *testing.T, name string, r Result) {
	t.Helper()
	why, known := knownFailures[name]
	switch {
	case known && r.Result == Fail:
		t.Logf("known failure (%s): %s", why, r.Detail)
	case known:
		t.Errorf("known failure %q now %s: remove it from knownFailures", name, r.Result)
	case r.Result != Pass:
		t.Errorf("%s: %s\n%s", r.Result, r.Detail, strings.Join(r.Log, "\n"))
	}
}
