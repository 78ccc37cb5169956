/*
 * peercred.c: the credentials of a unix socket's peer, and whether it has
 * gone (see peercred.h).
 *
 * SO_PEERGROUPS copies at most the buffer's length of groups and, when the
 * peer has more, fails with ERANGE and sets the length to what it needs:
 * the buffer then grows to that and the call is made again. The groups are
 * the ones the peer had when it connected, so they cannot grow between the
 * two calls; the loop is bounded all the same.
 */
#include "peercred.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/error.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13; older headers lack it */
#endif

/* Groups asked for first: most processes have a few. */
#define FIRST_GROUPS 64u
/* Attempts at reading the groups: the first, and one per growth. */
#define GROUP_ATTEMPTS 4

/* Reads SO_PEERGROUPS of fd into a new array of *n groups. */
static int
read_groups(int fd, gid_t **out, size_t *n)
{
	size_t cap = FIRST_GROUPS;
	gid_t *groups = NULL;

	for (int attempt = 0; attempt < GROUP_ATTEMPTS; attempt++) {
		socklen_t len = (socklen_t)(cap * sizeof(gid_t));
		gid_t *g = realloc(groups, cap * sizeof(gid_t));

		if (g == NULL) {
			free(groups);
			return error_set(-ENOMEM, "peer credentials: out of memory for %zu groups",
				cap);
		}
		groups = g;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
			if (len % sizeof(gid_t) != 0 || len > cap * sizeof(gid_t)) {
				free(groups);
				return error_set(-EPROTO, "peer credentials: SO_PEERGROUPS "
					"returned %u bytes", (unsigned)len);
			}
			*n = len / sizeof(gid_t);
			if (*n == 0) {
				free(groups);
				groups = NULL;
			}
			*out = groups;
			return 0;
		}
		if (errno != ERANGE || len <= cap * sizeof(gid_t)) {
			int e = errno;

			free(groups);
			return error_set(-e, "peer credentials: SO_PEERGROUPS: %s", strerror(e));
		}
		if (len / sizeof(gid_t) > PEER_MAX_GROUPS) {
			free(groups);
			return error_set(-E2BIG, "peer credentials: the peer has %zu supplementary "
				"groups, more than %u", (size_t)len / sizeof(gid_t),
				PEER_MAX_GROUPS);
		}
		cap = (len + sizeof(gid_t) - 1) / sizeof(gid_t);
	}
	free(groups);
	return error_set(-EAGAIN, "peer credentials: SO_PEERGROUPS kept growing");
}

int
peer_read(int fd, struct peer_cred *out)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	gid_t *groups = NULL;
	size_t n = 0;
	int err;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1)
		return error_set(-errno, "peer credentials: SO_PEERCRED: %s", strerror(errno));
	if (len != sizeof(cred))
		return error_set(-EPROTO, "peer credentials: SO_PEERCRED returned %u bytes",
			(unsigned)len);
	if ((err = read_groups(fd, &groups, &n)) < 0)
		return err;
	*out = (struct peer_cred){ .pid = cred.pid, .uid = cred.uid, .gid = cred.gid,
		.groups = groups, .ngroups = n };
	return 0;
}

int
peer_in_group(const struct peer_cred *c, gid_t gid)
{
	if (c->gid == gid)
		return 1;
	for (size_t i = 0; i < c->ngroups; i++)
		if (c->groups[i] == gid)
			return 1;
	return 0;
}

bool
peer_departed(int fd)
{
	struct pollfd p = { .fd = fd };

	if (fd < 0)
		return false;
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) != 0;
}

void
peer_cred_free(struct peer_cred *c)
{
	if (c == NULL)
		return;
	free(c->groups);
	*c = (struct peer_cred){ 0 };
}
