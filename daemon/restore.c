/*
 * restore.c: the warm restart (see restore.h): taking back what the
 * manager's file descriptor store holds at start-up, and checking it
 * before restore_adopt.c serves it (restore_store.c puts it there).
 *
 * Every piece that comes back is untrusted: the description is decoded by
 * fdstore_decode(), each model file must be the same inode, size and mtime
 * as described, opened read-only, and still be what the configured path
 * names; each index memfd must be fully sealed, of the described size, and
 * pass index_open() with one file per stored file; the status page is
 * checked by registry_init_stored() (statuspage_adopt). All of that is
 * O(files), so a restart serves again in the same time whatever the
 * models' sizes and tensor counts; each index is then checked record by record on the work queue
 * while it serves (index_check.h), and one that fails is withdrawn and its
 * model loaded afresh (restore_adopt.c).
 *
 * A restored model's derived artifacts come back too (derive.h): each
 * artifact memfd must be a regular file with every seal a published one
 * has, of the described size, and parse again with its format's reader
 * (source_open_fd, O(its header)) into an index byte for byte the stored
 * index memfd, itself checked as a generation's is. One that fails is left
 * out with one line naming the model, the key and the reason, its
 * descriptors closed: the next DERIVE builds it again.
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
#include <sys/vfs.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "derive.h"
#include "fdstore.h"
#include "generation.h"
#include "format/index.h"
#include "log.h"
#include "proto/memfds.h"
#include "listen.h"
#include "notify.h"
#include "restore.h"
#include "restore_internal.h"
#include "stage.h"

#define INDEX_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct restore {
	struct listen_fd *fds; /* the "wc-..." ones; fd -1 once taken */
	size_t n;
	struct fdstore_desc *desc;
	int status_fd;         /* -1 once the registry took it, or none */
	int status_taken;
	unsigned char *restored; /* per described model */
};


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
	restore_state.restoring = 1;
	/* Whatever description the manager has, the next one replaces it. */
	restore_state.desc_in_store = count_named(s, FDSTORE_NAME_DESC) > 0;
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
	/* An artifact stored from now on takes a number none of these has,
	 * taken back or not (a removal may still be on its way). */
	for (uint32_t i = 0; i < s->desc->nmodels; i++)
		for (uint32_t a = 0; a < s->desc->models[i].nartifacts; a++) {
			struct fdstore_name parsed;

			if (fdstore_name_parse(s->desc->models[i].artifacts[a].fdname, &parsed) == 0 &&
				parsed.artifact > restore_state.last_artifact)
				restore_state.last_artifact = parsed.artifact;
		}
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
	restore_state.status_stored = 1; /* the manager has it already */
}

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
			log_warnx("warm restart: model \"%s\": status slot %" PRIu64 " not restored: %s",
				m->name, m->slot, error_get());
	}
}

/* The directory the model's files are in, malloc'd in *dir: path itself,
 * or its parent. */
static int
files_dir(const char *path, char **dir)
{
	struct stat st;
	char *d;

	if (stat(path, &st) == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	d = S_ISDIR(st.st_mode) ? strdup(path) : path_dir(path);
	if (d == NULL)
		return error_set(-ENOMEM, "%s: out of memory", path);
	*dir = d;
	return 0;
}

/* st's mtime in nanoseconds since the epoch, as the store describes it;
 * times past the year 2262 (or before 1678) saturate instead of
 * overflowing. */
int64_t
restore_mtime_ns(const struct stat *st)
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
	int64_t mtime = restore_mtime_ns(st);

	return S_ISREG(st->st_mode) && (uint64_t)st->st_dev == f->dev &&
		(uint64_t)st->st_ino == f->ino && (uint64_t)st->st_size == f->size &&
		mtime == f->mtime_ns;
}

/* Checks a stored index memfd fd, called fdname: sealed, of size bytes,
 * a valid index header for nfiles files (O(1): the records are checked
 * later, see above), and maps it into *map. 0 or -EINVAL with the reason. */
static int
check_index(int fd, const char *fdname, uint64_t size, uint32_t nfiles, struct index_header *h,
	void **map)
{
	struct stat st;
	int seals;

	if (fd < 0)
		return error_set(-EINVAL, "its index memfd \"%s\" is not in the store", fdname);
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size ||
		size == 0 || size > SIZE_MAX)
		return error_set(-EINVAL, "its index memfd is not %" PRIu64 " bytes", size);
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 || (seals & INDEX_SEALS) != INDEX_SEALS)
		return error_set(-EINVAL, "its index memfd is not sealed");
	*map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
	if (*map == MAP_FAILED)
		return error_set(-errno, "mapping its index: %s", strerror(errno));
	if (index_open(*map, (size_t)size, h) < 0 || h->file_count != nfiles) {
		munmap(*map, (size_t)size);
		return error_set(-EINVAL, "its index is not valid for %" PRIu32 " files", nfiles);
	}
	return 0;
}

/*
 * A stored file that is a staged copy (stage.h): 1 with its path under
 * stage_dir in *copy (malloc'd; the link /proc/self/fd names, without a
 * " (deleted)" a removal left), 0 when it is not one, -ENOMEM.
 */
static int
staged_copy_path(const char *stage_dir, int fd, char **copy)
{
	static const char deleted[] = " (deleted)";
	char link[64], buf[PATH_MAX], *dir = NULL;
	ssize_t n;
	size_t len;
	int r;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (stage_dir == NULL || (n = readlink(link, buf, sizeof(buf) - 1)) <= 0)
		return 0;
	buf[n] = '\0';
	len = (size_t)n;
	if (len > sizeof(deleted) - 1 && strcmp(buf + len - (sizeof(deleted) - 1), deleted) == 0)
		buf[len - (sizeof(deleted) - 1)] = '\0';
	if ((r = stage_dir_of(stage_dir, buf, &dir)) <= 0)
		return r;
	free(dir);
	if ((*copy = strdup(buf)) == NULL)
		return error_set(-ENOMEM, "out of memory");
	return 1;
}

/* A staged copy's origin as f describes it (the file it was copied from,
 * its size and mtime the copy's): for a held generation whose origin is
 * gone or was replaced, as the process that staged it knew it. */
static void
described_origin(const struct fdstore_file *f, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_mode = S_IFREG;
	st->st_dev = (dev_t)f->origin_dev;
	st->st_ino = (ino_t)f->origin_ino;
	st->st_size = (off_t)f->size;
	st->st_mtim.tv_sec = (time_t)(f->mtime_ns / 1000000000);
	st->st_mtim.tv_nsec = (long)(f->mtime_ns % 1000000000);
	if (st->st_mtim.tv_nsec < 0) {
		st->st_mtim.tv_sec--;
		st->st_mtim.tv_nsec += 1000000000;
	}
}

/*
 * A staged copy's origin: the configured model's file full that it was
 * copied from. A current generation serves only while that file is what
 * was copied: the same file (its st_dev and st_ino, as same_file() checks
 * a file served where it lies: a file renamed over the path while no
 * wcached ran may have the same size and mtime, rsync -a or cp -p make
 * one), and its size and mtime (the copy keeps the source's mtime); the
 * copy's inode was checked against the description already. A
 * description without the origin's inode (version 3, an older wcached)
 * cannot tell: the model is staged again, which is always safe. Fills *o.
 */
static int
check_origin(const struct fdstore_generation *g, const struct fdstore_file *f, char *full,
	struct gen_origin *o)
{
	struct stat st;
	int same;

	if (stat(full, &st) == -1) {
		if (g->role == FDSTORE_CURRENT)
			return error_set(-EINVAL, "%s, staged from, is gone", full);
		described_origin(f, &st);
		same = 1;
	} else {
		same = (uint64_t)st.st_dev == f->origin_dev && (uint64_t)st.st_ino == f->origin_ino;
	}
	if (g->role == FDSTORE_CURRENT) {
		if (f->origin_dev == 0 && f->origin_ino == 0)
			return error_set(-EINVAL, "the description of its copy of %s does not say "
				"which file it was copied from (stored by an older wcached)", full);
		if (!same)
			return error_set(-EINVAL, "%s was replaced since it was staged (it is "
				"another file now)", full);
		if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->size ||
			restore_mtime_ns(&st) != f->mtime_ns)
			return error_set(-EINVAL, "%s was replaced or changed since it was staged",
				full);
	} else if (!same) {
		/* A held generation's source was replaced: that is why it is
		 * held. Its origin stays the file it was copied from. */
		described_origin(f, &st);
	}
	o->path = full;
	o->st = st;
	return 0;
}

/* Checks stored file k of g (index mapped at blob) and maps it into *out,
 * which then owns the descriptor. A staged copy's origin goes to *origin
 * (path NULL when the file is not a staged copy). */
static int
take_file(struct restore *s, const char *stage_dir, const char *dir,
	const struct fdstore_generation *g, uint32_t k, const uint8_t *blob,
	const struct index_header *h, struct wc_file *out, struct gen_origin *origin)
{
	const struct fdstore_file *f = &g->files[k];
	const char *fname;
	char *full, *copy = NULL;
	struct stat st;
	uint64_t size;
	size_t at;
	int fd = find_fd(s, f->fdname, &at), fl, staged;

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
	if ((full = path_join(dir, fname)) == NULL)
		return error_set(-ENOMEM, "file %s: out of memory", fname);
	if ((staged = staged_copy_path(stage_dir, fd, &copy)) != 0) {
		if (staged < 0 || check_origin(g, f, full, origin) < 0) {
			free(copy);
			free(full);
			return -EINVAL;
		}
		/* The origin keeps full; the file is the copy. */
		full = copy;
	} else if (g->role == FDSTORE_CURRENT && (stat(full, &st) == -1 || !same_file(&st, f))) {
		/* A held generation's files were replaced: that is why it is old. */
		error_set(-EINVAL, "%s was replaced or changed since it was stored", full);
		free(full);
		return -EINVAL;
	}
	if (file_from_fd(fd, full, out) < 0) {
		free(full);
		if (origin->path != NULL) {
			free(origin->path);
			origin->path = NULL;
		}
		return -EINVAL;
	}
	free(full);
	s->fds[at].fd = -1;
	return 0;
}

/*
 * A restored generation k whose files are staged copies (origin[0] noted):
 * it keeps serving them, knows where they came from (for polling and the
 * next reload), and removes their directory when it closes, as the process
 * that staged them would have. Takes origin.
 */
static void
adopt_staged(struct registry *r, struct generation *k, struct gen_origin *origin, size_t n)
{
	struct statfs sfs;
	char *dir = NULL;

	if (n == 0 || origin[0].path == NULL ||
		stage_dir_of(r->stage_dir, k->source.files[0].path, &dir) <= 0) {
		gen_free_origin(origin, n);
		return;
	}
	k->origin = origin;
	k->norigin = n;
	k->staged.dir = dir;
	k->staged.bytes = k->bytes;
	for (size_t i = 0; i < k->source.nfiles; i++)
		k->staged.disk_bytes += (uint64_t)k->source.files[i].st.st_blocks * 512u;
	/* Its filesystem is the origin's, as when it was staged. */
	if (statfs(origin[0].path, &sfs) == 0)
		fstype_classify((unsigned long)sfs.f_type, &k->fs);
	log_info("model \"%s\": generation %" PRIu64 " keeps its staged copy %s", k->model_name,
		k->number, dir);
}

/* Checks every piece of m's stored generation g and serves it: as the
 * current one, or (FDSTORE_HELD) as one its holders may HOLD. */
static int
adopt(struct restore *s, struct registry *r, const struct fdstore_model *m,
	const struct fdstore_generation *g, const char *path, enum pin_mode pin, int warm)
{
	struct model_source src = { .format = FORMAT_SAFETENSORS };
	struct gen_origin *origin = NULL;
	struct index_header h;
	char *dir = NULL;
	void *map = NULL;
	size_t at = 0;
	int ifd = find_fd(s, g->index_fdname, &at), err;

	if ((err = check_index(ifd, g->index_fdname, g->index_size, g->nfiles, &h, &map)) < 0)
		return err;
	if ((src.files = calloc(g->nfiles, sizeof(*src.files))) == NULL ||
		(origin = calloc(g->nfiles ? g->nfiles : 1, sizeof(*origin))) == NULL) {
		free(src.files);
		munmap(map, (size_t)g->index_size);
		return error_set(-ENOMEM, "out of memory");
	}
	if ((err = files_dir(path, &dir)) == 0)
		for (uint32_t k = 0; k < g->nfiles && err == 0; k++)
			if ((err = take_file(s, r->stage_dir, dir, g, k, map, &h, &src.files[k],
				     &origin[k])) == 0)
				src.nfiles = k + 1;
	/* All copies or none: a mix is not what any process staged. */
	for (uint32_t k = 1; err == 0 && k < g->nfiles; k++)
		if ((origin[k].path == NULL) != (origin[0].path == NULL))
			err = error_set(-EINVAL, "some of its files are staged copies, some not");
	free(dir);
	munmap(map, (size_t)g->index_size);
	if (err == 0 && g->role == FDSTORE_CURRENT)
		err = restore_adopt_current(r, m->name, path, pin, warm, g->number, &src, ifd,
			(size_t)g->index_size);
	else if (err == 0)
		err = restore_adopt_held(r, m->name, g->number, &src, ifd, (size_t)g->index_size,
			g->holders);
	if (err == 0) {
		struct model_entry *e = registry_find(r, m->name);
		struct generation *k = registry_generation(r, e, g->number);

		s->fds[at].fd = -1;
		/* Its holders before the restart may say so (HOLD), as many of
		 * them as there were; a held one waits already. */
		if (g->role == FDSTORE_CURRENT)
			restore_await_holds(r, k, g->holders);
		/* The manager still has every piece under these names. */
		k->stored_slot = e->slot;
		k->stored_done = e->slot == m->slot;
		adopt_staged(r, k, origin, g->nfiles);
		origin = NULL;
	}
	gen_free_origin(origin, g->nfiles);
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

/* Checks the stored artifact memfd fd of a: a regular file sealed as a
 * published one is, of exactly the described size. */
static int
check_artifact_memfd(int fd, const struct fdstore_artifact *a)
{
	struct stat st;
	int seals;

	if (fd < 0)
		return error_set(-EINVAL, "its memfd \"%s\" is not in the store", a->fdname);
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode))
		return error_set(-EINVAL, "its memfd is not a regular file");
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 ||
		(seals & DERIVE_ARTIFACT_SEALS) != DERIVE_ARTIFACT_SEALS)
		return error_set(-EINVAL, "its memfd is not sealed against writing, shrinking, "
			"growing and unsealing");
	if ((uint64_t)st.st_size != a->size)
		return error_set(-EINVAL, "its memfd is %lld bytes, not %" PRIu64,
			(long long)st.st_size, a->size);
	return 0;
}

/* Checks every piece of artifact a of m (restored) and lists it again
 * (restore_adopt_artifact). The descriptors stay in s->fds until taken:
 * on failure close_untaken() closes them and the manager drops them. */
static int
adopt_artifact(struct restore *s, struct registry *r, const struct fdstore_model *m,
	const struct fdstore_artifact *a)
{
	struct model_source src = { 0 };
	struct model_entry *e = registry_find(r, m->name);
	struct generation *g = NULL;
	struct index_header h;
	struct fdstore_name n;
	char label[FDSTORE_MAX_MODEL_NAME + FDSTORE_MAX_KEY + 16];
	void *map = NULL;
	size_t aat = 0, iat = 0;
	int afd = find_fd(s, a->fdname, &aat), ifd = find_fd(s, a->index_fdname, &iat), err;

	if (e == NULL || e->current == NULL || e->current->number != a->source)
		return error_set(-ESTALE, "its source generation %" PRIu64 " is not the one "
			"restored", a->source);
	if (fdstore_name_parse(a->fdname, &n) < 0 || n.kind != FDSTORE_NAME_KIND_ARTIFACT)
		return error_set(-EINVAL, "its memfd's name \"%s\" is not an artifact's", a->fdname);
	if ((err = check_artifact_memfd(afd, a)) < 0 ||
		(err = check_index(ifd, a->index_fdname, a->index_size, 1, &h, &map)) < 0)
		return err;
	/* Its reader again, as PUBLISH does: the same index, byte for byte. */
	snprintf(label, sizeof(label), "%s derived %s", m->name, a->key);
	if (source_open_fd(afd, label, &src) < 0) {
		char why[512];

		snprintf(why, sizeof(why), "%s", error_get());
		munmap(map, (size_t)a->index_size);
		return error_set(-EBADMSG, "its memfd does not parse: %s", why);
	}
	s->fds[aat].fd = -1; /* src's now */
	if (src.nfiles != 1 || src.index_len != a->index_size ||
		memcmp(src.index, map, src.index_len) != 0)
		err = error_set(-EBADMSG, "its stored index (%" PRIu64 " bytes) is not the one "
			"its memfd compiles to (%zu bytes)", a->index_size, src.index_len);
	munmap(map, (size_t)a->index_size);
	if (err == 0)
		err = restore_adopt_artifact(r, e, &(struct derive_stored){ .key = a->key,
			.source = a->source, .builder_uid = (uid_t)a->builder_uid,
			.builder_pid = (pid_t)a->builder_pid,
			.build_seconds = (double)a->build_ms / 1000.0 }, &src, ifd,
			(size_t)a->index_size, &g);
	if (err < 0 || g == NULL) {
		/* Closed here, not by close_untaken(): the manager drops it too. */
		(void)notify_remove_fds(a->fdname);
		source_close(&src);
		return err < 0 ? err : -EINVAL;
	}
	s->fds[iat].fd = -1;
	/* The manager still has both under these names. */
	g->stored_slot = e->slot;
	g->stored_artifact = n.artifact;
	g->stored_done = e->slot == m->slot;
	return 0;
}

/* After m's current generation came back: its derived artifacts. One that
 * does not come back is built again by the next DERIVE of its key. */
static void
adopt_artifacts(struct restore *s, struct registry *r, const struct fdstore_model *m)
{
	for (uint32_t k = 0; k < m->nartifacts; k++) {
		const struct fdstore_artifact *a = &m->artifacts[k];

		if (adopt_artifact(s, r, m, a) < 0)
			log_warnx("model \"%s\": derived \"%s\" of generation %" PRIu64 " not "
				  "restored: %s; the next DERIVE of it builds it again", m->name,
				a->key, a->source, error_get());
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
		adopt_artifacts(s, r, m);
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
				statuspage_publish(&r->page, (unsigned)slot, 0);
		}
		close_untaken(s);
		restore_free(s);
	}
	restore_state.restoring = 0;
	restore_sync(r);
	/* Every stored model is adopted (or loads afresh): main.c starts
	 * their full checks (restore_checks) once it serves. */
}
