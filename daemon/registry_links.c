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
 * it is looked up (mountrule.h's mountrule_step: the mount's ID, told by
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

#include "base/path.h"
#include "diracl.h"
#include "mountrule.h"
#include "registry_internal.h"

/* How the walk opens a directory it goes up to (".."): never a link. */
#define WALK_DIR (O_PATH | O_DIRECTORY | O_CLOEXEC)

/* name spelled below where (the walk's spelling of a directory: "/" for
 * the root, "" for the working directory) in buf of len bytes, for
 * messages. */
static const char *
spell(char *buf, size_t len, const char *where, const char *name)
{
	snprintf(buf, len, "%s%s%s", where, where[0] != '\0' &&
		where[strlen(where) - 1] != '/' ? "/" : "", name);
	return buf;
}

/* where, the walk's spelling of a directory (PATH_MAX bytes), made the
 * spelling of its parent: its last name dropped, or ".." added where it
 * has none left to drop (a relative path above its start). */
static void
spell_up(char *where)
{
	char *slash = strrchr(where, '/');
	const char *last = slash != NULL ? slash + 1 : where;

	if (strcmp(where, "/") == 0)
		return;
	if (where[0] == '\0' || strcmp(last, "..") == 0) {
		char up[PATH_MAX];

		snprintf(where, PATH_MAX, "%s", spell(up, sizeof(up), where, ".."));
	} else if (slash == where)
		where[1] = '\0';
	else if (slash != NULL)
		*slash = '\0';
	else
		where[0] = '\0';
}

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
 * of the directory dir spelled where, met by w: judged (judge, when not
 * NULL), noted, and its text in text (PATH_MAX + 1 bytes: a link's text
 * may have up to PATH_MAX - 1, review rev198 L1). 0, the judge's
 * code, or -errno.
 */
static int
take_link(struct registry_walk *w, int fd, const struct stat *st, int dir, const char *where,
	const char *name, registry_link_judge judge, void *arg, char *text)
{
	char path[PATH_MAX + NAME_MAX + 2];
	struct registry_link_seen seen;
	struct stat ds;
	ssize_t n;
	int err;

	if (w->nhops == REGISTRY_LINK_HOPS || w->nlinks == REGISTRY_WALK_SEEN)
		return -ELOOP;
	if (diracl_fstat(dir, &ds) != 0 || (n = readlinkat(fd, "", text, PATH_MAX)) < 0)
		return -errno;
	if (n == PATH_MAX)
		return -ENAMETOOLONG;
	text[n] = '\0';
	seen.path = spell(path, sizeof(path), where, name);
	seen.target = text;
	seen.dir = where[0] != '\0' ? where : ".";
	seen.st = st;
	seen.dir_st = &ds;
	if (judge != NULL && (err = judge(&seen, arg)) != 0)
		return err;
	note_link(w, st, &ds, text);
	w->nhops++;
	return 0;
}

/* The directory open as fd (its fstat st), the entry name of the
 * directory dir spelled where, which w goes into or ends at: judged
 * (judge, when not NULL) and noted when the judge binds it (review rev199
 * H3). 0, the judge's code, or -errno. */
static int
take_dir(struct registry_walk *w, const struct stat *st, int dir, const char *where,
	const char *name, registry_link_judge judge, void *arg)
{
	char path[PATH_MAX + NAME_MAX + 2];
	struct registry_link_seen seen;
	struct stat ds;
	int err;

	if (judge == NULL)
		return 0;
	if (diracl_fstat(dir, &ds) != 0)
		return -errno;
	seen.path = spell(path, sizeof(path), where, name);
	seen.target = "";
	seen.dir = where[0] != '\0' ? where : ".";
	seen.st = st;
	seen.dir_st = &ds;
	if ((err = judge(&seen, arg)) <= 0)
		return err;
	if (w->nlinks == REGISTRY_WALK_SEEN)
		return -ELOOP;
	note_link(w, st, &ds, "");
	return 0;
}

/* The name fd is open at, in the directory h stands in, stepped onto by
 * w's walk (mountrule_step): 0 with *dev its device; -EXDEV with
 * w->refused and its line; or -errno. */
static int
step(struct registry_walk *w, struct mountrule_hand *h, int fd, const char *name, dev_t *dev)
{
	int err = mountrule_step(h, fd, name, dev, w->why, sizeof(w->why));

	if (err == -EXDEV)
		w->refused = 1;
	return err;
}

int
registry_walk_links(const char *path, registry_link_judge judge, void *arg,
	struct registry_walk *w)
{
	char *todo = strdup(path), *next, where[PATH_MAX], name[NAME_MAX + 1];
	char text[PATH_MAX + 1], up[PATH_MAX];
	const char *p = todo;
	int dir = open(path[0] == '/' ? "/" : ".", WALK_DIR), err = 0, fd;
	struct mountrule_hand h = { .path = path };
	struct stat st;
	dev_t dev;

	w->nlinks = 0;
	w->nhops = 0;
	w->stopped = 0;
	w->refused = 0;
	w->why[0] = '\0';
	mountrule_walk_init(&h.run);
	snprintf(where, sizeof(where), "%s", path[0] == '/' ? "/" : "");
	if (todo == NULL || dir < 0)
		err = todo == NULL ? -ENOMEM : -errno;
	else
		err = mountrule_hand_at(&h, dir);
	while (err == 0) {
		int next_name = path_next_name(&p, name);

		if (next_name == 0) { /* the path ends at the directory reached */
			if (diracl_fstat(dir, &w->end) != 0)
				err = -errno;
			w->end_dir = w->end;
			break;
		}
		if (next_name < 0) {
			err = next_name;
			break;
		}
		if (strcmp(name, ".") == 0)
			continue;
		if (strcmp(name, "..") == 0) {
			if ((fd = openat(dir, "..", WALK_DIR)) < 0) {
				err = -errno;
				break;
			}
			if ((err = step(w, &h, fd, name, &dev)) != 0) {
				close(fd);
				break;
			}
			close(dir);
			dir = fd;
			h.dev = dev;
			spell_up(where);
			continue;
		}
		/* Its mount judged before its fstat, which may ask it. */
		if ((fd = openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
			(err = step(w, &h, fd, name, &dev)) != 0 || fstat(fd, &st) != 0) {
			if (err == 0)
				err = -errno;
			if (fd >= 0)
				close(fd);
			break;
		}
		if (S_ISLNK(st.st_mode)) {
			/* Its text, then what is left of the path, from the
			 * directory holding it or, for an absolute text, "/". */
			err = take_link(w, fd, &st, dir, where, name, judge, arg, text);
			close(fd);
			if (err == 0 && asprintf(&next, "%s%s", text, p) < 0)
				err = -ENOMEM;
			if (err == 0) {
				free(todo);
				p = todo = next;
			}
			if (err == 0 && text[0] == '/') {
				close(dir);
				if ((dir = open("/", WALK_DIR)) < 0)
					err = -errno;
				else
					err = mountrule_hand_at(&h, dir);
				snprintf(where, sizeof(where), "/");
			}
			continue;
		}
		if (p[strspn(p, "/")] != '\0') { /* a directory on the way */
			if (!S_ISDIR(st.st_mode) ||
				(err = take_dir(w, &st, dir, where, name, judge, arg)) != 0) {
				close(fd);
				if (err == 0)
					err = -ENOTDIR;
				break;
			}
			close(dir);
			dir = fd;
			h.dev = dev;
			snprintf(where, sizeof(where), "%s", spell(up, sizeof(up), where, name));
			continue;
		}
		w->end = st; /* the path's last entry, in dir */
		diracl_fold(fd, NULL, &w->end); /* a directory model's own (review rev211 L0) */
		if (diracl_fstat(dir, &w->end_dir) != 0)
			err = -errno;
		else if (S_ISDIR(st.st_mode))
			err = take_dir(w, &st, dir, where, name, judge, arg);
		close(fd);
		break;
	}
	/* Where it stopped: the directory it could not go on from. */
	if (err != 0 && dir >= 0 && diracl_fstat(dir, &w->stop_dir) == 0) {
		w->stopped = 1;
		snprintf(w->stop_where, sizeof(w->stop_where), "%s",
			where[0] != '\0' ? where : ".");
	}
	if (dir >= 0)
		close(dir);
	mountrule_walk_end(&h.run);
	free(todo);
	return err;
}
