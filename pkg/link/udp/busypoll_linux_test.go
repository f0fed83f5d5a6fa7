package udp

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/link"
)

// recvState returns the scheduler state of the goroutine running recvInto (e.g. "IO wait",
// "runnable", "running"; "" if there is none) and its stack.
func recvState() (state, stack string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "recvInto") {
			continue
		}
		head, _, _ := strings.Cut(g, "\n")
		if i, j := strings.Index(head, "["), strings.Index(head, "]"); i >= 0 && j > i {
			st, _, _ := strings.Cut(head[i+1:j], ",")
			return st, g
		}
	}
	return "", ""
}

// recvInto receives one batch into in and reports the result on done.
func recvInto(l *Link, in []link.Datagram, view bool, done chan<- error) {
	var err error
	if view {
		_, err = l.RecvView(in)
	} else {
		_, err = l.Recv(in)
	}
	done <- err
}

// waitState polls the stacks until the goroutine running recvInto is in state want (any
// state if "") with fn on its stack (any stack if ""), with a safety bound.
func waitState(t *testing.T, want, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, stack := recvState()
		if st != "" && (want == "" || st == want) && strings.Contains(stack, fn) {
			return
		}
		runtime.Gosched()
	}
	st, stack := recvState()
	t.Fatalf("the receiving goroutine never reached %q with %q on its stack; last %q:\n%s", want, fn, st, stack)
}

// TestBusyPollDoesNotPark: with BusyPoll the goroutine in Recv on an empty socket keeps
// polling (runnable/running in busyRecv, never parked "IO wait" in the netpoller), and the
// datagram sent afterwards is received; without it, the same Recv parks (the control case,
// which shows the state check can fail).
func TestBusyPollDoesNotPark(t *testing.T) {
	for _, c := range []struct {
		name string
		gro  bool
		busy time.Duration
		fn   string // on the polling goroutine's stack
	}{
		{"busy", false, time.Hour, "busyRecv"},
		{"busy-gro", true, time.Hour, "busyGRORecv"},
		{"plain", false, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true})
			b := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true,
				GRO: c.gro, BusyPoll: c.busy})
			if c.gro && !b.GROEnabled(netip.MustParseAddr("127.0.0.2")) {
				t.Skip("kernel refused UDP_GRO")
			}
			done := make(chan error, 1)
			go recvInto(b, recvBufs(4), c.gro, done)
			if c.busy == 0 {
				waitState(t, "IO wait", "")
			} else {
				waitState(t, "", c.fn)
				for i := 0; i < 50; i++ {
					if st, stack := recvState(); st == "IO wait" || !strings.Contains(stack, c.fn) {
						t.Fatalf("sample %d: the busy-polling Recv is %q, want it polling:\n%s", i, st, stack)
					}
					runtime.Gosched()
				}
			}
			src := a.LocalAddrPorts()[0]
			if err := a.Send([]link.Datagram{{Buf: []byte("busy poll"), Src: src, Dst: b.LocalAddrPorts()[0]}}); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second): // safety bound, not a wait
				t.Fatal("the datagram was not received")
			}
			if b.BusyPollParks() != 0 {
				t.Fatalf("%d parks, want 0 (budget of an hour)", b.BusyPollParks())
			}
		})
	}
}

// TestBusyPollBudget: a busy poll that finds nothing for BusyPoll parks in the poller
// (counted) and still receives what arrives later.
func TestBusyPollBudget(t *testing.T) {
	a := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true})
	b := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true,
		BusyPoll: time.Millisecond})
	done := make(chan error, 1)
	go recvInto(b, recvBufs(4), false, done)
	waitState(t, "IO wait", "")
	if b.BusyPollParks() != 1 {
		t.Fatalf("%d parks, want 1", b.BusyPollParks())
	}
	if err := a.Send([]link.Datagram{{Buf: []byte("late"), Src: a.LocalAddrPorts()[0], Dst: b.LocalAddrPorts()[0]}}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // safety bound
		t.Fatal("the datagram was not received after the park")
	}
}

// TestBusyPollClose: Close ends a busy poll at once (it holds the socket's read reference,
// which Close waits for) and Recv returns net.ErrClosed.
func TestBusyPollClose(t *testing.T) {
	b, err := Listen(Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true, BusyPoll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go recvInto(b, recvBufs(4), false, done)
	waitState(t, "", "busyRecv")
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Recv after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second): // safety bound: without the closed check, an hour
		t.Fatal("Close did not end the busy poll")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// TestBusyPollZeroAlloc: a send/busy-poll receive round allocates nothing.
func TestBusyPollZeroAlloc(t *testing.T) {
	for _, gro := range []bool{false, true} {
		a := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true, GSO: GSOOn})
		b := listenTB(t, Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, AnyPort: true, GRO: gro, BusyPoll: time.Hour})
		p := &pair{A: a, B: b, AAddr: a.LocalAddrPorts()[0], BAddr: b.LocalAddrPorts()[0], MaxPayload: 65507}
		out := p.MkBatch(16, 1100, 1)
		in := recvBufs(16)
		round := func() {
			if err := a.Send(out); err != nil {
				t.Fatal(err)
			}
			for got := 0; got < len(out); {
				k, err := b.Recv(in)
				if err != nil {
					t.Fatal(err)
				}
				got += k
			}
		}
		round()
		if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
			t.Fatalf("GRO %v: %v allocations per batch of 16, want 0", gro, allocs)
		}
	}
}

// TestBusyPollRawSyscalls: a link makes its sendmmsg/recvmmsg as raw system calls (the scheduler
// must not hand its P to another thread during them) by default and always when busy polling,
// as ordinary ones only with SchedSyscalls and no busy polling; all move datagrams.
func TestBusyPollRawSyscalls(t *testing.T) {
	for _, tc := range []struct {
		busy  time.Duration
		sched bool
	}{{0, false}, {0, true}, {time.Hour, false}, {time.Hour, true}} {
		busy := tc.busy
		o := Options{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, AnyPort: true, BusyPoll: busy, SchedSyscalls: tc.sched}
		a := listenTB(t, o)
		o.Addrs = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
		b := listenTB(t, o)
		want := busy > 0 || !tc.sched
		if a.socks[0].raw != want || b.socks[0].raw != want {
			t.Fatalf("BusyPoll %v SchedSyscalls %v: raw system calls %v/%v, want %v", busy, tc.sched, a.socks[0].raw, b.socks[0].raw, want)
		}
		p := &pair{A: a, B: b, AAddr: a.LocalAddrPorts()[0], BAddr: b.LocalAddrPorts()[0], MaxPayload: 65507}
		out := p.MkBatch(5, 300, 9)
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		p.Check(t, out, recvN(t, b, len(out), 4))
	}
}
