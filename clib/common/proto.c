// The daemon protocol (docs/daemon-protocol.md): message encoding and the
// session's requests.
#include <errno.h>

#include "sr.h"

int sr_hello(struct sr_conn *c, struct sr_devinfo *info)
{
	(void)c;
	(void)info;
	// The language-neutral protocol is not spoken by the daemon yet.
	return sr_fail(EPROTONOSUPPORT);
}
