// PDs, MRs, CQs, SRQs and AHs: each one lives in the daemon, named by a
// handle of the context's session (docs/daemon-protocol.md). A CQ's
// completions arrive in a ring shared with the daemon: ibv_poll_cq and
// ibv_req_notify_cq touch only that memory.
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sr.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

static struct sr_conn *conn_of(struct ibv_context *ctx)
{
	return &sr_ctx(ctx)->conn;
}

static int destroy_handle(struct ibv_context *ctx, uint16_t op, uint32_t handle)
{
	struct sr_handle h = {.handle = handle};
	if (sr_simple(conn_of(ctx), op, &h, sizeof(h), NULL, 0) < 0)
		return errno;
	return 0;
}

// ---------------------------------------------------------------- PD

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct sr_handle h;
	if (sr_simple(conn_of(context), SR_OP_ALLOC_PD, NULL, 0, &h, sizeof(h)) < 0)
		return NULL;
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (!pd) {
		destroy_handle(context, SR_OP_DEALLOC_PD, h.handle);
		return sr_fail_null(ENOMEM);
	}
	pd->context = context;
	pd->handle = h.handle;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	int err = destroy_handle(pd->context, SR_OP_DEALLOC_PD, pd->handle);
	if (err)
		return err;
	free(pd);
	return 0;
}

// ---------------------------------------------------------------- MR

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	// Optional access flags (relaxed ordering, ...) are hints a device may
	// ignore; rdma-core drops them for devices that do not take them.
	access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE;
	struct sr_reg_mr_req req = {
		.pd = pd->handle,
		.access = access,
		.addr = (uintptr_t)addr,
		.length = length,
		.iova = iova,
		.source = SR_MR_PROCESS,
	};
	struct sr_reg_mr_resp resp;
	if (sr_simple(conn_of(pd->context), SR_OP_REG_MR, &req, sizeof(req), &resp, sizeof(resp)) < 0)
		return NULL;
	struct ibv_mr *mr = calloc(1, sizeof(*mr));
	if (!mr) {
		destroy_handle(pd->context, SR_OP_DEREG_MR, resp.handle);
		return sr_fail_null(ENOMEM);
	}
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->handle = resp.handle;
	mr->lkey = resp.lkey;
	mr->rkey = resp.rkey;
	return mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
			       int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	int err = destroy_handle(mr->context, SR_OP_DEREG_MR, mr->handle);
	if (err)
		return err;
	free(mr);
	return 0;
}

// ---------------------------------------------------------------- CQ

static _Atomic uint64_t *cq_u64(struct sr_cq *c, size_t off)
{
	return (_Atomic uint64_t *)(void *)(c->ring + off);
}

static _Atomic uint32_t *cq_u32(struct sr_cq *c, size_t off)
{
	return (_Atomic uint32_t *)(void *)(c->ring + off);
}

_Static_assert(offsetof(struct sr_wc, dlid_path_bits) == offsetof(struct ibv_wc, dlid_path_bits),
	       "a completion ring entry begins with struct ibv_wc");

// account credits a polled completion to its QP's queue counts.
static void account(struct sr_cq *c, const struct ibv_wc *wc)
{
	struct sr_qp *q = NULL;
	for (int i = 0; i < c->nqps; i++) {
		if (c->qps[i]->qpx.qp_base.qp_num == wc->qp_num) {
			q = c->qps[i];
			break;
		}
	}
	if (!q)
		return;
	if (wc->status != IBV_WC_SUCCESS)
		atomic_store(&q->errored, 1);
	if (wc->opcode & IBV_WC_RECV) {
		atomic_fetch_add(&q->rq_done, 1);
		return;
	}
	uint32_t h = atomic_load(&q->sig_head);
	if (h != atomic_load(&q->sig_tail)) {
		atomic_store(&q->sq_done, q->sig[h % q->sig_cap]);
		atomic_store(&q->sig_head, h + 1);
	}
}

int sr_cq_attach(struct sr_cq *c, struct sr_qp *q)
{
	pthread_mutex_lock(&c->poll_mu);
	struct sr_qp **g = realloc(c->qps, (size_t)(c->nqps + 1) * sizeof(*g));
	if (!g) {
		pthread_mutex_unlock(&c->poll_mu);
		return ENOMEM;
	}
	c->qps = g;
	c->qps[c->nqps++] = q;
	pthread_mutex_unlock(&c->poll_mu);
	return 0;
}

void sr_cq_detach(struct sr_cq *c, struct sr_qp *q)
{
	pthread_mutex_lock(&c->poll_mu);
	for (int i = 0; i < c->nqps; i++) {
		if (c->qps[i] == q) {
			c->qps[i] = c->qps[--c->nqps];
			break;
		}
	}
	pthread_mutex_unlock(&c->poll_mu);
}

// poll_cq is ibv_poll_cq (context->ops.poll_cq): completions move from the
// ring into wc; no system call unless the daemon waits for ring space.
static int poll_locked(struct sr_cq *c, int num_entries, struct ibv_wc *wc)
{
	uint64_t tail = atomic_load_explicit(cq_u64(c, SR_CQ_TAIL), memory_order_acquire);
	int n = 0;
	while (c->head != tail && n < num_entries) {
		const char *e = c->ring + SR_CQ_ENTRIES + (c->head & c->mask) * SR_CQ_ENTRY_SIZE;
		memcpy(&wc[n], e, offsetof(struct ibv_wc, dlid_path_bits) + 1);
		account(c, &wc[n]);
		c->head++;
		n++;
	}
	if (n > 0) {
		atomic_store(cq_u64(c, SR_CQ_HEAD), c->head);
		if (atomic_exchange(cq_u32(c, SR_CQ_WAIT), 0) != 0) {
			uint64_t one = 1;
			if (write(c->space_fd, &one, sizeof(one)) < 0) {
				// saturated: the daemon is woken anyway
			}
		}
	}
	return n;
}

static int poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct sr_cq *c = sr_cq(cq);
	if (*c->forked)
		return -1;
	pthread_mutex_lock(&c->poll_mu);
	int n = poll_locked(c, num_entries, wc);
	pthread_mutex_unlock(&c->poll_mu);
	return n;
}

// ---------------------------------------------------------------- extended CQ polling

// The ibv_cq_ex poll API (ibv_start_poll ... ibv_end_poll): each step polls
// one completion into c->cur, read by the read_* functions; poll_mu is held
// from start to end, as a provider holds its CQ lock.
static struct sr_cq *cqx(struct ibv_cq_ex *cq)
{
	return (struct sr_cq *)(void *)cq;
}

static int step(struct sr_cq *c)
{
	if (poll_locked(c, 1, &c->cur) != 1)
		return ENOENT;
	c->cq.wr_id = c->cur.wr_id;
	c->cq.status = c->cur.status;
	return 0;
}

static int start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	struct sr_cq *c = cqx(cq);
	if (attr->comp_mask)
		return EINVAL;
	if (*c->forked)
		return ENOTCONN;
	pthread_mutex_lock(&c->poll_mu);
	int err = step(c);
	if (err)
		pthread_mutex_unlock(&c->poll_mu);
	return err;
}

static int next_poll(struct ibv_cq_ex *cq)
{
	return step(cqx(cq));
}

static void end_poll(struct ibv_cq_ex *cq)
{
	pthread_mutex_unlock(&cqx(cq)->poll_mu);
}

static enum ibv_wc_opcode read_opcode(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.opcode;
}

static uint32_t read_vendor_err(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.vendor_err;
}

static uint32_t read_byte_len(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.byte_len;
}

static __be32 read_imm_data(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.imm_data;
}

static uint32_t read_qp_num(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.qp_num;
}

static uint32_t read_src_qp(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.src_qp;
}

static unsigned int read_wc_flags(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.wc_flags;
}

static uint32_t read_slid(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.slid;
}

static uint8_t read_sl(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.sl;
}

static uint8_t read_dlid_path_bits(struct ibv_cq_ex *cq)
{
	return cqx(cq)->cur.dlid_path_bits;
}

void sr_cq_ex_init(struct sr_cq *c)
{
	struct ibv_cq_ex *x = &c->cq;
	x->start_poll = start_poll;
	x->next_poll = next_poll;
	x->end_poll = end_poll;
	x->read_opcode = read_opcode;
	x->read_vendor_err = read_vendor_err;
	x->read_byte_len = read_byte_len;
	x->read_imm_data = read_imm_data;
	x->read_qp_num = read_qp_num;
	x->read_src_qp = read_src_qp;
	x->read_wc_flags = read_wc_flags;
	x->read_slid = read_slid;
	x->read_sl = read_sl;
	x->read_dlid_path_bits = read_dlid_path_bits;
}

// req_notify_cq is ibv_req_notify_cq: the arm word, with the sleeping flag,
// since a program that arms waits on the completion channel (the daemon
// then writes the notify eventfd the channel watches). An arm for the next
// completion upgrades one for the next solicited (IBTA 11.4.2.2).
static int req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct sr_cq *c = sr_cq(cq);
	if (*c->forked)
		return ENOTCONN;
	_Atomic uint32_t *p = cq_u32(c, SR_CQ_ARMED);
	uint32_t w = atomic_load(p);
	for (;;) {
		uint32_t kind = solicited_only ? SR_ARM_SOLICITED : SR_ARM_NEXT;
		if ((w & SR_ARM_KIND) == SR_ARM_NEXT)
			kind = SR_ARM_NEXT;
		if (atomic_compare_exchange_weak(p, &w, kind | SR_ARM_SLEEPING))
			return 0;
	}
}

static void cq_free(struct sr_cq *c)
{
	if (c->ring && !*c->forked)
		munmap(c->ring, c->ring_bytes);
	if (c->notify_fd >= 0)
		close(c->notify_fd);
	if (c->space_fd >= 0)
		close(c->space_fd);
	free(c->qps);
	pthread_mutex_destroy(&c->poll_mu);
	pthread_mutex_destroy(&c->cq.mutex);
	pthread_cond_destroy(&c->cq.cond);
	free(c);
}

struct sr_cq *sr_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			   struct ibv_comp_channel *channel)
{
	if (cqe < 1 || cqe > sr_ctx(context)->info.attr.max_cqe)
		return sr_fail_null(EINVAL);
	struct sr_create_cq_req req = {.cqe = (uint32_t)cqe};
	struct sr_create_cq_resp resp;
	int fds[3];
	struct sr_call call = {.op = SR_OP_CREATE_CQ, .req = &req, .reqlen = sizeof(req),
			       .resp = &resp, .respcap = sizeof(resp), .rfds = fds, .maxrfds = 3};
	if (sr_call(conn_of(context), &call) < 0)
		return NULL;
	struct sr_cq *c = calloc(1, sizeof(*c));
	if (!c) {
		for (int i = 0; i < call.nrfds; i++)
			close(fds[i]);
		destroy_handle(context, SR_OP_DESTROY_CQ, resp.handle);
		return sr_fail_null(ENOMEM);
	}
	c->notify_fd = c->space_fd = -1;
	c->forked = &sr_ctx(context)->forked;
	pthread_mutex_init(&c->poll_mu, NULL);
	pthread_mutex_init(&c->cq.mutex, NULL);
	pthread_cond_init(&c->cq.cond, NULL);
	int err = EPROTO;
	if (call.nrfds != 3 || call.resplen < sizeof(resp) || resp.entries == 0 ||
	    (resp.entries & (resp.entries - 1)) ||
	    resp.bytes < SR_CQ_ENTRIES + (uint64_t)resp.entries * SR_CQ_ENTRY_SIZE) {
		for (int i = 0; i < call.nrfds; i++)
			close(fds[i]);
		goto fail;
	}
	c->notify_fd = fds[1];
	c->space_fd = fds[2];
	void *m = mmap(NULL, resp.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	if (m == MAP_FAILED) {
		err = errno;
		goto fail;
	}
	c->ring = m;
	c->ring_bytes = resp.bytes;
	madvise(m, resp.bytes, MADV_DONTFORK);
	c->mask = resp.entries - 1;
	c->head = atomic_load(cq_u64(c, SR_CQ_HEAD));
	c->handle = resp.handle;
	// The notify eventfd is read only after epoll said it is readable;
	// non-blocking, a racing reader cannot hang.
	int fl = fcntl(c->notify_fd, F_GETFL);
	if (fl >= 0)
		fcntl(c->notify_fd, F_SETFL, fl | O_NONBLOCK);
	c->cq.context = context;
	c->cq.cq_context = cq_context;
	c->cq.handle = resp.handle;
	c->cq.cqe = (int)resp.cqe;
	if (channel) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
		if (epoll_ctl(channel->fd, EPOLL_CTL_ADD, c->notify_fd, &ev) < 0) {
			err = errno;
			goto fail;
		}
		pthread_mutex_lock(&context->mutex);
		channel->refcnt++;
		pthread_mutex_unlock(&context->mutex);
		c->cq.channel = channel;
	}
	sr_add_obj(sr_ctx(context), &c->obj, c->handle, SR_EVENT_ON_CQ, c);
	return c;
fail:
	destroy_handle(context, SR_OP_DESTROY_CQ, resp.handle);
	cq_free(c);
	return sr_fail_null(err);
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	if (comp_vector < 0 || comp_vector >= context->num_comp_vectors)
		return sr_fail_null(EINVAL);
	struct sr_cq *c = sr_create_cq(context, cqe, cq_context, channel);
	return c ? ibv_cq_ex_to_cq(&c->cq) : NULL;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct sr_cq *c = sr_cq(cq);
	struct ibv_context *context = cq->context;
	int err = destroy_handle(context, SR_OP_DESTROY_CQ, c->handle);
	if (err)
		return err;
	sr_del_obj(sr_ctx(context), &c->obj);
	if (cq->channel) {
		epoll_ctl(cq->channel->fd, EPOLL_CTL_DEL, c->notify_fd, NULL);
		pthread_mutex_lock(&context->mutex);
		cq->channel->refcnt--;
		pthread_mutex_unlock(&context->mutex);
	}
	// As rdma-core: wait until every event ibv_get_cq_event returned is
	// acknowledged.
	pthread_mutex_lock(&cq->mutex);
	while (cq->comp_events_completed != c->events_reported)
		pthread_cond_wait(&cq->cond, &cq->mutex);
	pthread_mutex_unlock(&cq->mutex);
	cq_free(c);
	return 0;
}

int sr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return poll_cq(cq, n, wc);
}

int sr_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return req_notify_cq(cq, solicited_only);
}

static int modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr)
{
	if (attr->attr_mask & ~IBV_CQ_ATTR_MODERATE)
		return EINVAL;
	struct sr_modify_cq_req req = {.handle = sr_cq(cq)->handle,
				       .cq_count = attr->moderate.cq_count,
				       .cq_period = attr->moderate.cq_period};
	if (sr_simple(conn_of(cq->context), SR_OP_MODIFY_CQ, &req, sizeof(req), NULL, 0) < 0)
		return errno;
	return 0;
}

int sr_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr)
{
	return modify_cq(cq, attr);
}

// ---------------------------------------------------------------- SRQ

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *init)
{
	struct sr_create_srq_req req = {.pd = pd->handle,
					.max_wr = init->attr.max_wr,
					.max_sge = init->attr.max_sge,
					.srq_limit = init->attr.srq_limit};
	struct sr_create_srq_resp resp;
	if (sr_simple(conn_of(pd->context), SR_OP_CREATE_SRQ, &req, sizeof(req), &resp, sizeof(resp)) < 0)
		return NULL;
	struct sr_srq *s = calloc(1, sizeof(*s));
	if (!s) {
		destroy_handle(pd->context, SR_OP_DESTROY_SRQ, resp.handle);
		return sr_fail_null(ENOMEM);
	}
	s->srq.context = pd->context;
	s->srq.srq_context = init->srq_context;
	s->srq.pd = pd;
	s->srq.handle = resp.handle;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	pthread_mutex_init(&s->post_mu, NULL);
	init->attr.max_wr = resp.max_wr;
	init->attr.max_sge = resp.max_sge;
	sr_add_obj(sr_ctx(pd->context), &s->obj, resp.handle, SR_EVENT_ON_SRQ, &s->srq);
	return &s->srq;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	struct sr_modify_srq_req req = {.handle = srq->handle, .attr_mask = (uint32_t)mask,
					.max_wr = attr->max_wr, .srq_limit = attr->srq_limit};
	if (sr_simple(conn_of(srq->context), SR_OP_MODIFY_SRQ, &req, sizeof(req), NULL, 0) < 0)
		return errno;
	return 0;
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct sr_handle h = {.handle = srq->handle};
	struct sr_srq_attr a;
	if (sr_simple(conn_of(srq->context), SR_OP_QUERY_SRQ, &h, sizeof(h), &a, sizeof(a)) < 0)
		return errno;
	attr->max_wr = a.max_wr;
	attr->max_sge = a.max_sge;
	attr->srq_limit = a.srq_limit;
	return 0;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct sr_srq *s = (struct sr_srq *)(void *)srq;
	int err = destroy_handle(srq->context, SR_OP_DESTROY_SRQ, srq->handle);
	if (err)
		return err;
	sr_del_obj(sr_ctx(srq->context), &s->obj);
	pthread_mutex_destroy(&s->post_mu);
	free(s->buf);
	free(s);
	return 0;
}

// ---------------------------------------------------------------- AH

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	// RoCE addresses by GID: an address without a GRH names nothing.
	if (!attr->is_global)
		return sr_fail_null(EINVAL);
	struct sr_create_ah_req req = {.pd = pd->handle};
	sr_ah_to_wire(&req.attr, attr);
	struct sr_create_ah_resp resp;
	if (sr_simple(conn_of(pd->context), SR_OP_CREATE_AH, &req, sizeof(req), &resp, sizeof(resp)) < 0)
		return NULL;
	struct sr_ah *ah = calloc(1, sizeof(*ah));
	if (!ah)
		return sr_fail_null(ENOMEM);
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->attr = resp.attr;
	return &ah->ah;
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
	// The daemon keeps no AH object: UD sends carry the address by value.
	free(ah);
	return 0;
}

int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
			struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	struct sr_context *sc = sr_ctx(context);
	if (port_num != 1 || !(wc->wc_flags & IBV_WC_GRH))
		return sr_fail(EINVAL);
	memset(ah_attr, 0, sizeof(*ah_attr));
	ah_attr->is_global = 1;
	ah_attr->port_num = port_num;
	ah_attr->sl = wc->sl;
	// The GRH area of a RoCEv2 receive: an IPv4 packet's header sits in its
	// last 20 bytes (rdma-core's rule); otherwise it is the IPv6 header.
	const uint8_t *raw = (const uint8_t *)grh;
	union ibv_gid sgid, dgid;
	if ((raw[20] >> 4) == 4) {
		memset(&sgid, 0, sizeof(sgid));
		memset(&dgid, 0, sizeof(dgid));
		sgid.raw[10] = sgid.raw[11] = dgid.raw[10] = dgid.raw[11] = 0xff;
		memcpy(&sgid.raw[12], raw + 20 + 12, 4); // the sender
		memcpy(&dgid.raw[12], raw + 20 + 16, 4); // us
		ah_attr->grh.hop_limit = 0xff;
		ah_attr->grh.traffic_class = raw[21];
	} else {
		sgid = grh->sgid;
		dgid = grh->dgid;
		uint32_t v = be32toh(grh->version_tclass_flow);
		ah_attr->grh.flow_label = v & 0xfffff;
		ah_attr->grh.traffic_class = (v >> 20) & 0xff;
		ah_attr->grh.hop_limit = 0xff;
	}
	ah_attr->grh.dgid = sgid;
	for (int i = 0; i < sc->info.ngids; i++) {
		if (!memcmp(sc->info.gids[i].raw, dgid.raw, 16)) {
			ah_attr->grh.sgid_index = (uint8_t)i;
			return 0;
		}
	}
	return sr_fail(ENOENT);
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
				     uint8_t port_num)
{
	struct ibv_ah_attr attr;
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_alloc_pd);
SR_DEFAULT_1_1(ibv_dealloc_pd);
SR_DEFAULT_1_1(ibv_reg_mr);
SR_DEFAULT_1_1(ibv_dereg_mr);
SR_DEFAULT_1_1(ibv_create_cq);
SR_DEFAULT_1_1(ibv_destroy_cq);
SR_DEFAULT_1_1(ibv_create_srq);
SR_DEFAULT_1_1(ibv_modify_srq);
SR_DEFAULT_1_1(ibv_query_srq);
SR_DEFAULT_1_1(ibv_destroy_srq);
SR_DEFAULT_1_1(ibv_create_ah);
SR_DEFAULT_1_1(ibv_destroy_ah);
