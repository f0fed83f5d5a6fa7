// Zero-copy registration of a program's own memory (docs/clib.md,
// "Registered memory").
//
// The daemon reaches registered memory in one of two ways: through the
// program's /proc/self/mem (SR_MR_PROCESS: a system call per access, two
// copies per byte in the kernel), or by mapping a memfd the program shares
// with it (SR_MR_MEMFD: the engine reads and writes the pages themselves).
// Go programs register memfd buffers; C programs register the memory they
// have: malloc, stack, static and mmap memory, private to the process. A
// registration of whole pages of private anonymous memory is moved onto a
// memfd here: its pages are copied into a new sealed memfd, which is mapped
// MAP_SHARED|MAP_FIXED over them (the same address, contents and
// protection), and the memfd is what the daemon maps (the library closes its
// own descriptor once the daemon has it). When the registration goes
// (ibv_dereg_mr, or a rereg to other memory) the range moves back onto
// private anonymous memory, and in a child after fork() every moved range
// does (pthread_atfork): after deregistration, and in a child, the program
// has private memory as before, and a child never shares pages with its
// parent (with rdma-core the child gets a copy of registered pages too).
//
// Anything else (a range that overlaps a moved one included), or any step
// that fails, leaves the memory as it is and the registration takes the
// copied path. SOFTROCE_ZERO_COPY=0 turns moving off. What it cannot keep
// (docs/clib.md): a write that another thread makes to the range while
// ibv_reg_mr or ibv_dereg_mr copies it can be lost. The move is never done
// to a range that is not exactly the registered pages, nor in a process
// that holds locked memory (mlock: the new mapping would not be locked), nor
// once the process uses half its mapping budget (vm.max_map_count: a move
// can split a mapping in three, and the program's own mmaps come first).
//
// Nothing here allocates or calls into stdio between fork() and the child's
// handler's end: /proc/self/maps is read with read(2) into fixed buffers.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sr.h"

#define SR_ZC_NAME "softroce-mr"

struct sr_zc {
	uintptr_t start, end; // the moved pages
	int fd;               // the memfd, sealed, until the daemon has it; then -1
	uint64_t ino;         // its inode, to tell its mappings in /proc/self/maps
	struct sr_zc *next;
};

static pthread_mutex_t zc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sr_zc *zcs;
static pthread_once_t zc_once = PTHREAD_ONCE_INIT;
static int zc_on;
static long zc_max_maps;
static uintptr_t zc_page;

// ---------------------------------------------------------------- /proc/self/maps

struct maps_ent {
	uintptr_t start, end;
	char perms[5];
	uint64_t ino;
	const char *path; // "" for anonymous memory
};

// A line reader over a file with read(2): no allocation.
struct lines {
	int fd;
	char buf[4096];
	size_t off, len;
	char line[4352];
};

static int lines_open(struct lines *l, const char *path)
{
	l->fd = open(path, O_RDONLY | O_CLOEXEC);
	l->off = l->len = 0;
	return l->fd < 0 ? -1 : 0;
}

// lines_next: the next line (without its newline) in l->line, truncated to
// its buffer; 0 at the end, -1 on a read error.
static int lines_next(struct lines *l)
{
	size_t n = 0;
	int any = 0;
	for (;;) {
		if (l->off == l->len) {
			ssize_t r = read(l->fd, l->buf, sizeof(l->buf));
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return -1;
			if (r == 0) {
				l->line[n] = 0;
				return any;
			}
			l->off = 0;
			l->len = (size_t)r;
		}
		char c = l->buf[l->off++];
		any = 1;
		if (c == '\n') {
			l->line[n] = 0;
			return 1;
		}
		if (n < sizeof(l->line) - 1)
			l->line[n++] = c;
	}
}

static uint64_t hex(const char **p)
{
	uint64_t v = 0;
	for (;; (*p)++) {
		char c = **p;
		if (c >= '0' && c <= '9')
			v = v << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v << 4 | (uint64_t)(c - 'a' + 10);
		else
			return v;
	}
}

static void skip(const char **p, char c)
{
	while (**p && **p != c)
		(*p)++;
	while (**p == c)
		(*p)++;
}

// parse_maps_line: "start-end perms offset dev inode   path".
static int parse_maps_line(const char *s, struct maps_ent *e)
{
	e->start = (uintptr_t)hex(&s);
	if (*s++ != '-')
		return -1;
	e->end = (uintptr_t)hex(&s);
	if (*s++ != ' ' || strlen(s) < 5)
		return -1;
	memcpy(e->perms, s, 4);
	e->perms[4] = 0;
	s += 4;
	skip(&s, ' '); // offset
	skip(&s, ' ');
	skip(&s, ' '); // dev
	e->ino = 0;
	while (*s >= '0' && *s <= '9')
		e->ino = e->ino * 10 + (uint64_t)(*s++ - '0');
	while (*s == ' ')
		s++;
	e->path = s;
	return 0;
}

// ---------------------------------------------------------------- setup

static long read_long(const char *path)
{
	struct lines l;
	if (lines_open(&l, path) < 0)
		return -1;
	long v = lines_next(&l) > 0 ? strtol(l.line, NULL, 10) : -1;
	close(l.fd);
	return v;
}

// locked_memory: the process holds mlock'd memory (VmLck in /proc/self/status),
// or that cannot be told.
static int locked_memory(void)
{
	struct lines l;
	if (lines_open(&l, "/proc/self/status") < 0)
		return 1;
	int locked = 1;
	while (lines_next(&l) > 0) {
		if (!strncmp(l.line, "VmLck:", 6)) {
			locked = strtol(l.line + 6, NULL, 10) != 0;
			break;
		}
	}
	close(l.fd);
	return locked;
}

static void zc_prepare(void);
static void zc_parent(void);
static void zc_child(void);

static void zc_init(void)
{
	const char *v = getenv("SOFTROCE_ZERO_COPY");
	zc_on = !(v && !strcmp(v, "0"));
	zc_max_maps = read_long("/proc/sys/vm/max_map_count");
	long pg = sysconf(_SC_PAGESIZE);
	zc_page = pg > 0 ? (uintptr_t)pg : 4096;
	if (zc_max_maps <= 0)
		zc_on = 0;
	pthread_atfork(zc_prepare, zc_parent, zc_child);
}

// ---------------------------------------------------------------- moving

// movable: [s, e) lies wholly in private anonymous read-write mappings
// (the heap or unnamed mmap memory: not a file, a stack, hugetlbfs or a
// shared mapping), and the process has room for the mappings a move adds.
static int movable(uintptr_t s, uintptr_t e)
{
	struct lines l;
	if (lines_open(&l, "/proc/self/maps") < 0)
		return 0;
	uintptr_t c = s;
	long count = 0;
	int ok = 1;
	struct maps_ent m;
	while (lines_next(&l) > 0) {
		count++;
		if (c >= e || parse_maps_line(l.line, &m) < 0 || m.end <= c)
			continue;
		if (m.start > c || strcmp(m.perms, "rw-p") || m.ino != 0 ||
		    (m.path[0] && strcmp(m.path, "[heap]")))
			ok = 0;
		c = m.end < e ? m.end : e;
		if (!ok)
			c = e;
	}
	close(l.fd);
	// Replacing the middle of a mapping splits it in three.
	return ok && c >= e && count < zc_max_maps / 2;
}

// zc_move moves [s, e) onto a new sealed memfd; NULL (memory unchanged) if
// any step fails.
static struct sr_zc *zc_move(uintptr_t s, uintptr_t e)
{
	size_t len = e - s;
	struct sr_zc *z = calloc(1, sizeof(*z));
	if (!z)
		return NULL;
	int fd = memfd_create(SR_ZC_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	struct stat st;
	if (fd < 0)
		goto fail;
	if (ftruncate(fd, (off_t)len) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 || fstat(fd, &st) < 0)
		goto fail;
	void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (tmp == MAP_FAILED)
		goto fail;
	// The copy writes every page of the memfd: the range has no hole, as the
	// daemon wants it (pages the program never touched read as zeros, and
	// become the program's memory, as ibv_reg_mr pins them on an RNIC).
	memcpy(tmp, (void *)s, len);
	if (mmap((void *)s, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		// A kernel that unmapped the range before failing: put the copy there.
		if (msync((void *)s, len, MS_ASYNC) < 0 && errno == ENOMEM)
			mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)s);
		else
			munmap(tmp, len);
		goto fail;
	}
	munmap(tmp, len);
	z->start = s;
	z->end = e;
	z->fd = fd;
	z->ino = (uint64_t)st.st_ino;
	return z;
fail:
	if (fd >= 0)
		close(fd);
	free(z);
	return NULL;
}

// ours_first finds the first mapping of z's memfd in [z->start, z->end).
static int ours_first(const struct sr_zc *z, struct maps_ent *out)
{
	struct lines l;
	if (lines_open(&l, "/proc/self/maps") < 0)
		return 0;
	int found = 0;
	struct maps_ent m;
	while (!found && lines_next(&l) > 0) {
		if (parse_maps_line(l.line, &m) < 0 || m.end <= z->start || m.start >= z->end)
			continue;
		if (m.ino == z->ino && m.perms[3] == 's' && m.perms[0] == 'r' &&
		    !strncmp(m.path, "/memfd:" SR_ZC_NAME, sizeof("/memfd:" SR_ZC_NAME) - 1)) {
			*out = m;
			found = 1;
		}
	}
	close(l.fd);
	return found;
}

// zc_unmove moves what is still z's in its range back onto private
// anonymous memory (the program may have unmapped or remapped parts of it:
// those stay as they are), then closes the memfd.
static void zc_unmove(struct sr_zc *z)
{
	struct maps_ent m;
	// Each pass turns one mapping of the memfd back; one that cannot be is
	// left shared, and the walk stops (a bound: no endless retry).
	for (int i = 0; i < 64 && ours_first(z, &m); i++) {
		uintptr_t a = m.start > z->start ? m.start : z->start;
		uintptr_t b = m.end < z->end ? m.end : z->end;
		size_t len = b - a;
		void *n = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (n == MAP_FAILED)
			break;
		memcpy(n, (void *)a, len);
		int prot = PROT_READ | (m.perms[1] == 'w' ? PROT_WRITE : 0) | (m.perms[2] == 'x' ? PROT_EXEC : 0);
		if ((prot != (PROT_READ | PROT_WRITE) && mprotect(n, len, prot) < 0) ||
		    mremap(n, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a) == MAP_FAILED) {
			munmap(n, len);
			break;
		}
	}
	if (z->fd >= 0)
		close(z->fd);
	z->fd = -1;
}

// ---------------------------------------------------------------- fork

static void zc_prepare(void)
{
	pthread_mutex_lock(&zc_mu);
}

static void zc_parent(void)
{
	pthread_mutex_unlock(&zc_mu);
}

// zc_child: the child inherited the moved ranges as shared mappings of the
// parent's memfds; each becomes private memory of the child's own.
static void zc_child(void)
{
	struct sr_zc *z = zcs;
	zcs = NULL;
	while (z) {
		struct sr_zc *next = z->next;
		zc_unmove(z);
		free(z);
		z = next;
	}
	pthread_mutex_unlock(&zc_mu);
}

// ---------------------------------------------------------------- registrations

int sr_zc_get(void *addr, size_t length, struct sr_zc **zp)
{
	*zp = NULL;
	pthread_once(&zc_once, zc_init);
	uintptr_t s = (uintptr_t)addr, e = s + length;
	if (!zc_on || !length || e < s || (s | length) & (zc_page - 1))
		return -1;
	pthread_mutex_lock(&zc_mu);
	struct sr_zc *z;
	for (z = zcs; z; z = z->next)
		if (s < z->end && e > z->start)
			break;
	if (z) {
		z = NULL; // overlaps a moved range: copied memory (the pages are the memfd's)
	} else if (!locked_memory() && movable(s, e) && (z = zc_move(s, e))) {
		z->next = zcs;
		zcs = z;
	}
	pthread_mutex_unlock(&zc_mu);
	if (!z)
		return -1;
	*zp = z;
	return z->fd;
}

void sr_zc_registered(struct sr_zc *z)
{
	pthread_mutex_lock(&zc_mu);
	if (z->fd >= 0)
		close(z->fd);
	z->fd = -1;
	pthread_mutex_unlock(&zc_mu);
}

void sr_zc_put(struct sr_zc *z)
{
	if (!z)
		return;
	pthread_mutex_lock(&zc_mu);
	for (struct sr_zc **p = &zcs; *p; p = &(*p)->next) {
		if (*p == z) {
			*p = z->next;
			break;
		}
	}
	zc_unmove(z);
	free(z);
	pthread_mutex_unlock(&zc_mu);
}
