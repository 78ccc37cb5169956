/*
 * fdpass.h: sending and receiving one message with descriptors (SCM_RIGHTS).
 *
 * Ownership: fdp_send() and fdp_sendto() never take ownership of the
 * descriptors they send; the caller closes its copies. fdp_recv() passes the responsibility for
 * every descriptor it returns to the caller; descriptors it does not return
 * (too many, a truncated message, an empty packet) it closes, or hands to the
 * caller's drop function (fdp_recv_drop()).
 */
#ifndef WC_FDPASS_H
#define WC_FDPASS_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

/* The most descriptors one sendmsg() may carry: Linux's SCM_MAX_FD. */
#define FDP_MAX_FDS 253u

/* Sends len bytes and nfds descriptors as one message (MSG_NOSIGNAL).
 * Returns the bytes sent or a negative errno (-EAGAIN when it would block;
 * -EINVAL for len 0, which SEQPACKET peers cannot tell from end of stream,
 * nfds > WIRE_MAX_FDS, or fds NULL with nfds > 0). */
ssize_t fdp_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds);

/*
 * fdp_send() with the caller's limit on descriptors and an optional
 * destination: sends len bytes and nfds (at most maxfds, itself at most
 * FDP_MAX_FDS) descriptors as one message to the address to (tolen bytes),
 * or on the connected socket when to is NULL and tolen 0. The socket's own
 * mode decides whether it may block: a non-blocking socket returns -EAGAIN.
 * fdp_send() is fdp_sendto(sock, buf, len, fds, nfds, WIRE_MAX_FDS, NULL, 0);
 * the service manager's fd store (a datagram socket) takes FDP_MAX_FDS.
 * Returns as fdp_send(), and -EINVAL also for maxfds > FDP_MAX_FDS or an
 * address without its length (or a length without an address).
 */
ssize_t fdp_sendto(int sock, const void *buf, size_t len, const int *fds, size_t nfds,
	size_t maxfds, const struct sockaddr *to, socklen_t tolen);

/*
 * Receives one message into buf (cap bytes) and up to maxfds descriptors
 * (MSG_CMSG_CLOEXEC). Returns the message length, 0 at end of stream, or a
 * negative errno: -EAGAIN, -EMSGSIZE when the message was longer than cap
 * (MSG_TRUNC), -EMFILE when descriptors were cut off (MSG_CTRUNC: this
 * process could not take them), -EBADMSG when more than maxfds arrived, or
 * another recvmsg error. On any error no descriptor is
 * returned (all received ones were closed) and the outputs are untouched.
 * An empty packet reads as 0 with its descriptors closed. maxfds 0 with fds
 * NULL is allowed.
 */
ssize_t fdp_recv(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds);

/*
 * fdp_recv(), except that every descriptor it would close it hands to
 * drop(fd, arg) instead, which takes it (close() when drop is NULL). A
 * descriptor the peer chose can take long to close (a lingering socket, a
 * file on a hung FUSE server): a daemon closes them on another thread.
 */
typedef void (*fdp_drop_fn)(int fd, void *arg);
ssize_t fdp_recv_drop(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds,
	fdp_drop_fn drop, void *arg);

/*
 * fdp_send() and fdp_recv(), except that a sendmsg or recvmsg that a signal
 * interrupts returns -EINTR instead of starting again: for a blocking
 * socket with a timeout (SO_SNDTIMEO, SO_RCVTIMEO), which each restart
 * would start over, so that a signal coming more often than the timeout
 * (a worker's interval timer) would make the wait endless. The caller
 * waits for what is left of its own deadline and calls again.
 */
ssize_t fdp_send_intr(int sock, const void *buf, size_t len, const int *fds, size_t nfds);
ssize_t fdp_recv_intr(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds);

/* Closes n descriptors and sets them to -1. */
void fdp_close_all(int *fds, size_t n);

#endif
