/*
 * restore.c: the warm restart (see restore.h): what wcached puts in the
 * manager's file descriptor store, and how it takes it back.
 *
 * Every piece that comes back is untrusted: the description is decoded by
 * fdstore_decode(), each model file must be the same inode, size and mtime
 * as described, opened read-only, and still be what the configured path
 * names; each index memfd must be fully sealed, of the described size, and
 * pass index_open() with one file per stored file; the status page is
 * checked by registry_init_stored(). All of that is O(files), so a restart
 * serves again in the same time whatever the models' sizes and tensor
 * counts; each index is then checked record by record on the work queue
 * while it serves (index_check.h), and one that fails is withdrawn and its
 * model loaded afresh (registry_restore_checked).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "fdstore.h"
#include "generation.h"
#include "index.h"
#include "log.h"
#include "memfds.h"
#include "notify.h"
#include "restore.h"

#define INDEX_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct restore {
	struct listen_fd *fds; /* the "wc-..." ones; fd -1 once taken */
	size_t n;
	struct fdstore_desc *desc;
	int status_fd;         /* -1 once the registry took it, or none */
	int status_taken;
	unsigned char *restored; /* per described model */
};

/* Between restore_take() and restore_finish(): nothing is stored, so that
 * the untaken entries are removed before new ones go in. */
static int restoring;
static int status_stored;
static uint64_t described; /* describe_hash() of the stored description, 0: none */
static int desc_in_store;  /* a description is in the store: remove it before the next */

/* A store the manager's full queue refused is tried again by the next
 * restore_sync() (every 200 ms): logged at debug only. */
static void
log_not_stored(int err, const char *what)
{
	if (err == -EAGAIN)
		log_debug("%s: not stored yet: %s", what, error_get());
	else
		log_warnx("%s is not stored (%s); a restart loads it afresh", what, error_get());
}

int
restore_enabled(void)
{
	const char *ns = getenv("NOTIFY_SOCKET"), *max = getenv("FDSTORE");

	return ns != NULL && ns[0] != 0 && (max == NULL || strcmp(max, "0") != 0);
}

/* The stored descriptor called name, or -1; *at its place in s->fds. */
static int
find_fd(const struct restore *s, const char *name, size_t *at)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->fds[i].fd >= 0 && strcmp(s->fds[i].name, name) == 0) {
			if (at != NULL)
				*at = i;
			return s->fds[i].fd;
		}
	return -1;
}

static size_t
count_named(const struct restore *s, const char *name)
{
	size_t k = 0;

	for (size_t i = 0; i < s->n; i++)
		k += s->fds[i].fd >= 0 && strcmp(s->fds[i].name, name) == 0;
	return k;
}

/* Closes every stored descriptor not taken and asks the manager to drop
 * them (except the description's, replaced by restore_sync()). */
static void
close_untaken(struct restore *s)
{
	unsigned closed = 0;

	for (size_t i = 0; i < s->n; i++) {
		if (s->fds[i].fd < 0)
			continue;
		close(s->fds[i].fd);
		s->fds[i].fd = -1;
		closed++;
		if (strcmp(s->fds[i].name, FDSTORE_NAME_DESC) != 0)
			(void)notify_remove_fds(s->fds[i].name);
	}
	if (closed > 0)
		log_info("warm restart: %u stored descriptor%s not used, closed", closed,
			closed == 1 ? "" : "s");
}

static void
restore_free(struct restore *s)
{
	listen_fds_free(s->fds, s->n);
	fdstore_free(s->desc);
	free(s->restored);
	free(s);
}

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
	restoring = 1;
	/* Whatever description the manager has, the next one replaces it. */
	desc_in_store = count_named(s, FDSTORE_NAME_DESC) > 0;
	if (count_named(s, FDSTORE_NAME_DESC) != 1) {
		log_warnx("warm restart: %zu stored descriptions (\"%s\"), not one; loading every "
			  "model afresh", count_named(s, FDSTORE_NAME_DESC), FDSTORE_NAME_DESC);
		return s;
	}
	r = find_fd(s, FDSTORE_NAME_DESC, &at);
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
	if ((s->restored = calloc(s->desc->nmodels + 1, 1)) == NULL)
		fatalx("out of memory");
	if (s->desc->status_size != STATUS_PAGE_BYTES)
		log_warnx("warm restart: the stored status page is described as %" PRIu64
			  " bytes, not %u; not used", s->desc->status_size, STATUS_PAGE_BYTES);
	else if (count_named(s, FDSTORE_NAME_STATUS) == 1)
		s->status_fd = find_fd(s, FDSTORE_NAME_STATUS, NULL);
	else
		log_warnx("warm restart: %zu stored status pages, not one; not used",
			count_named(s, FDSTORE_NAME_STATUS));
	return s;
}

int
restore_status_fd(const struct restore *s)
{
	return s != NULL ? s->status_fd : -1;
}

void
restore_status_taken(struct restore *s)
{
	size_t at;

	if (s == NULL || s->status_fd < 0 || find_fd(s, FDSTORE_NAME_STATUS, &at) < 0)
		return;
	s->fds[at].fd = -1;
	s->status_taken = 1;
	status_stored = 1; /* the manager has it already */
}

void
restore_slots(struct restore *s, struct registry *r)
{
	if (s == NULL || s->desc == NULL)
		return;
	for (uint32_t i = 0; i < s->desc->nmodels; i++) {
		const struct fdstore_model *m = &s->desc->models[i];

		if (m->slot >= STATUS_SLOTS ||
			registry_restore_slot(r, (unsigned)m->slot, m->name, m->last_generation) < 0)
			log_warnx("warm restart: model \"%s\": status slot %" PRIu64 " not restored: %s",
				m->name, m->slot, error_get());
	}
}

/* The directory the model's files are in: path itself, or its parent. */
static int
files_dir(const char *path, char *dir, size_t cap)
{
	struct stat st;
	const char *slash;

	if (stat(path, &st) == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		if (snprintf(dir, cap, "%s", path) >= (int)cap)
			return error_set(-ENAMETOOLONG, "%s: path too long", path);
		return 0;
	}
	slash = strrchr(path, '/');
	if (slash == NULL)
		return snprintf(dir, cap, ".") < 0 ? -EINVAL : 0;
	if ((size_t)(slash - path) + 1 > cap)
		return error_set(-ENAMETOOLONG, "%s: path too long", path);
	memcpy(dir, path, (size_t)(slash - path));
	dir[slash - path] = 0;
	if (dir[0] == 0)
		snprintf(dir, cap, "/");
	return 0;
}

/* st's mtime in nanoseconds since the epoch, as the store describes it;
 * times past the year 2262 (or before 1678) saturate instead of
 * overflowing. */
static int64_t
mtime_ns(const struct stat *st)
{
	int64_t ns;

	if (__builtin_mul_overflow((int64_t)st->st_mtim.tv_sec, (int64_t)1000000000, &ns) ||
		__builtin_add_overflow(ns, (int64_t)st->st_mtim.tv_nsec, &ns))
		return st->st_mtim.tv_sec < 0 ? INT64_MIN : INT64_MAX;
	return ns;
}

static int
same_file(const struct stat *st, const struct fdstore_file *f)
{
	int64_t mtime = mtime_ns(st);

	return S_ISREG(st->st_mode) && (uint64_t)st->st_dev == f->dev &&
		(uint64_t)st->st_ino == f->ino && (uint64_t)st->st_size == f->size &&
		mtime == f->mtime_ns;
}

/* Checks the stored index memfd of g: sealed, its size, a valid index
 * header for g's file count (O(1): the records are checked later, see
 * above). 0 or -EINVAL with the reason. */
static int
check_index(int fd, const struct fdstore_generation *g, struct index_header *h, void **map)
{
	struct stat st;
	int seals;

	if (fd < 0)
		return error_set(-EINVAL, "its index memfd \"%s\" is not in the store", g->index_fdname);
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != g->index_size ||
		g->index_size == 0 || g->index_size > SIZE_MAX)
		return error_set(-EINVAL, "its index memfd is not %" PRIu64 " bytes", g->index_size);
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 || (seals & INDEX_SEALS) != INDEX_SEALS)
		return error_set(-EINVAL, "its index memfd is not sealed");
	*map = mmap(NULL, (size_t)g->index_size, PROT_READ, MAP_SHARED, fd, 0);
	if (*map == MAP_FAILED)
		return error_set(-errno, "mapping its index: %s", strerror(errno));
	if (index_open(*map, (size_t)g->index_size, h) < 0 || h->file_count != g->nfiles) {
		munmap(*map, (size_t)g->index_size);
		return error_set(-EINVAL, "its index is not valid for %" PRIu32 " files", g->nfiles);
	}
	return 0;
}

/* Checks stored file k of g (index mapped at blob) and maps it into *out,
 * which then owns the descriptor. */
static int
take_file(struct restore *s, const char *dir, const struct fdstore_generation *g, uint32_t k,
	const uint8_t *blob, const struct index_header *h, struct wc_file *out)
{
	const struct fdstore_file *f = &g->files[k];
	const char *fname;
	char full[PATH_MAX];
	struct stat st;
	uint64_t size;
	size_t at;
	int fd = find_fd(s, f->fdname, &at), fl;

	if (fd < 0)
		return error_set(-EINVAL, "file %" PRIu32 " (\"%s\") is not in the store", k, f->fdname);
	if (index_file_at(blob, h, k, &fname, &size) < 0 || size != f->size)
		return error_set(-EINVAL, "file %" PRIu32 ": the index disagrees with the description", k);
	if (fstat(fd, &st) == -1 || !same_file(&st, f))
		return error_set(-EINVAL, "file %s: not the inode, size and mtime described", fname);
	if ((fl = fcntl(fd, F_GETFL)) == -1 || (fl & O_ACCMODE) != O_RDONLY)
		return error_set(-EINVAL, "file %s: not open read-only", fname);
	/* The name comes from the stored index: a plain name in dir, as every
	 * load compiles it, or the stat below would check another file. */
	if (fname[0] == '\0' || strchr(fname, '/') != NULL || strcmp(fname, ".") == 0 ||
		strcmp(fname, "..") == 0)
		return error_set(-EINVAL, "file %" PRIu32 ": the stored index names it \"%.64s\", "
			"not a file name", k, fname);
	if (snprintf(full, sizeof(full), "%s/%s", dir, fname) >= (int)sizeof(full))
		return error_set(-ENAMETOOLONG, "file %s: path too long", fname);
	/* A held generation's files were replaced: that is why it is old. */
	if (g->role == FDSTORE_CURRENT && (stat(full, &st) == -1 || !same_file(&st, f)))
		return error_set(-EINVAL, "%s was replaced or changed since it was stored", full);
	if (file_from_fd(fd, full, out) < 0)
		return -EINVAL;
	s->fds[at].fd = -1;
	return 0;
}

/* Checks every piece of m's stored generation g and serves it: as the
 * current one, or (FDSTORE_HELD) as one its holders may HOLD. */
static int
adopt(struct restore *s, struct registry *r, const struct fdstore_model *m,
	const struct fdstore_generation *g, const char *path, enum pin_mode pin, int warm)
{
	struct model_source src = { .format = FORMAT_SAFETENSORS };
	struct index_header h;
	char dir[PATH_MAX];
	void *map = NULL;
	size_t at = 0;
	int ifd = find_fd(s, g->index_fdname, &at), err;

	if ((err = check_index(ifd, g, &h, &map)) < 0)
		return err;
	if ((src.files = calloc(g->nfiles, sizeof(*src.files))) == NULL) {
		munmap(map, (size_t)g->index_size);
		return error_set(-ENOMEM, "out of memory");
	}
	if ((err = files_dir(path, dir, sizeof(dir))) == 0)
		for (uint32_t k = 0; k < g->nfiles && err == 0; k++)
			if ((err = take_file(s, dir, g, k, map, &h, &src.files[k])) == 0)
				src.nfiles = k + 1;
	munmap(map, (size_t)g->index_size);
	if (err == 0 && g->role == FDSTORE_CURRENT)
		err = registry_adopt(r, m->name, path, pin, warm, g->number, &src, ifd,
			(size_t)g->index_size);
	else if (err == 0)
		err = registry_adopt_held(r, m->name, g->number, &src, ifd, (size_t)g->index_size,
			g->holders);
	if (err == 0) {
		struct model_entry *e = registry_find(r, m->name);
		struct generation *k = registry_generation(r, e, g->number);

		s->fds[at].fd = -1;
		/* Its holders before the restart may say so (HOLD), as many of
		 * them as there were; a held one waits already. */
		if (g->role == FDSTORE_CURRENT)
			registry_await_holds(r, k, g->holders);
		/* The manager still has every piece under these names. */
		k->stored_slot = e->slot;
		k->stored_done = e->slot == m->slot;
	}
	/* On failure the files taken are closed here, not by close_untaken():
	 * ask the manager to drop them too. */
	for (size_t k = 0; err < 0 && k < src.nfiles; k++)
		(void)notify_remove_fds(g->files[k].fdname);
	source_close(&src); /* the files, on failure; zeroed on success */
	return err;
}

/* After m's current generation came back: the generations workers held
 * before the restart, each waiting restart_hold_ms for their HOLDs. */
static void
adopt_held(struct restore *s, struct registry *r, const struct fdstore_model *m,
	const char *path)
{
	for (uint32_t k = 0; k < m->ngenerations; k++) {
		const struct fdstore_generation *g = &m->generations[k];

		if (g->role != FDSTORE_HELD)
			continue;
		if (adopt(s, r, m, g, path, PIN_NONE, 0) < 0)
			log_warnx("model \"%s\": generation %" PRIu64 ", held before the restart, "
				  "not restored: %s; its holders' mappings stay valid",
				m->name, g->number, error_get());
		else
			log_info("model \"%s\": generation %" PRIu64 ", held by workers before the "
				 "restart, restored; waiting %.3g s for them to say so (HOLD)",
				m->name, g->number, r->restart_hold_ms / 1000.0);
	}
}

int
restore_model(struct restore *s, struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm)
{
	const struct fdstore_model *m = NULL;
	const struct fdstore_generation *g = NULL;
	uint32_t i;

	if (s == NULL || s->desc == NULL)
		return 0;
	for (i = 0; i < s->desc->nmodels && m == NULL; i++)
		if (strcmp(s->desc->models[i].name, name) == 0)
			m = &s->desc->models[i];
	if (m == NULL) {
		log_info("model \"%s\": not in the file descriptor store; loading", name);
		return 0;
	}
	for (uint32_t k = 0; k < m->ngenerations; k++)
		if (m->generations[k].role == FDSTORE_CURRENT)
			g = &m->generations[k];
	if (!s->status_taken)
		log_info("model \"%s\": not restored: the stored status page was not usable; loading",
			name);
	else if (strcmp(m->path, path) != 0)
		log_info("model \"%s\": not restored: its path changed (was %s); loading", name,
			m->path);
	else if (g == NULL)
		log_info("model \"%s\": not restored: no current generation was stored; loading", name);
	else if (g->pin != (uint8_t)pin)
		log_info("model \"%s\": not restored: its pin changed (was %s); loading", name,
			pin_mode_name((enum pin_mode)g->pin));
	else if (adopt(s, r, m, g, path, pin, warm) < 0)
		log_warnx("model \"%s\": not restored: %s; loading", name, error_get());
	else {
		const struct model_entry *e = registry_find(r, name);

		s->restored[i - 1] = 1;
		adopt_held(s, r, m, path);
		log_info("model \"%s\": generation %" PRIu64 " restored from the file descriptor "
			 "store: %" PRIu32 " file%s, %" PRIu64 " bytes, not read again",
			name, g->number, g->nfiles, g->nfiles == 1 ? "" : "s",
			e != NULL && e->current != NULL ? e->current->bytes : 0);
		return 1;
	}
	return 0;
}

void
restore_finish(struct restore *s, struct registry *r)
{
	if (s != NULL) {
		/* A slot whose model is not served again says 0 until it is:
		 * its holders see stale, as they should. */
		for (uint32_t i = 0; s->desc != NULL && i < s->desc->nmodels; i++) {
			uint64_t slot = s->desc->models[i].slot;

			if (!s->restored[i] && s->status_taken && slot > 0 && slot < STATUS_SLOTS)
				__atomic_store_n(&r->status[slot], 0, __ATOMIC_RELEASE);
		}
		close_untaken(s);
		restore_free(s);
	}
	restoring = 0;
	restore_sync(r);
	/* Every stored model is adopted (or loads afresh): main.c starts
	 * their full checks (registry_restore_checks) once it serves. */
}

/* ---- storing ---- */

/* Asks the manager to drop the index and the nfiles files of generation
 * number of slot. */
static void
remove_names(unsigned slot, uint64_t number, size_t nfiles)
{
	char name[FDSTORE_MAX_FDNAME + 1];

	if (fdstore_name_index(name, sizeof(name), slot, number) > 0)
		(void)notify_remove_fds(name);
	for (size_t k = 0; k < nfiles; k++)
		if (fdstore_name_file(name, sizeof(name), slot, number, (uint32_t)k) > 0)
			(void)notify_remove_fds(name);
}

/* Hands the manager g's index and files under slot's names. */
static int
store_generation(struct generation *g, unsigned slot)
{
	char name[FDSTORE_MAX_FDNAME + 1];
	size_t k;

	int err;

	/* What went in stays: the next attempt stores everything again
	 * (the manager keeps one copy of the same open file), and
	 * restore_forget() removes every name of the slot. */
	g->stored_slot = slot;
	if ((err = fdstore_name_index(name, sizeof(name), slot, g->number)) < 0 ||
		(err = notify_store_fds(name, &g->index_fd, 1)) <= 0)
		return err < 0 ? err : -ENOTCONN;
	for (k = 0; k < g->source.nfiles; k++)
		if ((err = fdstore_name_file(name, sizeof(name), slot, g->number, (uint32_t)k)) < 0 ||
			(err = notify_store_fds(name, &g->source.files[k].fd, 1)) <= 0)
			return err < 0 ? err : -ENOTCONN;
	g->stored_done = 1;
	return 0;
}

/* Is g, not current, a generation its holders still need: stored, open,
 * held or waiting for their HOLDs? */
static int
describe_held(const struct model_entry *m, const struct generation *g)
{
	return g->model == m && g != m->current && g != m->pending && g->stored_done &&
		g->stored_slot == m->slot && g->state != GEN_CLOSED && g->state != GEN_MODIFIED &&
		registry_holders(g) > 0;
}

/* Is m's current generation in the store, whole, and attachable? */
static int
describe_current(const struct model_entry *m)
{
	const struct generation *g = m->current;

	return m->slot != 0 && g != NULL && g->stored_done && g->stored_slot == m->slot &&
		gen_attachable(g);
}

/* Fills dg from g of m, stored under m's slot, in role. */
static int
describe_generation(struct fdstore_generation *dg, const struct model_entry *m,
	const struct generation *g, uint8_t role)
{
	char name[FDSTORE_MAX_FDNAME + 1];

	dg->number = g->number;
	dg->role = role;
	dg->pin = role == FDSTORE_CURRENT ? (uint8_t)m->pin : (uint8_t)PIN_NONE;
	dg->holders = registry_holders(g);
	dg->index_size = g->index_size;
	dg->nfiles = (uint32_t)g->source.nfiles;
	if (fdstore_name_index(name, sizeof(name), m->slot, g->number) < 0 ||
		(dg->index_fdname = strdup(name)) == NULL ||
		(dg->files = calloc(g->source.nfiles ? g->source.nfiles : 1, sizeof(*dg->files))) ==
			NULL)
		return -ENOMEM;
	for (size_t k = 0; k < g->source.nfiles; k++) {
		const struct stat *st = &g->source.files[k].st;
		struct fdstore_file *f = &dg->files[k];

		if (fdstore_name_file(name, sizeof(name), m->slot, g->number, (uint32_t)k) < 0 ||
			(f->fdname = strdup(name)) == NULL)
			return -ENOMEM;
		f->dev = (uint64_t)st->st_dev;
		f->ino = (uint64_t)st->st_ino;
		f->size = (uint64_t)st->st_size;
		f->mtime_ns = mtime_ns(st);
	}
	return 0;
}

/* Descriptors g takes in the store: its index and its files. */
static size_t
generation_fds(const struct generation *g)
{
	return 1 + g->source.nfiles;
}

/* Appends printf-style text to buf of cap bytes (cut at the end). */
static void
append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void
append(char *buf, size_t cap, const char *fmt, ...)
{
	size_t len = strnlen(buf, cap);
	va_list ap;

	if (len + 1 >= cap)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, cap - len, fmt, ap);
	va_end(ap);
}

/* The description's model for m (models are described in registry order,
 * those with a slot): its place in d, found by m's entry_id. */
static struct fdstore_model *
described_model(struct fdstore_desc *d, const struct model_entry *const *order,
	const struct model_entry *m)
{
	for (uint32_t i = 0; i < d->nmodels; i++)
		if (order[i] == m)
			return &d->models[i];
	return NULL;
}

int
restore_describe(const struct registry *r, size_t max_fds, struct fdstore_desc **out,
	char *left_out, size_t cap)
{
	struct fdstore_desc *d = calloc(1, sizeof(*d));
	const struct model_entry **order = NULL;
	size_t fds = 0, n = 0;
	unsigned models_out = 0, held_out = 0;
	int full = 0, err = -ENOMEM;

	left_out[0] = '\0';
	if (d == NULL)
		goto fail;
	d->status_size = STATUS_PAGE_BYTES;
	for (const struct model_entry *m = r->models; m != NULL; m = m->next)
		n += m->slot != 0;
	if (n > 0 && ((d->models = calloc(n, sizeof(*d->models))) == NULL ||
			     /* An array of pointers: sizeof(*order) is one pointer.
			      * NOLINTNEXTLINE(bugprone-sizeof-expression) */
			     (order = calloc(n, sizeof(*order))) == NULL))
		goto fail;
	/* Every model, and its current generation while they fit: a model
	 * left out whole keeps its slot and numbers, and loads afresh. */
	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct fdstore_model *dm;

		if (m->slot == 0)
			continue;
		order[d->nmodels] = m;
		dm = &d->models[d->nmodels++];
		if ((dm->name = strdup(m->name)) == NULL || (dm->path = strdup(m->path)) == NULL)
			goto fail;
		dm->slot = m->slot;
		dm->last_generation = m->last_generation;
		if (!describe_current(m))
			continue;
		if (generation_fds(m->current) > max_fds - fds) {
			append(left_out, cap, "%s\"%.64s\"", models_out++ ? ", " : "models left out "
				"whole: ", m->name);
			continue;
		}
		fds += generation_fds(m->current);
		if ((dm->generations = calloc(1, sizeof(*dm->generations))) == NULL ||
			describe_generation(&dm->generations[0], m, m->current, FDSTORE_CURRENT) < 0)
			goto fail;
		dm->ngenerations = 1;
	}
	/* Then the held ones, newest first (the registry's list), while they
	 * fit: from the first that does not, every older one is left out. */
	for (const struct generation *g = r->generations; g != NULL; g = g->next) {
		struct fdstore_model *dm;
		struct fdstore_generation *more;

		if (g->model == NULL || !describe_held(g->model, g) ||
			(dm = described_model(d, order, g->model)) == NULL || dm->ngenerations == 0 ||
			dm->ngenerations >= FDSTORE_MAX_GENERATIONS)
			continue;
		if (full || generation_fds(g) > max_fds - fds) {
			append(left_out, cap, "%s\"%.64s\" %" PRIu64, held_out++ ? ", " :
				(models_out ? "; held generations left out: " :
					      "held generations left out: "), g->model->name, g->number);
			full = 1;
			continue;
		}
		if ((more = realloc(dm->generations, (dm->ngenerations + 1) * sizeof(*more))) == NULL)
			goto fail;
		dm->generations = more;
		memset(&more[dm->ngenerations], 0, sizeof(*more));
		if (describe_generation(&more[dm->ngenerations++], g->model, g, FDSTORE_HELD) < 0)
			goto fail;
		fds += generation_fds(g);
	}
	free(order);
	*out = d;
	return 0;
fail:
	free(order);
	fdstore_free(d);
	return error_set(err, "out of memory");
}

/* Logs what the description leaves out to stay within the store's limit,
 * once for each different report (store_description runs again every
 * 200 ms while the manager's queue is full). */
static void
log_left_out(const char *left_out)
{
	static char logged[1024];

	if (strcmp(left_out, logged) == 0)
		return;
	snprintf(logged, sizeof(logged), "%s", left_out);
	if (left_out[0] != '\0')
		log_warnx("warm restart: the description would need more than %u stored "
			  "descriptors (FileDescriptorStoreMax=); %s: a restart loads them afresh "
			  "or does not restore them", FDSTORE_MAX_FDS, left_out);
}

/* Encodes the registry and stores it in place of the previous description. */
static int
store_description(struct registry *r)
{
	struct fdstore_desc *d = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	char left_out[1024];
	int fd = -1, err;

	if ((err = restore_describe(r, FDSTORE_MAX_FDS, &d, left_out, sizeof(left_out))) < 0)
		goto out;
	log_left_out(left_out);
	if ((err = fdstore_encode(d, &buf, &len)) < 0 || (err = fdstore_memfd_make(buf, len, &fd)) < 0)
		goto out;
	/* Removed once: a retry after a refused store must not remove
	 * again behind a removal still queued. */
	if (desc_in_store)
		(void)notify_remove_fds(FDSTORE_NAME_DESC);
	desc_in_store = 0;
	/* A removal still in our queue would go after the store and remove
	 * the new description: store once it has gone. */
	if (notify_flush() == 0) {
		err = error_set(-EAGAIN, "the removal of the previous one waits in the queue");
		close(fd);
		goto out;
	}
	if ((err = notify_store_fds(FDSTORE_NAME_DESC, &fd, 1)) > 0)
		desc_in_store = 1;
	close(fd);
out:
	if (err == -ENOMEM)
		error_set(-ENOMEM, "out of memory");
	if (err < 0)
		log_not_stored(err, "warm restart: the registry's description");
	free(buf);
	fdstore_free(d);
	return err < 0 ? err : 0;
}

/* What the description depends on, hashed (FNV-1a), so that progress
 * events do not rewrite it. Never 0. */
static uint64_t
describe_hash(const struct registry *r)
{
	uint64_t h = 1469598103934665603ull;

	for (const struct model_entry *m = r->models; m != NULL; m = m->next) {
		const struct generation *g = m->current;
		uint64_t v[7] = { m->entry_id, m->slot, m->last_generation, g ? g->number : 0,
			g ? (uint64_t)g->stored_done : 0, g ? (uint64_t)gen_attachable(g) : 0,
			g ? registry_holders(g) : 0 };

		for (int i = 0; i < 7; i++)
			h = (h ^ v[i]) * 1099511628211ull;
	}
	/* The held generations described with them. */
	for (const struct generation *g = r->generations; g != NULL; g = g->next) {
		if (g->model == NULL || !describe_held(g->model, g))
			continue;
		uint64_t v[3] = { g->model->entry_id, g->number, registry_holders(g) };

		for (int i = 0; i < 3; i++)
			h = (h ^ v[i]) * 1099511628211ull;
	}
	return h | 1;
}

void
restore_sync(struct registry *r)
{
	uint64_t h;

	if (!r->fdstore || restoring || r->closing)
		return;
	/* Removals wait in the queue: they go first (see store_description). */
	if (notify_flush() == 0)
		return;
	char what[128];
	int err;

	if (!status_stored) {
		if ((err = notify_store_fds(FDSTORE_NAME_STATUS, &r->status_fd, 1)) > 0)
			status_stored = 1;
		else if (err < 0) {
			log_not_stored(err, "warm restart: the status page");
			return; /* the generations need it: all of them again later */
		}
	}
	for (struct model_entry *m = r->models; m != NULL; m = m->next) {
		struct generation *g = m->current;

		if (g == NULL || m->slot == 0 || g->stored_done || !gen_attachable(g))
			continue;
		if ((err = store_generation(g, m->slot)) < 0) {
			snprintf(what, sizeof(what), "model \"%.64s\": generation %" PRIu64, m->name,
				g->number);
			log_not_stored(err, what);
			return;
		}
	}
	if ((h = describe_hash(r)) != described && store_description(r) == 0)
		described = h;
}

/* Is anything not yet in the store that restore_sync() would store? */
static int
sync_pending(const struct registry *r)
{
	if (!status_stored || describe_hash(r) != described)
		return 1;
	for (const struct model_entry *m = r->models; m != NULL; m = m->next)
		if (m->current != NULL && m->slot != 0 && !m->current->stored_done &&
			gen_attachable(m->current))
			return 1;
	return 0;
}

void
restore_stopping(struct registry *r)
{
	if (!r->fdstore || r->closing)
		return;
	for (int i = 0; i < 100 && sync_pending(r); i++) {
		(void)notify_flush_wait(10);
		restore_sync(r);
		if (sync_pending(r))
			usleep(10000);
	}
	if (sync_pending(r))
		log_warnx("warm restart: the service manager did not take everything within 1 s; "
			  "the next start loads some models afresh");
}

void
restore_forget(struct registry *r, struct generation *g)
{
	if (g->stored_slot == 0 || r->closing)
		return;
	remove_names(g->stored_slot, g->number, g->source.nfiles);
	g->stored_slot = 0;
	g->stored_done = 0;
}
