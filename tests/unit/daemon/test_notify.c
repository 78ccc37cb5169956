/*
 * test_notify.c: unit tests for daemon/notify.c: sd_notify datagrams to a
 * real filesystem socket and a real abstract socket (the exact bytes
 * received), the no-op and error cases of $NOTIFY_SOCKET, and socket
 * activation with real listening sockets placed at fds 3 and 4 the way
 * systemd places them; the file descriptor store's messages (FDSTORE=1
 * with real descriptors received and compared by inode, FDSTOREREMOVE=1)
 * and the list of every passed descriptor with its name (fds 3 to 6).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "listen.h"
#include "notify.h"
#include "testutil.h"

#define SAVED_FDS 4

struct fixture {
	char *dir;
	int saved_fd[SAVED_FDS]; /* what fds 3 .. 6 held before the test, or -1 */
};

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return -1;
	f->dir = tu_tmpdir();
	/* Keep whatever the test runner left at fds 3 and 4 out of the way so
	 * the tests can put activation sockets there. */
	for (int i = 0; i < SAVED_FDS; i++) {
		f->saved_fd[i] = -1;
		if (fcntl(3 + i, F_GETFD) >= 0) {
			f->saved_fd[i] = fcntl(3 + i, F_DUPFD_CLOEXEC, 10);
			if (f->saved_fd[i] < 0) {
				tu_rmtree(f->dir);
				free(f);
				return -1;
			}
			close(3 + i);
		}
	}
	unsetenv("NOTIFY_SOCKET");
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	notify_close();
	unsetenv("NOTIFY_SOCKET");
	listen_fds_unset();
	for (int i = 0; i < SAVED_FDS; i++) {
		close(3 + i);
		if (f->saved_fd[i] >= 0) {
			dup2(f->saved_fd[i], 3 + i);
			close(f->saved_fd[i]);
		}
	}
	tu_rmtree(f->dir);
	free(f);
	return 0;
}

/* A datagram socket bound to addr/len, to receive notifications. */
static int
bound_dgram(const struct sockaddr_un *addr, socklen_t len)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (const struct sockaddr *)addr, len), 0);
	return fd;
}

/* Receives one datagram without waiting (notify_send() has returned, so it
 * is already queued) and checks its exact bytes. */
static void
expect_datagram(int fd, const char *expect)
{
	char buf[NOTIFY_MAX_MESSAGE + 16];
	ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

	assert_int_equal(n, (ssize_t)strlen(expect));
	assert_memory_equal(buf, expect, strlen(expect));
}

/* A filesystem socket: "/path". */
static void
test_notify_path(void **state)
{
	struct fixture *f = *state;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	char big[NOTIFY_MAX_MESSAGE + 2];
	int fd, before;

	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/notify.sock", f->dir);
	fd = bound_dgram(&addr, sizeof(addr));
	assert_int_equal(setenv("NOTIFY_SOCKET", addr.sun_path, 1), 0);

	before = tu_count_fds();
	assert_int_equal(notify_init(), 1);
	assert_int_equal(tu_count_fds(), before + 1);
	assert_int_equal(notify_send("READY=1\nSTATUS=serving %d models", 2), 1);
	expect_datagram(fd, "READY=1\nSTATUS=serving 2 models");
	assert_int_equal(notify_send("STOPPING=1"), 1);
	expect_datagram(fd, "STOPPING=1");

	/* Exactly NOTIFY_MAX_MESSAGE bytes go; one more does not. */
	memset(big, 'x', sizeof(big));
	big[NOTIFY_MAX_MESSAGE] = '\0';
	assert_int_equal(notify_send("%s", big), 1);
	expect_datagram(fd, big);
	big[NOTIFY_MAX_MESSAGE] = 'x';
	big[NOTIFY_MAX_MESSAGE + 1] = '\0';
	assert_int_equal(notify_send("%s", big), -EMSGSIZE);
	assert_non_null(strstr(error_get(), "too long"));

	/* The manager went away: the error is reported, nothing crashes. */
	close(fd);
	unlink(addr.sun_path);
	assert_true(notify_send("STATUS=alone") < 0);
	assert_non_null(strstr(error_get(), "sendmsg"));

	/* A second init replaces the socket (no leak); close releases it. */
	before = tu_count_fds();
	assert_int_equal(notify_init(), 1);
	assert_int_equal(tu_count_fds(), before);
	notify_close();
	assert_int_equal(tu_count_fds(), before - 1);
	assert_int_equal(notify_send("READY=1"), 0);
}

/*
 * A manager that does not read: the receiver's queue (max_dgram_qlen, 10 by
 * default) fills, and notify_send() must not block. State changes are kept
 * in order and STATUS= lines coalesce into the newest; notify_flush() sends
 * them once the manager reads again.
 */
static void
test_notify_manager_not_reading(void **state)
{
	struct fixture *f = *state;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	char buf[NOTIFY_MAX_MESSAGE + 16];
	int fd, r, kept = 0, ready_at = -1, stopping_at = -1, i;
	char last_status[NOTIFY_MAX_MESSAGE + 16] = "";
	ssize_t n;

	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/notify.sock", f->dir);
	fd = bound_dgram(&addr, sizeof(addr));
	assert_int_equal(setenv("NOTIFY_SOCKET", addr.sun_path, 1), 0);
	assert_int_equal(notify_init(), 1);
	for (i = 0; i < 200; i++) {
		r = notify_send("STATUS=warming %d", i);
		assert_true(r == 1 || r == 2);
		kept += r == 2;
	}
	assert_true(kept > 0); /* the queue filled: it would have blocked */
	assert_int_equal(notify_send("READY=1"), 2);
	assert_int_equal(notify_send("STATUS=serving"), 2);
	assert_int_equal(notify_send("STOPPING=1"), 2);
	assert_true(notify_dropped_count() > 0);
	assert_int_equal(notify_flush(), 0); /* still nobody reads */

	/* The manager reads: everything kept arrives, state changes in order,
	 * only the newest STATUS= after them. */
	for (i = 0; i < 1000 && (r = notify_flush()) != 1; i++) {
		while ((n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
			buf[n] = '\0';
			if (strcmp(buf, "READY=1") == 0)
				ready_at = i;
			else if (strcmp(buf, "STOPPING=1") == 0)
				stopping_at = i;
			else if (strncmp(buf, "STATUS=", 7) == 0)
				snprintf(last_status, sizeof(last_status), "%s", buf);
		}
	}
	assert_int_equal(r, 1);
	while ((n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
		buf[n] = '\0';
		if (strcmp(buf, "STOPPING=1") == 0)
			stopping_at = i;
		else if (strcmp(buf, "READY=1") == 0)
			ready_at = i;
		else if (strncmp(buf, "STATUS=", 7) == 0)
			snprintf(last_status, sizeof(last_status), "%s", buf);
	}
	assert_true(ready_at >= 0 && stopping_at >= ready_at);
	assert_string_equal(last_status, "STATUS=serving");
	close(fd);
}

/* An abstract socket: "@name". The address length must count exactly the
 * name's bytes: with a trailing NUL it would be a different address and the
 * send would fail with ECONNREFUSED. */
static void
test_notify_abstract(void **state)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	char env[sizeof(addr.sun_path) + 1];
	socklen_t len;
	int fd, n;

	(void)state;
	n = snprintf(env, sizeof(env), "@wcache-test-notify-%ld-%d", (long)getpid(), rand());
	memcpy(addr.sun_path + 1, env + 1, (size_t)n - 1);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n);
	fd = bound_dgram(&addr, len);
	assert_int_equal(setenv("NOTIFY_SOCKET", env, 1), 0);

	assert_int_equal(notify_init(), 1);
	assert_int_equal(notify_send("READY=1\nSTATUS=%s", "warming llama"), 1);
	expect_datagram(fd, "READY=1\nSTATUS=warming llama");
	notify_close();
	close(fd);
}

/* Unset or empty: notifications are a no-op that succeeds. */
static void
test_notify_unset(void **state)
{
	(void)state;
	assert_int_equal(notify_init(), 0);
	assert_int_equal(notify_send("READY=1"), 0);
	assert_int_equal(setenv("NOTIFY_SOCKET", "", 1), 0);
	assert_int_equal(notify_init(), 0);
	assert_int_equal(notify_send("READY=1"), 0);
	notify_close();
	notify_close();
}

/* Values that are not a usable unix socket address. */
static void
test_notify_invalid(void **state)
{
	static const struct {
		const char *value;
		const char *reason;
	} cases[] = {
		{"relative/notify.sock", "must start with '/' or '@'"},
		{"vsock:2:1234", "must start with '/' or '@'"},
		{"@", "empty abstract socket name"},
	};
	char long_path[200], long_abstract[200];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(setenv("NOTIFY_SOCKET", cases[i].value, 1), 0);
		assert_int_equal(notify_init(), -EINVAL);
		assert_non_null(strstr(error_get(), cases[i].value));
		assert_non_null(strstr(error_get(), cases[i].reason));
		assert_int_equal(notify_send("READY=1"), 0);
	}

	/* sun_path has 108 bytes: a path of 107 fits with its NUL, 108 does not. */
	memset(long_path, 'p', sizeof(long_path));
	long_path[0] = '/';
	long_path[108] = '\0';
	assert_int_equal(setenv("NOTIFY_SOCKET", long_path, 1), 0);
	assert_int_equal(notify_init(), -EINVAL);
	assert_non_null(strstr(error_get(), "too long"));
	long_path[107] = '\0';
	assert_int_equal(setenv("NOTIFY_SOCKET", long_path, 1), 0);
	assert_int_equal(notify_init(), 1); /* valid even though nobody listens there */
	notify_close();

	/* An abstract name may use all 108 bytes ('@' + 107). */
	memset(long_abstract, 'a', sizeof(long_abstract));
	long_abstract[0] = '@';
	long_abstract[109] = '\0';
	assert_int_equal(setenv("NOTIFY_SOCKET", long_abstract, 1), 0);
	assert_int_equal(notify_init(), -EINVAL);
	assert_non_null(strstr(error_get(), "too long"));
	long_abstract[108] = '\0';
	assert_int_equal(setenv("NOTIFY_SOCKET", long_abstract, 1), 0);
	assert_int_equal(notify_init(), 1);
	notify_close();
}

/* Moves fd to target without FD_CLOEXEC (dup2 clears it), as systemd
 * passes activation fds. fd may already be target: socket() returns the
 * lowest free fd, which is 3 or 4 when the test closed them. */
static void
move_to(int fd, int target)
{
	if (fd == target) {
		assert_int_equal(fcntl(fd, F_SETFD, 0), 0);
		return;
	}
	assert_int_equal(dup2(fd, target), target);
	close(fd);
}

/* A bound AF_UNIX socket of the given type in the fixture's directory,
 * listening when listening is set, moved to fd target (without FD_CLOEXEC,
 * as systemd passes it). */
static void
socket_at(struct fixture *f, int type, int listening, int target)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/listen-%d.sock", f->dir, target);
	assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	if (listening)
		assert_int_equal(listen(fd, 8), 0);
	move_to(fd, target);
	assert_int_equal(fcntl(target, F_GETFD) & FD_CLOEXEC, 0);
}

/* Sets LISTEN_PID (to this process plus pid_offset), LISTEN_FDS and, when
 * names is not NULL, LISTEN_FDNAMES. */
static void
set_listen_env(long pid_offset, const char *count, const char *names)
{
	char pid[32];

	snprintf(pid, sizeof(pid), "%ld", (long)getpid() + pid_offset);
	assert_int_equal(setenv("LISTEN_PID", pid, 1), 0);
	assert_int_equal(setenv("LISTEN_FDS", count, 1), 0);
	if (names != NULL)
		assert_int_equal(setenv("LISTEN_FDNAMES", names, 1), 0);
	else
		unsetenv("LISTEN_FDNAMES");
}

/* The named fd is found, checked and made close-on-exec. */
static void
test_listen_take(void **state)
{
	struct fixture *f = *state;
	int fd = -1;

	socket_at(f, SOCK_SEQPACKET, 1, 3);
	socket_at(f, SOCK_STREAM, 1, 4);
	set_listen_env(0, "2", "client:control");

	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), 1);
	assert_int_equal(fd, 3);
	assert_int_equal(fcntl(3, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

	fd = -1;
	assert_int_equal(listen_fds_take("control", SOCK_STREAM, &fd), 1);
	assert_int_equal(fd, 4);
	assert_int_equal(fcntl(4, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

	/* A name that is not there: the caller makes its own socket. */
	fd = -1;
	assert_int_equal(listen_fds_take("metrics", SOCK_STREAM, &fd), 0);
	assert_int_equal(listen_fds_take("clien", SOCK_SEQPACKET, &fd), 0);
	assert_int_equal(fd, -1);

	/* Without names every fd is "unknown"; the first one is taken. */
	set_listen_env(0, "2", NULL);
	assert_int_equal(listen_fds_take("unknown", SOCK_SEQPACKET, &fd), 1);
	assert_int_equal(fd, 3);
	fd = -1;
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), 0);

	listen_fds_unset();
	assert_null(getenv("LISTEN_PID"));
	assert_null(getenv("LISTEN_FDS"));
	assert_null(getenv("LISTEN_FDNAMES"));
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), 0);
	assert_int_equal(fd, -1);
}

/* No activation for this process: 0, nothing touched. */
static void
test_listen_not_ours(void **state)
{
	struct fixture *f = *state;
	int fd = -1;

	socket_at(f, SOCK_SEQPACKET, 1, 3);
	set_listen_env(1, "1", "client");
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), 0);
	assert_int_equal(fd, -1);
	assert_int_equal(fcntl(3, F_GETFD) & FD_CLOEXEC, 0);

	set_listen_env(0, "0", "");
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), 0);
	unsetenv("LISTEN_FDS");
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), 0);
	assert_int_equal(fd, -1);
}

/* Mismatches and malformed variables are errors with a message. */
static void
test_listen_errors(void **state)
{
	struct fixture *f = *state;
	int fd = -1, pipefd[2];

	socket_at(f, SOCK_SEQPACKET, 1, 3);
	socket_at(f, SOCK_SEQPACKET, 0, 4); /* bound, not listening */

	set_listen_env(0, "2", "client:control");
	assert_int_equal(listen_fds_take("client", SOCK_STREAM, &fd), -EINVAL);
	assert_non_null(strstr(error_get(), "fd 3 (\"client\") has socket type"));
	assert_int_equal(listen_fds_take("client", SOCK_DGRAM, &fd), -EINVAL);
	assert_int_equal(listen_fds_take("control", SOCK_SEQPACKET, &fd), -EINVAL);
	assert_non_null(strstr(error_get(), "fd 4 (\"control\") is not a listening socket"));
	assert_int_equal(fd, -1);

	set_listen_env(0, "2", "client");
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), -EINVAL);
	assert_non_null(strstr(error_get(), "LISTEN_FDNAMES=client has 1 names but LISTEN_FDS=2"));

	set_listen_env(0, "two", "client");
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), -EINVAL);
	assert_non_null(strstr(error_get(), "LISTEN_FDS=two"));

	assert_int_equal(setenv("LISTEN_PID", "12x", 1), 0);
	assert_int_equal(listen_fds_take("client", SOCK_SEQPACKET, &fd), -EINVAL);
	assert_non_null(strstr(error_get(), "LISTEN_PID=12x"));

	/* Not a socket at all (the pipe is made while fd 4 is taken, so it
	 * lands elsewhere; dup2 then replaces the socket at 4). */
	assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
	assert_true(pipefd[0] > 4 && pipefd[1] > 4);
	move_to(pipefd[0], 4);
	close(pipefd[1]);
	set_listen_env(0, "2", "client:control");
	assert_int_equal(listen_fds_take("control", SOCK_SEQPACKET, &fd), -EINVAL);
	assert_non_null(strstr(error_get(), "fd 4 (\"control\") is not a socket"));

	/* A count that points past the fds that are open. */
	close(4);
	assert_int_equal(listen_fds_take("control", SOCK_SEQPACKET, &fd), -EBADF);
	assert_non_null(strstr(error_get(), "fd 4 (\"control\") is not open"));

	/* A socket of another family. */
	{
		int inet = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (inet >= 0) {
			move_to(inet, 4);
			assert_int_equal(listen_fds_take("control", SOCK_STREAM, &fd), -EINVAL);
			assert_non_null(strstr(error_get(), "is not a unix socket"));
		}
	}
	assert_int_equal(fd, -1);
}

/* ---- the file descriptor store ---------------------------------------- */

/* Receives one datagram with its descriptors, without waiting. */
static ssize_t
recv_with_fds(int sock, char *buf, size_t cap, int *fds, size_t max, size_t *n)
{
	union {
		struct cmsghdr align;
		unsigned char buf[CMSG_SPACE(sizeof(int) * NOTIFY_MAX_STORE_FDS)];
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
		.msg_controllen = sizeof(control.buf) };
	struct cmsghdr *c;
	ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	*n = 0;
	for (c = CMSG_FIRSTHDR(&msg); r >= 0 && c != NULL; c = CMSG_NXTHDR(&msg, c)) {
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		assert_true(c->cmsg_type == SCM_RIGHTS && *n + k <= max);
		memcpy(fds + *n, CMSG_DATA(c), k * sizeof(int));
		*n += k;
	}
	return r;
}

/* Whether a and b are the same open file. */
static int
same_file(int a, int b)
{
	struct stat x, y;

	assert_int_equal(fstat(a, &x), 0);
	assert_int_equal(fstat(b, &y), 0);
	return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* FDSTORE=1 carries the descriptors to the manager; FDSTOREREMOVE=1 names
 * them; bad names and counts are refused before anything is sent; with
 * notifications off nothing is sent; a full queue is -EAGAIN, not a
 * queued descriptor. */
static void
test_store_fds(void **state)
{
	struct fixture *f = *state;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	char buf[512], longname[300];
	int manager, fds[2] = { -1, -1 }, got[8], before, r = 0, tries;
	size_t n;

	assert_int_equal(notify_store_fds("wc-1-1-i", fds, 1), 0); /* off: nothing */
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/notify.sock", f->dir);
	manager = bound_dgram(&addr, sizeof(addr));
	assert_int_equal(setenv("NOTIFY_SOCKET", addr.sun_path, 1), 0);
	assert_int_equal(notify_init(), 1);
	fds[0] = memfd_create("wctest-store", MFD_CLOEXEC);
	assert_true(fds[0] >= 0);
	assert_int_equal(pipe2(got, O_CLOEXEC), 0);
	fds[1] = got[0];
	close(got[1]);
	before = tu_count_fds();

	assert_int_equal(notify_store_fds("wc-1-1-i", fds, 2), 1);
	assert_int_equal(tu_count_fds(), before); /* ours stay ours, no copy kept */
	memset(buf, 0, sizeof(buf));
	assert_int_equal(recv_with_fds(manager, buf, sizeof(buf), got, 8, &n),
		(ssize_t)strlen("FDSTORE=1\nFDNAME=wc-1-1-i"));
	assert_string_equal(buf, "FDSTORE=1\nFDNAME=wc-1-1-i");
	assert_int_equal(n, 2);
	assert_true(same_file(got[0], fds[0]));
	assert_true(same_file(got[1], fds[1]));
	close(got[0]);
	close(got[1]);

	assert_int_equal(notify_remove_fds("wc-1-1-i"), 1);
	expect_datagram(manager, "FDSTOREREMOVE=1\nFDNAME=wc-1-1-i");

	/* Names systemd would refuse, and counts. */
	assert_int_equal(notify_store_fds("wc:1", fds, 1), -EINVAL);
	assert_non_null(strstr(error_get(), "FDNAME=\"wc:1\""));
	assert_int_equal(notify_store_fds("", fds, 1), -EINVAL);
	assert_int_equal(notify_store_fds("a\nFDSTOREREMOVE=1", fds, 1), -EINVAL);
	memset(longname, 'x', sizeof(longname));
	longname[NOTIFY_MAX_FDNAME] = '\0';
	assert_int_equal(notify_store_fds(longname, fds, 1), 1); /* 255 bytes: fine */
	assert_true(recv_with_fds(manager, buf, sizeof(buf), got, 8, &n) > 0 && n == 1);
	close(got[0]);
	longname[NOTIFY_MAX_FDNAME] = 'x';
	longname[NOTIFY_MAX_FDNAME + 1] = '\0';
	assert_int_equal(notify_store_fds(longname, fds, 1), -EINVAL);
	assert_int_equal(notify_remove_fds(longname), -EINVAL);
	assert_int_equal(notify_store_fds("wc-1-1-0", fds, 0), -EINVAL);
	assert_int_equal(notify_store_fds("wc-1-1-0", fds, NOTIFY_MAX_STORE_FDS + 1), -EINVAL);
	assert_non_null(strstr(error_get(), "254 descriptors, not 1 to 253"));
	assert_int_equal(recv(manager, buf, sizeof(buf), MSG_DONTWAIT), -1); /* nothing sent */

	/* As many as the kernel passes in one message (more than the client
	 * protocol's WIRE_MAX_FDS), the same descriptor each time. */
	{
		int many[NOTIFY_MAX_STORE_FDS], back[NOTIFY_MAX_STORE_FDS];

		for (size_t i = 0; i < NOTIFY_MAX_STORE_FDS; i++)
			many[i] = fds[0];
		assert_int_equal(notify_store_fds("wc-1-1-m", many, NOTIFY_MAX_STORE_FDS), 1);
		assert_true(recv_with_fds(manager, buf, sizeof(buf), back, NOTIFY_MAX_STORE_FDS,
			&n) > 0);
		assert_int_equal(n, NOTIFY_MAX_STORE_FDS);
		for (size_t i = 0; i < n; i++) {
			assert_true(same_file(back[i], fds[0]));
			close(back[i]);
		}
		assert_int_equal(tu_count_fds(), before);
	}

	/* The manager stops reading: -EAGAIN once its queue is full, with a
	 * message, and no descriptor kept anywhere on our side. */
	for (tries = 0; tries < 1000 && (r = notify_store_fds("wc-1-1-0", fds, 1)) == 1; tries++)
		;
	assert_int_equal(r, -EAGAIN);
	assert_non_null(strstr(error_get(), "queue is full"));
	assert_int_equal(tu_count_fds(), before);
	close(manager); /* its queued copies go with it */
	close(fds[0]);
	close(fds[1]);
}

/* A manager's socket at f->dir/notify.sock, and notifications to it. */
static int
manager_socket(struct fixture *f)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd;

	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/notify.sock", f->dir);
	fd = bound_dgram(&addr, sizeof(addr));
	assert_int_equal(setenv("NOTIFY_SOCKET", addr.sun_path, 1), 0);
	assert_int_equal(notify_init(), 1);
	return fd;
}

/* Reads, without waiting, the datagrams the manager has into text[*n ..
 * max) (each NUL-terminated, cap bytes), closing any descriptor one
 * carries. Returns how many it read. */
static size_t
drain(int manager, char (*text)[128], size_t *n, size_t max)
{
	char buf[NOTIFY_MAX_MESSAGE + 16];
	int fds[NOTIFY_MAX_STORE_FDS];
	size_t k = 0, nfds;
	ssize_t got;

	while ((got = recv_with_fds(manager, buf, sizeof(buf) - 1, fds, NOTIFY_MAX_STORE_FDS,
			&nfds)) >= 0) {
		buf[got] = '\0';
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		assert_true(*n < max && (size_t)got < sizeof(text[0]));
		memcpy(text[(*n)++], buf, (size_t)got + 1);
		k++;
	}
	return k;
}

/*
 * A generation of 163 shards closing while the manager does not read (its
 * queue full): 164 removals (the index and each file). Each is kept, none
 * dropped (the queue of state changes held 8 before, and the rest were
 * lost: stale descriptors in the store, names reused); a store waits
 * behind them (-EAGAIN), and READY=1 after them is kept. Once the manager
 * reads, every removal arrives, in order, READY=1 too, and then the store
 * goes.
 */
static void
test_notify_removals_never_dropped(void **state)
{
	struct fixture *f = *state;
	static char got[4096][128];
	char name[64], expect[128];
	size_t n = 0, removal = 0;
	int manager = manager_socket(f), kept = 0, ready = 0, fd, r = 0, i;
	uint64_t dropped;

	/* The manager's queue full, however long the kernel makes it
	 * (net.unix.max_dgram_qlen). */
	for (i = 0; i < 1000000 && (r = notify_send("STATUS=filling %d", i)) == 1; i++)
		;
	assert_int_equal(r, 2);
	dropped = notify_dropped_count();
	for (i = 0; i < 164; i++) {
		snprintf(name, sizeof(name), "wc-1-1-%d", i);
		r = notify_remove_fds(name);
		kept += r == 2;
	}
	assert_int_equal(kept, 164);
	r = notify_send("READY=1");
	assert_true(r == 2);
	fd = memfd_create("wctest-desc", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(notify_store_fds("wc-desc", &fd, 1), -EAGAIN);
	assert_int_equal(notify_flush(), 0); /* still nobody reads */

	/* The manager reads. */
	for (i = 0; i < 1000 && (r = notify_flush()) != 1; i++)
		drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	assert_int_equal(r, 1);
	drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	assert_int_equal(notify_store_fds("wc-desc", &fd, 1), 1);
	drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	close(fd);
	for (size_t k = 0; k < n; k++) {
		if (strncmp(got[k], "STATUS=", 7) == 0)
			continue;
		if (strcmp(got[k], "READY=1") == 0) {
			ready++;
			continue;
		}
		if (strcmp(got[k], "FDSTORE=1\nFDNAME=wc-desc") == 0) {
			assert_int_equal(k, n - 1); /* after every removal */
			continue;
		}
		snprintf(expect, sizeof(expect), "FDSTOREREMOVE=1\nFDNAME=wc-1-1-%zu", removal++);
		assert_string_equal(got[k], expect);
	}
	assert_int_equal(removal, 164);
	assert_int_equal(ready, 1);
	assert_string_equal(got[n - 1], "FDSTORE=1\nFDNAME=wc-desc");
	assert_int_equal(notify_dropped_count(), dropped);
	close(manager);
}

/*
 * READY=1 and STOPPING=1 are never dropped: with 8 state changes kept
 * already they wait (a manager that never hears READY=1 kills the unit
 * after TimeoutStartSec=), and a droppable state change after them is
 * dropped rather than sent before them. Once the manager reads: the 8 in
 * order, then READY=1, then STOPPING=1.
 */
static void
test_notify_ready_and_stopping_never_dropped(void **state)
{
	struct fixture *f = *state;
	static char got[4096][128];
	char expect[64];
	size_t n = 0, state_at = 0;
	int manager = manager_socket(f), r = 0, i, states, queued = 0;

	/* The manager's queue (however long: net.unix.max_dgram_qlen), then
	 * ours. */
	for (states = 0; states < 4000 && (r = notify_send("X-STATE=%d", states)) != -EAGAIN;
		states++)
		queued += r == 2;
	assert_int_equal(r, -EAGAIN);
	assert_int_equal(queued, 8);
	assert_int_equal(notify_send("READY=1"), 2);
	assert_int_equal(notify_send("RELOADING=1\nSTATUS=reloading"), -EAGAIN);
	assert_int_equal(notify_send("STOPPING=1"), 2);
	assert_int_equal(notify_send("STATUS=stopping"), 2);

	for (i = 0; i < 1000 && (r = notify_flush()) != 1; i++)
		drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	assert_int_equal(r, 1);
	drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	/* X-STATE=0 .. states - 1 in order, READY=1, STOPPING=1, the newest STATUS=. */
	assert_int_equal(n, (size_t)states + 3);
	for (state_at = 0; state_at < (size_t)states; state_at++) {
		snprintf(expect, sizeof(expect), "X-STATE=%zu", state_at);
		assert_string_equal(got[state_at], expect);
	}
	assert_string_equal(got[state_at], "READY=1");
	assert_string_equal(got[state_at + 1], "STOPPING=1");
	assert_string_equal(got[state_at + 2], "STATUS=stopping");
	close(manager);
}

/* A removal kept, then a store under the same name (the description is
 * replaced so): the store goes only after the removal, never before it,
 * or the manager would drop the new description with the old. */
static void
test_notify_store_after_removal(void **state)
{
	struct fixture *f = *state;
	static char got[4096][128];
	size_t n = 0;
	int manager = manager_socket(f), fd, r = 0, i;

	for (i = 0; i < 4000 && (r = notify_send("X-STATE=%d", i)) == 1; i++)
		;
	assert_int_equal(r, 2); /* the manager's queue is full */
	assert_int_equal(notify_remove_fds("wc-desc"), 2);
	fd = memfd_create("wctest-desc", MFD_CLOEXEC);
	assert_true(fd >= 0);
	/* The manager reads what it has, not what we kept. */
	drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	assert_int_equal(notify_store_fds("wc-desc", &fd, 1), 1);
	drain(manager, got, &n, sizeof(got) / sizeof(got[0]));
	assert_true(n >= 2);
	assert_string_equal(got[n - 2], "FDSTOREREMOVE=1\nFDNAME=wc-desc");
	assert_string_equal(got[n - 1], "FDSTORE=1\nFDNAME=wc-desc");
	close(fd);
	close(manager);
}

/* A memfd moved to target without FD_CLOEXEC, as systemd passes back what
 * the store holds. */
static void
memfd_at(int target)
{
	int fd = memfd_create("wctest-passed", 0);

	assert_true(fd >= 0);
	move_to(fd, target);
}

/* Every passed descriptor with its name: the sockets and the store's
 * memfds together, made close-on-exec; the same errors as take. */
static void
test_listen_list(void **state)
{
	struct fixture *f = *state;
	struct listen_fd *v = (struct listen_fd *)&v;
	size_t n = 99;

	assert_int_equal(listen_fds_list(&v, &n), 0); /* no activation */
	assert_null(v);
	assert_int_equal(n, 0);

	socket_at(f, SOCK_SEQPACKET, 1, 3);
	socket_at(f, SOCK_STREAM, 1, 4);
	memfd_at(5);
	memfd_at(6);
	set_listen_env(0, "4", "client:control:wc-status:wc-1-2-i");
	assert_int_equal(listen_fds_list(&v, &n), 4);
	assert_int_equal(n, 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(v[i].fd, 3 + i);
		assert_int_equal(fcntl(3 + i, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	}
	assert_string_equal(v[0].name, "client");
	assert_string_equal(v[1].name, "control");
	assert_string_equal(v[2].name, "wc-status");
	assert_string_equal(v[3].name, "wc-1-2-i");
	listen_fds_free(v, n);
	listen_fds_free(NULL, 0);

	/* Without names every fd is "unknown". */
	set_listen_env(0, "2", NULL);
	assert_int_equal(listen_fds_list(&v, &n), 2);
	assert_string_equal(v[0].name, "unknown");
	assert_string_equal(v[1].name, "unknown");
	listen_fds_free(v, n);

	/* Another process's, a wrong count, a closed fd. */
	v = (struct listen_fd *)&v;
	set_listen_env(1, "4", "client:control:wc-status:wc-1-2-i");
	assert_int_equal(listen_fds_list(&v, &n), 0);
	assert_null(v);
	set_listen_env(0, "4", "client:control");
	assert_int_equal(listen_fds_list(&v, &n), -EINVAL);
	assert_non_null(strstr(error_get(), "has 2 names but LISTEN_FDS=4"));
	close(6);
	set_listen_env(0, "4", "client:control:wc-status:wc-1-2-i");
	assert_int_equal(listen_fds_list(&v, &n), -EBADF);
	assert_non_null(strstr(error_get(), "fd 6 (\"wc-1-2-i\") is not open"));
	set_listen_env(0, "x", NULL);
	assert_int_equal(listen_fds_list(&v, &n), -EINVAL);
	assert_non_null(strstr(error_get(), "LISTEN_FDS=x"));
}

/* The pure parser: empty names are kept as they are, in order. */
static void
test_listen_parse_all(void **state)
{
	struct listen_fd *v = NULL;
	size_t n = 0;

	(void)state;
	assert_int_equal(listen_fds_parse_all("7", "3", "a::b", 7, &v, &n), 3);
	assert_string_equal(v[0].name, "a");
	assert_string_equal(v[1].name, "");
	assert_string_equal(v[2].name, "b");
	assert_int_equal(v[2].fd, 5);
	listen_fds_free(v, n);
	assert_int_equal(listen_fds_parse_all("7", "0", "", 7, &v, &n), 0);
	assert_int_equal(listen_fds_parse_all(NULL, "1", "a", 7, &v, &n), 0);
	assert_int_equal(listen_fds_parse_all("7x", "1", "a", 7, &v, &n), -EINVAL);
	assert_int_equal(listen_fds_parse_all("7", "2", "a", 7, &v, &n), -EINVAL);
	assert_int_equal(listen_fds_parse_all("7", "65537", NULL, 7, &v, &n), -EINVAL);
	assert_non_null(strstr(error_get(), "more than 65536"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_notify_path, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify_manager_not_reading, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify_removals_never_dropped, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_notify_ready_and_stopping_never_dropped, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_notify_store_after_removal, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify_abstract, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify_unset, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify_invalid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_take, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_not_ours, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_list, setup, teardown),
		cmocka_unit_test(test_listen_parse_all),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
