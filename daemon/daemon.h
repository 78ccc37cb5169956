/*
 * daemon.h: what wcached's top layer shares, the files that were one main.c
 * until it held five concerns: main.c (the command line, --check, start-up,
 * the control socket, dropping root, serving, signals), batch.c (the loads
 * of the configured models at start and on reload), reload.c (a config
 * reload and the settings start-up applies the same way), timers.c (the
 * status, notify, residency, stall and restore-check timers) and stop.c
 * (the stop). They share one struct daemon, which main() owns on its
 * stack. Not for the modules below: they are handed what they need (the
 * registry, the loop) and report upward through hooks (MODULES.md).
 */
#ifndef WC_DAEMON_H
#define WC_DAEMON_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"
#include "control.h"
#include "derive.h"
#include "memlimit.h"
#include "registry.h"
#include "restore.h"

struct batch;
struct reload_read;

/* A socket file wcached made, removed at exit only while it is still the
 * one made (a successor may have replaced it already: a force-deleted Pod,
 * a stale socket taken over). path is NULL when wcached made none. */
struct made_socket {
	char *path;
	dev_t dev;
	ino_t ino;
};

/* wcached: one per process, in main()'s frame from start to exit. */
struct daemon {
	uv_loop_t loop;
	struct config *cfg;
	const char *config_path;
	struct registry reg;
	struct warm_pool *pool;
	struct server *server;
	struct closer *closer;      /* closes what clients chose, off the loop (closer.h) */
	struct derive_table derive; /* derived artifacts (derive.h) */
	struct memlimit mem;        /* the memory limit in force, read at start and reload */
	struct watch *watch;
	/* watch_sync once a loop turn, however many models changed in it (a
	 * reload of 2000 models synced 2000 times: 9 s of watch_sync). */
	uv_idle_t watch_idle;
	struct control *control;
	struct control_context control_ctx;
	struct made_socket created_control; /* the control socket we made */
	uv_signal_t sigterm, sigint, sighup;
	int listen_fd;        /* client socket until the server takes it */
	int serving;
	int stopping;
	unsigned reloads;     /* config reloads in progress */
	int debug;            /* -d: log at debug level whatever log_level says */
	struct reload_read *reload_reads; /* config reads asked for, the first running */
	uv_timer_t status_timer;
	uv_timer_t notify_timer;  /* sends what a manager that did not read missed */
	uv_timer_t residency_timer; /* warm models that memory pressure shrank again */
	uv_timer_t stall_timer;     /* remote work that has not returned (workq.h) */
	uv_timer_t start_timer;     /* start_wait_seconds: serve without the slow loads */
	struct batch *start_batch;  /* the start-up loads, until they end or time out */
	uv_timer_t checks_timer;  /* starts the full checks of restored generations */
	uv_timer_t stop_timer;    /* a stop that waited STOP_WAIT_MS for threads */
	int stop_unknown_waited;  /* ... and then longer for work on unknown filesystems */
	struct made_socket created_socket;  /* the client socket we made */
	uint64_t started_ms;
};

/*
 * A batch of loads (start-up or a config reload) that reports once when
 * every load in it has ended.
 */
struct batch {
	struct daemon *d;
	unsigned pending;
	unsigned failed;
	void (*done)(struct daemon *d, unsigned failed, void *arg);
	void *arg;
	int early;  /* done was called before every load ended (start_wait_seconds) */
};

/* batch.c: a batch of loads whose done(d, failed, arg) runs once when every
 * load in it has ended (or, for the start-up batch, at start_wait_seconds).
 * It starts held (pending 1): queue the loads, then batch_release(). */
struct batch *batch_new(struct daemon *d, void (*done)(struct daemon *, unsigned, void *),
	void *arg);

/* batch.c: drops batch_new()'s hold on b; done may run (and b be freed) now. */
void batch_release(struct batch *b);

/* batch.c: loads the configured model m as part of b (applying its access
 * with batch_set_access()); a load that cannot start counts as failed. */
void batch_load(struct batch *b, const struct model_config *m);

/* batch.c: reloads the model name in b as a reload wcached makes by
 * itself (registry_reload_watched: judged against the tree of the
 * generation serving), for a config reload's retry of a model whose
 * replacement failed (reload.c's retry_failed, review rev201 H4); one that
 * cannot start counts as failed. */
void batch_reload_watched(struct batch *b, const char *name);

/* batch.c: a warm restart's load of the model name, not restored (or with
 * no generation stored), as a reload wcached makes by itself judged
 * against the tree the store recorded (restore.h's RESTORE_JUDGED,
 * RESTORE_MODEL_JUDGED), in b. One that cannot be queued is not loaded
 * otherwise: it waits for the operator's `wcachectl reload NAME`, its
 * error and status saying why (registry_wait_for_operator), and counts as
 * failed (review rev206 L2). */
void batch_judged_load(struct batch *b, const char *name);

/* batch.c: applies who may do what with the configured model m: attach
 * (allow_users, allow_groups), build artifacts (derive, derive_groups,
 * derive_timeout), and how its storage is watched and staged. */
void batch_set_access(struct daemon *d, const struct model_config *m);

/* batch.c: restore_model()'s callback for a model in the start-up batch
 * (arg): loads it as configured where the warm restart gave it up. */
void batch_restore_done(const char *name, enum restore_result result, void *arg);

/* batch.c: d->start_timer's callback at start_wait_seconds: serves the
 * models that are ready while the start-up batch's other loads go on. */
void batch_on_start_wait(uv_timer_t *t);

/* batch.c: warns, once a batch's loads end, when the models served do not
 * fit under the memory limit in force. */
void batch_check_fit(struct daemon *d);

/* reload.c: reads the memory limit in force into d->mem (logged when new or
 * changed) and returns cfg's memory budget in bytes (0: none). */
uint64_t reload_memory_budget(struct daemon *d, const struct config *cfg);

/* reload.c: is cfg's stage_dir on a network or FUSE filesystem
 * (stage_dir_check_local; blocking: off the loop)? 0 no; 1 yes, the
 * warning in error_get(); -EREMOTE or -EXDEV where a model has stage = yes
 * too, which it refuses (review rev221 M3). */
int reload_stage_dir_remote(const struct config *cfg);

/* reload.c: prepares cfg's stage_dir (given to uid:gid when started as
 * root, (uid_t)-1 and (gid_t)-1 otherwise) and tells the registry; a
 * remote one (reload_stage_dir_remote) is only told. */
void reload_set_stage_dir(struct daemon *d, const struct config *cfg, uid_t uid, gid_t gid,
	int remote);

/* reload.c: re-reads the configuration and adds, drops or reloads models;
 * done (may be NULL) runs with arg when every load it started has ended.
 * A reload asked while another waits behind the read running shares that
 * one's read and answer. 0, or a negative errno-style code when nothing
 * was reloaded. */
int reload_config(struct daemon *d, registry_done_fn done, void *arg);

/* How often warm models are checked for pages memory pressure took. */
#define RESIDENCY_CHECK_MS 5000

/* Work on remote filesystems that has not returned for a while is logged
 * (workq.h): looked at this often. */
#define STALL_CHECK_MS 1000

/* The full checks of the generations a warm restart took back (index
 * record by record, metadata lock, every page mapped: registry.h) start
 * this long after serving does, so that the workers reconnecting at once
 * have both cores; the generations serve meanwhile. */
#define RESTORE_CHECKS_DELAY_MS 100

/* timers.c: sends the manager a STATUS= line (warming progress, or what is
 * served); keeps d->status_timer running only while something warms. */
void timers_send_status(struct daemon *d);

/* timers.c: the callbacks of d's timers (t->data is d): status_timer
 * (progress while warming), residency_timer (registry_check_residency),
 * stall_timer (workq_check_stalls), checks_timer (restore_checks, once)
 * and notify_timer (what the manager could not read yet, the fd store in
 * step, unclaimed holds from before a restart). */
void timers_on_status(uv_timer_t *t);
void timers_on_residency(uv_timer_t *t);
void timers_on_stall(uv_timer_t *t);
void timers_on_checks(uv_timer_t *t);
void timers_on_notify(uv_timer_t *t);

/* stop.c: what wcached does last, stopped cleanly or not: removes the
 * socket files it created and waits a little for the manager to read
 * STOPPING=1. */
void stop_remove_sockets(struct daemon *d);

/* Records path as a socket file wcached just made (its device and inode);
 * out of memory, it is simply not removed at exit. */
void stop_made_socket(struct made_socket *m, const char *path);

/* stop.c: stops wcached (SIGTERM, SIGINT): the fd store first, then the
 * server, the control socket, the watch, the warm pool and the registry,
 * and every handle of d's, so that main()'s loop ends. Warm-ups, and work
 * on a remote filesystem, that have not ended within STOP_WAIT_MS are left
 * (first loads after STOP_UNKNOWN_WAIT_MS): wcached exits then with
 * _exit(0). Called again, does nothing. */
void stop_daemon(struct daemon *d);

#endif
