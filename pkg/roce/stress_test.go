package roce

import (
	"bytes"
	"sync"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
)

// TestConcurrentQPs: several RC QP pairs driven from their own
// goroutines at once (WRITEs one way, READs the other), data verified;
// then the devices are closed while more work is in flight: no panic,
// no goroutine left (goleak in TestMain).
func TestConcurrentQPs(t *testing.T) {
	for _, kind := range []string{"mem", "udp"} {
		t.Run(kind, func(t *testing.T) {
			da, db, _ := devPair(t, kind)
			const pairs = 4
			const size = 200_000
			var wg sync.WaitGroup
			ends := make([][2]*end, pairs)
			for i := range ends {
				a, b := newEnd(t, da, qp.TypeRC, 1<<20), newEnd(t, db, qp.TypeRC, 1<<20)
				connect(t, a, b, qp.MTU1024, uint32(i*1000), uint32(i*7777))
				ends[i] = [2]*end{a, b}
			}
			errs := make(chan string, pairs*2)
			for i := range ends {
				for dir := 0; dir < 2; dir++ {
					x, y := ends[i][dir], ends[i][1-dir]
					off := dir * (size + 4096)
					wg.Add(1)
					go func() {
						defer wg.Done()
						x.fill(off, size, byte(dir+1))
						op := qp.WRRDMAWrite
						if dir == 1 {
							op = qp.WRRDMARead
							y.fill(512<<10, size, 9)
						}
						for k := 0; k < 5; k++ {
							wr := qp.SendWR{WRID: uint64(k), Opcode: op, SGL: x.sgl(off, size, 3), Flags: qp.SendSignaled,
								RemoteAddr: y.va(512 << 10), RKey: y.mr.RKey()}
							if op == qp.WRRDMAWrite {
								wr.RemoteAddr = y.va(off + 600_000)
							}
							if _, err := x.qp.PostSend([]qp.SendWR{wr}); err != nil {
								errs <- err.Error()
								return
							}
						}
						got := 0
						buf := make([]cq.WC, 8)
						for got < 5 {
							k := x.scq.Poll(buf)
							for _, wc := range buf[:k] {
								if wc.Status != cq.StatusSuccess {
									errs <- wc.Status.String()
									return
								}
							}
							got += k
							if k == 0 {
								x.scq.ReqNotify(false)
								if x.scq.Len() == 0 {
									<-x.scq.Channel()
								}
							}
						}
						if dir == 0 && !bytes.Equal(y.buf[off+600_000:off+600_000+size], x.buf[off:off+size]) {
							errs <- "write data differs"
						}
						if dir == 1 && !bytes.Equal(x.buf[off:off+size], y.buf[512<<10:512<<10+size]) {
							errs <- "read data differs"
						}
					}()
				}
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
			}
			if t.Failed() {
				t.Logf("A %+v", da.Stats())
				t.Logf("B %+v", db.Stats())
			}
			// close with traffic in flight
			for i := range ends {
				a, b := ends[i][0], ends[i][1]
				a.qp.PostSend([]qp.SendWR{{Opcode: qp.WRRDMAWrite, SGL: a.sgl(0, size, 1), RemoteAddr: b.va(0), RKey: b.mr.RKey()}})
			}
			da.Close()
			db.Close()
		})
	}
}
