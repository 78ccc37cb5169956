/*
 * attach_fixture.c: the fixture of the unit tests of libwcache's attach
 * path (see attach_fixture.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "attach_fixture.h"
#include "fakedaemon.h"
#include "format/index.h"
#include "proto/memfds.h"
#include "testutil.h"
#include "lib/wcache.h"
#include "proto/wire.h"

struct af_fault fault;

/* The bytes of a.bin and b.bin, so that a test can tell which file and
 * which offset a tensor's data came from. */
uint8_t
a_byte(size_t i)
{
	return (uint8_t)(i * 7 + 1);
}

uint8_t
b_byte(size_t i)
{
	return (uint8_t)(255 - i);
}

/* Keeps fd for teardown to close; returns it. */
int
keep(struct fixture *f, int fd)
{
	assert_true(fd >= 0);
	assert_true(f->nextra < sizeof(f->extra) / sizeof(f->extra[0]));
	f->extra[f->nextra++] = fd;
	return fd;
}

/* A memfd called name holding data, with seals added (none if 0; without
 * MFD_ALLOW_SEALING when seals is -1). */
int
memfd_make(const char *name, const void *data, size_t len, int seals)
{
	int fd = memfd_create(name, MFD_CLOEXEC | (seals >= 0 ? MFD_ALLOW_SEALING : 0));

	assert_true(fd >= 0);
	if (len > 0)
		assert_int_equal(pwrite(fd, data, len, 0), (ssize_t)len);
	if (seals > 0)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

/* The good index of a.bin and b.bin, built with the index builder. */
static void
build_index(struct fixture *f)
{
	static const uint64_t alpha[] = { 4, 4 }, beta[] = { 32 }, gamma[] = { 2, 8 };
	struct index_builder *b;
	uint32_t f0, f1;

	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, "a.bin", A_SIZE, &f0), 0);
	assert_int_equal(index_add_file(b, "b.bin", B_SIZE, &f1), 0);
	assert_int_equal(index_add_tensor(b, "gamma", 5, 10 /* I16 */, f0, gamma, 2, 128, 32), 0);
	assert_int_equal(index_add_tensor(b, "beta", 4, 4 /* U8 */, f1, beta, 1, 64, 32), 0);
	assert_int_equal(index_add_tensor(b, "alpha", 5, 0 /* F32 */, f0, alpha, 2, 0, 64), 0);
	assert_int_equal(index_add_meta(b, "format", 6, "pt", 2), 0);
	assert_int_equal(index_build(b, "test", &f->index, &f->index_len), 0);
	index_builder_free(b);
}

/* The script of a good reply: ATTACH_OK with the index, both files and the
 * status page. */
static void
fake_good(struct fixture *f)
{
	struct fake *k = &f->fake;

	k->mode = FAKE_SERVE;
	k->kind = REPLY_ATTACH_OK;
	k->ok = (struct wire_attach_ok){ .generation = GENERATION, .handle = HANDLE,
		.index_size = f->index_len, .file_count = 2, .flags = WIRE_ATTACH_STATUS,
		.status_slot = SLOT };
	k->fds[0] = f->index_fd;
	k->fds[1] = f->file_fd[0];
	k->fds[2] = f->file_fd[1];
	k->fds[3] = f->status_fd;
	k->nfds = 4;
	k->seq_delta = 0;
	k->changed_before = 0;
	k->changed_fd = -1;
	k->changed_echo = 0;
	k->connections = 1;
	k->first_close_at = 0;
}

/* A temporary directory with a.bin and b.bin, their read-only descriptors,
 * the good index in a sealed memfd, the status page (GENERATION in SLOT),
 * the listening socket, and the script of a good reply. */
int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	uint8_t a[A_SIZE], b[B_SIZE];

	assert_non_null(f);
	memset(&fault, 0, sizeof(fault));
	fault.client = pthread_self();
	assert_int_equal(sem_init(&fault.closed, 0, 0), 0);
	assert_int_equal(sem_init(&fault.read, 0, 0), 0);
	assert_int_equal(sem_init(&fault.go, 0, 0), 0);

	f->dir = tu_tmpdir();
	assert_true(asprintf(&f->sock, "%s/wc.sock", f->dir) > 0);
	for (size_t i = 0; i < A_SIZE; i++)
		a[i] = a_byte(i);
	for (size_t i = 0; i < B_SIZE; i++)
		b[i] = b_byte(i);
	f->file_path[0] = tu_write(f->dir, "a.bin", a, sizeof(a));
	f->file_path[1] = tu_write(f->dir, "b.bin", b, sizeof(b));
	for (int i = 0; i < 2; i++)
		assert_true((f->file_fd[i] = open(f->file_path[i], O_RDONLY | O_CLOEXEC)) >= 0);

	build_index(f);
	f->index_fd = memfd_make("wctest-index", f->index, f->index_len, INDEX_SEALS);

	/* The daemon's status page: mapped writable before the seals, as
	 * wcached does; the fake writes new generations through it. */
	f->status_fd = fake_status_page(PAGE_SIZE_BYTES, SLOT, GENERATION, &f->status);
	assert_true(f->status_fd >= 0);
	f->fake.listen_fd = fake_listen(f->sock);
	assert_true(f->fake.listen_fd >= 0);
	f->fake.conn = -1;
	fake_good(f);
	*state = f;
	return 0;
}

/* Undoes setup() and whatever a failed test left behind. */
int
teardown(void **state)
{
	struct fixture *f = *state;

	/* After a failed assertion: disconnect first, so that the fake sees
	 * the end of the stream and a release sends nothing. */
	wc_disconnect(f->client);
	wc_release(f->model);
	fake_join(&f->fake);
	for (size_t i = 0; i < f->nextra; i++)
		close(f->extra[i]);
	close(f->fake.listen_fd);
	close(f->file_fd[0]);
	close(f->file_fd[1]);
	close(f->index_fd);
	close(f->status_fd);
	munmap(f->status, PAGE_SIZE_BYTES);
	free(f->index);
	free(f->file_path[0]);
	free(f->file_path[1]);
	free(f->sock);
	tu_rmtree(f->dir);
	sem_destroy(&fault.closed);
	sem_destroy(&fault.read);
	sem_destroy(&fault.go);
	memset(&fault, 0, sizeof(fault));
	free(f);
	return 0;
}

/* Starts the fake daemon with the current script and fresh results. */
void
fake_start(struct fixture *f)
{
	struct fake *k = &f->fake;

	assert_false(k->started);
	k->attaches = k->releases = 0;
	k->accepted = 0;
	k->released_handle = 0;
	k->released_seq = UINT32_MAX;
	k->name[0] = k->failure[0] = '\0';
	k->model = MODEL;
	k->changed_generation = GENERATION + 2;
	k->closed = &fault.closed;
	k->read = &fault.read;
	assert_int_equal(pthread_create(&k->thread, NULL, fake_main, k), 0);
	k->started = 1;
}

/* Joins the fake daemon and asserts that it saw nothing wrong. */
void
fake_finish(struct fixture *f)
{
	fake_join(&f->fake);
	if (f->fake.failure[0] != '\0')
		fail_msg("fake daemon: %s", f->fake.failure);
}

/* Sets the descriptors the fake sends with its reply. */
void
fake_fds(struct fixture *f, size_t n, ...)
{
	va_list ap;

	assert_true(n <= KERNEL_SCM_MAX_FD);
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		f->fake.fds[i] = va_arg(ap, int);
	va_end(ap);
	f->fake.nfds = n;
}

/* Counts the lines of /proc/self/maps that mention needle. */
static int
count_maps(const char *needle)
{
	FILE *fp = fopen("/proc/self/maps", "re");
	char line[4096];
	int n = 0;

	assert_non_null(fp);
	while (fgets(line, sizeof(line), fp) != NULL)
		if (strstr(line, needle) != NULL)
			n++;
	fclose(fp);
	return n;
}

/* Asserts how many mappings of the index memfds, of the model files and of
 * the status page (the fake's own included) this process holds, and that
 * no bad status page is mapped. */
void
assert_maps(struct fixture *f, int index, int files, int status)
{
	assert_int_equal(count_maps("memfd:wctest-index"), index);
	assert_int_equal(count_maps(f->dir), files);
	assert_int_equal(count_maps("memfd:wctest-status"), status);
	assert_int_equal(count_maps("memfd:wctest-badpage"), 0);
}

/* Asserts code r and a message holding want. */
void
assert_error(int r, int code, const char *want)
{
	const char *msg = wc_errmsg();

	if (r != code)
		fail_msg("returned %d (%s), expected %d (%s); message: %s", r, strerror(-r), code,
			strerror(-code), msg);
	if (strstr(msg, want) == NULL)
		fail_msg("message \"%s\" does not contain \"%s\"", msg, want);
}

/* Disconnects, joins the fake and asserts that the process holds the
 * descriptors it held before and no mapping of the model. */
void
finish(struct fixture *f, int fds_before)
{
	wc_disconnect(f->client);
	f->client = NULL;
	fake_finish(f);
	assert_int_equal(tu_count_fds(), fds_before);
	assert_maps(f, 0, 0, 1);
}

/* Checks the tensors of f->model, releases it and finish()es. */
void
release_and_finish(struct fixture *f, int fds_before)
{
	check_tensors(f->model);
	wc_release(f->model);
	f->model = NULL;
	finish(f, fds_before);
}

/* Connects to the fake running the current script and attaches MODEL,
 * expecting code and a message holding want, with nothing left behind. */
void
attach_fails(struct fixture *f, int code, const char *want)
{
	int before = tu_count_fds();
	wc_model *m = NULL;

	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_error(wc_attach(f->client, MODEL, &m), code, want);
	assert_null(m);
	finish(f, before);
}

/* As attach_fails(), for a reply that puts the client out of step with the
 * daemon: the client must close the connection, so that a second attach
 * reaches the daemon over a new connection (and fails the same way), never
 * over the old one. */
void
attach_fails_out_of_step(struct fixture *f, int code, const char *want)
{
	int before = tu_count_fds();
	wc_model *m = NULL;

	f->fake.connections = 2;
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_error(wc_attach(f->client, MODEL, &m), code, want);
	assert_error(wc_attach(f->client, MODEL, &m), code, f->sock);
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.accepted, 2);
	f->fake.connections = 1;
}

/* Connects and attaches MODEL, which must succeed; the model is in
 * f->model and the client connected. The received descriptors must be
 * closed: the process holds the client's socket and the fake's connection
 * more than before. Returns the descriptor count from before. */
int
attach_ok(struct fixture *f)
{
	int before = tu_count_fds();

	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	if (wc_attach(f->client, MODEL, &f->model) != 0)
		fail_msg("attach failed: %s", wc_errmsg());
	assert_int_equal(tu_count_fds(), before + 2);
	return before;
}

/* Checks every tensor of m against the files' bytes. */
void
check_tensors(const wc_model *m)
{
	wc_tensor t;
	const uint8_t *d;

	assert_int_equal(wc_model_count(m), 3);
	assert_int_equal(wc_model_find(m, "alpha", &t), 0);
	assert_string_equal(t.dtype, "F32");
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 4);
	assert_int_equal(t.shape[1], 4);
	assert_int_equal(t.nbytes, 64);
	d = t.data;
	for (size_t i = 0; i < 64; i++)
		assert_int_equal(d[i], a_byte(i));
	assert_int_equal(wc_model_find(m, "beta", &t), 0);
	assert_string_equal(t.dtype, "U8");
	d = t.data;
	for (size_t i = 0; i < 32; i++)
		assert_int_equal(d[i], b_byte(64 + i));
	assert_int_equal(wc_model_tensor(m, 2, &t), 0);
	assert_string_equal(t.name, "gamma");
	d = t.data;
	for (size_t i = 0; i < 32; i++)
		assert_int_equal(d[i], a_byte(128 + i));
	assert_string_equal(wc_model_metadata(m, "format"), "pt");
}

/* The slot the fake's page holds for MODEL. */
void
set_slot(struct fixture *f, uint64_t slot, uint64_t value)
{
	__atomic_store_n(&f->status[slot], value, __ATOMIC_RELEASE);
}

/* Skips the calling test when its binary was not linked with the --wrap
 * option it needs. */
void
af_need_wrap(int wrapped, const char *option)
{
	if (!wrapped) {
		print_message("built without %s\n", option);
		skip();
	}
}

void
af_child_ok(pid_t pid)
{
	int status;

	assert_true(pid >= 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

void
af_child_closes_from(struct fixture *f, int reuse)
{
	pid_t pid = fork();

	if (pid == 0) {
		int fd = wc_client_fd(f->client), sv[2], code = 0;

		alarm(20);
		if (reuse) {
			close(fd); /* closefrom() */
			if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == -1 ||
				(sv[0] != fd && dup2(sv[0], fd) == -1))
				_exit(1);
		}
		wc_release(f->model);
		wc_disconnect(f->client);
		if (reuse && fcntl(fd, F_GETFD) == -1)
			code = 2; /* the child's own socket closed */
		else if (!reuse && fcntl(fd, F_GETFD) != -1)
			code = 3; /* the inherited connection left open */
		_exit(code);
	}
	af_child_ok(pid);
}
