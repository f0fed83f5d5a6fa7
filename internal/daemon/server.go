// Package daemon is the server side of the softroce daemon: one RoCE device
// (pkg/roce) shared by many local programs over a unix socket. Clients
// (pkg/client) create objects through control messages; their memory
// is shared (sealed memfds mapped by both sides, so RDMA lands directly in
// the client's buffer) and completions reach them through shared-memory
// rings with eventfd notification. Each client sees only its own objects;
// when its connection ends, for any reason, every object it created is
// destroyed and its memory unmapped. See docs/daemon.md.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/event"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// Options configure New.
type Options struct {
	// Device is the engine the clients share (required). The server does
	// not close it.
	Device *roce.Device
	// Logger receives structured logs (nil = slog.Default()).
	Logger *slog.Logger
	// PostSpin is how long a client's post-ring drainer keeps polling
	// the ring (yielding between looks) after emptying it, before it
	// sleeps on the doorbell; 0 = not at all. On a CPU-bound host spinning
	// costs more than the doorbell saves (docs/performance.md).
	PostSpin time.Duration
	// Limits bound what each user's clients hold together (zero fields: DefaultLimits,
	// negative: none); Ceiling what all users hold together (zero fields: DefaultCeiling).
	Limits, Ceiling Limits
	// Privileged tells whether a user may use what the IBTA reserves to privileged
	// consumers: controlled Q_Keys (the high-order bit set, IBTA 10.2.4), which the host's
	// own CM (QP1) uses. nil: only root (uid 0), as the kernel allows CAP_NET_RAW only.
	Privileged func(uid uint32) bool
	// DrainTurns is how many clients' post-ring drainers may post at once (postring.go, "Fair
	// service" in docs/daemon.md); 0 = GOMAXPROCS-1 (at least 1).
	DrainTurns int
	// CQClock times the clients' CQ moderation periods (OpModifyCQ); nil = the real clock.
	// Tests inject a fake one.
	CQClock cq.Clock
}

// Server serves clients of one device.
type Server struct {
	dev      *roce.Device
	verb     roce.Verbs
	log      *slog.Logger
	postSpin time.Duration
	acct     *accounts
	priv     func(uid uint32) bool
	cqClock  cq.Clock

	mu       sync.Mutex
	sessions map[*session]struct{}
	lns      []net.Listener
	nextID   uint64
	closing  bool
	wg       sync.WaitGroup
	changed  chan struct{} // closed and replaced when a client leaves
	drainBy  time.Time     // Shutdown: deadline for delivering flushed completions

	// live object counts over all sessions (Debug, metrics)
	nPD, nMR, nCQ, nSRQ, nQP atomic.Int64
	nMW                      atomic.Int64 // memory windows (mw.go; metrics only: not in proto.Debug)
	nCMID                    atomic.Int64 // rdma_cm IDs (cm.go)
	nCMChan                  atomic.Int64 // rdma_cm event channels (cm.go)
	nCMListen                atomic.Int64 // rdma_cm IDs listening (cm.go)
	mapped                   atomic.Int64
	ringPosts, socketPosts   atomic.Uint64
	refills                  atomic.Uint64 // packets held for a session.refill (postring.go)
	acceptBackoffs           atomic.Uint64 // accept errors Serve backed off on (EMFILE, ...)
	badPosts                 atomic.Uint64 // post records and messages refused (malformed, unknown handle)
	droppedEvents            atomic.Uint64 // asynchronous events dropped on full event rings
	refusedPriv              atomic.Uint64 // requests refused as reserved to privileged users
	drainYields              atomic.Uint64 // drain turns that ended with records left (postring.go)
	turns                    chan struct{} // drain turn tokens (postring.go)
	quit                     chan struct{} // closed by Shutdown
	logs                     logLimiter    // rate limits of repeated warnings (limitedLog)
	// drainPaused makes the post rings' drainer goroutines ignore the client's doorbells (a
	// test knob, export_test.go): records then reach the engine only when the engine asks
	// (RecvRefill) or before a socket request.
	drainPaused atomic.Bool

	// owners maps engine objects (*cq.CQ, *qp.SRQ, QPN) to the client
	// session and handle their asynchronous events go to.
	omu    sync.Mutex
	owners map[any]owner
}

// owner is the client a device object belongs to.
type owner struct {
	ss   *session
	h    proto.Handle
	kind uint8 // proto.EventOn*
}

func (s *Server) own(key any, o owner) {
	s.omu.Lock()
	if s.owners == nil {
		s.owners = map[any]owner{}
	}
	s.owners[key] = o
	s.omu.Unlock()
}

func (s *Server) disown(key any) {
	s.omu.Lock()
	delete(s.owners, key)
	s.omu.Unlock()
}

// New creates a server for o.Device.
func New(o Options) (*Server, error) {
	if o.Device == nil {
		return nil, roce.ErrInvalidArg
	}
	l := o.Logger
	if l == nil {
		l = slog.Default()
	}
	spin := max(o.PostSpin, 0)
	clock := o.CQClock
	if clock == nil {
		clock = cq.RealClock{}
	}
	turns := o.DrainTurns
	if turns <= 0 {
		turns = max(1, runtime.GOMAXPROCS(0)-1)
	}
	priv := o.Privileged
	if priv == nil {
		priv = func(uid uint32) bool { return uid == 0 }
	}
	return &Server{dev: o.Device, verb: o.Device.Verbs(), log: l, sessions: map[*session]struct{}{},
		changed: make(chan struct{}), quit: make(chan struct{}), postSpin: spin,
		acct: newAccounts(o.Limits, o.Ceiling), priv: priv, cqClock: clock,
		turns: make(chan struct{}, turns)}, nil
}

// acceptTemporary reports whether an accept error is a shortage that passes (descriptors,
// memory), not a broken listener.
func acceptTemporary(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// acceptBackoffHook, if set, is called with each accept error Serve backs off on (tests).
var acceptBackoffHook func(error)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("softroce daemon: server closed")

// Listen creates the unix SOCK_SEQPACKET socket at path (a stale socket
// file is removed), with the given permission bits and, if gid >= 0, group.
func Listen(path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		// A live daemon answers; a stale file does not.
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("softroce daemon: %s: another daemon is listening", path)
		}
		os.Remove(path)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, err
		}
	}
	return ln, nil
}

// Serve accepts clients on ln until Shutdown (then it returns ErrServerClosed).
func (s *Server) Serve(ln *net.UnixListener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	var delay time.Duration
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if acceptTemporary(err) {
				// Out of descriptors or memory: the connection waits in the backlog.
				// Back off and retry (5 ms doubling to 1 s); ending Serve would end the
				// daemon and every client with it.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.acceptBackoffs.Add(1)
				s.limitedLog("accept", "accept failed: backing off", "err", err, "delay", delay)
				if h := acceptBackoffHook; h != nil {
					h(err)
				}
				select {
				case <-time.After(delay):
				case <-s.quit:
				}
				continue
			}
			return err
		}
		delay = 0
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return ErrServerClosed
		}
		s.nextID++
		ss := newSession(s, c, s.nextID)
		s.sessions[ss] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			ss.run()
		}()
	}
}

// Shutdown stops accepting clients, then ends every session: requests the
// client already sent are still served (asynchronous posts reach the
// engine), then the client's QPs move to the error state so outstanding
// work requests complete with WR_FLUSH_ERR into the clients' completion
// rings, the session waits until those completions are delivered (bounded
// by ctx), and disconnects the client and releases its objects.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.closing {
		close(s.quit)
	}
	s.closing = true
	s.drainBy = time.Now().Add(drainTimeout)
	if d, ok := ctx.Deadline(); ok {
		s.drainBy = d
	}
	for _, ln := range s.lns {
		ln.Close()
	}
	ss := make([]*session, 0, len(s.sessions))
	for x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	for _, x := range ss {
		// SHUT_RD: queued requests are still read, then the session sees
		// EOF and runs its shutdown path; the client's new sends fail.
		x.conn.CloseRead()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		for _, x := range ss {
			x.conn.Close()
		}
		return ctx.Err()
	}
}

// shuttingDown reports whether Shutdown runs, and its drain deadline.
func (s *Server) shuttingDown() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing, s.drainBy
}

// Event logs an asynchronous device event and forwards it to the client
// owning its object (QP by QPN, CQ, SRQ; port and device events to every
// client), through the client's event ring (pass it as roce Options.Events).
// It never blocks.
func (s *Server) Event(e event.Event) {
	s.limitedLogLevel("event", slog.LevelInfo, logBurst, "async event", "type", e.Type.String(), "qpn", e.QPN)
	var key any
	switch x := e.Object.(type) {
	case *cq.CQ:
		key = x
	case *qp.SRQ:
		key = x
	case *qp.QP:
		key = x.Num()
	case *roce.QP:
		key = x.Num()
	case nil:
		s.mu.Lock()
		all := make([]*session, 0, len(s.sessions))
		for ss := range s.sessions {
			all = append(all, ss)
		}
		s.mu.Unlock()
		for _, ss := range all {
			ss.pushEvent(proto.Event{Type: e.Type, Kind: proto.EventOnDevice, Port: e.Port})
		}
		return
	default:
		return
	}
	s.omu.Lock()
	o, ok := s.owners[key]
	s.omu.Unlock()
	if ok {
		o.ss.pushEvent(proto.Event{Type: e.Type, Kind: o.kind, Handle: o.h, QPN: e.QPN, Port: e.Port})
	}
}

// Debug returns resource counts (also served to clients as OpDebug).
func (s *Server) Debug() proto.Debug {
	var d proto.Debug
	s.mu.Lock()
	d.Clients = len(s.sessions)
	s.mu.Unlock()
	d.PDs, d.MRs, d.CQs = int(s.nPD.Load()), int(s.nMR.Load()), int(s.nCQ.Load())
	d.SRQs, d.QPs = int(s.nSRQ.Load()), int(s.nQP.Load())
	d.CMIDs = int(s.nCMID.Load())
	d.CMChannels = int(s.nCMChan.Load())
	d.CMListens = int(s.nCMListen.Load())
	d.MappedBytes = s.mapped.Load()
	d.RingPosts, d.SocketPosts = s.ringPosts.Load(), s.socketPosts.Load()
	d.Refills = s.refills.Load()
	d.AcceptBackoffs = s.acceptBackoffs.Load()
	d.BadPosts, d.DroppedEvents = s.badPosts.Load(), s.droppedEvents.Load()
	d.Refused = s.acct.refusals().proto()
	d.RefusedPrivileged = s.refusedPriv.Load()
	d.DrainYields = s.drainYields.Load()
	if ls, ok := s.dev.LinkStats(); ok {
		d.EntropySockets = int(ls.UDP.EntropySockets)
	}
	d.FDs = countFDs() - d.EntropySockets
	d.Goroutines = runtime.NumGoroutine()
	return d
}

func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory's own fd
}

func (s *Server) remove(ss *session) {
	s.mu.Lock()
	delete(s.sessions, ss)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// WaitClients waits until at most n clients are connected; a client counts
// until every object it created has been released.
func (s *Server) WaitClients(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		k, ch := len(s.sessions), s.changed
		s.mu.Unlock()
		if k <= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drainTimeout bounds how long cleanup waits for completions to reach a
// ring during Shutdown when the caller's context has no deadline.
const drainTimeout = 2 * time.Second
