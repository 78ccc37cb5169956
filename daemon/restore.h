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
 * the current ones, each with its number of holders: the restarted daemon
 * accepts that many HOLDs of it, during restart_hold_seconds, and closes it
 * when nobody claims it (proto/PROTOCOL.md, "Restarts").
 *
 * Everything here runs on the event loop thread (or before it runs).
 */
#ifndef WC_RESTORE_H
#define WC_RESTORE_H

#include "registry.h"

struct fdstore_desc;
struct generation;
struct restore;

/* Is there a store to use: $NOTIFY_SOCKET set, and $FDSTORE (systemd 254
 * and later set it to FileDescriptorStoreMax=) unset or not 0? */
int restore_enabled(void);

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

/*
 * Serves the stored current generation of the configured model name
 * (path, pin, warm as configured) when the description has one for the
 * same path and pin and every piece passes its checks. Returns 1 when the
 * model is served, 0 when it must load afresh (one line logged saying why).
 */
int restore_model(struct restore *s, struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm);

/* Closes what nobody took, zeroes the status slots of models not restored,
 * frees s. Accepts NULL. */
void restore_finish(struct restore *s, struct registry *r);

/* Hands the manager the status page (once) and every current generation
 * not yet stored, and stores a new description in place of the old one.
 * A no-op unless r->fdstore. Call whenever a generation becomes current or
 * a model is added or removed. */
void restore_sync(struct registry *r);

/* At shutdown, before the registry closes: stores what the manager's full
 * queue refused so far, waiting up to 1 s for it to read. */
void restore_stopping(struct registry *r);

/*
 * The description of r for the store, within max_fds descriptors
 * (FDSTORE_MAX_FDS; a parameter for the tests): every model with a slot;
 * each stored current generation while they fit (a model whose current one
 * does not fit is described without generations, so it keeps its slot and
 * numbers and loads afresh); then the held generations, newest first, while
 * they fit (from the first that does not, every older one is left out).
 * left_out (cap bytes) says what was left out, "" when nothing was. 0 and
 * *out (fdstore_free it), or -ENOMEM.
 */
int restore_describe(const struct registry *r, size_t max_fds, struct fdstore_desc **out,
	char *left_out, size_t cap);

/* g closes: asks the manager to drop its descriptors (not at shutdown:
 * the next process takes them). */
void restore_forget(struct registry *r, struct generation *g);

#endif
