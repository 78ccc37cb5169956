/*
 * test_restore_rules.c: daemon/restore_rules.c, what a derived artifact
 * taken back at a warm restart must still obey (review rev181 F10, F6).
 *
 * The limits: a described index size over DERIVE_MAX_INDEX is refused
 * before anything is read; a safetensors memfd whose header (its 8-byte
 * length) is over DERIVE_MAX_HEAD is refused from its first bytes, and one
 * at the limit, or too short to tell, passes on to its reader; with a
 * memory_budget, the memfd and its index together must fit in it. The
 * builder: root and wcached's own uid are not looked up and may always
 * build; a uid the user database does not know has no groups and may not
 * build under derive_groups; a known one may, by its primary group, until
 * derive_groups no longer holds it; and nobody may keep an artifact of a
 * model whose derive is off. A builder whose gid and groups the store
 * recorded (version 7) is judged by those alone, known to the user
 * database or not: by its gid or any one of its groups, as a connection
 * is. Each refusal's message names the reason.
 */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "access.h"
#include "base/error.h"
#include "derive.h"
#include "fdstore.h"
#include "registry.h"
#include "restore_internal.h"
#include "testutil.h"

/* A memfd holding a safetensors length prefix announcing head bytes of
 * header, the file size bytes long (a sparse tail: only the prefix is
 * read). */
static int
memfd_with_header(uint64_t head, uint64_t size)
{
	int fd = memfd_create("artifact", MFD_CLOEXEC);
	uint8_t b[8];

	assert_true(fd >= 0);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(head >> (8 * i));
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(pwrite(fd, b, sizeof(b), 0), (ssize_t)sizeof(b));
	return fd;
}

/* What restore_artifact_limits says of a's memfd announcing head bytes of
 * header (memfd_with_header), closed after. */
static int
limits_of_header(uint64_t head, const struct fdstore_artifact *a)
{
	int fd = memfd_with_header(head, a->size);
	int ret = restore_artifact_limits(fd, a);

	close(fd);
	return ret;
}

static void
test_limits(void **state)
{
	struct fdstore_artifact a = { .key = "k", .index_size = DERIVE_MAX_INDEX + 1u,
		.size = 64u << 20 };
	int fd = memfd_with_header(1024, a.size);

	(void)state;
	assert_int_equal(restore_artifact_limits(fd, &a), -EFBIG);
	assert_non_null(strstr(error_get(), "its compiled index is 16.0 MiB, more than the 16 "
					    "MiB one derived artifact's index may be"));
	a.index_size = DERIVE_MAX_INDEX;
	assert_int_equal(restore_artifact_limits(fd, &a), 0);
	close(fd);
	/* The head is the 8-byte length and the header it announces. */
	assert_int_equal(limits_of_header(DERIVE_MAX_HEAD - 8, &a), 0);
	assert_int_equal(limits_of_header(DERIVE_MAX_HEAD - 7, &a), -EFBIG);
	assert_non_null(strstr(error_get(), "its header is 16.0 MiB, more than the 16 MiB a "
					    "derived artifact's header may be"));
	/* Too short to tell: its reader says why. */
	fd = memfd_create("artifact", MFD_CLOEXEC);
	assert_int_equal(write(fd, "abc", 3), 3);
	assert_int_equal(restore_artifact_limits(fd, &a), 0);
	close(fd);
}

/* With a memory_budget, the memfd and its compiled index together within
 * it, as PUBLISH weighs them; without one, no bound here. */
static void
test_fits_memory_budget(void **state)
{
	static struct registry r;
	struct fdstore_artifact a = { .key = "k", .size = 2u << 20, .index_size = 4096 };

	(void)state;
	assert_int_equal(restore_artifact_fits(&r, &a), 0);
	r.memory_budget = (2u << 20) + 4096;
	assert_int_equal(restore_artifact_fits(&r, &a), 0);
	r.memory_budget--;
	assert_int_equal(restore_artifact_fits(&r, &a), -EFBIG);
	assert_non_null(strstr(error_get(), "2 MiB (2 MiB of memfd and 4 KiB of compiled index) "
					    "is more than memory_budget (2 MiB)"));
	/* A sum past 2^64 is no wrap into a small one. */
	a.size = UINT64_MAX;
	r.memory_budget = 1u << 20;
	assert_int_equal(restore_artifact_fits(&r, &a), -EFBIG);
}

/* A model entry with derive and derive_groups (gids, n) as configured. */
static void
entry_with(struct model_entry *e, int derive, const gid_t *gids, size_t n)
{
	memset(e, 0, sizeof(*e));
	e->derive = derive;
	assert_int_equal(access_set(&e->builders, 1, NULL, 0, gids, n), 0);
}

static void
test_root_and_self_may_always_build(void **state)
{
	struct restore_builder b;
	struct model_entry e;

	(void)state;
	entry_with(&e, 1, NULL, 0);
	assert_int_equal(restore_builder_lookup(0, &b), 0);
	assert_int_equal(b.known, 0);
	assert_null(b.groups);
	assert_int_equal(restore_builder_allowed(&e, &b), 0);
	restore_builder_clear(&b);
	assert_int_equal(restore_builder_lookup(geteuid(), &b), 0);
	assert_int_equal(restore_builder_allowed(&e, &b), 0);
	restore_builder_clear(&b);
	/* Not when derive is off. */
	e.derive = 0;
	assert_int_equal(restore_builder_lookup(0, &b), 0);
	assert_int_equal(restore_builder_allowed(&e, &b), -ENOTSUP);
	assert_non_null(strstr(error_get(), "derive is off now (derive = no)"));
	restore_builder_clear(&b);
	restore_builder_clear(NULL);
	access_clear(&e.builders);
}

static void
test_a_uid_the_database_does_not_know(void **state)
{
	struct restore_builder b;
	struct model_entry e;
	gid_t gid = 64200;
	uid_t uid = 64302;
	char want[96];

	(void)state;
	while (getpwuid(uid) != NULL)
		uid++;
	entry_with(&e, 1, &gid, 1);
	assert_int_equal(restore_builder_lookup(uid, &b), 0);
	assert_int_equal(b.known, 0);
	assert_int_equal(b.ngroups, 0);
	assert_int_equal(restore_builder_allowed(&e, &b), -EPERM);
	snprintf(want, sizeof(want), "its builder uid %u may not build it now: the user "
		 "database has no entry", (unsigned)uid);
	assert_non_null(strstr(error_get(), want));
	restore_builder_clear(&b);
	access_clear(&e.builders);
}

/* What restore_builder_allowed says, under derive = yes and derive_groups
 * = { gid }, of the builder a recorded, taken as stored: its uid, gid and
 * groups as a has them (no groups: none allocated), no database asked. */
static int
stored_allowed(const struct fdstore_artifact *a, gid_t gid)
{
	struct restore_builder b;
	struct model_entry e;
	int ret;

	entry_with(&e, 1, &gid, 1);
	assert_int_equal(restore_builder_stored(a, &b), 0);
	assert_int_equal(b.stored, 1);
	assert_int_equal(b.uid, a->builder_uid);
	assert_int_equal(b.gid, a->builder_gid);
	assert_int_equal(b.ngroups, a->builder_ngroups);
	for (uint32_t k = 0; k < a->builder_ngroups; k++)
		assert_int_equal(b.groups[k], a->builder_groups[k]);
	if (a->builder_ngroups == 0)
		assert_null(b.groups);
	ret = restore_builder_allowed(&e, &b);
	restore_builder_clear(&b);
	access_clear(&e.builders);
	return ret;
}

/* Stored groups: the live rule on them, no database (an unknown uid), by
 * the gid or a supplementary group; refused, the message says which. */
static void
test_stored_groups(void **state)
{
	uint32_t groups[] = { 10, 64201 };
	struct fdstore_artifact a = { .builder_uid = 64302, .builder_gid = 64203,
		.builder_ngroups = 2, .builder_groups = groups };

	(void)state;
	while (getpwuid(a.builder_uid) != NULL)
		a.builder_uid++;
	/* By a supplementary group. */
	assert_int_equal(stored_allowed(&a, 64201), 0);
	/* By the gid, with no supplementary groups. */
	a.builder_ngroups = 0;
	assert_int_equal(stored_allowed(&a, 64203), 0);
	/* Neither. */
	a.builder_ngroups = 2;
	assert_int_equal(stored_allowed(&a, 64204), -EPERM);
	assert_non_null(strstr(error_get(), "may not build it now: none of its groups (gid "
		"64203 and 2 supplementary, as its connection had them when it published) is "
		"in derive_groups"));
}

static void
test_a_known_uid_by_its_groups(void **state)
{
	struct passwd *pw = getpwnam("nobody");
	struct restore_builder b, copy;
	struct model_entry e;
	gid_t other = 64200;
	char want[96];

	(void)state;
	if (pw == NULL || pw->pw_uid == geteuid()) {
		skip();
		return;
	}
	assert_int_equal(restore_builder_lookup(pw->pw_uid, &b), 0);
	assert_int_equal(b.known, 1);
	assert_int_equal(b.gid, pw->pw_gid);
	assert_true(b.ngroups >= 1);
	/* In derive_groups by its primary group; so is a copy of it (the
	 * next artifact of the same builder), whose groups are its own. */
	entry_with(&e, 1, &pw->pw_gid, 1);
	assert_int_equal(restore_builder_allowed(&e, &b), 0);
	assert_int_equal(restore_builder_copy(&b, &copy), 0);
	assert_true(copy.groups != b.groups);
	assert_int_equal(copy.ngroups, b.ngroups);
	assert_memory_equal(copy.groups, b.groups, (size_t)b.ngroups * sizeof(gid_t));
	assert_int_equal(restore_builder_allowed(&e, &copy), 0);
	restore_builder_clear(&copy);
	access_clear(&e.builders);
	/* derive_groups narrowed to a group it is not in. */
	entry_with(&e, 1, &other, 1);
	assert_int_equal(restore_builder_allowed(&e, &b), -EPERM);
	snprintf(want, sizeof(want), "its builder uid %u may not build it now: none of its "
		 "groups (primary %u", (unsigned)pw->pw_uid, (unsigned)pw->pw_gid);
	assert_non_null(strstr(error_get(), want));
	access_clear(&e.builders);
	restore_builder_clear(&b);
	assert_null(b.groups);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_fits_memory_budget),
		cmocka_unit_test(test_root_and_self_may_always_build),
		cmocka_unit_test(test_a_uid_the_database_does_not_know),
		cmocka_unit_test(test_a_known_uid_by_its_groups),
		cmocka_unit_test(test_stored_groups),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
