/*
 * restore_adopt.c: serving what the manager's store gave back (restore.h):
 * a model's current generation at once, the generations workers held
 * before the restart while their HOLDs may come (each uid's up to the
 * number of its holders the store recorded), HOLD itself, and the full
 * check of each adopted generation on the work queue while it serves.
 * Everything goes through the registry's public API (registry.h) and
 * generation.h; the registry hears of nothing here but what that API says.
 * Derived artifacts go back to derive.c's table (derive_adopt).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/error.h"
#include "derive.h"
#include "fdstore.h"
#include "generation.h"
#include "log.h"
#include "pages.h"
#include "restore.h"
#include "restore_internal.h"

static void check_done(struct registry *r, struct generation *g,
	const struct pages_result *res);

/* PAGE_RESTORE reports here (pages.h). */
static const struct pages_hooks check_hooks = { .live = gen_is_live, .done = check_done };

/* A generation of the model name made of what the store gave back: src
 * (files open and mapped) and the sealed index_fd, mapped here; served
 * (gen_open_served) and fs (its filesystem) as restore_check.c found them,
 * or NULL to find them here (a memfd's: nothing to wait for). Takes src
 * and served on success only; NULL with the message otherwise. Not yet in
 * the registry's list, without a model, in state NEW. */
static struct generation *
stored_generation(struct registry *r, const char *name, uint64_t number,
	struct model_source *src, int *served, const struct fs_info *fs, int index_fd,
	size_t index_size)
{
	struct generation *g;
	int opened = served == NULL;
	void *map;

	map = mmap(NULL, index_size, PROT_READ, MAP_SHARED, index_fd, 0);
	if (map == MAP_FAILED) {
		error_set(-errno, "model \"%s\": mapping the stored index: %s", name,
			strerror(errno));
		return NULL;
	}
	if (opened && gen_open_served(src, &served) < 0) {
		char why[ERROR_MAX];

		snprintf(why, sizeof(why), "%s", error_get());
		munmap(map, index_size);
		error_set(-ESTALE, "model \"%s\": %s", name, why);
		return NULL;
	}
	g = gen_new(r, name, number, src, served, index_fd, map, index_size);
	if (g == NULL) {
		char why[ERROR_MAX];
		int e = errno;

		snprintf(why, sizeof(why), "%s", error_get());
		if (opened)
			gen_close_served(served, src->nfiles);
		munmap(map, index_size);
		error_set(-e, "model \"%s\": %s", name, why);
		return NULL;
	}
	g->from_store = 1;
	if (fs != NULL)
		g->fs = *fs;
	else
		gen_source_fs(&g->source, &g->fs);
	return g;
}

int
restore_adopt_current(struct registry *r, const struct restore_served *s,
	enum pin_mode pin, int warm, uint64_t expected)
{
	struct generation *g;
	int err;

	if ((g = stored_generation(r, s->name, s->number, s->src, s->served, s->fs, s->index_fd,
		     s->index_size)) == NULL)
		return -ENOMEM;
	gen_set_state(g, GEN_READY, "restored from the file descriptor store");
	/* Nothing here is proportional to the model's size or tensor count:
	 * the full index check, the metadata lock and mapping every page into
	 * this process again (the page cache still has them: that reads
	 * nothing from disk) run on the work queue while it serves, from
	 * restore_checks(). */
	g->restore_check = RESTORE_CHECK_WAITING;
	if ((err = registry_add_served(r, s->name, s->path, pin, warm, g, expected)) < 0) {
		g->served_fds = NULL; /* the caller's still */
		gen_unmake(g, s->src);
		return err;
	}
	return 0;
}

/* The places of uids (restore_await_holds) in a new array, none taken:
 * 0 and *out (NULL when nuids is 0), or -ENOMEM with the message. */
static int
places_copy(const char *name, uint64_t number, const struct fdstore_holder *uids,
	uint32_t nuids, struct gen_place **out)
{
	struct gen_place *v = NULL;

	if (nuids > 0 && (v = calloc(nuids, sizeof(*v))) == NULL)
		return error_set(-ENOMEM, "model \"%s\": generation %" PRIu64 ": out of memory",
			name, number);
	for (uint32_t i = 0; i < nuids; i++)
		v[i] = (struct gen_place){ .uid = (uid_t)uids[i].uid, .count = uids[i].count };
	*out = v;
	return 0;
}

/* Opens g's wait (restore_await_holds) with places, nplaces of them (or
 * NULL), which g takes. */
static void
await_holds(struct registry *r, struct generation *g, unsigned holders,
	struct gen_place *places, uint32_t nplaces)
{
	/* From now, not from the loop's last update (start-up runs before
	 * the loop does). */
	uv_update_time(r->loop);
	g->hold_until_ms = registry_now_ms(r) + (uint64_t)r->restart_hold_ms;
	if (g->hold_until_ms == 0)
		g->hold_until_ms = 1;
	g->holds_expected = holders;
	g->hold_places = places;
	g->nhold_places = nplaces;
	r->holds_open++;
}

int
restore_adopt_held(struct registry *r, const struct restore_served *s, unsigned holders)
{
	const char *name = s->name;
	uint64_t number = s->number;
	struct model_entry *m = registry_find(r, name);
	struct gen_place *places = NULL;
	struct generation *g;
	int err;

	if (m != NULL && strcmp(m->name, name) != 0)
		m = NULL; /* the model whose path is name: not this one */
	if (m == NULL || m->current == NULL || m->current->number <= number)
		return error_set(-EINVAL, "model \"%s\": generation %" PRIu64 " is not older "
			"than a restored current one", name, number);
	/* Nobody could say they hold it: it would only wait for nothing. */
	if (holders == 0)
		return error_set(-EINVAL, "model \"%s\": generation %" PRIu64 " had no holders "
			"when it was stored", name, number);
	if (registry_generation(r, m, number) != NULL)
		return error_set(-EEXIST, "model \"%s\": generation %" PRIu64 " is already there",
			name, number);
	if ((err = places_copy(name, number, s->uids, s->nuids, &places)) < 0)
		return err;
	if ((g = stored_generation(r, name, number, s->src, s->served, s->fs, s->index_fd,
		     s->index_size)) == NULL) {
		free(places);
		return -ENOMEM;
	}
	gen_set_state(g, GEN_READY, "restored from the file descriptor store, held");
	/* Not current: only its holders' HOLDs keep it, once this passes. */
	await_holds(r, g, holders, places, s->nuids);
	registry_add_generation(r, m, g);
	return 0;
}

int
restore_adopt_artifact(struct registry *r, struct model_entry *m,
	const struct derive_stored *a, struct model_source *src, int index_fd,
	size_t index_size, struct generation **out)
{
	struct derive_stored s = *a;
	struct generation *g;
	int err;

	if (r->derive_owner == NULL)
		return error_set(-ENOTSUP, "derived artifacts are not set up");
	if ((g = stored_generation(r, m->name, a->source, src, NULL, NULL, index_fd,
		     index_size)) == NULL)
		return -ENOMEM;
	/* The index lives on in the sealed memfd, as for a published one. */
	free(g->source.index);
	g->source.index = NULL;
	gen_set_state(g, GEN_READY, "derived artifact restored from the file descriptor store");
	g->artifact = 1;
	g->builder_uid = a->builder_uid;
	s.gen = g;
	if ((err = derive_adopt(r->derive_owner, m, &s)) < 0) {
		gen_unmake(g, src);
		return error_set(err, "%s", err == -EEXIST ? "that key of that generation is "
			"already there" : strerror(-err));
	}
	*out = g;
	return 0;
}

int
restore_await_holds(struct registry *r, struct generation *g, unsigned holders,
	const struct fdstore_holder *uids, uint32_t nuids)
{
	struct gen_place *places = NULL;
	int err;

	if (holders == 0 || g->hold_until_ms != 0)
		return 0;
	if ((err = places_copy(g->model_name, g->number, uids, nuids, &places)) < 0)
		return err;
	await_holds(r, g, holders, places, nuids);
	return 0;
}

/* g's workers' references: those counted by uid, unless one's uid was not
 * recorded (then every reference, as before uids were) or g is a derived
 * artifact (its holders are not stored). */
static unsigned
worker_references(const struct generation *g)
{
	unsigned n = 0;

	if (g->artifact || g->holders_lost)
		return g->attached;
	for (unsigned i = 0; i < g->nholders; i++)
		if (__builtin_add_overflow(n, g->holders[i].count, &n))
			return UINT_MAX;
	return n;
}

unsigned
restore_holders(const struct generation *g)
{
	unsigned n = worker_references(g);

	if (g->hold_until_ms != 0 && g->holds_expected > g->nhold_conns &&
		__builtin_add_overflow(n, g->holds_expected - g->nhold_conns, &n))
		n = UINT_MAX;
	return n;
}

int
restore_holder_uids(const struct generation *g, struct fdstore_holder **out, uint32_t *n)
{
	int waiting = g->hold_until_ms != 0;
	unsigned a = 0, b = 0, places = waiting ? g->nhold_places : 0;
	struct fdstore_holder *v;
	uint64_t sum = 0;
	uint32_t k = 0;

	*out = NULL;
	*n = 0;
	if (g->artifact || g->holders_lost ||
		(waiting && places == 0 && g->holds_expected > g->nhold_conns) ||
		(size_t)g->nholders + places == 0 ||
		(size_t)g->nholders + places > FDSTORE_MAX_HOLDER_UIDS)
		return 0;
	if ((v = calloc((size_t)g->nholders + places, sizeof(*v))) == NULL)
		return error_set(-ENOMEM, "model \"%s\": generation %" PRIu64 ": out of memory",
			g->model_name, g->number);
	/* Both ascending by uid: merged, a uid in both once. */
	while (a < g->nholders || b < places) {
		uid_t uid;
		uint64_t count = 0;

		if (b == places || (a < g->nholders && g->holders[a].uid <= g->hold_places[b].uid))
			uid = g->holders[a].uid;
		else
			uid = g->hold_places[b].uid;
		if (a < g->nholders && g->holders[a].uid == uid)
			count += g->holders[a++].count;
		if (b < places && g->hold_places[b].uid == uid) {
			count += g->hold_places[b].count - g->hold_places[b].taken;
			b++;
		}
		if (count == 0)
			continue; /* a uid whose places are all taken */
		v[k++] = (struct fdstore_holder){ (uint32_t)uid, (uint32_t)count };
		sum += count;
	}
	/* Counts past a u32 (not in this world) or a sum that is not the
	 * holders': the count alone. */
	if (k == 0 || sum != restore_holders(g) || sum > UINT32_MAX) {
		free(v);
		return 0;
	}
	*out = v;
	*n = k;
	return 0;
}

/* Ends g's wait for HOLDs: none is accepted from now. */
static void
hold_wait_end(struct registry *r, struct generation *g)
{
	g->hold_until_ms = 0;
	r->holds_open--;
	free(g->hold_conns);
	g->hold_conns = NULL;
	g->nhold_conns = 0;
	g->holds_expected = 0;
	free(g->hold_places);
	g->hold_places = NULL;
	g->nhold_places = 0;
}

void
restore_expire_holds(struct registry *r)
{
	uint64_t now = registry_now_ms(r);
	struct generation *g, *next;

	if (r->holds_open == 0)
		return;
	for (g = r->generations; g != NULL; g = next) {
		next = g->next;
		if (g->hold_until_ms == 0 || now < g->hold_until_ms)
			continue;
		hold_wait_end(r, g);
		if (g->attached == 0 && !gen_is_live(g))
			log_info("model \"%s\": generation %" PRIu64 ": no worker said it still "
				 "holds it within %.3g s of the restart", g->model_name, g->number,
				r->restart_hold_ms / 1000.0);
		gen_maybe_free(r, g);
	}
}

void
restore_checks(struct registry *r)
{
	struct generation *next = NULL;

	restore_state.checks_begun = 1;
	if (r->closing)
		return;
	for (struct generation *g = r->generations; g != NULL; g = g->next) {
		if (g->restore_check == RESTORE_CHECK_RUNNING)
			return;
		if (g->restore_check == RESTORE_CHECK_WAITING)
			next = g; /* the list is newest first: the last one waited longest */
	}
	if (next != NULL) {
		next->restore_check = RESTORE_CHECK_RUNNING;
		pages_queue(r, next, PAGE_RESTORE, &check_hooks);
	}
}

/*
 * The full check of adopted generation g ended, err 0 or -errno with why.
 * On success a model with pin = all locks it now; on failure one error
 * line says why and g is withdrawn: no longer current (registry_withdraw),
 * removed from the store, and the model loads again from its configured
 * path as the next generation, judged as a reload wcached makes by itself
 * (registry_withdraw).
 */
static void
checked(struct registry *r, struct generation *g, int err, const char *why)
{
	struct model_entry *m = g->model;
	int serving = m != NULL && m->current == g;

	g->restore_check = RESTORE_CHECK_NONE;
	restore_checks(r);
	if (err == 0) {
		log_debug("model \"%s\": generation %" PRIu64 ": restored index checked in full%s",
			g->model_name, g->number, g->populated ? ", every page mapped" : "");
		if (serving && m->pin == PIN_ALL && g->state == GEN_READY)
			gen_queue_pages(r, g, PAGE_PIN);
		return;
	}
	/* Withdrawn as a failed load is: no new attaches (an attach made
	 * meanwhile keeps it open until released), out of the store, and
	 * reloaded from the configured path as wcached's own reload. */
	log_errorx("model \"%s\": generation %" PRIu64 " restored from the file descriptor store "
		   "failed its full check (%s); %s", g->model_name, g->number, why,
		serving ? "withdrawn, loading afresh (judged as a reload wcached makes by "
		"itself)" : "no longer served");
	restore_forget(r, g);
	/* Not the previous process's generation any more, as far as HOLD
	 * goes, and nothing to wait for. */
	g->from_store = 0;
	if (g->hold_until_ms != 0)
		hold_wait_end(r, g);
	if (serving)
		registry_withdraw(r, m, why);
}

/* pages.c: PAGE_RESTORE of g ended (pages.h); g closes if nothing refers
 * to it any more. */
static void
check_done(struct registry *r, struct generation *g, const struct pages_result *res)
{
	if (!res->cancelled)
		checked(r, g, res->check_err, res->message);
	gen_maybe_free(r, g);
}

/* g's place of uid, or NULL. */
static struct gen_place *
place_of(const struct generation *g, uid_t uid)
{
	for (unsigned i = 0; i < g->nhold_places; i++)
		if (g->hold_places[i].uid == uid)
			return &g->hold_places[i];
	return NULL;
}

/* May peer (its connection, its uid) HOLD g now (restore_hold's rules)?
 * 0, or -errno with the client's message naming the model, the
 * generation and why. */
static int
hold_allowed(struct registry *r, const struct model_entry *m, const struct generation *g,
	uint64_t number, const struct registry_peer *peer, char *msg, size_t msg_size)
{
	const struct gen_place *place;

	/* Only a generation the previous process served: after a cold start
	 * the same number names another generation. */
	if (g == NULL || !g->from_store) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 " was not taken "
			"over from the previous wcached", m->name, number);
		return -ENOENT;
	}
	if (g->hold_until_ms == 0 || registry_now_ms(r) >= g->hold_until_ms) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": the wait for its "
			"holders after the restart has ended (restart_hold_seconds)", m->name,
			number);
		return -ENOENT;
	}
	for (unsigned i = 0; i < g->nhold_conns; i++)
		if (g->hold_conns[i] == peer->conn_id) {
			snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": this "
				"connection has said it holds it already", m->name, number);
			return -EALREADY;
		}
	if (g->nhold_conns >= g->holds_expected) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": all %u of its "
			"holders before the restart have said so", m->name, number,
			g->holds_expected);
		return -EUSERS;
	}
	/* Stored with its holders' uids: only theirs, each's own places
	 * (review rev173 F10: before, any uid allowed to use the model could
	 * take the places of another's holders). */
	if (g->hold_places == NULL)
		return 0;
	if ((place = place_of(g, peer->uid)) == NULL) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": uid %u did not "
			"hold it before the restart", m->name, number, (unsigned)peer->uid);
		return -EPERM;
	}
	if (place->taken >= place->count) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": all %u of its "
			"holders before the restart have said so (those of uid %u)", m->name,
			number, place->count, (unsigned)peer->uid);
		return -EUSERS;
	}
	return 0;
}

int
restore_hold(struct registry *r, const char *name, uint64_t number,
	const struct registry_peer *peer, struct generation **out, char *msg, size_t msg_size)
{
	struct model_entry *m = NULL;
	struct generation *g;
	uint64_t *conns;
	int err;

	if ((err = registry_find_for(r, name, peer, &m, msg, msg_size)) < 0)
		return err;
	g = registry_generation(r, m, number);
	if ((err = hold_allowed(r, m, g, number, peer, msg, msg_size)) < 0)
		return err;
	/* Grows with the HOLDs that come, never past holds_expected. */
	if ((conns = realloc(g->hold_conns, (g->nhold_conns + 1) * sizeof(*conns))) == NULL) {
		snprintf(msg, msg_size, "out of memory");
		return -ENOMEM;
	}
	g->hold_conns = conns;
	if (gen_holder_add(g, peer->uid) < 0) {
		snprintf(msg, msg_size, "out of memory");
		return -ENOMEM;
	}
	conns[g->nhold_conns++] = peer->conn_id;
	if (g->hold_places != NULL)
		place_of(g, peer->uid)->taken++;
	/* A reference like an attach's, without an attach's effects: the
	 * worker has its mappings; nothing is warmed or counted. */
	g->attached++;
	*out = g;
	return 0;
}

