/*
 * test_attach_reply.c: what libwcache checks in the descriptors that come
 * with ATTACH_OK (client/lib/attach_reply.c, proto/PROTOCOL.md, "What a
 * client checks after ATTACH_OK"), against a fake, hostile wcached: an
 * index memfd that is not sealed, a plain file, of the wrong size or not a
 * file; model file descriptors of the wrong type, mode or size; too few or
 * too many descriptors; damaged indexes; bad status pages (which the
 * attach must do without); and mmap() failing on each of them.
 *
 * Each test checks the exact code, a substring of wc_errmsg(), and that
 * nothing is left behind: no descriptor and no mapping of the index, a
 * model file or a bad status page (attach_fixture.h).
 *
 * Fault injection uses the linker's --wrap (tests/CMakeLists.txt links this
 * test with -Wl,--wrap=mmap,--wrap=fcntl,--wrap=fstat and compiles it with
 * -U_FORTIFY_SOURCE): __wrap_mmap fails the Nth file-backed mmap() while a
 * test has armed it, __wrap_fcntl (fcntl_fault.c) one command, __wrap_fstat
 * the client's fstat() of one inode. The __real_ symbols are weak, so a build without
 * those options still links; the tests that need them then report SKIPPED.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "attach_fixture.h"
#include "fcntl_fault.h"
#include "format/index.h"
#include "proto/memfds.h"
#include "testutil.h"
#include "lib/wcache.h"

#define PAGE_SEALS STATUS_PAGE_SEALS

/* ---- fault injection ---------------------------------------------------- */

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((weak));
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

/* mmap() as the library calls it: fails (ENOMEM) the armed call, counting
 * only file-backed calls so that anonymous mappings made by anything else
 * cannot shift the count. */
void *
__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (fault.mmap_fail_at > 0 && fd >= 0 && !(flags & MAP_ANONYMOUS) &&
		++fault.mmap_calls == fault.mmap_fail_at) {
		fault.mmap_failed = fault.mmap_calls;
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return __real_mmap(addr, len, prot, flags, fd, off);
}

/* Skips the test unless it was linked with -Wl,--wrap=mmap. */
#define NEED_WRAP() af_need_wrap(__real_mmap != NULL, "-Wl,--wrap=mmap")

int __real_fstat(int fd, struct stat *st) __attribute__((weak));
int __wrap_fstat(int fd, struct stat *st);

/* fstat() failing once with fault.fstat_errno in the client's thread for a
 * descriptor of the inode fault.fstat_ino (the fake daemon's own calls and
 * other files go through). */
int
__wrap_fstat(int fd, struct stat *st)
{
	struct stat seen;

	if (fault.fstat_ino != 0 && pthread_equal(pthread_self(), fault.client) &&
		__real_fstat(fd, &seen) == 0 && seen.st_ino == fault.fstat_ino) {
		fault.fstat_ino = 0;
		errno = fault.fstat_errno;
		return -1;
	}
	return __real_fstat(fd, st);
}

/* ---- helpers ------------------------------------------------------------ */

/* The same, kept for teardown to close. */
static int
memfd_with(struct fixture *f, const char *name, const void *data, size_t len, int seals)
{
	return keep(f, memfd_make(name, data, len, seals));
}

/* A status page memfd of size bytes called "wctest-badpage" with magic in
 * slot 0 and value in slot (when they fit), then seals. */
static int
page_with(struct fixture *f, size_t size, uint64_t magic, uint64_t slot, uint64_t value,
	int seals)
{
	int fd = memfd_create("wctest-badpage", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (size >= 8)
		assert_int_equal(pwrite(fd, &magic, 8, 0), 8);
	if (slot < size / 8)
		assert_int_equal(pwrite(fd, &value, 8, (off_t)(slot * 8)), 8);
	if (seals > 0)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return keep(f, fd);
}

/* ---- the index descriptor ----------------------------------------------- */

/* An index memfd that can still be written is refused, sealed against
 * resizing or not. */
static void
test_index_not_sealed(void **state)
{
	struct fixture *f = *state;

	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len,
		F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
	/* Sealed against writes, but seals could still be added. */
	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len,
		F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len, 0);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
	f->fake.fds[0] = memfd_with(f, "wctest-index", f->index, f->index_len, -1);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
}

/* A regular file holding a good index has no seals. */
static void
test_index_plain_file(void **state)
{
	struct fixture *f = *state;
	char *path = tu_write(f->dir, "index.bin", f->index, f->index_len);

	f->fake.fds[0] = keep(f, open(path, O_RDONLY | O_CLOEXEC));
	free(path);
	attach_fails(f, -EBADMSG, MODEL ": index is not sealed");
}

/* index_size in the reply must be the memfd's size. */
static void
test_index_size_mismatch(void **state)
{
	struct fixture *f = *state;
	char want[64];

	f->fake.ok.index_size = f->index_len + 8;
	snprintf(want, sizeof(want), "not a %zu-byte file", f->index_len + 8);
	attach_fails(f, -EBADMSG, want);
	f->fake.ok.index_size = f->index_len - 8;
	snprintf(want, sizeof(want), "not a %zu-byte file", f->index_len - 8);
	attach_fails(f, -EBADMSG, want);
	/* An empty sealed memfd and index_size 0: nothing to map, no index. */
	f->fake.ok.index_size = 0;
	f->fake.fds[0] = memfd_with(f, "wctest-index", NULL, 0, INDEX_SEALS);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
}

/* Makes a directory, a pipe and a socket descriptor for the fake to pass. */
static void
odd_fds(struct fixture *f, int out[3])
{
	int p[2], sv[2];

	out[0] = keep(f, open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	out[1] = keep(f, p[0]);
	keep(f, p[1]);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	out[2] = keep(f, sv[0]);
	keep(f, sv[1]);
}

/* A directory, a pipe or a socket in place of the index. */
static void
test_index_not_a_file(void **state)
{
	struct fixture *f = *state;
	int odd[3];
	char want[64];

	odd_fds(f, odd);
	snprintf(want, sizeof(want), MODEL ": received descriptor is not a %zu-byte file",
		f->index_len);
	for (int i = 0; i < 3; i++) {
		f->fake.fds[0] = odd[i];
		attach_fails(f, -EBADMSG, want);
	}
}

/* ---- the model file descriptors ----------------------------------------- */

static void patched_index(struct fixture *f, size_t off, uint64_t value);
static size_t file_record(const struct fixture *f, size_t i);

/* A directory, a pipe or a socket in place of a model file; for the second
 * file, the first one's mapping must be undone. */
static void
test_file_not_a_file(void **state)
{
	struct fixture *f = *state;
	int odd[3];

	odd_fds(f, odd);
	for (int i = 0; i < 3; i++) {
		f->fake.fds[2] = odd[i];
		attach_fails(f, -EBADMSG, "b.bin: received descriptor is not a 96-byte file");
	}
	f->fake.fds[2] = f->file_fd[1];
	f->fake.fds[1] = odd[1];
	attach_fails(f, -EBADMSG, "a.bin: received descriptor is not a 256-byte file");
}

/* A directory exactly as large as the index says b.bin is: its size
 * matches, its type does not. */
static void
test_file_is_directory_of_right_size(void **state)
{
	struct fixture *f = *state;
	struct stat st;
	char want[128];
	int odd[3];

	odd_fds(f, odd);
	assert_int_equal(fstat(odd[0], &st), 0);
	assert_true(st.st_size > 0);
	patched_index(f, file_record(f, 1) + 8, (uint64_t)st.st_size);
	f->fake.fds[2] = odd[0];
	snprintf(want, sizeof(want), MODEL ": b.bin: received descriptor is not a %llu-byte file",
		(unsigned long long)st.st_size);
	attach_fails(f, -EBADMSG, want);
}

/* wcached passes model files read-only: a writable descriptor of the right
 * file is not from wcached. */
static void
test_file_writable(void **state)
{
	struct fixture *f = *state;

	f->fake.fds[2] = keep(f, open(f->file_path[1], O_RDWR | O_CLOEXEC));
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received a writable descriptor");
	f->fake.fds[2] = keep(f, open(f->file_path[1], O_WRONLY | O_CLOEXEC));
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received a writable descriptor");
}

/* A model file whose size is not the one the index records. */
static void
test_file_size_mismatch(void **state)
{
	struct fixture *f = *state;
	uint8_t bytes[B_SIZE + 1];
	char *path;

	memset(bytes, 1, sizeof(bytes));
	path = tu_write(f->dir, "short.bin", bytes, B_SIZE - 1);
	f->fake.fds[2] = keep(f, open(path, O_RDONLY | O_CLOEXEC));
	free(path);
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received descriptor is not a 96-byte file");
	path = tu_write(f->dir, "long.bin", bytes, B_SIZE + 1);
	f->fake.fds[2] = keep(f, open(path, O_RDONLY | O_CLOEXEC));
	free(path);
	attach_fails(f, -EBADMSG, MODEL ": b.bin: received descriptor is not a 96-byte file");
	/* The files swapped: a.bin's descriptor where b.bin's belongs. */
	fake_fds(f, 4, f->index_fd, f->file_fd[1], f->file_fd[0], f->status_fd);
	attach_fails(f, -EBADMSG, MODEL ": a.bin: received descriptor is not a 256-byte file");
}

/* ---- descriptor counts -------------------------------------------------- */

/* Fewer descriptors than 1 + file_count (+ 1 with the status flag). */
static void
test_too_few_descriptors(void **state)
{
	struct fixture *f = *state;

	fake_fds(f, 3, f->index_fd, f->file_fd[0], f->file_fd[1]);
	attach_fails(f, -EBADMSG, "wcached sent 3 descriptors for 2 files");
	f->fake.ok.flags = 0;
	fake_fds(f, 2, f->index_fd, f->file_fd[0]);
	attach_fails(f, -EBADMSG, "wcached sent 2 descriptors for 2 files");
	fake_fds(f, 0);
	attach_fails(f, -EBADMSG, "wcached sent 0 descriptors for 2 files");
}

/* More descriptors than that, up to more than the client takes at all. */
static void
test_too_many_descriptors(void **state)
{
	struct fixture *f = *state;

	fake_fds(f, 5, f->index_fd, f->file_fd[0], f->file_fd[1], f->status_fd, f->status_fd);
	attach_fails(f, -EBADMSG, "wcached sent 5 descriptors for 2 files");
	f->fake.ok.flags = 0;
	fake_fds(f, 4, f->index_fd, f->file_fd[0], f->file_fd[1], f->status_fd);
	attach_fails(f, -EBADMSG, "wcached sent 4 descriptors for 2 files");
	/* More than WIRE_MAX_FDS: fdp_recv() refuses them all. */
	for (size_t i = 0; i < KERNEL_SCM_MAX_FD; i++)
		f->fake.fds[i] = f->index_fd;
	f->fake.nfds = KERNEL_SCM_MAX_FD;
	attach_fails(f, -EBADMSG, "receive: ");
}

/* ---- damaged indexes ---------------------------------------------------- */

/* Index fields in the host's order (the tests run little-endian). */
static uint64_t
get64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

static void
put64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

/* A sealed index memfd of the good index with 8 bytes at off replaced,
 * which the fake passes instead of the good one. */
static void
patched_index(struct fixture *f, size_t off, uint64_t value)
{
	uint8_t *copy = malloc(f->index_len);

	assert_non_null(copy);
	memcpy(copy, f->index, f->index_len);
	put64(copy + off, value);
	f->fake.fds[0] = memfd_with(f, "wctest-index", copy, f->index_len, INDEX_SEALS);
	free(copy);
}

/* Offsets in the good index (index.h): header fields, tensor records in
 * name order (alpha, beta, gamma), file records. */
#define IX_TENSOR_OFFSET 16
#define IX_FILE_COUNT 24
#define IX_FILE_OFFSET 32

static size_t
tensor_record(const struct fixture *f, size_t i)
{
	return (size_t)get64(f->index + IX_TENSOR_OFFSET) + i * INDEX_RECORD_SIZE;
}

static size_t
file_record(const struct fixture *f, size_t i)
{
	return (size_t)get64(f->index + IX_FILE_OFFSET) + i * INDEX_FILE_SIZE;
}

static void
test_index_bad_magic(void **state)
{
	struct fixture *f = *state;

	patched_index(f, 0, get64(f->index) ^ 0xff);
	attach_fails(f, -EBADMSG, "model \"" MODEL "\": wcached sent a damaged index");
}

static void
test_index_version(void **state)
{
	struct fixture *f = *state;

	patched_index(f, 0, get64(f->index) + (1ull << 32)); /* version 2 */
	attach_fails(f, -EPROTO, "wcached sent a damaged index");
}

/* A table offset or count that points outside the index. */
static void
test_index_tables_outside(void **state)
{
	struct fixture *f = *state;

	patched_index(f, IX_TENSOR_OFFSET, f->index_len);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
	patched_index(f, IX_FILE_OFFSET, UINT64_MAX - 7);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
	patched_index(f, 8 /* tensor_count */, UINT64_MAX / 2);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
}

/* The index names another number of files than the reply. */
static void
test_index_file_count_differs(void **state)
{
	struct fixture *f = *state;

	patched_index(f, IX_FILE_COUNT, 1);
	attach_fails(f, -EBADMSG, "wcached sent a damaged index");
	/* Both say 1, but two files came: the count of descriptors is wrong. */
	f->fake.ok.file_count = 1;
	attach_fails(f, -EBADMSG, "wcached sent 4 descriptors for 1 files");
}

/* The second file record is damaged: found after the first file is mapped,
 * which must be unmapped again. */
static void
test_index_file_record_damaged(void **state)
{
	struct fixture *f = *state;

	patched_index(f, file_record(f, 1), UINT64_MAX);
	attach_fails(f, -EBADMSG, MODEL ": index: file record 1 is damaged");
	patched_index(f, file_record(f, 1) + 8, B_SIZE + 1); /* size */
	attach_fails(f, -EBADMSG, "b.bin: received descriptor is not a 97-byte file");
}

/* Tensor records are checked on access: attaching works, the bad tensor
 * is an error, the others read. */
static void
test_index_tensor_damaged(void **state)
{
	struct fixture *f = *state;
	wc_tensor t;
	int before;

	/* beta's data past the end of b.bin */
	patched_index(f, tensor_record(f, 1) + 32, B_SIZE - 16);
	before = attach_ok(f);
	assert_error(wc_model_find(f->model, "beta", &t), -EBADMSG,
		MODEL ": tensor \"beta\" lies outside its file");
	assert_error(wc_model_tensor(f->model, 1, &t), -EBADMSG, "lies outside its file");
	assert_int_equal(wc_model_find(f->model, "alpha", &t), 0);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);

	/* beta in file 2 of 2 */
	patched_index(f, tensor_record(f, 1) + 8, 4 /* U8 */ | (uint64_t)2 << 32);
	before = attach_ok(f);
	assert_error(wc_model_find(f->model, "beta", &t), -EBADMSG,
		"index: tensor record 1 is damaged");
	assert_int_equal(wc_model_find(f->model, "gamma", &t), 0);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

/* ---- status pages ------------------------------------------------------- */

/* Attaches with page as the status page and slot as the model's slot. The
 * page says GENERATION + 1 there, so a client that used it would call the
 * model stale: the attach must work, without the page. */
static void
attach_with_bad_page(struct fixture *f, int page, uint64_t slot)
{
	int before;

	f->fake.fds[3] = page;
	f->fake.ok.status_slot = slot;
	before = attach_ok(f);
	check_tensors(f->model);
	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 0);
	set_slot(f, SLOT, GENERATION);
	assert_maps(f, 1, 2, 1);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

static void
test_status_page_unsealed(void **state)
{
	struct fixture *f = *state;

	attach_with_bad_page(f, page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC, SLOT,
		GENERATION + 1, 0), SLOT);
	attach_with_bad_page(f, page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC, SLOT,
		GENERATION + 1, F_SEAL_SHRINK), SLOT); /* can still grow: not enough */
}

static void
test_status_page_too_small(void **state)
{
	struct fixture *f = *state;

	/* Room for slots 0 to 2: slot 3 is outside. */
	attach_with_bad_page(f, page_with(f, 24, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
	/* Slot 3 ends 4 bytes past the end. */
	attach_with_bad_page(f, page_with(f, 28, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
	attach_with_bad_page(f, page_with(f, 0, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
}

static void
test_status_page_wrong_magic(void **state)
{
	struct fixture *f = *state;

	attach_with_bad_page(f, page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC + 1, SLOT,
		GENERATION + 1, PAGE_SEALS), SLOT);
}

static void
test_status_slot_beyond_page(void **state)
{
	struct fixture *f = *state;
	int page = page_with(f, PAGE_SIZE_BYTES, STATUS_MAGIC, SLOT, GENERATION + 1, PAGE_SEALS);

	attach_with_bad_page(f, page, PAGE_SIZE_BYTES / 8);
	attach_with_bad_page(f, page, UINT64_MAX);
	attach_with_bad_page(f, page, UINT64_MAX / 8 + 1); /* * 8 overflows to 0 */
	attach_with_bad_page(f, page, 0);                  /* the magic's slot */
}

/* Larger than the client is willing to map (1 MiB), or not a file. */
static void
test_status_page_not_usable(void **state)
{
	struct fixture *f = *state;
	int odd[3];

	attach_with_bad_page(f, page_with(f, 2u << 20, STATUS_MAGIC, SLOT, GENERATION + 1,
		PAGE_SEALS), SLOT);
	odd_fds(f, odd);
	for (int i = 0; i < 3; i++)
		attach_with_bad_page(f, odd[i], SLOT);
}

/* ---- mmap failures ------------------------------------------------------ */

/* Attaches with the Nth file-backed mmap() failing: index, a.bin, b.bin,
 * status page in that order. The daemon's attach is released (before, it
 * stayed counted until the connection closed, and after 4096 of them the
 * daemon refused every attach on the connection). */
static void
attach_with_mmap_failing(struct fixture *f, int nth, const char *want)
{
	fault.mmap_fail_at = nth;
	fault.mmap_calls = 0;
	fault.mmap_failed = 0;
	attach_fails(f, -ENOMEM, want);
	fault.mmap_fail_at = 0;
	assert_int_equal(fault.mmap_failed, nth);
	/* The daemon made the attach: the client, which keeps the connection,
	 * releases it (else it stays counted until the connection closes). */
	assert_int_equal(f->fake.releases, 1);
	assert_int_equal(f->fake.released_handle, HANDLE);
	assert_int_equal(f->fake.released_seq, 0);
}

/* The second file fails to map: the first file and the index are
 * unmapped, all descriptors closed (attach_fails checks both). */
static void
test_mmap_fails_on_second_file(void **state)
{
	NEED_WRAP();
	attach_with_mmap_failing(*state, 3, MODEL ": b.bin: mmap: ");
}

static void
test_mmap_fails_on_first_file(void **state)
{
	NEED_WRAP();
	attach_with_mmap_failing(*state, 2, MODEL ": a.bin: mmap: ");
}

/* The index fails to map: the message says it was the index. */
static void
test_mmap_fails_on_index(void **state)
{
	NEED_WRAP();
	attach_with_mmap_failing(*state, 1, MODEL ": index: mmap: ");
}

/*
 * Attaches with one system call failing with EIO on a received descriptor:
 * fcntl() with the command fcntl_cmd (unless 0), or the fstat() of the
 * inode fstat_ino (unless 0). The attach fails with the call's own error,
 * whose message holds want, and the connection stays: the next attach on
 * it works. Both attaches are released.
 */
static void
attach_with_call_failing(struct fixture *f, int fcntl_cmd, ino_t fstat_ino, const char *want)
{
	int before = tu_count_fds(), armed;
	wc_model *m = NULL;

	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	fcntl_fault = (struct fcntl_fault){ .cmd = fcntl_cmd, .err = EIO };
	fault.fstat_ino = fstat_ino;
	fault.fstat_errno = EIO;
	assert_error(wc_attach(f->client, MODEL, &m), -EIO, want);
	armed = fcntl_fault.cmd;
	fcntl_fault.cmd = 0; /* not left for the next test, should this one fail */
	assert_null(m);
	assert_int_equal(armed, 0);
	assert_true(fault.fstat_ino == 0);
	assert_int_equal(wc_attach(f->client, MODEL, &f->model), 0);
	release_and_finish(f, before);
	assert_int_equal(f->fake.accepted, 1);
	/* The failed attach was released too, not only the good one. */
	assert_int_equal(f->fake.attaches, 2);
	assert_int_equal(f->fake.releases, 2);
}

/*
 * An fcntl() that fails on a received descriptor (F_GET_SEALS on the index,
 * F_GETFL on a model file) fails the attach with its own error, and the
 * connection stays. Before, the failure was reported as "index is not
 * sealed" or "received a writable descriptor" (-EBADMSG, which also
 * dropped the connection as one to something that is not wcached); found
 * by an strace fault sweep of demo_worker (fcntl:error=EIO).
 */
static void
test_fcntl_fails_on_index(void **state)
{
	af_need_wrap(fcntl_fault_wrapped(), "-Wl,--wrap=fcntl");
	attach_with_call_failing(*state, F_GET_SEALS, 0, MODEL ": index: fcntl: ");
}

static void
test_fcntl_fails_on_file(void **state)
{
	af_need_wrap(fcntl_fault_wrapped(), "-Wl,--wrap=fcntl");
	attach_with_call_failing(*state, F_GETFL, 0, MODEL ": a.bin: fcntl: ");
}

/* An fstat() of the index descriptor that fails is the index's error, and
 * says so, as fcntl's does (before: "llama: fstat: Input/output error",
 * which named no descriptor where the model files' errors name theirs). */
static void
test_fstat_fails_on_index(void **state)
{
	struct fixture *f = *state;
	struct stat st;

	af_need_wrap(__real_fstat != NULL, "-Wl,--wrap=fstat");
	assert_int_equal(fstat(f->index_fd, &st), 0);
	attach_with_call_failing(f, 0, st.st_ino, MODEL ": index: fstat: Input/output error");
}

/* The status page fails to map: the attach works without it. */
static void
test_mmap_fails_on_status_page(void **state)
{
	struct fixture *f = *state;
	int before;

	NEED_WRAP();
	fault.mmap_fail_at = 4;
	before = attach_ok(f);
	fault.mmap_fail_at = 0;
	assert_int_equal(fault.mmap_failed, 4);
	check_tensors(f->model);
	set_slot(f, SLOT, GENERATION + 1);
	assert_int_equal(wc_model_stale(f->model), 0);
	assert_maps(f, 1, 2, 1);
	wc_release(f->model);
	f->model = NULL;
	finish(f, before);
}

/* A kept descriptor whose fstat fails with another error than EBADF
 * (ESTALE, EIO: a file another host replaced on NFS or FUSE) is still the
 * model's open file: wc_release() closes it (review rev174 F4: it was
 * taken for a number closed behind the model's back and leaked). */
static void
test_release_closes_a_kept_fd_whose_fstat_fails(void **state)
{
	struct fixture *f = *state;
	int before = tu_count_fds(), fd1;
	wc_model *m = NULL;
	struct stat st;

	af_need_wrap(__real_fstat != NULL, "-Wl,--wrap=fstat");
	fake_start(f);
	assert_int_equal(wc_connect(f->sock, &f->client), 0);
	assert_int_equal(wc_attach_fds(f->client, MODEL, &m), 0);
	fd1 = wc_model_fd(m, 1);
	assert_true(fd1 >= 0);
	assert_int_equal(fstat(fd1, &st), 0);
	fault.fstat_ino = st.st_ino;
	fault.fstat_errno = ESTALE;
	wc_release(m);
	assert_true(fault.fstat_ino == 0); /* the release's fstat failed */
	assert_int_equal(fcntl(fd1, F_GETFD), -1);
	finish(f, before);
}

int
main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_index_not_sealed),
		T(test_index_plain_file),
		T(test_index_size_mismatch),
		T(test_index_not_a_file),
		T(test_file_not_a_file),
		T(test_file_is_directory_of_right_size),
		T(test_file_writable),
		T(test_file_size_mismatch),
		T(test_too_few_descriptors),
		T(test_too_many_descriptors),
		T(test_index_bad_magic),
		T(test_index_version),
		T(test_index_tables_outside),
		T(test_index_file_count_differs),
		T(test_index_file_record_damaged),
		T(test_index_tensor_damaged),
		T(test_status_page_unsealed),
		T(test_status_page_too_small),
		T(test_status_page_wrong_magic),
		T(test_status_slot_beyond_page),
		T(test_status_page_not_usable),
		T(test_mmap_fails_on_second_file),
		T(test_mmap_fails_on_first_file),
		T(test_mmap_fails_on_index),
		T(test_mmap_fails_on_status_page),
		T(test_fcntl_fails_on_index),
		T(test_fstat_fails_on_index),
		T(test_release_closes_a_kept_fd_whose_fstat_fails),
		T(test_fcntl_fails_on_file),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}
