package rocetest

import (
	"bytes"
	"strings"
	"sync"
)

// Watch is an io.Writer that collects a process's output (safe for its stdout and stderr at
// once) and closes Seen the first time the output contains a marker: tests start a tool's
// other side once the first one printed its readiness line.
type Watch struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	seen   chan struct{}
	once   sync.Once
}

// NewWatch returns a Watch for marker.
func NewWatch(marker string) *Watch {
	return &Watch{marker: marker, seen: make(chan struct{})}
}

// Seen is closed once the output contains the marker.
func (w *Watch) Seen() <-chan struct{} { return w.seen }

// Write appends b to the output.
func (w *Watch) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if strings.Contains(w.buf.String(), w.marker) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(b), nil
}

// String is the output so far.
func (w *Watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
