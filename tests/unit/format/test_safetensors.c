/*
 * test_safetensors.c: the safetensors reader (client/format/safetensors.c).
 *
 * Every validation rule has a test that asserts the error code and a piece
 * of the message, so a rule that stops firing, or fires with a message that
 * no longer names the file and the tensor, fails here. Valid files check
 * what reaches the index: names, dtypes, shapes, absolute offsets, metadata.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "format/dtype.h"
#include "base/error.h"
#include "format/index.h"
#include "format/safetensors.h"
#include "format/source.h"
#include "testutil.h"

#define NAME "model.safetensors"

/* safetensors.c: 0 turns off the canonical fast path (for comparing). */
extern int st_canonical_fast_path;

/* The index of the last successful parse, for inspection. */
static uint8_t *last_blob;
static size_t last_len;
static struct index_header last_h;

static int
teardown(void **state)
{
	free(last_blob);
	last_blob = NULL;
	return 0;
}

/* Parses a file image as file file_no (after file_no other files) and builds
 * the index; keeps the index on success. */
static int
parse_image_as(const uint8_t *img, size_t len, uint32_t file_no)
{
	struct index_builder *b;
	uint32_t no;
	int r;

	free(last_blob);
	last_blob = NULL;
	error_set(0, "%s", "");
	assert_int_equal(index_builder_new(&b), 0);
	for (uint32_t i = 0; i <= file_no; i++)
		assert_int_equal(index_add_file(b, NAME, len, &no), 0);
	assert_int_equal(no, file_no);
	r = st_parse(NAME, img, len, file_no, b);
	if (r == 0)
		r = index_build(b, NAME, &last_blob, &last_len);
	index_builder_free(b);
	if (r == 0)
		assert_int_equal(index_open(last_blob, last_len, &last_h), 0);
	else
		assert_true(error_get()[0] != '\0');
	return r;
}

static int
parse_image(const uint8_t *img, size_t len)
{
	return parse_image_as(img, len, 0);
}

/* Parses header + data_len bytes of data. */
static int
parse(const char *header, size_t data_len)
{
	size_t len;
	uint8_t *img = tu_safetensors(header, data_len, &len);
	int r = parse_image(img, len);

	free(img);
	return r;
}

/* Asserts that the message contains want (and names the file). */
static void
assert_msg(const char *want)
{
	const char *msg = error_get();

	if (strstr(msg, want) == NULL)
		fail_msg("message \"%s\" lacks \"%s\"", msg, want);
	if (strncmp(msg, NAME ": ", strlen(NAME) + 2) != 0)
		fail_msg("message \"%s\" does not start with the file name", msg);
	if (strchr(msg, '\n') != NULL)
		fail_msg("message \"%s\" is not one line", msg);
}

#define EXPECT(hdr, data_len, code, want)                                                \
	do {                                                                             \
		assert_int_equal(parse((hdr), (data_len)), (code));                      \
		assert_msg(want);                                                        \
	} while (0)

/* Finds a tensor in the last index. */
static struct index_tensor
find(const char *name)
{
	struct index_tensor t;

	assert_non_null(last_blob);
	if (index_find(last_blob, &last_h, name, &t) != 0)
		fail_msg("tensor \"%s\" not in the index", name);
	return t;
}

/* ---- valid files ---- */

static void
test_valid_basic(void **state)
{
	const char *h = "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\\u00e9\"},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
			"\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}";
	struct index_tensor t;
	const char *v;

	assert_int_equal(parse(h, 32), 0);
	assert_int_equal(last_h.tensor_count, 2);
	t = find("a");
	assert_int_equal(t.dtype, dtype_by_name("BF16", 4)->code);
	assert_int_equal(t.ndim, 1);
	assert_int_equal(t.shape[0], 4);
	assert_int_equal(t.offset, 8 + strlen(h)); /* absolute */
	assert_int_equal(t.nbytes, 8);
	assert_int_equal(t.file, 0);
	t = find("b");
	assert_int_equal(t.offset, 8 + strlen(h) + 8);
	assert_int_equal(t.nbytes, 24);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[1], 3);
	assert_int_equal(index_meta_find(last_blob, &last_h, "format", &v), 0);
	assert_string_equal(v, "pt");
	assert_int_equal(index_meta_find(last_blob, &last_h, "k", &v), 0);
	assert_string_equal(v, "v\xc3\xa9");
}

/* Whitespace before and after the object (writers pad the header with
 * spaces to align the data). */
static void
test_valid_padding(void **state)
{
	const char *h = " \n\t{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}"
			"        \r\n ";

	assert_int_equal(parse(h, 3), 0);
	assert_int_equal(find("a").offset, 8 + strlen(h));
}

static void
test_valid_scalar_and_empty(void **state)
{
	struct index_tensor t;

	assert_int_equal(parse("{\"s\":{\"dtype\":\"F64\",\"shape\":[],"
		"\"data_offsets\":[0,8]}}", 8), 0);
	t = find("s");
	assert_int_equal(t.ndim, 0);
	assert_int_equal(t.nbytes, 8);
	/* no tensors at all, no data */
	assert_int_equal(parse("{}", 0), 0);
	assert_int_equal(last_h.tensor_count, 0);
	assert_int_equal(parse("{\"__metadata__\":null}", 0), 0);
	assert_int_equal(last_h.meta_count, 0);
}

/* Zero-size tensors may share an offset, with each other and with the
 * tensor that starts there; order in the JSON does not matter. */
static void
test_valid_zero_size_and_order(void **state)
{
	const char *h = "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
			"\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
			"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			"\"z2\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
			"\"z3\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}";

	assert_int_equal(parse(h, 8), 0);
	assert_int_equal(last_h.tensor_count, 5);
	assert_int_equal(find("z2").nbytes, 0);
	assert_int_equal(find("z3").offset, 8 + strlen(h) + 8);
	/* a file of zero-size tensors only */
	assert_int_equal(parse("{\"z\":{\"dtype\":\"I8\",\"shape\":[0],"
		"\"data_offsets\":[0,0]}}", 0), 0);
}

/* Every dtype of the table, with 8 elements each (so sub-byte types are whole
 * bytes), laid end to end. */
static void
test_valid_every_dtype(void **state)
{
	static const char *const names[DTYPE_COUNT] = { "F32", "F16", "BF16", "I8", "U8", "I32",
		"F64", "I64", "U64", "U32", "I16", "U16", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0",
		"F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2", "C64" };
	char h[8192];
	size_t p = 0;
	uint64_t off = 0;

	p += (size_t)sprintf(h + p, "{");
	for (int i = 0; i < DTYPE_COUNT; i++) {
		const struct dtype_info *d = dtype_by_name(names[i], strlen(names[i]));
		uint64_t n = d->bits; /* 8 elements of bits/8 bytes */

		assert_non_null(d);
		p += (size_t)sprintf(h + p, "%s\"t%02d\":{\"dtype\":\"%s\",\"shape\":[2,4],"
			"\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", i ? "," : "", i, names[i],
			off, off + n);
		off += n;
	}
	sprintf(h + p, "}");
	assert_int_equal(parse(h, off), 0);
	assert_int_equal(last_h.tensor_count, DTYPE_COUNT);
	for (int i = 0; i < DTYPE_COUNT; i++) {
		char name[8];
		const struct dtype_info *d = dtype_by_name(names[i], strlen(names[i]));

		sprintf(name, "t%02d", i);
		assert_int_equal(find(name).dtype, d->code);
		assert_int_equal(find(name).nbytes, d->bits);
	}
}

/* F4 is 4 bits and F6_* 6 bits per element: the total must be whole bytes. */
static void
test_subbyte_dtypes(void **state)
{
	assert_int_equal(parse("{\"a\":{\"dtype\":\"F4\",\"shape\":[2,3],"
		"\"data_offsets\":[0,3]}}", 3), 0);
	assert_int_equal(parse("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],"
		"\"data_offsets\":[0,3]}}", 3), 0);
	assert_int_equal(parse("{\"a\":{\"dtype\":\"F6_E3M2\",\"shape\":[],"
		"\"data_offsets\":[0,1]}}", 1), -EINVAL);
	assert_msg("F6_E3M2 [] is not a whole number of bytes (6 bits per element)");
	EXPECT("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, -EINVAL,
		"tensor \"a\": F4 [3] is not a whole number of bytes");
	EXPECT("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -EINVAL,
		"F6_E2M3 [2] is not a whole number of bytes");
}

/* Escapes in names are decoded; the index holds the decoded name. */
static void
test_escaped_names(void **state)
{
	const char *h = "{\"a\\u00e9\\\"\\n\":{\"d\\u0074ype\":\"F\\u0033\\u0032\",\"shape\":[1],"
			"\"data_offsets\":[0,4]}}";

	assert_int_equal(parse(h, 4), 0);
	assert_int_equal(find("a\xc3\xa9\"\n").nbytes, 4);
	/* and messages show the decoded name, quoted */
	EXPECT("{\"x\\u00e9\\\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		-EINVAL, "tensor \"x\xc3\xa9\\\"\": data_offsets [0, 8] hold 8 bytes");
}

/* Names of exactly INDEX_MAX_NAME bytes are fine, one more is not. */
static void
test_name_length(void **state)
{
	char *h = malloc(INDEX_MAX_NAME + 200), *name = malloc(INDEX_MAX_NAME + 2);

	memset(name, 'n', INDEX_MAX_NAME + 1);
	name[INDEX_MAX_NAME] = '\0';
	sprintf(h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
	assert_int_equal(parse(h, 1), 0);
	assert_int_equal(find(name).nbytes, 1);
	name[INDEX_MAX_NAME] = 'n';
	name[INDEX_MAX_NAME + 1] = '\0';
	sprintf(h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
	EXPECT(h, 1, -EINVAL, "name of 4097 bytes is longer than 4096");
	free(h);
	free(name);
}

/* Metadata goes to the index for file 0 only (a sharded model takes its
 * first shard's), but is validated in every file. */
static void
test_metadata_file_no(void **state)
{
	const char *h = "{\"__metadata__\":{\"k\":\"v\"},"
			"\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
	size_t len;
	uint8_t *img = tu_safetensors(h, 1, &len);

	assert_int_equal(parse_image_as(img, len, 0), 0);
	assert_int_equal(last_h.meta_count, 1);
	assert_int_equal(parse_image_as(img, len, 2), 0);
	assert_int_equal(last_h.meta_count, 0);
	assert_int_equal(find("a").file, 2);
	free(img);
	img = tu_safetensors("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, &len);
	assert_int_equal(parse_image_as(img, len, 1), -EINVAL);
	assert_msg("__metadata__: duplicate key \"k\"");
	free(img);
}

/* ---- files that are not safetensors ---- */

static void
test_not_safetensors(void **state)
{
	static const char lfs[] = "version https://git-lfs.github.com/spec/v1\n"
		"oid sha256:4d7a2148e6f0b4d9f5b3b9f8a1f0e3c2d1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6\n"
		"size 4939212752\n";
	static const char html[] =
		"\n  <!DOCTYPE html><html><head><title>404</title></head></html>";
	static const char html2[] = "<HTML><body>Access denied</body></HTML>";
	static const char text[] = "{\"a\": {\"dtype\": \"F32\"}}";
	uint8_t big[16] = { 0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0 }; /* 100000001 */

	assert_int_equal(parse_image((const uint8_t *)"", 0), -EINVAL);
	assert_msg("file is empty (0 bytes)");
	assert_int_equal(parse_image((const uint8_t *)lfs, sizeof(lfs) - 1), -EINVAL);
	assert_msg("is a Git LFS pointer");
	assert_msg("git lfs pull");
	assert_int_equal(parse_image((const uint8_t *)html, sizeof(html) - 1), -EINVAL);
	assert_msg("looks like an HTML page");
	assert_int_equal(parse_image((const uint8_t *)html2, sizeof(html2) - 1), -EINVAL);
	assert_msg("looks like an HTML page");
	assert_int_equal(parse_image((const uint8_t *)"abc", 3), -EINVAL);
	assert_msg("3 bytes, too short for a safetensors file");
	assert_int_equal(parse_image((const uint8_t *)"\x02\0\0\0\0\0\0", 7), -EINVAL);
	assert_msg("7 bytes, too short");
	assert_int_equal(parse_image((const uint8_t *)text, sizeof(text) - 1), -EINVAL);
	assert_msg("it starts with text \"{\\\"a\\\": {\\\"\" where the 8-byte header length");
	assert_int_equal(parse_image(big, sizeof(big)), -EINVAL);
	assert_msg("header length 100000001 exceeds the maximum of 100000000 bytes");
}

static void
test_header_length(void **state)
{
	uint8_t img[64] = { 0 };

	/* exactly the maximum, but the file is short */
	img[0] = 0x00, img[1] = 0xe1, img[2] = 0xf5, img[3] = 0x05; /* 100000000 */
	assert_int_equal(parse_image(img, sizeof(img)), -EINVAL);
	assert_msg("header length 100000000, but only 56 bytes follow it (truncated file?)");
	/* one byte past the end */
	memset(img, 0, sizeof(img));
	img[0] = 57;
	assert_int_equal(parse_image(img, sizeof(img)), -EINVAL);
	assert_msg("header length 57, but only 56 bytes follow it");
	/* huge value that would overflow 8 + N: caught by the maximum */
	memset(img, 0xff, 8);
	assert_int_equal(parse_image(img, sizeof(img)), -EINVAL);
	assert_msg("exceeds the maximum");
	/* N = 0: an empty header is not JSON */
	memset(img, 0, sizeof(img));
	assert_int_equal(parse_image(img, 8), -EINVAL);
	assert_msg("invalid JSON in the header at byte 8");
}

/* ---- the header document ---- */

static void
test_header_json(void **state)
{
	EXPECT("[]", 0, -EINVAL, "the header is an array, expected a JSON object");
	EXPECT("null", 0, -EINVAL, "the header is null, expected a JSON object");
	EXPECT("{} x", 0, -EINVAL, "unexpected data after the JSON value");
	EXPECT("{}{}", 0, -EINVAL, "at byte 10: unexpected data after the JSON value");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, -EINVAL,
		"invalid JSON in the header");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, -EINVAL,
		"invalid JSON");
	/* invalid UTF-8 in a name, in a value, overlong, surrogate */
	EXPECT("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"invalid UTF-8 in string");
	EXPECT("{\"__metadata__\":{\"k\":\"\xc0\xaf\"}}", 0, -EINVAL, "invalid UTF-8");
	EXPECT("{\"\xed\xa0\x80\":{}}", 0, -EINVAL, "invalid UTF-8");
	EXPECT("{\"a\\ud800\":{}}", 0, -EINVAL, "surrogate");
	EXPECT("{\"a\x01\":{}}", 0, -EINVAL, "control character 0x01");
	/* a byte outside strings that is not JSON */
	EXPECT("\xef\xbb\xbf{}", 0, -EINVAL, "unexpected byte 0xef");
}

static void
test_entry_shape(void **state)
{
	EXPECT("{\"a\":1}", 0, -EINVAL, "tensor \"a\" is a number, expected an object");
	EXPECT("{\"a\":[]}", 0, -EINVAL, "tensor \"a\" is an array, expected an object");
	EXPECT("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"tensor \"a\": missing dtype");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"tensor \"a\": missing shape");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, -EINVAL,
		"tensor \"a\": missing data_offsets");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":1}}", 1,
		-EINVAL, "tensor \"a\": unknown field \"extra\"");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],"
		"\"data_offsets\":[0,1]}}", 1,
		-EINVAL, "tensor \"a\": duplicate field \"dtype\"");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
		-EINVAL, "duplicate field \"shape\"");
	/* the same field spelled with an escape is still a duplicate */
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
	       "\"data_offset\\u0073\":[0,1]}}", 1, -EINVAL, "duplicate field \"data_offsets\"");
}

static void
test_dtype_field(void **state)
{
	EXPECT("{\"a\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2, -EINVAL,
		"tensor \"a\": unknown dtype \"bf16\"");
	EXPECT("{\"a\":{\"dtype\":\"F8_E4M3FNUZX\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
		-EINVAL, "unknown dtype \"F8_E4M3FNUZX\"");
	EXPECT("{\"a\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"unknown dtype \"\"");
	EXPECT("{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -EINVAL,
		"tensor \"a\": dtype is a number, expected a string");
	/* a dtype after tensors of another one (the last-dtype shortcut) */
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	       "\"b\":{\"dtype\":\"F3\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -EINVAL,
		"tensor \"b\": unknown dtype \"F3\"");
}

static void
test_shape_field(void **state)
{
	char h[2048];
	size_t p;

	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"tensor \"a\": shape is a number, expected an array");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"tensor \"a\": shape[0]: -1 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,4.0],\"data_offsets\":[0,4]}}", 4, -EINVAL,
		"tensor \"a\": shape[1]: 4.0 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[4e0],\"data_offsets\":[0,4]}}", 4, -EINVAL,
		"shape[0]: 4e0 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, -EINVAL,
		"shape[0]: -0 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[016],\"data_offsets\":[0,16]}}", 16, -EINVAL,
		"leading zero");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[+1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"invalid JSON");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"shape[0] is a string, expected a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[18446744073709551616],\"data_offsets\":[0,1]}}",
		1, -EINVAL, "larger than 2^64-1");
	/* more than INDEX_MAX_NDIM dimensions; exactly that many is fine */
	for (int n = INDEX_MAX_NDIM; n <= INDEX_MAX_NDIM + 1; n++) {
		p = (size_t)sprintf(h, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1");
		for (int i = 1; i < n; i++)
			p += (size_t)sprintf(h + p, ",1");
		sprintf(h + p, "],\"data_offsets\":[0,1]}}");
		assert_int_equal(parse(h, 1), n <= INDEX_MAX_NDIM ? 0 : -EINVAL);
	}
	assert_msg("tensor \"a\": shape has more than 64 entries");
	/* element count overflow */
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
		"\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"tensor \"a\": U8 [4294967296, 4294967296]: size overflows 64 bits");
	EXPECT("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}",
		1, -EINVAL, "size overflows 64 bits");
	/* The rule does not depend on where a zero dimension is: the product of
	 * the non-zero dimensions must fit, so both orders are refused. */
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[0,1099511627776,1099511627776],"
		"\"data_offsets\":[0,0]}}", 0, -EINVAL,
		"tensor \"a\": U8 [0, 1099511627776, 1099511627776]: size overflows 64 bits");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776,0],"
		"\"data_offsets\":[0,0]}}", 0, -EINVAL,
		"tensor \"a\": U8 [1099511627776, 1099511627776, 0]: size overflows 64 bits");
	/* Zeros with dimensions whose product fits: an empty tensor. */
	assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[0,1099511627776,1048576],"
		"\"data_offsets\":[0,0]}}", 0), 0);
	assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1048576,0],"
		"\"data_offsets\":[0,0]}}", 0), 0);
}

static void
test_offsets_field(void **state)
{
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, -EINVAL,
		"tensor \"a\": data_offsets has 1 entries, expected 2");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[]}}", 1, -EINVAL,
		"data_offsets has 0 entries, expected 2");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, -EINVAL,
		"data_offsets has more than 2 entries");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1, -EINVAL,
		"data_offsets is an object, expected an array");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1, -EINVAL,
		"data_offsets[1]: 1.0 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-0,1]}}", 1, -EINVAL,
		"data_offsets[0]: -0 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1e0,2]}}", 2, -EINVAL,
		"data_offsets[0]: 1e0 is not a non-negative integer");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 2, -EINVAL,
		"tensor \"a\": data_offsets [2, 1]: begin is after end");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1000],\"data_offsets\":[0,1000]}}", 16, -EINVAL,
		"tensor \"a\": data_offsets [0, 1000] extend past the end of the data (16 bytes)");
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551615]}}",
		16, -EINVAL, "extend past the end of the data");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16, -EINVAL,
		"tensor \"a\": data_offsets [0, 16] hold 16 bytes but F32 [2, 3] needs 24");
}

static void
test_tiling(void **state)
{
	EXPECT("{\"x\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
	       "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
		32, -EINVAL,
		NAME ": tensor \"lm_head.weight\": data_offsets [0, 16] overlap previous tensor "
		"\"x\" [0, 32]");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	       "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, -EINVAL,
		"tensor \"b\": data_offsets [8, 24] overlap previous tensor \"a\" [0, 16]");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -EINVAL,
		"tensor \"a\": data_offsets [4, 8] leave a gap of 4 bytes at the start of "
		"the data");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[6,10]}}", 10, -EINVAL,
		"tensor \"b\": data_offsets [6, 10] leave a gap of 2 bytes after previous tensor "
		"\"a\" [0, 4]");
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 10, -EINVAL,
		"the last tensor \"a\" ends at data offset 4 but the data is 10 bytes: 6 bytes "
		"at the end of the file belong to no tensor");
	EXPECT("{}", 3, -EINVAL, "no tensors, but 3 bytes of data after the header");
	/* a zero-size tensor inside another one overlaps it */
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	       "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, -EINVAL,
		"tensor \"z\": data_offsets [4, 4] overlap previous tensor \"a\" [0, 8]");
	/* the same checks when the header is not in offset order (sorted path) */
	EXPECT("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
	       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, -EINVAL,
		"tensor \"b\": data_offsets [8, 12] leave a gap of 4 bytes after previous tensor "
		"\"a\" [0, 4]");
	EXPECT("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]},"
	       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, -EINVAL,
		"tensor \"b\": data_offsets [2, 6] overlap previous tensor \"a\" [0, 4]");
	/* two tensors on the same bytes */
	EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -EINVAL,
		"overlap previous tensor");
}

/* Names: duplicates, empty, NUL. */
static void
test_names(void **state)
{
	EXPECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	       "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, -EINVAL,
		"duplicate tensor name \"a\"");
	/* the same name spelled two ways */
	EXPECT("{\"ab\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	       "\"a\\u0062\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, -EINVAL,
		"duplicate tensor name \"ab\"");
	EXPECT("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
		"empty tensor name in the header at byte 10");
	EXPECT("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
		-EINVAL, "tensor \"a\\u0000b\": name contains a NUL character");
}

static void
test_metadata(void **state)
{
	const char *v;

	assert_int_equal(parse("{\"__metadata__\":{}}", 0), 0);
	assert_int_equal(parse("{\"__metadata__\":{\"a\":\"\",\"\":\"b\"}}", 0), 0);
	assert_int_equal(index_meta_find(last_blob, &last_h, "", &v), 0);
	assert_string_equal(v, "b");
	EXPECT("{\"__metadata__\":[]}", 0, -EINVAL,
		"__metadata__ is an array, expected an object or null");
	EXPECT("{\"__metadata__\":\"x\"}", 0, -EINVAL, "__metadata__ is a string");
	EXPECT("{\"__metadata__\":{\"n\":1}}", 0, -EINVAL,
		"__metadata__ \"n\": value is a number, expected a string");
	EXPECT("{\"__metadata__\":{\"n\":null}}", 0, -EINVAL, "value is null, expected a string");
	EXPECT("{\"__metadata__\":{\"n\":{}}}", 0, -EINVAL, "value is an object");
	EXPECT("{\"__metadata__\":{},\"__metadata__\":{}}", 0, -EINVAL, "duplicate __metadata__");
	EXPECT("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", 0, -EINVAL,
		"__metadata__: duplicate key \"k\"");
	EXPECT("{\"__metadata__\":{\"k\":\"1\",\"\\u006b\":\"3\"}}", 0, -EINVAL,
		"__metadata__: duplicate key \"k\"");
	EXPECT("{\"__metadata__\":{\"k\":\"a\\u0000\"}}", 0, -EINVAL,
		"__metadata__ \"k\": value contains a NUL character");
	EXPECT("{\"__metadata__\":{\"k\\u0000\":\"a\"}}", 0, -EINVAL,
		"key contains a NUL character");
}

/* ---- source_open() of a safetensors file on disk ---- */

static void
test_open_file(void **state)
{
	const char *h = "{\"w\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
	char *dir = tu_tmpdir(), *path;
	struct model_source src;
	struct index_header ih;
	struct index_tensor t;
	const char *fname;
	uint64_t fsize;
	size_t len;
	uint8_t *img = tu_safetensors(h, 16, &len);
	int fds = tu_count_fds();

	path = tu_write(dir, "model.safetensors", img, len);
	assert_int_equal(source_open(path, &src), 0);
	assert_int_equal(src.format, FORMAT_SAFETENSORS);
	assert_int_equal(src.nfiles, 1);
	assert_int_equal(src.files[0].size, len);
	assert_int_equal(index_open(src.index, src.index_len, &ih), 0);
	assert_int_equal(index_file_at(src.index, &ih, 0, &fname, &fsize), 0);
	assert_string_equal(fname, "model.safetensors");
	assert_int_equal(fsize, len);
	assert_int_equal(index_find(src.index, &ih, "w", &t), 0);
	assert_int_equal(t.offset, 8 + strlen(h));
	/* the data really is at that offset in the mapping */
	assert_int_equal(src.files[0].base[t.offset], 0);
	assert_int_equal(src.files[0].base[t.offset + 5], 5);
	source_close(&src);
	assert_int_equal(tu_count_fds(), fds);
	free(path);

	/* a bad file: the message names the path, no descriptor leaks */
	path = tu_write(dir, "bad.safetensors", img, len - 1);
	assert_int_equal(source_open(path, &src), -EINVAL);
	assert_non_null(strstr(error_get(), "bad.safetensors: tensor \"w\": data_offsets [0, 16] "
		"extend past the end of the data (15 bytes)"));
	assert_int_equal(tu_count_fds(), fds);
	free(path);

	/* empty file and missing file */
	path = tu_write(dir, "empty.safetensors", "", 0);
	assert_int_equal(source_open(path, &src), -EINVAL);
	assert_non_null(strstr(error_get(), "empty.safetensors: file is empty"));
	free(path);
	path = tu_write(dir, "dup.safetensors", "", 0);
	free(path);
	assert_int_equal(tu_count_fds(), fds);
	{
		char missing[4200];

		snprintf(missing, sizeof(missing), "%s/missing.safetensors", dir);
		assert_int_equal(source_open(missing, &src), -ENOENT);
		assert_non_null(strstr(error_get(), "missing.safetensors"));
	}
	free(img);
	tu_rmtree(dir);
}

/*
 * Builds the image of a file of n tensors named like a large model's
 * (model.layers.N.mlp.down_proj.weight, BF16, 2-D shapes), in data order or
 * shuffled in the header.
 */
static uint8_t *
many_tensors_image(int n, int shuffle, size_t *len)
{
	static const char *const kinds[] = { "mlp.down_proj", "mlp.up_proj", "mlp.gate_proj",
		"self_attn.q_proj", "self_attn.k_proj" };
	size_t cap = (size_t)n * 160 + 64, p = 0;
	char *h = malloc(cap);
	int *order = malloc(sizeof(int) * (size_t)n);
	uint32_t seed = 1;
	uint8_t *img;

	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = n - 1; shuffle && i > 0; i--) {
		int k, t;

		seed = seed * 1103515245 + 12345;
		k = (int)((seed >> 8) % (uint32_t)(i + 1));
		t = order[i], order[i] = order[k], order[k] = t;
	}
	p += (size_t)snprintf(h + p, cap - p, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (int k = 0; k < n; k++) {
		int i = order[k];

		p += (size_t)snprintf(h + p, cap - p,
			",\"model.layers.%d.%s.weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],"
			"\"data_offsets\":[%d,%d]}", i / 5, kinds[i % 5], i * 64, i * 64 + 64);
	}
	snprintf(h + p, cap - p, "}");
	img = tu_safetensors(h, (size_t)n * 64, len);
	free(h);
	free(order);
	return img;
}

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Large headers parse, in any order, and every tensor is where it should be.
 * With WCACHE_BENCH=1 in the environment this also prints the best time of
 * st_parse + index_build per tensor (the benchmark of the JSON work).
 */
static void
test_many_tensors(void **state)
{
	static const int counts[] = { 1000, 50000 };
	int bench = getenv("WCACHE_BENCH") != NULL;

	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
		for (int shuffle = 0; shuffle <= 1; shuffle++) {
			int n = counts[c], runs = bench ? (n > 10000 ? 50 : 3000) : 1;
			double best = 1e9, best_parse = 1e9;
			size_t len;
			uint8_t *img = many_tensors_image(n, shuffle, &len);
			struct index_tensor t;
			uint64_t hlen = 0;

			for (int i = 7; i >= 0; i--)
				hlen = (hlen << 8) | img[i];
			for (int r = 0; r < runs; r++) {
				struct index_builder *b;
				uint32_t no;
				double t0, t1, t2;

				free(last_blob);
				last_blob = NULL;
				t0 = now();
				assert_int_equal(index_builder_new(&b), 0);
				assert_int_equal(index_add_file(b, NAME, len, &no), 0);
				assert_int_equal(st_parse(NAME, img, len, no, b), 0);
				t1 = now();
				assert_int_equal(index_build(b, NAME, &last_blob, &last_len), 0);
				t2 = now();
				index_builder_free(b);
				best = t2 - t0 < best ? t2 - t0 : best;
				best_parse = t1 - t0 < best_parse ? t1 - t0 : best_parse;
			}
			assert_int_equal(index_open(last_blob, last_len, &last_h), 0);
			assert_int_equal(last_h.tensor_count, (uint64_t)n);
			t = find("model.layers.0.mlp.down_proj.weight");
			assert_int_equal(t.offset, 8 + hlen);
			t = find(n == 1000 ? "model.layers.199.self_attn.k_proj.weight" :
					     "model.layers.9999.self_attn.k_proj.weight");
			assert_int_equal(t.offset, 8 + hlen + (uint64_t)(n - 1) * 64);
			assert_int_equal(t.nbytes, 64);
			if (bench)
				printf("%s: %6d tensors, %-13s: st_parse %.3f us/tensor, "
				       "with index_build %.3f us/tensor (header %llu bytes, best "
				       "of %d)\n", st_canonical_fast_path ? "fast path   " :
					"general path", n,
					shuffle ? "shuffled" : "in data order",
					best_parse * 1e6 / n, best * 1e6 / n,
					(unsigned long long)hlen, runs);
			free(img);
		}
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_valid_basic, teardown),
		cmocka_unit_test_teardown(test_valid_padding, teardown),
		cmocka_unit_test_teardown(test_valid_scalar_and_empty, teardown),
		cmocka_unit_test_teardown(test_valid_zero_size_and_order, teardown),
		cmocka_unit_test_teardown(test_valid_every_dtype, teardown),
		cmocka_unit_test_teardown(test_subbyte_dtypes, teardown),
		cmocka_unit_test_teardown(test_escaped_names, teardown),
		cmocka_unit_test_teardown(test_name_length, teardown),
		cmocka_unit_test_teardown(test_metadata_file_no, teardown),
		cmocka_unit_test_teardown(test_not_safetensors, teardown),
		cmocka_unit_test_teardown(test_header_length, teardown),
		cmocka_unit_test_teardown(test_header_json, teardown),
		cmocka_unit_test_teardown(test_entry_shape, teardown),
		cmocka_unit_test_teardown(test_dtype_field, teardown),
		cmocka_unit_test_teardown(test_shape_field, teardown),
		cmocka_unit_test_teardown(test_offsets_field, teardown),
		cmocka_unit_test_teardown(test_tiling, teardown),
		cmocka_unit_test_teardown(test_names, teardown),
		cmocka_unit_test_teardown(test_metadata, teardown),
		cmocka_unit_test_teardown(test_open_file, teardown),
		cmocka_unit_test_teardown(test_many_tensors, teardown),
	};

	int failed;

	/* Every test twice: the canonical fast path must agree with the
	 * general path on every file, valid or not. */
	failed = cmocka_run_group_tests_name("fast path", tests, NULL, NULL);
	st_canonical_fast_path = 0;
	failed += cmocka_run_group_tests_name("general path", tests, NULL, NULL);
	return failed;
}
