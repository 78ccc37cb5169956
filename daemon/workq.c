/*
 * workq.c: libuv's work queue, with remote filesystem work held to a share
 * of it (workq.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "log.h"
#include "workq.h"

#define LIBUV_DEFAULT_THREADS 4
#define LIBUV_MAX_THREADS     1024

unsigned
workq_pool_size(void)
{
	const char *v = getenv("UV_THREADPOOL_SIZE");
	long n;

	if (v == NULL)
		return LIBUV_DEFAULT_THREADS;
	/* As libuv reads it: atoi, 0 is 1, above the maximum (a negative
	 * number too: it is unsigned there) is the maximum. */
	n = atol(v);
	if (n == 0)
		return 1;
	if (n < 0 || n > LIBUV_MAX_THREADS)
		return LIBUV_MAX_THREADS;
	return (unsigned)n;
}

void
workq_default_pool_size(unsigned threads)
{
	char buf[16];

	if (getenv("UV_THREADPOOL_SIZE") != NULL)
		return;
	snprintf(buf, sizeof(buf), "%u", threads);
	setenv("UV_THREADPOOL_SIZE", buf, 0);
}

const char *
workq_thread_hint(int err)
{
	return err == -EAGAIN ? " (a limit on tasks: the user's RLIMIT_NPROC, the unit's "
		"TasksMax=, the container's pids limit)" : "";
}

/* The probe: its threads, each of which notes its id, then waits to be let
 * go. */
struct probe {
	pthread_mutex_t lock;
	pthread_cond_t go;
	int released;
};

struct probe_thread {
	struct probe *p;
	pthread_t thread;
	pid_t tid;
};

static void *
probe_run(void *arg)
{
	struct probe_thread *t = arg;
	struct probe *p = t->p;

	pthread_mutex_lock(&p->lock);
	t->tid = gettid();
	while (!p->released)
		pthread_cond_wait(&p->go, &p->lock);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* A joined thread still counts against the limits until the kernel has
 * reaped it, which it does just before its /proc/self/task entry goes: waits
 * for that (microseconds; 1 s at most), so libuv's threads find the room the
 * probe's left. */
static void
wait_reaped(pid_t tid)
{
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/self/task/%d", (int)tid);
	for (int i = 0; i < 1000 && stat(path, &st) == 0; i++)
		usleep(1000);
}

static void
first_run(uv_work_t *req)
{
	(void)req;
}

static void
first_after(uv_work_t *req, int status)
{
	(void)req;
	(void)status;
}

int
workq_start_pool(uv_loop_t *loop)
{
	static uv_work_t first;
	unsigned n = workq_pool_size(), started = 0;
	struct probe p = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
	struct probe_thread *t = calloc(n, sizeof(*t));
	sigset_t all, old;
	int err = 0;

	if (t == NULL)
		return error_set(-ENOMEM, "cannot start %u work threads: out of memory", n);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (; started < n; started++) {
		t[started].p = &p;
		if ((err = -pthread_create(&t[started].thread, NULL, probe_run, &t[started])) != 0)
			break;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_mutex_lock(&p.lock);
	p.released = 1;
	pthread_cond_broadcast(&p.go);
	pthread_mutex_unlock(&p.lock);
	for (unsigned i = 0; i < started; i++)
		pthread_join(t[i].thread, NULL);
	for (unsigned i = 0; i < started; i++)
		wait_reaped(t[i].tid);
	free(t);
	if (err != 0)
		return error_set(err, "cannot start %u work threads: %s%s", n, strerror(-err),
			workq_thread_hint(err));
	if ((err = uv_queue_work(loop, &first, first_run, first_after)) < 0)
		return error_set(err, "cannot start %u work threads: %s", n, uv_strerror(err));
	return 0;
}

uint64_t
workq_fs(int remote, dev_t dev)
{
	return remote ? (uint64_t)dev + 2 : WORKQ_LOCAL;
}

static int
remote(const struct workq_job *j)
{
	return j->fs != WORKQ_LOCAL;
}

static void
unlink_job(struct workq_job **head, struct workq_job **tail, struct workq_job *j)
{
	if (j->prev != NULL)
		j->prev->next = j->next;
	else
		*head = j->next;
	if (j->next != NULL)
		j->next->prev = j->prev;
	else if (tail != NULL)
		*tail = j->prev;
	j->prev = j->next = NULL;
}

static uint64_t
now_ms(const struct workq *q)
{
	uint64_t t = uv_now(q->loop);

	return t != 0 ? t : 1; /* started_ms 0 means "waiting" */
}

static void
run_job(uv_work_t *req)
{
	struct workq_job *j = req->data;

	j->run(j);
}

static void pump(struct workq *q);

static void
after_job(uv_work_t *req, int status)
{
	struct workq_job *j = req->data;
	struct workq *q = j->q;

	if (remote(j)) {
		unlink_job(&q->running, NULL, j);
		q->remote_running--;
		if (j->stalled) {
			q->remote_stalled--;
			log_info("%s returned after %.1f s", j->what,
				(double)(uv_now(q->loop) - j->started_ms) / 1000.0);
		}
	}
	j->after(j, status); /* may free j, may submit more */
	pump(q);
}

/* Starts j on libuv; 0 or a libuv error. */
static int
start(struct workq *q, struct workq_job *j)
{
	int err;

	j->req.data = j;
	if ((err = uv_queue_work(q->loop, &j->req, run_job, after_job)) < 0)
		return err;
	if (remote(j)) {
		j->started_ms = now_ms(q);
		j->next = q->running;
		if (q->running != NULL)
			q->running->prev = j;
		q->running = j;
		q->remote_running++;
	}
	return 0;
}

static unsigned
running_on(const struct workq *q, uint64_t fs)
{
	unsigned n = 0;

	for (const struct workq_job *j = q->running; j != NULL; j = j->next)
		n += j->fs == fs;
	return n;
}

/* One pass over the waiting jobs: starts those that fit, first come first
 * served. */
static void
pump_pass(struct workq *q)
{
	struct workq_job *j = q->waiting, *next;

	for (; j != NULL && q->remote_running < q->remote_limit; j = next) {
		unsigned limit = j->fs == WORKQ_UNKNOWN ? q->remote_limit : q->per_fs_limit;
		int err;

		next = j->next;
		if (running_on(q, j->fs) >= limit)
			continue;
		unlink_job(&q->waiting, &q->waiting_tail, j);
		q->remote_waiting--;
		if ((err = start(q, j)) < 0) {
			log_warnx("%s: cannot queue it: %s", j->what, uv_strerror(err));
			j->after(j, err); /* may submit: that asks for another pass */
		}
	}
}

static void
pump(struct workq *q)
{
	if (q->pumping) {
		q->repump = 1;
		return;
	}
	q->pumping = 1;
	do {
		q->repump = 0;
		pump_pass(q);
	} while (q->repump);
	q->pumping = 0;
}

void
workq_check_stalls(struct workq *q)
{
	uint64_t now = uv_now(q->loop);

	for (struct workq_job *j = q->running; j != NULL; j = j->next) {
		if (j->stalled || now - j->started_ms < q->stall_ms)
			continue;
		j->stalled = 1;
		q->remote_stalled++;
		q->stalls++;
		log_warnx("%s has not returned after %" PRIu64 " s: the filesystem may be hung; "
			  "work elsewhere goes on", j->what, (now - j->started_ms) / 1000);
	}
}

void
workq_init(struct workq *q, uv_loop_t *loop, uint64_t stall_ms)
{
	memset(q, 0, sizeof(*q));
	q->loop = loop;
	q->threads = workq_pool_size();
	q->remote_limit = q->threads / 2 > 0 ? q->threads / 2 : 1;
	q->per_fs_limit = q->remote_limit / 2 > 0 ? q->remote_limit / 2 : 1;
	q->stall_ms = stall_ms;
}

int
workq_submit(struct workq *q, struct workq_job *job, uint64_t fs, const char *what,
	workq_run_fn run, workq_after_fn after)
{
	job->q = q;
	job->run = run;
	job->after = after;
	job->fs = q->closing ? WORKQ_LOCAL : fs;
	job->started_ms = 0;
	job->stalled = 0;
	job->prev = job->next = NULL;
	/* A job submitted again keeps its name: what may be job->what itself,
	 * and snprintf from a buffer into itself is undefined. */
	if (what != job->what)
		snprintf(job->what, sizeof(job->what), "%s", what != NULL ? what : "work");
	if (!remote(job))
		return start(q, job);
	job->prev = q->waiting_tail;
	if (q->waiting_tail != NULL)
		q->waiting_tail->next = job;
	else
		q->waiting = job;
	q->waiting_tail = job;
	q->remote_waiting++;
	pump(q);
	return 0;
}

int
workq_withdraw(struct workq *q, struct workq_job *job)
{
	for (struct workq_job *j = q->waiting; j != NULL; j = j->next) {
		if (j != job)
			continue;
		unlink_job(&q->waiting, &q->waiting_tail, j);
		q->remote_waiting--;
		return 1;
	}
	return 0;
}

void
workq_close(struct workq *q)
{
	q->closing = 1;
	while (q->waiting != NULL) {
		struct workq_job *j = q->waiting;

		unlink_job(&q->waiting, &q->waiting_tail, j);
		q->remote_waiting--;
		j->after(j, UV_ECANCELED);
	}
}

double
workq_oldest_seconds(const struct workq *q)
{
	uint64_t now = uv_now(q->loop), oldest = 0;

	for (const struct workq_job *j = q->running; j != NULL; j = j->next)
		if (now - j->started_ms > oldest)
			oldest = now - j->started_ms;
	return (double)oldest / 1000.0;
}
