// Completion channels and the verbs softroce refuses (with the reason
// each one has). The objects are in objects.c and qp.c.
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "sr.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

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

// ---------------------------------------------------------------- refused

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
				 int fd, int access)
{
	(void)pd;
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	// dma-buf exporters are device drivers; the daemon reaches process memory.
	return sr_fail_null(EOPNOTSUPP);
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

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	// Enhanced connection establishment is a vendor extension of the CM.
	// Both return the errno value, as rdma-core's do.
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
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

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_get_cq_event);
SR_DEFAULT_1_1(ibv_ack_cq_events);
SR_DEFAULT_1_1(ibv_attach_mcast);
SR_DEFAULT_1_1(ibv_detach_mcast);
