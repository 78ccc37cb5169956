/*
 * safetensors.h: the safetensors reader (safetensors.c).
 *
 * It validates one safetensors file from private copies of its bytes and
 * adds its tensors to an index builder; it opens no file. source.c opens a
 * .safetensors file with st_reader, shards.c each shard of a sharded model.
 */
#ifndef WC_SAFETENSORS_H
#define WC_SAFETENSORS_H

#include <stdint.h>

#include "base/file.h"
#include "format/index.h"
#include "format/reader.h"

/* Most bytes of JSON header a safetensors file may have. */
#define ST_MAX_HEADER 100000000ull

/*
 * Validates the safetensors file whose private bytes are in (its header
 * and layout; the data bytes are not read, only the file size counts) and
 * adds its tensors to b as file file_no, with absolute offsets. name is the
 * file's name for messages. __metadata__ is validated in every file but
 * added to b only when file_no is 0, so a sharded model takes its first
 * shard's metadata.
 */
int st_parse_bytes(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b);

/* st_parse_bytes() of a whole file image in memory (tests, fuzzers). */
int st_parse(const char *name, const uint8_t *file, uint64_t size, uint32_t file_no,
	struct index_builder *b);

/* The safetensors reader: the header length and header, then st_parse_bytes. */
extern const struct format_reader st_reader;

#endif
