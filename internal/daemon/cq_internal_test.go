package daemon

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
)

// TestPushSolicited: a CQ armed for solicited completions (ReqNotify(true))
// is signalled by a solicited or an unsuccessful completion, not by an
// unsolicited successful one (IBTA 11.4.2.2; the push hook has the
// Solicited bit). A full ring refuses the completion and asks for a space
// signal, and the engine CQ keeps it.
func TestPushSolicited(t *testing.T) {
	mem := make([]byte, proto.RingBytes(2))
	ring, _ := proto.NewRing(mem, 2)
	fd, err := proto.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	defer proto.CloseFD(fd)
	c, _ := cq.New(cq.Options{Capacity: 4})
	o := &cqObj{c: c, ring: ring, notifyFD: fd}
	c.SetPushHooks(o.onPush, o.afterPush)
	signalled := func() bool {
		var b [8]byte
		n, _ := unix.Read(fd, b[:])
		return n == 8
	}
	ring.Arm(proto.ArmSolicited, true)
	c.Push(&cq.WC{WRID: 1, Opcode: cq.OpRecv}, false)
	if signalled() || ring.Armed() != proto.ArmSolicited {
		t.Fatal("an unsolicited successful receive fired a solicited-only arm")
	}
	c.Push(&cq.WC{WRID: 2, Opcode: cq.OpRecv}, true)
	if !signalled() || ring.Armed() != proto.ArmNone {
		t.Fatal("a solicited receive did not fire")
	}
	if ring.Tail() != 2 || c.Len() != 0 {
		t.Fatalf("tail %d, engine CQ %d", ring.Tail(), c.Len())
	}
	// Ring full (capacity 2): the engine CQ keeps the next one, the ring asks for space.
	c.Push(&cq.WC{WRID: 3, Status: cq.StatusWRFlushErr}, false)
	if ring.Tail() != 2 || c.Len() != 1 || !ring.TakeWaiting() {
		t.Fatalf("full ring: tail %d, engine CQ %d", ring.Tail(), c.Len())
	}
	// The client consumes; the mover (readSpace's body) delivers the kept one.
	ring.Consume(2)
	ring.Arm(proto.ArmSolicited, true)
	o.moveKept()
	var wc cq.WC
	if ring.Tail() != 3 || c.Len() != 0 || !signalled() {
		t.Fatalf("after space: tail %d, engine CQ %d", ring.Tail(), c.Len())
	}
	ring.Get(2, &wc)
	if wc.WRID != 3 || wc.Status != cq.StatusWRFlushErr {
		t.Fatalf("moved completion %+v", wc)
	}
}
