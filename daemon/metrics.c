/*
 * metrics.c: wcached's state as the control socket reports it (see
 * metrics.h): the status reply's JSON members, and the Prometheus text
 * exposition.
 *
 * The format: for each metric family a "# HELP name text" line, a
 * "# TYPE name gauge|counter" line, then one sample line per label set,
 * 'name{label="value"} number'. Families are written whole (all models
 * of one family together), as the format requires. Counter names end in
 * _total, sizes are in bytes and times in seconds (Prometheus' naming
 * conventions, which `promtool check metrics` enforces).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "metrics.h"

/* What one per-model family reports: a value from a model. */
typedef double (*model_value_fn)(const struct registry *reg, const struct model_entry *m);

void
metrics_label_value(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '\\')
			fputs("\\\\", f);
		else if (*s == '"')
			fputs("\\\"", f);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

/*
 * Whether g is cold, but every byte of it is still in memory at a measure
 * taken after its eviction ended: the pages stayed because a process maps
 * or locks them (another configured name serving the same file, workers),
 * so an attach reads nothing from disk. Status and metrics show it ready
 * (review rev223 L13: they said cold, 0 % warm, with every byte resident,
 * and the health check `wcachectl status NAME` exited 3). An eviction
 * still queued or running, or waiting for a warm-up's jobs to stop, has
 * not measured yet.
 */
static bool
cold_but_resident(const struct generation *g)
{
	int64_t age_ms;

	return g->state == GEN_COLD && g->warm.pending == 0 && !pages_evicting(g) &&
		gen_resident(g, NULL, &age_ms) >= g->bytes && age_ms >= 0;
}

const char *
metrics_generation_state(const struct generation *g)
{
	return gen_state_name(cold_but_resident(g) ? GEN_READY : g->state);
}

const char *
metrics_model_state(const struct model_entry *m)
{
	if (m->current != NULL)
		return metrics_generation_state(m->current);
	return m->loading > 0 ? "loading" : "failed";
}

/* Writes the # HELP and # TYPE lines of a family. help holds no backslash
 * or newline (they are our own constant strings). */
static void
family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Writes a double the way Prometheus parses it; integers stay exact. */
static void
value(FILE *f, double v)
{
	if (v >= 0 && v < 9007199254740992.0 && v == (double)(uint64_t)v)
		fprintf(f, " %" PRIu64 "\n", (uint64_t)v);
	else
		fprintf(f, " %.9g\n", v);
}

/* A gauge or a counter of one series without labels: its family (HELP,
 * TYPE), then its name and value v, the name written once. */
static void
gauge(FILE *f, const char *name, double v, const char *help)
{
	family(f, name, "gauge", help);
	fputs(name, f);
	value(f, v);
}

static void
counter(FILE *f, const char *name, double v, const char *help)
{
	family(f, name, "counter", help);
	fputs(name, f);
	value(f, v);
}

/* A counter of accept pauses, v: its help names the pause its socket's
 * owner uses (ms), so that the text cannot drift from it. */
static void
pauses_counter(FILE *f, const char *name, double v, const char *socket, unsigned ms,
	const char *why)
{
	fprintf(f, "# HELP %s Times %s was left unwatched for %u ms: %s\n# TYPE %s counter\n",
		name, socket, ms, why, name);
	fputs(name, f);
	value(f, v);
}

static unsigned
open_generations(const struct registry *reg, const struct model_entry *m)
{
	unsigned n = 0;

	for (const struct generation *g = reg->generations; g != NULL; g = g->next)
		if (g->model == m)
			n++;
	return n;
}

/*
 * The model_value_fn of a number of the model's entry (ENTRY_VALUE), or of
 * its current generation, 0 without one (CURRENT_VALUE): most families are
 * one such number.
 */
#define ENTRY_VALUE(fn, field)                                                  \
	static double fn(const struct registry *reg, const struct model_entry *m) \
	{                                                                         \
		return (double)m->field;                                          \
	}
#define CURRENT_VALUE(fn, field)                                                \
	static double fn(const struct registry *reg, const struct model_entry *m) \
	{                                                                         \
		return m->current != NULL ? (double)m->current->field : 0;        \
	}

CURRENT_VALUE(v_bytes, bytes)
CURRENT_VALUE(v_generation, number)
CURRENT_VALUE(v_attached, attached)
ENTRY_VALUE(v_attaches, attach_count)
ENTRY_VALUE(v_attach_errors, error_count)
ENTRY_VALUE(v_denied, denied_count)
ENTRY_VALUE(v_load_errors, load_errors)
ENTRY_VALUE(v_swaps, swap_count)
ENTRY_VALUE(v_rewarms, rewarm_count)
ENTRY_VALUE(v_warm_seconds, last_warm_seconds)
ENTRY_VALUE(v_polls, polls)
ENTRY_VALUE(v_poll_seconds, poll_seconds)
ENTRY_VALUE(v_poll_changes, poll_changes)

static double
v_resident(const struct registry *reg, const struct model_entry *m)
{
	return m->current != NULL ? (double)gen_resident(m->current, NULL, NULL) : 0;
}

static double
v_open(const struct registry *reg, const struct model_entry *m)
{
	return (double)open_generations(reg, m);
}

/*
 * How far the model's newest generation (the pending one, else the current
 * one) has warmed, in percent: 100 once ready, the bytes its reads have
 * pulled in so far while it warms (below 100), 0 before (and while cold,
 * unless every byte stayed in memory: cold_but_resident); and the seconds
 * left at the rate it has read so far (0 when not warming, -1 while
 * nothing is read yet, so no rate is known).
 */
static void
warm_progress(const struct registry *reg, const struct model_entry *m, double *percent,
	double *eta)
{
	const struct generation *g = m->pending != NULL ? m->pending : m->current;
	uint64_t done;
	double secs;

	*percent = g != NULL && (g->state == GEN_READY || cold_but_resident(g)) ? 100 : 0;
	*eta = 0;
	if (g == NULL || g->state != GEN_WARMING || g->bytes == 0)
		return;
	done = g->warm.bytes;
	for (size_t i = 0; i < g->source.nfiles; i++)
		if (g->warm.jobs[i] != NULL)
			done += warm_job_bytes(g->warm.jobs[i]);
	if (done > g->bytes)
		done = g->bytes;
	/* At most 99.9 while warming, as printed too (%.1f): every byte may
	 * be read before the loop hears that the last job ended, which takes
	 * a while on a loaded host. */
	*percent = 100.0 * (double)done / (double)g->bytes;
	if (*percent > 99.9)
		*percent = 99.9;
	secs = (double)(uv_now(reg->loop) - g->warm.started_ms) / 1000.0;
	*eta = done > 0 && secs > 0 ? (double)(g->bytes - done) * secs / (double)done : -1;
}

static double
v_warm_percent(const struct registry *reg, const struct model_entry *m)
{
	double percent, eta;

	warm_progress(reg, m, &percent, &eta);
	return percent;
}

static double
v_warm_eta(const struct registry *reg, const struct model_entry *m)
{
	double percent, eta;

	warm_progress(reg, m, &percent, &eta);
	return eta;
}

static const struct {
	const char *name;
	const char *type;
	const char *help;
	model_value_fn value;
} model_families[] = {
	{ "wcached_model_bytes", "gauge",
		"Size of the files of the model's current generation.", v_bytes },
	{ "wcached_model_resident_bytes", "gauge",
		"Bytes of the current generation's files in memory (page cache, measured so "
		"that it is true for a daemon that does not own the files).", v_resident },
	{ "wcached_model_generation", "gauge",
		"Number of the model's current generation (0: none).", v_generation },
	{ "wcached_model_attached_clients", "gauge",
		"Client attaches holding the current generation.", v_attached },
	{ "wcached_model_open_generations", "gauge",
		"Generations of the model still open (current, warming, or held).", v_open },
	{ "wcached_model_attaches_total", "counter",
		"Successful attaches of the model.", v_attaches },
	{ "wcached_model_attach_errors_total", "counter",
		"Attaches of the model that were refused.", v_attach_errors },
	{ "wcached_model_access_denied_total", "counter",
		"Attaches refused because the client is not in allow_users or allow_groups.",
		v_denied },
	{ "wcached_model_load_errors_total", "counter",
		"Loads of the model that failed (validation, its files, a refusal), and "
		"replacements of it that failed while warming.",
		v_load_errors },
	{ "wcached_model_swaps_total", "counter",
		"Generations that replaced a current one.", v_swaps },
	{ "wcached_model_rewarms_total", "counter",
		"Warm-ups of the current generation after memory pressure took its pages.",
		v_rewarms },
	{ "wcached_model_warm_seconds", "gauge",
		"Warm-up time of the newest generation that finished warming.", v_warm_seconds },
	{ "wcached_model_warm_percent", "gauge",
		"How much of the newest generation is warm, in percent (100: ready).",
		v_warm_percent },
	{ "wcached_model_warm_eta_seconds", "gauge",
		"Estimated seconds until the newest generation is warm (0: not warming; -1: "
		"no estimate yet).", v_warm_eta },
	{ "wcached_model_polls_total", "counter",
		"Polls of the model's paths (a model on a network or FUSE filesystem, or "
		"watch = poll).", v_polls },
	{ "wcached_model_poll_seconds_total", "counter",
		"Time the polls of the model's paths took (stat of each path).", v_poll_seconds },
	{ "wcached_model_poll_changes_total", "counter",
		"Changes polling found in the model's files and acted on.", v_poll_changes },
};

static const char *const model_states[] = {
	"loading", "warming", "ready", "cold", "modified", "failed",
};

/* How many derived artifacts are served, and how many of them workers
 * hold (for derive_each). */
struct artifact_count {
	unsigned artifacts, held;
};

static void
count_artifacts(const struct derive_info *i, void *arg)
{
	struct artifact_count *n = arg;

	if (i->building)
		return;
	n->artifacts++;
	n->held += i->holders > 0;
}

static void
write_derive_metrics(FILE *f, const struct registry *reg, const struct derive_table *t)
{
	static const struct {
		const char *name, *help;
		size_t offset;
	} counters[] = {
		{ "wcached_derived_builds_total", "Builds of derived artifacts started (each "
		  "builder, the first and any that took over).",
		  offsetof(struct derive_stats, builds) },
		{ "wcached_derived_published_total", "Derived artifacts published.",
		  offsetof(struct derive_stats, published) },
		{ "wcached_derived_published_bytes_total", "Bytes of derived artifacts published.",
		  offsetof(struct derive_stats, published_bytes) },
		{ "wcached_derived_waits_total", "Requests that waited for another worker's build.",
		  offsetof(struct derive_stats, waits) },
		{ "wcached_derived_failures_total", "Builds that failed for good (abandoned, "
		  "refused publication, no builder left).",
		  offsetof(struct derive_stats, failures) },
		{ "wcached_derived_builders_lost_total", "Builders that disconnected or exceeded "
		  "derive_timeout.", offsetof(struct derive_stats, builders_lost) },
		{ "wcached_derived_attaches_total", "Attaches of derived artifacts.",
		  offsetof(struct derive_stats, attaches) },
		{ "wcached_derived_dropped_total", "Derived artifacts dropped (superseded or for "
		  "memory_budget).", offsetof(struct derive_stats, dropped) },
	};
	struct artifact_count n = { 0, 0 };

	for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
		uint64_t v;

		memcpy(&v, (const char *)&t->stats + counters[i].offset, sizeof(v));
		family(f, counters[i].name, "counter", counters[i].help);
		fputs(counters[i].name, f);
		value(f, (double)v);
	}
	for (const struct model_entry *m = reg->models; m != NULL; m = m->next)
		derive_each(t, m->name, count_artifacts, &n);
	gauge(f, "wcached_derived_artifacts", n.artifacts, "Derived artifacts served now.");
	gauge(f, "wcached_derived_bytes", (double)reg->derived_bytes,
		"Bytes of the derived artifacts served now (they count against memory_budget).");
}

/* The memory limit in force, where it came from, and the budget. */
static void
write_memory_metrics(FILE *f, const struct registry *reg, const struct memlimit *mem)
{
	family(f, "wcached_memory_limit_bytes", "gauge",
		"The memory wcached may use: RAM, or its cgroup's limit when smaller (source); "
		"percent budgets are of this.");
	fprintf(f, "wcached_memory_limit_bytes{source=\"%s\"}", memlimit_kind_name(mem->kind));
	value(f, (double)mem->limit);
	gauge(f, "wcached_memory_ram_bytes", (double)mem->ram, "The machine's RAM.");
	gauge(f, "wcached_memory_budget_bytes", (double)reg->memory_budget,
		"memory_budget in bytes (0: none): models past it are evicted, least recently "
		"attached first.");
}

/* The work queue: what runs or waits on remote filesystems (workq.h). */
static void
write_workq_metrics(FILE *f, const struct workq *q)
{
	static const struct {
		const char *name, *help;
		size_t offset;
	} gauges[] = {
		{ "wcached_work_queue_threads", "Threads of the work queue (UV_THREADPOOL_SIZE).",
		  offsetof(struct workq, threads) },
		{ "wcached_work_queue_remote_limit", "Jobs on remote filesystems that may run at "
		  "once (the rest of the threads stay for local work).",
		  offsetof(struct workq, remote_limit) },
		{ "wcached_work_queue_remote_running", "Jobs running now on remote filesystems.",
		  offsetof(struct workq, remote_running) },
		{ "wcached_work_queue_remote_waiting", "Jobs on remote filesystems waiting for a "
		  "thread.", offsetof(struct workq, remote_waiting) },
		{ "wcached_work_queue_remote_stalled", "Jobs on remote filesystems running for "
		  "10 s or more (a hung server?).", offsetof(struct workq, remote_stalled) },
	};

	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
		unsigned v;

		memcpy(&v, (const char *)q + gauges[i].offset, sizeof(v));
		family(f, gauges[i].name, "gauge", gauges[i].help);
		fputs(gauges[i].name, f);
		value(f, v);
	}
	counter(f, "wcached_work_queue_remote_stalls_total", (double)q->stalls,
		"Jobs on remote filesystems that ran for 10 s or more.");
}

/* Status's "work_queue" object. */
static void
write_workq_json(FILE *f, const struct workq *q)
{
	fprintf(f, ",\"work_queue\":{\"threads\":%u,\"remote_limit\":%u,"
		   "\"remote_per_filesystem\":%u,\"remote_running\":%u,\"remote_waiting\":%u,"
		   "\"remote_stalled\":%u,\"remote_stalls\":%" PRIu64
		   ",\"oldest_remote_seconds\":%.1f}",
		q->threads, q->remote_limit, q->per_fs_limit, q->remote_running, q->remote_waiting,
		q->remote_stalled, q->stalls, workq_oldest_seconds(q));
}

/* Status's "memory" object: the limit in force and what the models and the
 * derived artifacts need. Artifacts are memory the kernel cannot reclaim
 * (memfds), so "fits" weighs them beside the models warm as if pinned:
 * the budget drops those nobody holds, never the ones left. */
static void
write_memory_json(FILE *f, const struct registry *reg, const struct memlimit *mem,
	const struct derive_table *t)
{
	struct artifact_count n = { 0, 0 };
	uint64_t models, pinned, derived = reg->derived_bytes;
	char src[400];

	registry_served_bytes(reg, &models, &pinned);
	if (t != NULL)
		for (const struct model_entry *m = reg->models; m != NULL; m = m->next)
			derive_each(t, m->name, count_artifacts, &n);
	fprintf(f, ",\"memory\":{\"ram\":%" PRIu64 ",\"limit\":%" PRIu64, mem->ram, mem->limit);
	json_write_field(f, "limit_source", memlimit_source(mem, src, sizeof(src)));
	json_write_field(f, "limit_kind", memlimit_kind_name(mem->kind));
	if (mem->cgroup != 0)
		fprintf(f, ",\"cgroup_limit\":%" PRIu64, mem->cgroup);
	else
		fputs(",\"cgroup_limit\":null", f);
	fprintf(f, ",\"budget\":%" PRIu64 ",\"models_bytes\":%" PRIu64
		   ",\"derived_bytes\":%" PRIu64 ",\"derived_artifacts\":%u,\"derived_held\":%u"
		   ",\"fits\":%s}", reg->memory_budget, models, derived, n.artifacts, n.held,
		memlimit_fits(mem, models + derived, pinned + derived, reg->memory_budget) ?
			"true" : "false");
}

/* The watch label of wcached_model_info: how m's updates are seen now.
 * "inotify", "inotify+poll" when its paths are polled too, and "poll" once
 * the inotify descriptor failed for good (watch.c): then polling is all. */
static const char *
watch_label(const struct registry *reg, const struct model_entry *m)
{
	if (reg->inotify_failed)
		return "poll";
	return registry_polls(reg, m) ? "inotify+poll" : "inotify";
}

void
metrics_write(FILE *f, const struct registry *reg, const struct metrics_daemon *d)
{
	unsigned nmodels = 0, ngenerations = 0, nunloaded = 0;

	for (const struct model_entry *m = reg->models; m != NULL; m = m->next)
		nmodels++;
	for (const struct generation *g = reg->generations; g != NULL; g = g->next) {
		ngenerations++;
		if (g->model == NULL)
			nunloaded++;
	}

	family(f, "wcached_build_info", "gauge", "wcached's version, as a label.");
	fputs("wcached_build_info{version=\"", f);
	metrics_label_value(f, WCACHE_VERSION);
	fputs("\"} 1\n", f);
	gauge(f, "wcached_uptime_seconds", d->uptime_seconds, "Seconds since wcached started.");
	gauge(f, "wcached_clients", d->clients, "Client connections to the client socket.");
	gauge(f, "wcached_fds_in_flight", d->server.fds_in_flight,
		"Descriptors sent to clients with replies and not yet received by them.");
	gauge(f, "wcached_clients_held_back", d->server.deferred_clients,
		"Clients held back now: their next reply waits because they leave replies "
		"unread, or they are not read while 64 of their user's descriptors wait to close.");
	counter(f, "wcached_replies_held_back_total", (double)d->server.replies_deferred,
		"Replies held back for a client that left earlier replies unread (backpressure).");
	counter(f, "wcached_sends_refused_total", (double)d->server.sends_refused,
		"Replies the kernel refused to send (ETOOMANYREFS, ENOBUFS); retried later.");
	gauge(f, "wcached_fds_closing", d->server.fds_closing,
		"Descriptors that close off the event loop now: those clients chose (passed, or "
		"left queued on a connection), and model files and memfds that closed; a number "
		"that stays up is a close that hangs.");
	counter(f, "wcached_clients_refused_closing_total", (double)d->server.closing_refused,
		"Connections refused or closed because 64 of their user's descriptors wait behind "
		"a close that hangs.");
	counter(f, "wcached_clients_closed_unread_total", (double)d->server.unread_closed,
		"Connections closed because their replies stayed unread for unread_reply_seconds "
		"while the next one was held back.");
	counter(f, "wcached_clients_closed_idle_total", (double)d->server.idle_closed,
		"Idle connections (nothing attached, nothing sent for 5 s) closed to make room for "
		"a new client while max_clients were connected.");
	counter(f, "wcached_clients_paused_closing_total", (double)d->server.reads_paused_closing,
		"Connections not read for a while because 64 of their user's descriptors were "
		"waiting to close (each message may pass 253 more).");
	counter(f, "wcached_fds_closed_inline_total", (double)d->server.closed_inline,
		"Descriptors closed on the event loop for want of memory or a thread to close "
		"them off it (each could stall every client while it closes).");
	pauses_counter(f, "wcached_accept_pauses_total", (double)d->server.accept_pauses,
		"the client socket", SERVER_ACCEPT_PAUSE_MS, "wcached was out of descriptors with "
		"none spare to refuse a waiting client with, or accept(2) failed otherwise "
		"(ENOMEM, ENOBUFS).");
	counter(f, "wcached_control_timeouts_total", (double)d->control_timeouts,
		"Control connections closed because they did not finish a request in time.");
	counter(f, "wcached_control_evicted_total", (double)d->control_evicted,
		"Idle control connections closed to make room for a new one (16 per uid, 64 in "
		"all).");
	counter(f, "wcached_control_refused_total", (double)d->control_refused,
		"Control connections refused (uid not allowed to control wcached, or every "
		"connection busy) and requests refused (too many in flight).");
	pauses_counter(f, "wcached_control_accept_pauses_total", (double)d->control_accept_pauses,
		"the control socket", d->control_accept_pause_ms, "accept(2) failed (out of "
		"descriptors, ENOMEM, ENOBUFS) and connections waited in the backlog.");
	counter(f, "wcached_notify_dropped_total", (double)d->notify_dropped,
		"STATUS= notifications to the service manager dropped because it was not reading.");
	if (d->derive != NULL)
		write_derive_metrics(f, reg, d->derive);
	if (d->mem != NULL)
		write_memory_metrics(f, reg, d->mem);
	write_workq_metrics(f, &reg->workq);
	gauge(f, "wcached_models", nmodels, "Models served.");
	gauge(f, "wcached_open_generations", ngenerations,
		"Generations open, including those of unloaded models still held by clients.");
	gauge(f, "wcached_unloaded_open_generations", nunloaded,
		"Generations of unloaded models that clients still hold.");

	for (size_t i = 0; i < sizeof(model_families) / sizeof(model_families[0]); i++) {
		family(f, model_families[i].name, model_families[i].type, model_families[i].help);
		for (const struct model_entry *m = reg->models; m != NULL; m = m->next) {
			fprintf(f, "%s{model=\"", model_families[i].name);
			metrics_label_value(f, m->name);
			fputs("\"}", f);
			value(f, model_families[i].value(reg, m));
		}
	}

	family(f, "wcached_model_info", "gauge",
		"The model's configured path and pin mode, the filesystem of its current "
		"generation (remote: network or FUSE) and how its updates are seen, as labels.");
	for (const struct model_entry *m = reg->models; m != NULL; m = m->next) {
		fputs("wcached_model_info{model=\"", f);
		metrics_label_value(f, m->name);
		fputs("\",path=\"", f);
		metrics_label_value(f, m->path != NULL ? m->path : "");
		fputs("\",pin=\"", f);
		metrics_label_value(f, pin_mode_name(m->pin));
		fputs("\",filesystem=\"", f);
		metrics_label_value(f, m->current != NULL ? m->current->fs.name : "");
		fprintf(f, "\",remote=\"%s\",watch=\"%s\"} 1\n",
			m->current != NULL && m->current->fs.remote ? "true" : "false",
			watch_label(reg, m));
	}
	family(f, "wcached_model_state", "gauge",
		"1 for the model's state (as in wcachectl status), 0 for the others.");
	for (const struct model_entry *m = reg->models; m != NULL; m = m->next) {
		const char *state = metrics_model_state(m);

		for (size_t i = 0; i < sizeof(model_states) / sizeof(model_states[0]); i++) {
			fputs("wcached_model_state{model=\"", f);
			metrics_label_value(f, m->name);
			fprintf(f, "\",state=\"%s\"} %d\n", model_states[i],
				strcmp(state, model_states[i]) == 0);
		}
	}
}

/* ---- the status reply ---------------------------------------------------- */

/* One entry of a model's "generations" array. */
static void
write_generation(FILE *f, const struct model_entry *m, const struct generation *g)
{
	fprintf(f, "{\"number\":%" PRIu64, g->number);
	json_write_field(f, "state", metrics_generation_state(g));
	fprintf(f, ",\"attached\":%u,\"bytes\":%" PRIu64 ",\"current\":%s,\"pending\":%s",
		g->attached, g->bytes, m != NULL && m->current == g ? "true" : "false",
		m != NULL && m->pending == g ? "true" : "false");
	json_write_field(f, "filesystem", g->fs.name);
	fprintf(f, ",\"staged\":%s,\"source_replaced\":%s", g->origin != NULL ? "true" : "false",
		g->source_replaced ? "true" : "false");
	if (g->staged.dir != NULL) {
		json_write_field(f, "staged_dir", g->staged.dir);
		fprintf(f, ",\"staged_disk_bytes\":%" PRIu64 ",\"stage_seconds\":%.3f",
			(uint64_t)g->staged.disk_bytes, g->staged.seconds);
	}
	/* Restored as held before a restart: how long HOLDs may still come. */
	if (g->hold_until_ms != 0) {
		uint64_t now = registry_now_ms(g->registry);

		fprintf(f, ",\"hold_wait_ms\":%" PRIu64,
			g->hold_until_ms > now ? g->hold_until_ms - now : 0);
	}
	fputc('}', f);
}

struct derived_json {
	FILE *f;
	bool first;
};

/* One entry of a model's "derived" array (for derive_each). */
static void
write_derived(const struct derive_info *i, void *arg)
{
	struct derived_json *j = arg;
	FILE *f = j->f;

	if (!j->first)
		fputc(',', f);
	j->first = false;
	fputs("{\"key\":", f);
	json_write_string(f, i->key, strlen(i->key));
	json_write_field(f, "state", i->checking ? "checking" : i->building ? "building" : "ready");
	fprintf(f, ",\"source_generation\":%" PRIu64 ",\"builder_uid\":%u,\"builder_pid\":%d",
		i->source, (unsigned)i->builder_uid, (int)i->builder_pid);
	if (i->building) {
		fprintf(f, ",\"builder_connected\":%s,\"waiting\":%u}",
			i->builder_gone ? "false" : "true", i->waiting);
		return;
	}
	json_write_field(f, "format", i->format);
	fprintf(f, ",\"bytes\":%" PRIu64 ",\"attached\":%u,\"attaches\":%" PRIu64
		   ",\"build_seconds\":%.3f,\"withdrawn\":%s}", i->bytes, i->holders,
		i->attach_count, i->build_seconds, i->withdrawn ? "true" : "false");
}

/* One entry of status's "models" array. */
static void
write_model(FILE *f, const struct registry *reg, const struct model_entry *m,
	const struct derive_table *t)
{
	const struct generation *g = m->current;
	const char *method = "none";
	int64_t age_ms = -1;
	uint64_t resident;
	bool first = true;
	double percent, eta;

	fputs("{\"name\":", f);
	json_write_string(f, m->name, strlen(m->name));
	json_write_field(f, "path", m->path != NULL ? m->path : "");
	/* The real path an attach finds the model by too (registry_find),
	 * where it is another. */
	if (g != NULL && g->resolved_path != NULL && m->path != NULL &&
		strcmp(g->resolved_path, m->path) != 0)
		json_write_field(f, "resolved_path", g->resolved_path);
	else
		fputs(",\"resolved_path\":null", f);
	fprintf(f, ",\"generation\":%" PRIu64, g != NULL ? g->number : 0);
	json_write_field(f, "state", metrics_model_state(m));
	resident = g != NULL ? gen_resident(g, &method, &age_ms) : 0;
	fprintf(f, ",\"bytes\":%" PRIu64 ",\"resident_bytes\":%" PRIu64,
		g != NULL ? g->bytes : 0, resident);
	json_write_field(f, "resident_method", method);
	if (age_ms >= 0)
		fprintf(f, ",\"resident_age_ms\":%" PRId64, age_ms);
	else
		fputs(",\"resident_age_ms\":null", f);
	json_write_field(f, "pinned", pin_mode_name(m->pin));
	json_write_field(f, "pin_applied",
		pin_mode_name(g != NULL ? (enum pin_mode)g->pinned : PIN_NONE));
	/* Why the current generation holds less than asked: a refused mlock. */
	if (g != NULL && g->pin_error[0] != '\0')
		json_write_field(f, "pin_error", g->pin_error);
	else
		fputs(",\"pin_error\":null", f);
	fprintf(f, ",\"warm\":%s,\"attached\":%u,\"pending\":%" PRIu64 ",\"loading\":%u",
		m->warm ? "true" : "false", g != NULL ? g->attached : 0,
		m->pending != NULL ? m->pending->number : 0, m->loading);
	fprintf(f, ",\"attaches\":%" PRIu64 ",\"attach_errors\":%" PRIu64
		   ",\"access_denied\":%" PRIu64 ",\"swaps\":%" PRIu64 ",\"load_errors\":%" PRIu64
		   ",\"rewarms\":%" PRIu64 ",\"warm_seconds\":%.3f,\"restricted\":%s",
		m->attach_count, m->error_count, m->denied_count, m->swap_count, m->load_errors,
		m->rewarm_count, m->last_warm_seconds, m->access.restricted ? "true" : "false");
	warm_progress(reg, m, &percent, &eta);
	fprintf(f, ",\"warm_percent\":%.1f", percent);
	if (eta >= 0)
		fprintf(f, ",\"warm_eta_seconds\":%.1f", eta);
	else
		fputs(",\"warm_eta_seconds\":null", f);
	fputs(",\"generations\":[", f);
	for (const struct generation *h = reg->generations; h != NULL; h = h->next) {
		if (h->model != m)
			continue;
		if (!first)
			fputc(',', f);
		first = false;
		write_generation(f, m, h);
	}
	fputc(']', f);
	json_write_field(f, "filesystem", g != NULL ? g->fs.name : "");
	fprintf(f, ",\"remote\":%s", g != NULL && g->fs.remote ? "true" : "false");
	/* What is done: the configured watch, or poll once the inotify
	 * descriptor failed for good, whatever was configured (watch_label). */
	json_write_field(f, "watch",
		fs_watch_name(reg->inotify_failed ? FS_WATCH_POLL : m->watch));
	fprintf(f, ",\"polled\":%s,\"poll_interval_ms\":%u,\"polls\":%" PRIu64
		   ",\"poll_seconds\":%.6f,\"poll_changes\":%" PRIu64,
		registry_polls(reg, m) ? "true" : "false", m->poll_interval_ms, m->polls,
		m->poll_seconds, m->poll_changes);
	json_write_field(f, "stage", fs_stage_name(m->stage));
	fprintf(f, ",\"derive\":%s", m->derive ? "true" : "false");
	if (t != NULL) {
		struct derived_json j = { f, true };

		fputs(",\"derived\":[", f);
		derive_each(t, m->name, write_derived, &j);
		fputc(']', f);
	}
	if (m->error != NULL)
		json_write_field(f, "error", m->error);
	/* The files at its path wait for `wcachectl reload NAME`: why. */
	if (m->refused_tree)
		json_write_field(f, "waits_for_reload",
			m->refused_line != NULL ? m->refused_line : "out of memory");
	/* Its newest watched reload found this file open for writing: the
	 * files on disk load once no writer is left (watch.h). */
	if (m->writer_path != NULL) {
		json_write_field(f, "waiting_for_writer", m->writer_path);
		fprintf(f, ",\"waiting_for_writer_seconds\":%.1f",
			(double)(registry_now_ms(reg) - m->writer_since_ms) / 1000.0);
	}
	fputc('}', f);
}

void
metrics_status_json(FILE *f, const struct registry *reg, const struct metrics_daemon *d)
{
	bool first = true;

	json_write_field(f, "version", WCACHE_VERSION);
	fprintf(f, ",\"pid\":%d,\"uptime_seconds\":%.3f,\"clients\":%u,\"control_clients\":%u",
		(int)getpid(), d->uptime_seconds, d->clients, d->control_clients);
	/* Whether inotify still watches: once its descriptor failed for good,
	 * every model is polled and shows "watch":"poll", which a configured
	 * `watch = poll` (inotify and polling) shows too. */
	json_write_field(f, "inotify", reg->inotify_failed ? "failed" : "ok");
	if (d->derive != NULL) {
		const struct derive_stats *s = &d->derive->stats;

		fprintf(f, ",\"derive\":{\"bytes\":%" PRIu64 ",\"builds\":%" PRIu64
			   ",\"published\":%" PRIu64 ",\"published_bytes\":%" PRIu64
			   ",\"waits\":%" PRIu64 ",\"failures\":%" PRIu64
			   ",\"builders_lost\":%" PRIu64 ",\"attaches\":%" PRIu64
			   ",\"dropped\":%" PRIu64 "}", reg->derived_bytes, s->builds, s->published,
			s->published_bytes, s->waits, s->failures, s->builders_lost, s->attaches,
			s->dropped);
	}
	if (d->mem != NULL)
		write_memory_json(f, reg, d->mem, d->derive);
	write_workq_json(f, &reg->workq);
	fputs(",\"models\":[", f);
	for (const struct model_entry *m = reg->models; m != NULL; m = m->next) {
		if (!first)
			fputc(',', f);
		first = false;
		write_model(f, reg, m, d->derive);
	}
	/* Generations of unloaded models that clients still hold. */
	fputs("],\"unloaded\":[", f);
	first = true;
	for (const struct generation *g = reg->generations; g != NULL; g = g->next) {
		if (g->model != NULL)
			continue;
		if (!first)
			fputc(',', f);
		first = false;
		fputs("{\"name\":", f);
		json_write_string(f, g->model_name, strlen(g->model_name));
		fprintf(f, ",\"generation\":%" PRIu64, g->number);
		json_write_field(f, "state", metrics_generation_state(g));
		fprintf(f, ",\"attached\":%u,\"bytes\":%" PRIu64 "}", g->attached, g->bytes);
	}
	fputc(']', f);
}
