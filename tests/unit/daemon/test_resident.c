/*
 * test_resident.c: unit tests of daemon/resident.c, the residency helpers:
 * mincore on anonymous memory, pinning (mlock) of memory and of a file's
 * pages, RLIMIT_MEMLOCK as root and as nobody, and the causes it gives
 * when the kernel refuses to lock (the limit, a seccomp filter), both
 * from facts and provoked in forked children. Eviction and cachestat are
 * tested with the warming they serve, in test_warm.c.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "resident.h"
#include "warm_fixture.h"

/* ---- residency, pinning ------------------------------------------------- */

static void
test_resident_anonymous(void **state)
{
	size_t len = 1 * MiB; /* below a huge page, so THP cannot fill it */
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t n = 1;

	(void)state;
	assert_true(p != MAP_FAILED);
	assert_int_equal(resident_mincore_bytes(p, len, &n), 0);
	assert_int_equal(n, 0);
	memset(p, 1, len / 2);
	assert_int_equal(resident_mincore_bytes(p, len, &n), 0);
	assert_int_equal(n, len / 2);
	/* A length that ends inside a resident page counts only its bytes. */
	assert_int_equal(resident_mincore_bytes(p, 100, &n), 0);
	assert_int_equal(n, 100);
	assert_int_equal(resident_mincore_bytes(p + 1, 100, &n), -EINVAL);
	assert_int_equal(resident_mincore_bytes(p, len, NULL), -EINVAL);
	assert_int_equal(munmap(p + len / 2, len / 2), 0);
	assert_int_equal(resident_mincore_bytes(p, len, &n), -ENOMEM); /* not all mapped */
	assert_int_equal(munmap(p, len / 2), 0);
}

/* Runs fn in a forked child and returns its exit status (cmocka asserts
 * must not run in the child). */
static int
in_child(int (*fn)(void))
{
	int st;
	pid_t pid;

	fflush(NULL); /* or the child's copy of buffered output appears twice */
	pid = fork();

	assert_true(pid >= 0);
	if (pid == 0)
		_exit(fn());
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_SKIP = 77, CHILD_FAIL = 1 };

static int
set_memlock(rlim_t soft, rlim_t hard)
{
	struct rlimit rl = {.rlim_cur = soft, .rlim_max = hard};

	return setrlimit(RLIMIT_MEMLOCK, &rl);
}

/* Root becomes nobody, which drops its capabilities (CAP_IPC_LOCK):
 * 0, or -1 when it could not. */
static int
drop_root(void)
{
	struct passwd *pw;
	uid_t uid;

	if (geteuid() != 0)
		return 0;
	pw = getpwnam("nobody");
	uid = pw != NULL ? pw->pw_uid : 65534;
	return setgid(uid) != 0 || setuid(uid) != 0 ? -1 : 0;
}

/* As root (CAP_IPC_LOCK), RLIMIT_MEMLOCK 0 does not stop mlock. */
static int
child_root_ignores_limit(void)
{
	void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED || set_memlock(0, 0) != 0)
		return CHILD_FAIL;
	return resident_pin_range(p, 65536) == 0 ? CHILD_OK : CHILD_FAIL;
}

/* Without CAP_IPC_LOCK: limit 0 gives -EPERM, a small limit -ENOMEM. Root
 * drops its capabilities by becoming nobody. */
static int
child_limited(void)
{
	size_t len = 1 * MiB;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int r0, r1;

	/* Soft limit 0 now; the hard limit leaves room to raise it to one page
	 * later without privilege. */
	if (p == MAP_FAILED || set_memlock(0, 4096) != 0)
		return CHILD_FAIL;
	if (drop_root() != 0)
		return CHILD_SKIP;
	r0 = resident_pin_range(p, len);
	if (set_memlock(4096, 4096) != 0)
		return CHILD_FAIL;
	r1 = resident_pin_range(p, len);
	if (r0 != -EPERM || r1 != -ENOMEM) {
		fprintf(stderr, "child: rlimit 0 -> %d (want %d), rlimit 4096 -> %d (want %d)\n",
			r0, -EPERM, r1, -ENOMEM);
		return CHILD_FAIL;
	}
	return CHILD_OK;
}

/* Does the cause resident_refusal_read() and _cause() give for a refusal
 * of err hold every one of the NULL-terminated words? Prints it either way. */
static int
cause_says(int err, uint64_t bytes, struct resident_refusal *r, ...)
{
	char cause[480];
	const char *word;
	va_list ap;
	int ok = 1;

	resident_refusal_read(err, bytes, r);
	resident_refusal_cause(r, cause, sizeof(cause));
	printf("# %s\n", cause);
	fflush(stdout); /* the child ends with _exit */
	va_start(ap, r);
	while ((word = va_arg(ap, const char *)) != NULL)
		if (strstr(cause, word) == NULL) {
			fprintf(stderr, "child: the cause lacks \"%s\": %s\n", word, cause);
			ok = 0;
		}
	va_end(ap);
	return ok;
}

/* The real refusals, told apart by what the process reads about itself:
 * RLIMIT_MEMLOCK 0 without CAP_IPC_LOCK (EPERM), then a limit smaller than
 * what is asked (ENOMEM, with the limit, the bytes and the LimitMEMLOCK=
 * that would do). */
static int
child_refusal_causes(void)
{
	size_t len = 1 * MiB;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct resident_refusal r;
	int err;

	if (p == MAP_FAILED || set_memlock(0, 4096) != 0)
		return CHILD_FAIL;
	if (drop_root() != 0)
		return CHILD_SKIP;
	err = resident_pin_range(p, len);
	if (err != -EPERM ||
		!cause_says(err, len, &r, "mlock: EPERM: RLIMIT_MEMLOCK is 0", "CAP_IPC_LOCK",
			"LimitMEMLOCK=", (const char *)NULL) ||
		!r.limit_known || r.limit != 0 || r.ipc_lock || !r.locked_known || r.locked != 0)
		return CHILD_FAIL;
	if (set_memlock(4096, 4096) != 0 || resident_pin_range(p, 4096) != 0)
		return CHILD_FAIL;
	/* One page is locked now: the limit is full. */
	err = resident_pin_range((char *)p + 4096, len - 4096);
	if (err != -ENOMEM ||
		!cause_says(err, len - 4096, &r, "mlock: ENOMEM: RLIMIT_MEMLOCK is 4096 bytes",
			"4096 bytes were locked and 1044480 more asked",
			"LimitMEMLOCK= in wcached.service (or ulimit -l) to at least 1M",
			(const char *)NULL) ||
		r.locked != 4096)
		return CHILD_FAIL;
	return CHILD_OK;
}

/* A seccomp filter that refuses mlock(2) with EPERM, as the unit's
 * SystemCallFilter= or a container's does: the cause names the filter and
 * clears RLIMIT_MEMLOCK, which is high enough. */
static int
child_seccomp_refuses(void)
{
	struct sock_filter code[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mlock, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(code) / sizeof(code[0]), .filter = code };
	void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct resident_refusal r;
	int err;

	if (p == MAP_FAILED || set_memlock(1 * MiB, 1 * MiB) != 0 ||
		prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
		prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
		return CHILD_FAIL;
	err = resident_pin_range(p, 65536);
	if (err != -EPERM ||
		!cause_says(err, 65536, &r, "mlock: EPERM: forbidden by a seccomp filter",
			"not by RLIMIT_MEMLOCK (1048576 bytes)", "@memlock", (const char *)NULL) ||
		r.seccomp != 2)
		return CHILD_FAIL;
	return CHILD_OK;
}

/* The causes no test process can provoke, from the facts alone. */
static void
test_refusal_causes(void **state)
{
	struct resident_refusal r = { .err = -ENOMEM, .bytes = 1 * MiB, .limit_known = 1,
		.limit = UINT64_MAX, .locked_known = 1, .seccomp = 2 };
	char cause[480];
	int st;

	(void)state;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "ENOMEM, not from RLIMIT_MEMLOCK (unlimited)"));
	r.limit = 8 * MiB; /* within the limit: not the limit either */
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "not from RLIMIT_MEMLOCK (8388608 bytes)"));
	r.limit = 4096;
	r.ipc_lock = 1; /* root: the limit does not apply */
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "not from RLIMIT_MEMLOCK (lifted by CAP_IPC_LOCK)"));
	r.err = -EPERM;
	r.limit = 0; /* EPERM with CAP_IPC_LOCK: not the limit but a filter */
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "EPERM: forbidden by a seccomp filter"));
	r.ipc_lock = 0;
	r.limit = 8 * MiB;
	r.seccomp = 0;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "no seccomp filter applies to wcached: a security module"));
	r.err = -EAGAIN;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "mlock: EAGAIN: part of the range could not be locked"));
	r.err = -EIO;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "mlock: errno 5: "));
	r.err = -ENOMEM;
	r.limit = 4096;
	r.locked_known = 0;
	resident_refusal_cause(&r, cause, sizeof(cause));
	assert_non_null(strstr(cause, "RLIMIT_MEMLOCK is 4096 bytes, 1048576 bytes asked"));
	resident_refusal_cause(&r, cause, 8); /* cut short, terminated */
	assert_string_equal(cause, "mlock: ");

	/* The real ones. */
	st = in_child(child_refusal_causes);
	if (st == CHILD_SKIP)
		printf("# skipped: could not drop root to refuse mlock by RLIMIT_MEMLOCK\n");
	else
		assert_int_equal(st, CHILD_OK);
	assert_int_equal(in_child(child_seccomp_refuses), CHILD_OK);
}

/* /proc/self/status's fields as the kernel writes them, and as it does
 * not: a sign, a value on the next line, none. A field that is not a
 * number where the kernel puts one leaves its member as it was. */
static void
test_status_fields(void **state)
{
	static const char real[] = "Name:\twcached\nVmLck:\t     128 kB\n"
		"CapEff:\t0000000000004000\nSeccomp:\t2\nSeccomp_filters:\t1\n";
	static const char odd[] = "VmLck:\n5 kB\nCapEff:\t-1\nSeccomp:\t-0\n";
	static const char next_line[] = "Seccomp:\n1\nCapEff:\n4000\n";
	struct resident_refusal r = { .seccomp = -1 };

	(void)state;
	assert_int_equal(resident_status_parse(real, sizeof(real) - 1, &r), 0);
	assert_int_equal(r.locked_known, 1);
	assert_int_equal(r.locked, 128 * 1024);
	assert_int_equal(r.ipc_lock, 1);
	assert_int_equal(r.seccomp, 2);
	memset(&r, 0, sizeof(r));
	r.seccomp = -1;
	assert_int_equal(resident_status_parse(odd, sizeof(odd) - 1, &r), 0);
	assert_int_equal(r.locked_known, 0);
	assert_int_equal(r.locked, 0);
	assert_int_equal(r.ipc_lock, 0);
	assert_int_equal(r.seccomp, -1);
	assert_int_equal(resident_status_parse(next_line, sizeof(next_line) - 1, &r), 0);
	assert_int_equal(r.ipc_lock, 0);
	assert_int_equal(r.seccomp, -1);
}

/* CapEff is read only as the kernel writes it (render_cap_t: 16 lowercase
 * hex digits, then the end of the line): a set with bit 14 in any other
 * spelling leaves ipc_lock 0, so a refusal's cause keeps the advice to
 * raise RLIMIT_MEMLOCK. */
static void
test_status_caps_as_the_kernel_writes_them(void **state)
{
	static const char *const yes[] = {
		"CapEff:\t0000000000004000\n", "CapEff:\t000001ffffffffff", /* no newline */
		"Name:\tx\nCapEff:\t0000000000004000\nCapEff:\t0000000000000000\n",
	};
	static const char *const no[] = {
		"CapEff:\t0x4000\n", "CapEff:\t0X4000\n", "CapEff:\t4000\n",
		"CapEff:\t00000000000004000\n", /* 17 digits */
		"CapEff:\t00000000000040FF\n", "CapEff:\t0000000000004000 \n",
		"CapEff:\t0000000000004000x\n", "CapEff:\t+000000000004000\n",
		"CapEff:\t000000000000400\n0\n", "CapEff:\n0000000000004000\n",
		"CapEff:\t0000000000000000\nCapEff:\t0000000000004000\n",
	};
	struct resident_refusal r;

	(void)state;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		memset(&r, 0, sizeof(r));
		assert_int_equal(resident_status_parse(yes[i], strlen(yes[i]), &r), 0);
		if (r.ipc_lock != 1)
			fail_msg("\"%s\": ipc_lock %d, expected 1", yes[i], r.ipc_lock);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		memset(&r, 0, sizeof(r));
		assert_int_equal(resident_status_parse(no[i], strlen(no[i]), &r), 0);
		if (r.ipc_lock != 0)
			fail_msg("\"%s\": ipc_lock %d, expected 0", no[i], r.ipc_lock);
	}
}

static void
test_pin(void **state)
{
	struct fixture *f = *state;
	size_t len = 64 * KiB;
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t n;
	struct rlimit rl;
	int st;

	assert_true(p != MAP_FAILED);
	assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
	if (geteuid() != 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < len)
		printf("# note: RLIMIT_MEMLOCK %llu < %zu; small pin not testable\n",
			(unsigned long long)rl.rlim_cur, len);
	else {
		assert_int_equal(resident_pin_range(p, len), 0);
		/* mlock faults the pages in. */
		assert_int_equal(resident_mincore_bytes(p, len, &n), 0);
		assert_int_equal(n, len);
		assert_int_equal(resident_unpin_range(p, len), 0);
	}
	/* An unaligned range is widened to whole pages, as mlock does. */
	assert_int_equal(resident_pin_range(p + 1, len - 1), 0);
	assert_int_equal(resident_unpin_range(p + 1, len - 1), 0);
	assert_int_equal(munmap(p, len), 0);

	/* A pinned file range of the big file. */
	make_big(f);
	if (geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= MiB) {
		assert_int_equal(resident_pin_range(f->big_map, MiB), 0);
		assert_int_equal(resident_mincore_bytes(f->big_map, MiB, &n), 0);
		assert_int_equal(n, MiB);
		assert_int_equal(resident_unpin_range(f->big_map, MiB), 0);
	}

	if (geteuid() == 0) {
		printf("# root: CAP_IPC_LOCK bypasses RLIMIT_MEMLOCK\n");
		assert_int_equal(in_child(child_root_ignores_limit), CHILD_OK);
	}
	st = in_child(child_limited);
	if (st == CHILD_SKIP)
		printf("# skipped: could not drop root to test RLIMIT_MEMLOCK\n");
	else
		assert_int_equal(st, CHILD_OK);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_resident_anonymous),
		cmocka_unit_test_setup_teardown(test_pin, setup, teardown),
		cmocka_unit_test(test_refusal_causes),
		cmocka_unit_test(test_status_fields),
		cmocka_unit_test(test_status_caps_as_the_kernel_writes_them),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
