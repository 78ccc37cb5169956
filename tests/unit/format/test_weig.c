/*
 * test_weig.c: the WEIG reader (client/format/weig.c). Builds WEIG images in memory
 * with a small writer of its own (independent of client/lib/writer.c, so the
 * reader is checked against the spec rather than against our writer), then
 * breaks one rule at a time and checks the error code and message. Also
 * checks that valid files reach the index intact and that source_open()
 * opens a WEIG file.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/dtype.h"
#include "base/deadline.h"
#include "base/error.h"
#include "format/index.h"
#include "format/source.h"
#include "format/weig.h"
#include "testutil.h"
#include "lib/writer.h"

#define MAXT 8

/* Record field offsets (proto/FORMAT.md). */
enum { R_NAME = 0, R_DTYPE = 8, R_PAD = 12, R_SHAPE = 16, R_NDIM = 24, R_DATA = 32, R_SIZE = 40 };
/* Header field offsets. */
enum { H_VERSION = 4, H_COUNT = 8, H_TABLE = 16, H_DATA = 24, H_FSIZE = 32, H_FLAGS = 40,
	H_RES0 = 48, H_RES1 = 56 };

struct tw_tensor {
	const char *name;
	uint32_t dtype;
	uint32_t ndim;
	uint64_t shape[4];
	uint64_t nbytes;
};

/* A WEIG image and where its parts are, so tests can break them. */
struct img {
	uint8_t *buf;
	size_t len;
	int be;
	size_t n, nmeta;
	uint64_t data_offset, meta_table;
	uint64_t name_off[MAXT], shape_off[MAXT], data_off[MAXT];
	uint64_t key_off[MAXT], value_off[MAXT];
};

static void
st64(struct img *im, uint64_t off, uint64_t v)
{
	v = im->be ? htobe64(v) : htole64(v);
	memcpy(im->buf + off, &v, 8);
}

static void
st32(struct img *im, uint64_t off, uint32_t v)
{
	v = im->be ? htobe32(v) : htole32(v);
	memcpy(im->buf + off, &v, 4);
}

static uint64_t
ld64(const struct img *im, uint64_t off)
{
	uint64_t v;

	memcpy(&v, im->buf + off, 8);
	return im->be ? be64toh(v) : le64toh(v);
}

static uint64_t
up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Sets field of record i. */
static void
rec64(struct img *im, size_t i, unsigned field, uint64_t v)
{
	st64(im, WEIG_HEADER_SIZE + i * WEIG_RECORD_SIZE + field, v);
}

static void
rec32(struct img *im, size_t i, unsigned field, uint32_t v)
{
	st32(im, WEIG_HEADER_SIZE + i * WEIG_RECORD_SIZE + field, v);
}

/* Rewrites file_size and the trailer for the image's current length. */
static void
seal(struct img *im)
{
	st64(im, H_FSIZE, im->len);
	memcpy(im->buf + im->len - 16, WEIG_TRAILER_MAGIC, 8);
	st64(im, im->len - 8, im->len);
}

/*
 * Lays out tensors t[0..n) (in the given order, which tests may make
 * unsorted) and metadata meta[0..2*nmeta) the way proto/FORMAT.md describes.
 * min_data lets a test ask for a larger table area.
 */
static void
build(struct img *im, const struct tw_tensor *t, size_t n, const char *const *meta,
	size_t nmeta, int be, uint64_t min_data)
{
	uint64_t off = WEIG_HEADER_SIZE + n * WEIG_RECORD_SIZE, cur;

	memset(im, 0, sizeof(*im));
	im->be = be;
	im->n = n;
	im->nmeta = nmeta;
	im->meta_table = nmeta ? off : 0;
	off += nmeta * WEIG_META_ENTRY_SIZE;
	for (size_t i = 0; i < n; i++) {
		im->shape_off[i] = off;
		off += (uint64_t)8 * t[i].ndim;
	}
	for (size_t i = 0; i < n; i++) {
		im->name_off[i] = off;
		off += strlen(t[i].name) + 1;
	}
	for (size_t i = 0; i < nmeta; i++) {
		im->key_off[i] = off;
		off += strlen(meta[2 * i]) + 1;
		im->value_off[i] = off;
		off += strlen(meta[2 * i + 1]) + 1;
	}
	im->data_offset = up(off > min_data ? off : min_data, 4096);
	cur = im->data_offset;
	for (size_t i = 0; i < n; i++) {
		cur = up(cur, 64);
		im->data_off[i] = cur;
		cur += t[i].nbytes;
	}
	im->len = up(cur, 8) + 16;
	im->buf = calloc(1, im->len);
	assert_non_null(im->buf);
	st32(im, 0, WEIG_MAGIC);
	st32(im, H_VERSION, 1);
	st64(im, H_COUNT, n);
	st64(im, H_TABLE, WEIG_HEADER_SIZE);
	st64(im, H_DATA, im->data_offset);
	if (nmeta) {
		st64(im, H_FLAGS, 1);
		st64(im, H_RES0, im->meta_table);
		st64(im, H_RES1, nmeta);
	}
	for (size_t i = 0; i < n; i++) {
		rec64(im, i, R_NAME, im->name_off[i]);
		rec32(im, i, R_DTYPE, t[i].dtype);
		rec64(im, i, R_SHAPE, im->shape_off[i]);
		rec64(im, i, R_NDIM, t[i].ndim);
		rec64(im, i, R_DATA, im->data_off[i]);
		rec64(im, i, R_SIZE, t[i].nbytes);
		for (uint32_t d = 0; d < t[i].ndim; d++)
			st64(im, im->shape_off[i] + (uint64_t)8 * d, t[i].shape[d]);
		memcpy(im->buf + im->name_off[i], t[i].name, strlen(t[i].name) + 1);
		for (uint64_t k = 0; k < t[i].nbytes; k++)
			im->buf[im->data_off[i] + k] = (uint8_t)(i * 31 + k);
	}
	for (size_t i = 0; i < nmeta; i++) {
		st64(im, im->meta_table + 16 * i, im->key_off[i]);
		st64(im, im->meta_table + 16 * i + 8, im->value_off[i]);
		memcpy(im->buf + im->key_off[i], meta[2 * i], strlen(meta[2 * i]) + 1);
		memcpy(im->buf + im->value_off[i], meta[2 * i + 1], strlen(meta[2 * i + 1]) + 1);
	}
	seal(im);
}

/* The image most tests start from: three tensors (one a scalar) sorted by
 * name, two metadata entries. */
static const struct tw_tensor base_tensors[] = {
	{ "a.bias", 0, 1, { 4 }, 16 },           /* F32 [4] */
	{ "b.weight", 2, 2, { 2, 3 }, 12 },      /* BF16 [2, 3] */
	{ "c.scalar", 7, 0, { 0 }, 8 },          /* I64 [] */
};
static const char *const base_meta[] = { "format", "pt", "note", "h\xc3\xa9llo" };

static void
build_base(struct img *im, int be)
{
	build(im, base_tensors, 3, base_meta, 2, be, 0);
}

/* Parses an image; returns the code and leaves the message in error_get(). */
static int
parse(const struct img *im)
{
	struct index_builder *b = NULL;
	uint32_t no;
	int rc;

	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "t.weig", im->len, &no), 0);
	rc = weig_parse("t.weig", im->buf, im->len, no, b);
	index_builder_free(b);
	return rc;
}

/* Parses an image that must fail with code and a message holding what. */
static void
expect_fail(struct img *im, int code, const char *what)
{
	int rc = parse(im);

	if (rc != code || strstr(error_get(), what) == NULL)
		print_error("got %d \"%s\", expected %d with \"%s\"\n", rc, error_get(), code,
			what);
	assert_int_equal(rc, code);
	assert_non_null(strstr(error_get(), what));
	assert_non_null(strstr(error_get(), "t.weig: "));
	free(im->buf);
	im->buf = NULL;
}

/* A broken image of the base layout (helper for one-line tests). im is
 * the name of the variable it declares, which parentheses cannot wrap.
 * NOLINTNEXTLINE(bugprone-macro-parentheses) */
#define BASE(im) struct img im; build_base(&im, 0)

/* ---- valid files ---- */

static void
test_valid(void **state)
{
	struct index_builder *b = NULL;
	struct index_header h;
	struct index_tensor t;
	const char *k, *v;
	uint8_t *blob;
	size_t len;
	uint32_t no;
	BASE(im);

	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "t.weig", im.len, &no), 0);
	assert_int_equal(weig_parse("t.weig", im.buf, im.len, no, b), 0);
	assert_int_equal(index_builder_count(b), 3);
	assert_int_equal(index_build(b, "t.weig", &blob, &len), 0);
	assert_int_equal(index_open(blob, len, &h), 0);
	assert_int_equal(h.tensor_count, 3);
	assert_int_equal(h.meta_count, 2);
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(index_tensor_at(blob, &h, i, &t), 0);
		assert_string_equal(t.name, base_tensors[i].name);
		assert_int_equal(t.dtype, base_tensors[i].dtype);
		assert_int_equal(t.ndim, base_tensors[i].ndim);
		for (uint32_t d = 0; d < t.ndim; d++)
			assert_int_equal(t.shape[d], base_tensors[i].shape[d]);
		assert_int_equal(t.offset, im.data_off[i]);
		assert_int_equal(t.nbytes, base_tensors[i].nbytes);
		assert_int_equal(t.file, no);
	}
	/* Metadata comes back sorted by key. */
	assert_int_equal(index_meta_at(blob, &h, 0, &k, &v), 0);
	assert_string_equal(k, "format");
	assert_string_equal(v, "pt");
	assert_int_equal(index_meta_at(blob, &h, 1, &k, &v), 0);
	assert_string_equal(k, "note");
	assert_string_equal(v, "h\xc3\xa9llo");
	free(blob);
	index_builder_free(b);
	free(im.buf);
}

/* No metadata, no tensors: the smallest file is a header, a data region
 * start and a trailer. */
static void
test_valid_empty(void **state)
{
	struct img im;

	build(&im, NULL, 0, NULL, 0, 0, 0);
	assert_int_equal(im.len, 4096 + 16);
	assert_int_equal(ld64(&im, H_DATA), 4096);
	assert_int_equal(parse(&im), 0);
	free(im.buf);
}

/* Names are sorted by bytes ("B" < "a" < "z" < "\xc3\xa9"); empty tensors
 * may share an offset with another tensor (they overlap nothing); every
 * dtype code is accepted; a sub-byte type with a whole number of bytes is
 * fine. */
static void
test_valid_edge(void **state)
{
	struct tw_tensor t[] = {
		{ "B", 18, 1, { 4 }, 2 },          /* F4 [4]: 2 bytes */
		{ "a", 19, 1, { 4 }, 3 },          /* F6_E2M3 [4]: 3 bytes */
		{ "empty", 0, 2, { 0, 5 }, 0 },
		{ "z", 21, 1, { 2 }, 16 },         /* C64 */
		{ "\xc3\xa9", 12, 1, { 3 }, 3 },   /* BOOL */
	};
	struct img im;

	build(&im, t, 5, NULL, 0, 0, 0);
	rec64(&im, 2, R_DATA, im.data_off[1]);
	assert_int_equal(parse(&im), 0);
	free(im.buf);
}

/* ---- header ---- */

static void
test_bad_magic(void **state)
{
	BASE(im);

	im.buf[0] ^= 0xff;
	expect_fail(&im, -EINVAL, "not a WEIG file");
}

static void
test_too_small(void **state)
{
	struct img im = { 0 };

	im.buf = calloc(1, 80);
	im.len = 0;
	expect_fail(&im, -EINVAL, "too small");
	build_base(&im, 0);
	im.len = 70; /* the magic is there, the rest is cut */
	expect_fail(&im, -EINVAL, "too small for a WEIG header and trailer");
	build_base(&im, 0);
	im.len = 3;
	expect_fail(&im, -EINVAL, "too small");
}

static void
test_big_endian(void **state)
{
	struct index_builder *b = NULL;
	struct index_header h;
	struct index_tensor t;
	uint8_t *blob;
	size_t len;
	uint32_t no;
	struct img im;

	build_base(&im, 1);
	/* The reader for big-endian files reads it, shapes in host order. */
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "t.weig", im.len, &no), 0);
	assert_int_equal(weig_parse_big_endian("t.weig", im.buf, im.len, no, b), 0);
	assert_int_equal(index_build(b, "t.weig", &blob, &len), 0);
	assert_int_equal(index_open(blob, len, &h), 0);
	assert_int_equal(index_tensor_at(blob, &h, 1, &t), 0);
	assert_string_equal(t.name, "b.weight");
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 2);
	assert_int_equal(t.shape[1], 3);
	assert_int_equal(t.offset, im.data_off[1]);
	free(blob);
	index_builder_free(b);

	/* weig_parse refuses it and says what to do. */
	assert_int_equal(parse(&im), -EPROTO);
	assert_non_null(strstr(error_get(), "big-endian"));
	assert_non_null(strstr(error_get(), "zero-copy"));
	assert_non_null(strstr(error_get(), "wcachectl convert t.weig"));
	free(im.buf);

	/* The big-endian reader refuses a little-endian file. */
	build_base(&im, 0);
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "t.weig", im.len, &no), 0);
	assert_int_equal(weig_parse_big_endian("t.weig", im.buf, im.len, no, b), -EPROTO);
	assert_non_null(strstr(error_get(), "little-endian"));
	index_builder_free(b);
	free(im.buf);

	/* A big-endian file is checked like any other. */
	build_base(&im, 1);
	rec64(&im, 0, R_SIZE, 17);
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "t.weig", im.len, &no), 0);
	assert_int_equal(weig_parse_big_endian("t.weig", im.buf, im.len, no, b), -EINVAL);
	assert_non_null(strstr(error_get(), "does not match shape"));
	index_builder_free(b);
	free(im.buf);
}

static void
test_version(void **state)
{
	BASE(im);

	st32(&im, H_VERSION, 2);
	expect_fail(&im, -ENOTSUP, "version 2 is not supported");
}

static void
test_file_size_mismatch(void **state)
{
	BASE(im);

	st64(&im, H_FSIZE, im.len + 4096);
	expect_fail(&im, -EINVAL, "header says file_size");
}

static void
test_truncated(void **state)
{
	BASE(im);

	im.len -= 100;
	expect_fail(&im, -EINVAL, "truncated");
}

static void
test_appended(void **state)
{
	BASE(im);

	/* 16 more bytes that even look like a trailer. */
	im.buf = realloc(im.buf, im.len + 16);
	memcpy(im.buf + im.len, im.buf + im.len - 16, 16);
	im.len += 16;
	expect_fail(&im, -EINVAL, "data appended");
}

static void
test_bad_trailer(void **state)
{
	BASE(im);

	/* A preallocated copy whose end was never written: zeros. */
	memset(im.buf + im.len - 16, 0, 16);
	expect_fail(&im, -EINVAL, "trailer");
	build_base(&im, 0);
	st64(&im, im.len - 8, im.len - 1);
	expect_fail(&im, -EINVAL, "missing or damaged");
	build_base(&im, 0);
	im.buf[im.len - 12] = 'X';
	expect_fail(&im, -EINVAL, "trailer");
}

static void
test_unknown_flags(void **state)
{
	BASE(im);

	st64(&im, H_FLAGS, 1 | 4);
	expect_fail(&im, -ENOTSUP, "unknown flags 0x4");
	build_base(&im, 0);
	st64(&im, H_FLAGS, 1ull << 63 | 1);
	expect_fail(&im, -ENOTSUP, "unknown flags");
}

static void
test_reserved_nonzero(void **state)
{
	struct img im;

	build(&im, base_tensors, 3, NULL, 0, 0, 0);
	st64(&im, H_RES1, 1);
	expect_fail(&im, -EINVAL, "must be 0 when the metadata flag is clear");
	build(&im, base_tensors, 3, NULL, 0, 0, 0);
	st64(&im, H_RES0, 64);
	expect_fail(&im, -EINVAL, "reserved fields");
}

static void
test_data_offset(void **state)
{
	BASE(im);

	st64(&im, H_DATA, im.data_offset + 64); /* not a multiple of 4096 */
	expect_fail(&im, -EINVAL, "data_offset");
	build_base(&im, 0);
	st64(&im, H_DATA, 0);
	expect_fail(&im, -EINVAL, "data_offset 0 must be");
	build_base(&im, 0);
	st64(&im, H_DATA, up(im.len, 4096)); /* beyond the trailer */
	expect_fail(&im, -EINVAL, "between 64 and the trailer");
}

/* ---- record table ---- */

static void
test_record_table_bounds(void **state)
{
	BASE(im);

	st64(&im, H_COUNT, 200); /* 200 * 48 bytes run into the data region */
	expect_fail(&im, -EINVAL, "record table");
	build_base(&im, 0);
	st64(&im, H_COUNT, UINT64_MAX / 16); /* count * 48 overflows */
	expect_fail(&im, -EINVAL, "overflow");
	build_base(&im, 0);
	st64(&im, H_TABLE, 32); /* inside the header */
	expect_fail(&im, -EINVAL, "record table [32");
	build_base(&im, 0);
	st64(&im, H_TABLE, im.data_offset);
	expect_fail(&im, -EINVAL, "outside the table area");
	build_base(&im, 0);
	st64(&im, H_TABLE, UINT64_MAX - 8);
	expect_fail(&im, -EINVAL, "record table");
	build_base(&im, 0);
	st64(&im, H_TABLE, 68);
	expect_fail(&im, -EINVAL, "not a multiple of 8");
}

static void
test_pad_nonzero(void **state)
{
	BASE(im);

	rec32(&im, 1, R_PAD, 3);
	expect_fail(&im, -EINVAL, "tensor \"b.weight\": pad is 3");
}

/* ---- names ---- */

static void
test_name_bounds(void **state)
{
	BASE(im);

	rec64(&im, 0, R_NAME, im.data_offset); /* in the data region */
	expect_fail(&im, -EINVAL, "tensor record 0: name offset");
	build_base(&im, 0);
	rec64(&im, 1, R_NAME, 8); /* in the header */
	expect_fail(&im, -EINVAL, "outside the table area");
	build_base(&im, 0);
	rec64(&im, 2, R_NAME, UINT64_MAX);
	expect_fail(&im, -EINVAL, "tensor record 2: name offset");
}

static void
test_name_no_nul(void **state)
{
	BASE(im);

	/* The last string and the padding after it, up to the data region. */
	memset(im.buf + im.value_off[1], 'x', im.data_offset - im.value_off[1]);
	rec64(&im, 2, R_NAME, im.value_off[1]);
	expect_fail(&im, -EINVAL, "has no NUL before the end of the table area");
}

static void
test_name_too_long(void **state)
{
	struct img im;

	build(&im, base_tensors, 3, NULL, 0, 0, 16384);
	memset(im.buf + 8192, 'x', INDEX_MAX_NAME + 1);
	rec64(&im, 2, R_NAME, 8192);
	expect_fail(&im, -EINVAL, "longer than 4096 bytes");
	/* Exactly the limit is fine (and sorts after "b.weight"). */
	build(&im, base_tensors, 3, NULL, 0, 0, 16384);
	memset(im.buf + 8192, 'x', INDEX_MAX_NAME);
	rec64(&im, 2, R_NAME, 8192);
	assert_int_equal(parse(&im), 0);
	free(im.buf);
}

static void
test_name_utf8(void **state)
{
	static const char *const bad[] = {
		"\xff", "a\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
		"\xc3", "\xe2\x82",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct tw_tensor t = { bad[i], 4, 1, { 1 }, 1 };
		struct img im;

		build(&im, &t, 1, NULL, 0, 0, 0);
		expect_fail(&im, -EINVAL, "tensor record 0: name at offset");
		build(&im, &t, 1, NULL, 0, 0, 0);
		expect_fail(&im, -EINVAL, "is not valid UTF-8");
	}
}

static void
test_name_empty(void **state)
{
	BASE(im);

	/* The byte before the first name is the NUL of nothing: point at the
	 * NUL ending "a.bias". */
	rec64(&im, 0, R_NAME, im.name_off[0] + strlen("a.bias"));
	expect_fail(&im, -EINVAL, "tensor record 0: name is empty");
}

static void
test_unsorted(void **state)
{
	BASE(im);

	rec64(&im, 0, R_NAME, im.name_off[1]);
	rec64(&im, 1, R_NAME, im.name_off[0]);
	expect_fail(&im, -EINVAL, "tensor \"a.bias\": records are not sorted by name");
}

static void
test_duplicate(void **state)
{
	BASE(im);

	rec64(&im, 1, R_NAME, im.name_off[0]);
	expect_fail(&im, -EINVAL, "tensor \"a.bias\": duplicate name");
}

/* ---- dtype, shape and size ---- */

static void
test_unknown_dtype(void **state)
{
	BASE(im);

	rec32(&im, 1, R_DTYPE, DTYPE_COUNT);
	expect_fail(&im, -EINVAL, "tensor \"b.weight\": unknown dtype code 22");
	build_base(&im, 0);
	rec32(&im, 0, R_DTYPE, UINT32_MAX);
	expect_fail(&im, -EINVAL, "unknown dtype code 4294967295");
}

static void
test_shape_bounds(void **state)
{
	BASE(im);

	rec64(&im, 1, R_SHAPE, im.data_offset - 8); /* 2 dims run into data */
	expect_fail(&im, -EINVAL, "tensor record 1: shape");
	build_base(&im, 0);
	rec64(&im, 1, R_SHAPE, UINT64_MAX - 7);
	expect_fail(&im, -EINVAL, "outside the table area");
	build_base(&im, 0);
	rec64(&im, 1, R_SHAPE, im.shape_off[1] + 4);
	expect_fail(&im, -EINVAL, "shape offset");
	build_base(&im, 0);
	rec64(&im, 1, R_NDIM, INDEX_MAX_NDIM + 1);
	expect_fail(&im, -EINVAL, "65 dimensions, more than 64");
	build_base(&im, 0);
	rec64(&im, 1, R_NDIM, UINT64_MAX);
	expect_fail(&im, -EINVAL, "dimensions");
}

static void
test_data_size_mismatch(void **state)
{
	BASE(im);

	rec64(&im, 1, R_SIZE, 13);
	expect_fail(&im, -EINVAL, "tensor \"b.weight\": data_size 13 does not match shape"
				  " [2, 3] of BF16 (12 bytes)");
	/* The scalar: an empty shape is one element. */
	build_base(&im, 0);
	rec64(&im, 2, R_SIZE, 0);
	expect_fail(&im, -EINVAL, "shape [] of I64 (8 bytes)");
	/* Same size, other dtype. */
	build_base(&im, 0);
	rec32(&im, 0, R_DTYPE, 6); /* F64 [4] is 32 bytes */
	expect_fail(&im, -EINVAL, "does not match");
}

static void
test_shape_overflow(void **state)
{
	BASE(im);

	st64(&im, im.shape_off[1], 1ull << 33);
	st64(&im, im.shape_off[1] + 8, 1ull << 31);
	expect_fail(&im, -EINVAL, "shape [8589934592, 2147483648] of BF16 overflows 64 bits");
}

/* The overflow rule does not depend on the order of the dimensions: with a
 * zero dimension first or last, 2^63 elements of 16 bits overflow. */
static void
test_shape_overflow_any_order(void **state)
{
	BASE(im);

	st64(&im, im.shape_off[1], 0);
	st64(&im, im.shape_off[1] + 8, 1ull << 63);
	rec64(&im, 1, R_SIZE, 0);
	expect_fail(&im, -EINVAL, "shape [0, 9223372036854775808] of BF16 overflows 64 bits");
	build_base(&im, 0);
	rec64(&im, 1, R_SIZE, 0);
	st64(&im, im.shape_off[1], 1ull << 63);
	st64(&im, im.shape_off[1] + 8, 0);
	expect_fail(&im, -EINVAL, "shape [9223372036854775808, 0] of BF16 overflows 64 bits");
}

static void
test_sub_byte_fraction(void **state)
{
	BASE(im);

	rec32(&im, 0, R_DTYPE, 18); /* F4 */
	st64(&im, im.shape_off[0], 3);
	expect_fail(&im, -EINVAL, "not a whole number of bytes");
}

/* ---- data ---- */

static void
test_data_bounds(void **state)
{
	BASE(im);

	rec64(&im, 0, R_DATA, im.data_offset - 64); /* before the data region */
	expect_fail(&im, -EINVAL, "tensor \"a.bias\": data [");
	build_base(&im, 0);
	rec64(&im, 2, R_DATA, im.len - 20); /* runs into the trailer */
	expect_fail(&im, -EINVAL, "outside the data region");
	build_base(&im, 0);
	rec64(&im, 2, R_DATA, UINT64_MAX - 63);
	expect_fail(&im, -EINVAL, "outside the data region");
	build_base(&im, 0);
	rec64(&im, 0, R_DATA, 1024); /* in the tables */
	expect_fail(&im, -EINVAL, "outside the data region");
}

static void
test_misaligned_data(void **state)
{
	BASE(im);

	rec64(&im, 0, R_DATA, im.data_off[0] + 32);
	expect_fail(&im, -EINVAL, "tensor \"a.bias\": data offset 4128 is not a multiple of 64");
}

static void
test_overlap(void **state)
{
	struct tw_tensor t[] = {
		{ "a", 4, 1, { 64 }, 64 },   /* U8 [64] */
		{ "b", 4, 1, { 128 }, 128 }, /* U8 [128] */
	};
	struct img im;

	build_base(&im, 0);
	rec64(&im, 2, R_DATA, im.data_off[0]);
	expect_fail(&im, -EINVAL, "tensor \"a.bias\": data [4096, +16) overlaps tensor"
				  " \"c.scalar\" [4096, +8)");
	/* A partial overlap, found whatever the order of the records. */
	build(&im, t, 2, NULL, 0, 0, 0);
	rec64(&im, 0, R_DATA, 4160);
	rec64(&im, 1, R_DATA, 4096);
	expect_fail(&im, -EINVAL, "tensor \"a\": data [4160, +64) overlaps tensor \"b\""
				  " [4096, +128)");
	/* Adjacent ranges do not overlap. */
	build(&im, t, 2, NULL, 0, 0, 0);
	rec64(&im, 0, R_DATA, 4096 + 128);
	rec64(&im, 1, R_DATA, 4096);
	assert_int_equal(parse(&im), 0);
	free(im.buf);
}

/* ---- metadata ---- */

static void
test_metadata_table(void **state)
{
	BASE(im);

	st64(&im, H_RES0, im.data_offset - 16); /* 2 entries run into data */
	expect_fail(&im, -EINVAL, "metadata table");
	build_base(&im, 0);
	st64(&im, H_RES1, UINT64_MAX / 8);
	expect_fail(&im, -EINVAL, "metadata table");
	build_base(&im, 0);
	st64(&im, H_RES0, WEIG_HEADER_SIZE + 48); /* inside the record table */
	expect_fail(&im, -EINVAL, "overlaps the record table");
	build_base(&im, 0);
	st64(&im, H_RES0, im.meta_table + 4);
	expect_fail(&im, -EINVAL, "metadata table offset");
}

static void
test_metadata_strings(void **state)
{
	BASE(im);

	st64(&im, im.meta_table + 8, im.data_offset); /* value 0 */
	expect_fail(&im, -EINVAL, "metadata entry 0: value offset");
	build_base(&im, 0);
	st64(&im, im.meta_table + 16, 0); /* key 1 */
	expect_fail(&im, -EINVAL, "metadata entry 1: key offset");
	build_base(&im, 0);
	im.buf[im.value_off[1] + 2] = 0xc3; /* "h\xc3\xc3llo" */
	expect_fail(&im, -EINVAL, "metadata entry 1: value at offset");
	build_base(&im, 0);
	memset(im.buf + im.value_off[1], 'v', im.data_offset - im.value_off[1]);
	expect_fail(&im, -EINVAL, "has no NUL");
}

static void
test_metadata_order(void **state)
{
	static const char *const dup[] = { "k", "1", "k", "2" };
	static const char *const unsorted[] = { "b", "1", "a", "2" };
	static const char *const empty[] = { "", "", "k", "" };
	struct img im;

	build(&im, base_tensors, 3, dup, 2, 0, 0);
	expect_fail(&im, -EINVAL, "metadata key \"k\": duplicate key");
	build(&im, base_tensors, 3, unsorted, 2, 0, 0);
	expect_fail(&im, -EINVAL, "metadata key \"a\": entries are not sorted");
	/* An empty key and empty values are allowed (safetensors allows them). */
	build(&im, base_tensors, 3, empty, 2, 0, 0);
	assert_int_equal(parse(&im), 0);
	free(im.buf);
}

/* ---- source_open() of a WEIG file ---- */

static void
test_open(void **state)
{
	struct model_source s;
	struct index_header h;
	struct index_tensor t;
	char *dir = tu_tmpdir(), *path;
	int fds = tu_count_fds();
	BASE(im);

	path = tu_write(dir, "m.weig", im.buf, im.len);
	assert_int_equal(source_open(path, &s), 0);
	assert_int_equal(s.format, FORMAT_WEIG);
	assert_int_equal(s.nfiles, 1);
	assert_int_equal(s.files[0].size, im.len);
	assert_int_equal(index_open(s.index, s.index_len, &h), 0);
	assert_int_equal(h.tensor_count, 3);
	assert_int_equal(index_find(s.index, &h, "c.scalar", &t), 0);
	assert_int_equal(t.ndim, 0);
	assert_int_equal(t.offset, im.data_off[2]);
	/* The data is where the index says. */
	assert_int_equal(s.files[0].base[t.offset + 1], (uint8_t)(2 * 31 + 1));
	source_close(&s);
	assert_int_equal(tu_count_fds(), fds);
	free(path);
	free(im.buf);

	/* Failures close what they opened and name the file. */
	build_base(&im, 1);
	path = tu_write(dir, "be.weig", im.buf, im.len);
	assert_int_equal(source_open(path, &s), -EPROTO);
	assert_non_null(strstr(error_get(), path));
	assert_non_null(strstr(error_get(), "big-endian"));
	assert_int_equal(tu_count_fds(), fds);
	free(path);
	free(im.buf);
	assert_int_equal(source_open("/nonexistent/m.weig", &s), -ENOENT);
	assert_non_null(strstr(error_get(), "/nonexistent/m.weig"));
	assert_int_equal(tu_count_fds(), fds);
	tu_rmtree(dir);
}

/* pread() failing with pread_errno, pread_fail times from now on: linked
 * with -Wl,--wrap=pread (tests/CMakeLists.txt); __real_pread is weak, so a
 * build without the option still links and the test reports SKIPPED. */
static int pread_fail, pread_errno;
static int stat_fail_at; /* > 0: the stat() call of that number from now fails with EIO */

int __real_stat(const char *path, struct stat *st) __attribute__((weak));
int __wrap_stat(const char *path, struct stat *st);

int
__wrap_stat(const char *path, struct stat *st)
{
	if (stat_fail_at > 0 && --stat_fail_at == 0) {
		errno = EIO;
		return -1;
	}
	return __real_stat(path, st);
}

ssize_t __real_pread(int fd, void *buf, size_t n, off_t off) __attribute__((weak));
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off);

ssize_t
__wrap_pread(int fd, void *buf, size_t n, off_t off)
{
	if (pread_fail > 0) {
		pread_fail--;
		errno = pread_errno;
		return -1;
	}
	return __real_pread(fd, buf, n, off);
}

/*
 * The read of the magic that decides the format is retried on EINTR, and
 * any other failure of it is the error: before, the WEIG file was then read
 * as safetensors, whose reader reported a header length of billions of
 * bytes (found by an strace fault sweep of wcachectl convert: pread64,
 * openat and newfstatat faults on a WEIG input).
 */
static void
test_open_magic_read_fails(void **state)
{
	struct model_source s;
	char *dir = tu_tmpdir(), *path;
	int fds = tu_count_fds();
	BASE(im);

	(void)state;
	if (__real_pread == NULL)
		skip();
	path = tu_write(dir, "m.weig", im.buf, im.len);
	pread_errno = EINTR;
	pread_fail = 1;
	if (source_open(path, &s) != 0)
		fail_msg("source_open: %s", error_get());
	assert_int_equal(pread_fail, 0);
	assert_int_equal(s.format, FORMAT_WEIG);
	source_close(&s);
	pread_errno = EIO;
	pread_fail = 1;
	assert_int_equal(source_open(path, &s), -EIO);
	assert_non_null(strstr(error_get(), path));
	assert_non_null(strstr(error_get(), strerror(EIO)));
	/* The stat before the magic is read (source_open's own is the first). */
	if (__real_stat != NULL) {
		stat_fail_at = 2;
		assert_int_equal(source_open(path, &s), -EIO);
		assert_int_equal(stat_fail_at, 0);
		assert_non_null(strstr(error_get(), strerror(EIO)));
	}
	assert_int_equal(tu_count_fds(), fds);
	free(path);
	free(im.buf);
	tu_rmtree(dir);
}

/* A writer blocked in open() until a reader comes. */
struct fifo_writer {
	const char *path;
	volatile pid_t tid;
};

static void *
open_for_writing(void *arg)
{
	struct fifo_writer *w = arg;
	int fd;

	w->tid = gettid();
	if ((fd = open(w->path, O_WRONLY | O_CLOEXEC)) >= 0)
		close(fd);
	return NULL;
}

/* Is thread tid of this process in openat(2) (x86-64: 257; aarch64: 56)? */
static int
in_open(pid_t tid)
{
	char path[64], line[64] = "";
	FILE *f;
	long nr;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fgets(line, sizeof(line), f) == NULL)
		line[0] = '\0';
	fclose(f);
	nr = strtol(line, NULL, 10);
#if defined(__x86_64__)
	return nr == 257;
#else
	return nr == 56;
#endif
}

/* Detecting the format opens only a regular file: a FIFO put where the
 * model was is not opened (which would let a writer waiting on it go on). */
static void
test_magic_opens_no_fifo(void **state)
{
	char *dir = tu_tmpdir(), path[4096];
	struct fifo_writer w = { path, 0 };
	double end = tu_now() + 10;
	pthread_t writer;
	struct timespec ts;
	int fd;

	(void)state;
	snprintf(path, sizeof(path), "%s/model.weig", dir);
	assert_int_equal(mkfifo(path, 0600), 0);
	assert_int_equal(pthread_create(&writer, NULL, open_for_writing, &w), 0);
	while (w.tid == 0 || !in_open(w.tid)) {
		assert_true(tu_now() < end);
		usleep(1000);
	}
	assert_int_equal(source_magic(path), 0);
	/* Still blocked: source_magic did not open the FIFO for reading. */
	ts = deadline_in_ms(CLOCK_REALTIME, 200);
	assert_int_equal(pthread_timedjoin_np(writer, NULL, &ts), ETIMEDOUT);
	/* Let it go. */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pthread_join(writer, NULL), 0);
	close(fd);
	tu_rmtree(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_open_magic_read_fails),
		cmocka_unit_test(test_valid_empty),
		cmocka_unit_test(test_valid_edge),
		cmocka_unit_test(test_bad_magic),
		cmocka_unit_test(test_too_small),
		cmocka_unit_test(test_big_endian),
		cmocka_unit_test(test_version),
		cmocka_unit_test(test_file_size_mismatch),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_appended),
		cmocka_unit_test(test_bad_trailer),
		cmocka_unit_test(test_unknown_flags),
		cmocka_unit_test(test_reserved_nonzero),
		cmocka_unit_test(test_data_offset),
		cmocka_unit_test(test_record_table_bounds),
		cmocka_unit_test(test_pad_nonzero),
		cmocka_unit_test(test_name_bounds),
		cmocka_unit_test(test_name_no_nul),
		cmocka_unit_test(test_name_too_long),
		cmocka_unit_test(test_name_utf8),
		cmocka_unit_test(test_name_empty),
		cmocka_unit_test(test_unsorted),
		cmocka_unit_test(test_duplicate),
		cmocka_unit_test(test_unknown_dtype),
		cmocka_unit_test(test_shape_bounds),
		cmocka_unit_test(test_data_size_mismatch),
		cmocka_unit_test(test_shape_overflow),
		cmocka_unit_test(test_shape_overflow_any_order),
		cmocka_unit_test(test_sub_byte_fraction),
		cmocka_unit_test(test_data_bounds),
		cmocka_unit_test(test_misaligned_data),
		cmocka_unit_test(test_overlap),
		cmocka_unit_test(test_metadata_table),
		cmocka_unit_test(test_metadata_strings),
		cmocka_unit_test(test_metadata_order),
		cmocka_unit_test(test_open),
		cmocka_unit_test(test_magic_opens_no_fifo),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
