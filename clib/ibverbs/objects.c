// PDs, MRs, SRQs and AHs: each one lives in the daemon, named by a handle of
// the context's session (docs/daemon-protocol.md). CQs are in cq.c.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sr.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

static struct sr_conn *conn_of(struct ibv_context *ctx)
{
	return &sr_ctx(ctx)->conn;
}

int sr_destroy_handle(struct ibv_context *ctx, uint16_t op, uint32_t handle)
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
		sr_destroy_handle(context, SR_OP_DEALLOC_PD, h.handle);
		return sr_fail_null(ENOMEM);
	}
	pd->context = context;
	pd->handle = h.handle;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	int err = sr_destroy_handle(pd->context, SR_OP_DEALLOC_PD, pd->handle);
	if (err)
		return err;
	free(pd);
	return 0;
}

// ---------------------------------------------------------------- MR

// reg_mr registers [addr, addr+length) as memory of the given source (for
// SR_MR_MEMFD: fd at offset).
static int reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access,
		  int fd, uint64_t offset, struct sr_reg_mr_resp *resp)
{
	struct sr_reg_mr_req req = {
		.pd = pd->handle,
		.access = access,
		.addr = (uintptr_t)addr,
		.length = length,
		.iova = iova,
		.offset = offset,
		.source = fd >= 0 ? SR_MR_MEMFD : SR_MR_PROCESS,
	};
	struct sr_call call = {.op = SR_OP_REG_MR, .req = &req, .reqlen = sizeof(req),
			       .fds = fd >= 0 ? &fd : NULL, .nfds = fd >= 0 ? 1 : 0,
			       .resp = resp, .respcap = sizeof(*resp)};
	if (sr_call(conn_of(pd->context), &call) < 0)
		return -1;
	if (call.resplen < sizeof(*resp)) {
		errno = EPROTO;
		return -1;
	}
	return 0;
}

// ibv_reg_mr_iova2: whole pages of private anonymous memory are registered
// zero-copy (zcopy.c), anything else, or what the daemon does not map (its
// mapping limits), as copied memory.
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	// Optional access flags (relaxed ordering, ...) are hints a device may
	// ignore; rdma-core drops them for devices that do not take them.
	access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE;
	struct sr_reg_mr_resp resp;
	struct sr_zc *zc;
	int fd = sr_zc_get(addr, length, &zc);
	if (fd >= 0 && reg_mr(pd, addr, length, iova, access, fd, 0, &resp) < 0) {
		// Refused as a memfd (the daemon's mapping limits): moved back, copied.
		sr_zc_put(zc);
		fd = -1;
		zc = sr_zc_track(addr, length);
	} else if (fd >= 0) {
		sr_zc_registered(zc);
	}
	if (!zc)
		return sr_fail_null(ENOMEM);
	if (fd < 0 && reg_mr(pd, addr, length, iova, access, -1, 0, &resp) < 0) {
		sr_zc_put(zc);
		return NULL;
	}
	struct sr_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		sr_destroy_handle(pd->context, SR_OP_DEREG_MR, resp.handle);
		sr_zc_put(zc);
		return sr_fail_null(ENOMEM);
	}
	m->zc = zc;
	struct ibv_mr *mr = &m->mr;
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
	int err = sr_destroy_handle(mr->context, SR_OP_DEREG_MR, mr->handle);
	if (err)
		return err;
	struct sr_mr *m = (struct sr_mr *)(void *)mr;
	sr_zc_put(m->zc); // the daemon no longer reaches the pages
	sr_zc_put(m->stale);
	free(m);
	return 0;
}

// ibv_rereg_mr: libibverbs' checks of its arguments first (a failure is
// IBV_REREG_MR_ERR_INPUT with errno EINVAL), then one request: the daemon
// changes the MR's memory, PD and/or access in place, with its keys, and
// answers once no access of the old registration is in flight, so the old
// memory may be freed. A refusal is IBV_REREG_MR_ERR_CMD with the daemon's
// errno (EINVAL for no flag, bad access or a PD of another context; EBUSY:
// the change is made but old accesses were still running when the daemon's
// wait ended).
int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
	if ((flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) ||
	    ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != mr->context))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	struct sr_rereg_mr_req req = {
		.handle = mr->handle,
		.flags = (uint32_t)flags,
		.pd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd->handle : 0,
		.access = (unsigned int)access & ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE, // as ibv_reg_mr
		.addr = (uintptr_t)addr,
		.length = length,
		.iova = (uintptr_t)addr,
		.source = SR_MR_PROCESS,
	};
	struct sr_rereg_mr_resp resp;
	// New memory is copied memory, recorded before the daemon may reach it.
	struct sr_zc *nz = NULL;
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && !(nz = sr_zc_track(addr, length))) {
		errno = ENOMEM;
		return IBV_REREG_MR_ERR_CMD;
	}
	if (sr_simple(conn_of(mr->context), SR_OP_REREG_MR, &req, sizeof(req), &resp, sizeof(resp)) < 0) {
		// EBUSY: the change may have been made with old accesses still
		// running, so both ranges stay recorded until ibv_dereg_mr (a
		// second such answer's range stays recorded for the process's life).
		struct sr_mr *m = (struct sr_mr *)(void *)mr;
		if (errno == EBUSY && nz && !m->stale)
			m->stale = nz;
		else if (errno != EBUSY)
			sr_zc_put(nz);
		return IBV_REREG_MR_ERR_CMD;
	}
	mr->lkey = resp.lkey;
	mr->rkey = resp.rkey;
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		// The old memory, no longer reached, is the program's again.
		struct sr_mr *m = (struct sr_mr *)(void *)mr;
		sr_zc_put(m->zc);
		m->zc = nz;
		mr->addr = addr;
		mr->length = length;
	}
	return 0;
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
		sr_destroy_handle(pd->context, SR_OP_DESTROY_SRQ, resp.handle);
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
	int err = sr_destroy_handle(srq->context, SR_OP_DESTROY_SRQ, srq->handle);
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
SR_DEFAULT_1_1(ibv_create_srq);
SR_DEFAULT_1_1(ibv_modify_srq);
SR_DEFAULT_1_1(ibv_query_srq);
SR_DEFAULT_1_1(ibv_destroy_srq);
SR_DEFAULT_1_1(ibv_create_ah);
SR_DEFAULT_1_1(ibv_destroy_ah);
