/*
 * watch.c: inotify on the models' directories (see watch.h).
 *
 * Directories, not files, are watched: a rename over a model's path
 * replaces the inode, so a watch on the old file would only ever see it
 * deleted, while the directory sees the new name arrive. Modification in
 * place is detected by comparing each served file's fstat with the one taken
 * when it was opened; the events only say when to look.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"

#include "generation.h"
#include "log.h"
#include "mountrule.h"
#include "watch_internal.h"
#include "workq.h"

#define WATCH_MASK                                                                            \
	(IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE |  \
		IN_DELETE | IN_ONLYDIR)
#define NAME_EVENTS (IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_CLOSE_WRITE)
/* Reads of the inotify descriptor per wakeup, as the server's per client: a
 * flood of events (a neighbour rewriting her files in a loop) must not hold
 * the loop. The poll is level-triggered: the rest comes at the next turn. */
#define READS_PER_WAKEUP 16

/* The directory path is in, malloc'd: "." for a name without one (the
 * current directory, as inotify_add_watch needs it). */
static char *
dir_of(const char *path)
{
	char *d = path_dir(path);

	if (d != NULL && d[0] == '\0') {
		free(d);
		d = strdup(".");
	}
	return d;
}

static struct watched_dir *
find_dir(struct watch *w, const char *path)
{
	for (size_t i = 0; i < w->ndirs; i++)
		if (strcmp(w->dirs[i].path, path) == 0)
			return &w->dirs[i];
	return NULL;
}

/* Removes inotify's watch wd unless a watched directory but the one at
 * index skip has it too (two paths of one directory share a watch).
 * inotify_rm_watch touches no filesystem. */
static void
drop_watch(struct watch *w, int wd, size_t skip)
{
	for (size_t i = 0; i < w->ndirs; i++)
		if (i != skip && w->dirs[i].wd == wd)
			return;
	inotify_rm_watch(w->fd, wd);
}

static int names_model_file(const struct model_entry *m, const char *dir, const char *name);

/* Notes that an event of wd naming name came before any directory was
 * noted for wd (struct watch's stray). */
static void
note_stray(struct watch *w, int wd, const char *name)
{
	size_t n = sizeof(w->stray) / sizeof(w->stray[0]);
	struct stray_event *e = &w->stray[w->nstray++ % n];

	e->wd = wd;
	snprintf(e->name, sizeof(e->name), "%s", name);
}

/* Whether an event of wd (now noted as dir) naming a file of m came before
 * dir was noted (and forgets the events of wd): a change made once the
 * sync job armed the watch, after its stat, and read before its end, which
 * neither the comparisons of sync_after nor any event tell otherwise. */
static int
stray_event(struct watch *w, int wd, const char *dir, const struct model_entry *m)
{
	size_t n = sizeof(w->stray) / sizeof(w->stray[0]);
	int found = 0;

	for (size_t i = 0; i < w->nstray && i < n; i++)
		if (w->stray[i].wd == wd) {
			found |= names_model_file(m, dir, w->stray[i].name);
			w->stray[i].wd = -1;
		}
	return found;
}

/* Notes that inotify watches path as wd (a sync job added it). */
static void
record_dir(struct watch *w, const char *path, int wd)
{
	struct watched_dir *d = find_dir(w, path), *dirs;
	char *copy;

	if (d != NULL) {
		/* The directory's new inode (it was replaced): the old one's
		 * watch would stay as long as that directory does, its events
		 * unread. */
		if (d->wd != wd)
			drop_watch(w, d->wd, (size_t)(d - w->dirs));
		d->wd = wd;
		return;
	}
	if ((copy = strdup(path)) == NULL ||
		(dirs = realloc(w->dirs, (w->ndirs + 1) * sizeof(*dirs))) == NULL) {
		free(copy);
		inotify_rm_watch(w->fd, wd);
		return;
	}
	w->dirs = dirs;
	w->dirs[w->ndirs].wd = wd;
	w->dirs[w->ndirs].path = copy;
	w->ndirs++;
}

/* Does model m care about directory dir? */
static int
model_uses_dir(const struct model_entry *m, const char *dir)
{
	char *d = dir_of(m->path);
	int yes = d != NULL && strcmp(d, dir) == 0;

	free(d);
	return yes || strcmp(m->path, dir) == 0;
}

/* Drops the watches of directories no model uses any more; the others keep
 * their order. (inotify_rm_watch touches no filesystem.) */
static void
prune_dirs(struct watch *w)
{
	size_t kept = 0;

	for (size_t i = 0; i < w->ndirs; i++) {
		int used = 0;

		for (struct model_entry *m = w->reg->models; m != NULL && !used; m = m->next)
			used = model_uses_dir(m, w->dirs[i].path);
		if (used) {
			w->dirs[kept++] = w->dirs[i];
			continue;
		}
		/* Kept entries are before i, the rest from i on. */
		drop_watch(w, w->dirs[i].wd, i);
		free(w->dirs[i].path);
		w->dirs[i].wd = -1;
	}
	w->ndirs = kept;
}

/*
 * Arming a model's watches touches its filesystem (inotify_add_watch
 * resolves the directory; the model's path is stat'ed to see whether it is a
 * directory, and the paths of a generation are compared with the files it
 * opened), and a remote filesystem may take as long as its server does to
 * answer: so it is done by a sync job on the work queue (workq.h), never on
 * the loop. One job per model at a time.
 */
struct sync_gen {
	uint64_t number;
	size_t n;
	char **paths;       /* the files it opened (their origin, when staged) */
	dev_t *dev;
	ino_t *ino;
	int replaced;       /* a path now names another file, or none */
};

struct sync_job {
	struct workq_job job;
	struct watch *w;
	char *name;
	uint64_t entry_id;
	char *path;             /* the model's path, */
	char *dirs[2];          /* its directory, and itself when a directory */
	int wd[2], err[2];
	char why[2][MOUNTRULE_WHY]; /* the walk's line where it refused dirs[k], or "" */
	int path_err;           /* path's stat once its directory is watched */
	struct stat path_st;
	/* The first of its stats the walk refused (EXDEV: a user's FUSE
	 * mount on the way), why: its one line (mountrule.h), or "". */
	char refused[MOUNTRULE_WHY];
	/* Armed again after a failed load (model_entry's watch_rearm): what
	 * that load's path looked like (failed_path's err and st). */
	int rearm;
	int failed_err;
	struct stat failed_st;
	struct sync_gen gens[2];
	size_t ngens;
};

/* A model's sync state (w->synced): the path its watches were armed for. */
struct synced {
	char *name;
	uint64_t entry_id;
	char *path;             /* NULL: never armed */
	int busy, again;
};

static void
sync_job_free(struct sync_job *j)
{
	for (size_t k = 0; k < j->ngens; k++) {
		for (size_t i = 0; j->gens[k].paths != NULL && i < j->gens[k].n; i++)
			free(j->gens[k].paths[i]);
		free(j->gens[k].paths);
		free(j->gens[k].dev);
		free(j->gens[k].ino);
	}
	free(j->dirs[0]);
	free(j->dirs[1]);
	free(j->path);
	free(j->name);
	free(j);
}

/* Keeps why, the line of a stat the walk refused (err EXDEV), when it is
 * j's first. */
static void
refused(struct sync_job *j, int err, const char *why)
{
	if (err == EXDEV && j->refused[0] == '\0')
		snprintf(j->refused, sizeof(j->refused), "%s", why);
}

/*
 * Arms j's watch of dirs[k] on the directory the walk (mountrule.h)
 * reached: inotify_add_watch follows /proc/self/fd/N of the walk's O_PATH
 * descriptor to that very inode and looks no name up on the way. By name
 * it looked the path up afresh, whatever the walk said, in a neighbour's
 * FUSE server where his link renamed over the directory led (review rev208
 * H1). A walk refused or failed arms nothing: wd -1, err its error, why
 * its line (EXDEV). st, where not NULL: fstat(2) of the directory once
 * watched. 0 or the walk's (or fstat's) errno.
 */
static int
arm(struct sync_job *j, int k, struct stat *st)
{
	char proc[sizeof("/proc/self/fd/") + 3 * sizeof(int)];
	int fd, e;

	j->why[k][0] = '\0';
	if ((fd = mountrule_open(NULL, j->dirs[k], j->why[k], sizeof(j->why[k]))) < 0) {
		j->err[k] = -fd;
		if (fd != -EXDEV)
			j->why[k][0] = '\0';
		return -fd;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	j->wd[k] = inotify_add_watch(j->w->fd, proc, WATCH_MASK);
	j->err[k] = j->wd[k] == -1 ? errno : 0;
	e = st != NULL && fstat(fd, st) == -1 ? errno : 0;
	close(fd);
	return e;
}

/* Work queue thread: arm the watches, then compare each generation's paths
 * with the files it opened, and stat the model's path, which sync_after
 * compares with what the generation's load (or a warm restart's check)
 * found: a rename between a load's open (or a restore's stat) and the
 * arming of its directory's watch made no event this process saw. A shard
 * index renamed over shows in the model's path alone: the README's way
 * leaves every old shard as it was. */
static void
sync_work(struct workq_job *job)
{
	struct sync_job *j = job->arg;
	struct mountrule_walk walk;
	char why[MOUNTRULE_WHY];
	struct stat st;

	j->wd[1] = -1;
	arm(j, 0, NULL);
	j->path_err = mountrule_stat(NULL, j->path, &j->path_st, why, sizeof(why)) == -1 ? errno :
		0;
	refused(j, j->path_err, why);
	if (j->path_err == 0 && S_ISDIR(j->path_st.st_mode) &&
		(j->dirs[1] = strdup(j->path)) != NULL) {
		/* What is compared is the directory as it is once watched
		 * (its descriptor's stat): a change inside it between the
		 * stat above and the watch made no event, and the stat above
		 * would not show it. */
		j->path_err = arm(j, 1, &j->path_st);
		refused(j, j->path_err, j->why[1]);
	}
	/* The files' paths in one run of walks (mountrule.h); the model's
	 * path above in walks of their own, the second a look afresh. */
	mountrule_walk_init(&walk);
	for (size_t k = 0; k < j->ngens; k++) {
		struct sync_gen *g = &j->gens[k];

		for (size_t i = 0; i < g->n && !g->replaced; i++) {
			int r = mountrule_stat(&walk, g->paths[i], &st, why, sizeof(why));

			refused(j, r == -1 ? errno : 0, why);
			g->replaced = r == -1 || st.st_dev != g->dev[i] || st.st_ino != g->ino[i];
		}
	}
	mountrule_walk_end(&walk);
}

static struct synced *
find_synced(struct watch *w, const char *name, uint64_t entry_id)
{
	for (size_t i = 0; i < w->nsynced; i++)
		if (w->synced[i].entry_id == entry_id && strcmp(w->synced[i].name, name) == 0)
			return &w->synced[i];
	return NULL;
}

/* The generation of m numbered number, if it is still m's current or
 * pending one. */
static struct generation *
live_generation(struct model_entry *m, uint64_t number)
{
	if (m->current != NULL && m->current->number == number)
		return m->current;
	if (m->pending != NULL && m->pending->number == number)
		return m->pending;
	return NULL;
}

static void check_generation(struct registry *r, struct generation *g);
static void mark_dirty(struct watch *w, const char *name, bool lost, uint64_t relink_due);

/*
 * Is the model's path, as j found it once its directory was watched,
 * other than when g's load opened it (or a warm restart's check listed
 * g's files; generation.h's opened_path): another file, none, or the same
 * one changed (a directory whose entries changed)? Compared on the loop,
 * when the job is done: a restored generation gets its check's stat just
 * after the registry lists it, when this job is queued already.
 */
static int
path_moved(const struct sync_job *j, const struct generation *g)
{
	return g->opened_path.known &&
		watch_stat_sig(j->path_err, &j->path_st) != watch_stat_sig(0, &g->opened_path.st);
}

/*
 * Is the model's path, as j found it, one of g's own files still, the very
 * inode g opened (a local generation served where it is)? Then what moved
 * is that file itself: written in place, or touched, chmod'ed, chown'ed.
 * That is check_generation's to judge from g's descriptors, with its one
 * line, as it judges the inotify event of the same change once the
 * generation is watched (check_model): a current generation is marked
 * modified, a pending one dropped and the model reloaded (sync_after).
 * Not so for a staged copy (its origin written in place is staged again)
 * or a remote file (another host's replacement may have its inode
 * number): those are reloaded, as a path changed.
 */
static int
own_file_in_place(const struct sync_job *j, const struct generation *g)
{
	if (j->path_err != 0 || !S_ISREG(j->path_st.st_mode) || g->origin != NULL ||
		g->fs.remote)
		return 0;
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct stat *st = &g->source.files[i].st;

		if (st->st_dev == j->path_st.st_dev && st->st_ino == j->path_st.st_ino)
			return 1;
	}
	return 0;
}

/* Was g, m's pending generation, dropped as modified in place
 * (gen_mark_modified)? g itself stays until registry_collect. */
static int
dropped(const struct model_entry *m, const struct generation *g)
{
	return g->state == GEN_MODIFIED && m->pending != g;
}

/* The paced entry of the model called name (struct paced_model), or NULL. */
static struct paced_model *
find_paced(struct watch *w, const char *name)
{
	for (size_t i = 0; i < w->npaced; i++)
		if (strcmp(w->paced[i].name, name) == 0)
			return &w->paced[i];
	return NULL;
}

/* find_paced, else a new entry for m as of now; NULL without memory (m is
 * then reloaded as if it had none: no backoff). */
static struct paced_model *
paced_for(struct watch *w, const struct model_entry *m)
{
	struct paced_model *p = find_paced(w, m->name), *grown;
	uint64_t now = uv_now(w->loop);

	if (p != NULL)
		return p;
	if ((grown = reallocarray(w->paced, w->npaced + 1, sizeof(*grown))) == NULL)
		return NULL;
	w->paced = grown;
	p = &w->paced[w->npaced];
	*p = (struct paced_model){ .entry_id = m->entry_id, .window_ms = now, .event_ms = now,
		.swaps_ms = now };
	if ((p->name = strdup(m->name)) == NULL)
		return NULL;
	w->npaced++;
	return p;
}

/* Removes w->paced[i]; the last entry takes its place. */
static void
forget_paced(struct watch *w, size_t i)
{
	free(w->paced[i].name);
	w->paced[i] = w->paced[--w->npaced];
}

/* Have p's model's files been quiet long enough, at now, to forget its
 * reloads (and so its backoff)? */
static bool
paced_quiet(const struct paced_model *p, uint64_t now)
{
	return now - p->event_ms >= WATCH_QUIET_MS && now - p->reload_ms >= WATCH_QUIET_MS;
}

/* Forgets the entries of models gone (or removed and added again), and of
 * models quiet for WATCH_QUIET_MS whose swaps' count is over: a loop of
 * swaps that pauses for the quiet does not start its count over. */
static void
prune_paced(struct watch *w)
{
	uint64_t now = uv_now(w->loop);

	for (size_t i = 0; i < w->npaced;) {
		const struct paced_model *p = &w->paced[i];
		const struct model_entry *m = registry_find(w->reg, p->name);

		bool swaps_over = p->swaps == 0 || now - p->swaps_ms >= WATCH_SWAPS_MS;

		/* A revalidation's pacing lasts WATCH_RELINK_QUIET_MS. */
		bool relinks_over = p->relink_ms == 0 ||
			now >= p->relink_ms + WATCH_RELINK_QUIET_MS;

		if (m == NULL || m->entry_id != p->entry_id ||
			(paced_quiet(p, now) && swaps_over && relinks_over))
			forget_paced(w, i);
		else
			i++;
	}
}

/*
 * g, m's pending generation (not served yet), was just dropped as modified
 * in place (touched, chmod'ed, chown'ed, truncated or written): m is
 * reloaded after the settle time (its backoff's, while its files keep
 * changing), so that the newest file on disk serves, validated anew,
 * whatever the events were: an attribute change may come before a write,
 * and a change of times or a truncate(2) by path is an IN_MODIFY with no
 * writer and no close. A file still open for writing then is not loaded:
 * the reload's own job asks (registry_load.c's find_writer), and the model
 * is reloaded again once no writer is left (on_writer_timer), or at the
 * writer's close (handle_event).
 */
static void
reload_dropped(struct watch *w, struct model_entry *m)
{
	watch_mark_dirty(w, m->name);
}

/* Loop thread: what a sync job found. */
static void
sync_after(struct workq_job *job, int status)
{
	struct sync_job *j = job->arg;
	struct watch *w = j->w;
	struct synced *s;
	struct model_entry *m;
	int again = 0, stray = 0;

	w->jobs--;
	if (w->stopping) {
		sync_job_free(j);
		watch_free_if_idle(w);
		return;
	}
	if ((s = find_synced(w, j->name, j->entry_id)) != NULL) {
		s->busy = 0;
		again = s->again;
		s->again = 0;
	}
	for (int k = 0; k < 2 && status == 0; k++) {
		if (j->dirs[k] == NULL)
			continue;
		if (j->wd[k] >= 0) {
			record_dir(w, j->dirs[k], j->wd[k]);
		} else {
			log_warnx("cannot watch %s for model updates: %s", j->dirs[k],
				j->why[k][0] != '\0' ? j->why[k] : strerror(j->err[k]));
		}
	}
	m = registry_find(w->reg, j->name);
	if (m != NULL && m->entry_id == j->entry_id && status == 0) {
		int same_path = strcmp(m->path, j->path) == 0;

		for (int k = 0; k < 2; k++)
			if (j->dirs[k] != NULL && j->wd[k] >= 0)
				stray |= stray_event(w, j->wd[k], j->dirs[k], m);
		if (j->refused[0] != '\0')
			log_warnx("model \"%s\": its watch's stat refused: %s", m->name,
				j->refused);

		/* Armed again after a failed load: a change of its path since
		 * (a file renamed into a directory made again) made no event
		 * this process saw (review rev199 M2). Unchanged: said at
		 * debug, the end of that look. */
		if (j->rearm && same_path && m->error != NULL) {
			if (watch_stat_sig(j->path_err, &j->path_st) !=
				watch_stat_sig(j->failed_err, &j->failed_st)) {
				log_info("model \"%s\": %s changed after its last load failed, "
					 "before its directory was watched again", m->name,
					m->path);
				watch_mark_dirty(w, m->name);
			} else {
				log_debug("model \"%s\": %s unchanged since its last load failed, "
					  "its directory watched again", m->name, m->path);
			}
		}
		if (s != NULL && same_path) {
			free(s->path);
			s->path = j->path;
			j->path = NULL;
		}
		for (size_t k = 0; k < j->ngens; k++) {
			struct generation *g = live_generation(m, j->gens[k].number);
			int pending;

			if (g == NULL || g->watched)
				continue;
			g->watched = 1;
			pending = g == m->pending;
			if (j->gens[k].replaced) {
				log_info("model \"%s\": generation %" PRIu64 ": a file was "
					 "replaced before its directory was watched", m->name,
					g->number);
				watch_mark_dirty(w, m->name);
			} else if (same_path && path_moved(j, g) && !own_file_in_place(j, g)) {
				log_info("model \"%s\": generation %" PRIu64 ": %s changed "
					 "before its directory was watched", m->name, g->number,
					m->path);
				watch_mark_dirty(w, m->name);
			}
			/* ... or written in place before: its descriptors say.
			 * A pending generation dropped for it is reloaded, as
			 * for the events of the same change (check_model). */
			check_generation(w->reg, g);
			if (pending && dropped(m, g))
				reload_dropped(w, m);
		}
		if (stray) {
			log_debug("model \"%s\": its directory changed as its watch was armed; "
				  "reloading", m->name);
			watch_mark_dirty(w, m->name);
		}
		registry_collect(w->reg);
	}
	sync_job_free(j);
	prune_dirs(w); /* the model may be gone, and what was armed for it unused */
	if (again)
		watch_sync(w);
}

/* Copies what sync_work compares of g (not yet watched) into j. */
static int
sync_add_gen(struct sync_job *j, const struct generation *g)
{
	struct sync_gen *s = &j->gens[j->ngens++];
	size_t n = g->origin != NULL ? g->norigin : g->source.nfiles;

	s->number = g->number;
	if ((s->paths = calloc(n ? n : 1, sizeof(*s->paths))) == NULL ||
		(s->dev = calloc(n ? n : 1, sizeof(*s->dev))) == NULL ||
		(s->ino = calloc(n ? n : 1, sizeof(*s->ino))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *path = g->origin != NULL ? g->origin[i].path : g->source.files[i].path;
		const struct stat *st = g->origin != NULL ? &g->origin[i].st :
			&g->source.files[i].st;

		if ((s->paths[i] = strdup(path)) == NULL)
			return -ENOMEM;
		s->dev[i] = st->st_dev;
		s->ino[i] = st->st_ino;
		s->n = i + 1;
	}
	return 0;
}

static int
unwatched(const struct generation *g)
{
	return g != NULL && !g->watched;
}

/* Queues a sync job for m; 0 or -errno. */
static int
start_sync(struct watch *w, struct synced *s, struct model_entry *m)
{
	struct sync_job *j = calloc(1, sizeof(*j));
	const struct generation *g = m->current != NULL ? m->current : m->pending;
	char what[sizeof(j->job.what)];
	int err = -ENOMEM;

	if (j == NULL)
		return -ENOMEM;
	j->w = w;
	j->entry_id = m->entry_id;
	j->wd[0] = j->wd[1] = -1;
	if ((j->name = strdup(m->name)) == NULL || (j->path = strdup(m->path)) == NULL ||
		(j->dirs[0] = dir_of(m->path)) == NULL)
		goto fail;
	if (unwatched(m->current) && sync_add_gen(j, m->current) < 0)
		goto fail;
	if (unwatched(m->pending) && sync_add_gen(j, m->pending) < 0)
		goto fail;
	if (m->watch_rearm && m->failed_path.known) {
		j->rearm = 1;
		j->failed_err = m->failed_path.err;
		j->failed_st = m->failed_path.st;
	}
	m->watch_rearm = 0;
	j->job.arg = j;
	snprintf(what, sizeof(what), "model \"%s\": arming its watches in %s%s%s", m->name,
		j->dirs[0], g != NULL ? " on " : "", g != NULL ? g->fs.name : "");
	if ((err = workq_submit(&w->reg->workq, &j->job, g != NULL ? gen_origin_fs(g) :
						  WORKQ_UNKNOWN, what, sync_work, sync_after)) < 0)
		goto fail;
	w->jobs++;
	s->busy = 1;
	return 0;
fail:
	sync_job_free(j);
	return err;
}

/* Loop thread, every WATCH_WRITER_MS while a model waits for a writer
 * (watch.h): reloads each whose writer is gone, unless its reload is due
 * or its load runs already (which decides whether it waits on); stops
 * once none waits. */
static void
on_writer_timer(uv_timer_t *t)
{
	struct watch *w = t->data;
	int waiting = 0;

	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		bool due = false;

		if (m->writer_path == NULL)
			continue;
		waiting = 1;
		for (size_t i = 0; i < w->ndirty && !due; i++)
			due = strcmp(w->dirty[i].name, m->name) == 0;
		if (!due && m->loading == 0 && registry_writer_gone(m))
			mark_dirty(w, m->name, false, 0);
	}
	if (!waiting)
		uv_timer_stop(t);
}

/* Starts the writer timer when a model waits for a writer. */
static void
arm_writers(struct watch *w)
{
	if (uv_is_active((uv_handle_t *)&w->writer_timer))
		return;
	for (const struct model_entry *m = w->reg->models; m != NULL; m = m->next)
		if (m->writer_path != NULL) {
			uv_timer_start(&w->writer_timer, on_writer_timer, WATCH_WRITER_MS,
				WATCH_WRITER_MS);
			return;
		}
}

void
watch_sync(struct watch *w)
{
	size_t kept = 0;

	prune_dirs(w);
	/* Forget the models gone (a job still running finds nothing). */
	for (size_t i = 0; i < w->nsynced; i++) {
		struct synced s = w->synced[i];
		struct model_entry *m = registry_find(w->reg, s.name);

		if ((m != NULL && m->entry_id == s.entry_id) || s.busy) {
			w->synced[kept++] = s;
			continue;
		}
		free(s.name);
		free(s.path);
	}
	w->nsynced = kept;
	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		struct synced *s = find_synced(w, m->name, m->entry_id), *grown;
		int err;

		if (s == NULL) {
			if ((grown = realloc(w->synced, (w->nsynced + 1) * sizeof(*grown))) == NULL)
				continue;
			w->synced = grown;
			s = &w->synced[w->nsynced];
			memset(s, 0, sizeof(*s));
			if ((s->name = strdup(m->name)) == NULL)
				continue;
			s->entry_id = m->entry_id;
			w->nsynced++;
		}
		if (s->busy) {
			s->again = 1;
			continue;
		}
		if (s->path != NULL && strcmp(s->path, m->path) == 0 && !unwatched(m->current) &&
			!unwatched(m->pending) && !m->watch_rearm)
			continue;
		if ((err = start_sync(w, s, m)) < 0)
			log_warnx("model \"%s\": cannot watch its files: %s", m->name,
				strerror(-err));
	}
	prune_paced(w);
	watch_poll_sync(w);
	arm_writers(w);
}

/* Compares each file of g with its fstat at open; marks g modified. */
static void
check_generation(struct registry *r, struct generation *g)
{
	struct stat st, relinked_st;
	size_t relinked = SIZE_MAX;

	/* An fstat on a remote filesystem asks its server, which may hang:
	 * not on the loop. Polling compares those files (watch_poll.c). */
	if (g == NULL || g->state == GEN_MODIFIED || (g->fs.remote && g->origin == NULL))
		return;
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (fstat(f->fd, &st) == -1)
			continue;
		if (file_written_in_place(&f->st, &st)) {
			registry_mark_modified(r, g, f->path);
			return;
		}
		/* The first file whose links alone moved, once no file is
		 * found written; not while a reload's fstats wait to be
		 * adopted (they show the move already). */
		if (relinked == SIZE_MAX && g->adopt_st == NULL && file_links_moved(&f->st, &st)) {
			relinked = i;
			relinked_st = st;
		}
	}
	if (relinked != SIZE_MAX)
		registry_relinked(r, g, relinked, &relinked_st);
}

void
watch_check_modified(struct watch *w)
{
	for (struct generation *g = w->reg->generations; g != NULL; g = g->next)
		if (g->model != NULL)
			check_generation(w->reg, g);
	registry_collect(w->reg);
}

/* Is name (in dir) one of m's paths: the model path or a current file? */
static int
names_model_file(const struct model_entry *m, const char *dir, const char *name)
{
	if (strcmp(m->path, dir) == 0)
		return 1; /* anything inside a directory model */
	if (strcmp(file_basename(m->path), name) == 0)
		return 1;
	for (int k = 0; k < 2; k++) {
		const struct generation *g = k == 0 ? m->current : m->pending;

		for (size_t i = 0; g != NULL && i < g->source.nfiles; i++)
			if (strcmp(file_basename(g->source.files[i].path), name) == 0)
				return 1;
	}
	return 0;
}

static void on_settle(uv_timer_t *t);

/* Arms the settle timer for the earliest reload due, or stops it. */
static void
arm_settle(struct watch *w)
{
	uint64_t now = uv_now(w->loop), due = UINT64_MAX;

	if (w->ndirty == 0) {
		uv_timer_stop(&w->settle);
		return;
	}
	for (size_t i = 0; i < w->ndirty; i++)
		if (w->dirty[i].due_ms < due)
			due = w->dirty[i].due_ms;
	uv_timer_start(&w->settle, on_settle, due > now ? due - now : 0, 0);
}

/*
 * Lengthens p's backoff, begun, to twice its delay (up to
 * WATCH_BACKOFF_MAX_MS), or begins it: the next reload waits twice the
 * settle time after this one, now. Where said, one line says it begins:
 * "N WHAT in S s, its files keep CHANGING: backing off ...", S counted
 * from since, the loop time the count of n began (else a debug line).
 */
static void
back_off(struct paced_model *p, uint64_t now, unsigned n, uint64_t since, const char *what,
	const char *changing, bool said)
{
	char more[96];

	p->reload_ms = now;
	if (p->delay_ms != 0) {
		p->delay_ms = p->delay_ms < WATCH_BACKOFF_MAX_MS / 2 ? 2 * p->delay_ms :
			WATCH_BACKOFF_MAX_MS;
		return;
	}
	p->delay_ms = 2 * (uint64_t)WATCH_SETTLE_MS;
	if (!said) {
		log_debug("model \"%s\": %u %s in %.1f s: backing off again", p->name, n, what,
			(double)(now - since) / 1000);
		return;
	}
	/* This line is its minute's "reloading" line (say_reloading), and
	 * says how many of those were not logged. */
	(void)lograte_check(&p->lines, 0, now, UINT_MAX, more, sizeof(more), "reloads of it");
	log_info("model \"%s\": %u %s in %.1f s, its files keep %s: backing off, the next "
		 "reload waits %" PRIu64 " ms after this one, each further one twice as long, "
		 "up to %d s, until its files are quiet for %d s%s",
		p->name, n, what, (double)(now - since) / 1000, changing, p->delay_ms,
		WATCH_BACKOFF_MAX_MS / 1000, WATCH_QUIET_MS / 1000, more);
}

/*
 * Counts a watched reload of m that was no swap, now, and starts or
 * lengthens its backoff (watch.h): past WATCH_BURST_RELOADS reloads in
 * WATCH_BURST_MS, the next waits twice the settle time after this one (one
 * line says so), and each further one twice as long as the one before, up
 * to WATCH_BACKOFF_MAX_MS. Returns the model's entry, NULL without memory.
 */
static struct paced_model *
count_reload(struct watch *w, const struct model_entry *m, uint64_t now)
{
	struct paced_model *p = paced_for(w, m);

	if (p == NULL)
		return NULL;
	if (now - p->window_ms >= WATCH_BURST_MS) {
		p->window_ms = now;
		p->reloads = 0;
	}
	p->reloads++;
	if (p->delay_ms != 0 || p->reloads > WATCH_BURST_RELOADS)
		back_off(p, now, p->reloads, p->window_ms, "reloads", "changing", true);
	else
		p->reload_ms = now;
	return p;
}

/*
 * Counts a swap of m, now (watch.h): it starts the count of reloads over
 * (a directory model's new file, written in its directory, is an event of
 * the model's from its creation on, and a writer slower than the settle
 * time has it reloaded, unchanged, before the rename: review rev197 W2),
 * and, past WATCH_BURST_SWAPS swaps in WATCH_SWAPS_MS, counts as a reload
 * does: a loop of swaps backs off (W3). One line says so the first time
 * in a count; a backoff begun otherwise goes on, and the swap waited it
 * out (mark_dirty), but does not lengthen it.
 */
static void
count_swap(struct watch *w, const struct model_entry *m, uint64_t now)
{
	struct paced_model *p = paced_for(w, m);

	if (p == NULL)
		return;
	p->reloads = 0;
	p->window_ms = now;
	if (p->delay_ms == 0 && now - p->swaps_ms >= WATCH_SWAPS_MS) {
		p->swaps_ms = now;
		p->swaps = 0;
	}
	if (++p->swaps > WATCH_BURST_SWAPS)
		back_off(p, now, p->swaps, p->swaps_ms, "swaps", "being replaced",
			p->swaps == WATCH_BURST_SWAPS + 1);
}

/* "Files changed on disk, reloading" for p's model (p may be NULL): at
 * most once a minute while it is backed off, saying how many were not
 * (the others at debug level). The limiter has one key, the model's own. */
static void
say_reloading(struct paced_model *p, const char *name, uint64_t now)
{
	char more[96];

	if (p == NULL || p->delay_ms == 0)
		log_info("model \"%s\": files changed on disk, reloading", name);
	else if (lograte_check(&p->lines, 0, now, 1, more, sizeof(more), "reloads of it"))
		log_info("model \"%s\": files changed on disk, reloading%s", name, more);
	else
		log_debug("model \"%s\": files changed on disk, reloading (backed off: one "
			  "line a minute)", name);
}

/* A watched reload asked for (ask_reload), until its answer (reload_done). */
struct asked_reload {
	struct watch *w;
	uint64_t entry_id;
	uint64_t last;  /* the model's last generation number when asked */
	char name[];
};

/*
 * The answer to a watched reload: counted for the backoff (count_reload)
 * by what it did, not by the events that asked for it, unless it made a
 * generation whose inodes are not those of the one made before (the
 * model's new_inodes, registry.h): a swap, an update as an operator's
 * reload would load, however it came (a rename over the model's path, a
 * directory model's new file written in its directory), counted apart
 * (count_swap). Every other answer counts: the files found unchanged,
 * refused, open for writing, a wait for room or for the load in flight,
 * or the same inodes loaded again (a pending generation dropped for a
 * chmod); so a rename of a served file away and back, or a lock file made
 * and removed in a directory model's directory, in a loop, backs off as a
 * touch does (review rev197 W1). One debug line says what it did.
 */
static void
reload_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct asked_reload *a = arg;
	struct watch *w = a->w;
	struct model_entry *m = w->stopping ? NULL : registry_find(w->reg, a->name);
	bool swap;

	w->jobs--;
	if (m != NULL && m->entry_id == a->entry_id) {
		swap = status == 0 && generation > a->last && generation == m->new_inodes;
		if (swap)
			count_swap(w, m, uv_now(w->loop));
		else
			(void)count_reload(w, m, uv_now(w->loop));
		log_debug("model \"%s\": watched reload: %s%s", m->name, message,
			swap ? " (new files: a swap, counted apart)" : "");
	}
	free(a);
	if (w->stopping)
		watch_free_if_idle(w);
}

/* Asks for a watched reload of m, counted by its answer (reload_done);
 * never counted when lost (asked only because events were lost: most
 * models did not change). Without memory it is counted now. */
static void
ask_reload(struct watch *w, const struct model_entry *m, bool lost)
{
	size_t len = strlen(m->name) + 1;
	struct asked_reload *a = lost ? NULL : malloc(sizeof(*a) + len);

	if (a != NULL) {
		a->w = w;
		a->entry_id = m->entry_id;
		a->last = m->last_generation;
		memcpy(a->name, m->name, len);
		w->jobs++;
	} else if (!lost) {
		(void)count_reload(w, m, uv_now(w->loop));
	}
	if (registry_reload_watched(w->reg, m->name, a != NULL ? reload_done : NULL, a) < 0) {
		log_warnx("%s", error_get());
		if (a != NULL) {
			w->jobs--;
			free(a);
		}
	}
}

/* Reloads the models whose time has come; the others wait on. */
static void
on_settle(uv_timer_t *t)
{
	struct watch *w = t->data;
	uint64_t now = uv_now(w->loop);
	struct model_entry *m;
	struct paced_model *p;
	size_t kept = 0;

	for (size_t i = 0; i < w->ndirty; i++) {
		struct dirty_model d = w->dirty[i];

		if (d.due_ms > now) {
			w->dirty[kept++] = d;
			continue;
		}
		/* Reloading early is safe: a reload serves new inodes only
		 * (files renamed over, not written in place), validates them,
		 * and makes nothing of a file anyone still has open for
		 * writing (registry_load.c's find_writer): the generation
		 * serving stays, and once no writer is left (on_writer_timer,
		 * or its writer's close) the model is reloaded again. */
		m = registry_find(w->reg, d.name);
		p = find_paced(w, d.name);
		if (m != NULL) {
			/* After lost events most models did not change: a
			 * reload that finds the same files is quiet. */
			if (d.lost)
				log_debug("model \"%s\": checking its files (inotify lost "
					  "events)", d.name);
			else if (d.relink)
				log_debug("model \"%s\": loading its files again after a "
					  "link count change", d.name);
			else
				say_reloading(p, d.name, now);
			ask_reload(w, m, d.lost);
		}
		free(d.name);
	}
	w->ndirty = kept;
	prune_paced(w);
	arm_settle(w);
}

/* watch_mark_dirty, lost: only because events were lost (an overflow);
 * relink_due: not 0, asked by watch_revalidate alone, due then (paced) if
 * no reload of the model was asked already. */
static void
mark_dirty(struct watch *w, const char *name, bool lost, uint64_t relink_due)
{
	uint64_t now = uv_now(w->loop);
	struct dirty_model *d = NULL, *grown;
	struct paced_model *p = find_paced(w, name);

	if (p != NULL && !lost && relink_due == 0) {
		/* Quiet for long enough: its backoff is over. */
		if (paced_quiet(p, now)) {
			p->delay_ms = 0;
			p->reloads = 0;
			p->window_ms = now;
		}
		p->event_ms = now;
	}
	for (size_t i = 0; i < w->ndirty && d == NULL; i++)
		if (strcmp(w->dirty[i].name, name) == 0)
			d = &w->dirty[i];
	if (d == NULL) {
		if ((grown = realloc(w->dirty, (w->ndirty + 1) * sizeof(*grown))) == NULL)
			return;
		w->dirty = grown;
		d = &w->dirty[w->ndirty];
		if ((d->name = strdup(name)) == NULL)
			return;
		d->first_ms = now;
		d->lost = lost;
		d->relink = relink_due != 0;
		w->ndirty++;
		if (relink_due != 0) {
			/* Asked by nothing else: as paced. */
			d->due_ms = relink_due;
			arm_settle(w);
			return;
		}
	} else if (relink_due != 0) {
		return; /* that reload carries the revalidation */
	} else if (!lost) {
		d->lost = false;
		d->relink = false;
	}
	/* Only this model's own events postpone its reload, and only up to
	 * the maximum: a neighbour writing her files without pause can delay
	 * neither hers nor anyone else's for longer. */
	d->due_ms = now + WATCH_SETTLE_MS;
	if (d->due_ms > d->first_ms + WATCH_SETTLE_MAX_MS)
		d->due_ms = d->first_ms + WATCH_SETTLE_MAX_MS;
	/* A model backed off waits out its delay since its last reload
	 * (count_reload): later, never lost. */
	if (p != NULL && p->delay_ms != 0 && d->due_ms < p->reload_ms + p->delay_ms)
		d->due_ms = p->reload_ms + p->delay_ms;
	arm_settle(w);
}

void
watch_mark_dirty(struct watch *w, const char *name)
{
	mark_dirty(w, name, false, 0);
}

uint64_t
watch_relink_delay(uint64_t now, uint64_t *last_ms, uint64_t *delay_ms)
{
	uint64_t due = now + WATCH_SETTLE_MS;

	if (*last_ms == 0 || now >= *last_ms + WATCH_RELINK_QUIET_MS) {
		*delay_ms = 0;
	} else {
		*delay_ms = *delay_ms == 0 ? WATCH_RELINK_MIN_MS :
			*delay_ms * 2 > WATCH_RELINK_MAX_MS ? WATCH_RELINK_MAX_MS : *delay_ms * 2;
		if (*last_ms + *delay_ms > due)
			due = *last_ms + *delay_ms;
	}
	*last_ms = due;
	return due - now;
}

void
watch_revalidate(struct watch *w, const char *name)
{
	const struct model_entry *m = w->stopping ? NULL : registry_find(w->reg, name);
	struct paced_model *p;
	uint64_t now = uv_now(w->loop), delay = WATCH_SETTLE_MS;

	if (m == NULL)
		return;
	if ((p = paced_for(w, m)) != NULL) {
		bool paced = p->relink_delay_ms != 0;

		delay = watch_relink_delay(now, &p->relink_ms, &p->relink_delay_ms);
		if (p->relink_delay_ms != 0 && !paced)
			log_info("model \"%s\": links of its files keep changing: each reload of "
				 "them waits %d s to %d s", name, WATCH_RELINK_MIN_MS / 1000,
				WATCH_RELINK_MAX_MS / 1000);
	}
	mark_dirty(w, name, false, now + delay);
}

/* One line for the first overflow, then at most one a minute with how
 * many there were: a neighbour flooding a model's directory must not flood
 * the journal too. */
#define OVERFLOW_LOG_MS 60000

static void
log_overflow(struct watch *w)
{
	uint64_t now = uv_now(w->loop), n;

	w->overflows++;
	if (w->overflows_logged > 0 && now - w->overflow_log_ms < OVERFLOW_LOG_MS)
		return;
	n = w->overflows - w->overflows_logged;
	log_warnx("inotify lost events (its queue overflowed %" PRIu64 " time%s%s; "
		  "fs.inotify.max_queued_events): checking every model's files",
		n, n == 1 ? "" : "s", w->overflows_logged > 0 ? " since the last line" : "");
	w->overflows_logged = w->overflows;
	w->overflow_log_ms = now;
}

/* The models one wakeup's events touched (up to READS_PER_WAKEUP reads):
 * each is checked once after them (check_generation fstats every file of
 * two generations), not once per event, so that writes to unrelated files
 * in a directory model's directory cost one check per wakeup, whatever
 * their number. */
struct touched {
	struct model_entry **models;
	size_t n, cap;
};

/*
 * Checks m's generations for in-place changes. A pending generation (not
 * served yet) dropped for one is reloaded (reload_dropped), or, while one
 * of its files is open for writing, once no writer is left. A current
 * generation changed in place is not reloaded: its files' inodes are
 * served still (registry_load.c's same_files).
 */
static void
check_model(struct watch *w, struct model_entry *m)
{
	struct generation *pending = m->pending;

	check_generation(w->reg, m->current);
	check_generation(w->reg, m->pending);
	if (pending != NULL && dropped(m, pending))
		reload_dropped(w, m);
}

/* Adds m to t; where no memory is to be had, checks it now instead. */
static void
touch(struct watch *w, struct touched *t, struct model_entry *m)
{
	struct model_entry **grown;

	for (size_t i = 0; i < t->n; i++)
		if (t->models[i] == m)
			return;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 8;

		if ((grown = reallocarray(t->models, cap, sizeof(struct model_entry *))) == NULL) {
			check_model(w, m);
			return;
		}
		t->models = grown;
		t->cap = cap;
	}
	t->models[t->n++] = m;
}

/* Events were lost (a queue overflow, a failed inotify descriptor): every
 * served generation is checked for changes in place, and every model is
 * reloaded quietly (unchanged files make no new generation). */
static void
check_everything(struct watch *w)
{
	watch_check_modified(w);
	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next)
		mark_dirty(w, m->name, true, 0);
}

/* Is name a file of m's current or pending generation (or of its origin,
 * staged)? */
static bool
generation_file(const struct model_entry *m, const char *name)
{
	for (int k = 0; k < 2; k++) {
		const struct generation *g = k == 0 ? m->current : m->pending;

		for (size_t i = 0; g != NULL && i < g->source.nfiles; i++)
			if (strcmp(file_basename(g->source.files[i].path), name) == 0)
				return true;
		for (size_t i = 0; g != NULL && i < g->norigin; i++)
			if (strcmp(file_basename(g->origin[i].path), name) == 0)
				return true;
	}
	return false;
}

static bool
is_dirty(const struct watch *w, const char *name)
{
	for (size_t i = 0; i < w->ndirty; i++)
		if (strcmp(w->dirty[i].name, name) == 0)
			return true;
	return false;
}

/*
 * Is name, an entry of dir, a *.safetensors that cannot change what m
 * loads: m a directory model (dir itself) whose newest generation a shard
 * index in it made (a restored generation keeps no format: more than one
 * file says so), name none of its current or pending generation's files,
 * and nothing since that load says the directory may lead to other files
 * (no load of m failed, runs or is due, no writer is waited for, no tree
 * refused)? Then the index, not the directory, says which *.safetensors
 * load (shards_find_model takes a directory's one *.safetensors only
 * where it has no index), and it names none but that generation's: an
 * index renamed over, written or removed is an event of its own, which
 * reloads the model, and a load that failed (a shard the new index names
 * not there yet) has every later event reload it again. So the shards of
 * the README's update, written into the directory under new names before
 * the index is renamed over, reload nothing, as for a model configured by
 * its index's path (names_model_file); before, each reloaded it,
 * unchanged, and the sixth began the backoff that the index's rename then
 * waited out (review rev200 M2). Other names (a lock or temporary file)
 * still reload it, and count (rev197 W1).
 */
static bool
unnamed_shard(const struct watch *w, const struct model_entry *m, const char *dir,
	const char *name)
{
	const struct generation *g = m->pending != NULL ? m->pending : m->current;

	return strcmp(m->path, dir) == 0 && g != NULL &&
		(g->source.format == FORMAT_SHARDED || g->source.nfiles > 1) &&
		file_has_suffix(name, ".safetensors") && m->error == NULL && m->loading == 0 &&
		m->writer_path == NULL && !m->room_wait && !m->refused_tree &&
		!is_dirty(w, m->name) && !generation_file(m, name);
}

static void
handle_event(struct watch *w, const struct inotify_event *ev, struct touched *t)
{
	const char *dir = NULL;

	if (ev->mask & IN_Q_OVERFLOW) {
		log_overflow(w);
		check_everything(w);
		return;
	}
	for (size_t i = 0; i < w->ndirs; i++)
		if (w->dirs[i].wd == ev->wd)
			dir = w->dirs[i].path;
	if (dir == NULL && ev->len > 0 && (ev->mask & NAME_EVENTS))
		note_stray(w, ev->wd, ev->name);
	if (dir == NULL || ev->len == 0)
		return;
	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		if (!model_uses_dir(m, dir) || !names_model_file(m, dir, ev->name))
			continue;
		touch(w, t, m);
		/* A close after a write (of any file of a directory model)
		 * reloads too: a reload that found a file open for writing
		 * waits for it (registry_load.c's find_writer), and a close
		 * says soonest that none may be left (on_writer_timer asks
		 * it of any file, wherever it is). */
		if ((ev->mask & NAME_EVENTS) && !unnamed_shard(w, m, dir, ev->name))
			mark_dirty(w, m->name, false, 0);
	}
}

/*
 * The inotify descriptor failed otherwise than for want of events (a read
 * error but EAGAIN and EINTR, or the poll's own): events are lost from now
 * on, and the level-triggered poll would find it readable and fail again
 * on every turn of the loop. So it is not watched any more, and, as when
 * inotify cannot watch a remote filesystem's changes, every model's paths
 * are polled from now on (watch_poll.c, every poll_interval); and, as
 * after an overflow, every model is checked now for the changes whose
 * events were lost. One line says so. The descriptor stays open until the
 * watch is freed: sync jobs may still add watches to it.
 */
static void
inotify_failed(struct watch *w, const char *call, const char *reason)
{
	log_warnx("inotify descriptor %d: %s: %s: model updates are seen by polling every "
		  "model's paths from now on (every poll_interval)", w->fd, call, reason);
	w->reg->inotify_failed = 1;
	uv_poll_stop(&w->poll);
	check_everything(w);
	watch_poll_sync(w);
}

static void
on_readable(uv_poll_t *p, int status, int events)
{
	struct watch *w = p->data;
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
	struct touched t = { 0 };
	ssize_t n;

	(void)events;
	if (status < 0) {
		inotify_failed(w, "poll", uv_strerror(status));
		return;
	}
	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		if ((n = read(w->fd, buf, sizeof(buf))) <= 0) {
			/* No event now (EAGAIN), or a signal: the poll comes
			 * back. inotify never ends: 0 is as wrong as an error. */
			if (n == 0)
				inotify_failed(w, "read", "end of file");
			else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				inotify_failed(w, "read", strerror(errno));
			break;
		}
		for (char *q = buf; q < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)q;

			handle_event(w, ev, &t);
			q += sizeof(*ev) + ev->len;
		}
	}
	/* No model goes away while the events are read: the entries stay. */
	for (size_t i = 0; i < t.n; i++)
		check_model(w, t.models[i]);
	free(t.models);
	registry_collect(w->reg);
}

int
watch_start(uv_loop_t *loop, struct registry *r, struct watch **out)
{
	struct watch *w = calloc(1, sizeof(*w));
	int err;

	if (w == NULL)
		return error_set(-ENOMEM, "watch: out of memory");
	w->reg = r;
	/* The signal of a read lease's break (registry_load.c's find_writer
	 * takes one on a watched reload's files): ignored, whatever wcached
	 * inherited, not left to SIGURG's default. */
	if (sigaction(SIGURG, &(struct sigaction){ .sa_handler = SIG_IGN }, NULL) == -1) {
		err = -errno;
		free(w);
		return error_set(err, "sigaction SIGURG: %s", strerror(-err));
	}
	if ((w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) == -1) {
		err = -errno;
		free(w);
		return error_set(err, "inotify_init1: %s", strerror(-err));
	}
	if ((err = uv_poll_init(loop, &w->poll, w->fd)) < 0) {
		close(w->fd);
		free(w);
		return error_set(err, "watch: %s", uv_strerror(err));
	}
	uv_timer_init(loop, &w->settle);
	uv_timer_init(loop, &w->poll_timer);
	uv_timer_init(loop, &w->writer_timer);
	w->loop = loop;
	w->poll.data = w->settle.data = w->poll_timer.data = w->writer_timer.data = w;
	w->handles = 4;
	uv_poll_start(&w->poll, UV_READABLE, on_readable);
	*out = w;
	return 0;
}

void
watch_free_if_idle(struct watch *w)
{
	/* A poll still on the work queue frees w when it ends. */
	if (w->handles > 0 || w->jobs > 0)
		return;
	close(w->fd);
	for (size_t i = 0; i < w->ndirs; i++)
		free(w->dirs[i].path);
	free(w->dirs);
	for (size_t i = 0; i < w->ndirty; i++)
		free(w->dirty[i].name);
	free(w->dirty);
	for (size_t i = 0; i < w->npaced; i++)
		free(w->paced[i].name);
	free(w->paced);
	for (size_t i = 0; i < w->nsynced; i++) {
		free(w->synced[i].name);
		free(w->synced[i].path);
	}
	free(w->synced);
	watch_poll_free(w);
	free(w);
}

static void
on_closed(uv_handle_t *h)
{
	struct watch *w = h->data;

	w->handles--;
	watch_free_if_idle(w);
}

void
watch_stop(struct watch *w)
{
	if (w == NULL)
		return;
	w->stopping = 1;
	uv_poll_stop(&w->poll);
	uv_timer_stop(&w->settle);
	uv_timer_stop(&w->poll_timer);
	uv_timer_stop(&w->writer_timer);
	uv_close((uv_handle_t *)&w->poll, on_closed);
	uv_close((uv_handle_t *)&w->settle, on_closed);
	uv_close((uv_handle_t *)&w->poll_timer, on_closed);
	uv_close((uv_handle_t *)&w->writer_timer, on_closed);
}
