/*
 * test_stage_sweep.c: unit tests of the start-up sweep of stage_dir as
 * the registry runs it (registry_stage_sweep, daemon/registry_sweep.c),
 * on a real libuv loop and real files (daemonutil.h): the sweep removes
 * what an earlier process left on the work queue, never on the loop
 * thread (a leftover copy may be hundreds of gigabytes: restored and local
 * models must not wait for its unlink), and a staging queued while it
 * runs waits for it to end, then copies; one that waits when wcached
 * stops ends cancelled and copies nothing; a stop ends the sweep between
 * two copies, or two files of one copy, and so the removal of the copy of a
 * generation that closed while serving, of a copy that failed its
 * validation, and of a copy no generation took (its model unloaded).
 *
 * Fault injection (-Wl,--wrap=unlinkat,--wrap=memfd_create in
 * tests/CMakeLists.txt): while a test closes the gate, the removal of a
 * leftover copy's model file (or of the first file of a copy,
 * gate_first_file) waits there on a pool thread (a slow unlink); one on
 * the loop thread is only recorded, so that the code before the fix fails
 * the test instead of hanging it. stop_at_next_file stops wcached during
 * the unlink of a copy's file. A staging's sealing of its copy's index
 * (memfd_create on a pool thread) can wait at the gate or fail.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "base/path.h"
#include "daemonutil.h"
#include "stage.h"
#include "testutil.h"

/* ---- the gate -------------------------------------------------------------- */

#define LEFTOVER_FILE "leftover.safetensors"

static pthread_t loop_thread;
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_closed;
static atomic_int unlinked_on_loop, waiting_at_gate;
/* When set, the gate holds the first file of a copy removed on a pool
 * thread, whatever its name (the marker aside), not LEFTOVER_FILE: the
 * one readdir gives first. */
static atomic_bool gate_first_file;

int __real_unlinkat(int dirfd, const char *path, int flags);
int __wrap_unlinkat(int dirfd, const char *path, int flags);
int __real_memfd_create(const char *name, unsigned flags);
int __wrap_memfd_create(const char *name, unsigned flags);

/* When set, the next removal of a leftover's model file fails (EIO) and
 * marks this registry as stopping, as a stop that comes meanwhile would. */
static struct registry *fail_then_stop;
/* When set, the next removal of a file of a copy (the marker aside) marks
 * this registry as stopping as it unlinks it: a stop during that unlink. */
static struct registry *stop_at_next_file;
/* memfd_create on a pool thread (an index sealed off the loop: a load's,
 * then its staged copy's), counted from 1: the memfd_hold_at-th waits at
 * the gate while it is closed, the memfd_fail_at-th fails (EMFILE). 0:
 * none. */
static atomic_int memfd_on_pool, memfd_hold_at, memfd_fail_at;

/* Waits at the gate while it is closed (at most 20 s: a test that fails
 * must not hang), saying so to wait_at_gate(). Pool threads only. */
static void
hold_at_gate(void)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 20;
	pthread_mutex_lock(&gate_lock);
	atomic_fetch_add(&waiting_at_gate, 1);
	pthread_cond_broadcast(&gate_cond); /* wait_at_gate() */
	while (gate_closed && pthread_cond_timedwait(&gate_cond, &gate_lock, &until) == 0)
		;
	pthread_mutex_unlock(&gate_lock);
}

/* unlinkat(2), held at the gate while it is closed when it removes a
 * leftover copy's model file on a pool thread; on the loop thread it is
 * only counted. */
int
__wrap_unlinkat(int dirfd, const char *path, int flags)
{
	struct registry *stop;

	if (fail_then_stop != NULL && strcmp(path, LEFTOVER_FILE) == 0) {
		__atomic_store_n(&fail_then_stop->closing, 1, __ATOMIC_RELAXED);
		fail_then_stop = NULL;
		errno = EIO;
		return -1;
	}
	if (flags == 0 && strcmp(path, STAGE_MARKER) != 0 &&
		(stop = __atomic_exchange_n(&stop_at_next_file, NULL, __ATOMIC_SEQ_CST)) != NULL)
		__atomic_store_n(&stop->closing, 1, __ATOMIC_RELAXED);
	if (strcmp(path, LEFTOVER_FILE) == 0 ||
		(flags == 0 && strcmp(path, STAGE_MARKER) != 0 &&
			atomic_exchange(&gate_first_file, false))) {
		if (pthread_equal(pthread_self(), loop_thread))
			atomic_fetch_add(&unlinked_on_loop, 1);
		else
			hold_at_gate();
	}
	return __real_unlinkat(dirfd, path, flags);
}

/* memfd_create(2), held at the gate or failed (EMFILE: out of
 * descriptors) as memfd_hold_at and memfd_fail_at ask. */
int
__wrap_memfd_create(const char *name, unsigned flags)
{
	int n;

	if (pthread_equal(pthread_self(), loop_thread))
		return __real_memfd_create(name, flags);
	n = atomic_fetch_add(&memfd_on_pool, 1) + 1;
	if (n == atomic_load(&memfd_hold_at))
		hold_at_gate();
	if (n == atomic_load(&memfd_fail_at)) {
		errno = EMFILE;
		return -1;
	}
	return __real_memfd_create(name, flags);
}

static void
set_gate(bool closed)
{
	pthread_mutex_lock(&gate_lock);
	gate_closed = closed;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
}

/* ---- fixture --------------------------------------------------------------- */

struct sweep_fixture {
	struct du *t;
	char *stage_dir;
	char *leftover;     /* stage_dir/old.4, a copy an earlier process left */
	int done_calls;
	int status;
	char message[512];
};

/* stage_dir/name, a copy an earlier process left (its marker and a model
 * file, LEFTOVER_FILE, whose removal the gate can hold); its path. */
static char *
make_leftover(const char *stage_dir, const char *name)
{
	char *d = path_join(stage_dir, name);

	assert_non_null(d);
	assert_int_equal(mkdir(d, 0700), 0);
	free(tu_write(d, STAGE_MARKER, "", 0));
	free(tu_write(d, LEFTOVER_FILE, "abc", 3));
	return d;
}

static int
setup(void **state)
{
	struct sweep_fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	loop_thread = pthread_self();
	atomic_store(&unlinked_on_loop, 0);
	atomic_store(&waiting_at_gate, 0);
	atomic_store(&gate_first_file, false);
	atomic_store(&memfd_on_pool, 0);
	atomic_store(&memfd_hold_at, 0);
	atomic_store(&memfd_fail_at, 0);
	stop_at_next_file = NULL;
	set_gate(false);
	f->t = du_new(false);
	f->stage_dir = path_join(f->t->dir, "staged");
	assert_int_equal(mkdir(f->stage_dir, 0700), 0);
	f->leftover = make_leftover(f->stage_dir, "old.4");
	assert_int_equal(registry_set_stage_dir(&f->t->reg, f->stage_dir), 0);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct sweep_fixture *f = *state;
	void *t = f->t;

	set_gate(false);
	fail_then_stop = NULL;
	stop_at_next_file = NULL;
	du_free(&t);
	free(f->leftover);
	free(f->stage_dir);
	free(f);
	return 0;
}

static void
on_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct sweep_fixture *f = arg;

	(void)generation;
	f->done_calls++;
	f->status = status;
	snprintf(f->message, sizeof(f->message), "%s", message);
}

/* Loads a small model m that stages (stage = yes), answered to on_done. */
static void
load_staged(struct sweep_fixture *f)
{
	char *src = du_model(f->t, "m.safetensors", 1024);

	assert_int_equal(registry_load(&f->t->reg, "m", src, PIN_NONE, 0, on_done, f), 0);
	/* The stage key is set once registry_load returns, as config does. */
	assert_int_equal(registry_set_storage(&f->t->reg, "m", FS_WATCH_INOTIFY, 0, FS_STAGE_YES),
		0);
	free(src);
}

/* Waits (20 s at most) until the sweep is held at the gate: a pool
 * thread's, which sends the loop nothing to wake it. */
static void
wait_at_gate(void)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 20;
	pthread_mutex_lock(&gate_lock);
	while (atomic_load(&waiting_at_gate) == 0 && rc == 0)
		rc = pthread_cond_timedwait(&gate_cond, &gate_lock, &until);
	pthread_mutex_unlock(&gate_lock);
	assert_int_equal(atomic_load(&waiting_at_gate), 1);
}

static bool
staging_queued(struct du *t, void *arg)
{
	const struct model_entry *m = registry_find(&t->reg, "m");

	(void)arg;
	return m != NULL && m->staging != NULL;
}

static bool
answered(struct du *t, void *arg)
{
	(void)t;
	return ((struct sweep_fixture *)arg)->done_calls > 0;
}

static bool
leftover_gone(struct du *t, void *arg)
{
	(void)t;
	return tu_count_entries(((struct sweep_fixture *)arg)->leftover) == -1;
}

static void
on_window(uv_timer_t *timer)
{
	*(bool *)timer->data = true;
}

static bool
window_over(struct du *t, void *arg)
{
	(void)t;
	return *(bool *)arg;
}

/* Runs the loop for ms milliseconds: for what must not happen meanwhile. */
static void
run_for(struct du *t, uint64_t ms)
{
	uv_timer_t timer;
	bool over = false;

	assert_int_equal(uv_timer_init(&t->loop, &timer), 0);
	timer.data = &over;
	assert_int_equal(uv_timer_start(&timer, on_window, ms, 0), 0);
	du_run_until(t, window_over, &over);
	uv_close((uv_handle_t *)&timer, NULL);
	uv_run(&t->loop, UV_RUN_NOWAIT);
}

/* Entries of dir whose name starts with prefix. */
static int
entries_starting(const char *dir, const char *prefix)
{
	int n = 0;
	struct dirent *e;
	DIR *d = opendir(dir);

	assert_non_null(d);
	while ((e = readdir(d)) != NULL)
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

/* ---- tests ----------------------------------------------------------------- */

/*
 * The sweep removes the leftover copy on a pool thread: registry_stage_sweep
 * returns while that removal is held at the gate (it unlinked it on the
 * loop thread before, and every model waited for it). A staging queued
 * meanwhile waits: nothing is copied into stage_dir until the sweep ends;
 * then the model is staged and served, the leftover gone, said once.
 */
static void
test_sweep_off_the_loop_stagings_wait(void **state)
{
	struct sweep_fixture *f = *state;
	const struct generation *g;
	char *log;

	du_log_start(f->t);
	set_gate(true);
	registry_stage_sweep(&f->t->reg, NULL, 0);
	assert_int_equal(atomic_load(&unlinked_on_loop), 0);
	wait_at_gate();
	assert_int_equal(tu_count_entries(f->leftover), 2); /* held: nothing removed yet */

	load_staged(f);
	du_run_until(f->t, staging_queued, NULL);
	/* Held by the sweep: while the loop runs no copy starts (the gate
	 * holds the sweep for up to 20 s; 1 s is plenty for a 4 KiB copy that
	 * did not wait to be staged and served). */
	run_for(f->t, 1000);
	assert_int_equal(f->done_calls, 0);
	assert_int_equal(entries_starting(f->stage_dir, ".m.tmp-"), 0);
	assert_int_equal(entries_starting(f->stage_dir, "m."), 0);

	set_gate(false);
	du_run_until(f->t, answered, f);
	assert_int_equal(f->status, 0);
	assert_int_equal(tu_count_entries(f->leftover), -1);
	g = du_current(f->t, "m");
	assert_non_null(g->staged.dir);
	assert_int_equal(entries_starting(f->stage_dir, "m.1"), 1);
	log = du_log_stop(f->t);
	assert_non_null(strstr(log, "removed 1 staged copy left in "));
	assert_non_null(strstr(log, "its staging waits for the sweep of "));
	free(log);
	assert_int_equal(atomic_load(&unlinked_on_loop), 0);
}

/* wcached stops while a staging waits for the sweep: once the sweep ends
 * the staging ends cancelled ("wcached is stopping"), and copies nothing. */
static void
test_waiting_staging_cancelled_at_stop(void **state)
{
	struct sweep_fixture *f = *state;

	set_gate(true);
	registry_stage_sweep(&f->t->reg, NULL, 0);
	wait_at_gate();
	load_staged(f);
	du_run_until(f->t, staging_queued, NULL);
	registry_close(&f->t->reg);
	set_gate(false);
	du_run_until(f->t, answered, f);
	assert_int_equal(f->status, -ECANCELED);
	assert_non_null(strstr(f->message, "wcached is stopping"));
	assert_int_equal(entries_starting(f->stage_dir, ".m.tmp-"), 0);
	assert_int_equal(entries_starting(f->stage_dir, "m."), 0);
	assert_int_equal(tu_count_entries(f->leftover), -1);
}

/* Whether the sweep has ended (sweep_after ran). */
static bool
sweep_ended(struct du *t, void *arg)
{
	(void)arg;
	return t->reg.sweep == NULL;
}

/* Starts the sweep, stops wcached while its first removal waits at the
 * gate, then lets it go on and waits for the sweep to end. */
static void
stop_at_the_gate(struct sweep_fixture *f)
{
	set_gate(true);
	registry_stage_sweep(&f->t->reg, NULL, 0);
	wait_at_gate();
	registry_close(&f->t->reg);
	set_gate(false);
	du_run_until(f->t, sweep_ended, NULL);
}

/*
 * wcached stops while the sweep removes the first of three leftovers (each
 * one's unlink would wait at the gate): the sweep removes that one and no
 * more, and says the next start removes the rest; before, a stop waited
 * for every leftover's unlink (hundreds of gigabytes each, maybe).
 */
static void
test_a_stop_ends_the_sweep_at_the_next_copy(void **state)
{
	struct sweep_fixture *f = *state;
	char *log;

	free(make_leftover(f->stage_dir, "old.5"));
	free(make_leftover(f->stage_dir, "old.6"));
	du_log_start(f->t);
	stop_at_the_gate(f);
	assert_int_equal(entries_starting(f->stage_dir, "old."), 2);
	log = du_log_stop(f->t);
	assert_non_null(strstr(log, "stopped as wcached stops, after 1 copy: the next start "
				    "removes what is left"));
	assert_non_null(strstr(log, "removed 1 staged copy left in "));
	free(log);
}

/*
 * A stop cut short the removal of copy: it is still there, marked, with
 * entries entries (the marker included), and the log (captured since
 * du_log_start) says said; the next start's sweep finds it wcached's and
 * removes it, swept copies in all.
 */
static void
cut_short_then_swept(struct sweep_fixture *f, const char *copy, int entries, const char *said,
	unsigned swept)
{
	unsigned removed = 0;
	struct stat st;
	char *marker = path_join(copy, STAGE_MARKER), *log;

	assert_non_null(marker);
	assert_int_equal(stat(marker, &st), 0);
	free(marker);
	assert_int_equal(tu_count_entries(copy), entries);
	log = du_log_stop(f->t);
	assert_non_null(strstr(log, said));
	free(log);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, swept);
	assert_int_equal(tu_count_entries(copy), -1);
}

/*
 * wcached stops while the sweep removes the first file of the only
 * leftover, a copy of four files (a sharded model's, say): the sweep
 * removes no other file of it, and the copy keeps its marker, so the next
 * start's sweep removes the rest; before, a stop waited for the unlink of
 * every file of the copy it had begun (163 shards on a slow disk: seconds
 * each).
 */
static void
test_a_stop_ends_the_sweep_within_a_copy(void **state)
{
	struct sweep_fixture *f = *state;

	free(tu_write(f->leftover, "model-00001-of-00003.safetensors", "abc", 3));
	free(tu_write(f->leftover, "model-00002-of-00003.safetensors", "abc", 3));
	free(tu_write(f->leftover, "model.safetensors.index.json", "{}", 2));
	du_log_start(f->t);
	atomic_store(&gate_first_file, true);
	stop_at_the_gate(f);
	/* The marker and the three files its removal had not reached. */
	cut_short_then_swept(f, f->leftover, 4, "stopped as wcached stops, after 0 copies: "
		"the next start removes what is left", 1);
}

/* m loaded and staged (load_staged), and three more files written into
 * its copy (five entries with its marker and model): the copy's path. */
static char *
staged_copy_of_m(struct sweep_fixture *f)
{
	char *copy;

	load_staged(f);
	du_run_until(f->t, answered, f);
	assert_int_equal(f->status, 0);
	copy = strdup(du_current(f->t, "m")->staged.dir);
	assert_non_null(copy);
	free(tu_write(copy, "extra-1.safetensors", "abc", 3));
	free(tu_write(copy, "extra-2.safetensors", "abc", 3));
	free(tu_write(copy, "extra-3.safetensors", "abc", 3));
	assert_int_equal(tu_count_entries(copy), 5);
	return copy;
}

/* Logging (du_log_start), m is unloaded and wcached stops while the
 * removal of its copy holds at its first file; then the loop runs out:
 * closed, the registry holds no handle, so it ends once the work queue
 * has (as in du_teardown), the removal included. */
static void
unload_stopping_at_the_first_file(struct sweep_fixture *f)
{
	du_log_start(f->t);
	atomic_store(&gate_first_file, true);
	set_gate(true);
	assert_int_equal(registry_unload(&f->t->reg, "m"), 0);
	wait_at_gate();
	registry_close(&f->t->reg);
	set_gate(false);
	while (uv_run(&f->t->loop, UV_RUN_DEFAULT) != 0)
		;
}

/*
 * m's generation closes while it serves (m unloaded) and its staged copy,
 * five files, is removed; wcached stops while the first file's unlink
 * waits at the gate (a slow stage_dir). The removal removes no other
 * file: the copy keeps its marker and the three files it had not reached,
 * it says so once, and the next start's sweep removes the rest. Before,
 * the stop waited for the unlink of every file of the copy (libuv's loop
 * ends only once its work queue has).
 */
static void
test_a_stop_ends_the_removal_of_a_closed_generations_copy(void **state)
{
	struct sweep_fixture *f = *state;
	char *copy;

	copy = staged_copy_of_m(f);
	unload_stopping_at_the_first_file(f);
	/* The marker and the three files it had not reached; the sweep
	 * removes it with the fixture's leftover. */
	cut_short_then_swept(f, copy, 4, "its removal stopped as wcached stops: the next "
		"start removes what is left", 2);
	free(copy);
}

/*
 * stage_dir changed (a configuration reload) since m's copy was made: a
 * stop during that copy's removal does not end it, since the next start
 * sweeps only the stage_dir configured now and would never remove what the
 * stop left in the old one. The copy is removed whole, as before the stop
 * could cut removals short.
 */
static void
test_a_copy_outside_the_configured_stage_dir_is_removed_whole(void **state)
{
	struct sweep_fixture *f = *state;
	char *copy, *other, *log;

	copy = staged_copy_of_m(f);
	other = path_join(f->t->dir, "other-stage");
	assert_non_null(other);
	assert_int_equal(mkdir(other, 0700), 0);
	assert_int_equal(registry_set_stage_dir(&f->t->reg, other), 0);
	unload_stopping_at_the_first_file(f);
	log = du_log_stop(f->t);
	assert_int_equal(tu_count_entries(copy), -1);
	assert_null(strstr(log, "its removal stopped"));
	free(log);
	free(other);
	free(copy);
}

/*
 * A sharded model of three files (a shard index, two shards) in
 * t->dir/sharded, loaded as m to stage (stage = yes), answered to
 * on_done: its copy has three files to remove besides its marker.
 */
static void
load_staged_sharded(struct sweep_fixture *f)
{
	static const char index[] = "{\"weight_map\":{\"a\":\"s-1.safetensors\","
				    "\"b\":\"s-2.safetensors\"}}";
	static const char *const names[] = { "a", "b" };
	char *dir = path_join(f->t->dir, "sharded"), header[128];
	uint8_t *buf;
	size_t len;

	assert_non_null(dir);
	assert_int_equal(mkdir(dir, 0700), 0);
	free(tu_write(dir, "m.safetensors.index.json", index, strlen(index)));
	for (int i = 0; i < 2; i++) {
		char name[32];

		snprintf(header, sizeof(header),
			"{\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
			names[i]);
		snprintf(name, sizeof(name), "s-%d.safetensors", i + 1);
		buf = tu_safetensors(header, 16, &len);
		free(tu_write(dir, name, buf, len));
		free(buf);
	}
	assert_int_equal(registry_load(&f->t->reg, "m", dir, PIN_NONE, 0, on_done, f), 0);
	assert_int_equal(registry_set_storage(&f->t->reg, "m", FS_WATCH_INOTIFY, 0, FS_STAGE_YES),
		0);
	free(dir);
}

/* Whether stop_at_next_file has stopped wcached (in a removal on a pool
 * thread, whose end wakes the loop). */
static bool
stopped_at_a_file(struct du *t, void *arg)
{
	(void)t;
	(void)arg;
	return __atomic_load_n(&stop_at_next_file, __ATOMIC_SEQ_CST) == NULL;
}

/* Runs the loop to its end once the registry is closed (as in
 * du_teardown): libuv's loop ends only once its work queue has, the
 * removals on it included. */
static void
close_and_drain(struct du *t)
{
	registry_close(&t->reg);
	while (uv_run(&t->loop, UV_RUN_DEFAULT) != 0)
		;
}

/*
 * The end of the tests below: m's staging is answered as wcached stops
 * (-ECANCELED), stop_at_next_file stopped it within the removal of m's
 * copy, m.1: once the loop has ended (the removal too), the copy keeps
 * its marker and the two files the removal had not reached, the log says
 * so, and the next start's sweep removes it with the fixture's leftover.
 */
static void
stopped_within_the_copy(struct sweep_fixture *f)
{
	char *copy = path_join(f->stage_dir, "m.1");

	assert_non_null(copy);
	du_run_until(f->t, answered, f);
	assert_int_equal(f->status, -ECANCELED);
	du_run_until(f->t, stopped_at_a_file, NULL);
	close_and_drain(f->t);
	cut_short_then_swept(f, copy, 3, "m.1: its removal stopped as wcached stops: the next "
		"start removes what is left", 2);
	free(copy);
}

/*
 * m's copy (a sharded model's: three files and the marker) is staged, but
 * the copy's validation fails (its index memfd cannot be made: out of
 * descriptors), so the staging removes the copy itself, on the work
 * queue; wcached stops while it unlinks the first file. The removal
 * removes no other file: the copy keeps its marker and the two files it
 * had not reached, it says so once, and the next start's sweep removes
 * the rest. Before, the stop waited for the unlink of every file of the
 * copy (stage_remove read no stop).
 */
static void
test_a_stop_ends_the_removal_of_a_copy_that_failed_validation(void **state)
{
	struct sweep_fixture *f = *state;

	atomic_store(&memfd_fail_at, 2); /* the source's index is the first */
	stop_at_next_file = &f->t->reg;
	du_log_start(f->t);
	load_staged_sharded(f);
	stopped_within_the_copy(f);
}

/*
 * m's copy (three files and the marker) is staged, then m is unloaded
 * before the staging is answered (held while it seals the copy's index):
 * no generation takes the copy, and it is removed on the work queue;
 * wcached stops while the first file is unlinked. The removal removes no
 * other file: the copy keeps its marker and the two files it had not
 * reached, it says so once, and the next start's sweep removes the rest.
 * Before, the stop waited for the unlink of every file of the copy
 * (load_request_free read no stop).
 */
static void
test_a_stop_ends_the_removal_of_a_copy_no_generation_took(void **state)
{
	struct sweep_fixture *f = *state;
	char *copy = path_join(f->stage_dir, "m.1");

	assert_non_null(copy);
	set_gate(true);
	atomic_store(&memfd_hold_at, 2); /* the copy's index, once copied */
	load_staged_sharded(f);
	du_run_until(f->t, staging_queued, NULL);
	wait_at_gate();
	assert_int_equal(tu_count_entries(copy), 4);
	assert_int_equal(registry_unload(&f->t->reg, "m"), 0);
	du_log_start(f->t);
	stop_at_next_file = &f->t->reg;
	set_gate(false);
	stopped_within_the_copy(f);
	free(copy);
}

/* A removal fails, then wcached stops: the failure is what the sweep
 * returns and warns about, not the stop (which hid it). */
static void
test_a_failure_before_a_stop_is_the_one_reported(void **state)
{
	struct sweep_fixture *f = *state;
	char *log;

	free(make_leftover(f->stage_dir, "old.5"));
	free(make_leftover(f->stage_dir, "old.6"));
	du_log_start(f->t);
	fail_then_stop = &f->t->reg;
	registry_stage_sweep(&f->t->reg, NULL, 0);
	du_run_until(f->t, sweep_ended, NULL);
	assert_null(fail_then_stop);
	log = du_log_stop(f->t);
	assert_non_null(strstr(log, LEFTOVER_FILE ": Input/output error"));
	assert_null(strstr(log, "stopped as wcached stops"));
	free(log);
	assert_int_equal(entries_starting(f->stage_dir, "old."), 3);
}

/* Without a sweep (none started, or it ended) a staging goes to the work
 * queue at once, as before. */
static void
test_a_staging_after_the_sweep_does_not_wait(void **state)
{
	struct sweep_fixture *f = *state;

	registry_stage_sweep(&f->t->reg, NULL, 0);
	du_run_until(f->t, leftover_gone, f);
	load_staged(f);
	du_run_until(f->t, answered, f);
	assert_int_equal(f->status, 0);
	assert_non_null(du_current(f->t, "m")->staged.dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sweep_off_the_loop_stagings_wait, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_waiting_staging_cancelled_at_stop, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_a_staging_after_the_sweep_does_not_wait, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_a_stop_ends_the_sweep_at_the_next_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_a_failure_before_a_stop_is_the_one_reported,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_stop_ends_the_sweep_within_a_copy, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_stop_ends_the_removal_of_a_closed_generations_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_copy_outside_the_configured_stage_dir_is_removed_whole, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_stop_ends_the_removal_of_a_copy_that_failed_validation, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_stop_ends_the_removal_of_a_copy_no_generation_took, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
