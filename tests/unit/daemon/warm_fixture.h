/*
 * warm_fixture.h: the fixture of the unit tests of the page-cache warming
 * pool and the residency helpers (test_warm, test_warm_jobs, test_resident):
 * a real libuv loop, a temporary directory in /tmp with a 64 MiB file made
 * by the tests that need it, and a pool whose callbacks record what each
 * job saw.
 *
 * Every wait is "run the loop until a counter reaches a value", bounded by a
 * uv_timer deadline: no sleeps.
 *
 * The knobs of the fault injection live here, so that setup() can reset
 * them; warm_fault.c, linked only into the tests of the pool, stands in for
 * pread() and sendfile() and obeys them.
 */
#ifndef WC_WARM_FIXTURE_H
#define WC_WARM_FIXTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "testutil.h"
#include "warm.h"

#define BIG_SIZE (64 * MiB)

/* What warm_fault.c's pread() and sendfile() do. Pool threads call them
 * concurrently, hence the atomics. Tests that inject a fault use a
 * one-thread pool, so "the n-th call" is well defined. */
struct warm_fault {
	atomic_int eintr;      /* fail this many pread() calls with EINTR */
	atomic_int eio_after;  /* if > 0: the eio_after-th call from now fails with EIO */
	atomic_int sendfile_einval; /* fail this many sendfile() calls with EINVAL */
	atomic_int sendfile_eio;    /* fail this many sendfile() calls with EIO */
	atomic_int preads;     /* pread() calls */
	atomic_int sendfiles;  /* sendfile() calls */
	atomic_bool hang;      /* sendfile() and pread() wait while set: a hung server */
};

extern struct warm_fault fault;

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

/* The fixture of the test running now; the callbacks find it here because
 * the job cookie is an index (1-based) into fixture.seen. */
extern struct fixture *cur;

/* The cmocka setup and teardown: a loop and a temporary directory, the
 * fault knobs cleared; teardown closes the pool, checks that the loop
 * closes (a pool that leaked its async handle would fail there) and
 * removes the directory. */
int setup(void **state);
int teardown(void **state);

/* Runs the loop until *counter >= target or the deadline passes; returns
 * whether the target was reached. */
bool run_until(uv_loop_t *loop, const int *counter, int target);

/* Creates the BIG_SIZE test file (pattern bytes, flushed to disk so that
 * eviction can drop it), opens it read-only and maps it without touching. */
void make_big(struct fixture *f);

/* The done callback of the fixture's jobs: records the result in the
 * job's struct seen (and, if asked, tries a submit from inside it). */
void record_done(struct warm_job *job, const struct warm_result *res, void *cookie);

/* Submits [off, off + len) of fd as job number i (1-based cookie). */
void submit(struct fixture *f, int i, int fd, const void *base, uint64_t off, uint64_t len,
	bool progress);

/* A new pool for f (and f becomes cur). */
void new_pool(struct fixture *f, unsigned threads, size_t chunk, enum warm_method method,
	uint64_t pace);

/* Closes the pool the fixture holds (teardown then has nothing to close). */
void close_pool(struct fixture *f);

/* Waits until job j has read something; fails the test after 10 s (a job
 * that never starts would otherwise hang it). */
void wait_reading(struct warm_job *j);

#endif
