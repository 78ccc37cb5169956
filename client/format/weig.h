/*
 * weig.h: the WEIG layout (proto/FORMAT.md) that the reader (weig.c) and the
 * writer (lib/writer_weig.c) share, and the WEIG readers: the little-endian one
 * that source.c lists in its table of formats, and the big-endian one that
 * `wcachectl convert` uses (through lib/writer_big_endian.c and format/open.h). Like
 * every reader (format/reader.h), weig.c only parses: it opens no file.
 */
#ifndef WC_WEIG_H
#define WC_WEIG_H

#include <stdint.h>

#include "base/file.h"
#include "format/index.h"
#include "format/reader.h"

/* ---- WEIG layout (proto/FORMAT.md) ---- */

#define WEIG_MAGIC 0x57454947u

#define WEIG_VERSION 1u
#define WEIG_HEADER_SIZE 64u
#define WEIG_RECORD_SIZE 48u        /* struct index_record */
#define WEIG_META_ENTRY_SIZE 16u    /* struct index_meta_record */
#define WEIG_TRAILER_SIZE 16u       /* "WEIGTAIL" then u64 file_size */
#define WEIG_TRAILER_MAGIC "WEIGTAIL" /* 8 bytes, no NUL, same in both byte orders */
#define WEIG_DATA_ALIGN 4096u       /* alignment of the data region */
#define WEIG_TENSOR_ALIGN 64u       /* minimum alignment of each tensor's data */
#define WEIG_FLAG_METADATA 1u       /* reserved[0] = metadata table, reserved[1] = count */
#define WEIG_FLAGS_KNOWN WEIG_FLAG_METADATA

/* The 64-byte header, as documented; the reader reads it field by field
 * (with memcpy and a byte-order conversion), never through this struct. */
struct weig_header {
	uint32_t magic;        /* WEIG_MAGIC */
	uint32_t version;      /* WEIG_VERSION */
	uint64_t tensor_count;
	uint64_t meta_offset;  /* offset of the tensor record table */
	uint64_t data_offset;  /* start of the data region, multiple of 4096 */
	uint64_t file_size;
	uint64_t flags;        /* WEIG_FLAG_*; unknown bits are rejected */
	uint64_t reserved[2];  /* metadata table offset and count, else 0 */
};
_Static_assert(sizeof(struct weig_header) == WEIG_HEADER_SIZE, "WEIG header is 64 bytes");
_Static_assert(WEIG_RECORD_SIZE == INDEX_RECORD_SIZE, "WEIG records are index records");
_Static_assert(WEIG_META_ENTRY_SIZE == INDEX_META_SIZE, "WEIG metadata entries are index ones");

/* ---- the readers (weig.c) ---- */

/*
 * Validates the WEIG file whose private bytes are in: the head holds the
 * tables (everything before the data region), the tail the trailer and
 * adds its tensors and metadata to b as file file_no. A byte-swapped magic
 * is -EPROTO with a message that says the file is big-endian and that
 * `wcachectl convert` makes a little-endian copy.
 */
int weig_parse_bytes(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b);

/* weig_parse_bytes() of a whole file image in memory (tests, fuzzers). */
int weig_parse(const char *name, const uint8_t *file, uint64_t size, uint32_t file_no,
	struct index_builder *b);

/* Most bytes of tables (everything before the data region) read from a WEIG
 * file: 48-byte records, names and shapes of a few million tensors. */
#define WEIG_MAX_TABLES (1ull << 30)

/* The reader of little-endian WEIG files (source.c's table). */
extern const struct format_reader weig_reader;

/*
 * Reads a big-endian WEIG file (every integer of the header, records,
 * metadata table, shapes and trailer byte-swapped) with the same validation
 * as weig_parse() and adds it to b. The offsets added are those of the
 * big-endian file: its data must be byte-swapped before use, which is why
 * only the converter calls this.
 */
int weig_parse_big_endian(const char *name, const uint8_t *file, uint64_t size,
	uint32_t file_no, struct index_builder *b);

/* The reader of big-endian WEIG files, for open_model_file() (format/open.h). */
extern const struct format_reader weig_big_endian_reader;

#endif
