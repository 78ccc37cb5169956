/*
 * test_derive.c: derived artifacts on the client side (client/lib/derive.c
 * and the DERIVE and PUBLISH replies of client/lib/attach_reply.c) against
 * the fake wcached of fakedaemon.c.
 *
 * The fake answers DERIVE with an artifact's ATTACH_OK, a BUILD with the
 * source's descriptors and a token, or an ERROR; it keeps the bytes of the
 * memfd a PUBLISH brings, which the test opens with the library's own
 * reader to check that they are a valid safetensors file holding exactly
 * the published tensors. Each test checks that the process holds as many
 * descriptors afterwards as before (every received descriptor closed on
 * every path, malformed replies included) and what the fake saw: the key,
 * the wait, the token, the reason of an ABANDON, the releases.
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
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fakedaemon.h"
#include "format/dtype.h"
#include "format/index.h"
#include "proto/memfds.h"
#include "testutil.h"
#include "lib/wcache.h"
#include "proto/wire.h"

#define MODEL "llama"
#define KEY "f32-v1"
#define GENERATION 7u
#define SOURCE_HANDLE 42u
#define ARTIFACT_HANDLE 43u
#define TOKEN 0x1122334455667788ull
#define SLOT 3u
#define SRC_SIZE 64u      /* src.bin: "w" BF16 [4, 8] */
#define ARTIFACT_SIZE 128u /* artifact: "w" F32 [4, 8] */
#define PAGE_BYTES 4096u

struct fixture {
	char *dir;
	char *sock;
	int src_fd, artifact_fd;      /* the daemon's O_RDONLY descriptors */
	uint8_t *src_index, *artifact_index;
	size_t src_index_len, artifact_index_len;
	int src_index_fd, artifact_index_fd;
	int status_fd;
	uint64_t *status;
	sem_t closed, read;
	struct fake fake;
	wc_client *client;
	wc_model *model;
};

/* ---- fault injection ---- */

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((weak));
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

/* > 0: the Nth file-backed mmap() from now on fails with ENOMEM (counted in
 * mmap_calls; anonymous mappings, made by anything, are not counted). */
static int mmap_fail_at, mmap_calls;

void *
__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (mmap_fail_at > 0 && fd >= 0 && !(flags & MAP_ANONYMOUS) &&
		++mmap_calls == mmap_fail_at) {
		mmap_fail_at = 0;
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return __real_mmap(addr, len, prot, flags, fd, off);
}

/* Arms __wrap_mmap to fail the nth file-backed mmap() from now on; skips
 * the test in a build not linked with -Wl,--wrap=mmap. */
static void
fail_mmap(int nth)
{
	if (__real_mmap == NULL)
		skip();
	mmap_calls = 0;
	mmap_fail_at = nth;
}

/* An index of one file called file, size bytes, with tensor "w" of dtype
 * [4, 8] at 0. */
static void
one_tensor_index(const char *file, uint64_t size, const char *dtype, uint8_t **out, size_t *len)
{
	static const uint64_t shape[] = { 4, 8 };
	struct index_builder *b;
	uint32_t f0;

	assert_int_equal(index_builder_new(&b), 0);
	assert_int_equal(index_add_file(b, file, size, &f0), 0);
	assert_int_equal(index_add_tensor(b, "w", 1, dtype_by_name(dtype, strlen(dtype))->code, f0,
		shape, 2, 0, size), 0);
	assert_int_equal(index_build(b, "test", out, len), 0);
	index_builder_free(b);
}

static int
sealed_memfd(const char *name, const void *data, size_t len, int seals)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, data, len, 0), (ssize_t)len);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

/* A file of len bytes, byte i being (i * mul + add) & 0xff, opened O_RDONLY. */
static int
pattern_file(const char *dir, const char *name, size_t len, unsigned mul, unsigned add)
{
	uint8_t buf[ARTIFACT_SIZE];
	char *path;
	int fd;

	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * mul + add);
	path = tu_write(dir, name, buf, len);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	free(path);
	return fd;
}

/* The fake's reply to DERIVE: the artifact (kind REPLY_ATTACH_OK) or a
 * BUILD of the source. */
static void
script_derive(struct fixture *f, enum reply_kind kind)
{
	struct fake *k = &f->fake;
	int artifact = kind == REPLY_ATTACH_OK;

	k->mode = FAKE_SERVE;
	k->kind = kind;
	k->ok = (struct wire_attach_ok){ .generation = GENERATION,
		.handle = artifact ? ARTIFACT_HANDLE : SOURCE_HANDLE,
		.index_size = artifact ? f->artifact_index_len : f->src_index_len,
		.file_count = 1, .flags = WIRE_ATTACH_STATUS, .status_slot = SLOT };
	k->fds[0] = artifact ? f->artifact_index_fd : f->src_index_fd;
	k->fds[1] = artifact ? f->artifact_fd : f->src_fd;
	k->fds[2] = f->status_fd;
	k->nfds = 3;
	k->token = TOKEN;
}

/* The fake's reply to PUBLISH: the artifact's ATTACH_OK. */
static void
script_publish_ok(struct fixture *f)
{
	struct fake_publish *p = &f->fake.publish;

	p->kind = REPLY_ATTACH_OK;
	p->ok = (struct wire_attach_ok){ .generation = GENERATION, .handle = ARTIFACT_HANDLE,
		.index_size = f->artifact_index_len, .file_count = 1,
		.flags = WIRE_ATTACH_STATUS, .status_slot = SLOT };
	p->fds[0] = f->artifact_index_fd;
	p->fds[1] = f->artifact_fd;
	p->fds[2] = f->status_fd;
	p->nfds = 3;
}

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	f->dir = tu_tmpdir();
	assert_true(asprintf(&f->sock, "%s/wc.sock", f->dir) > 0);
	f->src_fd = pattern_file(f->dir, "src.bin", SRC_SIZE, 3, 1);
	f->artifact_fd = pattern_file(f->dir, "artifact", ARTIFACT_SIZE, 5, 2);
	one_tensor_index("src.bin", SRC_SIZE, "BF16", &f->src_index, &f->src_index_len);
	one_tensor_index("artifact", ARTIFACT_SIZE, "F32", &f->artifact_index,
		&f->artifact_index_len);
	f->src_index_fd = sealed_memfd("wctest-index", f->src_index, f->src_index_len,
		INDEX_SEALS);
	f->artifact_index_fd = sealed_memfd("wctest-index", f->artifact_index,
		f->artifact_index_len, INDEX_SEALS);

	f->status_fd = fake_status_page(PAGE_BYTES, SLOT, GENERATION, &f->status);
	assert_true(f->status_fd >= 0);
	f->fake.listen_fd = fake_listen(f->sock);
	assert_true(f->fake.listen_fd >= 0);
	f->fake.conn = -1;
	f->fake.changed_fd = -1;
	f->fake.model = MODEL;
	assert_int_equal(sem_init(&f->closed, 0, 0), 0);
	assert_int_equal(sem_init(&f->read, 0, 0), 0);
	f->fake.closed = &f->closed;
	f->fake.read = &f->read;
	script_derive(f, REPLY_ATTACH_OK);
	script_publish_ok(f);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	wc_disconnect(f->client);
	wc_release(f->model);
	fake_join(&f->fake);
	free(f->fake.published);
	close(f->fake.listen_fd);
	close(f->src_fd);
	close(f->artifact_fd);
	close(f->src_index_fd);
	close(f->artifact_index_fd);
	close(f->status_fd);
	munmap(f->status, PAGE_BYTES);
	free(f->src_index);
	free(f->artifact_index);
	free(f->sock);
	tu_rmtree(f->dir);
	sem_destroy(&f->closed);
	sem_destroy(&f->read);
	free(f);
	return 0;
}

/* Starts the fake and connects to it with a deadline of timeout_ms. */
static void
start(struct fixture *f, int timeout_ms)
{
	assert_int_equal(pthread_create(&f->fake.thread, NULL, fake_main, &f->fake), 0);
	f->fake.started = 1;
	assert_int_equal(wc_connect_timeout(f->sock, timeout_ms, &f->client), 0);
}

/* Disconnects, joins the fake, asserts it saw nothing wrong and that the
 * process holds the descriptors it held before. */
static void
finish(struct fixture *f, int fds_before)
{
	wc_disconnect(f->client);
	f->client = NULL;
	fake_join(&f->fake);
	if (f->fake.failure[0] != '\0')
		fail_msg("fake daemon: %s", f->fake.failure);
	assert_int_equal(tu_count_fds(), fds_before);
}

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

/* Asserts that m holds tensor "w" of dtype, [4, 8], with the bytes of a
 * pattern_file(len, mul, add). */
static void
check_w(const wc_model *m, const char *dtype, size_t len, unsigned mul, unsigned add)
{
	wc_tensor t;
	const uint8_t *d;

	assert_int_equal(wc_model_count(m), 1);
	assert_int_equal(wc_model_find(m, "w", &t), 0);
	assert_string_equal(t.dtype, dtype);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 4);
	assert_int_equal(t.shape[1], 8);
	assert_int_equal(t.nbytes, len);
	d = t.data;
	for (size_t i = 0; i < len; i++)
		assert_int_equal(d[i], (uint8_t)(i * mul + add));
}

/* ---- the artifact exists ---- */

static void
test_artifact_attached(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;

	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	assert_null(b);
	assert_string_equal(f->fake.name, MODEL);
	assert_string_equal(f->fake.key, KEY);
	/* wait_ms is what is left of the deadline. */
	assert_true(f->fake.wait_ms > 4000 && f->fake.wait_ms <= 5000);
	check_w(f->model, "F32", ARTIFACT_SIZE, 5, 2);
	assert_int_equal(wc_model_generation(f->model), GENERATION);
	assert_int_equal(wc_model_stale(f->model), 0);
	/* Stale when the source model has a newer generation. */
	__atomic_store_n(&f->status[SLOT], GENERATION + 1, __ATOMIC_RELEASE);
	assert_int_equal(wc_model_stale(f->model), 1);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	assert_int_equal(f->fake.derives, 1);
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, ARTIFACT_HANDLE);
}

/* A client without a deadline waits as long as the build takes. */
static void
test_wait_forever(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;

	start(f, 0);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	assert_int_equal(f->fake.wait_ms, UINT32_MAX);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

/* CHANGED messages before the reply are skipped, their descriptors closed. */
static void
test_changed_before_reply(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	int extra = memfd_create("wctest-extra", MFD_CLOEXEC);

	f->fake.changed_before = 3;
	f->fake.changed_fd = extra;
	f->fake.changed_generation = GENERATION + 1;
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	check_w(f->model, "F32", ARTIFACT_SIZE, 5, 2);
	wc_release(f->model);
	f->model = NULL;
	close(extra);
	finish(f, before);
}

/* ---- building ---- */

/* BUILD, then wc_build_publish(): the fake receives a safetensors file of
 * exactly the published tensors and metadata, and the builder gets the
 * artifact; the source is released. */
static void
test_build_and_publish(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *got = NULL, *art = NULL;
	const wc_model *src;
	static const uint64_t shape_w[] = { 4, 8 }, shape_s[] = { 4 };
	float w[32], scale[4] = { 0.5f, 1.5f, 2.5f, 3.5f };
	const char *meta[] = { "format", "pt", "derived_from", "llama" };
	wc_tensor t[2], u;
	char *path;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &got, &b), 1);
	assert_null(got);
	assert_non_null(b);
	src = wc_build_source(b);
	assert_non_null(src);
	check_w(src, "BF16", SRC_SIZE, 3, 1);
	assert_int_equal(wc_model_generation(src), GENERATION);

	for (int i = 0; i < 32; i++)
		w[i] = (float)i * 0.25f;
	/* Out of order: the writer sorts by name. */
	t[0] = (wc_tensor){ "w.scale", "F32", 1, shape_s, scale, sizeof(scale) };
	t[1] = (wc_tensor){ "w", "F32", 2, shape_w, w, sizeof(w) };
	assert_int_equal(wc_build_publish(b, t, 2, meta, 2, &f->model), 0);
	check_w(f->model, "F32", ARTIFACT_SIZE, 5, 2);
	assert_int_equal(wc_model_generation(f->model), GENERATION);
	assert_int_equal(f->fake.publishes, 1);
	assert_int_equal(f->fake.published_token, TOKEN);
	assert_true(f->fake.published_seals >= 0); /* a memfd */

	/* What the fake received is a valid safetensors file of those tensors. */
	assert_true(f->fake.published_len < FAKE_PUBLISHED_MAX);
	path = tu_write(f->dir, "published.safetensors", f->fake.published,
		f->fake.published_len);
	assert_int_equal(wc_open_file(path, &art), 0);
	assert_int_equal(wc_model_count(art), 2);
	assert_int_equal(wc_model_find(art, "w", &u), 0);
	assert_string_equal(u.dtype, "F32");
	assert_int_equal(u.ndim, 2);
	assert_memory_equal(u.data, w, sizeof(w));
	assert_int_equal(wc_model_find(art, "w.scale", &u), 0);
	assert_int_equal(u.shape[0], 4);
	assert_memory_equal(u.data, scale, sizeof(scale));
	assert_string_equal(wc_model_metadata(art, "format"), "pt");
	assert_string_equal(wc_model_metadata(art, "derived_from"), "llama");
	wc_release(art);
	free(path);

	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	/* The source went with the build, then the artifact. */
	assert_int_equal(f->fake.releases, 2);
	assert_int_equal(f->fake.released_handle, ARTIFACT_HANDLE);
	assert_int_equal(f->fake.abandons, 0);
}

/* What wc_build_publish_each()'s callback saw: the indices in call order;
 * it overwrites each tensor's data, as a caller freeing it would. */
struct written_log {
	size_t order[4];
	size_t n;
	void *data[4];
	size_t nbytes[4];
};

static void
on_written(size_t index, void *arg)
{
	struct written_log *w = arg;

	assert_true(index < 4 && w->n < 4);
	w->order[w->n++] = index;
	memset(w->data[index], 0xee, w->nbytes[index]);
}

/* wc_build_publish_each(): each tensor is handed back once, in name order,
 * as soon as it is written: its memory reused from then on changes nothing
 * the waiters get (one big enough to go around the writer's buffer). */
static void
test_publish_each(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	static const uint64_t shape_big[] = { 1 << 19 }, shape_s[] = { 4 };
	size_t big_bytes = (size_t)(1 << 19) * sizeof(float);
	float *big = malloc(big_bytes), *big_copy = malloc(big_bytes);
	float s1[4] = { 1, 2, 3, 4 }, s2[4] = { 5, 6, 7, 8 };
	const float s1_copy[4] = { 1, 2, 3, 4 }, s2_copy[4] = { 5, 6, 7, 8 };
	struct written_log w = { .data = { s2, big, s1 },
		.nbytes = { sizeof(s2), big_bytes, sizeof(s1) } };
	wc_tensor t[3], u;
	wc_model *art;
	char *path;

	assert_non_null(big);
	assert_non_null(big_copy);
	for (size_t i = 0; i < (size_t)1 << 19; i++)
		big[i] = (float)i;
	memcpy(big_copy, big, big_bytes);
	t[0] = (wc_tensor){ "z", "F32", 1, shape_s, s2, sizeof(s2) };
	t[1] = (wc_tensor){ "m.big", "F32", 1, shape_big, big, big_bytes };
	t[2] = (wc_tensor){ "a", "F32", 1, shape_s, s1, sizeof(s1) };
	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 1);
	assert_int_equal(wc_build_publish_each(b, t, 3, NULL, 0, on_written, &w, &f->model), 0);
	/* Name order: a, m.big, z. */
	assert_int_equal(w.n, 3);
	assert_int_equal(w.order[0], 2);
	assert_int_equal(w.order[1], 1);
	assert_int_equal(w.order[2], 0);
	assert_int_equal(f->fake.publishes, 1);
	assert_true(f->fake.published_len < FAKE_PUBLISHED_MAX);
	path = tu_write(f->dir, "published.safetensors", f->fake.published,
		f->fake.published_len);
	assert_int_equal(wc_open_file(path, &art), 0);
	assert_int_equal(wc_model_find(art, "a", &u), 0);
	assert_memory_equal(u.data, s1_copy, sizeof(s1_copy));
	assert_int_equal(wc_model_find(art, "z", &u), 0);
	assert_memory_equal(u.data, s2_copy, sizeof(s2_copy));
	assert_int_equal(wc_model_find(art, "m.big", &u), 0);
	assert_int_equal(u.nbytes, big_bytes);
	assert_memory_equal(u.data, big_copy, big_bytes);
	wc_release(art);
	free(path);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	free(big);
	free(big_copy);
}

/* wc_build_publish_fd(): the caller's memfd goes as it is and stays open. */
static void
test_publish_fd(void **state)
{
	struct fixture *f = *state;
	static const char bytes[] = "any bytes: the daemon validates them";
	int before = tu_count_fds(), fd;
	wc_build *b = NULL;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 1);
	fd = memfd_create("wctest-mine", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_int_equal(write(fd, bytes, sizeof(bytes)), (ssize_t)sizeof(bytes));
	assert_int_equal(wc_build_publish_fd(b, fd, &f->model), 0);
	assert_int_equal(fcntl(fd, F_GETFD), FD_CLOEXEC); /* still ours */
	assert_int_equal(f->fake.published_len, sizeof(bytes));
	assert_memory_equal(f->fake.published, bytes, sizeof(bytes));
	close(fd);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

/* A publication wcached refuses: its code and reason; the build is over. */
static void
test_publish_refused(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;
	static const uint64_t shape[] = { 2 };
	uint8_t d[2] = { 1, 2 };
	wc_tensor t = { "x", "U8", 1, shape, d, 2 };

	script_derive(f, REPLY_BUILD);
	f->fake.publish.kind = REPLY_ERROR;
	f->fake.publish.err_code = EBUSY;
	f->fake.publish.err_text = "the builder still has a writable mapping";
	f->fake.publish.nfds = 0;
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	assert_error(wc_build_publish(b, &t, 1, NULL, 0, &m), -EBUSY, "writable mapping");
	assert_non_null(strstr(wc_errmsg(), "key \"" KEY "\""));
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.releases, 1); /* the source */
}

/* A tensor the writer refuses abandons the build with the writer's reason. */
static void
test_publish_bad_tensor_abandons(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;
	static const uint64_t shape[] = { 4 };
	float d[4] = { 0 };
	wc_tensor t = { "x", "F32", 1, shape, d, 8 /* not 16 */ };

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	assert_error(wc_build_publish(b, &t, 1, NULL, 0, &m), -EINVAL, "do not make its shape");
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.publishes, 0);
	assert_int_equal(f->fake.abandons, 1);
	assert_int_equal(f->fake.abandoned_token, TOKEN);
	assert_non_null(strstr(f->fake.reason, "do not make its shape"));
	assert_int_equal(f->fake.releases, 1);
}

/* A descriptor that is not a memfd is not sent; the build is abandoned. */
static void
test_publish_fd_not_memfd(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), p[2];
	wc_build *b = NULL;
	wc_model *m = NULL;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_error(wc_build_publish_fd(b, p[0], &m), -EINVAL, "not a memfd");
	close(p[0]);
	close(p[1]);
	finish(f, before);
	assert_int_equal(f->fake.publishes, 0);
	assert_int_equal(f->fake.abandons, 1);
}

static void
test_abandon(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	wc_build_abandon(b, "ValueError: no weights called lm_head");
	finish(f, before);
	assert_int_equal(f->fake.abandons, 1);
	assert_int_equal(f->fake.abandoned_token, TOKEN);
	assert_string_equal(f->fake.reason, "ValueError: no weights called lm_head");
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, SOURCE_HANDLE);
	wc_build_abandon(NULL, "nothing"); /* NULL-safe */
}

/*
 * The client cannot map the source a BUILD passed it (mmap fails with
 * ENOMEM: RLIMIT_AS, vm.max_map_count): the daemon has made this process
 * the builder and counts an attach of the source, and the caller gets no
 * wc_build to end them with. The client abandons the build at once, with
 * the failure in the reason (the workers waiting for the key learn it now,
 * not at derive_timeout), and releases the source's attach; the
 * connection stays: the next DERIVE works on it. Before, it sent neither:
 * the build stayed this process's until it disconnected.
 */
static void
test_build_source_unmappable_abandons(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	fail_mmap(2); /* the index, then src.bin */
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -ENOMEM,
		MODEL ": src.bin: mmap: ");
	assert_null(b);
	assert_null(m);
	assert_int_equal(mmap_fail_at, 0);
	script_derive(f, REPLY_ATTACH_OK);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
	assert_int_equal(f->fake.derives, 2);
	assert_int_equal(f->fake.abandons, 1);
	assert_int_equal(f->fake.abandoned_token, TOKEN);
	if (strstr(f->fake.reason, "could not map the source: " MODEL ": src.bin: mmap: ") ==
		NULL)
		fail_msg("reason \"%s\"", f->fake.reason);
	/* The source, then the artifact. */
	assert_int_equal(f->fake.releases, 2);
	assert_int_equal(f->fake.released_seq, 0);
}

/* An artifact that cannot be mapped (DERIVE's ATTACH_OK, then PUBLISH's):
 * its attach is released; the connection stays. Before, the daemon counted
 * it until the connection closed. */
static void
test_artifact_unmappable_released(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), memfd;
	wc_build *b = NULL;
	wc_model *m = NULL;

	start(f, 5000);
	fail_mmap(2); /* the artifact's index, then the artifact */
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -ENOMEM,
		MODEL " [" KEY "]: artifact: mmap: ");
	assert_int_equal(f->fake.derives, 1);
	/* A BUILD, then the PUBLISH's ATTACH_OK that cannot be mapped. */
	script_derive(f, REPLY_BUILD);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	memfd = memfd_create("wctest-artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(memfd >= 0);
	fail_mmap(2);
	assert_error(wc_build_publish_fd(b, memfd, &m), -ENOMEM,
		MODEL " [" KEY "]: artifact: mmap: ");
	close(memfd);
	assert_null(m);
	finish(f, before);
	assert_int_equal(f->fake.publishes, 1);
	assert_int_equal(f->fake.abandons, 0);
	/* The artifact of DERIVE, the artifact of PUBLISH, the source. */
	assert_int_equal(f->fake.releases, 3);
}

/* After wc_disconnect() the build cannot be published: an error, no crash,
 * nothing left. */
static void
test_publish_after_disconnect(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;
	static const uint64_t shape[] = { 1 };
	uint8_t d = 1;
	wc_tensor t = { "x", "U8", 1, shape, &d, 1 };

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	wc_disconnect(f->client);
	f->client = NULL;
	assert_error(wc_build_publish(b, &t, 1, NULL, 0, &m), -ENOTCONN, "disconnected");
	finish(f, before);
	assert_int_equal(f->fake.publishes, 0);
}

/* The race of a build's end (publish or abandon) on one thread against
 * wc_disconnect() of its client on another: rounds of it. */
#define RACE_ROUNDS 24

struct race {
	struct fixture *f;
	int publish;       /* publish, else abandon */
	wc_build *build;
	wc_model *ended;   /* what a publish that won returned */
	int result;
	wc_model *attached; /* what the attach holding the lock returned */
	int attach_result;
};

static void *
race_attach(void *arg)
{
	struct race *r = arg;

	r->attach_result = wc_attach(r->f->client, MODEL, &r->attached);
	return NULL;
}

static void *
race_end_build(void *arg)
{
	static const uint64_t shape[] = { 1 };
	static const uint8_t d = 1;
	struct race *r = arg;
	wc_tensor t = { "x", "U8", 1, shape, &d, 1 };

	if (r->publish)
		r->result = wc_build_publish(r->build, &t, 1, NULL, 0, &r->ended);
	else
		wc_build_abandon(r->build, "lost the race");
	return NULL;
}

static void *
race_disconnect(void *arg)
{
	wc_disconnect(arg);
	return NULL;
}

/* Connects, gets a BUILD (r->build), then starts an attach in *attacher
 * whose reply the fake holds at gate: when this returns, that attach holds
 * the client's lock until gate is posted. */
static void
build_then_hold_lock(struct fixture *f, struct race *r, sem_t *gate, sem_t *at_gate,
	pthread_t *attacher)
{
	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &r->build), 1);
	/* The next ATTACH gets the artifact, at the gate. */
	script_derive(f, REPLY_ATTACH_OK);
	f->fake.at_gate = at_gate;
	f->fake.gate = gate;
	assert_int_equal(pthread_create(attacher, NULL, race_attach, r), 0);
	assert_int_equal(sem_wait(at_gate), 0);
}

/* A build's publish or abandon and wc_disconnect() of its client, both
 * waiting for the client's lock while an attach holds it (the fake holds
 * its reply at a gate), then let go together, many times: either may take
 * the lock first. The build reaches its client through a reference of its
 * own: before, it read the pointer, waited on the lock and went on in the
 * client the disconnect had freed (a use after free the sanitizers report
 * in most runs of these rounds). Either end wins: a publish returns the
 * artifact (a model detached from the closed client) or "disconnected";
 * the fake sees the message or not. Nothing is left behind in any round. */
static void
race_rounds(struct fixture *f, int publish)
{
	int before = tu_count_fds(), won = 0;
	struct race r;
	pthread_t attacher, ender, disconnecter;
	sem_t gate, at_gate;

	assert_int_equal(sem_init(&gate, 0, 0), 0);
	assert_int_equal(sem_init(&at_gate, 0, 0), 0);
	for (int round = 0; round < RACE_ROUNDS; round++) {
		memset(&r, 0, sizeof(r));
		r.f = f;
		r.publish = publish;
		f->fake.publishes = f->fake.abandons = f->fake.releases = 0;
		f->fake.gate = NULL;
		build_then_hold_lock(f, &r, &gate, &at_gate, &attacher);
		assert_int_equal(pthread_create(&ender, NULL, race_end_build, &r), 0);
		assert_int_equal(pthread_create(&disconnecter, NULL, race_disconnect, f->client),
			0);
		f->client = NULL;
		usleep(20 * 1000); /* both wait on the lock by now */
		assert_int_equal(sem_post(&gate), 0);
		assert_int_equal(pthread_join(attacher, NULL), 0);
		assert_int_equal(pthread_join(ender, NULL), 0);
		assert_int_equal(pthread_join(disconnecter, NULL), 0);
		assert_int_equal(r.attach_result, 0);
		check_w(r.attached, "F32", ARTIFACT_SIZE, 5, 2);
		wc_release(r.attached);
		if (publish && r.result == 0) {
			check_w(r.ended, "F32", ARTIFACT_SIZE, 5, 2);
			wc_release(r.ended);
		} else if (publish) {
			assert_error(r.result, -ENOTCONN, "disconnected");
			assert_null(r.ended);
		}
		finish(f, before);
		assert_int_equal(f->fake.publishes, publish && r.result == 0);
		assert_in_range(f->fake.abandons, 0, !publish);
		won += publish ? f->fake.publishes : f->fake.abandons;
	}
	f->fake.gate = NULL;
	sem_destroy(&gate);
	sem_destroy(&at_gate);
	print_message("%d rounds: the %s took the lock first in %d\n", RACE_ROUNDS,
		publish ? "publish" : "abandon", won);
}

/*
 * fork() while another thread holds the client's lock (an attach waiting
 * for its reply at the fake's gate): the child's copy of that lock stays
 * held by a thread the child does not have. What the child does with its
 * parent's client must neither wait for that lock (it would wait forever:
 * before, releasing the build's source, abandoning the build and
 * wc_disconnect() did) nor touch the parent's connection (before,
 * wc_client_dispatch() read it, which could take the parent's reply, and
 * wc_set_timeout() changed its timeouts, which a socket's copies share):
 * wc_set_timeout() and wc_client_dispatch() are -ECHILD, the abandon sends
 * nothing, and the releases only unmap.
 */
static void
test_child_after_fork_with_the_lock_held(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), status;
	struct race r = { .f = f };
	pthread_t attacher;
	sem_t gate, at_gate;
	pid_t pid;

	assert_int_equal(sem_init(&gate, 0, 0), 0);
	assert_int_equal(sem_init(&at_gate, 0, 0), 0);
	build_then_hold_lock(f, &r, &gate, &at_gate, &attacher);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int code = 0;

		alarm(10); /* a wait on the lock ends here, killed by SIGALRM */
		if (wc_set_timeout(f->client, 1000) != -ECHILD)
			code = 1;
		else if (strstr(wc_errmsg(), "after fork()") == NULL)
			code = 2;
		else if (wc_client_dispatch(f->client) != -ECHILD)
			code = 3;
		wc_build_abandon(r.build, "in the child");
		wc_disconnect(f->client);
		_exit(code);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(sem_post(&gate), 0);
	assert_int_equal(pthread_join(attacher, NULL), 0);
	if (WIFSIGNALED(status))
		fail_msg("the child was killed by signal %d (a wait on the lock)",
			WTERMSIG(status));
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	/* The parent's client and connection are as they were. */
	assert_int_equal(r.attach_result, 0);
	check_w(r.attached, "F32", ARTIFACT_SIZE, 5, 2);
	wc_release(r.attached);
	assert_int_equal(f->fake.abandons, 0);
	wc_build_abandon(r.build, "in the parent");
	f->fake.gate = NULL;
	finish(f, before);
	assert_int_equal(f->fake.abandons, 1);
	assert_string_equal(f->fake.reason, "in the parent");
	sem_destroy(&gate);
	sem_destroy(&at_gate);
}

static void
test_publish_races_disconnect(void **state)
{
	race_rounds(*state, 1);
}

static void
test_abandon_races_disconnect(void **state)
{
	race_rounds(*state, 0);
}

/* ---- errors ---- */

static void
test_errors(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;

	f->fake.kind = REPLY_ERROR;
	f->fake.err_code = ECANCELED;
	f->fake.err_text = "llama: f32-v1: the build of pid 77 was abandoned: out of memory";
	start(f, 5000);
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -ECANCELED, "pid 77");
	assert_non_null(strstr(wc_errmsg(), "model \"llama\", key \"f32-v1\""));
	f->fake.err_code = ENOENT;
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -ENOENT, "is not served");
	f->fake.err_code = EPERM;
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -EPERM, "key \"f32-v1\"");
	assert_null(m);
	assert_null(b);
	finish(f, before);
	assert_int_equal(f->fake.derives, 3); /* the connection stayed */
}

static void
test_bad_arguments(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;

	start(f, 5000);
	assert_error(wc_derive(f->client, MODEL, "a/b", &m, &b), -EINVAL, "a key is");
	assert_error(wc_derive(f->client, MODEL, "", &m, &b), -EINVAL, "a key is");
	assert_error(wc_derive(f->client, "", KEY, &m, &b), -EINVAL, "name must be");
	assert_error(wc_derive(NULL, MODEL, KEY, &m, &b), -EINVAL, "wc_derive");
	assert_error(wc_derive(f->client, MODEL, KEY, NULL, &b), -EINVAL, "wc_derive");
	assert_error(wc_build_publish(NULL, NULL, 0, NULL, 0, &m), -EINVAL, "no build");
	assert_error(wc_build_publish_fd(NULL, 0, &m), -EINVAL, "no build");
	assert_null(wc_build_source(NULL));
	finish(f, before);
	assert_int_equal(f->fake.derives, 0);
}

/* A malformed reply to DERIVE: the call fails with -EBADMSG, every
 * descriptor that came is closed, and the connection is closed (the next
 * call goes over a new one). */
static void
derive_malformed(struct fixture *f, const char *want)
{
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;

	f->fake.connections = 2;
	start(f, 5000);
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -EBADMSG, want);
	assert_null(m);
	assert_null(b);
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -EBADMSG, want);
	finish(f, before);
	assert_int_equal(f->fake.accepted, 2);
}

static void
test_build_wrong_fd_count(void **state)
{
	struct fixture *f = *state;

	script_derive(f, REPLY_BUILD);
	f->fake.nfds = 2; /* the status page is missing */
	derive_malformed(f, "descriptors");
}

static void
test_build_extra_fds(void **state)
{
	struct fixture *f = *state;

	script_derive(f, REPLY_BUILD);
	f->fake.fds[3] = f->src_fd;
	f->fake.nfds = 4;
	derive_malformed(f, "descriptors");
}

static void
test_artifact_of_two_files(void **state)
{
	struct fixture *f = *state;

	f->fake.ok.file_count = 2;
	f->fake.fds[2] = f->src_fd;
	f->fake.fds[3] = f->status_fd;
	f->fake.nfds = 4;
	derive_malformed(f, "artifact of 2 files");
}

/* RELEASE_OK (with a descriptor) is no answer to DERIVE. */
static void
test_release_ok_to_derive(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_build *b = NULL;
	wc_model *m = NULL;

	/* seq 1: the client's first request. */
	assert_int_equal(wire_put_release_ok(f->fake.raw, sizeof(f->fake.raw), 1),
		WIRE_HEADER_SIZE);
	f->fake.raw_len = WIRE_HEADER_SIZE;
	f->fake.kind = REPLY_RAW;
	f->fake.fds[0] = f->src_fd;
	f->fake.nfds = 1;
	start(f, 5000);
	assert_error(wc_derive(f->client, MODEL, KEY, &m, &b), -EBADMSG, "unexpected reply");
	assert_null(m);
	assert_null(b);
	finish(f, before);
}

/* BUILD is no answer to ATTACH. */
static void
test_build_to_attach(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds();
	wc_model *m = NULL;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_error(wc_attach(f->client, MODEL, &m), -EBADMSG, "unexpected reply");
	assert_null(m);
	finish(f, before);
}

/* BUILD is no answer to PUBLISH: the build ends, the descriptors close. */
static void
test_build_to_publish(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), fd;
	wc_build *b = NULL;
	wc_model *m = NULL;
	uint8_t raw[64];
	struct wire_attach_ok ok = { .generation = GENERATION, .handle = 9,
		.index_size = f->src_index_len, .file_count = 1 };
	ssize_t n;

	script_derive(f, REPLY_BUILD);
	n = wire_put_build(raw, sizeof(raw), 2, &ok, TOKEN + 1);
	assert_true(n > 0);
	memcpy(f->fake.publish.raw, raw, (size_t)n);
	f->fake.publish.raw_len = (size_t)n;
	f->fake.publish.kind = REPLY_RAW;
	f->fake.publish.fds[0] = f->src_index_fd;
	f->fake.publish.fds[1] = f->src_fd;
	f->fake.publish.nfds = 2;
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &m, &b), 1);
	fd = memfd_create("wctest-mine", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_error(wc_build_publish_fd(b, fd, &m), -EBADMSG, "unexpected reply");
	assert_null(m);
	close(fd);
	finish(f, before);
	/* The reply put the client out of step: the connection was closed
	 * before the build ended, which released the source on the daemon's
	 * side; no RELEASE went. */
	assert_int_equal(f->fake.releases, 0);
}

/* A derived artifact is never named in a HOLD after a reconnect; the
 * attach of a generation is. */
static void
test_no_hold_for_artifacts(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), conn;
	wc_build *b = NULL;
	wc_model *again = NULL;

	f->fake.connections = 2;
	f->fake.hold_handle = 77;
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	conn = __atomic_load_n(&f->fake.conn, __ATOMIC_ACQUIRE);
	assert_int_equal(shutdown(conn, SHUT_RDWR), 0);
	/* The next request finds the connection dead and connects again. */
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &again, &b), 0);
	assert_int_equal(f->fake.holds, 0);
	assert_int_equal(f->fake.accepted, 2);
	check_w(f->model, "F32", ARTIFACT_SIZE, 5, 2); /* still mapped */
	wc_release(f->model);
	f->model = NULL;
	wc_release(again);
	finish(f, before);
	/* Only again's release went: the first artifact's connection is gone. */
	assert_int_equal(f->fake.releases, 1);
}

/* ---- the artifact's descriptor (wc_model_fd) ---- */

/* Asserts that fd is an open descriptor of the file the fake sent as the
 * artifact (daemon_fd), read-only and close-on-exec. */
static void
assert_artifact_fd(int fd, int daemon_fd)
{
	assert_true(tu_fd_is_readonly_of(fd, daemon_fd));
}

/* An artifact keeps its file's descriptor while it lives, one descriptor,
 * lent to the caller, closed by wc_release(); past its one file -ERANGE. */
static void
test_artifact_fd(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), held, fd;
	wc_build *b = NULL;

	start(f, 5000);
	assert_int_equal(wc_model_fd(NULL, 0), -EINVAL);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	fd = wc_model_fd(f->model, 0);
	assert_artifact_fd(fd, f->artifact_fd);
	/* The same descriptor each time, not a new one per call. */
	held = tu_count_fds();
	assert_int_equal(wc_model_fd(f->model, 0), fd);
	assert_int_equal(tu_count_fds(), held);
	assert_error(wc_model_fd(f->model, 1), -ERANGE, "file 1 of 1");
	/* The model's descriptor is the only one it holds (beside the
	 * client's connection, which stays). */
	wc_release(f->model);
	f->model = NULL;
	assert_int_equal(tu_count_fds(), held - 1);
	assert_int_equal(fcntl(fd, F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	finish(f, before);
	assert_int_equal(f->fake.releases, 1);
}

/* What a builder publishes is an artifact too, and keeps its descriptor;
 * the source it built from is a model of files with paths, and keeps none
 * (an ordinary model costs no descriptor), nor does a model of
 * wc_open_file(). */
static void
test_only_artifacts_keep_a_fd(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), connected, fd;
	static const uint64_t shape_w[] = { 4, 8 };
	float w[32] = { 0 };
	wc_tensor t = { "w", "F32", 2, shape_w, w, sizeof(w) };
	wc_model *file = NULL, *got = NULL;
	wc_build *b = NULL;
	char *path;

	script_derive(f, REPLY_BUILD);
	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &got, &b), 1);
	/* The client's socket and the fake's end of it: the source's file
	 * descriptor was closed once mapped. */
	connected = before + 2;
	assert_int_equal(tu_count_fds(), connected);
	assert_error(wc_model_fd(wc_build_source(b), 0), -ENOENT, "no descriptor kept");
	assert_int_equal(wc_build_publish(b, &t, 1, NULL, 0, &f->model), 0);
	fd = wc_model_fd(f->model, 0);
	assert_artifact_fd(fd, f->artifact_fd);
	assert_int_equal(tu_count_fds(), connected + 1);
	wc_release(f->model);
	f->model = NULL;
	assert_int_equal(tu_count_fds(), connected);

	path = tu_write(f->dir, "plain.safetensors", f->fake.published, f->fake.published_len);
	assert_int_equal(wc_open_file(path, &file), 0);
	assert_int_equal(tu_count_fds(), connected);
	assert_error(wc_model_fd(file, 0), -ENOENT, "no descriptor kept");
	wc_release(file);
	free(path);
	finish(f, before);
}

/* A child of fork() inherits the descriptor with the artifact; its
 * wc_release() closes the child's copy, not the parent's. */
static void
test_artifact_fd_in_forked_child(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), fd, status;
	wc_build *b = NULL;
	pid_t pid;

	start(f, 5000);
	assert_int_equal(wc_derive(f->client, MODEL, KEY, &f->model, &b), 0);
	fd = wc_model_fd(f->model, 0);
	assert_true(fd >= 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int code = 0;

		alarm(10);
		if (wc_model_fd(f->model, 0) != fd)
			code = 1;
		else if (fcntl(fd, F_GETFD) == -1)
			code = 2;
		wc_release(f->model);
		if (code == 0 && (fcntl(fd, F_GETFD) != -1 || errno != EBADF))
			code = 3;
		_exit(code);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_artifact_fd(wc_model_fd(f->model, 0), f->artifact_fd);
	check_w(f->model, "F32", ARTIFACT_SIZE, 5, 2);
	wc_release(f->model);
	f->model = NULL;
	assert_int_equal(fcntl(fd, F_GETFD), -1);
	finish(f, before);
	/* Only the parent told the daemon. */
	assert_int_equal(f->fake.releases, 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_artifact_attached, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wait_forever, setup, teardown),
		cmocka_unit_test_setup_teardown(test_changed_before_reply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_and_publish, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publish_each, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publish_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publish_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publish_bad_tensor_abandons, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publish_fd_not_memfd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_abandon, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_source_unmappable_abandons, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_artifact_unmappable_released, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_publish_after_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publish_races_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_abandon_races_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_wrong_fd_count, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_extra_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_artifact_of_two_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_ok_to_derive, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_to_attach, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_to_publish, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_hold_for_artifacts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_child_after_fork_with_the_lock_held, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_artifact_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_only_artifacts_keep_a_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_artifact_fd_in_forked_child, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
