package client

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/event"
)

// A dead daemon is seen by the socket alone: when the daemon's process ends (SIGKILL
// included) or it drops the connection, the kernel hangs up the client's end. Nothing reads
// the socket between requests, and the data path (rings, eventfds) never touches it, so a
// watcher waits for the hang-up: an epoll instance of its own holding a duplicate of the
// socket for EPOLLRDHUP (and EPOLLHUP/EPOLLERR, always reported) only, itself waited on in
// the Go poller. A response arriving on the socket is not an event there, so the watcher
// costs nothing per request; it wakes once, at the hang-up.

// startWatch starts the hang-up watcher of the connection's socket.
func (c *Conn) startWatch() error {
	rc, err := c.sock.SyscallConn()
	if err != nil {
		return err
	}
	var dup int
	var derr error
	if err := rc.Control(func(fd uintptr) { dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return err
	}
	if derr != nil {
		return fmt.Errorf("dup socket: %w", derr)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(dup)
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, dup, &unix.EpollEvent{Events: unix.EPOLLRDHUP}); err != nil {
		unix.Close(dup)
		unix.Close(ep)
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	// The epoll instance keeps watching the socket's open file; the duplicate fd is needed
	// only to name it (epoll drops the watch when the last fd of the file closes).
	c.watchDup = dup
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(dup)
		unix.Close(ep)
		return err
	}
	c.watchFile = os.NewFile(uintptr(ep), "softroce-daemon-watch")
	c.watchDone = make(chan struct{})
	go c.watch()
	return nil
}

// watch waits for the socket's hang-up, then marks the connection lost. It ends then, or
// when Close closes the epoll instance.
func (c *Conn) watch() {
	defer close(c.watchDone)
	rc, err := c.watchFile.SyscallConn()
	if err != nil {
		return
	}
	var evs [1]unix.EpollEvent
	hung := false
	err = rc.Read(func(fd uintptr) bool {
		n, _ := unix.EpollWait(int(fd), evs[:], 0)
		hung = n > 0
		return hung
	})
	if err == nil && hung {
		c.lose()
	}
}

// lose marks the connection lost (the daemon died or dropped it): every later post, ReqNotify
// and Wait fails with proto.ErrDisconnected, a Wait or Channel already waiting returns (each
// CQ's notify eventfd is written: its waiters look again and see the loss), and Events
// delivers DEVICE_FATAL (IBV_EVENT_DEVICE_FATAL, as a removed device reports). Completions
// already in the rings can still be polled.
func (c *Conn) lose() {
	if c.lost.Swap(true) {
		return
	}
	close(c.lostCh)
	// wake the CQs outside bmu: Poll holds a CQ's lock while it takes bmu (account), so
	// taking a CQ's lock under bmu here could deadlock with a Poll
	c.bmu.Lock()
	cqs := make([]*cqc, 0, len(c.cqs))
	for q := range c.cqs {
		cqs = append(cqs, q)
	}
	c.bmu.Unlock()
	for _, q := range cqs {
		q.wakeLost()
	}
	select {
	case c.events <- event.Event{Type: event.DeviceFatal, Port: 1}:
	default:
	}
}

// errLost is the error of an operation on a lost connection.
var errLost = fmt.Errorf("%w: the daemon is gone", proto.ErrDisconnected)

// Lost reports whether the daemon died or dropped this connection.
func (c *Conn) Lost() bool { return c.lost.Load() }

// stopWatch ends the watcher (Close).
func (c *Conn) stopWatch() {
	if c.watchFile == nil {
		return
	}
	c.watchFile.Close()
	<-c.watchDone
	unix.Close(c.watchDup)
	c.watchFile = nil
}
