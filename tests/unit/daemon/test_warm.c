/*
 * test_warm.c: unit tests of daemon/warm.c, the page-cache warming pool and
 * the residency helpers, on a real libuv loop and real files in /tmp.
 *
 * Every wait is "run the loop until a counter reaches a value", bounded by a
 * uv_timer deadline: no sleeps. Slow jobs (for cancel and close tests) use
 * the pool's pacing, whose waits cancel and close interrupt at once.
 *
 * Residency is checked with the module's own resident_mincore_bytes (mincore on
 * an untouched MAP_SHARED mapping of the file) and, where the kernel has it,
 * resident_cachestat_bytes (cachestat). Eviction with POSIX_FADV_DONTNEED works on
 * ext4 (this machine's /tmp); where it does not (tmpfs), the cold-cache
 * assertion is skipped with a printed reason and the rest still runs.
 *
 * Fault injection: this file defines pread() and sendfile() itself (the
 * executable's definitions win over libc's for warm.o from the static
 * wcdaemon library, as in test_fdpass.c). They forward to the kernel unless
 * a test asked for EINTR, EIO or (sendfile) EINVAL, and count their calls.
 *
 * Benchmark mode: `test_warm --bench FILE [RUNS]` compares, on a cold cache
 * each time, the pool's methods with `cat FILE > /dev/null` (see bench()).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "testutil.h"
#include "resident.h"
#include "warm.h"

#define MiB (1024u * 1024u)
#define BIG_SIZE (64u * MiB)
#define DEADLINE_MS 30000

/* ---- fault injection ---------------------------------------------------- */

/* Pool threads call pread() concurrently, hence the atomics. Tests that
 * inject a fault use a one-thread pool, so "the n-th call" is well defined. */
static struct {
	atomic_int eintr;      /* fail this many pread() calls with EINTR */
	atomic_int eio_after;  /* if > 0: the eio_after-th call from now fails with EIO */
	atomic_int sendfile_einval; /* fail this many sendfile() calls with EINVAL */
	atomic_int sendfile_eio;    /* fail this many sendfile() calls with EIO */
	atomic_int preads;     /* pread() calls */
	atomic_int sendfiles;  /* sendfile() calls */
	atomic_bool hang;      /* sendfile() and pread() wait while set: a hung server */
} fault;

/* A read of a filesystem whose server hangs: returns once fault.hang is
 * cleared. */
static void
maybe_hang(void)
{
	while (atomic_load(&fault.hang))
		usleep(1000);
}

ssize_t
sendfile(int out, int in, off_t *off, size_t n)
{
	atomic_fetch_add(&fault.sendfiles, 1);
	maybe_hang();
	if (atomic_load(&fault.sendfile_einval) > 0) {
		atomic_fetch_sub(&fault.sendfile_einval, 1);
		errno = EINVAL;
		return -1;
	}
	if (atomic_load(&fault.sendfile_eio) > 0) {
		atomic_fetch_sub(&fault.sendfile_eio, 1);
		errno = EIO;
		return -1;
	}
	return syscall(SYS_sendfile, out, in, off, n);
}

ssize_t
pread(int fd, void *buf, size_t n, off_t off)
{
	atomic_fetch_add(&fault.preads, 1);
	maybe_hang();
	if (atomic_load(&fault.eintr) > 0) {
		atomic_fetch_sub(&fault.eintr, 1);
		errno = EINTR;
		return -1;
	}
	if (atomic_load(&fault.eio_after) > 0 && atomic_fetch_sub(&fault.eio_after, 1) == 1) {
		errno = EIO;
		return -1;
	}
	return syscall(SYS_pread64, fd, buf, n, off);
}

static double now_s(void);

/* ---- fixture ------------------------------------------------------------ */

/* What the callbacks saw for one job. */
struct seen {
	int done_calls;
	int progress_calls;
	int progress_after_done;
	struct warm_result res;
	int order;              /* 1-based position among completions */
};

struct fixture {
	uv_loop_t loop;
	char *dir;
	char *big_path;         /* BIG_SIZE bytes, written once per test that needs it */
	int big_fd;
	void *big_map;
	struct warm_pool *pool;
	int completed;          /* done callbacks so far */
	int progressed;         /* progress callbacks so far */
	int jobs_progressed;    /* jobs that had at least one progress callback */
	struct seen seen[64];
	struct warm_job *jobs[64];
	bool cancel_on_progress; /* progress callback cancels its own job */
	int cancel_ret;          /* what that warm_cancel returned */
	int submit_in_done;      /* warm_submit's result when tried inside a done callback */
	bool try_submit_in_done;
	pthread_t loop_thread;   /* the test's own thread, for test_measure */
};

static int
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
static int
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
static bool
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
static void
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

/* The fixture of the test running now; the callbacks find it here because
 * the job cookie is an index (1-based) into fixture.seen. */
static struct fixture *cur;

static void
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
static void
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

static void
new_pool(struct fixture *f, unsigned threads, size_t chunk, enum warm_method method,
	uint64_t pace)
{
	struct warm_options o = {.threads = threads, .chunk_bytes = chunk, .method = method,
		.pace_bytes_per_sec = pace};

	assert_int_equal(warm_pool_new(&f->loop, &o, &f->pool), 0);
	cur = f;
}

/* Closes the pool the fixture holds (teardown then has nothing to close). */
static void
close_pool(struct fixture *f)
{
	warm_pool_close(f->pool);
	f->pool = NULL;
}

/* ---- warming a cold file ------------------------------------------------ */

/*
 * Asserts that [off, off + len) of the big file (mapped at base) is resident
 * after warming. Under memory pressure the kernel may reclaim a few pages
 * right after they were read (seen here with many sanitizer builds running
 * at once); cachestat reports those as evicted (workingset shadow entries,
 * which eviction by POSIX_FADV_DONTNEED does not leave). A shortfall that
 * reclaim explains is printed, not failed; any other shortfall fails.
 */
static void
assert_resident(struct fixture *f, const void *base, uint64_t off, uint64_t len)
{
	uint64_t resident = 0, cached = 0, evicted = 0;
	int r;

	assert_int_equal(resident_mincore_bytes(base, (size_t)len, &resident), 0);
	if (resident == len)
		return;
	r = resident_cachestat_bytes(f->big_fd, off, len, &cached, &evicted);
	if (r == 0 && evicted > 0 && resident + evicted >= len) {
		printf("# note: %llu of %llu bytes reclaimed under memory pressure after "
		       "warming\n", (unsigned long long)(len - resident),
			(unsigned long long)len);
		return;
	}
	fail_msg("%llu of %llu bytes resident after warming (cachestat %d: cached %llu, "
		 "evicted %llu)", (unsigned long long)resident, (unsigned long long)len, r,
		(unsigned long long)cached, (unsigned long long)evicted);
}

/*
 * Evicts the big file, checks it is cold (or says why not), warms it through
 * a pool with method, and checks the result and the residency afterwards.
 */
static void
warm_cold(struct fixture *f, enum warm_method method)
{
	uint64_t resident = 1, cached = 1;
	int r;

	make_big(f);
	new_pool(f, 2, 0, method, 0);
	assert_int_equal(resident_evict_range(f->big_fd, 0, 0), 0);
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	if (resident != 0)
		printf("# note: %s: %llu bytes still resident after POSIX_FADV_DONTNEED "
		       "(tmpfs/overlay?); not asserting a cold start\n",
			f->big_path, (unsigned long long)resident);
	r = resident_cachestat_bytes(f->big_fd, 0, 0, &cached, NULL);
	if (r == -ENOSYS)
		printf("# note: no cachestat(2) on this kernel (needs Linux 6.5)\n");
	else
		assert_int_equal(r, 0);
	if (r == 0 && resident == 0)
		assert_int_equal(cached, 0);

	submit(f, 1, f->big_fd, f->big_map, 0, BIG_SIZE, false);
	assert_int_equal(warm_pool_pending(f->pool), 1);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].done_calls, 1);
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(f->seen[0].res.bytes, BIG_SIZE);
	assert_true(f->seen[0].res.seconds >= 0.0);
	assert_int_equal(warm_pool_pending(f->pool), 0);

	assert_resident(f, f->big_map, 0, BIG_SIZE);
	if (r == 0) {
		uint64_t evicted;

		assert_int_equal(resident_cachestat_bytes(f->big_fd, 0, 0, &cached, &evicted), 0);
		assert_true(cached + evicted >= BIG_SIZE && cached <= BIG_SIZE);
		assert_int_equal(resident_cachestat_bytes(f->big_fd, 4096, 100, &cached, NULL), 0);
		assert_true(cached == 100 || evicted > 0);
	}
	/* And evict again: the helper the `evict` command will use. */
	assert_int_equal(resident_evict_range(f->big_fd, 0, 0), 0);
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	if (resident != 0)
		printf("# note: eviction not possible here; skipped the evict check\n");
}

static void
test_warm_pread(void **state)
{
	warm_cold(*state, WARM_PREAD);
}

static void
test_warm_fadvise(void **state)
{
	warm_cold(*state, WARM_FADVISE_PREAD);
}

static void
test_warm_sendfile(void **state)
{
	warm_cold(*state, WARM_SENDFILE);
}

/* A range in the middle of the file: only that range becomes resident. */
static void
test_warm_range(void **state)
{
	struct fixture *f = *state;
	uint64_t resident;

	make_big(f);
	new_pool(f, 1, 1 * MiB, 0, 0);
	assert_int_equal(resident_evict_range(f->big_fd, 0, 0), 0);
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	if (resident != 0) {
		printf("# skipped: cannot evict %s (tmpfs/overlay?)\n", f->big_path);
		return;
	}
	submit(f, 1, f->big_fd, (uint8_t *)f->big_map + 8 * MiB, 8 * MiB, 3 * MiB + 100, false);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(f->seen[0].res.bytes, 3 * MiB + 100);
	assert_resident(f, (uint8_t *)f->big_map + 8 * MiB, 8 * MiB, 3 * MiB + 100);
	/* Readahead may spill a little past the range, but not over the file. */
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	assert_true(resident < 16 * MiB);
}

/* ---- many jobs, order, exactly once ------------------------------------- */

static void
test_many_jobs(void **state)
{
	struct fixture *f = *state;
	enum { N = 64 };

	make_big(f);
	new_pool(f, 2, 256 * 1024, 0, 0);
	for (int i = 1; i <= N; i++)
		submit(f, i, f->big_fd, NULL, (uint64_t)(i - 1) * MiB, MiB, i % 2 == 0);
	assert_int_equal(warm_pool_pending(f->pool), N);
	assert_true(run_until(&f->loop, &f->completed, N));
	/* One more turn of the loop must not deliver anything twice. */
	uv_run(&f->loop, UV_RUN_NOWAIT);
	assert_int_equal(f->completed, N);
	for (int i = 0; i < N; i++) {
		assert_int_equal(f->seen[i].done_calls, 1);
		assert_int_equal(f->seen[i].res.status, 0);
		assert_int_equal(f->seen[i].res.bytes, MiB);
		assert_int_equal(f->seen[i].progress_after_done, 0);
		if (i % 2 == 0) /* odd cookies had no progress callback */
			assert_int_equal(f->seen[i].progress_calls, 0);
	}
	assert_int_equal(warm_pool_pending(f->pool), 0);
}

/* One thread takes jobs in submission order: FIFO. */
static void
test_fifo(void **state)
{
	struct fixture *f = *state;
	enum { N = 16 };

	make_big(f);
	new_pool(f, 1, 0, 0, 0);
	for (int i = 1; i <= N; i++)
		submit(f, i, f->big_fd, NULL, (uint64_t)(i - 1) * MiB, MiB, false);
	assert_true(run_until(&f->loop, &f->completed, N));
	for (int i = 0; i < N; i++)
		assert_int_equal(f->seen[i].order, i + 1);
}

/* ---- the owner's measure ------------------------------------------------ */

static atomic_int measure_calls;

/* Reports the range it was called for and that it ran on a pool thread. */
static void
record_measure(const struct warm_request *req, struct warm_measure *out)
{
	atomic_fetch_add(&measure_calls, 1);
	out->value = req->offset + req->length;
	out->how = pthread_equal(pthread_self(), cur->loop_thread) ? -1 : 7;
}

/* The measure callback runs once per job that read its whole range, on a
 * pool thread, before the done callback, which gets what it found; a job
 * that did not read it all gets zeros and no call. */
static void
test_measure(void **state)
{
	struct fixture *f = *state;
	struct warm_request req = {
		.fd = -1, .offset = 2 * MiB, .length = 3 * MiB, .cookie = (void *)(uintptr_t)1,
		.done = record_done, .measure = record_measure,
	};

	make_big(f);
	f->loop_thread = pthread_self();
	atomic_store(&measure_calls, 0);
	new_pool(f, 1, 1 * MiB, 0, 0);
	req.fd = f->big_fd;
	assert_int_equal(warm_submit(f->pool, &req, &f->jobs[0]), 0);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(atomic_load(&measure_calls), 1);
	assert_int_equal(f->seen[0].res.measure.value, 5 * MiB);
	assert_int_equal(f->seen[0].res.measure.how, 7);

	/* Past the end of the file: -ENODATA, not measured. */
	req.offset = BIG_SIZE - MiB;
	req.length = 2 * MiB;
	req.cookie = (void *)(uintptr_t)2;
	assert_int_equal(warm_submit(f->pool, &req, &f->jobs[1]), 0);
	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->seen[1].res.status, -ENODATA);
	assert_int_equal(atomic_load(&measure_calls), 1);
	assert_int_equal(f->seen[1].res.measure.value, 0);
	assert_int_equal(f->seen[1].res.measure.how, 0);
}

/* ---- cancellation ------------------------------------------------------- */

/*
 * One thread, paced to 16 MiB/s over a 64 MiB file (4 s if uncancelled).
 * Job 1 runs; job 2 waits in the queue and is cancelled at once; job 1 is
 * cancelled from its first progress callback, i.e. while it runs.
 */
static void
test_cancel(void **state)
{
	struct fixture *f = *state;

	make_big(f);
	new_pool(f, 1, 1 * MiB, 0, 16ull * MiB);
	f->cancel_on_progress = true;
	submit(f, 1, f->big_fd, NULL, 0, BIG_SIZE, true);
	submit(f, 2, f->big_fd, NULL, 0, BIG_SIZE, false);
	assert_int_equal(warm_cancel(f->pool, f->jobs[1]), 0);
	assert_int_equal(warm_cancel(f->pool, f->jobs[1]), -EALREADY);
	assert_int_equal(f->seen[1].done_calls, 0); /* never from inside warm_cancel */

	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->cancel_ret, 0);
	assert_int_equal(f->seen[0].done_calls, 1);
	assert_int_equal(f->seen[0].res.status, -ECANCELED);
	assert_true(f->seen[0].res.bytes >= MiB && f->seen[0].res.bytes < BIG_SIZE);
	assert_int_equal(f->seen[0].progress_after_done, 0);
	assert_int_equal(f->seen[1].done_calls, 1);
	assert_int_equal(f->seen[1].res.status, -ECANCELED);
	assert_int_equal(f->seen[1].res.bytes, 0);
	assert_true(f->seen[1].res.seconds == 0.0);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	assert_int_equal(f->completed, 2);
	assert_int_equal(warm_pool_pending(f->pool), 0);

	/* The pool still works after cancellations. */
	close_pool(f);
	new_pool(f, 1, 0, 0, 0);
	f->cancel_on_progress = false;
	submit(f, 3, f->big_fd, NULL, 0, MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 3));
	assert_int_equal(f->seen[2].res.status, 0);
}

/*
 * A job submitted while one thread is in a pacing wait and another is idle
 * runs on the idle one at once. (Both waited on one condition variable, and
 * warm_submit's signal could wake the pacing thread, which went back to its
 * wait: the job waited until the paced one ended, a minute here.) Paced to
 * 1 MiB/s in 64 KiB chunks, so the pacing thread waits again every 62 ms;
 * 20 small jobs, submitted at varied moments, must each end within 1 s.
 */
static void
test_submit_wakes_an_idle_thread(void **state)
{
	struct fixture *f = *state;

	make_big(f);
	new_pool(f, 2, 64 * 1024, 0, 1ull * MiB);
	submit(f, 1, f->big_fd, NULL, 0, BIG_SIZE, false);
	while (warm_job_bytes(f->jobs[0]) == 0)
		uv_sleep(1);
	for (int i = 2; i <= 21; i++) {
		double t0;

		uv_sleep((unsigned)(i * 37 % 70));
		t0 = now_s();
		submit(f, i, f->big_fd, NULL, 0, 4096, false);
		while (f->seen[i - 1].done_calls == 0 && now_s() - t0 < 5.0)
			uv_run(&f->loop, UV_RUN_NOWAIT);
		assert_int_equal(f->seen[i - 1].done_calls, 1);
		assert_int_equal(f->seen[i - 1].res.status, 0);
		assert_true(now_s() - t0 < 1.0);
	}
	assert_int_equal(f->seen[0].done_calls, 0); /* still paced */
	assert_int_equal(warm_cancel(f->pool, f->jobs[0]), 0);
	assert_true(run_until(&f->loop, &f->completed, 21));
}

/* ---- remote jobs ------------------------------------------------------- */

/* Submits [0, len) of fd as job number i, reading a remote filesystem. */
static void
submit_remote(struct fixture *f, int i, uint64_t len)
{
	struct warm_request req = {
		.fd = f->big_fd, .length = len, .cookie = (void *)(uintptr_t)i,
		.done = record_done, .remote = 1,
	};

	assert_int_equal(warm_submit(f->pool, &req, &f->jobs[i - 1]), 0);
}

/*
 * A remote server that hangs mid-read holds the threads reading it: so
 * with 2 threads at most 1 runs remote jobs. Two slow remote jobs (paced
 * to 4 MiB/s, 16 s each) and then a local one: the local one runs on the
 * other thread and ends first, while the second remote one still waits
 * (it never read a byte); once the first remote one ends, the second runs.
 */
static void
test_remote_jobs_leave_threads_to_local_ones(void **state)
{
	struct fixture *f = *state;

	make_big(f);
	new_pool(f, 2, 1 * MiB, 0, 4ull * MiB);
	submit_remote(f, 1, BIG_SIZE);
	submit_remote(f, 2, BIG_SIZE);
	submit(f, 3, f->big_fd, NULL, 0, MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[2].order, 1);
	assert_int_equal(f->seen[2].res.status, 0);
	assert_true(warm_job_bytes(f->jobs[0]) > 0);
	assert_int_equal(warm_job_bytes(f->jobs[1]), 0);
	/* The first remote job ends (cancelled): the second one runs. */
	assert_int_equal(warm_cancel(f->pool, f->jobs[0]), 0);
	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->seen[0].res.status, -ECANCELED);
	while (warm_job_bytes(f->jobs[1]) == 0)
		uv_sleep(10);
	assert_int_equal(warm_cancel(f->pool, f->jobs[1]), 0);
	assert_true(run_until(&f->loop, &f->completed, 3));
	assert_int_equal(f->seen[1].res.status, -ECANCELED);
	assert_true(f->seen[1].res.bytes > 0);

	/* 4 threads: 2 remote jobs run at once, a third waits. */
	close_pool(f);
	new_pool(f, 4, 1 * MiB, 0, 4ull * MiB);
	for (int i = 4; i <= 6; i++)
		submit_remote(f, i, BIG_SIZE);
	while (warm_job_bytes(f->jobs[3]) == 0 || warm_job_bytes(f->jobs[4]) == 0)
		uv_sleep(10);
	uv_sleep(300);
	assert_int_equal(warm_job_bytes(f->jobs[5]), 0);
	for (int i = 4; i <= 6; i++)
		assert_int_equal(warm_cancel(f->pool, f->jobs[i - 1]), 0);
	assert_true(run_until(&f->loop, &f->completed, 6));
}

/* Closing with jobs running and queued delivers every job once, at close,
 * and leaves nothing behind (teardown checks uv_loop_close; ASan leaks). */
static void
test_close_in_flight(void **state)
{
	struct fixture *f = *state;
	enum { N = 6 };

	make_big(f);
	new_pool(f, 2, 1 * MiB, 0, 16ull * MiB);
	for (int i = 1; i <= N; i++)
		submit(f, i, f->big_fd, NULL, 0, BIG_SIZE, true);
	/* Both threads have a job running (each reported progress). */
	assert_true(run_until(&f->loop, &f->jobs_progressed, 2));
	assert_int_equal(f->completed, 0);
	f->try_submit_in_done = true;
	close_pool(f);
	assert_int_equal(f->completed, N);
	assert_int_equal(f->submit_in_done, -ESHUTDOWN);
	for (int i = 0; i < N; i++) {
		assert_int_equal(f->seen[i].done_calls, 1);
		assert_int_equal(f->seen[i].res.status, -ECANCELED);
		assert_true(f->seen[i].res.bytes < BIG_SIZE);
	}
	/* Jobs 1 and 2 were running (two threads), the rest queued: close
	 * delivers the stopped running jobs first, then the queue in order. */
	assert_true(f->seen[0].res.bytes > 0 && f->seen[1].res.bytes > 0);
	assert_true(f->seen[0].order <= 2 && f->seen[1].order <= 2);
	for (int i = 2; i < N; i++) {
		assert_int_equal(f->seen[i].res.bytes, 0);
		assert_int_equal(f->seen[i].order, i + 1);
	}
}

/* A pool closed from inside a done callback, with jobs still queued. */
static struct fixture *close_from_cb;

static void
done_then_close(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	record_done(job, res, cookie);
	if (close_from_cb != NULL) {
		struct fixture *f = close_from_cb;
		close_from_cb = NULL;
		close_pool(f);
	}
}

/*
 * One of two threads in a read that does not return (its server hangs): a
 * close within 100 ms gives up after 100 ms and says one thread still runs
 * (the idle one is joined); no job is delivered, and the pool can still be
 * closed. Once the read returns, the close ends: the running job is
 * delivered as cancelled.
 */
static void
test_close_within_hung_read(void **state)
{
	struct fixture *f = *state;
	double t0, waited;

	make_big(f);
	new_pool(f, 2, 1 * MiB, 0, 0);
	atomic_store(&fault.hang, true);
	submit(f, 1, f->big_fd, NULL, 0, BIG_SIZE, false);
	while (atomic_load(&fault.sendfiles) + atomic_load(&fault.preads) == 0)
		usleep(1000);
	t0 = now_s();
	assert_int_equal(warm_pool_close_within(f->pool, 100), 1);
	waited = now_s() - t0;
	assert_true(waited >= 0.09 && waited < 5.0);
	assert_int_equal(warm_pool_close_within(f->pool, 0), 1);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	assert_int_equal(f->completed, 0);
	atomic_store(&fault.hang, false);
	assert_int_equal(warm_pool_close_within(f->pool, 10000), 0);
	f->pool = NULL;
	assert_int_equal(f->completed, 1);
	assert_int_equal(f->seen[0].res.status, -ECANCELED);
	assert_true(f->seen[0].res.bytes < BIG_SIZE);
}

static void
test_close_from_callback(void **state)
{
	struct fixture *f = *state;
	struct warm_request req = {.fd = -1, .length = MiB, .done = done_then_close};

	make_big(f);
	new_pool(f, 1, 0, 0, 0);
	req.fd = f->big_fd;
	for (int i = 1; i <= 4; i++) {
		req.cookie = (void *)(uintptr_t)i;
		assert_int_equal(warm_submit(f->pool, &req, NULL), 0);
	}
	close_from_cb = f;
	assert_true(run_until(&f->loop, &f->completed, 4));
	for (int i = 0; i < 4; i++)
		assert_int_equal(f->seen[i].done_calls, 1);
	assert_int_equal(f->seen[0].res.status, 0);
	assert_null(f->pool);
}

/* ---- errors ------------------------------------------------------------- */

static void
test_read_errors(void **state)
{
	struct fixture *f = *state;
	int pipefd[2];

	make_big(f);
	new_pool(f, 1, 1 * MiB, WARM_PREAD, 0);
	assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);

	submit(f, 1, pipefd[0], NULL, 0, MiB, false);               /* -ESPIPE */
	submit(f, 2, f->big_fd, NULL, BIG_SIZE - MiB, 2 * MiB, false); /* past EOF */
	submit(f, 3, f->big_fd, NULL, 0, 0, false);                  /* empty */
	assert_true(run_until(&f->loop, &f->completed, 3));
	assert_int_equal(f->seen[0].res.status, -ESPIPE);
	assert_int_equal(f->seen[0].res.bytes, 0);
	assert_int_equal(f->seen[1].res.status, -ENODATA);
	assert_int_equal(f->seen[1].res.bytes, MiB);
	assert_int_equal(f->seen[2].res.status, 0);
	assert_int_equal(f->seen[2].res.bytes, 0);

	/* EINTR is retried; EIO ends the job with what was read so far. */
	atomic_store(&fault.eintr, 3);
	submit(f, 4, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 4));
	assert_int_equal(f->seen[3].res.status, 0);
	assert_int_equal(f->seen[3].res.bytes, 4 * MiB);
	assert_int_equal(atomic_load(&fault.eintr), 0);
	atomic_store(&fault.eio_after, 3);
	submit(f, 5, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 5));
	assert_int_equal(f->seen[4].res.status, -EIO);
	assert_int_equal(f->seen[4].res.bytes, 2 * MiB);
	close(pipefd[0]);
	close(pipefd[1]);
}

/* The default method: sendfile errors end the job; a file that cannot be
 * spliced (EINVAL) is read with pread instead. */
static void
test_sendfile_fallback(void **state)
{
	struct fixture *f = *state;
	int pipefd[2];

	make_big(f);
	new_pool(f, 1, 1 * MiB, 0, 0);
	assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);

	submit(f, 1, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(atomic_load(&fault.sendfiles), 4); /* the default is sendfile */
	assert_int_equal(atomic_load(&fault.preads), 0);

	atomic_store(&fault.sendfile_einval, 1);
	submit(f, 2, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->seen[1].res.status, 0);
	assert_int_equal(f->seen[1].res.bytes, 4 * MiB);
	assert_int_equal(atomic_load(&fault.sendfiles), 5);
	assert_int_equal(atomic_load(&fault.preads), 4);

	atomic_store(&fault.sendfile_eio, 1);
	submit(f, 3, f->big_fd, NULL, 0, 4 * MiB, false);
	submit(f, 4, pipefd[0], NULL, 0, MiB, false); /* no pread(2) on a pipe */
	submit(f, 5, f->big_fd, NULL, BIG_SIZE - MiB, 2 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 5));
	assert_int_equal(f->seen[2].res.status, -EIO);
	assert_int_equal(f->seen[2].res.bytes, 0);
	assert_int_equal(f->seen[3].res.status, -ESPIPE);
	assert_int_equal(f->seen[4].res.status, -ENODATA);
	assert_int_equal(f->seen[4].res.bytes, MiB);
	close(pipefd[0]);
	close(pipefd[1]);
}

static void
test_invalid(void **state)
{
	struct fixture *f = *state;
	struct warm_options o = {0};
	struct warm_pool *p = (struct warm_pool *)&o;
	struct warm_request req = {.fd = 0, .length = 1, .done = record_done,
		.cookie = (void *)1};

	o.threads = WARM_MAX_THREADS + 1;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	o.threads = 1;
	o.chunk_bytes = 4096;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	o.chunk_bytes = (size_t)WARM_MAX_CHUNK + 1;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	o.chunk_bytes = 0;
	o.method = (enum warm_method)99;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	assert_ptr_equal(p, (struct warm_pool *)&o); /* untouched on failure */
	assert_int_equal(warm_pool_new(NULL, NULL, &p), -EINVAL);

	new_pool(f, 1, 0, 0, 0);
	req.fd = -1;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.fd = 0;
	req.done = NULL;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.done = record_done;
	req.offset = UINT64_MAX;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.offset = (uint64_t)INT64_MAX;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.offset = 0;
	req.base = (void *)(uintptr_t)12345;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	assert_int_equal(warm_pool_pending(f->pool), 0);
	assert_int_equal(warm_cancel(f->pool, NULL), -EINVAL);
	assert_int_equal(resident_evict_range(-1, 0, 0), -EINVAL);
	assert_int_equal(resident_evict_range(0, UINT64_MAX, 0), -EINVAL);
	warm_pool_close(NULL);
}

/* ---- residency, pinning ------------------------------------------------- */

static void
test_resident_anonymous(void **state)
{
	size_t len = 1 * MiB; /* below a huge page, so THP cannot fill it */
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t n = 1;

	(void)state;
	assert_true(p != MAP_FAILED);
	assert_int_equal(resident_mincore_bytes(p, len, &n), 0);
	assert_int_equal(n, 0);
	memset(p, 1, len / 2);
	assert_int_equal(resident_mincore_bytes(p, len, &n), 0);
	assert_int_equal(n, len / 2);
	/* A length that ends inside a resident page counts only its bytes. */
	assert_int_equal(resident_mincore_bytes(p, 100, &n), 0);
	assert_int_equal(n, 100);
	assert_int_equal(resident_mincore_bytes(p + 1, 100, &n), -EINVAL);
	assert_int_equal(resident_mincore_bytes(p, len, NULL), -EINVAL);
	assert_int_equal(munmap(p + len / 2, len / 2), 0);
	assert_int_equal(resident_mincore_bytes(p, len, &n), -ENOMEM); /* not all mapped */
	assert_int_equal(munmap(p, len / 2), 0);
}

/* Runs fn in a forked child and returns its exit status (cmocka asserts
 * must not run in the child). */
static int
in_child(int (*fn)(void))
{
	int st;
	pid_t pid;

	fflush(NULL); /* or the child's copy of buffered output appears twice */
	pid = fork();

	assert_true(pid >= 0);
	if (pid == 0)
		_exit(fn());
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_SKIP = 77, CHILD_FAIL = 1 };

static int
set_memlock(rlim_t soft, rlim_t hard)
{
	struct rlimit rl = {.rlim_cur = soft, .rlim_max = hard};

	return setrlimit(RLIMIT_MEMLOCK, &rl);
}

/* Root becomes nobody, which drops its capabilities (CAP_IPC_LOCK):
 * 0, or -1 when it could not. */
static int
drop_root(void)
{
	struct passwd *pw;
	uid_t uid;

	if (geteuid() != 0)
		return 0;
	pw = getpwnam("nobody");
	uid = pw != NULL ? pw->pw_uid : 65534;
	return setgid(uid) != 0 || setuid(uid) != 0 ? -1 : 0;
}

/* As root (CAP_IPC_LOCK), RLIMIT_MEMLOCK 0 does not stop mlock. */
static int
child_root_ignores_limit(void)
{
	void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED || set_memlock(0, 0) != 0)
		return CHILD_FAIL;
	return resident_pin_range(p, 65536) == 0 ? CHILD_OK : CHILD_FAIL;
}

/* Without CAP_IPC_LOCK: limit 0 gives -EPERM, a small limit -ENOMEM. Root
 * drops its capabilities by becoming nobody. */
static int
child_limited(void)
{
	size_t len = 1 * MiB;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int r0, r1;

	/* Soft limit 0 now; the hard limit leaves room to raise it to one page
	 * later without privilege. */
	if (p == MAP_FAILED || set_memlock(0, 4096) != 0)
		return CHILD_FAIL;
	if (drop_root() != 0)
		return CHILD_SKIP;
	r0 = resident_pin_range(p, len);
	if (set_memlock(4096, 4096) != 0)
		return CHILD_FAIL;
	r1 = resident_pin_range(p, len);
	if (r0 != -EPERM || r1 != -ENOMEM) {
		fprintf(stderr, "child: rlimit 0 -> %d (want %d), rlimit 4096 -> %d (want %d)\n",
			r0, -EPERM, r1, -ENOMEM);
		return CHILD_FAIL;
	}
	return CHILD_OK;
}

/* Does the cause resident_refusal_read() and _cause() give for a refusal
 * of err hold every one of the NULL-terminated words? Prints it either way. */
static int
cause_says(int err, uint64_t bytes, struct resident_refusal *r, ...)
{
	char cause[480];
	const char *word;
	va_list ap;
	int ok = 1;

	resident_refusal_read(err, bytes, r);
	resident_refusal_cause(r, cause, sizeof(cause));
	printf("# %s\n", cause);
	fflush(stdout); /* the child ends with _exit */
	va_start(ap, r);
	while ((word = va_arg(ap, const char *)) != NULL)
		if (strstr(cause, word) == NULL) {
			fprintf(stderr, "child: the cause lacks \"%s\": %s\n", word, cause);
			ok = 0;
		}
	va_end(ap);
	return ok;
}

/* The real refusals, told apart by what the process reads about itself:
 * RLIMIT_MEMLOCK 0 without CAP_IPC_LOCK (EPERM), then a limit smaller than
 * what is asked (ENOMEM, with the limit, the bytes and the LimitMEMLOCK=
 * that would do). */
static int
child_refusal_causes(void)
{
	size_t len = 1 * MiB;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct resident_refusal r;
	int err;

	if (p == MAP_FAILED || set_memlock(0, 4096) != 0)
		return CHILD_FAIL;
	if (drop_root() != 0)
		return CHILD_SKIP;
	err = resident_pin_range(p, len);
	if (err != -EPERM ||
		!cause_says(err, len, &r, "mlock: EPERM: RLIMIT_MEMLOCK is 0", "CAP_IPC_LOCK",
			"LimitMEMLOCK=", NULL) ||
		!r.limit_known || r.limit != 0 || r.ipc_lock || !r.locked_known || r.locked != 0)
		return CHILD_FAIL;
	if (set_memlock(4096, 4096) != 0 || resident_pin_range(p, 4096) != 0)
		return CHILD_FAIL;
	/* One page is locked now: the limit is full. */
	err = resident_pin_range((char *)p + 4096, len - 4096);
	if (err != -ENOMEM ||
		!cause_says(err, len - 4096, &r, "mlock: ENOMEM: RLIMIT_MEMLOCK is 4096 bytes",
			"4096 bytes were locked and 1044480 more asked",
			"LimitMEMLOCK= in wcached.service (or ulimit -l) to at least 1M", NULL) ||
		r.locked != 4096)
		return CHILD_FAIL;
	return CHILD_OK;
}

/* A seccomp filter that refuses mlock(2) with EPERM, as the unit's
 * SystemCallFilter= or a container's does: the cause names the filter and
 * clears RLIMIT_MEMLOCK, which is high enough. */
static int
child_seccomp_refuses(void)
{
	struct sock_filter code[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mlock, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(code) / sizeof(code[0]), .filter = code };
	void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct resident_refusal r;
	int err;

	if (p == MAP_FAILED || set_memlock(1 * MiB, 1 * MiB) != 0 ||
		prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
		prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
		return CHILD_FAIL;
	err = resident_pin_range(p, 65536);
	if (err != -EPERM ||
		!cause_says(err, 65536, &r, "mlock: EPERM: forbidden by a seccomp filter",
			"not by RLIMIT_MEMLOCK (1048576 bytes)", "@memlock", NULL) ||
		r.seccomp != 2)
		return CHILD_FAIL;
	return CHILD_OK;
}

/* The causes no test process can provoke, from the facts alone. */
static void
test_refusal_causes(void **state)
{
	struct resident_refusal r = { .err = -ENOMEM, .bytes = 1 * MiB, .limit_known = 1,
		.limit = UINT64_MAX, .locked_known = 1, .seccomp = 2 };
	char cause[480];
	int st;

	(void)state;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "ENOMEM, not from RLIMIT_MEMLOCK (unlimited)"));
	r.limit = 8 * MiB; /* within the limit: not the limit either */
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "not from RLIMIT_MEMLOCK (8388608 bytes)"));
	r.limit = 4096;
	r.ipc_lock = 1; /* root: the limit does not apply */
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "not from RLIMIT_MEMLOCK (lifted by CAP_IPC_LOCK)"));
	r.err = -EPERM;
	r.limit = 0; /* EPERM with CAP_IPC_LOCK: not the limit but a filter */
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "EPERM: forbidden by a seccomp filter"));
	r.ipc_lock = 0;
	r.limit = 8 * MiB;
	r.seccomp = 0;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "no seccomp filter applies to wcached: a security module"));
	r.err = -EAGAIN;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "mlock: EAGAIN: part of the range could not be locked"));
	r.err = -EIO;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "mlock: errno 5: "));
	r.err = -ENOMEM;
	r.limit = 4096;
	r.locked_known = 0;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "RLIMIT_MEMLOCK is 4096 bytes, 1048576 bytes asked"));
	resident_refusal_cause(&r, cause, 8); /* cut short, terminated */
	assert_string_equal(cause, "mlock: ");

	/* The real ones. */
	st = in_child(child_refusal_causes);
	if (st == CHILD_SKIP)
		printf("# skipped: could not drop root to refuse mlock by RLIMIT_MEMLOCK\n");
	else
		assert_int_equal(st, CHILD_OK);
	assert_int_equal(in_child(child_seccomp_refuses), CHILD_OK);
}

static void
test_pin(void **state)
{
	struct fixture *f = *state;
	size_t len = 64 * 1024;
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t n;
	struct rlimit rl;
	int st;

	assert_true(p != MAP_FAILED);
	assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
	if (geteuid() != 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < len)
		printf("# note: RLIMIT_MEMLOCK %llu < %zu; small pin not testable\n",
			(unsigned long long)rl.rlim_cur, len);
	else {
		assert_int_equal(resident_pin_range(p, len), 0);
		/* mlock faults the pages in. */
		assert_int_equal(resident_mincore_bytes(p, len, &n), 0);
		assert_int_equal(n, len);
		assert_int_equal(resident_unpin_range(p, len), 0);
	}
	/* An unaligned range is widened to whole pages, as mlock does. */
	assert_int_equal(resident_pin_range(p + 1, len - 1), 0);
	assert_int_equal(resident_unpin_range(p + 1, len - 1), 0);
	assert_int_equal(munmap(p, len), 0);

	/* A pinned file range of the big file. */
	make_big(f);
	if (geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= MiB) {
		assert_int_equal(resident_pin_range(f->big_map, MiB), 0);
		assert_int_equal(resident_mincore_bytes(f->big_map, MiB, &n), 0);
		assert_int_equal(n, MiB);
		assert_int_equal(resident_unpin_range(f->big_map, MiB), 0);
	}

	if (geteuid() == 0) {
		printf("# root: CAP_IPC_LOCK bypasses RLIMIT_MEMLOCK\n");
		assert_int_equal(in_child(child_root_ignores_limit), CHILD_OK);
	}
	st = in_child(child_limited);
	if (st == CHILD_SKIP)
		printf("# skipped: could not drop root to test RLIMIT_MEMLOCK\n");
	else
		assert_int_equal(st, CHILD_OK);
}

/* ---- benchmark mode ----------------------------------------------------- */

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* User + system CPU seconds of this process (who = RUSAGE_SELF, all
 * threads) or of its waited-for children (RUSAGE_CHILDREN). */
static double
cpu_s(int who)
{
	struct rusage ru;

	getrusage(who, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int bench_done;
static struct warm_result bench_res;

static void
bench_on_done(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	bench_res = *res;
	bench_done = 1;
}

/* Warms the file through a fresh one-thread pool; returns wall seconds from
 * submit to the done callback (and CPU seconds in *cpu), or -1. */
static double
bench_pool(int fd, uint64_t size, enum warm_method method, size_t chunk, double *cpu)
{
	uv_loop_t loop;
	struct warm_pool *pool;
	struct warm_options o = {.threads = 1, .chunk_bytes = chunk, .method = method};
	struct warm_request req = {.fd = fd, .length = size, .done = bench_on_done};
	double t0, c0, t;

	if (uv_loop_init(&loop) != 0 || warm_pool_new(&loop, &o, &pool) != 0)
		return -1;
	bench_done = 0;
	c0 = cpu_s(RUSAGE_SELF);
	t0 = now_s();
	if (warm_submit(pool, &req, NULL) != 0)
		return -1;
	while (!bench_done)
		uv_run(&loop, UV_RUN_ONCE);
	t = now_s() - t0;
	*cpu = cpu_s(RUSAGE_SELF) - c0;
	warm_pool_close(pool);
	uv_run(&loop, UV_RUN_DEFAULT);
	if (uv_loop_close(&loop) != 0 || bench_res.status != 0 || bench_res.bytes != size)
		return -1;
	return t;
}

/* Runs `cat path` with stdout on /dev/null; returns wall seconds (and the
 * child's CPU seconds in *cpu) or -1. */
static double
bench_cat(const char *path, double *cpu)
{
	posix_spawn_file_actions_t fa;
	char *argv[] = {"cat", (char *)(uintptr_t)path, NULL};
	extern char **environ;
	double c0 = cpu_s(RUSAGE_CHILDREN);
	double t0 = now_s(), t;
	pid_t pid;
	int st;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	if (posix_spawnp(&pid, "cat", &fa, NULL, argv, environ) != 0)
		return -1;
	posix_spawn_file_actions_destroy(&fa);
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -1;
	t = now_s() - t0;
	*cpu = cpu_s(RUSAGE_CHILDREN) - c0;
	return t;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * `test_warm --bench FILE [RUNS]`: for RUNS rounds (default 5), for each
 * contender in turn, evicts FILE, checks it is cold, times reading it whole,
 * checks it is resident; prints the median wall and CPU time per contender.
 * Contenders run interleaved so drift (other load) affects them alike.
 */
static int
bench(const char *path, int runs)
{
	static const struct {
		const char *name;
		enum warm_method method;
		size_t chunk;
	} c[] = {
		{"warm sendfile 8MiB (default)", WARM_SENDFILE, 8 * MiB},
		{"warm sendfile 1MiB", WARM_SENDFILE, 1 * MiB},
		{"warm pread 8MiB", WARM_PREAD, 8 * MiB},
		{"warm pread 1MiB", WARM_PREAD, 1 * MiB},
		{"warm pread 32MiB", WARM_PREAD, 32 * MiB},
		{"warm fadvise+pread 8MiB", WARM_FADVISE_PREAD, 8 * MiB},
		{"cat FILE > /dev/null", 0, 0},
	};
	enum { NC = sizeof(c) / sizeof(c[0]), MAXRUNS = 50 };
	static double t[NC][MAXRUNS], cpu[NC][MAXRUNS];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	void *map;
	uint64_t res;

	if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
		fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (runs < 1 || runs > MAXRUNS)
		runs = 5;
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return 1;
	printf("bench: %s, %lld bytes, %d runs, cold cache before each\n", path,
		(long long)st.st_size, runs);
	for (int r = 0; r < runs; r++) {
		for (int i = 0; i < NC; i++) {
			double s;

			if (resident_evict_range(fd, 0, 0) != 0 ||
				resident_mincore_bytes(map, (size_t)st.st_size, &res) != 0)
				return 1;
			if (res != 0) {
				fprintf(stderr, "bench: %s: %llu bytes still cached after eviction; "
						"cannot measure a cold read here\n",
					path, (unsigned long long)res);
				return 1;
			}
			s = c[i].chunk != 0 ? bench_pool(fd, (uint64_t)st.st_size, c[i].method,
						      c[i].chunk, &cpu[i][r])
					    : bench_cat(path, &cpu[i][r]);
			if (s < 0 || resident_mincore_bytes(map, (size_t)st.st_size, &res) != 0) {
				fprintf(stderr, "bench: %s failed (status %d, %llu bytes)\n",
					c[i].name, bench_res.status,
					(unsigned long long)bench_res.bytes);
				return 1;
			}
			if (res != (uint64_t)st.st_size)
				printf("bench: %s: only %llu bytes resident afterwards\n", c[i].name,
					(unsigned long long)res);
			t[i][r] = s;
		}
	}
	for (int i = 0; i < NC; i++) {
		double med = median(t[i], runs);

		printf("%-29s median %.3f s %6.0f MiB/s  (min %.3f, max %.3f)  CPU %.3f s\n",
			c[i].name, med, (double)st.st_size / med / MiB, t[i][0], t[i][runs - 1],
			median(cpu[i], runs));
	}
	munmap(map, (size_t)st.st_size);
	close(fd);
	return 0;
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_warm_pread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_fadvise, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_sendfile, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_range, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_jobs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fifo, setup, teardown),
		cmocka_unit_test_setup_teardown(test_measure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remote_jobs_leave_threads_to_local_ones, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_close_in_flight, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_from_callback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_within_hung_read, setup, teardown),
		cmocka_unit_test_setup_teardown(test_submit_wakes_an_idle_thread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sendfile_fallback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_invalid, setup, teardown),
		cmocka_unit_test(test_resident_anonymous),
		cmocka_unit_test_setup_teardown(test_pin, setup, teardown),
		cmocka_unit_test(test_refusal_causes),
	};

	if (argc >= 3 && strcmp(argv[1], "--bench") == 0)
		return bench(argv[2], argc >= 4 ? atoi(argv[3]) : 5);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
