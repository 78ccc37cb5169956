/*
 * pages.h: work on a generation's pages (locking, unlocking, eviction,
 * mapping every page, measuring residency), off the event loop.
 *
 * Each operation takes time proportional to the generation's size (mlock
 * reads every page not yet resident; munlock and fadvise walk them all), so
 * it runs on libuv's work queue. A generation's operations run one at a time
 * in the order queued (a pin right after an unpin must not race it on
 * another thread); each counts in its ops_pending until it has ended, which
 * keeps the generation open. Residency itself is measured by resident.h.
 *
 * What an operation leaves is recorded in the generation's attributes
 * (pinned, populated); what it means for the state is decided by
 * generation.c (gen_evict_done, gen_residency_checked). A failure to queue
 * is logged, not fatal. Called on the loop thread.
 */
#ifndef WC_PAGES_H
#define WC_PAGES_H

#include <stdint.h>

#include "generation.h"
#include "resident.h"

enum page_op {
	PAGE_PIN,          /* mlock every file; -> pinned = PIN_ALL */
	PAGE_UNPIN,        /* munlock them; -> pinned = PIN_NONE, then the metadata again */
	PAGE_EVICT,        /* unmap here and drop the page cache; -> populated = 0 */
	PAGE_EVICT_SETTLE, /* evict, and again once in-flight readahead has landed */
	PAGE_POPULATE,     /* map every page into the daemon (resident.h), once warm */
	PAGE_CHECK,        /* measure residency; gen_residency_checked() decides */
	PAGE_RESTORE,      /* a generation a warm restart took back: check its index in
			    * full (index_check.h), lock the metadata when its model pins,
			    * map every page; registry_restore_checked() decides */
};

/* Every operation ends with a measure of g's bytes in memory, recorded in
 * g->resident on the loop thread (what status and metrics report), unless a
 * warm-up ended while it ran: that one's figure is newer (warm_done). */

/* Queues op on g's pages behind any queued or running one. */
void pages_queue(struct registry *r, struct generation *g, enum page_op op);

/* Removes evictions queued behind the running operation (the running one
 * cannot be recalled). Returns 1 when an eviction is the one running. */
int pages_drop_queued_evictions(struct generation *g);

/* Locks the index and each file's headers (everything before its first
 * tensor's data), which every attach and lookup touches; on the loop (the
 * metadata is small), for a generation this process compiled (a restored
 * one does it in PAGE_RESTORE). -> pinned = PIN_METADATA. */
void pages_pin_metadata(struct generation *g);

/* Bytes of g's files in memory, by resident.h's first true method
 * (*how may be NULL); a file no method can measure counts as 0. */
uint64_t pages_resident(const struct generation *g, enum resident_method *how);

#endif
