// Package rxelab drives the kernel-rxe lab (test/rxelab/setup, test/rxelab/vm) from Go
// interop tests: it boots the QEMU guest that runs Linux's rdma_rxe, runs guest jobs through
// the vm script, and creates host sockets inside the lab's network namespace "rxelab"
// (where the tap 198.18.0.1/24 and 2001:db8:198:18::1/64 faces the guest's 198.18.0.2 and
// 2001:db8:198:18::2).
//
// Netns choice: the test binary itself runs in the host's normal namespace (so plain
// `go test -tags interop ./test/interop/...` works and the Go build cache is shared);
// the harness enters the lab netns only to create sockets, with setns(2) on a locked OS
// thread (see Lab.InNetns). A socket keeps the namespace it was created in, so the
// resulting net.Conn can be used from any goroutine afterwards. Host programs (tcpdump)
// run through `ip netns exec` (Lab.NSCommand).
//
// Cleanup guarantee, in layers: Main stops the VM after m.Run, on panic in the TestMain
// goroutine, on SIGINT/SIGTERM/SIGHUP, and shortly before the -test.timeout deadline;
// every boot arms the vm script's detached max-life watchdog (kills that qemu and removes
// the netns even if this process is SIGKILLed); scripts/interop traps EXIT and runs
// `vm stop`, then fails if a qemu process, the tap or the netns is left.
//
// Only one VM can run at a time (fixed netns, tap and addresses): run the interop
// packages with `go test -p 1`.
package rxelab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Fixed lab addressing (test/rxelab/lib.sh).
const (
	// Netns is the host network namespace holding the tap.
	Netns = "rxelab"
	// Tap is the host side of the guest's eth0.
	Tap = "rxetap0"
	// HostIP is the tap's address (our side).
	HostIP = "198.18.0.1"
	// GuestIP is the guest eth0 address (kernel rxe0's RoCEv2 GID ::ffff:GuestIP, index 1).
	GuestIP = "198.18.0.2"
	// GuestDev is the kernel rxe device in the guest.
	GuestDev = "rxe0"
	// GuestGIDIndex is the index of the IPv4 RoCEv2 GID on GuestDev.
	GuestGIDIndex = 1
	// HostIP6 is the tap's IPv6 address (added without duplicate address detection).
	HostIP6 = "2001:db8:198:18::1"
	// GuestIP6 is the guest eth0's IPv6 address (kernel rxe0's RoCEv2 GID, index 2).
	GuestIP6 = "2001:db8:198:18::2"
	// GuestGIDIndex6 is the index of the IPv6 RoCEv2 GID on GuestDev (after the link-local
	// GID 0 and the IPv4 one: ib_core adds a netdev's IPv4 addresses before its IPv6 ones).
	GuestGIDIndex6 = 2
	// HostLinkLocal is the tap's link-local address (its fixed MAC 52:54:00:18:00:01).
	HostLinkLocal = "fe80::5054:ff:fe18:1"
	// GuestLinkLocal is eth0's link-local address, kernel rxe0's GID 0 (MAC 52:54:00:18:00:02).
	GuestLinkLocal = "fe80::5054:ff:fe18:2"
)

// Exit statuses the vm script uses for jobs.
const (
	// ExitTimeout is returned by a job killed by its --timeout.
	ExitTimeout = 124
	// ExitLab means the VM or the lab failed (not the job).
	ExitLab = 255
)

// Options configure Start.
type Options struct {
	// Dir is the lab directory holding setup and vm. Empty: $RXE_LAB_DIR, else the
	// directory of this source file (works from a clone).
	Dir string
	// MaxLife arms the vm script's detached watchdog: qemu is killed after this long no
	// matter what happens to the test process. Zero means 15 minutes.
	MaxLife time.Duration
	// BootTimeout bounds the guest boot. Zero means 300 s.
	BootTimeout time.Duration
	// Share is the host folder mounted at /mnt/host in the guest (default: the lab's).
	Share string
	// Dual also builds the guest-only rxe1 <-> rxe2 topology (vm --dual).
	Dual bool
	// Attach uses a VM that is already running (booted by scripts/interop) and leaves it
	// running on Stop. If none is running, Start boots one and Stop stops it.
	Attach bool
	// Log receives the vm script's own messages (boot time, ...). Nil: os.Stderr.
	Log io.Writer
}

// Lab is a running lab VM.
type Lab struct {
	dir   string
	vm    string
	owned bool // we booted it: Stop powers it off
	log   io.Writer

	stopOnce sync.Once
	stopErr  error
	// BootTime is how long `vm start` took (0 when attached to a running VM).
	BootTime time.Duration
}

// DefaultDir returns the lab directory: $RXE_LAB_DIR or the directory of this package.
func DefaultDir() string {
	if d := os.Getenv("RXE_LAB_DIR"); d != "" {
		return d
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "test/rxelab"
	}
	return filepath.Dir(file)
}

// Home is the default lab cache; it holds the machine-wide lock whatever the cache or target.
const Home = "/var/cache/rxe-lab"

// CacheDir returns the lab cache as test/rxelab/lib.sh computes it: $RXE_LAB_CACHE, else
// Home, or Home-<series> for a second guest kernel ($RXE_LAB_TARGET, e.g. 6.12).
func CacheDir() string {
	if c := os.Getenv("RXE_LAB_CACHE"); c != "" {
		return c
	}
	if t := os.Getenv("RXE_LAB_TARGET"); t != "" {
		return Home + "-" + t
	}
	return Home
}

// LockPath returns the machine-wide lab lock scripts/interop flocks: $RXE_LAB_LOCK, else
// Home/interop.lock. One lab VM runs at a time (fixed netns, tap and addresses), whichever
// cache or target it boots, so the lock does not follow RXE_LAB_CACHE.
func LockPath() string {
	if l := os.Getenv("RXE_LAB_LOCK"); l != "" {
		return l
	}
	return filepath.Join(Home, "interop.lock")
}

// Running reports whether the lab VM is up (vm status).
func Running(dir string) bool {
	if dir == "" {
		dir = DefaultDir()
	}
	return exec.Command(filepath.Join(dir, "vm"), "status").Run() == nil
}

// Start boots the VM (or attaches to a running one, see Options.Attach). The caller must
// call Stop; Main does it for test binaries.
func Start(ctx context.Context, o Options) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("rxelab: the lab needs root (qemu, tap, netns)")
	}
	l := &Lab{dir: o.Dir, log: o.Log}
	if l.dir == "" {
		l.dir = DefaultDir()
	}
	if l.log == nil {
		l.log = os.Stderr
	}
	l.vm = filepath.Join(l.dir, "vm")
	if _, err := os.Stat(l.vm); err != nil {
		return nil, fmt.Errorf("rxelab: lab script: %w", err)
	}
	if o.Attach && Running(l.dir) {
		fmt.Fprintf(l.log, "[rxelab] attached to the running VM (left running)\n")
		return l, nil
	}
	maxLife := o.MaxLife
	if maxLife <= 0 {
		maxLife = 15 * time.Minute
	}
	boot := o.BootTimeout
	if boot <= 0 {
		boot = 300 * time.Second
	}
	args := []string{"start", "--boot-timeout", secs(boot), "--max-life", secs(maxLife)}
	if o.Share != "" {
		args = append(args, "--share", o.Share)
	}
	if o.Dual {
		args = append(args, "--dual")
	}
	// The VM is ours from here on, even if start fails half-way (Stop cleans up).
	l.owned = true
	ctx, cancel := context.WithTimeout(ctx, boot+30*time.Second)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, l.vm, args...)
	cmd.Stdout, cmd.Stderr = l.log, l.log
	if err := cmd.Run(); err != nil {
		_ = l.Stop()
		return nil, fmt.Errorf("rxelab: vm start: %w", err)
	}
	l.BootTime = time.Since(t0)
	return l, nil
}

func secs(d time.Duration) string { return strconv.Itoa(int((d + time.Second - 1) / time.Second)) }

// Stop powers the VM off and removes the netns and tap (vm stop), unless the lab was
// attached to a VM someone else booted. Safe to call more than once.
func (l *Lab) Stop() error {
	l.stopOnce.Do(func() {
		if !l.owned {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, l.vm, "stop")
		cmd.Stdout, cmd.Stderr = l.log, l.log
		l.stopErr = cmd.Run()
	})
	return l.stopErr
}

// Dir returns the lab directory.
func (l *Lab) Dir() string { return l.dir }

// ExecOptions configure a guest job.
type ExecOptions struct {
	// Timeout kills the job in the guest after this long (vm --timeout). Zero: 120 s.
	Timeout time.Duration
	// Env is extra environment for the job, "K=V" each.
	Env []string
}

func (o *ExecOptions) args() []string {
	t := o.Timeout
	if t <= 0 {
		t = 120 * time.Second
	}
	a := []string{"--timeout", secs(t)}
	for _, kv := range o.Env {
		a = append(a, "--env", kv)
	}
	return a
}

// Exec runs a shell command (bash) in the guest and returns its combined output and exit
// status. err is non-nil only when the job could not be run or waited for (status 255 =
// lab failure is reported as an error too).
func (l *Lab) Exec(ctx context.Context, script string, o ExecOptions) (out []byte, status int, err error) {
	args := append([]string{"exec"}, o.args()...)
	args = append(args, "-c", script)
	return l.runVM(ctx, o.Timeout, args...)
}

// runVM runs the vm script, returning stdout and its exit status.
func (l *Lab) runVM(ctx context.Context, jobTimeout time.Duration, args ...string) ([]byte, int, error) {
	if jobTimeout <= 0 {
		jobTimeout = 120 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, jobTimeout+30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, l.vm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.Bytes(), 0, nil
	case errors.As(err, &ee) && ctx.Err() == nil:
		st := ee.ExitCode()
		if st == ExitLab {
			return stdout.Bytes(), st, fmt.Errorf("rxelab: vm %s: lab failure: %s", args[0], strings.TrimSpace(stderr.String()))
		}
		return stdout.Bytes(), st, nil
	default:
		return stdout.Bytes(), -1, fmt.Errorf("rxelab: vm %s: %w (%s)", args[0], err, strings.TrimSpace(stderr.String()))
	}
}

// Job is a background guest job (ExecBG).
type Job struct {
	lab *Lab
	// ID is the vm script's job id.
	ID      string
	timeout time.Duration
}

// ExecBG starts a shell command in the guest in the background. The job is killed in the
// guest when its Timeout expires even if nobody waits for it.
func (l *Lab) ExecBG(ctx context.Context, script string, o ExecOptions) (*Job, error) {
	args := append([]string{"exec", "--bg"}, o.args()...)
	// The guest agent enforces no timeout by itself: wrap the job in GNU timeout.
	t := o.Timeout
	if t <= 0 {
		t = 120 * time.Second
	}
	args = append(args, "-c", fmt.Sprintf("exec timeout -k 3 %s bash -c %s", secs(t), shQuote(script)))
	out, st, err := l.runVM(ctx, 10*time.Second, args...)
	if err != nil {
		return nil, err
	}
	id := strings.TrimSpace(string(out))
	if st != 0 || id == "" {
		return nil, fmt.Errorf("rxelab: vm exec --bg: status %d, output %q", st, out)
	}
	return &Job{lab: l, ID: id, timeout: t}, nil
}

// Wait waits for the job to end and returns its whole output and exit status
// (ExitTimeout if it was killed by its timeout).
func (j *Job) Wait(ctx context.Context) (out []byte, status int, err error) {
	return j.lab.runVM(ctx, j.timeout+5*time.Second, "wait", "--timeout", secs(j.timeout+5*time.Second), j.ID)
}

// Kill asks the guest to SIGTERM the job's process group (SIGKILL 3 s later).
func (j *Job) Kill() error {
	_, _, err := j.lab.runVM(context.Background(), 10*time.Second, "kill", j.ID)
	return err
}

// Log returns the job's output so far.
func (j *Job) Log() ([]byte, error) {
	out, _, err := j.lab.runVM(context.Background(), 10*time.Second, "log", j.ID)
	return out, err
}

// NSCommand returns a command that runs a host program inside the lab netns
// (ip netns exec rxelab ...).
// The program is killed (SIGKILL) when the test process ends, whatever the way: a test that
// fails or panics in the middle leaves no host process behind (test/rxelab/leftover-check).
func (l *Lab) NSCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", Netns, name}, args...)...)
	cmd.SysProcAttr = dieWithParent()
	return cmd
}

// dieWithParent makes a child get SIGKILL when the process that started it ends (the
// parent-death signal survives the exec of `ip netns exec`, which execs its program; it is
// delivered when the starting OS thread ends, and Go does not end a thread except a
// goroutine's locked one, which no command is started from here).
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// InNetns runs fn on a locked OS thread that has entered the lab netns, then returns the
// thread to its original namespace. Sockets fn creates stay in the lab netns for their
// whole life and may be used from any goroutine afterwards. fn must create its sockets
// itself, synchronously (not in goroutines it starts: those run on other threads).
func (l *Lab) InNetns(fn func() error) error {
	return InNetns("/run/netns/"+Netns, fn)
}

// InNetns runs fn with the calling goroutine's OS thread in the network namespace at path
// (see Lab.InNetns). If the thread cannot be switched back, it stays locked so the Go
// runtime discards it when the goroutine ends.
func InNetns(path string, fn func() error) (err error) {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rxelab: open netns %s: %w", path, err)
	}
	defer unix.Close(target)
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("rxelab: open own netns: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("rxelab: setns %s: %w", path, err)
	}
	defer func() {
		if e := unix.Setns(orig, unix.CLONE_NEWNET); e != nil {
			// keep the thread locked: it dies with this goroutine
			if err == nil {
				err = fmt.Errorf("rxelab: setns back: %w", e)
			}
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// shQuote quotes s for bash.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Capture is a tcpdump running on the tap inside the lab netns (Lab.Tcpdump).
type Capture struct {
	// Path is the pcap file.
	Path string
	cmd  *exec.Cmd
	done chan error
	errb *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Tcpdump starts `tcpdump -i rxetap0 -U --immediate-mode -w path FILTER...` in the lab
// netns and returns once it is capturing (bounded by ctx).
func (l *Lab) Tcpdump(ctx context.Context, path string, filter ...string) (*Capture, error) {
	args := append([]string{"-Z", "root", "-n", "-U", "--immediate-mode", "-i", Tap, "-w", path}, filter...)
	c := &Capture{Path: path, done: make(chan error, 1), errb: &lockedBuffer{}}
	c.cmd = exec.Command("ip", append([]string{"netns", "exec", Netns, "tcpdump"}, args...)...)
	c.cmd.SysProcAttr = dieWithParent()
	c.cmd.Stderr = c.errb
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("rxelab: tcpdump: %w", err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(c.errb.String(), "listening on") {
		select {
		case err := <-c.done:
			c.done <- err
			return nil, fmt.Errorf("rxelab: tcpdump exited: %v: %s", err, c.errb.String())
		case <-ctx.Done():
			_ = c.Stop()
			return nil, fmt.Errorf("rxelab: tcpdump did not start: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return c, nil
}

// Stop ends the capture (SIGINT, then SIGKILL after 5 s) and waits for tcpdump.
func (c *Capture) Stop() error {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-c.done:
		c.done <- err
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return err
		}
		return nil
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		err := <-c.done
		c.done <- err
		return fmt.Errorf("rxelab: tcpdump ignored SIGINT: %v", err)
	}
}

// Stderr returns tcpdump's messages.
func (c *Capture) Stderr() string { return c.errb.String() }
