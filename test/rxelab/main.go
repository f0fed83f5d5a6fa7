package rxelab

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Current is the lab booted by Main, for the tests of that binary.
var Current *Lab

// MainOptions configure Main.
type MainOptions struct {
	// Options are passed to Start. Attach defaults to $RXELAB_ATTACH=1 (set by
	// scripts/interop, which boots the VM once for all interop packages).
	Options
	// After runs after m.Run and before the VM is stopped (e.g. print a matrix).
	After func()
}

// Main is the TestMain body of an interop test binary: it boots the VM once, runs the
// tests, and always stops the VM it booted: after the tests, on a panic in TestMain's
// goroutine, on SIGINT/SIGTERM/SIGHUP, and 15 s before the -test.timeout deadline (a test
// timeout panics in another goroutine, where no deferred call of ours would run). The vm
// watchdog (max life = test timeout + 2 min) covers SIGKILL. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(rxelab.Main(m, rxelab.MainOptions{})) }
func Main(m *testing.M, o MainOptions) (code int) {
	flag.Parse()
	if os.Getenv("RXELAB_ATTACH") == "1" {
		o.Attach = true
	}
	var timeout time.Duration
	if f := flag.Lookup("test.timeout"); f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			timeout, _ = g.Get().(time.Duration)
		}
	}
	if o.MaxLife == 0 {
		o.MaxLife = 15 * time.Minute
		if timeout > 0 {
			o.MaxLife = timeout + 2*time.Minute
		}
	}
	lab, err := Start(context.Background(), o.Options)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rxelab: %v\n", err)
		return 1
	}
	Current = lab
	if lab.BootTime > 0 {
		fmt.Fprintf(os.Stderr, "rxelab: VM booted in %.1fs\n", lab.BootTime.Seconds())
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "rxelab: %v: stopping the VM\n", s)
			_ = lab.Stop()
			os.Exit(130)
		case <-done:
		}
	}()
	if timeout > 30*time.Second {
		t := time.AfterFunc(timeout-15*time.Second, func() {
			fmt.Fprintf(os.Stderr, "rxelab: test deadline close: stopping the VM before the timeout panic\n")
			_ = lab.Stop()
		})
		defer t.Stop()
	}
	defer func() {
		r := recover()
		if err := lab.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "rxelab: vm stop: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		if r != nil {
			panic(r)
		}
	}()
	code = m.Run()
	if o.After != nil {
		o.After()
	}
	return code
}

// Matrix collects pass/fail per (pairing, direction) and prints it as a table.
type Matrix struct {
	mu   sync.Mutex
	res  map[[2]string]string
	rows []string
	cols []string
}

// Record stores the outcome of one cell ("pass", "FAIL", "skip").
func (x *Matrix) Record(pairing, direction, outcome string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.res == nil {
		x.res = map[[2]string]string{}
	}
	if !contains(x.rows, pairing) {
		x.rows = append(x.rows, pairing)
	}
	if !contains(x.cols, direction) {
		x.cols = append(x.cols, direction)
		sort.Strings(x.cols)
	}
	x.res[[2]string{pairing, direction}] = outcome
}

// RecordTest records t's outcome (call it deferred, at the end of the subtest).
func (x *Matrix) RecordTest(t testing.TB, pairing, direction string) {
	switch {
	case t.Skipped():
		x.Record(pairing, direction, "skip")
	case t.Failed():
		x.Record(pairing, direction, "FAIL")
	default:
		x.Record(pairing, direction, "pass")
	}
}

// Print writes the matrix: one row per pairing, one column per direction ("-" = not run).
func (x *Matrix) Print(w io.Writer) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.rows) == 0 {
		fmt.Fprintln(w, "interop matrix: no pairing ran")
		return
	}
	width := len("pairing")
	for _, r := range x.rows {
		width = max(width, len(r))
	}
	cw := make([]int, len(x.cols))
	var b strings.Builder
	fmt.Fprintf(&b, "interop matrix (pairing x direction):\n%-*s", width, "pairing")
	for i, c := range x.cols {
		cw[i] = max(len(c), 4)
		fmt.Fprintf(&b, "  %-*s", cw[i], c)
	}
	b.WriteByte('\n')
	for _, r := range x.rows {
		fmt.Fprintf(&b, "%-*s", width, r)
		for i, c := range x.cols {
			v, ok := x.res[[2]string{r, c}]
			if !ok {
				v = "-"
			}
			fmt.Fprintf(&b, "  %-*s", cw[i], v)
		}
		b.WriteByte('\n')
	}
	io.WriteString(w, b.String())
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
