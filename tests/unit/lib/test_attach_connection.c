/*
 * test_attach_connection.c: libwcache's connection to wcached
 * (client/lib/request.c, attach.c) when the daemon's replies are wrong, when it
 * refuses the client, and when it restarts, against a fake, hostile
 * wcached: replies to another request, ERRORs, a daemon that closes,
 * garbage, truncated and mistyped replies; the refusal of a client over
 * wcached's limits, however its send, close and the client's receive
 * interleave; a daemon that restarts between attaches or during one (with
 * or without HOLD), that is gone for good, or that hangs up and then does
 * not answer within the client's deadline; a receive that says EAGAIN
 * before the deadline (a descriptor made non-blocking); every close of
 * libwcache's own (request_close_because()), each with what the build it
 * ended and the next request say.
 *
 * Each test checks the exact code, a substring of wc_errmsg(), that the
 * process holds as many descriptors afterwards as before and what the fake
 * daemon saw: attaches, connections, releases and their handles
 * (attach_fixture.h).
 *
 * Fault injection uses the linker's --wrap (tests/CMakeLists.txt links this
 * test with -Wl,--wrap=recvmsg and compiles it with -U_FORTIFY_SOURCE):
 * __wrap_recvmsg lets a test order the client's next receive against the
 * fake daemon's close, which makes the refusal races deterministic, or
 * make it fail with EAGAIN before the deadline; __wrap_sendmsg and
 * __wrap_connect (with --wrap=sendmsg, --wrap=connect) fail a send or a
 * connect, or make a connect slow. A wait that poll(2) fails needs no
 * wrapper: RLIMIT_NOFILE at 0 fails it for real.
 * __real_recvmsg is weak, so a build without that option still links; the
 * tests that need it then report SKIPPED.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "attach_fixture.h"
#include "fakedaemon.h"
#include "testutil.h"
#include "lib/wcache.h"
#include "proto/fdpass.h"
#include "proto/wire.h"

#define REFUSAL "too many clients connected to wcached (max_clients)"

/* The deadline of the tests of deadlines, a signal that comes before it,
 * and how much later than the deadline a wait may end on a loaded machine
 * (less than the deadline less the signal's time: what a second whole
 * deadline after the signal would add). */
#define DEADLINE_TEST_MS 400
#define ALARM_MS 300
#define SLACK_S 0.15

/* ---- fault injection ---------------------------------------------------- */

ssize_t __real_recvmsg(int fd, struct msghdr *msg, int flags) __attribute__((weak));
ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags);

/* recvmsg() with four hooks for the client's thread (the fake daemon's
 * thread is left alone): fail with EAGAIN at once, receiving nothing (as a
 * non-blocking descriptor does before the reply), wait for the fake's
 * close before receiving, tell the fake once something was received, or
 * hold descriptors just received (before any model has them) until the
 * test lets them go. */
ssize_t
__wrap_recvmsg(int fd, struct msghdr *msg, int flags)
{
	int mine = pthread_equal(pthread_self(), fault.client);
	ssize_t n;
	int e;

	if (mine && fault.recv_eagain > 0) {
		fault.recv_eagain--;
		errno = EAGAIN;
		return -1;
	}
	if (mine && fault.recv_wait_close) {
		fault.recv_wait_close = 0;
		(void)fake_sem_wait(&fault.closed);
	}
	n = __real_recvmsg(fd, msg, flags);
	e = errno;
	if (mine && fault.recv_post_read) {
		fault.recv_post_read = 0;
		sem_post(&fault.read);
	}
	if (mine && fault.recv_hold && n > 0 && msg->msg_controllen > 0) {
		fault.recv_hold = 0;
		sem_post(&fault.read);
		(void)fake_sem_wait(&fault.go);
	}
	errno = e;
	return n;
}

ssize_t __real_sendmsg(int fd, const struct msghdr *msg, int flags) __attribute__((weak));
ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);

/* sendmsg() of the client's thread failing fault.send_count times with
 * fault.send_errno (EAGAIN as a non-blocking descriptor whose buffer is
 * full, EINTR as a signal makes a send with SO_SNDTIMEO), sending nothing. */
ssize_t
__wrap_sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (pthread_equal(pthread_self(), fault.client) && fault.send_count > 0) {
		fault.send_count--;
		errno = fault.send_errno;
		return -1;
	}
	return __real_sendmsg(fd, msg, flags);
}

/* Skips the test unless it was linked with -Wl,--wrap=recvmsg. */
#define NEED_WRAP() af_need_wrap(__real_recvmsg != NULL, "-Wl,--wrap=recvmsg")

/*
 * The fork probe: another thread's fork() at a chosen point of a
 * reconnect, from a system call of the client's thread (the connect of
 * its new socket, or the first fstat() of a socket). The probe's thread
 * forks, and the client's thread waits up to FORK_PROBE_WAIT_S for that
 * fork to happen before it goes on; a fork that cannot happen then (the
 * client holds what fork() waits for) happens later. The child lets the
 * parent's client go (wc_release, wc_disconnect) and exits 0 only if
 * neither the socket being connected nor the client's socket from before
 * the reconnect is still open in it: 3 when the new socket is, 4 when the
 * old one is. Each is judged by its identity (device and inode taken in
 * the parent), not its number: the fake daemon runs in this process, and
 * its accept() may take the number the client's close() just freed before
 * the fork (ci54 failed so).
 */
#define FORK_PROBE_WAIT_S 1
enum { FORK_AT_NONE, FORK_AT_CONNECT, FORK_AT_FSTAT };
static struct {
	int at;            /* where: FORK_AT_*, cleared when the probe fires */
	struct fixture *f;
	int fd;            /* the new socket */
	struct stat fd_st; /* its identity */
	int old;           /* the client's socket before the reconnect */
	struct stat old_st;
	pthread_t thread;
	int started;
	sem_t forked;      /* posted by the probe's thread once fork() returned */
	int status;        /* the child's, from waitpid() */
} fork_probe;

/* Whether fd is open and the file st names (fstat() passes through the
 * wrapper below while the probe is not armed). */
static int
still_open(int fd, const struct stat *st)
{
	struct stat now;

	return fd >= 0 && fstat(fd, &now) == 0 && now.st_dev == st->st_dev &&
		now.st_ino == st->st_ino;
}

static void *
fork_probe_run(void *arg)
{
	pid_t pid;

	(void)arg;
	if ((pid = fork()) == 0) {
		struct fixture *f = fork_probe.f;
		int code = 0;

		alarm(20);
		wc_release(f->model);
		wc_disconnect(f->client);
		if (still_open(fork_probe.fd, &fork_probe.fd_st))
			code = 3;
		else if (still_open(fork_probe.old, &fork_probe.old_st))
			code = 4;
		_exit(code);
	}
	sem_post(&fork_probe.forked);
	if (pid < 0 || waitpid(pid, &fork_probe.status, 0) != pid)
		fork_probe.status = -1;
	return NULL;
}

/* Fires the probe: fd is the new socket. */
static void
fork_probe_now(int fd)
{
	struct timespec until;

	fork_probe.at = FORK_AT_NONE;
	fork_probe.fd = fd;
	assert_int_equal(fstat(fd, &fork_probe.fd_st), 0);
	if (pthread_create(&fork_probe.thread, NULL, fork_probe_run, NULL) != 0)
		return;
	fork_probe.started = 1;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FORK_PROBE_WAIT_S;
	while (sem_timedwait(&fork_probe.forked, &until) == -1 && errno == EINTR)
		;
}

int __real_connect(int fd, const struct sockaddr *sa, socklen_t len) __attribute__((weak));
int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len);

/* connect() failing with EINTR, as a signal makes it (a socket with
 * SO_SNDTIMEO is never restarted), fault.connect_eintr times first; or,
 * once, taking fault.connect_delay_ms before it connects, as a connect
 * that waits for room in a busy daemon's backlog. */
int
__wrap_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	if (fault.connect_delay_ms > 0) {
		usleep((useconds_t)fault.connect_delay_ms * 1000);
		fault.connect_delay_ms = 0;
	}
	if (fault.connect_eintr > 0) {
		fault.connect_eintr--;
		errno = EINTR;
		return -1;
	}
	int r = __real_connect(fd, sa, len);

	if (r == 0 && fork_probe.at == FORK_AT_CONNECT)
		fork_probe_now(fd);
	return r;
}

int __real_fstat(int fd, struct stat *st) __attribute__((weak));
int __wrap_fstat(int fd, struct stat *st);

/* fstat(), with the fork probe at the client thread's next fstat() of a
 * socket when armed (FORK_AT_FSTAT). */
int
__wrap_fstat(int fd, struct stat *st)
{
	int r = __real_fstat(fd, st);

	if (r == 0 && S_ISSOCK(st->st_mode) && fork_probe.at == FORK_AT_FSTAT &&
		pthread_equal(pthread_self(), fault.client))
		fork_probe_now(fd);
	return r;
}

/*
 * A timer's signal, as a worker's own timer or SIGCHLD would come: SIGALRM
 * with a handler and without SA_RESTART (a connect with SO_SNDTIMEO is
 * never restarted anyway). The handler counts, and accepts one connection
 * on alarm_listen_fd when that is set, making room in a full backlog.
 */
static volatile sig_atomic_t alarms, alarm_listen_fd = -1, alarm_accepted = -1, alarm_max;

static void
on_alarm(int sig)
{
	int e = errno;

	(void)sig;
	alarms++;
	if (alarm_listen_fd >= 0)
		alarm_accepted = accept4(alarm_listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (alarm_max > 0 && alarms >= alarm_max) {
		/* An interval timer's last signal (alarm_every). */
		struct itimerval off = { 0 };

		setitimer(ITIMER_REAL, &off, NULL);
	}
	errno = e;
}

/* Sends SIGALRM every ms, max times; *old gets the handler before. */
static void
alarm_every(int ms, int max, struct sigaction *old)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	struct timeval every = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	struct itimerval it = { .it_interval = every, .it_value = every };

	alarms = 0;
	alarm_max = max;
	assert_int_equal(sigaction(SIGALRM, &sa, old), 0);
	assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
}

/* Sends SIGALRM to this process after ms; *old gets the handler before. */
static void
alarm_after(int ms, struct sigaction *old)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	struct itimerval it = { .it_value = { .tv_sec = ms / 1000,
		.tv_usec = (suseconds_t)(ms % 1000) * 1000 } };

	alarms = 0;
	assert_int_equal(sigaction(SIGALRM, &sa, old), 0);
	assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
}

/* Stops the timer and puts old back. */
static void
alarm_off(const struct sigaction *old)
{
	struct itimerval it = { 0 };

	assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
	assert_int_equal(sigaction(SIGALRM, old, NULL), 0);
	alarm_listen_fd = -1;
	alarm_max = 0;
}

/* Connects to the socket at path without blocking until its backlog is
 * full: the descriptors go to fds (at most max); returns their number. */
static size_t
fill_backlog(const char *path, int *fds, size_t max)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = 0;

	assert_true(strlen(path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	while (n < max) {
		int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

		assert_true(fd >= 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == -1) {
			assert_int_equal(errno, EAGAIN); /* full */
			close(fd);
			return n;
		}
		fds[n++] = fd;
	}
	fail_msg("%s: the backlog took %zu connections", path, max);
	return n;
}

/* Asserts that a wait that began at t0 with a deadline of
 * DEADLINE_TEST_MS ended at it, or at most SLACK_S later. */
static void
assert_waited_deadline(double t0)
{
	double waited = tu_now() - t0, deadline = DEADLINE_TEST_MS / 1000.0;

	if (waited < deadline - 0.01 || waited > deadline + SLACK_S)
		fail_msg("waited %.3f s for a deadline of %.3f s", waited, deadline);
}

/* ---- helpers ------------------------------------------------------------ */

/* Sets a raw reply. */
static void
fake_raw(struct fixture *f, const void *bytes, size_t len)
{
	assert_true(len <= sizeof(f->fake.raw));
	f->fake.kind = REPLY_RAW;
	memcpy(f->fake.raw, bytes, len);
	f->fake.raw_len = len;
}

/* ---- replies ------------------------------------------------------------ */

/* A reply to another request is malformed; its descriptors are closed and
 * the connection with them. (An ERROR with seq 0 is a refusal: see
 * test_refusal_read_before_close.) */
static void
test_wrong_seq(void **state)
{
	struct fixture *f = *state;

	f->fake.seq_delta = 1;
	attach_fails_out_of_step(f, -EBADMSG, "answered request 1 with 2");
	f->fake.seq_delta = (uint32_t)-1;
	attach_fails_out_of_step(f, -EBADMSG, "answered request 1 with 0");
	f->fake.kind = REPLY_ERROR;
	f->fake.err_code = ENOENT;
	f->fake.err_text = "x";
	f->fake.seq_delta = 7;
	attach_fails_out_of_step(f, -EBADMSG, "answered request 1 with 8");
}

/* ENOENT is worded for the user; the socket path is named. */
static void
test_error_enoent(void **state)
{
	struct fixture *f = *state;
	char want[512];

	f->fake.kind = REPLY_ERROR;
	f->fake.err_code = ENOENT;
	f->fake.err_text = "no model";
	f->fake.nfds = 0;
	snprintf(want, sizeof(want), "model \"" MODEL "\" is not served by wcached at %s",
		f->sock);
	attach_fails(f, -ENOENT, want);
}

/* Any other code comes back negated with the daemon's text; descriptors
 * that came with the ERROR are closed. */
static void
test_error_text_surfaces(void **state)
{
	struct fixture *f = *state;
	char want[512];

	f->fake.kind = REPLY_ERROR;
	f->fake.err_code = EACCES;
	f->fake.err_text = MODEL ": uid 1000 may not attach this model";
	snprintf(want, sizeof(want),
		"model \"" MODEL "\": " MODEL ": uid 1000 may not attach this model "
		"(wcached at %s)", f->sock);
	attach_fails(f, -EACCES, want); /* with the four descriptors of fake_good() */
	f->fake.err_code = ESTALE;
	f->fake.err_text = "model.safetensors was modified in place";
	f->fake.nfds = 0;
	attach_fails(f, -ESTALE, "was modified in place");
	/* The daemon's text quotes what a model file chose (a shard's name):
	 * wc_errmsg() holds it escaped, which a worker may log as it is. */
	f->fake.err_code = EINVAL;
	f->fake.err_text = "/m/\x1b]0;PWNED\x07\xc2\x9b" "2J.safetensors: damaged\nforged";
	attach_fails(f, -EINVAL, "/m/\\x1b]0;PWNED\\x07\\u009b2J.safetensors: damaged\\x0aforged");
	assert_null(strchr(wc_errmsg(), '\x1b'));
}

/* The daemon reads the request and closes the connection, twice: the
 * client connects again and retries once, not more. */
static void
test_daemon_closes(void **state)
{
	struct fixture *f = *state;

	f->fake.kind = REPLY_CLOSE;
	f->fake.connections = 2;
	attach_fails(f, -ECONNRESET, "closed the connection");
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.accepted, 2);
}

/* Garbage, truncated and mistyped replies are malformed; their descriptors
 * are closed. */
static void
test_garbage_replies(void **state)
{
	struct fixture *f = *state;
	uint8_t msg[WIRE_MAX_MESSAGE + 1000];
	ssize_t n;

	memset(msg, 0xa5, sizeof(msg));
	fake_raw(f, msg, 100);
	attach_fails_out_of_step(f, -EBADMSG, "sent a malformed reply");
	fake_raw(f, msg, 15);
	attach_fails(f, -EMSGSIZE, "sent a malformed reply");
	fake_raw(f, msg, sizeof(msg)); /* longer than WIRE_MAX_MESSAGE */
	attach_fails(f, -EMSGSIZE, "receive: ");
	fake_raw(f, msg, 0); /* an empty packet reads as the end: retried once */
	f->fake.connections = 2;
	attach_fails(f, -ECONNRESET, "closed the connection");
	assert_int_equal(f->fake.accepted, 2);
	f->fake.connections = 1;

	/* A good ATTACH_OK (seq 1), cut short, with unknown flags, of
	 * another version. */
	n = wire_put_attach_ok(msg, sizeof(msg), 1, &f->fake.ok);
	assert_int_equal(n, 56);
	fake_raw(f, msg, 40);
	attach_fails(f, -EBADMSG, "sent a malformed reply");
	msg[WIRE_HEADER_SIZE + 28] |= 2;
	fake_raw(f, msg, 56);
	attach_fails(f, -EBADMSG, "sent a malformed reply");
	msg[WIRE_HEADER_SIZE + 28] &= (uint8_t)~2;
	msg[4] = 2;
	fake_raw(f, msg, 56);
	attach_fails_out_of_step(f, -EPROTO, "wcached at");

	/* Well-formed messages of the wrong type for a reply. */
	n = wire_put_release_ok(msg, sizeof(msg), 1);
	fake_raw(f, msg, (size_t)n);
	attach_fails(f, -EBADMSG, "unexpected reply from wcached");
	n = wire_put_attach(msg, sizeof(msg), 1, MODEL, strlen(MODEL));
	fake_raw(f, msg, (size_t)n);
	attach_fails(f, -EBADMSG, "unexpected reply from wcached");

	/* An ERROR with code 0 would read as success. */
	n = wire_put_error(msg, sizeof(msg), 1, EIO, "x");
	memset(msg + WIRE_HEADER_SIZE, 0, 4);
	fake_raw(f, msg, (size_t)n);
	attach_fails(f, -EBADMSG, "sent a malformed reply");
}

/* ---- refusals ----------------------------------------------------------- */

/* The refusal wcached sends to a client over its limits: ERROR (seq 0),
 * then close, before reading anything. */
static void
script_refusal(struct fixture *f, enum fake_mode mode)
{
	f->fake.mode = mode;
	f->fake.kind = REPLY_ERROR;
	f->fake.err_code = EUSERS;
	f->fake.err_text = REFUSAL;
	f->fake.nfds = 0;
}

/* The daemon refused and closed before the client sent: the send fails
 * with EPIPE, and the queued refusal is what the caller sees. */
static void
test_refusal_before_request(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();

	script_refusal(f, FAKE_REFUSE_EARLY);
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	fake_finish(f); /* closed */
	assert_error(wc_attach(f->client, MODEL, &f->model), -EUSERS, REFUSAL);
	assert_null(f->model);
	finish(f, before);
}

/* The daemon closed with a packet of ours unread: the kernel resets the
 * connection, and the send reports it. The refusal still surfaces. */
static void
test_refusal_reset_on_send(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();

	script_refusal(f, FAKE_REFUSE_UNREAD);
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_int_equal(send(wc_client_fd(f->client), "x", 1, MSG_NOSIGNAL), 1);
	fake_finish(f); /* refused and closed with "x" unread */
	assert_error(wc_attach(f->client, MODEL, &f->model), -EUSERS, REFUSAL);
	finish(f, before);
}

/* The request was sent before the daemon refused and closed with it
 * unread: the receive reports the reset first, then the refusal is read. */
static void
test_refusal_reset_on_receive(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();

	NEED_WRAP();
	script_refusal(f, FAKE_REFUSE_UNREAD);
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	fault.recv_wait_close = 1;
	assert_error(wc_attach(f->client, MODEL, &f->model), -EUSERS, REFUSAL);
	assert_int_equal(fault.recv_wait_close, 0); /* the hook ran */
	finish(f, before);
}

/*
 * The same refusal, with the client's receive between the daemon's send
 * and its close (wcached's refuse() sends, then closes): no reset yet, and
 * the ERROR carries seq 0. It is still the refusal, not a reply to another
 * request.
 */
static void
test_refusal_read_before_close(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();

	NEED_WRAP();
	script_refusal(f, FAKE_REFUSE_LATE);
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	fault.recv_post_read = 1;
	assert_error(wc_attach(f->client, MODEL, &f->model), -EUSERS, REFUSAL);
	finish(f, before);
}

/* A reset followed by something other than an ERROR is a closed
 * connection; the descriptors that came are closed, and the client
 * connects again to retry (nobody accepts it here: the retry runs out the
 * deadline). */
static void
test_reset_without_refusal(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();

	NEED_WRAP();
	script_refusal(f, FAKE_REFUSE_UNREAD);
	f->fake.kind = REPLY_ATTACH_OK;
	fake_fds(f, 4, f->index_fd, f->file_fd[0], f->file_fd[1], f->status_fd);
	fake_start(f);
	assert_int_equal(wc_connect_timeout(f->sock, 200, &f->client), 0);
	fault.recv_wait_close = 1;
	assert_error(wc_attach(f->client, MODEL, &f->model), -ETIMEDOUT, "did not answer");
	assert_null(f->model);
	finish(f, before);
	assert_int_equal(f->fake.accepted, 1);
}

/* ---- restarts -------------------------------------------------------------- */

/* wcached restarts, as the client sees it: the fake hangs up the
 * connection it serves. */
static void
hang_up(struct fixture *f)
{
	int conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);

	assert_true(conn >= 0);
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
}

/* Attaches MODEL into *again after hang_up(): the client connects again. */
static void
attach_again(struct fixture *f, wc_model **again)
{
	if (wc_attach(f->client, MODEL, again) != 0)
		fail_msg("attach after the restart failed: %s", wc_errmsg());
}

/*
 * The daemon restarts between two attaches (the test shuts the fake's
 * first connection down, as a dying daemon's exit does): the next attach's
 * send fails, the client connects again and the attach succeeds over the
 * new connection, whose descriptor wc_client_fd() now returns. The model
 * attached before still reads; its release sends nothing (its handle
 * meant nothing to the new daemon); announcements come on the new
 * connection; the new model's release reaches the new daemon.
 */
static void
test_reconnect_after_restart(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[WIRE_MAX_MESSAGE];
	wc_model *again = NULL;
	int before, old_fd, conn;
	ssize_t n;

	f->fake.connections = 2;
	before = attach_ok(f);
	old_fd = wc_client_fd(f->client);
	hang_up(f);

	attach_again(f, &again);
	assert_int_not_equal(wc_client_fd(f->client), old_fd);
	check_tensors(f->model);
	check_tensors(again);
	assert_int_equal(f->fake.accepted, 2);

	wc_release(f->model); /* over the old connection: only unmapped */
	f->model = NULL;
	check_tensors(again);

	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_true(conn >= 0);
	n = wire_put_changed(buf, sizeof(buf), GENERATION + 1, MODEL, strlen(MODEL));
	assert_true(n > 0);
	assert_int_equal(fake_raw_send(conn, buf, (size_t)n, NULL, 0), n);
	assert_int_equal(wc_client_dispatch(f->client), 1);

	wc_release(again);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, HANDLE + 1); /* the new connection's */
}

/*
 * A warm restart: the new daemon took the generation over and answers the
 * client's HOLD (sent right after it connects again, before the attach)
 * with a handle; the release of the model attached before the restart
 * then reaches the new daemon with that handle.
 */
static void
test_reconnect_holds(void **state)
{
	struct fixture *f = *state;
	wc_model *again = NULL;
	int before;

	f->fake.connections = 2;
	f->fake.hold_handle = 77;
	before = attach_ok(f);
	hang_up(f);
	attach_again(f, &again);
	assert_int_equal(f->fake.holds, 1);
	assert_int_equal(f->fake.held_generation, GENERATION);
	assert_string_equal(f->fake.name, MODEL);
	wc_release(f->model); /* held again: its RELEASE goes */
	f->model = NULL;
	check_tensors(again);
	wc_release(again);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.releases, 2);
	assert_int_equal(f->fake.released_handle, HANDLE + 1); /* the last: again's */
}

/*
 * A daemon that does not know HOLD closes the connection on it: the
 * client connects once more without it, and the attach goes through; the
 * model from before the restart is released by unmapping only.
 */
static void
test_reconnect_hold_hang_up(void **state)
{
	struct fixture *f = *state;
	wc_model *again = NULL;
	int before;

	f->fake.connections = 3;
	f->fake.hold_handle = -1;
	before = attach_ok(f);
	hang_up(f);
	attach_again(f, &again);
	assert_int_equal(f->fake.holds, 1);
	assert_int_equal(f->fake.accepted, 3);
	wc_release(f->model); /* only unmapped */
	f->model = NULL;
	wc_release(again);
	finish(f, before);
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, HANDLE + 2); /* the third connection's */
}

/* A reconnect that no attach follows (wc_client_dispatch() found the
 * connection closed) records the new socket too: a child that closed its
 * number (closefrom()) and got it again for a socket of its own keeps
 * that socket when it lets the parent's client go. */
static void
test_reconnect_records_the_new_socket(void **state)
{
	struct fixture *f = *state;
	int before, old_fd;

	f->fake.connections = 2;
	before = attach_ok(f);
	old_fd = wc_client_fd(f->client);
	hang_up(f);
	assert_int_equal(wc_client_dispatch(f->client), 0);
	assert_int_equal(f->fake.accepted, 2);
	assert_int_not_equal(wc_client_fd(f->client), old_fd);
	af_child_closes_from(f, 1);
	af_child_closes_from(f, 0);
	release_and_finish(f, before);
}

/*
 * Another thread's fork() during a reconnect (review rev177 G): whenever
 * it comes, the child closes every copy of the parent's connections when
 * it lets the parent's client go, so that wcached sees the parent's
 * connection end when the parent's does. at FORK_AT_CONNECT: while the new
 * socket connects, before it replaced the old one; FORK_AT_FSTAT: where
 * the new socket's identity is taken, which before the fix came after the
 * socket had replaced the old one, so a child forked there kept the old
 * socket's identity for the new number and left it open.
 */
/* Arms the fork probe at at, for f's client and model. */
static void
fork_probe_arm(struct fixture *f, int at)
{
	assert_int_equal(sem_init(&fork_probe.forked, 0, 0), 0);
	fork_probe.f = f;
	fork_probe.started = 0;
	fork_probe.status = -1;
	fork_probe.old = f->client != NULL ? wc_client_fd(f->client) : -1;
	assert_true(fork_probe.old < 0 || fstat(fork_probe.old, &fork_probe.old_st) == 0);
	fork_probe.at = at;
}

/* Disarms the probe, which must have fired, and asserts that its child
 * closed every copy of the connections; during names when it forked. */
static void
fork_probe_check(const char *during)
{
	fork_probe.at = FORK_AT_NONE;
	assert_true(fork_probe.started);
	assert_int_equal(pthread_join(fork_probe.thread, NULL), 0);
	sem_destroy(&fork_probe.forked);
	if (!WIFEXITED(fork_probe.status) || WEXITSTATUS(fork_probe.status) != 0)
		fail_msg("the child forked %s left %s open (status %#x)", during,
			WIFEXITED(fork_probe.status) && WEXITSTATUS(fork_probe.status) == 4 ?
			"the client's connection" : "the connection being made",
			fork_probe.status);
}

static void
reconnect_forked(struct fixture *f, int at)
{
	int before;

	if (__real_connect == NULL || __real_fstat == NULL)
		skip();
	f->fake.connections = 2;
	before = attach_ok(f);
	hang_up(f);
	fork_probe_arm(f, at);
	assert_int_equal(wc_client_dispatch(f->client), 0);
	fork_probe_check("during the reconnect");
	assert_int_equal(f->fake.accepted, 2);
	release_and_finish(f, before);
}

static void
test_fork_while_reconnect_connects(void **state)
{
	reconnect_forked(*state, FORK_AT_CONNECT);
}

static void
test_fork_while_reconnect_takes_identity(void **state)
{
	reconnect_forked(*state, FORK_AT_FSTAT);
}

/* The daemon dies holding the request (it read the ATTACH and hung up):
 * the client sees the end of the stream before a reply, connects again
 * and sends the request once more. */
static void
test_reconnect_when_daemon_dies_holding_request(void **state)
{
	struct fixture *f = *state;
	wc_model *again = NULL;
	int before;

	f->fake.connections = 2;
	f->fake.first_close_at = 2;
	before = attach_ok(f);
	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("attach across the restart failed: %s", wc_errmsg());
	check_tensors(again);
	assert_int_equal(wc_model_generation(again), GENERATION);
	wc_release(again);
	release_and_finish(f, before);
	assert_int_equal(f->fake.attaches, 3); /* 1, 2 (dropped), 2 again */
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, HANDLE + 1);
}

/* The daemon is gone for good: the reconnect fails and the error says
 * both what happened and why connecting again failed; a socket path that
 * is gone is -ECONNREFUSED, not the -ENOENT of a model not served. */
static void
test_reconnect_fails_when_daemon_gone(void **state)
{
	struct fixture *f = *state;
	wc_model *again = NULL;
	int before;

	before = attach_ok(f);
	hang_up(f);
	fake_finish(f);
	assert_int_equal(unlink(f->sock), 0); /* nobody at the path any more */
	assert_error(wc_attach(f->client, MODEL, &again), -ECONNREFUSED,
		"closed the connection, and connecting again failed: wcached is not running");
	assert_null(again);
	release_and_finish(f, before);
}

/* A reconnect keeps to the client's deadline: a daemon that hangs up and
 * then does not answer on the new connection fails the attach with
 * -ETIMEDOUT at about the deadline, not after a second one. */
static void
test_reconnect_within_deadline(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_model *m = NULL;
	double t0, waited;

	f->fake.kind = REPLY_CLOSE; /* one connection: the second is never accepted */
	fake_start(f);
	assert_int_equal(wc_connect_timeout(f->sock, 300, &f->client), 0);
	t0 = tu_now();
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "did not answer");
	waited = tu_now() - t0;
	assert_null(m);
	assert_true(waited >= 0.2);
	assert_true(waited < DEADLINE_MS / 1000.0);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
}

/*
 * A receive that fails with EAGAIN before the deadline is no timeout: the
 * client waits for the rest of it and the attach works. Before, the first
 * EAGAIN was reported as "did not answer within 30 s (waited 3.72e-06 s;
 * ...); connection closed".
 */
static void
test_eagain_before_deadline(void **state)
{
	struct fixture *f = *state;
	int before;

	NEED_WRAP();
	fault.recv_eagain = 2;
	before = attach_ok(f);
	assert_int_equal(fault.recv_eagain, 0);
	release_and_finish(f, before);
	assert_int_equal(f->fake.accepted, 1);
}

/*
 * A descriptor made non-blocking (libuv's uv_poll_init() does that to the
 * wc_client_fd() it watches) keeps the client's deadline: a daemon that
 * never answers fails the attach with -ETIMEDOUT at the deadline, not at
 * once (before: after about 0 s, "waited 0 s") and not later.
 */
static void
test_nonblocking_descriptor_keeps_deadline(void **state)
{
	struct fixture *f = *state;
	int fd, before = tu_count_fds();
	wc_model *m = NULL;
	double t0;

	f->fake.mode = FAKE_SILENT;
	fake_start(f);
	assert_int_equal(wc_connect_timeout(f->sock, DEADLINE_TEST_MS, &f->client), 0);
	fd = wc_client_fd(f->client);
	assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
	t0 = tu_now();
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "did not answer within 0.4 s");
	assert_waited_deadline(t0);
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
}

/*
 * A worker's interval timer (SIGALRM every 20 ms, no SA_RESTART) while a
 * daemon never answers: the attach fails at the 0.4 s deadline. A receive
 * with SO_RCVTIMEO that a signal interrupts is never restarted by the
 * kernel; fdp_recv() started it again, with its whole timeout, so a timer
 * firing more often than the deadline made the wait endless (before: the
 * timer stops itself after 100 signals, 2 s, and the attach failed 0.4 s
 * after that).
 */
static void
test_interval_timer_keeps_deadline(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_model *m = NULL;
	struct sigaction old;
	double t0;

	f->fake.mode = FAKE_SILENT;
	fake_start(f);
	assert_int_equal(wc_connect_timeout(f->sock, DEADLINE_TEST_MS, &f->client), 0);
	alarm_every(20, 100, &old);
	t0 = tu_now();
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "did not answer within 0.4 s");
	assert_waited_deadline(t0);
	alarm_off(&old);
	assert_true(alarms >= 10);
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
}

/*
 * A send that fails with EAGAIN (a descriptor made non-blocking whose
 * buffer is full) or that a signal interrupts, before the deadline, waits
 * until the socket takes it and the attach works. Before, EAGAIN failed it
 * at once as a timeout ("did not take the request within 30 s (waited
 * 0 s)").
 */
static void
send_fails_once(struct fixture *f, int err)
{
	int before = tu_count_fds();

	af_need_wrap(__real_sendmsg != NULL, "-Wl,--wrap=sendmsg");
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	fault.client = pthread_self();
	fault.send_errno = err;
	fault.send_count = 2;
	if (wc_attach(f->client, MODEL, &f->model) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	assert_int_equal(fault.send_count, 0);
	fault.send_errno = 0;
	release_and_finish(f, before);
}

static void
test_send_eagain_before_deadline(void **state)
{
	send_fails_once(*state, EAGAIN);
}

static void
test_send_interrupted(void **state)
{
	send_fails_once(*state, EINTR);
}

/* A signal that interrupts the connect is no reason to fail it: the
 * connect is tried again and the attach works (found by an strace fault
 * sweep of the worker: connect:error=EINTR failed wc_connect() with
 * "Interrupted system call"). */
static void
test_connect_interrupted(void **state)
{
	struct fixture *f = *state;
	int before;

	af_need_wrap(__real_connect != NULL, "-Wl,--wrap=connect");
	fault.connect_eintr = 2;
	before = attach_ok(f);
	assert_int_equal(fault.connect_eintr, 0);
	release_and_finish(f, before);
}

/*
 * A connect that a signal interrupts is tried again with what is left of
 * the deadline, not all of it: wcached's backlog is full, the signal comes
 * after 0.3 s of a 0.4 s deadline, and wc_connect_timeout() fails at 0.4 s.
 * Before, the second try waited the whole 0.4 s again (0.7 s in all: each
 * signal could add up to a deadline).
 */
static void
test_connect_interrupted_keeps_deadline(void **state)
{
	struct fixture *f = *state;
	char path[512];
	int lfd, fds[64], before = tu_count_fds();
	size_t n;
	wc_client *c = NULL;
	struct sigaction old;
	double t0;

	snprintf(path, sizeof(path), "%s/full.sock", f->dir);
	assert_true((lfd = fake_listen(path)) >= 0);
	assert_int_equal(listen(lfd, 0), 0); /* the smallest backlog */
	n = fill_backlog(path, fds, 64);
	alarm_after(ALARM_MS, &old);
	t0 = tu_now();
	assert_error(wc_connect_timeout(path, DEADLINE_TEST_MS, &c), -ETIMEDOUT,
		"did not accept the connection within 0.4 s");
	assert_waited_deadline(t0);
	alarm_off(&old);
	assert_int_equal(alarms, 1);
	assert_null(c);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	close(lfd);
	assert_int_equal(tu_count_fds(), before);
}

/*
 * A request whose connection the daemon closes is sent again over a new
 * connection within what is left of the deadline, whatever the connect
 * and the HOLDs took of it: the daemon hangs up at once, the new connect
 * waits for room in a full backlog until a signal at 0.3 s makes some
 * (accepting one), and nobody answers on the new connection. The attach
 * fails at the 0.4 s deadline. Before, the HOLD (holding is set: a model
 * from the old connection is still attached) or the request waited the
 * whole of what had been left before the connect (0.7 s in all).
 */
static void
reconnect_interrupted(struct fixture *f, int holding)
{
	int fds[64], before;
	size_t n;
	wc_model *m = NULL;
	struct sigaction old;
	double t0;

	f->fake.first_close_at = 2; /* and never accepts again */
	before = attach_ok(f);
	assert_int_equal(wc_set_timeout(f->client, DEADLINE_TEST_MS), 0);
	if (!holding) {
		wc_release(f->model);
		f->model = NULL;
	}
	n = fill_backlog(f->sock, fds, 64);
	alarm_listen_fd = f->fake.listen_fd;
	alarm_accepted = -1;
	alarm_after(ALARM_MS, &old);
	t0 = tu_now();
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "did not answer within 0.4 s");
	assert_waited_deadline(t0);
	alarm_off(&old);
	assert_null(m);
	assert_int_equal(alarms, 1);
	assert_true(alarm_accepted >= 0);
	close(alarm_accepted);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	if (holding) {
		wc_release(f->model);
		f->model = NULL;
	}
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.holds, 0); /* the new connection was never accepted */
}

static void
test_reconnect_interrupted_keeps_deadline(void **state)
{
	reconnect_interrupted(*state, 0);
}

static void
test_reconnect_holds_keep_deadline(void **state)
{
	reconnect_interrupted(*state, 1);
}

/* Scripts the fake to stop reading, as a stopped wcached, once it has
 * answered the nth ATTACH on its first connection (posting stalled) until
 * resume is posted. */
static void
stall_after(struct fixture *f, int nth, sem_t *stalled, sem_t *resume)
{
	assert_int_equal(sem_init(stalled, 0, 0), 0);
	assert_int_equal(sem_init(resume, 0, 0), 0);
	f->fake.stall_after = nth;
	f->fake.stalled = stalled;
	f->fake.resume = resume;
}

/* Fills the client's socket buffer (the stalled fake reads nothing) with
 * RELEASEs of no handle; returns how many. */
static int
fill_send_buffer(struct fixture *f)
{
	uint8_t msg[WIRE_HEADER_SIZE + 8];
	int fd = wc_client_fd(f->client), filled = 0;
	ssize_t n = wire_put_release(msg, sizeof(msg), 0, 999999);

	assert_true(n > 0);
	while (send(fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) == n)
		filled++;
	assert_int_equal(errno, EAGAIN);
	assert_true(filled > 0);
	return filled;
}

/* Resumes the stalled fake, which reads what was queued, then the end of
 * the first connection: waits (2 s at most) until it has. */
static void
resume_until_closed(struct fixture *f, sem_t *resume)
{
	double t0 = tu_now();

	sem_post(resume);
	while (__atomic_load_n(&f->fake.accepted, __ATOMIC_ACQUIRE) == 1 &&
		__atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE) >= 0) {
		if (tu_now() - t0 > 2.0)
			fail_msg("the connection whose RELEASE was lost is still open");
		usleep(1000);
	}
}

/*
 * Releases while wcached reads nothing (stopped, wedged) once the
 * client's socket buffer is full. Three models are attached and the fake
 * stops reading; the test fills the buffer with RELEASEs of its own.
 *
 * The first wc_release() waits the 0.4 s deadline, no longer, even with an
 * interval timer (SIGALRM every 20 ms, no SA_RESTART) when timer is set:
 * before, fdp_send() restarted the interrupted send with the whole of
 * SO_SNDTIMEO, so the release only returned 0.4 s after the timer stopped
 * itself (100 signals, 2.4 s in all; rev141 #2). That RELEASE is not sent,
 * so the connection is closed: the second release fails at once instead
 * of waiting the deadline again, and the fake, resumed, reads what was
 * queued and then the end of the connection, so it would release all the
 * connection held. Before, the connection stayed open with the RELEASE
 * lost: the daemon went on counting that attach until the client
 * disconnected (rev141 #1; the fake waited for the next request). The
 * next attach connects again and HOLDs the model still mapped (the fake
 * accepts, as a daemon after a warm restart would; wcached that did not
 * restart refuses, test_client_deadline.py), whose release then reaches
 * the new connection with the HOLD's handle.
 */
static void
release_while_stalled(struct fixture *f, int timer)
{
	wc_model *second = NULL, *third = NULL, *again = NULL;
	struct sigaction old;
	sem_t stalled, resume;
	int before, filled;
	double t0, waited;

	f->fake.connections = 2;
	f->fake.hold_handle = 77;
	stall_after(f, 3, &stalled, &resume);
	before = attach_ok(f);
	assert_int_equal(wc_set_timeout(f->client, DEADLINE_TEST_MS), 0);
	if (wc_attach(f->client, MODEL, &second) != 0 || wc_attach(f->client, MODEL, &third) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	assert_int_equal(fake_sem_wait(&stalled), 0);
	filled = fill_send_buffer(f);

	if (timer)
		alarm_every(20, 100, &old);
	t0 = tu_now();
	wc_release(second);
	assert_waited_deadline(t0);
	if (timer) {
		alarm_off(&old);
		assert_true(alarms >= 10);
	}
	t0 = tu_now();
	wc_release(third);
	waited = tu_now() - t0;
	if (waited > SLACK_S)
		fail_msg("the release after a lost one waited %.3f s", waited);

	/* Resumed, the fake reads the queue, then the connection's end. */
	resume_until_closed(f, &resume);
	assert_int_equal(f->fake.releases, filled);

	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("attach after the lost release failed: %s", wc_errmsg());
	assert_int_equal(f->fake.accepted, 2);
	assert_int_equal(f->fake.holds, 1); /* f->model's: the others are released */
	assert_int_equal(f->fake.held_generation, GENERATION);
	check_tensors(f->model);
	wc_release(f->model); /* held again: RELEASE of the HOLD's handle */
	f->model = NULL;
	check_tensors(again);
	wc_release(again);
	finish(f, before);
	assert_int_equal(f->fake.releases, filled + 2);
	assert_int_equal(f->fake.released_handle, HANDLE + 1); /* the last: again's */
	sem_destroy(&stalled);
	sem_destroy(&resume);
}

static void
test_release_while_stalled_closes(void **state)
{
	release_while_stalled(*state, 0);
}

static void
test_release_while_stalled_keeps_deadline(void **state)
{
	release_while_stalled(*state, 1);
}

/*
 * A release that closes the connection ends the builds in progress on it,
 * and their publish and abandon say that libwcache closed it and why, not
 * that wcached did (rev144 #1). Two DERIVEs get BUILD (k1, k2) on the
 * first connection; the fake stops reading after the second ATTACH, the
 * test fills the client's socket buffer, and the release of that model
 * is not sent within the 0.4 s deadline, so the connection is closed.
 * k1's publish then fails with -ECONNRESET: "libwcache closed the
 * connection to wcached at ... because a release could not be sent
 * within 0.4 s (wcached did not read), which ended the build" (before:
 * "wcached at ... closed the connection", nothing about the release nor
 * the build). The next attach connects again (HOLDs: f->model and k2's
 * source), and k2's abandon, the build of the old connection, still says
 * why that one closed (before: "did wcached restart?"). Neither PUBLISH
 * nor ABANDON reaches the fake.
 */
static void
test_release_while_stalled_ends_build(void **state)
{
	static const uint64_t shape[1] = { 4 };
	static const float data[4] = { 1, 2, 3, 4 };
	const wc_tensor t = { .name = "w", .dtype = "F32", .ndim = 1, .shape = shape,
		.data = data, .nbytes = sizeof(data) };
	struct fixture *f = *state;
	wc_model *second = NULL, *again = NULL, *out = NULL;
	wc_build *b1 = NULL, *b2 = NULL;
	sem_t stalled, resume;
	int before, filled;
	double t0;

	f->fake.connections = 2;
	f->fake.hold_handle = 77;
	f->fake.derive_build = 1;
	f->fake.token = 5;
	stall_after(f, 2, &stalled, &resume);
	before = attach_ok(f);
	assert_int_equal(wc_set_timeout(f->client, DEADLINE_TEST_MS), 0);
	assert_int_equal(wc_derive(f->client, MODEL, "k1", &out, &b1), 1);
	assert_int_equal(wc_derive(f->client, MODEL, "k2", &out, &b2), 1);
	assert_null(out);
	if (wc_attach(f->client, MODEL, &second) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	assert_int_equal(fake_sem_wait(&stalled), 0);
	filled = fill_send_buffer(f);
	t0 = tu_now();
	wc_release(second); /* lost: the connection closes */
	assert_waited_deadline(t0);

	assert_error(wc_build_publish(b1, &t, 1, NULL, 0, &out), -ECONNRESET,
		"model \"llama\", key \"k1\": cannot publish: libwcache closed the connection "
		"to wcached at ");
	assert_non_null(strstr(wc_errmsg(), " because a release could not be sent within "
		"0.4 s (wcached did not read), which ended the build"));
	assert_null(out);

	resume_until_closed(f, &resume);
	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("attach after the lost release failed: %s", wc_errmsg());
	assert_int_equal(f->fake.accepted, 2);
	assert_int_equal(f->fake.holds, 2); /* f->model and k2's source */
	wc_build_abandon(b2, "too late");
	assert_non_null(strstr(wc_errmsg(), "key \"k2\": cannot abandon the build: libwcache "
		"closed the connection to wcached at "));
	assert_non_null(strstr(wc_errmsg(), " because a release could not be sent within "
		"0.4 s (wcached did not read), which ended the build"));
	wc_release(again);
	release_and_finish(f, before);
	assert_int_equal(f->fake.derives, 2);
	assert_int_equal(f->fake.publishes, 0);
	assert_int_equal(f->fake.abandons, 0);
	/* The filler, then on the new connection k2's source, again and
	 * f->model. */
	assert_int_equal(f->fake.releases, filled + 3);
	sem_destroy(&stalled);
	sem_destroy(&resume);
}

/*
 * A build (key k1) on the client's first connection, then a second model
 * attached, after which the fake stops reading (posting stalled) until
 * resume is posted, and a third attach times out within the 0.4 s
 * deadline, closing that connection. *b and *second get the build and the
 * model; returns the descriptor count from before.
 */
static int
build_then_time_out(struct fixture *f, wc_build **b, wc_model **second, sem_t *stalled,
	sem_t *resume)
{
	wc_model *out = NULL, *third = NULL;
	int before;

	f->fake.derive_build = 1;
	f->fake.token = 5;
	stall_after(f, 2, stalled, resume);
	before = attach_ok(f);
	assert_int_equal(wc_set_timeout(f->client, DEADLINE_TEST_MS), 0);
	assert_int_equal(wc_derive(f->client, MODEL, "k1", &out, b), 1);
	if (wc_attach(f->client, MODEL, second) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	assert_int_equal(fake_sem_wait(stalled), 0);
	assert_error(wc_attach(f->client, MODEL, &third), -ETIMEDOUT,
		"did not answer within 0.4 s");
	assert_null(third);
	return before;
}

/* Publishes b (key k1), which a close of libwcache's own ended: the
 * publish fails with -ECONNRESET, saying that libwcache closed the
 * connection because why, which ended the build; nothing is sent. */
static void
publish_ended_because(wc_build *b, const char *why)
{
	char want[256];
	wc_model *out = NULL;
	int memfd = memfd_create("artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(memfd >= 0);
	assert_error(wc_build_publish_fd(b, memfd, &out), -ECONNRESET,
		"key \"k1\": cannot publish: libwcache closed the connection to wcached at ");
	snprintf(want, sizeof(want), " because %s, which ended the build", why);
	if (strstr(wc_errmsg(), want) == NULL)
		fail_msg("message \"%s\" does not contain \"%s\"", wc_errmsg(), want);
	assert_null(out);
	close(memfd);
}

/*
 * The same for a request that times out, which closes the connection too:
 * a DERIVE gets BUILD, the fake stops reading after the second ATTACH and
 * the third times out. The build's publish says that libwcache closed the
 * connection because a request timed out, which ended the build; with the
 * daemon then gone for good (its socket path removed), the next attach's
 * reconnect fails, and its message too says who closed the connection
 * (before, both said "wcached at ... closed the connection").
 */
static void
test_request_timeout_ends_build(void **state)
{
	struct fixture *f = *state;
	wc_model *second = NULL, *third = NULL;
	wc_build *b = NULL;
	static sem_t stalled, resume; /* the fake may outlive a failure */
	int before = build_then_time_out(f, &b, &second, &stalled, &resume);

	publish_ended_because(b, "a request timed out (wcached did not answer within 0.4 s)");

	sem_post(&resume);
	fake_finish(f); /* one connection: the fake reads its end and exits */
	assert_int_equal(unlink(f->sock), 0);
	assert_error(wc_attach(f->client, MODEL, &third), -ECONNREFUSED,
		"libwcache closed the connection to wcached at ");
	assert_non_null(strstr(wc_errmsg(), " because a request timed out (wcached did not "
		"answer within 0.4 s), and connecting again failed: wcached is not running"));
	assert_null(third);
	wc_release(second);
	release_and_finish(f, before);
	assert_int_equal(f->fake.attaches, 3);
	assert_int_equal(f->fake.publishes, 0);
	sem_destroy(&stalled);
	sem_destroy(&resume);
}

/*
 * One stall of wcached, two calls that time out (rev155 #2): libwcache
 * closes connection 1, which got the build, then the next call's
 * reconnect (connection 2) times out in its HOLD and closes that one too.
 * The build's publish still says why connection 1 closed. Before, one
 * reason was kept per client, the second close overwrote it, and the
 * publish asked "did wcached restart?". The two timeouts differ (0.4 s,
 * then 0.3 s) so that the message shows which close it names.
 */
static void
test_two_closes_keep_the_first_reason(void **state)
{
	struct fixture *f = *state;
	wc_model *second = NULL, *third = NULL;
	wc_build *b = NULL;
	static sem_t stalled, resume; /* the fake may outlive a failure */
	int before;

	f->fake.connections = 2;
	before = build_then_time_out(f, &b, &second, &stalled, &resume);
	assert_int_equal(wc_set_timeout(f->client, 300), 0);
	assert_error(wc_attach(f->client, MODEL, &third), -ETIMEDOUT,
		"did not answer within 0.3 s");
	assert_null(third);

	publish_ended_because(b, "a request timed out (wcached did not answer within 0.4 s)");

	/* The fake reads connection 1's last ATTACH and end, then
	 * connection 2's HOLD, whose answer finds it closed. */
	sem_post(&resume);
	wc_release(second);
	release_and_finish(f, before);
	assert_int_equal(f->fake.accepted, 2);
	assert_int_equal(f->fake.attaches, 3);
	assert_int_equal(f->fake.holds, 1);
	assert_int_equal(f->fake.publishes, 0);
	sem_destroy(&stalled);
	sem_destroy(&resume);
}

/*
 * libwcache's other closes of its own end a build too, and its publish
 * says so (rev155 #3). An attach whose reply's descriptors cannot be
 * received (this process at RLIMIT_NOFILE: the kernel cuts them off,
 * EMFILE) closes the connection that got BUILD. Before, nothing was
 * remembered, the PUBLISH found the connection closed and the message
 * was "wcached at ... closed the connection".
 */
static void
test_out_of_descriptors_ends_build(void **state)
{
	struct fixture *f = *state;
	wc_model *second = NULL, *out = NULL;
	wc_build *b = NULL;
	struct rlimit old, low;
	int before, r, lowest;

	f->fake.derive_build = 1;
	f->fake.token = 5;
	before = attach_ok(f);
	assert_int_equal(wc_derive(f->client, MODEL, "k1", &out, &b), 1);

	/* No descriptor can be made: the lowest free one is the limit. */
	assert_true((lowest = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
	close(lowest);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	low = old;
	low.rlim_cur = (rlim_t)lowest;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	r = wc_attach(f->client, MODEL, &second);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	assert_error(r, -EMFILE, "this process is out of file descriptors");
	assert_null(second);

	publish_ended_because(b, "a reply's descriptors were lost (this process is out of file "
		"descriptors)");
	release_and_finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.publishes, 0);
}

/*
 * The same for a reply that cannot be trusted: garbage in answer to an
 * ATTACH (request.c), and a well-formed reply of the wrong type to an
 * ATTACH (attach.c) and to a PUBLISH (derive.c). A build, k1, then an
 * attach answered with garbage closes the connection, and k1's publish
 * names that; the same with RELEASE_OK for the attach. Then, on a fresh
 * client, two builds, k1 and k2: k1's PUBLISH is answered RELEASE_OK, and
 * k2's abandon names that reply. Before, each said "wcached at ... closed
 * the connection" (the PUBLISH or ABANDON found the connection closed).
 */
static void
test_untrusted_reply_ends_build(void **state)
{
	struct fixture *f = *state;
	uint8_t garbage[100];
	wc_model *m = NULL, *out = NULL;
	wc_build *b1 = NULL, *b2 = NULL;
	int before = tu_count_fds(), memfd;
	ssize_t n;

	memset(garbage, 0xa5, sizeof(garbage));
	fake_raw(f, garbage, sizeof(garbage));
	f->fake.derive_build = 1;
	f->fake.token = 5;
	for (int wrong_type = 0; wrong_type <= 1; wrong_type++) {
		if (wrong_type) { /* DERIVE (seq 1), ATTACH (2) */
			n = wire_put_release_ok(garbage, sizeof(garbage), 2);
			assert_true(n > 0);
			fake_raw(f, garbage, (size_t)n);
		}
		fake_start(f);
		assert_int_equal(wc_connect(f->sock, &f->client), 0);
		assert_int_equal(wc_derive(f->client, MODEL, "k1", &out, &b1), 1);
		assert_error(wc_attach(f->client, MODEL, &m), -EBADMSG, wrong_type ?
			"unexpected reply from wcached" : "sent a malformed reply");
		assert_null(m);
		publish_ended_because(b1, wrong_type ? "wcached's reply to ATTACH was malformed" :
			"wcached's reply was malformed");
		finish(f, before);
	}
	assert_int_equal(f->fake.publishes, 0);

	/* DERIVE k1 (seq 1), DERIVE k2 (2), PUBLISH k1 (3): RELEASE_OK. */
	f->fake.derives = 0;
	f->fake.publish.kind = REPLY_RAW;
	n = wire_put_release_ok(f->fake.publish.raw, sizeof(f->fake.publish.raw), 3);
	assert_true(n > 0);
	f->fake.publish.raw_len = (size_t)n;
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_int_equal(wc_derive(f->client, MODEL, "k1", &out, &b1), 1);
	assert_int_equal(wc_derive(f->client, MODEL, "k2", &out, &b2), 1);
	assert_true((memfd = memfd_create("artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING)) >= 0);
	assert_error(wc_build_publish_fd(b1, memfd, &out), -EBADMSG, "k1");
	assert_null(out);
	wc_build_abandon(b2, "too late");
	assert_non_null(strstr(wc_errmsg(), "key \"k2\": cannot abandon the build: libwcache "
		"closed the connection to wcached at "));
	assert_non_null(strstr(wc_errmsg(), " because wcached's reply to PUBLISH was "
		"malformed, which ended the build"));
	close(memfd);
	finish(f, before);
	assert_int_equal(f->fake.derives, 2);
	assert_int_equal(f->fake.publishes, 1);
	assert_int_equal(f->fake.abandons, 0);
	free(f->fake.published);
	f->fake.published = NULL;
}

/* ---- every close of libwcache's own, and what it says -------------------- */

/*
 * The start of the tests below, one per reason libwcache closes a
 * connection for (request_close_because() in request.c, attach.c,
 * derive.c): the fake serves two connections, one after the other, and a
 * DERIVE (key k1, seq 1) on the first gets BUILD (*b). Returns the
 * descriptor count from before.
 */
static int
build_on_first_connection(struct fixture *f, wc_build **b)
{
	wc_model *out = NULL;
	int before = tu_count_fds();

	f->fake.connections = 2;
	f->fake.derive_build = 1;
	f->fake.token = 5;
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_int_equal(wc_derive(f->client, MODEL, "k1", &out, b), 1);
	assert_null(out);
	return before;
}

/*
 * Their end: libwcache closed the connection that got b because why. b's
 * publish says so and sends nothing (publish_ended_because), and the next
 * attach finds the connection closed and connects again, the fake's
 * second connection, where it works (its model is released again).
 */
static void
build_ended_then_reconnect(struct fixture *f, wc_build *b, const char *why)
{
	wc_model *again = NULL;

	publish_ended_because(b, why);
	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("the attach after the close failed: %s", wc_errmsg());
	assert_int_equal(f->fake.accepted, 2);
	check_tensors(again);
	wc_release(again);
}

/* Sets O_NONBLOCK on the client's descriptor, as libuv's uv_poll_init()
 * does to the wc_client_fd() an event loop watches. */
static void
make_nonblocking(struct fixture *f)
{
	int fd = wc_client_fd(f->client), flags = fcntl(fd, F_GETFL);

	assert_true(flags != -1);
	assert_int_equal(fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0);
}

/* wc_attach() of MODEL with RLIMIT_NOFILE at 0, under which poll(2) of one
 * descriptor fails with EINVAL (more descriptors than the limit): the one
 * way its wait fails for real. Returns what wc_attach() did. */
static int
attach_under_no_descriptors(struct fixture *f, wc_model **m)
{
	struct rlimit old, none;
	int r;

	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	none = old;
	none.rlim_cur = 0;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &none), 0);
	r = wc_attach(f->client, MODEL, m);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	return r;
}

/*
 * A wait to send that fails closes the connection: "waiting to send failed
 * (poll: ...)". The fake stops reading once it has answered an attach, the
 * test fills the client's socket buffer, and the next attach, on the
 * descriptor made non-blocking, finds no room (EAGAIN) and waits with
 * poll(2), which RLIMIT_NOFILE at 0 fails. The model of the first
 * connection is named in a HOLD on the second, which the fake refuses (a
 * daemon that did not restart): its release then only unmaps.
 */
static void
test_send_wait_failure_ends_build(void **state)
{
	struct fixture *f = *state;
	static sem_t stalled, resume; /* the fake may outlive a failure */
	wc_model *second = NULL, *m = NULL;
	wc_build *b = NULL;
	int before, filled;

	stall_after(f, 1, &stalled, &resume);
	before = build_on_first_connection(f, &b);
	if (wc_attach(f->client, MODEL, &second) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	assert_int_equal(fake_sem_wait(&stalled), 0);
	filled = fill_send_buffer(f);
	make_nonblocking(f);
	assert_error(attach_under_no_descriptors(f, &m), -EINVAL,
		"waiting to send: poll: Invalid argument");
	assert_null(m);
	resume_until_closed(f, &resume);
	build_ended_then_reconnect(f, b, "waiting to send failed (poll: Invalid argument)");
	wc_release(second);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.holds, 1);
	assert_int_equal(f->fake.releases, filled + 1); /* the filler's, again's */
	sem_destroy(&stalled);
	sem_destroy(&resume);
}

/*
 * A wait for the answer that fails closes the connection: "waiting for an
 * answer failed (poll: ...)". The attach is sent on the descriptor made
 * non-blocking, the fake holds its answer at the gate, so the receive says
 * EAGAIN and the client waits with poll(2), which RLIMIT_NOFILE at 0
 * fails. The answer, let through afterwards, finds the connection closed.
 */
static void
test_answer_wait_failure_ends_build(void **state)
{
	struct fixture *f = *state;
	static sem_t gate, at_gate; /* the fake may outlive a failure */
	wc_model *m = NULL;
	wc_build *b = NULL;
	int before;

	assert_int_equal(sem_init(&gate, 0, 0), 0);
	assert_int_equal(sem_init(&at_gate, 0, 0), 0);
	f->fake.gate = &gate;
	f->fake.at_gate = &at_gate;
	before = build_on_first_connection(f, &b);
	make_nonblocking(f);
	assert_error(attach_under_no_descriptors(f, &m), -EINVAL,
		"waiting for the answer: poll: Invalid argument");
	assert_null(m);
	assert_int_equal(fake_sem_wait(&at_gate), 0); /* the attach reached the fake */
	sem_post(&gate); /* its answer, on the closed connection */
	sem_post(&gate); /* the next attach's, on the second */
	build_ended_then_reconnect(f, b, "waiting for an answer failed (poll: Invalid argument)");
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.releases, 1); /* again's */
	sem_destroy(&gate);
	sem_destroy(&at_gate);
}

/*
 * A release whose send fails, with another error than a timeout or a
 * connection already closed, closes the connection as one not sent in
 * time does: "a release could not be sent (...)". __wrap_sendmsg fails it
 * with ENOBUFS (the kernel out of buffers).
 */
static void
test_release_send_failure_ends_build(void **state)
{
	struct fixture *f = *state;
	wc_model *second = NULL;
	wc_build *b = NULL;
	int before;

	af_need_wrap(__real_sendmsg != NULL, "-Wl,--wrap=sendmsg");
	before = build_on_first_connection(f, &b);
	if (wc_attach(f->client, MODEL, &second) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	fault.send_errno = ENOBUFS;
	fault.send_count = 1;
	wc_release(second);
	assert_int_equal(fault.send_count, 0); /* the RELEASE was tried, once */
	build_ended_then_reconnect(f, b, "a release could not be sent (No buffer space "
		"available)");
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.holds, 0);
	assert_int_equal(f->fake.releases, 1); /* again's */
	assert_int_equal(f->fake.released_handle, HANDLE + 1);
}

/*
 * An answer to another request, and one of another protocol version, put
 * the client out of step: the connection closes ("wcached answered
 * request 2 with 9 (out of step)", "wcached's reply was malformed
 * (protocol version mismatch)") with the descriptors the answer brought.
 * The fake answers every attach with an ATTACH_OK of seq 9, then with one
 * of seq 2 and version 2, each with the four descriptors of a good reply:
 * the next attach, over the fake's second connection, fails the same way
 * (its first try, request 3, finds the connection closed; its second, 4,
 * goes over the new one).
 */
static void
test_out_of_step_reply_ends_build(void **state)
{
	static const struct {
		uint32_t seq;
		uint8_t version;
		int code;
		const char *error, *again, *why;
	} cases[] = {
		{ 9, WIRE_VERSION, -EBADMSG, "answered request 2 with 9",
			"answered request 4 with 9",
			"wcached answered request 2 with 9 (out of step)" },
		{ 2, 2, -EPROTO, "sent a malformed reply (protocol version mismatch: update ",
			"sent a malformed reply (protocol version mismatch: update ",
			"wcached's reply was malformed (protocol version mismatch)" },
	};
	struct fixture *f = *state;
	uint8_t reply[WIRE_MAX_MESSAGE];
	wc_model *m = NULL;
	wc_build *b = NULL;
	ssize_t n;
	int before;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		n = wire_put_attach_ok(reply, sizeof(reply), cases[i].seq, &f->fake.ok);
		assert_true(n > 4);
		reply[4] = cases[i].version;
		fake_raw(f, reply, (size_t)n);
		before = build_on_first_connection(f, &b);
		assert_error(wc_attach(f->client, MODEL, &m), cases[i].code, cases[i].error);
		assert_null(m);
		publish_ended_because(b, cases[i].why);
		assert_error(wc_attach(f->client, MODEL, &m), cases[i].code, cases[i].again);
		assert_null(m);
		finish(f, before);
		assert_int_equal(f->fake.accepted, 2);
		assert_int_equal(f->fake.attaches, 2);
		assert_int_equal(f->fake.releases, 0);
	}
}

/*
 * What is still queued on a connection that libwcache closed answers none
 * of the requests to come: the next one connects again without reading
 * it. The fake's side sends two ERRORs that answer nothing (seq 9 and 10)
 * before the attach (seq 2) is sent: the first puts the client out of
 * step, which closes the connection, and the second stays queued, as an
 * answer that came after the deadline but before the close would. Before,
 * the next attach's send found the connection closed (EPIPE), its receive
 * took the queued ERROR for a refusal of wcached's, and the attach failed
 * with "model "llama" is not served by wcached at ..." (-ENOENT) over the
 * dead connection, which was never replaced.
 */
static void
test_queued_after_close_answers_nothing(void **state)
{
	struct fixture *f = *state;
	uint8_t msg[WIRE_MAX_MESSAGE];
	wc_model *m = NULL;
	wc_build *b = NULL;
	int before, conn;
	ssize_t n;

	before = build_on_first_connection(f, &b);
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_true(conn >= 0);
	n = wire_put_error(msg, sizeof(msg), 9, EIO, "answers nothing");
	assert_int_equal(fake_raw_send(conn, msg, (size_t)n, NULL, 0), n);
	n = wire_put_error(msg, sizeof(msg), 10, ENOENT, "answers nothing either");
	assert_int_equal(fake_raw_send(conn, msg, (size_t)n, NULL, 0), n);
	assert_error(wc_attach(f->client, MODEL, &m), -EBADMSG, "answered request 2 with 9");
	assert_null(m);
	build_ended_then_reconnect(f, b, "wcached answered request 2 with 9 (out of step)");
	finish(f, before);
	/* (The fake may not have read the first attach: a connection closed
	 * with the ERROR still queued resets on its side.) */
	assert_int_equal(f->fake.releases, 1); /* again's */
}

/*
 * A request whose deadline passes while it connects again says why the
 * connection closed, libwcache's reason included. The fake answers an
 * attach out of step, which closes the connection; the next attach's
 * connect takes longer than its whole deadline (__wrap_connect waits
 * 0.5 s; the deadline is 0.4 s). Before, the message looked at the new
 * connection, which nobody closed, and blamed wcached: "wcached at ...
 * closed the connection and the deadline of 0.4 s has passed".
 */
static void
test_deadline_in_reconnect_keeps_reason(void **state)
{
	struct fixture *f = *state;
	uint8_t reply[WIRE_MAX_MESSAGE];
	wc_model *m = NULL;
	wc_build *b = NULL;
	ssize_t n;
	int before;

	af_need_wrap(__real_connect != NULL, "-Wl,--wrap=connect");
	n = wire_put_attach_ok(reply, sizeof(reply), 9, &f->fake.ok);
	assert_true(n > 0);
	fake_raw(f, reply, (size_t)n);
	before = build_on_first_connection(f, &b);
	assert_int_equal(wc_set_timeout(f->client, DEADLINE_TEST_MS), 0);
	assert_error(wc_attach(f->client, MODEL, &m), -EBADMSG, "answered request 2 with 9");
	fault.connect_delay_ms = 500;
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT,
		"libwcache closed the connection to wcached at ");
	assert_non_null(strstr(wc_errmsg(), " because wcached answered request 2 with 9 (out "
		"of step) and the deadline of 0.4 s has passed"));
	assert_int_equal(fault.connect_delay_ms, 0); /* the wrapper waited */
	assert_null(m);
	publish_ended_because(b, "wcached answered request 2 with 9 (out of step)");
	finish(f, before);
	assert_int_equal(f->fake.accepted, 2); /* the new connection was made */
	assert_int_equal(f->fake.attaches, 1);
}

/*
 * A reply to DERIVE that cannot be used closes the connection: "wcached's
 * reply to DERIVE was malformed". The first DERIVE (k1) gets BUILD, the
 * second (k2) an artifact of two files, which an artifact never is.
 */
static void
test_derive_reply_malformed_ends_build(void **state)
{
	struct fixture *f = *state;
	wc_model *out = NULL;
	wc_build *b = NULL, *b2 = NULL;
	int before;

	f->fake.derive_builds = 1; /* the second DERIVE: ATTACH_OK, as kind says */
	before = build_on_first_connection(f, &b);
	assert_error(wc_derive(f->client, MODEL, "k2", &out, &b2), -EBADMSG,
		"key \"k2\": wcached at ");
	assert_non_null(strstr(wc_errmsg(), " sent an artifact of 2 files, not 1"));
	assert_null(out);
	assert_null(b2);
	build_ended_then_reconnect(f, b, "wcached's reply to DERIVE was malformed");
	finish(f, before);
	assert_int_equal(f->fake.derives, 2);
	assert_int_equal(f->fake.releases, 1); /* again's */
}

/*
 * An answer to ABANDON that is no answer to it closes the connection:
 * "wcached's reply to ABANDON was not one (out of step)". Two builds (k1,
 * k2); k2 is abandoned, and the fake answers HOLD_OK; k1's publish names
 * that.
 */
static void
test_abandon_reply_out_of_step_ends_build(void **state)
{
	struct fixture *f = *state;
	wc_model *out = NULL;
	wc_build *b = NULL, *b2 = NULL;
	int before;

	f->fake.abandon_err_code = -1;
	before = build_on_first_connection(f, &b);
	assert_int_equal(wc_derive(f->client, MODEL, "k2", &out, &b2), 1);
	wc_build_abandon(b2, "no room");
	assert_non_null(strstr(wc_errmsg(), "key \"k2\": unexpected reply to ABANDON from "
		"wcached at "));
	build_ended_then_reconnect(f, b, "wcached's reply to ABANDON was not one (out of step)");
	finish(f, before);
	assert_int_equal(f->fake.abandons, 1);
	assert_string_equal(f->fake.reason, "no room");
	assert_int_equal(f->fake.releases, 1); /* again's */
}

/*
 * After wcached closed the connection (the test shuts the fake's side
 * down, as a restart does), the reconnect's HOLD of the model still mapped
 * gets RELEASE_OK, no answer to a HOLD: libwcache closes that connection
 * ("wcached's reply to HOLD was not one (out of step)") and connects once
 * more, without HOLDs, where the attach works. Then the same with nobody
 * listening any more after the HOLD: connecting once more fails, and the
 * attach's error says why libwcache closed the connection before.
 */
static void
test_hold_reply_out_of_step(void **state)
{
	struct fixture *f = *state;
	wc_model *again = NULL;
	int before;

	f->fake.hold_handle = -2;
	for (int gone = 0; gone <= 1; gone++) {
		again = NULL;
		f->fake.holds = 0;
		f->fake.gone_at_hold = gone;
		f->fake.connections = gone ? 2 : 3;
		before = attach_ok(f);
		hang_up(f);
		if (!gone) {
			attach_again(f, &again);
			check_tensors(again);
			wc_release(again); /* over the third connection */
		} else {
			assert_error(wc_attach(f->client, MODEL, &again), -ECONNREFUSED,
				"libwcache closed the connection to wcached at ");
			assert_non_null(strstr(wc_errmsg(), " because wcached's reply to HOLD "
				"was not one (out of step), and connecting again failed: wcached "
				"is not running at "));
			assert_null(again);
		}
		check_tensors(f->model);
		wc_release(f->model); /* of the first connection: only unmapped */
		f->model = NULL;
		finish(f, before - gone); /* the fake closed its listening socket */
		assert_int_equal(f->fake.holds, 1);
		assert_int_equal(f->fake.accepted, gone ? 2 : 3);
		assert_int_equal(f->fake.attaches, gone ? 1 : 2);
		assert_int_equal(f->fake.releases, gone ? 0 : 1);
		if (!gone)
			assert_int_equal(f->fake.released_handle, HANDLE + 2);
	}
}

/* ---- ORIGINS (wc_model_file_origin) ------------------------------------- */

/* How the origins peer, a second wcached on the fake's listening socket
 * (the fake serves the client's own connection meanwhile), answers the
 * ORIGINS that libwcache sends on a connection of its own. */
enum origins_answer {
	ORIGINS_STAGED,     /* ORIGINS_OK of GENERATION with both files' origins */
	ORIGINS_NOT_STAGED, /* ORIGINS_OK with file_count 0 */
	ORIGINS_UNKNOWN,    /* as a wcached before ORIGINS: malformed, and close */
	ORIGINS_OTHER,      /* ORIGINS_OK of GENERATION + 1 */
	ORIGINS_OLDEST,     /* as the first wcacheds: "malformed message", seq 0 */
	ORIGINS_BUSY,       /* server.c refuse() at max_clients: ERROR EUSERS, seq 0 */
	ORIGINS_EOF,        /* a close before any reply */
};

struct origins_peer {
	struct fixture *f;
	enum origins_answer answer;
	pthread_t thread;
	int accepted;
	uint32_t first;
	char name[WIRE_MAX_NAME + 1];
};

/* The origin the peer gives file k. */
static struct wire_origin
peer_origin(uint32_t k)
{
	return (struct wire_origin){ .dev = 0x801 + k, .ino = 1000 + k, .size = k ? B_SIZE : A_SIZE,
		.mtime_ns = 1700000000123456789 + k, .ctime_ns = -5 - (int64_t)k };
}

static void *
origins_peer_run(void *arg)
{
	struct origins_peer *p = arg;
	struct wire_origins_ok ok = { .generation = GENERATION, .file_count = 2 };
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message msg;
	struct pollfd pfd = { .fd = p->f->fake.listen_fd, .events = POLLIN };
	const char *name;
	size_t len, nfds;
	ssize_t n;
	int fd;

	if (poll(&pfd, 1, 5000) != 1 || (fd = accept4(pfd.fd, NULL, NULL, SOCK_CLOEXEC)) < 0)
		return NULL;
	p->accepted++;
	if ((n = fdp_recv(fd, buf, sizeof(buf), NULL, 0, &nfds)) > 0 &&
		wire_decode(buf, (size_t)n, &msg) == 0 &&
		wire_get_origins(&msg, &p->first, &name, &len) == 0) {
		memcpy(p->name, name, len);
		p->name[len] = '\0';
		if (p->answer == ORIGINS_EOF) {
			n = 0;
		} else if (p->answer == ORIGINS_BUSY) {
			n = wire_put_error(buf, sizeof(buf), 0, EUSERS,
				"closed: wcached has max_clients connections");
		} else if (p->answer == ORIGINS_OLDEST) {
			n = wire_put_error(buf, sizeof(buf), 0, EBADMSG, "malformed message");
		} else if (p->answer == ORIGINS_UNKNOWN) {
			n = wire_put_error(buf, sizeof(buf), msg.h.seq, EBADMSG,
				"malformed message: unknown message type 7");
		} else {
			if (p->answer == ORIGINS_NOT_STAGED)
				ok.file_count = 0;
			if (p->answer == ORIGINS_OTHER)
				ok.generation++;
			ok.n = ok.file_count;
			for (uint32_t k = 0; k < ok.n; k++)
				ok.origins[k] = peer_origin(k);
			n = wire_put_origins_ok(buf, sizeof(buf), msg.h.seq, &ok);
		}
		if (n > 0)
			(void)fdp_send(fd, buf, (size_t)n, NULL, 0);
	}
	close(fd);
	return NULL;
}

/* Whether a connection waits on the fake's listening socket. */
static int
connection_waits(struct fixture *f)
{
	struct pollfd pfd = { .fd = f->fake.listen_fd, .events = POLLIN };

	return poll(&pfd, 1, 0) == 1;
}

/* wc_model_file_origin() of f->model's file k, with the peer answering as
 * answer when ask (it must connect then). */
static int
origin_of(struct fixture *f, struct origins_peer *p, int ask, size_t k, wc_file_identity *out)
{
	int r;

	if (ask) {
		p->f = f;
		assert_int_equal(pthread_create(&p->thread, NULL, origins_peer_run, p), 0);
	}
	r = wc_model_file_origin(f->model, k, out);
	if (ask)
		assert_int_equal(pthread_join(p->thread, NULL), 0);
	assert_false(connection_waits(f));
	return r;
}

/*
 * Another thread's fork() while wc_model_file_origin()'s connection of its
 * own is open (review rev180 F8): the child closes its copy, as it does
 * those of the client's connections, so that wcached sees that connection
 * end when the parent closes it. Before, the copy stayed open for the
 * child's life, counted against max_clients and max_clients_per_uid until
 * wcached's idle sweep (the child exited 3, "the connection being made"; and
 * with that fixed 4, "the client's connection": the reference the parent's
 * thread held kept the child's wc_disconnect() from closing it).
 */
static void
test_fork_while_origins_connects(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_STAGED };
	wc_file_identity id;
	int before;

	if (__real_connect == NULL)
		skip();
	before = attach_ok(f);
	fork_probe_arm(f, FORK_AT_CONNECT);
	assert_int_equal(origin_of(f, &p, 1, 0, &id), 0);
	fork_probe_check("while ORIGINS connected");
	assert_int_equal(p.accepted, 1);
	assert_int_equal(id.ino, peer_origin(0).ino);
	release_and_finish(f, before);
}

/*
 * Another thread's fork() while wc_connect() connects its first socket:
 * the child closes its copy at once, as it does ORIGINS' (no thread of
 * the child knows the client being made, so nothing else could). Before,
 * the socket was nobody's until wc_connect() had made the client, and the
 * copy stayed open for the child's life, counted against max_clients and
 * max_clients_per_uid (the child exited 3, "the connection being made").
 */
static void
test_fork_while_wc_connect_connects(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();

	af_need_wrap(__real_connect != NULL, "-Wl,--wrap=connect");
	fake_start(f);
	fork_probe_arm(f, FORK_AT_CONNECT);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	fork_probe_check("while wc_connect() connected");
	if (wc_attach(f->client, MODEL, &f->model) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	release_and_finish(f, before);
	assert_int_equal(f->fake.accepted, 1);
}

/*
 * wcached says what the files were copied from: libwcache asks it once,
 * on a connection of its own (ORIGINS with the model's name, from file 0),
 * and answers every file from that; the client's own connection carries
 * nothing of it (the fake sees only the attach).
 */
static void
test_file_origin_asked_once(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_STAGED };
	wc_file_identity id;
	struct wire_origin want;
	int before = attach_ok(f);

	for (int i = 0; i < 2; i++) {
		size_t k = (size_t)i;

		memset(&id, 0, sizeof(id));
		assert_int_equal(origin_of(f, &p, i == 0, k, &id), 0);
		want = peer_origin((uint32_t)k);
		assert_true(id.dev == want.dev && id.ino == want.ino && id.size == want.size &&
			id.mtime_ns == want.mtime_ns && id.ctime_ns == want.ctime_ns);
	}
	assert_int_equal(p.accepted, 1);
	assert_int_equal(p.first, 0);
	assert_string_equal(p.name, MODEL);
	assert_error(wc_model_file_origin(f->model, 2, &id), -ERANGE, "file 2 of 2");
	assert_error(wc_model_file_origin(f->model, 0, NULL), -EINVAL, "no identity");
	release_and_finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
}

/* A generation that serves its files where they are: -ENOENT for every
 * file, asked once. */
static void
test_file_origin_not_staged(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_NOT_STAGED };
	wc_file_identity id;
	int before = attach_ok(f);

	assert_int_equal(origin_of(f, &p, 1, 0, &id), -ENOENT);
	assert_non_null(strstr(wc_errmsg(), "file 0 is not a staged copy"));
	assert_int_equal(origin_of(f, &p, 0, 1, &id), -ENOENT);
	assert_int_equal(p.accepted, 1);
	release_and_finish(f, before);
}

/*
 * A wcached older than ORIGINS refuses the type and closes that
 * connection: -ENOTSUP, the client's own connection goes on (the model is
 * released over it), and the client does not ask again (the next call
 * answers at once, without connecting).
 */
static void
test_file_origin_older_wcached(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_UNKNOWN };
	wc_file_identity id;
	int before = attach_ok(f);

	assert_int_equal(origin_of(f, &p, 1, 0, &id), -ENOTSUP);
	assert_non_null(strstr(wc_errmsg(), "does not say what its staged copies were copied "
		"from (it is older than this libwcache)"));
	assert_int_equal(origin_of(f, &p, 0, 1, &id), -ENOTSUP);
	assert_int_equal(p.accepted, 1);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 1);
}

/* The first wcacheds answer any malformed message with "malformed
 * message" of seq 0: older too. */
static void
test_file_origin_oldest_wcached(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_OLDEST };
	wc_file_identity id;
	int before = attach_ok(f);

	assert_int_equal(origin_of(f, &p, 1, 0, &id), -ENOTSUP);
	assert_int_equal(origin_of(f, &p, 0, 1, &id), -ENOTSUP);
	release_and_finish(f, before);
}

/*
 * rev180 F2: a wcached that refuses the connection (max_clients: ERROR
 * EUSERS of seq 0) says so, and one that closes it before any reply is
 * -ECONNRESET; neither is taken for an older wcached, and the next call
 * asks again. Before, the first was "the reply to ORIGINS was malformed"
 * and the second -ENOTSUP, remembered for the client's life.
 */
static void
test_file_origin_busy_or_closed_asks_again(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_BUSY };
	wc_file_identity id;
	int before = attach_ok(f);

	assert_error(origin_of(f, &p, 1, 0, &id), -EUSERS,
		"closed: wcached has max_clients connections");
	p.answer = ORIGINS_EOF;
	assert_error(origin_of(f, &p, 1, 0, &id), -ECONNRESET,
		"closed the connection before answering ORIGINS");
	p.answer = ORIGINS_STAGED;
	assert_int_equal(origin_of(f, &p, 1, 1, &id), 0);
	assert_int_equal(id.ino, peer_origin(1).ino);
	assert_int_equal(p.accepted, 3);
	release_and_finish(f, before);
}

/*
 * rev180 F2: a refusal by an older wcached holds until the client
 * connects again (a restart that may be an upgrade): then it is asked
 * again. Before, it was never asked again in the client's life.
 */
static void
test_file_origin_asked_again_after_reconnect(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_UNKNOWN };
	wc_file_identity id;
	wc_model *again = NULL;
	int before;

	f->fake.connections = 2;
	before = attach_ok(f);
	assert_int_equal(origin_of(f, &p, 1, 0, &id), -ENOTSUP);
	assert_int_equal(origin_of(f, &p, 0, 0, &id), -ENOTSUP);
	hang_up(f);
	attach_again(f, &again);
	p.answer = ORIGINS_STAGED;
	assert_int_equal(origin_of(f, &p, 1, 1, &id), 0);
	assert_int_equal(id.ino, peer_origin(1).ino);
	assert_int_equal(p.accepted, 2);
	wc_release(f->model);
	f->model = NULL;
	wc_release(again);
	finish(f, before);
}

/* wcached serves another generation now: -ESTALE, and it is asked again
 * the next time (nothing was kept). */
static void
test_file_origin_other_generation(void **state)
{
	struct fixture *f = *state;
	struct origins_peer p = { .answer = ORIGINS_OTHER };
	wc_file_identity id;
	int before = attach_ok(f);

	assert_int_equal(origin_of(f, &p, 1, 0, &id), -ESTALE);
	assert_non_null(strstr(wc_errmsg(), "wcached serves generation 8 now, not 7"));
	p.answer = ORIGINS_STAGED;
	assert_int_equal(origin_of(f, &p, 1, 1, &id), 0);
	assert_int_equal(id.ino, peer_origin(1).ino);
	assert_int_equal(p.accepted, 2);
	release_and_finish(f, before);
}

/* ---- a release while descriptors are received -------------------------- */

/* An attach on its own thread, the client's for the recvmsg() hooks. */
struct held_attach {
	struct fixture *f;
	wc_model *model;
	int result;
	char msg[256];
	volatile pid_t tid; /* the thread's, once it runs */
};

static void *
attach_fds_held(void *arg)
{
	struct held_attach *h = arg;

	h->tid = gettid();
	fault.client = pthread_self();
	h->result = wc_attach_fds(h->f->client, MODEL, &h->model);
	snprintf(h->msg, sizeof(h->msg), "%s", wc_errmsg());
	return NULL;
}

/* Starts h's attach with its reply's receive held (fault.recv_hold) and
 * returns once the descriptors are received, before any model has them. */
static void
start_held_attach(struct fixture *f, struct held_attach *h, pthread_t *t)
{
	h->f = f;
	fault.recv_hold = 1;
	assert_int_equal(pthread_create(t, NULL, attach_fds_held, h), 0);
	assert_int_equal(fake_sem_wait(&fault.read), 0);
}

/* Lets h's attach go on and waits for it, which must have worked. */
static void
finish_held_attach(struct held_attach *h, pthread_t t)
{
	assert_int_equal(sem_post(&fault.go), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	fault.client = pthread_self();
	if (h->result != 0)
		fail_msg("the held attach failed: %d %s", h->result, h->msg);
}

/*
 * A re-attach after closefrom() on one thread, the release of the model
 * that lost the numbers on another, between the re-attach's recvmsg() and
 * the new model's registration of its descriptors (review rev174 F2, the
 * window 8429855 left): the new descriptors are of the same files on the
 * same numbers, so the released model's guard cannot tell them from its
 * own. Before, the release closed them and the attach failed (fstat: Bad
 * file descriptor), or mapped whatever took the number.
 */
static void
test_release_in_receive_keeps_new_fds(void **state)
{
	struct fixture *f = *state;
	struct held_attach h = { 0 };
	wc_model *m1 = NULL;
	pthread_t t;
	int before, old[2], fresh[2];

	NEED_WRAP();
	before = attach_ok(f);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m1), 0);
	for (size_t i = 0; i < 2; i++)
		old[i] = wc_model_fd(m1, i);
	close(old[0]); /* closefrom() behind the model's back */
	close(old[1]);
	start_held_attach(f, &h, &t);
	wc_release(m1);
	finish_held_attach(&h, t);
	for (size_t i = 0; i < 2; i++) {
		fresh[i] = wc_model_fd(h.model, i);
		assert_true(tu_fd_is_readonly_of(fresh[i], f->file_fd[i]));
	}
	assert_true(fresh[0] == old[0] || fresh[1] == old[1]); /* the case */
	check_tensors(h.model);
	wc_release(h.model);
	for (size_t i = 0; i < 2; i++)
		assert_int_equal(fcntl(fresh[i], F_GETFD), -1);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 3);
}

/*
 * What a release or wc_model_close_fd() does not close while descriptors
 * are received on another thread is closed once that receive's model has
 * them: nothing leaks. A child forked meanwhile has no receive in flight:
 * its first release closes its copies of them, and its model's own.
 */
static void
test_release_in_receive_closes_later(void **state)
{
	struct fixture *f = *state;
	struct held_attach h = { 0 };
	wc_model *m0 = NULL, *m1 = NULL;
	pthread_t t;
	pid_t pid;
	int before, old[2], own;

	NEED_WRAP();
	before = attach_ok(f);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m0), 0);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m1), 0);
	own = wc_model_fd(m0, 0);
	for (size_t i = 0; i < 2; i++)
		old[i] = wc_model_fd(m1, i);
	start_held_attach(f, &h, &t);
	assert_int_equal(wc_model_close_fd(m1, 0), 0);
	assert_error(wc_model_fd(m1, 0), -ENOENT, "no descriptor kept");
	wc_release(m1);
	for (size_t i = 0; i < 2; i++) /* closed once the receive's model has its own */
		assert_int_not_equal(fcntl(old[i], F_GETFD), -1);
	if ((pid = fork()) == 0) {
		alarm(20);
		wc_release(m0);
		_exit(fcntl(own, F_GETFD) != -1 ? 3 : fcntl(old[0], F_GETFD) != -1 ? 4 :
			fcntl(old[1], F_GETFD) != -1 ? 5 : 0);
	}
	assert_true(pid > 0);
	af_child_ok(pid);
	finish_held_attach(&h, t);
	for (size_t i = 0; i < 2; i++)
		assert_int_equal(fcntl(old[i], F_GETFD), -1);
	check_tensors(h.model);
	wc_release(h.model);
	wc_release(m0);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 4);
}

/* Whether thread tid of this process sleeps (state S in its stat: in a
 * system call that waits, as poll(2) or a blocking recvmsg()). */
static int
thread_sleeps(pid_t tid)
{
	char path[64], line[512] = "";
	const char *state;
	FILE *in;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	if ((in = fopen(path, "r")) == NULL)
		return 0;
	if (fgets(line, sizeof(line), in) == NULL)
		line[0] = '\0';
	fclose(in);
	state = strrchr(line, ')'); /* after the thread's name, which may hold one */
	return state != NULL && state[1] == ' ' && state[2] == 'S';
}

/*
 * While another thread's request waits for its reply (an attach the fake
 * holds at its gate, as a DERIVE waits minutes for another worker's
 * build), wc_model_close_fd() and a release close their kept descriptors
 * at once: the receive that holds them back begins only once the reply is
 * there (request.c, receive_begin). Before, it began with the wait, and
 * they stayed open until the reply came.
 */
static void
test_release_while_reply_waits_closes_now(void **state)
{
	struct fixture *f = *state;
	static sem_t gate, at_gate; /* the fake may outlive a failure */
	struct held_attach h = { 0 };
	wc_model *m0 = NULL, *m1 = NULL;
	pthread_t t;
	double until;
	int before, closed, old[3];

	before = attach_ok(f);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m0), 0);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m1), 0);
	old[0] = wc_model_fd(m0, 1);
	old[1] = wc_model_fd(m1, 0);
	old[2] = wc_model_fd(m1, 1);
	assert_int_equal(sem_init(&gate, 0, 0), 0);
	assert_int_equal(sem_init(&at_gate, 0, 0), 0);
	f->fake.at_gate = &at_gate;
	f->fake.gate = &gate;
	h.f = f;
	assert_int_equal(pthread_create(&t, NULL, attach_fds_held, &h), 0);
	assert_int_equal(fake_sem_wait(&at_gate), 0);
	/* The attach has sent its request: it waits for the reply once its
	 * thread sleeps. */
	until = tu_now() + DEADLINE_MS / 1000.0;
	while (!thread_sleeps(h.tid) && tu_now() < until)
		usleep(1000);
	assert_int_equal(wc_model_close_fd(m0, 1), 0);
	wc_release(m1);
	closed = fcntl(old[0], F_GETFD) == -1 && fcntl(old[1], F_GETFD) == -1 &&
		fcntl(old[2], F_GETFD) == -1;
	assert_int_equal(sem_post(&gate), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	fault.client = pthread_self();
	f->fake.gate = NULL;
	if (h.result != 0)
		fail_msg("the waiting attach failed: %d %s", h.result, h.msg);
	if (!closed)
		fail_msg("a kept descriptor stayed open while another thread waited for a reply");
	check_tensors(h.model);
	wc_release(h.model);
	wc_release(m0);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 4);
	sem_destroy(&gate);
	sem_destroy(&at_gate);
}

int
main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_wrong_seq),
		T(test_error_enoent),
		T(test_error_text_surfaces),
		T(test_daemon_closes),
		T(test_garbage_replies),
		T(test_refusal_before_request),
		T(test_refusal_reset_on_send),
		T(test_refusal_reset_on_receive),
		T(test_refusal_read_before_close),
		T(test_reset_without_refusal),
		T(test_reconnect_after_restart),
		T(test_file_origin_asked_once),
		T(test_file_origin_not_staged),
		T(test_file_origin_older_wcached),
		T(test_file_origin_other_generation),
		T(test_file_origin_oldest_wcached),
		T(test_file_origin_busy_or_closed_asks_again),
		T(test_file_origin_asked_again_after_reconnect),
		T(test_fork_while_origins_connects),
		T(test_fork_while_wc_connect_connects),
		T(test_reconnect_holds),
		T(test_reconnect_records_the_new_socket),
		T(test_fork_while_reconnect_connects),
		T(test_fork_while_reconnect_takes_identity),
		T(test_reconnect_hold_hang_up),
		T(test_reconnect_when_daemon_dies_holding_request),
		T(test_reconnect_fails_when_daemon_gone),
		T(test_reconnect_within_deadline),
		T(test_connect_interrupted),
		T(test_eagain_before_deadline),
		T(test_nonblocking_descriptor_keeps_deadline),
		T(test_interval_timer_keeps_deadline),
		T(test_send_eagain_before_deadline),
		T(test_send_interrupted),
		T(test_connect_interrupted_keeps_deadline),
		T(test_reconnect_interrupted_keeps_deadline),
		T(test_reconnect_holds_keep_deadline),
		T(test_release_while_stalled_closes),
		T(test_release_while_stalled_keeps_deadline),
		T(test_release_while_stalled_ends_build),
		T(test_request_timeout_ends_build),
		T(test_two_closes_keep_the_first_reason),
		T(test_out_of_descriptors_ends_build),
		T(test_untrusted_reply_ends_build),
		T(test_send_wait_failure_ends_build),
		T(test_answer_wait_failure_ends_build),
		T(test_release_send_failure_ends_build),
		T(test_out_of_step_reply_ends_build),
		T(test_derive_reply_malformed_ends_build),
		T(test_abandon_reply_out_of_step_ends_build),
		T(test_hold_reply_out_of_step),
		T(test_queued_after_close_answers_nothing),
		T(test_deadline_in_reconnect_keeps_reason),
		T(test_release_in_receive_keeps_new_fds),
		T(test_release_in_receive_closes_later),
		T(test_release_while_reply_waits_closes_now),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}
