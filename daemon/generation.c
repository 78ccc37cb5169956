/*
 * generation.c: the state machine of a generation (see generation.h), from
 * its making to its free: warming on the pool, promotion to current,
 * eviction, attaching while cold, being modified in place, and freeing once
 * nothing refers to it. The registry (and the warm restart) make
 * generations and decide policy over models (the memory budget, pins);
 * pages.c works on their pages and reports back through page_hooks below.
 * Nothing here calls the registry or the warm restart: what they must
 * hear goes through struct registry's hooks (promoted, closed, changed).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "closer.h"
#include "diracl.h"
#include "format/tree.h"
#include "generation.h"
#include "log.h"
#include "mountrule.h"
#include "pages.h"
#include "proto/memfds.h"
#include "stage.h"

static const char *const state_names[] = {
	[GEN_NEW] = "new",
	[GEN_WARMING] = "warming",
	[GEN_READY] = "ready",
	[GEN_COLD] = "cold",
	[GEN_REWARM] = "warming",
	[GEN_MODIFIED] = "modified",
	[GEN_FAILED] = "failed",
	[GEN_CLOSED] = "closed",
};

#define TO(s) (1u << (s))

/* allowed[from]: the states from may move to (the table in generation.h). */
static const unsigned allowed[] = {
	[GEN_NEW] = TO(GEN_WARMING) | TO(GEN_READY) | TO(GEN_CLOSED),
	[GEN_WARMING] = TO(GEN_READY) | TO(GEN_COLD) | TO(GEN_MODIFIED) | TO(GEN_FAILED) |
		TO(GEN_CLOSED),
	[GEN_READY] = TO(GEN_WARMING) | TO(GEN_COLD) | TO(GEN_MODIFIED) | TO(GEN_FAILED) |
		TO(GEN_CLOSED),
	[GEN_COLD] = TO(GEN_WARMING) | TO(GEN_READY) | TO(GEN_REWARM) | TO(GEN_MODIFIED) |
		TO(GEN_FAILED) | TO(GEN_CLOSED),
	[GEN_REWARM] = TO(GEN_WARMING) | TO(GEN_READY) | TO(GEN_COLD) | TO(GEN_MODIFIED) |
		TO(GEN_FAILED) | TO(GEN_CLOSED),
	[GEN_MODIFIED] = TO(GEN_CLOSED),
	[GEN_FAILED] = TO(GEN_MODIFIED) | TO(GEN_CLOSED),
	[GEN_CLOSED] = 0,
};

const char *
gen_state_name(enum gen_state s)
{
	return (unsigned)s < sizeof(state_names) / sizeof(state_names[0]) ? state_names[s] : "?";
}

int
gen_set_state(struct generation *g, enum gen_state to, const char *why)
{
	enum gen_state from = g->state;

	if (from == to)
		return 0;
	if ((allowed[from] & TO(to)) == 0) {
		log_errorx("model \"%s\": generation %" PRIu64 ": refused transition %s -> %s (%s)",
			g->model_name, g->number, gen_state_name(from), gen_state_name(to), why);
		return -EINVAL;
	}
	/* REWARM and WARMING share a word; the log line tells them apart. */
	log_debug("model \"%s\": generation %" PRIu64 ": %s%s -> %s%s (%s)", g->model_name,
		g->number, gen_state_name(from), from == GEN_REWARM ? " (after eviction)" : "",
		gen_state_name(to), to == GEN_REWARM ? " (after eviction)" : "", why);
	g->state = to;
	return 0;
}

int
gen_attachable(const struct generation *g)
{
	return g->state == GEN_WARMING || g->state == GEN_READY || g->state == GEN_COLD ||
		g->state == GEN_REWARM;
}

int
gen_is_warming(const struct generation *g)
{
	return g->state == GEN_WARMING || g->state == GEN_REWARM;
}

int
gen_holds_memory(const struct generation *g)
{
	return g->state == GEN_WARMING || g->state == GEN_READY || g->state == GEN_REWARM;
}

/* Milliseconds on the registry's loop clock (registry_now_ms). */
static uint64_t
now_ms(const struct registry *r)
{
	return uv_now(r->loop);
}

int
gen_is_live(const struct generation *g)
{
	return g->model != NULL && (g->model->current == g || g->model->pending == g);
}

uint64_t
gen_origin_fs(const struct generation *g)
{
	dev_t dev = 0;

	if (g->origin != NULL && g->norigin > 0)
		dev = g->origin[0].st.st_dev;
	else if (g->origin == NULL && g->source.nfiles > 0)
		dev = g->source.files[0].st.st_dev;
	return workq_fs(g->fs.remote, dev);
}

void
gen_source_fs(const struct model_source *src, struct fs_info *out)
{
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < src->nfiles; i++) {
		struct fs_info fs;

		if (fstype_of_fd(src->files[i].fd, &fs) == 0 && (i == 0 || fs.remote) &&
			!out->remote)
			*out = fs;
	}
	if (src->nfiles == 0)
		fstype_classify(0, out);
}

void
gen_free_origin(struct gen_origin *origin, size_t n)
{
	for (size_t i = 0; origin != NULL && i < n; i++)
		free(origin[i].path);
	free(origin);
}

/* A model's tree as gen_resolved_path looks in it: the root's path and
 * descriptor (-1: none), the model directory inside it (tree_split) and
 * its descriptor (-1: none), both opened with no link followed, and
 * whether the kernel has no openat2 (then no link inside the tree is
 * followed either: a file must be itself at its place). */
struct gen_tree {
	char *root;
	int fd, dir;
	char *sub;
	bool nosys;
	bool take_unchecked; /* nosys: a file reached through a link inside the
				tree (linked_inside) is at its place: the
				operator's load, her word (review rev191 F4) */
	bool unchecked;      /* nosys: a file was reached so */
};

/* openat2(2) of rel beneath at with resolve, O_PATH (tree_openat2): its
 * descriptor, or -1 with errno. */
static int
open_beneath(int at, const char *rel, unsigned long long resolve, unsigned long long flags)
{
	return tree_openat2(at, rel, O_PATH | O_CLOEXEC | flags, resolve);
}

/* Once per process, the first time the kernel turns openat2 down: what
 * the tree rules are without it (review rev187 R4). */
static void
note_no_openat2(void)
{
	static int noted;

	if (__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED) == 0)
		log_warnx("this kernel has no openat2(2) (before Linux 5.6, or a seccomp filter "
			"refuses it): a model's files are opened by a fallback that checks links "
			"inside its tree by path, which a rename racing the open defeats; a reload "
			"wcached makes by itself takes only files that are at their place with no "
			"symbolic link, others wait for an operator's reload");
}

/* The tree of dir (a realpath): its root and model directory opened with
 * no link followed (a component renamed into a link since the realpath
 * fails it). */
static void
gen_tree_open(const char *dir, struct gen_tree *t)
{
	t->root = NULL;
	t->fd = t->dir = -1;
	t->sub = NULL;
	t->nosys = t->take_unchecked = t->unchecked = false;
	if (dir == NULL || tree_split(dir[0] != '\0' ? dir : "/", &t->root, &t->sub) < 0)
		return;
	t->fd = open_beneath(AT_FDCWD, t->root, RESOLVE_NO_SYMLINKS, O_DIRECTORY);
	if ((t->nosys = t->fd == -1 && errno == ENOSYS)) {
		note_no_openat2();
		t->fd = tree_open_dir_no_links(AT_FDCWD, t->root);
	}
	t->dir = t->fd >= 0 ? tree_open_dir_no_links(t->fd, t->sub) : -1;
}

static void
gen_tree_close(struct gen_tree *t)
{
	if (t->dir >= 0)
		close(t->dir);
	if (t->fd >= 0)
		close(t->fd);
	free(t->sub);
	free(t->root);
}

/* Whether the file whose fstat is st is itself (a regular file, no link)
 * the entry name of the model directory of t, which was opened with no
 * link followed: no component of its path can be a link renamed over a
 * directory since it was resolved (review rev187 R1: lstat(2) of the path
 * follows those). */
static int
is_itself_at(const struct gen_tree *t, const char *name, const struct stat *st)
{
	struct stat now;

	return t->dir >= 0 && fstatat(t->dir, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
		S_ISREG(now.st_mode) && now.st_dev == st->st_dev && now.st_ino == st->st_ino;
}

/* Where the kernel has no openat2: whether name, in the model directory
 * of t, reaches the file whose fstat is st through a symbolic link that
 * stays inside the tree (its realpath beneath the tree's root). Told by
 * path, which a rename racing it defeats (note_no_openat2). */
static int
linked_inside(const struct gen_tree *t, const char *name, const struct stat *st)
{
	char *path = NULL, *real = NULL;
	size_t n = t->root != NULL ? strlen(t->root) : 0;
	struct stat now;
	int in, fd;

	if (t->root == NULL || t->sub == NULL ||
		asprintf(&path, "%s/%s%s", t->root, t->sub, name) < 0)
		return 0;
	/* walked, its mounts judged (a neighbour's FUSE mount refused), and
	 * told by the walk's descriptor: no lookup by name (realpath(3) and
	 * stat(2) of its answer asked his server) */
	if ((fd = mountrule_open(NULL, path, NULL, 0)) >= 0) {
		real = mountrule_fd_realpath(NULL, fd, path, NULL, 0);
		in = real != NULL && (strcmp(t->root, "/") == 0 ||
			(strncmp(real, t->root, n) == 0 && real[n] == '/')) &&
			fstat(fd, &now) == 0 && S_ISREG(now.st_mode) &&
			now.st_dev == st->st_dev && now.st_ino == st->st_ino;
		close(fd);
	} else
		in = 0;
	free(real);
	free(path);
	return in;
}

/* rel beneath at, O_PATH, with no mount crossed unjudged (RESOLVE_NO_XDEV
 * under tree_mounts; a crossing walked again one name at a time by
 * tree_walk, each mount judged before anything on it is looked up: a link
 * into a neighbour's FUSE directory inside the tree asks his server
 * nothing, review rev207 H5): the descriptor, or -1. */
static int
open_in_tree(int at, const char *rel)
{
	/* judged as tree_open_file's walk is */
	struct tree_walk w = { .judge = tree_mounts_judge, .beneath = true };
	unsigned long long resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
	char why[128];
	int fd;

	fd = open_beneath(at, rel, resolve | (tree_mounts != NULL ? RESOLVE_NO_XDEV : 0), 0);
	if (fd == -1 && errno == EXDEV && tree_mounts != NULL)
		fd = tree_walk(at, rel, &w, why, sizeof(why));
	return fd < 0 ? -1 : fd;
}

/* Whether the file whose fstat is st is the file name (a plain name) of
 * the model directory of its tree t: found beneath the tree's root with no
 * link out of the tree followed (openat2 RESOLVE_BENEATH), as the model's
 * files are opened (tree.h), no mount crossed but as tree.h's rule lets
 * their open cross it (open_in_tree). A stat(2) of the place followed a link out of
 * the tree to another user's file and took it for the file at its place
 * (review rev185 F5); where the kernel has no openat2, the file must be
 * itself at its place (review rev187 R4), or, at the operator's load
 * (t->take_unchecked), reached through a link inside the tree (review
 * rev191 F4); t->unchecked notes a file reached so. */
static int
is_file_at(struct gen_tree *t, const char *name, const struct stat *st)
{
	char *rel = NULL;
	struct statx now;
	int fd = -1, same;

	if (t->nosys) {
		if (is_itself_at(t, name, st))
			return 1;
		if (!linked_inside(t, name, st))
			return 0;
		t->unchecked = true;
		return t->take_unchecked;
	}
	if (t->fd >= 0 && t->sub != NULL && asprintf(&rel, "%s%s", t->sub, name) < 0)
		rel = NULL;
	fd = rel != NULL ? open_in_tree(t->fd, rel) : -1;
	/* Its device and inode, asking no server: a link renamed over the
	 * name may lead to a neighbour's FUSE mount that never answers (review
	 * rev205 M3). */
	same = fd >= 0 &&
		statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &now) == 0;
	if (fd >= 0)
		close(fd);
	free(rel);
	return same && makedev(now.stx_dev_major, now.stx_dev_minor) == st->st_dev &&
		now.stx_ino == st->st_ino;
}

/* Whether the file opened as file_path, whose fstat is st, is at its place
 * under the resolved path whose lstat is at: that path itself (named
 * file_name in its directory, NULL when it is a directory), or the file of
 * its name in the model directory (the path when a directory, else its
 * directory), or beside the shard index, in the tree t. */
static int
at_its_place(const struct stat *at, struct gen_tree *t, const char *file_name,
	const char *file_path, const struct stat *st)
{
	const char *name = file_path != NULL ? strrchr(file_path, '/') : NULL;

	/* A model that is one file: that file, itself at its name in the
	 * directory opened with no link followed. */
	if (file_name != NULL && at->st_dev == st->st_dev && at->st_ino == st->st_ino &&
		is_itself_at(t, file_name, st))
		return 1;
	/* Else a file of the directory, or beside the shard index. */
	return name != NULL && is_file_at(t, name + 1, st);
}

/*
 * root as the tree of a hub repo's file: <R>/models--X, with its owner in
 * *owner, for its blobs/ directory <R>/models--X/blobs (what a snapshot's
 * links point into) where the repo's owner owns blobs/ too; else root
 * itself, *owner untouched (root's own owner). The repo is opened with no
 * link followed, and its blobs/ must be the directory whose fstat is
 * opened (when not NULL: the one the files were found beneath). Takes
 * root; NULL when out of memory.
 *
 * A hub repo is known by its name only, and a name is anyone's to give: a
 * user who may write in a directory named models--X (a shared hub cache's
 * repo made writable for all, a shared place she made one in) could make
 * blobs/ there, hers. Taken as the repo, owned by her (blobs/'s owner), it
 * passed as a sibling of her own model's tree (sibling_swap), and every
 * snapshot of the repo's owner was then in "the same tree" as her model
 * (same_tree). Widened only where the repo and blobs/ have one owner, and
 * with the repo's owner, the tree is the repo's own: a name then adds
 * nothing its owner did not make (her blobs/ stays a tree of its own,
 * inside another user's directory, which no swap of hers reaches).
 */
static char *
blob_repo(char *root, uid_t *owner, const struct stat *opened)
{
	char *up = root != NULL ? path_dir(root) : NULL, *repo;
	const char *name = root != NULL ? strrchr(root, '/') : NULL;
	struct stat blobs, top;
	int fd;

	repo = up != NULL ? strrchr(up, '/') : NULL;
	if (name != NULL && strcmp(name, "/blobs") == 0 && repo != NULL &&
		strncmp(repo, "/models--", 9) == 0 && repo[9] != '\0' &&
		(fd = tree_open_dir_no_links(AT_FDCWD, up)) >= 0) {
		int ok = fstat(fd, &top) == 0 &&
			fstatat(fd, "blobs", &blobs, AT_SYMLINK_NOFOLLOW) == 0 &&
			S_ISDIR(blobs.st_mode) && blobs.st_uid == top.st_uid &&
			(opened == NULL || (blobs.st_dev == opened->st_dev &&
						   blobs.st_ino == opened->st_ino));

		close(fd);
		if (ok) {
			*owner = top.st_uid;
			free(root);
			return up;
		}
	}
	free(up);
	return root;
}

/* found's root and owner from t, whose files were found beneath it:
 * its descriptor's owner, never a later stat of its path (review rev187
 * R2). found->root stays NULL when it cannot be told. And the model
 * directory they were found in, from its descriptor: its device, inode,
 * owner, group and mode. */
static void
found_tree(const struct gen_tree *t, struct gen_found_tree *found)
{
	struct stat st;

	if (t->dir >= 0 && diracl_fstat(t->dir, &st) == 0) {
		found->dir_known = 1;
		found->dir_dev = st.st_dev;
		found->dir_ino = st.st_ino;
		found->dir_uid = st.st_uid;
		found->dir_gid = st.st_gid;
		found->dir_mode = st.st_mode;
	}
	if (t->fd >= 0 && t->root != NULL && fstat(t->fd, &st) == 0 &&
		(found->root = strdup(t->root)) != NULL) {
		found->uid = st.st_uid;
		found->root = blob_repo(found->root, &found->uid, &st);
		found->root_known = strcmp(found->root, t->root) == 0;
		found->root_dev = st.st_dev;
		found->root_ino = st.st_ino;
	}
}

char *
gen_resolved_path(const char *path, char *before, const struct model_source *src,
	const struct gen_origin *origin, struct gen_found_tree *found)
{
	/* the path's real path now by its judged walk, never realpath(3): a
	 * link renamed in since may lead into a neighbour's FUSE mount */
	char *now = before != NULL ? mountrule_realpath(NULL, path, NULL, 0) : NULL, *dir = NULL;
	const char *file_name = NULL;
	int same = now != NULL && strcmp(now, before) == 0;
	struct gen_tree tree;
	struct stat at;

	free(now);
	if (found != NULL) {
		found->root = NULL;
		found->dir_known = 0;
		found->link_unchecked = 0;
	}
	/* One lstat of the resolved path tells a file from a directory;
	 * before is a realpath, so a link there now is a path changed since
	 * (review rev185 F2), never the file it leads to. Whether each file
	 * is at its place is asked of the tree opened with no link followed
	 * (lstat follows a link renamed over a directory component). */
	if (same && src->nfiles > 0 && (same = lstat(before, &at) == 0)) {
		dir = S_ISDIR(at.st_mode) ? strdup(before) : path_dir(before);
		file_name = S_ISDIR(at.st_mode) || strrchr(before, '/') == NULL ? NULL :
			strrchr(before, '/') + 1;
	}
	gen_tree_open(dir, &tree);
	tree.take_unchecked = found != NULL && found->operators;
	for (size_t i = 0; same && i < src->nfiles; i++)
		same = origin != NULL ?
			at_its_place(&at, &tree, file_name, origin[i].path, &origin[i].st) :
			at_its_place(&at, &tree, file_name, src->files[i].path, &src->files[i].st);
	if (same && found != NULL)
		found_tree(&tree, found);
	if (found != NULL)
		found->link_unchecked = tree.unchecked;
	gen_tree_close(&tree);
	free(dir);
	if (!same) {
		free(before);
		return NULL;
	}
	return before;
}

char *
gen_tree_root(const char *resolved, uid_t *owner)
{
	char *dir, *root = NULL, *sub = NULL;
	struct stat st;

	if (stat(resolved, &st) == -1)
		return NULL;
	if ((dir = S_ISDIR(st.st_mode) ? strdup(resolved) : path_dir(resolved)) == NULL)
		return NULL;
	if (tree_split(dir[0] != '\0' ? dir : "/", &root, &sub) < 0)
		root = NULL;
	free(dir);
	free(sub);
	if (root != NULL && stat(root, &st) == -1) {
		free(root);
		return NULL;
	}
	if (root != NULL)
		*owner = st.st_uid;
	return blob_repo(root, owner, NULL);
}

/*
 * Frees g's origin and removes its staged copy (stage.h), on the work
 * queue; at shutdown a copy whose files the manager's store keeps for the
 * next process stays (it removes it when that generation closes). A copy
 * of a generation that closed while serving is removed until wcached
 * stops: a stop ends that removal at its next file, and the next start's
 * sweep removes the rest (a stop must not wait for every unlink of a
 * slow stage_dir). The copies of the generations the stop itself closes
 * are removed whole, as before: a stop without a store leaves no copy of
 * a model it served behind.
 */
static void
gen_free_staged(struct registry *r, struct generation *g)
{
	int closing = __atomic_load_n(&r->closing, __ATOMIC_RELAXED);

	gen_free_origin(g->origin, g->norigin);
	g->origin = NULL;
	g->norigin = 0;
	if (g->staged.dir != NULL && closing && r->fdstore && g->stored_slot != 0)
		free(g->staged.dir);
	else
		stage_remove_later(r->loop, g->staged.dir, closing ? NULL : &r->closing,
			r->stage_dir);
	g->staged.dir = NULL;
}

/* The closer's lane of a model's files on fs (closer.h). */
static uid_t
files_lane(const struct fs_info *fs)
{
	return fs->remote ? CLOSER_DAEMON : CLOSER_LOCAL;
}

void
gen_maybe_free(struct registry *r, struct generation *g)
{
	struct generation **pp;
	uid_t lanes[2];

	if (gen_is_live(g) || g->attached > 0 || g->warm.pending > 0 || g->ops_pending > 0 ||
		g->served_checks > 0 || g->hold_until_ms != 0 || g->kept)
		return;
	for (pp = &r->generations; *pp != NULL; pp = &(*pp)->next)
		if (*pp == g) {
			*pp = g->next;
			break;
		}
	gen_set_state(g, GEN_CLOSED, "unreferenced");
	if (r->closed != NULL)
		r->closed(r, g);
	log_info("model \"%s\": generation %" PRIu64 " closed", g->model_name, g->number);
	/* The index too, off the loop: a model's header decided its size (for
	 * an artifact, the builder's). */
	lanes[0] = g->artifact ? g->builder_uid : CLOSER_LOCAL;
	closer_unmap_close(r->closer, lanes[0], (void *)g->index, g->index_size, g->index_fd);
	closer_unmap_close(r->closer, lanes[0], NULL, 0, g->served_index_fd);
	lanes[1] = g->artifact ? g->builder_uid : files_lane(&g->fs);
	gen_close_files_in(r, lanes[1], g->served_fds, &g->source);
	if (r->handed_over != NULL)
		r->handed_over(r, lanes, lanes[1] == lanes[0] ? 1 : 2);
	gen_free_staged(r, g);
	free(g->warm.jobs);
	free(g->hold_conns);
	free(g->hold_places);
	free(g->holders);
	free(g->gone);
	free(g->adopt_st);
	free(g->relinked_sts);
	free(g->resolved_path);
	free(g->tree_root);
	free(g->links);
	free(g->model_name);
	free(g);
}

/* A second open file description of the file open as fd, checked to be the
 * same inode as st; a descriptor, or a negative errno with the message. */
static int
reopen_served(int fd, const struct stat *st, const char *path)
{
	struct stat now;
	int nfd;

	if ((nfd = fd_reopen_read_only(fd, path)) < 0)
		return nfd;
	/* The same inode as fd, and fd still the file that was loaded. */
	if (fstat(nfd, &now) == -1) {
		int e = errno;

		close(nfd);
		return error_set(-e, "%s: fstat: %s", path, strerror(e));
	}
	if (now.st_dev != st->st_dev || now.st_ino != st->st_ino) {
		close(nfd);
		return error_set(-ESTALE, "%s: the descriptor workers get is not the file "
			"that was loaded", path);
	}
	return nfd;
}

int
gen_open_served(const struct model_source *src, int **out)
{
	size_t n = src->nfiles;
	int *fds = malloc((n ? n : 1) * sizeof(*fds));

	if (fds == NULL)
		return error_set(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		int fd = reopen_served(src->files[i].fd, &src->files[i].st, src->files[i].path);

		if (fd < 0) {
			gen_close_served(fds, i);
			return fd;
		}
		fds[i] = fd;
	}
	*out = fds;
	return 0;
}

/*
 * The walk of a model's holes (gen_check_holes): its files' bytes in all
 * (their sizes at open), and the holes and the data counted so far.
 */
struct holes_walk {
	uint64_t size;
	uint64_t holes;
	uint64_t data;
};

/* holes of size bytes: more than half of them and more than GEN_HOLES_MAX? */
static bool
holes_over_bound(uint64_t holes, uint64_t size)
{
	return holes > size / 2 && holes > GEN_HOLES_MAX;
}

/*
 * w's verdict, as soon as it is known: 1 refused (the holes counted pass
 * the bound), 0 accepted (what is not counted as data yet could not pass
 * it, were it all holes), -1 not known yet. The walk stops at the first
 * two (rev177 H): a file of millions of extents costs no more calls than
 * it takes to tell.
 */
static int
holes_verdict(const struct holes_walk *w)
{
	if (holes_over_bound(w->holes, w->size))
		return 1;
	return holes_over_bound(w->size - w->data, w->size) ? -1 : 0;
}

/* lseek, tried again when a signal interrupted it (a FUSE or NFS request). */
static off_t
seek_again(int fd, off_t off, int whence)
{
	off_t r;

	do
		r = lseek(fd, off, whence);
	while (r == -1 && errno == EINTR);
	return r;
}

/*
 * SEEK_DATA or SEEK_HOLE (whence) at off on f found its end: -EIO with
 * the message when f is shorter than at its open (truncated while read:
 * rev177 H, it was counted as holes up to its old size and refused as
 * sparse, with `cp --sparse=never` for a remedy), else 0.
 */
static int
shrank(const struct wc_file *f)
{
	struct stat st;

	if (fstat(f->fd, &st) == -1 || st.st_size < 0 || (uint64_t)st.st_size >= f->size)
		return 0;
	return error_set(-EIO, "%s: file shrank while being read: %" PRIu64 " bytes when opened, "
		"%lld now", f->path, f->size, (long long)st.st_size);
}

/*
 * lseek whence at off on f failed otherwise (why: EIO or ESTALE from a
 * network filesystem, a FUSE server's own error), or answered an offset
 * that makes no progress (a FUSE server answers FUSE_LSEEK with any
 * offset): the rest of f, from off to end, is taken as data, with one
 * line. This fails open on purpose.
 * The check only guards the page cache, while refusing would cost the
 * model its load for one failed call on a flaky server: a first load
 * unserved until its path changes, a warm restart's generation dropped
 * and every byte read again from that same server. A real read error
 * fails the load or the warm-up that follows, with its own line. And no
 * one gains by making lseek fail: on NFS a tenant does not choose the
 * server's errors, and a FUSE server that could serves zeros from no disk
 * whatever SEEK_DATA says.
 */
static void
seek_failed(const struct wc_file *f, const char *whence, off_t off, off_t end,
	struct holes_walk *w, const char *why)
{
	log_warnx("%s: %s at byte %lld: %s; the sparse-file check takes the rest of it as data",
		f->path, whence, (long long)off, why);
	w->data += (uint64_t)(end - off);
}

/* seek_failed() for an answer, at, that makes no progress. */
static void
seek_stuck(const struct wc_file *f, const char *whence, off_t off, off_t end,
	struct holes_walk *w, off_t at)
{
	char why[64];

	snprintf(why, sizeof(why), "answered byte %lld, no progress", (long long)at);
	seek_failed(f, whence, off, end, w, why);
}

/*
 * Adds the holes and the data of f's first f->size bytes (its size at
 * open; data past it, had it grown, is not counted) to w, from SEEK_DATA
 * and SEEK_HOLE on wcached's own descriptor (workers get the reopened
 * one), until the end or w's verdict. One pair of calls per extent of
 * data, each pair moving forward (SEEK_DATA at or past the offset asked,
 * SEEK_HOLE past that): a filesystem's answers are not trusted (a FUSE
 * server answers with any offset), so an answer that makes no progress
 * ends the walk with the rest taken as data (seek_stuck), and the walk
 * always ends. A filesystem that cannot tell reports the whole file as
 * data (the kernel's default). 0, or -EIO when f shrank (shrank()).
 */
static int
count_holes(const struct wc_file *f, struct holes_walk *w)
{
	off_t end = (off_t)f->size, off = 0, data, hole;

	while (off < end && holes_verdict(w) < 0) {
		if ((data = seek_again(f->fd, off, SEEK_DATA)) == -1) {
			if (errno != ENXIO) {
				seek_failed(f, "SEEK_DATA", off, end, w, strerror(errno));
				return 0;
			}
			if (shrank(f) < 0)
				return -EIO;
			data = end; /* ENXIO: a hole up to the end */
		}
		if (data < off) {
			seek_stuck(f, "SEEK_DATA", off, end, w, data);
			return 0;
		}
		if (data > end)
			data = end;
		w->holes += (uint64_t)(data - off);
		if (data == end || holes_verdict(w) >= 0)
			return 0;
		if ((hole = seek_again(f->fd, data, SEEK_HOLE)) == -1) {
			if (errno == ENXIO && shrank(f) < 0)
				return -EIO;
			seek_failed(f, "SEEK_HOLE", data, end, w, strerror(errno));
			return 0;
		}
		if (hole <= data) {
			seek_stuck(f, "SEEK_HOLE", data, end, w, hole);
			return 0;
		}
		if (hole > end)
			hole = end;
		w->data += (uint64_t)(hole - data);
		off = hole;
	}
	return 0;
}

/* count_holes() of f, whose offset is put back after. */
static int
holes_of(const struct wc_file *f, struct holes_walk *w)
{
	off_t was = lseek(f->fd, 0, SEEK_CUR);
	int err = f->size > 0 ? count_holes(f, w) : 0;

	if (was >= 0)
		lseek(f->fd, was, SEEK_SET);
	return err;
}

int
gen_check_holes(const struct model_source *src)
{
	struct holes_walk w = { 0 };
	uint64_t most = 0;
	const struct wc_file *worst = NULL;
	int err;

	/* Over the whole model: many shards each under the bound add up
	 * (review rev177 E: six 64 MiB holes warmed 384 MiB of zeros). */
	for (size_t i = 0; i < src->nfiles; i++)
		w.size += src->files[i].size;
	for (size_t i = 0; i < src->nfiles && holes_verdict(&w) < 0; i++) {
		const struct wc_file *f = &src->files[i];
		uint64_t before = w.holes;

		if ((err = holes_of(f, &w)) < 0)
			return err;
		if (worst == NULL || w.holes - before > most) {
			worst = f;
			most = w.holes - before;
		}
	}
	if (worst == NULL || holes_verdict(&w) != 1)
		return 0;
	/* The walk stopped once they passed the bound: at least that many. */
	if (src->nfiles == 1)
		return error_set(-EINVAL, "%s: a sparse file: %" PRIu64 " bytes long, at least "
			"%" PRIu64 " of them holes (no data on disk), which warming would read "
			"into memory as zeros; write it out whole (`cp --sparse=never`)",
			worst->path, w.size, w.holes);
	return error_set(-EINVAL, "%s and %zu more: sparse files: %" PRIu64 " bytes long in "
		"all, at least %" PRIu64 " of them holes (no data on disk), which warming would "
		"read into memory as zeros; write them out whole (`cp --sparse=never`)",
		worst->path, src->nfiles - 1, w.size, w.holes);
}

void
gen_close_served(int *fds, size_t n)
{
	if (fds == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
}

void
gen_close_files_in(struct registry *r, uid_t owner, int *served, struct model_source *src)
{
	/* The mapping goes with the descriptor, in the lane: a mapping holds
	 * its file too, and the munmap that dropped the last reference would
	 * free the file's memory on this thread. */
	for (size_t i = 0; i < src->nfiles; i++) {
		struct wc_file *f = &src->files[i];

		if (served != NULL) {
			closer_unmap_close(r->closer, owner, NULL, 0, served[i]);
			served[i] = -1;
		}
		closer_unmap_close(r->closer, owner, (void *)f->base, (size_t)f->size, f->fd);
		f->base = NULL;
		f->fd = -1;
	}
	gen_close_served(served, src->nfiles);
	source_close(src);
}

void
gen_close_files(struct registry *r, const struct fs_info *fs, int *served,
	struct model_source *src)
{
	gen_close_files_in(r, files_lane(fs), served, src);
}

struct generation *
gen_new(struct registry *r, const char *model_name, uint64_t number, struct model_source *src,
	int *served_fds, int index_fd, const uint8_t *index, size_t index_size)
{
	struct generation *g = calloc(1, sizeof(*g));
	struct stat st;
	int served_index = -1;

	/* Workers get their own open file description of the index too (a
	 * full descriptor table refuses it: the reason goes to the caller). */
	if (fstat(index_fd, &st) == -1) {
		int e = errno;

		free(g);
		errno = -error_set(-e, "the index memfd: fstat: %s", strerror(e));
		return NULL;
	}
	if ((served_index = reopen_served(index_fd, &st, "the index memfd")) < 0) {
		free(g);
		errno = -served_index;
		return NULL;
	}
	if (g == NULL || (g->model_name = strdup(model_name)) == NULL ||
		/* An array of pointers: sizeof(*g->warm.jobs) is one pointer.
		 * NOLINTNEXTLINE(bugprone-sizeof-expression) */
		(g->warm.jobs = calloc(src->nfiles ? src->nfiles : 1, sizeof(*g->warm.jobs))) ==
			NULL) {
		if (g != NULL)
			free(g->model_name);
		free(g);
		close(served_index);
		errno = -error_set(-ENOMEM, "out of memory");
		return NULL;
	}
	g->registry = r;
	g->served_index_fd = served_index;
	g->source = *src;
	memset(src, 0, sizeof(*src));
	g->served_fds = served_fds;
	g->index_fd = index_fd;
	g->index = index;
	g->index_size = index_size;
	for (size_t i = 0; i < g->source.nfiles; i++)
		g->bytes += g->source.files[i].size;
	g->number = number;
	return g;
}

int
gen_seal_index(const uint8_t *blob, size_t len, int *fd, const uint8_t **map)
{
	void *p;
	int mfd = memfd_sealed("wcache-index", blob, len, INDEX_SEALS, 0);

	if (mfd < 0)
		return mfd;
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, mfd, 0);
	if (p == MAP_FAILED) {
		int e = errno;

		close(mfd);
		return error_set(-e, "mapping the index: %s", strerror(e));
	}
	*fd = mfd;
	*map = p;
	return 0;
}

void
gen_unmake(struct generation *g, struct model_source *src)
{
	*src = g->source;
	close(g->served_index_fd);
	gen_close_served(g->served_fds, g->source.nfiles);
	munmap((void *)g->index, g->index_size);
	free(g->warm.jobs);
	free(g->hold_conns);
	free(g->hold_places);
	free(g->holders);
	free(g->resolved_path);
	free(g->tree_root);
	free(g->links);
	free(g->model_name);
	free(g);
}

uint64_t
gen_resident(const struct generation *g, const char **method, int64_t *age_ms)
{
	uint64_t now = now_ms(g->registry);

	if (method != NULL)
		*method = g->resident.measured ? resident_method_name(g->resident.method) : "none";
	if (age_ms != NULL)
		*age_ms = !g->resident.measured ? -1 :
			now > g->resident.at_ms ? (int64_t)(now - g->resident.at_ms) : 0;
	return g->resident.measured ? g->resident.bytes : 0;
}

void
gen_residency_checked(struct registry *r, struct generation *g, uint64_t resident)
{
	/* Only a current, ready generation of a model that warms, whose pages
	 * the daemon had all mapped (so what is missing was taken by memory
	 * pressure, not never read), and only when more than 1% (at least
	 * 1 MiB) is missing. */
	uint64_t slack = g->bytes / 100 > (1u << 20) ? g->bytes / 100 : (1u << 20);

	if (!g->populated || g->state != GEN_READY || g->model == NULL ||
		g->model->current != g || !g->model->warm || resident + slack >= g->bytes)
		return;
	g->model->rewarm_count++;
	log_warnx("model \"%s\": only %" PRIu64 " of %" PRIu64 " bytes of generation %" PRIu64
		  " are still in memory (memory pressure); warming it again", g->model_name,
		resident, g->bytes, g->number);
	g->populated = 0;
	gen_start_warming(r, g);
}

void
gen_promote(struct registry *r, struct model_entry *m, struct generation *g)
{
	struct generation *old = m->current;

	m->pending = NULL;
	m->current = g;
	if (old != NULL) {
		m->swap_count++;
		log_info("model \"%s\": generation %" PRIu64 " is current (was %" PRIu64 ")",
			m->name, g->number, old->number);
	}
	if (m->pin == PIN_ALL && g->state == GEN_READY)
		gen_queue_pages(r, g, PAGE_PIN);
	/* The registry publishes it and keeps within the memory budget. */
	if (r->promoted != NULL)
		r->promoted(r, m, g);
	if (old != NULL)
		gen_maybe_free(r, old);
}

/* The last warming job of g ended with no error (loop thread): logs the
 * warm-up, or nothing when it was cancelled. */
static void
log_warm(struct registry *r, struct generation *g)
{
	double secs = (double)(now_ms(r) - g->warm.started_ms) / 1000.0;

	if (g->model != NULL)
		g->model->last_warm_seconds = secs;
	/* The loop's clock counts milliseconds; the jobs' own clocks time a
	 * warm-up shorter than that, so no rate reads 0 MB/s. */
	if (g->warm.seconds > secs)
		secs = g->warm.seconds;
	if (secs > 0 && g->warm.bytes > 0)
		log_info("model \"%s\": generation %" PRIu64 " warm: %" PRIu64
			 " bytes in %.3f s (%.0f MB/s)", g->model_name, g->number, g->warm.bytes,
			secs, (double)g->warm.bytes / secs / 1e6);
	else
		log_info("model \"%s\": generation %" PRIu64 " warm: %" PRIu64 " bytes in %.3f s",
			g->model_name, g->number, g->warm.bytes, secs);
}

/* A warming job of one file ended (loop thread). When it was the last, its
 * outcome moves g out of WARMING (or, evicted meanwhile, out of COLD only
 * when a file failed). */
static void rewarm(struct registry *r, struct generation *g);

static void
warm_done(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	struct generation *g = cookie;
	struct registry *r = g->registry;
	struct model_entry *m = g->model;
	int clean;

	for (size_t i = 0; i < g->source.nfiles; i++)
		if (g->warm.jobs[i] == job)
			g->warm.jobs[i] = NULL;
	g->warm.bytes += res->bytes;
	g->warm.resident += res->measure.value;
	if (res->status == 0)
		g->warm.resident_how = (enum resident_method)res->measure.how;
	if (res->seconds > g->warm.seconds)
		g->warm.seconds = res->seconds;
	if (res->status < 0 && res->status != -ECANCELED && g->warm.error == 0)
		g->warm.error = res->status;
	if (res->status == -ECANCELED)
		g->warm.cancelled = 1;
	if (--g->warm.pending == 0 && g->state == GEN_COLD)
		gen_queue_pages(r, g, PAGE_EVICT_SETTLE); /* evicted while it warmed */
	else if (g->warm.pending == 0 && g->state == GEN_REWARM)
		rewarm(r, g); /* ... and attached again since */
	if (g->warm.pending > 0 || (g->state != GEN_WARMING && g->state != GEN_COLD)) {
		if (g->warm.pending == 0 && r->pages_ended != NULL)
			r->pages_ended(r, g);
		gen_maybe_free(r, g);
		return;
	}
	clean = g->warm.error == 0 && !g->warm.cancelled;
	if (g->warm.error == -ENODATA) {
		gen_mark_modified(r, g, "a file");
	} else if (g->warm.error < 0) {
		gen_set_state(g, GEN_FAILED, "warming failed");
		log_errorx("model \"%s\": warming generation %" PRIu64 " failed: %s%s%s%s",
			g->model_name, g->number, strerror(-g->warm.error),
			g->fs.remote ? " reading from " : "", g->fs.remote ? g->fs.name : "",
			g->fs.remote && (g->warm.error == -EIO || g->warm.error == -ESTALE) ?
				" (the file may have been replaced or removed on another host; "
				"stage = yes copies models to local disk first)" : "");
	} else if (g->state == GEN_WARMING) {
		/* Cancelled (superseded, unloaded, stopping): serves, but was
		 * not warmed, so no claim is made. */
		if (clean)
			log_warm(r, g);
		gen_set_state(g, GEN_READY, clean ? "warm" : "warming cancelled");
	}
	/* What warming left in memory, for status: each job measured its file
	 * when it had read it all (warm_measure), so a clean warm-up turns
	 * ready with a fresh figure; otherwise measured now, off the loop (a
	 * cold one's eviction measures when it ends). A clean one is then
	 * mapped page by page, so no client can drop it (resident.h). */
	if (g->state == GEN_READY && clean) {
		g->resident.epoch++; /* what started before measured before */
		g->resident.measured = 1;
		g->resident.bytes = g->warm.resident;
		g->resident.method = g->warm.resident_how;
		g->resident.at_ms = now_ms(r);
		gen_queue_pages(r, g, PAGE_POPULATE);
	} else if (g->state != GEN_COLD) {
		gen_queue_pages(r, g, PAGE_CHECK);
	}
	if (m != NULL && m->pending == g && (g->state == GEN_READY || g->state == GEN_COLD))
		gen_promote(r, m, g);
	else if (m != NULL && m->current == g && m->pin == PIN_ALL && g->state == GEN_READY)
		gen_queue_pages(r, g, PAGE_PIN);
	if (m != NULL && m->pending == g && !gen_attachable(g)) {
		/* A replacement that cannot be served never becomes current,
		 * and counts as a failed load: the watch's poll then looks
		 * whether the generation it would have replaced is still on its
		 * server (watch_poll.c check_served; review rev210 L3). */
		m->pending = NULL;
		m->load_errors++;
		free(m->error);
		m->error = strdup("the new generation failed while warming");
	}
	if (r->changed != NULL)
		r->changed(r);
	gen_maybe_free(r, g);
}

/* Pool thread, once a warming job has read its whole file: what of the file
 * is in memory now (resident.h), for the figure status reports when the
 * generation turns ready. The generation outlives its pending jobs. */
static void
warm_measure(const struct warm_request *req, struct warm_measure *out)
{
	const struct generation *g = req->cookie;
	enum resident_method how = RESIDENT_CACHESTAT;
	uint64_t n = 0;

	for (size_t i = 0; i < g->source.nfiles; i++) {
		if (g->source.files[i].fd != req->fd)
			continue;
		if (resident_bytes(&g->source.files[i], &n, &how) == 0) {
			out->value = n;
			out->how = (int)how;
		}
		return;
	}
}

void
gen_start_warming(struct registry *r, struct generation *g)
{
	gen_set_state(g, GEN_WARMING, "warming");
	g->warm.error = 0;
	g->warm.cancelled = 0;
	g->warm.bytes = 0;
	g->warm.resident = 0;
	g->warm.resident_how = RESIDENT_CACHESTAT;
	g->warm.seconds = 0;
	g->warm.started_ms = now_ms(r);
	for (size_t i = 0; r->pool != NULL && i < g->source.nfiles; i++) {
		const struct wc_file *f = &g->source.files[i];
		struct warm_request req = {
			.fd = f->fd, .offset = 0, .length = f->size, .base = f->base,
			.cookie = g, .done = warm_done, .measure = warm_measure,
			/* A staged copy is on local disk. */
			.remote = g->fs.remote && g->origin == NULL,
		};
		int err;

		if (f->size == 0 || g->warm.jobs[i] != NULL)
			continue;
		if ((err = warm_submit(r->pool, &req, &g->warm.jobs[i])) < 0) {
			log_warnx("model \"%s\": cannot warm %s: %s", g->model_name, f->path,
				strerror(-err));
			continue;
		}
		g->warm.pending++;
	}
	if (g->warm.pending == 0)
		gen_set_state(g, GEN_READY, "nothing to warm");
}

void
gen_cancel_warming(struct registry *r, struct generation *g)
{
	for (size_t i = 0; i < g->source.nfiles; i++)
		if (g->warm.jobs[i] != NULL)
			warm_cancel(r->pool, g->warm.jobs[i]);
}

/*
 * Asks for a read lease on fd (fcntl(2) F_SETLEASE, F_RDLCK) and gives it
 * back at once (registry_load.c's find_writer says why): 0 when it was granted, -EAGAIN
 * while a descriptor has the file open for writing, else -errno, why it
 * could not be asked (EACCES: neither wcached's file nor CAP_LEASE;
 * EINVAL: no leases there); *stuck set when it was granted but could not
 * be given back. A lease gone when it is given back (F_UNLCK's EAGAIN) was
 * broken by a writer's open, and taken by the kernel once wcached, stalled
 * between the two calls, let lease-break-time pass: a writer (review
 * rev194 LOW-3). Asked without waiting: the loop may call it.
 */
int
gen_lease_probe(int fd, int *stuck)
{
	if (fcntl(fd, F_SETSIG, SIGURG) == -1 || fcntl(fd, F_SETLEASE, F_RDLCK) == -1)
		return -errno;
	if (fcntl(fd, F_SETLEASE, F_UNLCK) == 0)
		return 0;
	if (errno == EAGAIN)
		return -EAGAIN;
	/* Asked once more; else the lease lives until the last reference to
	 * fd's open file description goes (its mapping's too). */
	if (fcntl(fd, F_SETLEASE, F_UNLCK) == 0)
		return 0;
	*stuck = 1;
	return -errno;
}

/* Whether a file of g, a pending generation just modified in place, is
 * open for writing now (gen_lease_probe on g's own descriptors, which no
 * worker holds yet): its writer is still writing it. Not asked on a
 * remote filesystem, whose leases say nothing of writers (find_writer). */
static bool
gen_written_now(const struct generation *g)
{
	if (g->fs.remote && g->origin == NULL)
		return false;
	for (size_t i = 0; i < g->source.nfiles; i++) {
		int stuck = 0;

		if (gen_lease_probe(g->source.files[i].fd, &stuck) == -EAGAIN)
			return true;
	}
	return false;
}

void
gen_mark_modified(struct registry *r, struct generation *g, const char *file)
{
	struct model_entry *m = g->model != NULL && g->model->pending == g ? g->model : NULL;

	if (g->state == GEN_MODIFIED)
		return;
	gen_set_state(g, GEN_MODIFIED, "modified in place");
	gen_cancel_warming(r, g);
	if (m != NULL && gen_written_now(g)) {
		/* A replacement still being written (cp, save_file onto the
		 * pending file): no error, as the reload that follows, which
		 * waits for its writer, says none (review rev200 L4). */
		log_info("model \"%s\": %s of generation %" PRIu64 " was modified in place "
			 "while it warmed, and is still open for writing: dropped, not an error; "
			 "the reload that follows waits for its writer (generation %" PRIu64
			 " still serving)", g->model_name, file, g->number,
			 m->current != NULL ? m->current->number : 0);
		m->pending = NULL;
		return;
	}
	log_errorx("model \"%s\": %s of generation %" PRIu64 " was modified in place; it is no "
		   "longer attached by new clients. Replace model files with rename(2), then "
		   "`wcachectl reload %s`", g->model_name, file, g->number, g->model_name);
	if (m != NULL) {
		/* A replacement written to while it warmed never becomes
		 * current: the current generation keeps serving. */
		m->pending = NULL;
		free(m->error);
		m->error = strdup("the new generation was modified in place while it warmed; "
				  "replace model files with rename(2)");
		/* g may now be unreferenced: the caller frees it
		 * (gen_maybe_free, registry_collect) once it is done with it. */
	}
}

int
gen_relinked_now(struct generation *g, size_t i, const struct stat *now, int say)
{
	struct model_entry *m = g->model;

	if (m == NULL || m->current != g || !gen_attachable(g) || g->origin != NULL ||
		g->relink_asked || i >= g->source.nfiles)
		return 0;
	if (g->relinked_sts == NULL &&
		(g->relinked_sts = malloc(g->source.nfiles * sizeof(*g->relinked_sts))) == NULL)
		return 0; /* not asked: the next check asks again */
	/* A new ask: the files an earlier one saw moved are in the fstats
	 * it adopted, or move again for this one. */
	memset(g->relinked_sts, 0, g->source.nfiles * sizeof(*g->relinked_sts));
	g->relink_asked = 1;
	g->relinked_i = i;
	g->relinked_sts[i] = *now;
	m->revalidate = g->number;
	if (say)
		log_info("model \"%s\": %s: its link count went from %ju to %ju and its ctime "
			 "moved (a hard link added or removed beside it, or a write with its "
			 "mtime put back): loading its files again, validated anew; generation "
			 "%" PRIu64 " still serving", g->model_name,
			 file_basename(g->source.files[i].path),
			 (uintmax_t)g->source.files[i].st.st_nlink, (uintmax_t)now->st_nlink,
			 g->number);
	return 1;
}

void
gen_relinked_also(struct generation *g, size_t i, const struct stat *now)
{
	if (g->relink_asked && g->relinked_sts != NULL && i < g->source.nfiles)
		g->relinked_sts[i] = *now;
}

void
gen_note_relinked(struct registry *r, struct generation *g, size_t i, const struct stat *now)
{
	if (gen_relinked_now(g, i, now, 1) && r->relinked != NULL)
		r->relinked(r, g->model);
}

/* g's parked fstats (gen_adopt_stats) become its own once no page work
 * is queued. */
static void
adopt_parked(struct generation *g)
{
	if (g->adopt_st == NULL || g->page_queue != NULL)
		return;
	for (size_t i = 0; i < g->source.nfiles; i++)
		g->source.files[i].st = g->adopt_st[i];
	free(g->adopt_st);
	g->adopt_st = NULL;
}

void
gen_adopt_stats(struct generation *g, const struct model_source *src)
{
	size_t n = g->source.nfiles;

	if (src->nfiles != n || n == 0)
		return;
	free(g->adopt_st);
	if ((g->adopt_st = malloc(n * sizeof(*g->adopt_st))) == NULL)
		return; /* kept: the next check asks again */
	for (size_t i = 0; i < n; i++)
		g->adopt_st[i] = src->files[i].st;
	adopt_parked(g);
}

void
gen_mark_gone(struct registry *r, struct generation *g, const char *file, int err)
{
	struct model_entry *m = g->model;
	/* The error of the load that tried the replacement, when there was
	 * one: why nothing replaced g. */
	const char *load = m != NULL && m->current == g ? m->error : NULL;
	char *text = NULL;

	if (!gen_attachable(g))
		return;
	if (asprintf(&text, "generation %" PRIu64 "'s files were replaced or removed on %s by "
			    "another host and the replacement failed to load%s%s%s; the server "
			    "no longer has them (%s: fstat: %s), so generation %" PRIu64 " is "
			    "not served. Publish a valid model file at its path (the next poll "
			    "loads it), or set stage = yes or auto so that a local copy serves",
		    g->number, g->fs.name, load != NULL ? " (" : "", load != NULL ? load : "",
		    load != NULL ? ")" : "", file, strerror(err), g->number) < 0)
		text = NULL;
	gen_set_state(g, GEN_FAILED, "its files are gone from the server");
	gen_cancel_warming(r, g);
	free(g->gone);
	g->gone = text;
	log_errorx("model \"%s\": %s", g->model_name,
		text != NULL ? text : "its files are gone from the server; not served");
	if (m != NULL && m->current == g && text != NULL) {
		char *error = strdup(text);

		if (error != NULL) {
			free(m->error);
			m->error = error;
		}
	}
}

/* ---- page operations ---- */

static void evict_done(struct registry *r, struct generation *g);

/* pages.c: a page operation of g ended (pages.h): what it found moves g
 * on; then g closes if nothing refers to it any more. */
static void
pages_done(struct registry *r, struct generation *g, const struct pages_result *res)
{
	if (res->written != NULL && g->state != GEN_MODIFIED) {
		/* A write inotify did not hear (pages.c, check_written). */
		gen_mark_modified(r, g, res->written);
		if (r->changed != NULL)
			r->changed(r);
	}
	else if (res->relinked && g->state != GEN_MODIFIED && g->adopt_st == NULL)
		/* A link inotify did not hear (made in another directory);
		 * not one seen against the fstats a reload replaced. */
		gen_note_relinked(r, g, res->relinked_i, &res->relinked_st);
	adopt_parked(g);
	if (res->op == PAGE_CHECK && !res->cancelled)
		gen_residency_checked(r, g, res->resident);
	if (res->op == PAGE_EVICT || res->op == PAGE_EVICT_SETTLE)
		evict_done(r, g);
	if (r->pages_ended != NULL)
		r->pages_ended(r, g);
	gen_maybe_free(r, g);
}

static const struct pages_hooks page_hooks = { .live = gen_is_live, .done = pages_done };

void
gen_queue_pages(struct registry *r, struct generation *g, enum page_op op)
{
	pages_queue(r, g, op, &page_hooks);
}

/* ---- attaching, eviction ---- */

int
gen_ref(struct registry *r, struct generation *g)
{
	g->attached++;
	if (g->model == NULL)
		return 0;
	g->model->last_attach = ++r->attach_seq;
	if (g->state != GEN_COLD || g->model->current != g)
		return 0;
	log_info("model \"%s\": attached while cold, warming generation %" PRIu64, g->model_name,
		g->number);
	gen_warm_again(r, g, "attached");
	return 1;
}

int
gen_holder_add(struct generation *g, uid_t uid)
{
	struct gen_holder *v;
	unsigned i = 0;

	while (i < g->nholders && g->holders[i].uid < uid)
		i++;
	if (i < g->nholders && g->holders[i].uid == uid) {
		g->holders[i].count++;
		return 0;
	}
	if ((v = realloc(g->holders, (g->nholders + 1) * sizeof(*v))) == NULL)
		return -ENOMEM;
	memmove(&v[i + 1], &v[i], (g->nholders - i) * sizeof(*v));
	v[i] = (struct gen_holder){ uid, 1 };
	g->holders = v;
	g->nholders++;
	return 0;
}

void
gen_holder_drop(struct generation *g, uid_t uid)
{
	for (unsigned i = 0; i < g->nholders; i++)
		if (g->holders[i].uid == uid) {
			if (--g->holders[i].count == 0) {
				memmove(&g->holders[i], &g->holders[i + 1],
					(g->nholders - i - 1) * sizeof(*g->holders));
				g->nholders--;
			}
			return;
		}
	if (g->holders_lost > 0)
		g->holders_lost--;
}

void
gen_warm_again(struct registry *r, struct generation *g, const char *why)
{
	char reason[96];

	if (pages_drop_queued_evictions(g)) {
		snprintf(reason, sizeof(reason), "%s while an eviction runs", why);
		gen_set_state(g, GEN_REWARM, reason);
	} else if (g->warm.pending > 0 && g->model->warm) {
		/* Evicted while it warmed: its cancelled jobs are still
		 * stopping, and a warm-up now would skip every file they
		 * hold. Warm once they have stopped (warm_done). */
		snprintf(reason, sizeof(reason), "%s while a cancelled warm-up stops", why);
		gen_set_state(g, GEN_REWARM, reason);
	} else if (g->model->warm) {
		gen_start_warming(r, g);
	} else {
		snprintf(reason, sizeof(reason), "%s while cold", why);
		gen_set_state(g, GEN_READY, reason);
	}
}

void
gen_unref(struct registry *r, struct generation *g)
{
	/* Evicted pages a worker still mapped stayed resident; when the last
	 * holder of a cold generation lets go, drop them. */
	if (--g->attached == 0 && g->state == GEN_COLD && gen_is_live(g) && g->warm.pending == 0)
		gen_queue_pages(r, g, PAGE_EVICT); /* (a warm-up stopping evicts as it ends) */
	gen_maybe_free(r, g);
}

/* An eviction of g ended (REWARM -> WARMING or READY). */
static void
evict_done(struct registry *r, struct generation *g)
{
	if (g->state == GEN_REWARM)
		rewarm(r, g);
}

/* g was attached again while its pages were being dropped (an eviction
 * ran, or a warm-up an eviction cancelled was stopping, or both): called
 * as each of those ends, it warms g once neither is left, so that nothing
 * drops the fresh pages or holds its warm jobs. */
static void
rewarm(struct registry *r, struct generation *g)
{
	if (g->warm.pending > 0 || pages_evicting(g))
		return; /* the other one's end calls again */
	if (g->model != NULL && g->model->current == g && g->model->warm)
		gen_start_warming(r, g);
	else
		gen_set_state(g, GEN_READY, "attached again");
}

void
gen_evict(struct registry *r, struct generation *g)
{
	if (gen_holds_memory(g))
		gen_set_state(g, GEN_COLD, "evicted");
	gen_cancel_warming(r, g);
	/* A job still reading would leave its last chunk (and readahead)
	 * resident: drop the pages once it has stopped (warm_done). */
	if (g->warm.pending == 0)
		gen_queue_pages(r, g, PAGE_EVICT);
}

