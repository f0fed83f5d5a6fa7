// The verbs through a daemon, under ASan/UBSan: two RC QPs of one context
// connected to each other through the daemon's device (GID 1), every
// operation's data checked byte for byte, memory of every kind (malloc,
// stack, static, mmap), completion events through a channel, error
// completions for bad keys and out-of-range SGEs, and a fork whose child
// gets clean errors while the parent goes on. Needs $SOFTROCE_SOCKET (the
// Go test test/clib runs it against an in-test daemon); without a daemon it
// exits 77 (skipped).
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "daemon.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_comp_channel *ch;
static struct ibv_qp *qa, *qb;
static uint8_t static_buf[8192];

static struct ibv_qp *make_qp(void)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4, .max_recv_sge = 4,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

static int connect_qp(struct ibv_qp *q, uint32_t remote)
{
	unsigned int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			      IBV_ACCESS_LOCAL_WRITE;
	return connect_rc(ctx, q, remote, access, 4);
}

// wait_wc waits (through the completion channel) for n completions.
static int wait_wc(struct ibv_wc *wc, int n)
{
	return wait_channel(cq, ch, wc, n);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

// transfer: SEND from src (lkey) into a receive on qb, WRITE and READ
// between the two regions; checks every byte.
static void transfer(const char *what, uint8_t *src, struct ibv_mr *smr, uint8_t *dst, struct ibv_mr *dmr,
		     size_t n)
{
	struct ibv_wc wc[4];
	fill(src, n, (uint8_t)n);
	memset(dst, 0, n);
	struct ibv_sge rs = {.addr = (uintptr_t)dst, .length = (uint32_t)n, .lkey = dmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(qb, &rwr, &rbad) == 0);
	struct ibv_sge ss = {.addr = (uintptr_t)src, .length = (uint32_t)n, .lkey = smr->lkey};
	struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED}, *sbad;
	CHECK(ibv_post_send(qa, &swr, &sbad) == 0);
	CHECK(wait_wc(wc, 2) == 2);
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS);
	int ok = !memcmp(src, dst, n);
	if (!ok)
		fprintf(stderr, "%s: SEND data differs\n", what);
	CHECK(ok);

	fill(src, n, (uint8_t)(n + 1));
	swr = (struct ibv_send_wr){.wr_id = 3, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED};
	swr.wr.rdma.remote_addr = (uintptr_t)dst;
	swr.wr.rdma.rkey = dmr->rkey;
	CHECK(ibv_post_send(qa, &swr, &sbad) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RDMA_WRITE);
	ok = !memcmp(src, dst, n);
	if (!ok)
		fprintf(stderr, "%s: WRITE data differs\n", what);
	CHECK(ok);

	fill(dst, n, (uint8_t)(n + 2));
	swr.opcode = IBV_WR_RDMA_READ;
	swr.wr_id = 4;
	CHECK(ibv_post_send(qa, &swr, &sbad) == 0);
	CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RDMA_READ);
	ok = !memcmp(src, dst, n);
	if (!ok)
		fprintf(stderr, "%s: READ data differs\n", what);
	CHECK(ok);
}

int main(void)
{
	int rc;
	ctx = open_device("loopback", &rc);
	if (!ctx)
		return rc;
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	cq = ibv_create_cq(ctx, 128, NULL, ch, 0);
	CHECK(pd && ch && cq);
	qa = make_qp();
	qb = make_qp();
	CHECK(qa && qb);
	if (!qa || !qb)
		return check_done("loopback");
	CHECK(connect_qp(qa, qb->qp_num) == 0);
	CHECK(connect_qp(qb, qa->qp_num) == 0);

	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		     IBV_ACCESS_REMOTE_ATOMIC;
	// malloc'd memory
	size_t sz = 3 * 4096 + 123;
	uint8_t *a = malloc(sz), *b = malloc(sz);
	struct ibv_mr *ma = ibv_reg_mr(pd, a, sz, access), *mb = ibv_reg_mr(pd, b, sz, access);
	CHECK(ma && mb);
	if (ma && mb)
		transfer("malloc", a, ma, b, mb, sz);
	// stack and static memory
	uint8_t stack_buf[4096];
	struct ibv_mr *mst = ibv_reg_mr(pd, stack_buf, sizeof(stack_buf), access);
	struct ibv_mr *msta = ibv_reg_mr(pd, static_buf, sizeof(static_buf), access);
	CHECK(mst && msta);
	if (mst && msta)
		transfer("stack/static", stack_buf, mst, static_buf, msta, sizeof(stack_buf));
	// mmap'd memory
	size_t msz = 1 << 20;
	uint8_t *m1 = mmap(NULL, msz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *m2 = mmap(NULL, msz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mm1 = ibv_reg_mr(pd, m1, msz, access), *mm2 = ibv_reg_mr(pd, m2, msz, access);
	CHECK(mm1 && mm2);
	if (mm1 && mm2)
		transfer("mmap", m1, mm1, m2, mm2, msz);

	struct ibv_wc wc[4];
	struct ibv_send_wr *sbad;
	// Atomics on an 8-byte aligned word.
	uint64_t *word = (uint64_t *)(void *)(b + 8), old = 0;
	*word = 40;
	struct ibv_sge os = {.addr = (uintptr_t)&old, .length = 8, .lkey = 0};
	struct ibv_mr *mold = ibv_reg_mr(pd, &old, 8, access);
	CHECK(mold != NULL);
	if (mold && mb) {
		os.lkey = mold->lkey;
		struct ibv_send_wr aw = {.wr_id = 5, .sg_list = &os, .num_sge = 1,
					 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED};
		aw.wr.atomic.remote_addr = (uintptr_t)word;
		aw.wr.atomic.rkey = mb->rkey;
		aw.wr.atomic.compare_add = 2;
		CHECK(ibv_post_send(qa, &aw, &sbad) == 0);
		CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS);
		CHECK(old == 40 && *word == 42);
		aw.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		aw.wr.atomic.compare_add = 42;
		aw.wr.atomic.swap = 7;
		CHECK(ibv_post_send(qa, &aw, &sbad) == 0);
		CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS);
		CHECK(old == 42 && *word == 7);
	}

	// Inline send: the data is taken at post time.
	if (mb) {
		char msg[32] = "inline data, copied at post";
		struct ibv_sge rs = {.addr = (uintptr_t)b, .length = 64, .lkey = mb->lkey};
		struct ibv_recv_wr rwr = {.wr_id = 6, .sg_list = &rs, .num_sge = 1}, *rbad;
		CHECK(ibv_post_recv(qb, &rwr, &rbad) == 0);
		struct ibv_sge is = {.addr = (uintptr_t)msg, .length = sizeof(msg), .lkey = 0};
		struct ibv_send_wr iw = {.wr_id = 7, .sg_list = &is, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
		CHECK(ibv_post_send(qa, &iw, &sbad) == 0);
		memset(msg, 'x', sizeof(msg));
		CHECK(wait_wc(wc, 2) == 2);
		CHECK(!memcmp(b, "inline data, copied at post", 28));
	}

	// A bad lkey and an SGE past the region's end: error completions.
	if (ma && mb) {
		struct ibv_sge bs = {.addr = (uintptr_t)a, .length = 16, .lkey = ma->lkey ^ 0x5a5a00};
		struct ibv_send_wr bw = {.wr_id = 8, .sg_list = &bs, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED};
		bw.wr.rdma.remote_addr = (uintptr_t)b;
		bw.wr.rdma.rkey = mb->rkey;
		CHECK(ibv_post_send(qa, &bw, &sbad) == 0);
		CHECK(wait_wc(wc, 1) == 1 && wc[0].status == IBV_WC_LOC_PROT_ERR && wc[0].wr_id == 8);
	}

	// fork: the child's verbs fail cleanly; the parent's QP still works
	// (a fresh pair: the error above moved qa to the error state).
	pid_t pid = fork();
	if (pid == 0) {
		struct ibv_pd *p = ibv_alloc_pd(ctx);
		struct ibv_wc w;
		int bad = p != NULL || ibv_poll_cq(cq, 1, &w) >= 0;
		_exit(bad ? 1 : 0);
	}
	int st = 0;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	struct ibv_qp *q1 = qa, *q2 = qb;
	struct ibv_qp *qc = make_qp(), *qd = make_qp();
	CHECK(qc && qd);
	if (qc && qd) {
		CHECK(connect_qp(qc, qd->qp_num) == 0 && connect_qp(qd, qc->qp_num) == 0);
		qa = qc;
		qb = qd;
		if (ma && mb)
			transfer("after fork", a, ma, b, mb, 4096);
	}

	// Objects in use cannot go: a CQ with QPs, a PD with MRs.
	CHECK(ibv_destroy_cq(cq) == EBUSY);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);

	// Everything goes, in order; the memory is the program's again.
	struct ibv_qp *qps[] = {q1, q2, qc, qd};
	for (unsigned i = 0; i < 4; i++)
		if (qps[i])
			CHECK(ibv_destroy_qp(qps[i]) == 0);
	struct ibv_mr *mrs[] = {ma, mb, mst, msta, mm1, mm2, mold};
	for (unsigned i = 0; i < sizeof(mrs) / sizeof(mrs[0]); i++)
		if (mrs[i])
			CHECK(ibv_dereg_mr(mrs[i]) == 0);
	munmap(m1, msz); // after dereg, as rdma-core allows
	munmap(m2, msz);
	free(a);
	free(b);
	// Stale completions of the error QP are drained before the CQ goes.
	struct ibv_wc w[16];
	while (ibv_poll_cq(cq, 16, w) > 0)
		;
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	return check_done("loopback");
}
