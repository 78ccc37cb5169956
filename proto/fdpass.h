/*
 * fdpass.h: sending and receiving one message with descriptors (SCM_RIGHTS).
 *
 * Ownership: fdp_send() never takes ownership of the descriptors it sends;
 * the caller closes its copies. fdp_recv() passes the responsibility for
 * every descriptor it returns to the caller; descriptors it does not return
 * (too many, a truncated message, a cmsg of another kind) it closes.
 */
#ifndef WC_FDPASS_H
#define WC_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* Sends len bytes and nfds descriptors as one message (MSG_NOSIGNAL).
 * Returns the bytes sent or a negative errno (-EAGAIN when it would block;
 * -EINVAL for len 0, which SEQPACKET peers cannot tell from end of stream,
 * nfds > WIRE_MAX_FDS, or fds NULL with nfds > 0). */
ssize_t fdp_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds);

/*
 * Receives one message into buf (cap bytes) and up to maxfds descriptors
 * (MSG_CMSG_CLOEXEC). Returns the message length, 0 at end of stream, or a
 * negative errno: -EAGAIN, -EMSGSIZE when the message was longer than cap
 * (MSG_TRUNC), -EBADMSG when descriptors were cut (MSG_CTRUNC) or more than
 * maxfds arrived, or another recvmsg error. On any error no descriptor is
 * returned (all received ones were closed) and the outputs are untouched.
 * An empty packet reads as 0 with its descriptors closed. maxfds 0 with fds
 * NULL is allowed.
 */
ssize_t fdp_recv(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds);

/* Closes n descriptors and sets them to -1. */
void fdp_close_all(int *fds, size_t n);

#endif
