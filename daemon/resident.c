/*
 * resident.c: residency of model files, true for a daemon that does not own
 * them (see resident.h for the three methods and why).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "resident.h"

static size_t
page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define PAGEMAP_PRESENT (1ull << 63)
#define PAGEMAP_BATCH 2048           /* entries per pread: 8 MiB of 4 KiB pages */
#define POPULATE_CHUNK (64ull << 20) /* bytes per madvise, so errors name a place */

/*
 * Would the kernel answer mincore(2) on a mapping of this file truthfully?
 * It does for the file's owner, a process that may write it, and one with
 * CAP_FOWNER (root here, as the tests and a root-run daemon are).
 */
static int
mincore_is_true(const struct wc_file *f)
{
	struct stat st;

	if (fstat(f->fd, &st) != 0)
		return 0;
	return geteuid() == 0 || st.st_uid == geteuid() || (st.st_mode & S_IWOTH) != 0 ||
		((st.st_mode & S_IWGRP) != 0 && st.st_gid == getegid());
}

/* Bytes of [base, base + len) present in this process's page tables. */
static int
mapped_bytes(const void *base, uint64_t len, uint64_t *out)
{
	uint64_t entries[PAGEMAP_BATCH];
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), first = (uintptr_t)base / page;
	uint64_t pages = (len + page - 1) / page, total = 0;
	/* Opened per call: no descriptor outlives the measurement. */
	int pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC), err = 0;

	if (pagemap_fd < 0)
		return -errno;
	for (uint64_t done = 0; done < pages;) {
		uint64_t n = pages - done < PAGEMAP_BATCH ? pages - done : PAGEMAP_BATCH;
		ssize_t got = pread(pagemap_fd, entries, (size_t)(n * sizeof(entries[0])),
			(off_t)((first + done) * sizeof(entries[0])));

		if (got < (ssize_t)sizeof(entries[0])) {
			err = got < 0 ? -errno : -EIO;
			break;
		}
		n = (uint64_t)got / sizeof(entries[0]);
		for (uint64_t i = 0; i < n; i++)
			if (entries[i] & PAGEMAP_PRESENT)
				total += page;
		done += n;
	}
	close(pagemap_fd);
	if (err == 0)
		*out = total < len ? total : len; /* the last page may be partial */
	return err;
}

int
resident_bytes(const struct wc_file *f, uint64_t *out, enum resident_method *how)
{
	enum resident_method m;
	uint64_t n = 0;
	int err;

	if (f->size == 0 || f->base == NULL) {
		*out = 0;
		if (how != NULL)
			*how = RESIDENT_CACHESTAT;
		return 0;
	}
	if (resident_cachestat_bytes(f->fd, 0, f->size, &n, NULL) == 0)
		m = RESIDENT_CACHESTAT;
	else if (mincore_is_true(f) && resident_mincore_bytes(f->base, (size_t)f->size, &n) == 0)
		m = RESIDENT_MINCORE;
	else if ((err = mapped_bytes(f->base, f->size, &n)) == 0)
		m = RESIDENT_MAPPED;
	else
		return err;
	*out = n;
	if (how != NULL)
		*how = m;
	return 0;
}

const char *
resident_method_name(enum resident_method how)
{
	return how == RESIDENT_CACHESTAT ? "cachestat" : how == RESIDENT_MINCORE ? "mincore" :
										  "mapped";
}

int
resident_populate(const struct wc_file *f)
{
	for (uint64_t off = 0; f->base != NULL && off < f->size; off += POPULATE_CHUNK) {
		uint64_t len = f->size - off < POPULATE_CHUNK ? f->size - off : POPULATE_CHUNK;

		if (madvise((void *)(uintptr_t)(f->base + off), (size_t)len, MADV_POPULATE_READ) != 0)
			return -errno;
	}
	return 0;
}

/* ---- measures and page-range operations (no pool needed) ---- */

int
resident_mincore_bytes(const void *base, size_t len, uint64_t *out)
{
	enum { VEC = 4096 }; /* pages per mincore call: 16 MiB of 4 KiB pages */
	unsigned char vec[VEC];
	size_t pg = page_size();
	const uint8_t *p = base;
	uint64_t total = 0;
	size_t left = len;

	if (out == NULL || (uintptr_t)base % pg != 0)
		return -EINVAL;
	while (left > 0) {
		size_t span = left < (size_t)VEC * pg ? left : (size_t)VEC * pg;
		size_t pages = (span + pg - 1) / pg;

		if (mincore((void *)(uintptr_t)p, span, vec) != 0)
			return -errno;
		for (size_t i = 0; i < pages; i++) {
			if (vec[i] & 1) {
				size_t in_page = span - i * pg;
				total += in_page < pg ? in_page : pg;
			}
		}
		p += span;
		left -= span;
	}
	*out = total;
	return 0;
}

#ifndef SYS_cachestat
#define SYS_cachestat 451 /* the same number on every architecture */
#endif

/* The kernel's struct cachestat_range and struct cachestat (Linux 6.5
 * uapi/linux/mman.h), spelled here because Debian 12's headers predate it. */
struct resident_cachestat_range {
	uint64_t off;
	uint64_t len;
};

struct resident_cachestat {
	uint64_t nr_cache;
	uint64_t nr_dirty;
	uint64_t nr_writeback;
	uint64_t nr_evicted;
	uint64_t nr_recently_evicted;
};

/* Pages to bytes, saturating, capped at len (when len is not 0) because a
 * partial page counts as the bytes of the range it covers. */
static uint64_t
pages_to_bytes(uint64_t pages, uint64_t len)
{
	uint64_t bytes;

	if (__builtin_mul_overflow(pages, (uint64_t)page_size(), &bytes))
		bytes = UINT64_MAX;
	return len > 0 && bytes > len ? len : bytes;
}

int
resident_cachestat_bytes(int fd, uint64_t offset, uint64_t len, uint64_t *out, uint64_t *evicted)
{
	struct resident_cachestat_range range = {.off = offset, .len = len};
	struct resident_cachestat cs;

	if (out == NULL || fd < 0)
		return -EINVAL;
	memset(&cs, 0, sizeof(cs));
	if (syscall(SYS_cachestat, fd, &range, &cs, 0) != 0)
		return -errno;
	*out = pages_to_bytes(cs.nr_cache, len);
	if (evicted != NULL)
		*evicted = pages_to_bytes(cs.nr_evicted, len);
	return 0;
}

/*
 * mlock(2) and munlock(2) go through syscall(2): AddressSanitizer replaces
 * the libc functions with no-ops that return 0 (because mlockall would lock
 * its shadow memory), which would make a sanitized daemon claim pins it
 * does not hold and hide RLIMIT_MEMLOCK failures from the tests.
 */
int
resident_pin_range(const void *base, size_t len)
{
	return syscall(SYS_mlock, base, len) == 0 ? 0 : -errno;
}

int
resident_unpin_range(const void *base, size_t len)
{
	return syscall(SYS_munlock, base, len) == 0 ? 0 : -errno;
}

int
resident_evict_range(int fd, uint64_t offset, uint64_t len)
{
	int err;

	if (fd < 0 || offset > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX)
		return -EINVAL;
	err = posix_fadvise(fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED);
	return -err;
}
