// A context's session with the daemon beyond HELLO: the shared post and
// event rings, the daemon's access to this process's memory, and the
// asynchronous events (ibv_get_async_event) that arrive in the event ring.
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sr.h"

// The open contexts, for the fork handler.
static pthread_mutex_t contexts_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sr_context *contexts;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

// forked runs in the child after fork(): it closes the child's copies of
// the sessions' sockets and doorbells (the parent's connections stay the
// parent's alone; the daemon sees one client) and makes every later verb on
// the parent's objects fail. The rings are MADV_DONTFORK: not in the child.
static void forked(void)
{
	for (struct sr_context *sc = contexts; sc; sc = sc->next_ctx) {
		sc->forked = 1;
		if (sc->conn.fd >= 0)
			close(sc->conn.fd);
		sc->conn.fd = -1;
		if (sc->doorbell_fd >= 0)
			close(sc->doorbell_fd);
		sc->doorbell_fd = -1;
		sc->rings = NULL;
	}
}

static void register_atfork(void)
{
	pthread_atfork(NULL, NULL, forked);
}

static void track(struct sr_context *sc, int add)
{
	pthread_mutex_lock(&contexts_mu);
	if (add) {
		sc->next_ctx = contexts;
		contexts = sc;
	} else {
		for (struct sr_context **p = &contexts; *p; p = &(*p)->next_ctx) {
			if (*p == sc) {
				*p = sc->next_ctx;
				break;
			}
		}
	}
	pthread_mutex_unlock(&contexts_mu);
}

int sr_open_session(struct sr_context *sc)
{
	pthread_once(&atfork_once, register_atfork);
	struct sr_open_rings_resp rr;
	int fds[3];
	struct sr_call call = {.op = SR_OP_OPEN_RINGS, .resp = &rr, .respcap = sizeof(rr),
			       .rfds = fds, .maxrfds = 3};
	if (sr_call(&sc->conn, &call) < 0)
		return -1;
	if (call.nrfds != 3 || call.resplen < sizeof(rr) || rr.bytes < SR_EVENT_RING_OFF + SR_EVENT_RING_BYTES ||
	    rr.event_off != SR_EVENT_RING_OFF) {
		for (int i = 0; i < call.nrfds; i++)
			close(fds[i]);
		return sr_fail(EPROTO);
	}
	void *m = mmap(NULL, rr.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	if (m == MAP_FAILED) {
		int e = errno;
		close(fds[1]);
		close(fds[2]);
		return sr_fail(e);
	}
	sc->rings = m;
	sc->rings_bytes = rr.bytes;
	madvise(m, rr.bytes, MADV_DONTFORK);
	sc->doorbell_fd = fds[1];
	sc->async_fd = fds[2];
	int fl = fcntl(sc->async_fd, F_GETFL);
	if (fl >= 0)
		fcntl(sc->async_fd, F_SETFL, fl & ~O_NONBLOCK);

	// The daemon reads and writes registered memory through this
	// process's /proc/self/mem (docs/daemon-protocol.md: SR_MR_PROCESS).
	int mem = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
	if (mem < 0) {
		int e = errno;
		sr_close_session(sc);
		return sr_fail(e);
	}
	struct sr_call att = {.op = SR_OP_ATTACH_MEM, .fds = &mem, .nfds = 1};
	int r = sr_call(&sc->conn, &att);
	int e = errno;
	close(mem);
	// A daemon that cannot reach process memory still serves everything
	// else; ibv_reg_mr then fails with its answer.
	if (r < 0 && e != EOPNOTSUPP) {
		sr_close_session(sc);
		return sr_fail(e);
	}
	track(sc, 1);
	return 0;
}

void sr_close_session(struct sr_context *sc)
{
	track(sc, 0);
	if (sc->rings && !sc->forked)
		munmap(sc->rings, sc->rings_bytes);
	sc->rings = NULL;
	if (sc->doorbell_fd >= 0)
		close(sc->doorbell_fd);
	if (sc->async_fd >= 0)
		close(sc->async_fd);
	sc->doorbell_fd = sc->async_fd = -1;
}

void sr_add_obj(struct sr_context *sc, struct sr_obj *o, uint32_t handle, int kind, void *ptr)
{
	o->handle = handle;
	o->kind = kind;
	o->ptr = ptr;
	pthread_mutex_lock(&sc->ev_mu);
	o->next = sc->objs;
	sc->objs = o;
	pthread_mutex_unlock(&sc->ev_mu);
}

void sr_del_obj(struct sr_context *sc, struct sr_obj *o)
{
	pthread_mutex_lock(&sc->ev_mu);
	for (struct sr_obj **p = &sc->objs; *p; p = &(*p)->next) {
		if (*p == o) {
			*p = o->next;
			break;
		}
	}
	pthread_mutex_unlock(&sc->ev_mu);
}

static _Atomic uint64_t *ev_word(struct sr_context *sc, size_t off)
{
	return (_Atomic uint64_t *)(void *)(sc->rings + SR_EVENT_RING_OFF + off);
}

// take_event moves the next event of the ring into ev; it reports whether
// there was one whose object still exists (events of destroyed objects are
// dropped, as the kernel drops them with the object).
static int take_event(struct sr_context *sc, struct ibv_async_event *ev, int *more)
{
	pthread_mutex_lock(&sc->ev_mu);
	uint64_t tail = atomic_load(ev_word(sc, SR_EVENT_TAIL));
	uint64_t head = atomic_load(ev_word(sc, SR_EVENT_HEAD));
	int found = 0;
	while (head != tail && !found) {
		struct sr_async_event e;
		memcpy(&e, sc->rings + SR_EVENT_RING_OFF + SR_EVENT_ENTRIES +
				   (head % SR_EVENT_RING_CAP) * sizeof(e), sizeof(e));
		head++;
		ev->event_type = (enum ibv_event_type)e.type;
		if (e.kind == SR_EVENT_ON_DEVICE) {
			ev->element.port_num = e.port;
			found = 1;
			break;
		}
		for (struct sr_obj *o = sc->objs; o; o = o->next) {
			if (o->handle == e.handle && o->kind == e.kind) {
				if (o->kind == SR_EVENT_ON_QP)
					ev->element.qp = o->ptr;
				else if (o->kind == SR_EVENT_ON_CQ)
					ev->element.cq = o->ptr;
				else
					ev->element.srq = o->ptr;
				found = 1;
				break;
			}
		}
	}
	atomic_store(ev_word(sc, SR_EVENT_HEAD), head);
	*more = head != tail;
	pthread_mutex_unlock(&sc->ev_mu);
	return found;
}

// drain reads the eventfd's counter if it is readable, without blocking.
static void drain(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	uint64_t v;
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN) && read(fd, &v, sizeof(v)) < 0) {
		// another thread took it
	}
}

int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct sr_context *sc = sr_ctx(context);
	if (sc->forked)
		return sr_fail(ENOTCONN);
	for (;;) {
		// Clear the eventfd before looking: an event published after the
		// look writes it again, so the poll below cannot miss it.
		pthread_mutex_lock(&sc->ev_mu);
		drain(sc->async_fd);
		pthread_mutex_unlock(&sc->ev_mu);
		int more = 0;
		if (take_event(sc, event, &more)) {
			if (more) { // keep async_fd readable while events wait
				uint64_t v = 1;
				if (write(sc->async_fd, &v, sizeof(v)) < 0) {
					// saturated: it stays readable
				}
			}
			return 0;
		}
		// The session made the fd blocking: O_NONBLOCK is the program's
		// (it polls async_fd, then asks), and then this must not block.
		int fl = fcntl(sc->async_fd, F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK))
			return sr_fail(EAGAIN);
		struct pollfd p = {.fd = sc->async_fd, .events = POLLIN};
		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -1;
	}
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	// Objects wait for no acknowledgement: destroying one drops its
	// pending events (take_event).
	(void)event;
}

// Default versions of the verbs that have IBVERBS_1.0 compat versions.
SR_DEFAULT_1_1(ibv_get_async_event);
SR_DEFAULT_1_1(ibv_ack_async_event);

// ---------------------------------------------------------------- post ring

static _Atomic uint64_t *post_u64(struct sr_context *sc, size_t off)
{
	return (_Atomic uint64_t *)(void *)(sc->rings + off);
}

// sr_ring_post publishes one asynchronous post message (op, then body) as
// a record of the post ring (docs/daemon-protocol.md, "Post ring") and rings
// the doorbell if the daemon sleeps. It returns 0, 1 if the record does not
// fit (the caller sends the message on the socket), or -1 with errno
// ENOTCONN if the daemon stopped taking posts.
int sr_ring_post(struct sr_context *sc, uint16_t op, const void *body, size_t len)
{
	size_t msg = sizeof(struct sr_hdr) + len;
	if (!sc->rings || msg > SR_MAX_POST_RECORD)
		return 1;
	size_t need = sizeof(struct sr_post_record) + ((msg + 7) & ~(size_t)7);
	pthread_mutex_lock(&sc->ring_mu);
	uint64_t tail = atomic_load(post_u64(sc, SR_POST_TAIL));
	uint64_t head = atomic_load(post_u64(sc, SR_POST_HEAD));
	uint64_t used = tail - head;
	size_t pos = (size_t)(tail % SR_POST_RING_DATA);
	size_t pad = pos + need > SR_POST_RING_DATA ? SR_POST_RING_DATA - pos : 0;
	if (head > tail || used > SR_POST_RING_DATA || used + pad + need > SR_POST_RING_DATA) {
		pthread_mutex_unlock(&sc->ring_mu);
		return 1;
	}
	char *data = sc->rings + SR_POST_DATA;
	if (pad) {
		struct sr_post_record pr = {.len = (uint32_t)(pad - sizeof(pr)), .kind = SR_RECORD_PAD};
		memcpy(data + pos, &pr, sizeof(pr));
		pos = 0;
	}
	struct sr_post_record r = {.len = (uint32_t)msg, .kind = SR_RECORD_POST};
	struct sr_hdr h = {.op = op};
	memcpy(data + pos, &r, sizeof(r));
	memcpy(data + pos + sizeof(r), &h, sizeof(h));
	memcpy(data + pos + sizeof(r) + sizeof(h), body, len);
	// Publish, then look at awake: an exchange, so the load cannot pass
	// the store (the doorbell rule's Dekker pair).
	atomic_exchange(post_u64(sc, SR_POST_TAIL), tail + pad + need);
	uint32_t awake = atomic_load((_Atomic uint32_t *)(void *)(sc->rings + SR_POST_AWAKE));
	pthread_mutex_unlock(&sc->ring_mu);
	if (awake == SR_AWAKE_STOPPED)
		return sr_fail(ENOTCONN);
	if (awake == SR_AWAKE_ASLEEP) {
		uint64_t one = 1;
		if (write(sc->doorbell_fd, &one, sizeof(one)) < 0) {
			// saturated: the daemon is woken anyway
		}
	}
	return 0;
}
