/*
 * fuzz_safetensors.c: libFuzzer harness for the safetensors reader
 * (client/format/safetensors.c).
 *
 * The input is a whole file image. It is parsed as is, and once more with
 * its 8-byte header length rewritten so the header runs to the last '}' of
 * the input: random bytes almost never hold a consistent length, and without
 * the rewrite most mutations would stop at the length check instead of
 * reaching the JSON and tensor checks.
 *
 * What an accepted file promises, checked here: it compiles to an index;
 * every tensor lies inside the data area; the tensors' sizes add up to the
 * data area exactly (they tile it); the header is JSON jansson accepts too.
 * A refused file leaves a one-line message that names the file.
 *
 * Each image is parsed twice, with and without the canonical fast path of
 * safetensors.c: the verdict, the message and the index must be identical.
 * It is parsed once more from private copies cut short (fuzz_bytes.h), as a
 * file that changes while it is read gives them.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/error.h"
#include "fuzz_bytes.h"
#include "fuzz_message.h"
#include "format/index.h"
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* safetensors.c: 0 turns off the canonical fast path (for comparing). */
extern int st_canonical_fast_path;

#define NAME "fuzz.safetensors"

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "fuzz_safetensors: check failed at line %d: %s\n",     \
				__LINE__, #cond);                                        \
			abort();                                                         \
		}                                                                        \
	} while (0)

/* Parses one image; returns the verdict and, when accepted, the index. */
static int
parse_one(const uint8_t *data, size_t size, uint8_t **out, size_t *out_len)
{
	struct index_builder *b = NULL;
	struct index_header h;
	struct index_tensor t;
	uint8_t *blob = NULL;
	uint64_t n = 0, sum = 0;
	size_t len = 0;
	uint32_t no;
	int rc;

	CHECK(index_builder_new(&b) == 0);
	CHECK(index_add_file(b, NAME, size, &no) == 0);
	error_set(0, "%s", "");
	rc = st_parse(NAME, data, size, no, b);
	if (rc == 0)
		rc = index_build(b, NAME, &blob, &len);
	if (rc < 0) {
		const char *msg = error_get();

		CHECK(rc == -EINVAL || rc == -ENOMEM);
		CHECK(strncmp(msg, NAME ": ", strlen(NAME) + 2) == 0);
		CHECK(strchr(msg, '\n') == NULL);
		CHECK(fuzz_message_harmless(msg));
		goto out;
	}
	CHECK(size >= 8);
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | data[i];
	CHECK(n <= ST_MAX_HEADER && n <= size - 8);
	CHECK(index_open(blob, len, &h) == 0);
	for (uint64_t i = 0; i < h.tensor_count; i++) {
		CHECK(index_tensor_at(blob, &h, i, &t) == 0);
		CHECK(t.file == 0);
		CHECK(t.offset >= 8 + n && t.offset <= size && t.nbytes <= size - t.offset);
		sum += t.nbytes;
	}
	CHECK(sum == size - 8 - n);
	*out = blob;
	*out_len = len;
	blob = NULL;
	{
		/* the header is JSON for jansson too, unless it holds an integer
		 * above jansson's long long range (valid for us) */
		json_error_t err;
		json_t *v = json_loadb((const char *)data + 8, (size_t)n, 0, &err);

		CHECK(v != NULL || json_error_code(&err) == json_error_numeric_overflow);
		json_decref(v);
	}
out:
	free(blob);
	index_builder_free(b);
	return rc;
}

/* Parses with both paths and checks they agree exactly. */
static void
parse_both(const uint8_t *data, size_t size)
{
	uint8_t *fast = NULL, *general = NULL;
	size_t fast_len = 0, general_len = 0;
	char fast_msg[1024];
	int a, b;

	st_canonical_fast_path = 1;
	a = parse_one(data, size, &fast, &fast_len);
	snprintf(fast_msg, sizeof(fast_msg), "%s", error_get());
	st_canonical_fast_path = 0;
	b = parse_one(data, size, &general, &general_len);
	CHECK(a == b);
	if (a < 0)
		CHECK(strcmp(fast_msg, error_get()) == 0);
	else
		CHECK(fast_len == general_len && memcmp(fast, general, fast_len) == 0);
	free(fast);
	free(general);
}

/*
 * The parser's entry for files read from disk, on a head cut short (a file
 * that changed between the reads of its header): it may accept or refuse,
 * but reads only the bytes copied, and an accepted file's tensors lie inside
 * the file size.
 */
static void
parse_cut(const uint8_t *data, size_t size)
{
	struct index_builder *b = NULL;
	struct file_bytes in;
	uint32_t no;
	int rc;

	if (fuzz_bytes_cut(data, size, size / 2, &in) < 0)
		return;
	CHECK(index_builder_new(&b) == 0);
	CHECK(index_add_file(b, NAME, size, &no) == 0);
	rc = st_parse_bytes(NAME, &in, no, b);
	if (rc < 0)
		CHECK(strncmp(error_get(), NAME ": ", strlen(NAME) + 2) == 0);
	index_builder_free(b);
	fuzz_bytes_free(&in);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *close;
	uint8_t *copy;
	uint64_t n;

	parse_both(data, size);
	parse_cut(data, size);

	/* the same bytes with the header running to the last '}' */
	if (size < 9)
		return 0;
	for (close = data + size - 1; close > data + 8 && *close != '}'; close--)
		;
	if (*close != '}')
		return 0;
	n = (uint64_t)(close - data) + 1 - 8;
	if ((copy = malloc(size)) == NULL)
		return 0;
	memcpy(copy, data, size);
	for (int i = 0; i < 8; i++)
		copy[i] = (uint8_t)(n >> (8 * i));
	parse_both(copy, size);
	free(copy);
	return 0;
}
