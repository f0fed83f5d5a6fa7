// Package daemontest runs an in-test softroce daemon (internal/daemon) on a unix socket in a
// temporary directory, as `softroce daemon` does, for the tests of programs that use it
// through pkg/client.
package daemontest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/pkg/roce"
)

// Serve serves dev on a socket in t.TempDir() and returns the socket's path and the server.
// At cleanup the server shuts down (within 5 s: clients' objects destroyed, their QPs flushed)
// and dev is closed.
func Serve(t testing.TB, dev *roce.Device) (sock string, srv *daemon.Server) {
	t.Helper()
	return ServeLimited(t, dev, daemon.Limits{})
}

// ServeLimited is Serve with per-user limits (daemon.Options.Limits; zero fields: the
// defaults).
func ServeLimited(t testing.TB, dev *roce.Device, limits daemon.Limits) (sock string, srv *daemon.Server) {
	t.Helper()
	srv, err := daemon.New(daemon.Options{Device: dev, Limits: limits, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "d.sock")
	ln, err := daemon.Listen(sock, 0o600, -1)
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
		dev.Close()
	})
	return sock, srv
}

// ServeUDP opens a UDP device with o (roce.OpenUDP) and serves it as Serve does.
func ServeUDP(t testing.TB, o roce.UDPOptions) (sock string, srv *daemon.Server) {
	t.Helper()
	dev, err := roce.OpenUDP(o)
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, dev)
}
