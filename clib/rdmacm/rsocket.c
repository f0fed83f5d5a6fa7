// rsockets (rdma/rsocket.h): the socket API over RDMA that librdmacm
// carries. softroce does not implement it: every call fails with ENOSYS,
// so a program (or the rsocket preload library) sees a clear error.
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <rdma/rsocket.h>

#include "sr.h"

#define NOSYS(type, name, args, unused) \
	type name args                  \
	{                               \
		unused;                 \
		errno = ENOSYS;         \
		return -1;              \
	}

NOSYS(int, rsocket, (int domain, int type, int protocol), ((void)domain, (void)type, (void)protocol))
NOSYS(int, rbind, (int s, const struct sockaddr *a, socklen_t l), ((void)s, (void)a, (void)l))
NOSYS(int, rlisten, (int s, int backlog), ((void)s, (void)backlog))
NOSYS(int, raccept, (int s, struct sockaddr *a, socklen_t *l), ((void)s, (void)a, (void)l))
NOSYS(int, rconnect, (int s, const struct sockaddr *a, socklen_t l), ((void)s, (void)a, (void)l))
NOSYS(int, rshutdown, (int s, int how), ((void)s, (void)how))
NOSYS(int, rclose, (int s), ((void)s))
NOSYS(ssize_t, rrecv, (int s, void *b, size_t n, int f), ((void)s, (void)b, (void)n, (void)f))
NOSYS(ssize_t, rrecvfrom, (int s, void *b, size_t n, int f, struct sockaddr *a, socklen_t *l),
      ((void)s, (void)b, (void)n, (void)f, (void)a, (void)l))
NOSYS(ssize_t, rrecvmsg, (int s, struct msghdr *m, int f), ((void)s, (void)m, (void)f))
NOSYS(ssize_t, rsend, (int s, const void *b, size_t n, int f), ((void)s, (void)b, (void)n, (void)f))
NOSYS(ssize_t, rsendto, (int s, const void *b, size_t n, int f, const struct sockaddr *a, socklen_t l),
      ((void)s, (void)b, (void)n, (void)f, (void)a, (void)l))
NOSYS(ssize_t, rsendmsg, (int s, const struct msghdr *m, int f), ((void)s, (void)m, (void)f))
NOSYS(ssize_t, rread, (int s, void *b, size_t n), ((void)s, (void)b, (void)n))
NOSYS(ssize_t, rreadv, (int s, const struct iovec *v, int n), ((void)s, (void)v, (void)n))
NOSYS(ssize_t, rwrite, (int s, const void *b, size_t n), ((void)s, (void)b, (void)n))
NOSYS(ssize_t, rwritev, (int s, const struct iovec *v, int n), ((void)s, (void)v, (void)n))
NOSYS(int, rpoll, (struct pollfd *fds, nfds_t n, int t), ((void)fds, (void)n, (void)t))
NOSYS(int, rselect, (int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t),
      ((void)n, (void)r, (void)w, (void)e, (void)t))
NOSYS(int, rgetpeername, (int s, struct sockaddr *a, socklen_t *l), ((void)s, (void)a, (void)l))
NOSYS(int, rgetsockname, (int s, struct sockaddr *a, socklen_t *l), ((void)s, (void)a, (void)l))
NOSYS(int, rsetsockopt, (int s, int lv, int o, const void *v, socklen_t l),
      ((void)s, (void)lv, (void)o, (void)v, (void)l))
NOSYS(int, rgetsockopt, (int s, int lv, int o, void *v, socklen_t *l),
      ((void)s, (void)lv, (void)o, (void)v, (void)l))
NOSYS(off_t, riomap, (int s, void *b, size_t n, int p, int f, off_t o),
      ((void)s, (void)b, (void)n, (void)p, (void)f, (void)o))
NOSYS(int, riounmap, (int s, void *b, size_t n), ((void)s, (void)b, (void)n))

int rfcntl(int s, int cmd, ...)
{
	(void)s;
	(void)cmd;
	errno = ENOSYS;
	return -1;
}

size_t riowrite(int s, const void *b, size_t n, off_t o, int f)
{
	(void)s;
	(void)b;
	(void)n;
	(void)o;
	(void)f;
	errno = ENOSYS;
	return 0;
}
