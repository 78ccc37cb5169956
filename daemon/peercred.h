/*
 * peercred.h: who is at the other end of a unix stream socket, as the
 * kernel recorded it when the peer connected: SO_PEERCRED (pid, uid, gid)
 * and every supplementary group (SO_PEERGROUPS). The one reader of peer
 * credentials for the client socket (server.c) and the control socket
 * (control.c), so that both see the same groups: a peer in more groups than
 * a fixed buffer holds is not a peer without groups. Also the one answer
 * both give to whether a peer that is not read has gone (peer_departed).
 */
#ifndef WC_PEERCRED_H
#define WC_PEERCRED_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The most supplementary groups a process can have (the kernel's
 * NGROUPS_MAX): a peer that reports more is refused, not truncated. */
#define PEER_MAX_GROUPS 65536u

struct peer_cred {
	pid_t pid;
	uid_t uid;
	gid_t gid;         /* primary group */
	gid_t *groups;     /* supplementary groups, malloc'd (NULL when none) */
	size_t ngroups;
};

/*
 * Reads the credentials of fd's peer into *out: SO_PEERCRED, then
 * SO_PEERGROUPS into a buffer that grows as the kernel asks (ERANGE) up to
 * PEER_MAX_GROUPS entries. 0, or a negative errno with the reason in
 * error_get() (-E2BIG past PEER_MAX_GROUPS, -ENOMEM); *out is untouched on
 * failure. out->groups is the caller's: peer_cred_free() it.
 */
int peer_read(int fd, struct peer_cred *out);

/* Is gid the peer's primary group or one of its supplementary groups? */
int peer_in_group(const struct peer_cred *c, gid_t gid);

/*
 * Whether the peer of fd, a connected unix stream socket, has gone: its
 * socket closed, which poll() reports as POLLHUP whatever is asked for
 * (with POLLERR when it left data of ours unread). A peer that only shut
 * its end for writing (shutdown(SHUT_WR): POLLIN|POLLRDHUP) has not gone:
 * it still reads what it is sent. Does not block; false for a negative fd.
 */
bool peer_departed(int fd);

/* Frees what peer_read() allocated and zeroes *c. Accepts NULL. */
void peer_cred_free(struct peer_cred *c);

#endif
