/*
 * deadline.h: a time some milliseconds after another, as
 * pthread_cond_timedwait(3) and its kin take a deadline. The daemon's
 * closer and warm pool and wcachectl convert's progress line wait for one:
 * one definition of the carry of nanoseconds into seconds, so that none of
 * them writes it again.
 */
#ifndef WC_DEADLINE_H
#define WC_DEADLINE_H

#include <stdint.h>
#include <time.h>

/*
 * t plus ms milliseconds, its nanoseconds carried into the seconds, so that
 * tv_nsec of the result lies in [0, 999999999] as it must for a timed wait.
 * t's own tv_nsec must lie there too, as clock_gettime(2) gives it. ms is
 * unsigned: a deadline is never in the past of t. A sum past the largest
 * time_t is that largest time with 999999999 nanoseconds (a wait without
 * end), never a time that wrapped into the past.
 */
struct timespec deadline_add_ms(struct timespec t, uint64_t ms);

/* The time ms milliseconds from now on clock (clock_gettime(2)'s clock:
 * that of the condition variable or call that waits for it). */
struct timespec deadline_in_ms(clockid_t clock, uint64_t ms);

#endif
