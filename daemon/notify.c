/*
 * notify.c: the sd_notify datagram protocol, written directly against the
 * documented environment variable so that wcached needs no libsystemd (see
 * notify.h, sd_notify(3)); socket activation is listen.c's.
 *
 * The notification socket is opened once by notify_init(); notify_send()
 * addresses each datagram with sendmsg() to the saved address, as sd_notify
 * does, so a manager that re-creates its socket is still reached.
 *
 * The socket is non-blocking: a manager that does not read (stalled, or
 * re-executing) must never stop the event loop. A datagram that does not
 * fit is kept: state changes (READY=1, RELOADING=1, STOPPING=1, ...) in
 * order in a small queue, STATUS= lines coalesced into the newest one, and
 * notify_flush() sends them when the manager reads again.
 */
#include "notify.h"

#include "base/error.h"
#include "proto/fdpass.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Send buffer for the notification socket, like libsystemd's. */
#define NOTIFY_SNDBUF (8 * 1024 * 1024)

/* State changes kept while the manager does not read; a further one is
 * dropped (and counted) only when this many are already waiting. */
#define NOTIFY_QUEUE 8

/* Set by notify_init(), read by notify_send(). */
static int notify_fd = -1;
static struct sockaddr_un notify_addr;
static socklen_t notify_addrlen;

/* Datagrams that did not fit, guarded by notify_lock (notify_send() may be
 * called from any thread). */
static pthread_mutex_t notify_lock = PTHREAD_MUTEX_INITIALIZER;
static char *notify_queue[NOTIFY_QUEUE];
static unsigned notify_queued;
static char *notify_status;      /* newest STATUS=-only datagram not yet sent */
static uint64_t notify_dropped;  /* datagrams given up on */

/* Fills addr and *len from a $NOTIFY_SOCKET value: "/path" is a filesystem
 * socket (length includes the terminating NUL), "@name" an abstract one (the
 * '@' becomes the leading NUL; length counts exactly the name's bytes).
 * Declared in notify.h; both outputs are untouched on failure. */
int
notify_parse_address(const char *value, struct sockaddr_un *addr, socklen_t *len)
{
	size_t n = strlen(value);
	struct sockaddr_un a;

	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	if (value[0] == '/') {
		if (n >= sizeof(a.sun_path))
			return error_set(-EINVAL,
				"NOTIFY_SOCKET=%s: path too long for a unix socket (max %zu bytes)",
				value, sizeof(a.sun_path) - 1);
		memcpy(a.sun_path, value, n + 1);
		*addr = a;
		*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
		return 0;
	}
	if (value[0] == '@') {
		if (n < 2)
			return error_set(-EINVAL, "NOTIFY_SOCKET=@: empty abstract socket name");
		if (n > sizeof(a.sun_path))
			return error_set(-EINVAL,
				"NOTIFY_SOCKET=%s: abstract name too long (max %zu bytes)", value,
				sizeof(a.sun_path) - 1);
		a.sun_path[0] = '\0';
		memcpy(a.sun_path + 1, value + 1, n - 1);
		*addr = a;
		*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
		return 0;
	}
	return error_set(-EINVAL,
		"NOTIFY_SOCKET=%s: not a unix socket address (must start with '/' or '@')", value);
}

int
notify_init(void)
{
	const char *value = getenv("NOTIFY_SOCKET");
	struct sockaddr_un addr;
	socklen_t len = 0;
	int fd, r, sndbuf = NOTIFY_SNDBUF;

	notify_close();
	if (value == NULL || *value == '\0')
		return 0;
	r = notify_parse_address(value, &addr, &len);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return error_set(-errno, "NOTIFY_SOCKET=%s: socket: %s", value, strerror(errno));
	/* Best effort, as in libsystemd: a small buffer only means more
	 * datagrams wait in notify_queue. */
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	notify_addr = addr;
	notify_addrlen = len;
	notify_fd = fd;
	return 1;
}

/* Sends one datagram now: 1 when sent, -EAGAIN when the manager's queue is
 * full, or another -errno. */
static int
notify_sendmsg(const char *buf, size_t len)
{
	/* The socket is non-blocking: a full queue is -EAGAIN. */
	ssize_t n = fdp_sendto(notify_fd, buf, len, NULL, 0, 0,
		(const struct sockaddr *)&notify_addr, notify_addrlen);

	return n < 0 ? (int)n : 1;
}

/* Is every line of buf a STATUS= line (so a newer one may replace it)? */
static int
status_only(const char *buf)
{
	for (const char *p = buf; *p != '\0';) {
		const char *nl = strchr(p, '\n');

		if (strncmp(p, "STATUS=", 7) != 0)
			return 0;
		if (nl == NULL)
			break;
		p = nl + 1;
	}
	return 1;
}

/* Sends what waits, oldest state change first and the newest STATUS= last,
 * until the manager's queue is full again. Call with notify_lock held. */
static int
flush_locked(void)
{
	int r;

	while (notify_queued > 0) {
		if ((r = notify_sendmsg(notify_queue[0], strlen(notify_queue[0]))) == -EAGAIN)
			return 0;
		free(notify_queue[0]);
		memmove(notify_queue, notify_queue + 1, --notify_queued * sizeof(notify_queue[0]));
		if (r < 0)
			return r;
	}
	if (notify_status != NULL) {
		if ((r = notify_sendmsg(notify_status, strlen(notify_status))) == -EAGAIN)
			return 0;
		free(notify_status);
		notify_status = NULL;
		if (r < 0)
			return r;
	}
	return 1;
}

/* Keeps a datagram that did not fit (see the file comment). */
static int
keep_locked(const char *buf)
{
	char *copy = strdup(buf);

	if (copy == NULL) {
		notify_dropped++;
		return error_set(-ENOMEM, "notify: out of memory");
	}
	if (status_only(buf)) {
		if (notify_status != NULL)
			notify_dropped++;
		free(notify_status);
		notify_status = copy;
		return 2;
	}
	if (notify_queued == NOTIFY_QUEUE) {
		notify_dropped++;
		free(copy);
		return error_set(-EAGAIN, "notify: the service manager does not read; %d state "
					  "changes wait already, dropped: %s", NOTIFY_QUEUE, buf);
	}
	notify_queue[notify_queued++] = copy;
	return 2;
}

int
notify_send(const char *fmt, ...)
{
	char buf[NOTIFY_MAX_MESSAGE + 1];
	va_list ap;
	int n, r;

	if (notify_fd < 0)
		return 0;
	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		return error_set(-EINVAL, "notify: cannot format state string");
	if ((size_t)n > NOTIFY_MAX_MESSAGE)
		return error_set(-EMSGSIZE, "notify: state string of %d bytes is too long (max %d)",
			n, NOTIFY_MAX_MESSAGE);

	pthread_mutex_lock(&notify_lock);
	/* What already waits goes first, so state changes keep their order. */
	if ((r = flush_locked()) == 1)
		r = notify_sendmsg(buf, (size_t)n);
	else if (r == 0)
		r = -EAGAIN;
	if (r == -EAGAIN)
		r = keep_locked(buf);
	else if (r < 0)
		r = error_set(r, "notify: sendmsg to $NOTIFY_SOCKET: %s", strerror(-r));
	pthread_mutex_unlock(&notify_lock);
	return r;
}

int
notify_flush(void)
{
	int r;

	if (notify_fd < 0)
		return 1;
	pthread_mutex_lock(&notify_lock);
	r = flush_locked();
	pthread_mutex_unlock(&notify_lock);
	if (r < 0)
		return error_set(r, "notify: sendmsg to $NOTIFY_SOCKET: %s", strerror(-r));
	return r;
}

int
notify_flush_wait(int timeout_ms)
{
	struct pollfd p = { .fd = notify_fd, .events = POLLOUT };
	int r;

	while ((r = notify_flush()) == 0) {
		/* A datagram socket polls writable when its own buffer has room,
		 * not when the receiver's queue does: wait in small steps. */
		if (timeout_ms <= 0)
			return 0;
		(void)poll(&p, 1, 10);
		timeout_ms -= 10;
	}
	return r;
}

uint64_t
notify_dropped_count(void)
{
	uint64_t n;

	pthread_mutex_lock(&notify_lock);
	n = notify_dropped;
	pthread_mutex_unlock(&notify_lock);
	return n;
}

void
notify_close(void)
{
	pthread_mutex_lock(&notify_lock);
	for (unsigned i = 0; i < notify_queued; i++)
		free(notify_queue[i]);
	notify_queued = 0;
	free(notify_status);
	notify_status = NULL;
	pthread_mutex_unlock(&notify_lock);
	if (notify_fd >= 0)
		close(notify_fd);
	notify_fd = -1;
	notify_addrlen = 0;
}

int
notify_fdname_valid(const char *s, size_t len)
{
	if (len == 0 || len > NOTIFY_MAX_FDNAME)
		return 0;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e || s[i] == ':')
			return 0;
	return 1;
}

static int
check_fdname(const char *name)
{
	if (name == NULL || !notify_fdname_valid(name, strnlen(name, NOTIFY_MAX_FDNAME + 1)))
		return error_set(-EINVAL, "notify: FDNAME=\"%.64s\": not 1 to %d printable ASCII "
			"bytes without ':'", name != NULL ? name : "", NOTIFY_MAX_FDNAME);
	return 0;
}

int
notify_store_fds(const char *name, const int *fds, size_t n)
{
	char text[32 + NOTIFY_MAX_FDNAME];
	ssize_t sent;
	int r, len;

	if ((r = check_fdname(name)) < 0)
		return r;
	if (n == 0 || n > NOTIFY_MAX_STORE_FDS || fds == NULL)
		return error_set(-EINVAL, "notify: FDNAME=%s: %zu descriptors, not 1 to %d", name,
			n, NOTIFY_MAX_STORE_FDS);
	if (notify_fd < 0)
		return 0;
	len = snprintf(text, sizeof(text), "FDSTORE=1\nFDNAME=%s", name);
	/* notify_fd is non-blocking (notify_init), so a full queue is -EAGAIN. */
	pthread_mutex_lock(&notify_lock);
	sent = fdp_sendto(notify_fd, text, (size_t)len, fds, n, NOTIFY_MAX_STORE_FDS,
		(const struct sockaddr *)&notify_addr, notify_addrlen);
	pthread_mutex_unlock(&notify_lock);
	r = sent < 0 ? (int)sent : 1;
	if (r == -EAGAIN || r == -EWOULDBLOCK)
		return error_set(-EAGAIN, "notify: FDSTORE=1 FDNAME=%s: the manager's queue is "
			"full; the %zu descriptors were not stored", name, n);
	if (r < 0)
		return error_set(r, "notify: FDSTORE=1 FDNAME=%s: sendmsg to $NOTIFY_SOCKET: %s",
			name, strerror(-r));
	return 1;
}

int
notify_remove_fds(const char *name)
{
	int r;

	if ((r = check_fdname(name)) < 0)
		return r;
	return notify_send("FDSTOREREMOVE=1\nFDNAME=%s", name);
}
