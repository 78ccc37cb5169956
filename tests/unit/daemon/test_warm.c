/*
 * test_warm.c: unit tests of daemon/warm.c, the page-cache warming pool,
 * reading: a cold file warmed by each method (sendfile, pread,
 * fadvise+pread) and a range of it, the owner's measure callback, read
 * errors and the fallback from sendfile to pread, and invalid arguments;
 * on a real libuv loop and real files in /tmp (warm_fixture.h). How the
 * pool schedules, cancels and closes jobs is test_warm_jobs.c's.
 *
 * Residency is checked with the module's own resident_mincore_bytes (mincore on
 * an untouched MAP_SHARED mapping of the file) and, where the kernel has it,
 * resident_cachestat_bytes (cachestat). Eviction with POSIX_FADV_DONTNEED works on
 * ext4 (this machine's /tmp); where it does not (tmpfs), the cold-cache
 * assertion is skipped with a printed reason and the rest still runs.
 *
 * Fault injection: warm_fault.c stands in for pread() and sendfile(), to
 * fail them with EINTR, EIO or (sendfile) EINVAL and count their calls;
 * open() is wrapped (--wrap) to refuse /dev/null.
 *
 * Benchmark mode: `test_warm --bench FILE [RUNS]` compares, on a cold cache
 * each time, the pool's methods with `cat FILE > /dev/null` (see bench()).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "base/error.h"
#include "resident.h"
#include "warm.h"
#include "warm_fixture.h"

/* open() of /dev/null fails with this errno (0: no); warm.c's open() only
 * is wrapped (-Wl,--wrap=open in tests/CMakeLists.txt). */
static int devnull_errno;

int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);

int
__wrap_open(const char *path, int flags, ...)
{
	va_list ap;
	int mode; /* passed only with O_CREAT and O_TMPFILE, as an int */

	va_start(ap, flags);
	mode = flags & (O_CREAT | O_TMPFILE) ? va_arg(ap, int) : 0;
	va_end(ap);
	if (devnull_errno != 0 && strcmp(path, "/dev/null") == 0) {
		errno = devnull_errno;
		return -1;
	}
	return __real_open(path, flags, (mode_t)mode);
}

/* ---- warming a cold file ------------------------------------------------ */

/*
 * Asserts that [off, off + len) of the big file (mapped at base) is resident
 * after warming. Under memory pressure the kernel may reclaim a few pages
 * right after they were read (seen here with many sanitizer builds running
 * at once); cachestat reports those as evicted (workingset shadow entries,
 * which eviction by POSIX_FADV_DONTNEED does not leave). A shortfall that
 * reclaim explains is printed, not failed; any other shortfall fails.
 */
static void
assert_resident(struct fixture *f, const void *base, uint64_t off, uint64_t len)
{
	uint64_t resident = 0, cached = 0, evicted = 0;
	int r;

	assert_int_equal(resident_mincore_bytes(base, (size_t)len, &resident), 0);
	if (resident == len)
		return;
	r = resident_cachestat_bytes(f->big_fd, off, len, &cached, &evicted);
	if (r == 0 && evicted > 0 && resident + evicted >= len) {
		printf("# note: %llu of %llu bytes reclaimed under memory pressure after "
		       "warming\n", (unsigned long long)(len - resident),
			(unsigned long long)len);
		return;
	}
	fail_msg("%llu of %llu bytes resident after warming (cachestat %d: cached %llu, "
		 "evicted %llu)", (unsigned long long)resident, (unsigned long long)len, r,
		(unsigned long long)cached, (unsigned long long)evicted);
}

/*
 * Evicts the big file, checks it is cold (or says why not), warms it through
 * a pool with method, and checks the result and the residency afterwards.
 */
static void
warm_cold(struct fixture *f, enum warm_method method)
{
	uint64_t resident = 1, cached = 1;
	int r;

	make_big(f);
	new_pool(f, 2, 0, method, 0);
	assert_int_equal(resident_evict_range(f->big_fd, 0, 0), 0);
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	if (resident != 0)
		printf("# note: %s: %llu bytes still resident after POSIX_FADV_DONTNEED "
		       "(tmpfs/overlay?); not asserting a cold start\n",
			f->big_path, (unsigned long long)resident);
	r = resident_cachestat_bytes(f->big_fd, 0, 0, &cached, NULL);
	if (r == -ENOSYS)
		printf("# note: no cachestat(2) on this kernel (needs Linux 6.5)\n");
	else
		assert_int_equal(r, 0);
	if (r == 0 && resident == 0)
		assert_int_equal(cached, 0);

	submit(f, 1, f->big_fd, f->big_map, 0, BIG_SIZE, false);
	assert_int_equal(warm_pool_pending(f->pool), 1);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].done_calls, 1);
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(f->seen[0].res.bytes, BIG_SIZE);
	assert_true(f->seen[0].res.seconds >= 0.0);
	assert_int_equal(warm_pool_pending(f->pool), 0);

	assert_resident(f, f->big_map, 0, BIG_SIZE);
	if (r == 0) {
		uint64_t evicted;

		assert_int_equal(resident_cachestat_bytes(f->big_fd, 0, 0, &cached, &evicted), 0);
		assert_true(cached + evicted >= BIG_SIZE && cached <= BIG_SIZE);
		assert_int_equal(resident_cachestat_bytes(f->big_fd, 4096, 100, &cached, NULL), 0);
		assert_true(cached == 100 || evicted > 0);
	}
	/* And evict again: the helper the `evict` command will use. */
	assert_int_equal(resident_evict_range(f->big_fd, 0, 0), 0);
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	if (resident != 0)
		printf("# note: eviction not possible here; skipped the evict check\n");
}

static void
test_warm_pread(void **state)
{
	warm_cold(*state, WARM_PREAD);
}

static void
test_warm_fadvise(void **state)
{
	warm_cold(*state, WARM_FADVISE_PREAD);
}

static void
test_warm_sendfile(void **state)
{
	warm_cold(*state, WARM_SENDFILE);
}

/* A range in the middle of the file: only that range becomes resident. */
static void
test_warm_range(void **state)
{
	struct fixture *f = *state;
	uint64_t resident;

	make_big(f);
	new_pool(f, 1, 1 * MiB, 0, 0);
	assert_int_equal(resident_evict_range(f->big_fd, 0, 0), 0);
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	if (resident != 0) {
		printf("# skipped: cannot evict %s (tmpfs/overlay?)\n", f->big_path);
		return;
	}
	submit(f, 1, f->big_fd, (uint8_t *)f->big_map + 8 * MiB, 8 * MiB, 3 * MiB + 100, false);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(f->seen[0].res.bytes, 3 * MiB + 100);
	assert_resident(f, (uint8_t *)f->big_map + 8 * MiB, 8 * MiB, 3 * MiB + 100);
	/* Readahead may spill a little past the range, but not over the file. */
	assert_int_equal(resident_mincore_bytes(f->big_map, BIG_SIZE, &resident), 0);
	assert_true(resident < 16 * MiB);
}

/* ---- the owner's measure ------------------------------------------------ */

static atomic_int measure_calls;

/* Reports the range it was called for and that it ran on a pool thread. */
static void
record_measure(const struct warm_request *req, struct warm_measure *out)
{
	atomic_fetch_add(&measure_calls, 1);
	out->value = req->offset + req->length;
	out->how = pthread_equal(pthread_self(), cur->loop_thread) ? -1 : 7;
}

/* The measure callback runs once per job that read its whole range, on a
 * pool thread, before the done callback, which gets what it found; a job
 * that did not read it all gets zeros and no call. */
static void
test_measure(void **state)
{
	struct fixture *f = *state;
	struct warm_request req = {
		.fd = -1, .offset = 2 * MiB, .length = 3 * MiB, .cookie = (void *)(uintptr_t)1,
		.done = record_done, .measure = record_measure,
	};

	make_big(f);
	f->loop_thread = pthread_self();
	atomic_store(&measure_calls, 0);
	new_pool(f, 1, 1 * MiB, 0, 0);
	req.fd = f->big_fd;
	assert_int_equal(warm_submit(f->pool, &req, &f->jobs[0]), 0);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(atomic_load(&measure_calls), 1);
	assert_int_equal(f->seen[0].res.measure.value, 5 * MiB);
	assert_int_equal(f->seen[0].res.measure.how, 7);

	/* Past the end of the file: -ENODATA, not measured. */
	req.offset = BIG_SIZE - MiB;
	req.length = 2 * MiB;
	req.cookie = (void *)(uintptr_t)2;
	assert_int_equal(warm_submit(f->pool, &req, &f->jobs[1]), 0);
	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->seen[1].res.status, -ENODATA);
	assert_int_equal(atomic_load(&measure_calls), 1);
	assert_int_equal(f->seen[1].res.measure.value, 0);
	assert_int_equal(f->seen[1].res.measure.how, 0);
}

/* ---- errors ------------------------------------------------------------- */

static void
test_read_errors(void **state)
{
	struct fixture *f = *state;
	int pipefd[2];

	make_big(f);
	new_pool(f, 1, 1 * MiB, WARM_PREAD, 0);
	assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);

	submit(f, 1, pipefd[0], NULL, 0, MiB, false);               /* -ESPIPE */
	submit(f, 2, f->big_fd, NULL, BIG_SIZE - MiB, 2 * MiB, false); /* past EOF */
	submit(f, 3, f->big_fd, NULL, 0, 0, false);                  /* empty */
	assert_true(run_until(&f->loop, &f->completed, 3));
	assert_int_equal(f->seen[0].res.status, -ESPIPE);
	assert_int_equal(f->seen[0].res.bytes, 0);
	assert_int_equal(f->seen[1].res.status, -ENODATA);
	assert_int_equal(f->seen[1].res.bytes, MiB);
	assert_int_equal(f->seen[2].res.status, 0);
	assert_int_equal(f->seen[2].res.bytes, 0);

	/* EINTR is retried; EIO ends the job with what was read so far. */
	atomic_store(&fault.eintr, 3);
	submit(f, 4, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 4));
	assert_int_equal(f->seen[3].res.status, 0);
	assert_int_equal(f->seen[3].res.bytes, 4 * MiB);
	assert_int_equal(atomic_load(&fault.eintr), 0);
	atomic_store(&fault.eio_after, 3);
	submit(f, 5, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 5));
	assert_int_equal(f->seen[4].res.status, -EIO);
	assert_int_equal(f->seen[4].res.bytes, 2 * MiB);
	close(pipefd[0]);
	close(pipefd[1]);
}

/* The default method: sendfile errors end the job; a file that cannot be
 * spliced (EINVAL) is read with pread instead. */
static void
test_sendfile_fallback(void **state)
{
	struct fixture *f = *state;
	int pipefd[2];

	make_big(f);
	new_pool(f, 1, 1 * MiB, 0, 0);
	assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);

	submit(f, 1, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 1));
	assert_int_equal(f->seen[0].res.status, 0);
	assert_int_equal(atomic_load(&fault.sendfiles), 4); /* the default is sendfile */
	assert_int_equal(atomic_load(&fault.preads), 0);

	atomic_store(&fault.sendfile_einval, 1);
	submit(f, 2, f->big_fd, NULL, 0, 4 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 2));
	assert_int_equal(f->seen[1].res.status, 0);
	assert_int_equal(f->seen[1].res.bytes, 4 * MiB);
	assert_int_equal(atomic_load(&fault.sendfiles), 5);
	assert_int_equal(atomic_load(&fault.preads), 4);

	atomic_store(&fault.sendfile_eio, 1);
	submit(f, 3, f->big_fd, NULL, 0, 4 * MiB, false);
	submit(f, 4, pipefd[0], NULL, 0, MiB, false); /* no pread(2) on a pipe */
	submit(f, 5, f->big_fd, NULL, BIG_SIZE - MiB, 2 * MiB, false);
	assert_true(run_until(&f->loop, &f->completed, 5));
	assert_int_equal(f->seen[2].res.status, -EIO);
	assert_int_equal(f->seen[2].res.bytes, 0);
	assert_int_equal(f->seen[3].res.status, -ESPIPE);
	assert_int_equal(f->seen[4].res.status, -ENODATA);
	assert_int_equal(f->seen[4].res.bytes, MiB);
	close(pipefd[0]);
	close(pipefd[1]);
}

/* /dev/null cannot be opened (a container or a unit without it, or an
 * LSM that refuses it): the pool is not made, with that errno, and the
 * message names /dev/null and the reason. Before, it left no message and
 * wcached said "cannot start 2 prefetch threads: Permission denied", which
 * sends one looking at thread limits. */
static void
test_devnull_fails(void **state)
{
	struct fixture *f = *state;
	struct warm_options o = { .threads = 2, .method = WARM_SENDFILE };
	struct warm_pool *p = NULL;
	int r;

	error_format("%s", "");
	devnull_errno = EACCES;
	r = warm_pool_new(&f->loop, &o, &p);
	devnull_errno = 0;
	assert_int_equal(r, -EACCES);
	assert_null(p);
	assert_string_equal(error_get(), "cannot open /dev/null, where the prefetch threads "
					 "sendfile(2) what they read: Permission denied");
	/* pread needs no /dev/null. */
	devnull_errno = EACCES;
	o.method = WARM_PREAD;
	r = warm_pool_new(&f->loop, &o, &f->pool);
	devnull_errno = 0;
	assert_int_equal(r, 0);
}

static void
test_invalid(void **state)
{
	struct fixture *f = *state;
	struct warm_options o = {0};
	struct warm_pool *p = (struct warm_pool *)&o;
	struct warm_request req = {.fd = 0, .length = 1, .done = record_done,
		.cookie = (void *)1};

	o.threads = WARM_MAX_THREADS + 1;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	o.threads = 1;
	o.chunk_bytes = 4096;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	o.chunk_bytes = (size_t)WARM_MAX_CHUNK + 1;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	o.chunk_bytes = 0;
	o.method = (enum warm_method)99;
	assert_int_equal(warm_pool_new(&f->loop, &o, &p), -EINVAL);
	assert_ptr_equal(p, (struct warm_pool *)&o); /* untouched on failure */
	assert_int_equal(warm_pool_new(NULL, NULL, &p), -EINVAL);

	new_pool(f, 1, 0, 0, 0);
	req.fd = -1;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.fd = 0;
	req.done = NULL;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.done = record_done;
	req.offset = UINT64_MAX;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.offset = (uint64_t)INT64_MAX;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	req.offset = 0;
	req.base = (void *)(uintptr_t)12345;
	assert_int_equal(warm_submit(f->pool, &req, NULL), -EINVAL);
	assert_int_equal(warm_pool_pending(f->pool), 0);
	assert_int_equal(warm_cancel(f->pool, NULL), -EINVAL);
	assert_int_equal(resident_evict_range(-1, 0, 0), -EINVAL);
	assert_int_equal(resident_evict_range(0, UINT64_MAX, 0), -EINVAL);
	warm_pool_close(NULL);
}

/* ---- benchmark mode ----------------------------------------------------- */

/* User + system CPU seconds of this process (who = RUSAGE_SELF, all
 * threads) or of its waited-for children (RUSAGE_CHILDREN). */
static double
cpu_s(int who)
{
	struct rusage ru;

	getrusage(who, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int bench_done;
static struct warm_result bench_res;

static void
bench_on_done(struct warm_job *job, const struct warm_result *res, void *cookie)
{
	bench_res = *res;
	bench_done = 1;
}

/* Warms the file through a fresh one-thread pool; returns wall seconds from
 * submit to the done callback (and CPU seconds in *cpu), or -1. */
static double
bench_pool(int fd, uint64_t size, enum warm_method method, size_t chunk, double *cpu)
{
	uv_loop_t loop;
	struct warm_pool *pool;
	struct warm_options o = {.threads = 1, .chunk_bytes = chunk, .method = method};
	struct warm_request req = {.fd = fd, .length = size, .done = bench_on_done};
	double t0, c0, t;

	if (uv_loop_init(&loop) != 0 || warm_pool_new(&loop, &o, &pool) != 0)
		return -1;
	bench_done = 0;
	c0 = cpu_s(RUSAGE_SELF);
	t0 = tu_now();
	if (warm_submit(pool, &req, NULL) != 0)
		return -1;
	while (!bench_done)
		uv_run(&loop, UV_RUN_ONCE);
	t = tu_now() - t0;
	*cpu = cpu_s(RUSAGE_SELF) - c0;
	warm_pool_close(pool);
	uv_run(&loop, UV_RUN_DEFAULT);
	if (uv_loop_close(&loop) != 0 || bench_res.status != 0 || bench_res.bytes != size)
		return -1;
	return t;
}

/* Runs `cat path` with stdout on /dev/null; returns wall seconds (and the
 * child's CPU seconds in *cpu) or -1. */
static double
bench_cat(const char *path, double *cpu)
{
	posix_spawn_file_actions_t fa;
	char *argv[] = {"cat", (char *)(uintptr_t)path, NULL};
	extern char **environ;
	double c0 = cpu_s(RUSAGE_CHILDREN);
	double t0 = tu_now(), t;
	pid_t pid;
	int st;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	if (posix_spawnp(&pid, "cat", &fa, NULL, argv, environ) != 0)
		return -1;
	posix_spawn_file_actions_destroy(&fa);
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -1;
	t = tu_now() - t0;
	*cpu = cpu_s(RUSAGE_CHILDREN) - c0;
	return t;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * `test_warm --bench FILE [RUNS]`: for RUNS rounds (default 5), for each
 * contender in turn, evicts FILE, checks it is cold, times reading it whole,
 * checks it is resident; prints the median wall and CPU time per contender.
 * Contenders run interleaved so drift (other load) affects them alike.
 */
static int
bench(const char *path, int runs)
{
	static const struct {
		const char *name;
		enum warm_method method;
		size_t chunk;
	} c[] = {
		{"warm sendfile 8MiB (default)", WARM_SENDFILE, 8 * MiB},
		{"warm sendfile 1MiB", WARM_SENDFILE, 1 * MiB},
		{"warm pread 8MiB", WARM_PREAD, 8 * MiB},
		{"warm pread 1MiB", WARM_PREAD, 1 * MiB},
		{"warm pread 32MiB", WARM_PREAD, 32 * MiB},
		{"warm fadvise+pread 8MiB", WARM_FADVISE_PREAD, 8 * MiB},
		{"cat FILE > /dev/null", 0, 0},
	};
	enum { NC = sizeof(c) / sizeof(c[0]), MAXRUNS = 50 };
	static double t[NC][MAXRUNS], cpu[NC][MAXRUNS];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	void *map;
	uint64_t res;

	if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
		fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (runs < 1 || runs > MAXRUNS)
		runs = 5;
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return 1;
	printf("bench: %s, %lld bytes, %d runs, cold cache before each\n", path,
		(long long)st.st_size, runs);
	for (int r = 0; r < runs; r++) {
		for (int i = 0; i < NC; i++) {
			double s;

			if (resident_evict_range(fd, 0, 0) != 0 ||
				resident_mincore_bytes(map, (size_t)st.st_size, &res) != 0)
				return 1;
			if (res != 0) {
				fprintf(stderr, "bench: %s: %llu bytes still cached after "
						"eviction; cannot measure a cold read here\n",
					path, (unsigned long long)res);
				return 1;
			}
			s = c[i].chunk != 0 ? bench_pool(fd, (uint64_t)st.st_size, c[i].method,
						      c[i].chunk, &cpu[i][r])
					    : bench_cat(path, &cpu[i][r]);
			if (s < 0 || resident_mincore_bytes(map, (size_t)st.st_size, &res) != 0) {
				fprintf(stderr, "bench: %s failed (status %d, %llu bytes)\n",
					c[i].name, bench_res.status,
					(unsigned long long)bench_res.bytes);
				return 1;
			}
			if (res != (uint64_t)st.st_size)
				printf("bench: %s: only %llu bytes resident afterwards\n",
					c[i].name, (unsigned long long)res);
			t[i][r] = s;
		}
	}
	for (int i = 0; i < NC; i++) {
		double med = median(t[i], runs);

		printf("%-29s median %.3f s %6.0f MiB/s  (min %.3f, max %.3f)  CPU %.3f s\n",
			c[i].name, med, (double)st.st_size / med / MiB, t[i][0], t[i][runs - 1],
			median(cpu[i], runs));
	}
	munmap(map, (size_t)st.st_size);
	close(fd);
	return 0;
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_warm_pread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_fadvise, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_sendfile, setup, teardown),
		cmocka_unit_test_setup_teardown(test_warm_range, setup, teardown),
		cmocka_unit_test_setup_teardown(test_measure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sendfile_fallback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_devnull_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_invalid, setup, teardown),
	};

	if (argc >= 3 && strcmp(argv[1], "--bench") == 0)
		return bench(argv[2], argc >= 4 ? atoi(argv[3]) : 5);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
