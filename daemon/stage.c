/*
 * stage.c: copying a model's files to stage_dir and checking the copy
 * against its sources (see stage.h). stage_dir itself (preparing it,
 * checking it, where a path lies in it), removing copies and the sweep
 * are stage_dir.c's.
 *
 * The copy streams each file in 8 MiB requests, as the warm-up reads: with
 * copy_file_range(2), which the kernel does without a trip through user
 * space; where it refuses (across filesystems before Linux 5.3 and again
 * since 5.19, or a system call filter) with sendfile(2) into the file, and
 * last with pread/pwrite. The source's pages are dropped as they are copied
 * (POSIX_FADV_DONTNEED): the copy's pages are the ones that will serve.
 * Before each request the copy checks whether it is still wanted
 * (stage_cancel, or wcached stopping) and, about once a second, whether
 * every source is still the file it copies (check_unchanged): a source
 * another host replaces ten seconds into a twenty-minute copy stops it
 * then, not after twenty minutes of reading a version nobody serves. The
 * check after the copy stays: it is the one that vouches for the copy.
 *
 * stage_dir is opened only once checked safe (stage_check_dir), and a
 * staging that fails removes its temporary copy as any copy is removed
 * (stage_remove_at, stage_dir.c): a stop ends that removal at its next
 * file, and the next start's sweep removes the rest (discard).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
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
#include "base/file.h"
#include "base/path.h"
#include "format/shards.h"
#include "format/tree.h"
#include "fstype.h"
#include "log.h"
#include "mountrule.h"
#include "stage.h"
#include "stage_internal.h"

#define STAGE_CHUNK (8u << 20)
#define STAGE_MARGIN (64ull << 20)
#define STAGE_MAX_SUFFIX 1000
#define STAGE_MAX_INDEX (64u << 20) /* bytes of a shard index read: the shard reader's limit */
/* Seconds between two checks of the sources during a copy, at least: each
 * is an fstat and a stat of every source file, round trips to a remote
 * server, and a copy request is itself about a second from a slow one. */
#define STAGE_CHECK_INTERVAL 1.0

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
 * with strerror, so EIO and ESTALE read as such; then more, if not "". */
static int
io_error_more(int err, const char *what, const char *path, const char *more)
{
	const char *name;

	if (err >= 0)
		err = -EIO; /* an errno of 0: never, but a failure all the same */
	name = stage_errno_name(err);
	if (name != NULL)
		return error_set(err, "cannot stage it: %s %s failed: %s (%s)%s", what, path, name,
			strerror(-err), more);
	return error_set(err, "cannot stage it: %s %s failed: %s%s", what, path, strerror(-err),
		more);
}

static int
io_error(int err, const char *what, const char *path)
{
	return io_error_more(err, what, path, "");
}

/* io_error() for the source path (open as fd, or its directory's O_PATH
 * descriptor, or -1): where it lies on a network filesystem, an EIO or
 * ESTALE is most often another host's doing (the file replaced or removed
 * there, or its server failing), and the message says so; on a local one
 * it is this host's disk, and it does not. Told from fd only: a statfs(2)
 * of the path would look it up by name again, into whatever a neighbour
 * renamed or mounted there since (README, "Models in directories others
 * may write in"). */
static int
source_error(int err, const char *what, const char *path, int fd)
{
	struct fs_info fs = { .remote = false };

	if ((err == -EIO || err == -ESTALE) && fd >= 0)
		(void)fstype_of_fd(fd, &fs);
	return io_error_more(err, what, path, fs.remote ? ": the file may have been replaced "
		"or removed on another host, or its server failed" : "");
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

/* One staging's copy, carried from one request to the next. */
struct copy_run {
	const struct stage_file *fs; /* every source file of the model, n of them */
	size_t n;
	double next_check;    /* now_seconds() from which they are checked again */
	enum copy_method how; /* the method the kernel has accepted so far */
	char *buf;            /* COPY_READ's buffer, made once, or NULL */
	uint64_t disk;        /* bytes the copy occupies on disk so far */
};

/* Is err (an errno) stage_dir refusing more bytes of the copy? */
static bool
out_of_room(int err)
{
	return err == ENOSPC || err == EDQUOT || err == EFBIG;
}

/*
 * No room while writing the copy of src (err is -ENOSPC, -EDQUOT or
 * -EFBIG): says so with the free space now, or, for EFBIG, that the file
 * is past the process's file size limit (RLIMIT_FSIZE: LimitFSIZE=,
 * ulimit -f; wcached ignores SIGXFSZ so that this is an error, not its
 * end) or past the largest file stage_dir's filesystem holds.
 */
static int
no_space(int err, const struct stage_request *req, const char *src)
{
	struct statvfs vfs;
	char need[32], free_now[32];

	if (err == -EFBIG)
		return error_set(-EFBIG, "cannot stage it: %s is too large for %s (file size limit "
			"or the filesystem's maximum)", src, req->stage_dir);
	human(stage_space_needed(req->bytes), need, sizeof(need));
	if (statvfs(req->stage_dir, &vfs) == 0)
		human((uint64_t)vfs.f_bavail * vfs.f_frsize, free_now, sizeof(free_now));
	else
		snprintf(free_now, sizeof(free_now), "unknown");
	return error_set(err, "cannot stage it to %s: %s while copying %s (%s needed in all, "
		"%s left)", req->stage_dir,
		err == -EDQUOT ? "disk quota exceeded" : "no space left", src, need, free_now);
}

void
stage_cancel(struct stage_request *req)
{
	__atomic_store_n(&req->cancelled, 1, __ATOMIC_RELAXED);
}

/* -ECANCELED with the message when wcached is stopping or req is no
 * longer wanted (stage_cancel), else 0. */
static int
check_cancelled(const struct stage_request *req)
{
	if (req->cancel != NULL && __atomic_load_n(req->cancel, __ATOMIC_RELAXED))
		return error_set(-ECANCELED, "cancelled: wcached is stopping");
	if (__atomic_load_n(&req->cancelled, __ATOMIC_RELAXED))
		return error_set(-ECANCELED, "cancelled: the staging is no longer wanted (a newer "
			"load or an unload of the model)");
	return 0;
}

static int check_all_unchanged(const struct stage_file *fs, size_t n, bool during);

/*
 * Between two requests of the copy: when STAGE_CHECK_INTERVAL has passed
 * since the last check (the first comes before the first request), checks
 * that every source file of the model, copied or still to come, is
 * unchanged. A cancel that came meanwhile wins: a staging nobody wants
 * any more stops as cancelled, not as failed. 0, or -errno with the
 * message.
 */
static int
check_sources_now_and_then(const struct stage_request *req, struct copy_run *run)
{
	double now = now_seconds();
	int err = 0, cancelled;

	if (now < run->next_check)
		return 0;
	run->next_check = now + STAGE_CHECK_INTERVAL;
	err = check_all_unchanged(run->fs, run->n, true);
	if (err < 0 && (cancelled = check_cancelled(req)) < 0)
		return cancelled;
	return err;
}

/*
 * Copies size bytes of in to out from offset 0 in STAGE_CHUNK requests,
 * switching run->how down to a method the kernel accepts, and checking
 * before each request that the copy is still wanted and now and then
 * that its sources are unchanged. 0, or -errno with the message.
 */
static int
copy_fd(const struct stage_request *req, struct copy_run *run, const struct stage_file *f, int out)
{
	uint64_t size = (uint64_t)f->st.st_size;
	off_t off = 0;
	int err;

	while ((uint64_t)off < size) {
		size_t want = size - (uint64_t)off < STAGE_CHUNK ? (size_t)(size - (uint64_t)off) :
								      STAGE_CHUNK;
		ssize_t n;

		if ((err = check_cancelled(req)) < 0 ||
			(err = check_sources_now_and_then(req, run)) < 0)
			return err;
		if (run->how == COPY_RANGE) {
			off_t in_off = off, out_off = off;

			n = copy_file_range(f->in, &in_off, out, &out_off, want, 0);
			if (n == -1 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
						errno == EOPNOTSUPP || errno == EPERM)) {
				run->how = COPY_SENDFILE;
				continue;
			}
		} else if (run->how == COPY_SENDFILE) {
			off_t in_off = off;

			if (lseek(out, off, SEEK_SET) == -1)
				return io_error(-errno, "writing the copy of", f->src);
			n = sendfile(out, f->in, &in_off, want);
			if (n == -1 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
						errno == EPERM)) {
				run->how = COPY_READ;
				continue;
			}
		} else {
			if (run->buf == NULL && (run->buf = malloc(STAGE_CHUNK)) == NULL)
				return error_set(-ENOMEM, "out of memory");
			n = pread(f->in, run->buf, want, off);
			if (n == -1 && errno != EINTR)
				return source_error(-errno, "reading", f->src, f->in);
			if (n > 0) {
				for (ssize_t done = 0, w; done < n; done += w) {
					w = pwrite(out, run->buf + done, (size_t)(n - done),
						off + done);
					if (w == -1 && errno == EINTR) {
						w = 0;
						continue;
					}
					if (w == -1 && out_of_room(errno))
						return no_space(-errno, req, f->src);
					if (w <= 0)
						return io_error(w == 0 ? -EIO : -errno,
							"writing the copy of", f->src);
				}
			}
		}
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1 && out_of_room(errno))
			return no_space(-errno, req, f->src);
		if (n == -1)
			/* Either side's: copy_file_range and sendfile do not say
			 * which (a remote read's EIO or ESTALE, a local disk's). */
			return source_error(-errno, "copying", f->src, f->in);
		if (n == 0)
			return error_set(-ENODATA, "cannot stage it: %s changed during the copy: "
				"it ended at %jd bytes, not %" PRIu64 "; replace model files with "
				"rename(2), never in place", f->src, (intmax_t)off, size);
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

/* Is err (an errno) of a look at a source's path no answer about it: the
 * server's or this host's trouble (EIO or ETIMEDOUT from a soft NFS mount,
 * a FUSE server's hiccup, EINTR, no memory or descriptors for the walk),
 * not what the path names now? */
static bool
no_answer(int err)
{
	switch (err) {
	case EIO: case ETIMEDOUT: case EINTR: case EAGAIN: case ENOTCONN: case ESTALE:
	case ECONNABORTED: case ECONNRESET: case EHOSTDOWN: case EHOSTUNREACH:
	case ENETUNREACH: case ENOMEM: case EMFILE: case ENFILE:
		return true;
	default:
		return false;
	}
}

/*
 * Is f's source still the file it was when it was opened: the same size,
 * mtime and ctime (file_ctime_moved, base/file.h), and still the inode its
 * path names? 0, or -ESTALE saying how not.
 * The path is looked at by mountrule's judged walk (mountrule_stat, in the
 * run w), never stat(2) by name: a neighbour who renames his link to his
 * FUSE mount over it, or mounts on its directory, would hold this thread
 * on a server that never answers, and a stop with it. Where the walk
 * refuses (EXDEV: the path leads into a user's FUSE mount now) the source
 * was replaced, and the message says the walk's why. Only that, ENOENT or
 * ENOTDIR says what the path names now without an error of its own; a look
 * failing with no answer (no_answer: EIO or ETIMEDOUT from a soft NFS
 * mount, a FUSE server's hiccup, EINTR) says nothing. During the copy
 * (about once a second, so that one flaky answer in a long copy is nearly
 * certain) no answer lets the copy go on; any other failure (a link loop,
 * EACCES: the path no longer reaches the file) fails it, and the check
 * after the copy, which vouches for it, fails on any, naming the error.
 */
static int
check_unchanged(struct mountrule_walk *w, const struct stage_file *f, bool during)
{
	char why[MOUNTRULE_WHY];
	struct stat now;
	int e;

	if (fstat(f->in, &now) == -1) {
		if (!during)
			return source_error(-errno, "checking", f->src, f->in);
	} else if (now.st_size != f->st.st_size) {
		return error_set(-ESTALE, "cannot stage it: %s changed during the copy (%jd "
			"bytes, then %jd); replace model files with rename(2), never in place",
			f->src, (intmax_t)f->st.st_size, (intmax_t)now.st_size);
	} else if (!same_mtime(&now, &f->st)) {
		return error_set(-ESTALE, "cannot stage it: %s changed during the copy (its "
			"mtime moved); replace model files with rename(2), never in place",
			f->src);
	} else if (file_ctime_moved(&f->st, &now)) {
		return error_set(-ESTALE, "cannot stage it: %s changed during the copy (its "
			"ctime moved: written in place, its mtime put back); replace model files "
			"with rename(2), never in place", f->src);
	}
	why[0] = '\0';
	if (mountrule_stat(w, f->src, &now, why, sizeof(why)) == -1) {
		e = errno;
		if (e == EXDEV)
			return error_set(-ESTALE, "cannot stage it: %s was replaced during the "
				"copy: %s", f->src, why[0] != '\0' ? why : strerror(e));
		if (e == ENOENT || e == ENOTDIR)
			return error_set(-ESTALE, "cannot stage it: %s was removed during the copy",
				f->src);
		return during && no_answer(e) ? 0 : source_error(-e, "checking", f->src, f->in);
	}
	if (now.st_dev != f->st.st_dev || now.st_ino != f->st.st_ino)
		return error_set(-ESTALE, "cannot stage it: %s was replaced during the copy; "
			"the new file is staged by the next load", f->src);
	return 0;
}

/* check_unchanged() of each of the n files fs, in one run of walks (the
 * mount table read once, a directory's files walked to once): 0, or the
 * first failure. */
static int
check_all_unchanged(const struct stage_file *fs, size_t n, bool during)
{
	struct mountrule_walk w;
	int err = 0;

	mountrule_walk_init(&w);
	for (size_t i = 0; i < n && err == 0; i++)
		err = check_unchanged(&w, &fs[i], during);
	mountrule_walk_end(&w);
	return err;
}

/* Copies f into the directory dfd as f->name, keeping its mtime; adds the
 * bytes on disk to run->disk. */
static int
copy_file(const struct stage_request *req, struct copy_run *run, const struct stage_file *f,
	int dfd)
{
	struct timespec times[2] = { { .tv_nsec = UTIME_OMIT }, f->st.st_mtim };
	struct stat st;
	int out, err = 0;

	out = openat(dfd, f->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0400);
	if (out == -1) {
		if (out_of_room(errno))
			return no_space(-errno, req, f->src);
		return error_set(-errno, "cannot stage it to %s: creating the copy of %s: %s",
			req->stage_dir, f->src, strerror(errno));
	}
	/* Reserve the space first: a full disk, or a file past the size
	 * limit, fails now, not half way. */
	if (f->st.st_size > 0 && fallocate(out, 0, 0, f->st.st_size) == -1 && out_of_room(errno))
		err = no_space(-errno, req, f->src);
	if (err == 0)
		err = copy_fd(req, run, f, out);
	if (err == 0 && futimens(out, times) == -1)
		err = error_set(-errno, "cannot stage it: setting the mtime of the copy of %s: %s",
			f->src, strerror(errno));
	if (err == 0 && fstat(out, &st) == 0)
		run->disk += (uint64_t)st.st_blocks * 512u;
	if (close(out) == -1 && err == 0)
		err = io_error(-errno, "writing the copy of", f->src);
	return err;
}

/*
 * The shard index of a sharded model, if it has one: 1, *path (malloc'd)
 * and *fd, an O_PATH descriptor of it (the caller's); 0 (none); or -errno
 * with the message. *is_dir: model_path is a directory (the one look at it
 * a staging makes). model_path is walked by mountrule's judged walk, in
 * the run w (a user's FUSE mount met on the way refused, EXDEV, with the
 * walk's why), never looked up by name: a neighbour who renamed his link to
 * his FUSE mount onto it, or mounted on its directory, since the load
 * opened it, would hold this thread on a server that never answers. A
 * directory is listed from the walk's descriptor (shards_find_model_at),
 * and its index reached from it: the name itself (openat, no link
 * followed), or, where it is a link (a hub snapshot's), the judged walk of
 * its path.
 */
static int
shard_index_of(struct mountrule_walk *w, const char *model_path, char **path, int *fd,
	bool *is_dir)
{
	char why[MOUNTRULE_WHY] = "";
	struct stat st;
	bool is_index = false;
	char *p = NULL;
	int dfd, ifd, err;

	if ((dfd = mountrule_open(w, model_path, why, sizeof(why))) < 0) {
		if (dfd == -EXDEV)
			return error_set(-EXDEV, "cannot stage it: %s", why[0] != '\0' ? why :
				strerror(EXDEV));
		return source_error(dfd, "looking up", model_path, -1);
	}
	if (fstat(dfd, &st) == -1) {
		err = source_error(-errno, "looking up", model_path, dfd);
		close(dfd);
		return err;
	}
	*is_dir = S_ISDIR(st.st_mode);
	if (!S_ISDIR(st.st_mode)) {
		if (!file_has_suffix(model_path, ".json")) {
			close(dfd);
			return 0;
		}
		if ((*path = strdup(model_path)) == NULL) {
			close(dfd);
			return error_set(-ENOMEM, "out of memory");
		}
		*fd = dfd;
		return 1;
	}
	if ((err = shards_find_model_at(dfd, model_path, &p, &is_index)) < 0 || !is_index) {
		if (err < 0)
			error_prefix("cannot stage it");
		close(dfd);
		free(p);
		return err;
	}
	/* The name in the directory walked to, no link followed, no mount
	 * crossed (neither asks a server); a link (a hub snapshot's index),
	 * a mount on the name, or a kernel with no openat2: the judged walk
	 * of its path. */
	ifd = tree_openat2(dfd, file_basename(p), O_PATH | O_CLOEXEC, RESOLVE_BENEATH |
		RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
	if (ifd == -1 && (errno == ELOOP || errno == EXDEV || errno == ENOSYS ||
				 errno == EPERM))
		ifd = mountrule_open(w, p, why, sizeof(why));
	else if (ifd == -1)
		ifd = -errno;
	if (ifd == -EXDEV)
		err = error_set(-EXDEV, "cannot stage it: %s", why[0] != '\0' ? why :
			strerror(EXDEV));
	else if (ifd < 0)
		err = source_error(ifd, "opening", p, dfd);
	close(dfd);
	if (err < 0) {
		if (ifd >= 0)
			close(ifd);
		free(p);
		return err;
	}
	*path = p;
	*fd = ifd;
	return 1;
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

/*
 * Does the shard index f (open) name exactly the shards the model was
 * validated with, req->files, in its order (the order of the index the
 * reader validated)? It is found and opened again by path here, after the
 * validation: one replaced since would be copied beside shards it does not
 * describe, a mix of two versions no operator published. 0, or -ESTALE
 * with the message.
 */
static int
check_index_names(const struct stage_request *req, const struct stage_file *f)
{
	struct shard_map m = { 0 };
	uint8_t *json = NULL;
	bool same;

	if (file_read_exact(f->in, f->src, "shard index", 0, (uint64_t)f->st.st_size, 1,
		    STAGE_MAX_INDEX, &json) < 0 ||
		shards_parse_index(f->src, (const char *)json, (size_t)f->st.st_size, &m) < 0) {
		char why[ERROR_MAX];

		snprintf(why, sizeof(why), "%s", error_get());
		free(json);
		return error_set(-ESTALE, "cannot stage it: the shard index %s changed since the "
			"model was validated: %s; the new version is staged by the next load",
			f->src, why);
	}
	same = m.nshards == req->nfiles;
	for (size_t i = 0; same && i < m.nshards; i++)
		same = strcmp(m.shards[i], file_basename(req->files[i].path)) == 0;
	shard_map_free(&m);
	free(json);
	if (!same)
		return error_set(-ESTALE, "cannot stage it: the shard index %s was replaced since "
			"the model was validated (it names other shards than the %zu opened); the "
			"new version is staged by the next load", f->src, req->nfiles);
	return 0;
}

/* The index f, found again by path, is the file validated (req->index_st):
 * the same inode, unchanged; one put at its path since (by whoever may
 * write there), even naming the same shards, is not the file the owner
 * rules judged (review rev195 L4). 0, or -ESTALE saying so. */
static int
check_index_validated(const struct stage_request *req, const struct stage_file *f)
{
	const struct stat *v = req->index_st;

	if (v == NULL)
		return error_set(-ESTALE, "cannot stage it: %s has a shard index %s since the "
			"model was validated (it had none); the new version is staged by the "
			"next load", req->model_path, f->src);
	if (v->st_dev != f->st.st_dev || v->st_ino != f->st.st_ino ||
		v->st_size != f->st.st_size || !same_mtime(v, &f->st) ||
		file_ctime_moved(v, &f->st))
		return error_set(-ESTALE, "cannot stage it: the shard index %s was replaced "
			"since the model was validated (it is not the file validated); the new "
			"version is staged by the next load", f->src);
	return 0;
}

/* Makes the list of files to copy: the source's, and its shard index;
 * *is_dir: the model is a directory (its path in the copy is the copy). */
static int
plan_files(const struct stage_request *req, struct stage_file **out, size_t *n, bool *is_dir)
{
	struct stage_file *fs = calloc(req->nfiles + 1, sizeof(*fs));
	struct mountrule_walk w;
	char *index = NULL;
	int err, ifd = -1;

	if (fs == NULL)
		return error_set(-ENOMEM, "out of memory");
	for (size_t i = 0; i < req->nfiles; i++) {
		fs[i].in = req->files[i].fd;
		fs[i].src = req->files[i].path;
		fs[i].st = req->files[i].st;
		fs[i].name = file_basename(req->files[i].path);
	}
	*n = req->nfiles;
	mountrule_walk_init(&w);
	err = shard_index_of(&w, req->model_path, &index, &ifd, is_dir);
	mountrule_walk_end(&w);
	if (err < 0) {
		free(fs);
		return err;
	}
	if (index != NULL) {
		struct stage_file *f = &fs[(*n)++];

		f->src = index;
		f->name = file_basename(index);
		f->own_in = 1;
		f->in = -1;
		/* Opened from the walk's descriptor (no lookup by name), and
		 * only once it is a regular file: whoever owns the directory
		 * may have put a FIFO there since the model was validated;
		 * opening it must not hold this thread (and a stop) until
		 * someone writes to it. */
		if (fstat(ifd, &f->st) == -1) {
			err = source_error(-errno, "opening", index, ifd);
		} else if (!S_ISREG(f->st.st_mode)) {
			err = error_set(-ESTALE, "cannot stage it: the shard index %s changed "
				"since the model was validated: not a regular file; the new "
				"version is staged by the next load", index);
		} else if ((f->in = fd_reopen_read_only(ifd, index)) < 0) {
			err = source_error(f->in, "opening", index, ifd);
			f->in = -1;
		} else if (fstat(f->in, &f->st) == -1) {
			err = source_error(-errno, "opening", index, f->in);
		} else if ((err = check_index_validated(req, f)) == 0) {
			err = check_index_names(req, f);
		}
		close(ifd);
	} else if (req->nfiles > 1) {
		err = error_set(-ESTALE, "cannot stage it: %s has no shard index since the model "
			"was validated; the new version is staged by the next load",
			req->model_path);
	}
	if (err < 0) {
		plan_free(fs, *n);
		return err;
	}
	*out = fs;
	return 0;
}

/* stage_dir exists (made 0700 if missing), is safe (stage_check_dir) and
 * has room for bytes: 0 and *sfd, the directory open. */
static int
check_room(const struct stage_request *req, uint64_t bytes, int *sfd)
{
	struct statvfs vfs;
	uint64_t avail, need = stage_space_needed(bytes);
	char a[32], b[32], c[32];
	int fd = -1, err;

	/* Nothing made or looked up on a remote one (review rev221 M3). */
	if ((err = stage_dir_check_local(req->stage_dir)) < 0) {
		error_prefix("cannot stage it");
		return err;
	}
	if (mkdir(req->stage_dir, 0700) == -1 && errno != EEXIST)
		return error_set(-errno, "cannot stage it: stage_dir %s cannot be created: %s",
			req->stage_dir, strerror(errno));
	if ((err = stage_open_dir(req->stage_dir, &fd)) < 0) {
		error_prefix("cannot stage it");
		return err;
	}
	if (access(req->stage_dir, W_OK | X_OK) == -1) {
		err = error_set(-errno, "cannot stage it: stage_dir %s is not writable by "
			"wcached: %s", req->stage_dir, strerror(errno));
		close(fd);
		return err;
	}
	if (statvfs(req->stage_dir, &vfs) == -1) {
		err = error_set(-errno, "cannot stage it: statvfs %s: %s", req->stage_dir,
			strerror(errno));
		close(fd);
		return err;
	}
	avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	if (avail < need) {
		human(need, a, sizeof(a));
		human(bytes, b, sizeof(b));
		human(avail, c, sizeof(c));
		close(fd);
		return error_set(-ENOSPC, "cannot stage it to %s: not enough space: %s needed "
			"(%s of files, 1%% and 64 MiB more), %s free", req->stage_dir, a, b, c);
	}
	*sfd = fd;
	return 0;
}

/*
 * Writes STAGE_MARKER into the new copy dfd, first of all: what tells the
 * sweep and stage_remove() that wcached made it. *marked once it exists
 * (even if writing its line failed: it is a file of ours all the same).
 */
static int
write_marker(const struct stage_request *req, int dfd, int *marked)
{
	char line[256];
	int fd = openat(dfd, STAGE_MARKER, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		0400), n, err = 0;

	if (fd == -1) {
		if (out_of_room(errno))
			return no_space(-errno, req, STAGE_MARKER);
		return error_set(-errno, "cannot stage it to %s: creating %s: %s", req->stage_dir,
			STAGE_MARKER, strerror(errno));
	}
	*marked = 1;
	n = snprintf(line, sizeof(line), "a copy wcached (pid %ld) staged of model \"%.128s\", "
		"generation %" PRIu64 "\n", (long)getpid(), req->model, req->number);
	if ((err = fd_write_all(fd, line, (size_t)n)) < 0)
		err = error_set(err, "cannot stage it to %s: writing %s: %s", req->stage_dir,
			STAGE_MARKER, strerror(-err));
	close(fd);
	return err;
}

/* Renames the finished copy tmp (an entry of sfd, stage_dir) to
 * <model>.<number>, or with a suffix -2, -3... when that name is taken;
 * *dir gets its path. Never over an existing entry (RENAME_NOREPLACE,
 * else a rename that refuses a directory that is not empty). */
static int
publish(const struct stage_request *req, int sfd, const char *tmp, char **dir)
{
	char name[NAME_MAX + 1];

	for (unsigned k = 1; k <= STAGE_MAX_SUFFIX; k++) {
		int r;

		if (k == 1)
			snprintf(name, sizeof(name), "%s.%" PRIu64, req->model, req->number);
		else
			snprintf(name, sizeof(name), "%s.%" PRIu64 "-%u", req->model, req->number,
				k);
		r = renameat2(sfd, tmp, sfd, name, RENAME_NOREPLACE);
		if (r == -1 && (errno == EINVAL || errno == ENOSYS))
			r = renameat(sfd, tmp, sfd, name);
		if (r == 0) {
			if ((*dir = path_join(req->stage_dir, name)) == NULL)
				return error_set(-ENOMEM, "out of memory");
			return 0;
		}
		if (errno != EEXIST && errno != ENOTEMPTY)
			return error_set(-errno, "cannot stage it: renaming %s/%s to %s: %s",
				req->stage_dir, tmp, name, strerror(errno));
	}
	return error_set(-EEXIST, "cannot stage it: %s/%s.%" PRIu64 " and %u more names are "
		"taken", req->stage_dir, req->model, req->number, STAGE_MAX_SUFFIX - 1);
}

/*
 * Removes stage_copy()'s unfinished copy tmp (an entry of sfd): as any
 * copy once marked, else the empty directory it still is. A stop
 * (req->cancel) ends that removal at its next file, as it ends the
 * removal of any other copy (stage_remove_until_stop): a stop that
 * cancels a long staging must not wait for the unlink of every shard
 * copied (libuv's loop ends only once its work queue has). The copy keeps
 * its marker, and its name carries this process's token, so that to the
 * next start it is another process's temporary, which its sweep removes.
 * A staging cancelled while wcached runs on (stage_cancel: an unload, a
 * newer load) is removed whole, unless a stop comes during the removal.
 */
static void
discard(const struct stage_request *req, int sfd, const char *tmp, int marked)
{
	const char *why = NULL;
	char failure[ERROR_MAX];
	int r = 0;

	/* The staging's own failure is what its caller reports: a removal
	 * that fails too is logged here, and must not take its place. */
	snprintf(failure, sizeof(failure), "%s", error_get());

	if (marked)
		r = stage_remove_at(sfd, req->stage_dir, tmp, req->cancel, &why);
	else if (unlinkat(sfd, tmp, AT_REMOVEDIR) == -1 && errno != ENOENT)
		r = error_set(-errno, "removing %s/%s: %s", req->stage_dir, tmp, strerror(errno));
	if (r == -ECANCELED)
		log_info("staging: unfinished copy %s/%s: its removal stopped as wcached stops: "
			 "the next start removes what is left", req->stage_dir, tmp);
	else if (r < 0)
		log_warnx("staging: %s", error_get());
	else if (r == STAGE_NOT_OURS)
		log_warnx("staging: %s/%s, being staged, is no longer wcached's (%s): left alone",
			req->stage_dir, tmp, why);
	error_format("%s", failure);
}

/* The longest path a copy of req's files can have, temporary names
 * included, fits in PATH_MAX; else -ENAMETOOLONG naming the model. */
static int
check_path_lengths(const struct stage_request *req, const struct stage_file *fs, size_t n)
{
	/* "/.<model>.tmp-<token>-XXXXXX/" and the longest entry in it */
	size_t longest = strlen(STAGE_MARKER), len;

	for (size_t i = 0; i < n; i++)
		if (strlen(fs[i].name) > longest)
			longest = strlen(fs[i].name);
	/* ".<model>.tmp-<token>-XXXXXX" and "<model>.<number>-<k>" are names
	 * (20: the token's 16 digits, or the suffix's) */
	if (strlen(req->model) + sizeof("..tmp--XXXXXX") + 20 > NAME_MAX)
		return error_set(-ENAMETOOLONG, "cannot stage it: the model name \"%.64s...\" (%zu "
			"bytes) is too long to name its copy in %s", req->model, strlen(req->model),
			req->stage_dir);
	len = strlen(req->stage_dir) + 2 + strlen(req->model) + sizeof(".tmp--XXXXXX") + 20 +
		longest;
	if (len >= PATH_MAX)
		return error_set(-ENAMETOOLONG, "cannot stage it: the paths of its copy would be "
			"longer than %d bytes (model name \"%s\" %zu bytes, the longest file name "
			"%zu, stage_dir %zu): configure a shorter stage_dir than %s", PATH_MAX - 1,
			req->model, strlen(req->model), longest, strlen(req->stage_dir),
			req->stage_dir);
	return 0;
}

int
stage_copy(struct stage_request *req)
{
	struct stage_file *fs = NULL;
	struct copy_run run = { .how = COPY_RANGE };
	char tmp[PATH_MAX], *dir = NULL, *path = NULL;
	const char *tmpname = NULL;
	uint64_t bytes = 0;
	double start = now_seconds();
	size_t n = 0;
	bool is_dir = false;
	int sfd = -1, dfd = -1, err, marked = 0;

	/* A staging no longer wanted looks at nothing: plan_files stats the
	 * model's path and opens its shard index, round trips a hung server
	 * holds on one of its filesystem's places on the work queue. */
	if ((err = check_cancelled(req)) < 0)
		return err;
	if ((err = plan_files(req, &fs, &n, &is_dir)) < 0 || fs == NULL)
		return err < 0 ? err : -ENOMEM;
	run.fs = fs;
	run.n = n;
	for (size_t i = 0; i < n; i++)
		bytes += (uint64_t)fs[i].st.st_size;
	req->bytes = bytes;
	if ((err = check_cancelled(req)) < 0 || (err = check_path_lengths(req, fs, n)) < 0 ||
		(err = check_room(req, bytes, &sfd)) < 0)
		goto out;
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp-%s-XXXXXX", req->stage_dir, req->model,
		stage_token());
	if (mkdtemp(tmp) == NULL) {
		err = error_set(-errno, "cannot stage it: stage_dir %s: creating a directory: %s",
			req->stage_dir, strerror(errno));
		goto out;
	}
	tmpname = file_basename(tmp);
	if ((dfd = openat(sfd, tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) == -1) {
		err = error_set(-errno, "cannot stage it: %s: %s", tmp, strerror(errno));
		goto out;
	}
	err = write_marker(req, dfd, &marked);
	for (size_t i = 0; i < n && err == 0; i++)
		err = copy_file(req, &run, &fs[i], dfd);
	if (err == 0)
		err = check_all_unchanged(fs, n, false);
	if (err == 0)
		err = check_cancelled(req);
	if (err == 0 && (err = publish(req, sfd, tmpname, &dir)) == 0 && dir == NULL)
		err = -ENOMEM;
	if (err == 0 && dir != NULL) {
		/* A directory model is the directory; else the configured file.
		 * As plan_files found it: a stat now, after a copy that may
		 * have taken twenty minutes, may fail (EIO, ETIMEDOUT from a
		 * remote server) and would name dir/<directory's name>, which
		 * fails the copy's validation and throws it away. */
		path = is_dir ? strdup(dir) : path_join(dir, file_basename(req->model_path));
		if (path == NULL) {
			/* Removed before the message is set, which the removal's
			 * own would replace; a stop ends it as any removal. */
			(void)stage_remove_until_stop(dir, req->cancel);
			err = error_set(-ENOMEM, "out of memory");
			free(dir);
			dir = NULL;
		}
	}
out:
	if (dfd >= 0)
		close(dfd);
	if (err < 0 && tmpname != NULL && dir == NULL)
		discard(req, sfd, tmpname, marked);
	if (sfd >= 0)
		close(sfd);
	plan_free(fs, n);
	free(run.buf);
	if (err < 0)
		return err;
	req->dir = dir;
	req->path = path;
	req->disk_bytes = run.disk;
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
