/*
 * test_registry.c: unit tests of daemon/registry.c: loading, reloading,
 * unloading and forgetting models, the status page, and progress and
 * close with a load in flight, on a real libuv loop and small model files
 * in /tmp. Attaching, access and what a restart carries over are
 * test_registry_attach.c's.
 *
 * Fault injection (-Wl,--wrap in tests/CMakeLists.txt): mmap, fstat and
 * memfd_create fail with the errno a test asks for, from the n-th call on,
 * so a load fails where the kernel would refuse; munmap is recorded while a
 * test asks, so that it can see a range unmapped twice; open fails with
 * the errno a test asks for when it reopens an index memfd through
 * /proc/self/fd (the descriptor workers get), as wcached out of file
 * descriptors would. statx is counted within mountrule_open's walks in a
 * run (an operator's load's look at a place: review rev212 M2).
 * mountrule_open refuses one path a test names (-EXDEV, as the walk
 * refuses a neighbour's FUSE mount), and stat(2) of that path by name is
 * recorded: it would ask his server, which may never answer.
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
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemonutil.h"
#include "base/error.h"
#include "fdstore.h"
#include "base/file.h"
#include "base/path.h"
#include "format/tree.h"
#include "generation.h"
#include "mountrule.h"
#include "proto/memfds.h"
#include "registry_internal.h"
#include "metrics.h"
#include "restore.h"
#include "restore_internal.h"
#include "testutil.h"
#include "watch_internal.h"
#include "workq.h"

/* ---- fault injection ---- */

static atomic_int fail_mmap, fail_fstat, fail_memfd; /* errno to fail with, 0: none */
static atomic_int fail_index_reopen; /* errno to fail with, 0: none */

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __real_fstat(int fd, struct stat *st);
int __wrap_fstat(int fd, struct stat *st);
int __real_memfd_create(const char *name, unsigned flags);
int __wrap_memfd_create(const char *name, unsigned flags);
int __real_munmap(void *addr, size_t len);
int __wrap_munmap(void *addr, size_t len);
int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);
char *__real_realpath(const char *path, char *resolved);
char *__wrap_realpath(const char *path, char *resolved);
char *__real_strdup(const char *s);
char *__wrap_strdup(const char *s);
int __real_statx(int at, const char *path, int flags, unsigned mask, struct statx *sx);
int __wrap_statx(int at, const char *path, int flags, unsigned mask, struct statx *sx);
int __real_stat(const char *path, struct stat *st);
int __wrap_stat(const char *path, struct stat *st);
int __real_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);
int __wrap_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);

/* The statx calls made within walks of a run (mountrule_open with a run:
 * place_of's look, in an operator's load), one for each name walked. */
static _Thread_local int in_run;
static atomic_long run_statx;

int
__wrap_statx(int at, const char *path, int flags, unsigned mask, struct statx *sx)
{
	if (in_run)
		atomic_fetch_add(&run_statx, 1);
	return __real_statx(at, path, flags, mask, sx);
}

/* A neighbour's FUSE mount at fuse_at (set while fuse_armed): the judged
 * walk refuses it; fuse_asked counts the stat(2) calls by its name, each
 * of which would have waited on his server. */
static atomic_int fuse_armed, fuse_asked;
static char fuse_at[4096];

int
__wrap_stat(const char *path, struct stat *st)
{
	if (atomic_load(&fuse_armed) && strcmp(path, fuse_at) == 0)
		atomic_fetch_add(&fuse_asked, 1);
	return __real_stat(path, st);
}

int
__wrap_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	int r;

	if (atomic_load(&fuse_armed) && strcmp(path, fuse_at) == 0) {
		snprintf(why, len, "%s: fuse mounted by uid 12345 (the test's)", path);
		return -EXDEV;
	}
	in_run += w != NULL;
	r = __real_mountrule_open(w, path, why, len);
	in_run -= w != NULL;
	return r;
}

/* strdup() of strdup_fail_of fails once (ENOMEM) while strdup_armed is
 * set, and strdup_failed says it did (review rev210 L1). */
static atomic_int strdup_armed, strdup_failed;
static char strdup_fail_of[4096];

/* The opens of /proc/self/mountinfo (the mount table's reads). */
static atomic_int mountinfo_opens;

char *
__wrap_strdup(const char *s)
{
	if (atomic_load(&strdup_armed) && strcmp(s, strdup_fail_of) == 0 &&
		atomic_exchange(&strdup_armed, 0)) {
		atomic_store(&strdup_failed, 1);
		errno = ENOMEM;
		return NULL;
	}
	return __real_strdup(s);
}

/* A rename at a chosen moment of a load: on the swap_at-th realpath() of
 * swap_dir (counting down; 0: none), a symbolic link to swap_target is
 * renamed over swap_path, as the path's owner may do at any moment, and
 * swapped says it was. */
static atomic_int swap_at, swapped;
static char swap_dir[4096], swap_path[4096], swap_target[256];
/* And on the back_at-th realpath() of back_path (counting down), back_src
 * is renamed over it (backed 1); with relink, right after the realpath of
 * back_path that follows, a link to swap_target again (backed 2): a path
 * that is a regular file only when it is resolved (review rev185 F1, F2). */
static atomic_int back_at, backed, relink;
static char back_path[4096], back_src[4200];


/* rev187: exchanges (renameat2 RENAME_EXCHANGE) of two paths at chosen
 * realpath() calls: hook i fires on the nth call (counting from 1) of
 * realpath(path), before it (after 0) or after it (after 1). */
struct r187_hook {
	char path[4096];
	int nth, after, seen, fired;
	char a[4096], b[4096];
};
#define R187_HOOKS 8
static struct r187_hook r187[R187_HOOKS];
static atomic_int r187_on;

static void
r187_fire(const char *path, int after)
{
	for (int i = 0; i < R187_HOOKS; i++) {
		struct r187_hook *h = &r187[i];

		if (h->path[0] == '\0' || strcmp(h->path, path) != 0)
			continue;
		if (!after)
			h->seen++;
		if (h->seen == h->nth && h->after == after && !h->fired &&
			renameat2(AT_FDCWD, h->a, AT_FDCWD, h->b, RENAME_EXCHANGE) == 0)
			h->fired = 1;
	}
}

/* The renames set for the moment a real path of path is asked for
 * (realpath(3), or the load's mountrule_realpath and
 * mountrule_fd_realpath, which took the places of its realpath(3) calls:
 * the same moments of a load), before it (after 0) and after it. */
static void
moment(const char *path, int after)
{
	char tmp[4200];

	if (atomic_load(&r187_on)) {
		r187_fire(path, after);
		return;
	}
	if (after) {
		if (atomic_load(&relink) && atomic_load(&backed) == 1 &&
			strcmp(path, back_path) == 0) {
			snprintf(tmp, sizeof(tmp), "%s.swap2", back_path);
			if (symlink(swap_target, tmp) == 0 && rename(tmp, back_path) == 0)
				atomic_store(&backed, 2);
		}
		return;
	}
	if (atomic_load(&swap_at) > 0 && strcmp(path, swap_dir) == 0 &&
		atomic_fetch_sub(&swap_at, 1) == 1) {
		snprintf(tmp, sizeof(tmp), "%s.swap", swap_path);
		if (symlink(swap_target, tmp) == 0 && rename(tmp, swap_path) == 0)
			atomic_store(&swapped, 1);
	}
	if (atomic_load(&back_at) > 0 && strcmp(path, back_path) == 0 &&
		atomic_fetch_sub(&back_at, 1) == 1 && rename(back_src, back_path) == 0)
		atomic_store(&backed, 1);
}

char *
__wrap_realpath(const char *path, char *resolved)
{
	char *r;

	moment(path, 0);
	r = __real_realpath(path, resolved);
	moment(path, 1);
	return r;
}

char *
__wrap_mountrule_realpath(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	char *r;

	moment(path, 0);
	r = __real_mountrule_realpath(w, path, why, len);
	moment(path, 1);
	return r;
}

/* mountrule_fd_realpath() of fd_oom_of fails once (ENOMEM) while
 * fd_oom_armed is set, and fd_oom_failed says it did: place_of's name of
 * a directory reached (judged_place), out of memory (review rev210 L1). */
static atomic_int fd_oom_armed, fd_oom_failed;
static char fd_oom_of[4096];

char *
__wrap_mountrule_fd_realpath(struct mountrule_walk *w, int fd, const char *path, char *why,
	size_t len)
{
	char *r;

	if (atomic_load(&fd_oom_armed) && strcmp(path, fd_oom_of) == 0 &&
		atomic_exchange(&fd_oom_armed, 0)) {
		atomic_store(&fd_oom_failed, 1);
		errno = ENOMEM;
		return NULL;
	}
	moment(path, 0);
	r = __real_mountrule_fd_realpath(w, fd, path, why, len);
	moment(path, 1);
	return r;
}

int
__wrap_open(const char *path, int flags, ...)
{
	int e = atomic_load(&fail_index_reopen);
	mode_t mode = 0;
	char link[128];
	ssize_t n;

	if (flags & O_CREAT) {
		va_list ap;

		va_start(ap, flags);
		mode = (mode_t)va_arg(ap, unsigned);
		va_end(ap);
	}
	if (strcmp(path, "/proc/self/mountinfo") == 0)
		atomic_fetch_add(&mountinfo_opens, 1);
	if (e != 0 && strncmp(path, "/proc/self/fd/", 14) == 0 &&
		(n = readlink(path, link, sizeof(link) - 1)) > 0) {
		link[n] = '\0';
		if (strstr(link, "memfd:wcache-index") != NULL) {
			errno = e;
			return -1;
		}
	}
	return __real_open(path, flags, mode);
}

/* The ranges munmap was called with while record_munmap is set. */
#define MUNMAP_RECORDED 16
static atomic_bool record_munmap;
static void *munmapped[MUNMAP_RECORDED];
static atomic_int n_munmapped;

int
__wrap_munmap(void *addr, size_t len)
{
	if (atomic_load(&record_munmap)) {
		int n = atomic_fetch_add(&n_munmapped, 1);

		if (n < MUNMAP_RECORDED)
			munmapped[n] = addr;
	}
	return __real_munmap(addr, len);
}

void *
__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	int e = atomic_load(&fail_mmap);

	if (e != 0 && fd >= 0) {
		errno = e;
		return MAP_FAILED;
	}
	return __real_mmap(addr, len, prot, flags, fd, off);
}

int
__wrap_fstat(int fd, struct stat *st)
{
	int e = atomic_load(&fail_fstat);

	if (e != 0) {
		errno = e;
		return -1;
	}
	return __real_fstat(fd, st);
}

int
__wrap_memfd_create(const char *name, unsigned flags)
{
	int e = atomic_load(&fail_memfd);

	if (e != 0) {
		errno = e;
		return -1;
	}
	return __real_memfd_create(name, flags);
}

static int
setup(void **state)
{
	atomic_store(&fail_mmap, 0);
	atomic_store(&fail_fstat, 0);
	atomic_store(&fail_memfd, 0);
	atomic_store(&fail_index_reopen, 0);
	atomic_store(&fuse_armed, 0);
	atomic_store(&fuse_asked, 0);
	atomic_store(&swap_at, 0);
	atomic_store(&swapped, 0);
	atomic_store(&back_at, 0);
	atomic_store(&backed, 0);
	atomic_store(&relink, 0);
	atomic_store(&record_munmap, false);
	atomic_store(&n_munmapped, 0);
	atomic_store(&r187_on, 0);
	tree_force_fallback = 0; /* a failed fallback test leaves it set */
	*state = du_new(false);
	return 0;
}

#define teardown du_free

static const struct registry_peer root_peer = { .pid = 1, .uid = 0, .gid = 0 };

/* ---- loading ---- */

static void
test_load_and_status_page(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct model_entry *m;
	struct generation *g;

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	assert_int_equal(t->generation, 1);
	assert_string_equal(t->message, "generation 1 is current");
	m = registry_find(&t->reg, "m");
	assert_non_null(m);
	assert_ptr_equal(registry_find(&t->reg, path), m); /* by path too */
	assert_null(registry_find(&t->reg, "other"));
	g = m->current;
	/* No warm pool: ready at once. */
	assert_int_equal(g->state, GEN_READY);
	assert_int_equal(g->bytes, 8 + strlen("{\"w\":{\"dtype\":\"F32\",\"shape\":[1024],"
					    "\"data_offsets\":[0,4096]}}") + 4096);
	assert_int_equal(t->reg.page.map[0], 0x54534357u);
	assert_int_equal(t->reg.page.map[m->slot], 1);
	assert_string_equal(registry_model_name(m), "m");
	assert_ptr_equal(registry_generation_of(g), m);
	free(path);
}

/* Takes every free descriptor below 333 into fill (their count in *n):
 * with fd_limit 400, a one-file model's load then takes 333, 334 and 335
 * and its index's reopen 336, the first of the reserve. */
static void
fill_below_333(int *fill, int *n)
{
	int fd;

	*n = 0;
	while ((fd = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0 && fd < 333)
		fill[(*n)++] = fd;
	assert_int_equal(fd, 333);
	close(fd);
}

/*
 * A load whose descriptors reach into the reserve wcached keeps free for
 * its clients (registry_fd_reserve: 64 of an RLIMIT_NOFILE of 400) is
 * refused with one line (review rev173 F9: a 250-shard model took the last
 * descriptors outside it, and every new client was refused); with those
 * descriptors free again it loads. Before, it loaded: nothing but the
 * accept of a client looked at the reserve.
 */
static void
test_load_stays_out_of_the_fd_reserve(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	int fill[400], n;

	t->reg.fd_limit = 400;
	/* The load's file, its reopen and its index take the lowest free
	 * descriptors: 333, 334 and 335; the index's reopen would be 336,
	 * the first of the reserve (400 - 64). */
	fill_below_333(fill, &n);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), -EMFILE);
	assert_non_null(strstr(t->message, "its 1 file took descriptors up to 336, into the 64 "
		"that wcached keeps free below its RLIMIT_NOFILE of 400"));
	assert_null(registry_find(&t->reg, "m")->current);
	while (n > 0)
		close(fill[--n]);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_int_equal(du_current(t, "m")->number, 1);
	free(path);
}

/* Review rev177 B: a reload whose files are unchanged keeps no descriptor
 * (it is discarded), so the reserve does not refuse it: it answered
 * -EMFILE and marked the serving model failed ("its replacement failed",
 * load_errors 1). A changed file that would reach the reserve still is
 * refused, and generation 1 serves on. */
static void
test_an_unchanged_reload_in_the_fd_reserve_stays_unchanged(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *next;
	int fill[400], n;
	struct model_entry *m;

	t->reg.fd_limit = 400;
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	next = du_model(t, "next.safetensors", 2048);
	fill_below_333(fill, &n);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_string_equal(t->message, "unchanged");
	m = registry_find(&t->reg, "m");
	assert_null(m->error);
	assert_int_equal(m->load_errors, 0);

	assert_int_equal(rename(next, path), 0);
	assert_int_equal(du_reload(t, "m"), -EMFILE);
	assert_non_null(strstr(t->message, "into the 64 that wcached keeps free"));
	assert_int_equal(du_current(t, "m")->number, 1);
	assert_int_equal(m->load_errors, 1);
	while (n > 0)
		close(fill[--n]);
	free(next);
	free(path);
}

static bool
served(struct du *t, void *arg)
{
	struct model_entry *m = registry_find(&t->reg, arg);

	return m != NULL && m->current != NULL && m->loading == 0;
}

/* Review rev177 F: a load refused for descriptors says that letting
 * workers release older generations mends it, but nothing loaded it again
 * once they did. Now the first generation to close after the refusal
 * loads it again, as a reload wcached makes by itself. */
static void
test_a_load_refused_for_descriptors_loads_when_a_generation_closes(void **state)
{
	struct du *t = *state;
	char *a = du_model(t, "a.safetensors", 1024), *m = du_model(t, "m.safetensors", 1024);
	char *next = du_model(t, "next.safetensors", 2048), msg[64];
	struct registry_attachment att;
	int fill[400], n;

	/* a's generation 1, attached, retired by its generation 2. */
	assert_int_equal(du_load(t, "a", a, PIN_NONE, 0), 0);
	assert_int_equal(registry_attach(&t->reg, "a", &root_peer, &att, msg, sizeof(msg)), 0);
	assert_int_equal(rename(next, a), 0);
	assert_int_equal(du_reload(t, "a"), 0);
	assert_int_equal(du_current(t, "a")->number, 2);

	t->reg.fd_limit = 400;
	fill_below_333(fill, &n);
	assert_int_equal(du_load(t, "m", m, PIN_NONE, 0), -EMFILE);
	assert_non_null(strstr(t->message, "(it is loaded again when one closes)"));
	assert_null(registry_find(&t->reg, "m")->current);
	while (n > 0)
		close(fill[--n]);
	/* Nothing loads it again until a generation closes. */
	assert_int_equal(registry_find(&t->reg, "m")->loading, 0);
	registry_release(&t->reg, att.gen, 0);
	assert_int_equal(registry_find(&t->reg, "m")->loading, 1);
	du_run_until(t, served, "m");
	assert_int_equal(du_current(t, "m")->number, 1);
	assert_null(registry_find(&t->reg, "m")->error);
	free(next);
	free(m);
	free(a);
}

static void
test_load_missing_file(void **state)
{
	struct du *t = *state;
	struct registry_attachment a;
	char msg[256], *path;

	assert_true(asprintf(&path, "%s/none.safetensors", t->dir) > 0);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), -ENOENT);
	assert_non_null(strstr(t->message, "none.safetensors"));
	assert_string_equal(metrics_model_state(registry_find(&t->reg, "m")), "failed");
	assert_int_equal(registry_find(&t->reg, "m")->load_errors, 1);
	/* An attach says why it is not served. */
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), -EIO);
	assert_true(strncmp(msg, "failed to load: ", 16) == 0);
	assert_non_null(strstr(msg, "none.safetensors"));
	free(path);
}

static void
test_load_faults(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);

	atomic_store(&fail_mmap, ENOMEM);
	assert_int_equal(du_load(t, "a", path, PIN_NONE, 1), -ENOMEM);
	assert_non_null(strstr(t->message, "m.safetensors"));
	atomic_store(&fail_mmap, 0);
	atomic_store(&fail_fstat, EIO);
	assert_int_equal(du_load(t, "b", path, PIN_NONE, 1), -EIO);
	atomic_store(&fail_fstat, 0);
	atomic_store(&fail_memfd, EMFILE);
	assert_int_equal(du_load(t, "c", path, PIN_NONE, 1), -EMFILE);
	assert_non_null(strstr(t->message, "memfd_create"));
	atomic_store(&fail_memfd, 0);
	assert_int_equal(du_generations(t), 0);
	/* A failed reload leaves the current generation serving. */
	assert_int_equal(du_load(t, "a", path, PIN_NONE, 1), 0);
	atomic_store(&fail_mmap, ENOMEM);
	assert_int_equal(du_load(t, "a", path, PIN_NONE, 1), -ENOMEM);
	atomic_store(&fail_mmap, 0);
	assert_int_equal(du_current(t, "a")->number, 1);
	assert_non_null(registry_find(&t->reg, "a")->error);
	assert_string_equal(metrics_model_state(registry_find(&t->reg, "a")), "ready");
	free(path);
}

/* The index memfd reopened for workers (gen_new) fails, as it does with the
 * descriptor table full: the load fails with that reason, logged once with
 * the model's name and kept as its error (an attach says it), not as an
 * unnamed "out of memory" that left the model failed without a reason. */
static void
test_load_index_reopen_fails(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *log, msg[256];
	struct registry_attachment a;
	int fds = tu_count_fds();

	atomic_store(&fail_index_reopen, EMFILE);
	du_log_start(t);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), -EMFILE);
	log = du_log_stop(t);
	atomic_store(&fail_index_reopen, 0);
	assert_non_null(strstr(t->message, "index"));
	assert_non_null(strstr(t->message, strerror(EMFILE)));
	assert_non_null(strstr(log, "model \"m\": "));
	assert_non_null(strstr(log, strerror(EMFILE)));
	assert_string_equal(metrics_model_state(registry_find(&t->reg, "m")), "failed");
	assert_int_equal(registry_find(&t->reg, "m")->load_errors, 1);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), -EIO);
	assert_non_null(strstr(msg, strerror(EMFILE)));
	assert_int_equal(du_generations(t), 0);
	du_settle(t);
	assert_int_equal(tu_count_fds(), fds);
	/* The fault passed: the model loads. */
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 1), 0);
	assert_null(registry_find(&t->reg, "m")->error);
	free(log);
	free(path);
}

/*
 * A load refused on the loop after a validation that worked (its
 * generation could not be made: the index memfd's reopen failed), served
 * where it lies or staged first: the failure notes its path as the load
 * opened it, whatever the path names (a directory, a shard index, a link),
 * which the watch armed again compares a stat of the path with
 * (watch_stat_sig). Before, it noted the stat of the source's first file:
 * a directory's or an index's never matched it, nor did a staged copy's
 * file, and the watch took the model for changed and loaded it again.
 */
static void
refused_on_the_loop(enum du_kind kind, int staged)
{
	struct du *t = du_new(false);
	char *path = du_model_kind(t, "srv", kind), *stage_dir = path_join(t->dir, "staged");
	const struct model_entry *m;
	struct stat st;

	print_message("model path: %s%s\n", du_kind_name(kind), staged ? ", staged" : "");
	assert_non_null(stage_dir);
	if (staged) {
		/* Served where it lies first (a local file under stage =
		 * auto): the reload stages it. */
		assert_int_equal(registry_set_stage_dir(&t->reg, stage_dir), 0);
		assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
		assert_int_equal(registry_set_storage(&t->reg, "m", FS_WATCH_INOTIFY, 0,
					 FS_STAGE_YES), 0);
	}
	atomic_store(&fail_index_reopen, EMFILE);
	assert_int_equal(staged ? du_reload(t, "m") : du_load(t, "m", path, PIN_NONE, 0),
		-EMFILE);
	atomic_store(&fail_index_reopen, 0);
	m = registry_find(&t->reg, "m");
	assert_int_equal(m->load_errors, 1);
	assert_int_equal(stat(path, &st), 0);
	assert_true(m->failed_path.known);
	assert_int_equal(m->failed_path.err, 0);
	assert_true(watch_stat_sig(0, &m->failed_path.st) == watch_stat_sig(0, &st));
	free(stage_dir);
	free(path);
	du_teardown(t);
	free(t);
}

static void
test_a_load_refused_on_the_loop_notes_its_path(void **state)
{
	(void)state;
	for (int staged = 0; staged < 2; staged++)
		for (enum du_kind kind = 0; kind < DU_KINDS; kind++)
			refused_on_the_loop(kind, staged);
}

static void
test_reload(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *next;
	struct model_entry *m;

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_string_equal(t->message, "unchanged");
	assert_int_equal(t->generation, 1);
	/* A new inode renamed over the path is the next generation. */
	next = du_model(t, "next.safetensors", 2048);
	assert_int_equal(rename(next, path), 0);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_int_equal(t->generation, 2);
	m = registry_find(&t->reg, "m");
	assert_int_equal(m->current->number, 2);
	assert_int_equal(m->swap_count, 1);
	assert_int_equal(du_generations(t), 1);
	/* Modified in place with its size and mtime as they were (a chmod):
	 * the operator's reload serves the same inode again, a new
	 * generation (review rev181 F12)... */
	registry_mark_modified(&t->reg, m->current, path);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_int_equal(t->generation, 3);
	assert_int_equal(m->current->state, GEN_READY);
	/* ... but one whose mtime moved (written) is refused: rename(2). */
	{
		struct timespec times[2] = { { 0, UTIME_OMIT }, { 1, 0 } };

		assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
	}
	registry_mark_modified(&t->reg, m->current, path);
	assert_int_equal(du_reload(t, "m"), -ESTALE);
	assert_int_equal(m->current->number, 3);
	assert_int_equal(registry_reload(&t->reg, "none", NULL, NULL), -ENOENT);
	free(next);
	free(path);
}

static void
test_unload(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct registry_attachment a;
	char msg[64];
	unsigned slot;

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	slot = registry_find(&t->reg, "m")->slot;
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), 0);
	assert_int_equal(registry_unload(&t->reg, "m"), 0);
	assert_int_equal(registry_unload(&t->reg, "m"), -ENOENT);
	/* Not served, and its last number kept for a restart (statuspage.h). */
	assert_int_equal(t->reg.page.map[slot], STATUS_SLOT_RETIRED | 1);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)),
		-ENOENT);
	assert_string_equal(msg, "not served");
	/* Held: still open until released. */
	assert_int_equal(du_generations(t), 1);
	assert_null(registry_generation_of(a.gen));
	registry_release(&t->reg, a.gen, 0);
	assert_int_equal(du_generations(t), 0);
	/* Loaded again: the same slot, numbers keep growing. */
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	assert_int_equal(t->generation, 2);
	assert_int_equal(registry_find(&t->reg, "m")->slot, slot);
	free(path);
}

/* A load (wcachectl load, a configuration reload) of a model that a warm
 * restart listed as loading (registry_expect) takes its place; when the
 * restore's check ends, the model is no longer counted as loading, so
 * that its later reloads run. */
static void
test_expect_superseded(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *next;
	uint64_t token = registry_expect(&t->reg, "m", path, PIN_NONE, 0);

	assert_true(token != 0);
	assert_int_equal(registry_find(&t->reg, "m")->loading, 1);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	assert_int_equal(t->generation, 1);
	/* The check ends: the load took the model's place. */
	assert_int_equal(registry_expect_end(&t->reg, "m", token), 0);
	assert_int_equal(registry_find(&t->reg, "m")->loading, 0);
	assert_int_equal(registry_expect_end(&t->reg, "m", token), 0);
	assert_int_equal(registry_find(&t->reg, "m")->loading, 0);
	/* A reload of a file renamed over the path loads it. */
	next = du_model(t, "next.safetensors", 2048);
	assert_int_equal(rename(next, path), 0);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_int_equal(t->generation, 2);
	assert_int_equal(registry_find(&t->reg, "m")->current->number, 2);
	/* Still waiting: the check's end says to load it afresh, once. */
	token = registry_expect(&t->reg, "e", path, PIN_NONE, 0);
	assert_true(token != 0);
	assert_int_equal(registry_expect_end(&t->reg, "e", token), 1);
	assert_int_equal(registry_find(&t->reg, "e")->loading, 0);
	assert_int_equal(registry_expect_end(&t->reg, "e", token), 0);
	assert_int_equal(registry_find(&t->reg, "e")->loading, 0);
	free(next);
	free(path);
}

static bool
not_loading(struct du *t, void *name)
{
	return registry_find(&t->reg, name)->loading == 0;
}

/* A reload of a model asked for while a warm restart's check of it runs
 * (registry_reload sees it loading) runs once the check's generation
 * serves: the check may have looked at the files before they changed. */
static void
test_reload_during_expect(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct model_source src = { .format = FORMAT_SAFETENSORS };
	uint64_t token;
	int fd, ifd;

	/* "x" is loaded from the same file: its index is m's too. */
	assert_int_equal(du_load(t, "x", path, PIN_NONE, 0), 0);
	token = registry_expect(&t->reg, "m", path, PIN_NONE, 0);
	assert_true(token != 0);
	assert_int_equal(du_reload(t, "m"), 0); /* "already in progress" */
	assert_int_equal(registry_find(&t->reg, "m")->reload_again, RELOAD_OPERATOR);
	assert_non_null(src.files = calloc(1, sizeof(*src.files)));
	assert_true((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
	assert_int_equal(file_from_fd(fd, path, &src.files[0]), 0);
	src.nfiles = 1;
	assert_true((ifd = fcntl(du_current(t, "x")->index_fd, F_DUPFD_CLOEXEC, 0)) >= 0);
	assert_int_equal(restore_adopt_current(&t->reg, &(struct restore_served){ .name = "m",
		.path = path, .number = 1, .src = &src, .index_fd = ifd,
		.index_size = du_current(t, "x")->index_size }, PIN_NONE, 0, token), 0);
	free(src.files);
	/* The reload asked for runs now. */
	assert_int_equal(registry_find(&t->reg, "m")->reload_again, 0);
	assert_int_equal(registry_find(&t->reg, "m")->loading, 1);
	du_run_until(t, not_loading, "m");
	assert_int_equal(du_current(t, "m")->number, 1); /* unchanged */
	free(path);
}

/* A warm restart's check of a stored index memfd that is sealed and of the
 * described size but not a valid index fails, and unmaps its mapping once:
 * a second munmap on the work queue thread could unmap what another thread
 * mapped there meanwhile. */
static void
test_restore_check_bad_index(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct fdstore_file file = { .fdname = "wc-1-g1-f0" };
	struct fdstore_generation g = { .number = 1, .role = FDSTORE_CURRENT,
		.index_fdname = "wc-1-g1-i", .index_size = 4096, .nfiles = 1, .files = &file };
	struct restore_prepared p = { .g = &g };
	uint8_t junk[4096];
	int fd;

	memset(junk, 0x5a, sizeof(junk));
	assert_true((fd = memfd_sealed("wcache-index", junk, sizeof(junk),
			     F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, 0)) >= 0);
	p.index_fd = fd;
	assert_non_null(p.fds = calloc(1, sizeof(*p.fds)));
	assert_non_null(p.at = calloc(1, sizeof(*p.at)));
	p.fds[0] = -1;
	atomic_store(&record_munmap, true);
	restore_check_generation(&p, path, NULL);
	atomic_store(&record_munmap, false);
	assert_int_equal(p.err, -EINVAL);
	assert_non_null(strstr(p.why, "not valid"));
	for (int i = 0; i < atomic_load(&n_munmapped) && i < MUNMAP_RECORDED; i++)
		for (int k = i + 1; k < atomic_load(&n_munmapped) && k < MUNMAP_RECORDED; k++)
			assert_ptr_not_equal(munmapped[i], munmapped[k]);
	restore_prepared_clear(&t->reg, &p);
	close(fd);
	free(path);
}

static void
test_unload_during_load(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	int before = t->done_calls;

	assert_int_equal(registry_load(&t->reg, "m", path, PIN_NONE, 0, NULL, NULL), 0);
	assert_string_equal(metrics_model_state(registry_find(&t->reg, "m")), "loading");
	assert_int_equal(registry_unload(&t->reg, "m"), 0);
	du_settle(t);
	while (t->reg.loads_in_flight > 0)
		uv_run(&t->loop, UV_RUN_ONCE);
	assert_int_equal(t->done_calls, before);
	assert_null(registry_find(&t->reg, "m"));
	assert_int_equal(du_generations(t), 0);
	free(path);
}

static void
test_forget(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *missing;
	uint64_t id;

	assert_true(asprintf(&missing, "%s/none", t->dir) > 0);
	assert_true(du_load(t, "bad", missing, PIN_NONE, 0) < 0);
	id = registry_find(&t->reg, "bad")->entry_id;
	assert_int_equal(registry_forget(&t->reg, "bad", id + 1), -ENOENT);
	assert_int_equal(registry_forget(&t->reg, "bad", id), 0);
	assert_null(registry_find(&t->reg, "bad"));
	/* A model that serves is not forgotten. */
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	id = registry_find(&t->reg, "m")->entry_id;
	assert_int_equal(registry_forget(&t->reg, "m", id), -EBUSY);
	free(missing);
	free(path);
}

static void
test_progress_and_close_with_load_in_flight(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	uint64_t done, total;
	unsigned warming, models;

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	registry_progress(&t->reg, &done, &total, &warming, &models);
	assert_int_equal(models, 1);
	assert_int_equal(warming, 0);
	assert_int_equal(done, total);
	assert_int_equal(total, du_current(t, "m")->bytes);
	/* A load still on the work queue at shutdown is cancelled. */
	assert_int_equal(registry_load(&t->reg, "n", path, PIN_NONE, 0, NULL, NULL), 0);
	free(path);
}

/* A job that holds the work queue's share of remote and unknown
 * filesystems (where a first load goes) until the test writes to its pipe,
 * or 10 s have passed (a failing test must not hang at its teardown). */
struct blocker {
	struct workq_job job;
	int pipe[2];
	bool ended;
};

static void
blocker_run(struct workq_job *w)
{
	struct blocker *b = w->arg;
	struct pollfd p = { .fd = b->pipe[0], .events = POLLIN };

	while (poll(&p, 1, 10000) < 0 && errno == EINTR)
		;
}

static void
blocker_after(struct workq_job *w, int status)
{
	(void)status;
	((struct blocker *)w->arg)->ended = true;
}

static bool
blocker_ended(struct du *t, void *b)
{
	(void)t;
	return ((struct blocker *)b)->ended;
}

struct answer {
	int calls;
	int status;
	char message[256];
};

static void
answer_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct answer *a = arg;

	(void)generation;
	a->calls++;
	a->status = status;
	snprintf(a->message, sizeof(a->message), "%s", message != NULL ? message : "");
}

static bool
answered(struct du *t, void *a)
{
	(void)t;
	return ((struct answer *)a)->calls > 0;
}

/* Holds the work queue's share of remote and unknown filesystems with b
 * (remote_limit 1: one such job at a time), then queues a load of path as
 * the model "m", answered into a, that waits its turn behind b. */
static void
load_behind_blocker(struct du *t, struct blocker *b, const char *path, struct answer *a)
{
	t->reg.workq.remote_limit = 1;
	assert_int_equal(pipe2(b->pipe, O_CLOEXEC), 0);
	b->job.arg = b;
	assert_int_equal(workq_submit(&t->reg.workq, &b->job, WORKQ_UNKNOWN, "blocker",
				 blocker_run, blocker_after), 0);
	assert_int_equal(registry_load(&t->reg, "m", path, PIN_NONE, 0, answer_done, a), 0);
	assert_int_equal(t->reg.workq.remote_waiting, 1);
}

/* A load still waiting for its turn on the work queue that a newer load of
 * the model supersedes is withdrawn without opening anything, and answered
 * "superseded" on the loop, never from within the newer registry_load:
 * its callers rely on that (a control request still being set up, a batch
 * in the middle of its loads). */
static void
test_superseded_waiting_load_answered_on_the_loop(void **state)
{
	struct du *t = *state;
	char *a = du_model(t, "a.safetensors", 1024), *b = du_model(t, "b.safetensors", 2048);
	/* On the heap: a failed assertion leaves this function, not the job
	 * and the answers the loop still owes (the teardown runs them). */
	struct {
		struct blocker blk;
		struct answer first, second;
	} *c = calloc(1, sizeof(*c));

	assert_non_null(c);
	load_behind_blocker(t, &c->blk, a, &c->first);
	assert_int_equal(registry_load(&t->reg, "m", b, PIN_NONE, 0, answer_done, &c->second),
		0);
	assert_int_equal(c->first.calls, 0);
	du_run_until(t, answered, &c->first);
	assert_int_equal(c->first.status, -ECANCELED);
	assert_non_null(strstr(c->first.message, "superseded"));
	assert_int_equal(c->second.calls, 0); /* waits behind the blocker */
	assert_int_equal(t->reg.workq.remote_waiting, 1);
	assert_int_equal(write(c->blk.pipe[1], "x", 1), 1);
	du_run_until(t, answered, &c->second);
	assert_int_equal(c->second.status, 0);
	assert_int_equal(c->first.calls, 1);
	assert_int_equal(du_current(t, "m")->number, 1);
	du_run_until(t, blocker_ended, &c->blk);
	close(c->blk.pipe[0]);
	close(c->blk.pipe[1]);
	free(c);
	free(a);
	free(b);
}

/* A load still waiting for its turn on the work queue when its model is
 * unloaded (wcachectl unload, or a configuration reload that drops the
 * model) is withdrawn without opening anything and answered on the loop,
 * never from within registry_unload, saying why. Before, it waited for the
 * queue, then opened and validated the files only to be discarded. */
static void
test_unloaded_waiting_load_answered_on_the_loop(void **state)
{
	struct du *t = *state;
	char *a = du_model(t, "a.safetensors", 1024);
	/* On the heap, as in the test above. */
	struct {
		struct blocker blk;
		struct answer first;
	} *c = calloc(1, sizeof(*c));

	assert_non_null(c);
	load_behind_blocker(t, &c->blk, a, &c->first);
	assert_int_equal(registry_unload(&t->reg, "m"), 0);
	assert_int_equal(c->first.calls, 0);
	du_run_until(t, answered, &c->first);
	assert_string_equal(c->first.message, "unloaded before its load began");
	assert_int_equal(c->first.status, -ECANCELED);
	assert_false(c->blk.ended); /* answered while the queue is still held */
	assert_int_equal(t->reg.workq.remote_waiting, 0);
	assert_int_equal(t->reg.loads_in_flight, 0);
	assert_null(registry_find(&t->reg, "m"));
	assert_int_equal(write(c->blk.pipe[1], "x", 1), 1);
	du_run_until(t, blocker_ended, &c->blk);
	assert_int_equal(c->first.calls, 1);
	close(c->blk.pipe[0]);
	close(c->blk.pipe[1]);
	free(c);
	free(a);
}

/* m, a 64 KiB model (*path, malloc'd), loaded with pin = metadata and
 * settled: its current generation. */
static struct generation *
settled_model(struct du *t, char **path)
{
	*path = du_model(t, "m.safetensors", (size_t)64 * 1024);
	assert_int_equal(du_load(t, "m", *path, PIN_METADATA, 0), 0);
	du_settle(t);
	return du_current(t, "m");
}

/* A page operation asked again while the same one still waits its turn
 * behind the running one (a pin reading a slow mount; departed `timeout 1
 * wcachectl pin x` or `evict x` in a loop) is that operation: before, each
 * ran in turn, a pin of a model already locked walking all its pages
 * again. Every waiter is still answered once the model's page work ends. */
static void
test_page_operation_asked_again_runs_once(void **state)
{
	struct du *t = *state;
	char *path;
	struct generation *g = settled_model(t, &path);
	/* On the heap, as in the tests above. */
	struct answer *a = calloc(2, sizeof(*a));

	assert_non_null(a);
	/* The loop does not run until du_settle: the first pin runs (or has
	 * run, unreported) meanwhile, the rest wait their turn. */
	for (int i = 0; i < 10; i++)
		assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", answer_done, &a[0]), 0);
	assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(registry_evict(&t->reg, "m"), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", answer_done, &a[1]), 0);
	/* The running pin, one more that the unpin took over (the pins and
	 * unpins in turn below), one evict (before: 21). */
	assert_int_equal(g->ops_pending, 3);
	du_settle(t);
	assert_int_equal(a[0].calls, 1);
	assert_int_equal(a[0].status, 0);
	assert_int_equal(a[1].calls, 1);
	assert_int_equal(a[1].status, 0);
	assert_int_equal(g->state, GEN_COLD);
	assert_int_equal(g->pinned, PIN_METADATA);
	free(a);
	free(path);
}

/*
 * Pins and unpins asked in turn while the first still runs (departed
 * `timeout 1 wcachectl pin x` and `unpin x` in a loop): the one waiting
 * becomes the newest of them, since the model's pin mode was set when each
 * was asked and the pages need only end as the last says. Before, each
 * queued one more pass over every page (an unpin then a pin of a locked
 * 100 GiB model: two, about 7 s each), without bound.
 */
static void
test_pins_and_unpins_in_turn_run_as_the_last(void **state)
{
	struct du *t = *state;
	char *path;
	struct generation *g = settled_model(t, &path);
	struct answer *a = calloc(1, sizeof(*a));

	assert_non_null(a);
	for (int i = 0; i < 10; i++) {
		assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
		assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
	}
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	assert_int_equal(registry_pages_wait(&t->reg, "m", answer_done, &a[0]), 0);
	/* The running pin and one waiting (before: 21). */
	assert_int_equal(g->ops_pending, 2);
	du_settle(t);
	assert_int_equal(a[0].calls, 1);
	assert_int_equal(a[0].status, 0);
	assert_int_equal(g->pinned, PIN_ALL);
	/* The reverse: ends unpinned, the metadata still locked. */
	for (int i = 0; i < 10; i++) {
		assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
		assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	}
	assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
	assert_int_equal(g->ops_pending, 2);
	du_settle(t);
	assert_int_equal(g->pinned, PIN_METADATA);
	free(a);
	free(path);
}

/* Runs the loop until the model "m" has no load in flight and its page
 * work is done: its current generation. */
static struct generation *
loaded(struct du *t)
{
	du_run_until(t, not_loading, (void *)"m");
	du_settle(t);
	return du_current(t, "m");
}

/* Renames a new model file (64 KiB) over path: the next load of path is a
 * new generation. */
static void
replace_model(struct du *t, const char *path)
{
	char *next = du_model(t, "next.safetensors", (size_t)64 * 1024);

	assert_int_equal(rename(next, path), 0);
	free(next);
}

/*
 * A pin or unpin asked while a load of the model is in flight (a watch's
 * reload after a rename, `wcachectl reload NAME`, a config reload that
 * changes only pin) is the newer word: the load installs its generation
 * with the pin asked meanwhile, not the one the model had when the load was
 * queued, and the new generation's pages end as that pin says. Before, the
 * load wrote its older pin back: `wcachectl pin m` during a reload left
 * generation 2 with pin = metadata, a config reload's pin = all was lost
 * for good (later reloads saw no change), and an unpin came back as
 * pin = all. A load asked after the pin still sets its own.
 */
static void
test_a_pin_asked_during_a_load_outlives_it(void **state)
{
	struct du *t = *state;
	char *path;
	struct generation *g = settled_model(t, &path);
	struct model_entry *m = registry_find(&t->reg, "m");

	assert_int_equal(g->pinned, PIN_METADATA);
	/* Pinned while the reload of a replacement is in flight (its answer
	 * comes from the loop, which has not run yet). */
	replace_model(t, path);
	assert_int_equal(registry_reload(&t->reg, "m", NULL, NULL), 0);
	assert_int_equal(m->loading, 1);
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	g = loaded(t);
	assert_int_equal(g->number, 2);
	assert_int_equal(m->pin, PIN_ALL);
	assert_int_equal(g->pinned, PIN_ALL);
	/* Pinned and settled, then unpinned while the next one loads: it comes
	 * up unpinned. */
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	du_settle(t);
	replace_model(t, path);
	assert_int_equal(registry_reload(&t->reg, "m", NULL, NULL), 0);
	assert_int_equal(registry_pin(&t->reg, "m", PIN_METADATA), 0);
	g = loaded(t);
	assert_int_equal(g->number, 3);
	assert_int_equal(m->pin, PIN_METADATA);
	assert_int_equal(g->pinned, PIN_METADATA);
	/* A load asked after the pin sets its own. */
	assert_int_equal(registry_pin(&t->reg, "m", PIN_ALL), 0);
	replace_model(t, path);
	assert_int_equal(du_load(t, "m", path, PIN_METADATA, 0), 0);
	g = loaded(t);
	assert_int_equal(g->number, 4);
	assert_int_equal(m->pin, PIN_METADATA);
	assert_int_equal(g->pinned, PIN_METADATA);
	free(path);
}

/* Renames a file that is not a model (text) over path and reloads the
 * model "m", which fails: what that logged. */
static char *
failed_reload_log(struct du *t, const char *path, const char *text)
{
	char *bad = tu_write(t->dir, "bad.safetensors", text, strlen(text)), *log;

	assert_int_equal(rename(bad, path), 0);
	free(bad);
	du_log_start(t);
	assert_true(du_reload(t, "m") < 0);
	log = du_log_stop(t);
	return log;
}

/*
 * A load that fails says what still serves its model, as attaches find it:
 * the current generation while it is attachable, and "not served" with the
 * reason when it refuses every attach (modified in place here). Before,
 * any current generation read "generation still serving", a modified one
 * included, whose every attach was refused.
 */
static void
test_a_failed_load_says_what_still_serves(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *log, msg[256];
	struct registry_attachment a;

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	/* Not a model renamed over it: generation 1 serves on. */
	log = failed_reload_log(t, path, "not a model");
	assert_non_null(strstr(log, "; generation 1 still serving\n"));
	free(log);
	/* Generation 1 modified in place refuses every attach: a failed load
	 * says nothing serves, and why. */
	registry_mark_modified(&t->reg, du_current(t, "m"), path);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)),
		-ESTALE);
	log = failed_reload_log(t, path, "not a model either");
	assert_non_null(strstr(log, "; not served: generation 1 was modified in place\n"));
	assert_null(strstr(log, "still serving"));
	free(log);
	free(path);
}

/*
 * A reload of files that did not change still makes a generation when the
 * current one is staged, or not, against the model's stage key now (a warm
 * restart kept it from before the key changed): the files are staged, or
 * served where they are, as a load of them would be. Before, the reload
 * answered "unchanged", and a model with stage = yes kept serving its
 * source's files until they were replaced.
 */
static void
test_a_reload_stages_as_the_stage_key_says_now(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *stage_dir = path_join(t->dir, "staged");
	struct generation *g;

	assert_non_null(stage_dir);
	assert_int_equal(registry_set_stage_dir(&t->reg, stage_dir), 0);
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	assert_null(du_current(t, "m")->origin); /* stage = auto, a local file */
	assert_int_equal(registry_set_storage(&t->reg, "m", FS_WATCH_INOTIFY, 0, FS_STAGE_YES),
		0);
	assert_int_equal(du_reload(t, "m"), 0);
	g = du_current(t, "m");
	assert_int_equal(g->number, 2);
	assert_non_null(g->origin);
	assert_non_null(g->staged.dir);
	assert_int_equal(strncmp(g->source.files[0].path, stage_dir, strlen(stage_dir)), 0);
	/* Staged as stage = yes says: unchanged. */
	assert_int_equal(du_reload(t, "m"), 0);
	assert_string_equal(t->message, "unchanged");
	/* The reverse: stage = no serves the source's own files again. */
	assert_int_equal(registry_set_storage(&t->reg, "m", FS_WATCH_INOTIFY, 0, FS_STAGE_NO),
		0);
	assert_int_equal(du_reload(t, "m"), 0);
	g = du_current(t, "m");
	assert_int_equal(g->number, 3);
	assert_null(g->origin);
	assert_null(g->staged.dir);
	assert_string_equal(g->source.files[0].path, path);
	assert_int_equal(du_reload(t, "m"), 0);
	assert_string_equal(t->message, "unchanged");
	free(stage_dir);
	free(path);
}


/* r180: an HF hub single-file model configured before its download. */
static void
r180_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct du *t = arg;

	(void)generation;
	t->done_calls++;
	t->status = status;
	snprintf(t->message, sizeof(t->message), "%s", message);
}

/* A reload wcached makes by itself of name, run to its end: its status. */
static int
r180_watched(struct du *t, const char *name)
{
	int before = t->done_calls;

	assert_int_equal(registry_reload_watched(&t->reg, name, r180_done, t), 0);
	while (t->done_calls == before)
		uv_run(&t->loop, UV_RUN_ONCE);
	return t->status;
}

static void
test_r180_hub_file_appears(void **state)
{
	struct du *t = *state;
	char *p, *blob, cmd[4096];

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/hub/models--o--n/blobs", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/hub/models--o--n/snapshots/abc/model.safetensors",
		t->dir) > 0);
	assert_true(du_load(t, "m", p, PIN_NONE, 0) < 0);
	blob = du_model(t, "hub/models--o--n/blobs/h1", 1024);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/hub/models--o--n/snapshots/abc && "
		"ln -s ../../blobs/h1 %s", t->dir, p);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(r180_watched(t, "m"), 0);
	free(blob);
	free(p);
}


/* r180: an HF hub sharded model named by its index (a symlink into blobs/). */
static void
test_r180_hub_index_watched(void **state)
{
	struct du *t = *state;
	char *p, *blob, cmd[4096];
	struct generation *g;
	FILE *f;
	int before;

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/hub/models--o--n/blobs "
		"%s/hub/models--o--n/snapshots/abc", t->dir, t->dir);
	assert_int_equal(system(cmd), 0);
	blob = du_model(t, "hub/models--o--n/blobs/h1", 1024);
	snprintf(cmd, sizeof(cmd), "%s/hub/models--o--n/blobs/hidx", t->dir);
	assert_non_null(f = fopen(cmd, "w"));
	fputs("{\"weight_map\":{\"w\":\"s-1.safetensors\"}}", f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "cd %s/hub/models--o--n/snapshots/abc && ln -s ../../blobs/h1 "
		"s-1.safetensors && ln -s ../../blobs/hidx model.safetensors.index.json", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/hub/models--o--n/snapshots/abc/model.safetensors.index.json",
		t->dir) > 0);
	before = du_load(t, "m", p, PIN_NONE, 0);
	assert_int_equal(before, 0);
	g = du_current(t, "m");
	/* The shards are not beside the index's real path (blobs/hidx): no
	 * resolved path, but the hub repo is its tree. */
	assert_non_null(g->tree_root);
	assert_non_null(strstr(g->tree_root, "/hub/models--o--n"));
	assert_int_equal(r180_watched(t, "m"), 0);
	assert_string_equal(t->message, "unchanged");
	assert_int_equal(registry_find(&t->reg, "m")->load_errors, 0);
	assert_null(registry_find(&t->reg, "m")->error);
	free(blob);
	free(p);
}


/* r180: a path through a link whose target is not there yet at start (a
 * mount not up): the files appear once it is. */
static void
test_r180_dangling_link_dir(void **state)
{
	struct du *t = *state;
	char *p, *blob, cmd[4096];

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/srv && ln -s %s/mnt/models %s/srv/models",
		t->dir, t->dir, t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/srv/models/m", t->dir) > 0);
	assert_true(du_load(t, "m", p, PIN_NONE, 0) < 0);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/mnt/models/m", t->dir);
	assert_int_equal(system(cmd), 0);
	blob = du_model(t, "mnt/models/m/model.safetensors", 1024);
	assert_int_equal(r180_watched(t, "m"), 0);
	free(blob);
	free(p);
}


/* r180: a directory model configured with a trailing slash before it exists. */
static void
test_r180_trailing_slash(void **state)
{
	struct du *t = *state;
	char *p, *blob, cmd[4096];

	assert_true(asprintf(&p, "%s/models/m/", t->dir) > 0);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/models", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(du_load(t, "m", p, PIN_NONE, 0) < 0);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/models/m", t->dir);
	assert_int_equal(system(cmd), 0);
	blob = du_model(t, "models/m/model.safetensors", 1024);
	assert_int_equal(r180_watched(t, "m"), 0);
	free(blob);
	free(p);
}


/* The model "llama" configured before its files at models/FILE, its
 * directory models/ made by the test's user: the path of the load, the
 * model not loaded (no generation). */
static char *
missing_llama(struct du *t, const char *file)
{
	char *p, cmd[4096];

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/models", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/models/%s", t->dir, file) > 0);
	assert_true(du_load(t, "llama", p, PIN_NONE, 0) < 0);
	return p;
}

/* r180 F5: a directory-model path not there yet; a link to another user's
 * single file in its parent directory. */
static void
test_r180_alt_any_file(void **state)
{
	struct du *t = *state;
	char *p = missing_llama(t, "llama"), *bob;

	bob = du_model(t, "models/bob.safetensors", 1024);
	assert_int_equal(chown(bob, 12345, 12345), 0);
	assert_int_equal(chmod(bob, 0600), 0);
	assert_int_equal(symlink("bob.safetensors", p), 0);
	assert_int_equal(r180_watched(t, "llama"), -EXDEV);
	assert_null(registry_find(&t->reg, "llama")->current);
	free(bob);
	free(p);
}

/* rev177 D kept closed: a directory-model path not there yet, renamed to a
 * link into another user's model in another directory, waits for the
 * operator's reload. */
static void
test_r180_no_generation_link_elsewhere_waits(void **state)
{
	struct du *t = *state;
	char *p, *bob, cmd[4096];

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/models %s/bob/m", t->dir, t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/models/alice", t->dir) > 0);
	assert_true(du_load(t, "alice", p, PIN_NONE, 0) < 0);
	bob = du_model(t, "bob/m/model.safetensors", 1024);
	snprintf(cmd, sizeof(cmd), "chown -R 12345 %s/bob && ln -s ../bob/m %s", t->dir, p);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(r180_watched(t, "alice"), -EXDEV);
	assert_null(registry_find(&t->reg, "alice")->current);
	free(bob);
	free(p);
}

/* "llama" configured at models/PLACE before it is there, then the model
 * file models/FILE made, given to uid, and a link at the place to it
 * (unless FILE is PLACE): what the reload wcached makes by itself then
 * answers; the model serves when that is 0. */
static int
llama_made(struct du *t, const char *place, const char *file, uid_t uid)
{
	char *p = missing_llama(t, place), *name, *f;
	int status;

	assert_true(asprintf(&name, "models/%s", file) > 0);
	f = du_model(t, name, 1024);
	assert_int_equal(chown(f, uid, uid), 0);
	if (strcmp(place, file) != 0)
		assert_int_equal(symlink(file, p), 0);
	status = r180_watched(t, "llama");
	assert_int_equal(status == 0, registry_find(&t->reg, "llama")->current != NULL);
	free(f);
	free(name);
	free(p);
	return status;
}

/* A file-spelt path, a link at it to another user's file beside it: waits
 * for the operator's reload, as a directory-spelt one does
 * (test_r180_alt_any_file): a directory holds other users' files. */
static void
test_link_at_file_place_to_other_users_file_waits(void **state)
{
	assert_int_equal(llama_made(*state, "llama.safetensors", "bob.safetensors", 12345),
		-EXDEV);
}

/* The file made at the place a path names loads by itself, whoever made
 * it, whether or not the path is spelt as a file's. */
static void
test_a_file_made_at_the_place_loads_whoever_made_it(void **state)
{
	assert_int_equal(llama_made(*state, "llama", "llama", 12345), 0);
}

/* A link at the place to a file beside it of the user who owns the
 * directory loads by itself, as a link to a directory of hers beside it
 * does (README's `ln -s v2 .next && mv -T .next llama`). */
static void
test_link_at_place_to_owners_file_beside_it_loads(void **state)
{
	assert_int_equal(llama_made(*state, "llama", "v2.safetensors", getuid()), 0);
}

/* Not only the owner: a path two names below the deepest directory found
 * (models/alice/m, models/alice not there), alice's directory made later
 * and given to her; her link to a tree of models/' owner elsewhere under
 * models/ waits for the operator's reload. A rule "any tree under models/
 * of its owner" would take it. */
static void
test_link_below_later_dir_to_owners_tree_waits(void **state)
{
	struct du *t = *state;
	char *p, *bob, cmd[4096];

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/models/bob/m", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/models/alice/m", t->dir) > 0);
	assert_true(du_load(t, "alice", p, PIN_NONE, 0) < 0);
	bob = du_model(t, "models/bob/m/model.safetensors", 1024);
	snprintf(cmd, sizeof(cmd), "mkdir %s/models/alice && chown 12345 %s/models/alice && "
		"ln -s ../bob/m %s", t->dir, t->dir, p);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(r180_watched(t, "alice"), -EXDEV);
	assert_null(registry_find(&t->reg, "alice")->current);
	free(bob);
	free(p);
}

/* The model "llama" configured before its index, models/llama.safetensors
 * .index.json, then made there by alice (23456), naming bob's (12345) 0600
 * file beside it as its one shard: the index's path. */
static char *
alice_index_naming_bobs_file(struct du *t)
{
	char *p = missing_llama(t, "llama.safetensors.index.json"), *bob;
	FILE *f;

	bob = du_model(t, "models/bob.safetensors", 1024);
	assert_int_equal(chown(bob, 12345, 12345), 0);
	assert_int_equal(chmod(bob, 0600), 0);
	assert_non_null(f = fopen(p, "w"));
	fputs("{\"weight_map\":{\"w\":\"bob.safetensors\"}}", f);
	fclose(f);
	assert_int_equal(chown(p, 23456, 23456), 0);
	free(bob);
	return p;
}

/* An index made at the place by alice that names bob's 0600 file beside it
 * as its shard: the file made at the place is taken, whoever made it, but
 * only with files of the one who made it (review rev182 F1: bob's bytes
 * were served to the model's clients). */
static void
test_index_at_place_naming_another_users_file_waits(void **state)
{
	struct du *t = *state;
	char *p = alice_index_naming_bobs_file(t);

	assert_int_equal(r180_watched(t, "llama"), -EXDEV);
	free(p);
}

/*
 * The maker of the file made at the place is the owner of the file wcached
 * opened there, not of what the path names when it checks: alice's index
 * (naming bob's 0600 file) was read, then a link to bob's file was renamed
 * over the index's path before the check, here as the load looks up the
 * place's directory once more (hub_root's realpath, the second of that
 * directory after the open's own). A stat(2) of the path then found bob's
 * file, "made" by bob with bob's files only, and served them as the model.
 */
static void
test_index_at_place_swapped_after_its_open_waits(void **state)
{
	struct du *t = *state;
	char *p = alice_index_naming_bobs_file(t), *dir;

	assert_non_null(dir = path_dir(p));
	snprintf(swap_dir, sizeof(swap_dir), "%s", dir);
	snprintf(swap_path, sizeof(swap_path), "%s", p);
	snprintf(swap_target, sizeof(swap_target), "bob.safetensors");
	atomic_store(&swap_at, 2);
	assert_int_equal(r180_watched(t, "llama"), -EXDEV);
	assert_int_equal(atomic_load(&swapped), 1);
	assert_non_null(strstr(t->message, "the operator's `wcachectl reload llama`"));
	free(dir);
	free(p);
}

/*
 * The model "llama" configured before its file at models/FILE, then made
 * there by alice (23456), with a spare copy of hers beside it
 * (models/FILE.alice, back_src) to rename back over it; bob's (12345) 0600
 * file models/bob.safetensors beside them. The realpath(3) wrap is aimed at
 * the place: a link to target renamed over it on a realpath of its
 * directory (swap_at), alice's copy renamed back on a realpath of the place
 * (back_at). The place's path.
 */
static char *
alice_file_at_place(struct du *t, const char *file, const char *content, const char *target)
{
	char *p = missing_llama(t, file), *bob, *dir;
	FILE *f;

	bob = du_model(t, "models/bob.safetensors", 1024);
	assert_int_equal(chown(bob, 12345, 12345), 0);
	assert_int_equal(chmod(bob, 0600), 0);
	snprintf(back_src, sizeof(back_src), "%s.alice", p);
	for (int i = 0; i < 2; i++) {
		assert_non_null(f = fopen(i == 0 ? p : back_src, "w"));
		fputs(content, f);
		fclose(f);
		assert_int_equal(chown(i == 0 ? p : back_src, 23456, 23456), 0);
	}
	assert_non_null(dir = path_dir(p));
	snprintf(swap_dir, sizeof(swap_dir), "%s", dir);
	snprintf(swap_path, sizeof(swap_path), "%s", p);
	snprintf(swap_target, sizeof(swap_target), "%s", target);
	snprintf(back_path, sizeof(back_path), "%s", p);
	free(dir);
	free(bob);
	return p;
}

/* A watched reload of alice_file_at_place's "llama", the link renamed over
 * the place on tree_open's realpath of its directory, alice's file renamed
 * back on gen_resolved_path's realpath of the path (and with relink_after,
 * the link again right after it): it waits for the operator's reload. */
static void
place_swapped_while_opened_waits(struct du *t, int relink_after)
{
	atomic_store(&swap_at, 1);
	atomic_store(&back_at, 2);
	atomic_store(&relink, relink_after);
	assert_int_equal(r180_watched(t, "llama"), -EXDEV);
	assert_int_equal(atomic_load(&swapped), 1);
	assert_int_equal(atomic_load(&backed), relink_after ? 2 : 1);
	assert_null(registry_find(&t->reg, "llama")->current);
}

/*
 * The file made at the place must be at the place after it was opened
 * (review rev185 F1): alice's regular file at the place for the realpath
 * before the open, a link to bob's index beside it renamed over it as the
 * tree is opened (tree_open's realpath of the directory: the index is opened
 * through the link, its fstat bob's), alice's file renamed back on
 * gen_resolved_path's realpath after the open. The path resolved to the
 * place both times, the opened index and its shard are bob's: bob's 0600
 * file was served as the model, taken as "made at the place by bob".
 */
static void
test_index_linked_at_place_while_opened_waits(void **state)
{
	struct du *t = *state;
	char *p = alice_file_at_place(t, "llama.safetensors.index.json", "{}",
		"bob.safetensors.index.json"), bidx[4400];
	FILE *f;

	snprintf(bidx, sizeof(bidx), "%s/%s", swap_dir, swap_target);
	assert_non_null(f = fopen(bidx, "w"));
	fputs("{\"weight_map\":{\"w\":\"bob.safetensors\"}}", f);
	fclose(f);
	assert_int_equal(chown(bidx, 12345, 12345), 0);
	assert_int_equal(chmod(bidx, 0600), 0);
	place_swapped_while_opened_waits(t, 0);
	free(p);
}

/*
 * The same for a model that is one file (review rev185 F2): alice's file at
 * the place for both realpaths of the path, a link to bob's 0600 file beside
 * it while the file is opened and again right after the realpath after the
 * open (relink), so that gen_resolved_path's stat(2) of the path followed it
 * to the opened file: bob's file was served as the model.
 */
static void
test_one_file_linked_at_place_while_opened_waits(void **state)
{
	struct du *t = *state;
	char *p = alice_file_at_place(t, "llama.safetensors", "alice", "bob.safetensors");

	place_swapped_while_opened_waits(t, 1);
	free(p);
}

/* The model "llama" loaded from t's rel: its path, its generation in *g1. */
static char *
llama_loaded(struct du *t, const char *rel, struct generation **g1)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", t->dir, rel) > 0);
	assert_int_equal(du_load(t, "llama", p, PIN_NONE, 0), 0);
	*g1 = du_current(t, "llama");
	return p;
}

/* A watched reload of "llama" with the swaps set (backed as backed_want
 * after it) waits for the operator's: g1 still current. */
static void
watched_keeps(struct du *t, const struct generation *g1, int backed_want)
{
	assert_int_equal(r180_watched(t, "llama"), -EXDEV);
	assert_int_equal(atomic_load(&swapped), 1);
	assert_int_equal(atomic_load(&backed), backed_want);
	assert_ptr_equal(du_current(t, "llama"), g1);
}

/*
 * A hub snapshot's file must be at its place in the repo after the open,
 * found from the repo's directory with no link out of it followed (review
 * rev185 F3): hub_root takes the repo of the snapshot the path's directory
 * resolves to *after* the open, and tied the opened files to it with
 * stat(2), which follows a link anywhere. alice's model: llama -> her
 * repo's snapshot r1 (generation 1, tree: her repo). She points llama at
 * bob's snapshot (the file is opened in bob's repo), then, after the open,
 * at her snapshot r2 whose model.safetensors is an absolute link to bob's
 * 0600 blob: "the same tree" as generation 1, and bob's blob was served as
 * her generation 2.
 */
static void
test_hub_snapshot_linking_out_after_open_waits(void **state)
{
	struct du *t = *state;
	char *p, *a, *b, cmd[8192];
	struct generation *g1;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p hub/models--a--m/blobs "
		"hub/models--a--m/snapshots/r1 hub/models--a--m/snapshots/r2 "
		"hub/models--b--m/blobs hub/models--b--m/snapshots/R", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "hub/models--a--m/blobs/A", 1024);
	b = du_model(t, "hub/models--b--m/blobs/H", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/hub && "
		"ln -s ../../blobs/A models--a--m/snapshots/r1/model.safetensors && "
		"ln -s ../../blobs/H models--b--m/snapshots/R/model.safetensors && "
		"ln -s %s models--a--m/snapshots/r2/model.safetensors && "
		"chown -R 23456:23456 models--a--m && chown -R 12345:12345 models--b--m && "
		"chmod 0600 %s && ln -s hub/models--a--m/snapshots/r1 ../llama", t->dir, b, b);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "llama/model.safetensors", &g1);
	/* alice: llama -> bob's snapshot; swapped to her r2 at hub_root's realpath */
	snprintf(cmd, sizeof(cmd), "cd %s && ln -s hub/models--b--m/snapshots/R llama.n && "
		"mv -T llama.n llama", t->dir);
	assert_int_equal(system(cmd), 0);
	snprintf(swap_dir, sizeof(swap_dir), "%s/llama", t->dir);
	snprintf(swap_path, sizeof(swap_path), "%s/llama", t->dir);
	snprintf(swap_target, sizeof(swap_target), "hub/models--a--m/snapshots/r2");
	atomic_store(&swap_at, 2);
	watched_keeps(t, g1, 0); /* else bob's blob was taken as her tree's */
	free(a);
	free(b);
	free(p);
}

/* A file at its place under the resolved path is found beneath that
 * path's tree, with no link out of it followed (review rev185 F5): no
 * at_place, no hub, a deployer's sibling swap. gen_resolved_path tied the
 * opened files to the resolved path with stat(2) (is_file_at), which
 * follows a link out of the tree. llama -> v1 (alice's, generation 1). llama
 * points at bob's directory only while the files are opened; at both
 * realpaths it points at her v2, whose model.safetensors is an absolute
 * link to bob's 0600 file. */
static void
test_sibling_linking_out_while_opened_waits(void **state)
{
	struct du *t = *state;
	char *p, *a, *b, cmd[8192];
	struct generation *g1;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/v1 srv/v2 srv/bob", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/v1/model.safetensors", 1024);
	b = du_model(t, "srv/bob/model.safetensors", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && ln -s %s v2/model.safetensors && "
		"chown -R 23456:23456 v1 v2 && chown -R 12345:12345 bob && chmod 0600 %s && "
		"ln -s v1 llama && ln -s v2 llama.v2", t->dir, b, b);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "srv/llama", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && ln -s v2 llama.n && mv -T llama.n llama", t->dir);
	assert_int_equal(system(cmd), 0);
	snprintf(swap_dir, sizeof(swap_dir), "%s", p);
	snprintf(swap_path, sizeof(swap_path), "%s", p);
	snprintf(swap_target, sizeof(swap_target), "bob");
	snprintf(back_path, sizeof(back_path), "%s", p);
	snprintf(back_src, sizeof(back_src), "%s.v2", p);
	atomic_store(&swap_at, 2);
	atomic_store(&back_at, 3);
	watched_keeps(t, g1, 1); /* else bob's file was taken as her generation 2 */
	free(a);
	free(b);
	free(p);
}


static void
r187_set(int i, const char *path, int nth, int after, const char *a, const char *b)
{
	snprintf(r187[i].path, sizeof(r187[i].path), "%s", path);
	r187[i].nth = nth;
	r187[i].after = after;
	r187[i].seen = r187[i].fired = 0;
	snprintf(r187[i].a, sizeof(r187[i].a), "%s", a);
	snprintf(r187[i].b, sizeof(r187[i].b), "%s", b);
}

static void
r187_clear(void)
{
	atomic_store(&r187_on, 0);
	memset(r187, 0, sizeof(r187));
}

/* rev187: alice's directory srv/v2 (uid 23456) with her model file,
 * bob's srv/bob (uid 12345) with his 0600 one; "llama" loaded from hers
 * (generation 1 in *g1): its path. */
static char *
alice_v2_bob_beside(struct du *t, struct generation **g1)
{
	char *a, *b, cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/v2 srv/bob", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/v2/model.safetensors", 1024);
	b = du_model(t, "srv/bob/model.safetensors", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown -R 23456:23456 v2 && "
		"chown -R 12345:12345 bob && chmod 0600 %s", t->dir, b);
	assert_int_equal(system(cmd), 0);
	free(a);
	free(b);
	return llama_loaded(t, "srv/v2/model.safetensors", g1);
}

/* rev187: the watched reload that ended with st (t->message) kept alice's
 * generation g1 serving, and refused with -EXDEV. */
static void
alices_kept(struct du *t, int st, const struct generation *g1)
{
	const struct generation *g = du_current(t, "llama");

	print_message("rev187: status %d (%s) uid %u size %lld\n", st, t->message,
		(unsigned)g->source.files[0].st.st_uid, (long long)g->source.files[0].st.st_size);
	assert_int_equal(g->source.files[0].st.st_uid, 23456); /* else bob's file is hers */
	assert_int_equal(st, -EXDEV);
	assert_ptr_equal(g, g1);
}

/*
 * rev187 R1: a model that is one file, configured in alice's directory
 * v2 (generation 1 there). at_its_place took lstat(before) == the opened
 * file as "that file" with no tree check, but lstat follows a link in a
 * *directory* component of before: alice exchanges v2 (her directory) with
 * v2x (her link to bob's directory) for tree_open's realpath of the
 * directory (the file is opened in bob's tree), back for the realpath of
 * the path, again right after it (for the lstat), back for hub_root's
 * realpath of the directory (before gen_tree_root's stat of the root).
 */
static void
test_rev187_one_file_parent_dir_exchanged(void **state)
{
	struct du *t = *state;
	char *p, cmd[8192], v2[2048], v2x[2048];
	struct generation *g1;
	int st;

	p = alice_v2_bob_beside(t, &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && ln -s bob v2x && chown -h 23456:23456 v2x",
		t->dir);
	assert_int_equal(system(cmd), 0);
	snprintf(v2, sizeof(v2), "%s/srv/v2", t->dir);
	snprintf(v2x, sizeof(v2x), "%s/srv/v2x", t->dir);
	r187_set(0, v2, 1, 0, v2, v2x);  /* tree_open: v2 -> bob */
	r187_set(1, p, 2, 0, v2, v2x);   /* gen_resolved_path's realpath: v2 a dir */
	r187_set(2, p, 2, 1, v2, v2x);   /* its lstat: v2 -> bob */
	r187_set(3, v2, 2, 0, v2, v2x);  /* hub_root, gen_tree_root: v2 a dir */
	atomic_store(&r187_on, 1);
	st = r180_watched(t, "llama");
	print_message("rev187 R1: fired %d%d%d%d\n", r187[0].fired, r187[1].fired,
		r187[2].fired, r187[3].fired);
	r187_clear();
	alices_kept(t, st, g1);
	free(p);
}

/*
 * rev187 R2: same_tree took a root equal by its path whoever owns it
 * now: alice's model srv/v2/model.safetensors (generation 1, tree srv/v2,
 * hers); her v2 is gone (renamed away for a redeploy, or removed) and bob
 * made srv/v2 (his, with his file). A watched reload took it.
 */
static void
test_rev187_same_root_new_owner(void **state)
{
	struct du *t = *state;
	char *p, cmd[8192];
	struct generation *g1;
	int st;

	p = alice_v2_bob_beside(t, &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && mv v2 v2.old && mv bob v2", t->dir);
	assert_int_equal(system(cmd), 0);
	st = r180_watched(t, "llama");
	alices_kept(t, st, g1);
	assert_non_null(strstr(t->message, "now owned by uid 12345 (was uid 23456)"));
	free(p);
}

/*
 * rev187 R2b: a model that is one file directly in a shared directory
 * (srv, root's, 1777): its tree is srv, whose owner does not change when
 * alice's file srv/m.safetensors is gone and bob makes his at its name.
 * A watched reload took his file.
 */
static void
test_rev187_one_file_in_shared_dir_new_owner(void **state)
{
	struct du *t = *state;
	char *a, *b, *p, cmd[8192];
	struct generation *g1;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv && chmod 1777 srv", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/m.safetensors", 1024);
	snprintf(cmd, sizeof(cmd), "chown 23456:23456 %s", a);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "srv/m.safetensors", &g1);
	b = du_model(t, "bob.safetensors", 2048);
	snprintf(cmd, sizeof(cmd), "chown 12345:12345 %s && rm %s && mv %s %s", b, a, b, a);
	assert_int_equal(system(cmd), 0);
	st = r180_watched(t, "llama");
	alices_kept(t, st, g1);
	assert_non_null(strstr(t->message, "now owned by uid 12345 (was uid 23456)"));
	free(a);
	free(b);
	free(p);
}

/* rev191: llama loaded from srv/m.safetensors (its path, returned; the
 * file in *a), srv of mode mode, the file owner's; generation 1 in *g1. */
static char *
rev191_file_in_srv(struct du *t, const char *mode, unsigned owner, char **a,
	struct generation **g1)
{
	char cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv && chmod %s srv", t->dir, mode);
	assert_int_equal(system(cmd), 0);
	*a = du_model(t, "srv/m.safetensors", 1024);
	snprintf(cmd, sizeof(cmd), "chown %u:%u %s", owner, owner, *a);
	assert_int_equal(system(cmd), 0);
	return llama_loaded(t, "srv/m.safetensors", g1);
}

/* Whether name's loads in flight all ended. */
static bool
rev210_no_load(struct du *t, void *arg)
{
	const struct model_entry *m = registry_find(&t->reg, arg);

	return m == NULL || m->loading == 0;
}

/*
 * rev210 L2: alice's one-file model straight in a shared sticky place
 * (srv, root's, 1777). The operator's reload fails while generation 1
 * serves (a damaged file at its name: it found the tree); then generation
 * 1 is withdrawn (as a restored one that failed its full check is), and
 * the reload the withdrawal queues, which keeps generation 1's files,
 * fails too. Her file gone, bob makes his at its name: the next watched
 * reload was judged against the tree the operator's failed load found,
 * owners told and none kept, and took his file. Now that load's owners are
 * untold, and the withdrawn generation's are kept: his file waits.
 */
static void
test_rev210_a_withdrawn_generations_owners_outlive_its_reload(void **state)
{
	struct du *t = *state;
	char *a, *b, *p, cmd[8192];
	struct generation *g1;
	struct model_entry *m;
	struct stat st;
	int status;

	p = rev191_file_in_srv(t, "1777", 23456, &a, &g1);
	assert_int_equal(stat(a, &st), 0);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && mv m.safetensors m.old && printf junk > "
		"m.safetensors && chown 23456:23456 m.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(du_reload(t, "llama") < 0);
	assert_ptr_equal(du_current(t, "llama"), g1);
	m = registry_find(&t->reg, "llama");
	assert_non_null(m->operator_tree.root);
	assert_int_equal(m->operator_tree.owners_untold, OWNERS_UNTOLD_FAILED_LOAD);
	registry_withdraw(&t->reg, m, "test: withdrawn");
	assert_null(m->current);
	assert_int_equal(m->operator_tree.kept.nfiles, 1);
	assert_int_equal(m->operator_tree.kept.owners[0], 23456);
	assert_int_equal(m->operator_tree.kept.ids[0].ino, st.st_ino);
	assert_true(m->operator_tree.kept.named_file);
	du_run_until(t, rev210_no_load, "llama");
	assert_null(registry_find(&t->reg, "llama")->current); /* the junk failed */
	b = du_model(t, "bob.safetensors", 2048);
	snprintf(cmd, sizeof(cmd), "chown 12345:12345 %s && rm %s && mv %s %s", b, a, b, a);
	assert_int_equal(system(cmd), 0);
	status = r180_watched(t, "llama");
	m = registry_find(&t->reg, "llama");
	print_message("rev210 L2: status %d (%s)\n", status, t->message);
	assert_int_equal(status, -EXDEV);
	assert_null(m->current); /* else bob's file is "llama" */
	assert_non_null(strstr(t->message, "now owned by uid 12345 (was uid 23456)"));
	free(a);
	free(b);
	free(p);
}

/*
 * rev191 F3: a one-file model in root's own directory srv (0755: no one
 * else may make a file there), its file a download user's (23456). root
 * copies a new file over it (root's, one name): the watched reload waited
 * for the operator ("a file made again by another user"); the tree's
 * owner's own file is taken. A hard link of root's other file there (two
 * names: anyone's where fs.protected_hardlinks=0) still waits.
 */
static void
test_rev191_tree_owners_file_over_anothers_swaps(void **state)
{
	struct du *t = *state;
	char *a, *b, *p, cmd[8192];
	struct generation *g1;

	p = rev191_file_in_srv(t, "0755", 23456, &a, &g1);
	b = du_model(t, "srv/v2.tmp", 2048);
	snprintf(cmd, sizeof(cmd), "ln %s %s/srv/other.safetensors && mv %s %s", b, t->dir, b, a);
	assert_int_equal(system(cmd), 0);
	alices_kept(t, r180_watched(t, "llama"), g1);
	assert_non_null(strstr(t->message, "now owned by uid 0 (was uid 23456)"));
	snprintf(cmd, sizeof(cmd), "rm %s/srv/other.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(r180_watched(t, "llama"), 0);
	assert_ptr_not_equal(du_current(t, "llama"), g1);
	free(a);
	free(b);
	free(p);
}

/* rev187 R4: rev185 F5's regression test on a kernel without openat2
 * (tree_force_fallback, as tree.h offers the tests): is_file_at's stat(2)
 * of the place by its path followed alice's link out of her tree to bob's
 * file; without openat2 a watched reload takes only files with no link. */
static void
test_rev187_fallback_sibling_linking_out(void **state)
{
	tree_force_fallback = 1;
	test_sibling_linking_out_while_opened_waits(state);
	tree_force_fallback = 0;
}

/*
 * rev191 F4: without openat2 (tree_force_fallback), alice's srv/v2 holds
 * model.safetensors -> w/real, a relative link inside her tree. The
 * operator's load (her word) found no resolved path nor tree (attaches by
 * the real path missed it); the watched reload after she renames a new
 * w/real in said "its path ... resolved to another place while its files
 * were opened", which is false: nothing moved. It now says that this
 * kernel cannot check a link inside the tree, and still waits for the
 * operator's reload.
 */
static void
test_rev191_fallback_link_inside_tree(void **state)
{
	struct du *t = *state;
	char *p, *a, *b, cmd[8192];
	struct generation *g1;

	tree_force_fallback = 1;
	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/v2/w", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/v2/w/real", 1024);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && ln -s w/real v2/model.safetensors && "
		"chown -R -h 23456:23456 v2", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "srv/v2", &g1);
	assert_non_null(g1->resolved_path); /* NULL: attaches by the real path missed it */
	assert_non_null(g1->tree_root);
	assert_non_null(strstr(g1->tree_root, "/srv/v2"));
	b = du_model(t, "srv/v2/w/real.new", 2048);
	snprintf(cmd, sizeof(cmd), "chown 23456:23456 %s && mv %s %s", b, b, a);
	assert_int_equal(system(cmd), 0);
	alices_kept(t, r180_watched(t, "llama"), g1);
	assert_null(strstr(t->message, "resolved to another place"));
	assert_non_null(strstr(t->message, "reaches its files through a symbolic link inside "
		"its tree, which this kernel (no openat2) cannot check"));
	tree_force_fallback = 0;
	free(a);
	free(b);
	free(p);
}

/* Writes a shard index at t's rel naming the shards of tensors "w" and,
 * when not NULL, "v" (s2). */
static void
index_naming(struct du *t, const char *rel, const char *s2)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", t->dir, rel);
	assert_non_null(f = fopen(path, "w"));
	fprintf(f, "{\"weight_map\":{\"w\":\"s.safetensors\"%s%s%s}}", s2 != NULL ? ",\"v\":\"" :
		"", s2 != NULL ? s2 : "", s2 != NULL ? "\"" : "");
	fclose(f);
}

/* Writes a shard index at t's rel naming the one shard "s.safetensors". */
static void
index_naming_s(struct du *t, const char *rel)
{
	index_naming(t, rel, NULL);
}

/*
 * rev187 R3: a sharded model, llama -> v1 (alice's index and shard,
 * generation 1). Her sibling v2 holds her index and, as its shard, bob's
 * 0600 file renamed into it (one name: a rename out of a writable
 * directory needs no right on the file). Her swap of llama to v2 passed
 * every tree rule (her sibling, the shard at its place): bob's bytes were
 * her generation 2. A watched reload now takes only files of the tree's
 * owner or of the files serving.
 */
static void
test_rev187_others_shard_renamed_in_waits(void **state)
{
	struct du *t = *state;
	char *a, *b, *p, cmd[8192];
	struct generation *g1;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/v1 srv/v2", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/v1/s.safetensors", 1024);
	b = du_model(t, "srv/bob.safetensors", 2048);
	index_naming_s(t, "srv/v1/m.index.json");
	index_naming_s(t, "srv/v2/m.index.json");
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown 12345:12345 bob.safetensors && "
		"chmod 0600 bob.safetensors && mv bob.safetensors v2/s.safetensors && "
		"chown 23456:23456 v1 v1/s.safetensors v1/m.index.json v2 v2/m.index.json && "
		"ln -s v1 llama", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "srv/llama/m.index.json", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && ln -s v2 llama.n && mv -T llama.n llama", t->dir);
	assert_int_equal(system(cmd), 0);
	alices_kept(t, r180_watched(t, "llama"), g1);
	assert_non_null(strstr(t->message, "/srv/llama/s.safetensors is owned by uid 12345, not by "
		"the owner of its tree"));
	assert_non_null(strstr(t->message, "/srv/v2 (uid 23456) nor of the files serving"));
	free(a);
	free(b);
	free(p);
}

/*
 * rev187 R3, any load: alice's model directory v2 (uid 23456) whose
 * model.safetensors is a hard link of bob's 0600 file (uid 12345), as
 * fs.protected_hardlinks=0 lets her make it (root stands in for her): the
 * operator's own load took it, lending her wcached's read right. Refused
 * with one line naming the file, its owner and the tree's; a hard link of
 * her own file there loads.
 */
static void
test_rev187_others_hard_link_refused(void **state)
{
	struct du *t = *state;
	char *b, *p, cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/v2 srv/v3 srv/bob", t->dir);
	assert_int_equal(system(cmd), 0);
	b = du_model(t, "srv/bob/model.safetensors", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown -R 12345:12345 bob && chmod 0600 %s && "
		"ln %s v2/model.safetensors && chown 23456:23456 v2 v3 && "
		"cp v2/model.safetensors v3/mine && chown 23456:23456 v3/mine && "
		"ln v3/mine v3/model.safetensors", t->dir, b, b);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/srv/v2", t->dir) > 0);
	assert_true(du_load(t, "llama", p, PIN_NONE, 0) < 0);
	print_message("rev187 R3: %s\n", t->message);
	assert_null(registry_find(&t->reg, "llama")->current);
	assert_non_null(strstr(t->message, "/srv/v2/model.safetensors (it has 2 names; another may "
		"be anyone's link of it) is owned by uid 12345 (mode 0600, group 12345), which "
		"uid 23456 (the owner of the model's tree "));
	assert_non_null(strstr(t->message, "/srv/v2) may not read: "));
	free(p);
	assert_true(asprintf(&p, "%s/srv/v3", t->dir) > 0);
	assert_int_equal(du_load(t, "mine", p, PIN_NONE, 0), 0);
	free(p);
	/* A file anyone may read lends her nothing: its hard link loads. */
	snprintf(cmd, sizeof(cmd), "chmod 0644 %s", b);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/srv/v2", t->dir) > 0);
	assert_int_equal(du_load(t, "readable", p, PIN_NONE, 0), 0);
	free(b);
	free(p);
}

/*
 * rev197 L1: 0e080b1 took a hard link of another user's file whenever its
 * mode had S_IROTH. Mode 0604 with group G denies every member of G (the
 * group class is checked before others): alice (23456, primary group 23456)
 * may not read bob's 0604 file of group 23456, and its link in her tree
 * (where fs.protected_hardlinks=0 she could make it) is refused; it was
 * served.
 */
static void
test_rev197_others_bit_alone_is_no_read_right(void **state)
{
	struct du *t = *state;
	char *b, *p, cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/v2 srv/bob", t->dir);
	assert_int_equal(system(cmd), 0);
	b = du_model(t, "srv/bob/model.safetensors", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown -R 12345:23456 bob && chmod 0604 %s && "
		"ln %s v2/model.safetensors && chown 23456:23456 v2", t->dir, b, b);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/srv/v2", t->dir) > 0);
	assert_true(du_load(t, "grouped", p, PIN_NONE, 0) < 0);
	free(b);
	free(p);
}

/*
 * "m" configured at t's open/PLACE before it is there, open/ a place
 * writable by all (1777, root's, as /tmp or a shared hub cache); then
 * made: what sh runs in open/ (the model's files given to uid). The
 * answer of the reload wcached makes by itself.
 */
static int
made_in_open_place(struct du *t, const char *place, const char *sh, uid_t uid)
{
	char *p, cmd[8192];
	int st;

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/open && chmod 1777 %s/open", t->dir, t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/open/%s", t->dir, place) > 0);
	assert_true(du_load(t, "m", p, PIN_NONE, 0) < 0);
	free(du_model(t, "open/m.tmp", 1024));
	snprintf(cmd, sizeof(cmd), "cd %s/open && chown %u:%u m.tmp && %s", t->dir,
		(unsigned)uid, (unsigned)uid, sh);
	assert_int_equal(system(cmd), 0);
	st = r180_watched(t, "m");
	print_message("rev187 R5: status %d (%s)\n", st, t->message);
	assert_int_equal(st == 0, registry_find(&t->reg, "m")->current != NULL);
	free(p);
	return st;
}

/* rev187 R5: the place a model's path names, not there at the operator's
 * load, in a place writable by all: the first comer's file made at it,
 * a model directory made at it, or a hub repo made for it were taken by
 * themselves, hers. Now they wait for the operator's reload, with one
 * line that says why and whose files they are. */
static void
test_rev187_first_comer_file_in_open_place_waits(void **state)
{
	struct du *t = *state;

	assert_int_equal(made_in_open_place(t, "m.safetensors", "mv m.tmp m.safetensors", 12345),
		-EXDEV);
	assert_non_null(strstr(t->message, "/open, the directory above it that existed, is "
		"writable by others than its owner (uid 0, mode 1777): the files made there since "
		"(uid 12345) could be anyone's"));
	assert_non_null(strstr(t->message, "wcachectl reload m"));
}

static void
test_rev187_first_comer_dir_in_open_place_waits(void **state)
{
	assert_int_equal(made_in_open_place(*state, "m", "mkdir d && mv m.tmp d/model.safetensors "
		"&& chown 12345 d && mv d m", 12345), -EXDEV);
}

static void
test_rev187_first_comer_hub_in_open_place_waits(void **state)
{
	assert_int_equal(made_in_open_place(*state, "models--o--m/snapshots/abc/model.safetensors",
		"mkdir -p models--o--m/snapshots/abc && mv m.tmp models--o--m/snapshots/abc/"
		"model.safetensors && chown -R 12345 models--o--m", 12345), -EXDEV);
}

/* The place's owner (root here) is no first comer: her files there are
 * taken by themselves, as before. */
static void
test_rev187_owner_of_open_place_is_no_first_comer(void **state)
{
	assert_int_equal(made_in_open_place(*state, "m", "mkdir m && mv m.tmp m/model.safetensors",
		0), 0);
}

/* The descriptors this process has open. */
static int
open_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 4096; fd++)
		n += fcntl(fd, F_GETFD) != -1;
	return n;
}

/*
 * rev210 L1: an operator's load of a path not there looks at the place it
 * names by the judged walk (place_of); where a directory's real path
 * cannot be had for want of memory (strdup() then; mountrule_fd_realpath
 * since it names it), judged_place left the walk's descriptor open and the
 * look went on with the parent. Now it closes it and ends the look: an
 * operator's load of sub/m.safetensors, sub's real path failing, leaves as
 * many descriptors open as the same load whose real path is had.
 */
static void
test_rev210_out_of_memory_in_place_of_leaves_no_descriptor(void **state)
{
	struct du *t = *state;
	char *dir, *real, *p;
	int before, after;

	assert_true(asprintf(&dir, "%s/sub", t->dir) > 0);
	assert_int_equal(mkdir(dir, 0755), 0);
	assert_non_null(real = realpath(dir, NULL));
	snprintf(fd_oom_of, sizeof(fd_oom_of), "%s", dir);
	assert_true(asprintf(&p, "%s/m.safetensors", dir) > 0);
	assert_true(du_load(t, "a", p, PIN_NONE, 0) < 0);
	before = open_fds();
	assert_true(du_load(t, "b", p, PIN_NONE, 0) < 0);
	after = open_fds();
	atomic_store(&fd_oom_armed, 1);
	assert_true(du_load(t, "c", p, PIN_NONE, 0) < 0);
	atomic_store(&fd_oom_armed, 0);
	print_message("rev210 L1: %d descriptors, %d after a load, %d after one whose real "
		"path of %s failed (%d)\n", before, after, open_fds(), real,
		atomic_load(&fd_oom_failed));
	assert_true(atomic_load(&fd_oom_failed));
	assert_int_equal(open_fds() - after, after - before);
	free(p);
	free(real);
	free(dir);
}

/*
 * The mount table's reads of an operator's load of NAME, whose path goes
 * through the link alice in t->dir to a chain of links in shm (a mount
 * of its own): l1 .. l<links>, each text shm/l<k+1> and depth missing
 * names x/x/..., the last link's target missing.
 */
static int
rev210_table_reads(struct du *t, const char *shm, const char *name, int links, int depth)
{
	char tail[4096] = "x", from[4200], to[8400], *path;
	int before;

	assert_true(depth >= 1 && 2 * depth < (int)sizeof(tail));
	for (int i = 1; i < depth; i++)
		memcpy(tail + (ptrdiff_t)2 * i - 1, "/x", 3);
	for (int k = 1; k <= links; k++) {
		snprintf(from, sizeof(from), "%s/%s-l%d", shm, name, k);
		snprintf(to, sizeof(to), "%s/%s-l%d/%s", shm, name, k + 1, tail);
		assert_int_equal(symlink(to, from), 0);
	}
	snprintf(from, sizeof(from), "%s/%s", t->dir, name);
	snprintf(to, sizeof(to), "%s/%s-l1/%s", shm, name, tail);
	assert_int_equal(symlink(to, from), 0);
	assert_true(asprintf(&path, "%s/%s/m.safetensors", t->dir, name) > 0);
	before = atomic_load(&mountinfo_opens);
	assert_true(du_load(t, name, path, PIN_NONE, 0) < 0);
	free(path);
	return atomic_load(&mountinfo_opens) - before;
}

/*
 * rev210 M1: an operator's load whose walk failed looks at the place its
 * path names (place_of) by the judged walk, which walked each directory
 * prefix of each link's text as a walk of its own from "/", reading the
 * mount table afresh at its first mount crossed: K links of D missing names
 * each cost K x D walks and table reads (147 s of a work thread for K 20,
 * D 100 and 100 mounts). Now one run of walks reads the table once and
 * finds the deepest prefix that resolves by bisection: a chain of 8 links
 * of 60 missing names reads it as often as one link of one name does.
 */
static void
test_rev210_place_of_reads_the_mount_table_once_for_a_chain(void **state)
{
	struct du *t = *state;
	char shm[] = "/dev/shm/wcache-rev210-XXXXXX", cmd[128];
	struct stat a, b;
	int few, many;

	if (stat("/dev/shm", &a) != 0 || stat("/", &b) != 0 || a.st_dev == b.st_dev ||
		mkdtemp(shm) == NULL)
		skip(); /* no /dev/shm mount to cross */
	few = rev210_table_reads(t, shm, "one", 1, 1);
	many = rev210_table_reads(t, shm, "chain", 8, 60);
	print_message("rev210 M1: the mount table read %d times for 1 link of 1 missing name, "
		"%d for 8 links of 60\n", few, many);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", shm);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(many, few);
}

/* In t->dir/NAME: the directory a, the link h whose text is "a/../a/.."
 * (4090 bytes: 1636 names walked), and the links l1 .. l<links>, each
 * text "h/" 8 times then l<k+1>/m (the last one's target missing): a
 * walk through l1 looks up some 13,000 names for each link of the chain. */
static void
rev212_heavy_chain(struct du *t, const char *name, int links)
{
	char dir[4200], from[4300], to[4200] = "a/..";
	size_t n = 4;

	snprintf(dir, sizeof(dir), "%s/%s", t->dir, name);
	assert_int_equal(mkdir(dir, 0755), 0);
	snprintf(from, sizeof(from), "%s/a", dir);
	assert_int_equal(mkdir(from, 0755), 0);
	for (int i = 1; i < 818; i++, n += 5)
		memcpy(to + n, "/a/..", 6);
	snprintf(from, sizeof(from), "%s/h", dir);
	assert_int_equal(symlink(to, from), 0);
	for (int k = 1; k <= links; k++) {
		snprintf(to, sizeof(to), "h/h/h/h/h/h/h/h/l%d/m", k + 1);
		snprintf(from, sizeof(from), "%s/l%d", dir, k);
		assert_int_equal(symlink(to, from), 0);
	}
}

/*
 * rev212 M2: the look at the place an operator's load names (place_of)
 * after its walk failed has one budget of names and links for all its
 * walks (8192 names, 160 links): each walk kept its own 40 links of
 * PATH_MAX texts (some 65,000 names), and the look made some 12 walks a
 * text for up to 41 texts (218.8 s of a work thread for the review's
 * chain). Here a chain of 2 links, each of whose walks follows 8 links of
 * 1636 names: the look's walks looked up 100,000-odd names before; at
 * most the budget and one statx per walk's start (of the directory it
 * starts from) now, and the look ends with one line and no place (nothing
 * to judge by).
 */
static void
test_rev212_place_of_look_has_one_budget(void **state)
{
	struct du *t = *state;
	char *path, *log;
	long n;

	rev212_heavy_chain(t, "heavy", 2);
	assert_true(asprintf(&path, "%s/heavy/l1/m.safetensors", t->dir) > 0);
	atomic_store(&run_statx, 0);
	du_log_start(t);
	assert_true(du_load(t, "heavy", path, PIN_NONE, 0) < 0);
	log = du_log_stop(t);
	n = atomic_load(&run_statx);
	print_message("rev212 M2: the look's walks made %ld statx calls\n", n);
	assert_true(n <= 8192 + 600);
	assert_non_null(strstr(log, "/heavy/l1/m.safetensors: the look at the place this path "
		"names ended after 8192 names and "));
	assert_non_null(strstr(log, "the place is none"));
	assert_null(registry_find(&t->reg, "heavy")->operator_tree.place);
	free(log);
	free(path);
}

/*
 * rev212 L2: a directory the look's walk reaches but whose real path
 * cannot be read (4096 bytes or more: readlink of /proc/self/fd/N fails)
 * was taken for one not reached, and the bisection never looked past it:
 * t->dir/S, a link to a directory D whose real path is 4000 bytes, in it
 * a directory X of 150 ("D/X" cannot be named), and the path
 * S/X/../missing/m.safetensors, whose deepest directory reached is
 * "S/X/.." = D: the place is D/missing/m.safetensors, as the look that
 * went up one directory at a time found (none before).
 */
static void
test_rev212_place_past_a_directory_that_cannot_be_named(void **state)
{
	struct du *t = *state;
	char deep[PATH_MAX], x[151], name[256], *path, *want, *link;
	size_t len = strlen(t->dir);
	int fd = open(t->dir, O_PATH | O_DIRECTORY | O_CLOEXEC), next;
	const char *place;

	assert_true(fd >= 0 && len < 3000);
	snprintf(deep, sizeof(deep), "%s", t->dir);
	while (len < 4000) {
		size_t k = 4000 - len - 1 > 200 ? 200 : 4000 - len - 1;

		memset(name, 'd', k);
		name[k] = '\0';
		assert_int_equal(mkdirat(fd, name, 0755), 0);
		assert_true((next = openat(fd, name, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);
		close(fd);
		fd = next;
		snprintf(deep + len, sizeof(deep) - len, "/%s", name);
		len = strlen(deep);
	}
	memset(x, 'x', 150);
	x[150] = '\0';
	assert_int_equal(mkdirat(fd, x, 0755), 0);
	close(fd);
	assert_true(asprintf(&link, "%s/S", t->dir) > 0);
	assert_int_equal(symlink(deep, link), 0);
	assert_true(asprintf(&path, "%s/%s/../missing/m.safetensors", link, x) > 0);
	assert_true(asprintf(&want, "%s/missing/m.safetensors", deep) > 0);
	assert_true(du_load(t, "long", path, PIN_NONE, 0) < 0);
	place = registry_find(&t->reg, "long")->operator_tree.place;
	print_message("rev212 L2: the place is %s\n", place != NULL ? "D/missing/..." : "none");
	assert_non_null(place);
	assert_string_equal(place, want);
	free(want);
	free(path);
	free(link);
}

/* rev191: a watched reload of llama (generation g1 serving): its status;
 * in *size the current generation's file's size, 0 when g1 is still it. */
static int
rev191_watched(struct du *t, const struct generation *g1, long long *size)
{
	int st = r180_watched(t, "llama");
	const struct generation *g = du_current(t, "llama");

	*size = g == g1 ? 0 : (long long)g->source.files[0].st.st_size;
	print_message("rev191: status %d (%s) uid %u size %lld\n", st, t->message,
		(unsigned)g->source.files[0].st.st_uid, *size);
	return st;
}

/* Review rev191: a shared directory srv (root's, 1775: a team's sticky
 * directory, where fs.protected_symlinks does not apply), "llama" loaded
 * from srv/m.safetensors owned by uid owner; the file then gone (a
 * redeploy's rm) and uid maker makes srv/m.safetensors a link to target.
 * The watched reload's status; in *size the current generation's file's
 * size, 0 when generation 1 is still current. */
static int
rev191_link_by(struct du *t, unsigned owner, unsigned maker, const char *target,
	long long *size)
{
	char *a, *p, cmd[8192];
	struct generation *g1;
	int st;

	p = rev191_file_in_srv(t, "1775", owner, &a, &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && rm m.safetensors && ln -s %s m.safetensors && "
		"chown -h %u:%u m.safetensors", t->dir, target, maker, maker);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, size);
	free(a);
	free(p);
	return st;
}

/* As rev191_link_by, the link bob's (12345). */
static int
rev191_link_at_name(struct du *t, unsigned owner, const char *target, long long *size)
{
	return rev191_link_by(t, owner, 12345, target, size);
}

/* README's swap by uid maker: her link to target renamed over srv/name
 * (`ln -s target .n && mv -T .n name`); then a watched reload of llama,
 * g serving: its status, and in *size the new generation's file's size (0:
 * g still current). */
static int
swap_by(struct du *t, unsigned maker, const char *target, const char *name,
	const struct generation *g, long long *size)
{
	char cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s/srv && ln -s %s .n && chown -h %u:%u .n && "
		"mv -T .n %s", t->dir, target, maker, maker, name);
	assert_int_equal(system(cmd), 0);
	return rev191_watched(t, g, size);
}

/* rev191: runs "cd t's dir && mk", makes the model file rel (floats
 * floats) and runs "fix FILE" on it: the file's path. */
static char *
rev191_made(struct du *t, const char *mk, const char *rel, size_t floats, const char *fix)
{
	char cmd[8192], *o;

	snprintf(cmd, sizeof(cmd), "cd %s && %s", t->dir, mk);
	assert_int_equal(system(cmd), 0);
	o = du_model(t, rel, floats);
	snprintf(cmd, sizeof(cmd), "%s %s", fix, o);
	assert_int_equal(system(cmd), 0);
	return o;
}

/* rev191 F1b: bob's link at alice's free name to alice's other file in
 * the shared directory (an older version of hers): same tree, same owner
 * of the file: it was her generation 2. A link of a user who owns neither
 * the tree, the files serving nor srv waits for the operator. */
static void
test_rev191_bobs_link_to_alices_other_file(void **state)
{
	struct du *t = *state;
	char *o = rev191_made(t, "mkdir -p srv", "srv/m-old.safetensors", 3000,
		"chown 23456:23456");
	long long size;
	int st;

	st = rev191_link_at_name(t, 23456, "m-old.safetensors", &size);
	free(o);
	assert_int_equal(st, -EXDEV); /* else bob chose which of her files is "llama" */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "/srv/m.safetensors (to m-old.safetensors) made by "
		"uid 12345, in "));
	assert_non_null(strstr(t->message, "owned by uid 0: a link of a user who owns neither"));
}

/* Her own link there (README's swap of a one-file model) still swaps. */
static void
test_rev191_owners_link_at_her_name_swaps(void **state)
{
	struct du *t = *state;
	char *o = rev191_made(t, "mkdir -p srv", "srv/m-v2.safetensors", 3000,
		"chown 23456:23456");
	long long size;

	assert_int_equal(rev191_link_by(t, 23456, 23456, "m-v2.safetensors", &size), 0);
	assert_true(size > 0);
	free(o);
}

/* rev191 F1b: a model that is a directory, srv/llama, owned by owner, in
 * the shared directory srv (root's, 1775); its own tree is removed (a
 * redeploy's rm -rf) and bob makes srv/llama his link to srv/other, a
 * directory of the same owner with another model in it (mode dmode). */
static int
rev191_dir_link(struct du *t, unsigned owner, const char *dmode, long long *size)
{
	char *a, *o, *p, cmd[8192];
	struct generation *g1;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/llama srv/other && chmod 1775 srv",
		t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/llama/model.safetensors", 1024);
	o = du_model(t, "srv/other/model.safetensors", 3000);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown -R %u:%u llama other && chmod %s other && "
		"chmod 0600 other/model.safetensors", t->dir, owner, owner, dmode);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "srv/llama", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && rm -rf llama && ln -s other llama && "
		"chown -h 12345:12345 llama", t->dir);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, size);
	free(a);
	free(o);
	free(p);
	return st;
}

/* rev191_dir_link waits for the operator, saying whose link it is. */
static void
rev191_dir_link_waits(struct du *t, unsigned owner, const char *dmode)
{
	long long size;

	assert_int_equal(rev191_dir_link(t, owner, dmode, &size), -EXDEV);
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "(to other) made by uid 12345"));
}

/* Alice's llama and her other model srv/other. */
static void
test_rev191_bobs_link_to_alices_other_dir(void **state)
{
	rev191_dir_link_waits(*state, 23456, "0755");
}

/* The operator's (root's) llama, and root's private model srv/other
 * (0700, its file 0600: wcached reads it, bob does not). */
static void
test_rev191_bobs_link_to_roots_private_dir(void **state)
{
	rev191_dir_link_waits(*state, 0, "0700");
}

/* rev191 F2 (R2b for a sharded model): alice's index srv/m.safetensors
 * .index.json and her shard a-1 directly in the shared srv (root's, 1775);
 * her index is gone (a redeploy's rm) and bob writes his at its name,
 * naming his own shard b-1. Refused since 1ec6d4e (same_owners). */
static void
test_rev191_bobs_index_at_alices_free_name(void **state)
{
	struct du *t = *state;
	char *a, *b, *p, cmd[8192];
	struct generation *g1;
	long long size;
	FILE *f;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv && chmod 1775 srv", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/a-1.safetensors", 1024);
	b = du_model(t, "srv/b-1.safetensors", 3000);
	assert_true(asprintf(&p, "%s/srv/m.safetensors.index.json", t->dir) > 0);
	assert_non_null(f = fopen(p, "w"));
	fputs("{\"weight_map\":{\"w\":\"a-1.safetensors\"}}", f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "chown 23456:23456 %s %s && chown 12345:12345 %s && "
		"chmod 0600 %s", a, p, b, b);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(du_load(t, "llama", p, PIN_NONE, 0), 0);
	g1 = du_current(t, "llama");
	assert_int_equal(unlink(p), 0);
	assert_non_null(f = fopen(p, "w"));
	fputs("{\"weight_map\":{\"w\":\"b-1.safetensors\"}}", f);
	fclose(f);
	assert_int_equal(chown(p, 12345, 12345), 0);
	st = rev191_watched(t, g1, &size);
	free(a);
	free(b);
	free(p);
	assert_int_equal(st, -EXDEV); /* else bob's index and shard are alice's model */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "/srv/b-1.safetensors is owned by uid 12345"));
}

/* rev191 F1: bob's link at the free name of the operator's one-file model
 * (root's, in srv) to root's private *directory* model priv (0700, a
 * sibling of srv): the opener takes a directory's tree wherever it is,
 * and sibling_swap took priv (same parent, root's). A file's tree has no
 * sibling directories. */
static void
test_rev191_bobs_link_to_roots_private_sibling_dir(void **state)
{
	struct du *t = *state;
	char *o = rev191_made(t, "mkdir -p priv && chmod 0700 priv", "priv/model.safetensors",
		5000, "chmod 0600");
	long long size;
	int st;

	st = rev191_link_at_name(t, 0, "../priv", &size);
	free(o);
	assert_int_equal(st, -EXDEV); /* else root's private model is "llama" */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "/priv (was "));
}

/* rev191 F1: alice's one-file model srv/m.safetensors (srv root's 1775);
 * beside srv, scratch (root's, 1777, as a second shared place); bob puts
 * his index and his 0600 shard in scratch and, when alice's file is gone,
 * his link srv/m.safetensors -> ../scratch: root's sibling tree. */
static void
test_rev191_bobs_sharded_model_in_a_sibling_shared_dir(void **state)
{
	struct du *t = *state;
	char *b, cmd[8192], idx[4200];
	long long size;
	FILE *f;
	int st;

	snprintf(cmd, sizeof(cmd), "mkdir -p %s/scratch && chmod 1777 %s/scratch", t->dir, t->dir);
	assert_int_equal(system(cmd), 0);
	b = du_model(t, "scratch/b-1.safetensors", 3000);
	snprintf(idx, sizeof(idx), "%s/scratch/model.safetensors.index.json", t->dir);
	assert_non_null(f = fopen(idx, "w"));
	fputs("{\"weight_map\":{\"w\":\"b-1.safetensors\"}}", f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "chown 12345:12345 %s %s && chmod 0600 %s", b, idx, b);
	assert_int_equal(system(cmd), 0);
	st = rev191_link_at_name(t, 23456, "../scratch", &size);
	free(b);
	assert_int_equal(st, -EXDEV); /* else bob's files are alice's model */
	assert_int_equal(size, 0);
}

/* rev191 F1: alice herself, the deployer of her one-file model
 * srv/m.safetensors (srv root's, 1775), renames her own link over her
 * name: m.safetensors -> ../priv, root's private 0700 directory beside srv
 * with root's sharded model (index + 0600 shard). No window, no bob. */
static void
test_rev191_deployer_links_to_roots_private_sharded_sibling(void **state)
{
	struct du *t = *state;
	char *b, *a, *p, cmd[8192], idx[4200];
	struct generation *g1;
	long long size;
	FILE *f;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv priv && chmod 1775 srv && "
		"chmod 0700 priv", t->dir);
	assert_int_equal(system(cmd), 0);
	b = du_model(t, "priv/s-1.safetensors", 3000);
	snprintf(idx, sizeof(idx), "%s/priv/model.safetensors.index.json", t->dir);
	assert_non_null(f = fopen(idx, "w"));
	fputs("{\"weight_map\":{\"w\":\"s-1.safetensors\"}}", f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "chmod 0600 %s %s", b, idx);
	assert_int_equal(system(cmd), 0);
	p = rev191_file_in_srv(t, "1775", 23456, &a, &g1);
	st = swap_by(t, 23456, "../priv", "m.safetensors", g1, &size);
	free(a);
	free(b);
	free(p);
	assert_int_equal(st, -EXDEV); /* else root's private model is alice's "llama" */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "/priv (was "));
}

/* rev195: srv (root's, 1775) holds root's model directory llama and
 * root's private other (0700, its file 0600 and larger: wcached reads it,
 * bob does not). "llama" loaded from rel (generation 1 in *g1); then the
 * operator's `rm -rf llama` and bob's `ln -s other llama`. Its path. */
static char *
rev195_bobs_link_at_llama(struct du *t, const char *rel, struct generation **g1)
{
	char *a, *o, *p, cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/llama srv/other srv/bob && "
		"chmod 1775 srv", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "srv/llama/model.safetensors", 1024);
	o = du_model(t, "srv/other/model.safetensors", 3000);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chmod 0700 other && "
		"chmod 0600 other/model.safetensors && chown 12345:12345 bob", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, rel, g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && rm -rf llama && ln -s other llama && "
		"chown -h 12345:12345 llama", t->dir);
	assert_int_equal(system(cmd), 0);
	free(a);
	free(o);
	return p;
}

/* rev195 H1: "llama" loaded from rel (rev195_bobs_link_at_llama): the
 * watched reload after bob's link waits, naming it. */
static void
rev195_bobs_link_waits(struct du *t, const char *rel)
{
	struct generation *g1;
	char *p = rev195_bobs_link_at_llama(t, rel, &g1);
	long long size;
	int st;

	st = rev191_watched(t, g1, &size);
	free(p);
	assert_int_equal(st, -EXDEV); /* else root's private model is "llama" */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "/srv/llama (to other) made by uid 12345, in "));
	assert_non_null(strstr(t->message, "`wcachectl reload llama`"));
}

/*
 * rev195 H1: the model configured by its file, srv/llama/model.safetensors;
 * bob's link is above it (llama), not its last entry, which was all the
 * link check looked at: root's private other/model.safetensors was
 * "llama"'s generation 2. Every link on the path is judged.
 */
static void
test_rev195_bobs_link_above_the_file_waits(void **state)
{
	rev195_bobs_link_waits(*state, "srv/llama/model.safetensors");
}

/* The same configured as srv/llama/. (a path ending in "." or "..": its
 * last entry is never a link). */
static void
test_rev195_bobs_link_above_a_dot_waits(void **state)
{
	rev195_bobs_link_waits(*state, "srv/llama/.");
}

/*
 * rev195 H2: the model is the directory srv/llama; bob's link there leads
 * to root's private other while the files are opened and their place is
 * checked (gen_resolved_path), and is exchanged with bob's own directory
 * right after (at hub_root's realpath of srv): the link check read the
 * path again, found a directory, no link, and root's private model was
 * generation 2. The walk of the path must end where the files were found.
 */
static void
test_rev195_link_exchanged_after_the_open_waits(void **state)
{
	struct du *t = *state;
	struct generation *g1;
	char *p = rev195_bobs_link_at_llama(t, "srv/llama", &g1);
	char srv[2048], llama[2100], bob[2100];
	long long size;
	int st;

	snprintf(srv, sizeof(srv), "%s/srv", t->dir);
	snprintf(llama, sizeof(llama), "%s/llama", srv);
	snprintf(bob, sizeof(bob), "%s/bob", srv);
	r187_set(0, srv, 1, 1, llama, bob); /* right after hub_root's realpath */
	atomic_store(&r187_on, 1);
	st = rev191_watched(t, g1, &size);
	print_message("rev195 H2: fired %d\n", r187[0].fired);
	assert_int_equal(r187[0].fired, 1);
	r187_clear();
	free(p);
	assert_int_equal(st, -EXDEV); /* else root's private model is "llama" */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "resolved to another place while its files were "
		"opened"));
}

/* rev195 L1: srv with the model directories va and vb (a model each,
 * 1024 and 4000 floats), then "cd srv && fix" (its modes and owners, the
 * link llama), and "llama" loaded from srv/llama (generation 1 in *g1):
 * its path. */
static char *
rev195_llama_to(struct du *t, const char *va, const char *vb, const char *fix,
	struct generation **g1)
{
	char *a, *b, rel[64], cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv/%s srv/%s", t->dir, va, vb);
	assert_int_equal(system(cmd), 0);
	snprintf(rel, sizeof(rel), "srv/%s/model.safetensors", va);
	a = du_model(t, rel, 1024);
	snprintf(rel, sizeof(rel), "srv/%s/model.safetensors", vb);
	b = du_model(t, rel, 4000);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && %s", t->dir, fix);
	assert_int_equal(system(cmd), 0);
	free(a);
	free(b);
	return llama_loaded(t, "srv/llama", g1);
}

/*
 * rev195 L1: srv (root's, 1775), root's v2 and v3 (a model each), and a
 * deploy-group member's (23456) link llama -> v2, loaded by the operator.
 * root's update inside v2 (a new file renamed in) loads by itself: the
 * link is the one the generation serving was loaded through, whoever
 * made it (it waited for the operator at every update). Her swap of the
 * link to v3 is a new link of hers: it waits.
 */
static void
test_rev195_unchanged_link_of_a_deployer_follows_updates(void **state)
{
	struct du *t = *state;
	struct generation *g1, *g2;
	char *b, *p, cmd[8192];
	long long size;
	int st;

	p = rev195_llama_to(t, "v2", "v3", "chmod 1775 . && ln -s v2 llama && "
		"chown -h 23456:23456 llama", &g1);
	b = du_model(t, "srv/v2/new.tmp", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv/v2 && mv new.tmp model.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, &size);
	assert_int_equal(st, 0); /* else every update waits for the operator */
	assert_true(size > 0);
	g2 = du_current(t, "llama");
	st = swap_by(t, 23456, "v3", "llama", g2, &size);
	free(b);
	free(p);
	assert_int_equal(st, -EXDEV);
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "/srv/llama (to v3) made by uid 23456, in "));
}

/*
 * rev195 L1: root's own link in a service user's directory: srv, v1 and v2
 * the user's (23456), llama -> v1 hers; the operator's `ln -s v2 .n &&
 * mv -T .n llama` (a link made by uid 0) was refused as a stranger's.
 */
static void
test_rev195_roots_link_swaps(void **state)
{
	struct du *t = *state;
	struct generation *g1;
	char *p;
	long long size;
	int st;

	p = rev195_llama_to(t, "v1", "v2", "ln -s v1 llama && chown -R -h 23456:23456 . && "
		"chmod 0755 .", &g1);
	st = swap_by(t, 0, "v2", "llama", g1, &size);
	free(p);
	assert_int_equal(st, 0); /* else root's own swap waits for root */
	assert_true(size > 0);
}

/* rev195: "llama" (alice's srv/m.safetensors in srv of mode mode, generation
 * 1 in *g1) whose file root replaces, by what sh runs in srv, with root's
 * private priv.safetensors (0600: wcached reads it, alice does not): the
 * path; the file in *a. */
static char *
rev195_roots_file_at_alices_name(struct du *t, const char *mode, const char *sh, char **a,
	struct generation **g1)
{
	char *p = rev191_file_in_srv(t, mode, 23456, a, g1), *o, cmd[8192];

	o = du_model(t, "srv/priv.safetensors", 3000);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chmod 0600 priv.safetensors && %s", t->dir, sh);
	assert_int_equal(system(cmd), 0);
	free(o);
	return p;
}

/*
 * rev195 M2(a): alice's one-file model straight in root's team directory
 * (1775): its tree is srv, root's. A hard link of root's private file
 * renamed over her name (fs.protected_hardlinks=0; root stands in for her)
 * is owned by the tree's owner: the operator's reload took it, lending her
 * wcached's read right to root's file. A model straight in a shared
 * directory is the owner's of the file it replaces: root's file, which
 * alice may not read, is refused by any load; once others may read it,
 * it loads.
 */
static void
test_rev195_roots_file_linked_at_alices_name_refused(void **state)
{
	struct du *t = *state;
	char *a, *p, cmd[8192];
	struct generation *g1;
	int st;

	p = rev195_roots_file_at_alices_name(t, "1775", "ln priv.safetensors .t && "
		"mv .t m.safetensors", &a, &g1);
	st = du_reload(t, "llama");
	print_message("rev195 M2(a): status %d (%s)\n", st, t->message);
	assert_int_equal(st, -EPERM); /* was 0: root's private file served as alice's */
	assert_ptr_equal(du_current(t, "llama"), g1);
	assert_non_null(strstr(t->message, "/srv/m.safetensors (it has 2 names; another may be "
		"anyone's link of it) is owned by uid 0 (mode 0600, group 0), which uid 23456 "
		"(the owner of the file it replaces at "));
	snprintf(cmd, sizeof(cmd), "chmod 0644 %s", a);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(du_reload(t, "llama"), 0);
	assert_ptr_not_equal(du_current(t, "llama"), g1);
	free(a);
	free(p);
}

/*
 * rev195 M2(b): bob's private model file (12345, 0600) that alice kept a
 * hard link of until bob's own update (rename-over) dropped its other
 * name: one name, bob's. She renames it into her model directory (root
 * stands in for her): the operator's reload took it (nlink 1). Refused
 * whatever its names: alice may not read it.
 */
static void
test_rev195_others_file_with_one_name_refused(void **state)
{
	struct du *t = *state;
	char *a, *b, *n, *p, cmd[8192];
	struct generation *g1;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p a b", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "a/model.safetensors", 1024);
	b = du_model(t, "b/m.safetensors", 3000);
	n = du_model(t, "b/new", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s && chown -R 23456:23456 a && chown -R 12345:12345 b && "
		"chmod 0600 b/m.safetensors && ln b/m.safetensors stash && "
		"mv b/new b/m.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "a", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s && mv stash a/model.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	st = du_reload(t, "llama");
	print_message("rev195 M2(b): status %d (%s)\n", st, t->message);
	assert_int_equal(st, -EPERM); /* was 0: bob's old private model served as alice's */
	assert_ptr_equal(du_current(t, "llama"), g1);
	assert_non_null(strstr(t->message, "/a/model.safetensors is owned by uid 12345 (mode 0600, "
		"group 12345), which uid 23456 (the owner of the model's tree "));
	assert_null(strstr(t->message, "names"));
	free(a);
	free(b);
	free(n);
	free(p);
}

/*
 * rev195 M3: alice's one-file model in root's team directory that is
 * group-writable and not sticky (2775): anyone of the group may rename
 * root's private file there over her name. a5ca1e6 took the tree owner's
 * file with one name ("only she made it there"): root's file was her
 * generation 2. Now only where no one else may write in the directory.
 */
static void
test_rev195_roots_file_renamed_at_alices_name_waits(void **state)
{
	struct du *t = *state;
	char *a, *p;
	struct generation *g1;
	long long size;
	int st;

	p = rev195_roots_file_at_alices_name(t, "2775", "mv priv.safetensors m.safetensors", &a,
		&g1);
	st = rev191_watched(t, g1, &size);
	assert_int_equal(st, -EXDEV); /* was 0, with priv's size */
	assert_int_equal(size, 0);
	assert_non_null(strstr(t->message, "names a file now owned by uid 0 (was uid 23456)"));
	/* And the operator's reload does not take it either: alice may not
	 * read it. */
	assert_int_equal(du_reload(t, "llama"), -EPERM);
	assert_ptr_equal(du_current(t, "llama"), g1);
	free(a);
	free(p);
}

/*
 * rev195 M4: a hub snapshot configured as its directory before it is
 * downloaded, in a repo (23456's) whose snapshots/ is group-writable
 * (2777): bob (12345) makes the snapshot directory with his file. Its tree
 * is the repo, the same path and owner as the place's tree: taken as
 * generation 1 by itself. A first comer's files wait for the operator.
 */
static void
test_rev195_first_comer_hub_snapshot_dir_waits(void **state)
{
	struct du *t = *state;
	char *p, cmd[8192];
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p hub/models--o--m/snapshots && "
		"chown -R 23456:23456 hub/models--o--m && chmod 2777 hub/models--o--m/snapshots",
		t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/hub/models--o--m/snapshots/abc", t->dir) > 0);
	assert_true(du_load(t, "m", p, PIN_NONE, 0) < 0);
	free(du_model(t, "hub/m.tmp", 1024));
	snprintf(cmd, sizeof(cmd), "cd %s/hub && mkdir models--o--m/snapshots/abc && "
		"mv m.tmp models--o--m/snapshots/abc/model.safetensors && "
		"chown -R 12345:12345 models--o--m/snapshots/abc", t->dir);
	assert_int_equal(system(cmd), 0);
	st = r180_watched(t, "m");
	print_message("rev195 M4: status %d (%s)\n", st, t->message);
	assert_int_equal(st, -EXDEV); /* was 0: bob's files generation 1 by themselves */
	assert_null(registry_find(&t->reg, "m")->current);
	assert_non_null(strstr(t->message, "/snapshots, the directory above it that existed, is "
		"writable by others than its owner (uid 23456, mode 2777): the files made there "
		"since (uid 12345) could be anyone's who came first"));
	free(p);
}

/*
 * rev195 M2: a sharded model's first load, straight in root's team
 * directory (1775): alice's index (23456) names as its shard bob's private
 * file (12345, 0600) renamed there. Its tree's owner is root, not the
 * model's; the shards must be files the index's owner could read.
 */
static void
test_rev195_others_shard_beside_an_index_in_a_shared_dir_refused(void **state)
{
	struct du *t = *state;
	char *s, *p, cmd[8192];

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv && chmod 1775 srv", t->dir);
	assert_int_equal(system(cmd), 0);
	s = du_model(t, "srv/s.safetensors", 1024);
	index_naming_s(t, "srv/m.index.json");
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown 23456:23456 m.index.json && "
		"chown 12345:12345 s.safetensors && chmod 0600 s.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_true(asprintf(&p, "%s/srv/m.index.json", t->dir) > 0);
	assert_int_equal(du_load(t, "llama", p, PIN_NONE, 0), -EPERM); /* was 0 */
	print_message("rev195 M2 sharded: %s\n", t->message);
	assert_non_null(strstr(t->message, "/srv/s.safetensors is owned by uid 12345 (mode 0600, "
		"group 12345), which uid 23456 (the owner of the file its path names, "));
	assert_null(registry_find(&t->reg, "llama")->current);
	free(s);
	free(p);
}

/*
 * rev195 L3: a sharded model straight in root's team directory (1775),
 * its shards root's, its index the deployer's (23456): her next index
 * (renamed over hers) was refused, its owner neither the tree's nor one of
 * the files serving (the index serving was not counted among them).
 */
static void
test_rev195_deployers_next_index_over_roots_shards_swaps(void **state)
{
	struct du *t = *state;
	char *s, *s2, *p, cmd[8192], header[128];
	struct generation *g1;
	uint8_t *buf;
	size_t len;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p srv && chmod 1775 srv", t->dir);
	assert_int_equal(system(cmd), 0);
	s = du_model(t, "srv/s.safetensors", 1024);
	snprintf(header, sizeof(header), "{\"v\":{\"dtype\":\"F32\",\"shape\":[64],"
		"\"data_offsets\":[0,256]}}");
	buf = tu_safetensors(header, 256, &len);
	s2 = tu_write(t->dir, "srv/s2.safetensors", buf, len);
	free(buf);
	index_naming(t, "srv/m.index.json", NULL);
	snprintf(cmd, sizeof(cmd), "chown 23456:23456 %s/srv/m.index.json", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "srv/m.index.json", &g1);
	index_naming(t, "srv/next.json", "s2.safetensors");
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chown 23456:23456 next.json && "
		"mv next.json m.index.json", t->dir);
	assert_int_equal(system(cmd), 0);
	st = r180_watched(t, "llama");
	print_message("rev195 L3: status %d (%s)\n", st, t->message);
	assert_int_equal(st, 0); /* was -EXDEV: "is owned by uid 23456, not by the owner ..." */
	assert_ptr_not_equal(du_current(t, "llama"), g1);
	assert_int_equal(du_current(t, "llama")->source.nfiles, 2);
	free(s);
	free(s2);
	free(p);
}

/*
 * rev198's settings where root's private model other (srv/other, 0700, its
 * file 0600) must not become "llama": setup (run in t->dir) makes srv and
 * what "llama" is, a root's model of 1024 bytes goes at model, "llama" is
 * loaded from path, then swap (run in t->dir) and a watched reload, which
 * must wait for the operator (-EXDEV) with nothing loaded.
 */
static void
rev198_private_waits(void **state, const char *setup, const char *model, const char *path,
	const char *swap)
{
	struct du *t = *state;
	struct generation *g1;
	char *a, *o, *p, cmd[8192];
	long long size;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && %s", t->dir, setup);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, model, 1024);
	o = du_model(t, "srv/other/model.safetensors", 3000);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && chmod 0700 other && "
		"chmod 0600 other/model.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, path, &g1);
	snprintf(cmd, sizeof(cmd), "cd %s && %s", t->dir, swap);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, &size);
	free(a);
	free(o);
	free(p);
	assert_int_equal(st, -EXDEV); /* else root's private model is "llama" */
	assert_int_equal(size, 0);
}

/*
 * rev198 H1: as rev195 H1 (srv root's 1775, root's llama and private
 * other), but after the operator's `rm -rf llama` bob makes llama a
 * directory of his own, not a link, holding his link to other's file
 * (target). The opener's RESOLVE_BENEATH refuses it (negative control).
 */
static void
rev198_bobs_dir_at_llama(void **state, const char *target)
{
	char swap[8192];

	snprintf(swap, sizeof(swap), "cd srv && rm -rf llama && mkdir llama && "
		"ln -s %s llama/model.safetensors && chown -R -h 12345:12345 llama", target);
	rev198_private_waits(state, "mkdir -p srv/llama srv/other && chmod 1775 srv",
		"srv/llama/model.safetensors", "srv/llama/model.safetensors", swap);
}

static void
test_rev198_bobs_dir_with_his_link_waits(void **state)
{
	rev198_bobs_dir_at_llama(state, "../other/model.safetensors");
}

/* The same, his link's text absolute. */
static void
test_rev198_bobs_dir_with_his_abs_link_waits(void **state)
{
	struct du *t = *state;
	char target[4096];

	snprintf(target, sizeof(target), "%s/srv/other/model.safetensors", t->dir);
	rev198_bobs_dir_at_llama(state, target);
}

/*
 * rev198 H1: srv (root's, 1775) holds root's models v2 and private other
 * (0700, its file 0600), and root's directory llama with root's link
 * current -> ../v2; "llama" is srv/llama/current. The operator's
 * `rm -rf llama` (a redeploy); bob makes llama a directory of his own, not
 * a link, holding his link current -> ../other. Owning the directory that
 * holds his link must not approve it (link_taken), though other is a
 * sibling of v2 owned by root.
 */
static void
test_rev198_bobs_dir_on_the_path_waits(void **state)
{
	rev198_private_waits(state, "mkdir -p srv/llama srv/v2 srv/other && chmod 1775 srv && "
		"ln -s ../v2 srv/llama/current", "srv/v2/model.safetensors", "srv/llama/current",
		"cd srv && rm -rf llama && mkdir llama && ln -s ../other llama/current && "
		"chown -R -h 12345:12345 llama");
}

/*
 * rev198 H1, the deployer's form: srv (root's, 1775) holds root's v1 and
 * private other; alice (23456) keeps her link llama -> ../srv/v1 in her
 * own directory adir, "llama" is adir/llama. Her `ln -s ../srv/other .n &&
 * mv -T .n llama` must wait as the same link in root's srv does (rev195
 * L1's test): root's private model, which she cannot read, is not "llama".
 */
static void
test_rev198_deployers_link_in_her_dir_to_roots_private_waits(void **state)
{
	rev198_private_waits(state, "mkdir -p srv/v1 srv/other adir && chmod 1775 srv && "
		"ln -s ../srv/v1 adir/llama && chown -R -h 23456:23456 adir",
		"srv/v1/model.safetensors", "adir/llama", "cd adir && ln -s ../srv/other .n && "
		"chown -h 23456:23456 .n && mv -T .n llama");
}

/*
 * rev198 M1: srv (root's) a team directory its group may write but not
 * sticky (2775), root's model directory llama and root's private other
 * (0700, its file 0600). A member renames root's directories (`mv llama
 * llama.old && mv other llama`; no link anywhere, so the walk has nothing
 * to judge): same path, same owner (root), but another inode in a place
 * others may rename in: it waits (same_root's renamed_in). srv's group is
 * one the user database does not know (any process may hold it): root's
 * own group, which no one else is in, would make srv no such place
 * (review rev199 L1).
 */
static void
test_rev198_roots_private_dir_renamed_over_in_2775_waits(void **state)
{
	rev198_private_waits(state, "mkdir -p srv/llama srv/other && chgrp 64199 srv && "
		"chmod 2775 srv",
		"srv/llama/model.safetensors", "srv/llama",
		"cd srv && mv llama llama.old && mv other llama");
}

/*
 * rev198 M1's renamed_in, where the directory above the tree cannot be
 * reached: srv (root's, 0755) is where a neighbour's FUSE mount, whose
 * server never answers, stands by the time root renames his private
 * other at llama. renamed_in's stat(2) of srv by name asked that server
 * (a work thread held for good); the judged walk refuses the mount, and a
 * place that cannot be told is taken as one others may rename in: the
 * reload waits for the operator (rev198_private_waits: -EXDEV, nothing
 * loaded). fuse_at: bob's mount (the wrap), there from the first load on.
 */
static void
test_renamed_in_walks_to_the_directory_above(void **state)
{
	struct du *t = *state;

	snprintf(fuse_at, sizeof(fuse_at), "%s/srv", t->dir);
	atomic_store(&fuse_armed, 1);
	rev198_private_waits(state, "mkdir -p srv/llama srv/other && chmod 0755 srv",
		"srv/llama/model.safetensors", "srv/llama",
		"cd srv && mv llama llama.old && mv other llama");
	atomic_store(&fuse_armed, 0);
	print_message("renamed_in: stat(2) of srv by name %d time(s)\n", atomic_load(&fuse_asked));
	assert_int_equal(atomic_load(&fuse_asked), 0); /* else a thread waits on bob's server */
}

/*
 * registry_others_rename_on where the walk of links failed (out of
 * memory at its start: the wrapped strdup of the path fails once) and
 * stopped in a private directory ("/"): the directories the path spells
 * above it are judged, each by the judged walk. open (0777, not sticky)
 * above priv (0755) above gone/: open is said. With a neighbour's FUSE
 * mount at open (fuse_at), never answering, the loop's stat(2) by name
 * asked his server; the walk refuses it, and it cannot be told, as a
 * directory gone.
 */
static void
test_others_rename_on_walks_the_directories_above(void **state)
{
	struct du *t = *state;
	char path[4096], why[4096];
	int r;

	snprintf(path, sizeof(path), "cd %s && mkdir -p open/priv && chmod 0777 open && "
		"chmod 0755 open/priv", t->dir);
	assert_int_equal(system(path), 0);
	snprintf(path, sizeof(path), "%s/open/priv/gone/model.safetensors", t->dir);
	snprintf(fuse_at, sizeof(fuse_at), "%s/open", t->dir);
	snprintf(strdup_fail_of, sizeof(strdup_fail_of), "%s", path);
	atomic_store(&strdup_armed, 1);
	assert_int_equal(registry_others_rename_on(path, why, sizeof(why)), 1);
	assert_int_equal(atomic_exchange(&strdup_failed, 0), 1);
	assert_int_equal(strncmp(why, fuse_at, strlen(fuse_at)), 0);
	assert_string_equal(why + strlen(fuse_at), " (uid 0, mode 0777)");
	atomic_store(&fuse_armed, 1);
	why[0] = '\0';
	atomic_store(&strdup_armed, 1);
	r = registry_others_rename_on(path, why, sizeof(why));
	atomic_store(&fuse_armed, 0);
	assert_int_equal(atomic_exchange(&strdup_failed, 0), 1);
	print_message("others_rename_on: %d (%s), stat(2) of open by name %d time(s)\n", r, why,
		atomic_load(&fuse_asked));
	assert_int_equal(atomic_load(&fuse_asked), 0); /* else a thread waits on bob's server */
	/* Refused by the walk: a place others (the mount's user) may rename
	 * in, not one skipped as gone; said as a mount (2). */
	assert_int_equal(r, 2);
	assert_int_equal(strncmp(why, fuse_at, strlen(fuse_at)), 0);
	assert_string_equal(why + strlen(fuse_at), ": fuse mounted by uid 12345 (the test's)");
}

/*
 * rev198 L: root's own link llama -> ././.../v2 whose text is 4095 bytes
 * (the longest the kernel makes and follows): the walk reads a link's text
 * into PATH_MAX - 1 bytes and takes a text that fills them for too long
 * (-ENAMETOOLONG), and check_links says of any walk error that the path
 * "resolved to another place while its files were opened". root's update
 * inside v2 then waits for the operator, with a line that is not the reason.
 */
static void
test_rev198_long_link_text_of_roots_follows_updates(void **state)
{
	struct du *t = *state;
	struct generation *g1;
	char *b, *p, cmd[16384], text[4096];
	long long size;
	int st;
	size_t n = 0;

	while (n + 2 < 4095 - 2)
		n += (size_t)snprintf(text + n, sizeof(text) - n, "./");
	while (n < 4095 - 2)
		text[n++] = '/';
	snprintf(text + n, sizeof(text) - n, "v2");
	assert_int_equal(strlen(text), 4095);
	snprintf(cmd, sizeof(cmd), "ln -s %s llama", text);
	p = rev195_llama_to(t, "v2", "v3", cmd, &g1);
	b = du_model(t, "srv/v2/new.tmp", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv/v2 && mv new.tmp model.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, &size);
	free(b);
	free(p);
	assert_int_equal(st, 0); /* else root's own update waits, "resolved to another place" */
	assert_true(size > 0);
}

/*
 * rev198 L4: rev195 M2(a)'s setting, the hard link found by a watched
 * reload: linked_in refuses it (-EPERM) at every load, the operator's too,
 * yet 5e54e41 marks the model refused_tree ("its files wait for
 * `wcachectl reload llama`", status waits_for_reload), which does not
 * load them either.
 */
static void
test_rev198_linked_in_refusal_is_not_waiting_for_the_operator(void **state)
{
	struct du *t = *state;
	char *a, *o, *p, cmd[8192];
	struct generation *g1;
	int st, marked;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p a", t->dir);
	assert_int_equal(system(cmd), 0);
	a = du_model(t, "a/model.safetensors", 1024);
	o = du_model(t, "priv.safetensors", 3000);
	snprintf(cmd, sizeof(cmd), "cd %s && chmod 0644 a/model.safetensors && chown 23456:23456 a "
		"&& chmod 0600 priv.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "a", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s && ln priv.safetensors a/.t && "
		"mv a/.t a/model.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	st = r180_watched(t, "llama");
	print_message("rev198 L4: watched status %d (%s)\n", st, t->message);
	assert_int_equal(st, -EPERM);
	marked = registry_find(&t->reg, "llama")->refused_tree;
	st = du_reload(t, "llama");
	print_message("rev198 L4: marked %d; operator's reload status %d\n", marked, st);
	free(a);
	free(o);
	free(p);
	assert_int_equal(st, -EPERM); /* the operator's word does not serve it either */
	assert_int_equal(marked, 0); /* so "waits for `wcachectl reload llama`" is false */
}

/*
 * rev198 L3: rev195 L1's deployer link (23456's llama -> v2 in root's 1775
 * srv); a neighbour makes a hard link of that symbolic link (`ln llama .x`:
 * fs.protected_hardlinks=0, or root here standing in), which changes its
 * ctime: kept_link no longer knows it and root's update inside v2 waits
 * for the operator again.
 */
static void
test_rev198_hard_link_of_the_deployers_link_keeps_updates(void **state)
{
	struct du *t = *state;
	struct generation *g1;
	char *b, *p, cmd[8192];
	long long size;
	int st;

	p = rev195_llama_to(t, "v2", "v3", "chmod 1775 . && ln -s v2 llama && "
		"chown -h 23456:23456 llama", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/srv && sleep 0.05 && ln -P llama .x", t->dir);
	assert_int_equal(system(cmd), 0);
	b = du_model(t, "srv/v2/new.tmp", 2048);
	snprintf(cmd, sizeof(cmd), "cd %s/srv/v2 && mv new.tmp model.safetensors", t->dir);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, &size);
	free(b);
	free(p);
	assert_int_equal(st, 0); /* else a neighbour's hard link holds every update */
	assert_true(size > 0);
}

/*
 * Review rev219 H1: a model configured by its directory v1 (root's, 0755:
 * only root makes entries there), root's shard s.safetensors (0644) and
 * her index (23456) over it, root's private priv.safetensors (0640) beside.
 * She rewrites her index in place to name priv: taken as the tree owner's
 * file (only root may write in v1), root's private model was her
 * generation 2. A shard index names only files its owner could read:
 * refused at every load, the operator's too, the index named by its own
 * path, not by the directory (L1); once she may read priv, it loads.
 */
static void
test_rev219_her_index_naming_roots_private_file_refused(void **state)
{
	struct du *t = *state;
	char *s, *o, *p, cmd[8192], want[4096];
	struct generation *g1;
	struct stat ost;
	long long size;
	int st;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p v1", t->dir);
	assert_int_equal(system(cmd), 0);
	s = du_model(t, "v1/s.safetensors", 1024);
	o = du_model(t, "v1/priv.safetensors", 3000);
	index_naming_s(t, "v1/model.safetensors.index.json");
	snprintf(cmd, sizeof(cmd), "cd %s/v1 && chmod 0755 . && chmod 0644 s.safetensors && "
		"chmod 0640 priv.safetensors && chown 23456:23456 model.safetensors.index.json",
		t->dir);
	assert_int_equal(system(cmd), 0);
	p = llama_loaded(t, "v1", &g1);
	snprintf(cmd, sizeof(cmd), "cd %s/v1 && printf '{\"weight_map\":{\"w\":"
		"\"priv.safetensors\"}}' > model.safetensors.index.json", t->dir);
	assert_int_equal(system(cmd), 0);
	st = rev191_watched(t, g1, &size);
	assert_int_equal(st, -EPERM); /* was 0: root's private file, generation 2 */
	assert_int_equal(size, 0);
	snprintf(want, sizeof(want), "%s/v1/priv.safetensors is owned by uid 0 (mode 0640, "
		"group 0), which uid 23456, the owner of its shard index "
		"%s/v1/model.safetensors.index.json, may not read: an index names only files its "
		"owner could read", t->dir, t->dir);
	assert_non_null(strstr(t->message, want));
	assert_int_equal(du_reload(t, "llama"), -EPERM);
	assert_ptr_equal(du_current(t, "llama"), g1);
	snprintf(cmd, sizeof(cmd), "chmod 0644 %s", o);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(r180_watched(t, "llama"), 0);
	assert_int_equal(stat(o, &ost), 0);
	assert_int_equal(du_current(t, "llama")->source.files[0].st.st_ino, ost.st_ino);
	free(s);
	free(o);
	free(p);
}

/*
 * Review rev219 L1: a model configured by its directory v1 (root's index
 * and shard); another user's index (23456) put there, naming a new shard
 * of root's too: same_owners refuses the index, its owner neither the
 * tree's nor one of the files serving, and its line named the directory
 * as "its file" (`its file .../v1 is owned by uid 23456`): it names the
 * index.
 */
static void
test_rev219_dir_models_index_named_by_its_path(void **state)
{
	struct du *t = *state;
	char *s, *s2, *p, cmd[8192], header[128], want[4096];
	struct generation *g1;
	uint8_t *buf;
	size_t len;

	snprintf(cmd, sizeof(cmd), "cd %s && mkdir -p v1", t->dir);
	assert_int_equal(system(cmd), 0);
	s = du_model(t, "v1/s.safetensors", 1024);
	index_naming_s(t, "v1/model.safetensors.index.json");
	p = llama_loaded(t, "v1", &g1);
	snprintf(header, sizeof(header), "{\"v\":{\"dtype\":\"F32\",\"shape\":[64],"
		"\"data_offsets\":[0,256]}}");
	buf = tu_safetensors(header, 256, &len);
	s2 = tu_write(t->dir, "v1/s2.safetensors", buf, len);
	free(buf);
	index_naming(t, "v1/next.json", "s2.safetensors");
	snprintf(cmd, sizeof(cmd), "cd %s/v1 && chown 23456:23456 next.json && "
		"mv next.json model.safetensors.index.json", t->dir);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(r180_watched(t, "llama"), -EXDEV);
	print_message("rev219 L1: %s\n", t->message);
	snprintf(want, sizeof(want), "its file %s/v1/model.safetensors.index.json is owned by "
		"uid 23456, not by the owner of its tree %s/v1 (uid 0)", t->dir, t->dir);
	assert_non_null(strstr(t->message, want)); /* was "its file .../v1 is owned by" */
	assert_ptr_equal(du_current(t, "llama"), g1);
	free(s);
	free(s2);
	free(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_rev219_her_index_naming_roots_private_file_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev219_dir_models_index_named_by_its_path,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev198_hard_link_of_the_deployers_link_keeps_updates,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev198_linked_in_refusal_is_not_waiting_for_the_operator,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev198_long_link_text_of_roots_follows_updates,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev198_roots_private_dir_renamed_over_in_2775_waits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev198_bobs_dir_on_the_path_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_rev198_deployers_link_in_her_dir_to_roots_private_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev198_bobs_dir_with_his_link_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev198_bobs_dir_with_his_abs_link_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev195_bobs_link_above_the_file_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev195_bobs_link_above_a_dot_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev195_link_exchanged_after_the_open_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_unchanged_link_of_a_deployer_follows_updates, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev195_roots_link_swaps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev191_bobs_link_to_alices_other_file, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev191_tree_owners_file_over_anothers_swaps,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev191_owners_link_at_her_name_swaps, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev191_bobs_link_to_alices_other_dir, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev191_bobs_link_to_roots_private_dir, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev191_bobs_index_at_alices_free_name, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_rev191_bobs_link_to_roots_private_sibling_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev191_bobs_sharded_model_in_a_sibling_shared_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev191_deployer_links_to_roots_private_sharded_sibling, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev187_one_file_parent_dir_exchanged, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev187_same_root_new_owner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev191_fallback_link_inside_tree, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev187_fallback_sibling_linking_out, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev187_one_file_in_shared_dir_new_owner,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev210_a_withdrawn_generations_owners_outlive_its_reload, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev187_others_shard_renamed_in_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev187_others_hard_link_refused, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rev197_others_bit_alone_is_no_read_right,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev187_first_comer_file_in_open_place_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev187_first_comer_dir_in_open_place_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev187_first_comer_hub_in_open_place_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev187_owner_of_open_place_is_no_first_comer,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_roots_file_linked_at_alices_name_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_others_file_with_one_name_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_roots_file_renamed_at_alices_name_waits, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_first_comer_hub_snapshot_dir_waits, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_deployers_next_index_over_roots_shards_swaps, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev195_others_shard_beside_an_index_in_a_shared_dir_refused, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_r180_no_generation_link_elsewhere_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_r180_dangling_link_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_r180_trailing_slash, setup, teardown),
		cmocka_unit_test_setup_teardown(test_r180_alt_any_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_r180_hub_file_appears, setup, teardown),
		cmocka_unit_test_setup_teardown(test_r180_hub_index_watched, setup, teardown),
		cmocka_unit_test_setup_teardown(test_link_at_file_place_to_other_users_file_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_file_made_at_the_place_loads_whoever_made_it,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_link_at_place_to_owners_file_beside_it_loads,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_index_at_place_naming_another_users_file_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_index_linked_at_place_while_opened_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_one_file_linked_at_place_while_opened_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_hub_snapshot_linking_out_after_open_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_sibling_linking_out_while_opened_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_index_at_place_swapped_after_its_open_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_link_below_later_dir_to_owners_tree_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_and_status_page, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_missing_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_stays_out_of_the_fd_reserve, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_an_unchanged_reload_in_the_fd_reserve_stays_unchanged, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_load_refused_for_descriptors_loads_when_a_generation_closes, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_load_faults, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_index_reopen_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_load_refused_on_the_loop_notes_its_path,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_reload, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unload, setup, teardown),
		cmocka_unit_test_setup_teardown(test_expect_superseded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reload_during_expect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restore_check_bad_index, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unload_during_load, setup, teardown),
		cmocka_unit_test_setup_teardown(test_forget, setup, teardown),
		cmocka_unit_test_setup_teardown(test_progress_and_close_with_load_in_flight, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_superseded_waiting_load_answered_on_the_loop,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_unloaded_waiting_load_answered_on_the_loop,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_pins_and_unpins_in_turn_run_as_the_last,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_page_operation_asked_again_runs_once,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_pin_asked_during_a_load_outlives_it,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_failed_load_says_what_still_serves,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_reload_stages_as_the_stage_key_says_now,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev210_out_of_memory_in_place_of_leaves_no_descriptor,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev210_place_of_reads_the_mount_table_once_for_a_chain,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_rev212_place_of_look_has_one_budget, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_renamed_in_walks_to_the_directory_above,
			setup, teardown),
		cmocka_unit_test_setup_teardown(test_others_rename_on_walks_the_directories_above,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rev212_place_past_a_directory_that_cannot_be_named, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
