/*
 * fuzz_kernel.c: libFuzzer harness for the parsers of what the kernel and
 * the service manager write for wcached to read: /proc/self/cgroup and
 * /proc/self/mountinfo as memlimit.c reads them, mountinfo as fstype.c
 * reads it, cgroup limit files (memory.max, memory.high,
 * memory.limit_in_bytes) and v1's memory.stat, /proc/self/status
 * (resident.c), $FDSTORE (restore.c), /proc/self/io (wcachectl convert's
 * progress) and $JOURNAL_STREAM (log.c). A hostile container runtime, a
 * FUSE mount point of odd bytes or a future kernel can make them weird.
 *
 * Input: a byte whose low four bits, modulo 11, pick the parser (seeds
 * begin with an ASCII digit: '0' is 0x30, ':' 0x3a), then the file's content:
 *   0 /proc/self/cgroup          memlimit_parse_cgroups()
 *   1 /proc/self/mountinfo       memlimit_parse_mounts(), both hierarchies
 *                                found (in cgroup "/")
 *   2 /proc/self/mountinfo       fstype_mounts_add()
 *   3 memory.max and the like    memlimit_parse_limit(), no key
 *   4 memory.stat                memlimit_parse_limit(), key
 *                                "hierarchical_memory_limit"; and
 *                                memlimit_parse_use(), v2 and v1
 *   5 /proc/self/status          resident_status_parse(); and
 *                                memlimit_parse_use() of /proc/meminfo
 *   6 $FDSTORE (to the first NUL, 4096 bytes at most)
 *                                restore_store_max()
 *   7 /proc/self/mountinfo       memlimit_parse_mounts(), no hierarchy
 *                                found
 *   8 /proc/self/io              ctl_convert_io_wchar()
 *   9 $JOURNAL_STREAM's value    log_journal_stream_parse(), and
 *                                decimal_u64() of the whole
 *  10 a directory's              diracl_named_write(), for two owners;
 *     system.posix_acl_access,   and diracl_nfs4_write() of the same bytes;
 *     or its system.nfs4_acl     diracl_may_read() and diracl_all_read()
 *                                of them as either kind, for users and
 *                                groups (a file's, review rev226 H1)
 *
 * Properties checked, beyond "no crash, no leak, no out-of-bounds access":
 *   - a cgroup, mountinfo or limit file given whole and given line by line,
 *     as the daemon's readers give it (getline(3): each line with its
 *     newline), parse the same (status and $FDSTORE are given whole, as
 *     the daemon reads them);
 *   - the answer is what this file's own reading of the deciding line says
 *     (an oracle written apart from the parser: a line in the kernel's
 *     format is taken, with its value):
 *     - /proc/self/cgroup: v2's cgroup is the rest of the last "0::" line,
 *       v1's the path of the last line whose controller list has the word
 *       "memory"; memlimit_cgroup_rel() of each is it below a root of "/"
 *       or of its parent, and refused when it has a ".." component;
 *     - memlimit's mountinfo: root and mount point are fields 4 and 5,
 *       octal escapes undone, of the first cgroup2 line (v2) and the first
 *       cgroup line with the superoption "memory" (v1), "-" at field 7 or
 *       later (one whose mount point unescapes to "" does not count);
 *       nothing when no hierarchy was found;
 *     - fstype's mountinfo: each line "ID PARENT MAJ:MIN ... - TYPE ..." in
 *       decimal is an entry, in order, of that mount ID, device and type
 *       (fstype_classify_name) and of the user_id= of the super options,
 *       the last field after the source, for a FUSE type (none or not a
 *       number: a user's mount all the same), and fstype_mounts_find()
 *       answers for a device its first entry, fstype_mounts_find_id() for
 *       a mount ID its first;
 *   - a limit is decided by the first line (memory.max) or the first "KEY "
 *     line (memory.stat) and is what this file's own digit loop reads
 *     there: a decimal number below MEMLIMIT_NO_LIMIT, else 0 ("none");
 *   - /proc/self/status (to its first NUL): VmLck and Seccomp are the
 *     number of the decimal digits after the name and the blanks on the
 *     first line that starts with it, or untouched when there are none or
 *     they overflow; CapEff is read there only when it is exactly 16
 *     lowercase hex digits to the end of the line; VmLck in kB,
 *     CAP_IPC_LOCK bit 14, Seccomp 0 to 2;
 *   - $FDSTORE is the limit when it is all digits (capped at
 *     FDSTORE_MAX_FDS), else FDSTORE_MAX_FDS;
 *   - /proc/self/io: the first line (split at '\n' only: a NUL is a byte
 *     like any other) that starts with "wchar: " decides, and is a value
 *     only when the rest is decimal digits of at most 2^64 - 1 (compared as
 *     a string with "18446744073709551615"); otherwise -EINVAL, *out
 *     untouched;
 *   - $JOURNAL_STREAM: split at its first ':', both sides such digits, is
 *     the device and inode, else -EINVAL, both untouched;
 *   - decimal_u64() (the parser under both): such digits are a value; else
 *     -ERANGE when the digits before the first other byte pass 2^64 - 1,
 *     -EINVAL otherwise, *out untouched;
 *   - an ACL value: 1 unless it is a little-endian 2, then whole 8-byte
 *     entries (tag, permissions: 2 bytes each; id: 4); then 1 where an
 *     entry of tag 8 (a named group), or of tag 2 (a named user) whose id
 *     is not the owner's, has the write bit (2) and the last entry of tag
 *     0x10 (the mask), if any, has it too; else 0;
 *   - an NFSv4 ACL value: 1 unless it is a big-endian count N, then N
 *     ACEs of four big-endian words (type, flag, access, who's length L)
 *     and L bytes rounded up to a multiple of 4, ending at the value's
 *     end; then 1 where an ACE of type 0 without flag 8 has access bit
 *     2, 4, 0x40, 0x40000 or 0x80000 and its L bytes are not "OWNER@";
 *     else 0;
 *   - a file's POSIX ACL value read for a user: 0 unless it is such a
 *     value with tags 1, 2, 4, 8, 0x10 and 0x20 only, 1, 4 and 0x20 once
 *     each and 0x10 at most once; then the owner's entry (tag 1) for the
 *     owner, a tag 2 entry of the user's id with the mask (7 where none),
 *     any tag 4 (the file's group) or 8 entry of one of the user's groups
 *     (bit 4 and the mask's) where one matches, else the tag 0x20 entry;
 *     and where diracl_all_read() says every user (or every member of a
 *     group) reads, diracl_may_read() says so of one (in that group).
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>

#include "base/decimal.h"
#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "diracl.h"
#include "fdstore.h"
#include "fstype.h"
#include "log.h"
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
	return a->magic == b->magic && strcmp(a->name, b->name) == 0 && a->remote == b->remote &&
	       a->user_mount == b->user_mount && a->mounter == b->mounter;
}

/* Is s terminated within cap bytes? */
static bool
terminated(const char *s, size_t cap)
{
	return memchr(s, '\0', cap) != NULL;
}

/* Copies src into dst (cap bytes), cut to fit, as the parsers keep a path. */
static void
keep(char *dst, size_t cap, const char *src)
{
	snprintf(dst, cap, "%s", src);
}

/* Is word one of the comma-separated words of list? (Written apart from
 * memlimit.c's has_word.) */
static bool
list_has(const char *list, const char *word)
{
	size_t n = strlen(word);
	const char *p = list;

	for (;;) {
		size_t w = strcspn(p, ",");

		if (w == n && memcmp(p, word, n) == 0)
			return true;
		if (p[w] == '\0')
			return false;
		p += w + 1;
	}
}

/* Has path a component ".."? (Split at '/', each compared.) */
static bool
dotdot(const char *path)
{
	for (const char *p = path;; p++) {
		size_t n = strcspn(p, "/");

		if (n == 2 && p[0] == '.' && p[1] == '.')
			return true;
		p += n;
		if (*p == '\0')
			return false;
	}
}

/* memlimit_cgroup_rel() of h's cgroup below root: the cgroup past root
 * when it lies under it ("" for root itself), else ""; refused (-1) with
 * a ".." component. */
static void
check_rel(struct memlimit_hierarchy *h, const char *root)
{
	char *rel = malloc(MEMLIMIT_PATH_CAP);
	const char *want = "";
	size_t rn = strlen(root);

	CHECK(rel != NULL);
	keep(h->root, sizeof(h->root), root);
	keep(h->mountpoint, sizeof(h->mountpoint), "/m");
	if (strcmp(root, "/") == 0)
		want = strcmp(h->cgroup, "/") == 0 ? "" : h->cgroup;
	else if (strncmp(h->cgroup, root, rn) == 0 &&
		(h->cgroup[rn] == '/' || h->cgroup[rn] == '\0'))
		want = h->cgroup + rn;
	if (dotdot(want)) {
		CHECK(memlimit_cgroup_rel(h, rel, MEMLIMIT_PATH_CAP) == -1);
	} else {
		CHECK(memlimit_cgroup_rel(h, rel, MEMLIMIT_PATH_CAP) == 0);
		CHECK(strcmp(rel, want) == 0);
	}
	h->root[0] = h->mountpoint[0] = '\0';
	free(rel);
}

static void
check_cgroups(const char *text, size_t len)
{
	struct memlimit_hierarchy *h = calloc(4, sizeof(*h));
	char *want[2] = { NULL, NULL }, *parent = malloc(MEMLIMIT_PATH_CAP);
	struct lines l;

	CHECK(h != NULL && parent != NULL);
	CHECK(memlimit_parse_cgroups(text, len, &h[0], &h[1]) == 0);
	for (size_t at = 0, n; at < len; at += n) {
		n = getline_len(text, len, at);
		CHECK(memlimit_parse_cgroups(text + at, n, &h[2], &h[3]) == 0);
	}
	CHECK(memcmp(&h[0], &h[2], 2 * sizeof(*h)) == 0);
	/* "ID:CONTROLLERS:PATH" (the path may hold ':'). */
	lines_split(text, len, &l);
	for (size_t i = 0; i < l.n; i++) {
		char *a = strchr(l.line[i], ':'), *b = a != NULL ? strchr(a + 1, ':') : NULL;

		if (b == NULL)
			continue;
		*a = *b = '\0';
		if (strcmp(l.line[i], "0") == 0 && a[1] == '\0')
			want[0] = b + 1;
		else if (list_has(a + 1, "memory"))
			want[1] = b + 1;
	}
	for (int i = 0; i < 2; i++) {
		char *slash;

		CHECK(h[i].found == (want[i] != NULL));
		CHECK(terminated(h[i].cgroup, sizeof(h[i].cgroup)));
		CHECK(strncmp(h[i].cgroup, want[i] != NULL ? want[i] : "",
			      sizeof(h[i].cgroup) - 1) == 0);
		CHECK(strlen(h[i].cgroup) < sizeof(h[i].cgroup));
		CHECK(h[i].root[0] == '\0' && h[i].mountpoint[0] == '\0');
		if (!h[i].found)
			continue;
		/* The path built from it, below "/" and below its parent. */
		check_rel(&h[i], "/");
		keep(parent, MEMLIMIT_PATH_CAP, h[i].cgroup);
		if ((slash = strrchr(parent, '/')) != NULL && slash != parent) {
			*slash = '\0';
			check_rel(&h[i], parent);
		}
	}
	lines_free(&l);
	free(parent);
	free(h);
}

/* mountinfo's octal escapes ("\040") undone in place: a backslash and
 * three octal digits, the first 0 to 3, are one byte. */
static void
oracle_unescape(char *s)
{
	size_t w = 0;

	for (size_t r = 0; s[r] != '\0'; w++) {
		if (s[r] == '\\' && strspn(s + r + 1, "01234567") >= 3 && s[r + 1] <= '3') {
			char oct[4] = { s[r + 1], s[r + 2], s[r + 3], '\0' };

			s[w] = (char)strtol(oct, NULL, 8);
			r += 4;
		} else {
			s[w] = s[r++];
		}
	}
	s[w] = '\0';
}

/* This file's reading of memlimit's mountinfo lines into want_root and
 * want_mount (each [2][MEMLIMIT_PATH_CAP]): fields split at blanks; "-" at
 * field 7 or later, then type, source and superoptions. */
static void
oracle_mounts(const struct lines *l, char (*want_root)[MEMLIMIT_PATH_CAP],
	char (*want_mount)[MEMLIMIT_PATH_CAP])
{
	for (size_t i = 0; i < l->n; i++) {
		char *copy = strdup(l->line[i]), **f, *p;
		size_t nf = 0, dash;
		int which = -1;

		CHECK(copy != NULL);
		f = malloc((strlen(copy) / 2 + 2) * sizeof(*f));
		CHECK(f != NULL);
		for (p = copy; *p != '\0';) {
			if (*p == ' ') {
				*p++ = '\0';
				continue;
			}
			f[nf++] = p;
			p += strcspn(p, " ");
		}
		for (dash = 6; dash < nf && strcmp(f[dash], "-") != 0; dash++)
			;
		if (dash + 3 < nf) {
			if (strcmp(f[dash + 1], "cgroup2") == 0)
				which = 0;
			else if (strcmp(f[dash + 1], "cgroup") == 0 &&
				list_has(f[dash + 3], "memory"))
				which = 1;
		}
		if (which >= 0 && want_mount[which][0] == '\0') {
			oracle_unescape(f[3]);
			oracle_unescape(f[4]);
			keep(want_root[which], MEMLIMIT_PATH_CAP, f[3]);
			keep(want_mount[which], MEMLIMIT_PATH_CAP, f[4]);
		}
		free(f);
		free(copy);
	}
}

static void
check_mounts(const char *text, size_t len, bool found)
{
	struct memlimit_hierarchy *h = calloc(4, sizeof(*h));
	char (*want_root)[MEMLIMIT_PATH_CAP] = calloc(2, MEMLIMIT_PATH_CAP);
	char (*want_mount)[MEMLIMIT_PATH_CAP] = calloc(2, MEMLIMIT_PATH_CAP);
	struct lines l;

	CHECK(h != NULL && want_root != NULL && want_mount != NULL);
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
	lines_split(text, len, &l);
	if (found)
		oracle_mounts(&l, want_root, want_mount);
	for (int i = 0; i < 2; i++) {
		CHECK(h[i].found == found && strcmp(h[i].cgroup, "/") == 0);
		CHECK(terminated(h[i].mountpoint, sizeof(h[i].mountpoint)));
		CHECK(terminated(h[i].root, sizeof(h[i].root)));
		CHECK(strcmp(h[i].mountpoint, want_mount[i]) == 0);
		CHECK(strcmp(h[i].root, want_root[i]) == 0);
	}
	lines_free(&l);
	free(want_root);
	free(want_mount);
	free(h);
}

/* A decimal number of at most UINT_MAX at *s, advanced past it. */
static bool
oracle_uint(const char **s, unsigned *out)
{
	uint64_t v = 0;
	const char *p = *s;

	for (; *p >= '0' && *p <= '9'; p++)
		if ((v = v * 10 + (uint64_t)(*p - '0')) > 0xFFFFFFFFu)
			return false;
	if (p == *s)
		return false;
	*out = (unsigned)v;
	*s = p;
	return true;
}

/* This file's reading of a mountinfo line in the kernel's format: "ID
 * PARENT MAJ:MIN " in decimal, and after the first " - " a type (cut to
 * 63 bytes, as fstype.c keeps it). true with them. */
static bool
oracle_mount(const char *line, unsigned *id, unsigned *maj, unsigned *min, char *type)
{
	const char *s = line, *sep = strstr(line, " - ");
	unsigned skip;
	size_t n;

	if (!oracle_uint(&s, id) || *s++ != ' ' || !oracle_uint(&s, &skip) || *s++ != ' ' ||
		!oracle_uint(&s, maj) || *s++ != ':' || !oracle_uint(&s, min) || *s != ' ' ||
		sep == NULL)
		return false;
	sep += 3;
	for (n = 0; sep[n] != '\0' && !isspace((unsigned char)sep[n]); n++)
		;
	if (n == 0)
		return false;
	snprintf(type, 64, "%.*s", (int)(n < 63 ? n : 63), sep);
	return true;
}

/* This file's reading of who made a mountinfo line's mount (sep: after
 * " - "): the fields split at blanks, the super options the last of three
 * or more (never the source), their first ","-separated option that starts
 * "user_id=" its value when all decimal digits below 2^31. A "fuse" or
 * "fuseblk" type (".subtype" or not) with a value other than 0, or none,
 * is a user's mount, by that user or (uid_t)-1. */
static void
oracle_user(const char *sep, struct fs_info *fs)
{
	char *copy = strdup(sep), *save = NULL, *field[3] = { NULL }, *f, *opt;
	const char *t;
	int64_t user = -1;
	size_t n = 0;

	CHECK(copy != NULL);
	for (f = strtok_r(copy, " \t\n\v\f\r", &save); f != NULL;
		f = strtok_r(NULL, " \t\n\v\f\r", &save), n++)
		field[n < 2 ? n : 2] = f;
	CHECK(field[0] != NULL); /* oracle_mount read a type there */
	for (opt = n >= 3 ? strtok_r(field[2], ",", &save) : NULL; opt != NULL;
		opt = strtok_r(NULL, ",", &save))
		if (strncmp(opt, "user_id=", 8) == 0) {
			user = opt[8] != '\0' ? 0 : -1;
			for (const char *d = opt + 8; *d != '\0' && user >= 0; d++)
				user = *d < '0' || *d > '9' || user * 10 + (*d - '0') > INT32_MAX ?
					-1 : user * 10 + (*d - '0');
			break;
		}
	t = strncmp(field[0], "fuseblk", 7) == 0 ? field[0] + 7 :
	    strncmp(field[0], "fuse", 4) == 0   ? field[0] + 4 : NULL;
	if (t != NULL && (*t == '\0' || *t == '.') && user != 0) {
		fs->user_mount = true;
		fs->mounter = user > 0 ? (uid_t)user : (uid_t)-1;
	}
	free(copy);
}

static void
check_mount_table(const char *text, size_t len)
{
	struct fs_mounts whole = { 0 }, lines = { 0 };
	struct lines l;
	size_t k = 0;

	CHECK(fstype_mounts_add(&whole, text, len) == 0);
	for (size_t at = 0, n; at < len; at += n) {
		n = getline_len(text, len, at);
		CHECK(fstype_mounts_add(&lines, text + at, n) == 0);
	}
	CHECK(whole.n == lines.n && whole.n <= whole.cap);
	for (size_t i = 0; i < whole.n; i++)
		CHECK(whole.mounts[i].id == lines.mounts[i].id &&
			whole.mounts[i].dev == lines.mounts[i].dev &&
			same_fs(&whole.mounts[i].fs, &lines.mounts[i].fs));
	/* Each line in the kernel's format is the next entry, of its device
	 * ID, device and type; another line may be one (sscanf(3)'s leniency:
	 * blanks, signs) or not, and is skipped as the parser's own scan says. */
	lines_split(text, len, &l);
	for (size_t i = 0; i < l.n; i++) {
		unsigned id, maj, min;
		char type[64];
		struct fs_info fs;

		if (oracle_mount(l.line[i], &id, &maj, &min, type)) {
			CHECK(k < whole.n);
			CHECK(whole.mounts[k].id == id && whole.mounts[k].dev == makedev(maj, min));
			fstype_classify_name(type, &fs);
			oracle_user(strstr(l.line[i], " - ") + 3, &fs);
			CHECK(same_fs(&whole.mounts[k].fs, &fs));
			k++;
		} else if (sscanf(l.line[i], "%*u %*u %u:%u", &maj, &min) == 2 &&
			   strstr(l.line[i], " - ") != NULL &&
			   sscanf(strstr(l.line[i], " - ") + 3, "%63s", type) == 1) {
			CHECK(k < whole.n);
			k++;
		}
	}
	CHECK(k == whole.n);
	for (size_t i = 0; i < whole.n; i++) {
		const struct fs_mount *m = &whole.mounts[i];
		size_t first = 0;
		struct fs_info fs;

		CHECK(terminated(m->fs.name, sizeof(m->fs.name)) && m->fs.name[0] != '\0');
		while (whole.mounts[first].dev != m->dev)
			first++;
		CHECK(fstype_mounts_find(&whole, m->dev, &fs) == 0);
		CHECK(same_fs(&fs, &whole.mounts[first].fs));
		/* by mount ID likewise: the first entry with that ID */
		for (first = 0; whole.mounts[first].id != m->id;)
			first++;
		CHECK(fstype_mounts_find_id(&whole, m->id, &fs) == 0);
		CHECK(same_fs(&fs, &whole.mounts[first].fs));
	}
	lines_free(&l);
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
			__builtin_add_overflow(v, (uint64_t)(*s - '0'), &v) ||
			v >= MEMLIMIT_NO_LIMIT)
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

/* This file's reading of key's value for memlimit_parse_use(): on the first
 * line that starts with key and then ' ' (memory.stat) or ':' and blanks
 * (meminfo), decimal digits to the line's end (" kB" then, for meminfo),
 * fitting 64 bits in bytes: 1 with it; 0 when that line says no such
 * number, -1 when there is no such line. */
static int
oracle_use_key(const struct lines *l, const char *key, bool meminfo, uint64_t *out)
{
	size_t klen = strlen(key);

	for (size_t i = 0; i < l->n; i++) {
		const char *s = l->line[i];
		uint64_t v = 0;
		size_t digits = 0;

		if (strncmp(s, key, klen) != 0)
			continue;
		s += klen;
		if (meminfo ? *s != ':' : *s != ' ')
			continue;
		s++;
		if (meminfo)
			while (*s == ' ' || *s == '\t')
				s++;
		for (; *s >= '0' && *s <= '9'; s++, digits++)
			if (__builtin_mul_overflow(v, 10, &v) ||
				__builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
				return 0;
		if (digits == 0 || strcmp(s, meminfo ? " kB" : "") != 0)
			return 0;
		if (meminfo && __builtin_mul_overflow(v, 1024, &v))
			return 0;
		*out = v;
		return 1;
	}
	return -1;
}

/* a + b, or UINT64_MAX past it. */
static uint64_t
sum_cut(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* memlimit_parse_use() of text in kind's format against the oracle: the
 * first two keys must say a number, a later one may be missing (0) but
 * not say something else; for meminfo, MemTotal - MemAvailable less
 * SwapFree, which takes at most AnonPages + Shmem - Mlocked (each
 * difference at least 0). */
static void
check_use(const char *text, size_t len, enum memlimit_kind kind)
{
	static const char *const keys[3][8] = {
		{ "MemTotal", "MemAvailable", "AnonPages", "Shmem", "SwapFree", "Mlocked" },
		{ "anon", "shmem", "kernel", "kernel_stack", "pagetables", "slab_unreclaimable",
			"percpu", "sock" },
		{ "total_rss", "total_shmem" },
	};
	const char *const *k = keys[kind == MEMLIMIT_RAM ? 0 : kind == MEMLIMIT_CGROUP_V2 ? 1 : 2];
	bool meminfo = kind == MEMLIMIT_RAM, yes = true, kernel = false;
	uint64_t v = 12345, value[8] = { 0 }, want;
	int r = memlimit_parse_use(text, len, kind, &v);
	struct lines l;

	CHECK(r == 0 || r == 1);
	lines_split(text, len, &l);
	for (int i = 0; i < 8 && k[i] != NULL; i++) {
		int got = oracle_use_key(&l, k[i], meminfo, &value[i]);

		if (got == 0 || (got == -1 && i < 2))
			yes = false;
		if (i == 2 && got != -1)
			kernel = true;
	}
	if (meminfo) {
		uint64_t swap = sum_cut(value[2], value[3]);

		swap = value[5] >= swap ? 0 : swap - value[5];
		swap = value[4] < swap ? value[4] : swap;
		want = value[1] >= value[0] ? 0 : value[0] - value[1];
		want = swap >= want ? 0 : want - swap;
	} else if (kind == MEMLIMIT_CGROUP_V2 && !kernel) {
		/* v2 before 5.18: the parts of "kernel" reclaim does not free */
		want = sum_cut(value[0], value[1]);
		for (int i = 3; i < 8; i++)
			want = sum_cut(want, value[i]);
	} else {
		want = sum_cut(sum_cut(value[0], value[1]), value[2]);
	}
	CHECK(r == (yes ? 1 : 0));
	CHECK(v == (yes ? want : 12345));
	lines_free(&l);
}

/* This file's reading of status field name ("VmLck:") in text: on the
 * first line that starts with it, after blanks (' ', '\t'), the decimal
 * digits: true with their value; false when there are none, or they
 * overflow 64 bits. */
static bool
oracle_field(const char *text, const char *name, uint64_t *out)
{
	struct lines l;
	bool yes = false;

	lines_split(text, strlen(text), &l);
	for (size_t i = 0; i < l.n; i++) {
		const char *s = l.line[i];
		uint64_t v = 0;

		if (strncmp(s, name, strlen(name)) != 0)
			continue;
		s += strlen(name);
		s += strspn(s, " \t");
		yes = *s >= '0' && *s <= '9';
		for (; *s >= '0' && *s <= '9'; s++)
			if (__builtin_mul_overflow(v, 10, &v) ||
				__builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
				yes = false;
		*out = v;
		break;
	}
	lines_free(&l);
	return yes;
}

/* This file's reading of CapEff: on the first line that starts with
 * "CapEff:", after blanks, exactly 16 lowercase hex digits and the line's
 * end (fs/proc/array.c render_cap_t): true with their value. */
static bool
oracle_caps(const char *text, uint64_t *out)
{
	struct lines l;
	bool yes = false;

	lines_split(text, strlen(text), &l);
	for (size_t i = 0; i < l.n; i++) {
		const char *s = l.line[i];

		if (strncmp(s, "CapEff:", 7) != 0)
			continue;
		s += 7;
		s += strspn(s, " \t");
		if (strlen(s) == 16 && strspn(s, "0123456789abcdef") == 16) {
			*out = strtoull(s, NULL, 16);
			yes = true;
		}
		break;
	}
	lines_free(&l);
	return yes;
}

static void
check_status(const char *text, size_t len)
{
	struct resident_refusal r = { .seccomp = -1 }, want = { .seccomp = -1 };
	char *copy = malloc(len + 1);
	uint64_t v;

	CHECK(copy != NULL);
	memcpy(copy, text, len);
	copy[len] = '\0';
	CHECK(resident_status_parse(text, len, &r) == 0);
	if (oracle_field(copy, "VmLck:", &v) && v <= UINT64_MAX / 1024) {
		want.locked_known = 1;
		want.locked = v * 1024;
	}
	if (oracle_caps(copy, &v))
		want.ipc_lock = (v & (UINT64_C(1) << 14)) != 0;
	if (oracle_field(copy, "Seccomp:", &v) && v <= 2)
		want.seccomp = (int)v;
	CHECK(r.locked_known == want.locked_known && r.locked == want.locked);
	CHECK(r.ipc_lock == want.ipc_lock);
	CHECK(r.seccomp == want.seccomp);
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

/* Are s's n bytes decimal digits of a value of 64 bits at most? true with
 * it. (The bound by comparing the digits, leading zeros dropped, with
 * 2^64 - 1's: apart from the parsers' overflow checks.) */
static bool
oracle_u64(const char *s, size_t n, uint64_t *out)
{
	static const char max[] = "18446744073709551615";
	char digits[sizeof(max)];

	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	while (n > 1 && *s == '0') {
		s++;
		n--;
	}
	if (n > sizeof(max) - 1 || (n == sizeof(max) - 1 && memcmp(s, max, n) > 0))
		return false;
	memcpy(digits, s, n);
	digits[n] = '\0';
	*out = strtoull(digits, NULL, 10);
	return true;
}

static void
check_io(const char *text, size_t len)
{
	uint64_t v = 12345, want = 12345;
	int r = ctl_convert_io_wchar(text, len, &v);
	bool yes = false;

	CHECK(r == 0 || r == -EINVAL);
	for (size_t at = 0; at < len;) {
		const char *nl = memchr(text + at, '\n', len - at);
		size_t n = nl != NULL ? (size_t)(nl - (text + at)) : len - at;

		if (n >= 7 && memcmp(text + at, "wchar: ", 7) == 0) {
			yes = oracle_u64(text + at + 7, n - 7, &want);
			break;
		}
		at += n + 1;
	}
	CHECK(r == (yes ? 0 : -EINVAL));
	CHECK(v == (yes ? want : 12345));
}

static void
check_journal_stream(const char *text, size_t len)
{
	uint64_t dev = 7, ino = 7, want_dev = 7, want_ino = 7;
	int r = log_journal_stream_parse(text, len, &dev, &ino);
	const char *colon = memchr(text, ':', len);
	bool yes = colon != NULL && oracle_u64(text, (size_t)(colon - text), &want_dev) &&
		oracle_u64(colon + 1, len - (size_t)(colon + 1 - text), &want_ino);

	CHECK(r == (yes ? 0 : -EINVAL));
	CHECK(yes ? dev == want_dev && ino == want_ino : dev == 7 && ino == 7);
}

static void
check_decimal(const char *text, size_t len)
{
	uint64_t v = 7, want = 7;
	int r = decimal_u64(text, len, &v);
	size_t k = 0;

	while (k < len && text[k] >= '0' && text[k] <= '9')
		k++;
	if (oracle_u64(text, len, &want))
		CHECK(r == 0 && v == want);
	else
		CHECK(r == (k > 0 && !oracle_u64(text, k, &want) ? -ERANGE : -EINVAL) && v == 7);
}

/* This file's own reading of an ACL value (the oracle), for owner. */
static int
oracle_acl(const uint8_t *b, size_t len, uint32_t owner)
{
	int named = 0, masked = 0, mask_w = 0;

	if (len < 4 || (len - 4) % 8 != 0 ||
		(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24) != 2)
		return 1;
	for (size_t at = 4; at < len; at += 8) {
		unsigned tag = b[at] | b[at + 1] << 8, perm = b[at + 2] | b[at + 3] << 8;
		uint32_t id = b[at + 4] | b[at + 5] << 8 | b[at + 6] << 16 |
			(uint32_t)b[at + 7] << 24;

		if (tag == 0x10) {
			masked = 1;
			mask_w = (perm & 2) != 0;
		} else if ((perm & 2) != 0 && (tag == 8 || (tag == 2 && id != owner))) {
			named = 1;
		}
	}
	return named && (!masked || mask_w);
}

/* The next big-endian word of b (len bytes) at *at, moving past it; false
 * where fewer than four bytes are left. */
static bool
oracle_word(const uint8_t *b, size_t len, size_t *at, uint64_t *out)
{
	if (*at + 4 > len)
		return false;
	*out = 0;
	for (int i = 0; i < 4; i++)
		*out = *out * 256 + b[(*at)++];
	return true;
}

/* This file's own reading of an NFSv4 ACL value (the oracle). */
static int
oracle_nfs4(const uint8_t *b, size_t len)
{
	uint64_t n, type, flag, access, who, room;
	size_t at = 0;
	int lets = 0;

	if (!oracle_word(b, len, &at, &n))
		return 1;
	while (n-- > 0) {
		if (!oracle_word(b, len, &at, &type) || !oracle_word(b, len, &at, &flag) ||
			!oracle_word(b, len, &at, &access) || !oracle_word(b, len, &at, &who))
			return 1;
		room = who;
		while (room % 4 != 0)
			room++;
		if (room > len - at)
			return 1;
		if (type == 0 && (flag & 8) == 0 && (access & 0xC0046) != 0 &&
			!(who == 6 && memcmp(b + at, "OWNER@", 6) == 0))
			lets = 1;
		at += (size_t)room;
	}
	return at < len || lets;
}

/* This file's own reading of a file's POSIX ACL value for uid (not the
 * file's owner 1000 unless uid is) in the groups gids (n), file group 50. */
static int
oracle_read(const uint8_t *b, size_t len, uint32_t uid, const uint32_t *gids, int n)
{
	int count[0x21] = { 0 }, user = -1, matched = 0, grants = 0;
	unsigned mask = 7, owner = 0, other = 0;

	if (len < 4 || (len - 4) % 8 != 0 ||
		(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24) != 2)
		return 0;
	for (size_t at = 4; at < len; at += 8) {
		unsigned tag = b[at] | b[at + 1] << 8, perm = b[at + 2] | b[at + 3] << 8;
		uint32_t id = b[at + 4] | b[at + 5] << 8 | b[at + 6] << 16 |
			(uint32_t)b[at + 7] << 24;

		if (tag != 1 && tag != 2 && tag != 4 && tag != 8 && tag != 0x10 && tag != 0x20)
			return 0;
		count[tag]++;
		if (tag == 1)
			owner = perm;
		if (tag == 0x10)
			mask = perm;
		if (tag == 0x20)
			other = perm;
		if (tag == 2 && id == uid && user < 0)
			user = (int)perm;
	}
	if (count[1] != 1 || count[4] != 1 || count[0x20] != 1 || count[0x10] > 1)
		return 0;
	if (uid == 1000)
		return (owner & 4) != 0;
	if (user >= 0)
		return ((unsigned)user & mask & 4) != 0;
	for (size_t at = 4; at < len; at += 8) {
		unsigned tag = b[at] | b[at + 1] << 8, perm = b[at + 2] | b[at + 3] << 8;
		uint32_t id = tag == 4 ? 50 : b[at + 4] | b[at + 5] << 8 | b[at + 6] << 16 |
			(uint32_t)b[at + 7] << 24;

		for (int k = 0; k < n && (tag == 4 || tag == 8); k++)
			if (gids[k] == id) {
				matched = 1;
				grants |= (perm & mask & 4) != 0;
			}
	}
	return matched ? grants : (other & 4) != 0;
}

static void
check_acl(const char *text, size_t len)
{
	const uint8_t *b = (const uint8_t *)text;
	struct diracl_value posix = { .kind = DIRACL_POSIX, .len = len, .value = (uint8_t *)b };
	struct diracl_value nfs4 = { .kind = DIRACL_NFS4, .len = len, .value = (uint8_t *)b };
	struct stat st = { .st_uid = 1000, .st_gid = 50, .st_mode = S_IFREG | 0644 };
	/* users of the ids and groups a value's bytes most likely hold */
	static const uint32_t uids[] = { 1000, 1001, 0, 0xffffffff };
	static const uint32_t gsets[][2] = { { 40, 40 }, { 50, 50 }, { 60, 50 }, { 0, 0 } };

	CHECK(diracl_named_write(b, len, 1000) == oracle_acl(b, len, 1000));
	CHECK(diracl_named_write(b, len, 0) == oracle_acl(b, len, 0));
	CHECK(diracl_nfs4_write(b, len) == oracle_nfs4(b, len));
	for (size_t u = 0; u < sizeof(uids) / sizeof(uids[0]); u++)
		for (size_t g = 0; g < sizeof(gsets) / sizeof(gsets[0]); g++) {
			gid_t gids[2] = { gsets[g][0], gsets[g][1] };
			int r = diracl_may_read(&posix, &st, uids[u], gids, 2);

			CHECK(r == oracle_read(b, len, uids[u], gsets[g], 2));
			if (uids[u] != 1000 && (diracl_all_read(&posix, &st, (gid_t)-1) ||
				(gids[0] == gids[1] && diracl_all_read(&posix, &st, gids[0]))))
				CHECK(r == 1);
			(void)diracl_may_read(&nfs4, &st, uids[u], gids, 2);
		}
	(void)diracl_all_read(&nfs4, &st, (gid_t)-1);
	(void)diracl_all_read(&nfs4, &st, 50);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data + 1;
	size_t len;

	if (size < 1)
		return 0;
	len = size - 1;
	switch ((data[0] & 15) % 11) {
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
		check_use(text, len, MEMLIMIT_CGROUP_V2);
		check_use(text, len, MEMLIMIT_CGROUP_V1);
		break;
	case 5:
		check_status(text, len);
		check_use(text, len, MEMLIMIT_RAM);
		break;
	case 6:
		check_fdstore(text, len);
		break;
	case 7:
		check_mounts(text, len, false);
		break;
	case 8:
		check_io(text, len);
		break;
	case 10:
		check_acl(text, len);
		break;
	default:
		check_journal_stream(text, len);
		check_decimal(text, len);
		break;
	}
	return 0;
}
