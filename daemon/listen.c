/*
 * listen.c: wcached's listening sockets (see listen.h): the ones systemd
 * passes (socket activation, written against the documented environment
 * variables, sd_listen_fds(3), so that wcached needs no libsystemd), and the
 * one way wcached makes a listening socket file itself. Before replacing a
 * socket file it connects to it: a refused connection means a dead daemon
 * left it behind, an accepted one means another wcached serves there and
 * must not be disturbed.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/decimal.h"
#include "base/error.h"
#include "listen.h"

/* The first fd systemd passes (SD_LISTEN_FDS_START). */
#define LISTEN_FDS_START 3

int
listen_unix(const char *what, const char *path, int type, mode_t mode, gid_t group)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, probe, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return error_set(-ENAMETOOLONG, "%s %s: socket path longer than %zu bytes", what,
			path, sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return error_set(-EEXIST, "%s %s: exists and is not a socket", what, path);
		/* A socket file: is a daemon behind it? Asked without blocking:
		 * a listener whose backlog is full (a wedged daemon, or anyone
		 * who can connect to it and fills it) would hold a blocking
		 * connect() and this start with it. */
		if ((probe = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) == -1)
			return error_set(-errno, "%s %s: socket: %s", what, path, strerror(errno));
		if (connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			return error_set(-EADDRINUSE, "%s %s: another wcached is listening there",
				what, path);
		}
		e = errno;
		close(probe);
		if (e == EAGAIN)
			return error_set(-EADDRINUSE, "%s %s: another wcached is listening "
				"there (and not accepting: its backlog is full)", what, path);
		if (e == EPROTOTYPE)
			return error_set(-EADDRINUSE, "%s %s: another program listens there "
						       "with another socket type", what, path);
		if (e != ECONNREFUSED && e != ENOENT)
			return error_set(-e, "%s %s: %s", what, path, strerror(e));
		if (unlink(path) == -1 && errno != ENOENT)
			return error_set(-errno, "%s %s: removing stale socket: %s", what, path,
				strerror(errno));
	}
	if ((fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) == -1)
		return error_set(-errno, "%s %s: socket: %s", what, path, strerror(errno));
	/* Nobody can connect before listen(), so a looser mode between bind()
	 * and chmod() lets no one in. */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == -1) {
		e = errno;
		close(fd);
		return error_set(-e, "%s %s: %s", what, path, strerror(e));
	}
	if (group != (gid_t)-1 && chown(path, (uid_t)-1, group) == -1) {
		e = errno;
		close(fd);
		unlink(path);
		return error_set(-e, "%s %s: cannot give the socket to group %u: %s%s", what, path,
			(unsigned)group, strerror(e), e != EPERM ? "" :
			" (wcached's user is not in that group: add it, or SupplementaryGroups= "
			"in the unit)");
	}
	if (chmod(path, mode) == -1 || listen(fd, SOMAXCONN) == -1) {
		e = errno;
		close(fd);
		unlink(path);
		return error_set(-e, "%s %s: %s", what, path, strerror(e));
	}
	return fd;
}

/* ---- socket activation ---- */

/* Parses a whole decimal number in [0, max] (no sign, no spaces, no junk).
 * Returns 0 or -EINVAL. */
static int
parse_decimal(const char *s, long long max, long long *out)
{
	uint64_t v;

	if (s == NULL || decimal_u64(s, strlen(s), &v) < 0 || v > (uint64_t)max)
		return -EINVAL;
	*out = (long long)v;
	return 0;
}

/* Finds name in the colon-separated list names, which must have exactly
 * count entries. Stores its index (the first match) or -1 when absent in
 * *index and returns 0; returns -EINVAL when the number of entries is not
 * count. */
static int
find_fd_name(const char *names, const char *name, long long count, long long *index)
{
	size_t name_len = strlen(name);
	long long i = 0;
	long long found = -1;
	const char *p = names;

	for (;;) {
		const char *end = strchr(p, ':');
		size_t len = end != NULL ? (size_t)(end - p) : strlen(p);

		if (found < 0 && len == name_len && memcmp(p, name, len) == 0)
			found = i;
		i++;
		if (end == NULL)
			break;
		p = end + 1;
	}
	if (i != count)
		return error_set(-EINVAL, "LISTEN_FDNAMES=%s has %lld names but LISTEN_FDS=%lld",
			names, i, count);
	*index = found;
	return 0;
}

/* Checks that fd is an AF_UNIX socket of the given type, listening when the
 * type is connection oriented. */
static int
check_listen_fd(int fd, const char *name, int type)
{
	int domain = 0, socktype = 0, listening = 0;
	socklen_t len;

	if (fcntl(fd, F_GETFD) < 0)
		return error_set(-EBADF, "socket activation: fd %d (\"%s\") is not open", fd,
			name);
	len = sizeof(domain);
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0) {
		if (errno == ENOTSOCK)
			return error_set(-EINVAL,
				"socket activation: fd %d (\"%s\") is not a socket", fd, name);
		return error_set(-errno, "socket activation: fd %d (\"%s\"): SO_DOMAIN: %s", fd,
			name, strerror(errno));
	}
	if (domain != AF_UNIX)
		return error_set(-EINVAL,
			"socket activation: fd %d (\"%s\") is not a unix socket (family %d)", fd,
			name, domain);
	len = sizeof(socktype);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &socktype, &len) < 0)
		return error_set(-errno, "socket activation: fd %d (\"%s\"): SO_TYPE: %s", fd,
			name, strerror(errno));
	if (socktype != type)
		return error_set(-EINVAL,
			"socket activation: fd %d (\"%s\") has socket type %d, expected %d "
			"(check ListenSequentialPacket=/ListenStream= in the .socket unit)",
			fd, name, socktype, type);
	if (type == SOCK_STREAM || type == SOCK_SEQPACKET) {
		len = sizeof(listening);
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0)
			return error_set(-errno,
				"socket activation: fd %d (\"%s\"): SO_ACCEPTCONN: %s", fd, name,
				strerror(errno));
		if (!listening)
			return error_set(-EINVAL,
				"socket activation: fd %d (\"%s\") is not a listening socket", fd,
				name);
	}
	return 0;
}

/* The variables' part of listen_fds_take(), with no environment and no
 * descriptor: declared in notify.h. */
int
listen_fds_parse(const char *pid_s, const char *fds_s, const char *names, const char *name,
	long long self, int *fd)
{
	long long pid = 0, count = 0, index = -1;
	int r;

	if (pid_s == NULL || fds_s == NULL)
		return 0;
	if (parse_decimal(pid_s, INT_MAX, &pid) < 0)
		return error_set(-EINVAL, "LISTEN_PID=%s is not a process id", pid_s);
	if (pid != self)
		return 0;
	if (parse_decimal(fds_s, INT_MAX - LISTEN_FDS_START, &count) < 0)
		return error_set(-EINVAL, "LISTEN_FDS=%s is not a count of descriptors", fds_s);
	if (count == 0)
		return 0;
	if (names != NULL) {
		r = find_fd_name(names, name, count, &index);
		if (r < 0)
			return r;
	} else {
		/* systemd's default name for fds without FileDescriptorName=. */
		index = strcmp(name, "unknown") == 0 ? 0 : -1;
	}
	if (index < 0)
		return 0;
	*fd = LISTEN_FDS_START + (int)index;
	return 1;
}

int
listen_fds_take(const char *name, int type, int *fd)
{
	int r, flags, candidate = -1;

	r = listen_fds_parse(getenv("LISTEN_PID"), getenv("LISTEN_FDS"), getenv("LISTEN_FDNAMES"),
		name, (long long)getpid(), &candidate);
	if (r <= 0)
		return r;
	r = check_listen_fd(candidate, name, type);
	if (r < 0)
		return r;
	flags = fcntl(candidate, F_GETFD);
	if (flags < 0 || fcntl(candidate, F_SETFD, flags | FD_CLOEXEC) < 0)
		return error_set(-errno, "socket activation: fd %d (\"%s\"): F_SETFD: %s",
			candidate, name, strerror(errno));
	*fd = candidate;
	return 1;
}

int
listen_fds_parse_all(const char *pid_s, const char *fds_s, const char *names, long long self,
	struct listen_fd **list, size_t *n)
{
	long long pid = 0, count = 0;
	struct listen_fd *v;
	const char *p = names;

	if (pid_s == NULL || fds_s == NULL)
		goto none;
	if (parse_decimal(pid_s, INT_MAX, &pid) < 0)
		return error_set(-EINVAL, "LISTEN_PID=%s is not a process id", pid_s);
	if (pid != self)
		goto none;
	if (parse_decimal(fds_s, INT_MAX - LISTEN_FDS_START, &count) < 0)
		return error_set(-EINVAL, "LISTEN_FDS=%s is not a count of descriptors", fds_s);
	if (count == 0)
		goto none;
	if (count > LISTEN_FDS_MAX)
		return error_set(-EINVAL, "LISTEN_FDS=%s: more than %d descriptors", fds_s,
			LISTEN_FDS_MAX);
	if (names != NULL) {
		long long unused;
		int r = find_fd_name(names, "", count, &unused); /* checks the count */

		if (r < 0)
			return r;
	}
	if ((v = calloc((size_t)count, sizeof(*v))) == NULL)
		return error_set(-ENOMEM, "socket activation: out of memory");
	for (long long i = 0; i < count; i++) {
		const char *end = p != NULL ? strchr(p, ':') : NULL;
		size_t len = p == NULL ? 0 : end != NULL ? (size_t)(end - p) : strlen(p);

		v[i].fd = LISTEN_FDS_START + (int)i;
		v[i].name = p != NULL ? strndup(p, len) : strdup("unknown");
		if (v[i].name == NULL) {
			listen_fds_free(v, (size_t)i);
			return error_set(-ENOMEM, "socket activation: out of memory");
		}
		if (p != NULL)
			p = end != NULL ? end + 1 : NULL;
	}
	*list = v;
	*n = (size_t)count;
	return (int)count;
none:
	*list = NULL;
	*n = 0;
	return 0;
}

int
listen_fds_list(struct listen_fd **list, size_t *n)
{
	struct listen_fd *v = NULL;
	size_t count = 0;
	int r, flags;

	r = listen_fds_parse_all(getenv("LISTEN_PID"), getenv("LISTEN_FDS"),
		getenv("LISTEN_FDNAMES"), (long long)getpid(), &v, &count);
	if (r < 0) {
		listen_fds_free(v, count); /* nothing: v stays NULL on failure */
		return r;
	}
	for (size_t i = 0; i < count; i++) {
		flags = fcntl(v[i].fd, F_GETFD);
		if (flags < 0 || fcntl(v[i].fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
			r = error_set(flags < 0 ? -EBADF : -errno, "socket activation: fd %d "
				"(\"%s\") is not open", v[i].fd, v[i].name);
			listen_fds_free(v, count);
			return r;
		}
	}
	*list = v;
	*n = count;
	return (int)count;
}

void
listen_fds_free(struct listen_fd *list, size_t n)
{
	if (list == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		free(list[i].name);
	free(list);
}

void
listen_fds_unset(void)
{
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
}
