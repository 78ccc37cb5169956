/*
 * registry_budget.c: what the registry decides over its models' pages
 * (registry.h): the memory budget (evict the least recently attached
 * unpinned models until the current generations fit), pin and unpin,
 * `wcachectl evict`, and the residency checks that find pages memory
 * pressure took. The state changes themselves are generation.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "log.h"
#include "registry_internal.h"

/* A registry_pages_wait request. */
struct page_waiter {
	registry_done_fn done;
	void *arg;
	struct page_waiter *next;
};

/* Has any generation of m page work queued or running? */
static bool
pages_busy(const struct registry *r, const struct model_entry *m)
{
	for (const struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m && (g->ops_pending > 0 || g->warm.pending > 0))
			return true;
	return false;
}

/* Answers one request: the pin in force applied, or -EIO. */
static void
answer(const struct model_entry *m, struct page_waiter *w)
{
	const struct generation *g = m->current;
	char msg[1200];
	int status = 0;

	if (g != NULL && m->pin == PIN_ALL && g->pinned != PIN_ALL && g->state != GEN_COLD) {
		status = -EIO;
		snprintf(msg, sizeof(msg), "not every page could be locked: %s",
			g->pin_error[0] != '\0' ? g->pin_error :
			"the kernel refused mlock (see the log)");
	} else {
		snprintf(msg, sizeof(msg), "done");
	}
	w->done(status, msg, g != NULL ? g->number : 0, w->arg);
	free(w);
}

int
registry_pages_wait(struct registry *r, const char *name, registry_done_fn done, void *arg)
{
	struct model_entry *m = registry_entry_named(r, name);
	struct page_waiter *w;

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	w->done = done;
	w->arg = arg;
	if (!pages_busy(r, m)) {
		answer(m, w);
		return 0;
	}
	w->next = m->page_waiters;
	m->page_waiters = w;
	return 0;
}

void
registry_pages_ended(struct registry *r, struct generation *g)
{
	struct model_entry *m = g->model;
	struct page_waiter *w;

	if (m == NULL || m->page_waiters == NULL || pages_busy(r, m))
		return;
	/* Taken off first: a done hook may queue more work or wait again. */
	w = m->page_waiters;
	m->page_waiters = NULL;
	while (w != NULL) {
		struct page_waiter *next = w->next;

		answer(m, w);
		w = next;
	}
}

void
registry_pages_cancel(struct model_entry *m)
{
	struct page_waiter *w = m->page_waiters;

	m->page_waiters = NULL;
	while (w != NULL) {
		struct page_waiter *next = w->next;

		w->done(-ECANCELED, "the model was unloaded first", 0, w->arg);
		free(w);
		w = next;
	}
}

void
registry_refresh_residency(struct registry *r, uint64_t max_age_ms)
{
	uint64_t now = registry_now_ms(r);

	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct generation *g = m->current;

		/* A queued or running operation measures when it ends. */
		if (g == NULL || g->page_queue != NULL)
			continue;
		if (g->resident.measured && now < g->resident.at_ms + max_age_ms)
			continue;
		gen_queue_pages(r, g, PAGE_CHECK);
	}
}

void
registry_check_residency(struct registry *r)
{
	/* Every current one, for the figure status reports; only a populated
	 * one can need warming again (gen_residency_checked). */
	registry_refresh_residency(r, 0);
}

int
registry_pin(struct registry *r, const char *name, enum pin_mode pin)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	m->pin = pin;
	m->pin_seq++; /* a load in flight keeps this pin (install) */
	if (m->current == NULL)
		return 0;
	/* Locking reads what is not resident: it runs off the loop, and a
	 * lock RLIMIT_MEMLOCK refuses is logged with the advice. A generation
	 * still warming is locked when warm. */
	if (pin == PIN_ALL) {
		if (m->current->state == GEN_COLD)
			gen_set_state(m->current, GEN_READY, "pinned");
		if (m->current->state == GEN_READY)
			gen_queue_pages(r, m->current, PAGE_PIN);
		/* A pinned model counts against the budget and is never the
		 * one evicted: others may have to go. */
		registry_enforce_budget(r);
	} else {
		/* Queued behind a lock still running, if any. */
		gen_queue_pages(r, m->current, PAGE_UNPIN);
	}
	return 0;
}

int
registry_evict(struct registry *r, const char *name)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (m->pin == PIN_ALL)
		return error_set(-EBUSY, "model \"%s\" is pinned; unpin it first", name);
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m)
			gen_evict(r, g);
	log_info("model \"%s\": evicted from the page cache", name);
	return 0;
}

uint64_t
registry_warm_bytes(const struct registry *r)
{
	uint64_t total = r->derived_bytes;

	/* The estimate is the size of every current generation that keeps
	 * its pages, and of every pending one: what warming keeps resident. */
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		if (m->current != NULL && gen_holds_memory(m->current))
			total += m->current->bytes;
		if (m->pending != NULL)
			total += m->pending->bytes;
	}
	return total;
}

/*
 * Says once, when an enforcement finds it (and again only after one found
 * it no longer so), that the derived artifacts workers hold alone take more
 * than memory_budget: the budget then evicts every model it may and still
 * cannot be kept. Called after the unheld artifacts were dropped, so what
 * is left of derived_bytes is held. The flag is the registry's: each
 * registry (a unit test makes several) says it for itself.
 */
static void
warn_held_over_budget(struct registry *r)
{
	int over = r->memory_budget != 0 && r->derived_bytes > r->memory_budget;

	if (over && !r->held_over_budget)
		log_warnx("derived artifacts that workers hold take %.1f MiB, more than "
			  "memory_budget (%.1f MiB) alone: every model the budget may evict is "
			  "evicted, and the budget stays exceeded until workers release some "
			  "(raise memory_budget to keep models warm beside them)",
			(double)r->derived_bytes / (1 << 20),
			(double)r->memory_budget / (1 << 20));
	r->held_over_budget = over;
}

void
registry_enforce_budget(struct registry *r)
{
	uint64_t total;

	if (r->memory_budget == 0) {
		warn_held_over_budget(r); /* no budget: nothing to exceed */
		return;
	}
	total = registry_warm_bytes(r);
	/* Derived artifacts are memory, not page cache: nobody's copy can be
	 * read back, so those nobody holds go first, least recently used. */
	if (total > r->memory_budget && r->drop_derived != NULL) {
		uint64_t dropped = r->drop_derived(r, total - r->memory_budget);

		total = dropped < total ? total - dropped : 0;
	}
	warn_held_over_budget(r);
	while (total > r->memory_budget) {
		struct model_entry *lru = NULL;

		for (struct model_entry *m = r->models; m != NULL; m = m->next)
			if (m->current != NULL && gen_holds_memory(m->current) &&
				m->pin != PIN_ALL && m->current->attached == 0 &&
				(lru == NULL || m->last_attach < lru->last_attach))
				lru = m;
		if (lru == NULL) {
			/* Everything left is pinned or in use. */
			for (struct model_entry *m = r->models; m != NULL; m = m->next)
				if (m->current != NULL && gen_holds_memory(m->current) &&
					m->pin != PIN_ALL &&
					(lru == NULL || m->last_attach < lru->last_attach))
					lru = m;
		}
		if (lru == NULL)
			break;
		/* What is left of derived artifacts after those nobody held
		 * went is held by workers: said apart from the models. */
		if (r->derived_bytes == 0)
			log_info("model \"%s\": evicted to keep within memory_budget (%" PRIu64
				 " MiB of models, budget %" PRIu64 " MiB)", lru->name,
				total >> 20, r->memory_budget >> 20);
		else
			log_info("model \"%s\": evicted to keep within memory_budget (%" PRIu64
				 " MiB of models and %" PRIu64 " MiB of derived artifacts workers "
				 "hold, budget %" PRIu64 " MiB)", lru->name,
				(total - r->derived_bytes) >> 20, r->derived_bytes >> 20,
				r->memory_budget >> 20);
		gen_evict(r, lru->current);
		total -= lru->current->bytes;
	}
}
