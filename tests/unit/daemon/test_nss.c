/*
 * test_nss.c: daemon/nss.c, the user and group database with buffers that
 * grow. Root's entries by id and by name, group 0's, and root's groups;
 * an id and a name the database does not know are "no entry" (NULL, err
 * 0), not an error. getpwuid_r and getgrgid_r are wrapped
 * (-Wl,--wrap=getpwuid_r,--wrap=getgrgid_r): they say ERANGE while the
 * buffer is smaller than a test asks, so the lookup must grow its buffer
 * to that size and then succeed, and gives up with ERANGE past 1 MiB; and
 * an error of the database (EIO) is reported as itself.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <cmocka.h>

#include "nss.h"

static struct {
	size_t need;    /* ERANGE while the buffer is smaller */
	int fail;       /* an error to return instead, 0 none */
	size_t largest; /* the largest buffer asked with */
	int calls;
} fault;

int __real_getpwuid_r(uid_t uid, struct passwd *pw, char *buf, size_t size,
	struct passwd **found);
int __wrap_getpwuid_r(uid_t uid, struct passwd *pw, char *buf, size_t size,
	struct passwd **found);
int __real_getgrgid_r(gid_t gid, struct group *gr, char *buf, size_t size,
	struct group **found);
int __wrap_getgrgid_r(gid_t gid, struct group *gr, char *buf, size_t size,
	struct group **found);

/* Whether the fault decides this call: ERANGE or fault.fail, *found NULL. */
static int
faulted(size_t size, int *e)
{
	fault.calls++;
	if (size > fault.largest)
		fault.largest = size;
	if (fault.fail != 0)
		*e = fault.fail;
	else if (size < fault.need)
		*e = ERANGE;
	else
		return 0;
	return 1;
}

int
__wrap_getpwuid_r(uid_t uid, struct passwd *pw, char *buf, size_t size, struct passwd **found)
{
	int e;

	if (faulted(size, &e)) {
		*found = NULL;
		return e;
	}
	return __real_getpwuid_r(uid, pw, buf, size, found);
}

int
__wrap_getgrgid_r(gid_t gid, struct group *gr, char *buf, size_t size, struct group **found)
{
	int e;

	if (faulted(size, &e)) {
		*found = NULL;
		return e;
	}
	return __real_getgrgid_r(gid, gr, buf, size, found);
}

static int
reset(void **state)
{
	(void)state;
	memset(&fault, 0, sizeof(fault));
	return 0;
}

static void
test_root_by_uid_and_name(void **state)
{
	struct passwd *pw, *again;
	int err = -1;

	(void)state;
	pw = nss_user_by_uid(0, &err);
	assert_non_null(pw);
	assert_int_equal(err, 0);
	assert_int_equal(pw->pw_uid, 0);
	again = nss_user_by_name(pw->pw_name, &err);
	assert_non_null(again);
	assert_int_equal(again->pw_uid, 0);
	assert_int_equal(again->pw_gid, pw->pw_gid);
	free(again);
	free(pw);
}

static void
test_group_zero_by_gid_and_name(void **state)
{
	struct group *gr, *again;
	int err = -1;

	(void)state;
	gr = nss_group_by_gid(0, &err);
	assert_non_null(gr);
	assert_int_equal(err, 0);
	again = nss_group_by_name(gr->gr_name, &err);
	assert_non_null(again);
	assert_int_equal(again->gr_gid, 0);
	free(again);
	free(gr);
}

static void
test_no_entry_is_no_error(void **state)
{
	uid_t uid = 64999;
	int err = -1;

	(void)state;
	while (getpwuid(uid) != NULL)
		uid++;
	assert_null(nss_user_by_uid(uid, &err));
	assert_int_equal(err, 0);
	err = -1;
	assert_null(nss_user_by_name("no-such-user-of-wcache", &err));
	assert_int_equal(err, 0);
	err = -1;
	assert_null(nss_group_by_name("no-such-group-of-wcache", &err));
	assert_int_equal(err, 0);
}

/* A database whose entries need 200 KiB: the buffer doubles until it is
 * that big (from the size sysconf suggests), and the entry comes back. */
static void
test_buffer_grows_while_erange(void **state)
{
	struct passwd *pw;
	struct group *gr;
	int err = -1;

	(void)state;
	fault.need = (size_t)200 * 1024;
	pw = nss_user_by_uid(0, &err);
	assert_non_null(pw);
	assert_int_equal(pw->pw_uid, 0);
	assert_true(fault.largest >= fault.need && fault.largest < 2 * fault.need);
	assert_true(fault.calls > 1);
	free(pw);
	fault.largest = 0;
	gr = nss_group_by_gid(0, &err);
	assert_non_null(gr);
	assert_int_equal(gr->gr_gid, 0);
	assert_true(fault.largest >= fault.need && fault.largest < 2 * fault.need);
	free(gr);
}

/* An entry larger than 1 MiB: the lookup gives up with ERANGE. */
static void
test_gives_up_past_a_mebibyte(void **state)
{
	int err = 0;

	(void)state;
	fault.need = 4u << 20;
	assert_null(nss_user_by_uid(0, &err));
	assert_int_equal(err, ERANGE);
	assert_true(fault.largest >= (1u << 20) && fault.largest < (2u << 20));
}

/* The database cannot be asked (EIO): that error, not "no entry". */
static void
test_database_error_is_reported(void **state)
{
	int err = 0;

	(void)state;
	fault.fail = EIO;
	assert_null(nss_group_by_gid(0, &err));
	assert_int_equal(err, EIO);
	assert_int_equal(fault.calls, 1);
}

static void
test_roots_groups(void **state)
{
	struct passwd *pw;
	gid_t *list = NULL;
	int err, n = 0, has_primary = 0;

	(void)state;
	pw = nss_user_by_uid(0, &err);
	assert_non_null(pw);
	assert_int_equal(nss_groups(pw, &list, &n), 0);
	assert_true(n >= 1);
	for (int k = 0; k < n; k++)
		has_primary |= list[k] == pw->pw_gid;
	assert_true(has_primary);
	free(list);
	free(pw);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_root_by_uid_and_name, reset),
		cmocka_unit_test_setup(test_group_zero_by_gid_and_name, reset),
		cmocka_unit_test_setup(test_no_entry_is_no_error, reset),
		cmocka_unit_test_setup(test_buffer_grows_while_erange, reset),
		cmocka_unit_test_setup(test_gives_up_past_a_mebibyte, reset),
		cmocka_unit_test_setup(test_database_error_is_reported, reset),
		cmocka_unit_test_setup(test_roots_groups, reset),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
