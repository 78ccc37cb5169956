/*
 * restore_rules.c: the rules a derived artifact taken back from the store
 * must still obey beyond its bytes' checks (restore_job.c), so that a warm
 * restart keeps only what a PUBLISH and the configuration would let in
 * now (review rev181 F10, F6):
 *
 *   - the limits a publication is held to (derive.h): the head its reader
 *     parses (DERIVE_MAX_HEAD) and the compiled index wcached keeps
 *     (DERIVE_MAX_INDEX). An artifact stored by a wcached without them, or
 *     under larger ones, was taken back whatever its size; checked on the
 *     work queue before anything is parsed (restore_artifact_limits). And
 *     with a memory_budget, the artifact alone within it
 *     (restore_artifact_fits, on the loop; without one, a PUBLISH weighs
 *     it against the memory limit in force, derive.c's to know, which the
 *     warm restart does not: the previous process's artifacts are charged
 *     to the same cgroup already);
 *   - the model's configuration now: with derive = no its artifacts are
 *     not taken back (a reload that turns derive off drops them too,
 *     reload.c), and one whose builder may no longer build (derive_groups
 *     narrowed) is not either (restore_builder_allowed, on the loop, with
 *     the builder's groups looked up on the work queue:
 *     restore_builder_lookup).
 *
 * Since version 7 the store records the builder's gid and supplementary
 * groups as its connection had them when it published, which are what the
 * live check (registry_may_build, with the peer's groups from the socket)
 * judged: the restart judges those, as it would that connection now, with
 * no user database asked (restore_builder_stored). A uid the database does
 * not know, as a fleet's numeric pod uids are not in wcached's container's
 * /etc/passwd, keeps its artifacts while its groups are allowed.
 *
 * Only an artifact of a version 3 to 6 description, which records the
 * builder's uid alone, has its groups asked of the user database (its
 * primary group and getgrouplist(): restore_builder_lookup); a uid the
 * database does not know may build then only as root or wcached's own uid
 * do: its artifact is built again rather than kept on a guess.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/error.h"
#include "derive.h"
#include "fdstore.h"
#include "nss.h"
#include "registry.h"
#include "restore_internal.h"

int
restore_artifact_limits(int fd, const struct fdstore_artifact *a)
{
	uint64_t head;

	/* Its index is the one its memfd compiles to (checked after the
	 * parse): its stored size is the compiled index's. */
	if (a->index_size > DERIVE_MAX_INDEX)
		return error_set(-EFBIG, "its compiled index is %.1f MiB, more than the %u MiB "
			"one derived artifact's index may be (a PUBLISH of it is refused)",
			(double)a->index_size / 1048576.0, DERIVE_MAX_INDEX >> 20);
	/* The head its reader would read and parse, from its first bytes, as
	 * PUBLISH measures it before the parse (a head the reader finds
	 * implausible is the reader's to explain). */
	head = derive_head_len(fd, a->size);
	if (head > DERIVE_MAX_HEAD)
		return error_set(-EFBIG, "its header is %.1f MiB, more than the %u MiB a derived "
			"artifact's header may be (a PUBLISH of it is refused)",
			(double)head / 1048576.0, DERIVE_MAX_HEAD >> 20);
	return 0;
}

int
restore_artifact_fits(const struct registry *r, const struct fdstore_artifact *a)
{
	uint64_t bytes;

	/* As PUBLISH weighs it: the memfd and its compiled index. */
	if (__builtin_add_overflow(a->size, a->index_size, &bytes))
		bytes = UINT64_MAX;
	if (r->memory_budget == 0 || bytes <= r->memory_budget)
		return 0;
	return error_set(-EFBIG, "%" PRIu64 " MiB (%" PRIu64 " MiB of memfd and %" PRIu64 " KiB "
		"of compiled index) is more than memory_budget (%" PRIu64 " MiB) (a PUBLISH of it "
		"is refused)", bytes >> 20, a->size >> 20, a->index_size >> 10,
		r->memory_budget >> 20);
}

int
restore_builder_lookup(uid_t uid, struct restore_builder *out)
{
	struct passwd *pw;
	gid_t *groups = NULL;
	int ngroups = 0, err;

	*out = (struct restore_builder){ .uid = uid, .gid = (gid_t)-1 };
	/* Root and wcached's own uid may always build: nothing to look up. */
	if (uid == 0 || uid == geteuid())
		return 0;
	if ((pw = nss_user_by_uid(uid, &err)) == NULL) {
		if (err == ENOMEM)
			return error_set(-ENOMEM, "out of memory");
		/* Not known (0), or the database could not be asked: no groups. */
		out->lookup_err = err;
		return 0;
	}
	err = nss_groups(pw, &groups, &ngroups);
	if (err == -ENOMEM) {
		free(pw);
		return error_set(-ENOMEM, "out of memory");
	}
	if (err < 0) {
		/* In more groups than the kernel's most: none of them counts. */
		free(pw);
		out->lookup_err = -err;
		return 0;
	}
	out->known = 1;
	out->gid = pw->pw_gid;
	free(pw);
	out->groups = groups;
	out->ngroups = ngroups;
	return 0;
}

int
restore_builder_stored(const struct fdstore_artifact *a, struct restore_builder *out)
{
	gid_t *groups = NULL;

	if (a->builder_ngroups > 0) {
		if ((groups = malloc(a->builder_ngroups * sizeof(*groups))) == NULL)
			return error_set(-ENOMEM, "out of memory");
		for (uint32_t k = 0; k < a->builder_ngroups; k++)
			groups[k] = (gid_t)a->builder_groups[k];
	}
	*out = (struct restore_builder){ .uid = (uid_t)a->builder_uid, .stored = 1,
		.known = 1, .gid = (gid_t)a->builder_gid, .groups = groups,
		.ngroups = (int)a->builder_ngroups };
	return 0;
}

int
restore_builder_copy(const struct restore_builder *from, struct restore_builder *out)
{
	gid_t *groups = NULL;

	if (from->ngroups > 0) {
		if ((groups = malloc((size_t)from->ngroups * sizeof(*groups))) == NULL)
			return error_set(-ENOMEM, "out of memory");
		memcpy(groups, from->groups, (size_t)from->ngroups * sizeof(*groups));
	}
	*out = *from;
	out->groups = groups;
	return 0;
}

void
restore_builder_clear(struct restore_builder *b)
{
	if (b == NULL)
		return;
	free(b->groups);
	b->groups = NULL;
	b->ngroups = 0;
}

int
restore_builder_allowed(const struct model_entry *e, const struct restore_builder *b)
{
	struct registry_peer peer = { .uid = b->uid, .gid = b->gid, .groups = b->groups,
		.ngroups = b->ngroups, .self_uid = geteuid() };

	if (!e->derive)
		return error_set(-ENOTSUP, "derive is off now (derive = no), as a reload that "
			"turns it off drops the model's artifacts");
	if (registry_may_build(e, &peer))
		return 0;
	if (b->stored)
		return error_set(-EPERM, "its builder uid %" PRIu32 " may not build it now: "
			"none of its groups (gid %" PRIu32 " and %d supplementary, as its "
			"connection had them when it published) is in derive_groups",
			(uint32_t)b->uid, (uint32_t)b->gid, b->ngroups);
	if (b->lookup_err != 0)
		return error_set(-EPERM, "its builder uid %" PRIu32 " may not build it now: the "
			"user database could not be asked for its groups (%s), and derive_groups "
			"lets it in by none", (uint32_t)b->uid, strerror(b->lookup_err));
	if (!b->known)
		return error_set(-EPERM, "its builder uid %" PRIu32 " may not build it now: the "
			"user database has no entry for it, so no group of it is in derive_groups "
			"(the groups it built with are not stored)", (uint32_t)b->uid);
	return error_set(-EPERM, "its builder uid %" PRIu32 " may not build it now: none of "
		"its groups (primary %" PRIu32 " and %d in all, by the user database) is in "
		"derive_groups", (uint32_t)b->uid, (uint32_t)b->gid, b->ngroups);
}
