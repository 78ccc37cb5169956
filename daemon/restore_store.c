/*
 * restore_store.c: keeping the manager's file descriptor store in step
 * with the registry (restore.h): the status page once, each current
 * generation's index and files under its slot's names, the held
 * generations, the derived artifacts of each current generation (derive.h)
 * under names of their own, and a sealed description of it all, replaced
 * whenever it changes (a model whose warm restart check still runs is
 * described as the previous description had it: restore_carried); at
 * shutdown what the manager's full queue refused
 * so far; and the removal of a closed generation's or artifact's
 * descriptors. What fits within the store's limit (restore_store_max) is
 * planned once (store_plan) for the stores and the description alike, and
 * what the plan leaves out leaves the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/fnv.h"
#include "derive.h"
#include "fdstore.h"
#include "generation.h"
#include "log.h"
#include "notify.h"
#include "proto/memfds.h"
#include "restore.h"
#include "restore_internal.h"

struct restore_state restore_state;

_Static_assert((int)GEN_NAMED_UNTOLD == (int)FDSTORE_NAMED_UNRECORDED &&
		(int)GEN_NAMED_DIR == (int)FDSTORE_NAMED_DIR &&
		(int)GEN_NAMED_FILE == (int)FDSTORE_NAMED_FILE,
	"a generation's path_named is what the store records");

/* The store's own descriptors beside the models': the status page and the
 * description (FDSTORE_NAME_STATUS, FDSTORE_NAME_DESC). */
#define STORE_OWN_FDS 2u

/* Where this file's FNV-1a hashes (base/fnv.h) start: FNV's offset basis
 * short of its last digit. Any seed serves hashes compared only within one
 * process, as these are; this one keeps them the values they had. */
#define STORE_HASH_SEED UINT64_C(1469598103934665603)

/* FNV-1a of s, never 0. */
static uint64_t
hash_text(const char *s)
{
	return fnv_mix_string(STORE_HASH_SEED, s) | 1;
}

/* A store the manager's full queue refused is tried again by the next
 * restore_sync() (every 200 ms): logged at debug only. Any other error is
 * a warning once for each different line until the store is in step again
 * (restore_state.logged), then at debug: it is tried again as often. */
static void
log_not_stored(int err, const char *what)
{
	char line[768];
	uint64_t h;

	if (err == -EAGAIN) {
		log_debug("%s: not stored yet: %s", what, error_get());
		return;
	}
	snprintf(line, sizeof(line), "%s is not stored (%s); a restart loads it afresh", what,
		error_get());
	h = hash_text(line);
	for (unsigned i = 0; i < restore_state.nlogged && i < 32; i++)
		if (restore_state.logged[i] == h) {
			log_debug("%s", line);
			return;
		}
	restore_state.logged[restore_state.nlogged++ % 32] = h;
	log_warnx("%s", line);
}

/* Asks the manager to drop the index and the nfiles files of generation
 * number of slot. */
static void
remove_names(unsigned slot, uint64_t number, size_t nfiles)
{
	char name[FDSTORE_MAX_FDNAME + 1];

	if (fdstore_name_index(name, sizeof(name), slot, number) > 0)
		(void)notify_remove_fds(name);
	for (size_t k = 0; k < nfiles; k++)
		if (fdstore_name_file(name, sizeof(name), slot, number, (uint32_t)k) > 0)
			(void)notify_remove_fds(name);
}

/* Asks the manager to drop derived artifact n of slot: its memfd and its
 * index. */
static void
remove_artifact_names(unsigned slot, uint64_t n)
{
	char name[FDSTORE_MAX_FDNAME + 1];

	if (fdstore_name_artifact(name, sizeof(name), slot, n) > 0)
		(void)notify_remove_fds(name);
	if (fdstore_name_artifact_index(name, sizeof(name), slot, n) > 0)
		(void)notify_remove_fds(name);
}

/* Hands the manager g's index and files under slot's names. */
static int
store_generation(struct generation *g, unsigned slot)
{
	char name[FDSTORE_MAX_FDNAME + 1];
	size_t k;

	int err;

	/* What went in stays: the next attempt stores everything again
	 * (the manager keeps one copy of the same open file), and
	 * restore_forget() removes every name of the slot. */
	g->stored_slot = slot;
	if ((err = fdstore_name_index(name, sizeof(name), slot, g->number)) < 0 ||
		(err = notify_store_fds(name, &g->index_fd, 1)) <= 0)
		return err < 0 ? err : -ENOTCONN;
	for (k = 0; k < g->source.nfiles; k++)
		if ((err = fdstore_name_file(name, sizeof(name), slot, g->number,
			(uint32_t)k)) < 0 ||
			(err = notify_store_fds(name, &g->source.files[k].fd, 1)) <= 0)
			return err < 0 ? err : -ENOTCONN;
	g->stored_done = 1;
	return 0;
}

/* Hands the manager artifact g (its memfd, file 0, and its index) under
 * slot's names and an n of its own, kept for its life: a name removed
 * (restore_forget) is never used again by this process. */
static int
store_artifact(struct generation *g, unsigned slot)
{
	char name[FDSTORE_MAX_FDNAME + 1];
	int err;

	if (g->stored_artifact == 0)
		g->stored_artifact = ++restore_state.last_artifact;
	g->stored_slot = slot;
	if ((err = fdstore_name_artifact_index(name, sizeof(name), slot,
		     g->stored_artifact)) < 0 ||
		(err = notify_store_fds(name, &g->index_fd, 1)) <= 0 ||
		(err = fdstore_name_artifact(name, sizeof(name), slot, g->stored_artifact)) < 0 ||
		(err = notify_store_fds(name, &g->source.files[0].fd, 1)) <= 0)
		return err < 0 ? err : -ENOTCONN;
	g->stored_done = 1;
	return 0;
}

/* Is g, not current, a generation its holders still need: stored, open,
 * held or waiting for their HOLDs? */
static int
describe_held(const struct model_entry *m, const struct generation *g)
{
	return g->model == m && g != m->current && g != m->pending && g->stored_done &&
		g->stored_slot == m->slot && g->state != GEN_CLOSED && g->state != GEN_MODIFIED &&
		restore_holders(g) > 0;
}

/* Can m's current generation go to the store: m has a status slot and
 * the generation serves? Whether it fits is store_plan()'s to say. */
static int
current_storable(const struct model_entry *m)
{
	return m->slot != 0 && m->current != NULL && gen_attachable(m->current);
}

/* Is g, a generation or an artifact of m, in the store whole under m's
 * slot? */
static int
stored_whole(const struct model_entry *m, const struct generation *g)
{
	return g->stored_done && g->stored_slot == m->slot;
}

/* The derived artifacts of m that may go to the store (derive_stored_each):
 * those of its current generation, while that one may, that serve, with
 * their builder known (an artifact of an older generation is dropped once
 * nobody holds it: a restarted daemon would only drop it). */
static int
artifact_storable(const struct model_entry *m, const struct derive_stored *a)
{
	return current_storable(m) && a->gen != NULL && a->source == m->current->number &&
		gen_attachable(a->gen) && a->gen->source.nfiles == 1 && a->builder_pid > 0;
}

/* One model of a store_plan, those with a slot in registry order. */
struct plan_model {
	const struct model_entry *m;
	const struct fdstore_model *carried; /* its restore_carried entry, or NULL */
	unsigned ngenerations;               /* taken: current and held */
	unsigned nartifacts;                 /* taken */
};

/*
 * What of the registry the store holds within its limit, decided in one
 * place (store_plan) for both sides: restore_sync() stores only what the
 * plan takes and has the manager drop what it leaves out, and the
 * description (restore_describe) names only what it takes. The manager
 * refuses, without a word, any descriptor past FileDescriptorStoreMax=:
 * with one count for both, the store never needs one more than that, and
 * left_out names exactly what is not stored.
 */
struct store_plan {
	size_t room;                   /* descriptors for the models (store_room) */
	size_t used;                   /* taken so far */
	struct plan_model *models;
	size_t nmodels;
	const struct generation **in;  /* what is taken (generations, artifacts), sorted */
	size_t nin, capin;
	char *left_out;                /* what is not, "" when nothing */
	size_t cap;
	unsigned models_out, held_out, artifacts_out;
	int err;                       /* -ENOMEM */
};

/* Is there room in p for n more descriptors? */
static int
plan_fits(const struct store_plan *p, size_t n)
{
	return p->used <= p->room && n <= p->room - p->used;
}

/* Takes g, of n descriptors, into p (store_plan sorts p->in at the end). */
static int
plan_take(struct store_plan *p, const struct generation *g, size_t n)
{
	if (p->nin == p->capin) {
		size_t cap = p->capin ? 2 * p->capin : 64;
		/* An array of pointers: sizeof(*more) is one pointer.
		 * NOLINTNEXTLINE(bugprone-sizeof-expression) */
		const struct generation **more = realloc(p->in, cap * sizeof(*more));

		if (more == NULL)
			return p->err = -ENOMEM;
		p->in = more;
		p->capin = cap;
	}
	p->in[p->nin++] = g;
	p->used += n;
	return 0;
}

/* Orders generations by address, for plan_has(). */
static int
compare_generations(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(const struct generation *const *)a;
	uintptr_t y = (uintptr_t)*(const struct generation *const *)b;

	return (x > y) - (x < y);
}

/* Did p take g (a generation or an artifact's)? */
static int
plan_has(const struct store_plan *p, const struct generation *g)
{
	if (g == NULL || p->nin == 0)
		return 0;
	/* One pointer each. NOLINTNEXTLINE(bugprone-sizeof-expression) */
	return bsearch(&g, p->in, p->nin, sizeof(*p->in), compare_generations) != NULL;
}

/* m's place in p, or NULL (no slot). */
static struct plan_model *
plan_model_of(const struct store_plan *p, const struct model_entry *m)
{
	for (size_t i = 0; i < p->nmodels; i++)
		if (p->models[i].m == m)
			return &p->models[i];
	return NULL;
}

/* Frees what p holds (not p). */
static void
plan_free(struct store_plan *p)
{
	free(p->models);
	free(p->in);
	p->models = NULL;
	p->in = NULL;
}

/* What the artifact walks below need, and what they found. */
struct artifact_walk {
	const struct model_entry *m;
	struct store_plan *build;       /* store_plan: the plan it makes */
	struct plan_model *pm;          /* store_plan: m's place in it */
	const struct store_plan *plan;  /* the others: the plan made */
	struct registry *r;             /* drop_unplanned */
	struct fdstore_model *dm;       /* describe_planned: where they go */
	uint64_t hash;                  /* describe_hash */
	int pending;                    /* sync_pending: one is not stored yet */
	int err;                        /* describe_planned: -ENOMEM; restore_sync: -EAGAIN */
	int failed;                     /* restore_sync: one was not stored for another error */
};

/* The derive table restore works with (main.c's, through the registry). */
static const struct derive_table *
derive_table_of(const struct registry *r)
{
	return r->derive_owner;
}

/* Appends printf-style text to buf of cap bytes (cut at the end). */
static void
append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* store_plan: takes each storable artifact of m while it fits. */
static void
plan_artifact(const struct derive_stored *a, void *arg)
{
	struct artifact_walk *w = arg;
	struct store_plan *p = w->build;

	if (p->err < 0 || !artifact_storable(w->m, a))
		return;
	if (w->pm->nartifacts >= FDSTORE_MAX_ARTIFACTS || !plan_fits(p, 2)) {
		append(p->left_out, p->cap, "%s\"%.64s\" \"%s\"", p->artifacts_out++ ? ", " :
			(p->left_out[0] != '\0' ? "; derived artifacts left out: " :
						  "derived artifacts left out: "),
			w->m->name, a->key);
		return;
	}
	if (plan_take(p, a->gen, 2) == 0)
		w->pm->nartifacts++;
}

/* restore_sync: stores each artifact the plan takes not yet stored, until
 * the manager's queue is full (w->err); one refused otherwise is left out
 * (w->failed) and the others go on. */
static void
sync_artifact(const struct derive_stored *a, void *arg)
{
	struct artifact_walk *w = arg;
	char what[256];
	int err;

	if (w->err < 0 || !plan_has(w->plan, a->gen) || a->gen->stored_done)
		return;
	if ((err = store_artifact(a->gen, w->m->slot)) < 0) {
		snprintf(what, sizeof(what), "model \"%.64s\": derived \"%s\" of generation %"
			PRIu64, w->m->name, a->key, a->source);
		log_not_stored(err, what);
		if (err == -EAGAIN)
			w->err = err;
		else
			w->failed = 1;
	}
}

/* drop_unplanned: has the manager drop an artifact in the store that the
 * plan leaves out. */
static void
drop_artifact(const struct derive_stored *a, void *arg)
{
	struct artifact_walk *w = arg;

	if (a->gen != NULL && a->gen->stored_slot != 0 && !plan_has(w->plan, a->gen))
		restore_forget(w->r, a->gen);
}

/* Fills da from artifact a of m, stored under m's slot. */
static int
describe_artifact(struct fdstore_artifact *da, const struct model_entry *m,
	const struct derive_stored *a)
{
	char name[FDSTORE_MAX_FDNAME + 1];
	const struct generation *g = a->gen;
	double ms = a->build_seconds * 1000.0;

	da->source = a->source;
	da->size = (uint64_t)g->source.files[0].st.st_size;
	da->index_size = g->index_size;
	da->builder_uid = (uint32_t)a->builder_uid;
	da->builder_pid = (uint32_t)a->builder_pid;
	da->build_ms = ms > 0 && ms < 1e18 ? (uint64_t)ms : 0;
	/* (gid_t)-1: not known (taken back from a version 6 store), which
	 * FDSTORE_GID_UNRECORDED says again. */
	da->builder_gid = (uint32_t)a->builder_cred.gid;
	da->builder_ngroups = a->builder_cred.ngroups;
	if (da->builder_gid == FDSTORE_GID_UNRECORDED)
		da->builder_ngroups = 0;
	if (da->builder_ngroups > FDSTORE_MAX_BUILDER_GROUPS)
		da->builder_ngroups = FDSTORE_MAX_BUILDER_GROUPS;
	if (da->builder_ngroups > 0) {
		if ((da->builder_groups = malloc(da->builder_ngroups *
			     sizeof(*da->builder_groups))) == NULL) {
			da->builder_ngroups = 0;
			return -ENOMEM;
		}
		for (uint32_t k = 0; k < da->builder_ngroups; k++)
			da->builder_groups[k] = (uint32_t)a->builder_cred.groups[k];
	}
	if ((da->key = strdup(a->key)) == NULL ||
		fdstore_name_artifact(name, sizeof(name), m->slot, g->stored_artifact) < 0 ||
		(da->fdname = strdup(name)) == NULL ||
		fdstore_name_artifact_index(name, sizeof(name), m->slot, g->stored_artifact) < 0 ||
		(da->index_fdname = strdup(name)) == NULL)
		return -ENOMEM;
	return 0;
}

/* describe_planned: each artifact the plan takes, once in the store. */
static void
describe_artifact_cb(const struct derive_stored *a, void *arg)
{
	struct artifact_walk *w = arg;
	struct fdstore_model *dm = w->dm;
	struct fdstore_artifact *more;
	const struct generation *g = a->gen;

	if (w->err < 0 || !plan_has(w->plan, g) || !stored_whole(w->m, g) ||
		g->stored_artifact == 0)
		return;
	if ((more = realloc(dm->artifacts, (dm->nartifacts + 1) * sizeof(*more))) == NULL) {
		w->err = -ENOMEM;
		return;
	}
	dm->artifacts = more;
	memset(&more[dm->nartifacts], 0, sizeof(*more));
	if (describe_artifact(&more[dm->nartifacts++], w->m, a) < 0)
		w->err = -ENOMEM;
}

/* describe_hash: what of each artifact the description depends on. */
static void
hash_artifact(const struct derive_stored *a, void *arg)
{
	struct artifact_walk *w = arg;
	uint64_t v[4];

	if (!artifact_storable(w->m, a))
		return;
	v[0] = w->m->entry_id;
	v[1] = a->gen->stored_artifact;
	v[2] = a->source;
	v[3] = (uint64_t)a->gen->stored_done;
	w->hash = fnv_mix_words(w->hash, v, 4);
}

/* sync_pending: does the plan take an artifact not yet stored? */
static void
pending_artifact(const struct derive_stored *a, void *arg)
{
	struct artifact_walk *w = arg;

	if (plan_has(w->plan, a->gen) && !a->gen->stored_done)
		w->pending = 1;
}

/* Calls fn for each artifact of m, when there is a derive table. */
static void
walk_artifacts(const struct registry *r, const struct model_entry *m,
	void (*fn)(const struct derive_stored *, void *), struct artifact_walk *w)
{
	w->m = m;
	if (derive_table_of(r) != NULL)
		derive_stored_each(derive_table_of(r), m, fn, w);
}

/*
 * The stat to describe of f, a file a generation loaded (f->st: the load's
 * fstat) and holds open: with the open file's link count and ctime now
 * where a running wcached takes it for unchanged (its inode, size and
 * mtime the load's, its ctime moved only with its link count:
 * file_written_in_place, base/file.h), as a link added beside it or
 * removed while wcached ran leaves it. The next start compares them with
 * what it finds (file_changed; a model left out of the store takes its
 * kept files only at their recorded ctime, where others may rename beside
 * them), and the load's ctime made it wait for the operator (h294). Else
 * (a write in place, the file removed, closed) the load's, so that the
 * next start sees the change. Only the attributes the kernel has
 * (AT_STATX_DONT_SYNC: on the loop, no server is asked). 1 where it
 * differs from the load's, else 0.
 */
static int
described_stat(const struct wc_file *f, struct stat *out)
{
	const unsigned want = STATX_NLINK | STATX_CTIME | STATX_SIZE | STATX_MTIME | STATX_INO;
	struct statx sx;
	struct stat now;

	*out = f->st;
	if (f->path == NULL || f->fd < 0 ||
		statx(f->fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, want, &sx) == -1 ||
		(sx.stx_mask & want) != want || sx.stx_nlink == 0)
		return 0;
	now = f->st;
	now.st_nlink = (nlink_t)sx.stx_nlink;
	now.st_size = (off_t)sx.stx_size;
	now.st_mtim = (struct timespec){ sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec };
	now.st_ctim = (struct timespec){ sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec };
	if ((uint64_t)sx.stx_ino != (uint64_t)f->st.st_ino ||
		makedev(sx.stx_dev_major, sx.stx_dev_minor) != f->st.st_dev ||
		file_written_in_place(&f->st, &now))
		return 0;
	out->st_nlink = now.st_nlink;
	out->st_ctim = now.st_ctim;
	return out->st_nlink != f->st.st_nlink ||
		file_time_ns(&out->st_ctim) != file_time_ns(&f->st.st_ctim);
}

/* g, its model's current generation, asked that its files be loaded again
 * after a links-only move (gen_note_relinked), and that reload has not
 * answered: its files are described with the load's fstat (not
 * described_stat's), so that the next start sees the link count moved
 * and loads them again, validated anew (restore_check.c's file_changed,
 * restore_job.c). With the moved link count and ctime it restored g "not
 * read again", and nothing asked again: a header written behind the link
 * served for good (review rev227 M1). */
static int
revalidation_pending(const struct generation *g)
{
	return g->model != NULL && g->model->current == g && g->relink_asked &&
		g->model->revalidate == g->number;
}

/* Fills dg from g of m, stored under m's slot, in role. */
static int
describe_generation(struct fdstore_generation *dg, const struct model_entry *m,
	const struct generation *g, uint8_t role)
{
	char name[FDSTORE_MAX_FDNAME + 1];

	dg->number = g->number;
	dg->role = role;
	dg->pin = role == FDSTORE_CURRENT ? (uint8_t)m->pin : (uint8_t)PIN_NONE;
	dg->holders = restore_holders(g);
	/* And whose they are: the next process accepts each uid's HOLDs up
	 * to its count, none from another uid (review rev173 F10). */
	if (restore_holder_uids(g, &dg->uids, &dg->nuids) < 0)
		return -ENOMEM;
	/* What its path named (version 10: a restart may find the path
	 * moved, review rev215 H1). */
	dg->named = (uint8_t)g->path_named;
	dg->index_size = g->index_size;
	dg->nfiles = (uint32_t)g->source.nfiles;
	if (fdstore_name_index(name, sizeof(name), m->slot, g->number) < 0 ||
		(dg->index_fdname = strdup(name)) == NULL ||
		(dg->files = calloc(g->source.nfiles ? g->source.nfiles : 1, sizeof(*dg->files))) ==
			NULL)
		return -ENOMEM;
	for (size_t k = 0; k < g->source.nfiles; k++) {
		struct stat now;
		const struct stat *st = &now;
		struct fdstore_file *f = &dg->files[k];

		if (role == FDSTORE_CURRENT && revalidation_pending(g))
			now = g->source.files[k].st;
		else
			(void)described_stat(&g->source.files[k], &now);
		if (fdstore_name_file(name, sizeof(name), m->slot, g->number, (uint32_t)k) < 0 ||
			(f->fdname = strdup(name)) == NULL)
			return -ENOMEM;
		f->dev = (uint64_t)st->st_dev;
		f->ino = (uint64_t)st->st_ino;
		f->size = (uint64_t)st->st_size;
		f->mtime_ns = file_time_ns(&st->st_mtim);
		/* The ctime too: a write in place whose writer put the mtime
		 * back moves it. nlink 0 would say "not recorded". */
		f->nlink = (uint64_t)st->st_nlink;
		if (f->nlink != 0)
			f->ctime_ns = file_time_ns(&st->st_ctim);
		/* A staged copy: which file it was copied from, so that the next
		 * process restores it only while that file is still there,
		 * unchanged (its ctime). */
		if (g->origin != NULL && k < g->norigin) {
			f->origin_dev = (uint64_t)g->origin[k].st.st_dev;
			f->origin_ino = (uint64_t)g->origin[k].st.st_ino;
			if (f->nlink != 0)
				f->origin_ctime_ns = file_time_ns(&g->origin[k].st.st_ctim);
		}
	}
	return 0;
}

/* Descriptors g takes in the store: its index and its files. */
static size_t
generation_fds(const struct generation *g)
{
	return 1 + g->source.nfiles;
}

static void
append(char *buf, size_t cap, const char *fmt, ...)
{
	size_t len = strnlen(buf, cap);
	va_list ap;

	if (len + 1 >= cap)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, cap - len, fmt, ap);
	va_end(ap);
}

/* The previous description's entry of m while a warm restart's check of
 * m runs and the registry still expects m, else NULL (restore_carried). */
static const struct fdstore_model *
carried(const struct model_entry *m)
{
	for (size_t i = 0; i < restore_state.ncarried; i++) {
		const struct restore_carried *c = &restore_state.carried[i];

		if (strcmp(c->model->name, m->name) == 0)
			return m->current == NULL && m->load_id == c->expected &&
					m->slot == c->model->slot ? c->model : NULL;
	}
	return NULL;
}

/*
 * Plans what of r goes to the store within room descriptors (struct
 * store_plan; plan_free it, also after a failure): first what the models
 * whose warm restart check still runs hold there already (restore_carried:
 * the store keeps it, taken or not, so it counts whatever else fits); then
 * each storable current generation in registry order while they fit (a
 * model whose generation does not is left out whole: it keeps its slot and
 * numbers, and loads afresh); then the held generations, newest first,
 * while they fit (from the first that does not, every older one is left
 * out) and FDSTORE_MAX_GENERATIONS of a model allow (its older ones are
 * left out); then the derived artifacts of each current generation taken,
 * while they fit and FDSTORE_MAX_ARTIFACTS allow. left_out (cap bytes)
 * says what was left out. 0, or -ENOMEM.
 */
static int
store_plan(const struct registry *r, size_t room, struct store_plan *p, char *left_out,
	size_t cap)
{
	size_t n = 0;
	int full = 0;

	memset(p, 0, sizeof(*p));
	p->room = room;
	p->left_out = left_out;
	p->cap = cap;
	left_out[0] = '\0';
	for (const struct model_entry *m = r->models; m != NULL; m = m->next)
		n += m->slot != 0;
	if (n > 0 && (p->models = calloc(n, sizeof(*p->models))) == NULL)
		return -ENOMEM;
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct plan_model *pm;

		if (m->slot == 0)
			continue;
		pm = &p->models[p->nmodels++];
		pm->m = m;
		if ((pm->carried = carried(m)) != NULL)
			p->used += fdstore_model_fds(pm->carried);
	}
	for (size_t i = 0; i < p->nmodels; i++) {
		struct plan_model *pm = &p->models[i];
		const struct model_entry *m = pm->m;

		if (pm->carried != NULL || !current_storable(m))
			continue;
		if (!plan_fits(p, generation_fds(m->current))) {
			append(left_out, cap, "%s\"%.64s\"",
				p->models_out++ ? ", " : "models left out whole: ", m->name);
			continue;
		}
		if (plan_take(p, m->current, generation_fds(m->current)) < 0)
			return p->err;
		pm->ngenerations = 1;
	}
	for (const struct generation *g = r->generations; g != NULL; g = g->next) {
		struct plan_model *pm;

		if (g->model == NULL || !describe_held(g->model, g) ||
			(pm = plan_model_of(p, g->model)) == NULL || pm->ngenerations == 0)
			continue;
		if (full || pm->ngenerations >= FDSTORE_MAX_GENERATIONS ||
			!plan_fits(p, generation_fds(g))) {
			append(left_out, cap, "%s\"%.64s\" %" PRIu64, p->held_out++ ? ", " :
				(p->models_out ? "; held generations left out: " :
						 "held generations left out: "),
				g->model->name, g->number);
			/* Past the descriptors, every older one; past one model's
			 * generations, that model's older ones (pm stays full). */
			full |= pm->ngenerations < FDSTORE_MAX_GENERATIONS;
			continue;
		}
		if (plan_take(p, g, generation_fds(g)) < 0)
			return p->err;
		pm->ngenerations++;
	}
	for (size_t i = 0; i < p->nmodels; i++) {
		struct artifact_walk w = { .build = p, .pm = &p->models[i] };

		if (p->models[i].ngenerations == 0)
			continue;
		walk_artifacts(r, p->models[i].m, plan_artifact, &w);
		if (p->err < 0)
			return p->err;
	}
	if (p->nin > 1)
		/* NOLINTNEXTLINE(bugprone-sizeof-expression): one pointer each */
		qsort(p->in, p->nin, sizeof(*p->in), compare_generations);
	return 0;
}

/* The wait dm records (fdstore.h: waits): m's files wait for the
 * operator's `wcachectl reload NAME` (refused_tree), or the model is still
 * the previous description's carried one, whose wait its check keeps.
 * 0 or -ENOMEM. */
static int
describe_wait(struct fdstore_model *dm, const struct model_entry *m,
	const struct fdstore_model *carried)
{
	const char *line = m->refused_tree ? m->refused_line : NULL;

	if (m->refused_tree && (line == NULL || line[0] == '\0'))
		line = "its files wait for the operator's `wcachectl reload`";
	if (line == NULL && carried != NULL)
		line = carried->waits;
	if (line == NULL)
		return 0;
	return (dm->waits = strndup(line, FDSTORE_MAX_WAIT_LINE)) != NULL ? 0 : -ENOMEM;
}

/* What a load of m that wcached makes by itself is judged against, as
 * registry_load.c's keep_tree takes it: the tree its newest generation was
 * loaded from, else the tree and place the operator's last load found
 * (operator_tree). 1 and *t (pointing into m), or 0: none known. */
static int
judged_tree(const struct model_entry *m, struct registry_tree *t)
{
	const struct generation *g = m->pending != NULL ? m->pending : m->current;

	if (g != NULL && g->tree_root != NULL) {
		*t = (struct registry_tree){ .root = g->tree_root, .uid = g->tree_uid,
			.root_known = g->tree_ino_known, .root_dev = g->tree_dev,
			.root_ino = g->tree_ino };
		return 1;
	}
	if (m->operator_tree.root == NULL)
		return 0;
	*t = (struct registry_tree){ .root = m->operator_tree.root,
		.uid = m->operator_tree.uid, .root_known = m->operator_tree.root_known,
		.root_dev = m->operator_tree.root_dev, .root_ino = m->operator_tree.root_ino,
		.place = m->operator_tree.place, .place_mode = m->operator_tree.place_mode,
		.place_dir_len = m->operator_tree.place_dir_len };
	return 1;
}

/* Whether a path may be described (fdstore_check's rules): absolute, 1
 * .. FDSTORE_MAX_PATH bytes. */
static int
describable(const char *path)
{
	return path != NULL && path[0] == '/' && strlen(path) <= FDSTORE_MAX_PATH;
}

/* The tree dm records (fdstore.h: tree): m's (judged_tree), or, for the
 * previous description's carried model, whose check has not ended, its
 * own, its kept files with it (room: what FDSTORE_MAX_KEPT_ALL leaves). A
 * root or place that cannot be described is not: nothing is recorded. 0
 * or -ENOMEM. */
static int
describe_tree(struct fdstore_model *dm, const struct model_entry *m,
	const struct fdstore_model *carried, size_t *room)
{
	struct fdstore_tree *dt = &dm->tree;
	struct registry_tree t;
	int carried_tree = 0;

	if (!judged_tree(m, &t)) {
		if (carried == NULL || carried->tree.root == NULL)
			return 0;
		carried_tree = 1;
		t = (struct registry_tree){ .root = carried->tree.root, .uid = carried->tree.uid,
			.root_known = carried->tree.root_known,
			.root_dev = (dev_t)carried->tree.root_dev,
			.root_ino = (ino_t)carried->tree.root_ino, .place = carried->tree.place,
			.place_mode = carried->tree.place_mode,
			.place_dir_len = carried->tree.place_dir_len };
	}
	if (!describable(t.root) || (t.place != NULL && !describable(t.place)))
		return 0;
	if ((dt->root = strdup(t.root)) == NULL ||
		(t.place != NULL && (dt->place = strdup(t.place)) == NULL))
		return -ENOMEM;
	dt->uid = (uint32_t)t.uid;
	dt->root_known = t.root_known != 0;
	dt->root_dev = dt->root_known ? (uint64_t)t.root_dev : 0;
	dt->root_ino = dt->root_known ? (uint64_t)t.root_ino : 0;
	if (dt->place != NULL) {
		size_t len = strlen(dt->place);

		dt->place_mode = (uint32_t)(t.place_mode & 07777);
		dt->place_dir_len = (uint32_t)(t.place_dir_len < len ? t.place_dir_len : len);
	}
	if (carried_tree && carried->tree.nkept > 0 && carried->tree.nkept <= *room) {
		if ((dt->kept = malloc(carried->tree.nkept * sizeof(*dt->kept))) == NULL)
			return -ENOMEM;
		memcpy(dt->kept, carried->tree.kept, carried->tree.nkept * sizeof(*dt->kept));
		dt->nkept = carried->tree.nkept;
		dt->named = carried->tree.named;
		*room -= dt->nkept;
	}
	return 0;
}

/* dt's kept files (fdstore.h: tree's kept) from k, at most room of them
 * (else none: FDSTORE_MAX_KEPT_ALL), with what its path named where k's
 * load told it. 0 or -ENOMEM. */
static int
describe_kept_files(struct fdstore_tree *dt, const struct registry_kept_files *k,
	size_t *room)
{
	if (k->nfiles == 0 || k->nfiles > FDSTORE_MAX_KEPT || k->nfiles > *room)
		return 0;
	if ((dt->kept = calloc(k->nfiles, sizeof(*dt->kept))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < k->nfiles; i++)
		dt->kept[i] = (struct fdstore_kept){ .uid = (uint32_t)k->owners[i],
			.dev = (uint64_t)k->ids[i].dev, .ino = (uint64_t)k->ids[i].ino,
			.ctime_ns = k->ids[i].ctime_ns };
	dt->nkept = (uint32_t)k->nfiles;
	dt->named = !k->named_told ? FDSTORE_NAMED_UNRECORDED :
		k->named_file ? FDSTORE_NAMED_FILE : FDSTORE_NAMED_DIR;
	*room -= k->nfiles;
	return 0;
}

/*
 * The files dm's tree kept (fdstore.h: tree's kept) where dm, m's
 * description, holds no generation (none fitted in the store, its store
 * failed, or nothing serves m): those of the generation whose tree it
 * records (judged_tree: m's newest), else those its operator_tree kept (a
 * withdrawn generation's, a restart's), as a watched reload keeps them
 * (keep_tree), for the next start's reload of m (review rev209 M1: they
 * were lost, and its owners untold made it wait wherever others may write
 * beside its files). room: what FDSTORE_MAX_KEPT_ALL leaves. 0 or -ENOMEM.
 */
static int
describe_kept(struct fdstore_model *dm, const struct model_entry *m, size_t *room)
{
	const struct generation *g = m->pending != NULL ? m->pending : m->current;
	struct registry_kept_files k;
	int err;

	if (dm->ngenerations > 0 || dm->tree.root == NULL || dm->tree.nkept > 0)
		return 0;
	if (g == NULL || g->tree_root == NULL)
		return describe_kept_files(&dm->tree, &m->operator_tree.kept, room);
	if (registry_kept_of(g, &k) < 0)
		return -ENOMEM;
	/* A file's ctime as describe_generation records it (described_stat):
	 * the open file's; a staged copy's kept files are its origin's. */
	for (size_t i = 0; g->origin == NULL && i < g->source.nfiles && i < k.nfiles; i++) {
		struct stat now;

		(void)described_stat(&g->source.files[i], &now);
		k.ids[i].ctime_ns = file_time_ns(&now.st_ctim);
	}
	err = describe_kept_files(&dm->tree, &k, room);
	registry_kept_clear(&k);
	return err;
}

/*
 * The description of what p takes that the manager has whole (a current
 * generation whose store failed is described without it: that model loads
 * afresh): every model with a slot, a carried one as the previous
 * description had it. 0 and *out, or -ENOMEM.
 */
static int
describe_planned(const struct registry *r, const struct store_plan *p, struct fdstore_desc **out)
{
	struct fdstore_desc *d = calloc(1, sizeof(*d));
	size_t kept_room = FDSTORE_MAX_KEPT_ALL;

	if (d == NULL)
		return -ENOMEM;
	d->status_size = STATUS_PAGE_BYTES;
	if (p->nmodels > 0 && (d->models = calloc(p->nmodels, sizeof(*d->models))) == NULL)
		goto fail;
	for (size_t i = 0; i < p->nmodels; i++) {
		const struct model_entry *m = p->models[i].m;
		struct fdstore_model *dm = &d->models[d->nmodels++];

		if ((dm->name = strdup(m->name)) == NULL || (dm->path = strdup(m->path)) == NULL)
			goto fail;
		dm->slot = m->slot;
		dm->last_generation = m->last_generation;
		if (describe_wait(dm, m, p->models[i].carried) < 0 ||
			describe_tree(dm, m, p->models[i].carried, &kept_room) < 0)
			goto fail;
		if (p->models[i].carried != NULL) {
			if (fdstore_carry(dm, p->models[i].carried) < 0)
				goto fail;
			continue;
		}
		if (!plan_has(p, m->current) || !stored_whole(m, m->current)) {
			if (describe_kept(dm, m, &kept_room) < 0)
				goto fail;
			continue;
		}
		if ((dm->generations = calloc(1, sizeof(*dm->generations))) == NULL ||
			describe_generation(&dm->generations[0], m, m->current,
				FDSTORE_CURRENT) < 0)
			goto fail;
		dm->ngenerations = 1;
	}
	/* The held ones the plan takes, of the models described with their
	 * current generation, newest first. */
	for (const struct generation *g = r->generations; g != NULL; g = g->next) {
		const struct plan_model *pm;
		struct fdstore_model *dm;
		struct fdstore_generation *more;

		if (g->model == NULL || g == g->model->current || !plan_has(p, g) ||
			!stored_whole(g->model, g) || (pm = plan_model_of(p, g->model)) == NULL ||
			pm->carried != NULL)
			continue;
		dm = &d->models[pm - p->models];
		if (dm->ngenerations == 0)
			continue;
		if ((more = realloc(dm->generations,
			(dm->ngenerations + 1) * sizeof(*more))) == NULL)
			goto fail;
		dm->generations = more;
		memset(&more[dm->ngenerations], 0, sizeof(*more));
		if (describe_generation(&more[dm->ngenerations++], g->model, g, FDSTORE_HELD) < 0)
			goto fail;
	}
	for (size_t i = 0; i < p->nmodels; i++) {
		struct artifact_walk w = { .plan = p, .dm = &d->models[i] };

		if (d->models[i].ngenerations == 0 || p->models[i].carried != NULL)
			continue;
		walk_artifacts(r, p->models[i].m, describe_artifact_cb, &w);
		if (w.err < 0)
			goto fail;
	}
	*out = d;
	return 0;
fail:
	fdstore_free(d);
	return -ENOMEM;
}

int
restore_describe(const struct registry *r, size_t max_fds, struct fdstore_desc **out,
	char *left_out, size_t cap)
{
	struct store_plan p;
	int err;

	if ((err = store_plan(r, max_fds, &p, left_out, cap)) == 0)
		err = describe_planned(r, &p, out);
	plan_free(&p);
	return err < 0 ? error_set(err, "out of memory") : 0;
}

/* The descriptors the store keeps for the models: its limit
 * (restore_store_max) less the status page and the description. */
static size_t
store_room(void)
{
	size_t max = restore_store_max();

	return max > STORE_OWN_FDS ? max - STORE_OWN_FDS : 0;
}

/* Logs what the plan leaves out to stay within the store's limit, once
 * for each different report (restore_sync runs again every 200 ms while
 * the manager's queue is full). */
static void
log_left_out(const char *left_out)
{
	static char logged[1024];

	if (strcmp(left_out, logged) == 0)
		return;
	snprintf(logged, sizeof(logged), "%s", left_out);
	if (left_out[0] != '\0')
		log_warnx("warm restart: the file descriptor store holds at most %zu "
			  "descriptors (FileDescriptorStoreMax=), the status page and the "
			  "description among them, and a model at most %u generations; not "
			  "stored: %s; a restart loads them afresh or does not restore them (a "
			  "model left out whole loads as a reload wcached makes by itself, judged "
			  "against the tree and files the description records: raise "
			  "FileDescriptorStoreMax= in the unit)",
			restore_store_max(), FDSTORE_MAX_GENERATIONS, left_out);
}

/* Encodes what p takes and stores it in place of the previous description. */
static int
store_description(struct registry *r, const struct store_plan *p)
{
	struct fdstore_desc *d = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	int fd = -1, err;

	if ((err = describe_planned(r, p, &d)) < 0 ||
		(err = fdstore_encode(d, &buf, &len)) < 0 ||
		(err = fdstore_memfd_make(buf, len, &fd)) < 0)
		goto out;
	/* Removed once: a retry after a refused store must not remove
	 * again behind a removal still kept. Only a removal sent or kept
	 * (notify.h: never dropped for a full queue) counts: after one that
	 * failed the old description is still in the store, and a second one
	 * beside it would make the next start refuse both. */
	if (restore_state.desc_in_store) {
		if ((err = notify_remove_fds(FDSTORE_NAME_DESC)) < 0) {
			close(fd);
			goto out;
		}
		restore_state.desc_in_store = 0;
	}
	/* A removal kept goes first, and the store waits (-EAGAIN) while it
	 * does: it reaches the manager before the new description. */
	if ((err = notify_store_fds(FDSTORE_NAME_DESC, &fd, 1)) > 0)
		restore_state.desc_in_store = 1;
	close(fd);
out:
	if (err == -ENOMEM)
		error_set(-ENOMEM, "out of memory");
	if (err < 0)
		log_not_stored(err, "warm restart: the registry's description");
	free(buf);
	fdstore_free(d);
	return err < 0 ? err : 0;
}

/* h with g's holders (restore_holders) and how they split by uid
 * (restore_holder_uids: its workers' references, its places not yet
 * taken), hashed (FNV-1a): a uid's release and another's attach change
 * the description, not the count. */
static uint64_t
hash_holders(uint64_t h, const struct generation *g)
{
	h = fnv_mix(h, restore_holders(g));
	h = fnv_mix(h, (uint64_t)g->holders_lost);
	for (unsigned i = 0; i < g->nholders; i++) {
		h = fnv_mix(h, g->holders[i].uid);
		h = fnv_mix(h, g->holders[i].count);
	}
	for (unsigned i = 0; g->hold_until_ms != 0 && i < g->nhold_places; i++) {
		h = fnv_mix(h, g->hold_places[i].uid);
		h = fnv_mix(h, g->hold_places[i].count - g->hold_places[i].taken);
	}
	return h;
}

/* What the description depends on, hashed (FNV-1a), so that progress
 * events do not rewrite it: everything describe_generation() and
 * restore_describe() write of a model, its pin, path and wait included (a pin
 * changed by a reload or wcachectl pin makes no new generation, and a
 * description that kept the old one would make the next start compare
 * against it). Never 0. */
/* h with m's judged_tree hashed in: the operator's load that failed (and
 * so made no generation) changes what the description records; and what
 * its kept files come from (describe_kept): its newest generation, or
 * operator_tree's (a withdrawal, a restart). */
static uint64_t
hash_tree(uint64_t h, const struct model_entry *m)
{
	const struct generation *g = m->pending != NULL ? m->pending : m->current;
	const struct registry_kept_files *k = &m->operator_tree.kept;
	struct registry_tree t;

	if (!judged_tree(m, &t))
		return fnv_mix(h, 0x7e);
	uint64_t v[8] = { t.uid, (uint64_t)t.root_known, (uint64_t)t.root_dev,
		(uint64_t)t.root_ino, ((uint64_t)t.place_mode << 32) | t.place_dir_len,
		g != NULL ? g->number : 0, g != NULL ? (uint64_t)g->path_named : 0,
		((uint64_t)k->nfiles << 2) | (uint64_t)(k->named_told << 1) |
			(uint64_t)k->named_file };

	h = fnv_mix_words(h, v, 8);
	for (size_t i = 0; i < k->nfiles; i++) {
		h = fnv_mix(h, (uint64_t)k->owners[i]);
		h = fnv_mix(h, (uint64_t)k->ids[i].ino);
		h = fnv_mix(h, (uint64_t)k->ids[i].ctime_ns);
	}
	h = fnv_mix_string(h, t.root);
	return t.place != NULL ? fnv_mix_string(h, t.place) : h;
}

/* Set by restore_stopping(): the last description counts the files' link
 * counts and ctimes now (hash_described_stats). */
static int stopping;

/* h with what described_stat() finds moved of each open file of r's
 * generations, while stopping only: a link added or removed beside a
 * served file changes no generation, so nothing would describe it again
 * before the stop (h294); checked once at the stop, not at every progress
 * event. Unmoved files add nothing, so an unchanged registry keeps its
 * hash. */
static uint64_t
hash_described_stats(uint64_t h, const struct registry *r)
{
	for (const struct generation *g = r->generations; stopping && g != NULL; g = g->next) {
		for (size_t k = 0; g->model != NULL && k < g->source.nfiles; k++) {
			struct stat now;

			/* A pending revalidation's load fstat counts too: a
			 * description written while it ran may hold the move. */
			if (revalidation_pending(g))
				now = g->source.files[k].st;
			else if (!described_stat(&g->source.files[k], &now))
				continue;
			uint64_t v[4] = { g->model->entry_id, g->number, k,
				(uint64_t)file_time_ns(&now.st_ctim) ^ (uint64_t)now.st_nlink };

			h = fnv_mix_words(h, v, 4);
		}
	}
	return h;
}

static uint64_t
describe_hash(const struct registry *r)
{
	uint64_t h = hash_described_stats(STORE_HASH_SEED, r);

	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		const struct generation *g = m->current;
		uint64_t v[10] = { m->entry_id, m->slot, m->last_generation, g ? g->number : 0,
			g ? (uint64_t)g->stored_done : 0, g ? (uint64_t)gen_attachable(g) : 0,
			(uint64_t)(carried(m) != NULL), (uint64_t)m->pin,
			(uint64_t)m->refused_tree, g ? (uint64_t)g->path_named : 0 };

		h = fnv_mix_words(h, v, 10);
		if (g != NULL)
			h = hash_holders(h, g);
		if (m->path != NULL)
			h = fnv_mix_string(h, m->path);
		if (m->refused_tree && m->refused_line != NULL)
			h = fnv_mix_string(h, m->refused_line);
		h = hash_tree(h, m);
	}
	/* The held generations described with them. */
	for (const struct generation *g = r->generations; g != NULL; g = g->next) {
		if (g->model == NULL || !describe_held(g->model, g))
			continue;
		uint64_t v[2] = { g->model->entry_id, g->number };

		h = fnv_mix_words(h, v, 2);
		h = hash_holders(h, g);
	}
	/* The derived artifacts described with them. */
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct artifact_walk w = { .hash = h };

		walk_artifacts(r, m, hash_artifact, &w);
		h = w.hash;
	}
	return h | 1;
}

/*
 * Has the manager drop every generation and artifact in its store that p
 * leaves out (restore_forget; a name dropped is stored again if it fits
 * later): a current generation that no longer fits, a held one left out,
 * one that no longer serves. Nothing would describe them, and each would
 * count against FileDescriptorStoreMax= all the same.
 */
static void
drop_unplanned(struct registry *r, const struct store_plan *p)
{
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->stored_slot != 0 && !plan_has(p, g))
			restore_forget(r, g);
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct artifact_walk w = { .plan = p, .r = r };

		walk_artifacts(r, m, drop_artifact, &w);
	}
}

/* Hands the manager what the plan takes that is not in its store yet,
 * after dropping what it leaves out (restore.h). A full queue stops the
 * round (everything again later); any other error leaves out only what it
 * hit: the other generations, the artifacts and the description still go. */
void
restore_sync(struct registry *r)
{
	struct store_plan p;
	char what[128], left_out[1024];
	uint64_t h;
	int err, failed = 0;

	if (!r->fdstore || restore_state.restoring || r->closing)
		return;
	/* Removals wait in the queue: they go first (see store_description). */
	if (notify_flush() == 0)
		return;

	if (!restore_state.status_stored) {
		if ((err = notify_store_fds(FDSTORE_NAME_STATUS, &r->page.fd, 1)) > 0)
			restore_state.status_stored = 1;
		else if (err < 0) {
			log_not_stored(err, "warm restart: the status page");
			return; /* the generations need it: all of them again later */
		}
	}
	if (store_plan(r, store_room(), &p, left_out, sizeof(left_out)) < 0) {
		error_set(-ENOMEM, "out of memory");
		log_not_stored(-ENOMEM, "warm restart: the registry's description");
		goto out;
	}
	log_left_out(left_out);
	/* Removals reach the manager before the stores that follow (notify.h),
	 * so that the store never holds more than its limit. */
	drop_unplanned(r, &p);
	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct generation *g = m->current;

		if (!plan_has(&p, g) || g->stored_done)
			continue;
		if ((err = store_generation(g, m->slot)) < 0) {
			snprintf(what, sizeof(what), "model \"%.64s\": generation %" PRIu64,
				m->name, g->number);
			log_not_stored(err, what);
			/* Described without it (it is not stored_done): a
			 * restart loads that model afresh, not every model. */
			if (err == -EAGAIN)
				goto out;
			failed = 1;
		}
	}
	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct artifact_walk w = { .plan = &p };

		walk_artifacts(r, m, sync_artifact, &w);
		if (w.err < 0)
			goto out;
		failed |= w.failed;
	}
	if ((h = describe_hash(r)) != restore_state.described) {
		if (store_description(r, &p) == 0)
			restore_state.described = h;
		else
			failed = 1;
	}
	/* In step: an error from now on is news again. */
	if (!failed)
		restore_state.nlogged = 0;
out:
	plan_free(&p);
}

/* Is anything not yet in the store that restore_sync() would store? */
static int
sync_pending(const struct registry *r)
{
	struct store_plan p;
	char left_out[1024];
	int pending = 0;

	if (!restore_state.status_stored || describe_hash(r) != restore_state.described)
		return 1;
	if (store_plan(r, store_room(), &p, left_out, sizeof(left_out)) < 0) {
		plan_free(&p);
		return 1;
	}
	for (const struct model_entry *m = r->models; m != NULL && !pending; m = m->next)
		pending = plan_has(&p, m->current) && !m->current->stored_done;
	for (const struct model_entry *m = r->models; m != NULL && !pending; m = m->next) {
		struct artifact_walk w = { .plan = &p };

		walk_artifacts(r, m, pending_artifact, &w);
		pending = w.pending;
	}
	plan_free(&p);
	return pending;
}

void
restore_stopping(struct registry *r)
{
	if (!r->fdstore || r->closing)
		return;
	stopping = 1;
	/* Checks of stored files still run (restore.c): the descriptions
	 * carry those models as the previous process stored them, and the
	 * store keeps every descriptor they name for the next start. */
	if (restore_state.ncarried > 0)
		log_info("warm restart: stopping while the stored files of %zu model%s are "
			 "checked; the file descriptor store keeps them as the previous process "
			 "stored them", restore_state.ncarried,
			restore_state.ncarried == 1 ? "" : "s");
	for (int i = 0; i < 100 && sync_pending(r); i++) {
		(void)notify_flush_wait(10);
		restore_sync(r);
		if (sync_pending(r))
			usleep(10000);
	}
	if (sync_pending(r))
		log_warnx("warm restart: the service manager did not take everything within 1 s; "
			  "the next start loads some models afresh");
}

void
restore_forget(struct registry *r, struct generation *g)
{
	if (g->stored_slot == 0 || r->closing)
		return;
	/* An artifact's number is its source generation's: its names are
	 * its own. */
	if (g->stored_artifact != 0)
		remove_artifact_names(g->stored_slot, g->stored_artifact);
	else
		remove_names(g->stored_slot, g->number, g->source.nfiles);
	g->stored_slot = 0;
	g->stored_artifact = 0;
	g->stored_done = 0;
}
