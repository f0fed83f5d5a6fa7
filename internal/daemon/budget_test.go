package daemon_test

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon"
)

// TestUserInFlightBudget: the QPs of one user, on two connections of their own, share the
// user's in-flight budget (limit inflight=16: the two keep at most 16 PSNs plus a floor of 2
// each unacknowledged, where each alone may keep 128), and both streams of WRITEs complete
// byte-exact; the metrics count the waits and show nothing in flight after. inflight=none
// gives the user no budget.
func TestUserInFlightBudget(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		want  int // the budget's limit the daemon reports
	}{
		{"inflight=16", 16, 16},
		{"none", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withLimits(t, daemon.Limits{InFlight: tc.limit}, daemon.Limits{})
			da, db := memPair(t)
			const size, msg, n = 1 << 20, 128 << 10, 8
			var as, bs []*end
			for i := 0; i < 2; i++ {
				a := newEnd(t, da.dial(t), size, 16, rcAccess)
				b := newEnd(t, db.dial(t), size, 16, rcAccess)
				// two full windows on a loaded machine (-race): 67 ms, 7 retries
				a.timeout, a.retry, b.timeout, b.retry = 14, 7, 14, 7
				pattern(a.buf, i+1)
				a.connect(t, ipB, b.q.Num(), 1)
				b.connect(t, ipA, a.q.Num(), 1)
				as, bs = append(as, a), append(bs, b)
			}
			uid := uint32(os.Getuid())
			if _, limit := da.srv.UserInFlight(uid); limit != tc.want {
				t.Fatalf("budget limit %d, want %d", limit, tc.want)
			}
			var peak atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			t.Cleanup(func() { // before the daemons stop (cleanups run last first)
				select {
				case <-stop:
				default:
					close(stop)
				}
				<-sampled
			})
			go func() {
				defer close(sampled)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if v, _ := da.srv.UserInFlight(uid); int64(v) > peak.Load() {
						peak.Store(int64(v))
					}
				}
			}()
			for k := 0; k < n; k++ {
				for i, a := range as {
					a.write(t, uint64(k), k*msg, msg, bs[i], k*msg)
				}
			}
			for i, a := range as {
				for _, wc := range a.wait(t, n) {
					if wc.Status != cq.StatusSuccess {
						t.Fatalf("QP %d: %+v", i, wc)
					}
				}
			}
			close(stop)
			<-sampled
			for i := range as {
				if !bytes.Equal(as[i].buf[:n*msg], bs[i].buf[:n*msg]) {
					t.Fatalf("QP %d: data differs", i)
				}
			}
			p := peak.Load()
			if tc.want > 0 && (p == 0 || p > int64(tc.want+2*2)) {
				t.Fatalf("peak in flight %d, want 1..%d", p, tc.want+4)
			}
			if v, _ := da.srv.UserInFlight(uid); v != 0 {
				t.Fatalf("%d still in flight", v)
			}
			var m bytes.Buffer
			if err := da.srv.WriteMetrics(&m); err != nil {
				t.Fatal(err)
			}
			waits := regexp.MustCompile(fmt.Sprintf(`softroce_daemon_user_inflight_waits_total\{device="[^"]*",uid="%d"\} ([0-9]+)`, uid)).FindSubmatch(m.Bytes())
			if tc.want > 0 && (waits == nil || string(waits[1]) == "0" ||
				!bytes.Contains(m.Bytes(), []byte(fmt.Sprintf(`softroce_daemon_user_inflight{device="a",uid="%d"} 0`, uid)))) {
				t.Fatalf("metrics: no waits counted or in flight not 0:\n%s", m.String())
			}
			if tc.want == 0 && waits != nil {
				t.Fatalf("metrics: a budget's waits without a budget: %s", waits[0])
			}
		})
	}
}
