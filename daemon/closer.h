/*
 * closer.h: closes descriptors off the event loop, in lanes, so that a
 * close that blocks holds up nobody but the one who chose the descriptor.
 *
 * close() can block for as long as someone else decides. The last close of
 * a TCP socket with SO_LINGER and unsent data waits for the peer (up to the
 * linger time); a file on FUSE or NFS is flushed on every close (its server
 * may never answer); closing a unix socket releases the descriptors still
 * queued on it the same way, in the closing thread; and the last close of a
 * large memfd frees all of its memory; so does the last close (or munmap)
 * of a model file that was renamed over: its pages and its blocks go then,
 * about a third of a second per GiB. A client chooses every one of these
 * for the descriptors it passes with SCM_RIGHTS, and for its connection's
 * queue, and an operator's update for the model files, so wcached closes
 * none of them on its loop: it hands them here.
 *
 * Each lane has an owner (the uid of the client the descriptors came from,
 * CLOSER_DAEMON for the daemon's own files on remote storage, CLOSER_LOCAL
 * for its files on local storage: those never wait behind a remote
 * server that does not answer), a queue,
 * and while the queue is not empty one thread that closes its descriptors in
 * order and exits once it has been empty for a moment (100 ms: a run of
 * unloads takes one thread). Each owner has two lanes: one for what
 * it chose (closer_close) and one for the daemon's own (closer_unmap_close:
 * a derived artifact's memfds, built by that uid, whose close frees memory
 * and never waits on anyone), so that a client holding its lane (a
 * descriptor it passed on a FUSE mount it froze) never holds up the memory
 * wcached lets go of for someone else (review rev186 F2, rev189 F4). A
 * close that hangs holds up its own lane only; closer_stuck() says how many
 * descriptors wait in a lane behind a close that does not finish, so the
 * server can stop taking more from that owner.
 *
 * Threads: closer_close(), closer_then() and closer_pending() may be
 * called from any thread; closer_stop() once, from the thread that
 * started the closer, after the last closer_close().
 */
#ifndef WC_CLOSER_H
#define WC_CLOSER_H

#include <sys/types.h>

/* The lane of the daemon's own descriptors (a model file on a remote
 * filesystem); no client has this uid. */
#define CLOSER_DAEMON ((uid_t)-1)

/* The lane of the daemon's own files on local storage. (uid_t)-2 is a
 * valid uid in principle; a client running as it would share this lane. */
#define CLOSER_LOCAL ((uid_t)-2)

struct closer;

/* A closer with no lanes yet: 0, or -ENOMEM. */
int closer_start(struct closer **out);

/* Takes fd (always) and closes it in owner's lane. Accepts a NULL closer
 * (unit tests of modules that use one): fd is closed at once. Where no
 * memory or thread is to be had, fd is closed at once on the caller's
 * thread (counted in closer_closed_inline). */
void closer_close(struct closer *cl, uid_t owner, int fd);

/* Takes the mapping base[0 .. size) (NULL: none) and fd (-1: none), and in
 * the daemon's own lane of owner unmaps the one, then closes the other;
 * otherwise as closer_close(), but for the daemon's own: a file, memfd or
 * index whose last reference may go with either, never one a client chose
 * (that lane is apart from owner's, which owner can hold). Not counted in
 * closer_pending() or closer_stuck(), which bound what the owner chose. */
void closer_unmap_close(struct closer *cl, uid_t owner, void *base, size_t size, int fd);

/*
 * Calls done(arg) once everything queued now in each of the daemon's own
 * lanes of owners[0 .. n) (closer_unmap_close; what the owners chose is
 * not waited for) has been let go (unmapped and closed): on the thread of
 * the last of those lanes, with the closer's lock held, so done must be
 * quick and must not call the closer (a uv_async_send() to the loop that
 * waits for it). At once, on the caller's thread, where none of those
 * lanes has anything queued or with a NULL closer (everything was closed
 * at once); without waiting for a lane where no memory is to be had for
 * its turn (what it closes goes on).
 */
void closer_then(struct closer *cl, const uid_t *owners, size_t n, void (*done)(void *),
	void *arg);

/* No done(arg) of closer_then()'s runs once this returns (done(arg) never
 * runs at all where it was still to come). Accepts NULL. */
void closer_forget(struct closer *cl, void *arg);

/* Descriptors owner chose (closer_close) queued or being closed now. */
unsigned closer_pending(struct closer *cl, uid_t owner);

/* The same, but 0 unless the close owner's lane is in has run for min_ms
 * or more: a lane that is merely busy (a burst of closes of connections
 * that ended) is not stuck, and the daemon's own closes of owner
 * (closer_unmap_close: a large artifact freed) are not in it. */
unsigned closer_stuck(struct closer *cl, uid_t owner, unsigned min_ms);

/* Descriptors and mappings queued or being closed now, in every lane. */
unsigned closer_total(struct closer *cl);

/* Descriptors closed on the caller's thread for want of memory or a thread. */
unsigned long closer_closed_inline(struct closer *cl);

/*
 * Waits up to wait_ms for every lane to empty and frees the closer. Where a
 * close still hangs after that, says so in the log and returns without
 * freeing what the hanging threads use (wcached is exiting: the kernel ends
 * them). Accepts NULL.
 */
void closer_stop(struct closer *cl, unsigned wait_ms);

#endif
