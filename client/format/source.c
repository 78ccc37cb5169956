/*
 * source.c: opening a model from a path, whatever its format.
 *
 * A directory is resolved by the shard code; a name ending in ".json" is a
 * shard index; a file whose first four bytes are the WEIG magic (either byte
 * order, so the WEIG reader can explain a big-endian file) is WEIG; anything
 * else is read as safetensors, whose reader explains what it finds instead.
 * A model that is one file, whatever its format, is opened the same way:
 * source_open_file() opens it inside its model's tree (tree.h), reads
 * private copies of the bytes its format's parser needs and parses them.
 */
#include <byteswap.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "proto/le.h"
#include "format/source.h"
#include "format/tree.h"

uint32_t
source_magic(const char *path)
{
	uint8_t b[4];
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	uint32_t v = 0;

	if (fd == -1)
		return 0;
	if (pread(fd, b, sizeof(b), 0) == (ssize_t)sizeof(b))
		v = get_le32(b);
	close(fd);
	return v;
}

int
source_open(const char *path, struct model_source *out)
{
	struct stat st;
	uint32_t magic;

	if (stat(path, &st) == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return shards_open_dir(path, out);
	if (file_has_suffix(path, ".json"))
		return shards_open(path, out);
	magic = source_magic(path);
	if (magic == WEIG_MAGIC || magic == bswap_32(WEIG_MAGIC))
		return weig_open(path, out);
	return st_open(path, out);
}

int
source_parse_file(const struct wc_file *f, const struct source_reader *rd, uint32_t file_no,
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

int
source_open_file(const char *path, enum source_format format, const struct source_reader *rd,
	struct model_source *out)
{
	struct index_builder *b = NULL;
	struct wc_file f, *files = NULL;
	uint8_t *blob = NULL;
	size_t len = 0;
	uint32_t file_no;
	int r;

	if ((r = tree_open_model_file(path, &f)) < 0)
		return r;
	if ((r = index_builder_new(&b)) < 0 ||
		(r = index_add_file(b, file_basename(path), f.size, &file_no)) < 0 ||
		(r = source_parse_file(&f, rd, file_no, b)) < 0 ||
		(r = index_build(b, path, &blob, &len)) < 0)
		goto fail;
	if ((files = malloc(sizeof(*files))) == NULL) {
		r = error_set(-ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	index_builder_free(b);
	files[0] = f;
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
	file_close(&f);
	return r;
}

void
source_close(struct model_source *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->nfiles; i++)
		file_close(&s->files[i]);
	free(s->files);
	free(s->index);
	memset(s, 0, sizeof(*s));
}

const char *
source_format_name(enum source_format f)
{
	switch (f) {
	case FORMAT_SAFETENSORS:
	case FORMAT_SHARDED:
		return "safetensors";
	case FORMAT_WEIG:
		return "weig";
	}
	return "unknown";
}
