// Objects changed in place and RDMA ATOMIC WRITE, through a daemon, under
// ASan/UBSan: ibv_resize_cq (sizes out of range and below the completions
// held refused with EINVAL; the unpolled completions kept in order; a thread
// blocked on the completion channel woken across resizes; resizes between
// polls of a stream of WRITEs), ibv_rereg_mr (libibverbs' input checks, the
// daemon's refusals, access, translation and PD changes with the keys kept,
// a peer's WRITE refused once remote write is gone, a receive into a region
// moved to another PD failing, its flushes cleaned from the CQ by the move to
// RESET), ibv_wr_atomic_write on a QP with no
// inline capacity, with the device's IB_UVERBS_DEVICE_ATOMIC_WRITE, and
// ibv_wr_flush as a program built against rdma-core 45+ calls it. Two RC
// QPs of one context connected to each other through the daemon's device (GID
// 1). Needs $SOFTROCE_SOCKET (the Go test test/clib runs it); without a
// daemon it exits 77 (skipped).
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "daemon.h"

// IB_UVERBS_DEVICE_ATOMIC_WRITE: rdma-core 44's headers predate the name.
#define DEVICE_ATOMIC_WRITE (1ULL << 40)

// FLUSH as rdma-core 45+ defines it (44's headers, which this test builds with, have none of
// it): IB_UVERBS_DEVICE_FLUSH_GLOBAL, IBV_QP_EX_WITH_FLUSH, IBV_WC_FLUSH,
// IBV_ACCESS_FLUSH_GLOBAL, IBV_FLUSH_GLOBAL, IBV_FLUSH_RANGE, IBV_FLUSH_MR; and struct
// ibv_qp_ex, whose member after wr_atomic_write (44's last) is wr_flush, so that ibv_wr_flush
// here is the call a program built against the newer headers makes.
#define DEVICE_FLUSH_GLOBAL (1ULL << 38)
#define QP_EX_WITH_FLUSH (1ULL << 11)
#define WC_FLUSH 8
#define ACCESS_FLUSH_GLOBAL (1 << 8)
enum { FLUSH_GLOBAL = 1, FLUSH_RANGE = 0, FLUSH_MR = 1 };
struct qp_ex_45 {
	struct ibv_qp_ex x;
	void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_comp_channel *ch;
static struct ibv_qp *qa, *qb;

static struct ibv_qp *make_qp(uint64_t send_ops)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | (send_ops ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0),
		.pd = pd,
		.send_ops_flags = send_ops,
	};
	return ibv_create_qp_ex(ctx, &a);
}

// connect_qp moves q from any state to RTS towards remote (RESET first).
static int connect_qp(struct ibv_qp *q, uint32_t remote)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
	if (ibv_modify_qp(q, &a, IBV_QP_STATE))
		return -1;
	return connect_rc(ctx, q, remote, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE, 4);
}

static int reconnect(void)
{
	return connect_qp(qa, qb->qp_num) || connect_qp(qb, qa->qp_num);
}

// wait_wc waits (through the completion channel, 10 s at most) for n completions.
static int wait_wc(struct ibv_wc *wc, int n)
{
	return wait_channel(cq, ch, wc, n);
}

// post_write posts a signaled WRITE of n bytes from src (mr sm) to raddr/rkey on qa.
static int post_write(uint64_t id, void *src, struct ibv_mr *sm, uint32_t n, void *raddr, uint32_t rkey)
{
	struct ibv_sge s = {.addr = (uintptr_t)src, .length = n, .lkey = sm->lkey};
	struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED}, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)raddr;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(qa, &w, &bad);
}

static int waiter_ok;

// waiter blocks on the completion channel (20 s at most) for the armed event.
static void *waiter(void *arg)
{
	(void)arg;
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct ibv_cq *ecq;
	void *ectx;
	if (poll(&p, 1, 20000) == 1 && ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq) {
		ibv_ack_cq_events(cq, 1);
		waiter_ok = 1;
	}
	return NULL;
}

static void resize_cq(uint8_t *src, struct ibv_mr *sm, uint8_t *dst, struct ibv_mr *dm)
{
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(ibv_resize_cq(cq, 0) == EINVAL);
	CHECK(ibv_resize_cq(cq, da.max_cqe + 1) == EINVAL);

	// Three completions held (the moderated event fires at 3 queued): below them is EINVAL,
	// exactly them keeps all three, in order.
	struct ibv_modify_cq_attr mod = {.attr_mask = IBV_CQ_ATTR_MODERATE, .moderate = {.cq_count = 3}};
	CHECK(ibv_modify_cq(cq, &mod) == 0);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	for (uint64_t i = 0; i < 3; i++)
		CHECK(post_write(10 + i, src, sm, 64, dst, dm->rkey) == 0);
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(poll(&p, 1, 10000) == 1 && ibv_get_cq_event(ch, &ecq, &ectx) == 0);
	ibv_ack_cq_events(cq, 1);
	CHECK(ibv_resize_cq(cq, 2) == EINVAL);
	CHECK(ibv_resize_cq(cq, 3) == 0 && cq->cqe == 3);
	mod.moderate.cq_count = 1;
	CHECK(ibv_modify_cq(cq, &mod) == 0);
	struct ibv_wc wc[8];
	CHECK(wait_wc(wc, 3) == 3);
	for (int i = 0; i < 3; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == 10 + (uint64_t)i);

	// A thread blocked on the channel with the CQ armed; the CQ resized under it; the next
	// completion wakes it.
	CHECK(ibv_resize_cq(cq, 64) == 0 && cq->cqe == 64);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	pthread_t th;
	CHECK(pthread_create(&th, NULL, waiter, NULL) == 0);
	for (int i = 0; i < 8; i++)
		CHECK(ibv_resize_cq(cq, 8 << (i % 4)) == 0);
	CHECK(post_write(20, src, sm, 64, dst, dm->rkey) == 0);
	pthread_join(th, NULL);
	CHECK(waiter_ok);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].wr_id == 20 && wc[0].status == IBV_WC_SUCCESS);

	// A stream of WRITEs, 4 outstanding, the CQ resized between polls: each completion once,
	// in order.
	uint64_t posted = 0, done = 0;
	int bad = 0;
	while (done < 400 && !bad) {
		while (posted < 400 && posted - done < 4)
			if (post_write(1000 + posted++, src, sm, 64, dst, dm->rkey))
				bad = 1;
		if (ibv_resize_cq(cq, 4 + (int)(done % 13)) != 0)
			bad = 1;
		int k = wait_wc(wc, 1);
		if (k != 1 || wc[0].status != IBV_WC_SUCCESS || wc[0].wr_id != 1000 + done)
			bad = 1;
		done++;
	}
	CHECK(!bad && done == 400 && ibv_poll_cq(cq, 8, wc) == 0);
}

static void rereg_mr(uint8_t *src, struct ibv_mr *sm)
{
	size_t n = 4096;
	uint8_t *b1 = calloc(1, n), *b2 = calloc(1, n);
	struct ibv_mr *m = ibv_reg_mr(pd, b1, n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(m != NULL);
	if (!m)
		return;
	uint32_t key = m->rkey;
	// libibverbs' input checks, then the daemon's.
	errno = 0;
	CHECK(ibv_rereg_mr(m, 8, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, n, 0) == IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(m, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) ==
		      IBV_REREG_MR_ERR_CMD && errno == EINVAL);

	// Remote write taken away: the peer's WRITE is a remote access error; given back, it lands.
	struct ibv_wc wc[2];
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == 0);
	CHECK(m->lkey == key && m->rkey == key);
	CHECK(post_write(1, src, sm, 64, b1, key) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR);
	CHECK(reconnect() == 0);
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
	memset(src, 0x5a, 64);
	CHECK(post_write(2, src, sm, 64, b1, key) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS && b1[63] == 0x5a);

	// New memory at a new address, same keys: WRITEs land there; the old memory is the
	// program's again (freed here) once ibv_rereg_mr returned.
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b2, n, 0) == 0);
	CHECK(m->addr == b2 && m->length == n && m->rkey == key);
	free(b1);
	memset(src, 0x6b, 64);
	CHECK(post_write(3, src, sm, 64, b2 + 128, key) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS && b2[128] == 0x6b && b2[191] == 0x6b);

	// Another PD: a receive into the region fails, the sender sees a remote operation error;
	// back in the QP's PD, SENDs land. A PD holding the region is busy.
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd2 && ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && m->pd == pd2);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	struct ibv_sge rs = {.addr = (uintptr_t)b2, .length = 64, .lkey = m->lkey};
	struct ibv_recv_wr r = {.wr_id = 4, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(qb, &r, &rbad) == 0);
	struct ibv_sge ss = {.addr = (uintptr_t)src, .length = 64, .lkey = sm->lkey};
	struct ibv_send_wr s = {.wr_id = 5, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED}, *sbad;
	CHECK(ibv_post_send(qa, &s, &sbad) == 0);
	struct ibv_wc ew[2];
	CHECK(wait_wc(ew, 2) == 2);
	int sent = ew[0].wr_id == 5 ? 0 : 1;
	CHECK(ew[sent].status == IBV_WC_REM_OP_ERR && ew[!sent].status != IBV_WC_SUCCESS);
	// A receive posted to the QP in ERR is flushed; left unpolled, the move to RESET takes
	// it out of the CQ (as rdma-core's mlx4 and mlx5 providers clean theirs).
	CHECK(ibv_post_recv(qb, &r, &rbad) == 0); // (a round trip: qb has seen an error)
	CHECK(reconnect() == 0);
	CHECK(ibv_poll_cq(cq, 2, ew) == 0);
	CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0 && m->pd == pd);
	CHECK(ibv_dealloc_pd(pd2) == 0);
	memset(src, 0x7c, 64);
	CHECK(ibv_post_recv(qb, &r, &rbad) == 0);
	CHECK(ibv_post_send(qa, &s, &sbad) == 0);
	CHECK(wait_wc(wc, 2) == 2 && wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS &&
	      b2[0] == 0x7c);
	CHECK(ibv_dereg_mr(m) == 0);
	free(b2);
}

static void atomic_write(void)
{
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && (dx.device_cap_flags_ex & DEVICE_ATOMIC_WRITE));
	// A QP with the ibv_wr_* API and ATOMIC WRITE, and no inline capacity (pyverbs' default).
	struct ibv_qp *saved = qa;
	qa = make_qp(IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE);
	CHECK(qa != NULL);
	if (!qa) {
		qa = saved;
		return;
	}
	CHECK(reconnect() == 0);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qa);
	uint64_t *target = aligned_alloc(64, 64);
	memset(target, 0, 64);
	struct ibv_mr *tm = ibv_reg_mr(pd, target, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(x && tm);
	if (!x || !tm)
		return;
	uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	ibv_wr_start(x);
	x->wr_id = 30;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(x, tm->rkey, (uintptr_t)&target[2], data);
	data[0] = 9; // the operand was taken by the call
	CHECK(ibv_wr_complete(x) == 0);
	struct ibv_wc wc[1];
	CHECK(wait_wc(wc, 1) == 1 && wc[0].wr_id == 30 && wc[0].status == IBV_WC_SUCCESS &&
	      wc[0].opcode == IBV_WC_ATOMIC_WRITE);
	uint8_t want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	CHECK(memcmp(&target[2], want, 8) == 0);
	// Misaligned: refused when posted.
	ibv_wr_start(x);
	ibv_wr_atomic_write(x, tm->rkey, (uintptr_t)target + 4, data);
	CHECK(ibv_wr_complete(x) == EINVAL);
	// ibv_post_send with one 8-byte SGE.
	uint64_t word = 0x1122334455667788ULL;
	struct ibv_mr *wm = ibv_reg_mr(pd, &word, 8, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)&word, .length = 8, .lkey = wm ? wm->lkey : 0};
	struct ibv_send_wr w = {.wr_id = 31, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_ATOMIC_WRITE,
				.send_flags = IBV_SEND_SIGNALED}, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)&target[3];
	w.wr.rdma.rkey = tm->rkey;
	CHECK(wm && ibv_post_send(qa, &w, &bad) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].wr_id == 31 && wc[0].status == IBV_WC_SUCCESS && target[3] == word);
	CHECK(ibv_dereg_mr(wm) == 0 && ibv_dereg_mr(tm) == 0);
	free(target);
	CHECK(ibv_destroy_qp(qa) == 0);
	qa = saved;
	CHECK(reconnect() == 0);
}

// flush posts ibv_wr_flush (rdma-core 45+) from qa to qb, whose QP has
// IBV_ACCESS_FLUSH_GLOBAL: a WRITE and a global FLUSH of its range complete
// (IBV_WC_FLUSH) with the bytes placed; the Memory Region level ignores the
// range (IBTA A19.4.1); a FLUSH of a region without the FLUSH access is a
// remote access error.
static void flush(void)
{
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && (dx.device_cap_flags_ex & DEVICE_FLUSH_GLOBAL));
	struct ibv_qp *saved = qa;
	qa = make_qp(QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_RDMA_WRITE);
	CHECK(qa != NULL);
	if (!qa) {
		qa = saved;
		return;
	}
	struct ibv_qp_attr ra = {.qp_state = IBV_QPS_RESET};
	CHECK(connect_qp(qa, qb->qp_num) == 0 && ibv_modify_qp(qb, &ra, IBV_QP_STATE) == 0 &&
	      connect_rc(ctx, qb, qa->qp_num, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE | ACCESS_FLUSH_GLOBAL, 4) == 0);
	struct qp_ex_45 *x = (struct qp_ex_45 *)(void *)ibv_qp_to_qp_ex(qa);
	uint8_t *target = aligned_alloc(64, 4096), *plain = aligned_alloc(64, 64), src[64];
	memset(target, 0, 4096);
	memset(src, 0x5c, sizeof(src));
	struct ibv_mr *tm = ibv_reg_mr(pd, target, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | ACCESS_FLUSH_GLOBAL);
	struct ibv_mr *pm = ibv_reg_mr(pd, plain, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *sm = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	CHECK(x && x->wr_flush && tm && pm && sm);
	if (!x || !x->wr_flush || !tm || !pm || !sm)
		return;
	ibv_wr_start(&x->x);
	x->x.wr_id = 40;
	x->x.wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(&x->x, tm->rkey, (uintptr_t)target + 128);
	ibv_wr_set_sge(&x->x, sm->lkey, (uintptr_t)src, sizeof(src));
	x->x.wr_id = 41;
	x->wr_flush(&x->x, tm->rkey, (uintptr_t)target + 128, sizeof(src), FLUSH_GLOBAL, FLUSH_RANGE);
	x->x.wr_id = 42; // the whole region: the range (wholly past it) is not used
	x->wr_flush(&x->x, tm->rkey, (uintptr_t)target + 8192, 4096, FLUSH_GLOBAL, FLUSH_MR);
	CHECK(ibv_wr_complete(&x->x) == 0);
	struct ibv_wc wc[3];
	CHECK(wait_wc(wc, 3) == 3 && wc[0].wr_id == 40 && wc[0].status == IBV_WC_SUCCESS &&
	      wc[1].wr_id == 41 && wc[1].status == IBV_WC_SUCCESS && (int)wc[1].opcode == WC_FLUSH &&
	      wc[2].wr_id == 42 && wc[2].status == IBV_WC_SUCCESS && (int)wc[2].opcode == WC_FLUSH);
	CHECK(memcmp(target + 128, src, sizeof(src)) == 0 && target[127] == 0 && target[128 + sizeof(src)] == 0);
	// a region registered without IBV_ACCESS_FLUSH_GLOBAL: remote access error
	ibv_wr_start(&x->x);
	x->x.wr_id = 43;
	x->wr_flush(&x->x, pm->rkey, (uintptr_t)plain, 64, FLUSH_GLOBAL, FLUSH_RANGE);
	CHECK(ibv_wr_complete(&x->x) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].wr_id == 43 && wc[0].status == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_dereg_mr(tm) == 0 && ibv_dereg_mr(pm) == 0 && ibv_dereg_mr(sm) == 0);
	free(target);
	free(plain);
	CHECK(ibv_destroy_qp(qa) == 0);
	qa = saved;
	CHECK(reconnect() == 0);
}

int main(void)
{
	int rc;
	ctx = open_device("modify", &rc);
	if (!ctx)
		return rc;
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	cq = ibv_create_cq(ctx, 4, NULL, ch, 0);
	CHECK(pd && ch && cq);
	qa = make_qp(0);
	qb = make_qp(0);
	CHECK(qa && qb);
	if (!qa || !qb)
		return check_done("modify");
	CHECK(reconnect() == 0);
	size_t sz = 4096;
	uint8_t *src = malloc(sz), *dst = calloc(1, sz);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *sm = ibv_reg_mr(pd, src, sz, acc), *dm = ibv_reg_mr(pd, dst, sz, acc);
	CHECK(src && dst && sm && dm);
	if (sm && dm) {
		resize_cq(src, sm, dst, dm);
		rereg_mr(src, sm);
		atomic_write();
		flush();
	}
	CHECK(ibv_dereg_mr(sm) == 0 && ibv_dereg_mr(dm) == 0);
	free(src);
	free(dst);
	CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
	return check_done("modify");
}
