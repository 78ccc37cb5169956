/*
 * restore_check.c: the checks of a stored generation's files at a warm
 * restart (restore.h), off the loop. Each stored file must be the inode,
 * size, mtime and ctime the description gives, open read-only, named by a
 * plain name in the index, and still be what the configured path names (a
 * current generation); a staged copy's origin must still be the file it
 * was copied from, unchanged (its ctime too); and its files must not be
 * mostly holes, as a load checks (gen_check_holes). Those are stat and
 * lseek calls on the model's filesystem, and on a network filesystem
 * whose server hangs they block until it answers: so they run on the work queue (workq.h), never
 * on the event loop, and a model on a hung server waits there while every
 * other one serves (restore_job.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "fdstore.h"
#include "format/index.h"
#include "format/tree.h"
#include "generation.h"
#include "mountrule.h"
#include "proto/memfds.h"
#include "registry_internal.h"
#include "restore_internal.h"
#include "stage.h"

/* The error of a stat of path the walk failed (errno): the walk's own
 * line where it refused a mount (EXDEV: it names the path, the mount and
 * why), else path and errno's text. */
static int
stat_failed(const char *path, const char *why)
{
	int e = errno;

	if (e == EXDEV)
		return error_set(-e, "%s", why);
	return error_set(-e, "%s: %s", path, strerror(e));
}

/* The directory the model's files are in, malloc'd in *dir: path itself,
 * or its parent. */
static int
files_dir(const char *path, char **dir)
{
	char why[MOUNTRULE_WHY];
	struct stat st;
	char *d;

	if (mountrule_stat(NULL, path, &st, why, sizeof(why)) == -1)
		return stat_failed(path, why);
	d = S_ISDIR(st.st_mode) ? strdup(path) : path_dir(path);
	if (d == NULL)
		return error_set(-ENOMEM, "%s: out of memory", path);
	*dir = d;
	return 0;
}

/*
 * How st, a stat of a stored file now, differs from what f describes: NULL
 * when it is that file unchanged. The inode, size and mtime first; then
 * the ctime, as a running wcached compares it (file_ctime_moved,
 * base/file.h): a writer can put the mtime back with utimensat, never the
 * ctime, so a ctime that moved while the link count stayed is a change
 * (a rename over the file's path drops a link: a held generation's file
 * replaced so is no write). A description that records no ctime (nlink 0:
 * version 4 and before) cannot tell; check_file says so for a current
 * generation. A ctime that moved with the link count (a hard link added
 * or removed beside it, file_links_moved) is no change; where relinked is
 * not NULL (a current generation's file) it is set then: that cannot be
 * told from a write with its mtime put back, and its files are loaded
 * again, validated anew, once it serves (restore_job.c's restore_after).
 */
static const char *
file_changed(const struct stat *st, const struct fdstore_file *f, bool *relinked)
{
	if (!S_ISREG(st->st_mode) || (uint64_t)st->st_dev != f->dev ||
		(uint64_t)st->st_ino != f->ino || (uint64_t)st->st_size != f->size ||
		file_time_ns(&st->st_mtim) != f->mtime_ns)
		return "not the inode, size and mtime described";
	if (f->nlink != 0 && (uint64_t)st->st_nlink == f->nlink &&
		file_time_ns(&st->st_ctim) != f->ctime_ns)
		return "written in place since it was stored (its ctime moved, its mtime was "
		       "put back)";
	if (relinked != NULL && f->nlink != 0 && st->st_nlink != 0 &&
		(uint64_t)st->st_nlink != f->nlink && file_time_ns(&st->st_ctim) != f->ctime_ns)
		*relinked = true;
	return NULL;
}

/* check_file: file k of p, a current generation's, was linked or unlinked
 * while no wcached ran (file_changed's relinked): the first one noted. */
static void
note_relinked(struct restore_prepared *p, uint32_t k, bool relinked)
{
	if (relinked && !p->relinked) {
		p->relinked = true;
		p->relinked_k = k;
	}
}

/* O(1): the records are checked later (restore_checks, index_check.h). */
int
restore_check_index(int fd, const char *fdname, uint64_t size, uint32_t nfiles,
	struct index_header *h, void **map)
{
	struct stat st;
	void *p;
	int seals;

	if (fd < 0)
		return error_set(-EINVAL, "its index memfd \"%s\" is not in the store", fdname);
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size ||
		size == 0 || size > SIZE_MAX)
		return error_set(-EINVAL, "its index memfd is not %" PRIu64 " bytes", size);
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 || (seals & INDEX_SEALS) != INDEX_SEALS)
		return error_set(-EINVAL, "its index memfd is not sealed");
	p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return error_set(-errno, "mapping its index: %s", strerror(errno));
	if (index_open(p, (size_t)size, h) < 0 || h->file_count != nfiles) {
		munmap(p, (size_t)size);
		return error_set(-EINVAL, "its index is not valid for %" PRIu32 " files", nfiles);
	}
	/* Set on success only: a caller that unmaps *map on its way out must
	 * not unmap, a second time, a range another thread may map by then. */
	*map = p;
	return 0;
}

/*
 * The path of the stored file fd, into buf (len bytes): 0, or -1 when it
 * has none. Under stage_dir (not NULL) it is found by identity: the copy
 * stage_dir/<model>.<n>/<file> (stage.h) that holds fd's very file
 * (mountrule_fd_under), whatever the kernel calls it: the descriptor was
 * stored by a previous process, and under wcached.service each start has
 * a mount namespace of its own, so the kernel's name for it is that
 * namespace's, its mount detached here (review rev217 M1). Else the
 * kernel's name where it is this namespace's and a walk of it reaches the
 * file (mountrule_fd_name; review rev215 L1, rev217 M3; stage_dir NULL
 * only), or the path it was removed from (a staged copy swept is still a
 * copy).
 */
static int
fd_path(int fd, const char *stage_dir, char *buf, size_t len)
{
	bool removed;
	char *name = stage_dir != NULL ? mountrule_fd_under(NULL, fd, stage_dir, 2) : NULL;
	struct statx sx;
	int r;

	/* Not under stage_dir: only a removed file's name there (no walk of
	 * it, and its link count as cached, no server asked: a live file's
	 * name elsewhere would be walked, and reserve() asks on the loop, of
	 * files on a server that may hang). */
	if (name == NULL && (stage_dir == NULL ||
		(statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_NLINK, &sx) == 0 &&
			(sx.stx_mask & STATX_NLINK) != 0 && sx.stx_nlink == 0)))
		name = mountrule_fd_name(NULL, fd, "a stored file", &removed, NULL, 0);
	r = name != NULL && (size_t)snprintf(buf, len, "%s", name) < len ? 0 : -1;
	free(name);
	return r;
}

/*
 * A stored file that is a staged copy (stage.h): 1 with its path under
 * stage_dir in *copy (malloc'd; the link /proc/self/fd names, without a
 * " (deleted)" a removal left), 0 when it is not one, -ENOMEM.
 */
int
restore_staged_copy(const char *stage_dir, int fd, char **copy)
{
	char buf[PATH_MAX], *dir = NULL;
	int r;

	if (stage_dir == NULL || fd_path(fd, stage_dir, buf, sizeof(buf)) < 0)
		return 0;
	if ((r = stage_dir_of(stage_dir, buf, &dir)) <= 0)
		return r;
	free(dir);
	if ((*copy = strdup(buf)) == NULL)
		return error_set(-ENOMEM, "out of memory");
	return 1;
}

/*
 * Is the stored file fd (described by f), which is not under stage_dir, a
 * staged copy all the same, one the description gives an origin (the file
 * it was copied from)? Then stage_dir changed since it was staged (a
 * reload, or the configuration between two runs), or the copy was
 * removed from it: the copy is not used. 1 with the message saying so
 * (not that the model's file was replaced, as comparing the copy with it
 * would say), naming the directory no sweep visits where this mount
 * namespace names it (a previous start's may not: each start of
 * wcached.service has its own, review rev217 M1), else 0.
 */
static int
staged_elsewhere(const char *stage_dir, int fd, const struct fdstore_file *f)
{
	char buf[PATH_MAX], *dir;

	if (f->origin_dev == 0 && f->origin_ino == 0)
		return 0;
	if (fd_path(fd, NULL, buf, sizeof(buf)) < 0 || (dir = path_dir(buf)) == NULL) {
		error_set(-EINVAL, "it is a staged copy not found in stage_dir %s (stage_dir "
			"changed since it was staged, or the copy was removed; where it is cannot "
			"be told in this mount namespace): the copy is not used",
			stage_dir != NULL ? stage_dir : "(none)");
		return 1;
	}
	error_set(-EINVAL, "its staged copy %s is not in stage_dir %s (stage_dir changed since "
		"it was staged): the copy is not used, and no sweep removes %s: remove it by hand",
		buf, stage_dir != NULL ? stage_dir : "(none)", dir);
	free(dir);
	return 1;
}

/* ns nanoseconds since the epoch as a timespec. */
static void
ns_to_timespec(int64_t ns, struct timespec *t)
{
	t->tv_sec = (time_t)(ns / 1000000000);
	t->tv_nsec = (long)(ns % 1000000000);
	if (t->tv_nsec < 0) {
		t->tv_sec--;
		t->tv_nsec += 1000000000;
	}
}

/* A staged copy's origin as f describes it (the file it was copied from,
 * its size and mtime the copy's, its ctime when recorded): for a held
 * generation whose origin is gone or was replaced, as the process that
 * staged it knew it. */
static void
described_origin(const struct fdstore_file *f, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_mode = S_IFREG;
	st->st_dev = (dev_t)f->origin_dev;
	st->st_ino = (ino_t)f->origin_ino;
	st->st_size = (off_t)f->size;
	ns_to_timespec(f->mtime_ns, &st->st_mtim);
	if (f->nlink != 0)
		ns_to_timespec(f->origin_ctime_ns, &st->st_ctim);
}

/*
 * A staged copy's origin: the configured model's file full that it was
 * copied from. A current generation serves only while that file is what
 * was copied: the same file (its st_dev and st_ino, as file_changed()
 * checks a file served where it lies: a file renamed over the path while
 * no wcached ran may have the same size and mtime, rsync -a or cp -p make
 * one), its size and mtime (the copy keeps the source's mtime), and its
 * ctime: cp -p over the source writes it in place (the same inode), and
 * rm then cp -p may get the freed inode number back (ext4 does), both with
 * the old size and mtime, but either moves the ctime. The copy's inode was
 * checked against the description already. A description without the
 * origin's inode (version 3, an older wcached) cannot tell: the model is
 * staged again, which is always safe (one without its ctime, version 4,
 * likewise: check_file). Fills *o. walk: the generation's run of walks.
 */
static int
check_origin(struct mountrule_walk *walk, const struct fdstore_generation *g,
	const struct fdstore_file *f, char *full, struct gen_origin *o)
{
	char why[MOUNTRULE_WHY];
	struct stat st;
	int same;

	if (mountrule_stat(walk, full, &st, why, sizeof(why)) == -1) {
		if (g->role == FDSTORE_CURRENT && errno == EXDEV)
			return error_set(-EINVAL, "%s, staged from: %s", full, why);
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
			file_time_ns(&st.st_mtim) != f->mtime_ns)
			return error_set(-EINVAL, "%s was replaced or changed since it was staged",
				full);
		if (f->nlink != 0 && file_time_ns(&st.st_ctim) != f->origin_ctime_ns)
			return error_set(-EINVAL, "%s was written or replaced since it was staged "
				"(its ctime moved; its size and mtime are the copy's)", full);
	} else if (!same) {
		/* A held generation's source was replaced: that is why it is
		 * held. Its origin stays the file it was copied from. */
		described_origin(f, &st);
	}
	o->path = full;
	o->st = st;
	return 0;
}

/* Checks stored file k of p's generation (index mapped at blob; its
 * files in dir, their paths walked in the run walk) and maps it into
 * p->src.files[k], which then owns the descriptor. A staged copy's origin
 * goes to p->origin[k]. */
static int
check_file(struct restore_prepared *p, struct mountrule_walk *walk, const char *stage_dir,
	const char *dir, uint32_t k, const uint8_t *blob, const struct index_header *h)
{
	const struct fdstore_generation *g = p->g;
	const struct fdstore_file *f = &g->files[k];
	struct gen_origin *origin = &p->origin[k];
	const char *fname, *changed;
	char *full, *copy = NULL, why[MOUNTRULE_WHY];
	struct stat st;
	uint64_t size;
	int fd = p->fds[k], fl, staged, r = 0;
	bool relinked = false, *current = g->role == FDSTORE_CURRENT ? &relinked : NULL;

	if (fd < 0)
		return error_set(-EINVAL, "file %" PRIu32 " (\"%s\") is not in the store", k,
			f->fdname);
	if (index_file_at(blob, h, k, &fname, &size) < 0 || size != f->size)
		return error_set(-EINVAL, "file %" PRIu32 ": the index disagrees with the "
			"description", k);
	if (fstat(fd, &st) == -1)
		return error_set(-errno, "file %s: fstat: %s", fname, strerror(errno));
	if ((changed = file_changed(&st, f, current)) != NULL)
		return error_set(-EINVAL, "file %s: %s", fname, changed);
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
	if ((staged = restore_staged_copy(stage_dir, fd, &copy)) != 0) {
		if (staged < 0 || check_origin(walk, g, f, full, origin) < 0) {
			free(copy);
			free(full);
			return -EINVAL;
		}
		/* The origin keeps full; the file is the copy. */
		full = copy;
	} else if (g->role == FDSTORE_CURRENT && staged_elsewhere(stage_dir, fd, f)) {
		free(full);
		return -EINVAL;
	} else if (g->role == FDSTORE_CURRENT && !p->moved &&
		((r = mountrule_stat(walk, full, &st, why, sizeof(why))) == -1 ||
			file_changed(&st, f, NULL) != NULL)) {
		/* Another file at its name (a held generation's files were
		 * replaced: that is why it is old); the stored one is intact
		 * (its fstat above): served, and the path loaded after it as a
		 * reload wcached makes by itself (restore_after). A path the
		 * walk refused says which mount and why. */
		p->moved = true;
		if (r == -1 && errno == EXDEV)
			snprintf(p->moved_why, sizeof(p->moved_why), "%s", why);
		else
			snprintf(p->moved_why, sizeof(p->moved_why), "%s was replaced or changed "
				"since it was stored", full);
	}
	/* An older wcached's description (version 4 and before) records no
	 * ctime: a write in place whose writer put the mtime back while no
	 * wcached ran cannot be told, so the model loads afresh, once, the
	 * safe choice (as for a copy without its origin, check_origin); its
	 * held generations go with it, as whenever the current one fails. A
	 * held generation's own files are compared as recorded. */
	if (g->role == FDSTORE_CURRENT && f->nlink == 0)
		error_set(-EINVAL, "file %s: its description does not record its ctime (stored "
			"by an older wcached), so a write in place while no wcached ran cannot be "
			"told", fname);
	else if (file_from_fd(fd, full, &p->src.files[k]) == 0) {
		/* The stat the generation keeps, which later checks compare
		 * with (watch.c), is the one compared here: a write between
		 * the fstat above and this one is not taken as the baseline. */
		if ((changed = file_changed(&p->src.files[k].st, f, current)) == NULL) {
			note_relinked(p, k, relinked);
			free(full);
			return 0;
		}
		error_set(-EINVAL, "file %s: %s", fname, changed);
		p->src.files[k].fd = -1; /* still p->fds[k]'s */
		file_close(&p->src.files[k]);
		memset(&p->src.files[k], 0, sizeof(p->src.files[k]));
	}
	free(full);
	free(origin->path);
	origin->path = NULL;
	return -EINVAL;
}

/*
 * The filesystem of p's files and, for staged copies, the copies'
 * directory: the origin's filesystem, as when it was staged, by statfs or
 * else the mount table's entry for the origin's device. Where neither
 * tells (a FUSE server failing statfs), p->fs_unknown: the copy is kept
 * as the previous process staged it, and the origin is taken as remote
 * (polled where watch = auto), the choice that misses no change; the
 * copy's own filesystem would have said local and, under stage = auto,
 * thrown the copy away.
 */
static int
note_filesystem(struct restore_prepared *p, const char *stage_dir)
{
	struct statfs sfs;

	if (p->origin[0].path == NULL) {
		gen_source_fs(&p->src, &p->fs);
		gen_free_origin(p->origin, p->g->nfiles);
		p->origin = NULL;
		return 0;
	}
	if (statfs(p->origin[0].path, &sfs) == 0) {
		fstype_classify((unsigned long)sfs.f_type, &p->fs);
	} else if (fstype_of_dev("/proc/self/mountinfo", p->origin[0].st.st_dev, &p->fs) < 0) {
		p->fs = (struct fs_info){ .remote = true };
		snprintf(p->fs.name, sizeof(p->fs.name), "unknown");
		p->fs_unknown = true;
	}
	if (stage_dir_of(stage_dir, p->src.files[0].path, &p->staged_dir) <= 0) {
		p->staged_dir = NULL;
		return error_set(-EINVAL, "its staged copy %s is not in stage_dir",
			p->src.files[0].path);
	}
	return 0;
}

void
restore_check_generation(struct restore_prepared *p, const char *path, const char *stage_dir)
{
	const struct fdstore_generation *g = p->g;
	struct mountrule_walk walk;
	struct index_header h;
	char *dir = NULL;
	void *map = NULL;
	int err;

	mountrule_walk_init(&walk); /* its files' paths: one run (mountrule.h) */
	p->src = (struct model_source){ .format = FORMAT_SAFETENSORS };
	if ((err = restore_check_index(p->index_fd, g->index_fdname, g->index_size, g->nfiles,
		     &h, &map)) < 0)
		goto out;
	if ((p->src.files = calloc(g->nfiles ? g->nfiles : 1, sizeof(*p->src.files))) == NULL ||
		(p->origin = calloc(g->nfiles ? g->nfiles : 1, sizeof(*p->origin))) == NULL) {
		err = error_set(-ENOMEM, "out of memory");
		goto out;
	}
	if ((err = files_dir(path, &dir)) == 0)
		for (uint32_t k = 0; k < g->nfiles && err == 0; k++)
			if ((err = check_file(p, &walk, stage_dir, dir, k, map, &h)) == 0)
				p->src.nfiles = k + 1;
	/* All copies or none: a mix is not what any process staged. */
	for (uint32_t k = 1; err == 0 && k < g->nfiles; k++)
		if ((p->origin[k].path == NULL) != (p->origin[0].path == NULL))
			err = error_set(-EINVAL, "some of its files are staged copies, some not");
	if (err == 0 && g->nfiles == 0)
		err = error_set(-EINVAL, "it has no files");
	/* The sparse-file check a load makes (rev177 I): a wcached from
	 * before it (6089f8a) may have loaded and stored a model mostly
	 * holes, which would serve on, warmed as zeros. */
	if (err == 0)
		err = gen_check_holes(&p->src);
	if (err == 0 && (err = gen_open_served(&p->src, &p->served)) == 0)
		err = note_filesystem(p, stage_dir);
out:
	mountrule_walk_end(&walk);
	free(dir);
	if (map != NULL)
		munmap(map, (size_t)g->index_size);
	if ((p->err = err) < 0)
		snprintf(p->why, sizeof(p->why), "%s", error_get());
}

/* The place a load of the model configured at path finds its file named
 * file in: that file for a model that is one .safetensors file, else its
 * directory (allocated; NULL: out of memory). */
static char *
file_place(const char *file, const char *path)
{
	return file_has_suffix(path, ".safetensors") ? strdup(file) : path_dir(file);
}

/* file_place() of the open file fd where /proc/self/fd names it, absolute
 * and not removed (where it was says nothing of whose it was); else NULL. */
static char *
fd_place(int fd, const char *path)
{
	char *name = mountrule_fd_realpath(NULL, fd, path, NULL, 0), *place;

	if (name == NULL)
		return NULL;
	place = file_place(name, path);
	free(name);
	return place;
}

/* What restore_owners_tree's walk holds the links on a path to: their
 * makers may be root or owner alone; why (len bytes) says which was not. */
struct owners_walk {
	uid_t owner;
	char *why;
	size_t len;
};

/* registry_walk_links' judge for restore_owners_tree: a link made by root
 * or the stored file's owner, else -EXDEV with why; a directory, 0 (none
 * bound: nothing is recorded of this walk). */
static int
owners_link(const struct registry_link_seen *l, void *arg)
{
	const struct owners_walk *o = arg;
	uid_t uid = l->st->st_uid;

	if (l->target[0] == '\0' || uid == 0 || uid == o->owner)
		return 0;
	snprintf(o->why, o->len, "the path goes through the symbolic link %.300s (to %.300s) "
		"made by uid %u, in %.300s: neither root nor the owner (uid %u) of its stored "
		"file, who may have pointed it at where he moved that file", l->path, l->target,
		(unsigned)uid, l->dir, (unsigned)o->owner);
	return -EXDEV;
}

int
restore_owners_tree(const char *path, uid_t owner, const char *root, uid_t root_uid,
	dev_t dir_dev, ino_t dir_ino, char *why, size_t len)
{
	struct owners_walk o = { .owner = owner, .why = why, .len = len };
	struct registry_walk *w;
	const struct stat *dir;
	int err;

	if (root_uid != 0 && root_uid != owner) {
		snprintf(why, len, "the tree %.600s it is found in is uid %u's, neither root's nor "
			"the owner's (uid %u) of its stored file: anyone who may rename entries in "
			"the file's directory may have moved it there", root, (unsigned)root_uid,
			(unsigned)owner);
		return -1;
	}
	if ((w = malloc(sizeof(*w))) == NULL) {
		snprintf(why, len, "%s", strerror(ENOMEM));
		return -1;
	}
	if ((err = registry_walk_links(path, owners_link, &o, w)) < 0 && w->refused)
		snprintf(why, len, "%s", w->why); /* a mount it does not cross */
	else if (err < 0 && err != -EXDEV)
		snprintf(why, len, "its path %.600s could not be walked (%s)", path,
			strerror(-err));
	/* The walk ended where the files are: the path was not swapped
	 * between the look that found them and this one. */
	dir = S_ISDIR(w->end.st_mode) ? &w->end : &w->end_dir;
	if (err == 0 && (dir->st_dev != dir_dev || dir->st_ino != dir_ino)) {
		snprintf(why, len, "its path %.600s led elsewhere while its stored file was looked "
			"for", path);
		err = -ESTALE;
	}
	free(w);
	return err < 0 ? -1 : 0;
}

/* The owner of p's stored file 0 (checked): by its stored descriptor, or
 * for a staged copy its origin's as the check found it: 0, or -1. */
static int
stored_owner(const struct restore_prepared *p, uid_t *uid)
{
	struct stat st;

	if (p->origin != NULL && p->src.nfiles > 0 && p->origin[0].path != NULL) {
		*uid = p->origin[0].st.st_uid;
		return 0;
	}
	if (p->g->nfiles == 0 || p->fds[0] < 0 || fstat(p->fds[0], &st) != 0)
		return -1;
	*uid = st.st_uid;
	return 0;
}

int
restore_found_tree_owned(const struct restore_prepared *p, const char *path,
	const struct gen_found_tree *found)
{
	char why[ERROR_MAX];
	uid_t owner;

	return found->root != NULL && found->dir_known && stored_owner(p, &owner) == 0 &&
		restore_owners_tree(path, owner, found->root, found->uid, found->dir_dev,
			found->dir_ino, why, sizeof(why)) == 0;
}

void
restore_moved_tree(struct restore_prepared *p, const char *path)
{
	struct gen_found_tree found = { .root = NULL };
	char *place;

	if (!p->moved || p->origin != NULL || p->src.nfiles == 0 || p->src.files[0].fd < 0 ||
		(place = fd_place(p->src.files[0].fd, path)) == NULL)
		return;
	free(p->resolved_path);
	/* the place's real path by its judged walk, never by name: bob may
	 * have moved the file beneath his own FUSE mount (review rev210 H1) */
	p->resolved_path = gen_resolved_path(place, mountrule_realpath(NULL, place, NULL, 0),
		&p->src, NULL, &found);
	/* Only a tree of its file's owner (or root's), reached by no one
	 * else's link (review rev213 H1, H2): else none, and the reload
	 * waits for the operator's. */
	if (found.root != NULL && !restore_found_tree_owned(p, place, &found)) {
		free(found.root);
		found.root = NULL;
		free(p->resolved_path);
		p->resolved_path = NULL;
	}
	free(p->tree_root);
	p->tree_root = found.root;
	p->tree_uid = found.uid;
	p->tree_ino_known = found.root_known;
	p->tree_dev = found.root_dev;
	p->tree_ino = found.root_ino;
	free(place);
}

/* Whether p's stored file k is a staged copy (described with an origin,
 * or under stage_dir): its owner is its origin's, not told here. */
static int
stored_copy(const struct restore_prepared *p, uint32_t k, const char *stage_dir)
{
	const struct fdstore_file *f = &p->g->files[k];
	char *copy = NULL;
	int staged;

	if (f->origin_dev != 0 || f->origin_ino != 0)
		return 1;
	staged = restore_staged_copy(stage_dir, p->fds[k], &copy);
	free(copy);
	return staged != 0;
}

void
restore_tell_files(struct restore_prepared *p, const char *stage_dir, const char *root)
{
	const struct fdstore_generation *g = p->g;
	struct registry_kept_files k = { .nfiles = g->nfiles };
	char buf[PATH_MAX], *dir;

	if (g->nfiles == 0 || (k.owners = calloc(g->nfiles, sizeof(*k.owners))) == NULL ||
		(k.ids = calloc(g->nfiles, sizeof(*k.ids))) == NULL) {
		free(k.owners);
		return;
	}
	for (uint32_t i = 0; i < g->nfiles; i++) {
		struct stat st;

		if (p->fds[i] < 0 || stored_copy(p, i, stage_dir) ||
			fstat(p->fds[i], &st) == -1 || !S_ISREG(st.st_mode)) {
			free(k.owners);
			free(k.ids);
			return;
		}
		k.owners[i] = st.st_uid;
		k.ids[i] = (struct registry_file_id){ .dev = st.st_dev, .ino = st.st_ino,
			.ctime_ns = file_time_ns(&st.st_ctim) };
	}
	/* What its path named, as the load that made it told it (the store
	 * recorded it: version 10); else where its one file lies now. */
	k.named_told = g->named != FDSTORE_NAMED_UNRECORDED;
	if (k.named_told)
		k.named_file = g->named == FDSTORE_NAMED_FILE;
	else if (g->nfiles == 1 && root != NULL &&
		fd_path(p->fds[0], NULL, buf, sizeof(buf)) == 0 &&
		(dir = path_dir(buf)) != NULL) {
		k.named_file = strcmp(dir, root) == 0;
		free(dir);
	}
	p->kept = k;
}

/* The real path of fd (an O_PATH descriptor of the judged walk's) as
 * /proc/self/fd names it (mountrule_fd_realpath), allocated; NULL where
 * it has none: removed (fd_path's name, its " (deleted)" taken off, was
 * taken before, and judged_dir took a directory removed since its walk
 * for the one at its path), or on a mount detached since (rev215 L1). */
static char *
walked_path(int fd)
{
	return mountrule_fd_realpath(NULL, fd, "a walked path", NULL, 0);
}

/* The directory path, reached by the judged walk in the run w (nothing
 * looked up in a user's FUSE mount) at that very path (path is canonical:
 * a link followed on the way leads elsewhere), its fstat in *st: 0, or -1. */
static int
judged_dir(struct mountrule_walk *w, const char *path, struct stat *st)
{
	char why[8], *real;
	int fd = mountrule_open(w, path, why, sizeof(why)), same;

	if (fd < 0)
		return -1;
	real = walked_path(fd);
	same = real != NULL && strcmp(real, path) == 0 && fstat(fd, st) == 0 &&
		S_ISDIR(st->st_mode);
	free(real);
	close(fd);
	return same ? 0 : -1;
}

/*
 * The tree of the model file at the real path file (gen_tree_root's: the
 * root tree_split gives its directory, widened to a hub repo models--X
 * for its blobs/ where the repo's owner owns blobs/ too), each directory
 * reached by the judged walk in the run w, never by name (review rev210
 * H1): the root (allocated) and its owner in *uid, its fstat in *st; NULL.
 */
static char *
judged_tree_root(struct mountrule_walk *w, const char *file, uid_t *uid, struct stat *st)
{
	char *dir = path_dir(file), *root = NULL, *sub = NULL, *up;
	const char *name, *repo;
	struct stat top;

	if (dir == NULL || tree_split(dir[0] != '\0' ? dir : "/", &root, &sub) < 0) {
		free(dir);
		return NULL; /* tree_split failed: it freed both */
	}
	free(dir);
	free(sub);
	if (judged_dir(w, root, st) < 0) {
		free(root);
		return NULL;
	}
	*uid = st->st_uid;
	name = strrchr(root, '/');
	if (name == NULL || strcmp(name, "/blobs") != 0 || (up = path_dir(root)) == NULL)
		return root;
	repo = strrchr(up, '/');
	if (repo != NULL && strncmp(repo, "/models--", 9) == 0 && repo[9] != '\0' &&
		judged_dir(w, up, &top) == 0 && top.st_uid == st->st_uid) {
		free(root);
		*st = top;
		return up;
	}
	free(up);
	return root;
}

/*
 * The file the model's path leads to in place of p's stored file 0: the
 * path itself for a model that is one .safetensors file, else the file of
 * its stored index's name in the directory the path names (the path, or
 * the shard index's directory), as check_file names it; allocated, NULL
 * with p->tree_why set.
 */
static char *
stored_file_name(struct restore_prepared *p, struct mountrule_walk *w, const char *path)
{
	const struct fdstore_generation *g = p->g;
	char why[MOUNTRULE_WHY], *dir, *at = NULL;
	struct index_header h;
	const char *fname;
	void *map = NULL;
	uint64_t size;
	struct stat st;

	if (file_has_suffix(path, ".safetensors"))
		return strdup(path);
	if (mountrule_stat(w, path, &st, why, sizeof(why)) == -1) {
		snprintf(p->tree_why, sizeof(p->tree_why), "%s", errno == EXDEV ? why :
			strerror(errno));
		return NULL;
	}
	if (restore_check_index(p->index_fd, g->index_fdname, g->index_size, g->nfiles, &h,
		    &map) < 0 || index_file_at(map, &h, 0, &fname, &size) < 0 ||
		strchr(fname, '/') != NULL) {
		snprintf(p->tree_why, sizeof(p->tree_why), "its stored index names no file");
	} else if ((dir = S_ISDIR(st.st_mode) ? strdup(path) : path_dir(path)) != NULL) {
		at = path_join(dir, fname);
		free(dir);
	}
	if (map != NULL)
		munmap(map, (size_t)g->index_size);
	return at;
}

/*
 * Where p's stored file 0 (not a copy) is, if the model's path, walked
 * in the run w, still leads to that very file (its device and inode): its
 * real path (allocated); else NULL with p->tree_why saying why. A file no
 * longer there tells no tree: anyone who may rename entries in its
 * directory may have put it anywhere he may write, in his own directory
 * under his own FUSE mount too (review rev210 H1).
 */
static char *
stored_file_at_path(struct restore_prepared *p, struct mountrule_walk *w, const char *path)
{
	char why[MOUNTRULE_WHY], *at = stored_file_name(p, w, path), *real = NULL;
	struct stat stored, st;
	int fd;

	if (at == NULL)
		return NULL;
	if ((fd = mountrule_open(w, at, why, sizeof(why))) < 0) {
		snprintf(p->tree_why, sizeof(p->tree_why), "its stored file is no longer at %.300s "
			"(%.600s)",
			at, fd == -EXDEV ? why : strerror(-fd));
	} else if (fstat(p->fds[0], &stored) != 0 || fstat(fd, &st) != 0 ||
		st.st_dev != stored.st_dev || st.st_ino != stored.st_ino ||
		(real = walked_path(fd)) == NULL) {
		snprintf(p->tree_why, sizeof(p->tree_why), "its stored file is no longer at %s "
			"(another file is there)", at);
	}
	if (fd >= 0)
		close(fd);
	free(at);
	return real;
}

/* p->tree_why for copy_origin: the origin is not at path, because why. */
static void
origin_gone(struct restore_prepared *p, const char *path, const char *why)
{
	snprintf(p->tree_why, sizeof(p->tree_why), "its staged copy's origin is no longer at "
		"%.300s (%.600s)", path, why);
}

/* Why the judged walk found no file (fd: mountrule_open's -errno): its own
 * line where it refused a step (-EXDEV: a user's FUSE mount on the way, a
 * link on one...), else errno's (a name missing). */
static const char *
walk_why(int fd, const char *why)
{
	return fd == -EXDEV ? why : strerror(-fd);
}

/*
 * Where the staged copy p->fds[0] was copied from, if the model's path,
 * walked in the run w, still leads to that very file (the device and
 * inode the description records for its origin): the real path of the
 * file the path names, or of the one of the copy's name in the directory
 * it names, allocated; NULL when neither is the origin (or it was not
 * recorded: version 3), p->tree_why saying so, and why: the walk's own
 * reason where it was refused or found nothing (review rev211 L3).
 * Nothing is looked up by name (review rev210 H1). The copy's own name is
 * its file's under stage_dir, found by identity (fd_path).
 */
static char *
copy_origin(struct restore_prepared *p, struct mountrule_walk *w, const char *path,
	const char *stage_dir)
{
	const struct fdstore_file *f = &p->g->files[0];
	char buf[PATH_MAX], why[MOUNTRULE_WHY], *real = NULL, *dir = NULL, *at = NULL;
	char *real_at = NULL;
	const char *name;
	struct stat st;
	int fd;

	if (f->origin_dev == 0 && f->origin_ino == 0) {
		origin_gone(p, path, "the description does not say which file the copy was "
			"copied from: stored by an older wcached");
		return NULL;
	}
	if (fd_path(p->fds[0], stage_dir, buf, sizeof(buf)) < 0 ||
		(name = strrchr(buf, '/')) == NULL) {
		origin_gone(p, path, "the copy's own name cannot be told");
		return NULL;
	}
	if ((fd = mountrule_open(w, path, why, sizeof(why))) < 0) {
		origin_gone(p, path, walk_why(fd, why));
		return NULL;
	}
	if (fstat(fd, &st) != 0 || (real = walked_path(fd)) == NULL) {
		origin_gone(p, path, "the file it leads to cannot be told");
		close(fd);
		return NULL;
	}
	close(fd);
	fd = -1; /* the next walk's, where it runs (review rev211 L1: closed twice) */
	if (!S_ISDIR(st.st_mode) && (uint64_t)st.st_dev == f->origin_dev &&
		(uint64_t)st.st_ino == f->origin_ino)
		return real;
	dir = S_ISDIR(st.st_mode) ? real : path_dir(real);
	if (dir == NULL || (at = path_join(dir, name + 1)) == NULL)
		origin_gone(p, path, strerror(ENOMEM));
	else if ((fd = mountrule_open(w, at, why, sizeof(why))) < 0)
		origin_gone(p, at, walk_why(fd, why));
	else if (fstat(fd, &st) != 0)
		origin_gone(p, at, "the file it leads to cannot be told");
	else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_dev != f->origin_dev ||
		(uint64_t)st.st_ino != f->origin_ino)
		origin_gone(p, at, "another file is there");
	else if ((real_at = walked_path(fd)) == NULL)
		origin_gone(p, at, "its real path cannot be told");
	if (fd >= 0)
		close(fd);
	free(at);
	if (dir != real)
		free(dir);
	free(real);
	return real_at;
}

/* Drops the tree p->tree_root (uid, inode) found. */
static void
free_tree(struct restore_prepared *p)
{
	free(p->tree_root);
	p->tree_root = NULL;
	p->tree_uid = 0;
}

/*
 * Whether p->tree_root, the tree of file (p's stored file 0, or a copy's
 * origin: copy), where the model's path leads, is one a stored file
 * tells: its owner's (or root's), the path walked through no link of
 * anyone else's to the file's directory (restore_owners_tree, review
 * rev213 H2). A neighbour who moved the file into his own directory and
 * pointed his link on the path at it would make the tree his. 1; or 0
 * with p->tree_why saying why. In the run w.
 */
static int
file_owners_tree(struct restore_prepared *p, struct mountrule_walk *w, const char *path,
	const char *file, int copy)
{
	const struct fdstore_file *f = &p->g->files[0];
	char *dir = path_dir(file), why[MOUNTRULE_WHY];
	struct stat fst, dst;
	int ok;

	if (copy)
		ok = mountrule_stat(w, file, &fst, why, sizeof(why)) == 0 &&
			S_ISREG(fst.st_mode) && (uint64_t)fst.st_dev == f->origin_dev &&
			(uint64_t)fst.st_ino == f->origin_ino;
	else
		ok = fstat(p->fds[0], &fst) == 0;
	ok = ok && dir != NULL && judged_dir(w, dir, &dst) == 0;
	if (!ok)
		snprintf(p->tree_why, sizeof(p->tree_why), "%s was no longer there as its tree "
			"was told", file);
	else
		ok = restore_owners_tree(path, fst.st_uid, p->tree_root, p->tree_uid, dst.st_dev,
			dst.st_ino, p->tree_why, sizeof(p->tree_why)) == 0;
	free(dir);
	return ok;
}

void
restore_stored_tree(struct restore_prepared *p, const char *path, const char *stage_dir)
{
	struct mountrule_walk w;
	char *file;
	struct stat st = { 0 };
	int copy;

	p->tree_why[0] = '\0';
	if (p->g->nfiles == 0 || p->fds[0] < 0)
		return;
	mountrule_walk_init(&w);
	/* A staged copy's tree is its origin's, where the path leads to it. */
	copy = stored_copy(p, 0, stage_dir);
	file = copy ? copy_origin(p, &w, path, stage_dir) : stored_file_at_path(p, &w, path);
	free(p->tree_root);
	p->tree_root = file != NULL ? judged_tree_root(&w, file, &p->tree_uid, &st) : NULL;
	if (file != NULL && p->tree_root == NULL)
		snprintf(p->tree_why, sizeof(p->tree_why), "the tree of %s could not be told "
			"(a directory above it was not reached by the judged walk)", file);
	else if (p->tree_root != NULL && !file_owners_tree(p, &w, path, file, copy))
		free_tree(p); /* file_owners_tree said why */
	else if (p->tree_root != NULL)
		p->tree_why[0] = '\0';
	p->tree_ino_known = p->tree_root != NULL;
	p->tree_dev = p->tree_ino_known ? st.st_dev : 0;
	p->tree_ino = p->tree_ino_known ? st.st_ino : 0;
	mountrule_walk_end(&w);
	free(file);
}

void
restore_prepared_clear(struct registry *r, struct restore_prepared *p)
{
	/* The files taken, on failure (none once served); on a remote
	 * filesystem closed off the loop (gen_close_files). */
	gen_close_files(r, &p->fs, p->served, &p->src);
	p->served = NULL;
	gen_free_origin(p->origin, p->g != NULL ? p->g->nfiles : 0);
	p->origin = NULL;
	free(p->staged_dir);
	p->staged_dir = NULL;
	free(p->resolved_path);
	p->resolved_path = NULL;
	free(p->tree_root);
	p->tree_root = NULL;
	registry_kept_clear(&p->kept);
	free(p->fds);
	p->fds = NULL;
	free(p->at);
	p->at = NULL;
}
