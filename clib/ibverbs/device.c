// Devices and contexts: ibv_get_device_list finds the daemon's device,
// ibv_open_device opens a session with it; the query verbs answer from what
// the daemon reported at the session's start (the device's attributes, port
// and GID table are fixed while the daemon runs, docs/daemon.md).
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sr.h"

#undef ibv_get_device_list
#undef ibv_query_port

// Devices live until the library is unloaded: programs keep ibv_device
// pointers after ibv_free_device_list (rdma-core keeps them too). One entry
// per (socket, device name); a device seen again is reused.
static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sr_device **devices;
static int ndevices;

static struct sr_device *device_for(const char *socket, const struct sr_devinfo *info)
{
	for (int i = 0; i < ndevices; i++) {
		struct sr_device *d = devices[i];
		if (!strcmp(d->socket, socket) && !strcmp(d->info.name, info->name)) {
			d->info = *info;
			return d;
		}
	}
	struct sr_device **grown = realloc(devices, (ndevices + 1) * sizeof(*devices));
	if (!grown)
		return NULL;
	devices = grown;
	struct sr_device *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->dev.node_type = IBV_NODE_CA;
	d->dev.transport_type = IBV_TRANSPORT_IB;
	snprintf(d->dev.name, sizeof(d->dev.name), "%s", info->name);
	snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "%s", info->name);
	snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/%s", info->name);
	snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s", info->name);
	snprintf(d->socket, sizeof(d->socket), "%s", socket);
	d->info = *info;
	d->index = ndevices;
	devices[ndevices++] = d;
	return d;
}

__attribute__((destructor)) static void free_devices(void)
{
	for (int i = 0; i < ndevices; i++)
		free(devices[i]);
	free(devices);
	devices = NULL;
	ndevices = 0;
}

struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list = calloc(2, sizeof(*list));
	if (!list)
		return sr_fail_null(ENOMEM);
	int n = 0;
	const char *path = sr_socket_path();
	struct sr_conn c;
	// No daemon, or one that speaks another protocol: no device (the
	// tools say "No IB devices found"), as rdma-core without an RDMA device.
	if (sr_conn_open(&c, path) == 0) {
		struct sr_devinfo info;
		if (sr_hello(&c, &info) == 0) {
			pthread_mutex_lock(&devices_mu);
			struct sr_device *d = device_for(path, &info);
			pthread_mutex_unlock(&devices_mu);
			if (d)
				list[n++] = &d->dev;
		}
		sr_conn_close(&c);
	}
	if (num_devices)
		*num_devices = n;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
	return sr_dev(device)->info.node_guid;
}

int ibv_get_device_index(struct ibv_device *device)
{
	return sr_dev(device)->index;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sr_device *d = sr_dev(device);
	struct sr_context *sc = calloc(1, sizeof(*sc));
	if (!sc)
		return sr_fail_null(ENOMEM);
	if (sr_conn_open(&sc->conn, d->socket) < 0) {
		int e = errno;
		free(sc);
		return sr_fail_null(e);
	}
	if (sr_hello(&sc->conn, &sc->info) < 0) {
		int e = errno;
		sr_conn_close(&sc->conn);
		free(sc);
		return sr_fail_null(e);
	}
	sc->dev = d;
	sc->doorbell_fd = sc->async_fd = -1;
	pthread_mutex_init(&sc->ev_mu, NULL);
	pthread_mutex_init(&sc->ring_mu, NULL);
	const char *sp = getenv("SOFTROCE_SYNC_POSTS");
	sc->sync_posts = sp && *sp && strcmp(sp, "0");
	if (sr_open_session(sc) < 0) {
		int e = errno;
		pthread_mutex_destroy(&sc->ev_mu);
		sr_conn_close(&sc->conn);
		free(sc);
		return sr_fail_null(e);
	}
	struct ibv_context *ctx = &sc->vctx.context;
	ctx->device = device;
	ctx->cmd_fd = sc->conn.fd;
	ctx->async_fd = sc->async_fd;
	ctx->num_comp_vectors = 1;
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&ctx->mutex, NULL);
	sc->vctx.sz = sizeof(sc->vctx);
	sr_set_ops(sc);
	return ctx;
}

int ibv_close_device(struct ibv_context *context)
{
	struct sr_context *sc = sr_ctx(context);
	// Closing the session releases every object the daemon holds for it
	// (docs/daemon.md: a client that exits), as closing the uverbs fd does.
	sr_conn_close(&sc->conn);
	sr_close_session(sc);
	pthread_mutex_destroy(&sc->ev_mu);
	pthread_mutex_destroy(&sc->ring_mu);
	pthread_mutex_destroy(&context->mutex);
	free(sc);
	return 0;
}

struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	// Sharing a context between processes needs the kernel's uverbs fd.
	return sr_fail_null(EOPNOTSUPP);
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	*device_attr = sr_ctx(context)->info.attr;
	return 0;
}

int sr_query_port(struct ibv_context *context, uint8_t port_num,
		  struct ibv_port_attr *port_attr, size_t port_attr_len)
{
	struct sr_context *sc = sr_ctx(context);
	if (port_num != 1)
		return EINVAL;
	size_t n = port_attr_len < sizeof(sc->info.port) ? port_attr_len : sizeof(sc->info.port);
	memset(port_attr, 0, port_attr_len);
	memcpy(port_attr, &sc->info.port, n);
	return 0;
}

int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *port_attr)
{
	// Programs built against rdma-core call the verbs_context's query_port
	// (verbs.h's inline); this is the entry point of older binaries, whose
	// structure is ibv_port_attr up to flags (before port_cap_flags2).
	return sr_query_port(context, port_num, (struct ibv_port_attr *)port_attr,
			     offsetof(struct ibv_port_attr, port_cap_flags2));
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct sr_context *sc = sr_ctx(context);
	if (port_num != 1 || index < 0 || index >= sc->info.port.gid_tbl_len)
		return -1;
	if (index < sc->info.ngids)
		*gid = sc->info.gids[index];
	else
		memset(gid, 0, sizeof(*gid));
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct sr_context *sc = sr_ctx(context);
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	if (port_num != 1 || gid_index >= (uint32_t)sc->info.port.gid_tbl_len)
		return EINVAL;
	if (gid_index >= (uint32_t)sc->info.ngids)
		return ENODATA;
	memset(entry, 0, entry_size);
	entry->gid = sc->info.gids[gid_index];
	entry->gid_index = gid_index;
	entry->port_num = 1;
	// softroce speaks RoCEv2 only (UDP 4791).
	entry->gid_type = IBV_GID_TYPE_ROCE_V2;
	entry->ndev_ifindex = sc->info.gid_ifindex[gid_index];
	return 0;
}

ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags, size_t entry_size)
{
	struct sr_context *sc = sr_ctx(context);
	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	size_t n = 0;
	for (int i = 0; i < sc->info.ngids; i++) {
		if (n == max_entries)
			return -EINVAL;
		struct ibv_gid_entry *e = (struct ibv_gid_entry *)((char *)entries + n * entry_size);
		int err = _ibv_query_gid_ex(context, 1, (uint32_t)i, e, 0, entry_size);
		if (err)
			return -err;
		n++;
	}
	return (ssize_t)n;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	struct sr_context *sc = sr_ctx(context);
	if (port_num != 1 || index < 0 || index >= sc->info.port.pkey_tbl_len)
		return -1;
	// One partition, the default full-membership P_Key (IBTA 10.9.1.2);
	// the rest of the table is empty.
	*pkey = index == 0 ? htobe16(0xffff) : 0;
	return 0;
}

int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	for (int i = 0; i < sr_ctx(context)->info.port.pkey_tbl_len; i++) {
		__be16 p;
		if (ibv_query_pkey(context, port_num, i, &p))
			return -1;
		if (p == pkey)
			return i;
	}
	return sr_fail(ENOENT);
}

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_close_device);
SR_DEFAULT_1_1(ibv_free_device_list);
SR_DEFAULT_1_1(ibv_get_device_list);
SR_DEFAULT_1_1(ibv_get_device_name);
SR_DEFAULT_1_1(ibv_open_device);
SR_DEFAULT_1_1(ibv_query_device);
SR_DEFAULT_1_1(ibv_query_gid);
SR_DEFAULT_1_1(ibv_query_pkey);
SR_DEFAULT_1_1(ibv_query_port);
SR_DEFAULT_1_1(ibv_get_device_guid);
