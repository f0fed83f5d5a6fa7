// rdma_cm IDs: each one is a handle of librdmacm's session with the
// daemon, whose connection manager does the work; an event names its ID by
// handle. An ID created without a channel is synchronous (as librdmacm's):
// it gets a private channel and each call waits for its own event.
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cma.h"

static pthread_mutex_t ids_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cma_id *ids;

static void track(struct cma_id *i)
{
	pthread_mutex_lock(&ids_mu);
	i->next = ids;
	ids = i;
	pthread_mutex_unlock(&ids_mu);
}

static void untrack(struct cma_id *i)
{
	pthread_mutex_lock(&ids_mu);
	for (struct cma_id **p = &ids; *p; p = &(*p)->next) {
		if (*p == i) {
			*p = i->next;
			break;
		}
	}
	pthread_mutex_unlock(&ids_mu);
}

static struct cma_id *lookup(uint32_t handle)
{
	pthread_mutex_lock(&ids_mu);
	struct cma_id *i = ids;
	while (i && i->handle != handle)
		i = i->next;
	pthread_mutex_unlock(&ids_mu);
	return i;
}

// ---------------------------------------------------------------- addresses

static void addr_to_wire(struct sr_sockaddr *w, const struct sockaddr *sa)
{
	memset(w, 0, sizeof(*w));
	if (!sa)
		return;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)(const void *)sa;
		w->family = AF_INET;
		w->port = ntohs(s->sin_port);
		w->addr[10] = w->addr[11] = 0xff;
		memcpy(&w->addr[12], &s->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)(const void *)sa;
		w->family = AF_INET6;
		w->port = ntohs(s->sin6_port);
		w->scope_id = s->sin6_scope_id;
		memcpy(w->addr, &s->sin6_addr, 16);
	}
}

static void addr_from_wire(struct sockaddr_storage *ss, const struct sr_sockaddr *w)
{
	memset(ss, 0, sizeof(*ss));
	if (w->family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)(void *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(w->port);
		memcpy(&s->sin_addr, &w->addr[12], 4);
	} else if (w->family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)(void *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(w->port);
		s->sin6_scope_id = w->scope_id;
		memcpy(&s->sin6_addr, w->addr, 16);
	}
}

static void set_addrs(struct cma_id *i, const struct sr_sockaddr *local, const struct sr_sockaddr *remote)
{
	if (local->family)
		addr_from_wire(&i->id.route.addr.src_storage, local);
	if (remote->family)
		addr_from_wire(&i->id.route.addr.dst_storage, remote);
}

static void set_route(struct cma_id *i, const struct sr_cm_route *r)
{
	struct ibv_sa_path_rec *p = &i->path;
	memset(p, 0, sizeof(*p));
	memcpy(p->sgid.raw, r->sgid, 16);
	memcpy(p->dgid.raw, r->dgid, 16);
	p->mtu = r->mtu;
	p->hop_limit = r->hop_limit;
	p->traffic_class = r->traffic_class;
	p->pkey = htons(0xffff);
	p->reversible = 1;
	p->numb_path = 1;
	i->id.route.path_rec = p;
	i->id.route.num_paths = 1;
	memcpy(i->id.route.addr.addr.ibaddr.sgid.raw, r->sgid, 16);
	memcpy(i->id.route.addr.addr.ibaddr.dgid.raw, r->dgid, 16);
	i->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
}

// ---------------------------------------------------------------- events

static int event_errno(const struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_REJECTED: return ECONNREFUSED;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR: return ev->status < 0 ? -ev->status : EHOSTUNREACH;
	default: return EPROTO;
	}
}

static struct cma_id *new_id(struct rdma_event_channel *ch, void *context, enum rdma_port_space ps,
			     enum ibv_qp_type qpt, uint32_t handle)
{
	struct cma_id *i = calloc(1, sizeof(*i));
	if (!i)
		return NULL;
	i->id.verbs = cma_context();
	i->id.pd = cma_default_pd();
	i->id.channel = ch;
	i->id.context = context;
	i->id.ps = ps;
	i->id.port_num = 1;
	i->id.qp_type = qpt;
	i->handle = handle;
	track(i);
	return i;
}

int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct cma_channel *ch = cma_chan(channel);
	for (;;) {
		struct sr_cm_event e;
		if (cma_next(ch, &e) < 0)
			return -1;
		struct cma_event *ce = calloc(1, sizeof(*ce));
		if (!ce)
			return sr_fail(ENOMEM);
		struct rdma_cm_event *ev = &ce->ev;
		ev->event = (enum rdma_cm_event_type)e.event;
		ev->status = e.status;
		struct cma_id *id;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct cma_id *l = lookup(e.listen_id);
			if (!l) { // the listener is gone: its requests with it
				free(ce);
				continue;
			}
			id = new_id(l->id.channel, l->id.context, l->id.ps, l->id.qp_type, e.id);
			if (!id) {
				free(ce);
				return sr_fail(ENOMEM);
			}
			set_addrs(id, &e.local, &e.remote);
			set_route(id, &e.route);
			ev->listen_id = &l->id;
		} else {
			id = lookup(e.id);
			if (!id) { // events of a destroyed ID are dropped
				free(ce);
				continue;
			}
		}
		ev->id = &id->id;
		uint16_t pl = e.param.private_data_len;
		if (pl > SR_CM_PRIVATE_DATA_MAX)
			pl = SR_CM_PRIVATE_DATA_MAX;
		memcpy(ce->private_data, e.param.private_data, pl);
		if (e.flags & SR_CM_EVENT_UD) {
			ev->param.ud.private_data = pl ? ce->private_data : NULL;
			ev->param.ud.private_data_len = (uint8_t)(pl > 255 ? 255 : pl);
			sr_ah_from_wire(&ev->param.ud.ah_attr, &e.ah_attr);
			ev->param.ud.qp_num = e.param.qp_num;
			ev->param.ud.qkey = e.param.qkey;
		} else {
			struct rdma_conn_param *p = &ev->param.conn;
			p->private_data = pl ? ce->private_data : NULL;
			p->private_data_len = (uint8_t)(pl > 255 ? 255 : pl);
			p->responder_resources = e.param.responder_resources;
			p->initiator_depth = e.param.initiator_depth;
			p->flow_control = e.param.flow_control;
			p->retry_count = e.param.retry_count;
			p->rnr_retry_count = e.param.rnr_retry_count;
			p->srq = e.param.srq;
			p->qp_num = e.param.qp_num;
		}
		// The daemon moves a bound QP as the connection goes (CM_SET_QP).
		if (id->id.qp && ev->event == RDMA_CM_EVENT_ESTABLISHED && id->id.qp_type != IBV_QPT_UD)
			id->id.qp->state = IBV_QPS_RTS;
		if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
			id->established = 1;
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
			id->disconnected = 1;
			if (id->id.qp)
				id->id.qp->state = IBV_QPS_ERR;
		}
		*event = ev;
		return 0;
	}
}

int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	free(sr_container_of(event, struct cma_event, ev));
	return 0;
}

// sync_wait: on a synchronous ID, wait for the event the call started.
static int sync_wait(struct cma_id *i, enum rdma_cm_event_type want)
{
	struct cma_channel *ch = cma_chan(i->id.channel);
	if (!ch->sync)
		return 0;
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(i->id.channel, &ev) < 0)
		return -1;
	int err = ev->event == want ? 0 : event_errno(ev);
	rdma_ack_cm_event(ev);
	return err ? sr_fail(err) : 0;
}

// ---------------------------------------------------------------- ID verbs

static int call_id(uint16_t op, const void *req, size_t len, void *resp, size_t resplen)
{
	struct sr_conn *c = cma_conn();
	if (!c)
		return -1;
	return sr_simple(c, op, req, len, resp, resplen);
}

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		   enum rdma_port_space ps)
{
	enum ibv_qp_type qpt;
	switch (ps) {
	case RDMA_PS_TCP: qpt = IBV_QPT_RC; break;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB: qpt = IBV_QPT_UD; break;
	default: return sr_fail(EINVAL);
	}
	int sync = 0;
	if (!channel) {
		channel = rdma_create_event_channel();
		if (!channel)
			return -1;
		cma_chan(channel)->sync = 1;
		sync = 1;
	}
	struct sr_cm_create_id_req req = {.channel = cma_chan(channel)->handle, .port_space = (uint16_t)ps,
					  .qp_type = (uint8_t)qpt};
	struct sr_handle h;
	if (call_id(SR_OP_CM_CREATE_ID, &req, sizeof(req), &h, sizeof(h)) < 0) {
		int e = errno;
		if (sync)
			rdma_destroy_event_channel(channel);
		return sr_fail(e);
	}
	struct cma_id *i = new_id(channel, context, ps, qpt, h.handle);
	if (!i) {
		cma_destroy(SR_OP_CM_DESTROY_ID, h.handle);
		if (sync)
			rdma_destroy_event_channel(channel);
		return sr_fail(ENOMEM);
	}
	i->own_channel = sync;
	*id = &i->id;
	return 0;
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct cma_id *i = cma_id(id);
	if (cma_destroy(SR_OP_CM_DESTROY_ID, i->handle) < 0 && errno != ENOTCONN)
		return -1;
	untrack(i);
	if (i->own_channel)
		rdma_destroy_event_channel(id->channel);
	free(i->ep_qp);
	free(i);
	return 0;
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct cma_id *i = cma_id(id);
	struct sr_cm_bind_req req = {.id = i->handle};
	addr_to_wire(&req.addr, addr);
	struct sr_cm_addr_resp r;
	if (call_id(SR_OP_CM_BIND_ADDR, &req, sizeof(req), &r, sizeof(r)) < 0)
		return -1;
	set_addrs(i, &r.local, &r.remote);
	return 0;
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
		      int timeout_ms)
{
	struct cma_id *i = cma_id(id);
	struct sr_cm_resolve_addr_req req = {.id = i->handle, .timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 0};
	addr_to_wire(&req.src, src_addr);
	addr_to_wire(&req.dst, dst_addr);
	struct sr_cm_addr_resp r;
	if (call_id(SR_OP_CM_RESOLVE_ADDR, &req, sizeof(req), &r, sizeof(r)) < 0)
		return -1;
	set_addrs(i, &r.local, &r.remote);
	return sync_wait(i, RDMA_CM_EVENT_ADDR_RESOLVED);
}

int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct cma_id *i = cma_id(id);
	struct sr_cm_resolve_route_req req = {.id = i->handle, .timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 0};
	struct sr_cm_route r;
	if (call_id(SR_OP_CM_RESOLVE_ROUTE, &req, sizeof(req), &r, sizeof(r)) < 0)
		return -1;
	set_route(i, &r);
	return sync_wait(i, RDMA_CM_EVENT_ROUTE_RESOLVED);
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct cma_id *i = cma_id(id);
	struct sr_cm_listen_req req = {.id = i->handle, .backlog = backlog};
	struct sr_cm_addr_resp r;
	if (call_id(SR_OP_CM_LISTEN, &req, sizeof(req), &r, sizeof(r)) < 0)
		return -1;
	set_addrs(i, &r.local, &r.remote);
	return 0;
}

static void param_to_wire(struct sr_conn_param *w, const struct rdma_conn_param *p)
{
	memset(w, 0, sizeof(*w));
	if (!p)
		return;
	w->responder_resources = p->responder_resources;
	w->initiator_depth = p->initiator_depth;
	w->flow_control = p->flow_control;
	w->retry_count = p->retry_count;
	w->rnr_retry_count = p->rnr_retry_count;
	w->srq = p->srq;
	w->qp_num = p->qp_num;
	w->private_data_len = p->private_data ? p->private_data_len : 0;
	if (w->private_data_len)
		memcpy(w->private_data, p->private_data, w->private_data_len);
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cma_id *i = cma_id(id);
	struct sr_cm_conn_req req = {.id = i->handle, .has_param = conn_param != NULL};
	param_to_wire(&req.param, conn_param);
	if (call_id(SR_OP_CM_CONNECT, &req, sizeof(req), NULL, 0) < 0)
		return -1;
	// without an ID-owned QP the reply is CONNECT_RESPONSE: the program moves its QP and
	// calls rdma_establish (librdmacm's ucma_complete takes any event)
	return sync_wait(i, id->qp ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_CONNECT_RESPONSE);
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cma_id *i = cma_id(id);
	struct sr_cm_conn_req req = {.id = i->handle, .has_param = conn_param != NULL};
	param_to_wire(&req.param, conn_param);
	if (call_id(SR_OP_CM_ACCEPT, &req, sizeof(req), NULL, 0) < 0)
		return -1;
	if (id->qp_type == IBV_QPT_UD)
		return 0; // SIDR: the reply is the acceptance
	return sync_wait(i, RDMA_CM_EVENT_ESTABLISHED);
}

int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	struct sr_cm_reject_req req = {.id = cma_id(id)->handle,
				       .private_data_len = private_data ? private_data_len : 0};
	if (req.private_data_len)
		memcpy(req.private_data, private_data, req.private_data_len);
	return call_id(SR_OP_CM_REJECT, &req, sizeof(req), NULL, 0);
}

int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

int rdma_disconnect(struct rdma_cm_id *id)
{
	struct sr_handle h = {.handle = cma_id(id)->handle};
	// A connection the peer already took down (its DREQ may be in a queued
	// event not yet fetched) leaves the local call nothing to do: it
	// succeeds, as with the kernel's CM; an ID never connected is an error.
	struct cma_id *i = cma_id(id);
	if (call_id(SR_OP_CM_DISCONNECT, &h, sizeof(h), NULL, 0) < 0 && !i->established && !i->disconnected)
		return -1;
	if (id->qp)
		id->qp->state = IBV_QPS_ERR;
	return 0;
}

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct cma_id *i = cma_id(id);
	if (!channel)
		return sr_fail(EINVAL);
	struct sr_cm_migrate_req req = {.id = i->handle, .channel = cma_chan(channel)->handle};
	if (call_id(SR_OP_CM_MIGRATE_ID, &req, sizeof(req), NULL, 0) < 0)
		return -1;
	struct rdma_event_channel *old = id->channel;
	id->channel = channel;
	if (i->own_channel)
		rdma_destroy_event_channel(old);
	i->own_channel = 0;
	return 0;
}

int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	struct sr_cm_init_qp_attr_req req = {.id = cma_id(id)->handle, .qp_state = qp_attr->qp_state};
	struct sr_cm_init_qp_attr_resp r;
	if (call_id(SR_OP_CM_INIT_QP_ATTR, &req, sizeof(req), &r, sizeof(r)) < 0)
		return -1;
	sr_qp_attr_from_wire(qp_attr, &r.attr);
	*qp_attr_mask = (int)r.attr_mask;
	return 0;
}

int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct cma_id *l = cma_id(listen);
	struct rdma_cm_event *ev;
	for (;;) {
		if (rdma_get_cm_event(listen->channel, &ev) < 0)
			return -1;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		rdma_ack_cm_event(ev); // only requests come to a listener here
	}
	struct rdma_cm_id *nid = ev->id;
	rdma_ack_cm_event(ev);
	if (l->ep_qp) { // rdma_create_ep's QP attributes apply to its requests
		struct ibv_qp_init_attr a = *l->ep_qp;
		if (rdma_create_qp(nid, l->ep_pd, &a) < 0) {
			int e = errno;
			rdma_reject(nid, NULL, 0);
			rdma_destroy_id(nid);
			return sr_fail(e);
		}
	}
	*id = nid;
	return 0;
}

int rdma_establish(struct rdma_cm_id *id)
{
	// After CONNECT_RESPONSE for a QP the ID does not own (librdmacm: EINVAL for one it
	// does, whose connection the daemon completes): the daemon sends the RTU.
	if (id->qp)
		return sr_fail(EINVAL);
	struct sr_handle h = {.handle = cma_id(id)->handle};
	if (call_id(SR_OP_CM_ESTABLISH, &h, sizeof(h), NULL, 0) < 0)
		return -1;
	cma_id(id)->established = 1;
	return 0;
}

int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	(void)id;
	(void)event;
	// Communication established is raised by the daemon's engine, which
	// sees the first packet on the QP: there is nothing to forward.
	return 0;
}

int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	// As the kernel's ucma_set_option: each option with its own size (EINVAL otherwise),
	// ENOSYS for a level or option it does not know. RDMA_OPTION_IB's path records are
	// InfiniBand's: EOPNOTSUPP. The daemon answers the rest (docs/daemon-protocol.md).
	if (level == RDMA_OPTION_IB)
		return sr_fail(EOPNOTSUPP);
	if (level != RDMA_OPTION_ID)
		return sr_fail(ENOSYS);
	struct sr_cm_set_option_req req = {.id = cma_id(id)->handle, .level = (uint32_t)level,
					   .optname = (uint32_t)optname};
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (!optval || optlen != sizeof(uint8_t))
			return sr_fail(EINVAL);
		req.value = *(const uint8_t *)optval;
		break;
	case RDMA_OPTION_ID_REUSEADDR:
	case RDMA_OPTION_ID_AFONLY:
		if (!optval || optlen != sizeof(int))
			return sr_fail(EINVAL);
		req.value = *(const int *)optval != 0;
		break;
	default:
		return sr_fail(ENOSYS);
	}
	return call_id(SR_OP_CM_SET_OPTION, &req, sizeof(req), NULL, 0);
}

int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id;
	(void)addr;
	(void)context;
	return sr_fail(EOPNOTSUPP); // softroce has no multicast groups (max_mcast_grp 0), as ibv_attach_mcast
}

int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	(void)id;
	(void)attr;
	(void)context;
	return sr_fail(EOPNOTSUPP);
}

int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id;
	(void)addr;
	return sr_fail(EOPNOTSUPP);
}

int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	(void)ece;
	return sr_fail(EOPNOTSUPP);
}

int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	(void)ece;
	return sr_fail(EOPNOTSUPP);
}

static __be16 port_of(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)(const void *)sa)->sin_port;
	if (sa->sa_family == AF_INET6)
		return ((const struct sockaddr_in6 *)(const void *)sa)->sin6_port;
	return 0;
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return port_of(&id->route.addr.src_addr);
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return port_of(&id->route.addr.dst_addr);
}
