/*
 * test_workq.c: the work queue with remote filesystem work held to a share
 * of it (daemon/workq.h), on a real libuv loop and pool of 8 threads, with
 * jobs that block until the test lets them go (a hung server).
 */
#include <errno.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "workq.h"

#define FS_A 100u
#define FS_B 200u

struct job {
	struct workq_job w;
	sem_t gate;        /* posted by the test: the job's "server" answers */
	int blocks;
	int ran, after_status, after_called;
	int order;         /* when its after ran */
};

static int afters;

static void
run(struct workq_job *w)
{
	struct job *j = w->arg;

	if (j->blocks)
		sem_wait(&j->gate);
	j->ran = 1;
}

static void
after(struct workq_job *w, int status)
{
	struct job *j = w->arg;

	j->after_called++;
	j->after_status = status;
	j->order = ++afters;
}

static void
job_init(struct job *j, int blocks)
{
	memset(j, 0, sizeof(*j));
	sem_init(&j->gate, 0, 0);
	j->blocks = blocks;
	j->w.arg = j;
}

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Runs the loop until *flag is set (10 s at most). */
static void
run_until(uv_loop_t *loop, const int *flag)
{
	double end = now() + 10;
	struct timespec ms = { 0, 1000000 };

	while (!*flag && now() < end) {
		uv_run(loop, UV_RUN_NOWAIT);
		nanosleep(&ms, NULL);
	}
	assert_true(*flag);
}

static void
test_local_work_goes_on_while_remote_work_hangs(void **state)
{
	uv_loop_t loop;
	struct workq q;
	struct job remote[6], local[6];

	(void)state;
	assert_int_equal(uv_loop_init(&loop), 0);
	workq_init(&q, &loop, 60000);
	assert_int_equal(q.threads, 8);
	assert_int_equal(q.remote_limit, 4);
	assert_int_equal(q.per_fs_limit, 2);
	/* Six jobs on two hung filesystems: 2 run on each, 2 wait. */
	for (int i = 0; i < 6; i++) {
		job_init(&remote[i], 1);
		assert_int_equal(workq_submit(&q, &remote[i].w, i < 3 ? FS_A : FS_B, "remote",
					 run, after), 0);
	}
	assert_int_equal(q.remote_running, 4);
	assert_int_equal(q.remote_waiting, 2);
	/* Local work is never held: six of them run and end meanwhile. */
	for (int i = 0; i < 6; i++) {
		job_init(&local[i], 0);
		assert_int_equal(workq_submit(&q, &local[i].w, WORKQ_LOCAL, NULL, run, after), 0);
	}
	for (int i = 0; i < 6; i++)
		run_until(&loop, &local[i].after_called);
	for (int i = 0; i < 6; i++)
		assert_int_equal(remote[i].after_called, 0);
	/* FS_A answers its first job: its third (waiting) starts, not FS_B's. */
	sem_post(&remote[0].gate);
	run_until(&loop, &remote[0].after_called);
	assert_int_equal(q.remote_running, 4);
	assert_int_equal(q.remote_waiting, 1);
	assert_true(remote[2].w.started_ms != 0);
	assert_int_equal(remote[5].w.started_ms, 0);
	for (int i = 1; i < 6; i++)
		sem_post(&remote[i].gate);
	for (int i = 1; i < 6; i++)
		run_until(&loop, &remote[i].after_called);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(remote[i].after_status, 0);
		assert_int_equal(remote[i].after_called, 1);
		assert_true(remote[i].ran);
	}
	assert_int_equal(q.remote_running, 0);
	assert_int_equal(q.remote_waiting, 0);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static void
test_unknown_filesystems_share_the_remote_limit(void **state)
{
	uv_loop_t loop;
	struct workq q;
	struct job j[6];

	(void)state;
	assert_int_equal(uv_loop_init(&loop), 0);
	workq_init(&q, &loop, 60000);
	for (int i = 0; i < 6; i++) {
		job_init(&j[i], 1);
		assert_int_equal(workq_submit(&q, &j[i].w, WORKQ_UNKNOWN, "first load", run,
					 after), 0);
	}
	/* Not per filesystem: up to the remote limit, then first come first served. */
	assert_int_equal(q.remote_running, 4);
	assert_int_equal(q.remote_waiting, 2);
	assert_true(j[4].w.started_ms == 0 && j[5].w.started_ms == 0);
	sem_post(&j[1].gate);
	run_until(&loop, &j[1].after_called);
	assert_true(j[4].w.started_ms != 0);
	assert_true(j[5].w.started_ms == 0);
	for (int i = 0; i < 6; i++)
		if (i != 1)
			sem_post(&j[i].gate);
	for (int i = 0; i < 6; i++)
		run_until(&loop, &j[i].after_called);
	assert_true(j[5].order > j[1].order);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static void
test_stalls_are_counted_once_and_cleared(void **state)
{
	uv_loop_t loop;
	struct workq q;
	struct job j[2];

	(void)state;
	assert_int_equal(uv_loop_init(&loop), 0);
	workq_init(&q, &loop, 0); /* every running job has stalled */
	job_init(&j[0], 1);
	job_init(&j[1], 0);
	assert_int_equal(workq_submit(&q, &j[0].w, FS_A, "model \"m\": a poll", run, after), 0);
	assert_int_equal(workq_submit(&q, &j[1].w, WORKQ_LOCAL, NULL, run, after), 0);
	workq_check_stalls(&q);
	workq_check_stalls(&q);
	assert_int_equal(q.remote_stalled, 1);
	assert_int_equal(q.stalls, 1);
	assert_true(workq_oldest_seconds(&q) >= 0);
	sem_post(&j[0].gate);
	run_until(&loop, &j[0].after_called);
	run_until(&loop, &j[1].after_called);
	assert_int_equal(q.remote_stalled, 0);
	assert_int_equal(q.stalls, 1);
	assert_true(workq_oldest_seconds(&q) == 0);
	assert_int_equal(uv_loop_close(&loop), 0);
}

/* A queue on loop with four jobs on FS_A that hang: two run, two wait. */
static void
two_run_two_wait(uv_loop_t *loop, struct workq *q, struct job j[4])
{
	assert_int_equal(uv_loop_init(loop), 0);
	workq_init(q, loop, 60000);
	for (int i = 0; i < 4; i++) {
		job_init(&j[i], 1);
		assert_int_equal(workq_submit(q, &j[i].w, FS_A, "remote", run, after), 0);
	}
	assert_int_equal(q->remote_running, 2);
	assert_int_equal(q->remote_waiting, 2);
}

static void
test_close_cancels_what_waits(void **state)
{
	uv_loop_t loop;
	struct workq q;
	struct job j[4], late;

	(void)state;
	two_run_two_wait(&loop, &q, j);
	workq_close(&q);
	/* The waiting ones: cancelled at once, never run. */
	assert_int_equal(j[2].after_called, 1);
	assert_int_equal(j[2].after_status, UV_ECANCELED);
	assert_int_equal(j[3].after_status, UV_ECANCELED);
	assert_false(j[2].ran || j[3].ran);
	assert_int_equal(q.remote_waiting, 0);
	/* Submitted after close: run at once, held to nothing. */
	job_init(&late, 0);
	assert_int_equal(workq_submit(&q, &late.w, FS_A, "remote", run, after), 0);
	run_until(&loop, &late.after_called);
	assert_int_equal(late.after_status, 0);
	sem_post(&j[0].gate);
	sem_post(&j[1].gate);
	run_until(&loop, &j[0].after_called);
	run_until(&loop, &j[1].after_called);
	assert_int_equal(j[0].after_status, 0);
	assert_int_equal(uv_loop_close(&loop), 0);
}

/* A job that waits its turn is taken back, never run and never reported;
 * one that runs, or a local one, is not (its after runs as usual); the
 * next waiting one still starts when a running one ends. */
static void
test_withdraw_takes_back_only_what_waits(void **state)
{
	uv_loop_t loop;
	struct workq q;
	struct job j[4], local;

	(void)state;
	two_run_two_wait(&loop, &q, j);
	assert_int_equal(workq_withdraw(&q, &j[2].w), 1);
	assert_int_equal(q.remote_waiting, 1);
	assert_int_equal(workq_withdraw(&q, &j[2].w), 0); /* not twice */
	assert_int_equal(workq_withdraw(&q, &j[0].w), 0); /* running */
	job_init(&local, 1);
	assert_int_equal(workq_submit(&q, &local.w, WORKQ_LOCAL, NULL, run, after), 0);
	assert_int_equal(workq_withdraw(&q, &local.w), 0);
	sem_post(&local.gate);
	run_until(&loop, &local.after_called);
	/* FS_A answers its first job: the fourth starts, not the withdrawn one. */
	sem_post(&j[0].gate);
	run_until(&loop, &j[0].after_called);
	assert_true(j[3].w.started_ms != 0);
	assert_int_equal(q.remote_waiting, 0);
	sem_post(&j[1].gate);
	sem_post(&j[3].gate);
	run_until(&loop, &j[1].after_called);
	run_until(&loop, &j[3].after_called);
	assert_false(j[2].ran);
	assert_int_equal(j[2].after_called, 0);
	assert_int_equal(q.remote_running, 0);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static void
test_pool_size_as_libuv_reads_it(void **state)
{
	const char *saved = getenv("UV_THREADPOOL_SIZE");
	char *copy = saved != NULL ? strdup(saved) : NULL;

	(void)state;
	unsetenv("UV_THREADPOOL_SIZE");
	assert_int_equal(workq_pool_size(), 4);
	workq_default_pool_size(12);
	assert_int_equal(workq_pool_size(), 12);
	workq_default_pool_size(3); /* set already: left alone */
	assert_int_equal(workq_pool_size(), 12);
	setenv("UV_THREADPOOL_SIZE", "0", 1);
	assert_int_equal(workq_pool_size(), 1);
	setenv("UV_THREADPOOL_SIZE", "2000", 1);
	assert_int_equal(workq_pool_size(), 1024);
	setenv("UV_THREADPOOL_SIZE", "-3", 1);
	assert_int_equal(workq_pool_size(), 1024);
	setenv("UV_THREADPOOL_SIZE", "1", 1);
	{
		uv_loop_t loop;
		struct workq q;

		assert_int_equal(uv_loop_init(&loop), 0);
		workq_init(&q, &loop, 1000);
		assert_int_equal(q.remote_limit, 1); /* one thread: no share to keep */
		assert_int_equal(q.per_fs_limit, 1);
		assert_int_equal(uv_loop_close(&loop), 0);
	}
	if (copy != NULL)
		setenv("UV_THREADPOOL_SIZE", copy, 1);
	free(copy);
	assert_int_equal(workq_fs(0, 7), WORKQ_LOCAL);
	assert_true(workq_fs(1, 0) != WORKQ_LOCAL && workq_fs(1, 0) != WORKQ_UNKNOWN);
	assert_true(workq_fs(1, 7) != workq_fs(1, 8));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_local_work_goes_on_while_remote_work_hangs),
		cmocka_unit_test(test_unknown_filesystems_share_the_remote_limit),
		cmocka_unit_test(test_stalls_are_counted_once_and_cleared),
		cmocka_unit_test(test_close_cancels_what_waits),
		cmocka_unit_test(test_withdraw_takes_back_only_what_waits),
		cmocka_unit_test(test_pool_size_as_libuv_reads_it),
	};

	/* libuv reads it once, when the first job is queued. */
	setenv("UV_THREADPOOL_SIZE", "8", 1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
