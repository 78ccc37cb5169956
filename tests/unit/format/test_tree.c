/*
 * test_tree.c: a model's files open inside the model's tree (client/format/tree.c).
 *
 * Each case builds a small directory layout with real symlinks and opens a
 * model file in it: links that stay inside the tree (including the Hugging
 * Face hub layout, whose snapshot files link to ../../blobs/) open; links to
 * another model's directory, absolute links and chains that end outside are
 * refused with a message that names the link, its target and the tree. Every
 * case runs twice: with openat2 and with the fallback for kernels without it.
 *
 * openat, fstat, fstatfs and syscall (openat2) are wrapped
 * (-Wl,--wrap=...): while a test sets interrupting, each of them fails once
 * with EINTR, as a signal makes it on a FUSE or NFS mount, and goes through
 * when it is tried again. The __real_ symbols are weak, so a build without
 * those options still links; the test that needs them then reports SKIPPED.
 *
 * tree_walk, the walk both of wcached's judged walks are: beneath its
 * start (a model's tree) and as the kernel walks (a model's path), and
 * its judge asked at each mount crossed, before anything on the mount is
 * looked up (in a mount namespace of the test's own: root; skipped
 * elsewhere).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "format/tree.h"
#include "testutil.h"

/* ---- fault injection ---- */

static int interrupting;  /* each wrapped call fails once with EINTR */
static int interruptions; /* how many calls were interrupted */

int __real_openat(int dir, const char *path, int flags, ...) __attribute__((weak));
int __real_fstat(int fd, struct stat *st) __attribute__((weak));
int __real_fstatfs(int fd, struct statfs *st) __attribute__((weak));
long __real_syscall(long number, ...) __attribute__((weak));
int __wrap_openat(int dir, const char *path, int flags, ...);
int __wrap_fstat(int fd, struct stat *st);
int __wrap_fstatfs(int fd, struct statfs *st);
long __wrap_syscall(long number, ...);

/* Whether this call fails with EINTR: while interrupting is set, unless
 * the last call of the same function did (*tried_again), so that every call
 * fails once and its retry goes through. */
static bool
interrupt(bool *tried_again)
{
	if (!interrupting || *tried_again) {
		*tried_again = false;
		return false;
	}
	*tried_again = true;
	interruptions++;
	errno = EINTR;
	return true;
}

/* openat() as tree.c calls it: never with O_CREAT or O_TMPFILE, so
 * without the mode argument. */
int
__wrap_openat(int dir, const char *path, int flags, ...)
{
	static bool again;

	if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE)
		fail_msg("openat(%s) with O_CREAT: the wrapper passes no mode on", path);
	return interrupt(&again) ? -1 : __real_openat(dir, path, flags);
}

int
__wrap_fstat(int fd, struct stat *st)
{
	static bool again;

	return interrupt(&again) ? -1 : __real_fstat(fd, st);
}

int
__wrap_fstatfs(int fd, struct statfs *st)
{
	static bool again;

	return interrupt(&again) ? -1 : __real_fstatfs(fd, st);
}

/* syscall() as tree.c calls it, for openat2 and its four arguments (the
 * only system call these tests reach through it). */
long
__wrap_syscall(long number, ...)
{
	static bool again;
	long arg[4];
	va_list ap;

	if (number != SYS_openat2)
		fail_msg("syscall(%ld): only openat2 is wrapped", number);
	va_start(ap, number);
	for (int i = 0; i < 4; i++)
		arg[i] = va_arg(ap, long);
	va_end(ap);
	if (interrupt(&again))
		return -1;
	return __real_syscall(number, arg[0], arg[1], arg[2], arg[3]);
}

struct fixture {
	char *dir;  /* as tu_tmpdir() made it */
	char *real; /* its canonical path, as messages name the tree */
	int fallback;
};

static void mkdir_at(const struct fixture *f, const char *rel);

static int
setup(void **state, int fallback)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char p[PATH_MAX];

	assert_non_null(f);
	f->dir = tu_tmpdir();
	assert_non_null(f->real = realpath(f->dir, NULL));
	f->fallback = fallback;
	tree_force_fallback = fallback;
	/* models/a: a model; models/b: another model; secret: not a model. */
	mkdir_at(f, "models");
	mkdir_at(f, "models/a");
	mkdir_at(f, "models/a/sub");
	mkdir_at(f, "models/b");
	snprintf(p, sizeof(p), "%s/models/a", f->dir);
	free(tu_write(p, "real.safetensors", "AAAA", 4));
	free(tu_write(p, "sub/deep.safetensors", "DDDD", 4));
	snprintf(p, sizeof(p), "%s/models/b", f->dir);
	free(tu_write(p, "y.safetensors", "BBBB", 4));
	free(tu_write(f->dir, "secret", "SSSS", 4));
	*state = f;
	return 0;
}

static int
setup_openat2(void **state)
{
	return setup(state, 0);
}

static int
setup_fallback(void **state)
{
	return setup(state, 1);
}

/* wcached's rule for mounts (tree.h's tree_mounts), refusing every
 * device: no test's tree crosses a mount, so no device is ever asked
 * about, and every open and every refusal is as without the rule (a link
 * that leaves the tree, walked one name at a time, still named as such). */
static int dev_questions;

static int
refuse_dev(const struct tree_mount *m, char *why, size_t len)
{
	(void)m;
	dev_questions++;
	snprintf(why, len, "a test's device");
	return -EXDEV;
}

static const struct tree_mounts refuse_all = { refuse_dev };

static int
setup_mounts(void **state)
{
	tree_mounts = &refuse_all;
	dev_questions = 0;
	return setup(state, 0);
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	if (tree_mounts != NULL)
		assert_int_equal(dev_questions, 0);
	tree_mounts = NULL;
	tree_force_fallback = 0;
	interrupting = 0;
	free(f->real);
	tu_rmtree(f->dir);
	free(f);
	return 0;
}

/* Makes the directory rel of the fixture. */
static void
mkdir_at(const struct fixture *f, const char *rel)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", f->dir, rel);
	assert_int_equal(mkdir(p, 0755), 0);
}

/* Makes dir/rel a symlink to target (dir relative to the fixture). */
static void
link_at(const struct fixture *f, const char *rel, const char *target)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", f->dir, rel);
	assert_int_equal(symlink(target, p), 0);
}

/* Opens fixture-relative rel as a model file; on success checks the 4 bytes
 * it holds start with first. */
static int
open_model(const struct fixture *f, const char *rel, char first)
{
	struct wc_file w;
	char p[PATH_MAX];
	int r;

	snprintf(p, sizeof(p), "%s/%s", f->dir, rel);
	if ((r = tree_open_model_file(p, &w)) < 0)
		return r;
	assert_int_equal(w.size, 4);
	assert_int_equal(w.base[0], first);
	assert_string_equal(w.path, p);
	file_close(&w);
	return 0;
}

/* Checks the message names the link (as the caller named it), the target and
 * the tree. */
static void
assert_refused(const struct fixture *f, const char *rel, const char *target, const char *tree)
{
	char want[PATH_MAX * 3];

	assert_int_equal(open_model(f, rel, 0), -EXDEV);
	snprintf(want, sizeof(want), "%s/%s: symlink to %s", f->dir, rel, target);
	if (strstr(error_get(), want) == NULL)
		fail_msg("message \"%s\" does not start with \"%s\"", error_get(), want);
	snprintf(want, sizeof(want), "leaves the model's tree %s/%s", f->real, tree);
	if (strstr(error_get(), want) == NULL)
		fail_msg("message \"%s\" does not say \"%s\"", error_get(), want);
}

/* Plain files and links that stay inside the model's directory open. */
static void
test_inside(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(open_model(f, "models/a/real.safetensors", 'A'), 0);
	link_at(f, "models/a/x.safetensors", "real.safetensors");
	assert_int_equal(open_model(f, "models/a/x.safetensors", 'A'), 0);
	link_at(f, "models/a/y.safetensors", "sub/../sub/deep.safetensors");
	assert_int_equal(open_model(f, "models/a/y.safetensors", 'D'), 0);
	/* A chain whose every step stays inside. */
	link_at(f, "models/a/z.safetensors", "x.safetensors");
	assert_int_equal(open_model(f, "models/a/z.safetensors", 'A'), 0);
	/* A missing file is ENOENT with the file's name. */
	assert_int_equal(open_model(f, "models/a/none.safetensors", 0), -ENOENT);
	assert_non_null(strstr(error_get(), "models/a/none.safetensors"));
}

/* A link into another model's directory is refused. */
static void
test_other_model(void **state)
{
	struct fixture *f = *state;

	link_at(f, "models/a/x.safetensors", "../b/y.safetensors");
	assert_refused(f, "models/a/x.safetensors", "../b/y.safetensors", "models/a");
}

/* An absolute link is refused, even to a file readable by everyone. */
static void
test_absolute(void **state)
{
	struct fixture *f = *state;
	char target[PATH_MAX];

	snprintf(target, sizeof(target), "%s/secret", f->dir);
	link_at(f, "models/a/x.safetensors", target);
	assert_refused(f, "models/a/x.safetensors", target, "models/a");
}

/* A chain whose first link stays inside but whose end leaves is refused,
 * naming the first link and where the chain ends. */
static void
test_chain(void **state)
{
	struct fixture *f = *state;
	char want[PATH_MAX + 32];

	link_at(f, "models/a/sub/hop", "../../../secret");
	link_at(f, "models/a/x.safetensors", "sub/hop");
	assert_refused(f, "models/a/x.safetensors", "sub/hop", "models/a");
	snprintf(want, sizeof(want), "resolving to %s/secret", f->real);
	/* wcached's rule looks nothing up outside the tree: no end told */
	if (tree_mounts == NULL)
		assert_non_null(strstr(error_get(), want));
	else
		assert_null(strstr(error_get(), "resolving to"));
}

/* The Hugging Face hub layout: snapshot files are relative links into
 * ../../blobs/, which is inside the tree models--ORG--NAME; the same link
 * from an ordinary directory is refused. */
static void
test_hub_snapshot(void **state)
{
	struct fixture *f = *state;
	char p[PATH_MAX];

	mkdir_at(f, "hub");
	mkdir_at(f, "hub/models--org--m");
	mkdir_at(f, "hub/models--org--m/blobs");
	mkdir_at(f, "hub/models--org--m/snapshots");
	mkdir_at(f, "hub/models--org--m/snapshots/rev1");
	snprintf(p, sizeof(p), "%s/hub/models--org--m/blobs", f->dir);
	free(tu_write(p, "abc123", "HHHH", 4));
	link_at(f, "hub/models--org--m/snapshots/rev1/model.safetensors", "../../blobs/abc123");
	assert_int_equal(open_model(f, "hub/models--org--m/snapshots/rev1/model.safetensors", 'H'),
		0);
	/* Through the operator's own symlink to the snapshot (a stable path). */
	link_at(f, "served", "hub/models--org--m/snapshots/rev1");
	assert_int_equal(open_model(f, "served/model.safetensors", 'H'), 0);
	/* Out of the repository folder: refused. */
	link_at(f, "hub/models--org--m/snapshots/rev1/bad.safetensors", "../../../../secret");
	assert_refused(f, "hub/models--org--m/snapshots/rev1/bad.safetensors",
		"../../../../secret", "hub/models--org--m");
	/* Not a hub layout (no models-- folder): the snapshot is its own tree. */
	mkdir_at(f, "plain");
	mkdir_at(f, "plain/snapshots");
	mkdir_at(f, "plain/snapshots/rev1");
	mkdir_at(f, "plain/blobs");
	snprintf(p, sizeof(p), "%s/plain/blobs", f->dir);
	free(tu_write(p, "abc123", "HHHH", 4));
	link_at(f, "plain/snapshots/rev1/model.safetensors", "../../blobs/abc123");
	assert_refused(f, "plain/snapshots/rev1/model.safetensors", "../../blobs/abc123",
		"plain/snapshots/rev1");
}

/* /proc/self/fd/N names the caller's own open file (the Python package's
 * safe_open of a file object): it has no model tree and opens. */
static void
test_proc_self_fd(void **state)
{
	struct fixture *f = *state;
	char p[PATH_MAX];
	struct wc_file w;
	int fd;

	snprintf(p, sizeof(p), "%s/models/a/real.safetensors", f->dir);
	assert_true((fd = open(p, O_RDONLY | O_CLOEXEC)) >= 0);
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	assert_int_equal(tree_open_model_file(p, &w), 0);
	assert_int_equal(w.size, 4);
	assert_int_equal(w.base[0], 'A');
	file_close(&w);
	close(fd);
}

/* The tree of a model directory and its place in the tree. */
static void
test_tree_open(void **state)
{
	struct fixture *f = *state;
	struct model_tree t;
	char p[PATH_MAX], want[PATH_MAX];

	snprintf(p, sizeof(p), "%s/models/a/", f->dir);
	assert_int_equal(tree_open(p, &t), 0);
	snprintf(want, sizeof(want), "%s/models/a", f->real);
	assert_string_equal(t.root, want);
	assert_string_equal(t.dir, "");
	tree_close(&t);
	tree_close(&t);
	snprintf(p, sizeof(p), "%s/nope", f->dir);
	assert_int_equal(tree_open(p, &t), -ENOENT);
}

/*
 * A signal that interrupts an openat, openat2, fstat or fstatfs on the way
 * (EINTR, as a FUSE or NFS mount returns it while it waits on its server)
 * does not fail the open of a model file: each call is tried again. Before,
 * the open failed with "Interrupted system call", and an interrupted
 * fstatfs of a /proc/self/fd tree took it for a model's tree, whose magic
 * link openat2 refused ("a symlink loop, or a link into /proc").
 */
static void
test_interrupted(void **state)
{
	struct fixture *f = *state;
	char p[PATH_MAX];
	struct wc_file w;
	int fd, before = tu_count_fds();

	if (__real_openat == NULL || __real_fstat == NULL || __real_fstatfs == NULL ||
		__real_syscall == NULL)
		skip();
	link_at(f, "models/a/x.safetensors", "sub/deep.safetensors");
	snprintf(p, sizeof(p), "%s/models/a/real.safetensors", f->dir);
	assert_true((fd = open(p, O_RDONLY | O_CLOEXEC)) >= 0);
	interrupting = 1;
	interruptions = 0;
	assert_int_equal(open_model(f, "models/a/real.safetensors", 'A'), 0);
	assert_true(interruptions >= 3); /* the tree, the file, its fstat */
	assert_int_equal(open_model(f, "models/a/x.safetensors", 'D'), 0);
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	interruptions = 0;
	assert_int_equal(tree_open_model_file(p, &w), 0);
	assert_true(interruptions >= 4); /* and the fstatfs */
	interrupting = 0;
	assert_int_equal(w.base[0], 'A');
	file_close(&w);
	close(fd);
	assert_int_equal(tu_count_fds(), before);
}

/* ---- tree_walk ---- */

/* A judge that counts its questions and refuses every mount when refuse
 * is set (with its own code, -EPERM, to be told from a link leaving). */
struct judge_log {
	int asked;
	bool refuse;
	struct tree_mount mount;
	char name[64];
};

static int
judge_log(void *ctx, const struct tree_mount *m, const char *name, char *why, size_t len)
{
	struct judge_log *j = ctx;

	j->asked++;
	j->mount = *m;
	snprintf(j->name, sizeof(j->name), "%s", name);
	if (!j->refuse)
		return 0;
	snprintf(why, len, "%s refused", name);
	return -EPERM;
}

/* tree_walk of rel from at as w (beneath or not): the descriptor's
 * (dev, ino) must be path's, or the walk's code want. */
static void
walk_is(int at, const char *rel, struct tree_walk *w, const char *path, int want)
{
	char why[128];
	struct stat a, b;
	int fd = tree_walk(at, rel, w, why, sizeof(why));

	if (path == NULL) {
		assert_int_equal(fd, want);
		return;
	}
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(stat(path, &b), 0);
	assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
	close(fd);
}

/* The walk's rules without mounts: beneath its start, ".." above it and an
 * absolute link leave (EXDEV), a path that names a directory by "." is
 * no file (EISDIR); as the kernel walks, both are followed; links counted
 * across walks (ELOOP past 40); a name past a file is ENOTDIR. */
static void
test_walk_rules(void **state)
{
	struct judge_log j = { 0 };
	struct tree_walk beneath = { .judge = judge_log, .ctx = &j, .beneath = true };
	struct tree_walk kernel = { .judge = judge_log, .ctx = &j };
	char *dir = tu_tmpdir(), p[PATH_MAX], q[PATH_MAX];
	int at, before = tu_count_fds();

	(void)state;
	snprintf(p, sizeof(p), "%s/start", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/start/a", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/start/a/f", dir);
	close(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	snprintf(p, sizeof(p), "%s/outside", dir);
	close(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	snprintf(q, sizeof(q), "%s/start/a/f", dir);
	snprintf(p, sizeof(p), "%s/start/abs", dir);
	assert_int_equal(symlink(q, p), 0);
	snprintf(p, sizeof(p), "%s/start/up", dir);
	assert_int_equal(symlink("../outside", p), 0);
	snprintf(p, sizeof(p), "%s/start/rel", dir);
	assert_int_equal(symlink("a/./f", p), 0);
	snprintf(p, sizeof(p), "%s/start", dir);
	assert_true((at = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);

	snprintf(q, sizeof(q), "%s/start/a/f", dir);
	walk_is(at, "a/f", &beneath, q, 0);
	walk_is(at, "rel", &beneath, q, 0);
	walk_is(at, "a/../a/f", &beneath, q, 0);
	walk_is(at, "abs", &beneath, NULL, -EXDEV);
	assert_false(beneath.refused);
	walk_is(at, "up", &beneath, NULL, -EXDEV);
	walk_is(at, "../outside", &beneath, NULL, -EXDEV);
	walk_is(at, "a/.", &beneath, NULL, -EISDIR);
	walk_is(at, "", &beneath, NULL, -EISDIR);
	walk_is(at, "a/f/x", &beneath, NULL, -ENOTDIR);
	walk_is(at, "a/missing", &beneath, NULL, -ENOENT);
	walk_is(at, "abs", &kernel, q, 0);
	snprintf(q, sizeof(q), "%s/outside", dir);
	walk_is(at, "up", &kernel, q, 0);
	walk_is(at, "a/../../outside", &kernel, q, 0);
	snprintf(q, sizeof(q), "%s/start/a", dir);
	walk_is(at, "a/.", &kernel, q, 0);
	walk_is(at, "a/f/.", &kernel, NULL, -ENOTDIR);
	kernel.links = 40;
	walk_is(at, "rel", &kernel, NULL, -ELOOP);
	kernel.links = 39;
	snprintf(q, sizeof(q), "%s/start/a/f", dir);
	walk_is(at, "rel", &kernel, q, 0);
	assert_int_equal(kernel.links, 40);
	assert_int_equal(j.asked, 0);
	close(at);
	assert_int_equal(tu_count_fds(), before);
	tu_rmtree(dir);
}

/*
 * Mounts crossed: a tmpfs mounted on start/vol (reached by name, or by a
 * link's text) is judged once per walk, by its device and the name it is
 * on, before anything on it is looked up: refused, a missing name on it
 * is the judge's refusal, not ENOENT, and nothing is held open. In a
 * mount namespace of the test's own (root): skipped elsewhere.
 */
static void
test_walk_judges_mounts(void **state)
{
	struct judge_log j = { 0 };
	struct tree_walk beneath = { .judge = judge_log, .ctx = &j, .beneath = true };
	struct tree_walk kernel = { .judge = judge_log, .ctx = &j };
	char *dir, p[PATH_MAX], q[PATH_MAX], why[128] = "";
	int at, before;
	struct statx sx;
	struct stat st;

	(void)state;
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		skip();
	dir = tu_tmpdir();
	before = tu_count_fds();
	snprintf(p, sizeof(p), "%s/vol", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(mount("vol", p, "tmpfs", 0, "size=1m"), 0);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(statx(AT_FDCWD, p, 0, STATX_MNT_ID, &sx), 0);
	snprintf(p, sizeof(p), "%s/vol/y", dir);
	close(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	snprintf(p, sizeof(p), "%s/tovol", dir);
	assert_int_equal(symlink("./vol/y", p), 0);
	assert_true((at = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);

	snprintf(q, sizeof(q), "%s/vol/y", dir);
	walk_is(at, "vol/y", &beneath, q, 0);
	assert_int_equal(j.asked, 1);
	assert_true(j.mount.dev == st.st_dev);
	/* the mount's own ID, where the kernel tells it (Linux 5.8) */
	assert_true(j.mount.has_id == ((sx.stx_mask & STATX_MNT_ID) != 0));
	assert_true(!j.mount.has_id || j.mount.id == sx.stx_mnt_id);
	assert_string_equal(j.name, "vol");
	walk_is(at, "tovol", &kernel, q, 0);
	assert_int_equal(j.asked, 2);
	assert_string_equal(j.name, "vol");
	j.refuse = true;
	assert_int_equal(tree_walk(at, "vol/missing", &beneath, why, sizeof(why)), -EPERM);
	assert_true(beneath.refused);
	assert_string_equal(why, "vol refused");
	assert_int_equal(tree_walk(at, "tovol", &kernel, why, sizeof(why)), -EPERM);
	assert_true(kernel.refused);
	walk_is(at, "tovol/../x", &kernel, NULL, -EPERM);
	assert_int_equal(j.asked, 5);
	/* the mount's own root, by "..": judged too (from the mount) */
	close(at);
	snprintf(p, sizeof(p), "%s/vol", dir);
	assert_true((at = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);
	walk_is(at, "../tovol", &kernel, NULL, -EPERM);
	assert_string_equal(j.name, "..");
	j.refuse = false;
	walk_is(at, "../vol/y", &kernel, q, 0);
	close(at);
	assert_int_equal(tu_count_fds(), before);
	snprintf(p, sizeof(p), "%s/vol", dir);
	assert_int_equal(umount(p), 0);
	tu_rmtree(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_walk_rules),
		cmocka_unit_test(test_walk_judges_mounts),
#define BOTH(t)                                                          \
	cmocka_unit_test_setup_teardown(t, setup_openat2, teardown),     \
		cmocka_unit_test_setup_teardown(t, setup_fallback, teardown), \
		cmocka_unit_test_setup_teardown(t, setup_mounts, teardown)
		BOTH(test_inside),
		BOTH(test_other_model),
		BOTH(test_absolute),
		BOTH(test_chain),
		BOTH(test_hub_snapshot),
		BOTH(test_tree_open),
		BOTH(test_proc_self_fd),
		BOTH(test_interrupted),
#undef BOTH
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
