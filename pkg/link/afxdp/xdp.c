//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// The AF_XDP path's XDP programs (docs/link.md "AF_XDP path", "XDP write responder"), compiled
// by bpf2go (gen.go) into xdp_bpfel.o / xdp_bpfeb.o, which the package embeds.
//
// xsk_redirect: the link's own RoCEv2 datagrams (IPv4 with a 20-byte header, not a fragment,
// UDP to the link's address and port, the whole frame at most max_frame bytes) go to the
// AF_XDP socket of the receive queue (xsks); everything else to the stack.
//
// xsk_write: the same, but first the write responder: an RC RDMA WRITE Only of 1..64 bytes
// to a QP and R_Key user space entered (qps, mrs), at the QP's expected PSN, not marked
// Congestion Experienced, every check the engine makes passed and the UDP checksum the
// kernel's receive would check, is copied into device memory (mem) and answered with the QP's
// ACK in place (XDP_TX), as kernel rxe does in the sender's softirq; what it declines is
// redirected untouched. The state it shares with user space is one word per QP in page 0 of
// mem (bits 0-23 the expected PSN, 24-47 the MSN, 48 paused, 49 busy) and a count:
// write_linux.go.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// Set by the loader (xsk_linux.go) before the program is loaded: the link's IPv4 address and
// UDP port in wire order, the largest frame the ring takes, and the verdict when the queue has
// no socket (XDP_PASS; tests choose another to tell a redirect from a pass).
volatile const __u32 local_addr;
volatile const __u16 local_port;
volatile const __u32 max_frame = 3840;
volatile const __u32 no_socket = XDP_PASS;

#define ETH_IPV4_UDP 42                 // Ethernet 14, IPv4 20, UDP 8
#define OFF_BTH ETH_IPV4_UDP            // BTH 12 bytes (IBTA 9.2)
#define OFF_RETH (OFF_BTH + 12)         // RETH 16 bytes (IBTA 9.3.3)
#define OFF_PAYLOAD (OFF_RETH + 16)
#define ACK_FRAME (OFF_BTH + 12 + 4 + 4) // BTH, AETH, ICRC
#define WRITE_MAX 64                    // the largest payload the program executes
#define PAGE 4096
#define SLOTS 256                       // QP slots: 16 bytes each in page 0
#define WORD_PSN 0xFFFFFFull
#define WORD_BUSY (1ull << 49)
#define DECLINE (-1)

// The QP table's value: what the responder needs of a QP (AddWriteQP).
struct qp_entry {
	__u32 slot;      // its word and count in page 0
	__u32 pd;        // its protection domain
	__u32 peer;      // the requester's IPv4 address, wire order
	__u32 ack_crc;   // CRC-32 state (not inverted) over the ACK's bytes before its PSN
	__u8 tmpl[48];   // the ACK's IPv4, UDP, BTH and AETH (44 bytes) as sent, PSN and MSN 0
	__u8 mac[8];     // the link's MAC address: the ACK's source
};

// The MR table's value (AddWriteMR); the key is the R_Key in wire order.
struct mr_entry {
	__u32 pd;
	__u32 pad;
	__u64 va;        // the MR's first virtual address
	__u64 length;
	__u64 off;       // where the MR starts in the device memory
};

struct dm_page {
	__u8 b[PAGE];
};

struct crc_table {
	__u32 t[256];
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 1); // queue + 1, set by the loader
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Hash tables without preallocation: a replaced or deleted element is freed after an RCU
// grace period, so a program that looked it up reads one whole entry.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, SLOTS);
	__type(key, __u32); // the QPN
	__type(value, struct qp_entry);
} qps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32); // the R_Key, wire order
	__type(value, struct mr_entry);
} mrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct crc_table); // crc32.IEEETable
} crc SEC(".maps");

// Device memory: page 0 the QP slots, then the memory (max_entries set by the loader).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct dm_page);
} mem SEC(".maps");

// The ICRC's stored byte order (IBTA A17.3.3: the CRC-32 little-endian on the wire).
static __always_inline __u32 le32(__u32 v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return v;
#else
	return __builtin_bswap32(v);
#endif
}

// One byte of the reflected CRC-32 (crc32.IEEE), table-driven. The index is masked last, after
// an empty asm, so that the compiler cannot mask crc before the xor: the 6.1 verifier learns
// no bounds from a 32-bit xor, and the table access needs them.
static __always_inline __u32 crc_step(const struct crc_table *tab, __u32 crc, __u8 b)
{
	__u32 i = crc ^ b;
	asm volatile("" : "+r"(i));
	return tab->t[i & 0xff] ^ (crc >> 8);
}

// Whether frame byte off (from the IPv4 header on) counts as all ones in the ICRC (IBTA
// A17.3.3: IPv4 TOS, TTL, header checksum; UDP checksum; BTH byte 4).
static __always_inline int icrc_masked(int off)
{
	return off == 14 + 1 || off == 14 + 8 || off == 14 + 10 || off == 14 + 11 || off == 34 + 6 ||
	       off == 34 + 7 || off == OFF_BTH + 4;
}

static __always_inline __u32 be24(const __u8 *p)
{
	return (__u32)p[0] << 16 | (__u32)p[1] << 8 | p[2];
}

static __always_inline void put_be24(__u8 *p, __u32 v)
{
	p[0] = v >> 16;
	p[1] = v >> 8;
	p[2] = v;
}

// BOUND(v, max) is v, checked against max (DECLINE above it) where it is used: the compiler
// may spill a value to the stack before its check and reload it for the use, and an older
// verifier (before Linux 6.8) may keep the bounds the value had when it was spilled, so that
// the check does not reach the reloaded copy. The empty asm makes the compiler check the very
// register it uses.
#define BOUND(v, max)                          \
	({                                     \
		__u64 _v = (v);                \
		asm volatile("" : "+r"(_v));   \
		if (_v > (max))                \
			return DECLINE;        \
		_v;                            \
	})

// PIN(p) makes the compiler compute pointer p here, right after the BOUND its offset passed,
// rather than where p is used: a spilled pointer keeps its bounds, a spilled offset may not.
#define PIN(p) asm volatile("" : "+r"(p))

// fold reduces a sum of big-endian 16- and 32-bit words to its 16-bit ones' complement sum
// (RFC 1071): csum.go's fold.
static __always_inline __u16 fold(__u64 s)
{
	s = (s >> 32) + (s & 0xffffffff);
	s = (s >> 32) + (s & 0xffffffff);
	s = (s >> 16) + (s & 0xffff);
	s = (s >> 16) + (s & 0xffff);
	return s;
}

// The CRC-32 state (not inverted) after the ICRC's 8 bytes of ones for the absent LRH.
#define CRC_LRH_STATE 0xdebb20e3u

// write_responder executes the frame (after xsk_redirect's framing checks) if it is a WRITE
// it takes: XDP_TX with the ACK in place, XDP_DROP for one that asks for no ACK (IBTA
// 9.7.5.1 coalescing) or whose ACK could not be made; DECLINE leaves the frame untouched.
static __always_inline int write_responder(struct xdp_md *ctx, __u64 frame_len)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;

	if (data + OFF_PAYLOAD + 1 + 3 + 4 > end) // the shortest WRITE it takes: 1 byte, 3 pad, ICRC
		return DECLINE;
	if ((data[15] & 3) == 3) // ECN CE (RFC 3168): user space sees the mark (IBTA A17.9.1)
		return DECLINE;
	if (data[OFF_BTH] != 0x0A) // RC RDMA WRITE Only (IBTA 9.2: RC, opcode 01010)
		return DECLINE;
	__u8 b1 = data[OFF_BTH + 1];
	if ((b1 & 0x0f) != 0) // TVer 0
		return DECLINE;
	__u64 pad = (b1 >> 4) & 3;
	__u64 len = bpf_ntohl(*(__u32 *)(data + OFF_RETH + 12)); // the DMA length
	if (len == 0 || len > WRITE_MAX)
		return DECLINE;
	if (((0 - len) & 3) != pad) // the pad the length needs (IBTA 9.7.4.1.6)
		return DECLINE;
	__u64 n = len + pad; // payload and pad
	if (n + OFF_PAYLOAD + 4 != frame_len) // the payload is the DMA length: nothing after the ICRC
		return DECLINE;
	if ((__u64)bpf_ntohs(*(__u16 *)(data + 16)) + 14 != frame_len) // the IPv4 total length
		return DECLINE;
	if ((__u64)bpf_ntohs(*(__u16 *)(data + 38)) + 34 != frame_len) // and the UDP length
		return DECLINE;

	// the UDP checksum, as the kernel's UDP receive would have checked it (RFC 768): none (0,
	// kernel rxe's), the pseudo-header's sum a local sender leaves for checksum offload, or a
	// right one; udp4ChecksumOK (csum.go) is the same rule for the ring
	__u16 csum = bpf_ntohs(*(__u16 *)(data + 40));
	if (csum != 0) {
		__u64 s = 17; // IPPROTO_UDP
#pragma unroll
		for (int k = 26; k < 34; k += 2) // the addresses
			s += bpf_ntohs(*(__u16 *)(data + k));
		s += bpf_ntohs(*(__u16 *)(data + 38)); // the UDP length
		if (fold(s) != csum) { // not the pseudo-header's sum only: the whole datagram's
#pragma unroll
			for (int k = 34; k < OFF_PAYLOAD; k += 4) // the UDP header, BTH and RETH
				s += bpf_ntohl(*(__u32 *)(data + k));
#pragma unroll
			for (int i = 0; i < WRITE_MAX + 4; i += 4) { // payload, pad and ICRC: n + 4 bytes
				if (n + 4 <= i)
					break;
				if (data + OFF_PAYLOAD + i + 4 > end)
					return DECLINE;
				s += bpf_ntohl(*(__u32 *)(data + OFF_PAYLOAD + i));
			}
			if (fold(s) != 0xffff) // a wrong checksum: user space drops it (and counts it)
				return DECLINE;
		}
	}

	__u32 key = be24(data + OFF_BTH + 5);
	struct qp_entry *qp = bpf_map_lookup_elem(&qps, &key);
	if (!qp)
		return DECLINE;
	if (*(__u32 *)(data + 26) != qp->peer) // from the QP's peer (RC: the path's address)
		return DECLINE;
	const __u16 pkey = bpf_htons(0x7fff); // IBTA 10.9.3: the one P_Key, 0xFFFF (either membership)
	if ((*(__u16 *)(data + OFF_BTH + 2) & pkey) != pkey)
		return DECLINE;
	key = *(__u32 *)(data + OFF_RETH + 8); // the R_Key, wire order: the MR table's key
	struct mr_entry *mr = bpf_map_lookup_elem(&mrs, &key);
	if (!mr)
		return DECLINE;
	if (mr->pd != qp->pd) // the MR's protection domain is the QP's
		return DECLINE;
	__u64 va = bpf_be64_to_cpu(*(__u64 *)(data + OFF_RETH));
	__u64 mva = mr->va, mlen = mr->length;
	if (va < mva)
		return DECLINE;
	__u64 off = va - mva; // in the MR
	if (off > mlen || len > mlen - off) // bounds (IBTA C9-88)
		return DECLINE;
	off += mr->off; // in the device memory
	__u64 in_page = off & (PAGE - 1);
	if (in_page > PAGE - WRITE_MAX) // may cross a page: user space does it
		return DECLINE;
	key = (off >> 12) + 1; // page 0 is the QP slots
	struct dm_page *pg = bpf_map_lookup_elem(&mem, &key);
	if (!pg)
		return DECLINE;
	__u8 *dst = pg->b + BOUND(in_page, PAGE - WRITE_MAX);
	PIN(dst);
	key = 0;
	struct dm_page *slots = bpf_map_lookup_elem(&mem, &key);
	if (!slots)
		return DECLINE;
	__u64 *word = (__u64 *)(slots->b + BOUND(qp->slot, SLOTS - 1) * 16);
	PIN(word);
	struct crc_table *tab = bpf_map_lookup_elem(&crc, &key);
	if (!tab)
		return DECLINE;

	// the ICRC (IBTA A17.3.3): 8 bytes of ones for the absent LRH, then the frame from the
	// IPv4 header to the ICRC, masked fields as ones
	__u32 c = CRC_LRH_STATE;
#pragma unroll
	for (int i = 14; i < OFF_PAYLOAD; i++)
		c = crc_step(tab, c, icrc_masked(i) ? 0xff : data[i]);
	if (n > WRITE_MAX + 3)
		return DECLINE;
#pragma unroll
	for (int i = 0; i < WRITE_MAX + 3; i++) {
		if (n <= i)
			break;
		if (data + OFF_PAYLOAD + i + 1 > end)
			return DECLINE;
		c = crc_step(tab, c, data[OFF_PAYLOAD + i]);
	}
	__u8 *icrc = data + OFF_PAYLOAD + BOUND(n, WRITE_MAX + 3);
	if (icrc + 4 > end)
		return DECLINE;
	if (le32(*(__u32 *)icrc) != ~c) // a bad ICRC: user space drops it (and counts it)
		return DECLINE;

	// claim the PSN: the word must be this PSN, not paused, not busy
	__u64 psn = be24(data + OFF_BTH + 9);
	__u64 old = *(volatile __u64 *)word;
	if ((old & WORD_PSN) != psn)
		return DECLINE; // not the expected PSN: a duplicate or a gap
	if ((old >> 48) != 0)
		return DECLINE; // paused or busy
	if (__sync_val_compare_and_swap(word, old, old | WORD_BUSY) != old)
		return DECLINE; // changed meanwhile: user space paused it

	// the payload into the device memory (len in [1, 64] for the verifier: the 6.1 one learns
	// no lower bound from a test against 0)
	__u32 copy = ((len - 1) & (WRITE_MAX - 1)) + 1;
	if (bpf_xdp_load_bytes(ctx, OFF_PAYLOAD, dst, copy) != 0) {
		__sync_lock_test_and_set(word, old); // give the PSN back as it was
		return DECLINE;
	}

	// publish PSN+1, MSN+1 (flags clear), then count the WRITE
	__u64 msn = ((old >> 24) + 1) & WORD_PSN;
	__sync_lock_test_and_set(word, ((old + 1) & WORD_PSN) | msn << 24);
	__sync_fetch_and_add(word + 1, 1);

	// no AckReq: nothing to send (IBTA 9.7.5.1: the ACK may be coalesced)
	if ((data[OFF_BTH + 8] & 0x80) == 0)
		return XDP_DROP;

	// the ACK in place: to the request's source from the link's MAC address, the QP's headers,
	// the PSN, the MSN, the ICRC continued from the template's state
	__u32 m4 = *(__u32 *)(data + 6);
	__u16 m2 = *(__u16 *)(data + 10);
	*(__u32 *)data = m4;
	*(__u16 *)(data + 4) = m2;
	*(__u32 *)(data + 6) = *(__u32 *)qp->mac;
	*(__u16 *)(data + 10) = *(__u16 *)(qp->mac + 4);
#pragma unroll
	for (int k = 0; k < 48; k += 8)
		*(__u64 *)(data + 14 + k) = *(__u64 *)(qp->tmpl + k);
	put_be24(data + OFF_BTH + 9, psn);
	put_be24(data + OFF_BTH + 12 + 1, msn);
	c = qp->ack_crc;
#pragma unroll
	for (int i = OFF_BTH + 9; i < OFF_BTH + 16; i++)
		c = crc_step(tab, c, data[i]);
	*(__u32 *)(data + OFF_BTH + 16) = le32(~c);
	if (bpf_xdp_adjust_tail(ctx, ACK_FRAME - (int)frame_len) != 0)
		return XDP_DROP; // the WRITE is done; its ACK lost (the requester's retry gets one)
	return XDP_TX;
}

// frame_ok reports whether the frame is one of the link's datagrams for the ring (the
// framing checks); *frame_len gets the whole frame's length.
static __always_inline int frame_ok(struct xdp_md *ctx, __u64 *frame_len)
{
	__u64 fl = bpf_xdp_get_buff_len(ctx); // all of it, also in several buffers
	if (fl > max_frame)
		return 0;
	*frame_len = fl;
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	if (data + ETH_IPV4_UDP > end)
		return 0;
	if (*(__u16 *)(data + 12) != bpf_htons(0x0800)) // IPv4
		return 0;
	if (data[14] != 0x45) // a 20-byte header
		return 0;
	if (data[23] != 17) // UDP
		return 0;
	if ((*(__u16 *)(data + 20) & bpf_htons(0x3fff)) != 0) // not a fragment: MF, offset
		return 0;
	if (*(__u32 *)(data + 30) != local_addr)
		return 0;
	if (*(__u16 *)(data + 36) != local_port)
		return 0;
	return 1;
}

SEC("xdp")
int xsk_redirect(struct xdp_md *ctx)
{
	__u64 fl;
	if (!frame_ok(ctx, &fl))
		return XDP_PASS;
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, no_socket);
}

SEC("xdp")
int xsk_write(struct xdp_md *ctx)
{
	__u64 fl;
	if (!frame_ok(ctx, &fl))
		return XDP_PASS;
	int v = write_responder(ctx, fl);
	if (v != DECLINE)
		return v;
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, no_socket);
}
