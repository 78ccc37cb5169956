/*
 * fuzz_fdstore.c: libFuzzer harness for daemon/fdstore*.c, the description
 * of the registry that wcached will keep in systemd's file descriptor
 * store, and the names of the stored descriptors. Both come back from the
 * store on the next start and are untrusted.
 *
 * Input: the bytes of a description, decoded as they are; and the same
 * bytes up to the first NUL (at most 300) as a FDNAME.
 *
 * Properties checked, beyond "no crash, no leak, no out-of-bounds access":
 *   - a description the decoder accepts passes fdstore_check(), encodes
 *     back to exactly the input when the input is that version (the format
 *     has one encoding for each description: no padding, reserved bytes
 *     zero, holders' uids ascending, no leftover bytes; version 8, 9 or
 *     10 when the oldest that holds it: a model waiting, a model recording
 *     a tree, a generation recording what its path named or a tree its
 *     kept files), and decoding that
 *     again gives an equal description, holders' uids, derived artifacts
 *     and their builders' groups, origins and ctimes included:
 *     decode(encode(x)) == x for every x the decoder can produce;
 *   - a version 10, 9 or 8 input written as an older version (nothing
 *     newer in it) is that version's bytes but for 1 byte per generation
 *     and 5 per tree (10 over 9: what the path named, the kept count) and
 *     2 per model for each of 9 and 8 (a tree's, a wait line's length 0);
 *   - a version 6 input (no builders' groups) decodes to a description
 *     whose artifacts have their builder's gid FDSTORE_GID_UNRECORDED and
 *     no groups, and whose encoding is version 7 and exactly 8 bytes (that
 *     gid and a zero group count) longer per artifact;
 *   - a version 5 input (no holders' uids either) decodes to a description
 *     whose generations have none (nuids 0: the count-only rule) and whose
 *     encoding is 4 bytes (a zero uid count) longer per generation
 *     besides; a version 4 input (no ctimes either), one whose files
 *     also have nlink and ctimes 0 (not recorded), 24 bytes longer per file
 *     besides; a version 3 input (no origins either), one whose files also
 *     have origins 0 and 0, 40 bytes longer per file; a version 2 input (no
 *     artifacts either), one without artifacts and 4 bytes (a zero artifact
 *     count) longer per model besides;
 *   - a refusal leaves *out untouched and says "fdstore:";
 *   - a name fdstore_name_parse() accepts is printed back to the same
 *     string by fdstore_name_index()/_file()/_artifact()/_artifact_index()
 *     (or is a fixed name), and
 *     is a valid FDNAME.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "fdstore.h"
#include "notify.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_description(const uint8_t *data, size_t size)
{
	struct fdstore_desc *d = (struct fdstore_desc *)&d, *again = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	uint32_t waits = 0, trees = 0, named = 0;
	size_t ngenerations = 0;
	int r;

	r = fdstore_decode(data, size, &d);
	if (r < 0) {
		CHECK(d == (struct fdstore_desc *)&d);
		CHECK(r == -EBADMSG || r == -EPROTO || r == -ENOMEM);
		CHECK(strncmp(error_get(), "fdstore: ", 9) == 0);
		return;
	}
	CHECK(r == 0 && d != NULL);
	CHECK(fdstore_check(d) == 0);
	CHECK(fdstore_encode(d, &buf, &len) == 0);
	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_model *m = &d->models[i];

		waits += m->waits != NULL;
		trees += m->tree.root != NULL;
		named += m->tree.nkept > 0;
		CHECK(m->tree.nkept > 0 || m->tree.named == FDSTORE_NAMED_UNRECORDED);
		ngenerations += m->ngenerations;
		for (uint32_t g = 0; g < m->ngenerations; g++)
			named += m->generations[g].named != FDSTORE_NAMED_UNRECORDED;
	}
	/* Written as the oldest version that holds it. */
	CHECK(len >= FDSTORE_HEADER_SIZE &&
		buf[8] == (named > 0 ? FDSTORE_VERSION : trees > 0 ? FDSTORE_VERSION_NO_NAMED :
			   waits > 0 ? FDSTORE_VERSION_NO_TREES : FDSTORE_VERSION_NO_WAITS));
	if (data[8] == buf[8]) {
		CHECK(len == size && memcmp(buf, data, size) == 0);
	} else if (data[8] >= FDSTORE_VERSION_NO_TREES) {
		/* Version 10 with nothing named nor kept, 9 with no tree, or 8
		 * with no wait line: the older version but for what each field
		 * that version lacks took: 1 byte per generation and 5 per tree
		 * (10 over 9), each model's length 0 of its tree (9 over 8) and
		 * of its wait line (8 over 7). */
		size_t more = 0;

		CHECK(buf[8] < data[8] && named == 0);
		CHECK(data[8] <= FDSTORE_VERSION_NO_NAMED || buf[8] == FDSTORE_VERSION_NO_NAMED ||
			trees == 0);
		CHECK(data[8] <= FDSTORE_VERSION_NO_TREES || buf[8] >= FDSTORE_VERSION_NO_TREES ||
			waits == 0);
		if (data[8] == FDSTORE_VERSION)
			more += ngenerations + 5 * (size_t)trees;
		for (uint8_t v = FDSTORE_VERSION_NO_TREES; v <= FDSTORE_VERSION_NO_NAMED; v++)
			if (buf[8] < v && v <= data[8])
				more += 2 * (size_t)d->nmodels;
		CHECK(len + more == size);
	} else {
		size_t files = 0, generations = 0, artifacts = 0;

		CHECK(data[8] >= 2 && data[8] <= 6);
		for (uint32_t i = 0; i < d->nmodels; i++) {
			for (uint32_t a = 0; a < d->models[i].nartifacts; a++) {
				const struct fdstore_artifact *art = &d->models[i].artifacts[a];

				artifacts++;
				CHECK(art->builder_gid == FDSTORE_GID_UNRECORDED &&
					art->builder_ngroups == 0 && art->builder_groups == NULL);
			}
			for (uint32_t g = 0; data[8] <= 5 && g < d->models[i].ngenerations; g++) {
				const struct fdstore_generation *gen = &d->models[i].generations[g];

				generations++;
				CHECK(gen->nuids == 0 && gen->uids == NULL);
				files += gen->nfiles;
				for (uint32_t k = 0; k < gen->nfiles; k++) {
					const struct fdstore_file *f = &gen->files[k];

					CHECK(data[8] == 5 || (f->nlink == 0 && f->ctime_ns == 0 &&
						f->origin_ctime_ns == 0));
					CHECK(data[8] >= 4 ||
						(f->origin_dev == 0 && f->origin_ino == 0));
				}
			}
		}
		CHECK(len == size + 8 * artifacts + 4 * generations +
			(data[8] >= 5 ? 0 : data[8] == 4 ? 24 : 40) * files +
			(data[8] == 2 ? 4 * (size_t)d->nmodels : 0));
		CHECK(memcmp(buf + 12, data + 12, FDSTORE_HEADER_SIZE - 12) == 0);
		for (uint32_t i = 0; data[8] == 2 && i < d->nmodels; i++)
			CHECK(d->models[i].nartifacts == 0 && d->models[i].artifacts == NULL);
	}
	CHECK(fdstore_decode(buf, len, &again) == 0);
	CHECK(fdstore_equal(d, again));
	fdstore_free(again);
	fdstore_free(d);
	free(buf);
}

static void
check_name(const uint8_t *data, size_t size)
{
	struct fdstore_name n;
	char name[301], back[128];
	size_t len = 0;

	while (len < size && len < sizeof(name) - 1 && data[len] != 0)
		len++;
	memcpy(name, data, len);
	name[len] = '\0';
	if (fdstore_name_parse(name, &n) < 0)
		return;
	CHECK(notify_fdname_valid(name, len));
	switch (n.kind) {
	case FDSTORE_NAME_KIND_STATUS:
		CHECK(strcmp(name, FDSTORE_NAME_STATUS) == 0);
		break;
	case FDSTORE_NAME_KIND_DESC:
		CHECK(strcmp(name, FDSTORE_NAME_DESC) == 0);
		break;
	case FDSTORE_NAME_KIND_INDEX:
		CHECK(fdstore_name_index(back, sizeof(back), n.slot, n.generation) > 0);
		CHECK(strcmp(back, name) == 0);
		break;
	case FDSTORE_NAME_KIND_FILE:
		CHECK(fdstore_name_file(back, sizeof(back), n.slot, n.generation, n.file) > 0);
		CHECK(strcmp(back, name) == 0);
		break;
	case FDSTORE_NAME_KIND_ARTIFACT:
		CHECK(fdstore_name_artifact(back, sizeof(back), n.slot, n.artifact) > 0);
		CHECK(strcmp(back, name) == 0);
		break;
	case FDSTORE_NAME_KIND_ARTIFACT_INDEX:
		CHECK(fdstore_name_artifact_index(back, sizeof(back), n.slot, n.artifact) > 0);
		CHECK(strcmp(back, name) == 0);
		break;
	default:
		CHECK(0);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_description(data, size);
	check_name(data, size);
	return 0;
}
