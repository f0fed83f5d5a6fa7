package daemon_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"syscall"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/client"
	"github.com/softroce/softroce/pkg/roce"
)

// TestReregMRUnderTraffic: A streams one-packet RDMA WRITEs (1 KiB chunks, each filled with its
// sequence number) into B's region while B re-registers the region back and forth between two
// buffers X and Y (same length and iova, so the R_Key A holds stays good): every WRITE
// completes, every chunk of X and Y holds one WRITE's bytes (never a mix of two
// registrations), and from the moment a ReregMR returns until the buffer it replaced is
// registered again, nothing writes that buffer. Once with memory the daemon maps (a memfd
// from AllocBuffer), once with memory it copies through the program's /proc/self/mem.
func TestReregMRUnderTraffic(t *testing.T) {
	for _, kind := range []string{"memfd", "process"} {
		t.Run(kind, func(t *testing.T) {
			da, db := memPair(t)
			cb := db.dial(t)
			const half, chunk, chunks = 16 << 10, 1024, 16
			a := newEnd(t, da.dial(t), chunk*chunks, 8, rcAccess)
			var buf []byte
			if kind == "memfd" {
				var err error
				if buf, err = cb.AllocBuffer(2 * half); err != nil {
					t.Fatal(err)
				}
			} else {
				buf = make([]byte, 2*half)
			}
			b := newEndBuf(t, cb, buf, 8, rcAccess)
			a.connect(t, ipB, b.q.Num(), 1)
			b.connect(t, ipA, a.q.Num(), 1)
			x, y := buf[:half], buf[half:]
			if err := cb.ReregMR(b.m, client.Rereg{Flags: roce.ReregTranslation, Buf: x, IOVA: b.iova}); err != nil {
				t.Fatal(err)
			}
			key := b.m.RKey()
			const total = 1500
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var rereg int
			wg.Add(1)
			go func() { // B: X -> Y -> X ..., checking the replaced buffer stays as it was
				defer wg.Done()
				cur, other := x, y
				var left []byte // other as it was when the ReregMR that replaced it returned
				for ; ; rereg++ {
					select {
					case <-stop:
						return
					default:
					}
					if left != nil && !bytes.Equal(other, left) {
						t.Error("a buffer was written after the ReregMR that replaced it returned")
						return
					}
					if err := cb.ReregMR(b.m, client.Rereg{Flags: roce.ReregTranslation, Buf: other, IOVA: b.iova}); err != nil {
						t.Error("ReregMR:", err)
						return
					}
					if b.m.RKey() != key || b.m.LKey() != key || b.m.Len() != half {
						t.Error("the MR's keys or length changed")
					}
					left = bytes.Clone(cur)
					cur, other = other, cur
				}
			}()
			posted, done := uint64(0), uint64(0)
			for done < total {
				for posted < total && posted-done < 8 {
					c := a.buf[posted%chunks*chunk:][:chunk]
					for i := 0; i < chunk; i += 8 {
						binary.LittleEndian.PutUint64(c[i:], posted+1)
					}
					if _, err := a.q.PostSend([]qp.SendWR{{WRID: posted, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
						SGL:        []qp.SGE{{Addr: a.iova + posted%chunks*chunk, Length: chunk, LKey: a.m.LKey()}},
						RemoteAddr: b.iova + posted%chunks*chunk, RKey: b.m.RKey()}}); err != nil {
						t.Fatal(err)
					}
					posted++
				}
				for _, wc := range a.wait(t, 1) {
					if wc.Status != cq.StatusSuccess || wc.WRID != done {
						close(stop)
						wg.Wait()
						t.Fatalf("WRITE %d: %+v", done, wc)
					}
					done++
				}
			}
			close(stop)
			wg.Wait()
			for name, mem := range map[string][]byte{"X": x, "Y": y} {
				for c := 0; c < half; c += chunk {
					w := mem[c : c+chunk]
					v := binary.LittleEndian.Uint64(w)
					for i := 8; i < chunk; i += 8 {
						if binary.LittleEndian.Uint64(w[i:]) != v {
							t.Fatalf("%s chunk %d mixes WRITE %d with WRITE %d", name, c/chunk, v, binary.LittleEndian.Uint64(w[i:]))
						}
					}
				}
			}
			t.Logf("%d WRITEs, %d re-registrations", total, rereg)
		})
	}
}

// TestReregMRProtocol: OpReregMR's answers through the client. Access, PD and translation
// changes keep the keys and take effect for the next access (a peer's WRITE is refused once
// remote write is gone: a remote access error, as ibv_rereg_mr's users expect; a receive
// into a region moved to another PD fails with the peer seeing a remote operation error);
// bad flags, an unknown PD, on-demand paging, a bound window and a PD in use are refused with
// the errnos ibverbs gives.
func TestReregMRProtocol(t *testing.T) {
	da, db := memPair(t)
	ca, cb := da.dial(t), db.dial(t)
	a := newEnd(t, ca, 1<<16, 8, rcAccess)
	b := newEnd(t, cb, 1<<16, 8, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	key := b.m.RKey()
	for _, c := range []struct {
		name  string
		o     client.Rereg
		errno syscall.Errno
		code  wire.Code
	}{
		{"no flag", client.Rereg{}, syscall.EINVAL, wire.CodeMRInvalid},
		{"unknown flag", client.Rereg{Flags: 8}, syscall.EINVAL, wire.CodeMRInvalid},
		{"remote write without local write", client.Rereg{Flags: roce.ReregAccess, Access: mr.AccessRemoteWrite}, syscall.EINVAL, wire.CodeMRInvalid},
		{"on-demand paging", client.Rereg{Flags: roce.ReregAccess, Access: mr.AccessLocalWrite | 1<<6}, syscall.EOPNOTSUPP, wire.CodeUnsupported},
		{"persistent FLUSH on daemon memory", client.Rereg{Flags: roce.ReregAccess, Access: mr.AccessLocalWrite | mr.AccessFlushPersistent}, syscall.EINVAL, wire.CodeMRInvalid},
	} {
		err := cb.ReregMR(b.m, c.o)
		if !errors.Is(err, c.errno) || proto.CodeOf(err) != c.code {
			t.Errorf("%s: %v (code %d), want %v (code %d)", c.name, err, proto.CodeOf(err), c.errno, c.code)
		}
	}
	if err := cb.ReregMR(b.m, client.Rereg{Flags: roce.ReregPD, PD: a.pd}); !errors.Is(err, roce.ErrInvalidArg) {
		t.Errorf("a PD of another connection: %v", err)
	}
	// A window bound to the MR was bound to its registration: EBUSY, nothing changed.
	bm, err := cb.RegMR(b.pd, b.buf, 0x900000, rcAccess|mr.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cb.AllocMW(b.pd, roce.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Bind(b.q, 9, qp.SendSignaled, bm, 0x900000, 64, mr.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.Opcode != cq.OpBindMW {
		t.Fatalf("bind: %+v", wc)
	}
	err = cb.ReregMR(bm, client.Rereg{Flags: roce.ReregAccess, Access: mr.AccessLocalWrite})
	if !errors.Is(err, syscall.EBUSY) || proto.CodeOf(err) != wire.CodeBusy {
		t.Fatalf("a bound window: %v", err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := cb.ReregMR(bm, client.Rereg{Flags: roce.ReregAccess, Access: mr.AccessLocalWrite}); err != nil {
		t.Fatal("once the window is gone:", err)
	}
	if err := bm.Dereg(); err != nil {
		t.Fatal(err)
	}

	// Remote write taken away: A's WRITE gets a remote access error; given back, it works.
	if err := cb.ReregMR(b.m, client.Rereg{Flags: roce.ReregAccess, Access: mr.AccessLocalWrite}); err != nil {
		t.Fatal(err)
	}
	if b.m.RKey() != key || b.m.LKey() != key {
		t.Fatalf("keys %#x/%#x after the access change, want %#x", b.m.LKey(), b.m.RKey(), key)
	}
	a.write(t, 1, 0, 64, b, 0)
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusRemAccessErr {
		t.Fatalf("WRITE without remote write access: %+v", wc)
	}

	// A fresh pair for the PD change: B's receive into its region, now of another PD, fails;
	// A sees a remote operation error. Back in its PD, SENDs land.
	a, b = newEnd(t, ca, 1<<16, 8, rcAccess), newEnd(t, cb, 1<<16, 8, rcAccess)
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	pd2, err := cb.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if err := cb.ReregMR(b.m, client.Rereg{Flags: roce.ReregPD, PD: pd2}); err != nil {
		t.Fatal(err)
	}
	if err := pd2.Dealloc(); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("the MR's new PD deallocated under it: %v", err)
	}
	recv := func(id uint64) {
		if _, err := b.q.PostRecv([]qp.RecvWR{{WRID: id, SGL: []qp.SGE{{Addr: b.iova, Length: 64, LKey: b.m.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(id uint64) {
		if _, err := a.q.PostSend([]qp.SendWR{{WRID: id, Opcode: qp.WRSend, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: a.iova, Length: 64, LKey: a.m.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	recv(1)
	send(1)
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusRemOpErr {
		t.Fatalf("SEND into a region of another PD: %+v, want a remote operation error", wc)
	}
	if wc := b.wait(t, 1)[0]; wc.Status == cq.StatusSuccess {
		t.Fatalf("receive into a region of another PD: %+v", wc)
	}
	if err := cb.ReregMR(b.m, client.Rereg{Flags: roce.ReregPD, PD: b.pd}); err != nil {
		t.Fatal(err)
	}
	if err := pd2.Dealloc(); err != nil {
		t.Fatalf("the MR's old PD: %v", err)
	}
	for _, e := range []*end{a, b} { // out of ERR, as the pyverbs tests restate their QPs
		if err := e.q.Modify(&qp.Attr{State: qp.StateReset}, qp.AttrState); err != nil {
			t.Fatal(err)
		}
	}
	a.connect(t, ipB, b.q.Num(), 1)
	b.connect(t, ipA, a.q.Num(), 1)
	pattern(a.buf[:64], 7)
	recv(2)
	send(2)
	if wc := a.wait(t, 1)[0]; wc.Status != cq.StatusSuccess {
		t.Fatalf("SEND once the region is back in the QP's PD: %+v", wc)
	}
	if wc := b.wait(t, 1)[0]; wc.Status != cq.StatusSuccess || wc.WRID != 2 || !bytes.Equal(b.buf[:64], a.buf[:64]) {
		t.Fatalf("receive once the region is back in the QP's PD: %+v", wc)
	}
}
