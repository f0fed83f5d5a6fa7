// librdmacm over the daemon's connection manager (docs/clib.md). Every
// rdma_cm ID lives in the daemon, in the session of its device context.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "sr.h"

const char *rdma_event_str(enum rdma_cm_event_type event)
{
	switch (event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
	case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
	case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
	case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
	case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
	case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
	case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
	case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
	case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
	case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
	case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
	case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
	case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
	case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
	case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
	case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
	default: return "UNKNOWN EVENT";
	}
}

// rdma_get_devices opens a context on every device; the list and its
// contexts stay until rdma_free_devices.
struct ibv_context **rdma_get_devices(int *num_devices)
{
	int n = 0;
	struct ibv_device **devs = ibv_get_device_list(&n);
	if (!devs)
		return NULL;
	struct ibv_context **list = calloc((size_t)n + 1, sizeof(*list));
	if (!list) {
		ibv_free_device_list(devs);
		return sr_fail_null(ENOMEM);
	}
	int k = 0;
	for (int i = 0; i < n; i++) {
		struct ibv_context *c = ibv_open_device(devs[i]);
		if (c)
			list[k++] = c;
	}
	ibv_free_device_list(devs);
	if (num_devices)
		*num_devices = k;
	return list;
}

void rdma_free_devices(struct ibv_context **list)
{
	if (!list)
		return;
	for (int i = 0; list[i]; i++)
		ibv_close_device(list[i]);
	free(list);
}

struct rdma_event_channel *rdma_create_event_channel(void)
{
	return sr_fail_null(ENOSYS);
}

void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	(void)channel;
}

#define CM_NOSYS(name, params, unused) \
	int name params                \
	{                              \
		unused;                \
		errno = ENOSYS;        \
		return -1;             \
	}

CM_NOSYS(rdma_create_id, (struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx, enum rdma_port_space ps),
	 ((void)ch, (void)id, (void)ctx, (void)ps))
CM_NOSYS(rdma_create_ep, (struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd, struct ibv_qp_init_attr *qp),
	 ((void)id, (void)res, (void)pd, (void)qp))
CM_NOSYS(rdma_destroy_id, (struct rdma_cm_id *id), ((void)id))
CM_NOSYS(rdma_bind_addr, (struct rdma_cm_id *id, struct sockaddr *a), ((void)id, (void)a))
CM_NOSYS(rdma_resolve_addr, (struct rdma_cm_id *id, struct sockaddr *s, struct sockaddr *d, int t),
	 ((void)id, (void)s, (void)d, (void)t))
CM_NOSYS(rdma_resolve_route, (struct rdma_cm_id *id, int t), ((void)id, (void)t))
CM_NOSYS(rdma_create_qp, (struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a),
	 ((void)id, (void)pd, (void)a))
CM_NOSYS(rdma_create_qp_ex, (struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *a), ((void)id, (void)a))
CM_NOSYS(rdma_create_srq, (struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *a),
	 ((void)id, (void)pd, (void)a))
CM_NOSYS(rdma_create_srq_ex, (struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *a), ((void)id, (void)a))
CM_NOSYS(rdma_connect, (struct rdma_cm_id *id, struct rdma_conn_param *p), ((void)id, (void)p))
CM_NOSYS(rdma_establish, (struct rdma_cm_id *id), ((void)id))
CM_NOSYS(rdma_listen, (struct rdma_cm_id *id, int b), ((void)id, (void)b))
CM_NOSYS(rdma_get_request, (struct rdma_cm_id *l, struct rdma_cm_id **id), ((void)l, (void)id))
CM_NOSYS(rdma_accept, (struct rdma_cm_id *id, struct rdma_conn_param *p), ((void)id, (void)p))
CM_NOSYS(rdma_reject, (struct rdma_cm_id *id, const void *d, uint8_t n), ((void)id, (void)d, (void)n))
CM_NOSYS(rdma_reject_ece, (struct rdma_cm_id *id, const void *d, uint8_t n), ((void)id, (void)d, (void)n))
CM_NOSYS(rdma_notify, (struct rdma_cm_id *id, enum ibv_event_type e), ((void)id, (void)e))
CM_NOSYS(rdma_disconnect, (struct rdma_cm_id *id), ((void)id))
CM_NOSYS(rdma_join_multicast, (struct rdma_cm_id *id, struct sockaddr *a, void *c), ((void)id, (void)a, (void)c))
CM_NOSYS(rdma_leave_multicast, (struct rdma_cm_id *id, struct sockaddr *a), ((void)id, (void)a))
CM_NOSYS(rdma_join_multicast_ex, (struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *a, void *c),
	 ((void)id, (void)a, (void)c))
CM_NOSYS(rdma_get_cm_event, (struct rdma_event_channel *ch, struct rdma_cm_event **e), ((void)ch, (void)e))
CM_NOSYS(rdma_ack_cm_event, (struct rdma_cm_event *e), ((void)e))
CM_NOSYS(rdma_set_option, (struct rdma_cm_id *id, int l, int o, void *v, size_t n),
	 ((void)id, (void)l, (void)o, (void)v, (void)n))
CM_NOSYS(rdma_migrate_id, (struct rdma_cm_id *id, struct rdma_event_channel *ch), ((void)id, (void)ch))
CM_NOSYS(rdma_getaddrinfo, (const char *node, const char *service, const struct rdma_addrinfo *h, struct rdma_addrinfo **r),
	 ((void)node, (void)service, (void)h, (void)r))
CM_NOSYS(rdma_init_qp_attr, (struct rdma_cm_id *id, struct ibv_qp_attr *a, int *m), ((void)id, (void)a, (void)m))
CM_NOSYS(rdma_set_local_ece, (struct rdma_cm_id *id, struct ibv_ece *e), ((void)id, (void)e))
CM_NOSYS(rdma_get_remote_ece, (struct rdma_cm_id *id, struct ibv_ece *e), ((void)id, (void)e))

void rdma_destroy_ep(struct rdma_cm_id *id)
{
	(void)id;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
	(void)id;
}

void rdma_destroy_srq(struct rdma_cm_id *id)
{
	(void)id;
}

void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	(void)res;
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	(void)id;
	return 0;
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	(void)id;
	return 0;
}
