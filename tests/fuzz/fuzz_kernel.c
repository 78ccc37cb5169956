/*
 * fuzz_kernel.c: libFuzzer harness for the parsers of what the kernel and
 * the service manager write for wcached to read: /proc/self/cgroup and
 * /proc/self/mountinfo as memlimit.c reads them, mountinfo as fstype.c
 * reads it, cgroup limit files (memory.max, memory.high,
 * memory.limit_in_bytes) and v1's memory.stat, /proc/self/status
 * (resident.c) and $FDSTORE (restore.c). A hostile container runtime, a
 * FUSE mount point of odd bytes or a future kernel can make them weird.
 *
 * Input: a byte whose low three bits pick the parser (seeds begin with an
 * ASCII digit: '0' is 0x30), then the file's content:
 *   0 /proc/self/cgroup          memlimit_parse_cgroups()
 *   1 /proc/self/mountinfo       memlimit_parse_mounts(), both hierarchies
 *                                found (in cgroup "/")
 *   2 /proc/self/mountinfo       fstype_mounts_add()
 *   3 memory.max and the like    memlimit_parse_limit(), no key
 *   4 memory.stat                memlimit_parse_limit(), key
 *                                "hierarchical_memory_limit"
 *   5 /proc/self/status          resident_status_parse()
 *   6 $FDSTORE (to the first NUL, 4096 bytes at most)
 *                                restore_store_max()
 *   7 /proc/self/mountinfo       memlimit_parse_mounts(), no hierarchy
 *                                found
 *
 * Properties checked, beyond "no crash, no leak, no out-of-bounds access":
 *   - the file given whole and given line by line, as the daemon's readers
 *     give it (getline(3): each line with its newline), parse the same;
 *   - a cgroup is NUL-terminated, no longer than the input, one of its
 *     lines' bytes (the last "0::" line's rest for v2, per this file's own
 *     reading); nothing is found, and no mount point set, that no line
 *     names;
 *   - a mount point and its root are NUL-terminated and shorter than the
 *     input, set only for a hierarchy found, and bytes of the input where
 *     the input has no escape ('\');
 *   - the mount table has at most one entry per line, a terminated
 *     non-empty type name each, and fstype_mounts_find() answers for a
 *     device its first entry;
 *   - a limit is decided by the first line (memory.max) or the first "KEY "
 *     line (memory.stat) and is what this file's own digit loop reads
 *     there: a decimal number below MEMLIMIT_NO_LIMIT, else 0 ("none");
 *   - a status field taken is a number the text has where the kernel puts
 *     it: after the name, blanks, then a digit (a hex digit for CapEff);
 *     VmLck is whole kB, Seccomp 0 to 2, ipc_lock 0 or 1;
 *   - $FDSTORE is the limit when it is all digits (capped at
 *     FDSTORE_MAX_FDS), else FDSTORE_MAX_FDS.
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdstore.h"
#include "fstype.h"
#include "memlimit.h"
#include "resident.h"
#include "restore.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KEY "hierarchical_memory_limit"

/* The input as one terminated string per line, as the parsers see it (a
 * NUL ends a line early): l->line[i], l->n of them. */
struct lines {
	char *text;
	char **line;
	size_t n;
};

static void
lines_split(const char *text, size_t len, struct lines *l)
{
	size_t at = 0;

	l->text = malloc(len + 1);
	l->line = malloc((len + 1) * sizeof(*l->line));
	CHECK(l->text != NULL && l->line != NULL);
	memcpy(l->text, text, len);
	l->text[len] = '\0';
	l->n = 0;
	while (at < len) {
		char *nl = memchr(l->text + at, '\n', len - at);

		l->line[l->n++] = l->text + at;
		if (nl == NULL)
			break;
		*nl = '\0';
		at = (size_t)(nl - l->text) + 1;
	}
}

static void
lines_free(struct lines *l)
{
	free(l->text);
	free(l->line);
}

/* The length of the line getline(3) reads at text + at (len bytes in
 * all): up to and with its newline. The readers give the parsers the file
 * so, line by line. */
static size_t
getline_len(const char *text, size_t len, size_t at)
{
	const char *nl = memchr(text + at, '\n', len - at);

	return nl != NULL ? (size_t)(nl - (text + at)) + 1 : len - at;
}

/* Are a and b the same filesystem? (Members: padding may differ.) */
static bool
same_fs(const struct fs_info *a, const struct fs_info *b)
{
	return a->magic == b->magic && strcmp(a->name, b->name) == 0 && a->remote == b->remote;
}

/* Is s terminated within cap bytes? */
static bool
terminated(const char *s, size_t cap)
{
	return memchr(s, '\0', cap) != NULL;
}

static void
check_cgroups(const char *text, size_t len)
{
	struct memlimit_hierarchy *h = calloc(4, sizeof(*h));
	const char *want_v2 = NULL;
	struct lines l;

	CHECK(h != NULL);
	CHECK(memlimit_parse_cgroups(text, len, &h[0], &h[1]) == 0);
	for (size_t at = 0, n; at < len; at += n) {
		n = getline_len(text, len, at);
		CHECK(memlimit_parse_cgroups(text + at, n, &h[2], &h[3]) == 0);
	}
	CHECK(memcmp(&h[0], &h[2], 2 * sizeof(*h)) == 0);
	lines_split(text, len, &l);
	for (size_t i = 0; i < l.n; i++)
		if (strncmp(l.line[i], "0::", 3) == 0)
			want_v2 = l.line[i] + 3;
	CHECK(h[0].found == (want_v2 != NULL));
	if (want_v2 != NULL)
		CHECK(strncmp(h[0].cgroup, want_v2, sizeof(h[0].cgroup) - 1) == 0);
	for (int i = 0; i < 2; i++) {
		size_t n;

		CHECK(terminated(h[i].cgroup, sizeof(h[i].cgroup)));
		n = strlen(h[i].cgroup);
		CHECK(n <= len);
		CHECK(h[i].found || n == 0);
		CHECK(n == 0 || memmem(text, len, h[i].cgroup, n) != NULL);
		CHECK(h[i].root[0] == '\0' && h[i].mountpoint[0] == '\0');
	}
	lines_free(&l);
	free(h);
}

static void
check_mounts(const char *text, size_t len, bool found)
{
	struct memlimit_hierarchy *h = calloc(4, sizeof(*h));

	CHECK(h != NULL);
	for (int i = 0; i < 4; i++) {
		h[i].found = found;
		strcpy(h[i].cgroup, "/");
	}
	CHECK(memlimit_parse_mounts(text, len, &h[0], &h[1]) == 0);
	for (size_t at = 0, n; at < len; at += n) {
		n = getline_len(text, len, at);
		CHECK(memlimit_parse_mounts(text + at, n, &h[2], &h[3]) == 0);
	}
	CHECK(memcmp(&h[0], &h[2], 2 * sizeof(*h)) == 0);
	for (int i = 0; i < 2; i++) {
		size_t mn, rn;

		CHECK(h[i].found == found && strcmp(h[i].cgroup, "/") == 0);
		CHECK(terminated(h[i].mountpoint, sizeof(h[i].mountpoint)));
		CHECK(terminated(h[i].root, sizeof(h[i].root)));
		mn = strlen(h[i].mountpoint);
		rn = strlen(h[i].root);
		CHECK(mn < len || mn == 0);
		CHECK(rn < len || rn == 0);
		if (!found)
			CHECK(mn == 0 && rn == 0);
		if (mn == 0)
			continue;
		CHECK(memmem(text, len, i == 0 ? "cgroup2" : "memory", i == 0 ? 7 : 6) != NULL);
		if (memchr(text, '\\', len) == NULL) {
			CHECK(memmem(text, len, h[i].mountpoint, mn) != NULL);
			CHECK(rn == 0 || memmem(text, len, h[i].root, rn) != NULL);
		}
	}
	free(h);
}

static void
check_mount_table(const char *text, size_t len)
{
	struct fs_mounts whole = { 0 }, lines = { 0 };
	size_t newlines = 0;

	CHECK(fstype_mounts_add(&whole, text, len) == 0);
	for (size_t at = 0, n; at < len; at += n) {
		n = getline_len(text, len, at);
		CHECK(fstype_mounts_add(&lines, text + at, n) == 0);
	}
	CHECK(whole.n == lines.n && whole.n <= whole.cap);
	for (size_t i = 0; i < whole.n; i++)
		CHECK(whole.mounts[i].dev == lines.mounts[i].dev &&
			same_fs(&whole.mounts[i].fs, &lines.mounts[i].fs));
	for (size_t i = 0; i < len; i++)
		newlines += text[i] == '\n';
	CHECK(whole.n <= newlines + 1);
	for (size_t i = 0; i < whole.n; i++) {
		const struct fs_mount *m = &whole.mounts[i];
		struct fs_info fs;
		size_t first = 0;

		CHECK(terminated(m->fs.name, sizeof(m->fs.name)) && m->fs.name[0] != '\0');
		while (whole.mounts[first].dev != m->dev)
			first++;
		CHECK(fstype_mounts_find(&whole, m->dev, &fs) == 0);
		CHECK(same_fs(&fs, &whole.mounts[first].fs));
	}
	fstype_mounts_free(&whole);
	fstype_mounts_free(&lines);
}

/* This file's reading of a limit line's value: digits to the end, below
 * MEMLIMIT_NO_LIMIT, else 0. */
static uint64_t
oracle_limit(const char *s)
{
	uint64_t v = 0;

	if (*s == '\0')
		return 0;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9')
			return 0;
		if (__builtin_mul_overflow(v, 10, &v) ||
			__builtin_add_overflow(v, (uint64_t)(*s - '0'), &v) || v >= MEMLIMIT_NO_LIMIT)
			return 0;
	}
	return v;
}

static void
check_limit(const char *text, size_t len, const char *key)
{
	uint64_t v = 12345, by_line = 12345;
	int r = memlimit_parse_limit(text, len, key, &v), r_line = 0;
	size_t klen = key != NULL ? strlen(key) : 0;
	const char *decides = NULL;
	struct lines l;

	CHECK(r == 0 || r == 1);
	CHECK(r == 1 || v == 12345);
	/* The reader stops at the line that decides. */
	for (size_t at = 0, n; at < len && r_line == 0; at += n) {
		n = getline_len(text, len, at);
		r_line = memlimit_parse_limit(text + at, n, key, &by_line);
		CHECK(r_line == 0 || r_line == 1);
	}
	CHECK(r_line == r && by_line == v);
	lines_split(text, len, &l);
	for (size_t i = 0; i < l.n && decides == NULL; i++)
		if (key == NULL)
			decides = l.line[i];
		else if (strncmp(l.line[i], key, klen) == 0 && l.line[i][klen] == ' ')
			decides = l.line[i] + klen + 1;
	CHECK(r == (decides != NULL));
	if (r == 1)
		CHECK(v == oracle_limit(decides) && v < MEMLIMIT_NO_LIMIT);
	lines_free(&l);
}

/* Does the first line of text that starts with name hold, after blanks,
 * a digit of base? */
static bool
field_is_number(const char *text, const char *name, int base)
{
	struct lines l;
	bool yes = false;

	lines_split(text, strlen(text), &l);
	for (size_t i = 0; i < l.n; i++)
		if (strncmp(l.line[i], name, strlen(name)) == 0) {
			const char *s = l.line[i] + strlen(name);

			s += strspn(s, " \t");
			yes = base == 16 ? isxdigit((unsigned char)*s) : isdigit((unsigned char)*s);
			break;
		}
	lines_free(&l);
	return yes;
}

static void
check_status(const char *text, size_t len)
{
	struct resident_refusal r = { .seccomp = -1 };
	char *copy = malloc(len + 1);

	CHECK(copy != NULL);
	memcpy(copy, text, len);
	copy[len] = '\0';
	CHECK(resident_status_parse(text, len, &r) == 0);
	CHECK(r.seccomp >= -1 && r.seccomp <= 2);
	CHECK(r.ipc_lock == 0 || r.ipc_lock == 1);
	CHECK(r.locked_known == 0 || r.locked_known == 1);
	CHECK(r.locked % 1024 == 0 && (r.locked_known || r.locked == 0));
	if (r.locked_known)
		CHECK(field_is_number(copy, "VmLck:", 10));
	if (r.ipc_lock)
		CHECK(field_is_number(copy, "CapEff:", 16));
	if (r.seccomp != -1)
		CHECK(field_is_number(copy, "Seccomp:", 10));
	free(copy);
}

static void
check_fdstore(const char *text, size_t len)
{
	/* putenv(3) of one buffer: setenv(3) would keep every value. */
	static char env[sizeof("FDSTORE=") + 4096];
	const char *value = env + sizeof("FDSTORE=") - 1;
	uint64_t want = 0;
	bool digits;

	snprintf(env, sizeof(env), "FDSTORE=%.*s", (int)(len < 4096 ? len : 4096), text);
	digits = value[0] != '\0';
	for (const char *p = value; *p != '\0'; p++) {
		if (*p < '0' || *p > '9') {
			digits = false;
			break;
		}
		if (want < FDSTORE_MAX_FDS)
			want = want * 10 + (uint64_t)(*p - '0');
	}
	if (!digits || want > FDSTORE_MAX_FDS)
		want = FDSTORE_MAX_FDS;
	CHECK(putenv(env) == 0);
	CHECK(restore_store_max() == want);
	unsetenv("FDSTORE");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data + 1;
	size_t len;

	if (size < 1)
		return 0;
	len = size - 1;
	switch (data[0] & 7) {
	case 0:
		check_cgroups(text, len);
		break;
	case 1:
		check_mounts(text, len, true);
		break;
	case 2:
		check_mount_table(text, len);
		break;
	case 3:
		check_limit(text, len, NULL);
		break;
	case 4:
		check_limit(text, len, KEY);
		break;
	case 5:
		check_status(text, len);
		break;
	case 6:
		check_fdstore(text, len);
		break;
	default:
		check_mounts(text, len, false);
		break;
	}
	return 0;
}
