/*
 * test_escape.c: client/base/escape.c, text made safe for a terminal or a
 * log line: printable ASCII and UTF-8 characters pass as they are; C0
 * controls, DEL, C1 controls (as UTF-8, the form a terminal in a UTF-8
 * locale acts on), bidirectional overrides and bytes that are not UTF-8
 * are escaped; the width counts an escape by its text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/escape.h"

/* escape_print() of s, in a buffer the caller frees. */
static char *
printed(const char *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	escape_print(f, s);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void
check(const char *in, const char *want)
{
	char *got = printed(in);

	if (strcmp(got, want) != 0)
		fail_msg("escape_print(\"%s\") gave \"%s\", expected \"%s\"", in, got, want);
	free(got);
}

static void
test_plain_text_passes(void **state)
{
	(void)state;
	check("model.safetensors", "model.safetensors");
	check("a\\b \"c\" ~", "a\\b \"c\" ~");
	check("", "");
}

static void
test_controls_are_escaped(void **state)
{
	(void)state;
	check("\x1b]0;PWNED\x07", "\\x1b]0;PWNED\\x07");
	check("a\nb\tc\rd\x7f", "a\\x0ab\\x09c\\x0dd\\x7f");
	/* C1 as UTF-8: CSI, OSC, ST. */
	check("x\xc2\x9b" "31m", "x\\u009b31m");
	check("\xc2\x9d" "0;t\xc2\x9c", "\\u009d0;t\\u009c");
	check("\xc2\x80\xc2\x9f", "\\u0080\\u009f");
	/* Bidirectional overrides and isolates (the "trojan source" set). */
	check("a\xe2\x80\xae" "b", "a\\u202eb");
	check("\xe2\x80\xaa\xe2\x81\xa6\xe2\x81\xa9", "\\u202a\\u2066\\u2069");
}

static void
test_invalid_utf8_is_escaped_byte_by_byte(void **state)
{
	(void)state;
	check("\x9b" "2J", "\\x9b2J");          /* a raw C1 byte */
	check("\xc2", "\\xc2");                 /* truncated */
	check("\xc0\xaf", "\\xc0\\xaf");        /* overlong "/" */
	check("\xed\xa0\x80", "\\xed\\xa0\\x80"); /* a surrogate */
	check("\xff\xfe", "\\xff\\xfe");
}

static void
test_other_utf8_passes(void **state)
{
	(void)state;
	check("caf\xc3\xa9", "caf\xc3\xa9");                     /* U+00E9 */
	check("\xe2\x80\xa9\xe2\x81\xaa", "\xe2\x80\xa9\xe2\x81\xaa"); /* beside the ranges */
	check("\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80");           /* U+1F600 */
	check("\xc2\xa0", "\xc2\xa0");                           /* U+00A0, after C1 */
}

static void
test_width(void **state)
{
	(void)state;
	assert_int_equal(escape_width("abc"), 3);
	assert_int_equal(escape_width("caf\xc3\xa9"), 4);
	assert_int_equal(escape_width("\x1b"), 4);         /* \x1b */
	assert_int_equal(escape_width("\xc2\x9b"), 6);     /* \u009b */
	assert_int_equal(escape_width("a\xe2\x80\xae"), 7);
	assert_int_equal(escape_width("\xff"), 4);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_text_passes),
		cmocka_unit_test(test_controls_are_escaped),
		cmocka_unit_test(test_invalid_utf8_is_escaped_byte_by_byte),
		cmocka_unit_test(test_other_utf8_passes),
		cmocka_unit_test(test_width),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
