/* bench/cprobe/pingpong.c: the C baseline of bench/probe (lab probe, bench/lab-probe.sh).
 *   pingpong clock N              ns per clock_gettime(CLOCK_MONOTONIC)
 *   pingpong sleep N US           actual duration of nanosleep(US) (median, us)
 *   pingpong server ADDR PORT [spin]    UDP echo (blocking recvfrom/sendto; spin: MSG_DONTWAIT loop)
 *   pingpong client ADDR PORT N [spin]  8-byte UDP round trips: min/median/p99 in us
 * Built static on the host (gcc -O2 -static), run in the lab guest. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static int cmp(const void *a, const void *b) {
	long long x = *(const long long *)a, y = *(const long long *)b;
	return x < y ? -1 : x > y;
}
static void report(const char *what, long long *v, int n) {
	qsort(v, n, sizeof v[0], cmp);
	printf("%s n=%d min=%.1f median=%.1f p99=%.1f max=%.1f us\n", what, n, v[0] / 1e3, v[n / 2] / 1e3,
	       v[n * 99 / 100] / 1e3, v[n - 1] / 1e3);
}
static struct sockaddr_in addr(const char *ip, int port) {
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}
/* rcv: one datagram; spin = never sleep in the kernel (poll with MSG_DONTWAIT) */
static ssize_t rcv(int fd, char *buf, size_t n, struct sockaddr_in *from, socklen_t *fl, int spin) {
	for (;;) {
		ssize_t k = recvfrom(fd, buf, n, spin ? MSG_DONTWAIT : 0, (struct sockaddr *)from, fl);
		if (k >= 0 || (errno != EAGAIN && errno != EINTR)) return k;
	}
}
int main(int argc, char **argv) {
	if (argc >= 3 && !strcmp(argv[1], "clock")) {
		int n = atoi(argv[2]);
		long long t0 = now_ns(), s = 0;
		for (int i = 0; i < n; i++) s += now_ns() & 1;
		printf("c clock_gettime: %.1f ns/op (n=%d, %lld)\n", (double)(now_ns() - t0) / n, n, s * 0);
		return 0;
	}
	if (argc >= 4 && !strcmp(argv[1], "sleep")) {
		int n = atoi(argv[2]), us = atoi(argv[3]);
		long long *v = calloc(n, sizeof *v);
		for (int i = 0; i < n; i++) {
			struct timespec d = {0, us * 1000L};
			long long t0 = now_ns();
			nanosleep(&d, NULL);
			v[i] = now_ns() - t0;
		}
		char what[64];
		snprintf(what, sizeof what, "c nanosleep(%dus)", us);
		report(what, v, n);
		return 0;
	}
	if (argc >= 4 && !strcmp(argv[1], "server")) {
		int fd = socket(AF_INET, SOCK_DGRAM, 0);
		struct sockaddr_in a = addr(argv[2], atoi(argv[3])), from;
		if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("bind"); return 1; }
		char buf[2048];
		int spin = argc >= 5 && !strcmp(argv[4], "spin");
		for (;;) {
			socklen_t fl = sizeof from;
			ssize_t k = rcv(fd, buf, sizeof buf, &from, &fl, spin);
			if (k < 0) return 1;
			if (k == 1 && buf[0] == 'q') return 0;
			sendto(fd, buf, k, 0, (struct sockaddr *)&from, fl);
		}
	}
	if (argc >= 5 && !strcmp(argv[1], "client")) {
		int fd = socket(AF_INET, SOCK_DGRAM, 0), n = atoi(argv[4]);
		struct sockaddr_in a = addr(argv[2], atoi(argv[3]));
		struct timeval tv = {2, 0};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); return 1; }
		long long *v = calloc(n, sizeof *v);
		char buf[2048] = "pingpong";
		int spin = argc >= 6 && !strcmp(argv[5], "spin");
		for (int i = 0; i < n; i++) {
			long long t0 = now_ns();
			if (send(fd, buf, 8, 0) != 8 || rcv(fd, buf, sizeof buf, NULL, NULL, spin) != 8) { perror("round trip"); return 1; }
			v[i] = now_ns() - t0;
		}
		send(fd, "q", 1, 0);
		report(spin ? "c udp rtt (spin)" : "c udp rtt (block)", v, n);
		return 0;
	}
	fprintf(stderr, "usage: pingpong clock N | sleep N US | server ADDR PORT [spin] | client ADDR PORT N [spin]\n");
	return 2;
}
