/*
 * generation.h: one generation of a model and its life, as a state machine.
 *
 * A generation is the open files of one version of a model, their
 * mappings, the sealed index memfd, and a number that only grows. It is
 * made (gen_new) by a successful load (registry_load.c: loading happens
 * before it exists; the model reads "loading" meanwhile) or by a warm
 * restart (restore.h), and freed once nothing refers to it. Its life is
 * the state below, changed only by gen_set_state(), which refuses a
 * transition the table does not allow and logs each one at debug:
 *
 *   model "x": generation N: warming -> ready (warm)
 *
 *   from \ to   WARMING  READY  COLD  REWARM  MODIFIED  FAILED  CLOSED
 *   NEW           w        n     .      .        .        .       f
 *   WARMING       .        d     e      .        m        x       f
 *   READY         r        .     e      .        m        g       f
 *   COLD          a        p     .      a        m        x       f
 *   REWARM        s        s     e      .        m        g       f
 *   MODIFIED      .        .     .      .        .        .       f
 *   FAILED        .        .     .      .        m        .       f
 *
 *   w  installed for a model that warms (gen_start_warming)
 *   n  installed for a model that does not warm, or without a warm pool
 *   d  the last warming job ended: read to the end, or cancelled (a
 *      superseded, unloaded or stopping generation serves unwarmed)
 *   e  evicted: `wcachectl evict` or the memory budget (gen_evict)
 *   r  a residency check found memory pressure took its pages: warm again
 *   a  attached while cold: warm again (REWARM while the eviction that made
 *      it cold still runs, so that eviction does not drop the fresh pages)
 *   s  that eviction ended: warm (REWARM -> WARMING), or serve as is when the
 *      model does not warm (REWARM -> READY)
 *   p  pinned with pin = all while cold (locking reads every page), or
 *      attached while cold when the model does not warm
 *   m  a file was changed in place (watch.c, or a warming job found a file
 *      shorter than when it was loaded); no new attaches
 *   x  a warming job failed with an I/O error; no new attaches
 *   g  (and from WARMING and COLD) its files are gone from the remote
 *      server: another host replaced or removed them, no replacement
 *      loaded, and an fstat of a served descriptor says the server dropped
 *      them (gen_mark_gone); no new attaches
 *   f  nothing refers to it any more (gen_maybe_free frees it at once)
 *
 * MODIFIED and FAILED are final: a new generation (reload) replaces them.
 * A generation is attachable in WARMING, READY, COLD and REWARM.
 *
 * Reference counts are not states; they only keep a generation open:
 * it stays until it is neither current nor pending of its model
 * (gen_is_live), no client holds it (attached), no warming job reads it
 * (warm.pending), no page operation is queued on it (ops_pending, see
 * pages.h), no poll checks its served descriptors (served_checks) and,
 * restored after a restart as held, it no longer waits for its holders'
 * HOLDs (hold_until_ms, restore.h). An unloaded model's generations
 * keep their state, with model NULL, until released. Three attributes are
 * not states either: pinned (what pages.c actually locked, and
 * pin_error: why less), populated
 * (whether every page is mapped into the daemon, resident.h) and resident
 * (the latest measure of its bytes in memory); pages.c writes them
 * (resident also warm_done).
 *
 * This module is below the registry and the warm restart: it never calls
 * them. A promotion is reported through the registry's promoted hook, a
 * generation closing through its closed hook, any change through changed.
 * Page operations it queues report back to it through pages.h's hooks.
 *
 * Everything here runs on the event loop thread.
 */
#ifndef WC_GENERATION_H
#define WC_GENERATION_H

#include <limits.h>
#include <stdint.h>

#include "fstype.h"
#include "pages.h"
#include "registry.h"
#include "resident.h"
#include "format/source.h"
#include "warm.h"

enum gen_state {
	GEN_NEW,      /* installed, not yet warming or serving (only inside install) */
	GEN_WARMING,  /* being read into the page cache */
	GEN_READY,    /* serves; warm unless the model does not warm */
	GEN_COLD,     /* evicted from the page cache; an attach warms it again */
	GEN_REWARM,   /* attached while cold: warms when the running eviction, or the
			 * warm-up an eviction cancelled, has stopped */
	GEN_MODIFIED, /* a file was changed in place: no new attaches */
	GEN_FAILED,   /* warming failed (I/O error): no new attaches */
	GEN_CLOSED,   /* unreferenced, being freed */
};

/* What the model's path named at the load that made a generation
 * (generation's path_named), as its real path told it then: the values of
 * the file descriptor store's (fdstore.h's enum fdstore_named), which
 * records it (format version 10). */
enum gen_named {
	GEN_NAMED_UNTOLD = 0, /* not told */
	GEN_NAMED_DIR = 1,    /* not a file straight in its tree's root: a directory,
				 or a file deeper in its tree (a hub repo's) */
	GEN_NAMED_FILE = 2,   /* a file straight in its tree's root: a one-file model,
				 a link to one, a shard index */
};

struct page_work;

struct generation {
	uint64_t number;
	struct model_entry *model;  /* NULL once the model is unloaded */
	char *model_name;           /* for messages after unload */
	struct model_source source; /* files: fds and mappings, owned; the daemon's
				       own descriptions, never handed out */
	int *served_fds;            /* source.nfiles descriptors workers get: each
				       another open file description of the same
				       file (gen_open_served), owned */
	int index_fd;               /* sealed memfd, owned; never handed out */
	int served_index_fd;        /* the index as workers get it: another open file
				       description of index_fd's memfd, owned */
	const uint8_t *index;       /* read-only mapping of index_fd */
	size_t index_size;
	uint64_t bytes;             /* sum of file sizes */
	enum gen_state state;       /* written by gen_set_state() only */
	unsigned attached;          /* client references */
	/* The references workers took (an attach, a HOLD), by uid, uids
	 * ascending, counts 1 or more (gen_holder_add); a build's own
	 * reference on its source is none of them. Not kept for a derived
	 * artifact. holders_lost: how many of them are held whose uid could
	 * not be recorded (out of memory); while any is, the store records
	 * the holders' count only. The last one's release (gen_holder_drop)
	 * makes holders exact again, and the store records uids again. */
	struct gen_holder *holders;
	unsigned nholders;
	unsigned holders_lost;
	unsigned ops_pending;       /* page operations queued or running (pages.h) */
	struct page_work *page_queue; /* those operations, in order; the first runs */
	int pinned;                 /* PIN_* actually applied (pages.c) */
	int populated;              /* every page is mapped into the daemon (pages.c) */
	int relink_asked;           /* see relinked_sts below */
	/* The latest lock pages.c was refused: what and why, as its log line
	 * says it after the model's name (status's pin_error); empty when
	 * none was, or a later lock of that kind held. */
	char pin_error[1024];
	int pin_error_of;           /* PIN_METADATA or PIN_ALL: which lock it was */
	unsigned stored_slot;       /* its fds went to the manager's store under this
				       slot's names (restore.h); 0: none */
	int stored_done;            /* all of them (not only some: a full queue) */
	uint64_t stored_artifact;   /* a derived artifact's: stored as wc-<stored_slot>-d<n>-a
				       and -i under this n, unique in the store
				       (restore.h); 0: none */
	/* Restored from the store with holders (restore_await_holds): the
	 * wait for their HOLDs (restore_hold) ends then, on the loop's clock;
	 * until then a generation no longer current stays open even while
	 * nobody holds it. 0: not waiting. */
	uint64_t hold_until_ms;
	struct fs_info fs;          /* the filesystem of its files (the first remote one;
				       gen_source_fs), set by whoever made it: the load
				       pipeline off the loop, the warm restart; empty for a
				       derived artifact (a memfd) */
	int storage_noted;          /* watch.c said how its updates are seen */
	int source_replaced;        /* on a remote filesystem, not staged, and its files
				       were replaced by another host (watch.c): pages
				       not in memory may be unreadable */
	uint64_t replaced_at_errors; /* its model's load_errors when source_replaced
				       was set: a failed load since is the
				       replacement's (watch_poll.c) */
	/* The server no longer has its files (gen_mark_gone): the refusal
	 * new attaches get, naming why and what to do; NULL otherwise. */
	char *gone;
	unsigned served_checks;     /* polls that fstat its served descriptors, queued
				       or running (watch_poll.c): they keep it open */
	/* A staged generation (stage.h) serves local copies: source.files are
	 * the copies, origin the files they were copied from (path and stat
	 * when copied), which polling compares with what the paths name now.
	 * NULL (norigin 0) when it serves its files where they are. */
	struct gen_origin {
		char *path;
		struct stat st;
	} *origin;
	size_t norigin;
	/* What the model's path (its file, shard index or directory) was
	 * just before the load that made it opened it (stat, following
	 * symlinks), or, for a restored current generation, what the
	 * restart's check found it (restore_layout.c): polling's baseline for
	 * that path (watch_poll.c), and what the directory watch compares with
	 * once armed (watch.c), so that an index renamed between the load and
	 * the first poll or the watch, or while this generation warmed before
	 * it became current, is a change. known 0: not known (a derived
	 * artifact's, or a restored generation whose check did not stat the
	 * path); the first poll is the baseline then. */
	struct {
		int known;
		struct stat st;
	} opened_path;
	/* A links-only move of one of its files (file_links_moved: a hard
	 * link added or removed beside it, or a write with its mtime put back
	 * hidden behind one) asked that its files be loaded again, validated
	 * anew (gen_note_relinked), and that reload has not answered yet:
	 * relinked_i is the file; relinked_sts, one per file, the fstat of
	 * each file whose links moved when seen (that ask's check, or a later
	 * one before it answered: gen_relinked_also), st_nlink 0 where none
	 * was seen (a remote file's kept identity takes its ctime,
	 * registry_load.c's keep_tree: a cp -al snapshot links every file).
	 * adopt_st: the fstats such a reload found the same index with
	 * (gen_adopt_stats), waiting for page work, which reads
	 * source.files[].st on its thread, to end; NULL: none. */
	struct stat *relinked_sts;
	struct stat *adopt_st;
	size_t relinked_i;
	/* The realpath(3) of the model's configured path (a symbolic link to
	 * a hub snapshot: that snapshot's directory), taken off the loop when
	 * the load that made it opened its files (gen_resolved_path), or by a
	 * warm restart's check of a restored current generation; for a reload
	 * that found the same files, what the path resolved to then. While g is
	 * its model's current generation, an attach by this path finds the
	 * model (registry_find). NULL: not resolved (the path changed while
	 * its files were opened, or realpath failed), a derived artifact's, or
	 * a held generation a warm restart restored. Owned. */
	char *resolved_path;
	/* The root of resolved_path's model tree (gen_tree_root) and the
	 * user who owns it, found off the loop with resolved_path (by the
	 * load that made g, or a reload that found its files unchanged):
	 * the tree a watched reload must stay in, or swap to a sibling of
	 * the same owner (registry_load.c's same_tree), whatever became of
	 * the old tree since (README's swap removes it: review rev175 F8).
	 * A warm restart's check of a restored current generation finds
	 * them as a load does (review rev187 R2: today's owner of a path
	 * is not the tree's). NULL: not known (resolved_path NULL; a
	 * watched reload then finds the root from resolved_path). Owned. */
	char *tree_root;
	uid_t tree_uid;
	/* tree_root's device and inode as the load that made g found it
	 * (tree_ino_known 0: not told, a warm restart's or a hub repo's): a
	 * root renamed over in a place others may rename in is another tree
	 * at the same path (same_tree, review rev198 M1). */
	int tree_ino_known;
	dev_t tree_dev;
	ino_t tree_ino;
	/* What the model's path named (enum gen_named), told with
	 * resolved_path and tree_root (registry_load.c's take_resolved):
	 * a watched reload of a model whose path named a file takes no
	 * directory beside its tree for its sibling (sibling_swap, review
	 * rev191 F1). A warm restart's generation has the one the store
	 * recorded (format version 10): a path moved since cannot tell it
	 * (review rev215 H1). GEN_NAMED_UNTOLD: not told (resolved_path or
	 * tree_root NULL then, or a store before version 10): a watched
	 * reload tells it from the layout, failing closed. */
	int path_named;
	/* The symbolic links the model's path went through, every one the
	 * walk of the load that made g met (registry_links.c), or of a reload
	 * that found its files unchanged: a watched reload takes a link still
	 * among them whoever made it (review rev195 L1). nlinks of them, at
	 * most REGISTRY_WALK_SEEN (a directory a walk bound, text "", review
	 * rev199 H3, among them); NULL: none, or not known (that walk did not
	 * end at the files opened; a warm restart's generation): each link a
	 * watched reload meets is then judged by its maker. Owned. */
	struct gen_link *links;
	size_t nlinks;
	/* A staged generation's copy (stage.h): its directory under stage_dir
	 * (NULL when not staged), removed when the generation closes, except
	 * at shutdown when the manager's store keeps its files for the next
	 * process (restore.h); what it costs on disk and how long it took. */
	struct {
		char *dir;
		uint64_t bytes;         /* bytes copied (the files and a shard index) */
		uint64_t disk_bytes;    /* the copy's allocated size */
		double seconds;         /* the copy's time; 0 for one a restart kept */
	} staged;
	int watched;                /* its files' paths were compared with its files
				       once its model's directories were watched
				       (watch.c): a rename before that is seen too */
	unsigned holds_expected;    /* the holders it had when it was stored */
	uint64_t *hold_conns;       /* the connections whose HOLD it accepted, */
	unsigned nhold_conns;       /* at most holds_expected; freed with it */
	/* Those holders by uid, as the store recorded them (restore_await_holds):
	 * a HOLD takes one of its uid's places; NULL (nhold_places 0) when the
	 * store recorded only their count (version 5 or older), and any uid
	 * may take any place. Freed with it. */
	struct gen_place {
		uid_t uid;
		unsigned count;     /* its holders of that uid when stored */
		unsigned taken;     /* the HOLDs accepted from that uid */
	} *hold_places;
	unsigned nhold_places;
	int from_store;             /* taken back from the store: the previous process
				       served it, so its workers may HOLD it */
	int kept;                   /* a derived artifact listed in derive.c's table:
				       not freed while listed (derive.h) */
	int artifact;               /* a derived artifact (a memfd), listed or not: */
	uid_t builder_uid;          /* its descriptors close in this uid's lane of
				       r->closer (the last close of a memfd frees all
				       of its memory, and the builder chose its size) */
	/* The latest residency measure, taken off the loop at the end of every
	 * page operation (pages.c) and by the jobs of a clean warm-up
	 * (warm_done): status and metrics report it instead of walking the
	 * pages on the loop. */
	struct {
		int measured;               /* 0 until the first measure arrived */
		uint64_t bytes;             /* in memory (pages_resident) */
		enum resident_method method;
		uint64_t at_ms;             /* the loop's clock when it arrived */
		uint64_t epoch;             /* a page operation started in an earlier
					       epoch measured too early to count */
	} resident;
	/* A generation a warm restart adopted serves before its index is
	 * checked in full: the checks run on the work queue once every
	 * stored model is adopted, one generation at a time (restore.h,
	 * restore_checks). */
	enum {
		RESTORE_CHECK_NONE,    /* compiled here, or checked */
		RESTORE_CHECK_WAITING, /* adopted, its check not yet queued */
		RESTORE_CHECK_RUNNING, /* PAGE_RESTORE queued or running */
	} restore_check;
	/* The running or last warm-up: one job per file while it runs. Its
	 * outcome decides the transition out of WARMING (warm_done). */
	struct {
		struct warm_job **jobs;  /* nfiles entries, NULL when not running */
		unsigned pending;        /* jobs not yet done */
		uint64_t bytes;          /* read by finished jobs */
		uint64_t resident;       /* in memory as each job that read it all ended */
		enum resident_method resident_how; /* how the last one measured it */
		double seconds;          /* longest job's time */
		uint64_t started_ms;
		int error;               /* first job error, 0 if none */
		int cancelled;           /* a job was cancelled: not all was read */
	} warm;
	struct registry *registry;
	struct generation *next;    /* in the registry's list */
};

/* "new", "warming", "ready", "cold", "warming" (REWARM), "modified",
 * "failed", "closed": the words status and metrics print. */
const char *gen_state_name(enum gen_state s);

/* Moves g to state to; why says what caused it (for the debug log line).
 * Returns 0, or -EINVAL (logged as an error, state unchanged) when the table
 * above does not allow it. Setting the state g is in is a no-op. */
int gen_set_state(struct generation *g, enum gen_state to, const char *why);

/* May a client attach g (WARMING, READY, COLD, REWARM)? */
int gen_attachable(const struct generation *g);

/* Is g being warmed (WARMING or REWARM)? */
int gen_is_warming(const struct generation *g);

/* Does g keep its pages in memory, for the memory budget (WARMING, READY,
 * REWARM)? */
int gen_holds_memory(const struct generation *g);

/* Is g its model's current or pending generation? */
int gen_is_live(const struct generation *g);

/* Frees g (-> CLOSED) if nothing refers to it any more (see above). */
void gen_maybe_free(struct registry *r, struct generation *g);

/* Makes g (the model's pending generation) current, without changing its
 * state, and reports it through r->promoted (the registry publishes it);
 * the previous current generation is freed if unreferenced. */
void gen_promote(struct registry *r, struct model_entry *m, struct generation *g);

/* Starts warming every file of g on the pool (-> WARMING; -> READY when no
 * job could start). */
void gen_start_warming(struct registry *r, struct generation *g);

/* Asks every running warming job of g to stop; each ends later (warm_done). */
void gen_cancel_warming(struct registry *r, struct generation *g);

/* Drops the page cache of g's files: WARMING/READY/REWARM -> COLD; a
 * MODIFIED or FAILED generation keeps its state. */
void gen_evict(struct registry *r, struct generation *g);

/* Queues op on g's pages (pages.h) with the hooks that bring its outcome
 * back here: an eviction's end moves REWARM on, a residency check may warm
 * again, and g closes once unreferenced. */
void gen_queue_pages(struct registry *r, struct generation *g, enum page_op op);

/* Marks g modified in place (watch, or a warming job that found a file
 * shorter), with a log line: -> MODIFIED, warming cancelled, and a pending
 * replacement dropped (it never becomes current) but not freed; the
 * model's error says so, unless a file of that replacement is still open
 * for writing (an info line then: its writer is not done). */
void gen_mark_modified(struct registry *r, struct generation *g, const char *file);

/*
 * File i of g moved only its link count and ctime (file_links_moved), now
 * its fstat: where g is its model's current generation, attachable, served
 * where its files lie and not asked already, one line, g->relink_asked
 * set, the model's revalidate set to g's number, and the registry's
 * relinked hook called (the watch reloads the model, paced); g keeps
 * serving meanwhile. Else nothing (a pending one is checked again once
 * current). gen_relinked_now: the same marks, no hook, and the line where
 * say is set (1 where marked, else 0).
 */
void gen_note_relinked(struct registry *r, struct generation *g, size_t i,
	const struct stat *now);
int gen_relinked_now(struct generation *g, size_t i, const struct stat *now, int say);
/* File i of g moved its links too, now its fstat, while g's revalidation
 * is asked (the same check as file gen_note_relinked's, or a later one):
 * recorded for that revalidation (keep_tree). Else nothing. */
void gen_relinked_also(struct generation *g, size_t i, const struct stat *now);

/* A reload found g's files, after a links-only move, with g's own index
 * (validated anew): their fstats then (src's, one per file, the same
 * inodes) become g's, now or, while page work may read them on its
 * thread, once it ended. */
void gen_adopt_stats(struct generation *g, const struct model_source *src);

/* A read lease asked on fd and given back at once: 0, -EAGAIN while a
 * descriptor has the file open for writing, else -errno; *stuck set where
 * it could not be given back. Never waits (the loop may ask). */
int gen_lease_probe(int fd, int *stuck);

/*
 * Marks g, a generation served where it lies on a remote filesystem, as
 * gone from the server (watch_poll.c: another host replaced or removed its
 * files, no replacement loaded, and an fstat of the served descriptor of
 * file failed with err, ESTALE or ENOENT): -> FAILED, warming cancelled,
 * new attaches refused with g->gone, which also becomes its model's error
 * (status), and logged. Workers that hold g keep it. Nothing when g is not
 * attachable already.
 */
void gen_mark_gone(struct registry *r, struct generation *g, const char *file, int err);

/* One uid's references among g's holders. */
struct gen_holder {
	uid_t uid;
	unsigned count;
};

/* Counts a worker's reference of uid on g among g->holders (beside
 * gen_ref, which counts it in g->attached): 0 or -ENOMEM (nothing
 * counted; the caller counts it in holders_lost if it keeps the
 * reference). gen_holder_drop drops one of uid's: a recorded one while
 * uid has one (a uid's references are alike), else one of holders_lost.
 * So each uid's recorded count stays at most the references it holds,
 * and the shortfall of all of them is holders_lost: at 0, every count is
 * exact again. */
int gen_holder_add(struct generation *g, uid_t uid);
void gen_holder_drop(struct generation *g, uid_t uid);

/* Takes and drops a client reference on g. gen_ref of a cold current
 * generation warms it again and returns 1 (the caller then applies the
 * memory budget), else 0; it counts for the budget's LRU. gen_unref of the
 * last holder of a cold generation drops its pages; g closes if nothing
 * else refers to it. */
int gen_ref(struct registry *r, struct generation *g);
void gen_unref(struct registry *r, struct generation *g);

/*
 * Warms g, its model's current generation, cold since an eviction, again:
 * after the eviction still running or queued on it, or once a warm-up the
 * eviction cancelled has stopped (-> REWARM), else now (-> WARMING); a
 * model that does not warm (warm = no) is simply served again (-> READY).
 * why says what asked ("attached", "memory_budget raised") in the state
 * change's debug line. gen_ref's cold branch, and the reload that raised
 * memory_budget (reload.c), without counting as an attach.
 */
void gen_warm_again(struct registry *r, struct generation *g, const char *why);

/* Bytes of the generation's files in memory at the latest measure (by the
 * first method that is true for the daemon's user, resident.h), taken off
 * the loop after each page operation and each residency check, and by the
 * warming jobs as a warm-up ends; 0 before the first. *method (may be NULL)
 * names it ("cachestat", "mincore", "mapped", or "none" before the first);
 * *age_ms (may be NULL) receives its age in milliseconds on the loop's
 * clock, or -1 before the first. Constant time: status and metrics call it
 * on the loop. */
uint64_t gen_resident(const struct generation *g, const char **method, int64_t *age_ms);

/*
 * A new generation number of the model model_name (state NEW, in no list,
 * without a model: registry_add_* link it) made of src (files open and
 * mapped), the served descriptors (gen_open_served), the sealed index_fd
 * and its read-only mapping index. Takes all of them on success only; NULL
 * with errno and the reason in error_get() when out of memory or when the
 * index memfd cannot be reopened for workers (EMFILE: the table is full).
 */
struct generation *gen_new(struct registry *r, const char *model_name, uint64_t number,
	struct model_source *src, int *served_fds, int index_fd, const uint8_t *index,
	size_t index_size);

/* Copies a compiled index (len bytes at blob) into a memfd sealed with
 * INDEX_SEALS and maps it read-only: 0 with *fd and *map, or -errno with
 * the message (nothing open). For gen_new()'s index_fd and index. */
int gen_seal_index(const uint8_t *blob, size_t len, int *fd, const uint8_t **map);

/* Undoes gen_new() for a generation never linked: src gets its files back,
 * the served descriptors are closed, the index unmapped (index_fd stays
 * the caller's), g freed. */
void gen_unmake(struct generation *g, struct model_source *src);

/* A PAGE_CHECK found only resident bytes of g in memory (pages_done);
 * READY -> WARMING when memory pressure took more than 1% (counted in the
 * model's rewarm_count). */
void gen_residency_checked(struct registry *r, struct generation *g, uint64_t resident);

/*
 * Opens, for each file of src, the descriptor workers are given: a second
 * open file description of the same inode (through /proc/self/fd, so a
 * file renamed over or unlinked since is still the one reopened), checked
 * to be that inode. Workers may set flags on what they receive (O_DIRECT,
 * O_APPEND, O_NONBLOCK) or move its offset; none of that reaches the
 * descriptions the daemon warms, measures and stores through, nor another
 * generation. On success *out holds src->nfiles descriptors the caller owns
 * (gen_close_served); on failure nothing is open and the message names the
 * file.
 */
int gen_open_served(const struct model_source *src, int **out);

/* How much of a model's files may be holes, all of them together: more
 * than this and more than half of their bytes is refused (gen_check_holes). */
#define GEN_HOLES_MAX (64u << 20) /* 64 MiB */

/*
 * Refuses a model whose files are sparse: holes (SEEK_HOLE) of more than
 * half of their bytes and more than GEN_HOLES_MAX, summed over the model's
 * files (review rev173 F3; rev177 E: per file, many shards passed). A
 * hole costs its writer no disk, yet warming reads it into the page cache
 * as zeros, which the residency check warms again after pressure: a 4 KiB
 * file that claims 3 GiB took 3 GiB of every other model's memory. Not
 * st_blocks: compressed filesystems (ZFS, btrfs) report fewer blocks than
 * the size of honest files; ZFS with compression on turns all-zero records
 * into holes, which a real checkpoint has far less than half of. The
 * walk stops once the verdict is known (rev177 H). 0, -EINVAL with the
 * message (the file, its size, the holes counted, what to do), or -EIO
 * when a file shrank since it was opened. An lseek error other than
 * EINTR (tried again) fails open with one line: that file's rest counts
 * as data (generation.c's seek_failed says why). Work queue thread: lseek
 * walks the files' extents. The load and the warm restart's check of a
 * stored generation (restore_check.c) call it.
 */
int gen_check_holes(const struct model_source *src);

/* The filesystem of src's files that status shows and staging decides on:
 * the first remote one if any, else the first file's ("unknown" when
 * statfs fails; 0x0 for no file). */
void gen_source_fs(const struct model_source *src, struct fs_info *out);

/* What work on g's origin (the files it was opened or staged from: where
 * its updates come from) touches, for the work queue (workq.h):
 * WORKQ_LOCAL, or its remote filesystem's key. */
uint64_t gen_origin_fs(const struct generation *g);

/* Frees n origins (a staged generation's, or one being made); safe on NULL. */
void gen_free_origin(struct gen_origin *origin, size_t n);

/* The tree a model's files were found in (gen_resolved_path): its root
 * (allocated; NULL: not told) and the uid that owns it; and the model
 * directory they were found in (the one holding a one-file model or a
 * shard index), opened with no link followed: its device and inode
 * (dir_known 0: not told), which the walk of the path after the open must
 * end in (registry_load.c's check_links, review rev195 H2), and its owner,
 * group and mode, which say who may have put the files there. root_known: the
 * root's device and inode, from the descriptor its owner came from (0:
 * not told, as for a hub repo's blobs/ widened to the repo). */
struct gen_found_tree {
	char *root;
	uid_t uid;
	int root_known;
	dev_t root_dev;
	ino_t root_ino;
	int dir_known;
	dev_t dir_dev;
	ino_t dir_ino;
	uid_t dir_uid;
	gid_t dir_gid;
	mode_t dir_mode;
	/* In: the operator's load, where the kernel has no openat2: a file
	 * reached through a symbolic link inside the tree (its realpath
	 * beneath the root, told by path) is at its place, her word (review
	 * rev191 F4); a reload wcached makes by itself takes only files with
	 * no link. Out: a file was reached so (taken or not). */
	int operators;
	int link_unchecked;
};

/* A symbolic link a load's path went through (registry_links.c): the
 * link's device, inode, maker (its owner) and text, and the device and
 * inode of the directory holding it. A link's text is never changed in
 * place, and a link made again at a freed inode number by the same maker
 * in the same directory with the same text leads where it did: the same
 * five are the same link at the same place. Not its ctime, which anyone's
 * hard link of it (fs.protected_hardlinks=0) or rename in a directory
 * others may rename in changes (review rev198 L3). */
struct gen_link {
	dev_t dev;
	ino_t ino;
	uid_t uid;
	dev_t dir_dev;
	ino_t dir_ino;
	char text[PATH_MAX];
};

/*
 * The real path of a model's configured path for the generation made of
 * src's files (its resolved_path), or NULL. before is the realpath(3) of
 * path taken just before those files were opened (may be NULL), and is
 * taken: the result is before when path resolves to it still and each
 * file is the file at its place there (before itself: a model that is one
 * file, itself at its name in its directory opened with no link followed,
 * review rev187 R1; the file of its name in before: a directory; or beside
 * it: a shard index; through a symbolic link inside the tree too, found
 * beneath the tree's root, opened with no link followed, by openat2
 * RESOLVE_BENEATH: a link out of the tree is no file at its place, review
 * rev185 F5; with no link at all where the kernel has no openat2, review
 * rev187 R4, but one inside the tree, told by path, where found->operators,
 * review rev191 F4), else NULL with before freed. Where found is not NULL and the
 * result is not, found gets that tree's root (as gen_tree_root tells it)
 * and the owner of the directory the files were found beneath, from its
 * descriptor (review rev187 R2); found->root NULL otherwise.
 * Each file is src's as opened (its path and fstat), or when origin is not
 * NULL (a staged copy's, src->nfiles entries) the file it was copied from.
 * A path renamed over while the files were opened may name other files
 * than those opened; one switched to other files and back (A, then B,
 * then A again) resolves as before with B's files, and without the check
 * the generation would answer to A's real path with B's files, so that
 * the first model configured would be found by another model's real path
 * (review rev164 #1). The next reload resolves it again. One realpath and
 * one lstat of the path (before has no link in it: a link there now is the
 * path changed, not the file it leads to, review rev185 F2), one open of
 * the tree's root, then at most one openat2 and fstat a file. The load
 * pipeline and the warm restart's check call it on the work queue thread:
 * realpath and stat walk the filesystem, which may hang on a remote one.
 */
char *gen_resolved_path(const char *path, char *before, const struct model_source *src,
	const struct gen_origin *origin, struct gen_found_tree *found);

/*
 * The root of the model tree (tree.h: the model directory, or the one that
 * holds the model's file; <R>/models--X for a hub snapshot under it) of
 * resolved, a realpath(3) of a model's path (gen_resolved_path), allocated,
 * and its owner in *owner; NULL (*owner untouched) when it cannot be told
 * (stat fails, out of memory). A hub repo's blobs/ is widened to the repo
 * where the repo's owner owns blobs/ too. Stats by path: the work queue
 * thread calls it, for a tree no files were found beneath yet.
 */
char *gen_tree_root(const char *resolved, uid_t *owner);

/* Closes and frees what gen_open_served() opened; safe on NULL. */
void gen_close_served(int *fds, size_t n);

/*
 * Closes a model's files: served (gen_open_served's, or NULL) and src's,
 * mappings and descriptors, in a lane of r->closer (closer.h), never here.
 * Where fs is remote, in the daemon's lane: FUSE sends a FLUSH on every
 * close (a FUSE filesystem that implements it, as gcsfuse, s3fs and sshfs
 * do) and a server that hangs never answers it. Where it is local, in the
 * local lane: the last reference to a file that was renamed over frees its
 * pages and blocks (a third of a second per GiB), and its munmap alone
 * walks every page table entry. Frees served; src is left empty.
 */
void gen_close_files(struct registry *r, const struct fs_info *fs, int *served,
	struct model_source *src);

/* The same, but in owner's lane of r->closer, wherever the files are: a
 * derived artifact's memfd, whose builder is owner. */
void gen_close_files_in(struct registry *r, uid_t owner, int *served,
	struct model_source *src);

#endif
