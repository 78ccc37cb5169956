/*
 * diracl.h: who else may write in a directory, as its access ACL tells
 * (system.posix_acl_access): the mode's group bits show only the ACL's
 * mask, so a directory of a user-private group with `setfacl -m
 * u:bob:rwx` looks like one only its owner may write in (review rev201 M1).
 */
#ifndef WC_DIRACL_H
#define WC_DIRACL_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/*
 * Whether the access ACL xattr value buf (len bytes, as the kernel gives
 * it: a little-endian version 2 header, then 8-byte entries of tag,
 * permissions and id) lets a named user other than owner, or a named
 * group, write: its entry has the write bit and the mask has it too (no
 * mask: the entry's own bits). 1 also where buf is not such a value (a
 * FUSE server's, or a future kernel's): it fails closed; 0 where no one
 * named may write.
 */
int diracl_named_write(const unsigned char *buf, size_t len, uid_t owner);

/*
 * st, the fstat of the directory open as fd (any descriptor, O_PATH too;
 * or -1 with path naming it, asked by name), with S_IWOTH added where its
 * access ACL lets a named user or group write (diracl_named_write): such a
 * directory counts as one all may write in. The ACL is read only where it
 * could change the verdict (the group may write, others may not); a
 * directory without one, or a local filesystem without POSIX ACLs, leaves
 * st as it is; an error reading it (but ENODATA, ENOTSUP: none), a value
 * past 4 KiB included, counts as others writing, and so does a network or
 * FUSE filesystem without POSIX ACLs (ENOTSUP), which may keep ACLs of
 * its own that the mode does not show (NFSv4, CIFS).
 */
void diracl_fold(int fd, const char *path, struct stat *st);

/* fstat(2) of the directory open as fd, then diracl_fold: 0 or -1 with errno. */
int diracl_fstat(int fd, struct stat *st);

/* stat(2) of path (following a link), then diracl_fold asked by that name:
 * 0 or -1 with errno. */
int diracl_stat(const char *path, struct stat *st);

#endif
