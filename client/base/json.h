/*
 * json.h: a strict RFC 8259 JSON reader that does not allocate, and a JSON
 * string writer.
 *
 * Why our own: the safetensors header of a large model holds tens of
 * thousands of tensors and is validated on every load; a DOM parser
 * (jansson) costs about 4 us per tensor, which is most of the load time. This
 * reader is a cursor over the caller's buffer: the caller asks for the value
 * it expects next (an object, a key, a string, an integer) and the reader
 * checks the grammar as it goes. Strings come back as views into the buffer;
 * escapes are validated while scanning and decoded only on request.
 *
 * Strictness: UTF-8 is validated (overlong forms, UTF-8-encoded surrogates
 * and code points above U+10FFFF are rejected), escapes are checked (\uXXXX
 * surrogates must pair), control characters in strings are rejected, numbers
 * follow the grammar (no leading zeros, no '+', no bare '.'), nesting is
 * limited to JR_MAX_DEPTH and only whitespace may surround the top-level
 * value. Duplicate keys are not detected here (the grammar allows them);
 * callers that care check them.
 *
 * Errors are sticky: after the first error every call returns the same code.
 * Codes: -EINVAL for a grammar error, -E2BIG for nesting deeper than
 * JR_MAX_DEPTH, -EDOM when jr_u64() finds a valid number that is not a
 * non-negative integer below 2^64. jr_errmsg() and jr_erroff() say what
 * and where (byte offset from the start of the buffer).
 *
 * Names: the reader is jr_* ("JSON reader") and the writers json_*; the
 * reader cannot use json_* because jansson, which the tests and the fuzzer
 * link to compare against, owns json_string, json_null, JSON_OBJECT, ...
 */
#ifndef WC_JSON_H
#define WC_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define JR_MAX_DEPTH 64

enum jr_type {
	JR_INVALID = 0, /* not the start of a value (the reader holds an error) */
	JR_NULL,
	JR_FALSE,
	JR_TRUE,
	JR_NUMBER,
	JR_STRING,
	JR_ARRAY,
	JR_OBJECT,
};

/* A string as found in the buffer. */
struct jr_str {
	const char *raw; /* the bytes between the quotes, escapes not decoded */
	size_t raw_len;
	size_t len;   /* length in bytes once decoded (== raw_len if !escaped) */
	bool escaped; /* raw holds escapes: use jr_str_decode() for the value */
	bool has_nul; /* the decoded value contains U+0000 */
};

/* The reader. Fields are private; jr_init() sets them. */
struct jr {
	const char *buf;
	const char *p;
	const char *end;
	unsigned depth;
	uint64_t started; /* bit d-1: the container at depth d has an element */
	int code;         /* first error, 0 if none */
	size_t err_off;
	char err[96];
};

/* Starts reading buf[0..len). The buffer must outlive the reader and every
 * jr_str it returns. */
void jr_init(struct jr *j, const char *buf, size_t len);

/* Skips whitespace and returns the type of the next value without
 * consuming it; JR_INVALID (and an error) if none starts there. */
enum jr_type jr_peek(struct jr *j);

/* Consumes '{'. Then jr_object_next() returns 1 after reading a key and its
 * ':' (the caller then reads or skips the value), 0 after the closing '}',
 * or a negative code. */
int jr_object_begin(struct jr *j);
int jr_object_next(struct jr *j, struct jr_str *key);

/* Consumes '['. Then jr_array_next() returns 1 when a value follows (the
 * caller reads or skips it), 0 after the closing ']', or a negative code. */
int jr_array_begin(struct jr *j);
int jr_array_next(struct jr *j);

/* Reads a string value. */
int jr_string(struct jr *j, struct jr_str *out);

/* Reads a number that must be a non-negative integer that fits 64 bits.
 * -0, 4.0, 4e0 and 18446744073709551616 are valid JSON but -EDOM here. */
int jr_u64(struct jr *j, uint64_t *out);

/* Reads null. */
int jr_null(struct jr *j);

/* Reads and validates one value of any type, whatever its content. */
int jr_skip(struct jr *j);

/* Checks that only whitespace remains. */
int jr_finish(struct jr *j);

/* Validates buf[0..len) as one complete JSON document. */
int jr_validate(const char *buf, size_t len, struct jr *j);

/* The first error's message ("" if none) and byte offset. */
const char *jr_errmsg(const struct jr *j);
size_t jr_erroff(const struct jr *j);

/*
 * The cursor's position and end, for a format-specific fast path that
 * recognises one canonical spelling of a value by itself and leaves anything
 * else to the cursor. jr_pos() is NULL once the reader holds an error.
 * jr_skip_to() moves past what the fast path recognised, which must be one
 * complete, valid value at the current nesting level.
 */
static inline const char *
jr_pos(const struct jr *j)
{
	return j->code != 0 ? NULL : j->p;
}

static inline const char *
jr_end(const struct jr *j)
{
	return j->end;
}

static inline void
jr_skip_to(struct jr *j, const char *p)
{
	j->p = p;
}

/*
 * Writes the decoded value of s and a NUL to dst, which holds cap bytes
 * (s->len + 1 are needed). Never writes past dst[cap - 1] nor reads past the
 * raw bytes, even when they changed since the reader measured s: -ENOBUFS
 * when the value does not fit, -EINVAL when the bytes are no longer a valid
 * string of s->len bytes; dst then holds a NUL-terminated prefix.
 */
int jr_str_decode(const struct jr_str *s, char *dst, size_t cap);

/* True if the decoded value of s is exactly lit[0..n). Inline for the
 * common unescaped case, where a constant n lets the compiler compare in
 * place. */
bool jr_str_eq_escaped(const struct jr_str *s, const char *lit, size_t n);

static inline bool
jr_str_eq(const struct jr_str *s, const char *lit, size_t n)
{
	if (s->len != n)
		return false;
	if (s->escaped)
		return jr_str_eq_escaped(s, lit, n);
	for (size_t i = 0; i < n; i++)
		if (s->raw[i] != lit[i])
			return false;
	return true;
}

/* Length of the valid UTF-8 sequence at p, before end (1 to 4), or 0 when
 * the bytes there are not one (RFC 3629: no overlong forms, no surrogates,
 * nothing above U+10FFFF, no truncated sequence). p must be before end.
 * The one UTF-8 check of the JSON reader, WEIG strings and control lines. */
size_t json_utf8_seq(const unsigned char *p, const unsigned char *end);

/* Whether s[0..n) is UTF-8 throughout, by json_utf8_seq(). */
bool json_utf8_valid(const void *s, size_t n);

/*
 * Writes s[0..len) as a JSON string literal with its quotes: '"' and '\\' and
 * control characters are escaped (\n, \t, ... or \u00XX, including NUL), valid
 * UTF-8 is copied as is, and each byte of invalid UTF-8 becomes \ufffd, so the
 * output is always valid JSON.
 */
void json_write_string(FILE *f, const char *s, size_t len);

/* Writes ,"key":"value" (key is the caller's own text, value is escaped as
 * above): one field appended to an object being written. */
void json_write_field(FILE *f, const char *key, const char *value);

/*
 * Same escaping into dst (cap bytes, cap >= 8), always NUL-terminated; when
 * the literal does not fit, it is cut at a character boundary and ends with
 * "...\"". For quoting names in one-line error messages. Returns dst.
 */
char *json_quote(char *dst, size_t cap, const char *s, size_t len);

/* json_quote() of the decoded value of s (a string from this reader). */
char *json_quote_str(char *dst, size_t cap, const struct jr_str *s);

#endif
