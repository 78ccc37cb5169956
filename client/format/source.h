/*
 * source.h: opening a model from disk, whatever its format, before it
 * becomes a wc_model or a daemon generation (struct model_source, open.h).
 *
 * source_open() detects the format with source.c's table of formats and
 * opens the model with that format's reader (open.c) or, for a sharded
 * model, its opener (shards.c). Each reader validates everything it reads,
 * adds the model's files and tensors to the index builder, and on failure
 * leaves a message naming the file (the shard, for sharded models) and the
 * reason. The readers' own entry points (st_parse, weig_parse, ...) are in
 * format/safetensors.h, format/weig.h and format/shards.h.
 */
#ifndef WC_SOURCE_H
#define WC_SOURCE_H

#include <stdint.h>

#include "format/open.h"

/* Opens path (file, shard index, directory or WEIG) and fills *out. */
int source_open(const char *path, struct model_source *out);

/* The first four bytes of path as a little-endian u32 (a format's magic)
 * in *magic: 0 when the file is shorter, not there or not a regular file
 * (which is never opened; the format reader reports why). 0, or -errno
 * with the message when it cannot be looked at, opened or read (EINTR is
 * retried). */
int source_read_magic(const char *path, uint32_t *magic);

/* source_read_magic()'s magic, 0 when it fails. */
uint32_t source_magic(const char *path);

/* The reader of a one-file model whose first four bytes, as a little-endian
 * u32, are magic: WEIG's (either byte order), else safetensors'. */
const struct format_reader *source_file_reader(uint32_t magic);

/* Opens the one-file model (safetensors, or WEIG by its magic) open as fd,
 * named label in messages; takes fd on success only (open_model_fd). */
int source_open_fd(int fd, const char *label, struct model_source *out);

/* Closes the files, frees the index; safe on a zeroed source. */
void source_close(struct model_source *s);

/* Name of a format for messages and `inspect --json`. */
const char *source_format_name(enum source_format f);

#endif
