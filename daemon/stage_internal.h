/*
 * stage_internal.h: what the stage module's files share: stage.c (copying
 * a model's files to stage_dir) and stage_dir.c (stage_dir itself,
 * removing copies and sweeping it), which both open stage_dir only once
 * it is checked safe, and both remove a copy only through
 * stage_remove_at(). Not for other modules: they use stage.h.
 */
#ifndef WC_STAGE_INTERNAL_H
#define WC_STAGE_INTERNAL_H

#include <sys/types.h>

/*
 * Is the open directory fd (stage_dir, named path) one only owner can
 * change: owned by owner, not writable by its group or others? Anyone who
 * can write stage_dir can put there, or swap in under a removal, what
 * wcached would then remove. 0, or -EPERM (-errno) with the message.
 */
int stage_check_dir(int fd, const char *path, uid_t owner);

/* Opens stage_dir (a symbolic link the operator made of it is followed)
 * and checks it (stage_check_dir, against the effective uid) into *fd. 0,
 * or -errno with the message; -ENOENT when it does not exist. */
int stage_open_dir(const char *stage_dir, int *fd);

/*
 * This process's token, 16 hex digits drawn once (random), that names its
 * temporary copies (.<model>.tmp-<token>-XXXXXX): the sweep leaves those
 * alone and removes every other one. Not the pid: a pid repeats across
 * restarts (in a container wcached is often pid 1 every time), and a
 * crashed staging's copy named with it would never be swept. Any thread.
 */
const char *stage_token(void);

/* What stage_remove_at() did. */
enum stage_removal { STAGE_REMOVED, STAGE_GONE, STAGE_NOT_OURS };

/*
 * Removes the copy name from the directory pfd (stage_dir, called parent
 * in messages) when wcached made it: a directory, not a symbolic link, of
 * wcached's user, holding STAGE_MARKER, a regular file of that user.
 * Never follows a link: the copy is opened with O_NOFOLLOW and its entries
 * unlinked relative to it, the marker last, so that a removal cut short
 * is still wcached's for the next sweep. Before each entry but the
 * marker it reads *stop (atomically; stop may be NULL): once set it
 * removes no more and returns -ECANCELED, no message set, the marker and
 * what is left still there (a copy of 163 shards on a slow disk must not
 * hold a stop for every unlink; a copy whose files are all gone is
 * finished). STAGE_REMOVED, STAGE_GONE (nothing there),
 * STAGE_NOT_OURS (left alone, *why says how it is not ours), or -errno
 * with the message.
 */
int stage_remove_at(int pfd, const char *parent, const char *name, const int *stop,
	const char **why);

#endif
