/*
 * resident.c: residency of model files, true for a daemon that does not own
 * them (see resident.h for the three methods and why).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "resident.h"
#include "warm.h"

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
	if ((err = warm_cached_bytes(f->fd, 0, f->size, &n, NULL)) == 0) {
		m = RESIDENT_CACHESTAT;
	} else if (mincore_is_true(f) &&
		(err = warm_resident_bytes(f->base, (size_t)f->size, &n)) == 0) {
		m = RESIDENT_MINCORE;
	} else if ((err = mapped_bytes(f->base, f->size, &n)) == 0) {
		m = RESIDENT_MAPPED;
	} else {
		return err;
	}
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
