/*
 * registry_internal.h: what the registry's files share: registry.c (the
 * model table, attaching, unloading), registry_load.c (the load pipeline),
 * registry_links.c (the walk of a model's path and its links),
 * registry_sweep.c (stage_dir and its start-up sweep) and
 * registry_budget.c (the memory budget, pins, evictions, residency
 * checks). Not for other modules: they use registry.h, and generation.h
 * where they read a generation.
 */
#ifndef WC_REGISTRY_INTERNAL_H
#define WC_REGISTRY_INTERNAL_H

#include <sys/stat.h>

#include "generation.h"
#include "mountrule.h"
#include "registry.h"

/* How many retired generations of one model may always stay open
 * (attached, or held otherwise); past it a reload waits for one to close
 * when their descriptors pass an eighth of RLIMIT_NOFILE (r->fd_limit), or
 * every model's half (retired_full): bounds the descriptors and locked
 * metadata one model's attaches keep. A reload that waits is queued
 * (reload_again) with one warning and answered -EBUSY. */
#define REGISTRY_RETIRED_MAX 4

/* registry_reload_held's released for a call after a retired generation
 * closed or was released: the reload that waited for it says so. */
#define RELOAD_RELEASED "an older generation was released"

/* ... after a generation closed (its descriptors released): also runs a
 * load refused for descriptors (model_entry's room_wait). */
#define RELOAD_CLOSED "a generation closed, releasing its descriptors"

/* registry_load.c: runs m's reload that waited (reload_again), if any,
 * once no load of m is in flight: queued when its retired generations
 * leave room (retired_full), else it waits on, with the one warning when
 * it starts waiting for room (released NULL: it waited for a load or a
 * warm restart's check); released (RELOAD_RELEASED, RELOAD_CLOSED) names
 * why it may have room now, in the line of the reload it starts; with
 * RELOAD_CLOSED a load refused for descriptors runs again too (room_wait).
 * Loop thread. */
void registry_reload_held(struct registry *r, struct model_entry *m, const char *released);

/* registry_load.c: m waits for no writer any more (model_entry's
 * writer_fd, closed in the closer's local lane, and writer_path). */
void registry_forget_writer(struct registry *r, struct model_entry *m);

/* registry.c: the model called exactly name, or NULL. */
struct model_entry *registry_entry_named(struct registry *r, const char *name);

/* registry.c: adds the model name, not yet served, with its status slot,
 * in *out. 0, or -ENOMEM, or -ENOSPC when the status page has no slot
 * left (the message in error_get()). */
int registry_entry_new(struct registry *r, const char *name, const char *path,
	enum pin_mode pin, int warm, struct model_entry **out);

/* registry.c: puts g in the registry's list as a generation of m, and
 * keeps m's and its status slot's last generation number, and m's
 * inodes_digest and new_inodes (registry.h). */
void registry_link(struct registry *r, struct model_entry *m, struct generation *g);

/* registry_budget.c: generation.c's pages_ended hook: answers m's
 * registry_pages_wait requests once none of its generations has page work
 * left. */
void registry_pages_ended(struct registry *r, struct generation *g);

/* registry_budget.c: answers m's registry_pages_wait requests with
 * -ECANCELED (m is being unloaded). */
void registry_pages_cancel(struct model_entry *m);

/* registry_load.c: withdraws m's load from the work queue if it still
 * waits for its turn there, why its answer (-ECANCELED, on the loop soon
 * after, never from this call); a load that started ends as it will. */
void registry_withdraw_waiting_load(struct registry *r, struct model_entry *m, const char *why);

/* registry_load.c: the stagings held for the start-up sweep (held, linked
 * through their own link, in the order they came) go on once it ends: to
 * the work queue, or answered as cancelled when cancelled is set (the
 * sweep never ran) or wcached is stopping. Loop thread. */
void registry_stage_held(struct registry *r, struct load_request *held, int cancelled);

/* registry_sweep.c: while the start-up sweep runs, holds the staging q
 * until it ends (q_next: q's own link, which the list goes through):
 * returns the stage_dir it sweeps; NULL when no sweep runs (q not
 * held). Loop thread. */
const char *registry_sweep_hold(struct registry *r, struct load_request *q,
	struct load_request **q_next);

/* The most symbolic links one walk of a model's path follows (the
 * kernel's own limit, MAXSYMLINKS): a longer chain is -ELOOP. */
#define REGISTRY_LINK_HOPS 40
/* The most entries one walk records: its links, and as many directories it
 * bound (registry_link_judge). */
#define REGISTRY_WALK_SEEN ((size_t)2 * REGISTRY_LINK_HOPS)

/* A symbolic link the walk of a model's path met (registry_walk_links):
 * its path and the directory's as the walk spelled them, its text, its
 * fstat (st_uid: its maker) and the fstat of the directory holding it.
 * Or a directory the path goes into or ends at: target "" (no link's text
 * is empty), st its fstat (review rev199 H3). */
struct registry_link_seen {
	const char *path;
	const char *dir;
	const char *target;
	const struct stat *st;
	const struct stat *dir_st;
};

/* Whether the walk follows the link l: 0, or a negative code that ends
 * the walk with it. For a directory (target ""): 0, 1 to record it among
 * the walk's links (bound: a later load's walk may ask it be the same),
 * or a negative code. */
typedef int (*registry_link_judge)(const struct registry_link_seen *l, void *arg);

/* What registry_walk_links found: the links it followed, in the order
 * met, and among them the directories its judge bound (text ""); the
 * fstat of the inode the path ends at (no link) and of the directory
 * holding it (the end itself where the path ends at a directory it named
 * as "/", "." or ".."). */
struct registry_walk {
	struct gen_link links[REGISTRY_WALK_SEEN];
	size_t nlinks;
	size_t nhops; /* how many are links: at most REGISTRY_LINK_HOPS */
	struct stat end;
	struct stat end_dir;
	/* A walk that failed (-errno, not its judge's code): the directory
	 * it stood in when it stopped (the one holding the entry it could not
	 * take), its fstat and spelling; stopped 0 when it stopped nowhere
	 * (it could not start). */
	int stopped;
	struct stat stop_dir;
	char stop_where[PATH_MAX];
	/* A walk that met a mount mountrule_open's walk would not cross (a
	 * user's FUSE mount, one that cannot be judged: -EXDEV, its judge not
	 * asked): refused 1, why its line (naming the path, the name on the
	 * mount, the mount and the reason), stop_dir the directory holding
	 * that name (review rev216 H2). */
	int refused;
	char why[MOUNTRULE_WHY];
};

/* registry_links.c: walks path component by component from "/" (the
 * working directory for a relative one), each opened beneath the one
 * before with no link followed; each symbolic link met (on the path, or
 * where a link's text leads) is handed to judge (when not NULL) with arg,
 * then followed by its text, read from the link itself; each directory
 * entered or ended at is handed to judge too (target ""). 0 with *w filled,
 * judge's code, -ELOOP past REGISTRY_LINK_HOPS links (or past as many bound
 * directories), -EXDEV with w->refused set where it would step onto a
 * mount mountrule_open's walk does not cross (each name's mount judged,
 * mountrule_hand_open, before anything on it is looked up: an fstat(2) asked
 * the server of a neighbour's FUSE mount met, which may never answer), or
 * -errno (an entry missing, not a directory, not searchable). Work queue
 * thread. */
int registry_walk_links(const char *path, registry_link_judge judge, void *arg,
	struct registry_walk *w);

/* Whether path (a real path) names an entry straight in the directory
 * root, not root itself (a one-file model's path named its file). */
int registry_file_in(const char *path, const char *root);

#endif
