package rdmacm

import (
	"context"
	"sync"
)

// EventChannel queues the events of the IDs created on it, in order
// (rdma_create_event_channel / rdma_get_cm_event). It never blocks the
// producer: the CM delivers into an unbounded queue.
type EventChannel struct {
	mu     sync.Mutex
	q      []Event
	notify chan struct{}
	closed bool
	onPush func()
}

// NewEventChannel returns an empty channel.
func NewEventChannel() *EventChannel {
	return &EventChannel{notify: make(chan struct{}, 1)}
}

// NewEventChannelFunc returns an empty channel that also calls onPush
// after each event is queued (on the goroutine delivering the event, which
// must not be blocked: onPush only signals). The softroce daemon wakes its
// client with it.
func NewEventChannelFunc(onPush func()) *EventChannel {
	return &EventChannel{notify: make(chan struct{}, 1), onPush: onPush}
}

func (c *EventChannel) push(e Event) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.q = append(c.q, e)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	if c.onPush != nil {
		c.onPush()
	}
}

// TryGet returns the next event without waiting.
func (c *EventChannel) TryGet() (Event, bool) {
	c.mu.Lock()
	if len(c.q) == 0 {
		c.mu.Unlock()
		return Event{}, false
	}
	e := c.q[0]
	c.q[0] = Event{}
	c.q = c.q[1:]
	c.mu.Unlock()
	if e.Type == EventConnectRequest && e.Listen != nil && e.ID != nil {
		e.Listen.taken(e.ID) // out of the listener's backlog (ID.Listen)
	}
	return e, true
}

// withdraw removes the first queued event f matches; false if none does.
func (c *EventChannel) withdraw(f func(*Event) bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.q {
		if f(&c.q[i]) {
			copy(c.q[i:], c.q[i+1:])
			c.q[len(c.q)-1] = Event{}
			c.q = c.q[:len(c.q)-1]
			return true
		}
	}
	return false
}

// Get waits for the next event (rdma_get_cm_event). It returns ctx.Err()
// when the context ends first and ErrClosed after Close.
func (c *EventChannel) Get(ctx context.Context) (Event, error) {
	for {
		if e, ok := c.TryGet(); ok {
			return e, nil
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return Event{}, ErrClosed
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Close discards queued events; Get then fails with ErrClosed.
func (c *EventChannel) Close() {
	c.mu.Lock()
	c.closed = true
	c.q = nil
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}
