/*
 * fdpass.c: sending and receiving one message with descriptors over a Unix
 * socket (SCM_RIGHTS), for the wcache client protocol and for the daemon's
 * datagrams to the service manager's fd store (fdp_sendto() with an address).
 *
 * The protocol runs on SOCK_SEQPACKET, so one sendmsg() is one message and
 * the descriptors sent with it arrive with it or not at all. What can still
 * go wrong is on the receiving side: a message longer than the buffer
 * (MSG_TRUNC), more descriptors than the caller expects, or control messages
 * of another kind. The control buffer holds as many descriptors as one
 * message can carry, so when the kernel cuts them off (MSG_CTRUNC) it is
 * the receiver that could not take them: its descriptor table is full, or
 * a security module refused one. That is not the sender's fault and has its
 * own code, -EMFILE. Every descriptor the kernel
 * installs is owned by fdp_recv() until it hands it to the caller, so on
 * every error path it closes all of them (or hands them to the caller's drop
 * function): a hostile peer cannot make us leak descriptors.
 *
 * No libuv, no error_set(): only negative errno codes, as the rest of proto/.
 */
#include "proto/fdpass.h"
#include "proto/wire.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * The receive control buffer: room for as many descriptors as the kernel
 * lets one message carry (FDP_MAX_FDS) and for a credentials message (a
 * socket with SO_PASSCRED gets one with every message). So every descriptor
 * a peer sends is installed, and closed where the caller of fdp_recv_drop()
 * chooses: one that did not fit would be released by the kernel inside
 * recvmsg(), in the receiving thread, where its last close may block (a
 * lingering socket). More than the caller expects is still an error.
 */
#define FDP_CONTROL_SIZE (CMSG_SPACE(sizeof(int) * FDP_MAX_FDS) + CMSG_SPACE(sizeof(struct ucred)))

/* The most descriptors one recvmsg() can install with that buffer. */
#define FDP_RECV_MAX (FDP_CONTROL_SIZE / sizeof(int))

union fdp_control {
	struct cmsghdr align;
	unsigned char buf[FDP_CONTROL_SIZE];
};

/* The send control buffer: room for the most descriptors any caller may
 * pass (the client protocol's WIRE_MAX_FDS is fewer). */
_Static_assert(WIRE_MAX_FDS <= FDP_MAX_FDS, "the wire's limit exceeds the kernel's");

union fdp_send_control {
	struct cmsghdr align;
	unsigned char buf[CMSG_SPACE(sizeof(int) * FDP_MAX_FDS)];
};

/*
 * Sends len bytes and nfds descriptors (at most WIRE_MAX_FDS) as one message
 * on a connected socket: fdp_sendto() with the client protocol's limit.
 */
ssize_t
fdp_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds)
{
	return fdp_sendto(sock, buf, len, fds, nfds, WIRE_MAX_FDS, NULL, 0);
}

/*
 * Sends len bytes and nfds descriptors (at most maxfds) as one message to
 * to (or the connected peer when to is NULL) with MSG_NOSIGNAL, so a closed
 * peer is -EPIPE rather than SIGPIPE. No descriptors means no control
 * message. The caller keeps ownership of its descriptors. Returns the bytes
 * sent, -EINVAL for bad arguments (including an empty message, which a
 * SEQPACKET receiver could not tell from end of stream), or -errno from
 * sendmsg (-EAGAIN when a non-blocking socket is full); EINTR is retried.
 */
static ssize_t send_message(int sock, const void *buf, size_t len, const int *fds, size_t nfds,
	size_t maxfds, const struct sockaddr *to, socklen_t tolen, int restart);

ssize_t
fdp_sendto(int sock, const void *buf, size_t len, const int *fds, size_t nfds, size_t maxfds,
	const struct sockaddr *to, socklen_t tolen)
{
	return send_message(sock, buf, len, fds, nfds, maxfds, to, tolen, 1);
}

ssize_t
fdp_send_intr(int sock, const void *buf, size_t len, const int *fds, size_t nfds)
{
	return send_message(sock, buf, len, fds, nfds, WIRE_MAX_FDS, NULL, 0, 0);
}

/* fdp_sendto(); restart: whether sendmsg is tried again on EINTR. */
static ssize_t
send_message(int sock, const void *buf, size_t len, const int *fds, size_t nfds, size_t maxfds,
	const struct sockaddr *to, socklen_t tolen, int restart)
{
	union fdp_send_control control;
	struct iovec iov;
	struct msghdr msg;
	struct cmsghdr *cmsg;
	ssize_t n;

	if (buf == NULL || len == 0 || maxfds > FDP_MAX_FDS || nfds > maxfds ||
	        (nfds > 0 && fds == NULL) || (to == NULL) != (tolen == 0))
		return -EINVAL;
	memset(&msg, 0, sizeof(msg));
	/* sendmsg reads neither the address nor the buffer */
	msg.msg_name = (void *)(uintptr_t)to;
	msg.msg_namelen = tolen;
	iov.iov_base = (void *)(uintptr_t)buf;
	iov.iov_len = len;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (nfds > 0) {
		memset(&control, 0, sizeof(control));
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cmsg = CMSG_FIRSTHDR(&msg);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * nfds);
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR && restart);
	return n < 0 ? -errno : n;
}

/*
 * Receives one message into buf (cap bytes) and at most maxfds descriptors,
 * which arrive close-on-exec (MSG_CMSG_CLOEXEC). Walks every control
 * message: descriptors from SCM_RIGHTS are collected in order, anything else
 * (SCM_CREDENTIALS, ...) is skipped. On success the caller owns the *nfds
 * descriptors written to fds. Returns the message length; 0 at end of stream
 * (any descriptors that came with an empty packet are closed); or -errno:
 * -EAGAIN, -EMSGSIZE when the message was longer than cap, -EMFILE when
 * descriptors were cut off, -EBADMSG when more than maxfds arrived, -EINVAL
 * for bad
 * arguments, or the error of recvmsg (EINTR is retried). On error no
 * descriptor is returned, every one received is closed, and fds and *nfds
 * are untouched.
 */
ssize_t
fdp_recv(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds)
{
	return fdp_recv_drop(sock, buf, cap, fds, maxfds, nfds, NULL, NULL);
}

/* Hands the n descriptors in fds to drop (close() when drop is NULL). */
static void
drop_all(const int *fds, size_t n, fdp_drop_fn drop, void *arg)
{
	for (size_t i = 0; i < n; i++) {
		if (drop != NULL)
			drop(fds[i], arg);
		else
			close(fds[i]); /* Linux: the fd is gone even on EINTR */
	}
}

static ssize_t recv_message(int sock, void *buf, size_t cap, int *fds, size_t maxfds,
	size_t *nfds, fdp_drop_fn drop, void *arg, int restart);

/* fdp_recv(), with the descriptors it does not return handed to drop. */
ssize_t
fdp_recv_drop(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds,
	fdp_drop_fn drop, void *arg)
{
	return recv_message(sock, buf, cap, fds, maxfds, nfds, drop, arg, 1);
}

ssize_t
fdp_recv_intr(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds)
{
	return recv_message(sock, buf, cap, fds, maxfds, nfds, NULL, NULL, 0);
}

/* fdp_recv_drop(); restart: whether recvmsg is tried again on EINTR. */
static ssize_t
recv_message(int sock, void *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds,
	fdp_drop_fn drop, void *arg, int restart)
{
	union fdp_control control;
	int got[FDP_RECV_MAX];
	size_t ngot = 0;
	struct iovec iov;
	struct msghdr msg;
	struct cmsghdr *cmsg;
	ssize_t n;

	if (buf == NULL || nfds == NULL || (maxfds > 0 && fds == NULL))
		return -EINVAL;
	memset(&msg, 0, sizeof(msg));
	iov.iov_base = buf;
	iov.iov_len = cap;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = control.buf;
	msg.msg_controllen = sizeof(control.buf);
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR && restart);
	if (n < 0)
		return -errno;

	/* Take every descriptor the kernel installed, whatever else is wrong
	 * with the message, so that the error paths below can close them. */
	for (cmsg = CMSG_FIRSTHDR(&msg); cmsg != NULL; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
		size_t k, data, room;

		/* The kernel fills the buffer, but do not read past it even so. */
		room = msg.msg_controllen - (size_t)((unsigned char *)cmsg - control.buf);
		if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS ||
		        cmsg->cmsg_len < CMSG_LEN(0) || cmsg->cmsg_len > room)
			continue;
		data = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (k = 0; k < data && ngot < FDP_RECV_MAX; k++)
			memcpy(&got[ngot++], CMSG_DATA(cmsg) + k * sizeof(int), sizeof(int));
	}

	if (msg.msg_flags & MSG_CTRUNC) {
		drop_all(got, ngot, drop, arg);
		return -EMFILE;
	}
	if (msg.msg_flags & MSG_TRUNC) {
		drop_all(got, ngot, drop, arg);
		return -EMSGSIZE;
	}
	if (ngot > maxfds) {
		drop_all(got, ngot, drop, arg);
		return -EBADMSG;
	}
	if (n == 0) {
		/* End of stream, or an empty packet (which fdp_send never sends
		 * and the protocol forbids): either way no descriptor for the
		 * caller. */
		drop_all(got, ngot, drop, arg);
		*nfds = 0;
		return 0;
	}
	if (ngot > 0)
		memcpy(fds, got, ngot * sizeof(int));
	*nfds = ngot;
	return n;
}

/* Closes the n descriptors in fds that are not -1 and sets them to -1.
 * Accepts NULL. */
void
fdp_close_all(int *fds, size_t n)
{
	if (fds == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		if (fds[i] >= 0) {
			close(fds[i]); /* Linux: the fd is gone even on EINTR */
			fds[i] = -1;
		}
	}
}
