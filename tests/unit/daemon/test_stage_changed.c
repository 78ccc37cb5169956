/*
 * test_stage_changed.c: unit tests of daemon/stage.c, staging a model's
 * files while they change: a source written, touched, renamed over,
 * truncated or removed during the copy, and a shard index replaced since
 * the model was validated, are refused with nothing left, while a stat
 * that fails once (a flaky network filesystem) is not taken for a
 * removal; and copies no longer wanted (wcached stopping, a newer load)
 * stop, or never start (not even a stat of the source), and a stop ends
 * the removal of their unfinished copy at its next file, leaving the rest
 * to the next start's sweep. On real files in a temporary directory
 * (stage_fixture.h).
 *
 * Fault injection with the linker's --wrap (stage_fault.c): a hook on
 * copy_file_range changes the source mid-copy, makes a request slow or
 * stops wcached, a look at one path (the judged walk) can be made to fail
 * or be refused, and a hook on
 * unlinkat stops wcached during the removal of an unfinished copy.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "stage.h"
#include "stage_fixture.h"
#include "stage_internal.h"
#include "testutil.h"

/* ---- sources that change -------------------------------------------------- */

/* The source written in place during the copy (its size and mtime move):
 * the staging fails naming the file, and nothing is left. */
static int
append_during_copy(unsigned call)
{
	if (call == 1) {
		char *path = path_join(fx->src, "model.safetensors");
		int fd = open(path, O_WRONLY | O_APPEND);

		assert_true(fd >= 0);
		assert_int_equal(write(fd, "more", 4), 4);
		close(fd);
		free(path);
	}
	return 0;
}

static void
test_changed_during_copy(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 17 * MiB, 6);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = append_during_copy;
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "model.safetensors changed during the copy"));
	assert_non_null(strstr(error_get(), "rename(2)"));
	assert_null(f->req.dir);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* Only the mtime moves (a write that keeps the size). */
static int
touch_during_copy(unsigned call)
{
	if (call == 0) {
		char *path = path_join(fx->src, "model.safetensors");
		struct timespec t[2] = { { .tv_nsec = UTIME_OMIT }, { .tv_sec = 1000000 } };

		assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
		free(path);
	}
	return 0;
}

static void
test_mtime_changed_during_copy(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 1 * MiB, 7);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = touch_during_copy;
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "its mtime moved"));
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* The source renamed over during the copy: the copy is of the old file,
 * so it does not serve. A copy this fast checks its sources no more often
 * than once a second (before its first request, then not again): the
 * check after the copy is what sees it, after all five requests. */
static int
replace_during_copy(unsigned call)
{
	if (call == 0) {
		char *path = path_join(fx->src, "model.safetensors");
		char *other = tu_write(fx->src, "new.safetensors", "x", 1);

		assert_int_equal(rename(other, path), 0);
		free(other);
		free(path);
	}
	return 0;
}

static void
test_replaced_during_copy(void **state)
{
	struct fixture *f = *state;
	char *model;

	double start;

	add_source(f, "model.safetensors", 40 * MiB, 8);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = replace_during_copy;
	start = tu_now();
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "was replaced during the copy"));
	if (tu_now() - start < 1.0)
		assert_int_equal(copy_calls, 5);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* A request from a slow server: longer than the second between two checks
 * of the sources during a copy (stage.c, STAGE_CHECK_INTERVAL). */
static void
slow_request(void)
{
	struct timespec t = { .tv_sec = 1, .tv_nsec = 100L * 1000 * 1000 };

	while (nanosleep(&t, &t) == -1 && errno == EINTR)
		;
}

/* Stages f->req, which fails (-ESTALE, one line saying says) at the
 * request after the first, where the copy first checks its sources again;
 * nothing is left. */
static void
assert_stopped_after_one_request(struct fixture *f, const char *says)
{
	copy_calls = 0;
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), says));
	assert_null(strchr(error_get(), '\n'));
	assert_int_equal(copy_calls, 1);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	assert_null(f->req.dir);
}

static int
replace_in_a_slow_request(unsigned call)
{
	if (call == 0) {
		replace_during_copy(call);
		slow_request();
	}
	return 0;
}

/* The source renamed over early in a long copy from a slow server: the
 * copy checks its sources about once a second as it goes, so it stops
 * before its next request instead of copying the rest of the old file
 * only to refuse it; staged again, the source whose path names another
 * file by then is refused before its first request. Nothing is left. */
static void
test_replaced_early_in_a_long_copy(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 40 * MiB, 21); /* 5 requests */
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = replace_in_a_slow_request;
	assert_stopped_after_one_request(f, "model.safetensors was replaced during the copy");

	make_request(f, model);
	copy_calls = 0;
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "model.safetensors was replaced during the copy"));
	assert_int_equal(copy_calls, 0);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* Every source is checked, not only the one being copied: a shard still
 * to come, removed early in a long copy of the one before it, stops the
 * copy at its next request. */
static int
remove_shard_in_a_slow_request(unsigned call)
{
	if (call == 0) {
		char *path = path_join(fx->src, "s-2.safetensors");

		assert_int_equal(unlink(path), 0);
		free(path);
		slow_request();
	}
	return 0;
}

static void
test_shard_removed_early_in_a_long_copy(void **state)
{
	struct fixture *f = *state;
	static const char index[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\","
				    "\"b\":\"s-2.safetensors\"}}";
	char *ipath = tu_write(f->src, "m.safetensors.index.json", index, strlen(index));

	add_source(f, "s-1.safetensors", 24 * MiB, 22);
	add_source(f, "s-2.safetensors", 1000, 23);
	make_request(f, f->src);
	copy_hook = remove_shard_in_a_slow_request; /* of 5 requests: 3, 1, and the index */
	assert_stopped_after_one_request(f, "s-2.safetensors was removed during the copy");
	free(ipath);
}

/*
 * A stat of a source that fails without saying the file is gone (EIO from
 * a soft NFS mount or a FUSE server that hiccups, EINTR, ETIMEDOUT): the
 * periodic check during the copy is no proof of anything, so the copy goes
 * on, and the check after the copy, which vouches for it, passes. A long
 * copy makes one such stat a second: a single flaky answer must not throw
 * twenty minutes of copying away as "removed".
 */
static char *flaky_path;
static int slow_look_errno, slow_look_failures; /* what the look at flaky_path gets */

/* In the first request: the looks at flaky_path fail with slow_look_errno
 * (slow_look_failures times, -1: every time) from now on, and the request
 * takes past STAGE_CHECK_INTERVAL, so that the copy checks before its next. */
static int
look_fails_in_a_slow_request(unsigned call)
{
	if (call == 0) {
		stat_fail_path = flaky_path;
		stat_errno = slow_look_errno;
		stat_failures = slow_look_failures;
		slow_request();
	}
	return 0;
}

static void
test_flaky_stat_during_a_long_copy(void **state)
{
	struct fixture *f = *state;

	add_source(f, "model.safetensors", 40 * MiB, 24); /* 5 requests */
	flaky_path = path_join(f->src, "model.safetensors");
	make_request(f, flaky_path);
	copy_hook = look_fails_in_a_slow_request;
	slow_look_errno = EIO;
	slow_look_failures = 1;
	assert_int_equal(stage_copy(&f->req), 0);
	assert_int_equal(stat_failures, 0); /* the periodic check did ask */
	assert_same_file(f->req.dir, "model.safetensors", &f->files[0]);
	free(flaky_path);
	flaky_path = NULL;
}

/*
 * A directory model whose directory no longer answers stat() once the copy
 * is made (EIO, ETIMEDOUT from a remote server twenty minutes into a
 * copy): the model is still a directory, as plan_files found it before
 * the copy, and its path in the copy is the copy itself. It was asked
 * again after the copy, and a failed stat named dir/<the directory's
 * name>, which the copy's validation then failed on, throwing it away.
 */
static char *dir_path;

static int
directory_stat_fails(unsigned call)
{
	if (call == 0) {
		stat_fail_path = dir_path;
		stat_errno = ETIMEDOUT;
		stat_failures = -1;
	}
	return 0;
}

static void
test_directory_unstatable_after_the_copy(void **state)
{
	struct fixture *f = *state;
	static const char index[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\"}}";
	char *ipath = tu_write(f->src, "m.safetensors.index.json", index, strlen(index));

	add_source(f, "s-1.safetensors", 1 * MiB, 26);
	dir_path = f->src;
	make_request(f, f->src);
	copy_hook = directory_stat_fails;
	assert_int_equal(stage_copy(&f->req), 0);
	assert_int_equal(stat_failures, -1); /* failing from the first request on */
	assert_string_equal(f->req.path, f->req.dir);
	assert_same_file(f->req.dir, "s-1.safetensors", &f->files[0]);
	dir_path = NULL;
	free(ipath);
}

/* A source whose stat keeps failing (EIO) cannot be vouched for: the copy
 * fails, and says what failed, not that the file was removed. */
static int
failing_stat(unsigned call)
{
	if (call == 0) {
		stat_fail_path = flaky_path;
		stat_errno = EIO;
		stat_failures = -1;
	}
	return 0;
}

static void
test_failing_stat_is_not_a_removal(void **state)
{
	struct fixture *f = *state;

	add_source(f, "model.safetensors", 1 * MiB, 25);
	flaky_path = path_join(f->src, "model.safetensors");
	make_request(f, flaky_path);
	copy_hook = failing_stat;
	assert_int_equal(stage_copy(&f->req), -EIO);
	assert_null(strstr(error_get(), "removed during the copy"));
	assert_non_null(strstr(error_get(), "EIO"));
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(flaky_path);
	flaky_path = NULL;
}

/*
 * The source's path refused by the judged walk early in a long copy (a
 * neighbour renamed his link to his own FUSE mount over it: EXDEV, with
 * the walk's why): the source was replaced, and the copy stops before its
 * next request saying so, with the walk's line; it neither goes on as if
 * no answer came nor waits on the mount. A path the walk cannot follow
 * otherwise (a link loop, ELOOP; EACCES) is an answer too: the path no
 * longer reaches the file, and the copy stops.
 */
static void
test_a_path_the_walk_refuses_during_a_long_copy(void **state)
{
	struct fixture *f = *state;

	add_source(f, "model.safetensors", 40 * MiB, 27); /* 5 requests */
	flaky_path = path_join(f->src, "model.safetensors");
	make_request(f, flaky_path);
	copy_hook = look_fails_in_a_slow_request;
	slow_look_errno = EXDEV;
	slow_look_failures = -1;
	assert_stopped_after_one_request(f, "was replaced during the copy: ");
	assert_non_null(strstr(error_get(), "bob-evil lies on fuse"));
	assert_non_null(strstr(error_get(), flaky_path));

	stat_fail_path = NULL;
	make_request(f, flaky_path);
	slow_look_errno = ELOOP;
	copy_calls = 0;
	assert_int_equal(stage_copy(&f->req), -ELOOP);
	assert_non_null(strstr(error_get(), "checking"));
	assert_int_equal(copy_calls, 1);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(flaky_path);
	flaky_path = NULL;
}

/*
 * A directory model whose path the judged walk refuses when the staging
 * starts (a neighbour mounted on it, or renamed his link there, since the
 * load opened it): nothing is copied, and the one line is the walk's.
 */
static void
test_a_directory_the_walk_refuses_before_the_copy(void **state)
{
	struct fixture *f = *state;
	static const char index[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\"}}";
	char *ipath = tu_write(f->src, "m.safetensors.index.json", index, strlen(index));

	add_source(f, "s-1.safetensors", 1 * MiB, 28);
	make_request(f, f->src);
	stat_fail_path = f->src;
	stat_errno = EXDEV;
	stat_failures = -1;
	copy_calls = 0;
	assert_int_equal(stage_copy(&f->req), -EXDEV);
	assert_non_null(strstr(error_get(), "cannot stage it: "));
	assert_non_null(strstr(error_get(), "bob-evil lies on fuse"));
	assert_null(strchr(error_get(), '\n'));
	assert_int_equal(copy_calls, 0);
	assert_true(tu_count_entries(f->stage_dir) <= 0); /* never made: nothing to copy into */
	stat_fail_path = NULL;
	free(ipath);
}

/* The source truncated during the copy: it ends early. */
static int
truncate_during_copy(unsigned call)
{
	if (call == 0) {
		char *path = path_join(fx->src, "model.safetensors");

		assert_int_equal(truncate(path, 1000), 0);
		free(path);
	}
	return 0;
}

static void
test_truncated_during_copy(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 10 * MiB, 9);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = truncate_during_copy;
	assert_true(stage_copy(&f->req) < 0);
	assert_non_null(strstr(error_get(), "changed during the copy"));
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* The shard index is found again by path when the copy starts: one
 * replaced since the model was validated (another shard list, or none
 * that parses), or gone, is refused, not copied beside the validated
 * shards; one that names the same shards is copied. */
static void
test_shard_index_replaced_after_validation(void **state)
{
	struct fixture *f = *state;
	static const char same[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\","
				   "\"b\":\"s-2.safetensors\"},\"metadata\":{}}";
	static const char *const others[] = {
		"{\"weight_map\":{\"a\":\"s-1.safetensors\"}}",
		"{\"weight_map\":{\"b\":\"s-2.safetensors\",\"a\":\"s-1.safetensors\"}}",
		"{\"weight_map\":{\"a\":\"s-1.safetensors\",\"b\":\"s-3.safetensors\"}}",
		"{\"weight_map\":",
	};
	char *ipath;

	add_source(f, "s-1.safetensors", 1000, 22);
	add_source(f, "s-2.safetensors", 1000, 23);
	for (size_t i = 0; i < 4; i++) {
		char *tmp = tu_write(f->src, "new.json", others[i], strlen(others[i]));

		ipath = path_join(f->src, "m.safetensors.index.json");
		assert_int_equal(rename(tmp, ipath), 0);
		free(tmp);
		make_request(f, f->src);
		assert_int_equal(stage_copy(&f->req), -ESTALE);
		assert_non_null(strstr(error_get(), "cannot stage it: the shard index "));
		assert_non_null(strstr(error_get(), ipath));
		assert_non_null(strstr(error_get(), i < 3 ?
			"was replaced since the model was validated (it names other shards "
			"than the 2 opened)" : "changed since the model was validated"));
		assert_int_equal(tu_count_entries(f->stage_dir), -1); /* nothing made */
		free(ipath);
	}
	ipath = tu_write(f->src, "m.safetensors.index.json", same, strlen(same));
	make_request(f, f->src);
	assert_int_equal(stage_copy(&f->req), 0);
	assert_int_equal(tu_count_entries(f->req.dir), 4);
	stage_request_clear(&f->req);
	/* The index gone: the directory holds two shards and no index, or
	 * one shard alone (a model of one file now). */
	assert_int_equal(unlink(ipath), 0);
	make_request(f, f->src);
	assert_int_equal(stage_copy(&f->req), -EINVAL);
	assert_non_null(strstr(error_get(), "cannot stage it: "));
	assert_non_null(strstr(error_get(), "no *.safetensors.index.json"));
	free(ipath);
	ipath = path_join(f->src, "s-2.safetensors");
	assert_int_equal(unlink(ipath), 0);
	make_request(f, f->src);
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "has no shard index since the model was validated"));
	free(ipath);
}

/* The shard index the copy finds again by path must be the file validated
 * (review rev195 L4): another put at its path since (a rename by whoever
 * may write in the directory), naming the same shards, is refused, not
 * staged as the one the owner rules judged; so is an index found where
 * the model was validated with none. Nothing is made. */
static void
test_shard_index_swapped_naming_the_same_shards(void **state)
{
	struct fixture *f = *state;
	static const char same[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\","
				   "\"b\":\"s-2.safetensors\"},\"metadata\":{}}";
	static const char one[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\"}}";
	char *ipath = tu_write(f->src, "m.safetensors.index.json", same, strlen(same));
	char *tmp;

	add_source(f, "s-1.safetensors", 1000, 22);
	add_source(f, "s-2.safetensors", 1000, 23);
	make_request(f, f->src); /* validated with this index */
	tmp = tu_write(f->src, "new.json", same, strlen(same));
	assert_int_equal(rename(tmp, ipath), 0);
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "cannot stage it: the shard index "));
	assert_non_null(strstr(error_get(), ipath));
	assert_non_null(strstr(error_get(), "was replaced since the model was validated (it is "
		"not the file validated)"));
	assert_int_equal(tu_count_entries(f->stage_dir), -1); /* nothing made */
	free(tmp);
	/* A model of one shard validated without an index; one appears. */
	assert_int_equal(unlink(ipath), 0);
	free(ipath);
	ipath = path_join(f->src, "s-2.safetensors");
	assert_int_equal(unlink(ipath), 0);
	file_close(&f->files[1]);
	f->nfiles = 1;
	make_request(f, f->src);
	assert_null(f->req.index_st);
	free(ipath);
	ipath = tu_write(f->src, "m.safetensors.index.json", one, strlen(one));
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	assert_non_null(strstr(error_get(), "has a shard index "));
	assert_non_null(strstr(error_get(), "since the model was validated (it had none)"));
	assert_int_equal(tu_count_entries(f->stage_dir), -1);
	free(ipath);
}

/* The directory's owner puts a FIFO where the shard index was: the copy
 * is refused at once, not held in open() until someone writes to it (the
 * thread, and a stop, would wait for ever). alarm(): the old code's hang
 * fails the test instead of holding ctest. */
static void
test_shard_index_replaced_by_a_fifo(void **state)
{
	struct fixture *f = *state;
	char *ipath = path_join(f->src, "m.safetensors.index.json");

	add_source(f, "s-1.safetensors", 1000, 22);
	add_source(f, "s-2.safetensors", 1000, 23);
	assert_int_equal(mkfifo(ipath, 0600), 0);
	make_request(f, f->src);
	alarm(10);
	assert_int_equal(stage_copy(&f->req), -ESTALE);
	alarm(0);
	assert_non_null(strstr(error_get(), "cannot stage it: the shard index "));
	assert_non_null(strstr(error_get(), ipath));
	assert_non_null(strstr(error_get(), "not a regular file"));
	assert_int_equal(tu_count_entries(f->stage_dir), -1); /* nothing made */
	free(ipath);
}

/* ---- copies no longer wanted ---------------------------------------------- */

/* Cancelled (wcached stopping) before it starts: -ECANCELED, nothing
 * made, not even stage_dir. */
static void
test_cancel(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 1000, 15);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	f->cancel = 1;
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
	assert_non_null(strstr(error_get(), "wcached is stopping"));
	assert_int_equal(tu_count_entries(f->stage_dir), -1);
	assert_int_equal(copy_calls, 0);
	free(model);
}

/* A staging no longer wanted (a newer load of its model, an unload):
 * stage_cancel() while the copy runs stops it at the next request, with
 * nothing left; before it starts, nothing is made, and nothing of the
 * source looked at: on a server that hangs, the stat of the model's path
 * would hold one of its filesystem's places on the work queue for a copy
 * nobody wants (here that stat fails, EIO, if it is made: before, the
 * staging failed so instead of ending cancelled). Cancelled in a slow
 * request whose source was replaced meanwhile, it says cancelled: the
 * newer load is why it stops, not a failure. */
static int
cancel_during_copy(unsigned call)
{
	if (call == 1)
		stage_cancel(&fx->req);
	return 0;
}

static int
replace_and_cancel_in_a_slow_request(unsigned call)
{
	if (call == 0) {
		replace_during_copy(call);
		stage_cancel(&fx->req);
		slow_request();
	}
	return 0;
}

static void
test_stage_cancel(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 40 * MiB, 20);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = cancel_during_copy;
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
	assert_non_null(strstr(error_get(), "no longer wanted"));
	assert_int_equal(copy_calls, 2); /* of 5 */
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	assert_null(f->req.dir);

	make_request(f, model);
	stage_cancel(&f->req);
	copy_calls = 0;
	stat_fail_path = model;
	stat_errno = EIO;
	stat_failures = 1;
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
	assert_int_equal(stat_failures, 1); /* no stat of the path */
	stat_fail_path = NULL;
	assert_int_equal(copy_calls, 0);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);

	make_request(f, model);
	copy_calls = 0;
	copy_hook = replace_and_cancel_in_a_slow_request;
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
	assert_non_null(strstr(error_get(), "no longer wanted"));
	assert_int_equal(copy_calls, 1);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/*
 * A sharded model (a shard index, three shards), its sources in f->src,
 * staged as m: the index is copied last, so a copy cut short holds
 * shards only.
 */
static char *
sharded_source(struct fixture *f)
{
	static const char index[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\","
				    "\"b\":\"s-2.safetensors\",\"c\":\"s-3.safetensors\"}}";
	char *ipath = tu_write(f->src, "m.safetensors.index.json", index, strlen(index));

	add_source(f, "s-1.safetensors", 1000, 31);
	add_source(f, "s-2.safetensors", 1000, 32);
	add_source(f, "s-3.safetensors", 1000, 33);
	make_request(f, f->src);
	return ipath;
}

/*
 * stage_dir's one entry, the staging's unfinished copy, named with this
 * process's token (malloc'd); it holds its marker.
 */
static char *
unfinished_copy(const struct fixture *f)
{
	char prefix[64], *copy = NULL, *marker;
	struct dirent *e;
	struct stat st;
	DIR *d = opendir(f->stage_dir);

	assert_non_null(d);
	snprintf(prefix, sizeof(prefix), ".m.tmp-%s-", stage_token());
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			copy = path_join(f->stage_dir, e->d_name);
	closedir(d);
	assert_non_null(copy);
	assert_int_equal(tu_count_entries(f->stage_dir), 1);
	marker = path_join(copy, STAGE_MARKER);
	assert_int_equal(lstat(marker, &st), 0);
	free(marker);
	return copy;
}

/*
 * The next start's sweep removes copy, as its process sees it: another
 * process's temporary (its token is not this one's; test_stage_remove
 * shows the sweep removes those, and leaves its own process's, as this
 * process's sweep does here).
 */
static void
next_start_removes(const struct fixture *f, char *copy)
{
	char *other;
	unsigned removed = 1;

	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 0); /* this process's: a staging may write it */
	other = path_join(f->stage_dir, ".m.tmp-0123456789abcdef-AbCdEf");
	assert_non_null(other);
	assert_int_equal(rename(copy, other), 0);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(other);
	free(copy);
}

/* wcached stops during the second shard's request. */
static int
stop_during_copy(unsigned call)
{
	if (call == 1)
		fx->cancel = 1;
	return 0;
}

/*
 * wcached stops while a sharded model is staged: the copy stops (as
 * test_cancel's), and so does the removal of its unfinished copy, before
 * its first file (a stop must not wait for the unlink of every shard
 * copied: libuv's loop ends only once its work queue has, and 163 shards
 * on a slow disk take seconds). The copy keeps its marker and what was
 * copied; the next start's sweep removes it. The staging still says it
 * was cancelled as wcached stops. Before, the copy was removed whole.
 */
static void
test_a_stop_leaves_the_unfinished_copy_to_the_next_start(void **state)
{
	struct fixture *f = *state;
	char *ipath = sharded_source(f), *copy;

	copy_hook = stop_during_copy;
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
	assert_non_null(strstr(error_get(), "cancelled: wcached is stopping"));
	assert_int_equal(copy_calls, 2);
	assert_null(f->req.dir);
	copy = unfinished_copy(f);
	/* The marker, the two shards copied and the third, made but not
	 * copied: the stop comes before its first request. */
	assert_int_equal(tu_count_entries(copy), 4);
	assert_same_file(copy, "s-1.safetensors", &f->files[0]);
	assert_same_file(copy, "s-2.safetensors", &f->files[1]);
	next_start_removes(f, copy);
	free(ipath);
}

/* wcached stops as the first file of a copy is unlinked. */
static int
stop_at_the_first_unlink(const char *name)
{
	if (strcmp(name, STAGE_MARKER) != 0) {
		fx->cancel = 1;
		unlink_hook = NULL;
	}
	return 0;
}

/*
 * A staging its model no longer wants (an unload, a newer load) while
 * wcached runs on: its unfinished copy is removed whole (test_stage_cancel
 * shows it), but a stop that comes during that removal ends it at the
 * next file, as it ends the removal of any copy: the copy keeps its
 * marker and the files not reached, and the next start's sweep removes
 * it. Before, the stop waited for every unlink.
 */
static void
test_a_stop_ends_the_removal_of_a_cancelled_copy(void **state)
{
	struct fixture *f = *state;
	char *ipath = sharded_source(f), *copy;

	copy_hook = cancel_during_copy; /* in the second shard's request */
	unlink_hook = stop_at_the_first_unlink;
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
	assert_non_null(strstr(error_get(), "no longer wanted"));
	assert_int_equal(copy_calls, 2);
	assert_null(unlink_hook); /* the removal began */
	copy = unfinished_copy(f);
	/* The marker and three shards (the third made, not copied: the
	 * cancel comes before its first request), but the first file the
	 * removal unlinked. */
	assert_int_equal(tu_count_entries(copy), 3);
	next_start_removes(f, copy);
	free(ipath);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_changed_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mtime_changed_during_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_replaced_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replaced_early_in_a_long_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_shard_removed_early_in_a_long_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_flaky_stat_during_a_long_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_directory_unstatable_after_the_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_failing_stat_is_not_a_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_a_path_the_walk_refuses_during_a_long_copy,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_directory_the_walk_refuses_before_the_copy,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncated_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_stop_leaves_the_unfinished_copy_to_the_next_start, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_stop_ends_the_removal_of_a_cancelled_copy,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_shard_index_replaced_after_validation, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_shard_index_swapped_naming_the_same_shards,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_shard_index_replaced_by_a_fifo, setup,
			teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
