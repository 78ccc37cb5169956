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
 * fit is kept, and notify_flush() sends what was kept when the manager
 * reads again, in this order:
 *
 * 1. state changes (RELOADING=1, ...) in order, in a queue of 8; a further
 *    one is dropped and counted, but for READY=1 and STOPPING=1;
 * 2. READY=1 and STOPPING=1 that found the queue full: never dropped (a
 *    manager that never hears READY=1 kills the unit after
 *    TimeoutStartSec=), each a pending flag sent after the queue; while one
 *    is pending, a droppable state change is dropped, so none overtakes it;
 * 3. FDSTOREREMOVE=1 of the file descriptor store, in order, in a list of
 *    their own, as long as it takes (one per name ever stored, at most): a
 *    dropped removal leaves a stale descriptor in the manager, counted
 *    against FileDescriptorStoreMax= and passed to the next process under a
 *    name that may be reused;
 * 4. the newest STATUS=-only datagram (each one replaces the one before).
 *
 * A store (FDSTORE=1) is never kept, and never goes while anything kept
 * waits: a name removed and then stored again reaches the manager in that
 * order.
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
 * dropped (and counted) when this many are already waiting, unless it is
 * READY=1 or STOPPING=1 (notify_held). */
#define NOTIFY_QUEUE 8

/* The state changes that are never dropped, as bits of notify_held, in the
 * order notify_flush() sends them. */
enum notify_held_state {
	NOTIFY_HELD_READY = 1u << 0,    /* "READY=1" */
	NOTIFY_HELD_STOPPING = 1u << 1, /* "STOPPING=1" */
};

/* A removal from the store that did not fit: its FDNAME= (at most
 * NOTIFY_MAX_FDNAME bytes), in the order they were asked. */
struct notify_removal {
	struct notify_removal *next;
	char name[];
};

/* Set by notify_init(), read by notify_send(). */
static int notify_fd = -1;
static struct sockaddr_un notify_addr;
static socklen_t notify_addrlen;

/* Datagrams that did not fit, guarded by notify_lock (notify_send() may be
 * called from any thread). */
static pthread_mutex_t notify_lock = PTHREAD_MUTEX_INITIALIZER;
static char *notify_queue[NOTIFY_QUEUE];
static unsigned notify_queued;
static unsigned notify_held;     /* enum notify_held_state bits waiting */
static struct notify_removal *notify_removals; /* the oldest removal waiting */
static struct notify_removal **notify_removals_tail = &notify_removals;
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

/* Opens the socket $NOTIFY_SOCKET names, if any (notify.h). */
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

/* The datagram of a removal from the store, in buf (cap bytes, room for
 * NOTIFY_MAX_FDNAME): its length. */
static size_t
removal_text(char *buf, size_t cap, const char *name)
{
	int n = snprintf(buf, cap, "FDSTOREREMOVE=1\nFDNAME=%s", name);

	return n < 0 ? 0 : (size_t)n;
}

/* One try at sending a datagram kept: 1 when it went (the caller forgets
 * it), 0 when the manager's queue is full (it stays), or -errno when it
 * failed otherwise (the caller forgets it too: counted as dropped, and the
 * first such error kept in *err). */
static int
send_kept(const char *buf, size_t len, int *err)
{
	int r = notify_sendmsg(buf, len);

	if (r == -EAGAIN || r == -EWOULDBLOCK)
		return 0;
	if (r < 0) {
		notify_dropped++;
		if (*err == 0)
			*err = r;
	}
	return r < 0 ? r : 1;
}

/*
 * Sends what waits, in the order of the file comment, until the manager's
 * queue is full again. A datagram whose send fails otherwise than with a
 * full queue is dropped, and the rest still go: *err says the first such
 * error (0: none). 1 when nothing waits any more, 0 when something does.
 * Call with notify_lock held.
 */
static int
flush_locked(int *err)
{
	static const struct {
		unsigned bit;
		const char *text;
	} held[] = { { NOTIFY_HELD_READY, "READY=1" }, { NOTIFY_HELD_STOPPING, "STOPPING=1" } };
	char text[32 + NOTIFY_MAX_FDNAME];

	*err = 0;
	while (notify_queued > 0) {
		if (send_kept(notify_queue[0], strlen(notify_queue[0]), err) == 0)
			return 0;
		free(notify_queue[0]);
		memmove(notify_queue, notify_queue + 1, --notify_queued * sizeof(notify_queue[0]));
	}
	for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++) {
		if ((notify_held & held[i].bit) == 0)
			continue;
		if (send_kept(held[i].text, strlen(held[i].text), err) == 0)
			return 0;
		notify_held &= ~held[i].bit;
	}
	while (notify_removals != NULL) {
		struct notify_removal *first = notify_removals;

		if (send_kept(text, removal_text(text, sizeof(text), first->name), err) == 0)
			return 0;
		if ((notify_removals = first->next) == NULL)
			notify_removals_tail = &notify_removals;
		free(first);
	}
	if (notify_status != NULL) {
		if (send_kept(notify_status, strlen(notify_status), err) == 0)
			return 0;
		free(notify_status);
		notify_status = NULL;
	}
	return 1;
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

/* The lines of buf that are never dropped (enum notify_held_state bits),
 * and in *other whether it has lines besides those and STATUS= ones. */
static unsigned
held_lines(const char *buf, int *other)
{
	unsigned bits = 0;

	*other = 0;
	for (const char *p = buf; *p != '\0';) {
		const char *nl = strchr(p, '\n');
		size_t len = nl != NULL ? (size_t)(nl - p) : strlen(p);

		if (len == 7 && strncmp(p, "READY=1", 7) == 0)
			bits |= NOTIFY_HELD_READY;
		else if (len == 10 && strncmp(p, "STOPPING=1", 10) == 0)
			bits |= NOTIFY_HELD_STOPPING;
		else if (strncmp(p, "STATUS=", 7) != 0)
			*other = 1;
		if (nl == NULL)
			break;
		p = nl + 1;
	}
	return bits;
}

/* Keeps a datagram that did not fit (see the file comment). 2 when kept,
 * -EAGAIN when dropped, -ENOMEM. */
static int
keep_locked(const char *buf)
{
	int status = status_only(buf), other;
	unsigned bits;
	char *copy;

	if (status || (notify_held == 0 && notify_queued < NOTIFY_QUEUE)) {
		if ((copy = strdup(buf)) == NULL) {
			notify_dropped++;
			return error_set(-ENOMEM, "notify: out of memory");
		}
		if (status) {
			if (notify_status != NULL)
				notify_dropped++;
			free(notify_status);
			notify_status = copy;
		} else {
			notify_queue[notify_queued++] = copy;
		}
		return 2;
	}
	/* The queue is full, or a state change held already waits (one
	 * queued now would go before it). READY=1 and STOPPING=1 wait as
	 * flags; what else the datagram said is dropped (a STATUS= comes
	 * again). */
	if ((bits = held_lines(buf, &other)) != 0) {
		notify_held |= bits;
		if (other)
			notify_dropped++;
		return 2;
	}
	notify_dropped++;
	return error_set(-EAGAIN, "notify: the service manager does not read; %d state "
				  "changes wait already, dropped: %s", NOTIFY_QUEUE, buf);
}

/* Formats and sends one state string, or keeps it (notify.h). */
int
notify_send(const char *fmt, ...)
{
	char buf[NOTIFY_MAX_MESSAGE + 1];
	va_list ap;
	int n, r, failed;

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
	/* What already waits goes first, so state changes keep their order;
	 * what failed of it was counted and is not this datagram's error. */
	if (flush_locked(&failed) == 1)
		r = notify_sendmsg(buf, (size_t)n);
	else
		r = -EAGAIN;
	if (r == -EAGAIN || r == -EWOULDBLOCK)
		r = keep_locked(buf);
	else if (r < 0)
		r = error_set(r, "notify: sendmsg to $NOTIFY_SOCKET: %s", strerror(-r));
	pthread_mutex_unlock(&notify_lock);
	return r;
}

/* Sends what was kept, as far as the manager reads (notify.h). */
int
notify_flush(void)
{
	int r, failed;

	if (notify_fd < 0)
		return 1;
	pthread_mutex_lock(&notify_lock);
	r = flush_locked(&failed);
	pthread_mutex_unlock(&notify_lock);
	if (failed < 0)
		return error_set(failed, "notify: sendmsg to $NOTIFY_SOCKET: %s",
			strerror(-failed));
	return r;
}

/* notify_flush() until nothing waits or timeout_ms passed (notify.h). */
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

/* Datagrams dropped so far (notify.h). */
uint64_t
notify_dropped_count(void)
{
	uint64_t n;

	pthread_mutex_lock(&notify_lock);
	n = notify_dropped;
	pthread_mutex_unlock(&notify_lock);
	return n;
}

/* Closes the socket and forgets what waits (notify.h). */
void
notify_close(void)
{
	pthread_mutex_lock(&notify_lock);
	for (unsigned i = 0; i < notify_queued; i++)
		free(notify_queue[i]);
	notify_queued = 0;
	notify_held = 0;
	while (notify_removals != NULL) {
		struct notify_removal *next = notify_removals->next;

		free(notify_removals);
		notify_removals = next;
	}
	notify_removals_tail = &notify_removals;
	free(notify_status);
	notify_status = NULL;
	pthread_mutex_unlock(&notify_lock);
	if (notify_fd >= 0)
		close(notify_fd);
	notify_fd = -1;
	notify_addrlen = 0;
}

/* Whether s is a name systemd takes as FDNAME= (notify.h). */
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

/* 0 when name is a valid FDNAME=, else -EINVAL with the message. */
static int
check_fdname(const char *name)
{
	if (name == NULL || !notify_fdname_valid(name, strnlen(name, NOTIFY_MAX_FDNAME + 1)))
		return error_set(-EINVAL, "notify: FDNAME=\"%.64s\": not 1 to %d printable ASCII "
			"bytes without ':'", name != NULL ? name : "", NOTIFY_MAX_FDNAME);
	return 0;
}

/* Hands fds to the manager's store under name, never kept (notify.h). */
int
notify_store_fds(const char *name, const int *fds, size_t n)
{
	char text[32 + NOTIFY_MAX_FDNAME];
	ssize_t sent;
	int r, len, failed;

	if ((r = check_fdname(name)) < 0)
		return r;
	if (n == 0 || n > NOTIFY_MAX_STORE_FDS || fds == NULL)
		return error_set(-EINVAL, "notify: FDNAME=%s: %zu descriptors, not 1 to %d", name,
			n, NOTIFY_MAX_STORE_FDS);
	if (notify_fd < 0)
		return 0;
	len = snprintf(text, sizeof(text), "FDSTORE=1\nFDNAME=%s", name);
	/* notify_fd is non-blocking (notify_init), so a full queue is -EAGAIN.
	 * What was kept goes first: a removal of this name kept earlier must
	 * not reach the manager after this store and remove it. */
	pthread_mutex_lock(&notify_lock);
	if (flush_locked(&failed) == 1)
		sent = fdp_sendto(notify_fd, text, (size_t)len, fds, n, NOTIFY_MAX_STORE_FDS,
			(const struct sockaddr *)&notify_addr, notify_addrlen);
	else
		sent = -EAGAIN;
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

/* Asks the manager to drop what it stores under name: sent now, or kept
 * in the list of removals, never dropped but for want of memory
 * (notify.h). */
int
notify_remove_fds(const char *name)
{
	char text[32 + NOTIFY_MAX_FDNAME];
	struct notify_removal *kept;
	size_t len;
	int r, failed;

	if ((r = check_fdname(name)) < 0)
		return r;
	if (notify_fd < 0)
		return 0;
	len = strlen(name);
	pthread_mutex_lock(&notify_lock);
	if (flush_locked(&failed) == 1) {
		r = notify_sendmsg(text, removal_text(text, sizeof(text), name));
		if (r != -EAGAIN && r != -EWOULDBLOCK) {
			pthread_mutex_unlock(&notify_lock);
			if (r < 0)
				return error_set(r, "notify: FDSTOREREMOVE=1 FDNAME=%s: sendmsg to "
					"$NOTIFY_SOCKET: %s", name, strerror(-r));
			return 1;
		}
	}
	if ((kept = malloc(sizeof(*kept) + len + 1)) == NULL) {
		notify_dropped++;
		pthread_mutex_unlock(&notify_lock);
		return error_set(-ENOMEM, "notify: FDSTOREREMOVE=1 FDNAME=%s: out of memory", name);
	}
	kept->next = NULL;
	memcpy(kept->name, name, len + 1);
	*notify_removals_tail = kept;
	notify_removals_tail = &kept->next;
	pthread_mutex_unlock(&notify_lock);
	return 2;
}
