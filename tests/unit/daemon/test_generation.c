/*
 * test_generation.c: unit tests of daemon/generation.c and daemon/pages.c,
 * the state machine of a generation (generation.h), on a real libuv loop,
 * a real warm pool and small model files in /tmp.
 *
 * Each test drives generations through transitions with the registry's
 * calls (load, attach, evict, pin, mark modified, unload, close) and checks
 * the state, the words status prints, and the debug line each transition
 * logs. The transition table itself is checked pair by pair.
 *
 * Fault injection (-Wl,--wrap in tests/CMakeLists.txt): sendfile (the warm
 * pool's reads into /dev/null) fails with EIO when asked, so warming fails
 * (pread is not wrapped: the format parsers read headers with it, and a
 * load must get as far as warming);
 * madvise fails when asked, so mapping every page (populate) fails;
 * stat counts the calls on one path, so a test sees how often it is read;
 * lseek counts the SEEK_DATA and SEEK_HOLE calls of the sparse-file check
 * on two descriptors, and fails the next ones with an errno when asked;
 * realloc fails once, when asked, the growth of one generation's records
 * of its holders' uids (gen_holder_add).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/path.h"
#include "daemonutil.h"
#include "fdstore.h"
#include "metrics.h"
#include "pages.h"
#include "restore.h"
#include "testutil.h"

/* ---- fault injection ---- */

static atomic_int fail_reads;    /* sendfile fails with EIO */
static atomic_int fail_populate; /* madvise(MADV_POPULATE_READ) fails with EIO */

ssize_t __real_sendfile(int out, int in, off_t *off, size_t count);
ssize_t __wrap_sendfile(int out, int in, off_t *off, size_t count);
int __real_madvise(void *addr, size_t len, int advice);
int __wrap_madvise(void *addr, size_t len, int advice);

static const char *count_stats_of; /* lstat() of this path is counted */
static int stats_counted;
int __real_lstat(const char *path, struct stat *st);
int __wrap_lstat(const char *path, struct stat *st);

int
__wrap_lstat(const char *path, struct stat *st)
{
	if (count_stats_of != NULL && strcmp(path, count_stats_of) == 0)
		stats_counted++;
	return __real_lstat(path, st);
}

ssize_t
__wrap_sendfile(int out, int in, off_t *off, size_t count)
{
	if (atomic_load(&fail_reads)) {
		errno = EIO;
		return -1;
	}
	return __real_sendfile(out, in, off, count);
}

int
__wrap_madvise(void *addr, size_t len, int advice)
{
#ifdef MADV_POPULATE_READ
	if (advice == MADV_POPULATE_READ && atomic_load(&fail_populate)) {
		errno = EIO;
		return -1;
	}
#endif
	return __real_madvise(addr, len, advice);
}

/* The sparse-file check's walk (gen_check_holes): the SEEK_DATA and
 * SEEK_HOLE calls on seek_fds[i] are counted in seeks[i]; the next
 * fail_seeks of those on seek_fds[0] fail with seek_errno. The check runs
 * on the test's thread here. */
static int seek_fds[2] = { -1, -1 };
static unsigned seeks[2];
static int fail_seeks, seek_errno;
/* Set: answers SEEK_DATA and SEEK_HOLE on seek_fds[0] instead of the
 * filesystem (a FUSE server answers with any offset), until seeks[0] is
 * SEEK_LIES, then fails with EIO (a way out of a walk that never ends). */
static off_t (*seek_lie)(int fd, off_t off, int whence);
#define SEEK_LIES 1000u

off_t __real_lseek(int fd, off_t off, int whence);
off_t __wrap_lseek(int fd, off_t off, int whence);

off_t
__wrap_lseek(int fd, off_t off, int whence)
{
	if (whence == SEEK_DATA || whence == SEEK_HOLE)
		for (int i = 0; i < 2; i++)
			if (fd >= 0 && fd == seek_fds[i]) {
				seeks[i]++;
				if (i == 0 && seek_lie != NULL && seeks[i] > SEEK_LIES) {
					errno = EIO;
					return -1;
				}
				if (i == 0 && seek_lie != NULL)
					return seek_lie(fd, off, whence);
				if (i == 0 && fail_seeks > 0) {
					fail_seeks--;
					errno = seek_errno;
					return -1;
				}
			}
	return __real_lseek(fd, off, whence);
}

/* Set: the next growth of this generation's holder records on this
 * thread fails (ENOMEM), as when memory runs out. Thread-local: the warm
 * pool's threads never see it. */
static _Thread_local const struct generation *fail_holders_of;
void *__real_realloc(void *p, size_t size);
void *__wrap_realloc(void *p, size_t size);

void *
__wrap_realloc(void *p, size_t size)
{
	const struct generation *g = fail_holders_of;

	if (g != NULL && p == g->holders && size == (g->nholders + 1) * sizeof(*g->holders)) {
		fail_holders_of = NULL;
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, size);
}

static int
setup(void **state)
{
	fail_holders_of = NULL;
	atomic_store(&fail_reads, 0);
	atomic_store(&fail_populate, 0);
	seek_fds[0] = seek_fds[1] = -1;
	seeks[0] = seeks[1] = 0;
	fail_seeks = 0;
	seek_lie = NULL;
	*state = du_new(true);
	return 0;
}

#define teardown du_free

static void
assert_logged(const char *log, const char *line)
{
	if (strstr(log, line) == NULL)
		fail_msg("not logged: %s", line);
}

static struct registry_peer root_peer = { .pid = 1, .uid = 0, .gid = 0 };

static struct generation *
attach(struct du *t, const char *name)
{
	struct registry_attachment a;
	char msg[256];

	assert_int_equal(registry_attach(&t->reg, name, &root_peer, &a, msg, sizeof(msg)), 0);
	return a.gen;
}

/* Starts over with a slow pool (1 MiB/s) and loads a warming model of 4 MiB
 * as "m", its warm-up still running; *path receives its file. */
static struct generation *
load_warming(struct du *t, char **path)
{
	struct generation *g;

	du_teardown(t);
	du_setup(t, true, 1 << 20);
	*path = du_model(t, "m.safetensors", 1 << 20); /* 4 MiB at 1 MiB/s */
	assert_int_equal(du_load(t, "m", *path, PIN_NONE, 1), 0);
	g = du_current(t, "m");
	assert_int_equal(g->state, GEN_WARMING);
	return g;
}

/* Loads a warm model of floats floats as "m" and waits until it is ready
 * and nothing runs on it; *path receives its file. */
static struct generation *
load_ready(struct du *t, size_t floats, enum pin_mode pin, char **path)
{
	*path = du_model(t, "m.safetensors", floats);
	assert_int_equal(du_load(t, "m", *path, pin, 1), 0);
	du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	return du_current(t, "m");
}

/* ---- the table ---- */

static void
test_transition_table(void **state)
{
	/* expected[from] lists the allowed targets, as generation.h's table. */
	static const char *const expected[] = {
		[GEN_NEW] = "WRC",
		[GEN_WARMING] = "RcMFC",
		[GEN_READY] = "WcMFC",
		[GEN_COLD] = "WRrMFC",
		[GEN_REWARM] = "WRcMFC",
		[GEN_MODIFIED] = "C",
		[GEN_FAILED] = "MC",
		[GEN_CLOSED] = "",
	};
	static const char letter[] = {
		[GEN_NEW] = 'N', [GEN_WARMING] = 'W', [GEN_READY] = 'R', [GEN_COLD] = 'c',
		[GEN_REWARM] = 'r', [GEN_MODIFIED] = 'M', [GEN_FAILED] = 'F', [GEN_CLOSED] = 'C',
	};
	struct generation g = { .number = 7, .model_name = "t" };

	(void)state;
	for (int from = GEN_NEW; from <= GEN_CLOSED; from++)
		for (int to = GEN_NEW; to <= GEN_CLOSED; to++) {
			int ok = from == to || strchr(expected[from], letter[to]) != NULL;

			g.state = (enum gen_state)from;
			assert_int_equal(gen_set_state(&g, (enum gen_state)to, "test"),
				ok ? 0 : -EINVAL);
			assert_int_equal(g.state, ok ? to : from);
		}
	assert_string_equal(gen_state_name(GEN_REWARM), "warming");
	assert_string_equal(gen_state_name(GEN_COLD), "cold");
	assert_string_equal(gen_state_name(GEN_READY), "ready");
	assert_string_equal(gen_state_name(GEN_MODIFIED), "modified");
	assert_string_equal(gen_state_name(GEN_FAILED), "failed");
}

/* ---- load and warm ---- */

static void
test_load_without_warming(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *log;
	struct generation *g;

	du_log_start(t);
	assert_int_equal(du_load(t, "m", path, PIN_METADATA, 0), 0);
	log = du_log_stop(t);
	assert_logged(log, "model \"m\": generation 1: new -> ready (the model does not warm)");
	du_settle(t); /* the metadata lock runs on the work queue */
	g = du_current(t, "m");
	assert_int_equal(g->state, GEN_READY);
	assert_int_equal(g->pinned, PIN_METADATA);
	assert_string_equal(metrics_model_state(g->model), "ready");
	free(log);
	free(path);
}

/* What a load's answer found, as install() gave it. */
struct at_answer {
	struct du *t;
	int calls;
	int pinned;            /* the new generation's pinned then */
	unsigned ops_pending;  /* its page operations then: the lock */
};

static void
note_at_answer(int status, const char *message, uint64_t generation, void *arg)
{
	struct at_answer *a = arg;
	const struct generation *g = du_current(a->t, "m");

	(void)message;
	(void)generation;
	assert_int_equal(status, 0);
	a->calls++;
	a->pinned = g->pinned;
	a->ops_pending = g->ops_pending;
}

/*
 * A new generation's metadata (index and headers) is locked as page work
 * on the work queue, never on the loop: for a model served where it lies
 * on a network or FUSE filesystem the lock reads the headers from the
 * server, and the loop waited for it (rev111 D0: attaches of other models
 * for 25 s). pinned says PIN_METADATA only once the lock has ended.
 */
static void
test_metadata_locked_off_the_loop(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct at_answer a = { .t = t };
	struct generation *g;

	assert_int_equal(registry_load(&t->reg, "m", path, PIN_METADATA, 0, note_at_answer, &a),
		0);
	while (a.calls == 0)
		uv_run(&t->loop, UV_RUN_ONCE);
	/* Answered from install(): the lock is queued, not yet reported. */
	assert_int_equal(a.pinned, PIN_NONE);
	assert_int_equal(a.ops_pending, 1);
	du_settle(t);
	g = du_current(t, "m");
	assert_int_equal(g->pinned, PIN_METADATA);
	assert_int_equal(g->ops_pending, 0);
	assert_string_equal(g->pin_error, "");
	free(path);
}

static void
test_load_warm(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", (size_t)256 * 1024), *log;
	struct generation *g;

	du_log_start(t);
	assert_int_equal(du_load(t, "m", path, PIN_METADATA, 1), 0);
	/* A first generation is current at once, while it warms. */
	assert_string_equal(t->message, "generation 1 is current");
	g = du_current(t, "m");
	assert_true(g->state == GEN_WARMING || g->state == GEN_READY);
	g = du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	log = du_log_stop(t);
	assert_logged(log, "model \"m\": generation 1: new -> warming (warming)");
	assert_logged(log, "model \"m\": generation 1: warming -> ready (warm)");
	assert_int_equal(g->warm.bytes, g->bytes);
	assert_int_equal(g->warm.error, 0);
	assert_true(g->populated); /* every page mapped into the daemon */
	free(log);
	free(path);
}

static void
test_warm_failed(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", (size_t)64 * 1024), *log;
	struct registry_attachment a;
	struct generation *g;
	char msg[256];

	atomic_store(&fail_reads, 1);
	du_log_start(t);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	g = du_wait_state(t, "m", false, GEN_FAILED);
	atomic_store(&fail_reads, 0);
	log = du_log_stop(t);
	assert_logged(log, "generation 1: warming -> failed (warming failed)");
	assert_int_equal(g->warm.error, -EIO);
	assert_string_equal(metrics_model_state(g->model), "failed");
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), -EIO);
	assert_string_equal(msg, "generation 1 failed while warming");
	assert_int_equal(g->model->error_count, 1);
	/* Final: eviction drops pages but keeps the state. */
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_int_equal(g->state, GEN_FAILED);
	/* A file then changed in place is reported as such. */
	registry_mark_modified(&t->reg, g, "m.safetensors");
	assert_int_equal(g->state, GEN_MODIFIED);
	free(log);
	free(path);
}

/* A reload of a model whose generation failed while warming (a transient
 * EIO) loads its files again, though they are the same inodes: the failed
 * generation serves nothing, so "unchanged" would leave the model refusing
 * every attach until its files were replaced or wcached restarted. */
static void
test_reload_after_warm_failed(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", (size_t)64 * 1024);
	struct registry_attachment a;
	char msg[256];

	atomic_store(&fail_reads, 1);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	du_wait_state(t, "m", false, GEN_FAILED);
	atomic_store(&fail_reads, 0);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_string_not_equal(t->message, "unchanged");
	du_wait_state(t, "m", false, GEN_READY);
	assert_int_equal(du_current(t, "m")->number, 2);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, 0);
	du_settle(t);
	assert_int_equal(du_generations(t), 1); /* the failed one closed */
	free(path);
}

/* The replacement of a generation that failed while warming serves at
 * once, while it warms, as a first generation does: the failed one serves
 * nothing. Before, it became current only once warm, so attaches kept
 * failing ('generation 1 failed while warming') for the whole warm-up of a
 * model loaded again after a transient EIO. */
static void
test_reload_after_warm_failed_serves_at_once(void **state)
{
	struct du *t = *state;
	struct generation *g;
	char *path;

	du_teardown(t);
	du_setup(t, true, 1 << 20); /* 1 MiB/s: the second warm-up takes 4 s */
	path = du_model(t, "m.safetensors", 1 << 20);
	atomic_store(&fail_reads, 1);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	du_wait_state(t, "m", false, GEN_FAILED);
	atomic_store(&fail_reads, 0);
	assert_int_equal(du_reload(t, "m"), 0);
	g = du_current(t, "m");
	assert_int_equal(g->number, 2);
	assert_int_equal(g->state, GEN_WARMING);
	assert_null(registry_find(&t->reg, "m")->pending);
	assert_ptr_equal(attach(t, "m"), g);
	registry_release(&t->reg, g, 0);
	assert_int_equal(registry_unload(&t->reg, "m"), 0);
	du_settle(t);
	assert_int_equal(du_generations(t), 0);
	free(path);
}

/* registry_failed(), which says what a config reload loads again
 * (reload.c): a model whose current generation failed while warming, until
 * a load of it warms a replacement; a model whose load failed with nothing
 * serving; never a model that serves its files, nor one modified in place
 * (a failed replacement: test_failed_replacement_never_current). */
static void
test_registry_failed(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", (size_t)64 * 1024);
	struct model_entry *m;
	char why[256] = "";

	atomic_store(&fail_reads, 1);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	du_wait_state(t, "m", false, GEN_FAILED);
	atomic_store(&fail_reads, 0);
	m = registry_find(&t->reg, "m");
	assert_int_equal(registry_failed(m, why, sizeof(why)), 1);
	assert_string_equal(why, "generation 1 failed while warming: Input/output error");
	/* Loaded again: its replacement warms (or is current already). */
	assert_int_equal(du_reload(t, "m"), 0);
	assert_true(m->pending != NULL || m->current->number == 2);
	why[0] = '\0';
	assert_int_equal(registry_failed(m, why, sizeof(why)), 0);
	assert_string_equal(why, "");
	du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	assert_int_equal(du_current(t, "m")->number, 2);
	assert_int_equal(registry_failed(m, why, sizeof(why)), 0);
	registry_mark_modified(&t->reg, m->current, "m.safetensors");
	assert_int_equal(registry_failed(m, why, sizeof(why)), 0);
	/* A load that failed, nothing serving. */
	assert_int_equal(du_load(t, "x", "/nonexistent/x.safetensors", PIN_NONE, 1), -ENOENT);
	m = registry_find(&t->reg, "x");
	assert_non_null(m);
	assert_int_equal(registry_failed(m, why, sizeof(why)), 1);
	assert_true(strncmp(why, "its load failed: ", 17) == 0);
	assert_non_null(strstr(why, "/nonexistent/x.safetensors"));
	free(path);
}

static void
test_failed_replacement_never_current(void **state)
{
	struct du *t = *state;
	char *p1 = du_model(t, "a.safetensors", 1024), *p2 = du_model(t, "b.safetensors", 1024);
	struct model_entry *m;
	char why[256];

	assert_int_equal(du_load(t, "m", p1, PIN_NONE, 1), 0);
	du_wait_state(t, "m", false, GEN_READY);
	atomic_store(&fail_reads, 1);
	assert_int_equal(du_load(t, "m", p2, PIN_NONE, 1), 0);
	assert_string_equal(t->message,
		"generation 2 is warming and becomes current when warm");
	m = registry_find(&t->reg, "m");
	du_settle(t);
	atomic_store(&fail_reads, 0);
	assert_null(m->pending);
	assert_int_equal(m->current->number, 1);
	assert_string_equal(m->error, "the new generation failed while warming");
	assert_int_equal(du_generations(t), 1); /* generation 2 closed */
	/* Old weights serve: a config reload loads it again (registry_failed). */
	assert_int_equal(registry_failed(m, why, sizeof(why)), 1);
	assert_string_equal(why, "its replacement failed (generation 1 still serving): "
				 "the new generation failed while warming");
	assert_int_equal(du_reload(t, "m"), 0);
	assert_int_equal(registry_failed(m, why, sizeof(why)), 0);
	du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	assert_int_equal(du_current(t, "m")->number, 3);
	assert_null(m->error);
	assert_int_equal(registry_failed(m, why, sizeof(why)), 0);
	free(p1);
	free(p2);
}

static bool
current_is_2(struct du *t, void *arg)
{
	(void)arg;
	return du_current(t, "m")->number == 2;
}

static void
test_promote(void **state)
{
	struct du *t = *state;
	char *p1 = du_model(t, "a.safetensors", 4096), *p2 = du_model(t, "b.safetensors", 8192);
	struct model_entry *m;
	struct generation *g1, *g2;
	char *log;

	assert_int_equal(du_load(t, "m", p1, PIN_NONE, 1), 0);
	du_wait_state(t, "m", false, GEN_READY);
	g1 = attach(t, "m"); /* held: stays open after the swap */
	du_log_start(t);
	assert_int_equal(du_load(t, "m", p2, PIN_NONE, 1), 0);
	du_run_until(t, current_is_2, NULL);
	g2 = du_current(t, "m");
	assert_int_equal(g2->state, GEN_READY);
	log = du_log_stop(t);
	assert_int_equal(g2->number, 2);
	assert_logged(log, "model \"m\": generation 2 is current (was 1)");
	m = registry_find(&t->reg, "m");
	assert_int_equal(m->swap_count, 1);
	assert_null(m->pending);
	assert_int_equal(t->reg.page.map[m->slot], 2);
	assert_int_equal(du_generations(t), 2);
	registry_release(&t->reg, g1, 0);
	assert_int_equal(du_generations(t), 1);
	free(log);
	free(p1);
	free(p2);
}

/* ---- cancelled, unload while held ---- */

static void
test_unload_while_held_cancels_warming(void **state)
{
	struct du *t = *state;
	struct generation *g;
	char *path, *log;

	/* A slow pool: the warm-up is still running when the model goes. */
	g = load_warming(t, &path);
	assert_ptr_equal(attach(t, "m"), g);
	du_log_start(t);
	assert_int_equal(registry_unload(&t->reg, "m"), 0);
	assert_null(g->model);
	assert_int_equal(t->reg.page.map[1], STATUS_SLOT_RETIRED | 1); /* no longer served */
	du_settle(t);
	log = du_log_stop(t);
	assert_logged(log, "generation 1: warming -> ready (warming cancelled)");
	assert_true(g->warm.cancelled);
	assert_false(g->populated); /* not warmed, so not claimed */
	assert_int_equal(du_generations(t), 1); /* held by the client */
	du_log_start(t);
	registry_release(&t->reg, g, 0);
	free(du_log_stop(t));
	assert_int_equal(du_generations(t), 0);
	free(log);
	free(path);
}

/* ---- evict, attach while cold ---- */

static void
test_evict_and_attach_cold(void **state)
{
	struct du *t = *state;
	char *path, *log;
	struct generation *g = load_ready(t, (size_t)64 * 1024, PIN_NONE, &path);

	du_log_start(t);
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_int_equal(g->state, GEN_COLD);
	assert_string_equal(metrics_model_state(g->model), "cold");
	du_settle(t);
	assert_false(g->populated);
	/* Attached while cold and no eviction running: warms again. */
	g = attach(t, "m");
	assert_int_equal(g->state, GEN_WARMING);
	du_wait_state(t, "m", false, GEN_READY);
	log = du_log_stop(t);
	assert_logged(log, "generation 1: ready -> cold (evicted)");
	assert_logged(log, "model \"m\": attached while cold, warming generation 1");
	assert_logged(log, "generation 1: cold -> warming (warming)");
	assert_logged(log, "generation 1: warming -> ready (warm)");
	registry_release(&t->reg, g, 0);
	free(log);
	free(path);
}

static void
test_attach_during_eviction_rewarms_after(void **state)
{
	struct du *t = *state;
	char *path, *log;
	struct generation *g = load_ready(t, (size_t)64 * 1024, PIN_NONE, &path);

	du_log_start(t);
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	/* The eviction is queued and has not ended (the loop has not run). */
	assert_non_null(g->page_queue);
	attach(t, "m");
	assert_int_equal(g->state, GEN_REWARM);
	assert_string_equal(metrics_model_state(g->model), "warming");
	du_wait_state(t, "m", false, GEN_READY);
	log = du_log_stop(t);
	assert_logged(log, "cold -> warming (after eviction) (attached while an eviction runs)");
	assert_logged(log, "warming (after eviction) -> warming (warming)");
	registry_release(&t->reg, g, 0);
	free(log);
	free(path);
}

/* Evicted while it warms, then attached before its cancelled jobs have
 * stopped: it warms again once they have, in full. Before, the attach
 * started a warm-up that skipped every file (their jobs were still set),
 * and the generation went ready unwarmed ("warming cancelled"), never to
 * be warmed by the residency check either. */
static void
test_attach_while_cancelled_warmup_stops(void **state)
{
	struct du *t = *state;
	struct generation *g;
	char *path, *log;

	g = load_warming(t, &path);
	du_log_start(t);
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_int_equal(g->state, GEN_COLD);
	assert_true(g->warm.pending > 0);
	assert_ptr_equal(attach(t, "m"), g);
	assert_int_equal(g->state, GEN_REWARM);
	du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	log = du_log_stop(t);
	assert_logged(log, "(attached while a cancelled warm-up stops)");
	assert_logged(log, "warming (after eviction) -> warming (warming)");
	assert_logged(log, "warming -> ready (warm)");
	assert_false(g->warm.cancelled);
	assert_true(g->warm.bytes == g->bytes);
	registry_release(&t->reg, g, 0);
	free(log);
	free(path);
}

/* The same, with a release between the eviction and the attach: the last
 * holder going queued an eviction while the cancelled jobs still stopped,
 * and the attach then waited on whichever ended first: warming while the
 * eviction still dropped the pages, or a warm-up that skipped every file.
 * It warms once both have ended. */
static void
test_release_attach_while_warmup_stops(void **state)
{
	struct du *t = *state;
	struct generation *g;
	char *path, *log;

	g = load_warming(t, &path);
	assert_ptr_equal(attach(t, "m"), g);
	du_log_start(t);
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_true(g->warm.pending > 0);
	registry_release(&t->reg, g, 0);
	assert_ptr_equal(attach(t, "m"), g);
	assert_int_equal(g->state, GEN_REWARM);
	du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	log = du_log_stop(t);
	assert_logged(log, "warming -> ready (warm)");
	assert_false(g->warm.cancelled);
	assert_true(g->warm.bytes == g->bytes);
	assert_true(g->populated);
	registry_release(&t->reg, g, 0);
	free(log);
	free(path);
}

static void
test_cold_not_warming_model(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct generation *g;

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	g = du_current(t, "m");
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	du_settle(t);
	assert_int_equal(g->state, GEN_COLD);
	attach(t, "m");
	assert_int_equal(g->state, GEN_READY);
	/* The last holder of a cold generation letting go drops its pages:
	 * here it is no longer cold, so nothing is queued. */
	registry_release(&t->reg, g, 0);
	assert_null(g->page_queue);
	free(path);
}

static void
test_memory_budget_evicts_lru(void **state)
{
	struct du *t = *state;
	char *p1 = du_model(t, "a.safetensors", (size_t)64 * 1024),
		*p2 = du_model(t, "b.safetensors", (size_t)64 * 1024);
	struct generation *a, *b;

	t->reg.memory_budget = (uint64_t)300 * 1024; /* room for one 256 KiB model */
	assert_int_equal(du_load(t, "a", p1, PIN_NONE, 1), 0);
	a = du_wait_state(t, "a", false, GEN_READY);
	assert_int_equal(du_load(t, "b", p2, PIN_NONE, 1), 0);
	b = du_current(t, "b");
	assert_int_equal(a->state, GEN_COLD);
	assert_true(gen_holds_memory(b));
	du_settle(t);
	free(p1);
	free(p2);
}

/* ---- pin, unpin ---- */

static void
test_pin_unpin(void **state)
{
	struct du *t = *state;
	char *path;
	struct generation *g = load_ready(t, (size_t)64 * 1024, PIN_METADATA, &path);

	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	du_settle(t);
	assert_int_equal(g->pinned, PIN_ALL);
	assert_int_equal(registry_evict(&t->reg, "m"), -EBUSY);
	assert_int_equal(g->state, GEN_READY);
	assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
	du_settle(t);
	assert_int_equal(g->pinned, PIN_METADATA); /* headers locked again */
	/* Pinning a cold generation reads it back: cold -> ready. */
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	du_settle(t);
	assert_int_equal(g->state, GEN_COLD);
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	assert_int_equal(g->state, GEN_READY);
	du_settle(t);
	assert_int_equal(g->pinned, PIN_ALL);
	assert_int_equal(registry_pin(&t->reg, "nope", PIN_ALL), -ENOENT);
	free(path);
}

/* registry_pages_wait's answers, recorded. */
struct pages_answer {
	int calls;
	int status;
	uint64_t generation;
	bool busy_then;    /* page work was still queued when it answered */
	struct generation *g;
};

static void
pages_answered(int status, const char *message, uint64_t generation, void *arg)
{
	struct pages_answer *a = arg;

	(void)message;
	a->calls++;
	a->status = status;
	a->generation = generation;
	a->busy_then = a->g != NULL && (a->g->ops_pending > 0 || a->g->warm.pending > 0);
}

static bool
answered(struct du *t, void *arg)
{
	(void)t;
	return ((struct pages_answer *)arg)->calls > 0;
}

/* pin, unpin and evict are answered when their page work has ended. */
static void
test_pages_wait(void **state)
{
	struct du *t = *state;
	char *path;
	struct generation *g = load_ready(t, (size_t)64 * 1024, PIN_METADATA, &path);
	struct pages_answer a = { .g = g }, b = { .g = g }, idle = { .g = g };

	du_settle(t);
	/* Nothing queued: answered at once. */
	assert_int_equal(registry_pages_wait(&t->reg, "m", pages_answered, &idle), 0);
	assert_int_equal(idle.calls, 1);
	assert_int_equal(idle.status, 0);
	assert_int_equal(idle.generation, 1);
	/* An eviction: answered once it ran, not before; two waiters both. */
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", pages_answered, &a), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", pages_answered, &b), 0);
	assert_int_equal(a.calls, 0);
	du_run_until(t, answered, &a);
	assert_int_equal(a.calls, 1);
	assert_int_equal(b.calls, 1);
	assert_false(a.busy_then);
	assert_int_equal(a.status, 0);
	assert_false(g->populated);
	/* A pin: answered with every page locked. */
	memset(&a, 0, sizeof(a));
	a.g = g;
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", pages_answered, &a), 0);
	du_run_until(t, answered, &a);
	assert_int_equal(a.status, 0);
	assert_int_equal(g->pinned, PIN_ALL);
	assert_false(a.busy_then);
	/* An unload before the work ends answers -ECANCELED. */
	memset(&a, 0, sizeof(a));
	assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", pages_answered, &a), 0);
	assert_int_equal(a.calls, 0);
	assert_int_equal(registry_unload(&t->reg, "m"), 0);
	assert_int_equal(a.calls, 1);
	assert_int_equal(a.status, -ECANCELED);
	assert_int_equal(registry_pages_wait(&t->reg, "m", pages_answered, &a), -ENOENT);
	du_settle(t);
	free(path);
}

/* ---- modified in place ---- */

static void
test_modified_in_place(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *log;
	struct registry_attachment a;
	struct generation *g;
	char msg[256];

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	g = du_wait_state(t, "m", false, GEN_READY);
	du_log_start(t);
	registry_mark_modified(&t->reg, g, path);
	registry_mark_modified(&t->reg, g, path); /* once only */
	log = du_log_stop(t);
	assert_logged(log, "generation 1: ready -> modified (modified in place)");
	assert_int_equal(g->state, GEN_MODIFIED);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)),
		-ESTALE);
	assert_string_equal(msg, "generation 1 was modified in place and is not served; "
				 "replace model files with rename(2), then reload");
	/* Final: eviction and pins leave it modified. */
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_int_equal(g->state, GEN_MODIFIED);
	assert_int_equal(gen_set_state(g, GEN_READY, "test"), -EINVAL);
	assert_string_equal(metrics_model_state(g->model), "modified");
	free(log);
	free(path);
}

/* A generation served where it lies on a remote filesystem whose files the
 * server dropped after another host replaced them (watch_poll.c):
 * failed, with the reason and the remedy in the refusal, in status's
 * error and in registry_failed (a config reload loads it again). */
static void
test_gone_from_the_server(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *log;
	struct registry_attachment a;
	struct generation *g;
	char msg[1024], why[1024];
	const char *said = "generation 1's files were replaced or removed on nfs by another "
			   "host and the replacement failed to load (m.safetensors: no "
			   "tensors); the server no longer has them (/m/m.safetensors: fstat: "
			   "Stale file handle), so generation 1 is not served. Publish a valid "
			   "model file at its path (the next poll loads it), or set stage = yes "
			   "or auto so that a local copy serves";

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	g = du_wait_state(t, "m", false, GEN_READY);
	snprintf(g->fs.name, sizeof(g->fs.name), "nfs");
	g->fs.remote = true;
	g->source_replaced = 1;
	g->model->error = strdup("m.safetensors: no tensors"); /* its replacement's load */
	du_log_start(t);
	registry_mark_gone(&t->reg, g, "/m/m.safetensors", ESTALE);
	registry_mark_gone(&t->reg, g, "/m/m.safetensors", ESTALE); /* once only */
	log = du_log_stop(t);
	assert_logged(log, "generation 1: ready -> failed (its files are gone from the server)");
	assert_int_equal(g->state, GEN_FAILED);
	assert_string_equal(g->model->error, said);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)),
		-ESTALE);
	assert_string_equal(msg, said);
	assert_int_equal(registry_failed(g->model, why, sizeof(why)), 1);
	assert_string_equal(why, said);
	assert_string_equal(metrics_model_state(g->model), "failed");
	free(log);
	free(path);
}

static void
test_modified_replacement_dropped(void **state)
{
	struct du *t = *state;
	char *p1, *p2;
	struct model_entry *m;
	struct generation *g2;

	du_teardown(t);
	du_setup(t, true, 1 << 20);
	p1 = du_model(t, "a.safetensors", 1024);
	p2 = du_model(t, "b.safetensors", 1 << 20);
	assert_int_equal(du_load(t, "m", p1, PIN_NONE, 1), 0);
	du_wait_state(t, "m", false, GEN_READY);
	assert_int_equal(du_load(t, "m", p2, PIN_NONE, 1), 0);
	m = registry_find(&t->reg, "m");
	g2 = m->pending;
	assert_non_null(g2);
	assert_int_equal(g2->state, GEN_WARMING);
	registry_mark_modified(&t->reg, g2, p2);
	assert_null(m->pending);
	assert_string_equal(m->error, "the new generation was modified in place while it "
				      "warmed; replace model files with rename(2)");
	du_settle(t);
	registry_collect(&t->reg);
	assert_int_equal(du_generations(t), 1);
	assert_int_equal(m->current->number, 1);
	free(p1);
	free(p2);
}

/* ---- residency ---- */

static void
test_residency_rewarm(void **state)
{
	struct du *t = *state;
	char *path, *log;
	struct generation *g = load_ready(t, 1 << 20, PIN_NONE, &path);

	assert_true(g->populated);
	/* A check that finds everything resident changes nothing. */
	registry_check_residency(&t->reg);
	du_settle(t);
	assert_int_equal(g->state, GEN_READY);
	assert_int_equal(g->model->rewarm_count, 0);
	/* Memory pressure took the pages: warm again. */
	du_log_start(t);
	gen_residency_checked(&t->reg, g, 0);
	assert_int_equal(g->state, GEN_WARMING);
	du_wait_state(t, "m", false, GEN_READY);
	log = du_log_stop(t);
	assert_logged(log, "are still in memory (memory pressure); warming it again");
	assert_logged(log, "generation 1: ready -> warming (warming)");
	assert_int_equal(g->model->rewarm_count, 1);
	free(log);
	free(path);
}

/* Status and metrics report the figure the latest page operation measured
 * off the loop (gen_resident walks nothing); evict and pin refresh
 * it when they end; registry_refresh_residency measures again only what is
 * old enough. */
static void
test_residency_cached(void **state)
{
	struct du *t = *state;
	char *path, *json = NULL;
	struct generation never = { .registry = &t->reg };
	struct generation *g;
	const char *method = NULL;
	int64_t age = -7;
	size_t len = 0;
	FILE *f;

	/* Before any measure: nothing, "none", no age. */
	assert_int_equal(gen_resident(&never, &method, &age), 0);
	assert_string_equal(method, "none");
	assert_int_equal(age, -1);

	/* Ready after a clean warm-up: the warming jobs measured their files
	 * as they ended, so the figure is there the moment it is ready. */
	path = du_model(t, "m.safetensors", 1 << 20);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	g = du_wait_state(t, "m", false, GEN_READY);
	assert_true(g->resident.measured);
	assert_int_equal(gen_resident(g, NULL, NULL), g->bytes);

	/* Then every page is mapped, and measured once more, as a fresh walk. */
	du_settle(t);
	assert_true(g->populated);
	assert_int_equal(gen_resident(g, &method, &age), g->bytes);
	assert_int_equal(gen_resident(g, NULL, NULL), pages_resident(g, NULL));
	assert_string_not_equal(method, "none");
	assert_true(age >= 0);

	/* The figure is the cached one: a value the pages cannot have shows. */
	g->resident.bytes = 12345;
	g->resident.at_ms = registry_now_ms(&t->reg);
	assert_int_equal(gen_resident(g, NULL, NULL), 12345);
	f = open_memstream(&json, &len);
	assert_non_null(f);
	metrics_status_json(f, &t->reg, &(struct metrics_daemon){ 0 });
	assert_int_equal(fclose(f), 0);
	assert_non_null(strstr(json, "\"resident_bytes\":12345,"));
	assert_non_null(strstr(json, "\"resident_age_ms\":"));
	assert_null(strstr(json, "\"resident_age_ms\":null"));
	free(json);

	/* Fresh: not measured again. Old enough: measured again, off the loop. */
	registry_refresh_residency(&t->reg, 250);
	assert_null(g->page_queue);
	g->resident.at_ms -= 250;
	registry_refresh_residency(&t->reg, 250);
	assert_non_null(g->page_queue);
	du_settle(t);
	assert_int_equal(gen_resident(g, NULL, NULL), pages_resident(g, NULL));

	/* A measure that started before a warm-up ended does not replace the
	 * figure the warm-up's end set (as warm_done does, below). */
	g->resident.at_ms -= 250;
	registry_refresh_residency(&t->reg, 250);
	assert_non_null(g->page_queue);
	g->resident.epoch++;
	g->resident.bytes = 12345;
	du_settle(t);
	assert_int_equal(gen_resident(g, NULL, NULL), 12345);

	/* Evict: the figure is what the eviction left, measured when it ended. */
	g->resident.bytes = 12345;
	assert_int_equal(registry_evict(&t->reg, "m"), 0);
	du_settle(t);
	assert_int_equal(g->state, GEN_COLD);
	assert_int_not_equal(gen_resident(g, NULL, NULL), 12345);
	assert_int_equal(gen_resident(g, NULL, NULL), pages_resident(g, NULL));

	/* Pin (reads the cold model back): every byte, when the lock is done. */
	g->resident.bytes = 12345;
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	du_settle(t);
	assert_int_equal(g->pinned, PIN_ALL);
	assert_int_equal(gen_resident(g, NULL, NULL), g->bytes);
	free(path);
}

static void
test_populate_fails(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", (size_t)64 * 1024), *log;
	struct generation *g;

	atomic_store(&fail_populate, 1);
	du_log_start(t);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	g = du_wait_state(t, "m", false, GEN_READY);
	du_settle(t);
	atomic_store(&fail_populate, 0);
	log = du_log_stop(t);
	assert_logged(log, "cannot map");
	assert_logged(log, "into wcached: Input/output error");
	assert_false(g->populated);
	assert_int_equal(g->state, GEN_READY); /* serves all the same */
	free(log);
	free(path);
}

/* ---- holders by uid (what a warm restart's store records) ---- */

/* Attaches "m" as a worker of uid. */
static void
attach_as(struct du *t, uid_t uid)
{
	struct registry_peer peer = { .pid = 1, .uid = uid, .gid = uid };
	struct registry_attachment a;
	char msg[256];

	assert_int_equal(registry_attach(&t->reg, "m", &peer, &a, msg, sizeof(msg)), 0);
}

/* What the store would record of g's holders: the count, and the uid
 * pairs (none: the count only). */
static void
assert_holders(const struct generation *g, unsigned count, const struct fdstore_holder *want,
	uint32_t nwant)
{
	struct fdstore_holder *v;
	uint32_t n;

	assert_int_equal(restore_holders(g), count);
	assert_int_equal(restore_holder_uids(g, &v, &n), 0);
	assert_int_equal(n, nwant);
	for (uint32_t i = 0; i < n && i < nwant; i++) {
		assert_int_equal(v[i].uid, want[i].uid);
		assert_int_equal(v[i].count, want[i].count);
	}
	free(v);
}

/* One step of test_holders_by_uid_again_after_a_lost_one: op on uid, then
 * what the store would record of g's holders (count, and the uid pairs;
 * none: the count only). */
struct holder_step {
	char op;        /* 'a' attach, 'l' attach whose uid cannot be recorded,
			   'r' release, 'b' a build's own reference taken and released */
	uid_t uid;
	unsigned count;
	uint32_t npairs;
	struct fdstore_holder pairs[2];
};

/*
 * A reference whose uid could not be recorded (no memory) makes the store
 * record the holders' count only, and only until every such reference is
 * released: then the uids again (before, count-only for good, so after the
 * next restart any uid allowed the model could take another's places).
 * While one is held, the release of a uid that has a recorded reference
 * drops that one, and the count alone stays: 1002 below, whose first
 * reference was lost and second recorded, still holds one after its first
 * release, and recording no place for it would refuse its HOLD.
 */
static void
test_holders_by_uid_again_after_a_lost_one(void **state)
{
	static const struct holder_step steps[] = {
		{ 'a', 1000, 1, 1, { { 1000, 1 } } },
		{ 'l', 1001, 2, 0, { { 0, 0 } } },
		{ 'a', 1000, 3, 0, { { 0, 0 } } },
		{ 'b', REGISTRY_NO_UID, 3, 0, { { 0, 0 } } },
		{ 'r', 1000, 2, 0, { { 0, 0 } } },
		/* 1001 has none recorded: the lost one goes, all exact again. */
		{ 'r', 1001, 1, 1, { { 1000, 1 } } },
		{ 'l', 1002, 2, 0, { { 0, 0 } } },
		{ 'a', 1002, 3, 0, { { 0, 0 } } },
		{ 'l', 1003, 4, 0, { { 0, 0 } } },
		{ 'r', 1002, 3, 0, { { 0, 0 } } },
		{ 'r', 1003, 2, 0, { { 0, 0 } } },
		{ 'r', 1002, 1, 1, { { 1000, 1 } } },
		{ 'a', 1001, 2, 2, { { 1000, 1 }, { 1001, 1 } } },
		{ 'r', 1000, 1, 1, { { 1001, 1 } } },
		{ 'r', 1001, 0, 0, { { 0, 0 } } },
	};
	struct du *t = *state;
	struct generation *g;
	char *path;

	g = load_ready(t, 1024, PIN_NONE, &path);
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		const struct holder_step *s = &steps[i];

		print_message("step %zu: %c %u\n", i, s->op, (unsigned)s->uid);
		if (s->op == 'l')
			fail_holders_of = g;
		if (s->op == 'a' || s->op == 'l')
			attach_as(t, s->uid); /* attached all the same */
		else if (s->op == 'b')
			gen_ref(&t->reg, g);
		if (s->op == 'r' || s->op == 'b')
			registry_release(&t->reg, g, s->uid);
		assert_null(fail_holders_of);
		assert_holders(g, s->count, s->pairs, s->npairs);
	}
	assert_int_equal(g->holders_lost, 0);
	free(path);
}

/* ---- close ---- */

static void
test_close_while_warming(void **state)
{
	struct du *t = *state;
	char *path;

	du_teardown(t);
	du_setup(t, true, 1 << 20);
	path = du_model(t, "m.safetensors", 1 << 20);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	attach(t, "m"); /* a client still holds it at shutdown */
	assert_int_equal(du_current(t, "m")->state, GEN_WARMING);
	free(path);
	/* teardown: pool closed (jobs cancelled), registry closed, every
	 * generation freed, the loop closes cleanly */
}

/* The real path of path for a generation of these n files (each opened
 * as paths[i], its fstat sts[i]; origin: their staged copies' origin, or
 * NULL), as the load pipeline asks it: realpath before and after. */
static char *
resolved_for(const char *path, size_t n, char *const *paths, const struct stat *sts,
	const struct gen_origin *origin)
{
	struct wc_file files[4] = { 0 };
	struct model_source src = { .files = files, .nfiles = n };

	assert_true(n <= 4);
	for (size_t i = 0; i < n; i++) {
		files[i].path = paths[i];
		files[i].st = sts[i];
	}
	return gen_resolved_path(path, realpath(path, NULL), &src, origin, NULL);
}

/* gen_resolved_path(): a generation answers to its path's real path only
 * when the path resolves the same after its files were opened and each of
 * its files is the file at its place there: the model's one file, a file
 * of the directory, or one beside the shard index, through a symbolic
 * link inside its tree too (not one out of it, review rev185 F5); a
 * staged copy by the file it was copied from. A file of
 * another directory of the same names (the link switched to B and back to
 * A while B's files were opened: rev164 #1) clears it. The path is lstat'ed
 * once whatever the number of files (once per file before). */
static void
test_resolved_path(void **state)
{
	char *tmp = tu_tmpdir(), *root = realpath(tmp, NULL), *a, *b, *blobs, *fa, *fb, *blob,
	     *idx, *link, *out, *fa2, *r;
	struct stat sa, sb, sblob, sa2;
	struct gen_origin origin[2];

	(void)state;
	if (root == NULL || (a = path_join(root, "a")) == NULL ||
		(b = path_join(root, "b")) == NULL || (blobs = path_join(a, "blobs")) == NULL)
		abort();
	assert_int_equal(mkdir(a, 0755), 0);
	assert_int_equal(mkdir(b, 0755), 0);
	assert_int_equal(mkdir(blobs, 0755), 0);
	fa = tu_write(a, "m.safetensors", "a", 1);
	fa2 = tu_write(a, "m2.safetensors", "a", 1);
	fb = tu_write(b, "m.safetensors", "b", 1);
	blob = tu_write(blobs, "h1", "c", 1);
	idx = tu_write(a, "m.safetensors.index.json", "{}", 2);
	if ((link = path_join(a, "s.safetensors")) == NULL ||
		(out = path_join(a, "o.safetensors")) == NULL)
		abort();
	assert_int_equal(symlink("blobs/h1", link), 0);
	assert_int_equal(stat(fa, &sa), 0);
	assert_int_equal(stat(fa2, &sa2), 0);
	assert_int_equal(stat(fb, &sb), 0);
	assert_int_equal(stat(blob, &sblob), 0);

	/* a directory: its own file passes, wherever it was opened from, and
	 * a symbolic link in it to a blob (the blob is the file there); one
	 * lstat of the directory for all three */
	count_stats_of = a;
	stats_counted = 0;
	r = resolved_for(a, 3, (char *[]){ "/elsewhere/m.safetensors", link, fa2 },
		(struct stat[]){ sa, sblob, sa2 }, NULL);
	count_stats_of = NULL;
	assert_non_null(r);
	assert_string_equal(r, a);
	assert_int_equal(stats_counted, 1);
	free(r);
	/* a link in a out of its tree, to b's file: not the file at its place
	 * in a, though stat(2) through it finds the opened file (rev185 F5) */
	assert_int_equal(symlink(fb, out), 0);
	assert_null(resolved_for(a, 1, (char *[]){ out }, (struct stat[]){ sb }, NULL));
	assert_int_equal(unlink(out), 0);
	/* the same name in another directory: not a's */
	assert_null(resolved_for(a, 2, (char *[]){ link, fb }, (struct stat[]){ sblob, sb },
		NULL));
	/* a shard index: the files beside it */
	r = resolved_for(idx, 1, (char *[]){ fa }, (struct stat[]){ sa }, NULL);
	assert_non_null(r);
	assert_string_equal(r, idx);
	free(r);
	assert_null(resolved_for(idx, 2, (char *[]){ fa, fb }, (struct stat[]){ sa, sb }, NULL));
	/* a model that is one file: that file, whatever its name */
	r = resolved_for(link, 1, (char *[]){ link }, (struct stat[]){ sblob }, NULL);
	assert_non_null(r);
	assert_string_equal(r, blob);
	free(r);
	assert_null(resolved_for(blob, 2, (char *[]){ link, fa }, (struct stat[]){ sblob, sa },
		NULL));
	/* a staged copy: its origin is checked, not the copy (b's file) */
	origin[0] = (struct gen_origin){ .path = fa, .st = sa };
	origin[1] = (struct gen_origin){ .path = fa2, .st = sa2 };
	r = resolved_for(a, 2, (char *[]){ fb, fb }, (struct stat[]){ sb, sb }, origin);
	assert_non_null(r);
	free(r);
	origin[1] = (struct gen_origin){ .path = fb, .st = sb };
	assert_null(resolved_for(a, 2, (char *[]){ fa, fa2 }, (struct stat[]){ sa, sa2 },
		origin));
	/* nothing to check against, a file without a directory, a path that
	 * resolves elsewhere now */
	assert_null(gen_resolved_path(a, NULL, &(struct model_source){ 0 }, NULL, NULL));
	assert_null(resolved_for(a, 1, (char *[]){ NULL }, (struct stat[]){ sb }, NULL));
	assert_null(gen_resolved_path(a, strdup(b), &(struct model_source){ 0 }, NULL, NULL));

	free(a);
	free(b);
	free(blobs);
	free(fa);
	free(fa2);
	free(fb);
	free(blob);
	free(idx);
	free(link);
	free(out);
	free(root);
	tu_rmtree(tmp);
}

/* ---- the sparse-file check (gen_check_holes) ---- */

/*
 * A file name in t's directory of size bytes: data (0xab) at each of the
 * n runs [at, at + len) ({ at, len } pairs), holes elsewhere (as ftruncate
 * leaves them). Opened read-only into *f as a load has it: its size and
 * stat at open (no mapping: the check does not read one). Free with
 * holes_close().
 */
static void
holes_file(struct du *t, const char *name, uint64_t size, const uint64_t (*runs)[2], size_t n,
	struct wc_file *f)
{
	static char buf[1 << 20];
	char *path = path_join(t->dir, name);
	int fd;

	assert_non_null(path);
	memset(buf, 0xab, sizeof(buf));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	for (size_t i = 0; i < n; i++)
		for (uint64_t done = 0; done < runs[i][1];) {
			size_t len = runs[i][1] - done < sizeof(buf) ? (size_t)(runs[i][1] - done) :
								      sizeof(buf);

			assert_int_equal(pwrite(fd, buf, len, (off_t)(runs[i][0] + done)),
				(ssize_t)len);
			done += len;
		}
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	*f = (struct wc_file){ .fd = open(path, O_RDONLY | O_CLOEXEC), .size = size,
		.path = path };
	assert_true(f->fd >= 0);
	assert_int_equal(fstat(f->fd, &f->st), 0);
}

static void
holes_close(struct wc_file *f, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		close(f[i].fd);
		free(f[i].path);
	}
}

/*
 * rev177 H: the walk stops once the verdict is known. A file of 4 KiB of
 * data, a 200 MiB hole, then 200 islands of 4 KiB between 4 KiB holes is
 * refused after its first hole (three calls), and the model's next file is
 * not walked; before, every island took two calls and the next file was
 * walked too. And a model whose first file, 40 MiB of data, leaves too few
 * bytes for its holes to reach the bound (60 MiB of holes could follow:
 * not over 64 MiB) is accepted without walking its second file.
 */
static void
test_holes_walk_stops_at_the_verdict(void **state)
{
	struct du *t = *state;
	uint64_t islands[201][2] = { { 0, 4096 } };
	uint64_t data[1][2] = { { 0, 40u << 20 } };
	struct wc_file f[2];
	struct model_source src = { .files = f, .nfiles = 2 };

	for (size_t i = 1; i < 201; i++) {
		islands[i][0] = (200u << 20) + (i - 1) * 8192;
		islands[i][1] = 4096;
	}
	holes_file(t, "islands.safetensors", (200u << 20) + 200 * 8192, islands, 201, &f[0]);
	holes_file(t, "next.safetensors", 8u << 20, NULL, 0, &f[1]);
	seek_fds[0] = f[0].fd;
	seek_fds[1] = f[1].fd;
	assert_int_equal(gen_check_holes(&src), -EINVAL);
	assert_non_null(strstr(error_get(), "islands.safetensors and 1 more: sparse files"));
	assert_in_range(seeks[0], 1, 4);
	assert_int_equal(seeks[1], 0);
	holes_close(f, 2);

	holes_file(t, "data.safetensors", 40u << 20, data, 1, &f[0]);
	holes_file(t, "holes.safetensors", 60u << 20, NULL, 0, &f[1]);
	seek_fds[0] = f[0].fd;
	seek_fds[1] = f[1].fd;
	seeks[0] = seeks[1] = 0;
	assert_int_equal(gen_check_holes(&src), 0);
	assert_true(seeks[0] > 0);
	assert_int_equal(seeks[1], 0);
	holes_close(f, 2);
}

/*
 * rev177 H: a file that shrank after it was opened (its size at open,
 * 256 MiB with 4 KiB of data, is larger than now) is a file changed while
 * read, not a sparse one: SEEK_DATA's ENXIO past its new end was counted
 * as holes up to the size at open, and the load told its writer to write
 * it out whole (`cp --sparse=never`).
 */
static void
test_holes_of_a_file_that_shrank(void **state)
{
	struct du *t = *state;
	uint64_t head[1][2] = { { 0, 4096 } };
	struct wc_file f;
	struct model_source src = { .files = &f, .nfiles = 1 };

	holes_file(t, "s.safetensors", 256u << 20, head, 1, &f);
	assert_int_equal(truncate(f.path, 8192), 0);
	assert_int_equal(gen_check_holes(&src), -EIO);
	assert_non_null(strstr(error_get(), "s.safetensors: file shrank while being read: "
		"268435456 bytes when opened, 8192 now"));
	holes_close(&f, 1);
}

/* A file of 256 MiB, 4 KiB of data and then a hole, opened into *f, whose
 * next n SEEK_DATA or SEEK_HOLE calls fail with err. */
static void
holes_failing(struct du *t, struct wc_file *f, int err, int n)
{
	uint64_t head[1][2] = { { 0, 4096 } };

	holes_file(t, "h.safetensors", 256u << 20, head, 1, f);
	seek_fds[0] = f->fd;
	seek_errno = err;
	fail_seeks = n;
}

/*
 * rev177 H: an lseek interrupted by a signal (EINTR, as a FUSE or NFS
 * request can be) is tried again: it ended the count with no holes, and
 * a 256 MiB file of 4 KiB of data was accepted.
 */
static void
test_holes_seek_interrupted(void **state)
{
	struct wc_file f;
	struct model_source src = { .files = &f, .nfiles = 1 };

	holes_failing(*state, &f, EINTR, 2);
	assert_int_equal(gen_check_holes(&src), -EINVAL);
	assert_non_null(strstr(error_get(), "h.safetensors: a sparse file: 268435456 bytes long"));
	assert_int_equal(fail_seeks, 0);
	holes_close(&f, 1);
}

/*
 * rev177 H: any other lseek error (EIO from a network filesystem) fails
 * open on purpose (generation.c's seek_failed says why), and now says
 * so: the file's bytes past it are taken as data, with one line naming
 * the file, the offset and the error. Before, the count ended silently.
 */
static void
test_holes_seek_failed_fails_open(void **state)
{
	struct du *t = *state;
	struct wc_file f;
	struct model_source src = { .files = &f, .nfiles = 1 };
	char *log;

	holes_failing(t, &f, EIO, 1);
	du_log_start(t);
	assert_int_equal(gen_check_holes(&src), 0);
	log = du_log_stop(t);
	assert_int_equal(seeks[0], 1);
	assert_logged(log, "h.safetensors: SEEK_DATA at byte 0: Input/output error");
	free(log);
	holes_close(&f, 1);
}

/* "Here": the offset asked, for both. */
static off_t
seek_here(int fd, off_t off, int whence)
{
	(void)fd;
	(void)whence;
	return off;
}

/* The filesystem's answers, but SEEK_DATA past the first extent answers 0. */
static off_t
seek_back(int fd, off_t off, int whence)
{
	if (whence == SEEK_DATA && off > 0)
		return 0;
	return __real_lseek(fd, off, whence);
}

/*
 * rev180 F10: a filesystem whose SEEK_DATA and SEEK_HOLE make no progress
 * (a FUSE server answers FUSE_LSEEK with any offset) ends the walk, with
 * the rest taken as data and one line, as a failed call does. Before, an
 * answer of the offset asked looped for ever (stopped here by the wrapper
 * after SEEK_LIES calls), and a SEEK_DATA before the offset asked added a
 * wrapped, huge count to the holes: a 256 MiB file of 4 KiB of data and a
 * hole was then refused as sparse from that count, not from its blocks.
 */
static void
test_holes_seek_without_progress_fails_open(void **state)
{
	struct du *t = *state;
	struct wc_file f;
	struct model_source src = { .files = &f, .nfiles = 1 };
	char *log;

	holes_failing(t, &f, 0, 0);
	seek_lie = seek_here;
	du_log_start(t);
	assert_int_equal(gen_check_holes(&src), 0);
	log = du_log_stop(t);
	assert_int_equal(seeks[0], 2);
	assert_logged(log, "h.safetensors: SEEK_HOLE at byte 0: answered byte 0, no progress; "
		"the sparse-file check takes the rest of it as data");
	free(log);

	seeks[0] = 0;
	seek_lie = seek_back;
	du_log_start(t);
	assert_int_equal(gen_check_holes(&src), 0);
	log = du_log_stop(t);
	assert_int_equal(seeks[0], 3);
	assert_logged(log, "h.safetensors: SEEK_DATA at byte 4096: answered byte 0, no progress");
	free(log);
	holes_close(&f, 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_transition_table),
		cmocka_unit_test(test_resolved_path),
		cmocka_unit_test_setup_teardown(test_load_without_warming, setup, teardown),
		cmocka_unit_test_setup_teardown(test_metadata_locked_off_the_loop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_warm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_failed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reload_after_warm_failed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reload_after_warm_failed_serves_at_once, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_registry_failed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_replacement_never_current, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_promote, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unload_while_held_cancels_warming, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_evict_and_attach_cold, setup, teardown),
		cmocka_unit_test_setup_teardown(test_attach_during_eviction_rewarms_after, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_attach_while_cancelled_warmup_stops, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_release_attach_while_warmup_stops, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_cold_not_warming_model, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memory_budget_evicts_lru, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_unpin, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pages_wait, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modified_in_place, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gone_from_the_server, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modified_replacement_dropped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_residency_rewarm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_residency_cached, setup, teardown),
		cmocka_unit_test_setup_teardown(test_populate_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_holders_by_uid_again_after_a_lost_one, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_close_while_warming, setup, teardown),
		cmocka_unit_test_setup_teardown(test_holes_walk_stops_at_the_verdict, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_holes_of_a_file_that_shrank, setup, teardown),
		cmocka_unit_test_setup_teardown(test_holes_seek_interrupted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_holes_seek_failed_fails_open, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_holes_seek_without_progress_fails_open,
			setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
