/*
 * restore.h: the warm restart (issue 12). Under a service manager with a
 * file descriptor store, wcached hands it every current generation's files
 * and sealed index memfd, the status page and a sealed description of the
 * registry (fdstore.h), and takes them back at the next start: a model whose
 * configuration is unchanged and whose every piece passes its checks is
 * served again at once, with the same generation number and the same status
 * page, without reading its files. Everything else loads afresh.
 *
 * Generations workers still held (replaced, still mapped) are stored with
 * the current ones, each with its number of holders and how many of them
 * each uid was: the restarted daemon accepts that many HOLDs of it, each
 * uid's up to its number, during restart_hold_seconds, and closes it when
 * nobody claims it (proto/PROTOCOL.md, "Restarts"). The derived
 * artifacts of each current generation (derive.h) are stored too, and a
 * restored model's come back, each checked again (its seals, its size, its
 * reader, its index); one that fails is built again on demand.
 *
 * The files: restore.c takes the store back at start-up and keeps the
 * table of what it gave back; restore_job.c checks each model's pieces
 * (restore_check.c its files) and serves what passed; restore_adopt.c lists
 * it (through the registry's public API), waits for HOLDs and runs the full
 * checks; restore_store.c keeps the store in step with the registry. The registry never calls this
 * module: main.c sets the registry's closed hook to restore_forget and
 * calls restore_sync from its changed hook.
 *
 * Everything here runs on the event loop thread (or before it runs), but
 * the checks of a stored generation's files: they ask its filesystem, and
 * run on the work queue (restore_check.c).
 */
#ifndef WC_RESTORE_H
#define WC_RESTORE_H

#include "format/source.h"
#include "fstype.h"
#include "registry.h"

struct fdstore_desc;
struct fdstore_holder;
struct generation;
struct restore;

/* Is there a store to use: $NOTIFY_SOCKET set, and room in it for the
 * status page and the description at least (restore_store_max)? */
int restore_enabled(void);

/* How many descriptors the manager's store takes: FDSTORE_MAX_FDS (the
 * unit's FileDescriptorStoreMax=), or $FDSTORE when that is a smaller
 * number (systemd 254 and later set it to FileDescriptorStoreMax=, which a
 * drop-in may have lowered; 0: no store). The manager refuses, without a
 * reply, every descriptor past it. */
size_t restore_store_max(void);

/*
 * Takes the descriptors named "wc-..." from $LISTEN_FDS/$LISTEN_FDNAMES
 * (the sockets stay for listen_fds_take()) and decodes the description.
 * Returns NULL when there is nothing to restore (a line is logged when what
 * there is cannot be used; its descriptors are closed then).
 */
struct restore *restore_take(void);

/* The stored status page (-1: none); restore_status_taken() once the
 * registry owns it. */
int restore_status_fd(const struct restore *s);
void restore_status_taken(struct restore *s);

/* Gives the registry the status slots and generation numbers the previous
 * process had (call after registry_init_stored, before any load). */
void restore_slots(struct restore *s, struct registry *r);

/* What restore_model() reports: the model serves its stored generation;
 * it is not served, and what its path names waits for the operator's
 * `wcachectl reload NAME` (its path goes through a place others may rename
 * entries in, it waited before the restart, or nothing tells a tree to
 * judge it by: one line logged, registry_wait_for_operator); or an unload
 * or a load took its place meanwhile, or wcached is stopping; or
 * (RESTORE_JUDGED) it loads as a reload wcached makes by itself
 * (registry_reload_watched), judged against the tree the description
 * recorded for it (a store before format version 9: the tree its stored
 * files are found in), which the registry keeps with the owners and
 * inodes of the files the stored generation served, as their stored
 * descriptors tell them (registry_keep_tree: one line logged; review
 * rev206 H1, M1). Never the operator's load (review rev204 H2, H3). */
enum restore_result { RESTORE_SERVED, RESTORE_WAITS, RESTORE_GONE, RESTORE_JUDGED };
typedef void (*restore_done_fn)(const char *name, enum restore_result result, void *arg);

/*
 * Serves the stored current generation of the configured model name
 * (path, pin, warm as configured) when the description has one for the
 * same path and every piece passes its checks; a pin other than the stored
 * one is no reason to load afresh: the generation serves, then takes the
 * configured pin (its full check locks what pin says). A stage key its
 * staging contradicts is (a copy with stage = no now, or the source's own
 * files with stage = yes now; registry_stages): it loads afresh, as
 * configured (the model's stage key, set once this returns, is read when
 * the check ends). The checks ask the model's filesystem (restore_check.c),
 * whose server may hang, so they run on the work queue: the model is
 * listed as loading (registry_expect) and
 * done(name, result, arg) comes on the loop. Returns 1 then, or 0 when the
 * model must load afresh now (one line logged saying why; done is not
 * called), or RESTORE_MODEL_WAITS when it was described waiting for the
 * operator's `wcachectl reload NAME` (fdstore.h's waits) with no current
 * generation: it is listed, not loaded, and waits still (one line logged,
 * registry_wait_for_operator; done is not called). A described wait is
 * kept by a restored generation too (registry_refusal_kept), and a check
 * that fails waits (restore_still_waits) wherever its path goes. A model
 * not restored with its path unchanged (no current generation stored, the
 * status page unusable, its check not queued) whose description records a
 * tree (fdstore.h's tree) returns RESTORE_MODEL_JUDGED: it is listed, and
 * the caller loads it with registry_reload_watched (batch_judged_load),
 * judged against that tree (registry_keep_tree; one line logged; done is
 * not called), as a check that fails does (RESTORE_JUDGED): no load a
 * restart makes by itself is the operator's (review rev204 H2, H3). No
 * descriptor tells the owners of the files it served, so that load waits
 * for the operator's reload wherever others than its owner may write in
 * the directory holding its files (review rev206 H1). One whose
 * description records no tree (a store from a wcached before format
 * version 9), or whose tree cannot be kept, returns RESTORE_MODEL_WAITS:
 * listed, it waits once for the operator's reload (review rev206 M1, L1).
 * 0 (load afresh) only when its configured path changed, or it could not
 * be listed (no memory or status slot).
 */
#define RESTORE_MODEL_WAITS 2
#define RESTORE_MODEL_JUDGED 3
int restore_model(struct restore *s, struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm, restore_done_fn done, void *arg);

/* Loop thread: the model name, described waiting for the operator's
 * reload (line), is not restored (why, or NULL) and waits still: logged
 * and registry_wait_for_operator(). */
void restore_still_waits(struct registry *r, const char *name, const char *why,
	const char *line);

/* The staged copies (directories in stage_dir) of the generations
 * restore_model() is checking: what registry_stage_sweep() must leave.
 * Valid until restore_started(). */
void restore_copies(const struct restore *s, char *const **dirs, size_t *n);

/* Every configured model went through restore_model(): what no check
 * holds is closed and dropped from the store, and from now on the store
 * keeps in step with the registry (restore_sync), a model whose check
 * still runs described as the previous process stored it. Each check's
 * end closes and drops what it did not take; once all have ended the
 * status slots of models not restored say 0, and s is freed: at once when
 * no check is running. Accepts NULL. s is this module's from now. */
void restore_started(struct restore *s, struct registry *r);

/* A stored generation checked and opened (restore_check.c), to serve. */
struct restore_served {
	const char *name;            /* the model */
	const char *path;            /* as configured */
	uint64_t number;
	struct model_source *src;    /* files open and mapped */
	int *served;                 /* gen_open_served()'s, one per file; NULL: opened here */
	const struct fs_info *fs;    /* the files' (a staged copy's: its origin's);
					NULL: asked here */
	int index_fd;                /* the sealed index */
	size_t index_size;
	/* A held one's holders by uid as stored (fdstore.h: ascending, counts
	 * summing to its holders, as fdstore_check() has checked); nuids 0:
	 * only their count was stored (version 5 or older). */
	const struct fdstore_holder *uids;
	uint32_t nuids;
};

/*
 * Serves s as generation s->number of the model s->name, current and
 * READY at once, without loading or warming it; expected: 0, or
 * registry_expect()'s token for the model. Takes src, served and index_fd
 * on success only. 0, -EEXIST when the model is already there, -ESTALE
 * when the model expected is gone, -ENOMEM. O(files): the caller has
 * checked the index's header (index_open) and each file against it; the
 * rest of the index is checked in full on the work queue while the
 * generation serves (restore_checks), and only then are its metadata
 * locked and its pages mapped into wcached.
 */
int restore_adopt_current(struct registry *r, const struct restore_served *s,
	enum pin_mode pin, int warm, uint64_t expected);

/*
 * Adds s as generation s->number of the model s->name, which
 * restore_adopt_current() restored with a newer current generation: one
 * that workers held before the restart, holders of them (1 or more), of
 * the uids s->uids names. It is not served to new attaches; it stays open
 * for restart_hold_ms (restore_await_holds: restore_hold() may then take
 * up to holders references, each uid's up to its count), and after that
 * until its last holder releases it. Takes src, served and index_fd on
 * success only. 0, -EINVAL (no holders, or not older than the current
 * one), -EEXIST, -ENOMEM.
 */
int restore_adopt_held(struct registry *r, const struct restore_served *s, unsigned holders);

/*
 * Opens g's wait for HOLDs after a restart: for restart_hold_ms from now,
 * restore_hold() accepts up to holders HOLDs of g, one per connection (the
 * holders it had when the previous process stored it), and, when nuids is
 * not 0, from each uid of uids (their places: ascending, counts summing to
 * holders) up to its count and from no other uid; g keeps a copy. Nothing
 * when holders is 0: no HOLD of g is ever accepted then. 0, or -ENOMEM
 * (no wait opened) with the message.
 */
int restore_await_holds(struct registry *r, struct generation *g, unsigned holders,
	const struct fdstore_holder *uids, uint32_t nuids);

/* The workers that may hold g: its workers' references, and while its
 * wait for HOLDs lasts, the HOLDs still expected. What the store records
 * as its holders. */
unsigned restore_holders(const struct generation *g);

/*
 * Those holders by uid, as the store records them: each uid's references
 * to g and, while its wait lasts, its places not yet taken, uids
 * ascending, counts summing to restore_holders(g). 0 and *out (malloc'd,
 * the caller's; NULL when *n is 0) with *n, 0 when they are not known by
 * uid (a derived artifact; a reference whose uid was not recorded; places
 * stored as a count only and not all taken; past the store's limit), or
 * -ENOMEM.
 */
int restore_holder_uids(const struct generation *g, struct fdstore_holder **out, uint32_t *n);

/* Ends the wait for HOLDs of every generation restore_adopt_held() made
 * whose restart_hold_ms has passed; those nobody holds close. Cheap when
 * none waits: call it often. */
void restore_expire_holds(struct registry *r);

/*
 * Starts the full check of the next adopted generation that waits for one
 * (PAGE_RESTORE: the index checked record by record, its metadata locked,
 * its pages mapped into wcached), unless one is running: one at a time, so
 * that the checks leave the loop a core and never hold the address space
 * against its mmap calls for long. main.c calls it 100 ms after serving
 * begins (every stored model is adopted by then); each check's end starts
 * the next. A generation that fails is withdrawn (registry_withdraw) and
 * its model loads afresh.
 */
void restore_checks(struct registry *r);

/*
 * HOLD: a worker that reconnected after a restart still maps generation
 * number of the model name (or path). Checks access as registry_attach()
 * does (registry_find_for) and takes a client reference on that
 * generation, current or not, without an attach's effects (no warming, no
 * counting). Only a generation taken back from the file descriptor store
 * (the previous process served it; after a cold start the same number
 * names another one), only while its wait for HOLDs lasts
 * (restore_await_holds), at most as many times as it had holders when it
 * was stored, where the store recorded their uids at most as many times as
 * peer->uid was among them, and once per connection (peer->conn_id). 0 and
 * *out (drop it with registry_release() and peer->uid), or with the
 * message for the client in msg (naming the model, the generation and
 * why): -ENOENT ("not served", not taken over, or the wait has ended),
 * -EACCES, -EPERM (peer->uid did not hold it), -EALREADY (this connection
 * sent one already), -EUSERS (every holder it had, or every one of
 * peer->uid, has said so) or -ENOMEM.
 */
int restore_hold(struct registry *r, const char *name, uint64_t number,
	const struct registry_peer *peer, struct generation **out, char *msg, size_t msg_size);


/* Hands the manager the status page (once), and what of the current
 * generations, the held ones and the derived artifacts fits within the
 * store's limit (restore_store_max; planned as restore_describe plans the
 * description) not yet stored, after having it drop what no longer fits or
 * serves; one warning names what was left out, once for each change. Then
 * stores a new description in place of the old one. A no-op unless
 * r->fdstore. Call whenever a generation becomes current, an artifact is
 * published or dropped, or a model is added or removed. */
void restore_sync(struct registry *r);

/* At shutdown, before the registry closes: stores what the manager's full
 * queue refused so far, waiting up to 1 s for it to read. A model whose
 * warm restart check still runs stays described as the previous process
 * stored it, and the store keeps its descriptors for the next start. */
void restore_stopping(struct registry *r);

/*
 * The description of r for the store, its generations and artifacts within
 * max_fds descriptors (restore_sync gives the store's limit less the status
 * page and the description; a parameter for the tests), planned as
 * restore_sync() stores them: every model with a slot; a model without a
 * current generation whose warm restart check still runs, and that the
 * registry still expects, as the previous description had it
 * (restore_carried: its generations and artifacts, still in the store, are
 * counted first, whatever else fits); each storable current generation
 * while they fit (a model whose current one does not fit is described
 * without generations, so it keeps its slot and numbers and loads afresh);
 * then the held generations, newest first, while they fit (from the first
 * that does not, every older one is left out) and FDSTORE_MAX_GENERATIONS
 * of a model allow (its older ones are left out); then the derived
 * artifacts of each current generation taken, while they fit
 * (FDSTORE_MAX_ARTIFACTS per model). Of what fits, only what is in the
 * store whole is described. left_out (cap bytes) says what was left out,
 * "" when nothing was. 0 and *out (fdstore_free it), or -ENOMEM.
 */
int restore_describe(const struct registry *r, size_t max_fds, struct fdstore_desc **out,
	char *left_out, size_t cap);

/* g closes: asks the manager to drop its descriptors, a generation's or a
 * derived artifact's (not at shutdown: the next process takes them). The
 * registry's closed hook. */
void restore_forget(struct registry *r, struct generation *g);

#endif
