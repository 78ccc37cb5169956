/*
 * mountrule.h: wcached's rule for mounts inside a model's tree, and for
 * the names a directory model's files are found by (README, "Models in
 * directories others may write in"; review rev202 H1).
 *
 * A neighbour who may add entries to a model's directory (a 1777 drop
 * directory, a 2775 team directory) may mount a FUSE server on a file or
 * directory of his own there (allow_other, where /etc/fuse.conf has
 * user_allow_other), and such a server may never answer an open: the
 * thread that opens the file waits for good, and a work thread of the
 * local share with it. So wcached opens a model's files with
 * RESOLVE_NO_XDEV, and one that crosses a mount only where the mount,
 * told by statx(2) with AT_STATX_DONT_SYNC (its ID; no server asked) and
 * the mount table, is a local filesystem (a shard bind-mounted from
 * another disk, a Kubernetes subPath mount, loads); a directory model's
 * files are found only among names with no remote mount on them.
 */
#ifndef WC_MOUNTRULE_H
#define WC_MOUNTRULE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "fstype.h"

/*
 * A run of walks by one thread (a poll of a model's paths, a sync of its
 * watches, a warm restart's check of a generation): the mount table read
 * once and asked at each mount crossed (read again only when the kernel
 * says the mounts changed: fstype.h's fs_table), and the last directory a
 * path was walked to, from which a path in it is walked by its last name
 * alone (a poll of 163 shards walks their directory from "/" once, not
 * 163 times). That directory was judged when it was walked to; what is
 * walked from it is judged as ever. Not for paths whose directory must be
 * looked at afresh (a second look after a change): a new run for those.
 *
 * A run may have a budget (max_steps, max_links; 0: none), for a look
 * made of many walks (an operator's load's look at the place its path
 * names): the names its walks look up (each an openat and a statx) and
 * the links they follow are counted across all of them, and a walk that
 * would go past either ends with -ELOOP, spent set, as does every walk of
 * the run after it (review rev212 M2: a neighbour's links made one look
 * minutes of walks, each within its own 40 links).
 */
struct mountrule_walk {
	struct fs_table table;
	char *dir;    /* the last directory walked to, as the path named it, or NULL */
	int dir_fd;   /* its O_PATH descriptor, -1 */
	int dir_links; /* the links followed on the way to it */
	int dir_crossings; /* the mounts crossed on the way to it */
	long steps;     /* the names the run's walks looked up, in all */
	int links;      /* the links they followed, in all */
	long max_steps; /* the budget: 0, or the most steps */
	int max_links;  /* 0, or the most links */
	bool spent;     /* a walk went past the budget: the run walks no more */
};

/* An empty run, with no budget; mountrule_walk_end() ends one (closes and
 * frees what it holds; safe twice). */
void mountrule_walk_init(struct mountrule_walk *w);
void mountrule_walk_end(struct mountrule_walk *w);

/*
 * A model's configured path, walked one name at a time (links followed,
 * as the kernel would, at most 40, however long their text grows; none on
 * procfs, whose magic links lead where their text does not say: refused,
 * EXDEV, review rev207 H2, H3) without looking anything up in a
 * FUSE filesystem a user mounted (fstype.h's user_mount; fusermount3: a
 * neighbour may mount one on any directory he may write, the model's own
 * directory or one above it included, or on a file of his that a link he
 * renamed in leads to;
 * its server may never answer): each mount crossed is judged from its
 * mount ID (statx AT_STATX_DONT_SYNC of the walk's own descriptor: no
 * server asked; its device on kernels before 5.8) and the mount table
 * before anything on it is looked up (review rev205 H1, H2), at most 64
 * of them (mountrule.c's WALK_CROSSINGS) for the whole path, in a run as
 * on its own (the run's walk to its directory and that of its last name
 * count together: review rev212 L1). root's own FUSE and network mounts,
 * and wcached's user's, are walked as stat(2) walks them.
 * mountrule_open: an O_PATH descriptor of what path names; -EXDEV with
 * why set (one line naming the path, the name on the mount, the mount and
 * the reason) where a user's FUSE mount is met; else -errno as open(2)
 * would fail, or the walk's own (above; a mount table that cannot be
 * read; -ELOOP past the run's budget). The load, --check, the poll, the
 * watch (its arming and its stat), an operator's load's look at the place
 * (place_of) and the restore checks take any error as the answer and look
 * the path up by name no further: what the walk did not reach it did not
 * judge (review rev207
 * H2, rev208 H1, H3). A mount whose ID the mount table does not list is
 * refused: it is gone, unmounted or detached (umount -l) since the walk
 * stepped onto it (rev208 H2). w: the run it is part of, or NULL for a
 * walk of its own.
 * mountrule_stat: stat(2) of path, by the walk and fstat(2) of that very
 * file (no second walk a link could be renamed into): 0, or -1 and errno
 * (EXDEV for a user's FUSE mount, why set; why may be NULL, len 0).
 */
int mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);
/* Room for why (the path, the name on the mount, the mount): as much as
 * an error message (base/error.h's ERROR_MAX) and a log line carry. */
#define MOUNTRULE_WHY 1024
int mountrule_stat(struct mountrule_walk *w, const char *path, struct stat *st, char *why,
	size_t len);

/*
 * A walk a caller makes by hand, one name at a time (registry_links.c's
 * walk of a model's path, which reads each link it meets itself and hands
 * each to its own judge; stage_dir.c's walk of stage_dir, which refuses
 * the first remote mount on the way), judged as mountrule_open's walk is:
 * each name it opens (mountrule_hand_open: O_PATH | O_NOFOLLOW, ".." too)
 * is stepped onto before anything on it is looked up (an fstat(2) of a
 * user's FUSE mount asks his server, which may never answer: review
 * rev216 H2). The hand holds what each such walk holds: run, its mount
 * table (read at the first mount crossed); path, the path walked (for
 * why); crossings, the mounts crossed so far (at most 64, as for
 * mountrule_open); dir, the O_PATH descriptor of the directory the walk
 * stands in, and dev its device; the text still to walk (the path, a
 * link's text spliced in where one is followed); where, the walk's
 * spelling of dir ("/" for the root, "" for the working directory), for
 * messages; fs, where the caller sets it (NULL: not asked), the
 * filesystem of the directory the walk starts, or starts again, from
 * ("unknown", local, where the mount table does not say).
 */
struct mountrule_hand {
	struct mountrule_walk run;
	const char *path;
	struct fs_info *fs;
	int crossings;
	int dir;
	dev_t dev;
	char *todo;
	const char *rest;
	char where[PATH_MAX];
};

/* h (path and fs set) started at "/", or at the working directory for a
 * relative path: 0, or -errno. mountrule_hand_end() ends it, its start
 * failed or not (closes and frees what it holds). */
int mountrule_hand_start(struct mountrule_hand *h);
void mountrule_hand_end(struct mountrule_hand *h);
/* The next name of what h has left to walk ("." skipped) in name (room
 * for NAME_MAX + 1): 1, 0 where the text ends, -ENAMETOOLONG. */
int mountrule_hand_next(struct mountrule_hand *h, char *name);
/* name (".." too) opened in h's directory, O_PATH | O_NOFOLLOW, and
 * stepped onto: its descriptor (owned) with *dev its device where it is
 * on the same mount, or on one that mountrule_open's walk would cross,
 * and *on (on NULL: not asked) the filesystem of the mount crossed (left
 * alone where none is: its device is h->dev); -EXDEV with why (one line
 * naming h->path, name, the mount and the reason) where it would not (a
 * user's FUSE mount, one gone from the table or that cannot be judged,
 * past 64 crossings); -errno where openat or statx fails. */
int mountrule_hand_open(struct mountrule_hand *h, const char *name, dev_t *dev,
	struct fs_info *on, char *why, size_t len);
/* The walk of h goes into fd (owned now), name's, of device dev: h's
 * directory, where spelled as mountrule_hand_spell spells name. */
void mountrule_hand_into(struct mountrule_hand *h, int fd, dev_t dev, const char *name);
/* The link whose text is text followed: the text, then what is left, to
 * walk, from h's directory or, for an absolute text, from "/" again
 * (h->fs told again where set). 0, or -errno. */
int mountrule_hand_follow(struct mountrule_hand *h, const char *text);
/* name spelled in the directory h stands in (".." that directory's
 * parent), in buf of len bytes. */
const char *mountrule_hand_spell(const struct mountrule_hand *h, const char *name, char *buf,
	size_t len);

/*
 * The real path of what path names, as realpath(3) gives it, without
 * looking anything up by name: the walk (mountrule_open, in the run w or
 * one of its own), then the kernel's name for the file its descriptor
 * holds (readlink(2) of /proc/self/fd/N: no lookup, no server asked; a
 * realpath(3) of the path after its walk looked it up again, name by
 * name, where a neighbour may have renamed a link to his FUSE mount in
 * since, and a thread waited on his server for good), taken only where
 * the descriptor's mount is attached: statmount(2) finds it in this
 * namespace (Linux 6.8), or else its mount ID (statx STATX_MNT_ID,
 * AT_STATX_DONT_SYNC) is in the mount table (w's; NULL: one read for the
 * call), and where a judged walk of that name (in the same run) reaches
 * the descriptor's own file, its device and inode (review rev217 M3: a
 * file reached through a bind mount of a subdirectory and moved out of
 * it is on an attached mount, and the kernel names it "/"; the second
 * walk costs about what the first does). A malloc'd string; or NULL with
 * errno: the walk's error (EXDEV with why set, as mountrule_open sets
 * it), ENAMETOOLONG where the name
 * does not fit PATH_MAX, ENOENT where the kernel says the file was removed
 * (its name ends " (deleted)": one whose own name ends so counts as
 * removed too) or gives no path ("anon_inode:...": not "/..."), or where
 * the mount table does not list its mount: one detached since the walk
 * (umount -l), or another namespace's, whose files the kernel names from
 * that mount's own root, "/llama/model.safetensors", a path here that is
 * not the file (review rev215 L1), or where the walk of the name reaches
 * another file or none; the table's -errno where it cannot be
 * read; why set for those too. On kernels before 5.8, which give no mount
 * ID, the name is taken as the kernel gives it (a device cannot tell a
 * detached mount: README, "Not yet safe").
 * mountrule_fd_realpath: the same for a descriptor a walk gave (the
 * load's own, before it closes it), in the run w (NULL: none).
 * mountrule_fd_name: mountrule_fd_realpath, but a removed file's name is
 * given too, its " (deleted)" taken off and *removed set (false where it
 * was not), not walked: the path it was removed from (a warm restart's
 * stored staged copy removed since, found under stage_dir by that name).
 */
char *mountrule_realpath(struct mountrule_walk *w, const char *path, char *why, size_t len);
char *mountrule_fd_realpath(struct mountrule_walk *w, int fd, const char *path, char *why,
	size_t len);
char *mountrule_fd_name(struct mountrule_walk *w, int fd, const char *path, bool *removed,
	char *why, size_t len);

/*
 * The path under dir of the file fd holds, found by its identity, not
 * by the kernel's name for it: that name's last depth names (the only
 * part of it used; it may be another mount namespace's, whose mounts are
 * detached here, or a removed file's) joined to dir, walked in the run w
 * (NULL: one of its own), and taken only where the walk reaches fd's own
 * file (st_dev, st_ino). For a descriptor a previous process stored: each
 * start of wcached.service has a mount namespace of its own (review
 * rev217 M1). A malloc'd string; or NULL with errno (ENOENT: not there,
 * ESTALE: another file is, or the walk's).
 */
char *mountrule_fd_under(struct mountrule_walk *w, int fd, const char *dir, unsigned depth);

/* Sets tree.h's tree_mounts and shards.h's shards_name_rule to wcached's
 * rule (the name rule's run: the listing's mount table, a struct fs_table
 * read once per listing, review rev208 M3). Once, at start. */
void mountrule_install(void);

#endif
