package conform

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/mr"
)

// noFlushDUT is a DUT like kernel rxe before 6.2: it refuses IBV_ACCESS_FLUSH_GLOBAL on a
// region or a QP, and does not report its capabilities.
type noFlushDUT struct{ DUT }

func (d noFlushDUT) RegMR(c MRConfig) (MRInfo, error) {
	if c.Access&mr.AccessFlushGlobal != 0 {
		return MRInfo{}, fmt.Errorf("%w: ibv_reg_mr: Invalid argument", ErrDUT)
	}
	return d.DUT.RegMR(c)
}

func (d noFlushDUT) CreateQP(c QPConfig) (uint32, error) {
	if c.Access&mr.AccessFlushGlobal != 0 {
		return 0, fmt.Errorf("%w: ibv_modify_qp: Invalid argument", ErrDUT)
	}
	return d.DUT.CreateQP(c)
}

func placementOnly() []Scenario {
	var out []Scenario
	for _, s := range Scenarios() {
		if s.Needs != 0 {
			out = append(out, s)
		}
	}
	return out
}

// TestPlacementSkips: the memory placement scenarios skip, saying why, on a DUT whose
// capability bits lack the operations, and the FLUSH ones on a DUT that refuses the FLUSH
// access flag while its capabilities are unknown (the ATOMIC WRITE ones then run).
func TestPlacementSkips(t *testing.T) {
	b, err := NewLoopback(LoopbackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Reply, b.Quiet = 2*time.Second, 150*time.Millisecond
	scs := placementOnly()
	if len(scs) < 10 {
		t.Fatalf("%d memory placement scenarios, want at least 10", len(scs))
	}

	none := uint64(0)
	b.DevCaps = &none
	for i, r := range Run(b, scs, RunOptions{}) {
		if r.Result != Skip || !strings.Contains(r.Detail, "lacks") {
			t.Errorf("no capabilities: %s %s %q, want a skip naming the missing bits", scs[i].Name, r.Result, r.Detail)
		}
	}
	atomicOnly := CapAtomicWrite
	b.DevCaps = &atomicOnly
	for i, r := range Run(b, scs, RunOptions{}) {
		want := Pass
		if scs[i].Needs&CapFlushGlobal != 0 {
			want = Skip
		}
		if r.Result != want {
			t.Errorf("ATOMIC_WRITE only: %s %s %q, want %s", scs[i].Name, r.Result, r.Detail, want)
		}
	}

	b.DevCaps = nil
	real := b.DUT
	b.DUT = noFlushDUT{real}
	defer func() { b.DUT = real }()
	for i, r := range Run(b, scs, RunOptions{}) {
		flush := scs[i].Needs&CapFlushGlobal != 0
		switch {
		case flush && (r.Result != Skip || !strings.Contains(r.Detail, "IBV_ACCESS_FLUSH_GLOBAL")):
			t.Errorf("refused flag: %s %s %q, want a skip naming IBV_ACCESS_FLUSH_GLOBAL", scs[i].Name, r.Result, r.Detail)
		case !flush && r.Result != Pass:
			t.Errorf("refused flag: %s %s %q, want pass", scs[i].Name, r.Result, r.Detail)
		}
	}
}
