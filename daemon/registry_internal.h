/*
 * registry_internal.h: what registry.c (models, loading) and generation.c
 * (a generation's life: warming, pinning, eviction, freeing) share. Not for
 * other modules: they use registry.h.
 */
#ifndef WC_REGISTRY_INTERNAL_H
#define WC_REGISTRY_INTERNAL_H

#include "registry.h"

/* Work on a generation's pages, run off the loop one at a time. */
enum page_op {
	PAGE_PIN,
	PAGE_UNPIN,
	PAGE_EVICT,
	PAGE_EVICT_SETTLE, /* evict, and again once in-flight readahead has landed */
	PAGE_POPULATE,     /* map every page into the daemon (resident.h), once warm */
	PAGE_CHECK,        /* measure residency; warm again what memory pressure took */
};

/* registry.c */
uint64_t registry_now_ms(const struct registry *r);
struct model_entry *registry_entry_named(struct registry *r, const char *name);
void registry_publish(struct registry *r, struct model_entry *m, uint64_t generation);

/* generation.c */
int gen_is_live(const struct generation *g);
void gen_maybe_free(struct registry *r, struct generation *g);
void gen_pin_metadata(struct generation *g);
void gen_queue_pages(struct registry *r, struct generation *g, enum page_op op);
void gen_promote(struct registry *r, struct model_entry *m, struct generation *g);
void gen_start_warming(struct registry *r, struct generation *g);
void gen_cancel_warming(struct registry *r, struct generation *g);
void gen_evict(struct registry *r, struct generation *g);

#endif
