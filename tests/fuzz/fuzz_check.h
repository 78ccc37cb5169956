/*
 * fuzz_check.h: the CHECK() of the fuzz harnesses that include it. A
 * property that does not hold aborts, so that libFuzzer reports and keeps
 * the input; unlike assert() it stays in NDEBUG builds, and it says which
 * check failed.
 */
#ifndef WC_FUZZ_CHECK_H
#define WC_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                                  \
			abort();                                                         \
		}                                                                        \
	} while (0)

#endif /* WC_FUZZ_CHECK_H */
