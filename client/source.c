/*
 * source.c: opening a model from a path, whatever its format.
 *
 * A directory is resolved by the shard code; a name ending in ".json" is a
 * shard index; a file whose first four bytes are the WEIG magic (either byte
 * order, so the WEIG reader can explain a big-endian file) is WEIG; anything
 * else is read as safetensors, whose reader explains what it finds instead.
 */
#include <byteswap.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "source.h"

/* Reads the first four bytes of path as a little-endian u32; 0 when the
 * file is shorter or unreadable (the format reader reports why). */
static uint32_t
peek_magic(const char *path)
{
	uint32_t v = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);

	if (fd == -1)
		return 0;
	if (pread(fd, &v, sizeof(v), 0) != (ssize_t)sizeof(v))
		v = 0;
	close(fd);
	return le32toh(v);
}

static int
has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
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
	if (has_suffix(path, ".json"))
		return shards_open(path, out);
	magic = peek_magic(path);
	if (magic == WEIG_MAGIC || magic == bswap_32(WEIG_MAGIC))
		return weig_open(path, out);
	return st_open(path, out);
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
