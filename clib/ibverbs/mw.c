// Memory windows (IBTA 10.6.7.2): ibv_alloc_mw and ibv_dealloc_mw are requests
// to the daemon (docs/daemon-protocol.md, ALLOC_MW and DEALLOC_MW); binds are
// work requests. ibv_bind_mw (a type 1 window) posts an IBV_WR_BIND_MW on the
// QP with a new R_Key it picks, as rdma-core's rxe provider does, since the
// verb returns the window's new R_Key before the bind runs; a type 2 window is
// bound with an IBV_WR_BIND_MW of the program's own (ibv_post_send,
// ibv_wr_bind_mw). A bind names the window by its current R_Key, mw->rkey,
// so every posted bind, type 2 too, sets mw->rkey to its new R_Key (should the
// bind complete in error the program goes back to the previous one, as with
// rxe's type 1): the next ibv_inc_rkey(mw->rkey) is a fresh key.
// sr_bind_to_wire puts a bind in the WR's protocol fields.
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "sr.h"

static struct ibv_mw *alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct sr_alloc_mw_req req = {.pd = pd->handle, .type = (uint32_t)type};
	struct sr_alloc_mw_resp resp;
	struct sr_conn *c = &sr_ctx(pd->context)->conn;
	if (sr_simple(c, SR_OP_ALLOC_MW, &req, sizeof(req), &resp, sizeof(resp)) < 0)
		return NULL; // EINVAL for a type other than 1 and 2, as rxe refuses it
	struct ibv_mw *mw = calloc(1, sizeof(*mw));
	if (!mw) {
		struct sr_handle h = {.handle = resp.handle};
		sr_simple(c, SR_OP_DEALLOC_MW, &h, sizeof(h), NULL, 0);
		return sr_fail_null(ENOMEM);
	}
	mw->context = pd->context;
	mw->pd = pd;
	mw->rkey = resp.rkey;
	mw->handle = resp.handle;
	mw->type = type;
	return mw;
}

static int dealloc_mw(struct ibv_mw *mw)
{
	struct sr_handle h = {.handle = mw->handle};
	if (sr_simple(&sr_ctx(mw->context)->conn, SR_OP_DEALLOC_MW, &h, sizeof(h), NULL, 0) < 0)
		return errno;
	free(mw);
	return 0;
}

// new_key is a type 1 bind's new R_Key: the window's index with a random key
// byte other than the current one (as the device draws type 1 keys: a peer
// that held the old R_Key cannot guess the new one).
static uint32_t new_key(uint32_t rkey)
{
	uint8_t b;
	if (getrandom(&b, 1, 0) != 1)
		b = (uint8_t)(rkey + 1);
	if (b == (uint8_t)rkey)
		b++;
	return (rkey & ~0xffu) | b;
}

// bind_mw is the context's bind_mw (ibv_bind_mw; verbs.h has checked the
// window's type, the MR's PD, and that a bind without an MR has no range).
static int bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
	// IBTA o10-36.2.2 (rxe refuses it too): a type 1 window is not zero-based.
	if (mw_bind->bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED)
		return EINVAL;
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = mw_bind->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = mw_bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = new_key(mw->rkey);
	wr.bind_mw.bind_info = mw_bind->bind_info;
	// Once posted, mw->rkey is the new R_Key (qp.c).
	return qp->context->ops.post_send(qp, &wr, &bad);
}

void sr_bind_to_wire(struct sr_send_wr *s, const struct ibv_send_wr *w)
{
	const struct ibv_mw_bind_info *i = &w->bind_mw.bind_info;
	s->invalidate_rkey = w->bind_mw.mw ? w->bind_mw.mw->rkey : 0;
	s->rkey = w->bind_mw.rkey;
	s->imm_data = i->mr ? i->mr->lkey : 0;
	s->remote_addr = i->addr;
	s->compare_add = i->length;
	// A window grants remote access only; IBV_ACCESS_LOCAL_WRITE in its
	// access (rdma-core's suite binds with it) is taken, as rxe takes it,
	// and means nothing.
	s->swap = i->mw_access_flags & ~(unsigned int)IBV_ACCESS_LOCAL_WRITE;
}

void sr_set_mw_ops(struct sr_context *sc)
{
	struct ibv_context_ops *ops = &sc->vctx.context.ops;
	ops->alloc_mw = alloc_mw;
	ops->dealloc_mw = dealloc_mw;
	ops->bind_mw = bind_mw;
}
