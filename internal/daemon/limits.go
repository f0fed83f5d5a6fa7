package daemon

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
)

// Limits bound what the clients of one user hold in the daemon at a time, summed over every
// connection of that user. The user is the uid the kernel reports for the connection's peer
// (SO_PEERCRED), so a program cannot escape its limits by opening more connections. Over a
// limit, a request fails with proto.ErrQuota naming the limit (the connection itself, for
// Conns: the first request is answered with the error and the connection closed), and the
// refusal is counted (proto.Debug.Refused, softroce_daemon_refused_total).
//
// A zero field takes its default (DefaultLimits); a negative one means no limit. The device's
// own limits (max_qp, max_mr, ...) apply on top, shared by everyone.
type Limits struct {
	// Conns: connections (each holds FDs: its socket and the post ring's two eventfds).
	Conns int `json:"conns,omitempty"`
	// FDs: file descriptors the daemon keeps open for the user: 3 per connection, 2 per CQ
	// (its notify and space eventfds).
	FDs int `json:"fds,omitempty"`
	// PDs, MRs, CQs, SRQs, QPs, CMIDs (rdma_cm IDs the user creates; the IDs of incoming
	// connection requests are counted once the user took them, but never refused): objects.
	// MRs counts memory windows too: each holds one key of the device's key table, as an MR.
	PDs   int `json:"pds,omitempty"`
	MRs   int `json:"mrs,omitempty"`
	CQs   int `json:"cqs,omitempty"`
	SRQs  int `json:"srqs,omitempty"`
	QPs   int `json:"qps,omitempty"`
	CMIDs int `json:"cm_ids,omitempty"`
	// MappedBytes: bytes of the daemon's address space mapping the user's memory: registered
	// memory (page-rounded) and the completion and post rings.
	MappedBytes int64 `json:"mapped_bytes,omitempty"`
	// Mappings: the daemon's memory mappings for the user (one per MR, completion ring and
	// post ring); the kernel allows a process vm.max_map_count of them.
	Mappings int `json:"mappings,omitempty"`
	// EngineBytes: memory the daemon allocates for the user's objects: CQ rings (the engine's
	// and the shared one), QP work queues (qp.Footprint: sized by the QP's caps), SRQs
	// (qp.SRQFootprint) and post rings.
	EngineBytes int64 `json:"engine_bytes,omitempty"`
	// InFlight: RC request packets (PSNs) the user's QPs together may have sent and not yet
	// seen acknowledged (qp.Budget), on top of each QP's own window of 128: a user with more
	// QPs does not keep more data in flight, so a shared link or peer is divided between
	// users, not QPs ("Fair service" in docs/daemon.md). Never refused: a QP over it waits
	// for ACKs, and a QP always keeps an eighth of it in flight. Not a daemon-wide ceiling.
	InFlight int `json:"inflight,omitempty"`
}

// res names one limited resource (an index into usage).
type res int

const (
	resConns res = iota
	resFDs
	resPDs
	resMRs
	resCQs
	resSRQs
	resQPs
	resCMIDs
	resMappedBytes
	resMappings
	resEngineBytes
	nRes
)

// resNames are the resources' names in errors, metrics and the config file.
var resNames = [nRes]string{"conns", "fds", "pds", "mrs", "cqs", "srqs", "qps", "cm_ids", "mapped_bytes", "mappings", "engine_bytes"}

// usage is an amount of every resource (a holding, a cost, or limits with -1 = none).
type usage [nRes]int64

// vector returns l as a usage: each field, or def's where l's is zero, -1 for none.
func (l Limits) vector(def Limits) usage {
	return usage{
		resConns: pick(int64(l.Conns), int64(def.Conns)), resFDs: pick(int64(l.FDs), int64(def.FDs)),
		resPDs: pick(int64(l.PDs), int64(def.PDs)), resMRs: pick(int64(l.MRs), int64(def.MRs)),
		resCQs: pick(int64(l.CQs), int64(def.CQs)), resSRQs: pick(int64(l.SRQs), int64(def.SRQs)),
		resQPs: pick(int64(l.QPs), int64(def.QPs)), resCMIDs: pick(int64(l.CMIDs), int64(def.CMIDs)),
		resMappedBytes: pick(l.MappedBytes, def.MappedBytes), resMappings: pick(int64(l.Mappings), int64(def.Mappings)),
		resEngineBytes: pick(l.EngineBytes, def.EngineBytes),
	}
}

// pick is one limit's effective value: v as set, d (the default) for 0, -1 (none) for a
// negative v.
func pick(v, d int64) int64 {
	if v == 0 {
		v = d
	}
	if v < 0 {
		return -1
	}
	return v
}

// proto converts a usage to its wire form.
func (u usage) proto() proto.Usage {
	return proto.Usage{Conns: u[resConns], FDs: u[resFDs], PDs: u[resPDs], MRs: u[resMRs], CQs: u[resCQs],
		SRQs: u[resSRQs], QPs: u[resQPs], CMIDs: u[resCMIDs], MappedBytes: u[resMappedBytes],
		Mappings: u[resMappings], EngineBytes: u[resEngineBytes]}
}

// DefaultLimits are the per-user limits the daemon applies unless told otherwise, sized for
// this host: generous for programs that use RDMA as intended (perftest, rdma_cm servers, a
// few thousand QPs), small enough that one user cannot take the daemon's descriptors,
// address space, mapping count or memory from the others.
//
//	conns 64, fds 2048, pds 1024, mrs 4096, cqs 1024, srqs 256, qps 4096, cm_ids 4096,
//	mapped_bytes a quarter of the host's memory (at least 1 GiB), mappings 8192,
//	engine_bytes an eighth of the host's memory (at least 512 MiB), inflight 128 (one QP's window)
func DefaultLimits() Limits {
	mem := hostMemory()
	return Limits{Conns: 64, FDs: 2048, PDs: 1024, MRs: 4096, CQs: 1024, SRQs: 256, QPs: 4096, CMIDs: 4096,
		MappedBytes: max(mem/4, 1<<30), Mappings: 8192, EngineBytes: max(mem/8, 512<<20), InFlight: qp.MaxUnackedPSNs}
}

// DefaultCeiling is the daemon-wide limit over all users together, for the resources the
// daemon's process as a whole runs out of: descriptors (the soft RLIMIT_NOFILE less 256 for
// the device's own sockets), mappings (half of vm.max_map_count: the Go runtime needs the
// rest, and it aborts when it cannot map), address space (32 TiB of the 128 TiB a process
// has) and memory (half of the host's). Other resources have no daemon-wide ceiling.
func DefaultCeiling() Limits {
	c := Limits{Conns: -1, FDs: -1, PDs: -1, MRs: -1, CQs: -1, SRQs: -1, QPs: -1, CMIDs: -1,
		MappedBytes: 32 << 40, Mappings: 32768, EngineBytes: max(hostMemory()/2, 1<<30)}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur > 512 && rl.Cur < 1<<30 {
		c.FDs = int(rl.Cur) - 256
	}
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 2048 {
			c.Mappings = n / 2
		}
	}
	return c
}

// hostMemory is the host's physical memory in bytes (4 GiB if unknown).
func hostMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil || si.Totalram == 0 {
		return 4 << 30
	}
	return int64(si.Totalram) * int64(max(si.Unit, 1))
}

// tenant is one user's account: what its clients hold together.
type tenant struct {
	uid    uint32
	used   usage
	refs   int        // sessions of the user (user, leave)
	budget *qp.Budget // the in-flight budget of the user's QPs (Limits.InFlight; nil: none)
}

// accounts charges the users' holdings against the per-user limits and the daemon-wide
// ceiling; every create charges its cost first and every release gives it back.
type accounts struct {
	mu      sync.Mutex
	limit   usage // per user (-1 = none)
	ceiling usage // over all users (-1 = none)
	total   usage
	users   map[uint32]*tenant
	refused [nRes]atomic.Uint64
	// inflight is each user's in-flight budget in PSNs (0: none)
	inflight int
}

func newAccounts(limit, ceiling Limits) *accounts {
	return &accounts{limit: limit.vector(DefaultLimits()), ceiling: ceiling.vector(DefaultCeiling()), users: map[uint32]*tenant{},
		inflight: int(max(pick(int64(limit.InFlight), int64(DefaultLimits().InFlight)), 0))}
}

// user returns uid's account for a new session (leave gives it back).
func (a *accounts) user(uid uint32) *tenant {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.users[uid]
	if t == nil {
		t = &tenant{uid: uid}
		if a.inflight > 0 {
			t.budget = qp.NewBudget(a.inflight)
		}
		a.users[uid] = t
	}
	t.refs++
	return t
}

// leave ends a session's use of t; an account with no session and nothing held is dropped.
// (One whose session leaked an MR keeps it charged.)
func (a *accounts) leave(t *tenant) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t.refs--
	if t.refs == 0 && t.used == (usage{}) {
		delete(a.users, t.uid)
	}
}

// charge adds cost to t's holdings, or refuses it (proto.ErrQuota) if any resource would go
// over the user's limit or the daemon-wide ceiling. force charges without refusing.
func (a *accounts) charge(t *tenant, cost usage, force bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !force {
		for r := res(0); r < nRes; r++ {
			c := cost[r]
			if c <= 0 {
				continue
			}
			if l := a.limit[r]; l >= 0 && t.used[r]+c > l {
				a.refused[r].Add(1)
				return fmt.Errorf("%w: user %d: %s: holds %d, asks %d more, limit %d", proto.ErrQuota, t.uid, resNames[r], t.used[r], c, l)
			}
			if l := a.ceiling[r]; l >= 0 && a.total[r]+c > l {
				a.refused[r].Add(1)
				return fmt.Errorf("%w: daemon-wide %s: %d held by all users, asks %d more, limit %d", proto.ErrQuota, resNames[r], a.total[r], c, l)
			}
		}
	}
	for r := range cost {
		t.used[r] += cost[r]
		a.total[r] += cost[r]
	}
	return nil
}

// release gives cost back (it was charged).
func (a *accounts) release(t *tenant, cost usage) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for r := range cost {
		t.used[r] -= cost[r]
		a.total[r] -= cost[r]
	}
	if t.refs == 0 && t.used == (usage{}) && a.users[t.uid] == t {
		delete(a.users, t.uid)
	}
}

// usedBy returns t's holdings.
func (a *accounts) usedBy(t *tenant) usage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return t.used
}

// refusals returns the refusal counts per resource.
func (a *accounts) refusals() usage {
	var u usage
	for r := range u {
		u[r] = int64(a.refused[r].Load())
	}
	return u
}

// one is the cost of one object of kind r.
// plus is u and v added.
func (u usage) plus(v usage) usage {
	for i := range u {
		u[i] += v[i]
	}
	return u
}

func one(r res) usage {
	var u usage
	u[r] = 1
	return u
}

// Set sets the limit named name (a resource name: conns, fds, pds, mrs, cqs, srqs, qps,
// cm_ids, mapped_bytes, mappings, engine_bytes) from value: a count, optionally with a
// binary suffix K, M, G or T (1K = 1024), or "none" (no limit).
func (l *Limits) Set(name, value string) error {
	var v int64
	if value == "none" {
		v = -1
	} else {
		mul := int64(1)
		if n := len(value); n > 0 {
			switch value[n-1] {
			case 'K', 'k':
				mul = 1 << 10
			case 'M', 'm':
				mul = 1 << 20
			case 'G', 'g':
				mul = 1 << 30
			case 'T', 't':
				mul = 1 << 40
			}
			if mul > 1 {
				value = value[:n-1]
			}
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n <= 0 || n > (1<<62)/mul {
			return fmt.Errorf("limit %s: %q is not a positive count (or none)", name, value)
		}
		v = n * mul
	}
	ints := map[string]*int{"conns": &l.Conns, "fds": &l.FDs, "pds": &l.PDs, "mrs": &l.MRs, "cqs": &l.CQs,
		"srqs": &l.SRQs, "qps": &l.QPs, "cm_ids": &l.CMIDs, "mappings": &l.Mappings, "inflight": &l.InFlight}
	if p, ok := ints[name]; ok {
		if v > 1<<31-1 {
			return fmt.Errorf("limit %s: %d is too large", name, v)
		}
		*p = int(v)
		return nil
	}
	switch name {
	case "mapped_bytes":
		l.MappedBytes = v
	case "engine_bytes":
		l.EngineBytes = v
	default:
		return fmt.Errorf("unknown limit %q (one of %s, inflight)", name, strings.Join(resNames[:], ", "))
	}
	return nil
}
