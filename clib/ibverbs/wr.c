// The extended post API (ibv_wr_start ... ibv_wr_complete, verbs.h's
// ibv_qp_ex): the calls build ordinary work requests, which ibv_wr_complete
// posts as one ibv_post_send would. An operation softroce does not have
// (TSO, XRC) makes the batch fail with EOPNOTSUPP at ibv_wr_complete, as a
// provider reports a bad batch.
#include <stdlib.h>
#include <string.h>

#include "sr.h"

struct sr_wr {
	struct ibv_send_wr wr;
	uint32_t sge_off, nsge; // in sges
	uint32_t inl_off, inl_len; // in inl (IBV_SEND_INLINE)
};

struct sr_wrs {
	struct sr_wr *wrs;
	uint32_t n, cap;
	struct ibv_sge *sges;
	uint32_t nsges, sges_cap;
	char *inl;
	size_t ninl, inl_cap;
	int err;
};

static struct sr_qp *qx(struct ibv_qp_ex *qp)
{
	return (struct sr_qp *)(void *)qp;
}

static int reserve(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	uint32_t c = *cap ? *cap : 16;
	while (c < need)
		c *= 2;
	void *g = realloc(*p, c * elem);
	if (!g)
		return ENOMEM;
	*p = g;
	*cap = c;
	return 0;
}

// add starts a new WR of the batch with the QP's wr_id and wr_flags.
static struct sr_wr *add(struct ibv_qp_ex *qp, enum ibv_wr_opcode op)
{
	struct sr_wrs *b = qx(qp)->wr_api;
	if (b->err)
		return NULL;
	if ((b->err = reserve((void **)&b->wrs, &b->cap, b->n + 1, sizeof(*b->wrs))))
		return NULL;
	struct sr_wr *w = &b->wrs[b->n++];
	memset(w, 0, sizeof(*w));
	w->wr.wr_id = qp->wr_id;
	w->wr.send_flags = qp->wr_flags;
	w->wr.opcode = op;
	return w;
}

// cur is the WR the setters apply to.
static struct sr_wr *cur(struct ibv_qp_ex *qp)
{
	struct sr_wrs *b = qx(qp)->wr_api;
	if (b->err)
		return NULL;
	if (!b->n) {
		b->err = EINVAL;
		return NULL;
	}
	return &b->wrs[b->n - 1];
}

static void refuse(struct ibv_qp_ex *qp)
{
	struct sr_wrs *b = qx(qp)->wr_api;
	if (!b->err)
		b->err = EOPNOTSUPP;
}

static void wr_send(struct ibv_qp_ex *qp)
{
	add(qp, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *qp, __be32 imm)
{
	struct sr_wr *w = add(qp, IBV_WR_SEND_WITH_IMM);
	if (w)
		w->wr.imm_data = imm;
}

static void wr_send_inv(struct ibv_qp_ex *qp, uint32_t rkey)
{
	struct sr_wr *w = add(qp, IBV_WR_SEND_WITH_INV);
	if (w)
		w->wr.invalidate_rkey = rkey;
}

static void wr_rdma_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	struct sr_wr *w = add(qp, IBV_WR_RDMA_WRITE);
	if (w) {
		w->wr.wr.rdma.rkey = rkey;
		w->wr.wr.rdma.remote_addr = addr;
	}
}

static void wr_rdma_write_imm(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, __be32 imm)
{
	struct sr_wr *w = add(qp, IBV_WR_RDMA_WRITE_WITH_IMM);
	if (w) {
		w->wr.wr.rdma.rkey = rkey;
		w->wr.wr.rdma.remote_addr = addr;
		w->wr.imm_data = imm;
	}
}

static void wr_rdma_read(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	struct sr_wr *w = add(qp, IBV_WR_RDMA_READ);
	if (w) {
		w->wr.wr.rdma.rkey = rkey;
		w->wr.wr.rdma.remote_addr = addr;
	}
}

static void wr_cmp_swp(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	struct sr_wr *w = add(qp, IBV_WR_ATOMIC_CMP_AND_SWP);
	if (w) {
		w->wr.wr.atomic.rkey = rkey;
		w->wr.wr.atomic.remote_addr = addr;
		w->wr.wr.atomic.compare_add = compare;
		w->wr.wr.atomic.swap = swap;
	}
}

static void wr_fetch_add(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t add_val)
{
	struct sr_wr *w = add(qp, IBV_WR_ATOMIC_FETCH_AND_ADD);
	if (w) {
		w->wr.wr.atomic.rkey = rkey;
		w->wr.wr.atomic.remote_addr = addr;
		w->wr.wr.atomic.compare_add = add_val;
	}
}

// wr_bind_mw binds a type 2 window under the program's new R_Key (rkey).
static void wr_bind_mw(struct ibv_qp_ex *qp, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *i)
{
	struct sr_wr *w = add(qp, IBV_WR_BIND_MW);
	if (w) {
		w->wr.bind_mw.mw = mw;
		w->wr.bind_mw.rkey = rkey;
		w->wr.bind_mw.bind_info = *i;
	}
}

static void wr_local_inv(struct ibv_qp_ex *qp, uint32_t rkey)
{
	struct sr_wr *w = add(qp, IBV_WR_LOCAL_INV);
	if (w)
		w->wr.invalidate_rkey = rkey;
}

static void wr_send_tso(struct ibv_qp_ex *qp, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	(void)hdr;
	(void)hdr_sz;
	(void)mss;
	refuse(qp);
}

static void wr_set_xrc_srqn(struct ibv_qp_ex *qp, uint32_t srqn)
{
	(void)srqn;
	refuse(qp);
}

// inl_take makes the next n bytes of the batch's inline data w's, growing
// the buffer; it returns where they go, or NULL (b->err set).
static char *inl_take(struct sr_wrs *b, struct sr_wr *w, size_t n)
{
	if (b->ninl + n > b->inl_cap) {
		size_t c = b->inl_cap ? b->inl_cap : 4096;
		while (c < b->ninl + n)
			c *= 2;
		char *g = realloc(b->inl, c);
		if (!g) {
			b->err = ENOMEM;
			return NULL;
		}
		b->inl = g;
		b->inl_cap = c;
	}
	w->inl_off = (uint32_t)b->ninl;
	w->inl_len = (uint32_t)n;
	w->wr.send_flags |= IBV_SEND_INLINE;
	b->ninl += n;
	return b->inl + w->inl_off;
}

// wr_atomic_write is ibv_wr_atomic_write (IBTA 1.5 RDMA ATOMIC WRITE): the 8
// bytes are the operation's operand, copied now (as rxe's provider copies them
// into its WQE) whatever the QP's max_inline_data, and posted as the WR's 8
// bytes of inline data (docs/daemon-protocol.md, "Work requests").
static void wr_atomic_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, const void *data)
{
	struct sr_wr *w = add(qp, IBV_WR_ATOMIC_WRITE);
	if (!w)
		return;
	w->wr.wr.rdma.rkey = rkey;
	w->wr.wr.rdma.remote_addr = addr;
	char *p = inl_take(qx(qp)->wr_api, w, 8);
	if (p)
		memcpy(p, data, 8);
}

// wr_flush is ibv_wr_flush (rdma-core 45+; IBTA 1.5 FLUSH, A19.4.1): the range, placement
// type and selectivity level travel in the WR's atomic fields as the wire's send WR carries
// them (compare_add the length, swap type | level << SR_FLUSH_LEVEL_SHIFT); the engine checks
// them (qp.ValidateSend).
static void wr_flush(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, size_t len, uint8_t type, uint8_t level)
{
	struct sr_wr *w = add(qp, (enum ibv_wr_opcode)SR_WR_FLUSH);
	if (!w)
		return;
	w->wr.wr.atomic.rkey = rkey;
	w->wr.wr.atomic.remote_addr = addr;
	w->wr.wr.atomic.compare_add = len;
	w->wr.wr.atomic.swap = type | (uint64_t)level << SR_FLUSH_LEVEL_SHIFT;
}

static void wr_set_ud_addr(struct ibv_qp_ex *qp, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct sr_wr *w = cur(qp);
	if (w) {
		w->wr.wr.ud.ah = ah;
		w->wr.wr.ud.remote_qpn = qpn;
		w->wr.wr.ud.remote_qkey = qkey;
	}
}

static void wr_set_sge_list(struct ibv_qp_ex *qp, size_t n, const struct ibv_sge *sg)
{
	struct sr_wr *w = cur(qp);
	struct sr_wrs *b = qx(qp)->wr_api;
	if (!w)
		return;
	if (n > 255) {
		b->err = EINVAL;
		return;
	}
	if ((b->err = reserve((void **)&b->sges, &b->sges_cap, b->nsges + (uint32_t)n, sizeof(*b->sges))))
		return;
	w->sge_off = b->nsges;
	w->nsge = (uint32_t)n;
	if (n)
		memcpy(&b->sges[b->nsges], sg, n * sizeof(*sg));
	b->nsges += (uint32_t)n;
}

static void wr_set_sge(struct ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge s = {.addr = addr, .length = length, .lkey = lkey};
	wr_set_sge_list(qp, 1, &s);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *qp, size_t n, const struct ibv_data_buf *bufs)
{
	struct sr_wr *w = cur(qp);
	struct sr_wrs *b = qx(qp)->wr_api;
	if (!w)
		return;
	size_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += bufs[i].length;
	if (total > qx(qp)->cap.max_inline_data) {
		b->err = EINVAL;
		return;
	}
	char *p = inl_take(b, w, total);
	for (size_t i = 0; p && i < n; p += bufs[i].length, i++)
		memcpy(p, bufs[i].addr, bufs[i].length);
}

static void wr_set_inline_data(struct ibv_qp_ex *qp, void *addr, size_t length)
{
	struct ibv_data_buf d = {.addr = addr, .length = length};
	wr_set_inline_data_list(qp, 1, &d);
}

static void reset(struct sr_wrs *b)
{
	b->n = 0;
	b->nsges = 0;
	b->ninl = 0;
	b->err = 0;
}

static void wr_start(struct ibv_qp_ex *qp)
{
	struct sr_qp *q = qx(qp);
	pthread_mutex_lock(&q->post_mu);
	reset(q->wr_api);
}

static int wr_complete(struct ibv_qp_ex *qp)
{
	struct sr_qp *q = qx(qp);
	struct sr_wrs *b = q->wr_api;
	int err = b->err;
	if (!err && b->n) {
		// One inline SGE per inline WR, in an array of its own (the
		// batch's SGEs stay where they are).
		struct ibv_sge *isg = NULL;
		uint32_t ninl = 0;
		for (uint32_t i = 0; i < b->n; i++)
			ninl += (b->wrs[i].wr.send_flags & IBV_SEND_INLINE) != 0;
		if (ninl && !(isg = calloc(ninl, sizeof(*isg))))
			err = ENOMEM;
		for (uint32_t i = 0, k = 0; !err && i < b->n; i++) {
			struct sr_wr *w = &b->wrs[i];
			if (w->wr.send_flags & IBV_SEND_INLINE) {
				isg[k] = (struct ibv_sge){.addr = (uintptr_t)(b->inl + w->inl_off), .length = w->inl_len};
				w->wr.sg_list = &isg[k++];
				w->wr.num_sge = 1;
			} else {
				w->wr.sg_list = w->nsge ? &b->sges[w->sge_off] : NULL;
				w->wr.num_sge = (int)w->nsge;
			}
			w->wr.next = i + 1 < b->n ? &b->wrs[i + 1].wr : NULL;
		}
		if (!err) {
			struct ibv_send_wr *bad;
			err = sr_post_send_locked(q, &b->wrs[0].wr, &bad);
		}
		free(isg);
	}
	reset(b);
	pthread_mutex_unlock(&q->post_mu);
	return err;
}

static void wr_abort(struct ibv_qp_ex *qp)
{
	struct sr_qp *q = qx(qp);
	reset(q->wr_api);
	pthread_mutex_unlock(&q->post_mu);
}

void sr_wr_init(struct sr_qp *q)
{
	q->wr_api = calloc(1, sizeof(*q->wr_api));
	if (!q->wr_api)
		return; // ibv_qp_to_qp_ex refuses
	struct ibv_qp_ex *x = &q->qpx;
	x->wr_atomic_cmp_swp = wr_cmp_swp;
	x->wr_atomic_fetch_add = wr_fetch_add;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_local_inv = wr_local_inv;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_send_inv = wr_send_inv;
	x->wr_send_tso = wr_send_tso;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_atomic_write = wr_atomic_write;
	q->wr_flush = wr_flush;
}

void sr_wr_free(struct sr_qp *q)
{
	struct sr_wrs *b = q->wr_api;
	if (!b)
		return;
	free(b->wrs);
	free(b->sges);
	free(b->inl);
	free(b);
	q->wr_api = NULL;
}
