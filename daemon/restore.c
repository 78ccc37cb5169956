/*
 * restore.c: the warm restart's table of what the manager's file
 * descriptor store gave back (see restore.h), and its life: taking it at
 * start-up (restore_take: the description decoded by fdstore_decode(), the
 * status page handed to the registry, the status slots restored), the
 * models whose check still runs carried into every description meanwhile
 * (restore_carried), and closing what no check took
 * (restore_close_untaken) once every configured model has gone through
 * restore_model() (restore_started) and again as each check ends, until
 * the last one frees the table (restore_finish). Each model's check on
 * the work queue and the serving of what it passed are restore_job.c's;
 * restore_adopt.c lists what passed in the registry; restore_store.c puts
 * everything in the store.
 *
 * Every piece that comes back is untrusted: the description is decoded by
 * fdstore_decode(), each model file must be the same inode, size and mtime
 * as described, opened read-only, and still be what the configured path
 * names; each index memfd must be fully sealed, of the described size, and
 * pass index_open() with one file per stored file; the status page is
 * checked by registry_init_stored() (statuspage_adopt). All of that is
 * O(files), so a restart serves again in the same time whatever the
 * models' sizes and tensor counts; each index is then checked record by
 * record on the work queue while it serves (index_check.h), and one that
 * fails is withdrawn and its model loaded afresh (restore_adopt.c).
 *
 * A check may wait for hours on a hung server. Meanwhile the store keeps
 * in step with everything else (restore_store.c): once every configured
 * model has gone through restore_model(), what no check holds leaves the
 * store (restore_started), and every description written afterwards
 * carries the entry of each model whose check runs from the previous one
 * (restore_carried), whose descriptors the restore's table and the check
 * hold, and the manager keeps, under the same names. Each check's end
 * serves what passed and has the manager drop the rest of its model's.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "closer.h"
#include "fdstore.h"
#include "listen.h"
#include "log.h"
#include "notify.h"
#include "proto/memfds.h"
#include "restore.h"
#include "restore_internal.h"

/* How many descriptors the manager's store takes (restore.h): $FDSTORE is
 * read as a limit only when it is all decimal digits. */
size_t
restore_store_max(void)
{
	const char *max = getenv("FDSTORE");
	unsigned long long n = 0;

	if (max == NULL || max[0] == '\0' || strspn(max, "0123456789") != strlen(max))
		return FDSTORE_MAX_FDS;
	for (const char *p = max; *p != '\0' && n <= FDSTORE_MAX_FDS; p++)
		n = n * 10 + (unsigned long long)(*p - '0');
	return n < FDSTORE_MAX_FDS ? (size_t)n : FDSTORE_MAX_FDS;
}

/* Is there a store to use (restore.h)? One that cannot hold the status
 * page and the description is none: nothing would come back. */
int
restore_enabled(void)
{
	const char *ns = getenv("NOTIFY_SOCKET");
	size_t max;

	if (ns == NULL || ns[0] == 0 || (max = restore_store_max()) == 0)
		return 0;
	if (max < 2) {
		log_warnx("warm restart: the file descriptor store takes %zu descriptor "
			  "($FDSTORE, FileDescriptorStoreMax=), not the 2 a description needs at "
			  "least; nothing is stored, and a restart loads every model afresh", max);
		return 0;
	}
	return 1;
}

/* The stored descriptor called name, or -1; *at its place in s->fds. */
int
restore_find_fd(const struct restore *s, const char *name, size_t *at)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->fds[i].fd >= 0 && strcmp(s->fds[i].name, name) == 0) {
			if (at != NULL)
				*at = i;
			return s->fds[i].fd;
		}
	return -1;
}

/* How many stored descriptors not taken yet are called name. */
static size_t
count_named(const struct restore *s, const char *name)
{
	size_t k = 0;

	for (size_t i = 0; i < s->n; i++)
		k += s->fds[i].fd >= 0 && strcmp(s->fds[i].name, name) == 0;
	return k;
}

/* Does the entry of a model whose check still runs name name? */
static int
carried_name(const char *name)
{
	for (size_t i = 0; i < restore_state.ncarried; i++)
		if (fdstore_model_names(restore_state.carried[i].model, name))
			return 1;
	return 0;
}

int
restore_mounts(struct restore *s)
{
	/* Not read (or it failed): read now; a failure is tried again at
	 * the next call. */
	if (!s->mounts_read && fstype_mounts_read("/proc/self/mountinfo", &s->mounts) == 0)
		s->mounts_read = 1;
	return s->mounts_read ? 0 : -1;
}

/* The device the description gives the stored model file called name
 * (FDSTORE_NAME_KIND_FILE), or 0 where it describes no such file. */
static uint64_t
described_dev(const struct restore *s, const char *name)
{
	struct fdstore_name n;

	if (s->desc == NULL || fdstore_name_parse(name, &n) < 0 ||
		n.kind != FDSTORE_NAME_KIND_FILE)
		return 0;
	for (uint32_t i = 0; i < s->desc->nmodels; i++) {
		const struct fdstore_model *m = &s->desc->models[i];

		for (uint32_t k = 0; m->slot == n.slot && k < m->ngenerations; k++)
			for (uint32_t j = 0; j < m->generations[k].nfiles; j++)
				if (strcmp(m->generations[k].files[j].fdname, name) == 0)
					return m->generations[k].files[j].dev;
	}
	return 0;
}

/*
 * The daemon's own lane (closer_unmap_close) of the stored descriptor fd,
 * called name, that no model took: CLOSER_LOCAL's for a memfd (an index,
 * an artifact: F_GET_SEALS asks no filesystem) and for a model file the
 * description puts on a local filesystem (its device in the mount table,
 * which asks none either); CLOSER_DAEMON's, the lane of remote
 * generations' files, for one on a remote filesystem or on one not known.
 * So local files and memfds never wait behind a remote server's close
 * (closer.h; review rev197 F4').
 */
static uid_t
untaken_lane(struct restore *s, const char *name, int fd)
{
	struct fs_info fs;
	uint64_t dev;

	if (fcntl(fd, F_GET_SEALS) >= 0)
		return CLOSER_LOCAL;
	if ((dev = described_dev(s, name)) == 0 || restore_mounts(s) < 0 ||
		fstype_mounts_find(&s->mounts, (dev_t)dev, &fs) < 0 || fs.remote)
		return CLOSER_DAEMON;
	return CLOSER_LOCAL;
}

/*
 * Closes the stored descriptors not taken that model only names (with
 * only NULL: that no model whose check still runs names, which its check
 * may take yet) and, when drop, asks the manager to drop them (the
 * description's is replaced by restore_sync()). No name dropped here is
 * named again: a new generation or artifact takes a number none stored
 * has, and a name the description gives belongs to one model. They close
 * in a lane of the daemon's own of r's closer (closer_unmap_close; no
 * client's descriptor goes there; untaken_lane says which), not here: a
 * model file on remote storage flushes on close, and an artifact's memfd
 * frees its memory (review rev193 F4).
 */
void
restore_close_untaken(struct restore *s, struct registry *r, const struct fdstore_model *only,
	int drop)
{
	unsigned closed = 0;

	for (size_t i = 0; i < s->n; i++) {
		const char *name = s->fds[i].name;

		if (s->fds[i].fd < 0 ||
			(only != NULL ? !fdstore_model_names(only, name) : carried_name(name)))
			continue;
		closer_unmap_close(r->closer, untaken_lane(s, name, s->fds[i].fd), NULL, 0,
			s->fds[i].fd);
		s->fds[i].fd = -1;
		closed++;
		if (drop && strcmp(name, FDSTORE_NAME_DESC) != 0)
			(void)notify_remove_fds(name);
	}
	if (closed > 0 && only != NULL)
		log_info("model \"%s\": %u stored descriptor%s not used, closed", only->name,
			closed, closed == 1 ? "" : "s");
	else if (closed > 0)
		log_info("warm restart: %u stored descriptor%s not used, closed", closed,
			closed == 1 ? "" : "s");
}

/* m's check runs (expected: registry_expect()'s token): descriptions
 * carry its entry meanwhile (restore_describe). */
void
restore_carry_begin(const struct fdstore_model *m, uint64_t expected)
{
	restore_state.carried[restore_state.ncarried++] =
		(struct restore_carried){ .model = m, .expected = expected };
}

/* m's check has ended: what it passed is the registry's now, the rest
 * leaves the store. */
void
restore_carry_end(const struct fdstore_model *m)
{
	for (size_t i = 0; i < restore_state.ncarried; i++)
		if (restore_state.carried[i].model == m) {
			restore_state.carried[i] = restore_state.carried[--restore_state.ncarried];
			return;
		}
}

/* Frees s and closes what it still holds (listen_fds_free). */
static void
restore_free(struct restore *s)
{
	listen_fds_free(s->fds, s->n);
	fdstore_free(s->desc);
	free(s->restored);
	for (size_t i = 0; i < s->ncopies; i++)
		free(s->copies[i]);
	free(s->copies);
	fstype_mounts_free(&s->mounts);
	free(s);
}

/* Takes the store back at start-up (restore.h). */
struct restore *
restore_take(void)
{
	struct listen_fd *all = NULL;
	struct restore *s;
	size_t n = 0, k = 0, at = 0;
	uint8_t *buf = NULL;
	size_t len = 0;
	int r;

	if (listen_fds_list(&all, &n) < 0) {
		log_warnx("warm restart: %s; loading every model afresh", error_get());
		return NULL;
	}
	if ((s = calloc(1, sizeof(*s))) == NULL ||
		(n > 0 && (s->fds = calloc(n, sizeof(*s->fds))) == NULL))
		fatalx("out of memory");
	s->status_fd = -1;
	/* Keep the "wc-..." ones; the sockets stay for listen_fds_take(). */
	for (size_t i = 0; i < n; i++)
		if (strncmp(all[i].name, FDSTORE_NAME_PREFIX, strlen(FDSTORE_NAME_PREFIX)) == 0) {
			s->fds[k++] = all[i];
			all[i].name = NULL;
		}
	listen_fds_free(all, n);
	s->n = k;
	if (k == 0) {
		restore_free(s);
		return NULL;
	}
	restore_state.restoring = 1;
	/* Whatever description the manager has, the next one replaces it. */
	restore_state.desc_in_store = count_named(s, FDSTORE_NAME_DESC) > 0;
	if (count_named(s, FDSTORE_NAME_DESC) != 1) {
		log_warnx("warm restart: %zu stored descriptions (\"%s\"), not one; loading every "
			  "model afresh", count_named(s, FDSTORE_NAME_DESC), FDSTORE_NAME_DESC);
		return s;
	}
	r = restore_find_fd(s, FDSTORE_NAME_DESC, &at);
	if (fdstore_memfd_read(r, &buf, &len) < 0 || fdstore_decode(buf, len, &s->desc) < 0) {
		log_warnx("warm restart: the stored description: %s; loading every model afresh",
			error_get());
		s->desc = NULL;
	}
	free(buf);
	close(s->fds[at].fd);
	s->fds[at].fd = -1;
	if (s->desc == NULL)
		return s;
	if ((s->restored = calloc(s->desc->nmodels + 1, 1)) == NULL ||
		(restore_state.carried = calloc(s->desc->nmodels + 1,
			 sizeof(*restore_state.carried))) == NULL)
		fatalx("out of memory");
	/* An artifact stored from now on takes a number none of these has,
	 * taken back or not (a removal may still be on its way). */
	for (uint32_t i = 0; i < s->desc->nmodels; i++)
		for (uint32_t a = 0; a < s->desc->models[i].nartifacts; a++) {
			struct fdstore_name parsed;

			if (fdstore_name_parse(s->desc->models[i].artifacts[a].fdname,
					&parsed) == 0 &&
				parsed.artifact > restore_state.last_artifact)
				restore_state.last_artifact = parsed.artifact;
		}
	if (s->desc->status_size != STATUS_PAGE_BYTES)
		log_warnx("warm restart: the stored status page is described as %" PRIu64
			  " bytes, not %u; not used", s->desc->status_size, STATUS_PAGE_BYTES);
	else if (count_named(s, FDSTORE_NAME_STATUS) == 1)
		s->status_fd = restore_find_fd(s, FDSTORE_NAME_STATUS, NULL);
	else
		log_warnx("warm restart: %zu stored status pages, not one; not used",
			count_named(s, FDSTORE_NAME_STATUS));
	return s;
}

/* The stored status page, -1 when none (restore.h). */
int
restore_status_fd(const struct restore *s)
{
	return s != NULL ? s->status_fd : -1;
}

/* The registry owns the stored status page now (restore.h). */
void
restore_status_taken(struct restore *s)
{
	size_t at;

	if (s == NULL || s->status_fd < 0 || restore_find_fd(s, FDSTORE_NAME_STATUS, &at) < 0)
		return;
	s->fds[at].fd = -1;
	s->status_taken = 1;
	restore_state.status_stored = 1; /* the manager has it already */
}

/* The previous process's status slots and numbers (restore.h). */
void
restore_slots(struct restore *s, struct registry *r)
{
	if (s == NULL || s->desc == NULL)
		return;
	for (uint32_t i = 0; i < s->desc->nmodels; i++) {
		const struct fdstore_model *m = &s->desc->models[i];

		if (m->slot >= STATUS_SLOTS ||
			statuspage_restore_slot(&r->page, (unsigned)m->slot, m->name,
				m->last_generation) < 0)
			log_warnx("warm restart: model \"%s\": status slot %" PRIu64
				" not restored: %s", m->name, m->slot, error_get());
	}
}

/* The staged copies the checks keep (restore.h). */
void
restore_copies(const struct restore *s, char *const **dirs, size_t *n)
{
	*dirs = s != NULL ? s->copies : NULL;
	*n = s != NULL ? s->ncopies : 0;
}

/* Does a model serve in the status slot slot (loaded afresh while other
 * models' checks ran)? */
static int
serves_slot(const struct registry *r, unsigned slot)
{
	for (const struct model_entry *m = r->models; m != NULL; m = m->next)
		if (m->slot == slot && m->current != NULL)
			return 1;
	return 0;
}

/* Every check has ended: closes what nobody took, and frees s. */
void
restore_finish(struct restore *s, struct registry *r)
{
	if (s != NULL) {
		/* A slot whose model is not served again says so until it is
		 * (statuspage_publish: its last number, retired): its holders
		 * see stale, as they should. Not when stopping:
		 * the store keeps everything for the next process. */
		for (uint32_t i = 0; !r->closing && s->desc != NULL && i < s->desc->nmodels; i++) {
			uint64_t slot = s->desc->models[i].slot;

			if (!s->restored[i] && s->status_taken && slot > 0 && slot < STATUS_SLOTS &&
				!serves_slot(r, (unsigned)slot))
				statuspage_publish(&r->page, (unsigned)slot, 0);
		}
		restore_close_untaken(s, r, NULL, !r->closing);
		restore_free(s);
	}
	free(restore_state.carried);
	restore_state.carried = NULL;
	restore_state.ncarried = 0;
	restore_state.restoring = 0;
	restore_sync(r);
	/* Every stored model is adopted (or loads afresh): main.c starts
	 * their full checks (restore_checks) once it serves. */
}

/* Every configured model went through restore_model() (restore.h). */
void
restore_started(struct restore *s, struct registry *r)
{
	if (s == NULL || s->jobs == 0) {
		restore_finish(s, r);
		return;
	}
	s->started = 1;
	log_info("warm restart: checking the stored files of %u model%s on the work queue", s->jobs,
		s->jobs == 1 ? "" : "s");
	/* What no check holds leaves the store before anything new goes in
	 * (restore_sync flushes the removals first): a generation stored
	 * before a crash but never described may have the name the next one
	 * takes. From now on the store keeps in step with the registry, each
	 * model whose check runs as the previous process stored it. */
	restore_close_untaken(s, r, NULL, 1);
	restore_state.restoring = 0;
	restore_sync(r);
}
