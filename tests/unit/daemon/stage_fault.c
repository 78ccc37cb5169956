/*
 * stage_fault.c: fault injection for the tests of the stage module that
 * copy (test_stage, test_stage_changed), with the linker's --wrap
 * (tests/CMakeLists.txt): copy_file_range, sendfile, statvfs and the looks
 * at a source's path (mountrule_open and mountrule_stat: stage.c walks a
 * path, never stat(2)s it) forward to the real calls unless a test sets a
 * knob of stage_fixture.h,
 * which can fail them (EIO, ESTALE, EXDEV, ENOSPC), change the source
 * mid-copy, or look at the staging directory while the copy is under way;
 * unlinkat tells unlink_hook what it removes (a stop during a removal), and
 * fails with the errno it returns.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "mountrule.h"
#include "stage_fixture.h"

ssize_t __real_copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t len,
	unsigned flags);
ssize_t __wrap_copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t len,
	unsigned flags);
ssize_t __real_sendfile(int out, int in, off_t *off, size_t count);
ssize_t __wrap_sendfile(int out, int in, off_t *off, size_t count);
int __real_statvfs(const char *path, struct statvfs *buf);
int __wrap_statvfs(const char *path, struct statvfs *buf);
int __real_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);
int __wrap_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);
int __real_mountrule_stat(struct mountrule_walk *w, const char *path, struct stat *st,
	char *why, size_t len);
int __wrap_mountrule_stat(struct mountrule_walk *w, const char *path, struct stat *st,
	char *why, size_t len);
int __real_unlinkat(int dirfd, const char *path, int flags);
int __wrap_unlinkat(int dirfd, const char *path, int flags);

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

/* Whether a look at path fails now (stat_fail_path, stat_failures): the
 * errno, or 0. A refusal (EXDEV) says why, as the walk does. */
static int
look_fails(const char *path, char *why, size_t len)
{
	if (stat_fail_path == NULL || stat_failures == 0 || strcmp(path, stat_fail_path) != 0)
		return 0;
	if (stat_failures > 0)
		stat_failures--;
	if (stat_errno == EXDEV && why != NULL && len > 0)
		snprintf(why, len, "%s: bob-evil lies on fuse (a test's refusal)", path);
	return stat_errno;
}

int
__wrap_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	int e = look_fails(path, why, len);

	return e != 0 ? -e : __real_mountrule_open(w, path, why, len);
}

int
__wrap_mountrule_stat(struct mountrule_walk *w, const char *path, struct stat *st,
	char *why, size_t len)
{
	int e = look_fails(path, why, len);

	if (e != 0) {
		errno = e;
		return -1;
	}
	return __real_mountrule_stat(w, path, st, why, len);
}

int
__wrap_unlinkat(int dirfd, const char *path, int flags)
{
	int e = unlink_hook != NULL ? unlink_hook(path) : 0;

	if (e != 0) {
		errno = e;
		return -1;
	}
	return __real_unlinkat(dirfd, path, flags);
}
