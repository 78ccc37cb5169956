/*
 * test_uidtally.c: unit tests of daemon/uidtally.c, the per-uid count of
 * descriptors in flight: counts, removal at zero, growth, and removal in a
 * table full of collisions, checked step by step against a plain array.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "uidtally.h"

/* Every uid counted has its count, none other has one, and the table is at
 * most half full. */
static void
assert_matches(const struct uidtally *t, const uid_t *uids, const unsigned *counts, size_t n)
{
	unsigned used = 0, seen = 0;

	for (size_t i = 0; i < n; i++) {
		assert_int_equal(uidtally_get(t, uids[i]), counts[i]);
		used += counts[i] != 0;
	}
	assert_int_equal(t->used, used);
	for (unsigned i = 0; i < t->cap; i++)
		seen += t->slots[i].count != 0;
	assert_int_equal(seen, used);
	assert_true(t->cap == 0 || t->used * 2 <= t->cap);
}

static void
test_empty(void **state)
{
	struct uidtally t = { 0 };

	(void)state;
	assert_int_equal(uidtally_get(&t, 0), 0);
	assert_int_equal(uidtally_get(&t, 1000), 0);
	uidtally_sub(&t, 1000, 3); /* nothing to take: no-op */
	assert_int_equal(uidtally_add(&t, 1000, 0), 0);
	assert_int_equal(t.cap, 0); /* adding nothing allocates nothing */
	uidtally_free(&t);
	uidtally_free(&t);
}

static void
test_add_sub_remove(void **state)
{
	struct uidtally t = { 0 };

	(void)state;
	assert_int_equal(uidtally_add(&t, 1000, 3), 0);
	assert_int_equal(uidtally_add(&t, 1000, 4), 0);
	assert_int_equal(uidtally_add(&t, 0, 252), 0);
	assert_int_equal(uidtally_add(&t, (uid_t)-2, 1), 0); /* nobody on some systems */
	assert_int_equal(t.used, 3);
	assert_int_equal(uidtally_get(&t, 1000), 7);
	assert_int_equal(uidtally_get(&t, 0), 252);
	assert_int_equal(uidtally_get(&t, (uid_t)-2), 1);
	assert_int_equal(uidtally_get(&t, 1001), 0);
	uidtally_sub(&t, 1000, 3);
	assert_int_equal(uidtally_get(&t, 1000), 4);
	uidtally_sub(&t, 1000, 4); /* zero: removed */
	assert_int_equal(uidtally_get(&t, 1000), 0);
	assert_int_equal(t.used, 2);
	uidtally_sub(&t, 0, 1000); /* more than it has: stops at zero, removed */
	assert_int_equal(uidtally_get(&t, 0), 0);
	assert_int_equal(t.used, 1);
	uidtally_sub(&t, 1001, 1); /* not counted: no-op */
	assert_int_equal(t.used, 1);
	uidtally_free(&t);
	assert_null(t.slots);
	assert_int_equal(t.used, 0);
}

/* uidtally_reserve() leaves room, so the add of a new uid that follows it
 * does not grow (allocate) the table. */
static void
test_reserve(void **state)
{
	struct uidtally t = { 0 };

	(void)state;
	for (uid_t uid = 0; uid < 1000; uid++) {
		struct uidtally_slot *before;
		unsigned cap;

		assert_int_equal(uidtally_reserve(&t), 0);
		before = t.slots;
		cap = t.cap;
		assert_true((t.used + 1) * 2 <= t.cap);
		assert_int_equal(uidtally_add(&t, uid * 7919u, 1), 0);
		assert_ptr_equal(t.slots, before);
		assert_int_equal(t.cap, cap);
	}
	assert_int_equal(t.used, 1000);
	for (uid_t uid = 0; uid < 1000; uid++)
		assert_int_equal(uidtally_get(&t, uid * 7919u), 1);
	uidtally_free(&t);
}

/* Random adds and subtractions over a few uids (many collisions in a small
 * table, and chains that wrap around its end) and over many (growth), each
 * step checked against a plain array. */
static void
run_model(const uid_t *uids, size_t n, unsigned steps, unsigned seed)
{
	struct uidtally t = { 0 };
	unsigned *counts = calloc(n, sizeof(*counts));

	assert_non_null(counts);
	srand(seed);
	for (unsigned s = 0; s < steps; s++) {
		size_t i = (size_t)rand() % n;
		unsigned k = 1 + (unsigned)rand() % 5;

		if (rand() % 2) {
			assert_int_equal(uidtally_add(&t, uids[i], k), 0);
			counts[i] += k;
		} else {
			uidtally_sub(&t, uids[i], k);
			counts[i] = counts[i] > k ? counts[i] - k : 0;
		}
		if (s % 97 == 0 || n <= 64)
			assert_matches(&t, uids, counts, n);
	}
	assert_matches(&t, uids, counts, n);
	/* Empty it: every uid goes, and the table holds nothing. */
	for (size_t i = 0; i < n; i++) {
		uidtally_sub(&t, uids[i], counts[i]);
		counts[i] = 0;
	}
	assert_matches(&t, uids, counts, n);
	assert_int_equal(t.used, 0);
	uidtally_free(&t);
	free(counts);
}

static void
test_model_few(void **state)
{
	uid_t uids[12];

	(void)state;
	for (size_t i = 0; i < 12; i++)
		uids[i] = (uid_t)(i % 2 ? 1000 + i : 65536 * i); /* two kinds of spacing */
	run_model(uids, 12, 20000, 1);
}

static void
test_model_many(void **state)
{
	enum { N = 5000 };
	uid_t *uids = malloc(N * sizeof(*uids));

	(void)state;
	assert_non_null(uids);
	for (size_t i = 0; i < N; i++)
		uids[i] = (uid_t)(i * 16); /* consecutive users, spaced: a poor hash suffers */
	run_model(uids, N, 200000, 2);
	free(uids);
}

/* Removing from the middle of a chain keeps the entries behind it
 * reachable, the wrap-around at the table's end included: every uid of a
 * full-looking small table is taken out in turn while the others stay. */
static void
test_remove_each(void **state)
{
	enum { N = 8 }; /* half of the smallest table: the longest chains */
	uid_t uids[N];
	unsigned counts[N];

	(void)state;
	for (size_t i = 0; i < N; i++)
		uids[i] = (uid_t)(i * 16u + 5u);
	for (size_t gone = 0; gone < N; gone++) {
		struct uidtally t = { 0 };

		for (size_t i = 0; i < N; i++) {
			assert_int_equal(uidtally_add(&t, uids[i], (unsigned)i + 1), 0);
			counts[i] = (unsigned)i + 1;
		}
		assert_int_equal(t.cap, 16);
		uidtally_sub(&t, uids[gone], counts[gone]);
		counts[gone] = 0;
		assert_matches(&t, uids, counts, N);
		uidtally_free(&t);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_add_sub_remove),
		cmocka_unit_test(test_reserve),
		cmocka_unit_test(test_model_few),
		cmocka_unit_test(test_model_many),
		cmocka_unit_test(test_remove_each),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
