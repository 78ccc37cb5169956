/*
 * test_fnv.c: client/base/fnv.h, the FNV-1a step every hash of the daemon
 * and the formats takes: FNV's own test vectors for bytes and strings
 * (the empty string is the offset basis), words hashed whole (a word past
 * a byte is not cut to its low byte), and the four ways in agreeing with
 * one another, so that a table or digest that moved onto the helper keeps
 * its values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/fnv.h"

/* FNV-1a 64 of "", "a" and "foobar", from FNV's reference test suite. */
static void
test_reference_vectors(void **state)
{
	(void)state;
	assert_true(fnv_mix_string(FNV_OFFSET_BASIS, "") == UINT64_C(0xcbf29ce484222325));
	assert_true(fnv_mix_string(FNV_OFFSET_BASIS, "a") == UINT64_C(0xaf63dc4c8601ec8c));
	assert_true(fnv_mix_string(FNV_OFFSET_BASIS, "foobar") ==
		UINT64_C(0x85944171f73967e8));
	assert_true(fnv_mix_bytes(FNV_OFFSET_BASIS, "foobar", 6) ==
		UINT64_C(0x85944171f73967e8));
	assert_true(fnv_mix_bytes(FNV_OFFSET_BASIS, "foobar", 0) == FNV_OFFSET_BASIS);
}

/* Words go in whole, in order: the value the hashes written out by hand
 * ((h ^ v) * 1099511628211 for each v) gave. */
static void
test_words_whole(void **state)
{
	const uint64_t v[4] = { 1, 2, UINT64_MAX, 0x100 };
	uint64_t h = FNV_OFFSET_BASIS;

	(void)state;
	assert_true(fnv_mix_words(FNV_OFFSET_BASIS, v, 4) == UINT64_C(0x417fd988ae967b1d));
	for (int i = 0; i < 4; i++)
		h = fnv_mix(h, v[i]);
	assert_true(h == UINT64_C(0x417fd988ae967b1d));
	/* 0x100 is not 0x00: the word is not cut to a byte. */
	assert_true(fnv_mix(FNV_OFFSET_BASIS, 0x100) != fnv_mix(FNV_OFFSET_BASIS, 0));
	assert_true(fnv_mix_words(7, v, 0) == 7);
}

/* A string's bytes, as bytes and as words of one byte each, hash alike
 * from any start: high bytes (above 0x7f) go in unsigned. */
static void
test_ways_agree(void **state)
{
	const char s[] = "model \xc3\xa9t\xff";
	uint64_t w[sizeof(s) - 1];

	(void)state;
	for (size_t i = 0; i < sizeof(s) - 1; i++)
		w[i] = (unsigned char)s[i];
	assert_true(fnv_mix_string(42, s) == fnv_mix_bytes(42, s, strlen(s)));
	assert_true(fnv_mix_string(42, s) == fnv_mix_words(42, w, sizeof(s) - 1));
	assert_true(fnv_mix_string(42, s) != fnv_mix_string(43, s));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference_vectors),
		cmocka_unit_test(test_words_whole),
		cmocka_unit_test(test_ways_agree),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
