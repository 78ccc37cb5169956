/*
 * pages.c: operations on a generation's pages (see pages.h), on libuv's
 * work queue, one at a time per generation; each one's end is reported
 * through the hooks it was queued with, never by calling the modules above.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "format/index.h"
#include "generation.h"
#include "index_check.h"
#include "log.h"
#include "pages.h"

/* What locking a generation's metadata left (lock_metadata). */
struct metadata_lock {
	int err;          /* 0, or the first failure */
	size_t file;      /* it failed on this file's header, */
	int index;        /* or on the index */
	struct resident_refusal why; /* the refusal's facts */
	int locked;       /* the index is locked: pinned = PIN_METADATA */
};

struct page_work {
	struct workq_job job;
	struct generation *g;
	enum page_op op;
	int err;                /* the first failure */
	size_t failed;          /* the file it failed on */
	struct resident_refusal refused; /* PAGE_PIN: why mlock refused it */
	uint64_t resident;      /* bytes in memory once the operation ended */
	enum resident_method how; /* the measure that counted them */
	uint64_t epoch;         /* g->resident.epoch when it started */
	/* PAGE_RESTORE, PAGE_UNPIN, PAGE_PIN: lock the metadata (the model
	 * pins it; for PAGE_PIN only when undoing a refused lock unlocked
	 * it), and what that left (relocked: it ran); PAGE_PIN_METADATA:
	 * what its lock left; PAGE_RESTORE: the index check's outcome with
	 * its message. */
	int pin_metadata;
	int relocked;
	struct metadata_lock lock;
	int check_err;
	char message[ERROR_MAX];
	int stopped;            /* the daemon began to stop: not every page mapped */
	int written;            /* PAGE_CHECK: file `changed` was written in place */
	size_t changed;
	int relinked;           /* ... else file relinked_i's links only moved */
	size_t relinked_i;
	struct stat relinked_st;
	int populate;           /* PAGE_RESTORE: map every page (not when it went cold
				   before the check started: evicted, by the budget or
				   by hand, or no longer served) */
	const struct pages_hooks *hooks; /* how its end is reported */
	struct page_work *next; /* queued behind the running one */
};

#define EVICT_CHUNK (2u << 20)
/* PAGE_RESTORE maps a file this much at a time, so that a daemon stopping
 * meanwhile waits for one piece, not for a whole model. */
#define RESTORE_CHUNK (64u << 20)

uint64_t
pages_resident(const struct generation *g, enum resident_method *how)
{
	uint64_t total = 0, n;

	for (size_t i = 0; i < g->source.nfiles; i++)
		if (resident_bytes(&g->source.files[i], &n, how) == 0)
			total += n;
	return total;
}

/*
 * Loop thread: a lock of kind of (PIN_METADATA, PIN_ALL) of what was
 * refused. Records it in g (status's pin_error) and logs it, one line that
 * names the model, what was being locked, the errno and the real cause
 * with its remedy (resident_refusal_cause).
 */
static void
pin_failed(struct generation *g, int of, const char *what, const struct resident_refusal *why)
{
	char cause[480];

	resident_refusal_cause(why, cause, sizeof(cause));
	snprintf(g->pin_error, sizeof(g->pin_error), "cannot lock %s (%" PRIu64 " bytes) in "
		 "memory: %s", what, why->bytes, cause);
	g->pin_error_of = of;
	log_warnx("model \"%s\": %s", g->model_name, g->pin_error);
}

/* Loop thread: a lock of kind of held, so a refusal of that kind (or, for
 * PIN_ALL, of any kind) is no longer true. */
static void
pin_held(struct generation *g, int of)
{
	if (g->pin_error_of <= of) {
		g->pin_error[0] = '\0';
		g->pin_error_of = PIN_NONE;
	}
}

/*
 * Work queue thread: locks g's index, then each file up to first[i] (its
 * first tensor's data; none when first is NULL). mlock reads in any page
 * not in memory, through the daemon's mapping: for a file served where it
 * lies on a network or FUSE filesystem that waits on its server (a FUSE
 * mount without keep_cache drops a file's cache at each open; NFS may drop
 * it at an attribute change), for as long as the server takes, so never on
 * the loop. metadata_locked() records the outcome on the loop.
 */
static void
lock_metadata(const struct generation *g, const uint64_t *first, struct metadata_lock *out)
{
	memset(out, 0, sizeof(*out));
	if ((out->err = resident_pin_range(g->index, g->index_size)) < 0) {
		out->index = 1;
		resident_refusal_read(out->err, g->index_size, &out->why);
		return;
	}
	out->locked = 1;
	for (size_t i = 0; first != NULL && i < g->source.nfiles; i++) {
		if (first[i] == 0 || g->source.files[i].base == NULL)
			continue;
		if ((out->err = resident_pin_range(g->source.files[i].base,
			(size_t)first[i])) < 0) {
			out->file = i;
			resident_refusal_read(out->err, first[i], &out->why);
			return;
		}
	}
}

/* Loop thread: what lock_metadata() left. */
static void
metadata_locked(struct generation *g, const struct metadata_lock *l)
{
	char what[480];

	if (l->err < 0) {
		if (l->index)
			snprintf(what, sizeof(what), "its index");
		else
			snprintf(what, sizeof(what), "the header of %s",
				g->source.files[l->file].path);
		pin_failed(g, PIN_METADATA, what, &l->why);
	} else {
		pin_held(g, PIN_METADATA);
	}
	if (l->locked)
		g->pinned = PIN_METADATA;
}

/* Locks g's index and each file's headers, found from the index (the
 * index alone when it cannot be read or there is no memory). */
static void
lock_headers(const struct generation *g, struct metadata_lock *out)
{
	struct index_header h;
	struct index_tensor t;
	uint64_t *first = NULL;

	if (index_open(g->index, g->index_size, &h) == 0 &&
		(first = calloc(g->source.nfiles ? g->source.nfiles : 1, sizeof(*first))) != NULL) {
		for (size_t i = 0; i < g->source.nfiles; i++)
			first[i] = g->source.files[i].size;
		for (uint64_t i = 0; i < h.tensor_count; i++)
			if (index_tensor_at(g->index, &h, i, &t) == 0 &&
				t.file < g->source.nfiles && t.offset < first[t.file])
				first[t.file] = t.offset;
	}
	lock_metadata(g, first, out);
	free(first);
}

/* Work queue thread: maps every page of file i of g (resident_populate),
 * a RESTORE_CHUNK at a time, until it fails or the daemon stops. */
static void
populate_restored(struct page_work *p, size_t i)
{
	const struct wc_file *f = &p->g->source.files[i];

	for (uint64_t off = 0; off < f->size && p->err == 0; off += RESTORE_CHUNK) {
		struct wc_file piece = *f;

		if (__atomic_load_n(&p->g->registry->closing, __ATOMIC_RELAXED)) {
			p->stopped = 1;
			return;
		}
		piece.base = f->base != NULL ? f->base + off : NULL;
		piece.size = f->size - off < RESTORE_CHUNK ? f->size - off : RESTORE_CHUNK;
		if ((p->err = resident_populate(&piece)) < 0)
			p->failed = i;
	}
}

/*
 * Work queue thread, PAGE_RESTORE: the full index check, then (when it
 * passes) the metadata lock and every page mapped, as a fresh generation
 * has them once warm.
 */
static void
check_restored(struct page_work *p)
{
	const struct generation *g = p->g;
	size_t n = g->source.nfiles;
	uint64_t *size = calloc(n ? n : 1, sizeof(*size)),
		*first = calloc(n ? n : 1, sizeof(*first));
	struct index_header h;

	if (size == NULL || first == NULL) {
		p->check_err = error_set(-ENOMEM, "out of memory");
	} else {
		for (size_t i = 0; i < n; i++)
			size[i] = g->source.files[i].size;
		if (index_open(g->index, g->index_size, &h) < 0)
			p->check_err = -EBADMSG;
		else
			p->check_err = index_check(g->index, &h, size, n, first);
	}
	if (p->check_err < 0) {
		snprintf(p->message, sizeof(p->message), "%s", error_get());
	} else {
		if (p->pin_metadata)
			lock_metadata(g, first, &p->lock);
		for (size_t i = 0; i < n && p->populate && p->err == 0 && !p->stopped; i++)
			populate_restored(p, i);
	}
	free(size);
	free(first);
}

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

/*
 * Work queue thread, PAGE_CHECK: compares each file's fstat with the one at
 * open. inotify (watch.c) hears of writes only in the directories it
 * watches, the model's path's and its own; a file a symlink inside the
 * model leads to elsewhere in its tree (a hub snapshot's ../../blobs/) is
 * written in another, unheard. The periodic residency check sees it. Not
 * for files served from a remote filesystem: an fstat there asks its
 * server, which may hang, and would hold up this generation's page work
 * (polling compares those files, watch_poll.c).
 */
static void
check_written(struct page_work *p)
{
	const struct generation *g = p->g;
	struct stat now;

	if (g->fs.remote && g->origin == NULL)
		return;
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (fstat(f->fd, &now) == -1)
			continue;
		if (file_written_in_place(&f->st, &now)) {
			p->written = 1;
			p->changed = i;
			p->relinked = 0;
			return;
		}
		if (!p->relinked && file_links_moved(&f->st, &now)) {
			p->relinked = 1;
			p->relinked_i = i;
			p->relinked_st = now;
		}
	}
}

/* Work queue thread: does the operation itself (PAGE_CHECK compares the
 * files' fstat, check_written, and measures, which page_work_run does after
 * every operation). */
static void
page_work_apply(struct page_work *p)
{
	struct generation *g = p->g;

	if (p->op == PAGE_EVICT_SETTLE) {
		/* Evicted while it warmed: the cancelled job's readahead may
		 * still be in flight, and DONTNEED skips pages under I/O. Drop
		 * once now and once more when that I/O has landed. This thread
		 * is a work-queue thread, never the loop. */
		struct timespec pause = { 0, 50000000L }; /* 50 ms */

		for (size_t i = 0; i < g->source.nfiles; i++)
			resident_evict_range(g->source.files[i].fd, 0, 0);
		nanosleep(&pause, NULL);
	}

	if (p->op == PAGE_CHECK) {
		check_written(p);
		return;
	}
	if (p->op == PAGE_RESTORE) {
		check_restored(p);
		return;
	}
	if (p->op == PAGE_PIN_METADATA) {
		lock_headers(g, &p->lock);
		return;
	}
	/* Everything, the index too: what is asked is locked again after
	 * (page_work_after), and pinned says what that lock left. */
	if (p->op == PAGE_UNPIN && g->index != NULL)
		resident_unpin_range(g->index, g->index_size);
	for (size_t i = 0; i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];

		if (p->op == PAGE_POPULATE) {
			if (p->err == 0 && (p->err = resident_populate(f)) < 0)
				p->failed = i;
			continue;
		}
		if (p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE) {
			unmap_pages(f);
			resident_evict_range(f->fd, 0, 0);
			continue;
		}
		if (f->base == NULL)
			continue;
		if (p->op == PAGE_UNPIN) {
			resident_unpin_range(f->base, (size_t)f->size);
			continue;
		}
		if ((p->err = resident_pin_range(f->base, (size_t)f->size)) < 0) {
			p->failed = i;
			resident_refusal_read(p->err, f->size, &p->refused);
			for (size_t j = 0; j < i; j++)
				if (g->source.files[j].base != NULL)
					resident_unpin_range(g->source.files[j].base,
						(size_t)g->source.files[j].size);
			/* That unlocked their headers too: locked again here,
			 * where reading them back may wait on the disk. */
			if (p->pin_metadata && i > 0) {
				lock_headers(g, &p->lock);
				p->relocked = 1;
			}
			return;
		}
	}
	/* munlock of the whole files dropped the headers' lock too. */
	if (p->op == PAGE_UNPIN && p->pin_metadata) {
		lock_headers(g, &p->lock);
		p->relocked = 1;
	}
}

/* Work queue thread: the operation, then a measure of what it left in
 * memory, so that status and metrics report a figure taken off the loop
 * (gen_resident) that is fresh right after every change a page
 * operation makes (evict, pin, populate once warm). */
static void
page_work_run(struct workq_job *w)
{
	struct page_work *p = w->arg;

	page_work_apply(p);
	p->how = RESIDENT_CACHESTAT;
	p->resident = pages_resident(p->g, &p->how);
}

static void page_work_after(struct workq_job *w, int status);

/* Loop thread: what mapping every page of g (PAGE_POPULATE) left. */
static void
populated(struct generation *g, const struct page_work *p)
{
	if (p->err < 0 && p->err != -EINVAL)
		log_warnx("model \"%s\": cannot map %s into wcached: %s; a client may drop its "
			  "pages from the page cache", g->model_name,
			g->source.files[p->failed].path, strerror(-p->err));
	g->populated = p->err == 0 && g->state != GEN_COLD;
}

static const char *const op_names[] = {
	[PAGE_PIN] = "pin", [PAGE_UNPIN] = "unpin", [PAGE_EVICT] = "evict",
	[PAGE_EVICT_SETTLE] = "evict", [PAGE_POPULATE] = "populate", [PAGE_CHECK] = "check",
	[PAGE_RESTORE] = "restore check", [PAGE_PIN_METADATA] = "metadata lock",
};

/* What page work on g touches: its files' filesystem, remote unless they
 * are a staged copy. Names the work in what. */
static uint64_t
files_fs(const struct generation *g, char *what, size_t len, enum page_op op)
{
	snprintf(what, len, "model \"%s\": page work (%s) on generation %" PRIu64 " on %s",
		g->model_name, op_names[op], g->number, g->fs.name);
	return workq_fs(g->fs.remote && g->origin == NULL,
		g->source.nfiles > 0 ? g->source.files[0].st.st_dev : 0);
}

/* Starts the first queued operation of g; -errno if it cannot. */
static int
page_work_start(struct registry *r, struct generation *g)
{
	struct page_work *p = g->page_queue;
	char what[sizeof(p->job.what)];
	int err;

	p->epoch = g->resident.epoch;
	p->populate = g->state != GEN_COLD && p->hooks->live(g);
	if ((err = workq_submit(&r->workq, &p->job, files_fs(g, what, sizeof(what), p->op), what,
		     page_work_run, page_work_after)) < 0) {
		log_warnx("model \"%s\": %s", g->model_name, uv_strerror(err));
		g->page_queue = p->next;
		g->ops_pending--;
		free(p);
		/* Nothing to report: the operation never ran. What keeps g
		 * open is the caller's to reconsider (page_work_after). */
	}
	return err;
}

/* Loop thread: records what the operation left, starts the next one, and
 * reports this one's end through its hooks. */
static void
page_work_after(struct workq_job *w, int status)
{
	struct page_work *p = w->arg;
	struct generation *g = p->g;
	struct registry *r = g->registry;
	const struct pages_hooks *hooks = p->hooks;
	struct pages_result res = { .op = p->op, .cancelled = status != 0 };
	char message[sizeof(p->message)];
	int evict = p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE;

	g->page_queue = p->next;
	g->ops_pending--;
	if (evict)
		g->populated = 0; /* its pages are no longer mapped here */
	/* A warm-up that ended while this ran measured later (warm_done). */
	if (status == 0 && p->epoch == g->resident.epoch) {
		g->resident.measured = 1;
		g->resident.bytes = p->resident;
		g->resident.method = p->how;
		g->resident.at_ms = uv_now(r->loop);
	}
	if (status != 0) {
		/* cancelled: nothing ran */
	} else if (p->op == PAGE_POPULATE) {
		populated(g, p);
	} else if (p->op == PAGE_RESTORE) {
		if (p->check_err == 0) {
			if (p->pin_metadata)
				metadata_locked(g, &p->lock);
			if (p->populate && !p->stopped)
				populated(g, p);
		}
	} else if (p->op == PAGE_PIN) {
		if (p->err < 0) {
			pin_failed(g, PIN_ALL, g->source.files[p->failed].path, &p->refused);
			if (p->relocked)
				metadata_locked(g, &p->lock);
		} else {
			pin_held(g, PIN_ALL);
			g->pinned = PIN_ALL;
		}
	} else if (p->op == PAGE_PIN_METADATA) {
		metadata_locked(g, &p->lock);
	} else if (p->op == PAGE_UNPIN) {
		g->pinned = PIN_NONE;
		pin_held(g, PIN_ALL); /* nothing is asked beyond what follows */
		if (p->relocked)
			metadata_locked(g, &p->lock);
	}
	res.resident = p->resident;
	res.check_err = p->check_err;
	if (status == 0 && p->written)
		res.written = g->source.files[p->changed].path;
	else if (status == 0 && p->relinked) {
		res.relinked = 1;
		res.relinked_i = p->relinked_i;
		res.relinked_st = p->relinked_st;
	}
	snprintf(message, sizeof(message), "%s", p->message);
	res.message = message;
	free(p);
	/* The next one starts before this one is reported, so that an
	 * operation the hook queues runs after those already queued and is
	 * started once only. */
	while (g->page_queue != NULL && page_work_start(r, g) < 0)
		;
	hooks->done(r, g, &res);
}

/*
 * The last operation queued on g, when it is not the first (that one was
 * handed to the work queue and may have started) and op may take its
 * place, reported the same way (same hooks): the same operation, on the
 * same pages, from what g is when it starts; or a pin where an unpin
 * waits, or the reverse: the model's pin mode was set when each was asked,
 * and only the newest is what the pages must end as (an unpin then a pin
 * of pages the running pin locked would unlock every page only to lock it
 * again). A restore check and the evict that a warm-up's readahead
 * settles are never asked twice.
 */
static struct page_work *
same_waiting(struct generation *g, enum page_op op, const struct pages_hooks *hooks)
{
	struct page_work *last = g->page_queue;
	bool pins = op == PAGE_PIN || op == PAGE_UNPIN;

	if (!pins && op != PAGE_EVICT && op != PAGE_CHECK && op != PAGE_POPULATE)
		return NULL;
	while (last != NULL && last->next != NULL)
		last = last->next;
	if (last == NULL || last == g->page_queue || last->hooks != hooks)
		return NULL;
	if (last->op != op && !(pins && (last->op == PAGE_PIN || last->op == PAGE_UNPIN)))
		return NULL;
	return last;
}

void
pages_queue(struct registry *r, struct generation *g, enum page_op op,
	const struct pages_hooks *hooks)
{
	struct page_work *p, **tail;
	int pin_metadata = (op == PAGE_RESTORE || op == PAGE_UNPIN || op == PAGE_PIN) &&
		g->model != NULL && g->model->pin != PIN_NONE;

	/* Asked again before its turn came (`timeout 1 wcachectl pin x` in a
	 * loop, evicts piling up behind a pin reading a slow mount, pins and
	 * unpins in turn): the one waiting does it, as the model is now. Each
	 * ran in turn before, a pin walking every page of a locked model
	 * again; whoever waits for the model's page work (registry_pages_wait)
	 * is answered as before. */
	if ((p = same_waiting(g, op, hooks)) != NULL) {
		p->op = op;
		p->pin_metadata = pin_metadata;
		return;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		log_warnx("model \"%s\": out of memory", g->model_name);
		return;
	}
	p->g = g;
	p->op = op;
	p->hooks = hooks;
	p->pin_metadata = pin_metadata;
	p->job.arg = p;
	for (tail = &g->page_queue; *tail != NULL; tail = &(*tail)->next)
		;
	*tail = p;
	g->ops_pending++;
	if (g->page_queue == p)
		(void)page_work_start(r, g);
}

int
pages_evicting(const struct generation *g)
{
	for (const struct page_work *p = g->page_queue; p != NULL; p = p->next)
		if (p->op == PAGE_EVICT || p->op == PAGE_EVICT_SETTLE)
			return 1;
	return 0;
}

int
pages_drop_queued_evictions(struct generation *g)
{
	if (g->page_queue == NULL)
		return 0;
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
	return g->page_queue->op == PAGE_EVICT || g->page_queue->op == PAGE_EVICT_SETTLE;
}
