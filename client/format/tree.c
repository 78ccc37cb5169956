/*
 * tree.c: opening a model's files so that their symlinks stay inside the
 * model's tree (see tree.h for the rule and why).
 *
 * openat2(2) with RESOLVE_BENEATH refuses, with EXDEV, any walk that leaves
 * the directory it starts from: an absolute symlink, or ".." above the root,
 * at any depth of a chain of links. We call it through syscall(2) (glibc 2.36
 * has no wrapper). On EXDEV we look for the link to blame, so the message
 * names it, its target (readlink) and the tree.
 *
 * A signal that interrupts an open or an fstat (EINTR, which a FUSE or NFS
 * mount returns while it waits on its server) is no reason to fail a load:
 * each is tried again (file_openat, file_fstat, and the openat2 loop).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "format/tree.h"

int tree_force_fallback;
bool tree_fd_hint = true;
const struct tree_mounts *tree_mounts;

/* Flags of every model file: see file_open() in file.c. */
#define TREE_OPEN_FLAGS (O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)

/* How often openat2 is retried when it says a rename raced its walk. */
#define TREE_EAGAIN_TRIES 8

/* Whether component (len bytes) is a Hugging Face hub repository folder. */
static bool
is_hub_repo(const char *component, size_t len)
{
	return len > 8 && strncmp(component, "models--", 8) == 0;
}

int
tree_split(const char *canon, char **root, char **dir)
{
	const char *rev = strrchr(canon, '/'), *snap = NULL, *repo = NULL;

	if (rev != NULL && rev > canon) {
		for (snap = rev - 1; snap > canon && *snap != '/'; snap--)
			;
		if (*snap == '/' && snap > canon && rev - snap - 1 == 9 &&
			strncmp(snap + 1, "snapshots", 9) == 0) {
			for (repo = snap - 1; repo > canon && *repo != '/'; repo--)
				;
			if (*repo != '/' || !is_hub_repo(repo + 1, (size_t)(snap - repo - 1)))
				repo = NULL;
		}
	}
	if (repo != NULL && rev[1] != '\0') {
		*root = strndup(canon, (size_t)(snap - canon));
		if (asprintf(dir, "%s/", snap + 1) < 0)
			*dir = NULL;
	} else {
		*root = strdup(canon);
		*dir = strdup("");
	}
	if (*root == NULL || *dir == NULL) {
		free(*root);
		free(*dir);
		return -ENOMEM;
	}
	return 0;
}

int
tree_open(const char *model_dir, struct model_tree *out)
{
	const char *d = model_dir[0] != '\0' ? model_dir : ".";
	struct model_tree t = { .fd = -1 };
	struct statfs fs;
	char *canon;
	int r;

	if ((canon = realpath(d, NULL)) == NULL)
		return error_set(-errno, "%s: %s", d, strerror(errno));
	if (tree_split(canon, &t.root, &t.dir) < 0) {
		free(canon);
		return error_set(-ENOMEM, "%s: out of memory", d);
	}
	free(canon);
	if ((t.fd = file_openat(AT_FDCWD, t.root, O_PATH | O_DIRECTORY | O_CLOEXEC)) == -1) {
		int e = errno;

		error_set(-e, "%s: the model's tree %s: %s", d, t.root, strerror(e));
		tree_close(&t);
		return -e;
	}
	while ((r = fstatfs(t.fd, &fs)) == -1 && errno == EINTR)
		;
	t.proc = r == 0 && fs.f_type == PROC_SUPER_MAGIC;
	*out = t;
	return 0;
}

/* How tree_open_dir_no_links opens each directory: never through a link. */
#define DIR_NO_LINK (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

int
tree_open_dir_no_links(int at, const char *path)
{
	char *copy = strdup(path), *save = NULL, *c;
	int fd = path[0] == '/' ? open("/", DIR_NO_LINK) : fcntl(at, F_DUPFD_CLOEXEC, 0);
	struct stat st;

	for (c = copy != NULL ? strtok_r(copy, "/", &save) : NULL; fd >= 0 && c != NULL;
		c = strtok_r(NULL, "/", &save)) {
		int next = openat(fd, c, DIR_NO_LINK);

		close(fd);
		fd = next;
	}
	if (fd >= 0 && (copy == NULL || fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode))) {
		close(fd);
		fd = -1;
	}
	free(copy);
	return fd;
}

void
tree_close(struct model_tree *t)
{
	if (t == NULL)
		return;
	if (t->fd >= 0)
		close(t->fd);
	free(t->root);
	free(t->dir);
	t->fd = -1;
	t->root = NULL;
	t->dir = NULL;
}

/* Whether the symlink at link (whose target is target) points at another
 * symlink: a chain, whose end its target does not show. */
static bool
is_link_to_link(const char *link, const char *target)
{
	char next[PATH_MAX * 2 + 2];
	const char *slash = strrchr(link, '/');
	struct stat st;

	if (target[0] == '/' || slash == NULL)
		snprintf(next, sizeof(next), "%s", target);
	else
		snprintf(next, sizeof(next), "%.*s/%s", (int)(slash - link), link, target);
	return lstat(next, &st) == 0 && S_ISLNK(st.st_mode);
}

/*
 * readlinkat(t->fd, sub) where no mount is crossed to reach sub (under
 * tree_mounts: a neighbour's FUSE mount inside the tree may never answer
 * a lookup); else plain readlinkat. -1 where sub is no link (or is past a
 * mount).
 */
static ssize_t
read_link_in(const struct model_tree *t, const char *sub, char *buf, size_t len)
{
	ssize_t k;
	int fd;

	if (tree_mounts == NULL)
		return readlinkat(t->fd, sub, buf, len);
	fd = tree_openat2(t->fd, sub, O_PATH | O_NOFOLLOW | O_CLOEXEC,
		RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS);
	if (fd < 0)
		return -1;
	k = readlinkat(fd, "", buf, len);
	close(fd);
	return k;
}

/*
 * Explains why rel (a path inside t) leads out of the tree: finds the first
 * component of rel that is a symlink and names it and its target; the path it
 * finally resolves to is added when a chain of links makes that differ.
 * path is the caller's name of the file. Returns -EXDEV. Under tree_mounts
 * nothing outside the tree is looked up (the target may be a neighbour's
 * FUSE mount whose server never answers a lookup): where the chain ends is
 * not said, and an absolute link into the tree is told by its text.
 */
static int
explain_escape(const struct model_tree *t, const char *rel, const char *path)
{
	char sub[PATH_MAX], target[PATH_MAX], full[PATH_MAX * 2 + 2], *real;
	size_t n = strlen(rel);
	ssize_t k = -1;
	bool fd_link;

	if (n >= sizeof(sub))
		n = sizeof(sub) - 1;
	for (size_t i = 1; i <= n; i++) {
		if (i < n && rel[i] != '/')
			continue;
		memcpy(sub, rel, i);
		sub[i] = '\0';
		if ((k = read_link_in(t, sub, target, sizeof(target) - 1)) >= 0)
			break;
	}
	if (k < 0)
		return error_set(-EXDEV, "%s: leaves the model's tree %s", path, t->root);
	target[k] = '\0';
	snprintf(full, sizeof(full), "%s/%s", t->root, rel);
	if (tree_mounts == NULL)
		real = realpath(full, NULL);
	else
		real = target[0] == '/' ? strdup(target) : NULL;
	if (strcmp(sub, rel) != 0)
		snprintf(full, sizeof(full), "%s/%s", t->root, sub);
	else
		snprintf(full, sizeof(full), "%s", path);
	n = strlen(t->root);
	fd_link = strncmp(target, "/proc/self/fd/", 14) == 0 && strcmp(sub, rel) == 0;
	if (fd_link && tree_fd_hint)
		/* /dev/stdin: not followed (inside a model's tree such a link
		 * would open the reader's own descriptors, the daemon's too),
		 * but the descriptor has a spelling that works. */
		error_set(-EXDEV, "%s: symlink to %s: a link into /proc is not followed inside "
			"the model's tree %s; name the open file itself: /dev/fd/%s or %s",
			full, target, t->root, target + 14, target);
	else if (fd_link)
		/* The same in wcached: its descriptors are its own, not the
		 * operator's, so no spelling of one names the file meant. */
		error_set(-EXDEV, "%s: symlink to %s: a link into /proc is not followed inside "
			"the model's tree %s; name the model's file by its path (descriptors "
			"here are the daemon's own)", full, target, t->root);
	else if (target[0] == '/' && real != NULL && strncmp(real, t->root, n) == 0 &&
		real[n] == '/')
		error_set(-EXDEV, "%s: symlink to %s: absolute links are not allowed inside the "
			"model's tree %s (make it relative)", full, target, t->root);
	else if (real != NULL && tree_mounts == NULL && is_link_to_link(full, target))
		error_set(-EXDEV, "%s: symlink to %s (resolving to %s) leaves the model's tree %s",
			full, target, real, t->root);
	else
		error_set(-EXDEV, "%s: symlink to %s leaves the model's tree %s", full, target,
			t->root);
	free(real);
	return -EXDEV;
}

/*
 * The fallback without openat2: resolves root/rel with realpath(3), checks
 * that it lies beneath the root and opens that path without following a
 * last symlink. Returns the descriptor or a negative code with the message.
 */
static int
open_fallback(const struct model_tree *t, const char *rel, const char *path)
{
	char *full, *real;
	size_t n = strlen(t->root);
	int fd;

	if (asprintf(&full, "%s/%s", t->root, rel) < 0)
		return error_set(-ENOMEM, "%s: out of memory", path);
	real = realpath(full, NULL);
	free(full);
	if (real == NULL)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	if (strncmp(real, t->root, n) != 0 || (real[n] != '/' && strcmp(t->root, "/") != 0)) {
		free(real);
		return explain_escape(t, rel, path);
	}
	fd = file_openat(AT_FDCWD, real, TREE_OPEN_FLAGS | O_NOFOLLOW);
	free(real);
	if (fd == -1)
		return error_set(-errno, "%s: %s", path, strerror(errno));
	return fd;
}

int
tree_openat2(int at, const char *rel, unsigned long long flags, unsigned long long resolve)
{
	struct open_how how = { .flags = flags, .resolve = resolve };
	long fd = -1;
	int tries = 0;

	errno = ENOSYS;
	while (!tree_force_fallback &&
		(fd = syscall(SYS_openat2, at, rel, &how, sizeof(how))) == -1 &&
		(errno == EINTR || (errno == EAGAIN && ++tries < TREE_EAGAIN_TRIES)))
		;
	return (int)fd;
}

#define WALK_LINKS 40
#define WALK_DEPTH 256
/* The most a walk's text grows to: the path and 40 links of PATH_MAX, as
 * the kernel follows them (it keeps no total; a walk that kept 2 PATH_MAX
 * failed where the kernel went on, review rev207 H2). */
#define WALK_TEXT ((size_t)(WALK_LINKS + 2) * PATH_MAX)

/* The device of the directory fd, told with no server asked; 0 or -1. */
static int
dev_of(int fd, dev_t *dev)
{
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) == -1)
		return -1;
	*dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	return 0;
}

/* The walk's text *rest (cap bytes, *p in it) made room for need bytes:
 * 0, or -1 and errno (ENAMETOOLONG past WALK_TEXT, ENOMEM). */
static int
grow(char **rest, size_t *cap, char **p, size_t need)
{
	size_t at = (size_t)(*p - *rest);
	char *more;

	if (need > WALK_TEXT) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if ((more = realloc(*rest, need)) == NULL)
		return -1;
	*rest = more;
	*p = more + at;
	*cap = need;
	return 0;
}

int
tree_walk(int at, const char *rel, struct tree_walk *w, char *why, size_t len)
{
	int stack[WALK_DEPTH], depth = 0, fd = -1, r = -1, e;
	size_t cap = 2 * PATH_MAX + 2, n = strlen(rel);
	char *rest, *p, *name, target[PATH_MAX];
	dev_t devs[WALK_DEPTH], dev;
	struct tree_mount mnt;
	struct statx sx;

	w->refused = false;
	if (n >= cap)
		return -ENAMETOOLONG;
	if ((rest = malloc(cap)) == NULL)
		return -ENOMEM;
	memcpy(rest, rel, n + 1);
	if ((stack[0] = fcntl(at, F_DUPFD_CLOEXEC, 0)) == -1 || dev_of(stack[0], &devs[0]) == -1)
		goto out;
	for (p = rest;;) {
		while (*p == '/')
			p++;
		if (*p == '\0') { /* ended by "/", ".", "..", or nothing */
			if (w->beneath) {
				errno = EISDIR; /* a directory: no model file */
				goto out;
			}
			r = stack[depth--];
			goto out;
		}
		name = p;
		p += strcspn(p, "/");
		if (*p != '\0')
			*p++ = '\0';
		if (strcmp(name, ".") == 0)
			continue;
		if (w->beneath && strcmp(name, "..") == 0) {
			if (depth == 0) {
				errno = EXDEV;
				goto out;
			}
			close(stack[depth--]);
			continue;
		}
		/* The mount's ID from this very descriptor: a mount detached
		 * (umount -l) between this step and the judge's look at the
		 * mount table is no line of it, and is refused as gone; its
		 * device alone, which no line lists then either, could not be
		 * told from a btrfs subvolume's (review rev208 H2). */
		if (w->max_steps > 0 && w->steps >= w->max_steps) {
			errno = ELOOP;
			goto out;
		}
		w->steps++;
		if ((fd = file_openat(stack[depth], name, O_PATH | O_NOFOLLOW | O_CLOEXEC)) == -1 ||
			statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC,
				STATX_TYPE | STATX_MNT_ID, &sx) == -1)
			goto out;
		dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
		mnt = (struct tree_mount){ dev, sx.stx_mnt_id, (sx.stx_mask & STATX_MNT_ID) != 0 };
		if (dev != devs[depth] && (e = w->judge(w->ctx, &mnt, name, why, len)) < 0) {
			w->refused = true;
			r = e;
			goto out;
		}
		if (S_ISLNK(sx.stx_mode) && w->link != NULL &&
			(e = w->link(w->ctx, &mnt, name, why, len)) < 0) {
			w->refused = true;
			r = e;
			goto out;
		}
		if (S_ISLNK(sx.stx_mode)) {
			ssize_t k = readlinkat(fd, "", target, sizeof(target) - 1);

			if (k < 0)
				goto out;
			close(fd);
			fd = -1;
			target[k] = '\0';
			n = strlen(p);
			if (++w->links > WALK_LINKS || (w->beneath && target[0] == '/')) {
				errno = w->links > WALK_LINKS ? ELOOP : EXDEV;
				goto out;
			}
			if ((size_t)k + n + 2 > cap && grow(&rest, &cap, &p, (size_t)k + n + 2) < 0)
				goto out;
			memmove(rest + k + 1, p, n + 1);
			memcpy(rest, target, (size_t)k);
			rest[k] = '/';
			p = rest;
			if (target[0] == '/') { /* not beneath: again from "/" */
				for (; depth > 0; depth--)
					close(stack[depth]);
				close(stack[0]);
				stack[0] = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
				if (stack[0] == -1 || dev_of(stack[0], &devs[0]) == -1)
					goto out;
			}
			continue;
		}
		while (*p == '/')
			p++;
		if (*p == '\0') {
			r = fd; /* the last name: judged */
			fd = -1;
			goto out;
		}
		if (!S_ISDIR(sx.stx_mode)) {
			errno = ENOTDIR;
			goto out;
		}
		if (!w->beneath) { /* no stack: ".." is the kernel's */
			close(stack[0]);
			depth = -1;
		} else if (depth + 1 == WALK_DEPTH) {
			errno = ENAMETOOLONG;
			goto out;
		}
		stack[++depth] = fd;
		devs[depth] = dev;
		fd = -1;
	}
out:
	e = errno;
	if (fd >= 0)
		close(fd);
	for (; depth >= 0; depth--)
		if (stack[depth] >= 0)
			close(stack[depth]);
	free(rest);
	return r >= 0 || w->refused ? r : -e;
}

int
tree_mounts_judge(void *ctx, const struct tree_mount *m, const char *name, char *why,
	size_t len)
{
	(void)ctx;
	(void)name;
	return tree_mounts->mount_ok(m, why, len);
}

/*
 * open_across's walk of rel beneath t (tree_walk, judged by tree_mounts'
 * mount_ok). The judged file's O_PATH descriptor; -1 and errno EXDEV where
 * rel leaves the tree (for the caller to explain), or another errno; -2
 * with the message set where mount_ok refused a mount.
 */
static int
walk_judged(const struct model_tree *t, const char *rel, const char *path)
{
	struct tree_walk w = { .judge = tree_mounts_judge, .beneath = true };
	char why[128];
	int fd = tree_walk(t->fd, rel, &w, why, sizeof(why));

	if (fd >= 0)
		return fd;
	if (w.refused) {
		error_set(-EXDEV, "%s: lies on %s, across a mount inside the model's tree %s: "
			"wcached does not open it (a FUSE or network server that never answers "
			"an open would hold wcached; put the model's directory itself there)",
			path, why, t->root);
		return -2;
	}
	errno = -fd;
	return -1;
}

/*
 * tree_open_file's open of rel under tree_mounts, after its openat2 with
 * RESOLVE_NO_XDEV said EXDEV (a mount crossed, or a link out of the tree):
 * the file is reached again by walk_judged, every mount on the way judged
 * before anything on it is asked, and only then is that very file opened
 * (through its /proc/self/fd link: no second walk a mount could be
 * slipped into). 0 with *fd the descriptor, or -1 and errno (EXDEV: a
 * link leaves the tree, for the caller to explain); or -EXDEV with the
 * message.
 */
static int
open_across(const struct model_tree *t, const char *rel, const char *path, long *fd)
{
	char proc[48];
	int p, e;

	if ((p = walk_judged(t, rel, path)) == -2)
		return -EXDEV;
	if ((*fd = p) == -1)
		return 0;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", p);
	*fd = file_openat(AT_FDCWD, proc, TREE_OPEN_FLAGS);
	if (*fd == -1 && errno == ENOENT) /* no procfs: walked again */
		*fd = tree_openat2(t->fd, rel, TREE_OPEN_FLAGS,
			RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
	e = errno;
	close(p);
	errno = e;
	return 0;
}

int
tree_open_file(const struct model_tree *t, const char *name, const char *path,
	struct wc_file *out)
{
	char *rel;
	long fd = -1;
	int r;

	if (asprintf(&rel, "%s%s", t->dir, name) < 0)
		return error_set(-ENOMEM, "%s: out of memory", path);
	if (t->proc) /* the caller's own descriptor, /proc/self/fd/N: no tree */
		fd = file_openat(t->fd, rel, TREE_OPEN_FLAGS);
	else
		fd = tree_openat2(t->fd, rel, TREE_OPEN_FLAGS,
			RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS |
			(tree_mounts != NULL ? RESOLVE_NO_XDEV : 0));
	if (fd == -1 && errno == EXDEV && tree_mounts != NULL && !t->proc &&
		(r = open_across(t, rel, path, &fd)) < 0) {
		free(rel);
		return r;
	}
	if (fd == -1) {
		if (errno == ENOSYS && !t->proc)
			fd = open_fallback(t, rel, path);
		else if (errno == EXDEV)
			fd = explain_escape(t, rel, path);
		else if (errno == ELOOP)
			fd = error_set(-ELOOP,
				"%s: a symlink loop, or a link into /proc, inside the model's "
				"tree %s", path, t->root);
		else
			fd = error_set(-errno, "%s: %s", path, strerror(errno));
	}
	free(rel);
	if (fd < 0)
		return (int)fd;
	if ((r = file_from_fd((int)fd, path, out)) < 0)
		close((int)fd);
	return r;
}

int
tree_open_model_file(const char *path, struct wc_file *out)
{
	const char *slash = strrchr(path, '/');
	struct model_tree t = { .fd = -1 };
	char *dir;
	int r;

	if ((dir = path_dir(path)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", path);
	r = tree_open(dir, &t);
	free(dir);
	if (r == -ENOENT || r == -ENOTDIR || r == -EACCES || r == -ELOOP)
		return error_set(r, "%s: %s", path, strerror(-r)); /* name the file */
	/* t is set whenever r is 0; the analyser, which cannot tell that
	 * error_set(-errno) is negative, is told so. */
	if (r < 0 || t.root == NULL || t.dir == NULL)
		return r < 0 ? r : -EIO;
	r = tree_open_file(&t, slash != NULL ? slash + 1 : path, path, out);
	tree_close(&t);
	return r;
}
