/*
 * test_fdstore.c: daemon/fdstore*.c, the description of the registry that
 * wcached will keep in systemd's file descriptor store, and the names of
 * the stored descriptors.
 *
 * A description with every kind of record (three models, one without
 * generations, one with a current, a held and a pending generation and
 * derived artifacts of two of them with their builder's groups or not,
 * holders by uid) is encoded and decoded back, and version 6 (artifacts
 * without their builder's groups), 5 (generations without their holders'
 * uids either),
 * 4 (nor files their ctime and nlink), 3 (nor their origin) and 2 (no
 * artifacts either) descriptions are still read; then each rule
 * is broken on a copy, through the encoder (which refuses) and through
 * hand-made bytes (which the decoder refuses), and the message must name
 * the field. Every prefix of
 * a good encoding is refused, and so is every single byte flipped that
 * the format does not allow (checked against the round trip). The sealed
 * memfd comes back only when sealed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "fdstore.h"
#include "notify.h"
#include "testutil.h"

static void
assert_error(int r, int code, const char *want)
{
	if (r != code)
		fail_msg("returned %d, expected %d; message: %s", r, code, error_get());
	if (strstr(error_get(), want) == NULL)
		fail_msg("message \"%s\" does not contain \"%s\"", error_get(), want);
}

static char *
dup_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *
dup_name(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	assert_true(vasprintf(&s, fmt, ap) > 0);
	va_end(ap);
	return s;
}

/* A generation of model slot with nfiles files, named as the daemon will. */
static void
make_generation(struct fdstore_generation *g, uint64_t slot, uint64_t number, uint8_t role,
	uint32_t nfiles)
{
	char name[128];

	g->number = number;
	g->role = role;
	g->pin = 1;
	g->holders = role == FDSTORE_PENDING ? 0 : (uint32_t)(number * 1000003u); /* > 16 bits */
	assert_true(fdstore_name_index(name, sizeof(name), slot, number) > 0);
	g->index_fdname = strdup(name);
	g->index_size = 4096 * number;
	g->nfiles = nfiles;
	g->files = calloc(nfiles, sizeof(*g->files));
	assert_non_null(g->files);
	for (uint32_t k = 0; k < nfiles; k++) {
		assert_true(fdstore_name_file(name, sizeof(name), slot, number, k) > 0);
		g->files[k] = (struct fdstore_file){ .fdname = strdup(name), .dev = 0x801,
			.ino = 1000 + slot * 100 + number * 10 + k, .size = 1ull << 40,
			.mtime_ns = -5 + (int64_t)k, /* before the epoch is a time too */
			.ctime_ns = 1764892800123456789 + (int64_t)k, .nlink = 1 + k };
		/* Current generations are staged copies: they name their origin. */
		if (role == FDSTORE_CURRENT) {
			g->files[k].origin_dev = 0x1d00000803ull;
			g->files[k].origin_ino = (1ull << 40) + slot * 1000 + k;
			g->files[k].origin_ctime_ns = 1764806400000000007 + (int64_t)k;
		}
	}
}

/* g's holders by uid: n pairs of uid, count. */
static void
set_uids(struct fdstore_generation *g, uint32_t n, const struct fdstore_holder *v)
{
	free(g->uids);
	g->uids = NULL;
	g->nuids = n;
	if (n == 0)
		return;
	g->uids = malloc(n * sizeof(*v));
	assert_non_null(g->uids);
	memcpy(g->uids, v, n * sizeof(*v));
}

/* Derived artifact n of source with key, of the model in slot, named as
 * the daemon will. */
static void
make_artifact(struct fdstore_artifact *a, uint64_t slot, uint64_t n, uint64_t source,
	const char *key)
{
	char name[128];

	a->key = strdup(key);
	a->source = source;
	assert_true(fdstore_name_artifact(name, sizeof(name), slot, n) > 0);
	a->fdname = strdup(name);
	a->size = (1ull << 33) + n;
	assert_true(fdstore_name_artifact_index(name, sizeof(name), slot, n) > 0);
	a->index_fdname = strdup(name);
	a->index_size = 200 + n;
	a->builder_uid = 64101;
	a->builder_pid = 4000000 + (uint32_t)n;
	a->build_ms = 123456789012ull + n;
	/* Artifact 9 as one taken back from a version 6 store: its builder's
	 * groups not recorded. */
	a->builder_gid = n == 9 ? FDSTORE_GID_UNRECORDED : 64102;
	if (n != 9) {
		a->builder_ngroups = 3;
		a->builder_groups = malloc(3 * sizeof(*a->builder_groups));
		assert_non_null(a->builder_groups);
		a->builder_groups[0] = 10;
		a->builder_groups[1] = 64102;
		a->builder_groups[2] = 4000000000u + (uint32_t)n;
	}
}

/* The description of the file header: llama (current 5, held 3, pending
 * 6; artifacts "f32-v1" and "q8" of 5, "f32-v1" of 3; 5 and 3 with their
 * holders by uid), qwen (current 2, its holders' uids not recorded,
 * artifact "f32-v1" of it) and idle (no generation). */
static struct fdstore_desc *
make_desc(void)
{
	struct fdstore_desc *d = calloc(1, sizeof(*d));
	struct fdstore_model *m;

	assert_non_null(d);
	d->status_size = 4096;
	d->nmodels = 3;
	d->models = calloc(3, sizeof(*d->models));
	m = &d->models[0];
	m->name = strdup("llama");
	m->path = strdup("/srv/models/llama");
	m->slot = 1;
	m->last_generation = 6;
	m->ngenerations = 3;
	m->generations = calloc(3, sizeof(*m->generations));
	make_generation(&m->generations[0], 1, 5, FDSTORE_CURRENT, 3);
	make_generation(&m->generations[1], 1, 3, FDSTORE_HELD, 1);
	make_generation(&m->generations[2], 1, 6, FDSTORE_PENDING, 2);
	set_uids(&m->generations[0], 1, (struct fdstore_holder[]){ { 1000, 5000015 } });
	set_uids(&m->generations[1], 3, (struct fdstore_holder[]){ { 0, 1 }, { 1000, 3000000 },
		{ 4294967294u, 8 } });
	m->nartifacts = 3;
	m->artifacts = calloc(3, sizeof(*m->artifacts));
	make_artifact(&m->artifacts[0], 1, 4, 5, "f32-v1");
	make_artifact(&m->artifacts[1], 1, 9, 5, "q8");
	make_artifact(&m->artifacts[2], 1, 2, 3, "f32-v1");
	m = &d->models[1];
	m->name = strdup("qwen");
	m->path = dup_name("/srv/%s/model.safetensors.index.json", "qwen");
	m->slot = 7;
	m->last_generation = 2;
	m->ngenerations = 1;
	m->generations = calloc(1, sizeof(*m->generations));
	make_generation(&m->generations[0], 7, 2, FDSTORE_CURRENT, 250);
	m->nartifacts = 1;
	m->artifacts = calloc(1, sizeof(*m->artifacts));
	make_artifact(&m->artifacts[0], 7, 1, 2, "f32-v1");
	m = &d->models[2];
	m->name = strdup("idle");
	m->path = strdup("/srv/idle");
	m->slot = 2;
	return d;
}

/* Encodes d, which must succeed. */
static uint8_t *
encode(const struct fdstore_desc *d, size_t *len)
{
	uint8_t *buf = NULL;

	if (fdstore_encode(d, &buf, len) != 0)
		fail_msg("encode: %s", error_get());
	return buf;
}

/* Encodes d, which must give exactly the len bytes at want. */
static void
assert_encodes_to(const struct fdstore_desc *d, const uint8_t *want, size_t len)
{
	size_t got_len;
	uint8_t *got = encode(d, &got_len);

	assert_int_equal(got_len, len);
	assert_memory_equal(got, want, len);
	free(got);
}

/* Frees m's artifacts: a model as version 2 described it. */
static void
strip_artifacts(struct fdstore_model *m)
{
	for (uint32_t a = 0; a < m->nartifacts; a++) {
		free(m->artifacts[a].key);
		free(m->artifacts[a].fdname);
		free(m->artifacts[a].index_fdname);
		free(m->artifacts[a].builder_groups);
	}
	free(m->artifacts);
	m->artifacts = NULL;
	m->nartifacts = 0;
}

/* Frees m's generations: a model described without them. */
static void
strip_generations(struct fdstore_model *m)
{
	for (uint32_t g = 0; g < m->ngenerations; g++) {
		for (uint32_t k = 0; k < m->generations[g].nfiles; k++)
			free(m->generations[g].files[k].fdname);
		free(m->generations[g].files);
		free(m->generations[g].uids);
		free(m->generations[g].index_fdname);
	}
	free(m->generations);
	m->generations = NULL;
	m->ngenerations = 0;
}

/* The version 5 bytes of the encoding buf of len bytes (of no artifacts:
 * version 6 bytes but for the version), whose first generation's holder
 * uid count (0) is at offset at: without it. */
static uint8_t *
as_version_5(const uint8_t *buf, size_t len, size_t at)
{
	uint8_t *old = malloc(len);

	assert_non_null(old);
	assert_int_equal(buf[8], FDSTORE_VERSION_NO_WAITS);
	assert_memory_equal(buf + at, "\0\0\0\0", 4);
	memcpy(old, buf, at);
	memcpy(old + at, buf + at + 4, len - at - 4);
	old[8] = 5;
	return old;
}

/* Versions 5 (generations without their holders' uids), 4 (nor files their
 * ctimes and nlink), 3 (nor their origin) and 2 (no artifacts either) are
 * read as version 6 with no holders' uids (only their count, as before),
 * nlink and ctimes 0 (not recorded) and, before 4, origins 0 and 0: a
 * restart after the upgrade reads the description (restore_check.c loads
 * afresh a current generation whose ctime, or a copy whose origin, it
 * cannot tell). With one model, one generation of one file and no
 * artifacts, version 6 is version 5 with the generation's holder uid count
 * after its holders, version 5 is version 4 with the file's 24 bytes of
 * ctime, nlink and origin ctime just before the last 4 (the artifact
 * count), version 4 is version 3 with the 16 origin bytes there, and
 * version 3 is version 2 and that count. */
static void
test_older_versions(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL;
	struct fdstore_model *m = &d->models[0];
	struct fdstore_file *f;
	uint8_t *buf, *v6, *old, *again, *back5;
	size_t len, len2, uids_at;

	(void)state;
	fdstore_free(NULL);
	for (uint32_t i = 1; i < d->nmodels; i++) {
		struct fdstore_model *x = &d->models[i];

		strip_artifacts(x);
		strip_generations(x);
		free(x->name);
		free(x->path);
	}
	d->nmodels = 1;
	strip_artifacts(m);
	/* Llama's current generation 5 alone, with its first file. */
	for (uint32_t g = 1; g < m->ngenerations; g++) {
		for (uint32_t k = 0; k < m->generations[g].nfiles; k++)
			free(m->generations[g].files[k].fdname);
		free(m->generations[g].files);
		free(m->generations[g].uids);
		free(m->generations[g].index_fdname);
	}
	m->ngenerations = 1;
	for (uint32_t k = 1; k < m->generations[0].nfiles; k++)
		free(m->generations[0].files[k].fdname);
	m->generations[0].nfiles = 1;
	f = &m->generations[0].files[0];
	assert_int_equal(f->origin_ino, (1ull << 40) + 1000);

	/* Its holders' uids: version 6 holds them after the holders. */
	uids_at = FDSTORE_HEADER_SIZE + 2 + strlen(m->name) + 2 + strlen(m->path) + 8 + 8 + 4 +
		8 + 1 + 1 + 2 + 4;
	v6 = encode(d, &len);
	assert_int_equal(v6[8], 7); /* of no artifacts: version 6 but for that */
	assert_memory_equal(v6 + uids_at, "\x01\0\0\0" "\xe8\x03\0\0" "\x4f\x4b\x4c\0", 12);
	/* Version 6 bytes with uids called version 5: the uid count is read
	 * as the index fdname's length, and what follows does not parse. */
	v6[8] = 5;
	back = (struct fdstore_desc *)&back;
	assert_int_not_equal(fdstore_decode(v6, len, &back), 0);
	assert_true(back == (struct fdstore_desc *)&back);
	back = NULL;
	free(v6);
	/* Version 5 did not record them: read with none, which leaves the
	 * count-only rule (restore_hold) for that generation. */
	set_uids(&m->generations[0], 0, NULL);
	v6 = encode(d, &len);
	buf = as_version_5(v6, len, uids_at);
	len -= 4;
	if (fdstore_decode(buf, len, &back) != 0)
		fail_msg("decode version 5: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_int_equal(back->models[0].generations[0].holders, 5000015);
	assert_int_equal(back->models[0].generations[0].nuids, 0);
	assert_null(back->models[0].generations[0].uids);
	/* Encoded again, it is version 6 with no holder uids. */
	assert_encodes_to(back, v6, len + 4);
	free(v6);
	fdstore_free(back);
	back = NULL;

	assert_int_equal(buf[8], 5);
	assert_memory_equal(buf + len - 4, "\0\0\0\0", 4);
	/* ctime 1764892800123456789, nlink 1, origin ctime 1764806400000000007 */
	assert_memory_equal(buf + len - 28, "\x15\xcd\x00\xa2\xa6\x28\x7e\x18"
		"\x01\0\0\0\0\0\0\0" "\x07\x00\x56\x09\x12\xda\x7d\x18", 24);
	assert_memory_equal(buf + len - 44, "\x03\x08\0\0\x1d\0\0\0\xe8\x03\0\0\0\x01\0\0", 16);
	/* What an older wcached wrote: version 4, without the ctimes and
	 * nlink, read with them 0 (not recorded). */
	old = malloc(len);
	memcpy(old, buf, len - 28);
	memcpy(old + len - 28, buf + len - 4, 4);
	old[8] = 4;
	f->ctime_ns = f->origin_ctime_ns = 0;
	f->nlink = 0;
	if (fdstore_decode(old, len - 24, &back) != 0)
		fail_msg("decode version 4: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_int_equal(back->models[0].generations[0].files[0].nlink, 0);
	assert_int_equal(back->models[0].generations[0].files[0].ctime_ns, 0);
	assert_int_equal(back->models[0].generations[0].files[0].origin_ctime_ns, 0);
	assert_int_equal(back->models[0].generations[0].files[0].origin_ino, (1ull << 40) + 1000);
	/* Encoded again, it is version 6 with nlink and ctimes 0. */
	again = encode(back, &len2);
	assert_int_equal(len2, len + 4);
	back5 = as_version_5(again, len2, uids_at);
	free(again);
	again = back5;
	assert_memory_equal(again, buf, len - 28);
	assert_memory_equal(again + len - 28, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"
		"\0\0\0\0", 28);
	free(again);
	fdstore_free(back);
	back = NULL;
	/* Version 5 bytes called version 4: the ctime's low bytes are read
	 * as the artifact count. */
	buf[8] = 4;
	back = (struct fdstore_desc *)&back;
	assert_error(fdstore_decode(buf, len, &back), -EBADMSG, "artifact count: ");
	assert_true(back == (struct fdstore_desc *)&back);
	back = NULL;
	buf[8] = 5;

	/* Version 3: without the origin either. */
	memcpy(old, buf, len - 44);
	memcpy(old + len - 44, buf + len - 4, 4);
	old[8] = 3;
	f->origin_dev = f->origin_ino = 0;
	if (fdstore_decode(old, len - 40, &back) != 0)
		fail_msg("decode version 3: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_int_equal(back->models[0].generations[0].files[0].origin_dev, 0);
	assert_int_equal(back->models[0].generations[0].files[0].origin_ino, 0);
	/* Encoded again, it is version 6 with origins, nlink and ctimes 0. */
	again = encode(back, &len2);
	assert_int_equal(len2, len + 4);
	back5 = as_version_5(again, len2, uids_at);
	free(again);
	again = back5;
	assert_memory_equal(again, buf, len - 44);
	for (size_t i = len - 44; i < len; i++)
		assert_int_equal(again[i], 0);
	free(again);
	fdstore_free(back);
	back = NULL;
	/* Version 4 bytes called version 3: the origin's st_dev (0x803)
	 * is read as the artifact count. */
	memcpy(old, buf, len - 28);
	memcpy(old + len - 28, buf + len - 4, 4);
	old[8] = 3;
	back = (struct fdstore_desc *)&back;
	assert_error(fdstore_decode(old, len - 24, &back), -EBADMSG,
		"artifact count: 2051, more than 64");
	assert_true(back == (struct fdstore_desc *)&back);
	back = NULL;

	memcpy(old, buf, len - 44);
	old[8] = 2;
	if (fdstore_decode(old, len - 44, &back) != 0)
		fail_msg("decode version 2: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_int_equal(back->models[0].nartifacts, 0);
	assert_null(back->models[0].artifacts);
	fdstore_free(back);
	/* Version 2 bytes with the artifact count: 4 bytes left over. */
	memcpy(old + len - 44, buf + len - 4, 4);
	back = (struct fdstore_desc *)&back;
	assert_error(fdstore_decode(old, len - 40, &back), -EBADMSG, "4 bytes left over");
	assert_true(back == (struct fdstore_desc *)&back);
	free(old);
	free(buf);
	fdstore_free(d);
}

static void
test_round_trip(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL, *empty;
	uint8_t *buf;
	size_t len;

	(void)state;
	buf = encode(d, &len);
	assert_memory_equal(buf, FDSTORE_MAGIC, 8);
	if (fdstore_decode(buf, len, &back) != 0)
		fail_msg("decode: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_string_equal(back->models[1].generations[0].files[249].fdname, "wc-7-2-249");
	assert_int_equal(back->models[0].generations[0].files[0].mtime_ns, -5);
	assert_int_equal(back->models[0].generations[0].files[2].ctime_ns, 1764892800123456791);
	assert_int_equal(back->models[0].generations[0].files[2].nlink, 3);
	assert_int_equal(back->models[1].generations[0].files[249].origin_ctime_ns,
		1764806400000000256);
	assert_int_equal(back->models[0].generations[1].files[0].origin_ctime_ns, 0); /* held */
	assert_int_equal(back->models[1].generations[0].files[249].origin_dev, 0x1d00000803ull);
	assert_int_equal(back->models[1].generations[0].files[249].origin_ino,
		(1ull << 40) + 7249);
	assert_int_equal(back->models[0].generations[1].files[0].origin_ino, 0); /* held */
	assert_int_equal(back->models[0].generations[2].role, FDSTORE_PENDING);
	assert_int_equal(back->models[0].generations[1].holders, 3000009u);
	assert_int_equal(back->models[0].generations[1].nuids, 3);
	assert_int_equal(back->models[0].generations[1].uids[2].uid, 4294967294u);
	assert_int_equal(back->models[0].generations[1].uids[2].count, 8);
	assert_int_equal(back->models[0].generations[0].uids[0].count, 5000015u);
	assert_int_equal(back->models[1].generations[0].nuids, 0); /* not recorded */
	assert_int_equal(back->models[1].generations[0].holders, 2000006u);
	assert_string_equal(back->models[0].artifacts[1].key, "q8");
	assert_string_equal(back->models[0].artifacts[1].fdname, "wc-1-d9-a");
	assert_string_equal(back->models[0].artifacts[1].index_fdname, "wc-1-d9-i");
	assert_int_equal(back->models[0].artifacts[2].source, 3);
	assert_int_equal(back->models[1].artifacts[0].size, (1ull << 33) + 1);
	assert_int_equal(back->models[1].artifacts[0].build_ms, 123456789013ull);
	assert_int_equal(back->models[1].artifacts[0].builder_pid, 4000001u);
	assert_encodes_to(back, buf, len);
	back->models[0].generations[1].holders--;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].holders++;
	back->models[0].generations[1].uids[1].uid++;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].uids[1].uid--;
	back->models[0].generations[1].uids[1].count--;
	back->models[0].generations[1].uids[0].count++;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].uids[1].count++;
	back->models[0].generations[1].uids[0].count--;
	back->models[0].generations[1].nuids--;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].nuids++;
	back->models[0].generations[1].files[0].ino++;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].files[0].ino--;
	back->models[0].generations[0].files[2].origin_ino++;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[0].files[2].origin_ino--;
	back->models[0].generations[0].files[2].origin_dev = 0;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[0].files[2].origin_dev = 0x1d00000803ull;
	back->models[0].generations[1].files[0].ctime_ns++;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].files[0].ctime_ns--;
	back->models[0].generations[1].files[0].nlink = 0;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].files[0].nlink = 1;
	back->models[0].generations[0].files[2].origin_ctime_ns++;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[0].files[2].origin_ctime_ns--;
	assert_true(fdstore_equal(d, back));
	back->models[0].artifacts[2].build_ms++;
	assert_false(fdstore_equal(d, back));
	fdstore_free(back);
	free(buf);

	/* No models at all: the header alone. */
	empty = calloc(1, sizeof(*empty));
	empty->status_size = 16;
	buf = encode(empty, &len);
	assert_int_equal(len, FDSTORE_HEADER_SIZE);
	assert_int_equal(fdstore_decode(buf, len, &back), 0);
	assert_int_equal(back->nmodels, 0);
	fdstore_free(back);
	fdstore_free(empty);
	free(buf);
	fdstore_free(d);
	fdstore_free(NULL);
}

/* Breaks one rule on a fresh description; the encoder must refuse it
 * naming the field. */
static void
refuse(void (*breaker)(struct fdstore_desc *), const char *want)
{
	static uint8_t untouched; /* where buf points while nothing was encoded */
	struct fdstore_desc *d = make_desc();
	uint8_t *buf = &untouched;
	size_t len = 99;

	breaker(d);
	assert_error(fdstore_encode(d, &buf, &len), -EINVAL, want);
	assert_true(buf == &untouched && len == 99);
	fdstore_free(d);
}

static void b_status(struct fdstore_desc *d) { d->status_size = 4097; }
static void b_slot0(struct fdstore_desc *d) { d->models[2].slot = 0; }
static void b_slot_big(struct fdstore_desc *d) { d->models[2].slot = 512; }
static void b_slot_dup(struct fdstore_desc *d) { d->models[2].slot = 7; }
static void b_name_dup(struct fdstore_desc *d) { memcpy(d->models[2].name, "qwen", 5); }
static void b_relative(struct fdstore_desc *d) { d->models[2].path[0] = 's'; }
static void b_gen_past(struct fdstore_desc *d) { d->models[0].last_generation = 5; }
static void b_gen_zero(struct fdstore_desc *d) { d->models[0].generations[1].number = 0; }
static void b_gen_dup(struct fdstore_desc *d) { d->models[0].generations[1].number = 5; }
static void b_two_current(struct fdstore_desc *d)
{
	d->models[0].generations[1].role = FDSTORE_CURRENT;
}
static void b_role(struct fdstore_desc *d) { d->models[0].generations[1].role = 4; }
static void b_pin(struct fdstore_desc *d) { d->models[0].generations[1].pin = 3; }
static void b_colon(struct fdstore_desc *d)
{
	d->models[0].generations[0].files[1].fdname[2] = ':';
}
static void b_fdname_dup(struct fdstore_desc *d)
{
	free(d->models[1].generations[0].files[3].fdname);
	d->models[1].generations[0].files[3].fdname = strdup("wc-1-5-i");
}
static void b_reserved(struct fdstore_desc *d)
{
	free(d->models[0].generations[0].index_fdname);
	d->models[0].generations[0].index_fdname = strdup(FDSTORE_NAME_STATUS);
}
static void b_no_files(struct fdstore_desc *d)
{
	free(d->models[0].generations[1].files[0].fdname); /* fdstore_free() skips it now */
	d->models[0].generations[1].nfiles = 0;
}
static void b_index_size(struct fdstore_desc *d) { d->models[0].generations[1].index_size = 0; }
static void b_long_fdname(struct fdstore_desc *d)
{
	char *s = malloc(257);

	memset(s, 'x', 256);
	s[256] = '\0';
	free(d->models[0].generations[1].files[0].fdname);
	d->models[0].generations[1].files[0].fdname = s;
}

static void b_key(struct fdstore_desc *d) { d->models[0].artifacts[1].key[0] = '/'; }
static void b_key_long(struct fdstore_desc *d)
{
	char *s = malloc(66);

	memset(s, 'k', 65);
	s[65] = '\0';
	free(d->models[0].artifacts[1].key);
	d->models[0].artifacts[1].key = s;
}
static void b_art_dup(struct fdstore_desc *d)
{
	free(d->models[0].artifacts[1].key);
	d->models[0].artifacts[1].key = strdup("f32-v1");
}
static void b_art_source(struct fdstore_desc *d) { d->models[0].artifacts[1].source = 4; }
static void b_art_slot(struct fdstore_desc *d) { d->models[0].artifacts[1].fdname[3] = '7'; }
static void b_art_n(struct fdstore_desc *d) { d->models[0].artifacts[1].index_fdname[6] = '8'; }
static void b_art_kind(struct fdstore_desc *d) { d->models[0].artifacts[1].fdname[8] = 'i'; }
static void b_art_gen_name(struct fdstore_desc *d)
{
	free(d->models[0].artifacts[1].fdname);
	d->models[0].artifacts[1].fdname = strdup("wc-1-9-0");
}
static void b_art_fdname_dup(struct fdstore_desc *d)
{
	/* Both of llama's "f32-v1" artifacts under the names n = 4. */
	free(d->models[0].artifacts[2].fdname);
	free(d->models[0].artifacts[2].index_fdname);
	d->models[0].artifacts[2].fdname = strdup("wc-1-d4-a");
	d->models[0].artifacts[2].index_fdname = strdup("wc-1-d4-i");
}
static void b_art_size(struct fdstore_desc *d) { d->models[0].artifacts[1].size = 0; }
static void b_art_index_size(struct fdstore_desc *d)
{
	d->models[0].artifacts[1].index_size = 1ull << 32;
}
static void b_art_pid(struct fdstore_desc *d) { d->models[0].artifacts[1].builder_pid = 0; }
static void b_art_count(struct fdstore_desc *d) { d->models[2].nartifacts = 65; }
/* The builder's groups: none where its gid says they are not recorded,
 * and at most FDSTORE_MAX_BUILDER_GROUPS. */
static void b_art_groups_unrecorded(struct fdstore_desc *d)
{
	d->models[0].artifacts[0].builder_gid = FDSTORE_GID_UNRECORDED;
}
static void b_art_groups_count(struct fdstore_desc *d)
{
	d->models[0].artifacts[0].builder_ngroups = FDSTORE_MAX_BUILDER_GROUPS + 1;
}
/* Holders by uid: counts 1 or more summing to the holders, each uid once,
 * ascending. */
static void b_uids_sum(struct fdstore_desc *d) { d->models[0].generations[1].uids[1].count++; }
static void b_uids_short(struct fdstore_desc *d) { d->models[0].generations[0].holders++; }
static void b_uids_zero(struct fdstore_desc *d)
{
	set_uids(&d->models[0].generations[1], 3, (struct fdstore_holder[]){ { 0, 0 },
		{ 1000, 3000001 }, { 4294967294u, 8 } });
}
static void b_uids_dup(struct fdstore_desc *d)
{
	set_uids(&d->models[0].generations[1], 3, (struct fdstore_holder[]){ { 0, 1 },
		{ 1000, 3000000 }, { 1000, 8 } });
}
static void b_uids_order(struct fdstore_desc *d)
{
	set_uids(&d->models[0].generations[1], 3, (struct fdstore_holder[]){ { 1000, 3000000 },
		{ 0, 1 }, { 4294967294u, 8 } });
}
static void b_uids_count(struct fdstore_desc *d)
{
	d->models[0].generations[1].nuids = FDSTORE_MAX_HOLDER_UIDS + 1;
}
/* nlink 0 says the ctimes are not recorded: they must be 0. */
static void b_ctime_unrecorded(struct fdstore_desc *d)
{
	d->models[0].generations[0].files[1].nlink = 0;
}
static void b_origin_ctime_unrecorded(struct fdstore_desc *d)
{
	d->models[0].generations[0].files[1].nlink = 0;
	d->models[0].generations[0].files[1].ctime_ns = 0;
}

static void
test_rules(void **state)
{
	(void)state;
	refuse(b_status, "status size: 4097 bytes");
	refuse(b_slot0, "model 2 (\"idle\"): slot: 0 is not 1 to 511");
	refuse(b_slot_big, "slot: 512 is not 1 to 511");
	refuse(b_slot_dup, "slot: 7 is model 1's too");
	refuse(b_name_dup, "model name \"qwen\" appears twice");
	refuse(b_relative, "path: not absolute");
	refuse(b_gen_past, "generation 2 (6): number: not 1 to the last generation 5");
	refuse(b_gen_zero, "generation 1 (0): number");
	refuse(b_gen_dup, "generation 5 appears twice");
	refuse(b_two_current, "2 current and 1 pending");
	refuse(b_role, "role: 4 is not current");
	refuse(b_pin, "pin: 3 is not 0 to 2");
	refuse(b_colon, "file 1: fdname \"wc:1-5-1\": not a valid FDNAME");
	refuse(b_fdname_dup, "fdname \"wc-1-5-i\" appears twice");
	refuse(b_reserved, "index fdname \"wc-status\": reserved name");
	refuse(b_no_files, "file count: 0, not 1 to 250");
	refuse(b_index_size, "index size: 0 bytes");
	refuse(b_long_fdname, "file 0: fdname: 256 bytes, not 1 to 255");
	refuse(b_key, "artifact 1: key \"/8\": not a derived artifact key");
	refuse(b_key_long, "artifact 1: key: 65 bytes, not 1 to 64");
	refuse(b_art_dup, "artifact 1 (\"f32-v1\" of generation 5): appears twice");
	refuse(b_art_source, "source: generation 4 is not described for the model");
	refuse(b_art_slot, "fdname \"wc-7-d9-a\": not wc-1-d<n>-a");
	refuse(b_art_n, "index fdname \"wc-1-d8-i\": not wc-1-d9-i");
	refuse(b_art_kind, "fdname \"wc-1-d9-i\": not wc-1-d<n>-a");
	refuse(b_art_gen_name, "fdname \"wc-1-9-0\": not wc-1-d<n>-a");
	refuse(b_art_fdname_dup, "fdname \"wc-1-d4-a\" appears twice");
	refuse(b_art_size, "artifact 1 (\"q8\" of generation 5): size: 0 bytes");
	refuse(b_art_index_size, "index size: 4294967296 bytes");
	refuse(b_art_pid, "builder pid: 0 is not 1");
	refuse(b_art_count, "model 2 (\"idle\"): artifact count: 65, more than 64");
	refuse(b_art_groups_unrecorded, "artifact 0 (\"f32-v1\" of generation 5): builder gid: "
		"4294967295 (not recorded) with 3 groups");
	refuse(b_art_groups_count, "artifact 0 (\"f32-v1\" of generation 5): builder group "
		"count: 65537, more than 65536");
	refuse(b_ctime_unrecorded, "model 0 (\"llama\"): generation 0 (5): file 1: st_ctim: "
		"1764892800123456790 with st_nlink 0, which says the ctimes are not recorded: "
		"not 0");
	refuse(b_origin_ctime_unrecorded, "generation 0 (5): file 1: origin st_ctim: "
		"1764806400000000008 with st_nlink 0");
	refuse(b_uids_sum, "model 0 (\"llama\"): generation 1 (3): holder uids: their counts sum "
		"to 3000010, not its 3000009 holders");
	refuse(b_uids_short, "generation 0 (5): holder uids: their counts sum to 5000015, not "
		"its 5000016 holders");
	refuse(b_uids_zero, "generation 1 (3): holder uid 0: count 0, not 1 or more");
	refuse(b_uids_dup, "generation 1 (3): holder uid 1000: appears twice, after uid 1000 "
		"(each uid once, ascending)");
	refuse(b_uids_order, "generation 1 (3): holder uid 0: after uid 1000 (each uid once, "
		"ascending)");
	refuse(b_uids_count, "generation 1 (3): holder uid count: 65537, more than 65536");
}

/* Decodes hostile bytes: the code, the message, *out untouched. */
static void
bad_bytes(const uint8_t *buf, size_t len, int code, const char *want)
{
	struct fdstore_desc *d = (struct fdstore_desc *)&d;

	assert_error(fdstore_decode(buf, len, &d), code, want);
	assert_true(d == (struct fdstore_desc *)&d);
}

static void
put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void
test_hostile_bytes(void **state)
{
	struct fdstore_desc *d = make_desc(), *back;
	uint8_t *buf, *copy, hdr[FDSTORE_HEADER_SIZE + 4];
	size_t len, name_off;

	(void)state;
	buf = encode(d, &len);
	copy = malloc(len + 1);
	assert_non_null(copy);

	/* Every prefix, and one byte more. */
	for (size_t n = 0; n < len; n++) {
		back = NULL;
		assert_int_not_equal(fdstore_decode(buf, n, &back), 0);
		assert_null(back);
	}
	memcpy(copy, buf, len);
	copy[len] = 0;
	bad_bytes(copy, len + 1, -EBADMSG, "1 bytes left over after the last model");

	/* The header. */
	memcpy(copy, buf, len);
	copy[0] = 'w';
	bad_bytes(copy, len, -EBADMSG, "header: magic");
	memcpy(copy, buf, len);
	put_u32(copy + 8, 11);
	bad_bytes(copy, len, -EPROTO, "header: version: 11, this wcached reads 2 to 10");
	/* Version 1 (no holders in its generations) is refused as a whole,
	 * in one line: a restart after an upgrade loads every model afresh.
	 * Version 2 is read (test_version_2). */
	memcpy(copy, buf, len);
	put_u32(copy + 8, 1);
	bad_bytes(copy, len, -EPROTO, "header: version: 1, this wcached reads 2 to 10");
	/* Version 7 bytes read as version 6, 5, 4, 3 or 2: the builders'
	 * groups (the holders' uids, the ctimes, the origins, the artifact
	 * counts) are not there, so the next record starts early and does not
	 * parse. */
	for (uint32_t v = 2; v <= 6; v++) {
		memcpy(copy, buf, len);
		put_u32(copy + 8, v);
		back = NULL;
		assert_int_not_equal(fdstore_decode(copy, len, &back), 0);
		assert_null(back);
	}
	memcpy(copy, buf, len);
	put_u32(copy + 12, FDSTORE_MAX_MODELS + 1);
	bad_bytes(copy, len, -EBADMSG, "header: model count: 4097, more than 4096");
	memcpy(copy, buf, len);
	put_u32(copy + 12, 4000); /* cannot fit: refused before any allocation */
	bad_bytes(copy, len, -EBADMSG, "records cannot fit");
	bad_bytes(buf, FDSTORE_HEADER_SIZE - 1, -EBADMSG, "description: 23 bytes");

	/* The first model's name: a NUL in it, a length of 0, one past the end. */
	name_off = FDSTORE_HEADER_SIZE;
	memcpy(copy, buf, len);
	copy[name_off + 3] = '\0';
	bad_bytes(copy, len, -EBADMSG, "model 0: name: holds a NUL byte");
	memcpy(copy, buf, len);
	copy[name_off] = 0;
	copy[name_off + 1] = 0;
	bad_bytes(copy, len, -EBADMSG, "model 0: name: length 0");
	memcpy(copy, buf, len);
	copy[name_off] = 0xff;
	copy[name_off + 1] = 0x7f;
	bad_bytes(copy, len, -EBADMSG, "model 0: name: length 32767");

	/* A rule broken in bytes: the decoder runs fdstore_check() too. The
	 * slot of the first model (after its name and path) becomes qwen's:
	 * its artifacts' names no longer carry its slot. */
	memcpy(copy, buf, len);
	copy[name_off + 2 + 5 + 2 + 17] = 7;
	bad_bytes(copy, len, -EBADMSG, "fdname \"wc-1-d4-a\": not wc-7-d<n>-a");

	/* A header that claims a model and stops. */
	memcpy(hdr, buf, FDSTORE_HEADER_SIZE);
	put_u32(hdr + 12, 1);
	bad_bytes(hdr, FDSTORE_HEADER_SIZE, -EBADMSG, "model count: 1 records cannot fit");

	free(copy);
	free(buf);
	fdstore_free(d);
}

/* The offset in buf of the builder's gid of the artifact whose index
 * fdname is name: after the name, its index size, the builder's uid and
 * pid and the build time. */
static size_t
builder_gid_at(const uint8_t *buf, size_t len, const char *name)
{
	const uint8_t *p = memmem(buf, len, name, strlen(name));

	assert_non_null(p);
	return (size_t)(p - buf) + strlen(name) + 8 + 4 + 4 + 8;
}

/* Version 6 artifacts end after their build time: read with their
 * builder's gid FDSTORE_GID_UNRECORDED and no groups (restore_rules.c asks
 * the user database then), and encoded again as version 7 that says so.
 * In version 7 bytes, a builder group count past the limit is refused,
 * naming the artifact. */
static void
test_version_6_artifacts(void **state)
{
	/* The artifacts in the order they are encoded. */
	static const char *const names[] = { "wc-1-d4-i", "wc-1-d9-i", "wc-1-d2-i",
		"wc-7-d1-i" };
	struct fdstore_desc *d = make_desc(), *back = NULL;
	uint8_t *v7, *v6;
	size_t len, len6 = 0, last = 0, at;

	(void)state;
	/* Version 7 with the groups: the count past the limit. */
	v7 = encode(d, &len);
	at = builder_gid_at(v7, len, "wc-1-d4-i");
	assert_memory_equal(v7 + at, "\x66\xfa\0\0" "\x03\0\0\0" "\x0a\0\0\0", 12);
	put_u32(v7 + at + 4, FDSTORE_MAX_BUILDER_GROUPS + 1);
	bad_bytes(v7, len, -EBADMSG, "model 0 (\"llama\"): artifact 0: builder group count: "
		"65537, more than 65536");
	/* One more than there are: the next artifact starts 4 bytes late. */
	put_u32(v7 + at + 4, 4);
	bad_bytes(v7, len, -EBADMSG, "model 0 (\"llama\"): artifact 1: key: holds a NUL byte");
	free(v7);

	for (uint32_t i = 0; i < 2; i++)
		for (uint32_t a = 0; a < d->models[i].nartifacts; a++) {
			struct fdstore_artifact *x = &d->models[i].artifacts[a];

			free(x->builder_groups);
			x->builder_groups = NULL;
			x->builder_ngroups = 0;
			x->builder_gid = FDSTORE_GID_UNRECORDED;
		}
	v7 = encode(d, &len);
	v6 = malloc(len);
	assert_non_null(v6);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		at = builder_gid_at(v7, len, names[i]);
		assert_memory_equal(v7 + at, "\xff\xff\xff\xff\0\0\0\0", 8);
		memcpy(v6 + len6, v7 + last, at - last);
		len6 += at - last;
		last = at + 8;
	}
	memcpy(v6 + len6, v7 + last, len - last);
	len6 += len - last;
	assert_int_equal(len6, len - (size_t)4 * 8);
	v6[8] = 6;
	if (fdstore_decode(v6, len6, &back) != 0)
		fail_msg("decode version 6: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_int_equal(back->models[0].artifacts[0].builder_gid, FDSTORE_GID_UNRECORDED);
	assert_int_equal(back->models[0].artifacts[0].builder_ngroups, 0);
	assert_null(back->models[0].artifacts[0].builder_groups);
	assert_encodes_to(back, v7, len);
	fdstore_free(back);
	free(v6);
	free(v7);
	fdstore_free(d);
}

/* A file whose st_nlink is 0 says its ctimes are not recorded: bytes that
 * give it a st_ctim or an origin st_ctim other than 0 are refused, naming
 * the file; with both 0 they are read. */
static void
test_ctimes_without_nlink(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL;
	uint64_t ctime = (uint64_t)d->models[0].generations[0].files[0].ctime_ns;
	uint8_t *buf, *copy, want[8];
	const uint8_t *at;
	size_t len, ctime_off;

	(void)state;
	buf = encode(d, &len);
	copy = malloc(len);
	assert_non_null(copy);
	/* The first file's st_ctim is the first 8 bytes that hold it; its
	 * st_nlink and its origin's st_ctim follow. */
	for (int i = 0; i < 8; i++)
		want[i] = (uint8_t)(ctime >> (8 * i));
	at = memmem(buf, len, want, sizeof(want));
	assert_non_null(at);
	ctime_off = (size_t)(at - buf);
	memcpy(copy, buf, len);
	memset(copy + ctime_off + 8, 0, 8);
	bad_bytes(copy, len, -EBADMSG, "fdstore: model 0 (\"llama\"): generation 0 (5): file 0: "
		"st_ctim: 1764892800123456789 with st_nlink 0, which says the ctimes are not "
		"recorded: not 0");
	memset(copy + ctime_off, 0, 8);
	bad_bytes(copy, len, -EBADMSG, "file 0: origin st_ctim: 1764806400000000007 with "
		"st_nlink 0");
	memset(copy + ctime_off + 16, 0, 8);
	assert_int_equal(fdstore_decode(copy, len, &back), 0);
	assert_true(back->models[0].generations[0].files[0].nlink == 0);
	fdstore_free(back);
	free(copy);
	free(buf);
	fdstore_free(d);
}

/* Flipping any one byte either is refused or decodes to a description that
 * encodes back to the flipped bytes: nothing is ignored. */
static void
test_every_byte_counts(void **state)
{
	struct fdstore_desc *d = make_desc(), *back;
	uint8_t *buf, *copy;
	size_t len;

	(void)state;
	buf = encode(d, &len);
	copy = malloc(len);
	for (size_t i = 0; i < len; i += (i < 600 ? 1 : 97)) {
		memcpy(copy, buf, len);
		copy[i] ^= 0x41;
		back = NULL;
		if (fdstore_decode(copy, len, &back) != 0) {
			assert_null(back);
			assert_true(strncmp(error_get(), "fdstore: ", 9) == 0);
			continue;
		}
		assert_encodes_to(back, copy, len);
		fdstore_free(back);
	}
	free(copy);
	free(buf);
	fdstore_free(d);
}

static void
test_names(void **state)
{
	struct fdstore_name n;
	char buf[64];

	(void)state;
	assert_int_equal(fdstore_name_index(buf, sizeof(buf), 3, 12), 9);
	assert_string_equal(buf, "wc-3-12-i");
	assert_int_equal(fdstore_name_parse(buf, &n), 0);
	assert_int_equal(n.kind, FDSTORE_NAME_KIND_INDEX);
	assert_int_equal(n.slot, 3);
	assert_int_equal(n.generation, 12);
	assert_true(fdstore_name_file(buf, sizeof(buf), UINT64_MAX, UINT64_MAX, 249) > 0);
	assert_string_equal(buf, "wc-18446744073709551615-18446744073709551615-249");
	assert_true(strlen(buf) <= FDSTORE_MAX_FDNAME);
	assert_int_equal(fdstore_name_parse(buf, &n), 0);
	assert_int_equal(n.kind, FDSTORE_NAME_KIND_FILE);
	assert_true(n.slot == UINT64_MAX && n.generation == UINT64_MAX && n.file == 249);
	assert_int_equal(fdstore_name_parse("wc-status", &n), 0);
	assert_int_equal(n.kind, FDSTORE_NAME_KIND_STATUS);
	assert_int_equal(fdstore_name_parse("wc-desc", &n), 0);
	assert_int_equal(n.kind, FDSTORE_NAME_KIND_DESC);
	assert_error(fdstore_name_file(buf, 8, 3, 12, 1), -ENAMETOOLONG, "too small");
	assert_int_equal(fdstore_name_artifact(buf, sizeof(buf), 3, 12), 10);
	assert_string_equal(buf, "wc-3-d12-a");
	assert_int_equal(fdstore_name_parse(buf, &n), 0);
	assert_int_equal(n.kind, FDSTORE_NAME_KIND_ARTIFACT);
	assert_true(n.slot == 3 && n.artifact == 12);
	assert_true(fdstore_name_artifact_index(buf, sizeof(buf), UINT64_MAX, UINT64_MAX) > 0);
	assert_string_equal(buf, "wc-18446744073709551615-d18446744073709551615-i");
	assert_int_equal(fdstore_name_parse(buf, &n), 0);
	assert_int_equal(n.kind, FDSTORE_NAME_KIND_ARTIFACT_INDEX);
	assert_true(n.slot == UINT64_MAX && n.artifact == UINT64_MAX);
	assert_error(fdstore_name_artifact(buf, 9, 3, 12), -ENAMETOOLONG, "too small");

	assert_error(fdstore_name_parse("client", &n), -EINVAL, "not a name of wcached's");
	assert_error(fdstore_name_parse("wc-0-1-i", &n), -EINVAL, "not wc-<slot>");
	assert_error(fdstore_name_parse("wc-1-0-i", &n), -EINVAL, "not wc-<slot>");
	assert_error(fdstore_name_parse("wc-01-1-i", &n), -EINVAL, "not wc-<slot>");
	assert_error(fdstore_name_parse("wc-18446744073709551616-1-i", &n), -EINVAL,
		"not wc-<slot>");
	assert_error(fdstore_name_parse("wc-1-1-250", &n), -EINVAL, "file number below 250");
	assert_error(fdstore_name_parse("wc-1-1-ix", &n), -EINVAL, "ends in neither");
	assert_error(fdstore_name_parse("wc-1-1-", &n), -EINVAL, "ends in neither");
	assert_error(fdstore_name_parse("wc-1-1-01", &n), -EINVAL, "ends in neither");
	assert_error(fdstore_name_parse("wc-1-d0-a", &n), -EINVAL, "not wc-<slot>-d<artifact>");
	assert_error(fdstore_name_parse("wc-1-d01-a", &n), -EINVAL, "not wc-<slot>-d<artifact>");
	assert_error(fdstore_name_parse("wc-1-d1-x", &n), -EINVAL, "not wc-<slot>-d<artifact>");
	assert_error(fdstore_name_parse("wc-1-d1-ai", &n), -EINVAL, "not wc-<slot>-d<artifact>");
	assert_error(fdstore_name_parse("wc-1-d1-", &n), -EINVAL, "not wc-<slot>-d<artifact>");
	assert_error(fdstore_name_parse("wc-1-d-a", &n), -EINVAL, "not wc-<slot>-d<artifact>");
	assert_error(fdstore_name_parse("wc-1-1-d", &n), -EINVAL, "ends in neither");
	assert_error(fdstore_name_parse("wc-0-d1-a", &n), -EINVAL, "not wc-<slot>");

	assert_true(notify_fdname_valid("wc-1-1-i", 8));
	assert_false(notify_fdname_valid("", 0));
	assert_false(notify_fdname_valid("a:b", 3));
	assert_false(notify_fdname_valid("a\nb", 3));
	assert_false(notify_fdname_valid("caf\xc3\xa9", 5));
}

/* A model of an earlier description carried into the next one, where it
 * is described without generations (a warm restart's check still holds
 * it): the copy is the earlier entry field by field with strings of its
 * own, keeps the higher last generation, passes the rules and encodes;
 * its names and descriptors are counted; a model that is not the same
 * (another slot or name) or has generations of its own is refused and
 * left as it was. */
static void
test_carry(void **state)
{
	struct fdstore_desc *prev = make_desc(), *next = make_desc(), *back = NULL;
	struct fdstore_model *dm = &next->models[0];
	const struct fdstore_model *pm = &prev->models[0];
	struct fdstore_desc one = { .status_size = 4096, .nmodels = 1, .models = dm };
	struct fdstore_desc was = { .status_size = 4096, .nmodels = 1 };
	uint8_t *buf;
	size_t len;

	(void)state;
	/* llama: generations 5 (3 files), 3 (1) and 6 (2), three artifacts. */
	assert_int_equal(fdstore_model_fds(pm), (1 + 3) + (1 + 1) + (1 + 2) + 2 * 3);
	assert_int_equal(fdstore_model_fds(&prev->models[2]), 0);
	assert_true(fdstore_model_names(pm, "wc-1-5-i"));
	assert_true(fdstore_model_names(pm, "wc-1-5-2"));
	assert_true(fdstore_model_names(pm, "wc-1-3-0"));
	assert_true(fdstore_model_names(pm, "wc-1-d9-a"));
	assert_true(fdstore_model_names(pm, "wc-1-d2-i"));
	assert_false(fdstore_model_names(pm, "wc-1-5-3"));
	assert_false(fdstore_model_names(pm, "wc-1-4-i"));
	assert_false(fdstore_model_names(pm, "wc-7-2-i"));
	assert_false(fdstore_model_names(pm, FDSTORE_NAME_DESC));

	/* next's llama as a description written during the check has it. */
	strip_artifacts(dm);
	strip_generations(dm);
	dm->last_generation = 4;
	/* Not the same model: another slot, another name. */
	assert_error(fdstore_carry(dm, &prev->models[1]), -EINVAL, "cannot carry model \"qwen\"");
	dm->slot = 2;
	assert_error(fdstore_carry(dm, pm), -EINVAL, "not the same model");
	dm->slot = 1;
	assert_int_equal(dm->ngenerations, 0);
	assert_int_equal(dm->last_generation, 4);

	assert_int_equal(fdstore_carry(dm, pm), 0);
	was.models = (struct fdstore_model *)pm;
	assert_true(fdstore_equal(&one, &was));
	assert_ptr_not_equal(dm->generations[0].index_fdname, pm->generations[0].index_fdname);
	assert_ptr_not_equal(dm->generations[0].files[0].fdname,
		pm->generations[0].files[0].fdname);
	assert_ptr_not_equal(dm->artifacts[0].key, pm->artifacts[0].key);
	assert_int_equal(dm->last_generation, 6);
	assert_int_equal(fdstore_check(next), 0);
	/* Described with generations now: refused, nothing changed. */
	assert_error(fdstore_carry(dm, pm), -EINVAL, "described with generations or artifacts");
	assert_int_equal(dm->ngenerations, 3);
	/* What goes into the store decodes to the same. */
	buf = encode(next, &len);
	assert_int_equal(fdstore_decode(buf, len, &back), 0);
	assert_true(fdstore_equal(next, back));
	free(buf);
	fdstore_free(back);
	/* The copy outlives the entry it came from. */
	fdstore_free(prev);
	assert_int_equal(fdstore_check(next), 0);

	/* A higher last generation of the next description stays. */
	prev = make_desc();
	strip_artifacts(&next->models[2]);
	next->models[2].last_generation = 9;
	prev->models[2].last_generation = 3;
	assert_int_equal(fdstore_carry(&next->models[2], &prev->models[2]), 0);
	assert_int_equal(next->models[2].last_generation, 9);
	assert_int_equal(next->models[2].ngenerations, 0);
	fdstore_free(prev);
	fdstore_free(next);
}

static void
test_memfd(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL;
	uint8_t *buf, *read_back = NULL;
	size_t len, rlen = 0;
	int before = tu_count_fds(), fd = -1, plain, seals;

	(void)state;
	buf = encode(d, &len);
	assert_int_equal(fdstore_memfd_make(buf, len, &fd), 0);
	seals = fcntl(fd, F_GET_SEALS);
	assert_int_equal(seals & FDSTORE_SEALS, FDSTORE_SEALS);
	assert_true(write(fd, "x", 1) < 0); /* sealed */
	assert_int_equal(fdstore_memfd_read(fd, &read_back, &rlen), 0);
	assert_int_equal(rlen, len);
	assert_memory_equal(read_back, buf, len);
	assert_int_equal(fdstore_decode(read_back, rlen, &back), 0);
	assert_true(fdstore_equal(d, back));
	fdstore_free(back);
	free(read_back);
	close(fd);

	/* The same bytes in a memfd that is not sealed, and a pipe. */
	plain = memfd_create("wctest-plain", MFD_CLOEXEC);
	assert_true(plain >= 0);
	assert_int_equal(write(plain, buf, len), (ssize_t)len);
	read_back = NULL;
	assert_error(fdstore_memfd_read(plain, &read_back, &rlen), -EBADMSG, "not a sealed memfd");
	assert_null(read_back);
	close(plain);
	assert_int_equal(fdstore_memfd_make(buf, 10, &fd), 0);
	assert_error(fdstore_memfd_read(fd, &read_back, &rlen), -EBADMSG, "10 bytes, not 24");
	close(fd);
	assert_int_equal(tu_count_fds(), before);
	free(buf);
	fdstore_free(d);
}

/* d cut down to its first model (the others freed), encoded: the bytes
 * end with that model's last field. */
static uint8_t *
encode_first_model(struct fdstore_desc *d, size_t *len)
{
	for (uint32_t i = 1; i < d->nmodels; i++) {
		strip_artifacts(&d->models[i]);
		strip_generations(&d->models[i]);
		free(d->models[i].name);
		free(d->models[i].path);
		free(d->models[i].waits);
		free(d->models[i].tree.root);
		free(d->models[i].tree.place);
	}
	d->nmodels = 1;
	return encode(d, len);
}

/* Version 8: a model's wait line (review rev203 H1) ends it, a u16 length
 * (0: none) and its bytes. A description where a model waits is written
 * as version 8 and read back the same; one where none waits is written as
 * version 7 (an older wcached reads it), and its version 8 spelling, each
 * model ending with a length 0, reads the same. A wait line with a NUL,
 * past the limit or past the end is refused, naming the model. */
static void
test_version_8_wait_lines(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL;
	struct fdstore_model *last = &d->models[d->nmodels - 1];
	const char *line = "not restored: its path goes through a place others may rename in";
	size_t len, n = strlen(line), at;
	uint8_t *buf, *v8;
	char where[64];

	(void)state;
	last->waits = strdup(line);
	assert_non_null(last->waits);
	buf = encode(d, &len);
	assert_int_equal(buf[8], FDSTORE_VERSION_NO_TREES);
	if (fdstore_decode(buf, len, &back) != 0)
		fail_msg("decode version 8: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_string_equal(back->models[d->nmodels - 1].waits, line);
	assert_null(back->models[0].waits);
	fdstore_free(back);
	back = NULL;
	snprintf(where, sizeof(where), "model %" PRIu32 " (\"%s\"): wait line: ", d->nmodels - 1,
		last->name);
	at = len - n;
	buf[at + 3] = '\0';
	bad_bytes(buf, len, -EBADMSG, where);
	bad_bytes(buf, len, -EBADMSG, "holds a NUL byte");
	buf[at + 3] = (uint8_t)line[3];
	buf[at - 2] = (uint8_t)(n + 1);
	bad_bytes(buf, len, -EBADMSG, "wait line: needs");
	buf[at - 2] = 0xff;
	buf[at - 1] = 0xff;
	bad_bytes(buf, len, -EBADMSG, "wait line: length 65535");
	free(buf);
	/* Another model waits too, so that a fdstore_equal sees the lines. */
	free(d->models[0].waits);
	d->models[0].waits = strdup("refused");
	assert_non_null(d->models[0].waits);
	buf = encode(d, &len);
	if (fdstore_decode(buf, len, &back) != 0)
		fail_msg("decode version 8: %s", error_get());
	free(back->models[0].waits);
	back->models[0].waits = strdup("refuses");
	assert_false(fdstore_equal(d, back));
	fdstore_free(back);
	back = NULL;
	free(buf);

	/* None waits: version 7, and its version 8 spelling reads the same. */
	for (uint32_t i = 0; i < d->nmodels; i++) {
		free(d->models[i].waits);
		d->models[i].waits = NULL;
	}
	/* One model, so that its wait line's length ends the bytes. */
	buf = encode_first_model(d, &len);
	assert_int_equal(buf[8], FDSTORE_VERSION_NO_WAITS);
	v8 = malloc(len + 2);
	assert_non_null(v8);
	memcpy(v8, buf, len);
	v8[len] = 0;
	v8[len + 1] = 0;
	v8[8] = FDSTORE_VERSION_NO_TREES;
	if (fdstore_decode(v8, len + 2, &back) != 0)
		fail_msg("decode version 8 with no wait line: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_null(back->models[0].waits);
	assert_encodes_to(back, buf, len);
	fdstore_free(back);
	/* Version 7 bytes called version 8: the wait line's length is past
	 * the end. */
	buf[8] = FDSTORE_VERSION_NO_TREES;
	bad_bytes(buf, len, -EBADMSG, "wait line: needs 2 bytes");
	free(v8);
	free(buf);
	fdstore_free(d);
}

/* Sets m's tree: root (NULL: none), and place (NULL: none) of dir_len. */
static void
set_tree(struct fdstore_model *m, const char *root, uint32_t uid, uint64_t ino,
	const char *place, uint32_t dir_len)
{
	free(m->tree.root);
	free(m->tree.place);
	m->tree = (struct fdstore_tree){ .uid = uid };
	if (root != NULL)
		assert_non_null(m->tree.root = strdup(root));
	if (ino != 0)
		m->tree = (struct fdstore_tree){ .root = m->tree.root, .uid = uid,
			.root_known = 1, .root_dev = 2049, .root_ino = ino };
	if (place != NULL) {
		assert_non_null(m->tree.place = strdup(place));
		m->tree.place_mode = 02775;
		m->tree.place_dir_len = dir_len;
	}
}

/* Breaks one rule of a model's tree: fdstore_check refuses it, naming the
 * field. */
static void
refuse_tree(const char *root, uint32_t uid, uint8_t known, uint64_t ino, const char *place,
	uint32_t mode, uint32_t dir_len, const char *want)
{
	struct fdstore_desc *d = make_desc();
	struct fdstore_tree *t = &d->models[2].tree;

	t->root = root != NULL ? strdup(root) : NULL;
	t->place = place != NULL ? strdup(place) : NULL;
	t->uid = uid;
	t->root_known = known;
	t->root_ino = ino;
	t->place_mode = mode;
	t->place_dir_len = dir_len;
	assert_error(fdstore_check(d), -EINVAL, want);
	fdstore_free(d);
}

/* Version 9: a model's tree (fdstore.h's tree), its root's inode and its
 * place; written only where some model records one (else version 8 or 7),
 * read back equal, held to its rules, and its bytes bounded: a length
 * past the end, a NUL, a truncated tail are refused naming the field. */
static void
test_version_9_trees(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL;
	uint8_t *buf, *v9;
	size_t len;

	(void)state;
	set_tree(&d->models[0], "/srv/models/llama", 1000, 77, NULL, 0);
	set_tree(&d->models[2], "/srv/idle", 0, 0, "/srv/idle", 4);
	buf = encode(d, &len);
	assert_int_equal(buf[8], FDSTORE_VERSION_NO_NAMED);
	if (fdstore_decode(buf, len, &back) != 0)
		fail_msg("decode version 9: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_string_equal(back->models[0].tree.root, "/srv/models/llama");
	assert_int_equal(back->models[0].tree.root_ino, 77);
	assert_int_equal(back->models[0].tree.root_dev, 2049);
	assert_null(back->models[0].tree.place);
	assert_null(back->models[1].tree.root);
	assert_string_equal(back->models[2].tree.place, "/srv/idle");
	assert_int_equal(back->models[2].tree.place_mode, 02775);
	assert_int_equal(back->models[2].tree.place_dir_len, 4);
	back->models[0].tree.root_ino++;
	assert_false(fdstore_equal(d, back));
	back->models[0].tree.root_ino--;
	back->models[2].tree.place_dir_len = 5;
	assert_false(fdstore_equal(d, back));
	back->models[2].tree.place_dir_len = 4;
	free(back->models[2].tree.place);
	back->models[2].tree.place = NULL;
	assert_false(fdstore_equal(d, back));
	fdstore_free(back);
	back = NULL;
	/* The last model's tree ends the bytes: its place directory's
	 * length (4), mode (4), place "/srv/idle" (2 + 9). */
	bad_bytes(buf, len - 1, -EBADMSG, "model 2 (\"idle\"): tree place directory length: "
		"needs 4 bytes");
	buf[len - 8 - 9 + 2] = '\0';
	bad_bytes(buf, len, -EBADMSG, "tree place: holds a NUL byte");
	buf[len - 8 - 9 + 2] = 'r';
	buf[len - 8 - 11] = 0xff;
	bad_bytes(buf, len, -EBADMSG, "tree place: needs 255 bytes");
	buf[len - 8 - 11] = 9;
	buf[len - 7] = 0x15; /* mode 012775 */
	bad_bytes(buf, len, -EBADMSG, "tree place mode");
	free(buf);

	/* The rules. */
	refuse_tree(NULL, 5, 0, 0, NULL, 0, 0, "tree: no root, but its other fields");
	refuse_tree("srv/idle", 0, 0, 0, NULL, 0, 0, "tree root: not absolute");
	refuse_tree("/srv/idle", 0, 2, 7, NULL, 0, 0, "tree root known: 2");
	refuse_tree("/srv/idle", 0, 0, 7, NULL, 0, 0, "tree root known: 0, with device 0 and "
		"inode 7");
	refuse_tree("/srv/idle", 0, 0, 0, NULL, 0755, 0, "tree: no place, but");
	refuse_tree("/srv/idle", 0, 0, 0, "idle", 0755, 0, "tree place: not absolute");
	refuse_tree("/srv/idle", 0, 0, 0, "/srv/idle", 0755, 10, "tree place directory length: "
		"10, more than its place's 9 bytes");
	refuse_tree("/srv/idle", 0, 0, 0, "/srv/idle", 010755, 4, "tree place mode");

	/* No tree, no wait: version 7; its version 9 spelling (two zero
	 * lengths per model) reads the same. One model, whose tree ends the
	 * bytes. */
	for (uint32_t i = 0; i < d->nmodels; i++)
		set_tree(&d->models[i], NULL, 0, 0, NULL, 0);
	buf = encode_first_model(d, &len);
	assert_int_equal(buf[8], FDSTORE_VERSION_NO_WAITS);
	v9 = calloc(1, len + 4);
	assert_non_null(v9);
	memcpy(v9, buf, len);
	v9[8] = FDSTORE_VERSION_NO_NAMED;
	if (fdstore_decode(v9, len + 4, &back) != 0)
		fail_msg("decode version 9 with no tree: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_null(back->models[0].tree.root);
	assert_encodes_to(back, buf, len);
	fdstore_free(back);
	/* Version 8 spelling called version 9: the tree's length is past the
	 * end. */
	bad_bytes(v9, len + 2, -EBADMSG, "tree root: needs 2 bytes");
	free(v9);
	free(buf);
	fdstore_free(d);
}

/* m's tree's kept files: n of them (uid 1000 + k, dev 2049, ino 500 + k,
 * a ctime of its own), and what its path named. */
static void
set_kept(struct fdstore_model *m, uint32_t n, uint8_t named)
{
	free(m->tree.kept);
	m->tree.kept = NULL;
	m->tree.nkept = n;
	m->tree.named = named;
	if (n == 0)
		return;
	m->tree.kept = calloc(n, sizeof(*m->tree.kept));
	assert_non_null(m->tree.kept);
	for (uint32_t k = 0; k < n; k++)
		m->tree.kept[k] = (struct fdstore_kept){ .uid = 1000 + k, .dev = 2049,
			.ino = 500 + k, .ctime_ns = 1765000000123456789 + k };
}

/* The offset of the one byte in which a and b (len bytes each) differ. */
static size_t
differs_at(const uint8_t *a, const uint8_t *b, size_t len)
{
	size_t at = len;

	for (size_t i = 0; i < len; i++)
		if (a[i] != b[i]) {
			assert_int_equal(at, len);
			at = i;
		}
	assert_true(at < len);
	return at;
}

/* Version 10: what each generation's path named, and a tree's kept files
 * (review rev215 H1, rev209 M1); written only where some generation
 * records what its path named or a tree kept files (else version 9, which
 * an older wcached reads, as before), read back equal, held to their rules,
 * and their bytes bounded: an out-of-range value, a count past its maximum
 * or past the bytes left, a truncated tail are refused naming the field. A
 * version 9 store is still read: nothing recorded. */
static void
test_version_10_named_and_kept(void **state)
{
	struct fdstore_desc *d = make_desc(), *back = NULL;
	uint8_t *buf, *other, *copy;
	size_t len, other_len, at, v9_len;

	(void)state;
	set_tree(&d->models[0], "/srv/models/llama", 1000, 77, NULL, 0);
	set_tree(&d->models[2], "/srv/idle", 0, 0, NULL, 0);
	d->models[0].generations[0].named = FDSTORE_NAMED_FILE;
	d->models[0].generations[1].named = FDSTORE_NAMED_DIR;
	set_kept(&d->models[2], 3, FDSTORE_NAMED_FILE);
	buf = encode(d, &len);
	assert_int_equal(buf[8], FDSTORE_VERSION);
	assert_int_equal(FDSTORE_VERSION, 10);
	if (fdstore_decode(buf, len, &back) != 0)
		fail_msg("decode version 10: %s", error_get());
	assert_true(fdstore_equal(d, back));
	assert_int_equal(back->models[0].generations[0].named, FDSTORE_NAMED_FILE);
	assert_int_equal(back->models[0].generations[1].named, FDSTORE_NAMED_DIR);
	assert_int_equal(back->models[0].generations[2].named, FDSTORE_NAMED_UNRECORDED);
	assert_int_equal(back->models[0].tree.nkept, 0);
	assert_null(back->models[0].tree.kept);
	assert_int_equal(back->models[2].tree.named, FDSTORE_NAMED_FILE);
	assert_int_equal(back->models[2].tree.nkept, 3);
	assert_int_equal(back->models[2].tree.kept[2].uid, 1002);
	assert_int_equal(back->models[2].tree.kept[2].dev, 2049);
	assert_int_equal(back->models[2].tree.kept[2].ino, 502);
	assert_int_equal(back->models[2].tree.kept[2].ctime_ns, 1765000000123456791);
	assert_encodes_to(back, buf, len);
	/* Every field counts in the comparison. */
	back->models[0].generations[1].named = FDSTORE_NAMED_FILE;
	assert_false(fdstore_equal(d, back));
	back->models[0].generations[1].named = FDSTORE_NAMED_DIR;
	back->models[2].tree.named = FDSTORE_NAMED_DIR;
	assert_false(fdstore_equal(d, back));
	back->models[2].tree.named = FDSTORE_NAMED_FILE;
	back->models[2].tree.kept[1].uid++;
	assert_false(fdstore_equal(d, back));
	back->models[2].tree.kept[1].uid--;
	back->models[2].tree.kept[1].ino++;
	assert_false(fdstore_equal(d, back));
	back->models[2].tree.kept[1].ino--;
	back->models[2].tree.kept[1].ctime_ns++;
	assert_false(fdstore_equal(d, back));
	back->models[2].tree.kept[1].ctime_ns--;
	back->models[2].tree.nkept = 2;
	assert_false(fdstore_equal(d, back));
	back->models[2].tree.nkept = 3;
	assert_true(fdstore_equal(d, back));
	fdstore_free(back);
	back = NULL;

	/* The bytes. The last model's tree ends them: what its path named (1),
	 * its kept file count (4), 3 kept files of 28 bytes (uid, dev, ino,
	 * ctime). */
	bad_bytes(buf, len - 1, -EBADMSG, "model 2 (\"idle\"): tree kept file count: 3 records "
		"cannot fit in the 83 bytes left");
	bad_bytes(buf, len - 84, -EBADMSG, "tree kept file count: 3 records cannot fit");
	bad_bytes(buf, len - 85, -EBADMSG, "tree kept file count: needs 4 bytes");
	copy = malloc(len);
	assert_non_null(copy);
	memcpy(copy, buf, len);
	put_u32(copy + len - 88, FDSTORE_MAX_KEPT + 1);
	bad_bytes(copy, len, -EBADMSG, "tree kept file count: 252, more than 251");
	memcpy(copy, buf, len);
	copy[len - 89] = 3;
	bad_bytes(copy, len, -EBADMSG, "model 2 (\"idle\"): tree path named: 3 is not 0 to 2");
	memcpy(copy, buf, len);
	copy[len - 89] = FDSTORE_NAMED_DIR;
	if (fdstore_decode(copy, len, &back) != 0)
		fail_msg("decode version 10: %s", error_get());
	assert_int_equal(back->models[2].tree.named, FDSTORE_NAMED_DIR);
	fdstore_free(back);
	back = NULL;
	/* A generation's: the one byte that differs from its other spelling. */
	d->models[0].generations[0].named = FDSTORE_NAMED_DIR;
	other = encode(d, &other_len);
	assert_int_equal(other_len, len);
	at = differs_at(buf, other, len);
	assert_int_equal(buf[at], FDSTORE_NAMED_FILE);
	d->models[0].generations[0].named = FDSTORE_NAMED_FILE;
	free(other);
	memcpy(copy, buf, len);
	copy[at] = 3;
	bad_bytes(copy, len, -EBADMSG, "model 0 (\"llama\"): generation 0 (5): path named: 3 "
		"is not 0 to 2");
	/* Any one byte of the generations' named and the kept files flipped
	 * is refused or encodes back to the flipped bytes. */
	for (size_t i = len - 89; i <= len; i++) {
		size_t k = i == len ? at : i;

		memcpy(copy, buf, len);
		copy[k] ^= 0x41;
		back = NULL;
		if (fdstore_decode(copy, len, &back) != 0) {
			assert_null(back);
			continue;
		}
		assert_encodes_to(back, copy, len);
		fdstore_free(back);
	}
	back = NULL;
	free(copy);

	/* The rules. */
	set_kept(&d->models[2], 0, FDSTORE_NAMED_FILE);
	assert_error(fdstore_check(d), -EINVAL, "model 2 (\"idle\"): tree path named: 2 with no "
		"kept file");
	set_kept(&d->models[2], 1, 3);
	assert_error(fdstore_check(d), -EINVAL, "tree path named: 3 is not 0 to 2");
	set_kept(&d->models[2], FDSTORE_MAX_KEPT + 1, FDSTORE_NAMED_DIR);
	assert_error(fdstore_check(d), -EINVAL, "tree kept file count: 252, more than 251");
	set_kept(&d->models[2], 1, FDSTORE_NAMED_DIR);
	d->models[0].generations[2].named = 3;
	assert_error(fdstore_check(d), -EINVAL, "generation 2 (6): path named: 3 is not 0 to 2");
	d->models[0].generations[2].named = FDSTORE_NAMED_UNRECORDED;
	set_tree(&d->models[1], NULL, 0, 0, NULL, 0);
	set_kept(&d->models[1], 1, FDSTORE_NAMED_DIR);
	assert_error(fdstore_check(d), -EINVAL, "model 1 (\"qwen\"): tree: no root, but its "
		"other fields");
	set_kept(&d->models[1], 0, FDSTORE_NAMED_UNRECORDED);
	assert_int_equal(fdstore_check(d), 0);
	/* Kept files only where the model describes no generation (its
	 * generations tell their own: review rev217 L2). */
	set_kept(&d->models[0], 1, FDSTORE_NAMED_DIR);
	assert_error(fdstore_check(d), -EINVAL, "model 0 (\"llama\"): tree kept files: 1 with 3 "
		"generations described (recorded only where none is)");
	set_kept(&d->models[0], 0, FDSTORE_NAMED_UNRECORDED);
	assert_int_equal(fdstore_check(d), 0);

	/* No generation records what its path named, no tree kept files:
	 * version 9, as before, which a wcached before 10 reads; 1 byte less
	 * per generation and 5 per tree than version 10. */
	for (uint32_t g = 0; g < d->models[0].ngenerations; g++)
		d->models[0].generations[g].named = FDSTORE_NAMED_UNRECORDED;
	set_kept(&d->models[2], 0, FDSTORE_NAMED_UNRECORDED);
	free(buf);
	buf = encode(d, &v9_len);
	assert_int_equal(buf[8], FDSTORE_VERSION_NO_NAMED);
	d->models[0].generations[1].named = FDSTORE_NAMED_DIR;
	other = encode(d, &other_len);
	assert_int_equal(other[8], FDSTORE_VERSION);
	assert_int_equal(other_len, v9_len + 4 + 10); /* 4 generations, 2 trees */
	free(other);
	/* The version 9 store reads back with nothing recorded. */
	d->models[0].generations[1].named = FDSTORE_NAMED_UNRECORDED;
	if (fdstore_decode(buf, v9_len, &back) != 0)
		fail_msg("decode version 9: %s", error_get());
	assert_true(fdstore_equal(d, back));
	for (uint32_t g = 0; g < back->models[0].ngenerations; g++)
		assert_int_equal(back->models[0].generations[g].named, FDSTORE_NAMED_UNRECORDED);
	assert_int_equal(back->models[2].tree.nkept, 0);
	assert_int_equal(back->models[2].tree.named, FDSTORE_NAMED_UNRECORDED);
	assert_encodes_to(back, buf, v9_len);
	fdstore_free(back);
	/* Version 9 bytes called version 10: the first generation's named
	 * byte is its index fdname's length's first byte. */
	buf[8] = FDSTORE_VERSION;
	back = NULL;
	assert_int_not_equal(fdstore_decode(buf, v9_len, &back), 0);
	assert_null(back);
	free(buf);
	fdstore_free(d);
}

/* Kept files of every tree together are bounded (FDSTORE_MAX_KEPT_ALL). */
static void
test_kept_files_in_all(void **state)
{
	struct fdstore_desc *d = calloc(1, sizeof(*d));
	uint32_t n = FDSTORE_MAX_KEPT_ALL / FDSTORE_MAX_KEPT + 1;

	(void)state;
	assert_non_null(d);
	d->status_size = 8 * ((uint64_t)n + 1);
	d->nmodels = n;
	d->models = calloc(n, sizeof(*d->models));
	assert_non_null(d->models);
	for (uint32_t i = 0; i < n; i++) {
		d->models[i].name = dup_name("m%" PRIu32, i);
		d->models[i].path = dup_name("/srv/m%" PRIu32, i);
		d->models[i].slot = i + 1;
		set_tree(&d->models[i], "/srv", 0, 0, NULL, 0);
		set_kept(&d->models[i], i + 1 < n ? FDSTORE_MAX_KEPT : 1, FDSTORE_NAMED_DIR);
	}
	/* (n - 1) * 251 = 65511, and the last: 65512, within 65536. */
	assert_int_equal(fdstore_check(d), 0);
	set_kept(&d->models[n - 1], FDSTORE_MAX_KEPT_ALL - (n - 1) * FDSTORE_MAX_KEPT + 1,
		FDSTORE_NAMED_DIR);
	assert_error(fdstore_check(d), -EINVAL, "tree kept files: more than 65536 in all");
	fdstore_free(d);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_older_versions),
		cmocka_unit_test(test_version_6_artifacts),
		cmocka_unit_test(test_version_8_wait_lines),
		cmocka_unit_test(test_version_9_trees),
		cmocka_unit_test(test_rules),
		cmocka_unit_test(test_hostile_bytes),
		cmocka_unit_test(test_ctimes_without_nlink),
		cmocka_unit_test(test_every_byte_counts),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_carry),
		cmocka_unit_test(test_memfd),
		cmocka_unit_test(test_version_10_named_and_kept),
		cmocka_unit_test(test_kept_files_in_all),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
