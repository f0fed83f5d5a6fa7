package qp

import "testing"

// rxe61 is what kernel rxe reports on the lab's kernel (Debian 6.1.0-57, rdma_rxe.ko): the
// constants rxe_add stores into ib_device_attr (read from the module's machine code; they
// are rxe_param.h with DEFAULT_MAX_VALUE = 1<<20) and match a published `ibv_devinfo -v` of
// rxe: max_qp 1048560, max_qp_wr 1048576, max_cq 1048576, max_cqe 32767, max_mr 524287,
// max_pd 1048576, max_mw 524287, max_ah 32767, max_srq 917503, max_srq_wr 1048576,
// max_srq_sge 27, max_pkeys 64, max_inline_data 512 (RXE_MAX_SGE * sizeof(ib_sge)).
var rxe61 = []struct {
	name string
	got  func(d *DeviceAttr) int
	rxe  int
	// why is set when softroce's default is deliberately smaller.
	why string
}{
	{"max_qp", func(d *DeviceAttr) int { return d.MaxQP }, 1048560,
		"memory: roce.Device preallocates its QPN table (pointers for nextpow2(max_qp+16) QPNs: 1 MiB per device at 64 Ki, 8 MiB at rxe's value)"},
	{"max_qp_wr", func(d *DeviceAttr) int { return d.MaxQPWR }, 1048576, ""},
	{"max_sge", func(d *DeviceAttr) int { return d.MaxSGE }, 32, ""},
	{"max_sge_rd", func(d *DeviceAttr) int { return d.MaxSGERD }, 32, ""},
	{"max_cq", func(d *DeviceAttr) int { return d.MaxCQ }, 1048576, ""},
	{"max_cqe", func(d *DeviceAttr) int { return d.MaxCQE }, 32767, ""},
	{"max_mr", func(d *DeviceAttr) int { return d.MaxMR }, 524287, ""},
	{"max_pd", func(d *DeviceAttr) int { return d.MaxPD }, 1048576, ""},
	{"max_qp_rd_atom", func(d *DeviceAttr) int { return d.MaxQPRDAtom }, 128, ""},
	{"max_res_rd_atom", func(d *DeviceAttr) int { return d.MaxResRDAtom }, 0x3f000, ""},
	{"max_qp_init_rd_atom", func(d *DeviceAttr) int { return d.MaxQPInitRDAtom }, 128, ""},
	{"atomic_cap", func(d *DeviceAttr) int { return int(d.AtomicCap) }, int(AtomicHCA), ""},
	{"max_mw", func(d *DeviceAttr) int { return d.MaxMW }, 524287, ""},
	{"max_mcast_grp", func(d *DeviceAttr) int { return d.MaxMcastGrp }, 8192,
		"no multicast groups (the engine drops the multicast QPN; ibv_attach_mcast and rdma_join_multicast are EOPNOTSUPP): 0 says so, as rdma-core's suite reads it"},
	{"max_mcast_qp_attach", func(d *DeviceAttr) int { return d.MaxMcastQPAttach }, 56,
		"no multicast groups (the engine drops the multicast QPN; ibv_attach_mcast and rdma_join_multicast are EOPNOTSUPP): 0 says so, as rdma-core's suite reads it"},
	{"max_total_mcast_qp_attach", func(d *DeviceAttr) int { return d.MaxTotalMcastQPAttach }, 0x70000,
		"no multicast groups (the engine drops the multicast QPN; ibv_attach_mcast and rdma_join_multicast are EOPNOTSUPP): 0 says so, as rdma-core's suite reads it"},
	{"max_ah", func(d *DeviceAttr) int { return d.MaxAH }, 32767, ""},
	{"max_srq", func(d *DeviceAttr) int { return d.MaxSRQ }, 917503, ""},
	{"max_srq_wr", func(d *DeviceAttr) int { return d.MaxSRQWR }, 1048576, ""},
	{"max_srq_sge", func(d *DeviceAttr) int { return d.MaxSRQSGE }, 27, ""},
	{"max_pkeys", func(d *DeviceAttr) int { return d.MaxPKeys }, 64,
		"one P_Key table entry (0xFFFF): rxe's own port has pkey_tbl_len 1, so only index 0 works there too; CheckModify refuses PKEY_INDEX >= max_pkeys"},
	{"local_ca_ack_delay", func(d *DeviceAttr) int { return int(d.LocalCAAckDelay) }, 15, ""},
	{"max_inline_data", func(d *DeviceAttr) int { return d.MaxInlineData }, 512, ""},
	{"max_msg_sz", func(d *DeviceAttr) int { return int(d.MaxMsgSize) }, 0x800000, ""},
}

// TestDeviceAttrNotBelowRxe61: every default device attribute is at least the lab kernel
// rxe's, except the documented memory/semantics exceptions (which must really be below, or
// the exception is stale).
func TestDeviceAttrNotBelowRxe61(t *testing.T) {
	d := DefaultDeviceAttr()
	for _, c := range rxe61 {
		got := c.got(&d)
		switch {
		case c.why == "" && got < c.rxe:
			t.Errorf("%s = %d < rxe 6.1's %d", c.name, got, c.rxe)
		case c.why != "" && got >= c.rxe:
			t.Errorf("%s = %d is no longer below rxe's %d: drop the exception", c.name, got, c.rxe)
		case c.why != "":
			t.Logf("%s = %d (rxe %d): %s", c.name, got, c.rxe, c.why)
		}
	}
	if p := DefaultPortAttr(1500); p.GIDTblLen < 1024 || p.MaxMsgSz < 0x800000 || p.MaxMTU != MTU4096 {
		t.Errorf("port: gid_tbl_len %d, max_msg_sz %d, max_mtu %v (rxe: 1024, 8 MiB, 4096)", p.GIDTblLen, p.MaxMsgSz, p.MaxMTU)
	}
}
