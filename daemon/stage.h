/*
 * stage.h: staging, copying a model's files to local disk before they are
 * served (README, "Models on shared storage"; the stage and stage_dir keys).
 *
 * On a network or FUSE filesystem another host may replace a model file,
 * and this host's reads of the old file's uncached pages then fail (ESTALE,
 * EIO): a worker touching one through its mapping gets SIGBUS. A staged
 * generation serves a copy in stage_dir instead, which nobody but wcached
 * writes and which lives as long as the generation does.
 *
 * A copy is stage_dir/<model>.<generation>/ holding each file under its own
 * name (a model's files are plain names of one directory, as its index
 * records them): the single file, or a shard index and its shards. It is
 * written under a temporary name (.<model>.tmp-<token>-XXXXXX, the token a
 * random number each process draws once, never its pid, which repeats) and
 * renamed into place only when every byte is copied and every source is
 * still what it was when it was opened (size, mtime, and the inode its
 * path names): a partial copy never serves, and one from a crashed daemon
 * is removed at start (stage_sweep). A copy keeps its source's mtime, so a warm restart
 * can tell whether the source changed while the daemon was down.
 *
 * wcached removes only what it made. Before anything else goes into a copy
 * (temporary or not) it gets its marker, STAGE_MARKER, a regular file of
 * wcached's user; a directory of stage_dir without one (a symbolic link,
 * another user's, one an operator or another program made, one an older
 * wcached made) is never emptied, whatever its name: the sweep and
 * stage_remove() leave it with one line naming it. Removal works through
 * descriptors, never following a symbolic link inside stage_dir. And a
 * stage_dir another user may write (not owned by wcached's user, or
 * writable by its group or others) is refused for staging, sweeping and
 * removing alike: its entries could be swapped under a removal.
 *
 * stage_copy() and stage_remove() block (gigabytes of I/O): call them on a
 * work queue thread, never on the loop; stage_remove_later() queues the
 * removal on libuv's work queue from the loop. A removal that a stop may
 * cut short (stage_remove_until_stop(), stage_remove_later()) leaves the
 * rest, marked, to the next start's sweep. Nothing here calls another
 * daemon module but log, fstype (a read error on a network filesystem
 * is said to be maybe another host's) and mountrule (the model's path and
 * its sources' are looked at by its judged walk, never by name: a user's
 * FUSE mount met on the way fails the staging with the walk's line); errors
 * are -errno with the message in error_get().
 */
#ifndef WC_STAGE_H
#define WC_STAGE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "base/file.h"

/* The marker of a copy wcached made (above): a regular file of wcached's
 * user inside it, written first. Not a name a model file can have: it ends
 * in none of a model's suffixes. */
#define STAGE_MARKER ".wcached-copy"

/* Bytes of free space staging a model of bytes requires in stage_dir:
 * the model's, plus 1% and 64 MiB for the filesystem's own metadata and
 * whatever else writes there meanwhile. */
uint64_t stage_space_needed(uint64_t bytes);

/* One staging: what to copy (in), what was made (out). */
struct stage_request {
	const char *stage_dir;     /* absolute */
	const char *model;         /* the model's name (a config name: no '/') */
	uint64_t number;           /* the generation it becomes, for the name */
	const char *model_path;    /* the configured path: a file, shard index or directory */
	const struct wc_file *files; /* the source's files, open, in index order */
	size_t nfiles;
	const struct stat *index_st; /* the shard index validated (fstat at its open:
				      model_source's index_st), or NULL: none */
	const int *cancel;         /* read atomically: nonzero stops the copy (-ECANCELED):
				      wcached is stopping; it stops the removal
				      of the unfinished copy too */
	int cancelled;             /* stage_cancel(): this staging is no longer wanted */
	/* Out, on success (stage_request_clear frees them): */
	char *dir;                 /* the staged directory, stage_dir/<model>.<number> */
	char *path;                /* the model's path inside it, for source_open() */
	uint64_t bytes;            /* bytes copied */
	uint64_t disk_bytes;       /* bytes the copy occupies on disk (st_blocks) */
	double seconds;            /* the copy's wall time */
};

/*
 * Copies the model's files (req->files, and a sharded model's index found
 * from model_path, which must name exactly req->files' shards in their
 * order, and be the file validated, req->index_st: an index replaced since
 * the model was validated, or one found where none was, is refused) into
 * a new directory under stage_dir: checks the free
 * space first, creates stage_dir (0700) if missing, copies with
 * copy_file_range(2) (sendfile(2), then read/write where the kernel
 * refuses), checks each source against its stat at open (about once a
 * second while it copies, so that one replaced early stops a long copy
 * early, and again at the end), and renames the copy into place. Work
 * queue thread. 0 with req's outputs, or -errno with a message saying why
 * in a sentence an operator can act on (no space: needed
 * and free; stage_dir not writable; a read error such as EIO or ESTALE,
 * named; a source changed during the copy); nothing is left behind then,
 * unless wcached stops while the unfinished copy is removed: what is left
 * of it, marked, is the next start's sweep's.
 */
int stage_copy(struct stage_request *req);

/*
 * Stops req's stage_copy() at its next 8 MiB request, or before it starts
 * (-ECANCELED, nothing left behind, nothing of the source looked at: a
 * staging cancelled while it waited on the work queue makes no round trip
 * to a server that may hang): for a staging its model no longer
 * wants, superseded by a newer load or ended by an unload, which would
 * otherwise copy gigabytes only to have them removed. Any thread, while
 * stage_copy(req) runs or before it does (an atomic store; req stays the
 * caller's and must outlive the copy). The cancel pointer still counts.
 */
void stage_cancel(struct stage_request *req);

/* Frees req's outputs (not the copy on disk). */
void stage_request_clear(struct stage_request *req);

/*
 * Removes the staged directory dir (an entry of stage_dir): its files,
 * then itself, when it is a copy wcached made (STAGE_MARKER in it, above);
 * never through a symbolic link. Blocking. 0 (a dir that does not exist
 * too), -EPERM when dir is not wcached's copy or stage_dir is not safe
 * (left alone; the message names it and why), or -errno (the message
 * names what could not be removed).
 */
int stage_remove(const char *dir);

/*
 * stage_remove() that reads *stop (atomically; stop may be NULL) before
 * each file of the copy, as the sweep does: once set (wcached stops) it
 * removes no more and returns -ECANCELED with a message saying the next
 * start removes what is left (the copy keeps its marker, so the next
 * start's sweep does). Blocking, for a work queue thread that removes a
 * copy itself: libuv's loop waits for its work queue before it ends, and a
 * removal of 163 shards on a slow stage_dir would otherwise hold a stop for
 * every unlink.
 */
int stage_remove_until_stop(const char *dir, const int *stop);

/*
 * stage_remove_until_stop() of dir on libuv's work queue, logged; takes dir
 * (malloc'd). Loop thread. Falls back to removing at once when the queue
 * refuses. *stop (stop may be NULL, and must outlive the removal) is read
 * before each file of the copy; once set (wcached stops) it removes no
 * more and logs one line saying the next start removes what is left. That
 * start sweeps swept, the stage_dir configured now: a copy that is not
 * directly in it (stage_dir changed since it was made) is removed whole
 * whatever stop says, since no sweep would visit what a stop left of it.
 */
void stage_remove_later(uv_loop_t *loop, char *dir, const int *stop, const char *swept);

/*
 * Creates stage_dir if missing (mode 0700; as root, its parents 0755) and,
 * when uid is not (uid_t)-1, gives the directory it created to uid:gid (as
 * root, before privileges are dropped). An existing stage_dir must already
 * be the user's that wcached runs as (uid, else the effective uid) and not
 * writable by its group or others: it is never given away or changed.
 * 0, or -errno with one line naming the directory and why.
 */
int stage_prepare_dir(const char *stage_dir, uid_t uid, gid_t gid);

/*
 * Is stage_dir on a local filesystem? wcached looks it up by name on its
 * event loop (a warm restart finds each stored copy there by identity,
 * restore_check.c's fd_path; a reload prepares it), and on a network or
 * FUSE filesystem a server that hangs would hold the loop, every client
 * with it; a copy there would also be no local copy. stage_dir's path is
 * walked by hand, one name at a time, links followed as the kernel follows
 * them, and each mount the walk would cross is judged before anything on
 * it is looked up (statx AT_STATX_DONT_SYNC of the walk's descriptor: its
 * mount ID, told by the mount table; mountrule_hand_open: a user's FUSE mount
 * or one gone is refused, EXDEV): the first network or FUSE mount on the
 * way (root's too, and where a link leads) is refused, its server never
 * asked (review rev221 M1: a local mount beneath it is looked up through
 * it). The mount the walk starts on ("/") is judged only where the walk
 * ends on it. Where stage_dir is missing, the walk ends in the directory
 * it would be made in. 0 where every mount is local or cannot be told
 * (the walk failed otherwise: stage_prepare_dir says why); -EREMOTE
 * (-EXDEV) with one line naming stage_dir, the mount on the way and its
 * type as the mount table names it ("fuse.sshfs"), ending with what it
 * costs ("models that must be staged are refused; no staged copies are
 * restored or swept there"). Blocking: at start, --check, and on the work
 * queue (a reload's read, each staging: check_room).
 */
int stage_dir_check_local(const char *stage_dir);

/*
 * The staged directory path is in, when path lies in stage_dir: 1 and *dir
 * (malloc'd, stage_dir/<entry>), else 0. -ENOMEM.
 */
int stage_dir_of(const char *stage_dir, const char *path, char **dir);

/*
 * Removes what earlier processes left in stage_dir: every copy wcached
 * made (named <model>.<number>, possibly with a suffix, or a temporary
 * .<model>.tmp-..., with STAGE_MARKER in it) not among keep (nkeep absolute
 * paths) and not this process's own temporary (named with its token; one
 * named with this process's pid is an earlier process's). Other entries
 * are not touched; one of those names without the marker gets one warning
 * naming it. Refuses (-EPERM, nothing removed) a stage_dir another user may write.
 * Blocking. *removed counts the copies removed. 0, or the first -errno
 * (with the message); it goes on after an error. Before each copy, and
 * before each file of a copy, it reads *stop (atomically; stop may be
 * NULL): once set (wcached stops) it removes no more and returns
 * -ECANCELED with a message saying so (unless a removal failed before:
 * that failure is returned), so that a stop does not wait for every
 * leftover's unlink, nor for every shard of one copy (the next start's
 * sweep removes the rest: a copy cut short keeps its marker).
 */
int stage_sweep(const char *stage_dir, char *const *keep, size_t nkeep, const int *stop,
	unsigned *removed);

/* "EIO", "ESTALE", "ENOSPC" ...: the symbolic name of a few errnos staging
 * reports, or NULL. */
const char *stage_errno_name(int err);

#endif
