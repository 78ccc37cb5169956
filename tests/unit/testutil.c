/*
 * testutil.c: helpers shared by the unit tests (see testutil.h).
 */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

char *
tu_tmpdir(void)
{
	char tmpl[] = "/tmp/wcache-test-XXXXXX";
	char *dir = mkdtemp(tmpl);

	if (dir == NULL)
		abort();
	return strdup(dir);
}

void
tu_rmtree(char *path)
{
	char cmd[4200];

	if (path == NULL)
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	if (system(cmd) != 0)
		fprintf(stderr, "testutil: could not remove %s\n", path);
	free(path);
}

int
tu_dir_setup(void **state)
{
	struct tu_dir *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return -1;
	t->dir = tu_tmpdir();
	t->fds = tu_count_fds();
	*state = t;
	return 0;
}

int
tu_dir_teardown(void **state)
{
	struct tu_dir *t = *state;

	free(t->path);
	tu_rmtree(t->dir);
	free(t);
	return 0;
}

char *
tu_write(const char *dir, const char *name, const void *data, size_t len)
{
	char *path;
	int fd;

	if (asprintf(&path, "%s/%s", dir, name) < 0)
		abort();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || (len > 0 && write(fd, data, len) != (ssize_t)len))
		abort();
	close(fd);
	return path;
}

uint8_t *
tu_safetensors(const char *header, size_t data_len, size_t *len)
{
	size_t hlen = strlen(header);
	uint8_t *buf = malloc(8 + hlen + data_len + 1);
	uint64_t n = hlen;

	if (buf == NULL)
		abort();
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)(n >> (8 * i));
	/* The header's bytes, without its NUL: the data follows.
	 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
	memcpy(buf + 8, header, hlen);
	for (size_t i = 0; i < data_len; i++)
		buf[8 + hlen + i] = (uint8_t)(i & 0xff);
	*len = 8 + hlen + data_len;
	return buf;
}

int
tu_count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

int
tu_count_fds(void)
{
	int n = tu_count_entries("/proc/self/fd");

	return n < 0 ? n : n - 1; /* the directory's own descriptor */
}

int
tu_fd_is_readonly_of(int fd, int other)
{
	struct stat got, want;
	int fl, fd_flags;

	if (fd < 0 || fstat(fd, &got) == -1 || fstat(other, &want) == -1 ||
		(fl = fcntl(fd, F_GETFL)) == -1 || (fd_flags = fcntl(fd, F_GETFD)) == -1)
		return 0;
	return got.st_dev == want.st_dev && got.st_ino == want.st_ino &&
		(fl & O_ACCMODE) == O_RDONLY && (fd_flags & FD_CLOEXEC) != 0;
}

double
tu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

ssize_t
tu_raw_send(int sock, const void *buf, size_t len, const int *fds, size_t n)
{
	union {
		struct cmsghdr align;
		unsigned char buf[CMSG_SPACE(sizeof(int) * TU_SCM_MAX_FD)];
	} control;
	struct iovec iov = { .iov_base = (void *)(uintptr_t)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;

	if (n > TU_SCM_MAX_FD)
		return -1;
	if (n > 0) {
		memset(&control, 0, sizeof(control));
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
	}
	return sendmsg(sock, &msg, MSG_NOSIGNAL);
}
