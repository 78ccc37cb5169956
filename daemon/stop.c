/*
 * stop.c: stopping wcached (SIGTERM, SIGINT). The fd store goes to the
 * service manager first, then every module stops and every handle closes,
 * so that main()'s loop ends and uv_loop_close() succeeds with nothing
 * leaked; only the socket files wcached created are removed. Work its
 * threads have not ended within STOP_WAIT_MS on a remote filesystem (a
 * hung server), or within STOP_UNKNOWN_WAIT_MS on one not known yet, is
 * left behind: wcached exits without it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "control.h"
#include "daemon.h"
#include "derive.h"
#include "log.h"
#include "notify.h"
#include "registry.h"
#include "restore.h"
#include "server.h"
#include "warm.h"
#include "watch.h"
#include "workq.h"

/*
 * A stop waits this long for the work its threads are doing (loads, polls,
 * copies, warm-ups: each stops at its next check of the stop). A read of a
 * network or FUSE filesystem whose server hangs never returns, and would
 * hold the stop until the service manager killed wcached (TimeoutStopSec:
 * 90 s, with no wcached for workers to reach meanwhile); so after this
 * wcached logs what it left and exits without it (stop_abandoned).
 */
#define STOP_WAIT_MS 5000

/* A job whose filesystem is not known yet (a model's first load) may be a
 * long load of a local model as well as one that waits on a hung server:
 * it is waited for this long in all. */
#define STOP_UNKNOWN_WAIT_MS 30000

void
stop_made_socket(struct made_socket *m, const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0 || (m->path = strdup(path)) == NULL)
		return;
	m->dev = st.st_dev;
	m->ino = st.st_ino;
}

/* Removes the socket file m names if it is still the one wcached made;
 * says why when it cannot (a directory the user it became cannot write). */
static void
remove_made_socket(struct made_socket *m)
{
	struct stat st;

	if (m->path == NULL)
		return;
	if (lstat(m->path, &st) == 0 && (st.st_dev != m->dev || st.st_ino != m->ino))
		log_info("%s: another socket is there now (a successor's); left alone", m->path);
	else if (unlink(m->path) < 0 && errno != ENOENT)
		log_warn("%s: cannot remove the socket", m->path);
	free(m->path);
	m->path = NULL;
}

/* What wcached does last, stopped cleanly or not: removes the socket files
 * it created and lets the manager read STOPPING=1. */
void
stop_remove_sockets(struct daemon *d)
{
	remove_made_socket(&d->created_socket);
	remove_made_socket(&d->created_control);
	/* STOPPING=1 reaches a manager that is slow, not one that is gone. */
	if (notify_flush_wait(1000) == 0)
		log_warnx("the service manager did not read STOPPING=1 within 1 s");
}

/*
 * The stop's threads did not all return within STOP_WAIT_MS (what: which).
 * Everything a next wcached needs is done: the store went to the manager
 * first, and nothing the threads do is kept (a staging copy left half
 * written is swept at the next start). Returning to the loop would wait
 * for them, and so would exit() (libuv joins its threads then): _exit.
 */
static void __attribute__((noreturn))
stop_abandoned(struct daemon *d, const char *what, unsigned waited_ms)
{
	log_warnx("stopping without waiting longer for %s: not returned after %.1f s (a read of "
		  "a hung network filesystem never returns)", what, waited_ms / 1000.0);
	stop_remove_sockets(d);
	log_info("stopped");
	fflush(stderr);
	_exit(0);
}

/* The oldest job running on a known remote filesystem (known) or on one
 * not known yet (!known), or NULL. */
static const struct workq_job *
oldest_running(const struct workq *q, int known)
{
	const struct workq_job *oldest = NULL;

	for (const struct workq_job *j = q->running; j != NULL; j = j->next)
		if ((j->fs != WORKQ_UNKNOWN) == known &&
			(oldest == NULL || j->started_ms < oldest->started_ms))
			oldest = j;
	return oldest;
}

/*
 * stop_timer: the loop still waits for work on its threads. Work on a
 * remote filesystem is left at once; work whose filesystem is not known
 * yet once STOP_UNKNOWN_WAIT_MS have passed; work on local files (a long
 * load, a slow sanitizer build) is waited for, as before: only a remote
 * server is known to hang.
 */
static void
on_stop_overdue(uv_timer_t *t)
{
	struct daemon *d = t->data;
	const struct workq *q = &d->reg.workq;
	const struct workq_job *j = oldest_running(q, 1);
	char what[sizeof(j->what) + 64];

	if (j != NULL) {
		snprintf(what, sizeof(what), "%s (%u remote job%s running)", j->what,
			q->remote_running, q->remote_running == 1 ? "" : "s");
		stop_abandoned(d, what, STOP_WAIT_MS);
	}
	if ((j = oldest_running(q, 0)) != NULL && !d->stop_unknown_waited) {
		d->stop_unknown_waited = 1;
		uv_timer_start(&d->stop_timer, on_stop_overdue,
			STOP_UNKNOWN_WAIT_MS - STOP_WAIT_MS, 0);
		return;
	}
	if (j != NULL) {
		snprintf(what, sizeof(what), "%s (on a filesystem not known yet)", j->what);
		stop_abandoned(d, what, STOP_UNKNOWN_WAIT_MS);
	}
	log_info("stopping: still waiting for work on local files");
}

void
stop_daemon(struct daemon *d)
{
	uint64_t begun, spent_ms;
	int left;

	if (d->stopping)
		return;
	d->stopping = 1;
	begun = uv_hrtime();
	log_info("shutting down");
	notify_send("STOPPING=1");
	/* Everything to the manager first, while every generation a client
	 * holds is still open (restore.h); from then on the registry is
	 * closing, so the releases of the clients dropped below take nothing
	 * out of the store. */
	restore_stopping(&d->reg);
	d->reg.changed = NULL;
	d->reg.swapped = NULL;
	d->reg.relinked = NULL;
	/* Loads still on the work queue are dropped; page work reads it
	 * from its thread (pages.c) and stops early. */
	__atomic_store_n(&d->reg.closing, 1, __ATOMIC_RELAXED);
	server_stop(d->server);
	d->server = NULL;
	/* Every connection is gone: nobody waits or builds any more. */
	derive_close(&d->derive);
	d->control_ctx.server = NULL;
	control_stop(d->control);
	d->control = NULL;
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	d->listen_fd = -1;
	watch_stop(d->watch);
	d->watch = NULL;
	/* What is left of STOP_WAIT_MS, but a second at least: a chunk read
	 * from a disk that works ends well within it. */
	spent_ms = (uv_hrtime() - begun) / 1000000u;
	if ((left = warm_pool_close_within(d->pool, spent_ms + 1000 < STOP_WAIT_MS ?
			     STOP_WAIT_MS - (unsigned)spent_ms : 1000)) > 0) {
		char what[64];

		snprintf(what, sizeof(what), "the warm-up%s of %d file%s", left == 1 ? "" : "s",
			left, left == 1 ? "" : "s");
		stop_abandoned(d, what, STOP_WAIT_MS);
	}
	d->pool = NULL;
	d->reg.pool = NULL;
	registry_close(&d->reg);
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sighup, NULL);
	uv_close((uv_handle_t *)&d->status_timer, NULL);
	uv_close((uv_handle_t *)&d->notify_timer, NULL);
	uv_close((uv_handle_t *)&d->residency_timer, NULL);
	uv_close((uv_handle_t *)&d->stall_timer, NULL);
	uv_close((uv_handle_t *)&d->start_timer, NULL);
	uv_close((uv_handle_t *)&d->checks_timer, NULL);
	/* What is left are the threads' jobs, and their after callbacks. A
	 * timer counts from the loop's time, which is still when this
	 * iteration's poll returned (about begun): brought up to now, or the
	 * time spent above would count twice (the timer fired at
	 * max(spent, STOP_WAIT_MS - spent), 3 s after SIGTERM for a 3 s
	 * close of the warm pool). */
	uv_update_time(&d->loop);
	spent_ms = (uv_hrtime() - begun) / 1000000u;
	uv_timer_start(&d->stop_timer, on_stop_overdue,
		spent_ms < STOP_WAIT_MS ? STOP_WAIT_MS - spent_ms : 0, 0);
	uv_unref((uv_handle_t *)&d->stop_timer);
}
