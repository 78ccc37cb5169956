/*
 * source.c: opening a model from a path, whatever its format: the table of
 * formats, detection, and closing what was opened.
 *
 * A directory holds one model, which shards.c finds (a shard index, else a
 * single .safetensors file). Otherwise the first format of the table whose
 * detect function accepts the path is the path's format: a name ending in
 * ".json" is a shard index; a file whose first four bytes are the WEIG
 * magic (either byte order, so the WEIG reader can explain a big-endian
 * file) is WEIG; anything else is read as safetensors, whose reader
 * explains what it finds instead. A format of one file is opened with its
 * reader by open_model_file() (open.c); a sharded model by its opener.
 *
 * Layering: the top of format/. This file calls open.c and shards.c and
 * names the readers (safetensors.c, weig.c) in its table; none of them
 * calls it back. Callers: lib/model.c, wcachectl, the daemon.
 */
#include <byteswap.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "proto/le.h"
#include "format/open.h"
#include "format/safetensors.h"
#include "format/shards.h"
#include "format/source.h"
#include "format/weig.h"

/*
 * One format: how to recognise it from a path, and how to open it: with a
 * reader through open_model_file() (a format of one file), or with a
 * multi-file opener (a sharded model; reader is then NULL).
 */
struct source_entry {
	enum source_format format;
	const char *name;                      /* for messages and `inspect --json` */
	/* true: path, whose first four bytes are magic (source_read_magic()),
	 * is in this format */
	bool (*detect)(const char *path, uint32_t magic);
	const struct format_reader *reader;    /* a one-file format's reader */
	int (*open_sharded)(const char *path, struct model_source *out);
};

static bool
detect_shard_index(const char *path, uint32_t magic)
{
	(void)magic;
	return file_has_suffix(path, ".json");
}

static bool
detect_weig(const char *path, uint32_t magic)
{
	(void)path;
	return magic == WEIG_MAGIC || magic == bswap_32(WEIG_MAGIC);
}

static bool
detect_any(const char *path, uint32_t magic)
{
	(void)path;
	(void)magic;
	return true;
}

/* In the order of detection: the last accepts anything. */
static const struct source_entry source_formats[] = {
	{ FORMAT_SHARDED, "safetensors", detect_shard_index, NULL, shards_open },
	{ FORMAT_WEIG, "weig", detect_weig, &weig_reader, NULL },
	{ FORMAT_SAFETENSORS, "safetensors", detect_any, &st_reader, NULL },
};

#define SOURCE_NFORMATS (sizeof(source_formats) / sizeof(source_formats[0]))

/* The table's entry of format f, or NULL. */
static const struct source_entry *
source_entry_of(enum source_format f)
{
	for (size_t i = 0; i < SOURCE_NFORMATS; i++)
		if (source_formats[i].format == f)
			return &source_formats[i];
	return NULL;
}

/* Opens path as a model of format e. */
static int
source_open_as(const struct source_entry *e, const char *path, struct model_source *out)
{
	if (e->open_sharded != NULL)
		return e->open_sharded(path, out);
	return open_model_file(path, e->format, e->reader, out);
}

const struct format_reader *
source_file_reader(uint32_t magic)
{
	return detect_weig(NULL, magic) ? &weig_reader : &st_reader;
}

int
source_open_fd(int fd, const char *label, struct model_source *out)
{
	uint8_t b[4];
	uint32_t magic = 0;
	const struct format_reader *rd;
	ssize_t n;

	while ((n = pread(fd, b, sizeof(b), 0)) < 0 && errno == EINTR)
		;
	if (n == (ssize_t)sizeof(b))
		magic = get_le32(b);
	rd = source_file_reader(magic);
	return open_model_fd(fd, label, rd == &weig_reader ? FORMAT_WEIG : FORMAT_SAFETENSORS,
		rd, out);
}

int
source_read_magic(const char *path, uint32_t *magic)
{
	uint8_t b[4];
	struct stat st;
	ssize_t n;
	int fd, e;

	*magic = 0;
	/* Only a regular file is opened: opening a FIFO or a device has effects
	 * of its own (a writer waiting on the FIFO goes on, a tape rewinds),
	 * and path is whatever the model's owner put there. fstat checks again
	 * what was opened, in case path changed in between. Not there, or not
	 * a regular file: no magic, and the reader says why. */
	if (stat(path, &st) == -1) {
		if (errno == ENOENT)
			return 0;
		return error_set(-errno, "%s: %s", path, strerror(errno));
	}
	if (!S_ISREG(st.st_mode))
		return 0;
	while ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) == -1 &&
		errno == EINTR)
		;
	if (fd == -1) {
		if (errno == ENOENT)
			return 0; /* gone since the stat */
		return error_set(-errno, "%s: %s", path, strerror(errno));
	}
	if (fstat(fd, &st) == -1) {
		e = errno;
		close(fd);
		return error_set(-e, "%s: fstat: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return 0;
	}
	while ((n = pread(fd, b, sizeof(b), 0)) < 0 && errno == EINTR)
		;
	e = errno;
	close(fd);
	if (n < 0)
		return error_set(-e, "%s: reading the start of the file: %s", path, strerror(e));
	if (n == (ssize_t)sizeof(b))
		*magic = get_le32(b);
	return 0;
}

uint32_t
source_magic(const char *path)
{
	uint32_t magic;

	return source_read_magic(path, &magic) == 0 ? magic : 0;
}

/* Opens the model a directory holds: its shard index, else its one
 * .safetensors file. */
static int
source_open_dir(const char *dir, struct model_source *out)
{
	char *path;
	bool is_index;
	int r;

	if ((r = shards_find_model(dir, &path, &is_index)) < 0)
		return r;
	r = source_open_as(source_entry_of(is_index ? FORMAT_SHARDED : FORMAT_SAFETENSORS), path,
		out);
	free(path);
	return r;
}

int
source_open(const char *path, struct model_source *out)
{
	struct stat st;
	uint32_t magic;
	int r;

	if (stat(path, &st) == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return source_open_dir(path, out);
	/* A magic that cannot be read is that error, not a file of another
	 * format that its reader would then misread. */
	if ((r = source_read_magic(path, &magic)) < 0)
		return r;
	for (size_t i = 0; i < SOURCE_NFORMATS; i++)
		if (source_formats[i].detect(path, magic))
			return source_open_as(&source_formats[i], path, out);
	return error_set(-EINVAL, "%s: not a model file", path); /* not reached: detect_any */
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
	free(s->index_acl_value.value);
	memset(s, 0, sizeof(*s));
}

const char *
source_format_name(enum source_format f)
{
	const struct source_entry *e = source_entry_of(f);

	return e != NULL ? e->name : "unknown";
}
