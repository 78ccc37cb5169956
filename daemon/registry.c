/*
 * registry.c: the models wcached serves (see registry.h): the model table,
 * adding a model with a generation made elsewhere, attaching (access is
 * access.h's, the generation's state generation.h's), unloading and
 * shutdown. Loading is registry_load.c's; stage_dir and its start-up
 * sweep are registry_sweep.c's; the memory budget, pins, evictions and
 * residency checks are registry_budget.c's; the status page
 * is statuspage.c's. The registry calls generation.c, pages (through it),
 * statuspage.c and access.c below it, and reaches its owner (main.c) and
 * the warm restart only through the hooks in struct registry.
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
#include "base/file.h"
#include "base/fnv.h"
#include "closer.h"
#include "log.h"
#include "registry_internal.h"
#include "stage.h"

/* A remote job running this long is logged as stalled (workq.h). */
#define REMOTE_STALL_MS 10000

/* Publishes the model's current generation to workers and the server. */
static void
publish(struct registry *r, struct model_entry *m, uint64_t generation)
{
	statuspage_publish(&r->page, m->slot, generation);
	if (r->swapped != NULL)
		r->swapped(r, m, generation);
}

/* generation.c's promoted hook: m's pending generation g became current. */
static void
promoted(struct registry *r, struct model_entry *m, struct generation *g)
{
	publish(r, m, g->number);
	registry_enforce_budget(r);
}

uint64_t
registry_now_ms(const struct registry *r)
{
	return uv_now(r->loop);
}

/* ---- models ---- */

static void handed_over(struct registry *r, const uid_t *owners, size_t n);

/* What both initialisations share; the status page is open. */
static int
setup(struct registry *r)
{
	struct rlimit rl;

	r->promoted = promoted;
	r->pages_ended = registry_pages_ended;
	r->handed_over = handed_over;
	r->retired_max = REGISTRY_RETIRED_MAX;
	r->fd_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 0;
	workq_init(&r->workq, r->loop, REMOTE_STALL_MS);
	return 0;
}

int
registry_init(struct registry *r, uv_loop_t *loop, struct warm_pool *pool)
{
	int err;

	memset(r, 0, sizeof(*r));
	r->loop = loop;
	r->pool = pool;
	if ((err = statuspage_init(&r->page, 0)) < 0)
		return err;
	return setup(r);
}

int
registry_init_stored(struct registry *r, uv_loop_t *loop, struct warm_pool *pool, int status_fd)
{
	int err;

	memset(r, 0, sizeof(*r));
	r->loop = loop;
	r->pool = pool;
	r->fdstore = 1;
	err = status_fd >= 0 ? statuspage_adopt(&r->page, status_fd) : statuspage_init(&r->page, 1);
	if (err < 0)
		return err;
	return setup(r);
}

/* FNV-1a of a model's name: its chain in r->by_name. */
static size_t
name_bucket(const struct registry *r, const char *name)
{
	return (size_t)(fnv_mix_string(FNV_OFFSET_BASIS, name) & (r->nbuckets - 1));
}

/* Puts m at the head of its chain; r->by_name is not NULL. */
static void
name_link(struct registry *r, struct model_entry *m)
{
	struct model_entry **head = &r->by_name[name_bucket(r, m->name)];

	m->name_next = *head;
	*head = m;
	r->nnamed++;
}

/* Takes m out of its chain, when there is a table. */
static void
name_unlink(struct registry *r, struct model_entry *m)
{
	if (r->by_name == NULL)
		return;
	for (struct model_entry **pp = &r->by_name[name_bucket(r, m->name)]; *pp != NULL;
		pp = &(*pp)->name_next)
		if (*pp == m) {
			*pp = m->name_next;
			r->nnamed--;
			return;
		}
}

/* Before r->models grows by one: a table with room for it, made again
 * from the list when there is none or it is three quarters full. Without
 * memory the table goes (NULL) and lookups walk the list. */
static void
name_room(struct registry *r)
{
	size_t n = r->nbuckets >= 64 ? r->nbuckets : 64;

	if (r->by_name != NULL && (r->nnamed + 1) * 4 <= r->nbuckets * 3)
		return;
	while ((r->nnamed + 1) * 4 > n * 3)
		n *= 2;
	free(r->by_name);
	r->nnamed = 0;
	r->nbuckets = n;
	if ((r->by_name = calloc(n, sizeof(struct model_entry *))) == NULL) {
		r->nbuckets = 0;
		return;
	}
	for (struct model_entry *m = r->models; m != NULL; m = m->next)
		name_link(r, m);
}

/* The entry of name; of two (never made: a name is looked up before an
 * entry is made), the newest, as the list, newest first, would give. */
struct model_entry *
registry_entry_named(struct registry *r, const char *name)
{
	struct model_entry *found = NULL;

	if (r->by_name == NULL) {
		for (struct model_entry *m = r->models; m != NULL; m = m->next)
			if (strcmp(m->name, name) == 0)
				return m;
		return NULL;
	}
	for (struct model_entry *m = r->by_name[name_bucket(r, name)]; m != NULL;
		m = m->name_next)
		if (strcmp(m->name, name) == 0 && (found == NULL || m->entry_id > found->entry_id))
			found = m;
	return found;
}

/*
 * One walk of the models, newest first (registry_entry_new adds at the
 * head), so the last match of each kind is the oldest entry: the first in
 * the configuration when several models share a path. With who, a path
 * finds only models whose allow_users/allow_groups let who attach (a name
 * finds its model whatever they say). The resolved path was found off the
 * loop (generation.h); nothing here asks a filesystem.
 */
static struct model_entry *
find_by(struct registry *r, const char *name, const struct access_who *who)
{
	struct model_entry *m = registry_entry_named(r, name), *configured = NULL,
			   *resolved = NULL;

	if (m != NULL)
		return m;
	for (m = r->models; m != NULL; m = m->next) {
		const struct generation *g = m->current;

		if (who != NULL && !access_allows(&m->access, who))
			continue;
		if (strcmp(m->path, name) == 0)
			configured = m;
		else if (g != NULL && g->resolved_path != NULL &&
			strcmp(g->resolved_path, name) == 0)
			resolved = m;
	}
	return configured != NULL ? configured : resolved;
}

struct model_entry *
registry_find(struct registry *r, const char *name)
{
	return find_by(r, name, NULL);
}

/* The refusal of name, or NULL (struct registry_refusal). */
static struct registry_refusal **
refusal_of(struct registry *r, const char *name)
{
	struct registry_refusal **pp;

	for (pp = &r->refusals; *pp != NULL; pp = &(*pp)->next)
		if (strcmp((*pp)->name, name) == 0)
			return pp;
	return NULL;
}

/* Remembers that an entry of name could not be made (err), or forgets it
 * (err 0): a reload retries such a model instead of taking it for one
 * unloaded at run time. Nothing when it cannot be kept. */
static void
note_refusal(struct registry *r, const char *name, int err)
{
	struct registry_refusal **pp = refusal_of(r, name), *f;

	if (pp != NULL && err != 0) {
		(*pp)->err = err;
	} else if (pp != NULL) {
		f = *pp;
		*pp = f->next;
		free(f->name);
		free(f);
		r->nrefusals--;
	} else if (err != 0 && r->nrefusals < REGISTRY_REFUSALS_MAX &&
		(f = calloc(1, sizeof(*f))) != NULL) {
		if ((f->name = strdup(name)) == NULL) {
			free(f);
			return;
		}
		f->err = err;
		f->next = r->refusals;
		r->refusals = f;
		r->nrefusals++;
	}
}

int
registry_refused(const struct registry *r, const char *name, char *why, size_t why_size)
{
	for (const struct registry_refusal *f = r->refusals; f != NULL; f = f->next) {
		if (strcmp(f->name, name) != 0)
			continue;
		snprintf(why, why_size, "its load was refused: %s", f->err == -ENOSPC ?
			"the status page had no slot left for a new name" : strerror(-f->err));
		return 1;
	}
	return 0;
}

void
registry_refusals_prune(struct registry *r, int (*keep)(const char *name, void *arg), void *arg)
{
	struct registry_refusal **pp = &r->refusals, *f;

	while ((f = *pp) != NULL) {
		if (keep(f->name, arg)) {
			pp = &f->next;
			continue;
		}
		*pp = f->next;
		free(f->name);
		free(f);
		r->nrefusals--;
	}
}

/* No refusal is kept (registry_close). */
static int
keep_none(const char *name, void *arg)
{
	(void)name;
	(void)arg;
	return 0;
}

int
registry_entry_new(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, struct model_entry **out)
{
	struct model_entry *m;
	int err;

	if ((m = calloc(1, sizeof(*m))) == NULL || (m->name = strdup(name)) == NULL ||
		(m->path = strdup(path)) == NULL) {
		if (m != NULL)
			free(m->name);
		free(m);
		note_refusal(r, name, -ENOMEM);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	m->pin = pin;
	m->warm = warm;
	m->builders.restricted = 1; /* nobody but root and wcached's own user */
	m->derive_timeout_ms = 600000; /* derive_timeout's default, 600 s */
	m->poll_interval_ms = 2000;    /* poll_interval's default, 2 s */
	m->entry_id = ++r->next_load_id;
	m->writer_fd = -1;
	if ((err = statuspage_slot_for(&r->page, name, &m->slot)) < 0) {
		free(m->path);
		free(m->name);
		free(m);
		note_refusal(r, name, err);
		return err;
	}
	note_refusal(r, name, 0);
	m->last_generation = statuspage_last_generation(&r->page, m->slot);
	m->last_attach = ++r->attach_seq;
	name_room(r);
	m->next = r->models;
	r->models = m;
	if (r->by_name != NULL)
		name_link(r, m);
	*out = m;
	return 0;
}

unsigned
registry_served_bytes(const struct registry *r, uint64_t *models, uint64_t *pinned)
{
	unsigned n = 0;

	*models = *pinned = 0;
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		if (m->current == NULL)
			continue;
		*models += m->current->bytes;
		*pinned += m->pin == PIN_ALL ? m->current->bytes : 0;
		n++;
	}
	return n;
}

/* FNV-1a of the device and inode number of each of g's files (a staged
 * copy's origin's): two generations of a model that serve the same inodes
 * have the same digest; other inodes another one but by a chance of one in
 * 2^64 (then a swap counts for watch.c's backoff as a change would). */
static uint64_t
inodes_digest(const struct generation *g)
{
	size_t n = g->origin != NULL ? g->norigin : g->source.nfiles;
	uint64_t h = FNV_OFFSET_BASIS;

	for (size_t i = 0; i < n; i++) {
		const struct stat *st = g->origin != NULL ? &g->origin[i].st :
			&g->source.files[i].st;

		h = fnv_mix(h, (uint64_t)st->st_dev);
		h = fnv_mix(h, (uint64_t)st->st_ino);
	}
	return h;
}

void
registry_link(struct registry *r, struct model_entry *m, struct generation *g)
{
	if (g->number > m->last_generation) {
		uint64_t digest = inodes_digest(g);

		if (digest != m->inodes_digest)
			m->new_inodes = g->number;
		m->inodes_digest = digest;
		m->last_generation = g->number;
	}
	statuspage_set_last_generation(&r->page, m->slot, m->last_generation);
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

/* Ends registry_expect()'s count in the entry name's loading, once: the
 * entry while the token counted there, else NULL (ended already, or the
 * model was unloaded: a later entry of the name never has it). A load that
 * took the model's place meanwhile counts itself: without this its
 * loading would stay above 0 for good, and each later reload wait for it
 * (reload_again). */
static struct model_entry *
expect_release(struct registry *r, const char *name, uint64_t expected)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL || expected == 0 || m->expect_id != expected || m->loading == 0)
		return NULL;
	m->expect_id = 0;
	m->loading--;
	return m;
}

/* Does m still wait for registry_expect()'s token (no load or served
 * generation took its place)? */
static int
still_expected(const struct model_entry *m, uint64_t expected)
{
	return m->load_id == expected && m->current == NULL;
}

int
registry_add_served(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, struct generation *g, uint64_t expected)
{
	struct model_entry *m;
	int err;

	if (expected != 0) {
		if ((m = expect_release(r, name, expected)) == NULL || !still_expected(m, expected))
			return error_set(-ESTALE, "model \"%s\" was unloaded or loaded anew "
				"meanwhile", name);
	} else if (registry_entry_named(r, name) != NULL) {
		return error_set(-EEXIST, "model \"%s\" is already there", name);
	} else if ((err = registry_entry_new(r, name, path, pin, warm, &m)) < 0) {
		return err; /* the message names the model */
	}
	registry_link(r, m, g);
	/* Current at once (gen_promote without its pin = all: a restored
	 * generation waits for its full check, as the metadata lock does). */
	m->current = g;
	publish(r, m, g->number);
	registry_enforce_budget(r);
	/* A reload that came while its warm restart's check ran: it may
	 * have seen the files before they changed. */
	registry_reload_held(r, m, NULL);
	if (r->changed != NULL)
		r->changed(r);
	return 0;
}

uint64_t
registry_expect(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm)
{
	struct model_entry *m;

	if (registry_entry_named(r, name) != NULL) {
		error_set(-EEXIST, "model \"%s\" is already there", name);
		return 0;
	}
	if (registry_entry_new(r, name, path, pin, warm, &m) < 0)
		return 0;
	m->loading = 1;
	m->load_id = ++r->next_load_id;
	m->expect_id = m->load_id;
	return m->load_id;
}

int
registry_expect_end(struct registry *r, const char *name, uint64_t expected)
{
	struct model_entry *m = expect_release(r, name, expected);

	return m != NULL && still_expected(m, expected);
}

void
registry_add_generation(struct registry *r, struct model_entry *m, struct generation *g)
{
	registry_link(r, m, g);
	if (r->changed != NULL)
		r->changed(r);
}

int
registry_kept_of(const struct generation *g, struct registry_kept_files *k)
{
	const struct model_source *src = &g->source;
	int index = src->format == FORMAT_SHARDED && g->origin == NULL &&
		src->index_st.st_ino != 0;
	size_t n = src->nfiles + (index ? 1 : 0);
	struct registry_kept_files kept = { .nfiles = n };

	*k = (struct registry_kept_files){ .owners = NULL };
	if (n == 0)
		return 0;
	if ((kept.owners = calloc(n, sizeof(*kept.owners))) == NULL ||
		(kept.ids = calloc(n, sizeof(*kept.ids))) == NULL) {
		registry_kept_clear(&kept);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		const struct stat *st = i == src->nfiles ? &src->index_st :
			g->origin != NULL ? &g->origin[i].st : &src->files[i].st;

		kept.owners[i] = st->st_uid;
		kept.ids[i] = (struct registry_file_id){ .dev = st->st_dev, .ino = st->st_ino,
			.ctime_ns = file_time_ns(&st->st_ctim) };
	}
	/* Its path named a file straight in its tree (keep_tree's
	 * keep_named_file): as the load that made g told it, where it did
	 * (a restored g's path may lead elsewhere now: review rev215 H1). */
	kept.named_told = g->path_named != GEN_NAMED_UNTOLD;
	kept.named_file = kept.named_told ? g->path_named == GEN_NAMED_FILE :
		g->resolved_path != NULL && g->tree_root != NULL &&
		registry_file_in(g->resolved_path, g->tree_root);
	*k = kept;
	return 0;
}

/*
 * What a watched reload keeps of g's files (registry_load.c's keep_tree:
 * each file's owner and identity, its origin's for a staged copy, and its
 * shard index's where g read one), into m's operator_tree.kept, as a warm
 * restart keeps a stored generation's (registry_keep_tree): once g is
 * withdrawn, only the reload registry_withdraw queues keeps g itself, and
 * every later one is judged against operator_tree. An operator's reload
 * that failed while g served left it with no owner kept: a neighbour's
 * file made at a one-file model's name in a sticky 1777 place, once its
 * owner's was gone, was taken (review rev210 L2). 0, or -ENOMEM: then
 * operator_tree is left as it was (its owners untold where an operator's
 * load found a tree and failed, take_operator_tree; none kept where no
 * load of the operator's found one, and its reloads wait for hers).
 */
static int
keep_withdrawn_files(struct model_entry *m, const struct generation *g)
{
	struct registry_kept_files kept;

	if (registry_kept_of(g, &kept) < 0)
		return -ENOMEM;
	if (kept.nfiles == 0)
		return 0;
	registry_kept_clear(&m->operator_tree.kept);
	m->operator_tree.kept = kept;
	m->operator_tree.owners_untold = 0;
	return 0;
}

void
registry_withdraw(struct registry *r, struct model_entry *m, const char *why)
{
	/* Queued while the withdrawn generation is still its newest, so that
	 * the reload keeps its tree (keep_tree); a reload that must wait for
	 * a load in progress keeps that one's. */
	int err = registry_reload_watched(r, m->name, NULL, NULL);

	if (m->current != NULL && keep_withdrawn_files(m, m->current) < 0)
		log_errorx("model \"%s\": out of memory: the owners of its withdrawn "
			"generation's files are not kept for its reloads after the next", m->name);
	m->current = NULL;
	m->load_errors++;
	free(m->error);
	m->error = strdup(why);
	publish(r, m, 0);
	if (err < 0)
		log_errorx("%s; not served", error_get());
	if (r->changed != NULL)
		r->changed(r);
}

void
registry_wait_for_operator(struct registry *r, const char *name, const char *why,
	const char *line)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return;
	m->load_errors++;
	free(m->error);
	m->error = strdup(why);
	registry_refusal_kept(r, name, line != NULL ? line : why);
	/* An operator's reload asked for while wcached judged it (answered: a
	 * load is already in progress) is her word on what its path names. */
	if (m->reload_again == RELOAD_OPERATOR)
		registry_reload_held(r, m, NULL);
}

void
registry_kept_clear(struct registry_kept_files *k)
{
	free(k->owners);
	free(k->ids);
	*k = (struct registry_kept_files){ .owners = NULL };
}

int
registry_keep_tree(struct registry *r, const char *name, const struct registry_tree *t)
{
	struct model_entry *m = registry_entry_named(r, name);
	struct registry_kept_files kept = { .nfiles = t->kept.nfiles,
		.named_file = t->kept.named_file, .named_told = t->kept.named_told };
	size_t n = t->kept.nfiles;
	char *root, *place = NULL;

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (t->root == NULL)
		return 0;
	if (n > 0 && ((kept.owners = malloc(n * sizeof(*kept.owners))) == NULL ||
			     (kept.ids = malloc(n * sizeof(*kept.ids))) == NULL)) {
		registry_kept_clear(&kept);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	if ((root = strdup(t->root)) == NULL ||
		(t->place != NULL && (place = strdup(t->place)) == NULL)) {
		free(root);
		registry_kept_clear(&kept);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	if (n > 0) {
		memcpy(kept.owners, t->kept.owners, n * sizeof(*kept.owners));
		memcpy(kept.ids, t->kept.ids, n * sizeof(*kept.ids));
	}
	free(m->operator_tree.root);
	free(m->operator_tree.place);
	registry_kept_clear(&m->operator_tree.kept);
	m->operator_tree.kept = kept;
	/* Files a generation served whose owners the restart could not tell
	 * (a place is the operator's load's record: no files served there). */
	m->operator_tree.owners_untold = n == 0 && place == NULL ? OWNERS_UNTOLD_RESTART : 0;
	m->operator_tree.root = root;
	m->operator_tree.place = place;
	m->operator_tree.uid = t->uid;
	m->operator_tree.place_mode = t->place_mode;
	m->operator_tree.place_dir_len = place != NULL ? t->place_dir_len : 0;
	m->operator_tree.root_known = t->root_known;
	m->operator_tree.root_dev = t->root_dev;
	m->operator_tree.root_ino = t->root_ino;
	return 0;
}

void
registry_refusal_kept(struct registry *r, const char *name, const char *line)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return;
	free(m->refused_line);
	m->refused_line = strdup(line);
	m->refused_tree = 1;
	if (r->changed != NULL)
		r->changed(r);
}

int
registry_set_access(struct registry *r, const char *name, int restricted, const uid_t *uids,
	size_t n_uids, const gid_t *gids, size_t n_gids)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	if (access_set(&m->access, restricted, uids, n_uids, gids, n_gids) < 0)
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	return 0;
}

/* ---- attaching ---- */

int
registry_find_for(struct registry *r, const char *name, const struct registry_peer *peer,
	struct model_entry **out, char *msg, size_t msg_size)
{
	struct access_who who = { .uid = peer->uid, .gid = peer->gid, .groups = peer->groups,
		.ngroups = peer->ngroups, .self_uid = peer->self_uid };
	/* Of several models with one path, the first that lets the peer in;
	 * when none does, the first's refusal. */
	struct model_entry *m = find_by(r, name, &who);

	if (m == NULL)
		m = registry_find(r, name);
	if (m == NULL) {
		snprintf(msg, msg_size, "not served");
		return -ENOENT;
	}
	if (!access_allows(&m->access, &who)) {
		m->denied_count++;
		char more[96] = "";

		if ((peer->denied_logged == NULL || !(*peer->denied_logged)++) &&
			(peer->may_warn == NULL ||
				peer->may_warn(peer->warn_arg, peer->uid, more, sizeof(more))))
			log_warnx("client pid %d uid %u gid %u: attach of model \"%s\" refused by "
				  "allow_users/allow_groups%s", (int)peer->pid, (unsigned)peer->uid,
				(unsigned)peer->gid, m->name, more);
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
	struct generation *g = NULL;
	int err;

	if ((err = registry_find_for(r, name, peer, &m, msg, msg_size)) < 0 ||
		(err = registry_servable(m, &g, msg, msg_size)) < 0 || m == NULL || g == NULL)
		return err < 0 ? err : -EIO;
	registry_attach_generation(r, m, g, peer->uid, out);
	m->attach_count++;
	return 0;
}

int
registry_servable(struct model_entry *m, struct generation **out, char *msg, size_t msg_size)
{
	struct generation *g;

	if ((g = m->current) == NULL && m->loading > 0 && m->error == NULL) {
		m->error_count++;
		snprintf(msg, msg_size, "still loading: its first load has not ended "
				        "(wcachectl status shows it)");
		return -EAGAIN;
	}
	if (g == NULL) {
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
		if (g->gone != NULL) {
			/* Its files are gone from the remote server. */
			snprintf(msg, msg_size, "%s", g->gone);
			return -ESTALE;
		}
		snprintf(msg, msg_size, "generation %" PRIu64 " failed while warming", g->number);
		return -EIO;
	}
	*out = g;
	return 0;
}

void
registry_attach_generation(struct registry *r, const struct model_entry *m,
	struct generation *g, uid_t uid, struct registry_attachment *out)
{
	memset(out, 0, sizeof(*out));
	out->gen = g;
	out->generation = g->number;
	out->index_size = g->index_size;
	out->file_count = (uint32_t)g->source.nfiles;
	out->fds[out->nfds++] = g->served_index_fd;
	for (size_t i = 0; i < g->source.nfiles && out->nfds < WIRE_MAX_FDS; i++)
		out->fds[out->nfds++] = g->served_fds[i];
	if (m != NULL && m->slot != 0 && r->page.ro_fd >= 0 && out->nfds < WIRE_MAX_FDS) {
		out->status_slot = m->slot;
		out->fds[out->nfds++] = r->page.ro_fd;
	}
	/* Whose it is, for the store (restore_holders); without that, the
	 * store records only how many hold g, until every reference whose
	 * uid was not recorded is released (gen_holder_drop). */
	if (uid != REGISTRY_NO_UID && !g->artifact && gen_holder_add(g, uid) < 0)
		g->holders_lost++;
	/* An attach of a cold model warms it again: the budget applies. */
	if (gen_ref(r, g))
		registry_enforce_budget(r);
}

int
registry_set_derive(struct registry *r, const char *name, int enabled, const gid_t *gids,
	size_t n_gids, unsigned timeout_seconds)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	/* Restricted with no users: only the groups, root and wcached's own. */
	if (access_set(&m->builders, 1, NULL, 0, gids, n_gids) < 0)
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	m->derive = enabled;
	m->derive_timeout_ms = (uint64_t)timeout_seconds * 1000;
	return 0;
}

int
registry_set_storage(struct registry *r, const char *name, enum fs_watch watch,
	unsigned poll_interval_ms, enum fs_stage stage)
{
	struct model_entry *m = registry_entry_named(r, name);

	if (m == NULL)
		return error_set(-ENOENT, "model \"%s\" is not loaded", name);
	m->watch = watch;
	m->poll_interval_ms = poll_interval_ms;
	m->stage = stage;
	return 0;
}

int
registry_stages(const struct model_entry *m, const struct fs_info *fs)
{
	return m->stage == FS_STAGE_YES || (m->stage == FS_STAGE_AUTO && fs->remote);
}

int
registry_polls(const struct registry *r, const struct model_entry *m)
{
	const struct generation *g = m->current != NULL ? m->current : m->pending;
	int gone;

	if (r->inotify_failed || m->watch == FS_WATCH_POLL)
		return 1;
	if (m->watch != FS_WATCH_AUTO)
		return 0;
	/* Its last load found neither its path nor its directory there
	 * (note_failed_path): the directory's watch went with it, or there
	 * never was one (a first load before the directory was made). */
	gone = m->error != NULL && !m->failed_path.known && m->failed_path.err != 0;
	if (g != NULL)
		return g->fs.remote || gone;
	return gone || (m->failed_path.known && m->failed_path.fs.remote);
}

int
registry_may_build(const struct model_entry *m, const struct registry_peer *peer)
{
	struct access_who who = { .uid = peer->uid, .gid = peer->gid, .groups = peer->groups,
		.ngroups = peer->ngroups, .self_uid = peer->self_uid };

	return m->derive && access_allows(&m->builders, &who);
}

int
registry_failed(const struct model_entry *m, char *why, size_t why_size)
{
	const struct generation *g = m->current;

	if (m->loading > 0 || m->pending != NULL)
		return 0; /* a load or a replacement in flight may mend it */
	if (g == NULL) {
		snprintf(why, why_size, "its load failed: %s",
			m->error != NULL ? m->error : "unknown error");
		return 1;
	}
	if (g->state == GEN_MODIFIED || (g->state != GEN_FAILED && m->error == NULL))
		return 0;
	if (g->state != GEN_FAILED) {
		snprintf(why, why_size, "its replacement failed (generation %" PRIu64
					" still serving): %s", g->number, m->error);
		return 1;
	}
	if (g->gone != NULL) {
		snprintf(why, why_size, "%s", g->gone);
		return 1;
	}
	snprintf(why, why_size, "generation %" PRIu64 " failed while warming%s%s", g->number,
		g->warm.error < 0 ? ": " : "", g->warm.error < 0 ? strerror(-g->warm.error) : "");
	return 1;
}

/* How many generations are open (r->generations). */
static size_t
open_generations(const struct registry *r)
{
	size_t n = 0;

	for (const struct generation *g = r->generations; g != NULL; g = g->next)
		n++;
	return n;
}

/* Runs the reloads that waited for a release (m's, or with all every
 * model's), and, where a generation closed (closed), the loads refused
 * for descriptors (room_wait) of every model: its descriptors are free. */
static void
reload_released(struct registry *r, struct model_entry *m, int all, int closed)
{
	if (closed)
		r->closes_done++;
	for (struct model_entry *o = r->models, *next; o != NULL; o = next) {
		int mine = all || (m != NULL && o == m);

		next = o->next; /* a reload's answer may unload o */
		if (closed && o->room_wait)
			registry_reload_held(r, o, RELOAD_CLOSED);
		else if (mine)
			registry_reload_held(r, o, RELOAD_RELEASED);
	}
}

/* The loop, woken once a closed generation's descriptors are closed and
 * its files unmapped (handed_over): the loads refused for descriptors run
 * again. */
static void
closes_through(uv_async_t *h)
{
	reload_released(h->data, NULL, 0, 1);
}

/* closer_then()'s done: on a lane's thread, under the closer's lock. */
static void
wake_closes_through(void *arg)
{
	struct registry *r = arg;

	uv_async_send(&r->closes_async);
}

/* generation.c's handed_over hook: a closed generation's descriptors and
 * mappings are in the closer's lanes owners[0 .. n). A load refused for
 * descriptors waits until they are through there: before, its retry
 * found the same descriptors open (review rev180 F1). */
static void
handed_over(struct registry *r, const uid_t *owners, size_t n)
{
	int err;

	if (r->closer == NULL || r->closing || r->closes_async_state < 0)
		return;
	if (r->closes_async_state == 0) {
		if ((err = uv_async_init(r->loop, &r->closes_async, closes_through)) < 0) {
			log_warnx("closer wake-up: uv_async_init: %s; a load refused for "
				  "descriptors runs again as a generation closes, before "
				  "its descriptors are closed", uv_strerror(err));
			r->closes_async_state = -1;
			return;
		}
		r->closes_async.data = r;
		r->closes_async_state = 1;
	}
	closer_then(r->closer, owners, n, wake_closes_through, r);
}

/* 1 where a generation that closes retries the loads refused for
 * descriptors at once (no closer: it closed them at once; or no wake-up
 * from its lanes); otherwise closes_through does, later. */
static int
retry_at_close(const struct registry *r)
{
	return r->closer == NULL || r->closes_async_state < 0;
}

void
registry_release(struct registry *r, struct generation *g, uid_t uid)
{
	struct model_entry *m = g->model;
	size_t open = open_generations(r);

	if (uid != REGISTRY_NO_UID && !g->artifact)
		gen_holder_drop(g, uid);
	gen_unref(r, g);
	/* One that waited for a release; one that waited for descriptors. */
	reload_released(r, m, 0, retry_at_close(r) && open_generations(r) < open);
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
	name_unlink(r, m);
	/* A stopping daemon whose state is in the manager's store leaves the
	 * page as it is: the next process serves the same generations, and
	 * holders must not see a false stale meanwhile. */
	if (!(r->closing && r->fdstore))
		publish(r, m, 0);
	for (struct generation *g = r->generations; g != NULL; g = g->next)
		if (g->model == m)
			g->model = NULL;
	registry_pages_cancel(m);
	/* Its entry is gone before the load's turn comes: only its answer is
	 * left to give (while stopping, workq_close has answered it). */
	registry_withdraw_waiting_load(r, m, "unloaded before its load began");
	if (m->staging != NULL)
		stage_cancel(m->staging); /* its load_after finds no model */
	/* A name that never served (a failed load of a new name) gives its
	 * status slot back: each would otherwise keep one for the process's
	 * life, and 8191 failed `wcachectl load`s used the page up. (The
	 * page knows: a slot a warm restart freed numbers from its word.) */
	statuspage_release_slot(&r->page, m->slot);
	free(m->name);
	free(m->path);
	free(m->error);
	free(m->refused_line);
	registry_forget_writer(r, m);
	free(m->operator_tree.root);
	free(m->operator_tree.place);
	registry_kept_clear(&m->operator_tree.kept);
	access_clear(&m->access);
	access_clear(&m->builders);
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
	workq_close(&r->workq); /* what waits on a remote filesystem: cancelled */
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
	/* What still closes in the closer's lanes calls nothing back. */
	if (r->closes_async_state > 0) {
		closer_forget(r->closer, r);
		uv_close((uv_handle_t *)&r->closes_async, NULL);
		r->closes_async_state = -1;
	}
	statuspage_close(&r->page);
	free(r->by_name);
	r->by_name = NULL;
	r->nbuckets = r->nnamed = 0;
	registry_refusals_prune(r, keep_none, NULL);
	free(r->stage_dir);
	r->stage_dir = NULL;
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

void
registry_mark_modified(struct registry *r, struct generation *g, const char *file)
{
	gen_mark_modified(r, g, file);
}

void
registry_relinked(struct registry *r, struct generation *g, size_t i, const struct stat *now)
{
	gen_note_relinked(r, g, i, now);
}

int
registry_relinked_now(struct registry *r, struct generation *g, size_t i, const struct stat *now)
{
	(void)r;
	return gen_relinked_now(g, i, now, 0);
}

void
registry_mark_gone(struct registry *r, struct generation *g, const char *file, int err)
{
	if (!gen_attachable(g))
		return;
	gen_mark_gone(r, g, file, err);
	if (r->changed != NULL)
		r->changed(r);
}

void
registry_collect(struct registry *r)
{
	struct generation *g = r->generations, *next;
	size_t open = open_generations(r);

	for (; g != NULL; g = next) {
		next = g->next;
		gen_maybe_free(r, g);
	}
	/* A reload that waited for a retired generation to close (one closes
	 * here, or its hold or page work ended since), or for descriptors. */
	reload_released(r, NULL, 1, retry_at_close(r) && open_generations(r) < open);
}
