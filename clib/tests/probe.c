// What the daemon at $SOFTROCE_SOCKET offers the libraries: exit 0 if it
// serves a device and registers process memory, 3 if it serves no device
// this library can open (another protocol version), 4 if it cannot reach
// process memory (ibv_reg_mr of malloc'd memory refused). test/clib runs it
// to say why tests are skipped. Without $SOFTROCE_SOCKET it exits 77.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

int main(void)
{
	if (!getenv("SOFTROCE_SOCKET"))
		return 77;
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	struct ibv_context *c = l && n > 0 ? ibv_open_device(l[0]) : NULL;
	ibv_free_device_list(l);
	if (!c) {
		printf("probe: no device\n");
		return 3;
	}
	struct ibv_pd *pd = ibv_alloc_pd(c);
	char *buf = malloc(4096);
	struct ibv_mr *mr = pd && buf ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	int rc = mr ? 0 : 4;
	printf("probe: device %s, process memory %s\n", ibv_get_device_name(c->device), mr ? "yes" : "no");
	if (mr)
		ibv_dereg_mr(mr);
	free(buf);
	if (pd)
		ibv_dealloc_pd(pd);
	ibv_close_device(c);
	return rc;
}
