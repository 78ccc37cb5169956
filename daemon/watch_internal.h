/*
 * watch_internal.h: what the watch module's files share: watch.c (inotify
 * on the models' directories) and watch_poll.c (polling the paths of models
 * on remote filesystems, where inotify sees nothing another host does).
 */
#ifndef WC_WATCH_INTERNAL_H
#define WC_WATCH_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <uv.h>

#include "lograte.h"
#include "watch.h"

struct synced;

struct watched_dir {
	int wd;
	char *path;
};

/* A model whose paths are polled (watch_poll.c). */
struct polled {
	char *name;
	uint64_t entry_id;     /* the model entry it was made for */
	uint64_t due_ms;       /* next poll, loop time */
	int busy;              /* a poll of it runs on the work queue */
	uint64_t generation;   /* the generation the baseline below is of */
	uint64_t dir_sig;      /* the model's own path's stat at its load (0: not yet) */
	uint64_t last_sig;     /* what the previous poll saw, to tell a file still moving */
	uint64_t acted_sig;    /* what the last reload was asked for */
	int changing;          /* the last poll saw a change not yet acted on */
	int said_changing;     /* "is still changing" was logged for that change */
	int failing;           /* errno of the last stat that failed for a reason
				  other than "no such file" (logged once), or 0 */
};

/*
 * A model to reload (struct watch's dirty list): when WATCH_SETTLE_MS pass
 * without an event for it, so a burst becomes one reload, but never later
 * than WATCH_SETTLE_MAX_MS after its first event, so a file rewritten without
 * pause is still looked at. Events for other models never move its deadline.
 */
struct dirty_model {
	char *name;
	uint64_t first_ms;      /* loop time of its first event since its last reload */
	uint64_t due_ms;        /* loop time its reload is asked for */
	bool lost;              /* marked only because inotify lost events */
	bool relink;            /* asked by watch_revalidate alone (its line said so) */
};

/*
 * What watch.c remembers of a model's watched reloads between them (struct
 * watch's paced list): how many came of late, and its swaps, for the
 * backoff watch.h describes. Dropped once the model's files are quiet for
 * WATCH_QUIET_MS and its swaps' count is over (WATCH_SWAPS_MS), or the
 * model is gone.
 */
struct paced_model {
	char *name;
	uint64_t entry_id;    /* the model entry it was made for */
	uint64_t window_ms;   /* loop time the reloads counted below began */
	unsigned reloads;     /* watched reloads since window_ms */
	uint64_t reload_ms;   /* loop time of its last watched reload */
	uint64_t event_ms;    /* loop time of its last event */
	uint64_t delay_ms;    /* 0, or the least time from one reload to the next */
	uint64_t swaps_ms;    /* loop time the swaps counted below began */
	unsigned swaps;       /* swaps since swaps_ms (WATCH_BURST_SWAPS) */
	struct lograte lines; /* its "reloading" lines while delay_ms is not 0 */
	/* loop time its last revalidation (watch_revalidate) is due; 0: none */
	uint64_t relink_ms;
	uint64_t relink_delay_ms; /* 0, or the least time from one revalidation to the next */
};

struct watch {
	struct registry *reg;
	uv_loop_t *loop;
	int fd;
	uv_poll_t poll;
	uv_timer_t settle;     /* runs until the earliest due_ms of dirty */
	uv_timer_t poll_timer; /* runs while some model is polled */
	uv_timer_t writer_timer; /* runs while some model waits for a writer */
	int handles; /* open libuv handles, for freeing */
	int stopping;
	struct watched_dir *dirs;
	size_t ndirs;
	struct dirty_model *dirty; /* models to reload, in no order */
	size_t ndirty;
	struct paced_model *paced; /* models reloaded of late, in no order */
	size_t npaced;
	struct polled *polled;
	size_t npolled;
	struct synced *synced; /* each model's watches (watch.c) */
	size_t nsynced;
	unsigned jobs; /* sync and poll jobs on the work queue, and watched reloads
			  not answered yet (watch.c's reload_done); freed at 0 */
	/* Events read before their sync job's end noted their directory
	 * (record_dir): a sync job arms a watch on the work queue, and the
	 * loop may read its first events before the job's end is run. Those
	 * were of no known directory; the end reloads a model whose new watch
	 * had one naming its files (watch.c's stray_event). A ring. */
	struct stray_event {
		int wd;
		char name[NAME_MAX + 1];
	} stray[16];
	size_t nstray;
	uint64_t overflows;        /* inotify queue overflows (events lost) */
	uint64_t overflow_log_ms;  /* loop time of the last line about them */
	uint64_t overflows_logged; /* overflows that line counted */
};

/* watch.c: reloads the model name after WATCH_SETTLE_MS without another call
 * for it, and at most WATCH_SETTLE_MAX_MS after the first. */
void watch_mark_dirty(struct watch *w, const char *name);

/* watch.c: frees w once watch_stop() closed its handles and no poll job
 * is left on the work queue. */
void watch_free_if_idle(struct watch *w);

/* watch_poll.c: keeps the polled list in step with the models (from
 * watch_sync), and frees it. Every model is polled once
 * reg->inotify_failed is set, whatever its watch says. */
void watch_poll_sync(struct watch *w);
void watch_poll_free(struct watch *w);

/* watch_poll.c: a digest of what a stat saw (err, else the file's
 * identity, size, mtime and ctime): two stats of a path that differ here
 * say it changed, for a poll and for a directory's first watch alike. */
uint64_t watch_stat_sig(int err, const struct stat *st);

#endif
