/*
 * fuzz_index.c: arbitrary bytes as a compiled index, as a worker would map
 * one from the daemon. Every reader function must return an error or a
 * result inside the buffer, never read outside it.
 *
 * The same bytes also go through daemon/index_check.c, as an index a warm
 * restart took back from the file descriptor store: its files' sizes are
 * the ones the index's own file records give (so that the fuzzer gets past
 * the size check to the records). An index it accepts keeps what the daemon
 * relies on: every tensor inside its file, each file's first data offset
 * within the file, and index_find() finding every tensor at its own record.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/index.h"
#include "index_check.h"
#include "fuzz_check.h"

/* index_check() with the file sizes the index states; checks an acceptance. */
static void
check_stored(const uint8_t *blob, const struct index_header *h)
{
	uint64_t size[INDEX_MAX_FILES], first[INDEX_MAX_FILES];
	struct index_tensor t, found;

	for (uint64_t k = 0; k < h->file_count; k++)
		if (index_file_at(blob, h, k, NULL, &size[k]) < 0)
			size[k] = 0;
	if (index_check(blob, h, size, (size_t)h->file_count, first) < 0)
		return;
	for (uint64_t k = 0; k < h->file_count; k++)
		CHECK(first[k] <= size[k]);
	for (uint64_t i = 0; i < h->tensor_count && i < 4096; i++) {
		CHECK(index_tensor_at(blob, h, i, &t) == 0);
		CHECK(t.offset <= size[t.file] && t.nbytes <= size[t.file] - t.offset);
		CHECK(t.offset >= first[t.file]);
		CHECK(index_find(blob, h, t.name, &found) == 0 && found.name == t.name);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct index_header h;
	struct index_tensor t;
	const char *a, *b;
	uint64_t n;
	uint8_t *copy;

	/* Readers need the alignment a mapping or malloc gives. */
	if ((copy = malloc(size ? size : 1)) == NULL)
		return 0;
	memcpy(copy, data, size);
	if (index_open(copy, size, &h) == 0) {
		for (uint64_t i = 0; i < h.tensor_count && i < 4096; i++)
			if (index_tensor_at(copy, &h, i, &t) == 0) {
				volatile size_t len = strlen(t.name);
				(void)len;
				for (uint32_t d = 0; d < t.ndim; d++)
					n = t.shape[d];
				(void)index_find(copy, &h, t.name, &t);
			}
		for (uint64_t i = 0; i < h.file_count; i++)
			(void)index_file_at(copy, &h, i, &a, &n);
		for (uint64_t i = 0; i < h.meta_count && i < 4096; i++)
			if (index_meta_at(copy, &h, i, &a, &b) == 0)
				(void)index_meta_find(copy, &h, a, &b);
		(void)index_find(copy, &h, "model.embed_tokens.weight", &t);
		check_stored(copy, &h);
	}
	free(copy);
	return 0;
}
