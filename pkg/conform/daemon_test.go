package conform

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemontest"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// daemonNotThrough lists the scenarios that cannot run with the DUT behind the softroce
// daemon, with the reason (docs/conformance.md); empty: every scenario runs.
var daemonNotThrough = map[string]string{}

// TestSoftroceDaemon runs every scenario against the softroce DUT through the softroce daemon:
// an in-test daemon.Server whose device is on 127.0.79.1 (MTU 1024, as the in-process DUT), the
// DUT's PD, MRs (daemon-mapped memfds), CQs and QPs created through a client connection
// (roce.Verbs), the bench on 127.0.79.2. The results must be those of TestSoftroce (the same
// known failures), and the daemon must hold none of the DUT's objects afterwards.
func TestSoftroceDaemon(t *testing.T) {
	dutAddr := LoopbackDUT
	port := uint16(20000 + rand.IntN(40000))
	sock, _ := daemontest.ServeUDP(t, roce.UDPOptions{Addrs: []netip.Addr{dutAddr}, Port: port, Portable: true, MTU: qp.MTU1024, Name: "softroce0"})
	conn, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, err := NewVerbsBench(VerbsBenchOptions{Verbs: conn, DUTAddr: dutAddr, BenchAddr: LoopbackBench, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	b.Reply = 2 * time.Second
	b.Quiet = 150 * time.Millisecond
	if s, ok := b.DUT.(*Softroce); !ok || s.Device() != nil || s.Verbs() != conn {
		t.Fatalf("the DUT is not on the daemon connection: %T", b.DUT)
	}
	for i, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			if why, ok := daemonNotThrough[sc.Name]; ok {
				t.Skipf("not through the daemon: %s", why)
			}
			r := RunOne(b, &sc, i)
			checkResult(t, sc.Name, r)
		})
	}
	d, err := conn.Debug()
	if err != nil {
		t.Fatal(err)
	}
	if d.Mine.MRs != 0 || d.Mine.QPs != 0 || d.Mine.CQs != 0 {
		t.Errorf("after the scenarios the daemon holds the DUT's %+v", d.Mine)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if d, err = conn.Debug(); err != nil || d.Mine.PDs != 0 || d.Mine.MRs != 0 || d.Mine.QPs != 0 || d.Mine.CQs != 0 {
		t.Fatalf("after Close the daemon holds %+v (%v)", d.Mine, err)
	}
}
