package roce

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
)

// foreign stands for an object of another Verbs implementation.
type foreign struct{}

func (foreign) Dealloc() error { return nil }

func TestEmbeddedVerbs(t *testing.T) {
	l, err := mem.NewNetwork(mem.Options{}).Attach(netip.MustParseAddr("10.5.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	attr := qp.DefaultDeviceAttr()
	attr.MaxSRQ = 1
	d, err := Open(Options{Link: l, Attr: &attr})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	v := d.Verbs()
	if v.Name() != d.Name() || v.GIDIndex(netip.MustParseAddr("10.5.0.1")) != 1 || len(v.GIDs()) != 2 {
		t.Fatalf("device info: %s %v", v.Name(), v.GIDs())
	}
	// DestroySRQ frees the device's SRQ slot (MaxSRQ 1: a second create needs it).
	s, err := v.CreateSRQ(qp.SRQOptions{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.CreateSRQ(qp.SRQOptions{MaxWR: 4, MaxSGE: 1}); !errors.Is(err, ErrLimit) {
		t.Fatalf("second SRQ with MaxSRQ 1: %v", err)
	}
	if err := v.DestroySRQ(s); err != nil {
		t.Fatal(err)
	}
	if _, err := v.CreateSRQ(qp.SRQOptions{MaxWR: 4, MaxSGE: 1}); err != nil {
		t.Fatalf("SRQ after DestroySRQ: %v", err)
	}
	// Objects of another implementation are refused, not type-asserted into a panic.
	buf, _ := v.AllocBuffer(4096)
	if _, err := v.RegMR(foreign{}, buf, 0, mr.AccessLocalWrite); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("RegMR with a foreign PD: %v", err)
	}
	if _, err := v.CreateQP(VerbsQPInit{Type: qp.TypeRC, PD: foreign{}}); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("CreateQP with foreign objects: %v", err)
	}
	if err := v.DestroyCQ(nil); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("DestroyCQ(nil): %v", err)
	}
	if _, err := v.AllocBuffer(0); !errors.Is(err, ErrInvalidArg) {
		t.Fatalf("AllocBuffer(0): %v", err)
	}
	pd, err := v.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	q, err := v.CreateQP(VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: c, RecvCQ: c, Cap: qp.Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := q.(*QP); !ok || q.Num() < FirstQPN {
		t.Fatalf("embedded QP %T %d", q, q.Num())
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := v.DestroyCQ(c); err != nil {
		t.Fatal(err)
	}
}
