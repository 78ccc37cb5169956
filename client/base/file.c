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
 *
 * Parsers never read that mapping: whoever can write the file could change
 * the bytes under them (or truncate them away: SIGBUS). They read private
 * copies made with pread (file_read_exact, file_read_bytes), and a file that
 * shrinks or changes while it is read fails its load with a message.
 *
 * Opens and fstats of model files go through file_openat and file_fstat,
 * which try again after EINTR (a signal during a call on a FUSE or NFS
 * mount), as the preads already do.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"

int
file_openat(int dir, const char *path, int flags)
{
	int fd;

	while ((fd = openat(dir, path, flags)) == -1 && errno == EINTR)
		;
	return fd;
}

int
file_fstat(int fd, struct stat *st)
{
	int r;

	while ((r = fstat(fd, st)) == -1 && errno == EINTR)
		;
	return r;
}

int
file_acl_value(int fd, unsigned char **value, size_t *len, int *nfs4)
{
	unsigned char buf[FILE_ACL_MAX];
	ssize_t n;

	*value = NULL;
	*len = 0;
	*nfs4 = 0;
	if (fd < 0)
		return -1;
	while ((n = fgetxattr(fd, "system.posix_acl_access", buf, sizeof(buf))) == -1 &&
		errno == EINTR)
		;
	if (n < 0 && errno == ENOTSUP) { /* EOPNOTSUPP too (one value): NFS keeps its own */
		*nfs4 = 1;
		while ((n = fgetxattr(fd, "system.nfs4_acl", buf, sizeof(buf))) == -1 &&
			errno == EINTR)
			;
	}
	if (n < 0)
		return errno == ENODATA || errno == ENOTSUP ? 0 : -1;
	if ((*value = malloc(n > 0 ? (size_t)n : 1)) == NULL)
		return -1;
	memcpy(*value, buf, (size_t)n);
	*len = (size_t)n;
	return 1;
}

int
file_from_fd(int fd, const char *path, struct wc_file *out)
{
	struct wc_file f = { .fd = fd };
	void *base;

	if (file_fstat(fd, &f.st) == -1)
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
	fd = file_openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	if ((r = file_from_fd(fd, path, out)) < 0)
		close(fd);
	return r;
}

int
file_read_exact(int fd, const char *path, const char *what, uint64_t off, uint64_t len,
	uint64_t min_len, uint64_t max_len, uint8_t **out)
{
	uint64_t done = 0, end;
	uint8_t *buf;

	if (len < min_len)
		return error_set(-EINVAL, "%s: %s of %llu bytes is shorter than %llu", path, what,
			(unsigned long long)len, (unsigned long long)min_len);
	if (len > max_len || len > (uint64_t)SIZE_MAX - 1)
		return error_set(-EFBIG, "%s: %s of %llu bytes is larger than the %llu allowed",
			path, what, (unsigned long long)len, (unsigned long long)max_len);
	if (__builtin_add_overflow(off, len, &end) || end > (uint64_t)INT64_MAX)
		return error_set(-EINVAL, "%s: %s at offset %llu: beyond any file size", path,
			what, (unsigned long long)off);
	if ((buf = malloc(len ? (size_t)len : 1)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory for the %s (%llu bytes)", path, what,
			(unsigned long long)len);
	while (done < len) {
		ssize_t r = pread(fd, buf + done, (size_t)(len - done), (off_t)(off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int e = r < 0 ? errno : 0;

			free(buf);
			if (e > 0) {
				error_set(-e, "%s: reading the %s: %s", path, what, strerror(e));
				return -e;
			}
			return error_set(-EIO, "%s: file shrank while being read: %s [%llu, %llu) "
				"ends at %llu", path, what, (unsigned long long)off,
				(unsigned long long)end, (unsigned long long)(off + done));
		}
		done += (uint64_t)r;
	}
	*out = buf;
	return 0;
}

int
file_read_bytes(const struct wc_file *f, file_head_fn need, uint64_t max_head,
	struct file_bytes *out)
{
	uint64_t probe = f->size < FILE_PROBE_LEN ? f->size : FILE_PROBE_LEN, head;
	uint64_t tail = f->size < FILE_TAIL_MAX ? f->size : FILE_TAIL_MAX;
	uint8_t *buf = NULL, *t;
	int r;

	if ((r = file_read_exact(f->fd, f->path, "start of the file", 0, probe, 0, probe,
		     &buf)) < 0)
		return r;
	head = need(buf, (size_t)probe, f->size);
	if (head < probe || head > f->size)
		head = probe;
	if (head > probe) {
		free(buf);
		buf = NULL;
		if ((r = file_read_exact(f->fd, f->path, "header", 0, head, 0, max_head, &buf)) < 0)
			return r;
	}
	/* The tail goes after the head in the same block. */
	if ((t = realloc(buf, (size_t)head + FILE_TAIL_MAX)) == NULL) {
		free(buf);
		return error_set(-ENOMEM, "%s: out of memory", f->path);
	}
	buf = t;
	if (tail > 0) {
		uint8_t *copy = NULL;

		/* copy is set whenever r is 0; the analyser, which cannot tell
		 * that error_set(-errno) is negative, is told so. */
		if ((r = file_read_exact(f->fd, f->path, "end of the file", f->size - tail, tail,
			     0, FILE_TAIL_MAX, &copy)) < 0 || copy == NULL) {
			free(buf);
			return r < 0 ? r : -EIO;
		}
		memcpy(buf + head, copy, (size_t)tail);
		free(copy);
	}
	*out = (struct file_bytes){ .head = buf, .head_len = (size_t)head, .tail = buf + head,
		.tail_len = (size_t)tail, .size = f->size, .owned = buf };
	return 0;
}

struct file_bytes
file_bytes_of(const uint8_t *data, uint64_t size)
{
	size_t tail = size < FILE_TAIL_MAX ? (size_t)size : FILE_TAIL_MAX;

	return (struct file_bytes){ .head = data, .head_len = (size_t)size,
		.tail = data != NULL ? data + size - tail : NULL, .tail_len = tail, .size = size };
}

void
file_bytes_free(struct file_bytes *b)
{
	if (b == NULL)
		return;
	free(b->owned);
	memset(b, 0, sizeof(*b));
}

int
file_check_unchanged(const struct wc_file *f)
{
	struct stat st;

	if (file_fstat(f->fd, &st) == -1)
		return error_set(-errno, "%s: fstat: %s", f->path, strerror(errno));
	if (st.st_size != f->st.st_size)
		return error_set(-ESTALE, "%s: file changed while being read (size %lld, now %lld)",
			f->path, (long long)f->st.st_size, (long long)st.st_size);
	if (st.st_mtim.tv_sec != f->st.st_mtim.tv_sec ||
		st.st_mtim.tv_nsec != f->st.st_mtim.tv_nsec)
		return error_set(-ESTALE, "%s: file changed while being read (written in place; "
			"replace a served file with rename(2))", f->path);
	return 0;
}

/* Whether two times are the same to the nanosecond. */
static bool
same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

bool
file_ctime_moved(const struct stat *then, const struct stat *now)
{
	return now->st_nlink == then->st_nlink && !same_time(&now->st_ctim, &then->st_ctim);
}

int64_t
file_time_ns(const struct timespec *t)
{
	int64_t ns;

	if (__builtin_mul_overflow((int64_t)t->tv_sec, (int64_t)1000000000, &ns) ||
		__builtin_add_overflow(ns, (int64_t)t->tv_nsec, &ns))
		return t->tv_sec < 0 ? INT64_MIN : INT64_MAX;
	return ns;
}

bool
file_written_in_place(const struct stat *then, const struct stat *now)
{
	return now->st_size != then->st_size || !same_time(&now->st_mtim, &then->st_mtim) ||
		file_ctime_moved(then, now);
}

bool
file_links_moved(const struct stat *then, const struct stat *now)
{
	return now->st_dev == then->st_dev && now->st_ino == then->st_ino &&
		now->st_size == then->st_size && same_time(&now->st_mtim, &then->st_mtim) &&
		now->st_nlink != then->st_nlink && now->st_nlink != 0 && then->st_nlink != 0 &&
		!same_time(&now->st_ctim, &then->st_ctim);
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
