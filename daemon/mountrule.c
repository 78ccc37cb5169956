/*
 * mountrule.c: wcached's rule for mounts inside a model's tree and for a
 * directory model's names (see mountrule.h).
 */
#include "mountrule.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

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

/* Undoes mountinfo's octal escapes (\040 a space) of s in place. */
static void
unescape(char *s)
{
	char *o = s;

	for (; *s != '\0'; s++, o++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
			s[3] >= '0' && s[3] <= '7') {
			*o = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o = *s;
		}
	}
	*o = '\0';
}

/* tree_mounts' remote_beneath: whether the mount table lists a remote
 * filesystem mounted beneath root (1, why naming it), or 0; -errno when
 * the table cannot be read (why says so). */
static int
remote_beneath(const char *root, char *why, size_t len)
{
	FILE *f = fopen(MOUNTINFO, "re");
	size_t n = strlen(root), cap = 0;
	char *line = NULL;
	int found = 0;

	if (f == NULL) {
		int e = errno;

		snprintf(why, len, "%s cannot tell what is mounted there (%s)", MOUNTINFO,
			strerror(e));
		return -e;
	}
	while (!found && getline(&line, &cap, f) > 0) {
		char point[4096], type[64];
		const char *dash = strstr(line, " - ");
		struct fs_info fs;

		if (dash == NULL || sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 ||
			sscanf(dash + 3, "%63s", type) != 1)
			continue;
		unescape(point);
		fstype_classify_name(type, &fs);
		if (fs.remote && strncmp(point, root, n) == 0 &&
			(point[n] == '/' || (n == 1 && point[1] != '\0'))) {
			snprintf(why, len, "a %s mount lies beneath it at %s", fs.name, point);
			found = 1;
		}
	}
	free(line);
	fclose(f);
	return found;
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

static const struct tree_mounts rule = { dev_ok, remote_beneath };

void
mountrule_install(void)
{
	tree_mounts = &rule;
	shards_name_rule = name_rule;
}
