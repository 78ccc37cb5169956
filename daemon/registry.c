/*
 * registry.c: models and generations (see registry.h).
 *
 * Loading a model opens and validates its files with the client library's
 * readers and copies the compiled index into a sealed memfd (the one thing
 * every worker maps to find tensors without parsing), on libuv's work queue.
 * Back on the loop the generation is installed: pinned as its model asks,
 * handed to the warm pool, and made current at once (a first generation) or
 * when warm (a replacement). A generation is freed by whoever drops the last
 * of its references: being current or pending, a client attach, a warming
 * job.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "registry.h"

#define STATUS_MAGIC 0x54534357u /* "WCST": slot 0 of the status page */

struct load_request {
	uv_work_t work;
	struct registry *r;
	char *name;
	char *path;
	enum pin_mode pin;
	int warm;
	int reload;           /* discard when the files are unchanged */
	uint64_t id;
	uint64_t entry_id;    /* the model entry it was queued for */
	struct model_source source;
	int index_fd;
	const uint8_t *index;
	size_t index_size;
	int status;
	char message[1024];
	registry_done_fn done;
	void *arg;
};

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

const char *
pin_mode_name(enum pin_mode p)
{
	return p == PIN_ALL ? "all" : p == PIN_NONE ? "none" : "metadata";
}

static uint64_t
now_ms(const struct registry *r)
{
	return uv_now(r->loop);
}

/* ---- the status page ---- */

/*
 * Creates the status page: a memfd the daemon maps read-write and sealed so
 * it can never shrink (no SIGBUS in workers) nor be mapped writable again
 * (F_SEAL_FUTURE_WRITE); workers get a read-only reopen of it.
 */
static int
status_page_init(struct registry *r)
{
	char proc[64];
	void *map;
	int fd;

	fd = memfd_create("wcache-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd == -1)
		return error_set(-errno, "status page: memfd_create: %s", strerror(errno));
	if (ftruncate(fd, STATUS_PAGE_BYTES) == -1 ||
		(map = mmap(NULL, STATUS_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
			MAP_FAILED) {
		int e = errno;

		close(fd);
		return error_set(-e, "status page: %s", strerror(e));
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) ==
		-1) {
		int e = errno;

		munmap(map, STATUS_PAGE_BYTES);
		close(fd);
		return error_set(-e, "status page: sealing: %s", strerror(e));
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if ((r->status_ro_fd = open(proc, O_RDONLY | O_CLOEXEC)) == -1) {
		int e = errno;

		munmap(map, STATUS_PAGE_BYTES);
		close(fd);
		return error_set(-e, "status page: reopening read-only: %s", strerror(e));
	}
	r->status_fd = fd;
	r->status = map;
	__atomic_store_n(&r->status[0], STATUS_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

/* The slot of name: the one it had before, or a new one. 0 when full (the
 * model is served, only its stale checks never fire). */
static unsigned
slot_for(struct registry *r, const char *name)
{
	struct status_slot *slots;

	for (unsigned i = 1; i < r->nslots; i++)
		if (strcmp(r->slots[i].name, name) == 0)
			return i;
	if (r->nslots == 0)
		r->nslots = 1; /* slot 0 holds the magic */
	if (r->nslots >= STATUS_SLOTS)
		return 0;
	if ((slots = realloc(r->slots, (r->nslots + 1) * sizeof(*slots))) == NULL)
		return 0;
	r->slots = slots;
	slots[r->nslots].last_generation = 0;
	if ((slots[r->nslots].name = strdup(name)) == NULL)
		return 0;
	return r->nslots++;
}

/* Publishes the model's current generation to workers and the server. */
static void
publish(struct registry *r, struct model_entry *m, uint64_t generation)
{
	if (m->slot != 0)
		__atomic_store_n(&r->status[m->slot], generation, __ATOMIC_RELEASE);
	if (r->swapped != NULL)
		r->swapped(r, m, generation);
}

/* ---- generations ---- */

int
registry_init(struct registry *r, uv_loop_t *loop, struct warm_pool *pool)
{
	memset(r, 0, sizeof(*r));
	r->loop = loop;
	r->pool = pool;
	r->status_fd = r->status_ro_fd = -1;
	return status_page_init(r);
}

/* Exact name lookup. */
static struct model_entry *
entry_named(struct registry *r, const char *name)
{
	for (struct model_entry *m = r->models; m != NULL; m = m->next)
		if (strcmp(m->name, name) == 0)
			return m;
	return NULL;
}

struct model_entry *
registry_find(struct registry *r, const char *name)
{
	struct model_entry *m = entry_named(r, name);

	if (m != NULL)
		return m;
	for (m = r->models; m != NULL; m = m->next)
		if (strcmp(m->path, name) == 0)
			return m;
	return NULL;
}

static int
is_live(const struct generation *g)
{
	return g->model != NULL && (g->model->current == g || g->model->pending == g);
}

/* Frees g if nothing refers to it any more. */
static void
gen_maybe_free(struct registry *r, struct generation *g)
{
	struct generation **pp;

	if (is_live(g) || g->attached > 0 || g->warm_pending > 0 || g->ops_pending > 0)
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

uint64_t
generation_resident(const struct generation *g)
{
	uint64_t total = 0, n;

	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];
		uint64_t evicted;

		/* cachestat(2) asks the page cache directly; mincore on our
		 * mapping is the fallback before Linux 6.5. */
		if (warm_cached_bytes(f->fd, 0, f->size, &n, &evicted) == 0 ||
			(f->base != NULL && warm_resident_bytes(f->base, (size_t)f->size, &n) == 0))
			total += n;
	}
	return total;
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

/*
 * Work on a generation's pages that takes time proportional to its size
 * (mlock reads every page not yet resident; munlock and fadvise walk them
 * all) runs on libuv's work queue, never on the loop. The generation
 * stays open while it runs (ops_pending).
 */
enum page_op { PAGE_PIN, PAGE_UNPIN, PAGE_EVICT };

struct page_work {
	uv_work_t work;
	struct generation *g;
	enum page_op op;
	int err;               /* the first failure */
	size_t failed;         /* the file it failed on */
	struct page_work *next; /* queued behind the running one */
};

#define EVICT_CHUNK (2u << 20)

/*
 * Drops this process's own page-table entries for a file mapping, so that
 * POSIX_FADV_DONTNEED can drop the pages (it keeps mapped ones): after
 * mlock and munlock every page is mapped here. The mapping is private and
 * read-only, so nothing is lost: a later access faults the page cache in.
 * Locked ranges (pinned headers) refuse MADV_DONTNEED; chunks let the rest
 * go.
 */
static void
unmap_pages(const struct wc_file *f)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	if (f->base == NULL || madvise((void *)f->base, (size_t)f->size, MADV_DONTNEED) == 0)
		return;
	for (uint64_t off = 0; off < f->size; off += EVICT_CHUNK) {
		uint64_t len = f->size - off < EVICT_CHUNK ? f->size - off : EVICT_CHUNK;

		if (madvise((void *)(f->base + off), (size_t)len, MADV_DONTNEED) == 0)
			continue;
		/* The chunk holds locked pages: page by page. */
		for (uint64_t p = off; p < off + len; p += page)
			(void)madvise((void *)(f->base + p), (size_t)page, MADV_DONTNEED);
	}
}

static void
page_work_run(uv_work_t *w)
{
	struct page_work *p = w->data;
	struct generation *g = p->g;

	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (p->op == PAGE_EVICT) {
			unmap_pages(f);
			warm_evict_range(f->fd, 0, 0);
			continue;
		}
		if (f->base == NULL)
			continue;
		if (p->op == PAGE_UNPIN) {
			warm_unpin_range(f->base, (size_t)f->size);
			continue;
		}
		if ((p->err = warm_pin_range(f->base, (size_t)f->size)) < 0) {
			p->failed = i;
			for (size_t j = 0; j < i; j++)
				if (g->source.files[j].base != NULL)
					warm_unpin_range(g->source.files[j].base,
						(size_t)g->source.files[j].size);
			return;
		}
	}
}

static void page_work_after(uv_work_t *w, int status);

/* Starts the first queued page operation of g; -errno if it cannot. */
static int
page_work_start(struct registry *r, struct generation *g)
{
	struct page_work *p = g->page_queue;
	int err;

	if ((err = uv_queue_work(r->loop, &p->work, page_work_run, page_work_after)) < 0) {
		log_warnx("model \"%s\": %s", g->model_name, uv_strerror(err));
		g->page_queue = p->next;
		g->ops_pending--;
		free(p);
	}
	return err;
}

static void
page_work_after(uv_work_t *w, int status)
{
	struct page_work *p = w->data;
	struct generation *g = p->g;
	struct registry *r = g->registry;

	g->page_queue = p->next;
	g->ops_pending--;
	if (status == 0 && p->op == PAGE_PIN) {
		if (p->err < 0)
			pin_failed(g->model_name, g->source.files[p->failed].path,
				(size_t)g->source.files[p->failed].size, p->err);
		else
			g->pinned = PIN_ALL;
	} else if (status == 0 && p->op == PAGE_UNPIN) {
		g->pinned = PIN_NONE;
		/* munlock of the whole files dropped the headers' lock too */
		if (g->model != NULL && g->model->pin != PIN_NONE)
			pin_metadata(g);
	}
	free(p);
	/* One operation at a time per generation, in the order asked: a
	 * pin right after an unpin must not race it on another thread. */
	while (g->page_queue != NULL && page_work_start(r, g) < 0)
		;
	gen_maybe_free(r, g);
}

/* Queues op on g's pages behind any running one; a failure to queue is
 * logged, not fatal. */
static void
queue_pages(struct registry *r, struct generation *g, enum page_op op)
{
	struct page_work *p = calloc(1, sizeof(*p)), **tail;

	if (p == NULL) {
		log_warnx("model \"%s\": out of memory", g->model_name);
		return;
	}
	p->g = g;
	p->op = op;
	p->work.data = p;
	for (tail = &g->page_queue; *tail != NULL; tail = &(*tail)->next)
		;
	*tail = p;
	g->ops_pending++;
	if (g->page_queue == p)
		(void)page_work_start(r, g);
}

/* Makes g (pending, now warm) the model's current generation. */
static void
promote(struct registry *r, struct model_entry *m, struct generation *g)
{
	struct generation *old = m->current;

	m->pending = NULL;
	m->current = g;
	if (old != NULL) {
		m->swap_count++;
		log_info("model \"%s\": generation %" PRIu64 " is current (was %" PRIu64 ")",
			m->name, g->number, old->number);
	}
	if (m->pin == PIN_ALL && g->state == GEN_READY)
		queue_pages(r, g, PAGE_PIN);
	publish(r, m, g->number);
	if (old != NULL)
		gen_maybe_free(r, old);
	registry_enforce_budget(r);
}

/* Warming job of one file finished (loop thread). */
static void
warm_done(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	struct generation *g = cookie;
	struct registry *r = g->registry;
	struct model_entry *m = g->model;

	for (size_t i = 0; i < g->source.nfiles; i++)
		if (g->jobs[i] == job)
			g->jobs[i] = NULL;
	g->warm_bytes += res->bytes;
	if (res->seconds > g->warm_seconds)
		g->warm_seconds = res->seconds;
	if (res->status < 0 && res->status != -ECANCELED && g->warm_error == 0)
		g->warm_error = res->status;
	if (res->status == -ECANCELED)
		g->warm_cancelled = 1;
	if (--g->warm_pending == 0 && g->cold)
		queue_pages(r, g, PAGE_EVICT); /* evicted while it warmed */
	if (g->warm_pending > 0 || g->state != GEN_WARMING) {
		gen_maybe_free(r, g);
		return;
	}
	if (g->warm_error == -ENODATA) {
		registry_mark_modified(r, g, "a file");
	} else if (g->warm_error < 0) {
		g->state = GEN_FAILED;
		log_errorx("model \"%s\": warming generation %" PRIu64 " failed: %s",
			g->model_name, g->number, strerror(-g->warm_error));
	} else if (!g->cold && !g->warm_cancelled) {
		double secs = (double)(now_ms(r) - g->warm_started_ms) / 1000.0;

		g->state = GEN_READY;
		if (m != NULL)
			m->last_warm_seconds = secs;
		log_info("model \"%s\": generation %" PRIu64 " warm: %" PRIu64
			 " bytes in %.3f s (%.0f MB/s)", g->model_name, g->number, g->warm_bytes,
			secs, secs > 0 ? (double)g->warm_bytes / secs / 1e6 : 0.0);
	} else {
		/* Cancelled (evicted, unloaded, superseded, shutdown): serves,
		 * but was not warmed, so no claim is made. */
		g->state = GEN_READY;
	}
	if (m != NULL && m->pending == g && g->state == GEN_READY)
		promote(r, m, g);
	else if (m != NULL && m->current == g && m->pin == PIN_ALL && g->state == GEN_READY)
		queue_pages(r, g, PAGE_PIN);
	if (m != NULL && m->pending == g && g->state != GEN_READY) {
		/* A replacement that cannot be served never becomes current. */
		m->pending = NULL;
		free(m->error);
		m->error = strdup("the new generation failed while warming");
	}
	if (r->changed != NULL)
		r->changed(r);
	gen_maybe_free(r, g);
}

/* Starts warming every file of g on the pool. */
static void
start_warming(struct registry *r, struct generation *g)
{
	g->state = GEN_WARMING;
	g->warm_error = 0;
	g->warm_cancelled = 0;
	g->warm_bytes = 0;
	g->warm_seconds = 0;
	g->warm_started_ms = now_ms(r);
	for (size_t i = 0; r->pool != NULL && i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];
		struct warm_request req = {
			.fd = f->fd, .offset = 0, .length = f->size, .base = f->base,
			.cookie = g, .done = warm_done,
		};
		int err;

		if (f->size == 0 || g->jobs[i] != NULL)
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

static void
cancel_warming(struct registry *r, struct generation *g)
{
	for (size_t i = 0; i < g->source.nfiles; i++)
		if (g->jobs[i] != NULL)
			warm_cancel(r->pool, g->jobs[i]);
}

void
registry_mark_modified(struct registry *r, struct generation *g, const char *file)
{
	if (g->state == GEN_MODIFIED)
		return;
	g->state = GEN_MODIFIED;
	cancel_warming(r, g);
	log_errorx("model \"%s\": %s of generation %" PRIu64 " was modified in place; it is no "
		   "longer attached by new clients. Replace model files with rename(2), then "
		   "`wcachectl reload %s`", g->model_name, file, g->number, g->model_name);
	if (g->model != NULL && g->model->pending == g) {
		/* A replacement written to while it warmed never becomes
		 * current: the current generation keeps serving. */
		struct model_entry *m = g->model;

		m->pending = NULL;
		free(m->error);
		m->error = strdup("the new generation was modified in place while it warmed; "
				  "replace model files with rename(2)");
		/* g may now be unreferenced: the caller frees it with
		 * registry_collect() once it is done with it. */
	}
}

void
registry_collect(struct registry *r)
{
	struct generation *g = r->generations, *next;

	for (; g != NULL; g = next) {
		next = g->next;
		gen_maybe_free(r, g);
	}
}

/* ---- loading ---- */

/* Copies the compiled index into a sealed memfd and maps it read-only. */
static int
seal_index(struct load_request *q)
{
	const uint8_t *p = q->source.index;
	size_t left = q->source.index_len;
	void *map;
	int fd;

	fd = memfd_create("wcache-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd == -1)
		return error_set(-errno, "memfd_create: %s", strerror(errno));
	while (left > 0) {
		ssize_t n = write(fd, p, left);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;

			close(fd);
			return error_set(-e, "writing the index: %s", strerror(e));
		}
		p += n;
		left -= (size_t)n;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ==
		-1) {
		int e = errno;

		close(fd);
		return error_set(-e, "sealing the index: %s", strerror(e));
	}
	map = mmap(NULL, q->source.index_len, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		int e = errno;

		close(fd);
		return error_set(-e, "mapping the index: %s", strerror(e));
	}
	q->index_fd = fd;
	q->index = map;
	q->index_size = q->source.index_len;
	free(q->source.index);
	q->source.index = NULL;
	return 0;
}

/* Work queue thread: open, validate, compile, seal. */
static void
load_work(uv_work_t *w)
{
	struct load_request *q = w->data;

	if ((q->status = source_open(q->path, &q->source)) == 0 && (q->status = seal_index(q)) < 0)
		source_close(&q->source);
	if (q->status < 0)
		snprintf(q->message, sizeof(q->message), "%s", error_get());
}

static void
load_request_free(struct load_request *q)
{
	if (q->index != NULL)
		munmap((void *)q->index, q->index_size);
	if (q->index_fd >= 0)
		close(q->index_fd);
	source_close(&q->source);
	free(q->name);
	free(q->path);
	free(q);
}

/*
 * Same files (the same inodes) as generation g? A reload serves new inodes
 * only: files are replaced by rename(2), and an inode written in place is
 * the modified generation's, not a new one.
 */
static int
same_inodes(const struct generation *g, const struct model_source *s)
{
	if (g == NULL || g->source.nfiles != s->nfiles)
		return 0;
	for (size_t i = 0; i < s->nfiles; i++) {
		const struct stat *a = &g->source.files[i].st, *b = &s->files[i].st;

		if (a->st_dev != b->st_dev || a->st_ino != b->st_ino)
			return 0;
	}
	return 1;
}

/* Loop thread: turns a validated load into a generation of its model. */
static void
install(struct registry *r, struct model_entry *m, struct load_request *q)
{
	struct generation *g = calloc(1, sizeof(*g));
	char msg[256];

	if (g == NULL || (g->model_name = strdup(m->name)) == NULL ||
		(g->jobs = calloc(q->source.nfiles ? q->source.nfiles : 1, sizeof(*g->jobs))) ==
			NULL) {
		if (g != NULL)
			free(g->model_name);
		free(g);
		if (q->done != NULL)
			q->done(-ENOMEM, "out of memory", 0, q->arg);
		return;
	}
	g->registry = r;
	g->source = q->source;
	g->index_fd = q->index_fd;
	g->index = q->index;
	g->index_size = q->index_size;
	memset(&q->source, 0, sizeof(q->source));
	q->index_fd = -1;
	q->index = NULL;
	for (size_t i = 0; i < g->source.nfiles; i++)
		g->bytes += g->source.files[i].size;
	g->number = ++m->last_generation;
	if (m->slot != 0)
		r->slots[m->slot].last_generation = m->last_generation;
	g->model = m;
	g->next = r->generations;
	r->generations = g;

	free(m->path);
	m->path = q->path;
	q->path = NULL;
	m->pin = q->pin;
	m->warm = q->warm;
	free(m->error);
	m->error = NULL;
	if (m->pin != PIN_NONE)
		pin_metadata(g);

	if (m->pending != NULL) {
		/* A newer replacement supersedes one still warming. */
		struct generation *old = m->pending;

		m->pending = NULL;
		cancel_warming(r, old);
		gen_maybe_free(r, old);
	}
	log_info("model \"%s\": generation %" PRIu64 " from %s: %zu file%s, %" PRIu64 " bytes",
		m->name, g->number, m->path, g->source.nfiles, g->source.nfiles == 1 ? "" : "s",
		g->bytes);
	if (m->warm && r->pool != NULL)
		start_warming(r, g);
	else
		g->state = GEN_READY;
	if (m->current == NULL || g->state == GEN_READY) {
		/* A first generation serves at once, warm or not. */
		m->pending = g;
		promote(r, m, g);
	} else {
		m->pending = g;
	}
	snprintf(msg, sizeof(msg), "generation %" PRIu64 " %s", g->number,
		m->current == g ? "is current" : "is warming and becomes current when warm");
	if (q->done != NULL)
		q->done(0, msg, g->number, q->arg);
	if (r->changed != NULL)
		r->changed(r);
}

static void
load_after(uv_work_t *w, int status)
{
	struct load_request *q = w->data;
	struct registry *r = q->r;
	struct model_entry *m = entry_named(r, q->name);

	r->loads_in_flight--;
	if (m != NULL && m->entry_id != q->entry_id)
		m = NULL; /* the model was unloaded and added again meanwhile */
	if (m != NULL && m->loading > 0)
		m->loading--;
	if (status == UV_ECANCELED || r->closing) {
		if (q->done != NULL)
			q->done(-ECANCELED, "cancelled: wcached is stopping", 0, q->arg);
	} else if (m == NULL || m->load_id != q->id) {
		if (q->done != NULL)
			q->done(-ECANCELED, "superseded by a newer load or unload", 0, q->arg);
	} else if (q->status < 0) {
		m->load_errors++;
		free(m->error);
		m->error = strdup(q->message);
		log_errorx("model \"%s\": %s; %s", m->name, q->message,
			m->current != NULL ? "generation still serving" : "not served");
		if (q->done != NULL)
			q->done(q->status, q->message, 0, q->arg);
		if (r->changed != NULL)
			r->changed(r);
	} else if (q->reload && same_inodes(m->pending, &q->source)) {
		if (q->done != NULL)
			q->done(0, "already warming as the next generation", m->pending->number,
				q->arg);
	} else if (q->reload && same_inodes(m->current, &q->source)) {
		if (q->done != NULL && m->current->state == GEN_MODIFIED)
			q->done(-ESTALE, "its files were modified in place; replace them with "
					 "rename(2) and reload again", 0, q->arg);
		else {
			/* The files serving are the configured ones: an error
			 * from an earlier failed load no longer applies. */
			free(m->error);
			m->error = NULL;
			if (q->done != NULL)
				q->done(0, "unchanged", m->current->number, q->arg);
		}
	} else {
		install(r, m, q);
	}
	load_request_free(q);
}

/* Queues a load of path for the model name (entry created if new). */
static int
queue_load(struct registry *r, const char *name, const char *path, enum pin_mode pin, int warm,
	int reload, registry_done_fn done, void *arg)
{
	struct model_entry *m = entry_named(r, name);
	struct load_request *q;
	int err;

	if (r->closing)
		return error_set(-ESHUTDOWN, "wcached is stopping");
	if (m == NULL) {
		if ((m = calloc(1, sizeof(*m))) == NULL || (m->name = strdup(name)) == NULL ||
			(m->path = strdup(path)) == NULL) {
			if (m != NULL)
				free(m->name);
			free(m);
			return error_set(-ENOMEM, "model \"%s\": out of memory", name);
		}
		m->pin = pin;
		m->warm = warm;
		m->entry_id = ++r->next_load_id;
		m->slot = slot_for(r, name);
		if (m->slot != 0)
			m->last_generation = r->slots[m->slot].last_generation;
		m->last_attach_ms = now_ms(r);
		m->next = r->models;
		r->models = m;
	}
	if ((q = calloc(1, sizeof(*q))) == NULL || (q->name = strdup(name)) == NULL ||
		(q->path = strdup(path)) == NULL) {
		if (q != NULL)
			free(q->name);
		free(q);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	q->r = r;
	q->pin = pin;
	q->warm = warm;
	q->reload = reload;
	q->index_fd = -1;
	q->done = done;
	q->arg = arg;
	q->id = ++r->next_load_id;
	q->entry_id = m->entry_id;
	q->work.data = q;
	if ((err = uv_queue_work(r->loop, &q->work, load_work, load_after)) < 0) {
		free(q->name);
		free(q->path);
		free(q);
		return error_set(err, "model \"%s\": %s", name, uv_strerror(err));
	}
	m->load_id = q->id;
	m->loading++;
	r->loads_in_flight++;
	return 0;
}

int
registry_load(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, registry_done_fn done, void *arg)
{
	return queue_load(r, name, path, pin, warm, 0, done, arg);
}

int
registry_reload(struct registry *r, const char *name, registry_done_fn done, void *arg)
{
	struct model_entry *m = entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (m->loading > 0) {
		/* A load already in flight reads the files as they are now, or
		 * is an operator's load of another path that a reload of the
		 * old path must not supersede. */
		if (done != NULL)
			done(0, "a load of this model is already in progress",
				m->current != NULL ? m->current->number : 0, arg);
		return 0;
	}
	return queue_load(r, m->name, m->path, m->pin, m->warm, 1, done, arg);
}

/* ---- attaching, pinning, eviction ---- */

void
generation_ref(struct registry *r, struct generation *g)
{
	g->attached++;
	if (g->model == NULL)
		return;
	g->model->last_attach_ms = now_ms(r);
	if (g->cold && g->model->current == g) {
		/* Attaching a cold model warms it again. */
		g->cold = 0;
		log_info("model \"%s\": attached while cold, warming generation %" PRIu64,
			g->model_name, g->number);
		if (g->model->warm)
			start_warming(r, g);
		registry_enforce_budget(r);
	}
}

void
generation_unref(struct registry *r, struct generation *g)
{
	/* Evicted pages a worker still mapped stayed resident; when the last
	 * holder of a cold generation lets go, drop them. */
	if (--g->attached == 0 && g->cold && is_live(g))
		queue_pages(r, g, PAGE_EVICT);
	gen_maybe_free(r, g);
}

int
registry_pin(struct registry *r, const char *name, enum pin_mode pin)
{
	struct model_entry *m = entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	m->pin = pin;
	if (m->current == NULL)
		return 0;
	/* Locking reads what is not resident: it runs off the loop, and a
	 * lock RLIMIT_MEMLOCK refuses is logged with the advice. A generation
	 * still warming is locked when warm. */
	if (pin == PIN_ALL) {
		m->current->cold = 0;
		if (m->current->state == GEN_READY)
			queue_pages(r, m->current, PAGE_PIN);
		/* A pinned model counts against the budget and is never the
		 * one evicted: others may have to go. */
		registry_enforce_budget(r);
	} else {
		/* Queued behind a lock still running, if any. */
		queue_pages(r, m->current, PAGE_UNPIN);
	}
	return 0;
}

/* Drops the page cache of g's files and marks it cold. */
static void
evict_generation(struct registry *r, struct generation *g)
{
	g->cold = 1;
	cancel_warming(r, g);
	/* A job still reading would leave its last chunk (and readahead)
	 * resident: drop the pages once it has stopped (warm_done). */
	if (g->warm_pending == 0)
		queue_pages(r, g, PAGE_EVICT);
}

int
registry_evict(struct registry *r, const char *name)
{
	struct model_entry *m = entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (m->pin == PIN_ALL)
		return error_set(-EBUSY, "model \"%s\" is pinned; unpin it first", name);
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m)
			evict_generation(r, g);
	log_info("model \"%s\": evicted from the page cache", name);
	return 0;
}

void
registry_enforce_budget(struct registry *r)
{
	uint64_t total = 0;

	if (r->memory_budget == 0)
		return;
	/* The estimate is the size of every warm current or pending
	 * generation: what warming keeps resident. */
	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		if (m->current != NULL && !m->current->cold)
			total += m->current->bytes;
		if (m->pending != NULL)
			total += m->pending->bytes;
	}
	while (total > r->memory_budget) {
		struct model_entry *lru = NULL;

		for (struct model_entry *m = r->models; m != NULL; m = m->next)
			if (m->current != NULL && !m->current->cold && m->pin != PIN_ALL &&
				m->current->attached == 0 &&
				(lru == NULL || m->last_attach_ms < lru->last_attach_ms))
				lru = m;
		if (lru == NULL) {
			/* Everything left is pinned or in use. */
			for (struct model_entry *m = r->models; m != NULL; m = m->next)
				if (m->current != NULL && !m->current->cold && m->pin != PIN_ALL &&
					(lru == NULL || m->last_attach_ms < lru->last_attach_ms))
					lru = m;
		}
		if (lru == NULL)
			break;
		log_info("model \"%s\": evicted to keep within memory_budget (%" PRIu64
			 " MiB of models, budget %" PRIu64 " MiB)", lru->name, total >> 20,
			r->memory_budget >> 20);
		evict_generation(r, lru->current);
		total -= lru->current->bytes;
	}
}

int
registry_set_access(struct registry *r, const char *name, int restricted, const uid_t *uids,
	size_t n_uids, const gid_t *gids, size_t n_gids)
{
	struct model_entry *m = entry_named(r, name);
	uid_t *u = NULL;
	gid_t *g = NULL;

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if ((n_uids > 0 && (u = malloc(n_uids * sizeof(*u))) == NULL) ||
		(n_gids > 0 && (g = malloc(n_gids * sizeof(*g))) == NULL)) {
		free(u);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	if (n_uids > 0)
		memcpy(u, uids, n_uids * sizeof(*u));
	if (n_gids > 0)
		memcpy(g, gids, n_gids * sizeof(*g));
	free(m->allow_uids);
	free(m->allow_gids);
	m->restricted = restricted;
	m->allow_uids = u;
	m->n_allow_uids = n_uids;
	m->allow_gids = g;
	m->n_allow_gids = n_gids;
	return 0;
}

/* ---- unloading and shutdown ---- */

/* Removes the entry and frees it; its generations live on (detached) until
 * released. */
static void
entry_free(struct registry *r, struct model_entry *m)
{
	struct model_entry **pp;
	struct generation *cur = m->current, *pend = m->pending;

	for (pp = &r->models; *pp != NULL; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	publish(r, m, 0);
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m)
			g->model = NULL;
	free(m->name);
	free(m->path);
	free(m->error);
	free(m->allow_uids);
	free(m->allow_gids);
	free(m);
	/* Warming an unloaded model is wasted work. */
	if (cur != NULL) {
		cancel_warming(r, cur);
		gen_maybe_free(r, cur);
	}
	if (pend != NULL) {
		cancel_warming(r, pend);
		gen_maybe_free(r, pend);
	}
}

int
registry_unload(struct registry *r, const char *name)
{
	struct model_entry *m = entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	log_info("model \"%s\": unloaded", name);
	entry_free(r, m);
	if (r->changed != NULL)
		r->changed(r);
	return 0;
}

void
registry_close(struct registry *r)
{
	r->closing = 1;
	r->swapped = NULL;
	r->changed = NULL;
	while (r->models != NULL)
		entry_free(r, r->models);
	/* Clients are gone and the warm pool has delivered every job; page
	 * work still on the work queue frees its generation when it ends. */
	for (struct generation *g = r->generations, *next; g != NULL; g = next) {
		next = g->next;
		g->attached = 0;
		g->warm_pending = 0;
		gen_maybe_free(r, g);
	}
	for (unsigned i = 1; i < r->nslots; i++)
		free(r->slots[i].name);
	free(r->slots);
	r->slots = NULL;
	if (r->status != NULL)
		munmap(r->status, STATUS_PAGE_BYTES);
	if (r->status_fd >= 0)
		close(r->status_fd);
	if (r->status_ro_fd >= 0)
		close(r->status_ro_fd);
	r->status = NULL;
	r->status_fd = r->status_ro_fd = -1;
}

void
registry_progress(const struct registry *r, uint64_t *done, uint64_t *total, unsigned *warming,
	unsigned *models)
{
	*done = *total = 0;
	*warming = *models = 0;
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		const struct generation *gens[2] = { m->current, m->pending };

		if (m->current != NULL)
			(*models)++;
		for (int k = 0; k < 2; k++) {
			const struct generation *g = gens[k];

			if (g == NULL)
				continue;
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
}
