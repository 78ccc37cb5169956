/*
 * generation.c: the life of one generation of a model, from its install to
 * its free: warming on the pool, promotion to current when warm, pinning
 * and eviction (off the event loop, one page operation at a time), marking
 * it modified, the memory budget, and freeing it once nothing refers to it
 * (not current or pending, no client attach, no warming job, no page
 * operation). registry.c creates generations; this file keeps them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "registry_internal.h"
#include "resident.h"

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

uint64_t
registry_now_ms(const struct registry *r)
{
	return uv_now(r->loop);
}

int
gen_is_live(const struct generation *g)
{
	return g->model != NULL && (g->model->current == g || g->model->pending == g);
}

/* Frees g if nothing refers to it any more. */
void
gen_maybe_free(struct registry *r, struct generation *g)
{
	struct generation **pp;

	if (gen_is_live(g) || g->attached > 0 || g->warm_pending > 0 || g->ops_pending > 0)
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

/* Bytes of g's files in memory (resident.h: true for a daemon that does
 * not own the files); a file no method can measure counts as 0. */
static uint64_t
resident_of(const struct generation *g, enum resident_method *how)
{
	uint64_t total = 0, n;

	for (size_t i = 0; i < g->source.nfiles; i++)
		if (resident_bytes(&g->source.files[i], &n, how) == 0)
			total += n;
	return total;
}

uint64_t
generation_resident(const struct generation *g, const char **method)
{
	enum resident_method how = RESIDENT_CACHESTAT;
	uint64_t n = resident_of(g, &how);

	if (method != NULL)
		*method = resident_method_name(how);
	return n;
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
void
gen_pin_metadata(struct generation *g)
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
struct page_work {
	uv_work_t work;
	struct generation *g;
	enum page_op op;
	int err;               /* the first failure */
	size_t failed;         /* the file it failed on */
	uint64_t resident;     /* PAGE_CHECK: bytes in memory */
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

	if (p->op == PAGE_EVICT_SETTLE) {
		/* Evicted while it warmed: the cancelled job's readahead may
		 * still be in flight, and DONTNEED skips pages under I/O. Drop
		 * once now and once more when that I/O has landed. This thread
		 * is a work-queue thread, never the loop. */
		struct timespec pause = { 0, 50000000L }; /* 50 ms */

		for (size_t i = 0; i < g->source.nfiles; i++)
			warm_evict_range(g->source.files[i].fd, 0, 0);
		nanosleep(&pause, NULL);
	}

	if (p->op == PAGE_CHECK) {
		p->resident = resident_of(g, NULL);
		return;
	}
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (p->op == PAGE_POPULATE) {
			if (p->err == 0 && (p->err = resident_populate(f)) < 0)
				p->failed = i;
			continue;
		}
		if (p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE) {
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

/*
 * Should g be warmed again after a residency check found resident bytes in
 * memory? Only a generation that is current, ready, not evicted (cold),
 * configured to warm, and whose pages the daemon had all mapped (so that
 * what is missing was taken by memory pressure, not never read), and only
 * when more than 1% (at least 1 MiB) is missing.
 */
static int
needs_rewarm(const struct generation *g, uint64_t resident)
{
	uint64_t slack = g->bytes / 100 > (1u << 20) ? g->bytes / 100 : (1u << 20);

	return g->populated && !g->cold && g->state == GEN_READY && g->model != NULL &&
		g->model->current == g && g->model->warm && resident + slack < g->bytes;
}

/* A populate or a residency check ended (loop thread). */
static void
residency_done(struct registry *r, struct generation *g, const struct page_work *p, int status)
{
	if (status != 0)
		return;
	if (p->op == PAGE_POPULATE) {
		if (p->err < 0 && p->err != -EINVAL)
			log_warnx("model \"%s\": cannot map %s into wcached: %s; a client may drop its "
				  "pages from the page cache", g->model_name,
				g->source.files[p->failed].path, strerror(-p->err));
		g->populated = p->err == 0 && !g->cold;
		return;
	}
	if (!needs_rewarm(g, p->resident))
		return;
	g->model->rewarm_count++;
	log_warnx("model \"%s\": only %" PRIu64 " of %" PRIu64 " bytes of generation %" PRIu64
		  " are still in memory (memory pressure); warming it again", g->model_name,
		p->resident, g->bytes, g->number);
	g->populated = 0;
	gen_start_warming(r, g);
}

void
registry_check_residency(struct registry *r)
{
	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct generation *g = m->current;

		if (g != NULL && g->populated && g->page_queue == NULL && g->warm_pending == 0)
			gen_queue_pages(r, g, PAGE_CHECK);
	}
}

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
	if (p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE)
		g->populated = 0; /* its pages are no longer mapped here */
	if (p->op == PAGE_POPULATE || p->op == PAGE_CHECK) {
		residency_done(r, g, p, status);
	} else if (status == 0 && p->op == PAGE_PIN) {
		if (p->err < 0)
			pin_failed(g->model_name, g->source.files[p->failed].path,
				(size_t)g->source.files[p->failed].size, p->err);
		else
			g->pinned = PIN_ALL;
	} else if ((p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE) && g->rewarm_after_evict) {
		/* Attached again while this eviction ran: warm now that it is
		 * done, so it does not drop the fresh pages. */
		g->rewarm_after_evict = 0;
		if (!g->cold && g->model != NULL && g->model->current == g && g->model->warm)
			gen_start_warming(r, g);
		else if (g->state == GEN_WARMING && g->warm_pending == 0)
			g->state = GEN_READY;
	} else if (status == 0 && p->op == PAGE_UNPIN) {
		g->pinned = PIN_NONE;
		/* munlock of the whole files dropped the headers' lock too */
		if (g->model != NULL && g->model->pin != PIN_NONE)
			gen_pin_metadata(g);
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
void
gen_queue_pages(struct registry *r, struct generation *g, enum page_op op)
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
void
gen_promote(struct registry *r, struct model_entry *m, struct generation *g)
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
		gen_queue_pages(r, g, PAGE_PIN);
	registry_publish(r, m, g->number);
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
		gen_queue_pages(r, g, PAGE_EVICT_SETTLE); /* evicted while it warmed */
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
		double secs = (double)(registry_now_ms(r) - g->warm_started_ms) / 1000.0;

		g->state = GEN_READY;
		if (m != NULL)
			m->last_warm_seconds = secs;
		/* The loop's clock counts milliseconds; the jobs' own clocks
		 * time a warm-up shorter than that, so no rate reads 0 MB/s. */
		if (g->warm_seconds > secs)
			secs = g->warm_seconds;
		if (secs > 0 && g->warm_bytes > 0)
			log_info("model \"%s\": generation %" PRIu64 " warm: %" PRIu64
				 " bytes in %.3f s (%.0f MB/s)", g->model_name, g->number,
				g->warm_bytes, secs, (double)g->warm_bytes / secs / 1e6);
		else
			log_info("model \"%s\": generation %" PRIu64 " warm: %" PRIu64
				 " bytes in %.3f s", g->model_name, g->number, g->warm_bytes, secs);
	} else {
		/* Cancelled (evicted, unloaded, superseded, shutdown): serves,
		 * but was not warmed, so no claim is made. */
		g->state = GEN_READY;
	}
	/* Warm: map every page, so no client can drop it (resident.h). */
	if (g->state == GEN_READY && !g->cold && !g->warm_cancelled && g->warm_error == 0)
		gen_queue_pages(r, g, PAGE_POPULATE);
	if (m != NULL && m->pending == g && g->state == GEN_READY)
		gen_promote(r, m, g);
	else if (m != NULL && m->current == g && m->pin == PIN_ALL && g->state == GEN_READY)
		gen_queue_pages(r, g, PAGE_PIN);
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
void
gen_start_warming(struct registry *r, struct generation *g)
{
	g->state = GEN_WARMING;
	g->warm_error = 0;
	g->warm_cancelled = 0;
	g->warm_bytes = 0;
	g->warm_seconds = 0;
	g->warm_started_ms = registry_now_ms(r);
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

void
gen_cancel_warming(struct registry *r, struct generation *g)
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
	gen_cancel_warming(r, g);
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

/* ---- attaching, pinning, eviction ---- */

/* Removes evictions queued behind the running page operation (the
 * running one cannot be recalled). */
static void
drop_queued_evictions(struct generation *g)
{
	if (g->page_queue == NULL)
		return;
	for (struct page_work **pp = &g->page_queue->next; *pp != NULL;) {
		struct page_work *p = *pp;

		if (p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE) {
			*pp = p->next;
			g->ops_pending--;
			free(p);
		} else {
			pp = &p->next;
		}
	}
}

void
generation_ref(struct registry *r, struct generation *g)
{
	g->attached++;
	if (g->model == NULL)
		return;
	g->model->last_attach = ++r->attach_seq;
	if (g->cold && g->model->current == g) {
		/* Attaching a cold model warms it again. */
		g->cold = 0;
		log_info("model \"%s\": attached while cold, warming generation %" PRIu64,
			g->model_name, g->number);
		drop_queued_evictions(g);
		if (g->page_queue != NULL && (g->page_queue->op == PAGE_EVICT ||
						     g->page_queue->op == PAGE_EVICT_SETTLE)) {
			/* One is running: warm after it. */
			g->rewarm_after_evict = 1;
			g->state = GEN_WARMING;
		} else if (g->model->warm) {
			gen_start_warming(r, g);
		}
		registry_enforce_budget(r);
	}
}

void
generation_unref(struct registry *r, struct generation *g)
{
	/* Evicted pages a worker still mapped stayed resident; when the last
	 * holder of a cold generation lets go, drop them. */
	if (--g->attached == 0 && g->cold && gen_is_live(g))
		gen_queue_pages(r, g, PAGE_EVICT);
	gen_maybe_free(r, g);
}

int
registry_pin(struct registry *r, const char *name, enum pin_mode pin)
{
	struct model_entry *m = registry_entry_named(r, name);

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
			gen_queue_pages(r, m->current, PAGE_PIN);
		/* A pinned model counts against the budget and is never the
		 * one evicted: others may have to go. */
		registry_enforce_budget(r);
	} else {
		/* Queued behind a lock still running, if any. */
		gen_queue_pages(r, m->current, PAGE_UNPIN);
	}
	return 0;
}

/* Drops the page cache of g's files and marks it cold. */
void
gen_evict(struct registry *r, struct generation *g)
{
	g->cold = 1;
	gen_cancel_warming(r, g);
	/* A job still reading would leave its last chunk (and readahead)
	 * resident: drop the pages once it has stopped (warm_done). */
	if (g->warm_pending == 0)
		gen_queue_pages(r, g, PAGE_EVICT);
}

int
registry_evict(struct registry *r, const char *name)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (m->pin == PIN_ALL)
		return error_set(-EBUSY, "model \"%s\" is pinned; unpin it first", name);
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m)
			gen_evict(r, g);
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
				(lru == NULL || m->last_attach < lru->last_attach))
				lru = m;
		if (lru == NULL) {
			/* Everything left is pinned or in use. */
			for (struct model_entry *m = r->models; m != NULL; m = m->next)
				if (m->current != NULL && !m->current->cold && m->pin != PIN_ALL &&
					(lru == NULL || m->last_attach < lru->last_attach))
					lru = m;
		}
		if (lru == NULL)
			break;
		log_info("model \"%s\": evicted to keep within memory_budget (%" PRIu64
			 " MiB of models, budget %" PRIu64 " MiB)", lru->name, total >> 20,
			r->memory_budget >> 20);
		gen_evict(r, lru->current);
		total -= lru->current->bytes;
	}
}

