/*
 * server_requests.c: the client socket's requests (ATTACH, HOLD, RELEASE)
 * and their replies, on a connection that server.c owns (server_internal.h).
 * Each handler decodes its message with proto/wire.c's exact-size checks,
 * asks the registry (or, for HOLD, the warm restart), records the attach
 * reference on the connection and queues one reply; errors are ERROR
 * replies, fatal only for a malformed message.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/escape.h"
#include "closer.h"
#include "config.h"
#include "derive.h"
#include "log.h"
#include "proto/fdpass.h"
#include "proto/wire.h"
#include "restore.h"
#include "server_internal.h"

/* The longest a DERIVE waits for another worker's build, whatever its
 * wait_ms: the longest derive_timeout a builder may have (PROTOCOL.md). */
#define DERIVE_WAIT_MAX_MS (CONFIG_MAX_DERIVE_TIMEOUT * 1000u)

void
conn_error(struct conn *c, uint32_t seq, int code, int fatal, const char *fmt, ...)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	char text[WIRE_MAX_MESSAGE];
	va_list ap;
	ssize_t n;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	/* The wire carries positive errno values. */
	n = wire_put_error(buf, sizeof(buf), seq, -code, text);
	if (fatal) {
		char more[96];

		if (server_may_warn(c->srv, c->uid, more, sizeof(more)))
			log_warnx("client pid %d uid %u: %s; closing the connection%s", (int)c->pid,
				(unsigned)c->uid, text, more);
		/* No reply is pending (the connection was being read). */
		if (n > 0)
			(void)fdp_send(c->fd, buf, (size_t)n, NULL, 0);
		conn_close(c);
		return;
	}
	if (n < 0) {
		conn_close(c);
		return;
	}
	conn_send(c, buf, (size_t)n, NULL, 0);
}

/* registry_peer's may_warn: the server's limit of warnings per uid. */
static int
peer_may_warn(void *arg, uid_t uid, char *more, size_t size)
{
	return server_may_warn(arg, uid, more, size);
}

/* Who c's peer is, for the registry's access checks. */
static struct registry_peer
conn_peer(struct conn *c)
{
	return (struct registry_peer){
		.pid = c->pid, .uid = c->uid, .gid = c->gid, .groups = c->groups,
		.ngroups = (int)c->ngroups, .self_uid = c->srv->self_uid, .conn_id = c->id,
		.denied_logged = &c->denied_logged, .may_warn = peer_may_warn, .warn_arg = c->srv,
	};
}

/* Makes room for one more attach on c, or answers seq's request with
 * EMFILE (the limit) or ENOMEM and returns -1. */
static int
refs_room(struct conn *c, uint32_t seq)
{
	if (c->nrefs >= c->srv->max_attaches) {
		conn_error(c, seq, -EMFILE, 0, "more than %u attaches on one connection",
			c->srv->max_attaches);
		return -1;
	}
	if (c->nrefs == c->refs_cap) {
		size_t cap = c->refs_cap ? c->refs_cap * 2 : 8;
		struct attach_ref *r = realloc(c->refs, cap * sizeof(*r));

		if (r == NULL) {
			conn_error(c, seq, -ENOMEM, 0, "out of memory");
			return -1;
		}
		c->refs = r;
		c->refs_cap = cap;
	}
	return 0;
}

/* Copies the len-byte name at p, which a wire_get_* getter found in a
 * message, into buf (size bytes) with its terminating NUL; -1 when it does
 * not fit (the decoder keeps it within WIRE_MAX_NAME, which fits). */
static int
copy_name(char *buf, size_t size, const char *p, size_t len)
{
	if (len >= size)
		return -1;
	memcpy(buf, p, len);
	buf[len] = '\0';
	return 0;
}

/*
 * Replies to seq with the attachment at (a reference already taken): an
 * ATTACH_OK, or with token != 0 a BUILD (the source of a derived artifact
 * for its builder). what names it in the debug log.
 */
static void
send_attachment(struct conn *c, uint32_t seq, struct registry_attachment *at, uint64_t token,
	const char *what)
{
	struct server *s = c->srv;
	struct wire_attach_ok ok = { 0 };
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n;

	ok.generation = at->generation;
	ok.handle = ++s->next_handle;
	ok.index_size = at->index_size;
	ok.file_count = at->file_count;
	if (at->status_slot != 0) {
		ok.flags = WIRE_ATTACH_STATUS;
		ok.status_slot = at->status_slot;
	}
	n = token != 0 ? wire_put_build(buf, sizeof(buf), seq, &ok, token) :
			 wire_put_attach_ok(buf, sizeof(buf), seq, &ok);
	if (n < 0) {
		conn_release(c, at->gen);
		conn_error(c, seq, -EPROTO, 0, "cannot encode reply");
		return;
	}
	c->refs[c->nrefs++] = (struct attach_ref){ ok.handle, at->gen };
	log_debug("client pid %d: %s generation %" PRIu64 " (handle %" PRIu64 ")", (int)c->pid,
		what, at->generation, ok.handle);
	conn_send(c, buf, (size_t)n, at->fds, at->nfds);
}

void
request_attach(struct conn *c, const struct wire_message *msg)
{
	struct server *s = c->srv;
	struct registry_peer peer = conn_peer(c);
	struct registry_attachment at;
	char name[WIRE_MAX_NAME + 1], text[WIRE_MAX_MESSAGE], what[WIRE_MAX_NAME + 32];
	const char *p;
	size_t len;
	int err;

	if (wire_get_attach(msg, &p, &len) < 0 || copy_name(name, sizeof(name), p, len) < 0) {
		conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed ATTACH");
		return;
	}
	if (refs_room(c, msg->h.seq) < 0)
		return;
	if ((err = registry_attach(s->reg, name, &peer, &at, text, sizeof(text))) < 0) {
		conn_error(c, msg->h.seq, err, 0, "%s", text);
		return;
	}
	snprintf(what, sizeof(what), "attached \"%s\"", name);
	send_attachment(c, msg->h.seq, &at, 0, what);
}

/* The nanoseconds of a timespec, as wc_file_identity has them. */
static int64_t
time_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* Whether g's files are staged copies whose every origin is known: one per
 * file, each with its ctime (a generation restored from a store before
 * version 5 has none). */
static int
origins_known(const struct generation *g, uint32_t file_count)
{
	if (g->origin == NULL || g->norigin != file_count || file_count == 0)
		return 0;
	for (size_t i = 0; i < g->norigin; i++)
		if (g->origin[i].st.st_ctim.tv_sec == 0 && g->origin[i].st.st_ctim.tv_nsec == 0)
			return 0;
	return 1;
}

/*
 * ORIGINS (PROTOCOL.md): what the files of the model's current generation
 * that are staged copies were copied from (their fstat then), from file
 * first on, for a client that may attach it (registry_attach's checks,
 * but no attach: nothing is referenced, counted or warmed). A generation
 * that serves its files where they are has none (file_count 0). libwcache
 * sends it alone on a connection of its own: a wcached before it closes
 * the connection.
 */
void
request_origins(struct conn *c, const struct wire_message *msg)
{
	struct server *s = c->srv;
	struct registry_peer peer = conn_peer(c);
	struct model_entry *m = NULL;
	struct generation *g = NULL;
	struct wire_origins_ok ok = { 0 };
	char name[WIRE_MAX_NAME + 1], text[WIRE_MAX_MESSAGE];
	uint8_t buf[WIRE_MAX_MESSAGE];
	uint32_t first;
	const char *p;
	size_t len;
	ssize_t n;
	int err;

	if (wire_get_origins(msg, &first, &p, &len) < 0 ||
		copy_name(name, sizeof(name), p, len) < 0) {
		conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed ORIGINS");
		return;
	}
	/* A query: ATTACH's checks, but no reference (no warm-up, budget,
	 * eviction order or attach count). */
	if ((err = registry_find_for(s->reg, name, &peer, &m, text, sizeof(text))) < 0 ||
		(err = registry_servable(m, &g, text, sizeof(text))) < 0 || g == NULL) {
		conn_error(c, msg->h.seq, err < 0 ? err : -EIO, 0, "%s",
			err < 0 ? text : "no generation");
		return;
	}
	ok.generation = g->number;
	if (origins_known(g, (uint32_t)g->source.nfiles)) {
		ok.file_count = (uint32_t)g->source.nfiles;
		ok.first = first < ok.file_count ? first : 0;
		ok.n = wire_origins_in_reply(ok.file_count, ok.first);
		for (size_t i = 0; i < ok.n; i++) {
			const struct stat *st = &g->origin[ok.first + i].st;

			ok.origins[i] = (struct wire_origin){ .dev = (uint64_t)st->st_dev,
				.ino = (uint64_t)st->st_ino, .size = (uint64_t)st->st_size,
				.mtime_ns = time_ns(&st->st_mtim),
				.ctime_ns = time_ns(&st->st_ctim) };
		}
	}
	if (ok.file_count > 0 && ok.first != first) {
		conn_error(c, msg->h.seq, -ERANGE, 0, "file %" PRIu32 ": generation %" PRIu64
			" has %" PRIu32 " files", first, ok.generation, ok.file_count);
		return;
	}
	if ((n = wire_put_origins_ok(buf, sizeof(buf), msg->h.seq, &ok)) < 0) {
		conn_error(c, msg->h.seq, -EPROTO, 0, "cannot encode reply");
		return;
	}
	log_debug("client pid %d: origins of \"%s\" generation %" PRIu64 " from file %" PRIu32
		" (%zu)", (int)c->pid, name, ok.generation, ok.first, ok.n);
	conn_send(c, buf, (size_t)n, NULL, 0);
}

/* ---- derived artifacts (derive.h) ---- */

/* Attaches artifact a for c, which waited for it, and says what with what. */
static void
attach_artifact(struct conn *c, uint32_t seq, struct derived *a, const char *what)
{
	struct registry_attachment at;

	conn_wait_end(c);
	/* refs_room() was checked when it began to wait and it has attached
	 * nothing since; a failure here still answers it. */
	if (refs_room(c, seq) < 0)
		return;
	derive_attach(c->srv->derive, a, &at);
	send_attachment(c, seq, &at, 0, what);
}

/* derive.c's hooks: a waiting connection's answer. */
static void
derived_ready(void *conn, uint32_t seq, struct derived *a)
{
	attach_artifact(conn, seq, a, "attached a derived artifact of");
}

/* The builder's own, once its PUBLISH was checked. */
static void
derived_published(void *conn, uint32_t seq, struct derived *a)
{
	attach_artifact(conn, seq, a, "published and attached a derived artifact of");
}

static void
derived_build(void *conn, uint32_t seq, struct derive_build *b)
{
	struct conn *c = conn;
	struct registry_attachment at;

	conn_wait_end(c);
	/* refs_room() was checked when it began to wait and it has attached
	 * nothing since; a failure here still answers it. */
	if (refs_room(c, seq) < 0)
		return;
	derive_attach_source(c->srv->derive, b, &at);
	send_attachment(c, seq, &at, derive_token(b), "builds a derived artifact from");
}

static void
derived_fail(void *conn, uint32_t seq, int err, const char *text)
{
	struct conn *c = conn;

	conn_wait_end(c);
	conn_error(c, seq, err, 0, "%s", text);
}

const struct derive_hooks server_derive_hooks = {
	.ready = derived_ready,
	.published = derived_published,
	.build = derived_build,
	.fail = derived_fail,
};

void
request_derive(struct conn *c, const struct wire_message *msg)
{
	struct server *s = c->srv;
	struct registry_peer peer = conn_peer(c);
	struct registry_attachment at;
	struct wire_derive d;
	struct derived *a = NULL;
	struct derive_build *b = NULL;
	char text[WIRE_MAX_MESSAGE];
	int r;

	if (wire_get_derive(msg, &d) < 0) {
		conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed DERIVE");
		return;
	}
	if (s->derive == NULL) {
		conn_error(c, msg->h.seq, -ENOTSUP, 0, "derived artifacts are not served here");
		return;
	}
	if (refs_room(c, msg->h.seq) < 0)
		return;
	/* A waiting connection is not read: its wait ends within the longest
	 * derive_timeout, so that it is read again (PROTOCOL.md, DERIVE). */
	if (d.wait_ms > DERIVE_WAIT_MAX_MS)
		d.wait_ms = DERIVE_WAIT_MAX_MS;
	r = derive_request(s->derive, &d, &peer, c, msg->h.seq, &a, &b, text, sizeof(text));
	if (r < 0) {
		conn_error(c, msg->h.seq, r, 0, "%s", text);
	} else if (r == DERIVE_READY && a != NULL) {
		derive_attach(s->derive, a, &at);
		send_attachment(c, msg->h.seq, &at, 0, "attached a derived artifact of");
	} else if (r == DERIVE_BUILD && b != NULL) {
		derive_attach_source(s->derive, b, &at);
		send_attachment(c, msg->h.seq, &at, derive_token(b),
			"builds a derived artifact from");
	} else {
		/* DERIVE_WAIT: only a hang-up is of interest until derive.c answers. */
		conn_wait(c, WAIT_BUILD);
	}
}

void
request_publish(struct conn *c, const struct wire_message *msg, int fd)
{
	struct server *s = c->srv;
	char text[WIRE_MAX_MESSAGE];
	uint64_t token;
	int r;

	if (wire_get_publish(msg, &token) < 0 || s->derive == NULL) {
		closer_close(s->closer, c->uid, fd);
		if (s->derive == NULL)
			conn_error(c, msg->h.seq, -ENOTSUP, 0,
				"derived artifacts are not served here");
		else
			conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed PUBLISH");
		return;
	}
	if (refs_room(c, msg->h.seq) < 0) {
		closer_close(s->closer, c->uid, fd);
		return;
	}
	if ((r = derive_publish(s->derive, c, c->uid, &(struct derive_cred){ .gid = c->gid,
		     .groups = c->groups, .ngroups = (uint32_t)c->ngroups }, msg->h.seq, token,
		     fd, text, sizeof(text))) < 0) {
		conn_error(c, msg->h.seq, r, 0, "%s", text);
		return;
	}
	/* Checked on the work queue: derived_published() or derived_fail()
	 * answers it, even once its peer has shut its end for writing. */
	conn_wait(c, WAIT_CHECK);
}

void
request_abandon(struct conn *c, const struct wire_message *msg)
{
	struct server *s = c->srv;
	char reason[WIRE_MAX_REASON + 1], text[WIRE_MAX_MESSAGE];
	uint8_t buf[WIRE_HEADER_SIZE];
	const char *p;
	uint64_t token;
	size_t len;
	ssize_t n;
	int r;

	if (wire_get_abandon(msg, &token, &p, &len) < 0) {
		conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed ABANDON");
		return;
	}
	if (s->derive == NULL) {
		conn_error(c, msg->h.seq, -ENOTSUP, 0, "derived artifacts are not served here");
		return;
	}
	/* The reason goes into log lines and other clients' ERROR text, which
	 * PROTOCOL.md says is UTF-8: escaped as the log escapes (C0, DEL, C1,
	 * bidi controls and bytes that are not UTF-8 become \xNN or \uNNNN),
	 * cut between two pieces at WIRE_MAX_REASON bytes. Before, only C0 and
	 * DEL were replaced, and a builder's bidi overrides, C1 CSI and invalid
	 * UTF-8 reached other workers' terminals. */
	escape_string(reason, sizeof(reason), p, len);
	if ((r = derive_abandon(s->derive, c, token, reason, text, sizeof(text))) < 0) {
		conn_error(c, msg->h.seq, r, 0, "%s", text);
		return;
	}
	if ((n = wire_put_release_ok(buf, sizeof(buf), msg->h.seq)) >= 0)
		conn_send(c, buf, (size_t)n, NULL, 0);
}

/* HOLD: after a restart, a worker says it still maps a generation it
 * attached from the previous process (PROTOCOL.md, "Restarts"). */
void
request_hold(struct conn *c, const struct wire_message *msg)
{
	struct server *s = c->srv;
	struct registry_peer peer = conn_peer(c);
	uint8_t buf[WIRE_HEADER_SIZE + 8];
	char name[WIRE_MAX_NAME + 1], text[WIRE_MAX_MESSAGE];
	struct generation *g;
	const char *p;
	uint64_t number, handle;
	size_t len;
	ssize_t n;
	int err;

	if (wire_get_hold(msg, &number, &p, &len) < 0 ||
		copy_name(name, sizeof(name), p, len) < 0) {
		conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed HOLD");
		return;
	}
	if (refs_room(c, msg->h.seq) < 0)
		return;
	if ((err = restore_hold(s->reg, name, number, &peer, &g, text, sizeof(text))) < 0) {
		conn_error(c, msg->h.seq, err, 0, "%s", text);
		return;
	}
	handle = ++s->next_handle;
	if ((n = wire_put_hold_ok(buf, sizeof(buf), msg->h.seq, handle)) < 0) {
		conn_release(c, g);
		conn_error(c, msg->h.seq, -EPROTO, 0, "cannot encode reply");
		return;
	}
	c->refs[c->nrefs++] = (struct attach_ref){ handle, g };
	log_debug("client pid %d: holds \"%s\" generation %" PRIu64 " (handle %" PRIu64 ")",
		(int)c->pid, name, number, handle);
	conn_send(c, buf, (size_t)n, NULL, 0);
}

void
request_release(struct conn *c, const struct wire_message *msg)
{
	uint8_t buf[WIRE_HEADER_SIZE];
	uint64_t handle;
	ssize_t n;

	if (wire_get_release(msg, &handle) < 0) {
		conn_error(c, msg->h.seq, -EBADMSG, 1, "malformed RELEASE");
		return;
	}
	for (size_t i = 0; i < c->nrefs; i++) {
		if (c->refs[i].handle != handle)
			continue;
		struct generation *g = c->refs[i].gen;

		c->refs[i] = c->refs[--c->nrefs];
		conn_release(c, g);
		/* seq 0: the client wants no reply (PROTOCOL.md, RELEASE). */
		if (msg->h.seq != 0 && (n = wire_put_release_ok(buf, sizeof(buf), msg->h.seq)) >= 0)
			conn_send(c, buf, (size_t)n, NULL, 0);
		return;
	}
	if (msg->h.seq == 0) {
		log_debug("client pid %d: RELEASE of unknown handle %" PRIu64 " (no reply wanted)",
			(int)c->pid, handle);
		return;
	}
	conn_error(c, msg->h.seq, -EINVAL, 0, "no attach with handle %" PRIu64, handle);
}
