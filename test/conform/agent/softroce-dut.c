// softroce-dut: the conformance bench's DUT agent over libibverbs (kernel rxe in the lab
// guest, or any ibverbs device). It speaks the line protocol of pkg/conform/proto.go on
// one TCP connection: the bench creates memory regions and QPs with known parameters,
// posts receives and sends, and reads back memory, completions and QP states.
//
// usage: softroce-dut -d DEVICE [-g GID_INDEX] [-p TCP_PORT] [-a LISTEN_ADDR]
// Serves one connection, then exits. Built by test/conform/agent/build (gcc, libibverbs);
// never committed as a binary.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_OBJ 512

struct mr_ent {
	struct ibv_mr *mr;
	unsigned char *buf;
	size_t size;
};

struct qp_ent {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_ah *ah;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index = 1;
static const char *dev_name;
static struct mr_ent mrs[MAX_OBJ];
static struct qp_ent qps[MAX_OBJ];

static char *out;
static size_t out_cap, out_len;

static void reply(const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(out + out_len, out_cap - out_len, fmt, ap);
		va_end(ap);
		if (n < 0)
			return;
		if (out_len + (size_t)n < out_cap) {
			out_len += (size_t)n;
			return;
		}
		out_cap = (out_cap + (size_t)n) * 2;
		out = realloc(out, out_cap);
		if (!out) {
			perror("realloc");
			exit(1);
		}
	}
}

static int fail(const char *what, int err)
{
	out_len = 0;
	reply("ERR %s: %s", what, strerror(err ? err : EINVAL));
	return -1;
}

static int parse_nums(char **f, int n, unsigned long long *v)
{
	for (int i = 0; i < n; i++) {
		char *end;
		errno = 0;
		v[i] = strtoull(f[i], &end, 0);
		if (errno || *end)
			return -1;
	}
	return 0;
}

static struct qp_ent *find_qp(uint32_t qpn)
{
	for (int i = 0; i < MAX_OBJ; i++)
		if (qps[i].qp && qps[i].qp->qp_num == qpn)
			return &qps[i];
	return NULL;
}

static struct mr_ent *find_mr(unsigned long long id)
{
	if (id == 0 || id >= MAX_OBJ || !mrs[id].mr)
		return NULL;
	return &mrs[id];
}

static enum ibv_mtu mtu_enum(unsigned long long b)
{
	switch (b) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return IBV_MTU_1024;
	}
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// cmd_qp: QP type benchip bqpn bpsn dpsn mtu minrnr timeout retry rnrretry maxdest maxrd access qkey
static int cmd_qp(char **f)
{
	unsigned long long v[14];
	struct in_addr ip;
	if (parse_nums(f, 1, v) || inet_pton(AF_INET, f[1], &ip) != 1 || parse_nums(f + 2, 12, v + 2))
		return fail("QP arguments", EINVAL);
	int slot = -1;
	for (int i = 0; i < MAX_OBJ; i++)
		if (!qps[i].qp) { slot = i; break; }
	if (slot < 0)
		return fail("QP table full", ENOMEM);
	struct qp_ent *e = &qps[slot];
	enum ibv_qp_type type = (enum ibv_qp_type)v[0];
	e->cq = ibv_create_cq(ctx, 512, NULL, NULL, 0);
	if (!e->cq)
		return fail("ibv_create_cq", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
		.cap = { .max_send_wr = 64, .max_recv_wr = 256, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	e->qp = ibv_create_qp(pd, &ia);
	if (!e->qp) {
		int err = errno;
		ibv_destroy_cq(e->cq);
		e->cq = NULL;
		return fail("ibv_create_qp", err);
	}
	union ibv_gid dgid;
	memset(&dgid, 0, sizeof dgid);
	dgid.raw[10] = 0xff;
	dgid.raw[11] = 0xff;
	memcpy(&dgid.raw[12], &ip, 4);
	struct ibv_ah_attr av = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid = dgid, .sgid_index = (uint8_t)gid_index, .hop_limit = 64 },
	};
	struct ibv_qp_attr a;
	int err = 0;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (type == IBV_QPT_UD) {
		a.qkey = (uint32_t)v[13];
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = (unsigned)v[12];
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	if ((err = ibv_modify_qp(e->qp, &a, mask)))
		goto bad;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	mask = IBV_QP_STATE;
	if (type != IBV_QPT_UD) {
		a.path_mtu = mtu_enum(v[5]);
		a.dest_qp_num = (uint32_t)v[2];
		a.rq_psn = (uint32_t)v[3] & 0xffffff;
		a.ah_attr = av;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	}
	if (type == IBV_QPT_RC) {
		a.max_dest_rd_atomic = (uint8_t)v[10];
		a.min_rnr_timer = (uint8_t)v[6];
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	}
	if ((err = ibv_modify_qp(e->qp, &a, mask)))
		goto bad;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = (uint32_t)v[4] & 0xffffff;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (type == IBV_QPT_RC) {
		a.timeout = (uint8_t)v[7];
		a.retry_cnt = (uint8_t)v[8];
		a.rnr_retry = (uint8_t)v[9];
		a.max_rd_atomic = (uint8_t)v[11];
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	if ((err = ibv_modify_qp(e->qp, &a, mask)))
		goto bad;
	if (type == IBV_QPT_UD) {
		e->ah = ibv_create_ah(pd, &av);
		if (!e->ah) {
			err = errno;
			goto bad;
		}
	}
	reply("OK %u", e->qp->qp_num);
	return 0;
bad:
	ibv_destroy_qp(e->qp);
	ibv_destroy_cq(e->cq);
	e->qp = NULL;
	e->cq = NULL;
	return fail("ibv_modify_qp", err);
}

static int cmd_mr(char **f)
{
	unsigned long long v[2];
	if (parse_nums(f, 2, v) || v[0] > (64u << 20))
		return fail("MR arguments", EINVAL);
	int id = -1;
	for (int i = 1; i < MAX_OBJ; i++)
		if (!mrs[i].mr) { id = i; break; }
	if (id < 0)
		return fail("MR table full", ENOMEM);
	size_t sz = v[0] ? v[0] : 1;
	void *buf;
	if (posix_memalign(&buf, 4096, sz))
		return fail("posix_memalign", ENOMEM);
	memset(buf, 0, sz);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, v[0], (int)v[1]);
	if (!mr) {
		int err = errno;
		free(buf);
		return fail("ibv_reg_mr", err);
	}
	mrs[id] = (struct mr_ent){ .mr = mr, .buf = buf, .size = v[0] };
	reply("OK %d %u %u %llu", id, mr->rkey, mr->lkey, (unsigned long long)(uintptr_t)buf);
	return 0;
}

static int cmd_mrw(char **f)
{
	unsigned long long v[2];
	if (parse_nums(f, 2, v))
		return fail("MRW arguments", EINVAL);
	struct mr_ent *m = find_mr(v[0]);
	const char *h = f[2];
	size_t n = strcmp(h, "-") ? strlen(h) / 2 : 0;
	if (!m || v[1] > m->size || n > m->size - v[1] || (n && strlen(h) % 2))
		return fail("MRW range", EINVAL);
	for (size_t i = 0; i < n; i++) {
		int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return fail("MRW hex", EINVAL);
		m->buf[v[1] + i] = (unsigned char)(hi << 4 | lo);
	}
	reply("OK");
	return 0;
}

static int cmd_mrr(char **f)
{
	unsigned long long v[3];
	if (parse_nums(f, 3, v))
		return fail("MRR arguments", EINVAL);
	struct mr_ent *m = find_mr(v[0]);
	if (!m || v[1] > m->size || v[2] > m->size - v[1])
		return fail("MRR range", EINVAL);
	reply("OK ");
	if (v[2] == 0)
		reply("-");
	for (unsigned long long i = 0; i < v[2]; i++)
		reply("%02x", m->buf[v[1] + i]);
	return 0;
}

static int cmd_dmr(char **f)
{
	unsigned long long v[1];
	if (parse_nums(f, 1, v))
		return fail("DMR arguments", EINVAL);
	struct mr_ent *m = find_mr(v[0]);
	if (!m)
		return fail("DMR: no such MR", ENOENT);
	int err = ibv_dereg_mr(m->mr);
	if (err)
		return fail("ibv_dereg_mr", err);
	free(m->buf);
	memset(m, 0, sizeof *m);
	reply("OK");
	return 0;
}

static int cmd_recv(char **f)
{
	unsigned long long v[6];
	if (parse_nums(f, 6, v))
		return fail("RECV arguments", EINVAL);
	struct qp_ent *q = find_qp((uint32_t)v[0]);
	struct mr_ent *m = find_mr(v[1]);
	if (!q || !m || v[2] > m->size || v[3] > m->size - v[2])
		return fail("RECV: bad QP or MR range", EINVAL);
	for (unsigned long long i = 0; i < v[4]; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)m->buf + v[2], .length = (uint32_t)v[3], .lkey = m->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = v[5] + i, .sg_list = &sge, .num_sge = v[3] ? 1 : 0 }, *bad;
		int err = ibv_post_recv(q->qp, &wr, &bad);
		if (err)
			return fail("ibv_post_recv", err);
	}
	reply("OK");
	return 0;
}

// SEND qpn op mr off len raddr rkey imm cmpadd swap wrid rqpn rqkey
static int cmd_send(char **f)
{
	unsigned long long v[13];
	if (parse_nums(f, 13, v))
		return fail("SEND arguments", EINVAL);
	struct qp_ent *q = find_qp((uint32_t)v[0]);
	if (!q)
		return fail("SEND: no such QP", ENOENT);
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	if (v[4]) {
		struct mr_ent *m = find_mr(v[2]);
		if (!m || v[3] > m->size || v[4] > m->size - v[3])
			return fail("SEND: bad MR range", EINVAL);
		sge = (struct ibv_sge){ .addr = (uintptr_t)m->buf + v[3], .length = (uint32_t)v[4], .lkey = m->mr->lkey };
		wr.sg_list = &sge;
		wr.num_sge = 1;
	}
	wr.wr_id = v[10];
	wr.opcode = (enum ibv_wr_opcode)v[1];
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl((uint32_t)v[7]);
	switch (wr.opcode) {
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		wr.wr.atomic.remote_addr = v[5];
		wr.wr.atomic.rkey = (uint32_t)v[6];
		wr.wr.atomic.compare_add = v[8];
		wr.wr.atomic.swap = v[9];
		break;
	default:
		wr.wr.rdma.remote_addr = v[5];
		wr.wr.rdma.rkey = (uint32_t)v[6];
	}
	if (q->ah) {
		wr.wr.ud.ah = q->ah;
		wr.wr.ud.remote_qpn = (uint32_t)v[11];
		wr.wr.ud.remote_qkey = (uint32_t)v[12];
	}
	int err = ibv_post_send(q->qp, &wr, &bad);
	if (err)
		return fail("ibv_post_send", err);
	reply("OK");
	return 0;
}

static int cmd_poll(char **f)
{
	unsigned long long v[3];
	if (parse_nums(f, 3, v) || v[1] > 4096)
		return fail("POLL arguments", EINVAL);
	struct qp_ent *q = find_qp((uint32_t)v[0]);
	if (!q)
		return fail("POLL: no such QP", ENOENT);
	struct ibv_wc wc[64];
	char *items = NULL;
	size_t ilen = 0, icap = 0;
	unsigned long long n = 0;
	double deadline = now_ms() + (double)v[2];
	while (n < v[1]) {
		int want = (int)(v[1] - n < 64 ? v[1] - n : 64);
		int k = ibv_poll_cq(q->cq, want, wc);
		if (k < 0)
			return fail("ibv_poll_cq", EIO);
		for (int i = 0; i < k; i++) {
			char one[160];
			int m = snprintf(one, sizeof one, " %llu %d %d %u %u %u %u", (unsigned long long)wc[i].wr_id,
					 wc[i].status, wc[i].opcode, wc[i].byte_len,
					 (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0,
					 wc[i].wc_flags, wc[i].src_qp);
			if (ilen + (size_t)m + 1 > icap) {
				icap = (icap + (size_t)m + 1) * 2;
				items = realloc(items, icap);
				if (!items)
					exit(1);
			}
			memcpy(items + ilen, one, (size_t)m + 1);
			ilen += (size_t)m;
		}
		n += (unsigned long long)k;
		if (n >= v[1])
			break;
		if (k == 0) {
			if (now_ms() >= deadline)
				break;
			usleep(200);
		}
	}
	reply("OK %llu%s", n, items ? items : "");
	free(items);
	return 0;
}

static int cmd_state(char **f)
{
	unsigned long long v[1];
	if (parse_nums(f, 1, v))
		return fail("STATE arguments", EINVAL);
	struct qp_ent *q = find_qp((uint32_t)v[0]);
	if (!q)
		return fail("STATE: no such QP", ENOENT);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int err = ibv_query_qp(q->qp, &a, IBV_QP_STATE, &ia);
	if (err)
		return fail("ibv_query_qp", err);
	reply("OK %d", a.qp_state);
	return 0;
}

static int cmd_dqp(char **f)
{
	unsigned long long v[1];
	if (parse_nums(f, 1, v))
		return fail("DQP arguments", EINVAL);
	struct qp_ent *q = find_qp((uint32_t)v[0]);
	if (!q)
		return fail("DQP: no such QP", ENOENT);
	int err = ibv_destroy_qp(q->qp);
	if (err)
		return fail("ibv_destroy_qp", err);
	if (q->ah)
		ibv_destroy_ah(q->ah);
	ibv_destroy_cq(q->cq);
	memset(q, 0, sizeof *q);
	reply("OK");
	return 0;
}

static const struct {
	const char *name;
	int argc;
	int (*fn)(char **);
} cmds[] = {
	{ "MR", 2, cmd_mr }, { "MRW", 3, cmd_mrw }, { "MRR", 3, cmd_mrr }, { "DMR", 1, cmd_dmr },
	{ "QP", 14, cmd_qp }, { "RECV", 6, cmd_recv }, { "SEND", 13, cmd_send }, { "POLL", 3, cmd_poll },
	{ "STATE", 1, cmd_state }, { "DQP", 1, cmd_dqp },
};

// serve handles one line; returns 1 after BYE.
static int serve(char *line)
{
	char *f[32];
	int n = 0;
	for (char *tok = strtok(line, " \t\r\n"); tok && n < 32; tok = strtok(NULL, " \t\r\n"))
		f[n++] = tok;
	out_len = 0;
	if (n == 0) {
		reply("ERR empty request");
		return 0;
	}
	if (!strcmp(f[0], "HELLO") && n == 1) {
		reply("OK softroce-dut %s", dev_name);
		return 0;
	}
	if (!strcmp(f[0], "BYE") && n == 1) {
		reply("OK");
		return 1;
	}
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		if (strcmp(f[0], cmds[i].name))
			continue;
		if (n - 1 != cmds[i].argc) {
			reply("ERR %s takes %d arguments", cmds[i].name, cmds[i].argc);
			return 0;
		}
		cmds[i].fn(f + 1);
		return 0;
	}
	reply("ERR unknown request %s", f[0]);
	return 0;
}

int main(int argc, char **argv)
{
	int port = 7471, opt;
	const char *listen_addr = "0.0.0.0";
	dev_name = "rxe0";
	while ((opt = getopt(argc, argv, "d:g:p:a:")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'g': gid_index = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 'a': listen_addr = optarg; break;
		default:
			fprintf(stderr, "usage: %s -d DEVICE [-g GID_INDEX] [-p TCP_PORT] [-a LISTEN_ADDR]\n", argv[0]);
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	int ndev;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	if (!list) {
		perror("ibv_get_device_list");
		return 1;
	}
	for (int i = 0; i < ndev; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "softroce-dut: cannot open %s\n", dev_name);
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	if (!pd) {
		perror("ibv_alloc_pd");
		return 1;
	}
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, listen_addr, &sa.sin_addr) != 1 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) {
		perror("softroce-dut: listen");
		return 1;
	}
	printf("softroce-dut: %s gid %d listening on %s:%d\n", dev_name, gid_index, listen_addr, port);
	fflush(stdout);
	int c = accept(ls, NULL, NULL);
	if (c < 0) {
		perror("accept");
		return 1;
	}
	close(ls);
	FILE *in = fdopen(c, "r");
	char *line = NULL;
	size_t cap = 0;
	out_cap = 4096;
	out = malloc(out_cap);
	int bye = 0;
	while (!bye && getline(&line, &cap, in) > 0) {
		bye = serve(line);
		reply("\n");
		size_t off = 0;
		while (off < out_len) {
			ssize_t w = write(c, out + off, out_len - off);
			if (w <= 0)
				return 1;
			off += (size_t)w;
		}
	}
	for (int i = 0; i < MAX_OBJ; i++) {
		if (qps[i].qp) {
			ibv_destroy_qp(qps[i].qp);
			if (qps[i].ah)
				ibv_destroy_ah(qps[i].ah);
			ibv_destroy_cq(qps[i].cq);
		}
		if (mrs[i].mr) {
			ibv_dereg_mr(mrs[i].mr);
			free(mrs[i].buf);
		}
	}
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf("softroce-dut: done\n");
	return 0;
}
