package bth

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestOpcodeTable(t *testing.T) {
	names := map[string]Opcode{}
	valid := 0
	for i := 0; i < 256; i++ {
		op := Opcode(i)
		info := op.Info()
		if info == nil {
			t.Fatalf("%#x: nil info", i)
		}
		if !info.Valid {
			if info.Name != "Reserved 0x"+strings.ToUpper(strconv.FormatInt(int64(i)|0x100, 16)[1:]) {
				t.Fatalf("%#x: reserved name %q", i, info.Name)
			}
			continue
		}
		valid++
		if prev, dup := names[info.Name]; dup {
			t.Fatalf("%#x and %#x share the name %q", prev, i, info.Name)
		}
		names[info.Name] = op
		if info.Transport != op.Transport() || info.Kind == KindUnknown {
			t.Fatalf("%v: transport %v kind %v", op, info.Transport, info.Kind)
		}
		if !strings.HasPrefix(info.Name, info.Transport.String()) {
			t.Fatalf("%v: name does not start with the transport", op)
		}
		want := BTHSize + info.Hdrs.Size()
		if info.Kind == KindCNP {
			want += CNPResvSize
		}
		if info.HdrLen != want {
			t.Fatalf("%v: HdrLen %d, want %d", op, info.HdrLen, want)
		}
		if info.Middle && (info.First || info.Last) {
			t.Fatalf("%v: middle and first/last", op)
		}
		// IBTA header rules.
		h := info.Hdrs
		switch info.Transport {
		case TransportRD:
			if h&HdrRDETH == 0 || (info.Request != (h&HdrDETH != 0)) {
				t.Fatalf("%v: RD needs RDETH, and DETH on requests: %v", op, h)
			}
		case TransportUD:
			if h&HdrDETH == 0 {
				t.Fatalf("%v: UD needs DETH", op)
			}
		case TransportXRC:
			if info.Request != (h&HdrXRCETH != 0) {
				t.Fatalf("%v: XRC requests carry XRCETH: %v", op, h)
			}
		default:
			if h&(HdrRDETH|HdrDETH|HdrXRCETH) != 0 {
				t.Fatalf("%v: unexpected datagram/XRC header", op)
			}
		}
		if strings.Contains(info.Name, "Immediate") != info.HasImm() {
			t.Fatalf("%v: immediate mismatch", op)
		}
		if strings.Contains(info.Name, "Invalidate") != info.HasInv() {
			t.Fatalf("%v: invalidate mismatch", op)
		}
		if strings.Contains(info.Name, "Only") && !info.Only() {
			t.Fatalf("%v: Only", op)
		}
	}
	// RC 25 (0x00-0x14, 0x16, 0x17, 0x1C, 0x1D), UC 12, RD 24, UD 2, CNP 1, XRC 23.
	if valid != 25+12+24+2+1+23 {
		t.Fatalf("%d valid opcodes", valid)
	}
	spot := []struct {
		op   Opcode
		hdrs Hdr
		name string
	}{
		{OpRCFlush, HdrFETH | HdrRETH, "RC Flush"},
		{OpRCAtomicWrite, HdrRETH, "RC Atomic Write"},
		{OpRCReadRespMiddle, 0, "RC RDMA Read Response Middle"},
		{OpRCWriteOnlyImm, HdrRETH | HdrImmDt, "RC RDMA Write Only Immediate"},
		{OpRDAtomicAck, HdrRDETH | HdrAETH | HdrAtomicAckETH, "RD Atomic Acknowledge"},
		{OpRDCmpSwap, HdrRDETH | HdrDETH | HdrAtomicETH, "RD Compare Swap"},
		{OpRDWriteOnlyImm, HdrRDETH | HdrDETH | HdrRETH | HdrImmDt, "RD RDMA Write Only Immediate"},
		{OpUDSendOnlyImm, HdrDETH | HdrImmDt, "UD Send Only Immediate"},
		{OpXRCSendOnlyInv, HdrXRCETH | HdrIETH, "XRC Send Only Invalidate"},
		{OpXRCAck, HdrAETH, "XRC Acknowledge"},
		{OpCNP, 0, "CNP"},
	}
	for _, s := range spot {
		if s.op.Info().Hdrs != s.hdrs || s.op.String() != s.name {
			t.Errorf("%#x: %v %q", uint8(s.op), s.op.Info().Hdrs, s.op.String())
		}
	}
	if OpCNP.Info().HdrLen != 28 || OpRCFlush.Info().HdrLen != 32 || OpRCAtomicWrite.Info().FixedPayload != 8 {
		t.Fatal("CNP/FLUSH/ATOMIC WRITE layout")
	}
	if Opcode(0x15).String() != "Reserved 0x15" || Opcode(0xE0).Valid() {
		t.Fatal("reserved")
	}
	if (HdrRETH|HdrImmDt).String() != "RETH+ImmDt" || Hdr(0).String() != "" {
		t.Fatal("Hdr.String")
	}
}

// TestWiresharkNamesMatchTshark compares WiresharkName and the BTH fields
// with tshark's decode of the reference captures (the *.txt files list the
// first 30 packets: No., ..., DestQP, PSN, Info).
func TestWiresharkNamesMatchTshark(t *testing.T) {
	line := regexp.MustCompile(`^\s*(\d+)\s+\S+\s+.*RRoCE \d+\s+(0x[0-9a-f]+)\s+(\d+)\s+(.*)$`)
	frames := captureFrames(t)
	compared := 0
	for name, fr := range frames {
		byNum := map[int][]byte{}
		for _, f := range fr {
			byNum[f.Number] = f.UDPPayload
		}
		txt := filepath.Join(capturesDir, strings.TrimSuffix(name, ".pcap")+".txt")
		fh, err := os.Open(txt)
		if os.IsNotExist(err) {
			continue // the IPv6 capture has no decode file
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			m := line.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			num, _ := strconv.Atoi(m[1])
			qp, _ := strconv.ParseUint(m[2], 0, 32)
			psn, _ := strconv.Atoi(m[3])
			info := m[4]
			b, ok := byNum[num]
			if !ok {
				t.Fatalf("%s: tshark frame %d is not a RoCE frame here", name, num)
			}
			p, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			if p.BTH.DestQP() != uint32(qp) || int(p.BTH.PSN()) != psn {
				t.Fatalf("%s frame %d: QP %#x PSN %d, tshark %#x %d", name, num, p.BTH.DestQP(), p.BTH.PSN(), qp, psn)
			}
			if strings.HasPrefix(info, "CM:") {
				if p.BTH.Opcode() != OpUDSendOnly {
					t.Fatalf("%s frame %d: CM MAD in %v", name, num, p.BTH.Opcode())
				}
				continue
			}
			want := strings.TrimSpace(strings.SplitN(info, "QP=", 2)[0])
			if got := p.BTH.Opcode().WiresharkName(); got != want {
				t.Fatalf("%s frame %d: WiresharkName %q, tshark %q", name, num, got, want)
			}
			compared++
		}
		fh.Close()
	}
	if compared < 100 {
		t.Fatalf("only %d names compared", compared)
	}
	t.Logf("%d opcode names match tshark", compared)
}

func TestWiresharkQuirks(t *testing.T) {
	if OpUCWriteMiddle.WiresharkName() != "Unreliable Connection RDMA Write Middle" || OpUCWriteMiddle.String() != "UC RDMA Write Middle" {
		t.Fatal("UC write middle")
	}
	if OpRDSendLastImm.WiresharkName() != "RD Last Immediate" || OpXRCSendFirst.WiresharkName() != "" || OpCNP.WiresharkName() != "" {
		t.Fatal("quirks")
	}
	if OpRCSendFirst.WiresharkName() != "RC Send First" {
		t.Fatal("plain")
	}
	for _, tr := range []Transport{TransportRC, TransportXRC, 6, 7} {
		if tr.String() == "" {
			t.Fatal("transport name")
		}
	}
	if KindFlush.String() != "Flush" || OpKind(200).String() != "OpKind(200)" {
		t.Fatal("kind names")
	}
}
