/*
 * restore_internal.h: what the warm restart's files share (restore.c takes
 * the store back, restore_store.c keeps it in step). Not for other
 * modules: they use restore.h.
 */
#ifndef WC_RESTORE_INTERNAL_H
#define WC_RESTORE_INTERNAL_H

#include <stdint.h>
#include <sys/stat.h>

struct restore_state {
	/* Between restore_take() and restore_finish(): nothing is stored, so
	 * that the untaken entries are removed before new ones go in. */
	int restoring;
	int status_stored;     /* the manager has the status page */
	uint64_t described;    /* describe_hash() of the stored description, 0: none */
	int desc_in_store;     /* a description is in the store: remove it before the next */
};

/* restore_store.c: one per process, as the manager's store is. */
extern struct restore_state restore_state;

/* restore.c: st's mtime in nanoseconds, as the description records it;
 * times past the year 2262 (or before 1678) saturate. */
int64_t restore_mtime_ns(const struct stat *st);

#endif
