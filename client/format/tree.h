/*
 * tree.h: opening the files of a model inside the model's own tree.
 *
 * A model's files (the single file, a shard index and the shards it names,
 * the file found in a model directory) may be symlinks, but every symlink
 * must resolve inside the model's tree; one that leaves it (to another
 * model's directory, which may be restricted to other users, or to any file
 * wcached can read) is refused with a message that names the link, its
 * target and the tree. The tree is the model's directory (the directory
 * given, or the one that holds the configured file or shard index), except
 * for a Hugging Face hub snapshot: when the model directory, with the
 * operator's symlinks resolved, is <R>/models--ORG--NAME/snapshots/<rev>,
 * the tree is <R>/models--ORG--NAME, so the snapshot's links into
 * ../../blobs/ stay inside it.
 *
 * The path up to the tree's root is the operator's and may hold symlinks; the
 * root is opened once (O_PATH) and each file is opened relative to it with
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), which checks every
 * component as the kernel walks it: no race between a check and the open.
 * Where the kernel has no openat2 (ENOSYS, before Linux 5.6, or a seccomp
 * filter), a fallback resolves the path with realpath(3), checks it against
 * the root and opens it with O_NOFOLLOW (racy against a writer who swaps
 * directories meanwhile, and says so in the docs). A path in procfs
 * (/proc/self/fd/N, a caller's own open file) has no tree and is followed.
 */
#ifndef WC_TREE_H
#define WC_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/file.h"

struct model_tree {
	int fd;     /* O_PATH | O_DIRECTORY descriptor of the tree's root, or -1 */
	char *root; /* the root's canonical path, for messages and the fallback */
	char *dir;  /* the model directory inside the tree: "" or "snapshots/REV/" */
	bool proc;  /* the directory is in procfs (/proc/self/fd/N names a caller's
		     * open file, as the Python package's safe_open of a file
		     * object does): no model tree there, links are followed */
};

/*
 * Splits the canonical model directory canon into the tree's root and the
 * model directory inside it (both allocated): <R>/models--X/snapshots/<rev>
 * gives root <R>/models--X and dir "snapshots/<rev>/"; anything else is its
 * own root, dir "". 0, or -ENOMEM.
 */
int tree_split(const char *canon, char **root, char **dir);

/*
 * Opens the tree of the model whose directory is model_dir ("" means the
 * current directory). On failure *out is untouched and the message names
 * model_dir.
 */
int tree_open(const char *model_dir, struct model_tree *out);

/*
 * Opens and maps the file name (a plain name) of the model directory of t, as
 * file_open() does, refusing a symlink that leaves the tree. path is how the
 * caller names the file, for messages and f->path.
 */
int tree_open_file(const struct model_tree *t, const char *name, const char *path,
	struct wc_file *out);

/*
 * openat2(2) of rel beneath at with how's flags and resolve, tried again on
 * EINTR (a signal during an open on a FUSE or NFS mount) and on EAGAIN (a
 * rename raced the walk) a few times: the descriptor, or -1 with errno
 * (ENOSYS where the kernel has none, or tree_force_fallback is set).
 */
int tree_openat2(int at, const char *rel, unsigned long long flags,
	unsigned long long resolve);

/*
 * The directory path (absolute, or relative to the directory at), opened
 * O_PATH one component at a time with no link followed (a userspace
 * RESOLVE_NO_SYMLINKS, which also works where the kernel has no openat2):
 * its descriptor, or -1 where a component is missing, no directory, or a
 * link (one renamed over a directory since path was resolved). path is
 * canonical (a realpath, or a tree_split part of one): no "." or "..".
 */
int tree_open_dir_no_links(int at, const char *path);

/* Closes the tree; safe on a zeroed or closed one. */
void tree_close(struct model_tree *t);

/* tree_open() of path's directory, then tree_open_file() of its last
 * component: a model file named by its path. */
int tree_open_model_file(const char *path, struct wc_file *out);

/*
 * Whether the refusal of a link into /proc/self/fd inside a model's tree
 * (/dev/stdin) names the spelling that works, /dev/fd/N: true where the
 * descriptors are the caller's (wcachectl, libwcache); wcached sets it
 * false, since its descriptors are its own (its stdin is not the
 * operator's) and no /dev/fd/N names the file the operator meant.
 */
extern bool tree_fd_hint;

/*
 * A mount a walk stepped onto (or a link lies on), as statx(2) told it of
 * the walk's own O_PATH descriptor, with AT_STATX_DONT_SYNC (no server
 * asked): its device, and the mount's ID (mountinfo's first field), which
 * names that very mount, even one detached (umount -l) since: the kernel
 * gives the ID to no other mount while the descriptor holds it. has_id is
 * false where the kernel gives none (STATX_MNT_ID, Linux 5.8): then the
 * device alone tells the mount.
 */
struct tree_mount {
	dev_t dev;
	uint64_t id;
	bool has_id;
};

/*
 * wcached's rule for mounts inside a model's tree (NULL, libwcache's: a
 * mount is crossed like a directory, so that a shard bind-mounted into a
 * container's tree loads). Where set, a model file is opened with
 * RESOLVE_NO_XDEV, and one that crosses a mount is reached again one name
 * at a time, each mount crossed judged (struct tree_mount: told without
 * asking any filesystem server) before anything on it is looked up, and
 * opened only where mount_ok takes every one: a neighbour's FUSE mount on
 * a file or directory in a model's tree (whose server may never answer) is
 * never opened or walked into (review rev202 H1, rev205 H3). mount_ok: 0,
 * or -errno with why ("fuse (a mount of its own)"). Kernels without
 * openat2 keep the fallback's walk.
 */
struct tree_mounts {
	int (*mount_ok)(const struct tree_mount *m, char *why, size_t len);
};
extern const struct tree_mounts *tree_mounts;

/*
 * A walk of a path one name at a time, the one both of wcached's judged
 * walks are (beneath a model's tree: tree_mounts above; a model's path
 * from "/": daemon/mountrule.h): each name is looked up (O_PATH |
 * O_NOFOLLOW) in the directory before it, a link is read (readlinkat) and
 * its text walked in its place, at most 40, and each mount crossed (a
 * name whose device, told by statx(2) with AT_STATX_DONT_SYNC, no server
 * asked, is not its directory's) is stepped onto with O_PATH only and
 * judged before anything on it is looked up. Nothing is walked twice and
 * no table is read before the walk (review rev205 H3).
 *  - judge(ctx, m, name, why, len): 0 to go on across the mount m that
 *    name (a name of the path or of a link's text) is on; or -errno, with
 *    why set, to refuse it.
 *  - link(ctx, m, name, why, len), where set: asked for each link met, on
 *    the mount m, before its text is read: 0 to walk its text, or -errno
 *    with why to refuse it (a procfs "magic" link's text is not where the
 *    kernel goes: /proc/PID/fd/N leads to the very file a process holds).
 *  - beneath: the walk stays beneath the directory it starts from: ".."
 *    is the directory the walk came from, and ".." above the start or an
 *    absolute link is EXDEV; what is walked to must be named by a name
 *    (a path of nothing, or ending in "." or "..", is EISDIR: no model
 *    file). Else the walk goes as the kernel's: ".." is the parent, and an
 *    absolute link starts again from "/".
 *  - links: those followed before the walk (a walk that goes on from a
 *    directory an earlier one reached), and after it those in all.
 *  - steps: the names the walk looked up (each an openat and a statx: its
 *    cost), added to as it goes; max_steps: 0, or the most it may look up
 *    in all (steps included), past which it ends with ELOOP: a walk may
 *    follow 40 links of PATH_MAX bytes, some 80,000 names, and one that
 *    is a part of a larger look (mountrule.h's run) is bounded by the
 *    look's budget.
 *  - refused: set when judge refused (its code returned, why its line).
 */
struct tree_walk {
	int (*judge)(void *ctx, const struct tree_mount *m, const char *name, char *why,
		size_t len);
	int (*link)(void *ctx, const struct tree_mount *m, const char *name, char *why,
		size_t len);
	void *ctx;
	bool beneath;
	int links;
	long steps;
	long max_steps;
	bool refused;
};

/* The walk of rel from the directory at (not closed) as w says: an O_PATH
 * descriptor of what rel names, or -errno (ELOOP past 40 links or past
 * max_steps names, ENAMETOOLONG past 256 directories deep beneath the
 * start, EXDEV leaving it, or judge's or link's code with w->refused
 * set). */
int tree_walk(int at, const char *rel, struct tree_walk *w, char *why, size_t len);

/* A tree_walk judge (ctx and name unused): tree_mounts' mount_ok, the rule
 * a walk beneath a model's tree is judged by (tree_mounts set). */
int tree_mounts_judge(void *ctx, const struct tree_mount *m, const char *name, char *why,
	size_t len);

/* Set by the unit tests to exercise the fallback for kernels without
 * openat2; not for other use. */
extern int tree_force_fallback;

#endif
