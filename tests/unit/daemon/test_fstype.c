/*
 * test_fstype.c: filesystem kinds (daemon/fstype.h): the names the mount
 * table gives classified as statfs's magic numbers are, and a device
 * looked up in a mountinfo file without asking any filesystem (a warm
 * restart's check on a hung server is queued by it).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmocka.h>

#include "fstype.h"

static void
test_names(void **state)
{
	static const struct {
		const char *type, *name;
		int remote;
	} cases[] = {
		{ "nfs", "nfs", 1 },      { "nfs4", "nfs", 1 },   { "fuse.sshfs", "fuse", 1 },
		{ "fuseblk", "fuse", 1 }, { "cifs", "cifs", 1 },  { "smb3", "smb", 1 },
		{ "ceph", "ceph", 1 },    { "9p", "9p", 1 },      { "lustre", "lustre", 1 },
		{ "virtiofs", "virtiofs", 1 }, { "ext4", "ext4", 0 }, { "xfs", "xfs", 0 },
		{ "tmpfs", "tmpfs", 0 },  { "overlay", "overlay", 0 }, { "ext3", "ext3", 0 },
		{ "somethingnew", "somethingnew", 0 },
	};
	struct fs_info fs, magic;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fstype_classify_name(cases[i].type, &fs);
		assert_string_equal(fs.name, cases[i].name);
		assert_int_equal(fs.remote, cases[i].remote);
		/* A known one is what statfs's magic number says. */
		if (fs.magic != 0) {
			fstype_classify(fs.magic, &magic);
			assert_int_equal(magic.remote, fs.remote);
		}
	}
}

/* Writes text to a temporary file: its path (static). */
static const char *
mountinfo(const char *text)
{
	static char path[] = "/tmp/test_fstype.XXXXXX";
	int fd;

	strcpy(path, "/tmp/test_fstype.XXXXXX");
	assert_true((fd = mkstemp(path)) >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

static void
test_device_in_mountinfo(void **state)
{
	const char *path = mountinfo(
		"22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
		"40 22 0:45 / /mnt/models rw,nosuid shared:20 - nfs4 srv:/export rw,vers=4.2\n"
		"41 22 0:46 / /mnt/fuse rw master:3 shared:4 - fuse.remotefs remotefs rw\n"
		"garbage without fields\n"
		"42 22 0:47 / /mnt/odd rw -\n");
	struct fs_info fs;

	(void)state;
	assert_int_equal(fstype_of_dev(path, makedev(259, 2), &fs), 0);
	assert_string_equal(fs.name, "ext4");
	assert_false(fs.remote);
	assert_int_equal(fstype_of_dev(path, makedev(0, 45), &fs), 0);
	assert_string_equal(fs.name, "nfs");
	assert_true(fs.remote);
	assert_int_equal(fstype_of_dev(path, makedev(0, 46), &fs), 0);
	assert_string_equal(fs.name, "fuse");
	assert_true(fs.remote);
	/* Not mounted (btrfs gives its files devices of their own), or a
	 * line without a type. */
	assert_int_equal(fstype_of_dev(path, makedev(0, 99), &fs), -ENOENT);
	assert_int_equal(fstype_of_dev(path, makedev(0, 47), &fs), -ENOENT);
	unlink(path);
	assert_true(fstype_of_dev("/nonexistent/mountinfo", makedev(0, 45), &fs) < 0);
}

/* This process's own root, as the kernel lists it. */
static void
test_own_mount_table(void **state)
{
	struct stat st;
	struct fs_info fs, by_statfs;
	FILE *f;

	(void)state;
	assert_int_equal(stat("/proc/self/mountinfo", &st), 0);
	/* /proc's device is listed as it is mounted. */
	assert_int_equal(fstype_of_dev("/proc/self/mountinfo", st.st_dev, &fs), 0);
	assert_string_equal(fs.name, "proc");
	assert_false(fs.remote);
	assert_non_null(f = fopen("/proc/self/mountinfo", "r"));
	assert_int_equal(fstype_of_fd(fileno(f), &by_statfs), 0);
	assert_int_equal(by_statfs.remote, fs.remote);
	fclose(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_device_in_mountinfo),
		cmocka_unit_test(test_own_mount_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
