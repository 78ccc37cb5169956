/*
 * restore_job.c: one model's warm restart (restore.h), from restore_model()
 * to the end of its check: its stored descriptors taken out of the
 * restore's table (restore.c), its current generation, the generations
 * workers held and its derived artifacts checked on the work queue
 * (restore_work: restore_check.c for the generations, restore_layout.c
 * for whether the model's path lists the current one's files still,
 * check_artifact for the artifacts), and on the loop what passed served
 * (restore_adopt.c) and the rest given back to the table for
 * restore_close_untaken().
 *
 * The checks run off the loop because they ask the model's filesystem,
 * whose server may hang, and because an artifact is parsed again: each
 * artifact memfd must be a regular file with every seal a published one
 * has, of the described size, and parse again with its format's reader
 * (source_open_fd, O(its tensors)) into an index byte for byte the stored
 * index memfd, itself checked as a generation's is, within the limits a
 * PUBLISH is held to; the loop lists what passed, if the configuration
 * now lets its builder build it and memory_budget holds it
 * (restore_rules.c). One that fails is left out with one line naming the
 * model, the key and the reason, its descriptors closed: the next DERIVE
 * builds it again (with derive = no, none does; one over a publication's
 * limits is refused again if built the same, and its line says no more).
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
#include "derive.h"
#include "fdstore.h"
#include "format/index.h"
#include "generation.h"
#include "listen.h"
#include "log.h"
#include "mountrule.h"
#include "notify.h"
#include "restore.h"
#include "restore_internal.h"
#include "stage.h"

/* One stored derived artifact of a model, checked on the work queue with
 * its generations (check_artifact) and listed again on the loop
 * (adopt_artifact). */
struct restore_artifact {
	const struct fdstore_artifact *a; /* the restore's description's */
	int fd;                           /* its memfd, out of the table; -1 once src has it */
	size_t at;
	int index_fd;                     /* its sealed index, out of the table */
	size_t index_at;
	/* Filled by check_artifact(). */
	int err;                          /* 0, or -errno with why */
	char why[ERROR_MAX];
	struct model_source src;          /* its memfd, opened by its reader */
	struct restore_builder builder;   /* who built it: as stored, or by the user database */
};

/* One model's stored generations and derived artifacts, checked on the
 * work queue (restore_check.c, check_artifact) and served on the loop
 * (restore_after). */
struct restore_job {
	struct workq_job job;
	struct restore *s;
	struct registry *r;
	size_t model;               /* in s->desc->models */
	char *path;
	enum pin_mode pin;
	int warm;
	char *stage_dir;            /* the registry's at the start, copied */
	uint64_t expected;          /* registry_expect()'s token */
	size_t n;                   /* [0] the current generation, then the held ones */
	struct restore_prepared *gens;
	size_t nartifacts;          /* the current generation's derived artifacts */
	struct restore_artifact *artifacts;
	restore_done_fn done;
	void *arg;
	/* Whether the model's path goes through a place others may rename
	 * entries in (registry_others_rename_on; 2: a mount refused on the
	 * way), and which: there a model not restored is not loaded afresh
	 * (restore_after). */
	int others_rename;
	char rename_place[PATH_MAX + 64];
};

/*
 * Takes g's stored descriptors out of s's table into p (the check uses
 * them off the loop; a name the description gives twice finds the second
 * copy or none, never the same descriptor twice), and notes p's staged
 * copy's directory in s->copies. 0 or -ENOMEM.
 */
static int
reserve(struct restore *s, const char *stage_dir, const struct fdstore_generation *g,
	struct restore_prepared *p)
{
	char *copy = NULL, *dir = NULL;

	p->g = g;
	p->index_fd = restore_find_fd(s, g->index_fdname, &p->index_at);
	if (p->index_fd >= 0)
		s->fds[p->index_at].fd = -1;
	p->fds = calloc(g->nfiles ? g->nfiles : 1, sizeof(*p->fds));
	p->at = calloc(g->nfiles ? g->nfiles : 1, sizeof(*p->at));
	if (p->fds == NULL || p->at == NULL) {
		free(p->fds);
		free(p->at);
		p->fds = NULL;
		p->at = NULL;
		return error_set(-ENOMEM, "out of memory");
	}
	for (uint32_t k = 0; k < g->nfiles; k++)
		if ((p->fds[k] = restore_find_fd(s, g->files[k].fdname, &p->at[k])) >= 0)
			s->fds[p->at[k]].fd = -1;
	/* Its staged copy stays in stage_dir while it is checked. */
	if (g->nfiles > 0 && p->fds[0] >= 0 &&
		restore_staged_copy(stage_dir, p->fds[0], &copy) > 0 &&
		stage_dir_of(stage_dir, copy, &dir) > 0) {
		char **more = realloc(s->copies, (s->ncopies + 1) * sizeof(*more));

		if (more == NULL) {
			free(dir);
			dir = NULL;
		} else {
			s->copies = more;
			s->copies[s->ncopies++] = dir;
			p->copy_dir = dir;
		}
	}
	free(copy);
	return 0;
}

/*
 * Gives p's stored descriptors that nothing took back to s's table, for
 * restore_close_untaken() at the end of the check (which closes them and has the
 * manager drop them), and removes the staged copy of the model name
 * nothing serves. A stop ends that removal at its next file, as it ends
 * the removal of a closed generation's copy (gen_free_staged): the copy
 * keeps its marker, and the next start's sweep removes the rest. No start
 * serves it again: this check's end has the manager drop its descriptors
 * (restore_close_untaken) and describes the model without it
 * (restore_sync) before the loop reads the stop; and a start that got
 * them back all the same would check them again, serving them (through
 * its descriptors, never the copy's paths) or removing the copy as here.
 */
static void
give_back(struct restore *s, struct registry *r, const char *name, struct restore_prepared *p,
	int served)
{
	if (p->g == NULL)
		return;
	if (p->index_fd >= 0)
		s->fds[p->index_at].fd = p->index_fd;
	p->index_fd = -1;
	for (size_t k = 0; p->fds != NULL && k < p->g->nfiles; k++) {
		int fd = p->fds[k];

		if (served || fd < 0)
			continue;
		if (k < p->src.nfiles)
			p->src.files[k].fd = -1; /* the table's again, not the file's */
		s->fds[p->at[k]].fd = fd;
	}
	if (!served && p->copy_dir != NULL && !r->closing) {
		char *dir = strdup(p->copy_dir);

		log_info("model \"%s\": generation %" PRIu64 " not restored: removing its staged "
			 "copy %s", name, p->g->number, p->copy_dir);
		if (dir != NULL)
			stage_remove_later(r->loop, dir, &r->closing, r->stage_dir);
	}
	restore_prepared_clear(r, p);
}

/* Takes the stored descriptors of artifact a out of s's table into p,
 * for its check off the loop (as reserve() does a generation's). */
static void
reserve_artifact(struct restore *s, const struct fdstore_artifact *a, struct restore_artifact *p)
{
	*p = (struct restore_artifact){ .a = a };
	if ((p->fd = restore_find_fd(s, a->fdname, &p->at)) >= 0)
		s->fds[p->at].fd = -1;
	if ((p->index_fd = restore_find_fd(s, a->index_fdname, &p->index_at)) >= 0)
		s->fds[p->index_at].fd = -1;
}

/* Gives p's stored descriptors that nothing took back to s's table, for
 * restore_close_untaken() at the end of the check (which closes them, and has the
 * manager drop them unless wcached stops); its memfd leaves its reader's
 * mappings first. */
static void
give_back_artifact(struct restore *s, struct registry *r, struct restore_artifact *p)
{
	if (p->a == NULL)
		return;
	if (p->src.nfiles > 0 && p->src.files[0].fd >= 0) {
		p->fd = p->src.files[0].fd;
		p->src.files[0].fd = -1; /* the table's again, not the reader's */
	}
	gen_close_files_in(r, (uid_t)p->a->builder_uid, NULL, &p->src);
	if (p->fd >= 0)
		s->fds[p->at].fd = p->fd;
	if (p->index_fd >= 0)
		s->fds[p->index_at].fd = p->index_fd;
	p->fd = -1;
	p->index_fd = -1;
}

static int check_artifact_memfd(int fd, const struct fdstore_artifact *a);

/*
 * Work queue thread: checks every piece of artifact p of the model name,
 * an artifact of its generation current (the one restored, if it is), as
 * PUBLISH does: its memfd (check_artifact_memfd), its stored index
 * (restore_check_index), and its reader again, which must compile the
 * memfd into that index byte for byte. O(its tensors): never on the loop.
 * Touches nothing but p and the descriptors it names.
 */
static void
check_artifact(struct restore_artifact *p, const char *name, uint64_t current)
{
	const struct fdstore_artifact *a = p->a;
	char label[FDSTORE_MAX_MODEL_NAME + FDSTORE_MAX_KEY + 16];
	struct index_header h;
	void *map = NULL;
	int err;

	/* An older generation's is not restored (adopt_artifact): not read. */
	if (a->source != current) {
		err = error_set(-ESTALE, "its source generation %" PRIu64 " is not the one "
			"restored", a->source);
		goto out;
	}
	if ((err = check_artifact_memfd(p->fd, a)) < 0 ||
		(err = restore_artifact_limits(p->fd, a)) < 0 ||
		(err = restore_check_index(p->index_fd, a->index_fdname, a->index_size, 1, &h,
			 &map)) < 0)
		goto out;
	snprintf(label, sizeof(label), "%s derived %s", name, a->key);
	if (source_open_fd(p->fd, label, &p->src) < 0) {
		snprintf(p->why, sizeof(p->why), "%s", error_get());
		err = error_set(-EBADMSG, "its memfd does not parse: %s", p->why);
		goto out;
	}
	p->fd = -1; /* src's now */
	if (p->src.nfiles != 1 || p->src.index_len != a->index_size ||
		memcmp(p->src.index, map, p->src.index_len) != 0)
		err = error_set(-EBADMSG, "its stored index (%" PRIu64 " bytes) is not the one "
			"its memfd compiles to (%zu bytes)", a->index_size, p->src.index_len);
out:
	if (map != NULL)
		munmap(map, (size_t)a->index_size);
	if ((p->err = err) < 0)
		snprintf(p->why, sizeof(p->why), "%s", error_get());
}

/*
 * Work queue thread: who built each of the n artifacts of v that passed
 * their checks (restore_rules.c): its gid and groups as stored with it
 * (version 7); for one stored without them (version 6 or older), by the
 * user database, asked once per uid: one builder's artifacts share its
 * answer, and a database that is slow (sssd, LDAP) holds the model's
 * restore once per builder, not once per artifact. Whether the builder
 * may build still is the loop's to say (adopt_artifact, with the
 * configuration now).
 */
static void
lookup_builders(struct restore_artifact *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct restore_artifact *p = &v[i];
		size_t k = 0;

		if (p->err < 0)
			continue;
		if (p->a->builder_gid != FDSTORE_GID_UNRECORDED) {
			if ((p->err = restore_builder_stored(p->a, &p->builder)) < 0)
				snprintf(p->why, sizeof(p->why), "%s", error_get());
			continue;
		}
		while (k < i && (v[k].err < 0 || v[k].builder.stored ||
				 v[k].a->builder_uid != p->a->builder_uid))
			k++;
		p->err = k < i ? restore_builder_copy(&v[k].builder, &p->builder) :
				 restore_builder_lookup((uid_t)p->a->builder_uid, &p->builder);
		if (p->err < 0)
			snprintf(p->why, sizeof(p->why), "%s", error_get());
	}
}

/* Work queue thread: p, the current generation, whose own tree could not
 * be told from where its files are now (a file replaced, or removed), takes
 * the one the description recorded for its model (fdstore.h's tree), when
 * that is a generation's (no place): the tree it was loaded from, which
 * its reload (reload_moved) keeps. */
static void
stored_tree(struct restore_prepared *p, const struct fdstore_tree *t)
{
	if (t->root == NULL || t->place != NULL || (p->tree_root = strdup(t->root)) == NULL)
		return;
	p->tree_uid = (uid_t)t->uid;
	p->tree_ino_known = t->root_known;
	p->tree_dev = (dev_t)t->root_dev;
	p->tree_ino = (ino_t)t->root_ino;
}

/* Whether found, the tree the model's path leads to now, is t, the tree
 * the store recorded: the same directory (device and inode, where both
 * tell them; else the same path) of the same owner. A tree its deployer
 * renamed while no wcached ran is still it. */
static int
recorded_tree(const struct gen_found_tree *found, const struct fdstore_tree *t)
{
	if (found->root == NULL || found->uid != (uid_t)t->uid)
		return 0;
	if (found->root_known && t->root_known)
		return (uint64_t)found->root_dev == t->root_dev &&
		       (uint64_t)found->root_ino == t->root_ino;
	return strcmp(found->root, t->root) == 0;
}

/*
 * Work queue thread: the tree of p, the current generation that passed
 * its checks, from found (what its path, j's path, leads to now, taken).
 * The tree the store recorded for the model, where it recorded one (a
 * generation's: no place), is the tree: found only where it is that tree.
 * Where its stored file is now says nothing of whose the model is: anyone
 * who may rename entries in its directory may have moved it into his own
 * and pointed his link on the path there (review rev213 H1); the watched
 * reload then judges what the path leads to against the recorded tree.
 * Where none was recorded (a store before format version 9), found, or the
 * tree the stored file is found in now (restore_moved_tree), only where
 * that file tells it (restore_owners_tree, H2): else none, and the
 * reload waits for the operator's.
 */
static void
take_tree(struct restore_prepared *p, const char *path, const struct fdstore_tree *t,
	struct gen_found_tree *found)
{
	int recorded = t->root != NULL && t->place == NULL;

	if (recorded ? !recorded_tree(found, t) :
		       found->root != NULL && !restore_found_tree_owned(p, path, found)) {
		free(found->root);
		found->root = NULL;
		/* The reload would find the root from it; and beside the tree
		 * recorded it names a place that is not the model's: attaches by
		 * it, status (review rev215 H1). */
		free(p->resolved_path);
		p->resolved_path = NULL;
	}
	p->tree_root = found->root;
	p->tree_uid = found->uid;
	p->tree_ino_known = found->root_known;
	p->tree_dev = found->root_dev;
	p->tree_ino = found->root_ino;
	if (p->tree_root == NULL && recorded)
		stored_tree(p, t);
	else if (p->tree_root == NULL)
		restore_moved_tree(p, path);
}

/* Work queue thread: checks and opens every stored generation of j's
 * model, and checks its current generation's derived artifacts. */
static void
restore_work(struct workq_job *w)
{
	struct restore_job *j = w->arg;
	const char *name = j->s->desc->models[j->model].name;
	struct restore_prepared *cur = &j->gens[0];
	/* What the path resolves to, around the checks, as a load takes it
	 * around its opens: attaches by the real path find the model once
	 * this generation serves, as after a load (registry_find). By the
	 * judged walk, never realpath(3): a neighbour's link at the path into
	 * his FUSE mount made its lookup wait on his server for good (h282). */
	char *resolved = mountrule_realpath(NULL, j->path, NULL, 0);
	struct gen_found_tree found = { .root = NULL };
	const struct fdstore_tree *tree = &j->s->desc->models[j->model].tree;

	for (size_t i = 0; i < j->n; i++)
		restore_check_generation(&j->gens[i], j->path, j->stage_dir);
	/* The current one serves only if the model's path lists its files
	 * still: a shard index renamed over while no wcached ran leaves every
	 * stored shard as it was. */
	if (cur->err == 0 && (cur->err = restore_check_layout(cur, j->path)) == -ESTALE) {
		/* It lists other files: the stored ones serve meanwhile. */
		if (!cur->moved)
			snprintf(cur->moved_why, sizeof(cur->moved_why), "%s", error_get());
		cur->moved = true;
		cur->err = 0;
	} else if (cur->err < 0) {
		snprintf(cur->why, sizeof(cur->why), "%s", error_get());
	}
	/* Its files as a load checks them; a staged copy's by their origin. */
	if (cur->err == 0) {
		cur->resolved_path = gen_resolved_path(j->path, resolved, &cur->src, cur->origin,
			&found);
		take_tree(cur, j->path, tree, &found);
	} else {
		free(resolved);
	}
	/* Should it not be served: the tree its stored files are found in
	 * where the description records none (a store before version 9), and
	 * what they tell of the files it served (review rev206 M1, H1). */
	if (cur->err < 0 && tree->root == NULL)
		restore_stored_tree(cur, j->path, j->stage_dir);
	restore_tell_files(cur, j->stage_dir, tree->root != NULL ? tree->root : cur->tree_root);
	for (size_t i = 0; i < j->nartifacts; i++)
		check_artifact(&j->artifacts[i], name, j->gens[0].g->number);
	lookup_builders(j->artifacts, j->nartifacts);
	/* For restore_after, should the model not serve its stored
	 * generation (the loop may refuse it too). */
	j->others_rename = registry_others_rename_on(j->path, j->rename_place,
		sizeof(j->rename_place));
}

/*
 * Is p, the model's stored current generation, staged (or not) as its
 * stage key says now for its files' filesystem (the origin's, when a
 * copy; registry_stages)? The key is the model's by the end of the check
 * (set once restore_model() returns, as after registry_load()). A copy
 * kept when stage = no now, or files served where they are when stage =
 * yes now (stage = auto: on a remote filesystem), are not what the
 * configuration asks: the model loads afresh, and the copy is removed
 * (give_back). Before, such a generation was restored all the same and
 * stayed so: a reload found its files unchanged. 0, or -EINVAL with why.
 */
static int
staged_as_configured(struct registry *r, const char *name, const struct restore_prepared *p)
{
	const struct model_entry *e = registry_find(r, name);
	int staged = p->staged_dir != NULL;
	char key[96];

	if (e == NULL || staged == registry_stages(e, &p->fs))
		return 0;
	if (p->fs_unknown && staged && e->stage == FS_STAGE_AUTO)
		return 0; /* kept as the previous process staged it (note_filesystem) */
	if (e->stage == FS_STAGE_AUTO)
		snprintf(key, sizeof(key), "stage = auto %s from %s, a %s filesystem",
			staged ? "does not stage" : "stages", p->fs.name,
			p->fs.remote ? "remote" : "local");
	else
		snprintf(key, sizeof(key), "stage = %s now", fs_stage_name(e->stage));
	return error_set(-EINVAL, "generation %" PRIu64 " is %sa staged copy, and %s",
		p->g->number, staged ? "" : "not ", key);
}

/*
 * Serves p as generation k of j's model: the current one (held 0), or
 * one workers held before the restart (restore_adopt_held). Takes what p
 * holds on success; 0, or -errno with the message.
 */
static int
serve(struct restore_job *j, struct restore_prepared *p, int held)
{
	struct registry *r = j->r;
	const struct fdstore_model *m = &j->s->desc->models[j->model];
	const struct fdstore_generation *g = p->g;
	struct restore_served rs = { .name = m->name, .path = j->path, .number = g->number,
		.src = &p->src, .served = p->served, .fs = &p->fs, .index_fd = p->index_fd,
		.index_size = (size_t)g->index_size, .uids = g->uids, .nuids = g->nuids };
	struct model_entry *e;
	struct generation *k;
	int err;

	if (p->err < 0)
		return error_set(p->err, "%s", p->why);
	if (!held && (err = staged_as_configured(r, m->name, p)) < 0)
		return err;
	err = held ? restore_adopt_held(r, &rs, g->holders) :
		     restore_adopt_current(r, &rs, j->pin, j->warm, j->expected);
	if (err < 0)
		return err;
	p->served = NULL;
	p->index_fd = -1;
	e = registry_find(r, m->name);
	k = registry_generation(r, e, g->number);
	/* Its holders before the restart may say so (HOLD), as many of them
	 * as there were, each uid's up to its count; a held one waits
	 * already. Without memory for that, none may: their mappings stay
	 * valid, only the count of its holders is lost. */
	if (!held && restore_await_holds(r, k, g->holders, g->uids, g->nuids) < 0)
		log_warnx("%s; no HOLD of it is accepted", error_get());
	/* The model's path as the check stat'ed it before listing its files:
	 * the watch's baseline, as a load's stat at open is (watch.c,
	 * watch_poll.c), so that an index renamed over after the check, before
	 * the model's directory is watched or first polled, is seen. */
	if (!held && p->path_known) {
		k->opened_path.known = 1;
		k->opened_path.st = p->path_st;
	}
	/* What its path named at the load that made it, as the store
	 * recorded it (version 10; else not told): its path may lead
	 * elsewhere now (review rev215 H1). */
	k->path_named = p->g->named;
	if (!held) {
		k->resolved_path = p->resolved_path;
		p->resolved_path = NULL;
		free(k->tree_root);
		k->tree_root = p->tree_root;
		k->tree_uid = p->tree_uid;
		k->tree_ino_known = p->tree_ino_known;
		k->tree_dev = p->tree_dev;
		k->tree_ino = p->tree_ino;
		p->tree_root = NULL;
	}
	/* The manager still has every piece under these names. */
	k->stored_slot = e->slot;
	k->stored_done = e->slot == m->slot;
	if (p->staged_dir != NULL) {
		/* It keeps serving its copy, knows where it came from (for
		 * polling and the next reload), and removes the copy when it
		 * closes, as the process that staged it would have. */
		k->origin = p->origin;
		k->norigin = k->source.nfiles;
		k->staged.dir = p->staged_dir;
		k->staged.bytes = k->bytes;
		for (size_t i = 0; i < k->source.nfiles; i++)
			k->staged.disk_bytes += (uint64_t)k->source.files[i].st.st_blocks * 512u;
		p->origin = NULL;
		p->staged_dir = NULL;
		log_info("model \"%s\": generation %" PRIu64 " keeps its staged copy %s%s",
			k->model_name, k->number, k->staged.dir, p->fs_unknown ?
			" (its source's filesystem could not be told: taken as remote)" : "");
	}
	return 0;
}
/* Checks the stored artifact memfd fd of a: a regular file sealed as a
 * published one is, of exactly the described size, with memory behind
 * every byte (derive_memfd_whole, as PUBLISH checks: one stored before
 * that check, or by a wcached without it, is not taken back). */
static int
check_artifact_memfd(int fd, const struct fdstore_artifact *a)
{
	char why[160];
	struct stat st;
	int seals;

	if (fd < 0)
		return error_set(-EINVAL, "its memfd \"%s\" is not in the store", a->fdname);
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode))
		return error_set(-EINVAL, "its memfd is not a regular file");
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 ||
		(seals & DERIVE_ARTIFACT_SEALS) != DERIVE_ARTIFACT_SEALS)
		return error_set(-EINVAL, "its memfd is not sealed against writing, shrinking, "
			"growing and unsealing");
	if ((uint64_t)st.st_size != a->size)
		return error_set(-EINVAL, "its memfd is %lld bytes, not %" PRIu64,
			(long long)st.st_size, a->size);
	if (derive_memfd_whole(&st, why, sizeof(why)) < 0)
		return error_set(-EBADMSG, "%s", why);
	return 0;
}

/* Lists artifact p of m again (restore_adopt_artifact), once m is restored
 * and p passed its check on the work queue (check_artifact). On failure its
 * descriptors not opened go back to s's table (give_back_artifact: closed
 * at the end of m's check, and dropped by the manager); an opened memfd is
 * closed here. */
static int
adopt_artifact(struct restore *s, struct registry *r, const struct fdstore_model *m,
	struct restore_artifact *p)
{
	const struct fdstore_artifact *a = p->a;
	struct model_entry *e = registry_find(r, m->name);
	struct generation *g = NULL;
	struct fdstore_name n;
	int err;

	if (e == NULL || e->current == NULL || e->current->number != a->source)
		err = error_set(-ESTALE, "its source generation %" PRIu64 " is not the one "
			"restored", a->source);
	else if (fdstore_name_parse(a->fdname, &n) < 0 || n.kind != FDSTORE_NAME_KIND_ARTIFACT)
		err = error_set(-EINVAL, "its memfd's name \"%s\" is not an artifact's",
			a->fdname);
	else if (p->err < 0)
		err = error_set(p->err, "%s", p->why);
	/* The configuration now, as a reload applies it (reload.c drops the
	 * artifacts of a model whose derive goes off): derive on, its
	 * builder still one who may build it (review rev181 F6), and within
	 * memory_budget as a publication must be (F10). */
	else if ((err = restore_builder_allowed(e, &p->builder)) >= 0 &&
		(err = restore_artifact_fits(r, a)) >= 0)
		err = restore_adopt_artifact(r, e, &(struct derive_stored){ .key = a->key,
			.source = a->source, .builder_uid = (uid_t)a->builder_uid,
			.builder_pid = (pid_t)a->builder_pid,
			.build_seconds = (double)a->build_ms / 1000.0,
			/* Kept as stored: not recorded stays not recorded. */
			.builder_cred = { .gid = p->builder.stored ? p->builder.gid : (gid_t)-1,
				.groups = p->builder.stored ? p->builder.groups : NULL,
				.ngroups = p->builder.stored ? (uint32_t)p->builder.ngroups : 0 } },
			&p->src, p->index_fd,
			(size_t)a->index_size, &g);
	if (err == 0 && g == NULL)
		err = error_set(-EINVAL, "it was not listed");
	if (err < 0) {
		if (p->src.nfiles > 0) {
			/* Opened: closed here, not by restore_close_untaken(), and the
			 * manager drops it too. In its builder's lane: this may
			 * be the memfd's last close. */
			(void)notify_remove_fds(a->fdname);
			gen_close_files_in(r, (uid_t)a->builder_uid, NULL, &p->src);
		}
		give_back_artifact(s, r, p);
		return err;
	}
	p->index_fd = -1;
	/* The manager still has both under these names. */
	g->stored_slot = e->slot;
	g->stored_artifact = n.artifact;
	g->stored_done = e->slot == m->slot;
	return 0;
}

/* After m's current generation came back: its derived artifacts, checked
 * with it (j->artifacts). One that does not come back is built again by
 * the next DERIVE of its key. */
static void
adopt_artifacts(struct restore_job *j)
{
	const struct fdstore_model *m = &j->s->desc->models[j->model];

	for (size_t k = 0; k < j->nartifacts; k++) {
		const struct fdstore_artifact *a = j->artifacts[k].a;

		int err = adopt_artifact(j->s, j->r, m, &j->artifacts[k]);

		/* With derive off, no DERIVE of it builds it again; one over a
		 * publication's limits (EFBIG) would be refused again when built
		 * the same (review rev185 F4). */
		if (err < 0)
			log_warnx("model \"%s\": derived \"%s\" of generation %" PRIu64 " not "
				  "restored: %s%s", m->name, a->key, a->source, error_get(),
				err == -ENOTSUP || err == -EFBIG ? "" :
				"; the next DERIVE of it builds it again");
	}
}

/* Frees j (what it held is given back or taken by then). */
static void
restore_job_free(struct restore_job *j)
{
	for (size_t i = 0; i < j->nartifacts; i++)
		restore_builder_clear(&j->artifacts[i].builder);
	free(j->artifacts);
	free(j->gens);
	free(j->path);
	free(j->stage_dir);
	free(j);
}

/*
 * Loop thread: the restored generation number of the model name serves,
 * but its path leads to other files now (why): they are loaded as a
 * reload wcached makes by itself (registry_reload_watched), which keeps
 * the tree that generation was found in and refuses, with the generation
 * serving still, files another user put there (waiting for `wcachectl
 * reload NAME`). Before, the model loaded afresh as the operator's load,
 * and bob's tree renamed in while wcached restarted was served (review
 * rev195 M1). It keeps the tree its files are in (restore_moved_tree): one
 * whose files were removed has none, and its reload waits for the
 * operator's.
 */
static void
reload_moved(struct registry *r, const char *name, uint64_t number, const char *why)
{
	log_info("model \"%s\": generation %" PRIu64 " serves, but its path leads to other "
		 "files now (%s): they are loaded as a reload wcached makes by itself",
		name, number, why);
	if (registry_reload_watched(r, name, NULL, NULL) < 0)
		log_warnx("%s; generation %" PRIu64 " serves until `wcachectl reload %s`",
			error_get(), number, name);
}

/*
 * Loop thread: the restored generation number of the model name serves,
 * and file k of it was linked or unlinked while no wcached ran (its ctime
 * moved with its link count: restore_check.c's file_changed), which cannot
 * be told from a write with its mtime put back: its files are loaded again,
 * validated anew, as the running wcached does (registry_relinked_now, then
 * a reload wcached makes by itself, which keeps its tree and takes only
 * its own files): the same index keeps it serving, another is the next
 * generation, files that no longer validate mark it modified. Once per
 * restart, not paced.
 */
static void
reload_relinked(struct registry *r, const char *name, uint64_t number, uint32_t k)
{
	struct model_entry *e = registry_find(r, name);
	struct generation *g = e != NULL ? e->current : NULL;

	if (g == NULL || g->number != number || k >= g->source.nfiles)
		return;
	if (!registry_relinked_now(r, g, k, &g->source.files[k].st))
		return;
	log_info("model \"%s\": generation %" PRIu64 " restored from the file descriptor store, "
		 "but %s was linked or unlinked while wcached was down (its ctime moved with its "
		 "link count): its files are loaded again, validated anew", name, number,
		file_basename(g->source.files[k].path));
	if (registry_reload_watched(r, name, NULL, NULL) < 0)
		log_warnx("%s; generation %" PRIu64 " serves until `wcachectl reload %s`",
			error_get(), number, name);
}

/*
 * Loop thread: the model name of j is not restored (why), and its path
 * goes through a place others may rename entries in (place; mount: a
 * mount a walk refused, a user's FUSE mount, said as such):
 * anyone of them may have renamed something else at its path while
 * wcached was down, or made the check fail to have it loaded afresh (a
 * staged model's origin replaced, a one-file model's file renamed aside:
 * its ctime moves). A load afresh would be the operator's kind, which
 * follows the path wherever it leads now; a reload wcached makes by
 * itself would take there only the directories and links the generation
 * serving was loaded through, and the store records none of them. So
 * nothing is loaded: what the path names waits for the operator's
 * `wcachectl reload NAME`, as a refused watched reload's files do
 * (registry_wait_for_operator, review rev201 H1).
 */
static void
wait_for_operator(struct registry *r, const char *name, const char *path, const char *place,
	int mount, const char *why)
{
	char line[ERROR_MAX + PATH_MAX * 2 + 640];

	snprintf(line, sizeof(line), "not restored: %s; its path %s goes through %s%s, and the "
		"store records no directory or link its generation was loaded through: what "
		"its path names now is served only after the operator's `wcachectl reload %s` "
		"(a config reload that leaves the model's section unchanged does not load it)",
		why, path, place, mount ? " (a mount the walk does not step onto: its user "
		"may change anything there)" : ", a directory others than its owner may rename "
		"entries in (writable by its group or all, not sticky)", name);
	log_errorx("model \"%s\": %s", name, line);
	registry_wait_for_operator(r, name, line, NULL);
}

/*
 * Loop thread: the model name was described waiting for the operator's
 * `wcachectl reload NAME` (line, its refusal's: fdstore.h's waits), and is
 * not restored (why; NULL: nothing was stored to restore). It waits still,
 * whatever place its path goes through: what its path names now was
 * refused, or could not be judged, before the restart, and no load the
 * restart makes is the operator's word on it (review rev203 H1).
 */
void
restore_still_waits(struct registry *r, const char *name, const char *why, const char *line)
{
	char *msg = NULL;

	if (asprintf(&msg, "not restored%s%s; it waited for the operator's `wcachectl reload "
		    "%s` before the restart, and waits still: %s", why != NULL ? ": " : "",
		    why != NULL ? why : "", name, line) < 0)
		msg = NULL;
	log_errorx("model \"%s\": %s", name, msg != NULL ? msg : line);
	/* Its line stays the refusal's, whatever restarts come between. */
	registry_wait_for_operator(r, name, msg != NULL ? msg : line, line);
	free(msg);
}

/*
 * Loop thread: the model name, listed and not restored (why), cannot be
 * judged against a tree (what: the store records none and its stored
 * files tell none, or it could not be kept): what its path names waits for
 * the operator's `wcachectl reload NAME`, once, rather than loading as the
 * operator's load, which would follow its path wherever it leads now
 * (review rev206 M1, L0, L1).
 */
static void
wait_unjudged(struct registry *r, const char *name, const char *why, const char *what)
{
	char line[ERROR_MAX * 2 + 320];

	snprintf(line, sizeof(line), "not restored: %s; %s, so what its path names now is "
		"served only after the operator's `wcachectl reload %s` (a config reload that "
		"leaves the model's section unchanged does not load it)", why, what, name);
	log_errorx("model \"%s\": %s", name, line);
	registry_wait_for_operator(r, name, line, NULL);
}

/* The kept files t recorded (fdstore.h: tree's kept), as a restart tells
 * a stored generation's (registry_kept_files), into *k. 0, or -ENOMEM
 * (then none: its owners are untold, and its reload fails closed). */
static int
stored_kept(const struct fdstore_tree *t, struct registry_kept_files *k)
{
	struct registry_kept_files v = { .nfiles = t->nkept,
		.named_told = t->named != FDSTORE_NAMED_UNRECORDED,
		.named_file = t->named == FDSTORE_NAMED_FILE };

	if ((v.owners = calloc(t->nkept, sizeof(*v.owners))) == NULL ||
		(v.ids = calloc(t->nkept, sizeof(*v.ids))) == NULL) {
		registry_kept_clear(&v);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < t->nkept; i++) {
		v.owners[i] = (uid_t)t->kept[i].uid;
		v.ids[i] = (struct registry_file_id){ .dev = (dev_t)t->kept[i].dev,
			.ino = (ino_t)t->kept[i].ino, .ctime_ns = t->kept[i].ctime_ns };
	}
	*k = v;
	return 0;
}

/*
 * Loop thread: the model m, listed (registry_expect) and not restored
 * (why), is loaded as a reload wcached makes by itself, judged against the
 * tree the description recorded for it (fdstore.h's tree: the tree its
 * newest generation was loaded from, or the tree or place the operator's
 * last load of it found), or, where it records none (a store before format
 * version 9), the tree its stored current generation's files are found in
 * now (p, the stored current generation, or NULL: restore_stored_tree);
 * not as the operator's load, which would follow its path wherever it
 * leads now: the model's deployer, or anyone who may rename entries in a
 * directory on its path, may have put another tree there while wcached was
 * down, or made the check fail (review rev204 H2, H3). Its reload keeps
 * too what p's stored descriptors told of the files it served (their
 * owners and identities: restore_tell_files), as a watched reload keeps
 * them from the generation serving; where they were not told, it waits for
 * the operator's reload wherever others may write in the directory holding
 * its files (registry_load.c's owners_told, review rev206 H1). Files of
 * that tree load as before; others wait for the operator's `wcachectl
 * reload NAME`. 0 (one line logged; the caller has registry_reload_watched
 * load it), or -1: nothing to judge it by, or no memory to keep it: it
 * waits for the operator's reload (wait_unjudged; one line logged).
 */
static int
keep_stored_tree(struct registry *r, const struct fdstore_model *m,
	const struct restore_prepared *p, const char *why)
{
	const struct fdstore_tree *t = &m->tree;
	struct registry_tree kept = { .root = t->root, .uid = (uid_t)t->uid,
		.root_known = t->root_known, .root_dev = (dev_t)t->root_dev,
		.root_ino = (ino_t)t->root_ino, .place = t->place,
		.place_mode = (mode_t)t->place_mode, .place_dir_len = t->place_dir_len };
	const char *whose = "the store recorded for it (the tree it was last loaded from, or "
		"that the operator's last load of it found)";
	struct registry_kept_files recorded = { .owners = NULL };
	char reason[ERROR_MAX];
	int err;

	snprintf(reason, sizeof(reason), "%s", why);
	if (t->root == NULL && p != NULL && p->tree_root != NULL) {
		kept = (struct registry_tree){ .root = p->tree_root, .uid = p->tree_uid,
			.root_known = p->tree_ino_known, .root_dev = p->tree_dev,
			.root_ino = p->tree_ino };
		whose = "its stored files are found in (the store, written by a wcached before "
			"format version 9, records none)";
	}
	if (p != NULL)
		kept.kept = p->kept;
	if (kept.root == NULL && p != NULL && t->root == NULL && p->tree_why[0] != '\0') {
		char what[ERROR_MAX + 64];

		snprintf(what, sizeof(what), "the file descriptor store, written by a wcached "
			"before format version 9, records no tree to judge it against, and its "
			"stored files tell none: %.850s", p->tree_why);
		wait_unjudged(r, m->name, reason, what);
		return -1;
	}
	if (kept.root == NULL) {
		wait_unjudged(r, m->name, reason, "the file descriptor store records no tree to "
			"judge it against (written by a wcached before format version 9, or the "
			"tree could not be told) and its stored files tell none");
		return -1;
	}
	/* Where no stored generation told them, the files its tree's
	 * generation served as the description recorded them (version 10: a
	 * model with no generation stored, review rev209 M1). */
	if (kept.kept.nfiles == 0 && t->nkept > 0 &&
		stored_kept(t, &recorded) == 0)
		kept.kept = recorded;
	err = registry_keep_tree(r, m->name, &kept);
	registry_kept_clear(&recorded);
	if (err < 0) {
		char what[ERROR_MAX + 64];

		snprintf(what, sizeof(what), "the tree its store recorded could not be kept (%s)",
			error_get());
		wait_unjudged(r, m->name, reason, what);
		return -1;
	}
	if (t->place != NULL)
		log_warnx("model \"%s\": not restored: %s; loading it as a reload wcached makes by "
			  "itself, judged against the place %s that the operator's last load of it "
			  "named (its tree %s, uid %" PRIu32 ")", m->name, reason, t->place,
			t->root, t->uid);
	else
		log_warnx("model \"%s\": not restored: %s; loading it as a reload wcached makes by "
			  "itself, judged against the tree %s (uid %u) %s%s", m->name, reason,
			kept.root, (unsigned)kept.uid, whose, kept.kept.nfiles > 0 ?
			" and the owners of the files it served" : "");
	return 0;
}

/* Loop thread: serves what j's check passed, or says why not. */
static void
restore_after(struct workq_job *w, int status)
{
	struct restore_job *j = w->arg;
	struct restore *s = j->s;
	struct registry *r = j->r;
	const struct fdstore_model *m = &s->desc->models[j->model];
	const struct fdstore_generation *g = j->gens[0].g;
	enum restore_result result = RESTORE_GONE;

	/* From now on descriptions describe the model as the registry has it,
	 * once each generation served is whole: the registry hears of it
	 * (registry_add_served) before serve() gives it its stored names and
	 * origin, so nothing is stored until then. */
	restore_carry_end(m);
	restore_state.restoring = 1;
	if (status == UV_ECANCELED || r->closing)
		result = RESTORE_GONE;
	else if (serve(j, &j->gens[0], 0) == 0)
		result = RESTORE_SERVED;
	else if (!registry_expect_end(r, m->name, j->expected))
		log_info("model \"%s\": not restored: it was unloaded or loaded anew meanwhile",
			m->name);
	else if (m->waits != NULL) {
		restore_still_waits(r, m->name, error_get(), m->waits);
		result = RESTORE_WAITS;
	} else if (j->others_rename) {
		wait_for_operator(r, m->name, j->path, j->rename_place, j->others_rename == 2,
			error_get());
		result = RESTORE_WAITS;
	} else {
		result = keep_stored_tree(r, m, &j->gens[0], error_get()) == 0 ? RESTORE_JUDGED :
			RESTORE_WAITS;
	}
	give_back(s, r, m->name, &j->gens[0], result == RESTORE_SERVED);
	for (size_t i = 1; i < j->n; i++) {
		int held = result == RESTORE_SERVED && serve(j, &j->gens[i], 1) == 0;

		if (result == RESTORE_SERVED && held)
			log_info("model \"%s\": generation %" PRIu64 ", held by workers before the "
				 "restart, restored; waiting %.3g s for them to say so (HOLD)",
				m->name, j->gens[i].g->number, r->restart_hold_ms / 1000.0);
		else if (result == RESTORE_SERVED)
			log_warnx("model \"%s\": generation %" PRIu64 ", held before the restart, "
				  "not restored: %s; its holders' mappings stay valid", m->name,
				j->gens[i].g->number, error_get());
		give_back(s, r, m->name, &j->gens[i], held);
	}
	for (size_t i = 0; result != RESTORE_SERVED && i < j->nartifacts; i++)
		give_back_artifact(s, r, &j->artifacts[i]);
	if (result == RESTORE_SERVED) {
		const struct model_entry *e = registry_find(r, m->name);

		s->restored[j->model] = 1;
		adopt_artifacts(j);
		/* What its path names still waits, as before the restart. */
		if (m->waits != NULL)
			registry_refusal_kept(r, m->name, m->waits);
		log_info("model \"%s\": generation %" PRIu64 " restored from the file descriptor "
			 "store: %" PRIu32 " file%s, %" PRIu64 " bytes, not read again", m->name,
			g->number, g->nfiles, g->nfiles == 1 ? "" : "s",
			e != NULL && e->current != NULL ? e->current->bytes : 0);
		if (j->gens[0].moved)
			reload_moved(r, m->name, g->number, j->gens[0].moved_why);
		else if (j->gens[0].relinked)
			reload_relinked(r, m->name, g->number, j->gens[0].relinked_k);
		/* Serving began: its full check starts now, not 100 ms after. */
		if (restore_state.checks_begun)
			restore_checks(r);
	}
	/* What it did not take leaves the store (not when stopping: the
	 * next process may take it). */
	restore_close_untaken(s, r, m, !r->closing);
	restore_state.restoring = 0;
	restore_sync(r);
	if (j->done != NULL)
		j->done(m->name, result, j->arg);
	restore_job_free(j);
	if (--s->jobs == 0 && s->started)
		restore_finish(s, r);
}

/* What the check of model m's stored files touches, as far as the loop
 * knows without asking any filesystem: the filesystem whose device the
 * description gives (a staged copy's origin's), from the mount table, read
 * once for all of s's models. Names the check in what. */
static uint64_t
stored_fs(struct restore *s, const struct fdstore_generation *g, char *what, size_t len,
	const char *name)
{
	struct fs_info fs;
	uint64_t dev;

	if (g->nfiles == 0) {
		snprintf(what, len, "model \"%s\": a warm restart's check", name);
		return WORKQ_LOCAL;
	}
	dev = g->files[0].origin_dev != 0 ? g->files[0].origin_dev : g->files[0].dev;
	if (restore_mounts(s) < 0 || fstype_mounts_find(&s->mounts, (dev_t)dev, &fs) < 0) {
		snprintf(what, len, "model \"%s\": a warm restart's check of its files", name);
		return WORKQ_UNKNOWN;
	}
	snprintf(what, len, "model \"%s\": a warm restart's check of its files on %s", name,
		fs.name);
	return workq_fs(fs.remote, (dev_t)dev);
}

/* Queues the check of m's current generation g and of the generations
 * workers held, and lists the model as loading meanwhile. 0, or -errno
 * with the message (nothing queued, every descriptor still in s's table). */
static int
queue_check(struct restore *s, struct registry *r, size_t model,
	const struct fdstore_generation *g, const char *path, enum pin_mode pin, int warm,
	restore_done_fn done, void *arg)
{
	const struct fdstore_model *m = &s->desc->models[model];
	struct restore_job *j = calloc(1, sizeof(*j));
	char what[sizeof(j->job.what)];
	uint64_t fs;
	int err = 0;

	if (j == NULL || (j->gens = calloc(m->ngenerations + 1, sizeof(*j->gens))) == NULL ||
		(j->artifacts = calloc(m->nartifacts + 1, sizeof(*j->artifacts))) == NULL ||
		(j->path = strdup(path)) == NULL ||
		(r->stage_dir != NULL && (j->stage_dir = strdup(r->stage_dir)) == NULL)) {
		if (j != NULL)
			restore_job_free(j);
		return error_set(-ENOMEM, "out of memory");
	}
	*j = (struct restore_job){ .s = s, .r = r, .model = model, .path = j->path, .pin = pin,
		.warm = warm, .stage_dir = j->stage_dir, .gens = j->gens,
		.artifacts = j->artifacts, .done = done, .arg = arg };
	j->job.arg = j;
	err = reserve(s, j->stage_dir, g, &j->gens[j->n++]);
	for (uint32_t k = 0; k < m->ngenerations && err == 0; k++)
		if (m->generations[k].role == FDSTORE_HELD)
			err = reserve(s, j->stage_dir, &m->generations[k], &j->gens[j->n++]);
	/* Its derived artifacts are checked with it. */
	for (uint32_t k = 0; k < m->nartifacts && err == 0; k++)
		reserve_artifact(s, &m->artifacts[k], &j->artifacts[j->nartifacts++]);
	fs = stored_fs(s, g, what, sizeof(what), m->name);
	/* registry_expect() says why it refused: the model is there already,
	 * or there is no memory for it. */
	if (err == 0 && (j->expected = registry_expect(r, m->name, path, pin, warm)) == 0)
		err = registry_find(r, m->name) != NULL ? -EEXIST : -ENOMEM;
	if (err == 0 && (err = workq_submit(&r->workq, &j->job, fs, what, restore_work,
				 restore_after)) < 0) {
		/* Listed, not loading: the caller's load takes it. */
		(void)registry_expect_end(r, m->name, j->expected);
		err = error_set(err, "%s", uv_strerror(err));
	}
	if (err < 0) {
		/* The caller logs why: kept across what giving back may say. */
		char why[ERROR_MAX];

		snprintf(why, sizeof(why), "%s", error_get());
		for (size_t i = 0; i < j->n; i++)
			give_back(s, r, m->name, &j->gens[i], 0);
		for (size_t i = 0; i < j->nartifacts; i++)
			give_back_artifact(s, r, &j->artifacts[i]);
		restore_job_free(j);
		return error_set(err, "%s", why);
	}
	s->jobs++;
	restore_carry_begin(m, j->expected);
	return 0;
}

/* restore_model's model m, described waiting for the operator's reload
 * with nothing to restore (why not, or NULL: none stored): listed, not
 * loaded, and still waiting (restore_still_waits). RESTORE_MODEL_WAITS, or
 * 0 (load afresh: it is listed already, or no memory to list it). */
static int
waits_still(struct registry *r, const struct fdstore_model *m, const char *path,
	enum pin_mode pin, int warm, const char *why)
{
	uint64_t expected = registry_expect(r, m->name, path, pin, warm);

	if (expected == 0) {
		log_warnx("model \"%s\": not restored: %s; loading", m->name, error_get());
		return 0;
	}
	(void)registry_expect_end(r, m->name, expected);
	restore_still_waits(r, m->name, why, m->waits);
	return RESTORE_MODEL_WAITS;
}

/* restore_model's model m, not restored (why) with its path unchanged:
 * listed, and judged as keep_stored_tree says: RESTORE_MODEL_JUDGED, or
 * RESTORE_MODEL_WAITS where nothing tells a tree to judge it by (a store
 * before format version 9 with no generation stored: waits once for the
 * operator's reload, review rev206 M1) or it could not be kept (L1). A
 * model listed already (a check that could not be queued listed it) is
 * judged all the same. 0: load afresh now (it could not be listed: no
 * memory or status slot, which the load meets too; one line logged). */
static int
judged_load(struct registry *r, const struct fdstore_model *m, const char *path,
	enum pin_mode pin, int warm, const char *why)
{
	uint64_t expected = registry_expect(r, m->name, path, pin, warm);

	if (expected == 0 && registry_find(r, m->name) == NULL) {
		log_warnx("model \"%s\": not restored: %s; loading", m->name, error_get());
		return 0;
	}
	if (expected != 0)
		(void)registry_expect_end(r, m->name, expected);
	return keep_stored_tree(r, m, NULL, why) == 0 ? RESTORE_MODEL_JUDGED :
		RESTORE_MODEL_WAITS;
}

/* Queues the check of a configured model's stored generations, or says
 * why it loads afresh (restore.h). */
int
restore_model(struct restore *s, struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm, restore_done_fn done, void *arg)
{
	const struct fdstore_model *m = NULL;
	const struct fdstore_generation *g = NULL;
	uint32_t i;

	if (s == NULL || s->desc == NULL)
		return 0;
	for (i = 0; i < s->desc->nmodels && m == NULL; i++)
		if (strcmp(s->desc->models[i].name, name) == 0)
			m = &s->desc->models[i];
	if (m == NULL) {
		log_info("model \"%s\": not in the file descriptor store; loading", name);
		return 0;
	}
	for (uint32_t k = 0; k < m->ngenerations; k++)
		if (m->generations[k].role == FDSTORE_CURRENT)
			g = &m->generations[k];
	if (strcmp(m->path, path) == 0 && m->waits != NULL && (g == NULL || !s->status_taken))
		return waits_still(r, m, path, pin, warm, s->status_taken ? NULL :
			"the stored status page was not usable");
	if (strcmp(m->path, path) != 0)
		log_info("model \"%s\": not restored: its path changed (was %s); loading", name,
			m->path);
	else if (!s->status_taken)
		return judged_load(r, m, path, pin, warm, "the stored status page was not usable");
	else if (g == NULL)
		return judged_load(r, m, path, pin, warm, "no current generation was stored "
			"(none served it, or the file descriptor store had no room for its "
			"descriptors: raise FileDescriptorStoreMax= in the unit)");
	else if (queue_check(s, r, i - 1, g, path, pin, warm, done, arg) < 0) {
		char why[ERROR_MAX];

		snprintf(why, sizeof(why), "%s", error_get());
		if (m->waits != NULL)
			return waits_still(r, m, path, pin, warm, why);
		return judged_load(r, m, path, pin, warm, why);
	} else {
		/* The pin is what the model keeps locked, not what it is: the
		 * generation serves as stored and takes the configured pin (its
		 * full check locks the metadata unless pin = none; pin = all
		 * locks every page after it, restore_checks). */
		if (g->pin != (uint8_t)pin)
			log_info("model \"%s\": its pin changed (was %s, now %s): restored all the "
				 "same, then pinned as configured", name,
				pin_mode_name((enum pin_mode)g->pin), pin_mode_name(pin));
		return 1;
	}
	return 0;
}
