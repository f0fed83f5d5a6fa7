// Package conformlab runs the conformance bench (pkg/conform) against kernel rxe in the
// lab VM (test/rxelab): it builds the C DUT agent (test/conform/agent) on the host, copies
// it into the lab share, starts it in the guest on rxe0, and connects the bench to it
// from the lab netns (bench socket 198.18.0.1:4791, DUT 198.18.0.2:4791).
package conformlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/rocetest"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/conform"
	"github.com/softroce/softroce/test/rxelab"
)

// AgentPort is the TCP port the guest agent listens on.
const AgentPort = 7471

// AgentName is the agent binary's name in the lab share (/mnt/host in the guest).
const AgentName = "softroce-dut"

// Dir returns test/conform (the directory of this file).
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "test/conform"
	}
	return filepath.Dir(file)
}

// ShareDir is the host folder the lab mounts at /mnt/host ($RXE_LAB_SHARE, else the lab
// cache's share/: rxelab.CacheDir, test/rxelab/lib.sh).
func ShareDir() string {
	if s := os.Getenv("RXE_LAB_SHARE"); s != "" {
		return s
	}
	return filepath.Join(rxelab.CacheDir(), "share")
}

// BuildAgent compiles the C agent into the lab share (gcc + libibverbs-dev on the host;
// the guest's initramfs has the same Debian libibverbs and the rxe provider).
func BuildAgent(ctx context.Context) (string, error) {
	out := filepath.Join(ShareDir(), AgentName)
	if err := os.MkdirAll(ShareDir(), 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(Dir(), "agent", "build"), out+".tmp")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("conformlab: build agent: %w: %s", err, b)
	}
	return out, os.Rename(out+".tmp", out)
}

// Rxe is a bench facing kernel rxe through the guest agent.
type Rxe struct {
	Bench *conform.Bench
	job   *rxelab.Job
}

// OpenRxe builds and starts the agent in the guest and connects the bench to it.
func OpenRxe(ctx context.Context, lab *rxelab.Lab) (*Rxe, error) {
	if _, err := BuildAgent(ctx); err != nil {
		return nil, err
	}
	job, err := lab.ExecBG(ctx, fmt.Sprintf("exec /mnt/host/%s -d %s -g %d -p %d", AgentName, rxelab.GuestDev, rxelab.GuestGIDIndex, AgentPort),
		rxelab.ExecOptions{Timeout: 15 * time.Minute})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Rxe, error) {
		_ = job.Kill()
		out, _, _ := job.Wait(context.Background())
		return nil, fmt.Errorf("%w (agent output: %s)", err, out)
	}
	addr := net.JoinHostPort(rxelab.GuestIP, strconv.Itoa(AgentPort))
	var conn net.Conn
	deadline := time.Now().Add(60 * time.Second)
	for {
		err = lab.InNetns(func() error {
			var err error
			conn, err = (&net.Dialer{Timeout: 2 * time.Second}).Dial("tcp4", addr)
			return err
		})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("conformlab: connect to the agent at %s: %w", addr, err))
		}
		select { // the agent starts asynchronously in the guest
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	cl, err := conform.NewClient(conn, conform.ClientOptions{Name: "rxe", RoCE: netip.AddrPortFrom(netip.MustParseAddr(rxelab.GuestIP), bth.UDPPort)})
	if err != nil {
		return fail(err)
	}
	var peer *rocetest.Peer
	if err := lab.InNetns(func() error {
		var err error
		peer, err = rocetest.ListenPeer(rocetest.PeerOptions{Local: netip.AddrPortFrom(netip.MustParseAddr(rxelab.HostIP), bth.UDPPort)})
		return err
	}); err != nil {
		cl.Close()
		return fail(err)
	}
	b := &conform.Bench{DUT: cl, Peer: peer, Rxe: true, Reply: 3 * time.Second, Quiet: 400 * time.Millisecond}
	if caps, ok := DeviceCaps(ctx, lab); ok {
		b.DevCaps = &caps
	}
	return &Rxe{Bench: b, job: job}, nil
}

var capFlagsExRe = regexp.MustCompile(`device_cap_flags_ex:\s*0x([0-9A-Fa-f]+)`)

// DeviceCaps reads rxe0's device_cap_flags_ex in the guest (ibv_devinfo -v), for the
// scenarios that need a capability (conform.Scenario.Needs); false if it cannot be read.
func DeviceCaps(ctx context.Context, lab *rxelab.Lab) (uint64, bool) {
	out, st, err := lab.Exec(ctx, "ibv_devinfo -v -d "+rxelab.GuestDev, rxelab.ExecOptions{Timeout: 30 * time.Second})
	if err != nil || st != 0 {
		return 0, false
	}
	m := capFlagsExRe.FindSubmatch(out)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseUint(string(m[1]), 16, 64)
	return v, err == nil
}

// Close ends the agent (BYE), waits for it and closes the bench socket; it returns the
// agent's output.
func (r *Rxe) Close() (string, error) {
	err := r.Bench.Close()
	out, st, werr := r.job.Wait(context.Background())
	if werr == nil && st != 0 {
		werr = fmt.Errorf("conformlab: agent exit status %d", st)
	}
	return string(out), errors.Join(err, werr)
}

// LockLab takes the lab lock scripts/interop takes (rxelab.LockPath, flock; machine-wide,
// whatever the cache or target), waiting up to wait, so a run does not kill a VM another
// user is running (the script starts with `vm stop`). The returned func releases it. The
// descriptor is close-on-exec, so the VM and its watchdog do not inherit the lock.
func LockLab(wait time.Duration, waiting func()) (func(), error) {
	lock := rxelab.LockPath()
	if err := os.MkdirAll(filepath.Dir(lock), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("conformlab: lab lock %s: %w", f.Name(), err)
		}
		if !told && waiting != nil {
			waiting()
			told = true
		}
		time.Sleep(500 * time.Millisecond) // polling another process's lock; not a test
	}
}
