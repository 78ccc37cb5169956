/*
 * warm_fixture.c: the fixture of the tests of the warming pool and the
 * residency helpers (see warm_fixture.h).
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "testutil.h"
#include "warm_fixture.h"

#define DEADLINE_MS 30000

struct warm_fault fault;
struct fixture *cur;

int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	f->dir = tu_tmpdir();
	f->big_fd = -1;
	f->cancel_ret = 1;
	f->submit_in_done = 1;
	memset(&fault, 0, sizeof(fault)); /* no pool thread runs yet */
	*state = f;
	return 0;
}

/* Runs the loop until every handle is closed, then checks that the loop
 * closes: a pool that leaked its async handle would fail here. */
int
teardown(void **state)
{
	struct fixture *f = *state;

	warm_pool_close(f->pool);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	if (f->big_map != NULL)
		munmap(f->big_map, BIG_SIZE);
	if (f->big_fd >= 0)
		close(f->big_fd);
	free(f->big_path);
	tu_rmtree(f->dir);
	free(f);
	return 0;
}

static void
on_deadline(uv_timer_t *t)
{
	*(bool *)t->data = true;
}

static void
on_timer_closed(uv_handle_t *h)
{
	*(bool *)h->data = true;
}

/* Runs the loop until *counter >= target or the deadline passes; returns
 * whether the target was reached. The timer is closed before returning. */
bool
run_until(uv_loop_t *loop, const int *counter, int target)
{
	uv_timer_t timer;
	bool expired = false, closed = false;

	assert_int_equal(uv_timer_init(loop, &timer), 0);
	timer.data = &expired;
	assert_int_equal(uv_timer_start(&timer, on_deadline, DEADLINE_MS, 0), 0);
	while (*counter < target && !expired)
		uv_run(loop, UV_RUN_ONCE);
	timer.data = &closed;
	uv_close((uv_handle_t *)&timer, on_timer_closed);
	while (!closed)
		uv_run(loop, UV_RUN_NOWAIT);
	return *counter >= target;
}

/* Creates the BIG_SIZE test file (pattern bytes, flushed to disk so that
 * eviction can drop it), opens it read-only and maps it without touching. */
void
make_big(struct fixture *f)
{
	uint8_t *buf = malloc(MiB);
	char *path;
	int fd;

	assert_non_null(buf);
	for (size_t i = 0; i < MiB; i++)
		buf[i] = (uint8_t)(i * 7);
	assert_true(asprintf(&path, "%s/big.bin", f->dir) > 0);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	for (unsigned i = 0; i < BIG_SIZE / MiB; i++)
		assert_int_equal(write(fd, buf, MiB), (ssize_t)MiB);
	assert_int_equal(fdatasync(fd), 0);
	close(fd);
	free(buf);
	f->big_path = path;
	f->big_fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(f->big_fd >= 0);
	f->big_map = mmap(NULL, BIG_SIZE, PROT_READ, MAP_SHARED, f->big_fd, 0);
	assert_true(f->big_map != MAP_FAILED);
}

static struct seen *
seen_of(struct fixture *f, void *cookie)
{
	return &f->seen[(uintptr_t)cookie - 1];
}

void
record_done(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	struct seen *s = seen_of(cur, cookie);

	assert_ptr_equal(warm_job_cookie(job), cookie);
	s->done_calls++;
	s->res = *res;
	s->order = ++cur->completed;
	if (cur->try_submit_in_done) {
		struct warm_request req = {.fd = cur->big_fd, .length = 1, .cookie = cookie,
			.done = record_done};
		cur->submit_in_done = warm_submit(cur->pool, &req, NULL);
	}
}

static void
record_progress(struct warm_job *job, uint64_t bytes, uint64_t length, void *cookie)
{
	struct seen *s = seen_of(cur, cookie);

	if (s->done_calls > 0)
		s->progress_after_done++;
	assert_true(bytes > 0 && bytes <= length);
	assert_int_equal(warm_job_bytes(job), warm_job_bytes(job)); /* callable */
	if (s->progress_calls++ == 0)
		cur->jobs_progressed++;
	cur->progressed++;
	if (cur->cancel_on_progress && cur->cancel_ret == 1)
		cur->cancel_ret = warm_cancel(cur->pool, job);
}

/* Submits [off, off + len) of fd as job number i (1-based cookie). */
void
submit(struct fixture *f, int i, int fd, const void *base, uint64_t off, uint64_t len,
	bool progress)
{
	struct warm_request req = {
		.fd = fd, .offset = off, .length = len, .base = base,
		.cookie = (void *)(uintptr_t)i, .done = record_done,
		.progress = progress ? record_progress : NULL,
	};

	assert_int_equal(warm_submit(f->pool, &req, &f->jobs[i - 1]), 0);
}

void
new_pool(struct fixture *f, unsigned threads, size_t chunk, enum warm_method method,
	uint64_t pace)
{
	struct warm_options o = {.threads = threads, .chunk_bytes = chunk, .method = method,
		.pace_bytes_per_sec = pace};

	assert_int_equal(warm_pool_new(&f->loop, &o, &f->pool), 0);
	cur = f;
}

/* Closes the pool the fixture holds (teardown then has nothing to close). */
void
close_pool(struct fixture *f)
{
	warm_pool_close(f->pool);
	f->pool = NULL;
}

void
wait_reading(struct warm_job *j)
{
	double t0 = tu_now();

	while (warm_job_bytes(j) == 0) {
		assert_true(tu_now() - t0 < 10.0);
		uv_sleep(5);
	}
}
