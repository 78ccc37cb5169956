/*
 * test_index.c: the compiled index: building, reading, lookups, and
 * damaged indexes that must give errors, never out-of-bounds reads.
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

#include "format/dtype.h"
#include "base/error.h"
#include "format/index.h"

struct fixture {
	uint8_t *blob;
	size_t len;
	struct index_header h;
};

/* Three tensors added out of order, two files, two metadata entries. */
static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct index_builder *b;
	uint64_t s1[2] = { 2, 3 }, s2[1] = { 4 };
	uint32_t f0, f1;

	assert_non_null(f);
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "a.safetensors", 1000, &f0), 0);
	assert_int_equal(index_add_file(b, "b.safetensors", 2000, &f1), 0);
	assert_int_equal(f1, 1);
	assert_int_equal(index_add_tensor(b, "zeta", 4, 0 /* F32 */, f1, s1, 2, 100, 24), 0);
	assert_int_equal(index_add_tensor(b, "alpha", 5, 2 /* BF16 */, f0, s2, 1, 64, 8), 0);
	assert_int_equal(index_add_tensor(b, "mid", 3, 4 /* U8 */, f0, NULL, 0, 72, 1), 0);
	assert_int_equal(index_add_meta(b, "format", 6, "pt", 2), 0);
	assert_int_equal(index_add_meta(b, "author", 6, "me", 2), 0);
	assert_int_equal(index_builder_count(b), 3);
	assert_int_equal(index_build(b, "test", &f->blob, &f->len), 0);
	index_builder_free(b);
	assert_int_equal(index_open(f->blob, f->len, &f->h), 0);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	free(f->blob);
	free(f);
	return 0;
}

static void
test_sorted_by_name(void **state)
{
	struct fixture *f = *state;
	struct index_tensor t;
	const char *want[] = { "alpha", "mid", "zeta" };

	assert_int_equal(f->h.tensor_count, 3);
	for (uint64_t i = 0; i < 3; i++) {
		assert_int_equal(index_tensor_at(f->blob, &f->h, i, &t), 0);
		assert_string_equal(t.name, want[i]);
	}
	assert_int_equal(index_tensor_at(f->blob, &f->h, 3, &t), -ERANGE);
}

static int
compare_strings(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * The radix sort of names against qsort(strcmp): many names that share
 * long prefixes (longer than 8-byte keys, so runs recurse), names that are
 * prefixes of others, bytes above 0x7f, lengths around the 8-byte steps,
 * and one duplicate among many names, which must be found.
 */
static void
test_sort_matches_strcmp(void **state)
{
	enum { N = 3000 };
	struct index_builder *b;
	struct index_header h;
	struct index_tensor t;
	char **names = calloc(N, sizeof(*names));
	uint8_t *blob;
	size_t len;
	uint32_t f0;
	uint64_t seed = 12345;

	(void)state;
	assert_non_null(names);
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "f", 1u << 20, &f0), 0);
	for (int i = 0; i < N; i++) {
		char buf[200];
		int n;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		switch (i % 5) {
		case 0: /* long shared prefix, numbered like layers */
			n = snprintf(buf, sizeof(buf), "model.layers.%d.mlp.experts.%d.w", i % 61,
				i);
			break;
		case 1: /* a prefix of case 0's names and of each other */
			n = snprintf(buf, sizeof(buf), "model.layers.%d", i);
			break;
		case 2: /* lengths around multiples of 8 */
			n = snprintf(buf, sizeof(buf), "%.*s%d", (int)(seed >> 59),
				"abcdefghijklmnopqrstuvwxyzABCDEF", i);
			break;
		case 3: /* high bytes */
			n = snprintf(buf, sizeof(buf), "\xc3\xa9t\xc3\xa9.%d.\xff", i);
			break;
		default: /* a 40-byte common stem, then a varying tail */
			n = snprintf(buf, sizeof(buf),
				"transformer.h.block.attention.query_key.%llu",
				(unsigned long long)(seed >> 40));
			break;
		}
		/* Drop the rare collision of case 4's random tails. */
		int dup = 0;

		for (int j = 0; j < i && !dup; j++)
			dup = names[j] != NULL && strcmp(names[j], buf) == 0;
		if (dup) {
			names[i] = NULL;
			continue;
		}
		names[i] = strdup(buf);
		assert_int_equal(index_add_tensor(b, buf, (size_t)n, 4, f0, NULL, 0,
			(uint64_t)i, 1), 0);
	}
	assert_int_equal(index_build(b, "sort", &blob, &len), 0);
	assert_int_equal(index_open(blob, len, &h), 0);
	{
		size_t m = 0;

		for (int i = 0; i < N; i++)
			if (names[i] != NULL)
				names[m++] = names[i];
		qsort(names, m, sizeof(*names), compare_strings);
		assert_int_equal(h.tensor_count, m);
		for (size_t i = 0; i < m; i++) {
			assert_int_equal(index_tensor_at(blob, &h, i, &t), 0);
			assert_string_equal(t.name, names[i]);
		}
		/* The same names plus one duplicate: index_build refuses. */
		assert_int_equal(index_add_tensor(b, names[m / 2], strlen(names[m / 2]), 4, f0,
			NULL, 0, 0, 1), 0);
		free(blob);
		blob = NULL;
		assert_int_equal(index_build(b, "sort", &blob, &len), -EINVAL);
		assert_non_null(strstr(error_get(), names[m / 2]));
		for (size_t i = 0; i < m; i++)
			free(names[i]);
	}
	free(blob);
	free(names);
	index_builder_free(b);
}

static void
test_fields_survive(void **state)
{
	struct fixture *f = *state;
	struct index_tensor t;

	assert_int_equal(index_find(f->blob, &f->h, "zeta", &t), 0);
	assert_int_equal(t.dtype, 0);
	assert_int_equal(t.file, 1);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 2);
	assert_int_equal(t.shape[1], 3);
	assert_int_equal(t.offset, 100);
	assert_int_equal(t.nbytes, 24);
	assert_int_equal(index_find(f->blob, &f->h, "mid", &t), 0);
	assert_int_equal(t.ndim, 0);
	assert_int_equal(t.nbytes, 1);
}

static void
test_find_missing(void **state)
{
	struct fixture *f = *state;
	struct index_tensor t;

	assert_int_equal(index_find(f->blob, &f->h, "beta", &t), -ENOENT);
	assert_non_null(strstr(error_get(), "\"beta\""));
	assert_int_equal(index_find(f->blob, &f->h, "", &t), -ENOENT);
	assert_int_equal(index_find(f->blob, &f->h, "zzzz", &t), -ENOENT);
}

static void
test_files_and_metadata(void **state)
{
	struct fixture *f = *state;
	const char *name, *k, *v;
	uint64_t size;

	assert_int_equal(index_file_at(f->blob, &f->h, 1, &name, &size), 0);
	assert_string_equal(name, "b.safetensors");
	assert_int_equal(size, 2000);
	assert_int_equal(index_file_at(f->blob, &f->h, 2, &name, &size), -ERANGE);
	assert_int_equal(index_meta_at(f->blob, &f->h, 0, &k, &v), 0);
	assert_string_equal(k, "author");
	assert_int_equal(index_meta_find(f->blob, &f->h, "format", &v), 0);
	assert_string_equal(v, "pt");
	assert_int_equal(index_meta_find(f->blob, &f->h, "nope", &v), -ENOENT);
}

static void
test_duplicate_names_rejected(void **state)
{
	struct index_builder *b;
	uint8_t *blob;
	size_t len;
	uint32_t f0;

	(void)state;
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "x", 10, &f0), 0);
	assert_int_equal(index_add_tensor(b, "w", 1, 4, f0, NULL, 0, 0, 1), 0);
	assert_int_equal(index_add_tensor(b, "w", 1, 4, f0, NULL, 0, 1, 1), 0);
	assert_int_equal(index_build(b, "x.safetensors", &blob, &len), -EINVAL);
	assert_non_null(strstr(error_get(), "x.safetensors: duplicate tensor name \"w\""));
	index_builder_free(b);

	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "x", 10, &f0), 0);
	assert_int_equal(index_add_meta(b, "k", 1, "1", 1), 0);
	assert_int_equal(index_add_meta(b, "k", 1, "2", 1), 0);
	assert_int_equal(index_build(b, "m", &blob, &len), -EINVAL);
	assert_non_null(strstr(error_get(), "duplicate metadata key \"k\""));
	index_builder_free(b);
}

static void
test_builder_rejects_bad_input(void **state)
{
	struct index_builder *b;
	uint32_t f0;
	uint64_t shape[INDEX_MAX_NDIM + 1] = { 0 };

	(void)state;
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "x", 10, &f0), 0);
	assert_int_equal(index_add_tensor(b, "", 0, 4, f0, NULL, 0, 0, 1), -EINVAL);
	assert_int_equal(index_add_tensor(b, "a\0b", 3, 4, f0, NULL, 0, 0, 1), -EINVAL);
	assert_int_equal(index_add_tensor(b, "a", 1, 99, f0, NULL, 0, 0, 1), -EINVAL);
	assert_int_equal(index_add_tensor(b, "a", 1, 4, 7, NULL, 0, 0, 1), -EINVAL);
	assert_int_equal(index_add_tensor(b, "a", 1, 4, f0, shape, INDEX_MAX_NDIM + 1, 0, 0),
		-EINVAL);
	assert_int_equal(index_add_meta(b, "k\0", 2, "v", 1), -EINVAL);
	index_builder_free(b);
}

static void
test_damaged_headers(void **state)
{
	struct fixture *f = *state;
	struct index_header h;
	uint8_t *copy = malloc(f->len);

	assert_int_equal(index_open(f->blob, 10, &h), -EBADMSG);
	assert_int_equal(index_open(f->blob, f->len - 1, &h), -EBADMSG); /* size mismatch */

	memcpy(copy, f->blob, f->len);
	copy[0] ^= 1;
	assert_int_equal(index_open(copy, f->len, &h), -EBADMSG);
	assert_non_null(strstr(error_get(), "magic"));

	memcpy(copy, f->blob, f->len);
	copy[4] = 2;
	assert_int_equal(index_open(copy, f->len, &h), -EPROTO);

	memcpy(copy, f->blob, f->len);
	memset(copy + 8, 0xff, 8); /* tensor_count huge */
	assert_int_equal(index_open(copy, f->len, &h), -EBADMSG);

	memcpy(copy, f->blob, f->len);
	memset(copy + 24, 0, 8); /* no files */
	assert_int_equal(index_open(copy, f->len, &h), -EBADMSG);
	free(copy);
}

static void
test_damaged_records(void **state)
{
	struct fixture *f = *state;
	struct index_header h;
	struct index_tensor t;
	uint8_t *copy = malloc(f->len);
	uint8_t *rec;

	/* Each field of record 0 in turn pointed out of bounds. */
	static const size_t fields[] = { 0, 16, 24 };
	for (size_t k = 0; k < 3; k++) {
		memcpy(copy, f->blob, f->len);
		assert_int_equal(index_open(copy, f->len, &h), 0);
		rec = copy + h.tensor_offset;
		memset(rec + fields[k], 0x7f, 8);
		assert_int_equal(index_tensor_at(copy, &h, 0, &t), -EBADMSG);
		assert_non_null(strstr(error_get(), "damaged"));
	}
	/* The last string of the index ("me", a metadata value) loses its NUL. */
	memcpy(copy, f->blob, f->len);
	assert_int_equal(index_open(copy, f->len, &h), 0);
	copy[f->len - 1] = 'x';
	const char *v;
	assert_int_equal(index_meta_find(copy, &h, "author", &v), -EBADMSG);
	assert_int_equal(index_meta_find(copy, &h, "format", &v), 0);
	/* A size that does not match the shape. */
	memcpy(copy, f->blob, f->len);
	rec = copy + h.tensor_offset;
	rec[40] ^= 1;
	assert_int_equal(index_tensor_at(copy, &h, 0, &t), -EBADMSG);
	assert_non_null(strstr(error_get(), "does not match its shape"));
	/* An unknown dtype. */
	memcpy(copy, f->blob, f->len);
	rec = copy + h.tensor_offset;
	rec[8] = 200;
	assert_int_equal(index_tensor_at(copy, &h, 0, &t), -EBADMSG);
	free(copy);
}

static void
test_dtype_sizes(void **state)
{
	uint64_t shape[2] = { 3, 5 }, el = 0, nb = 0;
	const struct dtype_info *f4 = dtype_by_name("F4", 2), *f6 = dtype_by_name("F6_E2M3", 7);
	uint64_t big[2] = { UINT64_MAX / 2, 3 };

	(void)state;
	assert_non_null(f4);
	assert_null(dtype_by_name("f32", 3));
	assert_null(dtype_by_name("F3", 2));
	assert_null(dtype_by_code(22));
	assert_string_equal(dtype_by_code(2)->name, "BF16");
	assert_int_equal(dtype_nbytes(dtype_by_name("BF16", 4), shape, 2, &el, &nb), 0);
	assert_int_equal(el, 15);
	assert_int_equal(nb, 30);
	assert_int_equal(dtype_nbytes(f4, shape, 2, &el, &nb), -EINVAL); /* 60 bits */
	shape[1] = 4;
	assert_int_equal(dtype_nbytes(f4, shape, 2, &el, &nb), 0);
	assert_int_equal(nb, 6);
	assert_int_equal(dtype_nbytes(f6, shape, 2, &el, &nb), 0); /* 72 bits */
	assert_int_equal(nb, 9);
	assert_int_equal(dtype_nbytes(f4, shape, 0, &el, &nb), -EINVAL); /* scalar F4 */
	assert_int_equal(dtype_nbytes(dtype_by_name("F32", 3), big, 2, &el, &nb), -EOVERFLOW);
	for (uint32_t c = 0; c < DTYPE_COUNT; c++)
		assert_int_equal(dtype_by_code(c)->code, c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sorted_by_name, setup, teardown),
		cmocka_unit_test(test_sort_matches_strcmp),
		cmocka_unit_test_setup_teardown(test_fields_survive, setup, teardown),
		cmocka_unit_test_setup_teardown(test_find_missing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_files_and_metadata, setup, teardown),
		cmocka_unit_test(test_duplicate_names_rejected),
		cmocka_unit_test(test_builder_rejects_bad_input),
		cmocka_unit_test_setup_teardown(test_damaged_headers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_damaged_records, setup, teardown),
		cmocka_unit_test(test_dtype_sizes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
