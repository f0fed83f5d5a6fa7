package oob

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = Dial(context.Background(), ln.Addr().String(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err = Accept(context.Background(), ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestStream(t *testing.T) {
	a, b := pair(t)
	sa := NewStream(a, Options{})
	sb := NewStream(b, Options{})
	if err := sa.Write(context.Background(), "hello", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if err := sb.ReadFull(context.Background(), "hello", got); err != nil || string(got) != "hello" {
		t.Fatalf("%q %v", got, err)
	}

	// Fake clock in the past: the deadline is over before the step starts.
	past := NewStream(b, Options{Now: func() time.Time { return time.Unix(1000, 0) }})
	err := past.ReadFull(context.Background(), "wait", got)
	var se *StepError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &se) || se.Step != "wait" || err.Error() != "oob: wait: oob: step timed out" {
		t.Fatalf("err = %v", err)
	}
	// WithTimeout(-1) lifts the step bound: only the context ends the wait.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := past.WithTimeout(-1).ReadFull(ctx, "wait", got); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	// A context deadline earlier than the step bound wins.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := sb.ReadFull(ctx, "wait", got); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}

	// The peer closes after 2 of 5 bytes.
	sa.Write(context.Background(), "part", []byte("he"))
	a.Close()
	err = sb.ReadFull(context.Background(), "part", got)
	if !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("err = %v", err)
	}
	if want := "oob: part: oob: peer closed the connection (unexpected EOF) after 2 of 5 bytes"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

func TestDialErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if _, err := Dial(context.Background(), addr, Options{}); err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, addr, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if _, err := Accept(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}
