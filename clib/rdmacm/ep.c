// The verbs helpers of librdmacm (rdma_create_qp, rdma_create_srq) and the
// endpoint helpers rdma-core's examples use (rdma_getaddrinfo,
// rdma_create_ep).
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cma.h"

// own_cqs: a QP created without CQs gets a completion channel and a CQ for
// each direction, as librdmacm does (rdma_verbs.h's rdma_get_send_comp and
// rdma_get_recv_comp wait on them).
static int own_cqs(struct rdma_cm_id *id, struct ibv_qp_init_attr *attr)
{
	struct ibv_context *v = id->verbs;
	id->recv_cq_channel = ibv_create_comp_channel(v);
	id->send_cq_channel = ibv_create_comp_channel(v);
	if (!id->recv_cq_channel || !id->send_cq_channel)
		return -1;
	int rn = attr->cap.max_recv_wr ? (int)attr->cap.max_recv_wr : 1;
	int sn = attr->cap.max_send_wr ? (int)attr->cap.max_send_wr : 1;
	id->recv_cq = ibv_create_cq(v, rn, id, id->recv_cq_channel, 0);
	id->send_cq = ibv_create_cq(v, sn, id, id->send_cq_channel, 0);
	if (!id->recv_cq || !id->send_cq)
		return -1;
	attr->recv_cq = id->recv_cq;
	attr->send_cq = id->send_cq;
	cma_id(id)->own_cqs = 1;
	return 0;
}

static void free_cqs(struct rdma_cm_id *id)
{
	if (id->recv_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	if (id->send_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	id->recv_cq = id->send_cq = NULL;
	id->recv_cq_channel = id->send_cq_channel = NULL;
	cma_id(id)->own_cqs = 0;
}

static int bind_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp *qp);

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (!pd)
		pd = id->pd;
	if (!pd || pd->context != id->verbs)
		return sr_fail(EINVAL);
	if (!qp_init_attr->send_cq && !qp_init_attr->recv_cq && own_cqs(id, qp_init_attr) < 0) {
		int e = errno;
		free_cqs(id);
		return sr_fail(e);
	}
	if (!qp_init_attr->send_cq)
		qp_init_attr->send_cq = qp_init_attr->recv_cq;
	if (!qp_init_attr->recv_cq)
		qp_init_attr->recv_cq = qp_init_attr->send_cq;
	if (!qp_init_attr->srq)
		qp_init_attr->srq = id->srq;
	struct ibv_qp *qp = ibv_create_qp(pd, qp_init_attr);
	if (!qp) {
		int e = errno;
		if (cma_id(id)->own_cqs)
			free_cqs(id);
		return sr_fail(e);
	}
	return bind_qp(id, pd, qp);
}

// bind_qp: the daemon binds the QP to the ID and moves it as rdma_create_qp
// does: RC and UC to INIT, UD to RTS with the rdma_cm Q_Key.
static int bind_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp *qp)
{
	struct sr_cm_set_qp_req req = {.id = cma_id(id)->handle, .qp = qp->handle};
	if (sr_simple(cma_conn(), SR_OP_CM_SET_QP, &req, sizeof(req), NULL, 0) < 0) {
		int e = errno;
		ibv_destroy_qp(qp);
		if (cma_id(id)->own_cqs)
			free_cqs(id);
		return sr_fail(e);
	}
	qp->state = qp->qp_type == IBV_QPT_UD ? IBV_QPS_RTS : IBV_QPS_INIT;
	id->qp = qp;
	id->pd = pd;
	return 0;
}

int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	if (attr->comp_mask & ~IBV_QP_INIT_ATTR_PD) {
		// The extended attributes (ibv_wr_* API): ibv_create_qp_ex, CQs given.
		if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD))
			attr->pd = id->pd, attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		if (!attr->pd || !attr->send_cq || !attr->recv_cq)
			return sr_fail(EINVAL);
		struct ibv_qp *qp = ibv_create_qp_ex(id->verbs, attr);
		if (!qp)
			return -1;
		return bind_qp(id, attr->pd, qp);
	}
	struct ibv_qp_init_attr a = {
		.qp_context = attr->qp_context,
		.send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq,
		.srq = attr->srq,
		.cap = attr->cap,
		.qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all,
	};
	int r = rdma_create_qp(id, (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : NULL, &a);
	if (r == 0)
		attr->cap = a.cap;
	return r;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (id->qp)
		ibv_destroy_qp(id->qp);
	id->qp = NULL;
	if (cma_id(id)->own_cqs)
		free_cqs(id);
}

int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (!pd)
		pd = id->pd;
	if (!pd)
		return sr_fail(EINVAL);
	struct ibv_srq *srq = ibv_create_srq(pd, attr);
	if (!srq)
		return -1;
	id->srq = srq;
	id->pd = pd;
	return 0;
}

int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	if ((attr->comp_mask & ~IBV_SRQ_INIT_ATTR_PD) ||
	    ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC))
		return sr_fail(EOPNOTSUPP);
	struct ibv_srq_init_attr a = {.srq_context = attr->srq_context, .attr = attr->attr};
	int r = rdma_create_srq(id, (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : NULL, &a);
	if (r == 0)
		attr->attr = a.attr;
	return r;
}

void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (id->srq)
		ibv_destroy_srq(id->srq);
	id->srq = NULL;
}

// ---------------------------------------------------------------- rdma_getaddrinfo

static struct sockaddr *dup_addr(const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr *d = malloc(len);
	if (d)
		memcpy(d, sa, len);
	return d;
}

// rdma_getaddrinfo resolves node and service with getaddrinfo: the address
// is the destination, or with RAI_PASSIVE the source; without node and
// service the hints' addresses are the answer (librdmacm's rules). No route
// is precomputed (rdma_resolve_route asks the daemon).
int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
		     struct rdma_addrinfo **res)
{
	static const struct rdma_addrinfo nohints;
	if (!node && !service && !hints)
		return sr_fail(EINVAL);
	if (!hints)
		hints = &nohints;
	struct rdma_addrinfo *ra = calloc(1, sizeof(*ra));
	if (!ra)
		return sr_fail(ENOMEM);
	ra->ai_flags = hints->ai_flags;
	ra->ai_family = hints->ai_family;
	ra->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
	ra->ai_port_space = hints->ai_port_space ? hints->ai_port_space
			    : ra->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP;
	int err = 0;
	if (node || service) {
		struct addrinfo h = {.ai_family = hints->ai_family, .ai_socktype = SOCK_STREAM};
		if (hints->ai_flags & RAI_PASSIVE)
			h.ai_flags |= AI_PASSIVE;
		if (hints->ai_flags & RAI_NUMERICHOST)
			h.ai_flags |= AI_NUMERICHOST;
		struct addrinfo *ai;
		int r = getaddrinfo(node, service, &h, &ai);
		if (r) {
			rdma_freeaddrinfo(ra);
			errno = r == EAI_SYSTEM ? errno : ENOENT;
			return r;
		}
		ra->ai_family = ai->ai_family;
		struct sockaddr *a = dup_addr(ai->ai_addr, ai->ai_addrlen);
		if (!a)
			err = ENOMEM;
		else if (hints->ai_flags & RAI_PASSIVE)
			ra->ai_src_addr = a, ra->ai_src_len = ai->ai_addrlen;
		else
			ra->ai_dst_addr = a, ra->ai_dst_len = ai->ai_addrlen;
		freeaddrinfo(ai);
	} else if (hints->ai_dst_len) {
		if (!(ra->ai_dst_addr = dup_addr(hints->ai_dst_addr, hints->ai_dst_len)))
			err = ENOMEM;
		ra->ai_dst_len = hints->ai_dst_len;
	}
	if (!err && !ra->ai_src_len && hints->ai_src_len) {
		if (!(ra->ai_src_addr = dup_addr(hints->ai_src_addr, hints->ai_src_len)))
			err = ENOMEM;
		ra->ai_src_len = hints->ai_src_len;
	}
	if (err) {
		rdma_freeaddrinfo(ra);
		return sr_fail(err);
	}
	*res = ra;
	return 0;
}

void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}

// rdma_create_ep makes a synchronous ID from rdma_getaddrinfo's answer:
// bound (RAI_PASSIVE) or with its address and route resolved, and with a QP
// when qp_init_attr is given (for a passive ID: on each rdma_get_request).
int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
		   struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cid;
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)res->ai_port_space) < 0)
		return -1;
	int r;
	if (res->ai_flags & RAI_PASSIVE) {
		r = rdma_bind_addr(cid, res->ai_src_addr);
		if (r == 0 && qp_init_attr) {
			struct cma_id *i = cma_id(cid);
			i->ep_qp = malloc(sizeof(*qp_init_attr));
			if (!i->ep_qp) {
				rdma_destroy_id(cid);
				return sr_fail(ENOMEM);
			}
			*i->ep_qp = *qp_init_attr;
			i->ep_pd = pd;
		}
	} else {
		r = rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000);
		if (r == 0)
			r = rdma_resolve_route(cid, 2000);
		if (r == 0 && qp_init_attr)
			r = rdma_create_qp(cid, pd, qp_init_attr);
	}
	if (r < 0) {
		int e = errno;
		rdma_destroy_ep(cid);
		return sr_fail(e);
	}
	if (pd)
		cid->pd = pd;
	*id = cid;
	return 0;
}

void rdma_destroy_ep(struct rdma_cm_id *id)
{
	rdma_destroy_qp(id);
	rdma_destroy_srq(id);
	rdma_destroy_id(id);
}
