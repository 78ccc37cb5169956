/*
 * mountrule.c: wcached's rule for mounts inside a model's tree and for a
 * directory model's names (see mountrule.h).
 */
#include "mountrule.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/path.h"
#include "format/shards.h"
#include "format/tree.h"
#include "fstype.h"

#define MOUNTINFO "/proc/self/mountinfo"

/*
 * The mount m as the mount table t lists it (t NULL: no table, -ENOMEM):
 * 0 with *fs its filesystem; or -errno with on (len bytes) naming the
 * mount and why the table cannot tell. -ENOENT: no line has m's mount ID
 * (after one reading again): the mount is gone since the walk stepped
 * onto it, unmounted or detached (umount -l), and a detached FUSE mount
 * still answers through the walk's descriptor, from its user's server
 * (review rev208 H2). A btrfs subvolume, whose files have a device of
 * their own, keeps its mount's ID: judged by that mount's line.
 * Where the kernel gives no mount ID (STATX_MNT_ID, before Linux 5.8),
 * the mount is found by its device, and a device no line lists counts as
 * local (*fs "unlisted"), for btrfs: on such a kernel a mount detached
 * between the step and the look is walked into as local.
 */
static int
mount_find(struct fs_table *t, const struct tree_mount *m, struct fs_info *fs, char *on,
	size_t len)
{
	int r = -ENOMEM;

	if (t != NULL && m->has_id)
		r = fstype_table_find_id(t, m->id, fs);
	else if (t != NULL && (r = fstype_table_find(t, m->dev, fs)) == -ENOENT) {
		fstype_classify_name("unlisted", fs);
		return 0;
	}
	if (r == -ENOENT)
		snprintf(on, len, "mount %" PRIu64 " (device %u:%u), gone from %s (unmounted, or "
			"detached: umount -l)", m->id, major(m->dev), minor(m->dev), MOUNTINFO);
	else if (r < 0)
		snprintf(on, len, "device %u:%u, whose filesystem %s cannot tell (%s)",
			major(m->dev), minor(m->dev), MOUNTINFO, strerror(-r));
	return r;
}

/* Whether a file on the mount m may be opened, from the mount table t
 * (mount_find): 0, or -errno with why naming the mount (a remote one:
 * -EXDEV) or what kept the table from telling. */
static int
remote_verdict(struct fs_table *t, const struct tree_mount *m, char *why, size_t len)
{
	struct fs_info fs;
	int r = mount_find(t, m, &fs, why, len);

	if (r < 0)
		return r;
	if (fs.remote) {
		snprintf(why, len, "%s (device %u:%u, a mount of its own)", fs.name,
			major(m->dev), minor(m->dev));
		return -EXDEV;
	}
	return 0;
}

/* tree_mounts' mount_ok: remote_verdict, told from the mount table read
 * afresh (no filesystem asked). */
static int
tree_mount_ok(const struct tree_mount *m, char *why, size_t len)
{
	struct fs_table t = FS_TABLE_INIT(MOUNTINFO);
	int r = remote_verdict(&t, m, why, len);

	fstype_table_free(&t);
	return r;
}

/* A listing's mount table (shards_name_rule's run): read at its first
 * mounted name, again only when the kernel says the mounts changed (or
 * once for a device it does not list), not once per mounted name: a
 * neighbour's N mounts in a shared model directory made one listing N
 * whole reads of an N-line table (review rev208 M3). */
static void
name_run_end(void *run)
{
	fstype_table_free(run);
	free(run);
}

/* shards_name_rule: a name in a directory model's directory dfd counts as
 * a model file unless a remote filesystem is mounted on it (a link there
 * is the opener's to judge: tree_mounts). statx(2) with AT_SYMLINK_NOFOLLOW
 * and AT_STATX_DONT_SYNC asks no server (a mount on the name shows its own
 * device); a name statx cannot see is left to the load's open, which says
 * why. The mount is told from the listing's table (*run, made here). */
static int
name_rule(void **run, int dfd, const char *name, char *why, size_t len)
{
	struct fs_table *t = *run;
	struct tree_mount m;
	struct statx sx;
	struct stat dir;
	char on[160];

	if (fstat(dfd, &dir) == -1 ||
		statx(dfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC,
			STATX_TYPE | STATX_MNT_ID, &sx) == -1)
		return 0;
	m = (struct tree_mount){ makedev(sx.stx_dev_major, sx.stx_dev_minor), sx.stx_mnt_id,
		(sx.stx_mask & STATX_MNT_ID) != 0 };
	if (m.dev == dir.st_dev)
		return 0;
	if (t == NULL && (t = malloc(sizeof(*t))) != NULL) {
		*t = (struct fs_table)FS_TABLE_INIT(MOUNTINFO);
		*run = t;
	}
	if (remote_verdict(t, &m, on, sizeof(on)) < 0) {
		snprintf(why, len, "%s is mounted on it", on);
		return -EXDEV;
	}
	return 0;
}

/* Whether a walk may step onto the mount m: 0; -EXDEV where it is a
 * user's FUSE mount (not root's, nor wcached's user's), on naming it; or
 * mount_find's error (a mount gone from the table, a table that cannot be
 * read), on saying it: a mount that cannot be judged is not walked onto
 * (review rev207 M1, rev208 H2). Told from the mount table only (t's):
 * *fs (when not NULL) the mount's filesystem where the table has it. */
static int
mount_ok(struct fs_table *t, const struct tree_mount *m, struct fs_info *fs, char *on,
	size_t len)
{
	struct fs_info own;
	int r;

	if (fs == NULL)
		fs = &own;
	if ((r = mount_find(t, m, fs, on, len)) < 0)
		return r;
	if (!fs->user_mount || fs->mounter == geteuid())
		return 0;
	if (fs->mounter == (uid_t)-1) /* fstype.c: no user_id that can be read */
		snprintf(on, len, "fuse (device %u:%u) whose user the mount table does not name",
			major(m->dev), minor(m->dev));
	else
		snprintf(on, len, "fuse (device %u:%u) mounted by uid %u", major(m->dev),
			minor(m->dev), (unsigned)fs->mounter);
	return -EXDEV;
}

/* The most mounts one walk crosses: a path of a few mounts crosses a few;
 * a neighbour's 40 links of "/proc/.." made one walk cross 40,000, each
 * judged (review rev207 H4: 0.37 s of a work thread a walk, with 500
 * mounts; 75 s when each read the table). */
#define WALK_CROSSINGS 64

/* What a walk of a path carries from its directory's walk to that of its
 * last name (open_in): the links followed and the mounts crossed so far,
 * so that the two walks are bounded as the whole path's walk is. */
struct carried {
	int links;
	int crossings;
};

/* What a walk's judge is given: the run (its table and budget), the path
 * walked, the mounts the walk crossed so far, and the walk itself with
 * the links it had followed before it began (the run's links are charged
 * by link_ok as the walk goes); fs: NULL, or where the judge tells the
 * filesystem of the mount it judged (mountrule_hand_open's). */
struct judged {
	struct mountrule_walk *run;
	const char *path;
	int crossings;
	const struct tree_walk *walk;
	int links_before;
	struct fs_info *fs;
};

/* tree_walk's judge for a model's path: a mount crossed is walked onto
 * unless it is a user's FUSE mount, or cannot be judged; why names the
 * path, the name on it, the mount and the reason. */
static int
judge(void *ctx, const struct tree_mount *m, const char *name, char *why, size_t len)
{
	struct judged *j = ctx;
	char on[160];
	int r;

	if (++j->crossings > WALK_CROSSINGS) {
		snprintf(why, len, "%s: %s: the walk crossed more than %d mounts: wcached walks no "
			"further (a neighbour's links can make one walk cross thousands)", j->path,
			name, WALK_CROSSINGS);
		return -EXDEV;
	}
	r = mount_ok(&j->run->table, m, j->fs, on, sizeof(on));
	if (r == -EXDEV)
		snprintf(why, len, "%s: %s lies on %s: wcached walks into no user's FUSE mount (a "
			"neighbour's server may never answer)", j->path, name, on);
	else if (r < 0)
		snprintf(why, len, "%s: %s lies on %s: wcached walks onto no mount it cannot "
			"judge", j->path, name, on);
	return r < 0 ? -EXDEV : 0;
}

/*
 * tree_walk's question before a link of a model's path is read: none on
 * procfs is walked. A "magic" link there (/proc/PID/fd/N, cwd, root, exe)
 * leads where its text does not say: to the file a process holds open,
 * which may be on a neighbour's FUSE mount he has since detached (no
 * mount table lists it; its text is "/"), and the kernel's stat of the
 * path would ask his server (review rev207 H3). /proc's own text links
 * (/proc/self) cannot be told from them without following them: a model's
 * path through /proc, /dev/fd or /dev/stdin is refused with them. A table
 * that cannot be read refuses the link too, and a run whose budget of
 * links it would pass ends there (-ELOOP, spent).
 */
static int
link_ok(void *ctx, const struct tree_mount *m, const char *name, char *why, size_t len)
{
	const struct judged *j = ctx;
	struct mountrule_walk *run = j->run;
	struct fs_info fs;
	char on[160];
	int r;

	if (run->max_links > 0 &&
		run->links + (j->walk->links - j->links_before) >= run->max_links) {
		run->spent = true;
		snprintf(why, len, "%s: %s: the run of walks would follow more than %d links: "
			"wcached walks no further", j->path, name, run->max_links);
		return -ELOOP;
	}
	r = mount_find(&run->table, m, &fs, on, sizeof(on));
	if (r == 0 && strcmp(fs.name, "proc") != 0)
		return 0;
	if (r < 0)
		snprintf(why, len, "%s: %s is a link on %s: wcached follows no link it cannot "
			"judge", j->path, name, on);
	else
		snprintf(why, len, "%s: %s is a link on /proc (device %u:%u): wcached follows none "
			"in a model's path (its text need not be where it leads: a process's "
			"descriptor of a neighbour's FUSE file); name the model's file by its path "
			"(descriptors here are the daemon's own)", j->path, name, major(m->dev),
			minor(m->dev));
	return -EXDEV;
}

/* The walk (tree_walk, as the kernel walks, judged) of the path's text
 * (n bytes) from cur (owned) in the run w, with what *c carried before
 * (and after): the descriptor, or -errno (-EXDEV with why; -ELOOP past
 * the run's budget, spent set, or at once where it was spent before). */
static int
walk_text(struct mountrule_walk *w, const char *text, size_t n, int cur, struct carried *c,
	const char *path, char *why, size_t len)
{
	struct judged j = { w, path, c->crossings, NULL, c->links, NULL };
	struct tree_walk t = { .judge = judge, .link = link_ok, .ctx = &j, .links = c->links };
	char *copy;
	int r;

	j.walk = &t;
	if (w->max_steps > 0 && w->steps >= w->max_steps)
		w->spent = true;
	if (w->spent) {
		close(cur);
		snprintf(why, len, "%s: the run of walks looked up %ld names and followed %d links "
			"in all: wcached walks no further", path, w->steps, w->links);
		return -ELOOP;
	}
	if (n >= PATH_MAX) {
		close(cur);
		return -ENAMETOOLONG;
	}
	if ((copy = strndup(text, n)) == NULL) {
		close(cur);
		return -ENOMEM;
	}
	t.max_steps = w->max_steps > 0 ? w->max_steps - w->steps : 0;
	r = tree_walk(cur, copy, &t, why, len);
	w->steps += t.steps;
	w->links += t.links - c->links;
	if (r == -ELOOP && t.max_steps > 0 && t.steps >= t.max_steps) {
		w->spent = true;
		snprintf(why, len, "%s: the run of walks would look up more than %ld names: "
			"wcached walks no further", path, w->max_steps);
	}
	c->links = t.links;
	c->crossings = j.crossings;
	free(copy);
	close(cur);
	return r;
}

/* The directory a walk of path starts from (path absolute or not), owned:
 * or -errno. */
static int
start_of(const char *path)
{
	int fd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

void
mountrule_walk_init(struct mountrule_walk *w)
{
	*w = (struct mountrule_walk){ .table = FS_TABLE_INIT(MOUNTINFO), .dir_fd = -1 };
}

void
mountrule_walk_end(struct mountrule_walk *w)
{
	if (w == NULL)
		return;
	fstype_table_free(&w->table);
	if (w->dir_fd >= 0)
		close(w->dir_fd);
	free(w->dir);
	w->dir = NULL;
	w->dir_fd = -1;
	w->dir_links = 0;
	w->dir_crossings = 0;
}

/*
 * The directory of path (its text before the last '/', dlen bytes),
 * walked from the start, or from w's when it is that one: its descriptor
 * (owned), *c the links followed and the mounts crossed to reach it; or
 * -errno. A directory walked to becomes w's.
 */
static int
dir_of(struct mountrule_walk *w, const char *path, size_t dlen, struct carried *c, char *why,
	size_t len)
{
	const char *text = dlen > 0 ? path : "/";
	size_t n = dlen > 0 ? dlen : 1;
	struct stat st;
	char *copy;
	int fd, dup;

	if (w->dir != NULL && strlen(w->dir) == n && memcmp(w->dir, text, n) == 0) {
		*c = (struct carried){ w->dir_links, w->dir_crossings };
		fd = fcntl(w->dir_fd, F_DUPFD_CLOEXEC, 0);
		return fd < 0 ? -errno : fd;
	}
	if ((fd = start_of(path)) < 0 ||
		(fd = walk_text(w, text, n, fd, c, path, why, len)) < 0)
		return fd;
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && (copy = strndup(text, n)) != NULL) {
		if ((dup = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
			free(copy);
			return fd;
		}
		if (w->dir_fd >= 0)
			close(w->dir_fd);
		free(w->dir);
		w->dir = copy;
		w->dir_fd = dup;
		w->dir_links = c->links;
		w->dir_crossings = c->crossings;
	}
	return fd;
}

/* mountrule_open in the run w: path's directory (w's, or walked and made
 * w's), then its last name from there, with the links and crossings of
 * the way to the directory carried (40 and 64 for the whole path, as its
 * walk of its own has); a path with no directory, or whose last name is
 * "", "." or "..", is walked whole. */
static int
open_in(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	const char *slash = strrchr(path, '/'), *base = slash != NULL ? slash + 1 : path;
	struct carried c = { 0, 0 };
	int fd;

	if (strlen(path) >= PATH_MAX)
		return -ENAMETOOLONG;
	if (slash == NULL || base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
		return (fd = start_of(path)) < 0 ? fd :
			walk_text(w, path, strlen(path), fd, &c, path, why, len);
	if ((fd = dir_of(w, path, (size_t)(slash - path), &c, why, len)) < 0)
		return fd;
	return walk_text(w, base, strlen(base), fd, &c, path, why, len);
}

int
mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	struct mountrule_walk own;
	struct carried c = { 0, 0 };
	char none[8];
	int r;

	if (why == NULL || len == 0) {
		why = none;
		len = sizeof(none);
	}
	if (w != NULL)
		return open_in(w, path, why, len);
	/* A walk of its own: the whole path from the start. */
	mountrule_walk_init(&own);
	if ((r = start_of(path)) >= 0)
		r = walk_text(&own, path, strlen(path), r, &c, path, why, len);
	mountrule_walk_end(&own);
	return r;
}

int
mountrule_stat(struct mountrule_walk *w, const char *path, struct stat *st, char *why,
	size_t len)
{
	int fd = mountrule_open(w, path, why, len), e;

	if (fd < 0) {
		errno = -fd;
		return -1;
	}
	e = fstat(fd, st) == 0 ? 0 : errno;
	close(fd);
	errno = e;
	return e == 0 ? 0 : -1;
}

/* h->dev made the device of the directory h->dir, and *h->fs (where set)
 * its filesystem (statx AT_STATX_DONT_SYNC: no server asked): 0, or
 * -errno. */
static int
hand_at(struct mountrule_hand *h)
{
	struct tree_mount m;
	struct statx sx;
	char on[160];

	if (statx(h->dir, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_MNT_ID,
		    &sx) == -1)
		return -errno;
	m = (struct tree_mount){ makedev(sx.stx_dev_major, sx.stx_dev_minor), sx.stx_mnt_id,
		(sx.stx_mask & STATX_MNT_ID) != 0 };
	h->dev = m.dev;
	if (h->fs != NULL && mount_find(&h->run.table, &m, h->fs, on, sizeof(on)) < 0)
		fstype_classify_name("unknown", h->fs);
	return 0;
}

int
mountrule_hand_start(struct mountrule_hand *h)
{
	mountrule_walk_init(&h->run);
	h->crossings = 0;
	h->rest = h->todo = strdup(h->path);
	snprintf(h->where, sizeof(h->where), "%s", h->path[0] == '/' ? "/" : "");
	if ((h->dir = start_of(h->path)) < 0) {
		int err = h->dir;

		h->dir = -1;
		return err;
	}
	return h->todo == NULL ? -ENOMEM : hand_at(h);
}

void
mountrule_hand_end(struct mountrule_hand *h)
{
	if (h->dir >= 0)
		close(h->dir);
	h->dir = -1;
	free(h->todo);
	h->todo = NULL;
	mountrule_walk_end(&h->run);
}

int
mountrule_hand_next(struct mountrule_hand *h, char *name)
{
	int r;

	while ((r = path_next_name(&h->rest, name)) > 0 && strcmp(name, ".") == 0)
		;
	return r;
}

int
mountrule_hand_open(struct mountrule_hand *h, const char *name, dev_t *dev,
	struct fs_info *on, char *why, size_t len)
{
	struct judged j = { &h->run, h->path, h->crossings, NULL, 0, on };
	struct tree_mount m;
	struct statx sx;
	int fd = openat(h->dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC,
		    STATX_TYPE | STATX_MNT_ID, &sx) == -1) {
		r = -errno;
		close(fd);
		return r;
	}
	m = (struct tree_mount){ makedev(sx.stx_dev_major, sx.stx_dev_minor), sx.stx_mnt_id,
		(sx.stx_mask & STATX_MNT_ID) != 0 };
	if (m.dev != h->dev && (r = judge(&j, &m, name, why, len)) != 0)
		close(fd);
	h->crossings = j.crossings;
	*dev = m.dev;
	return r != 0 ? r : fd;
}

const char *
mountrule_hand_spell(const struct mountrule_hand *h, const char *name, char *buf, size_t len)
{
	const char *where = h->where, *slash = strrchr(where, '/');
	const char *last = slash != NULL ? slash + 1 : where;

	/* "..": the last name dropped, or ".." added where none is left to
	 * drop (a relative path above its start). */
	if (strcmp(name, "..") == 0 && strcmp(where, "/") == 0)
		snprintf(buf, len, "/");
	else if (strcmp(name, "..") == 0 && where[0] != '\0' && strcmp(last, "..") != 0)
		snprintf(buf, len, "%.*s", slash == NULL ? 0 : slash == where ? 1 :
			(int)(slash - where), where);
	else
		snprintf(buf, len, "%s%s%s", where, where[0] != '\0' &&
			where[strlen(where) - 1] != '/' ? "/" : "", name);
	return buf;
}

void
mountrule_hand_into(struct mountrule_hand *h, int fd, dev_t dev, const char *name)
{
	char where[PATH_MAX];

	close(h->dir);
	h->dir = fd;
	h->dev = dev;
	snprintf(h->where, sizeof(h->where), "%s",
		mountrule_hand_spell(h, name, where, sizeof(where)));
}

int
mountrule_hand_follow(struct mountrule_hand *h, const char *text)
{
	char *next;

	if (asprintf(&next, "%s%s", text, h->rest) < 0)
		return -ENOMEM;
	free(h->todo);
	h->rest = h->todo = next;
	if (text[0] != '/')
		return 0;
	close(h->dir);
	snprintf(h->where, sizeof(h->where), "/");
	if ((h->dir = start_of("/")) < 0) {
		int err = h->dir;

		h->dir = -1;
		return err;
	}
	return hand_at(h);
}

/* statmount(2) (Linux 6.8; x86_64 and arm64 give it one number) and
 * statx's unique mount ID, which it takes, where the headers lack them. */
#if !defined(SYS_statmount) && (defined(__x86_64__) || defined(__aarch64__))
#define SYS_statmount 457
#endif
#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x4000U
#endif

/*
 * Whether the kernel finds the mount of the file fd holds in this mount
 * namespace: statmount(2) of its unique mount ID (statx
 * STATX_MNT_ID_UNIQUE, AT_STATX_DONT_SYNC: no server asked), which asks
 * the namespace's own mounts, not one line of a table read whole (1.6 ms
 * a call with 1,000 mounts, and a warm restart asks once or twice for each
 * stored file). 1 where it finds it; 0 where it cannot say so (no
 * statmount or no unique ID: before Linux 6.8; not found, or refused: EPERM
 * from a seccomp filter that does not know it, as systemd 252's
 * @system-service, which wcached.service allows, does not; then the mount
 * table answers, and tests/system's syscall check counts it a probe).
 */
static int
found_by_statmount(int fd)
{
#ifdef SYS_statmount
	/* linux/mount.h's struct mnt_id_req, version 0 */
	struct {
		uint32_t size;
		uint32_t spare;
		uint64_t mnt_id;
		uint64_t param;
	} req = { .size = 24, .param = 1 /* STATMOUNT_SB_BASIC */ };
	uint64_t out[512];
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID_UNIQUE, &sx) == -1 ||
		(sx.stx_mask & STATX_MNT_ID_UNIQUE) == 0)
		return 0;
	req.mnt_id = sx.stx_mnt_id;
	return syscall(SYS_statmount, &req, out, sizeof(out), 0) == 0;
#else
	(void)fd;
	return 0;
#endif
}

/*
 * Whether the mount of the file fd holds is attached: found by statmount
 * (found_by_statmount), or else its mount ID (statx AT_STATX_DONT_SYNC of
 * the descriptor: no server asked) in the run w's mount table (read again
 * where the kernel says the mounts changed since; fd_name's callers always
 * give a run), which alone refuses. 0; -ENOENT where no line has it, after one
 * reading again: the mount was detached (umount -l) or is another
 * namespace's, and the kernel names the file from that mount's own root
 * ("/llama/model.safetensors"), a path here that is not the file (review
 * rev215 L1); or -errno where the descriptor or the table cannot tell.
 * Where the kernel gives no mount ID (before Linux 5.8): 0, the name taken
 * as the kernel gives it, since a device cannot tell it (a detached
 * mount's device may be listed for another of its mounts, and a btrfs
 * subvolume's files have a device no line lists): "Not yet safe", README.
 *
 * Not made redundant by fd_name's walk of the name (same_file_at): for a
 * live file the walk refuses what this refuses, but where this root has
 * the same filesystem mounted so that the kernel's name leads to the very
 * file (its device and inode: the root filesystem, to a descriptor a
 * previous start of wcached.service stored), a right name this refuses.
 * A removed file's name is not walked, though, and one removed from a
 * detached mount is named from that mount's root ("/llama/old.safetensors
 * (deleted)"), no path it was removed from here: only this refuses it
 * (test_realpath_detached; a previous start's swept copy in a stage_dir
 * bind-mounted on itself would be named "/m.1/m.safetensors").
 */
static int
fd_attached(struct mountrule_walk *w, int fd)
{
	struct fs_info fs;
	struct statx sx;

	if (found_by_statmount(fd))
		return 0;
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID, &sx) == -1)
		return -errno;
	if ((sx.stx_mask & STATX_MNT_ID) == 0)
		return 0;
	return fstype_table_find_id(&w->table, sx.stx_mnt_id, &fs);
}

/*
 * Whether name, walked by the judged walk in the run w (NULL: one of its
 * own), reaches the very file fd holds (its device and inode, as the
 * kernel has them: no server asked): 0; -ESTALE where it reaches another;
 * the walk's -errno where it reaches none.
 */
static int
same_file_at(struct mountrule_walk *w, int fd, const char *name)
{
	struct statx a, b;
	int wfd = mountrule_open(w, name, NULL, 0), e;

	if (wfd < 0)
		return wfd;
	/* Identities as cached (AT_STATX_DONT_SYNC): no server asked. */
	e = statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &a) != 0 ||
		statx(wfd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &b) != 0 ? -errno :
		(a.stx_mask & b.stx_mask & STATX_INO) == 0 ? -ENOTSUP :
		a.stx_dev_major != b.stx_dev_major || a.stx_dev_minor != b.stx_dev_minor ||
		a.stx_ino != b.stx_ino ? -ESTALE : 0;
	close(wfd);
	return e;
}

/*
 * mountrule_fd_realpath and mountrule_fd_name: the kernel's name for the
 * file fd holds (readlink(2) of /proc/self/fd/N), then its mount checked
 * attached (fd_attached: after the read, so that the name was read while
 * it was; a detached mount is never attached again), then the name
 * walked (same_file_at): taken only where that reaches the descriptor's
 * own file, since an attached mount can name a file that is not there
 * too: one reached through a bind mount of a subdirectory and moved out
 * of it is "/" (review rev217 M3). removed NULL: a name ending
 * " (deleted)" is refused (ENOENT); else it is given without it, *removed
 * set, and not walked (a removed file is at no name).
 */
static char *
fd_name(struct mountrule_walk *w, int fd, const char *path, bool *removed, char *why,
	size_t len)
{
	static const char deleted[] = " (deleted)";
	char link[32], *name;
	ssize_t n;
	size_t d = sizeof(deleted) - 1;
	bool gone = false;
	int e, attached = 0, walked = 0;

	if (why == NULL)
		len = 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((name = malloc(PATH_MAX)) == NULL)
		return NULL;
	n = readlink(link, name, PATH_MAX);
	e = n < 0 ? errno : n >= PATH_MAX ? ENAMETOOLONG : 0;
	if (n >= 0 && n < PATH_MAX) {
		name[n] = '\0';
		gone = (size_t)n >= d && strcmp(name + n - d, deleted) == 0;
		if (name[0] != '/' || (gone && removed == NULL))
			e = ENOENT;
	}
	if (e == 0 && (e = -(attached = fd_attached(w, fd))) == 0) {
		if (removed != NULL && (*removed = gone))
			name[n - (ssize_t)d] = '\0';
		/* A removed file's name cannot be walked to it: given as the
		 * path it was removed from (mountrule_fd_name's). */
		if (gone || (walked = same_file_at(w, fd, name)) == 0)
			return name; /* its PATH_MAX bytes */
		e = walked == -ENOMEM ? ENOMEM : ENOENT;
	}
	if (len > 0 && e == ENAMETOOLONG)
		snprintf(why, len, "%s: its real path is %d bytes or more: it cannot be told",
			path, PATH_MAX);
	else if (len > 0 && attached == -ENOENT)
		snprintf(why, len, "%s: the file the walk reached is on a mount gone from %s "
			"(detached: umount -l; the kernel names it %.*s, from that mount's own "
			"root)", path, MOUNTINFO, (int)(n > 200 ? 200 : n), name);
	else if (len > 0 && walked < 0)
		snprintf(why, len, "%s: the kernel names the file the walk reached %.*s, and a "
			"walk of that name %s (a bind mount's file moved out of its subtree, or "
			"another mount namespace's name): its real path cannot be told", path,
			(int)(n > 200 ? 200 : n), name, walked == -ESTALE ? "reaches another file" :
			"reaches no file");
	else if (len > 0 && attached < 0)
		snprintf(why, len, "%s: whether the mount of the file the walk reached is "
			"attached cannot be told (%s)", path, strerror(e));
	else if (len > 0 && e == ENOENT && n >= 0)
		snprintf(why, len, "%s: the file the walk reached has no path now (the kernel "
			"names it %.*s)", path, (int)(n > 200 ? 200 : n), name);
	else if (len > 0)
		snprintf(why, len, "%s: its real path cannot be read (%s: %s)", path, link,
			strerror(e));
	free(name);
	errno = e;
	return NULL;
}

/* fd_name in the run w, or in one of its own (w NULL): the mount table
 * read once for its check and its walk. */
static char *
fd_name_in(struct mountrule_walk *w, int fd, const char *path, bool *removed, char *why,
	size_t len)
{
	struct mountrule_walk own;
	char *name;
	int e;

	if (w != NULL)
		return fd_name(w, fd, path, removed, why, len);
	mountrule_walk_init(&own);
	name = fd_name(&own, fd, path, removed, why, len);
	e = errno;
	mountrule_walk_end(&own);
	errno = e;
	return name;
}

char *
mountrule_fd_realpath(struct mountrule_walk *w, int fd, const char *path, char *why,
	size_t len)
{
	return fd_name_in(w, fd, path, NULL, why, len);
}

char *
mountrule_fd_name(struct mountrule_walk *w, int fd, const char *path, bool *removed,
	char *why, size_t len)
{
	return fd_name_in(w, fd, path, removed, why, len);
}

char *
mountrule_fd_under(struct mountrule_walk *w, int fd, const char *dir, unsigned depth)
{
	char link[32], *name, *tail, *at = NULL;
	unsigned seen = 0;
	ssize_t n;
	int e = ENOENT;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((name = malloc(PATH_MAX)) == NULL)
		return NULL;
	n = readlink(link, name, PATH_MAX);
	if (n > 0 && n < PATH_MAX && name[0] == '/' && depth > 0) {
		name[n] = '\0';
		/* The last depth names: the kernel's, from whichever root. */
		tail = NULL;
		for (char *q = name + n - 1; q >= name; q--)
			if (*q == '/' && ++seen == depth) {
				tail = q + 1;
				break;
			}
		if (tail == NULL || tail[0] == '\0' || name[n - 1] == '/' ||
			asprintf(&at, "%s/%s", dir, tail) < 0)
			at = NULL;
		else if ((e = -same_file_at(w, fd, at)) != 0) {
			free(at);
			at = NULL;
		}
	} else if (n < 0) {
		e = errno;
	}
	free(name);
	if (at == NULL)
		errno = e;
	return at;
}

char *
mountrule_realpath(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	struct mountrule_walk own;
	char *real = NULL;
	int fd, e;

	if (why != NULL && len > 0)
		why[0] = '\0';
	/* One run for the walk, the check and the walk of the name. */
	mountrule_walk_init(&own);
	if ((fd = mountrule_open(w != NULL ? w : &own, path, why, len)) < 0) {
		if (why != NULL && len > 0 && why[0] == '\0')
			snprintf(why, len, "%s: %s", path, strerror(-fd));
		e = -fd;
	} else {
		real = fd_name(w != NULL ? w : &own, fd, path, NULL, why, len);
		e = errno;
		close(fd);
	}
	mountrule_walk_end(&own);
	errno = e;
	return real;
}

static const struct tree_mounts rule = { tree_mount_ok };
static const struct shards_name_rule names = { name_rule, name_run_end };

void
mountrule_install(void)
{
	tree_mounts = &rule;
	shards_name_rule = &names;
}
