// Memory windows through a daemon, under ASan/UBSan: two RC QPs of one context
// connected to each other through the daemon's device (GID 1); a type 1
// window bound with ibv_bind_mw and a type 2 window bound with
// IBV_WR_BIND_MW and ibv_wr_bind_mw; remote WRITEs through the windows'
// R_Keys land (byte for byte) and stay inside them; LOCAL_INV (both post APIs),
// SEND_WITH_INV (the receive reports the invalidated R_Key, ibv_poll_cq and
// the ibv_cq_ex API), an unbind and ibv_dealloc_mw each leave the old R_Key
// giving the peer a remote access error. Needs $SOFTROCE_SOCKET (test/clib
// runs it against an in-test daemon); without a daemon it exits 77 (skipped).
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "daemon.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq_ex *cqx;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb; // qa: the peer; qb: owns the windows
static uint8_t *src, *dst;     // src: qa's memory (ma); dst: qb's (mb), under the windows
static struct ibv_mr *ma, *mb;
enum { SZ = 8192 };

static struct ibv_qp *make_qp(void)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
				  IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV,
	};
	return ibv_create_qp_ex(ctx, &a);
}

static int connect_qp(struct ibv_qp *q, uint32_t remote)
{
	return connect_rc(ctx, q, remote, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE, 1);
}

// fresh_pair replaces both QPs with a new connected pair (a remote access
// error moves both ends of an RC connection to ERR).
static int fresh_pair(void)
{
	if (qa)
		CHECK(ibv_destroy_qp(qa) == 0);
	if (qb)
		CHECK(ibv_destroy_qp(qb) == 0);
	qa = make_qp();
	qb = make_qp();
	if (!qa || !qb)
		return -1;
	if (connect_qp(qa, qb->qp_num) || connect_qp(qb, qa->qp_num))
		return -1;
	return 0;
}

// wait1 polls one completion (10 s at most).
static int wait1(struct ibv_wc *wc)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			return 0;
		sched_yield();
	}
}

// expect polls one completion and checks its WR, status and opcode.
static void expect(const char *what, uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	int ok = wait1(&wc) == 1 && wc.wr_id == wr_id && wc.status == st && wc.opcode == op;
	if (!ok)
		fprintf(stderr, "%s: completion wr_id %llu status %d (%s) opcode %d, want %llu %d %d\n", what,
			(unsigned long long)wc.wr_id, wc.status, ibv_wc_status_str(wc.status), wc.opcode,
			(unsigned long long)wr_id, st, op);
	CHECK(ok);
}

// write_via WRITEs n bytes from src to dst+off through rkey and returns the status.
static enum ibv_wc_status write_via(uint32_t rkey, size_t off, size_t n, uint64_t wr_id)
{
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(wr_id * 31 + i);
	struct ibv_sge s = {.addr = (uintptr_t)src, .length = (uint32_t)n, .lkey = ma->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst + off;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(qa, &wr, &bad) == 0);
	struct ibv_wc wc;
	if (wait1(&wc) != 1 || wc.wr_id != wr_id) {
		CHECK(0);
		return IBV_WC_GENERAL_ERR;
	}
	if (wc.status == IBV_WC_SUCCESS)
		CHECK(!memcmp(src, dst + off, n));
	return wc.status;
}

static void type1(void)
{
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw != NULL);
	if (!mw)
		return;
	CHECK(mw->type == IBV_MW_TYPE_1 && mw->pd == pd && mw->context == ctx);
	uint32_t k0 = mw->rkey;
	// LOCAL_WRITE in a window's access is taken and grants nothing (as rxe).
	struct ibv_mw_bind b = {.wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
				.bind_info = {.mr = mb, .addr = (uintptr_t)dst + 1024, .length = 2048,
					      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE}};
	CHECK(ibv_bind_mw(qb, mw, &b) == 0);
	expect("type 1 bind", 11, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	uint32_t k1 = mw->rkey;
	CHECK(k1 != k0 && (k1 >> 8) == (k0 >> 8));
	CHECK(write_via(k1, 1024, 2048, 12) == IBV_WC_SUCCESS);
	CHECK(ibv_dereg_mr(mb) == EBUSY); // a bound window holds its MR
	// A zero-based type 1 bind is refused at once (o10-36.2.2).
	struct ibv_mw_bind zb = b;
	zb.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
	CHECK(ibv_bind_mw(qb, mw, &zb) == EINVAL && mw->rkey == k1);
	// A zero-length bind unbinds: the R_Key changes and the old one is refused.
	struct ibv_mw_bind ub = {.wr_id = 13, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = {.mr = mb, .addr = (uintptr_t)dst, .length = 0}};
	CHECK(ibv_bind_mw(qb, mw, &ub) == 0);
	expect("type 1 unbind", 13, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	CHECK(mw->rkey != k1);
	CHECK(write_via(k1, 1024, 64, 14) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	// Rebound; a WRITE past the window's end is refused.
	b.wr_id = 15;
	CHECK(ibv_bind_mw(qb, mw, &b) == 0);
	expect("type 1 rebind", 15, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	uint32_t k2 = mw->rkey;
	CHECK(write_via(k2, 2048, 1024, 16) == IBV_WC_SUCCESS);
	CHECK(write_via(k2, 3000, 100, 17) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	// LOCAL_INV does not invalidate a type 1 window: a local protection error.
	struct ibv_send_wr inv = {.wr_id = 18, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED}, *bad;
	inv.invalidate_rkey = k2;
	CHECK(ibv_post_send(qb, &inv, &bad) == 0);
	expect("LOCAL_INV of a type 1 window", 18, IBV_WC_LOC_PROT_ERR, IBV_WC_LOCAL_INV);
	CHECK(fresh_pair() == 0);
	// Deallocated while bound: the R_Key is refused, the MR free again.
	CHECK(write_via(k2, 1024, 8, 19) == IBV_WC_SUCCESS);
	CHECK(ibv_dealloc_mw(mw) == 0);
	CHECK(write_via(k2, 1024, 8, 20) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
}

// bind2 binds a type 2 window to dst[0, len) under rkey: through
// ibv_post_send, or the ibv_wr_* API.
static void bind2(struct ibv_mw *mw, uint32_t rkey, size_t len, uint64_t wr_id, int wr_api)
{
	struct ibv_mw_bind_info info = {.mr = mb, .addr = (uintptr_t)dst, .length = len,
					.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
	if (wr_api) {
		struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qb);
		ibv_wr_start(x);
		x->wr_id = wr_id;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(x, mw, rkey, &info);
		CHECK(ibv_wr_complete(x) == 0);
	} else {
		struct ibv_send_wr wr = {.wr_id = wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED}, *bad;
		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = rkey;
		wr.bind_mw.bind_info = info;
		CHECK(ibv_post_send(qb, &wr, &bad) == 0);
	}
	expect(wr_api ? "ibv_wr_bind_mw" : "IBV_WR_BIND_MW", wr_id, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
}

static void type2(void)
{
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	if (!mw)
		return;
	struct ibv_send_wr *bad;
	// IBV_WR_BIND_MW, then LOCAL_INV through ibv_post_send.
	uint32_t k1 = ibv_inc_rkey(mw->rkey);
	bind2(mw, k1, 4096, 21, 0);
	CHECK(write_via(k1, 100, 500, 22) == IBV_WC_SUCCESS);
	struct ibv_send_wr inv = {.wr_id = 23, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED};
	inv.invalidate_rkey = k1;
	CHECK(ibv_post_send(qb, &inv, &bad) == 0);
	expect("LOCAL_INV", 23, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);
	CHECK(write_via(k1, 100, 500, 24) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	// ibv_wr_bind_mw, then the peer's SEND_WITH_INV (ibv_wr_send_inv): the
	// receive completion names the R_Key, read through the ibv_cq_ex API.
	uint32_t k2 = ibv_inc_rkey(k1);
	bind2(mw, k2, 4096, 25, 1);
	CHECK(write_via(k2, 0, 4096, 26) == IBV_WC_SUCCESS);
	struct ibv_sge rs = {.addr = (uintptr_t)dst + 6000, .length = 64, .lkey = mb->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 27, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(qb, &rwr, &rbad) == 0);
	struct ibv_qp_ex *xa = ibv_qp_to_qp_ex(qa);
	ibv_wr_start(xa);
	xa->wr_id = 28;
	xa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(xa, k2);
	ibv_wr_set_sge(xa, ma->lkey, (uintptr_t)src, 16);
	CHECK(ibv_wr_complete(xa) == 0);
	int got_send = 0, got_recv = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got_send + got_recv < 2) {
		struct ibv_poll_cq_attr pa = {0};
		if (ibv_start_poll(cqx, &pa) == 0) {
			do {
				if (cqx->wr_id == 28) {
					got_send = cqx->status == IBV_WC_SUCCESS && ibv_wc_read_opcode(cqx) == IBV_WC_SEND;
				} else if (cqx->wr_id == 27) {
					got_recv = cqx->status == IBV_WC_SUCCESS && ibv_wc_read_opcode(cqx) == IBV_WC_RECV &&
						   (ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_INV) &&
						   ibv_wc_read_invalidated_rkey(cqx) == k2 && ibv_wc_read_byte_len(cqx) == 16;
				}
			} while (ibv_next_poll(cqx) == 0);
			ibv_end_poll(cqx);
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			break;
	}
	CHECK(got_send && got_recv);
	CHECK(write_via(k2, 0, 64, 29) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	// The same with ibv_post_send's SEND_WITH_INV and ibv_poll_cq.
	uint32_t k3 = ibv_inc_rkey(k2);
	bind2(mw, k3, 4096, 30, 0);
	CHECK(ibv_post_recv(qb, &rwr, &rbad) == 0);
	struct ibv_sge ss = {.addr = (uintptr_t)src, .length = 8, .lkey = ma->lkey};
	struct ibv_send_wr si = {.wr_id = 31, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				 .send_flags = IBV_SEND_SIGNALED};
	si.invalidate_rkey = k3;
	CHECK(ibv_post_send(qa, &si, &bad) == 0);
	struct ibv_wc wc[2];
	CHECK(wait1(&wc[0]) == 1 && wait1(&wc[1]) == 1);
	struct ibv_wc *r = wc[0].wr_id == 27 ? &wc[0] : &wc[1];
	CHECK(r->wr_id == 27 && r->status == IBV_WC_SUCCESS && (r->wc_flags & IBV_WC_WITH_INV) && r->invalidated_rkey == k3);
	CHECK(write_via(k3, 0, 64, 32) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	// ibv_wr_local_inv.
	uint32_t k4 = ibv_inc_rkey(k3);
	bind2(mw, k4, 4096, 33, 1);
	struct ibv_qp_ex *xb = ibv_qp_to_qp_ex(qb);
	ibv_wr_start(xb);
	xb->wr_id = 34;
	xb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(xb, k4);
	CHECK(ibv_wr_complete(xb) == 0);
	expect("ibv_wr_local_inv", 34, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);
	CHECK(write_via(k4, 0, 64, 35) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	// A bind of a bound type 2 window fails (it must be free): MW_BIND_ERR.
	uint32_t k5 = ibv_inc_rkey(k4);
	bind2(mw, k5, 4096, 36, 0);
	struct ibv_send_wr again = {.wr_id = 37, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
	again.bind_mw.mw = mw;
	again.bind_mw.rkey = ibv_inc_rkey(k5);
	again.bind_mw.bind_info = (struct ibv_mw_bind_info){.mr = mb, .addr = (uintptr_t)dst, .length = 8};
	CHECK(ibv_post_send(qb, &again, &bad) == 0);
	expect("bind of a bound type 2 window", 37, IBV_WC_MW_BIND_ERR, IBV_WC_BIND_MW);
	// Deallocated while bound: the R_Key is refused.
	CHECK(ibv_dealloc_mw(mw) == 0);
	CHECK(fresh_pair() == 0);
	CHECK(write_via(k5, 0, 64, 38) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
}

int main(void)
{
	int rc;
	ctx = open_device("mw", &rc);
	if (!ctx)
		return rc;
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
	      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B));
	pd = ibv_alloc_pd(ctx);
	struct ibv_cq_init_attr_ex ca = {.cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS};
	cqx = ibv_create_cq_ex(ctx, &ca);
	CHECK(pd && cqx);
	if (!pd || !cqx)
		return check_done("mw");
	cq = ibv_cq_ex_to_cq(cqx);
	// A type the device does not have: EINVAL (EOPNOTSUPP would say "no windows").
	errno = 0;
	CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL);
	src = malloc(SZ);
	dst = malloc(SZ);
	ma = ibv_reg_mr(pd, src, SZ, IBV_ACCESS_LOCAL_WRITE);
	mb = ibv_reg_mr(pd, dst, SZ, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(src && dst && ma && mb);
	if (!ma || !mb || fresh_pair()) {
		CHECK(0);
		return check_done("mw");
	}
	// The MR has no remote access of its own: only the windows open it.
	CHECK(write_via(mb->rkey, 0, 8, 1) == IBV_WC_REM_ACCESS_ERR);
	CHECK(fresh_pair() == 0);
	type1();
	type2();
	// A window keeps its PD busy.
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0);
	CHECK(ibv_dereg_mr(ma) == 0 && ibv_dereg_mr(mb) == 0);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	if (mw)
		CHECK(ibv_dealloc_mw(mw) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	free(src);
	free(dst);
	return check_done("mw");
}
