/*
 * test_mountrule.c: mountrule_open/mountrule_stat walk a path as stat(2)
 * does where no user's FUSE mount is met (links relative and absolute,
 * "..", chains, loops, missing names, a name that is no directory), each
 * name looked up from the descriptor of the directory before it. The
 * refusal of a user's FUSE mount is tested with real mounts
 * (tests/integration/test_load_neighbour_paths.py: root and /dev/fuse).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include "mountrule.h"

static char dir[] = "/tmp/test_mountrule.XXXXXX";

static void
at(char *buf, size_t len, const char *rel)
{
	snprintf(buf, len, "%s/%s", dir, rel);
}

static void
make_link(const char *target, const char *rel)
{
	char p[PATH_MAX];

	at(p, sizeof(p), rel);
	assert_int_equal(symlink(target, p), 0);
}

/* mountrule_stat(DIR/rel) says what stat(2) says: the same file, or the
 * same errno. */
static void
same_as_stat(const char *rel)
{
	char p[PATH_MAX];
	struct stat a, b;
	int ra, ea, rb, eb;

	at(p, sizeof(p), rel);
	errno = 0;
	ra = stat(p, &a);
	ea = errno;
	errno = 0;
	rb = mountrule_stat(p, &b);
	eb = errno;
	assert_int_equal(rb, ra);
	if (ra == 0) {
		assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
	} else {
		assert_int_equal(eb, ea);
	}
}

static void
test_walks_as_stat(void **state)
{
	char p[PATH_MAX], why[64], rm[PATH_MAX + 16];
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	at(p, sizeof(p), "m");
	assert_int_equal(mkdir(p, 0755), 0);
	at(p, sizeof(p), "m/sub");
	assert_int_equal(mkdir(p, 0755), 0);
	at(p, sizeof(p), "m/sub/x.safetensors");
	assert_true((fd = open(p, O_CREAT | O_WRONLY, 0644)) >= 0);
	close(fd);
	make_link("sub/x.safetensors", "m/rel");
	make_link(p, "m/abs");
	make_link("../m/./sub/../rel", "m/chain");
	make_link("loop", "m/loop");
	make_link("gone", "m/dangling");
	make_link("sub", "m/dirlink");
	same_as_stat("m");
	same_as_stat("m/sub/x.safetensors");
	same_as_stat("m//sub/./x.safetensors");
	same_as_stat("m/sub/../sub/x.safetensors");
	same_as_stat("m/rel");
	same_as_stat("m/abs");
	same_as_stat("m/chain");
	same_as_stat("m/dirlink/x.safetensors");
	same_as_stat("m/loop");
	same_as_stat("m/dangling");
	same_as_stat("m/missing");
	same_as_stat("m/sub/x.safetensors/y");
	/* a relative path from the working directory */
	assert_int_equal(chdir(dir), 0);
	assert_true((fd = mountrule_open("m/chain", why, sizeof(why))) >= 0);
	close(fd);
	assert_int_equal(mountrule_open("m/missing", why, sizeof(why)), -ENOENT);
	assert_int_equal(chdir("/"), 0);
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_walks_as_stat),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
