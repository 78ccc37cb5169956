/*
 * outfile.c: the buffered output file of outfile.h, which nobody ever sees
 * partial: a temporary file beside the output path, fsync'd and renamed
 * over it once complete, or a descriptor the caller owns.
 *
 * How a file appears whole (a temporary name in the same directory, fsync
 * before rename, the directory fsync'd after) is kept apart from what the
 * file holds: the writers lay out WEIG and safetensors files and never see
 * a temporary name, and this file never sees a model. Data goes from the
 * caller's memory to the file in large writes; a conversion (the byte swap
 * of a big-endian file) happens through the buffer, with the function the
 * caller passes.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "lib/outfile.h"

#define OUTFILE_BUFFER_SIZE (1u << 20) /* multiple of 8: converted chunks fit whole */
#define OUTFILE_MAX_WRITE (1u << 30)   /* one write(2) at most */

int
outfile_begin(const char *path, struct outfile *o)
{
	const char *slash = strrchr(path, '/');
	const char *base = slash != NULL ? slash + 1 : path;
	int e;

	memset(o, 0, sizeof(*o));
	o->path = path;
	o->fd = -1;
	if (*base == '\0')
		return error_set(-EISDIR, "%s: output path names a directory", path);
	/* Keep the temporary name within NAME_MAX whatever the base's length. */
	if (asprintf(&o->tmp, "%.*s.%.200s.XXXXXX", (int)(base - path), path, base) < 0) {
		o->tmp = NULL;
		return error_set(-ENOMEM, "%s: out of memory", path);
	}
	o->fd = mkostemp(o->tmp, O_CLOEXEC);
	if (o->fd < 0) {
		e = errno;
		free(o->tmp);
		o->tmp = NULL;
		return error_set(-e, "%s: cannot create a temporary file beside it: %s", path,
			strerror(e));
	}
	if (fchmod(o->fd, 0644) < 0) {
		e = errno;
		goto fail;
	}
	o->buf = malloc(OUTFILE_BUFFER_SIZE);
	if (o->buf == NULL) {
		e = ENOMEM;
		goto fail;
	}
	return 0;
fail:
	close(o->fd);
	unlink(o->tmp);
	free(o->tmp);
	o->tmp = NULL;
	o->fd = -1;
	return error_set(-e, "%s: %s", path, strerror(e));
}

void
outfile_abort(struct outfile *o)
{
	if (o->fd >= 0 && !o->borrowed)
		close(o->fd);
	if (o->tmp != NULL)
		unlink(o->tmp);
	free(o->tmp);
	free(o->buf);
	o->fd = -1;
	o->tmp = NULL;
	o->buf = NULL;
}

int
outfile_begin_fd(int fd, const char *what, struct outfile *o)
{
	memset(o, 0, sizeof(*o));
	o->path = what;
	o->fd = fd;
	o->borrowed = 1;
	if ((o->buf = malloc(OUTFILE_BUFFER_SIZE)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", what);
	return 0;
}

/* Writes all of p[0..n) to the file, unbuffered. */
static int
outfile_write_all(const struct outfile *o, const uint8_t *p, uint64_t n)
{
	while (n > 0) {
		size_t chunk = n > OUTFILE_MAX_WRITE ? OUTFILE_MAX_WRITE : (size_t)n;
		ssize_t w = write(o->fd, p, chunk);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return error_set(-errno, "%s: write: %s", o->path, strerror(errno));
		}
		if (w == 0)
			return error_set(-EIO, "%s: write returned 0", o->path);
		p += w;
		n -= (uint64_t)w;
	}
	return 0;
}

int
outfile_flush(struct outfile *o)
{
	int rc = outfile_write_all(o, o->buf, o->used);

	o->used = 0;
	return rc;
}

int
outfile_put(struct outfile *o, const void *p, uint64_t n)
{
	int rc;

	if (n > OUTFILE_BUFFER_SIZE - o->used) {
		if ((rc = outfile_flush(o)) < 0)
			return rc;
		if (n >= OUTFILE_BUFFER_SIZE) {
			o->pos += n;
			return outfile_write_all(o, p, n);
		}
	}
	if (n > 0)
		memcpy(o->buf + o->used, p, (size_t)n);
	o->used += (size_t)n;
	o->pos += n;
	return 0;
}

int
outfile_zeros(struct outfile *o, uint64_t n)
{
	int rc;

	while (n > 0) {
		size_t chunk;

		if (o->used == OUTFILE_BUFFER_SIZE && (rc = outfile_flush(o)) < 0)
			return rc;
		chunk = OUTFILE_BUFFER_SIZE - o->used;
		if (chunk > n)
			chunk = (size_t)n;
		memset(o->buf + o->used, 0, chunk);
		o->used += chunk;
		o->pos += chunk;
		n -= chunk;
	}
	return 0;
}

int
outfile_put_converted(struct outfile *o, const uint8_t *p, uint64_t n, unsigned elem_size,
	outfile_convert_fn *convert)
{
	int rc;

	if (elem_size <= 1)
		return outfile_put(o, p, n);
	if (n % elem_size != 0)
		return error_set(-EINVAL, "%s: %" PRIu64 " bytes are not whole %u-byte elements",
			o->path, n, elem_size);
	while (n > 0) {
		size_t chunk = OUTFILE_BUFFER_SIZE - o->used;

		chunk -= chunk % elem_size;
		if (chunk == 0) {
			if ((rc = outfile_flush(o)) < 0)
				return rc;
			continue;
		}
		if (chunk > n)
			chunk = (size_t)n;
		convert(o->buf + o->used, p, chunk, elem_size);
		o->used += chunk;
		o->pos += chunk;
		p += chunk;
		n -= chunk;
	}
	return 0;
}

int
outfile_commit(struct outfile *o)
{
	const char *slash = strrchr(o->path, '/');
	char *dir;
	int rc, dfd;

	if ((rc = outfile_flush(o)) < 0)
		return rc;
	if (fsync(o->fd) < 0)
		return error_set(-errno, "%s: fsync: %s", o->path, strerror(errno));
	rc = close(o->fd);
	o->fd = -1;
	if (rc < 0)
		return error_set(-errno, "%s: close: %s", o->path, strerror(errno));
	if (rename(o->tmp, o->path) < 0)
		return error_set(-errno, "%s: rename from %s: %s", o->path, o->tmp,
			strerror(errno));
	free(o->tmp);
	o->tmp = NULL;
	/* Best effort: the file is complete; a failing directory fsync (some
	 * filesystems refuse it) does not make it less so. */
	if (slash == NULL)
		dir = strdup(".");
	else if (slash == o->path)
		dir = strdup("/");
	else
		dir = strndup(o->path, (size_t)(slash - o->path));
	if (dir != NULL) {
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			(void)fsync(dfd);
			close(dfd);
		}
		free(dir);
	}
	return 0;
}
