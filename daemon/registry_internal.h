/*
 * registry_internal.h: what registry.c (models, loading, attaching) and
 * generation.c (the state machine of a generation) share. Not for other
 * modules: they use registry.h, and generation.h where they read a
 * generation.
 */
#ifndef WC_REGISTRY_INTERNAL_H
#define WC_REGISTRY_INTERNAL_H

#include "generation.h"
#include "registry.h"

/* registry.c */
struct model_entry *registry_entry_named(struct registry *r, const char *name);
void registry_publish(struct registry *r, struct model_entry *m, uint64_t generation);

#endif
