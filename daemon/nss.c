/*
 * nss.c: the user and group database, its buffers grown (see nss.h).
 */
#include "nss.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* The largest buffer an entry may need before the lookup gives up. */
#define NSS_BUFFER_MAX ((size_t)1 << 20)

enum nss_kind { NSS_UID, NSS_USER, NSS_GID, NSS_GROUP };

/* Whether a getpw*_r/getgr*_r error means "no such entry" (see the NOTES of
 * getpwnam(3): implementations use several codes for it). */
static int
not_found(int e)
{
	return e == 0 || e == ENOENT || e == ESRCH || e == EBADF || e == EPERM;
}

/*
 * One lookup of kind by name or id: the entry (struct passwd or struct
 * group) at the head of one allocation, its strings in the buffer after
 * it, which doubles from the size sysconf suggests while the database
 * says ERANGE, up to NSS_BUFFER_MAX.
 */
static void *
lookup(enum nss_kind kind, const char *name, unsigned id, int *err)
{
	int user = kind == NSS_UID || kind == NSS_USER;
	long hint = sysconf(user ? _SC_GETPW_R_SIZE_MAX : _SC_GETGR_R_SIZE_MAX);
	size_t head = user ? sizeof(struct passwd) : sizeof(struct group);
	size_t size = hint > 0 && (size_t)hint < NSS_BUFFER_MAX ? (size_t)hint : 16384;

	for (;;) {
		struct passwd *pw = NULL;
		struct group *gr = NULL;
		char *block = malloc(head + size), *buf;
		void *found;
		int e;

		if (block == NULL) {
			*err = ENOMEM;
			return NULL;
		}
		buf = block + head;
		switch (kind) {
		case NSS_UID:
			e = getpwuid_r((uid_t)id, (struct passwd *)(void *)block, buf, size, &pw);
			break;
		case NSS_USER:
			e = getpwnam_r(name, (struct passwd *)(void *)block, buf, size, &pw);
			break;
		case NSS_GID:
			e = getgrgid_r((gid_t)id, (struct group *)(void *)block, buf, size, &gr);
			break;
		default:
			e = getgrnam_r(name, (struct group *)(void *)block, buf, size, &gr);
			break;
		}
		found = pw != NULL ? (void *)pw : (void *)gr;
		if (found != NULL) {
			*err = 0;
			return block;
		}
		free(block);
		if (e == ERANGE && size < NSS_BUFFER_MAX) {
			size *= 2;
			continue;
		}
		*err = not_found(e) ? 0 : e;
		return NULL;
	}
}

struct passwd *
nss_user_by_uid(uid_t uid, int *err)
{
	return lookup(NSS_UID, NULL, uid, err);
}

struct passwd *
nss_user_by_name(const char *name, int *err)
{
	return lookup(NSS_USER, name, 0, err);
}

struct group *
nss_group_by_gid(gid_t gid, int *err)
{
	return lookup(NSS_GID, NULL, gid, err);
}

struct group *
nss_group_by_name(const char *name, int *err)
{
	return lookup(NSS_GROUP, name, 0, err);
}

int
nss_groups(const struct passwd *pw, gid_t **list, int *n)
{
	gid_t *groups = NULL;

	for (int want = 64;;) {
		gid_t *more = realloc(groups, (size_t)want * sizeof(*more));
		int got = want;

		if (more == NULL) {
			free(groups);
			return -ENOMEM;
		}
		groups = more;
		if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &got) >= 0) {
			*list = groups;
			*n = got;
			return 0;
		}
		/* got: how many there are now */
		want = got > want ? got : want * 2;
		if (want > NSS_MAX_GROUPS) {
			free(groups);
			return -E2BIG;
		}
	}
}
