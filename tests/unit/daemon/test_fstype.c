/*
 * test_fstype.c: filesystem kinds (daemon/fstype.h): the names the mount
 * table gives classified as statfs's magic numbers are, and a device
 * looked up in a mountinfo file without asking any filesystem (a warm
 * restart's check on a hung server is queued by it), and a descriptor's
 * filesystem found there when statfs fails, and fstat with it (fstatfs and
 * fstat wrapped: --wrap).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "fstype.h"

/* fstatfs fails with this errno while it is not 0. */
static int fstatfs_fails;

int __real_fstatfs(int fd, struct statfs *st);
int __wrap_fstatfs(int fd, struct statfs *st);

int
__wrap_fstatfs(int fd, struct statfs *st)
{
	if (fstatfs_fails != 0) {
		errno = fstatfs_fails;
		return -1;
	}
	return __real_fstatfs(fd, st);
}

/* fstat fails with this errno while it is not 0: a server that does not
 * answer once the attributes it gave expired (ENOTCONN from FUSE). */
static int fstat_fails;

int __real_fstat(int fd, struct stat *st);
int __wrap_fstat(int fd, struct stat *st);

int
__wrap_fstat(int fd, struct stat *st)
{
	if (fstat_fails != 0) {
		errno = fstat_fails;
		return -1;
	}
	return __real_fstat(fd, st);
}

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
		/* Known: all but the names no table holds ("ext3" is known by
		 * its magic number, ext4's; diracl trusts the mode only of a
		 * filesystem it knows). */
		assert_int_equal(fs.known, strcmp(cases[i].type, "somethingnew") != 0 &&
			strcmp(cases[i].type, "ext3") != 0);
		/* A known one is what statfs's magic number says. */
		if (fs.magic != 0) {
			fstype_classify(fs.magic, &magic);
			assert_int_equal(magic.remote, fs.remote);
			assert_true(magic.known);
		}
	}
	/* A magic number no table holds is named by its number, unknown. */
	fstype_classify(0x12345678ul, &magic);
	assert_string_equal(magic.name, "0x12345678");
	assert_false(magic.known);
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

/* A FUSE mount a user made (fusermount3's user_id=UID super option, not
 * 0) is told from root's own, and from another filesystem's user_id
 * option or a name that merely ends in it (review rev205 H1). */
static void
test_users_fuse_mount(void **state)
{
	const char *path = mountinfo(
		"50 22 0:50 / /team/m rw - fuse.hang hang rw,user_id=64112,group_id=64100\n"
		"51 22 0:51 / /mnt/s3 rw - fuse.s3fs s3fs rw,user_id=0,group_id=0,allow_other\n"
		"52 22 0:52 / /mnt/x rw - fuse x rw,group_id=5,user_id=1000\n"
		"53 22 0:53 / /mnt/y rw - fuse y rw,xuser_id=7,user_id=12x\n"
		"54 22 0:54 / /mnt/z rw - nfs4 srv:/e rw,user_id=9\n"
		"55 22 0:55 / /mnt/w rw - fuse w rw,user_id=99999999999999999999\n"
		"56 22 0:56 / /mnt/v rw - fuse\n");
	struct fs_info fs;

	(void)state;
	assert_int_equal(fstype_of_dev(path, makedev(0, 50), &fs), 0);
	assert_true(fs.user_mount);
	assert_int_equal(fs.mounter, 64112);
	assert_int_equal(fstype_of_dev(path, makedev(0, 51), &fs), 0);
	assert_false(fs.user_mount);
	assert_int_equal(fstype_of_dev(path, makedev(0, 52), &fs), 0);
	assert_true(fs.user_mount);
	assert_int_equal(fs.mounter, 1000);
	assert_int_equal(fstype_of_dev(path, makedev(0, 54), &fs), 0);
	assert_false(fs.user_mount);
	/* A FUSE line whose user_id cannot be read (not a number, past 2^31,
	 * no super options) is a user's mount, by no one known: fails closed. */
	for (unsigned minor = 53; minor <= 56; minor += minor == 53 ? 2 : 1) {
		assert_int_equal(fstype_of_dev(path, makedev(0, minor), &fs), 0);
		assert_true(fs.user_mount);
		assert_int_equal(fs.mounter, (uid_t)-1);
	}
	unlink(path);
}

/* What a FUSE mount's user spells himself: fusermount3 -o subtype=
 * (the type's tail, any length) and fsname= (the source field, blanks
 * escaped \040 by the kernel). Neither is read as the super options: a
 * type of 64 bytes or more cut the fields short, and the source
 * "user_id=0" was read as root's mount (review rev207 H1). */
static void
test_users_fuse_mount_spelled_by_its_user(void **state)
{
	char text[4096], sixty[61], long_type[301];
	const char *path;
	struct fs_info fs;

	(void)state;
	memset(sixty, 'a', 60);
	sixty[60] = '\0';
	memset(long_type, 'b', 300);
	long_type[300] = '\0';
	snprintf(text, sizeof(text),
		/* as real fusermount3 3.14 made it for uid 65534 */
		"44 47 0:41 / /tmp/fm/mnt rw,nosuid,nodev,relatime - fuse.%s user_id=0 "
		"rw,user_id=65534,group_id=65534,allow_other\n"
		"45 47 0:42 / /tmp/fm/b rw - fuse.%s user_id=0,x rw,user_id=1000,group_id=1000\n"
		"46 47 0:43 / /tmp/fm/c rw - fuse.x a\\040user_id=0 rw,user_id=1001,group_id=7\n"
		"47 47 0:44 / /tmp/a\\040-\\040b rw - fuse.x rw,user_id=0 rw,user_id=1002\n"
		/* root's, whatever its source says */
		"48 47 0:45 / /mnt/s3 rw - fuse.s3fs user_id=1003 rw,user_id=0,group_id=0\n"
		"49 47 0:46 / /mnt/d rw - fuseblk /dev/sdb1 rw,user_id=0,group_id=0,blksize=4096\n"
		/* no super options: the source is not read as them */
		"50 47 0:47 / /tmp/fm/d rw - fuse.%s user_id=0\n"
		"51 47 0:48 / /tmp/fm/e rw - fuse.y user_id=0\n"
		/* the fields after a type of exactly 63 and 64 bytes */
		"52 47 0:49 / /tmp/fm/f rw - fuse.%.58s user_id=0 rw,user_id=1004\n"
		"53 47 0:50 / /tmp/fm/g rw - fuse.%.59s user_id=0 rw,user_id=1005\n"
		/* not FUSE: fusectl (the connections), nfs */
		"54 47 0:51 / /sys/fs/fuse/connections rw - fusectl fusectl rw\n"
		"55 47 0:52 / /mnt/n rw - nfs4 user_id=0 rw,user_id=1006\n",
		sixty, long_type, sixty, long_type, long_type);
	path = mountinfo(text);
	for (unsigned minor = 41; minor <= 44; minor++) {
		assert_int_equal(fstype_of_dev(path, makedev(0, minor), &fs), 0);
		assert_string_equal(fs.name, "fuse");
		assert_true(fs.user_mount);
		assert_int_equal(fs.mounter, minor == 41 ? 65534 : 1000 + (minor - 42));
	}
	for (unsigned minor = 45; minor <= 46; minor++) {
		assert_int_equal(fstype_of_dev(path, makedev(0, minor), &fs), 0);
		assert_string_equal(fs.name, "fuse");
		assert_false(fs.user_mount);
	}
	for (unsigned minor = 47; minor <= 48; minor++) {
		assert_int_equal(fstype_of_dev(path, makedev(0, minor), &fs), 0);
		assert_true(fs.user_mount);
		assert_int_equal(fs.mounter, (uid_t)-1);
	}
	for (unsigned minor = 49; minor <= 50; minor++) {
		assert_int_equal(fstype_of_dev(path, makedev(0, minor), &fs), 0);
		assert_true(fs.user_mount);
		assert_int_equal(fs.mounter, 1004 + (minor - 49));
	}
	assert_int_equal(fstype_of_dev(path, makedev(0, 51), &fs), 0);
	assert_false(fs.user_mount);
	assert_int_equal(fstype_of_dev(path, makedev(0, 52), &fs), 0);
	assert_string_equal(fs.name, "nfs");
	assert_false(fs.user_mount);
	unlink(path);
}

/* The mount table read once answers for each device what fstype_of_dev()
 * answers reading mountinfo again: the first line with the device, a line
 * without a type skipped, -ENOENT for a device no line names. */
static void
test_mount_table(void **state)
{
	/* In the order a case reads, not the one that packs best.
	 * NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding) */
	static const struct {
		unsigned major, minor;
		int err;
		const char *name;
		bool remote;
	} cases[] = {
		{ 259, 2, 0, "ext4", false }, { 0, 45, 0, "nfs", true },
		{ 0, 48, 0, "tmpfs", false }, /* the first of two */
		{ 0, 49, 0, "cifs", true },   /* the first with a type */
		{ 0, 99, -ENOENT, NULL, false },
	};
	const char *path = mountinfo(
		"22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
		"40 22 0:45 / /mnt/models rw,nosuid shared:20 - nfs4 srv:/export rw,vers=4.2\n"
		"garbage without fields\n"
		"43 22 0:48 / /mnt/a rw - tmpfs tmpfs rw\n"
		"44 22 0:48 / /mnt/b rw - nfs srv:/x rw\n"
		"45 22 0:49 / /mnt/c rw -\n"
		"46 22 0:49 / /mnt/d rw - cifs //srv/x rw\n");
	struct fs_mounts t = { 0 }, untouched = { .n = 7 };
	struct fs_info fs, once;

	(void)state;
	assert_int_equal(fstype_mounts_read(path, &t), 0);
	assert_int_equal(t.n, 5);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dev_t dev = makedev(cases[i].major, cases[i].minor);

		memset(&fs, 0, sizeof(fs));
		memset(&once, 0, sizeof(once));
		assert_int_equal(fstype_mounts_find(&t, dev, &fs), cases[i].err);
		assert_int_equal(fstype_of_dev(path, dev, &once), cases[i].err);
		if (cases[i].err < 0)
			continue;
		assert_string_equal(fs.name, cases[i].name);
		assert_int_equal(fs.remote, cases[i].remote);
		assert_memory_equal(&fs, &once, sizeof(fs));
	}
	/* Read once: the table answers when the file is gone. */
	unlink(path);
	assert_int_equal(fstype_mounts_find(&t, makedev(0, 45), &fs), 0);
	assert_string_equal(fs.name, "nfs");
	fstype_mounts_free(&t);
	assert_null(t.mounts);
	assert_int_equal(t.n, 0);
	assert_int_equal(fstype_mounts_find(&t, makedev(0, 45), &fs), -ENOENT);
	fstype_mounts_free(&t);
	fstype_mounts_free(NULL);
	/* A failed read leaves the table it was given alone. */
	assert_int_equal(fstype_mounts_read("/nonexistent/mountinfo", &untouched), -ENOENT);
	assert_int_equal(untouched.n, 7);
	/* An empty file: an empty table. */
	path = mountinfo("");
	assert_int_equal(fstype_mounts_read(path, &t), 0);
	assert_int_equal(t.n, 0);
	assert_int_equal(fstype_mounts_find(&t, makedev(259, 2), &fs), -ENOENT);
	fstype_mounts_free(&t);
	unlink(path);
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

/* The whole of the file path (malloc'd, a string). */
static char *
whole(const char *path)
{
	FILE *in = fopen(path, "re"), *out;
	char buf[4096], *text = NULL;
	size_t n, len = 0;

	assert_non_null(in);
	assert_non_null(out = open_memstream(&text, &len));
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		assert_int_equal(fwrite(buf, 1, n, out), n);
	fclose(in);
	fclose(out);
	return text;
}

/* Every device this process's mount table lists, and some it does not:
 * the table read once says what reading mountinfo for each says. On a
 * copy, so that a mount made meanwhile changes neither. */
static void
test_own_mount_table_once(void **state)
{
	struct fs_mounts t = { 0 };
	struct fs_info fs, each;
	char *text, *line = NULL;
	size_t cap = 0, devices = 0;
	const char *path;
	FILE *f;

	(void)state;
	path = mountinfo(text = whole("/proc/self/mountinfo"));
	assert_int_equal(fstype_mounts_read(path, &t), 0);
	assert_true(t.n > 0);
	assert_non_null(f = fopen(path, "re"));
	while (getline(&line, &cap, f) != -1) {
		unsigned major, minor;

		assert_int_equal(sscanf(line, "%*u %*u %u:%u", &major, &minor), 2);
		for (unsigned m = minor; m <= minor + 1; m++) {
			int err = fstype_of_dev(path, makedev(major, m), &each);

			memset(&fs, 0, sizeof(fs));
			assert_int_equal(fstype_mounts_find(&t, makedev(major, m), &fs), err);
			if (err == 0)
				assert_memory_equal(&fs, &each, sizeof(fs));
		}
		devices++;
	}
	assert_int_equal(devices, t.n);
	free(line);
	fclose(f);
	unlink(path);
	free(text);
	fstype_mounts_free(&t);
}

/* A network filesystem whose server does not answer fails statfs (EIO on a
 * soft mount): the file's filesystem is then the mount table's entry for
 * its device, not "local" because the question failed. A descriptor whose
 * device no mount has (a pipe) is "unknown", with statfs's error. */
static void
test_failed_statfs_asks_the_mount_table(void **state)
{
	struct fs_info want, got, listed;
	struct stat st;
	int fd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), pipe_fds[2];

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(fstype_of_fd(fd, &want), 0);
	assert_int_equal(fstat(fd, &st), 0);
	fstatfs_fails = EIO;
	if (fstype_of_dev("/proc/self/mountinfo", st.st_dev, &listed) == 0) {
		memset(&got, 0x55, sizeof(got));
		assert_int_equal(fstype_of_fd(fd, &got), 0);
		assert_string_equal(got.name, listed.name);
		assert_int_equal(got.remote, want.remote);
		/* The device is what the kernel has cached, not a question to
		 * the server that fstat would ask again. */
		fstat_fails = ENOTCONN;
		memset(&got, 0x55, sizeof(got));
		assert_int_equal(fstype_of_fd(fd, &got), 0);
		assert_string_equal(got.name, listed.name);
		fstat_fails = 0;
	} else {
		/* btrfs: a subvolume's device is not its mount's */
		assert_int_equal(fstype_of_fd(fd, &got), -EIO);
	}
	assert_int_equal(pipe(pipe_fds), 0);
	memset(&got, 0x55, sizeof(got));
	assert_int_equal(fstype_of_fd(pipe_fds[0], &got), -EIO);
	assert_string_equal(got.name, "unknown");
	assert_false(got.remote);
	fstatfs_fails = 0;
	assert_int_equal(fstype_of_fd(pipe_fds[0], &got), 0);
	close(pipe_fds[0]);
	close(pipe_fds[1]);
	close(fd);
}

/* The table from bytes (what the fuzzer drives), in pieces: a line
 * without its newline, a NUL that ends a line, a line cut across two
 * calls is two lines (the reader gives whole lines). */
static void
test_mount_table_from_bytes(void **state)
{
	static const char text[] = "22 1 259:2 / / rw - ext4 /dev/x rw\n"
		"40 22 0:45 / /m rw\0 - nfs4 s:/e rw\n"
		"41 22 0:46 / /f\\040x rw - fuse.sshfs u@h:/m rw";
	static const char head[] = "50 1 0:50 / /a rw - ", tail[] = "tmpfs t rw\n";
	struct fs_mounts t = { 0 };
	struct fs_info fs;

	(void)state;
	assert_int_equal(fstype_mounts_add(&t, text, sizeof(text) - 1), 0);
	assert_int_equal(t.n, 2);
	assert_int_equal(fstype_mounts_find(&t, makedev(259, 2), &fs), 0);
	assert_string_equal(fs.name, "ext4");
	assert_int_equal(fstype_mounts_find(&t, makedev(0, 45), &fs), -ENOENT);
	assert_int_equal(fstype_mounts_find(&t, makedev(0, 46), &fs), 0);
	assert_string_equal(fs.name, "fuse");
	assert_true(fs.remote);
	assert_int_equal(fstype_mounts_add(&t, "", 0), 0);
	assert_int_equal(fstype_mounts_add(&t, head, strlen(head)), 0);
	assert_int_equal(fstype_mounts_add(&t, tail, strlen(tail)), 0);
	assert_int_equal(t.n, 2);
	fstype_mounts_free(&t);
	assert_int_equal(t.cap, 0);
}

/* A run's table (fs_table) of a mountinfo file: read once for every
 * question while the file is no mount table the kernel says changed (a
 * plain file never does), and once more for a device it does not list;
 * freed, it is read afresh. */
static void
test_table_of_a_file(void **state)
{
	const char *path = mountinfo(
		"30 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n"
		"41 30 0:45 / /mnt/fuse rw - fuse.sshfs host: rw,user_id=1000,group_id=1000\n");
	struct fs_table t = FS_TABLE_INIT(path);
	struct fs_info fs;

	(void)state;
	for (int i = 0; i < 100; i++) {
		assert_int_equal(fstype_table_find(&t, makedev(259, 2), &fs), 0);
		assert_string_equal(fs.name, "ext4");
		assert_int_equal(fstype_table_find(&t, makedev(0, 45), &fs), 0);
		assert_true(fs.user_mount && fs.mounter == 1000);
	}
	assert_int_equal(t.reads, 1);
	assert_int_equal(fstype_table_find(&t, makedev(0, 99), &fs), -ENOENT);
	assert_int_equal(t.reads, 2);
	assert_int_equal(fstype_table_find(&t, makedev(0, 98), &fs), -ENOENT);
	assert_int_equal(t.reads, 2);
	fstype_table_free(&t);
	assert_int_equal(t.fd, -1);
	assert_int_equal(t.reads, 0);
	assert_int_equal(fstype_table_find(&t, makedev(0, 45), &fs), 0);
	assert_int_equal(t.reads, 1);
	fstype_table_free(&t);
	fstype_table_free(&t);
	unlink(path);
	t = (struct fs_table)FS_TABLE_INIT("/nonexistent/mountinfo");
	assert_int_equal(fstype_table_find(&t, makedev(0, 45), &fs), -EIO);
	assert_int_equal(t.fd, -1);
	fstype_table_free(&t);
}

/* A run's table asked by mount ID (mountinfo's first field): each line's
 * own mount, where two lines share a device (a bind mount; a device no
 * line lists, a btrfs subvolume's, has its mount's ID); an ID no line has
 * is -ENOENT (a mount gone), after one reading again, once per table; a
 * line whose ID is no number is no mount. */
static void
test_table_by_mount_id(void **state)
{
	const char *path = mountinfo(
		"30 1 259:2 / / rw - btrfs /dev/nvme0n1p2 rw,subvolid=5\n"
		"43 30 0:48 / /mnt/a rw - tmpfs tmpfs rw\n"
		"44 30 0:48 / /mnt/b rw - fuse.sshfs host: rw,user_id=1000,group_id=1000\n"
		"x5 30 0:50 / /mnt/c rw - nfs srv:/x rw\n");
	struct fs_table t = FS_TABLE_INIT(path);
	struct fs_mounts m = { 0 };
	struct fs_info fs;

	(void)state;
	assert_int_equal(fstype_table_find_id(&t, 30, &fs), 0);
	assert_string_equal(fs.name, "btrfs");
	assert_int_equal(fstype_table_find_id(&t, 43, &fs), 0);
	assert_string_equal(fs.name, "tmpfs");
	assert_false(fs.user_mount);
	/* by device, the first line with it; by ID, the mount's own */
	assert_int_equal(fstype_table_find(&t, makedev(0, 48), &fs), 0);
	assert_string_equal(fs.name, "tmpfs");
	assert_int_equal(fstype_table_find_id(&t, 44, &fs), 0);
	assert_string_equal(fs.name, "fuse");
	assert_true(fs.user_mount && fs.mounter == 1000);
	assert_int_equal(t.reads, 1);
	assert_int_equal(fstype_table_find_id(&t, 45, &fs), -ENOENT);
	assert_int_equal(fstype_table_find_id(&t, 5, &fs), -ENOENT);
	assert_int_equal(t.reads, 2);
	assert_int_equal(fstype_table_find(&t, makedev(0, 50), &fs), -ENOENT);
	assert_int_equal(t.reads, 2);
	fstype_table_free(&t);
	/* the table read whole: the lines' IDs in order */
	assert_int_equal(fstype_mounts_read(path, &m), 0);
	assert_int_equal(m.n, 3);
	assert_true(m.mounts[0].id == 30 && m.mounts[1].id == 43 && m.mounts[2].id == 44);
	assert_int_equal(fstype_mounts_find_id(&m, 44, &fs), 0);
	assert_int_equal(fstype_mounts_find_id(&m, 0, &fs), -ENOENT);
	fstype_mounts_free(&m);
	unlink(path);
}

/* Both readers of a table stop at FS_MOUNTINFO_MAX: a file past it (a
 * sparse one, zeros) is -ENOMEM, not read into memory without end (the
 * run's table always stopped there; fstype_mounts_read read on). */
static void
test_table_over_the_cap(void **state)
{
	const char *path = mountinfo("30 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n");
	struct fs_table t = FS_TABLE_INIT(path);
	struct fs_mounts m = { .n = 7 };
	struct fs_info fs;

	(void)state;
	assert_int_equal(truncate(path, (off_t)FS_MOUNTINFO_MAX + 1), 0);
	assert_int_equal(fstype_mounts_read(path, &m), -ENOMEM);
	assert_int_equal(m.n, 7);
	assert_int_equal(fstype_table_find_id(&t, 30, &fs), -ENOMEM);
	assert_int_equal(t.fd, -1);
	fstype_table_free(&t);
	unlink(path);
}

/*
 * A mount detached lazily (umount -l) while a descriptor holds it keeps
 * its mount ID (statx STATX_MNT_ID of the descriptor), which the table
 * then lists no more: -ENOENT by ID, a mount gone. By its device the table
 * says -ENOENT too, which the walk took for a btrfs subvolume's, local
 * (review rev208 H2). In a mount namespace of the test's own (root), on a
 * kernel that gives mount IDs (5.8): skipped elsewhere.
 */
static void
test_table_of_a_detached_mount(void **state)
{
	struct fs_table t = FS_TABLE_INIT("/proc/self/mountinfo");
	char dir[] = "/tmp/test_fstype_ns.XXXXXX";
	struct statx sx, again;
	struct fs_info fs;
	int fd;

	(void)state;
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		skip();
	assert_non_null(mkdtemp(dir));
	assert_int_equal(mount("t", dir, "tmpfs", 0, "size=1m"), 0);
	assert_true((fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);
	assert_int_equal(statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &sx), 0);
	if (!(sx.stx_mask & STATX_MNT_ID)) {
		close(fd);
		umount(dir);
		rmdir(dir);
		skip();
	}
	assert_int_equal(fstype_table_find_id(&t, sx.stx_mnt_id, &fs), 0);
	assert_string_equal(fs.name, "tmpfs");
	assert_int_equal(umount2(dir, MNT_DETACH), 0);
	assert_int_equal(statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &again), 0);
	assert_true(again.stx_mnt_id == sx.stx_mnt_id);
	assert_int_equal(fstype_table_find_id(&t, sx.stx_mnt_id, &fs), -ENOENT);
	assert_int_equal(fstype_table_find(&t,
		makedev(again.stx_dev_major, again.stx_dev_minor), &fs), -ENOENT);
	close(fd);
	assert_int_equal(rmdir(dir), 0);
	fstype_table_free(&t);
}

/*
 * The run's table of this process's own mount table is read again once a
 * mount changed it, though the device asked about is listed: a tmpfs
 * unmounted and a ramfs mounted in its place (whose anonymous device
 * number is, most likely, the tmpfs's given again) says ramfs, not the
 * tmpfs the first reading listed. Without a change, no reading. In a
 * mount namespace of the test's own (root): skipped elsewhere.
 */
static void
test_table_read_again_after_a_mount(void **state)
{
	struct fs_table t = FS_TABLE_INIT("/proc/self/mountinfo");
	char dir[] = "/tmp/test_fstype_ns.XXXXXX";
	struct fs_info fs;
	struct stat st;

	(void)state;
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		skip();
	assert_non_null(mkdtemp(dir));
	assert_int_equal(mount("t", dir, "tmpfs", 0, "size=1m"), 0);
	assert_int_equal(stat(dir, &st), 0);
	for (int i = 0; i < 100; i++) {
		assert_int_equal(fstype_table_find(&t, st.st_dev, &fs), 0);
		assert_string_equal(fs.name, "tmpfs");
	}
	assert_int_equal(t.reads, 1);
	assert_int_equal(umount(dir), 0);
	assert_int_equal(mount("r", dir, "ramfs", 0, NULL), 0);
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(fstype_table_find(&t, st.st_dev, &fs), 0);
	assert_string_equal(fs.name, "ramfs");
	assert_int_equal(t.reads, 2);
	assert_int_equal(fstype_table_find(&t, st.st_dev, &fs), 0);
	assert_int_equal(t.reads, 2);
	assert_int_equal(umount(dir), 0);
	assert_int_equal(rmdir(dir), 0);
	fstype_table_free(&t);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_device_in_mountinfo),
		cmocka_unit_test(test_users_fuse_mount),
		cmocka_unit_test(test_users_fuse_mount_spelled_by_its_user),
		cmocka_unit_test(test_mount_table),
		cmocka_unit_test(test_mount_table_from_bytes),
		cmocka_unit_test(test_own_mount_table),
		cmocka_unit_test(test_own_mount_table_once),
		cmocka_unit_test(test_failed_statfs_asks_the_mount_table),
		cmocka_unit_test(test_table_of_a_file),
		cmocka_unit_test(test_table_read_again_after_a_mount),
		cmocka_unit_test(test_table_by_mount_id),
		cmocka_unit_test(test_table_over_the_cap),
		cmocka_unit_test(test_table_of_a_detached_mount),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
