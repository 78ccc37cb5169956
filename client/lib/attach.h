/*
 * attach.h: what attach.c shares with derive.c, the other module that sends
 * requests on a client's connection: the client and its attach records,
 * one request and its reply under the client's deadline (with the
 * reconnect-once of a dead connection), and keeping a model attached
 * through the client.
 *
 * Layering: model.c < attach_reply.c < attach.c < derive.c. derive.c calls
 * these; attach.c knows nothing of derived artifacts beyond the kind of a
 * record (a derived artifact is never named in a HOLD).
 */
#ifndef WC_ATTACH_H
#define WC_ATTACH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/attach_reply.h"
#include "lib/wcache.h"
#include "proto/wire.h"

struct wc_client {
	int fd;               /* replaced by a reconnect (wc_client_fd() changes) */
	uint64_t connection;  /* counts reconnects: which connection fd is */
	pid_t pid;            /* the process that connected */
	uint32_t seq;
	int timeout_ms;       /* 0: wait forever */
	char *path;
	char *where;          /* "wcached at PATH", for messages */
	pthread_mutex_t lock; /* one request at a time on the socket */
	unsigned refs;        /* the owner's, and each release or build using it now
				 (attach_client_get): freed at 0, under attach's own lock */
	struct attach_record *records; /* models attached through it, still held */
	struct attach_cache cache;    /* the status page, mapped once; the last index */
};

/* What an attach holds on the daemon's side, which decides whether a
 * reconnect names it in a HOLD (PROTOCOL.md, "Restarts"). */
enum attach_kind {
	ATTACH_KIND_GENERATION = 1, /* a model's generation (ATTACH, a BUILD's source): held */
	ATTACH_KIND_DERIVED,        /* a derived artifact (DERIVE, PUBLISH): never held,
				     * HOLD names a generation of a model */
};

/*
 * A model attached through a client: its release hook's context, freed by
 * that hook. It outlives its client: wc_disconnect() only sets client to
 * NULL.
 */
struct attach_record {
	struct attach_model am;       /* the model, its handle, its shared mappings */
	enum attach_kind kind;
	struct wc_client *client;     /* NULL once the client is gone */
	uint64_t connection;          /* the client's connection number it came over */
	pid_t pid;                    /* the process that attached */
	struct attach_record *next;   /* in the client's list */
	struct attach_record **prevp;
};

/* getpid(), without a system call (kept up to date across fork()). */
pid_t attach_self_pid(void);

/* The next request's seq (never 0). The lock is held. */
uint32_t attach_next_seq(wc_client *c);

/*
 * Encodes a request with sequence number seq into buf (cap bytes) and
 * returns its length or a negative errno. left_ms is what is left of the
 * client's deadline when it is sent (0: no deadline).
 */
typedef ssize_t (*attach_put_fn)(uint8_t *buf, size_t cap, uint32_t seq, int left_ms,
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
 * negative errno with the message set and no descriptor left. The lock is
 * held.
 */
ssize_t attach_call(wc_client *c, attach_put_fn put, const void *arg, int grace_ms,
	uint8_t *buf, size_t cap, int *fds, size_t *nfds, struct wire_message *msg);

/*
 * One request on the connection as it is, never reconnecting (a build's
 * PUBLISH or ABANDON belongs to the connection that got BUILD): sends
 * req[0 .. len) with the descriptor send_fd (none when -1; it stays the
 * caller's) and receives the reply of seq as attach_call() does. The lock
 * is held.
 */
ssize_t attach_exchange(wc_client *c, const uint8_t *req, size_t len, uint32_t seq, int send_fd,
	uint8_t *buf, size_t cap, int *fds, size_t *nfds, struct wire_message *msg);

/*
 * Makes the model of a (filled by attach_reply()) one the client holds:
 * links the record, sets the model's release hook, which frees a on
 * wc_release(). The lock is held.
 */
void attach_keep(wc_client *c, struct attach_record *a, enum attach_kind kind);

/*
 * a's client with a reference taken, or NULL when it has none (its client
 * was disconnected): what lets a release or a build on one thread use the
 * client while wc_disconnect() runs on another. Once its lock is taken,
 * the caller checks a->client == c again (a disconnect detaches every
 * record), and gives the reference back with attach_client_put().
 */
struct wc_client *attach_client_get(const struct attach_record *a);
void attach_client_put(struct wc_client *c);

#endif
