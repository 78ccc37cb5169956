/*
 * main.c: wcached, the shared weight cache daemon.
 *
 * Reads the configuration, opens and validates every model once, listens on
 * the client socket (its own, or one systemd passed), and runs the libuv
 * loop: clients attach models, warm threads fill the page cache, signals
 * reload (SIGHUP) or stop (SIGTERM, SIGINT) the daemon. On stop it closes
 * every handle and runs the loop until uv_loop_close() succeeds, so nothing
 * leaks, and removes only the socket files it created; work its threads
 * have not ended within STOP_WAIT_MS (a hung network filesystem) is left.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "config.h"
#include "control.h"
#include "base/error.h"
#include "log.h"
#include "memlimit.h"
#include "listen.h"
#include "notify.h"
#include "registry.h"
#include "restore.h"
#include "server.h"
#include "stage.h"
#include "format/source.h"
#include "generation.h"
#include "warm.h"
#include "derive.h"
#include "watch.h"

#define DEFAULT_CONFIG "/etc/wcached.conf"
/* Threads of the work queue unless UV_THREADPOOL_SIZE says otherwise. */
#define WORK_THREADS 8

struct daemon {
	uv_loop_t loop;
	struct config *cfg;
	const char *config_path;
	struct registry reg;
	struct warm_pool *pool;
	struct server *server;
	struct derive_table derive; /* derived artifacts (derive.h) */
	struct memlimit mem;        /* the memory limit in force, read at start and reload */
	struct watch *watch;
	struct control *control;
	struct control_context control_ctx;
	char *created_control; /* path of the control socket we made */
	uv_signal_t sigterm, sigint, sighup;
	int listen_fd;        /* client socket until the server takes it */
	int serving;
	int stopping;
	unsigned reloads;     /* config reloads in progress */
	uv_timer_t status_timer;
	uv_timer_t notify_timer;  /* sends what a manager that did not read missed */
	uv_timer_t residency_timer; /* warm models that memory pressure shrank again */
	uv_timer_t stall_timer;     /* remote work that has not returned (workq.h) */
	uv_timer_t start_timer;     /* start_wait_seconds: serve without the slow loads */
	struct batch *start_batch;  /* the start-up loads, until they end or time out */
	uv_timer_t checks_timer;  /* starts the full checks of restored generations */
	uv_timer_t stop_timer;    /* a stop that waited STOP_WAIT_MS for threads */
	char *created_socket; /* path of the socket file we made, to remove */
	uint64_t started_ms;
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: wcached [-c FILE] [--check] [--debug]\n\n"
		   "Serves model weights to worker processes from one shared page cache.\n\n"
		   "  -c, --config FILE  configuration file (default " DEFAULT_CONFIG ")\n"
		   "      --check        validate the configuration and every model, then exit\n"
		   "                     0 when all are valid, 1 otherwise\n"
		   "  -d, --debug        log at debug level\n"
		   "  -h, --help         this help\n"
		   "  -V, --version      print the version\n");
}

/* --check: validates the config and every model; prints one line each. */
static int
check(const char *path)
{
	struct config *cfg;
	struct model_source s;
	int bad = 0;

	if (config_load(path, &cfg) < 0) {
		fprintf(stderr, "wcached: %s\n", error_get());
		return 1;
	}
	for (size_t i = 0; i < cfg->n_models; i++) {
		const struct model_config *m = &cfg->models[i];
		struct index_header h;

		if (source_open(m->path, &s) < 0) {
			fprintf(stderr, "wcached: model \"%s\": %s\n", m->name, error_get());
			bad = 1;
			continue;
		}
		if (index_open(s.index, s.index_len, &h) == 0)
			printf("model \"%s\": ok: %" PRIu64 " tensors in %zu file%s (%s)\n",
				m->name, h.tensor_count, s.nfiles, s.nfiles == 1 ? "" : "s",
				source_format_name(s.format));
		source_close(&s);
	}
	/* Valid, but a daemon that serves nothing is rarely what was meant
	 * (the packaged configuration starts that way): a warning, not an error. */
	if (cfg->n_models == 0)
		fprintf(stderr, "wcached: warning: %s configures no model: wcached would serve "
				"nothing; add a [model NAME] section with path = ... (see "
				"wcached.conf(5))\n", path);
	printf("%s: %s\n", path, bad ? "errors found" : cfg->n_models == 0 ? "ok, no models" : "ok");
	config_free(cfg);
	return bad;
}

/*
 * Reads the memory limit in force (memlimit.h: RAM, or the daemon's cgroup
 * limit when smaller) into d->mem, logs it when it is new or changed, and
 * returns cfg's memory budget in bytes (0: none): a percent budget is of
 * that limit.
 */
static uint64_t
memory_budget(struct daemon *d, const struct config *cfg)
{
	struct memlimit old = d->mem;
	uint64_t budget;
	char src[400];

	memlimit_read("", memlimit_ram(), &d->mem);
	budget = config_memory_budget(cfg, d->mem.limit);
	if (d->mem.limit != old.limit || d->mem.kind != old.kind)
		log_info("memory: %" PRIu64 " MiB in force (%s; RAM %" PRIu64 " MiB)%s",
			d->mem.limit >> 20, memlimit_source(&d->mem, src, sizeof(src)),
			d->mem.ram >> 20,
			d->mem.kind == MEMLIMIT_RAM ? "" :
				": wcached's cgroup pays for the page cache it warms, so the "
				"warm set must fit under this limit");
	if (budget > d->mem.limit && d->mem.kind != MEMLIMIT_RAM)
		log_warnx("memory_budget (%" PRIu64 " MiB) is above the memory limit in force "
			  "(%" PRIu64 " MiB, %s): the kernel reclaims warm models before the "
			  "budget evicts any", budget >> 20, d->mem.limit >> 20,
			memlimit_source(&d->mem, src, sizeof(src)));
	return budget;
}

/* Warns once loads end when the models served do not fit under the memory
 * limit in force: the kernel would reclaim what was just warmed. */
static void
check_fit(struct daemon *d)
{
	uint64_t total = 0;
	unsigned n = 0;
	char src[400];

	for (const struct model_entry *m = d->reg.models; m != NULL; m = m->next) {
		if (m->current == NULL)
			continue;
		total += m->current->bytes;
		n++;
	}
	if (d->mem.limit == 0 || total <= d->mem.limit)
		return;
	log_warnx("the %u model%s served (%" PRIu64 " MiB) do not fit under the memory limit "
		  "in force (%" PRIu64 " MiB, %s): the kernel will reclaim warm pages and "
		  "workers will read from disk; %s", n, n == 1 ? "" : "s", total >> 20,
		d->mem.limit >> 20, memlimit_source(&d->mem, src, sizeof(src)),
		d->mem.kind == MEMLIMIT_RAM ? "serve fewer models, or set memory_budget to keep "
					      "the most used ones warm" :
					      "raise or remove that limit (see README, "
					      "\"Memory limits\"), or set memory_budget");
}

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

static void
batch_step(struct batch *b)
{
	struct daemon *d = b->d;

	if (b->pending > 0)
		return;
	if (d->start_batch == b) {
		uv_timer_stop(&d->start_timer);
		d->start_batch = NULL;
	}
	if (!b->early)
		b->done(d, b->failed, b->arg);
	else
		log_info("every configured model's load has ended (%u failed)", b->failed);
	free(b);
}

/* start_wait_seconds passed with start-up loads still running (a network
 * filesystem that hangs, a long staging copy): serve the models that are
 * ready; the others are served when their loads end. */
static void
on_start_wait(uv_timer_t *t)
{
	struct daemon *d = t->data;
	struct batch *b = d->start_batch;
	char names[256] = "";
	size_t len = 0;

	if (b == NULL)
		return;
	d->start_batch = NULL;
	b->early = 1;
	for (const struct model_entry *m = d->reg.models; m != NULL; m = m->next) {
		int n;

		if (m->loading == 0 || m->current != NULL || len >= sizeof(names))
			continue;
		n = snprintf(names + len, sizeof(names) - len, "%s\"%s\"", len ? ", " : "",
			m->name);
		len = n < 0 ? sizeof(names) : len + (size_t)n;
	}
	log_warnx("%u model%s still loading after %u s (start_wait_seconds): serving the "
		  "others now; %s%s", b->pending, b->pending == 1 ? " is" : "s are",
		d->cfg->start_wait_seconds, names, len >= sizeof(names) ? "..." : "");
	b->done(d, b->failed, b->arg);
}

static void
batch_load_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct batch *b = arg;

	(void)message;
	(void)generation;
	/* -ECANCELED: an unload or a newer load took its place (or wcached
	 * stops), which is no failure of it. */
	if (status < 0 && status != -ECANCELED)
		b->failed++;
	b->pending--;
	batch_step(b);
}

/* Applies who may do what with a model: allow_users and allow_groups
 * (attach), derive, derive_groups and derive_timeout (build artifacts). */
static void
set_access(struct daemon *d, const struct model_config *m)
{
	int restricted = m->allow_users != NULL || m->allow_groups != NULL;

	if (registry_set_access(&d->reg, m->name, restricted, m->uids, m->n_uids, m->gids,
		    m->n_gids) < 0 ||
		registry_set_derive(&d->reg, m->name, m->derive, m->derive_gids, m->n_derive_gids,
			m->derive_timeout) < 0 ||
		registry_set_storage(&d->reg, m->name, m->watch, m->poll_interval_ms, m->stage) < 0)
		log_errorx("%s", error_get());
}

static void
batch_load(struct batch *b, const struct model_config *m)
{
	if (registry_load(&b->d->reg, m->name, m->path, m->pin, m->warm, batch_load_done,
		    b) < 0) {
		log_errorx("%s; not served", error_get());
		b->failed++;
		return;
	}
	set_access(b->d, m);
	b->pending++;
}

/* A warm restart's check of a model ended (restore.h): served, or loaded
 * afresh as configured now (a load that may fail). Gone (unloaded, or
 * loaded anew meanwhile) is no failure, as a superseded load is none. */
static void
batch_restore_done(const char *name, enum restore_result result, void *arg)
{
	struct batch *b = arg;
	const struct model_config *m = NULL;

	for (size_t i = 0; result == RESTORE_LOAD && i < b->d->cfg->n_models && m == NULL; i++)
		if (strcmp(b->d->cfg->models[i].name, name) == 0)
			m = &b->d->cfg->models[i];
	if (m != NULL)
		batch_load(b, m);
	b->pending--;
	batch_step(b);
}

static struct batch *
batch_new(struct daemon *d, void (*done)(struct daemon *, unsigned, void *), void *arg)
{
	struct batch *b = calloc(1, sizeof(*b));

	if (b == NULL)
		fatalx("out of memory");
	b->d = d;
	b->done = done;
	b->arg = arg;
	b->pending = 1; /* held until every load is queued */
	return b;
}

static void
batch_release(struct batch *b)
{
	b->pending--;
	batch_step(b);
}

/* Sends a STATUS= line with warming progress; keeps the timer running only
 * while something warms. */
static void
send_status(struct daemon *d)
{
	uint64_t done, total;
	unsigned warming, models;

	registry_progress(&d->reg, &done, &total, &warming, &models);
	if (warming > 0) {
		notify_send("STATUS=warming %u of %u models: %.0f%% (%" PRIu64 " of %" PRIu64
			    " MiB)", warming, models, total ? 100.0 * (double)done / (double)total : 100.0,
			done >> 20, total >> 20);
		if (!uv_is_active((uv_handle_t *)&d->status_timer))
			uv_timer_again(&d->status_timer);
	} else {
		notify_send("STATUS=serving %u models, %" PRIu64 " MiB warm, %u clients", models,
			total >> 20, d->server ? server_clients(d->server) : 0);
		uv_timer_stop(&d->status_timer);
	}
}

static void
on_status_timer(uv_timer_t *t)
{
	send_status(t->data);
}

/* How often warm models are checked for pages memory pressure took. */
#define RESIDENCY_CHECK_MS 5000

static void
on_residency_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;

	registry_check_residency(&d->reg);
}

/* Work on remote filesystems that has not returned for a while is logged
 * (workq.h): looked at this often. */
#define STALL_CHECK_MS 1000

static void
on_stall_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;

	workq_check_stalls(&d->reg.workq);
}

/* The full checks of the generations a warm restart took back (index
 * record by record, metadata lock, every page mapped: registry.h) start
 * this long after serving does, so that the workers reconnecting at once
 * have both cores; the generations serve meanwhile. */
#define RESTORE_CHECKS_DELAY_MS 100

static void
on_checks_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;

	restore_checks(&d->reg);
}

/* Notifications the manager had no room for wait in notify.c; send them
 * when it reads again (never blocking the loop). */
static void
on_notify_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;

	if (notify_flush() < 0)
		log_warnx("%s", error_get());
	/* What the manager's full queue refused goes again (restore.h). */
	restore_sync(&d->reg);
	/* Generations held before a restart that nobody claimed close. */
	restore_expire_holds(&d->reg);
}

static void
on_registry_changed(struct registry *r)
{
	struct daemon *d = r->owner;
	uint64_t done, total;
	unsigned warming, models;

	/* Immediate status only when warming just ended; the timer covers
	 * progress in between. */
	/* Models come and go through the control socket too: keep the
	 * watched directories in step. */
	if (d->watch != NULL)
		watch_sync(d->watch);
	restore_sync(r);
	registry_progress(r, &done, &total, &warming, &models);
	if (warming == 0 && d->serving)
		send_status(d);
}

static void
reload_model(enum config_change change, const struct model_config *old_model,
	const struct model_config *new_model, unsigned changes, void *arg)
{
	struct batch *b = arg;

	if (change == CONFIG_MODEL_REMOVED) {
		registry_unload(&b->d->reg, old_model->name);
		return;
	}
	if (change == CONFIG_MODEL_ADDED ||
		(changes & (CONFIG_CHANGED_PATH | CONFIG_CHANGED_WARM | CONFIG_CHANGED_STAGE))) {
		batch_load(b, new_model);
		return;
	}
	/* Only who may attach, or what is pinned, changed: no new generation. */
	if (changes & (CONFIG_CHANGED_ACCESS | CONFIG_CHANGED_DERIVE | CONFIG_CHANGED_WATCH))
		set_access(b->d, new_model);
	if ((changes & CONFIG_CHANGED_PIN) &&
		registry_pin(&b->d->reg, new_model->name, new_model->pin) < 0)
		log_warnx("%s", error_get());
}

/* What a config reload reports to its requester when its loads end. */
struct reload_request {
	registry_done_fn done;
	void *arg;
};

static void
reload_finished(struct daemon *d, unsigned failed, void *arg)
{
	struct reload_request *req = arg;
	char msg[128];

	d->reloads--;
	if (d->watch != NULL)
		watch_sync(d->watch);
	if (d->reloads == 0 && !d->stopping) {
		notify_send("READY=1");
		send_status(d);
	}
	snprintf(msg, sizeof(msg), "configuration reloaded%s", failed ? "; some models failed" : "");
	log_info("%s", msg);
	check_fit(d);
	if (req != NULL && req->done != NULL)
		req->done(failed ? -EIO : 0, failed ? "configuration reloaded; some models failed "
						      "to load (see status)" :
						      msg,
			0, req->arg);
	free(req);
}

/* Where staged copies go (stage.h): created if missing, given to uid:gid
 * (as root before dropping privileges; (uid_t)-1 otherwise). A stage_dir
 * that cannot be made is said once here; each model that must stage is
 * then refused with the reason. */
static void
set_stage_dir(struct daemon *d, const struct config *cfg, uid_t uid, gid_t gid)
{
	/* Said at debug only: most hosts stage nothing, and a model that
	 * must stage says why it cannot in its one line. */
	if (stage_prepare_dir(cfg->stage_dir, uid, gid) < 0)
		log_debug("%s; models that stage are refused until it can be", error_get());
	if (registry_set_stage_dir(&d->reg, cfg->stage_dir) < 0)
		log_errorx("%s", error_get());
}

/*
 * Re-reads the configuration and adds, drops or reloads models; done (may
 * be NULL) runs when every load it started has ended. For SIGHUP and for
 * `wcachectl reload`.
 */
static int
reload_config(struct daemon *d, registry_done_fn done, void *arg)
{
	struct config *cfg;
	struct reload_request *req;
	struct batch *b;

	if (config_load(d->config_path, &cfg) < 0) {
		log_errorx("reload refused: %s", error_get());
		return -EINVAL;
	}
	if ((req = calloc(1, sizeof(*req))) == NULL) {
		config_free(cfg);
		return error_set(-ENOMEM, "out of memory");
	}
	req->done = done;
	req->arg = arg;
	notify_send("RELOADING=1\nSTATUS=reloading %s", d->config_path);
	log_info("reloading %s", d->config_path);
	if (strcmp(cfg->socket_path, d->cfg->socket_path) != 0)
		log_warnx("socket path changed to %s: takes effect after a restart",
			cfg->socket_path);
	log_setlevel(cfg->log_level);
	d->reg.memory_budget = memory_budget(d, cfg);
	registry_enforce_budget(&d->reg);
	set_stage_dir(d, cfg, (uid_t)-1, (gid_t)-1);
	d->reloads++;
	b = batch_new(d, reload_finished, req);
	config_diff(d->cfg, cfg, reload_model, b);
	config_free(d->cfg);
	d->cfg = cfg;
	batch_release(b);
	return 0;
}

static void
on_swapped(struct registry *r, struct model_entry *m, uint64_t generation)
{
	struct daemon *d = r->owner;

	server_announce(d->server, m, generation);
	derive_collect(&d->derive);
	restore_sync(r);
}

static void
close_walk(uv_handle_t *h, void *arg)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

/*
 * A stop waits this long for the work its threads are doing (loads, polls,
 * copies, warm-ups: each stops at its next check of the stop). A read of a
 * network or FUSE filesystem whose server hangs never returns, and would
 * hold the stop until the service manager killed wcached (TimeoutStopSec:
 * 90 s, with no wcached for workers to reach meanwhile); so after this
 * wcached logs what it left and exits without it (stop_abandoned).
 */
#define STOP_WAIT_MS 5000

/* What wcached does last, stopped cleanly or not: removes the socket files
 * it created and lets the manager read STOPPING=1. */
static void
remove_sockets(struct daemon *d)
{
	if (d->created_socket != NULL) {
		unlink(d->created_socket);
		free(d->created_socket);
		d->created_socket = NULL;
	}
	if (d->created_control != NULL) {
		unlink(d->created_control);
		free(d->created_control);
		d->created_control = NULL;
	}
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
stop_abandoned(struct daemon *d, const char *what)
{
	log_warnx("stopping without waiting longer for %s: not returned after %.1f s (a read of "
		  "a hung network filesystem never returns)", what, STOP_WAIT_MS / 1000.0);
	remove_sockets(d);
	log_info("stopped");
	fflush(stderr);
	_exit(0);
}

/* stop_timer: the loop still waits for work on its threads. Work on
 * local files (a long load, a slow sanitizer build) is waited for, as
 * before: only a remote server is known to hang. */
static void
on_stop_overdue(uv_timer_t *t)
{
	struct daemon *d = t->data;
	const struct workq *q = &d->reg.workq;
	char what[sizeof(q->running->what) + 64];

	if (q->running == NULL) {
		log_info("stopping: still waiting for work on local files");
		return;
	}
	snprintf(what, sizeof(what), "%s (%u remote job%s running)", q->running->what,
		q->remote_running, q->remote_running == 1 ? "" : "s");
	stop_abandoned(d, what);
}

static void
shutdown_daemon(struct daemon *d)
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
		stop_abandoned(d, what);
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

/* control_context.reload_config: `wcachectl reload` without a name. */
static int
control_reload(void *arg, registry_done_fn done, void *done_arg)
{
	return reload_config(arg, done, done_arg);
}

/* Opens the control socket: 0600, or 0660 for control_group. */
static void
start_control(struct daemon *d)
{
	int has_group = d->cfg->control_group != NULL, fd, r;

	/* A socket unit may pass it as "control"; else we make it. */
	if ((r = listen_fds_take("control", SOCK_STREAM, &fd)) < 0)
		fatalx("%s", error_get());
	if (r == 0) {
		fd = control_listen_path(d->cfg->control_path, has_group ? 0660 : 0600,
			has_group ? d->cfg->control_gid : (gid_t)-1);
		if (fd < 0)
			fatalx("%s", error_get());
		d->created_control = strdup(d->cfg->control_path);
	}
	d->control_ctx = (struct control_context){
		.reg = &d->reg,
		.derive = &d->derive,
		.mem = &d->mem,
		.started_ms = uv_now(&d->loop),
		.reload_config = control_reload,
		.arg = d,
		.daemon_uid = geteuid(),
		.has_group = has_group,
		.group = d->cfg->control_gid,
	};
	if (control_start(&d->loop, fd, &d->control_ctx, &d->control) < 0)
		fatalx("%s", error_get());
}

/*
 * user = NAME: when started as root, hand the sockets wcached created to
 * that user and become it, before any model is opened (so models are read
 * with the user's rights, as under systemd's User=).
 */
static void
drop_privileges(struct daemon *d)
{
	const struct config *c = d->cfg;

	if (c->user == NULL)
		return;
	if (geteuid() != 0) {
		if (geteuid() != c->user_uid)
			log_warnx("user = %s: not started as root, staying uid %u", c->user,
				(unsigned)geteuid());
		return;
	}
	if ((d->created_socket != NULL && chown(d->created_socket, c->user_uid, c->user_gid) == -1) ||
		(d->created_control != NULL &&
			chown(d->created_control, c->user_uid, c->user_gid) == -1))
		fatal("user = %s: chown of the sockets", c->user);
	if (initgroups(c->user, c->user_gid) == -1 || setgid(c->user_gid) == -1 ||
		setuid(c->user_uid) == -1)
		fatal("user = %s: cannot switch to uid %u gid %u", c->user, (unsigned)c->user_uid,
			(unsigned)c->user_gid);
	if (setuid(0) != -1)
		fatalx("user = %s: could regain root after switching", c->user);
	d->control_ctx.daemon_uid = c->user_uid;
	log_info("running as user %s (uid %u)", c->user, (unsigned)c->user_uid);
}

/* The configured models have been loaded (or failed): serve. */
static void
start_serving(struct daemon *d, unsigned failed, void *arg)
{
	struct server_options sopt = { .max_clients = d->cfg->max_clients,
		.max_clients_per_uid = d->cfg->max_clients_per_uid, .derive = &d->derive };

	(void)arg;
	if (d->stopping)
		return;
	if (server_start(&d->loop, &d->reg, d->listen_fd, &sopt, &d->server) < 0)
		fatalx("%s", error_get());
	d->listen_fd = -1; /* the server owns it */
	d->serving = 1;
	d->control_ctx.server = d->server;
	watch_sync(d->watch);
	uv_timer_start(&d->status_timer, on_status_timer, 1000, 1000);
	uv_timer_start(&d->checks_timer, on_checks_timer, RESTORE_CHECKS_DELAY_MS, 0);
	log_info("serving on %s (%u model%s failed to load)", d->cfg->socket_path, failed,
		failed == 1 ? "" : "s");
	check_fit(d);
	notify_send("READY=1");
	send_status(d);
}

static void
on_signal(uv_signal_t *s, int signum)
{
	struct daemon *d = s->data;

	if (signum != SIGHUP) {
		shutdown_daemon(d);
		return;
	}
	if (reload_config(d, NULL, NULL) < 0) {
		notify_send("READY=1");
		send_status(d);
	}
}

int
main(int argc, char **argv)
{
	static const struct option options[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'C' },
		{ "debug", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct daemon d = { .config_path = DEFAULT_CONFIG, .listen_fd = -1 };
	struct warm_options wopt = { 0 };
	struct restore *stored = NULL;
	char *const *keep;
	size_t nkeep;
	int opt, do_check = 0, debug = 0, notifying, fdstore, r;

	while ((opt = getopt_long(argc, argv, "c:dhV", options, NULL)) != -1) {
		switch (opt) {
		case 'c':
			d.config_path = optarg;
			break;
		case 'C':
			do_check = 1;
			break;
		case 'd':
			debug = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("wcached %s\n", WCACHE_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (do_check)
		return check(d.config_path);

	log_init(LOG_LEVEL_INFO, "wcached");
	if (config_load(d.config_path, &d.cfg) < 0)
		fatalx("%s", error_get());
	log_setlevel(debug ? LOG_LEVEL_DEBUG : d.cfg->log_level);
	signal(SIGPIPE, SIG_IGN);
	/* A file size limit (RLIMIT_FSIZE) fails a staging copy with EFBIG, not the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	if ((notifying = notify_init()) < 0)
		log_warnx("%s", error_get());
	/* Under a manager with a file descriptor store: take back what the
	 * previous process stored (restore.h). */
	if ((fdstore = notifying > 0 && restore_enabled()))
		stored = restore_take();

	/* Threads of libuv's work queue (loads, staging, page work, polls):
	 * half of them may wait on remote filesystems (workq.h). */
	workq_default_pool_size(WORK_THREADS);
	if ((r = uv_loop_init(&d.loop)) < 0)
		fatalx("uv_loop_init: %s", uv_strerror(r));
	wopt.threads = (unsigned)d.cfg->prefetch_threads;
	if ((r = warm_pool_new(&d.loop, &wopt, &d.pool)) < 0)
		fatalx("cannot start %d prefetch threads: %s", d.cfg->prefetch_threads,
			strerror(-r));
	if (!fdstore && registry_init(&d.reg, &d.loop, d.pool) < 0)
		fatalx("%s", error_get());
	if (fdstore) {
		int status_fd = restore_status_fd(stored);

		if (registry_init_stored(&d.reg, &d.loop, d.pool, status_fd) == 0)
			restore_status_taken(stored);
		else if (status_fd < 0)
			fatalx("%s", error_get());
		else {
			log_warnx("warm restart: %s; a new status page", error_get());
			if (registry_init_stored(&d.reg, &d.loop, d.pool, -1) < 0)
				fatalx("%s", error_get());
		}
		restore_slots(stored, &d.reg);
	}
	d.reg.owner = &d;
	d.reg.changed = on_registry_changed;
	d.reg.swapped = on_swapped;
	d.reg.closed = restore_forget;
	d.reg.memory_budget = memory_budget(&d, d.cfg);
	d.reg.restart_hold_ms = (int)d.cfg->restart_hold_seconds * 1000;
	if (derive_init(&d.derive, &d.reg, &server_derive_hooks) < 0)
		fatalx("derived artifacts: out of memory");
	if (watch_start(&d.loop, &d.reg, &d.watch) < 0)
		fatalx("%s", error_get());

	/* Signals first: from the moment a socket exists, a SIGTERM must
	 * stop the daemon cleanly. */
	uv_signal_init(&d.loop, &d.sigterm);
	uv_signal_init(&d.loop, &d.sigint);
	uv_signal_init(&d.loop, &d.sighup);
	d.sigterm.data = d.sigint.data = d.sighup.data = &d;
	uv_signal_start(&d.sigterm, on_signal, SIGTERM);
	uv_signal_start(&d.sigint, on_signal, SIGINT);
	uv_signal_start(&d.sighup, on_signal, SIGHUP);

	/* The control socket, then the client socket (taken or created now,
	 * so a second daemon fails at once; served when the configured models
	 * are loaded); then drop root, before any model is opened. */
	start_control(&d);
	r = listen_fds_take("client", SOCK_SEQPACKET, &d.listen_fd);
	if (r < 0)
		fatalx("%s", error_get());
	if (r == 0) {
		if ((d.listen_fd = server_listen_path(d.cfg->socket_path, 0660)) < 0)
			fatalx("%s", error_get());
		d.created_socket = strdup(d.cfg->socket_path);
	}
	listen_fds_unset();
	/* stage_dir before dropping root, so that it can be given to the user. */
	if (d.cfg->user != NULL && geteuid() == 0)
		set_stage_dir(&d, d.cfg, d.cfg->user_uid, d.cfg->user_gid);
	drop_privileges(&d);
	if (d.reg.stage_dir == NULL)
		set_stage_dir(&d, d.cfg, (uid_t)-1, (gid_t)-1);

	uv_timer_init(&d.loop, &d.status_timer);
	d.status_timer.data = &d;
	uv_timer_init(&d.loop, &d.residency_timer);
	d.residency_timer.data = &d;
	uv_timer_start(&d.residency_timer, on_residency_timer, RESIDENCY_CHECK_MS,
		RESIDENCY_CHECK_MS);
	uv_timer_init(&d.loop, &d.stall_timer);
	d.stall_timer.data = &d;
	uv_timer_start(&d.stall_timer, on_stall_timer, STALL_CHECK_MS, STALL_CHECK_MS);
	uv_timer_init(&d.loop, &d.start_timer);
	d.start_timer.data = &d;
	uv_timer_init(&d.loop, &d.notify_timer);
	d.notify_timer.data = &d;
	uv_timer_init(&d.loop, &d.checks_timer);
	d.checks_timer.data = &d;
	uv_timer_init(&d.loop, &d.stop_timer);
	d.stop_timer.data = &d;
	if (notifying)
		uv_timer_start(&d.notify_timer, on_notify_timer, 200, 200);

	struct batch *b = batch_new(&d, start_serving, NULL);
	for (size_t i = 0; i < d.cfg->n_models; i++) {
		const struct model_config *m = &d.cfg->models[i];

		if (fdstore && restore_model(stored, &d.reg, m->name, m->path, m->pin, m->warm,
				       batch_restore_done, b)) {
			set_access(&d, m);
			b->pending++;
		} else {
			batch_load(b, m);
		}
	}
	/* What a crashed or stopped wcached left in stage_dir but the copies
	 * a warm restart is checking, before any staging starts (stagings are
	 * queued from the loop). */
	restore_copies(stored, &keep, &nkeep);
	registry_stage_sweep(&d.reg, keep, nkeep);
	if (fdstore)
		restore_started(stored, &d.reg);
	d.start_batch = b;
	uv_timer_start(&d.start_timer, on_start_wait, (uint64_t)d.cfg->start_wait_seconds * 1000, 0);
	batch_release(b); /* may serve at once (nothing to wait for) */
	uv_run(&d.loop, UV_RUN_DEFAULT);

	/* Every handle is closed; close anything left and drain the loop. */
	uv_walk(&d.loop, close_walk, NULL);
	uv_run(&d.loop, UV_RUN_DEFAULT);
	if ((r = uv_loop_close(&d.loop)) < 0)
		log_warnx("uv_loop_close: %s", uv_strerror(r));
	remove_sockets(&d);
	notify_close();
	config_free(d.cfg);
	log_info("stopped");
	return 0;
}
