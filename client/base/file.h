/*
 * file.h: opening and mapping one model file.
 *
 * A wc_file owns its descriptor and its mapping. Files are opened
 * O_RDONLY | O_CLOEXEC, must be regular files, and are mapped whole with
 * PROT_READ, MAP_PRIVATE | MAP_NORESERVE (an empty file has no mapping):
 * for reading that is the same page cache every other process maps, as
 * MAP_SHARED would be, and wc_model_cow() can make it copy-on-write.
 */
#ifndef WC_FILE_H
#define WC_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

struct wc_file {
	int fd;               /* -1 once closed or handed over */
	const uint8_t *base;  /* NULL for an empty file */
	uint64_t size;
	char *path;           /* as opened, for messages */
	struct stat st;       /* fstat at open, to detect in-place changes */
};

/* Opens, checks and maps path. On failure *out is untouched and the message
 * names the path. */
int file_open(const char *path, struct wc_file *out);

/* Maps an already open descriptor (taking ownership of fd on success only);
 * path is for messages. */
int file_from_fd(int fd, const char *path, struct wc_file *out);

/*
 * openat(2) with flags that create nothing (no O_CREAT, O_TMPFILE) and
 * fstat(2), tried again while a signal interrupts them: on a FUSE or NFS
 * mount a call waiting on the server fails with EINTR instead of being
 * restarted. Otherwise the call's result and errno. dir may be AT_FDCWD.
 */
int file_openat(int dir, const char *path, int flags);
int file_fstat(int fd, struct stat *st);

/*
 * The access ACL of the file open as fd (not O_PATH), as its bytes: one
 * fgetxattr of system.posix_acl_access, or where the filesystem keeps no
 * POSIX ACLs (ENOTSUP: NFS) of system.nfs4_acl (*nfs4 = 1). Returns 1 with
 * *value (malloc'd, *len bytes; the caller frees it) where it has one; 0
 * where it has none (ENODATA, ENOTSUP); -1 where that cannot be told (fd
 * -1, any other error, a value over FILE_ACL_MAX bytes, no memory). *value
 * is NULL and *len 0 but for 1.
 */
#define FILE_ACL_MAX 4096
int file_acl_value(int fd, unsigned char **value, size_t *len, int *nfs4);

/*
 * Reads exactly [off, off + len) of fd into a new malloc'd buffer (*out,
 * len bytes; the caller frees it), so a parser works on bytes nobody else
 * can change. len must lie in [min_len, max_len]; what names the bytes for
 * messages ("header", "shard index"). A read that ends early is -EIO "file
 * shrank while being read". Messages name path. *out is untouched on failure.
 */
int file_read_exact(int fd, const char *path, const char *what, uint64_t off, uint64_t len,
	uint64_t min_len, uint64_t max_len, uint8_t **out);

/*
 * The bytes of one model file that a format parser reads: private copies made
 * with file_read_exact(), never a mapping another process can write. head
 * holds file[0..head_len), tail the file's last tail_len bytes (for a
 * trailer); size is the file's size when it was opened. owned is what
 * file_bytes_free() frees (NULL when the caller owns the memory).
 */
struct file_bytes {
	const uint8_t *head;
	size_t head_len;
	const uint8_t *tail;
	size_t tail_len;
	uint64_t size;
	uint8_t *owned;
};

/* Most bytes a tail holds (the WEIG trailer is 16). */
#define FILE_TAIL_MAX 16

/* Bytes read first, to detect a format and its header length. */
#define FILE_PROBE_LEN 65536

/*
 * How many head bytes a format's parser needs, from the first len bytes of a
 * file of size bytes (len == min(size, FILE_PROBE_LEN)). Returns a value in
 * [len, size] (len when the prefix says nothing useful: the parser explains).
 */
typedef uint64_t (*file_head_fn)(const uint8_t *prefix, size_t len, uint64_t size);

/*
 * Reads the head (as much as need says, at most max_head bytes) and the tail
 * of f into *out. On failure *out is untouched and the message names f.
 */
int file_read_bytes(const struct wc_file *f, file_head_fn need, uint64_t max_head,
	struct file_bytes *out);

/* A whole file image already in the caller's memory as file bytes (tests,
 * fuzzers, converters): nothing is copied and nothing owned. */
struct file_bytes file_bytes_of(const uint8_t *data, uint64_t size);

/* Frees what out owns; safe on a zeroed one. */
void file_bytes_free(struct file_bytes *b);

/*
 * Checks that f still has the size and modification time it had when it was
 * opened: -ESTALE "file changed while being read" otherwise. Called after a
 * parse, so a file written in place during a load fails that load.
 */
int file_check_unchanged(const struct wc_file *f);

/*
 * Did the ctime of a file move from then's to now's while its link count
 * stayed? A writer can put the mtime back (utimensat(2)) but never the
 * ctime, which every write and every utimensat sets to the present; a link
 * added or removed (a rename over the file's path drops one) moves it too,
 * and is no write. chmod, chown and a rename of the file itself move it
 * alone, and count (README, "Updating a model": replace files by rename,
 * do not change them).
 */
bool file_ctime_moved(const struct stat *then, const struct stat *now);

/* Was the file whose stat at open was then written in place, as now (the
 * same inode's) shows: its size or mtime moved, or file_ctime_moved? */
bool file_written_in_place(const struct stat *then, const struct stat *now);

/*
 * Did only the link count of a file move, as now (the same inode's) shows
 * against then: the same dev and inode, size and mtime, a link count that
 * changed (neither zero) and a ctime that moved. A hard link added or
 * removed beside the file cannot be told from a write with its mtime put
 * back in the same interval (the write's ctime hides behind the link's):
 * file_written_in_place says neither, and wcached loads the files again,
 * validated anew (README, "Updating a model safely"). Never a refusal.
 */
bool file_links_moved(const struct stat *then, const struct stat *now);

/* A file time as nanoseconds since the epoch; times past the year 2262 (or
 * before 1678) saturate to INT64_MAX (INT64_MIN) instead of overflowing. */
int64_t file_time_ns(const struct timespec *t);

/* The last component of path, as a model's index records its files. */
const char *file_basename(const char *path);

/* Whether name ends in suffix with at least one byte before it (a file
 * named only ".json" has no extension). */
bool file_has_suffix(const char *name, const char *suffix);

/* Unmaps and closes (fd -1 means handed over); safe on a zeroed or
 * already closed file. */
void file_close(struct wc_file *f);

#endif
