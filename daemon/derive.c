/*
 * derive.c: derived artifacts, single flight (derive.h): the table of
 * artifacts and builds, requests, waits and their deadlines. A PUBLISH is
 * checked and served by derive_publish.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "derive.h"
#include "derive_internal.h"
#include "format/source.h"
#include "generation.h"
#include "log.h"


uint64_t
derive_now_ms(const struct derive_table *t)
{
	return registry_now_ms(t->r);
}

uint64_t
derive_weight(const struct generation *g)
{
	return g->bytes + g->index_size;
}

void
derive_count(struct derive_table *t, uint64_t bytes, int add)
{
	if (add) {
		t->r->derived_bytes += bytes;
		__atomic_add_fetch(&t->charged, bytes, __ATOMIC_RELAXED);
	} else {
		t->r->derived_bytes -= bytes;
		__atomic_sub_fetch(&t->charged, bytes, __ATOMIC_RELAXED);
	}
}

/* The model entry an artifact or build was made for, if still there. */
struct model_entry *
derive_entry_of(struct derive_table *t, const char *name, uint64_t entry_id)
{
	struct model_entry *m = registry_find(t->r, name);

	return m != NULL && m->entry_id == entry_id ? m : NULL;
}

/* A fresh token: random bits and a counter, never 0. */
static uint64_t
new_token(struct derive_table *t)
{
	uint64_t v = 0;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
		v = 0;
	return ((v << 20) ^ ++t->next_token) | 1;
}

/*
 * Names b's builder for the texts a waiter gets: "pid P", or, once it went
 * away after its PUBLISH, "pid P (which has disconnected)". b->builder is
 * NULL only then: derive_conn_gone() clears it while b->check runs (the
 * check goes on without it); anywhere else a new builder takes it at once,
 * or the build ends.
 */
static const char *
builder_named(const struct derive_build *b, char *buf, size_t size)
{
	snprintf(buf, size, "pid %d%s", (int)b->builder_pid,
		b->builder == NULL ? " (which has disconnected)" : "");
	return buf;
}

int
derive_may_log(struct derive_table *t, uid_t uid, char *more, size_t size)
{
	return lograte_check(&t->lines, uid, derive_now_ms(t), DERIVE_LOG_BURST, more, size,
		"lines about derived artifacts");
}

/* ---- deadlines ---- */

static void on_timer(uv_timer_t *timer);

/* Arms the timer for the earliest deadline of a builder or a waiter. */
void
derive_rearm(struct derive_table *t)
{
	uint64_t next = UINT64_MAX, now = derive_now_ms(t);

	if (t->closed)
		return;
	for (struct derive_build *b = t->builds; b != NULL; b = b->next) {
		if (b->builder != NULL && b->check == NULL && b->deadline_ms < next)
			next = b->deadline_ms;
		for (struct derive_waiter *w = b->waiters; w != NULL; w = w->next)
			if (w->deadline_ms < next)
				next = w->deadline_ms;
	}
	if (next == UINT64_MAX) {
		uv_timer_stop(&t->timer);
		return;
	}
	uv_timer_start(&t->timer, on_timer, next > now ? next - now : 0, 0);
}

/* ---- builds ---- */

void
derive_unlink_build(struct derive_table *t, struct derive_build *b)
{
	for (struct derive_build **pp = &t->builds; *pp != NULL; pp = &(*pp)->next)
		if (*pp == b) {
			*pp = b->next;
			return;
		}
}

/* Frees b (already unlinked, no waiters left) and its source reference. */
void
derive_build_free(struct derive_table *t, struct derive_build *b)
{
	derive_check_cancel(b->check); /* its result is dropped when it ends */
	b->check = NULL;
	registry_release(t->r, b->src, REGISTRY_NO_UID);
	derive_cred_clear(&b->builder_cred);
	free(b->model_name);
	free(b);
}

/* *dst (whose groups it frees) becomes gid and a copy of groups (n of
 * them): 0, or -ENOMEM with *dst untouched. */
static int
cred_set(struct derive_cred *dst, gid_t gid, const gid_t *from, uint32_t n)
{
	gid_t *groups = NULL;

	if (n > 0) {
		if ((groups = malloc(n * sizeof(*groups))) == NULL)
			return -ENOMEM;
		memcpy(groups, from, n * sizeof(*groups));
	}
	free(dst->groups);
	*dst = (struct derive_cred){ .gid = gid, .groups = groups, .ngroups = n };
	return 0;
}

int
derive_cred_copy(struct derive_cred *dst, const struct derive_cred *from)
{
	return cred_set(dst, from->gid, from->groups, from->ngroups);
}

int
derive_builder_may(struct derive_table *t, const struct derive_build *b, char *why,
	size_t why_size)
{
	const struct model_entry *m = derive_entry_of(t, b->model_name, b->entry_id);
	struct registry_peer peer = { .pid = b->builder_pid, .uid = b->builder_uid,
		.gid = b->builder_cred.gid, .groups = b->builder_cred.groups,
		.ngroups = (int)b->builder_cred.ngroups, .self_uid = geteuid() };

	/* Groups unknown (never seen: a PUBLISH copies them), derive_groups
	 * cannot be judged; derive = no still can (review rev193 F6). */
	if (m == NULL || (m->derive && (b->builder_cred.gid == (gid_t)-1 ||
				  registry_may_build(m, &peer))))
		return 1;
	snprintf(why, why_size, "uid %u (gid %u, %u supplementary groups) may no longer build "
		 "it: %s since a configuration reload", (unsigned)b->builder_uid,
		(unsigned)b->builder_cred.gid, (unsigned)b->builder_cred.ngroups,
		m->derive ? "none of its groups is in derive_groups" : "derive = no");
	return 0;
}

void
derive_cred_clear(struct derive_cred *c)
{
	free(c->groups);
	*c = (struct derive_cred){ .gid = (gid_t)-1 };
}

/* The build ends for good: every waiter gets err with text. */
void
derive_build_fail(struct derive_table *t, struct derive_build *b, int err, const char *text)
{
	struct derive_waiter *w = b->waiters, *next;
	char more[128];

	derive_unlink_build(t, b);
	b->waiters = NULL;
	t->stats.failures++;
	if (derive_may_log(t, b->builder_uid, more, sizeof(more)))
		log_warnx("%s%s", text, more);
	for (; w != NULL; w = next) {
		next = w->next;
		t->hooks.fail(w->conn, w->seq, err, text);
		free(w);
	}
	derive_build_free(t, b);
	derive_rearm(t);
}

/* Whether uid has lost b before (derive_builder_lost). */
static int
lost_before(const struct derive_build *b, uid_t uid)
{
	for (unsigned i = 0; i < b->nlost; i++)
		if (b->lost_uids[i] == uid)
			return 1;
	return 0;
}

/*
 * Whether w may take b over now: its right as its DERIVE (or the last
 * reload that changed derive_groups) judged it, and as the model's derive
 * and derive_groups judge it now (registry_may_build). Before, only the
 * first: after a reload to derive = no, a waiter was handed the BUILD of a
 * model whose derive was off, built for nothing and had its PUBLISH
 * refused, one waiting uid after another (review rev190 D1). In a
 * reload's walk (reload: derive_drop_unallowed, derive staying on) by the
 * first alone: the model has its old derive_groups until the walk is done,
 * and a reload that swapped them gave a waiter allowed by the new ones
 * only EHOSTDOWN (review rev193 F2).
 */
static int
waiter_may_build(struct derive_table *t, const struct derive_build *b,
	const struct derive_waiter *w, int reload)
{
	const struct model_entry *m = derive_entry_of(t, b->model_name, b->entry_id);
	struct registry_peer peer = { .pid = w->pid, .uid = w->uid, .gid = w->gid,
		.groups = w->groups, .ngroups = (int)w->ngroups, .self_uid = geteuid() };

	return w->may_build && m != NULL && (reload || registry_may_build(m, &peer));
}

/*
 * The waiter of b that takes over its build, unlinked, or NULL: the oldest
 * that may build (waiter_may_build) of a uid that has not lost b; failing
 * that, the oldest that may build, but only when every waiter is of a uid
 * that lost b (it makes only itself wait). *skipped: whether one that may
 * build was passed over (for the waiters' text). Otherwise one builder uid
 * with several connections waiting held a key hostage: each of its waiters
 * took over in turn and stalled for derive_timeout, and other users' waits
 * never ended (rev173 F8); now they wait at most one derive_timeout per
 * build.
 */
static struct derive_waiter *
next_builder(struct derive_table *t, struct derive_build *b, int reload, int *skipped)
{
	struct derive_waiter **pp, **first = NULL, **fresh = NULL;
	int others = 0;

	for (pp = &b->waiters; *pp != NULL; pp = &(*pp)->next) {
		int lost = lost_before(b, (*pp)->uid);

		others |= !lost;
		if (!waiter_may_build(t, b, *pp, reload))
			continue;
		if (first == NULL)
			first = pp;
		if (!lost && fresh == NULL)
			fresh = pp;
	}
	if (fresh == NULL && !others)
		fresh = first;
	*skipped = first != NULL;
	if (fresh == NULL)
		return NULL;
	{
		struct derive_waiter *w = *fresh;

		*fresh = w->next;
		return w;
	}
}

/* Whether a waiter of b of a uid that has not lost it may build it. */
static int
fresh_builder_waits(struct derive_table *t, const struct derive_build *b)
{
	for (const struct derive_waiter *w = b->waiters; w != NULL; w = w->next)
		if (waiter_may_build(t, b, w, 0) && !lost_before(b, w->uid))
			return 1;
	return 0;
}

/* Keeps b's builder uid as one that abandoned b's key and generation, for
 * b's derive_timeout (derive.h: struct derive_abandoned). */
static void
remember_abandoner(struct derive_table *t, const struct derive_build *b)
{
	struct derive_abandoned *slot = NULL, *own_newest = NULL, *others_first = NULL;
	uint64_t now = derive_now_ms(t);
	unsigned own = 0;

	for (unsigned i = 0; i < DERIVE_ABANDONED && slot == NULL; i++) {
		struct derive_abandoned *x = &t->abandoned[i];

		if (x->until_ms <= now || (x->entry_id == b->entry_id && x->source == b->source &&
			x->uid == b->builder_uid && strcmp(x->key, b->key) == 0))
			slot = x;
		else if (x->uid == b->builder_uid) {
			own++;
			if (own_newest == NULL || x->until_ms > own_newest->until_ms)
				own_newest = x;
		} else if (others_first == NULL || x->until_ms < others_first->until_ms) {
			others_first = x;
		}
	}
	if (slot == NULL)
		slot = own >= DERIVE_ABANDONED_PER_UID || others_first == NULL ? own_newest :
			others_first;
	slot->entry_id = b->entry_id;
	slot->source = b->source;
	slot->uid = b->builder_uid;
	slot->until_ms = now + b->timeout_ms;
	memcpy(slot->key, b->key, sizeof(slot->key));
}

/* A new build b counts those who abandoned its key and generation lately
 * as having lost it (next_builder). */
static void
seed_lost(struct derive_table *t, struct derive_build *b)
{
	uint64_t now = derive_now_ms(t);

	for (unsigned i = 0; i < DERIVE_ABANDONED && b->nlost < DERIVE_LOST_UIDS; i++) {
		const struct derive_abandoned *x = &t->abandoned[i];

		if (x->until_ms > now && x->entry_id == b->entry_id && x->source == b->source &&
			strcmp(x->key, b->key) == 0 && !lost_before(b, x->uid))
			b->lost_uids[b->nlost++] = x->uid;
	}
}

/* derive_builder_lost, or (reload 1) in a reload's walk
 * (waiter_may_build). */
static void
builder_lost(struct derive_table *t, struct derive_build *b, const char *why, int reload)
{
	struct derive_waiter *w;
	char text[WIRE_MAX_MESSAGE], more[128];
	int skipped = 0;

	t->stats.builders_lost++;
	b->builder = NULL;
	if (!lost_before(b, b->builder_uid) && b->nlost < DERIVE_LOST_UIDS)
		b->lost_uids[b->nlost++] = b->builder_uid;
	if ((w = next_builder(t, b, reload, &skipped)) == NULL) {
		const struct model_entry *m = derive_entry_of(t, b->model_name, b->entry_id);

		/* One line in the log: derive_build_fail's, which says why. */
		snprintf(text, sizeof(text),
			"model \"%s\": derived \"%s\" of generation %" PRIu64 ": the builder "
			"(pid %d uid %u) %s, and no waiting worker may build it (%s)",
			b->model_name, b->key, b->source, (int)b->builder_pid,
			(unsigned)b->builder_uid, why, skipped ? "those that may are of users "
			"that lost this build already, while other users wait" : m == NULL ?
			"the model is no longer served" : m->derive ? "derive_groups" :
			"derive = no");
		derive_build_fail(t, b, -EHOSTDOWN, text);
		return;
	}
	if (derive_may_log(t, b->builder_uid, more, sizeof(more)))
		log_warnx("model \"%s\": derived \"%s\" of generation %" PRIu64 ": the builder "
			  "(pid %d uid %u) %s%s", b->model_name, b->key, b->source,
			(int)b->builder_pid, (unsigned)b->builder_uid, why, more);
	b->builder = w->conn;
	b->builder_pid = w->pid;
	b->builder_uid = w->uid;
	/* Its groups, for a reload's check: not known when out of memory
	 * (its PUBLISH then takes them). */
	if (cred_set(&b->builder_cred, w->gid, w->groups, w->ngroups) < 0)
		derive_cred_clear(&b->builder_cred);
	b->token = new_token(t);
	b->started_ms = derive_now_ms(t);
	b->deadline_ms = b->started_ms + b->timeout_ms;
	t->stats.builds++;
	if (derive_may_log(t, w->uid, more, sizeof(more)))
		log_info("model \"%s\": derived \"%s\" of generation %" PRIu64 ": pid %d builds it "
			 "now%s", b->model_name, b->key, b->source, (int)w->pid, more);
	t->hooks.build(w->conn, w->seq, b);
	free(w);
	derive_rearm(t);
}

/* The builder went away (why), or its publication was refused after it
 * had gone: the next builder takes over (next_builder), else the build
 * fails for every waiter (EHOSTDOWN, why in the text). */
void
derive_builder_lost(struct derive_table *t, struct derive_build *b, const char *why)
{
	builder_lost(t, b, why, 0);
}

/*
 * Ends one wait or build whose deadline passed (now); 1 when it did, 0
 * when none is due. A hook it calls may close connections, and a closing
 * connection changes the table (derive_conn_gone): the caller starts over
 * after each one rather than keep a pointer into the lists.
 */
static int
expire_one(struct derive_table *t, uint64_t now)
{
	char text[WIRE_MAX_MESSAGE], who[64];

	for (struct derive_build *b = t->builds; b != NULL; b = b->next) {
		for (struct derive_waiter **pp = &b->waiters; *pp != NULL; pp = &(*pp)->next) {
			struct derive_waiter *w = *pp;

			if (w->deadline_ms > now)
				continue;
			*pp = w->next;
			/* Built, its publication perhaps checked still: the
			 * builder may have gone meanwhile. */
			if (b->check != NULL)
				snprintf(text, sizeof(text),
					"model \"%s\": derived \"%s\" of generation %" PRIu64
					": its publication by %s was still being checked after "
					"the wait the client asked for", b->model_name, b->key,
					b->source, builder_named(b, who, sizeof(who)));
			else
				snprintf(text, sizeof(text),
					"model \"%s\": derived \"%s\" of generation %" PRIu64
					": still being built by %s after the wait the client "
					"asked for", b->model_name, b->key, b->source,
					builder_named(b, who, sizeof(who)));
			t->hooks.fail(w->conn, w->seq, -ETIMEDOUT, text);
			free(w);
			return 1;
		}
		if (b->builder != NULL && b->check == NULL && b->deadline_ms <= now) {
			struct derive_ended *e = &t->ended[t->next_ended++ % DERIVE_ENDED_TOKENS];
			char why[96];

			/* Its builder is told at its PUBLISH or ABANDON. */
			e->token = b->token;
			e->timeout_s = b->timeout_ms / 1000;
			e->why[0] = '\0';
			snprintf(e->what, sizeof(e->what),
				"model \"%s\": derived \"%s\" of generation %" PRIu64,
				b->model_name, b->key, b->source);
			snprintf(why, sizeof(why),
				"did not publish within derive_timeout (%" PRIu64 " s)",
				b->timeout_ms / 1000);
			derive_builder_lost(t, b, why);
			return 1;
		}
	}
	return 0;
}

static void
on_timer(uv_timer_t *timer)
{
	struct derive_table *t = timer->data;
	uint64_t now = derive_now_ms(t);

	while (expire_one(t, now))
		;
	derive_rearm(t);
}

/* ---- artifacts ---- */

static struct derived *
find_artifact(struct derive_table *t, uint64_t entry_id, uint64_t source, const char *key)
{
	for (struct derived *a = t->artifacts; a != NULL; a = a->next)
		if (a->entry_id == entry_id && a->source == source && !a->withdrawn &&
			strcmp(a->key, key) == 0)
			return a;
	return NULL;
}

static struct derive_build *
find_build(struct derive_table *t, uint64_t entry_id, uint64_t source, const char *key)
{
	for (struct derive_build *b = t->builds; b != NULL; b = b->next)
		if (b->entry_id == entry_id && b->source == source && strcmp(b->key, key) == 0)
			return b;
	return NULL;
}

/* Removes a from the table; its generation closes with its last holder. */
static void
drop(struct derive_table *t, struct derived *a, const char *why)
{
	struct generation *g = a->gen;

	for (struct derived **pp = &t->artifacts; *pp != NULL; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	derive_count(t, derive_weight(g), 0);
	t->stats.dropped++;
	/* Not "freed": a worker that released it may still map it (or keep
	 * a descriptor of it), and its pages live until it lets go. */
	log_info("model \"%s\": derived \"%s\" of generation %" PRIu64 " dropped (%s): %" PRIu64
		 " bytes no longer kept", a->model_name, a->key, a->source, why, derive_weight(g));
	g->kept = 0;
	gen_maybe_free(t->r, g);
	derive_cred_clear(&a->builder_cred);
	free(a->model_name);
	free(a);
	/* The warm restart keeps the store in step (restore_sync). */
	if (t->r->changed != NULL)
		t->r->changed(t->r);
}

/* Is a's source no longer its model's current generation, or was a
 * withdrawn (derive_drop)? Then it goes with its last holder. */
static int
superseded(struct derive_table *t, const struct derived *a)
{
	struct model_entry *m = derive_entry_of(t, a->model_name, a->entry_id);

	return a->withdrawn || m == NULL || m->current == NULL || m->current->number != a->source;
}

void
derive_collect(struct derive_table *t)
{
	struct derived *a, *next;

	for (a = t->artifacts; a != NULL; a = next) {
		next = a->next;
		if (a->gen->attached == 0 && superseded(t, a))
			drop(t, a, a->withdrawn ? "withdrawn by the control socket's drop" :
						  "its source generation is no longer current");
	}
}

uint64_t
derive_unheld_bytes(const struct derive_table *t)
{
	uint64_t bytes = 0;

	for (const struct derived *a = t->artifacts; a != NULL; a = a->next)
		if (a->gen->attached == 0)
			bytes += derive_weight(a->gen);
	return bytes;
}

/* Adds uid to lanes[0 .. *n) (cap places) unless it is there. */
static void
add_lane(uid_t *lanes, size_t cap, size_t *n, uid_t uid)
{
	for (size_t i = 0; i < *n; i++)
		if (lanes[i] == uid)
			return;
	if (*n < cap)
		lanes[(*n)++] = uid;
}

uint64_t
derive_drop_unheld(struct derive_table *t, uint64_t want, const char *why, uid_t *lanes,
	size_t cap, size_t *nlanes)
{
	uint64_t dropped = 0;

	while (dropped < want) {
		struct derived *lru = NULL;

		for (struct derived *a = t->artifacts; a != NULL; a = a->next)
			if (a->gen->attached == 0 && (lru == NULL || a->last_use < lru->last_use))
				lru = a;
		if (lru == NULL)
			break;
		dropped += derive_weight(lru->gen);
		/* generation.c closes an artifact in the closer's lane of
		 * wcached's own for its builder (closer_unmap_close), which
		 * nothing the builder passes holds up (review rev189 F4). */
		if (lanes != NULL && nlanes != NULL)
			add_lane(lanes, cap, nlanes, lru->gen->builder_uid);
		drop(t, lru, why);
	}
	return dropped;
}

/* registry's drop_derived hook: the memory budget wants want bytes. */
static uint64_t
drop_for_budget(struct registry *r, uint64_t want)
{
	return derive_drop_unheld(r->derive_owner, want, "memory_budget: nobody held it", NULL,
		0, NULL);
}

/* m's artifacts of its current generation and its builds (of builder uid
 * only, when one is true), in *n, and the artifact of them nobody holds
 * that was used least recently (NULL: none). A copy of an older generation
 * is never attached again and goes with its last holder: its holders bound
 * it, as they bound retired generations, and it takes no place (rev181 F11:
 * 16 held copies of older generations kept a builder from building the
 * current one). */
static struct derived *
count_places(const struct derive_table *t, const struct model_entry *m, int one, uid_t uid,
	unsigned *n)
{
	struct derived *lru = NULL;

	*n = 0;
	for (struct derived *a = t->artifacts; a != NULL; a = a->next) {
		if (a->entry_id != m->entry_id || (one && a->builder_uid != uid) ||
			m->current == NULL || a->source != m->current->number || a->withdrawn)
			continue;
		(*n)++;
		if (a->gen->attached == 0 && (lru == NULL || a->last_use < lru->last_use))
			lru = a;
	}
	for (const struct derive_build *b = t->builds; b != NULL; b = b->next)
		*n += b->entry_id == m->entry_id && (!one || b->builder_uid == uid);
	return lru;
}

/*
 * Makes room for one more build of m by uid: first among uid's own
 * (DERIVE_MAX_PER_BUILDER), then among the model's (DERIVE_MAX_PER_MODEL),
 * each time if need be by dropping the artifact nobody holds that was used
 * least recently. 0 when there is room; -ENOSPC with msg when every one is
 * held or being built.
 */
static int
make_room(struct derive_table *t, const struct model_entry *m, uid_t uid, char *msg,
	size_t msg_size)
{
	for (int one = 1; one >= 0; one--) {
		unsigned n, most = one ? DERIVE_MAX_PER_BUILDER : DERIVE_MAX_PER_MODEL;
		struct derived *lru = count_places(t, m, one, uid, &n);
		char why[200];

		if (n < most)
			continue;
		if (lru == NULL && one) {
			snprintf(msg, msg_size, "model \"%s\": uid %u has %u derived artifacts and "
				 "builds of it already, every one held or being built (at most %u "
				 "per builder user)", m->name, (unsigned)uid, n, most);
			return -ENOSPC;
		}
		if (lru == NULL) {
			snprintf(msg, msg_size, "model \"%s\": %u derived artifacts and builds "
				 "already, every one held or being built (at most %u per model)",
				m->name, n, most);
			return -ENOSPC;
		}
		if (one)
			snprintf(why, sizeof(why), "a new build of uid %u needs its place: %u "
				 "artifacts and builds is the most one builder user may have, and "
				 "nobody held this one", (unsigned)uid, n);
		else
			snprintf(why, sizeof(why), "a new build needs its place: %u artifacts and "
				 "builds is the most a model may have, and nobody held this one",
				n);
		drop(t, lru, why);
	}
	return 0;
}

/* ---- requests ---- */

int
derive_init(struct derive_table *t, struct registry *r, const struct derive_hooks *hooks)
{
	memset(t, 0, sizeof(*t));
	t->r = r;
	t->hooks = *hooks;
	if (uv_timer_init(r->loop, &t->timer) < 0)
		return -ENOMEM;
	t->timer.data = t;
	if (uv_timer_init(r->loop, &t->closes_timer) < 0) {
		uv_close((uv_handle_t *)&t->timer, NULL);
		return -ENOMEM;
	}
	t->closes_timer.data = t;
	r->derive_owner = t;
	r->drop_derived = drop_for_budget;
	return 0;
}

void
derive_close(struct derive_table *t)
{
	struct derive_build *b;

	while ((b = t->builds) != NULL) {
		struct derive_waiter *w, *next;

		t->builds = b->next;
		for (w = b->waiters; w != NULL; w = next) {
			next = w->next;
			free(w);
		}
		derive_build_free(t, b);
	}
	while (t->artifacts != NULL)
		drop(t, t->artifacts, "wcached stops");
	t->r->drop_derived = NULL;
	t->closed = 1;
	uv_close((uv_handle_t *)&t->timer, NULL);
	/* Every check ended with its build (derive_check_cancel): nothing
	 * waits in t->checks_closing, and no closer_then() calls back. */
	uv_close((uv_handle_t *)&t->closes_timer, NULL);
	if (t->closes_async_state > 0)
		uv_close((uv_handle_t *)&t->closes_async, NULL);
	t->closes_async_state = -1;
}

int
derive_request(struct derive_table *t, const struct wire_derive *d,
	const struct registry_peer *peer, void *conn, uint32_t seq, struct derived **artifact,
	struct derive_build **build, char *msg, size_t msg_size)
{
	char name[WIRE_MAX_NAME + 1], key[WIRE_MAX_KEY + 1], who[64], more[128];
	struct model_entry *m = NULL;
	struct generation *g = NULL;
	struct derive_build *b;
	struct derived *a;
	int err;

	memcpy(name, d->name, d->name_len);
	name[d->name_len] = '\0';
	memcpy(key, d->key, d->key_len);
	key[d->key_len] = '\0';
	if ((err = registry_find_for(t->r, name, peer, &m, msg, msg_size)) < 0)
		return err;
	if (m == NULL)
		return -ENOENT;
	if (!m->derive) {
		snprintf(msg, msg_size, "model \"%s\": derived artifacts are off for it "
			 "(derive = no in its configuration)", m->name);
		return -EPERM;
	}
	if ((err = registry_servable(m, &g, msg, msg_size)) < 0 || g == NULL)
		return err < 0 ? err : -EIO;
	if ((a = find_artifact(t, m->entry_id, g->number, key)) != NULL) {
		*artifact = a;
		return DERIVE_READY;
	}
	if ((b = find_build(t, m->entry_id, g->number, key)) != NULL) {
		struct derive_waiter *w, **pp;

		/* Waiting for its own build, it would read nothing more, its
		 * PUBLISH included, until derive_timeout: it and every waiter
		 * of the key would wait out those minutes for nothing. */
		if (b->builder == conn) {
			snprintf(msg, msg_size,
				"model \"%s\": derived \"%s\" of generation %" PRIu64
				" is being built by this connection: PUBLISH or ABANDON it with "
				"its token", m->name, key, g->number);
			return -EDEADLK;
		}
		/* Its builder may have published and gone (the check goes
		 * on): the text says so rather than name a builder at work. */
		if (d->wait_ms == 0 && b->check != NULL) {
			snprintf(msg, msg_size,
				"model \"%s\": derived \"%s\" of generation %" PRIu64
				": its publication by %s is being checked", m->name, key,
				g->number, builder_named(b, who, sizeof(who)));
			return -EAGAIN;
		}
		if (d->wait_ms == 0) {
			snprintf(msg, msg_size,
				"model \"%s\": derived \"%s\" of generation %" PRIu64
				" is being built by %s", m->name, key, g->number,
				builder_named(b, who, sizeof(who)));
			return -EAGAIN;
		}
		if ((w = calloc(1, sizeof(*w))) == NULL) {
			snprintf(msg, msg_size, "out of memory");
			return -ENOMEM;
		}
		w->conn = conn;
		w->seq = seq;
		w->deadline_ms = derive_now_ms(t) + d->wait_ms;
		w->may_build = registry_may_build(m, peer);
		w->pid = peer->pid;
		w->uid = peer->uid;
		w->gid = peer->gid;
		w->groups = peer->groups;
		w->ngroups = peer->ngroups > 0 ? (uint32_t)peer->ngroups : 0;
		for (pp = &b->waiters; *pp != NULL; pp = &(*pp)->next)
			;
		*pp = w;
		t->stats.waits++;
		derive_rearm(t);
		return DERIVE_WAIT;
	}
	if (!registry_may_build(m, peer)) {
		snprintf(msg, msg_size, "model \"%s\": no derived \"%s\" of generation %" PRIu64
			 " yet, and uid %u may not build it (not in derive_groups)", m->name, key,
			g->number, (unsigned)peer->uid);
		return -EACCES;
	}
	if ((err = make_room(t, m, peer->uid, msg, msg_size)) < 0)
		return err;
	if ((b = calloc(1, sizeof(*b))) == NULL || (b->model_name = strdup(m->name)) == NULL ||
		cred_set(&b->builder_cred, peer->gid, peer->groups,
			peer->ngroups > 0 ? (uint32_t)peer->ngroups : 0) < 0) {
		if (b != NULL)
			free(b->model_name);
		free(b);
		snprintf(msg, msg_size, "out of memory");
		return -ENOMEM;
	}
	b->entry_id = m->entry_id;
	b->source = g->number;
	memcpy(b->key, key, sizeof(key));
	b->src = g;
	gen_ref(t->r, g);
	b->builder = conn;
	b->builder_pid = peer->pid;
	b->builder_uid = peer->uid;
	b->token = new_token(t);
	b->timeout_ms = m->derive_timeout_ms;
	b->started_ms = derive_now_ms(t);
	b->deadline_ms = b->started_ms + b->timeout_ms;
	seed_lost(t, b);
	b->next = t->builds;
	t->builds = b;
	t->stats.builds++;
	if (derive_may_log(t, peer->uid, more, sizeof(more)))
		log_info("model \"%s\": derived \"%s\" of generation %" PRIu64 ": pid %d uid %u "
			 "builds it%s", m->name, key, g->number, (int)peer->pid,
			(unsigned)peer->uid, more);
	derive_rearm(t);
	*build = b;
	return DERIVE_BUILD;
}

void
derive_attach(struct derive_table *t, struct derived *a, struct registry_attachment *out)
{
	registry_attach_generation(t->r, derive_entry_of(t, a->model_name, a->entry_id), a->gen,
		REGISTRY_NO_UID, out);
	a->attach_count++;
	a->last_use = ++t->r->attach_seq;
	t->stats.attaches++;
}

void
derive_attach_source(struct derive_table *t, struct derive_build *b,
	struct registry_attachment *out)
{
	registry_attach_generation(t->r, derive_entry_of(t, b->model_name, b->entry_id), b->src,
		b->builder_uid, out);
}

uint64_t
derive_token(const struct derive_build *b)
{
	return b->token;
}

/* The build of token, if conn runs it: 0, or -ESTALE / -EPERM with msg. */
int
derive_build_of_token(struct derive_table *t, void *conn, uint64_t token, struct derive_build **out,
	char *msg, size_t msg_size)
{
	for (struct derive_build *b = t->builds; b != NULL; b = b->next) {
		if (b->token != token || b->builder == NULL)
			continue;
		if (b->builder != conn) {
			snprintf(msg, msg_size,
				"build token %" PRIx64 " belongs to another connection", token);
			return -EPERM;
		}
		*out = b;
		return 0;
	}
	for (unsigned i = 0; i < DERIVE_ENDED_TOKENS; i++) {
		const struct derive_ended *e = &t->ended[i];

		if (e->token == token && e->why[0] != '\0') {
			snprintf(msg, msg_size, "%s: its build (token %" PRIx64 ") failed: %s",
				e->what, token, e->why);
			return -EPERM;
		}
		if (e->token == token) {
			snprintf(msg, msg_size, "%s: its build (token %" PRIx64 ") was taken away "
				 "after derive_timeout (%" PRIu64 " s); raise the model's "
				 "derive_timeout if building takes longer", e->what, token,
				e->timeout_s);
			return -ESTALE;
		}
	}
	snprintf(msg, msg_size, "no build in progress has token %" PRIx64 " (it was published, "
		 "abandoned, timed out or never given)", token);
	return -ESTALE;
}

int
derive_abandon(struct derive_table *t, void *conn, uint64_t token, const char *reason,
	char *msg, size_t msg_size)
{
	struct derive_build *b = NULL;
	char text[WIRE_MAX_MESSAGE];
	int err;

	if ((err = derive_build_of_token(t, conn, token, &b, msg, msg_size)) < 0 || b == NULL)
		return err < 0 ? err : -ESTALE;
	if (reason[0] == '\0')
		reason = "(no reason given)";
	/* Its uid abandoned (or lost) this key and generation before: a
	 * waiter of another user that may build takes it over, rather than
	 * every waiter failing while it asks again at once (rev181 F2). */
	if (lost_before(b, b->builder_uid) && fresh_builder_waits(t, b)) {
		snprintf(text, sizeof(text), "abandoned it again: %s", reason);
		remember_abandoner(t, b);
		derive_builder_lost(t, b, text);
		return 0;
	}
	remember_abandoner(t, b);
	snprintf(text, sizeof(text), "model \"%s\": derived \"%s\" of generation %" PRIu64
		 ": the build by pid %d failed: %s", b->model_name, b->key, b->source,
		(int)b->builder_pid, reason);
	derive_build_fail(t, b, -ECANCELED, text);
	return 0;
}

void
derive_conn_gone(struct derive_table *t, void *conn)
{
	struct derive_build *b;
	char more[128];

	/* Its waits first: nothing calls a hook. */
	for (b = t->builds; b != NULL; b = b->next) {
		struct derive_waiter **pp = &b->waiters;

		while (*pp != NULL) {
			struct derive_waiter *w = *pp;

			if (w->conn == conn) {
				*pp = w->next;
				free(w);
			} else {
				pp = &w->next;
			}
		}
	}
	/* Then its builds, one at a time: derive_builder_lost() calls a hook,
	 * which may close another connection and change the list (as
	 * expire_one). */
	for (b = t->builds; b != NULL;) {
		if (b->builder != conn) {
			b = b->next;
			continue;
		}
		if (b->check != NULL) {
			/* Its PUBLISH came first: a builder that publishes and
			 * exits (or closes, at once) has built it. (One that only
			 * shuts its end for writing is still there: the server
			 * keeps it for its answer.) The check owns what it needs
			 * (the memfd, the builder's uid for its closes), not conn,
			 * which is freed after this: it goes on, and check_finish
			 * answers the waiters, or hands the build on if it is
			 * refused. */
			b->builder = NULL;
			if (derive_may_log(t, b->builder_uid, more, sizeof(more)))
				log_info("model \"%s\": derived \"%s\" of generation %" PRIu64
					 ": the builder (pid %d uid %u) disconnected after "
					 "publishing; its publication is still checked, for the "
					 "waiters%s", b->model_name, b->key, b->source,
					(int)b->builder_pid, (unsigned)b->builder_uid, more);
			b = b->next;
			continue;
		}
		derive_builder_lost(t, b, "disconnected before publishing");
		b = t->builds;
	}
	derive_rearm(t);
}

void
derive_release(struct derive_table *t, struct generation *g, uid_t uid)
{
	int artifact = g->kept;

	registry_release(t->r, g, uid);
	if (artifact && g->attached == 0)
		for (struct derived *a = t->artifacts; a != NULL; a = a->next)
			if (a->gen == g) {
				if (superseded(t, a))
					drop(t, a, a->withdrawn ?
						"its last holder released it after a drop" :
						"its last holder released it and its source "
						"generation is no longer current");
				else /* used until now: last in the LRU (review rev184 F4) */
					a->last_use = ++t->r->attach_seq;
				break;
			}
}

/* derive_drop and derive_drop_unallowed: a drops now when nobody holds
 * it, else it is withdrawn (why in its line) and goes with its last
 * holder. */
static void
withdraw(struct derive_table *t, struct derived *a, const char *why, struct derive_dropped *out)
{
	if (a->gen->attached == 0) {
		drop(t, a, why);
		out->dropped++;
		return;
	}
	if (!a->withdrawn) {
		a->withdrawn = 1;
		log_info("model \"%s\": derived \"%s\" of generation %" PRIu64 " withdrawn (%s): "
			 "%u holders keep it until they release it", a->model_name, a->key,
			a->source, why, a->gen->attached);
		/* No longer kept for a warm restart (restore_sync). */
		if (t->r->changed != NULL)
			t->r->changed(t->r);
	}
	out->held++;
}

/* Counts model_name's builds in progress (of key, when not NULL) in out:
 * 1 when there is one. */
static int
count_building(const struct derive_table *t, const char *model_name, const char *key,
	struct derive_dropped *out)
{
	int found = 0;

	for (const struct derive_build *b = t->builds; b != NULL; b = b->next)
		if (strcmp(b->model_name, model_name) == 0 &&
			(key == NULL || strcmp(b->key, key) == 0)) {
			found = 1;
			out->building++;
		}
	return found;
}

int
derive_drop(struct derive_table *t, const char *model_name, const char *key,
	struct derive_dropped *out)
{
	struct derived *a, *next;
	int found = 0;

	memset(out, 0, sizeof(*out));
	for (a = t->artifacts; a != NULL; a = next) {
		next = a->next;
		if (strcmp(a->model_name, model_name) != 0 ||
			(key != NULL && strcmp(a->key, key) != 0))
			continue;
		found = 1;
		withdraw(t, a, "wcachectl drop", out);
	}
	found |= count_building(t, model_name, key, out);
	return found || key == NULL ? 0 : -ENOENT;
}

/* Whether uid, of gid and groups (n), may build under builders. */
static int
builders_allow(const struct access_list *builders, uid_t uid, gid_t gid, const gid_t *groups,
	uint32_t n, uid_t self_uid)
{
	struct access_who who = { .uid = uid, .gid = gid, .groups = groups, .ngroups = (int)n,
		.self_uid = self_uid };

	return access_allows(builders, &who);
}

/* The first build of model_name whose builder may not build under
 * builders (NULL: nobody may, derive is off), its groups known (with
 * builders), its publication not being checked (the check judges that one:
 * derive_builder_may), judging its waiters' right to take it over again
 * under builders on the way (by builders alone: a reload that widens
 * derive_groups gives it back; derive off, the model's own setting says no
 * to every waiter, waiter_may_build); NULL when none is left. */
static struct derive_build *
unallowed_build(struct derive_table *t, const char *model_name,
	const struct access_list *builders, uid_t self_uid)
{
	for (struct derive_build *b = t->builds; b != NULL; b = b->next) {
		if (strcmp(b->model_name, model_name) != 0)
			continue;
		for (struct derive_waiter *w = b->waiters; builders != NULL && w != NULL;
			w = w->next)
			w->may_build = builders_allow(builders, w->uid, w->gid, w->groups,
				w->ngroups, self_uid);
		if (b->builder == NULL || b->check != NULL)
			continue;
		if (builders == NULL)
			return b;
		if (b->builder_cred.gid != (gid_t)-1 &&
			!builders_allow(builders, b->builder_uid, b->builder_cred.gid,
				b->builder_cred.groups, b->builder_cred.ngroups, self_uid))
			return b;
	}
	return NULL;
}

/*
 * b's builder may no longer build: a reload narrowed derive_groups
 * (derive_off 0) or turned derive off. Its builder learns why at its
 * PUBLISH or ABANDON (derive_build_of_token: EPERM). For derive_groups the
 * oldest waiter that may build under the new ones takes the build over, as
 * when a builder goes away (derive_builder_lost; with none, every waiter
 * gets EHOSTDOWN naming derive_groups): before, every waiter got EPERM,
 * which reads as derive = no, those that may build included (review rev190
 * D2). For derive = no nobody may: the build fails for every waiter with
 * EPERM, as a DERIVE of it gets now (review rev190 D1: before, the build
 * went on, and a waiter was handed it when its builder left).
 */
static void
end_unallowed(struct derive_table *t, struct derive_build *b, int derive_off)
{
	struct derive_ended *e = &t->ended[t->next_ended++ % DERIVE_ENDED_TOKENS];
	const char *change = derive_off ? "turned derive off (derive = no)" :
		"changed derive_groups";
	char why[160], text[WIRE_MAX_MESSAGE];

	e->token = b->token;
	e->timeout_s = b->timeout_ms / 1000;
	snprintf(e->what, sizeof(e->what), "model \"%s\": derived \"%s\" of generation %" PRIu64,
		b->model_name, b->key, b->source);
	snprintf(e->why, sizeof(e->why), "uid %u may no longer build it: a configuration "
		 "reload %s", (unsigned)b->builder_uid, change);
	if (!derive_off) {
		snprintf(why, sizeof(why), "may no longer build it (gid %u, %u supplementary "
			 "groups): a configuration reload %s", (unsigned)b->builder_cred.gid,
			(unsigned)b->builder_cred.ngroups, change);
		builder_lost(t, b, why, 1);
		return;
	}
	snprintf(text, sizeof(text), "model \"%s\": derived \"%s\" of generation %" PRIu64
		 ": the build by pid %d uid %u failed: a configuration reload %s",
		b->model_name, b->key, b->source, (int)b->builder_pid, (unsigned)b->builder_uid,
		change);
	derive_build_fail(t, b, -EPERM, text);
}

void
derive_drop_unallowed(struct derive_table *t, const char *model_name,
	const struct access_list *builders, uid_t self_uid, struct derive_dropped *out)
{
	struct derive_build *b;
	struct derived *a, *next;

	memset(out, 0, sizeof(*out));
	for (a = t->artifacts; a != NULL; a = next) {
		struct access_who who = { .uid = a->builder_uid, .gid = a->builder_cred.gid,
			.groups = a->builder_cred.groups, .ngroups = (int)a->builder_cred.ngroups,
			.self_uid = self_uid };

		next = a->next;
		if (strcmp(a->model_name, model_name) != 0 || a->withdrawn ||
			a->builder_cred.gid == (gid_t)-1 || access_allows(builders, &who))
			continue;
		withdraw(t, a, "derive_groups", out);
	}
	/* Each one's end may close connections (hooks): the walk starts over. */
	while ((b = unallowed_build(t, model_name, builders, self_uid)) != NULL)
		end_unallowed(t, b, 0);
	(void)count_building(t, model_name, NULL, out);
}

unsigned
derive_fail_derive_off(struct derive_table *t, const char *model_name)
{
	struct derive_build *b;
	unsigned failed = 0;

	while ((b = unallowed_build(t, model_name, NULL, geteuid())) != NULL) {
		end_unallowed(t, b, 1);
		failed++;
	}
	return failed;
}

void
derive_stored_each(const struct derive_table *t, const struct model_entry *m,
	void (*fn)(const struct derive_stored *, void *), void *arg)
{
	for (const struct derived *a = t->artifacts; a != NULL; a = a->next)
		if (a->entry_id == m->entry_id && !a->withdrawn)
			fn(&(struct derive_stored){ .key = a->key, .source = a->source,
				   .gen = a->gen, .builder_uid = a->builder_uid,
				   .builder_pid = a->builder_pid,
				   .build_seconds = a->build_seconds,
				   .builder_cred = a->builder_cred },
				arg);
}

int
derive_adopt(struct derive_table *t, struct model_entry *m, const struct derive_stored *s)
{
	struct derived *a;

	if (!wire_key_valid(s->key, strlen(s->key)))
		return -EINVAL;
	if (find_artifact(t, m->entry_id, s->source, s->key) != NULL)
		return -EEXIST;
	if ((a = calloc(1, sizeof(*a))) == NULL || (a->model_name = strdup(m->name)) == NULL ||
		derive_cred_copy(&a->builder_cred, &s->builder_cred) < 0) {
		if (a != NULL)
			free(a->model_name);
		free(a);
		return -ENOMEM;
	}
	a->entry_id = m->entry_id;
	a->source = s->source;
	snprintf(a->key, sizeof(a->key), "%s", s->key);
	a->gen = s->gen;
	a->builder_uid = s->builder_uid;
	a->builder_pid = s->builder_pid;
	a->build_seconds = s->build_seconds;
	a->last_use = ++t->r->attach_seq;
	a->next = t->artifacts;
	t->artifacts = a;
	s->gen->kept = 1;
	derive_count(t, derive_weight(s->gen), 1);
	log_info("model \"%s\": derived \"%s\" of generation %" PRIu64 " taken back from the "
		 "store (%" PRIu64 " bytes)", m->name, a->key, a->source, s->gen->bytes);
	return 0;
}

void
derive_each(const struct derive_table *t, const char *model_name,
	void (*fn)(const struct derive_info *, void *), void *arg)
{
	for (const struct derived *a = t->artifacts; a != NULL; a = a->next) {
		if (strcmp(a->model_name, model_name) != 0)
			continue;
		fn(&(struct derive_info){ .key = a->key, .source = a->source,
			   .bytes = a->gen->bytes, .attach_count = a->attach_count,
			   .holders = a->gen->attached, .build_seconds = a->build_seconds,
			   .builder_uid = a->builder_uid, .builder_pid = a->builder_pid,
			   .format = source_format_name(a->gen->source.format),
			   .withdrawn = a->withdrawn },
			arg);
	}
	for (const struct derive_build *b = t->builds; b != NULL; b = b->next) {
		unsigned waiting = 0;

		if (strcmp(b->model_name, model_name) != 0)
			continue;
		for (const struct derive_waiter *w = b->waiters; w != NULL; w = w->next)
			waiting++;
		fn(&(struct derive_info){ .key = b->key, .source = b->source, .waiting = waiting,
			   .builder_uid = b->builder_uid, .builder_pid = b->builder_pid,
			   .building = 1, .checking = b->check != NULL,
			   .builder_gone = b->builder == NULL },
			arg);
	}
}
