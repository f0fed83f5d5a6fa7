// Internals shared by softroce's libibverbs.so.1 and librdmacm.so.1: the
// device and context objects behind the public verbs.h structures, and the
// connection to the softroce daemon. Both libraries are built from one tree,
// so librdmacm reads a context's connection through these definitions.
#ifndef SOFTROCE_CLIB_SR_H
#define SOFTROCE_CLIB_SR_H

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <infiniband/verbs.h>

#define SR_EXPORT __attribute__((visibility("default")))
#define SR_UNUSED __attribute__((unused))

// SR_DEFAULT_1_1 binds a verb that also has an IBVERBS_1.0 compat version
// (compat.c) to its default version IBVERBS_1.1 by name, as the map file
// alone cannot when both nodes list the name.
#define SR_DEFAULT_1_1(name) __asm__(".symver " #name ", " #name "@@@IBVERBS_1.1")

// sr_container_of maps a pointer to a member back to its enclosing object.
#define sr_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

// SR_DEFAULT_SOCKET is where the daemon listens unless $SOFTROCE_SOCKET says
// otherwise.
#define SR_DEFAULT_SOCKET "/run/softroce/softroce.sock"

// sr_socket_path returns $SOFTROCE_SOCKET if set and not empty, else the
// default socket.
const char *sr_socket_path(void);

// sr_conn is one connection to the daemon (a unix SOCK_SEQPACKET socket):
// one request, one response, under mu.
struct sr_conn {
	int fd;
	pthread_mutex_t mu;
};

// sr_conn_open connects to the daemon at path; it returns 0 or -1 with errno set.
int sr_conn_open(struct sr_conn *c, const char *path);
void sr_conn_close(struct sr_conn *c);

// SR_MAX_GIDS bounds the GID table a device reports.
#define SR_MAX_GIDS 16

// sr_devinfo is what the daemon says of its device when a client connects.
struct sr_devinfo {
	char name[IBV_SYSFS_NAME_MAX];
	__be64 node_guid;
	struct ibv_device_attr attr;
	struct ibv_port_attr port;
	uint32_t ifindex; // the network interface of the GIDs (0: several or none)
	int ngids;
	union ibv_gid gids[SR_MAX_GIDS];
};

// sr_hello opens the session on a new connection and fills info; it returns
// 0 or -1 with errno set (EPROTONOSUPPORT: the daemon speaks another
// protocol version).
int sr_hello(struct sr_conn *c, struct sr_devinfo *info);

// sr_device is one device the daemon serves, as ibv_get_device_list
// returns it: the public ibv_device first, then what the library needs to
// reach it again.
struct sr_device {
	struct ibv_device dev;
	char socket[108];
	struct sr_devinfo info;
	int index; // ibv_get_device_index
};

static inline struct sr_device *sr_dev(struct ibv_device *d)
{
	return sr_container_of(d, struct sr_device, dev);
}

// sr_context is an open device: the verbs_context (which ends with the
// public ibv_context) and the session with the daemon.
struct sr_context {
	struct sr_conn conn;
	struct sr_device *dev;
	struct sr_devinfo info; // as the session's hello reported it
	int async_fd;           // ibv_context.async_fd: readable while an async event waits
	struct verbs_context vctx; // must be last: ibv_context ends it
};

static inline struct sr_context *sr_ctx(struct ibv_context *ctx)
{
	return sr_container_of(ctx, struct sr_context, vctx.context);
}

// sr_cq is a completion queue: the public ibv_cq_ex (whose first fields are
// ibv_cq's) and the completion ring shared with the daemon.
struct sr_cq {
	struct ibv_cq_ex cq;
	int notify_fd;             // written by the daemon when an armed completion arrives
	uint32_t events_reported;  // completion events ibv_get_cq_event returned (under cq.mutex)
};

static inline struct sr_cq *sr_cq(struct ibv_cq *cq)
{
	return sr_container_of(cq, struct sr_cq, cq.context);
}

// sr_set_ops fills a new context's ops and verbs_context operations.
void sr_set_ops(struct sr_context *sc);

// sr_query_port is the verbs_context's query_port (port_attr_len bytes of
// the caller's ibv_port_attr).
int sr_query_port(struct ibv_context *context, uint8_t port_num,
		  struct ibv_port_attr *port_attr, size_t port_attr_len);

// sr_fail sets errno and returns -1 (for functions that report through errno).
static inline int sr_fail(int err)
{
	errno = err;
	return -1;
}

// sr_fail_null sets errno and returns NULL.
static inline void *sr_fail_null(int err)
{
	errno = err;
	return NULL;
}

#endif
