/*
 * nss.h: the user and group database (getpwuid_r and its siblings), each
 * entry in one allocation whose buffer grows while the database says
 * ERANGE. The database may be a network's (LDAP, SSSD): call these off the
 * loop thread, or at start-up.
 */
#ifndef WC_NSS_H
#define WC_NSS_H

#include <grp.h>
#include <pwd.h>
#include <sys/types.h>

/* The most groups a user's list holds: the kernel's NGROUPS_MAX. */
#define NSS_MAX_GROUPS 65536

/*
 * The entry of uid, of a user's name, of gid or of a group's name, in one
 * allocation the caller frees with free(). NULL with *err 0 where there is
 * no such entry (any of the codes getpwnam(3)'s NOTES list for "not
 * found"), or the error: ENOMEM, an entry larger than 1 MiB (ERANGE), or
 * the database's own (EIO, ...).
 */
struct passwd *nss_user_by_uid(uid_t uid, int *err);
struct passwd *nss_user_by_name(const char *name, int *err);
struct group *nss_group_by_gid(gid_t gid, int *err);
struct group *nss_group_by_name(const char *name, int *err);

/*
 * pw's groups, as getgrouplist(3) tells them (its primary group first, then
 * every group that lists it): 0 with *list (allocated, the caller frees it)
 * and *n; -ENOMEM, or -E2BIG where it is in more than NSS_MAX_GROUPS.
 */
int nss_groups(const struct passwd *pw, gid_t **list, int *n);

#endif
