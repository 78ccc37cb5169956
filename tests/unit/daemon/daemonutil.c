/*
 * daemonutil.c: see daemonutil.h.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemonutil.h"
#include "log.h"
#include "testutil.h"

#define DEADLINE_MS 20000

void
du_setup(struct du *t, bool pool, uint64_t pace)
{
	/* Paced: small chunks, so the pace holds from the first one. */
	struct warm_options opt = { .threads = 1, .pace_bytes_per_sec = pace,
		.chunk_bytes = pace != 0 ? WARM_MIN_CHUNK : 0 };

	memset(t, 0, sizeof(*t));
	t->log_fd = t->saved_stderr = -1;
	assert_int_equal(uv_loop_init(&t->loop), 0);
	if (pool)
		assert_int_equal(warm_pool_new(&t->loop, &opt, &t->pool), 0);
	assert_int_equal(registry_init(&t->reg, &t->loop, t->pool), 0);
	t->dir = tu_tmpdir();
}

static void
close_walk(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

void
du_teardown(struct du *t)
{
	if (t->log_fd >= 0)
		free(du_log_stop(t));
	warm_pool_close(t->pool);
	registry_close(&t->reg);
	/* Page operations still on the work queue end and free their
	 * generations. */
	while (uv_run(&t->loop, UV_RUN_DEFAULT) != 0)
		;
	assert_null(t->reg.generations);
	uv_walk(&t->loop, close_walk, NULL);
	uv_run(&t->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&t->loop), 0);
	tu_rmtree(t->dir);
}

struct du *
du_new(bool pool)
{
	struct du *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	du_setup(t, pool, 0);
	return t;
}

int
du_free(void **state)
{
	du_teardown(*state);
	free(*state);
	return 0;
}

char *
du_model(struct du *t, const char *name, size_t floats)
{
	char header[256];
	uint8_t *buf;
	size_t len;
	char *path;

	snprintf(header, sizeof(header),
		"{\"w\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", floats,
		floats * 4);
	buf = tu_safetensors(header, floats * 4, &len);
	path = tu_write(t->dir, name, buf, len);
	free(buf);
	return path;
}

const char *
du_kind_name(enum du_kind kind)
{
	static const char *const names[DU_KINDS] = { "a file", "a directory", "a shard index",
		"a link to a file", "a link to a directory", "a link to a shard index" };

	return names[kind];
}

/* Writes t->dir/sub/name, a shard index naming the one shard
 * s.safetensors. */
static void
write_index(struct du *t, const char *sub, const char *name)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", t->dir, sub, name);
	assert_non_null(f = fopen(path, "w"));
	fputs("{\"weight_map\":{\"w\":\"s.safetensors\"}}", f);
	assert_int_equal(fclose(f), 0);
}

/* What a path of kind names in its directory, and the link to it there
 * (the path), or NULL. */
static const char *const kind_named[DU_KINDS] = { "m.safetensors", "m",
	"m.safetensors.index.json", "m.safetensors", "m", "m.safetensors.index.json" };
static const char *const kind_link[DU_KINDS] = { NULL, NULL, NULL, "cur.safetensors", "cur",
	"cur.safetensors.index.json" };

/* Makes the model of kind as name in t->dir/sub: a file of floats floats,
 * a directory holding one, or an index (and its shard, the first time). */
static void
model_of_kind(struct du *t, const char *sub, enum du_kind kind, const char *name, size_t floats)
{
	char rel[512];

	if (kind == DU_DIR || kind == DU_LINK_DIR) {
		snprintf(rel, sizeof(rel), "%s/%s/%s", t->dir, sub, name);
		assert_int_equal(mkdir(rel, 0755), 0);
		snprintf(rel, sizeof(rel), "%s/%s/model.safetensors", sub, name);
	} else if (kind == DU_INDEX || kind == DU_LINK_INDEX) {
		write_index(t, sub, name);
		snprintf(rel, sizeof(rel), "%s/%s/s.safetensors", t->dir, sub);
		if (access(rel, F_OK) == 0)
			return; /* a new version of the index: the shard stays */
		snprintf(rel, sizeof(rel), "%s/s.safetensors", sub);
	} else {
		snprintf(rel, sizeof(rel), "%s/%s", sub, name);
	}
	free(du_model(t, rel, floats));
}

char *
du_model_kind(struct du *t, const char *sub, enum du_kind kind)
{
	char *dir, *path;

	assert_true(asprintf(&dir, "%s/%s", t->dir, sub) > 0);
	assert_int_equal(mkdir(dir, 0755), 0);
	model_of_kind(t, sub, kind, kind_named[kind], 1024);
	if (kind_link[kind] == NULL) {
		assert_true(asprintf(&path, "%s/%s", dir, kind_named[kind]) > 0);
	} else {
		assert_true(asprintf(&path, "%s/%s", dir, kind_link[kind]) > 0);
		assert_int_equal(symlink(kind_named[kind], path), 0);
	}
	free(dir);
	return path;
}

void
du_model_kind_replace(struct du *t, const char *sub, enum du_kind kind)
{
	char from[4096], to[4096], old[4200];

	model_of_kind(t, sub, kind, ".new", 2048);
	snprintf(from, sizeof(from), "%s/%s/.new", t->dir, sub);
	snprintf(to, sizeof(to), "%s/%s/%s", t->dir, sub, kind_named[kind]);
	if (kind == DU_DIR || kind == DU_LINK_DIR) {
		/* rename(2) takes a directory's place only where it is
		 * empty: the old one goes aside first. */
		snprintf(old, sizeof(old), "%s.old", to);
		assert_int_equal(rename(to, old), 0);
	}
	assert_int_equal(rename(from, to), 0);
}

void
du_fill_below(int *fill, int *n, int below)
{
	int fd;

	*n = 0;
	while ((fd = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0 && fd < below)
		fill[(*n)++] = fd;
	assert_int_equal(fd, below);
	close(fd);
}

static void
on_deadline(uv_timer_t *timer)
{
	*(int *)timer->data = 1;
}

void
du_run_until(struct du *t, bool (*cond)(struct du *t, void *arg), void *arg)
{
	uv_timer_t timer;
	int expired = 0;

	assert_int_equal(uv_timer_init(&t->loop, &timer), 0);
	timer.data = &expired;
	assert_int_equal(uv_timer_start(&timer, on_deadline, DEADLINE_MS, 0), 0);
	while (!cond(t, arg) && !expired)
		uv_run(&t->loop, UV_RUN_ONCE);
	uv_close((uv_handle_t *)&timer, NULL);
	uv_run(&t->loop, UV_RUN_NOWAIT);
	if (expired)
		fail_msg("timed out waiting for the registry");
}

static void
load_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct du *t = arg;

	t->done_calls++;
	t->status = status;
	t->generation = generation;
	snprintf(t->message, sizeof(t->message), "%s", message);
}

static bool
answered(struct du *t, void *arg)
{
	return t->done_calls > *(int *)arg;
}

int
du_load(struct du *t, const char *name, const char *path, enum pin_mode pin, int warm)
{
	int before = t->done_calls;

	assert_int_equal(registry_load(&t->reg, name, path, pin, warm, load_done, t), 0);
	du_run_until(t, answered, &before);
	return t->status;
}

int
du_reload(struct du *t, const char *name)
{
	int before = t->done_calls;

	assert_int_equal(registry_reload(&t->reg, name, load_done, t), 0);
	du_run_until(t, answered, &before);
	return t->status;
}

struct state_wait {
	const char *name;
	bool pending;
	int state;
};

static bool
busy(const struct generation *g)
{
	return g->warm.pending > 0 || g->ops_pending > 0;
}

static bool
in_state(struct du *t, void *arg)
{
	const struct state_wait *w = arg;
	struct model_entry *m = registry_find(&t->reg, w->name);
	struct generation *g;

	if (m == NULL)
		return false;
	g = w->pending ? m->pending : m->current;
	if (g == NULL)
		return false;
	return w->state < 0 ? !busy(g) : (int)g->state == w->state;
}

struct generation *
du_wait_state(struct du *t, const char *name, bool pending, int s)
{
	struct state_wait w = { name, pending, s };
	struct model_entry *m;

	du_run_until(t, in_state, &w);
	m = registry_find(&t->reg, name);
	return pending ? m->pending : m->current;
}

static bool
settled(struct du *t, void *arg)
{
	(void)arg;
	for (const struct generation *g = t->reg.generations; g != NULL; g = g->next)
		if (busy(g))
			return false;
	return true;
}

void
du_settle(struct du *t)
{
	du_run_until(t, settled, NULL);
}

struct generation *
du_current(struct du *t, const char *name)
{
	struct model_entry *m = registry_find(&t->reg, name);

	assert_non_null(m);
	assert_non_null(m->current);
	return m->current;
}

unsigned
du_generations(struct du *t)
{
	unsigned n = 0;

	for (const struct generation *g = t->reg.generations; g != NULL; g = g->next)
		n++;
	return n;
}

void
du_log_start(struct du *t)
{
	char path[] = "/tmp/wcache-log-XXXXXX";

	fflush(stderr);
	t->log_fd = mkstemp(path);
	assert_true(t->log_fd >= 0);
	unlink(path);
	t->saved_stderr = dup(2);
	assert_true(t->saved_stderr >= 0);
	assert_int_equal(dup2(t->log_fd, 2), 2);
	log_setlevel(LOG_LEVEL_DEBUG);
}

char *
du_log_stop(struct du *t)
{
	off_t size = lseek(t->log_fd, 0, SEEK_END);
	char *text = malloc((size_t)size + 1);

	assert_non_null(text);
	assert_int_equal(pread(t->log_fd, text, (size_t)size, 0), size);
	text[size] = '\0';
	dup2(t->saved_stderr, 2);
	close(t->saved_stderr);
	close(t->log_fd);
	t->log_fd = t->saved_stderr = -1;
	log_setlevel(LOG_LEVEL_INFO);
	/* What was captured, for whoever reads the test's output. */
	fputs(text, stderr);
	return text;
}
