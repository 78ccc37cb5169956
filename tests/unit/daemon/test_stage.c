/*
 * test_stage.c: unit tests of daemon/stage.c, staging a model's files to a
 * local directory: copies that are exact (a single file, a sharded
 * directory, a shard index named as the model's path) and made under a
 * temporary name until complete; copies that fail (EIO, ESTALE, ENOSPC,
 * EFBIG, no free space, the file size limit, an mtime that cannot be set,
 * names too long, a stage_dir that cannot be made) with nothing left; the
 * fallbacks when the kernel refuses copy_file_range or sendfile; and the
 * small helpers (stage_dir_of, stage_space_needed, stage_errno_name). On
 * real files in a temporary directory (stage_fixture.h).
 *
 * Sources that change during the copy and copies cancelled are
 * test_stage_changed.c's; removing and sweeping the copies is
 * test_stage_remove.c's.
 *
 * Fault injection with the linker's --wrap (stage_fault.c): copy_file_range,
 * sendfile and statvfs forward to the real calls unless a test sets a hook,
 * which can fail them, or look at the staging directory while the copy is
 * under way.
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
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "stage.h"
#include "stage_fixture.h"
#include "stage_internal.h"
#include "testutil.h"

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
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
			free(found); /* the last one found, as before, but no leak */
			found = strdup(e->d_name);
		}
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
 * holds the marker before the first byte is copied. The name carries this
 * process's token (stage_token), not its pid, which a later process may
 * have too. */
static int seen_final, seen_tmp, seen_marker, seen_token;

static int
look_during_copy(unsigned call)
{
	char *final = path_join(fx->stage_dir, "m.3");
	char *tmp = entry_starting(fx->stage_dir, ".m.tmp-");
	struct stat st;

	if (call == 0) {
		seen_final = stat(final, &st) == 0;
		seen_tmp = tmp != NULL;
		seen_token = tmp != NULL && strncmp(tmp + strlen(".m.tmp-"), stage_token(),
			strlen(stage_token())) == 0 && tmp[strlen(".m.tmp-") + 16] == '-';
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
	assert_true(seen_token);
	assert_int_equal(tu_count_entries(f->stage_dir), 1); /* the temporary is gone */
	free(model);
}

/* ---- errors --------------------------------------------------------------- */

static int fail_errno;

static int
fail_second(unsigned call)
{
	return call == 1 ? fail_errno : 0;
}

/* A copy request failing: EIO and ESTALE copying the source, named as
 * such (a local source's: not blamed on another host, as on a network
 * filesystem; test_stage.py has that); the disk filling up during the
 * copy (the check passed, someone else wrote meanwhile), with the space
 * the model needs; EFBIG (a
 * filesystem without fallocate reserves nothing first), said as a file
 * too large, not as no space. Nothing is left. */
static void
test_copy_errors(void **state)
{
	struct fixture *f = *state;
	static const struct {
		int err;
		const char *says, *also;
	} cases[] = {
		{ EIO, "EIO", "copying" },
		{ ESTALE, "ESTALE", "copying" },
		{ ENOSPC, "no space left while copying", "(76 MiB needed in all, " },
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
		assert_null(strstr(error_get(), "another host"));
		assert_int_equal(tu_count_entries(f->stage_dir), 0);
	}
	free(model);
}

/* The first file of an unfinished copy cannot be unlinked (EACCES). */
static int
refuse_the_first_unlink(const char *name)
{
	if (strcmp(name, STAGE_MARKER) == 0)
		return 0;
	unlink_hook = NULL;
	return EACCES;
}

/*
 * A copy that fails (EIO reading the source) and whose unfinished copy
 * then cannot be removed: the staging still says why it failed, naming
 * the read error (the removal's failure is logged apart). Before, the
 * removal's message ("removing ...: Permission denied") took the place of
 * the read error's, so the load was said to fail for the wrong reason.
 */
static void
test_a_failed_removal_keeps_the_copy_error(void **state)
{
	struct fixture *f = *state;
	char *model;

	add_source(f, "model.safetensors", 12 * MiB, 10);
	model = path_join(f->src, "model.safetensors");
	make_request(f, model);
	fail_errno = EIO;
	copy_hook = fail_second;
	unlink_hook = refuse_the_first_unlink;
	assert_int_equal(stage_copy(&f->req), -EIO);
	assert_null(unlink_hook); /* the removal was tried, and failed */
	assert_non_null(strstr(error_get(), "EIO"));
	assert_non_null(strstr(error_get(), "copying"));
	assert_non_null(strstr(error_get(), model));
	assert_null(strstr(error_get(), "Permission denied"));
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
		if (r != -EPERM ||
			strstr(error_get(), "cannot stage it: setting the mtime of the copy of ") ==
				NULL ||
			strstr(error_get(), model) == NULL) {
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
		memcpy(dir + i, "/ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
			"dddddddddddddddddddddddddddddddddd",
			i + 100 < PATH_MAX - 40 ? 100 : PATH_MAX - 40 - i);
	dir[PATH_MAX - 40] = '\0';
	make_request(f, model);
	f->req.stage_dir = dir;
	assert_int_equal(stage_copy(&f->req), -ENAMETOOLONG);
	assert_non_null(strstr(error_get(), "cannot stage it: the paths of its copy would be "
		"longer than 4095 bytes (model name \"m\" 1 bytes, the longest file name 17, "
		"stage_dir 4056): configure a shorter stage_dir than"));
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

/* stage_dir_check_local: a local stage_dir passes, a missing one by the
 * directory it would be made in, and one the judged walk refuses (a
 * procfs magic link on the way: EXDEV) is refused with one line naming
 * it. (On a FUSE mount: test_stage.py's
 * test_a_stage_dir_on_a_fuse_filesystem_is_refused_at_start_and_by_check.) */
static void
test_stage_dir_local(void **state)
{
	struct fixture *f = *state;
	char *missing = path_join(f->tmp, "not/yet/staged");

	char *link = path_join(f->tmp, "link"), *loop = path_join(f->tmp, "loop");
	char *through = path_join(f->tmp, "link/../link/staged");

	assert_int_equal(stage_dir_check_local(f->tmp), 0);
	assert_int_equal(stage_dir_check_local(missing), 0);
	/* Walked by hand: links (to a missing directory too), "..", a loop
	 * (ELOOP: stage_prepare_dir says why). */
	assert_int_equal(symlink("not/yet", link), 0);
	assert_int_equal(stage_dir_check_local(link), 0);
	assert_int_equal(stage_dir_check_local(through), 0);
	assert_int_equal(symlink("loop", loop), 0);
	assert_int_equal(stage_dir_check_local(loop), 0);
	assert_int_equal(stage_dir_check_local("/proc/self/cwd/staged"), -EXDEV);
	assert_non_null(strstr(error_get(), "stage_dir /proc/self/cwd/staged: /proc/self is a "
		"link on /proc"));
	assert_non_null(strstr(error_get(), "models that must be staged are refused; no staged "
		"copies are restored or swept there"));
	unlink(link);
	unlink(loop);
	free(through);
	free(loop);
	free(link);
	free(missing);
}

/* stage_dir_check_local past a missing name (review rev222 L1): on by
 * name, as stage_prepare_dir makes it, ".." back up to a name that
 * exists, which is judged (here a link into /proc: refused). Before, the
 * walk ended at the missing name and passed every one of these. */
static void
test_stage_dir_local_past_missing(void **state)
{
	struct fixture *f = *state;
	char *procl = path_join(f->tmp, "procl");
	char *one = path_join(f->tmp, "new/../procl/staged");
	char *two = path_join(f->tmp, "new/./er//../../procl/staged");
	char *up = path_join(f->tmp, "new/er/../../procl");
	char *local = path_join(f->tmp, "new/../not/yet/../staged");
	char *stays = path_join(f->tmp, "new/er/../procl/staged");

	assert_int_equal(symlink("/proc/self/cwd", procl), 0);
	assert_int_equal(stage_dir_check_local(one), -EXDEV);
	assert_non_null(strstr(error_get(), "/proc/self is a link on /proc"));
	assert_non_null(strstr(error_get(), one));
	assert_int_equal(stage_dir_check_local(two), -EXDEV);
	assert_int_equal(stage_dir_check_local(up), -EXDEV);
	/* Missing names that stay below the one made, or lead to local ones. */
	assert_int_equal(stage_dir_check_local(local), 0);
	assert_int_equal(stage_dir_check_local(stays), 0);
	unlink(procl);
	free(stays);
	free(local);
	free(up);
	free(two);
	free(one);
	free(procl);
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
		cmocka_unit_test_setup_teardown(test_temporary_name_until_complete, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_copy_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_failed_removal_keeps_the_copy_error, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_no_space, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_size_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mtime_not_set, setup, teardown),
		cmocka_unit_test_setup_teardown(test_names_too_long, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_dir_not_writable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fallbacks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_dir_local, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_dir_local_past_missing, setup, teardown),
		cmocka_unit_test(test_dir_of),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
