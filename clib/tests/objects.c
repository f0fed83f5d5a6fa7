// The verbs that need no registered memory, through a daemon, under
// ASan/UBSan: device queries, PD/CQ/QP/AH objects and their errors,
// zero-length SENDs between two RC QPs of one context through the post ring
// and as round trips ($SOFTROCE_SYNC_POSTS), completion events through a
// channel (poll() on its fd, O_NONBLOCK's EAGAIN), the extended post and
// poll APIs, and fork (the child's verbs fail cleanly). Needs
// $SOFTROCE_SOCKET (test/clib runs it against an in-test daemon); without
// one it exits 77 (skipped).
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "daemon.h"

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
};

static struct ibv_qp *make_qp(struct dev *d, int ex)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = d->cq,
		.recv_cq = d->cq,
		.cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2, .max_recv_sge = 2},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = d->pd,
	};
	if (ex) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	}
	return ibv_create_qp_ex(d->ctx, &a);
}

static int connect_qp(struct dev *d, struct ibv_qp *q, uint32_t remote)
{
	return connect_rc(d->ctx, q, remote, 0, 1);
}

// wait_wc waits for n successful completions, sleeping on the channel.
static int wait_wc(struct dev *d, int n)
{
	int got = 0;
	struct ibv_wc wc[8];
	while (got < n) {
		int k = ibv_poll_cq(d->cq, 8, wc);
		if (k < 0)
			return -1;
		for (int i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "completion: %s\n", ibv_wc_status_str(wc[i].status));
				return -1;
			}
		got += k;
		if (got >= n)
			break;
		if (ibv_req_notify_cq(d->cq, 0))
			return -1;
		if ((k = ibv_poll_cq(d->cq, 8, wc)) > 0) {
			got += k;
			continue;
		}
		struct pollfd p = {.fd = d->ch->fd, .events = POLLIN};
		if (poll(&p, 1, 10000) != 1)
			return -1;
		struct ibv_cq *ecq;
		void *ectx;
		if (ibv_get_cq_event(d->ch, &ecq, &ectx) || ecq != d->cq)
			return -1;
		ibv_ack_cq_events(ecq, 1);
	}
	return got;
}

// exchange sends rounds zero-length SENDs from a to b (each with a receive
// posted first), every one signaled, or every 4th with the rest unsignaled.
static void exchange(struct dev *d, struct ibv_qp *a, struct ibv_qp *b, int rounds, int selective)
{
	int ok = 1;
	for (int i = 0; i < rounds && ok; i++) {
		struct ibv_recv_wr r = {.wr_id = (uint64_t)i}, *rb;
		struct ibv_send_wr s = {.wr_id = (uint64_t)i, .opcode = IBV_WR_SEND}, *sb;
		int sig = !selective || i % 4 == 3;
		s.send_flags = sig ? IBV_SEND_SIGNALED : 0;
		ok = ibv_post_recv(b, &r, &rb) == 0 && ibv_post_send(a, &s, &sb) == 0 && wait_wc(d, sig ? 2 : 1) >= 1;
	}
	CHECK(ok);
}

static int open_dev(struct dev *d)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		ibv_free_device_list(list);
		return -1;
	}
	d->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!d->ctx)
		return -1;
	d->pd = ibv_alloc_pd(d->ctx);
	d->ch = ibv_create_comp_channel(d->ctx);
	d->cq = d->ch ? ibv_create_cq(d->ctx, 256, NULL, d->ch, 0) : NULL;
	return d->pd && d->cq ? 0 : -1;
}

static void close_dev(struct dev *d)
{
	CHECK(ibv_destroy_cq(d->cq) == 0);
	CHECK(ibv_destroy_comp_channel(d->ch) == 0);
	CHECK(ibv_dealloc_pd(d->pd) == 0);
	CHECK(ibv_close_device(d->ctx) == 0);
}

static void queries(struct dev *d)
{
	struct ibv_device_attr da;
	CHECK(ibv_query_device(d->ctx, &da) == 0 && da.phys_port_cnt == 1 && da.max_qp > 0);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(d->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	      pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len > 1);
	CHECK(ibv_query_port(d->ctx, 2, &pa) == EINVAL);
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(d->ctx, NULL, &dx) == 0 && dx.orig_attr.max_qp == da.max_qp &&
	      dx.phys_port_cnt_ex == 1);
	union ibv_gid g;
	CHECK(ibv_query_gid(d->ctx, 1, 1, &g) == 0 && g.raw[10] == 0xff && g.raw[11] == 0xff);
	CHECK(ibv_query_gid(d->ctx, 1, pa.gid_tbl_len, &g) == -1);
	// the node GUID, as rxe's: non-zero, the sys_image_guid too, and the interface identifier
	// of the link-local GID 0 (both the EUI-64 of the interface's MAC)
	CHECK(da.node_guid != 0 && da.sys_image_guid == da.node_guid);
	CHECK(ibv_query_gid(d->ctx, 1, 0, &g) == 0 && g.raw[0] == 0xfe && g.raw[1] == 0x80 &&
	      !memcmp(&g.raw[8], &da.node_guid, 8));
	CHECK(ibv_get_device_guid(d->ctx->device) == da.node_guid);
	CHECK(ibv_query_gid(d->ctx, 1, 1, &g) == 0);
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(d->ctx, 1, 1, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 &&
	      !memcmp(&ge.gid, &g, sizeof(g)));
	CHECK(ibv_query_gid_ex(d->ctx, 1, (uint32_t)pa.gid_tbl_len - 1, &ge, 0) == ENODATA);
	struct ibv_gid_entry tbl[16];
	ssize_t ng = ibv_query_gid_table(d->ctx, tbl, 16, 0);
	CHECK(ng >= 2 && tbl[1].gid_index == 1);
	__be16 pkey;
	CHECK(ibv_query_pkey(d->ctx, 1, 0, &pkey) == 0 && pkey == htobe16(0xffff));
	CHECK(ibv_get_pkey_index(d->ctx, 1, htobe16(0xffff)) == 0);
}

int main(void)
{
	if (!getenv("SOFTROCE_SOCKET")) {
		printf("objects: no SOFTROCE_SOCKET, skipped\n");
		return 77;
	}
	struct dev d = {0};
	CHECK(open_dev(&d) == 0);
	if (!d.cq)
		return check_done("objects");
	queries(&d);

	struct ibv_qp *a = make_qp(&d, 0), *b = make_qp(&d, 0);
	CHECK(a && b);
	if (!a || !b)
		return check_done("objects");
	// A post before the QP can send is refused by the engine, synchronously.
	struct ibv_send_wr s = {.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *sb = NULL;
	CHECK(ibv_post_send(a, &s, &sb) != 0 && sb == &s);
	CHECK(ibv_qp_to_qp_ex(a) == NULL && errno == EOPNOTSUPP);
	CHECK(connect_qp(&d, a, b->qp_num) == 0 && connect_qp(&d, b, a->qp_num) == 0);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS && qi.cap.max_send_wr >= 32);
	exchange(&d, a, b, 200, 0); // through the post ring
	exchange(&d, a, b, 200, 1); // unsignaled sends counted by their signaled successors
	// An unknown opcode: refused by the engine, a round trip.
	s.opcode = (enum ibv_wr_opcode)77;
	CHECK(ibv_post_send(a, &s, &sb) != 0 && sb == &s);

	// The extended post API.
	struct ibv_qp *xa = make_qp(&d, 1), *xb = make_qp(&d, 1);
	CHECK(xa && xb);
	if (xa && xb) {
		CHECK(connect_qp(&d, xa, xb->qp_num) == 0 && connect_qp(&d, xb, xa->qp_num) == 0);
		struct ibv_qp_ex *x = ibv_qp_to_qp_ex(xa);
		CHECK(x != NULL);
		for (int i = 0; x && i < 50; i++) {
			struct ibv_recv_wr r = {.wr_id = 1}, *rb;
			CHECK(ibv_post_recv(xb, &r, &rb) == 0);
			ibv_wr_start(x);
			x->wr_id = (uint64_t)i;
			x->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_send(x);
			ibv_wr_set_sge_list(x, 0, NULL);
			CHECK(ibv_wr_complete(x) == 0);
			CHECK(wait_wc(&d, 2) == 2);
		}
		if (x) { // an operation softroce does not have fails the batch
			uint8_t hdr[64] = {0};
			ibv_wr_start(x);
			ibv_wr_send_tso(x, hdr, sizeof(hdr), 1024);
			CHECK(ibv_wr_complete(x) == EOPNOTSUPP);
		}
		CHECK(ibv_destroy_qp(xa) == 0 && ibv_destroy_qp(xb) == 0);
	}

	// Round trips for every post.
	setenv("SOFTROCE_SYNC_POSTS", "1", 1);
	struct dev s2 = {0};
	CHECK(open_dev(&s2) == 0);
	unsetenv("SOFTROCE_SYNC_POSTS");
	if (s2.cq) {
		struct ibv_qp *c = make_qp(&s2, 0), *e = make_qp(&s2, 0);
		CHECK(c && e && connect_qp(&s2, c, e->qp_num) == 0 && connect_qp(&s2, e, c->qp_num) == 0);
		if (c && e) {
			exchange(&s2, c, e, 100, 1);
			CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(e) == 0);
		}
		close_dev(&s2);
	}

	// The channel fd follows O_NONBLOCK: nothing waits, EAGAIN.
	int fl = fcntl(d.ch->fd, F_GETFL);
	CHECK(fcntl(d.ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(ibv_get_cq_event(d.ch, &ecq, &ectx) == -1 && errno == EAGAIN);
	CHECK(fcntl(d.ch->fd, F_SETFL, fl) == 0);

	// The extended CQ poll API.
	struct ibv_cq_init_attr_ex cx = {.cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS};
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(d.ctx, &cx);
	CHECK(cqx != NULL);
	struct ibv_poll_cq_attr pa = {0};
	if (cqx) {
		CHECK(ibv_start_poll(cqx, &pa) == ENOENT);
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0);
	}
	cx.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	CHECK(ibv_create_cq_ex(d.ctx, &cx) == NULL && errno == EOPNOTSUPP);
	cx.wc_flags = 0;
	cx.comp_vector = 5;
	CHECK(ibv_create_cq_ex(d.ctx, &cx) == NULL && errno == EINVAL);

	// Objects in use cannot go.
	CHECK(ibv_destroy_cq(d.cq) == EBUSY);
	CHECK(ibv_dealloc_pd(d.pd) == EBUSY);
	CHECK(ibv_destroy_comp_channel(d.ch) == EBUSY);

	// fork: the child's verbs on the parent's objects fail without touching
	// them; the parent goes on.
	pid_t pid = fork();
	if (pid == 0) {
		struct ibv_wc w;
		struct ibv_recv_wr r = {0}, *rb;
		int bad = ibv_alloc_pd(d.ctx) != NULL || ibv_poll_cq(d.cq, 1, &w) >= 0 ||
			  ibv_post_recv(b, &r, &rb) == 0 || ibv_req_notify_cq(d.cq, 0) == 0;
		_exit(bad);
	}
	int st = 0;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	exchange(&d, a, b, 20, 0);

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	close_dev(&d);
	return check_done("objects");
}
