/*
 * test_convert.c: unit tests of wcachectl convert's reading of
 * /proc/self/io (client/ctl/convert.c, ctl_convert_io_wchar), which its
 * progress line measures bytes written by: the kernel's text, and text
 * the kernel never writes (a sign, a blank, a value past 2^64 - 1, a
 * value on the next line) which must give no figure rather than a wrong
 * one. Linked with wcachectl's sources but main.c.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"

/* ctl_convert_io_wchar() of text (to its NUL): 0 and *out, or the error. */
static int
wchar_of(const char *text, uint64_t *out)
{
	return ctl_convert_io_wchar(text, strlen(text), out);
}

static void
test_io_as_the_kernel_writes_it(void **state)
{
	static const char io[] = "rchar: 4519\nwchar: 1234567\nsyscr: 11\nsyscw: 3\n"
		"read_bytes: 0\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n";
	uint64_t v = 0;

	(void)state;
	assert_int_equal(ctl_convert_io_wchar(io, sizeof(io) - 1, &v), 0);
	assert_int_equal(v, 1234567);
	assert_int_equal(wchar_of("wchar: 0", &v), 0); /* no newline */
	assert_int_equal(v, 0);
	assert_int_equal(wchar_of("wchar: 18446744073709551615\n", &v), 0);
	assert_true(v == UINT64_MAX);
	/* The first line that starts with "wchar: " decides. */
	assert_int_equal(wchar_of("wchar: 5\nwchar: 6\n", &v), 0);
	assert_int_equal(v, 5);
	assert_int_equal(wchar_of("xwchar: 7\nwchar: 8\n", &v), 0);
	assert_int_equal(v, 8);
	/* Only len bytes are read: the rest of the buffer is not the file. */
	assert_int_equal(ctl_convert_io_wchar("wchar: 123456", 10, &v), 0);
	assert_int_equal(v, 123);
}

static void
test_io_not_as_the_kernel_writes_it(void **state)
{
	static const char *const bad[] = {
		"", "rchar: 5\n", "wchar: -5\n", "wchar: +5\n", "wchar:  5\n", "wchar:\t5\n",
		"wchar:5\n", "wchar: 5 \n", "wchar: 5x\n", "wchar: 0x10\n", "wchar: \n",
		"wchar:\n5\n", "wchar: \n5\n", "wchar:\n", "wchar: 18446744073709551616\n",
		"wchar: 99999999999999999999\n", "WCHAR: 5\n", "wchar: x\nwchar: 5\n",
	};
	uint64_t v = 42;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = wchar_of(bad[i], &v);

		if (rc != -EINVAL || v != 42)
			fail_msg("\"%s\": %d, %llu; expected -EINVAL, *out untouched", bad[i], rc,
				(unsigned long long)v);
	}
	/* A NUL is no digit. */
	assert_int_equal(ctl_convert_io_wchar("wchar: 1\0002\n", 11, &v), -EINVAL);
	assert_int_equal(v, 42);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_io_as_the_kernel_writes_it),
		cmocka_unit_test(test_io_not_as_the_kernel_writes_it),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
