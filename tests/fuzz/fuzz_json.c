/*
 * fuzz_json.c: libFuzzer harness for the JSON reader and writer
 * (client/base/json.c), differential against jansson.
 *
 * 1. Verdict: for any input, jr_validate() accepts exactly when
 *    json_loadb(JSON_DECODE_ANY | JSON_ALLOW_NUL) does, except where jansson
 *    legitimately differs (each exclusion below says why).
 * 2. Values: when both accept, walking the document with the cursor must
 *    find what jansson built: same types, same decoded strings (bytes and
 *    length, NUL included), same keys, same array lengths, same integers.
 * 3. Writer: json_write_string() of the raw input is always a valid JSON
 *    string for both readers and decodes back to the input when the input is
 *    valid UTF-8 (jansson's json_stringn decides that); json_quote() never
 *    writes past its buffer and agrees with json_write_string when it fits.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "fuzz_json: check failed at line %d: %s\n", __LINE__, \
				#cond);                                                  \
			abort();                                                         \
		}                                                                        \
	} while (0)

/* Decodes s into a malloc'd buffer. */
static char *
decode(const struct jr_str *s)
{
	char *d = malloc(s->len + 1);

	CHECK(d != NULL);
	CHECK(jr_str_decode(s, d, s->len + 1) == 0);
	return d;
}

/*
 * True if the object at the cursor has a key twice. jansson keeps the last
 * value of a duplicate key (RFC 8259 leaves this to the parser), so such an
 * object's values cannot be compared one by one.
 */
static int
has_duplicate_keys(const struct jr *at)
{
	struct jr j = *at; /* a copy: the caller's cursor does not move */
	struct jr_str k;
	char **keys = NULL;
	size_t *lens = NULL, n = 0;
	int dup = 0;

	CHECK(jr_object_begin(&j) == 0);
	while (jr_object_next(&j, &k) == 1) {
		char **more_keys = realloc(keys, (n + 1) * sizeof(*keys));
		size_t *more_lens;

		CHECK(more_keys != NULL);
		keys = more_keys;
		more_lens = realloc(lens, (n + 1) * sizeof(*lens));
		CHECK(more_lens != NULL);
		lens = more_lens;
		keys[n] = decode(&k);
		lens[n] = k.len;
		for (size_t i = 0; i < n && !dup; i++)
			dup = lens[i] == k.len && memcmp(keys[i], keys[n], k.len) == 0;
		n++;
		CHECK(jr_skip(&j) == 0);
	}
	for (size_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(lens);
	return dup;
}

static int
all_digits(const char *p, const char *end)
{
	for (; p < end; p++)
		if (*p < '0' || *p > '9')
			return 0;
	return 1;
}

/* Walks the value at the cursor and checks it against jansson's v. */
static void
compare(struct jr *j, json_t *v)
{
	struct jr_str s;
	const char *start;
	size_t i = 0;
	char *d;

	CHECK(v != NULL);
	switch (jr_peek(j)) {
	case JR_NULL:
		CHECK(json_is_null(v));
		CHECK(jr_null(j) == 0);
		return;
	case JR_TRUE:
		CHECK(json_is_true(v));
		CHECK(jr_skip(j) == 0);
		return;
	case JR_FALSE:
		CHECK(json_is_false(v));
		CHECK(jr_skip(j) == 0);
		return;
	case JR_STRING:
		CHECK(json_is_string(v));
		CHECK(jr_string(j, &s) == 0);
		CHECK(s.len == json_string_length(v));
		d = decode(&s);
		CHECK(memcmp(d, json_string_value(v), s.len) == 0);
		CHECK(s.has_nul == (memchr(d, '\0', s.len) != NULL));
		free(d);
		return;
	case JR_NUMBER:
		CHECK(json_is_number(v));
		start = jr_pos(j); /* after jr_peek: the number's first byte */
		CHECK(jr_skip(j) == 0);
		/* digits only: read it with jr_u64 and compare with jansson */
		if (json_is_integer(v) && all_digits(start, jr_pos(j))) {
			struct jr n;
			uint64_t u;

			jr_init(&n, start, (size_t)(jr_pos(j) - start));
			CHECK(jr_u64(&n, &u) == 0);
			CHECK(json_integer_value(v) >= 0 && u == (uint64_t)json_integer_value(v));
		}
		return;
	case JR_ARRAY:
		CHECK(json_is_array(v));
		CHECK(jr_array_begin(j) == 0);
		while (jr_array_next(j) == 1)
			compare(j, json_array_get(v, i++));
		CHECK(i == json_array_size(v));
		return;
	case JR_OBJECT:
		CHECK(json_is_object(v));
		if (has_duplicate_keys(j)) {
			CHECK(jr_skip(j) == 0);
			return;
		}
		CHECK(jr_object_begin(j) == 0);
		while (jr_object_next(j, &s) == 1) {
			d = decode(&s);
			compare(j, json_object_getn(v, d, s.len));
			free(d);
			i++;
		}
		CHECK(i == json_object_size(v));
		return;
	case JR_INVALID:
		break;
	}
	CHECK(!"the walk met an error in a document both readers accepted");
}

/* Checks json_write_string and json_quote on the raw bytes. */
static void
check_writer(const uint8_t *data, size_t size)
{
	char *text = NULL, quoted[64];
	size_t n = 0, cap;
	struct jr j;
	struct jr_str s;
	json_error_t err;
	json_t *v, *as_string;
	FILE *f = open_memstream(&text, &n);

	CHECK(f != NULL);
	json_write_string(f, (const char *)data, size);
	CHECK(fclose(f) == 0);

	jr_init(&j, text, n);
	CHECK(jr_string(&j, &s) == 0);
	CHECK(jr_finish(&j) == 0);
	v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
	CHECK(v != NULL && json_is_string(v));
	CHECK(json_string_length(v) == s.len);
	/* valid UTF-8 round-trips exactly (jansson's json_stringn checks it) */
	as_string = json_stringn((const char *)data, size);
	if (as_string != NULL) {
		char *d = decode(&s);

		CHECK(s.len == size && memcmp(d, data, size) == 0);
		free(d);
		json_decref(as_string);
	}
	json_decref(v);

	/* json_quote: NUL-terminated inside its buffer; the whole literal when
	 * it fits */
	cap = 8 + (size > 0 ? data[0] % (sizeof(quoted) - 8) : 0);
	memset(quoted, 0x55, sizeof(quoted));
	json_quote(quoted, cap, (const char *)data, size);
	CHECK(memchr(quoted, '\0', cap) != NULL);
	for (size_t i = cap; i < sizeof(quoted); i++)
		CHECK(quoted[i] == 0x55);
	if (n < cap)
		CHECK(strlen(quoted) == n && memcmp(quoted, text, n) == 0);
	else
		CHECK(strlen(quoted) >= 5 && strcmp(quoted + strlen(quoted) - 4, "...\"") == 0);
	free(text);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct jr j;
	json_error_t err;
	json_t *v;
	int r, skip = 0;

	r = jr_validate((const char *)data, size, &j);
	v = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);

	/* Exclusions, where jansson legitimately differs from RFC 8259 or from
	 * our limits (not bugs on either side):
	 * - nesting: we stop at JR_MAX_DEPTH (64), jansson at 2048;
	 * - numbers: jansson refuses integers beyond long long and reals beyond
	 *   double ("too big integer", "real number overflow"); the grammar has
	 *   no range;
	 * - jansson refuses "\u0000" inside an object key even with
	 *   JSON_ALLOW_NUL; the grammar allows it.
	 * - jansson (2.14) silently drops a raw NUL byte that directly follows a
	 *   number or a literal ("0\0", "[true\0]" are accepted: its lexer
	 *   "ungets" the byte into a buffer where NUL means empty). A raw NUL
	 *   is never valid JSON, so when the input holds one and only jansson
	 *   accepts, jansson is wrong.
	 * Duplicate keys need no exclusion: both readers accept them. */
	if (r == -E2BIG)
		skip = 1;
	if (v == NULL && (json_error_code(&err) == json_error_numeric_overflow ||
				 json_error_code(&err) == json_error_null_byte_in_key ||
				 json_error_code(&err) == json_error_stack_overflow))
		skip = 1;
	if (v != NULL && r != 0 && memchr(data, '\0', size) != NULL)
		skip = 1;
	if (!skip && (v != NULL) != (r == 0)) {
		fprintf(stderr, "fuzz_json: jr says %d (%s at %zu), jansson says %s (%s at %d)\n",
			r, jr_errmsg(&j), jr_erroff(&j), v ? "valid" : "invalid",
			v ? "" : err.text, v ? 0 : err.position);
		abort();
	}
	if (r == 0)
		CHECK(jr_errmsg(&j)[0] == '\0');
	else
		CHECK(jr_errmsg(&j)[0] != '\0' && jr_erroff(&j) <= size);
	if (r == 0 && v != NULL) {
		jr_init(&j, (const char *)data, size);
		compare(&j, v);
		CHECK(jr_finish(&j) == 0);
	}
	json_decref(v);

	if (size <= 4096)
		check_writer(data, size);
	return 0;
}
