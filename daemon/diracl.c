/*
 * diracl.c: a directory's access ACL folded into its mode's write bits
 * (diracl.h).
 */
#include "diracl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/xattr.h>

#include "base/file.h"
#include "fstype.h"

/* linux/posix_acl_xattr.h and linux/posix_acl.h: the xattr's layout. */
#define ACL_XATTR_VERSION 2
#define ACL_USER_OBJ 0x01
#define ACL_USER 0x02
#define ACL_GROUP_OBJ 0x04
#define ACL_GROUP 0x08
#define ACL_MASK 0x10
#define ACL_OTHER 0x20
#define ACL_READ 0x04
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
#define NFS4_ACE_DENIED 1
#define NFS4_READ_DATA 0x1
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
#define NFS4_GROUP "GROUP@"
#define NFS4_EVERYONE "EVERYONE@"
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

/* An NFSv4 ACE as nfs4_next read it: who, who_len bytes, in the value. */
struct nfs4_ace {
	uint32_t type, flag, access;
	const unsigned char *who;
	size_t who_len;
};

/* The ACEs' count of the NFSv4 ACL value buf (len bytes) into *count; -1
 * where the value cannot hold that many. */
static int
nfs4_count(const unsigned char *buf, size_t len, size_t *count)
{
	if (len < 4)
		return -1;
	*count = be(buf);
	return *count > (len - 4) / NFS4_ACE ? -1 : 0; /* more ACEs than it holds */
}

/* The ACE of buf (len bytes) at *at into *ace, *at past it (its who's
 * padding too); -1 where it runs past the value's end. */
static int
nfs4_next(const unsigned char *buf, size_t len, size_t *at, struct nfs4_ace *ace)
{
	size_t who;

	if (len - *at < NFS4_ACE)
		return -1;
	ace->type = be(buf + *at);
	ace->flag = be(buf + *at + 4);
	ace->access = be(buf + *at + 8);
	who = be(buf + *at + 12);
	*at += NFS4_ACE;
	/* who <= len - at, so its padding cannot wrap */
	if (who > len - *at || ((who + 3) & ~(size_t)3) > len - *at)
		return -1;
	ace->who = buf + *at;
	ace->who_len = who;
	*at += (who + 3) & ~(size_t)3;
	return 0;
}

static int
nfs4_is(const struct nfs4_ace *ace, const char *name)
{
	return ace->who_len == strlen(name) && memcmp(ace->who, name, ace->who_len) == 0;
}

int
diracl_nfs4_write(const unsigned char *buf, size_t len)
{
	size_t at = 4, count;
	int lets = 0;

	if (nfs4_count(buf, len, &count) < 0)
		return 1;
	for (size_t i = 0; i < count; i++) {
		struct nfs4_ace ace;

		if (nfs4_next(buf, len, &at, &ace) < 0)
			return 1;
		if (ace.type == NFS4_ACE_ALLOWED && (ace.flag & NFS4_INHERIT_ONLY) == 0 &&
			(ace.access & NFS4_ENTRIES) != 0 && !nfs4_is(&ace, NFS4_OWNER))
			lets = 1;
	}
	return at != len || lets; /* bytes past the last ACE: not such a value */
}

void
diracl_file_acl(int fd, struct diracl_value *acl)
{
	int nfs4, r = file_acl_value(fd, &acl->value, &acl->len, &nfs4);

	acl->kind = diracl_kind_of(r, nfs4);
}

enum diracl_kind
diracl_kind_of(int state, int nfs4)
{
	return state == 0 ? DIRACL_NONE : state < 0 ? DIRACL_UNTOLD :
		nfs4 ? DIRACL_NFS4 : DIRACL_POSIX;
}

void
diracl_value_free(struct diracl_value *acl)
{
	free(acl->value);
	*acl = (struct diracl_value){ .kind = DIRACL_UNTOLD };
}

/* A POSIX ACL value's entries, checked as the kernel's posix_acl_valid
 * would have them: one owner, owning group and other entry each, at most
 * one mask, no other tag. The mask's bits in *mask, 7 where there is none
 * (named entries then grant their own bits, as the kernel's check reads
 * them); -1 where it is not such a value. */
static int
acl_entries_check(const unsigned char *buf, size_t len, unsigned *mask)
{
	int seen[0x21] = { 0 };

	*mask = 7;
	if (len < ACL_HEADER || (len - ACL_HEADER) % ACL_ENTRY != 0 ||
		le(buf, 4) != ACL_XATTR_VERSION)
		return -1;
	for (size_t at = ACL_HEADER; at < len; at += ACL_ENTRY) {
		uint32_t tag = le(buf + at, 2);

		if (tag != ACL_USER_OBJ && tag != ACL_USER && tag != ACL_GROUP_OBJ &&
			tag != ACL_GROUP && tag != ACL_MASK && tag != ACL_OTHER)
			return -1;
		seen[tag]++;
		if (tag == ACL_MASK)
			*mask = le(buf + at + 2, 2);
	}
	if (seen[ACL_USER_OBJ] != 1 || seen[ACL_GROUP_OBJ] != 1 || seen[ACL_OTHER] != 1 ||
		seen[ACL_MASK] > 1)
		return -1;
	return 0;
}

static int
in_groups(gid_t gid, const gid_t *gids, int ngids)
{
	for (int k = 0; k < ngids; k++)
		if (gids[k] == gid)
			return 1;
	return 0;
}

/* diracl_may_read of a POSIX ACL value. */
static int
posix_may_read(const unsigned char *buf, size_t len, const struct stat *st, uid_t uid,
	const gid_t *gids, int ngids)
{
	unsigned mask, other = 0;
	int found = 0, grants = 0;

	if (acl_entries_check(buf, len, &mask) < 0)
		return 0;
	for (size_t at = ACL_HEADER; at < len; at += ACL_ENTRY) {
		uint32_t tag = le(buf + at, 2), perm = le(buf + at + 2, 2);
		uint32_t id = le(buf + at + 4, 4);

		if (tag == ACL_USER_OBJ && uid == st->st_uid)
			return (perm & ACL_READ) != 0;
		if (tag == ACL_USER && id == (uint32_t)uid && uid != st->st_uid)
			return (perm & mask & ACL_READ) != 0;
		if ((tag == ACL_GROUP_OBJ && in_groups(st->st_gid, gids, ngids)) ||
			(tag == ACL_GROUP && in_groups((gid_t)id, gids, ngids))) {
			found = 1;
			grants |= (perm & mask & ACL_READ) != 0;
		}
		if (tag == ACL_OTHER)
			other = perm;
	}
	return found ? grants : (other & ACL_READ) != 0;
}

/* diracl_all_read of a POSIX ACL value. */
static int
posix_all_read(const unsigned char *buf, size_t len, const struct stat *st, gid_t gid)
{
	unsigned mask;
	int found = 0, grants = 0, all = 1;

	if (acl_entries_check(buf, len, &mask) < 0)
		return 0;
	for (size_t at = ACL_HEADER; at < len; at += ACL_ENTRY) {
		uint32_t tag = le(buf + at, 2), perm = le(buf + at + 2, 2);
		uint32_t id = le(buf + at + 4, 4);
		int reads = (perm & (tag == ACL_OTHER ? 7 : mask) & ACL_READ) != 0;

		if (tag == ACL_USER && id != (uint32_t)st->st_uid && !reads)
			return 0;
		if (gid != (gid_t)-1 && ((tag == ACL_GROUP_OBJ && st->st_gid == gid) ||
			(tag == ACL_GROUP && id == (uint32_t)gid))) {
			found = 1;
			grants |= reads;
		}
		if (tag == ACL_GROUP_OBJ || tag == ACL_GROUP || tag == ACL_OTHER)
			all &= reads;
	}
	return found ? grants : all;
}

/*
 * diracl_may_read (all 0) or diracl_all_read (all 1) of an NFSv4 ACL
 * value: the first ACE that decides for uid (its groups gids), or for
 * every user (every member of gid): 1 where it allows, 0 where it denies,
 * none decides, or the value is not one.
 */
static int
nfs4_read(const unsigned char *buf, size_t len, const struct stat *st, int all, uid_t uid,
	const gid_t *gids, int ngids, gid_t gid)
{
	size_t at = 4, count;
	int decided = -1;

	if (nfs4_count(buf, len, &count) < 0)
		return 0;
	for (size_t i = 0; i < count; i++) {
		struct nfs4_ace ace;
		uint32_t type;
		int owner, group, everyone;

		if (nfs4_next(buf, len, &at, &ace) < 0)
			return 0;
		type = ace.type;
		if (decided >= 0 || (type != NFS4_ACE_ALLOWED && type != NFS4_ACE_DENIED) ||
			(ace.flag & NFS4_INHERIT_ONLY) != 0 || (ace.access & NFS4_READ_DATA) == 0)
			continue;
		owner = nfs4_is(&ace, NFS4_OWNER);
		group = nfs4_is(&ace, NFS4_GROUP);
		everyone = nfs4_is(&ace, NFS4_EVERYONE);
		if (!all) {
			if (!owner && !group && !everyone)
				decided = 0; /* alice@dom: is she uid? cannot be told */
			else if (everyone || (owner && uid == st->st_uid) ||
				(group && in_groups(st->st_gid, gids, ngids)))
				decided = type == NFS4_ACE_ALLOWED;
		} else if (type == NFS4_ACE_DENIED) {
			if (!owner)
				decided = 0; /* it may match one of them */
		} else if (everyone || (group && gid != (gid_t)-1 && gid == st->st_gid)) {
			decided = 1;
		}
	}
	return at == len && decided == 1;
}

int
diracl_may_read(const struct diracl_value *acl, const struct stat *st, uid_t uid,
	const gid_t *gids, int ngids)
{
	switch (acl->kind) {
	case DIRACL_NONE:
		if (uid == st->st_uid)
			return (st->st_mode & S_IRUSR) != 0;
		return (st->st_mode &
			(in_groups(st->st_gid, gids, ngids) ? S_IRGRP : S_IROTH)) != 0;
	case DIRACL_POSIX:
		return posix_may_read(acl->value, acl->len, st, uid, gids, ngids);
	case DIRACL_NFS4:
		return nfs4_read(acl->value, acl->len, st, 0, uid, gids, ngids, 0);
	default:
		return 0;
	}
}

int
diracl_all_read(const struct diracl_value *acl, const struct stat *st, gid_t gid)
{
	switch (acl->kind) {
	case DIRACL_NONE:
		if (gid != (gid_t)-1 && gid == st->st_gid)
			return (st->st_mode & S_IRGRP) != 0;
		return (st->st_mode & (S_IRGRP | S_IROTH)) == (S_IRGRP | S_IROTH);
	case DIRACL_POSIX:
		return posix_all_read(acl->value, acl->len, st, gid);
	case DIRACL_NFS4:
		return nfs4_read(acl->value, acl->len, st, 1, 0, NULL, 0, gid);
	default:
		return 0;
	}
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
