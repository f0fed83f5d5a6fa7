package cq

import "testing"

// TestStatusTableComplete: every ibv_wc_status value 0..21 (IBV_WC_SUCCESS..IBV_WC_GENERAL_ERR,
// IBTA 11.4.2.1) has the number and the ibv_wc_status_str text of libibverbs (enum_strs.c),
// written out here independently of cq.go; values past the table are "unknown" as there.
func TestStatusTableComplete(t *testing.T) {
	want := []struct {
		s    Status
		text string
	}{
		{StatusSuccess, "success"},
		{StatusLocLenErr, "local length error"},
		{StatusLocQPOpErr, "local QP operation error"},
		{StatusLocEECOpErr, "local EE context operation error"},
		{StatusLocProtErr, "local protection error"},
		{StatusWRFlushErr, "Work Request Flushed Error"},
		{StatusMWBindErr, "memory management operation error"},
		{StatusBadRespErr, "bad response error"},
		{StatusLocAccessErr, "local access error"},
		{StatusRemInvReqErr, "remote invalid request error"},
		{StatusRemAccessErr, "remote access error"},
		{StatusRemOpErr, "remote operation error"},
		{StatusRetryExcErr, "transport retry counter exceeded"},
		{StatusRNRRetryExcErr, "RNR retry counter exceeded"},
		{StatusLocRDDViolErr, "local RDD violation error"},
		{StatusRemInvRDReqErr, "remote invalid RD request"},
		{StatusRemAbortErr, "aborted error"},
		{StatusInvEECNErr, "invalid EE context number"},
		{StatusInvEECStateErr, "invalid EE context state"},
		{StatusFatalErr, "fatal error"},
		{StatusRespTimeoutErr, "response timeout error"},
		{StatusGeneralErr, "general error"},
	}
	for i, w := range want {
		if int(w.s) != i {
			t.Errorf("%q: value %d, ibverbs has %d", w.text, w.s, i)
		}
		if w.s.String() != w.text {
			t.Errorf("status %d: %q, want %q", i, w.s.String(), w.text)
		}
	}
	for _, s := range []Status{Status(len(want)), 255} {
		if s.String() != "unknown" {
			t.Errorf("status %d: %q, want unknown", s, s.String())
		}
	}
	// Work completion opcodes and flags: ibv_wc_opcode / ibv_wc_flags numbering.
	ops := map[Opcode]uint8{OpSend: 0, OpRDMAWrite: 1, OpRDMARead: 2, OpCompSwap: 3, OpFetchAdd: 4,
		OpBindMW: 5, OpLocalInv: 6, OpFlush: 8, OpAtomicWrite: 9, OpRecv: 128, OpRecvRDMAWithImm: 129}
	for o, v := range ops {
		if uint8(o) != v || o.String() == "UNKNOWN" {
			t.Errorf("opcode %v = %d, want %d", o, uint8(o), v)
		}
	}
	if FlagGRH != 1 || FlagWithImm != 2 || FlagWithInv != 8 {
		t.Error("ibv_wc_flags: GRH 1, WITH_IMM 2, WITH_INV 8 (1 << 3; bit 2 is IP_CSUM_OK)")
	}
}
