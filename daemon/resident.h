/*
 * resident.h: how much of a model file is in memory, and keeping it there.
 *
 * The daemon runs as its own user and usually reads model files that root
 * or a deployer owns. For such a file the kernel answers the obvious
 * questions falsely or not at all: cachestat(2) fails with EPERM, and
 * mincore(2) reports every page resident (Linux 5.2 and later, to stop
 * side channels). So residency is measured in the first way that is true:
 *
 *   1. cachestat(2) on the file: the page cache itself (Linux 6.5+, and
 *      only for a file the daemon owns or may write, or as root);
 *   2. mincore(2) on the daemon's mapping, where the kernel answers
 *      truthfully (the same permission rule, for kernels before 6.5);
 *   3. otherwise the pages present in the daemon's own page tables
 *      (/proc/self/pagemap), which is exact once the daemon has mapped every
 *      page of a warm generation (resident_populate) and a lower bound before.
 *
 * Mapping every page has a second purpose: a page some process maps cannot
 * be dropped by posix_fadvise(POSIX_FADV_DONTNEED), so a client holding a
 * read-only descriptor can no longer empty the cache of a model it may
 * attach. Only memory pressure (or `wcachectl evict`, which unmaps first)
 * takes such pages away; the daemon notices and warms again
 * (registry_check_residency).
 *
 * Every function here may block on I/O or walk page tables in proportion to
 * the file's size: call them off the event loop, except where a caller
 * accepts that cost (status on demand). Thread-safe.
 */
#ifndef WC_RESIDENT_H
#define WC_RESIDENT_H

#include <stdint.h>

#include "file.h"

enum resident_method {
	RESIDENT_CACHESTAT,
	RESIDENT_MINCORE,
	RESIDENT_MAPPED,
};

/* Bytes of f in memory, by the first true method (above); *how (may be NULL)
 * says which one answered. Returns 0, or -errno when none could. */
int resident_bytes(const struct wc_file *f, uint64_t *out, enum resident_method *how);

/* "cachestat", "mincore" or "mapped". */
const char *resident_method_name(enum resident_method how);

/* Maps every page of f into the daemon's page tables
 * (madvise(MADV_POPULATE_READ), which reads what is not resident and never
 * raises SIGBUS on a truncated file). Returns 0, -EINVAL before Linux 5.14,
 * or another -errno (-EFAULT: the file is shorter than its mapping). */
int resident_populate(const struct wc_file *f);

#endif
