/*
 * test_peercred.c: daemon/peercred.c, the one reader of a socket peer's
 * credentials. On a socketpair the peer is this process: its uid, gid and
 * groups come back. getsockopt is wrapped (-Wl,--wrap) so that a test can
 * give the peer any number of supplementary groups the way the kernel
 * reports them (ERANGE with the length it needs), including more than 256
 * and more than the kernel allows. peer_departed: a peer that shut its end
 * for writing has not gone, one that closed its socket has.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "peercred.h"
#include "testutil.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

/* Fake groups: 0 uses the real getsockopt; otherwise SO_PEERGROUPS says
 * the peer has fake_groups groups 100000, 100001, ... */
static size_t fake_groups;
static int group_calls;

int __real_getsockopt(int fd, int level, int name, void *val, socklen_t *len);
int __wrap_getsockopt(int fd, int level, int name, void *val, socklen_t *len);

int
__wrap_getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	size_t need = fake_groups * sizeof(gid_t);

	if (fake_groups == 0 || level != SOL_SOCKET || name != SO_PEERGROUPS)
		return __real_getsockopt(fd, level, name, val, len);
	group_calls++;
	if (*len < need) { /* as the kernel does: the length it needs */
		*len = (socklen_t)need;
		errno = ERANGE;
		return -1;
	}
	for (size_t i = 0; i < fake_groups; i++)
		((gid_t *)val)[i] = (gid_t)(100000 + i);
	*len = (socklen_t)need;
	return 0;
}

static int
setup(void **state)
{
	int *sv = malloc(2 * sizeof(int));

	assert_non_null(sv);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	fake_groups = 0;
	group_calls = 0;
	*state = sv;
	return 0;
}

static int
teardown(void **state)
{
	int *sv = *state;

	close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	free(sv);
	return 0;
}

/* The peer is this process: its ids and its own groups. */
static void
test_self(void **state)
{
	int *sv = *state;
	struct peer_cred c;
	gid_t mine[256];
	int n = getgroups(256, mine);

	assert_int_equal(peer_read(sv[0], &c), 0);
	assert_int_equal(c.pid, getpid());
	assert_int_equal(c.uid, geteuid());
	assert_int_equal(c.gid, getegid());
	assert_true(n >= 0);
	assert_int_equal(c.ngroups, (size_t)n);
	for (int i = 0; i < n; i++)
		assert_true(peer_in_group(&c, mine[i]));
	assert_true(peer_in_group(&c, getegid())); /* the primary group counts */
	peer_cred_free(&c);
	assert_null(c.groups);
	peer_cred_free(NULL);
}

/* 300 groups: more than the old fixed buffer of 256; the buffer grows
 * and every group is there, the last one included. */
static void
test_many_groups(void **state)
{
	int *sv = *state;
	struct peer_cred c;

	fake_groups = 300;
	assert_int_equal(peer_read(sv[0], &c), 0);
	assert_int_equal(c.ngroups, 300);
	assert_true(peer_in_group(&c, 100000));
	assert_true(peer_in_group(&c, 100299));
	assert_false(peer_in_group(&c, 100300));
	assert_int_equal(group_calls, 2); /* 64 first, then what it needs */
	peer_cred_free(&c);

	fake_groups = PEER_MAX_GROUPS; /* the kernel's most */
	assert_int_equal(peer_read(sv[0], &c), 0);
	assert_int_equal(c.ngroups, PEER_MAX_GROUPS);
	assert_true(peer_in_group(&c, (gid_t)(100000 + PEER_MAX_GROUPS - 1)));
	peer_cred_free(&c);
}

/* More than a process can have: refused, not cut short; *out untouched. */
static void
test_too_many_groups(void **state)
{
	int *sv = *state;
	struct peer_cred c = { .pid = 77 };

	fake_groups = PEER_MAX_GROUPS + 1;
	assert_int_equal(peer_read(sv[0], &c), -E2BIG);
	assert_non_null(strstr(error_get(), "65537 supplementary groups, more than 65536"));
	assert_int_equal(c.pid, 77);
	assert_null(c.groups);
}

/* Not a socket: the reason, nothing allocated. */
static void
test_not_a_socket(void **state)
{
	struct peer_cred c = { .pid = 77 };
	int p[2];

	(void)state;
	assert_int_equal(pipe(p), 0);
	assert_int_equal(peer_read(p[0], &c), -ENOTSOCK);
	assert_non_null(strstr(error_get(), "SO_PEERCRED"));
	assert_int_equal(c.pid, 77);
	close(p[0]);
	close(p[1]);
}

/* Connected, then half-closed by the peer (it still reads): not gone.
 * Closed: gone. Closed with our data unread (POLLERR too): gone. */
static void
test_departed(void **state)
{
	int *sv = *state;
	int more[2];

	assert_false(peer_departed(sv[0]));
	assert_int_equal(shutdown(sv[1], SHUT_WR), 0);
	assert_false(peer_departed(sv[0]));
	close(sv[1]);
	sv[1] = -1;
	assert_true(peer_departed(sv[0]));

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, more), 0);
	assert_int_equal(write(more[0], "x", 1), 1); /* left unread by the peer */
	close(more[1]);
	assert_true(peer_departed(more[0]));
	close(more[0]);

	assert_false(peer_departed(-1));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_self, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_groups, setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_many_groups, setup, teardown),
		cmocka_unit_test(test_not_a_socket),
		cmocka_unit_test_setup_teardown(test_departed, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
