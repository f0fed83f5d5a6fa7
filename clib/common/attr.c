// Conversions between the verbs structures and the protocol's fixed-size
// ones (docs/daemon-protocol.md): QP attributes and capacities, RoCEv2
// address vectors. Built into both libraries.
#include <string.h>

#include "sr.h"

void sr_ah_to_wire(struct sr_ah_attr *w, const struct ibv_ah_attr *a)
{
	memset(w, 0, sizeof(*w));
	memcpy(w->dgid, a->grh.dgid.raw, 16);
	w->flow_label = a->grh.flow_label;
	w->sgid_index = a->grh.sgid_index;
	w->hop_limit = a->grh.hop_limit;
	w->traffic_class = a->grh.traffic_class;
	w->sl = a->sl;
	w->port_num = a->port_num;
}

void sr_ah_from_wire(struct ibv_ah_attr *a, const struct sr_ah_attr *w)
{
	memset(a, 0, sizeof(*a));
	memcpy(a->grh.dgid.raw, w->dgid, 16);
	a->grh.flow_label = w->flow_label;
	a->grh.sgid_index = w->sgid_index;
	a->grh.hop_limit = w->hop_limit;
	a->grh.traffic_class = w->traffic_class;
	a->sl = w->sl;
	a->port_num = w->port_num;
	a->is_global = 1;
}

void sr_cap_to_wire(struct sr_qp_cap *w, const struct ibv_qp_cap *c)
{
	memset(w, 0, sizeof(*w));
	w->max_send_wr = c->max_send_wr;
	w->max_recv_wr = c->max_recv_wr;
	w->max_send_sge = c->max_send_sge;
	w->max_recv_sge = c->max_recv_sge;
	w->max_inline_data = c->max_inline_data;
}

void sr_cap_from_wire(struct ibv_qp_cap *c, const struct sr_qp_cap *w)
{
	c->max_send_wr = w->max_send_wr;
	c->max_recv_wr = w->max_recv_wr;
	c->max_send_sge = w->max_send_sge;
	c->max_recv_sge = w->max_recv_sge;
	c->max_inline_data = w->max_inline_data;
}

void sr_qp_attr_to_wire(struct sr_qp_attr *w, const struct ibv_qp_attr *a)
{
	memset(w, 0, sizeof(*w));
	w->qp_state = (uint8_t)a->qp_state;
	w->cur_qp_state = (uint8_t)a->cur_qp_state;
	w->path_mtu = (uint8_t)a->path_mtu;
	w->path_mig_state = (uint8_t)a->path_mig_state;
	w->qkey = a->qkey;
	w->rq_psn = a->rq_psn;
	w->sq_psn = a->sq_psn;
	w->dest_qp_num = a->dest_qp_num;
	w->qp_access_flags = (uint32_t)a->qp_access_flags;
	sr_cap_to_wire(&w->cap, &a->cap);
	sr_ah_to_wire(&w->ah_attr, &a->ah_attr);
	sr_ah_to_wire(&w->alt_ah_attr, &a->alt_ah_attr);
	w->pkey_index = a->pkey_index;
	w->alt_pkey_index = a->alt_pkey_index;
	w->en_sqd_async_notify = a->en_sqd_async_notify;
	w->sq_draining = a->sq_draining;
	w->max_rd_atomic = a->max_rd_atomic;
	w->max_dest_rd_atomic = a->max_dest_rd_atomic;
	w->min_rnr_timer = a->min_rnr_timer;
	w->port_num = a->port_num;
	w->timeout = a->timeout;
	w->retry_cnt = a->retry_cnt;
	w->rnr_retry = a->rnr_retry;
	w->alt_port_num = a->alt_port_num;
	w->alt_timeout = a->alt_timeout;
	w->rate_limit = a->rate_limit;
}

void sr_qp_attr_from_wire(struct ibv_qp_attr *a, const struct sr_qp_attr *w)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = (enum ibv_qp_state)w->qp_state;
	a->cur_qp_state = (enum ibv_qp_state)w->cur_qp_state;
	a->path_mtu = (enum ibv_mtu)w->path_mtu;
	a->path_mig_state = (enum ibv_mig_state)w->path_mig_state;
	a->qkey = w->qkey;
	a->rq_psn = w->rq_psn;
	a->sq_psn = w->sq_psn;
	a->dest_qp_num = w->dest_qp_num;
	a->qp_access_flags = (int)w->qp_access_flags;
	sr_cap_from_wire(&a->cap, &w->cap);
	sr_ah_from_wire(&a->ah_attr, &w->ah_attr);
	sr_ah_from_wire(&a->alt_ah_attr, &w->alt_ah_attr);
	a->pkey_index = w->pkey_index;
	a->alt_pkey_index = w->alt_pkey_index;
	a->en_sqd_async_notify = w->en_sqd_async_notify;
	a->sq_draining = w->sq_draining;
	a->max_rd_atomic = w->max_rd_atomic;
	a->max_dest_rd_atomic = w->max_dest_rd_atomic;
	a->min_rnr_timer = w->min_rnr_timer;
	a->port_num = w->port_num;
	a->timeout = w->timeout;
	a->retry_cnt = w->retry_cnt;
	a->rnr_retry = w->rnr_retry;
	a->alt_port_num = w->alt_port_num;
	a->alt_timeout = w->alt_timeout;
	a->rate_limit = w->rate_limit;
}

