/*
 * test_statuspage.c: unit tests of daemon/statuspage.c's slots: a name
 * keeps its slot, a name that never served gives it back for the next new
 * one, a name that served keeps it, and a full page refuses a new name
 * (-ENOSPC with a message) instead of handing out slot 0. A real memfd.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "proto/memfds.h"
#include "statuspage.h"

static void
test_slots_given_back_and_full(void **state)
{
	struct statuspage p;
	unsigned a, b, again, n;
	char name[32];

	(void)state;
	assert_int_equal(statuspage_init(&p, 0), 0);
	assert_int_equal(statuspage_slot_for(&p, "a", &a), 0);
	assert_int_equal(statuspage_slot_for(&p, "b", &b), 0);
	assert_true(a != 0 && b != 0 && a != b);
	assert_int_equal(statuspage_slot_for(&p, "a", &again), 0);
	assert_int_equal(again, a);

	/* b never served: its slot goes to the next new name. a served
	 * (generation 3): it keeps its slot and number. */
	statuspage_set_last_generation(&p, a, 3);
	statuspage_release_slot(&p, a);
	statuspage_release_slot(&p, b);
	assert_int_equal(statuspage_slot_for(&p, "c", &again), 0);
	assert_int_equal(again, b);
	assert_int_equal(statuspage_last_generation(&p, again), 0);
	assert_int_equal(statuspage_slot_for(&p, "a", &again), 0);
	assert_int_equal(again, a);
	assert_int_equal(statuspage_last_generation(&p, a), 3);

	/* Fill the page: 2 slots taken, STATUS_SLOTS - 3 more fit. */
	for (unsigned i = 0; i < STATUS_SLOTS - 3; i++) {
		snprintf(name, sizeof(name), "m%u", i);
		assert_int_equal(statuspage_slot_for(&p, name, &n), 0);
		assert_true(n != 0);
	}
	assert_int_equal(statuspage_slot_for(&p, "one-too-many", &n), -ENOSPC);
	assert_non_null(strstr(error_get(), "model \"one-too-many\": the status page has no "
		"slot left"));
	/* A never-served name gives its slot back: the next one gets it. */
	statuspage_release_slot(&p, n = 7);
	assert_int_equal(statuspage_slot_for(&p, "one-too-many", &again), 0);
	assert_int_equal(again, 7);
	statuspage_close(&p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slots_given_back_and_full),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
