// The object verbs (PD, MR, CQ, SRQ, QP, AH) and their events. Each object
// lives in the daemon, named by a handle of the context's session
// (docs/clib.md); what has no daemon counterpart refuses with EOPNOTSUPP.
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "sr.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

// ---------------------------------------------------------------- PD, MR

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	(void)context;
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	(void)pd;
	return EOPNOTSUPP;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	(void)pd;
	(void)addr;
	(void)length;
	(void)iova;
	(void)access;
	return sr_fail_null(EOPNOTSUPP);
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

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
				 int fd, int access)
{
	(void)pd;
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	// dma-buf exporters are device drivers; the daemon maps process memory.
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
		 int access)
{
	(void)mr;
	(void)flags;
	(void)pd;
	(void)addr;
	(void)length;
	(void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	(void)mr;
	return EOPNOTSUPP;
}

// Importing objects of another process's context needs the kernel's
// shared uverbs fd (ibv_import_device).
struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)context;
	(void)pd_handle;
	return sr_fail_null(EOPNOTSUPP);
}

void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)pd;
	(void)mr_handle;
	return sr_fail_null(EOPNOTSUPP);
}

void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)context;
	(void)dm_handle;
	return sr_fail_null(EOPNOTSUPP);
}

void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}

// ---------------------------------------------------------------- CQ and completion channels

// A completion channel's fd is an epoll instance watching the notify
// eventfds of its CQs: poll() on it says "an event waits", and
// ibv_get_cq_event takes one, as from the kernel's channel fd.
struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return sr_fail_null(ENOMEM);
	ch->fd = epoll_create1(EPOLL_CLOEXEC);
	if (ch->fd < 0) {
		int e = errno;
		free(ch);
		return sr_fail_null(e);
	}
	ch->context = context;
	return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	pthread_mutex_lock(&channel->context->mutex);
	int busy = channel->refcnt;
	pthread_mutex_unlock(&channel->context->mutex);
	if (busy)
		return EBUSY;
	close(channel->fd);
	free(channel);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	// The channel fd follows the caller's O_NONBLOCK like the kernel's: a
	// program that polls it and then calls here must not block.
	int fl = fcntl(channel->fd, F_GETFL);
	int timeout = (fl >= 0 && (fl & O_NONBLOCK)) ? 0 : -1;
	struct epoll_event ev;
	for (;;) {
		int n = epoll_wait(channel->fd, &ev, 1, timeout);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			return sr_fail(EAGAIN);
		struct sr_cq *c = ev.data.ptr;
		uint64_t v;
		if (read(c->notify_fd, &v, sizeof(v)) != sizeof(v))
			continue; // another thread took this event
		pthread_mutex_lock(&c->cq.mutex);
		c->events_reported++;
		pthread_mutex_unlock(&c->cq.mutex);
		*cq = ibv_cq_ex_to_cq(&c->cq);
		*cq_context = c->cq.cq_context;
		return 0;
	}
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	(void)context;
	(void)cqe;
	(void)cq_context;
	(void)channel;
	(void)comp_vector;
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq;
	(void)cqe;
	// The completion ring's size is fixed when the CQ is created.
	return EOPNOTSUPP;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	(void)cq;
	return EOPNOTSUPP;
}

// ---------------------------------------------------------------- SRQ

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr)
{
	(void)pd;
	(void)srq_init_attr;
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask)
{
	(void)srq;
	(void)srq_attr;
	(void)srq_attr_mask;
	return EOPNOTSUPP;
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)
{
	(void)srq;
	(void)srq_attr;
	return EOPNOTSUPP;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	(void)srq;
	return EOPNOTSUPP;
}

// ---------------------------------------------------------------- QP

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	(void)pd;
	(void)qp_init_attr;
	return sr_fail_null(EOPNOTSUPP);
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp;
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	(void)qp;
	(void)attr;
	(void)attr_mask;
	return EOPNOTSUPP;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr)
{
	(void)qp;
	(void)attr;
	(void)attr_mask;
	(void)init_attr;
	return EOPNOTSUPP;
}

int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp;
	(void)op;
	(void)flags;
	// 0: no promise that data is written in order (the safe answer,
	// rdma-core's for providers that do not say).
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	(void)qp;
	return EOPNOTSUPP;
}

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	// Enhanced connection establishment is a vendor extension of the CM.
	return sr_fail(EOPNOTSUPP);
}

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return sr_fail(EOPNOTSUPP);
}

int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	// softroce has no multicast groups (docs/clib.md).
	return EOPNOTSUPP;
}

int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

// ---------------------------------------------------------------- AH

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	(void)pd;
	(void)attr;
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
			struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	(void)context;
	(void)port_num;
	(void)wc;
	(void)grh;
	(void)ah_attr;
	return sr_fail(EOPNOTSUPP);
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
				     uint8_t port_num)
{
	struct ibv_ah_attr attr;
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
	(void)ah;
	return EOPNOTSUPP;
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
				uint8_t eth_mac[6], uint16_t *vid)
{
	(void)context;
	(void)attr;
	(void)eth_mac;
	(void)vid;
	// Neighbour resolution is the daemon's (its link sends the frames).
	return EOPNOTSUPP;
}

// ---------------------------------------------------------------- async events

int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct sr_context *sc = sr_ctx(context);
	int fl = fcntl(context->async_fd, F_GETFL);
	(void)event;
	for (;;) {
		uint64_t v;
		if (read(sc->async_fd, &v, sizeof(v)) == sizeof(v))
			continue; // no event source yet: nothing is ever queued
		if (fl >= 0 && (fl & O_NONBLOCK))
			return sr_fail(EAGAIN);
		struct pollfd p = {.fd = sc->async_fd, .events = POLLIN};
		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -1;
	}
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event;
}

// ---------------------------------------------------------------- ops

static int poll_cq_refuse(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	(void)cq;
	(void)n;
	(void)wc;
	return -EOPNOTSUPP;
}

static int req_notify_refuse(struct ibv_cq *cq, int solicited)
{
	(void)cq;
	(void)solicited;
	return EOPNOTSUPP;
}

static int post_send_refuse(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	(void)qp;
	*bad = wr;
	return EOPNOTSUPP;
}

static int post_recv_refuse(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)qp;
	*bad = wr;
	return EOPNOTSUPP;
}

static int post_srq_recv_refuse(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)srq;
	*bad = wr;
	return EOPNOTSUPP;
}

static int query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			   struct ibv_device_attr_ex *attr, size_t attr_size)
{
	(void)input;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	memset(attr, 0, attr_size);
	attr->orig_attr = sr_ctx(context)->info.attr;
	return 0;
}

void sr_set_ops(struct sr_context *sc)
{
	struct ibv_context_ops *ops = &sc->vctx.context.ops;
	ops->poll_cq = poll_cq_refuse;
	ops->req_notify_cq = req_notify_refuse;
	ops->post_send = post_send_refuse;
	ops->post_recv = post_recv_refuse;
	ops->post_srq_recv = post_srq_recv_refuse;
	sc->vctx.query_port = sr_query_port;
	sc->vctx.query_device_ex = query_device_ex;
}

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_ack_async_event);
SR_DEFAULT_1_1(ibv_ack_cq_events);
SR_DEFAULT_1_1(ibv_alloc_pd);
SR_DEFAULT_1_1(ibv_attach_mcast);
SR_DEFAULT_1_1(ibv_create_ah);
SR_DEFAULT_1_1(ibv_create_cq);
SR_DEFAULT_1_1(ibv_create_qp);
SR_DEFAULT_1_1(ibv_create_srq);
SR_DEFAULT_1_1(ibv_dealloc_pd);
SR_DEFAULT_1_1(ibv_dereg_mr);
SR_DEFAULT_1_1(ibv_destroy_ah);
SR_DEFAULT_1_1(ibv_destroy_cq);
SR_DEFAULT_1_1(ibv_destroy_qp);
SR_DEFAULT_1_1(ibv_destroy_srq);
SR_DEFAULT_1_1(ibv_detach_mcast);
SR_DEFAULT_1_1(ibv_get_async_event);
SR_DEFAULT_1_1(ibv_get_cq_event);
SR_DEFAULT_1_1(ibv_modify_qp);
SR_DEFAULT_1_1(ibv_modify_srq);
SR_DEFAULT_1_1(ibv_query_qp);
SR_DEFAULT_1_1(ibv_query_srq);
SR_DEFAULT_1_1(ibv_reg_mr);
SR_DEFAULT_1_1(ibv_resize_cq);
