/*
 * test_index_check.c: the full check of a stored index (daemon/index_check.c):
 * a good index passes and gives each file's first data offset; an index whose
 * header is fine but whose records are damaged, unsorted, duplicated or point
 * outside their files fails with a message naming the record; and random
 * damage never makes it read outside the index (run under ASan).
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
#include "format/index.h"
#include "index_check.h"
#include "proto/le.h"

/* The index every test reads (tests that damage it damage a copy). */
static struct {
	uint8_t *blob;
	size_t len;
	struct index_header h;
} ix;

static const uint64_t sizes[2] = { 1000, 2000 };

/* Three tensors in two files, added out of name order, and two metadata
 * entries: sorted by the builder as alpha, mid, zeta and author, format. */
static int
build_index(void **state)
{
	static const struct {
		const char *name;
		uint32_t dtype, file, ndim;
		uint64_t shape[2], offset, nbytes;
	} tensors[] = {
		{ "zeta", 0 /* F32 */, 1, 2, { 2, 3 }, 100, 24 },
		{ "alpha", 2 /* BF16 */, 0, 1, { 4, 0 }, 64, 8 },
		{ "mid", 4 /* U8 */, 0, 0, { 0, 0 }, 72, 1 },
	};
	struct index_builder *b;
	uint32_t no;

	(void)state;
	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "a.safetensors", sizes[0], &no), 0);
	assert_int_equal(index_add_file(b, "b.safetensors", sizes[1], &no), 0);
	for (size_t i = 0; i < sizeof(tensors) / sizeof(tensors[0]); i++)
		assert_int_equal(index_add_tensor(b, tensors[i].name, strlen(tensors[i].name),
					 tensors[i].dtype, tensors[i].file, tensors[i].shape,
					 tensors[i].ndim, tensors[i].offset, tensors[i].nbytes),
			0);
	assert_int_equal(index_add_meta(b, "format", 6, "pt", 2), 0);
	assert_int_equal(index_add_meta(b, "author", 6, "me", 2), 0);
	assert_int_equal(index_build(b, "test", &ix.blob, &ix.len), 0);
	index_builder_free(b);
	return index_open(ix.blob, ix.len, &ix.h);
}

static int
free_index(void **state)
{
	(void)state;
	free(ix.blob);
	return 0;
}

static void
test_good_index_passes(void **state)
{
	uint64_t first[2] = { 0, 0 };

	(void)state;
	assert_int_equal(index_check(ix.blob, &ix.h, sizes, 2, first), 0);
	assert_int_equal(first[0], 64);  /* alpha; mid is at 72 */
	assert_int_equal(first[1], 100); /* zeta */
	assert_int_equal(index_check(ix.blob, &ix.h, sizes, 2, NULL), 0);
}

/* Damage whose header stays valid: each must fail naming what is wrong,
 * and leave first_data alone. */
static void
test_damage_is_named(void **state)
{
	enum { SET, SWAP_NEXT, COPY_NEXT };
	/* In the order a case reads, not the one that packs best.
	 * NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding) */
	static const struct {
		int meta;        /* a metadata record, else a tensor record */
		uint64_t record;
		size_t field;    /* byte offset in the record */
		int how;         /* SET: to value; the same field of the next record */
		uint64_t value;
		const char *message;
	} cases[] = {
		/* zeta (in file 1) starts at 1990: 1990 + 24 > 2000 */
		{ 0, 2, 32, SET, 1990, "tensor \"zeta\": data [1990, +24) lies outside file 1" },
		/* alpha and mid change places, each record valid on its own */
		{ 0, 0, 0, SWAP_NEXT, 0, "(\"alpha\") is not after \"mid\"" },
		{ 0, 0, 0, COPY_NEXT, 0,
			"(\"mid\") is not after \"mid\": the records are not sorted" },
		/* a name past the end: index_tensor_at's own check, reported */
		{ 0, 1, 0, SET, 1u << 20, "tensor record 1 is damaged" },
		{ 1, 0, 0, SWAP_NEXT, 0, "the keys are not sorted" },
	};
	uint8_t *copy = malloc(ix.len);

	(void)state;
	assert_non_null(copy);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t size = cases[i].meta ? INDEX_META_SIZE : INDEX_RECORD_SIZE;
		size_t at = (size_t)(cases[i].meta ? ix.h.meta_offset : ix.h.tensor_offset) +
			(size_t)cases[i].record * size + cases[i].field;
		uint64_t first[2] = { 7, 7 }, mine = get_le64(ix.blob + at),
			 next = get_le64(ix.blob + at + size);

		memcpy(copy, ix.blob, ix.len);
		put_le64(copy + at, cases[i].how == SET ? cases[i].value : next);
		if (cases[i].how == SWAP_NEXT)
			put_le64(copy + at + size, mine);
		assert_int_equal(index_check(copy, &ix.h, sizes, 2, first), -EBADMSG);
		if (strstr(error_get(), cases[i].message) == NULL)
			fail_msg("case %zu: \"%s\" does not say \"%s\"", i, error_get(),
				cases[i].message);
		assert_int_equal(first[0], 7);
		assert_int_equal(first[1], 7);
	}
	free(copy);
}

/* The model's files must be the index's: their count and sizes. */
static void
test_files_must_match(void **state)
{
	const uint64_t other[2] = { 1000, 1999 };

	(void)state;
	assert_int_equal(index_check(ix.blob, &ix.h, sizes, 1, NULL), -EBADMSG);
	assert_non_null(strstr(error_get(), "2 files, the model has 1"));
	assert_int_equal(index_check(ix.blob, &ix.h, other, 2, NULL), -EBADMSG);
	assert_non_null(strstr(error_get(),
		"file 1 (b.safetensors): 2000 bytes, the file has 1999"));
}

/* Any byte changed anywhere: an error or a pass, never a read outside the
 * blob (an exactly sized copy, so ASan sees the first byte past it). */
static void
test_random_damage_stays_inside(void **state)
{
	uint8_t *copy = malloc(ix.len);
	unsigned seed = 12;

	(void)state;
	assert_non_null(copy);
	for (int round = 0; round < 20000; round++) {
		struct index_header h;
		uint64_t first[2];

		memcpy(copy, ix.blob, ix.len);
		for (int k = 0; k < 1 + round % 4; k++)
			copy[(size_t)rand_r(&seed) % ix.len] = (uint8_t)rand_r(&seed);
		if (index_open(copy, ix.len, &h) == 0)
			(void)index_check(copy, &h, sizes, 2, first);
	}
	free(copy);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good_index_passes),
		cmocka_unit_test(test_damage_is_named),
		cmocka_unit_test(test_files_must_match),
		cmocka_unit_test(test_random_damage_stays_inside),
	};

	return cmocka_run_group_tests(tests, build_index, free_index);
}
