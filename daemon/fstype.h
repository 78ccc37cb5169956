/*
 * fstype.h: which filesystem a model's files are on, and what wcached does
 * about it (README, "Models on shared storage").
 *
 * On a local filesystem this host's kernel makes every change, so inotify
 * sees every update, and a file replaced by rename(2) lives on as long as
 * wcached holds it open. On a network filesystem (NFS, SMB, Lustre, GPFS,
 * CephFS, 9p, AFS...) or a FUSE one (object stores, virtiofs, sshfs)
 * another host can replace a file: no inotify event says so, and the old
 * file's pages that are not cached here may become unreadable (ESTALE, EIO;
 * SIGBUS to a process that touches them through a mapping). Such a file
 * system is "remote" here: wcached polls its paths (watch = auto) and
 * copies the model to local disk before serving it (stage = auto).
 */
#ifndef WC_FSTYPE_H
#define WC_FSTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A filesystem as statfs(2) names it. */
struct fs_info {
	unsigned long magic;  /* f_type */
	char name[16];        /* "ext4", "nfs", "fuse", or "0x1234abcd" when unknown */
	/* The type as the mount table names it ("nfs4", "fuse.sshfs",
	 * "fuseblk"; cut at 31 bytes), for lines naming a mount (review
	 * rev221 L3); "" from statfs. */
	char type[32];
	bool remote;          /* a network or FUSE filesystem (see above) */
	bool known;           /* a type fstype.c knows (name is not its magic) */
	/* A FUSE mount a user made (fusermount3: mountinfo's super options say
	 * user_id=UID, not 0), and that user: the mount table's only (0 and
	 * false from statfs). A FUSE line whose user_id cannot be read is a
	 * user's too, mounter (uid_t)-1: fails closed. */
	bool user_mount;
	uid_t mounter;
};

/* Classifies statfs's f_type. */
void fstype_classify(unsigned long magic, struct fs_info *out);

/* fstatfs(fd) classified; where fstatfs fails, the mount table's entry for
 * the device fstat gives (fstype_of_dev). 0, or fstatfs's -errno when both
 * fail (out then says "unknown", local). */
int fstype_of_fd(int fd, struct fs_info *out);

/* Classifies a filesystem type as mountinfo names it ("nfs4", "ext4",
 * "fuse.sshfs", "virtiofs"). */
void fstype_classify_name(const char *type, struct fs_info *out);

/*
 * The filesystem whose device is dev, as the mount table mountinfo
 * (/proc/self/mountinfo) lists it: asks no filesystem, so it answers while
 * a network filesystem's server hangs (statfs would wait for it). 0,
 * -ENOENT when no mount has that device (btrfs gives its files a device of
 * their own, not the mount's), or -errno opening mountinfo (-ENOMEM).
 * Reads the whole table: to ask about many devices, read it once
 * (fstype_mounts_read) and ask it (fstype_mounts_find).
 */
int fstype_of_dev(const char *mountinfo, dev_t dev, struct fs_info *out);

/* The mount table as mountinfo lists it, classified: one entry per line
 * that names a mount ID, a device and a filesystem type, in mountinfo's
 * order. */
struct fs_mount {
	uint64_t id;       /* the line's mount ID, its first field (statx's stx_mnt_id) */
	dev_t dev;         /* the line's major:minor */
	struct fs_info fs; /* its filesystem type, classified (fstype_classify_name) */
};
struct fs_mounts {
	struct fs_mount *mounts;
	size_t n;
	size_t cap; /* entries mounts has room for */
};

/* Reads mountinfo into *out, which then owns what it holds (freed by
 * fstype_mounts_free). 0, or -errno opening or reading it, or -ENOMEM (a
 * table over FS_MOUNTINFO_MAX too); *out is untouched on failure. Asks no
 * filesystem, as fstype_of_dev(). */
int fstype_mounts_read(const char *mountinfo, struct fs_mounts *out);
/* The most of a mount table read (every reader's): 64 MiB, some 200,000
 * mounts' lines; a namespace with more is refused, not read into memory
 * without end. */
#define FS_MOUNTINFO_MAX ((size_t)64 << 20)

/* Adds to t the mounts of the mountinfo lines in text, len bytes, not
 * terminated (a NUL ends its line early, as it ends a C string): what
 * fstype_mounts_read() does with each line it reads; the fuzzer
 * (tests/fuzz/fuzz_kernel.c) gives it whole files. 0, or -ENOMEM with t
 * holding the mounts of the lines before (t's to free either way). */
int fstype_mounts_add(struct fs_mounts *t, const char *text, size_t len);

/* What fstype_of_dev() says of dev for the mountinfo t was read from: the
 * first mount with that device. 0, or -ENOENT. */
int fstype_mounts_find(const struct fs_mounts *t, dev_t dev, struct fs_info *out);

/* The filesystem of the mount whose mount ID is id, in t: 0, or -ENOENT
 * where no line has that ID. A mount ID names one mount while it exists
 * (the kernel gives it to another only once it is gone), where a device
 * may be no line's: a btrfs subvolume's files have a device of their own
 * but their mount's ID. */
int fstype_mounts_find_id(const struct fs_mounts *t, uint64_t id, struct fs_info *out);

/* Frees what t holds and empties it; an empty one (or NULL) is fine. */
void fstype_mounts_free(struct fs_mounts *t);

/*
 * The mount table for a run of questions by one thread (a poll's walks of
 * a model's paths): read once, and read again only when the kernel says
 * the mount namespace changed since. The table file stays open, and
 * poll(2) on it gives POLLPRI once a mount or unmount changed the
 * namespace's mounts after it was opened (proc(5), /proc/PID/mounts):
 * then a device the table lists may be another filesystem's now (anonymous
 * device numbers are handed out again), and one it does not list may be
 * mounted. Where poll cannot tell, the table is read again. A device or
 * mount ID the table does not list is asked once more after one reading
 * again (a mount made between the reading and the walk), once per table.
 */
struct fs_table {
	const char *mountinfo; /* the table's file: /proc/self/mountinfo */
	int fd;                /* it, open since mounts was read; -1 before */
	struct fs_mounts mounts;
	bool missed;           /* read again for a device or ID it did not list */
	unsigned reads;        /* how often it was read (the unit tests') */
};
#define FS_TABLE_INIT(file) { .mountinfo = (file), .fd = -1 }

/* What fstype_of_dev() says of dev, from t (read, or read again, as
 * above). 0, -ENOENT (no mount has that device), or -errno reading the
 * table (-ENOMEM, -EMFILE; -EIO where it is missing). */
int fstype_table_find(struct fs_table *t, dev_t dev, struct fs_info *out);

/* The same for the mount whose mount ID is id (fstype_mounts_find_id):
 * -ENOENT where no line has it after the one reading again, a mount that
 * is gone (unmounted, or detached with umount -l) since its ID was told. */
int fstype_table_find_id(struct fs_table *t, uint64_t id, struct fs_info *out);

/* Closes t's file and frees its table; t is then as FS_TABLE_INIT made it. */
void fstype_table_free(struct fs_table *t);

/* How a model's files are watched for updates (the "watch" key). */
enum fs_watch {
	FS_WATCH_AUTO = 0, /* inotify, plus polling on a remote filesystem */
	FS_WATCH_INOTIFY,  /* inotify only */
	FS_WATCH_POLL,     /* inotify, plus polling wherever the files are */
};

/* Whether a model is copied to local disk before it is served ("stage"). */
enum fs_stage {
	FS_STAGE_AUTO = 0, /* yes on a remote filesystem, no on a local one */
	FS_STAGE_YES,
	FS_STAGE_NO,
};

/* "auto", "inotify", "poll" / "auto", "yes", "no": 0, or -EINVAL. */
int fs_watch_parse(const char *s, enum fs_watch *out);
int fs_stage_parse(const char *s, enum fs_stage *out);
const char *fs_watch_name(enum fs_watch w);
const char *fs_stage_name(enum fs_stage s);

#endif
