/*
 * fuzz_shards.c: libFuzzer harness for the shard index parser
 * (shards_parse_index in client/format/shards.c).
 *
 * The input is the text of a model.safetensors.index.json. A map that is
 * accepted must keep the promises shards_open relies on: at least one tensor
 * and one shard, at most INDEX_MAX_FILES shards, every tensor naming an
 * existing shard, unique non-empty tensor names, and shard names that are
 * plain *.safetensors file names with no '/'. A refused document leaves a
 * one-line message that names the file.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "format/index.h"
#include "format/shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz.safetensors.index.json"

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "fuzz_shards: check failed at line %d: %s\n", __LINE__, \
				#cond);                                                  \
			abort();                                                         \
		}                                                                        \
	} while (0)

static int
compare_strings(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct shard_map m = { 0 };
	char **sorted;
	int rc;

	error_set(0, "%s", "");
	rc = shards_parse_index(NAME, (const char *)data, size, &m);
	if (rc < 0) {
		const char *msg = error_get();

		CHECK(rc == -EINVAL || rc == -E2BIG || rc == -ENOMEM);
		CHECK(strncmp(msg, NAME ": ", strlen(NAME) + 2) == 0);
		CHECK(strchr(msg, '\n') == NULL);
		CHECK(m.tensors == NULL && m.shards == NULL);
		return 0;
	}
	CHECK(m.ntensors >= 1 && m.nshards >= 1 && m.nshards <= INDEX_MAX_FILES);
	for (size_t i = 0; i < m.nshards; i++) {
		size_t n = strlen(m.shards[i]);

		CHECK(n > strlen(".safetensors") && n <= 255);
		CHECK(strcmp(m.shards[i] + n - strlen(".safetensors"), ".safetensors") == 0);
		CHECK(strchr(m.shards[i], '/') == NULL);
		for (size_t k = 0; k < i; k++)
			CHECK(strcmp(m.shards[k], m.shards[i]) != 0);
	}
	for (size_t i = 0; i < m.ntensors; i++) {
		size_t n = strlen(m.tensors[i]);

		CHECK(n >= 1 && n <= INDEX_MAX_NAME);
		CHECK(m.tensor_shard[i] < m.nshards);
	}
	/* unique tensor names */
	sorted = malloc(m.ntensors * sizeof(*sorted));
	CHECK(sorted != NULL);
	memcpy(sorted, m.tensors, m.ntensors * sizeof(*sorted));
	qsort(sorted, m.ntensors, sizeof(*sorted), compare_strings);
	for (size_t i = 1; i < m.ntensors; i++)
		CHECK(strcmp(sorted[i - 1], sorted[i]) != 0);
	free(sorted);
	shard_map_free(&m);
	return 0;
}
