// Queue pairs and work requests. A post is encoded as the protocol's post
// message (docs/daemon-protocol.md: sr_post, then each WR's fixed part and
// its scatter/gather list or inline data) and sent as one request; the
// daemon's answer is the verb's (the count posted before a refused WR).
#include <stdlib.h>
#include <string.h>

#include "sr.h"

static struct sr_conn *conn_of(struct ibv_context *ctx)
{
	return &sr_ctx(ctx)->conn;
}

// ---------------------------------------------------------------- create, modify, query, destroy

static struct ibv_qp *create_qp(struct ibv_context *context, struct ibv_pd *pd,
				struct ibv_qp_init_attr *init)
{
	if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC && init->qp_type != IBV_QPT_UD)
		return sr_fail_null(EOPNOTSUPP);
	if (!init->send_cq || !init->recv_cq)
		return sr_fail_null(EINVAL);
	struct sr_create_qp_req req = {
		.pd = pd->handle,
		.send_cq = sr_cq(init->send_cq)->handle,
		.recv_cq = sr_cq(init->recv_cq)->handle,
		.srq = init->srq ? init->srq->handle : 0,
		.qp_type = (uint8_t)init->qp_type,
		.sq_sig_all = (uint8_t)(init->sq_sig_all != 0),
	};
	sr_cap_to_wire(&req.cap, &init->cap);
	struct sr_create_qp_resp resp;
	if (sr_simple(conn_of(context), SR_OP_CREATE_QP, &req, sizeof(req), &resp, sizeof(resp)) < 0)
		return NULL;
	struct sr_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		struct sr_handle h = {.handle = resp.handle};
		sr_simple(conn_of(context), SR_OP_DESTROY_QP, &h, sizeof(h), NULL, 0);
		return sr_fail_null(ENOMEM);
	}
	struct ibv_qp *qp = &q->qpx.qp_base;
	qp->context = context;
	qp->qp_context = init->qp_context;
	qp->pd = pd;
	qp->send_cq = init->send_cq;
	qp->recv_cq = init->recv_cq;
	qp->srq = init->srq;
	qp->handle = resp.handle;
	qp->qp_num = resp.qpn;
	qp->state = IBV_QPS_RESET;
	qp->qp_type = init->qp_type;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	pthread_mutex_init(&q->post_mu, NULL);
	sr_cap_from_wire(&q->cap, &resp.cap);
	init->cap = q->cap;
	q->sq_sig_all = init->sq_sig_all;
	q->sig_cap = 2 * q->cap.max_send_wr + 64;
	q->sig = calloc(q->sig_cap, sizeof(*q->sig));
	int aerr = q->sig ? sr_cq_attach(sr_cq(init->send_cq), q) : ENOMEM;
	if (!aerr && init->recv_cq != init->send_cq && (aerr = sr_cq_attach(sr_cq(init->recv_cq), q)))
		sr_cq_detach(sr_cq(init->send_cq), q);
	if (aerr) {
		struct sr_handle h = {.handle = resp.handle};
		sr_simple(conn_of(context), SR_OP_DESTROY_QP, &h, sizeof(h), NULL, 0);
		free(q->sig);
		free(q);
		return sr_fail_null(aerr);
	}
	sr_add_obj(sr_ctx(context), &q->obj, resp.handle, SR_EVENT_ON_QP, qp);
	return qp;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	return create_qp(pd->context, pd, init);
}

// create_qp_ex is the verbs_context's create_qp_ex (ibv_create_qp_ex): the
// plain attributes, a PD, and the extended post API (ibv_wr_*, wr.c) for the
// operations softroce has; creation flags and anything else are refused
// (EOPNOTSUPP).
static struct ibv_qp *create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *a)
{
	uint64_t ok = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || (a->comp_mask & ~ok))
		return sr_fail_null(EOPNOTSUPP);
	if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)
		return sr_fail_null(EOPNOTSUPP);
	if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~SR_WR_OPS))
		return sr_fail_null(EOPNOTSUPP);
	struct ibv_qp_init_attr init = {
		.qp_context = a->qp_context,
		.send_cq = a->send_cq,
		.recv_cq = a->recv_cq,
		.srq = a->srq,
		.cap = a->cap,
		.qp_type = a->qp_type,
		.sq_sig_all = a->sq_sig_all,
	};
	struct ibv_qp *qp = create_qp(context, a->pd, &init);
	if (qp) {
		a->cap = init.cap;
		if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
			sr_wr_init(sr_qp(qp));
	}
	return qp;
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct sr_qp *q = sr_qp(qp);
	if (!q->wr_api)
		return sr_fail_null(EOPNOTSUPP); // created without send_ops_flags
	return &q->qpx;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct sr_modify_qp_req req = {.handle = qp->handle, .attr_mask = (uint32_t)attr_mask};
	sr_qp_attr_to_wire(&req.attr, attr);
	if (sr_simple(conn_of(qp->context), SR_OP_MODIFY_QP, &req, sizeof(req), NULL, 0) < 0)
		return errno;
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET)
		sr_cq_clean(qp);
	return 0;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr)
{
	struct sr_query_qp_req req = {.handle = qp->handle, .attr_mask = (uint32_t)attr_mask};
	struct sr_qp_attr w;
	if (sr_simple(conn_of(qp->context), SR_OP_QUERY_QP, &req, sizeof(req), &w, sizeof(w)) < 0)
		return errno;
	sr_qp_attr_from_wire(attr, &w);
	qp->state = attr->qp_state;
	if (init_attr) {
		struct sr_qp *q = sr_qp(qp);
		memset(init_attr, 0, sizeof(*init_attr));
		init_attr->qp_context = qp->qp_context;
		init_attr->send_cq = qp->send_cq;
		init_attr->recv_cq = qp->recv_cq;
		init_attr->srq = qp->srq;
		init_attr->cap = q->cap;
		init_attr->qp_type = qp->qp_type;
		init_attr->sq_sig_all = q->sq_sig_all;
	}
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct sr_handle h = {.handle = qp->handle};
	if (sr_simple(conn_of(qp->context), SR_OP_DESTROY_QP, &h, sizeof(h), NULL, 0) < 0)
		return errno;
	struct sr_qp *q = sr_qp(qp);
	sr_del_obj(sr_ctx(qp->context), &q->obj);
	sr_cq_detach(sr_cq(qp->send_cq), q);
	if (qp->recv_cq != qp->send_cq)
		sr_cq_detach(sr_cq(qp->recv_cq), q);
	free(q->sig);
	sr_wr_free(q);
	pthread_mutex_destroy(&q->post_mu);
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(q->buf);
	free(q);
	return 0;
}

// ---------------------------------------------------------------- posts

// grow makes *buf at least n bytes.
static int grow(char **buf, size_t *len, size_t n)
{
	if (n <= *len)
		return 0;
	if (n > SR_MAX_MSG)
		return E2BIG;
	size_t m = *len ? *len : 4096;
	while (m < n)
		m *= 2;
	char *b = realloc(*buf, m);
	if (!b)
		return ENOMEM;
	*buf = b;
	*len = m;
	return 0;
}

static size_t pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

static size_t inline_len(const struct ibv_send_wr *wr)
{
	size_t n = 0;
	for (int i = 0; i < wr->num_sge; i++)
		n += wr->sg_list[i].length;
	return n;
}

// atomic_write_operand: w is an ATOMIC WRITE with its 8 bytes inline, its operand, which
// max_inline_data does not bound (ibv_wr_atomic_write's; the engine's qp.ValidateSend).
static int atomic_write_operand(struct ibv_send_wr *w)
{
	return w->opcode == IBV_WR_ATOMIC_WRITE && (w->send_flags & IBV_SEND_INLINE) && inline_len(w) == 8;
}

// encode_send writes the post message for the WRs from wr on; it returns
// the message length, or 0 with *bad and the error set.
static size_t encode_send(struct sr_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad, int *err)
{
	struct ibv_qp *qp = &q->qpx.qp_base;
	size_t n = sizeof(struct sr_post);
	uint32_t count = 0;
	for (struct ibv_send_wr *w = wr; w; w = w->next) {
		if (w->num_sge < 0 || w->num_sge > 255 || (w->opcode == IBV_WR_BIND_MW && w->num_sge)) {
			*bad = w;
			*err = EINVAL;
			return 0;
		}
		n += sizeof(struct sr_send_wr);
		if (w->send_flags & IBV_SEND_INLINE) {
			size_t il = inline_len(w);
			if ((il > q->cap.max_inline_data && !atomic_write_operand(w)) || il > UINT16_MAX) {
				*bad = w;
				*err = EINVAL;
				return 0;
			}
			n += pad8(il);
		} else {
			n += (size_t)w->num_sge * sizeof(struct sr_sge);
		}
		count++;
	}
	if ((*err = grow(&q->buf, &q->buflen, n))) {
		*bad = wr;
		return 0;
	}
	char *p = q->buf;
	struct sr_post hdr = {.handle = qp->handle, .num_wr = count};
	memcpy(p, &hdr, sizeof(hdr));
	p += sizeof(hdr);
	for (struct ibv_send_wr *w = wr; w; w = w->next) {
		struct sr_send_wr s;
		memset(&s, 0, sizeof(s));
		s.wr_id = w->wr_id;
		s.opcode = (uint8_t)w->opcode;
		s.send_flags = w->send_flags;
		if (w->opcode == IBV_WR_SEND_WITH_INV || w->opcode == IBV_WR_LOCAL_INV)
			s.invalidate_rkey = w->invalidate_rkey;
		else if (w->opcode == IBV_WR_SEND_WITH_IMM || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
			s.imm_data = be32toh(w->imm_data);
		switch (w->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
		case IBV_WR_ATOMIC_WRITE:
			s.remote_addr = w->wr.rdma.remote_addr;
			s.rkey = w->wr.rdma.rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			s.remote_addr = w->wr.atomic.remote_addr;
			s.rkey = w->wr.atomic.rkey;
			s.compare_add = w->wr.atomic.compare_add;
			s.swap = w->wr.atomic.swap;
			break;
		case IBV_WR_BIND_MW:
			sr_bind_to_wire(&s, w);
			break;
		default:
			if ((unsigned)w->opcode == SR_WR_FLUSH) { // ibv_wr_flush's range, type, level (wr.c)
				s.remote_addr = w->wr.atomic.remote_addr;
				s.rkey = w->wr.atomic.rkey;
				s.compare_add = w->wr.atomic.compare_add;
				s.swap = w->wr.atomic.swap;
			}
			break;
		}
		if (qp->qp_type == IBV_QPT_UD && w->wr.ud.ah) {
			struct sr_ah *ah = (struct sr_ah *)(void *)w->wr.ud.ah;
			s.remote_qpn = w->wr.ud.remote_qpn;
			s.remote_qkey = w->wr.ud.remote_qkey;
			s.has_ah = 1;
			s.ah = ah->attr;
		}
		if (w->send_flags & IBV_SEND_INLINE) {
			size_t il = inline_len(w);
			s.inline_len = (uint16_t)il;
			memcpy(p, &s, sizeof(s));
			p += sizeof(s);
			for (int i = 0; i < w->num_sge; i++) {
				memcpy(p, (const void *)(uintptr_t)w->sg_list[i].addr, w->sg_list[i].length);
				p += w->sg_list[i].length;
			}
			size_t pad = pad8(il) - il;
			memset(p, 0, pad);
			p += pad;
		} else {
			s.num_sge = (uint8_t)w->num_sge;
			memcpy(p, &s, sizeof(s));
			p += sizeof(s);
			if (w->num_sge) {
				memcpy(p, w->sg_list, (size_t)w->num_sge * sizeof(struct sr_sge));
				p += (size_t)w->num_sge * sizeof(struct sr_sge);
			}
		}
	}
	return n;
}

_Static_assert(sizeof(struct ibv_sge) == sizeof(struct sr_sge), "sr_sge is ibv_sge byte for byte");

static int post(struct ibv_context *ctx, uint16_t op, const char *msg, size_t len, uint32_t *bad_index)
{
	struct sr_post_resp resp;
	struct sr_call call = {.op = op, .req = msg, .reqlen = len, .resp = &resp, .respcap = sizeof(resp)};
	if (sr_call(conn_of(ctx), &call) < 0) {
		*bad_index = call.bad_wr;
		return errno;
	}
	return 0;
}

// post_async sends a post the engine will accept without waiting for its
// answer: a record of the post ring, or the same message on the socket if
// it does not fit there.
static int post_async(struct ibv_context *ctx, uint16_t op, const char *msg, size_t len)
{
	int r = sr_ring_post(sr_ctx(ctx), op, msg, len);
	if (r <= 0)
		return r < 0 ? errno : 0;
	struct sr_call call = {.op = op, .noreply = 1, .req = msg, .reqlen = len};
	return sr_call(conn_of(ctx), &call) < 0 ? errno : 0;
}

static int signaled(const struct sr_qp *q, const struct ibv_send_wr *w)
{
	return q->sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED);
}

// count_sends counts the first k WRs of a post as posted (under post_mu); a
// posted bind's window takes its new R_Key (mw.c).
static void count_sends(struct sr_qp *q, struct ibv_send_wr *wr, uint32_t k)
{
	for (struct ibv_send_wr *w = wr; w && k; w = w->next, k--) {
		q->sq_posted++;
		if (w->opcode == IBV_WR_BIND_MW && w->bind_mw.mw)
			w->bind_mw.mw->rkey = w->bind_mw.rkey;
		if (!signaled(q, w))
			continue;
		uint32_t t = atomic_load(&q->sig_tail);
		if (t - atomic_load(&q->sig_head) >= q->sig_cap) {
			atomic_store(&q->errored, 1); // lost count: round trips from now on
			continue;
		}
		q->sig[t % q->sig_cap] = q->sq_posted;
		atomic_store(&q->sig_tail, t + 1);
	}
}

// async_send says whether the engine accepts these WRs for sure: the checks
// it makes (qp.ValidateSend: opcode for the transport, SGE count, inline
// size, atomic operand), a QP in RTS with no error seen, and room in the
// send queue by the library's count.
static int async_send(struct sr_qp *q, struct ibv_send_wr *wr)
{
	struct ibv_qp *qp = &q->qpx.qp_base;
	struct sr_context *sc = sr_ctx(qp->context);
	if (sc->sync_posts || qp->state != IBV_QPS_RTS || atomic_load(&q->errored) ||
	    (qp->qp_type != IBV_QPT_RC && qp->qp_type != IBV_QPT_UC))
		return 0;
	uint64_t n = 0;
	for (struct ibv_send_wr *w = wr; w; w = w->next, n++) {
		switch (w->opcode) {
		case IBV_WR_SEND:
		case IBV_WR_SEND_WITH_IMM:
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			break;
		case IBV_WR_RDMA_READ:
			if (qp->qp_type != IBV_QPT_RC)
				return 0;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			if (qp->qp_type != IBV_QPT_RC || w->num_sge != 1 || w->sg_list[0].length != 8 ||
			    (w->wr.atomic.remote_addr & 7))
				return 0;
			break;
		case IBV_WR_ATOMIC_WRITE:
			if (qp->qp_type != IBV_QPT_RC || inline_len(w) != 8 || (w->wr.rdma.remote_addr & 7))
				return 0;
			break;
		default:
			return 0;
		}
		if (w->num_sge < 0 || (uint32_t)w->num_sge > q->cap.max_send_sge)
			return 0;
		uint64_t bytes = 0;
		for (int i = 0; i < w->num_sge; i++)
			bytes += w->sg_list[i].length;
		if (bytes > sc->info.port.max_msg_sz)
			return 0;
		if ((w->send_flags & IBV_SEND_INLINE) && bytes > q->cap.max_inline_data && !atomic_write_operand(w))
			return 0;
	}
	return q->sq_posted - atomic_load(&q->sq_done) + n <= q->cap.max_send_wr;
}

// sr_post_send_locked posts wr (post_mu held: ibv_post_send, or between
// ibv_wr_start and ibv_wr_complete).
int sr_post_send_locked(struct sr_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct ibv_qp *qp = &q->qpx.qp_base;
	int err = 0;
	size_t n = encode_send(q, wr, bad, &err);
	if (n && async_send(q, wr)) {
		err = post_async(qp->context, SR_OP_POST_SEND_ASYNC, q->buf, n);
		if (err)
			*bad = wr;
		else
			count_sends(q, wr, UINT32_MAX);
	} else if (n) {
		uint32_t bi = 0;
		err = post(qp->context, SR_OP_POST_SEND, q->buf, n, &bi);
		if (err) {
			*bad = wr;
			for (uint32_t i = 0; i < bi && *bad; i++)
				*bad = (*bad)->next;
			count_sends(q, wr, bi);
		} else {
			count_sends(q, wr, UINT32_MAX);
		}
	}
	return err;
}

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sr_qp *q = sr_qp(qp);
	pthread_mutex_lock(&q->post_mu);
	int err = sr_post_send_locked(q, wr, bad);
	pthread_mutex_unlock(&q->post_mu);
	return err;
}

static size_t encode_recv(char **buf, size_t *buflen, uint32_t handle, struct ibv_recv_wr *wr,
			  struct ibv_recv_wr **bad, int *err)
{
	size_t n = sizeof(struct sr_post);
	uint32_t count = 0;
	for (struct ibv_recv_wr *w = wr; w; w = w->next) {
		if (w->num_sge < 0) {
			*bad = w;
			*err = EINVAL;
			return 0;
		}
		n += sizeof(struct sr_recv_wr) + (size_t)w->num_sge * sizeof(struct sr_sge);
		count++;
	}
	if ((*err = grow(buf, buflen, n))) {
		*bad = wr;
		return 0;
	}
	char *p = *buf;
	struct sr_post hdr = {.handle = handle, .num_wr = count};
	memcpy(p, &hdr, sizeof(hdr));
	p += sizeof(hdr);
	for (struct ibv_recv_wr *w = wr; w; w = w->next) {
		struct sr_recv_wr r = {.wr_id = w->wr_id, .num_sge = (uint32_t)w->num_sge};
		memcpy(p, &r, sizeof(r));
		p += sizeof(r);
		if (w->num_sge) {
			memcpy(p, w->sg_list, (size_t)w->num_sge * sizeof(struct sr_sge));
			p += (size_t)w->num_sge * sizeof(struct sr_sge);
		}
	}
	return n;
}

static uint32_t count_recvs(struct ibv_recv_wr *wr)
{
	uint32_t n = 0;
	for (; wr; wr = wr->next)
		n++;
	return n;
}

static int post_recv_common(struct ibv_context *ctx, uint16_t op, pthread_mutex_t *mu, char **buf,
			    size_t *buflen, uint32_t handle, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad,
			    struct sr_qp *q)
{
	int err = 0;
	pthread_mutex_lock(mu);
	size_t n = encode_recv(buf, buflen, handle, wr, bad, &err);
	if (!n) {
		pthread_mutex_unlock(mu);
		return err;
	}
	uint32_t k = count_recvs(wr);
	int async = 0;
	if (q && !sr_ctx(ctx)->sync_posts && !atomic_load(&q->errored)) {
		struct ibv_qp *qp = &q->qpx.qp_base;
		async = qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS;
		for (struct ibv_recv_wr *w = wr; async && w; w = w->next)
			async = w->num_sge >= 0 && (uint32_t)w->num_sge <= q->cap.max_recv_sge;
		async = async && q->rq_posted - atomic_load(&q->rq_done) + k <= q->cap.max_recv_wr;
	}
	if (async) {
		err = post_async(ctx, SR_OP_POST_RECV_ASYNC, *buf, n);
		if (err)
			*bad = wr;
		else
			q->rq_posted += k;
	} else {
		uint32_t bi = 0;
		err = post(ctx, op, *buf, n, &bi);
		if (err) {
			*bad = wr;
			for (uint32_t i = 0; i < bi && *bad; i++)
				*bad = (*bad)->next;
			k = bi;
		}
		if (q)
			q->rq_posted += k;
	}
	pthread_mutex_unlock(mu);
	return err;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sr_qp *q = sr_qp(qp);
	return post_recv_common(qp->context, SR_OP_POST_RECV, &q->post_mu, &q->buf, &q->buflen,
				qp->handle, wr, bad, qp->srq ? NULL : q);
}

static int post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sr_srq *s = (struct sr_srq *)(void *)srq;
	return post_recv_common(srq->context, SR_OP_POST_SRQ_RECV, &s->post_mu, &s->buf, &s->buflen,
				srq->handle, wr, bad, NULL);
}

// ---------------------------------------------------------------- ops

static int query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			   struct ibv_device_attr_ex *attr, size_t attr_size)
{
	(void)input;
	struct sr_context *sc = sr_ctx(context);
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	struct ibv_device_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.orig_attr = sc->info.attr;
	a.device_cap_flags_ex = sc->info.device_cap_flags_ex;
	a.cq_mod_caps.max_cq_count = sc->info.max_cq_moderation_count;
	a.cq_mod_caps.max_cq_period = sc->info.max_cq_moderation_period;
	a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
	size_t n = attr_size < sizeof(a) ? attr_size : sizeof(a);
	memset(attr, 0, attr_size);
	memcpy(attr, &a, n);
	return 0;
}

void sr_set_ops(struct sr_context *sc)
{
	struct ibv_context_ops *ops = &sc->vctx.context.ops;
	ops->poll_cq = sr_poll_cq;
	ops->req_notify_cq = sr_req_notify_cq;
	ops->post_send = post_send;
	ops->post_recv = post_recv;
	ops->post_srq_recv = post_srq_recv;
	sc->vctx.query_port = sr_query_port;
	sc->vctx.query_device_ex = query_device_ex;
	sc->vctx.create_qp_ex = create_qp_ex;
	sc->vctx.create_cq_ex = sr_create_cq_ex;
	sc->vctx.modify_cq = sr_modify_cq;
	sr_set_mw_ops(sc);
}

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_create_qp);
SR_DEFAULT_1_1(ibv_modify_qp);
SR_DEFAULT_1_1(ibv_query_qp);
SR_DEFAULT_1_1(ibv_destroy_qp);
