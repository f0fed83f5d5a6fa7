// Helpers for the C tests that run against a daemon ($SOFTROCE_SOCKET): opening
// its one device, connecting an RC QP to another QP of the same device, and
// waiting for completions through a completion channel. Static inline, as each
// test uses only some of them.
#ifndef SOFTROCE_CLIB_DAEMON_H
#define SOFTROCE_CLIB_DAEMON_H

#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <infiniband/verbs.h>

#include "check.h"

// open_device opens the daemon's one device for the test name. On NULL, *rc
// is the test's exit status: 77 (skipped) without $SOFTROCE_SOCKET, else
// check_done's (no device, or more than one, or it would not open).
static inline struct ibv_context *open_device(const char *name, int *rc)
{
	const char *sock = getenv("SOFTROCE_SOCKET");
	if (!sock || !*sock) {
		printf("%s: no SOFTROCE_SOCKET, skipped\n", name);
		*rc = 77;
		return NULL;
	}
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1);
	if (!list || n < 1) {
		ibv_free_device_list(list);
		*rc = check_done(name);
		return NULL;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	CHECK(ctx != NULL);
	if (!ctx)
		*rc = check_done(name);
	return ctx;
}

// connect_rc moves RC QP q of ctx from RESET through INIT and RTR to RTS,
// connected to QP remote of the same device (GID 1, MTU 1024, PSNs 0):
// access is what q lets its peer do (qp_access_flags), rd_atomic the READs
// and atomics outstanding each way (max_dest_rd_atomic, max_rd_atomic).
static inline int connect_rc(struct ibv_context *ctx, struct ibv_qp *q, uint32_t remote, unsigned int access,
			     uint8_t rd_atomic)
{
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid))
		return -1;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access};
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = remote,
				 .rq_psn = 0, .max_dest_rd_atomic = rd_atomic, .min_rnr_timer = 12};
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
				 .sq_psn = 0, .max_rd_atomic = rd_atomic};
	return ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

// wait_channel waits for n completions of cq into wc, sleeping on its
// completion channel ch (10 s at most for each event): n, or -1.
static inline int wait_channel(struct ibv_cq *cq, struct ibv_comp_channel *ch, struct ibv_wc *wc, int n)
{
	int got = 0;
	while (got < n) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		if (k < 0)
			return -1;
		if ((got += k) == n)
			break;
		if (ibv_req_notify_cq(cq, 0))
			return -1;
		if ((k = ibv_poll_cq(cq, n - got, wc + got)) < 0)
			return -1;
		if ((got += k) == n)
			break;
		struct pollfd p = {.fd = ch->fd, .events = POLLIN};
		if (poll(&p, 1, 10000) != 1)
			return -1;
		struct ibv_cq *ecq;
		void *ectx;
		if (ibv_get_cq_event(ch, &ecq, &ectx) || ecq != cq)
			return -1;
		ibv_ack_cq_events(cq, 1);
	}
	return got;
}

#endif
