/*
 * attach.c: attaching models through wcached (wc_connect, wc_attach,
 * wc_disconnect) and telling it when they are released; the connection
 * and each request's round trip are request.c's.
 *
 * An attach is ATTACH with the model's name, answered by ATTACH_OK with
 * the sealed index memfd and one read-only descriptor per model file;
 * attach_reply.c checks and maps them (and for wc_attach_fds() keeps the
 * files' descriptors in the model). A release is one RELEASE with seq
 * 0, which the daemon does not answer: no round trip. A release never
 * waits for the client's lock, which a request holds for its whole round
 * trip: it unmaps the model and queues its record, and whoever holds the
 * lock sends the RELEASE when it gives it back (request_unlock()).
 *
 * Each attached model has an attach record here: the attach_model from
 * attach_reply.c (the model and what it shares with the client), its
 * client, connection, handle and the process that attached. The client
 * lists its records; the model's release hook (model.h) is the record's,
 * so wc_release() reaches this file without model.c knowing of clients.
 * A client is reference-counted: its owner's reference goes with
 * wc_disconnect(), and a release or a build on another thread holds one
 * of its own while it uses the client (attach_client_get).
 *
 * fork(): a child inherits its parent's clients with their locks as they
 * were, held by whichever parent thread was in a request; that thread is
 * not in the child, so a client of another process (c->pid, the process
 * that connected it) is never locked in the child. The child sends nothing
 * on it and reads nothing from it (the connection is the parent's); its
 * releases only unmap, and its list of records changes under clients_lock
 * instead (attach_release, wc_disconnect), which fork() never copies held;
 * nor does it take a parent's client's released_lock. Its wc_disconnect()
 * (or the last of them, if that comes first) closes its copy of the
 * connection only while that number is still the socket
 * (request_close_fds): after closefrom() it may be the child's own; and a
 * reconnect's new socket too, when fork() came during one.
 *
 * derive.c sends its requests (DERIVE, PUBLISH, ABANDON) through
 * request.c too, and keeps what it gets with attach_keep(). A record says
 * what kind of attach it is: a derived artifact is never named in a HOLD.
 *
 * Layering: model.c < attach_reply.c < request.c < attach.c < derive.c:
 * this file calls the first three, and none of them calls it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "proto/defaults.h"
#include "proto/fdpass.h"
#include "lib/attach.h"
#include "lib/attach_reply.h"
#include "lib/model.h"
#include "lib/request.h"
#include "proto/wire.h"

/* Guards each record's client pointer against wc_disconnect() and every
 * client's refs. Held only for a few loads and stores, never while
 * waiting: taken after a client's own lock where both are (wc_disconnect),
 * and no client's lock is ever taken under it. fork() waits for it to be
 * free (clients_atfork), so a child never inherits it held. */
static pthread_mutex_t clients_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t clients_atfork_once = PTHREAD_ONCE_INIT;

static void
clients_lock_take(void)
{
	pthread_mutex_lock(&clients_lock);
}

static void
clients_lock_give(void)
{
	pthread_mutex_unlock(&clients_lock);
}

static void
clients_atfork(void)
{
	(void)pthread_atfork(clients_lock_take, clients_lock_give, clients_lock_give);
}

const char *
wc_default_socket(void)
{
	const char *env = getenv(SOCKET_ENV);

	return env != NULL && env[0] != '\0' ? env : DEFAULT_SOCKET_PATH;
}

int
wc_connect(const char *socket_path, wc_client **out)
{
	return wc_connect_timeout(socket_path, -1, out);
}

int
wc_connect_timeout(const char *socket_path, int timeout_ms, wc_client **out)
{
	wc_client *c;
	int r;

	if (out == NULL)
		return error_set(-EINVAL, "wc_connect: no output");
	if (timeout_ms < 0 && (r = request_timeout_default(&timeout_ms)) < 0)
		return r;
	if (socket_path == NULL)
		socket_path = wc_default_socket();
	else if (*socket_path == '\0')
		socket_path = DEFAULT_SOCKET_PATH;
	if ((c = calloc(1, sizeof(*c))) == NULL || (c->path = strdup(socket_path)) == NULL ||
		asprintf(&c->where, "wcached at %s", socket_path) < 0) {
		if (c != NULL)
			free(c->path);
		free(c);
		return error_set(-ENOMEM, "wc_connect: out of memory");
	}
	c->pid = request_self_pid();
	c->timeout_ms = timeout_ms;
	c->refs = 1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->released_lock, NULL);
	pthread_once(&clients_atfork_once, clients_atfork);
	/* The connection last: until c is the caller's, a child forked by
	 * another thread closes its copy (request_connect). */
	if ((r = request_connect(c, timeout_ms)) < 0) {
		pthread_mutex_destroy(&c->lock);
		pthread_mutex_destroy(&c->released_lock);
		free(c->where);
		free(c->path);
		free(c);
		return r;
	}
	*out = c;
	return 0;
}

static void attach_release(wc_model *m, void *ctx);

void
attach_keep(wc_client *c, struct attach_record *a, enum attach_kind kind)
{
	a->kind = kind;
	a->pid = c->pid;
	a->client = c;
	a->connection = c->connection;
	a->next = c->records;
	if (c->records != NULL)
		c->records->prevp = &a->next;
	a->prevp = &c->records;
	c->records = a;
	a->am.model->release = attach_release;
	a->am.model->release_ctx = a;
}

/* ATTACH's encoder for request_call(): arg is the model's name. */
static ssize_t
put_attach(uint8_t *buf, size_t cap, uint32_t seq, int left_ms, const void *arg)
{
	(void)left_ms;
	return wire_put_attach(buf, cap, seq, arg, strlen(arg));
}

/* wc_attach() and wc_attach_fds(): req says whether the model keeps its
 * files' descriptors; fn names the call in messages. */
static int
attach_as(wc_client *c, const char *model, wc_model **out, enum attach_request req,
	const char *fn)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0, len;
	struct wire_message msg;
	struct attach_record *a;
	struct attach_grant grant;
	ssize_t n;
	int r, unusable;

	if (c == NULL || model == NULL || out == NULL)
		return error_set(-EINVAL, "%s: no client or model name", fn);
	if (c->pid != request_self_pid())
		return error_set(-ECHILD, "model \"%s\": this client was connected by process %d; "
			"call wc_connect() again after fork()", model, (int)c->pid);
	len = strlen(model);
	if (len == 0 || len > WIRE_MAX_NAME)
		return error_set(-EINVAL, "model \"%.64s\": name must be 1 to %u bytes", model,
			WIRE_MAX_NAME);
	/* The record first: once the daemon has answered, nothing may fail
	 * but the reply itself. */
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return error_set(-ENOMEM, "model \"%s\": out of memory", model);

	pthread_mutex_lock(&c->lock);
	n = request_call(c, put_attach, model, 0, buf, sizeof(buf), fds, &nfds, &msg);
	if (n < 0) {
		request_unlock(c);
		free(a);
		return (int)n;
	}
	r = attach_reply_grant(req, model, NULL, c->where, buf, (size_t)n, fds, nfds, &c->cache,
		&unusable, &a->am, &grant);
	if (unusable) /* a reply we cannot use: not wcached */
		request_close_because(c, "wcached's reply to ATTACH was malformed");
	if (r < 0) {
		/* The daemon attached what could not be mapped here: it would
		 * count that attach for as long as the connection stays. */
		if (grant.granted)
			request_send_release(c, grant.handle);
		request_unlock(c);
		free(a);
		return r;
	}
	attach_keep(c, a, ATTACH_KIND_GENERATION);
	request_unlock(c);
	*out = a->am.model;
	return 0;
}

/*
 * The origins of m's files (PROTOCOL.md, ORIGINS): asked of wcached once
 * per attach, on a connection of its own (a wcached that does not know
 * ORIGINS closes the connection it came on: none of this client's), and
 * kept in m's record; a client whose wcached refused is not asked again.
 */
int
wc_model_file_origin(wc_model *m, size_t file, wc_file_identity *out)
{
	struct attach_record *a;
	wc_file_identity *origins;
	wc_client *c;
	char *path;
	unsigned epoch;
	int ms, r;

	if (m == NULL || out == NULL)
		return error_set(-EINVAL, "wc_model_file_origin: no model or no identity");
	if (file >= wc_model_file_count(m))
		return error_set(-ERANGE, "%s: file %zu of %zu", m->name, file,
			wc_model_file_count(m));
	a = m->release == attach_release ? m->release_ctx : NULL;
	if (a == NULL || a->kind != ATTACH_KIND_GENERATION)
		return error_set(-ENOENT, "%s: not a model attached through wcached (no staged "
			"copies)", m->name);
	pthread_mutex_lock(&clients_lock);
	r = a->am.origins != NULL ? 0 : a->am.origins_none ? 1 : -1;
	if (r == 0)
		*out = a->am.origins[file];
	pthread_mutex_unlock(&clients_lock);
	if (r >= 0)
		goto known;
	if ((c = attach_client_get(a)) == NULL)
		return error_set(-ENOTCONN, "%s: its client was disconnected", m->name);
	epoch = __atomic_load_n(&c->origins_epoch, __ATOMIC_ACQUIRE);
	r = __atomic_load_n(&c->origins_refused, __ATOMIC_ACQUIRE) == epoch + 1 ? -ENOTSUP : 0;
	path = strdup(c->path);
	if (r == 0 && (r = request_timeout_default(&ms)) == 0 && path != NULL) {
		if ((origins = calloc(wc_model_file_count(m), sizeof(*origins))) == NULL)
			r = error_set(-ENOMEM, "%s: out of memory", m->name);
		else if ((r = request_origins(path, ms, m->name, m->generation,
			wc_model_file_count(m), origins)) >= 0) {
			pthread_mutex_lock(&clients_lock);
			if (a->am.origins == NULL && !a->am.origins_none) {
				a->am.origins_none = r == 1;
				a->am.origins = r == 0 ? origins : NULL;
				origins = r == 0 ? NULL : origins;
			}
			if (a->am.origins != NULL)
				*out = a->am.origins[file];
			r = a->am.origins != NULL ? 0 : 1;
			pthread_mutex_unlock(&clients_lock);
		} else if (r == -ENOTSUP) {
			/* Refused on the connection of that epoch: a reconnect
			 * meanwhile (to an upgraded wcached) is asked again. */
			__atomic_store_n(&c->origins_refused, epoch + 1, __ATOMIC_RELEASE);
		}
		free(origins);
	} else if (r == -ENOTSUP) {
		error_set(r, "wcached at %s does not say what its staged copies were copied from "
			"(it is older than this libwcache)", c->path);
	} else if (path == NULL) {
		r = error_set(-ENOMEM, "%s: out of memory", m->name);
	}
	free(path);
	attach_client_put(c);
	if (r < 0)
		return r;
known:
	if (r == 1)
		return error_set(-ENOENT, "%s: file %zu is not a staged copy (wcached serves it "
			"where it is)", m->name, file);
	return 0;
}

int
wc_attach(wc_client *c, const char *model, wc_model **out)
{
	return attach_as(c, model, out, ATTACH_REQUEST_ATTACH, "wc_attach");
}

int
wc_attach_fds(wc_client *c, const char *model, wc_model **out)
{
	return attach_as(c, model, out, ATTACH_REQUEST_ATTACH_FDS, "wc_attach_fds");
}

struct wc_client *
attach_client_get(const struct attach_record *a)
{
	wc_client *c;

	pthread_mutex_lock(&clients_lock);
	if ((c = a->client) != NULL)
		c->refs++;
	pthread_mutex_unlock(&clients_lock);
	return c;
}

void
attach_client_put(struct wc_client *c)
{
	unsigned left;

	if (c == NULL)
		return;
	pthread_mutex_lock(&clients_lock);
	left = --c->refs;
	pthread_mutex_unlock(&clients_lock);
	if (left > 0)
		return;
	/* A parent's client's locks may have been copied held by fork(). */
	if (c->pid == request_self_pid()) {
		pthread_mutex_destroy(&c->lock);
		pthread_mutex_destroy(&c->released_lock);
	}
	/* Released records are told by the last holder of the lock, which
	 * holds a reference meanwhile: none is left here, except a parent's
	 * copies in a child. */
	for (struct attach_record *a = c->released, *next; a != NULL; a = next) {
		next = a->released_next;
		attach_model_free(&a->am);
		free(a);
	}
	attach_cache_clear(&c->cache);
	request_close_fds(c);
	free(c->path);
	free(c->where);
	free(c);
}

/*
 * The release hook of an attached model (model.h), which wc_release()
 * calls: unmaps the model and drops its shared mappings at once, then
 * leaves the record for the thread that holds the client's lock to tell
 * the daemon (request_unlock()), which is this thread when the lock is
 * free: a release never waits for another thread's request, a DERIVE
 * waiting for another worker's build say (the daemon reads no request of
 * the connection before it has answered that one anyway). Unmapping
 * first means the daemon never acts on a release (an eviction of a cold
 * model, say) while this process still maps the pages.
 */
static void
attach_release(wc_model *m, void *ctx)
{
	struct attach_record *a = ctx;
	wc_client *c = attach_client_get(a);
	struct attach_status *status = a->am.status;
	int stale;

	if (c == NULL || c->pid != request_self_pid()) {
		/* Its client was disconnected, or is a parent's (see the top
		 * of this file), whose locks may be held for good: nothing is
		 * to be sent. */
		if (c != NULL) {
			pthread_mutex_lock(&clients_lock);
			if (a->client == c)
				request_unlink_record(a);
			pthread_mutex_unlock(&clients_lock);
		}
		attach_model_free(&a->am);
		free(a);
		attach_client_put(c);
		return;
	}
	stale = wc_model_stale(m);
	/* From here on a reconnect's HOLDs pass the record by. */
	pthread_mutex_lock(&c->released_lock);
	a->released = 1;
	pthread_mutex_unlock(&c->released_lock);
	model_free(m);
	attach_status_unref(status);
	pthread_mutex_lock(&c->released_lock);
	a->am.model = NULL;
	a->am.status = NULL;
	a->stale = stale;
	a->released_next = c->released;
	c->released = a;
	pthread_mutex_unlock(&c->released_lock);
	if (pthread_mutex_trylock(&c->lock) == 0)
		request_unlock(c);
	attach_client_put(c);
}

void
wc_disconnect(wc_client *c)
{
	int own;

	if (c == NULL)
		return;
	/* A request in progress on c finishes first; releases on other
	 * clients never wait for it (clients_lock is not held meanwhile).
	 * A client of the parent is not locked (see the top of this file). */
	own = c->pid == request_self_pid();
	if (own)
		pthread_mutex_lock(&c->lock);
	pthread_mutex_lock(&clients_lock);
	/* The models outlive the client: detach them all at once. */
	for (struct attach_record *a = c->records, *next; a != NULL; a = next) {
		next = a->next;
		a->client = NULL;
		a->next = NULL;
		a->prevp = NULL;
	}
	c->records = NULL;
	pthread_mutex_unlock(&clients_lock);
	/* A child closes its copies of the parent's connection now: a
	 * reference a parent's thread held when it forked (a
	 * wc_model_file_origin() waiting for ORIGINS, a release) is never
	 * given back here, and the last one would close them. */
	if (own)
		request_unlock(c);
	else
		request_close_fds(c);
	/* Freed now, or by the last release or build still using it. */
	attach_client_put(c);
}
