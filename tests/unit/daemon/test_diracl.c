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
 * directory, the path's last name, too (review rev211 L0).
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
 * or fails with statfs_err. */
static struct {
	int on;
	unsigned long magic;
	int statfs_err;
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
	fake.on = 0;
	tu_rmtree(dir);
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_named_writers),
		cmocka_unit_test(test_no_named_writer),
		cmocka_unit_test(test_not_an_acl_fails_closed),
		cmocka_unit_test(test_fold_on_a_directory),
		cmocka_unit_test(test_no_posix_acls),
		cmocka_unit_test(test_a_directory_models_own_directory_is_folded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
