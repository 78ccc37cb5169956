/*
 * remotefs.c: a FUSE filesystem that behaves, on one machine, like a model
 * directory on a network filesystem (NFS, Lustre, CephFS, an object store
 * mounted through FUSE) that another host writes. The tests use it to
 * reproduce what a remote writer does to wcached and its workers (issue 22).
 *
 *   remotefs [-f] [-d] [-o OPT[,OPT...]] [--attr-timeout SECONDS]
 *            [--stale=eio|estale|keep] [--keep-cache] [--read-rate BYTES]
 *            [--flush] [--bad-range FROM-TO] BACKING MOUNTPOINT
 *
 * MOUNTPOINT shows the directory BACKING read-only (lookups, getattr,
 * readdir, readlink, open, read, flush, release, statfs). Files are
 * cached in the kernel's page cache and can be mapped, as on NFS (no
 * direct_io). The program always runs in the foreground (-f is accepted
 * for the habit) until it is unmounted (fusermount3 -u MOUNTPOINT) or gets
 * SIGTERM, SIGINT or SIGHUP; tests/pyutil/remotefs.py runs it. It mounts with
 * "ro,default_permissions,fsname=remotefs,subtype=remotefs" (mountinfo
 * says fuse.remotefs), plus what -o adds: allow_other lets other users in
 * (the daemon under test runs as an unprivileged user), and the kernel then
 * checks their permissions against the backing files' modes.
 *
 * "Another host" is whoever changes BACKING directly:
 *
 * - No inotify event reaches MOUNTPOINT: the kernel raises fsnotify events
 *   only for changes made through the mount itself.
 * - The change shows through the mount once the kernel's cached entries and
 *   attributes expire: both are cached for --attr-timeout seconds (default
 *   1.0, as NFS's attribute cache; 0 asks every time), and so are negative
 *   entries (a file created in BACKING may stay invisible that long).
 * - Nodes are keyed by the backing inode (st_dev, st_ino), as NFS file
 *   handles are, not by name: a file renamed over another in BACKING is a
 *   new inode through the mount (its st_ino is the backing one), while
 *   descriptors and mappings opened before keep the old inode and its page
 *   cache.
 *
 * Stale inodes. An NFS server frees a file's inode once the last name of
 * it is gone, whoever still has it open on other clients: there, reads of
 * pages not already cached fail (EIO, or ESTALE) and a process touching
 * such a page through a mapping gets SIGBUS. remotefs does the same: a
 * backing inode whose link count is 0 (it was removed, or another file was
 * renamed over its last name) is stale, and then
 *
 * - reads on handles opened before fail with EIO (--stale=eio, default)
 *   or ESTALE (--stale=estale): a mapping's fault on an uncached page is
 *   such a read, so the toucher gets SIGBUS. read(2) of cached pages works
 *   until the kernel's attributes expire; then the getattr it sends with
 *   the handle before reading fails the same way;
 * - open, and getattr without a handle, fail with ESTALE (both modes), as
 *   NFS's do: the kernel then looks the path up again (LOOKUP_REVAL), so
 *   open(PATH) and stat(PATH) find the new file at once, while fstat() of
 *   an old descriptor fails with ESTALE, as on NFS;
 * - --stale=keep turns all of it off: the old inode stays readable, as on
 *   a local filesystem.
 *
 * The check is one fstat() of the handle's own descriptor per read (about
 * a microsecond; the kernel's reads are 128 KiB to 1 MiB), so a removal is
 * seen by the very next read. Staleness follows the link count rather than
 * "the name the file was opened by now names another inode": an inode
 * renamed away, or still linked elsewhere, stays valid, as on NFS.
 *
 * The page cache. By default each open() of a file makes the kernel drop
 * the pages it caches for that inode (FUSE without keep_cache: a strict
 * close-to-open; the pages of other processes' mappings of it are unmapped
 * and dropped too). --keep-cache keeps them across opens (FOPEN_KEEP_CACHE).
 * Either way the kernel also drops them when it sees the file's size or
 * mtime change (FUSE_CAP_AUTO_INVAL_DATA), as NFS does on a change of
 * attributes. Pages not mapped by any process are also dropped by
 * posix_fadvise(POSIX_FADV_DONTNEED) on a descriptor of the file and by
 * /proc/sys/vm/drop_caches, but neither touches a page some process has
 * mapped. Signals make remotefs drop them all, mapped or not, through
 * FUSE's invalidation notice (the kernel unmaps them from every mapping,
 * so the next touch reads again through the mapping's handle):
 *
 *   SIGUSR1  the pages of every stale inode, as an NFS client does once it
 *            learns the server freed the inode: a worker touching its old
 *            mapping then gets SIGBUS at once, whatever it touched before;
 *   SIGUSR2  the pages of every file the kernel holds (memory pressure).
 *
 * Each ends with one line on stderr, "remotefs: dropped the cached pages
 * of N inodes (stale|all)", which tests/pyutil/remotefs.py waits for.
 *
 * A slow server. --read-rate BYTES (a number, or with K, M or G for KiB,
 * MiB, GiB) throttles every read to BYTES per second for the whole mount,
 * as a busy server or a thin link would: a read request waits its turn, in
 * one queue for all files and threads, until the bytes it asks for are
 * paid for at that rate after those of the reads before it. So reading N
 * bytes takes about N / BYTES seconds however the kernel splits them into
 * requests (128 KiB to 1 MiB) and however many it has in flight, and a
 * staging copy of a few MiB can be made to take seconds. SIGRTMIN sent
 * with a value (sigqueue(3); util-linux kill -s RTMIN -q BYTES PID) sets
 * the rate while mounted, 0 or a SIGRTMIN without a value ends the
 * throttle; reads waiting then go at once. Each change ends with one line
 * on stderr, "remotefs: reads throttled to N bytes/s" or "remotefs: reads
 * not throttled", which tests/pyutil/remotefs.py waits for. The check for
 * a stale inode (above) comes after the wait, as a slow server answers
 * with what it has when it gets to the request.
 *
 * FLUSH on close. A FUSE filesystem that implements FLUSH (gcsfuse, s3fs
 * and sshfs do) is sent one on every close(2) of a file on it, and close
 * waits for the answer, so a server that hangs hangs every close there.
 * By default remotefs opens files with FOPEN_NOFLUSH and is sent none;
 * --flush opens them without it, and answers each FLUSH at once (there is
 * nothing to write back): stopped (SIGSTOP, RemoteFS.freeze()), it then
 * holds every close of a file on the mount until it continues.
 *
 * A bad disk. --bad-range FROM-TO (byte offsets, each a number or with K, M
 * or G) fails with EIO every read that overlaps bytes FROM to TO (TO not
 * included) of any file, as a server whose disk lost those blocks does: a
 * file shorter than FROM reads whole, and a longer one's header and end
 * read too (it validates), while reading all of it (warming it) fails.
 *
 * statfs passes the backing filesystem's figures through; its f_type is
 * FUSE's magic (0x65735546) whatever remotefs answers, so statfs(2) and
 * /proc/self/mountinfo ("fuse.remotefs") say "FUSE".
 *
 * It uses libfuse3's low-level API (the high-level one names nodes by path,
 * which would make a replaced file the same inode). It does not link
 * wclib.
 */
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(fuse_ino_t) >= sizeof(uintptr_t), "node ids hold pointers");

/* What a read on a handle of a stale inode does. */
enum rfs_stale {
	RFS_STALE_EIO,
	RFS_STALE_ESTALE,
	RFS_STALE_KEEP,
};

/*
 * One backing inode the kernel knows, found by (dev, ino). Its address is
 * its FUSE node id (the root's is FUSE_ROOT_ID). fd is an O_PATH
 * descriptor of the backing inode, which keeps it alive (and stale, once
 * unlinked) as long as the kernel keeps the node. nlookup counts the
 * kernel's references: lookups add one each, FORGET takes them back, and
 * at zero the node is freed. next chains the hash bucket.
 */
struct rfs_inode {
	struct rfs_inode *next;
	int fd;
	dev_t dev;
	ino_t ino;
	uint64_t nlookup;
};

/* An open directory: the stream and where the kernel's last readdir left it. */
struct rfs_dir {
	DIR *dp;
	struct dirent *entry;	/* read but not yet returned, or NULL */
	off_t offset;
};

/*
 * The read throttle (--read-rate, SIGRTMIN; see the header comment), all
 * under lock. rate: bytes per second, 0 for none. next_ns: when the reads
 * already let through are paid for (CLOCK_MONOTONIC). epoch: counts the
 * changes of rate; a change wakes every waiting read (changed), which
 * then goes at once.
 */
struct rfs_throttle {
	pthread_mutex_t lock;
	pthread_cond_t changed;	/* on CLOCK_MONOTONIC */
	uint64_t rate;
	uint64_t next_ns;
	uint64_t epoch;
};

/* The filesystem: options, the session, the node table (lock held for
 * buckets, count and every nlookup), the thread that waits for SIGUSR1,
 * SIGUSR2 and SIGRTMIN (see rfs_signals), the read throttle. */
struct rfs {
	double attr_timeout;
	enum rfs_stale stale;
	int keep_cache;
	int flush;	/* open without FOPEN_NOFLUSH: every close sends FLUSH */
	uint64_t bad_from, bad_to;	/* reads overlapping these bytes fail (--bad-range) */
	struct rfs_throttle throttle;
	struct fuse_session *se;
	pthread_t signal_thread;
	atomic_int quit;
	struct rfs_inode root;
	pthread_mutex_t lock;
	struct rfs_inode **buckets;
	size_t nbuckets;	/* a power of two */
	size_t count;
};

static struct rfs *
rfs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct rfs_inode *
rfs_inode_of(fuse_req_t req, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return &rfs_of(req)->root;
	return (struct rfs_inode *)(uintptr_t)ino;
}

static size_t
rfs_hash(const struct rfs *fs, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)dev * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)ino;

	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	h ^= h >> 32;
	return (size_t)h & (fs->nbuckets - 1);
}

/* Doubles the bucket array (lock held); on ENOMEM the table stays as it is,
 * only slower. */
static void
rfs_grow(struct rfs *fs)
{
	size_t old = fs->nbuckets;
	struct rfs_inode **prev = fs->buckets;
	struct rfs_inode **b = calloc(old * 2, sizeof(struct rfs_inode *));

	if (b == NULL)
		return;
	fs->buckets = b;
	fs->nbuckets = old * 2;
	for (size_t i = 0; i < old; i++) {
		struct rfs_inode *n, *next;

		for (n = prev[i]; n != NULL; n = next) {
			size_t h = rfs_hash(fs, n->dev, n->ino);

			next = n->next;
			n->next = b[h];
			b[h] = n;
		}
	}
	free(prev);
}

/*
 * The node of the backing inode st describes, with one more lookup
 * reference: the existing one, or a new one that takes ownership of fd.
 * Sets *fd to -1 when it took it; the caller closes an fd not taken.
 * Find and insert happen under one lock, so two racing lookups of one
 * inode get one node.
 */
static struct rfs_inode *
rfs_node_get(struct rfs *fs, int *fd, const struct stat *st)
{
	struct rfs_inode *n;
	size_t h;

	pthread_mutex_lock(&fs->lock);
	h = rfs_hash(fs, st->st_dev, st->st_ino);
	for (n = fs->buckets[h]; n != NULL; n = n->next)
		if (n->dev == st->st_dev && n->ino == st->st_ino)
			break;
	if (n == NULL && (n = calloc(1, sizeof(*n))) != NULL) {
		n->fd = *fd;
		*fd = -1;
		n->dev = st->st_dev;
		n->ino = st->st_ino;
		n->next = fs->buckets[h];
		fs->buckets[h] = n;
		if (++fs->count > fs->nbuckets)
			rfs_grow(fs);
	}
	if (n != NULL)
		n->nlookup++;
	pthread_mutex_unlock(&fs->lock);
	return n;
}

/* Takes back nlookup of the kernel's references to n; frees n at zero. */
static void
rfs_node_put(struct rfs *fs, struct rfs_inode *n, uint64_t nlookup)
{
	struct rfs_inode **p;

	if (n == &fs->root)
		return;
	pthread_mutex_lock(&fs->lock);
	n->nlookup = nlookup < n->nlookup ? n->nlookup - nlookup : 0;
	if (n->nlookup > 0) {
		pthread_mutex_unlock(&fs->lock);
		return;
	}
	for (p = &fs->buckets[rfs_hash(fs, n->dev, n->ino)]; *p != NULL; p = &(*p)->next) {
		if (*p == n) {
			*p = n->next;
			fs->count--;
			break;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	close(n->fd);
	free(n);
}

/* Whether a backing inode with these attributes counts as freed by the
 * server (see the header comment). */
static int
rfs_is_stale(const struct rfs *fs, const struct stat *st)
{
	return fs->stale != RFS_STALE_KEEP && st->st_nlink == 0;
}

/* What reads on a handle of a stale inode fail with. */
static int
rfs_stale_errno(const struct rfs *fs)
{
	return fs->stale == RFS_STALE_ESTALE ? ESTALE : EIO;
}

static void
rfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct rfs *fs = rfs_of(req);
	struct fuse_entry_param e;
	struct rfs_inode *n;
	int fd, err;

	memset(&e, 0, sizeof(e));
	e.attr_timeout = fs->attr_timeout;
	e.entry_timeout = fs->attr_timeout;
	fd = openat(rfs_inode_of(req, parent)->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd == -1) {
		err = errno;
		/* A negative entry, cached as long as a positive one, as NFS
		 * caches a name's absence. */
		if (err == ENOENT)
			fuse_reply_entry(req, &e);
		else
			fuse_reply_err(req, err);
		return;
	}
	if (fstatat(fd, "", &e.attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == -1) {
		err = errno;
		close(fd);
		fuse_reply_err(req, err);
		return;
	}
	n = rfs_node_get(fs, &fd, &e.attr);
	if (fd != -1)
		close(fd);
	if (n == NULL) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	e.ino = (fuse_ino_t)(uintptr_t)n;
	/* The kernel may drop the reply (an interrupted request); then it
	 * never sends the FORGET that would balance this lookup. */
	if (fuse_reply_entry(req, &e) != 0)
		rfs_node_put(fs, n, 1);
}

static void
rfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	rfs_node_put(rfs_of(req), rfs_inode_of(req, ino), nlookup);
	fuse_reply_none(req);
}

static void
rfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++)
		rfs_node_put(rfs_of(req), rfs_inode_of(req, forgets[i].ino), forgets[i].nlookup);
	fuse_reply_none(req);
}

static void
rfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct rfs *fs = rfs_of(req);
	struct stat st;

	if (fstatat(rfs_inode_of(req, ino)->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == -1)
		fuse_reply_err(req, errno);
	else if (rfs_is_stale(fs, &st))
		fuse_reply_err(req, fi != NULL ? rfs_stale_errno(fs) : ESTALE);
	else
		fuse_reply_attr(req, &st, fs->attr_timeout);
}

static void
rfs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char buf[PATH_MAX + 1];
	ssize_t len = readlinkat(rfs_inode_of(req, ino)->fd, "", buf, sizeof(buf));

	if (len == -1) {
		fuse_reply_err(req, errno);
		return;
	}
	if ((size_t)len == sizeof(buf)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	buf[len] = '\0';
	fuse_reply_readlink(req, buf);
}

static void
rfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct rfs_dir *d = calloc(1, sizeof(*d));
	int fd, err;

	if (d == NULL) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fd = openat(rfs_inode_of(req, ino)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd == -1 || (d->dp = fdopendir(fd)) == NULL) {
		err = errno;
		if (fd != -1)
			close(fd);
		free(d);
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	if (fuse_reply_open(req, fi) != 0) {
		closedir(d->dp);
		free(d);
	}
}

/*
 * Fills one reply of at most size bytes with entries from offset on. An
 * entry that does not fit stays in d->entry for the next call. An error
 * after some entries is not reported: those entries go first, and the
 * next call meets the error again.
 */
static void
rfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, struct fuse_file_info *fi)
{
	struct rfs_dir *d = (struct rfs_dir *)(uintptr_t)fi->fh;
	char *buf = malloc(size > 0 ? size : 1);
	size_t used = 0;
	int err = 0;

	if (buf == NULL) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (offset != d->offset) {
		seekdir(d->dp, offset);
		d->entry = NULL;
		d->offset = offset;
	}
	for (;;) {
		struct stat st;
		size_t len;

		if (d->entry == NULL) {
			errno = 0;
			if ((d->entry = readdir(d->dp)) == NULL) {
				err = errno;
				break;
			}
		}
		memset(&st, 0, sizeof(st));
		st.st_ino = d->entry->d_ino;
		st.st_mode = (mode_t)d->entry->d_type << 12;
		len = fuse_add_direntry(req, buf + used, size - used, d->entry->d_name, &st,
			d->entry->d_off);
		if (len > size - used)
			break;
		used += len;
		d->offset = d->entry->d_off;
		d->entry = NULL;
	}
	if (err != 0 && used == 0)
		fuse_reply_err(req, err);
	else
		fuse_reply_buf(req, buf, used);
	free(buf);
}

static void
rfs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct rfs_dir *d = (struct rfs_dir *)(uintptr_t)fi->fh;

	closedir(d->dp);
	free(d);
	fuse_reply_err(req, 0);
}

/*
 * Opens the backing inode itself (through /proc/self/fd: the node's
 * O_PATH descriptor names the inode, whatever its name is now). The
 * handle is that descriptor; a stale inode is not opened (ESTALE makes
 * the kernel look the path up again).
 */
static void
rfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct rfs *fs = rfs_of(req);
	char proc[64];
	struct stat st;
	int fd, err;

	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", rfs_inode_of(req, ino)->fd);
	if ((fd = open(proc, O_RDONLY | O_CLOEXEC)) == -1) {
		fuse_reply_err(req, errno);
		return;
	}
	err = fstat(fd, &st) == -1 ? errno : rfs_is_stale(fs, &st) ? ESTALE : 0;
	if (err != 0) {
		close(fd);
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = (uint64_t)fd;
	fi->keep_cache = fs->keep_cache != 0;
	fi->direct_io = 0;
	fi->noflush = fs->flush == 0;
	if (fuse_reply_open(req, fi) != 0)
		close(fd);
}

/* CLOCK_MONOTONIC in nanoseconds: the throttle's clock. */
static uint64_t
rfs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sets up the throttle, at rate bytes per second (0: none). 0, or an errno. */
static int
rfs_throttle_init(struct rfs_throttle *t, uint64_t rate)
{
	pthread_condattr_t attr;
	int err;

	if ((err = pthread_condattr_init(&attr)) != 0)
		return err;
	if ((err = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)) == 0 &&
		(err = pthread_cond_init(&t->changed, &attr)) == 0 &&
		(err = pthread_mutex_init(&t->lock, NULL)) != 0)
		pthread_cond_destroy(&t->changed);
	pthread_condattr_destroy(&attr);
	t->rate = rate;
	t->next_ns = 0;
	t->epoch = 0;
	return err;
}

static void
rfs_throttle_destroy(struct rfs_throttle *t)
{
	pthread_cond_destroy(&t->changed);
	pthread_mutex_destroy(&t->lock);
}

/* Waits until a read of size bytes is paid for at the throttle's rate
 * after the reads before it, or the rate changes; at once without one. */
static void
rfs_throttle_wait(struct rfs_throttle *t, size_t size)
{
	struct timespec until;
	uint64_t now, end, epoch;

	pthread_mutex_lock(&t->lock);
	if (t->rate == 0) {
		pthread_mutex_unlock(&t->lock);
		return;
	}
	now = rfs_now_ns();
	if (t->next_ns < now)
		t->next_ns = now;
	/* size is a FUSE request's (at most a few MiB): no overflow. */
	t->next_ns += (uint64_t)size * 1000000000u / t->rate;
	end = t->next_ns;
	epoch = t->epoch;
	until.tv_sec = (time_t)(end / 1000000000u);
	until.tv_nsec = (long)(end % 1000000000u);
	while (t->epoch == epoch && rfs_now_ns() < end)
		if (pthread_cond_timedwait(&t->changed, &t->lock, &until) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&t->lock);
}

/* Sets the throttle's rate (0: none), lets every waiting read go, and
 * says so in one line on stderr. */
static void
rfs_throttle_set(struct rfs_throttle *t, uint64_t rate)
{
	pthread_mutex_lock(&t->lock);
	t->rate = rate;
	t->next_ns = 0;
	t->epoch++;
	pthread_cond_broadcast(&t->changed);
	pthread_mutex_unlock(&t->lock);
	if (rate == 0)
		fprintf(stderr, "remotefs: reads not throttled\n");
	else
		fprintf(stderr, "remotefs: reads throttled to %" PRIu64 " bytes/s\n", rate);
}

/* Reads from the handle's own descriptor, once the throttle lets it go
 * (--read-rate), after checking that the inode it was opened on has not
 * been freed (see the header comment). */
static void
rfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, struct fuse_file_info *fi)
{
	struct rfs *fs = rfs_of(req);
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
	int fd = (int)fi->fh;
	struct stat st;

	rfs_throttle_wait(&fs->throttle, size);
	if ((uint64_t)offset < fs->bad_to && (uint64_t)offset + size > fs->bad_from) {
		fuse_reply_err(req, EIO);
		return;
	}
	if (fs->stale != RFS_STALE_KEEP) {
		if (fstat(fd, &st) == -1) {
			fuse_reply_err(req, errno);
			return;
		}
		if (rfs_is_stale(fs, &st)) {
			fuse_reply_err(req, rfs_stale_errno(fs));
			return;
		}
	}
	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = fd;
	buf.buf[0].pos = offset;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

static void
rfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	close((int)fi->fh);
	fuse_reply_err(req, 0);
}

/* FLUSH, sent on every close(2) of a handle opened without noflush
 * (--flush): nothing is ever written, so there is nothing to write back.
 * What matters is that close waits for this answer. */
static void
rfs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
}

static void
rfs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	if (fstatvfs(rfs_inode_of(req, ino)->fd, &sv) == -1)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}

/*
 * Asks the kernel to drop every cached page of the regular files it holds
 * (all), or of those whose backing inode was freed: FUSE's inode
 * invalidation, which unmaps the pages from every process's mapping too.
 * The nodes are collected with a reference each under the lock and
 * notified after it, so that requests keep being served meanwhile.
 */
static void
rfs_drop_pages(struct rfs *fs, int all)
{
	struct rfs_inode **nodes;
	size_t count = 0, dropped = 0;

	pthread_mutex_lock(&fs->lock);
	nodes = calloc(fs->count + 1, sizeof(struct rfs_inode *));
	for (size_t i = 0; nodes != NULL && i < fs->nbuckets; i++) {
		for (struct rfs_inode *n = fs->buckets[i]; n != NULL; n = n->next) {
			struct stat st;

			if (fstatat(n->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == -1 ||
				!S_ISREG(st.st_mode) || (!all && st.st_nlink != 0))
				continue;
			n->nlookup++;
			nodes[count++] = n;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	if (nodes == NULL) {
		fprintf(stderr, "remotefs: cannot drop cached pages: out of memory\n");
		return;
	}
	for (size_t i = 0; i < count; i++) {
		/* -ENOENT: the kernel had already let the inode go. */
		if (fuse_lowlevel_notify_inval_inode(fs->se, (fuse_ino_t)(uintptr_t)nodes[i], 0,
			    0) == 0)
			dropped++;
		rfs_node_put(fs, nodes[i], 1);
	}
	free(nodes);
	fprintf(stderr, "remotefs: dropped the cached pages of %zu inodes (%s)\n", dropped,
		all ? "all" : "stale");
}

/* The signals rfs_signals serves, blocked in every other thread. */
static void
rfs_signal_set(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGUSR1);
	sigaddset(set, SIGUSR2);
	sigaddset(set, SIGRTMIN);
}

/* The thread that serves SIGUSR1, SIGUSR2 and SIGRTMIN until quit is set
 * and it is woken once more. */
static void *
rfs_signals(void *arg)
{
	struct rfs *fs = arg;
	siginfo_t info;
	sigset_t set;

	rfs_signal_set(&set);
	for (;;) {
		if (sigwaitinfo(&set, &info) == -1)
			continue;
		if (atomic_load(&fs->quit))
			return NULL;
		if (info.si_signo != SIGRTMIN)
			rfs_drop_pages(fs, info.si_signo == SIGUSR2);
		else if (info.si_code != SI_QUEUE)
			rfs_throttle_set(&fs->throttle, 0); /* no value: kill(1) */
		else if (info.si_value.sival_int < 0)
			fprintf(stderr, "remotefs: SIGRTMIN wants a read rate of 0 or more "
				"bytes/s, not %d: left as it was\n", info.si_value.sival_int);
		else
			rfs_throttle_set(&fs->throttle, (uint64_t)info.si_value.sival_int);
	}
}

static const struct fuse_lowlevel_ops rfs_ops = {
	.lookup = rfs_lookup,
	.forget = rfs_forget,
	.forget_multi = rfs_forget_multi,
	.getattr = rfs_getattr,
	.readlink = rfs_readlink,
	.opendir = rfs_opendir,
	.readdir = rfs_readdir,
	.releasedir = rfs_releasedir,
	.open = rfs_open,
	.read = rfs_read,
	.flush = rfs_flush,
	.release = rfs_release,
	.statfs = rfs_statfs,
};

/* Frees every node the kernel had not forgotten when the session ended. */
static void
rfs_free_nodes(struct rfs *fs)
{
	for (size_t i = 0; i < fs->nbuckets; i++) {
		struct rfs_inode *n, *next;

		for (n = fs->buckets[i]; n != NULL; n = next) {
			next = n->next;
			close(n->fd);
			free(n);
		}
	}
	free(fs->buckets);
	fs->buckets = NULL;
	fs->count = 0;
}

static void
usage(FILE *out)
{
	fprintf(out,
		"usage: remotefs [-f] [-d] [-o OPT[,OPT...]] [--attr-timeout SECONDS]\n"
		"                [--stale=eio|estale|keep] [--keep-cache] [--read-rate BYTES]\n"
		"                [--flush] [--bad-range FROM-TO] BACKING MOUNTPOINT\n"
		"\n"
		"Shows directory BACKING read-only at MOUNTPOINT as a network filesystem\n"
		"would: changes made in BACKING (\"by another host\") raise no inotify event\n"
		"on MOUNTPOINT and show there once cached entries and attributes expire,\n"
		"and an inode freed in BACKING (removed, or renamed over) fails reads on\n"
		"the handles opened before it was. Runs in the foreground until unmounted\n"
		"(fusermount3 -u MOUNTPOINT) or sent SIGTERM.\n"
		"\n"
		"  -f                     foreground (always; accepted for the habit)\n"
		"  -d                     print every FUSE request (libfuse's debug output)\n"
		"  -o OPT[,OPT...]        more mount options, e.g. allow_other (let other\n"
		"                         users in; root may always set it)\n"
		"  --attr-timeout S       seconds the kernel caches entries and attributes,\n"
		"                         0 or more (default 1.0)\n"
		"  --stale=MODE           reads on handles of a freed inode: eio (default),\n"
		"                         estale, or keep (they keep working, as locally);\n"
		"                         open and stat of a freed inode fail with ESTALE\n"
		"                         unless keep\n"
		"  --keep-cache           keep a file's cached pages across opens (default:\n"
		"                         each open drops them, a strict close-to-open)\n"
		"  --read-rate BYTES      throttle reads to BYTES per second for the whole\n"
		"                         mount (K, M, G: KiB, MiB, GiB), as a slow server\n"
		"                         would (default: not throttled)\n"
		"  --flush                have every close(2) of a file on the mount send\n"
		"                         FLUSH and wait for its answer, as gcsfuse, s3fs\n"
		"                         and sshfs do (default: files open with noflush)\n"
		"  --bad-range FROM-TO    fail with EIO every read that overlaps bytes FROM\n"
		"                         to TO (TO not included) of a file (K, M, G), as a\n"
		"                         disk that lost those blocks (default: none)\n"
		"  -h, --help             this text\n"
		"\n"
		"SIGUSR1 drops the kernel's cached pages of every freed inode, mapped or\n"
		"not (so an old mapping's next touch gets SIGBUS); SIGUSR2 those of every\n"
		"file. Each ends with a line \"remotefs: dropped the cached pages of N\n"
		"inodes\" on stderr. SIGRTMIN with a value (sigqueue(3); kill -s RTMIN\n"
		"-q BYTES PID) sets the read rate, 0 or no value ends the throttle; it\n"
		"ends with a line \"remotefs: reads throttled to N bytes/s\" or\n"
		"\"remotefs: reads not throttled\".\n");
}

/* A usage error: one line naming it, exit status 2. */
static int
usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "remotefs: %s%s%s (see 'remotefs --help')\n", what, arg ? ": " : "",
		arg ? arg : "");
	return 2;
}

/* --read-rate's value: a number of bytes per second, or of KiB, MiB or GiB
 * with K, M or G after it, at most 1024 GiB. 0 and *rate, or -1. */
static int
parse_rate(const char *arg, uint64_t *rate)
{
	unsigned long long n;
	unsigned shift = 0;
	char *end;

	if (*arg < '0' || *arg > '9')
		return -1;
	errno = 0;
	n = strtoull(arg, &end, 10);
	if (errno != 0 || end == arg)
		return -1;
	if (*end != '\0') {
		const char *units = "KMG", *u = strchr(units, *end);

		if (u == NULL || end[1] != '\0')
			return -1;
		shift = 10u * (unsigned)(u - units + 1);
	}
	if (n > (1ull << 40) >> shift)
		return -1;
	*rate = (uint64_t)n << shift;
	return 0;
}

/* --bad-range's value: FROM-TO, each as parse_rate's, FROM below TO. 0 and
 * both, or -1. */
static int
parse_range(const char *arg, uint64_t *from, uint64_t *to)
{
	char buf[64];
	const char *dash = strchr(arg, '-');

	if (dash == NULL || (size_t)(dash - arg) >= sizeof(buf))
		return -1;
	memcpy(buf, arg, (size_t)(dash - arg));
	buf[dash - arg] = '\0';
	if (parse_rate(buf, from) != 0 || parse_rate(dash + 1, to) != 0 || *from >= *to)
		return -1;
	return 0;
}

/* Raises the soft descriptor limit to the hard one: every inode the kernel
 * holds costs a descriptor here. */
static void
raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* Mounts fs at mountpoint with the given libfuse arguments and serves it
 * until unmounted or signalled. Returns the exit status. */
static int
serve(struct rfs *fs, struct fuse_args *args, const char *mountpoint)
{
	struct fuse_session *se;
	struct fuse_loop_config *loop;
	sigset_t set;
	int status = 1;

	if ((se = fuse_session_new(args, &rfs_ops, sizeof(rfs_ops), fs)) == NULL) {
		fprintf(stderr, "remotefs: bad mount options (libfuse's reason above)\n");
		return 2;
	}
	if (fuse_set_signal_handlers(se) != 0) {
		fprintf(stderr, "remotefs: cannot set signal handlers\n");
		goto out;
	}
	if (fuse_session_mount(se, mountpoint) != 0) {
		fprintf(stderr, "remotefs: cannot mount at %s (libfuse's reason above)\n",
			mountpoint);
		goto out_signals;
	}
	fs->se = se;
	/* SIGUSR1, SIGUSR2 and SIGRTMIN go to rfs_signals alone: blocked here
	 * before any thread starts, so every thread inherits the mask. */
	rfs_signal_set(&set);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (pthread_create(&fs->signal_thread, NULL, rfs_signals, fs) != 0) {
		fprintf(stderr, "remotefs: cannot start the signal thread\n");
		goto out_unmount;
	}
	if ((loop = fuse_loop_cfg_create()) == NULL) {
		fprintf(stderr, "remotefs: out of memory\n");
		goto out_thread;
	}
	fuse_loop_cfg_set_max_threads(loop, 16);
	fuse_loop_cfg_set_idle_threads(loop, 4);
	/* 0, or the number of the signal that ended it: both are a clean end. */
	status = fuse_session_loop_mt(se, loop) >= 0 ? 0 : 1;
	fuse_loop_cfg_destroy(loop);
out_thread:
	atomic_store(&fs->quit, 1);
	pthread_kill(fs->signal_thread, SIGUSR1);
	pthread_join(fs->signal_thread, NULL);
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out:
	fuse_session_destroy(se);
	return status;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "attr-timeout", required_argument, NULL, 't' },
		{ "stale", required_argument, NULL, 's' },
		{ "keep-cache", no_argument, NULL, 'k' },
		{ "read-rate", required_argument, NULL, 'r' },
		{ "flush", no_argument, NULL, 'F' },
		{ "bad-range", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct rfs fs = { .attr_timeout = 1.0, .stale = RFS_STALE_EIO };
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	const char *backing, *mountpoint;
	uint64_t read_rate = 0;
	struct stat st;
	char *end;
	int c, status, err;

	opterr = 0;
	if (fuse_opt_add_arg(&args, "remotefs") != 0 ||
		fuse_opt_add_arg(&args, "-o") != 0 ||
		fuse_opt_add_arg(&args, "ro,default_permissions,fsname=remotefs,"
					"subtype=remotefs") != 0)
		goto nomem;
	while ((c = getopt_long(argc, argv, "+fdho:", longopts, NULL)) != -1) {
		switch (c) {
		case 'f':
			break;
		case 'd':
			if (fuse_opt_add_arg(&args, "-d") != 0)
				goto nomem;
			break;
		case 'o':
			if (fuse_opt_add_arg(&args, "-o") != 0 ||
				fuse_opt_add_arg(&args, optarg) != 0)
				goto nomem;
			break;
		case 't':
			errno = 0;
			fs.attr_timeout = strtod(optarg, &end);
			if (errno != 0 || end == optarg || *end != '\0' ||
				!isfinite(fs.attr_timeout) || fs.attr_timeout < 0 ||
				fs.attr_timeout > 1e6) {
				fuse_opt_free_args(&args);
				return usage_error(
					"--attr-timeout wants seconds from 0 to 1e6, not", optarg);
			}
			break;
		case 's':
			if (strcmp(optarg, "eio") == 0)
				fs.stale = RFS_STALE_EIO;
			else if (strcmp(optarg, "estale") == 0)
				fs.stale = RFS_STALE_ESTALE;
			else if (strcmp(optarg, "keep") == 0)
				fs.stale = RFS_STALE_KEEP;
			else {
				fuse_opt_free_args(&args);
				return usage_error("--stale wants eio, estale or keep, not",
					optarg);
			}
			break;
		case 'k':
			fs.keep_cache = 1;
			break;
		case 'F':
			fs.flush = 1;
			break;
		case 'r':
			if (parse_rate(optarg, &read_rate) != 0) {
				fuse_opt_free_args(&args);
				return usage_error("--read-rate wants bytes per second (K, M, G: "
						   "KiB, MiB, GiB), at most 1024G, not", optarg);
			}
			break;
		case 'b':
			if (parse_range(optarg, &fs.bad_from, &fs.bad_to) != 0) {
				fuse_opt_free_args(&args);
				return usage_error("--bad-range wants FROM-TO, byte offsets, "
					"FROM below TO (K, M, G: KiB, MiB, GiB), not", optarg);
			}
			break;
		case 'h':
			fuse_opt_free_args(&args);
			usage(stdout);
			return 0;
		default:
			fuse_opt_free_args(&args);
			if (optopt == 'o' || optopt == 't' || optopt == 's' || optopt == 'r' ||
				optopt == 'b')
				return usage_error("option needs a value", argv[optind - 1]);
			return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (argc - optind != 2) {
		fuse_opt_free_args(&args);
		return usage_error(argc - optind < 2 ? "missing BACKING or MOUNTPOINT" :
						       "too many arguments", NULL);
	}
	backing = argv[optind];
	mountpoint = argv[optind + 1];

	if ((fs.root.fd = open(backing, O_PATH | O_DIRECTORY | O_CLOEXEC)) == -1) {
		fprintf(stderr, "remotefs: BACKING %s: %s\n", backing, strerror(errno));
		fuse_opt_free_args(&args);
		return 1;
	}
	errno = 0;
	if (stat(mountpoint, &st) == -1 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "remotefs: MOUNTPOINT %s: %s\n", mountpoint,
			errno != 0 ? strerror(errno) : "not a directory");
		close(fs.root.fd);
		fuse_opt_free_args(&args);
		return 1;
	}
	if (access("/dev/fuse", F_OK) == -1) {
		fprintf(stderr, "remotefs: /dev/fuse: %s (no FUSE here: modprobe fuse?)\n",
			strerror(errno));
		close(fs.root.fd);
		fuse_opt_free_args(&args);
		return 1;
	}
	fs.root.nlookup = 2;
	fs.nbuckets = 1024;
	if ((fs.buckets = calloc(fs.nbuckets, sizeof(struct rfs_inode *))) == NULL) {
		close(fs.root.fd);
		goto nomem;
	}
	if ((err = rfs_throttle_init(&fs.throttle, read_rate)) != 0) {
		fprintf(stderr, "remotefs: cannot set up the read throttle: %s\n", strerror(err));
		free(fs.buckets);
		close(fs.root.fd);
		fuse_opt_free_args(&args);
		return 1;
	}
	pthread_mutex_init(&fs.lock, NULL);
	raise_nofile();

	status = serve(&fs, &args, mountpoint);

	rfs_free_nodes(&fs);
	pthread_mutex_destroy(&fs.lock);
	rfs_throttle_destroy(&fs.throttle);
	close(fs.root.fd);
	fuse_opt_free_args(&args);
	return status;
nomem:
	fuse_opt_free_args(&args);
	fprintf(stderr, "remotefs: out of memory\n");
	return 1;
}
