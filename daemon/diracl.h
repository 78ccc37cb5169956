/*
 * diracl.h: who else may write in a directory, as its access ACL tells
 * (system.posix_acl_access): the mode's group bits show only the ACL's
 * mask, so a directory of a user-private group with `setfacl -m
 * u:bob:rwx` looks like one only its owner may write in (review rev201 M1).
 * On NFS, its NFSv4 ACL (system.nfs4_acl), which the mode need not show
 * at all (review rev212 M1).
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
 * Whether the NFSv4 ACL xattr value buf (system.nfs4_acl, len bytes, as
 * the Linux NFS client gives the server's ACL: XDR, big-endian 4-byte
 * words: the ACEs' count, then per ACE its type, flag, access mask and
 * who's length, and who's bytes padded to 4) lets a who other than OWNER@
 * add or remove entries in the directory: an ALLOW ACE (type 0) that
 * applies to the directory itself (flag without INHERIT_ONLY, 0x8) with
 * ADD_FILE (0x2), ADD_SUBDIRECTORY (0x4) or DELETE_CHILD (0x40). DENY
 * ACEs are not weighed (an ALLOW counts wherever it stands). 1 also where
 * buf is not such a value (a count or a who past its end, bytes after the
 * last ACE): the server's bytes fail closed; 0 where only OWNER@ may.
 */
int diracl_nfs4_write(const unsigned char *buf, size_t len);

/*
 * st, the fstat of the directory open as fd (any descriptor, O_PATH too;
 * or -1 with path naming it, asked by name), with S_IWOTH added where its
 * access ACL lets a named user or group write (diracl_named_write): such a
 * directory counts as one all may write in. A directory without an ACL,
 * or a local filesystem without POSIX ACLs, leaves st as it is; an error
 * reading it (but ENODATA, ENOTSUP: none), a value past 4 KiB included,
 * counts as others writing where the group may write (the mask, which
 * the group bits show, is what lets a named entry write).
 *
 * A filesystem without POSIX ACLs (ENOTSUP) may keep an ACL of its own
 * that the mode does not show. On NFS (statfs says so, or cannot tell)
 * the NFSv4 ACL (system.nfs4_acl) is read whatever the mode: others write
 * where it lets them (diracl_nfs4_write) or where it cannot be read (any
 * error, a value past 4 KiB included). Where there is none (ENODATA,
 * ENOTSUP: NFSv3, a v4 server without ACLs, which checks the mode), and
 * on CIFS and FUSE, a directory its group may write in counts as one
 * others write in, and one it may not is trusted as its mode looks
 * (README: CIFS mounted noperm, a FUSE server that ignores the mode)
 * (review rev211 M1, rev212 M1).
 */
void diracl_fold(int fd, const char *path, struct stat *st);

/* fstat(2) of the directory open as fd, then diracl_fold: 0 or -1 with errno. */
int diracl_fstat(int fd, struct stat *st);

#endif
