/*
 * fstype.c: filesystem kinds, and the watch and stage words (see fstype.h).
 */
#include "fstype.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

struct known_fs {
	unsigned long magic;
	const char *name;
	bool remote;
};

/* linux/magic.h and the filesystems' own headers (Lustre, GPFS, BeeGFS
 * are out of tree). FUSE covers virtiofs, sshfs, s3fs, gcsfuse, glusterfs
 * and the like: they all report FUSE's magic. */
static const struct known_fs known[] = {
	{ 0x6969, "nfs", true },
	{ 0xFF534D42, "cifs", true },
	{ 0xFE534D42, "smb2", true },
	{ 0x517B, "smb", true },
	{ 0x65735546, "fuse", true },
	{ 0x0BD00BD0, "lustre", true },
	{ 0x47504653, "gpfs", true },
	{ 0x00C36400, "ceph", true },
	{ 0x01021997, "9p", true },
	{ 0x5346414F, "afs", true },
	{ 0x6B414653, "kafs", true },
	{ 0x19830326, "beegfs", true },
	{ 0x73757245, "coda", true },
	{ 0x7461636F, "ocfs2", true },
	{ 0x01161970, "gfs2", true },
	{ 0xAAD7AAEA, "panfs", true },
	{ 0x20030528, "orangefs", true },
	{ 0xEF53, "ext4", false },
	{ 0x58465342, "xfs", false },
	{ 0x9123683E, "btrfs", false },
	{ 0x01021994, "tmpfs", false },
	{ 0x794C7630, "overlay", false },
	{ 0x2FC12FC1, "zfs", false },
	{ 0xF2F52010, "f2fs", false },
	{ 0x858458F6, "ramfs", false },
	{ 0x73717368, "squashfs", false },
	{ 0x4D44, "vfat", false },
	{ 0x2011BAB0, "exfat", false },
	{ 0x5346544E, "ntfs", false },
	{ 0x958458F6, "hugetlbfs", false },
};

void
fstype_classify(unsigned long magic, struct fs_info *out)
{
	memset(out, 0, sizeof(*out));
	out->magic = magic;
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		if (known[i].magic == (magic & 0xFFFFFFFFul)) {
			snprintf(out->name, sizeof(out->name), "%s", known[i].name);
			out->remote = known[i].remote;
			out->known = true;
			return;
		}
	}
	snprintf(out->name, sizeof(out->name), "0x%lx", magic & 0xFFFFFFFFul);
}

int
fstype_of_fd(int fd, struct fs_info *out)
{
	struct statfs st;
	struct statx sx;
	struct stat sb;
	dev_t dev;
	int err;

	if (fstatfs(fd, &st) == 0) {
		fstype_classify((unsigned long)st.f_type, out);
		return 0;
	}
	/* statfs asks the filesystem, and a network one whose server does not
	 * answer fails it (EIO, ETIMEDOUT on a soft mount): the mount table
	 * names it without asking, where "failed, so local" would not. Its
	 * device comes from the attributes cached (AT_STATX_DONT_SYNC): fstat
	 * would ask the same server again once they expired (NFS, FUSE). */
	err = -errno;
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &sx) == 0)
		dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	else if (fstat(fd, &sb) == 0)
		dev = sb.st_dev;
	else
		dev = 0;
	if (dev != 0 && fstype_of_dev("/proc/self/mountinfo", dev, out) == 0)
		return 0;
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "unknown");
	return err;
}

/* Names mountinfo gives that none of known[] starts: FUSE's own. */
static const char *const remote_names[] = { "virtiofs", "sshfs", "glusterfs", "pvfs2" };

void
fstype_classify_name(const char *type, struct fs_info *out)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "%s", type);
	snprintf(out->type, sizeof(out->type), "%s", type);
	/* "nfs4" is nfs, "fuse.sshfs" and "fuseblk" fuse, "smb3" smb. */
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strncmp(type, known[i].name, strlen(known[i].name)) == 0) {
			out->magic = known[i].magic;
			out->remote = known[i].remote;
			out->known = true;
			if (out->remote)
				snprintf(out->name, sizeof(out->name), "%s", known[i].name);
			return;
		}
	for (size_t i = 0; i < sizeof(remote_names) / sizeof(remote_names[0]); i++)
		if (strcmp(type, remote_names[i]) == 0)
			out->remote = out->known = true;
}

/* The next blank-separated field of s from *at: its start, its length in
 * *n (0 when there is none), *at past it. */
static const char *
next_field(const char *s, size_t *at, size_t *n)
{
	const char *f;

	while (s[*at] != '\0' && isspace((unsigned char)s[*at]))
		(*at)++;
	f = s + *at;
	while (s[*at] != '\0' && !isspace((unsigned char)s[*at]))
		(*at)++;
	*n = (size_t)(s + *at - f);
	return f;
}

/* The UID of the super options opt's (n bytes: "rw,user_id=UID,...")
 * first user_id= option, at the start or after a ',' (no other option's
 * tail): -1 where there is none or it is not a number below 2^31. */
static long
user_id_of(const char *opt, size_t n)
{
	const char *end = opt + n, *o = opt, *d;
	int64_t v = 0;

	while (!(end - o > 8 && strncmp(o, "user_id=", 8) == 0)) {
		const char *comma = memchr(o, ',', (size_t)(end - o));

		if (comma == NULL)
			return -1;
		o = comma + 1;
	}
	for (d = o + 8; d < end && *d >= '0' && *d <= '9' && v <= INT32_MAX; d++)
		v = v * 10 + (*d - '0');
	return d > o + 8 && v <= INT32_MAX && (d == end || *d == ',') ? (long)v : -1;
}

/* One mountinfo line's mount ID, device and filesystem type (type has 64
 * bytes: a longer one is cut there, the fields after it read where they
 * are): 0, or -1 when the line does not name them. Fields: id parent major:minor
 * root mountpoint options... - type source superoptions (the kernel
 * escapes blanks in each as \040: the super options are the last field,
 * never the source, which a FUSE mount's user names: fsname=). *user is
 * the UID of a FUSE mount's user_id=UID super option, -1 where the line
 * has none (or it is not a number). */
static int
parse_mount(const char *line, uint64_t *id, dev_t *dev, char *type, long *user)
{
	unsigned maj, min;
	const char *sep = strstr(line, " - "), *f, *opt = NULL;
	size_t at = 0, n, optn = 0;

	if (sscanf(line, "%" SCNu64 " %*u %u:%u", id, &maj, &min) != 3 || sep == NULL)
		return -1;
	sep += 3;
	f = next_field(sep, &at, &n);
	if (n == 0)
		return -1;
	snprintf(type, 64, "%.*s", (int)(n < 63 ? n : 63), f);
	*dev = makedev(maj, min);
	(void)next_field(sep, &at, &n); /* the source */
	/* The super options: the last field after the source. */
	while ((f = next_field(sep, &at, &n), n > 0)) {
		opt = f;
		optn = n;
	}
	*user = opt != NULL ? user_id_of(opt, optn) : -1;
	return 0;
}

/* Whether mountinfo's type names a FUSE mount: "fuse" or "fuseblk", with
 * a ".subtype" or not (not "fusectl", the connections' directory). */
static bool
fuse_type(const char *type)
{
	size_t n = strncmp(type, "fuseblk", 7) == 0 ? 7 : strncmp(type, "fuse", 4) == 0 ? 4 : 0;

	return n > 0 && (type[n] == '\0' || type[n] == '.');
}

/* Adds line's mount to t, when it names one: 0 or -ENOMEM. */
static int
add_mount(struct fs_mounts *t, const char *line)
{
	char type[64];
	uint64_t id;
	long user;
	dev_t dev;

	if (parse_mount(line, &id, &dev, type, &user) < 0)
		return 0;
	if (t->n == t->cap) {
		size_t more = t->cap ? t->cap * 2 : 64;
		struct fs_mount *m = reallocarray(t->mounts, more, sizeof(*m));

		if (m == NULL)
			return -ENOMEM;
		t->mounts = m;
		t->cap = more;
	}
	t->mounts[t->n].id = id;
	t->mounts[t->n].dev = dev;
	fstype_classify_name(type, &t->mounts[t->n].fs);
	/* A FUSE mount whose user_id the line does not say is a user's, by
	 * no one known: fails closed. */
	if (user != 0 && fuse_type(type)) {
		t->mounts[t->n].fs.user_mount = true;
		t->mounts[t->n].fs.mounter = user > 0 ? (uid_t)user : (uid_t)-1;
	}
	t->n++;
	return 0;
}

int
fstype_mounts_add(struct fs_mounts *t, const char *text, size_t len)
{
	char *line = NULL;
	size_t at = 0, cap = 0;
	int err = 0;

	/* Each line copied and terminated before it is parsed. */
	while (err == 0 && at < len) {
		const char *nl = memchr(text + at, '\n', len - at);
		size_t n = nl != NULL ? (size_t)(nl - (text + at)) : len - at;

		if (n >= cap) {
			char *more = realloc(line, n + 1);

			if (more == NULL) {
				err = -ENOMEM;
				break;
			}
			line = more;
			cap = n + 1;
		}
		memcpy(line, text + at, n);
		line[n] = '\0';
		err = add_mount(t, line);
		at += n + (nl != NULL);
	}
	free(line);
	return err;
}

/* The mount table open at fd (not closed), read whole (at most
 * FS_MOUNTINFO_MAX) and parsed into *out: 0, or -errno reading it, or
 * -ENOMEM; *out untouched on failure. Both readers' (fstype_mounts_read,
 * table_read): the kernel makes the file's text at the reads, so it is
 * read to its end and parsed once. */
static int
mounts_read_fd(int fd, struct fs_mounts *out)
{
	struct fs_mounts m = { 0 };
	size_t len = 0, cap = 0;
	char *buf = NULL;
	ssize_t n = 1;
	int err = 0;

	while (n > 0) {
		if (len == cap) {
			char *more = cap < FS_MOUNTINFO_MAX ?
				realloc(buf, cap ? cap * 2 : 65536) : NULL;

			if (more == NULL) {
				err = -ENOMEM;
				break;
			}
			buf = more;
			cap = cap ? cap * 2 : 65536;
		}
		while ((n = read(fd, buf + len, cap - len)) == -1 && errno == EINTR)
			;
		if (n < 0)
			err = -errno;
		else
			len += (size_t)n;
	}
	if (err == 0)
		err = fstype_mounts_add(&m, buf, len);
	free(buf);
	if (err < 0) {
		fstype_mounts_free(&m);
		return err;
	}
	*out = m;
	return 0;
}

int
fstype_mounts_read(const char *mountinfo, struct fs_mounts *out)
{
	int fd = open(mountinfo, O_RDONLY | O_CLOEXEC), err;

	if (fd == -1)
		return -errno;
	err = mounts_read_fd(fd, out);
	close(fd);
	return err;
}

/* The first mount of t with mount ID id (by_id) or device dev: 0 with
 * *out its filesystem, or -ENOENT. */
static int
mounts_find(const struct fs_mounts *t, bool by_id, uint64_t id, dev_t dev,
	struct fs_info *out)
{
	for (size_t i = 0; i < t->n; i++)
		if (by_id ? t->mounts[i].id == id : t->mounts[i].dev == dev) {
			*out = t->mounts[i].fs;
			return 0;
		}
	return -ENOENT;
}

int
fstype_mounts_find(const struct fs_mounts *t, dev_t dev, struct fs_info *out)
{
	return mounts_find(t, false, 0, dev, out);
}

int
fstype_mounts_find_id(const struct fs_mounts *t, uint64_t id, struct fs_info *out)
{
	return mounts_find(t, true, id, 0, out);
}

void
fstype_mounts_free(struct fs_mounts *t)
{
	if (t == NULL)
		return;
	free(t->mounts);
	t->mounts = NULL;
	t->n = 0;
	t->cap = 0;
}

int
fstype_of_dev(const char *mountinfo, dev_t dev, struct fs_info *out)
{
	struct fs_mounts t = { 0 };
	int err = fstype_mounts_read(mountinfo, &t);

	if (err < 0)
		return err;
	err = fstype_mounts_find(&t, dev, out);
	fstype_mounts_free(&t);
	return err;
}

/* Whether the mount table open at fd changed since it was opened (or
 * since the last poll that said so): POLLPRI (with POLLERR) from the
 * kernel; a poll that fails says yes. */
static bool
table_changed(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLPRI };
	int r;

	while ((r = poll(&p, 1, 0)) == -1 && errno == EINTR)
		;
	return r != 0;
}

/* The mount table, opened and read afresh into t: 0, or -errno (t as it
 * was, its file closed; a table file that is missing, no procfs, is -EIO:
 * -ENOENT is fstype_table_find's for a device the table does not list).
 * The file stays open: the kernel counts changes from its open, so what
 * is read after can only be newer. */
static int
table_read(struct fs_table *t)
{
	struct fs_mounts m;
	int err;

	if (t->fd >= 0)
		close(t->fd);
	if ((t->fd = open(t->mountinfo, O_RDONLY | O_CLOEXEC)) == -1)
		return errno == ENOENT ? -EIO : -errno;
	if ((err = mounts_read_fd(t->fd, &m)) < 0) {
		close(t->fd);
		t->fd = -1;
		return err;
	}
	fstype_mounts_free(&t->mounts);
	t->mounts = m;
	t->reads++;
	return 0;
}

/* fstype_table_find(_id)'s look in t, as fs_table says, for the mount
 * mounts_find finds by id or dev. */
static int
table_find(struct fs_table *t, bool by_id, uint64_t id, dev_t dev, struct fs_info *out)
{
	int err;

	if ((t->fd < 0 || table_changed(t->fd)) && (err = table_read(t)) < 0)
		return err;
	err = mounts_find(&t->mounts, by_id, id, dev, out);
	if (err == -ENOENT && !t->missed) {
		t->missed = true;
		if ((err = table_read(t)) < 0)
			return err;
		err = mounts_find(&t->mounts, by_id, id, dev, out);
	}
	return err;
}

int
fstype_table_find(struct fs_table *t, dev_t dev, struct fs_info *out)
{
	return table_find(t, false, 0, dev, out);
}

int
fstype_table_find_id(struct fs_table *t, uint64_t id, struct fs_info *out)
{
	return table_find(t, true, id, 0, out);
}

void
fstype_table_free(struct fs_table *t)
{
	if (t == NULL)
		return;
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
	fstype_mounts_free(&t->mounts);
	t->missed = false;
	t->reads = 0;
}

static const char *const watch_names[] = {
	[FS_WATCH_AUTO] = "auto",
	[FS_WATCH_INOTIFY] = "inotify",
	[FS_WATCH_POLL] = "poll",
};

static const char *const stage_names[] = {
	[FS_STAGE_AUTO] = "auto",
	[FS_STAGE_YES] = "yes",
	[FS_STAGE_NO] = "no",
};

/* The index of s in names (n of them): 0.., or -EINVAL. */
static int
word_index(const char *const *names, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0)
			return (int)i;
	return -EINVAL;
}

int
fs_watch_parse(const char *s, enum fs_watch *out)
{
	int i = word_index(watch_names, sizeof(watch_names) / sizeof(watch_names[0]), s);

	if (i < 0)
		return i;
	*out = (enum fs_watch)i;
	return 0;
}

int
fs_stage_parse(const char *s, enum fs_stage *out)
{
	int i = word_index(stage_names, sizeof(stage_names) / sizeof(stage_names[0]), s);

	if (i < 0)
		return i;
	*out = (enum fs_stage)i;
	return 0;
}

const char *
fs_watch_name(enum fs_watch w)
{
	return (unsigned)w < sizeof(watch_names) / sizeof(watch_names[0]) ? watch_names[w] : "auto";
}

const char *
fs_stage_name(enum fs_stage s)
{
	return (unsigned)s < sizeof(stage_names) / sizeof(stage_names[0]) ? stage_names[s] : "auto";
}
