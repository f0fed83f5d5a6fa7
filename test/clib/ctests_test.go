package clib

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	daemonpkg "github.com/softroce/softroce/internal/daemon"
)

// runC runs one of the C tests (clib/tests, ASan/UBSan) against daemon d.
func runC(t *testing.T, d daemon, name string, args ...string) string {
	t.Helper()
	return runCEnv(t, d, nil, name, args...)
}

// runCEnv is runC with more environment variables.
func runCEnv(t *testing.T, d daemon, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(asanTests, name), args...)
	cmd.Env = append(append(os.Environ(), "SOFTROCE_SOCKET="+d.sock), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), " 0 failed") {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
	return string(out)
}

// TestCObjects runs clib/tests/objects.c against a daemon: queries, objects and their
// errors, zero-length SENDs through the post ring and as round trips (unsignaled ones
// counted), completion channels, the extended post and poll APIs, fork.
func TestCObjects(t *testing.T) {
	needDevice(t)
	d := startDaemon(t)
	t.Log(strings.TrimSpace(runC(t, d, "objects")))
	if n := d.srv.Debug(); n.QPs != 0 || n.CQs != 0 || n.PDs != 0 {
		t.Errorf("the daemon still holds objects: %+v", n)
	}
}

// TestCLoopback runs clib/tests/loopback.c against a daemon: two RC QPs of one context
// connected through the daemon's device, SEND/WRITE/READ/atomics/inline data checked byte
// for byte in malloc, stack, static and mmap memory, completion events, an error completion
// for a bad lkey, a fork whose child gets clean errors, EBUSY on objects in use.
func TestCLoopback(t *testing.T) {
	needMem(t)
	d := startDaemon(t)
	t.Log(strings.TrimSpace(runC(t, d, "loopback")))
}

// TestCZeroCopy runs clib/tests/zcopy.c against a daemon: whole pages of private anonymous
// memory move onto a memfd the daemon maps (contents and neighbours kept), RDMA through them,
// a single page, copied registrations inside a moved range and across its edge (the range
// moves back only after the last of them), ibv_rereg_mr of a moved MR, a fork whose child gets
// private pages, the pages moved back at deregistration; then again with
// SOFTROCE_ZERO_COPY=0, where nothing moves; then against a daemon whose mapped_bytes limit
// refuses the memfds, where the library moves the pages back and registers them as copied
// memory. The daemons hold no MR and no mapping after each.
func TestCZeroCopy(t *testing.T) {
	needMem(t)
	idle := func(d daemon) {
		t.Helper()
		if n := d.srv.Debug(); n.QPs != 0 || n.PDs != 0 || n.MRs != 0 || n.MappedBytes != 0 {
			t.Errorf("the daemon still holds objects or mappings: %+v", n)
		}
	}
	d := startDaemon(t)
	t.Log(strings.TrimSpace(runC(t, d, "zcopy")))
	t.Log(strings.TrimSpace(runCEnv(t, d, []string{"SOFTROCE_ZERO_COPY=0"}, "zcopy", "off")))
	idle(d)
	if n := d.srv.Debug(); n.Refused.MappedBytes != 0 {
		t.Errorf("refusals over mapped_bytes: %d", n.Refused.MappedBytes)
	}
	// 384 KiB: the session's rings (264 KiB) and the CQ's fit, a 256 KiB registration
	// beside them does not.
	lim := startDaemonLimited(t, daemonpkg.Limits{MappedBytes: 384 << 10})
	t.Log(strings.TrimSpace(runC(t, lim, "zcopy", "off")))
	idle(lim)
	if n := lim.srv.Debug(); n.Refused.MappedBytes == 0 {
		t.Error("the limited daemon refused no memfd: the library did not try to move the pages")
	}
}

// TestCModify runs clib/tests/modify.c against a daemon: ibv_resize_cq (refusals, the
// unpolled completions kept, a blocked waiter woken across resizes, resizes between polls of
// a stream of WRITEs), ibv_rereg_mr (libibverbs' and the daemon's refusals; access,
// translation and PD changes with the keys kept and their effect on a peer's WRITEs and
// SENDs), ibv_wr_atomic_write on a QP with no inline capacity, and ibv_wr_flush as a
// program built against rdma-core 45+ calls it.
func TestCModify(t *testing.T) { runCAlone(t, "modify") }

// TestCCQBroken runs clib/tests/cqbroken.c against a daemon: a resize whose mapping of the
// daemon's new ring fails (the test's own mmap fails it) leaves the CQ broken — a thread
// blocked on its channel woken, polls -1 with EIO, arms, extended polls and resizes EIO,
// its QP's move to RESET and its destruction fine — while another CQ of the context goes on
// and a resize the daemon refuses maps nothing and keeps the CQ's completions.
func TestCCQBroken(t *testing.T) { runCAlone(t, "cqbroken") }

// runCAlone runs the C test program prog against a daemon of its own, which holds no QP, CQ,
// PD or MR afterwards.
func runCAlone(t *testing.T, prog string) {
	needMem(t)
	d := startDaemon(t)
	t.Log(strings.TrimSpace(runC(t, d, prog)))
	if n := d.srv.Debug(); n.QPs != 0 || n.CQs != 0 || n.PDs != 0 || n.MRs != 0 {
		t.Errorf("the daemon still holds objects: %+v", n)
	}
}

// TestCRdmacm runs clib/tests/cm.c's server on one daemon and its client on another, RC, UD
// (SIDR), and RC for a QP the client's ID does not own (rdma_establish) with the ACK timeout
// option.
func TestCRdmacm(t *testing.T) {
	needDevice(t)
	a := startDaemon(t)
	b := startDaemon(t)
	for _, ps := range []string{"tcp", "udp", "ext"} {
		t.Run(ps, func(t *testing.T) {
			port := strconv.Itoa(freePort(t))
			sout, cout := pairCM(t,
				tool{name: filepath.Join(asanTests, "cm"), args: []string{"s", a.addr.String(), port, ps}, d: a},
				tool{name: filepath.Join(asanTests, "cm"), args: []string{"c", a.addr.String(), port, ps}, d: b},
				60*time.Second)
			for side, out := range map[string]string{"server": sout, "client": cout} {
				if !strings.Contains(out, " 0 failed") {
					t.Errorf("%s:\n%s", side, out)
				}
			}
		})
	}
}

// TestCRdmacmDestroyWait runs clib/tests/cm.c's destroy-wait: a thread waiting in
// rdma_get_cm_event while another destroys the channel (rping's CM thread at exit) stays
// blocked, as on the kernel's ucma, through a signal that interrupts its wait, instead of
// returning an error or touching the freed channel (under ASan).
func TestCRdmacmDestroyWait(t *testing.T) {
	needDevice(t)
	d := startDaemon(t)
	t.Log(strings.TrimSpace(runC(t, d, "cm", "destroy-wait")))
}

// TestCMemoryWindows runs clib/tests/mw.c against a daemon: type 1 windows (ibv_bind_mw) and
// type 2 (IBV_WR_BIND_MW, ibv_wr_bind_mw), remote WRITEs through them byte for byte and past
// their ends, LOCAL_INV and SEND_WITH_INV (the invalidated R_Key in the receive completion,
// through ibv_poll_cq and the ibv_cq_ex API), unbind and ibv_dealloc_mw of a bound window, each
// old R_Key then a remote access error; the daemon holds no window afterwards.
func TestCMemoryWindows(t *testing.T) {
	needMem(t)
	d := startDaemon(t)
	t.Log(strings.TrimSpace(runC(t, d, "mw")))
	if n := d.srv.Debug(); n.QPs != 0 || n.MRs != 0 || n.PDs != 0 {
		t.Errorf("the daemon still holds objects: %+v", n)
	}
	// Windows are not in Debug: the mws gauge counts them.
	var m bytes.Buffer
	if err := d.srv.WriteMetrics(&m); err != nil {
		t.Fatal(err)
	}
	if g := regexp.MustCompile(`(?m)^softroce_daemon_mws\{[^}]*\} (\d+)$`).FindSubmatch(m.Bytes()); g == nil || string(g[1]) != "0" {
		t.Errorf("the daemon's memory windows afterwards: %q, want 0", g)
	}
}
