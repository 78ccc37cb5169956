/*
 * test_stage_remove.c: unit tests of daemon/stage_dir.c's removing and
 * sweeping staged copies: stage_remove and the sweep remove only
 * directories wcached marked as its own copies, keep what they are told to
 * and what they did not make, refuse a stage_dir others may write or
 * another user owns (and so do staging and stage_prepare_dir), and leave a
 * stage_dir another running wcached holds, and keep a copy's marker when
 * its directory cannot be read to the end. On real files in a temporary
 * directory (stage_fixture.h); readdir is wrapped to fail.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/path.h"
#include "stage.h"
#include "stage_fixture.h"
#include "stage_internal.h"
#include "testutil.h"

/* ---- fault injection -------------------------------------------------------- */

/* readdir wrapped: with readdir_left >= 0, that many calls go through and
 * the next fails with EIO (a disk error, or ENOMEM, in getdents). */
static int readdir_left = -1;

struct dirent *__real_readdir(DIR *d);
struct dirent *__wrap_readdir(DIR *d);

struct dirent *
__wrap_readdir(DIR *d)
{
	if (readdir_left == 0) {
		readdir_left = -1;
		errno = EIO;
		return NULL;
	}
	if (readdir_left > 0)
		readdir_left--;
	return __real_readdir(d);
}

/* ---- removing ------------------------------------------------------------- */

/* Makes dir (mode 0700) holding a file; with the marker when marked. */
static void
make_copy(const char *dir, int marked)
{
	char *w;

	assert_int_equal(mkdir(dir, 0700), 0);
	w = tu_write(dir, "model.safetensors", "abc", 3);
	free(w);
	if (marked) {
		w = tu_write(dir, STAGE_MARKER, "", 0);
		free(w);
	}
}

static void
make_copy_in(const char *parent, const char *name, int marked)
{
	char *d = path_join(parent, name);

	make_copy(d, marked);
	free(d);
}

/* Entries in parent/name, -1 when it is gone. */
static int
entries_in(const char *parent, const char *name)
{
	char *d = path_join(parent, name);
	int n = tu_count_entries(d);

	free(d);
	return n;
}

/* stage_remove removes a copy and tolerates one already gone; the sweep
 * removes what an earlier process left, keeps what it is told to, this
 * process's own temporaries (named with its token), and names it did not
 * make. A temporary named with this process's pid is an earlier process's
 * (a pid repeats: in a container wcached is pid 1 at every start), left by
 * a staging a crash cut short: removed too. */
static void
test_remove_and_sweep(void **state)
{
	struct fixture *f = *state;
	static const char *const leftovers[] = { "a.1", "a.2-3", ".b.tmp-1-abcdef", "kept.7" };
	static const char *const others[] = { "notes", "a.x", ".hidden" };
	char own[64], same_pid[64], *keep[1], *plain;
	unsigned removed = 9;

	assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), 0);
	for (size_t i = 0; i < 4; i++)
		make_copy_in(f->stage_dir, leftovers[i], 1);
	for (size_t i = 0; i < 3; i++) {
		char *d = path_join(f->stage_dir, others[i]);

		assert_int_equal(mkdir(d, 0700), 0);
		free(d);
	}
	assert_int_equal(strlen(stage_token()), 16);
	snprintf(own, sizeof(own), ".c.tmp-%s-xyz123", stage_token());
	make_copy_in(f->stage_dir, own, 1);
	snprintf(same_pid, sizeof(same_pid), ".c.tmp-%ld-abc123", (long)getpid());
	make_copy_in(f->stage_dir, same_pid, 1);
	plain = tu_write(f->stage_dir, "b.5", "file, not a directory", 21);

	keep[0] = path_join(f->stage_dir, "kept.7");
	assert_int_equal(stage_sweep(f->stage_dir, keep, 1, NULL, &removed), 0);
	assert_int_equal(removed, 4);
	assert_int_equal(tu_count_entries(f->stage_dir), 6); /* kept.7, 3 others, own, b.5 */
	assert_int_equal(tu_count_entries(keep[0]), 2);
	assert_int_equal(entries_in(f->stage_dir, own), 2);
	assert_int_equal(entries_in(f->stage_dir, same_pid), -1);
	assert_int_equal(stage_remove(keep[0]), 0);
	assert_int_equal(tu_count_entries(keep[0]), -1);
	assert_int_equal(stage_remove(keep[0]), 0);
	free(keep[0]);
	free(plain);
}

/* Directories named as copies are but without the marker (another
 * program's "python3.11", "backup.2024-1", a copy an older wcached made)
 * are left whole by the sweep and by stage_remove, each named once in
 * the log; so is a copy whose marker is a symbolic link, and a directory
 * that a name-shaped symbolic link in stage_dir points to. */
static void
test_sweep_leaves_what_it_did_not_make(void **state)
{
	struct fixture *f = *state;
	static const char *const foreign[] = { "python3.11", "backup.2024-1", ".x.tmp-1-abcdef" };
	char *elsewhere = path_join(f->tmp, "elsewhere"), *link_path, *bad, *marker;
	unsigned removed = 9;

	assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), 0);
	for (size_t i = 0; i < 3; i++)
		make_copy_in(f->stage_dir, foreign[i], 0);
	/* A marked directory outside stage_dir, and a link to it inside. */
	make_copy(elsewhere, 1);
	link_path = path_join(f->stage_dir, "link.4");
	assert_int_equal(symlink(elsewhere, link_path), 0);
	/* A marker that is a link to a file of ours. */
	bad = path_join(f->stage_dir, "m.9");
	assert_int_equal(mkdir(bad, 0700), 0);
	marker = path_join(bad, STAGE_MARKER);
	assert_int_equal(symlink(f->src, marker), 0);
	free(tu_write(bad, "model.safetensors", "abc", 3));
	make_copy_in(f->stage_dir, "m.1", 1); /* the one that is ours */

	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
	assert_int_equal(entries_in(f->stage_dir, "m.1"), -1);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(entries_in(f->stage_dir, foreign[i]), 1);
	assert_int_equal(tu_count_entries(elsewhere), 2);
	assert_int_equal(tu_count_entries(bad), 2);
	assert_int_equal(tu_count_entries(f->stage_dir), 5);

	/* stage_remove refuses them too, through the link as well. */
	assert_int_equal(stage_remove(link_path), -EPERM);
	assert_non_null(strstr(error_get(), "not a copy wcached made"));
	assert_non_null(strstr(error_get(), "link.4"));
	assert_int_equal(tu_count_entries(elsewhere), 2);
	assert_int_equal(stage_remove(bad), -EPERM);
	assert_int_equal(tu_count_entries(bad), 2);
	free(link_path);
	link_path = path_join(f->stage_dir, "python3.11");
	assert_int_equal(stage_remove(link_path), -EPERM);
	assert_int_equal(tu_count_entries(link_path), 1);
	free(link_path);
	free(marker);
	free(bad);
	free(elsewhere);
}

/* A stage_dir others may write, or another user's, is refused by the
 * sweep, stage_remove, staging and stage_prepare_dir alike, with one line
 * naming it and why; nothing in it is removed. */
static void
test_unsafe_stage_dir_is_refused(void **state)
{
	struct fixture *f = *state;
	static const mode_t modes[] = { 0777, 01777, 0770 };
	char *copy, *model;
	unsigned removed = 9;

	assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), 0);
	make_copy_in(f->stage_dir, "m.1", 1);
	copy = path_join(f->stage_dir, "m.1");
	add_source(f, "model.safetensors", 1000, 21);
	model = path_join(f->src, "model.safetensors");
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(chmod(f->stage_dir, modes[i]), 0);
		assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), -EPERM);
		assert_int_equal(removed, 0);
		assert_non_null(strstr(error_get(), f->stage_dir));
		assert_non_null(strstr(error_get(), i < 2 ? "writable by all users" :
							       "writable by its group"));
		assert_int_equal(stage_remove(copy), -EPERM);
		assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), -EPERM);
		make_request(f, model);
		assert_int_equal(stage_copy(&f->req), -EPERM);
		assert_non_null(strstr(error_get(), "cannot stage it: stage_dir "));
		assert_int_equal(tu_count_entries(f->stage_dir), 1);
		assert_int_equal(tu_count_entries(copy), 2);
	}
	assert_int_equal(chmod(f->stage_dir, 0700), 0);
	if (geteuid() == 0) {
		/* Another user's: refused, and never given to the user wcached
		 * runs as; only a directory it made itself is given. */
		char *made = path_join(f->tmp, "made");
		struct stat st;

		assert_int_equal(chown(f->stage_dir, 12345, 12345), 0);
		assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), -EPERM);
		assert_non_null(strstr(error_get(), "belongs to uid 12345, not to uid 0"));
		assert_int_equal(stage_prepare_dir(f->stage_dir, 54321, 54321), -EPERM);
		assert_non_null(strstr(error_get(), "belongs to uid 12345, not to uid 54321"));
		assert_int_equal(stat(f->stage_dir, &st), 0);
		assert_int_equal(st.st_uid, 12345);
		assert_int_equal(stage_prepare_dir(made, 54321, 54320), 0);
		assert_int_equal(stat(made, &st), 0);
		assert_int_equal(st.st_uid, 54321);
		assert_int_equal(st.st_gid, 54320);
		assert_int_equal(st.st_mode & 07777, 0700);
		assert_int_equal(stage_prepare_dir(made, 54321, 54320), 0);
		assert_int_equal(chown(f->stage_dir, 0, 0), 0);
		free(made);
	}
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
	free(model);
	free(copy);
}

/* Another process holding stage_dir's lock (a second wcached with the
 * same stage_dir): the sweep removes nothing and says so. */
static void
test_sweep_of_a_stage_dir_in_use(void **state)
{
	struct fixture *f = *state;
	unsigned removed = 9;
	int other;

	assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), 0);
	make_copy_in(f->stage_dir, "m.1", 1);
	/* A descriptor of its own: flock(2) locks conflict between open
	 * file descriptions even within one process. */
	other = open(f->stage_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(other >= 0);
	assert_int_equal(flock(other, LOCK_EX | LOCK_NB), 0);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), -EBUSY);
	assert_non_null(strstr(error_get(), "in use by another running wcached"));
	assert_int_equal(removed, 0);
	assert_int_equal(entries_in(f->stage_dir, "m.1"), 2);
	close(other);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
	/* Ours now: a second sweep of it by this process goes on. */
	make_copy_in(f->stage_dir, "m.2", 1);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
}

/* A copy whose directory cannot be read to the end keeps its marker and
 * what was not removed, and says why: the next removal or sweep knows it
 * for wcached's and removes it whole. (Before, the marker went, rmdir
 * failed "Directory not empty", and every later sweep left it alone as
 * not wcached's: its disk space never came back.) A sweep whose read of
 * stage_dir fails says so too. */
static void
test_a_copy_not_read_to_the_end_keeps_its_marker(void **state)
{
	struct fixture *f = *state;
	char *copy = path_join(f->stage_dir, "m.4");
	unsigned removed = 9;

	assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), 0);
	make_copy(copy, 1);
	for (int i = 0; i < 4; i++) {
		char name[16], *w;

		snprintf(name, sizeof(name), "shard-%d", i);
		w = tu_write(copy, name, "x", 1);
		free(w);
	}
	readdir_left = 3; /* ".", "..", one entry: at most one file goes */
	assert_int_equal(stage_remove(copy), -EIO);
	assert_non_null(strstr(error_get(), "reading "));
	assert_non_null(strstr(error_get(), "m.4: Input/output error"));
	assert_true(tu_count_entries(copy) >= 5); /* the marker and 4 of 6 files at least */
	assert_int_equal(stage_remove(copy), 0);
	assert_int_equal(tu_count_entries(copy), -1);

	make_copy(copy, 1);
	readdir_left = 0;
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), -EIO);
	assert_non_null(strstr(error_get(), "reading stage_dir "));
	assert_int_equal(removed, 0);
	assert_int_equal(tu_count_entries(copy), 2);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
	free(copy);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_remove_and_sweep, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep_leaves_what_it_did_not_make, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_unsafe_stage_dir_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep_of_a_stage_dir_in_use, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_copy_not_read_to_the_end_keeps_its_marker,
			setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
