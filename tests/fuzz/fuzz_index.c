/*
 * fuzz_index.c: arbitrary bytes as a compiled index, as a worker would map
 * one from the daemon. Every reader function must return an error or a
 * result inside the buffer, never read outside it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/index.h"

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
	}
	free(copy);
	return 0;
}
