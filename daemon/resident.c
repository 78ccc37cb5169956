/*
 * resident.c: residency of model files, true for a daemon that does not own
 * them (see resident.h for the three methods and why).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

		if (madvise((void *)(uintptr_t)(f->base + off), (size_t)len,
			MADV_POPULATE_READ) != 0)
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

#define CAP_IPC_LOCK_BIT 14 /* linux/capability.h's CAP_IPC_LOCK */

/* Where the value of field name ("VmLck:") starts in /proc/self/status
 * text: past the blanks after name on the first line that starts with it;
 * NULL when no line does. */
static const char *
status_value(const char *text, const char *name)
{
	size_t len = strlen(name);

	for (const char *line = text; line != NULL && *line != '\0';) {
		const char *next = strchr(line, '\n');

		if (strncmp(line, name, len) == 0)
			return line + len + strspn(line + len, " \t");
		line = next != NULL ? next + 1 : NULL;
	}
	return NULL;
}

/* The decimal value of field name: 1 with it in *out when the first line
 * that starts with name has it as the kernel writes it (blanks, then
 * digits: no sign, nothing from the next line), else 0. */
static int
status_decimal(const char *text, const char *name, uint64_t *out)
{
	const char *s = status_value(text, name);
	char *end;

	if (s == NULL || !isdigit((unsigned char)*s))
		return 0;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno == 0;
}

#define CAP_HEX_DIGITS 16 /* a kernel_cap_t, 64 bits */

/* The capability set of field name ("CapEff:"): 1 with it in *out when
 * the first line that starts with name has it exactly as the kernel writes
 * it (fs/proc/array.c render_cap_t: 16 lowercase hex digits, then the end
 * of the line), else 0. strtoull(3) would take "0x4000", "4000" or
 * "-1" too, none of which the kernel writes; a wrong "yes" there would
 * make an ENOMEM refusal say that CAP_IPC_LOCK lifts RLIMIT_MEMLOCK and
 * leave out the advice to raise it. */
static int
status_caps(const char *text, const char *name, uint64_t *out)
{
	static const char hex[] = "0123456789abcdef";
	const char *s = status_value(text, name), *d;
	uint64_t v = 0;

	if (s == NULL)
		return 0;
	for (int i = 0; i < CAP_HEX_DIGITS; i++) {
		if (s[i] == '\0' || (d = strchr(hex, s[i])) == NULL)
			return 0;
		v = v << 4 | (uint64_t)(d - hex);
	}
	if (s[CAP_HEX_DIGITS] != '\n' && s[CAP_HEX_DIGITS] != '\0')
		return 0;
	*out = v;
	return 1;
}

int
resident_status_parse(const char *text, size_t len, struct resident_refusal *out)
{
	char *copy;
	uint64_t v;

	if (len == SIZE_MAX || (copy = malloc(len + 1)) == NULL)
		return -ENOMEM;
	if (len > 0)
		memcpy(copy, text, len);
	copy[len] = '\0';
	if (status_decimal(copy, "VmLck:", &v) && v <= UINT64_MAX / 1024) {
		out->locked_known = 1;
		out->locked = v * 1024; /* in kB */
	}
	if (status_caps(copy, "CapEff:", &v))
		out->ipc_lock = (int)((v >> CAP_IPC_LOCK_BIT) & 1);
	if (status_decimal(copy, "Seccomp:", &v) && v <= 2)
		out->seccomp = (int)v;
	free(copy);
	return 0;
}

void
resident_refusal_read(int err, uint64_t bytes, struct resident_refusal *out)
{
	char text[8192];
	size_t used = 0;
	struct rlimit rl;
	int fd;

	memset(out, 0, sizeof(*out));
	out->err = err;
	out->bytes = bytes;
	out->seccomp = -1;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		out->limit_known = 1;
		out->limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
	}
	if ((fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC)) < 0)
		return;
	/* 8191 bytes at most, as when the text was parsed in place. */
	while (used < sizeof(text) - 1) {
		ssize_t n = read(fd, text + used, sizeof(text) - 1 - used);

		if (n <= 0)
			break;
		used += (size_t)n;
	}
	close(fd);
	(void)resident_status_parse(text, used, out);
}

/* The name of an errno mlock(2) returns ("EPERM"), or NULL. */
static const char *
errno_name(int err)
{
	switch (err) {
	case EPERM:
		return "EPERM";
	case ENOMEM:
		return "ENOMEM";
	case EAGAIN:
		return "EAGAIN";
	case EINVAL:
		return "EINVAL";
	default:
		return NULL;
	}
}

/* RLIMIT_MEMLOCK of r in words: "unlimited", "8388608 bytes". */
static void
limit_words(const struct resident_refusal *r, char *buf, size_t cap)
{
	if (!r->limit_known)
		snprintf(buf, cap, "unknown");
	else if (r->limit == UINT64_MAX)
		snprintf(buf, cap, "unlimited");
	else
		snprintf(buf, cap, "%" PRIu64 " bytes", r->limit);
}

void
resident_refusal_cause(const struct resident_refusal *r, char *buf, size_t cap)
{
	const char *name = errno_name(-r->err);
	char limit[64];
	uint64_t need;

	if (cap == 0)
		return;
	limit_words(r, limit, sizeof(limit));
	if (r->err == -EPERM && r->limit_known && r->limit == 0 && !r->ipc_lock) {
		snprintf(buf, cap, "mlock: EPERM: RLIMIT_MEMLOCK is 0 and wcached lacks "
			 "CAP_IPC_LOCK; raise LimitMEMLOCK= in wcached.service (or ulimit -l), "
			 "or use pin = none");
	} else if (r->err == -EPERM && r->seccomp == 0) {
		snprintf(buf, cap, "mlock: EPERM although RLIMIT_MEMLOCK is %s and no seccomp "
			 "filter applies to wcached: a security module refused it; or use "
			 "pin = none", limit);
	} else if (r->err == -EPERM) {
		snprintf(buf, cap, "mlock: EPERM: forbidden by a seccomp filter (the unit's "
			 "SystemCallFilter=, or a container's: systemd-nspawn allows mlock only "
			 "with CAP_IPC_LOCK), not by RLIMIT_MEMLOCK (%s); allow @memlock, or use "
			 "pin = none", limit);
	} else if (r->err == -ENOMEM && r->limit_known && r->limit != UINT64_MAX &&
		   !r->ipc_lock && (!r->locked_known || r->locked > r->limit ||
				    r->bytes > r->limit - r->locked)) {
		if (__builtin_add_overflow(r->locked, r->bytes, &need))
			need = UINT64_MAX;
		if (r->locked_known)
			snprintf(buf, cap, "mlock: ENOMEM: RLIMIT_MEMLOCK is %s, %" PRIu64
				 " bytes were locked and %" PRIu64 " more asked; raise "
				 "LimitMEMLOCK= in wcached.service (or ulimit -l) to at least "
				 "%" PRIu64 "M, or pin less", limit, r->locked, r->bytes,
				need / (1u << 20) + (need % (1u << 20) != 0));
		else
			snprintf(buf, cap, "mlock: ENOMEM: RLIMIT_MEMLOCK is %s, %" PRIu64
				 " bytes asked; raise LimitMEMLOCK= in wcached.service (or "
				 "ulimit -l), or pin less", limit, r->bytes);
	} else if (r->err == -ENOMEM) {
		if (r->ipc_lock)
			snprintf(limit, sizeof(limit), "lifted by CAP_IPC_LOCK");
		snprintf(buf, cap, "mlock: ENOMEM, not from RLIMIT_MEMLOCK (%s): the kernel "
			 "could not lock the range (out of memory or of mappings)", limit);
	} else if (r->err == -EAGAIN) {
		snprintf(buf, cap, "mlock: EAGAIN: part of the range could not be locked "
			 "(memory is short); pin again later, or pin less");
	} else if (name != NULL) {
		snprintf(buf, cap, "mlock: %s: %s", name, strerror(-r->err));
	} else {
		snprintf(buf, cap, "mlock: errno %d: %s", -r->err, strerror(-r->err));
	}
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
