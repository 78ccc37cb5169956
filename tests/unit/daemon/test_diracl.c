/*
 * test_diracl.c: daemon/diracl.c, a directory's access ACL folded into its
 * mode. The parser (diracl_named_write) on values built as the kernel lays
 * them out: a named user other than the owner, or a named group, with the
 * write bit and a mask that has it, lets others write; the mask without
 * it, the owner's own named entry, read-only entries do not; a value that
 * is not one (short, ragged, another version) fails closed. And the fold
 * on real directories: a directory with such an ACL (set with setxattr,
 * where the filesystem keeps ACLs) gets S_IWOTH, by descriptor (O_PATH
 * too) and by name; one without an ACL, or whose mode already says, is
 * left as it is. A filesystem without POSIX ACLs (getxattr ENOTSUP,
 * wrapped: -Wl,--wrap=getxattr,--wrap=statfs) counts as others writing
 * where it is a network or FUSE one (NFSv4 and CIFS keep ACLs of their
 * own) or statfs fails, not where it is local (review rev211 M1). And
 * registry_others_rename_on's walk folds a directory model's own
 * directory, the path's last name, too (review rev211 L0). And NFS's own
 * ACL (system.nfs4_acl, XDR, wrapped too): an ALLOW ACE that lets a who
 * other than OWNER@ add or remove entries makes others write in a 0755
 * directory, which the mode does not show (review rev212 M1); OWNER@'s,
 * read-only ones, INHERIT_ONLY and DENY ACEs do not; a value that is not
 * one, or cannot be read, fails closed; none (ENODATA, ENOTSUP: NFSv3)
 * leaves the mode to tell. And who may read a file by its ACL (review
 * rev226 H1): diracl_may_read and diracl_all_read on POSIX ACL values (a
 * named user or group denied on a 0644 file, one given read on a 0600 or
 * 0640 file, the mask) and NFSv4 ones (ACEs in order), the mode where
 * there is none, values that are not ACLs failing closed; diracl_file_acl
 * on real files.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include <sys/statfs.h>

#include "diracl.h"
#include "registry.h"
#include "testutil.h"

/* getxattr and statfs as the filesystem would answer: off, the real ones;
 * on, getxattr says ENOTSUP (no POSIX ACLs there) and statfs gives magic,
 * or fails with statfs_err; system.nfs4_acl's getxattr gives nfs4 (its
 * nfs4_len bytes) where set, else fails with nfs4_err (0: ENOTSUP). */
static struct {
	int on;
	unsigned long magic;
	int statfs_err;
	const unsigned char *nfs4;
	size_t nfs4_len;
	int nfs4_err;
	int nfs4_asked;
} fake;

ssize_t __real_getxattr(const char *path, const char *name, void *value, size_t size);
ssize_t __wrap_getxattr(const char *path, const char *name, void *value, size_t size);
int __real_statfs(const char *path, struct statfs *buf);
int __wrap_statfs(const char *path, struct statfs *buf);

ssize_t
__wrap_getxattr(const char *path, const char *name, void *value, size_t size)
{
	if (!fake.on)
		return __real_getxattr(path, name, value, size);
	if (strcmp(name, "system.nfs4_acl") == 0) {
		fake.nfs4_asked++;
		if (fake.nfs4 != NULL && fake.nfs4_len <= size) {
			memcpy(value, fake.nfs4, fake.nfs4_len);
			return (ssize_t)fake.nfs4_len;
		}
		errno = fake.nfs4 != NULL ? ERANGE : fake.nfs4_err != 0 ? fake.nfs4_err : ENOTSUP;
		return -1;
	}
	errno = ENOTSUP;
	return -1;
}

int
__wrap_statfs(const char *path, struct statfs *buf)
{
	if (!fake.on)
		return __real_statfs(path, buf);
	if (fake.statfs_err != 0) {
		errno = fake.statfs_err;
		return -1;
	}
	memset(buf, 0, sizeof(*buf));
	buf->f_type = (__fsword_t)fake.magic;
	return 0;
}

enum { USER_OBJ = 0x01, USER = 0x02, GROUP_OBJ = 0x04, GROUP = 0x08, MASK = 0x10, OTHER = 0x20 };

struct acl {
	unsigned char b[4 + 8 * 16];
	size_t len;
};

static void
put(unsigned char *p, uint32_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* An ACL value: version 2, then (tag, perm, id) triples, ending at tag 0. */
static struct acl
acl_of(uint32_t version, const uint32_t *e)
{
	struct acl a = { .len = 4 };

	put(a.b, version, 4);
	for (; e[0] != 0; e += 3, a.len += 8) {
		put(a.b + a.len, e[0], 2);
		put(a.b + a.len + 2, e[1], 2);
		put(a.b + a.len + 4, e[2], 4);
	}
	return a;
}

#define ANY 0xffffffffu
#define OWNER 1000

static int
named_write(const uint32_t *e)
{
	struct acl a = acl_of(2, e);

	return diracl_named_write(a.b, a.len, OWNER);
}

static void
test_named_writers(void **state)
{
	(void)state;
	/* u:bob:rwx, mask rwx */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, USER, 7, 1001,
			GROUP_OBJ, 5, ANY, MASK, 7, ANY, OTHER, 5, ANY, 0 }), 1);
	/* g:team:rwx, mask rwx */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, GROUP_OBJ, 5, ANY,
			GROUP, 7, 50, MASK, 7, ANY, OTHER, 5, ANY, 0 }), 1);
	/* u:bob:-w-, no mask (as a filesystem may hand it) */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, USER, 2, 1001,
			GROUP_OBJ, 5, ANY, OTHER, 5, ANY, 0 }), 1);
}

static void
test_no_named_writer(void **state)
{
	(void)state;
	/* u:bob:rwx, but the mask r-x (chmod g-w after setfacl) */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, USER, 7, 1001,
			GROUP_OBJ, 5, ANY, MASK, 5, ANY, OTHER, 5, ANY, 0 }), 0);
	/* u:bob:r-x, g:team:r-x */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, USER, 5, 1001,
			GROUP_OBJ, 7, ANY, GROUP, 5, 50, MASK, 7, ANY, OTHER, 5, ANY, 0 }), 0);
	/* the owner's own named entry */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, USER, 7, OWNER,
			GROUP_OBJ, 5, ANY, MASK, 7, ANY, OTHER, 5, ANY, 0 }), 0);
	/* the base entries alone: the owning group writes, which the mode says */
	assert_int_equal(named_write((const uint32_t[]){ USER_OBJ, 7, ANY, GROUP_OBJ, 7, ANY,
			OTHER, 7, ANY, 0 }), 0);
}

static void
test_not_an_acl_fails_closed(void **state)
{
	struct acl a = acl_of(2, (const uint32_t[]){ USER_OBJ, 7, ANY, GROUP_OBJ, 5, ANY,
		OTHER, 5, ANY, 0 });
	struct acl v1 = acl_of(1, (const uint32_t[]){ USER_OBJ, 7, ANY, 0 });

	(void)state;
	assert_int_equal(diracl_named_write(a.b, a.len, OWNER), 0);
	assert_int_equal(diracl_named_write(a.b, a.len - 1, OWNER), 1); /* ragged */
	assert_int_equal(diracl_named_write(a.b, 3, OWNER), 1);         /* no header */
	assert_int_equal(diracl_named_write(a.b, 0, OWNER), 1);
	assert_int_equal(diracl_named_write(v1.b, v1.len, OWNER), 1);   /* version */
}

/* A directory under TMPDIR, mode 0775 (set past the umask). */
static char *
made_dir(void)
{
	char *dir = tu_tmpdir();

	assert_non_null(dir);
	assert_int_equal(chmod(dir, 0775), 0);
	return dir;
}

static void
test_fold_on_a_directory(void **state)
{
	char *dir = made_dir();
	struct acl a = acl_of(2, (const uint32_t[]){ USER_OBJ, 7, ANY, USER, 7, 64103,
		GROUP_OBJ, 5, ANY, MASK, 7, ANY, OTHER, 5, ANY, 0 });
	struct stat st;
	int fd;

	(void)state;
	/* No ACL: as the mode says. */
	fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(diracl_fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0775);
	if (setxattr(dir, "system.posix_acl_access", a.b, a.len, 0) != 0) {
		close(fd);
		tu_rmtree(dir);
		skip(); /* a filesystem without ACLs */
	}
	/* u:64103:rwx: others may write, by descriptor and by name. */
	assert_int_equal(diracl_fstat(fd, &st), 0);
	assert_true((st.st_mode & S_IWOTH) != 0);
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0775); /* what ls shows */
	diracl_fold(-1, dir, &st);
	assert_true((st.st_mode & S_IWOTH) != 0);
	/* The mask without w (chmod g-w): no one named may write, nor does
	 * the fold look where the group may not. */
	assert_int_equal(chmod(dir, 0755), 0);
	assert_int_equal(diracl_fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0755);
	close(fd);
	tu_rmtree(dir);
}

static void
test_no_posix_acls(void **state)
{
	char *dir = made_dir();
	struct stat st;

	(void)state;
	assert_int_equal(stat(dir, &st), 0);
	fake.on = 1;
	fake.magic = 0x6969; /* NFS: its v4 ACLs are not POSIX ACLs */
	diracl_fold(-1, dir, &st);
	assert_true((st.st_mode & S_IWOTH) != 0);
	assert_int_equal(stat(dir, &st), 0);
	fake.magic = 0x65735546; /* FUSE */
	diracl_fold(-1, dir, &st);
	assert_true((st.st_mode & S_IWOTH) != 0);
	assert_int_equal(stat(dir, &st), 0);
	fake.magic = 0; /* statfs fails: cannot be told */
	fake.statfs_err = EIO;
	diracl_fold(-1, dir, &st);
	assert_true((st.st_mode & S_IWOTH) != 0);
	assert_int_equal(stat(dir, &st), 0);
	fake.statfs_err = 0;
	fake.magic = 0xEF53; /* ext4 mounted noacl: the mode tells */
	diracl_fold(-1, dir, &st);
	assert_int_equal(st.st_mode & 07777, 0775);
	/* One fstype.c does not know, and ZFS (acltype=off, or NFSv4 ACLs of
	 * its own): cannot be told (review rev213 L1). */
	fake.magic = 0x786f4256; /* vboxsf */
	diracl_fold(-1, dir, &st);
	assert_true((st.st_mode & S_IWOTH) != 0);
	assert_int_equal(stat(dir, &st), 0);
	fake.magic = 0x2FC12FC1; /* zfs */
	diracl_fold(-1, dir, &st);
	assert_true((st.st_mode & S_IWOTH) != 0);
	/* AFS and kAFS check a directory's ACL alone, never its mode: 0755
	 * too (review rev214 M2). */
	assert_int_equal(chmod(dir, 0755), 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(stat(dir, &st), 0);
		fake.magic = i == 0 ? 0x5346414F : 0x6B414653;
		diracl_fold(-1, dir, &st);
		assert_int_equal(st.st_mode & 07777, 0757);
	}
	fake.on = 0;
	tu_rmtree(dir);
}

/* An NFSv4 ACL value (XDR, big-endian): ACEs added by nfs4_ace. */
struct nfs4 {
	unsigned char b[8192];
	size_t len;
};

enum { ALLOW = 0, DENY = 1, INHERIT_ONLY = 0x8, FILE_INHERIT = 0x1, READ_DATA = 0x1,
	ADD_FILE = 0x2, ADD_SUBDIRECTORY = 0x4, EXECUTE = 0x20, DELETE_CHILD = 0x40,
	WRITE_ACL = 0x40000, WRITE_OWNER = 0x80000 };

static void
put_be(struct nfs4 *a, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		a->b[a->len++] = (unsigned char)(v >> (24 - 8 * i));
}

static void
nfs4_ace(struct nfs4 *a, uint32_t type, uint32_t flag, uint32_t access, const char *who)
{
	size_t n = strlen(who);

	put_be(a, type);
	put_be(a, flag);
	put_be(a, access);
	put_be(a, (uint32_t)n);
	memcpy(a->b + a->len, who, n);
	memset(a->b + a->len + n, 0, (4 - n % 4) % 4);
	a->len += (n + 3) & ~(size_t)3;
	a->b[3]++; /* the count, below 256 here */
}

/* The ACL of a 0755 directory as a server keeps it: OWNER@ all, GROUP@
 * and EVERYONE@ read and search. */
static struct nfs4
nfs4_0755(void)
{
	struct nfs4 a = { .len = 0 };

	put_be(&a, 0);
	nfs4_ace(&a, ALLOW, 0, READ_DATA | ADD_FILE | ADD_SUBDIRECTORY | EXECUTE | DELETE_CHILD,
		"OWNER@");
	nfs4_ace(&a, ALLOW, 0, READ_DATA | EXECUTE, "GROUP@");
	nfs4_ace(&a, ALLOW, 0, READ_DATA | EXECUTE, "EVERYONE@");
	return a;
}

static void
test_nfs4_parser(void **state)
{
	struct nfs4 a = nfs4_0755(), b;

	(void)state;
	assert_int_equal(diracl_nfs4_write(a.b, a.len), 0);
	/* bob@dom may add a file; GROUP@ a directory; EVERYONE@ delete. */
	b = a;
	nfs4_ace(&b, ALLOW, 0, ADD_FILE, "bob@dom");
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	b = a;
	nfs4_ace(&b, ALLOW, 0, ADD_SUBDIRECTORY, "GROUP@");
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	b = a;
	nfs4_ace(&b, ALLOW, 0, DELETE_CHILD, "EVERYONE@");
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	/* Only for what is made in it, not for itself; denied; audited. */
	b = a;
	nfs4_ace(&b, ALLOW, INHERIT_ONLY | FILE_INHERIT, ADD_FILE, "bob@dom");
	nfs4_ace(&b, DENY, 0, ADD_FILE | DELETE_CHILD, "bob@dom");
	nfs4_ace(&b, 2, 0, ADD_FILE, "bob@dom");
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 0);
	/* A DENY before it does not cancel an ALLOW: not weighed. */
	nfs4_ace(&b, ALLOW, 0, ADD_FILE, "bob@dom");
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	/* OWNER@ spelled otherwise is someone else. */
	b = a;
	b.len = 4;
	b.b[3] = 0;
	nfs4_ace(&b, ALLOW, 0, ADD_FILE, "OWNER");
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	/* No ACE: no one. */
	assert_int_equal(diracl_nfs4_write((const unsigned char[]){ 0, 0, 0, 0 }, 4), 0);
}

static void
test_nfs4_not_an_acl_fails_closed(void **state)
{
	struct nfs4 a = nfs4_0755(), b;

	(void)state;
	for (size_t n = 0; n < a.len; n++) /* truncated anywhere */
		assert_int_equal(diracl_nfs4_write(a.b, n), 1);
	b = a;
	b.b[b.len++] = 0; /* a byte after the last ACE */
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	b = a;
	b.b[3] = 4; /* one ACE more than it holds */
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	b = a;
	b.b[0] = 0xff; /* a count past what any value holds */
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	b = a;
	b.b[3] = 2; /* two ACEs, then bytes after them */
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	b = a;
	memset(b.b + 4 + 12, 0xff, 4); /* OWNER@'s who 2^32 - 1 bytes long */
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
	/* EVERYONE@'s who (at 64) 10 to 12 bytes long: within its padding;
	 * 13: past the value's end. */
	b = a;
	for (unsigned char n = 10; n <= 12; n++) {
		b.b[67] = n;
		assert_int_equal(diracl_nfs4_write(b.b, b.len), 0);
	}
	b.b[67] = 13;
	assert_int_equal(diracl_nfs4_write(b.b, b.len), 1);
}

/* diracl_fold of a directory of alice (uid 1000) of mode, on NFS without
 * POSIX ACLs, whose NFSv4 ACL is a (or NULL: its read fails with err):
 * its mode after. */
static mode_t
nfs4_fold(mode_t mode, const struct nfs4 *a, int err)
{
	struct stat st = { .st_mode = S_IFDIR | mode, .st_uid = 1000, .st_gid = 1000 };

	fake.on = 1;
	fake.magic = 0x6969;
	fake.statfs_err = 0;
	fake.nfs4 = a != NULL ? a->b : NULL;
	fake.nfs4_len = a != NULL ? a->len : 0;
	fake.nfs4_err = err;
	diracl_fold(-1, "/nfs/alice/models", &st);
	fake.on = 0;
	fake.nfs4 = NULL;
	fake.nfs4_err = 0;
	return st.st_mode & 07777;
}

static void
test_nfs4_fold(void **state)
{
	struct nfs4 a = nfs4_0755(), b;
	struct stat st = { .st_mode = S_IFDIR | 0755, .st_uid = 1000 };

	(void)state;
	/* bob@dom's ALLOW ADD_FILE on alice's 0755 directory: others write
	 * (before: 0755, never asked). */
	b = a;
	nfs4_ace(&b, ALLOW, 0, ADD_FILE, "bob@dom");
	assert_int_equal(nfs4_fold(0755, &b, 0), 0757);
	/* OWNER@ alone writes, GROUP@ and EVERYONE@ read: as the mode says,
	 * 0775 too (the ACL is what the server checks). */
	assert_int_equal(nfs4_fold(0755, &a, 0), 0755);
	assert_int_equal(nfs4_fold(0775, &a, 0), 0775);
	/* INHERIT_ONLY's write, a DENY's: the mode. */
	b = a;
	nfs4_ace(&b, ALLOW, INHERIT_ONLY | FILE_INHERIT, ADD_FILE | DELETE_CHILD, "bob@dom");
	assert_int_equal(nfs4_fold(0755, &b, 0), 0755);
	b = a;
	nfs4_ace(&b, DENY, 0, ADD_FILE | DELETE_CHILD, "bob@dom");
	assert_int_equal(nfs4_fold(0755, &b, 0), 0755);
	/* WRITE_ACL, WRITE_OWNER: bob may give himself the rest (review
	 * rev214 M1). */
	b = a;
	nfs4_ace(&b, ALLOW, 0, WRITE_ACL, "bob@dom");
	assert_int_equal(nfs4_fold(0755, &b, 0), 0757);
	b = a;
	nfs4_ace(&b, ALLOW, 0, WRITE_OWNER, "bob@dom");
	assert_int_equal(nfs4_fold(0755, &b, 0), 0757);
	/* A truncated value, one past 4 KiB (ERANGE), an error: others
	 * write, 0700 too. */
	b = a;
	b.len--;
	assert_int_equal(nfs4_fold(0755, &b, 0), 0757);
	assert_int_equal(nfs4_fold(0700, &b, 0), 0702);
	b = a;
	b.len = 4096 + 4;
	assert_int_equal(nfs4_fold(0755, &b, 0), 0757);
	assert_int_equal(nfs4_fold(0755, NULL, EIO), 0757);
	assert_int_equal(nfs4_fold(0755, NULL, EACCES), 0757);
	/* No NFSv4 ACL (NFSv3, a server without them): the mode, which the
	 * server checks; its group's write counts as others' (rev211 M1). */
	assert_int_equal(nfs4_fold(0755, NULL, ENOTSUP), 0755);
	assert_int_equal(nfs4_fold(0755, NULL, ENODATA), 0755);
	assert_int_equal(nfs4_fold(0775, NULL, ENOTSUP), 0777);
	assert_int_equal(nfs4_fold(0775, NULL, ENODATA), 0777);
	/* statfs fails: asked as NFS is. */
	b = a;
	nfs4_ace(&b, ALLOW, 0, DELETE_CHILD, "bob@dom");
	fake.nfs4_asked = 0;
	fake.on = 1;
	fake.statfs_err = EIO;
	fake.nfs4 = b.b;
	fake.nfs4_len = b.len;
	diracl_fold(-1, "/nfs/alice/models", &st);
	assert_int_equal(st.st_mode & 07777, 0757);
	assert_int_equal(fake.nfs4_asked, 1);
	/* CIFS and FUSE as before: 0755 as it looks, nothing NFS asked. */
	fake.statfs_err = 0;
	fake.nfs4_asked = 0;
	for (int i = 0; i < 2; i++) {
		fake.magic = i == 0 ? 0xFF534D42 : 0x65735546;
		st.st_mode = S_IFDIR | 0755;
		diracl_fold(-1, "/mnt/share/models", &st);
		assert_int_equal(st.st_mode & 07777, 0755);
		st.st_mode = S_IFDIR | 0775;
		diracl_fold(-1, "/mnt/share/models", &st);
		assert_int_equal(st.st_mode & 07777, 0777);
	}
	assert_int_equal(fake.nfs4_asked, 0);
	fake.on = 0;
	fake.nfs4 = NULL;
}

/* registry_others_rename_on of a directory model's own directory, 0775 of
 * a user-private group (uid and gid 1: Debian's daemon), shared by
 * u:64103:rwx: the walk's last name is folded as the directories above
 * it are (with a trailing '/', it was). Skipped where that directory
 * already counts as shared without the ACL (gid 1 is not uid 1's own
 * private group here) or cannot be made so (not root, no ACLs). */
static void
test_a_directory_models_own_directory_is_folded(void **state)
{
	char *top = made_dir(), dir[PATH_MAX], why[1024];
	struct acl a = acl_of(2, (const uint32_t[]){ USER_OBJ, 7, ANY, USER, 7, 64103,
		GROUP_OBJ, 5, ANY, MASK, 7, ANY, OTHER, 5, ANY, 0 });
	int shared;

	(void)state;
	assert_int_equal(chmod(top, 0755), 0);
	snprintf(dir, sizeof(dir), "%s/llama", top);
	assert_int_equal(mkdir(dir, 0775), 0);
	assert_int_equal(chmod(dir, 0775), 0);
	if (chown(dir, 1, 1) != 0 || registry_others_rename_on(dir, why, sizeof(why)) != 0) {
		tu_rmtree(top);
		skip();
	}
	if (setxattr(dir, "system.posix_acl_access", a.b, a.len, 0) != 0) {
		tu_rmtree(top);
		skip();
	}
	shared = registry_others_rename_on(dir, why, sizeof(why));
	assert_int_equal(shared, 1);
	assert_non_null(strstr(why, "llama"));
	tu_rmtree(top);
}

/* diracl_may_read of the POSIX ACL e on a file of OWNER, group 50 (mode
 * 0644: the mode is not asked where there is an ACL), for uid in gids. */
static int
may_read(const uint32_t *e, uid_t uid, const gid_t *gids, int ngids)
{
	struct acl a = acl_of(2, e);
	struct diracl_value v = { .kind = DIRACL_POSIX, .len = a.len, .value = a.b };
	struct stat st = { .st_uid = OWNER, .st_gid = 50, .st_mode = S_IFREG | 0644 };

	return diracl_may_read(&v, &st, uid, gids, ngids);
}

static int
all_read(const uint32_t *e, gid_t gid)
{
	struct acl a = acl_of(2, e);
	struct diracl_value v = { .kind = DIRACL_POSIX, .len = a.len, .value = a.b };
	struct stat st = { .st_uid = OWNER, .st_gid = 50, .st_mode = S_IFREG | 0644 };

	return diracl_all_read(&v, &st, gid);
}

/* Review rev226 H1: the ACL as the kernel reads it (POSIX.1e 23.1.5). */
static void
test_may_read(void **state)
{
	/* 0644 with u:alice(1001):---: alice refused, bob (1002) and the
	 * owner read. */
	const uint32_t deny_alice[] = { USER_OBJ, 6, ANY, USER, 0, 1001, GROUP_OBJ, 4, ANY,
		MASK, 4, ANY, OTHER, 4, ANY, 0 };
	/* 0644 with g:60:---: a member of 60 refused, unless also in 50
	 * (group::r--: one matching group entry that grants is enough). */
	const uint32_t deny_60[] = { USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, GROUP, 0, 60,
		MASK, 4, ANY, OTHER, 4, ANY, 0 };
	/* 0600 + u:alice:r--, mask r--; and the mask --- (chmod g-r) */
	const uint32_t alice_r[] = { USER_OBJ, 6, ANY, USER, 4, 1001, GROUP_OBJ, 0, ANY,
		MASK, 4, ANY, OTHER, 0, ANY, 0 };
	const uint32_t alice_r_masked[] = { USER_OBJ, 6, ANY, USER, 4, 1001, GROUP_OBJ, 0, ANY,
		MASK, 0, ANY, OTHER, 0, ANY, 0 };
	/* rev222 H2: 0600 root:50 given to 1003 alone (group::---, mask r--) */
	const uint32_t given[] = { USER_OBJ, 6, ANY, USER, 4, 1003, GROUP_OBJ, 0, ANY,
		MASK, 4, ANY, OTHER, 0, ANY, 0 };
	/* no mask: the named entries' own bits; the owner's user_obj */
	const uint32_t nomask[] = { USER_OBJ, 0, ANY, USER, 4, 1001, GROUP_OBJ, 0, ANY,
		OTHER, 0, ANY, 0 };
	const gid_t g40[] = { 40 }, g60[] = { 60 }, g50_60[] = { 60, 50 };

	(void)state;
	assert_int_equal(may_read(deny_alice, 1001, g40, 1), 0);
	assert_int_equal(may_read(deny_alice, 1002, g40, 1), 1);
	assert_int_equal(may_read(deny_alice, OWNER, g40, 1), 1);
	assert_int_equal(may_read(deny_60, 1001, g60, 1), 0);
	assert_int_equal(may_read(deny_60, 1001, g50_60, 2), 1);
	assert_int_equal(may_read(deny_60, 1001, g40, 1), 1);
	assert_int_equal(may_read(alice_r, 1001, g40, 1), 1);
	assert_int_equal(may_read(alice_r, 1002, g40, 1), 0);
	assert_int_equal(may_read(alice_r_masked, 1001, g40, 1), 0);
	assert_int_equal(may_read(given, 1001, (const gid_t[]){ 50 }, 1), 0);
	assert_int_equal(may_read(given, 1003, (const gid_t[]){ 50 }, 1), 1);
	assert_int_equal(may_read(nomask, 1001, g40, 1), 1);
	assert_int_equal(may_read(nomask, OWNER, g40, 1), 0);
}

static void
test_all_read(void **state)
{
	const uint32_t deny_alice[] = { USER_OBJ, 6, ANY, USER, 0, 1001, GROUP_OBJ, 4, ANY,
		MASK, 4, ANY, OTHER, 4, ANY, 0 };
	const uint32_t deny_60[] = { USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, GROUP, 0, 60,
		MASK, 4, ANY, OTHER, 4, ANY, 0 };
	/* 0640 + g:60:r--: every member of 60 reads; not everyone */
	const uint32_t g60_r[] = { USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, GROUP, 4, 60,
		MASK, 4, ANY, OTHER, 0, ANY, 0 };
	/* 0644 + u:alice:r--, g:60:r--: everyone */
	const uint32_t all[] = { USER_OBJ, 6, ANY, USER, 4, 1001, GROUP_OBJ, 4, ANY, GROUP, 4,
		60, MASK, 4, ANY, OTHER, 4, ANY, 0 };

	(void)state;
	assert_int_equal(all_read(deny_alice, (gid_t)-1), 0);
	assert_int_equal(all_read(deny_alice, 50), 0); /* alice may be in 50 */
	assert_int_equal(all_read(deny_60, (gid_t)-1), 0);
	assert_int_equal(all_read(deny_60, 60), 0);
	assert_int_equal(all_read(deny_60, 50), 1);
	assert_int_equal(all_read(g60_r, 60), 1);
	assert_int_equal(all_read(g60_r, 50), 1);
	assert_int_equal(all_read(g60_r, 70), 0);
	assert_int_equal(all_read(g60_r, (gid_t)-1), 0);
	assert_int_equal(all_read(all, (gid_t)-1), 1);
	assert_int_equal(all_read(all, 70), 1);
}

/* No ACL: the mode's classes, as the kernel reads them; one that could
 * not be read, or a value that is not one, reads for no one else. */
static void
test_read_by_mode_and_fails_closed(void **state)
{
	struct diracl_value none = { .kind = DIRACL_NONE }, untold = { .kind = DIRACL_UNTOLD };
	struct stat st = { .st_uid = OWNER, .st_gid = 50, .st_mode = S_IFREG | 0604 };
	struct acl ok = acl_of(2, (const uint32_t[]){ USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY,
		OTHER, 4, ANY, 0 });
	struct acl bad[] = {
		acl_of(1, (const uint32_t[]){ USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, OTHER, 4, ANY,
			0 }),
		acl_of(2, (const uint32_t[]){ USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, 0 }),
		acl_of(2, (const uint32_t[]){ USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, OTHER, 4, ANY,
			OTHER, 4, ANY, 0 }),
		acl_of(2, (const uint32_t[]){ USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, 0x40, 4, ANY,
			OTHER, 4, ANY, 0 }),
		acl_of(2, (const uint32_t[]){ USER_OBJ, 6, ANY, GROUP_OBJ, 4, ANY, MASK, 4, ANY,
			MASK, 4, ANY, OTHER, 4, ANY, 0 }),
	};
	struct diracl_value v = { .kind = DIRACL_POSIX, .len = ok.len, .value = ok.b };

	(void)state;
	assert_int_equal(diracl_may_read(&none, &st, 1001, (const gid_t[]){ 40 }, 1), 1);
	assert_int_equal(diracl_may_read(&none, &st, 1001, (const gid_t[]){ 50 }, 1), 0);
	assert_int_equal(diracl_all_read(&none, &st, (gid_t)-1), 0);
	assert_int_equal(diracl_all_read(&none, &st, 40), 0);
	st.st_mode = S_IFREG | 0640;
	assert_int_equal(diracl_all_read(&none, &st, 50), 1);
	assert_int_equal(diracl_all_read(&none, &st, 40), 0);
	assert_int_equal(diracl_may_read(&untold, &st, 1001, (const gid_t[]){ 50 }, 1), 0);
	assert_int_equal(diracl_all_read(&untold, &st, 50), 0);
	assert_int_equal(diracl_may_read(&v, &st, 1001, (const gid_t[]){ 40 }, 1), 1);
	v.len--; /* ragged */
	assert_int_equal(diracl_may_read(&v, &st, 1001, (const gid_t[]){ 40 }, 1), 0);
	assert_int_equal(diracl_all_read(&v, &st, (gid_t)-1), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = (struct diracl_value){ .kind = DIRACL_POSIX, .len = bad[i].len,
			.value = bad[i].b };
		assert_int_equal(diracl_may_read(&v, &st, 1001, (const gid_t[]){ 40 }, 1), 0);
		assert_int_equal(diracl_all_read(&v, &st, (gid_t)-1), 0);
	}
}

/* An NFSv4 ACL: ACEs in order, the first that matches decides. */
static void
test_nfs4_read(void **state)
{
	struct nfs4 a = { .len = 0 }, b;
	struct stat st = { .st_uid = OWNER, .st_gid = 50, .st_mode = S_IFREG | 0644 };
	struct diracl_value v = { .kind = DIRACL_NFS4 };
	const gid_t g40[] = { 40 }, g50[] = { 50 };

	(void)state;
	put_be(&a, 0);
	nfs4_ace(&a, ALLOW, 0, READ_DATA, "OWNER@");
	b = a;
	nfs4_ace(&a, ALLOW, 0, READ_DATA, "GROUP@");
	nfs4_ace(&a, ALLOW, 0, READ_DATA, "EVERYONE@");
	v.value = a.b;
	v.len = a.len;
	assert_int_equal(diracl_may_read(&v, &st, 1001, g40, 1), 1);
	assert_int_equal(diracl_all_read(&v, &st, (gid_t)-1), 1);
	/* GROUP@ denied before EVERYONE@ allowed: 0604, "all but group 50" */
	nfs4_ace(&b, DENY, 0, READ_DATA, "GROUP@");
	nfs4_ace(&b, ALLOW, 0, READ_DATA, "EVERYONE@");
	v.value = b.b;
	v.len = b.len;
	assert_int_equal(diracl_may_read(&v, &st, 1001, g50, 1), 0);
	assert_int_equal(diracl_may_read(&v, &st, 1001, g40, 1), 1);
	assert_int_equal(diracl_may_read(&v, &st, OWNER, g50, 1), 1);
	assert_int_equal(diracl_all_read(&v, &st, (gid_t)-1), 0);
	assert_int_equal(diracl_all_read(&v, &st, 40), 0);
	/* a named who before the decision cannot be told: denied */
	b.len = 4;
	b.b[3] = 0;
	nfs4_ace(&b, DENY, 0, READ_DATA, "alice@dom");
	nfs4_ace(&b, ALLOW, 0, READ_DATA, "EVERYONE@");
	v.len = b.len;
	assert_int_equal(diracl_may_read(&v, &st, 1002, g40, 1), 0);
	assert_int_equal(diracl_all_read(&v, &st, (gid_t)-1), 0);
	/* INHERIT_ONLY, AUDIT and ACEs without READ_DATA are not weighed;
	 * an ACL that ends undecided denies */
	b.len = 4;
	b.b[3] = 0;
	nfs4_ace(&b, DENY, INHERIT_ONLY, READ_DATA, "EVERYONE@");
	nfs4_ace(&b, 2, 0, READ_DATA, "EVERYONE@");
	nfs4_ace(&b, DENY, 0, ADD_FILE, "EVERYONE@");
	nfs4_ace(&b, ALLOW, 0, READ_DATA, "GROUP@");
	v.len = b.len;
	assert_int_equal(diracl_may_read(&v, &st, 1001, g50, 1), 1);
	assert_int_equal(diracl_may_read(&v, &st, 1001, g40, 1), 0);
	assert_int_equal(diracl_all_read(&v, &st, 50), 1);
	assert_int_equal(diracl_all_read(&v, &st, 40), 0);
	/* bytes past the last ACE, a count past the end: not one */
	v.value = a.b;
	v.len = a.len + 4;
	assert_int_equal(diracl_may_read(&v, &st, 1001, g40, 1), 0);
	v.len = a.len - 1;
	assert_int_equal(diracl_may_read(&v, &st, 1001, g40, 1), 0);
	assert_int_equal(diracl_all_read(&v, &st, (gid_t)-1), 0);
}

/* diracl_file_acl on real files: none on a plain file; the POSIX ACL's
 * bytes where the filesystem keeps them; a closed descriptor untold. */
static void
test_file_acl(void **state)
{
	char *dir = made_dir(), path[PATH_MAX];
	struct acl a = acl_of(2, (const uint32_t[]){ USER_OBJ, 6, ANY, USER, 0, 1001, GROUP_OBJ,
		4, ANY, MASK, 4, ANY, OTHER, 4, ANY, 0 });
	struct diracl_value v;
	int fd;

	(void)state;
	snprintf(path, sizeof(path), "%s/f", dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	diracl_file_acl(fd, &v);
	assert_int_equal(v.kind, DIRACL_NONE);
	diracl_value_free(&v);
	if (fsetxattr(fd, "system.posix_acl_access", a.b, a.len, 0) == 0) {
		struct stat st;

		assert_int_equal(fstat(fd, &st), 0);
		diracl_file_acl(fd, &v);
		assert_int_equal(v.kind, DIRACL_POSIX);
		assert_int_equal(v.len, a.len);
		assert_memory_equal(v.value, a.b, a.len);
		assert_int_equal(diracl_may_read(&v, &st, 1001, (const gid_t[]){ 4242 }, 1), 0);
		assert_int_equal(diracl_may_read(&v, &st, 1002, (const gid_t[]){ 4242 }, 1), 1);
		diracl_value_free(&v);
	}
	assert_int_equal(close(fd), 0);
	diracl_file_acl(fd, &v);
	assert_int_equal(v.kind, DIRACL_UNTOLD);
	diracl_file_acl(-1, &v);
	assert_int_equal(v.kind, DIRACL_UNTOLD);
	tu_rmtree(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_named_writers),
		cmocka_unit_test(test_no_named_writer),
		cmocka_unit_test(test_not_an_acl_fails_closed),
		cmocka_unit_test(test_fold_on_a_directory),
		cmocka_unit_test(test_no_posix_acls),
		cmocka_unit_test(test_nfs4_parser),
		cmocka_unit_test(test_nfs4_not_an_acl_fails_closed),
		cmocka_unit_test(test_nfs4_fold),
		cmocka_unit_test(test_a_directory_models_own_directory_is_folded),
		cmocka_unit_test(test_may_read),
		cmocka_unit_test(test_all_read),
		cmocka_unit_test(test_read_by_mode_and_fails_closed),
		cmocka_unit_test(test_nfs4_read),
		cmocka_unit_test(test_file_acl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
