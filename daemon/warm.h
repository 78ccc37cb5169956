/*
 * warm.h: warming the page cache with model files, off the event loop.
 *
 * Mapping a file is not loading it: a page is read from disk on first touch,
 * and a worker touching weights one page at a time reads the disk 4 KiB at a
 * time. The daemon therefore reads every new generation once, sequentially,
 * in large requests, on a small pool of its own threads (never on the libuv
 * loop, and not on libuv's work queue, whose four shared threads warming
 * would starve). Progress and completion come back to the loop through one
 * uv_async_t.
 *
 * Threading contract. Every function taking a struct warm_pool or a struct
 * warm_job must be called on the thread running the pool's loop, except
 * warm_job_bytes(), which any thread may call while the job is valid.
 * (Measuring residency and pinning or evicting page ranges are in
 * resident.h.)
 *
 * Job lifecycle. warm_submit() queues a job (FIFO) and returns a handle. A
 * pool thread takes it, reads [offset, offset + length) of the fd in chunks,
 * and checks the job's cancel flag between chunks. When the thread is done
 * with the fd it queues the job for delivery; the loop then calls the job's
 * done callback exactly once, with the status, the bytes read and the time
 * taken. From the moment the done callback is entered the pool never touches
 * the job's fd or mapping again, and when it returns the handle is freed.
 * So: the owner keeps the fd open and the mapping mapped until the done
 * callback runs, then may close/unmap them (inside the callback or later).
 * Every job submitted gets its done callback exactly once: normally, after
 * warm_cancel(), or during warm_pool_close().
 *
 * Shutdown sequence (the pool frees itself; ASan/LSan see no leak):
 *   1. warm_pool_close(pool): cancels every job, wakes and joins the threads
 *      (blocks the loop for one chunk read per thread: for ever if a read
 *      never returns; warm_pool_close_within bounds it), calls the
 *      done callback of every job not yet delivered (status -ECANCELED, or
 *      the real status if it had already finished), then uv_close()s the
 *      async handle. The pool's memory is freed in the close callback.
 *   2. The caller keeps running the loop (uv_run(loop, UV_RUN_DEFAULT) after
 *      closing its other handles) so the close callback runs; then
 *      uv_loop_close(loop) returns 0.
 *   Close the pool before freeing whatever the jobs' cookies point to.
 */
#ifndef WC_WARM_H
#define WC_WARM_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct warm_pool;
struct warm_job;

/* How a pool thread pulls one chunk into the page cache. The default
 * (method 0 in struct warm_options) is WARM_SENDFILE with 8 MiB calls: it
 * moves no byte to user space and needs the least CPU between requests, so
 * it is the steadiest on a busy host, which is when warming runs. The others
 * stay selectable for benchmarks (`test_warm --bench FILE RUNS` compares
 * them) and for disks that behave differently. */
enum warm_method {
	WARM_PREAD = 1,      /* pread(2) each chunk into a per-thread buffer */
	WARM_FADVISE_PREAD,  /* posix_fadvise(WILLNEED) one chunk ahead, then pread */
	WARM_SENDFILE,       /* sendfile(2) each chunk to /dev/null: no copy to user space;
				falls back to pread if the filesystem cannot splice */
};

/* Limits and defaults for struct warm_options. */
#define WARM_DEFAULT_THREADS 2
#define WARM_MAX_THREADS 64
#define WARM_DEFAULT_CHUNK (8u << 20)  /* 8 MiB */
#define WARM_MIN_CHUNK (64u << 10)     /* 64 KiB */
#define WARM_MAX_CHUNK (256u << 20)    /* 256 MiB */

/* Pool settings. A zeroed struct (or a NULL pointer) means all defaults. */
struct warm_options {
	unsigned threads;        /* prefetch_threads: 0 = default, 1..WARM_MAX_THREADS */
	size_t chunk_bytes;      /* bytes per read call (and between cancel checks):
				    0 = default; rounded up to a page,
				    WARM_MIN_CHUNK..WARM_MAX_CHUNK */
	enum warm_method method; /* 0 = default method */
	uint64_t pace_bytes_per_sec; /* 0 = unlimited; else each thread reads at most
					this many bytes per second (the wait between
					chunks is interruptible by cancel and close) */
};

/* What the owner's measure callback found (struct warm_request): a number
 * and a code, both the owner's to define. */
struct warm_measure {
	uint64_t value;
	int how;
};

/* What a job achieved, given to its done callback. */
struct warm_result {
	int status;            /* 0: the whole range was read;
				  -ECANCELED: cancelled (warm_cancel or warm_pool_close)
				  before the last chunk was read;
				  -ENODATA: the file ended before offset + length
				  (truncated in place? the owner should check);
				  other -errno: the read failed (e.g. -EIO) */
	uint64_t bytes;        /* bytes this job read (pulled into the page cache) */
	double seconds;        /* wall time from the first to the last read (0 if it never ran) */
	double queued_seconds; /* wall time from warm_submit until a thread took it
				  (or until it was cancelled, if it never ran) */
	struct warm_measure measure; /* what req.measure found; zeros without one, or
					when the range was not all read */
};

/* Called on the loop thread exactly once per job. job is valid until the
 * callback returns and then freed; do not call warm_cancel() on it. The
 * callback may submit or cancel other jobs and may call warm_pool_close(). */
typedef void (*warm_done_cb)(struct warm_job *job, const struct warm_result *res, void *cookie);

/* Optional; called on the loop thread while the job runs, coalesced (at most
 * once per loop iteration per job, only when bytes moved since the last call,
 * never after the done callback). bytes is the job's running total. */
typedef void (*warm_progress_cb)(struct warm_job *job, uint64_t bytes, uint64_t length,
	void *cookie);

/* One warming request. The pool copies the struct; the fd and mapping are
 * borrowed (see the lifecycle above). */
struct warm_request {
	int fd;                  /* open for reading; NOT owned by the pool */
	uint64_t offset;         /* first byte of the range (usually 0) */
	uint64_t length;         /* bytes to read; 0 completes at once with status 0 */
	const void *base;        /* the daemon's mapping of exactly this range (base[0] is
				    file byte `offset`, page-aligned), or NULL. Used
				    only for hints: WARM_FADVISE_PREAD issues its
				    look-ahead as madvise(MADV_WILLNEED) on it. Never
				    dereferenced */
	void *cookie;            /* the owner's identity for this job (e.g. a generation) */
	int remote;              /* reads a network or FUSE filesystem, whose server may
				    hang mid-read: at most half of options.threads (one
				    when fewer than 4) run such jobs at once, so the
				    others keep warming local files (with threads = 1,
				    the pool has a second thread for them); a waiting
				    remote job lets later local ones pass */
	warm_done_cb done;       /* required */
	warm_progress_cb progress; /* optional */
	/* Optional: called on the pool thread once the whole range was read
	 * (status 0), before the job is queued for its done callback; fills
	 * res.measure. The owner measures there, off the loop, what the read
	 * left (wcached: the file's bytes in memory, resident.h), so the figure
	 * is fresh when the done callback runs. May touch the fd and mapping. */
	void (*measure)(const struct warm_request *req, struct warm_measure *out);
};

/*
 * Creates a pool on loop with opt (NULL for defaults): initialises its
 * uv_async_t and starts its threads. On failure (-EINVAL for bad options,
 * -ENOMEM, -EAGAIN from pthread_create, the errno of opening /dev/null for
 * WARM_SENDFILE, a libuv error from uv_async_init) nothing is left behind,
 * *out is untouched, and error_get() says what failed (naming /dev/null
 * when that is it).
 */
int warm_pool_new(uv_loop_t *loop, const struct warm_options *opt, struct warm_pool **out);

/*
 * Queues a warming job. On success *out (if out is not NULL) receives the
 * handle, valid until the job's done callback returns. Errors: -EINVAL (bad
 * fd, no done callback, offset + length overflows, base not page-aligned),
 * -ENOMEM, -ESHUTDOWN (the pool is closing). On error no callback will run.
 */
int warm_submit(struct warm_pool *pool, const struct warm_request *req, struct warm_job **out);

/*
 * Asks a job to stop. A queued job is dequeued at once; a running job stops
 * before its next chunk (the thread checks an atomic flag). Either way the
 * done callback runs later, from the loop (never from inside warm_cancel),
 * with -ECANCELED, or with the job's real status if it finished its last
 * chunk first. Returns 0, or -EALREADY if the job had already finished (its
 * callback is still pending) or was already cancelled.
 */
int warm_cancel(struct warm_pool *pool, struct warm_job *job);

/* Bytes the job has read so far (an atomic counter the thread updates after
 * each chunk). Any thread, while the handle is valid. */
uint64_t warm_job_bytes(const struct warm_job *job);

/* The cookie the job was submitted with. */
void *warm_job_cookie(const struct warm_job *job);

/* Jobs submitted and not yet delivered (queued + running + awaiting
 * delivery): for `status` output and tests. */
size_t warm_pool_pending(const struct warm_pool *pool);

/*
 * Shuts the pool down (see the sequence at the top): cancels and delivers
 * every outstanding job, joins the threads, uv_close()s the async handle;
 * the pool is freed by the close callback, so the loop must run once more.
 * Accepts NULL. The pool must not be used after this call (a second call
 * from a done callback that runs during the close is a no-op).
 */
void warm_pool_close(struct warm_pool *pool);

/*
 * warm_pool_close, but waiting at most ms for the threads: a read of a
 * network or FUSE filesystem whose server hangs never returns, and cancel
 * is seen only between chunks. 0: closed, as warm_pool_close. Else the
 * number of threads still running: nothing is delivered or freed yet, and
 * no job is taken any more. Call warm_pool_close or warm_pool_close_within
 * again to go on waiting; or exit without returning to the loop (wcached
 * at a stop, main.c).
 */
int warm_pool_close_within(struct warm_pool *pool, unsigned ms);

#endif
