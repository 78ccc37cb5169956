/*
 * registry_budget.c: what the registry decides over its models' pages
 * (registry.h): the memory budget (evict the least recently attached
 * unpinned models until the current generations fit), pin and unpin,
 * `wcachectl evict`, and the residency checks that find pages memory
 * pressure took. The state changes themselves are generation.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>

#include "base/error.h"
#include "log.h"
#include "registry_internal.h"

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

void
registry_enforce_budget(struct registry *r)
{
	uint64_t total = 0;

	if (r->memory_budget == 0)
		return;
	/* The estimate is the size of every current generation that keeps
	 * its pages, and of every pending one: what warming keeps resident. */
	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		if (m->current != NULL && gen_holds_memory(m->current))
			total += m->current->bytes;
		if (m->pending != NULL)
			total += m->pending->bytes;
	}
	/* Derived artifacts are memory, not page cache: nobody's copy can be
	 * read back, so those nobody holds go first, least recently used. */
	total += r->derived_bytes;
	if (total > r->memory_budget && r->drop_derived != NULL) {
		uint64_t dropped = r->drop_derived(r, total - r->memory_budget);

		total = dropped < total ? total - dropped : 0;
	}
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
		log_info("model \"%s\": evicted to keep within memory_budget (%" PRIu64
			 " MiB of models, budget %" PRIu64 " MiB)", lru->name, total >> 20,
			r->memory_budget >> 20);
		gen_evict(r, lru->current);
		total -= lru->current->bytes;
	}
}
