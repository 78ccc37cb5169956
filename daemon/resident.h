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
 * the file's size: call them off the event loop (pages.c measures after
 * each page operation; status and metrics report that figure). Thread-safe.
 */
#ifndef WC_RESIDENT_H
#define WC_RESIDENT_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"

/* ---- the measures and page-range operations under them ---- */

/*
 * Counts the bytes of [base, base + len) whose pages are resident in memory,
 * with mincore(2) in chunks (bounded vector, no allocation proportional to
 * len). For a MAP_SHARED file mapping this is page-cache residency of the
 * file range, whether or not this process touched the pages. base must be
 * page-aligned; len need not be (the last partial page counts as its bytes).
 * Returns 0 and sets *out, or -errno (-ENOMEM: not all of the range is
 * mapped; -EINVAL: base not aligned). Note: on tmpfs, and on overlay over
 * tmpfs, file pages are always resident.
 */
int resident_mincore_bytes(const void *base, size_t len, uint64_t *out);

/*
 * Same question asked of the file instead of a mapping: bytes of
 * [offset, offset + len) of fd (len 0: to the end of the file) in the page
 * cache, with cachestat(2) (Linux 6.5+; this machine's 6.18 has it).
 * *evicted (if not NULL) receives the bytes of the range the kernel evicted
 * under memory pressure since they were cached (its workingset shadow
 * entries; POSIX_FADV_DONTNEED leaves none): warm pages going missing
 * because the host is short of memory, as opposed to never read. Returns
 * -ENOSYS on older kernels (callers fall back to resident_mincore_bytes), else
 * 0 or -errno.
 */
int resident_cachestat_bytes(int fd, uint64_t offset, uint64_t len, uint64_t *out,
	uint64_t *evicted);

/*
 * mlock(2)s [base, base + len) (the model's pages stay resident until
 * resident_unpin_range or unmap). Returns 0 or -errno: -ENOMEM when
 * RLIMIT_MEMLOCK is smaller than what would then be locked, -EPERM when a
 * seccomp filter refuses mlock or the limit is 0 (resident_refusal_read
 * tells which); a process with CAP_IPC_LOCK (root) is not bound by the
 * limit. Locking a file mapping reads any page not yet resident, so warm
 * first. Like mlock, the range is widened to whole pages (base need not be
 * aligned). Pins do not nest: one unpin undoes any number of pins of a page.
 */
int resident_pin_range(const void *base, size_t len);

/*
 * Why mlock(2) refused, as facts read right after the refusal, so that the
 * message names the real cause: EPERM comes from a seccomp filter (the
 * unit's SystemCallFilter=, or a container's: systemd-nspawn allows mlock
 * only to a container with CAP_IPC_LOCK) or from an RLIMIT_MEMLOCK of 0
 * without CAP_IPC_LOCK; ENOMEM from an RLIMIT_MEMLOCK smaller than what is
 * locked plus what was asked.
 */
struct resident_refusal {
	int err;            /* the -errno mlock returned */
	uint64_t bytes;     /* bytes it was asked to lock */
	int limit_known;    /* getrlimit(RLIMIT_MEMLOCK) answered: */
	uint64_t limit;     /* its soft limit in bytes; UINT64_MAX: unlimited */
	int locked_known;   /* /proc/self/status was read: */
	uint64_t locked;    /* VmLck: bytes this process had locked */
	int ipc_lock;       /* CAP_IPC_LOCK is effective: the limit does not apply */
	int seccomp;        /* Seccomp: 0 none, 1 strict, 2 filter; -1 unknown */
};

/* Fills *out for a lock of bytes that failed with err (-errno): the
 * limit, the bytes locked, the capability and the seccomp mode. Call it
 * right after the refusal, on the thread that made it (it reads
 * /proc/self/status). */
void resident_refusal_read(int err, uint64_t bytes, struct resident_refusal *out);

/* The facts /proc/self/status gives resident_refusal_read(), from its text
 * (len bytes, not terminated; a NUL ends it early): locked_known and locked
 * from "VmLck:" (kB), ipc_lock from "CapEff:" (16 lowercase hex digits, as
 * the kernel writes them, and nothing else: "0x4000" is not read), seccomp from
 * "Seccomp:" (0 to 2); a field missing or not a number leaves its members
 * as they were. 0, or -ENOMEM when it cannot copy text. The fuzzer
 * (tests/fuzz/fuzz_kernel.c) gives it whole files. */
int resident_status_parse(const char *text, size_t len, struct resident_refusal *out);

/*
 * Writes the cause of r into buf (cap bytes, always terminated), one
 * clause that starts with the errno's name and ends with the advice:
 * "mlock: ENOMEM: RLIMIT_MEMLOCK is 1048576 bytes, 69632 bytes were locked
 * and 67108864 more asked; raise LimitMEMLOCK= in wcached.service (or
 * ulimit -l) to at least 65M, or pin less".
 */
void resident_refusal_cause(const struct resident_refusal *r, char *buf, size_t cap);

/* munlock(2)s the range. Returns 0 or -errno. */
int resident_unpin_range(const void *base, size_t len);

/*
 * Drops the clean, unmapped, unlocked page-cache pages of [offset,
 * offset + len) of fd (len 0: to the end of the file) with
 * posix_fadvise(POSIX_FADV_DONTNEED); for `wcachectl evict` and cold-cache
 * benchmarks. Pages mapped into some process's page tables, locked, or
 * dirty stay; check with resident_mincore_bytes. Returns 0 or -errno.
 */
int resident_evict_range(int fd, uint64_t offset, uint64_t len);

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
