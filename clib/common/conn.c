// The connection to the softroce daemon: a unix SOCK_SEQPACKET socket, the
// one the Go client (pkg/client) uses too.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sr.h"

const char *sr_socket_path(void)
{
	const char *p = getenv(SR_SOCKET_ENV);
	if (p && *p)
		return p;
	return SR_DEFAULT_SOCKET;
}

int sr_conn_open(struct sr_conn *c, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(path);
	if (n >= sizeof(sa.sun_path))
		return sr_fail(ENAMETOOLONG);
	memcpy(sa.sun_path, path, n + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return sr_fail(e);
	}
	c->rbuf = malloc(SR_MAX_MSG);
	if (!c->rbuf) {
		close(fd);
		return sr_fail(ENOMEM);
	}
	c->fd = fd;
	pthread_mutex_init(&c->mu, NULL);
	return 0;
}

void sr_conn_close(struct sr_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	free(c->rbuf);
	c->rbuf = NULL;
	pthread_mutex_destroy(&c->mu);
}
