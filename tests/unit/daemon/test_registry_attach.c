/*
 * test_registry_attach.c: unit tests of daemon/registry.c, attaching: the
 * reply and the descriptors it hands out, which model a name or a path
 * finds (registry_find), access by uid and group, and
 * what a restart carries over (restore_*): generations taken over from
 * the store and held (HOLD), the description for the store within a
 * descriptor limit, a model whose check still runs carried into it, and a
 * status page from the store. On a real libuv
 * loop and small model files in /tmp; no fault injection.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemonutil.h"
#include "base/error.h"
#include "fdstore.h"
#include "base/file.h"
#include "generation.h"
#include "proto/memfds.h"
#include "registry_internal.h"
#include "restore.h"
#include "restore_internal.h"
#include "testutil.h"

static int
setup(void **state)
{
	*state = du_new(false);
	return 0;
}

#define teardown du_free

static const struct registry_peer root_peer = { .pid = 1, .uid = 0, .gid = 0 };

/* ---- attaching ---- */

static void
test_attach_reply(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	struct registry_attachment a;
	struct model_entry *m;
	char msg[64];

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	m = registry_find(&t->reg, "m");
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), 0);
	assert_int_equal(a.generation, 1);
	assert_int_equal(a.file_count, 1);
	assert_int_equal(a.index_size, a.gen->index_size);
	assert_int_equal(a.nfds, 3); /* index, the file, the status page */
	/* The index too goes out as another open file description. */
	assert_int_equal(a.fds[0], a.gen->served_index_fd);
	assert_int_not_equal(a.fds[0], a.gen->index_fd);
	/* The file goes out as another open file description of the same
	 * inode: a flag a worker sets on it never reaches the daemon's. */
	assert_int_equal(a.fds[1], a.gen->served_fds[0]);
	assert_int_not_equal(a.fds[1], a.gen->source.files[0].fd);
	{
		struct stat sent, own;
		int own_flags = fcntl(a.gen->source.files[0].fd, F_GETFL);

		assert_int_equal(fstat(a.fds[1], &sent), 0);
		assert_int_equal(fstat(a.gen->source.files[0].fd, &own), 0);
		assert_true(sent.st_dev == own.st_dev && sent.st_ino == own.st_ino);
		assert_int_equal(fcntl(a.fds[1], F_SETFL, O_APPEND | O_NONBLOCK | O_DIRECT), 0);
		assert_int_equal(fcntl(a.gen->source.files[0].fd, F_GETFL), own_flags);
		assert_int_equal(lseek(a.fds[1], 100, SEEK_SET), 100);
		assert_int_equal(lseek(a.gen->source.files[0].fd, 0, SEEK_CUR), 0);
	}
	assert_int_equal(a.fds[2], t->reg.page.ro_fd);
	assert_int_equal(a.status_slot, m->slot);
	assert_int_equal(a.gen->attached, 1);
	assert_int_equal(m->attach_count, 1);
	registry_release(&t->reg, a.gen, 0);
	assert_int_equal(du_current(t, "m")->attached, 0);
	free(path);
}

/* t->dir/name, malloc'd. */
static char *
in_dir(struct du *t, const char *name)
{
	char *path;

	assert_true(asprintf(&path, "%s/%s", t->dir, name) > 0);
	return path;
}

/* Points the symbolic link t->dir/name at target (a name in t->dir) the
 * README's way: a new link renamed over it. */
static void
point(struct du *t, const char *name, const char *target)
{
	char *tmp = in_dir(t, ".link.new"), *at = in_dir(t, name);

	assert_int_equal(symlink(target, tmp), 0);
	assert_int_equal(rename(tmp, at), 0);
	free(tmp);
	free(at);
}

/* The name of the model registry_find() finds for name, or "-". */
static const char *
found(struct du *t, const char *name)
{
	const struct model_entry *m = registry_find(&t->reg, name);

	return m != NULL ? m->name : "-";
}

/*
 * registry_find's order: a model's name, then a configured path, then the
 * real path of a configured path (a symbolic link to a hub snapshot's
 * directory) as its current generation resolved it; of several models
 * with one such path, the one added first. The real path follows the
 * current generation: a reload after the link is renamed over makes the
 * new target's real path find the model and the old one not, also when
 * the reload finds the same files (another directory of hard links).
 */
static void
test_find_order(void **state)
{
	struct du *t = *state;
	char *snap1 = in_dir(t, "snap1"), *snap2 = in_dir(t, "snap2"), *snap3 = in_dir(t, "snap3");
	char *link1 = in_dir(t, "link"), *link2 = in_dir(t, "link2"), *f1, *f2, *f3;
	char *inside = in_dir(t, "snap1/model.safetensors"), *real1, *real2, *real3, *slash;

	assert_int_equal(mkdir(snap1, 0755), 0);
	assert_int_equal(mkdir(snap2, 0755), 0);
	assert_int_equal(mkdir(snap3, 0755), 0);
	f1 = du_model(t, "snap1/model.safetensors", 16);
	f2 = du_model(t, "snap2/model.safetensors", 32);
	f3 = in_dir(t, "snap3/model.safetensors");
	assert_int_equal(link(f2, f3), 0); /* snap3 holds snap2's file */
	point(t, "link", "snap1");
	point(t, "link2", "snap1");
	assert_non_null(real1 = realpath(snap1, NULL));
	assert_non_null(real2 = realpath(snap2, NULL));
	assert_non_null(real3 = realpath(snap3, NULL));

	assert_int_equal(du_load(t, "a", link1, PIN_NONE, 0), 0);
	assert_string_equal(found(t, "a"), "a");
	assert_string_equal(found(t, link1), "a");
	assert_string_equal(found(t, real1), "a");
	/* Neither a configured nor a resolved path: a file in it, another
	 * directory, the real path spelled another way. */
	assert_true(asprintf(&slash, "%s/", real1) > 0);
	assert_string_equal(found(t, inside), "-");
	assert_string_equal(found(t, real2), "-");
	assert_string_equal(found(t, slash), "-");
	assert_string_equal(found(t, "snap1"), "-");

	/* b resolves to the same directory: a, added first, is found. */
	assert_int_equal(du_load(t, "b", link2, PIN_NONE, 0), 0);
	assert_string_equal(found(t, real1), "a");
	assert_string_equal(found(t, link2), "b");
	/* A configured path comes before a resolved one. */
	assert_int_equal(du_load(t, "c", real1, PIN_NONE, 0), 0);
	assert_string_equal(found(t, real1), "c");
	/* Two models configured with one path: the one added first. */
	assert_int_equal(du_load(t, "d", link1, PIN_NONE, 0), 0);
	assert_string_equal(found(t, link1), "a");
	/* A name comes before a configured path ("e" fails to load and
	 * stays, configured as "a"). */
	assert_true(du_load(t, "e", "a", PIN_NONE, 0) < 0);
	assert_string_equal(found(t, "a"), "a");
	assert_int_equal(registry_unload(&t->reg, "c"), 0);
	assert_int_equal(registry_unload(&t->reg, "d"), 0);
	assert_string_equal(found(t, real1), "a");

	/* The link renamed over to snap2 and a reload: snap2's real path
	 * finds a, snap1's only b (whose generation still resolves there). */
	point(t, "link", "snap2");
	assert_int_equal(du_reload(t, "a"), 0);
	assert_int_equal(t->generation, 2);
	assert_string_equal(found(t, real2), "a");
	assert_string_equal(found(t, real1), "b");
	assert_int_equal(registry_unload(&t->reg, "b"), 0);
	assert_string_equal(found(t, real1), "-");
	/* Over to snap3, the same file: no new generation, and snap3's real
	 * path finds a, snap2's no longer. */
	point(t, "link", "snap3");
	assert_int_equal(du_reload(t, "a"), 0);
	assert_string_equal(t->message, "unchanged");
	assert_int_equal(t->generation, 2);
	assert_string_equal(found(t, real3), "a");
	assert_string_equal(found(t, real2), "-");
	/* Unloaded: nothing finds it. */
	assert_int_equal(registry_unload(&t->reg, "a"), 0);
	assert_string_equal(found(t, real3), "-");
	assert_string_equal(found(t, link1), "-");
	free(inside);
	free(slash);
	free(real1);
	free(real2);
	free(real3);
	free(f1);
	free(f2);
	free(f3);
	free(link1);
	free(link2);
	free(snap1);
	free(snap2);
	free(snap3);
}

/* Loads m, a one-file model in t's directory, of which one retired
 * generation at most is always left room (retired_max 1): its path. */
static char *
one_file_model(struct du *t)
{
	char *path = du_model(t, "a.safetensors", 1024);

	t->reg.retired_max = 1;
	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	return path;
}

/* Releases the n attaches at, and frees path. */
static void
release_all(struct du *t, struct registry_attachment *at, int n, char *path)
{
	for (int i = 0; i < n; i++)
		registry_release(&t->reg, at[i].gen, 0);
	free(path);
}

/*
 * Reloads of m, a one-file model, each after an attach of the generation
 * serving (kept in at[0 .. n - 1]) and a new file renamed over path: what
 * the last reload answered (0, or -EBUSY when it waits for a release).
 */
static int
attach_and_reload(struct du *t, const char *path, struct registry_attachment *at, int n)
{
	char msg[128];
	int err = 0;

	for (int i = 0; i < n && err == 0; i++) {
		char *next = du_model(t, "n.safetensors", 2048 + 16 * (size_t)i);

		assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &at[i], msg,
			sizeof(msg)), 0);
		assert_int_equal(rename(next, path), 0);
		err = du_reload(t, "m");
		free(next);
	}
	return err;
}

/*
 * Past retired_max, a reload waits while the retired generations'
 * descriptors pass an eighth of RLIMIT_NOFILE as wcached started with it:
 * registry_init reads the soft limit once (review rev175 F2). Before,
 * retired_full called getrlimit on every reload and every release; with
 * the soft limit lowered to 64 after the start (an eighth: 8 descriptors,
 * two retired generations of one file) the third reload waited (-EBUSY).
 */
static void
test_retired_bound_is_the_limit_at_start(void **state)
{
	struct du *t = *state;
	char *a = one_file_model(t);
	struct registry_attachment at[3];
	struct rlimit was, low;
	int err;

	assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
	assert_true(was.rlim_cur >= 1024);
	low = was;
	low.rlim_cur = 64;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	err = attach_and_reload(t, a, at, 3);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
	assert_int_equal(err, 0);
	assert_int_equal(du_current(t, "m")->number, 4);
	release_all(t, at, 3, a);
}

/*
 * An unlimited RLIMIT_NOFILE leaves room for any number of retired
 * generations; a limit not known leaves retired_max alone. Before, the
 * unlimited one read as full (the reload waited past retired_max); Linux
 * refuses RLIM_INFINITY for RLIMIT_NOFILE (it caps it at nr_open), so this
 * sets the recorded limit, a field added with the fix.
 */
static void
test_retired_bound_unlimited(void **state)
{
	struct du *t = *state;
	char *a = one_file_model(t);
	struct registry_attachment at[3];

	t->reg.fd_limit = RLIM_INFINITY;
	assert_int_equal(attach_and_reload(t, a, at, 2), 0);
	t->reg.fd_limit = 0;
	assert_int_equal(attach_and_reload(t, a, &at[2], 1), -EBUSY);
	assert_int_equal(du_current(t, "m")->number, 3);
	assert_int_equal(registry_find(&t->reg, "m")->reload_again, RELOAD_OPERATOR);
	release_all(t, at, 3, a);
}

/*
 * Several models on one path with their own allow_users: an attach by the
 * path finds the first that lets the peer in (configured path, then real
 * path), and only when none does, the first's refusal; a name finds its
 * own model whatever the others allow.
 */
static void
test_find_for_access(void **state)
{
	struct du *t = *state;
	char *snap = in_dir(t, "snap"), *link1 = in_dir(t, "link"), *real, *f;
	const uid_t only_a[] = { 1000 }, only_b[] = { 2000 }, only_c[] = { 3000 };
	struct registry_peer p = { .pid = 9, .uid = 2000, .gid = 2000 };
	struct model_entry *m = NULL;
	char msg[128];

	assert_int_equal(mkdir(snap, 0755), 0);
	f = du_model(t, "snap/model.safetensors", 16);
	point(t, "link", "snap");
	assert_non_null(real = realpath(snap, NULL));
	assert_int_equal(du_load(t, "a", link1, PIN_NONE, 0), 0);
	assert_int_equal(du_load(t, "b", link1, PIN_NONE, 0), 0);
	assert_int_equal(registry_set_access(&t->reg, "a", 1, only_a, 1, NULL, 0), 0);
	assert_int_equal(registry_set_access(&t->reg, "b", 1, only_b, 1, NULL, 0), 0);

	/* By the configured path and by the real path: b for uid 2000. */
	assert_int_equal(registry_find_for(&t->reg, link1, &p, &m, msg, sizeof(msg)), 0);
	assert_string_equal(m->name, "b");
	m = NULL;
	assert_int_equal(registry_find_for(&t->reg, real, &p, &m, msg, sizeof(msg)), 0);
	assert_string_equal(m->name, "b");
	/* a for uid 1000 (the first), root for a too. */
	p.uid = 1000;
	assert_int_equal(registry_find_for(&t->reg, real, &p, &m, msg, sizeof(msg)), 0);
	assert_string_equal(m->name, "a");
	assert_int_equal(registry_find_for(&t->reg, link1, &root_peer, &m, msg, sizeof(msg)), 0);
	assert_string_equal(m->name, "a");
	/* A name is its own model's: b refuses uid 1000. */
	assert_int_equal(registry_find_for(&t->reg, "b", &p, &m, msg, sizeof(msg)), -EACCES);
	assert_int_equal(registry_find(&t->reg, "b")->denied_count, 1);
	/* Nobody lets uid 3000 in: the first (a) refuses and counts it. */
	p.uid = 3000;
	assert_int_equal(registry_find_for(&t->reg, link1, &p, &m, msg, sizeof(msg)), -EACCES);
	assert_string_equal(msg, "access denied: uid 3000 is not in the model's allow_users or "
				 "allow_groups");
	assert_int_equal(registry_find(&t->reg, "a")->denied_count, 1);
	/* A configured path comes before a real path: c (configured as the
	 * real path, added last) for its uid; b still for its own. */
	assert_int_equal(du_load(t, "c", real, PIN_NONE, 0), 0);
	assert_int_equal(registry_set_access(&t->reg, "c", 1, only_c, 1, NULL, 0), 0);
	assert_int_equal(registry_find_for(&t->reg, real, &p, &m, msg, sizeof(msg)), 0);
	assert_string_equal(m->name, "c");
	p.uid = 2000;
	assert_int_equal(registry_find_for(&t->reg, real, &p, &m, msg, sizeof(msg)), 0);
	assert_string_equal(m->name, "b");
	/* A path nothing is configured at stays not served. */
	assert_int_equal(registry_find_for(&t->reg, f, &p, &m, msg, sizeof(msg)), -ENOENT);
	assert_string_equal(msg, "not served");
	free(f);
	free(real);
	free(link1);
	free(snap);
}

/* Generation 1 of "m" comes back as the store would give it (files of
 * path, an index memfd like the current one's) with holders. */
static int
adopt_held(struct du *t, const char *path, uint64_t number, unsigned holders)
{
	struct model_source src = { .format = FORMAT_SAFETENSORS };
	int fd, ifd, r;

	src.files = calloc(1, sizeof(*src.files));
	assert_non_null(src.files);
	assert_true((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
	assert_int_equal(file_from_fd(fd, path, &src.files[0]), 0);
	src.nfiles = 1;
	assert_true((ifd = fcntl(du_current(t, "m")->index_fd, F_DUPFD_CLOEXEC, 0)) >= 0);
	r = restore_adopt_held(&t->reg, &(struct restore_served){ .name = "m", .number = number,
		.src = &src, .index_fd = ifd,
		.index_size = du_current(t, "m")->index_size }, holders);
	if (r < 0) { /* nothing taken */
		assert_int_equal(src.nfiles, 1);
		source_close(&src);
		close(ifd);
	} else {
		assert_int_equal(src.nfiles, 0);
	}
	free(src.files);
	return r;
}

/* A peer on connection conn (HOLD's once-per-connection rule). */
static struct registry_peer
conn_peer(uint64_t conn)
{
	return (struct registry_peer){ .pid = 1, .uid = 0, .gid = 0, .conn_id = conn };
}

/* HOLD (restore_hold) and the generations a restart takes over as held
 * (restore_adopt_held): only a generation taken over from the store may
 * be held, only while its wait lasts, at most as many times as it had
 * holders and once per connection; one waits restart_hold_ms with no
 * holder, then closes unless someone holds it. */
static void
test_hold_after_restart(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *path2;
	struct registry_peer p1 = conn_peer(1), p2 = conn_peer(2), p3 = conn_peer(3);
	struct generation *g = NULL, *old, *h;
	char msg[256];

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	/* Loaded by this process: a HOLD of it names another generation. */
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p1, &g, msg, sizeof(msg)), -ENOENT);
	assert_string_equal(msg, "model \"m\": generation 1 was not taken over from the "
				 "previous wcached");
	assert_int_equal(restore_hold(&t->reg, "x", 1, &p1, &g, msg, sizeof(msg)), -ENOENT);
	assert_string_equal(msg, "not served");
	path2 = du_model(t, "m2.safetensors", 2048);
	assert_int_equal(rename(path2, path), 0); /* replaced: generation 2 */
	assert_int_equal(du_reload(t, "m"), 0);
	assert_int_equal(du_current(t, "m")->number, 2);
	assert_int_equal(du_generations(t), 1);

	t->reg.restart_hold_ms = 60000;
	/* Not older than the current generation, or without holders:
	 * refused, nothing taken. */
	assert_int_equal(adopt_held(t, path, 2, 2), -EINVAL);
	assert_int_equal(adopt_held(t, path, 1, 0), -EINVAL);
	assert_non_null(strstr(error_get(), "had no holders when it was stored"));
	assert_int_equal(du_generations(t), 1);
	/* Two holders when it was stored. */
	assert_int_equal(adopt_held(t, path, 1, 2), 0);
	assert_int_equal(du_generations(t), 2);
	assert_int_equal(t->reg.holds_open, 1);
	old = registry_generation(&t->reg, registry_find(&t->reg, "m"), 1);
	assert_non_null(old);
	assert_int_equal(restore_holders(old), 2);
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p1, &g, msg, sizeof(msg)), 0);
	assert_ptr_equal(g, old);
	assert_int_equal(old->attached, 1);
	assert_int_equal(old->state, GEN_READY);
	assert_ptr_not_equal(du_current(t, "m"), old);
	assert_int_equal(restore_holders(old), 2); /* one attached, one expected */
	/* Replayed on the same connection: refused, nothing taken. */
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p1, &h, msg, sizeof(msg)), -EALREADY);
	assert_string_equal(msg, "model \"m\": generation 1: this connection has said it holds "
				 "it already");
	assert_int_equal(old->attached, 1);
	/* The second holder; a third is one more than there were. */
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p2, &h, msg, sizeof(msg)), 0);
	assert_int_equal(old->attached, 2);
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p3, &h, msg, sizeof(msg)), -EUSERS);
	assert_string_equal(msg, "model \"m\": generation 1: all 2 of its holders before the "
				 "restart have said so");
	assert_int_equal(old->attached, 2);
	registry_release(&t->reg, h, 0);
	/* A holder that released is gone: its place is not given again. */
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p3, &h, msg, sizeof(msg)), -EUSERS);
	/* The current generation was loaded here: nobody may HOLD it. */
	assert_int_equal(restore_hold(&t->reg, "m", 2, &p3, &h, msg, sizeof(msg)), -ENOENT);
	/* The wait ends while it is held: it stays until released, and no
	 * HOLD is accepted any more. */
	old->hold_until_ms = 1;
	uv_update_time(t->reg.loop);
	restore_expire_holds(&t->reg);
	assert_int_equal(t->reg.holds_open, 0);
	assert_int_equal(du_generations(t), 2);
	assert_int_equal(restore_holders(old), 1);
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p3, &h, msg, sizeof(msg)), -ENOENT);
	assert_string_equal(msg, "model \"m\": generation 1: the wait for its holders after the "
				 "restart has ended (restart_hold_seconds)");
	registry_release(&t->reg, old, 0);
	assert_int_equal(du_generations(t), 1);
	free(path);
	free(path2);
}

/* A held generation nobody claims: HOLDs after its deadline (before the
 * timer noticed) are refused, and it closes when the wait ends. */
static void
test_hold_after_deadline(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024), *path2;
	struct registry_peer p1 = conn_peer(1);
	struct generation *g = NULL;
	char msg[256];

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	path2 = du_model(t, "m2.safetensors", 2048);
	assert_int_equal(rename(path2, path), 0);
	assert_int_equal(du_reload(t, "m"), 0);
	t->reg.restart_hold_ms = 0; /* the deadline is now */
	assert_int_equal(adopt_held(t, path, 1, 5), 0);
	assert_int_equal(restore_hold(&t->reg, "m", 1, &p1, &g, msg, sizeof(msg)), -ENOENT);
	assert_non_null(strstr(msg, "the wait for its holders after the restart has ended"));
	assert_int_equal(du_generations(t), 2);
	restore_expire_holds(&t->reg);
	assert_int_equal(du_generations(t), 1);
	assert_int_equal(t->reg.holds_open, 0);
	free(path);
	free(path2);
}

/* The description for the store within a descriptor limit: held
 * generations go first (oldest first), current ones stay; when the
 * current ones alone do not fit, whole models are left out by name. */
static void
test_describe_limit(void **state)
{
	struct du *t = *state;
	char *a = du_model(t, "a.safetensors", 1024), *b = du_model(t, "b.safetensors", 1024);
	struct registry_attachment at[2];
	struct fdstore_desc *d = NULL;
	struct generation *g;
	char left[512], msg[128];

	assert_int_equal(du_load(t, "m", a, PIN_NONE, 0), 0);
	assert_int_equal(du_load(t, "other", b, PIN_NONE, 0), 0);
	/* Generations 1 and 2 of m held by attaches, 3 current. */
	for (int i = 0; i < 2; i++) {
		char *next = du_model(t, "n.safetensors", 2048 + 1024 * (size_t)i);

		assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &at[i], msg,
			sizeof(msg)), 0);
		assert_int_equal(rename(next, a), 0);
		assert_int_equal(du_reload(t, "m"), 0);
		free(next);
	}
	assert_int_equal(du_current(t, "m")->number, 3);
	/* As if each had gone into the store. */
	for (g = t->reg.generations; g != NULL; g = g->next) {
		g->stored_slot = g->model->slot;
		g->stored_done = 1;
	}
	/* No limit to speak of: everything, each with its holders. */
	assert_int_equal(restore_describe(&t->reg, 100, &d, left, sizeof(left)), 0);
	assert_string_equal(left, "");
	assert_int_equal(d->nmodels, 2);
	assert_int_equal(d->models[0].ngenerations + d->models[1].ngenerations, 4);
	for (uint32_t i = 0; i < d->nmodels; i++)
		for (uint32_t k = 0; k < d->models[i].ngenerations; k++)
			assert_int_equal(d->models[i].generations[k].holders,
				d->models[i].generations[k].role == FDSTORE_HELD ? 1 : 0);
	assert_int_equal(fdstore_check(d), 0);
	fdstore_free(d);
	/* Room for the two current ones (2 descriptors each) and one held:
	 * the newest held (2) stays, the oldest (1) goes. */
	assert_int_equal(restore_describe(&t->reg, 6, &d, left, sizeof(left)), 0);
	assert_string_equal(left, "held generations left out: \"m\" 1");
	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_model *m = &d->models[i];

		assert_int_equal(m->ngenerations, strcmp(m->name, "m") == 0 ? 2 : 1);
		assert_int_equal(m->generations[0].role, FDSTORE_CURRENT);
		if (m->ngenerations == 2)
			assert_int_equal(m->generations[1].number, 2);
	}
	fdstore_free(d);
	/* Room for one current generation: the other model is described
	 * without generations (its slot and numbers kept), and named. */
	assert_int_equal(restore_describe(&t->reg, 3, &d, left, sizeof(left)), 0);
	assert_non_null(strstr(left, "models left out whole: \""));
	assert_int_equal(d->nmodels, 2);
	assert_int_equal(d->models[0].ngenerations + d->models[1].ngenerations, 1);
	assert_int_equal(fdstore_check(d), 0);
	fdstore_free(d);
	for (int i = 0; i < 2; i++)
		registry_release(&t->reg, at[i].gen, 0);
	free(a);
	free(b);
}

/* A model whose warm restart check still runs (registry_expect) is
 * described as the previous description had it (restore_carried): its
 * generation, names and numbers, counted against the limit like a current
 * generation; once a load takes its place, or its check ends, it is
 * described as the registry has it. */
static void
test_describe_carried(void **state)
{
	struct du *t = *state;
	char *a = du_model(t, "a.safetensors", 1024), name[64];
	struct fdstore_generation g = { .number = 3, .role = FDSTORE_CURRENT, .pin = PIN_NONE,
		.index_size = 4096, .nfiles = 2 };
	struct fdstore_file files[2] = { { .size = 1 }, { .size = 2 } };
	struct fdstore_model prev = { .name = "x", .path = "/srv/x", .last_generation = 3,
		.ngenerations = 1, .generations = &g };
	struct restore_carried c = { .model = &prev };
	struct fdstore_desc *d = NULL;
	struct model_entry *x;
	char left[512];

	assert_int_equal(du_load(t, "m", a, PIN_NONE, 0), 0);
	du_current(t, "m")->stored_slot = registry_find(&t->reg, "m")->slot;
	du_current(t, "m")->stored_done = 1;
	assert_true((c.expected = registry_expect(&t->reg, "x", "/srv/x", PIN_NONE, 0)) != 0);
	x = registry_find(&t->reg, "x");
	prev.slot = x->slot;
	assert_true(fdstore_name_index(name, sizeof(name), x->slot, 3) > 0);
	g.index_fdname = strdup(name);
	for (uint32_t k = 0; k < 2; k++) {
		assert_true(fdstore_name_file(name, sizeof(name), x->slot, 3, k) > 0);
		files[k].fdname = strdup(name);
	}
	g.files = files;
	restore_state.carried = &c;
	restore_state.ncarried = 1;

	assert_int_equal(restore_describe(&t->reg, 100, &d, left, sizeof(left)), 0);
	assert_string_equal(left, "");
	assert_int_equal(d->nmodels, 2);
	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_model *dm = &d->models[i];

		assert_int_equal(dm->ngenerations, 1);
		if (strcmp(dm->name, "x") == 0) {
			assert_int_equal(dm->generations[0].number, 3);
			assert_int_equal(dm->generations[0].nfiles, 2);
			assert_string_equal(dm->generations[0].files[1].fdname, files[1].fdname);
			assert_int_equal(dm->last_generation, 3);
		}
	}
	assert_int_equal(fdstore_check(d), 0);
	fdstore_free(d);
	/* Room for 4 descriptors: m's (2) and x's (3) do not both fit. */
	assert_int_equal(restore_describe(&t->reg, 4, &d, left, sizeof(left)), 0);
	assert_non_null(strstr(left, "models left out whole: \""));
	assert_int_equal(d->models[0].ngenerations + d->models[1].ngenerations, 1);
	fdstore_free(d);
	/* A load took x's place: described as the registry has it. */
	x->load_id++;
	assert_int_equal(restore_describe(&t->reg, 100, &d, left, sizeof(left)), 0);
	for (uint32_t i = 0; i < d->nmodels; i++)
		assert_int_equal(d->models[i].ngenerations, strcmp(d->models[i].name, "x") != 0);
	fdstore_free(d);
	/* Its check ended: the same. */
	x->load_id--;
	restore_state.ncarried = 0;
	assert_int_equal(restore_describe(&t->reg, 100, &d, left, sizeof(left)), 0);
	for (uint32_t i = 0; i < d->nmodels; i++)
		assert_int_equal(d->models[i].ngenerations, strcmp(d->models[i].name, "x") != 0);
	fdstore_free(d);
	restore_state.carried = NULL;
	assert_true(registry_expect_end(&t->reg, "x", c.expected));
	free(g.index_fdname);
	for (uint32_t k = 0; k < 2; k++)
		free(files[k].fdname);
	free(a);
}

/* A status page from the store is reused only when it is what a fresh one
 * for the store is: size, seals, owner and mode; each mismatch is refused
 * naming it. */
static int
stored_page(mode_t mode, int seals, off_t size)
{
	int fd = memfd_create("test-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint64_t magic = STATUS_MAGIC;

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	assert_int_equal(pwrite(fd, &magic, sizeof(magic), 0), (ssize_t)sizeof(magic));
	assert_int_equal(fchmod(fd, mode), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

static void
try_stored_page(struct du *t, int fd, const char *want)
{
	struct registry r;

	if (want == NULL) {
		assert_int_equal(registry_init_stored(&r, t->reg.loop, NULL, fd), 0);
		assert_int_equal(r.page.fd, fd);
		registry_close(&r);
		return;
	}
	assert_int_equal(registry_init_stored(&r, t->reg.loop, NULL, fd), -EINVAL);
	if (strstr(error_get(), want) == NULL)
		fail_msg("\"%s\" does not say \"%s\"", error_get(), want);
	assert_int_equal(r.page.fd, -1);
	close(fd);
}

static void
test_stored_status_page(void **state)
{
	struct du *t = *state;

	try_stored_page(t, stored_page(0600, STATUS_PAGE_STORED_SEALS, STATUS_PAGE_BYTES), NULL);
	try_stored_page(t, stored_page(0644, STATUS_PAGE_STORED_SEALS, STATUS_PAGE_BYTES), NULL);
	try_stored_page(t, stored_page(0666, STATUS_PAGE_STORED_SEALS, STATUS_PAGE_BYTES),
		"mode 0666 is group- or world-writable");
	try_stored_page(t, stored_page(0620, STATUS_PAGE_STORED_SEALS, STATUS_PAGE_BYTES),
		"mode 0620");
	try_stored_page(t, stored_page(0600, F_SEAL_SHRINK | F_SEAL_GROW, STATUS_PAGE_BYTES),
		"seals 0x6, not 0x7");
	try_stored_page(t, stored_page(0600, STATUS_PAGE_STORED_SEALS | F_SEAL_WRITE,
				  STATUS_PAGE_BYTES), "seals 0xf, not 0x7");
	try_stored_page(t, stored_page(0600, STATUS_PAGE_STORED_SEALS, STATUS_PAGE_BYTES / 2),
		"not a 65536-byte file");
	if (geteuid() == 0) { /* another owner: only root can make one */
		int fd = memfd_create("test-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		uint64_t magic = STATUS_MAGIC;

		assert_int_equal(ftruncate(fd, STATUS_PAGE_BYTES), 0);
		assert_int_equal(pwrite(fd, &magic, sizeof(magic), 0), (ssize_t)sizeof(magic));
		assert_int_equal(fchmod(fd, 0600), 0);
		assert_int_equal(fchown(fd, 12345, 12345), 0);
		assert_int_equal(fcntl(fd, F_ADD_SEALS, STATUS_PAGE_STORED_SEALS), 0);
		try_stored_page(t, fd, "owned by uid 12345");
	}
}

static void
test_access(void **state)
{
	struct du *t = *state;
	char *path = du_model(t, "m.safetensors", 1024);
	const uid_t uids[] = { 1000 };
	const gid_t gids[] = { 2000 };
	const gid_t groups[] = { 5, 2000 };
	struct registry_attachment a;
	struct model_entry *m;
	char msg[128];
	int logged = 0;
	struct registry_peer p = { .pid = 9, .uid = 3000, .gid = 3000, .self_uid = 4000,
		.denied_logged = &logged };

	assert_int_equal(du_load(t, "m", path, PIN_NONE, 0), 0);
	m = registry_find(&t->reg, "m");
	/* Unrestricted: anyone. */
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, p.uid);
	assert_int_equal(registry_set_access(&t->reg, "m", 1, uids, 1, gids, 1), 0);
	assert_int_equal(registry_set_access(&t->reg, "none", 1, uids, 1, gids, 1), -ENOENT);
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), -EACCES);
	assert_string_equal(msg, "access denied: uid 3000 is not in the model's allow_users or "
				 "allow_groups");
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), -EACCES);
	assert_int_equal(m->denied_count, 2);
	assert_int_equal(logged, 2); /* the first was logged */
	assert_int_equal(m->attach_count, 1);
	/* By uid, by primary group, by supplementary group, root, self. */
	p.uid = 1000;
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, p.uid);
	p.uid = 3000;
	p.gid = 2000;
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, p.uid);
	p.gid = 3000;
	p.groups = groups;
	p.ngroups = 2;
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, p.uid);
	p.ngroups = 0;
	p.uid = 4000;
	assert_int_equal(registry_attach(&t->reg, "m", &p, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, p.uid);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &a, msg, sizeof(msg)), 0);
	registry_release(&t->reg, a.gen, 0);
	free(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_attach_reply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_access, setup, teardown),
		cmocka_unit_test_setup_teardown(test_find_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retired_bound_is_the_limit_at_start, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_retired_bound_unlimited, setup, teardown),
		cmocka_unit_test_setup_teardown(test_find_for_access, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hold_after_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hold_after_deadline, setup, teardown),
		cmocka_unit_test_setup_teardown(test_describe_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_describe_carried, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stored_status_page, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
