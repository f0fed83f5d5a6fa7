// Zero-copy registration of a program's own memory (docs/clib.md,
// "Registered memory").
//
// The daemon reaches registered memory in one of two ways: through the
// program's /proc/self/mem (SR_MR_PROCESS: a system call per access, two
// copies per byte in the kernel), or by mapping a memfd the program shares
// with it (SR_MR_MEMFD: the engine reads and writes the pages themselves).
// Go programs register memfd buffers; C programs register the memory they
// have: malloc, stack, static and mmap memory, private to the process. A
// registration of whole pages of plain private anonymous memory is moved onto
// a memfd here: its pages are copied into a new sealed memfd, which is mapped
// MAP_SHARED|MAP_FIXED over them (the same address, contents and protection),
// and the memfd is what the daemon maps (the library closes its own
// descriptor once the daemon has it). When the registration goes
// (ibv_dereg_mr, or a rereg to other memory) the range moves back onto
// private anonymous memory, and in a child after fork() every moved range
// does (pthread_atfork): after deregistration, and in a child, the program
// has private memory as before, and a child never shares pages with its
// parent (with rdma-core the child gets a copy of registered pages too).
//
// Every registration's range is recorded here, moved or copied, so that no
// page moves while the daemon may write it through another registration: a
// range overlapping any recorded one is copied memory, and a moved range
// whose registration went moves back only once no copied registration
// overlaps it. Anything that does not qualify, or a step that fails, leaves
// the memory as it is and the registration takes the copied path.
// SOFTROCE_ZERO_COPY=0 turns moving off. What it cannot keep
// (docs/clib.md): a write that another thread of the program makes to the
// range while ibv_reg_mr or ibv_dereg_mr copies it can be lost.
//
// The child's fork handler calls nothing that allocates or takes a lock
// (free aside, which glibc allows there): /proc/self/maps is read with
// read(2) into fixed buffers.
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

// sr_zc is the range of one registration: moved pages, or a copied
// registration's bytes.
struct sr_zc {
	uintptr_t start, end;
	int moved;    // the pages are on the memfd (ino)
	int live;     // its registration exists (a moved range may outlive it: see sr_zc_put)
	int fd;       // a moved range's memfd until the daemon has it; then -1
	uint64_t ino; // a moved range's memfd's inode, to tell its mappings in /proc/self/maps
	struct sr_zc *next;
};

static pthread_mutex_t zc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sr_zc *zcs; // every range, under zc_mu
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

// held_memory: the process holds locked (mlock) or pinned (io_uring fixed
// buffers, VFIO, ...) memory, by VmLck and VmPin in /proc/self/status, or
// that cannot be told. A moved page would be neither: the new mapping is
// not locked, and a pinned page's device would go on using the old page.
static int held_memory(void)
{
	struct lines l;
	if (lines_open(&l, "/proc/self/status") < 0)
		return 1;
	int held = 0, seen = 0;
	while (lines_next(&l) > 0) {
		if (!strncmp(l.line, "VmLck:", 6) || !strncmp(l.line, "VmPin:", 6)) {
			seen++;
			held |= strtol(l.line + 6, NULL, 10) != 0;
		}
	}
	close(l.fd);
	return held || seen != 2;
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
}

// The fork handlers are registered when the library loads, before any the
// program registers. Prepare handlers run in the reverse order, so a fork
// takes the program's locks before zc_mu, and a thread holding zc_mu (a
// registration) never waits for a program's lock: no deadlock between
// them.
__attribute__((constructor)) static void zc_register_fork_handlers(void)
{
	pthread_atfork(zc_prepare, zc_parent, zc_child);
}

// ---------------------------------------------------------------- moving

// plain_flags: a mapping's VmFlags (/proc/self/smaps) are those of plain
// read-write anonymous memory and nothing else: readable and writable (rd,
// wr, mr, mw, me), accountable (ac), soft-dirty (sd). Any other flag is
// something a move onto a memfd, or back onto fresh anonymous memory,
// would lose or break (mlock, MADV_DONTFORK, WIPEONFORK, DONTDUMP,
// HUGEPAGE, userfaultfd, grows-down, memory tagging, sealing, ...), or one
// this library does not know; such memory stays where it is.
static int plain_flags(const char *f)
{
	static const char *const plain[] = {"rd", "wr", "mr", "mw", "me", "ac", "sd"};
	int rd = 0, wr = 0;
	for (;;) {
		while (*f == ' ')
			f++;
		if (!*f)
			break;
		if (!f[1] || (f[2] && f[2] != ' '))
			return 0; // not a two-letter flag
		int known = 0;
		for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
			known |= !strncmp(f, plain[i], 2);
		if (!known)
			return 0;
		rd |= !strncmp(f, "rd", 2);
		wr |= !strncmp(f, "wr", 2);
		f += 2;
	}
	return rd && wr;
}

// movable: [s, e) lies wholly in plain private anonymous read-write
// mappings (the heap or unnamed mmap memory: not a file, a stack, hugetlbfs
// or a shared mapping; no protection key; plain_flags), and the process
// uses less than half its mapping budget (a move can split a mapping in
// three; the program's own mmaps come first). Read from /proc/self/smaps.
static int movable(uintptr_t s, uintptr_t e)
{
	struct lines l;
	if (lines_open(&l, "/proc/self/smaps") < 0)
		return 0;
	uintptr_t c = s;
	long count = 0;
	int ok = 1, in = 0, flags_seen = 0;
	struct maps_ent m;
	while (lines_next(&l) > 0) {
		char ch = l.line[0];
		if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')) {
			// A mapping's first line: check the previous one's fields, then this one.
			count++;
			if (in && !flags_seen)
				ok = 0;
			in = flags_seen = 0;
			if (c >= e || parse_maps_line(l.line, &m) < 0 || m.end <= c)
				continue;
			if (m.start > c || strcmp(m.perms, "rw-p") || m.ino != 0 ||
			    (m.path[0] && strcmp(m.path, "[heap]")))
				ok = 0;
			in = 1;
			c = m.end < e ? m.end : e;
		} else if (in && !strncmp(l.line, "ProtectionKey:", 14)) {
			ok &= strtol(l.line + 14, NULL, 10) == 0;
		} else if (in && !strncmp(l.line, "VmFlags:", 8)) {
			flags_seen = 1;
			ok &= plain_flags(l.line + 8);
		}
	}
	close(l.fd);
	if (in && !flags_seen)
		ok = 0;
	return ok && c >= e && count < zc_max_maps / 2;
}

// is_hole: nothing is mapped at [a, a+len) any more (msync's ENOMEM).
static int is_hole(uintptr_t a, size_t len)
{
	return msync((void *)a, len, MS_ASYNC) < 0 && errno == ENOMEM;
}

// put_back puts the copy at n (len bytes, protection prot) at a, where a
// failed MAP_FIXED or mremap may have left a hole: mremap, else a fresh
// private mapping and a copy. 0: a holds the copy and n is gone.
static int put_back(void *n, uintptr_t a, size_t len, int prot)
{
	if (mremap(n, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a) != MAP_FAILED)
		return 0;
	if (mmap((void *)a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
	    MAP_FAILED)
		return -1; // the copy stays at n: lost to the program, but not freed
	memcpy((void *)a, n, len);
	munmap(n, len);
	if (prot != (PROT_READ | PROT_WRITE))
		mprotect((void *)a, len, prot);
	return 0;
}

// zc_move moves [s, e) onto a new sealed memfd (z's fields set); -1 (the
// memory as it was) if a step fails.
static int zc_move(struct sr_zc *z, uintptr_t s, uintptr_t e)
{
	size_t len = e - s;
	int fd = memfd_create(SR_ZC_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	struct stat st;
	if (fd < 0)
		return -1;
	// fallocate: no memory for the pages is a failed step here, not a
	// fault in the copy below.
	if (ftruncate(fd, (off_t)len) < 0 || fallocate(fd, 0, 0, (off_t)len) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 || fstat(fd, &st) < 0) {
		close(fd);
		return -1;
	}
	void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (tmp == MAP_FAILED) {
		close(fd);
		return -1;
	}
	// The copy writes every page of the memfd: the range has no hole, as the
	// daemon wants it (pages the program never touched read as zeros, and
	// become the program's memory, as ibv_reg_mr pins them on an RNIC).
	memcpy(tmp, (void *)s, len);
	if (mmap((void *)s, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
		munmap(tmp, len);
	} else if (!is_hole(s, len)) {
		munmap(tmp, len); // the memory as it was
		close(fd);
		return -1;
	} else if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)s) == MAP_FAILED) {
		// A kernel that unmapped the range before failing, and no room to
		// put the shared copy there: a private one, else the copy stays at
		// tmp rather than dropped.
		if (mmap((void *)s, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
		    MAP_FAILED) {
			memcpy((void *)s, tmp, len);
			munmap(tmp, len);
		}
		close(fd);
		return -1;
	} // else: the shared copy is there, the range moved all the same
	z->start = s;
	z->end = e;
	z->moved = 1;
	z->fd = fd;
	z->ino = (uint64_t)st.st_ino;
	return 0;
}

// ours_first finds the first mapping of z's memfd in [z->start, z->end):
// 1 found, 0 none, -1 /proc/self/maps could not be read (which is never
// taken for "none").
static int ours_first(const struct sr_zc *z, struct maps_ent *out)
{
	struct lines l;
	if (lines_open(&l, "/proc/self/maps") < 0)
		return -1;
	int found = 0, r;
	struct maps_ent m;
	while (!found && (r = lines_next(&l)) != 0) {
		if (r < 0) {
			found = -1;
			break;
		}
		if (parse_maps_line(l.line, &m) < 0 || m.end <= z->start || m.start >= z->end)
			continue;
		if (m.ino == z->ino && m.perms[3] == 's' &&
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
// those stay as they are) and closes the memfd if still open. 0: nothing of
// the memfd is left mapped there; -1: some is (unreadable, or a step failed).
static int zc_unmove(struct sr_zc *z)
{
	if (z->fd >= 0)
		close(z->fd);
	z->fd = -1;
	struct maps_ent m;
	// Each pass turns one mapping of the memfd back (bounded: no endless retry).
	for (int i = 0; i < 1024; i++) {
		int r = ours_first(z, &m);
		if (r <= 0)
			return r;
		uintptr_t a = m.start > z->start ? m.start : z->start;
		uintptr_t b = m.end < z->end ? m.end : z->end;
		size_t len = b - a;
		int prot = (m.perms[0] == 'r' ? PROT_READ : 0) | (m.perms[1] == 'w' ? PROT_WRITE : 0) |
			   (m.perms[2] == 'x' ? PROT_EXEC : 0);
		// A part the program made unreadable is read all the same.
		if (!(prot & PROT_READ) && mprotect((void *)a, len, prot | PROT_READ) < 0)
			return -1;
		void *n = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		// The copy's pages first: no memory for them is a failed step, not a
		// fault in memcpy (MADV_POPULATE_WRITE: Linux 5.14; before, not asked).
		if (n != MAP_FAILED && madvise(n, len, MADV_POPULATE_WRITE) < 0 && errno != EINVAL) {
			munmap(n, len);
			n = MAP_FAILED;
		}
		if (n == MAP_FAILED) {
			if (!(prot & PROT_READ))
				mprotect((void *)a, len, prot);
			return -1;
		}
		memcpy(n, (void *)a, len);
		if (prot != (PROT_READ | PROT_WRITE) && mprotect(n, len, prot) < 0) {
			munmap(n, len);
			if (!(prot & PROT_READ))
				mprotect((void *)a, len, prot);
			return -1;
		}
		if (mremap(n, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a) == MAP_FAILED) {
			// Never drop the copy while a may be a hole.
			if (!is_hole(a, len)) {
				munmap(n, len);
				return -1;
			}
			if (put_back(n, a, len, prot) < 0)
				return -1;
		}
	}
	return -1;
}

// seal_off makes what is still z's memfd in its range inaccessible: in a
// child whose move back failed, a fault is better than writing the
// parent's pages. Where /proc/self/maps cannot be read, the whole range.
static void seal_off(struct sr_zc *z)
{
	struct maps_ent m;
	int r = 0;
	for (int i = 0; i < 1024 && (r = ours_first(z, &m)) > 0; i++) {
		uintptr_t a = m.start > z->start ? m.start : z->start;
		uintptr_t b = m.end < z->end ? m.end : z->end;
		if (mmap((void *)a, b - a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
			break;
	}
	if (r < 0)
		mmap((void *)z->start, z->end - z->start, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
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
// parent's memfds; each becomes private memory of the child's own. The
// child's registrations are the parent's (its verbs on them fail), so every
// record goes.
static void zc_child(void)
{
	struct sr_zc *z = zcs;
	zcs = NULL;
	while (z) {
		struct sr_zc *next = z->next;
		if (z->moved && zc_unmove(z) < 0)
			seal_off(z);
		free(z);
		z = next;
	}
	pthread_mutex_unlock(&zc_mu);
}

// ---------------------------------------------------------------- registrations

static int overlaps(const struct sr_zc *z, uintptr_t s, uintptr_t e)
{
	return s < z->end && e > z->start;
}

// copied_over: a live copied registration overlaps z (zc_mu held).
static int copied_over(const struct sr_zc *z)
{
	for (struct sr_zc *c = zcs; c; c = c->next)
		if (!c->moved && c->live && overlaps(c, z->start, z->end))
			return 1;
	return 0;
}

static void unlink_zc(struct sr_zc *z)
{
	for (struct sr_zc **p = &zcs; *p; p = &(*p)->next) {
		if (*p == z) {
			*p = z->next;
			return;
		}
	}
}

// new_range is a live copied range's record for [addr, addr+length).
static struct sr_zc *new_range(void *addr, size_t length)
{
	pthread_once(&zc_once, zc_init);
	struct sr_zc *z = calloc(1, sizeof(*z));
	if (!z)
		return NULL;
	uintptr_t s = (uintptr_t)addr, e = s + length;
	z->start = s;
	z->end = e < s ? UINTPTR_MAX : e;
	z->live = 1;
	z->fd = -1;
	return z;
}

int sr_zc_get(void *addr, size_t length, struct sr_zc **zp)
{
	uintptr_t s = (uintptr_t)addr, e = s + length;
	struct sr_zc *z = *zp = new_range(addr, length);
	if (!z)
		return -1;
	pthread_mutex_lock(&zc_mu);
	int any = 0;
	for (struct sr_zc *o = zcs; o && !any; o = o->next)
		any = overlaps(o, z->start, z->end);
	if (zc_on && !any && length && e > s && !((s | length) & (zc_page - 1)) && !held_memory() &&
	    movable(s, e))
		zc_move(z, s, e); // on failure z stays a copied range
	z->next = zcs;
	zcs = z;
	pthread_mutex_unlock(&zc_mu);
	return z->moved ? z->fd : -1;
}

struct sr_zc *sr_zc_track(void *addr, size_t length)
{
	struct sr_zc *z = new_range(addr, length);
	if (!z)
		return NULL;
	pthread_mutex_lock(&zc_mu);
	z->next = zcs;
	zcs = z;
	pthread_mutex_unlock(&zc_mu);
	return z;
}

void sr_zc_registered(struct sr_zc *z)
{
	pthread_mutex_lock(&zc_mu);
	if (z->fd >= 0)
		close(z->fd);
	z->fd = -1;
	pthread_mutex_unlock(&zc_mu);
}

// sr_zc_put: z's registration is gone (the daemon no longer reaches it). A
// moved range moves back unless a copied registration overlaps it (the
// daemon may write those bytes through it at any time; the range waits for
// the last such registration); a range whose move back fails stays
// recorded (no new move overlaps it; a child seals it off). A copied
// range's going may let waiting moved ranges move back.
void sr_zc_put(struct sr_zc *z)
{
	if (!z)
		return;
	int saved = errno;
	pthread_mutex_lock(&zc_mu);
	z->live = 0;
	if (!z->moved) {
		unlink_zc(z);
		free(z);
	}
	for (struct sr_zc *w = zcs, *next; w; w = next) {
		next = w->next;
		if (w->moved && !w->live && !copied_over(w) && zc_unmove(w) == 0) {
			unlink_zc(w);
			free(w);
		}
	}
	pthread_mutex_unlock(&zc_mu);
	errno = saved;
}
