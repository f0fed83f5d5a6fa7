package daemon

import (
	"bytes"
	"github.com/softroce/softroce/internal/daemon/proto"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLogLimiter: a key logs logBurst lines per window, then nothing; the first line of the
// next window reports how many were suppressed; keys are independent.
func TestLogLimiter(t *testing.T) {
	var l logLimiter
	t0 := time.Unix(1000, 0)
	for i := 0; i < logBurst; i++ {
		if ok, n := l.allow("a", logBurst, t0); !ok || n != 0 {
			t.Fatalf("line %d: allowed %v, suppressed %d", i, ok, n)
		}
	}
	for i := 0; i < 1000; i++ {
		if ok, _ := l.allow("a", logBurst, t0.Add(time.Second)); ok {
			t.Fatalf("line %d past the burst logged", logBurst+i)
		}
	}
	if ok, _ := l.allow("b", logBurst, t0.Add(time.Second)); !ok {
		t.Fatal("another key was limited")
	}
	if ok, n := l.allow("a", logBurst, t0.Add(logWindow)); !ok || n != 1000 {
		t.Fatalf("next window: allowed %v, suppressed %d, want true, 1000", ok, n)
	}
}

// TestBadPostsRateLimited: a client flooding malformed asynchronous posts costs a bounded
// number of log lines, and each is counted (Debug.BadPosts).
func TestBadPostsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	srv := &Server{log: slog.New(slog.NewTextHandler(&buf, nil))}
	ss := &session{s: srv}
	for i := 0; i < 10000; i++ {
		ss.postSendAsync([]byte{0x16, 1, 2})
	}
	if lines := strings.Count(buf.String(), "\n"); lines > logBurst {
		t.Fatalf("%d log lines for 10000 bad posts, want at most %d", lines, logBurst)
	}
	if n := srv.badPosts.Load(); n != 10000 {
		t.Fatalf("BadPosts %d, want 10000", n)
	}
}

// TestUsageNames: the daemon's resource names and the protocol's are one list, in one order.
func TestUsageNames(t *testing.T) {
	var u usage
	for r := range u {
		u[r] = int64(r) + 1
	}
	vals := u.proto().Values()
	for r, name := range resNames {
		if proto.UsageNames()[r] != name || vals[r] != int64(r)+1 {
			t.Fatalf("resource %d: daemon %q, protocol %q (value %d)", r, name, proto.UsageNames()[r], vals[r])
		}
	}
}
