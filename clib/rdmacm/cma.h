// Internals of librdmacm: channels, IDs and their events.
#ifndef SOFTROCE_CLIB_CMA_H
#define SOFTROCE_CLIB_CMA_H

#include <rdma/rdma_cma.h>
#include <infiniband/sa.h>

#include "sr.h"

struct cma_channel {
	struct rdma_event_channel ch; // fd: the daemon's eventfd for this channel
	uint32_t handle;
	pthread_mutex_t mu;           // the queue
	struct sr_cm_event *queue;    // fetched, not yet returned
	size_t n;
	int sync;                     // created for a synchronous ID (rdma_create_ep)
	int users;                    // threads inside cma_next (mu)
	int closed;                   // rdma_destroy_event_channel ran while users > 0 (mu)
};

static inline struct cma_channel *cma_chan(struct rdma_event_channel *ch)
{
	return sr_container_of(ch, struct cma_channel, ch);
}

struct cma_id {
	struct rdma_cm_id id;
	uint32_t handle;
	struct cma_id *next;          // every live ID (the handle map)
	struct ibv_sa_path_rec path;  // id->route.path_rec
	struct ibv_qp_init_attr *ep_qp; // rdma_create_ep's QP attributes, for rdma_get_request's IDs
	struct ibv_pd *ep_pd;
	int own_cqs;                  // rdma_create_qp made the CQs and channels
	int own_channel;              // a synchronous ID's private channel (rdma_create_id(NULL, ...))
	int established;              // ESTABLISHED was delivered
	int disconnected;             // DISCONNECTED was delivered
};

static inline struct cma_id *cma_id(struct rdma_cm_id *id)
{
	return sr_container_of(id, struct cma_id, id);
}

// cma_event is what rdma_get_cm_event returns: the public event and the
// storage its private data points into.
struct cma_event {
	struct rdma_cm_event ev;
	uint8_t private_data[SR_CM_PRIVATE_DATA_MAX];
};

struct ibv_context *cma_context(void);
struct ibv_pd *cma_default_pd(void);
struct sr_conn *cma_conn(void);
int cma_destroy(uint16_t op, uint32_t handle);
int cma_next(struct cma_channel *ch, struct sr_cm_event *out);

#endif
