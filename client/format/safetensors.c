/*
 * safetensors.c: validating a safetensors file and adding its tensors to an
 * index builder.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON,
 * then the data buffer; each tensor's data_offsets are relative to the start
 * of the data (8 + N). We check everything the header says before anyone
 * maps a tensor: the JSON is strict (json.c), each entry has exactly dtype,
 * shape and data_offsets, sizes match shapes, and the tensors tile the data
 * buffer exactly (sorted by offset, no gap, no overlap, nothing left over).
 * We are stricter than the reference implementation where a file could be
 * read two ways: duplicate keys, unknown fields, empty names and names with
 * NUL are errors.
 *
 * The parser reads a private copy of the header (st_parse_bytes, fed by
 * file_read_bytes() in file.c), never the file's mapping: whoever can write
 * the file could change the bytes between the scan of a string and its
 * decoding. Only the file size is needed for the data area.
 *
 * Speed: a large model's header holds tens of thousands of tensors and is
 * read on every load, so the common spelling of a tensor entry is
 * recognised byte for byte (read_canonical) and everything else goes
 * through the general cursor path, which has the same verdicts.
 *
 * Files that are not safetensors at all are common in practice (a Git LFS
 * pointer that was never pulled, an HTML error page saved by a download
 * script, a pickled PyTorch checkpoint: see diagnose.c): we recognise them
 * and say what they are.
 *
 * Metadata: __metadata__ (null or an object of string to string) is
 * validated in every file but added to the index only for file 0, so a
 * sharded model takes its metadata from its first shard (see shards.c).
 *
 * Layering: a reader (reader.h) only parses. This file opens nothing and
 * calls nothing above it; open.c reads a file through st_reader, shards.c
 * does so for each shard, and source.c lists st_reader in its table.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/diagnose.h"
#include "format/dtype.h"
#include "base/error.h"
#include "base/json.h"
#include "proto/le.h"
#include "format/safetensors.h"

/* A tensor's data range, kept to check the tiling once the header is read. */
struct st_entry {
	uint64_t begin, end;
	const char *raw; /* the name as in the JSON (escapes not decoded) */
	uint32_t raw_len;
	uint32_t seq;    /* position in the header, to break ties */
	bool escaped;
};

struct st_ctx {
	const char *name; /* the file, for messages */
	struct jr j;
	uint64_t data_start; /* 8 + N */
	uint64_t data_len;
	uint32_t file_no;
	struct index_builder *b;
	struct st_entry *entries;
	size_t n, cap;
	const struct dtype_info *last_dtype; /* the previous tensor's dtype */
	size_t last_dtype_len;
	bool sorted;     /* entries so far are in compare_entries() order */
	bool seen_meta;  /* __metadata__ was present */
	const struct jr_str *key; /* the tensor being read, for messages */
	char qname[320];            /* its name quoted, made by qn() on error */
	char decoded[INDEX_MAX_NAME + 1];
};

static const char *
type_name(enum jr_type t)
{
	switch (t) {
	case JR_NULL: return "null";
	case JR_FALSE: case JR_TRUE: return "a boolean";
	case JR_NUMBER: return "a number";
	case JR_STRING: return "a string";
	case JR_ARRAY: return "an array";
	case JR_OBJECT: return "an object";
	case JR_INVALID: break;
	}
	return "invalid JSON";
}

/*
 * Reports the reader's error. The context (e.g. `tensor "x": shape`) is
 * put in front; a number that is valid JSON but not a non-negative integer
 * is explained as such, anything else as invalid JSON at a file offset.
 */
__attribute__((format(printf, 2, 3))) static void
header_error_message(struct st_ctx *c, const char *fmt, ...)
{
	char what[400] = "";
	va_list ap;

	if (fmt != NULL) {
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
	}
	if (c->j.code == -EDOM)
		error_format("%s: %s%s%s", c->name, what, *what ? ": " : "", jr_errmsg(&c->j));
	else
		error_format("%s: %s%sinvalid JSON in the header at byte %llu: %s", c->name, what,
			*what ? ": " : "", 8 + (unsigned long long)jr_erroff(&c->j),
			jr_errmsg(&c->j));
}

/* Leaves the message and evaluates to -EINVAL (a macro, as error_set()). */
#define header_error(...) (header_error_message(__VA_ARGS__), -EINVAL)

/* The fewest header bytes a tensor takes:
 * "a":{"dtype":"U8","shape":[],"data_offsets":[0,0]}, so a header of n
 * bytes holds at most n / 48 tensors (a sizing hint, not a limit). */
#define ST_MIN_ENTRY_BYTES 48

/* Quotes a name for a message (decoding it first if it holds escapes;
 * json_quote_str() needs only raw, raw_len and escaped). */
static const char *
quote(char *dst, size_t cap, const char *raw, size_t raw_len, bool escaped)
{
	struct jr_str s = { .raw = raw, .raw_len = raw_len, .len = raw_len, .escaped = escaped };

	return json_quote_str(dst, cap, &s);
}

/* The current tensor's name, quoted for a message (on error paths only). */
static const char *
qn(struct st_ctx *c)
{
	return quote(c->qname, sizeof(c->qname), c->key->raw, c->key->raw_len, c->key->escaped);
}

/* Reads an array of non-negative integers into v (at most max). */
static int
read_u64_array(struct st_ctx *c, const char *field, uint64_t *v, uint32_t max, uint32_t *count)
{
	uint32_t n = 0;
	enum jr_type t;
	int r;

	if ((t = jr_peek(&c->j)) != JR_ARRAY)
		return t == JR_INVALID ? header_error(c, "tensor %s: %s", qn(c), field) :
			error_set(-EINVAL, "%s: tensor %s: %s is %s, expected an array", c->name,
				qn(c), field, type_name(t));
	if (jr_array_begin(&c->j) < 0)
		return header_error(c, "tensor %s: %s", qn(c), field);
	while ((r = jr_array_next(&c->j)) == 1) {
		if (n == max)
			return error_set(-EINVAL, "%s: tensor %s: %s has more than %u entries",
				c->name, qn(c), field, max);
		if ((t = jr_peek(&c->j)) != JR_NUMBER) {
			if (t == JR_INVALID)
				return header_error(c, "tensor %s: %s", qn(c), field);
			return error_set(-EINVAL,
				"%s: tensor %s: %s[%u] is %s, expected a non-negative integer",
				c->name, qn(c), field, n, type_name(t));
		}
		if (jr_u64(&c->j, &v[n]) < 0)
			return header_error(c, "tensor %s: %s[%u]", qn(c), field, n);
		n++;
	}
	if (r < 0)
		return header_error(c, "tensor %s: %s", qn(c), field);
	*count = n;
	return 0;
}

/* Appends a tensor's range for the tiling check. */
static int
add_entry(struct st_ctx *c, const struct jr_str *key, uint64_t begin, uint64_t end)
{
	struct st_entry *e;

	if (c->n == c->cap) {
		size_t ncap = c->cap ? c->cap * 2 : 256;

		if ((e = realloc(c->entries, ncap * sizeof(*e))) == NULL)
			return error_set(-ENOMEM, "%s: out of memory", c->name);
		c->entries = e;
		c->cap = ncap;
	}
	e = &c->entries[c->n];
	if (c->n > 0 && (begin < e[-1].begin ||
		(begin == e[-1].begin && begin == end && e[-1].begin != e[-1].end)))
		c->sorted = false;
	e->begin = begin;
	e->end = end;
	e->raw = key->raw;
	e->raw_len = (uint32_t)key->raw_len; /* < ST_MAX_HEADER */
	e->seq = (uint32_t)c->n;
	e->escaped = key->escaped;
	c->n++;
	return 0;
}

/* Finds a dtype by name, trying the previous tensor's first (most tensors
 * of a file share one). */
static const struct dtype_info *
lookup_dtype(struct st_ctx *c, const char *d, size_t n)
{
	const struct dtype_info *dt;

	if (c->last_dtype != NULL && n == c->last_dtype_len &&
		memcmp(d, c->last_dtype->name, n) == 0)
		return c->last_dtype;
	if ((dt = dtype_by_name(d, n)) != NULL) {
		c->last_dtype = dt;
		c->last_dtype_len = n;
	}
	return dt;
}

/*
 * Set to 0 by the tests and the fuzzer to compare the canonical fast path
 * with the general one; not for other use.
 */
int st_canonical_fast_path = 1;

/* Consumes the literal s (n bytes) at *p if it is there. */
static inline bool
canon_lit(const char **p, const char *end, const char *s, size_t n)
{
	if ((size_t)(end - *p) < n || memcmp(*p, s, n) != 0)
		return false;
	*p += n;
	return true;
}

/* Reads 0 or [1-9][0-9]{0,18} at *p (at most 19 digits cannot overflow; the
 * caller requires ',' or ']' next, so longer numbers, leading zeros,
 * fractions and exponents all fail and go to the general path). */
static inline bool
canon_u64(const char **pp, const char *end, uint64_t *v)
{
	const char *p = *pp;
	uint64_t x = 0;
	int n = 0;

	if (p >= end || *p < '0' || *p > '9')
		return false;
	if (*p == '0')
		p++;
	else
		for (; p < end && *p >= '0' && *p <= '9' && n < 19; p++, n++)
			x = x * 10 + (uint64_t)(*p - '0');
	*pp = p;
	*v = x;
	return true;
}

/*
 * Recognises the spelling every writer we know uses, byte for byte:
 *   {"dtype":"BF16","shape":[4096,11008],"data_offsets":[0,90177536]}
 * and reads it without the cursor, which halves the cost of a header. On
 * anything else (whitespace, another order, escapes, an unknown dtype, a
 * number that is not a plain integer, any error) it returns false having
 * consumed nothing, and the general path reads the value and explains what
 * is wrong. So both paths accept the same files with the same result; the
 * fuzzer compares them.
 */
static bool
read_canonical(struct st_ctx *c, const struct dtype_info **dt, uint64_t *shape, uint32_t *ndim,
	uint64_t *offsets)
{
	const char *p = jr_pos(&c->j), *end = jr_end(&c->j), *q;
	uint32_t n = 0;

	if (p == NULL || !canon_lit(&p, end, "{\"dtype\":\"", 10))
		return false;
	for (q = p; q < end && q - p < 15 &&
		((*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_'); q++)
		;
	if (q >= end || *q != '"' || (*dt = lookup_dtype(c, p, (size_t)(q - p))) == NULL)
		return false;
	p = q + 1;
	if (!canon_lit(&p, end, ",\"shape\":[", 10))
		return false;
	if (p < end && *p == ']') {
		p++;
	} else {
		for (;;) {
			if (n == INDEX_MAX_NDIM || !canon_u64(&p, end, &shape[n++]) || p >= end)
				return false;
			if (*p++ == ']')
				break;
			if (p[-1] != ',')
				return false;
		}
	}
	if (!canon_lit(&p, end, ",\"data_offsets\":[", 17) || !canon_u64(&p, end, &offsets[0]) ||
		!canon_lit(&p, end, ",", 1) || !canon_u64(&p, end, &offsets[1]) ||
		!canon_lit(&p, end, "]}", 2))
		return false;
	*ndim = n;
	jr_skip_to(&c->j, p);
	return true;
}

enum { F_DTYPE = 1, F_SHAPE = 2, F_OFFSETS = 4 };

/* Reads a tensor's object with the cursor: any spelling, every check. */
static int
read_general(struct st_ctx *c, const struct dtype_info **dtp, uint64_t *shape, uint32_t *ndim,
	uint64_t *offsets)
{
	const struct dtype_info *dt = NULL;
	struct jr_str field, s;
	uint32_t noff = 0;
	unsigned seen = 0;
	enum jr_type t;
	char sbuf[200];
	int r;

	if ((t = jr_peek(&c->j)) != JR_OBJECT)
		return t == JR_INVALID ? header_error(c, "tensor %s", qn(c)) :
			error_set(-EINVAL, "%s: tensor %s is %s, expected an object", c->name,
				qn(c), type_name(t));
	if (jr_object_begin(&c->j) < 0)
		return header_error(c, "tensor %s", qn(c));
	while ((r = jr_object_next(&c->j, &field)) == 1) {
		unsigned bit;

		if (jr_str_eq(&field, "dtype", 5))
			bit = F_DTYPE;
		else if (jr_str_eq(&field, "shape", 5))
			bit = F_SHAPE;
		else if (jr_str_eq(&field, "data_offsets", 12))
			bit = F_OFFSETS;
		else
			return error_set(-EINVAL, "%s: tensor %s: unknown field %s", c->name,
				qn(c),
				quote(sbuf, sizeof(sbuf), field.raw, field.raw_len, field.escaped));
		if (seen & bit)
			return error_set(-EINVAL, "%s: tensor %s: duplicate field %s", c->name,
				qn(c),
				quote(sbuf, sizeof(sbuf), field.raw, field.raw_len, field.escaped));
		seen |= bit;
		if (bit == F_DTYPE) {
			char d[16];

			if ((t = jr_peek(&c->j)) != JR_STRING)
				return t == JR_INVALID ?
					header_error(c, "tensor %s: dtype", qn(c)) :
					error_set(-EINVAL,
						"%s: tensor %s: dtype is %s, expected a string",
						c->name, qn(c), type_name(t));
			if (jr_string(&c->j, &s) < 0)
				return header_error(c, "tensor %s: dtype", qn(c));
			if (s.len < sizeof(d) && jr_str_decode(&s, d, sizeof(d)) == 0)
				dt = lookup_dtype(c, d, s.len);
			if (dt == NULL)
				return error_set(-EINVAL, "%s: tensor %s: unknown dtype %s",
					c->name, qn(c),
					quote(sbuf, sizeof(sbuf), s.raw, s.raw_len, s.escaped));
		} else if (bit == F_SHAPE) {
			if ((r = read_u64_array(c, "shape", shape, INDEX_MAX_NDIM, ndim)) < 0)
				return r;
		} else {
			if ((r = read_u64_array(c, "data_offsets", offsets, 2, &noff)) < 0)
				return r;
			if (noff != 2)
				return error_set(-EINVAL,
					"%s: tensor %s: data_offsets has %u entries, expected 2",
					c->name, qn(c), noff);
		}
	}
	if (r < 0)
		return header_error(c, "tensor %s", qn(c));
	if (seen != (F_DTYPE | F_SHAPE | F_OFFSETS))
		return error_set(-EINVAL, "%s: tensor %s: missing %s", c->name, qn(c),
			!(seen & F_DTYPE) ? "dtype" : !(seen & F_SHAPE) ? "shape" : "data_offsets");
	*dtp = dt;
	return 0;
}

/* Reads one tensor entry (its key already read) and adds it to the index. */
static int
parse_tensor(struct st_ctx *c, const struct jr_str *key)
{
	const struct dtype_info *dt = NULL;
	uint64_t shape[INDEX_MAX_NDIM], offsets[2] = { 0, 0 }, elements, nbytes;
	uint32_t ndim = 0;
	const char *name = key->raw;
	char sbuf[200];
	int r;

	if (key->len == 0)
		return error_set(-EINVAL, "%s: empty tensor name in the header at byte %llu",
			c->name, 8 + (unsigned long long)(key->raw - c->j.buf));
	c->key = key;
	if (key->escaped && key->len <= INDEX_MAX_NAME) {
		if (jr_str_decode(key, c->decoded, sizeof(c->decoded)) < 0)
			return error_set(-EINVAL, "%s: tensor %s: name cannot be decoded",
				c->name, qn(c));
		name = c->decoded;
	}
	if (key->len > INDEX_MAX_NAME)
		return error_set(-EINVAL, "%s: tensor %s: name of %zu bytes is longer than %d",
			c->name, qn(c), key->len, INDEX_MAX_NAME);
	if (key->has_nul)
		return error_set(-EINVAL, "%s: tensor %s: name contains a NUL character", c->name,
			qn(c));
	if (!(st_canonical_fast_path && read_canonical(c, &dt, shape, &ndim, offsets)) &&
		(r = read_general(c, &dt, shape, &ndim, offsets)) < 0)
		return r;

	r = dtype_nbytes(dt, shape, ndim, &elements, &nbytes);
	if (r == -EINVAL)
		return error_set(-EINVAL,
			"%s: tensor %s: %s %s is not a whole number of bytes (%u bits per "
			"element)", c->name, qn(c), dt->name,
			index_format_shape(sbuf, sizeof(sbuf), shape, ndim), dt->bits);
	if (r < 0)
		return error_set(-EINVAL, "%s: tensor %s: %s %s: size overflows 64 bits", c->name,
			qn(c), dt->name, index_format_shape(sbuf, sizeof(sbuf), shape, ndim));
	if (offsets[0] > offsets[1])
		return error_set(-EINVAL,
			"%s: tensor %s: data_offsets [%llu, %llu]: begin is after end",
			c->name, qn(c), (unsigned long long)offsets[0],
			(unsigned long long)offsets[1]);
	if (offsets[1] > c->data_len)
		return error_set(-EINVAL,
			"%s: tensor %s: data_offsets [%llu, %llu] extend past the end of the "
			"data (%llu bytes)", c->name, qn(c), (unsigned long long)offsets[0],
			(unsigned long long)offsets[1], (unsigned long long)c->data_len);
	if (offsets[1] - offsets[0] != nbytes)
		return error_set(-EINVAL,
			"%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes but %s %s "
			"needs %llu", c->name, qn(c), (unsigned long long)offsets[0],
			(unsigned long long)offsets[1],
			(unsigned long long)(offsets[1] - offsets[0]), dt->name,
			index_format_shape(sbuf, sizeof(sbuf), shape, ndim),
			(unsigned long long)nbytes);
	if ((r = index_add_tensor(c->b, name, key->len, dt->code, c->file_no, shape, ndim,
		     c->data_start + offsets[0], nbytes)) < 0)
		return r;
	return add_entry(c, key, offsets[0], offsets[1]);
}

/*
 * Orders entries by where they begin; at the same offset, zero-size tensors
 * first (they may share it with the tensor that starts there), then header
 * order, so "previous tensor" in a message is the one the header lists first.
 */
static int
compare_entries(const void *x, const void *y)
{
	const struct st_entry *a = x, *b = y;
	int az = a->begin == a->end, bz = b->begin == b->end;

	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	if (az != bz)
		return bz - az;
	return (a->seq > b->seq) - (a->seq < b->seq);
}

/* A decoded metadata key, for the duplicate check. */
struct st_key {
	const char *p;
	size_t len;
};

/* Byte order of two decoded metadata keys. */
static int
compare_keys(const void *x, const void *y)
{
	const struct st_key *a = x, *b = y;
	int c = memcmp(a->p, b->p, a->len < b->len ? a->len : b->len);

	return c != 0 ? c : (a->len > b->len) - (a->len < b->len);
}

/*
 * Rejects a key that appears twice among the n metadata keys (decoded: "a"
 * and "\u0061" are the same key). O(n log n) whatever the keys hold.
 */
static int
check_duplicate_keys(struct st_ctx *c, const struct jr_str *keys, size_t n)
{
	struct st_key *k;
	size_t total = 0;
	char *arena, *at;
	char kbuf[200];
	int r = 0;

	for (size_t i = 0; i < n; i++)
		total += keys[i].escaped ? keys[i].len + 1 : 0; /* < header size */
	k = malloc((n ? n : 1) * sizeof(*k));
	arena = malloc(total ? total : 1);
	if (k == NULL || arena == NULL) {
		free(k);
		free(arena);
		return error_set(-ENOMEM, "%s: out of memory", c->name);
	}
	at = arena;
	for (size_t i = 0; i < n; i++) {
		k[i].len = keys[i].len;
		if (keys[i].escaped) {
			if (jr_str_decode(&keys[i], at, keys[i].len + 1) < 0) {
				r = error_set(-EINVAL, "%s: __metadata__: a key cannot be decoded",
					c->name);
				goto out;
			}
			k[i].p = at;
			at += keys[i].len + 1;
		} else {
			k[i].p = keys[i].raw;
		}
	}
	qsort(k, n, sizeof(*k), compare_keys);
	for (size_t i = 1; i < n; i++)
		if (compare_keys(&k[i - 1], &k[i]) == 0) {
			r = error_set(-EINVAL, "%s: __metadata__: duplicate key %s", c->name,
				json_quote(kbuf, sizeof(kbuf), k[i].p, k[i].len));
			break;
		}
out:
	free(k);
	free(arena);
	return r;
}

/* Adds one metadata entry to the index, decoding escapes if needed. */
static int
add_meta(struct st_ctx *c, const struct jr_str *key, const struct jr_str *value)
{
	char *kd = NULL, *vd = NULL;
	int r;

	if ((key->escaped && (kd = malloc(key->len + 1)) == NULL) ||
		(value->escaped && (vd = malloc(value->len + 1)) == NULL)) {
		free(kd);
		return error_set(-ENOMEM, "%s: out of memory", c->name);
	}
	if ((kd != NULL && jr_str_decode(key, kd, key->len + 1) < 0) ||
		(vd != NULL && jr_str_decode(value, vd, value->len + 1) < 0)) {
		free(kd);
		free(vd);
		return error_set(-EINVAL, "%s: __metadata__: an entry cannot be decoded", c->name);
	}
	r = index_add_meta(c->b, kd != NULL ? kd : key->raw, key->len,
		vd != NULL ? vd : value->raw, value->len);
	free(kd);
	free(vd);
	return r;
}

/*
 * Reads __metadata__: null or an object of string to string, with no key
 * twice (checked here so every shard is checked, not only the one that
 * reaches the index). Entries go to the index for file 0 only.
 */
static int
parse_metadata(struct st_ctx *c)
{
	struct jr_str key, value, *keys = NULL, *k;
	size_t nkeys = 0, cap = 0;
	char kbuf[200];
	enum jr_type t;
	int r;

	if (c->seen_meta)
		return error_set(-EINVAL, "%s: duplicate __metadata__", c->name);
	c->seen_meta = true;
	t = jr_peek(&c->j);
	if (t == JR_NULL)
		return jr_null(&c->j) < 0 ? header_error(c, "__metadata__") : 0;
	if (t != JR_OBJECT)
		return t == JR_INVALID ? header_error(c, "__metadata__") :
			error_set(-EINVAL, "%s: __metadata__ is %s, expected an object or null",
				c->name, type_name(t));
	if (jr_object_begin(&c->j) < 0)
		return header_error(c, "__metadata__");
	while ((r = jr_object_next(&c->j, &key)) == 1) {
		if ((t = jr_peek(&c->j)) != JR_STRING || jr_string(&c->j, &value) < 0) {
			quote(kbuf, sizeof(kbuf), key.raw, key.raw_len, key.escaped);
			r = t != JR_STRING && t != JR_INVALID ?
				error_set(-EINVAL,
					"%s: __metadata__ %s: value is %s, expected a string",
					c->name, kbuf, type_name(t)) :
				header_error(c, "__metadata__ %s", kbuf);
			goto out;
		}
		if (key.has_nul || value.has_nul) {
			quote(kbuf, sizeof(kbuf), key.raw, key.raw_len, key.escaped);
			r = error_set(-EINVAL, "%s: __metadata__ %s: %s contains a NUL character",
				c->name, kbuf, key.has_nul ? "key" : "value");
			goto out;
		}
		if (nkeys == cap) {
			cap = cap ? cap * 2 : 16;
			if ((k = realloc(keys, cap * sizeof(*k))) == NULL) {
				r = error_set(-ENOMEM, "%s: out of memory", c->name);
				goto out;
			}
			keys = k;
		}
		keys[nkeys++] = key;
		if (c->file_no == 0 && (r = add_meta(c, &key, &value)) < 0)
			goto out;
	}
	if (r < 0)
		r = header_error(c, "__metadata__");
	else
		r = check_duplicate_keys(c, keys, nkeys);
out:
	free(keys);
	return r;
}

/*
 * Checks that the tensors tile the data buffer: in offset order, each
 * begins where the previous one ended (zero-size tensors may share an
 * offset), the first at 0 and the last at the end of the file.
 */
static int
check_tiling(struct st_ctx *c)
{
	char q1[320], q2[320];
	uint64_t pos = 0;
	size_t prev = 0;

	if (!c->sorted)
		qsort(c->entries, c->n, sizeof(*c->entries), compare_entries);
	for (size_t i = 0; i < c->n; i++) {
		const struct st_entry *e = &c->entries[i], *p = &c->entries[prev];

		if (e->begin < pos)
			return error_set(-EINVAL,
				"%s: tensor %s: data_offsets [%llu, %llu] overlap previous tensor "
				"%s [%llu, %llu]", c->name,
				quote(q1, sizeof(q1), e->raw, e->raw_len, e->escaped),
				(unsigned long long)e->begin, (unsigned long long)e->end,
				quote(q2, sizeof(q2), p->raw, p->raw_len, p->escaped),
				(unsigned long long)p->begin, (unsigned long long)p->end);
		if (e->begin > pos) {
			if (i == 0)
				return error_set(-EINVAL,
					"%s: tensor %s: data_offsets [%llu, %llu] leave a gap of "
					"%llu bytes at the start of the data", c->name,
					quote(q1, sizeof(q1), e->raw, e->raw_len, e->escaped),
					(unsigned long long)e->begin, (unsigned long long)e->end,
					(unsigned long long)e->begin);
			return error_set(-EINVAL,
				"%s: tensor %s: data_offsets [%llu, %llu] leave a gap of %llu "
				"bytes after previous tensor %s [%llu, %llu]", c->name,
				quote(q1, sizeof(q1), e->raw, e->raw_len, e->escaped),
				(unsigned long long)e->begin, (unsigned long long)e->end,
				(unsigned long long)(e->begin - pos),
				quote(q2, sizeof(q2), p->raw, p->raw_len, p->escaped),
				(unsigned long long)p->begin, (unsigned long long)p->end);
		}
		pos = e->end;
		prev = i;
	}
	if (pos != c->data_len) {
		if (c->n == 0)
			return error_set(-EINVAL,
				"%s: no tensors, but %llu bytes of data after the header", c->name,
				(unsigned long long)c->data_len);
		return error_set(-EINVAL,
			"%s: the last tensor %s ends at data offset %llu but the data is "
			"%llu bytes: %llu bytes at the end of the file belong to no tensor",
			c->name,
			quote(q1, sizeof(q1), c->entries[prev].raw, c->entries[prev].raw_len,
				c->entries[prev].escaped),
			(unsigned long long)pos, (unsigned long long)c->data_len,
			(unsigned long long)(c->data_len - pos));
	}
	return 0;
}

/* Reads the header object; every top-level key is __metadata__ or a tensor. */
static int
parse_header(struct st_ctx *c)
{
	struct jr_str key;
	enum jr_type t;
	int r;

	if ((t = jr_peek(&c->j)) != JR_OBJECT)
		return t == JR_INVALID ? header_error(c, NULL) :
			error_set(-EINVAL, "%s: the header is %s, expected a JSON object", c->name,
				type_name(t));
	if (jr_object_begin(&c->j) < 0)
		return header_error(c, NULL);
	while ((r = jr_object_next(&c->j, &key)) == 1) {
		if (jr_str_eq(&key, "__metadata__", 12))
			r = parse_metadata(c);
		else
			r = parse_tensor(c, &key);
		if (r < 0)
			return r;
	}
	if (r < 0)
		return header_error(c, NULL);
	if (jr_finish(&c->j) < 0)
		return header_error(c, NULL);
	return check_tiling(c);
}

/* The head a safetensors parse needs: the 8-byte length and the header it
 * announces (when the length is plausible; else the prefix, for messages). */
static uint64_t
st_head_len(const uint8_t *prefix, size_t len, uint64_t size)
{
	uint64_t n;

	if (len < 8)
		return len;
	n = get_le64(prefix);
	if (n > ST_MAX_HEADER || n > size - 8)
		return len;
	return 8 + n;
}

const struct format_reader st_reader = {
	.head_len = st_head_len,
	.max_head = 8 + ST_MAX_HEADER,
	.parse = st_parse_bytes,
};

int
st_parse_bytes(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b)
{
	const uint8_t *file = in->head;
	uint64_t size = in->size, n;
	struct st_ctx *c;
	int r;

	if (in->head_len > size)
		return error_set(-EIO, "%s: file changed while being read: %zu bytes read of a "
			"%llu-byte file", name, in->head_len, (unsigned long long)size);
	if ((r = diagnose_not_safetensors(name, file, in->head_len)) < 0)
		return r;
	n = get_le64(file);
	if (n > ST_MAX_HEADER) {
		if (diagnose_looks_like_text(file)) {
			char q[64];

			return error_set(-EINVAL,
				"%s: not a safetensors file: it starts with text %s where the "
				"8-byte header length should be", name,
				json_quote(q, sizeof(q), (const char *)file, 8));
		}
		return error_set(-EINVAL,
			"%s: header length %llu exceeds the maximum of %llu bytes",
			name, (unsigned long long)n, ST_MAX_HEADER);
	}
	if (n > size - 8)
		return error_set(-EINVAL,
			"%s: header length %llu, but only %llu bytes follow it (truncated file?)",
			name, (unsigned long long)n, (unsigned long long)(size - 8));
	if (n > in->head_len - 8)
		return error_set(-EIO, "%s: file changed while being read: header length %llu, "
			"but %zu header bytes were read", name, (unsigned long long)n,
			in->head_len - 8);
	/* Room for as many tensors as the header can hold, so that nothing
	 * is copied while growing: untouched room costs no memory. */
	if (index_builder_reserve(b, (size_t)n / ST_MIN_ENTRY_BYTES + 1, (size_t)n) < 0)
		return error_set(-ENOMEM, "%s: out of memory", name);
	if ((c = malloc(sizeof(*c))) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", name);
	c->name = name;
	c->data_start = 8 + n;
	c->data_len = size - 8 - n;
	c->file_no = file_no;
	c->b = b;
	c->n = 0;
	c->cap = (size_t)n / ST_MIN_ENTRY_BYTES + 1;
	if ((c->entries = malloc(c->cap * sizeof(*c->entries))) == NULL) {
		free(c);
		return error_set(-ENOMEM, "%s: out of memory", name);
	}
	c->sorted = true;
	c->seen_meta = false;
	c->key = NULL;
	c->last_dtype = NULL;
	c->last_dtype_len = 0;
	jr_init(&c->j, (const char *)file + 8, (size_t)n);
	r = parse_header(c);
	free(c->entries);
	free(c);
	return r;
}

int
st_parse(const char *name, const uint8_t *file, uint64_t size, uint32_t file_no,
	struct index_builder *b)
{
	struct file_bytes in = file_bytes_of(file, size);

	return st_parse_bytes(name, &in, file_no, b);
}
