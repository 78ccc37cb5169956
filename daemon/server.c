/*
 * server.c: the client socket (see server.h).
 *
 * Each connection owns its descriptor, its uv_poll_t, a list of the
 * generations it attached (one client reference each), and at most one
 * pending reply. The descriptors in a pending ATTACH_OK belong to the
 * generation, which the attach already holds, so they stay open until the
 * reply is sent. A malformed message gets an ERROR reply when possible and
 * the connection is closed; nothing a client sends affects another client.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/error.h"
#include "closer.h"
#include "proto/fdpass.h"
#include "listen.h"
#include "log.h"
#include "peercred.h"
#include "derive.h"
#include "restore.h"
#include "server.h"
#include "server_internal.h"
#include "uidtally.h"
#include "proto/wire.h"

#define READS_PER_WAKEUP 16
/* Connections accepted per wakeup of the listener, which is level-triggered:
 * the loop comes back for the rest after it has served the others. Without
 * a limit, one process that loops on connect() and close() kept the backlog
 * from ever emptying, and the loop never got back to anyone else (a release
 * took 3.7 s; every connection accepted meanwhile counted until its hang-up
 * was handled, so after max_clients everyone was refused). The control
 * socket takes as many (CTL_ACCEPTS_PER_WAKEUP). */
#define ACCEPTS_PER_WAKEUP 16
/* How often connections held back by the descriptor budget are looked at
 * again (they are also looked at whenever they become readable). */
#define DEFER_RETRY_MS 50
/* Descriptors of one uid waiting to close (closer.h) past which its
 * connections are not read: each message may carry up to WIRE_MAX_FDS
 * descriptors (the kernel installs them all on receipt, and they wait in
 * its lane), so a client whose descriptors do not close (a lingering
 * socket, a file on its own hung FUSE server) cannot fill wcached's
 * descriptor table with them in the moment before its lane counts as
 * stuck. Once as many wait behind a close that has run for
 * CLOSING_STUCK_MS, its new connections are refused and its connections
 * closed; a burst of connections that end at once (closed in a moment)
 * is never taken for that, and is read again a retry later. */
#define CLOSING_PER_UID_MAX 64
#define CLOSING_STUCK_MS 1000
/* How long a connection must have sent nothing, holding nothing, before it
 * may be closed to make room when max_clients are connected (make_room):
 * libwcache attaches as soon as it connects, so only a connection left
 * idle on purpose, or forgotten, waits this long with nothing attached. */
#define IDLE_EVICT_MS 5000

static void conn_io(uv_poll_t *handle, int status, int events);
static int conn_read(struct conn *c);
static void on_retry(uv_timer_t *t);

unsigned
server_clients(const struct server *s)
{
	return s->nconns;
}

int
server_may_warn(struct server *s, uid_t uid, char *more, size_t size)
{
	return lograte_check(&s->warnings, uid, uv_now(s->loop), 1, more, size, "warnings");
}

/* Warns once per connection that its replies are held back, and why. */
static void
conn_throttled(struct conn *c, const char *why)
{
	c->srv->stats.replies_deferred++;
	if (c->throttle_logged++)
		return;
	log_warnx("client pid %d uid %u: %s; not reading from it until it reads its replies "
		  "(%u descriptors of its replies unread)", (int)c->pid, (unsigned)c->uid, why,
		c->inflight_fds);
}

/* Runs the retry timer while any connection is held back or waits
 * half-closed for the answer to its PUBLISH (on_retry looks at both). */
static void
retry_timer_update(struct server *s)
{
	int active = uv_is_active((uv_handle_t *)&s->retry_timer);

	if (s->ndeferred + s->nhalf_closed > 0 && !active)
		uv_timer_start(&s->retry_timer, on_retry, DEFER_RETRY_MS, DEFER_RETRY_MS);
	else if (s->ndeferred + s->nhalf_closed == 0 && active)
		uv_timer_stop(&s->retry_timer);
}

/* The one place a connection is held back or let go (enum conn_deferred). */
static void
conn_set_deferred(struct conn *c, enum conn_deferred deferred)
{
	struct server *s = c->srv;
	int was = c->deferred != DEFER_NONE;

	c->deferred = deferred;
	if (!was && deferred != DEFER_NONE)
		s->ndeferred++;
	else if (was && deferred == DEFER_NONE)
		s->ndeferred--;
	retry_timer_update(s);
}

/* The one place a connection's wait changes (enum conn_waiting). */
static void
conn_set_waiting(struct conn *c, enum conn_waiting waiting)
{
	struct server *s = c->srv;
	int was = c->waiting == WAIT_CHECK_HALF_CLOSED;

	c->waiting = waiting;
	if (!was && waiting == WAIT_CHECK_HALF_CLOSED)
		s->nhalf_closed++;
	else if (was && waiting != WAIT_CHECK_HALF_CLOSED)
		s->nhalf_closed--;
	retry_timer_update(s);
}

/*
 * Sends the pending reply if it can go now. Otherwise it stays pending and
 * the connection is not read (backpressure): until the socket drains
 * (EAGAIN: wait for writable), or until the descriptor budget has room
 * (deferred: looked at again by the retry timer). A send the kernel
 * refuses for lack of in-flight quota or memory is deferred the same way:
 * one client's backlog never closes another client's connection.
 */
static void
conn_flush(struct conn *c)
{
	struct server *s = c->srv;
	ssize_t n;

	if (c->out_nfds > 0 && !fd_budget_allows(c, c->out_nfds)) {
		conn_throttled(c, "too many descriptors in flight");
		goto defer;
	}
	n = fdp_send(c->fd, c->out, c->out_len, c->out_fds, c->out_nfds);
	if (n == -EAGAIN) {
		conn_set_deferred(c, DEFER_NONE);
		conn_hold(c);
		uv_poll_start(&c->poll, UV_WRITABLE | UV_DISCONNECT, conn_io);
		return;
	}
	if (n == -ETOOMANYREFS || n == -ENOBUFS || n == -ENOMEM) {
		s->stats.sends_refused++;
		conn_throttled(c, n == -ETOOMANYREFS ?
				"the kernel refused to pass more descriptors (ETOOMANYREFS: "
				"RLIMIT_NOFILE of wcached's user reached)" :
				"the kernel is short of memory for the reply");
		goto defer;
	}
	conn_set_deferred(c, DEFER_NONE);
	conn_unhold(c);
	c->pending = 0;
	if (n < 0) {
		char more[96];

		/* The peer left before its reply (EPIPE, ECONNRESET): its own
		 * doing, said at debug level; anything else at most once a
		 * minute per uid, since a client can cause it at will. */
		if (n == -EPIPE || n == -ECONNRESET)
			log_debug("client pid %d uid %u: left before its reply (%s); closing the "
				  "connection", (int)c->pid, (unsigned)c->uid, strerror((int)-n));
		else if (server_may_warn(s, c->uid, more, sizeof(more)))
			log_warnx("client pid %d uid %u: send: %s; closing the connection%s",
				(int)c->pid, (unsigned)c->uid, strerror((int)-n), more);
		conn_close(c);
		return;
	}
	inflight_add(c, (unsigned)c->out_nfds);
	c->out_nfds = 0;
	uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_io);
	return;
defer:
	conn_set_deferred(c, DEFER_REPLY);
	conn_hold(c);
	/* Only a hang-up is of interest until the reply can go. */
	uv_poll_start(&c->poll, UV_DISCONNECT, conn_io);
}

/* Queues a reply (copying it) and sends it as soon as it may go. */
void
conn_send(struct conn *c, const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
	memcpy(c->out, buf, len);
	c->out_len = len;
	if (nfds > 0) /* fds is NULL when there are none: not for memcpy */
		memcpy(c->out_fds, fds, nfds * sizeof(*fds));
	c->out_nfds = nfds;
	c->pending = 1;
	conn_flush(c);
}

/* Looks again at every connection held back by the descriptor budget. */
static void
on_retry(uv_timer_t *t)
{
	struct server *s = t->data;
	struct conn *c, *next;

	for (c = s->conns; c != NULL; c = next) {
		next = c->next;
		/* A half-closed builder whose PUBLISH is checked is not
		 * watched: it is closed here once it has gone for good (it
		 * exited), as the hang-up would have closed it (conn_io). */
		if (c->waiting == WAIT_CHECK_HALF_CLOSED && !c->closing && peer_departed(c->fd)) {
			log_debug("client pid %d uid %u: left while its PUBLISH is checked; "
				  "closing the connection", (int)c->pid, (unsigned)c->uid);
			conn_close(c);
			continue;
		}
		if (c->deferred == DEFER_NONE || c->closing)
			continue;
		if (c->deferred == DEFER_REPLY) {
			conn_flush(c);
		} else {
			conn_set_deferred(c, DEFER_NONE);
			uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_io);
		}
		if (!c->pending && !c->waiting && !c->closing && c->deferred == DEFER_NONE)
			conn_read(c);
	}
}

void
conn_wait(struct conn *c, enum conn_waiting what)
{
	conn_set_waiting(c, what);
	uv_poll_start(&c->poll, UV_DISCONNECT, conn_io);
}

void
conn_wait_end(struct conn *c)
{
	conn_set_waiting(c, WAIT_NONE);
}

void
conn_release(struct conn *c, struct generation *g)
{
	if (c->srv->derive != NULL)
		derive_release(c->srv->derive, g, c->uid);
	else
		registry_release(c->srv->reg, g, c->uid);
}

/*
 * Closes a client's connection socket: at once when nothing is queued on it,
 * which is every connection that ends in order; in uid's lane of the closer
 * otherwise, because whatever is queued is released with the socket, in the
 * closing thread, and may carry descriptors whose last close blocks. Shut
 * for reading first, so that nothing more can be queued; then a peek with
 * SO_PASSCRED tells an empty queue (no message, no credentials) from any
 * message, even an empty one. A descriptor the peek finds is dropped by the
 * kernel, but only its extra reference: the queued one still holds it.
 */
static void
close_client_socket(struct closer *cl, uid_t uid, int fd)
{
	union {
		struct cmsghdr align;
		unsigned char buf[CMSG_SPACE(sizeof(struct ucred))];
	} control;
	struct msghdr msg;
	struct iovec iov;
	char byte;
	int one = 1;
	ssize_t n = -1;

	memset(&msg, 0, sizeof(msg));
	iov.iov_base = &byte;
	iov.iov_len = 1;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = control.buf;
	msg.msg_controllen = sizeof(control.buf);
	if (shutdown(fd, SHUT_RD) == 0 &&
		setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) == 0) {
		do
			n = recvmsg(fd, &msg, MSG_PEEK | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
	}
	if (n == 0 && msg.msg_controllen == 0 && !(msg.msg_flags & MSG_CTRUNC))
		close(fd);
	else
		closer_close(cl, uid, fd);
}

/* Closes a descriptor c passed and wcached does not keep, in c's uid's lane
 * of the closer: never on the loop (closer.h). */
static void
conn_drop_fd(int fd, void *arg)
{
	struct conn *c = arg;

	closer_close(c->closer, c->uid, fd);
}

static void
conn_drop_fds(struct conn *c, const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		conn_drop_fd(fds[i], c);
}

/*
 * Closes c, whose uid's lane is stuck, telling it why first: one send that
 * does not wait (a peer that reads nothing is not waited for; with its
 * request still queued, the socket closes in that stuck lane, so the peer
 * would otherwise learn nothing).
 */
static void
conn_tell_and_close(struct conn *c, const char *text, unsigned stuck)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	char why[160];
	ssize_t n;

	snprintf(why, sizeof(why), "%s (%u wait behind one that does not)", text, stuck);
	log_warnx("client pid %d uid %u: %s; closing the connection", (int)c->pid,
		(unsigned)c->uid, why);
	if ((n = wire_put_error(buf, sizeof(buf), 0, EUSERS, why)) > 0)
		(void)fdp_send(c->fd, buf, (size_t)n, NULL, 0);
	conn_close(c);
}

/*
 * Answers a message that wire_decode_why() refused (code, why; n bytes),
 * and closes the connection: the ERROR says which check failed, and echoes
 * the request's seq when its header could be read (PROTOCOL.md,
 * Malformed messages).
 */
static void
conn_malformed(struct conn *c, int code, const struct wire_refusal *why, size_t n)
{
	uint32_t seq = why->has_header ? why->h.seq : 0;
	const char *type = why->has_header ? wire_type_name(why->h.type) : NULL;

	if (code == -EPROTO)
		conn_error(c, seq, code, 1, "protocol version mismatch: client speaks %u, daemon "
			"speaks %u", why->h.version, WIRE_VERSION);
	else if (type != NULL && why->h.length != n - WIRE_HEADER_SIZE)
		conn_error(c, seq, code, 1, "malformed %s: %s (%u; the payload has %zu bytes)",
			type, why->reason, why->h.length, n - WIRE_HEADER_SIZE);
	else if (type != NULL)
		conn_error(c, seq, code, 1, "malformed %s: %s", type, why->reason);
	else if (why->has_header)
		conn_error(c, seq, code, 1, "malformed message: %s %u", why->reason,
			why->h.type);
	else
		conn_error(c, seq, code, 1, "malformed message: %s", why->reason);
}

/* Reads and handles messages until the socket is empty, a reply is
 * pending or waited for, or the connection closes, READS_PER_WAKEUP at most
 * (the loop comes back for more). Returns 1 when it stopped at that limit
 * with the connection still to be read, else 0. */
static int
conn_read(struct conn *c)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	int fds[1];
	size_t nfds = 0;
	struct wire_message msg;
	struct wire_refusal why;
	unsigned k;
	ssize_t n;
	int r;

	for (int i = 0; i < READS_PER_WAKEUP && !c->pending && !c->waiting && !c->closing; i++) {
		nfds = 0;
		if ((k = closer_stuck(c->closer, c->uid, CLOSING_STUCK_MS)) >=
			CLOSING_PER_UID_MAX) {
			c->srv->stats.closing_refused++;
			conn_tell_and_close(c, "too many of this user's descriptors are still "
				"closing", k);
			return 0;
		}
		if ((k = closer_pending(c->closer, c->uid)) >= CLOSING_PER_UID_MAX) {
			if (!c->paused_logged) {
				c->paused_logged = 1;
				c->srv->stats.reads_paused_closing++;
				log_warnx("client pid %d uid %u: %u of this user's descriptors "
					  "wait to close; not reading from it until fewer do",
					(int)c->pid, (unsigned)c->uid, k);
			}
			conn_set_deferred(c, DEFER_READ);
			/* Only a hang-up is of interest until then. */
			uv_poll_start(&c->poll, UV_DISCONNECT, conn_io);
			return 0;
		}
		n = fdp_recv_drop(c->fd, buf, sizeof(buf), fds, 1, &nfds, conn_drop_fd, c);
		if (n == -EAGAIN)
			return 0;
		if (n > 0)
			c->active_ms = uv_now(c->srv->loop);
		if (n == 0) {
			conn_close(c);
			return 0;
		}
		if (n == -EMFILE) {
			/* Not the client's fault: wcached could not take them. */
			conn_error(c, 0, -EMFILE, 1, "wcached is out of file descriptors: "
				"those sent with a message were lost (raise LimitNOFILE=); "
				"try again");
			return 0;
		}
		if (n == -EBADMSG) {
			conn_error(c, 0, -EBADMSG, 1,
				"sent more descriptors than a PUBLISH carries");
			return 0;
		}
		if (n == -EMSGSIZE) {
			conn_error(c, 0, -EMSGSIZE, 1, "message longer than %u bytes",
				WIRE_MAX_MESSAGE);
			return 0;
		}
		if (n < 0) {
			log_debug("client pid %d: receive: %s", (int)c->pid, strerror((int)-n));
			conn_close(c);
			return 0;
		}
		if ((r = wire_decode_why(buf, (size_t)n, &msg, &why)) < 0) {
			conn_drop_fds(c, fds, nfds);
			conn_malformed(c, r, &why, (size_t)n);
			return 0;
		}
		/* Only a PUBLISH carries a descriptor, and always exactly one. */
		if ((msg.h.type == WIRE_PUBLISH) != (nfds == 1)) {
			conn_drop_fds(c, fds, nfds);
			conn_error(c, msg.h.seq, -EBADMSG, 1, msg.h.type == WIRE_PUBLISH ?
				"PUBLISH without its memfd" :
				"sent descriptors, which wcached accepts only with PUBLISH");
			return 0;
		}
		switch (msg.h.type) {
		case WIRE_ATTACH:
			request_attach(c, &msg);
			break;
		case WIRE_RELEASE:
			request_release(c, &msg);
			break;
		case WIRE_HOLD:
			request_hold(c, &msg);
			break;
		case WIRE_DERIVE:
			request_derive(c, &msg);
			break;
		case WIRE_PUBLISH:
			request_publish(c, &msg, fds[0]);
			break;
		case WIRE_ABANDON:
			request_abandon(c, &msg);
			break;
		case WIRE_ORIGINS:
			request_origins(c, &msg);
			break;
		default:
			conn_error(c, msg.h.seq, -EBADMSG, 1, "unexpected message type %u",
				msg.h.type);
			break;
		}
	}
	return !c->pending && !c->waiting && !c->closing;
}

static void
conn_io(uv_poll_t *handle, int status, int events)
{
	struct conn *c = handle->data;

	if (status < 0) {
		conn_close(c);
		return;
	}
	/* The peer shut its end for writing, or closed it: the requests it
	 * sent before are answered as far as their replies can go at once
	 * (a reply already queued stays readable after the close), then the
	 * connection ends. Closed at once, a client that half-closes after
	 * its last request (shutdown(SHUT_WR)) lost its answers; closed after
	 * one round of reads, it lost those past the 16th. So while requests
	 * remain, the loop comes back for them (the hang-up stays reported);
	 * the end of the stream closes it (conn_read).
	 *
	 * A PUBLISH waits for its check: a builder that shut its end for
	 * writing after it still reads, and gets the answer when the check
	 * ends. Until then c is not watched (the half-close, level-triggered,
	 * would be reported on every turn of the loop), and the retry timer
	 * closes it if its peer leaves for good meanwhile (on_retry); the
	 * answer's send watches it again, and the end of the stream or a
	 * reply that cannot go at once closes it, as for any half-closed
	 * client. A peer that closed its socket is closed at once: the check
	 * goes on without it (derive_conn_gone). A DERIVE that waits is
	 * closed too, as PROTOCOL.md says: its wait may last minutes. */
	if (events & UV_DISCONNECT) {
		if ((events & UV_READABLE) && !c->pending && !c->waiting &&
			c->deferred == DEFER_NONE && conn_read(c))
			return;
		if (c->waiting == WAIT_CHECK && !c->closing && !peer_departed(c->fd)) {
			log_debug("client pid %d uid %u: shut its end for writing while its "
				  "PUBLISH is checked; it gets its answer, then the connection "
				  "closes", (int)c->pid, (unsigned)c->uid);
			conn_set_waiting(c, WAIT_CHECK_HALF_CLOSED);
			uv_poll_stop(&c->poll);
			return;
		}
		conn_close(c);
		return;
	}
	if ((events & UV_WRITABLE) && c->pending) {
		conn_flush(c);
		if (c->pending || c->closing)
			return;
	}
	if ((events & UV_READABLE) && !c->pending && !c->waiting)
		conn_read(c);
}

static void
conn_free(uv_handle_t *handle)
{
	struct conn *c = handle->data;

	close_client_socket(c->closer, c->uid, c->fd);
	free(c->refs);
	free(c->groups);
	free(c);
}

/* Releases everything the connection holds and closes it. */
void
conn_close(struct conn *c)
{
	if (c->closing)
		return;
	c->closing = 1;
	conn_set_deferred(c, DEFER_NONE);
	conn_set_waiting(c, WAIT_NONE);
	conn_unhold(c);
	/* The peer's socket, and with it everything unread, goes away with
	 * the connection (or is no longer ours to account for). */
	inflight_forget(c);
	/* It waits no more; a build it ran goes to the next waiter. */
	if (c->srv->derive != NULL)
		derive_conn_gone(c->srv->derive, c);
	for (size_t i = 0; i < c->nrefs; i++)
		conn_release(c, c->refs[i].gen);
	c->nrefs = 0;
	*c->prevp = c->next;
	if (c->next != NULL)
		c->next->prevp = c->prevp;
	c->srv->nconns--;
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, conn_free);
}

/*
 * Refuses a connection over a limit with an error message (text), and
 * closes it in its uid's lane (it may have sent descriptors already). The
 * warning, fmt and what follows, names its uid and pid and is logged at
 * most once a minute per uid (server_may_warn): a loop of refused
 * connections must not flood the log.
 */
static void __attribute__((format(printf, 4, 5)))
refuse(struct server *s, int fd, const char *text, const char *fmt, ...)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n = wire_put_error(buf, sizeof(buf), 0, EUSERS, text);
	struct ucred cred = { .pid = 0, .uid = CLOSER_DAEMON };
	socklen_t len = sizeof(cred);
	char why[256], more[96];
	va_list ap;

	if (n > 0)
		(void)fdp_send(fd, buf, (size_t)n, NULL, 0);
	(void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
	if (server_may_warn(s, cred.uid, more, sizeof(more))) {
		va_start(ap, fmt);
		vsnprintf(why, sizeof(why), fmt, ap);
		va_end(ap);
		log_warnx("refusing a client (uid %u pid %d): %s%s", (unsigned)cred.uid,
			(int)cred.pid, why, more);
	}
	close_client_socket(s->closer, cred.uid, fd);
}

/* Reads the peer's credentials and every supplementary group into c;
 * -errno with the reason in error_get() when they cannot be read (the
 * client is refused: a peer whose groups are unknown could be denied a
 * model its group may attach). */
static int
read_peer(struct conn *c)
{
	struct peer_cred cred;
	int err;

	if ((err = peer_read(c->fd, &cred)) < 0)
		return err;
	c->pid = cred.pid;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->groups = cred.groups; /* c's now */
	c->ngroups = cred.ngroups;
	return 0;
}

/* Connections the peer's uid already has. */
static unsigned
conns_of(const struct server *s, uid_t uid)
{
	unsigned n = 0;

	for (const struct conn *c = s->conns; c != NULL; c = c->next)
		if (c->uid == uid)
			n++;
	return n;
}

/*
 * Out of descriptors: accept with the spare one to refuse the client
 * politely instead of leaving it in the backlog, then take it back.
 * Returns 1 when a client was refused, 0 when none was waiting (accept4
 * reports EMFILE before it looks at the queue), -1 when one may be waiting
 * but cannot be refused: there is no spare (it is lost when the refused
 * connection's close had to wait in its uid's lane, closer.h, and kept the
 * number it freed), or the spare's number went to another thread first.
 */
static int
refuse_without_fds(struct server *s)
{
	int fd, e;

	if (s->spare_fd < 0)
		return -1;
	close(s->spare_fd);
	fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	e = errno;
	if (fd >= 0)
		refuse(s, fd, "wcached is out of file descriptors",
			"out of file descriptors (raise LimitNOFILE=)");
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd >= 0)
		return 1;
	return e == EMFILE || e == ENFILE ? -1 : 0;
}

/* May c be closed to make room (make_room)? It holds no attach, HOLD or
 * build (a builder holds its source), waits for nothing, has no reply
 * pending or held back, and has sent nothing for IDLE_EVICT_MS. */
static int
conn_idle(const struct conn *c, uint64_t now)
{
	return !c->closing && c->nrefs == 0 && !c->pending && c->waiting == WAIT_NONE &&
		c->deferred == DEFER_NONE && c->inflight_fds == 0 &&
		now - c->active_ms >= IDLE_EVICT_MS;
}

/*
 * max_clients are connected and one more wants in: the idle connection
 * (conn_idle) to close to make room (make_room), of the uid with the most
 * idle ones, the one idle the longest; NULL when none is idle (the
 * newcomer is refused, as before). Connections that attach nothing would
 * otherwise keep every worker out for as long as they stay open: four
 * users at max_clients_per_uid are max_clients. The control socket evicts
 * the same way (control.c make_room: idle the longest, newest first with
 * <= on a tie); a change to one is a change to both.
 */
static struct conn *
room_victim(struct server *s)
{
	struct uidtally idle = { 0 };
	struct conn *victim = NULL;
	uint64_t now = uv_now(s->loop);
	unsigned most = 0, k;

	/* Out of memory for the tally, uids count 0: the oldest idle one goes. */
	for (struct conn *c = s->conns; c != NULL; c = c->next)
		if (conn_idle(c, now))
			(void)uidtally_add(&idle, c->uid, 1);
	/* <=: the list is newest first, so on a tie the oldest wins. */
	for (struct conn *c = s->conns; c != NULL; c = c->next) {
		if (!conn_idle(c, now))
			continue;
		k = uidtally_get(&idle, c->uid);
		if (victim == NULL || k > most ||
			(k == most && c->active_ms <= victim->active_ms)) {
			victim = c;
			most = k;
		}
	}
	uidtally_free(&idle);
	return victim;
}

/* Closes victim (room_victim) for a newcomer, telling it why first (one
 * send that does not wait). Called once the newcomer passed every check
 * and is watched (on_accept), so none is refused after a connection went
 * for it. */
static void
make_room(struct server *s, struct conn *victim)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	uint64_t now = uv_now(s->loop);
	char more[96];
	ssize_t n;

	s->stats.idle_closed++;
	if (lograte_check(&s->idle_closes, victim->uid, now, 1, more, sizeof(more),
		"idle connections closed"))
		log_warnx("client pid %d uid %u: idle for %" PRIu64 " s with nothing attached "
			  "while %u clients are connected (max_clients); closing the connection "
			  "to make room%s", (int)victim->pid, (unsigned)victim->uid,
			(now - victim->active_ms) / 1000, s->nconns, more);
	n = wire_put_error(buf, sizeof(buf), 0, EUSERS, "closed: wcached has max_clients "
		"connected and this connection was idle with nothing attached");
	if (n > 0)
		(void)fdp_send(victim->fd, buf, (size_t)n, NULL, 0);
	conn_close(victim);
}

static void on_accept(uv_poll_t *handle, int status, int events);

/* Watches the listening socket again after a pause, with a spare again if
 * a descriptor is free for it. */
static void
on_accept_resume(uv_timer_t *t)
{
	struct server *s = t->data;

	if (s->stopping)
		return;
	if (s->spare_fd < 0)
		s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
}

/*
 * Out of descriptors with no spare to refuse the waiting client with: it
 * stays in the backlog, and the listening socket stays readable, so it is
 * not watched for SERVER_ACCEPT_PAUSE_MS (level-triggered, every turn of the loop
 * would find it readable and fail accept4 again, at 100% CPU). So too when
 * accept4 fails otherwise (err: ENOMEM, ENOBUFS under memory pressure).
 * Said once until a client is accepted again.
 */
static void
accept_pause(struct server *s, int err)
{
	if (!s->accept_paused_logged) {
		s->accept_paused_logged = 1;
		if (err == EMFILE || err == ENFILE)
			log_warnx("out of file descriptors, with none spare to refuse clients "
				  "with: they wait in the backlog; trying again every %d ms "
				  "(raise LimitNOFILE=)", SERVER_ACCEPT_PAUSE_MS);
		else
			log_warnx("accept: %s: clients wait in the backlog; trying again every "
				  "%d ms", strerror(err), SERVER_ACCEPT_PAUSE_MS);
	}
	s->stats.accept_pauses++;
	uv_poll_stop(&s->listen_poll);
	uv_timer_start(&s->accept_timer, on_accept_resume, SERVER_ACCEPT_PAUSE_MS, 0);
}

/*
 * The listener is readable: takes the connections waiting, at most
 * ACCEPTS_PER_WAKEUP of them (the loop comes back for the rest), and
 * refuses those over a limit with an ERROR.
 */
static void
on_accept(uv_poll_t *handle, int status, int events)
{
	struct server *s = handle->data;
	struct conn *c, *victim;
	unsigned k;
	int fd;

	(void)events;
	if (status < 0)
		return;
	for (int i = 0; i < ACCEPTS_PER_WAKEUP && !s->stopping; i++) {
		fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE) {
				int r = refuse_without_fds(s);

				if (r < 0)
					accept_pause(s, EMFILE);
				if (r <= 0)
					return;
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				accept_pause(s, errno);
			return;
		}
		s->accept_paused_logged = 0;
		if (s->fd_limit > 0 && fd >= s->fd_limit - s->fd_reserve) {
			refuse(s, fd, "wcached is short of file descriptors",
				"descriptor %d is in the reserve of %d (raise LimitNOFILE=)", fd,
				s->fd_reserve);
			continue;
		}
		if ((c = calloc(1, sizeof(*c))) == NULL) {
			refuse(s, fd, "wcached is out of memory", "out of memory");
			continue;
		}
		c->fd = fd;
		c->srv = s;
		c->closer = s->closer;
		c->id = ++s->next_conn_id;
		c->active_ms = uv_now(s->loop);
		if (read_peer(c) < 0) {
			free(c);
			refuse(s, fd, "wcached cannot read this client's credentials", "%s",
				error_get());
			continue;
		}
		if ((k = closer_stuck(s->closer, c->uid, CLOSING_STUCK_MS)) >=
			CLOSING_PER_UID_MAX) {
			s->stats.closing_refused++;
			free(c->groups);
			free(c);
			refuse(s, fd, "too many of this user's descriptors are still closing",
				"%u of this user's descriptors wait to close behind one that does "
				"not", k);
			continue;
		}
		if (conns_of(s, c->uid) >= s->max_clients_per_uid) {
			free(c->groups);
			free(c);
			refuse(s, fd, "too many connections from this user (max_clients_per_uid)",
				"the user has %u connections (max_clients_per_uid)",
				s->max_clients_per_uid);
			continue;
		}
		/* Room is made last, so that a newcomer refused for any other
		 * reason never has another's idle connection closed for it:
		 * the victim is chosen before uv_poll_init, which is not
		 * undone, and closed after it (make_room). */
		victim = NULL;
		if (s->nconns >= s->max_clients && (victim = room_victim(s)) == NULL) {
			free(c->groups);
			free(c);
			refuse(s, fd, "too many clients connected to wcached (max_clients)",
				"%u clients connected (max_clients)", s->nconns);
			continue;
		}
		if (uv_poll_init(s->loop, &c->poll, fd) < 0) {
			free(c->groups);
			free(c);
			refuse(s, fd, "wcached cannot watch the connection", "uv_poll_init failed");
			continue;
		}
		if (victim != NULL)
			make_room(s, victim);
		c->poll.data = c;
		c->next = s->conns;
		if (s->conns != NULL)
			s->conns->prevp = &c->next;
		c->prevp = &s->conns;
		s->conns = c;
		s->nconns++;
		uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_io);
	}
}

void
server_get_stats(const struct server *s, struct server_stats *out)
{
	*out = s->stats;
	out->clients = s->nconns;
	out->fds_in_flight = s->inflight_total;
	out->deferred_clients = s->ndeferred;
	out->fds_closing = closer_total(s->closer);
	out->closed_inline = closer_closed_inline(s->closer);
}

int
server_start(uv_loop_t *loop, struct registry *reg, int listen_fd,
	const struct server_options *opt, struct server **out)
{
	struct server *s = calloc(1, sizeof(*s));
	struct rlimit rl;
	int r;

	if (s == NULL)
		return error_set(-ENOMEM, "server: out of memory");
	s->loop = loop;
	s->reg = reg;
	s->listen_fd = listen_fd;
	/* A socket passed by systemd may be blocking; accept4 must not block.
	 * F_GETFL's failure is its own: -1 | O_NONBLOCK would set every flag. */
	if ((r = fcntl(listen_fd, F_GETFL)) == -1 ||
		fcntl(listen_fd, F_SETFL, r | O_NONBLOCK) == -1) {
		free(s);
		return error_set(-errno, "client socket: fcntl: %s", strerror(errno));
	}
	s->max_clients = opt && opt->max_clients ? opt->max_clients : DEFAULT_MAX_CLIENTS;
	s->max_clients_per_uid = opt && opt->max_clients_per_uid ? opt->max_clients_per_uid :
								   DEFAULT_MAX_CLIENTS_PER_UID;
	s->self_uid = geteuid();
	s->fd_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < INT_MAX ?
		(int)rl.rlim_cur : 0;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->max_attaches = opt && opt->max_attaches ? opt->max_attaches : DEFAULT_MAX_ATTACHES;
	s->derive = opt ? opt->derive : NULL;
	s->closer = opt ? opt->closer : NULL;
	s->unread_reply_ms = opt && opt->unread_reply_ms ? opt->unread_reply_ms :
							   DEFAULT_UNREAD_REPLY_MS;
	fd_budget_init(s);
	if ((r = uv_poll_init(loop, &s->listen_poll, listen_fd)) < 0) {
		if (s->spare_fd >= 0)
			close(s->spare_fd);
		free(s);
		return error_set(r, "client socket: %s", uv_strerror(r));
	}
	uv_timer_init(loop, &s->retry_timer);
	s->retry_timer.data = s;
	uv_timer_init(loop, &s->accept_timer);
	s->accept_timer.data = s;
	uv_timer_init(loop, &s->unread_timer);
	s->unread_timer.data = s;
	s->listen_poll.data = s;
	uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
	*out = s;
	return 0;
}

void
server_announce(struct server *s, const struct model_entry *m, uint64_t generation)
{
	const char *model = registry_model_name(m);
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n = wire_put_changed(buf, sizeof(buf), generation, model, strlen(model));

	if (n < 0 || s == NULL)
		return;
	for (struct conn *c = s->conns; c != NULL; c = c->next) {
		if (c->pending || c->closing)
			continue; /* best effort: the status page is authoritative */
		/* Only to a peer that has read everything so far: an unread
		 * CHANGED must not look like an unread reply (conn_confirm). */
		conn_confirm(c);
		if (c->inflight_fds > 0)
			continue;
		for (size_t i = 0; i < c->nrefs; i++)
			if (registry_generation_of(c->refs[i].gen) == m) {
				(void)fdp_send(c->fd, buf, (size_t)n, NULL, 0);
				break;
			}
	}
}

/* Close callback of the listener, then of the three timers: the last
 * frees s. */
static void
server_free(uv_handle_t *handle)
{
	struct server *s = handle->data;

	if (handle == (uv_handle_t *)&s->listen_poll) {
		s->timers_open = 3;
		uv_close((uv_handle_t *)&s->retry_timer, server_free);
		uv_close((uv_handle_t *)&s->accept_timer, server_free);
		uv_close((uv_handle_t *)&s->unread_timer, server_free);
		return;
	}
	if (--s->timers_open > 0)
		return;
	close(s->listen_fd);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	uidtally_free(&s->inflight_by_uid);
	free(s);
}

void
server_stop(struct server *s)
{
	if (s == NULL || s->stopping)
		return;
	s->stopping = 1;
	while (s->conns != NULL)
		conn_close(s->conns);
	uv_poll_stop(&s->listen_poll);
	uv_timer_stop(&s->accept_timer);
	uv_close((uv_handle_t *)&s->listen_poll, server_free);
}

int
server_listen_path(const char *path, mode_t mode)
{
	return listen_unix("client socket", path, SOCK_SEQPACKET, mode, (gid_t)-1);
}
