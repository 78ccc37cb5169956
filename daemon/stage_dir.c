/*
 * stage_dir.c: stage_dir and what lies in it (see stage.h): preparing it
 * at start (stage_prepare_dir), checking and opening it (stage_check_dir,
 * stage_open_dir; stage_dir_check_local: it must be on a local
 * filesystem), which copy of it a path lies in (stage_dir_of), the
 * token of this process's temporary copies (stage_token), removing copies
 * (stage_remove() and stage_remove_until_stop() on the caller's thread,
 * stage_remove_later() on libuv's work queue, and stage_remove_at(),
 * through which stage.c's failed staging removes its temporary copy too) and
 * sweeping what earlier processes left (stage_sweep()). Copying is
 * stage.c's.
 *
 * Removal is here, apart from the copy, because it is where staging could
 * do harm: stage_dir may be a directory an operator shares with other
 * programs, and a removal that followed a symbolic link or trusted a name
 * would empty what wcached never made. So it works on descriptors:
 * stage_dir is opened and checked once (stage_check_dir: wcached's, not
 * writable by its group or others), each copy opened below it with
 * O_NOFOLLOW and removed only with its marker in it (stage_remove_at),
 * whether stage_remove(), the sweep or a failed staging asks. The sweep
 * also holds an flock on stage_dir for the life of the process, so that a
 * second wcached given the same stage_dir leaves the first one's copies
 * alone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "fstype.h"
#include "log.h"
#include "mountrule.h"
#include "stage.h"
#include "stage_internal.h"

/* Passes over a copy's entries before its removal gives up (empty_copy). */
#define STAGE_EMPTY_PASSES 3

int
stage_check_dir(int fd, const char *path, uid_t owner)
{
	struct stat st;

	if (fstat(fd, &st) == -1)
		return error_set(-errno, "stage_dir %s: %s", path, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return error_set(-ENOTDIR, "stage_dir %s is not a directory", path);
	if (st.st_uid != owner)
		return error_set(-EPERM, "stage_dir %s belongs to uid %u, not to uid %u that "
			"wcached runs as: give wcached a directory of its own", path,
			(unsigned)st.st_uid, (unsigned)owner);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
		return error_set(-EPERM, "stage_dir %s is writable by %s (mode %04o): another user "
			"could make wcached remove what it did not make; give wcached a "
			"directory of its own (chmod go-w)", path,
			(st.st_mode & S_IWOTH) != 0 ? "all users" : "its group",
			(unsigned)(st.st_mode & 07777));
	return 0;
}

int
stage_open_dir(const char *stage_dir, int *fd)
{
	int d = open(stage_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err;

	if (d == -1)
		return error_set(-errno, "stage_dir %s: %s", stage_dir, strerror(errno));
	if ((err = stage_check_dir(d, stage_dir, geteuid())) < 0) {
		close(d);
		return err;
	}
	*fd = d;
	return 0;
}

int
stage_prepare_dir(const char *stage_dir, uid_t uid, gid_t gid)
{
	char *p = strdup(stage_dir);
	struct stat st;
	int fd, made, err;

	if (p == NULL)
		return error_set(-ENOMEM, "out of memory");
	/* The parents (0755, as root only: the user's are the operator's). */
	for (char *s = p + 1; uid != (uid_t)-1 && (s = strchr(s, '/')) != NULL; s++) {
		*s = '\0';
		if (mkdir(p, 0755) == -1 && errno != EEXIST) {
			int e = errno;

			free(p);
			return error_set(-e, "stage_dir %s: creating its parent: %s", stage_dir,
				strerror(e));
		}
		*s = '/';
	}
	free(p);
	if (!(made = mkdir(stage_dir, 0700) == 0) && errno != EEXIST)
		return error_set(-errno, "stage_dir %s cannot be created: %s", stage_dir,
			strerror(errno));
	if ((fd = open(stage_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) == -1) {
		int e = errno;

		if (e == ENOTDIR)
			return error_set(-ENOTDIR, "stage_dir %s is not a directory", stage_dir);
		return error_set(-e, "stage_dir %s: %s", stage_dir, strerror(e));
	}
	/* Only the directory made here is given away: an existing one of
	 * someone else's (a shared /var/cache, /tmp, a home) is refused below,
	 * never taken over. */
	err = made && uid != (uid_t)-1 && fchown(fd, uid, gid) == -1 ?
		error_set(-errno, "stage_dir %s: chown: %s", stage_dir, strerror(errno)) : 0;
	if (err == 0 && !made && uid != (uid_t)-1 && fstat(fd, &st) == 0 && st.st_uid == uid &&
		st.st_gid != gid && fchown(fd, uid, gid) == -1)
		err = error_set(-errno, "stage_dir %s: chown: %s", stage_dir, strerror(errno));
	if (err == 0)
		err = stage_check_dir(fd, stage_dir, uid != (uid_t)-1 ? uid : geteuid());
	close(fd);
	return err;
}

/* The most links stage_dir_check_local's walk follows (the kernel's). */
#define LOCAL_WALK_LINKS 40
/* What every line refusing stage_dir ends with (review rev221 L3: one
 * wording): what it costs (M3: nothing looked up there, neither by a warm
 * restart on the event loop, which a server that hangs would stop, nor by
 * a staging; a copy there would be no local copy). */
#define LOCAL_WHY "models that must be staged are refused; no staged copies are restored or " \
	"swept there"

/* The remote mount the walk h of stage_dir is refused at: name in the
 * directory h stands in (NULL: that directory; either may be stage_dir
 * itself, or a directory on the way to it), and its type. */
static int
refuse_remote(const struct mountrule_hand *h, const char *name, const struct fs_info *fs)
{
	const char *type = fs->type[0] != '\0' ? fs->type : fs->name;
	const char *stage_dir = h->path;
	char where[PATH_MAX];

	if (name != NULL)
		mountrule_hand_spell(h, name, where, sizeof(where));
	else
		snprintf(where, sizeof(where), "%s", h->where[0] != '\0' ? h->where : ".");
	if (strcmp(where, stage_dir) == 0)
		return error_set(-EREMOTE, "stage_dir %s is on %s, a network or FUSE "
			"filesystem: " LOCAL_WHY, stage_dir, type);
	return error_set(-EREMOTE, "stage_dir %s: %s, on the way to it, is on %s, a network or "
		"FUSE filesystem: " LOCAL_WHY, stage_dir, where, type);
}

int
stage_dir_check_local(const char *stage_dir)
{
	/* The filesystems of the directory walked to, and of a name in it. */
	struct fs_info fs = { .remote = false }, on;
	struct mountrule_hand h = { .path = stage_dir, .fs = &fs };
	char why[MOUNTRULE_WHY], name[NAME_MAX + 1], text[PATH_MAX + 1];
	int fd, err, links = 0;
	/* Names past a missing one, less the ".." that go back up. */
	size_t made = 0;
	dev_t start, dev;
	struct stat st;
	ssize_t n;

	/*
	 * Walked by hand, one name at a time (links followed as the kernel
	 * follows them), each mount judged before anything on it is looked
	 * up (review rev221 M1): the first network or FUSE mount on the way
	 * is refused, root's too, its server never asked (mountrule_open's
	 * walk steps into root's and looks names up there, which waits with
	 * a server that hangs, and judged only the mount it ended on). The
	 * mount the walk starts on ("/") is walked as it must be, and judged
	 * where the walk ends on it. The hand (mountrule.h) steps, spells
	 * and follows links as it does for registry_walk_links, which is no
	 * walk for this: the registry is above stage (scripts/layers.sh),
	 * and that walk ends at a missing name, crosses root's network
	 * mounts and follows links on /proc by their text.
	 */
	err = mountrule_hand_start(&h);
	start = h.dev;
	while (err == 0 && (err = mountrule_hand_next(&h, name)) > 0) {
		err = 0;
		/*
		 * Past a missing name, by name (review rev222 L1):
		 * stage_prepare_dir makes each missing name a directory on the
		 * filesystem of the one above it, and ".." leads back up, then
		 * on to names that exist (`T/new/../mnt/staged`: mnt is judged;
		 * before, the walk ended at "new", and the start made it and
		 * looked "staged" up on mnt).
		 */
		if (made > 0) {
			made = strcmp(name, "..") == 0 ? made - 1 : made + 1;
			continue;
		}
		/* Missing: on by name, as above; another failure ends the walk;
		 * a user's FUSE mount, or one gone: mountrule_hand_open's
		 * refusal. */
		on = fs;
		if ((fd = mountrule_hand_open(&h, name, &dev, &on, why, sizeof(why))) < 0) {
			if ((err = fd) == -ENOENT) {
				made = 1;
				err = 0;
			} else if (err == -EXDEV) {
				err = error_set(-EXDEV, "stage_dir %s: " LOCAL_WHY, why);
			}
			continue;
		}
		if (on.remote && dev != start)
			err = refuse_remote(&h, name, &on);
		else if (fstat(fd, &st) != 0)
			err = -errno;
		else if (S_ISLNK(st.st_mode) && strcmp(on.name, "proc") == 0)
			err = error_set(-EXDEV, "stage_dir %s: %s is a link on /proc (its text "
				"need not be where it leads): " LOCAL_WHY, stage_dir,
				mountrule_hand_spell(&h, name, text, sizeof(text)));
		if (err != 0) {
			close(fd);
			continue;
		}
		if (!S_ISLNK(st.st_mode)) { /* into what it names */
			mountrule_hand_into(&h, fd, dev, name);
			fs = on;
			continue;
		}
		/* A link: its text, then what is left of the path, from the
		 * directory holding it or, for an absolute text, "/". */
		n = ++links > LOCAL_WALK_LINKS ? (errno = ELOOP, -1) :
			readlinkat(fd, "", text, PATH_MAX);
		err = n < 0 ? -errno : n == PATH_MAX ? -ENAMETOOLONG : 0;
		close(fd);
		if (err == 0) {
			text[n] = '\0';
			err = mountrule_hand_follow(&h, text);
		}
	}
	/* Where it ends (stage_dir, or the directory its missing names would
	 * be made in; where the walk failed otherwise, stage_prepare_dir says
	 * why). */
	if (err != -EXDEV && err != -EREMOTE && h.dir >= 0 && fs.remote)
		err = refuse_remote(&h, NULL, &fs);
	mountrule_hand_end(&h);
	return err == -EXDEV || err == -EREMOTE ? err : 0;
}

int
stage_dir_of(const char *stage_dir, const char *path, char **dir)
{
	size_t len = strlen(stage_dir);
	const char *rest, *slash;

	while (len > 1 && stage_dir[len - 1] == '/')
		len--;
	if (strncmp(path, stage_dir, len) != 0 || path[len] != '/')
		return 0;
	rest = path + len + 1;
	if ((slash = strchr(rest, '/')) == NULL || slash == rest)
		return 0;
	if ((*dir = strndup(path, (size_t)(slash - path))) == NULL)
		return error_set(-ENOMEM, "out of memory");
	return 1;
}

/* Whether *stop (stop may be NULL) says to remove no more. */
static bool
stopped(const int *stop)
{
	return stop != NULL && __atomic_load_n(stop, __ATOMIC_RELAXED);
}

/*
 * Unlinks every entry of the copy d (parent/name) but its marker, reading it
 * again until a pass finds nothing more (an entry unlinked during readdir
 * may hide another from that pass): 0 once the marker alone is left,
 * -ECANCELED when *stop is set first, or -errno with the message (an entry
 * or the directory itself could not be read or removed). The marker goes
 * only after a 0: a copy still holding files keeps it, so the next sweep
 * knows it for wcached's and removes the rest.
 */
static int
empty_copy(DIR *d, const char *parent, const char *name, const int *stop)
{
	struct dirent *e;
	int err = 0;

	for (int pass = 0; pass < STAGE_EMPTY_PASSES; pass++) {
		bool found = false;

		rewinddir(d);
		for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
				strcmp(e->d_name, STAGE_MARKER) == 0)
				continue;
			found = true;
			if (stopped(stop)) /* an earlier failure stays the one returned */
				return err < 0 ? err : -ECANCELED;
			if (unlinkat(dirfd(d), e->d_name, 0) == -1 && errno != ENOENT && err == 0)
				err = error_set(-errno, "removing %s/%s/%s: %s", parent, name,
					e->d_name, strerror(errno));
		}
		if (errno != 0 && err == 0)
			err = error_set(-errno, "reading %s/%s: %s", parent, name, strerror(errno));
		if (err < 0 || !found)
			return err;
	}
	return error_set(-ENOTEMPTY, "removing %s/%s: still not empty after %d passes",
		parent, name, STAGE_EMPTY_PASSES);
}

int
stage_remove_at(int pfd, const char *parent, const char *name, const int *stop,
	const char **why)
{
	struct stat st;
	uid_t me = geteuid();
	DIR *d;
	int dfd, err = 0;

	dfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd == -1 && errno == ENOENT)
		return STAGE_GONE;
	if (dfd == -1 && (errno == ENOTDIR || errno == ELOOP)) {
		*why = "not a directory: a file or a symbolic link";
		return STAGE_NOT_OURS;
	}
	if (dfd == -1)
		return error_set(-errno, "removing %s/%s: %s", parent, name, strerror(errno));
	if (fstat(dfd, &st) == -1 || st.st_uid != me) {
		*why = "a directory of another user";
		close(dfd);
		return STAGE_NOT_OURS;
	}
	if (fstatat(dfd, STAGE_MARKER, &st, AT_SYMLINK_NOFOLLOW) == -1 || !S_ISREG(st.st_mode) ||
		st.st_uid != me) {
		*why = "no " STAGE_MARKER " of wcached's user in it";
		close(dfd);
		return STAGE_NOT_OURS;
	}
	if ((d = fdopendir(dfd)) == NULL) {
		err = error_set(-errno, "removing %s/%s: %s", parent, name, strerror(errno));
		close(dfd);
		return err;
	}
	if ((err = empty_copy(d, parent, name, stop)) == -ECANCELED) {
		closedir(d);
		return err;
	}
	if (err == 0 && unlinkat(dirfd(d), STAGE_MARKER, 0) == -1 && errno != ENOENT)
		err = error_set(-errno, "removing %s/%s/%s: %s", parent, name, STAGE_MARKER,
			strerror(errno));
	closedir(d);
	if (err == 0 && unlinkat(pfd, name, AT_REMOVEDIR) == -1 && errno != ENOENT)
		err = error_set(-errno, "removing %s/%s: %s", parent, name, strerror(errno));
	return err < 0 ? err : STAGE_REMOVED;
}

int
stage_remove_until_stop(const char *dir, const int *stop)
{
	char *parent = path_dir(dir);
	const char *why = NULL;
	int pfd, r;

	if (parent == NULL)
		return error_set(-ENOMEM, "out of memory");
	if ((pfd = open(parent[0] != '\0' ? parent : ".",
		O_RDONLY | O_DIRECTORY | O_CLOEXEC)) == -1) {
		r = errno == ENOENT ? 0 :
			error_set(-errno, "removing %s: %s", dir, strerror(errno));
		free(parent);
		return r;
	}
	if ((r = stage_check_dir(pfd, parent, geteuid())) == 0 &&
		(r = stage_remove_at(pfd, parent, file_basename(dir), stop, &why)) ==
		STAGE_NOT_OURS)
		r = error_set(-EPERM, "%s is not a copy wcached made (%s): left alone", dir, why);
	else if (r == -ECANCELED)
		r = error_set(-ECANCELED, "staged copy %s: its removal stopped as wcached stops: "
			"the next start removes what is left", dir);
	close(pfd);
	free(parent);
	return r < 0 ? r : 0;
}

int
stage_remove(const char *dir)
{
	return stage_remove_until_stop(dir, NULL);
}

struct remove_work {
	uv_work_t work;
	char *dir;
	const int *stop;
	int err;
	char message[ERROR_MAX];
};

/* Logs how rw's removal ended: removed (debug), stopped, or failed. */
static void
remove_report(const struct remove_work *rw)
{
	if (rw->err == -ECANCELED)
		log_info("%s", rw->message);
	else if (rw->err < 0)
		log_warnx("staged copy not removed: %s", rw->message);
	else
		log_debug("staged copy %s removed", rw->dir);
}

static void
remove_run(uv_work_t *w)
{
	struct remove_work *rw = w->data;

	if ((rw->err = stage_remove_until_stop(rw->dir, rw->stop)) < 0)
		snprintf(rw->message, sizeof(rw->message), "%s", error_get());
}

static void
remove_after(uv_work_t *w, int status)
{
	struct remove_work *rw = w->data;

	(void)status;
	remove_report(rw);
	free(rw->dir);
	free(rw);
}

/* Whether the copy dir lies directly in stage_dir (both resolved paths,
 * as registry_set_stage_dir and the copies made from it are). */
static bool
directly_in(const char *stage_dir, const char *dir)
{
	char *parent = path_dir(dir);
	bool in = parent != NULL && stage_dir != NULL && strcmp(parent, stage_dir) == 0;

	free(parent);
	return in;
}

void
stage_remove_later(uv_loop_t *loop, char *dir, const int *stop, const char *swept)
{
	struct remove_work *rw, now = { .dir = dir, .stop = stop };

	if (dir == NULL)
		return;
	if (stop != NULL && !directly_in(swept, dir))
		now.stop = NULL;
	if ((rw = calloc(1, sizeof(*rw))) != NULL) {
		*rw = now;
		rw->work.data = rw;
		if (uv_queue_work(loop, &rw->work, remove_run, remove_after) == 0)
			return;
		free(rw);
	}
	/* No memory to queue it, or the queue refused it: at once, here. */
	now.work.data = &now;
	remove_run(&now.work);
	remove_report(&now);
	free(dir);
}

/* This process's token (stage_token), made once. */
static char token[17];
static pthread_once_t token_once = PTHREAD_ONCE_INIT;

/* Draws the token: 64 random bits; where the kernel has none to give yet
 * (early in a boot), the clocks and the pid, which a restart does not
 * repeat all together. */
static void
make_token(void)
{
	uint64_t t = 0;

	if (getrandom(&t, sizeof(t), GRND_NONBLOCK) != (ssize_t)sizeof(t)) {
		struct timespec real, mono;

		clock_gettime(CLOCK_REALTIME, &real);
		clock_gettime(CLOCK_MONOTONIC, &mono);
		t = (uint64_t)real.tv_sec * 1000000000u + (uint64_t)real.tv_nsec;
		t ^= ((uint64_t)mono.tv_nsec << 24) ^ ((uint64_t)getpid() << 40);
	}
	snprintf(token, sizeof(token), "%016" PRIx64, t);
}

const char *
stage_token(void)
{
	pthread_once(&token_once, make_token);
	return token;
}

/* Is name one stage_copy() makes: "<model>.<number>" with an optional
 * "-<k>", or a temporary ".<model>.tmp-<token>-XXXXXX" (an older wcached's
 * ".<model>.tmp-<pid>-XXXXXX" too)? *own_tmp: the latter, with this
 * process's token: a staging of this process may be writing it. */
static bool
staged_name(const char *name, bool *own_tmp)
{
	const char *dot = strrchr(name, '.'), *tmp = strstr(name, ".tmp-"), *own;
	char mine[32];

	*own_tmp = false;
	if (name[0] == '.' && tmp != NULL && tmp != name) {
		snprintf(mine, sizeof(mine), ".tmp-%s-", stage_token());
		own = strstr(name, mine);
		*own_tmp = own != NULL && strlen(own + strlen(mine)) == 6;
		return true;
	}
	if (name[0] == '.' || dot == NULL || dot == name || dot[1] < '0' || dot[1] > '9')
		return false;
	for (const char *p = dot + 1; *p != '\0'; p++) {
		if (*p == '-' && p[1] >= '0' && p[1] <= '9' && p > dot + 1)
			continue;
		if (*p < '0' || *p > '9')
			return false;
	}
	return true;
}

/* The directory a sweep locked (flock) for the life of the process: a
 * second wcached started with the same stage_dir then leaves the copies
 * of the first alone. One sweep at a time (wcached runs one, at start, on
 * the work queue: registry_stage_sweep), so unguarded. */
static int sweep_lock = -1;

/* Locks stage_dir (its open descriptor sfd) for this process: 0, or
 * -EBUSY when another process holds it. */
static int
lock_stage_dir(int sfd, const char *stage_dir)
{
	struct stat a, b;
	int fd;

	if (sweep_lock >= 0 && fstat(sweep_lock, &a) == 0 && fstat(sfd, &b) == 0 &&
		a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		return 0;
	if ((fd = fcntl(sfd, F_DUPFD_CLOEXEC, 0)) == -1)
		return error_set(-errno, "stage_dir %s: %s", stage_dir, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) == -1) {
		int e = errno;

		close(fd);
		if (e == EWOULDBLOCK)
			return error_set(-EBUSY, "stage_dir %s is in use by another running "
				"wcached (it holds its lock): nothing in it is removed; give each "
				"wcached a stage_dir of its own", stage_dir);
		return error_set(-e, "stage_dir %s: flock: %s", stage_dir, strerror(e));
	}
	if (sweep_lock >= 0)
		close(sweep_lock);
	sweep_lock = fd;
	return 0;
}

int
stage_sweep(const char *stage_dir, char *const *keep, size_t nkeep, const int *stop,
	unsigned *removed)
{
	struct dirent *e;
	DIR *d;
	int sfd = -1, err;

	*removed = 0;
	if ((err = stage_open_dir(stage_dir, &sfd)) < 0) {
		/* Said at every start: what it costs too (review rev223 L11). */
		char msg[ERROR_MAX];

		if (err == -ENOENT)
			return 0;
		snprintf(msg, sizeof(msg), "%s", error_get());
		return error_set(err, "%s: models that must be staged are refused; no staged "
			"copies are swept there", msg);
	}
	if ((err = lock_stage_dir(sfd, stage_dir)) < 0 || (d = fdopendir(sfd)) == NULL) {
		if (err == 0)
			err = error_set(-errno, "stage_dir %s: %s", stage_dir, strerror(errno));
		close(sfd);
		return err;
	}
	for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
		const char *why = NULL;
		bool own_tmp, kept = false;
		char *full;
		int r;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
			!staged_name(e->d_name, &own_tmp) || own_tmp)
			continue;
		if ((full = path_join(stage_dir, e->d_name)) == NULL) {
			err = error_set(-ENOMEM, "out of memory");
			break;
		}
		for (size_t i = 0; i < nkeep && !kept; i++)
			kept = strcmp(keep[i], full) == 0;
		free(full);
		if (kept)
			continue;
		if (!stopped(stop))
			r = stage_remove_at(dirfd(d), stage_dir, e->d_name, stop, &why);
		else
			r = -ECANCELED;
		if (r == -ECANCELED) {
			/* Before this copy or within it (its marker stays, so the
			 * next sweep finds it). An earlier failure stays the one
			 * returned. */
			if (err == 0)
				err = error_set(-ECANCELED, "the sweep of stage_dir %s stopped "
					"as wcached stops, after %u cop%s: the next start removes "
					"what is left", stage_dir, *removed,
					*removed == 1 ? "y" : "ies");
			break;
		}
		if (r < 0 && err == 0)
			err = r;
		else if (r == STAGE_REMOVED)
			(*removed)++;
		else if (r == STAGE_NOT_OURS)
			log_warnx("stage_dir %s: %s is not a copy wcached made (%s): left alone",
				stage_dir, e->d_name, why);
	}
	/* A read that failed ends the sweep early: say so (errno is 0 after
	 * the last entry, and a break above left e set). */
	if (e == NULL && errno != 0 && err == 0)
		err = error_set(-errno, "reading stage_dir %s: %s", stage_dir, strerror(errno));
	closedir(d);
	return err;
}
