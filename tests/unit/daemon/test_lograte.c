/*
 * test_lograte.c: unit tests of daemon/lograte.c, the limit of one warning
 * per uid per minute that the control and client sockets put on what a
 * peer can cause: the first of a uid is logged, the rest of its minute are
 * counted and reported with its next line, and uids beyond the table's
 * room are counted, never logged, until a slot has been quiet a minute;
 * and the burst of a few lines a minute that derived artifacts' lines get.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lograte.h"

static void
test_once_a_minute_per_uid(void **state)
{
	struct lograte lr = { 0 };
	uint64_t unlogged = 99;
	char more[96];

	(void)state;
	assert_true(lograte_allow(&lr, 1000, 5, &unlogged));
	assert_int_equal(unlogged, 0);
	assert_string_equal(lograte_more(more, sizeof(more), unlogged, "warnings"), "");
	for (int i = 0; i < 3; i++)
		assert_false(lograte_allow(&lr, 1000, 6 + (uint64_t)i, &unlogged));
	/* Another uid is not held back by the first. */
	assert_true(lograte_allow(&lr, 1001, 7, &unlogged));
	assert_int_equal(unlogged, 0);
	assert_false(lograte_allow(&lr, 1000, 5 + LOGRATE_WARN_MS - 1, &unlogged));
	assert_true(lograte_allow(&lr, 1000, 5 + LOGRATE_WARN_MS, &unlogged));
	assert_int_equal(unlogged, 4);
	assert_string_equal(lograte_more(more, sizeof(more), unlogged, "warnings"),
		" (4 more warnings not logged since the last warning)");
}

static void
test_uids_beyond_the_table(void **state)
{
	struct lograte lr = { 0 };
	uint64_t unlogged = 0;

	(void)state;
	for (uid_t u = 0; u < LOGRATE_UIDS; u++)
		assert_true(lograte_allow(&lr, 2000 + u, 10, &unlogged));
	/* No room: counted, not logged. */
	assert_false(lograte_allow(&lr, 3000, 20, &unlogged));
	assert_false(lograte_allow(&lr, 3001, 20, &unlogged));
	/* A minute later a quiet slot is taken over, and the line says how
	 * many were not logged. */
	assert_true(lograte_allow(&lr, 3000, 10 + LOGRATE_WARN_MS, &unlogged));
	assert_int_equal(unlogged, 2);
	assert_true(lograte_allow(&lr, 3001, 10 + LOGRATE_WARN_MS, &unlogged));
	assert_int_equal(unlogged, 0);
}

static void
test_a_burst_per_uid_per_minute(void **state)
{
	struct lograte lr = { 0 };
	uint64_t unlogged = 99;

	(void)state;
	/* Three lines of a uid in its minute, from the first; the rest are
	 * counted, and the next minute's first line says how many. */
	for (uint64_t i = 0; i < 3; i++) {
		assert_true(lograte_allow_burst(&lr, 1000, 100 + i, 3, &unlogged));
		assert_int_equal(unlogged, 0);
	}
	for (uint64_t i = 0; i < 5; i++)
		assert_false(lograte_allow_burst(&lr, 1000, 200 + i, 3, &unlogged));
	assert_true(lograte_allow_burst(&lr, 1001, 300, 3, &unlogged));
	assert_false(lograte_allow_burst(&lr, 1000, 100 + LOGRATE_WARN_MS - 1, 3, &unlogged));
	assert_true(lograte_allow_burst(&lr, 1000, 100 + LOGRATE_WARN_MS, 3, &unlogged));
	assert_int_equal(unlogged, 6);
	assert_true(lograte_allow_burst(&lr, 1000, 101 + LOGRATE_WARN_MS, 3, &unlogged));
	assert_int_equal(unlogged, 0);
	/* Burst 1 is lograte_allow(). */
	assert_true(lograte_allow(&lr, 1002, 400, &unlogged));
	assert_false(lograte_allow(&lr, 1002, 401, &unlogged));
}

/* lograte_check: the allowed line gets the count of those not logged in
 * more, a line not allowed leaves more as it was. */
static void
test_check_says_how_many_were_not_logged(void **state)
{
	struct lograte lr = { 0 };
	char more[96] = "untouched";

	(void)state;
	assert_true(lograte_check(&lr, 1000, 5, 1, more, sizeof(more), "warnings"));
	assert_string_equal(more, "");
	strcpy(more, "untouched");
	assert_false(lograte_check(&lr, 1000, 6, 1, more, sizeof(more), "warnings"));
	assert_false(lograte_check(&lr, 1000, 7, 1, more, sizeof(more), "warnings"));
	assert_string_equal(more, "untouched");
	assert_true(lograte_check(&lr, 1000, 5 + LOGRATE_WARN_MS, 1, more, sizeof(more),
		"idle connections closed"));
	assert_string_equal(more, " (2 more idle connections closed not logged since the last "
		"warning)");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_once_a_minute_per_uid),
		cmocka_unit_test(test_uids_beyond_the_table),
		cmocka_unit_test(test_a_burst_per_uid_per_minute),
		cmocka_unit_test(test_check_says_how_many_were_not_logged),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
