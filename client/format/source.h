/*
 * source.h: a model opened from disk, before it becomes a wc_model or a
 * daemon generation: its files (open and mapped) and its compiled index.
 *
 * source_open() detects the format and calls the format readers below. Each
 * reader validates everything it reads, adds the model's files and tensors to
 * the index builder, and on failure leaves a message naming the file (the
 * shard, for sharded models) and the reason.
 */
#ifndef WC_SOURCE_H
#define WC_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "format/index.h"

enum source_format {
	FORMAT_SAFETENSORS = 1, /* one .safetensors file */
	FORMAT_SHARDED,         /* a shard index and its shards */
	FORMAT_WEIG,
};

struct model_source {
	enum source_format format;
	struct wc_file *files; /* nfiles entries, in index file order */
	size_t nfiles;
	uint8_t *index;        /* malloc'd WCIX block */
	size_t index_len;
};

/* Opens path (file, shard index, directory or WEIG) and fills *out. */
int source_open(const char *path, struct model_source *out);

/* The first four bytes of path as a little-endian u32 (a format's magic);
 * 0 when the file is shorter or unreadable (the format reader reports why). */
uint32_t source_magic(const char *path);

/* A format parser of one file (st_parse_bytes, weig_parse_bytes, ...):
 * validates the private bytes in (see file_bytes in file.h), adds its
 * tensors to b as file file_no; name is for messages. */
typedef int (*source_parse_fn)(const char *name, const struct file_bytes *in,
	uint32_t file_no, struct index_builder *b);

/* A format's reader: how much of a file its parser needs, and the parser. */
struct source_reader {
	file_head_fn head_len;
	uint64_t max_head; /* most head bytes it may ask for */
	source_parse_fn parse;
};

/*
 * Reads f's bytes the way rd says (private copies, with pread), parses them
 * as file file_no of b, then checks that f did not change meanwhile. On
 * failure the message is the parser's or names f.
 */
int source_parse_file(const struct wc_file *f, const struct source_reader *rd,
	uint32_t file_no, struct index_builder *b);

/*
 * Opens a model that is one file: opens path inside its model tree (tree.h),
 * reads it with rd as file 0, builds the index and fills *out as a source of
 * format. On failure *out is untouched, the file is closed and the message
 * is the parser's or names path.
 */
int source_open_file(const char *path, enum source_format format,
	const struct source_reader *rd, struct model_source *out);

/* Closes the files, frees the index; safe on a zeroed source. */
void source_close(struct model_source *s);

/* Name of a format for messages and `inspect --json`. */
const char *source_format_name(enum source_format f);

/* ---- safetensors (safetensors.c) ---- */

#define ST_MAX_HEADER 100000000ull

/*
 * Validates the safetensors file whose private bytes are in (its header
 * and layout; the data bytes are not read, only the file size counts) and adds its tensors to b as file file_no,
 * with absolute offsets. name is the file's name for messages. __metadata__
 * is validated in every file but added to b only when file_no is 0, so a
 * sharded model takes its first shard's metadata.
 */
int st_parse_bytes(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b);

/* st_parse_bytes() of a whole file image in memory (tests, fuzzers). */
int st_parse(const char *name, const uint8_t *file, uint64_t size, uint32_t file_no,
	struct index_builder *b);

extern const struct source_reader st_reader;

/* Opens one safetensors file as a source. */
int st_open(const char *path, struct model_source *out);

/* ---- sharded checkpoints (shards.c) ---- */

/* One entry of a shard index's weight_map. Strings point into storage the
 * shard_map owns. */
struct shard_map {
	char **shards;       /* distinct shard file names, in first-seen order */
	size_t nshards;
	char **tensors;      /* tensor names */
	uint32_t *tensor_shard; /* index into shards for each tensor */
	size_t ntensors;
	uint64_t total_size; /* metadata.total_size, 0 if absent (advisory) */
	int has_total_size;
};

/* Parses and validates a shard index document (JSON text of len bytes);
 * name is for messages. */
int shards_parse_index(const char *name, const char *json, size_t len, struct shard_map *out);
void shard_map_free(struct shard_map *m);

/* Opens a shard index file and every shard it names, cross-checks them. */
int shards_open(const char *index_path, struct model_source *out);

/* Opens a directory holding exactly one *.safetensors.index.json or exactly
 * one *.safetensors. */
int shards_open_dir(const char *dir, struct model_source *out);

/* ---- WEIG (weig.c) ---- */

#define WEIG_MAGIC 0x57454947u

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

extern const struct source_reader weig_reader;

/* Opens one WEIG file as a source. */
int weig_open(const char *path, struct model_source *out);

#endif
