/*
 * server_internal.h: what server.c (connections: accept, read, flow
 * control, close) and server_requests.c (the requests and their replies)
 * share. Not for other modules: they use server.h.
 */
#ifndef WC_SERVER_INTERNAL_H
#define WC_SERVER_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "generation.h"
#include "lograte.h"
#include "proto/wire.h"
#include "registry.h"
#include "server.h"
#include "uidtally.h"

#define DEFAULT_MAX_CLIENTS 1024
#define DEFAULT_MAX_CLIENTS_PER_UID 256
#define DEFAULT_MAX_ATTACHES 4096
#define DEFAULT_UNREAD_REPLY_MS 60000

struct attach_ref {
	uint64_t handle;
	struct generation *gen;
};

/* What a connection is held back for; the retry timer runs while any is. */
enum conn_deferred {
	DEFER_NONE = 0,
	DEFER_REPLY, /* its pending reply waits for the descriptor budget */
	DEFER_READ,  /* not read while its uid's descriptors wait to close */
};

/*
 * What a connection's request waits for; derive.c's hooks answer it. It is
 * not read meanwhile, and a hang-up closes it (derive_conn_gone: a DERIVE
 * waits no more, a build goes to the next waiter, a check goes on without
 * its builder), save one: a peer that only shut its end for writing while
 * its PUBLISH is checked still reads, and gets its answer (conn_io). Only
 * conn_set_waiting() changes it: WAIT_NONE -> WAIT_BUILD or WAIT_CHECK
 * (conn_wait), WAIT_CHECK -> WAIT_CHECK_HALF_CLOSED (the half-close), any
 * -> WAIT_NONE (the answer, conn_wait_end; or the close).
 */
enum conn_waiting {
	WAIT_NONE = 0,
	WAIT_BUILD,             /* a DERIVE waits for another worker's build */
	WAIT_CHECK,             /* a PUBLISH waits for its check (derive_publish.c) */
	WAIT_CHECK_HALF_CLOSED, /* ... and the peer has shut its end for writing
				 * since: not watched (the hang-up stays reported
				 * while it is), the retry timer looks for the
				 * peer's departure (on_retry); closed once its
				 * answer is read (or cannot go at once) */
};

struct conn {
	uv_poll_t poll;
	struct server *srv;
	int fd;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t *groups;                 /* supplementary groups (peer_read), owned */
	size_t ngroups;
	uint64_t id;                   /* unique per connection, for HOLD's once-only rule */
	int denied_logged;             /* one log line per peer for refusals */
	struct attach_ref *refs;
	size_t nrefs, refs_cap;
	uint8_t out[WIRE_MAX_MESSAGE]; /* pending reply */
	size_t out_len;
	int out_fds[WIRE_MAX_FDS];     /* borrowed from a held generation */
	size_t out_nfds;
	int pending;
	enum conn_waiting waiting;     /* a DERIVE or a PUBLISH waits: no request is read
					  until derive.c answers it */
	enum conn_deferred deferred;   /* held back, looked at again by the retry timer */
	int closing;
	struct closer *closer;         /* the server's, for after the server is gone */
	int throttle_logged;           /* one warning per peer for backpressure */
	int paused_logged;             /* ... and one (and one count) for DEFER_READ */
	unsigned inflight_fds;         /* sent with replies, not yet known to be received */
	/* A reply held back (EAGAIN, or the descriptor budget): since when no
	 * reply it was sent has been read (loop time), and how many bytes of
	 * them were unread then (SIOCOUTQ); held_ms 0: none is held back. */
	uint64_t held_ms;
	int held_unread;
	uint64_t active_ms;            /* loop time of its accept or its last message */
	struct conn *next, **prevp;
};

struct server {
	uv_loop_t *loop;
	struct registry *reg;
	uv_poll_t listen_poll;
	int listen_fd;
	struct conn *conns;
	unsigned nconns;
	unsigned max_clients, max_clients_per_uid, max_attaches;
	uint64_t next_handle;
	uint64_t next_conn_id;
	struct derive_table *derive;  /* NULL: DERIVE is refused */
	struct closer *closer;        /* closes what clients chose (closer.h); NULL: close() */
	int stopping;
	int fd_limit;      /* RLIMIT_NOFILE at start */
	int fd_reserve;    /* descriptors a new connection may not take */
	int spare_fd;      /* closed to accept-and-refuse when out of fds */
	uv_timer_t accept_timer; /* the listener's pause when out of fds and spare */
	int accept_paused_logged;
	int timers_open;   /* while stopping: timers whose close has not called back */
	uid_t self_uid;
	/*
	 * Descriptors in flight. The kernel counts every descriptor sent with
	 * SCM_RIGHTS and not yet received against the sending user's
	 * RLIMIT_NOFILE, for all of that user's sockets together; past it
	 * every send with descriptors fails (ETOOMANYREFS) for every client.
	 * A connection whose earlier replies are known to be received (its
	 * send queue is empty) may use the budget up to fd_hard; one with
	 * replies still unread only up to fd_conn_cap of its own and fd_soft
	 * in all; all connections of one uid together up to fd_uid_cap. See
	 * fd_budget_allows().
	 */
	unsigned inflight_total;
	struct uidtally inflight_by_uid; /* the same per uid: every conn's inflight_fds */
	unsigned fd_hard, fd_soft, fd_uid_cap, fd_conn_cap;
	uint64_t confirmed_at; /* uv_now() + 1 of the last sweep of conn_confirm, 0: never */
	int sent_since_sweep;  /* descriptors were sent since that sweep */
	unsigned ndeferred;
	unsigned nhalf_closed;   /* connections in WAIT_CHECK_HALF_CLOSED */
	uv_timer_t retry_timer;  /* runs while ndeferred or nhalf_closed is not 0 */
	unsigned nheld;          /* connections with a reply held back (held_ms != 0) */
	unsigned unread_reply_ms; /* closed when their replies stay unread this long */
	uv_timer_t unread_timer; /* looks at them while nheld > 0 */
	struct lograte warnings; /* what peers cause is logged once a minute per uid */
	struct lograte idle_closes; /* the same for idle connections closed to make
				       room (make_room): its own, so that a refusal
				       logged just before does not hide the uid */
	struct server_stats stats;
};

/*
 * Whether a warning about a peer of uid may be logged now: what a peer can
 * cause as often as it likes (a refused connection, a malformed message) is
 * logged at most once a minute per uid (lograte.h), so that one user cannot
 * flood the log. When it may, more (size bytes) says how many were not
 * logged since, for the end of the line.
 */
int server_may_warn(struct server *s, uid_t uid, char *more, size_t size);

/* server.c: queues one reply (at most one is pending: the connection stops
 * reading until it is sent) and closes a connection. */
void conn_send(struct conn *c, const uint8_t *buf, size_t len, const int *fds, size_t nfds);
void conn_close(struct conn *c);

/* Replies with an error. A fatal one is sent only if the socket takes it at
 * once, and the connection is closed: a peer that sent a malformed message
 * and reads nothing is not waited for. */
void conn_error(struct conn *c, uint32_t seq, int code, int fatal, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/* server_requests.c: one handler per request type. */
void request_attach(struct conn *c, const struct wire_message *msg);
void request_hold(struct conn *c, const struct wire_message *msg);
void request_release(struct conn *c, const struct wire_message *msg);
void request_derive(struct conn *c, const struct wire_message *msg);
/* PUBLISH takes fd (the memfd that came with it) whatever happens. */
void request_publish(struct conn *c, const struct wire_message *msg, int fd);
void request_abandon(struct conn *c, const struct wire_message *msg);
void request_origins(struct conn *c, const struct wire_message *msg);

/* server_budget.c: the descriptors replies have in flight, and the budget
 * that holds back the replies of a client that leaves them unread. */
/* Counts n more descriptors in flight on c (after a send that carried them). */
void inflight_add(struct conn *c, unsigned n);
/* Forgets every descriptor c has in flight (received, or gone with it). */
void inflight_forget(struct conn *c);
/* Forgets them once the peer has read everything sent to it (SIOCOUTQ 0). */
void conn_confirm(struct conn *c);
/* A reply of c is held back (conn_hold), or no longer (conn_unhold): one
 * whose peer reads nothing for unread_reply_ms is closed. */
void conn_hold(struct conn *c);
void conn_unhold(struct conn *c);
/* May c send a reply carrying nfds descriptors now? */
int fd_budget_allows(struct conn *c, size_t nfds);
/* Derives the reserve and the budget from s->fd_limit (RLIMIT_NOFILE). */
void fd_budget_init(struct server *s);

/* A DERIVE (what: WAIT_BUILD) or a PUBLISH (WAIT_CHECK) waits: c reads
 * nothing until derive.c's hook answers it, which calls conn_wait_end()
 * and then sends. A hang-up closes it, save a half-close while a PUBLISH
 * is checked (enum conn_waiting). */
void conn_wait(struct conn *c, enum conn_waiting what);
void conn_wait_end(struct conn *c);

/* Drops a reference the connection held (through derive.c, which knows
 * when an artifact goes with its last holder). */
void conn_release(struct conn *c, struct generation *g);

#endif
