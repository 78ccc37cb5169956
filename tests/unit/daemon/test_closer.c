/*
 * test_closer.c: unit tests of daemon/closer.c, the lanes that close
 * descriptors off the event loop: every descriptor is closed, in order; a
 * close that blocks (a TCP socket lingering with unsent data to a peer that
 * does not read) holds up its own lane only, and closer_stuck() sees it; a
 * mapping handed over with its descriptor is unmapped in the daemon's own
 * lane of its owner, in order, not by the caller, and does not count
 * against the owner, nor makes its lane stuck when it is slow; the owner's
 * hanging close holds up none of the daemon's own (review rev186 F2,
 * rev189 F4); a lane's thread waits a moment for more before it ends; a
 * NULL closer closes at once; closer_then() calls back once the lanes it
 * names are through.
 *
 * With the registry (daemonutil.c's loop, registry and model files): a
 * load refused for descriptors runs again once a closed generation's
 * descriptors are closed in their lane, not when the generation is handed
 * to the closer (review rev180 F1), and again when a generation closes
 * while that retry runs (review rev182 F2); nothing calls the registry
 * back once it is closed. munmap is wrapped (tests/CMakeLists.txt) to hold
 * a lane at a gate: the unmap of one mapping waits until the test opens
 * it; mountrule_realpath and mountrule_fd_realpath too, to hold a load on
 * the work queue's thread after its files are opened.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "closer.h"
#include "daemonutil.h"
#include "mountrule.h"
#include "registry.h"
#include "testutil.h"

/* ---- the gate: munmap(gated) waits while it is shut ---- */

int __real_munmap(void *addr, size_t len);
int __wrap_munmap(void *addr, size_t len);

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static void *gated;
static int gate_shut, gate_waiting;
static atomic_long unmapped_by; /* the thread of the last unmap */

/* The ranges unmapped lately (a ring under gate_lock): whether the closer
 * let go of a mapping is asked here, not of the kernel, since any mmap(2)
 * in any thread (a lane's thread starting, the sanitizer's own) may take
 * the freed address at once (CI stop 54: mincore() found m mapped again
 * right after the closer's munmap of it). */
#define UNMAPPED_RING 64
static struct {
	char *addr;
	size_t len;
} unmapped_ring[UNMAPPED_RING];
static unsigned unmapped_next;

int
__wrap_munmap(void *addr, size_t len)
{
	atomic_store(&unmapped_by, syscall(SYS_gettid));
	pthread_mutex_lock(&gate_lock);
	if (gate_shut && addr == gated) {
		gate_waiting = 1;
		pthread_cond_broadcast(&gate_cond);
		while (gate_shut)
			pthread_cond_wait(&gate_cond, &gate_lock);
	}
	pthread_mutex_unlock(&gate_lock);
	if (__real_munmap(addr, len) != 0)
		return -1;
	pthread_mutex_lock(&gate_lock);
	unmapped_ring[unmapped_next % UNMAPPED_RING].addr = addr;
	unmapped_ring[unmapped_next % UNMAPPED_RING].len = len;
	unmapped_next++;
	pthread_mutex_unlock(&gate_lock);
	return 0;
}

/* Shuts the gate in front of the unmap of addr. */
static void
gate_shut_at(const void *addr)
{
	pthread_mutex_lock(&gate_lock);
	gated = (void *)addr;
	gate_shut = 1;
	gate_waiting = 0;
	pthread_mutex_unlock(&gate_lock);
}

/* 1 once an unmap waits at the gate, within ms. */
static int
gate_reached_within(int ms)
{
	double end = tu_now() + ms / 1000.0;
	int reached;

	pthread_mutex_lock(&gate_lock);
	while (!gate_waiting && tu_now() < end) {
		pthread_mutex_unlock(&gate_lock);
		usleep(1000);
		pthread_mutex_lock(&gate_lock);
	}
	reached = gate_waiting;
	pthread_mutex_unlock(&gate_lock);
	return reached;
}

static void
gate_open(void)
{
	pthread_mutex_lock(&gate_lock);
	gate_shut = 0;
	gated = NULL;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
}

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

/* A new anonymous mapping of len bytes (MAP_FAILED if none), of which no
 * earlier unmap is remembered. */
static void *
map_anon(size_t len)
{
	char *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED)
		return MAP_FAILED;
	pthread_mutex_lock(&gate_lock);
	for (unsigned i = 0; i < UNMAPPED_RING; i++) {
		char *a = unmapped_ring[i].addr;

		if (a != NULL && a < m + len && m < a + unmapped_ring[i].len)
			unmapped_ring[i].addr = NULL;
	}
	pthread_mutex_unlock(&gate_lock);
	return m;
}

/* Whether a munmap() that succeeded lately covered p: the closer let go of
 * it (mapped() may find another mapping there since). */
static int
unmapped(void *p)
{
	int found = 0;

	pthread_mutex_lock(&gate_lock);
	for (unsigned i = 0; i < UNMAPPED_RING && !found; i++) {
		char *a = unmapped_ring[i].addr;

		found = a != NULL && (char *)p >= a && (char *)p < a + unmapped_ring[i].len;
	}
	pthread_mutex_unlock(&gate_lock);
	return found;
}

static void
count_call(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

/* Waits up to ms for *calls to reach want. */
static int
calls_within(atomic_int *calls, int want, int ms)
{
	double end = tu_now() + ms / 1000.0;

	while (atomic_load(calls) < want) {
		if (tu_now() > end)
			return 0;
		usleep(1000);
	}
	return 1;
}

/* A mapping handed over with its descriptor goes in the daemon's own lane
 * of its owner: unmapped, then closed, in order, whatever the owner's own
 * lane holds (a lingering close), and not counted against the owner. */
static void
test_a_mapping_goes_in_the_daemons_own_lane_in_order(void **state)
{
	long page = sysconf(_SC_PAGESIZE);
	struct closer *cl;
	int listener, peer, lingering, p[2];
	void *m;

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	lingering = lingering_socket(&listener, &peer);
	closer_close(cl, 7, lingering);
	m = map_anon((size_t)(4 * page));
	assert_true(m != MAP_FAILED);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	gate_shut_at(m);
	closer_unmap_close(cl, 7, m, (size_t)(4 * page), p[1]);
	/* The unmap first: held at the gate, the descriptor is not closed. */
	assert_true(gate_reached_within(10000));
	assert_false(eof_within(p[0], 100));
	assert_true(mapped(m));
	assert_int_equal(closer_pending(cl, 7), 1);
	assert_int_equal(closer_total(cl), 2);
	gate_open();
	/* Through while the owner's lingering close still hangs. */
	assert_true(eof_within(p[0], 10000));
	assert_true(unmapped(m));
	assert_true(unmapped((char *)m + 3 * page));
	for (double end = tu_now() + 10; closer_total(cl) > 1 && tu_now() < end;)
		usleep(1000);
	assert_int_equal(closer_total(cl), 1);
	assert_int_equal(closer_pending(cl, 7), 1);
	close(p[0]);
	close(peer);
	assert_true(all_drained_within(cl, 10000));
	close(listener);
	/* A mapping alone, with no descriptor, goes too. */
	m = map_anon((size_t)page);
	assert_true(m != MAP_FAILED);
	closer_unmap_close(cl, 9, m, (size_t)page, -1);
	assert_true(all_drained_within(cl, 10000));
	assert_true(unmapped(m));
	closer_stop(cl, 1000);
}

/* Review rev186 F2(a), rev189 F4: the owner's close that hangs (a
 * lingering socket it passed) does not hold up the daemon's own closes of
 * that owner (a derived artifact it built, dropped for another user's
 * publication), and closer_then() on them is through while it hangs.
 * Before, both were in the one lane of the owner, behind its close. And
 * the daemon's own slow close (a large artifact being freed, held at the
 * gate) neither holds up what the owner chose nor makes its lane stuck. */
static void
test_the_owners_hanging_close_holds_up_none_of_the_daemons_own(void **state)
{
	static atomic_int calls;
	const uid_t owner = 7;
	struct closer *cl;
	int listener, peer, lingering, p[2];
	void *m;

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	lingering = lingering_socket(&listener, &peer);
	closer_close(cl, owner, lingering);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	closer_unmap_close(cl, owner, NULL, 0, p[1]);
	assert_true(eof_within(p[0], 10000));
	close(p[0]);
	m = map_anon(4096);
	assert_true(m != MAP_FAILED);
	closer_unmap_close(cl, owner, m, 4096, -1);
	closer_then(cl, &owner, 1, count_call, &calls);
	assert_true(calls_within(&calls, 1, 10000));
	assert_true(unmapped(m));
	assert_int_equal(closer_pending(cl, owner), 1);
	close(peer);
	assert_true(all_drained_within(cl, 10000));
	close(listener);

	/* The daemon's own close held at the gate: the owner's goes by. */
	m = map_anon(4096);
	assert_true(m != MAP_FAILED);
	gate_shut_at(m);
	closer_unmap_close(cl, owner, m, 4096, -1);
	assert_true(gate_reached_within(10000));
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	closer_close(cl, owner, p[1]);
	assert_true(eof_within(p[0], 10000));
	close(p[0]);
	assert_true(drained_within(cl, owner, 10000));
	usleep(300 * 1000);
	assert_int_equal(closer_stuck(cl, owner, 200), 0);
	assert_int_equal(closer_total(cl), 1);
	closer_then(cl, &owner, 1, count_call, &calls);
	usleep(20000);
	assert_int_equal(atomic_load(&calls), 1);
	gate_open();
	assert_true(calls_within(&calls, 2, 10000));
	assert_true(all_drained_within(cl, 10000));
	closer_stop(cl, 1000);
}

/* A lane's thread waits a moment (LANE_IDLE_MS) for more before it ends:
 * closes handed over one at a time, each let go before the next comes (an
 * unload each: test_control's full status page, 8,190 of them), take far
 * fewer threads than closes. Before, each took a thread of its own: the
 * lane went once its queue was empty. */
static void
test_a_lanes_thread_waits_a_moment_for_more(void **state)
{
	enum { ROUNDS = 200 };
	long by[ROUNDS] = { 0 };
	size_t threads = 0;
	struct closer *cl;

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	for (int i = 0; i < ROUNDS; i++) {
		void *m = map_anon(4096);
		size_t k;
		long tid;

		assert_true(m != MAP_FAILED);
		closer_unmap_close(cl, CLOSER_LOCAL, m, 4096, -1);
		assert_true(all_drained_within(cl, 10000));
		assert_true(unmapped(m));
		tid = atomic_load(&unmapped_by);
		for (k = 0; k < threads && by[k] != tid; k++)
			;
		if (k == threads)
			by[threads++] = tid;
	}
	print_message("%d closes, one at a time: %zu threads\n", ROUNDS, threads);
	assert_true(threads < ROUNDS / 2);
	closer_stop(cl, 10000);
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

/* closer_then() calls back once every lane it names is through what was
 * queued in it before, not before: lane 1 held at the gate, lane 2 with a
 * mapping, lane 3 with nothing; closer_forget() keeps a call that was to
 * come from running; with a NULL closer or no lane to wait for, at once. */
static void
test_then_waits_for_every_lane_it_names(void **state)
{
	static atomic_int calls;
	const uid_t owners[3] = { 1, 2, 3 };
	struct closer *cl;
	void *a, *b;

	(void)state;
	assert_int_equal(closer_start(&cl), 0);
	a = map_anon(4096);
	b = map_anon(4096);
	assert_true(a != MAP_FAILED && b != MAP_FAILED);
	gate_shut_at(a);
	closer_unmap_close(cl, 1, a, 4096, -1);
	closer_unmap_close(cl, 2, b, 4096, -1);
	closer_then(cl, owners, 3, count_call, &calls);
	assert_true(gate_reached_within(5000));
	/* Lane 2 through, lane 1's unmap the one left; then a while. */
	for (int i = 0; i < 1000 && closer_total(cl) > 1; i++)
		usleep(1000);
	assert_int_equal(closer_total(cl), 1);
	usleep(20000);
	assert_int_equal(atomic_load(&calls), 0);
	gate_open();
	assert_true(calls_within(&calls, 1, 5000));
	assert_true(all_drained_within(cl, 1000));

	/* Forgotten: never called. */
	a = map_anon(4096);
	assert_true(a != MAP_FAILED);
	gate_shut_at(a);
	closer_unmap_close(cl, 1, a, 4096, -1);
	closer_then(cl, owners, 1, count_call, &calls);
	assert_true(gate_reached_within(5000));
	closer_forget(cl, &calls);
	gate_open();
	assert_true(all_drained_within(cl, 1000));
	closer_stop(cl, 1000); /* every lane's thread has ended */
	assert_int_equal(atomic_load(&calls), 1);

	/* Nothing to wait for. */
	assert_int_equal(closer_start(&cl), 0);
	closer_then(cl, owners, 3, count_call, &calls);
	assert_int_equal(atomic_load(&calls), 2);
	closer_stop(cl, 1000);
	closer_then(NULL, owners, 3, count_call, &calls);
	assert_int_equal(atomic_load(&calls), 3);
}

/* ---- with the registry ---- */

static const struct registry_peer root_peer = { .pid = 1, .uid = 0, .gid = 0 };

static bool
served(struct du *t, void *arg)
{
	struct model_entry *m = registry_find(&t->reg, arg);

	return m != NULL && m->current != NULL && m->loading == 0;
}

/* A registry t with the closer cl, serving "a" at generation 2 while its
 * generation 1 stays attached (*att); the files' paths in paths[2]. */
static struct du *
registry_with_retired(struct closer **cl, struct registry_attachment *att, char **paths)
{
	struct du *t = du_new(false);
	char *next, msg[64];

	assert_int_equal(closer_start(cl), 0);
	t->reg.closer = *cl;
	paths[0] = du_model(t, "a.safetensors", 1024);
	paths[1] = du_model(t, "m.safetensors", 1024);
	next = du_model(t, "next.safetensors", 2048);
	assert_int_equal(du_load(t, "a", paths[0], PIN_NONE, 0), 0);
	assert_int_equal(registry_attach(&t->reg, "a", &root_peer, att, msg, sizeof(msg)), 0);
	assert_int_equal(rename(next, paths[0]), 0);
	assert_int_equal(du_reload(t, "a"), 0);
	assert_int_equal(du_current(t, "a")->number, 2);
	free(next);
	return t;
}

/*
 * Review rev180 F1: a load refused for descriptors (room_wait) ran again
 * the moment a generation was handed to the closer, before its lane had
 * closed one of its descriptors; with a slow unmap or close (a large
 * model, NFS, FUSE) the retry was refused again and waited for yet
 * another generation to close. The filler stays; the lane is held at the
 * unmap of generation 1's index (its first close): nothing retries m
 * until the lane is through, and then m loads.
 */
static void
test_a_load_refused_for_descriptors_waits_for_the_closer(void **state)
{
	struct registry_attachment att;
	struct model_entry *m;
	struct closer *cl;
	char *paths[2];
	struct du *t = registry_with_retired(&cl, &att, paths);
	int fill[400], n;

	(void)state;
	t->reg.fd_limit = 400;
	du_fill_below(fill, &n, 333);
	assert_int_equal(du_load(t, "m", paths[1], PIN_NONE, 0), -EMFILE);
	m = registry_find(&t->reg, "m");
	assert_true(m->room_wait);
	assert_int_equal(m->load_errors, 1);

	gate_shut_at(att.gen->index);
	registry_release(&t->reg, att.gen, 0);
	assert_true(gate_reached_within(5000));
	assert_int_equal(m->loading, 0);
	for (int i = 0; i < 20; i++) {
		uv_run(&t->loop, UV_RUN_NOWAIT);
		usleep(5000);
	}
	assert_int_equal(m->loading, 0);
	assert_int_equal(m->load_errors, 1);
	assert_true(m->room_wait);

	gate_open();
	du_run_until(t, served, "m");
	assert_int_equal(du_current(t, "m")->number, 1);
	assert_null(m->error);
	assert_int_equal(m->load_errors, 1);
	while (n > 0)
		close(fill[--n]);
	du_teardown(t);
	free(t);
	closer_stop(cl, 1000);
	free(paths[0]);
	free(paths[1]);
}

/* A generation still closing in its lane when the registry closes: the
 * lane's end calls nothing back (the registry's loop is closed by then; a
 * call would wake it through a closed handle). */
static void
test_nothing_calls_back_after_the_registry_closes(void **state)
{
	struct registry_attachment att;
	struct closer *cl;
	char *paths[2];
	struct du *t = registry_with_retired(&cl, &att, paths);

	(void)state;
	gate_shut_at(att.gen->index);
	registry_release(&t->reg, att.gen, 0);
	assert_true(gate_reached_within(5000));
	du_teardown(t);
	gate_open();
	closer_stop(cl, 1000);
	free(t);
	free(paths[0]);
	free(paths[1]);
}

/* ---- a close while the retry runs (review rev182 F2) ---- */
static atomic_int realpath_hold;
static sem_t realpath_in, realpath_go;
static const char *hold_path;
static pthread_t main_thread;

/* A load's real paths of its path (mountrule.h): the realpath_hold-th for
 * hold_path off the main thread waits at realpath_go; the second of a load
 * (gen_resolved_path's, after the load's own walk's) comes after its files
 * are opened. */
static void
realpath_gate(const char *path)
{
	if (atomic_load(&realpath_hold) > 0 && hold_path != NULL &&
		strcmp(path, hold_path) == 0 && !pthread_equal(pthread_self(), main_thread) &&
		atomic_fetch_sub(&realpath_hold, 1) == 1) {
		sem_post(&realpath_in);
		sem_wait(&realpath_go);
	}
}

char *
__wrap_mountrule_realpath(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	realpath_gate(path);
	return __real_mountrule_realpath(w, path, why, len);
}

char *
__wrap_mountrule_fd_realpath(struct mountrule_walk *w, int fd, const char *path, char *why,
	size_t len)
{
	realpath_gate(path);
	return __real_mountrule_fd_realpath(w, fd, path, why, len);
}

/* A load refused for descriptors, retried as generation 1's descriptors
 * are closed, opens its files before generation 2's are closed and is
 * refused again: generation 2's close, which came while the retry ran,
 * runs it once more, and m loads (before the fix: m waited for yet
 * another close). */
static void
test_a_close_while_the_retry_runs_retries_again(void **state)
{
	struct registry_attachment att1, att2;
	struct model_entry *m;
	struct closer *cl;
	char *paths[2], *next2, msg[64];
	struct du *t = registry_with_retired(&cl, &att1, paths);
	int fill[400], n, fill2[400], n2;
	struct timespec ts;

	(void)state;
	assert_int_equal(sem_init(&realpath_in, 0, 0), 0);
	assert_int_equal(sem_init(&realpath_go, 0, 0), 0);
	/* generation 2 attached too, generation 3 current */
	assert_int_equal(registry_attach(&t->reg, "a", &root_peer, &att2, msg, sizeof(msg)), 0);
	assert_int_equal(att2.gen->number, 2);
	next2 = du_model(t, "next2.safetensors", 4096);
	assert_int_equal(rename(next2, paths[0]), 0);
	assert_int_equal(du_reload(t, "a"), 0);
	assert_int_equal(du_current(t, "a")->number, 3);

	t->reg.fd_limit = 400;
	du_fill_below(fill, &n, 333);
	assert_int_equal(du_load(t, "m", paths[1], PIN_NONE, 0), -EMFILE);
	m = registry_find(&t->reg, "m");
	assert_true(m->room_wait);

	/* generations 1 and 2 to the lane, held at generation 2's index */
	gate_shut_at(att2.gen->index);
	registry_release(&t->reg, att1.gen, 0);
	registry_release(&t->reg, att2.gen, 0);
	assert_true(gate_reached_within(5000));
	/* what generation 1 freed taken again: the retry is refused */
	du_fill_below(fill2, &n2, 333);
	main_thread = pthread_self();
	hold_path = paths[1];
	atomic_store(&realpath_hold, 2);
	for (int i = 0; i < 200 && m->loading == 0; i++) {
		uv_run(&t->loop, UV_RUN_NOWAIT);
		usleep(2000);
	}
	assert_int_equal(m->loading, 1); /* generation 1's wake-up: m's retry */
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	assert_int_equal(sem_timedwait(&realpath_in, &ts), 0); /* its files opened */
	/* room now, then generation 2's descriptors are closed */
	while (n2 > 0)
		close(fill2[--n2]);
	while (n > 0)
		close(fill[--n]);
	gate_open();
	assert_true(all_drained_within(cl, 2000));
	for (int i = 0; i < 20; i++) {
		uv_run(&t->loop, UV_RUN_NOWAIT);
		usleep(5000);
	}
	sem_post(&realpath_go);
	for (int i = 0; i < 400 && m->current == NULL; i++) {
		uv_run(&t->loop, UV_RUN_NOWAIT);
		usleep(5000);
	}
	assert_int_equal(m->load_errors, 2); /* the retry was refused */
	assert_non_null(m->current);         /* and ran again */
	assert_false(m->room_wait);
	du_teardown(t);
	free(t);
	closer_stop(cl, 1000);
	hold_path = NULL;
	sem_destroy(&realpath_in);
	sem_destroy(&realpath_go);
	free(paths[0]);
	free(paths[1]);
	free(next2);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_descriptor_is_closed),
		cmocka_unit_test(test_a_lingering_close_holds_its_own_lane_only),
		cmocka_unit_test(test_a_mapping_goes_in_the_daemons_own_lane_in_order),
		cmocka_unit_test(test_the_owners_hanging_close_holds_up_none_of_the_daemons_own),
		cmocka_unit_test(test_a_lanes_thread_waits_a_moment_for_more),
		cmocka_unit_test(test_null_closer_closes_at_once),
		cmocka_unit_test(test_then_waits_for_every_lane_it_names),
		cmocka_unit_test(test_a_load_refused_for_descriptors_waits_for_the_closer),
		cmocka_unit_test(test_nothing_calls_back_after_the_registry_closes),
		cmocka_unit_test(test_a_close_while_the_retry_runs_retries_again),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
