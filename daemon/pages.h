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
 * (pinned, populated); what it means for the state is decided above, by
 * whoever queued it: each operation carries the hooks (struct pages_hooks)
 * through which its end is reported, exactly once, on the loop. This module
 * reads the generation it is given (generation.h) and calls nothing above
 * it: not generation.c, not the registry, not the warm restart. A failure
 * to queue is logged, not fatal. Called on the loop thread.
 */
#ifndef WC_PAGES_H
#define WC_PAGES_H

#include <stdint.h>
#include <sys/stat.h>

#include "resident.h"

struct generation; /* generation.h */
struct registry;   /* registry.h */

enum page_op {
	PAGE_PIN,          /* mlock every file; -> pinned = PIN_ALL */
	PAGE_UNPIN,        /* munlock them and the index, lock the metadata again when the
			    * model pins it; -> pinned = PIN_NONE, or PIN_METADATA */
	PAGE_EVICT,        /* unmap here and drop the page cache; -> populated = 0 */
	PAGE_EVICT_SETTLE, /* evict, and again once in-flight readahead has landed */
	PAGE_POPULATE,     /* map every page into the daemon (resident.h), once warm */
	PAGE_CHECK,        /* measure residency; the done hook decides */
	PAGE_RESTORE,      /* a generation a warm restart took back: check its index in
			    * full (index_check.h), lock the metadata when its model pins,
			    * map every page; the done hook decides */
	PAGE_PIN_METADATA, /* lock the index and each file's headers (all before its
			    * first tensor's data), which every attach and lookup
			    * touches: a generation this process has just compiled,
			    * whose model pins; -> pinned = PIN_METADATA once locked,
			    * not before. Off the loop: a header not in memory is read
			    * (from a remote server, for a model served where it lies).
			    * A restored generation locks in PAGE_RESTORE; PAGE_UNPIN
			    * and a refused PAGE_PIN lock them again. */
};

/* How an operation ended, for its done hook (valid during the call). */
struct pages_result {
	enum page_op op;
	int cancelled;        /* libuv cancelled it: nothing ran */
	uint64_t resident;    /* bytes of g in memory once it ended */
	int check_err;        /* PAGE_RESTORE: 0, or why the index check failed */
	const char *message;  /* PAGE_RESTORE: that failure's message */
	const char *written;  /* PAGE_CHECK: a file written in place since it was
				 opened (its path, g's), or NULL */
	int relinked;         /* PAGE_CHECK, none written: file relinked_i moved only its
				 link count and ctime (file_links_moved), relinked_st its
				 fstat then */
	size_t relinked_i;
	struct stat relinked_st;
};

/* What the module that queues an operation is told, on the loop thread. */
struct pages_hooks {
	/* As the operation starts: is g still its model's current or pending
	 * generation? (PAGE_RESTORE maps every page only then.) */
	int (*live)(const struct generation *g);
	/* Once it ended, after its outcome is recorded in g and the next
	 * queued operation of g has started: called exactly once per
	 * operation that ran or was cancelled. g is kept open until the call
	 * returns; the hook decides whether to free it (gen_maybe_free). */
	void (*done)(struct registry *r, struct generation *g, const struct pages_result *res);
};

/* Every operation ends with a measure of g's bytes in memory, recorded in
 * g->resident on the loop thread (what status and metrics report), unless a
 * warm-up ended while it ran: that one's figure is newer (warm_done). */

/* Queues op on g's pages behind any queued or running one; hooks (static,
 * not copied) report its end. A pin, unpin, evict, check or populate asked
 * while the same one (same hooks) is the last queued and has not started
 * is that one: no second operation, no second report. */
void pages_queue(struct registry *r, struct generation *g, enum page_op op,
	const struct pages_hooks *hooks);

/* Removes evictions queued behind the running operation (the running one
 * cannot be recalled); their done hooks are not called. Returns 1 when an
 * eviction is the one running. */
int pages_drop_queued_evictions(struct generation *g);

/* Whether an eviction of g runs or waits in its queue. */
int pages_evicting(const struct generation *g);

/* Bytes of g's files in memory, by resident.h's first true method
 * (*how may be NULL); a file no method can measure counts as 0. */
uint64_t pages_resident(const struct generation *g, enum resident_method *how);

#endif
