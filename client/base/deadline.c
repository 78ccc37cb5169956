/*
 * deadline.c: a time some milliseconds after another (see deadline.h).
 */
#include <limits.h>

#include "base/deadline.h"

#define NS_PER_MS 1000000L
#define NS_PER_S 1000000000L

/* The largest time_t (a signed type on every system wcache builds on). */
static const time_t time_max =
	(time_t)(((uint64_t)1 << (sizeof(time_t) * CHAR_BIT - 1)) - 1);

struct timespec
deadline_add_ms(struct timespec t, uint64_t ms)
{
	/* At most 999999999 + 999000000: within a long of 32 bits too. */
	long ns = t.tv_nsec + (long)(ms % 1000u) * NS_PER_MS;
	uint64_t seconds = ms / 1000u;
	struct timespec out;

	if (ns >= NS_PER_S) {
		ns -= NS_PER_S;
		seconds++;
	}
	if (__builtin_add_overflow(t.tv_sec, seconds, &out.tv_sec))
		return (struct timespec){ .tv_sec = time_max, .tv_nsec = NS_PER_S - 1 };
	out.tv_nsec = ns;
	return out;
}

struct timespec
deadline_in_ms(clockid_t clock, uint64_t ms)
{
	struct timespec now;

	clock_gettime(clock, &now);
	return deadline_add_ms(now, ms);
}
