/*
 * test_stage.c: unit tests of the stage module (daemon/stage.c and
 * daemon/stage_remove.c), staging a model's files to a local directory and
 * removing and sweeping the copies, on real files in a temporary directory.
 *
 * Fault injection with the linker's --wrap: copy_file_range, sendfile and
 * statvfs forward to the real calls unless a test sets a hook, which can
 * fail them (EIO, ESTALE, EXDEV, ENOSPC), change the source mid-copy, or
 * look at the staging directory while the copy is under way.
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
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "stage.h"
#include "testutil.h"

#define MiB (1024u * 1024u)

/* ---- fault injection ---------------------------------------------------- */

ssize_t __real_copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t len,
	unsigned flags);
ssize_t __wrap_copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t len,
	unsigned flags);
ssize_t __real_sendfile(int out, int in, off_t *off, size_t count);
ssize_t __wrap_sendfile(int out, int in, off_t *off, size_t count);
int __real_statvfs(const char *path, struct statvfs *buf);
int __wrap_statvfs(const char *path, struct statvfs *buf);
int __real_stat(const char *path, struct stat *buf);
int __wrap_stat(const char *path, struct stat *buf);

static int (*copy_hook)(unsigned call); /* returns an errno to fail with, or 0 */
static unsigned copy_calls, sendfile_calls;
static int sendfile_errno;              /* nonzero: sendfile fails with it */
static uint64_t statvfs_free;           /* nonzero: the free bytes statvfs reports */
static const char *stat_fail_path;      /* stat() of this path fails with stat_errno */
static int stat_errno;
static int stat_failures;               /* ... this many times (-1: every time) */

ssize_t
__wrap_copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t len,
	unsigned flags)
{
	unsigned call = copy_calls++;

	if (copy_hook != NULL) {
		int e = copy_hook(call);

		if (e != 0) {
			errno = e;
			return -1;
		}
	}
	return __real_copy_file_range(in, in_off, out, out_off, len, flags);
}

ssize_t
__wrap_sendfile(int out, int in, off_t *off, size_t count)
{
	sendfile_calls++;
	if (sendfile_errno != 0) {
		errno = sendfile_errno;
		return -1;
	}
	return __real_sendfile(out, in, off, count);
}

int
__wrap_statvfs(const char *path, struct statvfs *buf)
{
	int r = __real_statvfs(path, buf);

	if (r == 0 && statvfs_free != 0) {
		buf->f_frsize = 4096;
		buf->f_bavail = statvfs_free / 4096;
	}
	return r;
}

int
__wrap_stat(const char *path, struct stat *buf)
{
	if (stat_fail_path != NULL && stat_failures != 0 && strcmp(path, stat_fail_path) == 0) {
		if (stat_failures > 0)
			stat_failures--;
		errno = stat_errno;
		return -1;
	}
	return __real_stat(path, buf);
}

/* ---- fixture ------------------------------------------------------------- */

struct fixture {
	char *tmp;          /* the test's directory */
	char *src;          /* tmp/src: the model's directory */
	char *stage_dir;    /* tmp/staged */
	struct wc_file files[3];
	size_t nfiles;
	struct stage_request req;
	int cancel;
};

static struct fixture *fx; /* for the hooks */

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	f->tmp = tu_tmpdir();
	f->src = path_join(f->tmp, "src");
	f->stage_dir = path_join(f->tmp, "staged");
	assert_int_equal(mkdir(f->src, 0700), 0);
	copy_hook = NULL;
	copy_calls = sendfile_calls = 0;
	sendfile_errno = 0;
	statvfs_free = 0;
	stat_fail_path = NULL;
	stat_errno = stat_failures = 0;
	fx = f;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	for (size_t i = 0; i < f->nfiles; i++)
		file_close(&f->files[i]);
	stage_request_clear(&f->req);
	free(f->src);
	free(f->stage_dir);
	tu_rmtree(f->tmp);
	free(f);
	return 0;
}

/* A file of len pseudo-random bytes (seeded) at f->src/name, opened as the
 * next source file. */
static void
add_source(struct fixture *f, const char *name, size_t len, unsigned seed)
{
	uint8_t *buf = malloc(len ? len : 1);
	char *path;

	assert_non_null(buf);
	for (size_t i = 0; i < len; i++) {
		seed = seed * 1103515245u + 12345u;
		buf[i] = (uint8_t)(seed >> 16);
	}
	path = tu_write(f->src, name, buf, len);
	free(buf);
	assert_int_equal(file_open(path, &f->files[f->nfiles]), 0);
	f->nfiles++;
	free(path);
}

/* Fills f->req for the model "m", generation 3, at model_path. */
static void
make_request(struct fixture *f, const char *model_path)
{
	f->req = (struct stage_request){
		.stage_dir = f->stage_dir, .model = "m", .number = 3, .model_path = model_path,
		.files = f->files, .nfiles = f->nfiles, .cancel = &f->cancel,
	};
}

/* dir/name has exactly the bytes and mtime of src. */
static void
assert_same_file(const char *dir, const char *name, const struct wc_file *src)
{
	char *path = path_join(dir, name);
	struct wc_file c;

	assert_int_equal(file_open(path, &c), 0);
	assert_int_equal(c.size, src->size);
	if (c.size > 0)
		assert_memory_equal(c.base, src->base, c.size);
	assert_int_equal(c.st.st_mtim.tv_sec, src->st.st_mtim.tv_sec);
	assert_int_equal(c.st.st_mtim.tv_nsec, src->st.st_mtim.tv_nsec);
	assert_int_equal(c.st.st_mode & 07777, 0400);
	file_close(&c);
	free(path);
}

/* dir holds STAGE_MARKER: a regular file of ours, read-only. */
static void
assert_marked(const char *dir)
{
	char *marker = path_join(dir, STAGE_MARKER);
	struct stat st;

	assert_int_equal(lstat(marker, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_uid, geteuid());
	assert_int_equal(st.st_mode & 07777, 0400);
	free(marker);
}

/* The name of stage_dir's one entry starting with prefix, or NULL. */
static char *
entry_starting(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char *found = NULL;

	if (d == NULL)
		return NULL;
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			found = strdup(e->d_name);
	closedir(d);
	return found;
}

/* ---- copying ------------------------------------------------------------- */

/* A single file of several chunks: copied byte for byte with its mtime,
 * read-only, under stage_dir/m.3, with the model path inside it; the
 * figures add up. */
static void
test_copy_single(void **state)
{
	struct fixture *f = *state;
	char *model, *want;

	add_source(f, "model.safetensors", 20 * MiB + 123, 1);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	assert_int_equal(stage_copy(&f->req), 0);
	want = path_join(f->stage_dir, "m.3");
	assert_string_equal(f->req.dir, want);
	free(want);
	want = path_join(f->req.dir, "model.safetensors");
	assert_string_equal(f->req.path, want);
	free(want);
	assert_same_file(f->req.dir, "model.safetensors", &f->files[0]);
	assert_int_equal(f->req.bytes, 20 * MiB + 123);
	assert_true(f->req.disk_bytes >= 20 * MiB);
	assert_true(f->req.seconds >= 0);
	assert_true(copy_calls >= 3); /* 8 MiB requests */
	assert_int_equal(tu_count_entries(f->stage_dir), 1);
	assert_marked(f->req.dir);
	assert_int_equal(tu_count_entries(f->req.dir), 2); /* the file and the marker */
	free(model);
}

/* A directory model with a shard index: the index and every shard are
 * copied, and the model's path in the copy is the directory. A second
 * staging of the same number gets another name. */
static void
test_copy_sharded_directory(void **state)
{
	struct fixture *f = *state;
	static const char index[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\","
				    "\"b\":\"s-2.safetensors\"}}";
	char *ipath = tu_write(f->src, "m.safetensors.index.json", index, strlen(index));
	struct wc_file ic;
	char *first;

	add_source(f, "s-1.safetensors", 3 * MiB, 2);
	add_source(f, "s-2.safetensors", 1000, 3);
	make_request(f, f->src);
	assert_int_equal(stage_copy(&f->req), 0);
	assert_string_equal(f->req.path, f->req.dir);
	assert_int_equal(tu_count_entries(f->req.dir), 4); /* and the marker */
	assert_same_file(f->req.dir, "s-1.safetensors", &f->files[0]);
	assert_same_file(f->req.dir, "s-2.safetensors", &f->files[1]);
	assert_int_equal(file_open(ipath, &ic), 0);
	assert_same_file(f->req.dir, "m.safetensors.index.json", &ic);
	file_close(&ic);
	assert_int_equal(f->req.bytes, 3 * MiB + 1000 + strlen(index));

	first = strdup(f->req.dir);
	stage_request_clear(&f->req);
	make_request(f, f->src);
	assert_int_equal(stage_copy(&f->req), 0);
	assert_string_not_equal(f->req.dir, first);
	assert_non_null(strstr(f->req.dir, "m.3-2"));
	assert_int_equal(tu_count_entries(f->stage_dir), 2);
	free(first);
	free(ipath);
}

/* A shard index named as the model's path is copied too. */
static void
test_copy_shard_index_path(void **state)
{
	struct fixture *f = *state;
	static const char index[] = "{\"weight_map\":{\"a\":\"s.safetensors\"}}";
	char *ipath = tu_write(f->src, "x.safetensors.index.json", index, strlen(index));
	char *want;

	add_source(f, "s.safetensors", 5000, 4);
	make_request(f, ipath);
	assert_int_equal(stage_copy(&f->req), 0);
	want = path_join(f->req.dir, "x.safetensors.index.json");
	assert_string_equal(f->req.path, want);
	assert_int_equal(tu_count_entries(f->req.dir), 3); /* and the marker */
	free(want);
	free(ipath);
}

/* While the copy runs, only a temporary name exists in stage_dir, and it
 * holds the marker before the first byte is copied. */
static int seen_final, seen_tmp, seen_marker;

static int
look_during_copy(unsigned call)
{
	char *final = path_join(fx->stage_dir, "m.3");
	char *tmp = entry_starting(fx->stage_dir, ".m.tmp-");
	struct stat st;

	if (call == 0) {
		seen_final = stat(final, &st) == 0;
		seen_tmp = tmp != NULL;
		if (tmp != NULL) {
			char *dir = path_join(fx->stage_dir, tmp);
			char *marker = path_join(dir, STAGE_MARKER);

			seen_marker = lstat(marker, &st) == 0 && S_ISREG(st.st_mode);
			free(marker);
			free(dir);
		}
	}
	free(final);
	free(tmp);
	return 0;
}

static void
test_temporary_name_until_complete(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "w.weig", 9 * MiB, 5);
	model = path_join(f->src, "w.weig");
	make_request(f, model);
	copy_hook = look_during_copy;
	assert_int_equal(stage_copy(&f->req), 0);
	assert_false(seen_final);
	assert_true(seen_tmp);
	assert_true(seen_marker);
	assert_int_equal(tu_count_entries(f->stage_dir), 1); /* the temporary is gone */
	free(model);
}

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
	struct timespec t = { .tv_sec = 1, .tv_nsec = 100 * 1000 * 1000 };

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

static int
flaky_stat_in_a_slow_request(unsigned call)
{
	if (call == 0) {
		stat_fail_path = flaky_path;
		stat_errno = EIO;
		stat_failures = 1;
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
	copy_hook = flaky_stat_in_a_slow_request;
	assert_int_equal(stage_copy(&f->req), 0);
	assert_int_equal(stat_failures, 0); /* the periodic check did ask */
	assert_same_file(f->req.dir, "model.safetensors", &f->files[0]);
	free(flaky_path);
	flaky_path = NULL;
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

/* ---- errors --------------------------------------------------------------- */

static int fail_errno;

static int
fail_second(unsigned call)
{
	return call == 1 ? fail_errno : 0;
}

/* A copy request failing: EIO and ESTALE reading the source, named as
 * such; the disk filling up during the copy (the check passed, someone
 * else wrote meanwhile); EFBIG (a filesystem without fallocate reserves
 * nothing first), said as a file too large, not as no space. Nothing is
 * left. */
static void
test_copy_errors(void **state)
{
	struct fixture *f = *state;
	static const struct {
		int err;
		const char *says, *also;
	} cases[] = {
		{ EIO, "EIO", "reading" },
		{ ESTALE, "ESTALE", "reading" },
		{ ENOSPC, "no space left", "while copying" },
		{ EFBIG, "model.safetensors is too large for ", "(file size limit or" },
	};
	char *model;

	add_source(f, "model.safetensors", 12 * MiB, 10);
	model = path_join(f->src, "model.safetensors");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		make_request(f, model);
		fail_errno = cases[i].err;
		copy_calls = 0;
		copy_hook = fail_second;
		assert_int_equal(stage_copy(&f->req), -cases[i].err);
		assert_non_null(strstr(error_get(), cases[i].says));
		assert_non_null(strstr(error_get(), cases[i].also));
		assert_non_null(strstr(error_get(), model));
		assert_true(cases[i].err == ENOSPC || strstr(error_get(), "no space") == NULL);
		assert_int_equal(tu_count_entries(f->stage_dir), 0);
	}
	free(model);
}

/* Not enough free space: refused before anything is written, saying how
 * much is needed and how much is free. */
static void
test_no_space(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 2 * MiB, 11);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	statvfs_free = 50 * MiB;
	assert_int_equal(stage_copy(&f->req), -ENOSPC);
	assert_non_null(strstr(error_get(), "not enough space"));
	assert_non_null(strstr(error_get(), "66 MiB needed"));
	assert_non_null(strstr(error_get(), "50 MiB free"));
	assert_int_equal(copy_calls, 0);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* A file past the process's file size limit (RLIMIT_FSIZE: LimitFSIZE=,
 * ulimit -f), with SIGXFSZ ignored as wcached ignores it: EFBIG, said as
 * such (it read "no space left ... (N GiB left)"), nothing left. */
static void
test_file_size_limit(void **state)
{
	struct fixture *f = *state;
	struct rlimit was, lim;
	void (*sig)(int) = signal(SIGXFSZ, SIG_IGN);
	char *model, want[512];
	int r;

	add_source(f, "model.safetensors", 3 * MiB, 16);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
	lim = was;
	lim.rlim_cur = 1 * MiB;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	r = stage_copy(&f->req);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
	signal(SIGXFSZ, sig);
	assert_int_equal(r, -EFBIG);
	snprintf(want, sizeof(want), "cannot stage it: %s is too large for %s (file size limit or "
		"the filesystem's maximum)", model, f->stage_dir);
	assert_string_equal(error_get(), want);
	assert_int_equal(tu_count_entries(f->stage_dir), 0);
	free(model);
}

/* The copy's mtime cannot be set (utimensat refused by a seccomp filter,
 * in a child): the line says what failed, in the words of every other
 * staging failure, and nothing is left. */
static void
test_mtime_not_set(void **state)
{
	struct fixture *f = *state;
	char *model;
	pid_t pid;
	int status;

	add_source(f, "model.safetensors", 1000, 18);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	if ((pid = fork()) == 0) {
		struct sock_filter code[] = {
			BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
			BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_utimensat, 0, 1),
			BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
			BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		};
		struct sock_fprog prog = { .len = 4, .filter = code };
		int r;

		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
			prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
			_exit(2);
		r = stage_copy(&f->req);
		if (r != -EPERM || strstr(error_get(), "cannot stage it: setting the mtime of the "
					   "copy of ") == NULL || strstr(error_get(), model) == NULL) {
			fprintf(stderr, "stage_copy: %d: %s\n", r, error_get());
			_exit(1);
		}
		_exit(tu_count_entries(f->stage_dir) == 0 ? 0 : 3);
	}
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	free(model);
}

/* Names past NAME_MAX or paths past PATH_MAX: refused before anything is
 * made, naming the model (not "<stage_dir>: name too long"). */
static void
test_names_too_long(void **state)
{
	struct fixture *f = *state;
	char name[240], *model, *dir;
	size_t len;

	add_source(f, "model.safetensors", 1000, 19);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	f->req.model = name;
	assert_int_equal(stage_copy(&f->req), -ENAMETOOLONG);
	assert_non_null(strstr(error_get(), "cannot stage it: the model name \"nnnn"));
	assert_non_null(strstr(error_get(), "(239 bytes) is too long to name its copy in"));
	assert_int_equal(tu_count_entries(f->stage_dir), -1);

	/* A stage_dir whose length leaves no room for the copy's paths. */
	len = strlen(f->stage_dir);
	dir = malloc(PATH_MAX);
	assert_non_null(dir);
	memcpy(dir, f->stage_dir, len);
	for (size_t i = len; i < PATH_MAX - 40; i += 100)
		memcpy(dir + i, "/dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
			"ddddddddddddddddddddddddddd", i + 100 < PATH_MAX - 40 ? 100 : PATH_MAX - 40 - i);
	dir[PATH_MAX - 40] = '\0';
	make_request(f, model);
	f->req.stage_dir = dir;
	assert_int_equal(stage_copy(&f->req), -ENAMETOOLONG);
	assert_non_null(strstr(error_get(), "cannot stage it: the paths of its copy would be "
					 "longer than 4095 bytes (model name \"m\" 1 bytes, the longest "
					 "file name 17, stage_dir 4056): configure a shorter stage_dir than"));
	assert_int_equal(tu_count_entries(f->stage_dir), -1);
	free(dir);
	free(model);
}

/* stage_dir that cannot be created (its parent is a file). */
static void
test_stage_dir_not_writable(void **state)
{
	struct fixture *f = *state;
	char *blocker = tu_write(f->tmp, "file", "x", 1);
	char *bad = path_join(blocker, "staged");
	char *model;

	add_source(f, "model.safetensors", 1000, 13);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	f->req.stage_dir = bad;
	assert_int_equal(stage_copy(&f->req), -ENOTDIR);
	assert_non_null(strstr(error_get(), "stage_dir"));
	assert_non_null(strstr(error_get(), "cannot be created"));
	assert_int_equal(stage_prepare_dir(bad, (uid_t)-1, (gid_t)-1), -ENOTDIR);
	free(model);
	free(bad);
	free(blocker);
}

/* The kernel refusing copy_file_range (across filesystems) and then
 * sendfile: the copy falls back and is still exact. */
static int
exdev(unsigned call)
{
	(void)call;
	return EXDEV;
}

static void
test_fallbacks(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 9 * MiB + 7, 14);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	copy_hook = exdev;
	assert_int_equal(stage_copy(&f->req), 0);
	assert_true(sendfile_calls >= 2);
	assert_same_file(f->req.dir, "model.safetensors", &f->files[0]);
	assert_int_equal(stage_remove(f->req.dir), 0);
	stage_request_clear(&f->req);

	make_request(f, model);
	sendfile_errno = EINVAL;
	assert_int_equal(stage_copy(&f->req), 0);
	assert_same_file(f->req.dir, "model.safetensors", &f->files[0]);
	free(model);
}

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
 * nothing left; before it starts, nothing is made. Cancelled in a slow
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
	assert_int_equal(stage_copy(&f->req), -ECANCELED);
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
		assert_non_null(strstr(error_get(), i < 3 ? "was replaced since the model was "
							    "validated (it names other shards than "
							    "the 2 opened)" :
							    "changed since the model was validated"));
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
 * process's own temporaries, and names it did not make. */
static void
test_remove_and_sweep(void **state)
{
	struct fixture *f = *state;
	static const char *const leftovers[] = { "a.1", "a.2-3", ".b.tmp-1-abcdef", "kept.7" };
	static const char *const others[] = { "notes", "a.x", ".hidden" };
	char own[64], *keep[1], *plain;
	unsigned removed = 9;

	assert_int_equal(stage_prepare_dir(f->stage_dir, (uid_t)-1, (gid_t)-1), 0);
	for (size_t i = 0; i < 4; i++)
		make_copy_in(f->stage_dir, leftovers[i], 1);
	for (size_t i = 0; i < 3; i++) {
		char *d = path_join(f->stage_dir, others[i]);

		assert_int_equal(mkdir(d, 0700), 0);
		free(d);
	}
	snprintf(own, sizeof(own), ".c.tmp-%ld-xyz", (long)getpid());
	make_copy_in(f->stage_dir, own, 1);
	plain = tu_write(f->stage_dir, "b.5", "file, not a directory", 21);

	keep[0] = path_join(f->stage_dir, "kept.7");
	assert_int_equal(stage_sweep(f->stage_dir, keep, 1, &removed), 0);
	assert_int_equal(removed, 3);
	assert_int_equal(tu_count_entries(f->stage_dir), 6); /* kept.7, 3 others, own, b.5 */
	assert_int_equal(tu_count_entries(keep[0]), 2);
	assert_int_equal(entries_in(f->stage_dir, own), 2);
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

	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), 0);
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
		assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), -EPERM);
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
		assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), -EPERM);
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
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), 0);
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
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), -EBUSY);
	assert_non_null(strstr(error_get(), "in use by another running wcached"));
	assert_int_equal(removed, 0);
	assert_int_equal(entries_in(f->stage_dir, "m.1"), 2);
	close(other);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), 0);
	assert_int_equal(removed, 1);
	/* Ours now: a second sweep of it by this process goes on. */
	make_copy_in(f->stage_dir, "m.2", 1);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, &removed), 0);
	assert_int_equal(removed, 1);
}

static void
test_dir_of(void **state)
{
	char *d = NULL;

	(void)state;
	assert_int_equal(stage_dir_of("/var/cache/s", "/var/cache/s/x.3/m.safetensors", &d), 1);
	assert_string_equal(d, "/var/cache/s/x.3");
	free(d);
	assert_int_equal(stage_dir_of("/var/cache/s/", "/var/cache/s/x.3/m", &d), 1);
	assert_string_equal(d, "/var/cache/s/x.3");
	free(d);
	assert_int_equal(stage_dir_of("/var/cache/s", "/var/cache/sx/x.3/m", &d), 0);
	assert_int_equal(stage_dir_of("/var/cache/s", "/var/cache/s/m", &d), 0);
	assert_int_equal(stage_dir_of("/var/cache/s", "/models/m", &d), 0);
	assert_int_equal(stage_space_needed(100ull << 30), (101ull << 30) + (64ull << 20));
	assert_int_equal(stage_space_needed(UINT64_MAX), UINT64_MAX);
	assert_string_equal(stage_errno_name(-ESTALE), "ESTALE");
	assert_null(stage_errno_name(EAGAIN));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_copy_single, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_sharded_directory, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_shard_index_path, setup, teardown),
		cmocka_unit_test_setup_teardown(test_temporary_name_until_complete, setup, teardown),
		cmocka_unit_test_setup_teardown(test_changed_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mtime_changed_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replaced_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replaced_early_in_a_long_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_shard_removed_early_in_a_long_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_flaky_stat_during_a_long_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failing_stat_is_not_a_removal, setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncated_during_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_space, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_size_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mtime_not_set, setup, teardown),
		cmocka_unit_test_setup_teardown(test_names_too_long, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_dir_not_writable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fallbacks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_shard_index_replaced_after_validation, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_remove_and_sweep, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep_leaves_what_it_did_not_make, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_unsafe_stage_dir_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep_of_a_stage_dir_in_use, setup, teardown),
		cmocka_unit_test(test_dir_of),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
