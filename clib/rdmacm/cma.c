// librdmacm over the daemon's connection manager (docs/clib.md,
// docs/daemon-protocol.md "rdma_cm"). Every rdma_cm ID and event channel
// lives in the daemon, in the session of the one device context librdmacm
// opens (cma_context): IDs report it as id->verbs, rdma_get_devices returns
// it, so the PDs, CQs and QPs a program makes for its IDs are in the same
// session as the IDs that bind them.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cma.h"

static pthread_mutex_t cma_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_context *cma_ctx;
static struct ibv_pd *cma_pd;

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

// forked: in a child after fork(), librdmacm's context is the parent's
// (libibverbs makes its verbs fail there); the child opens its own on first
// use. The parent's IDs and channels stay unusable in the child.
static void forked(void)
{
	cma_ctx = NULL;
	cma_pd = NULL;
	pthread_mutex_init(&cma_mu, NULL);
}

static void register_atfork(void)
{
	pthread_atfork(NULL, NULL, forked);
}

// cma_context opens (once) the device the daemon serves, and its default
// PD (librdmacm's: every ID's id->pd, which rdma_create_qp uses when given
// none and programs such as pyverbs allocate nothing else).
struct ibv_context *cma_context(void)
{
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&cma_mu);
	if (!cma_ctx) {
		int n = 0;
		struct ibv_device **devs = ibv_get_device_list(&n);
		if (devs && n > 0)
			cma_ctx = ibv_open_device(devs[0]);
		else
			errno = ENODEV;
		if (devs)
			ibv_free_device_list(devs);
		if (cma_ctx && !(cma_pd = ibv_alloc_pd(cma_ctx))) {
			ibv_close_device(cma_ctx);
			cma_ctx = NULL;
		}
	}
	struct ibv_context *c = cma_ctx;
	pthread_mutex_unlock(&cma_mu);
	return c;
}

struct ibv_pd *cma_default_pd(void)
{
	return cma_context() ? cma_pd : NULL;
}

struct sr_conn *cma_conn(void)
{
	struct ibv_context *c = cma_context();
	return c ? &sr_ctx(c)->conn : NULL;
}

const char *rdma_event_str(enum rdma_cm_event_type event)
{
	switch (event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
	case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
	case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
	case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
	case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
	case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
	case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
	case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
	case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
	case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
	case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
	case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
	case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
	case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
	case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
	case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
	default: return "UNKNOWN EVENT";
	}
}

// rdma_get_devices returns librdmacm's context (a program allocates its
// PDs there); rdma_free_devices frees the list, not the context.
struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list = calloc(2, sizeof(*list));
	if (!list)
		return sr_fail_null(ENOMEM);
	int n = 0;
	struct ibv_context *c = cma_context();
	if (c)
		list[n++] = c;
	if (num_devices)
		*num_devices = n;
	return list;
}

void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

// ---------------------------------------------------------------- event channels

struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct sr_conn *c = cma_conn();
	if (!c)
		return NULL;
	struct sr_handle h;
	int fd = -1;
	struct sr_call call = {.op = SR_OP_CM_CREATE_CHANNEL, .resp = &h, .respcap = sizeof(h),
			       .rfds = &fd, .maxrfds = 1};
	if (sr_call(c, &call) < 0)
		return NULL;
	if (call.nrfds != 1 || call.resplen < sizeof(h)) {
		if (call.nrfds)
			close(fd);
		return sr_fail_null(EPROTO);
	}
	struct cma_channel *ch = calloc(1, sizeof(*ch));
	if (!ch) {
		close(fd);
		cma_destroy(SR_OP_CM_DESTROY_CHANNEL, h.handle);
		return sr_fail_null(ENOMEM);
	}
	// Blocking: O_NONBLOCK on it later is the program's (it polls the fd).
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	ch->ch.fd = fd;
	ch->handle = h.handle;
	pthread_mutex_init(&ch->mu, NULL);
	return &ch->ch;
}

static void chan_free(struct cma_channel *ch)
{
	close(ch->ch.fd);
	free(ch->queue);
	pthread_mutex_destroy(&ch->mu);
	free(ch);
}

// rdma_destroy_event_channel while another thread waits in rdma_get_cm_event on the channel
// (rping's CM thread at exit): on the kernel's ucma that thread sleeps in the kernel, which
// holds the file until the call returns, and nothing wakes it: it stays blocked until the
// process exits, and the program never sees an error from it. So here: the channel is marked
// closed and kept, not freed, and the waiting thread blocks for good (cma_next) instead of
// returning the daemon's error for a channel that is gone.
void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct cma_channel *ch = cma_chan(channel);
	pthread_mutex_lock(&ch->mu);
	int busy = ch->users > 0;
	ch->closed = 1;
	pthread_mutex_unlock(&ch->mu);
	cma_destroy(SR_OP_CM_DESTROY_CHANNEL, ch->handle);
	if (!busy) // else the waiter keeps it (and its fd, which nothing writes any more)
		chan_free(ch);
}

int cma_destroy(uint16_t op, uint32_t handle)
{
	struct sr_conn *c = cma_conn();
	if (!c)
		return -1;
	struct sr_handle h = {.handle = handle};
	return sr_simple(c, op, &h, sizeof(h), NULL, 0);
}

// fetch asks the daemon for the channel's queued events (under ch->mu).
static int fetch(struct cma_channel *ch)
{
	struct sr_conn *c = cma_conn();
	if (!c)
		return -1;
	for (;;) {
		struct sr_cm_get_events_req req = {.channel = ch->handle, .max = 64};
		size_t cap = sizeof(struct sr_cm_events_resp) + 64 * sizeof(struct sr_cm_event);
		char *buf = malloc(cap);
		if (!buf)
			return sr_fail(ENOMEM);
		struct sr_call call = {.op = SR_OP_CM_GET_EVENTS, .req = &req, .reqlen = sizeof(req),
				       .resp = buf, .respcap = cap};
		if (sr_call(c, &call) < 0) {
			free(buf);
			return -1;
		}
		struct sr_cm_events_resp r;
		memcpy(&r, buf, sizeof(r));
		if (call.resplen < sizeof(r) || r.count > 64 ||
		    call.resplen < sizeof(r) + r.count * sizeof(struct sr_cm_event)) {
			free(buf);
			return sr_fail(EPROTO);
		}
		if (r.count) {
			struct sr_cm_event *q = realloc(ch->queue, (ch->n + r.count) * sizeof(*q));
			if (!q) {
				free(buf);
				return sr_fail(ENOMEM);
			}
			ch->queue = q;
			memcpy(&q[ch->n], buf + sizeof(r), r.count * sizeof(*q));
			ch->n += r.count;
		}
		free(buf);
		if (!r.more)
			return 0;
	}
}

// drain reads the channel eventfd's counter if it is readable.
static void drain(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	uint64_t v;
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN) && read(fd, &v, sizeof(v)) < 0) {
		// another thread took it
	}
}

// blocked is where a thread waiting on a destroyed channel stays (rdma_destroy_event_channel):
// a cancellation point, as the kernel's wait is.
static void blocked(void)
{
	for (;;)
		pause();
}

// cma_next takes the channel's next event into *out (blocking unless the
// program made the fd non-blocking).
int cma_next(struct cma_channel *ch, struct sr_cm_event *out)
{
	pthread_mutex_lock(&ch->mu);
	ch->users++;
	for (;;) {
		if (ch->closed) {
			pthread_mutex_unlock(&ch->mu);
			blocked();
		}
		drain(ch->ch.fd);
		if (ch->n == 0 && fetch(ch) < 0) {
			int e = errno;
			if (ch->closed) // destroyed meanwhile: the daemon no longer knows it
				continue;
			ch->users--;
			pthread_mutex_unlock(&ch->mu);
			errno = e;
			return -1;
		}
		if (ch->n > 0) {
			*out = ch->queue[0];
			ch->n--;
			memmove(&ch->queue[0], &ch->queue[1], ch->n * sizeof(ch->queue[0]));
			if (ch->n > 0) { // keep the fd readable while events wait
				uint64_t v = 1;
				if (write(ch->ch.fd, &v, sizeof(v)) < 0) {
					// saturated: it stays readable
				}
			}
			ch->users--;
			pthread_mutex_unlock(&ch->mu);
			return 0;
		}
		pthread_mutex_unlock(&ch->mu);
		int fl = fcntl(ch->ch.fd, F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK)) {
			pthread_mutex_lock(&ch->mu);
			int gone = --ch->users == 0 && ch->closed;
			pthread_mutex_unlock(&ch->mu);
			if (gone) // destroyed while this call ran: the last one out frees it
				chan_free(ch);
			return sr_fail(EAGAIN);
		}
		struct pollfd p = {.fd = ch->ch.fd, .events = POLLIN};
		int r = poll(&p, 1, -1);
		int e = errno;
		pthread_mutex_lock(&ch->mu);
		if (r < 0 && e != EINTR && !ch->closed) {
			ch->users--;
			pthread_mutex_unlock(&ch->mu);
			errno = e;
			return -1;
		}
	}
}
