/*
 * restore_internal.h: what the warm restart's files share (restore.c keeps
 * the table of what the store gave back and its life, restore_job.c checks
 * and serves one model's, restore_check.c checks a stored generation's
 * files off the loop, restore_layout.c whether a sharded or directory
 * model's path lists them still, restore_adopt.c lists what passed,
 * restore_store.c keeps the store in step). Not for other modules: they
 * use restore.h.
 */
#ifndef WC_RESTORE_INTERNAL_H
#define WC_RESTORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "base/error.h"
#include "format/source.h"
#include "fstype.h"
#include "registry.h"

struct fdstore_model;

/*
 * A model whose stored generations a warm restart's check still holds
 * (restore.c), as the previous description had it. While the registry
 * still expects it (registry_expect()'s token: no load or unload took its
 * place), every description written carries that entry (restore_describe),
 * since the store still holds every descriptor it names: a restart
 * meanwhile checks the model again as the previous process had it. The
 * entry's names are its own: a new generation of the model takes a number
 * after its last one, a new artifact one after every stored artifact's.
 */
struct restore_carried {
	const struct fdstore_model *model; /* the restore's description's */
	uint64_t expected;                 /* registry_expect()'s token */
};

struct restore_state {
	/* Nothing is stored while set: between restore_take() and
	 * restore_started(), so that the stored descriptors no check took are
	 * removed before new ones go in; and while restore_job.c serves what a
	 * check passed, until each generation has its stored names and origin. */
	int restoring;
	int status_stored;     /* the manager has the status page */
	uint64_t described;    /* describe_hash() of the stored description, 0: none */
	int desc_in_store;     /* a description is in the store: remove it before the next */
	uint64_t last_artifact; /* the highest n in a derived artifact's names in the store
				   (wc-<slot>-d<n>-a): the next one stored takes n + 1 */
	int checks_begun;      /* restore_checks() ran: a generation adopted later starts its own */
	struct restore_carried *carried; /* the models whose check runs (restore.c's) */
	size_t ncarried;
	/* The lines of store errors other than a full queue logged as warnings
	 * since the store was last in step (hashed): restore_sync() tries again
	 * every 200 ms, and each is logged once, not every time. */
	uint64_t logged[32];
	unsigned nlogged;
};

/* restore_store.c: one per process, as the manager's store is. */
extern struct restore_state restore_state;

struct fdstore_desc;
struct listen_fd;
struct registry;

/* What restore_take() took back (restore.c's), which each model's check
 * (restore_job.c) takes its descriptors from. */
struct restore {
	struct listen_fd *fds; /* the "wc-..." ones; fd -1 once taken */
	size_t n;
	struct fdstore_desc *desc;
	int status_fd;         /* -1 once the registry took it, or none */
	int status_taken;
	unsigned char *restored; /* per described model */
	unsigned jobs;          /* models whose check runs (restore_job.c) */
	int started;            /* restore_started() ran: the last check's end finishes */
	char **copies;          /* staged copies' directories of the generations checked */
	size_t ncopies;
	/* The mount table, read once (restore_mounts) for every
	 * restore_model() (stored_fs) and the lanes of the descriptors no
	 * model takes (restore_close_untaken), freed with s: mounts_read
	 * says it was. */
	struct fs_mounts mounts;
	int mounts_read;
};

/* restore.c: the stored descriptor called name not taken yet, or -1; *at
 * (may be NULL) its place in s->fds. */
int restore_find_fd(const struct restore *s, const char *name, size_t *at);

/* restore.c: reads the mount table into s->mounts unless it was: 0, or -1
 * (it could not be read; asked again next time). Asks no filesystem. */
int restore_mounts(struct restore *s);

/* restore.c: closes the stored descriptors not taken that only names (with
 * only NULL: that no model whose check still runs names) and, when drop,
 * has the manager drop them. In lanes of the daemon's own of r's closer:
 * CLOSER_LOCAL's for memfds and local files, CLOSER_DAEMON's otherwise. */
void restore_close_untaken(struct restore *s, struct registry *r,
	const struct fdstore_model *only, int drop);

/* restore.c: m's check runs (expected: registry_expect()'s token), and
 * descriptions carry its entry meanwhile; or it has ended. */
void restore_carry_begin(const struct fdstore_model *m, uint64_t expected);
void restore_carry_end(const struct fdstore_model *m);

/* restore.c: every check has ended (restore_started ran): closes what
 * nobody took, and frees s. Accepts NULL. */
void restore_finish(struct restore *s, struct registry *r);

struct derive_stored;
struct fdstore_generation;
struct gen_origin;
struct generation;
struct index_header;
struct model_entry;
struct model_source;
struct registry;

/* restore_adopt.c: lists a derived artifact of m taken back from the store,
 * whose pieces restore_job.c checked: src (the artifact memfd, opened and
 * validated by its reader) and the sealed index_fd, as the artifact
 * a->key of generation a->source (a->gen is ignored), READY
 * (derive_adopt). Takes src and index_fd on success only; 0 and *out (the
 * artifact's generation, derive.c's), or -errno with the reason in
 * error_get(). */
int restore_adopt_artifact(struct registry *r, struct model_entry *m,
	const struct derive_stored *a, struct model_source *src, int index_fd,
	size_t index_size, struct generation **out);

/*
 * One stored generation of a model, checked on the work queue
 * (restore_check.c) because the checks ask the files' filesystem, whose
 * server may hang: the loop resolves the stored descriptors first
 * (index_fd, fds), the check fills the rest, and the loop then serves it
 * without asking any filesystem (restore_job.c).
 */
struct restore_prepared {
	const struct fdstore_generation *g;
	int index_fd;
	size_t index_at;          /* its place in the restore's table */
	int *fds;                 /* per stored file, -1 when not in the store */
	size_t *at;
	const char *copy_dir;     /* its staged copy's directory (the restore's), or NULL */
	/* Filled by restore_check_generation(). */
	int err;                  /* 0, or -errno with why */
	char why[ERROR_MAX];
	char moved_why[ERROR_MAX]; /* see moved */
	struct model_source src;  /* its files own the descriptors they took */
	int *served;              /* gen_open_served() */
	struct gen_origin *origin; /* per file when staged copies, else NULL */
	struct fs_info fs;        /* the files' filesystem (a staged copy's: its origin's) */
	bool fs_unknown;          /* a staged copy's origin's filesystem could not be told */
	char *staged_dir;         /* the staged copies' directory, or NULL */
	/* Filled by restore_check_layout() (the current generation's): the
	 * model's path (its file, shard index or directory) as it stat'ed
	 * it before listing its files, the baseline its watch compares the
	 * path with (generation.h's opened_path). */
	bool path_known;
	/* A current generation's stored files are intact, but the model's
	 * path now leads to other files (another file at a file's name, a
	 * shard index or directory that lists others: set by
	 * restore_check_generation() and restore_work()), moved_why says
	 * which: the generation serves all the same, and the files at its
	 * path are loaded as a reload wcached makes by itself, whose rules
	 * keep its tree (restore_after). Before, the model loaded afresh as
	 * the operator's load, whoever made those files (review rev195 M1). */
	bool moved;
	/* A current generation's file relinked_k (the first) was linked or
	 * unlinked while no wcached ran (restore_check.c's file_changed): its
	 * files are loaded again, validated anew, once it serves
	 * (restore_after). */
	bool relinked;
	uint32_t relinked_k;
	struct stat path_st;
	/* Filled by restore_work() for the current generation that passed:
	 * the realpath of the model's path, the same before and after the
	 * checks (gen_resolved_path), or NULL; the generation's
	 * resolved_path once served; and the tree its files were found in
	 * (its root NULL when not told), the generation's tree_root and
	 * tree_uid (review rev187 R2), and its root's inode (tree_ino_known,
	 * review rev198 M1). */
	char *resolved_path;
	char *tree_root;
	uid_t tree_uid;
	int tree_ino_known;
	dev_t tree_dev;
	ino_t tree_ino;
	/* Why restore_stored_tree told no tree (one line), or "". */
	char tree_why[ERROR_MAX];
	/* Filled by restore_work() for the current generation
	 * (restore_tell_files): what its stored descriptors tell of the files
	 * it served, for the reload wcached makes by itself should it not be
	 * served (restore_after's keep_stored_tree); nfiles 0: not told. */
	struct registry_kept_files kept;
};

/* Checks p's generation (files in path's directory; staged copies are
 * under stage_dir, may be NULL) and opens it for serving. Work queue
 * thread: touches nothing but p and the descriptors it names. */
void restore_check_generation(struct restore_prepared *p, const char *path,
	const char *stage_dir);

/*
 * restore_layout.c: does the model's configured path (a shard index or a
 * directory) still list, as a load would, the files of p's generation, in
 * its order? A path of one file: yes (restore_check_generation compares
 * it). 0, or -ESTALE (another -errno when the stored index or path cannot
 * be looked at) with the reason: what lists other files, and which. Sets
 * p->path_st (path_known) to the path's stat before it lists the files.
 * Work queue thread: reads the index, asks the model's filesystem.
 */
int restore_check_layout(struct restore_prepared *p, const char *path);

/*
 * p's current generation moved (p->moved): the tree its path resolves to
 * now is not its files'. Where its first stored file still has a name
 * (not removed: /proc/self/fd names it without " (deleted)"), its tree is
 * the one it is found in there, as a load finds it (gen_resolved_path of
 * that file for a model configured as a .safetensors file, else of its
 * directory, every stored file at its place beneath it), into
 * p->resolved_path, tree_root and tree_uid: a link swapped to a sibling
 * tree, or another user's tree renamed over the model's, is then judged
 * by the watched reload's rules against it (restore_after). Where it was
 * removed (a file renamed over it, its directory removed), or it is a
 * staged copy, none: that reload waits for the operator's. path: the
 * model's configured path. Work queue thread.
 */
void restore_moved_tree(struct restore_prepared *p, const char *path);

/*
 * Whether the tree root (owned by root_uid), where a stored file owned by
 * owner is found, is one that file tells where the store recorded none:
 * root's or owner's, path (to the file, or to its directory) walked
 * through no symbolic link made by anyone else (registry_walk_links) to
 * the directory the file is in (dir_dev, dir_ino). A neighbour who may
 * rename entries in the file's directory may have moved it into his own
 * and pointed his link on the model's path at it; his directory is then
 * no tree of the model's (review rev213 H2). 0; or -1 with why (len
 * bytes). Work queue thread.
 */
int restore_owners_tree(const char *path, uid_t owner, const char *root, uid_t root_uid,
	dev_t dir_dev, ino_t dir_ino, char *why, size_t len);

struct gen_found_tree;

/* restore_owners_tree of found (gen_resolved_path's of path, for p, the
 * current generation checked: its stored file 0's owner, or its origin's
 * for a staged copy): 1 when it is one p's files tell, else 0. */
int restore_found_tree_owned(const struct restore_prepared *p, const char *path,
	const struct gen_found_tree *found);

/*
 * What p's stored descriptors tell of the files its generation served
 * (the current one), into p->kept: each file's owner, device and inode
 * (fstat of the stored descriptor: the file as the previous process
 * opened it, wherever it was renamed since), and whether its one file
 * lies straight in root (the tree recorded, or NULL) as /proc/self/fd
 * names it. None told (kept.nfiles 0) where a file is not in the store or
 * is a staged copy (its owner is its origin's, which the store does not
 * record), or out of memory. Work queue thread: fstat asks the files'
 * filesystem (review rev206 H1).
 */
void restore_tell_files(struct restore_prepared *p, const char *stage_dir, const char *root);

/*
 * p's current generation was not restored and the description records no
 * tree for its model (a store before format version 9): the tree of its
 * first stored file, where the model's path still leads to that very file
 * (its device and inode), or for a staged copy the tree of the file it was
 * copied from, where the model's path still leads to it (the origin's
 * device and inode as described), into p->tree_root, tree_uid and the
 * root's inode, for the reload wcached makes by itself. The path, the file
 * and the tree's root are reached by the judged walk (mountrule.h), never
 * by name. None, with p->tree_why saying why, where the file is no longer
 * at the model's path (removed, or renamed: anyone who may rename entries
 * in its directory may have put it anywhere he may write, under his own
 * FUSE mount too, review rev210 H1), the walk refused or failed, it is
 * not in the store, or it is a copy whose origin the path does not lead
 * to (or was not recorded: version 3): the model then waits for the
 * operator's reload. path: the model's configured path. Work queue thread
 * (review rev206 M1).
 */
void restore_stored_tree(struct restore_prepared *p, const char *path, const char *stage_dir);

/* Frees what p holds (after a failure, or once served: then src, served,
 * origin and staged_dir are NULL). Leaves the stored descriptors it names.
 * On the loop (r's closer takes the remote files). */
void restore_prepared_clear(struct registry *r, struct restore_prepared *p);

/* Is the stored file fd a staged copy (stage.h)? 1 with its path under
 * stage_dir in *copy (malloc'd; the link /proc/self/fd names, without a
 * " (deleted)" a removal left), 0 when not, -ENOMEM. Asks no filesystem. */
int restore_staged_copy(const char *stage_dir, int fd, char **copy);

/* Checks a stored index memfd fd, called fdname: sealed, of size bytes, a
 * valid index header for nfiles files, and maps it into *map (untouched on
 * failure: nothing stays mapped then). 0 or -EINVAL with the reason. */
int restore_check_index(int fd, const char *fdname, uint64_t size, uint32_t nfiles,
	struct index_header *h, void **map);

/*
 * restore_rules.c: the rules a stored derived artifact must still obey
 * (review rev181 F10, F6), beyond its bytes' checks in restore_job.c.
 */
struct fdstore_artifact;

/* Work queue thread: the limits a PUBLISH holds artifact a to that its
 * stored memfd fd can be held to before it is parsed: its compiled index
 * (a->index_size, which must be what the memfd compiles to) at most
 * DERIVE_MAX_INDEX, the head its reader parses at most DERIVE_MAX_HEAD.
 * 0, or -EFBIG with the reason. */
int restore_artifact_limits(int fd, const struct fdstore_artifact *a);

/* On the loop: with a memory_budget in r, is artifact a (its memfd and
 * compiled index, as a PUBLISH weighs it) within it? 0, or -EFBIG with
 * the reason. */
int restore_artifact_fits(const struct registry *r, const struct fdstore_artifact *a);

/* Who a stored artifact's builder is: its gid and groups as stored with
 * it (stored: a version 7 description records them as its connection had
 * them when it published), or else by the user database (an older one
 * records its uid only). known: stored, or the database has the uid (gid,
 * groups filled); lookup_err: the database could not be asked (errno).
 * Root and wcached's own uid are not looked up: they may always build. */
struct restore_builder {
	uid_t uid;
	int stored;
	int known;
	int lookup_err;
	gid_t gid;
	gid_t *groups;            /* malloc'd */
	int ngroups;
};

/* Work queue thread (the user database may be a network service): fills
 * *out for uid. 0, or -ENOMEM with the reason; a uid not known is no
 * error. restore_builder_clear() frees it (NULL too). */
int restore_builder_lookup(uid_t uid, struct restore_builder *out);
/* Any thread: fills *out from a's stored gid and groups (a->builder_gid
 * not FDSTORE_GID_UNRECORDED): the live rule's input, no database. 0, or
 * -ENOMEM with the reason. */
int restore_builder_stored(const struct fdstore_artifact *a, struct restore_builder *out);
void restore_builder_clear(struct restore_builder *b);

/* *out becomes a copy of from (its groups its own): 0, or -ENOMEM with
 * the reason (*out untouched). Any thread. */
int restore_builder_copy(const struct restore_builder *from, struct restore_builder *out);

/* On the loop: may e, as configured now, keep an artifact b built? 0;
 * -ENOTSUP when derive is off; -EPERM when b may not build e's artifacts
 * now (registry_may_build: derive_groups, root, wcached's own uid). The
 * reason in error_get(). */
int restore_builder_allowed(const struct model_entry *e, const struct restore_builder *b);

#endif
