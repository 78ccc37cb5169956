/*
 * open.c: opening one file of a model through a format reader.
 *
 * A file is opened inside its model's tree (tree.h), the reader's parser is
 * given private copies of the bytes it asks for (file_read_bytes() in
 * base/file.c), never the mapping, and the file is checked to be unchanged
 * after the parse. open_read_file() does that for one file of an index
 * being built (shards.c calls it for each shard); open_model_file() makes a
 * whole model of one file (source.c, for safetensors and WEIG; lib/writer_big_endian.c
 * for a big-endian WEIG file).
 *
 * Layering: below shards.c and source.c, above the readers (safetensors.c,
 * weig.c), which it reaches only through the struct format_reader it is
 * given, and above tree.c and index.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "format/open.h"
#include "format/tree.h"

int
open_read_file(const struct wc_file *f, const struct format_reader *rd, uint32_t file_no,
	struct index_builder *b)
{
	struct file_bytes in;
	int r;

	if ((r = file_read_bytes(f, rd->head_len, rd->max_head, &in)) < 0)
		return r;
	r = rd->parse(f->path, &in, file_no, b);
	file_bytes_free(&in);
	if (r < 0)
		return r;
	return file_check_unchanged(f);
}

/* Reads the open file f with rd as a whole model of format: fills *out
 * and takes f on success; on failure f is still the caller's. */
static int
open_model_of(struct wc_file *f, const char *path, enum source_format format,
	const struct format_reader *rd, struct model_source *out)
{
	struct index_builder *b = NULL;
	struct wc_file *files = NULL;
	uint8_t *blob = NULL;
	size_t len = 0;
	uint32_t file_no;
	int r;

	if ((r = index_builder_new(&b)) < 0 ||
		(r = index_add_file(b, file_basename(path), f->size, &file_no)) < 0 ||
		(r = open_read_file(f, rd, file_no, b)) < 0 ||
		(r = index_build(b, path, &blob, &len)) < 0)
		goto fail;
	if ((files = malloc(sizeof(*files))) == NULL) {
		r = error_set(-ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	index_builder_free(b);
	files[0] = *f;
	memset(out, 0, sizeof(*out));
	out->format = format;
	out->files = files;
	out->nfiles = 1;
	out->index = blob;
	out->index_len = len;
	return 0;
fail:
	free(blob);
	index_builder_free(b);
	return r;
}

int
open_model_file(const char *path, enum source_format format, const struct format_reader *rd,
	struct model_source *out)
{
	struct wc_file f;
	int r;

	if ((r = tree_open_model_file(path, &f)) < 0)
		return r;
	if ((r = open_model_of(&f, path, format, rd, out)) < 0)
		file_close(&f);
	return r;
}

int
open_model_fd(int fd, const char *label, enum source_format format,
	const struct format_reader *rd, struct model_source *out)
{
	struct wc_file f;
	int r;

	if ((r = file_from_fd(fd, label, &f)) < 0)
		return r;
	if ((r = open_model_of(&f, label, format, rd, out)) < 0) {
		f.fd = -1; /* still the caller's */
		file_close(&f);
	}
	return r;
}
