/*
 * fdstore.c: the description of what wcached keeps in systemd's file
 * descriptor store, as bytes (see fdstore.h, and proto/PROTOCOL.md, "The
 * file descriptor store"): encoding and decoding it, comparing and freeing
 * a decoded one, carrying a model of one into the next (what a warm
 * restart's check still holds), and the sealed memfd that carries it
 * across a restart.
 * The names of the stored descriptors are fdstore_name.c's, the rules a
 * description obeys fdstore_check.c's.
 *
 * One set of rules for both directions: fdstore_check() says what a
 * description may hold; the encoder refuses what it refuses, and the
 * decoder runs it on what it parsed, so decode(encode(x)) is x for every
 * x the encoder takes, and nothing the decoder returns breaks a rule.
 * The encoder writes FDSTORE_VERSION where a generation records what its
 * path named or a tree its kept files, else FDSTORE_VERSION_NO_NAMED where
 * a model records a tree (the same bytes but each generation's named and
 * each tree's named and kept count), else FDSTORE_VERSION_NO_TREES where a
 * model waits (nor the trees' lengths), else FDSTORE_VERSION_NO_WAITS (nor
 * the wait lines' lengths), which an older wcached reads; the decoder also
 * reads version 9, whose generations and trees record neither (named
 * FDSTORE_NAMED_UNRECORDED, no kept files), version
 * 8, whose models end after their wait line (no tree: root NULL), version
 * 7, whose models end after their artifacts (no wait line: NULL), version
 * 6, whose artifacts end after their build time (builder's gid
 * FDSTORE_GID_UNRECORDED, no groups: not recorded), version 5, whose
 * generations have no holders' uids after their holders (nuids
 * 0: not recorded), version 4, whose files end after their origin (no ctime, no nlink: read as 0,
 * which says "not recorded"), version 3, whose files end after their mtime
 * (no origin), and version 2, whose models also end after their
 * generations (no artifact count).
 */
#include "fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "proto/le.h"

/* The smallest encoding of each record, to bound a count by the bytes
 * left before allocating for it: a string is at least 2 + 1 bytes. */
#define MIN_STRING 3u
#define MODEL_FIXED (8u + 8u + 4u)               /* slot, last generation, count */
#define MIN_MODEL_V2 (2u * MIN_STRING + MODEL_FIXED)
#define MIN_MODEL_V7 (MIN_MODEL_V2 + 4u)         /* and the artifact count */
#define MIN_MODEL_V8 (MIN_MODEL_V7 + 2u)         /* and the wait line's length */
#define MIN_MODEL (MIN_MODEL_V8 + 2u)            /* and the tree root's length */
#define GENERATION_FIXED (8u + 1u + 1u + 2u + 4u + 8u + 4u) /* number .. file count */
#define MIN_GENERATION_V5 (MIN_STRING + GENERATION_FIXED)
#define MIN_GENERATION_V9 (MIN_GENERATION_V5 + 4u) /* and the holder uid count */
#define MIN_GENERATION (MIN_GENERATION_V9 + 1u)  /* and what its path named */
#define HOLDER_SIZE (4u + 4u)                    /* uid, count */
#define FILE_FIXED_V3 (4u * 8u)                  /* dev, ino, size, mtime */
#define MIN_FILE_V3 (MIN_STRING + FILE_FIXED_V3)
#define MIN_FILE_V4 (MIN_FILE_V3 + 2u * 8u)       /* and the origin's dev, ino */
#define MIN_FILE (MIN_FILE_V4 + 3u * 8u)          /* and ctime, nlink, the origin's ctime */
#define ARTIFACT_FIXED (8u + 8u + 8u + 4u + 4u + 8u) /* source, sizes, uid, pid, build ms */
#define MIN_ARTIFACT_V6 (3u * MIN_STRING + ARTIFACT_FIXED)
#define MIN_ARTIFACT (MIN_ARTIFACT_V6 + 4u + 4u) /* and the builder's gid, group count */
#define BUILDER_GROUP_SIZE 4u
#define KEPT_SIZE (4u + 8u + 8u + 8u)            /* a tree's kept file: uid, dev, ino, ctime */

_Static_assert(sizeof(FDSTORE_MAGIC) - 1 == 8, "the magic is 8 bytes");

/* ---- encoding ----------------------------------------------------------------- */

struct out {
	uint8_t *p;
	size_t len, cap;
	int err;
};

static void
put(struct out *o, const void *v, size_t n)
{
	size_t want;

	if (o->err != 0 || n == 0)
		return;
	if (__builtin_add_overflow(o->len, n, &want) || want > FDSTORE_MAX_BYTES) {
		o->err = -E2BIG;
		return;
	}
	if (want > o->cap || o->p == NULL) {
		size_t cap = o->cap < 4096 ? 4096 : o->cap;
		uint8_t *q;

		while (cap < want)
			cap *= 2;
		if ((q = realloc(o->p, cap)) == NULL) {
			o->err = -ENOMEM;
			return;
		}
		o->p = q;
		o->cap = cap;
	}
	memcpy(o->p + o->len, v, n);
	o->len = want;
}

static void
put_u8(struct out *o, uint8_t v)
{
	put(o, &v, 1);
}

static void
put_le(struct out *o, uint64_t v, size_t n)
{
	uint8_t b[8];

	put_le_n(b, v, n);
	put(o, b, n);
}

static void
put_string(struct out *o, const char *s)
{
	size_t n = strlen(s);

	put_le(o, n, 2);
	put(o, s, n);
}

/* A model's tree (version 9): its root (u16 length 0: none, and nothing
 * follows), then its owner, whether the root's inode is recorded, its
 * device and inode, the place (u16 length 0: none), its directory's mode
 * and that directory's length in it; since version 10 what its path named,
 * the count of its kept files and each (uid, dev, ino, ctime). */
static void
put_tree(struct out *o, const struct fdstore_tree *t, uint32_t version)
{
	if (t->root == NULL) {
		put_le(o, 0, 2);
		return;
	}
	put_string(o, t->root);
	put_le(o, t->uid, 4);
	put_u8(o, t->root_known);
	put_le(o, t->root_dev, 8);
	put_le(o, t->root_ino, 8);
	if (t->place != NULL)
		put_string(o, t->place);
	else
		put_le(o, 0, 2);
	put_le(o, t->place_mode, 4);
	put_le(o, t->place_dir_len, 4);
	if (version < 10)
		return;
	put_u8(o, t->named);
	put_le(o, t->nkept, 4);
	for (uint32_t k = 0; k < t->nkept; k++) {
		put_le(o, t->kept[k].uid, 4);
		put_le(o, t->kept[k].dev, 8);
		put_le(o, t->kept[k].ino, 8);
		put_le(o, (uint64_t)t->kept[k].ctime_ns, 8);
	}
}

/* The oldest version that holds d (fdstore.h: FDSTORE_VERSION_NO_WAITS):
 * an older wcached reads what needs nothing newer. */
static uint32_t
oldest_version(const struct fdstore_desc *d)
{
	uint32_t version = FDSTORE_VERSION_NO_WAITS;

	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_model *m = &d->models[i];

		if (m->tree.nkept > 0)
			return FDSTORE_VERSION;
		for (uint32_t g = 0; g < m->ngenerations; g++)
			if (m->generations[g].named != FDSTORE_NAMED_UNRECORDED)
				return FDSTORE_VERSION;
		if (m->tree.root != NULL)
			version = FDSTORE_VERSION_NO_NAMED;
		else if (m->waits != NULL && version < FDSTORE_VERSION_NO_TREES)
			version = FDSTORE_VERSION_NO_TREES;
	}
	return version;
}

int
fdstore_encode(const struct fdstore_desc *d, uint8_t **buf, size_t *len)
{
	struct out o = { 0 };
	uint32_t version;
	int r;

	if ((r = fdstore_check(d)) < 0)
		return r;
	version = oldest_version(d);
	put(&o, FDSTORE_MAGIC, 8);
	put_le(&o, version, 4);
	put_le(&o, d->nmodels, 4);
	put_le(&o, d->status_size, 8);
	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_model *m = &d->models[i];

		put_string(&o, m->name);
		put_string(&o, m->path);
		put_le(&o, m->slot, 8);
		put_le(&o, m->last_generation, 8);
		put_le(&o, m->ngenerations, 4);
		for (uint32_t g = 0; g < m->ngenerations; g++) {
			const struct fdstore_generation *gen = &m->generations[g];

			put_le(&o, gen->number, 8);
			put_u8(&o, gen->role);
			put_u8(&o, gen->pin);
			put_le(&o, 0, 2); /* reserved */
			put_le(&o, gen->holders, 4);
			put_le(&o, gen->nuids, 4);
			for (uint32_t u = 0; u < gen->nuids; u++) {
				put_le(&o, gen->uids[u].uid, 4);
				put_le(&o, gen->uids[u].count, 4);
			}
			if (version >= 10)
				put_u8(&o, gen->named);
			put_string(&o, gen->index_fdname);
			put_le(&o, gen->index_size, 8);
			put_le(&o, gen->nfiles, 4);
			for (uint32_t k = 0; k < gen->nfiles; k++) {
				const struct fdstore_file *f = &gen->files[k];

				put_string(&o, f->fdname);
				put_le(&o, f->dev, 8);
				put_le(&o, f->ino, 8);
				put_le(&o, f->size, 8);
				put_le(&o, (uint64_t)f->mtime_ns, 8);
				put_le(&o, f->origin_dev, 8);
				put_le(&o, f->origin_ino, 8);
				put_le(&o, (uint64_t)f->ctime_ns, 8);
				put_le(&o, f->nlink, 8);
				put_le(&o, (uint64_t)f->origin_ctime_ns, 8);
			}
		}
		put_le(&o, m->nartifacts, 4);
		for (uint32_t a = 0; a < m->nartifacts; a++) {
			const struct fdstore_artifact *art = &m->artifacts[a];

			put_string(&o, art->key);
			put_le(&o, art->source, 8);
			put_string(&o, art->fdname);
			put_le(&o, art->size, 8);
			put_string(&o, art->index_fdname);
			put_le(&o, art->index_size, 8);
			put_le(&o, art->builder_uid, 4);
			put_le(&o, art->builder_pid, 4);
			put_le(&o, art->build_ms, 8);
			put_le(&o, art->builder_gid, 4);
			put_le(&o, art->builder_ngroups, 4);
			for (uint32_t k = 0; k < art->builder_ngroups; k++)
				put_le(&o, art->builder_groups[k], 4);
		}
		if (m->waits != NULL)
			put_string(&o, m->waits);
		else if (version >= 8)
			put_le(&o, 0, 2);
		if (version >= 9)
			put_tree(&o, &m->tree, version);
	}
	if (o.err != 0) {
		free(o.p);
		return error_set(o.err, "fdstore: encoding: %s", o.err == -E2BIG ?
			"the description is larger than " "16 MiB" : "out of memory");
	}
	*buf = o.p;
	*len = o.len;
	return 0;
}

/* ---- decoding ------------------------------------------------------------------ */

struct in {
	const uint8_t *p;
	size_t len, off;
};

/* Takes n bytes, or fails naming the field and where it starts. */
static int
take(struct in *in, size_t n, const void **out, const char *where, const char *field)
{
	if (n > in->len - in->off)
		return error_set(-EBADMSG, "fdstore: %s: %s: needs %zu bytes at offset %zu, %zu "
			"left", where, field, n, in->off, in->len - in->off);
	*out = in->p + in->off;
	in->off += n;
	return 0;
}

static int
get_le(struct in *in, size_t n, uint64_t *v, const char *where, const char *field)
{
	const uint8_t *b;
	int r;

	if ((r = take(in, n, (const void **)&b, where, field)) < 0)
		return r;
	*v = get_le_n(b, n);
	return 0;
}

/* A string of 1 .. max bytes without NUL, copied with a terminating NUL. */
static int
get_string(struct in *in, size_t max, char **out, const char *where, const char *field)
{
	const void *b;
	uint64_t n;
	int r;

	if ((r = get_le(in, 2, &n, where, field)) < 0)
		return r;
	if (n == 0 || n > max)
		return error_set(-EBADMSG, "fdstore: %s: %s: length %" PRIu64 " at offset %zu, "
			"not 1 to %zu", where, field, n, in->off - 2, max);
	if ((r = take(in, (size_t)n, &b, where, field)) < 0)
		return r;
	if (memchr(b, '\0', (size_t)n) != NULL)
		return error_set(-EBADMSG, "fdstore: %s: %s: holds a NUL byte", where, field);
	if ((*out = strndup(b, (size_t)n)) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	return 0;
}

/* A count of at most max records of at least min bytes each: bounded by
 * what is left before anything is allocated for it. */
static int
get_count(struct in *in, uint32_t max, size_t min, uint32_t *out, const char *where,
	const char *field)
{
	uint64_t n;
	int r;

	if ((r = get_le(in, 4, &n, where, field)) < 0)
		return r;
	if (n > max)
		return error_set(-EBADMSG, "fdstore: %s: %s: %" PRIu64 ", more than %" PRIu32,
			where, field, n, max);
	if (n > (in->len - in->off) / min)
		return error_set(-EBADMSG, "fdstore: %s: %s: %" PRIu64 " records cannot fit in "
			"the %zu bytes left", where, field, n, in->len - in->off);
	*out = (uint32_t)n;
	return 0;
}

static int
get_file(struct in *in, struct fdstore_file *f, const char *where, uint64_t version)
{
	uint64_t mtime, ctime, origin_ctime;
	int r;

	if ((r = get_string(in, FDSTORE_MAX_FDNAME, &f->fdname, where, "fdname")) < 0 ||
		(r = get_le(in, 8, &f->dev, where, "st_dev")) < 0 ||
		(r = get_le(in, 8, &f->ino, where, "st_ino")) < 0 ||
		(r = get_le(in, 8, &f->size, where, "st_size")) < 0 ||
		(r = get_le(in, 8, &mtime, where, "st_mtim")) < 0)
		return r;
	if (f->size > INT64_MAX)
		return error_set(-EBADMSG, "fdstore: %s: st_size: %" PRIu64 " is past any file's",
			where, f->size);
	f->mtime_ns = (int64_t)mtime;
	if (version < 4)
		return 0; /* versions 2 and 3: no origin (0, 0) */
	if ((r = get_le(in, 8, &f->origin_dev, where, "origin st_dev")) < 0 ||
		(r = get_le(in, 8, &f->origin_ino, where, "origin st_ino")) < 0)
		return r;
	if (version < 5)
		return 0; /* version 4: no ctimes, nlink 0 (not recorded) */
	if ((r = get_le(in, 8, &ctime, where, "st_ctim")) < 0 ||
		(r = get_le(in, 8, &f->nlink, where, "st_nlink")) < 0 ||
		(r = get_le(in, 8, &origin_ctime, where, "origin st_ctim")) < 0)
		return r;
	f->ctime_ns = (int64_t)ctime;
	f->origin_ctime_ns = (int64_t)origin_ctime;
	return 0;
}

/* Version 6: the count of a generation's holders' uids, and each (uid,
 * count). Their order, counts and sum are fdstore_check()'s to judge. */
static int
get_holder_uids(struct in *in, struct fdstore_generation *g, const char *where)
{
	uint64_t uid, count;
	int r;

	if ((r = get_count(in, FDSTORE_MAX_HOLDER_UIDS, HOLDER_SIZE, &g->nuids, where,
		     "holder uid count")) < 0)
		return r;
	if (g->nuids > 0 && (g->uids = calloc(g->nuids, sizeof(*g->uids))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	for (uint32_t u = 0; u < g->nuids; u++) {
		if ((r = get_le(in, 4, &uid, where, "holder uid")) < 0 ||
			(r = get_le(in, 4, &count, where, "holder uid's count")) < 0)
			return r;
		g->uids[u] = (struct fdstore_holder){ (uint32_t)uid, (uint32_t)count };
	}
	return 0;
}

static int
get_generation(struct in *in, struct fdstore_generation *g, const char *mwhere, uint32_t gi,
	uint64_t version)
{
	char where[1400], fwhere[1500];
	uint64_t v, reserved;
	int r;

	snprintf(where, sizeof(where), "%s: generation %" PRIu32, mwhere, gi);
	if ((r = get_le(in, 8, &g->number, where, "number")) < 0 ||
		(r = get_le(in, 1, &v, where, "role")) < 0)
		return r;
	g->role = (uint8_t)v;
	if ((r = get_le(in, 1, &v, where, "pin")) < 0)
		return r;
	g->pin = (uint8_t)v;
	if ((r = get_le(in, 2, &reserved, where, "reserved")) < 0)
		return r;
	if (reserved != 0)
		return error_set(-EBADMSG, "fdstore: %s: reserved: %" PRIu64 ", not 0", where,
			reserved);
	if ((r = get_le(in, 4, &v, where, "holders")) < 0)
		return r;
	g->holders = (uint32_t)v;
	if (version >= 6 && (r = get_holder_uids(in, g, where)) < 0)
		return r;
	if (version >= 10) { /* its range is fdstore_check()'s */
		if ((r = get_le(in, 1, &v, where, "path named")) < 0)
			return r;
		g->named = (uint8_t)v;
	}
	if ((r = get_string(in, FDSTORE_MAX_FDNAME, &g->index_fdname, where, "index fdname")) < 0 ||
		(r = get_le(in, 8, &g->index_size, where, "index size")) < 0 ||
		(r = get_count(in, FDSTORE_MAX_FILES, version < 4 ? MIN_FILE_V3 :
			 version < 5 ? MIN_FILE_V4 : MIN_FILE, &g->nfiles, where,
			 "file count")) < 0)
		return r;
	if (g->nfiles > 0 && (g->files = calloc(g->nfiles, sizeof(*g->files))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	for (uint32_t k = 0; k < g->nfiles; k++) {
		snprintf(fwhere, sizeof(fwhere), "%s: file %" PRIu32, where, k);
		if ((r = get_file(in, &g->files[k], fwhere, version)) < 0)
			return r;
	}
	return 0;
}

/* Version 7: an artifact's builder's gid, the count of its groups and
 * each group. Whether they agree is fdstore_check()'s to judge. */
static int
get_builder_groups(struct in *in, struct fdstore_artifact *a, const char *where)
{
	uint64_t v;
	int r;

	if ((r = get_le(in, 4, &v, where, "builder gid")) < 0)
		return r;
	a->builder_gid = (uint32_t)v;
	if ((r = get_count(in, FDSTORE_MAX_BUILDER_GROUPS, BUILDER_GROUP_SIZE,
		     &a->builder_ngroups, where, "builder group count")) < 0)
		return r;
	if (a->builder_ngroups > 0 && (a->builder_groups = calloc(a->builder_ngroups,
						    sizeof(*a->builder_groups))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	for (uint32_t k = 0; k < a->builder_ngroups; k++) {
		if ((r = get_le(in, 4, &v, where, "builder group")) < 0)
			return r;
		a->builder_groups[k] = (uint32_t)v;
	}
	return 0;
}

/* The checks of each field's range are fdstore_check()'s, run on the
 * whole description once it is read. */
static int
get_artifact(struct in *in, struct fdstore_artifact *a, const char *mwhere, uint32_t ai,
	uint64_t version)
{
	char where[1400];
	uint64_t v;
	int r;

	snprintf(where, sizeof(where), "%s: artifact %" PRIu32, mwhere, ai);
	if ((r = get_string(in, FDSTORE_MAX_KEY, &a->key, where, "key")) < 0 ||
		(r = get_le(in, 8, &a->source, where, "source")) < 0 ||
		(r = get_string(in, FDSTORE_MAX_FDNAME, &a->fdname, where, "fdname")) < 0 ||
		(r = get_le(in, 8, &a->size, where, "size")) < 0 ||
		(r = get_string(in, FDSTORE_MAX_FDNAME, &a->index_fdname, where,
			 "index fdname")) < 0 ||
		(r = get_le(in, 8, &a->index_size, where, "index size")) < 0 ||
		(r = get_le(in, 4, &v, where, "builder uid")) < 0)
		return r;
	a->builder_uid = (uint32_t)v;
	if ((r = get_le(in, 4, &v, where, "builder pid")) < 0)
		return r;
	a->builder_pid = (uint32_t)v;
	if ((r = get_le(in, 8, &a->build_ms, where, "build time")) < 0)
		return r;
	if (version < 7) {
		a->builder_gid = FDSTORE_GID_UNRECORDED; /* versions 3 to 6: not recorded */
		return 0;
	}
	return get_builder_groups(in, a, where);
}

/* A string that may be absent: a u16 length, 0 (none: NULL) or a string
 * of up to max bytes. */
static int
get_optional(struct in *in, size_t max, char **out, const char *where, const char *field)
{
	uint64_t n;
	int r;

	if ((r = get_le(in, 2, &n, where, field)) < 0 || n == 0)
		return r;
	in->off -= 2; /* read again as the string's length */
	return get_string(in, max, out, where, field);
}

/* Version 10: what a tree's path named, the count of its kept files
 * (bounded by the bytes left before anything is allocated) and each. Their
 * rules are fdstore_check()'s. */
static int
get_kept(struct in *in, struct fdstore_tree *t, const char *where)
{
	uint64_t v, c;
	int r;

	if ((r = get_le(in, 1, &v, where, "tree path named")) < 0)
		return r;
	t->named = (uint8_t)v;
	if ((r = get_count(in, FDSTORE_MAX_KEPT, KEPT_SIZE, &t->nkept, where,
		     "tree kept file count")) < 0)
		return r;
	if (t->nkept > 0 && (t->kept = calloc(t->nkept, sizeof(*t->kept))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	for (uint32_t k = 0; k < t->nkept; k++) {
		if ((r = get_le(in, 4, &v, where, "tree kept file's owner")) < 0 ||
			(r = get_le(in, 8, &t->kept[k].dev, where,
				 "tree kept file's device")) < 0 ||
			(r = get_le(in, 8, &t->kept[k].ino, where, "tree kept file's inode")) < 0 ||
			(r = get_le(in, 8, &c, where, "tree kept file's ctime")) < 0)
			return r;
		t->kept[k].uid = (uint32_t)v;
		t->kept[k].ctime_ns = (int64_t)c;
	}
	return 0;
}

/* A model's tree (put_tree); its rules are fdstore_check's. */
static int
get_tree(struct in *in, struct fdstore_tree *t, const char *where, uint64_t version)
{
	uint64_t v[6];
	int r;

	if ((r = get_optional(in, FDSTORE_MAX_PATH, &t->root, where, "tree root")) < 0 ||
		t->root == NULL)
		return r;
	if ((r = get_le(in, 4, &v[0], where, "tree owner")) < 0 ||
		(r = get_le(in, 1, &v[1], where, "tree root known")) < 0 ||
		(r = get_le(in, 8, &v[2], where, "tree root device")) < 0 ||
		(r = get_le(in, 8, &v[3], where, "tree root inode")) < 0 ||
		(r = get_optional(in, FDSTORE_MAX_PATH, &t->place, where, "tree place")) < 0 ||
		(r = get_le(in, 4, &v[4], where, "tree place mode")) < 0 ||
		(r = get_le(in, 4, &v[5], where, "tree place directory length")) < 0)
		return r;
	t->uid = (uint32_t)v[0];
	t->root_known = (uint8_t)v[1];
	t->root_dev = v[2];
	t->root_ino = v[3];
	t->place_mode = (uint32_t)v[4];
	t->place_dir_len = (uint32_t)v[5];
	return version < 10 ? 0 : get_kept(in, t, where);
}

static int
get_model(struct in *in, struct fdstore_model *m, uint32_t i, uint64_t version)
{
	char where[1200];
	int r;

	snprintf(where, sizeof(where), "model %" PRIu32, i);
	if ((r = get_string(in, FDSTORE_MAX_MODEL_NAME, &m->name, where, "name")) < 0)
		return r;
	snprintf(where, sizeof(where), "model %" PRIu32 " (\"%s\")", i, m->name);
	if ((r = get_string(in, FDSTORE_MAX_PATH, &m->path, where, "path")) < 0 ||
		(r = get_le(in, 8, &m->slot, where, "slot")) < 0 ||
		(r = get_le(in, 8, &m->last_generation, where, "last generation")) < 0 ||
		(r = get_count(in, FDSTORE_MAX_GENERATIONS, version < 6 ? MIN_GENERATION_V5 :
			 version < 10 ? MIN_GENERATION_V9 : MIN_GENERATION, &m->ngenerations,
			 where, "generation count")) < 0)
		return r;
	if (m->ngenerations > 0 &&
		(m->generations = calloc(m->ngenerations, sizeof(*m->generations))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	for (uint32_t g = 0; g < m->ngenerations; g++)
		if ((r = get_generation(in, &m->generations[g], where, g, version)) < 0)
			return r;
	if (version < 3)
		return 0; /* version 2: no artifacts */
	if ((r = get_count(in, FDSTORE_MAX_ARTIFACTS, version < 7 ? MIN_ARTIFACT_V6 :
			 MIN_ARTIFACT, &m->nartifacts, where,
		     "artifact count")) < 0)
		return r;
	if (m->nartifacts > 0 &&
		(m->artifacts = calloc(m->nartifacts, sizeof(*m->artifacts))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	for (uint32_t a = 0; a < m->nartifacts; a++)
		if ((r = get_artifact(in, &m->artifacts[a], where, a, version)) < 0)
			return r;
	if (version < 8)
		return 0; /* version 7: no wait line */
	if ((r = get_optional(in, FDSTORE_MAX_WAIT_LINE, &m->waits, where, "wait line")) < 0 ||
		version < 9)
		return r; /* version 8: no tree */
	return get_tree(in, &m->tree, where, version);
}

int
fdstore_decode(const uint8_t *buf, size_t len, struct fdstore_desc **out)
{
	struct in in = { .p = buf, .len = len };
	struct fdstore_desc *d;
	const void *magic;
	uint64_t version;
	int r;

	if (len < FDSTORE_HEADER_SIZE || len > FDSTORE_MAX_BYTES)
		return error_set(-EBADMSG, "fdstore: description: %zu bytes, not %u to %u", len,
			FDSTORE_HEADER_SIZE, FDSTORE_MAX_BYTES);
	(void)take(&in, 8, &magic, "header", "magic");
	if (memcmp(magic, FDSTORE_MAGIC, 8) != 0)
		return error_set(-EBADMSG, "fdstore: header: magic: not \"%s\"", FDSTORE_MAGIC);
	(void)get_le(&in, 4, &version, "header", "version");
	if (version < FDSTORE_VERSION_MIN || version > FDSTORE_VERSION)
		return error_set(-EPROTO, "fdstore: header: version: %" PRIu64 ", this wcached "
			"reads %u to %u", version, FDSTORE_VERSION_MIN, FDSTORE_VERSION);
	if ((d = calloc(1, sizeof(*d))) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	if ((r = get_count(&in, FDSTORE_MAX_MODELS, version < 3 ? MIN_MODEL_V2 :
			 version < 8 ? MIN_MODEL_V7 : version < 9 ? MIN_MODEL_V8 : MIN_MODEL,
		     &d->nmodels, "header", "model count")) < 0 ||
		(r = get_le(&in, 8, &d->status_size, "header", "status size")) < 0)
		goto fail;
	if (d->nmodels > 0 && (d->models = calloc(d->nmodels, sizeof(*d->models))) == NULL) {
		r = error_set(-ENOMEM, "fdstore: out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < d->nmodels; i++)
		if ((r = get_model(&in, &d->models[i], i, version)) < 0)
			goto fail;
	if (in.off != in.len) {
		r = error_set(-EBADMSG, "fdstore: description: %zu bytes left over after the last "
			"model, at offset %zu", in.len - in.off, in.off);
		goto fail;
	}
	if ((r = fdstore_check(d)) < 0) {
		if (r == -EINVAL)
			r = -EBADMSG;
		goto fail;
	}
	*out = d;
	return 0;
fail:
	fdstore_free(d);
	return r;
}

/* ---- comparing and freeing ---------------------------------------------------- */

static int
stored_generation_equal(const struct fdstore_generation *a, const struct fdstore_generation *b)
{
	if (a->number != b->number || a->role != b->role || a->pin != b->pin ||
		a->holders != b->holders || a->nuids != b->nuids || a->named != b->named ||
		(a->nuids > 0 && memcmp(a->uids, b->uids, a->nuids * sizeof(*a->uids)) != 0) ||
		strcmp(a->index_fdname, b->index_fdname) != 0 || a->index_size != b->index_size ||
		a->nfiles != b->nfiles)
		return 0;
	for (uint32_t k = 0; k < a->nfiles; k++) {
		const struct fdstore_file *x = &a->files[k], *y = &b->files[k];

		if (strcmp(x->fdname, y->fdname) != 0 || x->dev != y->dev || x->ino != y->ino ||
			x->size != y->size || x->mtime_ns != y->mtime_ns ||
			x->origin_dev != y->origin_dev || x->origin_ino != y->origin_ino ||
			x->ctime_ns != y->ctime_ns || x->nlink != y->nlink ||
			x->origin_ctime_ns != y->origin_ctime_ns)
			return 0;
	}
	return 1;
}

static int
stored_artifact_equal(const struct fdstore_artifact *a, const struct fdstore_artifact *b)
{
	return strcmp(a->key, b->key) == 0 && a->source == b->source &&
		strcmp(a->fdname, b->fdname) == 0 && a->size == b->size &&
		strcmp(a->index_fdname, b->index_fdname) == 0 && a->index_size == b->index_size &&
		a->builder_uid == b->builder_uid && a->builder_pid == b->builder_pid &&
		a->build_ms == b->build_ms && a->builder_gid == b->builder_gid &&
		a->builder_ngroups == b->builder_ngroups &&
		(a->builder_ngroups == 0 || memcmp(a->builder_groups, b->builder_groups,
			a->builder_ngroups * sizeof(*a->builder_groups)) == 0);
}

static int
optional_equal(const char *a, const char *b)
{
	return a == NULL ? b == NULL : b != NULL && strcmp(a, b) == 0;
}

static int
stored_tree_equal(const struct fdstore_tree *a, const struct fdstore_tree *b)
{
	/* Field by field: a kept file's struct has padding. */
	for (uint32_t k = 0; a->nkept == b->nkept && k < a->nkept; k++)
		if (a->kept[k].uid != b->kept[k].uid || a->kept[k].dev != b->kept[k].dev ||
			a->kept[k].ino != b->kept[k].ino ||
			a->kept[k].ctime_ns != b->kept[k].ctime_ns)
			return 0;
	return optional_equal(a->root, b->root) && optional_equal(a->place, b->place) &&
		a->uid == b->uid && a->root_known == b->root_known &&
		a->root_dev == b->root_dev && a->root_ino == b->root_ino &&
		a->place_mode == b->place_mode && a->place_dir_len == b->place_dir_len &&
		a->named == b->named && a->nkept == b->nkept;
}

int
fdstore_equal(const struct fdstore_desc *a, const struct fdstore_desc *b)
{
	if (a->status_size != b->status_size || a->nmodels != b->nmodels)
		return 0;
	for (uint32_t i = 0; i < a->nmodels; i++) {
		const struct fdstore_model *x = &a->models[i], *y = &b->models[i];

		if (strcmp(x->name, y->name) != 0 || strcmp(x->path, y->path) != 0 ||
			x->slot != y->slot || x->last_generation != y->last_generation ||
			x->ngenerations != y->ngenerations || x->nartifacts != y->nartifacts ||
			!optional_equal(x->waits, y->waits) ||
			!stored_tree_equal(&x->tree, &y->tree))
			return 0;
		for (uint32_t g = 0; g < x->ngenerations; g++)
			if (!stored_generation_equal(&x->generations[g], &y->generations[g]))
				return 0;
		for (uint32_t k = 0; k < x->nartifacts; k++)
			if (!stored_artifact_equal(&x->artifacts[k], &y->artifacts[k]))
				return 0;
	}
	return 1;
}

/* Frees n generations of v (each field may be NULL) and v. */
static void
free_generations(struct fdstore_generation *v, uint32_t n)
{
	for (uint32_t g = 0; v != NULL && g < n; g++) {
		for (uint32_t k = 0; v[g].files != NULL && k < v[g].nfiles; k++)
			free(v[g].files[k].fdname);
		free(v[g].files);
		free(v[g].uids);
		free(v[g].index_fdname);
	}
	free(v);
}

/* Frees n artifacts of v (each field may be NULL) and v. */
static void
free_artifacts(struct fdstore_artifact *v, uint32_t n)
{
	for (uint32_t a = 0; v != NULL && a < n; a++) {
		free(v[a].key);
		free(v[a].fdname);
		free(v[a].index_fdname);
		free(v[a].builder_groups);
	}
	free(v);
}

void
fdstore_free(struct fdstore_desc *d)
{
	if (d == NULL)
		return;
	for (uint32_t i = 0; d->models != NULL && i < d->nmodels; i++) {
		struct fdstore_model *m = &d->models[i];

		free_generations(m->generations, m->ngenerations);
		free_artifacts(m->artifacts, m->nartifacts);
		free(m->name);
		free(m->path);
		free(m->waits);
		free(m->tree.root);
		free(m->tree.place);
		free(m->tree.kept);
	}
	free(d->models);
	free(d);
}

/* ---- carrying a model into the next description -------------------------------- */

size_t
fdstore_model_fds(const struct fdstore_model *m)
{
	size_t n = 2 * (size_t)m->nartifacts;

	for (uint32_t g = 0; g < m->ngenerations; g++)
		n += 1 + (size_t)m->generations[g].nfiles;
	return n;
}

int
fdstore_model_names(const struct fdstore_model *m, const char *name)
{
	for (uint32_t g = 0; g < m->ngenerations; g++) {
		const struct fdstore_generation *gen = &m->generations[g];

		if (strcmp(gen->index_fdname, name) == 0)
			return 1;
		for (uint32_t k = 0; k < gen->nfiles; k++)
			if (strcmp(gen->files[k].fdname, name) == 0)
				return 1;
	}
	for (uint32_t a = 0; a < m->nartifacts; a++)
		if (strcmp(m->artifacts[a].fdname, name) == 0 ||
			strcmp(m->artifacts[a].index_fdname, name) == 0)
			return 1;
	return 0;
}

/* *dst becomes a copy of src with strings of its own. -ENOMEM leaves what
 * it copied for free_generations(). */
static int
copy_generation(struct fdstore_generation *dst, const struct fdstore_generation *src)
{
	*dst = *src;
	dst->files = NULL;
	dst->uids = NULL;
	dst->index_fdname = NULL;
	if ((src->nuids > 0 &&
		    (dst->uids = malloc(src->nuids * sizeof(*dst->uids))) == NULL) ||
		(dst->index_fdname = strdup(src->index_fdname)) == NULL ||
		(dst->files = calloc(src->nfiles ? src->nfiles : 1, sizeof(*dst->files))) == NULL)
		return -ENOMEM;
	if (src->nuids > 0)
		memcpy(dst->uids, src->uids, src->nuids * sizeof(*dst->uids));
	for (uint32_t k = 0; k < src->nfiles; k++) {
		dst->files[k] = src->files[k];
		if ((dst->files[k].fdname = strdup(src->files[k].fdname)) == NULL)
			return -ENOMEM;
	}
	return 0;
}

/* The same for an artifact (free_artifacts()). */
static int
copy_artifact(struct fdstore_artifact *dst, const struct fdstore_artifact *src)
{
	*dst = *src;
	dst->fdname = dst->index_fdname = NULL;
	dst->builder_groups = NULL;
	if ((dst->key = strdup(src->key)) == NULL || (dst->fdname = strdup(src->fdname)) == NULL ||
		(dst->index_fdname = strdup(src->index_fdname)) == NULL ||
		(src->builder_ngroups > 0 && (dst->builder_groups = malloc(src->builder_ngroups *
			sizeof(*dst->builder_groups))) == NULL))
		return -ENOMEM;
	if (src->builder_ngroups > 0)
		memcpy(dst->builder_groups, src->builder_groups,
			src->builder_ngroups * sizeof(*dst->builder_groups));
	return 0;
}

int
fdstore_carry(struct fdstore_model *dm, const struct fdstore_model *prev)
{
	struct fdstore_generation *gens = NULL;
	struct fdstore_artifact *arts = NULL;
	uint32_t g = 0, a = 0;

	if (strcmp(dm->name, prev->name) != 0 || dm->slot != prev->slot ||
		dm->ngenerations != 0 || dm->nartifacts != 0)
		return error_set(-EINVAL, "fdstore: model \"%.64s\" (slot %" PRIu64 "): "
			"cannot carry model \"%.64s\" (slot %" PRIu64 "): not the same model, or "
			"described with generations or artifacts of its own", dm->name, dm->slot,
			prev->name, prev->slot);
	if ((prev->ngenerations > 0 &&
		    (gens = calloc(prev->ngenerations, sizeof(*gens))) == NULL) ||
		(prev->nartifacts > 0 && (arts = calloc(prev->nartifacts, sizeof(*arts))) == NULL))
		goto nomem;
	for (; g < prev->ngenerations; g++)
		if (copy_generation(&gens[g], &prev->generations[g]) < 0) {
			g++;
			goto nomem;
		}
	for (; a < prev->nartifacts; a++)
		if (copy_artifact(&arts[a], &prev->artifacts[a]) < 0) {
			a++;
			goto nomem;
		}
	free(dm->generations);
	free(dm->artifacts);
	dm->generations = gens;
	dm->ngenerations = prev->ngenerations;
	dm->artifacts = arts;
	dm->nartifacts = prev->nartifacts;
	if (prev->last_generation > dm->last_generation)
		dm->last_generation = prev->last_generation;
	return 0;
nomem:
	free_generations(gens, g);
	free_artifacts(arts, a);
	return error_set(-ENOMEM, "fdstore: out of memory");
}

/* ---- the memfd ----------------------------------------------------------------- */

int
fdstore_memfd_make(const uint8_t *buf, size_t len, int *fd)
{
	int m = memfd_sealed("wcached-fdstore", buf, len, FDSTORE_SEALS, 0);

	if (m < 0) {
		error_prefix("fdstore: the description");
		return m;
	}
	*fd = m;
	return 0;
}

int
fdstore_memfd_read(int fd, uint8_t **buf, size_t *len)
{
	struct stat st;
	uint8_t *p;
	size_t done = 0;
	int seals;

	if (fstat(fd, &st) < 0)
		return error_set(-errno, "fdstore: %s: fstat: %s", FDSTORE_NAME_DESC,
			strerror(errno));
	seals = fcntl(fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0 || (seals & FDSTORE_SEALS) != FDSTORE_SEALS)
		return error_set(-EBADMSG, "fdstore: %s: not a sealed memfd", FDSTORE_NAME_DESC);
	if (st.st_size < (off_t)FDSTORE_HEADER_SIZE || st.st_size > (off_t)FDSTORE_MAX_BYTES)
		return error_set(-EBADMSG, "fdstore: %s: %lld bytes, not %u to %u",
			FDSTORE_NAME_DESC, (long long)st.st_size, FDSTORE_HEADER_SIZE,
			FDSTORE_MAX_BYTES);
	if ((p = malloc((size_t)st.st_size)) == NULL)
		return error_set(-ENOMEM, "fdstore: out of memory");
	while (done < (size_t)st.st_size) {
		ssize_t n = pread(fd, p + done, (size_t)st.st_size - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;

			free(p);
			return error_set(-e, "fdstore: %s: read: %s", FDSTORE_NAME_DESC,
				strerror(e));
		}
		done += (size_t)n;
	}
	*buf = p;
	*len = done;
	return 0;
}
