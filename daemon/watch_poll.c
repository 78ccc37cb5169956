/*
 * watch_poll.c: polling the paths of models whose updates inotify cannot
 * see (watch.h; README, "Models on shared storage").
 *
 * inotify reports what this host's kernel does. On a network or FUSE
 * filesystem another host may replace a model (write a new file, rename it
 * over the old one) and nothing here hears of it. A model is polled when
 * its watch is "poll", or "auto" and its current generation is on such a
 * filesystem, or whatever its watch once the inotify descriptor failed
 * for good (watch.c sets reg->inotify_failed; registry_polls says which):
 * every poll_interval its path and its files' paths (for a staged
 * generation, the files it was copied from) are stat'ed on libuv's work
 * queue, never on the loop (a stat of a remote file can block for as long
 * as the server takes), and compared with what the generation opened:
 *  - a path that names another file, or none: the model was replaced; it
 *    is reloaded, as an inotify event would have it;
 *  - the same file with another size, mtime or ctime (watch.c's rule):
 *    written in place; the generation is marked modified, and reloaded
 *    (the inode number may be one the server gave again to the file that
 *    replaced it); a staged one is only reloaded: its copies are intact;
 *  - the model's own path (a directory, a shard index) changed since the
 *    load of this generation opened it, or a warm restart's check listed
 *    its files (since its first poll when neither is known): reloaded.
 * A change is acted on only once two polls in a row saw the same stat of
 * every path, so a file still being written is left alone until it stops
 * moving (said once per change, not at each poll), and only once per state
 * of the paths (a reload that failed, a half-written file say, is not
 * retried until the paths change again).
 * A generation served where it lies whose files another host replaced
 * (source_replaced) may be gone from the server while it still serves (the
 * replacement failed to load): each poll also fstats its served
 * descriptors, and once the server says it dropped one, the generation is
 * no longer offered (check_served).
 * One poll per model runs at a time.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/file.h"
#include "generation.h"
#include "log.h"
#include "mountrule.h"
#include "watch_internal.h"

struct poll_job {
	struct workq_job job;
	struct watch *w;
	char *name;
	uint64_t entry_id;
	uint64_t generation;
	size_t npaths;      /* [0] the model's path, then each file's */
	char **paths;
	struct stat *st;
	int *err;           /* 0 or errno of each stat */
	/* The first path the walk refused (EXDEV: a user's FUSE mount on
	 * the way), why: its one line (mountrule.h), or "". */
	char refused[MOUNTRULE_WHY];
	double seconds;     /* the stats took */
	/* A generation whose files were replaced by another host, served
	 * where they lie (source_replaced): its served descriptors, fstat'ed
	 * too (check_served), while the job holds it open (served_checks). */
	struct generation *checked;
	size_t nfds;
	int *fds;           /* checked->served_fds' numbers */
	int *fd_err;        /* 0 or errno of each fstat */
};

static uint64_t
mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
	return h * 0xFF51AFD7ED558CCDull;
}

/* The file's identity, size, mtime and ctime (a writer can put the mtime
 * back, never the ctime): watch_internal.h. */
uint64_t
watch_stat_sig(int err, const struct stat *st)
{
	uint64_t h = mix(1, (uint64_t)err);

	if (err != 0)
		return h;
	h = mix(h, (uint64_t)st->st_dev);
	h = mix(h, (uint64_t)st->st_ino);
	h = mix(h, (uint64_t)st->st_size);
	h = mix(h, (uint64_t)st->st_mtim.tv_sec);
	h = mix(h, (uint64_t)st->st_mtim.tv_nsec);
	h = mix(h, (uint64_t)st->st_ctim.tv_sec);
	return mix(h, (uint64_t)st->st_ctim.tv_nsec);
}

/* The path and the stat at open of g's file i: its origin when staged. */
static void
file_of(const struct generation *g, size_t i, const char **path, const struct stat **st)
{
	if (g->origin != NULL) {
		*path = g->origin[i].path;
		*st = &g->origin[i].st;
	} else {
		*path = g->source.files[i].path;
		*st = &g->source.files[i].st;
	}
}

static size_t
nfiles(const struct generation *g)
{
	return g->origin != NULL ? g->norigin : g->source.nfiles;
}

static void
job_free(struct poll_job *j)
{
	for (size_t i = 0; j->paths != NULL && i < j->npaths; i++)
		free(j->paths[i]);
	free(j->paths);
	free(j->st);
	free(j->err);
	free(j->fds);
	free(j->fd_err);
	free(j->name);
	free(j);
}

/* Work queue thread: stat every path, and fstat the served descriptors
 * of a generation checked (an fstat of a file the server dropped asks the
 * server, and may wait on it as long as a stat). */
static void
poll_work(struct workq_job *work)
{
	struct poll_job *j = work->arg;
	struct mountrule_walk walk;
	struct timespec a, b;
	struct stat st;

	clock_gettime(CLOCK_MONOTONIC, &a);
	/* One run of walks: the mount table read once, the files' directory
	 * walked from "/" once (mountrule.h). */
	mountrule_walk_init(&walk);
	for (size_t i = 0; i < j->npaths; i++) {
		char why[MOUNTRULE_WHY];

		j->err[i] = mountrule_stat(&walk, j->paths[i], &j->st[i], why, sizeof(why)) == 0 ?
			0 : errno;
		if (j->err[i] == EXDEV && j->refused[0] == '\0')
			snprintf(j->refused, sizeof(j->refused), "%s", why);
	}
	mountrule_walk_end(&walk);
	for (size_t i = 0; i < j->nfds; i++)
		j->fd_err[i] = fstat(j->fds[i], &st) == 0 ? 0 : errno;
	clock_gettime(CLOCK_MONOTONIC, &b);
	j->seconds = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
}

static struct polled *
find_polled(struct watch *w, const char *name, uint64_t entry_id)
{
	for (size_t i = 0; i < w->npolled; i++)
		if (w->polled[i].entry_id == entry_id && strcmp(w->polled[i].name, name) == 0)
			return &w->polled[i];
	return NULL;
}

/* Every generation of m still open on a remote filesystem and not staged
 * may have lost the file it maps: say so in status. */
static void
mark_sources_replaced(struct registry *r, const struct model_entry *m)
{
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m && g->origin == NULL && g->fs.remote && !g->source_replaced) {
			g->source_replaced = 1;
			g->replaced_at_errors = m->load_errors;
			log_warnx("model \"%s\": generation %" PRIu64 ": its files on %s were "
				  "replaced by another host and were not staged: pages of them "
				  "not in memory here may be unreadable (a worker that touches "
				  "one gets SIGBUS)", g->model_name, g->number, g->fs.name);
		}
}

/* How soon a change is looked at again before it is acted on. */
static uint64_t
confirm_ms(const struct model_entry *m)
{
	return m->poll_interval_ms / 4 > 100 ? m->poll_interval_ms / 4 : 100;
}

/*
 * A poll saw a change (sig, the stat of every path; what, the path that
 * moved): 1 when it is to be acted on now, counted in poll_changes. A file
 * still moving (being written) waits until two polls agree, the second
 * sooner than poll_interval; a state already acted on is not acted on
 * again. That it is still moving is said once, not at every confirming
 * poll (a write of minutes said it twice a second).
 */
static int
settled(struct watch *w, struct polled *p, struct model_entry *m, uint64_t sig,
	const char *what)
{
	if (sig != p->last_sig) {
		if (p->changing && !p->said_changing) {
			log_info("model \"%s\": %s is still changing; waiting until it is stable",
				m->name, what);
			p->said_changing = 1;
		}
		p->last_sig = sig;
		p->changing = 1;
		p->due_ms = uv_now(w->loop) + confirm_ms(m);
		return 0;
	}
	p->changing = 0;
	p->said_changing = 0;
	if (sig == p->acted_sig)
		return 0;
	p->acted_sig = sig;
	m->poll_changes++;
	return 1;
}

/*
 * Did a stat of the poll fail for a reason that says nothing about the
 * file (EIO, ETIMEDOUT on a soft mount, EACCES, ENOMEM...)? Then nothing
 * is concluded from this poll: only "no such file" (ENOENT, ENOTDIR) means
 * a path was replaced or removed. Logged once per errno, and once when
 * polls work again; a path the walk refused (EXDEV) with the walk's line,
 * which names the path, the mount and why.
 */
static int
unsure(struct polled *p, const struct model_entry *m, const struct poll_job *j)
{
	for (size_t i = 0; i < j->npaths; i++) {
		int e = j->err[i];

		if (e == 0 || e == ENOENT || e == ENOTDIR)
			continue;
		if (p->failing != e && e == EXDEV && j->refused[0] != '\0')
			log_warnx("model \"%s\": polling refused: %s; nothing is concluded until "
				  "a poll works again", m->name, j->refused);
		else if (p->failing != e)
			log_warnx("model \"%s\": polling %s failed: %s; nothing is concluded "
				  "until a poll works again", m->name, j->paths[i], strerror(e));
		p->failing = e;
		return 1;
	}
	if (p->failing != 0)
		log_info("model \"%s\": polling its paths works again", m->name);
	p->failing = 0;
	return 0;
}

/* Loop thread: what a poll saw, compared with the generation. */
static void
judge(struct watch *w, struct polled *p, struct model_entry *m, struct generation *g,
	const struct poll_job *j)
{
	uint64_t sig = 0, path_sig = watch_stat_sig(j->err[0], &j->st[0]);
	const char *what = NULL;
	bool replaced = false, in_place = false, relinked = false;
	size_t relinked_i = 0;

	for (size_t i = 0; i < j->npaths; i++)
		sig = mix(sig, watch_stat_sig(j->err[i], &j->st[i]));
	if (p->generation != g->number) {
		/* The model's own path is compared with what the load that made
		 * g opened: a shard index renamed over it since (another host
		 * publishing shards under new names, then the index) shows in
		 * that path alone, and this first poll may come poll_interval
		 * after the load, or after g warmed as the pending generation
		 * (polls wait meanwhile). Taking this poll as the baseline
		 * missed such an update for good. A generation a warm restart
		 * took back has its check's stat instead (restore_layout.c);
		 * one with neither takes this poll. */
		p->generation = g->number;
		p->dir_sig = g->opened_path.known ? watch_stat_sig(0, &g->opened_path.st) :
			path_sig;
		p->last_sig = 0;
		p->changing = 0;
		p->said_changing = 0;
	}
	for (size_t i = 1; i < j->npaths; i++) {
		const char *path;
		const struct stat *then;

		file_of(g, i - 1, &path, &then);
		if (j->err[i] != 0 || j->st[i].st_dev != then->st_dev ||
			j->st[i].st_ino != then->st_ino) {
			replaced = true;
			what = path;
		} else if (file_written_in_place(then, &j->st[i])) {
			in_place = true;
			if (what == NULL)
				what = path;
		} else if (!relinked && file_links_moved(then, &j->st[i])) {
			relinked = true;
			relinked_i = i - 1;
		}
	}
	/* Only links moved (a staged copy's source restages instead: its
	 * origin's ctime, same_inodes): its files are loaded again,
	 * validated anew, paced; g keeps serving meanwhile. Every file
	 * moved is recorded: the reload knows each by its ctime now. */
	if (relinked && !replaced && !in_place && g->origin == NULL && g->adopt_st == NULL) {
		registry_relinked(w->reg, g, relinked_i, &j->st[relinked_i + 1]);
		for (size_t i = relinked_i; i < g->source.nfiles && i + 1 < j->npaths; i++)
			if (file_links_moved(&g->source.files[i].st, &j->st[i + 1]))
				gen_relinked_also(g, i, &j->st[i + 1]);
	}
	if (!replaced && !in_place && path_sig == p->dir_sig) {
		p->last_sig = sig;
		p->changing = 0;
		p->said_changing = 0;
		return;
	}
	if (what == NULL)
		what = m->path;
	if (!settled(w, p, m, sig, what))
		return;
	if (in_place && !replaced && g->origin == NULL) {
		bool remote = g->fs.remote; /* g may close in registry_collect */

		log_info("model \"%s\": %s was written in place on %s, or replaced by a file "
			 "given the same inode number (seen by polling)", m->name, what,
			g->fs.name);
		registry_mark_modified(w->reg, g, what);
		registry_collect(w->reg);
		if (!remote && path_sig == p->dir_sig)
			return;
	} else {
		log_info("model \"%s\": %s changed on %s (seen by polling)", m->name, what,
			g->fs.name);
	}
	if (replaced)
		mark_sources_replaced(w->reg, m);
	watch_mark_dirty(w, m->name);
}

/* Loop thread: what a poll of a model with no generation saw (its last
 * load failed): once its path stops matching what it was at that failure,
 * and two polls agree, the model is loaded again (once per state). */
static void
judge_failed(struct watch *w, struct polled *p, struct model_entry *m, const struct poll_job *j)
{
	uint64_t sig = watch_stat_sig(j->err[0], &j->st[0]);

	if (p->generation != 0) {
		p->generation = 0;
		p->last_sig = 0;
		p->changing = 0;
		p->said_changing = 0;
	}
	if (sig == watch_stat_sig(m->failed_path.err, &m->failed_path.st)) {
		p->last_sig = sig;
		p->changing = 0;
		p->said_changing = 0;
		return;
	}
	if (!settled(w, p, m, sig, m->path))
		return;
	log_info("model \"%s\": %s changed (seen by polling); loading it again", m->name,
		m->path);
	watch_mark_dirty(w, m->name);
}

/*
 * Loop thread: what the fstats of the served descriptors of g (m's
 * current generation, served where it lies on a remote filesystem, whose
 * files another host replaced or removed, and whose replacement did not
 * load) saw. ESTALE or ENOENT: the server dropped the file, so a new
 * worker would fail to attach it ("Stale file handle"), or attach while
 * its attributes are cached here and die of SIGBUS later; g is no longer
 * offered (registry_mark_gone), with the reason and the remedy. A file
 * only renamed away, or linked elsewhere, still answers: g keeps serving,
 * and is looked at again at each poll. Any other error (EIO, a soft
 * mount's ETIMEDOUT) says nothing: looked at again at the next poll.
 */
static void
check_served(struct watch *w, struct generation *g, const struct poll_job *j)
{
	for (size_t i = 0; i < j->nfds && i < g->source.nfiles; i++) {
		int e = j->fd_err[i];

		if (e != ESTALE && e != ENOENT)
			continue;
		registry_mark_gone(w->reg, g, g->source.files[i].path, e);
		return;
	}
}

static void arm(struct watch *w);

/* Loop thread: a poll ended. */
static void
poll_after(struct workq_job *work, int status)
{
	struct poll_job *j = work->arg;
	struct watch *w = j->w;
	struct generation *checked = j->checked;
	struct polled *p;
	struct model_entry *m;

	w->jobs--;
	if (w->stopping) {
		job_free(j);
		if (checked != NULL) {
			checked->served_checks--;
			registry_collect(w->reg); /* frees it if nothing else holds it */
		}
		watch_free_if_idle(w);
		return;
	}
	if ((p = find_polled(w, j->name, j->entry_id)) != NULL)
		p->busy = 0;
	m = registry_find(w->reg, j->name);
	if (m != NULL && m->entry_id == j->entry_id && status == 0) {
		m->polls++;
		m->poll_seconds += j->seconds;
	}
	if (p != NULL && status == 0 && m != NULL && m->entry_id == j->entry_id &&
		m->pending == NULL && m->loading == 0 && !unsure(p, m, j)) {
		if (m->current != NULL && m->current->number == j->generation)
			judge(w, p, m, m->current, j);
		else if (m->current == NULL && j->generation == 0)
			judge_failed(w, p, m, j);
		/* Looked up again: judge may have asked for a reload, and
		 * collected generations. */
		m = registry_find(w->reg, j->name);
		/* Only once the replacement failed to load: before, the reload
		 * the change asked may still come (a change waits for a second
		 * poll to agree), and the line would say it failed. */
		if (checked != NULL && m != NULL && m->entry_id == j->entry_id &&
			m->current == checked && m->pending == NULL && m->loading == 0 &&
			m->load_errors > checked->replaced_at_errors)
			check_served(w, checked, j);
	}
	job_free(j);
	if (checked != NULL) {
		checked->served_checks--;
		registry_collect(w->reg); /* frees it if nothing else holds it */
	}
	arm(w);
}

/* Should a poll of m fstat the served descriptors of its current
 * generation g (check_served)? When g is served where it lies on a remote
 * filesystem, another host replaced its files, and new attaches still get
 * it. */
static int
wants_check(const struct generation *g)
{
	return g != NULL && g->source_replaced && g->origin == NULL && g->fs.remote &&
		g->served_fds != NULL && g->source.nfiles > 0 && gen_attachable(g);
}

/* Queues a poll of m's paths (and the check of its current generation's
 * served descriptors, when wants_check); 0 or -errno. */
static int
start_poll(struct watch *w, struct polled *p, const struct model_entry *m)
{
	struct generation *g = m->current; /* NULL: the last load failed */
	struct poll_job *j = calloc(1, sizeof(*j));
	size_t n = 1 + (g != NULL ? nfiles(g) : 0);
	uint64_t fs;
	char what[sizeof(j->job.what)];
	const char *path;
	const struct stat *st;
	int r;

	if (j == NULL || (j->name = strdup(m->name)) == NULL ||
		(j->paths = calloc(n, sizeof(*j->paths))) == NULL ||
		(j->st = calloc(n, sizeof(*j->st))) == NULL ||
		(j->err = calloc(n, sizeof(*j->err))) == NULL) {
		if (j != NULL)
			job_free(j);
		return -ENOMEM;
	}
	j->npaths = n;
	if ((j->paths[0] = strdup(m->path)) == NULL) {
		job_free(j);
		return -ENOMEM;
	}
	for (size_t i = 1; i < n; i++) {
		file_of(g, i - 1, &path, &st);
		if ((j->paths[i] = strdup(path)) == NULL) {
			job_free(j);
			return -ENOMEM;
		}
	}
	if (wants_check(g)) {
		if ((j->fds = calloc(g->source.nfiles, sizeof(*j->fds))) == NULL ||
			(j->fd_err = calloc(g->source.nfiles, sizeof(*j->fd_err))) == NULL) {
			job_free(j);
			return -ENOMEM;
		}
		for (size_t i = 0; i < g->source.nfiles; i++)
			j->fds[i] = g->served_fds[i];
		j->nfds = g->source.nfiles;
		j->checked = g;
	}
	j->w = w;
	j->entry_id = m->entry_id;
	j->generation = g != NULL ? g->number : 0;
	j->job.arg = j;
	if (g != NULL) {
		fs = gen_origin_fs(g);
		snprintf(what, sizeof(what), "model \"%s\": a poll of its paths on %s", m->name,
			g->fs.name);
	} else if (m->failed_path.known) {
		fs = workq_fs(m->failed_path.fs.remote, m->failed_path.dev);
		snprintf(what, sizeof(what), "model \"%s\": a poll of its path on %s", m->name,
			m->failed_path.fs.name);
	} else {
		fs = WORKQ_UNKNOWN;
		snprintf(what, sizeof(what), "model \"%s\": a poll of its path", m->name);
	}
	if (j->checked != NULL)
		j->checked->served_checks++; /* held open until poll_after */
	if ((r = workq_submit(&w->reg->workq, &j->job, fs, what, poll_work, poll_after)) < 0) {
		if (j->checked != NULL)
			j->checked->served_checks--;
		job_free(j);
		return r;
	}
	w->jobs++;
	p->busy = 1;
	return 0;
}

static void
on_poll_timer(uv_timer_t *t)
{
	struct watch *w = t->data;
	uint64_t now = uv_now(w->loop);

	for (size_t i = 0; i < w->npolled; i++) {
		struct polled *p = &w->polled[i];
		struct model_entry *m = registry_find(w->reg, p->name);
		int r;

		if (p->busy || now < p->due_ms)
			continue;
		p->due_ms = now + (m != NULL ? m->poll_interval_ms : 1000);
		/* Nothing served yet, and no failed load to compare with: a
		 * load comes first. */
		if (m == NULL || (m->current == NULL && m->error == NULL))
			continue;
		/* A load running now reads the paths itself. */
		if (m->pending != NULL || m->loading > 0)
			continue;
		if ((r = start_poll(w, p, m)) < 0)
			log_warnx("model \"%s\": cannot poll its files: %s", m->name, strerror(-r));
	}
	arm(w);
}

/* Runs the timer until the next poll that is due, if any. */
static void
arm(struct watch *w)
{
	uint64_t now = uv_now(w->loop), next = UINT64_MAX;

	if (w->stopping)
		return;
	for (size_t i = 0; i < w->npolled; i++)
		if (!w->polled[i].busy && w->polled[i].due_ms < next)
			next = w->polled[i].due_ms;
	if (next == UINT64_MAX) {
		uv_timer_stop(&w->poll_timer);
		return;
	}
	uv_timer_start(&w->poll_timer, on_poll_timer, next > now ? next - now : 0, 0);
}

/* Says once per generation how its updates are seen, when that is not
 * inotify alone on a local filesystem. */
static void
note_storage(struct model_entry *m, struct generation *g, int polls)
{
	if (g == NULL || g->storage_noted)
		return;
	g->storage_noted = 1;
	if (polls && g->fs.remote)
		log_info("model \"%s\": generation %" PRIu64 " is on %s, a network or FUSE "
			 "filesystem: changes made on other hosts are seen by polling its paths "
			 "every %u.%03u s", m->name, g->number, g->fs.name,
			m->poll_interval_ms / 1000, m->poll_interval_ms % 1000);
	else if (polls)
		log_debug("model \"%s\": polling its paths every %u.%03u s (%s)", m->name,
			m->poll_interval_ms / 1000, m->poll_interval_ms % 1000,
			m->watch == FS_WATCH_POLL ? "watch = poll" : "inotify failed");
	else if (g->fs.remote)
		log_warnx("model \"%s\": generation %" PRIu64 " is on %s, a network or FUSE "
			  "filesystem, and watch = inotify: changes made on other hosts are not "
			  "seen (use watch = auto, or reload it by hand)", m->name, g->number,
			g->fs.name);
}

void
watch_poll_sync(struct watch *w)
{
	size_t kept = 0;
	uint64_t now = uv_now(w->loop);

	/* Drop the models no longer polled (a poll still running finds
	 * nothing when it ends). */
	for (size_t i = 0; i < w->npolled; i++) {
		struct polled *p = &w->polled[i];
		struct model_entry *m = registry_find(w->reg, p->name);

		if (m != NULL && m->entry_id == p->entry_id && strcmp(m->name, p->name) == 0 &&
			registry_polls(w->reg, m)) {
			w->polled[kept++] = *p;
			continue;
		}
		free(p->name);
	}
	w->npolled = kept;
	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		struct polled *p, *grown;
		int polled = registry_polls(w->reg, m);

		note_storage(m, m->current, polled);
		if (polled && (p = find_polled(w, m->name, m->entry_id)) != NULL) {
			/* A reload that shortened poll_interval: not the old wait. */
			if (!p->busy && p->due_ms > now + m->poll_interval_ms)
				p->due_ms = now + m->poll_interval_ms;
			continue;
		}
		if (!polled)
			continue;
		if ((grown = realloc(w->polled, (w->npolled + 1) * sizeof(*grown))) == NULL)
			continue;
		w->polled = grown;
		p = &w->polled[w->npolled];
		memset(p, 0, sizeof(*p));
		if ((p->name = strdup(m->name)) == NULL)
			continue;
		p->entry_id = m->entry_id;
		p->due_ms = now + m->poll_interval_ms;
		w->npolled++;
	}
	arm(w);
}

void
watch_poll_free(struct watch *w)
{
	for (size_t i = 0; i < w->npolled; i++)
		free(w->polled[i].name);
	free(w->polled);
	w->polled = NULL;
	w->npolled = 0;
}
