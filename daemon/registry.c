/*
 * registry.c: models and generations (see registry.h).
 *
 * Loading a model opens and validates its files with the client library's
 * readers, copies the compiled index into a sealed memfd (the one thing every
 * worker maps to find tensors without parsing), pins what the model's pin
 * mode asks for, and hands each file to the warm pool. A generation is freed
 * by whoever drops the last of its three kinds of reference: being current,
 * a client attach, a warming job.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "registry.h"

static const char *const state_names[] = {
	[GEN_WARMING] = "warming",
	[GEN_READY] = "ready",
	[GEN_MODIFIED] = "modified",
	[GEN_FAILED] = "failed",
};

const char *
gen_state_name(enum gen_state s)
{
	return state_names[s];
}

void
registry_init(struct registry *r, struct warm_pool *pool)
{
	memset(r, 0, sizeof(*r));
	r->pool = pool;
}

struct model_entry *
registry_find(struct registry *r, const char *name)
{
	struct model_entry *m;

	for (m = r->models; m != NULL; m = m->next)
		if (strcmp(m->name, name) == 0)
			return m;
	for (m = r->models; m != NULL; m = m->next)
		if (strcmp(m->path, name) == 0)
			return m;
	return NULL;
}

static int
is_current(const struct generation *g)
{
	return g->model != NULL && g->model->current == g;
}

/* Frees g if nothing refers to it any more. */
static void
gen_maybe_free(struct registry *r, struct generation *g)
{
	struct generation **pp;

	if (is_current(g) || g->attached > 0 || g->warm_pending > 0)
		return;
	for (pp = &r->generations; *pp != NULL; pp = &(*pp)->next)
		if (*pp == g) {
			*pp = g->next;
			break;
		}
	log_info("model \"%s\": generation %" PRIu64 " closed", g->model_name, g->number);
	if (g->index != NULL)
		munmap((void *)g->index, g->index_size);
	if (g->index_fd >= 0)
		close(g->index_fd);
	source_close(&g->source);
	free(g->jobs);
	free(g->model_name);
	free(g);
}

void
generation_ref(struct generation *g)
{
	g->attached++;
}

void
generation_unref(struct registry *r, struct generation *g)
{
	g->attached--;
	gen_maybe_free(r, g);
}

/* Copies the compiled index into a sealed memfd and maps it read-only. */
static int
seal_index(struct generation *g, const char *name)
{
	const uint8_t *p = g->source.index;
	size_t left = g->source.index_len;
	void *map;
	int fd;

	fd = memfd_create("wcache-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd == -1)
		return error_set(-errno, "model \"%s\": memfd_create: %s", name, strerror(errno));
	while (left > 0) {
		ssize_t n = write(fd, p, left);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;

			close(fd);
			return error_set(-e, "model \"%s\": writing index: %s", name, strerror(e));
		}
		p += n;
		left -= (size_t)n;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ==
		-1) {
		int e = errno;

		close(fd);
		return error_set(-e, "model \"%s\": sealing index: %s", name, strerror(e));
	}
	map = mmap(NULL, g->source.index_len, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		int e = errno;

		close(fd);
		return error_set(-e, "model \"%s\": mapping index: %s", name, strerror(e));
	}
	g->index_fd = fd;
	g->index = map;
	g->index_size = g->source.index_len;
	free(g->source.index);
	g->source.index = NULL;
	return 0;
}

/* Logs a refused mlock with the advice that fixes it. */
static void
pin_failed(const char *name, const char *what, size_t bytes, int err)
{
	log_warnx("model \"%s\": cannot lock %s (%zu bytes) in memory: %s; raise "
		  "RLIMIT_MEMLOCK (LimitMEMLOCK= in wcached.service, or ulimit -l)",
		name, what, bytes, strerror(-err));
}

/*
 * Locks the index and each file's headers (everything before its first
 * tensor's data), which every attach and lookup touches.
 */
static void
pin_metadata(struct generation *g)
{
	struct index_header h;
	struct index_tensor t;
	uint64_t *first;
	int err;

	if ((err = warm_pin_range(g->index, g->index_size)) < 0) {
		pin_failed(g->model_name, "the index", g->index_size, err);
		return;
	}
	if (index_open(g->index, g->index_size, &h) < 0 ||
		(first = calloc(g->source.nfiles, sizeof(*first))) == NULL)
		return;
	for (size_t i = 0; i < g->source.nfiles; i++)
		first[i] = g->source.files[i].size;
	for (uint64_t i = 0; i < h.tensor_count; i++)
		if (index_tensor_at(g->index, &h, i, &t) == 0 && t.file < g->source.nfiles &&
			t.offset < first[t.file])
			first[t.file] = t.offset;
	for (size_t i = 0; i < g->source.nfiles; i++) {
		if (first[i] == 0 || g->source.files[i].base == NULL)
			continue;
		if ((err = warm_pin_range(g->source.files[i].base, (size_t)first[i])) < 0) {
			pin_failed(g->model_name, "file headers", (size_t)first[i], err);
			break;
		}
	}
	free(first);
	g->pinned = PIN_METADATA;
}

/* Locks every page of every file (pin = all), after warming. */
static void
pin_all(struct generation *g)
{
	int err;

	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (f->base == NULL)
			continue;
		if ((err = warm_pin_range(f->base, (size_t)f->size)) < 0) {
			pin_failed(g->model_name, f->path, (size_t)f->size, err);
			return;
		}
	}
	g->pinned = PIN_ALL;
}

/* Warming job of one file finished (loop thread). */
static void
warm_done(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	struct generation *g = cookie;
	struct registry *r = g->registry;

	for (size_t i = 0; i < g->source.nfiles; i++)
		if (g->jobs[i] == job)
			g->jobs[i] = NULL;
	g->warm_bytes += res->bytes;
	if (res->seconds > g->warm_seconds)
		g->warm_seconds = res->seconds;
	if (res->status < 0 && res->status != -ECANCELED && g->warm_error == 0)
		g->warm_error = res->status;
	if (--g->warm_pending == 0 && g->state == GEN_WARMING) {
		if (g->warm_error == -ENODATA) {
			g->state = GEN_MODIFIED;
			log_errorx("model \"%s\": generation %" PRIu64 " is shorter than when it "
				   "was opened: a file was modified in place; replace model files "
				   "with rename(2)", g->model_name, g->number);
		} else if (g->warm_error < 0) {
			g->state = GEN_FAILED;
			log_errorx("model \"%s\": warming generation %" PRIu64 " failed: %s",
				g->model_name, g->number, strerror(-g->warm_error));
		} else {
			g->state = GEN_READY;
			log_info("model \"%s\": generation %" PRIu64 " warm: %" PRIu64
				 " bytes in %.2f s (%.0f MB/s)", g->model_name, g->number,
				g->warm_bytes, g->warm_seconds,
				g->warm_seconds > 0 ? g->warm_bytes / g->warm_seconds / 1e6 : 0.0);
			if (g->model != NULL && g->model->pin == PIN_ALL && is_current(g))
				pin_all(g);
		}
	}
	if (r->changed != NULL)
		r->changed(r);
	gen_maybe_free(r, g);
}

/* Starts warming every file of g on the pool. */
static void
start_warming(struct registry *r, struct generation *g)
{
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];
		struct warm_request req = {
			.fd = f->fd, .offset = 0, .length = f->size, .base = f->base,
			.cookie = g, .done = warm_done,
		};
		int err;

		if (f->size == 0)
			continue;
		if ((err = warm_submit(r->pool, &req, &g->jobs[i])) < 0) {
			log_warnx("model \"%s\": cannot warm %s: %s", g->model_name, f->path,
				strerror(-err));
			continue;
		}
		g->warm_pending++;
	}
	if (g->warm_pending == 0)
		g->state = GEN_READY;
}

/* Finds or adds the model entry for name. */
static struct model_entry *
entry_for(struct registry *r, const char *name, const char *path)
{
	struct model_entry *m;
	char *p;

	for (m = r->models; m != NULL; m = m->next)
		if (strcmp(m->name, name) == 0)
			break;
	if ((p = strdup(path)) == NULL)
		return NULL;
	if (m == NULL) {
		if ((m = calloc(1, sizeof(*m))) == NULL || (m->name = strdup(name)) == NULL) {
			free(m);
			free(p);
			return NULL;
		}
		m->next = r->models;
		r->models = m;
	}
	free(m->path);
	m->path = p;
	return m;
}

int
registry_load(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm)
{
	struct model_entry *m;
	struct generation *g, *old;
	int err;

	if ((m = entry_for(r, name, path)) == NULL)
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	m->pin = pin;
	m->warm = warm;
	free(m->error);
	m->error = NULL;

	if ((g = calloc(1, sizeof(*g))) == NULL || (g->model_name = strdup(name)) == NULL) {
		free(g);
		err = error_set(-ENOMEM, "model \"%s\": out of memory", name);
		goto fail;
	}
	g->index_fd = -1;
	g->registry = r;
	if ((err = source_open(path, &g->source)) < 0 || (err = seal_index(g, name)) < 0 ||
		(g->jobs = calloc(g->source.nfiles, sizeof(*g->jobs))) == NULL) {
		if (err == 0)
			err = error_set(-ENOMEM, "model \"%s\": out of memory", name);
		if (g->index_fd >= 0) {
			munmap((void *)g->index, g->index_size);
			close(g->index_fd);
		}
		source_close(&g->source);
		free(g->model_name);
		free(g);
		goto fail;
	}
	for (size_t i = 0; i < g->source.nfiles; i++)
		g->bytes += g->source.files[i].size;
	g->number = ++m->last_generation;
	g->model = m;
	g->state = GEN_WARMING;
	g->next = r->generations;
	r->generations = g;

	old = m->current;
	m->current = g;
	if (old != NULL)
		gen_maybe_free(r, old);
	if (pin != PIN_NONE)
		pin_metadata(g);
	if (warm && r->pool != NULL)
		start_warming(r, g);
	else
		g->state = GEN_READY;
	if (g->state == GEN_READY && pin == PIN_ALL)
		pin_all(g);
	log_info("model \"%s\": generation %" PRIu64 " from %s: %zu file%s, %" PRIu64
		 " bytes%s", name, g->number, path, g->source.nfiles,
		g->source.nfiles == 1 ? "" : "s", g->bytes,
		g->state == GEN_WARMING ? ", warming" : "");
	return 0;
fail:
	m->error = strdup(error_get());
	return err;
}

/* Removes the entry from the list and frees it; its generations live on
 * (detached) until released. */
static void
entry_free(struct registry *r, struct model_entry *m)
{
	struct model_entry **pp;
	struct generation *cur = m->current;

	for (pp = &r->models; *pp != NULL; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m)
			g->model = NULL;
	m->current = NULL;
	free(m->name);
	free(m->path);
	free(m->error);
	free(m);
	if (cur != NULL) {
		/* Warming an unloaded model is wasted work. */
		for (size_t i = 0; i < cur->source.nfiles; i++)
			if (cur->jobs[i] != NULL)
				warm_cancel(r->pool, cur->jobs[i]);
		gen_maybe_free(r, cur);
	}
}

int
registry_unload(struct registry *r, const char *name)
{
	struct model_entry *m;

	for (m = r->models; m != NULL; m = m->next)
		if (strcmp(m->name, name) == 0)
			break;
	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	log_info("model \"%s\": unloaded", name);
	entry_free(r, m);
	return 0;
}

void
registry_close(struct registry *r)
{
	while (r->models != NULL)
		entry_free(r, r->models);
	/* Anything left is held by clients that are gone by now, or by warming
	 * jobs the pool has already delivered at shutdown. */
	while (r->generations != NULL) {
		struct generation *g = r->generations;

		g->attached = 0;
		g->warm_pending = 0;
		gen_maybe_free(r, g);
	}
}

void
registry_progress(const struct registry *r, uint64_t *done, uint64_t *total, unsigned *warming,
	unsigned *models)
{
	*done = *total = 0;
	*warming = *models = 0;
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		const struct generation *g = m->current;

		if (g == NULL)
			continue;
		(*models)++;
		*total += g->bytes;
		if (g->state != GEN_WARMING) {
			*done += g->bytes;
			continue;
		}
		(*warming)++;
		*done += g->warm_bytes;
		for (size_t i = 0; i < g->source.nfiles; i++)
			if (g->jobs[i] != NULL)
				*done += warm_job_bytes(g->jobs[i]);
	}
}
