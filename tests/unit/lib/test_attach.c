/*
 * test_attach.c: the client library's attach path (client/lib/attach.c and the
 * attached half of client/lib/model.c) against a fake, hostile wcached.
 *
 * Each test listens on a SOCK_SEQPACKET socket in a temporary directory and
 * runs a fake daemon in a thread. It accepts one connection, reads ATTACH
 * and answers as the test scripted: a good ATTACH_OK with a real sealed
 * index memfd (built with client/format/index.h's builder) and real model files,
 * or descriptors of the wrong kind, size or number, damaged indexes, bad
 * status pages, wrong seqs, garbage, errors and refusals. The test checks
 * the exact code, a substring of wc_errmsg(), that the process holds as
 * many descriptors afterwards as before (tu_count_fds) and that no mapping
 * of the index, a model file or a bad status page is left behind
 * (/proc/self/maps), which is how a leak on an error path would show.
 *
 * The fake daemon lives in fakedaemon.c: it never uses cmocka's
 * assertions (they longjmp, which cannot cross threads), records a failure
 * that the test asserts empty after joining it, and every wait it does has
 * a deadline, so a broken client fails a test instead of hanging it.
 *
 * Fault injection uses the linker's --wrap (tests/CMakeLists.txt links this
 * test with -Wl,--wrap=mmap -Wl,--wrap=recvmsg and compiles it with
 * -U_FORTIFY_SOURCE). __wrap_mmap fails the Nth file-backed mmap() while a
 * test has armed it; __wrap_recvmsg lets a test order the client's next
 * receive against the fake daemon's close, which makes the refusal races
 * deterministic. The __real_ symbols are weak, so a build without those
 * options still links; the tests that need them then report SKIPPED.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fakedaemon.h"
#include "proto/fdpass.h"
#include "format/index.h"
#include "proto/memfds.h"
#include "testutil.h"
#include "lib/wcache.h"
#include "proto/wire.h"

#define MODEL "llama"
#define GENERATION 7u
#define HANDLE 42u
#define SLOT 3u
#define A_SIZE 256u /* a.bin: tensors alpha (F32 4x4 at 0) and gamma (I16 2x8 at 128) */
#define B_SIZE 96u  /* b.bin: tensor beta (U8 32 at 64) */
#define PAGE_SIZE_BYTES 4096u
#define PAGE_SEALS STATUS_PAGE_SEALS
#define DEADLINE_MS FAKE_DEADLINE_MS
#define KERNEL_SCM_MAX_FD FAKE_SCM_MAX_FD
#define REFUSAL "too many clients connected to wcached (max_clients)"

/* ---- fault injection ---------------------------------------------------- */

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((weak));
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
ssize_t __real_recvmsg(int fd, struct msghdr *msg, int flags) __attribute__((weak));
ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags);

static struct {
	int mmap_fail_at;    /* > 0: fail the Nth file-backed mmap() from now on */
	int mmap_calls;      /* file-backed mmap() calls while armed */
	int mmap_failed;     /* the number of the call that was failed, 0 if none */
	pthread_t client;    /* the thread whose recvmsg() the hooks below apply to */
	int recv_wait_close; /* before its next recvmsg(): wait until the fake closed */
	int recv_post_read;  /* after its next recvmsg(): post fault.read */
	sem_t closed;        /* posted by the fake daemon when it has closed */
	sem_t read;          /* posted by the client's hooked recvmsg() */
} fault;

/* mmap() as the library calls it: fails (ENOMEM) the armed call, counting
 * only file-backed calls so that anonymous mappings made by anything else
 * cannot shift the count. */
void *
__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (fault.mmap_fail_at > 0 && fd >= 0 && !(flags & MAP_ANONYMOUS) &&
		++fault.mmap_calls == fault.mmap_fail_at) {
		fault.mmap_failed = fault.mmap_calls;
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return __real_mmap(addr, len, prot, flags, fd, off);
}

/* recvmsg() with two one-shot hooks for the client's thread (the fake
 * daemon's thread is left alone): wait for the fake's close before
 * receiving, or tell the fake once something was received. */
ssize_t
__wrap_recvmsg(int fd, struct msghdr *msg, int flags)
{
	int mine = pthread_equal(pthread_self(), fault.client);
	ssize_t n;
	int e;

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
	errno = e;
	return n;
}

/* Whether the test was linked with the --wrap options. */
static int
have_wrap(void)
{
	return __real_mmap != NULL && __real_recvmsg != NULL;
}

#define NEED_WRAP()                                                                        \
	do {                                                                               \
		if (!have_wrap()) {                                                        \
			print_message("built without -Wl,--wrap=mmap,--wrap=recvmsg\n");    \
			skip();                                                            \
		}                                                                          \
	} while (0)

/* ---- fixture ------------------------------------------------------------ */

struct fixture {
	char *dir;
	char *sock;
	char *file_path[2]; /* dir/a.bin, dir/b.bin */
	int file_fd[2];     /* the daemon's O_RDONLY descriptors */
	uint8_t *index;     /* the good index */
	size_t index_len;
	int index_fd;       /* ... in a sealed memfd */
	int status_fd;      /* the daemon's status page, sealed */
	uint64_t *status;   /* the daemon's writable mapping of it */
	struct fake fake;
	wc_client *client;  /* cleaned up by teardown when a test failed early */
	wc_model *model;
	int extra[32];      /* descriptors a test made, closed by teardown */
	size_t nextra;
};

/* The bytes of a.bin and b.bin, so that a test can tell which file and
 * which offset a tensor's data came from. */
static uint8_t
a_byte(size_t i)
{
	return (uint8_t)(i * 7 + 1);
}

static uint8_t
b_byte(size_t i)
{
	return (uint8_t)(255 - i);
}

/* Keeps fd for teardown to close; returns it. */
static int
keep(struct fixture *f, int fd)
{
	assert_true(fd >= 0);
	assert_true(f->nextra < sizeof(f->extra) / sizeof(f->extra[0]));
	f->extra[f->nextra++] = fd;
	return fd;
}

/* A memfd called name holding data, with seals added (none if 0; without
 * MFD_ALLOW_SEALING when seals is -1). */
static int
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

/* The same, kept for teardown to close. */
static int
memfd_with(struct fixture *f, const char *name, const void *data, size_t len, int seals)
{
	return keep(f, memfd_make(name, data, len, seals));
}

/* A status page memfd of size bytes called "wctest-badpage" with magic in
 * slot 0 and value in slot (when they fit), then seals. */
static int
page_with(struct fixture *f, size_t size, uint64_t magic, uint64_t slot, uint64_t value,
	int seals)
{
	int fd = memfd_create("wctest-badpage", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (size >= 8)
		assert_int_equal(pwrite(fd, &magic, 8, 0), 8);
	if (slot < size / 8)
		assert_int_equal(pwrite(fd, &value, 8, (off_t)(slot * 8)), 8);
	if (seals > 0)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return keep(f, fd);
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
static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	uint8_t a[A_SIZE], b[B_SIZE];

	assert_non_null(f);
	memset(&fault, 0, sizeof(fault));
	fault.client = pthread_self();
	assert_int_equal(sem_init(&fault.closed, 0, 0), 0);
	assert_int_equal(sem_init(&fault.read, 0, 0), 0);

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
static int
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
	memset(&fault, 0, sizeof(fault));
	free(f);
	return 0;
}

/* ---- helpers ------------------------------------------------------------ */

/* Starts the fake daemon with the current script and fresh results. */
static void
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
static void
fake_finish(struct fixture *f)
{
	fake_join(&f->fake);
	if (f->fake.failure[0] != '\0')
		fail_msg("fake daemon: %s", f->fake.failure);
}

/* Sets the descriptors the fake sends with its reply. */
static void
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

/* Sets a raw reply. */
static void
fake_raw(struct fixture *f, const void *bytes, size_t len)
{
	assert_true(len <= sizeof(f->fake.raw));
	f->fake.kind = REPLY_RAW;
	memcpy(f->fake.raw, bytes, len);
	f->fake.raw_len = len;
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
static void
assert_maps(struct fixture *f, int index, int files, int status)
{
	assert_int_equal(count_maps("memfd:wctest-index"), index);
	assert_int_equal(count_maps(f->dir), files);
	assert_int_equal(count_maps("memfd:wctest-status"), status);
	assert_int_equal(count_maps("memfd:wctest-badpage"), 0);
}

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

/* Asserts code r and a message holding want. */
static void
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
static void
finish(struct fixture *f, int fds_before)
{
	wc_disconnect(f->client);
	f->client = NULL;
	fake_finish(f);
	assert_int_equal(tu_count_fds(), fds_before);
	assert_maps(f, 0, 0, 1);
}

/* Connects to the fake running the current script and attaches MODEL,
 * expecting code and a message holding want, with nothing left behind. */
static void
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
static void
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
static int
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
static void
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
static void
set_slot(struct fixture *f, uint64_t slot, uint64_t value)
{
	__atomic_store_n(&f->status[slot], value, __ATOMIC_RELEASE);
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

	assert_int_equal(wc_client_fd(NULL), -1);
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

/* A forked child cannot use its parent's client (-ECHILD, nothing sent) but
 * can read and release its copy of the model without telling the daemon. */
static void
test_attach_in_forked_child(void **state)
{
	struct fixture *f = *state;
	int before = attach_ok(f), status;
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
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	check_tensors(f->model);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	assert_int_equal(f->fake.attaches, 1);
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

/* ---- the index descriptor ----------------------------------------------- */

/* An index memfd that can still be written is refused, sealed against
 * resizing or not. */
static void
test_index_not_sealed(void **state)
{
	struct fixture *f = *state;

	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len,
		F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
	/* Sealed against writes, but seals could still be added. */
	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len,
		F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len, 0);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len, -1);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
}

/* A regular file holding a good index has no seals. */
static void
test_index_plain_file(void **state)
{
	struct fixture *f = *state;
	char *path = tu_write(f->dir, "index.bin", f->index, f->index_len);

	f->fake.fds[0] = keep(f, open(path, O_RDONLY | O_CLOEXEC));
	free(path);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
}

/* index_size in the reply must be the memfd's size. */
static void
test_index_size_mismatch(void **state)
{
	struct fixture *f = *state;
	char want[64];

	f->fake.ok.index_size = f->index_len + 8;
	snprintf(want, sizeof(want), "not a %zu-byte file", f->index_len + 8);
	attach_fails(f, -EBADMSG, want);
	f->fake.ok.index_size = f->index_len - 8;
	snprintf(want, sizeof(want), "not a %zu-byte file", f->index_len - 8);
	attach_fails(f, -EBADMSG, want);
	/* An empty sealed memfd and index_size 0: nothing to map, no index. */
	f->fake.ok.index_size = 0;
	f->fake.fds[0] = memfd_with(f, "wctest-index", NULL, 0, INDEX_SEALS);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
}

/* Makes a directory, a pipe and a socket descriptor for the fake to pass. */
static void
odd_fds(struct fixture *f, int out[3])
{
	int p[2], sv[2];

	out[0] = keep(f, open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	out[1] = keep(f, p[0]);
	keep(f, p[1]);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	out[2] = keep(f, sv[0]);
	keep(f, sv[1]);
}

/* A directory, a pipe or a socket in place of the index. */
static void
test_index_not_a_file(void **state)
{
	struct fixture *f = *state;
	int odd[3];
	char want[64];

	odd_fds(f, odd);
	snprintf(want, sizeof(want), MODEL ": received descriptor is not a %zu-byte file",
		f->index_len);
	for (int i = 0; i < 3; i++) {
		f->fake.fds[0] = odd[i];
		attach_fails(f, -EBADMSG, want);
	}
}

/* ---- the model file descriptors ----------------------------------------- */

static void patched_index(struct fixture *f, size_t off, uint64_t value);
static size_t file_record(const struct fixture *f, size_t i);

/* A directory, a pipe or a socket in place of a model file; for the second
 * file, the first one's mapping must be undone. */
static void
test_file_not_a_file(void **state)
{
	struct fixture *f = *state;
	int odd[3];

	odd_fds(f, odd);
	for (int i = 0; i < 3; i++) {
		f->fake.fds[2] = odd[i];
		attach_fails(f, -EBADMSG, "b.bin: received descriptor is not a 96-byte file");
	}
	f->fake.fds[2] = f->file_fd[1];
	f->fake.fds[1] = odd[1];
	attach_fails(f, -EBADMSG, "a.bin: received descriptor is not a 256-byte file");
}

/* A directory exactly as large as the index says b.bin is: its size
 * matches, its type does not. */
static void
test_file_is_directory_of_right_size(void **state)
{
	struct fixture *f = *state;
	struct stat st;
	char want[128];
	int odd[3];

	odd_fds(f, odd);
	assert_int_equal(fstat(odd[0], &st), 0);
	assert_true(st.st_size > 0);
	patched_index(f, file_record(f, 1) + 8, (uint64_t)st.st_size);
	f->fake.fds[2] = odd[0];
	snprintf(want, sizeof(want), MODEL ": b.bin: received descriptor is not a %llu-byte file",
		(unsigned long long)st.st_size);
	attach_fails(f, -EBADMSG, want);
}

/* wcached passes model files read-only: a writable descriptor of the right
 * file is not from wcached. */
static void
test_file_writable(void **state)
{
	struct fixture *f = *state;

	f->fake.fds[2] = keep(f, open(f->file_path[1], O_RDWR | O_CLOEXEC));
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received a writable descriptor");
	f->fake.fds[2] = keep(f, open(f->file_path[1], O_WRONLY | O_CLOEXEC));
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received a writable descriptor");
}

/* A model file whose size is not the one the index records. */
static void
test_file_size_mismatch(void **state)
{
	struct fixture *f = *state;
	uint8_t bytes[B_SIZE + 1];
	char *path;

	memset(bytes, 1, sizeof(bytes));
	path = tu_write(f->dir, "short.bin", bytes, B_SIZE - 1);
	f->fake.fds[2] = keep(f, open(path, O_RDONLY | O_CLOEXEC));
	free(path);
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received descriptor is not a 96-byte file");
	path = tu_write(f->dir, "long.bin", bytes, B_SIZE + 1);
	f->fake.fds[2] = keep(f, open(path, O_RDONLY | O_CLOEXEC));
	free(path);
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received descriptor is not a 96-byte file");
	/* The files swapped: a.bin's descriptor where b.bin's belongs. */
	fake_fds(f, 4, f->index_fd, f->file_fd[1], f->file_fd[0], f->status_fd);
	attach_fails(f, -EBADMSG, MODEL ": a.bin: received descriptor is not a 256-byte file");
}

/* ---- descriptor counts -------------------------------------------------- */

/* Fewer descriptors than 1 + file_count (+ 1 with the status flag). */
static void
test_too_few_descriptors(void **state)
{
	struct fixture *f = *state;

	fake_fds(f, 3, f->index_fd, f->file_fd[0], f->file_fd[1]);
	attach_fails(f, -EBADMSG, "wcached sent 3 descriptors for 2 files");
	f->fake.ok.flags = 0;
	fake_fds(f, 2, f->index_fd, f->file_fd[0]);
	attach_fails(f, -EBADMSG, "wcached sent 2 descriptors for 2 files");
	fake_fds(f, 0);
	attach_fails(f, -EBADMSG, "wcached sent 0 descriptors for 2 files");
}

/* More descriptors than that, up to more than the client takes at all. */
static void
test_too_many_descriptors(void **state)
{
	struct fixture *f = *state;

	fake_fds(f, 5, f->index_fd, f->file_fd[0], f->file_fd[1], f->status_fd, f->status_fd);
	attach_fails(f, -EBADMSG, "wcached sent 5 descriptors for 2 files");
	f->fake.ok.flags = 0;
	fake_fds(f, 4, f->index_fd, f->file_fd[0], f->file_fd[1], f->status_fd);
	attach_fails(f, -EBADMSG, "wcached sent 4 descriptors for 2 files");
	/* More than WIRE_MAX_FDS: fdp_recv() refuses them all. */
	for (size_t i = 0; i < KERNEL_SCM_MAX_FD; i++)
		f->fake.fds[i] = f->index_fd;
	f->fake.nfds = KERNEL_SCM_MAX_FD;
	attach_fails(f, -EBADMSG, "receive: ");
}

/* ---- damaged indexes ---------------------------------------------------- */

/* Index fields in the host's order (the tests run little-endian). */
static uint64_t
get64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

static void
put64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

/* A sealed index memfd of the good index with 8 bytes at off replaced,
 * which the fake passes instead of the good one. */
static void
patched_index(struct fixture *f, size_t off, uint64_t value)
{
	uint8_t *copy = malloc(f->index_len);

	assert_non_null(copy);
	memcpy(copy, f->index, f->index_len);
	put64(copy + off, value);
	f->fake.fds[0] = memfd_with(f, "wctest-index", copy, f->index_len, INDEX_SEALS);
	free(copy);
}

/* Offsets in the good index (index.h): header fields, tensor records in
 * name order (alpha, beta, gamma), file records. */
#define IX_TENSOR_OFFSET 16
#define IX_FILE_COUNT 24
#define IX_FILE_OFFSET 32

static size_t
tensor_record(const struct fixture *f, size_t i)
{
	return (size_t)get64(f->index + IX_TENSOR_OFFSET) + i * INDEX_RECORD_SIZE;
}

static size_t
file_record(const struct fixture *f, size_t i)
{
	return (size_t)get64(f->index + IX_FILE_OFFSET) + i * INDEX_FILE_SIZE;
}

static void
test_index_bad_magic(void **state)
{
	struct fixture *f = *state;

	patched_index(f, 0, get64(f->index) ^ 0xff);
	attach_fails(f, -EBADMSG, "model \"" MODEL "\": wcached sent a damaged index");
}

static void
test_index_version(void **state)
{
	struct fixture *f = *state;

	patched_index(f, 0, get64(f->index) + (1ull << 32)); /* version 2 */
	attach_fails(f, -EPROTO, "wcached sent a damaged index");
}

/* A table offset or count that points outside the index. */
static void
test_index_tables_outside(void **state)
{
	struct fixture *f = *state;

	patched_index(f, IX_TENSOR_OFFSET, f->index_len);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
	patched_index(f, IX_FILE_OFFSET, UINT64_MAX - 7);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
	patched_index(f, 8 /* tensor_count */, UINT64_MAX / 2);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
}

/* The index names another number of files than the reply. */
static void
test_index_file_count_differs(void **state)
{
	struct fixture *f = *state;

	patched_index(f, IX_FILE_COUNT, 1);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
	/* Both say 1, but two files came: the count of descriptors is wrong. */
	f->fake.ok.file_count = 1;
	attach_fails(f, -EBADMSG, "wcached sent 4 descriptors for 1 files");
}

/* The second file record is damaged: found after the first file is mapped,
 * which must be unmapped again. */
static void
test_index_file_record_damaged(void **state)
{
	struct fixture *f = *state;

	patched_index(f, file_record(f, 1), UINT64_MAX);
	attach_fails(f, -EBADMSG, MODEL ": index: file record 1 is damaged");
	patched_index(f, file_record(f, 1) + 8, B_SIZE + 1); /* size */
	attach_fails(f, -EBADMSG, "b.bin: received descriptor is not a 97-byte file");
}

/* Tensor records are checked on access: attaching works, the bad tensor
 * is an error, the others read. */
static void
test_index_tensor_damaged(void **state)
{
	struct fixture *f = *state;
	wc_tensor t;
	int before;

	/* beta's data past the end of b.bin */
	patched_index(f, tensor_record(f, 1) + 32, B_SIZE - 16);
	before = attach_ok(f);
	assert_error(wc_model_find(f->model, "beta", &t), -EBADMSG,
		MODEL ": tensor \"beta\" lies outside its file");
	assert_error(wc_model_tensor(f->model, 1, &t), -EBADMSG, "lies outside its file");
	assert_int_equal(wc_model_find(f->model, "alpha", &t), 0);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);

	/* beta in file 2 of 2 */
	patched_index(f, tensor_record(f, 1) + 8, 4 /* U8 */ | (uint64_t)2 << 32);
	before = attach_ok(f);
	assert_error(wc_model_find(f->model, "beta", &t), -EBADMSG,
		"index: tensor record 1 is damaged");
	assert_int_equal(wc_model_find(f->model, "gamma", &t), 0);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

/* ---- status pages ------------------------------------------------------- */

/* Attaches with page as the status page and slot as the model's slot. The
 * page says GENERATION + 1 there, so a client that used it would call the
 * model stale: the attach must work, without the page. */
static void
attach_with_bad_page(struct fixture *f, int page, uint64_t slot)
{
	int before;

	f->fake.fds[3] = page;
	f->fake.ok.status_slot = slot;
	before = attach_ok(f);
	check_tensors(f->model);
	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT, GENERATION);
	assert_maps(f, 1, 2, 1);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

static void
test_status_page_unsealed(void **state)
{
	struct fixture *f = *state;

	attach_with_bad_page(f, page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC, SLOT,
		GENERATION + 1, 0), SLOT);
	attach_with_bad_page(f, page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC, SLOT,
		GENERATION + 1, F_SEAL_SHRINK), SLOT); /* can still grow: not enough */
}

static void
test_status_page_too_small(void **state)
{
	struct fixture *f = *state;

	/* Room for slots 0 to 2: slot 3 is outside. */
	attach_with_bad_page(f, page_with(f, 24, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
	/* Slot 3 ends 4 bytes past the end. */
	attach_with_bad_page(f, page_with(f, 28, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
	attach_with_bad_page(f, page_with(f, 0, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
}

static void
test_status_page_wrong_magic(void **state)
{
	struct fixture *f = *state;

	attach_with_bad_page(f, page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC + 1, SLOT,
		GENERATION + 1, PAGE_SEALS), SLOT);
}

static void
test_status_slot_beyond_page(void **state)
{
	struct fixture *f = *state;
	int page = page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC, SLOT, GENERATION + 1, PAGE_SEALS);

	attach_with_bad_page(f, page, PAGE_SIZE_BYTES / 8);
	attach_with_bad_page(f, page, UINT64_MAX);
	attach_with_bad_page(f, page, UINT64_MAX / 8 + 1); /* * 8 overflows to 0 */
	attach_with_bad_page(f, page, 0);                  /* the magic's slot */
}

/* Larger than the client is willing to map (1 MiB), or not a file. */
static void
test_status_page_not_usable(void **state)
{
	struct fixture *f = *state;
	int odd[3];

	attach_with_bad_page(f, page_with(f, 2u << 20, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
	odd_fds(f, odd);
	for (int i = 0; i < 3; i++)
		attach_with_bad_page(f, odd[i], SLOT);
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
		"model \"" MODEL "\": " MODEL ": uid 1000 may not attach this model (wcached at %s)",
		f->sock);
	attach_fails(f, -EACCES, want); /* with the four descriptors of fake_good() */
	f->fake.err_code = ESTALE;
	f->fake.err_text = "model.safetensors was modified in place";
	f->fake.nfds = 0;
	attach_fails(f, -ESTALE, "was modified in place");
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
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_true(conn >= 0);
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);

	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("attach after the restart failed: %s", wc_errmsg());
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
	int before, conn;

	f->fake.connections = 2;
	f->fake.hold_handle = 77;
	before = attach_ok(f);
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("attach after the restart failed: %s", wc_errmsg());
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
	int before, conn;

	f->fake.connections = 3;
	f->fake.hold_handle = -1;
	before = attach_ok(f);
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
	if (wc_attach(f->client, MODEL, &again) != 0)
		fail_msg("attach after the restart failed: %s", wc_errmsg());
	assert_int_equal(f->fake.holds, 1);
	assert_int_equal(f->fake.accepted, 3);
	wc_release(f->model); /* only unmapped */
	f->model = NULL;
	wc_release(again);
	finish(f, before);
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, HANDLE + 2); /* the third connection's */
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
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
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
	int before, conn;

	before = attach_ok(f);
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
	fake_finish(f);
	assert_int_equal(unlink(f->sock), 0); /* nobody at the path any more */
	assert_error(wc_attach(f->client, MODEL, &again), -ECONNREFUSED,
		"closed the connection, and connecting again failed: wcached is not running");
	assert_null(again);
	check_tensors(f->model);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
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

/* ---- mmap failures ------------------------------------------------------ */

/* Attaches with the Nth file-backed mmap() failing: index, a.bin, b.bin,
 * status page in that order. */
static void
attach_with_mmap_failing(struct fixture *f, int nth, const char *want)
{
	fault.mmap_fail_at = nth;
	fault.mmap_calls = 0;
	fault.mmap_failed = 0;
	attach_fails(f, -ENOMEM, want);
	fault.mmap_fail_at = 0;
	assert_int_equal(fault.mmap_failed, nth);
}

/* The second file fails to map: the first file and the index are
 * unmapped, all descriptors closed (attach_fails checks both). */
static void
test_mmap_fails_on_second_file(void **state)
{
	NEED_WRAP();
	attach_with_mmap_failing(*state, 3, MODEL ": b.bin: mmap: ");
}

static void
test_mmap_fails_on_first_file(void **state)
{
	NEED_WRAP();
	attach_with_mmap_failing(*state, 2, MODEL ": a.bin: mmap: ");
}

static void
test_mmap_fails_on_index(void **state)
{
	NEED_WRAP();
	attach_with_mmap_failing(*state, 1, MODEL ": mmap: ");
}

/* The status page fails to map: the attach works without it. */
static void
test_mmap_fails_on_status_page(void **state)
{
	struct fixture *f = *state;
	int before;

	NEED_WRAP();
	fault.mmap_fail_at = 4;
	before = attach_ok(f);
	fault.mmap_fail_at = 0;
	assert_int_equal(fault.mmap_failed, 4);
	check_tensors(f->model);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 0);
	assert_maps(f, 1, 2, 1);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

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
		T(test_attach_in_forked_child),
		T(test_bad_arguments),
		T(test_index_not_sealed),
		T(test_index_plain_file),
		T(test_index_size_mismatch),
		T(test_index_not_a_file),
		T(test_file_not_a_file),
		T(test_file_is_directory_of_right_size),
		T(test_file_writable),
		T(test_file_size_mismatch),
		T(test_too_few_descriptors),
		T(test_too_many_descriptors),
		T(test_index_bad_magic),
		T(test_index_version),
		T(test_index_tables_outside),
		T(test_index_file_count_differs),
		T(test_index_file_record_damaged),
		T(test_index_tensor_damaged),
		T(test_status_page_unsealed),
		T(test_status_page_too_small),
		T(test_status_page_wrong_magic),
		T(test_status_slot_beyond_page),
		T(test_status_page_not_usable),
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
		T(test_reconnect_holds),
		T(test_reconnect_hold_hang_up),
		T(test_reconnect_when_daemon_dies_holding_request),
		T(test_reconnect_fails_when_daemon_gone),
		T(test_reconnect_within_deadline),
		T(test_mmap_fails_on_second_file),
		T(test_mmap_fails_on_first_file),
		T(test_mmap_fails_on_index),
		T(test_mmap_fails_on_status_page),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}
