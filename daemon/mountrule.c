/*
 * mountrule.c: wcached's rule for mounts inside a model's tree and for a
 * directory model's names (see mountrule.h).
 */
#include "mountrule.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "format/shards.h"
#include "format/tree.h"
#include "fstype.h"

#define MOUNTINFO "/proc/self/mountinfo"

/* Whether a file on dev may be opened, from r, what the mount table said
 * of dev (fs: its filesystem, where r is 0): 0, or -errno with why naming
 * the mount or what kept the table from telling. A device no mount has
 * (btrfs gives its subvolumes their own) is local; FUSE's is always
 * listed. */
static int
dev_verdict(int r, dev_t dev, const struct fs_info *fs, char *why, size_t len)
{
	if (r == -ENOENT)
		return 0;
	if (r < 0) {
		snprintf(why, len, "device %u:%u, whose filesystem %s cannot tell (%s)",
			major(dev), minor(dev), MOUNTINFO, strerror(-r));
		return r;
	}
	if (fs->remote) {
		snprintf(why, len, "%s (device %u:%u, a mount of its own)", fs->name, major(dev),
			minor(dev));
		return -EXDEV;
	}
	return 0;
}

/* tree_mounts' dev_ok: dev_verdict, told from the mount table (no
 * filesystem asked). */
static int
dev_ok(dev_t dev, char *why, size_t len)
{
	struct fs_info fs;

	return dev_verdict(fstype_of_dev(MOUNTINFO, dev, &fs), dev, &fs, why, len);
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
	struct fs_info fs;
	struct statx sx;
	struct stat dir;
	char on[128];
	dev_t dev;
	int r;

	if (fstat(dfd, &dir) == -1 ||
		statx(dfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC,
			STATX_TYPE, &sx) == -1)
		return 0;
	dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	if (dev == dir.st_dev)
		return 0;
	if (t == NULL && (t = malloc(sizeof(*t))) != NULL) {
		*t = (struct fs_table)FS_TABLE_INIT(MOUNTINFO);
		*run = t;
	}
	r = t != NULL ? fstype_table_find(t, dev, &fs) : -ENOMEM;
	if (dev_verdict(r, dev, &fs, on, sizeof(on)) < 0) {
		snprintf(why, len, "%s is mounted on it", on);
		return -EXDEV;
	}
	return 0;
}

/* Whether a walk may step onto the mount on dev: 0; -EXDEV where it is a
 * user's FUSE mount (not root's, nor wcached's user's), on naming it; or
 * the error reading the mount table (-ENOMEM, -EMFILE): a mount that
 * cannot be judged is not walked onto (review rev207 M1). Told from the
 * mount table only (t's). */
static int
mount_ok(struct fs_table *t, dev_t dev, char *on, size_t len)
{
	struct fs_info fs;
	int r = fstype_table_find(t, dev, &fs);

	if (r == -ENOENT)
		return 0; /* no mount's device (btrfs gives subvolumes their own) */
	if (r < 0) {
		snprintf(on, len, "device %u:%u, whose filesystem %s cannot tell (%s)",
			major(dev), minor(dev), MOUNTINFO, strerror(-r));
		return r;
	}
	if (!fs.user_mount || fs.mounter == geteuid())
		return 0;
	if (fs.mounter == (uid_t)-1) /* fstype.c: no user_id that can be read */
		snprintf(on, len, "fuse (device %u:%u) whose user the mount table does not name",
			major(dev), minor(dev));
	else
		snprintf(on, len, "fuse (device %u:%u) mounted by uid %u", major(dev), minor(dev),
			(unsigned)fs.mounter);
	return -EXDEV;
}

/* The most mounts one walk crosses: a path of a few mounts crosses a few;
 * a neighbour's 40 links of "/proc/.." made one walk cross 40,000, each
 * judged (review rev207 H4: 0.37 s of a work thread a walk, with 500
 * mounts; 75 s when each read the table). */
#define WALK_CROSSINGS 64

/* What a walk's judge is given: the run's table, the path walked, and the
 * mounts the walk crossed so far. */
struct judged {
	struct fs_table *table;
	const char *path;
	int crossings;
};

/* tree_walk's judge for a model's path: a mount crossed is walked onto
 * unless it is a user's FUSE mount, or cannot be judged; why names the
 * path, the name on it, the mount and the reason. */
static int
judge(void *ctx, dev_t dev, const char *name, char *why, size_t len)
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
	r = mount_ok(j->table, dev, on, sizeof(on));
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
 * that cannot be read refuses the link too.
 */
static int
link_ok(void *ctx, dev_t dev, const char *name, char *why, size_t len)
{
	const struct judged *j = ctx;
	struct fs_info fs;
	int r = fstype_table_find(j->table, dev, &fs);

	if (r == -ENOENT || (r == 0 && strcmp(fs.name, "proc") != 0))
		return 0;
	if (r < 0)
		snprintf(why, len, "%s: %s is a link on device %u:%u, whose filesystem %s cannot "
			"tell (%s): wcached follows no link it cannot judge", j->path, name,
			major(dev), minor(dev), MOUNTINFO, strerror(-r));
	else
		snprintf(why, len, "%s: %s is a link on /proc (device %u:%u): wcached follows none "
			"in a model's path (its text need not be where it leads: a process's "
			"descriptor of a neighbour's FUSE file); name the model's file by its path "
			"(descriptors here are the daemon's own)", j->path, name, major(dev),
			minor(dev));
	return -EXDEV;
}

/* The walk (tree_walk, as the kernel walks, judged) of the path's text
 * (n bytes) from cur (owned), *links links followed before (and after):
 * the descriptor, or -errno (-EXDEV with why). */
static int
walk_text(struct fs_table *t, const char *text, size_t n, int cur, int *links,
	const char *path, char *why, size_t len)
{
	struct judged j = { t, path, 0 };
	struct tree_walk w = { .judge = judge, .link = link_ok, .ctx = &j, .links = *links };
	char *copy;
	int r;

	if (n >= PATH_MAX) {
		close(cur);
		return -ENAMETOOLONG;
	}
	if ((copy = strndup(text, n)) == NULL) {
		close(cur);
		return -ENOMEM;
	}
	r = tree_walk(cur, copy, &w, why, len);
	*links = w.links;
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
}

/*
 * The directory of path (its text before the last '/', dlen bytes),
 * walked from the start, or from w's when it is that one: its descriptor
 * (owned), *links the links followed to reach it; or -errno. A directory
 * walked to becomes w's.
 */
static int
dir_of(struct mountrule_walk *w, const char *path, size_t dlen, int *links, char *why,
	size_t len)
{
	const char *text = dlen > 0 ? path : "/";
	size_t n = dlen > 0 ? dlen : 1;
	struct stat st;
	char *copy;
	int fd, dup;

	if (w->dir != NULL && strlen(w->dir) == n && memcmp(w->dir, text, n) == 0) {
		*links = w->dir_links;
		fd = fcntl(w->dir_fd, F_DUPFD_CLOEXEC, 0);
		return fd < 0 ? -errno : fd;
	}
	if ((fd = start_of(path)) < 0 ||
		(fd = walk_text(&w->table, text, n, fd, links, path, why, len)) < 0)
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
		w->dir_links = *links;
	}
	return fd;
}

/* mountrule_open in the run w: path's directory (w's, or walked and made
 * w's), then its last name from there; a path with no directory, or whose
 * last name is "", "." or "..", is walked whole. */
static int
open_in(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	const char *slash = strrchr(path, '/'), *base = slash != NULL ? slash + 1 : path;
	int links = 0, fd;

	if (strlen(path) >= PATH_MAX)
		return -ENAMETOOLONG;
	if (slash == NULL || base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
		return (fd = start_of(path)) < 0 ? fd :
			walk_text(&w->table, path, strlen(path), fd, &links, path, why, len);
	if ((fd = dir_of(w, path, (size_t)(slash - path), &links, why, len)) < 0)
		return fd;
	return walk_text(&w->table, base, strlen(base), fd, &links, path, why, len);
}

int
mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	struct mountrule_walk own;
	int links = 0, r;
	char none[8];

	if (why == NULL || len == 0) {
		why = none;
		len = sizeof(none);
	}
	if (w != NULL)
		return open_in(w, path, why, len);
	/* A walk of its own: the whole path from the start. */
	mountrule_walk_init(&own);
	if ((r = start_of(path)) >= 0)
		r = walk_text(&own.table, path, strlen(path), r, &links, path, why, len);
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

static const struct tree_mounts rule = { dev_ok };
static const struct shards_name_rule names = { name_rule, name_run_end };

void
mountrule_install(void)
{
	tree_mounts = &rule;
	shards_name_rule = &names;
}
