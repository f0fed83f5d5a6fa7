package wire

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// header is proto.h, relative to this package.
const header = "../../../../clib/include/softroce/proto.h"

// structs maps each C struct of the header to its Go twin.
var structs = []struct {
	c string
	v any
}{
	{"sr_hdr", Hdr{}}, {"sr_err", Err{}}, {"sr_handle", Handle{}}, {"sr_hello_req", HelloReq{}},
	{"sr_hello_resp", HelloResp{}}, {"sr_open_rings_resp", OpenRingsResp{}}, {"sr_port_req", PortReq{}},
	{"sr_device_attr", DeviceAttr{}}, {"sr_port_attr", PortAttr{}}, {"sr_gids_resp", GIDsResp{}},
	{"sr_gid_entry", GIDEntry{}}, {"sr_pkey_req", PKeyReq{}}, {"sr_pkey_resp", PKeyResp{}},
	{"sr_stats", Stats{}}, {"sr_debug", Debug{}}, {"sr_reg_mr_req", RegMRReq{}},
	{"sr_reg_mr_resp", RegMRResp{}}, {"sr_rereg_mr_req", ReregMRReq{}}, {"sr_rereg_mr_resp", ReregMRResp{}},
	{"sr_alloc_mw_req", AllocMWReq{}}, {"sr_alloc_mw_resp", AllocMWResp{}},
	{"sr_create_cq_req", CreateCQReq{}}, {"sr_create_cq_resp", CreateCQResp{}},
	{"sr_resize_cq_req", ResizeCQReq{}}, {"sr_resize_cq_resp", ResizeCQResp{}},
	{"sr_modify_cq_req", ModifyCQReq{}}, {"sr_create_srq_req", CreateSRQReq{}},
	{"sr_create_srq_resp", CreateSRQResp{}}, {"sr_modify_srq_req", ModifySRQReq{}}, {"sr_srq_attr", SRQAttr{}},
	{"sr_qp_cap", QPCap{}}, {"sr_ah_attr", AHAttr{}}, {"sr_qp_attr", QPAttr{}}, {"sr_create_qp_req", CreateQPReq{}},
	{"sr_create_qp_resp", CreateQPResp{}}, {"sr_modify_qp_req", ModifyQPReq{}}, {"sr_query_qp_req", QueryQPReq{}},
	{"sr_create_ah_req", CreateAHReq{}}, {"sr_create_ah_resp", CreateAHResp{}}, {"sr_post", Post{}},
	{"sr_sge", SGE{}}, {"sr_send_wr", SendWR{}}, {"sr_recv_wr", RecvWR{}}, {"sr_post_resp", PostResp{}},
	{"sr_sockaddr", SockAddr{}}, {"sr_cm_route", CMRoute{}}, {"sr_conn_param", ConnParam{}},
	{"sr_cm_create_id_req", CMCreateIDReq{}}, {"sr_cm_migrate_req", CMMigrateReq{}}, {"sr_cm_bind_req", CMBindReq{}},
	{"sr_cm_resolve_addr_req", CMResolveAddrReq{}}, {"sr_cm_addr_resp", CMAddrResp{}},
	{"sr_cm_resolve_route_req", CMResolveRouteReq{}}, {"sr_cm_set_qp_req", CMSetQPReq{}},
	{"sr_cm_set_option_req", CMSetOptionReq{}},
	{"sr_cm_init_qp_attr_req", CMInitQPAttrReq{}}, {"sr_cm_init_qp_attr_resp", CMInitQPAttrResp{}},
	{"sr_cm_listen_req", CMListenReq{}}, {"sr_cm_conn_req", CMConnReq{}}, {"sr_cm_reject_req", CMRejectReq{}},
	{"sr_cm_get_events_req", CMGetEventsReq{}}, {"sr_cm_events_resp", CMEventsResp{}}, {"sr_cm_event", CMEvent{}},
	{"sr_cm_query_id_resp", CMQueryIDResp{}}, {"sr_wc", WC{}}, {"sr_post_record", PostRecord{}},
	{"sr_async_event", AsyncEvent{}},
}

// consts maps each constant of the header to its Go value.
var consts = map[string]int64{
	"SR_PROTO_MAGIC": Magic, "SR_PROTO_VERSION": Version, "SR_MAX_MSG": MaxMsg,
	"SR_OP_HELLO": int64(OpHello), "SR_OP_OPEN_RINGS": int64(OpOpenRings), "SR_OP_ATTACH_MEM": int64(OpAttachMem),
	"SR_OP_QUERY_DEVICE": int64(OpQueryDevice), "SR_OP_QUERY_PORT": int64(OpQueryPort),
	"SR_OP_QUERY_GIDS": int64(OpQueryGIDs), "SR_OP_QUERY_PKEY": int64(OpQueryPKey), "SR_OP_STATS": int64(OpStats),
	"SR_OP_DEBUG": int64(OpDebug), "SR_OP_ALLOC_PD": int64(OpAllocPD), "SR_OP_DEALLOC_PD": int64(OpDeallocPD),
	"SR_OP_REG_MR": int64(OpRegMR), "SR_OP_DEREG_MR": int64(OpDeregMR), "SR_OP_CREATE_CQ": int64(OpCreateCQ),
	"SR_OP_MODIFY_CQ": int64(OpModifyCQ), "SR_OP_DESTROY_CQ": int64(OpDestroyCQ), "SR_OP_CREATE_SRQ": int64(OpCreateSRQ),
	"SR_OP_MODIFY_SRQ": int64(OpModifySRQ), "SR_OP_QUERY_SRQ": int64(OpQuerySRQ), "SR_OP_DESTROY_SRQ": int64(OpDestroySRQ),
	"SR_OP_CREATE_QP": int64(OpCreateQP), "SR_OP_MODIFY_QP": int64(OpModifyQP), "SR_OP_QUERY_QP": int64(OpQueryQP),
	"SR_OP_DESTROY_QP": int64(OpDestroyQP), "SR_OP_CREATE_AH": int64(OpCreateAH),
	"SR_OP_ALLOC_MW": int64(OpAllocMW), "SR_OP_DEALLOC_MW": int64(OpDeallocMW),
	"SR_OP_RESIZE_CQ": int64(OpResizeCQ), "SR_OP_REREG_MR": int64(OpReregMR), "SR_OP_POST_SEND": int64(OpPostSend),
	"SR_OP_POST_RECV": int64(OpPostRecv), "SR_OP_POST_SRQ_RECV": int64(OpPostSRQRecv),
	"SR_OP_POST_SEND_ASYNC": int64(OpPostSendAsync), "SR_OP_POST_RECV_ASYNC": int64(OpPostRecvAsync),
	"SR_OP_CM_CREATE_CHANNEL": int64(OpCMCreateChannel), "SR_OP_CM_DESTROY_CHANNEL": int64(OpCMDestroyChannel),
	"SR_OP_CM_CREATE_ID": int64(OpCMCreateID), "SR_OP_CM_MIGRATE_ID": int64(OpCMMigrateID),
	"SR_OP_CM_DESTROY_ID": int64(OpCMDestroyID), "SR_OP_CM_BIND_ADDR": int64(OpCMBindAddr),
	"SR_OP_CM_RESOLVE_ADDR": int64(OpCMResolveAddr), "SR_OP_CM_RESOLVE_ROUTE": int64(OpCMResolveRoute),
	"SR_OP_CM_SET_QP": int64(OpCMSetQP), "SR_OP_CM_INIT_QP_ATTR": int64(OpCMInitQPAttr),
	"SR_OP_CM_LISTEN": int64(OpCMListen), "SR_OP_CM_CONNECT": int64(OpCMConnect), "SR_OP_CM_ACCEPT": int64(OpCMAccept),
	"SR_OP_CM_REJECT": int64(OpCMReject), "SR_OP_CM_DISCONNECT": int64(OpCMDisconnect),
	"SR_OP_CM_GET_EVENTS": int64(OpCMGetEvents), "SR_OP_CM_QUERY_ID": int64(OpCMQueryID),
	"SR_OP_CM_SET_OPTION": int64(OpCMSetOption), "SR_OP_CM_ESTABLISH": int64(OpCMEstablish),
	"SR_MR_PROCESS": MRProcess, "SR_MR_MEMFD": MRMemfd, "SR_CM_PRIVATE_DATA_MAX": CMPrivateDataMax,
	"SR_CM_EVENT_UD": CMEventUD, "SR_FLUSH_LEVEL_SHIFT": FlushLevelShift,
	"SR_USAGE_CONNS": UsageConns, "SR_USAGE_FDS": UsageFDs, "SR_USAGE_PDS": UsagePDs, "SR_USAGE_MRS": UsageMRs,
	"SR_USAGE_CQS": UsageCQs, "SR_USAGE_SRQS": UsageSRQs, "SR_USAGE_QPS": UsageQPs, "SR_USAGE_CM_IDS": UsageCMIDs,
	"SR_USAGE_MAPPED_BYTES": UsageMappedBytes, "SR_USAGE_MAPPINGS": UsageMappings,
	"SR_USAGE_ENGINE_BYTES": UsageEngineBytes, "SR_USAGE_COUNT": UsageCount,
	"SR_CQ_TAIL": CQTail, "SR_CQ_HEAD": CQHead, "SR_CQ_ARMED": CQArmed, "SR_CQ_WAIT": CQWait,
	"SR_CQ_ENTRIES": CQEntries, "SR_CQ_ENTRY_SIZE": CQEntrySize, "SR_ARM_NONE": ArmNone, "SR_ARM_NEXT": ArmNext,
	"SR_ARM_SOLICITED": ArmSolicited, "SR_ARM_KIND": ArmKind, "SR_ARM_SLEEPING": ArmSleeping,
	"SR_POST_TAIL": PostTail, "SR_POST_HEAD": PostHead, "SR_POST_AWAKE": PostAwake, "SR_POST_DATA": PostData,
	"SR_POST_RING_DATA": PostRingData, "SR_MAX_POST_RECORD": MaxPostRecord, "SR_AWAKE_ASLEEP": AwakeAsleep,
	"SR_AWAKE_DRAINING": AwakeDraining, "SR_AWAKE_STOPPED": AwakeStopped, "SR_RECORD_POST": RecordPost,
	"SR_RECORD_PAD": RecordPad, "SR_EVENT_RING_OFF": EventRingOff, "SR_EVENT_RING_BYTES": EventRingBytes,
	"SR_EVENT_TAIL": EventTail, "SR_EVENT_HEAD": EventHead, "SR_EVENT_ENTRIES": EventEntries,
	"SR_EVENT_RING_CAP": EventRingCap, "SR_EVENT_ON_DEVICE": EventOnDevice, "SR_EVENT_ON_QP": EventOnQP,
	"SR_EVENT_ON_CQ": EventOnCQ, "SR_EVENT_ON_SRQ": EventOnSRQ,
}

var strConsts = map[string]string{"SR_DEFAULT_SOCKET": DefaultSocket, "SR_SOCKET_ENV": SocketEnv}

// codeNames are the header's SR_E_* names by code.
var codeNames = map[Code]string{
	CodeNoObject: "NO_OBJECT", CodeProtocol: "PROTOCOL", CodeUnsupported: "UNSUPPORTED",
	CodeNotShareable: "NOT_SHAREABLE", CodeDisconnected: "DISCONNECTED", CodeDevClosed: "DEV_CLOSED",
	CodeNoLink: "NO_LINK", CodeDevLimit: "DEV_LIMIT", CodeBadGIDIndex: "BAD_GID_INDEX", CodeDevInvalid: "DEV_INVALID",
	CodeQPState: "QP_STATE", CodeQueueFull: "QUEUE_FULL", CodeTooManySGE: "TOO_MANY_SGE",
	CodeInlineTooLong: "INLINE_TOO_LONG", CodeMsgTooLong: "MSG_TOO_LONG", CodeBadOpcode: "BAD_OPCODE",
	CodeBadWR: "BAD_WR", CodeHasSRQ: "HAS_SRQ", CodeQPDestroyed: "QP_DESTROYED", CodeQPModify: "QP_MODIFY",
	CodeSRQFull: "SRQ_FULL", CodeSRQArg: "SRQ_ARG", CodeSRQDestroyed: "SRQ_DESTROYED",
	CodeWRTooManySGE: "WR_TOO_MANY_SGE", CodeWRInlineSize: "WR_INLINE_SIZE", CodeWRLength: "WR_LENGTH",
	CodeWROpcode: "WR_OPCODE", CodeWRAtomicAlign: "WR_ATOMIC_ALIGN", CodeWRNoAH: "WR_NO_AH",
	CodeWRNoBind: "WR_NO_BIND", CodeCQCapacity: "CQ_CAPACITY", CodeCQError: "CQ_ERROR", CodeCQClosed: "CQ_CLOSED",
	CodeMRBadKey: "MR_BAD_KEY", CodeMRInvalidKey: "MR_INVALID_KEY", CodeMRWrongPD: "MR_WRONG_PD",
	CodeMRWrongQP: "MR_WRONG_QP", CodeMRAccess: "MR_ACCESS", CodeMROverflow: "MR_OVERFLOW",
	CodeMRBounds: "MR_BOUNDS", CodeMRAlign: "MR_ALIGN", CodeBusy: "BUSY", CodeMRLimit: "MR_LIMIT",
	CodeMRInvalid: "MR_INVALID", CodeMRState: "MR_STATE", CodeMRRand: "MR_RAND", CodeQuota: "QUOTA",
	CodeCMState: "CM_STATE", CodeCMInvalid: "CM_INVALID", CodeAddrInUse: "ADDR_IN_USE", CodeNoAddr: "NO_ADDR",
	CodeCMNoQP: "CM_NO_QP", CodeCMDestroyed: "CM_DESTROYED", CodeNoCM: "NO_CM", CodeTimeout: "TIMEOUT",
	CodeDevBusy: "DEV_BUSY", CodeFault: "FAULT", CodeVersion: "VERSION", CodePermission: "PERMISSION",
}

// errnoByName are the errno names the header's SR_E_* comments use.
var errnoByName = map[string]unix.Errno{
	"EINVAL": unix.EINVAL, "EPROTO": unix.EPROTO, "EOPNOTSUPP": unix.EOPNOTSUPP, "EFAULT": unix.EFAULT,
	"ENOTCONN": unix.ENOTCONN, "ENODEV": unix.ENODEV, "ENETDOWN": unix.ENETDOWN, "ENOMEM": unix.ENOMEM,
	"EIO": unix.EIO, "EACCES": unix.EACCES, "EBUSY": unix.EBUSY, "EDQUOT": unix.EDQUOT,
	"EADDRINUSE": unix.EADDRINUSE, "EADDRNOTAVAIL": unix.EADDRNOTAVAIL, "ETIMEDOUT": unix.ETIMEDOUT,
	"EPROTONOSUPPORT": unix.EPROTONOSUPPORT, "EPERM": unix.EPERM,
}

// TestWireStructsNoImplicitPadding: every Go wire struct's fields sit at
// their natural alignment with no gap between them, and hold only integers,
// byte arrays and other wire structs, so Go and C agree on every ABI and any
// byte pattern is a valid value.
func TestWireStructsNoImplicitPadding(t *testing.T) {
	for _, s := range structs {
		typ := reflect.TypeOf(s.v)
		checkPlain(t, s.c, typ)
		var end uintptr
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			if f.Offset != end {
				t.Errorf("%s.%s at %d, want %d (implicit padding)", s.c, f.Tag.Get("c"), f.Offset, end)
			}
			if f.Offset%uintptr(f.Type.Align()) != 0 {
				t.Errorf("%s.%s at %d: not aligned to %d", s.c, f.Tag.Get("c"), f.Offset, f.Type.Align())
			}
			end = f.Offset + f.Type.Size()
		}
		if end != typ.Size() || typ.Size()%8 != 0 {
			t.Errorf("%s: fields end at %d, size %d (want equal, a multiple of 8)", s.c, end, typ.Size())
		}
	}
}

func checkPlain(t *testing.T, name string, typ reflect.Type) {
	switch typ.Kind() {
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Int32, reflect.Int64:
	case reflect.Array:
		checkPlain(t, name, typ.Elem())
	case reflect.Struct:
		for i := 0; i < typ.NumField(); i++ {
			if typ.Field(i).Tag.Get("c") == "" {
				t.Errorf("%s.%s has no c tag", name, typ.Field(i).Name)
			}
			checkPlain(t, name, typ.Field(i).Type)
		}
	default:
		t.Errorf("%s: field kind %v is not a plain wire type", name, typ.Kind())
	}
}

// TestWireLayoutMatchesC compiles a program against proto.h that prints
// every struct's size, every field's offset and size, and every constant,
// and compares them with the Go definitions; it also requires every struct
// and constant the header defines to have its Go twin, and each SR_E_* code's
// errno (the comment after it) to be Code.Errno.
func TestWireLayoutMatchesC(t *testing.T) {
	cc := ""
	for _, c := range []string{"cc", "gcc", "clang"} {
		if p, err := exec.LookPath(c); err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		t.Skip("no C compiler (cc, gcc, clang)")
	}
	hdr, err := os.ReadFile(header)
	if err != nil {
		t.Fatal(err)
	}
	var prog bytes.Buffer
	prog.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"softroce/proto.h\"\nint main(void) {\n")
	want := map[string]string{}
	for _, s := range structs {
		typ := reflect.TypeOf(s.v)
		fmt.Fprintf(&prog, "printf(\"S %s %%zu\\n\", sizeof(struct %s));\n", s.c, s.c)
		want["S "+s.c] = strconv.Itoa(int(typ.Size()))
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			c := f.Tag.Get("c")
			fmt.Fprintf(&prog, "printf(\"F %s.%s %%zu %%zu\\n\", offsetof(struct %s, %s), sizeof(((struct %s *)0)->%s));\n",
				s.c, c, s.c, c, s.c, c)
			want["F "+s.c+"."+c] = fmt.Sprintf("%d %d", f.Offset, f.Type.Size())
		}
	}
	for n, v := range consts {
		fmt.Fprintf(&prog, "printf(\"C %s %%lld\\n\", (long long)(%s));\n", n, n)
		want["C "+n] = strconv.FormatInt(v, 10)
	}
	for n, v := range strConsts {
		fmt.Fprintf(&prog, "printf(\"C %s %%s\\n\", %s);\n", n, n)
		want["C "+n] = v
	}
	for c, n := range codeNames {
		fmt.Fprintf(&prog, "printf(\"C SR_E_%s %%lld\\n\", (long long)(SR_E_%s));\n", n, n)
		want["C SR_E_"+n] = strconv.Itoa(int(c))
	}
	prog.WriteString("return 0;\n}\n")
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(src, prog.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	inc := filepath.Join(filepath.Dir(header), "..")
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", inc, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		name, val, _ := strings.Cut(v, " ")
		got[k+" "+name] = val
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: C %q, Go %q", k, got[k], w)
		}
	}
	// Everything the header defines has a Go twin.
	known := map[string]bool{}
	for _, s := range structs {
		known[s.c] = true
	}
	for _, m := range regexp.MustCompile(`(?m)^struct (sr_[a-z0-9_]+) \{`).FindAllStringSubmatch(string(hdr), -1) {
		if !known[m[1]] {
			t.Errorf("struct %s has no Go twin", m[1])
		}
	}
	names := map[string]bool{"SR_SIZE": true}
	for n := range consts {
		names[n] = true
	}
	for n := range strConsts {
		names[n] = true
	}
	for _, n := range codeNames {
		names["SR_E_"+n] = true
	}
	for _, m := range regexp.MustCompile(`(?m)^(?:#define\s+|\s+)(SR_[A-Z0-9_]+)\b`).FindAllStringSubmatch(string(hdr), -1) {
		if !names[m[1]] {
			t.Errorf("constant %s has no Go twin", m[1])
		}
	}
	// Each SR_E_* code's comment names its errno.
	seen := 0
	for _, m := range regexp.MustCompile(`SR_E_([A-Z_]+) = (\d+), +/\* (E[A-Z]+)\b`).FindAllStringSubmatch(string(hdr), -1) {
		n, _ := strconv.Atoi(m[2])
		seen++
		if e := Code(n).Errno(); e != errnoByName[m[3]] || e == 0 {
			t.Errorf("SR_E_%s: header says %s, Code.Errno %s", m[1], m[3], unix.ErrnoName(e))
		}
	}
	if seen != len(codeNames) || seen != NumCodes-1 {
		t.Errorf("%d codes with an errno comment in the header, %d named in Go, %d codes", seen, len(codeNames), NumCodes-1)
	}
}

func TestAppendRead(t *testing.T) {
	in := SendWR{WRID: 0x1122334455667788, Opcode: 4, NumSGE: 2, SendFlags: 2, RemoteAddr: 9, CompareAdd: 7}
	in.AH.DGID[15] = 1
	b := Append([]byte{0xAA}, &in)
	if len(b) != 1+Size[SendWR]() {
		t.Fatalf("len %d", len(b))
	}
	var out SendWR
	rest, ok := Read(b[1:], &out)
	if !ok || len(rest) != 0 || out != in {
		t.Fatalf("read %+v ok=%v rest=%d", out, ok, len(rest))
	}
	if _, ok := Read(b[2:], &out); ok {
		t.Fatal("short read accepted")
	}
	var s [8]byte
	CString(s[:], "softroce0")
	if GoString(s[:]) != "softroc" {
		t.Fatalf("CString truncation: %q", GoString(s[:]))
	}
	if a := testing.AllocsPerRun(100, func() { Read(b[1:], &out) }); a != 0 {
		t.Fatalf("%v allocations per Read", a)
	}
}
