/*
 * test_decimal.c: client/base/decimal.c, the strict decimal number of 64
 * bits that $JOURNAL_STREAM (daemon/log.c), /proc/self/io (wcachectl
 * convert), $LISTEN_PID and $LISTEN_FDS (daemon/listen.c) and the config's
 * numbers (daemon/config_value.c) are read with: digits only, at least
 * one, up to 2^64 - 1; -EINVAL for any other byte, -ERANGE past the bound,
 * whichever comes first, and *out untouched on either.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/decimal.h"

/* decimal_u64() of the len bytes at s: its code, and *out (7 before). */
static int
parse(const char *s, size_t len, uint64_t *out)
{
	*out = 7;
	return decimal_u64(s, len, out);
}

#define PARSE(lit, out) parse(lit, sizeof(lit) - 1, out)

static void
test_values(void **state)
{
	uint64_t v;

	(void)state;
	assert_int_equal(PARSE("0", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(PARSE("42", &v), 0);
	assert_int_equal(v, 42);
	assert_int_equal(PARSE("000123", &v), 0);
	assert_int_equal(v, 123);
	assert_int_equal(PARSE("18446744073709551615", &v), 0);
	assert_true(v == UINT64_MAX);
	assert_int_equal(PARSE("0000000000000000000000018446744073709551615", &v), 0);
	assert_true(v == UINT64_MAX);
	/* Only len bytes count: what follows them is not read. */
	assert_int_equal(parse("12x", 2, &v), 0);
	assert_int_equal(v, 12);
}

static void
test_refused(void **state)
{
	static const char *const not_numbers[] = {
		"", "+1", "-1", " 1", "1 ", "1\n", "0x10", "1.0", "1e3", "12a", ":",
	};
	uint64_t v;

	(void)state;
	for (size_t i = 0; i < sizeof(not_numbers) / sizeof(not_numbers[0]); i++) {
		assert_int_equal(parse(not_numbers[i], strlen(not_numbers[i]), &v), -EINVAL);
		assert_int_equal(v, 7);
	}
	/* A NUL is a byte like any other, not the end. */
	assert_int_equal(PARSE("1\0002", &v), -EINVAL);
	assert_int_equal(v, 7);
	assert_int_equal(PARSE("18446744073709551616", &v), -ERANGE);
	assert_int_equal(v, 7);
	assert_int_equal(PARSE("99999999999999999999999", &v), -ERANGE);
	assert_int_equal(v, 7);
	/* Whichever the bytes meet first. */
	assert_int_equal(PARSE("18446744073709551616x", &v), -ERANGE);
	assert_int_equal(PARSE("x18446744073709551616", &v), -EINVAL);
	assert_int_equal(PARSE("1844674407370955161x6", &v), -EINVAL);
	assert_int_equal(v, 7);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
