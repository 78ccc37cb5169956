/*
 * ctl_status.c: how `wcachectl status` shows wcached's status reply: the
 * reply's models, their generations and the generations of unloaded models
 * read into rows, then printed as a table with sizes and the uptime in
 * human units, followed by the generations that are not current and each
 * model's last load error.
 *
 * ctl_control.c sends the request, reads the reply and checks its common
 * fields; it hands a successful status reply to ctl_status_print() unless
 * --json asked for the reply as it came. Every string from the daemon is
 * printed with ctl_print_safe(), so a hostile model name cannot drive the
 * terminal.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_internal.h"
#include "json.h"

/* ---- reading the reply -------------------------------------------------- */

/* One generation of a model, from its "generations" array. */
struct gen_row {
	uint64_t number, attached, bytes;
	char *state;
	int current, pending;
};

/* One entry of "models": a served model and its current generation. */
struct model_row {
	char *name, *state, *pinned, *error, *path;
	uint64_t generation, bytes, resident, attached;
	double warm_percent, warm_eta; /* eta 0 when absent (null: no estimate yet) */
	struct gen_row *gens;
	size_t ngens;
};

/* One entry of "unloaded": a generation of a model no longer served that
 * clients still hold. */
struct unloaded_row {
	char *name, *state;
	uint64_t generation, attached;
};

/* The status reply; strings are malloc'd, NULL when absent. */
struct status {
	char *version;
	uint64_t pid, clients;
	double uptime;
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

static const struct ctl_field model_fields[] = {
	{ "name", CTL_STRING, offsetof(struct model_row, name) },
	{ "path", CTL_STRING, offsetof(struct model_row, path) },
	{ "state", CTL_STRING, offsetof(struct model_row, state) },
	{ "pinned", CTL_STRING, offsetof(struct model_row, pinned) },
	{ "error", CTL_STRING, offsetof(struct model_row, error) },
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
		free(m->name);
		free(m->state);
		free(m->pinned);
		free(m->error);
		free(m->path);
	}
	for (size_t i = 0; i < s->nunloaded; i++) {
		free(s->unloaded[i].name);
		free(s->unloaded[i].state);
	}
	free(s->models);
	free(s->unloaded);
	free(s->version);
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

/* "3d 4h", "2h 5m", "5m 12s", "12s". */
static const char *
human_duration(double seconds, char *buf, size_t cap)
{
	uint64_t s = seconds > 0 ? (uint64_t)seconds : 0;

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

/* Prints the status reply as a table: one row per model, then the other
 * open generations, generations of unloaded models, and errors. */
static void
print_status(struct status *s)
{
	static const char *const head[STATUS_COLUMNS] = {
		"NAME", "GEN", "STATE", "BYTES", "RESIDENT", "PINNED", "ATTACHED",
	};
	size_t width[STATUS_COLUMNS];
	char cell[STATUS_COLUMNS][64], tmp[32];
	bool others = false, errors = false;

	printf("wcached %s (pid %" PRIu64 "), up %s, %" PRIu64 " client%s, %zu model%s\n",
		s->version != NULL ? s->version : "?", s->pid,
		human_duration(s->uptime, tmp, sizeof(tmp)), s->clients, s->clients == 1 ? "" : "s",
		s->nmodels, s->nmodels == 1 ? "" : "s");
	if (s->nmodels == 0 && s->nunloaded == 0)
		return;
	if (s->nmodels > 1)
		qsort(s->models, s->nmodels, sizeof(*s->models), by_name);
	for (int c = 0; c < STATUS_COLUMNS; c++)
		width[c] = strlen(head[c]);
	/* Two passes: measure, then print. Names are at most 128 bytes (the
	 * daemon's rule), wider ones are not truncated, only misaligned. */
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			putchar('\n');
			for (int c = 0; c < STATUS_COLUMNS; c++)
				printf("%-*s%s", c + 1 < STATUS_COLUMNS ? (int)width[c] : 0, head[c],
					c + 1 < STATUS_COLUMNS ? "  " : "\n");
		}
		for (size_t i = 0; i < s->nmodels; i++) {
			const struct model_row *m = &s->models[i];

			snprintf(cell[0], sizeof(cell[0]), "%s", m->name ? m->name : "?");
			if (m->generation > 0)
				snprintf(cell[1], sizeof(cell[1]), "%" PRIu64, m->generation);
			else
				snprintf(cell[1], sizeof(cell[1]), "-");
			if (m->state != NULL && strcmp(m->state, "warming") == 0 && m->warm_eta > 0)
				snprintf(cell[2], sizeof(cell[2]), "warming %.0f%%, ~%.0f s left",
					m->warm_percent, m->warm_eta < 1 ? 1 : m->warm_eta);
			else if (m->state != NULL && strcmp(m->state, "warming") == 0)
				snprintf(cell[2], sizeof(cell[2]), "warming %.0f%%", m->warm_percent);
			else
				snprintf(cell[2], sizeof(cell[2]), "%s", m->state ? m->state : "?");
			human_bytes(m->bytes, cell[3], sizeof(cell[3]));
			human_bytes(m->resident, cell[4], sizeof(cell[4]));
			snprintf(cell[5], sizeof(cell[5]), "%s", m->pinned ? m->pinned : "?");
			snprintf(cell[6], sizeof(cell[6]), "%" PRIu64, m->attached);
			for (int c = 0; c < STATUS_COLUMNS; c++) {
				if (pass == 0) {
					if (strlen(cell[c]) > width[c])
						width[c] = strlen(cell[c]);
					continue;
				}
				if (c == 0)
					ctl_print_safe(stdout, m->name ? m->name : "?");
				else
					fputs(cell[c], stdout);
				if (c + 1 < STATUS_COLUMNS)
					printf("%*s", (int)(width[c] - strlen(cell[c]) + 2), "");
			}
			if (pass == 1)
				putchar('\n');
		}
	}
	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		for (size_t k = 0; k < m->ngens; k++) {
			const struct gen_row *g = &m->gens[k];

			if (g->current)
				continue;
			if (!others)
				printf("\nother open generations:\n");
			others = true;
			printf("  ");
			ctl_print_safe(stdout, m->name ? m->name : "?");
			printf(" generation %" PRIu64 ": %s, %" PRIu64 " attached, %s%s\n", g->number,
				g->state ? g->state : "?", g->attached,
				human_bytes(g->bytes, tmp, sizeof(tmp)),
				g->pending ? " (pending: becomes current when warm)" :
					     " (old: closes when released)");
		}
	}
	for (size_t i = 0; i < s->nunloaded; i++) {
		const struct unloaded_row *u = &s->unloaded[i];

		if (!others)
			printf("\nother open generations:\n");
		others = true;
		printf("  ");
		ctl_print_safe(stdout, u->name ? u->name : "?");
		printf(" generation %" PRIu64 ": %s, %" PRIu64 " attached (unloaded: closes when "
		       "released)\n", u->generation, u->state ? u->state : "?", u->attached);
	}
	for (size_t i = 0; i < s->nmodels; i++) {
		const struct model_row *m = &s->models[i];

		if (m->error == NULL)
			continue;
		if (!errors)
			printf("\nerrors:\n");
		errors = true;
		printf("  ");
		ctl_print_safe(stdout, m->name ? m->name : "?");
		printf(": ");
		ctl_print_safe(stdout, m->error);
		putchar('\n');
	}
}

/* Parses a status reply and prints it as a table (see the top of this
 * file). Returns 0, or -1 after printing why the reply is malformed. */
int
ctl_status_print(const char *line, size_t len)
{
	struct status s;

	if (status_parse(line, len, &s) < 0)
		return -1;
	print_status(&s);
	status_free(&s);
	return 0;
}
