/*
 * test_closer.c: unit tests of daemon/closer.c, the lanes that close
 * descriptors off the event loop: every descriptor is closed, in order; a
 * close that blocks (a TCP socket lingering with unsent data to a peer that
 * does not read) holds up its own lane only, and closer_stuck() sees it; a
 * mapping handed over with its descriptor is unmapped in the lane, in
 * order, not by the caller, and does not count against the lane's owner,
 * nor makes its lane stuck when it is slow; a NULL closer closes at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "closer.h"
#include "testutil.h"

/* Waits up to ms for the read end of a pipe to see end of file (its
 * write end closed everywhere); 1 when it did. */
static int
eof_within(int rfd, int ms)
{
	struct pollfd p = { .fd = rfd, .events = POLLIN };
	char c;

	return poll(&p, 1, ms) == 1 && read(rfd, &c, 1) == 0;
}

/* Waits up to ms for owner's lane to be empty. */
static int
drained_within(struct closer *cl, uid_t owner, int ms)
{
	double end = tu_now() + ms / 1000.0;

	while (closer_pending(cl, owner) > 0) {
		if (tu_now() > end)
			return 0;
		usleep(1000);
	}
	return 1;
}

/* Waits up to ms for every lane to be empty, what owners chose or not. */
static int
all_drained_within(struct closer *cl, int ms)
{
	double end = tu_now() + ms / 1000.0;

	while (closer_total(cl) > 0) {
		if (tu_now() > end)
			return 0;
		usleep(1000);
	}
	return 1;
}

static void
test_every_descriptor_is_closed(void **state)
{
	struct closer *cl;
	int p[64][2], base = tu_count_fds();

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	for (int i = 0; i < 64; i++) {
		assert_int_equal(pipe2(p[i], O_CLOEXEC), 0);
		closer_close(cl, (uid_t)(i % 3), p[i][1]);
	}
	for (int i = 0; i < 64; i++) {
		assert_true(eof_within(p[i][0], 10000));
		close(p[i][0]);
	}
	for (uid_t u = 0; u < 3; u++)
		assert_true(drained_within(cl, u, 10000));
	assert_int_equal(tu_count_fds(), base);
	assert_int_equal(closer_closed_inline(cl), 0);
	closer_stop(cl, 1000);
}

/* A TCP socket whose last close lingers: connected to a listener whose
 * accepted end (*peer) never reads, its send buffer full, SO_LINGER 30 s. */
static int
lingering_socket(int *listener, int *peer)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	struct linger lg = { 1, 30 };
	int small = 4096, fd;
	char chunk[65536] = { 0 };

	*listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(*listener >= 0);
	assert_int_equal(setsockopt(*listener, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
	assert_int_equal(bind(*listener, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(*listener, 1), 0);
	assert_int_equal(getsockname(*listener, (struct sockaddr *)&a, &len), 0);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	*peer = accept4(*listener, NULL, NULL, SOCK_CLOEXEC);
	assert_true(*peer >= 0);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	while (send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL) > 0)
		;
	assert_int_equal(errno, EAGAIN);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	return fd;
}

static void
test_a_lingering_close_holds_its_own_lane_only(void **state)
{
	struct closer *cl;
	int listener, peer, lingering, p[2];
	double start;

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	lingering = lingering_socket(&listener, &peer);
	closer_close(cl, 7, lingering);
	/* The same owner's next descriptor waits behind it ... */
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	closer_close(cl, 7, p[1]);
	assert_false(eof_within(p[0], 300));
	assert_int_equal(closer_pending(cl, 7), 2);
	assert_int_equal(closer_stuck(cl, 7, 200), 2);
	assert_int_equal(closer_stuck(cl, 7, 60000), 0);
	close(p[0]);
	/* ... another owner's does not. */
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	start = tu_now();
	closer_close(cl, 8, p[1]);
	assert_true(eof_within(p[0], 10000));
	assert_true(tu_now() - start < 1.0);
	close(p[0]);
	assert_true(drained_within(cl, 8, 10000));
	assert_int_equal(closer_stuck(cl, 8, 0), 0);
	/* The peer goes with unread data: a reset, and the linger ends. */
	close(peer);
	assert_true(drained_within(cl, 7, 10000));
	close(listener);
	closer_stop(cl, 1000);
}

/* Whether the page at p is mapped (mincore fails with ENOMEM where not). */
static int
mapped(void *p)
{
	unsigned char v;

	return mincore(p, 1, &v) == 0;
}

static void
test_a_mapping_goes_in_its_lane_in_order(void **state)
{
	long page = sysconf(_SC_PAGESIZE);
	struct closer *cl;
	int listener, peer, lingering, p[2];
	void *m;

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	lingering = lingering_socket(&listener, &peer);
	closer_close(cl, 7, lingering);
	m = mmap(NULL, (size_t)(4 * page), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(m != MAP_FAILED);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	closer_unmap_close(cl, 7, m, (size_t)(4 * page), p[1]);
	/* Behind the lingering close: neither unmapped nor closed yet. Only
	 * what the owner chose counts against it (the daemon's own does not). */
	assert_false(eof_within(p[0], 300));
	assert_true(mapped(m));
	assert_int_equal(closer_pending(cl, 7), 1);
	assert_int_equal(closer_total(cl), 2);
	close(peer);
	assert_true(eof_within(p[0], 10000));
	assert_true(all_drained_within(cl, 10000));
	assert_false(mapped(m));
	assert_false(mapped((char *)m + 3 * page));
	close(p[0]);
	close(listener);
	/* A mapping alone, with no descriptor, goes too. */
	m = mmap(NULL, (size_t)page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(m != MAP_FAILED);
	closer_unmap_close(cl, 9, m, (size_t)page, -1);
	assert_true(all_drained_within(cl, 10000));
	assert_false(mapped(m));
	closer_stop(cl, 1000);
}

/* A slow close of the daemon's own in an owner's lane (a large artifact of
 * the owner's being freed) does not make the owner's lane stuck: what the
 * owner chose waits behind it as pending. Once the owner's own close
 * hangs, the lane is stuck again. */
static void
test_the_daemons_slow_close_is_not_the_owners(void **state)
{
	struct closer *cl;
	int listener, peer, lingering, listener2, peer2, lingering2, p[2];

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	lingering = lingering_socket(&listener, &peer);
	lingering2 = lingering_socket(&listener2, &peer2);
	closer_unmap_close(cl, 7, NULL, 0, lingering);
	closer_close(cl, 7, lingering2);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	closer_close(cl, 7, p[1]);
	assert_false(eof_within(p[0], 300));
	assert_int_equal(closer_pending(cl, 7), 2);
	assert_int_equal(closer_stuck(cl, 7, 200), 0);
	/* The daemon's close ends; the owner's own lingering one is next. */
	close(peer);
	for (double end = tu_now() + 10; closer_total(cl) > 2 && tu_now() < end;)
		usleep(1000);
	assert_int_equal(closer_total(cl), 2);
	usleep(300 * 1000);
	assert_int_equal(closer_stuck(cl, 7, 200), 2);
	close(peer2);
	assert_true(eof_within(p[0], 10000));
	assert_true(all_drained_within(cl, 10000));
	close(p[0]);
	close(listener);
	close(listener2);
	closer_stop(cl, 1000);
}

static void
test_null_closer_closes_at_once(void **state)
{
	int p[2];

	(void)state;
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	closer_close(NULL, 1, p[1]);
	assert_true(eof_within(p[0], 0));
	close(p[0]);
	assert_int_equal(closer_pending(NULL, 1), 0);
	closer_close(NULL, 1, -1); /* nothing to close */
	closer_stop(NULL, 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_descriptor_is_closed),
		cmocka_unit_test(test_a_lingering_close_holds_its_own_lane_only),
		cmocka_unit_test(test_a_mapping_goes_in_its_lane_in_order),
		cmocka_unit_test(test_the_daemons_slow_close_is_not_the_owners),
		cmocka_unit_test(test_null_closer_closes_at_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
