/*
 * listen.c: the one way wcached makes a listening socket file (see
 * listen.h). Before replacing a socket file it connects to it: a refused
 * connection means a dead daemon left it behind, an accepted one means
 * another wcached serves there and must not be disturbed.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/error.h"
#include "listen.h"

int
listen_unix(const char *path, int type, mode_t mode, gid_t group)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, probe, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return error_set(-ENAMETOOLONG, "%s: socket path longer than %zu bytes", path,
			sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return error_set(-EEXIST, "%s: exists and is not a socket", path);
		/* A socket file: is a daemon behind it? */
		if ((probe = socket(AF_UNIX, type | SOCK_CLOEXEC, 0)) == -1)
			return error_set(-errno, "socket: %s", strerror(errno));
		if (connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			return error_set(-EADDRINUSE, "%s: another wcached is listening there",
				path);
		}
		e = errno;
		close(probe);
		if (e == EPROTOTYPE)
			return error_set(-EADDRINUSE, "%s: another program listens there with "
						       "another socket type", path);
		if (e != ECONNREFUSED && e != ENOENT)
			return error_set(-e, "%s: %s", path, strerror(e));
		if (unlink(path) == -1 && errno != ENOENT)
			return error_set(-errno, "%s: removing stale socket: %s", path,
				strerror(errno));
	}
	if ((fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) == -1)
		return error_set(-errno, "socket: %s", strerror(errno));
	/* Nobody can connect before listen(), so a looser mode between bind()
	 * and chmod() lets no one in. */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == -1) {
		e = errno;
		close(fd);
		return error_set(-e, "%s: %s", path, strerror(e));
	}
	if (chmod(path, mode) == -1 || (group != (gid_t)-1 && chown(path, (uid_t)-1, group) == -1) ||
		listen(fd, SOMAXCONN) == -1) {
		e = errno;
		close(fd);
		unlink(path);
		return error_set(-e, "%s: %s", path, strerror(e));
	}
	return fd;
}
