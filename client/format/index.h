/*
 * index.h: the compiled tensor index ("WCIX"), built once per model and read
 * by every worker without parsing.
 *
 * Layout (all little-endian, documented in proto/FORMAT.md):
 *   header (64 bytes), then tensor_count records of 48 bytes sorted by name
 *   (byte order), then file_count file records of 16 bytes, then meta_count
 *   metadata records of 16 bytes sorted by key, then a string and shape area.
 * Every offset is from the start of the index. Names and metadata strings are
 * NUL-terminated; shapes are arrays of u64 aligned to 8.
 *
 * The tensor record is the WEIG record: the WEIG "pad" word holds the number
 * of the file (shard) that holds the tensor's data, and data_offset is the
 * absolute offset in that file.
 *
 * The builder collects tensors from a format reader and writes the index into
 * one malloc'd block. The reader functions check every offset they follow,
 * on access, so opening an index costs O(1) whatever its size and a damaged
 * index is an error, never an out-of-bounds read.
 */
#ifndef WC_INDEX_H
#define WC_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "proto/bounds.h" /* INDEX_MAX_FILES, _NDIM, _NAME, _SIZE */

struct dtype_info;

#define INDEX_MAGIC 0x58494357u /* "WCIX" read as little-endian u32 */
#define INDEX_VERSION 1u
#define INDEX_HEADER_SIZE 64
#define INDEX_RECORD_SIZE 48
#define INDEX_FILE_SIZE 16
#define INDEX_META_SIZE 16

struct index_header {
	uint32_t magic;
	uint32_t version;
	uint64_t tensor_count;
	uint64_t tensor_offset;
	uint64_t file_count;
	uint64_t file_offset;
	uint64_t meta_count;
	uint64_t meta_offset;
	uint64_t total_size;
};
_Static_assert(sizeof(struct index_header) == INDEX_HEADER_SIZE, "index header is 64 bytes");

/* On-disk and in-index tensor record (same as WEIG). */
struct index_record {
	uint64_t name_offset;
	uint32_t dtype;
	uint32_t file; /* WEIG: pad */
	uint64_t shape_offset;
	uint64_t shape_count;
	uint64_t data_offset;
	uint64_t data_size;
};
_Static_assert(sizeof(struct index_record) == INDEX_RECORD_SIZE, "tensor record is 48 bytes");

struct index_file_record {
	uint64_t name_offset; /* file name as the model refers to it */
	uint64_t size;        /* expected size in bytes */
};
_Static_assert(sizeof(struct index_file_record) == INDEX_FILE_SIZE, "file record is 16 bytes");

struct index_meta_record {
	uint64_t key_offset;
	uint64_t value_offset;
};
_Static_assert(sizeof(struct index_meta_record) == INDEX_META_SIZE, "meta record is 16 bytes");

/* A tensor as the reader sees it: pointers into the index. */
struct index_tensor {
	const char *name;
	const struct dtype_info *type; /* the dtype's table entry */
	uint32_t dtype;
	uint32_t file;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t offset; /* absolute offset in file */
	uint64_t nbytes;
};

struct index_builder;

int index_builder_new(struct index_builder **out);
void index_builder_free(struct index_builder *b);

/* Adds a file; *file_no receives its number (0, 1, ...). name is copied. */
int index_add_file(struct index_builder *b, const char *name, uint64_t size, uint32_t *file_no);

/* Adds a tensor; name (name_len bytes, no NUL needed) and shape are copied.
 * The caller has validated dtype, shape, offset and size against its file. */
int index_add_tensor(struct index_builder *b, const char *name, size_t name_len, uint32_t dtype,
	uint32_t file_no, const uint64_t *shape, uint32_t ndim, uint64_t offset, uint64_t nbytes);

/* Adds a metadata entry; both strings are copied. */
int index_add_meta(struct index_builder *b, const char *key, size_t key_len, const char *value,
	size_t value_len);

/* Number of tensors added so far. */
size_t index_builder_count(const struct index_builder *b);

/* Makes room for tensors more tensors and string_bytes more bytes of names,
 * so that a reader that knows its input's size (a header of N bytes holds
 * at most N bytes of names) grows nothing while it adds. Optional. */
int index_builder_reserve(struct index_builder *b, size_t tensors, size_t string_bytes);

/*
 * Sorts tensors by name and metadata by key, rejects duplicates (the message
 * names the tensor or key, prefixed by what), and writes the index into a
 * malloc'd block the caller owns.
 */
int index_build(struct index_builder *b, const char *what, uint8_t **blob, size_t *len);

/* Checks the header of an index of len bytes (magic, version, that the
 * tables lie inside). O(1). */
int index_open(const uint8_t *blob, size_t len, struct index_header *out);

/* Reads the i-th tensor, checking everything it points to. */
int index_tensor_at(const uint8_t *blob, const struct index_header *h, uint64_t i,
	struct index_tensor *out);

/* Binary search by name; -ENOENT if absent. */
int index_find(const uint8_t *blob, const struct index_header *h, const char *name,
	struct index_tensor *out);

/* The i-th file's name and size. name may be NULL: then only the size is
 * read, and the name's bytes (which may lie on a page of their own) are not
 * touched; attach looks up sizes only and names only for messages. */
int index_file_at(const uint8_t *blob, const struct index_header *h, uint64_t i,
	const char **name, uint64_t *size);

/* The i-th metadata entry; and lookup by key (-ENOENT if absent). */
int index_meta_at(const uint8_t *blob, const struct index_header *h, uint64_t i,
	const char **key, const char **value);
int index_meta_find(const uint8_t *blob, const struct index_header *h, const char *key,
	const char **value);

/* Writes a shape as "[a, b, c]" into dst (cap bytes, at least 8), cut with
 * "..." when it does not fit; returns dst, for messages. */
const char *index_format_shape(char *dst, size_t cap, const uint64_t *shape, uint32_t ndim);

#endif
