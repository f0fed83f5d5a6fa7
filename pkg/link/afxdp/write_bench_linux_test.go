package afxdp

import (
	"testing"
	"time"
)

// BenchmarkXDPWrite: the write responder's program through BPF_PROG_TEST_RUN on an 8-byte
// WRITE: "execute" (the expected PSN: copied into device memory, the ACK made in place,
// XDP_TX; one run per call), "decline" (a duplicate PSN: every check and the ICRC, then left to
// the ring) and "foreign" (a SEND: declined after the opcode), 100 runs per call. sec/op is a
// call, the system call included; ns/run the kernel's average time of the program alone.
// Root (BPF programs and maps).
func BenchmarkXDPWrite(b *testing.B) {
	eight := []byte("12345678")
	b.Run("execute", func(b *testing.B) {
		const n = 1 << 12 // frames PSN 0..n-1, then the QP goes back to PSN 0
		r := newWriteRig(b, 0, 0)
		frames := make([][]byte, n)
		for i := range frames {
			frames[i] = goodWrite(uint32(i), eight).frame()
		}
		var sum time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if i%n == 0 && i > 0 {
				r.st.Pause()
				r.st.Resume(0, 0, false)
			}
			v, d := r.runRepeat(b, frames[i%n], 1)
			if v != xdpVerdictTx {
				b.Fatalf("run %d: verdict %d, want XDP_TX", i, v)
			}
			sum += d
		}
		b.ReportMetric(float64(sum.Nanoseconds())/float64(b.N), "ns/run")
	})
	foreign := goodWrite(7, eight)
	foreign.opcode = 0x04 // RC SEND Only
	for _, c := range []struct {
		name string
		f    wframe
	}{{"decline", goodWrite(6, eight)}, {"foreign", foreign}} {
		b.Run(c.name, func(b *testing.B) {
			r := newWriteRig(b, 7, 0)
			fr := c.f.frame()
			var sum time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				v, d := r.runRepeat(b, fr, 100)
				if v != xdpVerdictPass {
					b.Fatalf("verdict %d, want XDP_PASS", v)
				}
				sum += d
			}
			b.ReportMetric(float64(sum.Nanoseconds())/float64(b.N), "ns/run")
		})
	}
}
