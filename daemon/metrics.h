/*
 * metrics.h: wcached's counters and gauges in the Prometheus text exposition
 * format (version 0.0.4), for the control socket's "metrics" command.
 *
 * Kept apart from control.c so the format (escaping, families, names) can be
 * tested on its own and checked with `promtool check metrics`.
 */
#ifndef WC_METRICS_H
#define WC_METRICS_H

#include <stdio.h>

#include "registry.h"

/*
 * Writes every metric family: daemon totals (clients, uptime, build info,
 * open generations) and, per model, bytes, resident bytes, generation,
 * attached clients, open generations, attach, attach error, load error and
 * swap counters, the last warm-up time, its configuration and its state.
 * Every family has its # HELP and # TYPE lines, even without samples.
 * Resident bytes cost a mincore() over each current generation's mappings.
 */
void metrics_write(FILE *f, const struct registry *reg, unsigned clients, double uptime_seconds);

/* Writes s as the inside of a label value: backslash, double quote and
 * newline escaped as \\, \" and \n. */
void metrics_label_value(FILE *f, const char *s);

/*
 * The state of a model in one word, as status and metrics show it: the
 * current generation's state ("warming", "ready", "modified", "failed"),
 * or "cold" when it is ready or warming but was evicted; without a current
 * generation "loading" while a load runs, else "failed".
 */
const char *metrics_model_state(const struct model_entry *m);

/* The state of one generation: gen_state_name(), or "cold" as above. */
const char *metrics_generation_state(const struct generation *g);

#endif
