/*
 * path.c: path joining, a file type's name, write-all and sealed memfds (see path.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"

char *
path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir);
	char *p;

	if (name[0] == '/')
		return strdup(name);
	while (name[0] == '.' && name[1] == '/') {
		name += 2;
		while (*name == '/')
			name++;
	}
	if (*name == '\0' || strcmp(name, ".") == 0)
		return strdup(n == 0 ? "." : dir);
	if (n == 0)
		return strdup(name);
	if (asprintf(&p, "%s%s%s", dir, dir[n - 1] == '/' ? "" : "/", name) < 0)
		return NULL;
	return p;
}

char *
path_dir(const char *path)
{
	const char *slash = strrchr(path, '/');

	if (slash == NULL)
		return strdup("");
	if (slash == path)
		return strdup("/");
	return strndup(path, (size_t)(slash - path));
}

int
path_next_name(const char **p, char *name)
{
	size_t len;

	while (**p == '/')
		(*p)++;
	if (**p == '\0')
		return 0;
	if ((len = strcspn(*p, "/")) > NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(name, *p, len);
	name[len] = '\0';
	*p += len;
	return 1;
}

/* What a file of type mode is (path.h). */
const char *
path_file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFDIR:
		return "a directory";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFIFO:
		return "a FIFO";
	case S_IFSOCK:
		return "a socket";
	case S_IFLNK:
		return "a symbolic link";
	default:
		return "of an unknown type";
	}
}

int
fd_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

int
fd_reopen_read_only(int fd, const char *what)
{
	struct stat was, now;
	char proc[64];
	int nfd;

	if (fstat(fd, &was) == -1)
		return error_set(-errno, "%s: fstat: %s", what, strerror(errno));
	/* The type first (an inode keeps its type): opening a FIFO waits for
	 * a writer, and opening a device can act on it. */
	if (!S_ISREG(was.st_mode))
		return error_set(-EINVAL, "%s: not a regular file", what);
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if ((nfd = open(proc, O_RDONLY | O_CLOEXEC | O_NOCTTY)) == -1)
		return error_set(-errno, "%s: reopening read-only: %s", what, strerror(errno));
	if (fstat(nfd, &now) == -1) {
		int e = errno;

		close(nfd);
		return error_set(-e, "%s: fstat: %s", what, strerror(e));
	}
	if (now.st_dev != was.st_dev || now.st_ino != was.st_ino || !S_ISREG(now.st_mode)) {
		close(nfd);
		return error_set(-ESTALE, "%s: the reopened descriptor is not the same file", what);
	}
	return nfd;
}

int
memfd_sealed(const char *name, const void *buf, size_t len, int seals, unsigned mode)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), r;

	if (fd == -1)
		return error_set(-errno, "memfd_create: %s", strerror(errno));
	if (buf == NULL && ftruncate(fd, (off_t)len) == -1) {
		r = -errno;
		close(fd);
		return error_set(r, "%s: %s", name, strerror(-r));
	}
	if (buf != NULL && (r = fd_write_all(fd, buf, len)) < 0) {
		close(fd);
		return error_set(r, "writing %s: %s", name, strerror(-r));
	}
	if (mode != 0 && fchmod(fd, (mode_t)mode) == -1) {
		r = -errno;
		close(fd);
		return error_set(r, "%s: chmod: %s", name, strerror(-r));
	}
	if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) == -1) {
		r = -errno;
		close(fd);
		return error_set(r, "sealing %s: %s", name, strerror(-r));
	}
	return fd;
}
