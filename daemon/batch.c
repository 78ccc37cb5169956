/*
 * batch.c: the loads of the configured models, at start and on a config
 * reload, as one batch that reports once when every load in it has ended:
 * at start that is when wcached serves (or at start_wait_seconds, when a
 * load hangs on a network filesystem), on reload when `wcachectl reload`
 * answers. A warm restart's checks count in the start-up batch as loads.
 * Also what is applied with each load (a model's access) and the warning
 * when the models served do not fit under the memory limit.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/error.h"
#include "config.h"
#include "daemon.h"
#include "generation.h"
#include "log.h"
#include "memlimit.h"
#include "registry.h"
#include "restore.h"

/* Warns once loads end when what the models served keep warm (all of them,
 * or what memory_budget keeps) and the derived artifacts wcached keeps
 * (those a warm restart took back from the store included) do not fit
 * under the memory limit in force: the kernel would reclaim what was just
 * warmed. The artifacts weigh as status's "fits" weighs them: memory the
 * kernel cannot reclaim, as if pinned. */
void
batch_check_fit(struct daemon *d)
{
	uint64_t total, pinned, derived = d->reg.derived_bytes;
	unsigned n = registry_served_bytes(&d->reg, &total, &pinned);
	char src[400], also[96] = "";

	if (memlimit_fits(&d->mem, total + derived, pinned + derived, d->reg.memory_budget))
		return;
	if (derived != 0)
		snprintf(also, sizeof(also), " and the derived artifacts kept (%" PRIu64 " MiB)",
			derived >> 20);
	/* A budget set above the limit has its own warning (reload.c). */
	log_warnx("the %u model%s served (%" PRIu64 " MiB)%s do not fit under the memory "
		  "limit in force (%" PRIu64 " MiB, %s): the kernel will reclaim warm pages and "
		  "workers will read from disk; %s", n, n == 1 ? "" : "s", total >> 20, also,
		d->mem.limit >> 20, memlimit_source(&d->mem, src, sizeof(src)),
		pinned > d->mem.limit ? "the models pinned whole (pin = all) alone do not fit: "
					"pin fewer" :
		pinned + derived > d->mem.limit ?
			(pinned != 0 ? "the models pinned whole (pin = all) and the derived "
				       "artifacts alone do not fit: pin fewer, or drop artifacts "
				       "(`wcachectl drop`)" :
				       "the derived artifacts alone do not fit: drop some "
				       "(`wcachectl drop`)") :
		d->reg.memory_budget != 0 ? "set memory_budget below that limit" :
		d->mem.kind == MEMLIMIT_RAM ? "serve fewer models, or set memory_budget to keep "
					      "the most used ones warm" :
					      "raise or remove that limit (see README, "
					      "\"Memory limits\"), or set memory_budget");
}

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
void
batch_on_start_wait(uv_timer_t *t)
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
void
batch_set_access(struct daemon *d, const struct model_config *m)
{
	int restricted = m->allow_users != NULL || m->allow_groups != NULL;

	if (registry_set_access(&d->reg, m->name, restricted, m->uids, m->n_uids, m->gids,
		    m->n_gids) < 0 ||
		registry_set_derive(&d->reg, m->name, m->derive, m->derive_gids, m->n_derive_gids,
			m->derive_timeout) < 0 ||
		registry_set_storage(&d->reg, m->name, m->watch, m->poll_interval_ms, m->stage) < 0)
		log_errorx("%s; its allow_users, allow_groups, derive, watch and stage not applied",
			error_get());
}

void
batch_load(struct batch *b, const struct model_config *m)
{
	if (registry_load(&b->d->reg, m->name, m->path, m->pin, m->warm, batch_load_done,
		    b) < 0) {
		log_errorx("%s; not served", error_get());
		b->failed++;
		return;
	}
	batch_set_access(b->d, m);
	b->pending++;
}

void
batch_reload_watched(struct batch *b, const char *name)
{
	/* Counted first: its answer may come from this call (a load of it
	 * in flight already, or no room for another generation). */
	b->pending++;
	if (registry_reload_watched(&b->d->reg, name, batch_load_done, b) < 0) {
		log_errorx("%s; not reloaded", error_get());
		b->failed++;
		b->pending--;
	}
}

void
batch_judged_load(struct batch *b, const char *name)
{
	char line[ERROR_MAX + 320];

	b->pending++;
	if (registry_reload_watched(&b->d->reg, name, batch_load_done, b) == 0)
		return;
	snprintf(line, sizeof(line), "a warm restart's load of it, judged against the tree its "
		"store recorded, could not be queued (%s): what its path names is served only "
		"after the operator's `wcachectl reload %s`", error_get(), name);
	log_errorx("model \"%s\": %s", name, line);
	registry_wait_for_operator(&b->d->reg, name, line, NULL);
	b->failed++;
	b->pending--;
}

/* A warm restart's check of a model ended (restore.h): served, or loaded
 * as a reload wcached makes by itself, judged against the tree its
 * description recorded (RESTORE_JUDGED: a load that may fail, or wait for
 * the operator's reload), or not served, waiting for the operator's
 * reload (a failure, as a load that failed). Gone (unloaded, or loaded
 * anew meanwhile) is no failure, as a superseded load is none. */
void
batch_restore_done(const char *name, enum restore_result result, void *arg)
{
	struct batch *b = arg;

	if (result == RESTORE_JUDGED)
		batch_judged_load(b, name);
	if (result == RESTORE_WAITS)
		b->failed++;
	b->pending--;
	batch_step(b);
}

struct batch *
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

void
batch_release(struct batch *b)
{
	b->pending--;
	batch_step(b);
}
