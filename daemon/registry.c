/*
 * registry.c: the models wcached serves (see registry.h): the status page
 * workers read, model entries, loading, unloading and shutdown.
 *
 * Loading a model opens and validates its files with the client library's
 * readers and copies the compiled index into a sealed memfd (the one thing
 * every worker maps to find tensors without parsing), on libuv's work queue.
 * Back on the loop the generation is installed: pinned as its model asks,
 * handed to the warm pool, and made current at once (a first generation) or
 * when warm (a replacement). What happens to a generation after that is
 * generation.c's (generation.h). Attaching checks access and the current
 * generation's state, and takes the client reference.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "log.h"
#include "pages.h"
#include "registry_internal.h"
#include "restore.h"

#include "proto/memfds.h"

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
	int *served_fds;      /* gen_open_served(), one per file */
	int index_fd;
	const uint8_t *index;
	size_t index_size;
	int status;
	char message[1024];
	registry_done_fn done;
	void *arg;
};

/* ---- the status page ---- */

/* Maps the status page fd read-write and opens the read-only reopen that
 * workers get; takes fd on success. */
static int
status_page_map(struct registry *r, int fd)
{
	char proc[64];
	void *map;

	map = mmap(NULL, STATUS_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return error_set(-errno, "status page: mmap: %s", strerror(errno));
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if ((r->status_ro_fd = open(proc, O_RDONLY | O_CLOEXEC)) == -1) {
		int e = errno;

		munmap(map, STATUS_PAGE_BYTES);
		return error_set(-e, "status page: reopening read-only: %s", strerror(e));
	}
	r->status_fd = fd;
	r->status = map;
	return 0;
}

/*
 * Creates the status page: a memfd the daemon maps read-write and sealed so
 * it can never shrink (no SIGBUS in workers) nor be mapped writable again
 * (F_SEAL_FUTURE_WRITE); workers get a read-only reopen of it. A page kept
 * in the manager's store must stay writable for the next process: no
 * F_SEAL_FUTURE_WRITE, and mode 0600, so only wcached's user (who could
 * ptrace wcached anyway) can reopen it writable.
 */
static int
status_page_init(struct registry *r)
{
	int fd, seals = r->fdstore ? STATUS_PAGE_STORED_SEALS : STATUS_PAGE_SEALS;

	/* Sealed below, once mapped: F_SEAL_FUTURE_WRITE forbids the
	 * writable mapping after it. */
	fd = memfd_sealed("wcache-status", NULL, STATUS_PAGE_BYTES, 0, r->fdstore ? 0600 : 0);
	if (fd < 0) {
		error_prefix("status page");
		return fd;
	}
	if (status_page_map(r, fd) < 0) {
		close(fd);
		return -EINVAL;
	}
	if (fcntl(fd, F_ADD_SEALS, seals) == -1) {
		int e = errno;

		munmap(r->status, STATUS_PAGE_BYTES);
		close(r->status_ro_fd);
		close(fd);
		r->status = NULL;
		r->status_fd = r->status_ro_fd = -1;
		return error_set(-e, "status page: sealing: %s", strerror(e));
	}
	__atomic_store_n(&r->status[0], STATUS_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

/*
 * Takes the status page the previous process stored, after checking that
 * it is one status_page_init() makes for the store: a memfd (only shmem
 * files take seals, and a tmpfs file starts sealed against more) of
 * STATUS_PAGE_BYTES with exactly STATUS_PAGE_STORED_SEALS, and, because it
 * lacks F_SEAL_FUTURE_WRITE, one that only wcached's user can reopen
 * writable through the read-only descriptor workers get: owned by our
 * euid, neither group- nor world-writable. Anything else could let a
 * worker announce false generations to the others.
 */
static int
status_page_adopt(struct registry *r, int fd)
{
	struct stat st;
	int seals;

	if (fstat(fd, &st) == -1)
		return error_set(-errno, "stored status page: fstat: %s", strerror(errno));
	if (!S_ISREG(st.st_mode) || st.st_size != (off_t)STATUS_PAGE_BYTES)
		return error_set(-EINVAL, "stored status page: not a %u-byte file",
			STATUS_PAGE_BYTES);
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 || seals != STATUS_PAGE_STORED_SEALS)
		return error_set(-EINVAL, "stored status page: seals 0x%x, not 0x%x "
			"(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)", seals,
			STATUS_PAGE_STORED_SEALS);
	if (st.st_uid != geteuid())
		return error_set(-EINVAL, "stored status page: owned by uid %u, not wcached's "
			"uid %u", (unsigned)st.st_uid, (unsigned)geteuid());
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
		return error_set(-EINVAL, "stored status page: mode %04o is group- or "
			"world-writable (a fresh page is 0600)", (unsigned)(st.st_mode & 07777));
	if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR)
		return error_set(-EINVAL, "stored status page: not open read-write");
	if (status_page_map(r, fd) < 0)
		return -EINVAL;
	if (__atomic_load_n(&r->status[0], __ATOMIC_ACQUIRE) != STATUS_MAGIC) {
		munmap(r->status, STATUS_PAGE_BYTES);
		close(r->status_ro_fd);
		r->status = NULL;
		r->status_fd = r->status_ro_fd = -1;
		return error_set(-EINVAL, "stored status page: slot 0 is not the magic");
	}
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
void
registry_publish(struct registry *r, struct model_entry *m, uint64_t generation)
{
	if (m->slot != 0)
		__atomic_store_n(&r->status[m->slot], generation, __ATOMIC_RELEASE);
	if (r->swapped != NULL)
		r->swapped(r, m, generation);
}

/* ---- models ---- */

int
registry_init(struct registry *r, uv_loop_t *loop, struct warm_pool *pool)
{
	memset(r, 0, sizeof(*r));
	r->loop = loop;
	r->pool = pool;
	r->status_fd = r->status_ro_fd = -1;
	return status_page_init(r);
}

int
registry_init_stored(struct registry *r, uv_loop_t *loop, struct warm_pool *pool, int status_fd)
{
	memset(r, 0, sizeof(*r));
	r->loop = loop;
	r->pool = pool;
	r->fdstore = 1;
	r->status_fd = r->status_ro_fd = -1;
	return status_fd >= 0 ? status_page_adopt(r, status_fd) : status_page_init(r);
}

int
registry_restore_slot(struct registry *r, unsigned slot, const char *name, uint64_t last_generation)
{
	struct status_slot *slots;
	char *n;

	if (slot == 0 || slot >= STATUS_SLOTS || (slot < r->nslots && r->slots[slot].name[0] != 0))
		return error_set(-EINVAL, "status slot %u of model \"%s\": taken or out of range",
			slot, name);
	if (slot >= r->nslots) {
		unsigned first = r->nslots == 0 ? 1 : r->nslots;

		if ((slots = realloc(r->slots, (slot + 1) * sizeof(*slots))) == NULL)
			return error_set(-ENOMEM, "status slots: out of memory");
		r->slots = slots;
		for (unsigned i = first; i <= slot; i++) {
			/* A gap: a slot nobody owns yet, named "" (no model is). */
			slots[i].last_generation = 0;
			if ((slots[i].name = strdup("")) == NULL) {
				r->nslots = i;
				return error_set(-ENOMEM, "status slots: out of memory");
			}
		}
		r->nslots = slot + 1;
	}
	if ((n = strdup(name)) == NULL)
		return error_set(-ENOMEM, "status slots: out of memory");
	free(r->slots[slot].name);
	r->slots[slot].name = n;
	r->slots[slot].last_generation = last_generation;
	return 0;
}

/* Exact name lookup. */
struct model_entry *
registry_entry_named(struct registry *r, const char *name)
{
	for (struct model_entry *m = r->models; m != NULL; m = m->next)
		if (strcmp(m->name, name) == 0)
			return m;
	return NULL;
}

struct model_entry *
registry_find(struct registry *r, const char *name)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m != NULL)
		return m;
	for (m = r->models; m != NULL; m = m->next)
		if (strcmp(m->path, name) == 0)
			return m;
	return NULL;
}

/* Adds the model name, not yet served, with its status slot. NULL when out
 * of memory (the message in error_get()). */
static struct model_entry *
entry_new(struct registry *r, const char *name, const char *path, enum pin_mode pin, int warm)
{
	struct model_entry *m;

	if ((m = calloc(1, sizeof(*m))) == NULL || (m->name = strdup(name)) == NULL ||
		(m->path = strdup(path)) == NULL) {
		if (m != NULL)
			free(m->name);
		free(m);
		error_set(-ENOMEM, "model \"%s\": out of memory", name);
		return NULL;
	}
	m->pin = pin;
	m->warm = warm;
	m->entry_id = ++r->next_load_id;
	m->slot = slot_for(r, name);
	if (m->slot != 0)
		m->last_generation = r->slots[m->slot].last_generation;
	m->last_attach = ++r->attach_seq;
	m->next = r->models;
	r->models = m;
	return m;
}

/* A generation of the model name made of what the store gave back: src
 * (files open and mapped) and the sealed index_fd, mapped here. Takes src
 * on success only; NULL with the message otherwise. Not yet in the
 * registry's list, without a model and without a state. */
static struct generation *
generation_from_store(struct registry *r, const char *name, uint64_t number,
	struct model_source *src, int index_fd, size_t index_size)
{
	struct generation *g;
	void *map;

	map = mmap(NULL, index_size, PROT_READ, MAP_SHARED, index_fd, 0);
	if (map == MAP_FAILED) {
		error_set(-errno, "model \"%s\": mapping the stored index: %s", name,
			strerror(errno));
		return NULL;
	}
	if ((g = calloc(1, sizeof(*g))) == NULL || (g->model_name = strdup(name)) == NULL ||
		/* NOLINTNEXTLINE(bugprone-sizeof-expression) */
		(g->warm.jobs = calloc(src->nfiles ? src->nfiles : 1, sizeof(*g->warm.jobs))) ==
			NULL) {
		if (g != NULL)
			free(g->model_name);
		free(g);
		munmap(map, index_size);
		error_set(-ENOMEM, "model \"%s\": out of memory", name);
		return NULL;
	}
	if (gen_open_served(src, &g->served_fds) < 0) {
		char why[512];

		snprintf(why, sizeof(why), "%s", error_get());
		free(g->warm.jobs);
		free(g->model_name);
		free(g);
		munmap(map, index_size);
		error_set(-ESTALE, "model \"%s\": %s", name, why);
		return NULL;
	}
	g->registry = r;
	g->source = *src;
	memset(src, 0, sizeof(*src));
	g->index_fd = index_fd;
	g->index = map;
	g->index_size = index_size;
	for (size_t i = 0; i < g->source.nfiles; i++)
		g->bytes += g->source.files[i].size;
	g->number = number;
	g->from_store = 1;
	return g;
}

/* Gives the files and the index of g back to src and index_fd's owner and
 * frees the rest (the inverse of generation_from_store). */
static void
generation_unstore(struct generation *g, struct model_source *src)
{
	*src = g->source;
	gen_close_served(g->served_fds, g->source.nfiles);
	munmap((void *)g->index, g->index_size);
	free(g->warm.jobs);
	free(g->model_name);
	free(g);
}

/* Puts g in the registry's list as a generation of m. */
static void
generation_link(struct registry *r, struct model_entry *m, struct generation *g)
{
	if (g->number > m->last_generation)
		m->last_generation = g->number;
	if (m->slot != 0)
		r->slots[m->slot].last_generation = m->last_generation;
	g->model = m;
	g->next = r->generations;
	r->generations = g;
}

struct generation *
registry_generation(struct registry *r, const struct model_entry *m, uint64_t number)
{
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m && g->number == number)
			return g;
	return NULL;
}

int
registry_adopt(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, uint64_t number, struct model_source *src, int index_fd, size_t index_size)
{
	struct model_entry *m;
	struct generation *g;

	if (registry_entry_named(r, name) != NULL)
		return error_set(-EEXIST, "model \"%s\" is already there", name);
	if ((g = generation_from_store(r, name, number, src, index_fd, index_size)) == NULL)
		return -ENOMEM;
	if ((m = entry_new(r, name, path, pin, warm)) == NULL) {
		generation_unstore(g, src);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	generation_link(r, m, g);
	gen_set_state(g, GEN_READY, "restored from the file descriptor store");
	/* Current at once (gen_promote without its pin = all: that waits for
	 * the check below, as the metadata lock does). */
	m->current = g;
	registry_publish(r, m, number);
	registry_enforce_budget(r);
	/* Nothing here is proportional to the model's size or tensor count:
	 * the full index check, the metadata lock and mapping every page into
	 * this process again (the page cache still has them: that reads
	 * nothing from disk) run on the work queue while it serves, from
	 * registry_restore_checks(). */
	g->restore_check = RESTORE_CHECK_WAITING;
	if (r->changed != NULL)
		r->changed(r);
	return 0;
}

int
registry_adopt_held(struct registry *r, const char *name, uint64_t number,
	struct model_source *src, int index_fd, size_t index_size, unsigned holders)
{
	struct model_entry *m = registry_entry_named(r, name);
	struct generation *g;

	if (m == NULL || m->current == NULL || m->current->number <= number)
		return error_set(-EINVAL, "model \"%s\": generation %" PRIu64 " is not older "
			"than a restored current one", name, number);
	/* Nobody could say they hold it: it would only wait for nothing. */
	if (holders == 0)
		return error_set(-EINVAL, "model \"%s\": generation %" PRIu64 " had no holders "
			"when it was stored", name, number);
	if (registry_generation(r, m, number) != NULL)
		return error_set(-EEXIST, "model \"%s\": generation %" PRIu64 " is already there",
			name, number);
	if ((g = generation_from_store(r, name, number, src, index_fd, index_size)) == NULL)
		return -ENOMEM;
	generation_link(r, m, g);
	gen_set_state(g, GEN_READY, "restored from the file descriptor store, held");
	/* Not current: only its holders' HOLDs keep it, once this passes. */
	registry_await_holds(r, g, holders);
	if (r->changed != NULL)
		r->changed(r);
	return 0;
}

void
registry_await_holds(struct registry *r, struct generation *g, unsigned holders)
{
	if (holders == 0 || g->hold_until_ms != 0)
		return;
	/* From now, not from the loop's last update (start-up runs before
	 * the loop does). */
	uv_update_time(r->loop);
	g->hold_until_ms = registry_now_ms(r) + (uint64_t)r->restart_hold_ms;
	if (g->hold_until_ms == 0)
		g->hold_until_ms = 1;
	g->holds_expected = holders;
	r->holds_open++;
}

unsigned
registry_holders(const struct generation *g)
{
	unsigned n = g->attached;

	if (g->hold_until_ms != 0 && g->holds_expected > g->nhold_conns &&
		__builtin_add_overflow(n, g->holds_expected - g->nhold_conns, &n))
		n = UINT_MAX;
	return n;
}

/* Ends g's wait for HOLDs: none is accepted from now. */
static void
hold_wait_end(struct registry *r, struct generation *g)
{
	g->hold_until_ms = 0;
	r->holds_open--;
	free(g->hold_conns);
	g->hold_conns = NULL;
	g->nhold_conns = 0;
	g->holds_expected = 0;
}

void
registry_expire_holds(struct registry *r)
{
	uint64_t now = registry_now_ms(r);
	struct generation *g, *next;

	if (r->holds_open == 0)
		return;
	for (g = r->generations; g != NULL; g = next) {
		next = g->next;
		if (g->hold_until_ms == 0 || now < g->hold_until_ms)
			continue;
		hold_wait_end(r, g);
		if (g->attached == 0 && !gen_is_live(g))
			log_info("model \"%s\": generation %" PRIu64 ": no worker said it still "
				 "holds it within %.3g s of the restart", g->model_name, g->number,
				r->restart_hold_ms / 1000.0);
		gen_maybe_free(r, g);
	}
}

void
registry_restore_checks(struct registry *r)
{
	struct generation *next = NULL;

	if (r->closing)
		return;
	for (struct generation *g = r->generations; g != NULL; g = g->next) {
		if (g->restore_check == RESTORE_CHECK_RUNNING)
			return;
		if (g->restore_check == RESTORE_CHECK_WAITING)
			next = g; /* the list is newest first: the last one waited longest */
	}
	if (next != NULL) {
		next->restore_check = RESTORE_CHECK_RUNNING;
		pages_queue(r, next, PAGE_RESTORE);
	}
}

void
registry_restore_checked(struct registry *r, struct generation *g, int err, const char *why)
{
	struct model_entry *m = g->model;
	int serving = m != NULL && m->current == g;

	g->restore_check = RESTORE_CHECK_NONE;
	registry_restore_checks(r);
	if (err == 0) {
		log_debug("model \"%s\": generation %" PRIu64 ": restored index checked in full%s",
			g->model_name, g->number, g->populated ? ", every page mapped" : "");
		if (serving && m->pin == PIN_ALL && g->state == GEN_READY)
			pages_queue(r, g, PAGE_PIN);
		return;
	}
	/* Withdrawn as a failed load is: no new attaches (an attach made
	 * meanwhile keeps it open until released), out of the store, and
	 * loaded afresh from the configured path. */
	log_errorx("model \"%s\": generation %" PRIu64 " restored from the file descriptor store "
		   "failed its full check (%s); %s", g->model_name, g->number, why,
		serving ? "withdrawn, loading afresh" : "no longer served");
	restore_forget(r, g);
	/* Not the previous process's generation any more, as far as HOLD
	 * goes, and nothing to wait for. */
	g->from_store = 0;
	if (g->hold_until_ms != 0)
		hold_wait_end(r, g);
	if (!serving)
		return;
	m->current = NULL;
	m->load_errors++;
	free(m->error);
	m->error = strdup(why);
	registry_publish(r, m, 0);
	if (registry_load(r, m->name, m->path, m->pin, m->warm, NULL, NULL) < 0)
		log_errorx("%s; not served", error_get());
	if (r->changed != NULL)
		r->changed(r);
}

/* ---- loading ---- */

/* Copies the compiled index into a sealed memfd and maps it read-only. */
static int
seal_index(struct load_request *q)
{
	void *map;
	int fd = memfd_sealed("wcache-index", q->source.index, q->source.index_len, INDEX_SEALS, 0);

	if (fd < 0)
		return fd;
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

	if ((q->status = source_open(q->path, &q->source)) == 0 &&
		((q->status = gen_open_served(&q->source, &q->served_fds)) < 0 ||
			(q->status = seal_index(q)) < 0)) {
		gen_close_served(q->served_fds, q->source.nfiles);
		q->served_fds = NULL;
		source_close(&q->source);
	}
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
	gen_close_served(q->served_fds, q->source.nfiles);
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
	size_t njobs = q->source.nfiles ? q->source.nfiles : 1;
	char msg[256];

	if (g == NULL || (g->model_name = strdup(m->name)) == NULL ||
		/* An array of pointers: sizeof(*g->warm.jobs) is one pointer.
		 * NOLINTNEXTLINE(bugprone-sizeof-expression) */
		(g->warm.jobs = calloc(njobs, sizeof(*g->warm.jobs))) == NULL) {
		if (g != NULL)
			free(g->model_name);
		free(g);
		if (q->done != NULL)
			q->done(-ENOMEM, "out of memory", 0, q->arg);
		return;
	}
	g->registry = r;
	g->source = q->source;
	g->served_fds = q->served_fds;
	q->served_fds = NULL;
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
		pages_pin_metadata(g);

	if (m->pending != NULL) {
		/* A newer replacement supersedes one still warming. */
		struct generation *old = m->pending;

		m->pending = NULL;
		gen_cancel_warming(r, old);
		gen_maybe_free(r, old);
	}
	log_info("model \"%s\": generation %" PRIu64 " from %s: %zu file%s, %" PRIu64 " bytes",
		m->name, g->number, m->path, g->source.nfiles, g->source.nfiles == 1 ? "" : "s",
		g->bytes);
	if (m->warm && r->pool != NULL)
		gen_start_warming(r, g);
	else
		gen_set_state(g, GEN_READY, m->warm ? "no warm pool" : "the model does not warm");
	if (m->current == NULL || g->state == GEN_READY) {
		/* A first generation serves at once, warm or not. */
		m->pending = g;
		gen_promote(r, m, g);
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

static int queue_load(struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm, int reload, registry_done_fn done, void *arg);

static void
load_after(uv_work_t *w, int status)
{
	struct load_request *q = w->data;
	struct registry *r = q->r;
	struct model_entry *m = registry_entry_named(r, q->name);

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
	m = registry_entry_named(r, q->name); /* looked up again: done() may unload it */
	if (m != NULL && m->entry_id == q->entry_id && m->reload_again && m->loading == 0 &&
		!r->closing) {
		m->reload_again = 0;
		if (queue_load(r, m->name, m->path, m->pin, m->warm, 1, NULL, NULL) < 0)
			log_warnx("%s", error_get());
	}
	load_request_free(q);
}

/* Queues a load of path for the model name (entry created if new). */
static int
queue_load(struct registry *r, const char *name, const char *path, enum pin_mode pin, int warm,
	int reload, registry_done_fn done, void *arg)
{
	struct model_entry *m = registry_entry_named(r, name);
	struct load_request *q;
	int err;

	if (r->closing)
		return error_set(-ESHUTDOWN, "wcached is stopping");
	if (m == NULL && (m = entry_new(r, name, path, pin, warm)) == NULL)
		return -ENOMEM;
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
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (m->loading > 0) {
		/* A load in flight may have opened the files before the change
		 * that asks for this reload, so reload once more when it ends
		 * (of the path it leaves configured: an operator's load of
		 * another path is never superseded by the old one). */
		m->reload_again = 1;
		if (done != NULL)
			done(0, "a load of this model is already in progress",
				m->current != NULL ? m->current->number : 0, arg);
		return 0;
	}
	return queue_load(r, m->name, m->path, m->pin, m->warm, 1, done, arg);
}

int
registry_set_access(struct registry *r, const char *name, int restricted, const uid_t *uids,
	size_t n_uids, const gid_t *gids, size_t n_gids)
{
	struct model_entry *m = registry_entry_named(r, name);
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

/* ---- attaching ---- */

/* May peer attach m? Root and wcached's own user always may. */
static int
peer_allowed(const struct registry_peer *peer, const struct model_entry *m)
{
	if (!m->restricted || peer->uid == 0 || peer->uid == peer->self_uid)
		return 1;
	for (size_t i = 0; i < m->n_allow_uids; i++)
		if (m->allow_uids[i] == peer->uid)
			return 1;
	for (size_t i = 0; i < m->n_allow_gids; i++) {
		if (m->allow_gids[i] == peer->gid)
			return 1;
		for (int k = 0; k < peer->ngroups; k++)
			if (m->allow_gids[i] == peer->groups[k])
				return 1;
	}
	return 0;
}

/* The model name (or path) if peer may use it: 0 and *out, or -ENOENT or
 * -EACCES (counted and logged once per peer) with the client's message. */
static int
find_for_peer(struct registry *r, const char *name, const struct registry_peer *peer,
	struct model_entry **out, char *msg, size_t msg_size)
{
	struct model_entry *m = registry_find(r, name);

	if (m == NULL) {
		snprintf(msg, msg_size, "not served");
		return -ENOENT;
	}
	if (!peer_allowed(peer, m)) {
		m->denied_count++;
		if (peer->denied_logged == NULL || !(*peer->denied_logged)++)
			log_warnx("client pid %d uid %u gid %u: attach of model \"%s\" refused by "
				  "allow_users/allow_groups", (int)peer->pid, (unsigned)peer->uid,
				(unsigned)peer->gid, m->name);
		snprintf(msg, msg_size,
			"access denied: uid %u is not in the model's allow_users or allow_groups",
			(unsigned)peer->uid);
		return -EACCES;
	}
	*out = m;
	return 0;
}

int
registry_attach(struct registry *r, const char *name, const struct registry_peer *peer,
	struct registry_attachment *out, char *msg, size_t msg_size)
{
	struct model_entry *m = NULL;
	struct generation *g;
	int err;

	if ((err = find_for_peer(r, name, peer, &m, msg, msg_size)) < 0)
		return err;
	if ((g = m->current) == NULL) {
		m->error_count++;
		snprintf(msg, msg_size, "failed to load: %s",
			m->error != NULL ? m->error : "unknown error");
		return -EIO;
	}
	if (!gen_attachable(g)) {
		m->error_count++;
		if (g->state == GEN_MODIFIED) {
			snprintf(msg, msg_size,
				"generation %" PRIu64 " was modified in place and is not served; "
				"replace model files with rename(2), then reload", g->number);
			return -ESTALE;
		}
		snprintf(msg, msg_size, "generation %" PRIu64 " failed while warming", g->number);
		return -EIO;
	}
	memset(out, 0, sizeof(*out));
	out->gen = g;
	out->generation = g->number;
	out->index_size = g->index_size;
	out->file_count = (uint32_t)g->source.nfiles;
	out->fds[out->nfds++] = g->index_fd;
	for (size_t i = 0; i < g->source.nfiles && out->nfds < WIRE_MAX_FDS; i++)
		out->fds[out->nfds++] = g->served_fds[i];
	if (m->slot != 0 && r->status_ro_fd >= 0 && out->nfds < WIRE_MAX_FDS) {
		out->status_slot = m->slot;
		out->fds[out->nfds++] = r->status_ro_fd;
	}
	generation_ref(r, g);
	m->attach_count++;
	return 0;
}

/* May the connection conn_id HOLD g now (registry_hold's rules)? 0, or
 * -errno with the client's message naming the model, the generation and
 * why. */
static int
hold_allowed(struct registry *r, const struct model_entry *m, const struct generation *g,
	uint64_t number, uint64_t conn_id, char *msg, size_t msg_size)
{
	/* Only a generation the previous process served: after a cold start
	 * the same number names another generation. */
	if (g == NULL || !g->from_store) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 " was not taken "
			"over from the previous wcached", m->name, number);
		return -ENOENT;
	}
	if (g->hold_until_ms == 0 || registry_now_ms(r) >= g->hold_until_ms) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": the wait for its "
			"holders after the restart has ended (restart_hold_seconds)", m->name,
			number);
		return -ENOENT;
	}
	for (unsigned i = 0; i < g->nhold_conns; i++)
		if (g->hold_conns[i] == conn_id) {
			snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": this "
				"connection has said it holds it already", m->name, number);
			return -EALREADY;
		}
	if (g->nhold_conns >= g->holds_expected) {
		snprintf(msg, msg_size, "model \"%s\": generation %" PRIu64 ": all %u of its "
			"holders before the restart have said so", m->name, number,
			g->holds_expected);
		return -EUSERS;
	}
	return 0;
}

int
registry_hold(struct registry *r, const char *name, uint64_t number,
	const struct registry_peer *peer, struct generation **out, char *msg, size_t msg_size)
{
	struct model_entry *m = NULL;
	struct generation *g;
	uint64_t *conns;
	int err;

	if ((err = find_for_peer(r, name, peer, &m, msg, msg_size)) < 0)
		return err;
	g = registry_generation(r, m, number);
	if ((err = hold_allowed(r, m, g, number, peer->conn_id, msg, msg_size)) < 0)
		return err;
	/* Grows with the HOLDs that come, never past holds_expected. */
	if ((conns = realloc(g->hold_conns, (g->nhold_conns + 1) * sizeof(*conns))) == NULL) {
		snprintf(msg, msg_size, "out of memory");
		return -ENOMEM;
	}
	g->hold_conns = conns;
	conns[g->nhold_conns++] = peer->conn_id;
	/* A reference like an attach's, without an attach's effects: the
	 * worker has its mappings; nothing is warmed or counted. */
	g->attached++;
	*out = g;
	return 0;
}

void
registry_release(struct registry *r, struct generation *g)
{
	generation_unref(r, g);
}

const struct model_entry *
registry_generation_of(const struct generation *g)
{
	return g->model;
}

const char *
registry_model_name(const struct model_entry *m)
{
	return m->name;
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
	/* A stopping daemon whose state is in the manager's store leaves the
	 * page as it is: the next process serves the same generations, and
	 * holders must not see a false stale meanwhile. */
	if (!(r->closing && r->fdstore))
		registry_publish(r, m, 0);
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
		gen_cancel_warming(r, cur);
		gen_maybe_free(r, cur);
	}
	if (pend != NULL) {
		gen_cancel_warming(r, pend);
		gen_maybe_free(r, pend);
	}
}

int
registry_unload(struct registry *r, const char *name)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	log_info("model \"%s\": unloaded", name);
	entry_free(r, m);
	if (r->changed != NULL)
		r->changed(r);
	return 0;
}

int
registry_forget(struct registry *r, const char *name, uint64_t entry_id)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL || m->entry_id != entry_id)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (m->current != NULL || m->pending != NULL || m->loading > 0)
		return error_set(-EBUSY, "model \"%s\" is served or loading", name);
	entry_free(r, m);
	if (r->changed != NULL)
		r->changed(r);
	return 0;
}

void
registry_close(struct registry *r)
{
	__atomic_store_n(&r->closing, 1, __ATOMIC_RELAXED); /* read by page work too */
	r->holds_open = 0;
	r->swapped = NULL;
	r->changed = NULL;
	while (r->models != NULL)
		entry_free(r, r->models);
	/* Clients are gone and the warm pool has delivered every job; page
	 * work still on the work queue frees its generation when it ends. */
	for (struct generation *g = r->generations, *next; g != NULL; g = next) {
		next = g->next;
		g->attached = 0;
		g->warm.pending = 0;
		g->hold_until_ms = 0;
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
			if (!gen_is_warming(g)) {
				*done += g->bytes;
				continue;
			}
			(*warming)++;
			*done += g->warm.bytes;
			for (size_t i = 0; i < g->source.nfiles; i++)
				if (g->warm.jobs[i] != NULL)
					*done += warm_job_bytes(g->warm.jobs[i]);
		}
	}
}
