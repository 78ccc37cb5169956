/*
 * diracl.c: a directory's access ACL folded into its mode's write bits
 * (diracl.h).
 */
#include "diracl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
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
 * value (ERANGE) counts as others writing. An NFSv4 ACL is read into the
 * same room: some 150 ACEs of short names. */
#define ACL_MAX 4096

/* RFC 8881 6.2.1 (nfsace4): the ACE's type, its flag and its access mask;
 * an ACE is four XDR words, then its who's bytes padded to four. */
#define NFS4_ACE_ALLOWED 0
#define NFS4_INHERIT_ONLY 0x8
#define NFS4_ADD_FILE 0x2
#define NFS4_ADD_SUBDIRECTORY 0x4
#define NFS4_DELETE_CHILD 0x40
/* Who may rewrite the ACL or take the directory may give himself the rest
 * and take it back before anyone looks (review rev214 M1). */
#define NFS4_WRITE_ACL 0x40000
#define NFS4_WRITE_OWNER 0x80000
#define NFS4_ENTRIES (NFS4_ADD_FILE | NFS4_ADD_SUBDIRECTORY | NFS4_DELETE_CHILD | \
	NFS4_WRITE_ACL | NFS4_WRITE_OWNER)
#define NFS4_ACE 16
#define NFS4_OWNER "OWNER@"
#define NFS_MAGIC 0x6969 /* NFS_SUPER_MAGIC: v2, v3 and v4 alike */

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

static uint32_t
be(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int
diracl_nfs4_write(const unsigned char *buf, size_t len)
{
	size_t at = 4, count;
	int lets = 0;

	if (len < 4)
		return 1;
	count = be(buf);
	if (count > (len - 4) / NFS4_ACE) /* more ACEs than the value holds */
		return 1;
	for (size_t i = 0; i < count; i++) {
		uint32_t type, flag, access;
		size_t who;

		if (len - at < NFS4_ACE)
			return 1;
		type = be(buf + at);
		flag = be(buf + at + 4);
		access = be(buf + at + 8);
		who = be(buf + at + 12);
		at += NFS4_ACE;
		/* who <= len - at, so its padding cannot wrap */
		if (who > len - at || ((who + 3) & ~(size_t)3) > len - at)
			return 1;
		if (type == NFS4_ACE_ALLOWED && (flag & NFS4_INHERIT_ONLY) == 0 &&
			(access & NFS4_ENTRIES) != 0 &&
			(who != strlen(NFS4_OWNER) || memcmp(buf + at, NFS4_OWNER, who) != 0))
			lets = 1;
		at += (who + 3) & ~(size_t)3;
	}
	return at != len || lets; /* bytes past the last ACE: not such a value */
}

/*
 * Whether a local filesystem without POSIX ACLs (ENOTSUP) lets in whom its
 * mode says: one fstype.c knows, but ZFS, whose ENOTSUP is acltype=off or
 * NFSv4 ACLs of its own (acltype=nfsv4, TrueNAS SCALE) alike. A filesystem
 * it does not know (!known) cannot be told (review rev213 L1).
 */
static int
mode_tells(const struct fs_info *fs)
{
	return fs->known && strcmp(fs->name, "zfs") != 0;
}

/* AFS (OpenAFS's and the kernel's kAFS) checks only a directory's own ACL,
 * never its mode bits: any directory there may be one others write in
 * (review rev214 M2). */
static int
acl_only(const struct fs_info *fs)
{
	return strcmp(fs->name, "afs") == 0 || strcmp(fs->name, "kafs") == 0;
}

/*
 * Whether others than the owner may write in the directory at path, on a
 * filesystem without POSIX ACLs (their read said ENOTSUP), its group
 * where group. A local one (mounted noacl) lets in whom its mode says. One
 * that keeps an ACL of its own may let in whom the mode does not show
 * (review rev211 M1, rev212 M1): NFS, and one statfs cannot tell, as its
 * NFSv4 ACL says, whatever the mode (an ACE for bob@dom on alice's 0755
 * directory), where one can be read; where there is none (ENODATA,
 * ENOTSUP: NFSv2 and v3, a v4 server without ACLs) the server checks the
 * mode, and a group that may write counts as others, as on CIFS and FUSE,
 * where the mode is all that is asked (README: CIFS mounted noperm, a
 * FUSE server that ignores the mode). value, size bytes: room to read in.
 */
static int
no_posix_acls(const char *path, int group, unsigned char *value, size_t size)
{
	struct statfs sf;
	struct fs_info fs;
	ssize_t n;

	if (statfs(path, &sf) == 0 && (unsigned long)sf.f_type != NFS_MAGIC) {
		fstype_classify((unsigned long)sf.f_type, &fs);
		return acl_only(&fs) || (group && (fs.remote || !mode_tells(&fs)));
	}
	n = getxattr(path, "system.nfs4_acl", value, size);
	if (n >= 0)
		return diracl_nfs4_write(value, (size_t)n);
	return errno == ENODATA || errno == ENOTSUP ? group : 1;
}

void
diracl_fold(int fd, const char *path, struct stat *st)
{
	unsigned char value[ACL_MAX];
	char proc[32];
	int group, others;
	ssize_t n;

	if (!S_ISDIR(st->st_mode) || (st->st_mode & S_IWOTH) != 0)
		return;
	group = (st->st_mode & S_IWGRP) != 0;
	if (fd >= 0) {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		path = proc;
	} else if (path == NULL) { /* nothing to ask: the mode, where it can tell */
		if (group)
			st->st_mode |= S_IWOTH;
		return;
	}
	/* A POSIX ACL's named entries write only through its mask, which the
	 * group bits show: without them, only its absence (ENOTSUP) asks. */
	n = getxattr(path, "system.posix_acl_access", value, sizeof(value));
	if (n >= 0)
		others = group && diracl_named_write(value, (size_t)n, st->st_uid);
	else if (errno != ENOTSUP) /* EOPNOTSUPP too: one value on Linux */
		others = group && errno != ENODATA;
	else
		others = no_posix_acls(path, group, value, sizeof(value));
	if (others)
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
