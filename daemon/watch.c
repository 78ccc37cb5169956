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
#include "watch_internal.h"

#define WATCH_MASK                                                                            \
	(IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE |  \
		IN_DELETE | IN_ONLYDIR)
#define NAME_EVENTS (IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_CLOSE_WRITE)

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

static void
add_dir(struct watch *w, const char *path)
{
	struct watched_dir *d = find_dir(w, path), *dirs;
	int wd;

	if (d != NULL)
		return;
	if ((wd = inotify_add_watch(w->fd, path, WATCH_MASK)) == -1) {
		log_warn("cannot watch %s for model updates", path);
		return;
	}
	if ((dirs = realloc(w->dirs, (w->ndirs + 1) * sizeof(*dirs))) == NULL) {
		inotify_rm_watch(w->fd, wd);
		return;
	}
	w->dirs = dirs;
	w->dirs[w->ndirs].wd = wd;
	if ((w->dirs[w->ndirs].path = strdup(path)) == NULL) {
		inotify_rm_watch(w->fd, wd);
		return;
	}
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


/*
 * Does a path of g now name another file than g opened (renamed over, or
 * gone)? A rename between a load's open (or a restore's stat) and the
 * arming of its directory's watch made no event this process saw.
 */
static int
paths_replaced(const struct generation *g)
{
	struct stat st;

	/* A staged generation's files are copies: what matters is where they
	 * came from. */
	for (size_t i = 0; i < g->norigin; i++) {
		const struct gen_origin *o = &g->origin[i];

		if (stat(o->path, &st) == -1 || st.st_dev != o->st.st_dev ||
			st.st_ino != o->st.st_ino)
			return 1;
	}
	for (size_t i = 0; g->origin == NULL && i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (stat(f->path, &st) == -1 || st.st_dev != f->st.st_dev ||
			st.st_ino != f->st.st_ino)
			return 1;
	}
	return 0;
}

/* Once per generation, after its model's directories are watched: reload
 * the model if one of its paths was replaced before that. */
static void
check_paths_once(struct watch *w, struct model_entry *m, struct generation *g)
{
	if (g == NULL || g->watched)
		return;
	g->watched = 1;
	if (paths_replaced(g)) {
		log_info("model \"%s\": generation %" PRIu64 ": a file was replaced before "
			 "its directory was watched", m->name, g->number);
		watch_mark_dirty(w, m->name);
	}
}

void
watch_sync(struct watch *w)
{
	struct stat st;
	size_t i, kept = 0;

	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		char *d = dir_of(m->path);

		if (d != NULL)
			add_dir(w, d);
		free(d);
		if (stat(m->path, &st) == 0 && S_ISDIR(st.st_mode))
			add_dir(w, m->path);
	}
	/* Drop directories no model uses any more; the others keep their order. */
	for (i = 0; i < w->ndirs; i++) {
		int used = 0;

		for (struct model_entry *m = w->reg->models; m != NULL && !used; m = m->next)
			used = model_uses_dir(m, w->dirs[i].path);
		if (used) {
			w->dirs[kept++] = w->dirs[i];
			continue;
		}
		inotify_rm_watch(w->fd, w->dirs[i].wd);
		free(w->dirs[i].path);
	}
	w->ndirs = kept;
	/* Every directory is watched from here: compare what was opened
	 * before with what the paths name now. */
	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		check_paths_once(w, m, m->current);
		check_paths_once(w, m, m->pending);
	}
	watch_poll_sync(w);
}

static int
same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/*
 * Was the file whose fstat at open was then written in place, as now shows?
 * Its size or mtime moved; or its ctime moved while its link count did not.
 * A writer can put the mtime back (utimensat) but never the ctime, which
 * every write and every utimensat sets to the present. A rename over the
 * model's path changes the replaced inode's ctime too, but also drops its
 * link count: that is a replacement, seen by the directory watch, not a
 * change in place. chmod, chown and a rename of the file itself also move
 * the ctime alone: they count as changes in place (README, "Updating a
 * model": replace files by rename, do not change them).
 */
static int
changed_in_place(const struct stat *then, const struct stat *now)
{
	return now->st_size != then->st_size || !same_time(&now->st_mtim, &then->st_mtim) ||
		(now->st_nlink == then->st_nlink && !same_time(&now->st_ctim, &then->st_ctim));
}

/* Compares each file of g with its fstat at open; marks g modified. */
static void
check_generation(struct registry *r, struct generation *g)
{
	struct stat st;

	if (g == NULL || g->state == GEN_MODIFIED)
		return;
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (fstat(f->fd, &st) == -1)
			continue;
		if (changed_in_place(&f->st, &st)) {
			registry_mark_modified(r, g, f->path);
			return;
		}
	}
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

static void
reload_done(int status, const char *message, uint64_t generation, void *arg)
{
	(void)status;
	(void)message;
	(void)generation;
	(void)arg;
}

static void
on_settle(uv_timer_t *t)
{
	struct watch *w = t->data;

	for (size_t i = 0; i < w->ndirty; i++) {
		if (registry_find(w->reg, w->dirty[i]) != NULL) {
			log_info("model \"%s\": files changed on disk, reloading", w->dirty[i]);
			if (registry_reload(w->reg, w->dirty[i], reload_done, NULL) < 0)
				log_warnx("%s", error_get());
		}
		free(w->dirty[i]);
	}
	w->ndirty = 0;
}

void
watch_mark_dirty(struct watch *w, const char *name)
{
	char **dirty;

	for (size_t i = 0; i < w->ndirty; i++)
		if (strcmp(w->dirty[i], name) == 0)
			goto restart;
	if ((dirty = realloc(w->dirty, (w->ndirty + 1) * sizeof(*dirty))) == NULL)
		return;
	w->dirty = dirty;
	if ((w->dirty[w->ndirty] = strdup(name)) == NULL)
		return;
	w->ndirty++;
restart:
	uv_timer_start(&w->settle, on_settle, WATCH_SETTLE_MS, 0);
}

static void
handle_event(struct watch *w, const struct inotify_event *ev)
{
	const char *dir = NULL;

	if (ev->mask & IN_Q_OVERFLOW) {
		/* Events were lost: look at everything. */
		watch_check_modified(w);
		for (struct model_entry *m = w->reg->models; m != NULL; m = m->next)
			watch_mark_dirty(w, m->name);
		return;
	}
	for (size_t i = 0; i < w->ndirs; i++)
		if (w->dirs[i].wd == ev->wd)
			dir = w->dirs[i].path;
	if (dir == NULL || ev->len == 0)
		return;
	for (struct model_entry *m = w->reg->models; m != NULL; m = m->next) {
		if (!model_uses_dir(m, dir) || !names_model_file(m, dir, ev->name))
			continue;
		check_generation(w->reg, m->current);
		check_generation(w->reg, m->pending);
		if (ev->mask & NAME_EVENTS)
			watch_mark_dirty(w, m->name);
	}
	registry_collect(w->reg);
}

static void
on_readable(uv_poll_t *p, int status, int events)
{
	struct watch *w = p->data;
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n;

	(void)events;
	if (status < 0)
		return;
	while ((n = read(w->fd, buf, sizeof(buf))) > 0) {
		for (char *q = buf; q < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)q;

			handle_event(w, ev);
			q += sizeof(*ev) + ev->len;
		}
	}
}

int
watch_start(uv_loop_t *loop, struct registry *r, struct watch **out)
{
	struct watch *w = calloc(1, sizeof(*w));
	int err;

	if (w == NULL)
		return error_set(-ENOMEM, "watch: out of memory");
	w->reg = r;
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
	w->loop = loop;
	w->poll.data = w->settle.data = w->poll_timer.data = w;
	w->handles = 3;
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
		free(w->dirty[i]);
	free(w->dirty);
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
	uv_close((uv_handle_t *)&w->poll, on_closed);
	uv_close((uv_handle_t *)&w->settle, on_closed);
	uv_close((uv_handle_t *)&w->poll_timer, on_closed);
}
