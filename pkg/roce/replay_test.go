package roce

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/internal/qp"
	"github.com/softroce/softroce/internal/testcap"
	"github.com/softroce/softroce/pkg/bth"
	"github.com/softroce/softroce/pkg/link"
	"github.com/softroce/softroce/pkg/link/mem"
)

// TestReplayRxePingpong plays the client side of kernel rxe captures of
// ibv_{rc,uc,ud}_pingpong (rxe1 198.19.0.1 -> rxe2 198.19.0.2) into a
// softroce device standing in for the server (rxe2, same QPN): the
// client's packets carry rxe's non-zero IPv4 IDs (accepted through the
// ICRC solver), their messages must land intact (UD: after the 40-byte
// GRH), and every packet the device sends - its SENDs (same payloads as
// rxe2's) and its ACKs - must equal rxe2's byte for byte except the ICRC
// (which covers rxe's IPv4 ID), UDP source port included.
func TestReplayRxePingpong(t *testing.T) {
	for _, c := range []struct {
		name string
		typ  qp.Type
	}{{"rc_pingpong", qp.TypeRC}, {"rc_pingpong_small", qp.TypeRC}, {"uc_pingpong", qp.TypeUC}, {"ud_pingpong", qp.TypeUD}} {
		t.Run(c.name, func(t *testing.T) { replayServer(t, "../../testdata/captures/"+c.name+".pcap", c.typ) })
	}
}

func replayServer(t *testing.T, path string, typ qp.Type) {
	frames, err := testcap.ReadRoCE(path)
	if err != nil {
		t.Fatal(err)
	}
	server, client := netip.MustParseAddr("198.19.0.2"), netip.MustParseAddr("198.19.0.1")
	type pkt struct {
		f testcap.Frame
		p bth.Packet
	}
	var fromClient, serverSends, serverAcks []pkt
	var clientMsgs, serverMsgs [][]byte
	for _, f := range frames {
		p, err := bth.Parse(f.UDPPayload)
		if err != nil {
			t.Fatalf("frame %d: %v", f.Number, err)
		}
		switch {
		case f.Src == client:
			fromClient = append(fromClient, pkt{f, p})
			if p.Info.Kind == bth.KindSend {
				if p.Info.First {
					clientMsgs = append(clientMsgs, nil)
				}
				clientMsgs[len(clientMsgs)-1] = append(clientMsgs[len(clientMsgs)-1], p.Payload...)
			}
		case p.Info.Kind == bth.KindSend:
			serverSends = append(serverSends, pkt{f, p})
			if p.Info.First {
				serverMsgs = append(serverMsgs, nil)
			}
			serverMsgs[len(serverMsgs)-1] = append(serverMsgs[len(serverMsgs)-1], p.Payload...)
		default:
			serverAcks = append(serverAcks, pkt{f, p})
		}
	}
	if len(clientMsgs) != 2 || len(serverMsgs) != 2 {
		t.Fatalf("capture shape: %d/%d messages", len(clientMsgs), len(serverMsgs))
	}
	first := fromClient[0].p
	clientPSN, serverQPN := uint32(first.BTH.PSN()), first.BTH.DestQP()
	serverPSN, clientQPN := uint32(serverSends[0].p.BTH.PSN()), serverSends[0].p.BTH.DestQP()

	nw := mem.NewNetwork(mem.Options{})
	ls, err := nw.Attach(server)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := nw.Attach(client)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	d, err := Open(Options{Link: ls, QPNRand: zeros{}}) // QPNs as rxe numbered them in the capture
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var e *end
	for e == nil || e.qp.Num() < serverQPN {
		e = newEnd(t, d, typ, 1<<20)
	}
	if e.qp.Num() != serverQPN {
		t.Fatalf("QPN %#x, want %#x like rxe2", e.qp.Num(), serverQPN)
	}
	var ah *qp.AH
	var qkey uint32
	if typ == qp.TypeUD {
		qkey = first.DETH.Fields().QKey
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, QKey: qkey}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrQKey},
			{qp.Attr{State: qp.StateRTR}, qp.AttrState},
			{qp.Attr{State: qp.StateRTS, SQPSN: serverPSN}, qp.AttrState | qp.AttrSQPSN},
		}
		for _, s := range steps {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
				t.Fatal(err)
			}
		}
		if ah, err = d.CreateAH(e.pd, qp.AHAttr{DGID: client, SGIDIndex: uint8(d.GIDIndex(server)), Port: 1}); err != nil {
			t.Fatal(err)
		}
	} else {
		m1 := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
		m2 := qp.AttrState | qp.AttrSQPSN
		if typ == qp.TypeRC {
			m1 |= qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer
			m2 |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic
		}
		steps := []struct {
			a qp.Attr
			m qp.AttrMask
		}{
			{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessLocalWrite}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
			{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: client, SGIDIndex: uint8(d.GIDIndex(server)), Port: 1}, PathMTU: qp.MTU1024,
				DestQPN: clientQPN, RQPSN: clientPSN, MaxDestRDAtomic: 1, MinRNRTimer: 12}, m1},
			{qp.Attr{State: qp.StateRTS, SQPSN: serverPSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1}, m2},
		}
		for _, s := range steps {
			if err := e.qp.Modify(&s.a, s.m); err != nil {
				t.Fatal(err)
			}
		}
	}
	grh := 0
	if typ == qp.TypeUD {
		grh = 40
	}
	postRecv(t, e, qp.RecvWR{WRID: 1, SGL: []qp.SGE{e.sge(0, 4096)}}, qp.RecvWR{WRID: 2, SGL: []qp.SGE{e.sge(4096, 4096)}})
	got := make(chan link.Datagram, 64)
	go func() {
		batch := make([]link.Datagram, 16)
		for {
			for i := range batch {
				batch[i].Buf = make([]byte, link.MaxDatagram)
			}
			n, err := raw.Recv(batch)
			if err != nil {
				return
			}
			for _, dg := range batch[:n] {
				got <- dg
			}
		}
	}()
	for i, m := range serverMsgs {
		off := 16384 + i*4096
		copy(e.buf[off:], m)
		wr := qp.SendWR{WRID: uint64(10 + i), Opcode: qp.WRSend, SGL: []qp.SGE{e.sge(off, len(m))}, Flags: qp.SendSignaled}
		if typ == qp.TypeUD {
			wr.AH, wr.RemoteQPN, wr.RemoteQKey = ah, clientQPN, serverSends[i].p.DETH.Fields().QKey
		}
		post(t, e, wr)
	}
	// the client's packets, as captured (their ICRCs cover rxe's IPv4 IDs)
	for _, c := range fromClient {
		dg := link.Datagram{Buf: c.f.UDPPayload, Src: netip.AddrPortFrom(client, c.f.SrcPort), Dst: netip.AddrPortFrom(server, c.f.DstPort)}
		if err := raw.Send([]link.Datagram{dg}); err != nil {
			t.Fatal(err)
		}
	}
	r := waitWC(t, e.rcq, 2)
	for i := range r {
		want := cq.WC{WRID: uint64(i + 1), Opcode: cq.OpRecv, ByteLen: uint32(grh + len(clientMsgs[i]))}
		if typ == qp.TypeUD {
			want.Flags, want.SrcQP = cq.FlagGRH, clientQPN
		}
		checkWC(t, r[i], want)
		same(t, "client message", e.buf[i*4096+grh:i*4096+grh+len(clientMsgs[i])], clientMsgs[i])
	}
	s := waitWC(t, e.scq, 2)
	for i := range s {
		checkWC(t, s[i], cq.WC{WRID: uint64(10 + i), Opcode: cq.OpSend, ByteLen: uint32(len(serverMsgs[i]))})
	}
	if st := d.Stats(); st.RcvdICRCSolved == 0 || st.RcvdDropped != 0 {
		t.Fatalf("counters %+v", st)
	}
	// what the device sent, against what rxe2 sent
	var mySends, myAcks []link.Datagram
	timeout := time.After(10 * time.Second)
	for len(mySends) < len(serverSends) || len(myAcks) < len(serverAcks) {
		select {
		case dg := <-got:
			p, err := bth.Parse(dg.Buf)
			if err != nil {
				t.Fatal(err)
			}
			if p.Info.Kind == bth.KindSend {
				mySends = append(mySends, dg)
			} else {
				myAcks = append(myAcks, dg)
			}
		case <-timeout:
			t.Fatalf("device sent %d sends and %d acks", len(mySends), len(myAcks))
		}
	}
	cmp := func(what string, mine link.Datagram, theirs pkt) {
		t.Helper()
		a, b := mine.Buf, theirs.f.UDPPayload
		if len(a) != len(b) || !bytes.Equal(a[:len(a)-4], b[:len(b)-4]) {
			t.Fatalf("%s: ours % x\nrxe's % x", what, a[:min(len(a), 40)], b[:min(len(b), 40)])
		}
		if mine.Src.Port() != theirs.f.SrcPort {
			t.Fatalf("%s: source port %#x, rxe's %#x", what, mine.Src.Port(), theirs.f.SrcPort)
		}
	}
	for i := range serverSends {
		cmp("SEND packet", mySends[i], serverSends[i])
	}
	for i := range serverAcks {
		cmp("ACK", myAcks[i], serverAcks[i])
	}
}

// TestReplayRxeClient stands in for the perftest client (rxe1,
// 198.19.0.1) of kernel rxe captures: it posts the work requests the
// client's packets describe (the server's VA and R_Key taken from them),
// is fed the server's responses as captured, and must complete every WR
// with the captured data, having sent requests byte-identical to rxe1's
// except the ICRC (which covers rxe's IPv4 ID), source port included.
func TestReplayRxeClient(t *testing.T) {
	for _, name := range []string{"ib_write_bw", "ib_read_bw", "ib_read_lat", "ib_send_bw", "ib_atomic_bw_cas", "ib_atomic_bw_faa"} {
		t.Run(name, func(t *testing.T) { replayClient(t, "../../testdata/captures/"+name+".pcap") })
	}
}

func replayClient(t *testing.T, path string) {
	frames, err := testcap.ReadRoCE(path)
	if err != nil {
		t.Fatal(err)
	}
	server, client := netip.MustParseAddr("198.19.0.2"), netip.MustParseAddr("198.19.0.1")
	var reqs, resps []testcap.Frame
	var clientQPN, serverQPN, firstPSN uint32
	for _, f := range frames {
		p, err := bth.Parse(f.UDPPayload)
		if err != nil {
			t.Fatal(err)
		}
		if f.Src == client {
			if len(reqs) == 0 {
				firstPSN, serverQPN = uint32(p.BTH.PSN()), p.BTH.DestQP()
			}
			reqs = append(reqs, f)
		} else {
			clientQPN = p.BTH.DestQP()
			resps = append(resps, f)
		}
	}
	// the work requests the client posted, rebuilt from its packets
	type expect struct {
		wc cq.WC
	}
	var wrs []qp.SendWR
	var reqPSN []bth.PSN
	var want []expect
	var payloads [][]byte
	off := 0
	for _, f := range reqs {
		p, _ := bth.Parse(f.UDPPayload)
		info := p.Info
		if info.First {
			reqPSN = append(reqPSN, p.BTH.PSN())
			wr := qp.SendWR{WRID: uint64(len(wrs)), Flags: qp.SendSignaled}
			switch info.Kind {
			case bth.KindWrite:
				r := p.RETH.Fields()
				wr.Opcode, wr.RemoteAddr, wr.RKey = qp.WRRDMAWrite, r.VA, r.RKey
			case bth.KindSend:
				wr.Opcode = qp.WRSend
			case bth.KindReadReq:
				r := p.RETH.Fields()
				wr.Opcode, wr.RemoteAddr, wr.RKey = qp.WRRDMARead, r.VA, r.RKey
				payloads = append(payloads, make([]byte, r.DMALen))
			case bth.KindCmpSwap, bth.KindFetchAdd:
				a := p.AtomicETH.Fields()
				wr.RemoteAddr, wr.RKey = a.VA, a.RKey
				if info.Kind == bth.KindCmpSwap {
					wr.Opcode, wr.Swap, wr.CompareAdd = qp.WRAtomicCmpAndSwp, a.SwapAdd, a.Compare
				} else {
					wr.Opcode, wr.CompareAdd = qp.WRAtomicFetchAndAdd, a.SwapAdd
				}
				payloads = append(payloads, make([]byte, 8))
			default:
				t.Fatalf("unexpected client opcode %v", p.BTH.Opcode())
			}
			if info.Kind == bth.KindSend || info.Kind == bth.KindWrite {
				payloads = append(payloads, nil)
			}
			wrs = append(wrs, wr)
		}
		if info.Kind == bth.KindSend || info.Kind == bth.KindWrite {
			payloads[len(payloads)-1] = append(payloads[len(payloads)-1], p.Payload...)
		}
	}
	nw := mem.NewNetwork(mem.Options{})
	lc, err := nw.Attach(client)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := nw.Attach(server)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	d, err := Open(Options{Link: lc, QPNRand: zeros{}}) // QPNs as in the capture
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var e *end
	for {
		e = newEnd(t, d, qp.TypeRC, 1<<20)
		if e.qp.Num() >= clientQPN {
			break
		}
	}
	if e.qp.Num() != clientQPN {
		t.Fatalf("QPN %#x, want %#x", e.qp.Num(), clientQPN)
	}
	steps := []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessLocalWrite}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: server, SGIDIndex: uint8(d.GIDIndex(client)), Port: 1}, PathMTU: qp.MTU1024,
			DestQPN: serverQPN, RQPSN: 0, MaxDestRDAtomic: 16, MinRNRTimer: 12},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
		{qp.Attr{State: qp.StateRTS, SQPSN: firstPSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRDAtomic},
	}
	for _, s := range steps {
		if err := e.qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan link.Datagram, 256)
	go func() {
		batch := make([]link.Datagram, 16)
		for {
			for i := range batch {
				batch[i].Buf = make([]byte, link.MaxDatagram)
			}
			n, err := raw.Recv(batch)
			if err != nil {
				return
			}
			for _, dg := range batch[:n] {
				got <- dg
			}
		}
	}()
	for i := range wrs {
		n := len(payloads[i])
		if wrs[i].Opcode == qp.WRSend || wrs[i].Opcode == qp.WRRDMAWrite {
			copy(e.buf[off:], payloads[i])
		}
		wrs[i].SGL = []qp.SGE{e.sge(off, n)}
		want = append(want, expect{wc: cq.WC{WRID: uint64(i), Opcode: wcOf(wrs[i].Opcode), ByteLen: uint32(n)}})
		off += (n + 4095) &^ 4095
		post(t, e, wrs[i])
	}
	// our requests against rxe1's, in order
	for i, f := range reqs {
		var dg link.Datagram
		select {
		case dg = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d of %d not sent", i, len(reqs))
		}
		a, b := dg.Buf, f.UDPPayload
		if len(a) != len(b) || !bytes.Equal(a[:len(a)-4], b[:len(b)-4]) || dg.Src.Port() != f.SrcPort {
			t.Fatalf("request %d (frame %d): ours port %#x % x\nrxe1's port %#x % x", i, f.Number, dg.Src.Port(),
				a[:min(len(a), 48)], f.SrcPort, b[:min(len(b), 48)])
		}
	}
	// the server's responses, as captured
	for _, f := range resps {
		if err := raw.Send([]link.Datagram{{Buf: f.UDPPayload, Src: netip.AddrPortFrom(server, f.SrcPort), Dst: netip.AddrPortFrom(client, f.DstPort)}}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := waitWC(t, e.scq, len(wrs))
	off = 0
	for i := range wcs {
		checkWC(t, wcs[i], want[i].wc)
		n := len(payloads[i])
		if k := wrs[i].Opcode; k == qp.WRRDMARead || k == qp.WRAtomicCmpAndSwp || k == qp.WRAtomicFetchAndAdd {
			// the data the server's responses to this request carried
			var data []byte
			for _, f := range resps {
				p, _ := bth.Parse(f.UDPPayload)
				d := p.BTH.PSN().Sub(reqPSN[i])
				if d < 0 || d >= int32(max(1, (n+1023)/1024)) {
					continue
				}
				switch p.Info.Kind {
				case bth.KindReadResp:
					data = append(data, p.Payload...)
				case bth.KindAtomicAck:
					data = binary.LittleEndian.AppendUint64(nil, p.AtomicAck.Fields().OrigData)
				}
			}
			if len(data) != n {
				t.Fatalf("WR %d: %d response bytes in the capture, want %d", i, len(data), n)
			}
			same(t, "response data", e.buf[off:off+n], data)
		}
		off += (n + 4095) &^ 4095
	}
	if st := d.Stats(); st.RcvdDropped != 0 || st.RcvdICRCSolved == 0 {
		t.Fatalf("counters %+v", st)
	}
}

func wcOf(op qp.WROpcode) cq.Opcode {
	switch op {
	case qp.WRRDMAWrite:
		return cq.OpRDMAWrite
	case qp.WRRDMARead:
		return cq.OpRDMARead
	case qp.WRAtomicCmpAndSwp:
		return cq.OpCompSwap
	case qp.WRAtomicFetchAndAdd:
		return cq.OpFetchAdd
	}
	return cq.OpSend
}

// constReader returns the same byte forever (deterministic key bytes).
type constReader byte

func (c constReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

// TestReplayRxeServer stands in for the perftest server (rxe2) of kernel
// rxe captures: the device gets rxe2's QPN and, through deterministic
// keys, the R_Key rxe2 advertised; the memory holds what rxe2's did
// (READ data and the first atomic's original value, taken from rxe2's
// responses); rxe1's requests are injected as captured, and every
// response the device sends (ACKs, READ responses, atomic ACKs with their
// results) must equal rxe2's byte for byte except the ICRC.
func TestReplayRxeServer(t *testing.T) {
	for _, name := range []string{"ib_write_bw", "ib_read_bw", "ib_read_lat", "ib_send_bw", "ib_atomic_bw_cas", "ib_atomic_bw_faa"} {
		t.Run(name, func(t *testing.T) { replayServerPerf(t, "../../testdata/captures/"+name+".pcap") })
	}
}

func replayServerPerf(t *testing.T, path string) {
	frames, err := testcap.ReadRoCE(path)
	if err != nil {
		t.Fatal(err)
	}
	server, client := netip.MustParseAddr("198.19.0.2"), netip.MustParseAddr("198.19.0.1")
	var reqs, resps []testcap.Frame
	var serverQPN, clientQPN, clientPSN, rkey uint32
	var lo, hi uint64 = ^uint64(0), 0
	for _, f := range frames {
		p, err := bth.Parse(f.UDPPayload)
		if err != nil {
			t.Fatal(err)
		}
		if f.Src != client {
			clientQPN = p.BTH.DestQP()
			resps = append(resps, f)
			continue
		}
		if len(reqs) == 0 {
			serverQPN, clientPSN = p.BTH.DestQP(), uint32(p.BTH.PSN())
		}
		reqs = append(reqs, f)
		var va uint64
		var n uint32
		switch {
		case p.RETH != nil:
			r := p.RETH.Fields()
			va, n, rkey = r.VA, r.DMALen, r.RKey
		case p.AtomicETH != nil:
			a := p.AtomicETH.Fields()
			va, n, rkey = a.VA, 8, a.RKey
		default:
			continue
		}
		lo, hi = min(lo, va), max(hi, va+uint64(n))
	}
	nw := mem.NewNetwork(mem.Options{})
	ls, err := nw.Attach(server)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := nw.Attach(client)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	d, err := Open(Options{Link: ls, KeyRand: constReader(rkey), QPNRand: zeros{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	e := newEnd(t, d, qp.TypeRC, 1<<16)
	for e.qp.Num() < serverQPN {
		if e.qp, err = d.CreateQP(QPInit{Type: qp.TypeRC, PD: e.pd, SendCQ: e.scq, RecvCQ: e.rcq,
			Cap: qp.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 8, MaxRecvSGE: 8}}); err != nil {
			t.Fatal(err)
		}
	}
	if e.qp.Num() != serverQPN {
		t.Fatalf("QPN %#x, want %#x", e.qp.Num(), serverQPN)
	}
	var mem []byte
	if rkey != 0 {
		mem = make([]byte, hi-lo)
		all := mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic
		for {
			m, err := d.RegMR(e.pd, mem, lo, all)
			if err != nil {
				t.Fatal(err)
			}
			if m.RKey() == rkey {
				break
			}
			if m.RKey()>>8 > rkey>>8 {
				t.Fatalf("cannot reach R_Key %#x (got %#x)", rkey, m.RKey())
			}
		}
	}
	// rxe2's memory, as its responses show it: each word an atomic first
	// touches holds the original value its ACK returned
	touched := map[uint64]bool{}
	for _, q := range reqs {
		rp, _ := bth.Parse(q.UDPPayload)
		if rp.AtomicETH == nil || touched[rp.AtomicETH.Fields().VA] {
			continue
		}
		va := rp.AtomicETH.Fields().VA
		touched[va] = true
		for _, f := range resps {
			p, _ := bth.Parse(f.UDPPayload)
			if p.Info.Kind == bth.KindAtomicAck && p.BTH.PSN() == rp.BTH.PSN() {
				binary.LittleEndian.PutUint64(mem[va-lo:], p.AtomicAck.Fields().OrigData)
			}
		}
	}
	for _, q := range reqs {
		rp, _ := bth.Parse(q.UDPPayload)
		if rp.Info.Kind != bth.KindReadReq {
			continue
		}
		r := rp.RETH.Fields()
		var data []byte
		for _, f := range resps {
			p, _ := bth.Parse(f.UDPPayload)
			if dd := p.BTH.PSN().Sub(rp.BTH.PSN()); p.Info.Kind == bth.KindReadResp && dd >= 0 && dd < int32(max(1, (r.DMALen+1023)/1024)) {
				data = append(data, p.Payload...)
			}
		}
		copy(mem[r.VA-lo:], data)
	}
	steps := []struct {
		a qp.Attr
		m qp.AttrMask
	}{
		{qp.Attr{State: qp.StateInit, Port: 1, AccessFlags: mr.AccessLocalWrite | mr.AccessRemoteWrite | mr.AccessRemoteRead | mr.AccessRemoteAtomic},
			qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.StateRTR, AH: qp.AHAttr{DGID: client, SGIDIndex: uint8(d.GIDIndex(server)), Port: 1}, PathMTU: qp.MTU1024,
			DestQPN: clientQPN, RQPSN: clientPSN, MaxDestRDAtomic: 16, MinRNRTimer: 12},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRDAtomic | qp.AttrMinRNRTimer},
	}
	for _, s := range steps {
		if err := e.qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 16; i++ {
		postRecv(t, e, qp.RecvWR{WRID: uint64(i), SGL: []qp.SGE{e.sge(0, 4096)}})
	}
	got := make(chan link.Datagram, 256)
	go func() {
		batch := make([]link.Datagram, 16)
		for {
			for i := range batch {
				batch[i].Buf = make([]byte, link.MaxDatagram)
			}
			n, err := raw.Recv(batch)
			if err != nil {
				return
			}
			for _, dg := range batch[:n] {
				got <- dg
			}
		}
	}()
	for _, f := range reqs {
		if err := raw.Send([]link.Datagram{{Buf: f.UDPPayload, Src: netip.AddrPortFrom(client, f.SrcPort), Dst: netip.AddrPortFrom(server, f.DstPort)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, f := range resps {
		var dg link.Datagram
		select {
		case dg = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("response %d of %d not sent", i, len(resps))
		}
		a, b := dg.Buf, f.UDPPayload
		if len(a) != len(b) || !bytes.Equal(a[:len(a)-4], b[:len(b)-4]) || dg.Src.Port() != f.SrcPort {
			t.Fatalf("response %d (frame %d): ours port %#x % x\nrxe2's port %#x % x", i, f.Number, dg.Src.Port(),
				a[:min(len(a), 48)], f.SrcPort, b[:min(len(b), 48)])
		}
	}
	if st := d.Stats(); st.RcvdDropped != 0 || st.RcvdICRCSolved == 0 {
		t.Fatalf("counters %+v", st)
	}
	// WRITE data landed where the RETHs said
	var va uint64
	for _, q := range reqs {
		rp, _ := bth.Parse(q.UDPPayload)
		if rp.Info.Kind != bth.KindWrite {
			continue
		}
		if rp.RETH != nil {
			va = rp.RETH.Fields().VA
		}
		same(t, "written data", mem[va-lo:va-lo+uint64(len(rp.Payload))], rp.Payload)
		va += uint64(len(rp.Payload))
	}
}
