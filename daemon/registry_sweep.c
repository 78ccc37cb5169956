/*
 * registry_sweep.c: the registry's stage_dir (registry_set_stage_dir) and
 * its start-up sweep (registry_stage_sweep): removing, on the work queue,
 * the staged copies earlier processes left there (stage_sweep, stage.h)
 * that no generation of this one serves, while the stagings queued
 * meanwhile wait for it (registry_sweep_hold; registry_load.c's
 * registry_stage_held sends them on once it ends). The load pipeline,
 * staging included, is registry_load.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "log.h"
#include "registry_internal.h"
#include "stage.h"

/*
 * The start-up sweep of stage_dir (registry_stage_sweep), on the work
 * queue: what earlier processes left there may be whole copies, hundreds
 * of gigabytes to unlink, and the loop must not wait for that (restored
 * and local models serve meanwhile). Stagings queued while it runs wait
 * here until it ends (registry_sweep_hold, sweep_after): a copy published
 * while the sweep reads stage_dir would not be in its keep list, and the
 * space the sweep frees is the space they need.
 */
struct registry_sweep {
	struct workq_job job;
	struct registry *r;
	char *dir;                 /* stage_dir when it started */
	char **keep;               /* the copies it leaves, owned */
	size_t nkeep;
	unsigned removed;
	int err;
	char message[ERROR_MAX];
	struct load_request *held; /* stagings waiting for it, in the order queued */
	struct load_request **held_tail;
};

/*
 * Keeps stage_dir resolved (realpath): the paths it is compared with are
 * the kernel's, which name no symbolic link (a warm restart finds its
 * staged copies by what /proc/self/fd says of their descriptors, and the
 * sweep keeps those), so a stage_dir that is a link the operator made, or
 * lies under one, must be spelled the kernel's way too or no copy is ever
 * found in it. One that does not exist yet stays as configured (staging
 * creates it; the next start resolves it).
 */
int
registry_set_stage_dir(struct registry *r, const char *dir)
{
	char *d = realpath(dir, NULL);

	if (d == NULL && (d = strdup(dir)) == NULL)
		return error_set(-ENOMEM, "out of memory");
	/* A staging on the work queue has its own copy (registry_load.c's
	 * queue_stage). */
	free(r->stage_dir);
	r->stage_dir = d;
	return 0;
}

/* Frees s (NULL too) and what it owns. */
static void
sweep_free(struct registry_sweep *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; s->keep != NULL && i < s->nkeep; i++)
		free(s->keep[i]);
	free(s->keep);
	free(s->dir);
	free(s);
}

/* Work queue thread: the sweep itself (stage_sweep). */
static void
sweep_run(struct workq_job *w)
{
	struct registry_sweep *s = w->arg;

	if ((s->err = stage_sweep(s->dir, s->keep, s->nkeep, &s->r->closing, &s->removed)) < 0)
		snprintf(s->message, sizeof(s->message), "%s", error_get());
}

/* Logs what the sweep s did: its error, and the copies it removed. */
static void
sweep_report(const struct registry_sweep *s)
{
	if (s->err == -ECANCELED)
		log_info("%s", s->message);
	else if (s->err < 0)
		log_warnx("%s", s->message);
	if (s->removed > 0)
		log_info("removed %u staged cop%s left in %s by an earlier wcached", s->removed,
			s->removed == 1 ? "y" : "ies", s->dir);
}

/*
 * Loop thread: the sweep ended (status 0), or never ran (UV_ECANCELED):
 * the stagings that waited for it go on (registry_stage_held: to the work
 * queue, in the order they came, or cancelled when wcached is stopping).
 */
static void
sweep_after(struct workq_job *w, int status)
{
	struct registry_sweep *s = w->arg;
	struct registry *r = s->r;

	r->sweep = NULL;
	if (status == 0)
		sweep_report(s);
	registry_stage_held(r, s->held, status == UV_ECANCELED);
	sweep_free(s);
}

const char *
registry_sweep_hold(struct registry *r, struct load_request *q, struct load_request **q_next)
{
	struct registry_sweep *s = r->sweep;

	if (s == NULL)
		return NULL;
	*q_next = NULL;
	*s->held_tail = q;
	s->held_tail = q_next;
	return s->dir;
}

/* Copies dirs (n of them) into s's keep list. 0 or -ENOMEM. */
static int
sweep_keep(struct registry_sweep *s, char *const *dirs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (dirs[i] == NULL)
			continue;
		if ((s->keep[s->nkeep] = strdup(dirs[i])) == NULL)
			return -ENOMEM;
		s->nkeep++;
	}
	return 0;
}

void
registry_stage_sweep(struct registry *r, char *const *also_keep, size_t nalso)
{
	struct registry_sweep *s;
	char what[sizeof(s->job.what)];
	size_t n = nalso;
	int err = 0;

	if (r->stage_dir == NULL || r->sweep != NULL)
		return;
	for (const struct generation *g = r->generations; g != NULL; g = g->next)
		n++;
	if ((s = calloc(1, sizeof(*s))) == NULL ||
		(s->keep = calloc(n ? n : 1, sizeof(*s->keep))) == NULL ||
		(s->dir = strdup(r->stage_dir)) == NULL)
		err = -ENOMEM;
	if (err == 0)
		err = sweep_keep(s, also_keep, nalso);
	for (const struct generation *g = r->generations; g != NULL && err == 0; g = g->next)
		err = sweep_keep(s, &g->staged.dir, 1);
	if (err < 0) {
		log_warnx("stage_dir %s: not swept: out of memory", r->stage_dir);
		sweep_free(s);
		return;
	}
	s->r = r;
	s->held_tail = &s->held;
	s->job.arg = s;
	snprintf(what, sizeof(what), "the sweep of stage_dir %s", s->dir);
	if (workq_submit(&r->workq, &s->job, WORKQ_LOCAL, what, sweep_run, sweep_after) < 0) {
		/* The queue refused it: sweep here, as nothing stages yet. */
		sweep_run(&s->job);
		sweep_report(s);
		sweep_free(s);
		return;
	}
	r->sweep = s;
}
