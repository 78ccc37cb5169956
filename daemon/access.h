/*
 * access.h: who may attach a model (allow_users / allow_groups in the
 * configuration). A model's list is kept here; the registry asks it on
 * every ATTACH and HOLD with the peer's credentials (peercred.h). Root and
 * wcached's own user always may. Pure data: calls nothing but malloc.
 */
#ifndef WC_ACCESS_H
#define WC_ACCESS_H

#include <stddef.h>
#include <sys/types.h>

struct access_list {
	int restricted;   /* 0: everyone who reaches the socket */
	uid_t *uids;
	size_t n_uids;
	gid_t *gids;
	size_t n_gids;
};

/* Who asks: the peer's uid, primary gid and every supplementary group,
 * and the uid that always may (wcached's own). */
struct access_who {
	uid_t uid;
	gid_t gid;
	const gid_t *groups;
	int ngroups;
	uid_t self_uid;
};

/* Replaces a's lists with copies of these. 0, or -ENOMEM (a unchanged). */
int access_set(struct access_list *a, int restricted, const uid_t *uids, size_t n_uids,
	const gid_t *gids, size_t n_gids);

/* May who attach under a? */
int access_allows(const struct access_list *a, const struct access_who *who);

/* Frees a's lists; accepts an empty one. */
void access_clear(struct access_list *a);

#endif
