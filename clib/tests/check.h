// A minimal test harness for the C tests: CHECK records a failure and goes
// on; check_done prints "N passed, N failed" and returns the exit status.
#ifndef SOFTROCE_CLIB_CHECK_H
#define SOFTROCE_CLIB_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (cond) {                                                      \
			check_passed++;                                          \
		} else {                                                         \
			check_failed++;                                          \
			fprintf(stderr, "%s:%d: FAIL %s\n", __FILE__, __LINE__, #cond); \
		}                                                                \
	} while (0)

static inline int check_done(const char *name)
{
	printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
	return check_failed ? 1 : 0;
}

#endif
