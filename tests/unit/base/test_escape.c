/*
 * test_escape.c: client/base/escape.c, text made safe for a terminal or a
 * log line: printable ASCII and UTF-8 characters pass as they are; C0
 * controls, DEL, C1 controls (as UTF-8, the form a terminal in a UTF-8
 * locale acts on), bidirectional overrides and bytes that are not UTF-8
 * are escaped; the width counts an escape by its text.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
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
	/* Wide and zero-width characters, as a terminal shows them: the
	 * table lines up under CJK tensor names. */
	assert_int_equal(escape_width("\xe4\xb8\xad\xe6\x96\x87"), 4); /* two CJK ideographs */
	assert_int_equal(escape_width("e\xcc\x81"), 1);             /* e + combining acute */
	assert_int_equal(escape_width("\xf0\x9f\x98\x80x"), 3);       /* an emoji, then x */
}

/* escape_string() is escape_print() into a buffer, cut between pieces. */
static void
test_string(void **state)
{
	static const char *const in[] = { "model.safetensors", "a\\b", "\x1b]0;x\x07",
		"x\xc2\x9b" "31m", "a\xe2\x80\xae" "b", "caf\xc3\xa9", "\xff\xfe", "" };
	char buf[64];

	(void)state;
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
		char *want = printed(in[i]);

		assert_string_equal(escape_string(buf, sizeof(buf), in[i], strlen(in[i])), want);
		free(want);
	}
	/* Never cut inside an escape or a character. */
	assert_string_equal(escape_string(buf, 6, "ab\x1b" "c", 4), "ab");
	assert_string_equal(escape_string(buf, 7, "ab\x1b" "c", 4), "ab\\x1b");
	assert_string_equal(escape_string(buf, 5, "abc\xc3\xa9", 5), "abc");
	assert_string_equal(escape_string(buf, 1, "abc", 3), "");
	/* A NUL inside the length is escaped too. */
	assert_string_equal(escape_string(buf, sizeof(buf), "a\0b", 3), "a\\x00b");
}

/*
 * Escaped text escapes to itself: what error.c escaped, the daemon's log
 * and wcachectl show the same (which is why a backslash is not escaped:
 * "\\\\" would double at every layer).
 */
static void
test_escaping_twice_changes_nothing(void **state)
{
	static const char *const in[] = { "\x1b]0;PWNED\x07\x1b[2J", "a\\x1b\\u009b\\",
		"\xc2\x9b\xe2\x80\xae\xe2\x81\xa6", "\xc0\xaf\xed\xa0\x80\xff",
		"caf\xc3\xa9 \x7f" };

	(void)state;
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
		char *once = printed(in[i]), *twice = printed(once);

		assert_string_equal(twice, once);
		free(once);
		free(twice);
	}
	check("a\\b\\\\c", "a\\b\\\\c");
}

/*
 * Every wc_errmsg() message is escaped as it is set: a name a file chose
 * (a shard, a tensor, a path) reaches a worker's log as text, whichever
 * producer quoted it, and so does a prefix (a model's name).
 */
static void
test_error_messages_are_escaped(void **state)
{
	char big[3000];

	(void)state;
	assert_int_equal(error_set(-EINVAL, "%s: shard %s is missing", "/m/\x1b[2Jx",
		"\xc2\x9b" "31m\xe2\x80\xae.safetensors"), -EINVAL);
	assert_string_equal(error_get(),
		"/m/\\x1b[2Jx: shard \\u009b31m\\u202e.safetensors is missing");
	error_prefix("model\n\x1b[31m");
	assert_string_equal(error_get(),
		"model\\x0a\\x1b[31m: /m/\\x1b[2Jx: shard \\u009b31m\\u202e.safetensors "
		"is missing");
	/* The message itself as an argument (an earlier message quoted). */
	error_set(0, "outer: %s", error_get());
	assert_non_null(strstr(error_get(), "outer: model\\x0a\\x1b[31m: /m/"));
	/* Cut to the buffer, never inside an escape or a character. */
	memset(big, '\x1b', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	error_set(0, "%s", big);
	assert_int_equal(strlen(error_get()) % 4, 0);
	assert_null(strchr(error_get(), '\x1b'));
	memset(big, 0, sizeof(big));
	for (size_t i = 0; i + 2 < sizeof(big) - 1; i += 2)
		memcpy(big + i, "\xc3\xa9", 2);
	error_set(0, "%s", "x");
	error_prefix(big);
	assert_int_equal(strlen(error_get()), 1023);
	error_set(0, "%s", big);
	error_prefix("pq"); /* the message cut at an odd byte: inside a character */
	assert_true(((unsigned char)error_get()[strlen(error_get()) - 1] & 0xc0) == 0x80);
	assert_true(((unsigned char)error_get()[strlen(error_get()) - 2] & 0xe0) == 0xc0);
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
		cmocka_unit_test(test_string),
		cmocka_unit_test(test_escaping_twice_changes_nothing),
		cmocka_unit_test(test_error_messages_are_escaped),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
