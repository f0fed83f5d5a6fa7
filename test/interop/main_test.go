//go:build interop

// Package interop runs softroce against the real Linux kernel rxe (rdma_rxe) in the lab VM
// (test/rxelab). Run it with scripts/interop, or by hand as root:
//
//	test/rxelab/setup && go test -p 1 -tags interop -v ./test/interop/...
//
// The suite is a table of pairings: each has a name, a direction and a function. Add a
// pairing from any file of this package with an init func appending to pairings; the
// matrix (pairing x direction -> pass/FAIL) is printed after all tests ran.
package interop

import (
	"os"
	"testing"

	"github.com/softroce/softroce/test/rxelab"
)

// Directions: who starts the exchange (the pingpong/perftest client, the requester of the
// first message).
const (
	// SoftroceToRxe: our side is the client, kernel rxe serves.
	SoftroceToRxe = "softroce->rxe"
	// RxeToSoftroce: kernel rxe's tool is the client, our side serves.
	RxeToSoftroce = "rxe->softroce"
)

// pairing is one entry of the interop suite.
type pairing struct {
	// Name is the pairing: which softroce side (raw packets, engine, CLI) runs which tool.
	Name string
	// Direction is SoftroceToRxe or RxeToSoftroce.
	Direction string
	// Run runs the pairing against the lab VM.
	Run func(t *testing.T, lab *rxelab.Lab)
}

// pairings is the suite; files append to it in init funcs.
var pairings []pairing

var matrix rxelab.Matrix

func TestMain(m *testing.M) {
	os.Exit(rxelab.Main(m, rxelab.MainOptions{After: func() { matrix.Print(os.Stdout) }}))
}

// TestInterop runs every pairing as a subtest named Name/Direction.
func TestInterop(t *testing.T) {
	if len(pairings) == 0 {
		t.Fatal("no pairings registered")
	}
	for _, p := range pairings {
		t.Run(p.Name+"/"+p.Direction, func(t *testing.T) {
			defer matrix.RecordTest(t, p.Name, p.Direction)
			p.Run(t, rxelab.Current)
		})
	}
}
