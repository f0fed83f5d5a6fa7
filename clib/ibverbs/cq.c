// Completion queues: each one lives in the daemon, named by a handle of the
// context's session; its completions arrive in a ring shared with the daemon
// (docs/daemon-protocol.md, "Completion ring"): ibv_poll_cq and
// ibv_req_notify_cq touch only that memory. ibv_resize_cq swaps the ring for
// a new one the daemon filled with the unpolled completions; a CQ that could
// not switch is broken (sr_cq.broken): its verbs fail with EIO.
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sr.h"

static struct sr_conn *conn_of(struct ibv_context *ctx)
{
	return &sr_ctx(ctx)->conn;
}

// valid_ring says whether a ring of entries entries fits in bytes.
static int valid_ring(uint32_t entries, uint32_t bytes)
{
	return entries && !(entries & (entries - 1)) &&
	       bytes >= SR_CQ_ENTRIES + (uint64_t)entries * SR_CQ_ENTRY_SIZE;
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
	int n = c->broken ? sr_fail(EIO) : poll_locked(c, num_entries, wc);
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
	int err = c->broken ? EIO : step(c);
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
	pthread_rwlock_rdlock(&c->ring_lock);
	if (c->broken) {
		pthread_rwlock_unlock(&c->ring_lock);
		return EIO;
	}
	_Atomic uint32_t *p = cq_u32(c, SR_CQ_ARMED);
	uint32_t w = atomic_load(p);
	for (;;) {
		uint32_t kind = solicited_only ? SR_ARM_SOLICITED : SR_ARM_NEXT;
		if ((w & SR_ARM_KIND) == SR_ARM_NEXT)
			kind = SR_ARM_NEXT;
		if (atomic_compare_exchange_weak(p, &w, kind | SR_ARM_SLEEPING))
			break;
	}
	pthread_rwlock_unlock(&c->ring_lock);
	return 0;
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
	pthread_rwlock_destroy(&c->ring_lock);
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
		sr_destroy_handle(context, SR_OP_DESTROY_CQ, resp.handle);
		return sr_fail_null(ENOMEM);
	}
	c->notify_fd = c->space_fd = -1;
	c->forked = &sr_ctx(context)->forked;
	pthread_mutex_init(&c->poll_mu, NULL);
	pthread_rwlock_init(&c->ring_lock, NULL);
	pthread_mutex_init(&c->cq.mutex, NULL);
	pthread_cond_init(&c->cq.cond, NULL);
	int err = EPROTO;
	if (call.nrfds != 3 || call.resplen < sizeof(resp) || !valid_ring(resp.entries, resp.bytes)) {
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
	sr_destroy_handle(context, SR_OP_DESTROY_CQ, resp.handle);
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
	int err = sr_destroy_handle(context, SR_OP_DESTROY_CQ, c->handle);
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

// break_cq marks c broken (poll_mu and ring_lock held) and writes its notify
// eventfd, so a thread blocked in ibv_get_cq_event on its channel returns the
// CQ and finds the error at its next poll or arm.
static void break_cq(struct sr_cq *c)
{
	c->broken = 1;
	if (c->cq.channel) {
		uint64_t one = 1;
		if (write(c->notify_fd, &one, sizeof(one)) < 0) {
			// saturated: the channel is readable anyway
		}
	}
}

// ibv_resize_cq: the daemon moves the unpolled completions, the arm and the
// completions it kept behind a full ring into a new ring at the same
// counters, and sends its memfd (docs/daemon-protocol.md, "Completion ring").
// poll_mu and ring_lock are held from the request until the new ring is
// mapped, so no poll and no arm touches the old ring after the daemon copied
// it; the notify and space eventfds stay the same, so a thread blocked on the
// completion channel is woken by the next completion as before. A size below
// the completions the CQ holds is EINVAL from the daemon; cq->cqe becomes the
// size it reports, as a provider's resize sets it.
//
// Once the daemon answered with success it writes only to the new ring: if
// the answer is then unusable (descriptor or body cut short, a ring size it
// cannot have) or the mapping fails, the CQ is broken (break_cq) rather than
// left polling a ring that never fills again. A refusal changes nothing.
int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	struct sr_cq *c = sr_cq(cq);
	if (*c->forked)
		return ENOTCONN;
	if (cqe < 1 || cqe > sr_ctx(cq->context)->info.attr.max_cqe)
		return EINVAL;
	struct sr_resize_cq_req req = {.handle = c->handle, .cqe = (uint32_t)cqe};
	struct sr_resize_cq_resp resp;
	int fd = -1;
	struct sr_call call = {.op = SR_OP_RESIZE_CQ, .req = &req, .reqlen = sizeof(req), .resp = &resp,
			       .respcap = sizeof(resp), .rfds = &fd, .maxrfds = 1};
	int err = 0;
	pthread_mutex_lock(&c->poll_mu);
	pthread_rwlock_wrlock(&c->ring_lock);
	if (c->broken) {
		err = EIO;
		goto out;
	}
	if (sr_call(conn_of(cq->context), &call) < 0) {
		err = errno;
		if (call.took_effect)
			break_cq(c);
		goto out;
	}
	if (call.nrfds != 1 || call.resplen < sizeof(resp) || !valid_ring(resp.entries, resp.bytes)) {
		if (call.nrfds)
			close(fd);
		err = EPROTO;
		break_cq(c);
		goto out;
	}
	void *m = mmap(NULL, resp.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) {
		err = errno;
		break_cq(c);
		goto out;
	}
	madvise(m, resp.bytes, MADV_DONTFORK);
	munmap(c->ring, c->ring_bytes);
	c->ring = m;
	c->ring_bytes = resp.bytes;
	c->mask = resp.entries - 1;
	cq->cqe = (int)resp.cqe;
out:
	pthread_rwlock_unlock(&c->ring_lock);
	pthread_mutex_unlock(&c->poll_mu);
	return err;
}

// sr_create_cq_ex is the verbs_context's create_cq_ex (ibv_create_cq_ex).
struct ibv_cq_ex *sr_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *a)
{
	// The extended poll API reads what a completion ring entry has: the
	// standard fields; timestamps, VLAN, flow tags and the rest are refused.
	if (a->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS)
		return sr_fail_null(EOPNOTSUPP);
	if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && a->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED)
		return sr_fail_null(EOPNOTSUPP);
	if (a->wc_flags & ~(uint64_t)IBV_WC_STANDARD_FLAGS)
		return sr_fail_null(EOPNOTSUPP);
	if (a->comp_vector >= (uint32_t)context->num_comp_vectors || a->cqe > INT32_MAX)
		return sr_fail_null(EINVAL);
	struct sr_cq *c = sr_create_cq(context, (int)a->cqe, a->cq_context, a->channel);
	if (!c)
		return NULL;
	sr_cq_ex_init(c);
	return &c->cq;
}

// clean removes the unpolled completions of QP qpn from c's ring: the entries
// from the consumer's head to the tail it loads are compacted towards the
// tail, in order, and the head moves past the ones freed. The daemon writes
// only at and beyond the tail (the ring's one producer), so the entries moved
// are the consumer's alone; the ones it kept behind a full ring are not seen.
static void clean(struct sr_cq *c, uint32_t qpn)
{
	pthread_mutex_lock(&c->poll_mu);
	if (c->broken) { // no completion of the old ring is polled again
		pthread_mutex_unlock(&c->poll_mu);
		return;
	}
	uint64_t tail = atomic_load_explicit(cq_u64(c, SR_CQ_TAIL), memory_order_acquire);
	uint64_t freed = 0;
	for (uint64_t i = tail; i != c->head;) {
		i--;
		char *e = c->ring + SR_CQ_ENTRIES + (i & c->mask) * SR_CQ_ENTRY_SIZE;
		uint32_t q;
		memcpy(&q, e + offsetof(struct sr_wc, qp_num), sizeof(q));
		if (q == qpn)
			freed++;
		else if (freed)
			memcpy(c->ring + SR_CQ_ENTRIES + ((i + freed) & c->mask) * SR_CQ_ENTRY_SIZE, e,
			       SR_CQ_ENTRY_SIZE);
	}
	if (freed) {
		c->head += freed;
		atomic_store(cq_u64(c, SR_CQ_HEAD), c->head);
		if (atomic_exchange(cq_u32(c, SR_CQ_WAIT), 0) != 0) {
			uint64_t one = 1;
			if (write(c->space_fd, &one, sizeof(one)) < 0) {
				// saturated: the daemon is woken anyway
			}
		}
	}
	pthread_mutex_unlock(&c->poll_mu);
}

// sr_cq_clean is ibv_modify_qp's move to RESET: the QP's completions still in
// its CQs go (IBTA 10.3.1: a QP in Reset has no work requests; rdma-core's
// mlx4 and mlx5 providers clean their CQs of the QP's completions the same
// way), so a QP restarted from RESET does not poll the flushes of its past.
void sr_cq_clean(struct ibv_qp *qp)
{
	if (*sr_cq(qp->recv_cq)->forked)
		return;
	clean(sr_cq(qp->recv_cq), qp->qp_num);
	if (qp->send_cq != qp->recv_cq)
		clean(sr_cq(qp->send_cq), qp->qp_num);
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

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_create_cq);
SR_DEFAULT_1_1(ibv_destroy_cq);
SR_DEFAULT_1_1(ibv_resize_cq);
