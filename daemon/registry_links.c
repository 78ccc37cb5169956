/*
 * registry_links.c: the walk of a model's configured path that each load
 * makes once its files are opened (registry_load.c's check_links). The
 * path is walked component by component from "/" (the working directory
 * for a relative one), each component opened beneath the directory before
 * it with no link followed (openat O_PATH | O_NOFOLLOW), so that every
 * symbolic link met, on the path itself or on the way a link's text leads,
 * is seen as an entry of the directory holding it: handed to a judge with
 * its maker (the link's owner) and that directory, then followed by hand,
 * its text read from the link's own descriptor (readlinkat of ""), the
 * very link whose owner was asked. ".." is the parent of the directory
 * reached (openat ".."), as the kernel's walk takes it after a link. The
 * walk ends at the inode the path names now, which the load compares with
 * what its files were opened at: a link anywhere on the path, not only
 * its last entry, is judged (review rev195 H1), and a path renamed over
 * between the open and the walk leads elsewhere (H2). Each directory the
 * path enters or ends at is handed to the judge too, which may bind it
 * (recorded with the links): in a directory others may rename entries in,
 * a later walk must meet the very same one (review rev199 H3).
 *
 * Each name it opens (".." too) is on a mount judged before anything on
 * it is looked up (mountrule.h's mountrule_hand_open: the mount's ID, told by
 * statx(2) with AT_STATX_DONT_SYNC of the walk's own O_PATH descriptor,
 * and the mount table, no server asked), as mountrule_open's walk judges
 * it: a user's FUSE mount met on the way, on the path or where a link
 * renamed in leads, is not stepped onto (its fstat(2) asked his server,
 * which may never answer, and the thread of a load or of a warm restart's
 * check waited for good: review rev216 H2); the walk ends -EXDEV with
 * w->refused, and each caller takes that as it takes a refusal.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "diracl.h"
#include "mountrule.h"
#include "registry_internal.h"

/* The link st (its fstat) whose text is text (less than PATH_MAX bytes),
 * in the directory whose fstat is dir, as w's next link. */
static void
note_link(struct registry_walk *w, const struct stat *st, const struct stat *dir,
	const char *text)
{
	struct gen_link *l = &w->links[w->nlinks++];
	size_t n = strnlen(text, sizeof(l->text) - 1);

	l->dev = st->st_dev;
	l->ino = st->st_ino;
	l->uid = st->st_uid;
	memcpy(l->text, text, n);
	l->text[n] = '\0';
	l->dir_dev = dir->st_dev;
	l->dir_ino = dir->st_ino;
}

/*
 * The link open as fd (O_PATH | O_NOFOLLOW, its fstat st), the entry name
 * of the directory h stands in, met by w: judged (judge, when not NULL),
 * noted, and its text in text (PATH_MAX + 1 bytes: a link's text may have
 * up to PATH_MAX - 1, review rev198 L1). 0, the judge's code, or -errno.
 */
static int
take_link(struct registry_walk *w, const struct mountrule_hand *h, int fd,
	const struct stat *st, const char *name, registry_link_judge judge, void *arg, char *text)
{
	char path[PATH_MAX + NAME_MAX + 2];
	struct registry_link_seen seen;
	struct stat ds;
	ssize_t n;
	int err;

	if (w->nhops == REGISTRY_LINK_HOPS || w->nlinks == REGISTRY_WALK_SEEN)
		return -ELOOP;
	if (diracl_fstat(h->dir, &ds) != 0 || (n = readlinkat(fd, "", text, PATH_MAX)) < 0)
		return -errno;
	if (n == PATH_MAX)
		return -ENAMETOOLONG;
	text[n] = '\0';
	seen.path = mountrule_hand_spell(h, name, path, sizeof(path));
	seen.target = text;
	seen.dir = h->where[0] != '\0' ? h->where : ".";
	seen.st = st;
	seen.dir_st = &ds;
	if (judge != NULL && (err = judge(&seen, arg)) != 0)
		return err;
	note_link(w, st, &ds, text);
	w->nhops++;
	return 0;
}

/* The directory of fstat st, the entry name of the directory h stands
 * in, which w goes into or ends at: judged (judge, when not NULL) and
 * noted when the judge binds it (review rev199 H3). 0, the judge's code,
 * or -errno. */
static int
take_dir(struct registry_walk *w, const struct mountrule_hand *h, const struct stat *st,
	const char *name, registry_link_judge judge, void *arg)
{
	char path[PATH_MAX + NAME_MAX + 2];
	struct registry_link_seen seen;
	struct stat ds;
	int err;

	if (judge == NULL)
		return 0;
	if (diracl_fstat(h->dir, &ds) != 0)
		return -errno;
	seen.path = mountrule_hand_spell(h, name, path, sizeof(path));
	seen.target = "";
	seen.dir = h->where[0] != '\0' ? h->where : ".";
	seen.st = st;
	seen.dir_st = &ds;
	if ((err = judge(&seen, arg)) <= 0)
		return err;
	if (w->nlinks == REGISTRY_WALK_SEEN)
		return -ELOOP;
	note_link(w, st, &ds, "");
	return 0;
}

/* name opened in the directory h stands in and stepped onto by w's walk
 * (mountrule_hand_open): its descriptor with *dev its device; -EXDEV with
 * w->refused and its line; or -errno. */
static int
step(struct registry_walk *w, struct mountrule_hand *h, const char *name, dev_t *dev)
{
	int fd = mountrule_hand_open(h, name, dev, NULL, w->why, sizeof(w->why));

	if (fd == -EXDEV)
		w->refused = 1;
	return fd;
}

int
registry_walk_links(const char *path, registry_link_judge judge, void *arg,
	struct registry_walk *w)
{
	char name[NAME_MAX + 1], text[PATH_MAX + 1];
	struct mountrule_hand h = { .path = path };
	int err, fd;
	struct stat st;
	dev_t dev;

	w->nlinks = 0;
	w->nhops = 0;
	w->stopped = 0;
	w->refused = 0;
	w->why[0] = '\0';
	err = mountrule_hand_start(&h);
	while (err == 0) {
		int next_name = mountrule_hand_next(&h, name);

		if (next_name == 0) { /* the path ends at the directory reached */
			if (diracl_fstat(h.dir, &w->end) != 0)
				err = -errno;
			w->end_dir = w->end;
			break;
		}
		if (next_name < 0) {
			err = next_name;
			break;
		}
		/* Its mount judged before anything on it is looked up. */
		if ((fd = step(w, &h, name, &dev)) < 0) {
			err = fd;
			break;
		}
		if (strcmp(name, "..") == 0) {
			mountrule_hand_into(&h, fd, dev, name);
			continue;
		}
		if (fstat(fd, &st) != 0) {
			err = -errno;
			close(fd);
			break;
		}
		if (S_ISLNK(st.st_mode)) {
			/* Its text, then what is left of the path, from the
			 * directory holding it or, for an absolute text, "/". */
			err = take_link(w, &h, fd, &st, name, judge, arg, text);
			close(fd);
			if (err == 0)
				err = mountrule_hand_follow(&h, text);
			continue;
		}
		if (h.rest[strspn(h.rest, "/")] != '\0') { /* a directory on the way */
			if (!S_ISDIR(st.st_mode) ||
				(err = take_dir(w, &h, &st, name, judge, arg)) != 0) {
				close(fd);
				if (err == 0)
					err = -ENOTDIR;
				break;
			}
			mountrule_hand_into(&h, fd, dev, name);
			continue;
		}
		w->end = st; /* the path's last entry, in dir */
		diracl_fold(fd, NULL, &w->end); /* a directory model's own (review rev211 L0) */
		if (diracl_fstat(h.dir, &w->end_dir) != 0)
			err = -errno;
		else if (S_ISDIR(st.st_mode))
			err = take_dir(w, &h, &st, name, judge, arg);
		close(fd);
		break;
	}
	/* Where it stopped: the directory it could not go on from. */
	if (err != 0 && h.dir >= 0 && diracl_fstat(h.dir, &w->stop_dir) == 0) {
		w->stopped = 1;
		snprintf(w->stop_where, sizeof(w->stop_where), "%s",
			h.where[0] != '\0' ? h.where : ".");
	}
	mountrule_hand_end(&h);
	return err;
}
