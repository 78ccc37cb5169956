/*
 * reload.c: a config reload (SIGHUP, `wcachectl reload`): the new
 * configuration is compared with the one in force, models are added,
 * dropped or loaded again in one batch (batch.c), and only what changed is
 * applied, but for failed models, which are loaded again whatever changed.
 * Also the settings start-up applies the same way: the memory budget
 * against the limit in force, and stage_dir.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/error.h"
#include "config.h"
#include "daemon.h"
#include "derive.h"
#include "generation.h"
#include "log.h"
#include "memlimit.h"
#include "notify.h"
#include "registry.h"
#include "stage.h"
#include "watch.h"
#include "workq.h"

/*
 * Reads the memory limit in force (memlimit.h: RAM, or the daemon's cgroup
 * limit when smaller) into d->mem and the derived artifacts' table (their
 * bound without a budget; at a start derive_init, which runs later, clears
 * it and main.c sets it again), logs it when it is new or changed, and
 * returns cfg's memory budget in bytes (0: none): a percent budget is of
 * that limit.
 */
uint64_t
reload_memory_budget(struct daemon *d, const struct config *cfg)
{
	struct memlimit old = d->mem;
	uint64_t budget;
	char src[400];

	memlimit_read("", memlimit_ram(), &d->mem);
	derive_set_memory_limit(&d->derive, &d->mem);
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

/* Whether the registry serves the model called name (registry_find also
 * answers to a configured path). */
static int
served(struct daemon *d, const char *name)
{
	const struct model_entry *m = registry_find(&d->reg, name);

	return m != NULL && strcmp(m->name, name) == 0;
}

/* Names the keys that changes (CONFIG_CHANGED_* bits) says differ, in buf,
 * for a log line: "pin, allow_users/allow_groups". */
static void
changed_keys(unsigned changes, char *buf, size_t size)
{
	static const struct {
		unsigned bit;
		const char *keys;
	} names[] = {
		{ CONFIG_CHANGED_PATH, "path" },
		{ CONFIG_CHANGED_PIN, "pin" },
		{ CONFIG_CHANGED_WARM, "warm" },
		{ CONFIG_CHANGED_ACCESS, "allow_users/allow_groups" },
		{ CONFIG_CHANGED_DERIVE, "derive/derive_groups/derive_timeout" },
		{ CONFIG_CHANGED_WATCH, "watch/poll_interval" },
		{ CONFIG_CHANGED_STAGE, "stage" },
	};
	size_t len = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && len < size; i++) {
		int n;

		if (!(changes & names[i].bit))
			continue;
		n = snprintf(buf + len, size - len, "%s%s", len ? ", " : "", names[i].keys);
		len = n < 0 ? size : len + (size_t)n;
	}
}

/*
 * Applies one model's change (config_diff). A configured model the
 * registry does not serve was unloaded at run time (`wcachectl unload`),
 * or its load was refused before it had an entry (registry_refused): the
 * first lasts until a restart or a reload that changes its section
 * (`wcachectl unload --help`), the second until a reload
 * (unchanged_not_served). When the section changed, whatever the key, the
 * reload serves it as configured, as a start would, with one line saying
 * which it was; before, only a change of path, warm or stage brought it
 * back, and a change of pin or of the access lists left it unloaded with
 * an error naming no cause, while the reload answered ok.
 */
/* A reload that turns a model's derive off drops its derived artifacts as
 * `wcachectl drop NAME` does (derive_drop: held ones go when released):
 * before, they stayed, unusable (DERIVE is refused), holding memory until
 * the model was unloaded (review rev181 F6). Its builds in progress fail
 * (derive_fail_derive_off), as a narrowed derive_groups takes a build from
 * a builder it shuts out: before, they went on, and when a builder left, a
 * waiter was handed a build nobody may publish (review rev190 D1). */
static void
drop_if_derive_off(struct daemon *d, const struct model_config *old_model,
	const struct model_config *new_model)
{
	struct derive_dropped out;
	unsigned failed;

	if (!old_model->derive || new_model->derive)
		return;
	failed = derive_fail_derive_off(&d->derive, new_model->name);
	if (derive_drop(&d->derive, new_model->name, NULL, &out) < 0 ||
		out.dropped + out.held + failed == 0)
		return;
	log_info("model \"%s\": derive is off now: %u derived artifact%s dropped (%u of them "
		 "held by workers: %s when released), %u build%s in progress failed",
		new_model->name, out.dropped + out.held, out.dropped + out.held == 1 ? "" : "s",
		out.held, out.held == 1 ? "it goes" : "they go", failed, failed == 1 ? "" : "s");
}

/* A reload that changes a model's derive_groups, derive staying on,
 * drops (as derive_drop does) the artifacts whose builder may no longer
 * build under the new ones, judged by the groups its connection had at its
 * PUBLISH as a warm restart judges them (derive_drop_unallowed); before,
 * the reload kept them while a restart refused them. */
static void
drop_if_builders_narrowed(struct daemon *d, const struct model_config *old_model,
	const struct model_config *new_model)
{
	struct access_list builders = { 0 };
	struct derive_dropped out;

	if (!old_model->derive || !new_model->derive)
		return;
	if (access_set(&builders, 1, NULL, 0, new_model->derive_gids,
		    new_model->n_derive_gids) < 0) {
		log_warnx("model \"%s\": derive_groups: out of memory; its derived artifacts "
			  "are not checked against the new ones until a restart", new_model->name);
		return;
	}
	derive_drop_unallowed(&d->derive, new_model->name, &builders, geteuid(), &out);
	access_clear(&builders);
	if (out.dropped + out.held == 0)
		return;
	log_info("model \"%s\": derive_groups changed: %u derived artifact%s whose builder may "
		 "no longer build dropped (%u of them held by workers: %s when released)",
		new_model->name, out.dropped + out.held, out.dropped + out.held == 1 ? "" : "s",
		out.held, out.held == 1 ? "it goes" : "they go");
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
	if (change == CONFIG_MODEL_CHANGED && (changes & CONFIG_CHANGED_DERIVE)) {
		drop_if_derive_off(b->d, old_model, new_model);
		drop_if_builders_narrowed(b->d, old_model, new_model);
	}
	if (change == CONFIG_MODEL_CHANGED && !served(b->d, new_model->name)) {
		char keys[160], why[160];

		changed_keys(changes, keys, sizeof(keys));
		if (registry_refused(&b->d->reg, new_model->name, why, sizeof(why)))
			log_info("model \"%s\": not served: %s; its section changed (%s): the "
				 "reload loads it again", new_model->name, why, keys);
		else
			log_info("model \"%s\": unloaded at run time; its section changed (%s): "
				 "the reload serves it again as configured", new_model->name, keys);
		batch_load(b, new_model);
		return;
	}
	if (change == CONFIG_MODEL_ADDED ||
		(changes & (CONFIG_CHANGED_PATH | CONFIG_CHANGED_WARM | CONFIG_CHANGED_STAGE))) {
		batch_load(b, new_model);
		return;
	}
	/* Only who may attach, or what is pinned, changed: no new generation. */
	if (changes & (CONFIG_CHANGED_ACCESS | CONFIG_CHANGED_DERIVE | CONFIG_CHANGED_WATCH))
		batch_set_access(b->d, new_model);
	if ((changes & CONFIG_CHANGED_PIN) &&
		registry_pin(&b->d->reg, new_model->name, new_model->pin) < 0)
		log_warnx("%s; the reload's pin not applied", error_get());
}

/*
 * Before the configuration's changes are queued: each configured model
 * whose section did not change and that the registry does not serve. One
 * whose load was refused before it had an entry (the status page had no
 * slot left for a new name: registry_refused) was never loaded, so it is
 * loaded again, in the reload's batch, with one line saying why it was
 * not served; before, the reload took it for a model unloaded at run
 * time and left it so. Any other was unloaded at run time (`wcachectl
 * unload`): one line says the reload leaves it unloaded (reload_model),
 * so that the log says why a configured model is not served.
 */
static void
unchanged_not_served(struct batch *b, const struct config *cfg)
{
	struct daemon *d = b->d;

	for (size_t i = 0; i < cfg->n_models; i++) {
		const struct model_config *mc = &cfg->models[i];
		const struct model_config *was = config_model_find(d->cfg, mc->name);
		char why[160];

		if (was == NULL || config_model_changes(was, mc) != 0 || served(d, mc->name))
			continue;
		if (registry_refused(&d->reg, mc->name, why, sizeof(why))) {
			log_info("model \"%s\": not served: %s; the reload loads it again",
				mc->name, why);
			batch_load(b, mc);
		} else {
			log_info("model \"%s\": unloaded at run time and its section did not "
				 "change: the reload leaves it unloaded (a restart, or a change "
				 "to its section, serves it again)", mc->name);
		}
	}
}

/* Is name a model of the configuration arg (registry_refusals_prune)? */
static int
configured(const char *name, void *arg)
{
	return config_model_find(arg, name) != NULL;
}

/*
 * Whether the retry of m, failed (registry_failed), is a reload wcached
 * makes by itself (registry_reload_watched: its files must be in the tree,
 * and in a place others may rename entries in come through the very
 * directories and links, that the generation serving was loaded through),
 * not the operator's: the model has a current generation (serving, its
 * replacement failed: a file gone, a parse error, no tree refusal; or
 * gone from its server, or failed while warming: its tree is known all
 * the same, review rev203 H3) and its section (was, now mc) did not
 * change. Its last watched reload may have failed because a
 * neighbour renamed its tree aside, and a rename above the directories
 * watched, which no watch sees, may have put another tree at its path
 * since (root's private one): an operator's load would follow the path to
 * it (review rev201 H4). Where nothing serves, the tree (or the place it
 * named nothing at) her last load of it found is kept to judge by
 * (operator_tree), and a model that nothing serves is retried against it
 * the same way: a neighbour may have renamed another tree in at its path
 * while keeping it changing, so that no poll's reload judged it. Only
 * where her load recorded neither, nothing is kept to judge by; that, and
 * a changed section, her word, load as she would.
 */
static int
judged_retry(const struct model_entry *m, const struct model_config *was,
	const struct model_config *mc)
{
	return was != NULL && config_model_changes(was, mc) == 0 &&
		(m->current != NULL || m->operator_tree.root != NULL ||
			m->operator_tree.place != NULL);
}

/*
 * After the configuration's changes are queued: each configured model that
 * is failed (registry_failed: its load failed and nothing serves, its
 * current generation failed while warming, or its last replacement failed
 * while an older generation serves) and that no load mends already
 * (one the new configuration asked for included) is loaded again as it is
 * served (its path, pin and warm, which a `wcachectl load` may have set),
 * in the reload's batch, as `wcachectl reload NAME` would: a reload is
 * what README tells an operator to run once the cause is fixed, and a
 * retry that fails again fails the reload as a new model's load does. A
 * model that serves its configured files is left alone: no new generation
 * for it. Nor is one whose watched reload the model-tree rules refused
 * (refused_tree: another user's link, file or tree at its path) while its
 * section is unchanged: the files at its path wait for the operator's
 * `wcachectl reload NAME`, as its line said; a reload that only adds
 * another model approved them before (review rev195 M1). One line says
 * so. A change to its section (any key, as for a model unloaded at run
 * time) is the operator's word on it: loaded again. One whose section is
 * unchanged and that has a generation, or whose operator's last load
 * found a tree or place (judged_retry), is loaded again as a reload
 * wcached makes by itself, not as the operator's (review rev203 H3).
 */
static void
retry_failed(struct batch *b, const struct config *cfg)
{
	for (size_t i = 0; i < cfg->n_models; i++) {
		const struct model_config *mc = &cfg->models[i];
		const struct model_config *was = config_model_find(b->d->cfg, mc->name);
		const struct model_entry *m = registry_find(&b->d->reg, mc->name);
		struct model_config again;
		char why[1200];

		if (m == NULL || strcmp(m->name, mc->name) != 0 ||
			!registry_failed(m, why, sizeof(why)))
			continue;
		if (m->refused_tree && was != NULL && config_model_changes(was, mc) == 0) {
			const char *line = m->refused_line;
			int said = line == NULL ||
				(m->error != NULL && strcmp(m->error, line) == 0);

			log_warnx("model \"%s\": %s; the reload does not load it: its files wait "
				  "for `wcachectl reload %s`%s%s", m->name, why, m->name,
				said ? "" : ", since a watched reload of it was refused: ",
				said ? "" : line);
			continue;
		}
		if (judged_retry(m, was, mc) && m->current != NULL) {
			log_info("model \"%s\": %s; the reload loads it again as a reload wcached "
				 "makes by itself, judged against the tree generation %" PRIu64
				 " was loaded through", m->name, why, m->current->number);
			batch_reload_watched(b, m->name);
			continue;
		}
		if (judged_retry(m, was, mc)) {
			log_info("model \"%s\": %s; the reload loads it again as a reload wcached "
				 "makes by itself, judged against the %s the operator's last load "
				 "of it found", m->name, why,
				m->operator_tree.root != NULL ? "tree" : "place");
			batch_reload_watched(b, m->name);
			continue;
		}
		log_info("model \"%s\": %s%s; the reload loads it again", m->name, why,
			m->refused_tree ? "; its section changed, the operator's word on its "
					  "files" : "");
		again = *mc;
		again.path = m->path;
		again.pin = m->pin;
		again.warm = m->warm != 0;
		batch_load(b, &again);
	}
}

/* One requester of a config reload (`wcachectl reload`), answered when
 * its reload ends; several share a read that had not started when they
 * asked (reload_config). */
struct reload_waiter {
	registry_done_fn done;
	void *arg;
	struct reload_waiter *next; /* in the order asked */
};

/* Answers every waiter of the list w, in order, and frees them. */
static void
answer_waiters(struct reload_waiter *w, int status, const char *message)
{
	while (w != NULL) {
		struct reload_waiter *next = w->next;

		w->done(status, message, 0, w->arg);
		free(w);
		w = next;
	}
}

/* What a config reload reports to its requesters when its loads end. */
struct reload_request {
	struct reload_waiter *waiters;
};

static void
reload_finished(struct daemon *d, unsigned failed, void *arg)
{
	struct reload_request *req = arg;
	char msg[128];

	d->reloads--;
	if (d->watch != NULL)
		watch_sync(d->watch);
	if (d->reloads == 0 && !d->stopping && d->serving) {
		notify_send("READY=1");
		timers_send_status(d);
	}
	snprintf(msg, sizeof(msg), "configuration reloaded%s",
		failed ? "; some models failed" : "");
	log_info("%s", msg);
	batch_check_fit(d);
	if (req != NULL)
		answer_waiters(req->waiters, failed ? -EIO : 0,
			failed ? "configuration reloaded; some models failed to load (see status)" :
				 msg);
	free(req);
}

int
reload_stage_dir_remote(const struct config *cfg)
{
	char msg[ERROR_MAX];
	int err = stage_dir_check_local(cfg->stage_dir);

	if (err == 0)
		return 0;
	for (size_t i = 0; i < cfg->n_models; i++)
		if (cfg->models[i].stage == FS_STAGE_YES) {
			snprintf(msg, sizeof(msg), "%s", error_get());
			return error_set(err, "%s, and model \"%s\" has stage = yes", msg,
				cfg->models[i].name);
		}
	return 1;
}

/* Where staged copies go (stage.h): created if missing, given to uid:gid
 * (as root before dropping privileges; (uid_t)-1 otherwise). A stage_dir
 * that cannot be made is said once here; each model that must stage is
 * then refused with the reason. A remote one (reload_stage_dir_remote,
 * judged off the loop: its line said already) is neither made nor
 * resolved, nothing looked up there: the registry keeps it as configured,
 * and each staging refuses it (stage.c's check_room; review rev221 M3). */
void
reload_set_stage_dir(struct daemon *d, const struct config *cfg, uid_t uid, gid_t gid,
	int remote)
{
	char *dir;

	if (remote) {
		if ((dir = strdup(cfg->stage_dir)) == NULL) {
			log_errorx("stage_dir %s: out of memory", cfg->stage_dir);
			return;
		}
		free(d->reg.stage_dir);
		d->reg.stage_dir = dir;
		return;
	}
	/* Said at debug only: most hosts stage nothing, and a model that
	 * must stage says why it cannot in its one line. */
	if (stage_prepare_dir(cfg->stage_dir, uid, gid) < 0)
		log_debug("%s; models that stage are refused until it can be", error_get());
	if (registry_set_stage_dir(&d->reg, cfg->stage_dir) < 0)
		log_errorx("%s", error_get());
}

/* Swaps two strings of configurations (the running value stays). */
static void
swap_str(char **a, char **b)
{
	char *t = *a;

	*a = *b;
	*b = t;
}

/* Whether two optional strings differ. */
static int
str_differ(const char *a, const char *b)
{
	return (a == NULL) != (b == NULL) || (a != NULL && strcmp(a, b) != 0);
}

/*
 * The [wcached] keys a running daemon cannot change (its sockets, its user,
 * its threads, the limits its server started with): for each one the new
 * configuration changes, one warning naming the key and both values, and
 * the running value is kept in next, so that d->cfg always says what is
 * in force (the exit removes the sockets it names).
 */
static void
keep_restart_keys(struct config *running, struct config *next)
{
	const char *file = next->file;

	if (strcmp(running->socket_path, next->socket_path) != 0) {
		log_warnx("%s: socket changed to %s: takes effect after a restart (serving on "
			  "%s)", file, next->socket_path, running->socket_path);
		swap_str(&running->socket_path, &next->socket_path);
	}
	if (strcmp(running->control_path, next->control_path) != 0) {
		log_warnx("%s: control changed to %s: takes effect after a restart (control "
			  "socket %s)", file, next->control_path, running->control_path);
		swap_str(&running->control_path, &next->control_path);
	}
	if (str_differ(running->control_group, next->control_group)) {
		log_warnx("%s: control_group changed to %s: takes effect after a restart (now "
			  "%s)", file, next->control_group ? next->control_group : "(none)",
			running->control_group ? running->control_group : "(none)");
		swap_str(&running->control_group, &next->control_group);
		next->control_gid = running->control_gid;
	}
	if (str_differ(running->user, next->user)) {
		log_warnx("%s: user changed to %s: takes effect after a restart (now %s)", file,
			next->user ? next->user : "(none)",
			running->user ? running->user : "(none)");
		swap_str(&running->user, &next->user);
		swap_str(&running->user_name, &next->user_name);
		next->user_uid = running->user_uid;
		next->user_gid = running->user_gid;
	}
#define KEEP_NUMBER(key, fmt)                                                              \
	if (running->key != next->key) {                                                   \
		log_warnx("%s: " #key " changed to " fmt ": takes effect after a restart " \
			  "(now " fmt ")", file, next->key, running->key);                \
		next->key = running->key;                                                 \
	}
	KEEP_NUMBER(prefetch_threads, "%d")
	KEEP_NUMBER(max_clients, "%u")
	KEEP_NUMBER(max_clients_per_uid, "%u")
	KEEP_NUMBER(start_wait_seconds, "%u")
	KEEP_NUMBER(unread_reply_seconds, "%u")
#undef KEEP_NUMBER
}

/*
 * A reload's read of the configuration, on the work queue: config_load()
 * asks NSS for every user and group the file names, which may wait on a
 * directory service (LDAP, sssd), and the event loop must not. Reads run
 * one at a time, in the order asked (d->reload_reads), so that a later
 * reload never applies an earlier read. A reload asked while a read waits
 * its turn joins that read (it has not looked at the file yet, so it
 * reads what the later one would): at most two reads are ever asked for,
 * the one running and the one waiting, however many reloads pile up while
 * a read hangs (a script's `timeout 1 wcachectl reload` in a loop, each
 * client gone before its reply: before, each one's read and apply ran in
 * turn once the read came back).
 */
struct reload_read {
	struct workq_job job;
	struct daemon *d;
	struct config *cfg;       /* what was read; NULL when it failed */
	char message[ERROR_MAX];       /* why it failed, or why stage_dir is remote */
	int stage_remote;              /* cfg's stage_dir is (reload_stage_dir_remote) */
	struct reload_waiter *waiters; /* to answer; none for SIGHUP */
	struct reload_waiter **waiters_tail;
	struct reload_read *next; /* waiting behind this one */
};

/* Pool thread: reads the configuration, and judges its stage_dir as the
 * start does (reload_stage_dir_remote): a remote one refuses the reload
 * only where a model has stage = yes. */
static void
read_run(struct workq_job *job)
{
	struct reload_read *rr = job->arg;

	if (config_load(rr->d->config_path, &rr->cfg) < 0) {
		rr->cfg = NULL;
		snprintf(rr->message, sizeof(rr->message), "%s", error_get());
	} else if ((rr->stage_remote = reload_stage_dir_remote(rr->cfg)) != 0) {
		/* Here, off the loop: apply() prepares stage_dir on the loop. */
		snprintf(rr->message, sizeof(rr->message), "%s", error_get());
		if (rr->stage_remote < 0) {
			config_free(rr->cfg);
			rr->cfg = NULL;
		}
	}
}

static void read_next(struct daemon *d);

/* A model whose current generation warms again (rewarm_what_fits). */
struct rewarm_candidate {
	struct model_entry *m;
	uint64_t last_attach;
};

/* Most recently attached first; the registry's order among equals. */
static int
by_recent_attach(const void *a, const void *b)
{
	const struct rewarm_candidate *x = a, *y = b;

	return x->last_attach > y->last_attach ? -1 : x->last_attach < y->last_attach ? 1 : 0;
}

/*
 * The reload raised memory_budget, or removed it (was: the budget before,
 * 0 for none): what the old budget evicted stayed cold until a worker
 * attached it, while a start with the new configuration serves it warm
 * (and `wcachectl status`, a health check, exits 3 for a cold model). So
 * each model whose current generation is cold (evicted, by the budget or
 * `wcachectl evict`) and not being loaded again warms again when
 * it fits under the new budget beside what is warm or warming already,
 * most recently attached first: the ones an eviction would keep. One line
 * each. Models this reload loads again warm their new generation instead.
 */
static void
rewarm_what_fits(struct daemon *d, uint64_t was)
{
	struct registry *r = &d->reg;
	uint64_t budget = r->memory_budget, total;
	struct rewarm_candidate *c;
	size_t n = 0, cap = 0;

	/* Raised (a budget above the one before) or removed (none now, one
	 * before); a reload with no budget before or after leaves alone
	 * what `wcachectl evict` made cold. */
	if (budget != 0 ? (was == 0 || budget <= was) : was == 0)
		return;
	for (struct model_entry *m = r->models; m != NULL; m = m->next)
		if (m->current != NULL && m->current->state == GEN_COLD && m->pending == NULL &&
			m->loading == 0)
			cap++;
	if (cap == 0)
		return;
	total = registry_warm_bytes(r);
	if ((c = calloc(cap, sizeof(*c))) == NULL) {
		log_warnx("memory_budget raised: out of memory; cold models warm when attached");
		return;
	}
	for (struct model_entry *m = r->models; m != NULL && n < cap; m = m->next)
		if (m->current != NULL && m->current->state == GEN_COLD && m->pending == NULL &&
			m->loading == 0)
			c[n++] = (struct rewarm_candidate){ m, m->last_attach };
	qsort(c, n, sizeof(*c), by_recent_attach);
	for (size_t i = 0; i < n; i++) {
		struct generation *g = c[i].m->current;
		char now[64] = "removed";

		if (budget != 0 && (g->bytes > budget || total > budget - g->bytes))
			continue;
		total += g->bytes;
		if (budget != 0)
			snprintf(now, sizeof(now), "raised to %" PRIu64 " MiB", budget >> 20);
		log_info("model \"%s\": memory_budget %s (was %" PRIu64 " MiB): warming generation "
			 "%" PRIu64 " again, which was cold", c[i].m->name, now,
			was >> 20, g->number);
		/* As an attach would warm it (gen_ref), not counting as one. */
		gen_warm_again(r, g, "memory_budget raised");
	}
	free(c);
}

/* Applies cfg, read by a reload: the new models and settings, in one batch
 * whose end answers waiters (owned from here). */
static void
apply(struct daemon *d, struct config *cfg, int stage_remote, struct reload_waiter *waiters)
{
	struct reload_request *req;
	struct batch *b;
	uint64_t was_budget = d->reg.memory_budget;

	if ((req = calloc(1, sizeof(*req))) == NULL) {
		config_free(cfg);
		log_errorx("reload of %s: out of memory", d->config_path);
		answer_waiters(waiters, -ENOMEM, "out of memory");
		return;
	}
	req->waiters = waiters;
	notify_send("RELOADING=1\nSTATUS=reloading %s", d->config_path);
	log_info("reloading %s", d->config_path);
	keep_restart_keys(d->cfg, cfg);
	log_setlevel(d->debug ? LOG_LEVEL_DEBUG : cfg->log_level);
	d->reg.restart_hold_ms = (int)cfg->restart_hold_seconds * 1000;
	d->reg.memory_budget = reload_memory_budget(d, cfg);
	registry_enforce_budget(&d->reg);
	reload_set_stage_dir(d, cfg, (uid_t)-1, (gid_t)-1, stage_remote);
	d->reloads++;
	b = batch_new(d, reload_finished, req);
	/* Refusals of names no longer configured are of no use now. */
	registry_refusals_prune(&d->reg, configured, cfg);
	unchanged_not_served(b, cfg);
	config_diff(d->cfg, cfg, reload_model, b);
	retry_failed(b, cfg);
	rewarm_what_fits(d, was_budget);
	config_free(d->cfg);
	d->cfg = cfg;
	batch_release(b);
}

/* Loop thread: a read ended; applies it (not once wcached is stopping),
 * or says why it was refused, then starts the next read. */
static void
read_after(struct workq_job *job, int status)
{
	struct reload_read *rr = job->arg;
	struct daemon *d = rr->d;

	d->reload_reads = rr->next;
	if (status == UV_ECANCELED || d->stopping) {
		/* None applies now, and none waiting starts. */
		config_free(rr->cfg);
		rr->next = d->reload_reads;
		d->reload_reads = NULL;
		while (rr != NULL) {
			struct reload_read *next = rr->next;

			answer_waiters(rr->waiters, -ECANCELED, "wcached is stopping");
			free(rr);
			rr = next;
		}
		return;
	}
	if (rr->cfg != NULL && rr->cfg->n_models == 0 && d->cfg->n_models > 0) {
		/* An empty file, or one cut before its first model: what an
		 * editor or a tool writing in place leaves for a moment
		 * (review rev173 F6). Unloading every model is never what a
		 * reload of that is for. */
		snprintf(rr->message, sizeof(rr->message), "%s configures no model (%zu configured "
			 "now): a reload does not unload every model; write the file whole and "
			 "rename(2) it into place, or `wcachectl unload` each model",
			d->config_path, d->cfg->n_models);
		config_free(rr->cfg);
		rr->cfg = NULL;
	}
	if (rr->cfg == NULL) {
		log_errorx("reload refused: %s", rr->message);
		if (d->reloads == 0 && d->serving) {
			notify_send("READY=1");
			timers_send_status(d);
		}
		answer_waiters(rr->waiters, -EINVAL, rr->message);
	} else {
		if (rr->stage_remote)
			log_warnx("%s", rr->message);
		apply(d, rr->cfg, rr->stage_remote, rr->waiters);
	}
	free(rr);
	read_next(d);
}

/* Starts the first waiting read, if any (one runs at a time). */
static void
read_next(struct daemon *d)
{
	struct reload_read *rr = d->reload_reads;
	char what[192];

	if (rr == NULL || rr->job.q != NULL)
		return;
	/* Not local work: NSS may ask a server that hangs, and the walk of
	 * stage_dir looks names up on the filesystems it crosses (judged
	 * local, or "/"'s: stage_dir_check_local). As such it is logged when
	 * it stalls, named by both (review rev221 L1), and a stop does not
	 * wait for it for ever. */
	snprintf(what, sizeof(what), "the reload's read of %s (users and groups from NSS) and "
		"its check of stage_dir's filesystems", d->config_path);
	if (workq_submit(&d->reg.workq, &rr->job, WORKQ_UNKNOWN, what, read_run,
		    read_after) < 0) {
		/* No job to be had: read here, as before there was one. */
		rr->job.q = &d->reg.workq; /* running, for read_next */
		read_run(&rr->job);
		read_after(&rr->job, 0);
	}
}

/*
 * Re-reads the configuration (on the work queue) and adds, drops or
 * reloads models; done (may be NULL) runs when every load it started has
 * ended, or with the reason the configuration was refused. For SIGHUP and
 * for `wcachectl reload`. 0, or -ENOMEM.
 */
int
reload_config(struct daemon *d, registry_done_fn done, void *arg)
{
	struct reload_waiter *w = NULL;
	struct reload_read *rr, **tail;

	if (done != NULL && (w = calloc(1, sizeof(*w))) == NULL)
		return error_set(-ENOMEM, "reload: out of memory");
	if (w != NULL) {
		w->done = done;
		w->arg = arg;
	}
	for (tail = &d->reload_reads; *tail != NULL && (*tail)->next != NULL;
		tail = &(*tail)->next)
		;
	/* The last read asked for, when it waits behind the one running, has
	 * not read the file yet: this reload joins it. */
	if (*tail != NULL && *tail != d->reload_reads && (*tail)->job.q == NULL) {
		log_debug("reload of %s: joins the read waiting for its turn", d->config_path);
		if (w != NULL) {
			*(*tail)->waiters_tail = w;
			(*tail)->waiters_tail = &w->next;
		}
		return 0;
	}
	if ((rr = calloc(1, sizeof(*rr))) == NULL) {
		free(w);
		return error_set(-ENOMEM, "reload: out of memory");
	}
	rr->d = d;
	rr->waiters = w;
	rr->waiters_tail = w != NULL ? &w->next : &rr->waiters;
	rr->job.arg = rr;
	if (*tail != NULL)
		tail = &(*tail)->next;
	*tail = rr;
	read_next(d);
	return 0;
}
