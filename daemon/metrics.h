/*
 * metrics.h: what wcached reports about itself, for the control socket: the
 * "status" reply's JSON, and counters and gauges in the Prometheus text
 * exposition format (version 0.0.4) for "metrics".
 *
 * Kept apart from control.c (which speaks the protocol) so the formats can
 * be tested on their own, and the exposition checked with `promtool check
 * metrics`.
 */
#ifndef WC_METRICS_H
#define WC_METRICS_H

#include <stdio.h>

#include "generation.h"
#include "registry.h"
#include "derive.h"
#include "memlimit.h"
#include "server.h"

/* Daemon-wide figures that the registry does not hold. */
struct metrics_daemon {
	unsigned clients;         /* connections to the client socket */
	unsigned control_clients; /* connections to the control socket */
	double uptime_seconds;
	struct server_stats server; /* backpressure of the client socket */
	uint64_t control_timeouts;  /* control connections closed for idling */
	uint64_t control_evicted;   /* idle control connections closed to make room */
	uint64_t control_refused;   /* control connections (permission, limits) and
	                             * requests (too many in flight) refused */
	uint64_t control_accept_pauses; /* times the control socket was left unwatched
	                                 * after a failed accept, */
	unsigned control_accept_pause_ms; /* for this long (CTL_ACCEPT_PAUSE_MS) */
	uint64_t notify_dropped;    /* STATUS= notifications dropped (manager not reading) */
	const struct derive_table *derive; /* derived artifacts; NULL: none */
	const struct memlimit *mem;        /* the memory limit in force; NULL: unknown */
};

/*
 * Writes every metric family: daemon totals (clients, uptime, build info,
 * open generations) and, per model, bytes, resident bytes, generation,
 * attached clients, open generations, attach, attach error, load error and
 * swap counters, the last warm-up time, its configuration and its state.
 * Every family has its # HELP and # TYPE lines, even without samples.
 * Resident bytes cost a mincore() over each current generation's mappings.
 */
void metrics_write(FILE *f, const struct registry *reg, const struct metrics_daemon *d);

/*
 * Writes the members of the status reply, each preceded by a comma (the
 * caller has written '{"ok":true' and closes the object): version, pid,
 * uptime_seconds, clients, control_clients, "models" (per model: name,
 * path, generation, state, bytes, resident_bytes, pinned, pin_applied, warm,
 * attached, pending, loading, counters, warm_seconds, "generations" with
 * every open generation of the model, error when there is one) and
 * "unloaded" (generations of unloaded models that clients still hold).
 */
void metrics_status_json(FILE *f, const struct registry *reg, const struct metrics_daemon *d);

/* Writes s as the inside of a label value: backslash, double quote and
 * newline escaped as \\, \" and \n. */
void metrics_label_value(FILE *f, const char *s);

/*
 * The state of a model in one word, as status and metrics show it: the
 * current generation's state ("warming", "ready", "modified", "failed"),
 * or "cold" when it is ready or warming but was evicted ("ready" while
 * every byte of it stays in memory: metrics_generation_state()); without a
 * current generation "loading" while a load runs, else "failed".
 */
const char *metrics_model_state(const struct model_entry *m);

/* The state of one generation: gen_state_name() (generation.h), but
 * "ready" for a cold one whose latest measure, taken after its eviction
 * ended, finds every byte in memory (pages a process maps or locks stay). */
const char *metrics_generation_state(const struct generation *g);

#endif
