// Package tooltest holds helpers for the tests of the softroce tools (internal/tools/...):
// free ports on the loopback addresses the in-process pairs use, and the checks of a test
// daemon.
package tooltest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemon"
)

// FreeUDPPort returns a UDP port free on both 127.0.0.1 and 127.0.0.2 (the RoCE port of
// the two in-process devices; not 4791, which other tests on this machine may hold).
func FreeUDPPort(t testing.TB) uint16 {
	t.Helper()
	for i := 0; i < 20; i++ {
		a, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := a.LocalAddr().(*net.UDPAddr).Port
		b, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port})
		a.Close()
		if err == nil {
			b.Close()
			return uint16(port)
		}
	}
	t.Fatal("no free UDP port on 127.0.0.1 and 127.0.0.2")
	return 0
}

// DaemonIdle waits until srv has no client and checks it holds no object.
func DaemonIdle(t testing.TB, srv *daemon.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.WaitClients(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if d := srv.Debug(); d.PDs != 0 || d.MRs != 0 || d.CQs != 0 || d.SRQs != 0 || d.QPs != 0 || d.CMIDs != 0 || d.MappedBytes != 0 {
		t.Fatalf("the daemon still holds %+v", d)
	}
}
