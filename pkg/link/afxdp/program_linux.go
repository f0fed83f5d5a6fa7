package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The XDP programs of xdp.c, loaded with cilium/ebpf from the objects bpf2go generated
// (gen.go): the link's constants are set in the programs' read-only data before the load (the
// verifier then knows them), the XSKMAP is sized for the socket's queue, and the write
// responder's maps are the xdpWrite's own (write_linux.go).

// xdpConsts are the programs' load-time constants (xdp.c's volatile const globals).
type xdpConsts struct {
	addr     [4]byte // the link's address
	port     uint16  // and port
	noSocket uint32  // the verdict when the queue has no socket: XDP_PASS (tests choose another)
}

// xdpSpec returns the programs' spec with c's constants set.
func xdpSpec(c xdpConsts) (*ebpf.CollectionSpec, error) {
	spec, err := loadXdp()
	if err != nil {
		return nil, err
	}
	// packet loads are in the host's byte order: the wire bytes read so
	ne := binary.NativeEndian
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], c.port)
	for name, v := range map[string]any{
		xdpVarLocalAddr: ne.Uint32(c.addr[:]),
		xdpVarLocalPort: ne.Uint16(port[:]),
		xdpVarMaxFrame:  uint32(MaxFrame),
		xdpVarNoSocket:  c.noSocket,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("XDP program: %s: %w", name, err)
		}
	}
	return spec, nil
}

// xdpLoaded is a loaded program and its XSKMAP; redirectObjs and writeObjs name the objects
// of each program (LoadAndAssign loads those and what they use, nothing else).
type xdpLoaded struct {
	Prog *ebpf.Program
	Xsks *ebpf.Map
}

type redirectObjs struct {
	Prog *ebpf.Program `ebpf:"xsk_redirect"`
	Xsks *ebpf.Map     `ebpf:"xsks"`
}

type writeObjs struct {
	Prog *ebpf.Program `ebpf:"xsk_write"`
	Xsks *ebpf.Map     `ebpf:"xsks"`
}

// Close closes the program and the map.
func (l xdpLoaded) Close() {
	if l.Prog != nil {
		l.Prog.Close()
	}
	if l.Xsks != nil {
		l.Xsks.Close()
	}
}

// loadXDP loads the redirect program, or with w the write responder's over w's maps, with an
// XSKMAP for queues 0..queue; frags: a program that accepts multi-buffer frames (a driver hook
// with a large MTU requires one). A refusal carries the end of the verifier's log.
func loadXDP(c xdpConsts, queue uint32, w *xdpWrite, frags bool) (xdpLoaded, error) {
	spec, err := xdpSpec(c)
	if err != nil {
		return xdpLoaded{}, err
	}
	spec.Maps[xdpMapXsks].MaxEntries = queue + 1
	name := xdpProgXskRedirect
	var opts ebpf.CollectionOptions
	if w != nil {
		name = xdpProgXskWrite
		spec.Maps[xdpMapMem].MaxEntries = w.mem.MaxEntries() // as created
		opts.MapReplacements = map[string]*ebpf.Map{xdpMapQps: w.qps, xdpMapMrs: w.mrs, xdpMapCrc: w.crc, xdpMapMem: w.mem}
	}
	if frags {
		spec.Programs[name].Flags |= unix.BPF_F_XDP_HAS_FRAGS
	}
	var l xdpLoaded
	if w == nil {
		var o redirectObjs
		err = spec.LoadAndAssign(&o, &opts)
		l = xdpLoaded(o)
	} else {
		var o writeObjs
		err = spec.LoadAndAssign(&o, &opts)
		l = xdpLoaded(o)
	}
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return xdpLoaded{}, fmt.Errorf("load XDP program %s: %-40v", name, ve)
		}
		return xdpLoaded{}, fmt.Errorf("load XDP program %s: %w", name, err)
	}
	return l, nil
}
