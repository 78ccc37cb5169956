/*
 * fuzz_fdpass.c: libFuzzer harness for fdp_recv() (proto/fdpass.c), the
 * receiving end of every message with descriptors, over a real kernel
 * socket: a hostile peer chooses the bytes, how many descriptors go with
 * them and of what kind, and how the control data is laid out; the harness
 * sends that on a SOCK_SEQPACKET socketpair and calls fdp_recv() with a
 * buffer size and a descriptor limit the input also chooses.
 *
 * Input: 8 bytes of parameters, then the message bytes.
 *   [0] descriptors to send (0..SCM_MAX_FD, more is taken modulo 254)
 *   [1] flags: 1 receiver sets SO_PASSCRED; 2 sender adds SCM_CREDENTIALS;
 *       4 the descriptors go in two SCM_RIGHTS messages; 8 a second
 *       message follows the first; 16 the message is empty; 32 the
 *       receiver's control buffer is shrunk to [5] bytes (recvmsg() below);
 *       64 the second message carries the first one's descriptors again;
 *       128 the socket pair is SOCK_DGRAM
 *   [2] maxfds for fdp_recv()  (0..255)
 *   [3] [4] buffer size for fdp_recv(), little-endian (0..WIRE_MAX_MESSAGE)
 *   [5] control buffer size when flag 32 is set
 *   [6] [7] kinds of descriptor, two bits each, cycled: /dev/null, a
 *       memfd, a pipe end, the receiving socket itself
 *   [8] when not 0: RLIMIT_NOFILE is lowered during fdp_recv() so that
 *       only about this many more descriptors fit in the process (the
 *       kernel stops installing them at EMFILE: MSG_CTRUNC)
 *
 * Properties checked, beyond "no crash, no out-of-bounds access":
 *   - every descriptor the kernel installs in this process is returned to
 *     the caller or closed: after closing what fdp_recv() returned and the
 *     socket pair, the process holds exactly as many descriptors as before
 *     (counted in /proc/self/fd);
 *   - the result is one of the documented ones, and on error the caller's
 *     fds and *nfds are untouched;
 *   - a success returns the message's bytes and its descriptors in the order
 *     sent, each the very file sent (same st_dev and st_ino), close-on-exec;
 *     a success never drops a descriptor, and returns no more than maxfds;
 *   - the outcome is the one the rules predict (too long: -EMSGSIZE; more
 *     descriptors than the control buffer holds or than the process may
 *     open: -EMFILE; else more than maxfds: -EBADMSG; empty: 0; otherwise
 *     the message) and a second message is received whole after it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "proto/fdpass.h"
#include "proto/wire.h"
#include "fuzz_check.h"
#include "fuzz_fds.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KERNEL_SCM_MAX_FD 253 /* Linux's limit of descriptors per sendmsg() */
#define PARAMS 9

enum {
	F_PASSCRED = 1,
	F_SEND_CREDS = 2,
	F_SPLIT = 4,
	F_SECOND = 8,
	F_EMPTY = 16,
	F_SHRINK = 32,
	F_SECOND_FDS = 64,
	F_DGRAM = 128,
};

/* When nonzero, recvmsg() gives the kernel at most this much control
 * buffer: the kernel then installs fewer descriptors and says MSG_CTRUNC. */
static size_t shrink_control;

/*
 * The executable's recvmsg() takes precedence over libc's for fdpass.o too
 * (as in tests/unit/test_fdpass.c); it forwards to the kernel.
 */
ssize_t
recvmsg(int fd, struct msghdr *msg, int flags)
{
	if (shrink_control != 0 && msg->msg_controllen > shrink_control)
		msg->msg_controllen = shrink_control;
	return syscall(SYS_recvmsg, fd, msg, flags);
}

/*
 * With a nonzero headroom, lowers RLIMIT_NOFILE so that only about that many
 * more descriptors can be opened: the kernel then installs some of a
 * message's descriptors, fails on the next (EMFILE) and says MSG_CTRUNC.
 * Returns how many descriptors can still be opened (SIZE_MAX: no limit set);
 * restore_limit() puts the old limit back.
 */
static struct rlimit saved_limit;

static size_t
lower_limit(unsigned headroom)
{
	struct rlimit lim;
	int top, open_now;

	if (headroom == 0)
		return SIZE_MAX;
	open_now = count_fds(&top);
	CHECK(getrlimit(RLIMIT_NOFILE, &saved_limit) == 0);
	lim = saved_limit;
	lim.rlim_cur = (rlim_t)top + headroom;
	if (lim.rlim_cur > saved_limit.rlim_cur)
		return SIZE_MAX;
	CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
	return (size_t)lim.rlim_cur - (size_t)open_now; /* free numbers below the limit */
}

static void
restore_limit(size_t room)
{
	if (room != SIZE_MAX)
		CHECK(setrlimit(RLIMIT_NOFILE, &saved_limit) == 0);
}

/* A new descriptor of the given kind (sock: the receiving socket). */
static int
make_fd(unsigned kind, int sock, int memfd, int pipe_end)
{
	int fd = -1;

	switch (kind & 3) {
	case 0:
		fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		break;
	case 1:
		fd = fcntl(memfd, F_DUPFD_CLOEXEC, 0);
		break;
	case 2:
		fd = fcntl(pipe_end, F_DUPFD_CLOEXEC, 0);
		break;
	case 3:
		fd = fcntl(sock, F_DUPFD_CLOEXEC, 0);
		break;
	}
	CHECK(fd >= 0);
	return fd;
}

/* Sends one message: bytes, descriptors (in one or two SCM_RIGHTS), and
 * credentials when asked. Returns sendmsg()'s result (-errno on error). */
static ssize_t
send_message(int sock, const void *buf, size_t len, const int *fds, size_t nfds, unsigned flags)
{
	static union {
		struct cmsghdr align;
		unsigned char buf[2 * CMSG_SPACE(sizeof(int) * KERNEL_SCM_MAX_FD) +
			CMSG_SPACE(sizeof(struct ucred))];
	} control;
	struct iovec iov = { .iov_base = (void *)(uintptr_t)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;
	size_t first = flags & F_SPLIT ? nfds / 2 : nfds, used = 0;
	ssize_t n;

	memset(&control, 0, sizeof(control));
	msg.msg_control = control.buf;
	msg.msg_controllen = sizeof(control.buf);
	c = CMSG_FIRSTHDR(&msg);
	if (flags & F_SEND_CREDS) {
		struct ucred cred = { .pid = getpid(), .uid = getuid(), .gid = getgid() };

		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_CREDENTIALS;
		c->cmsg_len = CMSG_LEN(sizeof(cred));
		memcpy(CMSG_DATA(c), &cred, sizeof(cred));
		used += CMSG_SPACE(sizeof(cred));
		c = (struct cmsghdr *)(control.buf + used);
	}
	for (size_t part = 0, at = 0; part < 2; part++) {
		size_t k = part == 0 ? first : nfds - first;

		if (k == 0)
			continue;
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * k);
		memcpy(CMSG_DATA(c), fds + at, sizeof(int) * k);
		used += CMSG_SPACE(sizeof(int) * k);
		c = (struct cmsghdr *)(control.buf + used);
		at += k;
	}
	msg.msg_controllen = used;
	if (used == 0)
		msg.msg_control = NULL;
	n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	return n < 0 ? -errno : n;
}

/*
 * How many descriptors the receiver's control buffer holds: fdpass.c's room
 * for FDP_MAX_FDS (the kernel's most) and credentials, or the shrunk size.
 * With SO_PASSCRED the kernel writes the credentials first and says
 * MSG_CTRUNC when they do not fit (then no descriptor fits: -1 here); the
 * descriptors get the rest.
 */
static long
control_fits(size_t shrink, int passcred)
{
	size_t room = CMSG_SPACE(sizeof(int) * FDP_MAX_FDS) + CMSG_SPACE(sizeof(struct ucred));

	if (shrink != 0 && shrink < room)
		room = shrink;
	if (passcred) {
		if (room < CMSG_LEN(sizeof(struct ucred)))
			return -1;
		room -= room < CMSG_SPACE(sizeof(struct ucred)) ? room :
								   CMSG_SPACE(sizeof(struct ucred));
	}
	return room > CMSG_LEN(0) ? (long)((room - CMSG_LEN(0)) / sizeof(int)) : 0;
}

/* Whether fd is the same file as want (fstat) and close-on-exec. */
static int
same_file(int fd, const struct stat *want)
{
	struct stat st;
	int fl = fcntl(fd, F_GETFD);

	return fl >= 0 && (fl & FD_CLOEXEC) && fstat(fd, &st) == 0 && st.st_dev == want->st_dev &&
		st.st_ino == want->st_ino;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t buf[WIRE_MAX_MESSAGE + 1];
	int sent[KERNEL_SCM_MAX_FD], got[256], sv[2], pipefd[2], memfd;
	struct stat sent_st[KERNEL_SCM_MAX_FD];
	size_t nsent, maxfds, cap, len, ngot = 9999, room;
	long fits;
	unsigned flags;
	const uint8_t *msg;
	ssize_t r, s;
	int before, one = 1;

	if (size < PARAMS)
		return 0;
	nsent = data[0] % (KERNEL_SCM_MAX_FD + 1);
	flags = data[1];
	maxfds = data[2];
	cap = (data[3] | (size_t)data[4] << 8) % (WIRE_MAX_MESSAGE + 1);
	msg = data + PARAMS;
	len = flags & F_EMPTY ? 0 : size - PARAMS;

	before = count_fds(NULL);
	CHECK(socketpair(AF_UNIX, (flags & F_DGRAM ? SOCK_DGRAM : SOCK_SEQPACKET) | SOCK_CLOEXEC,
		      0, sv) == 0);
	CHECK(pipe2(pipefd, O_CLOEXEC) == 0);
	memfd = memfd_create("fuzz_fdpass", MFD_CLOEXEC);
	CHECK(memfd >= 0);
	if (flags & F_PASSCRED)
		CHECK(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) == 0);
	for (size_t i = 0; i < nsent; i++) {
		unsigned kinds = data[6] | (unsigned)data[7] << 8;

		sent[i] = make_fd(kinds >> (2 * (i % 8)), sv[1], memfd, pipefd[0]);
		CHECK(fstat(sent[i], &sent_st[i]) == 0);
	}

	s = send_message(sv[0], msg, len, sent, nsent, flags);
	if (s < 0) {
		/* What the kernel refuses to send (a message larger than the
		 * socket buffer, in-flight limits) is not fdp_recv's concern. */
		CHECK(s == -EMSGSIZE || s == -ETOOMANYREFS || s == -ENOBUFS || s == -EAGAIN);
		goto out;
	}
	CHECK((size_t)s == len);
	if (flags & F_SECOND)
		CHECK(send_message(sv[0], "second", 6, sent,
			      flags & F_SECOND_FDS ? (nsent < 4 ? nsent : 4) : 0, 0) == 6);
	/* The sender's copies are closed: the received ones are the only ones. */
	for (size_t i = 0; i < nsent; i++)
		close(sent[i]);

	shrink_control = flags & F_SHRINK ? data[5] : 0;
	for (size_t i = 0; i < sizeof(got) / sizeof(got[0]); i++)
		got[i] = -7;
	room = lower_limit(data[8]);
	r = fdp_recv(sv[1], buf, cap, got, maxfds, &ngot);
	restore_limit(room);
	shrink_control = 0;

	fits = control_fits(flags & F_SHRINK ? data[5] : 0, flags & F_PASSCRED);

	if (r < 0) {
		CHECK(ngot == 9999);
		for (size_t i = 0; i < sizeof(got) / sizeof(got[0]); i++)
			CHECK(got[i] == -7);
		if (r == -EMSGSIZE) {
			CHECK(len > cap);
		} else if (r == -EMFILE) {
			CHECK((long)nsent > fits || fits < 0 || nsent > room);
		} else {
			CHECK(r == -EBADMSG);
			CHECK(nsent > maxfds && (long)nsent <= fits && nsent <= room);
		}
	} else if (r == 0) {
		CHECK(len == 0 && ngot == 0);
		for (size_t i = 0; i < sizeof(got) / sizeof(got[0]); i++)
			CHECK(got[i] == -7);
	} else {
		CHECK((size_t)r == len && len <= cap && memcmp(buf, msg, len) == 0);
		CHECK(ngot == nsent && ngot <= maxfds);
		for (size_t i = 0; i < ngot; i++)
			CHECK(same_file(got[i], &sent_st[i]));
		for (size_t i = ngot; i < sizeof(got) / sizeof(got[0]); i++)
			CHECK(got[i] == -7);
		fdp_close_all(got, ngot);
	}
	/* The predicted outcome: an error exactly when a rule says so. */
	if (fits < 0 || nsent > maxfds || (long)nsent > fits || nsent > room || len > cap)
		CHECK(r < 0);
	else if (len == 0)
		CHECK(r == 0);
	else
		CHECK(r > 0);

	if (flags & F_SECOND) {
		size_t n2 = 9999, want = flags & F_SECOND_FDS ? (nsent < 4 ? nsent : 4) : 0;

		for (size_t i = 0; i < sizeof(got) / sizeof(got[0]); i++)
			got[i] = -7;
		r = fdp_recv(sv[1], buf, sizeof(buf), got, WIRE_MAX_FDS, &n2);
		CHECK(r == 6 && memcmp(buf, "second", 6) == 0 && n2 == want);
		for (size_t i = 0; i < n2; i++)
			CHECK(same_file(got[i], &sent_st[i]));
		fdp_close_all(got, n2);
	}
	nsent = 0;
out:
	for (size_t i = 0; i < nsent; i++)
		close(sent[i]);
	close(sv[0]);
	close(sv[1]);
	close(pipefd[0]);
	close(pipefd[1]);
	close(memfd);
	CHECK(count_fds(NULL) == before);
	return 0;
}
