/*
 * control.c: the control socket (see control.h for the protocol).
 *
 * Each connection is a libuv pipe: the control protocol is a plain byte
 * stream and passes no descriptors, so libuv's stream code (reads, queued
 * writes, shutdown) does the work. The listening socket is watched with a
 * uv_poll_t and accepted here, not with uv_listen(): libuv's own accept
 * loop tries again at once, without returning to the loop, while accept(2)
 * fails (ENOMEM, ENOBUFS; EMFILE once its spare descriptor is gone), which
 * spun at 100% CPU with a line per try and never handled SIGTERM. Here a
 * failed accept pauses the listener for CTL_ACCEPT_PAUSE_MS, as the client
 * socket's does (server.c), with one warning; each pause is counted
 * (wcached_control_accept_pauses_total). A connection
 * reads into a fixed buffer of one maximal line and handles one request at
 * a time: while a request waits for the registry (load, reload), the
 * connection is not read, so the lines behind it keep their order and a
 * client cannot make the daemon buffer without bound. Replies are queued
 * with uv_write; a client that does not read its replies stops being read
 * once CONTROL_MAX_QUEUED bytes wait for it.
 *
 * Lifetimes. A connection is freed in its close callback; libuv runs the
 * callbacks of its pending writes and shutdown first (with UV_ECANCELED), so
 * they may still use it. A request the registry completes later is a small
 * struct of its own that points back to the connection; the connection
 * clears that pointer when it closes, so a reply whose client has gone is
 * dropped, never written to freed memory. The registry guarantees one call
 * of the done callback, which frees the request. After a reply to such a
 * request, the next buffered line is handled from an idle callback rather
 * than inside the registry's callback, so no command runs nested inside
 * another's completion.
 *
 * A client that hangs up while its request is in flight (wcachectl killed by
 * a timeout) is not seen by a read, since the connection is not read then:
 * the sweep, and each new connection before the limits are counted, poll
 * such connections and close those whose client has closed its socket (the
 * request goes on, its reply is dropped; lines it sent after the request
 * are dropped too, as the failed write of that reply always did). A client
 * that only half-closed (shutdown(SHUT_WR)) still waits for its reply.
 *
 * This file is the transport: the socket, the connections, line framing,
 * the peer's credentials and the replies. What each command does is in
 * control_cmd.c, which gets every request line from ctl_handle_line(); the
 * two share control_internal.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"
#include "control_internal.h"
#include "listen.h"
#include "base/error.h"
#include "base/json.h"
#include "lograte.h"
#include "log.h"
#include "peercred.h"

#define CONTROL_MAX_QUEUED (4u << 20)           /* reply bytes waiting for a client */

/* A reply on its way to the client: the buffer is freed when written. */
struct write_req {
	uv_write_t req;
	char *buf;
};

static void conn_process(struct ctl_conn *c);

/* ---- lifetimes ---------------------------------------------------------- */

/* Close callback of the listener and the timers: the control is freed
 * when its last handle has closed. */
static void
control_handle_closed(uv_handle_t *h)
{
	struct control *ctl = h->data;

	if (--ctl->handles == 0)
		free(ctl);
}

/* Close callback of a connection: the only place it is freed. */
static void
conn_free(uv_handle_t *h)
{
	struct ctl_conn *c = h->data;

	free(c);
}

/* Closes the connection now: pending writes are cancelled, a request in
 * flight loses its way back. */
void
ctl_conn_close(struct ctl_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	if (c->req != NULL) {
		c->req->conn = NULL;
		c->req = NULL;
	}
	*c->prevp = c->next;
	if (c->next != NULL)
		c->next->prevp = c->prevp;
	c->ctl->nconns--;
	uv_close((uv_handle_t *)&c->pipe, conn_free);
}

/* The queued replies are written (or cancelled): close. */
static void
on_shutdown(uv_shutdown_t *req, int status)
{
	ctl_conn_close(req->data);
}

/* Closes the connection once every queued reply is written. */
static void
conn_end(struct ctl_conn *c)
{
	if (c->ending || c->closing)
		return;
	c->ending = true;
	if (c->reading) {
		uv_read_stop((uv_stream_t *)&c->pipe);
		c->reading = false;
	}
	c->shutdown.data = c;
	if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->pipe, on_shutdown) < 0)
		ctl_conn_close(c);
}

/* ---- replies ------------------------------------------------------------ */

/* A reply was written, failed or was cancelled: frees it, and resumes
 * reading a connection that was throttled by its queued replies. */
static void
on_written(uv_write_t *req, int status)
{
	struct write_req *w = (struct write_req *)req;
	struct ctl_conn *c = req->data;

	free(w->buf);
	free(w);
	if (c->closing)
		return;
	if (status < 0) {
		log_debug("control: uid %u pid %d: write: %s", (unsigned)c->uid, (int)c->pid,
			uv_strerror(status));
		ctl_conn_close(c);
		return;
	}
	/* A throttled connection reads again once its replies drain. */
	if (!c->ending && c->req == NULL)
		conn_process(c);
}

/* Queues buf (len bytes, malloc'd, a whole line) for the client; takes
 * ownership of buf. */
static void
conn_send(struct ctl_conn *c, char *buf, size_t len)
{
	struct write_req *w;
	uv_buf_t b;
	int r;

	if (c->closing || c->ending || (w = malloc(sizeof(*w))) == NULL) {
		free(buf);
		if (!c->closing && !c->ending)
			ctl_conn_close(c);
		return;
	}
	w->buf = buf;
	w->req.data = c;
	b = uv_buf_init(buf, (unsigned)len);
	if ((r = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, on_written)) < 0) {
		log_debug("control: uid %u pid %d: write: %s", (unsigned)c->uid, (int)c->pid,
			uv_strerror(r));
		free(buf);
		free(w);
		ctl_conn_close(c);
	}
}

/* Starts a reply: {"ok":true or {"ok":false. NULL when out of memory. */
FILE *
ctl_reply_begin(struct ctl_reply *r, bool ok)
{
	r->buf = NULL;
	r->len = 0;
	if ((r->f = open_memstream(&r->buf, &r->len)) == NULL)
		return NULL;
	fputs(ok ? "{\"ok\":true" : "{\"ok\":false", r->f);
	fprintf(r->f, ",\"protocol\":%d", CONTROL_PROTOCOL_VERSION);
	return r->f;
}

/* Closes the object, ends the line and sends it. */
void
ctl_reply_end(struct ctl_conn *c, struct ctl_reply *r)
{
	static const char oom[] = "{\"ok\":false,\"error\":\"wcached is out of memory\"}\n";
	int bad;

	fputs("}\n", r->f);
	bad = ferror(r->f);
	if (fclose(r->f) != 0 || bad || r->buf == NULL) {
		free(r->buf);
		r->buf = strdup(oom);
		r->len = sizeof(oom) - 1;
		if (r->buf == NULL) {
			ctl_conn_close(c);
			return;
		}
	}
	conn_send(c, r->buf, r->len);
}

/* Sends {"ok":OK,"KEY":TEXT}, an error (key "error") or a message. */
static void
reply_text(struct ctl_conn *c, bool ok, const char *key, const char *text)
{
	struct ctl_reply r;

	if (ctl_reply_begin(&r, ok) == NULL) {
		ctl_conn_close(c);
		return;
	}
	fprintf(r.f, ",\"%s\":", key);
	json_write_string(r.f, text, strlen(text));
	ctl_reply_end(c, &r);
}

/* Sends {"ok":false,"error":MESSAGE}. */
void
ctl_conn_error(struct ctl_conn *c, const char *fmt, ...)
{
	char text[8192]; /* room for a maximal path and its reason */
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	reply_text(c, false, "error", text);
}

/* Sends {"ok":true,"message":MESSAGE}. */
void
ctl_conn_ok(struct ctl_conn *c, const char *message)
{
	reply_text(c, true, "message", message);
}

/* ---- request lines ------------------------------------------------------ */

int
control_split(char *line, size_t len, char **words, int max, char *err, size_t errlen)
{
	const unsigned char *u = (const unsigned char *)line;
	char *p = line, *end = line + len;
	int n = 0;

	for (size_t i = 0; i < len;) {
		size_t k;

		if ((u[i] < 0x20 && u[i] != '\t') || u[i] == 0x7f) {
			snprintf(err, errlen, "control character 0x%02x at byte %zu", u[i], i);
			return -EINVAL;
		}
		if ((k = json_utf8_seq(u + i, u + len)) == 0) {
			snprintf(err, errlen, "not UTF-8 text (byte %zu)", i);
			return -EINVAL;
		}
		i += k;
	}
	line[len] = '\0';
	for (;;) {
		char *start, *out;

		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		if (p == end)
			return n;
		if (n == max) {
			snprintf(err, errlen, "more than %d words", max);
			return -EINVAL;
		}
		start = out = p;
		if (*p == '"') {
			for (p++;; p++) {
				if (p == end) {
					snprintf(err, errlen, "unterminated quote at byte %zu",
						(size_t)(start - line));
					return -EINVAL;
				}
				if (*p == '"')
					break;
				if (*p == '\\') {
					if (p + 1 == end || (p[1] != '"' && p[1] != '\\')) {
						snprintf(err, errlen, "bad escape at byte %zu "
							"(only \\\" and \\\\ may follow a "
							"backslash)", (size_t)(p - line));
						return -EINVAL;
					}
					p++;
				}
				*out++ = *p;
			}
			p++; /* the closing quote */
			if (p < end && *p != ' ' && *p != '\t') {
				snprintf(err, errlen, "no space after the quoted word at byte %zu",
					(size_t)(start - line));
				return -EINVAL;
			}
		} else {
			while (p < end && *p != ' ' && *p != '\t') {
				if (*p == '"' || *p == '\\') {
					snprintf(err, errlen, "'%c' inside a word at byte %zu: "
						"quote the word (\"...\", with \\\" and \\\\)",
						*p, (size_t)(p - line));
					return -EINVAL;
				}
				p++;
			}
			out = p;
		}
		if (p < end)
			p++;
		*out = '\0';
		words[n++] = start; /* a quoted word's text was copied over its quote */
	}
}

/* ---- reading ------------------------------------------------------------ */

/* libuv reads into the rest of the connection's line buffer. */
static void
on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct ctl_conn *c = h->data;

	buf->base = c->buf + c->len;
	buf->len = CONTROL_READ_CAP - c->len;
}

/* Bytes, EOF or an error from the client; complete lines are handled by
 * conn_process(). */
static void
on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct ctl_conn *c = s->data;

	if (nread == UV_EOF) {
		c->eof = true;
		uv_read_stop(s);
		c->reading = false;
	} else if (nread < 0) {
		log_debug("control: uid %u pid %d: read: %s", (unsigned)c->uid, (int)c->pid,
			uv_strerror((int)nread));
		ctl_conn_close(c);
		return;
	} else {
		c->len += (size_t)nread;
	}
	conn_process(c);
}

/*
 * Handles the complete lines in the buffer one at a time, until one starts
 * an asynchronous request, the client is slow to read its replies, or the
 * buffer holds no complete line; then reads again, or ends the connection
 * after EOF or an overlong line.
 */
static void
conn_process(struct ctl_conn *c)
{
	char line[CONTROL_READ_CAP + 1];
	bool throttled = false;

	while (!c->closing && !c->ending && c->req == NULL) {
		char *nl = memchr(c->buf, '\n', c->len);
		size_t n, used;

		if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CONTROL_MAX_QUEUED) {
			throttled = true;
			break;
		}
		if (nl != NULL)
			n = (size_t)(nl - c->buf), used = n + 1;
		else if (c->eof && c->len > 0)
			n = used = c->len; /* the last line may end at EOF */
		else
			break;
		memcpy(line, c->buf, n);
		memmove(c->buf, c->buf + used, c->len - used);
		c->len -= used;
		c->active_ms = uv_now(c->ctl->loop);
		ctl_handle_line(c, line, n);
	}
	if (c->closing || c->ending)
		return;
	if (c->req == NULL && c->len == CONTROL_READ_CAP && memchr(c->buf, '\n', c->len) == NULL) {
		log_warnx("control: uid %u pid %d: request longer than %d bytes; closing",
			(unsigned)c->uid, (int)c->pid, CONTROL_LINE_MAX);
		ctl_conn_error(c, "request longer than %d bytes", CONTROL_LINE_MAX);
		conn_end(c);
		return;
	}
	if (c->eof && c->len == 0 && c->req == NULL) {
		conn_end(c);
		return;
	}
	if (c->req == NULL && !throttled && !c->eof) {
		if (!c->reading && uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
			c->reading = true;
	} else if (c->reading) {
		uv_read_stop((uv_stream_t *)&c->pipe);
		c->reading = false;
	}
}

/* Runs once per loop iteration while connections wait to be resumed after
 * an asynchronous request. */
static void
on_idle(uv_idle_t *idle)
{
	struct control *ctl = idle->data;
	struct ctl_conn *next;

	uv_idle_stop(idle);
	for (struct ctl_conn *c = ctl->conns; c != NULL; c = next) {
		next = c->next;
		if (c->resume) {
			c->resume = false;
			conn_process(c); /* may close c, never another connection */
		}
	}
}

/* After the reply to a request the registry completed: handles c's next
 * buffered line from the idle callback, not nested in the registry's
 * callback (see the top of this file). Does nothing once c is closing. */
void
ctl_conn_resume(struct ctl_conn *c)
{
	if (c->closing)
		return;
	c->resume = true;
	c->active_ms = uv_now(c->ctl->loop);
	uv_idle_start(&c->ctl->idle, on_idle);
}

/* ---- limits ------------------------------------------------------------- */

/*
 * Whether the client of c, a connection with a request in flight (and so
 * not read), has gone (peer_departed). A client that only half-closed
 * still waits for its reply.
 */
static bool
conn_departed(const struct ctl_conn *c)
{
	uv_os_fd_t fd = -1;

	if (uv_fileno((const uv_handle_t *)&c->pipe, &fd) < 0)
		return false;
	return peer_departed(fd);
}

/*
 * Closes each connection whose client has gone while its request is in
 * flight: the request goes on and its reply is dropped (ctl_conn_close
 * detaches it), and the connection no longer holds one of its uid's
 * places. Without this a uid whose clients were killed waiting for slow
 * loads was locked out, status included, until the loads ended.
 */
static void
close_departed(struct control *ctl)
{
	struct ctl_conn *next;

	for (struct ctl_conn *c = ctl->conns; c != NULL; c = next) {
		next = c->next;
		if (c->closing || c->req == NULL || !conn_departed(c))
			continue;
		log_info("control: uid %u pid %d left before the reply to its %s; the %s goes "
			 "on, its reply is dropped", (unsigned)c->uid, (int)c->pid, c->req->command,
			c->req->command);
		ctl_conn_close(c);
	}
}

/*
 * Once a second: closes the connections whose client has gone while their
 * request is in flight; and a connection with no request in flight that
 * has been silent, or has left its replies unread, for
 * CONTROL_IDLE_TIMEOUT_MS is closed (with an error line when it can still
 * take one), so connections that never finish a line cannot lock operators
 * out.
 */
static void
on_sweep(uv_timer_t *t)
{
	struct control *ctl = t->data;
	uint64_t now = uv_now(ctl->loop);
	struct ctl_conn *next;

	close_departed(ctl);
	for (struct ctl_conn *c = ctl->conns; c != NULL; c = next) {
		next = c->next;
		if (c->closing || c->req != NULL || now - c->active_ms < CONTROL_IDLE_TIMEOUT_MS)
			continue;
		ctl->timeouts++;
		log_warnx("control: uid %u pid %d: no complete request (or replies unread) for "
			  "%d s; closing", (unsigned)c->uid, (int)c->pid,
			CONTROL_IDLE_TIMEOUT_MS / 1000);
		if (c->ending || uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > 0) {
			ctl_conn_close(c);
			continue;
		}
		ctl_conn_error(c, "closed: no complete request within %d s",
			CONTROL_IDLE_TIMEOUT_MS / 1000);
		conn_end(c);
	}
}

/* Connections of uid, and the one of them (or of anyone, for uid -1) idle
 * the longest with nothing in flight, for evicting. */
static unsigned
conns_of(struct control *ctl, uid_t uid, const struct ctl_conn *except,
	struct ctl_conn **idlest)
{
	unsigned n = 0;

	*idlest = NULL;
	for (struct ctl_conn *c = ctl->conns; c != NULL; c = c->next) {
		if (c == except || c->closing || c->ending ||
			(uid != (uid_t)-1 && c->uid != uid))
			continue;
		n++;
		/* <=: the list is newest first, so on a tie the oldest wins. */
		if (c->req == NULL && (*idlest == NULL || c->active_ms <= (*idlest)->active_ms))
			*idlest = c;
	}
	return n;
}

/*
 * Keeps the connections of uid (of everyone, for uid -1) under max when c
 * joins them: the one idle the longest with no request in flight is closed
 * to make room, so that connections that never finish a line cannot lock
 * an operator out; only when all are busy (ctl_request_room keeps one
 * idle) is c refused. Returns whether c may go on.
 */
static bool
make_room(struct control *ctl, struct ctl_conn *c, uid_t uid, unsigned max)
{
	struct ctl_conn *idlest;

	if (conns_of(ctl, uid, c, &idlest) < max)
		return true;
	/* ctl_request_room keeps one of them without a request in flight, so
	 * this is a last resort. */
	if (idlest == NULL) {
		ctl->refused++;
		log_warnx("control: refused uid %u pid %d: %u control connections%s busy",
			(unsigned)c->uid, (int)c->pid, max, uid != (uid_t)-1 ? " of that uid" : "");
		ctl_conn_error(c, "too many control connections%s (%u), all busy",
			uid != (uid_t)-1 ? " from this uid" : "", max);
		conn_end(c);
		return false;
	}
	ctl->evicted++;
	log_warnx("control: %u control connections%s open: closing the one of uid %u pid %d, "
		  "idle the longest", max, uid != (uid_t)-1 ? " of one uid" : "",
		(unsigned)idlest->uid, (int)idlest->pid);
	ctl_conn_error(idlest, "closed: too many control connections%s and this one was idle",
		uid != (uid_t)-1 ? " from this uid" : "");
	conn_end(idlest);
	return true;
}

/* Requests in flight on the connections of uid (of everyone, for uid -1)
 * whose client is still there, c's aside. */
static unsigned
requests_of(struct control *ctl, uid_t uid, const struct ctl_conn *except)
{
	unsigned n = 0;

	for (struct ctl_conn *c = ctl->conns; c != NULL; c = c->next)
		if (c != except && !c->closing && c->req != NULL &&
			(uid == (uid_t)-1 || c->uid == uid) && !conn_departed(c))
			n++;
	return n;
}

/* Whether an asynchronous request may start on c (control_internal.h). It
 * counts, and closes nothing: the connections whose client has gone are
 * left for the sweep, so the idle callback that may have called it closes
 * no connection but its own. */
bool
ctl_request_room(struct ctl_conn *c, const char *command)
{
	struct control *ctl = c->ctl;
	unsigned mine = requests_of(ctl, c->uid, c), all = requests_of(ctl, (uid_t)-1, c);
	bool uid_full = mine >= CONTROL_MAX_PER_UID - 1;

	if (!uid_full && all < CONTROL_MAX_CONNECTIONS - 1)
		return true;
	ctl->refused++;
	log_warnx("control: uid %u pid %d: %s refused: %u requests in flight%s", (unsigned)c->uid,
		(int)c->pid, command, uid_full ? mine : all, uid_full ? " of that uid" : "");
	ctl_conn_error(c, "%s: too many requests in flight%s (at most %u, so that status always "
			  "gets in); try again when one has finished", command,
		uid_full ? " from this uid" : "",
		uid_full ? CONTROL_MAX_PER_UID - 1 : CONTROL_MAX_CONNECTIONS - 1);
	return false;
}

/* Connections served, for status and metrics (control_internal.h). */
unsigned
ctl_clients(const struct control *ctl)
{
	unsigned n = 0;

	for (const struct ctl_conn *c = ctl->conns; c != NULL; c = c->next)
		if (!c->closing && !c->ending)
			n++;
	return n;
}

/* ---- accepting ---------------------------------------------------------- */

/* Reads the peer's credentials (peercred.h: every supplementary group);
 * returns whether it may control wcached. */
static bool
may_control(struct ctl_conn *c, const struct control_context *ctx)
{
	struct peer_cred cred;
	bool ok;
	int fd;

	if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0)
		return false;
	if (peer_read(fd, &cred) < 0) {
		log_warnx("control: %s", error_get());
		return false;
	}
	c->pid = cred.pid;
	c->uid = cred.uid;
	ok = cred.uid == 0 || cred.uid == ctx->daemon_uid ||
		(ctx->has_group && peer_in_group(&cred, ctx->group));
	peer_cred_free(&cred);
	return ok;
}

/* Refuses c, whose uid may not control wcached: an error reply, then
 * closed; counted, and logged at most once a minute per uid. */
static void
refuse_permission(struct control *ctl, struct ctl_conn *c)
{
	const char *group = ctl->ctx->has_group ? " and members of control_group" : "";
	char more[96];

	ctl->refused++;
	/* At most once a minute per uid: a loop of refused connections cannot
	 * flood the log (the metric counts every one). */
	if (lograte_check(&ctl->refusals, c->uid, uv_now(ctl->loop), 1, more, sizeof(more),
		"refusals"))
		log_warnx("control: refused uid %d pid %d: only root, uid %u%s may control "
			  "wcached%s", (int)c->uid, (int)c->pid, (unsigned)ctl->ctx->daemon_uid,
			group, more);
	ctl_conn_error(c, "permission denied: uid %d may not control wcached (root, uid %u%s may)",
		(int)c->uid, (unsigned)ctl->ctx->daemon_uid, group);
	conn_end(c);
}

/* A client connected (fd, accepted): checks who it is and how many are
 * connected, then reads its requests. */
static void
take_connection(struct control *ctl, int fd)
{
	struct ctl_conn *c;
	int r;

	if ((c = calloc(1, sizeof(*c))) == NULL) {
		log_warnx("control: out of memory; dropping a connection");
		close(fd);
		return;
	}
	c->ctl = ctl;
	c->uid = (uid_t)-1;
	c->pid = -1;
	uv_pipe_init(ctl->loop, &c->pipe, 0);
	c->pipe.data = c;
	c->next = ctl->conns;
	if (ctl->conns != NULL)
		ctl->conns->prevp = &c->next;
	c->prevp = &ctl->conns;
	ctl->conns = c;
	ctl->nconns++;
	if ((r = uv_pipe_open(&c->pipe, fd)) < 0) {
		/* Not taken: the descriptor is still ours. */
		log_warnx("control: accept: %s", uv_strerror(r));
		close(fd);
		ctl_conn_close(c);
		return;
	}
	if (!may_control(c, ctl->ctx)) {
		refuse_permission(ctl, c);
		return;
	}
	c->active_ms = uv_now(ctl->loop);
	/* Connections whose client has gone hold no place: count without them. */
	close_departed(ctl);
	/* The uid's limit first. A connection it closes to make room is one
	 * of everyone's too, and no more than CONTROL_MAX_CONNECTIONS are
	 * ever admitted, so the second check then finds room: nobody is pushed
	 * out for a newcomer that is refused after all. */
	if (!make_room(ctl, c, c->uid, CONTROL_MAX_PER_UID) ||
		!make_room(ctl, c, (uid_t)-1, CONTROL_MAX_CONNECTIONS))
		return;
	conn_process(c);
}

static void on_listener(uv_poll_t *p, int status, int events);

/* The pause after a failed accept is over: watch the listener again. */
static void
on_accept_resume(uv_timer_t *t)
{
	struct control *ctl = t->data;

	if (!ctl->stopping)
		(void)uv_poll_start(&ctl->listener, UV_READABLE, on_listener);
}

/* accept(2) failed with err for another reason than an empty backlog: the
 * connections wait in the backlog while the listener is not watched for
 * CTL_ACCEPT_PAUSE_MS; one warning until an accept works again. */
static void
accept_pause(struct control *ctl, int err)
{
	bool fds = err == EMFILE || err == ENFILE;

	if (!ctl->accept_paused)
		log_warnx("control: accept: %s: connections wait in the backlog; trying again "
			  "every %d ms%s", strerror(err), CTL_ACCEPT_PAUSE_MS,
			fds ? " (out of descriptors: raise LimitNOFILE=)" : "");
	ctl->accept_paused = true;
	ctl->accept_pauses++;
	uv_poll_stop(&ctl->listener);
	uv_timer_start(&ctl->resume, on_accept_resume, CTL_ACCEPT_PAUSE_MS, 0);
}

/* The listener is readable: takes the connections waiting, a few per
 * wakeup (the loop comes back for the rest). */
static void
on_listener(uv_poll_t *p, int status, int events)
{
	struct control *ctl = p->data;
	int fd;

	(void)events;
	if (status < 0) {
		accept_pause(ctl, -status);
		return;
	}
	for (int i = 0; i < CTL_ACCEPTS_PER_WAKEUP && !ctl->stopping; i++) {
		if ((fd = accept4(ctl->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				accept_pause(ctl, errno);
			return;
		}
		if (ctl->accept_paused) {
			log_info("control: accepting connections again");
			ctl->accept_paused = false;
		}
		take_connection(ctl, fd);
	}
}

/* ---- the public functions ------------------------------------------------ */

int
control_listen_path(const char *path, mode_t mode, gid_t group)
{
	return listen_unix("control socket", path, SOCK_STREAM, mode, group);
}

/* " PATH" for the path listen_fd is bound to, or "" (unnamed, abstract):
 * what control_start's errors name after "control socket". */
static void
bound_name(int listen_fd, char *buf, size_t size)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);

	buf[0] = '\0';
	memset(&sa, 0, sizeof(sa));
	if (getsockname(listen_fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_family == AF_UNIX &&
		len > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] != '\0')
		snprintf(buf, size, " %.*s", (int)(len - offsetof(struct sockaddr_un, sun_path)),
			sa.sun_path);
}

int
control_start(uv_loop_t *loop, int listen_fd, struct control_context *ctx,
	struct control **out)
{
	struct control *ctl;
	char name[sizeof(((struct sockaddr_un *)0)->sun_path) + 2];
	int type = 0, listening = 0, r;
	socklen_t len = sizeof(type);

	bound_name(listen_fd, name, sizeof(name));

	if (getsockopt(listen_fd, SOL_SOCKET, SO_TYPE, &type, &len) == -1) {
		r = -errno;
		close(listen_fd);
		return error_set(r, "control socket%s: %s", name, strerror(-r));
	}
	len = sizeof(listening);
	if (type == SOCK_STREAM &&
		getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == -1) {
		r = -errno;
		close(listen_fd);
		return error_set(r, "control socket%s: %s", name, strerror(-r));
	}
	if (type != SOCK_STREAM || !listening) {
		close(listen_fd);
		return error_set(-EPROTOTYPE, "control socket%s: not a listening stream socket",
			name);
	}
	if ((ctl = calloc(1, sizeof(*ctl))) == NULL) {
		close(listen_fd);
		return error_set(-ENOMEM, "control socket%s: out of memory", name);
	}
	ctl->loop = loop;
	ctl->ctx = ctx;
	ctl->listen_fd = listen_fd;
	ctl->started_ms = ctx->started_ms != 0 ? ctx->started_ms : uv_now(loop);
	uv_idle_init(loop, &ctl->idle);
	uv_timer_init(loop, &ctl->sweep);
	uv_timer_init(loop, &ctl->resume);
	ctl->listener.data = ctl->idle.data = ctl->sweep.data = ctl->resume.data = ctl;
	ctl->handles = 3;
	/* uv_poll_init makes it non-blocking, as accept4 needs. */
	if ((r = uv_poll_init(loop, &ctl->listener, listen_fd)) < 0 ||
		(ctl->handles++, r = uv_poll_start(&ctl->listener, UV_READABLE, on_listener)) < 0) {
		ctl->stopping = true;
		if (ctl->handles == 4)
			uv_close((uv_handle_t *)&ctl->listener, control_handle_closed);
		uv_close((uv_handle_t *)&ctl->idle, control_handle_closed);
		uv_close((uv_handle_t *)&ctl->sweep, control_handle_closed);
		uv_close((uv_handle_t *)&ctl->resume, control_handle_closed);
		close(listen_fd);
		return error_set(r, "control socket%s: %s", name, uv_strerror(r));
	}
	uv_timer_start(&ctl->sweep, on_sweep, 1000, 1000);
	*out = ctl;
	return 0;
}

void
control_stop(struct control *ctl)
{
	if (ctl == NULL || ctl->stopping)
		return;
	ctl->stopping = true;
	while (ctl->conns != NULL)
		ctl_conn_close(ctl->conns);
	uv_close((uv_handle_t *)&ctl->listener, control_handle_closed);
	close(ctl->listen_fd); /* the poll handle watches it no longer */
	ctl->listen_fd = -1;
	uv_close((uv_handle_t *)&ctl->idle, control_handle_closed);
	uv_close((uv_handle_t *)&ctl->sweep, control_handle_closed);
	uv_close((uv_handle_t *)&ctl->resume, control_handle_closed);
}
