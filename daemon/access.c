/*
 * access.c: a model's allow_users / allow_groups lists and the check made
 * on every attach (see access.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"

int
access_set(struct access_list *a, int restricted, const uid_t *uids, size_t n_uids,
	const gid_t *gids, size_t n_gids)
{
	uid_t *u = NULL;
	gid_t *g = NULL;

	if ((n_uids > 0 && (u = malloc(n_uids * sizeof(*u))) == NULL) ||
		(n_gids > 0 && (g = malloc(n_gids * sizeof(*g))) == NULL)) {
		free(u);
		return -ENOMEM;
	}
	if (n_uids > 0)
		memcpy(u, uids, n_uids * sizeof(*u));
	if (n_gids > 0)
		memcpy(g, gids, n_gids * sizeof(*g));
	access_clear(a);
	a->restricted = restricted;
	a->uids = u;
	a->n_uids = n_uids;
	a->gids = g;
	a->n_gids = n_gids;
	return 0;
}

int
access_allows(const struct access_list *a, const struct access_who *who)
{
	if (!a->restricted || who->uid == 0 || who->uid == who->self_uid)
		return 1;
	for (size_t i = 0; i < a->n_uids; i++)
		if (a->uids[i] == who->uid)
			return 1;
	for (size_t i = 0; i < a->n_gids; i++) {
		if (a->gids[i] == who->gid)
			return 1;
		for (int k = 0; k < who->ngroups; k++)
			if (a->gids[i] == who->groups[k])
				return 1;
	}
	return 0;
}

void
access_clear(struct access_list *a)
{
	free(a->uids);
	free(a->gids);
	a->uids = NULL;
	a->gids = NULL;
	a->n_uids = a->n_gids = 0;
	a->restricted = 0;
}
