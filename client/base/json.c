/*
 * json.c: the strict, allocation-free JSON cursor of json.h and the JSON
 * string writer.
 *
 * The reader walks the caller's buffer once. Strings are scanned eight bytes
 * at a time while they hold plain ASCII (the common case for tensor names);
 * any other byte drops to a careful path that validates UTF-8 and escapes.
 * Nothing is decoded or copied unless the caller asks (jr_str_decode), and
 * error messages are formatted only on failure.
 */
#include "base/json.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

/* ---- errors ---- */

/* Records the first error (sticky) at byte p and returns its code. */
__attribute__((format(printf, 4, 5))) static int
fail(struct jr *j, const char *p, int code, const char *fmt, ...)
{
	va_list ap;

	if (j->code != 0)
		return j->code;
	j->code = code;
	j->err_off = (size_t)(p - j->buf);
	va_start(ap, fmt);
	vsnprintf(j->err, sizeof(j->err), fmt, ap);
	va_end(ap);
	j->p = j->end; /* nothing more is read */
	return code;
}

const char *
jr_errmsg(const struct jr *j)
{
	return j->code != 0 ? j->err : "";
}

size_t
jr_erroff(const struct jr *j)
{
	return j->err_off;
}

void
jr_init(struct jr *j, const char *buf, size_t len)
{
	memset(j, 0, sizeof(*j));
	if (buf == NULL) /* an empty mapping: NULL + 0 is not valid C */
		buf = "", len = 0;
	j->buf = buf;
	j->p = buf;
	j->end = buf + len;
}

/* ---- lexical helpers ---- */

static inline const char *
skip_ws(const char *p, const char *end)
{
	while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
		p++;
	return p;
}

size_t
json_utf8_seq(const unsigned char *p, const unsigned char *end)
{
	size_t avail = (size_t)(end - p);
	unsigned c = p[0], lo = 0x80, hi = 0xbf;

	if (c < 0x80)
		return 1;
	if (c < 0xc2)
		return 0;
	if (c < 0xe0)
		return avail >= 2 && (p[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c < 0xf0) {
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
		if (avail < 3 || p[1] < lo || p[1] > hi || (p[2] & 0xc0) != 0x80)
			return 0;
		return 3;
	}
	if (c < 0xf5) {
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
		if (avail < 4 || p[1] < lo || p[1] > hi || (p[2] & 0xc0) != 0x80 ||
			(p[3] & 0xc0) != 0x80)
			return 0;
		return 4;
	}
	return 0;
}

bool
json_utf8_valid(const void *s, size_t n)
{
	const unsigned char *p = s, *end = p + n;
	size_t k;

	for (; p < end; p += k)
		if ((k = json_utf8_seq(p, end)) == 0)
			return false;
	return true;
}

static inline int
hexval(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Reads 4 hex digits at p (the caller checked they are in bounds). */
static inline int
hex4(const unsigned char *p)
{
	int a = hexval(p[0]), b = hexval(p[1]), c = hexval(p[2]), d = hexval(p[3]);

	if ((a | b | c | d) < 0)
		return -1;
	return (a << 12) | (b << 8) | (c << 4) | d;
}

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

/* Non-zero if some byte of the 8 at w is '"', '\\', a control character or
 * not ASCII: the bytes the fast string loop cannot pass over. */
static inline uint64_t
special8(uint64_t w)
{
	uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');

	return (((q - ONES) & ~q) | ((b - ONES) & ~b) | (w - ONES * 0x20) | w) & HIGHS;
}

/* ---- strings ---- */

/*
 * Scans the string whose opening quote is at j->p, validating escapes and
 * UTF-8, and leaves j->p after the closing quote.
 */
static int
scan_string(struct jr *j, struct jr_str *out)
{
	const unsigned char *start = (const unsigned char *)j->p + 1;
	const unsigned char *p = start, *end = (const unsigned char *)j->end;
	size_t removed = 0; /* raw bytes minus decoded bytes */
	bool escaped = false, has_nul = false;

	for (;;) {
		uint64_t w;

		while ((size_t)(end - p) >= 8) {
			memcpy(&w, p, 8);
			if (special8(w) != 0)
				break;
			p += 8;
		}
		while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
			p++;
		if (p >= end)
			return fail(j, (const char *)start - 1, -EINVAL, "unterminated string");
		if (*p == '"')
			break;
		if (*p == '\\') {
			int cp, lo;

			escaped = true;
			if (end - p < 2)
				return fail(j, (const char *)p, -EINVAL, "unterminated string");
			switch (p[1]) {
			case '"': case '\\': case '/': case 'b': case 'f':
			case 'n': case 'r': case 't':
				removed += 1;
				p += 2;
				continue;
			case 'u':
				break;
			default:
				return fail(j, (const char *)p, -EINVAL,
					"invalid escape in string");
			}
			if (end - p < 6 || (cp = hex4(p + 2)) < 0)
				return fail(j, (const char *)p, -EINVAL,
					"invalid \\u escape in string");
			if (cp >= 0xdc00 && cp <= 0xdfff)
				return fail(j, (const char *)p, -EINVAL,
					"lone low surrogate \\u%04x in string", (unsigned)cp);
			if (cp >= 0xd800 && cp <= 0xdbff) {
				if (end - p < 12 || p[6] != '\\' || p[7] != 'u' ||
					(lo = hex4(p + 8)) < 0xdc00 || lo > 0xdfff)
					return fail(j, (const char *)p, -EINVAL,
						"high surrogate \\u%04x not followed by a "
						"low surrogate",
						(unsigned)cp);
				removed += 12 - 4;
				p += 12;
				continue;
			}
			if (cp == 0)
				has_nul = true;
			removed += 6 - (cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3);
			p += 6;
		} else if (*p < 0x20) {
			return fail(j, (const char *)p, -EINVAL,
				"control character 0x%02x in string (must be escaped)", *p);
		} else {
			size_t n = json_utf8_seq(p, end);

			if (n == 0)
				return fail(j, (const char *)p, -EINVAL, "invalid UTF-8 in string");
			p += n;
		}
	}
	out->raw = (const char *)start;
	out->raw_len = (size_t)(p - start);
	out->len = out->raw_len - removed;
	out->escaped = escaped;
	out->has_nul = has_nul;
	j->p = (const char *)p + 1;
	return 0;
}

int
jr_string(struct jr *j, struct jr_str *out)
{
	if (j->code != 0)
		return j->code;
	j->p = skip_ws(j->p, j->end);
	if (j->p >= j->end || *j->p != '"')
		return fail(j, j->p, -EINVAL, "expected a string");
	return scan_string(j, out);
}

/*
 * Decodes the unit (one plain byte or one escape) at *pp, before end, into
 * out, advancing *pp; returns the number of bytes written (1 to 4), or 0 when
 * the bytes there are not a complete, valid escape. scan_string() validated
 * the string, but the bytes may have changed since (a buffer another process
 * writes), so every read is bounded by end and every escape checked again.
 */
static size_t
decode_unit(const char **pp, const char *end, char out[4])
{
	const unsigned char *p = (const unsigned char *)*pp;
	int cp, lo;

	if (*p != '\\') {
		out[0] = (char)*p;
		*pp += 1;
		return 1;
	}
	if (end - *pp < 2)
		return 0;
	switch (p[1]) {
	case 'b': out[0] = '\b'; break;
	case 'f': out[0] = '\f'; break;
	case 'n': out[0] = '\n'; break;
	case 'r': out[0] = '\r'; break;
	case 't': out[0] = '\t'; break;
	case '"': case '\\': case '/': out[0] = (char)p[1]; break;
	case 'u': goto unicode;
	default: return 0;
	}
	*pp += 2;
	return 1;
unicode:
	if (end - *pp < 6 || (cp = hex4(p + 2)) < 0 || (cp >= 0xdc00 && cp <= 0xdfff))
		return 0;
	if (cp >= 0xd800 && cp <= 0xdbff) {
		if (end - *pp < 12 || p[6] != '\\' || p[7] != 'u' || (lo = hex4(p + 8)) < 0 ||
			lo < 0xdc00 || lo > 0xdfff)
			return 0;
		cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
		*pp += 6;
	}
	*pp += 6;
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

int
jr_str_decode(const struct jr_str *s, char *dst, size_t cap)
{
	const char *p = s->raw, *end = s->raw + s->raw_len;
	size_t n = 0, k;
	char u[4];

	if (cap == 0)
		return -ENOBUFS;
	dst[0] = '\0';
	if (!s->escaped) {
		if (s->raw_len >= cap)
			return -ENOBUFS;
		memcpy(dst, s->raw, s->raw_len);
		dst[s->raw_len] = '\0';
		return 0;
	}
	while (p < end) {
		const char *bs = memchr(p, '\\', (size_t)(end - p));
		size_t run = (size_t)((bs != NULL ? bs : end) - p);

		if (run >= cap - n) {
			dst[n] = '\0';
			return -ENOBUFS;
		}
		memcpy(dst + n, p, run);
		n += run;
		p += run;
		if (p == end)
			break;
		if ((k = decode_unit(&p, end, u)) == 0) {
			dst[n] = '\0';
			return -EINVAL;
		}
		if (k >= cap - n) {
			dst[n] = '\0';
			return -ENOBUFS;
		}
		memcpy(dst + n, u, k);
		n += k;
	}
	dst[n] = '\0';
	return n == s->len ? 0 : -EINVAL;
}

bool
jr_str_eq_escaped(const struct jr_str *s, const char *lit, size_t n)
{
	const char *p = s->raw, *end = s->raw + s->raw_len;
	size_t i = 0;

	if (s->len != n)
		return false;
	while (p < end) {
		char u[4];
		size_t k = decode_unit(&p, end, u);

		if (k == 0 || k > n - i || memcmp(u, lit + i, k) != 0)
			return false;
		i += k;
	}
	return i == n;
}

/* ---- structure ---- */

enum jr_type
jr_peek(struct jr *j)
{
	if (j->code != 0)
		return JR_INVALID;
	j->p = skip_ws(j->p, j->end);
	if (j->p >= j->end) {
		fail(j, j->p, -EINVAL, "unexpected end of input, expected a value");
		return JR_INVALID;
	}
	switch (*j->p) {
	case '{': return JR_OBJECT;
	case '[': return JR_ARRAY;
	case '"': return JR_STRING;
	case 'n': return JR_NULL;
	case 't': return JR_TRUE;
	case 'f': return JR_FALSE;
	case '-': case '0': case '1': case '2': case '3': case '4':
	case '5': case '6': case '7': case '8': case '9':
		return JR_NUMBER;
	default:
		fail(j, j->p, -EINVAL, "unexpected byte 0x%02x, expected a value",
			(unsigned char)*j->p);
		return JR_INVALID;
	}
}

/* Opens a container whose bracket is c. */
static int
open_container(struct jr *j, char c, const char *what)
{
	if (j->code != 0)
		return j->code;
	j->p = skip_ws(j->p, j->end);
	if (j->p >= j->end || *j->p != c)
		return fail(j, j->p, -EINVAL, "expected %s", what);
	if (j->depth >= JR_MAX_DEPTH)
		return fail(j, j->p, -E2BIG, "nesting deeper than %d levels", JR_MAX_DEPTH);
	j->p++;
	j->depth++;
	j->started &= ~(1ull << (j->depth - 1));
	return 0;
}

/*
 * Steps to the next element of the container at the current depth whose
 * closing bracket is c: returns 0 after consuming the closing bracket, 1 when
 * an element follows (after consuming ',' unless it is the first).
 */
static int
next_element(struct jr *j, char c)
{
	uint64_t bit;

	if (j->code != 0)
		return j->code;
	bit = 1ull << (j->depth - 1);
	j->p = skip_ws(j->p, j->end);
	if (j->p >= j->end)
		return fail(j, j->p, -EINVAL, "unexpected end of input, expected ',' or '%c'", c);
	if (*j->p == c) {
		j->p++;
		j->depth--;
		return 0;
	}
	if ((j->started & bit) != 0) {
		if (*j->p != ',')
			return fail(j, j->p, -EINVAL, "expected ',' or '%c'", c);
		j->p++;
	} else {
		j->started |= bit;
	}
	return 1;
}

int
jr_object_begin(struct jr *j)
{
	return open_container(j, '{', "an object");
}

int
jr_object_next(struct jr *j, struct jr_str *key)
{
	int r = next_element(j, '}');

	if (r <= 0)
		return r;
	j->p = skip_ws(j->p, j->end);
	if (j->p >= j->end || *j->p != '"')
		return fail(j, j->p, -EINVAL, "expected a string key");
	if ((r = scan_string(j, key)) < 0)
		return r;
	j->p = skip_ws(j->p, j->end);
	if (j->p >= j->end || *j->p != ':')
		return fail(j, j->p, -EINVAL, "expected ':' after key");
	j->p++;
	return 1;
}

int
jr_array_begin(struct jr *j)
{
	return open_container(j, '[', "an array");
}

int
jr_array_next(struct jr *j)
{
	return next_element(j, ']');
}

/* ---- scalars ---- */

/*
 * Scans a number at p per the grammar -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
 * and returns the byte after it, or NULL (with an error) if it is malformed.
 */
static const char *
scan_number(struct jr *j, const char *p)
{
	const char *end = j->end, *start = p;

	if (p < end && *p == '-')
		p++;
	if (p >= end || *p < '0' || *p > '9')
		return fail(j, start, -EINVAL, "invalid number"), NULL;
	if (*p == '0') {
		p++;
		if (p < end && *p >= '0' && *p <= '9')
			return fail(j, start, -EINVAL, "invalid number (leading zero)"), NULL;
	} else {
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < end && *p == '.') {
		p++;
		if (p >= end || *p < '0' || *p > '9')
			return fail(j, start, -EINVAL, "invalid number (no digit after '.')"), NULL;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < end && (*p == '+' || *p == '-'))
			p++;
		if (p >= end || *p < '0' || *p > '9')
			return fail(j, start, -EINVAL,
				"invalid number (no digit in exponent)"), NULL;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	return p;
}

int
jr_u64(struct jr *j, uint64_t *out)
{
	const char *p, *q, *start, *end = j->end;
	uint64_t v = 0;

	if (j->code != 0)
		return j->code;
	p = start = skip_ws(j->p, end);
	/* Fast path: [1-9][0-9]{0,18} then a byte that cannot continue a
	 * number (at most 19 digits cannot overflow). */
	if (p < end && *p >= '1' && *p <= '9') {
		while (p < end && *p >= '0' && *p <= '9' && p - start < 19)
			v = v * 10 + (unsigned)(*p++ - '0');
		if (p < end && *p != '.' && *p != 'e' && *p != 'E' && *p != '-' &&
			(*p < '0' || *p > '9')) {
			j->p = p;
			*out = v;
			return 0;
		}
		v = 0;
	}
	if (start >= end || (*start != '-' && (*start < '0' || *start > '9')))
		return fail(j, start, -EINVAL, "expected a number");
	if ((q = scan_number(j, start)) == NULL)
		return j->code;
	/* [start, q) is a valid JSON number; it must be digits only (so -0,
	 * 4.0 and 4e0 are refused) and fit 64 bits. */
	for (p = start; p < q; p++) {
		if (*p < '0' || *p > '9')
			return fail(j, start, -EDOM, "%.*s is not a non-negative integer",
				(int)(q - start > 40 ? 40 : q - start), start);
		if (__builtin_mul_overflow(v, 10, &v) ||
			__builtin_add_overflow(v, (unsigned)(*p - '0'), &v))
			return fail(j, start, -EDOM,
				"%.*s is not a non-negative integer (larger than 2^64-1)",
				(int)(q - start > 40 ? 40 : q - start), start);
	}
	j->p = q;
	*out = v;
	return 0;
}

/* Consumes the literal lit (null, true or false). */
static int
literal(struct jr *j, const char *lit, size_t n)
{
	j->p = skip_ws(j->p, j->end);
	if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
		return fail(j, j->p, -EINVAL, "expected %s", lit);
	j->p += n;
	return 0;
}

int
jr_null(struct jr *j)
{
	if (j->code != 0)
		return j->code;
	return literal(j, "null", 4);
}

int
jr_skip(struct jr *j)
{
	struct jr_str s;
	const char *p;
	int r;

	switch (jr_peek(j)) {
	case JR_NULL: return literal(j, "null", 4);
	case JR_TRUE: return literal(j, "true", 4);
	case JR_FALSE: return literal(j, "false", 5);
	case JR_STRING: return scan_string(j, &s);
	case JR_NUMBER:
		if ((p = scan_number(j, j->p)) == NULL)
			return j->code;
		j->p = p;
		return 0;
	case JR_ARRAY:
		if ((r = jr_array_begin(j)) < 0)
			return r;
		while ((r = jr_array_next(j)) == 1)
			if ((r = jr_skip(j)) < 0)
				return r;
		return r;
	case JR_OBJECT:
		if ((r = jr_object_begin(j)) < 0)
			return r;
		while ((r = jr_object_next(j, &s)) == 1)
			if ((r = jr_skip(j)) < 0)
				return r;
		return r;
	case JR_INVALID:
		break;
	}
	return j->code;
}

int
jr_finish(struct jr *j)
{
	if (j->code != 0)
		return j->code;
	if (j->depth != 0)
		return fail(j, j->p, -EINVAL, "unterminated %s", "container");
	j->p = skip_ws(j->p, j->end);
	if (j->p != j->end)
		return fail(j, j->p, -EINVAL, "unexpected data after the JSON value");
	return 0;
}

int
jr_validate(const char *buf, size_t len, struct jr *j)
{
	int r;

	jr_init(j, buf, len);
	if ((r = jr_skip(j)) < 0)
		return r;
	return jr_finish(j);
}

/* ---- writing ---- */

/*
 * Escapes the character at s[i] (len bytes in all) into out (at most 6 bytes)
 * and returns how many bytes it wrote; *used receives how many input bytes it
 * took.
 */
static size_t
escape_unit(const unsigned char *s, size_t len, size_t i, char out[6], size_t *used)
{
	static const char hex[] = "0123456789abcdef";
	unsigned c = s[i];
	size_t n;

	*used = 1;
	if (c >= 0x80) {
		n = json_utf8_seq(s + i, s + len);
		if (n == 0) {
			/* out is an escape of 6 bytes, not a C string.
			 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
			memcpy(out, "\\ufffd", 6);
			return 6;
		}
		memcpy(out, s + i, n);
		*used = n;
		return n;
	}
	out[0] = '\\';
	switch (c) {
	case '"': out[1] = '"'; return 2;
	case '\\': out[1] = '\\'; return 2;
	case '\b': out[1] = 'b'; return 2;
	case '\f': out[1] = 'f'; return 2;
	case '\n': out[1] = 'n'; return 2;
	case '\r': out[1] = 'r'; return 2;
	case '\t': out[1] = 't'; return 2;
	default: break;
	}
	if (c < 0x20) {
		/* The escape's first 4 bytes; out is not a C string.
		 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
		memcpy(out, "\\u00", 4);
		out[4] = hex[c >> 4];
		out[5] = hex[c & 15];
		return 6;
	}
	out[0] = (char)c;
	return 1;
}

static inline bool
plain_byte(unsigned char c)
{
	return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

void
json_write_field(FILE *f, const char *key, const char *value)
{
	fprintf(f, ",\"%s\":", key);
	json_write_string(f, value, strlen(value));
}

void
json_write_string(FILE *f, const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0;

	fputc('"', f);
	while (i < len) {
		size_t run = i, used, n;
		char buf[6];

		while (run < len && plain_byte(u[run]))
			run++;
		if (run > i) {
			fwrite(s + i, 1, run - i, f);
			i = run;
			continue;
		}
		n = escape_unit(u, len, i, buf, &used);
		fwrite(buf, 1, n, f);
		i += used;
	}
	fputc('"', f);
}

/*
 * Quotes s[0..len) into dst (see json_quote). more says that s was cut
 * before its end: the literal then ends with "..." whatever fits.
 */
static char *
quote_impl(char *dst, size_t cap, const char *s, size_t len, bool more)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t pos = 1, cut = 1, i = 0;

	dst[0] = '"';
	while (i < len) {
		size_t used, n;
		char buf[6];

		n = escape_unit(u, len, i, buf, &used);
		if (pos + n > cap - 2) /* no room for it, the quote and the NUL */
			break;
		memcpy(dst + pos, buf, n);
		pos += n;
		if (pos <= cap - 5)
			cut = pos;
		i += used;
	}
	if (i < len || more) {
		memcpy(dst + cut, "...\"", 5);
		return dst;
	}
	dst[pos] = '"';
	dst[pos + 1] = '\0';
	return dst;
}

char *
json_quote(char *dst, size_t cap, const char *s, size_t len)
{
	return quote_impl(dst, cap, s, len, false);
}

char *
json_quote_str(char *dst, size_t cap, const struct jr_str *s)
{
	const char *p = s->raw, *end = s->raw + s->raw_len;
	char buf[1024];
	size_t n = 0, k;

	if (!s->escaped)
		return json_quote(dst, cap, s->raw, s->raw_len);
	/* Only the start can be shown: decode at most sizeof(buf) bytes. */
	while (p < end && n + 4 <= sizeof(buf)) {
		size_t unit = decode_unit(&p, end, buf + n);

		if (unit == 0) { /* changed since it was validated: stop there */
			p = end;
			break;
		}
		n += unit;
	}
	if (p < end) {
		/* Drop a multi-byte character cut at the end of buf. */
		for (k = n; k > 0 && n - k < 3 && ((unsigned char)buf[k - 1] & 0xc0) == 0x80; k--)
			;
		if (k > 0 && (unsigned char)buf[k - 1] >= 0xc0 &&
			json_utf8_seq((const unsigned char *)buf + k - 1,
				(const unsigned char *)buf + n) == 0)
			n = k - 1;
	}
	return quote_impl(dst, cap, buf, n, p < end);
}
