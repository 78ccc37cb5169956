/*
 * test_deadline.c: client/base/deadline.c, a time some milliseconds after
 * another: the nanoseconds carried into the seconds at and past a second,
 * the largest nanoseconds, a sum past the largest time_t held there (not
 * wrapped into the past), an unsigned count of milliseconds that a negative
 * number would become is the far future, and deadline_in_ms on the clocks
 * the closer, the warm pool and wcachectl convert wait on.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "base/deadline.h"

static const time_t time_max =
	(time_t)(((uint64_t)1 << (sizeof(time_t) * CHAR_BIT - 1)) - 1);

/* Asserts that deadline_add_ms({sec, ns}, ms) is {want_sec, want_ns}. */
static void
check_sum(time_t sec, long ns, uint64_t ms, time_t want_sec, long want_ns)
{
	struct timespec t = { .tv_sec = sec, .tv_nsec = ns };
	struct timespec d = deadline_add_ms(t, ms);

	assert_true(d.tv_sec == want_sec);
	assert_int_equal(d.tv_nsec, want_ns);
}

static void
test_carry(void **state)
{
	(void)state;
	check_sum(5, 7, 0, 5, 7);
	check_sum(5, 100, 250, 5, 250000100);
	/* Exactly a second of nanoseconds is a second. */
	check_sum(5, 0, 1000, 6, 0);
	check_sum(5, 999000000, 1, 6, 0);
	check_sum(5, 999999999, 1, 6, 999999);
	/* The largest of both parts: 999999999 + 999000000 ns. */
	check_sum(5, 999999999, 999, 6, 998999999);
	check_sum(5, 900000000, 250, 6, 150000000);
	/* Whole seconds and a carry together. */
	check_sum(5, 800000000, 12345, 18, 145000000);
	check_sum(0, 0, 86400000, 86400, 0);
}

static void
test_overflow(void **state)
{
	(void)state;
	/* Up to the largest time_t, and no further. */
	check_sum(time_max - 2, 500000000, 1500, time_max, 0);
	check_sum(time_max - 1, 500000000, 499, time_max - 1, 999000000);
	check_sum(time_max - 1, 500000000, 1500, time_max, 999999999);
	check_sum(time_max, 999999999, 1, time_max, 999999999);
	check_sum(time_max, 0, UINT64_MAX, time_max, 999999999);
}

/* A negative count cannot be given: converted, it is the far future, after
 * t, never a time before it. */
static void
test_never_before(void **state)
{
	struct timespec t = { .tv_sec = 1000, .tv_nsec = 999999999 };
	struct timespec d;
	int minus_one = -1;

	(void)state;
	d = deadline_add_ms(t, (uint64_t)minus_one);
	if (sizeof(time_t) >= sizeof(uint64_t)) {
		/* 2^64 - 1 ms: 18446744073709551 s and 615 ms, plus t's 999999999 ns. */
		assert_true(d.tv_sec == 1000 + (time_t)(UINT64_MAX / 1000u) + 1);
		assert_int_equal(d.tv_nsec, 614999999);
	} else {
		assert_true(d.tv_sec == time_max);
		assert_int_equal(d.tv_nsec, 999999999);
	}
}

/* deadline_in_ms lies ms after a reading of clock taken around it. */
static void
check_in_ms(clockid_t clock, uint64_t ms)
{
	struct timespec before, after, d, lo, hi;

	assert_int_equal(clock_gettime(clock, &before), 0);
	d = deadline_in_ms(clock, ms);
	assert_int_equal(clock_gettime(clock, &after), 0);
	lo = deadline_add_ms(before, ms);
	hi = deadline_add_ms(after, ms);
	assert_true(d.tv_sec > lo.tv_sec || (d.tv_sec == lo.tv_sec && d.tv_nsec >= lo.tv_nsec));
	assert_true(d.tv_sec < hi.tv_sec || (d.tv_sec == hi.tv_sec && d.tv_nsec <= hi.tv_nsec));
	assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
}

static void
test_in_ms(void **state)
{
	(void)state;
	check_in_ms(CLOCK_MONOTONIC, 0);
	check_in_ms(CLOCK_MONOTONIC, 100);
	check_in_ms(CLOCK_REALTIME, 250);
	check_in_ms(CLOCK_REALTIME, 60000);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_carry),
		cmocka_unit_test(test_overflow),
		cmocka_unit_test(test_never_before),
		cmocka_unit_test(test_in_ms),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
