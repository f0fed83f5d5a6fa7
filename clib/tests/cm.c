// librdmacm through daemons, under ASan/UBSan: `cm s ADDR PORT` listens,
// `cm c ADDR PORT` connects (two processes, each on its own daemon via
// $SOFTROCE_SOCKET; test/clib runs both). RC: CONNECT_REQUEST with the
// client's private data, accept, ESTABLISHED, zero-length SENDs both ways
// over QPs made with rdma_create_qp (the daemon moves them), disconnect.
// UD (RDMA_PS_UDP): SIDR resolution, the client's ESTABLISHED names the
// server's QP and Q_Key, an AH made from it. `ext` (RC): the client connects a QP
// it made itself (ibv_create_qp, rdma_init_qp_attr), gets CONNECT_RESPONSE, moves
// it and calls rdma_establish; both sides set RDMA_OPTION_ID_ACK_TIMEOUT and find it
// in their QP's timeout; rdma_set_option's refusals and rdma_join_multicast's
// EOPNOTSUPP. `cm destroy-wait` (one process): a thread waiting in rdma_get_cm_event on a
// channel another thread destroys stays blocked, as on the kernel's ucma, even when a signal
// interrupts its wait: no error, no use of the freed channel (ASan). Without $SOFTROCE_SOCKET
// it exits 77 (skipped).
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

#include "check.h"

static struct rdma_event_channel *ch;

static struct rdma_cm_event *next(enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) {
		fprintf(stderr, "rdma_get_cm_event: %s\n", strerror(errno));
		return NULL;
	}
	if (e->event != want) {
		fprintf(stderr, "event %s (status %d), want %s\n", rdma_event_str(e->event), e->status,
			rdma_event_str(want));
		rdma_ack_cm_event(e);
		return NULL;
	}
	return e;
}

// drop_qp destroys the ID's QP and the PD and CQ make_qp made for it.
static void drop_qp(struct rdma_cm_id *id)
{
	if (!id->qp)
		return;
	struct ibv_pd *pd = id->qp->pd;
	struct ibv_cq *cq = id->qp->send_cq;
	rdma_destroy_qp(id);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

static int make_qp(struct rdma_cm_id *id, enum ibv_qp_type t)
{
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = pd ? ibv_create_cq(id->verbs, 16, NULL, NULL, 0) : NULL;
	if (!cq)
		return -1;
	struct ibv_qp_init_attr a = {.send_cq = cq, .recv_cq = cq, .qp_type = t,
				     .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(id, pd, &a))
		return -1;
	struct ibv_recv_wr r = {.wr_id = 1}, *rb;
	return t == IBV_QPT_RC ? ibv_post_recv(id->qp, &r, &rb) : 0;
}

// pingpong: the client sends first, the server answers each SEND.
static int pingpong(struct ibv_qp *qp, int client, int rounds)
{
	struct ibv_send_wr s = {.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *sb;
	struct ibv_recv_wr r = {.wr_id = 1}, *rb;
	if (client && ibv_post_send(qp, &s, &sb))
		return -1;
	int sent = client, recvd = 0, done = 0;
	while (recvd < rounds || done < rounds) {
		struct ibv_wc wc;
		int k = ibv_poll_cq(qp->send_cq, 1, &wc);
		if (k < 0 || (k == 1 && wc.status != IBV_WC_SUCCESS))
			return -1;
		if (k == 0)
			continue;
		if (wc.opcode == IBV_WC_RECV) {
			recvd++;
			if (ibv_post_recv(qp, &r, &rb))
				return -1;
			if (sent < rounds && ibv_post_send(qp, &s, &sb) == 0)
				sent++;
		} else {
			done++;
		}
	}
	return 0;
}

static int ext; // `ext` mode (main)

static int qp_timeout(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	return ibv_query_qp(qp, &a, IBV_QP_TIMEOUT, &ia) ? -1 : a.timeout;
}

static int set_u8(struct rdma_cm_id *id, int name, uint8_t v)
{
	return rdma_set_option(id, RDMA_OPTION_ID, name, &v, sizeof(v));
}

static void serve(struct sockaddr *sa, enum rdma_port_space ps)
{
	struct rdma_cm_id *l, *id;
	CHECK(rdma_create_id(ch, &l, NULL, ps) == 0);
	CHECK(rdma_bind_addr(l, sa) == 0);
	CHECK(rdma_listen(l, 4) == 0);
	CHECK(rdma_get_src_port(l) == ((struct sockaddr_in *)(void *)sa)->sin_port);
	printf("listening\n");
	fflush(stdout);
	struct rdma_cm_event *e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(e != NULL);
	if (!e)
		return;
	id = e->id;
	CHECK(e->listen_id == l);
	const struct rdma_conn_param *cp = &e->param.conn;
	const void *pdata = ps == RDMA_PS_UDP ? e->param.ud.private_data : cp->private_data;
	CHECK(pdata && !memcmp(pdata, "hello", 6));
	rdma_ack_cm_event(e);
	enum ibv_qp_type t = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
	CHECK(make_qp(id, t) == 0);
	if (ext)
		CHECK(set_u8(id, RDMA_OPTION_ID_ACK_TIMEOUT, 18) == 0);
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1, .private_data = "world",
				    .private_data_len = 6};
	CHECK(rdma_accept(id, &p) == 0);
	if (t == IBV_QPT_RC) {
		e = next(RDMA_CM_EVENT_ESTABLISHED);
		CHECK(e != NULL);
		if (e)
			rdma_ack_cm_event(e);
		if (ext)
			CHECK(qp_timeout(id->qp) == 18);
		CHECK(pingpong(id->qp, 0, 100) == 0);
		e = next(RDMA_CM_EVENT_DISCONNECTED);
		CHECK(e != NULL);
		if (e)
			rdma_ack_cm_event(e);
	}
	drop_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_destroy_id(l) == 0);
}

// connect_ext: rdma_connect for a QP the ID does not own, as rdma-core's
// test_rdmacm_async_traffic_external_qp: CONNECT_RESPONSE, the program moves its QP
// with rdma_init_qp_attr's attributes, rdma_establish sends the RTU.
static void connect_ext(struct rdma_cm_id *id)
{
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = pd ? ibv_create_cq(id->verbs, 16, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = cq ? ibv_create_qp(pd, &ia) : NULL;
	CHECK(qp != NULL);
	if (!qp)
		return;
	CHECK(set_u8(id, RDMA_OPTION_ID_ACK_TIMEOUT, 20) == 0);
	struct ibv_qp_attr a;
	int mask;
	a.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0 && ibv_modify_qp(qp, &a, mask) == 0);
	struct ibv_recv_wr r = {.wr_id = 1}, *rb;
	CHECK(ibv_post_recv(qp, &r, &rb) == 0);
	CHECK(rdma_establish(id) == -1); // nothing to establish yet
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				    .rnr_retry_count = 7, .private_data = "hello", .private_data_len = 6,
				    .qp_num = qp->qp_num};
	CHECK(rdma_connect(id, &p) == 0);
	struct rdma_cm_event *e = next(RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(e != NULL);
	if (!e)
		return;
	CHECK(e->param.conn.private_data && !memcmp(e->param.conn.private_data, "world", 6));
	rdma_ack_cm_event(e);
	a.qp_state = IBV_QPS_RTR;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0 && ibv_modify_qp(qp, &a, mask) == 0);
	a.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0 && (mask & IBV_QP_TIMEOUT) && a.timeout == 20 &&
	      ibv_modify_qp(qp, &a, mask) == 0);
	CHECK(qp_timeout(qp) == 20);
	CHECK(rdma_establish(id) == 0);
	CHECK(pingpong(qp, 1, 100) == 0);
	CHECK(rdma_disconnect(id) == 0);
	e = next(RDMA_CM_EVENT_DISCONNECTED);
	CHECK(e != NULL);
	if (e)
		rdma_ack_cm_event(e);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

// options: what rdma_set_option and the multicast calls refuse, as the kernel's ucma
// does (sizes, unknown names) and softroce must (REUSEADDR, no multicast groups).
static void options(void)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	int on = 1;
	uint8_t tos = 0x20;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &on, sizeof(on)) == -1 && errno == EINVAL);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, 42, &on, sizeof(on)) == -1 && errno == ENOSYS);
	CHECK(rdma_set_option(id, 7, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) == -1 && errno == ENOSYS);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof(on)) == -1 &&
	      errno == EOPNOTSUPP);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof(on)) == 0);
	struct sockaddr_in mc = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0xe0000101)};
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&mc, NULL) == -1 && errno == EOPNOTSUPP);
	CHECK(rdma_destroy_id(id) == 0);
	struct rdma_cm_id *ud;
	CHECK(rdma_create_id(ch, &ud, NULL, RDMA_PS_UDP) == 0);
	CHECK(set_u8(ud, RDMA_OPTION_ID_ACK_TIMEOUT, 14) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(ud) == 0);
}

static void connect_to(struct sockaddr *sa, enum rdma_port_space ps)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, ps) == 0);
	CHECK(rdma_resolve_addr(id, NULL, sa, 2000) == 0);
	struct rdma_cm_event *e = next(RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(e != NULL);
	if (e)
		rdma_ack_cm_event(e);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	e = next(RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK(e != NULL);
	if (e)
		rdma_ack_cm_event(e);
	CHECK(id->route.num_paths == 1 && id->verbs != NULL);
	if (ext) {
		options();
		connect_ext(id);
		CHECK(rdma_destroy_id(id) == 0);
		return;
	}
	enum ibv_qp_type t = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
	CHECK(make_qp(id, t) == 0);
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				    .rnr_retry_count = 7, .private_data = "hello", .private_data_len = 6};
	CHECK(rdma_connect(id, &p) == 0);
	e = next(RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e != NULL);
	if (!e)
		return;
	if (t == IBV_QPT_UD) {
		CHECK(e->param.ud.qp_num != 0 && e->param.ud.qkey != 0);
		CHECK(e->param.ud.private_data && !memcmp(e->param.ud.private_data, "world", 6));
		struct ibv_ah *ah = ibv_create_ah(id->qp->pd, &e->param.ud.ah_attr);
		CHECK(ah != NULL);
		if (ah)
			CHECK(ibv_destroy_ah(ah) == 0);
		rdma_ack_cm_event(e);
	} else {
		CHECK(e->param.conn.private_data && !memcmp(e->param.conn.private_data, "world", 6));
		rdma_ack_cm_event(e);
		CHECK(pingpong(id->qp, 1, 100) == 0);
		CHECK(rdma_disconnect(id) == 0);
		e = next(RDMA_CM_EVENT_DISCONNECTED);
		CHECK(e != NULL);
		if (e)
			rdma_ack_cm_event(e);
	}
	drop_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
}

static volatile pid_t waiter_tid;
static volatile int waiter_ret = 1;

static void *waiter(void *arg)
{
	(void)arg;
	waiter_tid = (pid_t)syscall(SYS_gettid);
	struct rdma_cm_event *e;
	waiter_ret = rdma_get_cm_event(ch, &e); // never returns (the channel has no events)
	return NULL;
}

static void on_usr1(int sig) { (void)sig; }

// in_poll reports whether thread tid sleeps in poll or ppoll (/proc/self/task/TID/syscall).
static int in_poll(pid_t tid)
{
	char path[64], buf[64] = {0};
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	long nr = strtol(buf, NULL, 10);
	return nr == SYS_poll || nr == SYS_ppoll;
}

static int destroy_wait(void)
{
	struct sigaction sa = {.sa_handler = on_usr1}; // no SA_RESTART: the wait is interrupted
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
	pthread_t th;
	CHECK(pthread_create(&th, NULL, waiter, NULL) == 0);
	int waiting = 0;
	for (int i = 0; i < 5000 && !waiting; i++) { // until it waits in poll, at most 5 s
		struct timespec ms = {0, 1000000};
		waiting = waiter_tid && in_poll(waiter_tid);
		if (!waiting)
			nanosleep(&ms, NULL);
	}
	CHECK(waiting);
	rdma_destroy_event_channel(ch);
	CHECK(pthread_kill(th, SIGUSR1) == 0);
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += 300000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	CHECK(pthread_timedjoin_np(th, NULL, &until) == ETIMEDOUT); // still waiting: no error
	CHECK(waiter_ret == 1);
	return check_done("cm destroy-wait"); // (exiting ends the waiting thread)
}

int main(int argc, char **argv)
{
	if (getenv("SOFTROCE_SOCKET") && argc == 2 && !strcmp(argv[1], "destroy-wait")) {
		ch = rdma_create_event_channel();
		CHECK(ch != NULL);
		return ch ? destroy_wait() : check_done("cm destroy-wait");
	}
	if (!getenv("SOFTROCE_SOCKET") || argc < 4) {
		printf("cm: needs SOFTROCE_SOCKET and s|c ADDR PORT [udp|ext], skipped\n");
		return 77;
	}
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
	CHECK(inet_pton(AF_INET, argv[2], &sa.sin_addr) == 1);
	enum rdma_port_space ps = argc > 4 && !strcmp(argv[4], "udp") ? RDMA_PS_UDP : RDMA_PS_TCP;
	ext = argc > 4 && !strcmp(argv[4], "ext");
	ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	if (!ch)
		return check_done("cm");
	if (argv[1][0] == 's')
		serve((struct sockaddr *)&sa, ps);
	else
		connect_to((struct sockaddr *)&sa, ps);
	rdma_destroy_event_channel(ch);
	return check_done(argv[1][0] == 's' ? "cm server" : "cm client");
}
