// The libraries without a daemon (SOFTROCE_SOCKET names no socket): no
// device and no crash, clean errors from everything that needs one, and the
// verbs that need no device work.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <infiniband/sa.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "check.h"

void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

int main(void)
{
	setenv("SOFTROCE_SOCKET", "/nonexistent/softroce.sock", 1);

	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list != NULL);
	CHECK(n == 0);
	CHECK(list && list[0] == NULL);
	ibv_free_device_list(list);

	int k = -1;
	struct ibv_context **ctxs = rdma_get_devices(&k);
	CHECK(ctxs != NULL);
	CHECK(k == 0);
	rdma_free_devices(ctxs);

	CHECK(ibv_fork_init() == 0);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);

	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS);
	errno = 0;
	CHECK(rdma_create_event_channel() == NULL && errno != 0);

	// sysfs reader: a file of ours, trailing newline dropped, bounded.
	char dir[] = "/tmp/clib-sysfs-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	char path[64];
	snprintf(path, sizeof(path), "%s/attr", dir);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (f) {
		fputs("hello\n", f);
		fclose(f);
	}
	char buf[16];
	CHECK(ibv_read_sysfs_file(dir, "attr", buf, sizeof(buf)) == 5 && !strcmp(buf, "hello"));
	CHECK(ibv_read_sysfs_file(dir, "attr", buf, 3) == 2 && !strcmp(buf, "he"));
	CHECK(ibv_read_sysfs_file(dir, "missing", buf, sizeof(buf)) == -1);
	unlink(path);
	rmdir(dir);

	// Path records survive the round trip through the kernel structure.
	struct ibv_sa_path_rec a, b;
	struct ib_user_path_rec kern;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	for (unsigned i = 0; i < sizeof(a.dgid.raw); i++) {
		a.dgid.raw[i] = (uint8_t)i;
		a.sgid.raw[i] = (uint8_t)(0xff - i);
	}
	a.dlid = 0x1234;
	a.flow_label = 0x56789;
	a.hop_limit = 64;
	a.traffic_class = 3;
	a.pkey = 0xffff;
	a.mtu = IBV_MTU_4096;
	a.rate = 7;
	a.packet_life_time = 18;
	ibv_copy_path_rec_to_kern(&kern, &a);
	ibv_copy_path_rec_from_kern(&b, &kern);
	CHECK(!memcmp(&a, &b, sizeof(a)));

	return check_done("nodaemon");
}
