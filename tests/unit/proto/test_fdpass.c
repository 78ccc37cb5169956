/*
 * test_fdpass.c: unit tests of proto/fdpass.c, one message with descriptors
 * over a SOCK_SEQPACKET socketpair, and fdp_sendto() to a datagram socket
 * that stands in for the service manager's notify socket.
 *
 * Descriptors are memfds, one inode each, so "the same file arrived in the
 * same place" is checked by st_ino. Every error path checks that the process
 * holds as many descriptors afterwards as before (tu_count_fds), which is
 * how a leak of received descriptors would show.
 *
 * Fault injection: this file defines recvmsg() and sendmsg() itself. The
 * test executable's definitions take precedence over libc's (and over the
 * sanitizers' weak interceptors) for every caller in the executable,
 * including fdpass.o from the static wcproto library, so no linker option is
 * needed. They forward to the kernel with syscall(2) unless a test asked for
 * a failure, and they record what the kernel returned so that a test can
 * assert that the path it meant to exercise was really taken.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/fdpass.h"
#include "testutil.h"
#include "proto/wire.h"

/* Linux's SCM_MAX_FD: the most descriptors one sendmsg() may carry. */
#define KERNEL_SCM_MAX_FD 253

/* ---- fault injection ---------------------------------------------------- */

static struct {
	int recv_fail;  /* fail this many recvmsg() calls ... */
	int recv_errno; /* ... with this errno */
	int send_fail;  /* same for sendmsg() */
	int send_errno;
	size_t recv_controllen; /* if not 0: shrink the caller's control buffer */
	int recv_calls;         /* calls seen */
	int send_calls;
	int recv_flags;     /* msg_flags of the last real recvmsg() */
	int send_flags;     /* flags of the last sendmsg() */
	int recv_saw_creds; /* the last real recvmsg() carried SCM_CREDENTIALS */
} fault;

ssize_t
recvmsg(int fd, struct msghdr *msg, int flags)
{
	struct cmsghdr *c;
	long n;

	fault.recv_calls++;
	if (fault.recv_fail > 0) {
		fault.recv_fail--;
		errno = fault.recv_errno;
		return -1;
	}
	if (fault.recv_controllen != 0 && msg->msg_controllen > fault.recv_controllen)
		msg->msg_controllen = fault.recv_controllen;
	n = syscall(SYS_recvmsg, fd, msg, flags);
	if (n >= 0) {
		fault.recv_flags = msg->msg_flags;
		fault.recv_saw_creds = 0;
		for (c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
				fault.recv_saw_creds = 1;
	}
	return n;
}

ssize_t
sendmsg(int fd, const struct msghdr *msg, int flags)
{
	fault.send_calls++;
	fault.send_flags = flags;
	if (fault.send_fail > 0) {
		fault.send_fail--;
		errno = fault.send_errno;
		return -1;
	}
	return syscall(SYS_sendmsg, fd, msg, flags);
}

/* ---- fixture ------------------------------------------------------------ */

struct pair {
	int a; /* sends */
	int b; /* receives */
};

static int
setup(void **state)
{
	struct pair *p = malloc(sizeof(*p));
	int sv[2];

	if (p == NULL || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		free(p);
		return -1;
	}
	p->a = sv[0];
	p->b = sv[1];
	memset(&fault, 0, sizeof(fault));
	*state = p;
	return 0;
}

static int
teardown(void **state)
{
	struct pair *p = *state;

	if (p->a >= 0)
		close(p->a);
	if (p->b >= 0)
		close(p->b);
	free(p);
	memset(&fault, 0, sizeof(fault));
	return 0;
}

/* Creates n memfds (distinct inodes), each holding its own number. */
static void
make_memfds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		fds[i] = memfd_create("fdpass-test", MFD_CLOEXEC);
		assert_true(fds[i] >= 0);
		assert_int_equal(write(fds[i], &i, sizeof(i)), sizeof(i));
	}
}

static ino_t
inode_of(int fd)
{
	struct stat st;

	assert_int_equal(fstat(fd, &st), 0);
	return st.st_ino;
}

/* Asserts that got[i] refers to the same file as sent[i] for every i and is
 * close-on-exec. */
static void
assert_same_files(const int *sent, const int *got, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		assert_true(got[i] >= 0);
		assert_true(got[i] != sent[i]);
		assert_true(inode_of(got[i]) == inode_of(sent[i]));
		assert_true(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
	}
}

#define raw_send tu_raw_send

/* ---- tests -------------------------------------------------------------- */

/* A message without descriptors. */
static void
test_no_fds(void **state)
{
	struct pair *p = *state;
	char buf[64];
	int fds[4] = {-7, -7, -7, -7};
	size_t nfds = 99;

	assert_int_equal(fdp_send(p->a, "hello", 5, NULL, 0), 5);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), fds, 4, &nfds), 5);
	assert_int_equal(nfds, 0);
	assert_memory_equal(buf, "hello", 5);
	assert_int_equal(fds[0], -7);

	/* maxfds 0 and fds NULL is fine when none arrive. */
	assert_int_equal(fdp_send(p->a, "again", 5, NULL, 0), 5);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), NULL, 0, &nfds), 5);
	assert_int_equal(nfds, 0);
}

/* One descriptor: same file, new number, close-on-exec, readable. */
static void
test_one_fd(void **state)
{
	struct pair *p = *state;
	char buf[64];
	int sent, got = -1;
	size_t nfds = 0, value = 1;

	make_memfds(&sent, 1);
	assert_int_equal(fdp_send(p->a, "one", 3, &sent, 1), 3);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), &got, 1, &nfds), 3);
	assert_int_equal(nfds, 1);
	assert_same_files(&sent, &got, 1);
	assert_int_equal(pread(got, &value, sizeof(value), 0), sizeof(value));
	assert_int_equal(value, 0);
	close(sent);
	close(got);
}

/* WIRE_MAX_FDS descriptors arrive in order; closing them all returns the
 * process to its baseline. */
static void
test_max_fds(void **state)
{
	struct pair *p = *state;
	int sent[WIRE_MAX_FDS], got[WIRE_MAX_FDS];
	char buf[64];
	size_t nfds = 0;
	int base = tu_count_fds();

	make_memfds(sent, WIRE_MAX_FDS);
	assert_int_equal(fdp_send(p->a, "many", 4, sent, WIRE_MAX_FDS), 4);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, WIRE_MAX_FDS, &nfds), 4);
	assert_int_equal(nfds, WIRE_MAX_FDS);
	assert_same_files(sent, got, WIRE_MAX_FDS);
	assert_int_equal(tu_count_fds(), base + 2 * (int)WIRE_MAX_FDS);
	fdp_close_all(sent, WIRE_MAX_FDS);
	fdp_close_all(got, WIRE_MAX_FDS);
	assert_int_equal(got[0], -1);
	assert_int_equal(got[WIRE_MAX_FDS - 1], -1);
	assert_int_equal(tu_count_fds(), base);
}

/* Messages keep their boundaries and their own descriptors. */
static void
test_sequence(void **state)
{
	struct pair *p = *state;
	int sent[3], got[3];
	char buf[64];
	size_t nfds = 0;

	make_memfds(sent, 3);
	assert_int_equal(fdp_send(p->a, "first", 5, sent, 2), 5);
	assert_int_equal(fdp_send(p->a, "second!", 7, sent + 2, 1), 7);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 3, &nfds), 5);
	assert_int_equal(nfds, 2);
	assert_same_files(sent, got, 2);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got + 2, 1, &nfds), 7);
	assert_int_equal(nfds, 1);
	assert_same_files(sent + 2, got + 2, 1);
	fdp_close_all(sent, 3);
	fdp_close_all(got, 3);
}

/* A message longer than cap: -EMSGSIZE, its descriptors closed, outputs
 * untouched, and the next message is intact. */
static void
test_truncated_message(void **state)
{
	struct pair *p = *state;
	char big[100], buf[64];
	int sent[3], got[3] = {-7, -7, -7};
	size_t nfds = 99;
	int base;

	memset(big, 'x', sizeof(big));
	make_memfds(sent, 3);
	assert_int_equal(fdp_send(p->a, big, sizeof(big), sent, 3), sizeof(big));
	assert_int_equal(fdp_send(p->a, "next", 4, NULL, 0), 4);
	fdp_close_all(sent, 3);
	base = tu_count_fds();
	assert_int_equal(fdp_recv(p->b, buf, 10, got, 3, &nfds), -EMSGSIZE);
	assert_true(fault.recv_flags & MSG_TRUNC);
	assert_int_equal(tu_count_fds(), base);
	assert_int_equal(nfds, 99);
	assert_int_equal(got[0], -7);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 3, &nfds), 4);
	assert_memory_equal(buf, "next", 4);
	assert_int_equal(nfds, 0);
}

/* More descriptors than the caller allows: -EBADMSG, all closed. */
static void
test_too_many_fds(void **state)
{
	struct pair *p = *state;
	int sent[5], got[5] = {-7, -7, -7, -7, -7};
	char buf[64];
	size_t nfds = 99;
	int base;

	make_memfds(sent, 5);
	assert_int_equal(fdp_send(p->a, "five", 4, sent, 5), 4);
	assert_int_equal(fdp_send(p->a, "one", 3, sent, 1), 3);
	fdp_close_all(sent, 5);
	base = tu_count_fds();
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 4, &nfds), -EBADMSG);
	assert_int_equal(tu_count_fds(), base);
	assert_int_equal(nfds, 99);
	assert_int_equal(got[0], -7);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), NULL, 0, &nfds), -EBADMSG);
	assert_int_equal(tu_count_fds(), base);
}

/* A hostile peer sends the kernel's maximum, more than WIRE_MAX_FDS: they
 * fit the control buffer, so this is "too many", and all are closed. */
static void
test_kernel_max_fds(void **state)
{
	struct pair *p = *state;
	int sent[KERNEL_SCM_MAX_FD], got[WIRE_MAX_FDS];
	char buf[64];
	size_t nfds = 0;
	int base;

	make_memfds(sent, KERNEL_SCM_MAX_FD);
	assert_int_equal(raw_send(p->a, "lots", 4, sent, KERNEL_SCM_MAX_FD), 4);
	fdp_close_all(sent, KERNEL_SCM_MAX_FD);
	base = tu_count_fds();
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, WIRE_MAX_FDS, &nfds), -EBADMSG);
	assert_int_equal(tu_count_fds(), base);
}

/* The descriptors fdp_recv_drop() does not return, counted and closed. */
struct dropped {
	size_t n;
	int last;
};

static void
count_drop(int fd, void *arg)
{
	struct dropped *d = arg;

	d->n++;
	d->last = fd;
	close(fd);
}

/* A hostile peer sends the kernel's maximum to a receiver with SO_PASSCRED:
 * every one is installed (none released by the kernel inside recvmsg, where
 * a lingering socket's last close would block the receiver) and handed to
 * the drop function, none closed by fdp_recv_drop() itself. */
static void
test_drop_gets_every_descriptor(void **state)
{
	struct pair *p = *state;
	int sent[KERNEL_SCM_MAX_FD], got[WIRE_MAX_FDS], one = 1;
	struct dropped d = { 0, -1 };
	char buf[64];
	size_t nfds = 0;
	int base;

	assert_int_equal(setsockopt(p->b, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	make_memfds(sent, KERNEL_SCM_MAX_FD);
	assert_int_equal(raw_send(p->a, "lots", 4, sent, KERNEL_SCM_MAX_FD), 4);
	assert_int_equal(raw_send(p->a, "ok", 2, sent, 1), 2);
	fdp_close_all(sent, KERNEL_SCM_MAX_FD);
	base = tu_count_fds();
	assert_int_equal(fdp_recv_drop(p->b, buf, sizeof(buf), got, WIRE_MAX_FDS, &nfds,
				 count_drop, &d), -EBADMSG);
	assert_false(fault.recv_flags & MSG_CTRUNC);
	assert_true(fault.recv_saw_creds);
	assert_int_equal(d.n, KERNEL_SCM_MAX_FD);
	assert_int_equal(tu_count_fds(), base);
	/* Returned descriptors are the caller's, not dropped. */
	d.n = 0;
	assert_int_equal(fdp_recv_drop(p->b, buf, sizeof(buf), got, 1, &nfds, count_drop, &d),
		2);
	assert_int_equal(nfds, 1);
	assert_int_equal(d.n, 0);
	close(got[0]);
}

/* MSG_CTRUNC: the control buffer holds fewer descriptors than were sent.
 * The kernel installs those that fit and closes the rest; fdp_recv() must
 * close the installed ones and say -EMFILE (the receiver could not take
 * them), not -EBADMSG (the sender's fault). The control buffer is shrunk by the recvmsg()
 * shim so the kernel really truncates. */
static void
test_ctrunc(void **state)
{
	struct pair *p = *state;
	int sent[5], got[5] = {-7, -7, -7, -7, -7};
	char buf[64];
	size_t nfds = 99;
	int base;

	make_memfds(sent, 5);
	assert_int_equal(fdp_send(p->a, "cut", 3, sent, 5), 3);
	fdp_close_all(sent, 5);
	base = tu_count_fds();
	fault.recv_controllen = CMSG_SPACE(2 * sizeof(int));
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 5, &nfds), -EMFILE);
	assert_true(fault.recv_flags & MSG_CTRUNC);
	assert_int_equal(tu_count_fds(), base);
	assert_int_equal(nfds, 99);
	assert_int_equal(got[0], -7);
}

/* SCM_CREDENTIALS (SO_PASSCRED on the receiver) come with every message:
 * they are skipped, and leave room for WIRE_MAX_FDS descriptors. */
static void
test_credentials_ignored(void **state)
{
	struct pair *p = *state;
	int sent[WIRE_MAX_FDS], got[WIRE_MAX_FDS];
	char buf[64];
	size_t nfds = 0;
	int one = 1;
	int base = tu_count_fds();

	assert_int_equal(setsockopt(p->b, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	make_memfds(sent, WIRE_MAX_FDS);

	assert_int_equal(fdp_send(p->a, "none", 4, NULL, 0), 4);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 2, &nfds), 4);
	assert_true(fault.recv_saw_creds);
	assert_int_equal(nfds, 0);

	assert_int_equal(fdp_send(p->a, "two", 3, sent, 2), 3);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 2, &nfds), 3);
	assert_true(fault.recv_saw_creds);
	assert_int_equal(nfds, 2);
	assert_same_files(sent, got, 2);
	fdp_close_all(got, 2);

	assert_int_equal(fdp_send(p->a, "all", 3, sent, WIRE_MAX_FDS), 3);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, WIRE_MAX_FDS, &nfds), 3);
	assert_true(fault.recv_saw_creds);
	assert_false(fault.recv_flags & MSG_CTRUNC);
	assert_int_equal(nfds, WIRE_MAX_FDS);
	assert_same_files(sent, got, WIRE_MAX_FDS);
	fdp_close_all(got, WIRE_MAX_FDS);
	fdp_close_all(sent, WIRE_MAX_FDS);
	assert_int_equal(tu_count_fds(), base);
}

/* End of stream is 0 with no descriptors. */
static void
test_eof(void **state)
{
	struct pair *p = *state;
	char buf[64];
	int got[2] = {-7, -7};
	size_t nfds = 99;

	close(p->a);
	p->a = -1;
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), got, 2, &nfds), 0);
	assert_int_equal(nfds, 0);
	assert_int_equal(got[0], -7);
}

/* An empty packet reads as end of stream; descriptors sent with it (by a
 * hostile peer: fdp_send refuses empty messages) are closed. */
static void
test_empty_packet_with_fd(void **state)
{
	struct pair *p = *state;
	char buf[64];
	int sent, got = -7;
	size_t nfds = 99;
	int base;

	make_memfds(&sent, 1);
	assert_int_equal(raw_send(p->a, "", 0, &sent, 1), 0);
	close(sent);
	base = tu_count_fds();
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), &got, 1, &nfds), 0);
	assert_int_equal(nfds, 0);
	assert_int_equal(got, -7);
	assert_int_equal(tu_count_fds(), base);
}

/* Non-blocking: -EAGAIN on an empty socket, and on a full one. */
static void
test_eagain(void **state)
{
	struct pair *p = *state;
	char buf[64];
	size_t nfds = 99;
	ssize_t n = 0;
	int i;

	assert_int_equal(fcntl(p->b, F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), NULL, 0, &nfds), -EAGAIN);
	assert_int_equal(nfds, 99);

	assert_int_equal(fcntl(p->a, F_SETFL, O_NONBLOCK), 0);
	memset(buf, 'f', sizeof(buf));
	for (i = 0; i < 1000000; i++) {
		n = fdp_send(p->a, buf, sizeof(buf), NULL, 0);
		if (n != (ssize_t)sizeof(buf))
			break;
	}
	assert_int_equal(n, -EAGAIN);
	assert_true(i > 0);
}

static volatile sig_atomic_t sigpipes;

static void
count_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

/* Sending to a closed peer is -EPIPE, and raises no SIGPIPE. The kernel
 * raises none for SOCK_SEQPACKET even without MSG_NOSIGNAL (as of Linux
 * 6.x), so the flag is also checked directly, and on a SOCK_STREAM pair,
 * where a send to a closed peer without it does raise SIGPIPE. */
static void
test_epipe(void **state)
{
	struct pair *p = *state;
	struct sigaction sa, old;
	int fd, sv[2];

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = count_sigpipe;
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGPIPE, &sa, &old), 0);
	sigpipes = 0;

	close(p->b);
	p->b = -1;
	make_memfds(&fd, 1);
	assert_int_equal(fdp_send(p->a, "gone", 4, NULL, 0), -EPIPE);
	assert_int_equal(fdp_send(p->a, "gone", 4, &fd, 1), -EPIPE);
	assert_true(fault.send_flags & MSG_NOSIGNAL);
	assert_int_equal(sigpipes, 0);

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	close(sv[1]);
	assert_int_equal(fdp_send(sv[0], "gone", 4, &fd, 1), -EPIPE);
	assert_int_equal(sigpipes, 0);
	close(sv[0]);
	assert_true(fcntl(fd, F_GETFD) >= 0); /* still ours */
	close(fd);
	assert_int_equal(sigaction(SIGPIPE, &old, NULL), 0);
}

/* Arguments fdp_send() and fdp_recv() refuse. */
static void
test_invalid(void **state)
{
	struct pair *p = *state;
	int fds[WIRE_MAX_FDS + 1] = {0};
	char buf[16];
	size_t nfds;

	assert_int_equal(fdp_send(p->a, "x", 0, NULL, 0), -EINVAL);
	assert_int_equal(fdp_send(p->a, NULL, 1, NULL, 0), -EINVAL);
	assert_int_equal(fdp_send(p->a, "x", 1, NULL, 1), -EINVAL);
	assert_int_equal(fdp_send(p->a, "x", 1, fds, WIRE_MAX_FDS + 1), -EINVAL);
	assert_int_equal(fault.send_calls, 0);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), fds, 1, NULL), -EINVAL);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), NULL, 1, &nfds), -EINVAL);
	assert_int_equal(fdp_recv(p->b, NULL, sizeof(buf), fds, 1, &nfds), -EINVAL);
	assert_int_equal(fault.recv_calls, 0);
	assert_int_equal(fdp_send(-1, "x", 1, NULL, 0), -EBADF);
	assert_int_equal(fdp_recv(-1, buf, sizeof(buf), NULL, 0, &nfds), -EBADF);
}

/* EINTR is retried by both, transparently. */
static void
test_eintr_retried(void **state)
{
	struct pair *p = *state;
	char buf[16];
	int sent, got = -1;
	size_t nfds = 0;

	make_memfds(&sent, 1);
	fault.send_fail = 2;
	fault.send_errno = EINTR;
	assert_int_equal(fdp_send(p->a, "intr", 4, &sent, 1), 4);
	assert_int_equal(fault.send_calls, 3);

	fault.recv_fail = 3;
	fault.recv_errno = EINTR;
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), &got, 1, &nfds), 4);
	assert_int_equal(fault.recv_calls, 4);
	assert_int_equal(nfds, 1);
	assert_same_files(&sent, &got, 1);
	close(sent);
	close(got);
}

/* fdp_send_intr() and fdp_recv_intr() return -EINTR at once, sending and
 * receiving nothing (a socket with a timeout: the caller waits for what is
 * left of its own deadline); the message goes on the next call. */
static void
test_eintr_returned_by_intr(void **state)
{
	struct pair *p = *state;
	char buf[16];
	int sent, got = -1;
	size_t nfds = 0;

	make_memfds(&sent, 1);
	fault.send_fail = 1;
	fault.send_errno = EINTR;
	assert_int_equal(fdp_send_intr(p->a, "intr", 4, &sent, 1), -EINTR);
	assert_int_equal(fault.send_calls, 1);
	assert_int_equal(fdp_send_intr(p->a, "intr", 4, &sent, 1), 4);

	fault.recv_fail = 1;
	fault.recv_errno = EINTR;
	assert_int_equal(fdp_recv_intr(p->b, buf, sizeof(buf), &got, 1, &nfds), -EINTR);
	assert_int_equal(fault.recv_calls, 1);
	assert_int_equal(nfds, 0);
	assert_int_equal(got, -1);
	assert_int_equal(fdp_recv_intr(p->b, buf, sizeof(buf), &got, 1, &nfds), 4);
	assert_int_equal(nfds, 1);
	assert_same_files(&sent, &got, 1);
	close(sent);
	close(got);
}

/* Other errors come back as -errno, with outputs untouched. */
static void
test_errors_returned(void **state)
{
	struct pair *p = *state;
	char buf[16];
	int sent, got = -7;
	size_t nfds = 99;

	make_memfds(&sent, 1);
	fault.send_fail = 1;
	fault.send_errno = ENOBUFS;
	assert_int_equal(fdp_send(p->a, "x", 1, &sent, 1), -ENOBUFS);
	assert_int_equal(fault.send_calls, 1);

	fault.recv_fail = 1;
	fault.recv_errno = ECONNRESET;
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), &got, 1, &nfds), -ECONNRESET);
	assert_int_equal(nfds, 99);
	assert_int_equal(got, -7);

	/* Nothing was sent by the failed call: the socket is empty. */
	assert_int_equal(fcntl(p->b, F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(fdp_recv(p->b, buf, sizeof(buf), &got, 1, &nfds), -EAGAIN);
	close(sent);
}

/* ---- fdp_sendto: a datagram "manager" at an address --------------------- */

/* A datagram socket bound to an abstract address of its own, standing in
 * for the service manager's notify socket, and an unbound sender. */
struct manager {
	int sock; /* the manager: receives */
	int sender;
	struct sockaddr_un addr;
	socklen_t addrlen;
};

static void
manager_open(struct manager *m)
{
	int n;

	memset(m, 0, sizeof(*m));
	m->addr.sun_family = AF_UNIX;
	/* abstract: sun_path[0] stays '\0'; the length counts the name only */
	n = snprintf(m->addr.sun_path + 1, sizeof(m->addr.sun_path) - 1, "wcache-test-fdpass-%ld",
		(long)getpid());
	assert_true(n > 0);
	m->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	m->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(m->sock >= 0);
	assert_int_equal(bind(m->sock, (struct sockaddr *)&m->addr, m->addrlen), 0);
	m->sender = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	assert_true(m->sender >= 0);
}

static void
manager_close(struct manager *m)
{
	close(m->sock);
	close(m->sender);
}

/* FDP_MAX_FDS descriptors (more than the wire allows) reach the manager's
 * address in one datagram, in order, and stay the sender's. */
static void
test_sendto_address(void **state)
{
	struct manager m;
	int sent[FDP_MAX_FDS], got[FDP_MAX_FDS];
	char buf[64];
	size_t nfds = 0;
	int base;

	(void)state;
	_Static_assert(FDP_MAX_FDS > WIRE_MAX_FDS, "the test needs more than the wire allows");
	manager_open(&m);
	base = tu_count_fds();
	make_memfds(sent, FDP_MAX_FDS);
	assert_int_equal(fdp_sendto(m.sender, "FDSTORE=1", 9, sent, FDP_MAX_FDS, FDP_MAX_FDS,
		(struct sockaddr *)&m.addr, m.addrlen), 9);
	assert_true(fault.send_flags & MSG_NOSIGNAL);
	assert_int_equal(fdp_recv(m.sock, buf, sizeof(buf), got, FDP_MAX_FDS, &nfds), 9);
	assert_memory_equal(buf, "FDSTORE=1", 9);
	assert_int_equal(nfds, FDP_MAX_FDS);
	assert_same_files(sent, got, FDP_MAX_FDS);
	assert_int_equal(tu_count_fds(), base + 2 * (int)FDP_MAX_FDS);
	fdp_close_all(sent, FDP_MAX_FDS);
	fdp_close_all(got, FDP_MAX_FDS);
	assert_int_equal(tu_count_fds(), base);

	/* The same without descriptors: no control message. */
	assert_int_equal(fdp_sendto(m.sender, "READY=1", 7, NULL, 0, FDP_MAX_FDS,
		(struct sockaddr *)&m.addr, m.addrlen), 7);
	assert_int_equal(fdp_recv(m.sock, buf, sizeof(buf), NULL, 0, &nfds), 7);
	assert_int_equal(nfds, 0);
	manager_close(&m);
}

/* Without an address it sends on a connected socket: a datagram
 * socketpair as the manager. */
static void
test_sendto_connected(void **state)
{
	int sv[2], sent[2], got[2];
	char buf[16];
	size_t nfds = 0;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
	make_memfds(sent, 2);
	assert_int_equal(fdp_sendto(sv[0], "two", 3, sent, 2, 2, NULL, 0), 3);
	assert_int_equal(fdp_recv(sv[1], buf, sizeof(buf), got, 2, &nfds), 3);
	assert_int_equal(nfds, 2);
	assert_same_files(sent, got, 2);
	fdp_close_all(sent, 2);
	fdp_close_all(got, 2);
	close(sv[0]);
	close(sv[1]);
}

/* A manager that does not read: a non-blocking sender gets -EAGAIN, its
 * descriptors stay open and nothing of the refused datagram arrives. */
static void
test_sendto_full(void **state)
{
	struct manager m;
	char buf[16];
	int fd, got = -1;
	size_t nfds = 0;
	ssize_t n = 0;
	int i, queued = 0;

	(void)state;
	manager_open(&m);
	make_memfds(&fd, 1);
	for (i = 0; i < 100000; i++) {
		n = fdp_sendto(m.sender, "x", 1, &fd, 1, 1, (struct sockaddr *)&m.addr,
			m.addrlen);
		if (n != 1)
			break;
		queued++;
	}
	assert_int_equal(n, -EAGAIN);
	assert_true(queued > 0);
	assert_true(fcntl(fd, F_GETFD) >= 0); /* still ours */
	/* Exactly the queued datagrams arrive, each with its descriptor. */
	assert_int_equal(fcntl(m.sock, F_SETFL, O_NONBLOCK), 0);
	for (i = 0; i < queued; i++) {
		assert_int_equal(fdp_recv(m.sock, buf, sizeof(buf), &got, 1, &nfds), 1);
		assert_int_equal(nfds, 1);
		assert_true(inode_of(got) == inode_of(fd));
		close(got);
	}
	assert_int_equal(fdp_recv(m.sock, buf, sizeof(buf), &got, 1, &nfds), -EAGAIN);
	close(fd);
	manager_close(&m);
}

/* Arguments fdp_sendto() refuses before any sendmsg(): more descriptors
 * than the caller's limit, a limit above the kernel's, an address without
 * its length or a length without an address. */
static void
test_sendto_invalid(void **state)
{
	struct manager m;
	int fds[FDP_MAX_FDS + 1] = {0};

	(void)state;
	manager_open(&m);
	fault.send_calls = 0;
	assert_int_equal(fdp_sendto(m.sender, "x", 1, fds, 3, 2, (struct sockaddr *)&m.addr,
		m.addrlen), -EINVAL);
	assert_int_equal(fdp_sendto(m.sender, "x", 1, fds, FDP_MAX_FDS + 1, FDP_MAX_FDS + 1,
		(struct sockaddr *)&m.addr, m.addrlen), -EINVAL);
	assert_int_equal(fdp_sendto(m.sender, "x", 1, fds, 1, FDP_MAX_FDS + 1,
		(struct sockaddr *)&m.addr, m.addrlen), -EINVAL);
	assert_int_equal(fdp_sendto(m.sender, "x", 1, NULL, 0, 0, (struct sockaddr *)&m.addr, 0),
		-EINVAL);
	assert_int_equal(fdp_sendto(m.sender, "x", 1, NULL, 0, 0, NULL, m.addrlen), -EINVAL);
	assert_int_equal(fdp_sendto(m.sender, "x", 0, NULL, 0, 0, (struct sockaddr *)&m.addr,
		m.addrlen), -EINVAL);
	assert_int_equal(fault.send_calls, 0);
	manager_close(&m);
}

/* fdp_close_all() closes, sets -1, skips -1, accepts NULL. */
static void
test_close_all(void **state)
{
	int fds[3];
	int base = tu_count_fds();

	make_memfds(fds, 2);
	fds[2] = -1;
	assert_int_equal(tu_count_fds(), base + 2);
	fdp_close_all(fds, 3);
	assert_int_equal(fds[0], -1);
	assert_int_equal(fds[1], -1);
	assert_int_equal(fds[2], -1);
	assert_int_equal(tu_count_fds(), base);
	fdp_close_all(NULL, 3);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_no_fds, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_one_fd, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_max_fds, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_sequence, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_truncated_message, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_too_many_fds, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_drop_gets_every_descriptor, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_kernel_max_fds, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_ctrunc, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_credentials_ignored, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_eof, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_empty_packet_with_fd, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_eagain, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_epipe, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_invalid, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_eintr_retried, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eintr_returned_by_intr, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_errors_returned, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_sendto_address, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_sendto_connected, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_sendto_full, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_sendto_invalid, setup, teardown),
	        cmocka_unit_test(test_close_all),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
