/*
 * test_restore.c: unit tests of daemon/restore.c, restore_job.c and
 * restore_layout.c, taking back what a previous process stored. A first
 * registry (the previous process) loads a model (a file, or a directory
 * that holds it), lists a derived artifact of it and stores both
 * in a service manager's store of the test's own (storeutil.h); the
 * manager hands its store over as systemd does, restore_take() takes it,
 * and a second registry restores from it (restore_model, restore_started)
 * on its loop. The artifact's reader, source_open_fd, is wrapped (--wrap)
 * to see which thread runs it; unlinkat, to stop wcached while the staged
 * copy of a generation not restored is removed; gen_check_holes, to be a
 * previous process without the sparse-file check. Another previous process
 * leaves a generation held by workers of two uids, whose HOLDs the next
 * one accepts by uid. Real files in /tmp, real memfds, a real libuv loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemonutil.h"
#include "base/error.h"
#include "base/file.h"
#include "base/path.h"
#include "closer.h"
#include "derive.h"
#include "fdstore.h"
#include "format/source.h"
#include "listen.h"
#include "mountrule.h"
#include "restore.h"
#include "restore_internal.h"
#include "stage.h"
#include "storeutil.h"
#include "testutil.h"

/* The thread of the second registry's loop (the test's), and where the
 * artifact reader ran since the counts were last zeroed. */
static pthread_t loop_thread;
static unsigned reader_on_loop, reader_off_loop;

int __real_source_open_fd(int fd, const char *label, struct model_source *out);
int __wrap_source_open_fd(int fd, const char *label, struct model_source *out);

/* The reader of a one-file model (derived artifacts): counts the calls on
 * the loop's thread and off it, then reads. */
int
__wrap_source_open_fd(int fd, const char *label, struct model_source *out)
{
	if (pthread_equal(pthread_self(), loop_thread))
		__atomic_add_fetch(&reader_on_loop, 1, __ATOMIC_SEQ_CST);
	else
		__atomic_add_fetch(&reader_off_loop, 1, __ATOMIC_SEQ_CST);
	return __real_source_open_fd(fd, label, out);
}

int __real_unlinkat(int dirfd, const char *path, int flags);
int __wrap_unlinkat(int dirfd, const char *path, int flags);

/* When set, the next removal of a file of a staged copy (the marker
 * aside) marks this registry as stopping as it unlinks it: a stop during
 * that unlink. */
static struct registry *stop_at_next_file;

int
__wrap_unlinkat(int dirfd, const char *path, int flags)
{
	struct registry *stop;

	if (flags == 0 && strcmp(path, STAGE_MARKER) != 0 &&
		(stop = __atomic_exchange_n(&stop_at_next_file, NULL, __ATOMIC_SEQ_CST)) != NULL)
		__atomic_store_n(&stop->closing, 1, __ATOMIC_RELAXED);
	return __real_unlinkat(dirfd, path, flags);
}

int __real_statfs(const char *path, struct statfs *buf);
int __wrap_statfs(const char *path, struct statfs *buf);
int __real_fstype_of_dev(const char *mountinfo, dev_t dev, struct fs_info *out);
int __wrap_fstype_of_dev(const char *mountinfo, dev_t dev, struct fs_info *out);

/* When set, statfs and fstype_of_dev fail with EIO: no filesystem type can
 * be had for anything (a FUSE server that fails statfs, and no mount
 * table). */
static int fs_unknowable;

int
__wrap_statfs(const char *path, struct statfs *buf)
{
	if (__atomic_load_n(&fs_unknowable, __ATOMIC_SEQ_CST)) {
		errno = EIO;
		return -1;
	}
	return __real_statfs(path, buf);
}

int
__wrap_fstype_of_dev(const char *mountinfo, dev_t dev, struct fs_info *out)
{
	if (__atomic_load_n(&fs_unknowable, __ATOMIC_SEQ_CST))
		return -EIO;
	return __real_fstype_of_dev(mountinfo, dev, out);
}

int __real_fstype_mounts_find(const struct fs_mounts *t, dev_t dev, struct fs_info *out);
int __wrap_fstype_mounts_find(const struct fs_mounts *t, dev_t dev, struct fs_info *out);

/* When set, the mount table says every device is an NFS server's. */
static int all_remote;

int
__wrap_fstype_mounts_find(const struct fs_mounts *t, dev_t dev, struct fs_info *out)
{
	int err = __real_fstype_mounts_find(t, dev, out);

	if (err == 0 && __atomic_load_n(&all_remote, __ATOMIC_SEQ_CST))
		fstype_classify_name("nfs4", out);
	return err;
}

void __real_closer_unmap_close(struct closer *cl, uid_t owner, void *base, size_t size, int fd);
void __wrap_closer_unmap_close(struct closer *cl, uid_t owner, void *base, size_t size, int fd);

/* The stored descriptors a test watches (watch_stored), and how many of
 * them went to the closer's lanes of the daemon's own since: memfds and
 * others, in CLOSER_LOCAL's lane and in CLOSER_DAEMON's (the remote
 * files'). Each is counted once: its number may be reused once closed. */
static int stored_fds[FDSTORE_MAX_FDS];
static size_t nstored;
static unsigned memfds_local, memfds_daemon, files_local, files_daemon;

void
__wrap_closer_unmap_close(struct closer *cl, uid_t owner, void *base, size_t size, int fd)
{
	int memfd = fd >= 0 && fcntl(fd, F_GET_SEALS) >= 0;

	for (size_t i = 0; fd >= 0 && i < nstored; i++) {
		if (stored_fds[i] != fd)
			continue;
		stored_fds[i] = -1;
		if (owner == CLOSER_LOCAL)
			(*(memfd ? &memfds_local : &files_local))++;
		else if (owner == CLOSER_DAEMON)
			(*(memfd ? &memfds_daemon : &files_daemon))++;
	}
	__real_closer_unmap_close(cl, owner, base, size, fd);
}

/* Watches every stored descriptor f->s still has. */
static void
watch_stored(const struct restore *s)
{
	memfds_local = memfds_daemon = files_local = files_daemon = 0;
	nstored = 0;
	for (size_t i = 0; i < s->n && nstored < FDSTORE_MAX_FDS; i++)
		if (s->fds[i].fd >= 0)
			stored_fds[nstored++] = s->fds[i].fd;
}

int __real_gen_check_holes(const struct model_source *src);
int __wrap_gen_check_holes(const struct model_source *src);

/* When set, the sparse-file check passes every model, as a wcached from
 * before it (6089f8a) did: the previous process of a test loads and
 * stores a sparse model. Its load runs the check on the work queue. */
static int no_hole_check;

int
__wrap_gen_check_holes(const struct model_source *src)
{
	if (__atomic_load_n(&no_hole_check, __ATOMIC_SEQ_CST))
		return 0;
	return __real_gen_check_holes(src);
}

/* Nobody waits for a build here. */
static const struct derive_hooks no_hooks;

struct fixture {
	char *dir;                   /* the model's, for both processes */
	char *path;                  /* its file, or the directory that holds it */
	char *file;                  /* its file */
	char *stage_dir;             /* dir/staged, for a model that stages, else NULL */
	int sparse;                  /* the artifact's memfd has a hole (artifact_memfd) */
	int no_artifact;             /* the previous process lists no derived artifact */
	struct su_manager m;
	struct du t;                 /* the second process's registry */
	struct derive_table derive;  /* and its derived artifacts */
	struct restore *s;           /* what it took back */
	int done;                    /* restore_model's done came */
	enum restore_result result;
};

/* Sets t up as wcached does under a manager with a store
 * (registry_init_stored): status_fd the stored status page, or -1. */
static void
stored_setup(struct du *t, int status_fd)
{
	memset(t, 0, sizeof(*t));
	t->log_fd = t->saved_stderr = -1;
	assert_int_equal(uv_loop_init(&t->loop), 0);
	assert_int_equal(registry_init_stored(&t->reg, &t->loop, NULL, status_fd), 0);
	t->dir = tu_tmpdir();
}

/* A memfd holding the bytes of path, sealed as a published artifact is;
 * sparse: with the page at 8 KiB (in the tensors' data) a hole, as a
 * builder's memfd could be before PUBLISH refused those (37aa5a5). */
static int
artifact_memfd(const char *path, int sparse)
{
	int in = open(path, O_RDONLY | O_CLOEXEC), fd;
	char buf[65536];
	ssize_t n;

	assert_true(in >= 0);
	fd = memfd_create("test-artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		assert_int_equal(write(fd, buf, (size_t)n), n);
	close(in);
	if (sparse)
		assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192,
			4096), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, DERIVE_ARTIFACT_SEALS), 0);
	return fd;
}

/*
 * The previous process: loads f->path as "m", lists a derived artifact
 * "k" of its generation 1 (the model's own bytes) as a restart would, and
 * stores everything in f's manager (restore_sync). Then it is gone, and
 * restore_state is a new process's.
 */
static void
previous_process(struct fixture *f)
{
	struct model_source src = { 0 };
	struct derive_table derive;
	struct generation *g = NULL;
	struct du t;
	const uint8_t *map = NULL;
	char name[FDSTORE_MAX_FDNAME + 1];
	size_t len;
	int ifd = -1;

	stored_setup(&t, -1);
	assert_int_equal(derive_init(&derive, &t.reg, &no_hooks), 0);
	assert_int_equal(du_load(&t, "m", f->path, PIN_METADATA, 0), 0);
	if (!f->no_artifact) {
		assert_int_equal(source_open_fd(artifact_memfd(f->file, f->sparse),
			"m derived k", &src), 0);
		len = src.index_len;
		assert_int_equal(gen_seal_index(src.index, len, &ifd, &map), 0);
		munmap((void *)map, len);
		assert_int_equal(restore_adopt_artifact(&t.reg, registry_find(&t.reg, "m"),
			&(struct derive_stored){ .key = "k", .source = 1,
				.builder_uid = getuid(), .builder_pid = getpid() }, &src, ifd,
			len, &g), 0);
	}
	restore_sync(&t.reg);
	su_manager_read(&f->m);
	assert_int_equal(su_received(&f->m, 0, 1, FDSTORE_NAME_DESC), 1);
	assert_true(fdstore_name_artifact(name, sizeof(name), 1, 1) > 0);
	assert_int_equal(su_received(&f->m, 0, 1, name), f->no_artifact ? 0 : 1);
	derive_close(&derive);
	du_teardown(&t);
	memset(&restore_state, 0, sizeof(restore_state));
}

/* A worker of uid on connection conn. */
static struct registry_peer
worker(uid_t uid, uint64_t conn)
{
	return (struct registry_peer){ .pid = 1, .uid = uid, .gid = uid, .conn_id = conn };
}

/*
 * The previous process, with workers: loads f->path as "m"; uid 1000
 * attaches it twice, uid 1001 once; the file is replaced and generation 2
 * loaded, so that those three hold generation 1; everything goes into f's
 * manager (restore_sync), generation 1 with its holders by uid. Then it
 * stops, its workers still holding 1. count_only: the description then
 * becomes one that records only how many held 1, as a version 5 or older
 * one reads (test_fdstore's test_older_versions reads those so).
 */
static void
previous_process_held(struct fixture *f, int count_only)
{
	struct registry_peer peers[3] = { worker(1000, 1), worker(1000, 2), worker(1001, 3) };
	struct registry_attachment at[3];
	struct fdstore_desc *d;
	struct fdstore_generation *held;
	uint8_t *buf;
	char msg[256], *next;
	size_t len;
	struct du t;
	int fd;

	stored_setup(&t, -1);
	assert_int_equal(du_load(&t, "m", f->path, PIN_METADATA, 0), 0);
	restore_sync(&t.reg); /* generation 1 goes into the store while current */
	for (int i = 0; i < 3; i++)
		assert_int_equal(registry_attach(&t.reg, "m", &peers[i], &at[i], msg, sizeof(msg)),
			0);
	next = du_model(&t, "next.safetensors", 2048);
	assert_int_equal(rename(next, f->file), 0);
	free(next);
	assert_int_equal(du_reload(&t, "m"), 0);
	assert_int_equal(du_current(&t, "m")->number, 2);
	restore_sync(&t.reg);
	su_manager_read(&f->m);
	d = su_last_description(&f->m);
	assert_int_equal(d->models[0].ngenerations, 2);
	held = &d->models[0].generations[d->models[0].generations[0].number == 1 ? 0 : 1];
	assert_int_equal(held->number, 1);
	assert_int_equal(held->role, FDSTORE_HELD);
	assert_int_equal(held->holders, 3);
	assert_int_equal(held->nuids, 2);
	assert_int_equal(held->uids[0].uid, 1000);
	assert_int_equal(held->uids[0].count, 2);
	assert_int_equal(held->uids[1].uid, 1001);
	assert_int_equal(held->uids[1].count, 1);
	if (count_only) {
		/* The same description without the uids, in place of the stored one. */
		free(held->uids);
		held->uids = NULL;
		held->nuids = 0;
		assert_int_equal(fdstore_encode(d, &buf, &len), 0);
		assert_int_equal(fdstore_memfd_make(buf, len, &fd), 0);
		free(buf);
		for (size_t i = f->m.n; i-- > 0;)
			if (f->m.got[i].store && strcmp(f->m.got[i].name, FDSTORE_NAME_DESC) == 0) {
				close(f->m.got[i].fd);
				f->m.got[i].fd = fd;
				break;
			}
	}
	fdstore_free(d);
	du_teardown(&t);
	memset(&restore_state, 0, sizeof(restore_state));
}

/* The previous process's load of a model that stages (stage = yes). */
static void
staged_load_done(int status, const char *message, uint64_t generation, void *arg)
{
	(void)message;
	(void)generation;
	*(int *)arg = status == 0 ? 1 : -1;
}

static bool
staged_loaded(struct du *t, void *arg)
{
	(void)t;
	return *(int *)arg != 0;
}

/*
 * The previous process, staging: loads f->path as "m" staged to
 * f->stage_dir (its copy m.1), stores it in f's manager (restore_sync)
 * and stops, which leaves the copy the store keeps.
 */
static void
previous_process_staged(struct fixture *f)
{
	struct du t;
	int loaded = 0;

	stored_setup(&t, -1);
	assert_int_equal(registry_set_stage_dir(&t.reg, f->stage_dir), 0);
	assert_int_equal(registry_load(&t.reg, "m", f->path, PIN_NONE, 0, staged_load_done,
		&loaded), 0);
	/* The stage key is set once registry_load returns, as config does. */
	assert_int_equal(registry_set_storage(&t.reg, "m", FS_WATCH_INOTIFY, 0, FS_STAGE_YES), 0);
	du_run_until(&t, staged_loaded, &loaded);
	assert_int_equal(loaded, 1);
	restore_sync(&t.reg);
	su_manager_read(&f->m);
	assert_int_equal(su_received(&f->m, 0, 1, FDSTORE_NAME_DESC), 1);
	du_teardown(&t);
	memset(&restore_state, 0, sizeof(restore_state));
}

/* f->dir and the model f->path in it, which outlive both processes. */
static struct fixture *
new_fixture(void)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct du scratch;
	char *moved;

	assert_non_null(f);
	su_hold_low_fds(); /* for the store su_manager_pass() hands over */
	f->dir = tu_tmpdir();
	du_setup(&scratch, false, 0);
	f->path = du_model(&scratch, "a.safetensors", 4096);
	moved = path_join(f->dir, "a.safetensors");
	assert_non_null(moved);
	assert_int_equal(rename(f->path, moved), 0);
	free(f->path);
	f->path = moved;
	f->file = strdup(moved);
	assert_non_null(f->file);
	du_teardown(&scratch);
	su_manager_start(&f->m, f->dir);
	return f;
}

/* The next process: the store (at least stored descriptors) at 3..,
 * taken back, then its registry. */
static int
next_process(struct fixture *f, size_t stored, void **state)
{
	assert_true(su_manager_pass(&f->m) >= stored);
	assert_non_null(f->s = restore_take());
	stored_setup(&f->t, restore_status_fd(f->s));
	restore_status_taken(f->s);
	f->t.reg.fdstore = 0; /* nothing is stored again here */
	restore_slots(f->s, &f->t.reg);
	assert_int_equal(derive_init(&f->derive, &f->t.reg, &no_hooks), 0);
	loop_thread = pthread_self();
	reader_on_loop = reader_off_loop = 0;
	stop_at_next_file = NULL;
	*state = f;
	return 0;
}

static int
setup(void **state)
{
	struct fixture *f = new_fixture();

	previous_process(f);
	return next_process(f, 6, state);
}

/* The previous process stored a sparse artifact (artifact_memfd). */
static int
setup_sparse(void **state)
{
	struct fixture *f = new_fixture();

	f->sparse = 1;
	previous_process(f);
	return next_process(f, 6, state);
}

/*
 * The previous process, a wcached without the sparse-file check, loaded
 * and stored m, whose file is one U8 tensor of 80 MiB, all of it a hole
 * (more than half of the file and more than GEN_HOLES_MAX); it listed no
 * artifact.
 */
static int
setup_sparse_model(void **state)
{
	struct fixture *f = new_fixture();
	char header[128];
	uint64_t len;
	int fd;

	len = (uint64_t)snprintf(header, sizeof(header),
		"{\"t\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[0,%u]}}", 80u << 20,
		80u << 20);
	while (len % 8 != 0)
		header[len++] = ' ';
	fd = open(f->file, O_WRONLY | O_TRUNC | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, &len, sizeof(len)), (ssize_t)sizeof(len)); /* little-endian */
	assert_int_equal(write(fd, header, (size_t)len), (ssize_t)len);
	assert_int_equal(ftruncate(fd, (off_t)(sizeof(len) + len + (80u << 20))), 0);
	close(fd);
	f->no_artifact = 1;
	__atomic_store_n(&no_hole_check, 1, __ATOMIC_SEQ_CST);
	previous_process(f);
	__atomic_store_n(&no_hole_check, 0, __ATOMIC_SEQ_CST);
	return next_process(f, 4, state);
}

/* m is the directory f->dir/model, which holds the file a.safetensors. */
static int
setup_dir(void **state)
{
	struct fixture *f = new_fixture();
	char *dir = path_join(f->dir, "model"), *moved;

	assert_non_null(dir);
	assert_int_equal(mkdir(dir, 0700), 0);
	moved = path_join(dir, "a.safetensors");
	assert_non_null(moved);
	assert_int_equal(rename(f->file, moved), 0);
	free(f->file);
	free(f->path);
	f->file = moved;
	f->path = dir;
	previous_process(f);
	return next_process(f, 6, state);
}

/* The previous process left generation 1 held (previous_process_held,
 * count_only); the next one waits 60 s for their HOLDs. */
static int
held_setup(void **state, int count_only)
{
	struct fixture *f = new_fixture();

	previous_process_held(f, count_only);
	next_process(f, 6, state);
	f->t.reg.restart_hold_ms = 60000;
	return 0;
}

static int
setup_held(void **state)
{
	return held_setup(state, 0);
}

/* The holders' uids not recorded. */
static int
setup_held_count_only(void **state)
{
	return held_setup(state, 1);
}

/* The previous process staged m; the next one has stage_dir too. */
static int
setup_staged(void **state)
{
	struct fixture *f = new_fixture();

	f->stage_dir = path_join(f->dir, "staged");
	assert_non_null(f->stage_dir);
	previous_process_staged(f);
	next_process(f, 3, state); /* the description, the copy's file, its index */
	return registry_set_stage_dir(&f->t.reg, f->stage_dir);
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	derive_close(&f->derive);
	du_teardown(&f->t);
	listen_fds_unset();
	memset(&restore_state, 0, sizeof(restore_state));
	stop_at_next_file = NULL;
	tu_rmtree(f->dir);
	free(f->stage_dir);
	free(f->path);
	free(f->file);
	free(f);
	return 0;
}

/* restore_model()'s done. */
static void
restored(const char *name, enum restore_result result, void *arg)
{
	struct fixture *f = arg;

	assert_string_equal(name, "m");
	f->result = result;
	f->done = 1;
}

static bool
is_done(struct du *t, void *arg)
{
	(void)t;
	return ((struct fixture *)arg)->done;
}

/* derive_stored_each: counts the artifacts of key "k" of generation 1. */
static void
count_k(const struct derive_stored *a, void *arg)
{
	*(unsigned *)arg += strcmp(a->key, "k") == 0 && a->source == 1;
}

/* Restores m (restore_model) and runs the loop until its check ends;
 * returns the log meanwhile (free it). */
static char *
restore_checked(struct fixture *f)
{
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_METADATA, 0, restored,
		f), 1);
	/* As main.c's batch_set_access does once it returns: an artifact of
	 * a model whose derive is off is not taken back (restore_rules.c). */
	assert_int_equal(registry_set_derive(&f->t.reg, "m", 1, NULL, 0, 60), 0);
	restore_started(f->s, &f->t.reg); /* s is restore.c's from now */
	du_run_until(&f->t, is_done, f);
	return du_log_stop(&f->t);
}

/* Restores m (restore_checked) and sees it served; returns the log
 * meanwhile (free it) and the number of its artifacts "k" listed. */
static char *
restore_served(struct fixture *f, unsigned *artifacts)
{
	char *log = restore_checked(f);

	assert_int_equal(f->result, RESTORE_SERVED);
	assert_non_null(strstr(log, "model \"m\": generation 1 restored from the file descriptor "
		"store"));
	*artifacts = 0;
	derive_stored_each(&f->derive, registry_find(&f->t.reg, "m"), count_k, artifacts);
	return log;
}

/*
 * A restored model's derived artifact is checked with the model, on the
 * work queue: its reader (O(its tensors)) and the byte-for-byte compare
 * with its stored index never run on the loop, which only lists what
 * passed. Before, adopt_artifact ran both on the loop after serving.
 */
static void
test_artifact_checked_off_the_loop(void **state)
{
	struct fixture *f = *state;
	unsigned artifacts;
	char *log = restore_served(f, &artifacts);

	assert_non_null(strstr(log, "model \"m\": derived \"k\" of generation 1 taken back from "
		"the store"));
	assert_null(strstr(log, "not restored"));
	assert_int_equal(artifacts, 1);
	assert_int_equal(reader_on_loop, 0);
	assert_int_equal(reader_off_loop, 1);
	free(log);
}

/*
 * A stored artifact whose memfd has a hole is not taken back, as PUBLISH
 * refuses one (derive_memfd_whole): the model is served, the artifact
 * dropped with one line, and the next DERIVE builds it. Before, the
 * restore's check looked at its type, seals and size only, and took it.
 */
static void
test_a_sparse_artifact_is_not_taken_back(void **state)
{
	struct fixture *f = *state;
	unsigned artifacts;
	char *log = restore_served(f, &artifacts);

	assert_non_null(strstr(log, "model \"m\": derived \"k\" of generation 1 not restored: "
		"the memfd is sparse: only "));
	assert_null(strstr(log, "taken back from the store"));
	assert_int_equal(artifacts, 0);
	free(log);
}

/* Whether wcached is stopping: here only stop_at_next_file stops it, in
 * a removal on a pool thread, whose end wakes the loop. */
static bool
stopping(struct du *t, void *arg)
{
	(void)arg;
	return __atomic_load_n(&t->reg.closing, __ATOMIC_SEQ_CST) != 0;
}

/*
 * m's staged generation 1 is not restored (its source changed while no
 * wcached ran), so the check's end removes its staged copy, m.1 (four
 * files and the marker here); wcached stops while the first file is
 * unlinked. The removal removes no other file, as the removal of a closed
 * generation's copy does: the copy keeps its marker and the three files it
 * had not reached, it says so, and the next start's sweep removes the
 * rest (nothing keeps it: the check's end had the manager drop its
 * descriptors). Before, the stop waited for every unlink of the copy.
 */
static void
test_a_stop_ends_the_removal_of_a_copy_not_restored(void **state)
{
	struct fixture *f = *state;
	struct timespec later[2] = { { .tv_nsec = UTIME_OMIT }, { .tv_sec = 1000000 } };
	char *copy = path_join(f->stage_dir, "m.1"), *marker = path_join(copy, STAGE_MARKER), *log;
	unsigned removed = 0;
	struct stat st;

	assert_non_null(marker);
	free(tu_write(copy, "extra-1.safetensors", "abc", 3));
	free(tu_write(copy, "extra-2.safetensors", "abc", 3));
	free(tu_write(copy, "extra-3.safetensors", "abc", 3));
	assert_int_equal(tu_count_entries(copy), 5);
	assert_int_equal(utimensat(AT_FDCWD, f->path, later, 0), 0);
	du_log_start(&f->t);
	stop_at_next_file = &f->t.reg;
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_NONE, 0, restored,
		f), 1);
	restore_started(f->s, &f->t.reg); /* s is restore.c's from now */
	du_run_until(&f->t, is_done, f);
	assert_int_equal(f->result, RESTORE_JUDGED);
	du_run_until(&f->t, stopping, NULL);
	/* libuv's loop ends only once its work queue has, the removal
	 * included. */
	registry_close(&f->t.reg);
	while (uv_run(&f->t.loop, UV_RUN_DEFAULT) != 0)
		;
	log = du_log_stop(&f->t);
	assert_non_null(strstr(log, "model \"m\": generation 1 not restored: removing its "
		"staged copy"));
	/* The marker and the three files the removal had not reached. */
	assert_int_equal(stat(marker, &st), 0);
	assert_int_equal(tu_count_entries(copy), 4);
	assert_non_null(strstr(log, "m.1: its removal stopped as wcached stops: the next start "
		"removes what is left"));
	free(log);
	assert_int_equal(stage_sweep(f->stage_dir, NULL, 0, NULL, &removed), 0);
	assert_int_equal(removed, 1);
	assert_int_equal(tu_count_entries(copy), -1);
	free(marker);
	free(copy);
}

/*
 * Restores m, with the stage key stage set as the configuration does (once
 * restore_model returns), and waits for the check's end: its log.
 */
static char *
restore_with_stage(struct fixture *f, enum fs_stage stage)
{
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_NONE, 0, restored,
		f), 1);
	assert_int_equal(registry_set_storage(&f->t.reg, "m", FS_WATCH_INOTIFY, 0, stage), 0);
	restore_started(f->s, &f->t.reg); /* s is restore.c's from now */
	du_run_until(&f->t, is_done, f);
	return du_log_stop(&f->t);
}

/*
 * A generation stored unstaged, with stage = yes now (the operator turned
 * staging on and restarted, as under systemd): not restored, but loaded
 * afresh, which stages it. Before, it was restored and served the
 * source's files on (status "stage": "yes", "staged": false), and neither
 * a SIGHUP nor `wcachectl reload` changed that.
 */
static void
test_stage_yes_now_loads_an_unstaged_generation_afresh(void **state)
{
	struct fixture *f = *state;
	char *log;

	log = restore_with_stage(f, FS_STAGE_YES);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_non_null(strstr(log, "model \"m\": not restored: generation 1 is not a staged "
		"copy, and stage = yes now; loading"));
	free(log);
}

/*
 * The stored descriptors of a generation not restored close in the lanes
 * closer.h gives the daemon's own: its index and its artifact's memfds,
 * and its file on a local filesystem, in CLOSER_LOCAL's, which no remote
 * server's close holds up; only a file on a remote filesystem in
 * CLOSER_DAEMON's. Before (be79e16), all of them went to CLOSER_DAEMON's,
 * behind every remote generation's files (review rev197 F4').
 */
/* Restores m with stage = yes now: not restored, nothing taken; the
 * stored files on a remote filesystem or not. Its index, its artifact and
 * the artifact's index close in CLOSER_LOCAL's lane whatever the model
 * file's filesystem (the test sees in which lane that one closes). */
static void
restore_untaken(struct fixture *f, int remote)
{
	watch_stored(f->s);
	__atomic_store_n(&all_remote, remote, __ATOMIC_SEQ_CST);
	free(restore_with_stage(f, FS_STAGE_YES));
	__atomic_store_n(&all_remote, 0, __ATOMIC_SEQ_CST);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_int_equal(memfds_local, 3);
	assert_int_equal(memfds_daemon, 0);
}

static void
test_descriptors_not_taken_close_in_their_own_lanes(void **state)
{
	struct fixture *f = *state;

	restore_untaken(f, 0);
	assert_int_equal(files_local, 1);
	assert_int_equal(files_daemon, 0);
}

static void
test_a_remote_file_not_taken_closes_in_the_remote_lane(void **state)
{
	struct fixture *f = *state;

	restore_untaken(f, 1);
	assert_int_equal(files_daemon, 1);
	assert_int_equal(files_local, 0);
}

/* The reverse: a staged copy, with stage = no now, is not restored (its
 * copy is removed) and the model loads afresh from its source. */
static void
test_stage_no_now_loads_a_staged_generation_afresh(void **state)
{
	struct fixture *f = *state;
	char *log;

	log = restore_with_stage(f, FS_STAGE_NO);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_non_null(strstr(log, "model \"m\": not restored: generation 1 is a staged copy, "
		"and stage = no now; loading"));
	assert_non_null(strstr(log, "model \"m\": generation 1 not restored: removing its "
		"staged copy"));
	free(log);
}

/* stage = auto on a local filesystem stages nothing: a staged copy from
 * there loads afresh too; stage = yes keeps it. */
static void
test_stage_auto_on_a_local_filesystem_loads_a_staged_generation_afresh(void **state)
{
	struct fixture *f = *state;
	char *log;

	log = restore_with_stage(f, FS_STAGE_AUTO);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_non_null(strstr(log, "model \"m\": not restored: generation 1 is a staged copy, "
		"and stage = auto does not stage from "));
	assert_non_null(strstr(log, ", a local filesystem; loading"));
	free(log);
}

/*
 * stage = auto, and the origin's filesystem cannot be told at the restart
 * (statfs fails, the mount table does not say): the copy is kept as the
 * previous process staged it, its origin taken as remote. Before, the
 * copy's own (local) filesystem decided, and the copy was thrown away.
 */
static void
test_stage_auto_keeps_a_copy_whose_source_filesystem_is_unknown(void **state)
{
	struct fixture *f = *state;
	char *log;

	__atomic_store_n(&fs_unknowable, 1, __ATOMIC_SEQ_CST);
	log = restore_with_stage(f, FS_STAGE_AUTO);
	__atomic_store_n(&fs_unknowable, 0, __ATOMIC_SEQ_CST);
	assert_int_equal(f->result, RESTORE_SERVED);
	assert_non_null(strstr(log, "model \"m\": generation 1 keeps its staged copy "));
	assert_non_null(strstr(log, " (its source's filesystem could not be told: taken as "
		"remote)"));
	assert_non_null(du_current(&f->t, "m")->staged.dir);
	assert_true(du_current(&f->t, "m")->fs.remote);
	free(log);
}

static void
test_stage_yes_keeps_a_staged_generation(void **state)
{
	struct fixture *f = *state;
	char *log;

	log = restore_with_stage(f, FS_STAGE_YES);
	assert_int_equal(f->result, RESTORE_SERVED);
	assert_non_null(strstr(log, "model \"m\": generation 1 keeps its staged copy"));
	assert_non_null(du_current(&f->t, "m")->staged.dir);
	free(log);
}

/* A directory model as it was stored is restored (the one file its
 * directory holds is the one stored). */
static void
test_directory_model_unchanged_is_restored(void **state)
{
	struct fixture *f = *state;
	char *log = restore_checked(f);

	assert_int_equal(f->result, RESTORE_SERVED);
	assert_null(strstr(log, "not restored"));
	free(log);
}

/*
 * What the model's path named at its load (format version 10, review
 * rev215 H1): the previous process recorded it for its generation (a
 * one-file model's path names its file straight in its tree; a directory
 * model's, of one file too, a directory), and the restored generation
 * keeps it (registry_load.c's keep_tree reads it, where the path may lead
 * elsewhere now); from a store before version 10 it is not told, and the
 * layout decides (untold_named_file). Before, nothing recorded it.
 */
static void
restored_path_named(struct fixture *f, uint8_t stored, int want)
{
	char *log;

	assert_int_equal(f->s->desc->models[0].generations[0].role, FDSTORE_CURRENT);
	assert_int_equal(f->s->desc->models[0].generations[0].named, stored);
	log = restore_checked(f);
	assert_int_equal(f->result, RESTORE_SERVED);
	assert_int_equal(du_current(&f->t, "m")->path_named, want);
	free(log);
}

static void
test_a_one_file_models_generation_named_a_file(void **state)
{
	restored_path_named(*state, FDSTORE_NAMED_FILE, GEN_NAMED_FILE);
}

static void
test_a_directory_models_generation_of_one_file_named_a_directory(void **state)
{
	restored_path_named(*state, FDSTORE_NAMED_DIR, GEN_NAMED_DIR);
}

static void
test_a_version_9_generation_tells_not_what_its_path_named(void **state)
{
	struct fixture *f = *state;

	f->s->desc->models[0].generations[0].named = FDSTORE_NAMED_UNRECORDED;
	restored_path_named(f, FDSTORE_NAMED_UNRECORDED, GEN_NAMED_UNTOLD);
}

/*
 * The directory of a model stored as its one file gained a shard index
 * while no wcached ran: a load would open the files the index lists, so
 * the log says which file differs, and they are loaded as a reload
 * wcached makes by itself (its tree rules apply) while generation 1, its
 * files intact, serves. Before rev177's layout check, restore_check.c
 * stat'ed a.safetensors, unchanged, and restored it for good; then it
 * loaded afresh as the operator's load, whoever made the index (review
 * rev195 M1).
 */
static void
test_directory_that_gained_a_shard_index_serves_and_reloads(void **state)
{
	static const char index[] = "{\"weight_map\": {\"x\": \"b.safetensors\"}}";
	struct fixture *f = *state;
	char *log, want[512];

	free(tu_write(f->path, "model.safetensors.index.json", index, sizeof(index) - 1));
	log = restore_checked(f);
	assert_int_equal(f->result, RESTORE_SERVED);
	snprintf(want, sizeof(want), "model \"m\": generation 1 serves, but its path leads to "
		"other files now (its directory %s holds the shard index "
		"model.safetensors.index.json, which now lists other files (file 1 of 1 is "
		"b.safetensors; a.safetensors was stored)): they are loaded as a reload wcached "
		"makes by itself", f->path);
	assert_non_null(strstr(log, want));
	free(log);
}

/* ... or a second .safetensors, and no index: no model a load could open
 * (shards_find_model says why); the same. */
static void
test_directory_that_gained_a_second_file_serves_and_reloads(void **state)
{
	struct fixture *f = *state;
	char *log, want[512];

	free(tu_write(f->path, "b.safetensors", "abc", 3));
	log = restore_checked(f);
	assert_int_equal(f->result, RESTORE_SERVED);
	snprintf(want, sizeof(want), "model \"m\": generation 1 serves, but its path leads to "
		"other files now (its directory changed since it was stored: %s: 2 *.safetensors "
		"files (a.safetensors, b.safetensors)", f->path);
	assert_non_null(strstr(log, want));
	free(log);
}

/*
 * rev177 I: a generation that a wcached without the sparse-file check
 * (before 6089f8a) loaded and stored came back from the store, and served
 * on, its holes warmed (and warmed again by the residency check) as
 * zeros. A warm restart checks it as a load does: not restored, one line
 * naming the file, and the model loads from its path (which refuses it in
 * turn). Before, it was restored. That load is wcached's own reload,
 * judged against the tree the description recorded (review rev204 H2).
 */
static void
test_a_sparse_model_is_not_restored(void **state)
{
	struct fixture *f = *state;
	char *log = restore_checked(f);

	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_non_null(strstr(log, "model \"m\": not restored: "));
	assert_non_null(strstr(log, "a.safetensors: a sparse file: 83886160 bytes long, at "
		"least "));
	assert_null(strstr(log, "restored from the file descriptor store"));
	assert_non_null(strstr(log, "; loading it as a reload wcached makes by itself, judged "
		"against the tree "));
	free(log);
}

/* Restores m (restore_checked), with generation 1 held: returns it. */
static struct generation *
restore_held(struct fixture *f)
{
	struct generation *g;

	free(restore_checked(f));
	assert_int_equal(f->result, RESTORE_SERVED);
	assert_int_equal(du_current(&f->t, "m")->number, 2);
	g = registry_generation(&f->t.reg, registry_find(&f->t.reg, "m"), 1);
	assert_non_null(g);
	assert_int_equal(restore_holders(g), 3);
	return g;
}

/*
 * Generation 1 was held by uid 1000 twice and uid 1001 once (review rev173
 * F10): after the restart uid 1002 may not take a place (EPERM), uid
 * 1000 takes its two and no third (EUSERS), and uid 1001 still has its
 * own. Before, the places were a count: 1002's HOLD was accepted, and
 * 1001's would have been refused once the three were taken.
 */
static void
test_holds_are_taken_by_the_uids_that_held(void **state)
{
	struct fixture *f = *state;
	struct registry_peer p1002 = worker(1002, 11), p1000a = worker(1000, 12),
		p1000b = worker(1000, 13), p1000c = worker(1000, 14), p1001 = worker(1001, 15);
	struct generation *g = restore_held(f), *h[3];
	struct fdstore_generation *held;
	struct fdstore_desc *d = NULL;
	char msg[256], left[256];

	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1002, &h[0], msg, sizeof(msg)),
		-EPERM);
	assert_string_equal(msg, "model \"m\": generation 1: uid 1002 did not hold it before the "
		"restart");
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1000a, &h[0], msg, sizeof(msg)), 0);
	assert_ptr_equal(h[0], g);
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1000b, &h[1], msg, sizeof(msg)), 0);
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1000c, &h[2], msg, sizeof(msg)),
		-EUSERS);
	assert_string_equal(msg, "model \"m\": generation 1: all 2 of its holders before the "
		"restart have said so (those of uid 1000)");
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1001, &h[2], msg, sizeof(msg)), 0);
	assert_int_equal(g->attached, 3);
	assert_int_equal(restore_holders(g), 3);
	/* What this process would store: the same holders by uid. */
	registry_release(&f->t.reg, h[1], 1000);
	assert_int_equal(restore_describe(&f->t.reg, FDSTORE_MAX_FDS, &d, left, sizeof(left)), 0);
	assert_string_equal(left, "");
	held = &d->models[0].generations[d->models[0].generations[0].number == 1 ? 0 : 1];
	assert_int_equal(held->holders, 2);
	assert_int_equal(held->nuids, 2);
	assert_true(held->uids[0].uid == 1000 && held->uids[0].count == 1);
	assert_true(held->uids[1].uid == 1001 && held->uids[1].count == 1);
	fdstore_free(d);
	registry_release(&f->t.reg, h[0], 1000);
	registry_release(&f->t.reg, h[2], 1001);
}

/* A description that records only how many held generation 1 (version 5
 * or older): any uid may take those places, as before, up to their count. */
static void
test_holds_of_a_count_only_description(void **state)
{
	struct fixture *f = *state;
	struct registry_peer p1002 = worker(1002, 11), p1000 = worker(1000, 12),
		p1003 = worker(1003, 13), p1001 = worker(1001, 14);
	struct generation *g = restore_held(f), *h[3], *x;
	char msg[256];

	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1002, &h[0], msg, sizeof(msg)), 0);
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1000, &h[1], msg, sizeof(msg)), 0);
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1003, &h[2], msg, sizeof(msg)), 0);
	assert_int_equal(restore_hold(&f->t.reg, "m", 1, &p1001, &x, msg, sizeof(msg)), -EUSERS);
	assert_string_equal(msg, "model \"m\": generation 1: all 3 of its holders before the "
		"restart have said so");
	assert_int_equal(g->attached, 3);
	registry_release(&f->t.reg, h[0], 1002);
	registry_release(&f->t.reg, h[1], 1000);
	registry_release(&f->t.reg, h[2], 1003);
}

/* m's description as a version 8 store's: no tree recorded. */
static void
no_tree(struct fixture *f)
{
	struct fdstore_model *m = &f->s->desc->models[0];

	free(m->tree.root);
	free(m->tree.place);
	m->tree = (struct fdstore_tree){ .root = NULL };
}

/*
 * m's description as a version 8 store's (no tree recorded), and m's
 * stored file written (it grows by a byte: its check fails) and removed:
 * the file called name in its directory, made of the bytes of m's file
 * (copy) or of three bytes, renamed over it.
 */
static void
written_and_replaced(struct fixture *f, const char *name, int copy)
{
	char *dir = path_dir(f->file), *other, buf[65536];
	int in, out, fd;
	ssize_t n;

	assert_non_null(dir);
	other = tu_write(dir, name, "abc", 3);
	if (copy) {
		in = open(f->file, O_RDONLY | O_CLOEXEC);
		out = open(other, O_WRONLY | O_TRUNC | O_CLOEXEC);
		assert_true(in >= 0 && out >= 0);
		while ((n = read(in, buf, sizeof(buf))) > 0)
			assert_int_equal(write(out, buf, (size_t)n), n);
		close(in);
		close(out);
	}
	no_tree(f);
	fd = open(f->file, O_WRONLY | O_APPEND | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "x", 1), 1);
	close(fd);
	assert_int_equal(rename(other, f->file), 0);
	free(other);
	free(dir);
}

/* m's description as one with no current generation (its generation
 * described as held only) and, with tree 0, no tree either (a store from
 * a wcached before format version 9). */
static void
no_current(struct fixture *f, int tree)
{
	struct fdstore_model *m = &f->s->desc->models[0];

	for (uint32_t k = 0; k < m->ngenerations; k++)
		m->generations[k].role = FDSTORE_HELD;
	if (!tree)
		no_tree(f);
}

/* restore_model's line for a model described with no current generation
 * (review rev209 M1: it names the store's room and the remedy). */
#define NO_CURRENT_STORED "model \"m\": not restored: no current generation was stored " \
	"(none served it, or the file descriptor store had no room for its descriptors: " \
	"raise FileDescriptorStoreMax= in the unit)"

/*
 * Review rev204 H3: a model described with no current generation (its
 * load had failed, its generation was gone from its server) is no cold
 * start. With the tree its description records, it is listed and judged
 * against it (RESTORE_MODEL_JUDGED: main.c loads it with
 * registry_reload_watched), the tree kept as its operator_tree with its
 * root's inode. Before, it loaded as the operator's load.
 */
static void
test_no_current_generation_is_judged_against_its_tree(void **state)
{
	struct fixture *f = *state;
	const struct model_entry *e;
	char *log, *dir = path_dir(f->path);
	struct stat st;

	assert_non_null(dir);
	assert_int_equal(stat(dir, &st), 0);
	no_current(f, 1);
	assert_string_equal(f->s->desc->models[0].tree.root, dir);
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_METADATA, 0, restored,
		f), RESTORE_MODEL_JUDGED);
	log = du_log_stop(&f->t);
	assert_non_null(strstr(log, NO_CURRENT_STORED "; loading it as a reload wcached makes by "
		"itself, judged against the tree "));
	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_null(e->current);
	assert_string_equal(e->operator_tree.root, dir);
	assert_int_equal(e->operator_tree.uid, st.st_uid);
	assert_true(e->operator_tree.root_known);
	assert_int_equal(e->operator_tree.root_ino, st.st_ino);
	/* Nothing recorded the files it served (the previous process stored
	 * its generation): their owners are untold. */
	assert_int_equal(e->operator_tree.kept.nfiles, 0);
	assert_int_equal(e->operator_tree.owners_untold, OWNERS_UNTOLD_RESTART);
	assert_int_equal(f->done, 0);
	restore_started(f->s, &f->t.reg);
	free(log);
	free(dir);
}

/*
 * Review rev209 M1: a model described with no current generation whose
 * tree records the files it served (format version 10: the store had no
 * room for their descriptors) is judged against them too: its
 * operator_tree keeps their owners and inodes, and what its path named, as
 * a stored generation's descriptors tell them (restore_tell_files), so its
 * owners are told. Before, nothing recorded them: owners untold, and its
 * reload waited wherever others may write beside its files.
 */
static void
test_no_current_generation_keeps_the_files_its_tree_recorded(void **state)
{
	struct fixture *f = *state;
	struct fdstore_tree *t = &f->s->desc->models[0].tree;
	const struct model_entry *e;
	char *log;
	struct stat st;

	assert_int_equal(stat(f->file, &st), 0);
	no_current(f, 1);
	assert_non_null(t->root);
	assert_int_equal(t->nkept, 0); /* the previous process stored the generation */
	assert_non_null(t->kept = calloc(1, sizeof(*t->kept)));
	t->kept[0] = (struct fdstore_kept){ .uid = (uint32_t)st.st_uid,
		.dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino };
	t->nkept = 1;
	t->named = FDSTORE_NAMED_DIR;
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_METADATA, 0, restored,
		f), RESTORE_MODEL_JUDGED);
	log = du_log_stop(&f->t);
	assert_non_null(strstr(log, "(the tree it was last loaded from, or that the operator's "
		"last load of it found) and the owners of the files it served"));
	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_int_equal(e->operator_tree.owners_untold, 0);
	assert_int_equal(e->operator_tree.kept.nfiles, 1);
	assert_int_equal(e->operator_tree.kept.owners[0], st.st_uid);
	assert_int_equal(e->operator_tree.kept.ids[0].dev, st.st_dev);
	assert_int_equal(e->operator_tree.kept.ids[0].ino, st.st_ino);
	assert_true(e->operator_tree.kept.named_told);
	assert_false(e->operator_tree.kept.named_file);
	restore_started(f->s, &f->t.reg);
	free(log);
}

/* Whether m's loads in flight all ended. */
static bool
no_load(struct du *t, void *arg)
{
	const struct model_entry *e = registry_find(&t->reg, "m");

	(void)arg;
	return e == NULL || e->loading == 0;
}

/*
 * m's file recorded as the tree's kept file (its owner, device and inode,
 * and as its ctime its own less ctime_less ns), in a directory anyone may
 * rename entries in (0777, not sticky: files_kept), no generation
 * described; the restart's judged reload, run to its end. Its log.
 */
static char *
kept_reload(struct fixture *f, int64_t ctime_less)
{
	struct fdstore_model *m = &f->s->desc->models[0];
	struct fdstore_tree *t = &m->tree;
	char *log, *dir = path_dir(f->file);
	struct stat st;

	assert_non_null(dir);
	assert_int_equal(chmod(dir, 0777), 0);
	assert_int_equal(stat(f->file, &st), 0);
	no_current(f, 1);
	assert_int_equal(t->nkept, 0);
	assert_non_null(t->kept = calloc(1, sizeof(*t->kept)));
	t->kept[0] = (struct fdstore_kept){ .uid = (uint32_t)st.st_uid,
		.dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino,
		.ctime_ns = file_time_ns(&st.st_ctim) - ctime_less };
	t->nkept = 1;
	t->named = FDSTORE_NAMED_FILE;
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_METADATA, 0, restored,
		f), RESTORE_MODEL_JUDGED);
	restore_started(f->s, &f->t.reg);
	assert_int_equal(registry_reload_watched(&f->t.reg, "m", NULL, NULL), 0);
	du_run_until(&f->t, no_load, NULL);
	log = du_log_stop(&f->t);
	assert_int_equal(chmod(dir, 0700), 0);
	free(dir);
	return log;
}

/*
 * Review rev217 L1: the kept files of a model left out of the store are
 * held by nothing while wcached is down, and ext4 gives a freed inode
 * number to the next file made. A file at the kept file's device and inode
 * whose ctime is not the recorded one (a file made since: a ctime only
 * moves forward) is not the file it served: where others may rename
 * entries in beside it, its reload waits for the operator's. Before, the
 * device and inode were all that was compared, and the file was loaded as
 * generation 2.
 */
static void
test_a_kept_inode_with_another_ctime_is_not_taken(void **state)
{
	struct fixture *f = *state;
	const struct model_entry *e;
	char *log = kept_reload(f, 1000000000);

	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_null(e->current);
	assert_null(strstr(log, "model \"m\": generation 2 from"));
	assert_non_null(strstr(log, "is not one of the files serving (another inode, or its inode "
		"with another ctime"));
	free(log);
}

/* Its control: the same kept file with its own ctime loads again. */
static void
test_a_kept_inode_with_its_ctime_is_taken(void **state)
{
	struct fixture *f = *state;
	const struct model_entry *e;
	char *log = kept_reload(f, 0);

	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_non_null(e->current);
	assert_non_null(strstr(log, "model \"m\": generation 2 from"));
	free(log);
}

/*
 * The same from a store that records no tree (written by a wcached before
 * format version 9): nothing tells what its path names now is the tree it
 * was loaded from, so it waits, once, for the operator's reload
 * (RESTORE_MODEL_WAITS), in a place only its owner may rename entries in
 * too. Before, it loaded there as the operator's load (review rev206 M1).
 */
static void
test_no_current_generation_and_no_tree_waits(void **state)
{
	struct fixture *f = *state;
	char *log;

	no_current(f, 0);
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_METADATA, 0, restored,
		f), RESTORE_MODEL_WAITS);
	log = du_log_stop(&f->t);
	assert_non_null(strstr(log, NO_CURRENT_STORED "; the file descriptor store records no "
		"tree to judge it against"));
	assert_non_null(strstr(log, "served only after the operator's `wcachectl reload m`"));
	assert_null(strstr(log, "; loading"));
	assert_true(registry_find(&f->t.reg, "m")->refused_tree);
	assert_int_equal(f->done, 0);
	restore_started(f->s, &f->t.reg); /* s is restore.c's from now */
	free(log);
}

/*
 * Review rev206 H1: a model not restored (stage = yes now) is loaded as a
 * reload wcached makes by itself, which keeps, besides the recorded tree,
 * what the stored descriptor tells of the file it served: its owner and
 * identity, and that it lay straight in the tree (a one-file model), as a
 * watched reload keeps them from the generation serving. Before, the
 * tree's root and owner alone.
 */
static void
test_a_model_not_restored_keeps_the_owner_of_its_file(void **state)
{
	struct fixture *f = *state;
	const struct model_entry *e;
	struct stat st;
	char *log, *dir = path_dir(f->file);

	assert_non_null(dir);

	assert_int_equal(stat(f->file, &st), 0);
	log = restore_with_stage(f, FS_STAGE_YES);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_non_null(strstr(log, ") the store recorded for it (the tree it was last loaded "
		"from, or that the operator's last load of it found) and the owners of the files "
		"it served"));
	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_string_equal(e->operator_tree.root, dir);
	assert_int_equal(e->operator_tree.kept.nfiles, 1);
	assert_int_equal(e->operator_tree.kept.owners[0], st.st_uid);
	assert_int_equal(e->operator_tree.kept.ids[0].dev, st.st_dev);
	assert_int_equal(e->operator_tree.kept.ids[0].ino, st.st_ino);
	assert_true(e->operator_tree.kept.named_file);
	assert_false(e->operator_tree.owners_untold);
	free(log);
	free(dir);
}

/* A staged copy's owner is wcached's, not its origin's (which the store
 * does not record): not told, and the reload waits wherever others may
 * write beside its files (owners_untold). */
static void
test_a_staged_copy_not_restored_tells_no_owner(void **state)
{
	struct fixture *f = *state;
	const struct model_entry *e;
	char *log;

	log = restore_with_stage(f, FS_STAGE_NO);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_null(strstr(log, "and the owners of the files it served"));
	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_int_equal(e->operator_tree.kept.nfiles, 0);
	assert_true(e->operator_tree.owners_untold);
	free(log);
}

/* Whether the model m has a generation from a load (not the stored one). */
static bool
loaded_anew(struct du *t, void *arg)
{
	const struct model_entry *e = registry_find(&t->reg, "m");

	(void)arg;
	return e != NULL && e->current != NULL && e->current->number >= 2;
}

/*
 * Review rev206 M1: a store written before format version 9 records no
 * tree; the upgrade's restart of a model whose check failed (its file's
 * ctime moved: chmod) takes the tree its stored file is found in now, by
 * its descriptor, and loads it as a reload wcached makes by itself judged
 * against that tree. Before, it loaded as the operator's load.
 */
static void
test_a_version_8_model_not_restored_is_judged_by_its_stored_file(void **state)
{
	struct fixture *f = *state;
	const struct model_entry *e;
	char *log, *dir = path_dir(f->file);

	assert_non_null(dir);
	no_tree(f);
	assert_int_equal(chmod(f->file, 0640), 0);
	log = restore_checked(f);
	assert_int_equal(f->result, RESTORE_JUDGED);
	assert_non_null(strstr(log, "written in place since it was stored"));
	assert_non_null(strstr(log, ") its stored files are found in (the store, written by a "
		"wcached before format version 9, records none)"));
	assert_non_null(e = registry_find(&f->t.reg, "m"));
	assert_string_equal(e->operator_tree.root, dir);
	assert_true(e->operator_tree.root_known);
	assert_int_equal(e->operator_tree.kept.nfiles, 1);
	free(log);
	free(dir);
}

/*
 * Review rev210 H1: the same upgrade, the stored file renamed into another
 * directory (as a neighbour who may rename entries in its directory may
 * put it in his own, under his FUSE mount): a file no longer at the
 * model's path tells no tree (before, the tree was looked up by name where
 * /proc/self/fd said the file is now, and taken): it waits for the
 * operator's reload, saying why.
 */
static void
test_a_version_8_model_whose_file_was_moved_away_waits(void **state)
{
	struct fixture *f = *state;
	char *log, *dir = path_dir(f->file), *aside, *moved;

	assert_non_null(dir);
	assert_non_null(aside = path_join(dir, "aside"));
	assert_non_null(moved = path_join(aside, "moved.safetensors"));
	no_tree(f);
	assert_int_equal(mkdir(aside, 0755), 0);
	assert_int_equal(rename(f->file, moved), 0);
	log = restore_checked(f);
	assert_int_equal(f->result, RESTORE_WAITS);
	assert_non_null(strstr(log, "stored files tell none: its stored file is no longer at "));
	assert_null(strstr(log, "; loading"));
	assert_int_equal(rename(moved, f->file), 0);
	assert_int_equal(rmdir(aside), 0);
	free(log);
	free(moved);
	free(aside);
	free(dir);
}

/*
 * The operator's `wcachectl reload m` while the restart's check of m runs
 * (answered: a load is already in progress; reload_again) is her word on
 * what its path names: once the check fails and m waits (a version 8
 * model whose stored file was written and removed: nothing tells its
 * tree), her reload runs (registry_wait_for_operator) and loads the file
 * at its path as generation 2 (review rev206 L4: the place job that
 * covered this branch is gone).
 */
static void
test_the_operators_reload_during_the_check_runs_once_it_waits(void **state)
{
	struct fixture *f = *state;
	char *log;

	written_and_replaced(f, "other.tmp", 1);
	du_log_start(&f->t);
	assert_int_equal(restore_model(f->s, &f->t.reg, "m", f->path, PIN_METADATA, 0, restored,
		f), 1);
	assert_int_equal(registry_reload(&f->t.reg, "m", NULL, NULL), 0);
	assert_int_equal(registry_find(&f->t.reg, "m")->reload_again, RELOAD_OPERATOR);
	restore_started(f->s, &f->t.reg); /* s is restore.c's from now */
	du_run_until(&f->t, is_done, f);
	assert_int_equal(f->result, RESTORE_WAITS);
	du_run_until(&f->t, loaded_anew, NULL);
	log = du_log_stop(&f->t);
	assert_non_null(strstr(log, "records no tree to judge it against"));
	assert_non_null(strstr(log, "model \"m\": generation 2 from "));
	free(log);
}

/* ... and one whose stored file was written (it grew) and removed
 * (another renamed over it): where it was says nothing of whose it was,
 * so it waits, once, for the operator's reload (RESTORE_WAITS). */
static void
test_a_version_8_model_whose_file_was_replaced_waits(void **state)
{
	struct fixture *f = *state;
	char *log;

	written_and_replaced(f, "other.tmp", 0);
	log = restore_checked(f);
	assert_int_equal(f->result, RESTORE_WAITS);
	assert_non_null(strstr(log, "records no tree to judge it against"));
	assert_null(strstr(log, "; loading"));
	assert_true(registry_find(&f->t.reg, "m")->refused_tree);
	free(log);
}

/*
 * restore_owners_tree (review rev213 H2): a tree a stored file tells is its
 * owner's or root's, reached through no link of anyone else's, to the
 * directory the file is in. A link made by root (or the file's owner) is
 * followed; one lchown'ed to another uid (as root only) refuses, naming
 * its maker; a tree of another owner, or a walk that ends elsewhere,
 * refuses too.
 */
static void
test_a_tree_a_stored_file_tells_is_its_owners(void **state)
{
	char top[] = "/tmp/wc-owners-XXXXXX", dir[64], link[64], why[ERROR_MAX];
	struct stat st;
	uid_t owner = 4321;

	(void)state;
	assert_non_null(mkdtemp(top));
	snprintf(dir, sizeof(dir), "%s/v1", top);
	snprintf(link, sizeof(link), "%s/llama", top);
	assert_int_equal(mkdir(dir, 0755), 0);
	assert_int_equal(symlink("v1", link), 0);
	assert_int_equal(stat(dir, &st), 0);
	if (lchown(link, owner, (gid_t)-1) != 0) /* not root: the link is the test's */
		owner = getuid();
	why[0] = '\0';
	assert_int_equal(restore_owners_tree(link, owner, dir, owner, st.st_dev, st.st_ino, why,
				 sizeof(why)), 0);
	assert_int_equal(restore_owners_tree(link, owner, dir, 0, st.st_dev, st.st_ino, why,
				 sizeof(why)), 0);
	/* A tree of another user's. */
	assert_int_equal(restore_owners_tree(link, owner, dir, owner + 1, st.st_dev, st.st_ino,
				 why, sizeof(why)), -1);
	assert_non_null(strstr(why, "neither root's nor the owner's"));
	/* The walk ends at another directory than the file's. */
	assert_int_equal(restore_owners_tree(link, owner, dir, owner, st.st_dev, st.st_ino + 1,
				 why, sizeof(why)), -1);
	assert_non_null(strstr(why, "led elsewhere"));
	/* Another user's link on the path (as root: it is lchown'ed). */
	if (owner != getuid()) {
		char made[32];

		snprintf(made, sizeof(made), "made by uid %u", (unsigned)owner);
		assert_int_equal(restore_owners_tree(link, owner + 1, dir, 0, st.st_dev, st.st_ino,
					 why, sizeof(why)), -1);
		assert_non_null(strstr(why, made));
	}
	unlink(link);
	rmdir(dir);
	rmdir(top);
}

/* mountrule_open (wrapped) of regrow_dir, once while regrow_armed: after
 * the walk reached it, the directory is removed and made again (its file
 * regrow_file moved out and back), and regrown says so: the walk's
 * descriptor holds a directory removed since. */
int __real_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);
int __wrap_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len);
static atomic_int regrow_armed, regrown;
static char regrow_dir[PATH_MAX], regrow_file[PATH_MAX + 16];

int
__wrap_mountrule_open(struct mountrule_walk *w, const char *path, char *why, size_t len)
{
	int fd = __real_mountrule_open(w, path, why, len);
	char aside[PATH_MAX + 16];

	if (fd >= 0 && atomic_load(&regrow_armed) && strcmp(path, regrow_dir) == 0 &&
		atomic_exchange(&regrow_armed, 0)) {
		snprintf(aside, sizeof(aside), "%s.aside", regrow_dir);
		if (rename(regrow_file, aside) == 0 && rmdir(regrow_dir) == 0 &&
			mkdir(regrow_dir, 0755) == 0 && rename(aside, regrow_file) == 0)
			atomic_store(&regrown, 1);
	}
	return fd;
}

/*
 * restore_stored_tree of a stored file whose tree's directory is removed
 * and made again between the judged walk to it and the read of its name
 * (judged_dir): the walk's descriptor holds a removed directory, which
 * /proc/self/fd names "TREE (deleted)". judged_dir took off the
 * " (deleted)" (walked_path) and took it for TREE: the tree told was TREE
 * with the removed directory's inode, not the one there now. Now none:
 * its tree could not be told.
 */
static void
test_a_tree_removed_after_its_walk_is_not_told(void **state)
{
	char top[] = "/tmp/wc-regrow-XXXXXX", path[PATH_MAX + 32];
	struct fdstore_file f = { 0 };
	struct fdstore_generation g = { .number = 1, .role = FDSTORE_CURRENT, .nfiles = 1,
		.files = &f };
	struct restore_prepared p = { .g = &g, .index_fd = -1 };
	struct stat before, now;
	int fd;

	(void)state;
	assert_non_null(mkdtemp(top));
	snprintf(regrow_dir, sizeof(regrow_dir), "%s/tree", top);
	snprintf(regrow_file, sizeof(regrow_file), "%s/m.safetensors", regrow_dir);
	snprintf(path, sizeof(path), "%s", regrow_file);
	assert_int_equal(mkdir(regrow_dir, 0755), 0);
	assert_true((fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	close(fd);
	assert_true((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
	assert_int_equal(stat(regrow_dir, &before), 0);
	p.fds = &fd;
	atomic_store(&regrown, 0);
	atomic_store(&regrow_armed, 1);
	restore_stored_tree(&p, path, NULL);
	atomic_store(&regrow_armed, 0);
	assert_int_equal(stat(regrow_dir, &now), 0);
	print_message("a tree removed after its walk: regrown %d, inode %ju then %ju, told %s "
		"(inode %ju%s), why: %s\n", atomic_load(&regrown), (uintmax_t)before.st_ino,
		(uintmax_t)now.st_ino, p.tree_root != NULL ? p.tree_root : "none",
		(uintmax_t)p.tree_ino, p.tree_ino == before.st_ino ? ", the removed one's" : "",
		p.tree_why);
	assert_true(atomic_load(&regrown));
	assert_true(now.st_ino != before.st_ino);
	assert_null(p.tree_root);
	assert_false(p.tree_ino_known);
	assert_non_null(strstr(p.tree_why, "could not be told"));
	free(p.tree_root);
	close(fd);
	unlink(regrow_file);
	rmdir(regrow_dir);
	rmdir(top);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_no_current_generation_is_judged_against_its_tree, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_no_current_generation_keeps_the_files_its_tree_recorded, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_kept_inode_with_another_ctime_is_not_taken, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_kept_inode_with_its_ctime_is_taken, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_no_current_generation_and_no_tree_waits,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_version_8_model_whose_file_was_moved_away_waits, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_model_not_restored_keeps_the_owner_of_its_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_staged_copy_not_restored_tells_no_owner,
			setup_staged, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_version_8_model_not_restored_is_judged_by_its_stored_file, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_version_8_model_whose_file_was_replaced_waits, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_the_operators_reload_during_the_check_runs_once_it_waits, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_artifact_checked_off_the_loop, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_a_sparse_model_is_not_restored,
			setup_sparse_model, teardown),
		cmocka_unit_test_setup_teardown(test_a_sparse_artifact_is_not_taken_back,
			setup_sparse, teardown),
		cmocka_unit_test_setup_teardown(
			test_stage_yes_now_loads_an_unstaged_generation_afresh, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_descriptors_not_taken_close_in_their_own_lanes, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_remote_file_not_taken_closes_in_the_remote_lane, setup, teardown),
		cmocka_unit_test_setup_teardown(test_directory_model_unchanged_is_restored,
			setup_dir, teardown),
		cmocka_unit_test_setup_teardown(test_a_one_file_models_generation_named_a_file,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_a_directory_models_generation_of_one_file_named_a_directory, setup_dir,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_a_version_9_generation_tells_not_what_its_path_named, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_directory_that_gained_a_shard_index_serves_and_reloads,
			setup_dir, teardown),
		cmocka_unit_test_setup_teardown(
			test_directory_that_gained_a_second_file_serves_and_reloads,
			setup_dir, teardown),
		cmocka_unit_test_setup_teardown(test_stage_no_now_loads_a_staged_generation_afresh,
			setup_staged, teardown),
		cmocka_unit_test_setup_teardown(
			test_stage_auto_on_a_local_filesystem_loads_a_staged_generation_afresh,
			setup_staged, teardown),
		cmocka_unit_test_setup_teardown(
			test_stage_auto_keeps_a_copy_whose_source_filesystem_is_unknown,
			setup_staged, teardown),
		cmocka_unit_test_setup_teardown(test_stage_yes_keeps_a_staged_generation,
			setup_staged, teardown),
		cmocka_unit_test_setup_teardown(test_holds_are_taken_by_the_uids_that_held,
			setup_held, teardown),
		cmocka_unit_test_setup_teardown(test_holds_of_a_count_only_description,
			setup_held_count_only, teardown),
		cmocka_unit_test(test_a_tree_a_stored_file_tells_is_its_owners),
		cmocka_unit_test(test_a_tree_removed_after_its_walk_is_not_told),
		/* Last: its stage_sweep() keeps stage_dir's lock open (stage_dir.c's
		 * sweep lock, held for the process), on a descriptor a later
		 * test's store would need (su_manager_pass places it at 3..). */
		cmocka_unit_test_setup_teardown(test_a_stop_ends_the_removal_of_a_copy_not_restored,
			setup_staged, teardown),
	};

	/* Before libuv's first loop takes 3 and 4 for its signal pipe. */
	su_hold_low_fds();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
