/*
 * listen.h: creating wcached's listening Unix sockets (client and control).
 */
#ifndef WC_LISTEN_H
#define WC_LISTEN_H

#include <sys/types.h>

/*
 * Creates, binds and listens on a non-blocking socket of type (SOCK_STREAM,
 * SOCK_SEQPACKET) at path, with mode and, unless group is (gid_t)-1, that
 * group. A stale socket file (nobody accepts on it) is replaced; a live
 * daemon on the path is -EADDRINUSE; any other file there is -EEXIST.
 * Returns the descriptor, or -errno with the message in error_get().
 */
int listen_unix(const char *path, int type, mode_t mode, gid_t group);

#endif
