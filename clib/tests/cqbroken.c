// A CQ whose ibv_resize_cq could not switch rings, through a daemon, under
// ASan/UBSan. This program's own mmap (below) comes before libc's in the
// dynamic linker's order, so the library's calls reach it: armed, it fails
// the next shared mapping of a descriptor with ENOMEM — for ibv_resize_cq,
// the new ring's, after the daemon moved the CQ there. The CQ is then broken:
// a thread blocked in ibv_get_cq_event on its channel returns it,
// ibv_poll_cq is -1 (errno EIO) while a completion went to the ring it could
// not map, ibv_start_poll, ibv_req_notify_cq and ibv_resize_cq are EIO, a
// move of its QP to RESET and ibv_destroy_cq still work; another CQ of the
// context goes on, and a resize the daemon refuses (below the completions
// held) maps nothing and keeps that CQ's completions. Needs
// $SOFTROCE_SOCKET (the Go test test/clib runs it); without a daemon it
// exits 77 (skipped).
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "daemon.h"

static _Atomic int fail_maps; // armed: the next shared mapping of a descriptor fails

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (fd >= 0 && (flags & MAP_SHARED) && atomic_exchange(&fail_maps, 0)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static struct ibv_comp_channel *bad_ch;
static struct ibv_cq *bad;
static struct ibv_cq *woken;

// waiter blocks in ibv_get_cq_event on the broken-to-be CQ's channel.
static void *waiter(void *arg)
{
	(void)arg;
	struct ibv_cq *ecq;
	void *ectx;
	if (ibv_get_cq_event(bad_ch, &ecq, &ectx) == 0) {
		ibv_ack_cq_events(ecq, 1);
		woken = ecq;
	}
	return NULL;
}

// post_send posts a signaled SEND of 16 bytes of src on q; post_recv a receive of 64 into dst.
static int post_send(struct ibv_qp *q, uint64_t id, void *src, struct ibv_mr *m)
{
	struct ibv_sge s = {.addr = (uintptr_t)src, .length = 16, .lkey = m->lkey};
	struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED}, *badw;
	return ibv_post_send(q, &w, &badw);
}

static int post_recv(struct ibv_qp *q, uint64_t id, void *dst, struct ibv_mr *m)
{
	struct ibv_sge s = {.addr = (uintptr_t)dst, .length = 64, .lkey = m->lkey};
	struct ibv_recv_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1}, *badw;
	return ibv_post_recv(q, &w, &badw);
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

int main(void)
{
	int rc;
	struct ibv_context *ctx = open_device("cqbroken", &rc);
	if (!ctx)
		return rc;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	bad_ch = ibv_create_comp_channel(ctx);
	struct ibv_comp_channel *good_ch = ibv_create_comp_channel(ctx);
	struct ibv_cq_init_attr_ex ca = {.cqe = 8, .channel = bad_ch, .wc_flags = IBV_WC_STANDARD_FLAGS};
	struct ibv_cq_ex *badx = ibv_create_cq_ex(ctx, &ca);
	struct ibv_cq *good = ibv_create_cq(ctx, 8, NULL, good_ch, 0);
	CHECK(pd && bad_ch && good_ch && badx && good);
	if (!pd || !bad_ch || !good_ch || !badx || !good)
		return check_done("cqbroken");
	bad = ibv_cq_ex_to_cq(badx);
	struct ibv_qp *qa = make_qp(pd, bad), *qb = make_qp(pd, good);
	uint8_t *buf = calloc(1, 4096);
	struct ibv_mr *m = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(qa && qb && buf && m);
	if (!qa || !qb || !buf || !m)
		return check_done("cqbroken");
	CHECK(connect_rc(ctx, qa, qb->qp_num, 0, 1) == 0 && connect_rc(ctx, qb, qa->qp_num, 0, 1) == 0);

	// Both CQs work: qa's SEND completes on bad, qb's receive on good.
	struct ibv_wc wc[4];
	CHECK(post_recv(qb, 1, buf + 1024, m) == 0 && post_send(qa, 2, buf, m) == 0);
	CHECK(wait_channel(good, good_ch, wc, 1) == 1 && wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(wait_channel(bad, bad_ch, wc, 1) == 1 && wc[0].wr_id == 2 && wc[0].status == IBV_WC_SUCCESS);

	// A resize the daemon refuses (good holds two completions, moderated so the event comes
	// at the second) maps nothing: the CQ keeps both.
	struct ibv_modify_cq_attr mod = {.attr_mask = IBV_CQ_ATTR_MODERATE, .moderate = {.cq_count = 2}};
	CHECK(ibv_modify_cq(good, &mod) == 0 && ibv_req_notify_cq(good, 0) == 0);
	CHECK(post_recv(qb, 3, buf + 1024, m) == 0 && post_recv(qb, 4, buf + 1024, m) == 0);
	CHECK(post_send(qa, 5, buf, m) == 0 && post_send(qa, 6, buf, m) == 0);
	struct ibv_cq *ecq;
	void *ectx;
	struct pollfd p = {.fd = good_ch->fd, .events = POLLIN};
	CHECK(poll(&p, 1, 10000) == 1 && ibv_get_cq_event(good_ch, &ecq, &ectx) == 0 && ecq == good);
	ibv_ack_cq_events(good, 1);
	atomic_store(&fail_maps, 1);
	CHECK(ibv_resize_cq(good, 1) == EINVAL);
	CHECK(atomic_exchange(&fail_maps, 0) == 1);
	mod.moderate.cq_count = 1;
	CHECK(ibv_modify_cq(good, &mod) == 0);
	CHECK(wait_channel(good, good_ch, wc, 2) == 2 && wc[0].wr_id == 3 && wc[1].wr_id == 4);
	CHECK(wait_channel(bad, bad_ch, wc, 2) == 2 && wc[0].wr_id == 5 && wc[1].wr_id == 6);

	// bad armed, a thread blocked on its channel; the resize's mapping fails after the
	// daemon moved the CQ to the new ring.
	CHECK(ibv_req_notify_cq(bad, 0) == 0);
	pthread_t th;
	CHECK(pthread_create(&th, NULL, waiter, NULL) == 0);
	atomic_store(&fail_maps, 1);
	CHECK(ibv_resize_cq(bad, 32) == ENOMEM);
	CHECK(atomic_load(&fail_maps) == 0);

	// Broken: a poll reports the error (not an empty CQ), and so do the verbs that would
	// touch the ring or resize it again. The waiter was woken by the break itself: no
	// completion of bad came since the arm.
	errno = 0;
	CHECK(ibv_poll_cq(bad, 4, wc) == -1 && errno == EIO);
	struct ibv_poll_cq_attr pa = {0};
	CHECK(ibv_start_poll(badx, &pa) == EIO);
	CHECK(ibv_req_notify_cq(bad, 0) == EIO);
	CHECK(ibv_resize_cq(bad, 64) == EIO);
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	int joined = pthread_timedjoin_np(th, NULL, &until) == 0;
	CHECK(joined && woken == bad);
	if (!joined) { // the waiter still blocks on bad's channel: stop here, leaving all as it is
		rc = check_done("cqbroken");
		fflush(NULL);
		_exit(rc);
	}

	// A completion of bad goes to the ring it could not map: still the error, never 0.
	CHECK(post_recv(qb, 7, buf + 1024, m) == 0 && post_send(qa, 8, buf, m) == 0);
	CHECK(wait_channel(good, good_ch, wc, 1) == 1 && wc[0].wr_id == 7 && wc[0].status == IBV_WC_SUCCESS);
	errno = 0;
	CHECK(ibv_poll_cq(bad, 4, wc) == -1 && errno == EIO);

	// good goes on.
	CHECK(ibv_resize_cq(good, 16) == 0 && good->cqe == 16);
	CHECK(post_recv(qa, 10, buf + 2048, m) == 0 && post_send(qb, 9, buf, m) == 0);
	CHECK(wait_channel(good, good_ch, wc, 1) == 1 && wc[0].wr_id == 9 && wc[0].status == IBV_WC_SUCCESS);

	// The QP of the broken CQ moves to RESET and goes; so does the CQ.
	struct ibv_qp_attr ra = {.qp_state = IBV_QPS_RESET};
	CHECK(ibv_modify_qp(qa, &ra, IBV_QP_STATE) == 0);
	CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0);
	CHECK(ibv_destroy_cq(bad) == 0 && ibv_destroy_cq(good) == 0);
	CHECK(ibv_destroy_comp_channel(bad_ch) == 0 && ibv_destroy_comp_channel(good_ch) == 0);
	CHECK(ibv_dereg_mr(m) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
	free(buf);
	return check_done("cqbroken");
}
