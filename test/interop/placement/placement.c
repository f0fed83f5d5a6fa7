// placement: an RC peer for the IBTA 1.5 memory placement operations (RDMA ATOMIC WRITE,
// FLUSH) over libibverbs, for the interop pairings against kernel rxe 6.2+ (docs/interop.md,
// "IBTA 1.5 memory placement"). Debian 12's rdma-core 44 has ibv_wr_atomic_write but no
// ibv_wr_flush (no wr_flush in its struct ibv_qp_ex): built against it (build), this side
// issues ATOMIC WRITE and answers FLUSH. Built with -DPLACEMENT_FLUSH against a libibverbs
// that has ibv_wr_flush (build-flush: Debian 13's rdma-core 56), the client also sends
// FLUSHes (steps marked F below).
//
// usage: placement -d DEVICE [-g GID_INDEX] [-p TCP_PORT] [SERVER_ADDR]
//   server (no SERVER_ADDR): the responder. A 4096-byte region filled with pattern(i) =
//     i*7+3, registered LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|FLUSH_GLOBAL (the QP's access
//     flags the same). Prints "placement: listening" once it listens; after the client's
//     "done" it prints the region as 64 lines "mem OFFSET HEX" and exits 0.
//   client: the requester. Runs the sequence below against the server's region, printing one
//     "wc ..." line per completion; exits 0 only if every completion has its opcode and
//     IBV_WC_SUCCESS and the READs return what the ATOMIC WRITEs placed.
//       1. RDMA WRITE   256 bytes, byte k = 0xa5 ^ k, at offset 512
//    F  2. FLUSH        global visibility, Memory Region Range level, [512, 768)
//       3. ATOMIC WRITE 0x1122334455667788 at offset 8
//       4. ATOMIC WRITE 0x0102030405060708 at offset 4088 (the region's last word)
//       5. RDMA READ    8 bytes at offset 8      (must see step 3)
//       6. ATOMIC WRITE 0x8877665544332211 at offset 8 (over step 3)
//       7. RDMA READ    16 bytes at offset 4080  (must see step 4)
//    F  8. FLUSH        global visibility, Memory Region level, with a range wholly past the
//                       region (IBTA A19.4.1: the range is not used at that level)
//     The client prints "placement: client ok (N operations)" at the end, N = 6 or 8.
// The out-of-band exchange is one TCP connection: each side sends one line
// "QPN PSN GID VA RKEY" (hex; the GID as 32 hex digits), the client first; then the client
// sends "done" and the server answers "bye" after printing its region.
// Built by test/interop/placement/build (gcc, libibverbs); never committed as a binary.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

// rdma-core 45+ names these; 44 passes the kernel's values through unchanged.
#ifndef IBV_ACCESS_FLUSH_GLOBAL
#define IBV_ACCESS_FLUSH_GLOBAL (1 << 8)
#endif

enum { REGION = 4096, PSN_CLIENT = 0x1234, PSN_SERVER = 0x5678 };

struct peer {
	uint32_t qpn, psn, rkey;
	uint64_t va;
	union ibv_gid gid;
};

static void die(const char *what)
{
	fprintf(stderr, "placement: %s: %s\n", what, errno ? strerror(errno) : "failed");
	exit(1);
}

static uint8_t pattern(size_t i) { return (uint8_t)(i * 7 + 3); }

static int send_line(int fd, const char *s)
{
	size_t n = strlen(s);
	return write(fd, s, n) == (ssize_t)n ? 0 : -1;
}

// read_line reads up to '\n' (not included) into buf.
static int read_line(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap) {
		char c;
		ssize_t r = read(fd, &c, 1);
		if (r != 1)
			return -1;
		if (c == '\n') {
			buf[n] = 0;
			return 0;
		}
		buf[n++] = c;
	}
	return -1;
}

static void format_peer(char *out, size_t cap, const struct peer *p)
{
	char gid[33];
	for (int i = 0; i < 16; i++)
		snprintf(gid + 2 * i, 3, "%02x", p->gid.raw[i]);
	snprintf(out, cap, "%06x %06x %s %016llx %08x\n", p->qpn, p->psn, gid,
		 (unsigned long long)p->va, p->rkey);
}

static int parse_peer(const char *s, struct peer *p)
{
	char gid[33];
	unsigned long long va;
	if (sscanf(s, "%x %x %32s %llx %x", &p->qpn, &p->psn, gid, &va, &p->rkey) != 5 ||
	    strlen(gid) != 32)
		return -1;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(gid + 2 * i, "%2x", &v) != 1)
			return -1;
		p->gid.raw[i] = (uint8_t)v;
	}
	p->va = va;
	return 0;
}

static void to_rts(struct ibv_qp *qp, int port, int gid_index, const struct peer *remote, uint32_t sq_psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = remote->qpn,
		.rq_psn = remote->psn,
		.max_dest_rd_atomic = 4,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.port_num = (uint8_t)port,
			.grh = {.dgid = remote->gid, .sgid_index = (uint8_t)gid_index, .hop_limit = 64},
		},
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify QP to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify QP to RTS");
}

// wait_wc polls one completion and checks its opcode and status.
static int wait_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	int n;
	for (long spins = 0; (n = ibv_poll_cq(cq, 1, &wc)) == 0; spins++) {
		if (spins > 200000000L) {
			fprintf(stderr, "placement: no completion for wr %llu\n", (unsigned long long)wr_id);
			return -1;
		}
	}
	if (n < 0)
		die("poll CQ");
	printf("wc wr_id=%llu opcode=%d status=%d (%s) byte_len=%u\n", (unsigned long long)wc.wr_id,
	       wc.opcode, wc.status, ibv_wc_status_str(wc.status), wc.byte_len);
	if (wc.wr_id != wr_id || wc.opcode != op || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "placement: wr %llu: want opcode %d status 0\n", (unsigned long long)wr_id, op);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *dev_name = NULL, *server = NULL;
	int gid_index = 1, port = 18516, opt;
	while ((opt = getopt(argc, argv, "d:g:p:")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'g': gid_index = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: placement -d DEVICE [-g GID_INDEX] [-p TCP_PORT] [SERVER_ADDR]\n");
			return 2;
		}
	}
	if (optind < argc)
		server = argv[optind];
	if (!dev_name) {
		fprintf(stderr, "placement: -d DEVICE is required\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && i < num && !ctx; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("open device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq)
		die("PD/CQ");
	uint8_t *buf = aligned_alloc(4096, REGION);
	if (!buf)
		die("alloc");
	for (size_t i = 0; i < REGION; i++)
		buf[i] = server ? 0 : pattern(i);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (!server)
		access |= IBV_ACCESS_FLUSH_GLOBAL;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, REGION, access);
	if (!mr)
		die("register MR");

	struct ibv_qp_init_attr_ex init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				  IBV_QP_EX_WITH_ATOMIC_WRITE
#ifdef PLACEMENT_FLUSH
				  | IBV_QP_EX_WITH_FLUSH
#endif
		,
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &init);
	if (!qp)
		die("create QP (ATOMIC WRITE send ops)");
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = (unsigned)access};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify QP to INIT");

	struct peer me = {.qpn = qp->qp_num, .psn = server ? PSN_CLIENT : PSN_SERVER,
			  .va = (uintptr_t)buf, .rkey = mr->rkey};
	if (ibv_query_gid(ctx, 1, gid_index, &me.gid))
		die("query GID");

	int fd;
	char line[256];
	struct peer remote;
	if (!server) {
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
		if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1))
			die("listen");
		printf("placement: listening on port %d (qpn %#x rkey %#x)\n", port, me.qpn, me.rkey);
		fd = accept(ls, NULL, NULL);
		close(ls);
		if (fd < 0)
			die("accept");
		if (read_line(fd, line, sizeof(line)) || parse_peer(line, &remote))
			die("read the client's address");
		to_rts(qp, 1, gid_index, &remote, me.psn);
		format_peer(line, sizeof(line), &me);
		if (send_line(fd, line))
			die("send our address");
		if (read_line(fd, line, sizeof(line)) || strcmp(line, "done"))
			die("read done");
		for (size_t off = 0; off < REGION; off += 64) {
			printf("mem %04zx ", off);
			for (size_t k = 0; k < 64; k++)
				printf("%02x", buf[off + k]);
			printf("\n");
		}
		send_line(fd, "bye\n");
		close(fd);
		return 0;
	}

	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	char ps[16];
	snprintf(ps, sizeof(ps), "%d", port);
	if (getaddrinfo(server, ps, &hints, &ai))
		die("resolve the server");
	fd = -1;
	for (int tries = 0; tries < 100 && fd < 0; tries++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
			close(fd);
			fd = -1;
			usleep(100000);
		}
	}
	freeaddrinfo(ai);
	if (fd < 0)
		die("connect");
	format_peer(line, sizeof(line), &me);
	if (send_line(fd, line) || read_line(fd, line, sizeof(line)) || parse_peer(line, &remote))
		die("address exchange");
	to_rts(qp, 1, gid_index, &remote, me.psn);

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qp);
	const uint64_t w1 = 0x1122334455667788ull, w2 = 0x0102030405060708ull, w3 = 0x8877665544332211ull;
	uint8_t *src = buf;       // 256 bytes: the WRITE's data
	uint8_t *rd = buf + 1024; // READ landing area
	for (int k = 0; k < 256; k++)
		src[k] = (uint8_t)(0xa5 ^ k);
	memset(rd, 0, 64);
	int bad = 0;
	// le64 payloads: the 8 bytes are placed as they are in memory (IBTA 9.4.7: the
	// responder stores them unchanged), so the region's bytes are these values' LE bytes
	uint64_t p1 = htole64(w1), p2 = htole64(w2), p3 = htole64(w3);
	struct {
		int op; // 0 write, 1 atomic write, 2 read, 3 flush (range), 4 flush (whole region)
		uint64_t off, len;
		const uint64_t *word;
		size_t local;
		enum ibv_wc_opcode wc;
	} seq[] = {
		{0, 512, 256, NULL, 0, IBV_WC_RDMA_WRITE},
#ifdef PLACEMENT_FLUSH
		{3, 512, 256, NULL, 0, IBV_WC_FLUSH},
#endif
		{1, 8, 8, &p1, 0, IBV_WC_ATOMIC_WRITE},
		{1, 4088, 8, &p2, 0, IBV_WC_ATOMIC_WRITE},
		{2, 8, 8, NULL, 1024, IBV_WC_RDMA_READ},
		{1, 8, 8, &p3, 0, IBV_WC_ATOMIC_WRITE},
		{2, 4080, 16, NULL, 1040, IBV_WC_RDMA_READ},
#ifdef PLACEMENT_FLUSH
		{4, 2 * REGION, REGION, NULL, 0, IBV_WC_FLUSH},
#endif
	};
	const size_t nseq = sizeof(seq) / sizeof(seq[0]);
	for (size_t i = 0; i < nseq; i++) {
		ibv_wr_start(qx);
		qx->wr_id = i + 1;
		qx->wr_flags = IBV_SEND_SIGNALED;
		switch (seq[i].op) {
		case 0:
			ibv_wr_rdma_write(qx, remote.rkey, remote.va + seq[i].off);
			ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)src, (uint32_t)seq[i].len);
			break;
		case 1:
			ibv_wr_atomic_write(qx, remote.rkey, remote.va + seq[i].off, seq[i].word);
			break;
#ifdef PLACEMENT_FLUSH
		case 3:
		case 4:
			ibv_wr_flush(qx, remote.rkey, remote.va + seq[i].off, (size_t)seq[i].len, IBV_FLUSH_GLOBAL,
				     seq[i].op == 3 ? IBV_FLUSH_RANGE : IBV_FLUSH_MR);
			break;
#endif
		default:
			ibv_wr_rdma_read(qx, remote.rkey, remote.va + seq[i].off);
			ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(buf + seq[i].local), (uint32_t)seq[i].len);
		}
		if (ibv_wr_complete(qx)) {
			fprintf(stderr, "placement: post wr %zu failed\n", i + 1);
			return 1;
		}
		if (wait_wc(cq, i + 1, seq[i].wc))
			return 1;
	}
	uint64_t r1, r2;
	memcpy(&r1, rd, 8);
	memcpy(&r2, rd + 16 + 8, 8);
	if (le64toh(r1) != w1) {
		fprintf(stderr, "placement: READ at offset 8 got %#llx, want %#llx\n", (unsigned long long)le64toh(r1), (unsigned long long)w1);
		bad = 1;
	}
	if (le64toh(r2) != w2) {
		fprintf(stderr, "placement: READ at offset 4088 got %#llx, want %#llx\n", (unsigned long long)le64toh(r2), (unsigned long long)w2);
		bad = 1;
	}
	if (send_line(fd, "done\n") || read_line(fd, line, sizeof(line)) || strcmp(line, "bye"))
		die("finish");
	close(fd);
	if (bad)
		printf("placement: client FAILED\n");
	else
		printf("placement: client ok (%zu operations)\n", nseq);
	return bad;
}
