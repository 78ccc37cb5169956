/*
 * test_statuspage.c: unit tests of daemon/statuspage.c's slots: a name
 * keeps its slot, a name that never served gives it back for the next new
 * one, a name that served keeps it, and a full page refuses a new name
 * (-ENOSPC with a message) instead of handing out slot 0; after a warm
 * restart the slots of the names it did not carry are free, numbered from
 * their words. A real memfd.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* The page a previous process stored, and a new process that adopts it
 * (statuspage_adopt takes a duplicate: the old one closes its own). */
static void
adopt_stored(struct statuspage *old, struct statuspage *p)
{
	int fd = dup(old->fd);

	assert_true(fd >= 0);
	statuspage_close(old);
	assert_int_equal(statuspage_adopt(p, fd), 0);
}

/*
 * A warm restart that carries a few names: the slots of the names it does
 * not carry (gaps, and slots past the last carried one) are free for new
 * names, which number their generations above what the slot's word says
 * (an unloaded name's last number, or a generation served after the
 * description was stored), so that no old holder reads a new name's
 * number as its own. Before, gaps stayed taken until a cold start, and a
 * slot past the last carried one began again at 1.
 */
static void
test_restart_frees_what_it_does_not_carry(void **state)
{
	struct statuspage old, p;
	unsigned s, gone, kept, crashed, n;
	char name[32];

	(void)state;
	assert_int_equal(statuspage_init(&old, 1), 0);
	assert_int_equal(statuspage_slot_for(&old, "gone", &gone), 0);
	assert_int_equal(statuspage_slot_for(&old, "kept", &kept), 0);
	assert_int_equal(statuspage_slot_for(&old, "crashed", &crashed), 0);
	/* "gone" served generation 5 and was unloaded: retired, number kept. */
	statuspage_set_last_generation(&old, gone, 5);
	statuspage_publish(&old, gone, 5);
	statuspage_publish(&old, gone, 0);
	assert_int_equal(old.map[gone], STATUS_SLOT_RETIRED | 5);
	statuspage_set_last_generation(&old, kept, 2);
	statuspage_publish(&old, kept, 2);
	/* Served 7 after the description was stored, then the process died. */
	statuspage_set_last_generation(&old, crashed, 7);
	statuspage_publish(&old, crashed, 7);
	adopt_stored(&old, &p);

	/* The description carries only "kept". */
	assert_int_equal(statuspage_restore_slot(&p, kept, "kept", 2), 0);
	assert_int_equal(statuspage_slot_for(&p, "kept", &s), 0);
	assert_int_equal(s, kept);
	assert_int_equal(statuspage_last_generation(&p, s), 2);
	assert_int_equal(statuspage_slot_for(&p, "new1", &s), 0);
	assert_int_equal(s, gone);
	assert_int_equal(statuspage_last_generation(&p, s), 5);
	assert_int_equal(statuspage_slot_for(&p, "new2", &s), 0);
	assert_int_equal(s, crashed);
	assert_int_equal(statuspage_last_generation(&p, s), 7);
	/* A new name that never serves gives the slot back, number kept. */
	statuspage_publish(&p, s, 0);
	statuspage_release_slot(&p, s);
	assert_int_equal(statuspage_slot_for(&p, "new3", &n), 0);
	assert_int_equal(n, crashed);
	assert_int_equal(statuspage_last_generation(&p, n), 7);
	assert_int_equal(statuspage_slot_for(&p, "fresh", &s), 0);
	assert_int_equal(s, crashed + 1);
	assert_int_equal(statuspage_last_generation(&p, s), 0);
	statuspage_close(&p);

	/* A page full of names of which the restart carries one: the other
	 * 8,190 slots are free again. */
	assert_int_equal(statuspage_init(&old, 1), 0);
	for (unsigned i = 0; i < STATUS_SLOTS - 1; i++) {
		snprintf(name, sizeof(name), "m%u", i);
		assert_int_equal(statuspage_slot_for(&old, name, &n), 0);
		statuspage_set_last_generation(&old, n, 1);
		statuspage_publish(&old, n, 0);
	}
	assert_int_equal(statuspage_slot_for(&old, "one-too-many", &n), -ENOSPC);
	adopt_stored(&old, &p);
	assert_int_equal(statuspage_restore_slot(&p, STATUS_SLOTS - 1, "last", 1), 0);
	for (unsigned i = 1; i < STATUS_SLOTS - 1; i++) {
		snprintf(name, sizeof(name), "n%u", i);
		assert_int_equal(statuspage_slot_for(&p, name, &n), 0);
		assert_int_equal(n, i);
		assert_int_equal(statuspage_last_generation(&p, n), 1);
	}
	assert_int_equal(statuspage_slot_for(&p, "one-too-many", &n), -ENOSPC);
	statuspage_close(&p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slots_given_back_and_full),
		cmocka_unit_test(test_restart_frees_what_it_does_not_carry),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
