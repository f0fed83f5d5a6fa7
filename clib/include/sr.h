// Internals shared by softroce's libibverbs.so.1 and librdmacm.so.1: the
// device and context objects behind the public verbs.h structures, and the
// connection to the softroce daemon. Both libraries are built from one tree,
// so librdmacm reads a context's connection through these definitions.
#ifndef SOFTROCE_CLIB_SR_H
#define SOFTROCE_CLIB_SR_H

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <infiniband/verbs.h>
#include <softroce/proto.h>

#define SR_EXPORT __attribute__((visibility("default")))
#define SR_UNUSED __attribute__((unused))

// SR_DEFAULT_1_1 binds a verb that also has an IBVERBS_1.0 compat version
// (compat.c) to its default version IBVERBS_1.1 by name, as the map file
// alone cannot when both nodes list the name.
#define SR_DEFAULT_1_1(name) __asm__(".symver " #name ", " #name "@@@IBVERBS_1.1")

// sr_container_of maps a pointer to a member back to its enclosing object.
#define sr_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

// sr_socket_path returns $SOFTROCE_SOCKET (SR_SOCKET_ENV) if set and not empty, else the
// default socket.
const char *sr_socket_path(void);

// sr_conn is one connection to the daemon (a unix SOCK_SEQPACKET socket):
// one request, one response, under mu.
struct sr_conn {
	int fd;
	pthread_mutex_t mu;
	char *rbuf; // SR_MAX_MSG bytes: the last response
};

// SR_MAX_FDS bounds the descriptors one message carries.
#define SR_MAX_FDS 4

// sr_call is one request and its response.
struct sr_call {
	uint16_t op;
	int noreply;       // an asynchronous request: no response is read
	const void *req;   // the body after sr_hdr
	size_t reqlen;
	const int *fds;    // sent with SCM_RIGHTS
	int nfds;
	void *resp;        // the response body is copied here (at most respcap bytes)
	size_t respcap;
	size_t resplen;    // out: the response body's full length
	int *rfds;         // out: received descriptors (at most maxrfds; the rest are closed)
	int maxrfds;
	int nrfds;
	uint32_t code;     // out, on failure: SR_E_* (0 if none)
	uint32_t bad_wr;   // out, on a failed post: the WRs posted before the failing one
	int took_effect;   // out: the daemon answered with success, even if sr_call then fails
			   // (descriptors or body cut short): the request was carried out
};

// sr_call sends call's request and reads its response; it returns 0, or -1
// with errno the daemon's status (a positive errno value) or the socket's.
int sr_call(struct sr_conn *c, struct sr_call *call);

// sr_debug: $SOFTROCE_DEBUG is set; the daemon's error messages go to stderr.
int sr_debug(void);

// sr_simple is sr_call for a fixed request and a response of at least resplen bytes.
int sr_simple(struct sr_conn *c, uint16_t op, const void *req, size_t reqlen, void *resp, size_t resplen);

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
	int ngids;
	union ibv_gid gids[SR_MAX_GIDS];
	uint32_t gid_ifindex[SR_MAX_GIDS]; // each GID's network interface (0: none known)
	char gid_ndev[SR_MAX_GIDS][16];
	uint32_t max_inline_data;
	uint64_t device_cap_flags_ex;
	uint16_t max_cq_moderation_count;
	uint16_t max_cq_moderation_period;
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
	int async_fd;           // ibv_context.async_fd: the event ring's eventfd
	char *rings;            // post ring, then the event ring (rings_bytes, shared)
	size_t rings_bytes;
	int doorbell_fd;
	pthread_mutex_t ring_mu; // the post ring's producer side
	int sync_posts;          // $SOFTROCE_SYNC_POSTS: every post is a round trip
	pthread_mutex_t ev_mu;  // the event ring's consumer side, and objs
	struct sr_obj *objs;
	struct sr_context *next_ctx; // every open context (the fork handler's list)
	// forked: set in a child process after fork() for the contexts the
	// parent had open: their sessions, rings and objects are the parent's
	// (docs/daemon-protocol.md, "Fork and exit"), so every verb on them fails
	// without touching shared state. Contexts the child opens are its own.
	int forked;
	struct verbs_context vctx; // must be last: ibv_context ends it
};

static inline struct sr_context *sr_ctx(struct ibv_context *ctx)
{
	return sr_container_of(ctx, struct sr_context, vctx.context);
}

// sr_obj links an object that events can name (QP, CQ, SRQ) into its
// context's list, by the handle the daemon gave it.
struct sr_obj {
	uint32_t handle;
	int kind; // SR_EVENT_ON_QP, _CQ, _SRQ
	void *ptr;
	struct sr_obj *next;
};

// sr_cq is a completion queue: the public ibv_cq_ex (whose first fields are
// ibv_cq's) and the completion ring shared with the daemon.
struct sr_cq {
	struct ibv_cq_ex cq;
	struct sr_obj obj;
	uint32_t handle;
	// The completion ring (ring_bytes, shared with the daemon) and its mask
	// (entries - 1): ibv_resize_cq replaces them holding poll_mu and ring_lock
	// (written), so polls (under poll_mu) and arms (ring_lock read) see one ring.
	char *ring;
	size_t ring_bytes;
	uint64_t mask;
	pthread_rwlock_t ring_lock;
	uint64_t head;             // entries consumed (under poll_mu)
	pthread_mutex_t poll_mu;
	int notify_fd;             // written by the daemon when an armed completion arrives
	int space_fd;              // written here when the daemon waits for ring space
	uint32_t events_reported;  // completion events ibv_get_cq_event returned (under cq.mutex)
	struct sr_qp **qps;        // the QPs completing here (under poll_mu): their queue counts
	int nqps;
	struct ibv_wc cur;         // the ibv_cq_ex poll API's current completion
	const int *forked;         // the context's forked flag
	// broken: ibv_resize_cq could not switch to the ring the daemon moved the CQ to (set
	// holding poll_mu and ring_lock, read under either): the old ring gets no completion
	// again, so polls, arms and resizes fail with EIO; only ibv_destroy_cq is left.
	int broken;
};

// sr_cq_ex_init fills the ibv_cq_ex poll functions (ibv_start_poll, ...).
void sr_cq_ex_init(struct sr_cq *c);

static inline struct sr_cq *sr_cq(struct ibv_cq *cq)
{
	return (struct sr_cq *)(void *)cq;
}

// sr_qp is a queue pair: the public ibv_qp_ex (whose first member is ibv_qp).
//
// Queue counts (docs/clib.md, "Posts"): a post may skip the daemon's answer
// (the post ring) only when the library knows the engine accepts it, room
// in the queue included. Posted WRs are counted under post_mu; completed ones
// as completions are polled: every receive completion frees one receive
// slot, and a send completion frees its WR and every earlier one (IBTA
// 10.8.3: a send queue completes in order), which the signaled FIFO maps to
// the send count at that WR.
struct sr_qp {
	struct ibv_qp_ex qpx;
	// wr_flush is where rdma-core 45+'s struct ibv_qp_ex has its wr_flush member, right after
	// wr_atomic_write, which ends Debian 12's (44) struct: a program built against newer
	// headers calls ibv_wr_flush through it (wr.c). Nothing may come between.
	void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
	struct sr_obj obj;
	struct ibv_qp_cap cap;   // as granted
	int sq_sig_all;
	pthread_mutex_t post_mu; // the encoding buffer and the posted counts
	char *buf;
	size_t buflen;
	uint64_t sq_posted, rq_posted;
	_Atomic uint64_t sq_done, rq_done;
	uint64_t *sig;           // ring of sq_posted values at signaled WRs
	uint32_t sig_cap;
	_Atomic uint32_t sig_head, sig_tail; // pushed by posts, popped by polls
	_Atomic int errored;     // a completion in error: posts are round trips from now on
	struct sr_wrs *wr_api;   // the ibv_wr_* API's work requests (wr.c); NULL: not enabled
};

_Static_assert(offsetof(struct sr_qp, wr_flush) == sizeof(struct ibv_qp_ex),
	       "wr_flush must directly follow struct ibv_qp_ex, as in rdma-core 45+");

// IBTA 1.5 FLUSH in the values rdma-core 45+ gives them (verbs.h: IBV_WR_FLUSH,
// IBV_QP_EX_WITH_FLUSH, IBV_FLUSH_GLOBAL/PERSISTENT, IBV_FLUSH_RANGE/MR); the 44 headers the
// library is built against lack the names, a program built against newer ones passes these.
#define SR_WR_FLUSH 14u
#define SR_QP_EX_WITH_FLUSH (1ull << 11)

// SR_WR_OPS are the ibv_wr_* operations softroce has (send_ops_flags).
#define SR_WR_OPS                                                                              \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |     \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_BIND_MW |     \
	 IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_ATOMIC_WRITE | SR_QP_EX_WITH_FLUSH)

// wr.c: the ibv_wr_* API of a QP created with send_ops_flags.
void sr_wr_init(struct sr_qp *q);
void sr_wr_free(struct sr_qp *q);
int sr_post_send_locked(struct sr_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);

static inline struct sr_qp *sr_qp(struct ibv_qp *qp)
{
	return (struct sr_qp *)(void *)qp;
}

struct sr_srq {
	struct ibv_srq srq;
	struct sr_obj obj;
	pthread_mutex_t post_mu;
	char *buf;
	size_t buflen;
};

struct sr_ah {
	struct ibv_ah ah;
	struct sr_ah_attr attr; // as the daemon resolved it: sent by value with UD sends
};

// sr_destroy_handle sends a destroy request (op) for handle; it returns 0 or
// the errno value.
int sr_destroy_handle(struct ibv_context *ctx, uint16_t op, uint32_t handle);

// sr_add_obj and sr_del_obj keep the context's list of event targets.
void sr_add_obj(struct sr_context *sc, struct sr_obj *o, uint32_t handle, int kind, void *ptr);
void sr_del_obj(struct sr_context *sc, struct sr_obj *o);

// sr_open_session opens the rings and gives the daemon access to this
// process's memory: the requests after HELLO of every context.
int sr_open_session(struct sr_context *sc);
void sr_close_session(struct sr_context *sc);

// Shared between the object files.
struct sr_cq *sr_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			   struct ibv_comp_channel *channel);
int sr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sr_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int sr_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr);
struct ibv_cq_ex *sr_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr);
// sr_cq_clean removes a QP's unpolled completions from its CQs (the move to RESET).
void sr_cq_clean(struct ibv_qp *qp);

// common/attr.c: the verbs structures to and from the protocol's.
void sr_ah_to_wire(struct sr_ah_attr *w, const struct ibv_ah_attr *a);
void sr_ah_from_wire(struct ibv_ah_attr *a, const struct sr_ah_attr *w);
void sr_cap_to_wire(struct sr_qp_cap *w, const struct ibv_qp_cap *c);
void sr_cap_from_wire(struct ibv_qp_cap *c, const struct sr_qp_cap *w);
void sr_qp_attr_to_wire(struct sr_qp_attr *w, const struct ibv_qp_attr *a);
void sr_qp_attr_from_wire(struct ibv_qp_attr *a, const struct sr_qp_attr *w);

// sr_ring_post publishes an asynchronous post in the post ring (session.c).
int sr_ring_post(struct sr_context *sc, uint16_t op, const void *body, size_t len);

// sr_cq_attach and sr_cq_detach add and remove a QP to the CQ's list.
int sr_cq_attach(struct sr_cq *c, struct sr_qp *q);
void sr_cq_detach(struct sr_cq *c, struct sr_qp *q);

// sr_set_ops fills a new context's ops and verbs_context operations;
// sr_set_mw_ops (mw.c) its memory window ops.
void sr_set_ops(struct sr_context *sc);
void sr_set_mw_ops(struct sr_context *sc);

// sr_bind_to_wire puts an IBV_WR_BIND_MW's bind in its protocol fields (mw.c).
void sr_bind_to_wire(struct sr_send_wr *s, const struct ibv_send_wr *w);

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

// Zero-copy registration (ibverbs/zcopy.c). Every MR's range is recorded
// (struct sr_zc). sr_zc_get records [addr, addr+length) and, where the range
// is whole pages of plain private anonymous memory overlapping no other
// record, moves it onto a memfd and returns that memfd, to send with an
// SR_MR_MEMFD registration at offset 0; -1: register it as SR_MR_PROCESS
// (*zp NULL: out of memory). sr_zc_registered closes the memfd once the
// daemon has it. sr_zc_track records a copied range (NULL: out of memory).
// sr_zc_put drops a record once its registration is gone (moving pages back
// as soon as no copied registration overlaps them); it keeps errno.
struct sr_zc;
int sr_zc_get(void *addr, size_t length, struct sr_zc **zp);
struct sr_zc *sr_zc_track(void *addr, size_t length);
void sr_zc_registered(struct sr_zc *z);
void sr_zc_put(struct sr_zc *z);

// sr_mr is an ibv_mr with its range's record (zcopy.c); stale: the range a
// translation change answered EBUSY left the daemon possibly still reaching.
struct sr_mr {
	struct ibv_mr mr;
	struct sr_zc *zc, *stale;
};

#endif
