package roce

import (
	"fmt"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/link/mem"
)

// BenchmarkMemWrite streams signaled 64 KiB RDMA WRITEs between two
// devices on the in-memory link (both receive goroutines running), 8 in
// flight; -benchmem shows the allocations per 64 KiB message.
func BenchmarkMemWrite(b *testing.B) {
	for _, mtu := range []qp.MTU{qp.MTU1024, qp.MTU4096} {
		b.Run("mtu"+mtu.String(), func(b *testing.B) {
			nw := mem.NewNetwork(mem.Options{QueueDepth: 1024})
			la, err1 := nw.Attach(addrA)
			lb, err2 := nw.Attach(addrB)
			if err1 != nil || err2 != nil {
				b.Fatal(err1, err2)
			}
			da, err1 := Open(Options{Link: la})
			db, err2 := Open(Options{Link: lb})
			if err1 != nil || err2 != nil {
				b.Fatal(err1, err2)
			}
			defer da.Close()
			defer db.Close()
			benchWrite(b, da, db, mtu)
		})
	}
}

func benchWrite(b *testing.B, da, db *Device, mtu qp.MTU) {
	x, y := newEnd(b, da, qp.TypeRC, 4<<20), newEnd(b, db, qp.TypeRC, 4<<20)
	connect(b, x, y, mtu, 1, 2)
	const size = 64 << 10
	const inflight = 8
	wrs := make([][]qp.SendWR, inflight)
	for i := range wrs {
		wrs[i] = []qp.SendWR{{WRID: uint64(i), Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{x.sge(i*size, size)},
			Flags: qp.SendSignaled, RemoteAddr: y.va(i * size), RKey: y.mr.RKey()}}
	}
	wcs := make([]cq.WC, inflight)
	stream(b, x, wrs, wcs, 300) // warm up: every link queue slot holds a full-size buffer
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	stream(b, x, wrs, wcs, b.N)
}

func stream(b *testing.B, x *end, wrs [][]qp.SendWR, wcs []cq.WC, n int) {
	inflight := len(wrs)
	posted, done := 0, 0
	for done < n {
		for posted < n && posted-done < inflight {
			if _, err := x.qp.PostSend(wrs[posted%inflight]); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		k := x.scq.Poll(wcs)
		for i := 0; i < k; i++ {
			if wcs[i].Status != cq.StatusSuccess {
				b.Fatalf("%+v", wcs[i])
			}
		}
		done += k
		if k == 0 {
			if err := x.scq.ReqNotify(false); err != nil {
				b.Fatal(err)
			}
			if k = x.scq.Poll(wcs); k > 0 {
				done += k
				continue
			}
			<-x.scq.Channel()
		}
	}
}

// BenchmarkMemRead streams signaled RDMA READs between two devices on the in-memory link, 8 in
// flight: 64 KiB (16 responses at MTU 4096, all built when the request arrives; 64 at MTU 1024)
// and 1 MiB (the responses past the first few built by the responder scheduler, sched.go).
func BenchmarkMemRead(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, mtu := range []qp.MTU{qp.MTU1024, qp.MTU4096} {
			b.Run(fmt.Sprintf("%dKiB/mtu%v", size>>10, mtu), func(b *testing.B) {
				nw := mem.NewNetwork(mem.Options{QueueDepth: 1024})
				la, err1 := nw.Attach(addrA)
				lb, err2 := nw.Attach(addrB)
				if err1 != nil || err2 != nil {
					b.Fatal(err1, err2)
				}
				da, err1 := Open(Options{Link: la})
				db, err2 := Open(Options{Link: lb})
				if err1 != nil || err2 != nil {
					b.Fatal(err1, err2)
				}
				defer da.Close()
				defer db.Close()
				benchRead(b, da, db, mtu, size)
			})
		}
	}
}

func benchRead(b *testing.B, da, db *Device, mtu qp.MTU, size int) {
	const inflight = 8
	x, y := newEnd(b, da, qp.TypeRC, inflight*size), newEnd(b, db, qp.TypeRC, inflight*size)
	connect(b, x, y, mtu, 1, 2)
	wrs := make([][]qp.SendWR, inflight)
	for i := range wrs {
		wrs[i] = []qp.SendWR{{WRID: uint64(i), Opcode: qp.WRRDMARead, SGL: []qp.SGE{x.sge(i*size, size)},
			Flags: qp.SendSignaled, RemoteAddr: y.va(i * size), RKey: y.mr.RKey()}}
	}
	wcs := make([]cq.WC, inflight)
	stream(b, x, wrs, wcs, 300*(64<<10)/size+8) // warm up
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	stream(b, x, wrs, wcs, b.N)
}
