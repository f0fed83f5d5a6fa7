// Prints every name and rate conversion of libibverbs; strings_diff.sh runs
// it on rdma-core's library and on ours and compares.
#include <stdio.h>

#include <infiniband/verbs.h>

int main(void)
{
	for (int i = -1; i < 40; i++) {
		printf("wc_status %d %s\n", i, ibv_wc_status_str((enum ibv_wc_status)i));
		printf("event %d %s\n", i, ibv_event_type_str((enum ibv_event_type)i));
		printf("node %d %s\n", i, ibv_node_type_str((enum ibv_node_type)i));
		printf("port_state %d %s\n", i, ibv_port_state_str((enum ibv_port_state)i));
		printf("rate %d mult %d mbps %d\n", i, ibv_rate_to_mult((enum ibv_rate)i),
		       ibv_rate_to_mbps((enum ibv_rate)i));
	}
	static const int mbps[] = {0, 1, 2500, 5000, 10000, 14062, 20000, 25781, 28125, 30000, 40000, 53125,
				   56250, 60000, 80000, 103125, 112500, 120000, 168750, 206250, 309375,
				   425000, 637500, 850000, 1275000};
	for (unsigned i = 0; i < sizeof(mbps) / sizeof(mbps[0]); i++)
		printf("mbps_to_rate %d %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
	for (int m = -1; m < 500; m++)
		printf("mult_to_rate %d %d\n", m, mult_to_ibv_rate(m));
	return 0;
}
