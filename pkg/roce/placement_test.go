package roce

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
)

// countingPersister counts the bytes a FLUSH asked to make durable, then persists them.
type countingPersister struct {
	p     Persister
	bytes int
}

func (c *countingPersister) Persist(b []byte) error {
	c.bytes += len(b)
	return c.p.Persist(b)
}

// TestPlacementDevices: two devices on the in-memory link; the requester WRITEs into a
// responder region backed by a file mapping, ATOMIC WRITEs a word, then FLUSHes it
// (persistent): the file holds the bytes, the Persister ran over the range, and every
// completion is in order.
func TestPlacementDevices(t *testing.T) {
	da, db, _ := devPair(t, "mem")
	a, b := newEnd(t, da, qp.TypeRC, 1<<20), newEnd(t, db, qp.TypeRC, 1<<20)
	connect(t, a, b, qp.MTU1024, 5, 0xFFFFFE)
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessFlushGlobal | AccessFlushPersistent
	if err := b.qp.Modify(&qp.Attr{AccessFlags: acc}, qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pmem")
	fm, err := MapFile(path, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	if !fm.Durable() {
		t.Skipf("%s is on a volatile file system", path)
	}
	cp := &countingPersister{p: fm.Persister()}
	m, err := db.RegMRWith(b.pd, fm.Bytes(), 0x5000_0000, acc, RegMROptions{Persist: cp})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Dereg()
	if da.Attr().DeviceCapFlags&(DevCapFlushGlobal|DevCapFlushPersistent|DevCapAtomicWrite) !=
		DevCapFlushGlobal|DevCapFlushPersistent|DevCapAtomicWrite {
		t.Fatalf("device_cap_flags %#x lacks the placement bits", uint64(da.Attr().DeviceCapFlags))
	}
	a.fill(0, 100<<10, 7)
	copy(a.buf[200<<10:], []byte("8 bytes!"))
	post(t, a,
		qp.SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: a.sgl(0, 100<<10, 3), RemoteAddr: 0x5000_0000 + 4096, RKey: m.RKey()},
		qp.SendWR{WRID: 2, Opcode: WRAtomicWrite, SGL: []qp.SGE{a.sge(200<<10, 8)}, RemoteAddr: 0x5000_0000 + 8, RKey: m.RKey(),
			Flags: qp.SendSignaled},
		qp.SendWR{WRID: 3, Opcode: WRFlush, RemoteAddr: 0x5000_0000, RKey: m.RKey(), FlushLength: 4096 + 100<<10,
			FlushType: FlushPersistent | FlushGlobal, Flags: qp.SendSignaled})
	wcs := waitWC(t, a.scq, 2)
	checkWC(t, wcs[0], cq.WC{WRID: 2, Opcode: OpAtomicWrite, ByteLen: 8})
	checkWC(t, wcs[1], cq.WC{WRID: 3, Opcode: OpFlush, ByteLen: 4096 + 100<<10})
	if cp.bytes != 4096+100<<10 {
		t.Fatalf("Persister saw %d bytes, want the range's %d", cp.bytes, 4096+100<<10)
	}
	disk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "file after FLUSH", disk[4096:4096+100<<10], a.buf[:100<<10])
	if !bytes.Equal(disk[8:16], []byte("8 bytes!")) {
		t.Fatalf("ATOMIC WRITE word in the file: %q", disk[8:16])
	}
}

// TestFileMemoryVolatile: a file on tmpfs maps, but has no Persister, and a region over it
// cannot take AccessFlushPersistent (only AccessFlushGlobal).
func TestFileMemoryVolatile(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "softroce-test")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	defer os.RemoveAll(dir)
	fm, err := MapFile(filepath.Join(dir, "f"), 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	if fm.Durable() || fm.Persister() != nil || !errors.Is(fm.Persist(fm.Bytes()[:8]), ErrNotDurable) {
		t.Fatal("a tmpfs file claims to be durable")
	}
	d, _, _ := devPair(t, "mem")
	pd, _ := d.AllocPD()
	if _, err := d.RegMRWith(pd, fm.Bytes(), 0, AccessFlushPersistent|AccessLocalWrite, RegMROptions{Persist: fm.Persister()}); !errors.Is(err, mr.ErrInvalidArg) {
		t.Fatalf("persistent region on tmpfs: %v", err)
	}
	m, err := d.RegMRWith(pd, fm.Bytes(), 0, AccessFlushGlobal|AccessLocalWrite, RegMROptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.Dereg()
	if _, err := MapFile(filepath.Join(dir, "g"), 0); err == nil {
		t.Fatal("zero-length mapping")
	}
}
