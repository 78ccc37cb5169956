/*
 * stage.c: copying a model's files to stage_dir, checking the copy against
 * its sources, and removing copies (see stage.h).
 *
 * The copy streams each file in 8 MiB requests, as the warm-up reads: with
 * copy_file_range(2), which the kernel does without a trip through user
 * space; where it refuses (across filesystems before Linux 5.3 and again
 * since 5.19, or a system call filter) with sendfile(2) into the file, and
 * last with pread/pwrite. The source's pages are dropped as they are copied
 * (POSIX_FADV_DONTNEED): the copy's pages are the ones that will serve.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "format/shards.h"
#include "log.h"
#include "stage.h"

#define STAGE_CHUNK (8u << 20)
#define STAGE_MARGIN (64ull << 20)
#define STAGE_MAX_SUFFIX 1000

uint64_t
stage_space_needed(uint64_t bytes)
{
	uint64_t need;

	if (__builtin_add_overflow(bytes, bytes / 100 + STAGE_MARGIN, &need))
		return UINT64_MAX;
	return need;
}

const char *
stage_errno_name(int err)
{
	switch (err < 0 ? -err : err) {
	case EIO: return "EIO";
	case ESTALE: return "ESTALE";
	case ENOSPC: return "ENOSPC";
	case EDQUOT: return "EDQUOT";
	case EACCES: return "EACCES";
	case EPERM: return "EPERM";
	case EROFS: return "EROFS";
	case ENOENT: return "ENOENT";
	case ENOTCONN: return "ENOTCONN";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EFBIG: return "EFBIG";
	default: return NULL;
	}
}

/* "1.2 GiB", "300 MiB", "12 KiB", "5 bytes". */
static void
human(uint64_t n, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
	double v = (double)n;
	int u = -1;

	while (v >= 1024.0 && u < 3) {
		v /= 1024.0;
		u++;
	}
	if (u < 0)
		snprintf(buf, len, "%" PRIu64 " bytes", n);
	else
		snprintf(buf, len, v < 10.0 ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* A message for err (negative) while doing what to path: the errno's name
 * with strerror, so EIO and ESTALE read as such. */
static int
io_error(int err, const char *what, const char *path)
{
	const char *name;

	if (err >= 0)
		err = -EIO; /* an errno of 0: never, but a failure all the same */
	name = stage_errno_name(err);
	if (err == -ESTALE || err == -EIO)
		return error_set(err, "cannot stage it: %s %s failed: %s (%s): the file may have "
				      "been replaced or removed on another host, or its server failed",
			what, path, name, strerror(-err));
	if (name != NULL)
		return error_set(err, "cannot stage it: %s %s failed: %s (%s)", what, path, name,
			strerror(-err));
	return error_set(err, "cannot stage it: %s %s failed: %s", what, path, strerror(-err));
}

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

enum copy_method { COPY_RANGE, COPY_SENDFILE, COPY_READ };

/* One source file being copied. */
struct stage_file {
	int in;                 /* the source, open (not ours to close) or -1 */
	int own_in;             /* in is ours (the shard index) */
	const char *src;        /* its path, for messages */
	struct stat st;         /* its stat at open */
	const char *name;       /* its name in the copy */
};

/* No space while writing the copy: says so with the free space now. */
static int
no_space(int err, const struct stage_request *req, const char *src)
{
	struct statvfs vfs;
	char need[32], free_now[32];

	human(stage_space_needed(req->bytes), need, sizeof(need));
	if (statvfs(req->stage_dir, &vfs) == 0)
		human((uint64_t)vfs.f_bavail * vfs.f_frsize, free_now, sizeof(free_now));
	else
		snprintf(free_now, sizeof(free_now), "unknown");
	return error_set(err, "cannot stage it to %s: %s while copying %s (%s left)",
		req->stage_dir, err == -EDQUOT ? "disk quota exceeded" : "no space left", src,
		free_now);
}

/*
 * Copies size bytes of in to out from offset 0 in STAGE_CHUNK requests,
 * switching *how down to a method the kernel accepts. 0, or -errno with
 * the message.
 */
static int
copy_fd(const struct stage_request *req, const struct stage_file *f, int out,
	enum copy_method *how, char **buf)
{
	uint64_t size = (uint64_t)f->st.st_size;
	off_t off = 0;

	while ((uint64_t)off < size) {
		size_t want = size - (uint64_t)off < STAGE_CHUNK ? (size_t)(size - (uint64_t)off) :
								      STAGE_CHUNK;
		ssize_t n;

		if (req->cancel != NULL && __atomic_load_n(req->cancel, __ATOMIC_RELAXED))
			return error_set(-ECANCELED, "cancelled: wcached is stopping");
		if (*how == COPY_RANGE) {
			off_t in_off = off, out_off = off;

			n = copy_file_range(f->in, &in_off, out, &out_off, want, 0);
			if (n == -1 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
						errno == EOPNOTSUPP || errno == EPERM)) {
				*how = COPY_SENDFILE;
				continue;
			}
		} else if (*how == COPY_SENDFILE) {
			off_t in_off = off;

			if (lseek(out, off, SEEK_SET) == -1)
				return io_error(-errno, "writing the copy of", f->src);
			n = sendfile(out, f->in, &in_off, want);
			if (n == -1 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
						errno == EPERM)) {
				*how = COPY_READ;
				continue;
			}
		} else {
			if (*buf == NULL && (*buf = malloc(STAGE_CHUNK)) == NULL)
				return error_set(-ENOMEM, "out of memory");
			n = pread(f->in, *buf, want, off);
			if (n == -1 && errno != EINTR)
				return io_error(-errno, "reading", f->src);
			if (n > 0) {
				for (ssize_t done = 0, w; done < n; done += w) {
					w = pwrite(out, *buf + done, (size_t)(n - done), off + done);
					if (w == -1 && errno == EINTR) {
						w = 0;
						continue;
					}
					if (w == -1 && (errno == ENOSPC || errno == EDQUOT))
						return no_space(-errno, req, f->src);
					if (w <= 0)
						return io_error(w == 0 ? -EIO : -errno,
							"writing the copy of", f->src);
				}
			}
		}
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1 && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG))
			return no_space(-errno, req, f->src);
		if (n == -1)
			/* Local writes rarely fail; a failed copy is the remote
			 * read's (EIO, ESTALE). */
			return io_error(-errno, "reading", f->src);
		if (n == 0)
			return error_set(-ENODATA, "cannot stage it: %s changed during the copy: it ended at %jd "
				"bytes, not %" PRIu64 "; replace model files with rename(2), "
				"never in place", f->src, (intmax_t)off, size);
		/* The copy's pages serve; the source's need not stay. */
		(void)posix_fadvise(f->in, off, n, POSIX_FADV_DONTNEED);
		off += n;
	}
	return 0;
}

static bool
same_mtime(const struct stat *a, const struct stat *b)
{
	return a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Is f's source still the file it was when it was opened: the same size and
 * mtime, and still the inode its path names? 0, or -ESTALE saying how not. */
static int
check_unchanged(const struct stage_file *f)
{
	struct stat now;

	if (fstat(f->in, &now) == -1)
		return io_error(-errno, "checking", f->src);
	if (now.st_size != f->st.st_size)
		return error_set(-ESTALE, "cannot stage it: %s changed during the copy (%jd bytes, then %jd); "
			"replace model files with rename(2), never in place", f->src,
			(intmax_t)f->st.st_size, (intmax_t)now.st_size);
	if (!same_mtime(&now, &f->st))
		return error_set(-ESTALE, "cannot stage it: %s changed during the copy (its mtime moved); "
			"replace model files with rename(2), never in place", f->src);
	if (stat(f->src, &now) == -1)
		return error_set(-ESTALE, "cannot stage it: %s was removed during the copy", f->src);
	if (now.st_dev != f->st.st_dev || now.st_ino != f->st.st_ino)
		return error_set(-ESTALE, "cannot stage it: %s was replaced during the copy; the new file is "
			"staged by the next load", f->src);
	return 0;
}

/* Copies f into the directory dfd as f->name, keeping its mtime; adds the
 * bytes on disk to *disk. */
static int
copy_file(const struct stage_request *req, const struct stage_file *f, int dfd,
	enum copy_method *how, char **buf, uint64_t *disk)
{
	struct timespec times[2] = { { .tv_nsec = UTIME_OMIT }, f->st.st_mtim };
	struct stat st;
	int out, err = 0;

	out = openat(dfd, f->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0400);
	if (out == -1) {
		if (errno == ENOSPC || errno == EDQUOT)
			return no_space(-errno, req, f->src);
		return error_set(-errno, "cannot stage it to %s: creating the copy of %s: %s",
			req->stage_dir, f->src, strerror(errno));
	}
	/* Reserve the space first: a full disk fails now, not half way. */
	if (f->st.st_size > 0 && fallocate(out, 0, 0, f->st.st_size) == -1 &&
		(errno == ENOSPC || errno == EDQUOT))
		err = no_space(-errno, req, f->src);
	if (err == 0)
		err = copy_fd(req, f, out, how, buf);
	if (err == 0 && futimens(out, times) == -1)
		err = error_set(-errno, "setting the mtime of the copy of %s: %s", f->src,
			strerror(errno));
	if (err == 0 && fstat(out, &st) == 0)
		*disk += (uint64_t)st.st_blocks * 512u;
	if (close(out) == -1 && err == 0)
		err = io_error(-errno, "writing the copy of", f->src);
	return err;
}

/* The shard index of a sharded model, if it has one: 1 and *path
 * (malloc'd), 0 (none), or -errno. */
static int
shard_index_of(const char *model_path, char **path)
{
	struct stat st;
	bool is_index = false;
	char *p = NULL;
	int err;

	if (stat(model_path, &st) == -1)
		return io_error(-errno, "looking up", model_path);
	if (!S_ISDIR(st.st_mode)) {
		if (!file_has_suffix(model_path, ".json"))
			return 0;
		if ((*path = strdup(model_path)) == NULL)
			return error_set(-ENOMEM, "out of memory");
		return 1;
	}
	if ((err = shards_find_model(model_path, &p, &is_index)) < 0)
		return err;
	if (!is_index) {
		free(p);
		return 0;
	}
	*path = p;
	return 1;
}

/* Makes the list of files to copy: the source's, and its shard index. */
static int
plan_files(const struct stage_request *req, struct stage_file **out, size_t *n)
{
	struct stage_file *fs = calloc(req->nfiles + 1, sizeof(*fs));
	char *index = NULL;
	int err;

	if (fs == NULL)
		return error_set(-ENOMEM, "out of memory");
	for (size_t i = 0; i < req->nfiles; i++) {
		fs[i].in = req->files[i].fd;
		fs[i].src = req->files[i].path;
		fs[i].st = req->files[i].st;
		fs[i].name = file_basename(req->files[i].path);
	}
	*n = req->nfiles;
	if ((err = shard_index_of(req->model_path, &index)) < 0) {
		free(fs);
		return err;
	}
	if (index != NULL) {
		struct stage_file *f = &fs[(*n)++];

		f->src = index;
		f->name = file_basename(index);
		f->own_in = 1;
		if ((f->in = open(index, O_RDONLY | O_CLOEXEC | O_NOCTTY)) == -1 ||
			fstat(f->in, &f->st) == -1) {
			err = io_error(-errno, "opening", index);
			if (f->in >= 0)
				close(f->in);
			free(index);
			free(fs);
			return err;
		}
	}
	*out = fs;
	return 0;
}

static void
plan_free(struct stage_file *fs, size_t n)
{
	for (size_t i = 0; fs != NULL && i < n; i++)
		if (fs[i].own_in) {
			if (fs[i].in >= 0)
				close(fs[i].in);
			free((char *)fs[i].src);
		}
	free(fs);
}

/* stage_dir exists (made 0700 if missing) and has room for bytes. */
static int
check_room(const struct stage_request *req, uint64_t bytes)
{
	struct statvfs vfs;
	uint64_t avail, need = stage_space_needed(bytes);
	char a[32], b[32], c[32];

	if (mkdir(req->stage_dir, 0700) == -1 && errno != EEXIST)
		return error_set(-errno, "cannot stage it: stage_dir %s cannot be created: %s",
			req->stage_dir, strerror(errno));
	if (access(req->stage_dir, W_OK | X_OK) == -1)
		return error_set(-errno, "cannot stage it: stage_dir %s is not writable by "
			"wcached: %s", req->stage_dir, strerror(errno));
	if (statvfs(req->stage_dir, &vfs) == -1)
		return error_set(-errno, "cannot stage it: statvfs %s: %s", req->stage_dir,
			strerror(errno));
	avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	if (avail < need) {
		human(need, a, sizeof(a));
		human(bytes, b, sizeof(b));
		human(avail, c, sizeof(c));
		return error_set(-ENOSPC, "cannot stage it to %s: not enough space: %s needed "
			"(%s of files, 1%% and 64 MiB more), %s free", req->stage_dir, a, b, c);
	}
	return 0;
}

/* Renames the finished copy tmp to stage_dir/<model>.<number>, or with a
 * suffix -2, -3... when that name is taken; *dir gets the name. */
static int
publish(const struct stage_request *req, const char *tmp, char **dir)
{
	char name[PATH_MAX];

	for (unsigned k = 1; k <= STAGE_MAX_SUFFIX; k++) {
		int n = k == 1 ? snprintf(name, sizeof(name), "%s/%s.%" PRIu64, req->stage_dir,
					 req->model, req->number) :
				 snprintf(name, sizeof(name), "%s/%s.%" PRIu64 "-%u",
					 req->stage_dir, req->model, req->number, k);

		if (n < 0 || (size_t)n >= sizeof(name))
			return error_set(-ENAMETOOLONG, "%s: name too long", req->stage_dir);
		if (rename(tmp, name) == 0) {
			if ((*dir = strdup(name)) == NULL)
				return error_set(-ENOMEM, "out of memory");
			return 0;
		}
		if (errno != EEXIST && errno != ENOTEMPTY)
			return error_set(-errno, "cannot stage it: renaming %s to %s: %s", tmp, name,
				strerror(errno));
	}
	return error_set(-EEXIST, "cannot stage it: %s/%s.%" PRIu64 " and %u more names are "
		"taken", req->stage_dir, req->model, req->number, STAGE_MAX_SUFFIX - 1);
}

int
stage_copy(struct stage_request *req)
{
	struct stage_file *fs = NULL;
	enum copy_method how = COPY_RANGE;
	char tmp[PATH_MAX], *buf = NULL, *dir = NULL, *path = NULL;
	uint64_t bytes = 0, disk = 0;
	double start = now_seconds();
	size_t n = 0;
	int dfd = -1, err, made = 0;

	if ((err = plan_files(req, &fs, &n)) < 0 || fs == NULL)
		return err < 0 ? err : -ENOMEM;
	for (size_t i = 0; i < n; i++)
		bytes += (uint64_t)fs[i].st.st_size;
	req->bytes = bytes;
	if ((err = check_room(req, bytes)) < 0)
		goto out;
	if (snprintf(tmp, sizeof(tmp), "%s/.%s.tmp-%ld-XXXXXX", req->stage_dir, req->model,
		    (long)getpid()) >= (int)sizeof(tmp)) {
		err = error_set(-ENAMETOOLONG, "%s: name too long", req->stage_dir);
		goto out;
	}
	if (mkdtemp(tmp) == NULL) {
		err = error_set(-errno, "cannot stage it: stage_dir %s: creating a directory: %s",
			req->stage_dir, strerror(errno));
		goto out;
	}
	made = 1;
	if ((dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) == -1) {
		err = error_set(-errno, "cannot stage it: %s: %s", tmp, strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < n && err == 0; i++)
		err = copy_file(req, &fs[i], dfd, &how, &buf, &disk);
	for (size_t i = 0; i < n && err == 0; i++)
		err = check_unchanged(&fs[i]);
	if (err == 0 && (err = publish(req, tmp, &dir)) == 0 && dir == NULL)
		err = -ENOMEM;
	if (err == 0 && dir != NULL) {
		struct stat st;

		/* A directory model is the directory; else the configured file. */
		path = stat(req->model_path, &st) == 0 && S_ISDIR(st.st_mode) ?
			strdup(dir) :
			path_join(dir, file_basename(req->model_path));
		if (path == NULL) {
			err = error_set(-ENOMEM, "out of memory");
			(void)stage_remove(dir);
			free(dir);
			dir = NULL;
		}
	}
out:
	if (dfd >= 0)
		close(dfd);
	if (err < 0 && made && stage_remove(tmp) < 0)
		log_warnx("staging: %s", error_get());
	plan_free(fs, n);
	free(buf);
	if (err < 0)
		return err;
	req->dir = dir;
	req->path = path;
	req->disk_bytes = disk;
	req->seconds = now_seconds() - start;
	return 0;
}

void
stage_request_clear(struct stage_request *req)
{
	free(req->dir);
	free(req->path);
	req->dir = NULL;
	req->path = NULL;
}

int
stage_remove(const char *dir)
{
	struct dirent *e;
	DIR *d = opendir(dir);
	int err = 0;

	if (d == NULL)
		return errno == ENOENT ? 0 :
					 error_set(-errno, "removing %s: %s", dir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == -1 && errno != ENOENT && err == 0)
			err = error_set(-errno, "removing %s/%s: %s", dir, e->d_name,
				strerror(errno));
	}
	closedir(d);
	if (rmdir(dir) == -1 && errno != ENOENT && err == 0)
		err = error_set(-errno, "removing %s: %s", dir, strerror(errno));
	return err;
}

struct remove_work {
	uv_work_t work;
	char *dir;
	int err;
	char message[512];
};

static void
remove_run(uv_work_t *w)
{
	struct remove_work *rw = w->data;

	if ((rw->err = stage_remove(rw->dir)) < 0)
		snprintf(rw->message, sizeof(rw->message), "%s", error_get());
}

static void
remove_after(uv_work_t *w, int status)
{
	struct remove_work *rw = w->data;

	(void)status;
	if (rw->err < 0)
		log_warnx("staged copy not removed: %s", rw->message);
	else
		log_debug("staged copy %s removed", rw->dir);
	free(rw->dir);
	free(rw);
}

void
stage_remove_later(uv_loop_t *loop, char *dir)
{
	struct remove_work *rw;

	if (dir == NULL)
		return;
	if ((rw = calloc(1, sizeof(*rw))) != NULL) {
		rw->dir = dir;
		rw->work.data = rw;
		if (uv_queue_work(loop, &rw->work, remove_run, remove_after) == 0)
			return;
		free(rw);
	}
	if (stage_remove(dir) < 0)
		log_warnx("staged copy not removed: %s", error_get());
	free(dir);
}

int
stage_prepare_dir(const char *stage_dir, uid_t uid, gid_t gid)
{
	char *p = strdup(stage_dir);
	struct stat st;

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
	if (mkdir(stage_dir, 0700) == -1 && errno != EEXIST)
		return error_set(-errno, "stage_dir %s cannot be created: %s", stage_dir,
			strerror(errno));
	if (lstat(stage_dir, &st) == -1 || !S_ISDIR(st.st_mode))
		return error_set(-ENOTDIR, "stage_dir %s is not a directory", stage_dir);
	if (uid != (uid_t)-1 && (st.st_uid != uid || st.st_gid != gid) &&
		chown(stage_dir, uid, gid) == -1)
		return error_set(-errno, "stage_dir %s: chown: %s", stage_dir, strerror(errno));
	return 0;
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

/* Is name one stage_copy() makes: "<model>.<number>" with an optional
 * "-<k>", or a temporary ".<model>.tmp-<pid>-XXXXXX"? *own_tmp: the latter,
 * of this process. */
static bool
staged_name(const char *name, bool *own_tmp)
{
	const char *dot = strrchr(name, '.'), *tmp = strstr(name, ".tmp-");
	char pid[32];

	*own_tmp = false;
	if (name[0] == '.' && tmp != NULL && tmp != name) {
		snprintf(pid, sizeof(pid), ".tmp-%ld-", (long)getpid());
		*own_tmp = strncmp(tmp, pid, strlen(pid)) == 0;
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

int
stage_sweep(const char *stage_dir, char *const *keep, size_t nkeep, unsigned *removed)
{
	struct dirent *e;
	DIR *d = opendir(stage_dir);
	int err = 0;

	*removed = 0;
	if (d == NULL)
		return errno == ENOENT ? 0 :
					 error_set(-errno, "stage_dir %s: %s", stage_dir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		bool own_tmp, kept = false;
		char *full;
		int r;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
			!staged_name(e->d_name, &own_tmp) || own_tmp)
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == -1 ||
			!S_ISDIR(st.st_mode))
			continue;
		if ((full = path_join(stage_dir, e->d_name)) == NULL) {
			err = error_set(-ENOMEM, "out of memory");
			break;
		}
		for (size_t i = 0; i < nkeep && !kept; i++)
			kept = strcmp(keep[i], full) == 0;
		if (!kept) {
			if ((r = stage_remove(full)) < 0 && err == 0)
				err = r;
			else if (r == 0)
				(*removed)++;
		}
		free(full);
	}
	closedir(d);
	return err;
}
