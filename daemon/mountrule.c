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

/* tree_mounts' dev_ok: whether a file on dev may be opened, told from the
 * mount table (no filesystem asked). A device no mount has (btrfs gives
 * its subvolumes their own) is local; FUSE's is always listed. */
static int
dev_ok(dev_t dev, char *why, size_t len)
{
	struct fs_info fs;
	int r = fstype_of_dev(MOUNTINFO, dev, &fs);

	if (r == -ENOENT)
		return 0;
	if (r < 0) {
		snprintf(why, len, "device %u:%u, whose filesystem %s cannot tell (%s)",
			major(dev), minor(dev), MOUNTINFO, strerror(-r));
		return r;
	}
	if (fs.remote) {
		snprintf(why, len, "%s (device %u:%u, a mount of its own)", fs.name, major(dev),
			minor(dev));
		return -EXDEV;
	}
	return 0;
}

/* shards_name_rule: a name in a directory model's directory dfd counts as
 * a model file unless a remote filesystem is mounted on it (a link there
 * is the opener's to judge: tree_mounts). statx(2) with AT_SYMLINK_NOFOLLOW
 * and AT_STATX_DONT_SYNC asks no server (a mount on the name shows its own
 * device); a name statx cannot see is left to the load's open, which says
 * why. */
static int
name_rule(int dfd, const char *name, char *why, size_t len)
{
	struct statx sx;
	struct stat dir;
	char fs[128];
	dev_t dev;

	if (fstat(dfd, &dir) == -1 ||
		statx(dfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC,
			STATX_TYPE, &sx) == -1)
		return 0;
	dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	if (dev != dir.st_dev && dev_ok(dev, fs, sizeof(fs)) < 0) {
		snprintf(why, len, "%s is mounted on it", fs);
		return -EXDEV;
	}
	return 0;
}

/* Whether dev is a user's FUSE mount (not root's, nor wcached's user's):
 * why names it. Told from the mount table only. */
static bool
users_fuse(dev_t dev, char *why, size_t len)
{
	struct fs_info fs;

	if (fstype_of_dev(MOUNTINFO, dev, &fs) < 0 || !fs.user_mount ||
		fs.mounter == geteuid())
		return false;
	snprintf(why, len, "fuse (device %u:%u) mounted by uid %u", major(dev), minor(dev),
		(unsigned)fs.mounter);
	return true;
}

#define WALK_LINKS 40

/* mountrule_open's walk: rest (a path, changed) from cur (owned). */
static int
walk(char *rest, size_t cap, int cur, const char *path, char *why, size_t len)
{
	char target[PATH_MAX], *p = rest, *name, on[160];
	struct statx sx;
	int links = 0, fd, e;
	struct stat st;
	dev_t dev;

	if (fstat(cur, &st) == -1)
		goto fail;
	dev = st.st_dev;
	for (;;) {
		while (*p == '/')
			p++;
		if (*p == '\0')
			return cur;
		name = p;
		p += strcspn(p, "/");
		if (*p != '\0')
			*p++ = '\0';
		if (strcmp(name, ".") == 0)
			continue;
		if ((fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)) == -1)
			goto fail;
		if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC,
			    STATX_TYPE, &sx) == -1) {
			e = errno;
			close(fd);
			errno = e;
			goto fail;
		}
		if (makedev(sx.stx_dev_major, sx.stx_dev_minor) != dev &&
			users_fuse(makedev(sx.stx_dev_major, sx.stx_dev_minor), on, sizeof(on))) {
			close(fd);
			close(cur);
			snprintf(why, len, "%s: %s lies on %s: wcached walks into no user's FUSE "
				"mount (a neighbour's server may never answer)", path, name, on);
			return -EXDEV;
		}
		if (S_ISLNK(sx.stx_mode)) {
			ssize_t k = readlinkat(fd, "", target, sizeof(target) - 1);
			size_t n;

			close(fd);
			if (k < 0)
				goto fail;
			target[k] = '\0';
			n = strlen(p);
			if (++links > WALK_LINKS || (size_t)k + 1 + n + 1 > cap) {
				errno = links > WALK_LINKS ? ELOOP : ENAMETOOLONG;
				goto fail;
			}
			memmove(rest + k + 1, p, n + 1);
			memcpy(rest, target, (size_t)k);
			rest[k] = '/';
			p = rest;
			if (target[0] == '/') {
				close(cur);
				if ((cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) == -1 ||
					fstat(cur, &st) == -1)
					goto fail;
				dev = st.st_dev;
			}
			continue;
		}
		close(cur);
		cur = fd;
		dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	}
fail:
	e = errno;
	if (cur >= 0)
		close(cur);
	return -e;
}

int
mountrule_open(const char *path, char *why, size_t len)
{
	size_t n = strlen(path), cap = 2 * PATH_MAX + 2;
	char *rest;
	int cur, r;

	if (n >= PATH_MAX)
		return -ENAMETOOLONG;
	if ((rest = malloc(cap)) == NULL)
		return -ENOMEM;
	memcpy(rest, path, n + 1);
	cur = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	r = cur < 0 ? -errno : walk(rest, cap, cur, path, why, len);
	free(rest);
	return r;
}

int
mountrule_stat(const char *path, struct stat *st)
{
	char why[8];
	int fd = mountrule_open(path, why, sizeof(why)), e;

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

void
mountrule_install(void)
{
	tree_mounts = &rule;
	shards_name_rule = name_rule;
}
