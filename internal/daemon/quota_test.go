package daemon_test

import (
	"errors"
	"testing"

	"github.com/softroce/softroce/internal/daemon"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/roce"
)

// TestQuota: each client is held to Options.Quota (ErrQuota across the
// socket), another client has its own allowance, and releasing an object
// gives its slot back.
func TestQuota(t *testing.T) {
	testQuota = daemon.Quota{PDs: 2, MRs: 2, CQs: 1, SRQs: 1, QPs: 1, MRBytes: 1 << 16}
	defer func() { testQuota = daemon.Quota{} }()
	da, _ := memPair(t)
	for _, name := range []string{"first", "second"} {
		c := da.dial(t)
		quota := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, proto.ErrQuota) {
				t.Fatalf("%s client: %s beyond the quota: %v, want ErrQuota", name, what, err)
			}
		}
		pd, err := c.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		pd2, err := c.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.AllocPD()
		quota("third PD", err)
		if err := pd2.Dealloc(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.AllocPD(); err != nil {
			t.Fatalf("%s client: PD after freeing one: %v", name, err)
		}
		buf, err := c.AllocBuffer(1<<16 + 4096)
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.RegMR(pd, buf[:1<<16], 0, rcAccess)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.RegMR(pd, buf[1<<16:], 0, rcAccess)
		quota("MR bytes", err)
		if err := m.Dereg(); err != nil {
			t.Fatal(err)
		}
		if _, err = c.RegMR(pd, buf[:4096], 0, rcAccess); err != nil {
			t.Fatal(err)
		}
		if _, err = c.RegMR(pd, buf[4096:8192], 0, rcAccess); err != nil {
			t.Fatal(err)
		}
		_, err = c.RegMR(pd, buf[8192:12288], 0, rcAccess)
		quota("third MR", err)
		cq1, err := c.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateCQ(4)
		quota("second CQ", err)
		if _, err := c.CreateSRQ(qp.SRQOptions{MaxWR: 4, MaxSGE: 1}); err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateSRQ(qp.SRQOptions{MaxWR: 4, MaxSGE: 1})
		quota("second SRQ", err)
		in := roce.VerbsQPInit{Type: qp.TypeRC, PD: pd, SendCQ: cq1, RecvCQ: cq1, Cap: qp.Cap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}
		if _, err := c.CreateQP(in); err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateQP(in)
		quota("second QP", err)
	}
}
