/*
 * test_attach.c: the client library's attach path (client/lib/attach.c and
 * the attached half of client/lib/model.c) against a fake wcached, when the
 * daemon answers as it should: a good ATTACH_OK reads, its descriptors are
 * closed and its release names the handle; the index and the status page
 * are shared between attaches and kept while the generation is current;
 * wc_model_stale() follows the status page; CHANGED announcements are
 * skipped before a reply and counted by wc_client_dispatch(); a model
 * outlives its client, and releasing models on one thread while another
 * disconnects their client is safe; a forked child reads its copy but
 * cannot use its parent's client; bad arguments fail before anything is
 * sent; a model from wc_attach_fds() keeps its files' descriptors until
 * its release (in a forked child too); the deadline of a daemon that
 * never answers (wc_set_timeout(), WCACHE_TIMEOUT).
 *
 * Hostile replies are tested elsewhere: what comes with ATTACH_OK
 * (descriptors, indexes, status pages, mmap failures) in
 * test_attach_reply.c, replies that are wrong, refusals and restarts in
 * test_attach_connection.c. The fixture the three share (the fake daemon's
 * script, the descriptor and mapping checks) is attach_fixture.h; this test
 * needs no fault injection.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "attach_fixture.h"
#include "fakedaemon.h"
#include "testutil.h"
#include "lib/wcache.h"
#include "proto/wire.h"

/* ---- helpers ------------------------------------------------------------ */

/* The permissions ("r--s", "r--p", ...) of the first mapping that
 * mentions needle. */
static void
assert_map_perms(const char *needle, const char *perms)
{
	FILE *fp = fopen("/proc/self/maps", "re");
	char line[4096];
	const char *p = NULL;

	assert_non_null(fp);
	while (p == NULL && fgets(line, sizeof(line), fp) != NULL)
		if (strstr(line, needle) != NULL)
			p = strchr(line, ' ');
	fclose(fp);
	assert_non_null(p);
	assert_memory_equal(p + 1, perms, 4);
}

/* ---- good replies ------------------------------------------------------- */

/* The reply wcached sends: the model reads, every received descriptor is
 * closed, the release names the handle, and nothing is left mapped. */
static void
test_good_reply(void **state)
{
	struct fixture *f = *state;
	wc_model *second = NULL;
	int before = attach_ok(f);

	check_tensors(f->model);
	assert_int_equal(wc_model_generation(f->model), GENERATION);
	assert_int_equal(wc_model_stale(f->model), 0);
	assert_maps(f, 1, 2, 2);
	/* Read-only; the index shared, the files private (wc_model_cow()). */
	assert_map_perms("memfd:wctest-index", "r--s");
	assert_map_perms(f->file_path[1], "r--p");
	/* A model's files have paths: it keeps no descriptor of them. */
	assert_int_equal(wc_model_fd(f->model, 0), -ENOENT);
	assert_int_equal(wc_model_fd(f->model, 1), -ENOENT);
	assert_int_equal(wc_model_fd(f->model, 2), -ERANGE);
	/* Its files' names, as the index gives them. */
	assert_int_equal(wc_model_file_count(f->model), 2);
	assert_string_equal(wc_model_file_name(f->model, 0), "a.bin");
	assert_string_equal(wc_model_file_name(f->model, 1), "b.bin");
	assert_null(wc_model_file_name(f->model, 2));
	assert_int_equal(wc_model_file_count(NULL), 0);
	assert_null(wc_model_file_name(NULL, 0));

	/* A second attach on the same connection is a second model, which
	 * shares the client's one mapping of the status page and, the same
	 * generation, of the index. */
	assert_int_equal(wc_attach(f->client, MODEL, &second), 0);
	assert_true(second != f->model);
	assert_maps(f, 1, 4, 2);
	assert_int_equal(wc_model_stale(second), 0);
	wc_release(f->model);
	f->model = NULL;
	check_tensors(second);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(second), 1);
	wc_release(second);
	/* The client keeps its page for the next attach, and the index only
	 * while it is current: the page says generation 8 now. */
	assert_maps(f, 0, 0, 2);
	finish(f, before);
	assert_string_equal(f->fake.name, MODEL);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.releases, 2);
	assert_int_equal(f->fake.released_handle, HANDLE);
	assert_int_equal(f->fake.released_seq, 0); /* no reply wanted */
}

/* Between attaches the client keeps the index of a current generation
 * (mapped once, however many attaches), and lets it go with the last model
 * once the status page says the generation is old. */
static void
test_index_kept_while_current(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f);

	wc_release(f->model);
	f->model = NULL;
	assert_maps(f, 1, 0, 2);
	assert_int_equal(wc_attach(f->client, MODEL, &f->model), 0);
	check_tensors(f->model);
	assert_maps(f, 1, 2, 2);
	set_slot(f, SLOT, GENERATION + 1);
	wc_release(f->model);
	f->model = NULL;
	assert_maps(f, 0, 0, 2);
	/* The next attach maps it afresh. */
	set_slot(f, SLOT, GENERATION);
	assert_int_equal(wc_attach(f->client, MODEL, &f->model), 0);
	check_tensors(f->model);
	assert_maps(f, 1, 2, 2);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	assert_int_equal(f->fake.attaches, 3);
	assert_int_equal(f->fake.releases, 3);
}

/* Without WIRE_ATTACH_STATUS there is no page: never stale. */
static void
test_good_reply_without_status(void **state)
{
	struct fixture *f = *state;
	int before;

	f->fake.ok.flags = 0;
	f->fake.nfds = 3;
	before = attach_ok(f);
	check_tensors(f->model);
	assert_maps(f, 1, 2, 1);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 0);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	assert_int_equal(f->fake.releases, 1);
}

/* wc_model_stale() follows what the daemon writes into its page. */
static void
test_stale_follows_status_page(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f);

	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 1);
	set_slot(f, SLOT, GENERATION);
	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT + 1, GENERATION + 5); /* another model's slot */
	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT, 0); /* no longer served */
	assert_int_equal(wc_model_stale(f->model), 1);
	/* Stale models stay readable. */
	check_tensors(f->model);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

/* CHANGED messages (with descriptors, which must be closed) before the
 * reply are announcements, not the reply. */
static void
test_changed_before_reply_is_skipped(void **state)
{
	struct fixture *f = *state;
	int p[2], before;

	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	keep(f, p[0]);
	keep(f, p[1]);
	f->fake.changed_before = 3;
	f->fake.changed_fd = p[0];
	before = attach_ok(f); /* asserts the CHANGED descriptors were closed */
	check_tensors(f->model);
	assert_int_equal(wc_model_generation(f->model), GENERATION);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);

	/* A CHANGED carries seq 0: one with the request's seq is malformed,
	 * not mistaken for the reply. */
	f->fake.changed_echo = 1;
	f->fake.changed_before = 1;
	attach_fails_out_of_step(f, -EBADMSG, "sent a malformed reply");
}

/* wc_client_fd() becomes readable with announcements, and
 * wc_client_dispatch() counts the CHANGED among them without blocking. */
static void
test_dispatch_counts_changed(void **state)
{
	struct fixture *f = *state;
	struct pollfd pfd;
	uint8_t buf[WIRE_MAX_MESSAGE], big[WIRE_MAX_MESSAGE + 100];
	static const char garbage[] = "this is not a wcache message";
	int many[KERNEL_SCM_MAX_FD];
	ssize_t n;
	int p[2], conn, before;

	/* -EINVAL with a message, as every int call (was -1, read as -EPERM,
	 * with the thread's last message; rev141 #3). */
	assert_error(wc_client_fd(NULL), -EINVAL, "wc_client_fd: no client");
	assert_int_equal(wc_client_dispatch(NULL), -EINVAL);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	keep(f, p[0]);
	keep(f, p[1]);
	before = attach_ok(f);
	pfd = (struct pollfd){ .fd = wc_client_fd(f->client), .events = POLLIN };
	assert_true(pfd.fd >= 0);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	assert_int_equal(wc_client_dispatch(f->client), 0);

	/* Sent on the fake's connection from this thread: a send on a Unix
	 * socket has queued the message when it returns. */
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_true(conn >= 0);
	n = wire_put_changed(buf, sizeof(buf), GENERATION + 1, MODEL, strlen(MODEL));
	assert_true(n > 0);
	assert_int_equal(fake_raw_send(conn, buf, (size_t)n, NULL, 0), n);
	assert_int_equal(fake_raw_send(conn, garbage, sizeof(garbage), NULL, 0), sizeof(garbage));
	assert_int_equal(fake_raw_send(conn, buf, (size_t)n, &p[0], 1), n);
	assert_int_equal(fake_raw_send(conn, buf, (size_t)n, NULL, 0), n);
	assert_int_equal(poll(&pfd, 1, 0), 1);
	assert_true(pfd.revents & POLLIN);
	assert_int_equal(wc_client_dispatch(f->client), 3);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	assert_int_equal(wc_client_dispatch(f->client), 0);
	assert_int_equal(tu_count_fds(), before + 2); /* the pipe end that came was closed */

	/* The model still works, and so does the connection. */
	check_tensors(f->model);
	wc_release(f->model);
	f->model = NULL;

	/* A message longer than any, or with more descriptors than any: an
	 * error, with every descriptor closed. */
	memset(big, 0, sizeof(big));
	assert_int_equal(fake_raw_send(conn, big, sizeof(big), &p[0], 1), sizeof(big));
	assert_error(wc_client_dispatch(f->client), -EMSGSIZE, "receive: ");
	for (size_t i = 0; i < KERNEL_SCM_MAX_FD; i++)
		many[i] = p[0];
	assert_int_equal(fake_raw_send(conn, buf, (size_t)n, many, KERNEL_SCM_MAX_FD), n);
	assert_error(wc_client_dispatch(f->client), -EBADMSG, "receive: ");
	assert_int_equal(tu_count_fds(), before + 2);

	/* The daemon goes away: dispatch connects again (nobody accepts
	 * here, the connection waits in the backlog), and the descriptor to
	 * poll is a new one. */
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
	fake_finish(f);
	assert_int_equal(f->fake.releases, 1);
	conn = wc_client_fd(f->client);
	assert_int_equal(wc_client_dispatch(f->client), 0);
	assert_int_not_equal(wc_client_fd(f->client), conn);
	assert_int_equal(poll(&pfd, 1, 0), 1); /* the old one is closed: POLLNVAL */
	assert_true(pfd.revents & POLLNVAL);
	finish(f, before);
}

/* A model outlives its client (and the daemon's connection). */
static void
test_model_valid_after_disconnect(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f);

	wc_disconnect(f->client);
	f->client = NULL;
	fake_finish(f);
	check_tensors(f->model);
	assert_int_equal(wc_model_generation(f->model), GENERATION);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 1);
	assert_int_equal(tu_count_fds(), before);
	wc_release(f->model); /* nothing to tell: the client is gone */
	f->model = NULL;
	assert_int_equal(f->fake.releases, 0);
	finish(f, before);
}

/* The race of wc_release() against wc_disconnect(): rounds of it, each
 * with RACE_MODELS models released on a second thread. */
#define RACE_ROUNDS 400
#define RACE_MODELS 4

struct race {
	int arrived; /* at the start line (atomic) */
	wc_model *models[RACE_MODELS];
};

/* The start line of both threads: each waits there, spinning, until the
 * other has come. Not pthread_barrier_wait(): the thread that comes last
 * would run on while the other is still waking up from its futex, and the
 * disconnect would be over before the first release began. */
static void
race_start(struct race *r)
{
	__atomic_add_fetch(&r->arrived, 1, __ATOMIC_ACQ_REL);
	while (__atomic_load_n(&r->arrived, __ATOMIC_ACQUIRE) < 2)
		sched_yield(); /* a spin, unless the other thread needs this CPU */
}

/* The second thread: waits for the main one at the start line, then
 * releases every model, yielding between them so that the disconnect
 * falls among them, not only before the first or after the last. */
static void *
race_release(void *arg)
{
	struct race *r = arg;

	race_start(r);
	for (size_t i = 0; i < RACE_MODELS; i++) {
		wc_release(r->models[i]);
		sched_yield();
	}
	return NULL;
}

/* wc_release() of attached models on one thread and wc_disconnect() of
 * their client on another, started together (race_start()), many times.
 * A release used to reach its client (its lock, its list, its connection)
 * after the disconnect had detached the models and freed it: the sanitizers
 * report that (a use after free, or a store through the record's cleared
 * list pointer) and an unsanitized build crashes. Each round leaves nothing
 * behind: every descriptor closed, nothing of the models mapped, the
 * client's index and status page unmapped. A release that wins the race
 * tells the daemon (over the one connection, with its handle); one that
 * loses it sends nothing (the daemon releases everything when the
 * connection closes): the fake counts anywhere from none to all of them. */
static void
test_release_races_disconnect(void **state)
{
	struct fixture *f = *state;
	struct race r;
	pthread_t thread;
	int before = tu_count_fds(), released = 0, all = 0, none = 0;
	double t0 = tu_now();

	for (int round = 0; round < RACE_ROUNDS; round++) {
		fake_start(f);
		assert_int_equal(wc_connect(f->sock, &f->client), 0);
		for (size_t i = 0; i < RACE_MODELS; i++)
			if (wc_attach(f->client, MODEL, &r.models[i]) != 0) {
				while (i > 0)
					wc_release(r.models[--i]);
				fail_msg("round %d: attach failed: %s", round, wc_errmsg());
			}
		assert_maps(f, 1, 2 * RACE_MODELS, 2);
		r.arrived = 0;
		assert_int_equal(pthread_create(&thread, NULL, race_release, &r), 0);
		race_start(&r);
		wc_disconnect(f->client);
		f->client = NULL;
		assert_int_equal(pthread_join(thread, NULL), 0);
		/* The fake sees the connection end once the last user of the
		 * client, whichever thread, has let it go. */
		fake_finish(f);
		assert_int_equal(tu_count_fds(), before);
		assert_maps(f, 0, 0, 1);
		assert_int_equal(f->fake.attaches, RACE_MODELS);
		assert_in_range(f->fake.releases, 0, RACE_MODELS);
		if (f->fake.releases > 0) {
			assert_int_equal(f->fake.released_handle, HANDLE);
			assert_int_equal(f->fake.released_seq, 0);
		}
		released += f->fake.releases;
		all += f->fake.releases == RACE_MODELS;
		none += f->fake.releases == 0;
	}
	print_message("%d rounds in %.2f s: %d releases sent; all %d sent in %d rounds, "
		"none in %d\n", RACE_ROUNDS, tu_now() - t0, released, RACE_MODELS, all, none);
}

/* ---- releases while another thread's request waits ---------------------- */

/* How long a release or a dispatch may take while another thread's
 * request waits at the fake's gate: they wait for nobody's reply. */
#define NO_WAIT_S 2

struct waiter {
	struct fixture *f;
	wc_model *model;  /* attached by attach_at_gate() */
	int result;
	wc_model *release; /* released by release_and_dispatch() */
	int dispatched;
	double took;
	sem_t done;
};

/* An attach on its own thread, whose reply the fake holds at the gate. */
static void *
attach_at_gate(void *arg)
{
	struct waiter *w = arg;

	w->result = wc_attach(w->f->client, MODEL, &w->model);
	return NULL;
}

/* A release, then a dispatch, on their own thread: posts done when both
 * have returned, with the time they took. */
static void *
release_and_dispatch(void *arg)
{
	struct waiter *w = arg;
	double t0 = tu_now();

	wc_release(w->release);
	w->dispatched = wc_client_dispatch(w->f->client);
	w->took = tu_now() - t0;
	sem_post(&w->done);
	return NULL;
}

/*
 * Starts an attach that the fake holds at its gate (another thread's
 * request, waiting as a DERIVE waits for another worker's build), then
 * releases model and dispatches on a third thread, and waits NO_WAIT_S
 * for them. Returns whether they were done by then, the gate still shut;
 * then opens the gate and joins both threads (w->model is the attach's).
 */
static int
release_while_request_waits(struct fixture *f, struct waiter *w, wc_model *model,
	void (*while_waiting)(struct fixture *f))
{
	sem_t gate, at_gate;
	pthread_t attacher, releaser;
	struct timespec ts;
	int done;

	assert_int_equal(sem_init(&gate, 0, 0), 0);
	assert_int_equal(sem_init(&at_gate, 0, 0), 0);
	assert_int_equal(sem_init(&w->done, 0, 0), 0);
	w->f = f;
	w->release = model;
	f->fake.at_gate = &at_gate;
	f->fake.gate = &gate;
	assert_int_equal(pthread_create(&attacher, NULL, attach_at_gate, w), 0);
	assert_int_equal(fake_sem_wait(&at_gate), 0);
	assert_int_equal(pthread_create(&releaser, NULL, release_and_dispatch, w), 0);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += NO_WAIT_S;
	while ((done = sem_timedwait(&w->done, &ts)) == -1 && errno == EINTR)
		;
	if (done == 0 && while_waiting != NULL)
		while_waiting(f);
	assert_int_equal(sem_post(&gate), 0);
	assert_int_equal(pthread_join(attacher, NULL), 0);
	assert_int_equal(pthread_join(releaser, NULL), 0);
	f->fake.gate = NULL;
	sem_destroy(&gate);
	sem_destroy(&at_gate);
	sem_destroy(&w->done);
	return done == 0;
}

/* While the attach waits: the released model is unmapped already; the
 * client keeps the index (current) and its status page. */
static void
released_model_unmapped(struct fixture *f)
{
	assert_maps(f, 1, 0, 2);
}

/*
 * wc_release() and wc_client_dispatch() while another thread's request on
 * the same client waits for its reply: both return at once (the header
 * promises a release one send and no wait; dispatch reads nothing a
 * request is waiting for), the model unmapped, and the RELEASE reaches the
 * daemon once the request is done (the daemon reads no request of the
 * connection before it has answered the one in progress anyway). Before,
 * both waited for the client's lock, which the request held for its whole
 * round trip: a wc_derive waiting for another worker's build stalled the
 * release for as long as the build took.
 */
static void
test_release_while_request_waits(void **state)
{
	struct fixture *f = *state;
	struct waiter w = { 0 };
	int before = attach_ok(f), done;

	done = release_while_request_waits(f, &w, f->model, released_model_unmapped);
	f->model = w.model;
	if (!done)
		fail_msg("wc_release and wc_client_dispatch took %.2f s, the whole wait of "
			"the other thread's attach", w.took);
	print_message("release and dispatch took %.6f s\n", w.took);
	assert_int_equal(w.result, 0);
	assert_int_equal(w.dispatched, 0);
	check_tensors(f->model);
	release_and_finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.releases, 2);
	assert_int_equal(f->fake.released_handle, HANDLE);
	assert_int_equal(f->fake.released_seq, 0);
}

/*
 * A release while another thread's request finds the connection dead,
 * reconnects and sends its HOLDs: the release is neither lost nor sent on
 * the wrong connection. The daemon closes the connection on the second
 * attach; the client connects again, and the reply to the attach sent
 * again waits at the gate while the first model is released. When the new
 * daemon took that model's generation over (HOLD_OK, handle 99), its
 * RELEASE names 99 on the new connection; when it refused the HOLD, the
 * release sends nothing (the old daemon released it when the connection
 * closed, and its handle means nothing to the new one).
 */
static void
release_during_reconnect(struct fixture *f, int64_t hold_handle, int releases)
{
	struct waiter w = { 0 };
	int before, done;

	f->fake.connections = 2;
	f->fake.first_close_at = 2;
	f->fake.hold_handle = hold_handle;
	before = attach_ok(f);
	done = release_while_request_waits(f, &w, f->model, NULL);
	f->model = NULL;
	assert_int_equal(w.result, 0);
	/* Disconnected with the second model attached: its release is the
	 * connection's end, not a RELEASE. */
	wc_disconnect(f->client);
	f->client = NULL;
	check_tensors(w.model);
	wc_release(w.model);
	finish(f, before);
	if (!done)
		fail_msg("wc_release took %.2f s, the whole wait of the other thread's attach",
			w.took);
	assert_int_equal(f->fake.accepted, 2);
	assert_int_equal(f->fake.holds, 1);
	assert_int_equal(f->fake.held_generation, GENERATION);
	assert_int_equal(f->fake.releases, releases);
	if (releases > 0) {
		assert_int_equal(f->fake.released_handle, (uint64_t)hold_handle);
		assert_int_equal(f->fake.released_seq, 0);
	}
}

static void
test_release_during_reconnect_held(void **state)
{
	release_during_reconnect(*state, 99, 1);
}

static void
test_release_during_reconnect_not_held(void **state)
{
	release_during_reconnect(*state, 0, 0);
}

/* A forked child cannot use its parent's client (-ECHILD, nothing sent) but
 * can read and release its copy of the model without telling the daemon. */
static void
test_attach_in_forked_child(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f);
	pid_t pid;

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		wc_model *m = NULL;
		wc_tensor t;
		int code = 0;

		alarm(20);
		if (wc_attach(f->client, MODEL, &m) != -ECHILD)
			code = 1;
		else if (strstr(wc_errmsg(), "call wc_connect() again after fork()") == NULL)
			code = 2;
		else if (m != NULL)
			code = 3;
		else if (wc_model_find(f->model, "beta", &t) != 0 ||
			((const uint8_t *)t.data)[0] != b_byte(64))
			code = 4;
		wc_release(f->model); /* unmaps; must not send RELEASE */
		_exit(code);
	}
	af_child_ok(pid);
	check_tensors(f->model);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
	assert_int_equal(f->fake.releases, 1); /* the parent's only */
}

/* A child that closed its inherited descriptors (closefrom()) and got the
 * parent's connection's number for a socket of its own keeps that socket
 * when it lets the parent's client and model go; a child that did not
 * closes its copy of the connection. */
static void
test_child_after_closefrom_keeps_its_socket(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f);

	af_child_closes_from(f, 1);
	af_child_closes_from(f, 0);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 1); /* the parent's only */
}

/* Bad arguments fail before anything is sent; bad socket paths name the
 * path. */
static void
test_bad_arguments(void **state)
{
	struct fixture *f = *state;
	char name[WIRE_MAX_NAME + 2], path[200];
	wc_client *c = NULL;
	wc_model *m = NULL;
	int before = tu_count_fds();

	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_error(wc_attach(NULL, MODEL, &m), -EINVAL, "wc_attach");
	assert_error(wc_attach(f->client, NULL, &m), -EINVAL, "wc_attach");
	assert_error(wc_attach(f->client, MODEL, NULL), -EINVAL, "wc_attach");
	assert_error(wc_attach(f->client, "", &m), -EINVAL, "name must be 1 to 1024 bytes");
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	assert_error(wc_attach(f->client, name, &m), -EINVAL, "name must be 1 to 1024 bytes");
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 0);

	assert_error(wc_connect(f->sock, NULL), -EINVAL, "no output");
	snprintf(path, sizeof(path), "%s/none.sock", f->dir);
	assert_error(wc_connect(path, &c), -ENOENT, "wcached is not running at");
	assert_non_null(strstr(wc_errmsg(), path));
	memset(path, 'p', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';
	assert_error(wc_connect(path, &c), -ENAMETOOLONG, "socket path longer than");
	assert_null(c);
	assert_int_equal(tu_count_fds(), before);
}

/* ---- deadlines ---------------------------------------------------------- */

/* A daemon that never answers: the attach fails at the client's deadline
 * with -ETIMEDOUT, naming the socket and the time waited, and closes the
 * connection; nothing is left behind. */
static void
test_attach_times_out(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_model *m = NULL;
	double t0, waited;

	f->fake.mode = FAKE_SILENT;
	fake_start(f);
	assert_int_equal(wc_connect_timeout(f->sock, 150, &f->client), 0);
	t0 = tu_now();
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, f->sock);
	waited = tu_now() - t0;
	assert_null(m);
	assert_true(strstr(wc_errmsg(), "did not answer within 0.15 s") != NULL);
	assert_true(strstr(wc_errmsg(), "WCACHE_TIMEOUT") != NULL);
	assert_true(waited >= 0.14);
	assert_true(waited < DEADLINE_MS / 1000.0);
	/* The connection is closed: the next attach connects again, which
	 * nobody accepts here, and times out too; the old connection never
	 * sees it. */
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "did not answer");
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
}

/* wc_set_timeout() changes the deadline of a connected client; WCACHE_TIMEOUT
 * sets the default; a bad value is an error that names the variable. */
static void
test_timeout_settings(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_client *c = NULL;
	wc_model *m = NULL;

	f->fake.mode = FAKE_SILENT;
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_int_equal(wc_set_timeout(f->client, 100), 0);
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "within 0.1 s");
	finish(f, before);

	assert_error(wc_set_timeout(NULL, 100), -EINVAL, "no client");
	setenv("WCACHE_TIMEOUT", "soon", 1);
	assert_error(wc_connect(f->sock, &c), -EINVAL, "WCACHE_TIMEOUT=soon");
	assert_null(c);
	setenv("WCACHE_TIMEOUT", "-1", 1);
	assert_error(wc_connect_timeout(f->sock, -1, &c), -EINVAL, "not a number of seconds");
	setenv("WCACHE_TIMEOUT", "nan", 1);
	assert_error(wc_connect(f->sock, &c), -EINVAL, "WCACHE_TIMEOUT=nan");
	/* An explicit timeout does not read the variable. */
	f->fake.mode = FAKE_SILENT;
	fake_start(f);
	assert_int_equal(wc_connect_timeout(f->sock, 100, &f->client), 0);
	assert_error(wc_set_timeout(f->client, -1), -EINVAL, "WCACHE_TIMEOUT=nan");
	setenv("WCACHE_TIMEOUT", "0.12", 1);
	assert_int_equal(wc_set_timeout(f->client, -1), 0);
	assert_error(wc_attach(f->client, MODEL, &m), -ETIMEDOUT, "within 0.12 s");
	unsetenv("WCACHE_TIMEOUT");
	finish(f, before);
	assert_int_equal(tu_count_fds(), before);
}

/* ---- wc_attach_fds ------------------------------------------------------ */

/* A model from wc_attach_fds() keeps the descriptor wcached passed of each
 * of its files, lent by wc_model_fd() (the same one each call), -ERANGE
 * past the last file; wc_release() closes them all, and the model reads
 * and releases as wc_attach()'s. */
static void
test_attach_fds_keeps_descriptors(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), fd0, fd1;

	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_error(wc_attach_fds(NULL, MODEL, &f->model), -EINVAL, "wc_attach_fds: no client");
	if (wc_attach_fds(f->client, MODEL, &f->model) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	/* The client's socket, the fake's end of it, and the two files. */
	assert_int_equal(tu_count_fds(), before + 4);
	check_tensors(f->model);
	assert_maps(f, 1, 2, 2);
	assert_int_equal(wc_model_file_count(f->model), 2);
	assert_string_equal(wc_model_file_name(f->model, 0), "a.bin");
	assert_string_equal(wc_model_file_name(f->model, 1), "b.bin");
	assert_null(wc_model_file_name(f->model, 2));
	fd0 = wc_model_fd(f->model, 0);
	fd1 = wc_model_fd(f->model, 1);
	assert_true(tu_fd_is_readonly_of(fd0, f->file_fd[0]));
	assert_true(tu_fd_is_readonly_of(fd1, f->file_fd[1]));
	assert_true(fd0 != fd1);
	/* The ones received, not the daemon's own. */
	assert_true(fd0 != f->file_fd[0] && fd1 != f->file_fd[1]);
	assert_int_equal(wc_model_fd(f->model, 0), fd0);
	assert_int_equal(tu_count_fds(), before + 4);
	assert_error(wc_model_fd(f->model, 2), -ERANGE, "file 2 of 2");
	wc_release(f->model);
	f->model = NULL;
	assert_int_equal(tu_count_fds(), before + 2);
	assert_int_equal(fcntl(fd0, F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	assert_int_equal(fcntl(fd1, F_GETFD), -1);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, HANDLE);
}

/* A child of fork() inherits the descriptors with the model; its
 * wc_release() closes its copies only and tells the daemon nothing. */
static void
test_attach_fds_in_forked_child(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), fd0, fd1;
	pid_t pid;

	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &f->model), 0);
	fd0 = wc_model_fd(f->model, 0);
	fd1 = wc_model_fd(f->model, 1);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int code = 0;

		alarm(10);
		if (wc_model_fd(f->model, 0) != fd0 || wc_model_fd(f->model, 1) != fd1)
			code = 1;
		wc_release(f->model);
		if (code == 0 && (fcntl(fd0, F_GETFD) != -1 || fcntl(fd1, F_GETFD) != -1))
			code = 2;
		_exit(code);
	}
	af_child_ok(pid);
	assert_true(tu_fd_is_readonly_of(wc_model_fd(f->model, 0), f->file_fd[0]));
	assert_true(tu_fd_is_readonly_of(wc_model_fd(f->model, 1), f->file_fd[1]));
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 1);
}

/* Every attached model records each file's identity (the fstat of the
 * descriptor wcached passed), so a caller can tell a file at a path from it
 * without keeping a descriptor; wc_model_close_fd() drops a kept one
 * (the next wc_model_fd() says -ENOENT, wc_release() does not close it
 * again); and a kept descriptor the process closed behind the model's back
 * (closefrom()), whose number names another file by the release, is left
 * open (review rev172 F2, F4). */
static void
test_identity_and_close_fd(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f), fd0, fd1, other;
	wc_file_identity id;
	wc_model *fds = NULL;
	struct stat st;

	/* wc_attach() keeps no descriptor, and has the identities. */
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(wc_model_file_identity(f->model, i, &id), 0);
		assert_int_equal(fstat(f->file_fd[i], &st), 0);
		assert_true(id.dev == (uint64_t)st.st_dev && id.ino == (uint64_t)st.st_ino);
		assert_true(id.size == (uint64_t)st.st_size);
		assert_true(id.mtime_ns == (int64_t)st.st_mtim.tv_sec * 1000000000 +
			st.st_mtim.tv_nsec);
		assert_true(id.ctime_ns == (int64_t)st.st_ctim.tv_sec * 1000000000 +
			st.st_ctim.tv_nsec);
	}
	assert_error(wc_model_file_identity(f->model, 2, &id), -ERANGE, "file 2 of 2");
	assert_error(wc_model_file_identity(NULL, 0, &id), -EINVAL, "no model");
	assert_int_equal(wc_model_fd(f->model, 0), -ENOENT);
	assert_int_equal(wc_model_close_fd(f->model, 0), 0); /* none kept: nothing */

	assert_int_equal(wc_attach_fds(f->client, MODEL, &fds), 0);
	assert_int_equal(tu_count_fds(), before + 2 + 2);
	assert_int_equal(wc_model_file_identity(fds, 1, &id), 0);
	assert_int_equal(fstat(f->file_fd[1], &st), 0);
	assert_true(id.dev == (uint64_t)st.st_dev && id.ino == (uint64_t)st.st_ino);
	fd0 = wc_model_fd(fds, 0);
	fd1 = wc_model_fd(fds, 1);
	assert_int_equal(wc_model_close_fd(fds, 0), 0);
	assert_int_equal(fcntl(fd0, F_GETFD), -1);
	assert_int_equal(tu_count_fds(), before + 2 + 1);
	assert_error(wc_model_fd(fds, 0), -ENOENT, "no descriptor kept");
	assert_int_equal(wc_model_close_fd(fds, 0), 0);
	assert_error(wc_model_close_fd(fds, 2), -ERANGE, "file 2 of 2");
	assert_error(wc_model_close_fd(NULL, 0), -EINVAL, "no model");
	check_tensors(fds); /* the mappings stay */
	/* closefrom() behind the model's back, and the number reused:
	 * wc_model_close_fd() and the release leave the new file open. */
	other = open("/dev/null", O_RDONLY | O_CLOEXEC);
	assert_true(other >= 0);
	assert_int_equal(dup3(other, fd1, O_CLOEXEC), fd1); /* closes the model's */
	close(other);
	assert_int_equal(wc_model_close_fd(fds, 1), 0);
	assert_int_not_equal(fcntl(fd1, F_GETFD), -1);
	wc_release(fds);
	assert_int_not_equal(fcntl(fd1, F_GETFD), -1);
	close(fd1);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 2);
}

/* A re-attach after closefrom(): the kernel gives the new model's
 * descriptors of the same files (wcached passes the same open files) the
 * numbers the old model kept, and the old model's release leaves them to
 * the new one (review rev174 F2: a (dev, ino) guard cannot tell the two
 * apart). */
static void
test_reattach_after_closefrom_keeps_new_fds(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f), old[2], fresh[2];
	wc_model *m1 = NULL, *m2 = NULL;

	assert_int_equal(wc_attach_fds(f->client, MODEL, &m1), 0);
	for (size_t i = 0; i < 2; i++)
		old[i] = wc_model_fd(m1, i);
	close(old[0]); /* closefrom() behind the model's back */
	close(old[1]);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m2), 0);
	for (size_t i = 0; i < 2; i++) {
		fresh[i] = wc_model_fd(m2, i);
		assert_true(tu_fd_is_readonly_of(fresh[i], f->file_fd[i]));
	}
	/* the case: the same file on the same number */
	assert_true(fresh[0] == old[0] || fresh[1] == old[1]);
	wc_release(m1);
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(wc_model_fd(m2, i), fresh[i]);
		assert_int_not_equal(fcntl(fresh[i], F_GETFD), -1);
	}
	wc_release(m2);
	for (size_t i = 0; i < 2; i++)
		assert_int_equal(fcntl(fresh[i], F_GETFD), -1);
	release_and_finish(f, before);
	assert_int_equal(f->fake.releases, 3);
}

int
main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_good_reply),
		T(test_index_kept_while_current),
		T(test_attach_times_out),
		T(test_timeout_settings),
		T(test_good_reply_without_status),
		T(test_stale_follows_status_page),
		T(test_changed_before_reply_is_skipped),
		T(test_dispatch_counts_changed),
		T(test_model_valid_after_disconnect),
		T(test_release_races_disconnect),
		T(test_release_while_request_waits),
		T(test_release_during_reconnect_held),
		T(test_release_during_reconnect_not_held),
		T(test_attach_in_forked_child),
		T(test_bad_arguments),
		T(test_attach_fds_keeps_descriptors),
		T(test_attach_fds_in_forked_child),
		T(test_identity_and_close_fd),
		T(test_reattach_after_closefrom_keeps_new_fds),
		T(test_child_after_closefrom_keeps_its_socket),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}
