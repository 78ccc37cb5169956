/*
 * attach.h: the client (struct wc_client) and its attach records, which
 * request.c reads (a reconnect names the records in HOLDs) and derive.c
 * uses; keeping a model attached through the client; the client's
 * reference count.
 *
 * Layering: model.c < attach_reply.c < request.c < attach.c < derive.c.
 * attach.c knows nothing of derived artifacts beyond the kind of a record
 * (a derived artifact is never named in a HOLD).
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

/* What a descriptor of a client's was when the client took it (fstat's
 * st_dev and st_ino; known is 0 when fstat failed, and the number is then
 * closed as it is), so that a number closefrom() took and the process
 * reused is not closed as the client's (request_close_fds). */
struct fd_identity {
	dev_t dev;
	ino_t ino;
	int known;
};

struct wc_client {
	int fd;               /* replaced by a reconnect (wc_client_fd() changes) */
	uint64_t connection;  /* counts reconnects: which connection fd is */
	struct fd_identity fd_id; /* fd's, taken at each connect and reconnect */
	/* A reconnect's new socket from its socket() until it replaces fd (-1
	 * otherwise), with its identity: a child forked meanwhile closes it
	 * too. fd, next_fd and their identities change only under request.c's
	 * fd_lock, which fork() takes first, so that a child gets all of a
	 * change or none of it (request.c, "Descriptors across fork()"). */
	int next_fd;
	struct fd_identity next_id;
	pid_t pid;            /* the process that connected */
	uint32_t seq;
	int timeout_ms;       /* 0: wait forever */
	char *path;
	char *where;          /* "wcached at PATH", for messages */
	pthread_mutex_t lock; /* one request at a time on the socket; guards the rest,
				 released excepted; given back with request_unlock() */
	int receiving;        /* this holding of lock received descriptors not yet a
				 model's (model_receive_begin): request_unlock() ends it */
	unsigned refs;        /* the owner's, and each release or build using it now
				 (attach_client_get): freed at 0, under attach.c's clients_lock */
	struct attach_record *records; /* models attached through it, still held */
	struct attach_cache cache;    /* the status page, mapped once; the last index */
	/* Why libwcache itself closed its last connections (request.c,
	 * request_close_because(), request_closed_why()): each entry a
	 * connection number and its reason ("" in an entry not used yet);
	 * closed_next is the entry the next close takes, the oldest. */
	struct {
		uint64_t connection;
		char why[96];
	} closed[8];
	unsigned closed_next;
	/* Models released without the lock (attach.c, attach_release), whose
	 * records wait for the thread that holds it to tell the daemon
	 * (request_unlock). released_lock guards released and each record's
	 * released flag; it is held for a few loads and stores, never while
	 * waiting, and taken under lock where both are. */
	pthread_mutex_t released_lock;
	struct attach_record *released;
	/* origins_epoch counts reconnects (request.c); origins_refused is
	 * 1 + the epoch on which wcached refused ORIGINS as one older than
	 * it, 0 if never: not asked again until the next reconnect, which may
	 * reach an upgraded one (wc_model_file_origin). Both are read and
	 * written with __atomic builtins, under no lock. */
	unsigned origins_epoch, origins_refused;
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
	/* Its release (attach.c): released is set, under the client's
	 * released_lock, before the model is freed (from then on only am.index
	 * and am.handle are left); stale is what wc_model_stale() said then;
	 * released_next links the client's released list. */
	int released;
	int stale;
	struct attach_record *released_next;
};

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
