/*
 * ctl_status.c: how `wcachectl status` shows wcached's status reply: the
 * reply's models, their generations and the generations of unloaded models
 * read into rows, then printed as a table with sizes and the uptime in
 * human units, followed by the generations that are not current and each
 * model's last load error.
 *
 * ctl_control.c sends the request, reads the reply and checks its common
 * fields; it hands a successful status reply to ctl_status_show(), which
 * prints the table (or, with --json, the reply with the answer to "is what
 * was asked about ready?" added) and turns that answer into the exit
 * status. Every string from the daemon (names, states, paths, errors, the
 * version) is printed with escape_print() and measured with escape_width()
 * (base/escape.h), so a hostile model name cannot drive the terminal and
 * the table stays aligned; --json escapes them as JSON (ctl_json_text()).
 * Numbers from the daemon are checked before they become integers.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "base/escape.h"
#include "base/json.h"

/* ---- reading the reply -------------------------------------------------- */

/* One generation of a model, from its "generations" array. */
struct gen_row {
	uint64_t number, attached, bytes;
	char *state;
	int current, pending;
};

/* One derived artifact of a model (or a build of one), from "derived". */
struct derived_row {
	char *key, *state, *format;
	uint64_t source, bytes, attached, attaches, builder_uid, builder_pid, waiting;
	double build_seconds;
	int builder_connected; /* a build's: 0 once its builder left after PUBLISH */
	int withdrawn;         /* dropped while held: attached no more, goes when released */
};

/* One entry of "models": a served model and its current generation. */
struct model_row {
	char *name, *state, *pinned, *error, *path;
	uint64_t generation, bytes, resident, attached;
	double warm_percent, warm_eta; /* eta 0 when absent (null: no estimate yet) */
	char *pin_applied;             /* what is locked; NULL from an older daemon */
	char *pin_error;               /* why less is locked (a refused mlock); NULL: none */
	/* Why the files at its path wait for `wcachectl reload NAME` (a
	 * watched reload the model-tree rules refused); NULL: they do not. */
	char *waits_for_reload;
	char *writer;                  /* the file its update waits for a writer of; NULL: none */
	double writer_seconds;         /* for how long */
	struct gen_row *gens;
	size_t ngens;
	struct derived_row *derived;
	size_t nderived;
};

/* One entry of "unloaded": a generation of a model no longer served that
 * clients still hold. */
struct unloaded_row {
	char *name, *state;
	uint64_t generation, attached;
};

/* The reply's "memory": the limit in force and what the models and the
 * derived artifacts need. */
struct memory_row {
	int present;
	uint64_t limit, budget, models;
	uint64_t derived, artifacts, held; /* derived_bytes; how many, how many held */
	char *source;
	int fits;
};

/* The reply's "work_queue": what waits on remote filesystems. */
struct workq_row {
	uint64_t running, waiting, stalled;
	double oldest;
};

/* The status reply; strings are malloc'd, NULL when absent. */
struct status {
	char *version;
	uint64_t pid, clients;
	double uptime;
	struct memory_row memory;
	struct workq_row workq;
	struct model_row *models;
	size_t nmodels;
	struct unloaded_row *unloaded;
	size_t nunloaded;
};

#define NFIELDS(a) (sizeof(a) / sizeof((a)[0]))

/* Which members of each kind of object in the reply are kept, and where;
 * ctl_read_object() skips the others. */
static const struct ctl_field gen_fields[] = {
	{ "number", CTL_U64, offsetof(struct gen_row, number) },
	{ "attached", CTL_U64, offsetof(struct gen_row, attached) },
	{ "bytes", CTL_U64, offsetof(struct gen_row, bytes) },
	{ "state", CTL_STRING, offsetof(struct gen_row, state) },
	{ "current", CTL_BOOL, offsetof(struct gen_row, current) },
	{ "pending", CTL_BOOL, offsetof(struct gen_row, pending) },
};

static const struct ctl_field derived_fields[] = {
	{ "key", CTL_STRING, offsetof(struct derived_row, key) },
	{ "state", CTL_STRING, offsetof(struct derived_row, state) },
	{ "format", CTL_STRING, offsetof(struct derived_row, format) },
	{ "source_generation", CTL_U64, offsetof(struct derived_row, source) },
	{ "bytes", CTL_U64, offsetof(struct derived_row, bytes) },
	{ "attached", CTL_U64, offsetof(struct derived_row, attached) },
	{ "attaches", CTL_U64, offsetof(struct derived_row, attaches) },
	{ "builder_uid", CTL_U64, offsetof(struct derived_row, builder_uid) },
	{ "builder_pid", CTL_U64, offsetof(struct derived_row, builder_pid) },
	{ "waiting", CTL_U64, offsetof(struct derived_row, waiting) },
	{ "build_seconds", CTL_DOUBLE, offsetof(struct derived_row, build_seconds) },
	{ "builder_connected", CTL_BOOL, offsetof(struct derived_row, builder_connected) },
	{ "withdrawn", CTL_BOOL, offsetof(struct derived_row, withdrawn) },
};

static const struct ctl_field model_fields[] = {
	{ "name", CTL_STRING, offsetof(struct model_row, name) },
	{ "path", CTL_STRING, offsetof(struct model_row, path) },
	{ "state", CTL_STRING, offsetof(struct model_row, state) },
	{ "pinned", CTL_STRING, offsetof(struct model_row, pinned) },
	{ "pin_applied", CTL_STRING, offsetof(struct model_row, pin_applied) },
	{ "pin_error", CTL_STRING, offsetof(struct model_row, pin_error) },
	{ "error", CTL_STRING, offsetof(struct model_row, error) },
	{ "waits_for_reload", CTL_STRING, offsetof(struct model_row, waits_for_reload) },
	{ "waiting_for_writer", CTL_STRING, offsetof(struct model_row, writer) },
	{ "waiting_for_writer_seconds", CTL_DOUBLE, offsetof(struct model_row, writer_seconds) },
	{ "generation", CTL_U64, offsetof(struct model_row, generation) },
	{ "bytes", CTL_U64, offsetof(struct model_row, bytes) },
	{ "resident_bytes", CTL_U64, offsetof(struct model_row, resident) },
	{ "attached", CTL_U64, offsetof(struct model_row, attached) },
	{ "warm_percent", CTL_DOUBLE, offsetof(struct model_row, warm_percent) },
	{ "warm_eta_seconds", CTL_DOUBLE, offsetof(struct model_row, warm_eta) },
};

static const struct ctl_field unloaded_fields[] = {
	{ "name", CTL_STRING, offsetof(struct unloaded_row, name) },
	{ "state", CTL_STRING, offsetof(struct unloaded_row, state) },
	{ "generation", CTL_U64, offsetof(struct unloaded_row, generation) },
	{ "attached", CTL_U64, offsetof(struct unloaded_row, attached) },
};

static const struct ctl_field memory_fields[] = {
	{ "limit", CTL_U64, offsetof(struct memory_row, limit) },
	{ "budget", CTL_U64, offsetof(struct memory_row, budget) },
	{ "models_bytes", CTL_U64, offsetof(struct memory_row, models) },
	{ "derived_bytes", CTL_U64, offsetof(struct memory_row, derived) },
	{ "derived_artifacts", CTL_U64, offsetof(struct memory_row, artifacts) },
	{ "derived_held", CTL_U64, offsetof(struct memory_row, held) },
	{ "limit_source", CTL_STRING, offsetof(struct memory_row, source) },
	{ "fits", CTL_BOOL, offsetof(struct memory_row, fits) },
};

static const struct ctl_field workq_fields[] = {
	{ "remote_running", CTL_U64, offsetof(struct workq_row, running) },
	{ "remote_waiting", CTL_U64, offsetof(struct workq_row, waiting) },
	{ "remote_stalled", CTL_U64, offsetof(struct workq_row, stalled) },
	{ "oldest_remote_seconds", CTL_DOUBLE, offsetof(struct workq_row, oldest) },
};

static const struct ctl_field status_fields[] = {
	{ "version", CTL_STRING, offsetof(struct status, version) },
	{ "pid", CTL_U64, offsetof(struct status, pid) },
	{ "clients", CTL_U64, offsetof(struct status, clients) },
	{ "uptime_seconds", CTL_DOUBLE, offsetof(struct status, uptime) },
};

/* Frees what status_parse() stored, also after it failed half-way. */
static void
status_free(struct status *s)
{
	for (size_t i = 0; i < s->nmodels; i++) {
		struct model_row *m = &s->models[i];

		for (size_t k = 0; k < m->ngens; k++)
			free(m->gens[k].state);
		free(m->gens);
		for (size_t k = 0; k < m->nderived; k++) {
			free(m->derived[k].key);
			free(m->derived[k].state);
			free(m->derived[k].format);
		}
		free(m->derived);
		free(m->name);
		free(m->state);
		free(m->pinned);
		free(m->pin_applied);
		free(m->pin_error);
		free(m->writer);
		free(m->error);
		free(m->waits_for_reload);
		free(m->path);
	}
	for (size_t i = 0; i < s->nunloaded; i++) {
		free(s->unloaded[i].name);
		free(s->unloaded[i].state);
	}
	free(s->models);
	free(s->unloaded);
	free(s->version);
	free(s->memory.source);
}

/* Grows *array (of *n elements of size) by one zeroed element. */
static void *
push(void *array_ptr, size_t *n, size_t size)
{
	void **array = array_ptr;
	char *bigger = realloc(*array, (*n + 1) * size);

	if (bigger == NULL)
		return NULL;
	*array = bigger;
	memset(bigger + *n * size, 0, size);
	return bigger + (*n)++ * size;
}

/*
 * Reads an array of objects at the cursor, appending one row (of size
 * bytes) to *array_ptr (of *n rows) per object and reading the object into
 * it with ctl_read_object(fields, other). Rows read before an error stay,
 * for status_free().
 */
static int
read_rows(struct jr *j, void *array_ptr, size_t *n, size_t size, const struct ctl_field *fields,
	size_t nfields, ctl_member_fn *other)
{
	int r;

	if ((r = jr_array_begin(j)) < 0)
		return r;
	while ((r = jr_array_next(j)) == 1) {
		void *row = push(array_ptr, n, size);

		if (row == NULL)
			return -ENOMEM;
		if ((r = ctl_read_object(j, fields, nfields, row, other)) < 0)
			return r;
	}
	return r;
}

/* A model's "generations" array; other members are skipped. */
static int
model_member(struct jr *j, const struct jr_str *key, void *dst)
{
	struct model_row *m = dst;

	if (jr_str_eq(key, "generations", 11) && jr_peek(j) == JR_ARRAY)
		return read_rows(j, &m->gens, &m->ngens, sizeof(*m->gens), gen_fields,
			NFIELDS(gen_fields), NULL);
	if (jr_str_eq(key, "derived", 7) && jr_peek(j) == JR_ARRAY)
		return read_rows(j, &m->derived, &m->nderived, sizeof(*m->derived),
			derived_fields, NFIELDS(derived_fields), NULL);
	return jr_skip(j);
}

/* The reply's "models" and "unloaded" arrays; other members are skipped. */
static int
status_member(struct jr *j, const struct jr_str *key, void *dst)
{
	struct status *s = dst;

	if (jr_str_eq(key, "models", 6) && jr_peek(j) == JR_ARRAY)
		return read_rows(j, &s->models, &s->nmodels, sizeof(*s->models), model_fields,
			NFIELDS(model_fields), model_member);
	if (jr_str_eq(key, "unloaded", 8) && jr_peek(j) == JR_ARRAY)
		return read_rows(j, &s->unloaded, &s->nunloaded, sizeof(*s->unloaded),
			unloaded_fields, NFIELDS(unloaded_fields), NULL);
	if (jr_str_eq(key, "memory", 6) && jr_peek(j) == JR_OBJECT) {
		s->memory.present = 1;
		return ctl_read_object(j, memory_fields, NFIELDS(memory_fields), &s->memory, NULL);
	}
	if (jr_str_eq(key, "work_queue", 10) && jr_peek(j) == JR_OBJECT)
		return ctl_read_object(j, workq_fields, NFIELDS(workq_fields), &s->workq, NULL);
	return jr_skip(j);
}

/* Parses a status reply; returns 0 or -1 (printed). */
static int
status_parse(const char *line, size_t len, struct status *s)
{
	memset(s, 0, sizeof(*s));
	if (ctl_parse_reply(line, len, status_fields, NFIELDS(status_fields), s,
		status_member) < 0) {
		status_free(s);
		return -1;
	}
	return 0;
}

/* ---- printing the table ------------------------------------------------ */

/* "1.5 GiB": binary units, one decimal. */
static const char *
human_bytes(uint64_t b, char *buf, size_t cap)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)b;
	size_t u = 0;

	if (b < 1024) {
		snprintf(buf, cap, "%" PRIu64 " B", b);
		return buf;
	}
	v /= 1024;
	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	snprintf(buf, cap, "%.1f %s", v, units[u]);
	return buf;
}

/* "3d 4h", "2h 5m", "5m 12s", "12s"; "?" for a number of seconds that no
 * uint64_t holds (the daemon's, as it sent it: 1e999 reads as infinity). */
static const char *
human_duration(double seconds, char *buf, size_t cap)
{
	uint64_t s;

	if (isnan(seconds) || seconds >= 0x1p64) {
		snprintf(buf, cap, "?");
		return buf;
	}
	s = seconds > 0 ? (uint64_t)seconds : 0;
	if (s >= 86400)
		snprintf(buf, cap, "%" PRIu64 "d %" PRIu64 "h", s / 86400, s % 86400 / 3600);
	else if (s >= 3600)
		snprintf(buf, cap, "%" PRIu64 "h %" PRIu64 "m", s / 3600, s % 3600 / 60);
	else if (s >= 60)
		snprintf(buf, cap, "%" PRIu64 "m %" PRIu64 "s", s / 60, s % 60);
	else
		snprintf(buf, cap, "%" PRIu64 "s", s);
	return buf;
}

#define STATUS_COLUMNS 7

/* qsort() order of the table: by model name. */
static int
by_name(const void *a, const void *b)
{
	const struct model_row *x = a, *y = b;

	return strcmp(x->name != NULL ? x->name : "", y->name != NULL ? y->name : "");
}

/* Is name one of names (or are there no names: everything is asked)? */
static bool
asked(const char *name, char *const *names, size_t nnames)
{
	if (nnames == 0)
		return true;
	for (size_t i = 0; i < nnames; i++)
		if (name != NULL && strcmp(name, names[i]) == 0)
			return true;
	return false;
}

/* Is the model served under name? */
static bool
served(const struct status *s, const char *name)
{
	for (size_t i = 0; i < s->nmodels; i++)
		if (s->models[i].name != NULL && strcmp(s->models[i].name, name) == 0)
			return true;
	return false;
}

/* Is the model's current generation ready? */
static bool
is_ready(const struct model_row *m)
{
	return m->state != NULL && strcmp(m->state, "ready") == 0;
}

/* The STATE cell: the state, with the percent warmed while warming and the
 * time left when the daemon estimates it (in buf). The percent is the
 * daemon's warm_percent (bytes its reads pulled in); a daemon without that
 * field gets bytes in the page cache over the size. */
static const char *
state_cell(const struct model_row *m, char *buf, size_t cap)
{
	double percent = m->warm_percent;

	if (m->state == NULL || strcmp(m->state, "warming") != 0)
		return m->state ? m->state : "?";
	if (percent <= 0 && m->bytes > 0)
		percent = m->resident >= m->bytes ? 100 :
			(double)m->resident * 100.0 / (double)m->bytes;
	if (m->warm_eta > 0)
		snprintf(buf, cap, "warming %.0f%%, ~%.0f s left", percent,
			m->warm_eta < 1 ? 1 : m->warm_eta);
	else
		snprintf(buf, cap, "warming %.0f%%", percent);
	return buf;
}

/* The PINNED cell: what is locked (pin_applied), which a daemon without
 * that field reports only as the configured mode. */
static const char *
pinned_cell(const struct model_row *m)
{
	if (m->pin_applied != NULL)
		return m->pin_applied;
	return m->pinned != NULL ? m->pinned : "?";
}

/* Ranks pin modes: none < metadata < all. */
static int
pin_rank(const char *mode)
{
	if (mode == NULL)
		return -1;
	if (strcmp(mode, "all") == 0)
		return 2;
	return strcmp(mode, "metadata") == 0 ? 1 : 0;
}

/* The derived artifacts of the models asked about, and builds in progress. */
static void
print_derived(const struct status *s, char *const *names, size_t nnames)
{
	bool first = true;
	char tmp[32];

	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		if (!asked(m->name, names, nnames))
			continue;
		for (size_t k = 0; k < m->nderived; k++) {
			const struct derived_row *d = &m->derived[k];
			bool building = d->state != NULL && strcmp(d->state, "building") == 0;
			bool checking = d->state != NULL && strcmp(d->state, "checking") == 0;

			if (first)
				printf("\nderived artifacts:\n");
			first = false;
			printf("  ");
			escape_print(stdout, m->name ? m->name : "?");
			printf(" ");
			escape_print(stdout, d->key ? d->key : "?");
			printf(" (generation %" PRIu64 "): ", d->source);
			if (building) {
				printf("building by pid %" PRIu64 " uid %" PRIu64 ", %" PRIu64
				       " waiting\n", d->builder_pid, d->builder_uid, d->waiting);
				continue;
			}
			if (checking) {
				printf("its publication by pid %" PRIu64 " uid %" PRIu64 "%s is "
				       "being checked, %" PRIu64 " waiting\n", d->builder_pid,
				       d->builder_uid, d->builder_connected ? "" :
				       " (which has disconnected)", d->waiting);
				continue;
			}
			printf("%s ", human_bytes(d->bytes, tmp, sizeof(tmp)));
			escape_print(stdout, d->format ? d->format : "?");
			printf(", %" PRIu64 " attached, %" PRIu64 " attaches, built in %.1f s "
			       "by pid %" PRIu64 " uid %" PRIu64 "%s\n", d->attached, d->attaches,
				d->build_seconds, d->builder_pid, d->builder_uid,
				d->withdrawn ? ", withdrawn: attached no more, goes when "
					       "released" : "");
		}
	}
}

/* "memory: 4.0 GiB in force (cgroup v2 memory.max of /x), budget 3.2 GiB,
 * models 40.1 MiB, derived 3.0 MiB (3 artifacts, 2 held)", and a warning
 * when the models and artifacts do not fit. */
static void
print_memory(const struct memory_row *m)
{
	char limit[32], budget[32], models[32], derived[32];

	if (!m->present)
		return;
	printf("memory: %s in force (", human_bytes(m->limit, limit, sizeof(limit)));
	escape_print(stdout, m->source != NULL ? m->source : "?");
	printf("), budget %s, models %s, derived ",
		m->budget != 0 ? human_bytes(m->budget, budget, sizeof(budget)) : "none",
		human_bytes(m->models, models, sizeof(models)));
	if (m->derived == 0 && m->artifacts == 0)
		printf("none\n");
	else
		printf("%s (%" PRIu64 " artifact%s, %" PRIu64 " held)\n",
			human_bytes(m->derived, derived, sizeof(derived)), m->artifacts,
			m->artifacts == 1 ? "" : "s", m->held);
	if (!m->fits)
		printf("warning: the models%s do not fit under the memory limit: the kernel "
		       "reclaims %s pages (README, \"Memory limits\")\n",
			m->derived != 0 ? " and derived artifacts" : "",
			m->derived != 0 ? "the models'" : "their");
}

/* A warning while work on a remote filesystem has stalled (a hung server). */
static void
print_workq(const struct workq_row *q)
{
	char tmp[32];

	if (q->stalled == 0)
		return;
	printf("warning: %" PRIu64 " job%s stalled on a remote filesystem for up to %s "
	       "(%" PRIu64 " more waiting); work on other filesystems goes on\n", q->stalled,
		q->stalled == 1 ? "" : "s", human_duration(q->oldest, tmp, sizeof(tmp)),
		q->waiting);
}

/* Prints, under title, one line for each model asked about whose string
 * at offset in its row is set: "  NAME: ", then before, then (when after
 * is not NULL) NAME again and after, then that string. */
static void
print_notes(const struct status *s, char *const *names, size_t nnames, const char *title,
	size_t offset, const char *before, const char *after)
{
	bool any = false;

	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];
		const char *text = *(char *const *)(const void *)((const char *)m + offset);
		const char *name = m->name ? m->name : "?";

		if (text == NULL || !asked(m->name, names, nnames))
			continue;
		if (!any)
			printf("\n%s\n", title);
		any = true;
		printf("  ");
		escape_print(stdout, name);
		printf(": %s", before);
		if (after != NULL) {
			escape_print(stdout, name);
			fputs(after, stdout);
		}
		escape_print(stdout, text);
		putchar('\n');
	}
}

/* The models whose update waits for a writer: the file open for writing
 * (a watched reload found it so), and for how long. */
static void
print_writers(const struct status *s, char *const *names, size_t nnames)
{
	bool any = false;
	char tmp[32];

	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		if (m->writer == NULL || !asked(m->name, names, nnames))
			continue;
		if (!any)
			printf("\nupdates waiting for a writer:\n");
		any = true;
		printf("  ");
		escape_print(stdout, m->name ? m->name : "?");
		printf(": ");
		escape_print(stdout, m->writer);
		printf(" is open for writing (for %s): loaded once no descriptor open for "
		       "writing on it is left\n",
			human_duration(m->writer_seconds, tmp, sizeof(tmp)));
	}
}

/* Prints the status reply as a table: one row per model asked about, then
 * the other open generations, generations of unloaded models, pins that
 * fall short and errors. */
static void
print_status(struct status *s, char *const *names, size_t nnames)
{
	static const char *const head[STATUS_COLUMNS] = {
		"NAME", "GEN", "STATE", "BYTES", "RESIDENT", "PINNED", "ATTACHED",
	};
	size_t width[STATUS_COLUMNS];
	const char *cell[STATUS_COLUMNS];
	char gen[24], state[64], bytes[32], resident[32], attached[24], tmp[32];
	bool others = false, notes = false, any = false;

	fputs("wcached ", stdout);
	escape_print(stdout, s->version != NULL ? s->version : "?");
	printf(" (pid %" PRIu64 "), up %s, %" PRIu64 " client%s, %zu model%s\n", s->pid,
		human_duration(s->uptime, tmp, sizeof(tmp)), s->clients, s->clients == 1 ? "" : "s",
		s->nmodels, s->nmodels == 1 ? "" : "s");
	print_memory(&s->memory);
	print_workq(&s->workq);
	for (size_t i = 0; i < s->nmodels; i++)
		any = any || asked(s->models[i].name, names, nnames);
	for (size_t i = 0; i < s->nunloaded; i++)
		any = any || asked(s->unloaded[i].name, names, nnames);
	if (!any)
		return;
	if (s->nmodels > 1)
		qsort(s->models, s->nmodels, sizeof(*s->models), by_name);
	for (int c = 0; c < STATUS_COLUMNS; c++)
		width[c] = strlen(head[c]);
	/* Two passes: measure, then print, each cell escaped and as wide as
	 * its escaped text (escape_width()). */
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			putchar('\n');
			for (int c = 0; c < STATUS_COLUMNS; c++)
				printf("%-*s%s", c + 1 < STATUS_COLUMNS ? (int)width[c] : 0,
					head[c], c + 1 < STATUS_COLUMNS ? "  " : "\n");
		}
		for (size_t i = 0; i < s->nmodels; i++) {
			const struct model_row *m = &s->models[i];

			if (!asked(m->name, names, nnames))
				continue;
			snprintf(gen, sizeof(gen), "%" PRIu64, m->generation);
			cell[0] = m->name ? m->name : "?";
			cell[1] = m->generation > 0 ? gen : "-";
			cell[2] = state_cell(m, state, sizeof(state));
			cell[3] = human_bytes(m->bytes, bytes, sizeof(bytes));
			cell[4] = human_bytes(m->resident, resident, sizeof(resident));
			cell[5] = pinned_cell(m);
			snprintf(attached, sizeof(attached), "%" PRIu64, m->attached);
			cell[6] = attached;
			for (int c = 0; c < STATUS_COLUMNS; c++) {
				size_t shown = escape_width(cell[c]);

				if (pass == 0) {
					if (shown > width[c])
						width[c] = shown;
					continue;
				}
				escape_print(stdout, cell[c]);
				if (c + 1 < STATUS_COLUMNS)
					printf("%*s", (int)(width[c] - shown + 2), "");
			}
			if (pass == 1)
				putchar('\n');
		}
	}
	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		if (!asked(m->name, names, nnames))
			continue;
		for (size_t k = 0; k < m->ngens; k++) {
			const struct gen_row *g = &m->gens[k];

			if (g->current)
				continue;
			if (!others)
				printf("\nother open generations:\n");
			others = true;
			printf("  ");
			escape_print(stdout, m->name ? m->name : "?");
			printf(" generation %" PRIu64 ": ", g->number);
			escape_print(stdout, g->state ? g->state : "?");
			printf(", %" PRIu64 " attached, %s%s\n", g->attached,
				human_bytes(g->bytes, tmp, sizeof(tmp)),
				g->pending ? " (pending: becomes current when warm)" :
					     " (old: closes when released)");
		}
	}
	for (size_t i = 0; i < s->nunloaded; i++) {
		const struct unloaded_row *u = &s->unloaded[i];

		if (!asked(u->name, names, nnames))
			continue;
		if (!others)
			printf("\nother open generations:\n");
		others = true;
		printf("  ");
		escape_print(stdout, u->name ? u->name : "?");
		printf(" generation %" PRIu64 ": ", u->generation);
		escape_print(stdout, u->state ? u->state : "?");
		printf(", %" PRIu64 " attached (unloaded: closes when released)\n", u->attached);
	}
	print_derived(s, names, nnames);
	/* A pin that locked less than asked: still locking, or refused (and
	 * then the daemon says why). */
	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		if (!asked(m->name, names, nnames) || m->pin_applied == NULL ||
			m->generation == 0 ||
			(m->pin_error == NULL && pin_rank(m->pin_applied) >= pin_rank(m->pinned)))
			continue;
		if (!notes)
			printf("\npins:\n");
		notes = true;
		printf("  ");
		escape_print(stdout, m->name ? m->name : "?");
		printf(": pin = ");
		escape_print(stdout, m->pinned ? m->pinned : "?");
		printf(" asked, ");
		escape_print(stdout, m->pin_applied);
		printf(" locked: ");
		if (m->pin_error != NULL)
			escape_print(stdout, m->pin_error);
		else
			printf("still locking, or mlock(2) was refused (RLIMIT_MEMLOCK, "
			       "LimitMEMLOCK= in wcached.service; wcached's log says)");
		putchar('\n');
	}
	print_writers(s, names, nnames);
	print_notes(s, names, nnames, "errors:", offsetof(struct model_row, error), "", NULL);
	/* Files that wait for the operator's reload, and why (a config reload
	 * that leaves their sections unchanged does not load them). */
	print_notes(s, names, nnames, "waiting for the operator's reload:",
		offsetof(struct model_row, waits_for_reload),
		"the files at its path are served only after `wcachectl reload ",
		"` (a config reload that leaves its section unchanged does not load them): ");
}

/* Writes a JSON array of the names for which keep(s, name) holds. */
static void
write_names(const char *key, char *const *names, size_t n, const struct status *s,
	bool (*keep)(const struct status *, const char *))
{
	bool first = true;

	printf(",\"%s\":[", key);
	for (size_t i = 0; i < n; i++) {
		if (!keep(s, names[i]))
			continue;
		if (!first)
			putchar(',');
		first = false;
		ctl_json_string(stdout, names[i], strlen(names[i]));
	}
	putchar(']');
}

/* write_names()'s test for "unknown": a name that is not served. */
static bool
unknown_name(const struct status *s, const char *name)
{
	return !served(s, name);
}

/*
 * --json: the daemon's reply (an object: its last byte is '}') with
 * "ready" (every model asked about is), "not_ready" and "unknown" added.
 */
static void
print_json(const char *line, size_t len, const struct status *s, char *const *names,
	size_t nnames, bool ready)
{
	bool first = true;

	while (len > 0 && line[len - 1] != '}')
		len--;
	ctl_json_text(stdout, line, len > 0 ? len - 1 : 0);
	printf(",\"ready\":%s,\"not_ready\":[", ready ? "true" : "false");
	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		if (!asked(m->name, names, nnames) || is_ready(m) || m->name == NULL)
			continue;
		if (!first)
			putchar(',');
		first = false;
		ctl_json_string(stdout, m->name, strlen(m->name));
	}
	putchar(']');
	write_names("unknown", names, nnames, s, unknown_name);
	printf("}\n");
}

/* Shows a status reply and says whether what was asked about is ready
 * (see ctl_internal.h). */
int
ctl_status_show(const char *line, size_t len, char *const *names, size_t nnames, int json)
{
	struct status s;
	bool ready = true, unknown = false;

	if (status_parse(line, len, &s) < 0) {
		if (json)
			ctl_json_error();
		return CTL_EXIT_FAILURE;
	}
	for (size_t i = 0; i < s.nmodels; i++)
		if (asked(s.models[i].name, names, nnames) && !is_ready(&s.models[i]))
			ready = false;
	for (size_t i = 0; i < nnames; i++)
		if (!served(&s, names[i])) {
			unknown = true;
			ready = false;
			ctl_error("no model \"%s\" is served", names[i]);
		}
	if (json)
		print_json(line, len, &s, names, nnames, ready);
	else
		print_status(&s, names, nnames);
	status_free(&s);
	if (unknown)
		return CTL_EXIT_UNKNOWN;
	return ready ? CTL_EXIT_OK : CTL_EXIT_NOT_READY;
}
