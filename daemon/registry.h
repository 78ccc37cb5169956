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
#include <sys/stat.h>
#include <sys/types.h>
#include <uv.h>

#include "format/source.h"
#include "proto/wire.h"
#include "warm.h"

#include "pin.h"

struct generation; /* generation.h */
struct registry;

struct model_entry {
	char *name;
	char *path;
	enum pin_mode pin;
	int warm;
	unsigned slot;              /* in the status page */
	struct generation *current; /* NULL until a load succeeds */
	struct generation *pending; /* warming to replace current */
	uint64_t entry_id;          /* unique per entry (an unload and re-add makes a new one) */
	uint64_t load_id;           /* newest load request for this model */
	uint64_t last_generation;   /* last number given out (kept across unload) */
	unsigned loading;           /* load requests in flight */
	int reload_again;           /* a reload came while a load ran: run it after */
	char *error;                /* last load error, NULL if none */
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
	int restricted;
	uid_t *allow_uids;
	size_t n_allow_uids;
	gid_t *allow_gids;
	size_t n_allow_gids;
	struct model_entry *next;
};

/* Called on the loop when a load request ends: status 0 or -errno, a
 * one-line message (valid during the call), the generation number loaded
 * (0 on failure). */
typedef void (*registry_done_fn)(int status, const char *message, uint64_t generation,
	void *arg);

struct registry {
	uv_loop_t *loop;
	struct model_entry *models;
	struct generation *generations; /* every open generation */
	struct warm_pool *pool;         /* NULL: warming disabled */
	uint64_t memory_budget;         /* bytes; 0: none */
	uint64_t next_load_id;
	uint64_t attach_seq;            /* counts attaches: orders the budget's LRU */
	unsigned loads_in_flight;
	int closing;
	/* The status page: one u64 per model slot holding its current
	 * generation (0: not served), mapped read-only by workers. */
	int status_fd;                  /* read-write memfd, owned */
	int status_ro_fd;               /* read-only reopen, passed to clients */
	uint64_t *status;               /* read-write mapping */
	struct status_slot {
		char *name;               /* owns the slot forever */
		uint64_t last_generation; /* so numbers grow across unload and load */
	} *slots;
	unsigned nslots;
	/* The manager's file descriptor store (restore.h): 1 when wcached
	 * hands it the generations and the status page, which then is left
	 * as it is at shutdown. */
	int fdstore;
	int restart_hold_ms;            /* registry_adopt_held(): how long HOLDs may come */
	unsigned holds_open;            /* generations waiting for HOLDs */
	/* Hooks: warming progress or end, and a model's current generation
	 * changing (for client notifications). */
	void (*changed)(struct registry *);
	void (*swapped)(struct registry *, struct model_entry *, uint64_t generation);
	void *owner;
};

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

/* Gives slot (1 .. STATUS_SLOTS - 1) to name with last_generation, as the
 * previous process had it; before any model is added. 0, -EINVAL, -ENOMEM. */
int registry_restore_slot(struct registry *r, unsigned slot, const char *name,
	uint64_t last_generation);

/*
 * Serves src (files open and mapped) and the sealed index index_fd as
 * generation number of the model name, current and READY at once, without
 * loading or warming it (a warm restart: restore.h). Takes src and index_fd
 * on success only. 0, -EEXIST when the model is already there, -ENOMEM.
 * O(files): the caller has checked the index's header (index_open) and
 * each file against it; the rest of the index is checked in full on the
 * work queue while the generation serves (registry_restore_checks), and
 * only then are its metadata locked and its pages mapped into wcached.
 */
int registry_adopt(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm, uint64_t number, struct model_source *src, int index_fd, size_t index_size);

/* The open generation number of m, or NULL. */
struct generation *registry_generation(struct registry *r, const struct model_entry *m,
	uint64_t number);

/*
 * Adds src and the sealed index_fd as generation number of the model name,
 * which registry_adopt() restored with a newer current generation: one that
 * workers held before the restart, holders of them (1 or more). It is not
 * served to new attaches; it stays open for restart_hold_ms
 * (registry_await_holds: registry_hold() may then take up to holders
 * references), and after that until its last holder releases it. Takes src
 * and index_fd on success only. 0, -EINVAL (no holders, or not older than
 * the current one), -EEXIST, -ENOMEM.
 */
int registry_adopt_held(struct registry *r, const char *name, uint64_t number,
	struct model_source *src, int index_fd, size_t index_size, unsigned holders);

/*
 * Opens g's wait for HOLDs after a restart: for restart_hold_ms from now,
 * registry_hold() accepts up to holders HOLDs of g, one per connection (the
 * holders it had when the previous process stored it). Nothing when
 * holders is 0: no HOLD of g is ever accepted then.
 */
void registry_await_holds(struct registry *r, struct generation *g, unsigned holders);

/* The workers that may hold g: its client references, and while its wait
 * for HOLDs lasts, the HOLDs still expected. What the store records as its
 * holders. */
unsigned registry_holders(const struct generation *g);

/* Ends the wait for HOLDs of every generation registry_adopt_held() made
 * whose restart_hold_ms has passed; those nobody holds close. Cheap when
 * none waits: call it often. */
void registry_expire_holds(struct registry *r);

/*
 * Starts the full check of the next adopted generation that waits for one
 * (PAGE_RESTORE: the index checked record by record, its metadata locked,
 * its pages mapped into wcached), unless one is running: one at a time, so
 * that the checks leave the loop a core and never hold the address space
 * against its mmap calls for long. main.c calls it 100 ms after serving
 * begins (every stored model is adopted by then); each check's end starts
 * the next.
 */
void registry_restore_checks(struct registry *r);

/*
 * pages.c: the full check of adopted generation g ended, err 0 or -errno
 * with why. On success a model with pin = all locks it now; on failure one
 * error line says why and g is withdrawn: no longer current (its status
 * slot reads 0, so holders see stale), removed from the store, and the
 * model loads afresh from its configured path as the next generation. g
 * itself is not freed here (the caller does, once unreferenced).
 */
void registry_restore_checked(struct registry *r, struct generation *g, int err,
	const char *why);

/*
 * Loads path as the next generation of the model name (adding the model if
 * it is new) on the work queue; done (may be NULL) runs on the loop when the
 * generation is validated and installed, or the load failed. Returns 0 when
 * queued, or -errno.
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

/* Sets who may attach name (restricted 0: everyone who reaches the
 * socket). The lists are copied. -ENOENT, -ENOMEM. */
int registry_set_access(struct registry *r, const char *name, int restricted, const uid_t *uids,
	size_t n_uids, const gid_t *gids, size_t n_gids);

/* Stops serving name; its generations close when released. -ENOENT. */
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

/* Marks a generation modified in place (see watch), with a log line. A
 * pending replacement is dropped (it never becomes current) but not freed:
 * call registry_collect() afterwards. */
void registry_mark_modified(struct registry *r, struct generation *g, const char *file);

/* Frees every generation nothing refers to any more. */
void registry_collect(struct registry *r);

/* The model called name, or whose configured path is name; NULL if none. */
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
 * failed while warming), -ESTALE (modified in place). Refusals after the
 * access check count in the model's attach_errors, access refusals in
 * access_denied.
 */
int registry_attach(struct registry *r, const char *name, const struct registry_peer *peer,
	struct registry_attachment *out, char *msg, size_t msg_size);

/*
 * HOLD: a worker that reconnected after a restart still maps generation
 * number of the model name (or path). Checks access as registry_attach()
 * does and takes a client reference on that generation, current or not,
 * without an attach's effects (no warming, no counting). Only a generation
 * taken back from the file descriptor store (the previous process served
 * it; after a cold start the same number names another one), only while
 * its wait for HOLDs lasts (registry_await_holds), at most as many times as
 * it had holders when it was stored, and once per connection
 * (peer->conn_id). 0 and *out (drop it with registry_release()), or with
 * the message for the client in msg (naming the model, the generation and
 * why): -ENOENT ("not served", not taken over, or the wait has ended),
 * -EACCES, -EALREADY (this connection sent one already) or -EUSERS (every
 * holder it had has said so).
 */
int registry_hold(struct registry *r, const char *name, uint64_t number,
	const struct registry_peer *peer, struct generation **out, char *msg, size_t msg_size);

/* Drops a reference registry_attach() or registry_hold() took. */
void registry_release(struct registry *r, struct generation *g);

/* The model g is a generation of (NULL once unloaded), and a model's name. */
const struct model_entry *registry_generation_of(const struct generation *g);
const char *registry_model_name(const struct model_entry *m);

/* Takes and drops a client reference on a generation (registry_attach and
 * registry_release without the checks): an attach of a cold model warms it
 * again, and counts for the memory budget's LRU. */
void generation_ref(struct registry *r, struct generation *g);
void generation_unref(struct registry *r, struct generation *g);

/* Bytes of the generation's files in memory at the latest measure (by the
 * first method that is true for the daemon's user, resident.h), taken off
 * the loop after each page operation and each residency check, and by the
 * warming jobs as a warm-up ends; 0 before the first. *method (may be NULL) names it ("cachestat", "mincore", "mapped",
 * or "none" before the first); *age_ms (may be NULL) receives its age in
 * milliseconds on the loop's clock, or -1 before the first. Constant time:
 * status and metrics call it on the loop. */
uint64_t generation_resident(const struct generation *g, const char **method, int64_t *age_ms);

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
