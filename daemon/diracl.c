/*
 * diracl.c: a directory's access ACL folded into its mode's write bits
 * (diracl.h).
 */
#include "diracl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/statfs.h>
#include <sys/xattr.h>

#include "fstype.h"

/* linux/posix_acl_xattr.h and linux/posix_acl.h: the xattr's layout. */
#define ACL_XATTR_VERSION 2
#define ACL_USER 0x02
#define ACL_GROUP 0x08
#define ACL_MASK 0x10
#define ACL_WRITE 0x02
#define ACL_HEADER 4
#define ACL_ENTRY 8
/* Room for 511 entries, more than ext4 keeps (a block's worth); a larger
 * value (ERANGE) counts as others writing. */
#define ACL_MAX 4096

static uint32_t
le(const unsigned char *p, int n)
{
	uint32_t v = 0;

	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int
diracl_named_write(const unsigned char *buf, size_t len, uid_t owner)
{
	int named = 0, mask = -1;

	if (len < ACL_HEADER || (len - ACL_HEADER) % ACL_ENTRY != 0 ||
		le(buf, 4) != ACL_XATTR_VERSION)
		return 1;
	for (size_t at = ACL_HEADER; at < len; at += ACL_ENTRY) {
		uint32_t tag = le(buf + at, 2), perm = le(buf + at + 2, 2);
		uint32_t id = le(buf + at + 4, 4);

		if (tag == ACL_MASK)
			mask = (perm & ACL_WRITE) != 0;
		else if ((perm & ACL_WRITE) != 0 &&
			(tag == ACL_GROUP || (tag == ACL_USER && id != (uint32_t)owner)))
			named = 1;
	}
	return named && mask != 0;
}

/*
 * Whether path is on a network or FUSE filesystem (fstype.h), or cannot be
 * told: one that keeps no POSIX ACL may keep an ACL of its own that the
 * mode's bits do not show (NFSv4's, CIFS's, a FUSE server that checks
 * permissions itself), where bob may write in a 0775 directory of its
 * owner's private group (review rev211 M1). A local one without them
 * (mounted noacl) lets in whom its mode says.
 */
static int
remote(const char *path)
{
	struct statfs sf;
	struct fs_info fs;

	if (statfs(path, &sf) != 0)
		return 1;
	fstype_classify((unsigned long)sf.f_type, &fs);
	return fs.remote;
}

void
diracl_fold(int fd, const char *path, struct stat *st)
{
	unsigned char value[ACL_MAX];
	char proc[32];
	ssize_t n;

	if (!S_ISDIR(st->st_mode) || (st->st_mode & S_IWGRP) == 0 ||
		(st->st_mode & S_IWOTH) != 0)
		return;
	if (fd >= 0) {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		path = proc;
	} else if (path == NULL) { /* nothing to ask: cannot be told */
		st->st_mode |= S_IWOTH;
		return;
	}
	n = getxattr(path, "system.posix_acl_access", value, sizeof(value));
	if (n < 0 ? errno != ENODATA && (errno != ENOTSUP || remote(path)) :
		    diracl_named_write(value, (size_t)n, st->st_uid))
		st->st_mode |= S_IWOTH;
}

int
diracl_fstat(int fd, struct stat *st)
{
	if (fstat(fd, st) != 0)
		return -1;
	diracl_fold(fd, NULL, st);
	return 0;
}

int
diracl_stat(const char *path, struct stat *st)
{
	if (stat(path, st) != 0)
		return -1;
	diracl_fold(-1, path, st);
	return 0;
}
