/*
 * derive.c: derived artifacts (wc_derive, wc_build_publish,
 * wc_build_publish_each, wc_build_publish_fd, wc_build_abandon; PROTOCOL.md,
 * "Derived artifacts").
 *
 * A worker asks wcached for a model transformed by a key. The reply is the
 * artifact (an attach like any other, of one file), or BUILD: this process
 * is the builder, holds an attach of the source generation and a token,
 * computes the artifact and sends it back as a memfd in PUBLISH (or gives
 * up with ABANDON), on the connection that got BUILD. Meanwhile the other
 * workers' DERIVEs wait in the daemon, each up to its wait_ms.
 *
 * A wc_build lives from BUILD to the end of the build, which is always
 * wc_build_publish(), wc_build_publish_each(), wc_build_publish_fd() or
 * wc_build_abandon(): each of them ends it (frees it and releases the
 * source) whatever happens. A
 * publication that fails here, before PUBLISH is sent (a tensor the writer
 * refuses, a descriptor that is not a memfd), abandons the build with the
 * reason, so that the waiters learn it at once rather than at the
 * daemon's derive_timeout. So is a BUILD whose source cannot be mapped
 * here, which the caller never sees as a build (undo_grant()): the
 * attach it made is released, as an artifact's that cannot be mapped.
 *
 * Layering: the top of libwcache's request path (model.c < attach_reply.c
 * < attach.c < derive.c): requests go through attach.h, replies through
 * attach_reply_grant(), the artifact's bytes through the writer.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "lib/attach.h"
#include "lib/attach_reply.h"
#include "lib/model.h"
#include "lib/request.h"
#include "lib/writer.h"
#include "proto/fdpass.h"
#include "proto/wire.h"

/* How long a DERIVE's receive waits beyond the client's deadline: the
 * daemon answers ETIMEDOUT itself when wait_ms (the deadline) passes, and
 * its answer names the builder. */
#define DERIVE_GRACE_MS 2000

/* The seals that, set without the others, make a memfd unpublishable: the
 * daemon must be able to add F_SEAL_WRITE, F_SEAL_SHRINK and F_SEAL_GROW. */
#define PUBLISH_NEEDED_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

struct wc_build {
	struct attach_record *source; /* the source's attach, held by the build */
	uint64_t connection;          /* the client's connection that got BUILD */
	uint64_t token;
	char *name;                   /* as the caller asked, for messages */
	char *key;
};

/* DERIVE's fields for its encoder: wait_ms is what is left of the
 * deadline when it is sent, or "forever" without one. */
struct derive_request {
	const char *name;
	const char *key;
};

static ssize_t
put_derive(uint8_t *buf, size_t cap, uint32_t seq, int left_ms, const void *arg)
{
	const struct derive_request *q = arg;
	struct wire_derive d = {
		.wait_ms = left_ms > 0 ? (uint32_t)left_ms : UINT32_MAX,
		.key = q->key, .key_len = strlen(q->key),
		.name = q->name, .name_len = strlen(q->name),
	};

	return wire_put_derive(buf, cap, seq, &d);
}

/* Frees a build that never began (no source yet) or whose source is gone. */
static void
build_free(wc_build *b)
{
	if (b == NULL)
		return;
	free(b->name);
	free(b->key);
	free(b);
}

/* Ends b: releases the source (which tells the daemon when still
 * connected) and frees b. The client's lock is not held. */
static void
build_end(wc_build *b)
{
	wc_release(b->source->am.model);
	build_free(b);
}

/* Sends ABANDON of the build token of name and key, and reads its answer;
 * the lock is held. Failures only set the message: the build ends anyway. */
static int
abandon_send(wc_client *c, uint64_t token, const char *name, const char *key,
	const char *reason)
{
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0;
	struct wire_message msg;
	int32_t code;
	const char *text;
	size_t tlen;
	uint32_t seq = request_next_seq(c);
	ssize_t n = wire_put_abandon(req, sizeof(req), seq, token, reason);

	if (n < 0)
		return error_set((int)n, "model \"%s\", key \"%s\": cannot encode ABANDON", name,
			key);
	n = request_exchange(c, req, (size_t)n, seq, -1, buf, sizeof(buf), fds, &nfds, &msg);
	if (n < 0)
		return (int)n;
	if (nfds == 0 && msg.h.type == WIRE_RELEASE_OK && msg.h.length == 0)
		return 0;
	if (nfds == 0 && msg.h.type == WIRE_ERROR &&
		wire_get_error(&msg, &code, &text, &tlen) == 0)
		return error_set(-code, "model \"%s\", key \"%s\": abandoning the build: %.*s (%s)",
			name, key, (int)tlen, text, c->where);
	fdp_close_all(fds, nfds);
	request_close_because(c, "wcached's reply to ABANDON was not one (out of step)");
	return error_set(-EBADMSG, "model \"%s\", key \"%s\": unexpected reply to ABANDON from "
		"%s", name, key, c->where);
}

/*
 * Undoes what a reply granted when no model could be made of it (a
 * mapping that failed here: attach_reply.h, struct attach_grant), on the
 * connection it came over, which stays: a BUILD is abandoned first, with
 * the failure (wc_errmsg()'s message) in the reason, so that the
 * workers waiting for the key learn it now rather than at the daemon's
 * derive_timeout; then the attach is released, which the daemon would
 * otherwise count until the connection closes. The failure's message
 * stays wc_errmsg()'s. The lock is held.
 */
static void
undo_grant(wc_client *c, const struct attach_grant *grant, const char *name, const char *key)
{
	char why[ERROR_MAX];

	snprintf(why, sizeof(why), "%s", error_get());
	if (grant->build) {
		char reason[WIRE_MAX_REASON + 1];

		/* Cut at the wire's limit, as any reason. */
		if (snprintf(reason, sizeof(reason), "the builder could not map the source: %s",
			why) < 0)
			reason[0] = '\0';
		(void)abandon_send(c, grant->token, name, key, reason);
	}
	request_send_release(c, grant->handle);
	error_format("%s", why);
}

int
wc_derive(wc_client *c, const char *model, const char *key, wc_model **out, wc_build **build)
{
	struct derive_request q = { model, key };
	uint8_t buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0, len;
	struct wire_message msg;
	struct attach_record *a;
	struct attach_grant grant = { 0 };
	wc_build *b;
	ssize_t n;
	int r, unusable;

	if (c == NULL || model == NULL || key == NULL || out == NULL || build == NULL)
		return error_set(-EINVAL, "wc_derive: no client, model name, key or output");
	len = strlen(model);
	if (len == 0 || len > WIRE_MAX_NAME)
		return error_set(-EINVAL, "model \"%.64s\": name must be 1 to %u bytes", model,
			WIRE_MAX_NAME);
	if (!wire_key_valid(key, strlen(key)))
		return error_set(-EINVAL, "model \"%s\", key \"%.80s\": a key is 1 to %u letters, "
			"digits or \"._+-\"", model, key, WIRE_MAX_KEY);
	if (c->pid != request_self_pid())
		return error_set(-ECHILD, "model \"%s\", key \"%s\": this client was connected by "
			"process %d; call wc_connect() again after fork()", model, key,
			(int)c->pid);
	/* Everything the reply may need, first: once the daemon has answered,
	 * nothing may fail but the reply itself. */
	a = calloc(1, sizeof(*a));
	b = calloc(1, sizeof(*b));
	if (a == NULL || b == NULL || (b->name = strdup(model)) == NULL ||
		(b->key = strdup(key)) == NULL) {
		free(a);
		build_free(b);
		return error_set(-ENOMEM, "model \"%s\", key \"%s\": out of memory", model, key);
	}

	pthread_mutex_lock(&c->lock);
	n = request_call(c, put_derive, &q, DERIVE_GRACE_MS, buf, sizeof(buf), fds, &nfds, &msg);
	r = n < 0 ? (int)n : attach_reply_grant(ATTACH_REQUEST_DERIVE, model, key, c->where, buf,
		(size_t)n, fds, nfds, &c->cache, &unusable, &a->am, &grant);
	if (n >= 0 && unusable) /* a reply we cannot use: not wcached */
		request_close_because(c, "wcached's reply to DERIVE was malformed");
	if (r < 0) {
		if (grant.granted)
			undo_grant(c, &grant, model, key);
		request_unlock(c);
		free(a);
		build_free(b);
		return r;
	}
	if (r == 0) {
		attach_keep(c, a, ATTACH_KIND_DERIVED);
		request_unlock(c);
		build_free(b);
		*out = a->am.model;
		return 0;
	}
	/* BUILD: the source is an attach of its generation like any other. */
	attach_keep(c, a, ATTACH_KIND_GENERATION);
	b->source = a;
	b->connection = c->connection;
	b->token = grant.token;
	request_unlock(c);
	*build = b;
	return 1;
}

const wc_model *
wc_build_source(const wc_build *b)
{
	return b == NULL ? NULL : b->source->am.model;
}

/*
 * The client a build may still send on, returned with its lock held and a
 * reference (build_client_done() gives both back): the one that got BUILD,
 * on that same connection, in that process. NULL with the message set (and
 * *err its negative errno) otherwise: the build is lost, or belongs to
 * another process; nothing is held then.
 */
static wc_client *
build_client(const wc_build *b, const char *doing, int *err)
{
	wc_client *c = attach_client_get(b->source);
	const char *why;

	/* In a child after fork(), the client is its parent's: not locked,
	 * whose lock fork() may have copied held (attach.c). */
	if (c != NULL && (c->pid != request_self_pid() || b->source->pid != c->pid)) {
		attach_client_put(c);
		*err = error_set(-ECHILD, "model \"%s\", key \"%s\": cannot %s: the build belongs "
			"to process %d", b->name, b->key, doing, (int)b->source->pid);
		return NULL;
	}
	if (c != NULL) {
		pthread_mutex_lock(&c->lock);
		if (b->source->client != c) { /* disconnected since */
			request_unlock(c);
			attach_client_put(c);
			c = NULL;
		}
	}
	if (c == NULL) {
		*err = error_set(-ENOTCONN, "model \"%s\", key \"%s\": cannot %s: the client "
			"was disconnected, which ended the build", b->name, b->key, doing);
		return NULL;
	}
	/* Closed here (a release not sent in time, a request that timed
	 * out, a reply that could not be trusted): wcached ended the build
	 * when it read the connection's end, and is not to blame. */
	if ((why = request_closed_why(c, b->connection)) != NULL) {
		*err = error_set(-ECONNRESET, "model \"%s\", key \"%s\": cannot %s: libwcache "
			"closed the connection to %s that got the build because %s, which ended "
			"the build", b->name, b->key, doing, c->where, why);
		request_unlock(c);
		attach_client_put(c);
		return NULL;
	}
	if (c->connection != b->connection) {
		request_unlock(c);
		attach_client_put(c);
		*err = error_set(-ECONNRESET, "model \"%s\", key \"%s\": cannot %s: the "
			"connection that got the build has closed (did wcached restart?), which "
			"ended the build", b->name, b->key, doing);
		return NULL;
	}
	return c;
}

/* Gives back what build_client() returned: the lock, then the reference. */
static void
build_client_done(wc_client *c)
{
	request_unlock(c);
	attach_client_put(c);
}

void
wc_build_abandon(wc_build *b, const char *reason)
{
	wc_client *c;
	int err = 0;

	if (b == NULL)
		return;
	if ((c = build_client(b, "abandon the build", &err)) != NULL) {
		(void)abandon_send(c, b->token, b->name, b->key, reason != NULL ? reason : "");
		build_client_done(c);
	}
	build_end(b);
}

/* Abandons b with the message of the failure r as the reason, and returns
 * r with that message still wc_errmsg()'s. */
static int
abandon_after(wc_build *b, int r)
{
	char why[WIRE_MAX_REASON + 1];

	snprintf(why, sizeof(why), "%s", error_get());
	wc_build_abandon(b, why);
	return error_set(r, "%s", why);
}

/* Checks fd is a memfd the daemon can seal, before it is sent. */
static int
check_publishable(const wc_build *b, int fd)
{
	int seals = fd < 0 ? -1 : fcntl(fd, F_GET_SEALS);

	if (seals == -1)
		return error_set(-EINVAL, "model \"%s\", key \"%s\": descriptor %d is not a memfd "
			"(memfd_create with MFD_ALLOW_SEALING)", b->name, b->key, fd);
	if ((seals & F_SEAL_SEAL) && (seals & PUBLISH_NEEDED_SEALS) != PUBLISH_NEEDED_SEALS)
		return error_set(-EINVAL, "model \"%s\", key \"%s\": the memfd cannot be sealed "
			"against writes (made without MFD_ALLOW_SEALING, or sealed with "
			"F_SEAL_SEAL before F_SEAL_WRITE)", b->name, b->key);
	return 0;
}

int
wc_build_publish_fd(wc_build *b, int memfd, wc_model **out)
{
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0;
	struct wire_message msg;
	struct attach_record *a;
	struct attach_grant grant = { 0 };
	wc_client *c = NULL;
	uint32_t seq;
	ssize_t n;
	int r, unusable = 0;

	if (b == NULL)
		return error_set(-EINVAL, "wc_build_publish_fd: no build");
	if (out == NULL)
		return abandon_after(b, error_set(-EINVAL, "model \"%s\", key \"%s\": "
			"wc_build_publish_fd: no output", b->name, b->key));
	if ((r = check_publishable(b, memfd)) < 0)
		return abandon_after(b, r);
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return abandon_after(b, error_set(-ENOMEM, "model \"%s\", key \"%s\": out of "
			"memory", b->name, b->key));
	if ((c = build_client(b, "publish", &r)) == NULL) {
		free(a);
		build_end(b); /* nothing to tell: the build is already lost */
		return r;
	}
	seq = request_next_seq(c);
	if ((n = wire_put_publish(req, sizeof(req), seq, b->token)) >= 0)
		n = request_exchange(c, req, (size_t)n, seq, memfd, buf, sizeof(buf), fds, &nfds,
			&msg);
	r = n < 0 ? (int)n : attach_reply_grant(ATTACH_REQUEST_PUBLISH, b->name, b->key,
		c->where, buf, (size_t)n, fds, nfds, &c->cache, &unusable, &a->am, &grant);
	if (n >= 0 && unusable)
		request_close_because(c, "wcached's reply to PUBLISH was malformed");
	if (r < 0 && grant.granted)
		undo_grant(c, &grant, b->name, b->key);
	if (r == 0)
		attach_keep(c, a, ATTACH_KIND_DERIVED);
	build_client_done(c);
	build_end(b);
	if (r < 0) {
		free(a);
		return r;
	}
	*out = a->am.model;
	return 0;
}

int
wc_build_publish(wc_build *b, const wc_tensor *tensors, size_t n, const char *const *metadata,
	size_t nmeta, wc_model **out)
{
	if (b == NULL)
		return error_set(-EINVAL, "wc_build_publish: no build");
	return wc_build_publish_each(b, tensors, n, metadata, nmeta, NULL, NULL, out);
}

int
wc_build_publish_each(wc_build *b, const wc_tensor *tensors, size_t n,
	const char *const *metadata, size_t nmeta, wc_written_fn *written, void *arg,
	wc_model **out)
{
	char what[WIRE_MAX_NAME + WIRE_MAX_KEY + 48];
	int fd, r;

	if (b == NULL)
		return error_set(-EINVAL, "wc_build_publish_each: no build");
	snprintf(what, sizeof(what), "model \"%s\", key \"%s\": artifact", b->name, b->key);
	if ((fd = memfd_create("wcache-artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0)
		return abandon_after(b, error_set(-errno, "%s: memfd_create: %s", what,
			strerror(errno)));
	if ((r = writer_safetensors_fd_each(tensors, n, metadata, nmeta, fd, what, written,
		arg)) < 0) {
		close(fd);
		return abandon_after(b, r);
	}
	r = wc_build_publish_fd(b, fd, out);
	close(fd);
	return r;
}
