/*
 * writer.h: writing models to disk (safetensors and WEIG), the layout
 * constants of WEIG that the reader (weig.c) and the writer share, and the
 * big-endian WEIG reader that `wcachectl convert` uses.
 *
 * Writers never leave a partial output: they write a temporary file in the
 * output's directory, fsync it and rename it over the output path; on any
 * failure they unlink the temporary file and the output path is untouched.
 * Errors follow error.h: a negative errno code and a message naming the file.
 */
#ifndef WC_WRITER_H
#define WC_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "index.h"
#include "wcache.h"

/* ---- WEIG layout (proto/FORMAT.md) ---- */

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
	uint32_t magic;        /* WEIG_MAGIC (source.h) */
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

/*
 * weig.c: reads a big-endian WEIG file (every integer of the header, records,
 * metadata table, shapes and trailer byte-swapped) with the same validation
 * as weig_parse() and adds it to b. The offsets added are those of the
 * big-endian file: its data must be byte-swapped before use, which is why
 * only the converter calls this.
 */
int weig_parse_big_endian(const char *name, const uint8_t *file, uint64_t size,
	uint32_t file_no, struct index_builder *b);

/* The reader of big-endian WEIG files for source_open_file(). */
extern const struct source_reader weig_big_endian_reader;

/* ---- writers (writer.c) ---- */

enum writer_format {
	WRITER_WEIG = 1,
	WRITER_SAFETENSORS,
};

/*
 * Writes m as a WEIG file: records sorted by name, metadata when m has any,
 * data region at a multiple of 4096, each tensor at a multiple of 64, trailer.
 */
int writer_weig(const wc_model *m, const char *out_path);

/*
 * Writes m as a standard safetensors file: a JSON header (with __metadata__
 * when m has metadata) padded with spaces to a multiple of 8 bytes, then the
 * tensors' data back to back, in byte order of names.
 */
int writer_safetensors(const wc_model *m, const char *out_path);

/*
 * Reads the big-endian WEIG file in_path, validates it completely and writes
 * it to out_path in format fmt, little-endian: every element is byte-swapped
 * according to its dtype's size (2, 4 or 8 bytes; C64 as two 4-byte floats;
 * 1-byte and sub-byte types unchanged).
 */
int writer_from_big_endian(const char *in_path, enum writer_format fmt, const char *out_path);

/* Byte-swaps n bytes from src into dst, elements of elem_size bytes (1, 2,
 * 4 or 8; 1 copies). n must be a multiple of elem_size; src and dst may be
 * the same buffer. Exposed for the tests. */
void writer_swap_elements(uint8_t *dst, const uint8_t *src, size_t n, unsigned elem_size);

/* Size of the elements a big-endian to little-endian conversion swaps for
 * this WEIG dtype code: 1 (nothing to swap), 2, 4 or 8; 0 for an unknown
 * code. */
unsigned writer_swap_size(uint32_t dtype);

#endif
