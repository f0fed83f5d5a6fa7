// The daemon protocol (docs/daemon-protocol.md, include/softroce/proto.h):
// one request, one response on the session's SOCK_SEQPACKET socket, file
// descriptors passed with SCM_RIGHTS; and the session's first requests,
// which describe the device.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sr.h"

// sr_debug reports whether $SOFTROCE_DEBUG asks for the daemon's error
// messages on stderr.
int sr_debug(void)
{
	static int v = -1;
	if (v < 0) {
		const char *d = getenv("SOFTROCE_DEBUG");
		v = d && *d && strcmp(d, "0");
	}
	return v;
}

// take_fds stores the descriptors of an SCM_RIGHTS message: up to max into
// fds, the rest closed (a response never leaks a descriptor).
static int take_fds(struct msghdr *mh, int *fds, int max)
{
	int n = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *p = (int *)(void *)CMSG_DATA(cm);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, &p[i], sizeof(fd));
			if (n < max)
				fds[n++] = fd;
			else
				close(fd);
		}
	}
	return n;
}

int sr_call(struct sr_conn *c, struct sr_call *call)
{
	struct sr_hdr h = {.op = call->op};
	struct iovec iov[2] = {
		{.iov_base = &h, .iov_len = sizeof(h)},
		{.iov_base = (void *)call->req, .iov_len = call->reqlen},
	};
	union {
		char buf[CMSG_SPACE(sizeof(int) * SR_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = call->reqlen ? 2 : 1};
	if (call->nfds > 0) {
		if (call->nfds > SR_MAX_FDS)
			return sr_fail(EINVAL);
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)call->nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)call->nfds);
		memcpy(CMSG_DATA(cm), call->fds, sizeof(int) * (size_t)call->nfds);
	}

	pthread_mutex_lock(&c->mu);
	if (c->fd < 0) { // the session is closed (a fork's child: not its session)
		pthread_mutex_unlock(&c->mu);
		return sr_fail(ENOTCONN);
	}
	ssize_t n;
	do
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		int e = errno == EPIPE || errno == ECONNRESET ? ENOTCONN : errno;
		pthread_mutex_unlock(&c->mu);
		return sr_fail(e);
	}
	if (call->noreply) {
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	struct iovec riov = {.iov_base = c->rbuf, .iov_len = SR_MAX_MSG};
	struct msghdr rh = {.msg_iov = &riov, .msg_iovlen = 1};
	memset(&ctl, 0, sizeof(ctl));
	rh.msg_control = ctl.buf;
	rh.msg_controllen = sizeof(ctl.buf);
	do
		n = recvmsg(c->fd, &rh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	int got = n > 0 ? take_fds(&rh, call->rfds, call->maxrfds) : 0;
	if (n <= 0) {
		int e = n == 0 || errno == ECONNRESET ? ENOTCONN : errno;
		pthread_mutex_unlock(&c->mu);
		return sr_fail(e);
	}
	struct sr_hdr rhdr = {0};
	if ((size_t)n >= sizeof(rhdr))
		memcpy(&rhdr, c->rbuf, sizeof(rhdr));
	// A success answer means the daemon carried the request out, even when what came
	// with it is cut short below.
	call->took_effect = (size_t)n >= sizeof(rhdr) && rhdr.op == call->op && rhdr.status == 0;
	if ((size_t)n < sizeof(rhdr) || (rh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		pthread_mutex_unlock(&c->mu);
		for (int i = 0; i < got; i++)
			close(call->rfds[i]);
		return sr_fail(EPROTO);
	}
	size_t blen = (size_t)n - sizeof(rhdr);
	const char *body = c->rbuf + sizeof(rhdr);
	if (rhdr.op != call->op) {
		pthread_mutex_unlock(&c->mu);
		for (int i = 0; i < got; i++)
			close(call->rfds[i]);
		return sr_fail(EPROTO);
	}
	if (rhdr.status != 0) {
		struct sr_err e = {0};
		if (blen >= sizeof(e))
			memcpy(&e, body, sizeof(e));
		if (sr_debug()) {
			int ml = blen > sizeof(e) ? (int)(blen - sizeof(e)) : 0;
			fprintf(stderr, "softroce: op %u: %s (code %u): %.*s\n", call->op, strerror(rhdr.status),
				e.code, ml, body + sizeof(e));
		}
		call->code = e.code;
		call->bad_wr = e.bad_wr;
		pthread_mutex_unlock(&c->mu);
		for (int i = 0; i < got; i++)
			close(call->rfds[i]);
		return sr_fail(rhdr.status > 0 ? rhdr.status : EPROTO);
	}
	// A body longer than the caller's buffer is a newer daemon's larger
	// structure: the caller reads the prefix it knows.
	size_t k = blen < call->respcap ? blen : call->respcap;
	if (k)
		memcpy(call->resp, body, k);
	call->resplen = blen;
	call->nrfds = got;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

// sr_simple sends a request with a fixed body and reads a fixed response
// of exactly resplen bytes (or at least that many).
int sr_simple(struct sr_conn *c, uint16_t op, const void *req, size_t reqlen, void *resp,
	      size_t resplen)
{
	struct sr_call call = {.op = op, .req = req, .reqlen = reqlen, .resp = resp, .respcap = resplen};
	if (sr_call(c, &call) < 0)
		return -1;
	if (call.resplen < resplen)
		return sr_fail(EPROTO);
	return 0;
}

static void device_attr(struct ibv_device_attr *a, const struct sr_device_attr *d)
{
	memset(a, 0, sizeof(*a));
	memcpy(a->fw_ver, d->fw_ver, sizeof(a->fw_ver));
	a->fw_ver[sizeof(a->fw_ver) - 1] = 0;
	a->node_guid = htobe64(d->node_guid);
	a->sys_image_guid = htobe64(d->sys_image_guid);
	a->max_mr_size = d->max_mr_size;
	a->page_size_cap = d->page_size_cap;
	a->vendor_id = d->vendor_id;
	a->vendor_part_id = d->vendor_part_id;
	a->hw_ver = d->hw_ver;
	a->max_qp = d->max_qp;
	a->max_qp_wr = d->max_qp_wr;
	a->device_cap_flags = (unsigned int)d->device_cap_flags;
	a->max_sge = d->max_sge;
	a->max_sge_rd = d->max_sge_rd;
	a->max_cq = d->max_cq;
	a->max_cqe = d->max_cqe;
	a->max_mr = d->max_mr;
	a->max_pd = d->max_pd;
	a->max_qp_rd_atom = d->max_qp_rd_atom;
	a->max_ee_rd_atom = d->max_ee_rd_atom;
	a->max_res_rd_atom = d->max_res_rd_atom;
	a->max_qp_init_rd_atom = d->max_qp_init_rd_atom;
	a->max_ee_init_rd_atom = d->max_ee_init_rd_atom;
	a->atomic_cap = (enum ibv_atomic_cap)d->atomic_cap;
	a->max_ee = d->max_ee;
	a->max_rdd = d->max_rdd;
	a->max_mw = d->max_mw;
	a->max_raw_ipv6_qp = d->max_raw_ipv6_qp;
	a->max_raw_ethy_qp = d->max_raw_ethy_qp;
	a->max_mcast_grp = d->max_mcast_grp;
	a->max_mcast_qp_attach = d->max_mcast_qp_attach;
	a->max_total_mcast_qp_attach = d->max_total_mcast_qp_attach;
	a->max_ah = d->max_ah;
	a->max_srq = d->max_srq;
	a->max_srq_wr = d->max_srq_wr;
	a->max_srq_sge = d->max_srq_sge;
	a->max_pkeys = d->max_pkeys;
	a->local_ca_ack_delay = d->local_ca_ack_delay;
	a->phys_port_cnt = d->phys_port_cnt;
}

static void port_attr(struct ibv_port_attr *a, const struct sr_port_attr *p)
{
	memset(a, 0, sizeof(*a));
	a->state = (enum ibv_port_state)p->state;
	a->max_mtu = (enum ibv_mtu)p->max_mtu;
	a->active_mtu = (enum ibv_mtu)p->active_mtu;
	a->gid_tbl_len = p->gid_tbl_len;
	a->port_cap_flags = p->port_cap_flags;
	a->max_msg_sz = p->max_msg_sz;
	a->bad_pkey_cntr = p->bad_pkey_cntr;
	a->qkey_viol_cntr = p->qkey_viol_cntr;
	a->pkey_tbl_len = p->pkey_tbl_len;
	a->lid = p->lid;
	a->sm_lid = p->sm_lid;
	a->lmc = p->lmc;
	a->max_vl_num = p->max_vl_num;
	a->sm_sl = p->sm_sl;
	a->subnet_timeout = p->subnet_timeout;
	a->init_type_reply = p->init_type_reply;
	a->active_width = p->active_width;
	a->active_speed = p->active_speed;
	a->phys_state = p->phys_state;
	a->link_layer = p->link_layer;
	a->flags = p->flags;
	a->port_cap_flags2 = p->port_cap_flags2;
}

int sr_hello(struct sr_conn *c, struct sr_devinfo *info)
{
	struct sr_hello_req req = {.magic = SR_PROTO_MAGIC, .version = SR_PROTO_VERSION};
	struct sr_hello_resp hr;
	if (sr_simple(c, SR_OP_HELLO, &req, sizeof(req), &hr, sizeof(hr)) < 0)
		return -1;
	if (hr.magic != SR_PROTO_MAGIC || hr.version != SR_PROTO_VERSION)
		return sr_fail(EPROTONOSUPPORT);
	memset(info, 0, sizeof(*info));
	memcpy(info->name, hr.dev_name, sizeof(info->name) - 1);
	info->node_guid = htobe64(hr.node_guid);

	struct sr_device_attr da;
	if (sr_simple(c, SR_OP_QUERY_DEVICE, NULL, 0, &da, sizeof(da)) < 0)
		return -1;
	device_attr(&info->attr, &da);
	info->max_inline_data = da.max_inline_data;
	info->device_cap_flags_ex = da.device_cap_flags;
	info->max_cq_moderation_count = da.max_cq_moderation_count;
	info->max_cq_moderation_period = da.max_cq_moderation_period;

	struct sr_port_req pr = {.port = 1};
	struct sr_port_attr pa;
	if (sr_simple(c, SR_OP_QUERY_PORT, &pr, sizeof(pr), &pa, sizeof(pa)) < 0)
		return -1;
	port_attr(&info->port, &pa);

	struct {
		struct sr_gids_resp h;
		struct sr_gid_entry e[SR_MAX_GIDS];
	} g;
	struct sr_call call = {.op = SR_OP_QUERY_GIDS, .req = &pr, .reqlen = sizeof(pr), .resp = &g, .respcap = sizeof(g)};
	if (sr_call(c, &call) < 0)
		return -1;
	if (call.resplen < sizeof(g.h))
		return sr_fail(EPROTO);
	uint32_t n = g.h.count;
	if (n > SR_MAX_GIDS)
		n = SR_MAX_GIDS;
	if (call.resplen < sizeof(g.h) + n * sizeof(g.e[0]))
		return sr_fail(EPROTO);
	info->ngids = (int)n;
	for (uint32_t i = 0; i < n; i++) {
		memcpy(info->gids[i].raw, g.e[i].gid, 16);
		info->gid_ifindex[i] = g.e[i].ndev_ifindex;
		memcpy(info->gid_ndev[i], g.e[i].ndev_name, sizeof(info->gid_ndev[i]) - 1);
	}
	return 0;
}
