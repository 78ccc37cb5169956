/*
 * test_warm_jobs.c: unit tests of daemon/warm.c, the page-cache warming
 * pool, its jobs: many jobs each delivered exactly once, one thread taking
 * them in order, cancellation of queued and running jobs, a submit waking
 * an idle thread, remote jobs held to their share of the threads (and a
 * second thread for local ones where prefetch_threads is 1), and
 * closing the pool with jobs in flight, from a callback and within a read
 * that hangs; on a real libuv loop and real files in /tmp
 * (warm_fixture.h).
 *
 * Slow jobs (for cancel and close tests) use the pool's pacing, whose waits
 * cancel and close interrupt at once. A hung server is warm_fault.c's
 * pread() and sendfile() waiting while fault.hang is set.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "warm.h"
#include "warm_fixture.h"

/* ---- many jobs, order, exactly once ------------------------------------- */

static void
test_many_jobs(void **state)
{
	struct fixture *f = *state;
	enum { N = 64 };

	make_big(f);
	new_pool(f, 2, 256 * KiB, 0, 0);
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
	new_pool(f, 2, 64 * KiB, 0, 1ull * MiB);
	submit(f, 1, f->big_fd, NULL, 0, BIG_SIZE, false);
	wait_reading(f->jobs[0]);
	for (int i = 2; i <= 21; i++) {
		double t0;

		uv_sleep((unsigned)(i * 37 % 70));
		t0 = tu_now();
		submit(f, i, f->big_fd, NULL, 0, 4096, false);
		while (f->seen[i - 1].done_calls == 0 && tu_now() - t0 < 5.0)
			uv_run(&f->loop, UV_RUN_NOWAIT);
		assert_int_equal(f->seen[i - 1].done_calls, 1);
		assert_int_equal(f->seen[i - 1].res.status, 0);
		assert_true(tu_now() - t0 < 1.0);
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
	/* Reading before the others come (under load the local job could
	 * otherwise end before the first remote one had read a byte). */
	wait_reading(f->jobs[0]);
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
	wait_reading(f->jobs[1]);
	assert_int_equal(warm_cancel(f->pool, f->jobs[1]), 0);
	assert_true(run_until(&f->loop, &f->completed, 3));
	assert_int_equal(f->seen[1].res.status, -ECANCELED);
	assert_true(f->seen[1].res.bytes > 0);

	/* 4 threads: 2 remote jobs run at once, a third waits. */
	close_pool(f);
	new_pool(f, 4, 1 * MiB, 0, 4ull * MiB);
	for (int i = 4; i <= 6; i++)
		submit_remote(f, i, BIG_SIZE);
	wait_reading(f->jobs[3]);
	wait_reading(f->jobs[4]);
	uv_sleep(300);
	assert_int_equal(warm_job_bytes(f->jobs[5]), 0);
	for (int i = 4; i <= 6; i++)
		assert_int_equal(warm_cancel(f->pool, f->jobs[i - 1]), 0);
	assert_true(run_until(&f->loop, &f->completed, 6));
}

/*
 * prefetch_threads = 1: remote work's share would be the only thread, so the
 * pool has a second one, and local jobs still run one at a time: of two
 * local jobs (2 MiB each, paced to 4 MiB/s: 0.25 s), the second waits for
 * the first. Then a slow remote job (a server that hangs) runs, a local
 * one ends while it does, and a second remote job waits.
 */
static void
test_one_thread_keeps_one_for_local_jobs(void **state)
{
	struct fixture *f = *state;

	make_big(f);
	new_pool(f, 1, 1 * MiB, 0, 4ull * MiB);
	submit(f, 1, f->big_fd, NULL, 0, 2 * MiB, false);
	submit(f, 2, f->big_fd, NULL, 0, 2 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(f->seen[1].res.status, 0);
	assert_true(f->seen[1].res.queued_seconds >= 0.2);

	submit_remote(f, 3, BIG_SIZE);
	wait_reading(f->jobs[2]);
	submit(f, 4, f->big_fd, NULL, 0, 2 * MiB, false);
	submit_remote(f, 5, BIG_SIZE);
	assert_true(run_until(&f->loop, &f->completed, 3));
	assert_int_equal(f->seen[3].order, 3);
	assert_int_equal(f->seen[3].res.status, 0);
	assert_int_equal(f->seen[2].done_calls, 0);
	assert_int_equal(warm_job_bytes(f->jobs[4]), 0);
	assert_int_equal(warm_cancel(f->pool, f->jobs[2]), 0);
	assert_int_equal(warm_cancel(f->pool, f->jobs[4]), 0);
	assert_true(run_until(&f->loop, &f->completed, 5));
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
	t0 = tu_now();
	while (atomic_load(&fault.sendfiles) + atomic_load(&fault.preads) == 0) {
		assert_true(tu_now() - t0 < 10.0);
		usleep(1000);
	}
	t0 = tu_now();
	assert_int_equal(warm_pool_close_within(f->pool, 100), 1);
	waited = tu_now() - t0;
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_many_jobs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fifo, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remote_jobs_leave_threads_to_local_ones, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_one_thread_keeps_one_for_local_jobs, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_close_in_flight, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_from_callback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_within_hung_read, setup, teardown),
		cmocka_unit_test_setup_teardown(test_submit_wakes_an_idle_thread, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
