package daemon_test

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/cm"
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/pkg/rdmacm"
)

// TestProtocolSession: HELLO comes first and checks magic and version; an
// unknown op, a body shorter than its struct and a message shorter than the
// header are refused with the errno the spec gives, and the session goes on.
func TestProtocolSession(t *testing.T) {
	da, _ := memPair(t)
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: da.sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &raw{t: t, c: c}
	is := func(what string, err error, sentinel error, errno syscall.Errno) {
		t.Helper()
		if !errors.Is(err, sentinel) || !errors.Is(err, errno) {
			t.Fatalf("%s: %v, want %v (%v)", what, err, sentinel, errno)
		}
	}
	is("QUERY_DEVICE before HELLO", r.call(wire.OpQueryDevice, nil, nil), proto.ErrProtocol, syscall.EPROTO)
	is("HELLO version 2", r.call(wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: 2}), nil),
		proto.ErrVersion, syscall.EPROTONOSUPPORT)
	is("HELLO byte-swapped magic", r.call(wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: 0x53525031, Version: wire.Version}), nil),
		proto.ErrVersion, syscall.EPROTONOSUPPORT)
	var h wire.HelloResp
	if err := r.call(wire.OpHello, wire.Bytes(&wire.HelloReq{Magic: wire.Magic, Version: wire.Version}), wire.Bytes(&h)); err != nil {
		t.Fatal(err)
	}
	if h.Magic != wire.Magic || h.Version != wire.Version || h.MaxMsg != wire.MaxMsg || wire.GoString(h.DevName[:]) != da.dev.Name() ||
		h.NodeGUID != da.dev.Attr().NodeGUID {
		t.Fatalf("HELLO response %+v", h)
	}
	is("unknown op", r.call(200, nil, nil), proto.ErrUnsupported, syscall.EOPNOTSUPP)
	is("short body", r.call(wire.OpQueryPort, []byte{1, 0}, nil), proto.ErrProtocol, syscall.EPROTO)
	is("short message", r.send([]byte{1, 2, 3}, nil), proto.ErrProtocol, syscall.EPROTO)
	is("bad memory source", r.call(wire.OpRegMR, wire.Bytes(&wire.RegMRReq{Source: 9}), nil), proto.ErrNoObject, syscall.EINVAL)
	if err := r.call(wire.OpDebug, nil, nil); err != nil {
		t.Fatal("the session does not go on:", err)
	}
}

// TestProtocolQueries: the device queries report the daemon's device as it is:
// attributes, port, every GID with its interface, the one P_Key, counters.
func TestProtocolQueries(t *testing.T) {
	da, _, _ := udpDaemons(t)
	r := dialRaw(t, da.sock)
	var a wire.DeviceAttr
	if err := r.call(wire.OpQueryDevice, nil, wire.Bytes(&a)); err != nil {
		t.Fatal(err)
	}
	want := da.dev.Attr()
	if got := proto.DeviceAttrFromWire(&a); got != want {
		t.Fatalf("QUERY_DEVICE %+v, want %+v", got, want)
	}
	// rxe's GUIDs on loopback (the EUI-64 of its all-zero MAC); rdma-core's suite wants them non-zero
	if a.NodeGUID != 0x020000fffe000000 || a.SysImageGUID != a.NodeGUID {
		t.Fatalf("QUERY_DEVICE node GUID %#x, sys_image_guid %#x", a.NodeGUID, a.SysImageGUID)
	}
	var p wire.PortAttr
	if err := r.call(wire.OpQueryPort, wire.Bytes(&wire.PortReq{Port: 1}), wire.Bytes(&p)); err != nil {
		t.Fatal(err)
	}
	if got := proto.PortAttrFromWire(&p); got != da.dev.PortAttr() || p.LinkLayer != 2 || p.State != 4 {
		t.Fatalf("QUERY_PORT %+v, want %+v", got, da.dev.PortAttr())
	}
	if err := r.call(wire.OpQueryPort, wire.Bytes(&wire.PortReq{Port: 2}), nil); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("port 2: %v", err)
	}
	buf := make([]byte, 64<<10)
	if err := r.call(wire.OpQueryGIDs, wire.Bytes(&wire.PortReq{Port: 1}), buf); err != nil {
		t.Fatal(err)
	}
	var gr wire.GIDsResp
	rest, _ := wire.Read(buf, &gr)
	gids := da.dev.GIDs()
	if int(gr.Count) != len(gids) {
		t.Fatalf("%d GIDs, the device has %d", gr.Count, len(gids))
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	sawLo := false
	for i := range gids {
		var e wire.GIDEntry
		rest, _ = wire.Read(rest, &e)
		if proto.GIDToAddr(e.GID) != gids[i].Unmap() || e.GIDIndex != uint32(i) || e.PortNum != 1 || e.GIDType != wire.GIDTypeRoCEv2 {
			t.Fatalf("GID %d: %+v, want %v", i, e, gids[i])
		}
		if gids[i].Unmap() == lo1 {
			sawLo = e.NdevIfindex == uint32(lo.Index) && wire.GoString(e.NdevName[:]) == "lo"
		}
	}
	if !sawLo {
		t.Fatal("127.0.0.1's GID does not name lo")
	}
	var pk wire.PKeyResp
	if err := r.call(wire.OpQueryPKey, wire.Bytes(&wire.PKeyReq{Port: 1}), wire.Bytes(&pk)); err != nil || pk.PKey != 0xFFFF {
		t.Fatalf("P_Key 0: %#x %v", pk.PKey, err)
	}
	if err := r.call(wire.OpQueryPKey, wire.Bytes(&wire.PKeyReq{Port: 1, Index: 1}), nil); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("P_Key 1: %v", err)
	}
	var s wire.Stats
	if err := r.call(wire.OpStats, nil, wire.Bytes(&s)); err != nil {
		t.Fatal(err)
	}
}

// waitFD waits until the eventfd fd is readable.
func waitFD(t *testing.T, fd int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, 100); n == 1 {
			return
		}
	}
	t.Fatal("eventfd not signalled")
}

func readable(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, _ := unix.Poll(pfd, 0)
	return n == 1
}

// waitEvents waits for a channel's next events and fetches them. Nothing else reads the
// eventfd's counter, so once signalled it stays readable: each try takes its count (a later
// signal then means a new event), fetches, and polls the fd again only while nothing came.
func waitEvents(t *testing.T, r *raw, ch uint32, fd int) []wire.CMEvent {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		if readable(fd) {
			var b [8]byte
			unix.Read(fd, b[:])
		}
		if evs := getEvents(t, r, ch); len(evs) > 0 {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatal("no event on the channel")
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		unix.Poll(pfd, 100)
	}
}

// getEvents fetches a channel's events.
func getEvents(t *testing.T, r *raw, ch uint32) []wire.CMEvent {
	t.Helper()
	buf := make([]byte, proto.MaxMsg)
	if err := r.call(wire.OpCMGetEvents, wire.Bytes(&wire.CMGetEventsReq{Channel: ch}), buf); err != nil {
		t.Fatal(err)
	}
	var er wire.CMEventsResp
	rest, _ := wire.Read(buf, &er)
	evs := make([]wire.CMEvent, er.Count)
	for i := range evs {
		rest, _ = wire.Read(rest, &evs[i])
	}
	return evs
}

func handleBody(h uint32) []byte { return wire.Bytes(&wire.Handle{Handle: h}) }

// TestProtocolCMChannels: rdma_cm through raw protocol requests, as a C
// library makes them: events go to the channel of their ID and its eventfd
// only; a migrated ID takes its queued events along; a channel with IDs
// cannot be destroyed; a CONNECT_REQUEST carries the new ID (already a
// handle) with its addresses; INIT_QP_ATTR gives the passive side's RTR
// attributes from the REQ; a REJECT reaches the active side with its reason
// and private data; QUERY_ID reports the ID's addresses, QP and channel.
func TestProtocolCMChannels(t *testing.T) {
	noLeaks(t)
	da, db, port := udpDaemons(t)
	srv := dialRaw(t, da.sock)
	cli := dialRaw(t, db.sock)
	newChannel := func(r *raw) (uint32, int) {
		var h wire.Handle
		fds, err := r.callFDs(wire.OpCMCreateChannel, nil, wire.Bytes(&h))
		if err != nil || len(fds) != 1 {
			t.Fatalf("CM_CREATE_CHANNEL: %v, %d fds", err, len(fds))
		}
		t.Cleanup(func() { unix.Close(fds[0]) })
		return h.Handle, fds[0]
	}
	newID := func(r *raw, ch uint32) uint32 {
		var h wire.Handle
		if err := r.call(wire.OpCMCreateID, wire.Bytes(&wire.CMCreateIDReq{Channel: ch, PortSpace: uint16(cm.PSTCP)}), wire.Bytes(&h)); err != nil {
			t.Fatal(err)
		}
		return h.Handle
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The passive side listens on 127.0.0.1.
	sch, sfd := newChannel(srv)
	lid := newID(srv, sch)
	server := netip.AddrPortFrom(lo1, 7470+uint16(port%100))
	var ar wire.CMAddrResp
	must(srv.call(wire.OpCMBindAddr, wire.Bytes(&wire.CMBindReq{ID: lid, Addr: proto.AddrPortToWire(server)}), wire.Bytes(&ar)))
	must(srv.call(wire.OpCMListen, wire.Bytes(&wire.CMListenReq{ID: lid, Backlog: 4}), nil))
	if proto.AddrPortFromWire(&ar.Local) != server {
		t.Fatalf("bound to %v", proto.AddrPortFromWire(&ar.Local))
	}
	if n := da.srv.Debug().CMListens; n != 1 {
		t.Fatalf("%d listening IDs", n)
	}

	// The active side: two channels; the ID starts on the first.
	c1, fd1 := newChannel(cli)
	c2, fd2 := newChannel(cli)
	id := newID(cli, c1)
	must(cli.call(wire.OpCMResolveAddr, wire.Bytes(&wire.CMResolveAddrReq{ID: id, Dst: proto.AddrPortToWire(server)}), wire.Bytes(&ar)))
	waitFD(t, fd1)
	// Migrated before the event is fetched: the event moves to channel 2.
	must(cli.call(wire.OpCMMigrateID, wire.Bytes(&wire.CMMigrateReq{ID: id, Channel: c2}), nil))
	if evs := getEvents(t, cli, c1); len(evs) != 0 {
		t.Fatalf("channel 1 kept %d events", len(evs))
	}
	evs := waitEvents(t, cli, c2, fd2)
	if len(evs) != 1 || evs[0].Event != uint32(rdmacm.EventAddrResolved) || evs[0].ID != id || evs[0].Status != 0 {
		t.Fatalf("channel 2 events %+v", evs)
	}
	if err := cli.call(wire.OpCMDestroyChannel, handleBody(c2), nil); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("destroying a channel with an ID: %v", err)
	}
	var rt wire.CMRoute
	must(cli.call(wire.OpCMResolveRoute, wire.Bytes(&wire.CMResolveRouteReq{ID: id}), wire.Bytes(&rt)))
	if proto.GIDToAddr(rt.DGID) != lo1 || proto.GIDToAddr(rt.SGID) != lo2 {
		t.Fatalf("route %+v", rt)
	}
	if evs := waitEvents(t, cli, c2, fd2); len(evs) != 1 || evs[0].Event != uint32(rdmacm.EventRouteResolved) {
		t.Fatalf("ROUTE_RESOLVED %+v", evs)
	}
	// A QP bound to the ID, in INIT as rdma_create_qp leaves it.
	var pd, cqh wire.Handle
	must(cli.call(wire.OpAllocPD, nil, wire.Bytes(&pd)))
	must(cli.call(wire.OpCreateCQ, wire.Bytes(&wire.CreateCQReq{CQE: 4}), wire.Bytes(&cqh)))
	var qr wire.CreateQPResp
	must(cli.call(wire.OpCreateQP, wire.Bytes(&wire.CreateQPReq{PD: pd.Handle, SendCQ: cqh.Handle, RecvCQ: cqh.Handle,
		QPType: uint8(qp.TypeRC), Cap: wire.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}), wire.Bytes(&qr)))
	must(cli.call(wire.OpCMSetQP, wire.Bytes(&wire.CMSetQPReq{ID: id, QP: qr.Handle}), nil))
	var qa wire.QPAttr
	must(cli.call(wire.OpQueryQP, wire.Bytes(&wire.QueryQPReq{Handle: qr.Handle}), wire.Bytes(&qa)))
	if qa.QPState != uint8(qp.StateInit) {
		t.Fatalf("bound QP in state %d", qa.QPState)
	}
	var ia wire.CMInitQPAttrResp
	must(cli.call(wire.OpCMInitQPAttr, wire.Bytes(&wire.CMInitQPAttrReq{ID: id, QPState: uint32(qp.StateInit)}), wire.Bytes(&ia)))
	if qp.AttrMask(ia.AttrMask) != qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags || ia.Attr.QPState != uint8(qp.StateInit) ||
		ia.Attr.PortNum != 1 {
		t.Fatalf("INIT attributes %+v", ia)
	}
	if err := cli.call(wire.OpCMInitQPAttr, wire.Bytes(&wire.CMInitQPAttrReq{ID: id, QPState: uint32(qp.StateRTR)}), nil); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RTR attributes before a connection: %v", err)
	}
	pdata := []byte("hello from the C side")
	req := wire.CMConnReq{ID: id, HasParam: 1, Param: wire.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7,
		RNRRetryCount: 7, PrivateDataLen: uint16(len(pdata))}}
	copy(req.Param.PrivateData[:], pdata)
	must(cli.call(wire.OpCMConnect, wire.Bytes(&req), nil))

	// The passive side: CONNECT_REQUEST on its channel, the new ID in its table.
	evs = waitEvents(t, srv, sch, sfd)
	if len(evs) != 1 || evs[0].Event != uint32(rdmacm.EventConnectRequest) || evs[0].ListenID != lid || evs[0].ID == lid ||
		proto.AddrPortFromWire(&evs[0].Local) != server || proto.AddrFromWire(&evs[0].Remote) != lo2 ||
		// the whole private data area after the CMA header, as librdmacm reports it
		evs[0].Param.PrivateDataLen != 56 || string(evs[0].Param.PrivateData[:len(pdata)]) != string(pdata) || evs[0].Param.QPNum != qr.QPN {
		t.Fatalf("CONNECT_REQUEST %+v", evs)
	}
	child := evs[0].ID
	must(srv.call(wire.OpCMInitQPAttr, wire.Bytes(&wire.CMInitQPAttrReq{ID: child, QPState: uint32(qp.StateRTR)}), wire.Bytes(&ia)))
	if ia.Attr.QPState != uint8(qp.StateRTR) || ia.Attr.DestQPNum != qr.QPN || proto.GIDToAddr(ia.Attr.AHAttr.DGID) != lo2 ||
		qp.AttrMask(ia.AttrMask)&(qp.AttrAV|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrPathMTU) != qp.AttrAV|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrPathMTU {
		t.Fatalf("RTR attributes from the REQ: %+v", ia)
	}
	var rj wire.CMRejectReq
	rj.ID, rj.PrivateDataLen = child, uint32(copy(rj.PrivateData[:], "not now"))
	must(srv.call(wire.OpCMReject, wire.Bytes(&rj), nil))

	evs = waitEvents(t, cli, c2, fd2)
	if len(evs) != 1 || evs[0].Event != uint32(rdmacm.EventRejected) || evs[0].Status != int32(cm.RejConsumerDefined) ||
		string(evs[0].Param.PrivateData[:7]) != "not now" {
		t.Fatalf("REJECTED %+v", evs)
	}
	if readable(fd1) {
		// fd1 was signalled once for ADDR_RESOLVED before the migration; nothing since.
		var b [8]byte
		unix.Read(fd1, b[:])
		if readable(fd1) {
			t.Fatal("channel 1 signalled again")
		}
	}
	var qi wire.CMQueryIDResp
	must(cli.call(wire.OpCMQueryID, handleBody(id), wire.Bytes(&qi)))
	if qi.QP != qr.Handle || qi.Channel != c2 || proto.AddrFromWire(&qi.Local) != lo2 || proto.AddrPortFromWire(&qi.Remote) != server {
		t.Fatalf("QUERY_ID %+v", qi)
	}
	must(cli.call(wire.OpCMDestroyID, handleBody(id), nil))
	must(cli.call(wire.OpCMDestroyChannel, handleBody(c2), nil))
	var d wire.Debug
	must(cli.call(wire.OpDebug, nil, wire.Bytes(&d)))
	if d.MineCMIDs != 0 || d.MineCMChannels != 1 {
		t.Fatalf("client objects %+v", d)
	}
	srv.c.Close()
	cli.c.Close()
	da.waitIdle(t, 0)
	db.waitIdle(t, 0)
	if d := da.srv.Debug(); d.CMIDs != 0 || d.CMChannels != 0 || d.CMListens != 0 {
		t.Fatalf("server daemon keeps %+v", d)
	}
}
