package link

import "sync"

// PollReceiver is implemented by links that can be read without blocking: the receive side of
// a device in polled mode (roce.Options.Polled), where the application's own goroutine reads
// the link instead of a receive goroutine (perftest's model: one thread polls everything and
// never sleeps). Every path here has it.
type PollReceiver interface {
	// TryRecv is one non-blocking read: it fills batch[0:n] as Recv does and returns 0, nil at
	// once when nothing is queued. The caller provides batch[i].Buf with cap >= MaxDatagram;
	// an implementation may instead point batch[i].Buf into its own receive memory (a UDP GRO
	// buffer, as ViewReceiver does, or an AF_XDP UMEM chunk), valid only until the next
	// TryRecv, Recv or RecvView call. Returns net.ErrClosed after Close.
	TryRecv(batch []Datagram) (n int, err error)
}

// LockedPollReceiver is a PollReceiver whose caller can hold the link's own receive lock
// around its reads, so that a caller that needs a lock of its own anyway (a polled device
// serialises its Polls and its receive state) takes one lock per poll instead of two.
type LockedPollReceiver interface {
	PollReceiver
	// RecvMutex returns the lock that serialises the link's receive calls (TryRecv, Recv,
	// RecvView) with each other and with Close. Hold it only around TryRecvLocked and work
	// that does not call the link's receive side or Close (sending is fine).
	RecvMutex() *sync.Mutex
	// TryRecvLocked is TryRecv for a caller that holds RecvMutex.
	TryRecvLocked(batch []Datagram) (n int, err error)
}

// ViewReceiver is implemented by links that can hand out received datagrams without copying
// them: RecvView is Recv, except that batch[i].Buf may point into the link's own receive memory
// (a GRO buffer) instead of the caller's buffer, valid only until the next Recv or RecvView call.
// The device's receive loop checks and places every packet before reading again, so a GRO
// segment is copied once, from the socket buffer's copy straight into the memory region.
type ViewReceiver interface {
	RecvView(batch []Datagram) (int, error)
}
