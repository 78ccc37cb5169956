/*
 * request.h: a client's connection to wcached and one request on it
 * (request.c), for attach.c and derive.c: opening the socket with its
 * deadline, one request and its reply under the client's deadline (with
 * the reconnect-once of a dead connection, or without), the sequence
 * numbers, and the pid every request checks.
 *
 * Every function taking a client is called with the client's lock held,
 * and request_unlock() gives it back.
 */
#ifndef WC_REQUEST_H
#define WC_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/wcache.h"
#include "proto/wire.h"

struct attach_record;

/* getpid(), without a system call (kept up to date across fork()). */
pid_t request_self_pid(void);

/* The default deadline into *ms: $WCACHE_TIMEOUT seconds (0: forever),
 * else 30 s. 0, or -EINVAL with the message set (a value that is not a
 * number of seconds). */
int request_timeout_default(int *ms);

/*
 * c's first connection: a SOCK_SEQPACKET connection to c->path with the
 * deadline ms for the connect and every later wait, made c->fd (with its
 * identity, attach.h's fd_identity) before c is seen by any other thread.
 * A child forked by another thread meanwhile, the connect's wait included,
 * closes its copy at once, as it does request_origins()'s. The errors
 * name the path and say whether wcached is running.
 */
int request_connect(wc_client *c, int ms);

/*
 * What the staged copies of generation of the model name were copied
 * from (PROTOCOL.md, ORIGINS), asked of wcached at path on a connection of
 * its own (a child forked by another thread meanwhile closes its copy at
 * once) within ms: 0 with out's file_count entries, 1 when its files are
 * not staged copies; -ENOTSUP when wcached does not say (older than
 * ORIGINS), -ESTALE when it serves another generation now, or another
 * -errno, each with the message.
 */
int request_origins(const char *path, int ms, const char *name, uint64_t generation,
	size_t file_count, wc_file_identity *out);

/* Closes c's descriptors that are still its own: its connection, and in a
 * child forked during a reconnect the new socket not yet in its place
 * (attach.c, attach_client_put: c's last reference; in a child, also
 * wc_disconnect() of a parent's client), and forgets them (-1). */
void request_close_fds(wc_client *c);

/*
 * Sends RELEASE of handle with seq 0, which the daemon does not answer, on
 * the connection as it is: a release costs one send and no wait for the
 * daemon's answer. The send keeps the client's deadline across signals
 * and EAGAIN, as a request's does. A send that fails (the daemon is gone,
 * or does not read within the deadline: stopped, wedged) closes the
 * connection, so that the daemon releases every attach of it rather than
 * counting the lost one, later releases fail at once, and the next
 * request connects again (as after any timeout). It sets no message
 * (wc_errmsg() stays the caller's), but the connection remembers why it
 * was closed (request_closed_why()).
 */
void request_send_release(wc_client *c, uint64_t handle);

/*
 * Closes the client's connection from libwcache's side (shutdown(2); the
 * next request connects again), as every close of libwcache's own does (a
 * timeout, a lost release, a reply that cannot be trusted), and remembers
 * why for that connection: fmt makes a clause for a message ("wcached's
 * reply to ABANDON was not one (out of step)"), which request_closed_why()
 * gives back. The first reason of a connection stays.
 */
void request_close_because(wc_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * Why libwcache itself closed the client's connection number connection,
 * as a clause for a message ("a release could not be sent within 0.4 s
 * (wcached did not read)", "a request timed out (...)"), or NULL when it
 * did not (the connection is open, or the daemon closed it). A build
 * ended with that connection says so; the reason outlives reconnects, but
 * only for the connection it names, and only for the last eight
 * connections libwcache closed.
 */
const char *request_closed_why(const wc_client *c, uint64_t connection);

/*
 * Gives the client's lock back, after telling the daemon of the models
 * released meanwhile on other threads (c->released, attach.c): each
 * record is unlinked from the client, its RELEASE sent when it came over
 * this connection (or was held on it after a reconnect), and freed. A
 * release that finds the lock held leaves its record for the holder, and
 * takes the lock itself when it is free: so every one is told, by one
 * thread or the other, and none waits for another thread's request.
 */
void request_unlock(wc_client *c);

/* Unlinks a from its client's list of records (clearing its client); the
 * client's lock is held (in a child after fork(), attach.c's
 * clients_lock). */
void request_unlink_record(struct attach_record *a);

/* The next request's seq (never 0). */
uint32_t request_next_seq(wc_client *c);

/*
 * Encodes a request with sequence number seq into buf (cap bytes) and
 * returns its length or a negative errno. left_ms is what is left of the
 * client's deadline when it is sent (0: no deadline).
 */
typedef ssize_t (*request_put_fn)(uint8_t *buf, size_t cap, uint32_t seq, int left_ms,
	const void *arg);

/*
 * Sends one request (put(arg)) and receives its reply into buf, with up to
 * WIRE_MAX_FDS descriptors, which pass to the caller (fds[0 .. *nfds)), as
 * wc_attach() does: CHANGED messages are skipped, the client's deadline
 * bounds the whole call, and a connection found dead is replaced once (the
 * request is encoded again, with what is left of the deadline, and sent
 * again). grace_ms > 0 lets the receive wait that long beyond the deadline,
 * for a request the daemon itself answers when the deadline passes
 * (DERIVE's wait_ms). Returns the reply's length, msg decoded, or a
 * negative errno with the message set and no descriptor left.
 */
ssize_t request_call(wc_client *c, request_put_fn put, const void *arg, int grace_ms,
	uint8_t *buf, size_t cap, int *fds, size_t *nfds, struct wire_message *msg);

/*
 * One request on the connection as it is, never reconnecting (a build's
 * PUBLISH or ABANDON belongs to the connection that got BUILD): sends
 * req[0 .. len) with the descriptor send_fd (none when -1; it stays the
 * caller's) and receives the reply of seq as request_call() does.
 */
ssize_t request_exchange(wc_client *c, const uint8_t *req, size_t len, uint32_t seq,
	int send_fd, uint8_t *buf, size_t cap, int *fds, size_t *nfds, struct wire_message *msg);

#endif
