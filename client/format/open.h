/*
 * open.h: opening one file of a model through a format reader, and what an
 * opened model is (struct model_source).
 *
 * This is the layer between the readers, which only parse (reader.h), and
 * the openers that decide what to open: shards.c (each shard of a sharded
 * model) and source.c (a model named by a path, through its table of
 * formats). Nothing here detects a format; the caller names the reader.
 */
#ifndef WC_OPEN_H
#define WC_OPEN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/file.h"
#include "format/index.h"
#include "format/reader.h"

enum source_format {
	FORMAT_SAFETENSORS = 1, /* one .safetensors file */
	FORMAT_SHARDED,         /* a shard index and its shards */
	FORMAT_WEIG,
};

/* A file's access ACL as file_acl_value (base/file.h) read it. */
struct source_acl {
	int state;            /* 1: it has one, value holds it; 0: none; -1: not told */
	int nfs4;             /* value is system.nfs4_acl's, not POSIX's */
	unsigned char *value; /* malloc'd, len bytes; NULL but for state 1 */
	size_t len;
};

/*
 * A model opened from disk, before it becomes a wc_model or a daemon
 * generation: its files (open and mapped) and its compiled index. Filled by
 * open_model_file() and shards_open(); source_close() (source.h) frees it.
 */
struct model_source {
	enum source_format format;
	struct wc_file *files; /* nfiles entries, in index file order */
	size_t nfiles;
	uint8_t *index;        /* malloc'd WCIX block */
	size_t index_len;
	/* FORMAT_SHARDED: the shard index file as it was opened (fstat), the
	 * file its path named; what wcached asks of it (its owner) is asked
	 * of what was read, not of whatever the path names later. */
	struct stat index_st;
	/* FORMAT_SHARDED: whether that file had a POSIX access ACL, or one
	 * that could not be told: its group bits are then the ACL's mask. */
	int index_acl;
	/* FORMAT_SHARDED: that file's access ACL, read from the descriptor it
	 * was read through (wcached judges who could read it by it). */
	struct source_acl index_acl_value;
};

/*
 * Reads f's bytes the way rd says (private copies, with pread), parses them
 * as file file_no of b, then checks that f did not change meanwhile. On
 * failure the message is the parser's or names f.
 */
int open_read_file(const struct wc_file *f, const struct format_reader *rd,
	uint32_t file_no, struct index_builder *b);

/*
 * Opens a model that is one file: opens path inside its model tree (tree.h),
 * reads it with rd as file 0, builds the index and fills *out as a source of
 * format. On failure *out is untouched, the file is closed and the message
 * is the parser's or names path.
 */
int open_model_file(const char *path, enum source_format format,
	const struct format_reader *rd, struct model_source *out);

/*
 * open_model_file() of a descriptor already open (a memfd a builder
 * published): label names it in messages and in the index. Takes fd on
 * success only; on failure fd is still the caller's, and open.
 */
int open_model_fd(int fd, const char *label, enum source_format format,
	const struct format_reader *rd, struct model_source *out);

#endif
