/*
 * softroce daemon protocol, version 3: the messages a program exchanges with
 * `softroce daemon` on its unix socket, and the shared-memory rings both
 * sides read and write in place. docs/daemon-protocol.md is the spec; this
 * header and the Go definitions (internal/daemon/proto/wire.go) are checked
 * against each other by a test (TestWireLayoutMatchesC).
 *
 * Layout rules: every integer is in the host's byte order (the daemon and
 * its clients share a host; every platform softroce builds for is
 * little-endian); every field sits at its natural alignment and every
 * padding byte is an explicit reserved field, so the layout is the same on
 * every ABI; reserved fields are zero when sent and ignored when received.
 * C11, no dependency but <stdint.h>.
 */
#ifndef SOFTROCE_PROTO_H
#define SOFTROCE_PROTO_H

#include <stdint.h>

#define SR_PROTO_MAGIC 0x31505253u /* "SRP1" in memory */
#define SR_PROTO_VERSION 3u
#define SR_MAX_MSG (256u * 1024u) /* the largest message either side sends or accepts */
#define SR_DEFAULT_SOCKET "/run/softroce/softroce.sock"
#define SR_SOCKET_ENV "SOFTROCE_SOCKET"

/* ---------------------------------------------------------------- framing */

/* Every message, both directions, starts with this header; the body follows. */
struct sr_hdr {
	uint16_t op;     /* request: SR_OP_*; response: the request's op */
	uint16_t flags;  /* reserved */
	int32_t status;  /* request: 0; response: 0 = success, else a positive errno value */
};

/* The body of a response whose status is not 0; a UTF-8 message (not
 * NUL-terminated) follows, up to the end of the message. */
struct sr_err {
	uint32_t code;   /* SR_E_*: which softroce error (0 = none of the list) */
	uint32_t bad_wr; /* post requests: the WRs posted before the one that failed */
};

enum sr_op {
	/* session */
	SR_OP_HELLO = 1,        /* sr_hello_req -> sr_hello_resp; must be the first request */
	SR_OP_OPEN_RINGS = 2,   /* -> sr_open_rings_resp + fds: ring memfd, doorbell eventfd, event eventfd */
	SR_OP_ATTACH_MEM = 3,   /* + fd: the client's /proc/self/mem (SR_MR_PROCESS) -> empty */
	SR_OP_QUERY_DEVICE = 4, /* -> sr_device_attr */
	SR_OP_QUERY_PORT = 5,   /* sr_port_req -> sr_port_attr */
	SR_OP_QUERY_GIDS = 6,   /* sr_port_req -> sr_gids_resp + count x sr_gid_entry */
	SR_OP_QUERY_PKEY = 7,   /* sr_pkey_req -> sr_pkey_resp */
	SR_OP_STATS = 8,        /* -> sr_stats */
	SR_OP_DEBUG = 9,        /* -> sr_debug */

	/* verbs objects */
	SR_OP_ALLOC_PD = 16,    /* -> sr_handle */
	SR_OP_DEALLOC_PD = 17,  /* sr_handle */
	SR_OP_REG_MR = 18,      /* sr_reg_mr_req (+ fd: SR_MR_MEMFD) -> sr_reg_mr_resp */
	SR_OP_DEREG_MR = 19,    /* sr_handle */
	SR_OP_CREATE_CQ = 20,   /* sr_create_cq_req -> sr_create_cq_resp + fds: ring memfd, notify eventfd, space eventfd */
	SR_OP_MODIFY_CQ = 21,   /* sr_modify_cq_req */
	SR_OP_DESTROY_CQ = 22,  /* sr_handle */
	SR_OP_CREATE_SRQ = 23,  /* sr_create_srq_req -> sr_create_srq_resp */
	SR_OP_MODIFY_SRQ = 24,  /* sr_modify_srq_req */
	SR_OP_QUERY_SRQ = 25,   /* sr_handle -> sr_srq_attr */
	SR_OP_DESTROY_SRQ = 26, /* sr_handle */
	SR_OP_CREATE_QP = 27,   /* sr_create_qp_req -> sr_create_qp_resp */
	SR_OP_MODIFY_QP = 28,   /* sr_modify_qp_req */
	SR_OP_QUERY_QP = 29,    /* sr_query_qp_req -> sr_qp_attr */
	SR_OP_DESTROY_QP = 30,  /* sr_handle */
	SR_OP_CREATE_AH = 31,   /* sr_create_ah_req -> sr_create_ah_resp */
	SR_OP_ALLOC_MW = 32,    /* sr_alloc_mw_req -> sr_alloc_mw_resp */
	SR_OP_DEALLOC_MW = 33,  /* sr_handle */
	SR_OP_RESIZE_CQ = 34,   /* sr_resize_cq_req -> sr_resize_cq_resp + fd: the new ring memfd */
	SR_OP_REREG_MR = 35,    /* sr_rereg_mr_req (+ fd: a new SR_MR_MEMFD translation) -> sr_rereg_mr_resp */

	/* work requests: sr_post then the WRs (below) */
	SR_OP_POST_SEND = 48,       /* -> sr_post_resp */
	SR_OP_POST_RECV = 49,       /* -> sr_post_resp */
	SR_OP_POST_SRQ_RECV = 50,   /* -> sr_post_resp */
	SR_OP_POST_SEND_ASYNC = 51, /* no response (post ring or socket) */
	SR_OP_POST_RECV_ASYNC = 52, /* no response (post ring or socket) */

	/* rdma_cm */
	SR_OP_CM_CREATE_CHANNEL = 64,  /* -> sr_handle + fd: the channel's eventfd */
	SR_OP_CM_DESTROY_CHANNEL = 65, /* sr_handle */
	SR_OP_CM_CREATE_ID = 66,       /* sr_cm_create_id_req -> sr_handle */
	SR_OP_CM_MIGRATE_ID = 67,      /* sr_cm_migrate_req */
	SR_OP_CM_DESTROY_ID = 68,      /* sr_handle */
	SR_OP_CM_BIND_ADDR = 69,       /* sr_cm_bind_req -> sr_cm_addr_resp */
	SR_OP_CM_RESOLVE_ADDR = 70,    /* sr_cm_resolve_addr_req -> sr_cm_addr_resp */
	SR_OP_CM_RESOLVE_ROUTE = 71,   /* sr_cm_resolve_route_req -> sr_cm_route */
	SR_OP_CM_SET_QP = 72,          /* sr_cm_set_qp_req */
	SR_OP_CM_INIT_QP_ATTR = 73,    /* sr_cm_init_qp_attr_req -> sr_cm_init_qp_attr_resp */
	SR_OP_CM_LISTEN = 74,          /* sr_cm_listen_req -> sr_cm_addr_resp */
	SR_OP_CM_CONNECT = 75,         /* sr_cm_conn_req */
	SR_OP_CM_ACCEPT = 76,          /* sr_cm_conn_req */
	SR_OP_CM_REJECT = 77,          /* sr_cm_reject_req */
	SR_OP_CM_DISCONNECT = 78,      /* sr_handle */
	SR_OP_CM_GET_EVENTS = 79,      /* sr_cm_get_events_req -> sr_cm_events_resp + count x sr_cm_event */
	SR_OP_CM_QUERY_ID = 80,        /* sr_handle -> sr_cm_query_id_resp */
	SR_OP_CM_SET_OPTION = 81,      /* sr_cm_set_option_req */
	SR_OP_CM_ESTABLISH = 82,       /* sr_handle */
};

/* A body naming one object (and the empty response of most requests that
 * succeed is no body at all). Handles are per connection, never 0. */
struct sr_handle {
	uint32_t handle;
	uint32_t reserved;
};

/* ---------------------------------------------------------------- session */

struct sr_hello_req {
	uint32_t magic;   /* SR_PROTO_MAGIC */
	uint32_t version; /* SR_PROTO_VERSION; another one is refused with EPROTONOSUPPORT */
	uint32_t flags;   /* reserved */
	uint32_t reserved;
};

struct sr_hello_resp {
	uint32_t magic;
	uint32_t version;
	uint32_t max_msg;       /* SR_MAX_MSG */
	uint32_t phys_port_cnt; /* 1 */
	uint64_t node_guid;
	uint64_t sys_image_guid;
	char dev_name[64]; /* NUL-terminated, e.g. "softroce0" */
};

struct sr_open_rings_resp {
	uint32_t bytes;       /* size of the memfd: post ring, then the event ring */
	uint32_t post_data;   /* post ring data bytes (SR_POST_RING_DATA) */
	uint32_t event_off;   /* offset of the event ring (SR_EVENT_RING_OFF) */
	uint32_t event_cap;   /* event ring entries (SR_EVENT_RING_CAP) */
	uint32_t max_record;  /* largest post message the ring carries (SR_MAX_POST_RECORD) */
	uint32_t reserved;
};

struct sr_port_req {
	uint32_t port; /* 1 */
	uint32_t reserved;
};

/* ibv_device_attr (and the parts of ibv_device_attr_ex softroce has). */
struct sr_device_attr {
	char fw_ver[64];
	uint64_t node_guid;
	uint64_t sys_image_guid;
	uint64_t max_mr_size;
	uint64_t page_size_cap;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t hw_ver;
	int32_t max_qp;
	int32_t max_qp_wr;
	uint32_t reserved0;
	uint64_t device_cap_flags; /* IBV_DEVICE_* (the ibv_device_attr field is its low 32 bits) */
	int32_t max_sge;
	int32_t max_sge_rd;
	int32_t max_cq;
	int32_t max_cqe;
	int32_t max_mr;
	int32_t max_pd;
	int32_t max_qp_rd_atom;
	int32_t max_ee_rd_atom;
	int32_t max_res_rd_atom;
	int32_t max_qp_init_rd_atom;
	int32_t max_ee_init_rd_atom;
	uint32_t atomic_cap; /* IBV_ATOMIC_* */
	int32_t max_ee;
	int32_t max_rdd;
	int32_t max_mw;
	int32_t max_raw_ipv6_qp;
	int32_t max_raw_ethy_qp;
	int32_t max_mcast_grp;
	int32_t max_mcast_qp_attach;
	int32_t max_total_mcast_qp_attach;
	int32_t max_ah;
	int32_t max_srq;
	int32_t max_srq_wr;
	int32_t max_srq_sge;
	uint16_t max_pkeys;
	uint8_t local_ca_ack_delay;
	uint8_t phys_port_cnt;
	uint32_t max_inline_data;       /* the largest IBV_SEND_INLINE payload */
	uint32_t max_msg_size;
	uint16_t max_cq_moderation_count;  /* ibv_device_attr_ex.cq_mod_caps.max_cq_count */
	uint16_t max_cq_moderation_period; /* .max_cq_period, microseconds */
};

/* ibv_port_attr */
struct sr_port_attr {
	uint32_t state;      /* IBV_PORT_* */
	uint32_t max_mtu;    /* IBV_MTU_* */
	uint32_t active_mtu; /* IBV_MTU_* */
	int32_t gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer; /* IBV_LINK_LAYER_ETHERNET */
	uint8_t flags;
	uint16_t port_cap_flags2;
	uint16_t reserved;
	uint32_t active_speed_ex;
};

struct sr_gids_resp {
	uint32_t count; /* entries that follow, GID index 0 .. count-1 */
	uint32_t reserved;
};

/* ibv_gid_entry, plus the interface's name */
struct sr_gid_entry {
	uint8_t gid[16];       /* IPv6, or IPv4-mapped (::ffff:a.b.c.d) */
	uint32_t gid_index;
	uint32_t port_num;
	uint32_t gid_type;     /* IBV_GID_TYPE_ROCE_V2 */
	uint32_t ndev_ifindex; /* 0 if the daemon knows no interface with this address */
	char ndev_name[16];    /* NUL-terminated, empty if none */
};

struct sr_pkey_req {
	uint32_t port;
	uint32_t index;
};

struct sr_pkey_resp {
	uint16_t pkey; /* host order (ibv_query_pkey returns it in network order) */
	uint16_t reserved;
	uint32_t reserved2;
};

/* The device's counters, rxe's names (rdma statistic show), and mlx5's congestion control ones. */
struct sr_stats {
	uint64_t sent_pkts;
	uint64_t rcvd_pkts;
	uint64_t duplicate_request;
	uint64_t out_of_seq_request;
	uint64_t rcvd_rnr_err;
	uint64_t send_rnr_err;
	uint64_t rcvd_seq_err;
	uint64_t ack_deferred;
	uint64_t retry_exceeded_err;
	uint64_t retry_rnr_exceeded_err;
	uint64_t completer_retry_err;
	uint64_t send_err;
	uint64_t rdma_sends;
	uint64_t rdma_recvs;
	uint64_t link_downed;
	uint64_t rcvd_icrc_solved;
	uint64_t rcvd_dropped;
	uint64_t retransmitted_pkts;
	uint64_t rcvd_gso_split;
	uint64_t link_entropy_sockets;
	uint64_t link_entropy_fallbacks;
	uint64_t link_offload_fallbacks;
	/* congestion control, mlx5's names (docs/congestion.md) */
	uint64_t np_ecn_marked_roce_packets;
	uint64_t np_cnp_sent;
	uint64_t rp_cnp_handled;
	uint64_t rp_cnp_ignored;
};

/* The resources the daemon limits per user, in the order of sr_debug's arrays. */
enum sr_usage {
	SR_USAGE_CONNS = 0,
	SR_USAGE_FDS = 1,
	SR_USAGE_PDS = 2,
	SR_USAGE_MRS = 3,
	SR_USAGE_CQS = 4,
	SR_USAGE_SRQS = 5,
	SR_USAGE_QPS = 6,
	SR_USAGE_CM_IDS = 7,
	SR_USAGE_MAPPED_BYTES = 8,
	SR_USAGE_MAPPINGS = 9,
	SR_USAGE_ENGINE_BYTES = 10,
	SR_USAGE_COUNT = 11,
};

/* The daemon's resources (all clients), and this client's own objects. */
struct sr_debug {
	int64_t clients;
	int64_t pds;
	int64_t mrs;
	int64_t cqs;
	int64_t srqs;
	int64_t qps;
	int64_t cm_ids;
	int64_t mapped_bytes;
	int64_t fds;             /* the daemon's open fds, entropy sockets excluded */
	int64_t entropy_sockets;
	int64_t goroutines;
	uint64_t ring_posts;     /* post messages drained from post rings */
	uint64_t socket_posts;   /* post messages read from sockets */
	uint64_t refills;        /* post-ring drains asked for by a receive finding no WQE */
	int64_t mine_pds;
	int64_t mine_mrs;
	int64_t mine_cqs;
	int64_t mine_srqs;
	int64_t mine_qps;
	int64_t mine_cm_ids;
	int64_t mine_cm_channels;
	int64_t cm_channels;
	uint64_t accept_backoffs; /* accept errors (out of fds or memory) backed off and retried */
	uint64_t bad_posts;       /* asynchronous posts refused (malformed, no QP of the client) */
	uint64_t dropped_events;  /* asynchronous events dropped: a client's event ring was full */
	int64_t cm_listens;       /* rdma_cm IDs listening (all clients) */
	uint64_t drain_yields;    /* post-ring drain turns that ended with records left (fair service) */
	uint32_t uid;             /* the user the daemon counts this client under (SO_PEERCRED) */
	uint32_t reserved;
	/* per-user accounting, SR_USAGE_* order: what this client's user holds over all its
	 * connections, the per-user limits (-1: none), and the requests refused over each limit
	 * (per-user or daemon-wide) since the daemon started */
	int64_t user[SR_USAGE_COUNT];
	int64_t user_limit[SR_USAGE_COUNT];
	int64_t refused[SR_USAGE_COUNT];
	uint64_t refused_privileged; /* requests refused as reserved to privileged users */
};

/* ---------------------------------------------------------------- verbs */

enum sr_mr_source {
	SR_MR_PROCESS = 1, /* memory at addr in the client, reached through the SR_OP_ATTACH_MEM fd */
	SR_MR_MEMFD = 2,   /* a sealed memfd passed with the request, mapped by the daemon (zero copy) */
};

struct sr_reg_mr_req {
	uint32_t pd;
	uint32_t access; /* IBV_ACCESS_* */
	uint64_t addr;   /* SR_MR_PROCESS: the region's address in the client */
	uint64_t length;
	uint64_t iova;   /* the address SGEs and peers use (ibv_reg_mr: addr) */
	uint64_t offset; /* SR_MR_MEMFD: the region's offset in the memfd */
	uint32_t source; /* SR_MR_* */
	uint32_t reserved;
};

struct sr_reg_mr_resp {
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t reserved;
};

/* ibv_rereg_mr: what flags selects changes in place; the keys stay the same. */
struct sr_rereg_mr_req {
	uint32_t handle;
	uint32_t flags;  /* IBV_REREG_MR_CHANGE_TRANSLATION | _PD | _ACCESS */
	uint32_t pd;     /* _PD: the new PD */
	uint32_t access; /* _ACCESS: IBV_ACCESS_* */
	uint64_t addr;   /* _TRANSLATION: the new memory, as sr_reg_mr_req's fields */
	uint64_t length;
	uint64_t iova;
	uint64_t offset;
	uint32_t source; /* SR_MR_* */
	uint32_t reserved;
};

struct sr_rereg_mr_resp {
	uint32_t lkey;
	uint32_t rkey;
};

/* a memory window: ibv_alloc_mw */
struct sr_alloc_mw_req {
	uint32_t pd;
	uint32_t type; /* IBV_MW_TYPE_1 (1) or IBV_MW_TYPE_2 (2) */
};

struct sr_alloc_mw_resp {
	uint32_t handle;
	uint32_t rkey; /* the window's R_Key (Free until bound) */
};

struct sr_create_cq_req {
	uint32_t cqe;
	uint32_t reserved;
};

struct sr_create_cq_resp {
	uint32_t handle;
	uint32_t cqe;     /* the CQ's size (ibv_cq.cqe) */
	uint32_t entries; /* completion ring entries: a power of two >= cqe */
	uint32_t bytes;   /* size of the ring memfd */
};

/* ibv_resize_cq: the daemon moves the unpolled completions into a new ring (same counters,
 * arm and eventfds) and answers with its memfd; the client swaps its mapping. */
struct sr_resize_cq_req {
	uint32_t handle;
	uint32_t cqe; /* the new size: at least the completions the CQ holds (else EINVAL) */
};

struct sr_resize_cq_resp {
	uint32_t cqe;     /* the CQ's new size (ibv_cq.cqe) */
	uint32_t entries; /* the new ring's entries: a power of two >= cqe */
	uint32_t bytes;   /* size of the new ring memfd */
	uint32_t reserved;
};

struct sr_modify_cq_req {
	uint32_t handle;
	uint16_t cq_count;  /* moderation: the event waits for this many completions (<= 1: off) */
	uint16_t cq_period; /* ... or this many microseconds after the first (0: no timer) */
};

struct sr_create_srq_req {
	uint32_t pd;
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
};

struct sr_create_srq_resp {
	uint32_t handle;
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t reserved;
};

struct sr_modify_srq_req {
	uint32_t handle;
	uint32_t attr_mask; /* IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT */
	uint32_t max_wr;
	uint32_t srq_limit;
};

struct sr_srq_attr {
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
	uint32_t reserved;
};

struct sr_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
	uint32_t reserved;
};

/* An address vector: ibv_ah_attr with its GRH, for RoCEv2. */
struct sr_ah_attr {
	uint8_t dgid[16];     /* IPv6, or IPv4-mapped for IPv4 */
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
	uint8_t sl;
	uint8_t port_num;
	uint8_t reserved[7];
};

/* ibv_qp_attr */
struct sr_qp_attr {
	uint8_t qp_state;       /* IBV_QPS_* */
	uint8_t cur_qp_state;
	uint8_t path_mtu;       /* IBV_MTU_* */
	uint8_t path_mig_state;
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	uint32_t qp_access_flags;
	struct sr_qp_cap cap;
	struct sr_ah_attr ah_attr;
	struct sr_ah_attr alt_ah_attr;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t sq_draining;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	uint8_t reserved;
	uint32_t rate_limit;
	uint32_t reserved2;
};

struct sr_create_qp_req {
	uint32_t pd;
	uint32_t send_cq;
	uint32_t recv_cq;
	uint32_t srq;        /* 0 = none */
	uint8_t qp_type;     /* IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD */
	uint8_t sq_sig_all;
	uint16_t reserved;
	uint32_t reserved2;
	struct sr_qp_cap cap;
};

struct sr_create_qp_resp {
	uint32_t handle;
	uint32_t qpn;
	struct sr_qp_cap cap; /* the capacities granted */
};

struct sr_modify_qp_req {
	uint32_t handle;
	uint32_t attr_mask; /* IBV_QP_* */
	struct sr_qp_attr attr;
};

struct sr_query_qp_req {
	uint32_t handle;
	uint32_t attr_mask;
};

struct sr_create_ah_req {
	uint32_t pd;
	uint32_t reserved;
	struct sr_ah_attr attr;
};

struct sr_create_ah_resp {
	struct sr_ah_attr attr;
	uint8_t sgid[16]; /* the source GID attr.sgid_index resolved to */
};

/* ---------------------------------------------------------------- posts */

/* A post message: sr_hdr (SR_OP_POST_*), sr_post, then num_wr work requests,
 * each one a fixed part followed by its scatter/gather list (or, for an
 * inline send, its data padded to 8 bytes). */
struct sr_post {
	uint32_t handle; /* QP (SRQ for SR_OP_POST_SRQ_RECV) */
	uint32_t num_wr;
};

/* ibv_sge, byte for byte */
struct sr_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct sr_send_wr {
	uint64_t wr_id;
	uint8_t opcode;      /* IBV_WR_* */
	uint8_t num_sge;     /* sr_sge entries that follow (0 with SR_SEND_INLINE data) */
	uint16_t inline_len; /* IBV_SEND_INLINE: bytes of data that follow (then padding to 8) */
	uint32_t send_flags; /* IBV_SEND_* */
	uint32_t imm_data;   /* host order: ntohl(ibv_send_wr.imm_data) */
	uint32_t invalidate_rkey;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t remote_qpn;  /* UD */
	uint32_t remote_qkey; /* UD */
	uint32_t has_ah;      /* UD: 1 = ah is the destination */
	uint64_t compare_add; /* IBV_WR_FLUSH: the range's length (ibv_wr_flush's len) */
	uint64_t swap;        /* IBV_WR_FLUSH: type | level << SR_FLUSH_LEVEL_SHIFT */
	struct sr_ah_attr ah; /* UD: the address handle's attributes, by value */
};

/* An IBV_WR_BIND_MW (ibv_bind_mw, ibv_wr_bind_mw) has no SGEs and no inline data; its fields
 * carry the bind: invalidate_rkey the window's current R_Key (ibv_mw.rkey), rkey the R_Key the
 * bind gives it (ibv_send_wr.bind_mw.rkey: the same index, a new key byte), imm_data the MR's
 * lkey (0: none, a type 1 unbind), remote_addr and compare_add the bound range (addr, length),
 * swap the window's access (mw_access_flags). IBV_WR_LOCAL_INV and IBV_WR_SEND_WITH_INV carry
 * the R_Key to invalidate in invalidate_rkey, as is (not byte-swapped). */

/* sr_send_wr.swap of an IBV_WR_FLUSH: the placement type (ibv_placement_type) in bits 7..0, the
 * selectivity level (ibv_selectivity_level) in bits 15..8. An IBV_WR_ATOMIC_WRITE's 8 bytes are
 * its data: one 8-byte sr_sge, or 8 bytes of inline data (ibv_wr_atomic_write's copy). */
#define SR_FLUSH_LEVEL_SHIFT 8u

struct sr_recv_wr {
	uint64_t wr_id;
	uint32_t num_sge; /* sr_sge entries that follow */
	uint32_t reserved;
};

struct sr_post_resp {
	uint32_t posted; /* always num_wr on success */
	uint32_t reserved;
};

/* ---------------------------------------------------------------- rdma_cm */

#define SR_CM_PRIVATE_DATA_MAX 256

/* a socket address: AF_INET addresses as IPv4-mapped IPv6 */
struct sr_sockaddr {
	uint16_t family; /* AF_INET (2), AF_INET6 (10), 0 = none */
	uint16_t port;   /* host order */
	uint32_t scope_id;
	uint8_t addr[16];
};

struct sr_cm_route {
	uint8_t sgid[16];
	uint8_t dgid[16];
	uint32_t sgid_index;
	uint8_t mtu; /* IBV_MTU_* */
	uint8_t hop_limit;
	uint8_t traffic_class;
	uint8_t reserved;
};

/* rdma_conn_param (UD: qp_num and qkey are the peer's) */
struct sr_conn_param {
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t flow_control;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint8_t srq;
	uint16_t private_data_len;
	uint32_t qp_num;
	uint32_t qkey;
	uint8_t private_data[SR_CM_PRIVATE_DATA_MAX];
};

struct sr_cm_create_id_req {
	uint32_t channel;    /* an SR_OP_CM_CREATE_CHANNEL handle */
	uint16_t port_space; /* RDMA_PS_TCP, RDMA_PS_UDP */
	uint8_t qp_type;     /* IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD; 0 = by port space */
	uint8_t reserved;
};

struct sr_cm_migrate_req {
	uint32_t id;
	uint32_t channel;
};

struct sr_cm_bind_req {
	uint32_t id;
	uint32_t reserved;
	struct sr_sockaddr addr;
};

struct sr_cm_resolve_addr_req {
	uint32_t id;
	uint32_t timeout_ms; /* 0 = the default */
	struct sr_sockaddr src; /* family 0 = any */
	struct sr_sockaddr dst;
};

struct sr_cm_addr_resp {
	struct sr_sockaddr local;
	struct sr_sockaddr remote;
};

struct sr_cm_resolve_route_req {
	uint32_t id;
	uint32_t timeout_ms;
};

struct sr_cm_set_qp_req {
	uint32_t id;
	uint32_t qp;
};

struct sr_cm_set_option_req {
	uint32_t id;
	uint32_t level;   /* RDMA_OPTION_ID */
	uint32_t optname; /* RDMA_OPTION_ID_TOS, _REUSEADDR, _AFONLY, _ACK_TIMEOUT */
	uint32_t value;   /* the option's uint8_t or int, as an unsigned value */
};

struct sr_cm_init_qp_attr_req {
	uint32_t id;
	uint32_t qp_state; /* IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS */
};

struct sr_cm_init_qp_attr_resp {
	uint32_t attr_mask; /* IBV_QP_* */
	uint32_t reserved;
	struct sr_qp_attr attr;
};

struct sr_cm_listen_req {
	uint32_t id;
	int32_t backlog;
};

struct sr_cm_conn_req {
	uint32_t id;
	uint32_t has_param; /* SR_OP_CM_ACCEPT: 0 = rdma_accept(id, NULL) */
	struct sr_conn_param param;
};

struct sr_cm_reject_req {
	uint32_t id;
	uint32_t private_data_len;
	uint8_t private_data[SR_CM_PRIVATE_DATA_MAX];
};

struct sr_cm_get_events_req {
	uint32_t channel;
	uint32_t max; /* at most this many events (0 = as many as fit) */
};

struct sr_cm_events_resp {
	uint32_t count; /* events that follow */
	uint32_t more;  /* 1: more are queued (ask again) */
};

#define SR_CM_EVENT_UD 1u /* sr_cm_event.flags: ah_attr, param.qp_num, param.qkey name the UD peer */

struct sr_cm_event {
	uint32_t event;     /* RDMA_CM_EVENT_* */
	int32_t status;     /* as rdma_cm_event.status: 0, a negative errno, or (REJECTED) the reject reason */
	uint32_t id;        /* the ID (CONNECT_REQUEST: the new ID, already in the table) */
	uint32_t listen_id; /* CONNECT_REQUEST: the listening ID */
	uint32_t code;      /* SR_E_* of a failure, 0 otherwise */
	uint32_t flags;     /* SR_CM_EVENT_* */
	struct sr_conn_param param;
	struct sr_ah_attr ah_attr;
	struct sr_sockaddr local;  /* CONNECT_REQUEST: the new ID's addresses and route */
	struct sr_sockaddr remote;
	struct sr_cm_route route;
};

struct sr_cm_query_id_resp {
	struct sr_sockaddr local;
	struct sr_sockaddr remote;
	struct sr_cm_route route;
	uint32_t qp;        /* the bound QP's handle, 0 = none */
	uint32_t channel;
};

/* ---------------------------------------------------------------- errors */

/* Detail codes (sr_err.code, sr_cm_event.code): which softroce error a
 * failure was, next to its errno. The errno is what a C library reports. */
enum sr_errcode {
	SR_E_NO_OBJECT = 1,        /* EINVAL: a handle names no object of this client, or one of another type */
	SR_E_PROTOCOL = 2,         /* EPROTO: a malformed message */
	SR_E_UNSUPPORTED = 3,      /* EOPNOTSUPP */
	SR_E_NOT_SHAREABLE = 4,    /* EFAULT: memory the daemon cannot reach */
	SR_E_DISCONNECTED = 5,     /* ENOTCONN */
	SR_E_DEV_CLOSED = 6,       /* ENODEV */
	SR_E_NO_LINK = 7,          /* ENETDOWN */
	SR_E_DEV_LIMIT = 8,        /* ENOMEM: a device limit (max_qp, max_cq, ...) */
	SR_E_BAD_GID_INDEX = 9,    /* EINVAL */
	SR_E_DEV_INVALID = 10,     /* EINVAL */
	SR_E_QP_STATE = 11,        /* EINVAL */
	SR_E_QUEUE_FULL = 12,      /* ENOMEM */
	SR_E_TOO_MANY_SGE = 13,    /* EINVAL */
	SR_E_INLINE_TOO_LONG = 14, /* EINVAL */
	SR_E_MSG_TOO_LONG = 15,    /* EINVAL */
	SR_E_BAD_OPCODE = 16,      /* EINVAL */
	SR_E_BAD_WR = 17,          /* EINVAL */
	SR_E_HAS_SRQ = 18,         /* EINVAL */
	SR_E_QP_DESTROYED = 19,    /* EINVAL */
	SR_E_QP_MODIFY = 20,       /* EINVAL */
	SR_E_SRQ_FULL = 21,        /* ENOMEM */
	SR_E_SRQ_ARG = 22,         /* EINVAL */
	SR_E_SRQ_DESTROYED = 23,   /* EINVAL */
	SR_E_WR_TOO_MANY_SGE = 24, /* EINVAL */
	SR_E_WR_INLINE_SIZE = 25,  /* EINVAL */
	SR_E_WR_LENGTH = 26,       /* EINVAL */
	SR_E_WR_OPCODE = 27,       /* EINVAL */
	SR_E_WR_ATOMIC_ALIGN = 28, /* EINVAL */
	SR_E_WR_NO_AH = 29,        /* EINVAL */
	SR_E_WR_NO_BIND = 30,      /* EINVAL */
	SR_E_CQ_CAPACITY = 31,     /* EINVAL */
	SR_E_CQ_ERROR = 32,        /* EIO: the CQ overran */
	SR_E_CQ_CLOSED = 33,       /* EINVAL */
	SR_E_MR_BAD_KEY = 34,      /* EINVAL */
	SR_E_MR_INVALID_KEY = 35,  /* EINVAL */
	SR_E_MR_WRONG_PD = 36,     /* EINVAL */
	SR_E_MR_WRONG_QP = 37,     /* EINVAL */
	SR_E_MR_ACCESS = 38,       /* EACCES */
	SR_E_MR_OVERFLOW = 39,     /* EINVAL */
	SR_E_MR_BOUNDS = 40,       /* EINVAL */
	SR_E_MR_ALIGN = 41,        /* EINVAL */
	SR_E_BUSY = 42,            /* EBUSY: an object still in use (a PD with MRs, a CQ with QPs, ...) */
	SR_E_MR_LIMIT = 43,        /* ENOMEM */
	SR_E_MR_INVALID = 44,      /* EINVAL */
	SR_E_MR_STATE = 45,        /* EINVAL */
	SR_E_MR_RAND = 46,         /* EIO */
	SR_E_QUOTA = 47,           /* EDQUOT: a per-user limit of the daemon (or its daemon-wide ceiling) */
	SR_E_CM_STATE = 48,        /* EINVAL */
	SR_E_CM_INVALID = 49,      /* EINVAL */
	SR_E_ADDR_IN_USE = 50,     /* EADDRINUSE */
	SR_E_NO_ADDR = 51,         /* EADDRNOTAVAIL */
	SR_E_CM_NO_QP = 52,        /* EINVAL */
	SR_E_CM_DESTROYED = 53,    /* EINVAL */
	SR_E_NO_CM = 54,           /* EOPNOTSUPP */
	SR_E_TIMEOUT = 55,         /* ETIMEDOUT */
	SR_E_DEV_BUSY = 56,        /* EBUSY */
	SR_E_FAULT = 57,           /* EFAULT: registered memory the daemon could not read or write */
	SR_E_VERSION = 58,         /* EPROTONOSUPPORT */
	SR_E_PERMISSION = 59,      /* EPERM: reserved to privileged users (a controlled Q_Key) */
};

/* ---------------------------------------------------------------- shared memory */

/*
 * Completion ring (one per CQ, SR_OP_CREATE_CQ): a memfd of sr_create_cq_resp.bytes,
 * one producer (the daemon), one consumer (the client). Counters are free-running
 * uint64; entry i lives at SR_CQ_ENTRIES + (i & (entries-1)) * SR_CQ_ENTRY_SIZE.
 */
#define SR_CQ_TAIL 0       /* uint64: entries produced (daemon) */
#define SR_CQ_HEAD 64      /* uint64: entries consumed (client) */
#define SR_CQ_ARMED 128    /* uint32: the client's notification request (SR_ARM_*) */
#define SR_CQ_WAIT 132     /* uint32: daemon: 1 = the ring was full, signal the space eventfd */
#define SR_CQ_ENTRIES 256
#define SR_CQ_ENTRY_SIZE 64

#define SR_ARM_NONE 0u
#define SR_ARM_NEXT 1u      /* ibv_req_notify_cq(cq, 0) */
#define SR_ARM_SOLICITED 2u /* ibv_req_notify_cq(cq, 1) */
#define SR_ARM_KIND 3u      /* mask of the two above */
#define SR_ARM_SLEEPING 4u  /* the client waits on the notify eventfd: the daemon must write it */

/* A completion ring entry: its first 46 bytes are struct ibv_wc's. */
struct sr_wc {
	uint64_t wr_id;
	uint32_t status;     /* IBV_WC_* status */
	uint32_t opcode;     /* IBV_WC_* opcode */
	uint32_t vendor_err; /* a refused asynchronous post: the SR_E_* code */
	uint32_t byte_len;
	uint32_t imm_data;   /* IBV_WC_WITH_IMM: network byte order; IBV_WC_WITH_INV: the rkey */
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;   /* IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_WITH_INV */
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
	uint8_t reserved[18];
};

/*
 * Post ring and event ring (one per connection, SR_OP_OPEN_RINGS): one memfd.
 * Post ring: the client produces, the daemon consumes, records of
 * [sr_post_record][message][padding to 8]; a record never wraps: a pad record
 * fills the end of the data area first.
 */
#define SR_POST_TAIL 0   /* uint64: bytes produced (client) */
#define SR_POST_HEAD 64  /* uint64: bytes consumed (daemon) */
#define SR_POST_AWAKE 128 /* uint32: SR_AWAKE_* (daemon) */
#define SR_POST_DATA 256
#define SR_POST_RING_DATA (256u * 1024u)
#define SR_MAX_POST_RECORD (SR_POST_RING_DATA / 4u)

#define SR_AWAKE_ASLEEP 0u   /* ring the doorbell after publishing */
#define SR_AWAKE_DRAINING 1u /* the daemon drains: no doorbell needed */
#define SR_AWAKE_STOPPED 2u  /* the daemon stopped: later posts fail (ENOTCONN) */

#define SR_RECORD_POST 1u /* a post message (SR_OP_POST_SEND_ASYNC / SR_OP_POST_RECV_ASYNC) */
#define SR_RECORD_PAD 2u  /* filler up to the end of the data area */

struct sr_post_record {
	uint32_t len;  /* message bytes (not counting this header or the padding) */
	uint32_t kind; /* SR_RECORD_* */
};

/* Event ring: ibv_get_async_event; the daemon produces, the client consumes. */
#define SR_EVENT_RING_OFF (SR_POST_DATA + SR_POST_RING_DATA)
#define SR_EVENT_RING_BYTES 4096
#define SR_EVENT_TAIL 0   /* uint64: entries produced (daemon) */
#define SR_EVENT_HEAD 64  /* uint64: entries consumed (client) */
#define SR_EVENT_ENTRIES 128
#define SR_EVENT_RING_CAP 64

#define SR_EVENT_ON_DEVICE 0 /* a port or device event: no object */
#define SR_EVENT_ON_QP 1
#define SR_EVENT_ON_CQ 2
#define SR_EVENT_ON_SRQ 3

struct sr_async_event {
	uint8_t type;  /* IBV_EVENT_* */
	uint8_t kind;  /* SR_EVENT_ON_* */
	uint8_t port;
	uint8_t reserved;
	uint32_t handle; /* the client's handle of the QP, CQ or SRQ */
	uint32_t qpn;
	uint32_t reserved2;
};

/* ---------------------------------------------------------------- sizes */

#ifndef __cplusplus
#define SR_SIZE(t, n) _Static_assert(sizeof(struct t) == (n), #t " is " #n " bytes")
#else
#define SR_SIZE(t, n) static_assert(sizeof(struct t) == (n), #t " is " #n " bytes")
#endif
SR_SIZE(sr_hdr, 8);
SR_SIZE(sr_err, 8);
SR_SIZE(sr_handle, 8);
SR_SIZE(sr_hello_req, 16);
SR_SIZE(sr_hello_resp, 96);
SR_SIZE(sr_open_rings_resp, 24);
SR_SIZE(sr_port_req, 8);
SR_SIZE(sr_device_attr, 240);
SR_SIZE(sr_port_attr, 56);
SR_SIZE(sr_gids_resp, 8);
SR_SIZE(sr_gid_entry, 48);
SR_SIZE(sr_pkey_req, 8);
SR_SIZE(sr_pkey_resp, 8);
SR_SIZE(sr_stats, 208);
SR_SIZE(sr_debug, 496);
SR_SIZE(sr_reg_mr_req, 48);
SR_SIZE(sr_reg_mr_resp, 16);
SR_SIZE(sr_rereg_mr_req, 56);
SR_SIZE(sr_rereg_mr_resp, 8);
SR_SIZE(sr_alloc_mw_req, 8);
SR_SIZE(sr_alloc_mw_resp, 8);
SR_SIZE(sr_create_cq_req, 8);
SR_SIZE(sr_create_cq_resp, 16);
SR_SIZE(sr_resize_cq_req, 8);
SR_SIZE(sr_resize_cq_resp, 16);
SR_SIZE(sr_modify_cq_req, 8);
SR_SIZE(sr_create_srq_req, 16);
SR_SIZE(sr_create_srq_resp, 16);
SR_SIZE(sr_modify_srq_req, 16);
SR_SIZE(sr_srq_attr, 16);
SR_SIZE(sr_qp_cap, 24);
SR_SIZE(sr_ah_attr, 32);
SR_SIZE(sr_qp_attr, 136);
SR_SIZE(sr_create_qp_req, 48);
SR_SIZE(sr_create_qp_resp, 32);
SR_SIZE(sr_modify_qp_req, 144);
SR_SIZE(sr_query_qp_req, 8);
SR_SIZE(sr_create_ah_req, 40);
SR_SIZE(sr_create_ah_resp, 48);
SR_SIZE(sr_post, 8);
SR_SIZE(sr_sge, 16);
SR_SIZE(sr_send_wr, 96);
SR_SIZE(sr_recv_wr, 16);
SR_SIZE(sr_post_resp, 8);
SR_SIZE(sr_sockaddr, 24);
SR_SIZE(sr_cm_route, 40);
SR_SIZE(sr_conn_param, 272);
SR_SIZE(sr_cm_create_id_req, 8);
SR_SIZE(sr_cm_migrate_req, 8);
SR_SIZE(sr_cm_bind_req, 32);
SR_SIZE(sr_cm_resolve_addr_req, 56);
SR_SIZE(sr_cm_addr_resp, 48);
SR_SIZE(sr_cm_resolve_route_req, 8);
SR_SIZE(sr_cm_set_qp_req, 8);
SR_SIZE(sr_cm_init_qp_attr_req, 8);
SR_SIZE(sr_cm_init_qp_attr_resp, 144);
SR_SIZE(sr_cm_listen_req, 8);
SR_SIZE(sr_cm_conn_req, 280);
SR_SIZE(sr_cm_reject_req, 264);
SR_SIZE(sr_cm_get_events_req, 8);
SR_SIZE(sr_cm_events_resp, 8);
SR_SIZE(sr_cm_event, 416);
SR_SIZE(sr_cm_query_id_resp, 96);
SR_SIZE(sr_wc, 64);
SR_SIZE(sr_post_record, 8);
SR_SIZE(sr_async_event, 16);
#undef SR_SIZE

#endif /* SOFTROCE_PROTO_H */
