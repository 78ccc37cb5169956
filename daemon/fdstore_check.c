/*
 * fdstore_check.c: the rules a description of the file descriptor store
 * obeys beyond the limits of each field (fdstore_check(), see fdstore.h):
 * valid and unique names, unique model names and slots, generation numbers
 * and roles that make sense for their model, holders' uids that add up to
 * the holders, files whose ctimes are 0 when
 * their nlink says they are not recorded, derived artifacts of a
 * described generation named after their model's slot, what a path named
 * and a tree's kept files in range (kept files only where its model
 * describes no generation), and a bound on the descriptors (and
 * the kept files) in all.
 *
 * The rules are one file, apart from the encoding, because both directions
 * hold to the same ones: fdstore_encode() refuses a description that breaks
 * them, and fdstore_decode() runs them on what it parsed, so nothing the
 * decoder returns breaks a rule and decode(encode(x)) is x for every x the
 * encoder takes. The registry's tests also run them on what the daemon
 * would store.
 */
#include "fdstore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "proto/wire.h"
#include "notify.h"

#define STATUS_MIN 16u
#define STATUS_MAX (1u << 20)

_Static_assert(FDSTORE_MAX_FDNAME == NOTIFY_MAX_FDNAME, "one limit for FDNAME=");

/* Whether a string field is 1 .. max bytes without NUL (and, for fdnames,
 * valid): the message names the field. */
static int
check_string(const char *s, size_t max, int fdname, const char *where, const char *field)
{
	size_t len;

	if (s == NULL)
		return error_set(-EINVAL, "fdstore: %s: %s: missing", where, field);
	len = strnlen(s, max + 1);
	if (len == 0 || len > max)
		return error_set(-EINVAL, "fdstore: %s: %s: %zu bytes, not 1 to %zu", where,
			field, len, max);
	if (fdname && !notify_fdname_valid(s, len))
		return error_set(-EINVAL, "fdstore: %s: %s \"%s\": not a valid FDNAME (printable "
			"ASCII, no ':')", where, field, s);
	if (fdname && (strcmp(s, FDSTORE_NAME_STATUS) == 0 || strcmp(s, FDSTORE_NAME_DESC) == 0))
		return error_set(-EINVAL, "fdstore: %s: %s \"%s\": reserved name", where, field, s);
	return 0;
}

/* A tree's kept files (version 10): at most FDSTORE_MAX_KEPT, and what
 * its path named (enum fdstore_named) recorded only with them. */
static int
check_kept(const struct fdstore_tree *t, const char *where)
{
	if (t->nkept > FDSTORE_MAX_KEPT || (t->nkept > 0 && t->kept == NULL))
		return error_set(-EINVAL, "fdstore: %s: tree kept file count: %" PRIu32 ", more "
			"than %u", where, t->nkept, FDSTORE_MAX_KEPT);
	if (t->named > FDSTORE_MAX_NAMED)
		return error_set(-EINVAL, "fdstore: %s: tree path named: %u is not 0 to %u",
			where, (unsigned)t->named, (unsigned)FDSTORE_MAX_NAMED);
	if (t->named != FDSTORE_NAMED_UNRECORDED && t->nkept == 0)
		return error_set(-EINVAL, "fdstore: %s: tree path named: %u with no kept file "
			"(recorded only with them)", where, (unsigned)t->named);
	return 0;
}

/* A model's tree (fdstore.h's fdstore_tree): none (root NULL, all else 0),
 * or an absolute root of its owner, its inode recorded (root_known 1) or
 * 0 and 0, and no place (mode and length 0) or an absolute place whose
 * directory is its first place_dir_len bytes (at most all of them), of
 * mode 07777 at most; its kept files check_kept's. */
static int
check_tree(const struct fdstore_tree *t, const char *where)
{
	size_t len;
	int r;

	if (t->root == NULL) {
		if (t->uid != 0 || t->root_known != 0 || t->root_dev != 0 || t->root_ino != 0 ||
			t->place != NULL || t->place_mode != 0 || t->place_dir_len != 0 ||
			t->named != 0 || t->nkept != 0 || t->kept != NULL)
			return error_set(-EINVAL, "fdstore: %s: tree: no root, but its other "
				"fields are not 0", where);
		return 0;
	}
	if ((r = check_string(t->root, FDSTORE_MAX_PATH, 0, where, "tree root")) < 0 ||
		(r = check_kept(t, where)) < 0)
		return r;
	if (t->root[0] != '/')
		return error_set(-EINVAL, "fdstore: %s: tree root: not absolute", where);
	if (t->root_known > 1 || (!t->root_known && (t->root_dev != 0 || t->root_ino != 0)))
		return error_set(-EINVAL, "fdstore: %s: tree root known: %u, with device %"
			PRIu64 " and inode %" PRIu64 " (1, or 0 with both 0)", where,
			(unsigned)t->root_known, t->root_dev, t->root_ino);
	if (t->place == NULL) {
		if (t->place_mode != 0 || t->place_dir_len != 0)
			return error_set(-EINVAL, "fdstore: %s: tree: no place, but its mode or "
				"directory length is not 0", where);
		return 0;
	}
	if ((r = check_string(t->place, FDSTORE_MAX_PATH, 0, where, "tree place")) < 0)
		return r;
	len = strlen(t->place);
	if (t->place[0] != '/')
		return error_set(-EINVAL, "fdstore: %s: tree place: not absolute", where);
	if (t->place_dir_len > len)
		return error_set(-EINVAL, "fdstore: %s: tree place directory length: %" PRIu32
			", more than its place's %zu bytes", where, t->place_dir_len, len);
	if (t->place_mode > 07777)
		return error_set(-EINVAL, "fdstore: %s: tree place mode: %#" PRIo32 ", more than "
			"07777", where, t->place_mode);
	return 0;
}

static int
compare_strings(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts n strings and reports the first one that appears twice. */
static int
check_unique(const char **v, size_t n, const char *what)
{
	if (n < 2)
		return 0; /* and v may be NULL: qsort() must not see it */
	qsort(v, n, sizeof(*v), compare_strings);
	for (size_t i = 1; i < n; i++)
		if (strcmp(v[i - 1], v[i]) == 0)
			return error_set(-EINVAL, "fdstore: %s \"%.255s\" appears twice", what,
				v[i]);
	return 0;
}

/* A generation's holders by uid (version 6), when recorded: uids
 * ascending, so each appears once and the check is linear in them, each
 * count 1 or more, and the counts summing to the holders, so that a
 * restarted daemon accepts exactly holders HOLDs, each from a uid that
 * held it. */
static int
check_holder_uids(const struct fdstore_generation *g, const char *where)
{
	uint64_t sum = 0;

	if (g->nuids > FDSTORE_MAX_HOLDER_UIDS || (g->nuids > 0 && g->uids == NULL))
		return error_set(-EINVAL, "fdstore: %s: holder uid count: %" PRIu32 ", more than "
			"%u", where, g->nuids, FDSTORE_MAX_HOLDER_UIDS);
	for (uint32_t u = 0; u < g->nuids; u++) {
		const struct fdstore_holder *h = &g->uids[u];

		if (h->count == 0)
			return error_set(-EINVAL, "fdstore: %s: holder uid %" PRIu32 ": count 0, "
				"not 1 or more", where, h->uid);
		if (u > 0 && h->uid <= g->uids[u - 1].uid)
			return error_set(-EINVAL, "fdstore: %s: holder uid %" PRIu32 ": %s uid %"
				PRIu32 " (each uid once, ascending)", where, h->uid,
				h->uid == g->uids[u - 1].uid ? "appears twice, after" : "after",
				g->uids[u - 1].uid);
		sum += h->count;
	}
	if (g->nuids > 0 && sum != g->holders)
		return error_set(-EINVAL, "fdstore: %s: holder uids: their counts sum to %" PRIu64
			", not its %" PRIu32 " holders", where, sum, g->holders);
	return 0;
}

static int
check_generation(const struct fdstore_model *m, uint32_t gi, const char *mwhere, size_t *nfds)
{
	const struct fdstore_generation *g = &m->generations[gi];
	char where[1400], fwhere[1500];
	int r;

	snprintf(where, sizeof(where), "%s: generation %" PRIu32 " (%" PRIu64 ")", mwhere, gi,
		g->number);
	if (g->number == 0 || g->number > m->last_generation)
		return error_set(-EINVAL, "fdstore: %s: number: not 1 to the last generation %"
			PRIu64, where, m->last_generation);
	if (g->role < FDSTORE_CURRENT || g->role > FDSTORE_HELD)
		return error_set(-EINVAL, "fdstore: %s: role: %u is not current (1), pending (2) "
			"or held (3)", where, g->role);
	if (g->pin > FDSTORE_MAX_PIN)
		return error_set(-EINVAL, "fdstore: %s: pin: %u is not 0 to %u", where, g->pin,
			(unsigned)FDSTORE_MAX_PIN);
	if ((r = check_holder_uids(g, where)) < 0)
		return r;
	if (g->named > FDSTORE_MAX_NAMED)
		return error_set(-EINVAL, "fdstore: %s: path named: %u is not 0 to %u", where,
			(unsigned)g->named, (unsigned)FDSTORE_MAX_NAMED);
	if ((r = check_string(g->index_fdname, FDSTORE_MAX_FDNAME, 1, where, "index fdname")) < 0)
		return r;
	if (g->index_size == 0 || g->index_size > UINT32_MAX)
		return error_set(-EINVAL, "fdstore: %s: index size: %" PRIu64 " bytes, not 1 to %"
			PRIu32, where, g->index_size, UINT32_MAX);
	if (g->nfiles == 0 || g->nfiles > FDSTORE_MAX_FILES || g->files == NULL)
		return error_set(-EINVAL, "fdstore: %s: file count: %" PRIu32 ", not 1 to %u",
			where, g->nfiles, FDSTORE_MAX_FILES);
	for (uint32_t k = 0; k < g->nfiles; k++) {
		const struct fdstore_file *f = &g->files[k];

		snprintf(fwhere, sizeof(fwhere), "%s: file %" PRIu32, where, k);
		if ((r = check_string(f->fdname, FDSTORE_MAX_FDNAME, 1, fwhere, "fdname")) < 0)
			return r;
		/* nlink 0 says the ctimes are not recorded: they are 0, so that
		 * no reader can take one for a recorded ctime. */
		if (f->nlink == 0 && (f->ctime_ns != 0 || f->origin_ctime_ns != 0))
			return error_set(-EINVAL, "fdstore: %s: %s: %" PRId64 " with st_nlink 0, "
				"which says the ctimes are not recorded: not 0", fwhere,
				f->ctime_ns != 0 ? "st_ctim" : "origin st_ctim",
				f->ctime_ns != 0 ? f->ctime_ns : f->origin_ctime_ns);
	}
	*nfds += 1 + g->nfiles;
	return 0;
}

/* Is name fdname of kind for artifact number *n of slot (*n 0: any, and
 * then set)? */
static int
artifact_name(const char *fdname, enum fdstore_name_kind kind, uint64_t slot, uint64_t *n)
{
	struct fdstore_name parsed;

	if (fdstore_name_parse(fdname, &parsed) < 0 || parsed.kind != kind ||
		parsed.slot != slot || (*n != 0 && parsed.artifact != *n))
		return 0;
	*n = parsed.artifact;
	return 1;
}

static int
check_artifact(const struct fdstore_model *m, uint32_t ai, const char *mwhere, size_t *nfds)
{
	const struct fdstore_artifact *a = &m->artifacts[ai];
	char where[1400];
	uint64_t n = 0;
	int r, described = 0;

	snprintf(where, sizeof(where), "%s: artifact %" PRIu32, mwhere, ai);
	if ((r = check_string(a->key, FDSTORE_MAX_KEY, 0, where, "key")) < 0)
		return r;
	if (!wire_key_valid(a->key, strlen(a->key)))
		return error_set(-EINVAL, "fdstore: %s: key \"%s\": not a derived artifact key "
			"([A-Za-z0-9._+-])", where, a->key);
	snprintf(where, sizeof(where), "%s: artifact %" PRIu32 " (\"%s\" of generation %" PRIu64
		")", mwhere, ai, a->key, a->source);
	for (uint32_t g = 0; g < m->ngenerations; g++)
		described += m->generations[g].number == a->source;
	if (!described)
		return error_set(-EINVAL, "fdstore: %s: source: generation %" PRIu64 " is not "
			"described for the model", where, a->source);
	for (uint32_t b = 0; b < ai; b++)
		if (m->artifacts[b].source == a->source && strcmp(m->artifacts[b].key, a->key) == 0)
			return error_set(-EINVAL, "fdstore: %s: appears twice", where);
	if ((r = check_string(a->fdname, FDSTORE_MAX_FDNAME, 1, where, "fdname")) < 0 ||
		(r = check_string(a->index_fdname, FDSTORE_MAX_FDNAME, 1, where,
			 "index fdname")) < 0)
		return r;
	if (!artifact_name(a->fdname, FDSTORE_NAME_KIND_ARTIFACT, m->slot, &n))
		return error_set(-EINVAL, "fdstore: %s: fdname \"%s\": not wc-%" PRIu64 "-d<n>-a",
			where, a->fdname, m->slot);
	if (!artifact_name(a->index_fdname, FDSTORE_NAME_KIND_ARTIFACT_INDEX, m->slot, &n))
		return error_set(-EINVAL, "fdstore: %s: index fdname \"%s\": not wc-%" PRIu64
			"-d%" PRIu64 "-i", where, a->index_fdname, m->slot, n);
	if (a->size == 0 || a->size > INT64_MAX)
		return error_set(-EINVAL, "fdstore: %s: size: %" PRIu64 " bytes, not 1 to 2^63 - 1",
			where, a->size);
	if (a->index_size == 0 || a->index_size > UINT32_MAX)
		return error_set(-EINVAL, "fdstore: %s: index size: %" PRIu64 " bytes, not 1 to %"
			PRIu32, where, a->index_size, UINT32_MAX);
	if (a->builder_pid == 0 || a->builder_pid > INT32_MAX)
		return error_set(-EINVAL, "fdstore: %s: builder pid: %" PRIu32 " is not 1 to %"
			PRId32, where, a->builder_pid, INT32_MAX);
	if (a->builder_ngroups > FDSTORE_MAX_BUILDER_GROUPS ||
		(a->builder_ngroups > 0 && a->builder_groups == NULL))
		return error_set(-EINVAL, "fdstore: %s: builder group count: %" PRIu32 ", more "
			"than %u", where, a->builder_ngroups, FDSTORE_MAX_BUILDER_GROUPS);
	if (a->builder_gid == FDSTORE_GID_UNRECORDED && a->builder_ngroups > 0)
		return error_set(-EINVAL, "fdstore: %s: builder gid: %" PRIu32 " (not recorded) "
			"with %" PRIu32 " groups", where, a->builder_gid, a->builder_ngroups);
	*nfds += 2;
	return 0;
}

int
fdstore_check(const struct fdstore_desc *d)
{
	const char **names = NULL, **fdnames = NULL;
	size_t nfds = 0, nn = 0, nkept = 0;
	char where[1200];
	int r = 0;

	if (d->status_size < STATUS_MIN || d->status_size > STATUS_MAX || d->status_size % 8 != 0)
		return error_set(-EINVAL, "fdstore: status size: %" PRIu64 " bytes, not a multiple "
			"of 8 from %u to %u", d->status_size, STATUS_MIN, STATUS_MAX);
	if (d->nmodels > FDSTORE_MAX_MODELS || (d->nmodels > 0 && d->models == NULL))
		return error_set(-EINVAL, "fdstore: model count: %" PRIu32 ", more than %u",
			d->nmodels, FDSTORE_MAX_MODELS);
	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_model *m = &d->models[i];
		int current = 0, pending = 0;

		snprintf(where, sizeof(where), "model %" PRIu32 " (\"%.1024s\")", i,
			m->name != NULL ? m->name : "");
		if ((r = check_string(m->name, FDSTORE_MAX_MODEL_NAME, 0, where, "name")) < 0 ||
			(r = check_string(m->path, FDSTORE_MAX_PATH, 0, where, "path")) < 0 ||
			(m->waits != NULL && (r = check_string(m->waits, FDSTORE_MAX_WAIT_LINE, 0,
						      where, "wait line")) < 0) ||
			(r = check_tree(&m->tree, where)) < 0)
			return r;
		if (m->path[0] != '/')
			return error_set(-EINVAL, "fdstore: %s: path: not absolute", where);
		if ((nkept += m->tree.nkept) > FDSTORE_MAX_KEPT_ALL)
			return error_set(-EINVAL, "fdstore: %s: tree kept files: more than %u in "
				"all", where, FDSTORE_MAX_KEPT_ALL);
		/* A described generation tells its own files (restore_tell_files):
		 * a tree's are recorded only where none is (review rev217 L2). */
		if (m->tree.nkept > 0 && m->ngenerations > 0)
			return error_set(-EINVAL, "fdstore: %s: tree kept files: %" PRIu32 " with "
				"%" PRIu32 " generation%s described (recorded only where none is)",
				where, m->tree.nkept, m->ngenerations,
				m->ngenerations == 1 ? "" : "s");
		if (m->slot == 0 || m->slot >= d->status_size / 8)
			return error_set(-EINVAL, "fdstore: %s: slot: %" PRIu64 " is not 1 to %"
				PRIu64, where, m->slot, d->status_size / 8 - 1);
		for (uint32_t j = 0; j < i; j++)
			if (d->models[j].slot == m->slot)
				return error_set(-EINVAL, "fdstore: %s: slot: %" PRIu64 " is model "
					"%" PRIu32 "'s too", where, m->slot, j);
		if (m->ngenerations > FDSTORE_MAX_GENERATIONS ||
			(m->ngenerations > 0 && m->generations == NULL))
			return error_set(-EINVAL, "fdstore: %s: generation count: %" PRIu32
				", more than %u", where, m->ngenerations, FDSTORE_MAX_GENERATIONS);
		for (uint32_t g = 0; g < m->ngenerations; g++) {
			if ((r = check_generation(m, g, where, &nfds)) < 0)
				return r;
			current += m->generations[g].role == FDSTORE_CURRENT;
			pending += m->generations[g].role == FDSTORE_PENDING;
			for (uint32_t h = 0; h < g; h++)
				if (m->generations[h].number == m->generations[g].number)
					return error_set(-EINVAL, "fdstore: %s: generation %" PRIu64
						" appears twice", where, m->generations[g].number);
		}
		if (current > 1 || pending > 1)
			return error_set(-EINVAL, "fdstore: %s: %d current and %d pending "
				"generations (at most one each)", where, current, pending);
		if (m->nartifacts > FDSTORE_MAX_ARTIFACTS ||
			(m->nartifacts > 0 && m->artifacts == NULL))
			return error_set(-EINVAL, "fdstore: %s: artifact count: %" PRIu32 ", more "
				"than %u", where, m->nartifacts, FDSTORE_MAX_ARTIFACTS);
		for (uint32_t a = 0; a < m->nartifacts; a++)
			if ((r = check_artifact(m, a, where, &nfds)) < 0)
				return r;
		if (nfds > FDSTORE_MAX_FDS)
			return error_set(-EINVAL, "fdstore: %s: more than %u descriptors in all",
				where, FDSTORE_MAX_FDS);
	}
	/* Unique over the description: model names, and every fdname. */
	if ((names = calloc((size_t)d->nmodels + 1, sizeof(*names))) == NULL ||
		(fdnames = calloc(nfds + 1, sizeof(*fdnames))) == NULL) {
		free(names);
		return error_set(-ENOMEM, "fdstore: out of memory");
	}
	for (uint32_t i = 0; i < d->nmodels; i++) {
		names[i] = d->models[i].name;
		for (uint32_t g = 0; g < d->models[i].ngenerations; g++) {
			const struct fdstore_generation *gen = &d->models[i].generations[g];

			fdnames[nn++] = gen->index_fdname;
			for (uint32_t k = 0; k < gen->nfiles; k++)
				fdnames[nn++] = gen->files[k].fdname;
		}
		for (uint32_t a = 0; a < d->models[i].nartifacts; a++) {
			fdnames[nn++] = d->models[i].artifacts[a].fdname;
			fdnames[nn++] = d->models[i].artifacts[a].index_fdname;
		}
	}
	if ((r = check_unique(names, d->nmodels, "model name")) == 0)
		r = check_unique(fdnames, nn, "fdname");
	free(names);
	free(fdnames);
	return r;
}
