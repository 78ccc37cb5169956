/*
 * test_server.c: unit tests of daemon/server.c, the client socket, against
 * a real registry on a real libuv loop: a client socket in the test sends
 * ATTACH and RELEASE and reads the replies and their descriptors while the
 * loop runs. The replies' codes and texts are the ones the integration
 * tests and clients rely on.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "daemonutil.h"
#include "fcntl_fault.h"
#include "proto/fdpass.h"
#include "server.h"
#include "server_internal.h"
#include "testutil.h"
#include "proto/wire.h"

struct st {
	struct du du;
	struct server *srv;
	int client;
	char *sock;
};

static int
setup(void **state)
{
	struct st *t = calloc(1, sizeof(*t));
	struct server_options opt = { .max_attaches = 2 };
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd;

	du_setup(&t->du, false, 0);
	assert_true(asprintf(&t->sock, "%s/s", t->du.dir) > 0);
	fd = server_listen_path(t->sock, 0600);
	assert_true(fd >= 0);
	assert_int_equal(server_start(&t->du.loop, &t->du.reg, fd, &opt, &t->srv), 0);
	t->client = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(t->client >= 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", t->sock);
	assert_int_equal(connect(t->client, (struct sockaddr *)&a, sizeof(a)), 0);
	*state = t;
	return 0;
}

static int
teardown(void **state)
{
	struct st *t = *state;

	close(t->client);
	server_stop(t->srv);
	du_teardown(&t->du);
	free(t->sock);
	free(t);
	return 0;
}

static bool
readable(struct du *d, void *arg)
{
	struct pollfd p = { .fd = *(int *)arg, .events = POLLIN };

	(void)d;
	return poll(&p, 1, 0) == 1;
}

/* Sends msg and runs the loop until a reply is readable; reads it. */
static struct wire_message
exchange(struct st *t, const uint8_t *msg, size_t len, uint8_t *buf, int *fds, size_t *nfds)
{
	struct wire_message m;
	ssize_t n;

	assert_int_equal(send(t->client, msg, len, 0), (ssize_t)len);
	du_run_until(&t->du, readable, &t->client);
	n = fdp_recv(t->client, buf, WIRE_MAX_MESSAGE, fds, WIRE_MAX_FDS, nfds);
	assert_true(n > 0);
	assert_int_equal(wire_decode(buf, (size_t)n, &m), 0);
	return m;
}

static struct wire_message
send_attach(struct st *t, const char *name, uint8_t *buf, int *fds, size_t *nfds)
{
	uint8_t req[WIRE_MAX_MESSAGE];
	ssize_t n = wire_put_attach(req, sizeof(req), 7, name, strlen(name));

	assert_true(n > 0);
	return exchange(t, req, (size_t)n, buf, fds, nfds);
}

static void
assert_error(const struct wire_message *m, int code, const char *text)
{
	int32_t c;
	const char *p;
	size_t len;

	assert_int_equal(m->h.type, WIRE_ERROR);
	assert_int_equal(wire_get_error(m, &c, &p, &len), 0);
	assert_int_equal(c, code);
	if (len != strlen(text) || memcmp(p, text, len) != 0)
		fail_msg("error text \"%.*s\", expected \"%s\"", (int)len, p, text);
}

static void
test_attach_release(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 1024);
	uint8_t buf[WIRE_MAX_MESSAGE], req[64];
	struct wire_attach_ok ok;
	struct wire_message m;
	int fds[WIRE_MAX_FDS];
	size_t nfds;
	ssize_t n;

	assert_int_equal(du_load(&t->du, "m", path, PIN_NONE, 0), 0);
	m = send_attach(t, "m", buf, fds, &nfds);
	assert_int_equal(m.h.type, WIRE_ATTACH_OK);
	assert_int_equal(m.h.seq, 7);
	assert_int_equal(wire_get_attach_ok(&m, &ok), 0);
	assert_int_equal(ok.generation, 1);
	assert_int_equal(ok.file_count, 1);
	assert_int_equal(ok.flags, WIRE_ATTACH_STATUS);
	assert_int_equal(nfds, 3);
	fdp_close_all(fds, nfds);
	assert_int_equal(du_current(&t->du, "m")->attached, 1);
	n = wire_put_release(req, sizeof(req), 8, ok.handle);
	m = exchange(t, req, (size_t)n, buf, fds, &nfds);
	assert_int_equal(m.h.type, WIRE_RELEASE_OK);
	assert_int_equal(du_current(&t->du, "m")->attached, 0);
	/* An unknown handle. */
	m = exchange(t, req, (size_t)n, buf, fds, &nfds);
	assert_error(&m, EINVAL, "no attach with handle 1");
	free(path);
}

/* Sends ORIGINS of name from file first and reads the reply. */
static struct wire_message
send_origins(struct st *t, const char *name, uint32_t first, uint8_t *buf)
{
	uint8_t req[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds;
	struct wire_message m;
	ssize_t n = wire_put_origins(req, sizeof(req), 9, first, name, strlen(name));

	assert_true(n > 0);
	m = exchange(t, req, (size_t)n, buf, fds, &nfds);
	assert_int_equal(nfds, 0);
	return m;
}

/*
 * ORIGINS: a generation that serves its files where they are has none
 * (file_count 0); a staged one (its origin set here as a staging sets it)
 * gives each file's source fstat, from the first file asked; a first past
 * its files is refused (ERANGE), as is a model not served, and the
 * connection goes on. None of them leaves the generation attached, counts
 * as an attach or warms a cold generation. A
 * staged generation restored without its origins' ctimes gives none.
 */
static void
test_origins(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 1024);
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_origins_ok ok;
	struct wire_message m;
	struct generation *g;
	enum gen_state was;
	struct stat st;
	uint64_t seq;

	assert_int_equal(du_load(&t->du, "m", path, PIN_NONE, 0), 0);
	seq = t->du.reg.attach_seq;
	m = send_origins(t, "m", 0, buf);
	assert_int_equal(m.h.type, WIRE_ORIGINS_OK);
	assert_int_equal(m.h.seq, 9);
	assert_int_equal(wire_get_origins_ok(&m, &ok), 0);
	assert_true(ok.generation == 1 && ok.file_count == 0 && ok.n == 0);
	g = du_current(&t->du, "m");
	assert_int_equal(g->attached, 0);
	/* A query, not an attach: no count, no place in the budget's order,
	 * and a cold generation stays cold. */
	assert_int_equal(g->model->attach_count, 0);
	assert_true(g->model->last_attach <= seq && t->du.reg.attach_seq == seq);
	was = g->state;
	g->state = GEN_COLD;
	m = send_origins(t, "m", 0, buf);
	assert_int_equal(m.h.type, WIRE_ORIGINS_OK);
	assert_int_equal(g->state, GEN_COLD);
	assert_int_equal(g->model->attach_count, 0);
	g->state = was;

	assert_int_equal(stat(path, &st), 0);
	assert_non_null(g->origin = calloc(1, sizeof(*g->origin)));
	assert_non_null(g->origin[0].path = strdup(path));
	g->origin[0].st = st;
	g->norigin = 1;
	m = send_origins(t, "m", 0, buf);
	assert_int_equal(wire_get_origins_ok(&m, &ok), 0);
	assert_true(ok.generation == 1 && ok.file_count == 1 && ok.first == 0 && ok.n == 1);
	assert_true(ok.origins[0].dev == (uint64_t)st.st_dev &&
		ok.origins[0].ino == (uint64_t)st.st_ino &&
		ok.origins[0].size == (uint64_t)st.st_size &&
		ok.origins[0].mtime_ns == (int64_t)st.st_mtim.tv_sec * 1000000000 +
			st.st_mtim.tv_nsec &&
		ok.origins[0].ctime_ns == (int64_t)st.st_ctim.tv_sec * 1000000000 +
			st.st_ctim.tv_nsec);
	m = send_origins(t, "m", 1, buf);
	assert_error(&m, ERANGE, "file 1: generation 1 has 1 files");
	m = send_origins(t, "nope", 0, buf);
	assert_int_equal(m.h.type, WIRE_ERROR);
	assert_int_equal(g->attached, 0);
	g->origin[0].st.st_ctim = (struct timespec){ 0, 0 };
	m = send_origins(t, "m", 0, buf);
	assert_int_equal(wire_get_origins_ok(&m, &ok), 0);
	assert_true(ok.generation == 1 && ok.file_count == 0);
	free(path);
}

static void
test_attach_errors(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 1024), *missing;
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	int fds[WIRE_MAX_FDS];
	size_t nfds;

	m = send_attach(t, "nope", buf, fds, &nfds);
	assert_error(&m, ENOENT, "not served");
	assert_true(asprintf(&missing, "%s/none", t->du.dir) > 0);
	assert_true(du_load(&t->du, "bad", missing, PIN_NONE, 0) < 0);
	m = send_attach(t, "bad", buf, fds, &nfds);
	{
		int32_t c;
		const char *p;
		size_t len;

		assert_int_equal(m.h.type, WIRE_ERROR);
		assert_int_equal(wire_get_error(&m, &c, &p, &len), 0);
		assert_int_equal(c, EIO);
		assert_true(len > 16 && memcmp(p, "failed to load: ", 16) == 0);
	}
	free(missing);
	free(path);
}

static bool
released(struct du *d, void *arg)
{
	(void)arg;
	return du_current(d, "m")->attached == 0;
}

static void
test_attach_modified_and_limit(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 1024);
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	int fds[WIRE_MAX_FDS];
	size_t nfds;

	assert_int_equal(du_load(&t->du, "m", path, PIN_NONE, 0), 0);
	for (int i = 0; i < 2; i++) {
		m = send_attach(t, "m", buf, fds, &nfds);
		assert_int_equal(m.h.type, WIRE_ATTACH_OK);
		fdp_close_all(fds, nfds);
	}
	m = send_attach(t, "m", buf, fds, &nfds);
	assert_error(&m, EMFILE, "more than 2 attaches on one connection");
	/* Closing the connection releases what it held. */
	close(t->client);
	t->client = -1;
	du_run_until(&t->du, released, NULL);
	registry_mark_modified(&t->du.reg, du_current(&t->du, "m"), path);
	t->client = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	{
		struct sockaddr_un a = { .sun_family = AF_UNIX };

		snprintf(a.sun_path, sizeof(a.sun_path), "%s", t->sock);
		assert_int_equal(connect(t->client, (struct sockaddr *)&a, sizeof(a)), 0);
	}
	m = send_attach(t, "m", buf, fds, &nfds);
	assert_error(&m, ESTALE, "generation 1 was modified in place and is not served; "
				 "replace model files with rename(2), then reload");
	free(path);
}

static void
test_announce(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 1024);
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	int fds[WIRE_MAX_FDS];
	size_t nfds, len;
	uint64_t gen;
	const char *name;
	ssize_t n;

	assert_int_equal(du_load(&t->du, "m", path, PIN_NONE, 0), 0);
	m = send_attach(t, "m", buf, fds, &nfds);
	fdp_close_all(fds, nfds);
	server_announce(t->srv, registry_find(&t->du.reg, "m"), 5);
	n = fdp_recv(t->client, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds);
	assert_true(n > 0);
	assert_int_equal(wire_decode(buf, (size_t)n, &m), 0);
	assert_int_equal(wire_get_changed(&m, &gen, &name, &len), 0);
	assert_int_equal(gen, 5);
	assert_int_equal(len, 1);
	assert_int_equal(name[0], 'm');
	assert_int_equal(server_clients(t->srv), 1);
	free(path);
}

/* ---- descriptors in flight per uid ---- */

/* RLIMIT_NOFILE for the server of the in-flight test: its budget for one
 * uid is an eighth of it (128), 42 replies of 3 descriptors. */
#define LOW_NOFILE 1024
#define UID_CAP (LOW_NOFILE / 8)
#define CLIENTS 50

static struct rlimit saved_nofile;

static int
setup_low_nofile(void **state)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &saved_nofile) != 0)
		return -1;
	rl = saved_nofile;
	rl.rlim_cur = LOW_NOFILE;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		return -1;
	return setup(state);
}

static int
teardown_low_nofile(void **state)
{
	teardown(state);
	return setrlimit(RLIMIT_NOFILE, &saved_nofile);
}

struct inflight_want {
	unsigned fds, deferred, clients;
};

static bool
inflight_is(struct du *d, void *arg)
{
	const struct inflight_want *w = arg;
	struct server_stats s;
	struct st *t = (struct st *)d; /* du is the first member */

	server_get_stats(t->srv, &s);
	return s.fds_in_flight == w->fds && s.deferred_clients == w->deferred &&
		s.clients == w->clients;
}

static int
connect_client(struct st *t)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", t->sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* True once every client that connected (setup's and 40 more) is taken. */
static bool
all_accepted(struct du *d, void *arg)
{
	(void)d;
	return server_clients(((struct st *)arg)->srv) == 41;
}

/*
 * Connections of one uid that leave their replies unread share the uid's
 * budget of descriptors in flight: the replies that fit go, the others
 * wait; a connection that goes away gives its share back and a waiting
 * reply goes; once all have gone, nothing is counted for the uid any more.
 */
static void
test_inflight_per_uid(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 1024);
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	int clients[CLIENTS], fds[WIRE_MAX_FDS];
	unsigned fit = UID_CAP / 3, readable_now = 0;
	struct inflight_want want;
	struct wire_message m;
	size_t nfds, gone = CLIENTS;
	ssize_t n = wire_put_attach(req, sizeof(req), 7, "m", 1);

	assert_true(n > 0);
	assert_int_equal(du_load(&t->du, "m", path, PIN_NONE, 0), 0);
	for (size_t i = 0; i < CLIENTS; i++) {
		clients[i] = connect_client(t);
		assert_int_equal(send(clients[i], req, (size_t)n, 0), n);
	}
	want = (struct inflight_want){ 3 * fit, CLIENTS - fit, CLIENTS + 1 };
	du_run_until(&t->du, inflight_is, &want);
	for (size_t i = 0; i < CLIENTS; i++) {
		struct pollfd p = { .fd = clients[i], .events = POLLIN };

		if (poll(&p, 1, 0) == 1) {
			readable_now++;
			gone = i;
		}
	}
	assert_int_equal(readable_now, fit);

	/* One that was answered goes without reading: a waiting reply goes. */
	close(clients[gone]);
	clients[gone] = -1;
	want = (struct inflight_want){ 3 * fit, CLIENTS - fit - 1, CLIENTS };
	du_run_until(&t->du, inflight_is, &want);

	/* All go: nothing left in flight, and the uid starts afresh. */
	for (size_t i = 0; i < CLIENTS; i++)
		if (clients[i] >= 0)
			close(clients[i]);
	want = (struct inflight_want){ 0, 0, 1 };
	du_run_until(&t->du, inflight_is, &want);
	m = send_attach(t, "m", buf, fds, &nfds);
	assert_int_equal(m.h.type, WIRE_ATTACH_OK);
	assert_int_equal(nfds, 3);
	fdp_close_all(fds, nfds);
	want = (struct inflight_want){ 3, 0, 1 };
	assert_true(inflight_is(&t->du, &want));
	free(path);
}

/* F_GETFL of the client socket fails (found by a syscall fault sweep of
 * wcached): the start fails with that reason, and the socket keeps its
 * flags. Before, F_SETFL was given -1 | O_NONBLOCK, every flag: refused
 * with EINVAL, which the error named instead. */
static void
test_start_getfl_fails(void **state)
{
	struct du du;
	struct server *srv = NULL;
	char *sock;
	int fd, before;

	(void)state;
	if (!fcntl_fault_wrapped())
		skip(); /* built without -Wl,--wrap=fcntl */
	du_setup(&du, false, 0);
	assert_true(asprintf(&sock, "%s/s", du.dir) > 0);
	fd = server_listen_path(sock, 0600);
	assert_true(fd >= 0);
	before = fcntl(fd, F_GETFL);
	assert_true(before != -1);
	fcntl_fault = (struct fcntl_fault){ .cmd = F_GETFL, .err = ENOMEM };
	assert_int_equal(server_start(&du.loop, &du.reg, fd, NULL, &srv), -ENOMEM);
	assert_null(srv);
	assert_non_null(strstr(error_get(), strerror(ENOMEM)));
	assert_int_equal(fcntl(fd, F_GETFL), before);
	close(fd);
	du_teardown(&du);
	free(sock);
}

/* Every error of making the client socket names it as the client socket,
 * with its path; before, "PATH: reason" (and a failed socket(2) named no
 * path at all), where the control socket's said which socket it was. */
static void
test_listen_path_names_the_client_socket(void **state)
{
	struct du du;
	char *path, *want;

	(void)state;
	du_setup(&du, false, 0);
	assert_true(asprintf(&path, "%s/missing/w.sock", du.dir) > 0);
	assert_true(asprintf(&want, "client socket %s: No such file or directory", path) > 0);
	assert_int_equal(server_listen_path(path, 0600), -ENOENT);
	assert_string_equal(error_get(), want);
	du_teardown(&du);
	free(want);
	free(path);
}

int __real_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
	__attribute__((weak));
int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);

/* While accept_errno is set, accept4 fails with it; the calls, counted. */
static int accept_errno;
static unsigned accept_calls;

int
__wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	accept_calls++;
	if (accept_errno != 0) {
		errno = accept_errno;
		return -1;
	}
	return __real_accept4(fd, addr, len, flags);
}

/* True once the timer given as arg has fired. */
static bool
fired(struct du *d, void *arg)
{
	(void)d;
	return *(int *)((uv_timer_t *)arg)->data != 0;
}

static void
on_fired(uv_timer_t *timer)
{
	*(int *)timer->data = 1;
}

/* accept4 failing for a while with ENOMEM (found by a syscall fault sweep
 * of wcached): the waiting client is tried again every 100 ms, with one
 * warning, and attaches once accept4 works again. Before, the listening
 * socket stayed watched: accept4 was called on every turn of the loop, at
 * 100% CPU, with a line each time. */
static void
test_accept_enomem_pauses(void **state)
{
	struct st *t = *state;
	char *path = du_model(&t->du, "m.safetensors", 256);
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	struct server_stats stats;
	int fds[WIRE_MAX_FDS], done = 0;
	size_t nfds;
	uv_timer_t timer;
	char *log;

	if (__real_accept4 == NULL)
		skip(); /* built without -Wl,--wrap=accept4 */
	assert_int_equal(du_load(&t->du, "m", path, PIN_NONE, 0), 0);
	/* A new client waits in the backlog: 300 ms of failures. */
	accept_errno = ENOMEM;
	accept_calls = 0;
	close(t->client);
	t->client = connect_client(t);
	du_log_start(&t->du);
	uv_timer_init(&t->du.loop, &timer);
	timer.data = &done;
	uv_timer_start(&timer, on_fired, 300, 0);
	du_run_until(&t->du, fired, &timer);
	uv_close((uv_handle_t *)&timer, NULL);
	log = du_log_stop(&t->du);
	assert_true(accept_calls >= 1);
	assert_true(accept_calls <= 6);
	assert_non_null(strstr(log, "accept: Cannot allocate memory: clients wait in the "
				    "backlog; trying again every 100 ms"));
	assert_null(strstr(strstr(log, "accept: ") + 1, "accept: "));
	free(log);
	server_get_stats(t->srv, &stats);
	assert_true(stats.accept_pauses >= 1);
	/* accept4 works again: the client is taken and served. */
	accept_errno = 0;
	m = send_attach(t, "m", buf, fds, &nfds);
	assert_int_equal(m.h.type, WIRE_ATTACH_OK);
	fdp_close_all(fds, nfds);
	free(path);
}

int __real_uv_poll_init(uv_loop_t *loop, uv_poll_t *handle, int fd) __attribute__((weak));
int __wrap_uv_poll_init(uv_loop_t *loop, uv_poll_t *handle, int fd);

/* While poll_init_fails is set, uv_poll_init fails with UV_ENOMEM. */
static int poll_init_fails;

int
__wrap_uv_poll_init(uv_loop_t *loop, uv_poll_t *handle, int fd)
{
	if (poll_init_fails)
		return UV_ENOMEM;
	return __real_uv_poll_init(loop, handle, fd);
}

/* True once the server has as many clients as *arg says. */
static bool
clients_are(struct du *d, void *arg)
{
	struct st *t = (struct st *)((void **)arg)[0];

	(void)d;
	return server_clients(t->srv) == *(unsigned *)((void **)arg)[1];
}

/* Reads the refusal or notice an ERROR brought on fd: its text is want. */
static void
read_error_on(struct st *t, int fd, const char *want)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	int fds[WIRE_MAX_FDS];
	size_t nfds;
	ssize_t n;

	du_run_until(&t->du, readable, &fd);
	n = fdp_recv(fd, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds);
	assert_true(n > 0);
	assert_int_equal(nfds, 0);
	assert_int_equal(wire_decode(buf, (size_t)n, &m), 0);
	assert_error(&m, EUSERS, want);
}

/*
 * At max_clients, a newcomer that wcached then cannot watch (uv_poll_init
 * fails) is refused, and nobody's idle connection is closed for it (review
 * rev177, a nit of f2bfbdb): before, make_room closed the idle one first.
 * Once the newcomer can be watched, the idle one does make room for it.
 */
static void
test_unwatchable_newcomer_evicts_nobody(void **state)
{
	struct st *t = *state;
	struct server_stats stats;
	unsigned one = 1;
	void *want_one[2] = { t, &one };
	int b, c;

	if (__real_uv_poll_init == NULL)
		skip(); /* built without -Wl,--wrap=uv_poll_init */
	du_run_until(&t->du, clients_are, want_one);
	t->srv->max_clients = 1;
	t->srv->conns->active_ms = 0; /* idle long since: make_room's pick */
	poll_init_fails = 1;
	b = connect_client(t);
	read_error_on(t, b, "wcached cannot watch the connection");
	poll_init_fails = 0;
	uv_run(&t->du.loop, UV_RUN_NOWAIT);
	server_get_stats(t->srv, &stats);
	assert_int_equal(stats.idle_closed, 0);
	assert_int_equal(server_clients(t->srv), 1);
	assert_false(readable(&t->du, &t->client));
	close(b);
	/* Watched, the newcomer has the idle one closed for it. */
	c = connect_client(t);
	read_error_on(t, t->client, "closed: wcached has max_clients connected and this "
		"connection was idle with nothing attached");
	server_get_stats(t->srv, &stats);
	assert_int_equal(stats.idle_closed, 1);
	du_run_until(&t->du, clients_are, want_one);
	close(c);
}

/*
 * A connect flood does not hold the loop: one wakeup of the listener
 * accepts at most 16 connections and returns to the loop, which comes back
 * for the rest. Before, on_accept() took every connection waiting, until
 * the backlog was empty: one process looping on connect() and close() kept
 * it from ever emptying, and no other client was served (a release took
 * 3.7 s while such a flood ran).
 */
static void
test_accepts_per_wakeup(void **state)
{
	struct st *t = *state;
	int clients[40];

	/* 40 more wait in the backlog, besides setup's. */
	for (size_t i = 0; i < 40; i++)
		clients[i] = connect_client(t);
	assert_int_equal(server_clients(t->srv), 0);
	uv_run(&t->du.loop, UV_RUN_NOWAIT);
	assert_int_equal(server_clients(t->srv), 16);
	uv_run(&t->du.loop, UV_RUN_NOWAIT);
	assert_int_equal(server_clients(t->srv), 32);
	du_run_until(&t->du, all_accepted, t);
	assert_int_equal(server_clients(t->srv), 41);
	for (size_t i = 0; i < 40; i++)
		close(clients[i]);
}

/* True once the server has no connection left (no_clients), or one. */
static bool
no_clients(struct du *d, void *arg)
{
	(void)d;
	return server_clients(arg) == 0;
}

static bool
one_client(struct du *d, void *arg)
{
	(void)d;
	return server_clients(arg) == 1;
}

/*
 * A client that shuts down its writing side after 30 pipelined requests
 * gets all 30 replies, then the end of the stream (PROTOCOL.md,
 * Transport). Before, the hang-up closed the connection after one round of
 * reads (16): 16 replies, then ECONNRESET for the requests left unread.
 */
static void
test_half_close_answers_every_request(void **state)
{
	struct st *t = *state;
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	int fds[WIRE_MAX_FDS];
	size_t nfds;
	ssize_t n;

	du_run_until(&t->du, one_client, t->srv);
	for (uint32_t seq = 1; seq <= 30; seq++) {
		n = wire_put_release(req, sizeof(req), seq, 777);
		assert_true(n > 0);
		assert_int_equal(send(t->client, req, (size_t)n, 0), n);
	}
	assert_int_equal(shutdown(t->client, SHUT_WR), 0);
	du_run_until(&t->du, no_clients, t->srv);
	for (uint32_t seq = 1; seq <= 30; seq++) {
		n = fdp_recv(t->client, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds);
		if (n <= 0)
			fail_msg("reply %u of 30: %zd (%s)", seq, n,
				n < 0 ? strerror((int)-n) : "end");
		assert_int_equal(wire_decode(buf, (size_t)n, &m), 0);
		assert_int_equal(m.h.seq, seq);
		assert_error(&m, EINVAL, "no attach with handle 777");
	}
	assert_int_equal(fdp_recv(t->client, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds), 0);
}

/* Sends raw bytes on a new connection; returns the ERROR it gets back. */
static struct wire_message
malformed(struct st *t, const uint8_t *msg, size_t len, uint8_t *buf)
{
	int fds[WIRE_MAX_FDS];
	size_t nfds;
	int old = t->client;
	struct wire_message m;

	t->client = connect_client(t);
	m = exchange(t, msg, len, buf, fds, &nfds);
	assert_int_equal(nfds, 0);
	close(t->client);
	t->client = old;
	return m;
}

/*
 * An ERROR about a malformed request carries the request's seq when its
 * header could be read, and says which check failed (PROTOCOL.md,
 * Malformed messages). Before, every one had seq 0 and said "malformed
 * message" or "protocol version mismatch".
 */
static void
test_malformed_says_why(void **state)
{
	struct st *t = *state;
	uint8_t req[64], buf[WIRE_MAX_MESSAGE];
	struct wire_message m;
	ssize_t n;

	n = wire_put_release(req, sizeof(req), 42, 5);
	assert_true(n > 0);
	req[4] = 2; /* version 2 */
	m = malformed(t, req, (size_t)n, buf);
	assert_int_equal(m.h.seq, 42);
	assert_error(&m, EPROTO, "protocol version mismatch: client speaks 2, daemon speaks 1");
	req[4] = 1;
	m = malformed(t, req, (size_t)n - 1, buf);
	assert_int_equal(m.h.seq, 42);
	assert_error(&m, EBADMSG, "malformed RELEASE: the length field is not the size of the "
		"payload (8; the payload has 7 bytes)");
	n = wire_put_attach(req, sizeof(req), 43, "a-b", 3);
	assert_true(n > 0);
	req[17] = 0;
	m = malformed(t, req, (size_t)n, buf);
	assert_int_equal(m.h.seq, 43);
	assert_error(&m, EBADMSG, "malformed ATTACH: model name holds a NUL byte");
	req[6] = 77; /* type 77 */
	m = malformed(t, req, (size_t)n, buf);
	assert_int_equal(m.h.seq, 43);
	assert_error(&m, EBADMSG, "malformed message: unknown message type 77");
	memset(req, 'x', 20);
	m = malformed(t, req, 20, buf);
	assert_int_equal(m.h.seq, 0);
	assert_error(&m, EBADMSG, "malformed message: not a wcache message (wrong magic)");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_attach_release, setup, teardown),
		cmocka_unit_test_setup_teardown(test_attach_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_attach_modified_and_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_announce, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inflight_per_uid, setup_low_nofile,
			teardown_low_nofile),
		cmocka_unit_test(test_start_getfl_fails),
		cmocka_unit_test_setup_teardown(test_accept_enomem_pauses, setup, teardown),
		cmocka_unit_test_setup_teardown(test_accepts_per_wakeup, setup, teardown),
		cmocka_unit_test_setup_teardown(test_origins, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unwatchable_newcomer_evicts_nobody, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_half_close_answers_every_request, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_malformed_says_why, setup, teardown),
		cmocka_unit_test(test_listen_path_names_the_client_socket),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
