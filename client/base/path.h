/*
 * path.h: the path and descriptor helpers every product shares: joining a
 * name to a directory, the directory part of a path, the name of a file's
 * type, writing a whole buffer to a descriptor, and a memfd filled and
 * sealed in one call. One
 * definition each, so the daemon, the formats, the library and wcachectl do
 * not each keep their own.
 */
#ifndef WC_PATH_H
#define WC_PATH_H

#include <stddef.h>
#include <sys/types.h>

/*
 * dir/name in a malloc'd string (NULL when out of memory). An absolute name
 * is copied as is; leading "./" components of name are dropped, and an
 * empty name or "." is dir itself. dir "" is the current directory: the
 * result is name alone.
 */
char *path_join(const char *dir, const char *name);

/* The directory part of path in a malloc'd string: "" when path has no
 * slash (the current directory), "/" for a file in the root; NULL when out
 * of memory. */
char *path_dir(const char *path);

/* The next name of the path text *p (a walk's, one name at a time): the
 * slashes before it skipped, copied into name (room for NAME_MAX + 1),
 * *p past it. 1, 0 where the text ends (no name), or -ENAMETOOLONG where
 * the name is longer than NAME_MAX (*p then past the slashes only). */
int path_next_name(const char **p, char *name);

/* What a file of type mode (st_mode) is, for messages: "a regular file",
 * "a directory", "a FIFO", "a socket", ... ("not a regular file (a FIFO)",
 * "is not a socket (a regular file)"). */
const char *path_file_kind(mode_t mode);

/* Writes all of buf[0..len) to fd, retrying after EINTR and short writes.
 * 0, or a negative errno (-EIO when write returns 0). */
int fd_write_all(int fd, const void *buf, size_t len);

/*
 * Another open file description of the file open as fd, read-only: an
 * open(2) of /proc/self/fd/FD, which reaches the same inode even after it
 * was renamed over or unlinked, checked to be that inode (dev and ino) and
 * a regular file. Flags or an offset set on one description never reach the
 * other. Returns the descriptor (close-on-exec, the caller's), or a
 * negative errno with the message naming what as the thing reopened.
 */
int fd_reopen_read_only(int fd, const char *what);

/*
 * A memfd named name holding a copy of buf[0..len) (len zero bytes when buf
 * is NULL), sealed with seals
 * (F_SEAL_* from proto/memfds.h), with mode applied first when mode is not
 * 0 (a mode such as 0600 must be set before F_SEAL_SEAL is). Returns the
 * descriptor (close-on-exec, the caller's), or a negative errno with the
 * message naming what failed ("memfd_create", "writing", "sealing").
 */
int memfd_sealed(const char *name, const void *buf, size_t len, int seals, unsigned mode);

#endif
