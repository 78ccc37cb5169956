/*
 * workq.h: the daemon's work queue (libuv's thread pool), with the work
 * that may block on a remote filesystem held to a share of it (README,
 * "Models on shared storage": a hung server).
 *
 * A stat, open or read on a network or FUSE filesystem whose server hangs
 * blocks until the server answers, and a thread of the pool with it. With
 * enough such jobs (a poll per model on it, a load, a staging copy, page
 * work) every thread would wait there, and a model on local disk could no
 * longer be loaded, reloaded, evicted or pinned. So each job says which
 * filesystem it touches: local work goes to libuv at once; remote work runs
 * at most remote_limit jobs at once (half the pool), and at most
 * per_fs_limit on one filesystem, so one hung server leaves threads for
 * other remote filesystems too; the rest waits here, first come first
 * served. A remote job running for stall_ms is logged once as stalled
 * (and again when it returns), and counted in status and metrics: the
 * owner calls workq_check_stalls every second or so. No handle of its own:
 * nothing to close.
 */
#ifndef WC_WORKQ_H
#define WC_WORKQ_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

/* What a job touches: local files only, a filesystem not known yet (a
 * model's first load), or a remote one (workq_fs). */
#define WORKQ_LOCAL   0u
#define WORKQ_UNKNOWN 1u

struct workq_job;
typedef void (*workq_run_fn)(struct workq_job *job);
/* On the loop thread; status 0, or UV_ECANCELED (never ran: wcached is
 * stopping). May free the job. */
typedef void (*workq_after_fn)(struct workq_job *job, int status);

struct workq_job {
	uv_work_t req;          /* libuv's; req.data is the queue's */
	void *arg;              /* the submitter's */
	/* Set by workq_submit; the queue's until after runs. */
	struct workq *q;
	workq_run_fn run;
	workq_after_fn after;
	uint64_t fs;
	uint64_t started_ms;    /* 0 while it waits */
	int stalled;
	char what[192];         /* 'model "x": a poll of its paths on nfs' */
	struct workq_job *prev, *next;
};

struct workq {
	uv_loop_t *loop;
	unsigned threads;       /* libuv's pool (UV_THREADPOOL_SIZE) */
	unsigned remote_limit;  /* remote or unknown jobs running at once */
	unsigned per_fs_limit;  /* ... on one remote filesystem */
	unsigned remote_running, remote_waiting, remote_stalled;
	uint64_t stall_ms;
	uint64_t stalls;        /* jobs ever logged as stalled */
	struct workq_job *running, *waiting, *waiting_tail;
	int pumping, repump;
	int closing;
};

/* The pool size this process's libuv uses (UV_THREADPOOL_SIZE, clamped as
 * libuv does; 4 when unset). */
unsigned workq_pool_size(void);

/* Sets UV_THREADPOOL_SIZE to threads unless the environment sets it.
 * Before anything is queued (libuv reads it once). */
void workq_default_pool_size(unsigned threads);

/* Starts libuv's pool of workq_pool_size() threads now, at start, rather
 * than at the first job: libuv aborts the process without a word when one of
 * them cannot be created (EAGAIN under a tasks limit: RLIMIT_NPROC, a
 * unit's TasksMax=, a container's pids limit). So the threads are first
 * created and ended here; only when all could be does libuv create its own.
 * 0, or -errno with error_get() saying so ("cannot start 8 work threads:
 * ..."). Once, before anything is queued on loop. */
int workq_start_pool(uv_loop_t *loop);

/* The words after "cannot start N ... threads: <strerror(-err)>" that say
 * what may be in the way: a tasks limit for -EAGAIN, else "". */
const char *workq_thread_hint(int err);

/* Initialises q on loop with the process's pool size. */
void workq_init(struct workq *q, uv_loop_t *loop, uint64_t stall_ms);

/* Logs the remote jobs that have run for stall_ms, once each. */
void workq_check_stalls(struct workq *q);

/* What a job on a file with st_dev dev touches: WORKQ_LOCAL unless
 * remote, else that remote filesystem's key. */
uint64_t workq_fs(int remote, dev_t dev);

/* Queues run (on a pool thread) then after (on the loop) for job, which
 * touches fs; what names it in the stall log (copied; may be NULL for
 * local jobs, or job->what itself: a job submitted again keeps its name).
 * 0, or -errno (after never runs). */
int workq_submit(struct workq *q, struct workq_job *job, uint64_t fs, const char *what,
	workq_run_fn run, workq_after_fn after);

/* Takes job back when it still waits for its turn here (a remote or
 * unknown job the limits hold): 1, and its run and after never run (the
 * job is the caller's again); 0 when it has started, or was never held (a
 * local job goes to libuv at once): its after runs as usual. */
int workq_withdraw(struct workq *q, struct workq_job *job);

/* wcached is stopping: every job still waiting gets after(UV_ECANCELED)
 * now; jobs submitted later go to libuv at once, held to nothing. Running
 * ones end as they will. */
void workq_close(struct workq *q);

/* Seconds the oldest running remote job has run (0 when none). */
double workq_oldest_seconds(const struct workq *q);

#endif
