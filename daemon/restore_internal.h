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
	uint64_t last_artifact; /* the highest n in a derived artifact's names in the store
				   (wc-<slot>-d<n>-a): the next one stored takes n + 1 */
};

/* restore_store.c: one per process, as the manager's store is. */
extern struct restore_state restore_state;

struct derive_stored;
struct generation;
struct model_entry;
struct model_source;
struct registry;

/* restore_adopt.c: lists a derived artifact of m taken back from the store,
 * whose pieces restore.c checked: src (the artifact memfd, opened and
 * validated by its reader) and the sealed index_fd, as the artifact
 * a->key of generation a->source (a->gen is ignored), READY
 * (derive_adopt). Takes src and index_fd on success only; 0 and *out (the
 * artifact's generation, derive.c's), or -errno with the reason in
 * error_get(). */
int restore_adopt_artifact(struct registry *r, struct model_entry *m,
	const struct derive_stored *a, struct model_source *src, int index_fd,
	size_t index_size, struct generation **out);

/* restore.c: st's mtime in nanoseconds, as the description records it;
 * times past the year 2262 (or before 1678) saturate. */
int64_t restore_mtime_ns(const struct stat *st);

#endif
