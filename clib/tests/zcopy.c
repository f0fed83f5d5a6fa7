// Zero-copy registration (ibverbs/zcopy.c) through a daemon, under
// ASan/UBSan: whole pages of private anonymous memory registered with
// ibv_reg_mr move onto a memfd the daemon maps, with their contents and
// their neighbours untouched; RDMA through them is checked byte for byte; a
// registration overlapping a moved range is copied memory; deregistration
// moves the pages back onto private memory with what RDMA wrote; a child
// after fork() gets private memory of its own; memory that does not qualify
// is not moved. With the argument "off" (run with SOFTROCE_ZERO_COPY=0, or
// against a daemon that refuses the memfds) it checks that nothing stays moved. Needs $SOFTROCE_SOCKET; without it exits 77 (skipped).
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "daemon.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_comp_channel *ch;
static struct ibv_qp *qa, *qb;
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

enum backing { UNMAPPED, PRIVATE_ANON, MOVED, OTHER };

// backing_of tells, from /proc/self/maps, what backs the page at p.
static enum backing backing_of(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return OTHER;
	char line[512];
	enum backing b = UNMAPPED;
	uintptr_t a = (uintptr_t)p;
	while (fgets(line, sizeof(line), f)) {
		unsigned long s, e, ino;
		char perms[5], path[256] = "";
		if (sscanf(line, "%lx-%lx %4s %*x %*s %lu %255s", &s, &e, perms, &ino, path) < 4)
			continue;
		if (a < s || a >= e)
			continue;
		if (!strcmp(perms, "rw-p") && ino == 0 && (!path[0] || !strcmp(path, "[heap]")))
			b = PRIVATE_ANON;
		else if (!strcmp(perms, "rw-s") && !strncmp(path, "/memfd:softroce-mr", 18))
			b = MOVED;
		else
			b = OTHER;
		break;
	}
	fclose(f);
	return b;
}

// nfds counts this process's open descriptors.
static int nfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 13 + (i >> 12));
}

static int same(const uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(seed + i * 13 + (i >> 12)))
			return 0;
	return 1;
}

static struct ibv_qp *make_qp(void)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

// rdma: op (WRITE or READ) of n bytes between local (lkey) and remote (rkey)
// on qa; 1 when it completed successfully.
static int rdma(enum ibv_wr_opcode op, void *local, uint32_t lkey, void *remote, uint32_t rkey, size_t n)
{
	struct ibv_sge s = {.addr = (uintptr_t)local, .length = (uint32_t)n, .lkey = lkey};
	struct ibv_send_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = op,
				.send_flags = IBV_SEND_SIGNALED}, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)remote;
	w.wr.rdma.rkey = rkey;
	struct ibv_wc wc;
	return ibv_post_send(qa, &w, &bad) == 0 && wait_channel(cq, ch, &wc, 1) == 1 &&
	       wc.status == IBV_WC_SUCCESS;
}

static void *map(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

// moved: what zero copy does to whole pages and their neighbours, and the
// data path through them.
static void moved(void)
{
	const size_t pg = 4096, n = 256 * 1024;
	// One mapping: a page before, the region, a page after.
	uint8_t *all = map(n + 2 * pg), *dst = map(n);
	CHECK(all && dst);
	if (!all || !dst)
		return;
	uint8_t *src = all + pg;
	fill(all, n + 2 * pg, 1);
	int fds = nfds();
	struct ibv_mr *ms = ibv_reg_mr(pd, src, n, ACCESS), *md = ibv_reg_mr(pd, dst, n, ACCESS);
	CHECK(ms && md);
	CHECK(fds > 0 && nfds() == fds); // a moved range holds no descriptor
	if (!ms || !md)
		return;
	CHECK(backing_of(src) == MOVED && backing_of(src + n - 1) == MOVED && backing_of(dst) == MOVED);
	CHECK(backing_of(all) == PRIVATE_ANON && backing_of(src + n) == PRIVATE_ANON);
	CHECK(same(all, n + 2 * pg, 1)); // contents and neighbours kept

	// The program's writes after registering are what the daemon sends
	// (shared pages), and what RDMA writes is what the program reads.
	fill(src, n, 2);
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, ms->lkey, dst, md->rkey, n));
	CHECK(same(dst, n, 2));
	fill(dst, n, 3);
	CHECK(rdma(IBV_WR_RDMA_READ, src, ms->lkey, dst, md->rkey, n));
	CHECK(same(src, n, 3));

	// A registration inside a moved range: copied memory, no second move
	// (and the range waits for it to go before moving back).
	struct ibv_mr *inner = ibv_reg_mr(pd, dst + 16 * pg, 16 * pg, ACCESS);
	CHECK(inner != NULL && backing_of(dst + 16 * pg) == MOVED);
	// One page on its own moves.
	uint8_t *one = map(pg);
	struct ibv_mr *mone = one ? ibv_reg_mr(pd, one, pg, ACCESS) : NULL;
	CHECK(mone != NULL && backing_of(one) == MOVED);
	if (mone) {
		CHECK(rdma(IBV_WR_RDMA_WRITE, src, ms->lkey, one, mone->rkey, pg));
		CHECK(!memcmp(one, src, pg));
		CHECK(ibv_dereg_mr(mone) == 0);
		CHECK(backing_of(one) == PRIVATE_ANON && !memcmp(one, src, pg));
		munmap(one, pg);
	}
	// One across a moved range's edge is copied memory, and moves nothing.
	struct ibv_mr *edge = ibv_reg_mr(pd, all, 2 * pg, ACCESS);
	CHECK(edge != NULL && backing_of(all) == PRIVATE_ANON && backing_of(src) == MOVED);
	if (edge) {
		CHECK(rdma(IBV_WR_RDMA_WRITE, dst, md->lkey, all, edge->rkey, 2 * pg));
		CHECK(!memcmp(all, dst, 2 * pg));
		CHECK(ibv_dereg_mr(edge) == 0);
		CHECK(backing_of(src) == MOVED);
		fill(all, pg, 1);
		CHECK(rdma(IBV_WR_RDMA_READ, src, ms->lkey, dst, md->rkey, n));
	}
	// A moved range of its own, for unmapping before deregistration.
	uint8_t *over = map(n);
	struct ibv_mr *mover = over ? ibv_reg_mr(pd, over, n, ACCESS) : NULL;
	CHECK(mover != NULL && backing_of(over) == MOVED);

	// fork: the child's pages are its own.
	pid_t pid = fork();
	if (pid == 0) {
		int bad = backing_of(src) != PRIVATE_ANON || backing_of(dst) != PRIVATE_ANON ||
			  !same(src, n, 3);
		memset(src, 0xee, n);
		memset(dst, 0xee, n);
		_exit(bad ? 1 : 0);
	}
	int st = 0;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(same(src, n, 3) && backing_of(src) == MOVED);
	fill(src, n, 4);
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, ms->lkey, dst, md->rkey, n));
	CHECK(same(dst, n, 4));

	// ibv_rereg_mr: a PD or access change keeps the pages where they are; a
	// translation change moves the old ones back (the new memory is copied).
	CHECK(ibv_rereg_mr(ms, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ACCESS | IBV_ACCESS_REMOTE_ATOMIC) == 0);
	CHECK(backing_of(src) == MOVED);
	uint8_t *other = map(n);
	if (other) {
		CHECK(ibv_rereg_mr(ms, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, other, n, 0) == 0);
		CHECK(backing_of(src) == PRIVATE_ANON && same(src, n, 4) && backing_of(other) == PRIVATE_ANON);
		fill(other, n, 7);
		CHECK(rdma(IBV_WR_RDMA_WRITE, other, ms->lkey, dst, md->rkey, n));
		CHECK(same(dst, n, 7));
		CHECK(ibv_rereg_mr(ms, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, src, n, 0) == 0);
		munmap(other, n);
		fill(dst, n, 4);
	}
	// Deregistration moves a range back, with its contents, once no copied
	// registration overlaps it: the daemon may write those bytes meanwhile.
	CHECK(ibv_dereg_mr(ms) == 0);
	CHECK(backing_of(src) == PRIVATE_ANON && same(src, n, 4));
	CHECK(ibv_dereg_mr(md) == 0);
	CHECK(backing_of(dst) == (inner ? MOVED : PRIVATE_ANON) && same(dst, n, 4));
	if (inner) {
		fill(src, 16 * pg, 5);
		struct ibv_mr *m2 = ibv_reg_mr(pd, src, 16 * pg, ACCESS);
		CHECK(m2 && rdma(IBV_WR_RDMA_WRITE, src, m2->lkey, dst + 16 * pg, inner->rkey, 16 * pg));
		CHECK(same(dst + 16 * pg, 16 * pg, 5));
		if (m2)
			CHECK(ibv_dereg_mr(m2) == 0);
		CHECK(backing_of(dst) == MOVED);
		CHECK(ibv_dereg_mr(inner) == 0);
	}
	CHECK(backing_of(dst) == PRIVATE_ANON && backing_of(dst + n - 1) == PRIVATE_ANON);
	CHECK(same(dst, 16 * pg, 4) && same(dst + 16 * pg, 16 * pg, 5));
	// The program unmaps a moved range before deregistering it: nothing
	// comes back there.
	if (mover) {
		munmap(over, n);
		CHECK(ibv_dereg_mr(mover) == 0);
		CHECK(backing_of(over) == UNMAPPED);
	}
	munmap(all, n + 2 * pg);
	munmap(dst, n);
}

// not_moved: memory that is not whole pages of private anonymous memory, or
// is small, stays where it is; RDMA through it works as copied memory.
static void not_moved(int zero_copy)
{
	const size_t n = 256 * 1024;
	uint8_t *heap = malloc(n + 123), *small = map(4096), *whole = map(n);
	// Not whole pages: an address inside a page (heap + 1), a length short of one.
	CHECK(heap && small && whole);
	if (!heap || !small || !whole)
		return;
	struct ibv_mr *mh = ibv_reg_mr(pd, heap + 1, n, ACCESS), *ms = ibv_reg_mr(pd, small, 4000, ACCESS),
		      *mw = ibv_reg_mr(pd, whole, n, ACCESS);
	CHECK(mh && ms && mw);
	CHECK(backing_of(heap + 4096) != MOVED && backing_of(small) == PRIVATE_ANON);
	CHECK(backing_of(whole) == (zero_copy ? MOVED : PRIVATE_ANON));
	// Whole pages whose mapping carries advice a move would lose: left alone.
	static const int advice[] = {MADV_DONTFORK, MADV_WIPEONFORK, MADV_DONTDUMP};
	for (unsigned i = 0; i < sizeof(advice) / sizeof(advice[0]); i++) {
		uint8_t *p = map(2 * 4096);
		CHECK(p && madvise(p, 2 * 4096, advice[i]) == 0);
		struct ibv_mr *mp = p ? ibv_reg_mr(pd, p, 2 * 4096, ACCESS) : NULL;
		CHECK(mp != NULL && backing_of(p) == PRIVATE_ANON);
		if (mp)
			CHECK(ibv_dereg_mr(mp) == 0);
		if (p)
			munmap(p, 2 * 4096);
	}
	if (mh && mw) {
		fill(heap + 1, n, 6);
		CHECK(rdma(IBV_WR_RDMA_WRITE, heap + 1, mh->lkey, whole, mw->rkey, n));
		CHECK(same(whole, n, 6));
	}
	// A process holding locked memory moves nothing (the new mapping would
	// not be locked). The system call itself: ASan's mlock does nothing.
	uint8_t *locked = map(4096), *p = map(2 * 4096);
	CHECK(locked && p && syscall(SYS_mlock, locked, 4096) == 0);
	struct ibv_mr *mp = p ? ibv_reg_mr(pd, p, 2 * 4096, ACCESS) : NULL;
	CHECK(mp != NULL && backing_of(p) == PRIVATE_ANON);
	if (mp)
		CHECK(ibv_dereg_mr(mp) == 0);
	if (locked) {
		syscall(SYS_munlock, locked, 4096);
		munmap(locked, 4096);
	}
	if (p)
		munmap(p, 2 * 4096);
	struct ibv_mr *mrs[] = {mh, ms, mw};
	for (unsigned i = 0; i < 3; i++)
		if (mrs[i])
			CHECK(ibv_dereg_mr(mrs[i]) == 0);
	CHECK(backing_of(whole) == PRIVATE_ANON && same(whole, n, 6));
	free(heap);
	munmap(small, 4096);
	munmap(whole, n);
}

int main(int argc, char **argv)
{
	int zero_copy = !(argc > 1 && !strcmp(argv[1], "off"));
	int rc;
	ctx = open_device("zcopy", &rc);
	if (!ctx)
		return rc;
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
	CHECK(pd && ch && cq);
	qa = make_qp();
	qb = make_qp();
	CHECK(qa && qb);
	if (!qa || !qb)
		return check_done("zcopy");
	CHECK(connect_rc(ctx, qa, qb->qp_num, ACCESS, 4) == 0 && connect_rc(ctx, qb, qa->qp_num, ACCESS, 4) == 0);
	if (zero_copy)
		moved();
	not_moved(zero_copy);
	CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	return check_done(zero_copy ? "zcopy" : "zcopy off");
}
