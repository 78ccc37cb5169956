/*
 * watch.h: noticing model files change, without polling.
 *
 * One inotify descriptor watches the directory of every model's path (and
 * the path itself when it is a directory). Two kinds of change matter:
 *  - a name of the model appears, by rename(2) or creation (a new file
 *    renamed over the path, a new shard, a directory swapped): the model is
 *    reloaded after a short quiet period on its own files, so a burst of
 *    renames becomes one reload, but never more than WATCH_SETTLE_MAX_MS
 *    after the first (events on other models delay nothing), and the new
 *    files become generation N+1 when valid and warm;
 *  - a served file is written in place (size or mtime no longer match what
 *    was opened): that generation is marked modified at once.
 * Should reading the inotify descriptor fail for good (an error but EAGAIN
 * and EINTR), it is not read again: one warning, and every model's paths
 * are polled from then on instead (watch_poll.c).
 */
#ifndef WC_WATCH_H
#define WC_WATCH_H

#include <uv.h>

#include "registry.h"

struct watch;

/* Milliseconds of quiet after a model's last event before reloading it. */
#define WATCH_SETTLE_MS 100
/* The longest a model's reload waits after its first event, however often
 * its files change meanwhile. */
#define WATCH_SETTLE_MAX_MS 1000

/*
 * Backoff, per model: a model whose files keep changing (a touch, chmod or
 * rewrite in a loop by whoever may write them) is not reloaded once per
 * settle time for ever. After more than WATCH_BURST_RELOADS watched reloads
 * within WATCH_BURST_MS, each further reload waits at least twice the settle
 * time after the one before, twice as long again at each reload, up to
 * WATCH_BACKOFF_MAX_MS; once the model's files are quiet for WATCH_QUIET_MS,
 * its reloads wait the settle time alone again. A change is never lost to
 * it: the reload still comes, later. One line says when it begins, and the
 * "reloading" line is logged at most once a minute (lograte.h) meanwhile.
 * A reload counts by what it did, once answered, whatever events asked for
 * it: every one (files unchanged, refused, the same inodes loaded again)
 * but one whose new generation serves other inodes than the generation
 * made before it (a swap: registry.h's new_inodes), an update as an
 * operator's reload would load, which does not count, though it waits out
 * a backoff begun, and starts the count over. Reloads after lost events
 * never count.
 *
 * Swaps are counted apart, and more loosely: up to WATCH_BURST_SWAPS in
 * WATCH_SWAPS_MS (one every 10 s on average) a model is updated at the
 * settle time each; each swap past them counts as a reload does, and
 * begins (one line says so) or lengthens the backoff, so that a loop of
 * swaps (two files of the owner's renamed over the path in turn) makes a
 * generation at most every WATCH_BACKOFF_MAX_MS, not one per settle time
 * with its lines and its warm-up's reads (review rev197 W3). While the
 * model is backed off its swaps' count goes on past WATCH_SWAPS_MS.
 */
#define WATCH_BURST_RELOADS 5
#define WATCH_BURST_MS 10000
#define WATCH_BACKOFF_MAX_MS 30000
#define WATCH_QUIET_MS 10000
#define WATCH_BURST_SWAPS 60
#define WATCH_SWAPS_MS 600000

/*
 * A watched reload that found a file open for writing made no generation
 * (registry_load.c's find_writer; the model's writer_path): that file is
 * asked again every WATCH_WRITER_MS (registry_writer_gone, a read lease
 * given back at once, on a descriptor wcached kept of it) and the model is
 * reloaded once no writer is left, as at a writer's close: whatever
 * directory the file is in (a directory swapped in by a link, not watched
 * before its generation loads; a file behind a link), whether the model is
 * watched or polled (a close changes nothing a poll sees), and whatever
 * events inotify gives.
 */
#define WATCH_WRITER_MS 500

/*
 * A served file whose link count and ctime alone moved (file_links_moved:
 * a hard link added or removed beside it, or a write with its mtime put
 * back hidden behind one) has its model reloaded, its files loaded again
 * and validated anew (watch_revalidate): WATCH_SETTLE_MS after the first;
 * a further one within WATCH_RELINK_QUIET_MS of the one before waits
 * WATCH_RELINK_MIN_MS after it, twice as long at each, up to
 * WATCH_RELINK_MAX_MS, so that a neighbour's ln/rm loop costs one header
 * read per minute. Once quiet that long, the next waits the settle time
 * again. One line says when the pacing begins.
 */
#define WATCH_RELINK_MIN_MS 5000
#define WATCH_RELINK_MAX_MS 60000
#define WATCH_RELINK_QUIET_MS 60000

/* Starts watching; call watch_sync() whenever models come or go. */
int watch_start(uv_loop_t *loop, struct registry *r, struct watch **out);

/* Adds watches for every model's directories and drops unused ones. */
void watch_sync(struct watch *w);

/* Checks every served file against fstat now (also done on each event). */
void watch_check_modified(struct watch *w);

/* Reloads the model name to load its files again, validated anew, after
 * a links-only move of one (the registry's relinked hook), paced as
 * WATCH_RELINK_MIN_MS says. */
void watch_revalidate(struct watch *w, const char *name);

/* The delay, in ms after now, of the revalidation watch_revalidate asks
 * now, given its last one's due time (0: none) and delay (updated); the
 * pacing above, apart for tests. */
uint64_t watch_relink_delay(uint64_t now, uint64_t *last_ms, uint64_t *delay_ms);

/* Stops; memory is freed from libuv close callbacks. Accepts NULL. */
void watch_stop(struct watch *w);

#endif
