/*
 * test_file.c: reading a model file's bytes for the parsers (client/base/file.c):
 * file_read_exact() and file_read_bytes() read private copies with pread,
 * and a file that is shorter than asked, shrinks or changes while it is
 * read fails with a message that names it, never a signal.
 *
 * fstat is wrapped (-Wl,--wrap=fstat): a test can make its n-th call from
 * now fail with an errno, as a network filesystem's getattr can; openat
 * (-Wl,--wrap=openat) can fail with EINTR, as a signal makes it on a FUSE
 * or NFS mount. __real_openat is weak, so a build without that option
 * still links; the test that needs it then reports SKIPPED.
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
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "testutil.h"

/* ---- fault injection ---- */

static int fstat_fail_at, fstat_errno; /* the call (1: the next) to fail, 0: none */

int __real_fstat(int fd, struct stat *st);
int __wrap_fstat(int fd, struct stat *st);

int
__wrap_fstat(int fd, struct stat *st)
{
	if (fstat_fail_at > 0 && --fstat_fail_at == 0) {
		errno = fstat_errno;
		return -1;
	}
	return __real_fstat(fd, st);
}

static int openat_eintr; /* > 0: so many openat() calls from now on fail with EINTR */

int __real_openat(int dir, const char *path, int flags, ...) __attribute__((weak));
int __wrap_openat(int dir, const char *path, int flags, ...);

/* openat() as file.c calls it: never with O_CREAT or O_TMPFILE, so without
 * the mode argument. */
int
__wrap_openat(int dir, const char *path, int flags, ...)
{
	if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE)
		fail_msg("openat(%s) with O_CREAT: the wrapper passes no mode on", path);
	if (openat_eintr > 0) {
		openat_eintr--;
		errno = EINTR;
		return -1;
	}
	return __real_openat(dir, path, flags);
}

/* The bytes of the file each test's fixture holds (struct tu_dir's path). */
static uint8_t data[200];

static int
setup(void **state)
{
	struct tu_dir *f;

	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7 + 1);
	if (tu_dir_setup(state) != 0)
		return -1;
	f = *state;
	f->path = tu_write(f->dir, "m.bin", data, sizeof(data));
	return 0;
}

/* The exact range comes back, in a buffer of its own. */
static void
test_read_exact(void **state)
{
	struct tu_dir *f = *state;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	uint8_t *buf = NULL;

	assert_true(fd >= 0);
	assert_int_equal(file_read_exact(fd, f->path, "header", 10, 50, 1, 100, &buf), 0);
	assert_memory_equal(buf, data + 10, 50);
	free(buf);
	/* The whole file, and an empty range. */
	assert_int_equal(file_read_exact(fd, f->path, "header", 0, 200, 0, 200, &buf), 0);
	assert_memory_equal(buf, data, 200);
	free(buf);
	assert_int_equal(file_read_exact(fd, f->path, "header", 200, 0, 0, 10, &buf), 0);
	free(buf);
	close(fd);
}

/* A range past the end of a short file is "shrank while being read", and
 * the out-parameter is untouched. */
static void
test_read_short_file(void **state)
{
	struct tu_dir *f = *state;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	uint8_t *buf = (uint8_t *)(uintptr_t)1;

	assert_true(fd >= 0);
	assert_int_equal(file_read_exact(fd, f->path, "header", 150, 51, 0, 1000, &buf), -EIO);
	assert_ptr_equal(buf, (uint8_t *)(uintptr_t)1);
	assert_non_null(strstr(error_get(), f->path));
	assert_non_null(strstr(error_get(), "file shrank while being read"));
	assert_int_equal(file_read_exact(fd, f->path, "header", 300, 1, 0, 1000, &buf), -EIO);
	close(fd);
}

/* Lengths outside [min, max] are refused before anything is allocated. */
static void
test_read_limits(void **state)
{
	struct tu_dir *f = *state;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	uint8_t *buf = NULL;

	assert_true(fd >= 0);
	assert_int_equal(file_read_exact(fd, f->path, "header", 0, 7, 8, 100, &buf), -EINVAL);
	assert_non_null(strstr(error_get(), "shorter than 8"));
	assert_int_equal(file_read_exact(fd, f->path, "header", 0, 101, 8, 100, &buf), -EFBIG);
	assert_non_null(strstr(error_get(), "larger than the 100 allowed"));
	assert_int_equal(file_read_exact(fd, f->path, "header", UINT64_MAX - 3, 8, 0, 100, &buf),
		-EINVAL);
	assert_null(buf);
	close(fd);
}

static uint64_t head_wanted;

/* A format that asks for head_wanted bytes. */
static uint64_t
want_head(const uint8_t *prefix, size_t len, uint64_t size)
{
	(void)prefix;
	(void)len;
	(void)size;
	return head_wanted;
}

/* file_read_bytes copies the head the format asks for and the tail. */
static void
test_read_bytes(void **state)
{
	struct tu_dir *f = *state;
	struct wc_file w;
	struct file_bytes b;

	assert_int_equal(file_open(f->path, &w), 0);
	head_wanted = 0; /* less than the probe: the probe is kept */
	assert_int_equal(file_read_bytes(&w, want_head, 1000, &b), 0);
	assert_int_equal(b.head_len, 200);
	assert_int_equal(b.tail_len, FILE_TAIL_MAX);
	assert_int_equal(b.size, 200);
	assert_memory_equal(b.head, data, 200);
	assert_memory_equal(b.tail, data + 200 - FILE_TAIL_MAX, FILE_TAIL_MAX);
	assert_true(b.head != w.base); /* a copy, not the mapping */
	file_bytes_free(&b);
	file_bytes_free(&b); /* safe twice */
	file_close(&w);
}

/* A file that shrinks after it was opened (and mapped) fails the read with
 * a message; touching the mapping instead would be SIGBUS. */
static void
test_read_bytes_file_shrinks(void **state)
{
	struct tu_dir *f = *state;
	struct wc_file w;
	struct file_bytes b = { 0 };

	assert_int_equal(file_open(f->path, &w), 0);
	assert_int_equal(truncate(f->path, 0), 0);
	head_wanted = 0;
	assert_int_equal(file_read_bytes(&w, want_head, 1000, &b), -EIO);
	assert_non_null(strstr(error_get(), "file shrank while being read"));
	assert_non_null(strstr(error_get(), f->path));
	assert_null(b.owned);
	assert_int_equal(file_check_unchanged(&w), -ESTALE);
	assert_non_null(strstr(error_get(), "file changed while being read"));
	file_close(&w);
}

/* A file written in place after it was opened is "changed". */
static void
test_check_unchanged(void **state)
{
	struct tu_dir *f = *state;
	struct timespec later[2] = { { 0, UTIME_OMIT }, { 12345, 0 } };
	struct wc_file w;

	assert_int_equal(file_open(f->path, &w), 0);
	assert_int_equal(file_check_unchanged(&w), 0);
	assert_int_equal(utimensat(AT_FDCWD, f->path, later, 0), 0);
	assert_int_equal(file_check_unchanged(&w), -ESTALE);
	assert_non_null(strstr(error_get(), "written in place"));
	file_close(&w);
}

/* A stat with the given link count and ctime (in s), size 100, mtime 7. */
static struct stat
stat_of(nlink_t nlink, time_t ctime_s)
{
	struct stat st;

	memset(&st, 0, sizeof(st));
	st.st_dev = 3;
	st.st_ino = 42;
	st.st_size = 100;
	st.st_mtim.tv_sec = 7;
	st.st_nlink = nlink;
	st.st_ctim.tv_sec = ctime_s;
	return st;
}

/* Only the link count and the ctime moved (a link added or removed beside
 * the file, which can hide a write with its mtime put back: review rev222
 * M2): file_links_moved says so; file_ctime_moved and file_written_in_place
 * still call it no write (rev225 H1: no refusal). */
static void
test_links_moved(void **state)
{
	struct stat then = stat_of(1, 10), now;

	(void)state;
	now = stat_of(2, 11);
	assert_true(file_links_moved(&then, &now)); /* a link added */
	assert_false(file_ctime_moved(&then, &now));
	assert_false(file_written_in_place(&then, &now));
	assert_true(file_links_moved(&now, &then)); /* and removed */
	now = stat_of(1, 11);
	assert_false(file_links_moved(&then, &now)); /* chmod or a write: not links */
	assert_true(file_written_in_place(&then, &now));
	now = stat_of(2, 10);
	assert_false(file_links_moved(&then, &now)); /* the ctime did not move */
	now = stat_of(0, 11);
	assert_false(file_links_moved(&then, &now)); /* lost its last link */
	now = stat_of(2, 11);
	now.st_size = 101;
	assert_false(file_links_moved(&then, &now)); /* written: its size moved */
	now = stat_of(2, 11);
	now.st_mtim.tv_nsec = 1;
	assert_false(file_links_moved(&then, &now)); /* its mtime moved */
	now = stat_of(2, 11);
	now.st_ino = 43;
	assert_false(file_links_moved(&then, &now)); /* another inode */
}

/* A head larger than the format's maximum is refused. */
static void
test_read_bytes_max_head(void **state)
{
	struct tu_dir *f = *state;
	struct wc_file w;
	struct file_bytes b;
	uint8_t big[FILE_PROBE_LEN + 100];
	char *path;

	memset(big, 'x', sizeof(big));
	path = tu_write(f->dir, "big.bin", big, sizeof(big));
	assert_int_equal(file_open(path, &w), 0);
	head_wanted = sizeof(big);
	assert_int_equal(file_read_bytes(&w, want_head, FILE_PROBE_LEN + 1, &b), -EFBIG);
	assert_int_equal(file_read_bytes(&w, want_head, sizeof(big), &b), 0);
	assert_int_equal(b.head_len, sizeof(big));
	file_bytes_free(&b);
	file_close(&w);
	free(path);
}

/*
 * fd_reopen_read_only() reopens a regular file, and looks at the type
 * before it opens anything: an open(2) of a FIFO's /proc/self/fd path
 * waits for a writer (before, it waited forever, and the check after the
 * open never ran) and opening a device can act on it.
 */
static void
test_reopen_only_regular_files(void **state)
{
	struct tu_dir *f = *state;
	char *fifo = NULL;
	int fd, again, before = tu_count_fds();
	struct stat st, st2;

	fd = open(f->path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	again = fd_reopen_read_only(fd, "m.bin");
	assert_true(again >= 0);
	assert_int_equal(fcntl(again, F_GETFL) & O_ACCMODE, O_RDONLY);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(fstat(again, &st2), 0);
	assert_true(st.st_ino == st2.st_ino && st.st_dev == st2.st_dev);
	close(again);
	close(fd);

	assert_true(asprintf(&fifo, "%s/fifo", f->dir) > 0);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	assert_true(fd >= 0);
	alarm(10); /* a wait for a writer ends the test here */
	assert_int_equal(fd_reopen_read_only(fd, "the fifo"), -EINVAL);
	alarm(0);
	if (strstr(error_get(), "the fifo: not a regular file") == NULL)
		fail_msg("message \"%s\"", error_get());
	close(fd);
	unlink(fifo);
	free(fifo);
	assert_int_equal(tu_count_fds(), before);
}

/*
 * An fstat of the reopened descriptor that fails is reported with its
 * reason, not as "not the same file" (which sends an operator looking for
 * a replaced file that is not there), and the descriptor is closed.
 */
static void
test_reopen_fstat_fails(void **state)
{
	struct tu_dir *f = *state;
	int fd, before = tu_count_fds();

	fd = open(f->path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	fstat_errno = EIO;
	fstat_fail_at = 2; /* the first is of fd, the second of the new one */
	assert_int_equal(fd_reopen_read_only(fd, "m.bin"), -EIO);
	fstat_fail_at = 0;
	if (strcmp(error_get(), "m.bin: fstat: Input/output error") != 0)
		fail_msg("message \"%s\"", error_get());
	close(fd);
	assert_int_equal(tu_count_fds(), before);
}

/*
 * A signal that interrupts the open or an fstat of a model file (EINTR, as
 * a FUSE or NFS mount returns it while it waits on its server) does not
 * fail it: each call is tried again. Before, file_open() failed with
 * "m.bin: Interrupted system call" (the open) or "m.bin: fstat:
 * Interrupted system call", and so did file_check_unchanged().
 */
static void
test_interrupted(void **state)
{
	struct tu_dir *f = *state;
	struct wc_file w;
	int before = tu_count_fds();

	if (__real_openat == NULL)
		skip();
	openat_eintr = 2;
	assert_int_equal(file_open(f->path, &w), 0);
	assert_int_equal(openat_eintr, 0);
	assert_int_equal(w.size, sizeof(data));
	file_close(&w);
	fstat_errno = EINTR;
	fstat_fail_at = 1;
	assert_int_equal(file_open(f->path, &w), 0);
	assert_int_equal(fstat_fail_at, 0);
	assert_memory_equal(w.base, data, sizeof(data));
	fstat_fail_at = 1;
	assert_int_equal(file_check_unchanged(&w), 0);
	assert_int_equal(fstat_fail_at, 0);
	file_close(&w);
	/* Any other error still fails, naming the file. */
	fstat_errno = EIO;
	fstat_fail_at = 1;
	assert_int_equal(file_open(f->path, &w), -EIO);
	fstat_fail_at = 0;
	if (strstr(error_get(), "m.bin: fstat: Input/output error") == NULL)
		fail_msg("message \"%s\"", error_get());
	assert_int_equal(tu_count_fds(), before);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_read_exact, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_read_short_file, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_read_limits, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_read_bytes, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_read_bytes_file_shrinks, setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_check_unchanged, setup, tu_dir_teardown),
		cmocka_unit_test(test_links_moved),
		cmocka_unit_test_setup_teardown(test_read_bytes_max_head, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_reopen_only_regular_files, setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_reopen_fstat_fails, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_interrupted, setup, tu_dir_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
