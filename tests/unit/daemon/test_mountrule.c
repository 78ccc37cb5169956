/*
 * test_mountrule.c: mountrule_open/mountrule_stat walk a path as stat(2)
 * does where no user's FUSE mount is met (links relative and absolute,
 * "..", chains, loops, missing names, a name that is no directory), each
 * name looked up from the descriptor of the directory before it, alone
 * and in a run of walks (one mount table, a directory walked to once);
 * the crossings of a path counted alike alone and in a run (rev212 L1);
 * a run's budget of names and links (rev212 M2);
 * a run's crossings of mounts in a mount namespace of the test's own, and
 * a directory model's listing of many mounted names reading the mount
 * table once (review rev208 M3); mountrule_realpath's name for what the
 * walk reached (a link chain as realpath(3) says it; a removed directory,
 * a name past PATH_MAX and a refused walk: NULL); a walk by hand
 * (mountrule_hand_*: links followed, its spelling of where it is). The
 * refusal of a user's FUSE mount is tested with real mounts
 * (tests/integration/test_load_neighbour_paths.py: root and /dev/fuse).
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
#include <unistd.h>
#include <cmocka.h>
#include "format/shards.h"
#include "mountrule.h"

static char dir[] = "/tmp/test_mountrule.XXXXXX";

/* syscall() while no_statmount is set fails (ENOSYS), as a kernel before
 * statmount(2) (Linux 6.8) does: mountrule's check that a descriptor's
 * mount is attached then reads the mount table (its only syscall() there
 * is statmount's); syscalls counts the calls. */
long __real_syscall(long n, ...);
long __wrap_syscall(long n, ...);
static int no_statmount, syscalls;

long
__wrap_syscall(long n, ...)
{
	long a[5];
	va_list ap;

	syscalls++;
	if (no_statmount) {
		errno = ENOSYS;
		return -1;
	}
	va_start(ap, n);
	for (int i = 0; i < 5; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	return __real_syscall(n, a[0], a[1], a[2], a[3], a[4]);
}

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

/* DIR/rel made: a directory (make_dir), an empty file (make_file). */
static void
make_dir(const char *rel)
{
	char p[PATH_MAX];

	at(p, sizeof(p), rel);
	assert_int_equal(mkdir(p, 0755), 0);
}

static void
make_file(const char *rel)
{
	char p[PATH_MAX];
	int fd;

	at(p, sizeof(p), rel);
	assert_true((fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) >= 0);
	close(fd);
}

/* The run of walks same_as_stat's walks are part of, or NULL. */
static struct mountrule_walk *run;

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
	rb = mountrule_stat(run, p, &b, NULL, 0);
	eb = errno;
	assert_int_equal(rb, ra);
	if (ra == 0) {
		assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
	} else {
		assert_int_equal(eb, ea);
	}
}

/* Each path same_as_stat is asked about in test_walks_as_stat. */
static void
all_as_stat(void)
{
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
	same_as_stat("m/sub/x.safetensors/..");
	same_as_stat("m/sub/x.safetensors/.");
	same_as_stat("m/rel/.");
	same_as_stat("/");
	same_as_stat("m/sub/..");
	same_as_stat("m/sub/.");
	same_as_stat("m/missing/x");
	same_as_stat("m/dirlink/../rel");
	same_as_stat("m/long");
}

/* head, "./" times times, then tail: in buf (cap bytes, cut to fit). */
static void
dots(char *buf, size_t cap, const char *head, int times, const char *tail)
{
	size_t n = (size_t)snprintf(buf, cap, "%s", head);

	for (int i = 0; i < times && n + 2 < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "./");
	snprintf(buf + n, cap - n, "%s", tail);
}

/*
 * A chain of links the kernel follows whose text, spliced, outgrows two
 * PATH_MAX (rev207 H2: the walk said ENAMETOOLONG, and the load then
 * went on by name to where it led): m/long -> A/./.../sub/x.safetensors
 * (4000-odd bytes), A -> A2/./.../. (as long), A2 -> ./././. (40 bytes).
 */
static void
long_chain(void)
{
	char a[PATH_MAX], l[PATH_MAX], a2[64];

	dots(a2, sizeof(a2), "", 19, ".");
	dots(a, PATH_MAX, "A2/", 2040, ".");
	dots(l, PATH_MAX, "A/", 2036, "sub/x.safetensors");
	assert_int_equal(strlen(a2), 39);
	assert_int_equal(strlen(a), 4084);
	assert_int_equal(strlen(l), 4091);
	make_link(a2, "m/A2");
	make_link(a, "m/A");
	make_link(l, "m/long");
}

/* mountrule_stat(path) is refused (EXDEV), naming the link on /proc. */
static void
refused_on_proc(struct mountrule_walk *w, const char *path, const char *name)
{
	char why[MOUNTRULE_WHY], want[64];
	struct stat st;

	errno = 0;
	assert_int_equal(mountrule_stat(w, path, &st, why, sizeof(why)), -1);
	assert_int_equal(errno, EXDEV);
	snprintf(want, sizeof(want), ": %s is a link on /proc (device ", name);
	assert_non_null(strstr(why, want));
	assert_int_equal(strncmp(why, path, strlen(path)), 0);
}

/*
 * No link on procfs is followed (rev207 H3): m/fdlink -> /proc/PID/fd/N,
 * N a descriptor of this process (a neighbour's of his detached FUSE file
 * reads "/", where the kernel goes to that file), was walked as its text;
 * /proc/self and /dev/stdin go the same way. Alone and in a run.
 */
static void
proc_links(void)
{
	char p[PATH_MAX], target[64], name[16];
	struct mountrule_walk w;
	int fd;

	at(p, sizeof(p), "m/sub/x.safetensors");
	assert_true((fd = open(p, O_RDONLY | O_CLOEXEC)) >= 0);
	snprintf(target, sizeof(target), "/proc/%d/fd/%d", (int)getpid(), fd);
	snprintf(name, sizeof(name), "%d", fd);
	make_link(target, "m/fdlink");
	at(p, sizeof(p), "m/fdlink");
	mountrule_walk_init(&w);
	for (int i = 0; i < 2; i++) {
		refused_on_proc(i == 0 ? NULL : &w, p, name);
		refused_on_proc(i == 0 ? NULL : &w, "/proc/self/status", "self");
		refused_on_proc(i == 0 ? NULL : &w, "/dev/stdin", "self");
	}
	mountrule_walk_end(&w);
	close(fd);
}

/* mountrule_stat(DIR/rel) in a run of budget max_steps names and
 * max_links links: 0 (the same file as stat(2)'s) or -ELOOP; the run's
 * count of names and links after it. */
static int
in_budget(const char *rel, long max_steps, int max_links, long *steps, int *links)
{
	char p[PATH_MAX], why[MOUNTRULE_WHY];
	struct mountrule_walk w;
	struct stat a, b;
	int r;

	at(p, sizeof(p), rel);
	mountrule_walk_init(&w);
	w.max_steps = max_steps;
	w.max_links = max_links;
	errno = 0;
	if ((r = mountrule_stat(&w, p, &b, why, sizeof(why))) == 0) {
		assert_int_equal(stat(p, &a), 0);
		assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
		assert_false(w.spent);
	} else {
		assert_int_equal(errno, ELOOP);
		assert_true(w.spent);
		r = -ELOOP;
		/* spent: the run walks no more, not even "/" */
		assert_int_equal(mountrule_open(&w, "/", why, sizeof(why)), -ELOOP);
	}
	*steps = w.steps;
	*links = w.links;
	mountrule_walk_end(&w);
	return r;
}

/*
 * A run's budget (rev212 M2: an operator's load's look at a place, many
 * walks, each within its own 40 links, took minutes): the names its walks
 * look up and the links they follow are counted, and a walk past either
 * ends with ELOOP, as every walk after it. m/chain follows 2 links.
 */
static void
budget(void)
{
	long steps, all;
	int links;

	assert_int_equal(in_budget("m/sub/x.safetensors", 0, 0, &all, &links), 0);
	assert_true(all >= 3);
	assert_int_equal(links, 0);
	assert_int_equal(in_budget("m/sub/x.safetensors", all, 0, &steps, &links), 0);
	assert_int_equal(steps, all);
	assert_int_equal(in_budget("m/sub/x.safetensors", all - 1, 0, &steps, &links), -ELOOP);
	assert_int_equal(steps, all - 1);
	assert_int_equal(in_budget("m/chain", 0, 2, &steps, &links), 0);
	assert_int_equal(links, 2);
	assert_int_equal(in_budget("m/chain", 0, 1, &steps, &links), -ELOOP);
	assert_int_equal(links, 1);
}

/* /proc/.. n times, then DIR: 2n mounts crossed (procfs and back). */
static void
bounce(char *buf, size_t cap, int n)
{
	size_t at = 0;

	for (int i = 0; i < n && at + 10 < cap; i++)
		at += (size_t)snprintf(buf + at, cap - at, "/proc/..");
	snprintf(buf + at, cap - at, "%s", dir);
}

/*
 * One walk crosses 64 mounts at the most (rev207 H4: a neighbour's links
 * of "/proc/.." made one cross 40,000, each judged): a path of 60
 * crossings is stat(2)'s, one of 66 is refused, naming the path.
 */
static void
crossings(void)
{
	char p[PATH_MAX], why[MOUNTRULE_WHY];
	struct stat a, b;

	bounce(p, sizeof(p), 30);
	assert_int_equal(stat(p, &a), 0);
	assert_int_equal(mountrule_stat(NULL, p, &b, why, sizeof(why)), 0);
	assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
	bounce(p, sizeof(p), 33);
	errno = 0;
	assert_int_equal(mountrule_stat(NULL, p, &b, why, sizeof(why)), -1);
	assert_int_equal(errno, EXDEV);
	assert_int_equal(strncmp(why, p, strlen(p)), 0);
	assert_non_null(strstr(why, ": the walk crossed more than 64 mounts"));
}

/*
 * A run counts a path's crossings as the walk of its own does (rev212 L1:
 * its walk to the path's directory and that of its last name counted 64
 * each, and an operator's load's look at the place judged a place beyond
 * the cap the load's own walk refused at): the link m/cl<n> -> /proc/..
 * n times then DIR/m, at the end of a path that bounces 31 times (62
 * crossings to its directory), is refused in a run, twice (the directory
 * walked to kept with its crossings), as alone, for n 2 and 3 (66 and 68
 * crossings at least); n 1 says the same alone and in a run.
 */
static void
crossings_in_run(void)
{
	char p[PATH_MAX], target[PATH_MAX], rel[16], why[MOUNTRULE_WHY];
	struct mountrule_walk w;
	struct stat a, b;
	int ra, rb;
	size_t k;

	for (int n = 1; n <= 3; n++) {
		bounce(target, sizeof(target), n);
		k = strlen(target);
		snprintf(target + k, sizeof(target) - k, "/m");
		snprintf(rel, sizeof(rel), "m/cl%d", n);
		make_link(target, rel);
		bounce(p, sizeof(p), 31);
		k = strlen(p);
		snprintf(p + k, sizeof(p) - k, "/%s", rel);
		ra = mountrule_stat(NULL, p, &a, why, sizeof(why));
		assert_true(n == 1 || ra == -1);
		mountrule_walk_init(&w);
		for (int i = 0; i < 2; i++) {
			errno = 0;
			rb = mountrule_stat(&w, p, &b, why, sizeof(why));
			assert_int_equal(rb, ra);
			if (rb == 0)
				continue;
			assert_int_equal(errno, EXDEV);
			assert_non_null(strstr(why, ": the walk crossed more than 64 mounts"));
		}
		mountrule_walk_end(&w);
	}
}

/* A walk of path by hand (mountrule_hand_*, as registry_links.c and
 * stage_dir.c walk), each link followed: it ends at what stat(2) finds,
 * its spelling where; the filesystem of the directory it starts from is
 * told. */
static void
hand_walk_to(const char *path, const char *where)
{
	struct fs_info fs = { .name = "" };
	struct mountrule_hand h = { .path = path, .fs = &fs };
	char name[NAME_MAX + 1], text[PATH_MAX + 1], why[MOUNTRULE_WHY];
	struct stat a, b;
	dev_t dev;
	ssize_t n;
	int fd, r;

	assert_int_equal(mountrule_hand_start(&h), 0);
	assert_true(fs.name[0] != '\0');
	while ((r = mountrule_hand_next(&h, name)) > 0) {
		fd = mountrule_hand_open(&h, name, &dev, NULL, why, sizeof(why));
		assert_true(fd >= 0);
		assert_int_equal(fstat(fd, &a), 0);
		if (!S_ISLNK(a.st_mode)) {
			mountrule_hand_into(&h, fd, dev, name);
			continue;
		}
		assert_true((n = readlinkat(fd, "", text, PATH_MAX)) > 0);
		close(fd);
		text[n] = '\0';
		assert_int_equal(mountrule_hand_follow(&h, text), 0);
	}
	assert_int_equal(r, 0);
	assert_string_equal(h.where, where);
	assert_int_equal(fstat(h.dir, &a), 0);
	assert_int_equal(stat(path, &b), 0);
	assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
	mountrule_hand_end(&h);
}

/* Walks by hand: links relative (through "..") and absolute, "." and
 * "..", spelled from "/" and from the working directory ("", ".." added
 * above it); the filesystem of a mount crossed given (procfs), none where
 * a name is on its directory's mount. */
static void
hand_walks(void)
{
	struct fs_info fs = { .name = "" }, on = { .name = "none" };
	struct mountrule_hand h = { .path = "/proc/self", .fs = &fs };
	char p[PATH_MAX], x[PATH_MAX], name[NAME_MAX + 1], why[MOUNTRULE_WHY];
	dev_t dev;
	int fd;

	at(x, sizeof(x), "m/sub/x.safetensors");
	at(p, sizeof(p), "m/chain");
	hand_walk_to(p, x);
	at(p, sizeof(p), "m/dirlink/../abs");
	hand_walk_to(p, x);
	at(p, sizeof(p), "m/./sub/..");
	at(x, sizeof(x), "m");
	hand_walk_to(p, x);
	hand_walk_to("/..", "/");
	assert_int_equal(chdir(dir), 0);
	hand_walk_to("m/dirlink", "m/sub");
	hand_walk_to("m/../..", "..");
	hand_walk_to("m/../../..", "../..");
	assert_int_equal(chdir("/"), 0);
	assert_int_equal(mountrule_hand_start(&h), 0);
	assert_int_equal(mountrule_hand_next(&h, name), 1);
	assert_true((fd = mountrule_hand_open(&h, name, &dev, &on, why, sizeof(why))) >= 0);
	assert_string_equal(on.name, "proc");
	mountrule_hand_into(&h, fd, dev, name);
	snprintf(on.name, sizeof(on.name), "none");
	assert_int_equal(mountrule_hand_next(&h, name), 1);
	assert_true((fd = mountrule_hand_open(&h, name, &dev, &on, why, sizeof(why))) >= 0);
	assert_string_equal(on.name, "none");
	close(fd);
	mountrule_hand_end(&h);
}

static void
test_walks_as_stat(void **state)
{
	char p[PATH_MAX], why[64], rm[PATH_MAX + 16];
	struct mountrule_walk w;
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	make_dir("m");
	make_dir("m/sub");
	make_file("m/sub/x.safetensors");
	at(p, sizeof(p), "m/sub/x.safetensors");
	make_link("sub/x.safetensors", "m/rel");
	make_link(p, "m/abs");
	make_link("../m/./sub/../rel", "m/chain");
	make_link("loop", "m/loop");
	make_link("gone", "m/dangling");
	make_link("sub", "m/dirlink");
	long_chain();
	all_as_stat();
	/* The same in one run, twice: each directory walked to once serves
	 * the paths in it after. */
	mountrule_walk_init(&w);
	run = &w;
	all_as_stat();
	all_as_stat();
	run = NULL;
	mountrule_walk_end(&w);
	mountrule_walk_end(&w);
	/* a relative path from the working directory, alone and in a run */
	assert_int_equal(chdir(dir), 0);
	assert_true((fd = mountrule_open(NULL, "m/chain", why, sizeof(why))) >= 0);
	close(fd);
	assert_int_equal(mountrule_open(NULL, "m/missing", why, sizeof(why)), -ENOENT);
	mountrule_walk_init(&w);
	for (int i = 0; i < 2; i++) {
		assert_true((fd = mountrule_open(&w, "m/chain", why, sizeof(why))) >= 0);
		close(fd);
		assert_int_equal(mountrule_open(&w, "m/missing", why, sizeof(why)), -ENOENT);
		assert_int_equal(mountrule_open(&w, "m/loop", why, sizeof(why)), -ELOOP);
	}
	assert_string_equal(w.dir, "m");
	mountrule_walk_end(&w);
	assert_int_equal(chdir("/"), 0);
	hand_walks();
	proc_links();
	crossings();
	crossings_in_run();
	budget();
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

#define SHARDS 163

/* A mount namespace of the test's own (root; false elsewhere), and a new
 * DIR made in it. */
static bool
own_namespace(void)
{
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		return false;
	strcpy(dir, "/tmp/test_mountrule.XXXXXX");
	assert_non_null(mkdtemp(dir));
	return true;
}

/*
 * A run of walks across mounts, in a mount namespace of the test's own
 * (root; skipped elsewhere): 163 shards on a tmpfs of their own (a model
 * on a volume: each walk from "/" crosses its mount) stat'ed in one run
 * are what stat(2) says, the mount table read once and their directory
 * walked to once; a mount made during the run, crossed next, is judged
 * from the table read again (the kernel said it changed).
 */
static void
test_run_across_mounts(void **state)
{
	char p[PATH_MAX], rm[PATH_MAX + 16], want[PATH_MAX], name[32], why[MOUNTRULE_WHY];
	struct mountrule_walk w;
	struct stat st;
	int fd;

	(void)state;
	if (!own_namespace())
		skip();
	at(p, sizeof(p), "vol");
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(mount("vol", p, "tmpfs", 0, "size=1m"), 0);
	at(p, sizeof(p), "vol/m");
	assert_int_equal(mkdir(p, 0755), 0);
	for (int i = 0; i < SHARDS; i++) {
		snprintf(name, sizeof(name), "vol/m/shard-%03d", i);
		at(p, sizeof(p), name);
		assert_true((fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) >= 0);
		close(fd);
	}
	at(p, sizeof(p), "vol2");
	assert_int_equal(mkdir(p, 0755), 0);
	mountrule_walk_init(&w);
	run = &w;
	same_as_stat("vol/m");
	for (int i = 0; i < SHARDS; i++) {
		snprintf(name, sizeof(name), "vol/m/shard-%03d", i);
		same_as_stat(name);
	}
	at(want, sizeof(want), "vol/m");
	assert_string_equal(w.dir, want);
	assert_int_equal(w.table.reads, 1);
	at(p, sizeof(p), "vol2");
	assert_int_equal(mount("vol2", p, "tmpfs", 0, "size=1m"), 0);
	at(p, sizeof(p), "vol2/x");
	assert_true((fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) >= 0);
	close(fd);
	same_as_stat("vol2/x");
	assert_int_equal(w.table.reads, 2);
	same_as_stat("vol/m/shard-000");
	assert_int_equal(w.table.reads, 2);
	run = NULL;
	mountrule_walk_end(&w);
	/* A mount the table cannot judge (it cannot be read: EMFILE, or no
	 * procfs) is not walked onto (rev207 M1: it was, as no user's). */
	for (int i = 0; i < 2; i++) {
		mountrule_walk_init(&w);
		w.table.mountinfo = i == 0 ? "/nonexistent/mountinfo" : "/dev/null/mountinfo";
		at(p, sizeof(p), "vol/m/shard-000");
		errno = 0;
		assert_int_equal(mountrule_stat(&w, p, &st, why, sizeof(why)), -1);
		assert_int_equal(errno, EXDEV);
		assert_non_null(strstr(why, ": vol lies on device "));
		assert_non_null(strstr(why, "cannot tell"));
		mountrule_walk_end(&w);
	}
	at(p, sizeof(p), "vol2");
	assert_int_equal(umount(p), 0);
	at(p, sizeof(p), "vol");
	assert_int_equal(umount(p), 0);
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

#define NAMES 8

/* wcached's name rule (mountrule_install), its listing's table's reads
 * kept by its end (names_reads), and how many listings ended. */
static const struct shards_name_rule *wcached_rule;
static unsigned names_reads;
static int names_runs;

static int
names_judge(void **r, int dfd, const char *name, char *why, size_t len)
{
	return wcached_rule->judge(r, dfd, name, why, len);
}

static void
names_end(void *r)
{
	names_reads = ((struct fs_table *)r)->reads; /* mountrule.c's run */
	names_runs++;
	wcached_rule->end(r);
}

static const struct shards_name_rule counted = { names_judge, names_end };

/*
 * A directory model's listing (shards_find_model under wcached's name
 * rule) in a 1777 directory where a neighbour mounted a filesystem on each
 * of NAMES names (root, in a mount namespace of the test's own; skipped
 * elsewhere): the mount table is read once for the listing, not once per
 * mounted name (review rev208 M3: N of them made a listing N whole reads
 * of an N-line table, quadratic). tmpfs is local: the names are taken,
 * and the model is the index.
 */
static void
test_listing_reads_once(void **state)
{
	char p[PATH_MAX], rm[PATH_MAX + 16], want[PATH_MAX], name[48];
	char *found = NULL;
	bool is_index = false;
	int fd;

	(void)state;
	if (!own_namespace())
		skip();
	assert_int_equal(chmod(dir, 01777), 0);
	at(p, sizeof(p), "model.safetensors.index.json");
	assert_true((fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) >= 0);
	close(fd);
	for (int i = 0; i < NAMES; i++) {
		snprintf(name, sizeof(name), "b%d.safetensors", i);
		at(p, sizeof(p), name);
		assert_int_equal(mkdir(p, 0755), 0);
		assert_int_equal(mount("bob", p, "tmpfs", 0, "size=4k"), 0);
	}
	mountrule_install();
	wcached_rule = shards_name_rule;
	shards_name_rule = &counted;
	for (int listing = 1; listing <= 2; listing++) {
		assert_int_equal(shards_find_model(dir, &found, &is_index), 0);
		at(want, sizeof(want), "model.safetensors.index.json");
		assert_string_equal(found, want);
		assert_true(is_index);
		free(found);
		assert_int_equal(names_runs, listing);
		assert_int_equal(names_reads, 1);
	}
	shards_name_rule = wcached_rule;
	for (int i = 0; i < NAMES; i++) {
		snprintf(name, sizeof(name), "b%d.safetensors", i);
		at(p, sizeof(p), name);
		assert_int_equal(umount(p), 0);
	}
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

/* mountrule_realpath(DIR/rel) is realpath(3)'s answer, in the run w. */
static void
real_as_realpath(struct mountrule_walk *w, const char *rel)
{
	char p[PATH_MAX], why[MOUNTRULE_WHY];
	char *want, *got;

	at(p, sizeof(p), rel);
	assert_non_null(want = realpath(p, NULL));
	got = mountrule_realpath(w, p, why, sizeof(why));
	assert_non_null(got);
	assert_string_equal(got, want);
	free(got);
	free(want);
}

/*
 * mountrule_realpath: a chain of links (relative, absolute, "..", a link
 * to a directory on the way) named as realpath(3) names it, alone and in
 * a run; a missing name and a loop fail as the walk does; a directory
 * removed while held (mountrule_fd_name: the path it was removed from,
 * said removed), a file whose own name ends " (deleted)" (the kernel
 * says so of a removed one: not told apart) and a directory whose name
 * is PATH_MAX bytes or more have none; as root, in a mount namespace of
 * the test's own, a walk refused at a mount (a table that cannot be read)
 * gives none, EXDEV, its why.
 */
static void
test_realpath(void **state)
{
	char p[PATH_MAX], abs[PATH_MAX], rm[PATH_MAX + 16], why[MOUNTRULE_WHY], name[NAME_MAX + 1];
	struct mountrule_walk w;
	bool removed = false;
	char *r;
	int fd, deep;

	(void)state;
	strcpy(dir, "/tmp/test_mountrule.XXXXXX");
	assert_non_null(mkdtemp(dir));
	make_dir("real");
	make_dir("real/sub");
	make_file("real/sub/m.safetensors");
	at(abs, sizeof(abs), "real/sub");
	make_link(abs, "l3");                   /* absolute, to a directory */
	make_link("l3/m.safetensors", "l2");    /* through a link */
	make_link("real/../l2", "l1");          /* ".." on the way */
	make_link("l1", "m.safetensors");
	make_link("loop", "loop");
	real_as_realpath(NULL, "m.safetensors");
	real_as_realpath(NULL, "l3");
	real_as_realpath(NULL, "l3/../sub/./m.safetensors");
	mountrule_walk_init(&w);
	real_as_realpath(&w, "m.safetensors");
	real_as_realpath(&w, "l2");
	mountrule_walk_end(&w);
	at(p, sizeof(p), "missing");
	errno = 0;
	assert_null(mountrule_realpath(NULL, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(why, "missing"));
	at(p, sizeof(p), "loop");
	errno = 0;
	assert_null(mountrule_realpath(NULL, p, NULL, 0));
	assert_int_equal(errno, ELOOP);
	/* A directory removed while its descriptor is held. */
	at(p, sizeof(p), "gone");
	assert_int_equal(mkdir(p, 0755), 0);
	assert_true((fd = mountrule_open(NULL, p, why, sizeof(why))) >= 0);
	assert_non_null(r = mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_string_equal(r, p);
	free(r);
	removed = true;
	assert_non_null(r = mountrule_fd_name(NULL, fd, p, &removed, why, sizeof(why)));
	assert_string_equal(r, p);
	assert_false(removed);
	free(r);
	assert_int_equal(rmdir(p), 0);
	errno = 0;
	assert_null(mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(why, " (deleted)"));
	/* mountrule_fd_name: the path it was removed from, said so. */
	assert_non_null(r = mountrule_fd_name(NULL, fd, p, &removed, why, sizeof(why)));
	assert_string_equal(r, p);
	assert_true(removed);
	free(r);
	close(fd);
	make_file("x (deleted)");
	at(p, sizeof(p), "x (deleted)");
	errno = 0;
	assert_null(mountrule_realpath(NULL, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	/* A directory whose real path is PATH_MAX bytes or more: made and
	 * held by descriptor, name by name (no path names it). */
	memset(name, 'd', NAME_MAX);
	name[NAME_MAX] = '\0';
	assert_true((deep = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);
	for (int i = 0; i < PATH_MAX / NAME_MAX + 1; i++) {
		assert_int_equal(mkdirat(deep, name, 0755), 0);
		assert_true((fd = openat(deep, name, O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0);
		close(deep);
		deep = fd;
	}
	errno = 0;
	assert_null(mountrule_fd_realpath(NULL, deep, "deep", why, sizeof(why)));
	assert_int_equal(errno, ENAMETOOLONG);
	assert_non_null(strstr(why, "deep: its real path is 4096 bytes or more"));
	close(deep);
	/* A walk refused at a mount: none, EXDEV, the walk's why. */
	if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0) {
		make_dir("vol");
		at(p, sizeof(p), "vol");
		assert_int_equal(mount("vol", p, "tmpfs", 0, "size=1m"), 0);
		make_file("vol/f");
		at(p, sizeof(p), "vol/f");
		mountrule_walk_init(&w);
		real_as_realpath(&w, "vol/f");
		mountrule_walk_end(&w);
		mountrule_walk_init(&w);
		w.table.mountinfo = "/nonexistent/mountinfo";
		errno = 0;
		assert_null(mountrule_realpath(&w, p, why, sizeof(why)));
		assert_int_equal(errno, EXDEV);
		assert_non_null(strstr(why, ": vol lies on device "));
		mountrule_walk_end(&w);
		at(p, sizeof(p), "vol");
		assert_int_equal(umount(p), 0);
	}
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

/* A test's mount namespace of its own (root only: else skipped), and dir
 * a new directory. */
static void
in_own_namespace(void)
{
	if (geteuid() != 0)
		skip(); /* mounts: root's */
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
		print_message("no mount namespace of the test's own (%s): skipped\n",
			strerror(errno));
		skip();
	}
	strcpy(dir, "/tmp/test_mountrule.XXXXXX");
	assert_non_null(mkdtemp(dir));
}

/* The kernel's name of descriptor fd (readlink of /proc/self/fd/N). */
static void
kernel_name(int fd, char *name, size_t len)
{
	char link[32];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	assert_true((n = readlink(link, name, len - 1)) > 0);
	name[n] = '\0';
}

/*
 * A file whose mount is detached (umount -l) after its walk: the kernel
 * names it from that mount's own root ("/llama/model.safetensors"), a
 * path of this root that is not the file; mountrule_fd_realpath and
 * mountrule_fd_name give none, ENOENT, alone and in a run whose table was
 * read while the mount was there (review rev215 L1: that name was taken
 * for its real path); by statmount(2) and by the mount table alone (a
 * kernel without statmount); nor mountrule_fd_name a file removed from
 * it (its name not walked: the mount's check alone refuses it). As root,
 * in a mount namespace of the test's own.
 */
static void
test_realpath_detached(void **state)
{
	char p[PATH_MAX], vol[PATH_MAX], rm[PATH_MAX + 16], why[MOUNTRULE_WHY], name[PATH_MAX];
	char again[PATH_MAX];
	struct mountrule_walk w;
	bool removed = true;
	char *r;
	int fd, in_run, gone;

	(void)state;
	in_own_namespace();
	make_dir("vol");
	at(vol, sizeof(vol), "vol");
	assert_int_equal(mount("vol", vol, "tmpfs", 0, "size=1m"), 0);
	make_dir("vol/llama");
	make_file("vol/llama/model.safetensors");
	make_file("vol/llama/old.safetensors");
	at(p, sizeof(p), "vol/llama/old.safetensors");
	assert_true((gone = mountrule_open(NULL, p, why, sizeof(why))) >= 0);
	assert_int_equal(unlink(p), 0);
	at(p, sizeof(p), "vol/llama/model.safetensors");
	assert_true((fd = mountrule_open(NULL, p, why, sizeof(why))) >= 0);
	mountrule_walk_init(&w);
	assert_true((in_run = mountrule_open(&w, p, why, sizeof(why))) >= 0);
	assert_non_null(r = mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_string_equal(r, p);
	free(r);
	assert_non_null(r = mountrule_fd_realpath(&w, in_run, p, why, sizeof(why)));
	assert_string_equal(r, p);
	free(r);
	/* Told by the mount table alone (no statmount), too. */
	no_statmount = 1;
	assert_non_null(r = mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_string_equal(r, p);
	free(r);
	no_statmount = 0;
	/* The same filesystem mounted again elsewhere, as another mount
	 * namespace's copy of it is (review rev217 M1). */
	make_dir("again");
	at(again, sizeof(again), "again");
	assert_int_equal(mount(vol, again, NULL, MS_BIND, NULL), 0);
	assert_int_equal(umount2(vol, MNT_DETACH), 0);
	/* What the kernel says of it now: a "/..." name that is not it. */
	kernel_name(fd, name, sizeof(name));
	print_message("rev215 L1: detached, /proc/self/fd names it %s\n", name);
	assert_string_equal(name, "/llama/model.safetensors");
	errno = 0;
	r = mountrule_fd_realpath(NULL, fd, p, why, sizeof(why));
	assert_null(r);
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(why, "on a mount gone from /proc/self/mountinfo (detached"));
	errno = 0;
	syscalls = 0;
	assert_null(mountrule_fd_realpath(&w, in_run, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	print_message("statmount asked %d time(s) (0 where statx gives no unique mount ID)\n",
		syscalls);
	no_statmount = 1;
	errno = 0;
	assert_null(mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	no_statmount = 0;
	errno = 0;
	assert_null(mountrule_fd_name(&w, in_run, p, &removed, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	/* A file removed from the detached mount: its name is not walked (a
	 * removed file is at no name), and the kernel's, from that mount's
	 * root, is no path it was removed from here: the mount's check alone
	 * refuses it (with it off, "/llama/old.safetensors" was given). */
	kernel_name(gone, name, sizeof(name));
	assert_string_equal(name, "/llama/old.safetensors (deleted)");
	errno = 0;
	assert_null(mountrule_fd_name(NULL, gone, p, &removed, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(why, "on a mount gone from /proc/self/mountinfo (detached"));
	close(gone);
	/* Found by identity under a directory of this namespace: the
	 * kernel's last names, walked there, reach the very file. */
	assert_non_null(r = mountrule_fd_under(NULL, fd, again, 2));
	at(p, sizeof(p), "again/llama/model.safetensors");
	assert_string_equal(r, p);
	free(r);
	assert_non_null(r = mountrule_fd_under(&w, in_run, again, 2));
	assert_string_equal(r, p);
	free(r);
	/* Another file at that name, or none: not taken. */
	make_dir("other");
	make_dir("other/llama");
	make_file("other/llama/model.safetensors");
	at(p, sizeof(p), "other");
	errno = 0;
	assert_null(mountrule_fd_under(NULL, fd, p, 2));
	assert_int_equal(errno, ESTALE);
	at(p, sizeof(p), "again/llama");
	errno = 0;
	assert_null(mountrule_fd_under(NULL, fd, p, 2));
	assert_int_equal(errno, ENOENT);
	errno = 0;
	assert_null(mountrule_fd_under(NULL, fd, again, 3)); /* "/llama/...": 2 names */
	assert_int_equal(errno, ENOENT);
	mountrule_walk_end(&w); /* its directory is again/llama's */
	assert_int_equal(umount(again), 0);
	close(in_run);
	close(fd);
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

/*
 * A file and its directory reached through a bind mount of a
 * subdirectory (team/ of a filesystem, on m/), then moved out of that
 * subdirectory by someone who may rename in the filesystem: the mount is
 * attached, and the kernel names both "/". That was taken as their real
 * path (review rev217 M3); now a name is taken only where a walk of it
 * reaches the descriptor's own file: ENOENT, why saying so, alone and in
 * a run. As root, in a mount namespace of the test's own.
 */
static void
test_realpath_moved_out_of_a_bind_mount(void **state)
{
	char p[PATH_MAX], d[PATH_MAX], fs[PATH_MAX], m[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
	char rm[PATH_MAX + 16], why[MOUNTRULE_WHY], name[PATH_MAX];
	struct mountrule_walk w;
	char *r;
	int fd, dfd, in_run;

	(void)state;
	in_own_namespace();
	make_dir("fs");
	make_dir("m");
	at(fs, sizeof(fs), "fs");
	at(m, sizeof(m), "m");
	assert_int_equal(mount("fs", fs, "tmpfs", 0, "size=1m"), 0);
	make_dir("fs/team");
	make_dir("fs/team/llama");
	make_dir("fs/other");
	make_file("fs/team/llama/model.safetensors");
	at(p, sizeof(p), "fs/team");
	assert_int_equal(mount(p, m, NULL, MS_BIND, NULL), 0);
	at(p, sizeof(p), "m/llama/model.safetensors");
	at(d, sizeof(d), "m/llama");
	assert_true((fd = mountrule_open(NULL, p, why, sizeof(why))) >= 0);
	assert_true((dfd = mountrule_open(NULL, d, why, sizeof(why))) >= 0);
	mountrule_walk_init(&w);
	assert_true((in_run = mountrule_open(&w, p, why, sizeof(why))) >= 0);
	assert_non_null(r = mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_string_equal(r, p);
	free(r);
	assert_non_null(r = mountrule_fd_realpath(NULL, dfd, d, why, sizeof(why)));
	assert_string_equal(r, d);
	free(r);
	at(a, sizeof(a), "fs/team/llama");
	at(b, sizeof(b), "fs/other/llama");
	assert_int_equal(rename(a, b), 0);
	kernel_name(fd, name, sizeof(name));
	print_message("rev217 M3: moved out of the bind's subtree, /proc/self/fd names it %s\n",
		name);
	assert_string_equal(name, "/");
	errno = 0;
	assert_null(mountrule_fd_realpath(NULL, fd, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(why, "the kernel names the file the walk reached /, and a walk "
		"of that name reaches another file"));
	errno = 0;
	assert_null(mountrule_fd_realpath(NULL, dfd, d, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	errno = 0;
	assert_null(mountrule_fd_realpath(&w, in_run, p, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	errno = 0;
	assert_null(mountrule_fd_name(&w, in_run, p, NULL, why, sizeof(why)));
	assert_int_equal(errno, ENOENT);
	/* "/" has no last name to look for anywhere. */
	errno = 0;
	assert_null(mountrule_fd_under(NULL, fd, b, 1));
	assert_int_equal(errno, ENOENT);
	mountrule_walk_end(&w);
	close(in_run);
	close(dfd);
	close(fd);
	assert_int_equal(umount(m), 0);
	assert_int_equal(umount(fs), 0);
	snprintf(rm, sizeof(rm), "rm -rf %s", dir);
	assert_int_equal(system(rm), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_walks_as_stat),
		cmocka_unit_test(test_run_across_mounts),
		cmocka_unit_test(test_listing_reads_once),
		cmocka_unit_test(test_realpath),
		cmocka_unit_test(test_realpath_detached),
		cmocka_unit_test(test_realpath_moved_out_of_a_bind_mount),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
