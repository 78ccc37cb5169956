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
 * A file's access ACL, as diracl_file_acl read it: kind DIRACL_NONE (the
 * mode tells all), DIRACL_POSIX (value: system.posix_acl_access's bytes),
 * DIRACL_NFS4 (value: system.nfs4_acl's) or DIRACL_UNTOLD (one that could
 * not be read: no one but the owner reads by it).
 */
enum diracl_kind { DIRACL_NONE, DIRACL_POSIX, DIRACL_NFS4, DIRACL_UNTOLD };

struct diracl_value {
	enum diracl_kind kind;
	size_t len;
	unsigned char *value; /* malloc'd, len bytes; NULL but for POSIX, NFS4 */
};

/*
 * Reads the access ACL of the file open as fd (not O_PATH) into *acl: one
 * fgetxattr of system.posix_acl_access; where the filesystem has no POSIX
 * ACLs (ENOTSUP), one of system.nfs4_acl (NFS). None where neither is
 * there (ENODATA, ENOTSUP); DIRACL_UNTOLD on any other error, a value past
 * 4 KiB or no memory. diracl_value_free frees what it read.
 */
void diracl_file_acl(int fd, struct diracl_value *acl);
/* The kind of an ACL file_acl_value (base/file.h) answered state and nfs4
 * for (an index's, model_source's index_acl_value). */
enum diracl_kind diracl_kind_of(int state, int nfs4);
void diracl_value_free(struct diracl_value *acl);

/*
 * Whether uid, in the groups gids (ngids of them), may read the file whose
 * fstat is st by its access ACL acl, as the kernel checks it (review rev226
 * H1): a POSIX ACL (POSIX.1e): uid the owner, the owner's entry; a named
 * user entry for uid, its bits and the mask's; else where any group entry
 * (the owning group's or a named one) matches one of gids, whether one of
 * those grants read (through the mask); else the other entry. An NFSv4 ACL:
 * its ACEs in order (ALLOW and DENY, not INHERIT_ONLY, with READ_DATA):
 * OWNER@ matches the owner, GROUP@ the owning group's members, EVERYONE@
 * anyone; the first that matches decides, none denies; an ACE naming a
 * user or group (alice@dom) before it cannot be told and denies. DIRACL_NONE
 * asks the mode's classes as the kernel does. 0 also for a value that is
 * not such an ACL (ragged, another version, a base entry or the mask twice,
 * a base entry missing, an unknown tag) and for DIRACL_UNTOLD: it fails closed.
 */
int diracl_may_read(const struct diracl_value *acl, const struct stat *st, uid_t uid,
	const gid_t *gids, int ngids);

/*
 * Whether every user but the file's owner may read it (gid (gid_t)-1), or
 * every member of the group gid, by acl (diracl_may_read's rules): a POSIX
 * ACL's named users all read; gid's group entry reads, or no group entry
 * names gid and every group entry and the other entry read (everyone: all
 * group entries and the other). An NFSv4 ACL: an EVERYONE@ ALLOW (or, for
 * gid the owning group, a GROUP@ one) before any DENY that may match. 0
 * where the ACL cannot be told.
 */
int diracl_all_read(const struct diracl_value *acl, const struct stat *st, gid_t gid);

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
