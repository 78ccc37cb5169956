/*
 * request.c: a client's connection to wcached and one request on it
 * (wc_connect's socket, wc_set_timeout, wc_client_fd, wc_client_dispatch):
 * opening the socket, the deadline of every wait, the round trip of one
 * request and its reply, and the reconnect of a connection found dead.
 *
 * One request, one reply: a request (ATTACH, DERIVE, PUBLISH, ...) goes on
 * a SOCK_SEQPACKET socket, its reply comes back with its descriptors,
 * which pass to the caller; announcements (CHANGED) met on the way are
 * dropped. A release is one RELEASE with seq 0, which the daemon does not
 * answer: no round trip; a release made while another thread holds the
 * client's lock is sent by that thread when it gives the lock back
 * (attach.c, request_unlock()). Its send keeps the deadline as a
 * request's does, and one that fails closes the connection
 * (request_send_release()).
 *
 * Deadlines: the socket's SO_RCVTIMEO and SO_SNDTIMEO, set at connect and
 * by wc_set_timeout(), bound every connect, send and receive without a
 * system call of their own. A send that says EAGAIN before the deadline
 * (a descriptor the caller's event loop made non-blocking), or that a
 * signal interrupts (never restarted with a timeout, and restarting would
 * start the timeout over), waits with poll(2) for what is left: only a
 * deadline that has passed is a timeout. A reply is waited for with
 * poll(2) before each receive, within what is left of the deadline: the
 * receive of descriptors holds back other threads' closes of kept ones
 * (model_receive_begin), which must not last as long as a DERIVE waits.
 * A request that times out closes the connection (its reply could still
 * come and would be taken for the next one's). Every close of libwcache's
 * own (these two, a reply that cannot be trusted, a receive that failed)
 * remembers why (request_close_because()), so that a build the connection
 * ended, and the call that next finds it closed, say that libwcache closed
 * it, not wcached. Nothing more is read from such a connection: what is
 * still queued on it answers none of the requests to come, which connect
 * again (roundtrip()).
 *
 * Restarts: when a request finds the connection dead (the send fails with
 * EPIPE, ECONNRESET or ENOTCONN, or the daemon hangs up before the reply),
 * the client connects once more to the same path, within what is left of
 * the deadline, tells the new daemon with a HOLD each which generations
 * the process still maps, and sends the request again, once. Each
 * connection has a number; a model remembers the one it was attached on,
 * and its release is sent only on that connection (its handle means
 * nothing on another). See PROTOCOL.md, "Restarts".
 *
 * Layering: model.c < attach_reply.c < request.c < attach.c < derive.c.
 * This file reads the client's attach records (their types are attach.h's)
 * to name them in HOLDs, and calls nothing in attach.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "proto/defaults.h"
#include "proto/fdpass.h"
#include "lib/attach.h"
#include "lib/attach_reply.h"
#include "lib/model.h"
#include "lib/request.h"
#include "proto/wire.h"

#define DEFAULT_TIMEOUT_MS 30000 /* long enough for socket activation to start wcached */
#define TIMEOUT_ENV "WCACHE_TIMEOUT"
#define MAX_TIMEOUT_S (INT_MAX / 1000)

/* ---- the process's pid without a system call ---- */

static pid_t self_pid_value;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;

static void
self_pid_child(void)
{
	__atomic_store_n(&self_pid_value, getpid(), __ATOMIC_RELAXED);
}

static void
self_pid_init(void)
{
	self_pid_value = getpid();
	(void)pthread_atfork(NULL, NULL, self_pid_child);
}

/* getpid(), kept up to date across fork() by an atfork handler, because
 * every attach and release asks (a child must stay silent on its parent's
 * connection) and getpid() is a system call. */
pid_t
request_self_pid(void)
{
	pthread_once(&self_pid_once, self_pid_init);
	return __atomic_load_n(&self_pid_value, __ATOMIC_RELAXED);
}

/* The error of a call on a client that a parent process connected: the
 * connection and the client's lock are the parent's (attach.c, fork()). */
static int
not_our_client(const wc_client *c, const char *call)
{
	return error_set(-ECHILD, "%s: this client was connected by process %d; call "
		"wc_connect() again after fork()", call, (int)c->pid);
}

/* ---- deadlines ---- */

int
request_timeout_default(int *ms)
{
	const char *v = getenv(TIMEOUT_ENV);
	double seconds;
	char *end;

	if (v == NULL || *v == '\0') {
		*ms = DEFAULT_TIMEOUT_MS;
		return 0;
	}
	errno = 0;
	seconds = strtod(v, &end);
	if (end == v || *end != '\0' || errno != 0 || !(seconds >= 0) || seconds > MAX_TIMEOUT_S)
		return error_set(-EINVAL, "%s=%.64s: not a number of seconds (0 to %d; 0 waits "
			"forever)", TIMEOUT_ENV, v, MAX_TIMEOUT_S);
	*ms = (int)(seconds * 1000 + 0.5);
	if (seconds > 0 && *ms == 0)
		*ms = 1;
	return 0;
}

/* Sets fd's timeout opt (SO_RCVTIMEO or SO_SNDTIMEO) to ms (0: none);
 * 0, or -1 with errno. */
static int
set_timeout(int fd, int opt, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };

	return setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

/* Sets fd's send and receive timeouts (connect uses the send timeout). */
static int
apply_timeout(int fd, int ms, const char *path)
{
	if (set_timeout(fd, SO_RCVTIMEO, ms) == -1 || set_timeout(fd, SO_SNDTIMEO, ms) == -1)
		return error_set(-errno, "%s: setting the timeout: %s", path, strerror(errno));
	return 0;
}

/* Seconds since start on the monotonic clock (a vDSO call, not a system call). */
static double
request_elapsed(const struct timespec *start)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* The milliseconds left, rounded up, of a wait of ms (0: no limit) that
 * began at start: 0 once they are up, -1 (poll's "no limit") for none. */
static int
request_left_ms(int ms, const struct timespec *start)
{
	double left;
	int whole;

	if (ms <= 0)
		return -1;
	left = ms - request_elapsed(start) * 1000;
	if (left <= 0)
		return 0;
	whole = (int)left;
	return whole < left ? whole + 1 : whole;
}

/*
 * After a send or receive that said EAGAIN or EINTR: waits until fd is
 * ready for events (POLLIN, POLLOUT; or hung up) within what is left of
 * limit_ms from start (0: no limit). The socket's SO_RCVTIMEO is not the
 * only source of EAGAIN: the caller's event loop may have made
 * wc_client_fd() non-blocking (libuv's uv_poll_init does), and then every
 * receive that comes before the reply says EAGAIN at once. And a signal
 * interrupts a send or receive with a timeout (it is never restarted,
 * signal(7)); starting it again would start its timeout over, so a timer
 * firing more often than the deadline would make the wait endless.
 * Returns 1 when it is ready (also past the deadline, when it already
 * was), 0 when the deadline has passed with nothing there, or -errno.
 */
static int
wait_for(int fd, short events, int limit_ms, const struct timespec *start)
{
	struct pollfd p = { .fd = fd, .events = events };
	int left, r;

	for (;;) {
		left = request_left_ms(limit_ms, start);
		/* Past the deadline, one look that does not wait: what is
		 * there already is taken (a reply queued when the deadline
		 * passed, as a receive made before any wait took it). */
		if ((r = poll(&p, 1, left)) > 0)
			return 1;
		if (r == 0 && left == 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

#define CLOSED_KEPT (sizeof(((wc_client *)0)->closed) / sizeof(((wc_client *)0)->closed[0]))

const char *
request_closed_why(const wc_client *c, uint64_t connection)
{
	for (size_t i = 0; i < CLOSED_KEPT; i++)
		if (c->closed[i].why[0] != '\0' && c->closed[i].connection == connection)
			return c->closed[i].why;
	return NULL;
}

/*
 * Closes c's connection from libwcache's side (shutdown(2): the descriptor
 * stays until a reconnect replaces it) and remembers why, for that
 * connection number. The daemon then ends what the connection held, a
 * build in progress on it too; the call that later finds the connection
 * closed, the build's publish or abandon above all, says that libwcache
 * closed it and why (request_closed_why(), closed_by()) rather than
 * blaming wcached, whose hang-up would look the same. The reasons of the
 * last CLOSED_KEPT connections closed here are kept, so that closing the
 * next one too (the next call's reconnect times out in the same stall of
 * wcached) does not lose why a build's connection closed. A connection
 * closed twice keeps its first reason, the one that closed it.
 */
void
request_close_because(wc_client *c, const char *fmt, ...)
{
	va_list ap;
	unsigned i;

	shutdown(c->fd, SHUT_RDWR);
	if (request_closed_why(c, c->connection) != NULL)
		return;
	i = c->closed_next;
	c->closed_next = (unsigned)((i + 1) % CLOSED_KEPT);
	va_start(ap, fmt);
	vsnprintf(c->closed[i].why, sizeof(c->closed[i].why), fmt, ap);
	va_end(ap);
	c->closed[i].connection = c->connection;
}

/* Who closed c's connection number connection (the current one, or the
 * one a reconnect replaced), for a message, into buf: "wcached at PATH
 * closed the connection", or "libwcache closed the connection to wcached
 * at PATH because WHY" when request_close_because() did. Returns buf. */
static const char *
closed_by(const wc_client *c, uint64_t connection, char *buf, size_t size)
{
	const char *why = request_closed_why(c, connection);

	if (why == NULL)
		snprintf(buf, size, "%s closed the connection", c->where);
	else
		snprintf(buf, size, "libwcache closed the connection to %s because %s", c->where,
			why);
	return buf;
}

/* The error of a wait that ran out: names the socket and the time waited,
 * and closes the connection, which is out of step from now on. */
static int
timed_out(wc_client *c, const char *what, const struct timespec *start)
{
	request_close_because(c, "a request timed out (wcached did not %s within %.3g s)", what,
		c->timeout_ms / 1000.0);
	return error_set(-ETIMEDOUT, "%s did not %s within %.3g s (waited %.3g s; the limit is "
		"%s or wc_set_timeout()); connection closed", c->where, what,
		c->timeout_ms / 1000.0, request_elapsed(start), TIMEOUT_ENV);
}

int
wc_set_timeout(wc_client *c, int timeout_ms)
{
	int r = 0;

	if (c == NULL)
		return error_set(-EINVAL, "wc_set_timeout: no client");
	/* Not on the parent's connection (its copies share the timeouts),
	 * nor under its lock, which fork() may have copied held. */
	if (c->pid != request_self_pid())
		return not_our_client(c, "wc_set_timeout");
	if (timeout_ms < 0 && (r = request_timeout_default(&timeout_ms)) < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	if ((r = apply_timeout(c->fd, timeout_ms, c->path)) == 0)
		c->timeout_ms = timeout_ms;
	request_unlock(c);
	return r;
}


/*
 * connect(2), again when a signal interrupts it: with SO_SNDTIMEO set, a
 * connect that waits for room in the daemon's backlog is never restarted
 * (signal(7)), whatever SA_RESTART says, so a worker with a signal handler
 * (a timer, SIGCHLD) would fail its connect for a signal it did not mind.
 * An interrupted AF_UNIX connect leaves the socket unconnected, so it can
 * simply be tried again, within what is left of ms (0: no limit), and
 * each try waits only what is left: fd's SO_SNDTIMEO, ms when called, is
 * shrunk to it (and set back to ms once connected). -1 with errno EINTR
 * when that is up.
 */
static int
connect_retrying(int fd, const struct sockaddr_un *sa, int ms, const struct timespec *start)
{
	int left, shrunk = 0;

	while (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == -1) {
		if (errno != EINTR || (left = request_left_ms(ms, start)) == 0)
			return -1;
		if (left > 0 && set_timeout(fd, SO_SNDTIMEO, left) == -1)
			return -1;
		shrunk = left > 0;
	}
	return shrunk ? set_timeout(fd, SO_SNDTIMEO, ms) : 0;
}

/* ---- descriptors across fork() ---- */

/*
 * A child forked by another thread of its parent lets the parent's client
 * go by closing its copies of the parent's sockets (request_close_fds), so
 * that wcached sees the parent's connection end when the parent's end
 * does. It closes what c->fd and c->next_fd name, each only while it is
 * still the socket its identity says (attach.h, fd_identity). A reconnect
 * changes these in steps (socket(), the new socket in c->next_fd; the old
 * one closed; the new one into c->fd) and each step is made under
 * fd_lock, which fork() takes first (pthread_atfork) and gives back in
 * both processes: a child's copy of the client holds each step whole or
 * not at all, so every socket the child inherited is named by one of them
 * with its own identity, or by none only when it is already closed (review
 * rev177 G: c->fd was once set before its identity, and a child forked in
 * between kept the new socket open). The mutex orders the stores as well:
 * the unlock after a step happens before the forking thread's lock in the
 * prepare handler, and fork() copies the memory in that thread. Nothing
 * is taken under fd_lock (a close of a connection of no client's is made
 * under it: own_sockets below), and it is never taken under another lock
 * of libwcache's but the client's own (clients_lock is never held around
 * it).
 */
static pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fd_lock_once = PTHREAD_ONCE_INIT;

/*
 * The connections of no client (request_origins()'s, each its own; and
 * a client's first, until it is the client's: request_connect), from the
 * socket() that makes one to its close or hand-over, both under fd_lock:
 * a child forked by another thread meanwhile closes its copies at once
 * (fd_lock_child), since none of its threads knows them (review rev180
 * F8: the copy kept the connection open, and wcached counted it against
 * max_clients and max_clients_per_uid until its idle sweep). Each entry
 * lives on the stack of the thread using it, which fork() copies.
 */
struct own_socket {
	int fd;
	struct own_socket *next;
};
static struct own_socket *own_sockets;

static void
fd_lock_take(void)
{
	pthread_mutex_lock(&fd_lock);
}

static void
fd_lock_give(void)
{
	pthread_mutex_unlock(&fd_lock);
}

static void
fd_lock_child(void)
{
	for (struct own_socket *o = own_sockets; o != NULL; o = o->next)
		close(o->fd);
	own_sockets = NULL;
	pthread_mutex_unlock(&fd_lock);
}

static void
fd_lock_atfork(void)
{
	(void)pthread_atfork(fd_lock_take, fd_lock_give, fd_lock_child);
}

static struct fd_identity
identity_of(int fd)
{
	struct fd_identity id = { 0 };
	struct stat st;

	if (fstat(fd, &st) == 0)
		id = (struct fd_identity){ .dev = st.st_dev, .ino = st.st_ino, .known = 1 };
	return id;
}

/* Whether fd is still the file id says, to be closed: not when it was
 * closed behind c's back (closefrom() in a child, EBADF) or its number
 * now names another file (the child's own connection, say). A descriptor
 * whose identity fstat could not take is closed by its number. */
static int
is_still(int fd, const struct fd_identity *id)
{
	struct stat st;

	if (!id->known)
		return 1;
	return fstat(fd, &st) == 0 && st.st_dev == id->dev && st.st_ino == id->ino;
}


void
request_close_fds(wc_client *c)
{
	if (c->fd >= 0 && is_still(c->fd, &c->fd_id))
		close(c->fd);
	if (c->next_fd >= 0 && is_still(c->next_fd, &c->next_id))
		close(c->next_fd);
	c->fd = -1;
	c->next_fd = -1;
}

/* A socket for path's connection into *out; with c, a reconnect's: made
 * c->next_fd with its identity in the same step; with own, a connection of
 * no client's: own->fd, on own_sockets in the same step. -errno with the
 * message. */
static int
open_socket(wc_client *c, struct own_socket *own, int *out)
{
	int fd, e;

	if (c != NULL || own != NULL) {
		pthread_once(&fd_lock_once, fd_lock_atfork);
		pthread_mutex_lock(&fd_lock);
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	e = errno;
	if (c != NULL && fd >= 0) {
		c->next_id = identity_of(fd);
		c->next_fd = fd;
	}
	if (own != NULL && fd >= 0) {
		own->fd = fd;
		own->next = own_sockets;
		own_sockets = own;
	}
	if (c != NULL || own != NULL)
		pthread_mutex_unlock(&fd_lock);
	if (fd == -1)
		return error_set(-e, "socket: %s", strerror(e));
	*out = fd;
	return 0;
}

/* Takes own off own_sockets; fd_lock is held. */
static void
own_socket_forget(struct own_socket *own)
{
	for (struct own_socket **p = &own_sockets; *p != NULL; p = &(*p)->next)
		if (*p == own) {
			*p = own->next;
			break;
		}
}

/* Closes fd, which open_socket() made c->next_fd (c may be NULL), after a
 * failure to connect it: closed first, so that a child forked in between
 * finds the number closed (or another file), never a copy nothing names.
 * With own, fd is own->fd: closed and taken off own_sockets in one step
 * (a child closes what is on it by number). */
static void
close_socket(wc_client *c, struct own_socket *own, int fd)
{
	if (own != NULL) {
		pthread_mutex_lock(&fd_lock);
		close(fd);
		own_socket_forget(own);
		pthread_mutex_unlock(&fd_lock);
		return;
	}
	close(fd);
	if (c != NULL) {
		pthread_mutex_lock(&fd_lock);
		c->next_fd = -1;
		pthread_mutex_unlock(&fd_lock);
	}
}

/* c's new connection, c->next_fd, replaces c->fd, which is closed first
 * (see above). */
static void
take_next_fd(wc_client *c)
{
	close(c->fd);
	pthread_mutex_lock(&fd_lock);
	c->fd = c->next_fd;
	c->fd_id = c->next_id;
	c->next_fd = -1;
	pthread_mutex_unlock(&fd_lock);
}

/*
 * The error of a connect(2) to path that failed with e (not a timeout),
 * with a hint for the two likely mistakes: a stream socket (EPROTOTYPE:
 * wcached's control socket, most likely) and a path that is no socket
 * (connect(2) gives ECONNREFUSED for a regular file: a config file given
 * for the socket).
 */
static int
connect_error(const char *path, int e)
{
	struct stat st;

	if (e == EPROTOTYPE)
		return error_set(-e, "%s is not wcached's client socket (a stream socket: "
			"wcached's control socket?); workers connect to the `socket` of wcached's "
			"config (default " DEFAULT_SOCKET_PATH ")", path);
	if (e == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
		return error_set(-e, "%s is not a socket (%s): workers connect to the `socket` "
			"of wcached's config (default " DEFAULT_SOCKET_PATH ")", path,
			path_file_kind(st.st_mode));
	if (e == ENOENT || e == ECONNREFUSED)
		return error_set(-e, "wcached is not running at %s (%s)", path, strerror(e));
	return error_set(-e, "cannot connect to wcached at %s: %s", path, strerror(e));
}

/*
 * Opens a SOCK_SEQPACKET connection to path with the deadline ms for the
 * connect and every later wait; *out gets the descriptor, which passes to
 * the caller (with c, a reconnect's: c->next_fd; with own, one of no
 * client's, which close_socket(NULL, own, ...) closes: open_socket). The
 * errors name the path and say whether wcached is running.
 */
static int
open_connection(wc_client *c, struct own_socket *own, const char *path, int ms, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timespec start;
	int fd = -1, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return error_set(-ENAMETOOLONG, "%s: socket path longer than %zu bytes", path,
			sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((r = open_socket(c, own, &fd)) < 0)
		return r;
	if ((r = apply_timeout(fd, ms, path)) < 0) {
		close_socket(c, own, fd);
		return r;
	}
	clock_gettime(CLOCK_MONOTONIC, &start);
	if (connect_retrying(fd, &sa, ms, &start) == -1) {
		int e = errno;

		close_socket(c, own, fd);
		if (e == EAGAIN || e == EINPROGRESS || e == EINTR)
			return error_set(-ETIMEDOUT, "wcached at %s did not accept the connection "
				"within %.3g s (waited %.3g s; the limit is %s or "
				"wc_connect_timeout())", path, ms / 1000.0,
				request_elapsed(&start), TIMEOUT_ENV);
		return connect_error(path, e);
	}
	*out = fd;
	return 0;
}

/*
 * The first socket of c, from socket() to c->fd, is one of no client's
 * (own_sockets): c is not yet the caller's, so a child forked meanwhile
 * by another thread (during the connect, which waits up to ms for room in
 * the backlog or for socket activation to start wcached) has no thread
 * that knows c, and its copy of the connection would stay open for the
 * child's life, counted by wcached against max_clients and
 * max_clients_per_uid (as ORIGINS' was, review rev180 F8). It becomes
 * c->fd and leaves own_sockets in one fd_lock step, as wc_connect()'s
 * last step before it hands c over (attach.c): a child forked after it
 * inherits c whole, and its caller's pointer to it as soon as the caller
 * stored it, as with any call that returns a descriptor.
 */
int
request_connect(wc_client *c, int ms)
{
	struct own_socket own = { .fd = -1 };
	int fd = -1, r;

	if ((r = open_connection(NULL, &own, c->path, ms, &fd)) < 0)
		return r;
	pthread_mutex_lock(&fd_lock);
	own_socket_forget(&own);
	c->fd = fd;
	c->fd_id = identity_of(fd);
	c->next_fd = -1;
	pthread_mutex_unlock(&fd_lock);
	return 0;
}

static ssize_t roundtrip(wc_client *c, const uint8_t *req, size_t req_len, uint32_t seq,
	int send_fd, int limit_ms, uint8_t *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds,
	struct wire_message *msg, int *dead);

/*
 * Whether an ERROR (code, text of len bytes) is how a wcached from before
 * ORIGINS refuses it: EBADMSG, "malformed message: unknown message type
 * 7" (with the request's seq), or from older ones "malformed message"
 * (seq 0). A wcached that knows ORIGINS names the type ("malformed
 * ORIGINS") when it finds one malformed.
 */
static int
older_refusal(int32_t code, const char *text, size_t len)
{
	static const char older[] = "malformed message";

	return code == EBADMSG && len >= sizeof(older) - 1 &&
		memcmp(text, older, sizeof(older) - 1) == 0 &&
		(len == sizeof(older) - 1 || text[sizeof(older) - 1] == ':');
}

/* One ORIGINS of files first.. of generation's name on fd (a connection of
 * its own) and its reply into ok, within ms from start; -errno with the
 * message (-ENOTSUP for a wcached that does not know ORIGINS, -ECONNRESET
 * for a close before any reply). */
static int
origins_page(int fd, const char *path, int ms, const struct timespec *start, const char *name,
	uint32_t first, struct wire_origins_ok *ok)
{
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	struct wire_message msg;
	const char *text;
	size_t nfds = 0, len;
	int32_t code;
	ssize_t n;
	int r;

	if ((n = wire_put_origins(req, sizeof(req), first + 1, first, name, strlen(name))) < 0)
		return error_set((int)n, "wcached at %s: ORIGINS of \"%s\": cannot encode it", path,
			name);
	len = (size_t)n;
	while ((n = fdp_send_intr(fd, req, len, NULL, 0)) == -EAGAIN || n == -EINTR)
		if ((r = wait_for(fd, POLLOUT, ms, start)) <= 0)
			return error_set(r == 0 ? -ETIMEDOUT : r, "wcached at %s: ORIGINS: "
				"could not send it within %.3g s", path, ms / 1000.0);
	if (n < 0)
		return error_set((int)n, "wcached at %s: ORIGINS: send: %s", path,
			strerror((int)-n));
	while ((n = fdp_recv_intr(fd, buf, sizeof(buf), NULL, 0, &nfds)) == -EAGAIN ||
		n == -EINTR)
		if ((r = wait_for(fd, POLLIN, ms, start)) <= 0)
			return error_set(r == 0 ? -ETIMEDOUT : r, "wcached at %s: ORIGINS: "
				"no answer within %.3g s", path, ms / 1000.0);
	/* A close before any reply is no answer (a wcached stopping, or
	 * one that drops the connection): not taken for an older one. */
	if (n == 0 || n == -ECONNRESET)
		return error_set(-ECONNRESET, "wcached at %s closed the connection before "
			"answering ORIGINS", path);
	if (n < 0)
		return error_set((int)n, "wcached at %s: ORIGINS: %s", path, strerror((int)-n));
	if (wire_decode(buf, (size_t)n, &msg) < 0)
		return error_set(-EBADMSG, "wcached at %s: the reply to ORIGINS was malformed",
			path);
	/* An ERROR of seq 0 answers the connection, not the request (a
	 * refusal at max_clients, EUSERS). */
	if (wire_get_error(&msg, &code, &text, &len) == 0 &&
		(msg.h.seq == 0 || msg.h.seq == first + 1)) {
		if (older_refusal(code, text, len))
			return error_set(-ENOTSUP, "wcached at %s does not say what its staged "
				"copies were copied from (it is older than this libwcache)", path);
		if (msg.h.seq == 0)
			return error_set(-code, "wcached at %s: %.*s", path, (int)len, text);
		return error_set(-code, "%.*s", (int)len, text);
	}
	if (msg.h.seq != first + 1)
		return error_set(-EBADMSG, "wcached at %s: the reply to ORIGINS was malformed",
			path);
	if (wire_get_origins_ok(&msg, ok) < 0 || (ok->file_count > 0 && ok->first != first))
		return error_set(-EBADMSG, "wcached at %s: the reply to ORIGINS was not one",
			path);
	return 0;
}

int
request_origins(const char *path, int ms, const char *name, uint64_t generation,
	size_t file_count, wc_file_identity *out)
{
	struct wire_origins_ok *ok;
	struct own_socket own = { .fd = -1 };
	struct timespec start;
	uint32_t first = 0;
	int fd = -1, r;

	if ((ok = calloc(1, sizeof(*ok))) == NULL)
		return error_set(-ENOMEM, "out of memory");
	clock_gettime(CLOCK_MONOTONIC, &start);
	/* Its own connection, which a child forked meanwhile closes. */
	if ((r = open_connection(NULL, &own, path, ms, &fd)) < 0)
		goto out;
	do {
		if ((r = origins_page(fd, path, ms, &start, name, first, ok)) < 0)
			goto out;
		if (ok->generation != generation) {
			r = error_set(-ESTALE, "%s: wcached serves generation %" PRIu64 " now, not "
				"%" PRIu64, name, ok->generation, generation);
			goto out;
		}
		if (ok->file_count == 0) {
			r = 1; /* its files are not staged copies */
			goto out;
		}
		if (ok->file_count != file_count) {
			r = error_set(-EBADMSG, "wcached at %s: ORIGINS of \"%s\" generation %"
				PRIu64 " names %" PRIu32 " files, not %zu", path, name, generation,
				ok->file_count, file_count);
			goto out;
		}
		for (size_t i = 0; i < ok->n; i++)
			out[first + i] = (wc_file_identity){ .dev = ok->origins[i].dev,
				.ino = ok->origins[i].ino, .size = ok->origins[i].size,
				.mtime_ns = ok->origins[i].mtime_ns,
				.ctime_ns = ok->origins[i].ctime_ns };
		first += (uint32_t)ok->n;
	} while (first < file_count);
	r = 0;
out:
	if (fd >= 0)
		close_socket(NULL, &own, fd);
	free(ok);
	return r;
}

/*
 * After a reconnect: tells the new daemon, with one HOLD each, which
 * generations this process still maps from earlier connections, and takes
 * the handle it answers, so that the model's release counts there again
 * (PROTOCOL.md, "Restarts"). A refusal (the daemon does not have that
 * generation open) leaves the model as it was: its release only unmaps.
 * Returns 0; 1 when the daemon hung up or answered something else (a
 * daemon that does not know HOLD answers an ERROR of seq 0, "malformed",
 * and closes the connection); or -errno (a timeout) with the message. The
 * HOLDs share what is left of the ms milliseconds the reconnect has had
 * since start (0: no limit): each waits only that long (the socket's
 * timeouts are set to it), and those left when they are up are not sent.
 * The lock is held.
 */
static int
announce_holds(wc_client *c, int ms, const struct timespec *start)
{
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	struct wire_message msg;
	uint64_t handle;
	size_t nfds = 0;
	ssize_t n;
	int dead, left, r;

	/* No record is added or unlinked meanwhile: both take the lock. */
	for (struct attach_record *a = c->records; a != NULL; a = a->next) {
		char name[WIRE_MAX_NAME + 1];
		uint64_t generation = 0;
		size_t len = 0;
		uint32_t seq;

		if (a->connection == c->connection || a->kind != ATTACH_KIND_GENERATION)
			continue;
		/* A model released on another thread may be freed at any time
		 * once its record says so; its release is this thread's to
		 * tell (request_unlock), and the old daemon released it. */
		pthread_mutex_lock(&c->released_lock);
		if (!a->released && a->am.model->name != NULL &&
			(len = strlen(a->am.model->name)) <= WIRE_MAX_NAME) {
			memcpy(name, a->am.model->name, len);
			generation = a->am.model->generation;
		}
		pthread_mutex_unlock(&c->released_lock);
		if (len == 0 || len > WIRE_MAX_NAME)
			continue;
		if ((left = request_left_ms(ms, start)) == 0)
			return 0;
		seq = request_next_seq(c);
		n = wire_put_hold(req, sizeof(req), seq, generation, name, len);
		if (n < 0)
			continue;
		/* Within what is left of ms (-1: no limit), the socket's
		 * timeouts too. */
		if (left > 0 && (r = apply_timeout(c->fd, left, c->path)) < 0)
			return r;
		n = roundtrip(c, req, (size_t)n, seq, -1, left < 0 ? 0 : left, buf, sizeof(buf),
			fds, WIRE_MAX_FDS, &nfds, &msg, &dead);
		if (n == -ETIMEDOUT)
			return (int)n;
		if (n < 0)
			return 1;
		if (nfds > 0 || (msg.h.type != WIRE_HOLD_OK && msg.h.type != WIRE_ERROR)) {
			fdp_close_all(fds, nfds);
			request_close_because(c, "wcached's reply to HOLD was not one (out of "
				"step)");
			return 1;
		}
		if (msg.h.type == WIRE_ERROR && msg.h.seq != seq)
			return 1; /* not a refusal of this HOLD: the connection's end */
		if (wire_get_hold_ok(&msg, &handle) == 0) {
			a->am.handle = handle;
			a->connection = c->connection;
		}
	}
	return 0;
}

/* The error of a request whose connection, number connection, was closed
 * when the deadline had passed, or passed while the client connected
 * again (the connection that closed is then no longer c's). */
static int
closed_too_late(const wc_client *c, uint64_t connection)
{
	char who[256];

	return error_set(-ETIMEDOUT, "%s and the deadline of %.3g s has passed (the limit is %s "
		"or wc_set_timeout())", closed_by(c, connection, who, sizeof(who)),
		c->timeout_ms / 1000.0, TIMEOUT_ENV);
}

/*
 * Replaces c's dead connection with a new one to the same path (the daemon
 * restarted, or the connection was closed after a timeout), connecting
 * and announcing the HOLDs within ms milliseconds (0: no limit); the new
 * socket keeps timeouts of at most ms until the caller sets them again (to
 * what is left of its deadline, or c->timeout_ms). What the client kept
 * from the old daemon goes: its status page may not be the new daemon's.
 * Models attached over the old connection keep their own mappings; the new
 * daemon is told which generations they are (announce_holds), and those it
 * has open are theirs again on the new connection; the release of the
 * others sends nothing (their connection number no longer matches).
 * The lock is held. On a failure to connect the old descriptor stays
 * (still dead); after a timeout of the HOLDs the new one does (and the
 * timeout closed it).
 */
static int
reconnect(wc_client *c, int ms)
{
	char why[256], who[256];
	struct timespec start;
	int fd = -1, r, left;

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int announce = 1;; announce = 0) {
		/* Each step within what the ones before left of ms. */
		if ((left = request_left_ms(ms, &start)) == 0)
			return closed_too_late(c, c->connection);
		if ((r = open_connection(c, NULL, c->path, left < 0 ? 0 : left, &fd)) < 0) {
			snprintf(why, sizeof(why), "%s", error_get());
			/* A socket path that is gone is a daemon that is not
			 * running, not a model that is not served (what -ENOENT
			 * means from wc_attach()). */
			return error_set(r == -ENOENT ? -ECONNREFUSED : r, "%s, and connecting "
				"again failed: %s", closed_by(c, c->connection, who, sizeof(who)),
				why);
		}
		take_next_fd(c);
		c->connection++;
		__atomic_add_fetch(&c->origins_epoch, 1, __ATOMIC_ACQ_REL);
		attach_cache_clear(&c->cache);
		if (!announce || (r = announce_holds(c, ms, &start)) == 0)
			return 0;
		if (r < 0)
			return r;
		/* It hung up on HOLD: once more, without (what it accepted
		 * was on that connection; those releases only unmap). */
	}
}

/*
 * A RELEASE waits as a request's send does: a send that a signal
 * interrupts (never restarted with SO_SNDTIMEO; restarting it would start
 * the timeout over, and a timer firing more often than the deadline would
 * keep a release from returning) or that says EAGAIN waits with poll(2)
 * for what is left of the deadline. A RELEASE that is not sent closes the
 * connection: the daemon would otherwise go on counting that attach for
 * as long as the connection lives, pinning its generation, and every
 * later release would wait the whole deadline too while the daemon does
 * not read (a stopped wcached's full socket buffer). Closed, the daemon
 * releases everything the connection held once it reads on, the releases
 * after this one fail at once (EPIPE), and the next request connects
 * again (reconnect(); its HOLDs of the models still mapped are refused
 * by a daemon that did not restart, and their releases only unmap, as
 * after any connection closed on a timeout). No message is
 * set: wc_release() returns nothing, and a release told when another
 * call gives the lock back (request_unlock) must leave that call's
 * message.
 */
void
request_send_release(wc_client *c, uint64_t handle)
{
	uint8_t req[WIRE_HEADER_SIZE + 8];
	struct timespec start;
	ssize_t len = wire_put_release(req, sizeof(req), 0, handle), n;
	int r;

	if (len < 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &start);
	while ((n = fdp_send_intr(c->fd, req, (size_t)len, NULL, 0)) == -EAGAIN || n == -EINTR) {
		if ((r = wait_for(c->fd, POLLOUT, c->timeout_ms, &start)) <= 0) {
			n = r == 0 ? -ETIMEDOUT : r;
			break;
		}
	}
	/* A connection already closed (EPIPE...: by the daemon, or here
	 * before) keeps what closed it. */
	if (n == -ETIMEDOUT)
		request_close_because(c, "a release could not be sent within %.3g s (wcached did "
			"not read)", c->timeout_ms / 1000.0);
	else if (n < 0 && n != -EPIPE && n != -ECONNRESET && n != -ENOTCONN)
		request_close_because(c, "a release could not be sent (%s)", strerror((int)-n));
	else if (n < 0) /* already closed: no reason of ours */
		shutdown(c->fd, SHUT_RDWR);
}

void
request_unlink_record(struct attach_record *a)
{
	*a->prevp = a->next;
	if (a->next != NULL)
		a->next->prevp = a->prevp;
	a->client = NULL;
	a->next = NULL;
	a->prevp = NULL;
}

/*
 * Tells the daemon of the models released on other threads whose records
 * are list (attach.c queued them on c->released; their models are gone):
 * each record still the client's is unlinked, the client's index dropped
 * when it was that stale model's (the client keeps the last index only
 * while its generation is current), and RELEASE sent when the record came
 * over this connection, in this process (a connection replaced since: the
 * old daemon released it when the connection closed, and the handle means
 * nothing to the new one, unless a HOLD made it this connection's). A
 * record that wc_disconnect() detached only goes. The lock is held.
 */
static void
tell_released(wc_client *c, struct attach_record *list)
{
	for (struct attach_record *a = list, *next; a != NULL; a = next) {
		next = a->released_next;
		if (a->client == c) {
			request_unlink_record(a);
			if (a->stale && c->cache.index == a->am.index) {
				attach_index_unref(c->cache.index);
				c->cache.index = NULL;
			}
			if (a->pid == c->pid && a->connection == c->connection)
				request_send_release(c, a->am.handle);
		}
		attach_model_free(&a->am);
		free(a);
	}
}

/*
 * Why no release is lost: a release queues its record under
 * released_lock, then tries the lock. This gives the lock back only under
 * released_lock, having found the queue empty: a record queued before
 * that is found and told; one queued after it finds the lock given back
 * (its try succeeds, and it tells the queue itself) or taken by a thread
 * that will give it back the same way. Nor is c touched once the lock is
 * given back but for released_lock, which wc_disconnect() takes before
 * the client can go.
 */
void
request_unlock(wc_client *c)
{
	struct attach_record *list;

	/* What this holding received is a model's or closed by now. */
	if (c->receiving) {
		c->receiving = 0;
		model_receive_end();
	}
	for (;;) {
		pthread_mutex_lock(&c->released_lock);
		list = c->released;
		c->released = NULL;
		if (list == NULL)
			break;
		pthread_mutex_unlock(&c->released_lock);
		tell_released(c, list);
	}
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&c->released_lock);
}

/*
 * Just before a recvmsg() under c's lock, once poll(2) said a message is
 * there: until what it received is a model's or closed (request_unlock(),
 * or receive_end_if_none() at once), no model's kept descriptor is closed
 * by number (model_receive_begin), so none of those received can be taken
 * for one a model lost (review rev174 F2: a release on another thread
 * between the receive and the new model's model_keep_fds() closed the new
 * model's). Begun only when a message waits, never for the wait itself,
 * which may take as long as another worker's build (a DERIVE): meanwhile
 * other threads' closes happen at once. Returns 1 when this began it.
 */
static int
receive_begin(wc_client *c)
{
	if (c->receiving)
		return 0;
	c->receiving = 1;
	model_receive_begin();
	return 1;
}

/* After the receive that receive_begin() began for (began 1) got no
 * descriptor, or its descriptors were closed: none waits for a model, so
 * the bracket ends now rather than at request_unlock(), and a wait for
 * the next message (an announcement met before the reply) defers no
 * other thread's close. */
static void
receive_end_if_none(wc_client *c, int began)
{
	if (began && c->receiving) {
		c->receiving = 0;
		model_receive_end();
	}
}

/* The next request's seq: counts from 1 and skips 0, which marks a
 * request that wants no reply. */
uint32_t
request_next_seq(wc_client *c)
{
	if (++c->seq == 0)
		c->seq = 1;
	return c->seq;
}

/*
 * Sends one request, with the descriptor send_fd unless it is -1 (it stays
 * the caller's), and receives its reply (matching seq) into buf, with up
 * to maxfds descriptors, which pass to the caller. Replies to other
 * requests (there should be none) are dropped with their descriptors
 * closed. limit_ms (0: none) is the deadline of the whole wait, counted
 * from before the send: the poll(2) before each receive waits only what is
 * left of it (wait_for), as does a send that fails with EAGAIN or that a
 * signal interrupts, and it bounds the wait when announcements keep
 * coming. Each receive is bracketed (receive_begin) from the moment a
 * message waits; one that got no descriptor, or whose descriptors were
 * closed, ends the bracket at once, the reply's at request_unlock().
 */
static ssize_t
roundtrip(wc_client *c, const uint8_t *req, size_t req_len, uint32_t seq, int send_fd,
	int limit_ms, uint8_t *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds,
	struct wire_message *msg, int *dead)
{
	char who[256];
	struct timespec start;
	ssize_t n;
	int began, r;

	/*
	 * A daemon that refuses a connection (too many clients) sends one
	 * ERROR and closes. Our request may then fail to send, and the first
	 * receive report ECONNRESET before the queued ERROR: read on, so the
	 * caller sees the daemon's reason rather than a bare reset.
	 */
	int reset = 0;

	/*
	 * A connection libwcache closed is dead, whatever is still queued on
	 * it: an answer that came after the deadline but before the close,
	 * more of a daemon out of step. None of it answers this request, nor
	 * is it a refusal (read below after a reset), so nothing more is
	 * sent or read on it: the caller connects again.
	 */
	if (request_closed_why(c, c->connection) != NULL) {
		*dead = 1;
		return error_set(-ECONNRESET, "%s", closed_by(c, c->connection, who,
			sizeof(who)));
	}
	*dead = 0;
	clock_gettime(CLOCK_MONOTONIC, &start);
	while ((n = fdp_send_intr(c->fd, req, req_len, send_fd >= 0 ? &send_fd : NULL,
			send_fd >= 0 ? 1 : 0)) == -EAGAIN || n == -EINTR) {
		if ((r = wait_for(c->fd, POLLOUT, limit_ms, &start)) == 0)
			return timed_out(c, "take the request", &start);
		if (r < 0) {
			request_close_because(c, "waiting to send failed (poll: %s)",
				strerror(-r));
			return error_set(r, "wcached at %s: waiting to send: poll: %s", c->path,
				strerror(-r));
		}
	}
	if (n < 0) {
		if (n != -EPIPE && n != -ECONNRESET && n != -ENOTCONN)
			return error_set((int)n, "wcached at %s: send: %s", c->path,
				strerror((int)-n));
		reset = 1;
	}
	for (;;) {
		/* The wait first, outside the receive bracket (receive_begin):
		 * poll(2) within what is left of limit_ms, which also bounds
		 * a signal's or an EAGAIN's wait (a non-blocking descriptor). */
		if ((r = wait_for(c->fd, POLLIN, limit_ms, &start)) == 0)
			return timed_out(c, "answer", &start);
		if (r < 0) {
			request_close_because(c, "waiting for an answer failed (poll: %s)",
				strerror(-r));
			return error_set(r, "wcached at %s: waiting for the answer: poll: %s",
				c->path, strerror(-r));
		}
		began = receive_begin(c);
		n = fdp_recv_intr(c->fd, buf, cap, fds, maxfds, nfds);
		if (n <= 0 || *nfds == 0)
			receive_end_if_none(c, began);
		if (n == -EAGAIN || n == -EINTR)
			continue;
		if (n == -ECONNRESET && !reset) {
			reset = 1;
			continue;
		}
		if (reset && n >= 0 && wire_decode(buf, (size_t)n, msg) == 0 &&
			msg->h.type == WIRE_ERROR)
			return n; /* the refusal, whatever its seq */
		if (reset && n >= 0) {
			fdp_close_all(fds, *nfds);
			receive_end_if_none(c, began);
			n = 0;
		}
		/* Hung up before the reply: the daemon exited or restarted. */
		*dead = n == 0 || n == -ECONNRESET;
		/* ECONNRESET is the daemon's close too (it closed with a request
		 * of ours still unread), not one of libwcache's own. */
		if (n == 0 || n == -ECONNRESET)
			return error_set(-ECONNRESET, "%s", closed_by(c, c->connection, who,
				sizeof(who)));
		if (n == -EMFILE) { /* the reply's descriptors were cut off */
			request_close_because(c, "a reply's descriptors were lost (this process "
				"is out of file descriptors)");
			return error_set((int)n, "wcached at %s: this process is out of "
				"file descriptors: those the reply carried were lost (raise "
				"its RLIMIT_NOFILE, ulimit -n, or close some)", c->path);
		}
		if (n < 0) {
			request_close_because(c, "a reply could not be received (%s)",
				strerror((int)-n));
			return error_set((int)n, "wcached at %s: receive: %s", c->path,
				strerror((int)-n));
		}
		if ((r = wire_decode(buf, (size_t)n, msg)) < 0) {
			fdp_close_all(fds, *nfds);
			receive_end_if_none(c, began);
			/* Out of step with the daemon: no later reply can be
			 * trusted on this connection. */
			request_close_because(c, "wcached's reply was malformed%s",
				r == -EPROTO ? " (protocol version mismatch)" : "");
			return error_set(r, "wcached at %s sent a malformed reply%s", c->path,
				r == -EPROTO ? " (protocol version mismatch: update libwcache or "
					       "wcached)" : "");
		}
		/* An ERROR with seq 0 answers no request in particular: the
		 * daemon refused the connection or could not read a header. */
		if (msg->h.type != WIRE_CHANGED &&
			(msg->h.seq == seq || (msg->h.type == WIRE_ERROR && msg->h.seq == 0)))
			return n;
		fdp_close_all(fds, *nfds);
		receive_end_if_none(c, began);
		if (msg->h.type != WIRE_CHANGED) {
			request_close_because(c, "wcached answered request %u with %u (out of "
				"step)", seq, msg->h.seq);
			return error_set(-EBADMSG, "wcached at %s answered request %u with %u",
				c->path, seq, msg->h.seq);
		}
		/* An announcement: drop it; the status page says what changed. */
		if (limit_ms > 0 && request_elapsed(&start) * 1000 > limit_ms)
			return timed_out(c, "answer", &start);
	}
}

ssize_t
request_call(wc_client *c, request_put_fn put, const void *arg, int grace_ms, uint8_t *buf,
	size_t cap, int *fds, size_t *nfds, struct wire_message *msg)
{
	uint8_t req[WIRE_MAX_MESSAGE];
	struct timespec start;
	uint64_t closed;
	ssize_t n;
	int r, left = c->timeout_ms, retimed = 0;

	*nfds = 0;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int attempt = 0;; attempt++) {
		int dead = 0, limit = left;
		uint32_t seq = request_next_seq(c);

		/* The daemon answers by itself when left runs out: the receive
		 * waits a little longer, so that its answer, not ours, says why. */
		if (c->timeout_ms > 0 && grace_ms > 0)
			limit = left > INT_MAX - grace_ms ? INT_MAX : left + grace_ms;
		/* After a reconnect, the new socket's timeouts become what is
		 * left too. */
		if (c->timeout_ms > 0 && (grace_ms > 0 || attempt > 0)) {
			if ((n = apply_timeout(c->fd, limit, c->path)) < 0)
				break;
			retimed = 1;
		}
		if ((n = put(req, sizeof(req), seq, left, arg)) < 0) {
			n = error_set((int)n, "%s: cannot encode the request: %s", c->where,
				strerror((int)-n));
			break;
		}
		n = roundtrip(c, req, (size_t)n, seq, -1, limit, buf, cap, fds, WIRE_MAX_FDS, nfds,
			msg, &dead);
		if (n >= 0 || !dead || attempt > 0)
			break;
		/* Once: connect again within what is left of the deadline and
		 * send the request again (the old daemon's attach, if it made
		 * one, ended with its connection), within what is left after
		 * that. */
		closed = c->connection;
		if ((left = request_left_ms(c->timeout_ms, &start)) == 0) {
			n = closed_too_late(c, closed);
			break;
		}
		if ((n = reconnect(c, left < 0 ? 0 : left)) < 0)
			break;
		retimed = 1;
		/* The deadline passed in the reconnect: the message is of the
		 * connection that closed, not of the new one. */
		if ((left = request_left_ms(c->timeout_ms, &start)) == 0) {
			n = closed_too_late(c, closed);
			break;
		}
		left = left < 0 ? 0 : left;
	}
	if (retimed && c->timeout_ms > 0 &&
		(r = apply_timeout(c->fd, c->timeout_ms, c->path)) < 0 && n >= 0) {
		fdp_close_all(fds, *nfds);
		*nfds = 0;
		n = r;
	}
	return n;
}

ssize_t
request_exchange(wc_client *c, const uint8_t *req, size_t len, uint32_t seq, int send_fd,
	uint8_t *buf, size_t cap, int *fds, size_t *nfds, struct wire_message *msg)
{
	int dead;

	*nfds = 0;
	return roundtrip(c, req, len, seq, send_fd, c->timeout_ms, buf, cap, fds, WIRE_MAX_FDS,
		nfds, msg, &dead);
}

int
wc_client_fd(const wc_client *c)
{
	if (c == NULL)
		return error_set(-EINVAL, "wc_client_fd: no client");
	return c->fd;
}

/*
 * Reads the announcements waiting on the connection without blocking. A
 * connection the daemon has hung up (it exited or restarted) is replaced
 * by a new one to the same path, so that an event loop polling
 * wc_client_fd() goes on with the new descriptor instead of spinning on a
 * dead one; announcements then resume for the models attached from now on.
 */
int
wc_client_dispatch(wc_client *c)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	char who[256];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0;
	struct wire_message msg;
	ssize_t n;
	int count = 0, r = 0;

	if (c == NULL)
		return error_set(-EINVAL, "wc_client_dispatch: no client");
	/* What waits on the parent's connection is the parent's (a reply
	 * with its descriptors, an announcement). */
	if (c->pid != request_self_pid())
		return not_our_client(c, "wc_client_dispatch");
	/* Another thread's request reads the connection: it drops the
	 * announcements it meets (the status page says what changed), and
	 * replaces the connection if it is dead. Waiting for it could take
	 * as long as a DERIVE waits for another worker's build. */
	if (pthread_mutex_trylock(&c->lock) != 0)
		return 0;
	for (;;) {
		/* Only announcements can be waiting: replies are read by the
		 * request that caused them, under the same lock. */
		n = recv(c->fd, buf, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n > 0) {
			int began = receive_begin(c);

			nfds = 0;
			n = fdp_recv(c->fd, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds);
			/* An announcement's descriptors are nobody's. */
			fdp_close_all(fds, nfds);
			receive_end_if_none(c, began);
		}
		else if (n < 0)
			n = -errno;
		if (n == -EAGAIN)
			break;
		if (n == 0 || n == -ECONNRESET) {
			if (c->pid == request_self_pid() && (r = reconnect(c, c->timeout_ms)) == 0)
				r = apply_timeout(c->fd, c->timeout_ms, c->path);
			else if (r == 0)
				r = error_set(-ECONNRESET, "%s", closed_by(c, c->connection, who,
					sizeof(who)));
			break;
		}
		if (n < 0) {
			r = error_set((int)n, "%s: receive: %s", c->where, strerror((int)-n));
			break;
		}
		if (wire_decode(buf, (size_t)n, &msg) == 0 && msg.h.type == WIRE_CHANGED)
			count++;
	}
	if (count > 0) {
		/* A new generation: the index kept for the next attach is old. */
		attach_index_unref(c->cache.index);
		c->cache.index = NULL;
	}
	request_unlock(c);
	return r < 0 ? r : count;
}
