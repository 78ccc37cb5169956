/*
 * file.c: opening and mapping one model file read-only.
 *
 * Every model byte a worker or the daemon reads comes through a mapping made
 * here: O_RDONLY | O_CLOEXEC, regular files only, PROT_READ. The mapping is
 * MAP_PRIVATE | MAP_NORESERVE: for pages nobody writes that is the same page
 * cache every other process maps (MAP_SHARED is no different for reading),
 * and it lets wc_model_cow() make a model writable copy-on-write for
 * bindings that have no read-only tensors (torch); MAP_NORESERVE keeps that
 * from being charged as private memory up front.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "file.h"

int
file_from_fd(int fd, const char *path, struct wc_file *out)
{
	struct wc_file f = { .fd = fd };
	void *base;

	if (fstat(fd, &f.st) == -1)
		return error_set(-errno, "%s: fstat: %s", path, strerror(errno));
	if (S_ISDIR(f.st.st_mode))
		return error_set(-EISDIR, "%s: is a directory", path);
	if (!S_ISREG(f.st.st_mode))
		return error_set(-EINVAL, "%s: not a regular file", path);
	if (f.st.st_size < 0 || (uint64_t)f.st.st_size > (uint64_t)SIZE_MAX)
		return error_set(-EFBIG, "%s: size %lld cannot be mapped", path,
			(long long)f.st.st_size);
	f.size = (uint64_t)f.st.st_size;
	if ((f.path = strdup(path)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", path);
	if (f.size > 0) {
		base = mmap(NULL, (size_t)f.size, PROT_READ, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
		if (base == MAP_FAILED) {
			int e = errno;

			free(f.path);
			return error_set(-e, "%s: mmap: %s", path, strerror(e));
		}
		f.base = base;
	}
	*out = f;
	return 0;
}

int
file_open(const char *path, struct wc_file *out)
{
	int fd, r;

	/* O_NONBLOCK: a FIFO or device named as a model must fail the type
	 * check below, not block here (it means nothing for regular files). */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	if ((r = file_from_fd(fd, path, out)) < 0)
		close(fd);
	return r;
}

void
file_close(struct wc_file *f)
{
	/* A file that was never opened (zeroed) has no path: nothing to do. */
	if (f == NULL || f->path == NULL)
		return;
	if (f->base != NULL)
		munmap((void *)f->base, (size_t)f->size);
	if (f->fd >= 0)
		close(f->fd);
	free(f->path);
	f->base = NULL;
	f->fd = -1;
	f->path = NULL;
	f->size = 0;
}

const char *
file_basename(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash != NULL && slash[1] != '\0' ? slash + 1 : path;
}

bool
file_has_suffix(const char *name, const char *suffix)
{
	size_t n = strlen(name), k = strlen(suffix);

	return n > k && strcmp(name + n - k, suffix) == 0;
}
