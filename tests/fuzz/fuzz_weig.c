/*
 * fuzz_weig.c: libFuzzer harness for the WEIG reader (client/format/weig.c).
 *
 * The input is a file image. It is parsed as is, little-endian and
 * big-endian, into an index builder, and a parse that succeeds must compile
 * into an index whose every tensor lies inside the image. A random image
 * almost never has a matching file_size and trailer, which would stop every
 * parse at the header; so each input is also parsed once more with those two
 * fields patched to the image's size, letting the fuzzer reach the record,
 * name, shape, data and metadata checks.
 */
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_bytes.h"
#include "format/index.h"
#include "format/weig.h"
#include "lib/writer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

/* Parses one image and checks what a successful parse promises. */
static void
parse_one(const uint8_t *data, size_t size, int big_endian)
{
	struct index_builder *b = NULL;
	struct index_header h;
	struct index_tensor t;
	const char *k, *v;
	uint8_t *blob = NULL;
	size_t len = 0;
	uint32_t no;
	int rc;

	if (index_builder_new(&b) < 0)
		return;
	if (index_add_file(b, "fuzz.weig", size, &no) < 0)
		goto out;
	rc = big_endian ? weig_parse_big_endian("fuzz.weig", data, size, no, b)
			: weig_parse("fuzz.weig", data, size, no, b);
	if (rc < 0 || index_build(b, "fuzz.weig", &blob, &len) < 0)
		goto out;
	if (index_open(blob, len, &h) < 0)
		abort(); /* a validated file must compile to a valid index */
	for (uint64_t i = 0; i < h.tensor_count; i++) {
		if (index_tensor_at(blob, &h, i, &t) < 0)
			abort();
		if (t.offset > size || t.nbytes > size - t.offset || t.offset % 64 != 0)
			abort();
		/* Touch the data the index promises is inside the image (ASan
		 * checks the reads). */
		if (t.nbytes > 0) {
			sink = data[t.offset];
			sink = data[t.offset + t.nbytes - 1];
		}
	}
	for (uint64_t i = 0; i < h.meta_count; i++)
		if (index_meta_at(blob, &h, i, &k, &v) < 0)
			abort();
out:
	free(blob);
	index_builder_free(b);
}

/* The parser's entry for files read from disk, on tables cut short (a file
 * that changed between the reads): it reads only the bytes copied. */
static void
parse_cut(const uint8_t *data, size_t size)
{
	struct index_builder *b = NULL;
	struct file_bytes in;
	uint32_t no;

	if (fuzz_bytes_cut(data, size, size / 2, &in) < 0)
		return;
	if (index_builder_new(&b) == 0 && index_add_file(b, "fuzz.weig", size, &no) == 0)
		(void)weig_parse_bytes("fuzz.weig", &in, no, b);
	index_builder_free(b);
	fuzz_bytes_free(&in);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy;

	parse_one(data, size, 0);
	parse_one(data, size, 1);
	parse_cut(data, size);
	if (size < WEIG_HEADER_SIZE + WEIG_TRAILER_SIZE)
		return 0;

	/* The same image with file_size and the trailer made to match. */
	copy = malloc(size);
	if (copy == NULL)
		return 0;
	memcpy(copy, data, size);
	for (int be = 0; be <= 1; be++) {
		uint64_t n = be ? htobe64(size) : htole64(size);
		uint32_t magic = be ? htobe32(WEIG_MAGIC) : htole32(WEIG_MAGIC);

		memcpy(copy, &magic, 4);
		memcpy(copy + 32, &n, 8);
		/* The magic's 8 bytes (no NUL), as weig.h says. */
		memcpy(copy + size - 16, WEIG_TRAILER_MAGIC, sizeof(uint64_t));
		memcpy(copy + size - 8, &n, 8);
		parse_one(copy, size, be);
	}
	free(copy);
	return 0;
}
