/*
 * test_json.c: the strict JSON reader and writer (client/base/json.c).
 *
 * Grammar, UTF-8 and number cases are tables of documents with the expected
 * verdict; each verdict is also checked against jansson, so a case that
 * would make the two disagree is caught here before the fuzzer finds it.
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
#include <jansson.h>

#include "base/json.h"

struct doc {
	const char *text;
	size_t len; /* 0: strlen(text) */
	int expect; /* 0 or the negative code */
};

#define D(s, e) { s, sizeof(s) - 1, e }

/* Validates one document with our reader; also asks jansson, which must agree
 * unless the case is marked as one where jansson legitimately differs. */
static int
check_doc(const struct doc *d, int jansson_agrees)
{
	struct jr j;
	json_error_t err;
	json_t *v;
	int r = jr_validate(d->text, d->len, &j);

	if (r != d->expect)
		fail_msg("document \"%.*s\": expected %d, got %d (%s)", (int)d->len, d->text,
			d->expect, r, jr_errmsg(&j));
	if (r < 0)
		assert_true(jr_errmsg(&j)[0] != '\0');
	if (jansson_agrees) {
		v = json_loadb(d->text, d->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
		if ((v != NULL) != (r == 0))
			fail_msg("document \"%.*s\": jansson says %s (%s)", (int)d->len, d->text,
				v ? "valid" : "invalid", err.text);
		json_decref(v);
	}
	return r;
}

static void
test_grammar_valid(void **state)
{
	static const struct doc docs[] = {
		D("{}", 0), D("[]", 0), D("\"\"", 0), D("0", 0), D("-0", 0), D("true", 0),
		D("false", 0), D("null", 0), D(" \t\r\n{} \t\r\n", 0),
		D("[1,2,{\"a\":null,\"b\":[true,false]}]", 0),
		D("{\"a\" : 1 , \"a\" : 2}", 0), /* duplicate keys: grammar allows them */
		D("[[[[[]]]]]", 0), D("{\"\":\"\"}", 0), D("[\"\\u0000\"]", 0),
	};

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
		check_doc(&docs[i], 1);
}

static void
test_grammar_invalid(void **state)
{
	static const struct doc docs[] = {
		D("", -EINVAL), D("   ", -EINVAL), D("{", -EINVAL), D("}", -EINVAL),
		D("[1,]", -EINVAL), D("[,1]", -EINVAL), D("{\"a\":1,}", -EINVAL),
		D("{a:1}", -EINVAL), D("{\"a\" 1}", -EINVAL), D("{\"a\":}", -EINVAL),
		D("[1 2]", -EINVAL), D("{} x", -EINVAL), D("{}{}", -EINVAL), D("[1]]", -EINVAL),
		D("nul", -EINVAL), D("tru", -EINVAL), D("nulll", -EINVAL), D("True", -EINVAL),
		D("NaN", -EINVAL), D("Infinity", -EINVAL), D("'a'", -EINVAL),
		D("\xef\xbb\xbf{}", -EINVAL), /* a BOM is not whitespace */
		D("{}\x00", -EINVAL), D("\x00", -EINVAL), D("[1]\f", -EINVAL),
		D("{\"a\":1 \"b\":2}", -EINVAL), D("[\"a\":1]", -EINVAL), D("{1:2}", -EINVAL),
	};

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
		check_doc(&docs[i], 1);
}

static void
test_strings(void **state)
{
	static const struct doc docs[] = {
		D("\"abc\"", 0), D("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", 0), D("\"\\u00e9\\u00E9\"", 0),
		D("\"\\ud83d\\ude00\"", 0), D("\"\xc3\xa9\"", 0), D("\"\xe2\x82\xac\"", 0),
		D("\"\xf0\x9f\x98\x80\"", 0), D("\"\xf4\x8f\xbf\xbf\"", 0), D("\"\x7f\"", 0),
		D("\"\xef\xbf\xbf\"", 0), D("\"\xee\x80\x80\"", 0),
		/* escapes */
		D("\"\\x\"", -EINVAL), D("\"\\u12\"", -EINVAL), D("\"\\u12g4\"", -EINVAL),
		D("\"\\\"", -EINVAL), D("\"\\", -EINVAL), D("\"\\U0041\"", -EINVAL),
		D("\"\\ud800\"", -EINVAL), D("\"\\udc00\"", -EINVAL),
		D("\"\\ud800\\u0041\"", -EINVAL), D("\"\\ud800\\ud800\"", -EINVAL),
		D("\"\\ud800x\"", -EINVAL), D("\"\\ude00\\ud83d\"", -EINVAL),
		/* control characters must be escaped */
		D("\"\x01\"", -EINVAL), D("\"\x1f\"", -EINVAL), D("\"a\nb\"", -EINVAL),
		D("\"\t\"", -EINVAL), D("\"\x00\"", -EINVAL),
		/* UTF-8 */
		D("\"\x80\"", -EINVAL), D("\"\xbf\"", -EINVAL), D("\"\xc0\xaf\"", -EINVAL),
		D("\"\xc1\xbf\"", -EINVAL), D("\"\xe0\x80\xaf\"", -EINVAL),
		D("\"\xe0\x9f\xbf\"", -EINVAL), D("\"\xf0\x80\x80\xaf\"", -EINVAL),
		D("\"\xf0\x8f\xbf\xbf\"", -EINVAL), D("\"\xed\xa0\x80\"", -EINVAL),
		D("\"\xed\xbf\xbf\"", -EINVAL), D("\"\xf4\x90\x80\x80\"", -EINVAL),
		D("\"\xf5\x80\x80\x80\"", -EINVAL), D("\"\xff\"", -EINVAL),
		D("\"\xe2\x82\"", -EINVAL), D("\"\xe2\x82", -EINVAL), D("\"\xc3\"", -EINVAL),
		D("\"\xf0\x9f\x98\"", -EINVAL), D("\"\xc3\x28\"", -EINVAL),
		D("\"abc", -EINVAL), D("\"", -EINVAL),
		/* long strings cross the 8-byte fast path at every alignment */
		D("\"0123456789abcdef0123456789abcdef\"", 0),
		D("\"0123456789abcde\x01\"", -EINVAL), D("\"0123456789abcdef\xc3\xa9xyz\"", 0),
		D("\"01234567\\n01234567\"", 0), D("\"0123456\x80\"", -EINVAL),
	};

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
		check_doc(&docs[i], 1);
}

static void
test_numbers(void **state)
{
	static const struct doc docs[] = {
		D("0", 0), D("-0", 0), D("1", 0), D("-1", 0), D("10", 0), D("1.5", 0),
		D("-0.0", 0), D("1e5", 0), D("1E5", 0), D("1e+5", 0), D("1e-5", 0),
		D("1.25e-10", 0), D("[0,-0,0.5]", 0), D("123456789012345678", 0),
		D("016", -EINVAL), D("00", -EINVAL), D("-016", -EINVAL), D("+1", -EINVAL),
		D("1.", -EINVAL), D(".5", -EINVAL), D("-", -EINVAL), D("-a", -EINVAL),
		D("1e", -EINVAL), D("1e+", -EINVAL), D("1.e5", -EINVAL), D("0x10", -EINVAL),
		D("1.5.5", -EINVAL), D("--1", -EINVAL), D("1ee5", -EINVAL), D("[01]", -EINVAL),
		D("- 1", -EINVAL), D("1 2", -EINVAL),
	};

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
		check_doc(&docs[i], 1);
}

/* Reads one u64 from text with jr_u64. */
static int
read_u64(const char *text, uint64_t *v)
{
	struct jr j;
	int r;

	jr_init(&j, text, strlen(text));
	if ((r = jr_u64(&j, v)) < 0)
		return r;
	return jr_finish(&j);
}

static void
test_u64(void **state)
{
	uint64_t v = 7;

	assert_int_equal(read_u64("0", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(read_u64(" 42 ", &v), 0);
	assert_int_equal(v, 42);
	assert_int_equal(read_u64("18446744073709551615", &v), 0);
	assert_true(v == UINT64_MAX);
	assert_int_equal(read_u64("9999999999999999999", &v), 0);
	assert_true(v == 9999999999999999999ull);
	v = 7;
	assert_int_equal(read_u64("18446744073709551616", &v), -EDOM);
	assert_int_equal(read_u64("99999999999999999999999", &v), -EDOM);
	assert_int_equal(read_u64("-0", &v), -EDOM);
	assert_int_equal(read_u64("-5", &v), -EDOM);
	assert_int_equal(read_u64("4.0", &v), -EDOM);
	assert_int_equal(read_u64("4e0", &v), -EDOM);
	assert_int_equal(read_u64("4E0", &v), -EDOM);
	assert_int_equal(read_u64("0.5", &v), -EDOM);
	assert_int_equal(v, 7); /* untouched on failure */
	assert_int_equal(read_u64("016", &v), -EINVAL);
	assert_int_equal(read_u64("+4", &v), -EINVAL);
	assert_int_equal(read_u64("4.", &v), -EINVAL);
	assert_int_equal(read_u64("\"4\"", &v), -EINVAL);
	assert_int_equal(read_u64("", &v), -EINVAL);
	assert_int_equal(read_u64("1x", &v), -EINVAL); /* jr_finish refuses the x */

	{
		struct jr j;

		jr_init(&j, "4.0", 3);
		assert_int_equal(jr_u64(&j, &v), -EDOM);
		assert_non_null(strstr(jr_errmsg(&j), "not a non-negative integer"));
		jr_init(&j, "18446744073709551616", 20);
		assert_int_equal(jr_u64(&j, &v), -EDOM);
		assert_non_null(strstr(jr_errmsg(&j), "2^64"));
	}
}

/* Nesting: JR_MAX_DEPTH containers are fine, one more is -E2BIG. */
static void
test_depth(void **state)
{
	char buf[2 * (JR_MAX_DEPTH + 1) + 1];
	struct jr j;

	for (int n = JR_MAX_DEPTH; n <= JR_MAX_DEPTH + 1; n++) {
		memset(buf, '[', (size_t)n);
		memset(buf + n, ']', (size_t)n);
		assert_int_equal(jr_validate(buf, 2 * (size_t)n, &j),
			n <= JR_MAX_DEPTH ? 0 : -E2BIG);
	}
	assert_non_null(strstr(jr_errmsg(&j), "nesting"));
	/* objects count too */
	{
		char doc[6 * (JR_MAX_DEPTH + 1) + 8];
		size_t p = 0;

		for (int i = 0; i <= JR_MAX_DEPTH; i++)
			p += (size_t)sprintf(doc + p, "{\"a\":");
		p += (size_t)sprintf(doc + p, "1");
		for (int i = 0; i <= JR_MAX_DEPTH; i++)
			doc[p++] = '}';
		assert_int_equal(jr_validate(doc, p, &j), -E2BIG);
	}
}

static void
test_error_offset(void **state)
{
	struct jr j;

	assert_int_equal(jr_validate("[1,]", 4, &j), -EINVAL);
	assert_int_equal(jr_erroff(&j), 3);
	assert_int_equal(jr_validate("{\"a\":\"\x01\"}", 8, &j), -EINVAL);
	assert_int_equal(jr_erroff(&j), 6);
	assert_non_null(strstr(jr_errmsg(&j), "control character"));
	assert_int_equal(jr_validate("[\"\xc0\xaf\"]", 6, &j), -EINVAL);
	assert_non_null(strstr(jr_errmsg(&j), "UTF-8"));
	assert_int_equal(jr_validate("{} x", 4, &j), -EINVAL);
	assert_int_equal(jr_erroff(&j), 3);
	assert_non_null(strstr(jr_errmsg(&j), "after the JSON value"));
}

/*
 * jr_str_decode() takes its destination's size: a value that does not fit is
 * -ENOBUFS and nothing is written past the end; a string whose bytes changed
 * after the reader measured it (a writer toggling "\u0041..." and "AAAAAA..."
 * of the same length) can neither overflow the destination nor be read past
 * its end.
 */
static void
test_decode_bounded(void **state)
{
	char doc[] = "\"\\u0041\\u0041\\u0041\"";
	char dst[16];
	struct jr_str s;
	struct jr j;

	(void)state;
	jr_init(&j, doc, strlen(doc));
	assert_int_equal(jr_string(&j, &s), 0);
	assert_int_equal(s.len, 3);
	/* Fits exactly (3 bytes and the NUL), then one byte short. */
	memset(dst, 0x5a, sizeof(dst));
	assert_int_equal(jr_str_decode(&s, dst, 4), 0);
	assert_string_equal(dst, "AAA");
	memset(dst, 0x5a, sizeof(dst));
	assert_int_equal(jr_str_decode(&s, dst, 3), -ENOBUFS);
	for (size_t i = 3; i < sizeof(dst); i++)
		assert_int_equal(dst[i], 0x5a);
	assert_int_equal(dst[2], '\0');
	memset(dst, 0x5a, sizeof(dst));
	assert_int_equal(jr_str_decode(&s, dst, 0), -ENOBUFS);
	assert_int_equal(dst[0], 0x5a);
	/* The writer's toggle: now 18 plain bytes where 3 were measured. */
	memset(doc + 1, 'A', 18);
	memset(dst, 0x5a, sizeof(dst));
	assert_int_equal(jr_str_decode(&s, dst, 4), -ENOBUFS);
	for (size_t i = 4; i < sizeof(dst); i++)
		assert_int_equal(dst[i], 0x5a);
	assert_int_equal(jr_str_decode(&s, dst, sizeof(dst)), -ENOBUFS);
	/* Room enough for the new bytes, but not the measured length. */
	{
		char big[64];

		assert_int_equal(jr_str_decode(&s, big, sizeof(big)), -EINVAL);
	}
	/* An escape broken after the scan, and one cut at the end of the raw
	 * bytes (a surrogate pair whose second half is gone). */
	/* Raw bytes written over the document's, not C strings.
	 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
	memcpy(doc + 1, "\\u00zz", 6);
	assert_int_equal(jr_str_decode(&s, dst, sizeof(dst)), -EINVAL);
	/* NOLINTNEXTLINE(bugprone-not-null-terminated-result): raw bytes, as above */
	memcpy(doc + 1, "AAAAAAAAAAAA\\ud83d", 18);
	assert_int_equal(jr_str_decode(&s, dst, sizeof(dst)), -EINVAL);
	s.len = 13;
	assert_false(jr_str_eq_escaped(&s, "AAAAAAAAAAAA\xf0", 13));
}

/* The cursor API: keys, values, decoding. */
static void
test_cursor(void **state)
{
	static const char doc[] = "{\"d\\u0074ype\":\"F\\u00e9\\ud83d\\ude00\\n\",\"n\":[1,2,3],"
				  "\"z\":\"a\\u0000b\",\"e\":{}}";
	struct jr j;
	struct jr_str k, s;
	uint64_t v, sum = 0;
	char buf[64];

	jr_init(&j, doc, sizeof(doc) - 1);
	assert_int_equal(jr_peek(&j), JR_OBJECT);
	assert_int_equal(jr_object_begin(&j), 0);
	assert_int_equal(jr_object_next(&j, &k), 1);
	assert_true(k.escaped);
	assert_int_equal(k.len, 5);
	assert_true(jr_str_eq(&k, "dtype", 5));
	assert_false(jr_str_eq(&k, "dtypx", 5));
	assert_false(jr_str_eq(&k, "dtyp", 4));
	assert_int_equal(jr_str_decode(&k, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "dtype");
	assert_int_equal(jr_string(&j, &s), 0);
	assert_int_equal(s.len, 1 + 2 + 4 + 1);
	assert_int_equal(jr_str_decode(&s, buf, sizeof(buf)), 0);
	assert_memory_equal(buf, "F\xc3\xa9\xf0\x9f\x98\x80\n", 9);
	assert_false(s.has_nul);

	assert_int_equal(jr_object_next(&j, &k), 1);
	assert_false(k.escaped);
	assert_true(jr_str_eq(&k, "n", 1));
	assert_int_equal(jr_array_begin(&j), 0);
	while (jr_array_next(&j) == 1) {
		assert_int_equal(jr_u64(&j, &v), 0);
		sum += v;
	}
	assert_int_equal(sum, 6);

	assert_int_equal(jr_object_next(&j, &k), 1);
	assert_int_equal(jr_string(&j, &s), 0);
	assert_true(s.has_nul);
	assert_int_equal(s.len, 3);
	assert_int_equal(jr_str_decode(&s, buf, sizeof(buf)), 0);
	assert_memory_equal(buf, "a\0b", 4);

	assert_int_equal(jr_object_next(&j, &k), 1);
	assert_int_equal(jr_peek(&j), JR_OBJECT);
	assert_int_equal(jr_skip(&j), 0);
	assert_int_equal(jr_object_next(&j, &k), 0);
	assert_int_equal(jr_finish(&j), 0);

	/* errors are sticky */
	jr_init(&j, "[x]", 3);
	assert_int_equal(jr_array_begin(&j), 0);
	assert_int_equal(jr_array_next(&j), 1);
	assert_int_equal(jr_u64(&j, &v), -EINVAL);
	assert_int_equal(jr_array_next(&j), -EINVAL);
	assert_int_equal(jr_finish(&j), -EINVAL);
	assert_int_equal(jr_erroff(&j), 1);

	/* a NULL buffer of length 0 (an empty mapping) is an empty document */
	jr_init(&j, NULL, 0);
	assert_int_equal(jr_peek(&j), JR_INVALID);
}

/* Writes s with json_write_string into a memory stream; returns the text. */
static char *
write_string(const char *s, size_t len, size_t *out_len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);

	assert_non_null(f);
	json_write_string(f, s, len);
	assert_int_equal(fclose(f), 0);
	*out_len = n;
	return buf;
}

/* Checks that text is one JSON string whose value is want[0..want_len), for
 * both readers. */
static void
assert_string_value(const char *text, size_t len, const char *want, size_t want_len)
{
	struct jr j;
	struct jr_str s;
	json_error_t err;
	json_t *v;
	char *dec = malloc(want_len + 8);

	jr_init(&j, text, len);
	assert_int_equal(jr_string(&j, &s), 0);
	assert_int_equal(jr_finish(&j), 0);
	assert_int_equal(s.len, want_len);
	assert_int_equal(jr_str_decode(&s, dec, want_len + 1), 0);
	assert_memory_equal(dec, want, want_len);
	free(dec);

	v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
	if (v == NULL)
		fail_msg("jansson refuses %.*s: %s", (int)len, text, err.text);
	assert_int_equal(json_string_length(v), want_len);
	assert_memory_equal(json_string_value(v), want, want_len);
	json_decref(v);
}

static void
test_write_string(void **state)
{
	static const struct {
		const char *in;
		size_t len;
		const char *out;
	} cases[] = {
		{ "", 0, "\"\"" },
		{ "abc", 3, "\"abc\"" },
		{ "a\"b\\c", 5, "\"a\\\"b\\\\c\"" },
		{ "\n\t\r\b\f", 5, "\"\\n\\t\\r\\b\\f\"" },
		{ "\x01\x1f", 2, "\"\\u0001\\u001f\"" },
		{ "a\0b", 3, "\"a\\u0000b\"" },
		{ "/\x7f", 2, "\"/\x7f\"" },
		{ "\xc3\xa9\xf0\x9f\x98\x80", 6, "\"\xc3\xa9\xf0\x9f\x98\x80\"" },
		{ "a\xffz", 3, "\"a\\ufffdz\"" },
		{ "\xc0\xaf", 2, "\"\\ufffd\\ufffd\"" },
		{ "\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"" },
		{ "\xe2\x82", 2, "\"\\ufffd\\ufffd\"" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t n;
		char *text = write_string(cases[i].in, cases[i].len, &n);

		assert_int_equal(n, strlen(cases[i].out));
		assert_memory_equal(text, cases[i].out, n);
		free(text);
	}
}

/* Every valid UTF-8 string survives a write and a read, in both readers;
 * random bytes always produce valid JSON. */
static void
test_write_string_round_trip(void **state)
{
	static const char *const pieces[] = { "a", "\"", "\\", "\n", "\x01", "\x7f", "\xc3\xa9",
		"\xe2\x82\xac", "\xf0\x9f\x98\x80", "/", " ", "\0", "\xef\xbf\xbf",
		"\xf4\x8f\xbf\xbf" };
	char s[256];
	uint32_t seed = 12345;

	for (int iter = 0; iter < 2000; iter++) {
		size_t len = 0, n;
		char *text;

		seed = seed * 1103515245 + 12345;
		for (int k = (int)(seed >> 16) % 40; k > 0; k--) {
			const char *p;
			size_t pl;

			seed = seed * 1103515245 + 12345;
			p = pieces[(seed >> 16) % (sizeof(pieces) / sizeof(pieces[0]))];
			pl = *p ? strlen(p) : 1;
			memcpy(s + len, p, pl);
			len += pl;
		}
		text = write_string(s, len, &n);
		assert_string_value(text, n, s, len);
		free(text);
	}
	/* random bytes: the output is always a valid JSON string */
	for (int iter = 0; iter < 2000; iter++) {
		size_t len, n;
		char *text;
		struct jr j;

		seed = seed * 1103515245 + 12345;
		len = (seed >> 16) % 64;
		for (size_t i = 0; i < len; i++) {
			seed = seed * 1103515245 + 12345;
			s[i] = (char)(seed >> 16);
		}
		text = write_string(s, len, &n);
		assert_int_equal(jr_validate(text, n, &j), 0);
		free(text);
	}
}

static void
test_quote(void **state)
{
	char buf[16];
	struct jr j;
	struct jr_str s;

	assert_string_equal(json_quote(buf, sizeof(buf), "abc", 3), "\"abc\"");
	assert_string_equal(json_quote(buf, sizeof(buf), "a\nb", 3), "\"a\\nb\"");
	/* exactly fits: 13 characters, 2 quotes and a NUL */
	assert_string_equal(json_quote(buf, sizeof(buf), "0123456789abc", 13),
		"\"0123456789abc\"");
	assert_string_equal(json_quote(buf, sizeof(buf), "0123456789abcd", 14),
		"\"0123456789...\"");
	assert_true(strlen(buf) < sizeof(buf));
	/* never cuts a character in half */
	assert_string_equal(json_quote(buf, sizeof(buf), "\xf0\x9f\x98\x80\xf0\x9f\x98\x80"
		"\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 16), "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80...\"");
	assert_string_equal(json_quote(buf, 8, "abcdefgh", 8), "\"ab...\"");

	jr_init(&j, "\"\\u0041\\n\\\"\"", 12);
	assert_int_equal(jr_string(&j, &s), 0);
	assert_string_equal(json_quote_str(buf, sizeof(buf), &s), "\"A\\n\\\"\"");
	{
		/* a long escaped string is cut in the quote, not overflowed */
		char doc[8 * 600 + 3], big[400];
		size_t p = 0;

		doc[p++] = '"';
		for (int i = 0; i < 600; i++)
			p += (size_t)sprintf(doc + p, "\\u00e9ab");
		doc[p++] = '"';
		jr_init(&j, doc, p);
		assert_int_equal(jr_string(&j, &s), 0);
		json_quote_str(big, sizeof(big), &s);
		assert_true(strlen(big) < sizeof(big));
		assert_non_null(strstr(big, "...\""));
		assert_memory_equal(big, "\"\xc3\xa9" "ab", 5);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grammar_valid),
		cmocka_unit_test(test_grammar_invalid),
		cmocka_unit_test(test_strings),
		cmocka_unit_test(test_numbers),
		cmocka_unit_test(test_u64),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_error_offset),
		cmocka_unit_test(test_cursor),
		cmocka_unit_test(test_decode_bounded),
		cmocka_unit_test(test_write_string),
		cmocka_unit_test(test_write_string_round_trip),
		cmocka_unit_test(test_quote),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
