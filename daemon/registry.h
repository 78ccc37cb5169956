/*
 * registry.h: the models wcached serves and their generations.
 *
 * A model name points to its current generation: the open files of one
 * version of the model, their mappings, the sealed index memfd, and a
 * number that only grows. Clients hold references to generations, not to
 * models: a generation stays open until it is neither current nor pending,
 * no client holds it, and no warming job reads it; then its files are
 * unmapped and closed and the kernel may free their pages.
 *
 * Loading is asynchronous: opening and validating the files and compiling
 * the index run on libuv's work queue, never on the loop. A new generation
 * of a model that is already served is "pending" while it warms and becomes
 * current only when it is warm, so workers never attach a cold model by
 * surprise; a first generation is current at once (nothing else could
 * serve). A load that fails leaves the current generation serving and the
 * error on the model, for status.
 *
 * A generation's life is a state machine: generation.h.
 *
 * Everything here runs on the event loop thread.
 */
#ifndef WC_REGISTRY_H
#define WC_REGISTRY_H

#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <uv.h>

#include "format/source.h"
#include "proto/wire.h"
#include "warm.h"

#include "access.h"
#include "fstype.h"
#include "proto/pin.h"
#include "statuspage.h"
#include "workq.h"

struct stage_request;
struct registry_sweep;
struct load_request; /* registry_load.c's */

struct generation; /* generation.h */
struct registry;

/* The descriptors wcached keeps free below its RLIMIT_NOFILE of limit:
 * REGISTRY_FD_RESERVE, or a quarter of a small limit. A client connection
 * whose descriptor falls in them is refused (server_budget.c's
 * fd_budget_init), and so is a load whose descriptors reach into them
 * (registry_load.c): a model's load must not leave wcached without room
 * for its clients, its control socket and its logs. */
#define REGISTRY_FD_RESERVE 64

static inline rlim_t
registry_fd_reserve(rlim_t limit)
{
	return limit / 4 < REGISTRY_FD_RESERVE ? limit / 4 : REGISTRY_FD_RESERVE;
}

/* The owners and identities of the files a model's generation served,
 * as a warm restart told them from its stored descriptors
 * (registry_tree's kept, model_entry's operator_tree): for a model of one
 * file (nfiles 1), that file's owner is whom a file at its name must have
 * (registry_load.c's same_file_owner, review rev187 R2b); every file's
 * owner may own files of the tree (same_owners, rev187 R3); the files
 * themselves are the only ones taken in a place others may rename entries
 * in (files_kept, rev201 H2), each with the st_ctim it had when told: a
 * restart's kept files are held by nothing while wcached is down, and a
 * filesystem gives a freed inode number to the next file made, whose
 * ctime is its own (review rev217 L1); named_file: the generation's path named a
 * file straight in the tree's root (sibling_swap, rev191 F1), as its load
 * told it (named_told: its path_named, recorded by a store of format
 * version 10), else as where the one file lay then (named_told 0:
 * registry_load.c's keep_restart_files fails closed on the layout, review
 * rev215 H1). nfiles 0: none told. */
struct registry_kept_files {
	uid_t *owners;          /* per file */
	struct registry_file_id {
		dev_t dev;
		ino_t ino;
		int64_t ctime_ns; /* st_ctim (file_time_ns) */
	} *ids;                 /* per file */
	size_t nfiles;
	int named_file;
	int named_told;
};

/* Frees what k holds and empties it. */
void registry_kept_clear(struct registry_kept_files *k);

/* What a watched reload keeps of g's files (registry_load.c's keep_tree),
 * into *k (empty it with registry_kept_clear): each file's owner and
 * identity (a staged copy's origin's), its shard index's where g read one,
 * and what its path named (named_told where g's load told it). 0, or
 * -ENOMEM (k left empty). */
int registry_kept_of(const struct generation *g, struct registry_kept_files *k);

/* What a load is (registry_load.c's queue_load) and what reload_again asks
 * for: a load or reload by the operator resolves the model's path anew; a
 * watched one (registry_reload_watched) keeps the tree its newest
 * generation resolved. Ordered: an operator's reload that comes while a
 * watched one is asked for wins. */
enum reload_kind {
	RELOAD_NONE = 0,     /* a load: no reload */
	RELOAD_WATCHED = 1,  /* wcached saw the change (inotify, a poll) */
	RELOAD_OPERATOR = 2, /* `wcachectl reload NAME` (registry_reload) */
};

/* model_entry's operator_tree.owners_untold: why a reload wcached makes
 * by itself cannot tell whose a model's files were (0: it can). */
enum { OWNERS_UNTOLD_RESTART = 1, OWNERS_UNTOLD_FAILED_LOAD = 2 };

struct model_entry {
	char *name;
	char *path;
	enum pin_mode pin;
	/* registry_pin()'s count: a load in flight installs its own pin
	 * only when no pin or unpin came since it was queued (the newer
	 * word wins, whichever it is). */
	uint64_t pin_seq;
	int warm;
	unsigned slot;              /* in the status page */
	struct generation *current; /* NULL until a load succeeds */
	struct generation *pending; /* warming to replace current */
	uint64_t entry_id;          /* unique per entry (an unload and re-add makes a new one) */
	uint64_t load_id;           /* newest load request for this model */
	uint64_t last_generation;   /* last number given out (kept across unload) */
	unsigned loading;           /* load requests in flight */
	/* The newest of them, until it ends: withdrawn from the work queue
	 * when a newer load supersedes it before it has started. */
	struct load_request *queued_load;
	uint64_t expect_id;         /* registry_expect()'s token while it counts in
				       loading, else 0 */
	enum reload_kind reload_again; /* a reload came while a load ran, or it
				       waits for a release: run it after */
	/* Its newest load was refused for descriptors (its own reach into
	 * the reserve): loaded again, as a watched reload, once a generation
	 * closes, its descriptors closed and its files unmapped in the
	 * closer's lanes (registry_reload_held's RELOAD_CLOSED). */
	int room_wait;
	/* Its watches are armed again at the next watch_sync, which then
	 * reloads it where its path changed since the failure: a load failed,
	 * the first since one worked or with its path seen otherwise than at
	 * the failure before (a directory removed and made again, whose watch
	 * went with the old one: review rev199 M2). */
	int watch_rearm;
	/* The errno for which a watched reload could not tell whether its
	 * files were being written (registry_load.c's find_writer), said
	 * once, or 0. */
	int writer_unknown;
	/* Which inodes its newest generation serves (registry_link: a digest
	 * of each file's device and inode number, a staged copy's origin's),
	 * and the newest generation linked whose inodes were not those of
	 * the one linked before it: a swap, as against the same files loaded
	 * again. watch.c's backoff counts every watched reload but the one
	 * that made it (review rev197 W1). */
	uint64_t inodes_digest;
	uint64_t new_inodes;
	/* Its newest watched reload found this file open for writing
	 * (registry_load.c's find_writer) and made no generation: a
	 * read-only descriptor of wcached's own on it, which
	 * registry_writer_gone asks again (the watch reloads the model once
	 * no writer is left, wherever the file is and whatever events its
	 * directory gives), its real path and since when (registry_now_ms),
	 * for status; -1, NULL and 0 otherwise. */
	int writer_fd;
	char *writer_path;
	uint64_t writer_since_ms;
	/* The number of its current generation whose files a links-only
	 * move asks to load again, validated anew (generation.c's
	 * gen_note_relinked), until a reload carrying it answers
	 * (registry_load.c's reloads_relinked); 0: none asked. */
	uint64_t revalidate;
	char *error;                /* last load error, NULL if none */
	/* A watched reload the model-tree rules refused (registry_load.c's
	 * same_tree and linked_in: a tree moved or made again by another user,
	 * another user's file or link, a first comer at a place others may
	 * write), and its line (NULL without memory for it): those files wait
	 * for the operator's word, `wcachectl reload NAME`, a `wcachectl load`
	 * or a config reload that changes the model's section, and a config
	 * reload's retry of failed models leaves the model (reload.c's
	 * retry_failed, review rev195 M1). Kept across later failures of
	 * wcached's own reloads; cleared by the operator's load or reload of
	 * the model, and by a new generation or the files serving found
	 * again. */
	int refused_tree;
	char *refused_line;
	uint64_t attach_count;      /* successful attaches */
	uint64_t error_count;       /* refused attaches */
	uint64_t swap_count;        /* generations that became current after the first */
	uint64_t load_errors;       /* failed loads */
	double last_warm_seconds;   /* warm-up time of the newest warm generation */
	uint64_t last_attach;       /* attach sequence number, for the budget's LRU */
	uint64_t denied_count;      /* attaches refused by allow_users/allow_groups */
	uint64_t rewarm_count;      /* warm-ups after pages of a warm generation went missing */
	/* Access: when restricted, only these users and groups attach (plus
	 * root and wcached's own user). */
	struct access_list access;
	/* Derived artifacts (derive.h): off unless derive; who may build
	 * them (root and wcached's own user always may); how long a builder
	 * has to publish. */
	int derive;
	struct access_list builders;
	uint64_t derive_timeout_ms;
	/* Requests answered once no page operation or warm-up job of the
	 * model's generations is queued or running (registry_pages_wait). */
	struct page_waiter *page_waiters;
	/* Shared storage (fstype.h): how updates are seen, how often its
	 * paths are polled, whether its files are staged locally. */
	enum fs_watch watch;
	unsigned poll_interval_ms;
	enum fs_stage stage;
	uint64_t polls;             /* polls of its paths done (watch.h) */
	double poll_seconds;        /* their time, in all */
	uint64_t poll_changes;      /* changes polling found and acted on */
	/* Its staging copy in flight on the work queue (stage.h), NULL if
	 * none: cancelled when a newer load supersedes it or the model is
	 * unloaded, rather than copying gigabytes only to remove them. */
	struct stage_request *staging;
	/* The last load that failed: the filesystem its path is on (statfs of
	 * the path or its directory; known 0 when neither answered) and what a
	 * stat of the path saw then (errno 0 or not), so that a model with no
	 * generation is polled too and loaded again when its path changes. */
	struct {
		int known;
		struct fs_info fs;
		dev_t dev;
		int err;
		struct stat st;
	} failed_path;
	/* The tree the model's last load or reload by the operator found,
	 * a failed one too (review rev177 D): what a reload wcached makes by
	 * itself keeps when the model's newest generation recorded none (it
	 * has none: its first load failed). root NULL: none found. When the
	 * path resolved: its tree root and the root's owner (gen_tree_root).
	 * When only the directory D holding it did (the path did not exist):
	 * the tree root the path would have as a directory in D, D's owner,
	 * and (place) the place the path names (empty and "." names dropped,
	 * a link that points nowhere yet followed), where its files may
	 * appear (registry_load.c's same_tree says which trees are taken),
	 * D's mode and the length of its path, place's first place_dir_len
	 * bytes (a D writable by others than its owner takes no first comer's
	 * files by itself: review rev187 R5). */
	struct {
		char *root;
		char *place;
		uid_t uid;
		mode_t place_mode;
		size_t place_dir_len;
		/* root's device and inode, where known (root_known): what a
		 * warm restart recorded of the tree its stored generation was
		 * loaded from (registry_keep_tree); an operator's load
		 * records none. */
		int root_known;
		dev_t root_dev;
		ino_t root_ino;
		/* What a warm restart told of the files its stored generation
		 * served (registry_keep_tree's registry_tree): their owners
		 * and identities, for the judge a watched reload of that
		 * generation would have kept (registry_load.c's keep_tree);
		 * owners_untold: the restart recorded a tree but could not
		 * tell whose its files were (OWNERS_UNTOLD_RESTART), or the
		 * operator's load found a tree but failed, so nothing served
		 * it (OWNERS_UNTOLD_FAILED_LOAD, review rev209 H1); 0 else.
		 * An operator's load clears them. */
		struct registry_kept_files kept;
		int owners_untold;
	} operator_tree;
	struct model_entry *next;
	struct model_entry *name_next; /* its chain in struct registry's by_name */
};

/* Called on the loop when a load request ends: status 0 or -errno, a
 * one-line message (valid during the call), the generation number loaded
 * (0 on failure). */
typedef void (*registry_done_fn)(int status, const char *message, uint64_t generation,
	void *arg);

/* A load refused before the registry had an entry of its name
 * (registry_entry_new: no status page slot left, or no memory): what a
 * config reload needs to tell such a model from one unloaded at run time,
 * and to load it again (reload.c, registry_refused). */
struct registry_refusal {
	char *name;
	int err; /* -ENOSPC, -ENOMEM */
	struct registry_refusal *next;
};

struct registry {
	uv_loop_t *loop;
	struct model_entry *models;
	/* The models by name (registry_entry_named): nbuckets chains, a power
	 * of two, or NULL (then the list is walked; rebuilt from it at the next
	 * entry). Once every entry of a reload made watch_sync look up every
	 * other by name, a walk each: 1000 models took 12 s. */
	struct model_entry **by_name;
	size_t nbuckets, nnamed;
	struct generation *generations; /* every open generation */
	struct warm_pool *pool;         /* NULL: warming disabled */
	uint64_t memory_budget;         /* bytes; 0: none */
	uint64_t next_load_id;
	uint64_t attach_seq;            /* counts attaches: orders the budget's LRU */
	unsigned loads_in_flight;
	int closing;
	/* The work queue (workq.h): loads, staging, page work and polls;
	 * what may block on a remote filesystem is held to a share of it. */
	struct workq workq;
	/* Closes model files on remote filesystems off the loop (closer.h);
	 * NULL: close() at once (unit tests). */
	struct closer *closer;
	/* With a closer: woken from its lanes (closer_then) once a closed
	 * generation's descriptors are closed and its files unmapped, when
	 * the loads refused for descriptors run again (room_wait); made at
	 * the first generation handed over, closed by registry_close.
	 * closes_async_state: 0 not made yet, 1 open, -1 closed or could
	 * not be made (then they run again when a generation is handed
	 * over). */
	uv_async_t closes_async;
	int closes_async_state;
	/* Generations closed so far (their descriptors closed, as above):
	 * a load refused for descriptors that saw one close meanwhile runs
	 * again at once (load_request's closes_seen). */
	uint64_t closes_done;
	/* The status page workers read (statuspage.h). */
	struct statuspage page;
	/* The manager's file descriptor store (restore.h): 1 when wcached
	 * hands it the generations and the status page, which then is left
	 * as it is at shutdown. */
	int fdstore;
	int restart_hold_ms;            /* restore_adopt_held(): how long HOLDs may come */
	/* How many retired generations of one model may stay open before a
	 * reload of it waits (REGISTRY_RETIRED_MAX, set by registry_init;
	 * unit tests that need more generations raise it). */
	unsigned retired_max;
	/* wcached's soft RLIMIT_NOFILE as registry_init found it (main.c
	 * raised it to the hard limit before), read once: what bounds the
	 * descriptors of retired generations past retired_max
	 * (registry_load.c's retired_full). RLIM_INFINITY: no bound; 0: not
	 * known (getrlimit failed), and retired_max bounds them alone. */
	rlim_t fd_limit;
	/* Where staged copies go (stage.h; registry_set_stage_dir), absolute
	 * and resolved (no symbolic link in it) when it existed when set;
	 * NULL: none, and a model that must stage is refused. */
	char *stage_dir;
	/* registry_stage_sweep()'s sweep while it runs (registry_sweep.c),
	 * with the stagings that wait for it; NULL otherwise. */
	struct registry_sweep *sweep;
	unsigned holds_open;            /* generations waiting for HOLDs (restore.h) */
	/* The watch's inotify descriptor failed for good (watch.c): no event
	 * is heard any more, and every model's paths are polled instead
	 * (registry_polls), as status and metrics then say. */
	int inotify_failed;
	/* The owner's hooks: warming progress or end, and a model's current
	 * generation changing (for client notifications). */
	void (*changed)(struct registry *);
	void (*swapped)(struct registry *, struct model_entry *, uint64_t generation);
	/* m's current generation's files moved only their link counts
	 * (gen_note_relinked): the owner reloads m, paced (watch.h's
	 * watch_revalidate). NULL: nothing asked. */
	void (*relinked)(struct registry *, struct model_entry *);
	/* A generation closes (gen_maybe_free): the warm restart's hook
	 * (restore_forget), so that neither the registry nor generation.c
	 * calls the module above them. NULL: nothing to do. */
	void (*closed)(struct registry *, struct generation *);
	/* How generation.c reports upward, set by registry_init: the
	 * model's pending generation became current (gen_promote). */
	void (*promoted)(struct registry *, struct model_entry *, struct generation *);
	/* ... and page work of g ended (a page operation, pages.h, or its
	 * last warm-up job), once g's state reflects it. */
	void (*pages_ended)(struct registry *, struct generation *);
	/* ... and a closed generation's files and index went to the lanes
	 * owners[0 .. n) of the closer (gen_maybe_free). */
	void (*handed_over)(struct registry *, const uid_t *owners, size_t n);
	/* Derived artifacts (derive.h) count against the memory budget: their
	 * bytes, kept up to date by derive.c, and its hook that drops those
	 * nobody holds, least recently used first, until at least want bytes
	 * are gone or none is left; it returns the bytes dropped. NULL: none. */
	uint64_t derived_bytes;
	uint64_t (*drop_derived)(struct registry *, uint64_t want);
	/* 1 while the artifacts workers hold alone take more than
	 * memory_budget, as the last enforcement found (registry_budget.c:
	 * it warns once each time that becomes so). */
	int held_over_budget;
	/* Names whose latest load was refused before they had an entry, one
	 * each, at most REGISTRY_REFUSALS_MAX (the newest beyond are not
	 * kept): dropped when an entry of the name is made, or by
	 * registry_refusals_prune. */
	struct registry_refusal *refusals;
	unsigned nrefusals;
	void *derive_owner;
	void *owner;
};

/* The most refusals kept: a configuration's models and a few more (a
 * `wcachectl load` of a new name refused while the page is full is one). */
#define REGISTRY_REFUSALS_MAX 8191u

/* Queues a residency check of every current generation on the work queue
 * (resident.h), which refreshes the figure status and metrics report; a
 * populated one that memory pressure shrank by more than 1% is warmed again
 * and counted in rewarm_count. Call it every few seconds. */
void registry_check_residency(struct registry *r);

/* registry_check_residency, but only for the current generations whose
 * figure is max_age_ms old or older (or was never measured) and that have
 * no page operation queued (it measures when it ends): status and metrics
 * call it after they replied, so a client that polls them sees figures
 * about that old at most, and the loop never waits for a measure. */
void registry_refresh_residency(struct registry *r, uint64_t max_age_ms);

/* Initialises an empty registry with its status page; pool may be NULL. */
int registry_init(struct registry *r, uv_loop_t *loop, struct warm_pool *pool);

/*
 * registry_init() for a daemon that uses the manager's file descriptor
 * store (r->fdstore = 1): status_fd -1 makes a status page the next process
 * can write too (sealed F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, mode
 * 0600, without F_SEAL_FUTURE_WRITE); otherwise status_fd is the page the
 * previous process stored, checked (those seals, STATUS_PAGE_BYTES, the
 * magic) and taken on success only: -EINVAL naming what failed.
 */
int registry_init_stored(struct registry *r, uv_loop_t *loop, struct warm_pool *pool,
	int status_fd);

/* The open generation number of m, or NULL. */
struct generation *registry_generation(struct registry *r, const struct model_entry *m,
	uint64_t number);

/*
 * Adds the model name (path, pin and warm as configured) served by g, a
 * generation made outside the load pipeline (gen_new; a warm restart's,
 * restore.h): g is linked, made current at once and published, without
 * being loaded or warmed; the memory budget applies. g must be READY.
 * expected: 0 for a model not there yet, or registry_expect()'s token for
 * the one it listed (which this ends, served or not). 0, -EEXIST when the
 * model is already there, -ESTALE when the model expected was unloaded or
 * loaded anew meanwhile, -ENOMEM (g untouched then).
 */
int registry_add_served(struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm, struct generation *g, uint64_t expected);

/*
 * The model name (path, pin and warm as configured), whose generation
 * comes back later (a warm restart checks it on the work queue first:
 * restore.h), listed now as loading, so that an attach of it says so and
 * start_wait_seconds names it. A load or an unload of it meanwhile takes
 * its place. Returns the token registry_add_served() and
 * registry_expect_end() take, or 0 with the message (-EEXIST, -ENOMEM).
 */
uint64_t registry_expect(struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm);

/* Ends what registry_expect() began without serving (the model no longer
 * counts it as a load in flight): 1 when the model still waited for it
 * (the caller loads it afresh), 0 when an unload or a load took its place
 * or it ended already. */
int registry_expect_end(struct registry *r, const char *name, uint64_t expected);

/* Adds g (gen_new) as an older generation of m, not current: it stays open
 * while something refers to it (gen_maybe_free). */
void registry_add_generation(struct registry *r, struct model_entry *m, struct generation *g);

/*
 * m's current generation failed a check after it began serving (a warm
 * restart's full index check): it is no longer current (its status slot
 * reads not served, statuspage.h, so holders see stale), why becomes the
 * model's error, and the model loads again from its configured path as
 * the next generation, as a reload wcached makes by itself
 * (registry_reload_watched), judged against the tree the withdrawn
 * generation was loaded through, not as the operator's load: in a place
 * others may rename entries in, what its path names now may be anyone's
 * (review rev203 L1).
 */
void registry_withdraw(struct registry *r, struct model_entry *m, const char *why);

/*
 * The model name, which nothing serves (a warm restart gave its stored
 * generation up, or had none stored, and its path goes through a place
 * others may rename entries in: registry_others_rename_on), is not
 * loaded: what its path
 * names waits for the operator's word, as the files of a watched reload
 * the model-tree rules refused do: why becomes its error and line (why
 * when NULL) its refusal's line (status's waits_for_reload, and what the
 * file descriptor store describes: fdstore.h's waits, which the next
 * start keeps, review rev203 H1), and a config reload that leaves its
 * section unchanged does not load it (reload.c's retry_failed, review
 * rev201 H1). An operator's reload asked for meanwhile (reload_again)
 * runs now. Nothing when name is not there.
 */
void registry_wait_for_operator(struct registry *r, const char *name, const char *why,
	const char *line);

/* What registry_keep_tree() gives a model to be judged by. */
struct registry_tree {
	const char *root;       /* NULL: nothing (the call does nothing) */
	uid_t uid;
	int root_known;
	dev_t root_dev;
	ino_t root_ino;
	const char *place;      /* NULL: none */
	mode_t place_mode;
	size_t place_dir_len;
	/* The files the generation it was loaded from served, as the
	 * restart's stored descriptors told them (copied); kept.nfiles 0: not
	 * told (none stored, a staged copy, a descriptor missing): with no
	 * place, the reload then waits for the operator's wherever others
	 * than the tree's owner may write in the directory holding its files
	 * (review rev206 H1). */
	struct registry_kept_files kept;
};

/*
 * The model name, which nothing serves, was described by the previous
 * process with t, the tree its newest generation was loaded from or the
 * tree and place the operator's last load of it found (fdstore.h's
 * fdstore_tree): its operator_tree becomes t, so that a reload wcached
 * makes by itself (registry_reload_watched; a warm restart's load of a
 * model it could not restore, or that had nothing stored) is judged
 * against it, as against the tree of a generation serving (review rev204
 * H2, H3). Until the operator's next load. 0, -ENOENT, or -ENOMEM.
 */
int registry_keep_tree(struct registry *r, const char *name, const struct registry_tree *t);

/*
 * The model name, whose generation restored from the file descriptor
 * store serves, was described waiting for the operator's word on what its
 * path names now (line: the refusal's): it still waits, as after a
 * refused watched reload (refused_tree, status's waits_for_reload).
 * Nothing when name is not there.
 */
void registry_refusal_kept(struct registry *r, const char *name, const char *line);

/*
 * Whether others than a directory's owner may rename entries in a
 * directory on path (writable by its group or all, not sticky, as a
 * watched reload judges it: registry_load.c's others_rename_in): one that
 * holds a directory or symbolic link the path goes through, the entry it
 * ends at, or, where it ends at a directory, that directory (the model's
 * files are its entries); where the path cannot be walked to its end, the
 * directory the walk stopped in (the one holding the name it could not
 * take, reached through any link: review rev203 H2), or a directory above
 * it as spelled that stat(2) finds so. 1 with that
 * directory said in why (len bytes: "DIR (uid U, mode M)"; out of memory,
 * not walked: 1 too); 2 where a walk refused a mount on the way (a user's
 * FUSE mount: its user may change anything there), the walk's line in why;
 * else 0. Work queue thread: it asks the model's
 * filesystem.
 */
int registry_others_rename_on(const char *path, char *why, size_t len);

/*
 * Loads path as the next generation of the model name (adding the model if
 * it is new) on the work queue; done (may be NULL) runs on the loop when the
 * generation is validated and installed, or the load failed. Returns 0 when
 * queued, or -errno. An older load of name still waiting for its turn on the
 * work queue is superseded without opening anything: its done runs
 * (-ECANCELED) on the loop soon after, never from this call.
 */
int registry_load(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, registry_done_fn done, void *arg);

/*
 * Re-checks the model's path: when a file was replaced (another inode, size
 * or mtime than the current generation's) or the model failed before, loads
 * it again as above; otherwise done(0, "unchanged", current number) runs at
 * once. -ENOENT for an unknown model.
 */
int registry_reload(struct registry *r, const char *name, registry_done_fn done, void *arg);

/*
 * registry_reload() for a change wcached saw by itself (watch.c: inotify or
 * a poll), no operator's act: the new files must lie in the model tree its
 * newest generation's path resolved to (tree.h's root), or the load fails
 * with one line naming both real paths, and the generation serving stays
 * (a symbolic link renamed over the model's directory by whoever owns its
 * parent moves the model only with an operator's reload: review rev173 F1).
 */
int registry_reload_watched(struct registry *r, const char *name, registry_done_fn done,
	void *arg);

/*
 * Loop thread: m waits for a writer (its writer_fd) and none is left now:
 * a read lease on that file is granted (or cannot be asked any more). 0
 * while one is, and when m waits for none. Never blocks: the lease is
 * asked for without waiting and given back at once.
 */
int registry_writer_gone(struct model_entry *m);

/* Sets who may attach name (restricted 0: everyone who reaches the
 * socket; access.h). The lists are copied. -ENOENT, -ENOMEM. */
int registry_set_access(struct registry *r, const char *name, int restricted, const uid_t *uids,
	size_t n_uids, const gid_t *gids, size_t n_gids);

/* Stops serving name; its generations close when released. A load of it
 * still waiting for its turn on the work queue is withdrawn: its done runs
 * (-ECANCELED, "unloaded before its load began") on the loop soon after,
 * never from this call; one already running is answered "superseded" when
 * it ends. -ENOENT. */
int registry_unload(struct registry *r, const char *name);

/*
 * Removes the entry entry_id of model name when it has never served: no
 * current or pending generation and no load in flight. For a runtime load
 * that added a name and failed: it leaves nothing behind. -ENOENT when name
 * is not that entry any more, -EBUSY when it serves or loads.
 */
int registry_forget(struct registry *r, const char *name, uint64_t entry_id);

/* pin = all (lock every page), or back to pin = metadata. -ENOENT. */
int registry_pin(struct registry *r, const char *name, enum pin_mode pin);

/* Drops the page cache of the model's files (pages no process maps stay
 * cold); the model reads as cold until attached again. -ENOENT, -EBUSY when
 * it is pinned. */
int registry_evict(struct registry *r, const char *name);

/*
 * Calls done once the page work registry_pin or registry_evict queued on
 * name has ended: no page operation (pages.h) and no warm-up job of the
 * model's generations queued or running, so that status shows what it
 * left. Status 0, or -EIO when the pin in force could not be applied
 * (pin_applied differs from pin: mlock refused, see the log), with the
 * current generation's number; -ECANCELED when the model is unloaded
 * first (or the registry closes). May call done before it returns.
 * Returns 0, or -ENOENT / -ENOMEM without calling done.
 */
int registry_pages_wait(struct registry *r, const char *name, registry_done_fn done, void *arg);

/* Marks a generation modified in place (see watch), with a log line. A
 * pending replacement is dropped (it never becomes current) but not freed:
 * call registry_collect() afterwards. */
void registry_mark_modified(struct registry *r, struct generation *g, const char *file);

/* File i of g moved only its link count and ctime, as now shows
 * (file_links_moved): generation.c's gen_note_relinked. */
void registry_relinked(struct registry *r, struct generation *g, size_t i,
	const struct stat *now);
/* The same marks, no line and no hook: the caller reloads the model
 * (a warm restart's, restore_job.c). 1 where marked, else 0. */
int registry_relinked_now(struct registry *r, struct generation *g, size_t i,
	const struct stat *now);

/* Marks g, served where it lies on a remote filesystem, as gone from the
 * server (gen_mark_gone: the served descriptor of file failed an fstat
 * with err), with a log line; reported through r->changed. */
void registry_mark_gone(struct registry *r, struct generation *g, const char *file, int err);

/* Frees every generation nothing refers to any more. */
void registry_collect(struct registry *r);

/*
 * The model called name; else the one whose configured path is name; else
 * the one whose current generation's resolved path (the realpath of its
 * configured path, generation.h) is name; NULL if none. Where several
 * models have that path, the one added first: the first in the
 * configuration (a model a later reload or `wcachectl load` adds comes
 * after those already there). O(models), no filesystem access.
 */
struct model_entry *registry_find(struct registry *r, const char *name);

/* Who asks to attach: the peer's credentials (peercred.h: SO_PEERCRED and
 * every group of SO_PEERGROUPS) and the uid that always may (wcached's own). denied_logged is the
 * caller's: the first refusal of this peer is logged, later ones only
 * counted. */
struct registry_peer {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	const gid_t *groups;
	int ngroups;
	uid_t self_uid;
	int *denied_logged;
	uint64_t conn_id;        /* the connection asking, for HOLD's once-only rule */
	/* Whether a warning about this peer may be logged now (a limit per
	 * uid: one that loops on refused attaches must not flood the log);
	 * more gets what the line adds ("" or how many were not logged).
	 * NULL: always. */
	int (*may_warn)(void *arg, uid_t uid, char *more, size_t size);
	void *warn_arg;
};

/* What an attach gives the client (the ATTACH_OK reply). */
struct registry_attachment {
	struct generation *gen;  /* the reference taken: registry_release() it */
	uint64_t generation;     /* its number */
	uint64_t index_size;
	uint32_t file_count;
	unsigned status_slot;    /* 0: no status page; else its last descriptor */
	int fds[WIRE_MAX_FDS];   /* index, files, status page: the generation's
				    and the registry's, borrowed while the
				    reference is held */
	size_t nfds;
};

/*
 * Attaches the model called name (or whose configured path is name) for
 * peer: checks access (allow_users/allow_groups; root and self_uid always
 * may), checks the current generation is attachable (generation.h), takes
 * a client reference on it (an attach of a cold model warms it again, and
 * counts for the memory budget's LRU) and counts the attach. Returns 0 and
 * fills *out, or -errno with the message for the client in msg:
 * -ENOENT "not served", -EACCES (access denied), -EIO (never loaded, or
 * failed while warming), -ESTALE (modified in place, or its files gone
 * from the remote server: gen_mark_gone). Refusals after the
 * access check count in the model's attach_errors, access refusals in
 * access_denied.
 */
int registry_attach(struct registry *r, const char *name, const struct registry_peer *peer,
	struct registry_attachment *out, char *msg, size_t msg_size);

/*
 * The model called name (or whose configured path, or real path, is name:
 * registry_find) if peer may use it (access.h): 0 and *out, or -ENOENT
 * ("not served") or -EACCES (counted in the model's denied_count, logged
 * once per peer) with the client's message in msg. Of several models found
 * by one path, the first (in the configuration) that peer may use; when
 * none, the first refuses. What registry_attach() and restore_hold() check
 * first.
 */
int registry_find_for(struct registry *r, const char *name, const struct registry_peer *peer,
	struct model_entry **out, char *msg, size_t msg_size);

/* Sets how name's updates are seen (watch, poll_interval) and whether its
 * next generations are staged. -ENOENT. */
int registry_set_storage(struct registry *r, const char *name, enum fs_watch watch,
	unsigned poll_interval_ms, enum fs_stage stage);

/* Sets the directory staged copies go to (the stage_dir key; copied,
 * resolved with realpath(3) when it exists): for the next stagings; copies
 * made already stay where they are until their generations close.
 * -ENOMEM. */
int registry_set_stage_dir(struct registry *r, const char *dir);

/* Removes from stage_dir what earlier processes left there (stage_sweep):
 * every staged copy no open generation serves and also_keep (nalso
 * directories, copied: the copies a warm restart is still checking,
 * restore.h) does not name. Call once at start, before the loop runs. The
 * removal (possibly whole copies, hundreds of gigabytes) runs on the work
 * queue and this returns at once: stagings queued before it ends wait for
 * it (they would need the space it frees, and a copy they made would not
 * be in its keep list); nothing else does. */
void registry_stage_sweep(struct registry *r, char *const *also_keep, size_t nalso);

/* Whether m serves staged copies of files on the filesystem fs (a
 * generation's origin's): stage = yes, or auto and fs is remote. */
int registry_stages(const struct model_entry *m, const struct fs_info *fs);

/* Whether m's paths must be polled for updates: inotify failed for good
 * (r->inotify_failed), watch = poll, or watch = auto and its current
 * generation is on a remote filesystem (fstype.h), or, with no generation,
 * its path was when its last load failed; or it has a generation and its
 * last reload failed with neither its path nor the directory holding it
 * there (a model configured by its file whose directory was removed: the
 * watch of that directory is gone with it, and no event of its path would
 * come again). */
int registry_polls(const struct registry *r, const struct model_entry *m);

/* Sets whether name has derived artifacts, who may build them (the gids of
 * derive_groups; root and wcached's own user always may) and the builders'
 * deadline. -ENOENT, -ENOMEM. */
int registry_set_derive(struct registry *r, const char *name, int enabled, const gid_t *gids,
	size_t n_gids, unsigned timeout_seconds);

/* May peer build m's derived artifacts? */
int registry_may_build(const struct model_entry *m, const struct registry_peer *peer);

/* The uid of a reference that is no worker's (registry_release): the
 * kernel never gives a peer this uid. */
#define REGISTRY_NO_UID ((uid_t)-1)

/*
 * Takes a client reference on g, an open generation (of m, or a derived
 * artifact with m its source model; m may be NULL), for a worker of uid,
 * and fills *out as registry_attach() does, with m's status slot. For
 * derive.c, which chooses the generation itself. The reference counts
 * among g's holders of uid (generation.h), which a warm restart's store
 * records, except a derived artifact's or one of REGISTRY_NO_UID.
 */
void registry_attach_generation(struct registry *r, const struct model_entry *m,
	struct generation *g, uid_t uid, struct registry_attachment *out);

/* m's current generation if it may be attached (generation.h): 0 and *out,
 * or -EIO (never loaded, failed while warming) or -ESTALE (modified in
 * place, or its files gone from the remote server) with the client's
 * message, counted in m's attach_errors. */
int registry_servable(struct model_entry *m, struct generation **out, char *msg,
	size_t msg_size);

/*
 * Whether m is failed and nothing is mending it: its last load failed and
 * no generation serves, or its current generation failed while warming
 * (GEN_FAILED: a transient EIO) or is gone from its remote server
 * (GEN_FAILED, gen_mark_gone), or its last replacement failed (m->error)
 * while an older generation still serves, with no load of it in flight and
 * no replacement warming. The first two refuse every attach, the third
 * serves old weights, until it is loaded again (`wcachectl reload NAME`, or
 * a config reload: reload.c, but for one whose files wait for the
 * operator's word, refused_tree). Returns 1 with the reason in why (for a log
 * line), else 0 (why untouched). A model modified in place is not failed:
 * loading the same files again cannot mend it (a rename(2) must).
 */
int registry_failed(const struct model_entry *m, char *why, size_t why_size);

/* Whether the latest load of name was refused before the registry had an
 * entry of it (no status page slot left for a new name, or no memory), so
 * that its model is not served for that and not because it was unloaded:
 * 1 with the reason in why ("its load was refused: ..."), else 0 (why
 * untouched). */
int registry_refused(const struct registry *r, const char *name, char *why, size_t why_size);

/* Drops the refusals of the names keep(name, arg) says 0 for (a reload:
 * those no longer configured). */
void registry_refusals_prune(struct registry *r, int (*keep)(const char *name, void *arg),
	void *arg);

/* Drops a reference registry_attach(), registry_attach_generation() or
 * restore_hold() took for a worker of uid (the peer's), or one taken with
 * gen_ref() and no uid (REGISTRY_NO_UID). */
void registry_release(struct registry *r, struct generation *g, uid_t uid);

/* The model g is a generation of (NULL once unloaded), and a model's name. */
const struct model_entry *registry_generation_of(const struct generation *g);
const char *registry_model_name(const struct model_entry *m);

/* Milliseconds on the registry's loop clock. */
uint64_t registry_now_ms(const struct registry *r);

/* The bytes of the models' current generations, and of those pinned whole
 * (pin = all, which the budget never evicts): what memlimit_fits() weighs,
 * for the start's warning and status alike. Returns how many are served. */
unsigned registry_served_bytes(const struct registry *r, uint64_t *models, uint64_t *pinned);

/* What the memory budget weighs: the bytes of every current generation
 * that keeps its pages (gen_holds_memory), of every pending one (what
 * warming keeps resident), and of the derived artifacts. */
uint64_t registry_warm_bytes(const struct registry *r);

/* Evicts the least recently attached unpinned models until the resident
 * total of current generations fits the budget. */
void registry_enforce_budget(struct registry *r);

/* Unloads every model and frees everything (at shutdown, after the server
 * has dropped its clients and the warm pool is closed). */
void registry_close(struct registry *r);

/* Warming totals over all current and pending generations, for status. */
void registry_progress(const struct registry *r, uint64_t *done, uint64_t *total,
	unsigned *warming, unsigned *models);

#endif
