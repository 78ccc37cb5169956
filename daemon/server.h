/*
 * server.h: the client socket of wcached.
 *
 * Workers connect to a SOCK_SEQPACKET socket and send ATTACH and RELEASE
 * (proto/PROTOCOL.md). Each connection is watched with a uv_poll_t and read
 * and written with recvmsg/sendmsg, because libuv cannot pass arbitrary
 * descriptors. A connection has at most one reply pending: while a reply
 * waits for a slow client's buffer to drain, or for room in the budget of
 * descriptors in flight (struct server in server_internal.h, and
 * server_budget.c), that client is not read, and no other client waits for
 * it or loses its connection for it.
 */
#ifndef WC_SERVER_H
#define WC_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "registry.h"

struct server;

struct derive_table;
struct derive_hooks;

struct server_options {
	unsigned max_clients;          /* connections at once; 0 = 1024 */
	unsigned max_clients_per_uid;  /* connections of one user; 0 = 256 */
	unsigned max_attaches;         /* live attaches per connection; 0 = 4096 */
	struct derive_table *derive;   /* derived artifacts (derive.h); set up with
					  server_derive_hooks */
	struct closer *closer;         /* closes every descriptor a client chose:
					  its connection and what it passed
					  (closer.h); NULL: close() on the loop */
	unsigned unread_reply_ms;      /* a connection whose replies stay unread this
					  long, one held back, is closed; 0 = 60 s
					  (unread_reply_seconds) */
};

/* The hooks derive_init() needs to answer the server's waiting
 * connections. */
extern const struct derive_hooks server_derive_hooks;

/*
 * Starts serving on listen_fd (a listening SOCK_SEQPACKET socket, which the
 * server owns from now on, whether it was created by wcached or passed by
 * systemd). Returns 0 or a negative errno.
 */
int server_start(uv_loop_t *loop, struct registry *reg, int listen_fd,
	const struct server_options *opt, struct server **out);

/* Tells every connection holding an attach of m that its current
 * generation is now generation (0: no longer served) (WIRE_CHANGED; best
 * effort, never blocks). */
void server_announce(struct server *s, const struct model_entry *m, uint64_t generation);

/* Connected clients right now. */
unsigned server_clients(const struct server *s);

/* How long the listening socket is not watched when wcached is out of
 * descriptors and has no spare to refuse the waiting client with: watched,
 * it stays readable while that client waits, and the loop would spin.
 * Here, not in server.c, for the help text of wcached_accept_pauses_total. */
#define SERVER_ACCEPT_PAUSE_MS 100

/* What the backpressure and descriptor budget did, for status and metrics. */
struct server_stats {
	unsigned clients;           /* connections now */
	unsigned fds_in_flight;     /* descriptors sent and not known to be received */
	unsigned deferred_clients;  /* connections held back now (enum conn_deferred) */
	uint64_t replies_deferred;  /* times a reply was held back (budget or kernel refusal) */
	uint64_t sends_refused;     /* sends the kernel refused (ETOOMANYREFS, ENOBUFS) */
	unsigned fds_closing;       /* descriptors closing off the loop now */
	uint64_t closing_refused;   /* connections refused or closed: their uid's
				       descriptors wait behind a close that hangs */
	uint64_t reads_paused_closing; /* connections not read for a while: 64 of
					  their uid's descriptors were waiting to close */
	uint64_t accept_pauses;     /* times the listener was left for a while: out of
				       descriptors, and none spare to refuse a client with,
				       or accept4 failing otherwise (ENOMEM, ENOBUFS) */
	unsigned long closed_inline; /* descriptors closed on the loop: no memory or
					thread for a closing thread (closer.h) */
	uint64_t unread_closed;     /* connections closed: their replies stayed unread
				       for unread_reply_ms with one held back */
	uint64_t idle_closed;       /* idle connections closed to make room for a
				       newcomer at max_clients (make_room) */
};
void server_get_stats(const struct server *s, struct server_stats *out);

/* Closes the listening socket and every connection (releasing what they
 * hold); the memory is freed from libuv close callbacks, so run the loop
 * afterwards. */
void server_stop(struct server *s);

/*
 * Creates, binds and listens on a SOCK_SEQPACKET socket at path with the
 * given mode. A stale socket file (nobody accepts on it) is replaced; a live
 * daemon on the same path is -EADDRINUSE. Returns the fd or -errno with the
 * message in error_get().
 */
int server_listen_path(const char *path, mode_t mode);

#endif
