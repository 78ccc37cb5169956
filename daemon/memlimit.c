/*
 * memlimit.c: the memory limit wcached runs under (see memlimit.h).
 */
#include "memlimit.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/decimal.h"
#include "log.h"

#define PATH_CAP MEMLIMIT_PATH_CAP

static FILE *
open_under(const char *root, const char *path)
{
	char full[PATH_CAP * 2];

	if ((size_t)snprintf(full, sizeof(full), "%s%s", root, path) >= sizeof(full))
		return NULL;
	return fopen(full, "re");
}

/* Calls fn on each line of text (len bytes), copied and terminated, its
 * newline cut (a NUL ends it early, as it ends a line getline(3) read),
 * until fn returns nonzero: that value, 0 after the last line, or -ENOMEM. */
static int
each_line(const char *text, size_t len, int (*fn)(char *line, void *arg), void *arg)
{
	char *copy, *end, *next;
	int r = 0;

	if (len == SIZE_MAX || (copy = malloc(len + 1)) == NULL)
		return -ENOMEM;
	if (len > 0)
		memcpy(copy, text, len);
	end = copy + len;
	*end = '\0';
	for (char *line = copy; r == 0 && line < end; line = next) {
		char *nl = memchr(line, '\n', (size_t)(end - line));

		next = nl != NULL ? nl + 1 : end;
		if (nl != NULL)
			*nl = '\0';
		r = fn(line, arg);
	}
	free(copy);
	return r;
}

/* Gives each line of the file at root + path to fn, as each_line() does,
 * until fn says stop; nothing when the file cannot be opened. */
static void
read_lines(const char *root, const char *path, int (*fn)(char *line, void *arg), void *arg)
{
	FILE *f = open_under(root, path);
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (f == NULL)
		return;
	while ((n = getline(&line, &cap, f)) > 0 && each_line(line, (size_t)n, fn, arg) == 0)
		;
	free(line);
	fclose(f);
}

/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void
unescape(char *s)
{
	char *w = s;

	for (const char *r = s; *r != '\0'; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
			r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
}

/* Is word one of the comma-separated words of list? */
static bool
has_word(const char *list, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = list; p != NULL; p = strchr(p, ',')) {
		if (*p == ',')
			p++;
		if (strncmp(p, word, n) == 0 && (p[n] == ',' || p[n] == '\0'))
			return true;
	}
	return false;
}

/* Copies src into dst (cap bytes), cut to fit. */
static void
copy(char *dst, size_t cap, const char *src)
{
	size_t n = strnlen(src, cap - 1);

	memcpy(dst, src, n);
	dst[n] = '\0';
}

#define CUT_MARK "\xe2\x80\xa6" /* "…" */

/* Ends buf (cap bytes, holding a text cut to cap - 1 bytes) in CUT_MARK in
 * place of its last bytes, cut before a UTF-8 character, not inside one. */
static void
mark_cut(char *buf, size_t cap)
{
	size_t at;

	if (cap < sizeof(CUT_MARK))
		return;
	at = cap - sizeof(CUT_MARK);
	while (at > 0 && ((unsigned char)buf[at] & 0xC0) == 0x80)
		at--;
	memcpy(buf + at, CUT_MARK, sizeof(CUT_MARK));
}

/* copy(), but a src too long for dst ends in CUT_MARK there. */
static void
copy_marked(char *dst, size_t cap, const char *src)
{
	copy(dst, cap, src);
	if (src[strlen(dst)] != '\0')
		mark_cut(dst, cap);
}

/* One line of /proc/self/cgroup into the hierarchies h[0] (v2) and h[1]
 * (v1's memory controller). */
static int
cgroup_line(char *line, void *arg)
{
	struct memlimit_hierarchy **h = arg;
	char *a, *b;

	if ((a = strchr(line, ':')) == NULL || (b = strchr(a + 1, ':')) == NULL)
		return 0;
	*a++ = '\0';
	*b++ = '\0';
	if (strcmp(line, "0") == 0 && *a == '\0') {
		copy(h[0]->cgroup, sizeof(h[0]->cgroup), b);
		h[0]->found = true;
	} else if (has_word(a, "memory")) {
		copy(h[1]->cgroup, sizeof(h[1]->cgroup), b);
		h[1]->found = true;
	}
	return 0;
}

int
memlimit_parse_cgroups(const char *text, size_t len, struct memlimit_hierarchy *v2,
	struct memlimit_hierarchy *v1)
{
	return each_line(text, len, cgroup_line, (struct memlimit_hierarchy *[2]){ v2, v1 });
}

/* One line of /proc/self/mountinfo into the hierarchies h[0] (v2) and h[1]
 * (v1). Fields: id parent dev root mountpoint options [optional...] -
 * fstype source superoptions. */
static int
mount_line(char *line, void *arg)
{
	struct memlimit_hierarchy **hs = arg, *h = NULL;
	char *field[6] = { 0 }, *save = NULL, *fstype, *super, *tok;
	int i = 0;

	for (tok = strtok_r(line, " ", &save); tok != NULL && i < 6;
		tok = strtok_r(NULL, " ", &save))
		field[i++] = tok;
	while (tok != NULL && strcmp(tok, "-") != 0)
		tok = strtok_r(NULL, " ", &save);
	if (i < 6 || tok == NULL || (fstype = strtok_r(NULL, " ", &save)) == NULL ||
		strtok_r(NULL, " ", &save) == NULL ||
		(super = strtok_r(NULL, " ", &save)) == NULL)
		return 0;
	if (strcmp(fstype, "cgroup2") == 0)
		h = hs[0];
	else if (strcmp(fstype, "cgroup") == 0 && has_word(super, "memory"))
		h = hs[1];
	/* The first mount of a hierarchy is the one /sys/fs/cgroup shows. */
	if (h == NULL || !h->found || h->mountpoint[0] != '\0')
		return 0;
	unescape(field[3]);
	unescape(field[4]);
	copy(h->root, sizeof(h->root), field[3]);
	copy(h->mountpoint, sizeof(h->mountpoint), field[4]);
	return 0;
}

int
memlimit_parse_mounts(const char *text, size_t len, struct memlimit_hierarchy *v2,
	struct memlimit_hierarchy *v1)
{
	return each_line(text, len, mount_line, (struct memlimit_hierarchy *[2]){ v2, v1 });
}

/* What limit_line() looks for, and what it found. */
struct limit_ask {
	const char *key; /* NULL: the first line */
	uint64_t value;
};

/* One line of a limit file: 1 when it is the line that says the limit
 * (ask->value then set), 0 to go on to the next. */
static int
limit_line(char *line, void *arg)
{
	struct limit_ask *ask = arg;
	const char *s = line;
	char *end;

	ask->value = 0;
	if (ask->key != NULL) {
		size_t klen = strlen(ask->key);

		if (strncmp(line, ask->key, klen) != 0 || line[klen] != ' ')
			return 0;
		s = line + klen + 1;
	}
	if (*s >= '0' && *s <= '9') {
		unsigned long long x = strtoull(s, &end, 10);

		if (*end == '\0')
			ask->value = x >= MEMLIMIT_NO_LIMIT ? 0 : (uint64_t)x;
	}
	return 1;
}

int
memlimit_parse_limit(const char *text, size_t len, const char *key, uint64_t *out)
{
	struct limit_ask ask = { key, 0 };
	int r = each_line(text, len, limit_line, &ask);

	if (r == 1)
		*out = ask.value;
	return r;
}

/* A limit file's value in bytes; 0 when absent, unreadable or unlimited. */
static uint64_t
read_limit(const char *root, const char *dir, const char *file, const char *key)
{
	char path[PATH_CAP * 2];
	struct limit_ask ask = { key, 0 };

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
		return 0;
	read_lines(root, path, limit_line, &ask);
	return ask.value;
}

/* Keeps the smaller limit in out (0 is none): v, read in the cgroup
 * directory root + dir, named cgroup, from its file. */
static void
consider(struct memlimit *out, uint64_t v, enum memlimit_kind kind, const char *cgroup,
	const char *file, const char *root, const char *dir)
{
	if (v == 0 || (out->cgroup != 0 && out->cgroup <= v))
		return;
	out->cgroup = v;
	out->kind = kind;
	copy_marked(out->cgroup_path, sizeof(out->cgroup_path), cgroup);
	copy(out->file, sizeof(out->file), file);
	if ((size_t)snprintf(out->use_file, sizeof(out->use_file), "%s%s/memory.stat", root,
		    dir) >= sizeof(out->use_file))
		out->use_file[0] = '\0';
}

/* h's cgroup as a path under its mount (a container's mount shows a
 * subtree: the part of the cgroup path above it is cut; a cgroup outside
 * the mount is the mount's top). "" is the mount's top. */
static const char *
relative(const struct memlimit_hierarchy *h)
{
	size_t rlen = strlen(h->root);

	if (strcmp(h->root, "/") == 0)
		return strcmp(h->cgroup, "/") == 0 ? "" : h->cgroup;
	if (strncmp(h->cgroup, h->root, rlen) == 0 &&
		(h->cgroup[rlen] == '/' || h->cgroup[rlen] == '\0'))
		return h->cgroup + rlen;
	return "";
}

/* Does path have a ".." component? */
static bool
has_dotdot(const char *path)
{
	for (const char *p = path; (p = strstr(p, "..")) != NULL; p++)
		if ((p == path || p[-1] == '/') && (p[2] == '/' || p[2] == '\0'))
			return true;
	return false;
}

int
memlimit_cgroup_rel(const struct memlimit_hierarchy *h, char *rel, size_t cap)
{
	copy(rel, cap, relative(h));
	return has_dotdot(rel) ? -1 : 0;
}

/*
 * h's cgroup below its mount point into rel (memlimit_cgroup_rel): 0 when
 * its limits can be read there; -ENOENT when the process is in no cgroup of
 * h's hierarchy or the hierarchy is not mounted; -EXDEV when the cgroup's
 * path has a ".." component, which leads outside the mount; -EINVAL when
 * it is not absolute: the kernel writes none, and appended to the mount
 * point it would name a file beside it ("/sys/fs/cgroupx/memory.max").
 */
static int
mounted_rel(const struct memlimit_hierarchy *h, char *rel, size_t cap)
{
	if (!h->found || h->mountpoint[0] == '\0')
		return -ENOENT;
	if (memlimit_cgroup_rel(h, rel, cap) < 0)
		return -EXDEV;
	return rel[0] == '\0' || rel[0] == '/' ? 0 : -EINVAL;
}

/* The cgroup at rel under h's mount, as the kernel names it. */
static void
cgroup_name(char *buf, size_t cap, const struct memlimit_hierarchy *h, const char *rel)
{
	snprintf(buf, cap, "%s%s", strcmp(h->root, "/") == 0 ? "" : h->root, rel);
	if (buf[0] == '\0')
		copy(buf, cap, "/");
}

/* Walks h's cgroup and its ancestors up to the mount's top, keeping the
 * smallest value of file. */
static void
walk(const char *root, const struct memlimit_hierarchy *h, const char *file,
	enum memlimit_kind kind, struct memlimit *out)
{
	char rel[PATH_CAP], dir[PATH_CAP * 2], name[PATH_CAP * 2], *slash;

	if (mounted_rel(h, rel, sizeof(rel)) < 0)
		return;
	for (;;) {
		snprintf(dir, sizeof(dir), "%s%s", h->mountpoint, rel);
		cgroup_name(name, sizeof(name), h, rel);
		consider(out, read_limit(root, dir, file, NULL), kind, name, file, root, dir);
		if ((slash = strrchr(rel, '/')) == NULL)
			break;
		*slash = '\0';
	}
}

/*
 * The cgroup each hierarchy (v2, v1) last had warn_outside() say so of:
 * wcached reads its limit again at every reload (reload.c), and a daemon
 * that stays in such a cgroup is told once in its life, not at every
 * reload. One path a hierarchy, so what is remembered is bounded: a daemon
 * moved to another such cgroup is told again, and moved back, again.
 * memlimit_read() runs on one thread (the start, then the loop's reloads).
 */
static char warned_cgroup[2][PATH_CAP];

/* Warns, unless it was the last of hierarchy i (0: v2, 1: v1) warned of,
 * that h's cgroup has a ".." component: no limit of it is read. */
static void
warn_outside(int i, const struct memlimit_hierarchy *h)
{
	if (strcmp(warned_cgroup[i], h->cgroup) == 0)
		return;
	copy(warned_cgroup[i], sizeof(warned_cgroup[i]), h->cgroup);
	log_warnx("memory: no cgroup %s limit read: cgroup %s has a \"..\" component, which "
		  "leads outside the cgroup mount %s (a cgroup namespace's view of a cgroup "
		  "outside it)", i == 0 ? "v2" : "v1", h->cgroup, h->mountpoint);
}

void
memlimit_read(const char *root, uint64_t ram, struct memlimit *out)
{
	struct memlimit_hierarchy *v2 = calloc(1, sizeof(*v2)), *v1 = calloc(1, sizeof(*v1));
	char rel[PATH_CAP];

	memset(out, 0, sizeof(*out));
	out->ram = ram;
	out->kind = MEMLIMIT_RAM;
	if (v2 != NULL && v1 != NULL) {
		struct memlimit_hierarchy *h[2] = { v2, v1 };

		read_lines(root, "/proc/self/cgroup", cgroup_line, h);
		read_lines(root, "/proc/self/mountinfo", mount_line, h);
		for (int i = 0; i < 2; i++)
			if (mounted_rel(h[i], rel, sizeof(rel)) == -EXDEV)
				warn_outside(i, h[i]);
		walk(root, v2, "memory.max", MEMLIMIT_CGROUP_V2, out);
		/* Above memory.high the kernel reclaims the cgroup's pages and
		 * throttles it: for a page cache, a limit as hard as max
		 * (systemd's MemoryHigh=, Kubernetes' MemoryQoS). */
		walk(root, v2, "memory.high", MEMLIMIT_CGROUP_V2, out);
		walk(root, v1, "memory.limit_in_bytes", MEMLIMIT_CGROUP_V1, out);
		/* v1 counts ancestors this mount may not show. */
		if (mounted_rel(v1, rel, sizeof(rel)) == 0) {
			char dir[PATH_CAP * 2], name[PATH_CAP * 2];

			snprintf(dir, sizeof(dir), "%s%s", v1->mountpoint, rel);
			cgroup_name(name, sizeof(name), v1, rel);
			consider(out,
				read_limit(root, dir, "memory.stat", "hierarchical_memory_limit"),
				MEMLIMIT_CGROUP_V1, name, "hierarchical_memory_limit", root, dir);
		}
	}
	free(v2);
	free(v1);
	out->limit = ram;
	if (out->cgroup != 0 && (ram == 0 || out->cgroup < ram)) {
		out->limit = out->cgroup;
	} else {
		out->kind = MEMLIMIT_RAM;
		if ((size_t)snprintf(out->use_file, sizeof(out->use_file), "%s/proc/meminfo",
			    root) >= sizeof(out->use_file))
			out->use_file[0] = '\0';
	}
}

/* The most keys memlimit_parse_use() reads of one kind's file. */
#define USE_KEYS 8

/* What use_line() looks for (the keys of memlimit_parse_use()'s kind), and
 * what it found. */
struct use_ask {
	const char *key[USE_KEYS]; /* NULL past the last */
	int meminfo;               /* "KEY: N kB" lines */
	int seen[USE_KEYS];        /* the first line of key[i] was read */
	int found[USE_KEYS];       /* and it said value[i] */
	uint64_t value[USE_KEYS];
};

/* A decimal number of 64 bits at *s (decimal_u64 of its digits), which
 * then points past it: 1, or 0 where there is none or it does not fit. */
static int
decimal64(const char **s, uint64_t *out)
{
	size_t n = strspn(*s, "0123456789");

	if (decimal_u64(*s, n, out) < 0)
		return 0;
	*s += n;
	return 1;
}

/* One line of memory.stat or /proc/meminfo: its value where it is the
 * first line of one of ask's keys; 0 to go on. */
static int
use_line(char *line, void *arg)
{
	struct use_ask *ask = arg;

	for (int i = 0; i < USE_KEYS && ask->key[i] != NULL; i++) {
		size_t klen = strlen(ask->key[i]);
		const char *s = line + klen;
		uint64_t v;

		if (ask->seen[i] || strncmp(line, ask->key[i], klen) != 0)
			continue;
		if (ask->meminfo) {
			if (*s != ':')
				continue;
			s += 1 + strspn(s + 1, " \t");
		} else if (*s++ != ' ') {
			continue;
		}
		ask->seen[i] = 1;
		if (!decimal64(&s, &v))
			break;
		if (ask->meminfo && (strcmp(s, " kB") != 0 ||
			__builtin_mul_overflow(v, 1024, &v)))
			break;
		if (!ask->meminfo && *s != '\0')
			break;
		ask->found[i] = 1;
		ask->value[i] = v;
		break;
	}
	return 0;
}

/* a + b, cut at UINT64_MAX. */
static uint64_t
add_cut(uint64_t a, uint64_t b)
{
	uint64_t sum;

	return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

int
memlimit_parse_use(const char *text, size_t len, enum memlimit_kind kind, uint64_t *out)
{
	/* The first two keys of each kind must be there; a later one that is
	 * not is 0 (an older kernel), one that is there must say a number. */
	static const char *const keys[3][USE_KEYS] = {
		[MEMLIMIT_RAM] = { "MemTotal", "MemAvailable", "AnonPages", "Shmem", "SwapFree",
			"Mlocked" },
		/* Before 5.18 there is no "kernel": the parts of it that
		 * reclaim does not free, and sock (review rev189 F6). */
		[MEMLIMIT_CGROUP_V2] = { "anon", "shmem", "kernel", "kernel_stack", "pagetables",
			"slab_unreclaimable", "percpu", "sock" },
		[MEMLIMIT_CGROUP_V1] = { "total_rss", "total_shmem" },
	};
	struct use_ask ask;
	uint64_t sum;
	int r;

	memset(&ask, 0, sizeof(ask));
	memcpy(ask.key, keys[kind == MEMLIMIT_RAM ? MEMLIMIT_RAM : kind == MEMLIMIT_CGROUP_V1 ?
		MEMLIMIT_CGROUP_V1 : MEMLIMIT_CGROUP_V2], sizeof(ask.key));
	ask.meminfo = kind == MEMLIMIT_RAM;
	if ((r = each_line(text, len, use_line, &ask)) < 0)
		return r;
	for (int i = 0; i < USE_KEYS && ask.key[i] != NULL; i++)
		if (ask.seen[i] ? !ask.found[i] : i < 2)
			return 0;
	if (kind == MEMLIMIT_RAM) {
		/* What the kernel says is not available (review rev189 F2: it
		 * counts mlocked and driver-pinned pages, ramfs, zswap and its
		 * reserves), less what free swap could take: anonymous memory
		 * and shmem that is not mlocked, no more. */
		uint64_t swappable = add_cut(ask.value[2], ask.value[3]), credit;

		sum = ask.value[0] > ask.value[1] ? ask.value[0] - ask.value[1] : 0;
		swappable -= ask.value[5] < swappable ? ask.value[5] : swappable;
		credit = ask.value[4] < swappable ? ask.value[4] : swappable;
		sum -= credit < sum ? credit : sum;
	} else {
		sum = add_cut(ask.value[0], ask.value[1]);
		if (kind != MEMLIMIT_CGROUP_V1 && !ask.seen[2])
			for (int i = 3; i < USE_KEYS; i++)
				sum = add_cut(sum, ask.value[i]);
		else
			sum = add_cut(sum, ask.value[2]);
	}
	*out = sum;
	return 1;
}

/* The most memlimit_use() reads of its file: memory.stat is about 1.5 KiB,
 * /proc/meminfo about 1.5 KiB. */
#define USE_FILE_CAP ((size_t)64 * 1024)

int
memlimit_use(const char *use_file, enum memlimit_kind kind, uint64_t limit, uint64_t *out)
{
	char *text;
	size_t len = 0;
	int fd, r;

	if (use_file[0] == '\0')
		return -ENOENT;
	if ((fd = open(use_file, O_RDONLY | O_CLOEXEC)) == -1)
		return -errno;
	if ((text = malloc(USE_FILE_CAP)) == NULL) {
		close(fd);
		return -ENOMEM;
	}
	while (len < USE_FILE_CAP) {
		ssize_t n = read(fd, text + len, USE_FILE_CAP - len);

		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1) {
			r = -errno;
			close(fd);
			free(text);
			return r;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	r = memlimit_parse_use(text, len, kind, out);
	free(text);
	if (r == 1)
		*out = add_cut(*out, memlimit_use_margin(limit));
	return r < 0 ? r : r == 1 ? 0 : -EBADMSG;
}

uint64_t
memlimit_use_margin_of(uint64_t cpus, uint64_t page, uint64_t limit)
{
	uint64_t cap = limit / MEMLIMIT_USE_SLACK_SHARE, margin;

	if (cap < MEMLIMIT_USE_SLACK_CAP_MIN)
		cap = MEMLIMIT_USE_SLACK_CAP_MIN;
	if (__builtin_mul_overflow(cpus != 0 ? cpus : 1, MEMLIMIT_USE_SLACK_PAGES, &margin) ||
		__builtin_mul_overflow(margin, page != 0 ? page : 4096, &margin))
		return cap;
	return margin < cap ? margin : cap;
}

uint64_t
memlimit_use_margin(uint64_t limit)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN), page = sysconf(_SC_PAGESIZE);

	return memlimit_use_margin_of(cpus > 0 ? (uint64_t)cpus : 0, page > 0 ? (uint64_t)page : 0,
		limit);
}

const char *
memlimit_use_say(enum memlimit_kind kind, uint64_t limit, uint64_t used, char *buf, size_t len)
{
	uint64_t margin = (memlimit_use_margin(limit) + (UINT64_C(1) << 20) - 1) >> 20;
	int n;

	if (kind == MEMLIMIT_RAM)
		n = snprintf(buf, len, "the machine has about %" PRIu64 " MiB in use that the "
			"kernel cannot reclaim (/proc/meminfo: MemTotal less MemAvailable, less "
			"the SwapFree that could take AnonPages and Shmem not Mlocked; %" PRIu64
			" MiB of it allowed for the kernel's per-CPU counts not yet added up)",
			used >> 20, margin);
	else
		n = snprintf(buf, len, "wcached's memory cgroup has about %" PRIu64 " MiB of "
			"anonymous memory and shmem in use (memory.stat), which the kernel cannot "
			"reclaim without swap%s (%" PRIu64 " MiB of it allowed for the kernel's "
			"per-CPU counts not yet added up)", used >> 20,
			kind == MEMLIMIT_CGROUP_V2 ? ", and of kernel memory" : "", margin);
	if (n >= 0 && (size_t)n >= len)
		mark_cut(buf, len);
	return buf;
}

const char *
memlimit_kind_name(enum memlimit_kind k)
{
	return k == MEMLIMIT_CGROUP_V2 ? "cgroup_v2" :
		k == MEMLIMIT_CGROUP_V1 ? "cgroup_v1" : "ram";
}

int
memlimit_fits(const struct memlimit *m, uint64_t models, uint64_t pinned, uint64_t budget)
{
	uint64_t warm = budget != 0 && budget < models ? budget : models;

	if (warm < pinned)
		warm = pinned;
	return m->limit == 0 || warm <= m->limit;
}

const char *
memlimit_source(const struct memlimit *m, char *buf, size_t len)
{
	int n;

	if (m->kind == MEMLIMIT_RAM)
		n = snprintf(buf, len, "RAM");
	else
		n = snprintf(buf, len, "cgroup %s %s of %s",
			m->kind == MEMLIMIT_CGROUP_V2 ? "v2" : "v1", m->file, m->cgroup_path);
	if (n >= 0 && (size_t)n >= len)
		mark_cut(buf, len);
	return buf;
}

uint64_t
memlimit_ram(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

	return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}
