//go:build interop

package interop

// The conformance bench (pkg/conform, docs/conformance.md) against kernel rxe:
// the C agent (test/conform/agent) runs in the guest on rxe0, the bench sends its crafted
// packets from 198.18.0.1:4791 in the lab netns. Every scenario must pass; scenarios
// where rxe 6.1 deviates from the IBTA spec expect rxe's documented behaviour (their
// RxeDeviation). The results table is printed.

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/softroce/softroce/pkg/conform"
	conformlab "github.com/softroce/softroce/test/conform"
	"github.com/softroce/softroce/test/rxelab"
)

func init() {
	pairings = append(pairings, pairing{Name: "conform-scenarios", Direction: SoftroceToRxe, Run: conformRxe})
}

func conformRxe(t *testing.T, lab *rxelab.Lab) {
	r, err := conformlab.OpenRxe(context.Background(), lab)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() { // on an early exit: end the guest agent
		if !closed {
			out, err := r.Close()
			t.Logf("agent (closed on cleanup): %v\n%s", err, out)
		}
	})
	scs := conform.Scenarios()
	var results []conform.Result
	for i := range scs {
		t.Run(scs[i].Name, func(t *testing.T) {
			res := conform.RunOne(r.Bench, &scs[i], i)
			results = append(results, res)
			if res.Result == conform.Skip && scs[i].Needs != 0 { // a capability rxe0 lacks (6.1)
				t.Skip(res.Detail)
			}
			if res.Result != conform.Pass {
				t.Errorf("%s: %s\n%s", res.Result, res.Detail, strings.Join(res.Log, "\n"))
			}
		})
	}
	out, err := r.Close()
	closed = true
	if err != nil {
		t.Errorf("agent: %v\n%s", err, out)
	}
	conform.WriteTable(os.Stdout, results)
}
