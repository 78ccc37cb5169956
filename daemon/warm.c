/*
 * warm.c: the page-cache warming pool (warm.h).
 *
 * A fixed set of pthreads takes jobs from a FIFO queue and reads each job's
 * file range sequentially in large chunks, so the disk streams instead of
 * serving 4 KiB page faults one at a time. Finished jobs go on a done list
 * and one uv_async_t wakes the loop, which delivers each job's done callback
 * exactly once on the loop thread. Cancellation is an atomic flag the thread
 * checks between chunks; pacing waits on a condition variable of its own
 * (pace_cv), which cancel and close broadcast, so they interrupt it at once
 * and a new job's signal on cv always reaches an idle thread.
 *
 * Locking: pool->mu protects the queue, the done list, the running slots,
 * job->state and pool->closing. A job's bytes and cancel flag are atomics.
 * Callbacks are always called with the mutex released, and job memory is
 * freed only on the loop thread, after the done callback returns; so the loop
 * may read a job (e.g. for progress) without the lock as long as it has not
 * delivered it.
 *
 * The method (warm.h, enum warm_method) defaults to sendfile(2) to
 * /dev/null: the page cache pages go through a pipe to /dev/null's no-op
 * splice and no byte reaches user space, so between requests it needs the
 * least CPU of the methods, which keeps it steady on a host busy with
 * inference workers. `test_warm --bench FILE RUNS` measures the methods side
 * by side; `make bench` measures the warm-up against fio, cat, dd and
 * vmtouch. If the file's filesystem cannot splice (sendfile fails with
 * EINVAL or ENOSYS), the job falls back to pread into the thread's buffer.
 */
#include "warm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/deadline.h"
#include "base/error.h"

#define WARM_DEFAULT_METHOD WARM_SENDFILE

/* Where a job is; only changes under pool->mu. */
enum job_state {
	JOB_QUEUED,   /* on pool->queue */
	JOB_RUNNING,  /* a thread owns it (pool->running[slot]) */
	JOB_FINISHED, /* on pool->done, result final, fd no longer touched */
};

struct warm_job {
	struct warm_job *prev, *next; /* links in queue or done list */
	struct warm_pool *pool;
	struct warm_request req;
	enum job_state state;
	atomic_bool cancel;
	_Atomic uint64_t bytes;
	uint64_t reported;            /* loop thread: bytes at the last progress call */
	uint64_t submit_ns, start_ns; /* CLOCK_MONOTONIC */
	struct warm_result res;       /* final once state == JOB_FINISHED */
};

/* A doubly linked FIFO of jobs. */
struct job_list {
	struct warm_job *head, *tail;
};

struct warm_pool {
	uv_loop_t *loop;
	uv_async_t async;
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* idle threads: work queued, a job ended, closing */
	pthread_cond_t pace_cv;   /* pacing waits: a job cancelled, or closing. Apart from
				     cv, so that warm_submit's signal wakes an idle
				     thread, never one that goes back to its pacing wait */
	struct job_list queue;
	struct job_list done;
	struct warm_job **running; /* one slot per thread */
	pthread_t *threads;
	uint8_t **buffers;         /* one chunk-sized read buffer per thread (with
				      sendfile, used only by the pread fallback;
				      untouched pages cost no memory) */
	unsigned nthreads;
	size_t chunk;
	enum warm_method method;
	uint64_t pace;             /* bytes per second per thread, 0 = unlimited */
	int null_fd;               /* /dev/null, for WARM_SENDFILE; -1 otherwise */
	bool closing;              /* under mu: threads exit, submit refused */
	unsigned joined;           /* loop thread: threads joined by a close so far */
	bool closed;               /* loop thread: every thread joined, jobs delivered */
	unsigned remote_limit;     /* remote jobs (req.remote) running at once at most */
	unsigned remote_running;   /* under mu */
	unsigned local_limit;      /* other jobs running at once at most: the threads asked
				      for (nthreads has one more where those are too few
				      to leave a thread beside remote_limit) */
	unsigned local_running;    /* under mu */
	size_t pending;            /* loop thread: submitted, not yet delivered */
};

/* Arguments of one pool thread. */
struct thread_arg {
	struct warm_pool *pool;
	unsigned slot;
};

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double
ns_to_s(uint64_t from, uint64_t to)
{
	return to > from ? (double)(to - from) / 1e9 : 0.0;
}

static void
list_append(struct job_list *l, struct warm_job *j)
{
	j->next = NULL;
	j->prev = l->tail;
	if (l->tail != NULL)
		l->tail->next = j;
	else
		l->head = j;
	l->tail = j;
}

static void
list_remove(struct job_list *l, struct warm_job *j)
{
	if (j->prev != NULL)
		j->prev->next = j->next;
	else
		l->head = j->next;
	if (j->next != NULL)
		j->next->prev = j->prev;
	else
		l->tail = j->prev;
	j->prev = j->next = NULL;
}

static struct warm_job *
list_pop(struct job_list *l)
{
	struct warm_job *j = l->head;

	if (j != NULL)
		list_remove(l, j);
	return j;
}

/* The page size (sysconf reads it from the auxiliary vector: cheap, and no
 * cached static for threads to race on). */
static size_t
page_size(void)
{
	long v = sysconf(_SC_PAGESIZE);

	return v > 0 ? (size_t)v : 4096;
}

/*
 * Waits (under pool->mu) until the thread may read its next byte at the
 * paced rate, or until the job is cancelled or the pool closes. Pacing
 * spreads a job's bytes evenly from its start: bytes / pace seconds.
 */
static void
pace_wait(struct warm_pool *pool, struct warm_job *job, uint64_t bytes)
{
	double due_s = (double)bytes / (double)pool->pace;
	uint64_t due = job->start_ns + (uint64_t)(due_s * 1e9);
	struct timespec ts = {
		.tv_sec = (time_t)(due / 1000000000u),
		.tv_nsec = (long)(due % 1000000000u),
	};

	pthread_mutex_lock(&pool->mu);
	while (!atomic_load(&job->cancel) && !pool->closing && now_ns() < due)
		if (pthread_cond_timedwait(&pool->pace_cv, &pool->mu, &ts) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&pool->mu);
}

/*
 * Pulls [off, off + n) into the page cache: with sendfile(2) to /dev/null
 * while *use_sendfile, else pread(2) into buf. A file that cannot be spliced
 * (EINVAL, ENOSYS) clears *use_sendfile and is read with pread from then on.
 * Returns the bytes read (> 0), 0 at end of file, or -errno.
 */
static ssize_t
read_chunk(struct warm_pool *pool, const struct warm_job *job, bool *use_sendfile, uint8_t *buf,
	uint64_t off, size_t n)
{
	ssize_t r;

	for (;;) {
		if (*use_sendfile) {
			off_t o = (off_t)off;
			r = sendfile(pool->null_fd, job->req.fd, &o, n);
			if (r < 0 && (errno == EINVAL || errno == ENOSYS)) {
				*use_sendfile = false;
				continue;
			}
		} else {
			r = pread(job->req.fd, buf, n, (off_t)off);
		}
		if (r >= 0)
			return r;
		if (errno != EINTR)
			return -errno;
	}
}

/*
 * Issues the look-ahead hint of WARM_FADVISE_PREAD for [off, off + n): on the
 * daemon's mapping when the request has one, else on the fd. Hints are
 * advisory; their errors are ignored.
 */
static void
hint_ahead(const struct warm_job *job, uint64_t off, uint64_t n)
{
	if (n == 0)
		return;
	if (job->req.base != NULL) {
		const uint8_t *p = (const uint8_t *)job->req.base + (off - job->req.offset);
		(void)madvise((void *)(uintptr_t)p, (size_t)n, MADV_WILLNEED);
	} else {
		(void)posix_fadvise(job->req.fd, (off_t)off, (off_t)n, POSIX_FADV_WILLNEED);
	}
}

/*
 * Reads one job's range chunk by chunk on a pool thread and fills job->res.
 * Checks the cancel flag before every chunk. Never touches the fd after
 * returning.
 */
static void
run_job(struct warm_pool *pool, struct warm_job *job, uint8_t *buf)
{
	uint64_t off = job->req.offset;
	uint64_t end = job->req.offset + job->req.length;
	uint64_t done = 0;
	bool use_sendfile = pool->method == WARM_SENDFILE;
	int status = 0;

	if (job->req.length > 0)
		(void)posix_fadvise(job->req.fd, (off_t)off, (off_t)job->req.length,
			POSIX_FADV_SEQUENTIAL);
	if (pool->method == WARM_FADVISE_PREAD)
		hint_ahead(job, off, end - off < pool->chunk ? end - off : pool->chunk);
	while (off < end) {
		size_t n = end - off < pool->chunk ? (size_t)(end - off) : pool->chunk;
		ssize_t r;

		if (atomic_load(&job->cancel)) {
			status = -ECANCELED;
			break;
		}
		if (pool->method == WARM_FADVISE_PREAD && end - off > n) {
			uint64_t next = off + n;
			hint_ahead(job, next, end - next < pool->chunk ? end - next : pool->chunk);
		}
		r = read_chunk(pool, job, &use_sendfile, buf, off, n);
		if (r < 0) {
			status = (int)r;
			break;
		}
		if (r == 0) {
			status = -ENODATA; /* the file is shorter than the range */
			break;
		}
		off += (uint64_t)r;
		done += (uint64_t)r;
		atomic_store(&job->bytes, done);
		if (job->req.progress != NULL)
			uv_async_send(&pool->async);
		if (pool->pace > 0 && off < end)
			pace_wait(pool, job, done);
	}
	/* The sequential hint doubled the readahead window of the shared
	 * open file description; give workers the default back. */
	if (job->req.length > 0)
		(void)posix_fadvise(job->req.fd, (off_t)job->req.offset, (off_t)job->req.length,
			POSIX_FADV_NORMAL);
	if (status == 0 && job->req.measure != NULL)
		job->req.measure(&job->req, &job->res.measure);
	job->res.status = status;
	job->res.bytes = done;
	job->res.seconds = ns_to_s(job->start_ns, now_ns());
	job->res.queued_seconds = ns_to_s(job->submit_ns, job->start_ns);
}

/* The oldest queued job a thread may run now (taken off the queue), or
 * NULL: a remote one only while fewer than remote_limit run, any other
 * only while fewer than local_limit do (pool->mu held). */
static struct warm_job *
take_runnable(struct warm_pool *pool)
{
	for (struct warm_job *j = pool->queue.head; j != NULL; j = j->next) {
		unsigned *running = j->req.remote ? &pool->remote_running : &pool->local_running;
		unsigned limit = j->req.remote ? pool->remote_limit : pool->local_limit;

		if (*running < limit) {
			list_remove(&pool->queue, j);
			(*running)++;
			return j;
		}
	}
	return NULL;
}

/* Body of a pool thread: take the oldest queued job it may run
 * (take_runnable), run it, post it to the done list, wake the loop; until
 * the pool closes. */
static void *
pool_thread(void *argp)
{
	struct thread_arg *arg = argp;
	struct warm_pool *pool = arg->pool;
	unsigned slot = arg->slot;
	uint8_t *buf = pool->buffers[slot];

	free(arg);
	pthread_mutex_lock(&pool->mu);
	for (;;) {
		struct warm_job *job = NULL;

		while (!pool->closing && (job = take_runnable(pool)) == NULL)
			pthread_cond_wait(&pool->cv, &pool->mu);
		if (pool->closing)
			break;
		job->state = JOB_RUNNING;
		job->start_ns = now_ns();
		pool->running[slot] = job;
		pthread_mutex_unlock(&pool->mu);

		run_job(pool, job, buf);

		pthread_mutex_lock(&pool->mu);
		pool->running[slot] = NULL;
		if (job->req.remote)
			pool->remote_running--;
		else
			pool->local_running--;
		/* A job its kind's limit held back may run now. */
		pthread_cond_broadcast(&pool->cv);
		job->state = JOB_FINISHED;
		list_append(&pool->done, job);
		pthread_mutex_unlock(&pool->mu);
		uv_async_send(&pool->async);
		pthread_mutex_lock(&pool->mu);
	}
	pthread_mutex_unlock(&pool->mu);
	return NULL;
}

/* Calls a finished job's done callback and frees it (loop thread). */
static void
deliver(struct warm_pool *pool, struct warm_job *job)
{
	pool->pending--;
	job->req.done(job, &job->res, job->req.cookie);
	free(job);
}

/*
 * The loop side of the uv_async_t: report progress of running jobs that have
 * a progress callback, then deliver every finished job. A callback may close
 * the pool; close delivers whatever is left, so stop as soon as it did.
 */
static void
on_async(uv_async_t *handle)
{
	struct warm_pool *pool = handle->data;
	struct warm_job *snap[WARM_MAX_THREADS];
	unsigned n = 0;

	pthread_mutex_lock(&pool->mu);
	for (unsigned i = 0; i < pool->nthreads; i++)
		if (pool->running[i] != NULL && pool->running[i]->req.progress != NULL)
			snap[n++] = pool->running[i];
	pthread_mutex_unlock(&pool->mu);
	for (unsigned i = 0; i < n && !pool->closing; i++) {
		struct warm_job *job = snap[i];
		uint64_t b = atomic_load(&job->bytes);

		if (b != job->reported) {
			job->reported = b;
			job->req.progress(job, b, job->req.length, job->req.cookie);
		}
	}
	while (!pool->closing) {
		struct warm_job *job;

		pthread_mutex_lock(&pool->mu);
		job = list_pop(&pool->done);
		pthread_mutex_unlock(&pool->mu);
		if (job == NULL)
			break;
		deliver(pool, job);
	}
}

/* Stops the threads and joins the first n; with a deadline (CLOCK_MONOTONIC:
 * a step of the wall clock moves no stop) it leaves those still running then.
 * Joined threads move to the front of pool->threads (only joins use it), so
 * that a later call waits for the others only. The number not joined. */
static unsigned
join_threads(struct warm_pool *pool, unsigned n, const struct timespec *deadline)
{
	pthread_mutex_lock(&pool->mu);
	pool->closing = true;
	for (unsigned i = 0; i < pool->nthreads; i++)
		if (pool->running[i] != NULL)
			atomic_store(&pool->running[i]->cancel, true);
	pthread_cond_broadcast(&pool->cv);
	pthread_cond_broadcast(&pool->pace_cv);
	pthread_mutex_unlock(&pool->mu);
	for (unsigned i = pool->joined; i < n; i++) {
		pthread_t t = pool->threads[i];

		if (deadline == NULL)
			pthread_join(t, NULL);
		else if (pthread_clockjoin_np(t, NULL, CLOCK_MONOTONIC, deadline) != 0)
			continue; /* the deadline has passed: the rest are only reaped */
		pool->threads[i] = pool->threads[pool->joined];
		pool->threads[pool->joined++] = t;
	}
	return n - pool->joined;
}

/* Frees the pool's memory (NULL: nothing); the threads are joined, the
 * handle is closed. */
static void
pool_free(struct warm_pool *pool)
{
	if (pool == NULL)
		return;
	if (pool->buffers != NULL)
		for (unsigned i = 0; i < pool->nthreads; i++)
			free(pool->buffers[i]);
	free(pool->buffers);
	free(pool->threads);
	free(pool->running);
	if (pool->null_fd >= 0)
		close(pool->null_fd);
	pthread_cond_destroy(&pool->cv);
	pthread_cond_destroy(&pool->pace_cv);
	pthread_mutex_destroy(&pool->mu);
	free(pool);
}

/* warm_pool_new() could not allocate what threads prefetch threads need:
 * frees pool (pool_free, NULL too) and returns -ENOMEM with the one message
 * every such failure gives. */
static int
pool_out_of_memory(struct warm_pool *pool, unsigned threads)
{
	pool_free(pool);
	return error_set(-ENOMEM, "cannot start %u prefetch threads: out of memory", threads);
}

/* Checks opt and fills the pool's settings; -EINVAL on a bad value. */
static int
apply_options(struct warm_pool *pool, const struct warm_options *opt)
{
	struct warm_options o = {0};
	size_t pg = page_size();

	if (opt != NULL)
		o = *opt;
	if (o.threads == 0)
		o.threads = WARM_DEFAULT_THREADS;
	if (o.chunk_bytes == 0)
		o.chunk_bytes = WARM_DEFAULT_CHUNK;
	if (o.method == 0)
		o.method = WARM_DEFAULT_METHOD;
	if (o.threads > WARM_MAX_THREADS || o.chunk_bytes < WARM_MIN_CHUNK ||
		o.chunk_bytes > WARM_MAX_CHUNK)
		return -EINVAL;
	if (o.method != WARM_PREAD && o.method != WARM_FADVISE_PREAD &&
		o.method != WARM_SENDFILE)
		return -EINVAL;
	/* A server that hangs holds the threads reading it: remote work gets
	 * half of the threads (1 of fewer than 4), and one more thread joins
	 * where that would be all of them (o.threads = 1), so that local
	 * warm-ups always have one. Local work keeps to o.threads. */
	pool->remote_limit = o.threads >= 4 ? o.threads / 2 : 1;
	pool->local_limit = o.threads;
	pool->nthreads = o.threads > pool->remote_limit ? o.threads : pool->remote_limit + 1;
	pool->chunk = (o.chunk_bytes + pg - 1) / pg * pg;
	pool->method = o.method;
	pool->pace = o.pace_bytes_per_sec;
	return 0;
}

/* Starts the pool's threads with every signal blocked, so signals go to the
 * loop thread. Returns 0 or -errno; *started says how many run. */
static int
start_threads(struct warm_pool *pool, unsigned *started)
{
	sigset_t all, old;
	int err = 0;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (*started = 0; *started < pool->nthreads; (*started)++) {
		struct thread_arg *arg = malloc(sizeof(*arg));
		char name[16];

		if (arg == NULL) {
			err = -ENOMEM;
			break;
		}
		arg->pool = pool;
		arg->slot = *started;
		err = -pthread_create(&pool->threads[*started], NULL, pool_thread, arg);
		if (err != 0) {
			free(arg);
			break;
		}
		snprintf(name, sizeof(name), "wc-warm-%u", *started);
		(void)pthread_setname_np(pool->threads[*started], name);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return err;
}

int
warm_pool_new(uv_loop_t *loop, const struct warm_options *opt, struct warm_pool **out)
{
	struct warm_pool *pool;
	pthread_condattr_t ca;
	unsigned started = 0;
	unsigned threads = opt != NULL && opt->threads != 0 ? opt->threads : WARM_DEFAULT_THREADS;
	int err;

	if (loop == NULL || out == NULL)
		return error_set(-EINVAL, "prefetch threads: no loop");
	pool = calloc(1, sizeof(*pool));
	if (pool == NULL)
		return pool_out_of_memory(NULL, threads);
	pool->null_fd = -1;
	err = apply_options(pool, opt);
	if (err != 0) {
		free(pool);
		return error_set(err, "cannot start %u prefetch threads: threads, chunk or "
				      "method out of range", threads);
	}
	pool->loop = loop;
	pthread_mutex_init(&pool->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pool->cv, &ca);
	pthread_cond_init(&pool->pace_cv, &ca);
	pthread_condattr_destroy(&ca);

	/* An array of pointers: sizeof(*pool->running) is one pointer.
	 * NOLINTNEXTLINE(bugprone-sizeof-expression) */
	pool->running = calloc(pool->nthreads, sizeof(*pool->running));
	pool->threads = calloc(pool->nthreads, sizeof(*pool->threads));
	pool->buffers = calloc(pool->nthreads, sizeof(*pool->buffers));
	if (pool->running == NULL || pool->threads == NULL || pool->buffers == NULL)
		return pool_out_of_memory(pool, threads);
	if (pool->method == WARM_SENDFILE) {
		pool->null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
		if (pool->null_fd < 0) {
			err = -errno;
			pool_free(pool);
			return error_set(err, "cannot open /dev/null, where the prefetch threads "
					      "sendfile(2) what they read: %s", strerror(-err));
		}
	}
	for (unsigned i = 0; i < pool->nthreads; i++) {
		pool->buffers[i] = aligned_alloc(page_size(), pool->chunk);
		if (pool->buffers[i] == NULL)
			return pool_out_of_memory(pool, threads);
	}
	/* The threads touch the async handle only once a job exists, and jobs
	 * exist only after this function returns; so the handle is initialised
	 * last, and a failure before it needs no loop iteration to clean up. */
	err = start_threads(pool, &started);
	if (err != 0)
		error_format("cannot start %u prefetch threads: %s", threads, strerror(-err));
	else if ((err = uv_async_init(loop, &pool->async, on_async)) != 0)
		error_format("cannot start %u prefetch threads: uv_async_init: %s", threads,
			uv_strerror(err));
	if (err != 0) {
		(void)join_threads(pool, started, NULL);
		pool_free(pool);
		return err;
	}
	pool->async.data = pool;
	*out = pool;
	return 0;
}

int
warm_submit(struct warm_pool *pool, const struct warm_request *req, struct warm_job **out)
{
	struct warm_job *job;
	uint64_t end;

	if (pool == NULL || req == NULL || req->fd < 0 || req->done == NULL)
		return -EINVAL;
	if (__builtin_add_overflow(req->offset, req->length, &end) || end > (uint64_t)INT64_MAX)
		return -EINVAL;
	if (req->base != NULL && (uintptr_t)req->base % page_size() != 0)
		return -EINVAL;
	if (pool->closing)
		return -ESHUTDOWN;
	job = calloc(1, sizeof(*job));
	if (job == NULL)
		return -ENOMEM;
	job->pool = pool;
	job->req = *req;
	job->submit_ns = now_ns();
	atomic_init(&job->cancel, false);
	atomic_init(&job->bytes, 0);

	pthread_mutex_lock(&pool->mu);
	job->state = JOB_QUEUED;
	list_append(&pool->queue, job);
	pthread_cond_signal(&pool->cv);
	pthread_mutex_unlock(&pool->mu);
	pool->pending++;
	if (out != NULL)
		*out = job;
	return 0;
}

/* Moves a queued job to the done list as cancelled (pool->mu held). */
static void
cancel_queued(struct warm_pool *pool, struct warm_job *job)
{
	list_remove(&pool->queue, job);
	atomic_store(&job->cancel, true);
	job->res.status = -ECANCELED;
	job->res.bytes = 0;
	job->res.seconds = 0;
	job->res.queued_seconds = ns_to_s(job->submit_ns, now_ns());
	job->state = JOB_FINISHED;
	list_append(&pool->done, job);
}

int
warm_cancel(struct warm_pool *pool, struct warm_job *job)
{
	int ret = 0;

	if (pool == NULL || job == NULL || job->pool != pool)
		return -EINVAL;
	pthread_mutex_lock(&pool->mu);
	switch (job->state) {
	case JOB_QUEUED:
		cancel_queued(pool, job);
		break;
	case JOB_RUNNING:
		if (atomic_exchange(&job->cancel, true))
			ret = -EALREADY;
		else
			pthread_cond_broadcast(&pool->pace_cv); /* interrupt a pacing wait */
		break;
	case JOB_FINISHED:
		ret = -EALREADY;
		break;
	}
	pthread_mutex_unlock(&pool->mu);
	if (ret == 0 && !pool->closing)
		uv_async_send(&pool->async);
	return ret;
}

uint64_t
warm_job_bytes(const struct warm_job *job)
{
	return atomic_load(&((struct warm_job *)(uintptr_t)job)->bytes);
}

void *
warm_job_cookie(const struct warm_job *job)
{
	return job->req.cookie;
}

size_t
warm_pool_pending(const struct warm_pool *pool)
{
	return pool->pending;
}

/* Close callback of the async handle: the last use of the pool. */
static void
on_async_closed(uv_handle_t *handle)
{
	pool_free(handle->data);
}

/* Closes pool, waiting for its threads until deadline (NULL: for ever). */
static int
close_pool(struct warm_pool *pool, const struct timespec *deadline)
{
	unsigned left;

	if (pool == NULL || pool->closed)
		return 0;
	/* After this no thread takes a new job, running jobs stop before their
	 * next chunk, and once joined no thread touches any fd. */
	if ((left = join_threads(pool, pool->nthreads, deadline)) > 0)
		return (int)left; /* a thread still runs a job: nothing may be freed */
	pool->closed = true;
	/* Deliver everything: finished jobs with their status, queued ones as
	 * cancelled. A callback may cancel another job (it just moves to the
	 * done list) but can submit nothing (closing is set). */
	for (;;) {
		struct warm_job *job;

		pthread_mutex_lock(&pool->mu);
		job = list_pop(&pool->done);
		if (job == NULL && pool->queue.head != NULL) {
			cancel_queued(pool, pool->queue.head);
			job = list_pop(&pool->done);
		}
		pthread_mutex_unlock(&pool->mu);
		if (job == NULL)
			break;
		deliver(pool, job);
	}
	uv_close((uv_handle_t *)&pool->async, on_async_closed);
	return 0;
}

void
warm_pool_close(struct warm_pool *pool)
{
	(void)close_pool(pool, NULL);
}

int
warm_pool_close_within(struct warm_pool *pool, unsigned ms)
{
	struct timespec deadline = deadline_in_ms(CLOCK_MONOTONIC, ms);

	return close_pool(pool, &deadline);
}
