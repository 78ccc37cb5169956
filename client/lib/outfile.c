/*
 * outfile.c: the buffered output file of outfile.h, which nobody ever sees
 * partial: a temporary file beside the output path, fsync'd and renamed
 * over it once complete, or a descriptor the caller owns.
 *
 * How a file appears whole (a temporary name in the same directory, fsync
 * before rename, the directory fsync'd after) is kept apart from what the
 * file holds: the writers lay out WEIG and safetensors files and never see
 * a temporary name, and this file never sees a model. Data goes from the
 * caller's memory to the file in large writes; a conversion (the byte swap
 * of a big-endian file) happens through the buffer, with the function the
 * caller passes.
 *
 * Replacing a file keeps what writing it in place would keep: a symlink
 * stays a symlink (the file it points at is replaced, as in a Hugging Face
 * cache's snapshots/ -> blobs/), and the replaced file's mode and, where
 * the user may give them, its owner and group go to the new file. A new
 * file gets what open(O_CREAT, 0666) gives: 0666 minus the umask (and a
 * default ACL), which is why the temporary is made with open(), not
 * mkostemp() (always 0600, and reading the umask is not thread-safe).
 *
 * A path that is not a regular file (a FIFO, /dev/null, a terminal,
 * /dev/stdout) is written into as it is, as a shell's redirection would,
 * with nothing to rename: renaming a file over it would replace it (and
 * root may create files in /dev, so /dev/null would become one). So is
 * this process's standard output named by a path (/dev/stdout,
 * /proc/self/fd/1) when a shell redirected it to a regular file: through
 * that descriptor, its offset and O_APPEND kept ('>>' appends); renamed
 * over, the file the shell opened would be replaced, what '>>' appended
 * to lost.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "lib/outfile.h"

#define OUTFILE_BUFFER_SIZE (1u << 20) /* multiple of 8: converted chunks fit whole */
/* One write(2) at most: wcachectl convert's progress line reads the bytes
 * written from /proc/self/io, which counts a write when it returns, so a
 * GiB at a time showed 0% for the first GiB; 64 MiB moves it, and a 2.5 GiB
 * convert took as long (commit message of this line). */
#define OUTFILE_MAX_WRITE (1u << 26)
#define OUTFILE_MAX_LINKS 40           /* symlinks followed, as the kernel's ELOOP */
#define OUTFILE_TRIES 100              /* temporary names tried */
#define OUTFILE_LIVE_SLOTS 8           /* temporaries outfile_remove_temporaries() knows */

/*
 * The temporary files now being written, for outfile_remove_temporaries()
 * in a signal handler, which may neither lock nor follow a pointer that
 * another thread frees: fixed buffers, each with a state taken and
 * changed atomically. LIVE_FREE: the slot is unused; LIVE_FILLING: a
 * thread is copying a name into it; LIVE_NAMED: the name is a temporary
 * file to unlink. A slot is named only after the file was created (an
 * O_EXCL failure names another's file), with signals blocked from the
 * creation on (outfile_block_signals()), and freed only after the file is
 * renamed or unlinked (a signal in between unlinks a name already gone).
 */
enum { LIVE_FREE, LIVE_FILLING, LIVE_NAMED };
static int outfile_live_state[OUTFILE_LIVE_SLOTS];
static char outfile_live_path[OUTFILE_LIVE_SLOTS][PATH_MAX];

/* Names o's temporary file in a free slot (o->live is 1 + its number), if
 * one is free and the name fits; else o->live stays 0 and the file is not
 * known. */
static void
outfile_live_add(struct outfile *o)
{
	size_t len = strlen(o->tmp);

	o->live = 0;
	if (len >= PATH_MAX)
		return;
	for (int i = 0; i < OUTFILE_LIVE_SLOTS; i++) {
		int expected = LIVE_FREE;

		if (__atomic_compare_exchange_n(&outfile_live_state[i], &expected, LIVE_FILLING,
			0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
			memcpy(outfile_live_path[i], o->tmp, len + 1);
			__atomic_store_n(&outfile_live_state[i], LIVE_NAMED, __ATOMIC_RELEASE);
			o->live = i + 1;
			return;
		}
	}
}

/* Frees o's slot: its temporary file is renamed or unlinked. */
static void
outfile_live_remove(struct outfile *o)
{
	if (o->live <= 0 || o->live > OUTFILE_LIVE_SLOTS)
		return;
	__atomic_store_n(&outfile_live_state[o->live - 1], LIVE_FREE, __ATOMIC_RELEASE);
	o->live = 0;
}

/*
 * Blocks in this thread, until the caller restores *old, the signals that
 * arrive from outside (a terminal's Ctrl-C, a kill): between the creation of
 * a temporary file and its slot, a handler that removes the temporaries and
 * ends the process would leave the file behind. The signals a fault raises
 * stay open (blocked, they would kill at once).
 */
static void
outfile_block_signals(sigset_t *old)
{
	static const int faults[] = { SIGBUS, SIGFPE, SIGILL, SIGSEGV, SIGTRAP, SIGSYS };
	sigset_t all;

	sigfillset(&all);
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		sigdelset(&all, faults[i]);
	(void)pthread_sigmask(SIG_BLOCK, &all, old);
}

void
outfile_remove_temporaries(void)
{
	for (int i = 0; i < OUTFILE_LIVE_SLOTS; i++)
		if (__atomic_load_n(&outfile_live_state[i], __ATOMIC_ACQUIRE) == LIVE_NAMED)
			(void)unlink(outfile_live_path[i]);
}

/*
 * The path the rename must replace for path, malloc'd in *out: path with
 * every symlink followed (realpath), so a link stays a link. A link to a
 * file not there yet (realpath's ENOENT) is followed by hand to where that
 * file goes; a path that is no link and not there yet (a new file, or a
 * missing directory that the open will report) is used as it is.
 */
static int
outfile_resolve(const char *path, char **out)
{
	char *cur = strdup(path), *next;
	char link[4096];
	struct stat sb;

	for (int hops = 0; cur != NULL; hops++) {
		const char *slash;
		ssize_t n;

		if ((next = realpath(cur, NULL)) != NULL) {
			free(cur);
			*out = next;
			return 0;
		}
		if (lstat(cur, &sb) < 0 || !S_ISLNK(sb.st_mode)) {
			*out = cur;
			return 0;
		}
		if (hops == OUTFILE_MAX_LINKS) {
			free(cur);
			return error_set(-ELOOP, "%s: too many levels of symbolic links", path);
		}
		n = readlink(cur, link, sizeof(link));
		if (n < 0 || (size_t)n == sizeof(link)) {
			int e = n < 0 ? errno : ENAMETOOLONG;

			free(cur);
			return error_set(-e, "%s: readlink: %s", path, strerror(e));
		}
		slash = strrchr(cur, '/');
		if (link[0] == '/' || slash == NULL) {
			if (asprintf(&next, "%.*s", (int)n, link) < 0)
				next = NULL;
		} else if (asprintf(&next, "%.*s/%.*s", (int)(slash - cur), cur, (int)n,
			link) < 0) {
			next = NULL;
		}
		free(cur);
		cur = next;
	}
	return error_set(-ENOMEM, "%s: out of memory", path);
}

/* Puts a fresh random suffix in place of the six X that end name. */
static void
outfile_randomize(char *name)
{
	static const char chars[] =
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	char *x = name + strlen(name) - 6;
	uint64_t v;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		v = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)getpid() << 32 ^
			(uint64_t)(uintptr_t)name;
	}
	for (int i = 0; i < 6; i++, v /= sizeof(chars) - 1)
		x[i] = chars[v % (sizeof(chars) - 1)];
}

/*
 * Gives the temporary file fd the permission bits of the regular file
 * target it will replace, and its owner and group where this user may
 * (EPERM is no error: then the group alone, which a member of it may
 * give). Set-id and sticky bits are not kept: a write in place clears
 * set-id bits too, and a set-id file of another owner's must not become
 * one with this writer's bytes. A target not there (or not a regular file)
 * leaves open()'s mode alone; a directory is -EISDIR, before anything is
 * written. 0, or -errno with the message, which names path (the output as
 * given) and the call that failed.
 */
static int
outfile_take_over(int fd, const char *target, const char *path)
{
	static const char why[] = "giving the new file the owner and mode of the one it replaces";
	struct stat old, now;

	if (stat(target, &old) < 0)
		return 0;
	if (S_ISDIR(old.st_mode)) /* the rename would fail after the whole write */
		return error_set(-EISDIR, "%s: %s", path, strerror(EISDIR));
	if (!S_ISREG(old.st_mode))
		return 0;
	if (fstat(fd, &now) < 0)
		return error_set(-errno, "%s: %s: fstat: %s", path, why, strerror(errno));
	if ((now.st_uid != old.st_uid || now.st_gid != old.st_gid) &&
	    fchown(fd, old.st_uid, old.st_gid) < 0) {
		if (errno != EPERM)
			return error_set(-errno, "%s: %s: fchown: %s", path, why,
				strerror(errno));
		if (now.st_gid != old.st_gid && fchown(fd, (uid_t)-1, old.st_gid) < 0 &&
		    errno != EPERM)
			return error_set(-errno, "%s: %s: fchown: %s", path, why,
				strerror(errno));
	}
	if (fchmod(fd, old.st_mode & 0777) < 0)
		return error_set(-errno, "%s: %s: fchmod: %s", path, why, strerror(errno));
	return 0;
}

int
outfile_is_stdout(const struct stat *st)
{
	struct stat out;

	return fstat(STDOUT_FILENO, &out) == 0 && out.st_dev == st->st_dev &&
		out.st_ino == st->st_ino;
}

/*
 * Opens target (the path as given), which stat() found to be neither a
 * regular file nor a directory, to write into it (outfile_begin()). A FIFO's open waits for a
 * reader, as a shell's redirection does. 0 or a negative errno with the
 * message.
 */
static int
outfile_open_special(struct outfile *o)
{
	struct stat st;

	if ((o->fd = open(o->target, O_WRONLY | O_CLOEXEC | O_NOCTTY)) < 0)
		return error_set(-errno, "%s: %s", o->path, strerror(errno));
	/* What was opened is what stat() saw: not a file to write in place. */
	if (fstat(o->fd, &st) < 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
		return error_set(-ESTALE, "%s: changed while it was opened", o->path);
	return 0;
}

int
outfile_begin(const char *path, struct outfile *o)
{
	struct stat st;
	const char *slash = strrchr(path, '/');
	const char *base = slash != NULL ? slash + 1 : path;
	sigset_t mask;
	int e, rc;

	memset(o, 0, sizeof(*o));
	o->path = path;
	o->fd = -1;
	if (*base == '\0')
		return error_set(-EISDIR, "%s: output path names a directory", path);
	/* stat() follows every link, /proc/self/fd/N's to a pipe too (which
	 * outfile_resolve(), reading links as paths, cannot). */
	if (stat(path, &st) == 0 && ((!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) ||
		(S_ISREG(st.st_mode) && outfile_is_stdout(&st)))) {
		if ((o->target = strdup(path)) == NULL)
			return error_set(-ENOMEM, "%s: out of memory", path);
		if (!S_ISREG(st.st_mode))
			rc = outfile_open_special(o);
		else if ((o->fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0)) < 0)
			rc = error_set(-errno, "%s: %s", path, strerror(errno));
		else
			rc = 0;
		if (rc == 0 && (o->buf = malloc(OUTFILE_BUFFER_SIZE)) == NULL)
			rc = error_set(-ENOMEM, "%s: out of memory", path);
		if (rc < 0)
			outfile_abort(o);
		return rc;
	}
	if ((rc = outfile_resolve(path, &o->target)) < 0) {
		o->target = NULL;
		return rc;
	}
	slash = strrchr(o->target, '/');
	base = slash != NULL ? slash + 1 : o->target;
	/* Keep the temporary name within NAME_MAX whatever the base's length. */
	if (asprintf(&o->tmp, "%.*s.%.200s.XXXXXX", (int)(base - o->target), o->target,
		base) < 0) {
		o->tmp = NULL;
		free(o->target);
		o->target = NULL;
		return error_set(-ENOMEM, "%s: out of memory", path);
	}
	e = EEXIST;
	outfile_block_signals(&mask);
	/* EINTR (a signal during an open on a network or FUSE file system):
	 * nothing was created under that name; another is tried. */
	for (int i = 0; i < OUTFILE_TRIES && (e == EEXIST || e == EINTR); i++) {
		outfile_randomize(o->tmp);
		o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		e = o->fd < 0 ? errno : 0;
	}
	if (o->fd >= 0)
		outfile_live_add(o);
	(void)pthread_sigmask(SIG_SETMASK, &mask, NULL);
	if (o->fd < 0) {
		free(o->tmp);
		free(o->target);
		o->tmp = NULL;
		o->target = NULL;
		return error_set(-e, "%s: cannot create a temporary file beside it: %s", path,
			strerror(e));
	}
	if ((rc = outfile_take_over(o->fd, o->target, path)) == 0 &&
		(o->buf = malloc(OUTFILE_BUFFER_SIZE)) == NULL)
		rc = error_set(-ENOMEM, "%s: out of memory", path);
	if (rc == 0)
		return 0;
	close(o->fd);
	unlink(o->tmp);
	outfile_live_remove(o);
	free(o->tmp);
	free(o->target);
	o->tmp = NULL;
	o->target = NULL;
	o->fd = -1;
	return rc;
}

void
outfile_abort(struct outfile *o)
{
	if (o->fd >= 0 && !o->borrowed)
		close(o->fd);
	if (o->tmp != NULL)
		unlink(o->tmp);
	outfile_live_remove(o);
	free(o->tmp);
	free(o->target);
	free(o->buf);
	o->fd = -1;
	o->tmp = NULL;
	o->target = NULL;
	o->buf = NULL;
}

int
outfile_begin_fd(int fd, const char *what, struct outfile *o)
{
	memset(o, 0, sizeof(*o));
	o->path = what;
	o->fd = fd;
	o->borrowed = 1;
	if ((o->buf = malloc(OUTFILE_BUFFER_SIZE)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", what);
	return 0;
}

/* Writes all of p[0..n) to the file, unbuffered. */
static int
outfile_write_all(const struct outfile *o, const uint8_t *p, uint64_t n)
{
	while (n > 0) {
		size_t chunk = n > OUTFILE_MAX_WRITE ? OUTFILE_MAX_WRITE : (size_t)n;
		ssize_t w = write(o->fd, p, chunk);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			/* The caller's memory, not the output: a mapped input file that
			 * shrank under its mapping. */
			if (errno == EFAULT)
				return error_set(-EIO, "%s: write: the data to write could not be "
					"read (an input file shrank while it was read?)", o->path);
			return error_set(-errno, "%s: write: %s", o->path, strerror(errno));
		}
		if (w == 0)
			return error_set(-EIO, "%s: write returned 0", o->path);
		p += w;
		n -= (uint64_t)w;
	}
	return 0;
}

int
outfile_flush(struct outfile *o)
{
	int rc = outfile_write_all(o, o->buf, o->used);

	o->used = 0;
	return rc;
}

int
outfile_put(struct outfile *o, const void *p, uint64_t n)
{
	int rc;

	if (n > OUTFILE_BUFFER_SIZE - o->used) {
		if ((rc = outfile_flush(o)) < 0)
			return rc;
		if (n >= OUTFILE_BUFFER_SIZE) {
			o->pos += n;
			return outfile_write_all(o, p, n);
		}
	}
	if (n > 0)
		memcpy(o->buf + o->used, p, (size_t)n);
	o->used += (size_t)n;
	o->pos += n;
	return 0;
}

int
outfile_zeros(struct outfile *o, uint64_t n)
{
	int rc;

	while (n > 0) {
		size_t chunk;

		if (o->used == OUTFILE_BUFFER_SIZE && (rc = outfile_flush(o)) < 0)
			return rc;
		chunk = OUTFILE_BUFFER_SIZE - o->used;
		if (chunk > n)
			chunk = (size_t)n;
		memset(o->buf + o->used, 0, chunk);
		o->used += chunk;
		o->pos += chunk;
		n -= chunk;
	}
	return 0;
}

int
outfile_put_converted(struct outfile *o, const uint8_t *p, uint64_t n, unsigned elem_size,
	outfile_convert_fn *convert)
{
	int rc;

	if (elem_size <= 1)
		return outfile_put(o, p, n);
	if (n % elem_size != 0)
		return error_set(-EINVAL, "%s: %" PRIu64 " bytes are not whole %u-byte elements",
			o->path, n, elem_size);
	while (n > 0) {
		size_t chunk = OUTFILE_BUFFER_SIZE - o->used;

		chunk -= chunk % elem_size;
		if (chunk == 0) {
			if ((rc = outfile_flush(o)) < 0)
				return rc;
			continue;
		}
		if (chunk > n)
			chunk = (size_t)n;
		convert(o->buf + o->used, p, chunk, elem_size);
		o->used += chunk;
		o->pos += chunk;
		p += chunk;
		n -= chunk;
	}
	return 0;
}

/*
 * Closes o's descriptor: 0 or -errno. EINTR is no error: Linux has closed
 * the descriptor by then (it must not be closed again), and what was
 * written has reached the file (fsync, or a FIFO's reader); a close that
 * reports a write error (EIO, ENOSPC on NFS) fails the commit.
 */
static int
outfile_close(struct outfile *o)
{
	int rc = close(o->fd);

	o->fd = -1;
	return rc < 0 && errno != EINTR ? -errno : 0;
}

int
outfile_commit(struct outfile *o)
{
	const char *slash = strrchr(o->target, '/');
	char *dir;
	int rc, dfd;

	if ((rc = outfile_flush(o)) < 0)
		return rc;
	if (o->tmp == NULL) { /* written into a FIFO, a device or stdout: nothing to rename */
		rc = outfile_close(o);
		if (rc < 0)
			return error_set(rc, "%s: close: %s", o->path, strerror(-rc));
		return 0;
	}
	/* A signal interrupts fsync and rename on a network or FUSE file
	 * system (no SA_RESTART there): they are tried again, as write is. */
	while ((rc = fsync(o->fd)) < 0 && errno == EINTR)
		;
	if (rc < 0)
		return error_set(-errno, "%s: fsync: %s", o->path, strerror(errno));
	if ((rc = outfile_close(o)) < 0)
		return error_set(rc, "%s: close: %s", o->path, strerror(-rc));
	while ((rc = rename(o->tmp, o->target)) < 0 && errno == EINTR)
		;
	if (rc < 0)
		return error_set(-errno, "%s: rename from %s: %s", o->path, o->tmp,
			strerror(errno));
	outfile_live_remove(o);
	free(o->tmp);
	o->tmp = NULL;
	/* Best effort: the file is complete; a failing directory fsync (some
	 * filesystems refuse it) does not make it less so. */
	if (slash == NULL)
		dir = strdup(".");
	else if (slash == o->target)
		dir = strdup("/");
	else
		dir = strndup(o->target, (size_t)(slash - o->target));
	if (dir != NULL) {
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			(void)fsync(dfd);
			close(dfd);
		}
		free(dir);
	}
	return 0;
}
