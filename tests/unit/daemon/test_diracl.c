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
 * left as it is.
 */
#include <errno.h>
#include <fcntl.h>
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

#include "diracl.h"
#include "testutil.h"

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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_named_writers),
		cmocka_unit_test(test_no_named_writer),
		cmocka_unit_test(test_not_an_acl_fails_closed),
		cmocka_unit_test(test_fold_on_a_directory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
