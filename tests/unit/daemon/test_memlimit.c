/*
 * test_memlimit.c: unit tests of daemon/memlimit.c on fake trees of
 * /proc/self/{cgroup,mountinfo} and cgroup files: v2, v1, hybrid (v1
 * memory, v2 without it), nested limits, a container's view of a subtree
 * (v1's hierarchical limit seeing past it), "max", v1's "unlimited", a
 * limit above RAM, escaped mount points and garbage; a long cgroup path
 * kept whole and shown cut with a mark.
 */
#include <errno.h>
#include <inttypes.h>
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

#include "memlimit.h"
#include "testutil.h"

#define GiB (UINT64_C(1) << 30)
#define RAM (24 * GiB)
#define V1_UNLIMITED "9223372036854771712\n"

/* /proc/meminfo of the machine these tests were written on (Linux 6.18, no
 * swap), 2026-12-06. */
#define MEMINFO_NO_SWAP \
	"MemTotal:       24683748 kB\n" \
	"MemFree:        21568284 kB\n" \
	"MemAvailable:   24074356 kB\n" \
	"Buffers:           50412 kB\n" \
	"Cached:          2324440 kB\n" \
	"SwapCached:            0 kB\n" \
	"Active:          1330956 kB\n" \
	"Inactive:        1138288 kB\n" \
	"Active(anon):        308 kB\n" \
	"Inactive(anon):   104348 kB\n" \
	"Active(file):    1330648 kB\n" \
	"Inactive(file):  1033940 kB\n" \
	"Unevictable:       16836 kB\n" \
	"Mlocked:           13984 kB\n" \
	"SwapTotal:             0 kB\n" \
	"SwapFree:              0 kB\n" \
	"Zswap:                 0 kB\n" \
	"Zswapped:              0 kB\n" \
	"Dirty:             48552 kB\n" \
	"Writeback:             0 kB\n" \
	"AnonPages:         94100 kB\n" \
	"Mapped:           105456 kB\n" \
	"Shmem:             10236 kB\n" \
	"KReclaimable:     465176 kB\n" \
	"Slab:             522144 kB\n" \
	"SReclaimable:     465176 kB\n" \
	"SUnreclaim:        56968 kB\n" \
	"KernelStack:        2440 kB\n" \
	"PageTables:         5416 kB\n" \
	"SecPageTables:         0 kB\n" \
	"NFS_Unstable:          0 kB\n" \
	"Bounce:                0 kB\n" \
	"WritebackTmp:          0 kB\n" \
	"CommitLimit:    12341872 kB\n" \
	"Committed_AS:     203248 kB\n" \
	"VmallocTotal:   34359738367 kB\n" \
	"VmallocUsed:       15212 kB\n" \
	"VmallocChunk:          0 kB\n" \
	"Percpu:             1296 kB\n" \
	"AnonHugePages:         0 kB\n" \
	"ShmemHugePages:        0 kB\n" \
	"ShmemPmdMapped:        0 kB\n" \
	"FileHugePages:    233472 kB\n" \
	"FilePmdMapped:         0 kB\n" \
	"Balloon:               0 kB\n" \
	"HugePages_Total:       0\n" \
	"HugePages_Free:        0\n" \
	"HugePages_Rsvd:        0\n" \
	"HugePages_Surp:        0\n" \
	"Hugepagesize:       2048 kB\n" \
	"Hugetlb:               0 kB\n" \
	"DirectMap4k:       30720 kB\n" \
	"DirectMap2M:    25135104 kB\n"

/* /proc/meminfo of a ZFS host with 8 GiB of swap, as quoted in
 * htop-dev/htop#1559 (2024-10-23), to its Unaccepted line. */
#define MEMINFO_ZFS_SWAP \
	"MemTotal:       65710420 kB\n" \
	"MemFree:        10564240 kB\n" \
	"MemAvailable:   26828796 kB\n" \
	"Buffers:          867748 kB\n" \
	"Cached:         15599856 kB\n" \
	"SwapCached:            0 kB\n" \
	"Active:          4145672 kB\n" \
	"Inactive:       15218136 kB\n" \
	"Active(anon):    3183452 kB\n" \
	"Inactive(anon):        0 kB\n" \
	"Active(file):     962220 kB\n" \
	"Inactive(file): 15218136 kB\n" \
	"Unevictable:        3136 kB\n" \
	"Mlocked:              48 kB\n" \
	"SwapTotal:       8388604 kB\n" \
	"SwapFree:        8388604 kB\n" \
	"Zswap:                 0 kB\n" \
	"Zswapped:              0 kB\n" \
	"Dirty:                68 kB\n" \
	"Writeback:             0 kB\n" \
	"AnonPages:       2899384 kB\n" \
	"Mapped:          1170800 kB\n" \
	"Shmem:            287252 kB\n" \
	"KReclaimable:     818376 kB\n" \
	"Slab:            2754160 kB\n" \
	"SReclaimable:     818376 kB\n" \
	"SUnreclaim:      1935784 kB\n" \
	"KernelStack:       24576 kB\n" \
	"PageTables:        57072 kB\n" \
	"SecPageTables:         0 kB\n" \
	"NFS_Unstable:          0 kB\n" \
	"Bounce:                0 kB\n" \
	"WritebackTmp:          0 kB\n" \
	"CommitLimit:    41243812 kB\n" \
	"Committed_AS:   23490112 kB\n" \
	"VmallocTotal:   34359738367 kB\n" \
	"VmallocUsed:     1654744 kB\n" \
	"VmallocChunk:          0 kB\n" \
	"Percpu:            71232 kB\n" \
	"HardwareCorrupted:     0 kB\n" \
	"AnonHugePages:         0 kB\n" \
	"ShmemHugePages:        0 kB\n" \
	"ShmemPmdMapped:        0 kB\n" \
	"FileHugePages:         0 kB\n" \
	"FilePmdMapped:         0 kB\n" \
	"Unaccepted:            0 kB\n"

/* /proc/meminfo of a 1 GiB machine, no swap, an older kernel (no Hugetlb
 * line), as quoted in soldair/node-procfs-stats#9 (2016-02-02). */
#define MEMINFO_OLD \
	"MemTotal:        1019732 kB\n" \
	"MemFree:           50012 kB\n" \
	"MemAvailable:     710280 kB\n" \
	"Buffers:          127524 kB\n" \
	"Cached:           405964 kB\n" \
	"SwapCached:            0 kB\n" \
	"Active:           534460 kB\n" \
	"Inactive:         217228 kB\n" \
	"Active(anon):     218608 kB\n" \
	"Inactive(anon):      204 kB\n" \
	"Active(file):     315852 kB\n" \
	"Inactive(file):   217024 kB\n" \
	"Unevictable:           0 kB\n" \
	"Mlocked:               0 kB\n" \
	"SwapTotal:             0 kB\n" \
	"SwapFree:              0 kB\n" \
	"Dirty:              1468 kB\n" \
	"Writeback:             0 kB\n" \
	"AnonPages:        218200 kB\n" \
	"Mapped:            79532 kB\n" \
	"Shmem:               612 kB\n" \
	"Slab:             196700 kB\n" \
	"SReclaimable:     141768 kB\n" \
	"SUnreclaim:        54932 kB\n" \
	"KernelStack:        2656 kB\n" \
	"PageTables:         3992 kB\n" \
	"NFS_Unstable:          0 kB\n" \
	"Bounce:                0 kB\n" \
	"WritebackTmp:          0 kB\n" \
	"CommitLimit:      509864 kB\n" \
	"Committed_AS:     933376 kB\n" \
	"VmallocTotal:   34359738367 kB\n" \
	"VmallocUsed:        6740 kB\n" \
	"VmallocChunk:   34359728376 kB\n" \
	"HardwareCorrupted:     0 kB\n" \
	"AnonHugePages:     55296 kB\n" \
	"HugePages_Total:       0\n" \
	"HugePages_Free:        0\n" \
	"HugePages_Rsvd:        0\n" \
	"HugePages_Surp:        0\n" \
	"Hugepagesize:       2048 kB\n" \
	"DirectMap4k:      196608 kB\n" \
	"DirectMap2M:      983040 kB\n"

/* Writes text to root/path, making the directories on the way. */
static void
put(const char *root, const char *path, const char *text)
{
	char full[4096];
	FILE *f;

	snprintf(full, sizeof(full), "%s%s", root, path);
	for (char *p = full + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
		*p = '\0';
		assert_true(mkdir(full, 0755) == 0 || errno == EEXIST);
		*p = '/';
	}
	assert_non_null(f = fopen(full, "w"));
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/* A fresh fake tree with these /proc/self/cgroup and mountinfo. */
static char *
tree(const char *cgroup, const char *mountinfo)
{
	char *root = tu_tmpdir();

	put(root, "/proc/self/cgroup", cgroup);
	put(root, "/proc/self/mountinfo", mountinfo);
	return root;
}

/* Reads root's limit into *m and checks its kind, figure and (unless
 * NULL) where it says it came from. */
static void
expect(const char *root, struct memlimit *m, enum memlimit_kind kind, uint64_t limit,
	const char *source)
{
	char src[400];

	memlimit_read(root, RAM, m);
	assert_int_equal(m->kind, kind);
	assert_int_equal(m->limit, limit);
	assert_int_equal(m->ram, RAM);
	if (source != NULL)
		assert_string_equal(memlimit_source(m, src, sizeof(src)), source);
}

/* mountinfo lines of a unified (v2) system and of a hybrid one. */
#define MOUNT_ROOT "22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
#define MOUNT_V2                                                                           \
	"30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 "  \
	"cgroup2 rw,nsdelegate,memory_recursiveprot\n"
#define MOUNT_V1_MEMORY                                                                    \
	"35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - "   \
	"cgroup cgroup rw,memory\n"
#define MOUNT_V1_CPU                                                                       \
	"34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:8 - cgroup cgroup "    \
	"rw,cpu,cpuacct\n"
#define MOUNT_HYBRID_V2                                                                    \
	"31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 "      \
	"rw,nsdelegate\n"

static void
test_v2_parent_limit(void **state)
{
	char *root = tree("0::/system.slice/wcached.service\n", MOUNT_ROOT MOUNT_V2);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/system.slice/wcached.service/memory.max", "max\n");
	put(root, "/sys/fs/cgroup/system.slice/memory.max", "4294967296\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 4 * GiB, "cgroup v2 memory.max of /system.slice");
	assert_int_equal(m.cgroup, 4 * GiB);
	assert_string_equal(memlimit_kind_name(m.kind), "cgroup_v2");

	/* The service's own, smaller, wins. */
	put(root, "/sys/fs/cgroup/system.slice/wcached.service/memory.max", "1073741824\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, GiB,
		"cgroup v2 memory.max of /system.slice/wcached.service");
	tu_rmtree(root);
}

static void
test_v2_unlimited_and_above_ram(void **state)
{
	char *root = tree("0::/system.slice/wcached.service\n", MOUNT_ROOT MOUNT_V2);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/system.slice/wcached.service/memory.max", "max\n");
	put(root, "/sys/fs/cgroup/system.slice/memory.max", "max\n");
	expect(root, &m, MEMLIMIT_RAM, RAM, "RAM");
	assert_int_equal(m.cgroup, 0);
	assert_string_equal(memlimit_kind_name(m.kind), "ram");

	/* A limit above the RAM is no limit, but it is reported. */
	put(root, "/sys/fs/cgroup/system.slice/memory.max", "68719476736\n");
	expect(root, &m, MEMLIMIT_RAM, RAM, NULL);
	assert_int_equal(m.cgroup, 64 * GiB);

	/* RAM unknown: the cgroup's limit is all there is. */
	memlimit_read(root, 0, &m);
	assert_int_equal(m.kind, MEMLIMIT_CGROUP_V2);
	assert_int_equal(m.limit, 64 * GiB);
	tu_rmtree(root);
}

/* memory.high (systemd's MemoryHigh=, Kubernetes' MemoryQoS) limits the
 * page cache as memory.max does: the kernel reclaims and throttles above
 * it. The smaller of the two, on any level, is in force; max is named
 * where they are equal. */
static void
test_v2_memory_high(void **state)
{
	char *root = tree("0::/kubepods.slice/pod1/ctr\n", MOUNT_ROOT MOUNT_V2);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max", "4294967296\n");
	put(root, "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.high", "3865470976\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 3865470976u,
		"cgroup v2 memory.high of /kubepods.slice/pod1/ctr");

	/* An ancestor's smaller high wins; "max" is no limit. */
	put(root, "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.high", "max\n");
	put(root, "/sys/fs/cgroup/kubepods.slice/memory.high", "2147483648\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 2 * GiB,
		"cgroup v2 memory.high of /kubepods.slice");

	/* Equal to a max: the max is named. */
	put(root, "/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max", "2147483648\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 2 * GiB,
		"cgroup v2 memory.max of /kubepods.slice/pod1/ctr");
	tu_rmtree(root);
}

/* A container with its own cgroup namespace: it is "/", its mount's top. */
static void
test_v2_cgroup_namespace(void **state)
{
	char *root = tree("0::/\n", MOUNT_ROOT MOUNT_V2);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/memory.max", "2147483648\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 2 * GiB, "cgroup v2 memory.max of /");
	tu_rmtree(root);
}

/* Hybrid, as on this project's CI machine: memory is a v1 controller, the
 * v2 mount has no memory files. */
static void
test_hybrid_v1_memory(void **state)
{
	char *root = tree("9:name=systemd:/\n5:cpu,cpuacct:/\n4:memory:/jobs/42\n0::/\n",
		MOUNT_ROOT
		"30 22 0:25 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n" MOUNT_HYBRID_V2
			MOUNT_V1_CPU MOUNT_V1_MEMORY);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/unified/cgroup.procs", "1\n");
	put(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED);
	put(root, "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", V1_UNLIMITED);
	put(root, "/sys/fs/cgroup/memory/jobs/42/memory.limit_in_bytes", "3221225472\n");
	/* A cpu controller's files are not memory limits. */
	put(root, "/sys/fs/cgroup/cpu,cpuacct/memory.limit_in_bytes", "1\n");
	expect(root, &m, MEMLIMIT_CGROUP_V1, 3 * GiB,
		"cgroup v1 memory.limit_in_bytes of /jobs/42");
	assert_string_equal(memlimit_kind_name(m.kind), "cgroup_v1");

	/* Unlimited all the way up: RAM. */
	put(root, "/sys/fs/cgroup/memory/jobs/42/memory.limit_in_bytes", V1_UNLIMITED);
	expect(root, &m, MEMLIMIT_RAM, RAM, NULL);
	tu_rmtree(root);
}

/* A v1 container sees only its own subtree, mounted as the top: its
 * parent's limit shows only in memory.stat's hierarchical_memory_limit. */
static void
test_v1_container_subtree(void **state)
{
	char *root = tree("4:memory:/kubepods/pod1/abc\n",
		MOUNT_ROOT
		"35 30 0:31 /kubepods/pod1/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup "
		"rw,memory\n");
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED);
	put(root, "/sys/fs/cgroup/memory/memory.stat",
		"cache 0\nrss 0\nhierarchical_memory_limit_x 5\n"
		"hierarchical_memory_limit 536870912\nhierarchical_memsw_limit 9\n");
	expect(root, &m, MEMLIMIT_CGROUP_V1, GiB / 2,
		"cgroup v1 hierarchical_memory_limit of /kubepods/pod1/abc");

	/* Its own limit, equal to the hierarchical one, is named first. */
	put(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n");
	expect(root, &m, MEMLIMIT_CGROUP_V1, GiB / 2,
		"cgroup v1 memory.limit_in_bytes of /kubepods/pod1/abc");
	tu_rmtree(root);
}

/* Both hierarchies limit: the smaller one is in force. */
static void
test_v1_and_v2_smaller_wins(void **state)
{
	char *root = tree("4:memory:/a\n0::/b\n",
		MOUNT_ROOT MOUNT_V2 MOUNT_V1_MEMORY);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroup/b/memory.max", "2147483648\n");
	put(root, "/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "1073741824\n");
	expect(root, &m, MEMLIMIT_CGROUP_V1, GiB, NULL);
	put(root, "/sys/fs/cgroup/b/memory.max", "1048576\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 1048576, NULL);
	tu_rmtree(root);
}

/* A mount point with a space, escaped as \040 in mountinfo. */
static void
test_escaped_mountpoint(void **state)
{
	char *root = tree("0::/x\n",
		MOUNT_ROOT "30 22 0:26 / /cg\\040roups rw shared:4 - cgroup2 cgroup2 rw\n");
	struct memlimit m;

	(void)state;
	put(root, "/cg roups/x/memory.max", "1073741824\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, GiB, NULL);
	tu_rmtree(root);
}

/* Nothing to read, or garbage: no limit, and no crash. */
static void
test_missing_and_garbage(void **state)
{
	char *root = tu_tmpdir();
	struct memlimit m;

	(void)state;
	memlimit_read(root, RAM, &m); /* no /proc at all */
	assert_int_equal(m.kind, MEMLIMIT_RAM);
	assert_int_equal(m.limit, RAM);

	put(root, "/proc/self/cgroup", "garbage\n::\n0:\n4:memory\n\n0::/s\n");
	put(root, "/proc/self/mountinfo",
		"short line\n1 2 3\n30 22 0:26 / /sys/fs/cgroup rw - cgroup2\n"
		"30 22 0:26 / /sys/fs/cgroup rw no dash cgroup2 cgroup2 rw\n" MOUNT_V2);
	put(root, "/sys/fs/cgroup/s/memory.max", "-5\n");
	put(root, "/sys/fs/cgroup/memory.max", "12abc\n");
	expect(root, &m, MEMLIMIT_RAM, RAM, NULL);

	put(root, "/sys/fs/cgroup/s/memory.max", "99999999999999999999999\n"); /* overflow */
	put(root, "/sys/fs/cgroup/memory.max", "");
	memlimit_read(root, RAM, &m);
	assert_int_equal(m.kind, MEMLIMIT_RAM);

	/* A cgroup outside the mount's root: the mount's top is ours. */
	put(root, "/proc/self/cgroup", "0::/elsewhere/x\n");
	put(root, "/proc/self/mountinfo",
		"30 22 0:26 /mine /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
	put(root, "/sys/fs/cgroup/memory.max", "1073741824\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, GiB, NULL);
	tu_rmtree(root);
}

/* The parsers on bytes (what the fuzzer drives): a whole file at once,
 * unterminated, lines without a final newline, a NUL that ends a line. */
static void
test_parsers_on_bytes(void **state)
{
	static const char cgroup[] = "4:cpu,memory:/v1/a:b\n0::/v2/x\0ignored\n0:memory:/c";
	static const char mounts[] = MOUNT_ROOT MOUNT_V2
		"31 22 0:31 /sub /m\\040y rw - cgroup cgroup rw,cpu,memory\n"
		"32 22 0:32 / /second rw - cgroup cgroup rw,memory";
	static const char stat[] = "cache 4096\nhierarchical_memory_limit_x 1\n"
		"hierarchical_memory_limit 2147483648\nhierarchical_memory_limit 5\n";
	struct memlimit_hierarchy *h = calloc(2, sizeof(*h));
	uint64_t v = 7;

	(void)state;
	assert_non_null(h);
	assert_int_equal(memlimit_parse_cgroups(cgroup, sizeof(cgroup) - 1, &h[0], &h[1]), 0);
	assert_true(h[0].found && h[1].found);
	assert_string_equal(h[0].cgroup, "/v2/x");
	assert_string_equal(h[1].cgroup, "/c"); /* the later line */
	assert_int_equal(memlimit_parse_mounts(mounts, sizeof(mounts) - 1, &h[0], &h[1]), 0);
	assert_string_equal(h[0].mountpoint, "/sys/fs/cgroup");
	assert_string_equal(h[0].root, "/");
	assert_string_equal(h[1].mountpoint, "/m y"); /* the first, unescaped */
	assert_string_equal(h[1].root, "/sub");

	/* The first line decides; nothing to decide leaves *out alone. */
	assert_int_equal(memlimit_parse_limit("", 0, NULL, &v), 0);
	assert_int_equal(v, 7);
	assert_int_equal(memlimit_parse_limit("1048576", 7, NULL, &v), 1);
	assert_int_equal(v, 1048576);
	assert_int_equal(memlimit_parse_limit("max\n5\n", 6, NULL, &v), 1);
	assert_int_equal(v, 0);
	assert_int_equal(memlimit_parse_limit(V1_UNLIMITED, strlen(V1_UNLIMITED), NULL, &v), 1);
	assert_int_equal(v, 0);
	assert_int_equal(memlimit_parse_limit("12 kB\n", 6, NULL, &v), 1);
	assert_int_equal(v, 0);
	assert_int_equal(memlimit_parse_limit(stat, sizeof(stat) - 1, "hierarchical_memory_limit",
				 &v), 1);
	assert_int_equal(v, 2 * GiB);
	v = 7;
	assert_int_equal(memlimit_parse_limit(stat, 11, "hierarchical_memory_limit", &v), 0);
	assert_int_equal(v, 7);
	free(h);
}

/* The largest limit kept is 2^62 - 1: 2^62 and above say "no limit", in a
 * limit file and in memory.stat alike. */
static void
test_no_limit_boundary(void **state)
{
	static const char below[] = "4611686018427387903\n", at[] = "4611686018427387904\n";
	static const char stat_at[] = "cache 0\nhierarchical_memory_limit 4611686018427387904\n";
	uint64_t v = 7;

	(void)state;
	assert_int_equal(memlimit_parse_limit(below, sizeof(below) - 1, NULL, &v), 1);
	assert_int_equal(v, MEMLIMIT_NO_LIMIT - 1);
	assert_int_equal(memlimit_parse_limit(at, sizeof(at) - 1, NULL, &v), 1);
	assert_int_equal(v, 0);
	v = 7;
	assert_int_equal(memlimit_parse_limit(stat_at, sizeof(stat_at) - 1,
				 "hierarchical_memory_limit", &v), 1);
	assert_int_equal(v, 0);
}

/* v1's memory controller is the word "memory" of the controller list (and
 * of a cgroup mount's options), never a word that contains it. */
static void
test_memory_is_a_whole_word(void **state)
{
	static const char cgroup[] = "4:nomemory:/a\n5:memory_recursiveprot,cpu:/b\n"
				     "6:cpu,name=memory:/c\n";
	static const char cgroup2[] = "3:cpu,memory:/d\n7:cpu,memoryx:/e\n";
	static const char mounts[] = "31 22 0:31 / /x rw - cgroup cgroup rw,memory_recursiveprot\n"
				     "32 22 0:32 / /y rw - cgroup cgroup rw,cpu,memory\n";
	struct memlimit_hierarchy *h = calloc(2, sizeof(*h));

	(void)state;
	assert_non_null(h);
	assert_int_equal(memlimit_parse_cgroups(cgroup, sizeof(cgroup) - 1, &h[0], &h[1]), 0);
	assert_false(h[1].found);
	assert_string_equal(h[1].cgroup, "");
	assert_int_equal(memlimit_parse_cgroups(cgroup2, sizeof(cgroup2) - 1, &h[0], &h[1]), 0);
	assert_true(h[1].found);
	assert_string_equal(h[1].cgroup, "/d");
	assert_int_equal(memlimit_parse_mounts(mounts, sizeof(mounts) - 1, &h[0], &h[1]), 0);
	assert_string_equal(h[1].mountpoint, "/y");
	free(h);
}

/* Inside a cgroup namespace the kernel writes "/../x" for a cgroup outside
 * the namespace's root: that path leaves the mount, and no limit is read
 * through it (not MOUNT/../../x/memory.max, outside cgroupfs). */
static void
test_cgroup_outside_namespace(void **state)
{
	char *root = tree("0::/../../x\n4:memory:/../y\n", MOUNT_ROOT MOUNT_V2 MOUNT_V1_MEMORY);
	struct memlimit_hierarchy h = { .found = true, .root = "/", .mountpoint = "/m" };
	struct memlimit m;
	char rel[MEMLIMIT_PATH_CAP];

	(void)state;
	put(root, "/sys/x/memory.max", "1048576\n");
	put(root, "/sys/fs/cgroup/y/memory.limit_in_bytes", "2097152\n");
	put(root, "/sys/fs/cgroup/y/memory.stat", "hierarchical_memory_limit 3145728\n");
	expect(root, &m, MEMLIMIT_RAM, RAM, "RAM");
	tu_rmtree(root);

	strcpy(h.cgroup, "/../../x");
	assert_int_equal(memlimit_cgroup_rel(&h, rel, sizeof(rel)), -1);
	strcpy(h.cgroup, "/a/..");
	assert_int_equal(memlimit_cgroup_rel(&h, rel, sizeof(rel)), -1);
	strcpy(h.cgroup, "/a..b/..c/...");
	assert_int_equal(memlimit_cgroup_rel(&h, rel, sizeof(rel)), 0);
	assert_string_equal(rel, "/a..b/..c/...");
	strcpy(h.cgroup, "/");
	assert_int_equal(memlimit_cgroup_rel(&h, rel, sizeof(rel)), 0);
	assert_string_equal(rel, "");
	/* Below a mount that shows a subtree: the part under its root. */
	strcpy(h.root, "/../sub");
	strcpy(h.cgroup, "/../sub/x");
	assert_int_equal(memlimit_cgroup_rel(&h, rel, sizeof(rel)), 0);
	assert_string_equal(rel, "/x");
}

/* What stderr says while memlimit_read() of root runs times times in a
 * row (as a start and then reloads would), in a buffer the caller frees. */
static char *
stderr_of_reads(const char *root, int times)
{
	char path[] = "/tmp/wctest-memlimit-XXXXXX", *text;
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);
	struct memlimit m;
	off_t len;

	assert_true(fd >= 0 && saved >= 0);
	unlink(path);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	for (int i = 0; i < times; i++)
		memlimit_read(root, RAM, &m);
	assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	close(saved);
	len = lseek(fd, 0, SEEK_END);
	assert_non_null(text = calloc(1, (size_t)len + 1));
	assert_int_equal(pread(fd, text, (size_t)len, 0), len);
	close(fd);
	fputs(text, stderr); /* for whoever reads the test's output */
	return text;
}

/* How many times text warns that cgroup has a ".." component. */
static int
outside_warnings(const char *text, const char *cgroup)
{
	char needle[256];
	int n = 0;

	snprintf(needle, sizeof(needle), "cgroup %s has a \"..\" component", cgroup);
	for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

/* The warning about a cgroup outside the mount is said once per cgroup
 * path, not at every reload: reading the limit again in the same cgroup
 * says nothing. A move to another such cgroup is said; each hierarchy
 * remembers only the last path it warned about (bounded), so moving back
 * is said again. */
static void
test_outside_warned_once(void **state)
{
	char *root = tree("0::/../../once\n4:memory:/../v1once\n",
		MOUNT_ROOT MOUNT_V2 MOUNT_V1_MEMORY), *text;

	(void)state;
	text = stderr_of_reads(root, 3);
	assert_int_equal(outside_warnings(text, "/../../once"), 1);
	assert_int_equal(outside_warnings(text, "/../v1once"), 1);
	free(text);
	/* v2 moved: said for it, not again for v1 */
	put(root, "/proc/self/cgroup", "0::/../../moved\n4:memory:/../v1once\n");
	text = stderr_of_reads(root, 2);
	assert_int_equal(outside_warnings(text, "/../../moved"), 1);
	assert_int_equal(outside_warnings(text, "/../v1once"), 0);
	free(text);
	/* and back: the last path v2 warned about was another */
	put(root, "/proc/self/cgroup", "0::/../../once\n4:memory:/../v1once\n");
	text = stderr_of_reads(root, 2);
	assert_int_equal(outside_warnings(text, "/../../once"), 1);
	assert_int_equal(outside_warnings(text, "/../v1once"), 0);
	free(text);
	tu_rmtree(root);
}

/* A cgroup path that is not absolute (the kernel writes none; a file laid
 * over /proc/self/cgroup could) names no cgroup under the mount: no limit
 * is read through it, not the file beside the mount point that the mount
 * point and the path name together (/sys/fs/cgroupx/memory.max). */
static void
test_cgroup_not_absolute(void **state)
{
	char *root = tree("0::x\n4:memory:y\n", MOUNT_ROOT MOUNT_V2 MOUNT_V1_MEMORY);
	struct memlimit m;

	(void)state;
	put(root, "/sys/fs/cgroupx/memory.max", "1048576\n");
	put(root, "/sys/fs/cgroup/memoryy/memory.limit_in_bytes", "2097152\n");
	put(root, "/sys/fs/cgroup/memoryy/memory.stat", "hierarchical_memory_limit 3145728\n");
	expect(root, &m, MEMLIMIT_RAM, RAM, "RAM");
	assert_int_equal(m.cgroup, 0);
	tu_rmtree(root);
}

/* A tree whose cgroup v2 is path, with memory.max limit there. */
static char *
tree_at(const char *path, const char *limit)
{
	char cgroup[1300], file[1300];
	char *root;

	snprintf(cgroup, sizeof(cgroup), "0::%s\n", path);
	root = tree(cgroup, MOUNT_ROOT MOUNT_V2);
	snprintf(file, sizeof(file), "/sys/fs/cgroup%s/memory.max", path);
	put(root, file, limit);
	return root;
}

/* A cgroup path longer than 255 bytes is kept whole, and where the words
 * saying it do not fit the caller's buffer (status and the log give 400
 * bytes) they end in "…", cut between UTF-8 characters, never silently. */
static void
test_long_cgroup_path(void **state)
{
	char path[1200] = "", prefix[301], words[1300], src[400], mid[231];
	size_t at = 0;
	char *root;
	struct memlimit m;

	(void)state;
	/* Five components of 200 bytes (NAME_MAX is 255), the second of
	 * two-byte characters ("é"): 1005 bytes. */
	for (int i = 0; i < 5; i++) {
		path[at++] = '/';
		for (int j = 0; j < 200; j++)
			path[at++] = i == 1 ? (char)(j % 2 == 0 ? 0xc3 : 0xa9) : (char)('a' + i);
	}
	path[at] = '\0';
	assert_int_equal(strlen(path), 1005);

	/* 300 bytes: whole in the struct and in a 400-byte buffer. */
	snprintf(prefix, sizeof(prefix), "%s", path);
	root = tree_at(prefix, "1048576\n");
	snprintf(words, sizeof(words), "cgroup v2 memory.max of %s", prefix);
	expect(root, &m, MEMLIMIT_CGROUP_V2, UINT64_C(1) << 20, words);
	assert_string_equal(m.cgroup_path, prefix);
	tu_rmtree(root);

	/* 1005 bytes: whole in the struct; in 400 bytes cut and marked. */
	root = tree_at(path, "1073741824\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, GiB, NULL);
	assert_string_equal(m.cgroup_path, path);
	snprintf(words, sizeof(words), "cgroup v2 memory.max of %s", path);
	memlimit_source(&m, src, sizeof(src));
	assert_int_equal(strlen(src), sizeof(src) - 1);
	assert_string_equal(src + sizeof(src) - 4, "\xe2\x80\xa6");
	assert_memory_equal(src, words, sizeof(src) - 4);
	/* A cut inside "é" (its second byte at 227) moves before it. */
	memlimit_source(&m, mid, sizeof(mid));
	assert_int_equal((unsigned char)words[226], 0xc3);
	assert_int_equal(strlen(mid), 229);
	assert_memory_equal(mid, words, 226);
	assert_string_equal(mid + 226, "\xe2\x80\xa6");
	tu_rmtree(root);
}

/* What memlimit_use() makes of m's memory.stat (under root's
 * system.slice) once it says stat. */
static uint64_t
v2_use(const char *root, const struct memlimit *m, const char *stat)
{
	uint64_t v = 0;

	put(root, "/sys/fs/cgroup/system.slice/memory.stat", stat);
	assert_int_equal(memlimit_use(m->use_file, m->kind, m->limit, &v), 0);
	return v;
}

/* What is in use of the limit (review rev184 F1): the limit's own cgroup's
 * memory.stat, read again at each memlimit_use(); /proc/meminfo for RAM. */
static void
test_use_of_the_limit(void **state)
{
	char *root = tree("0::/system.slice/wcached.service\n", MOUNT_ROOT MOUNT_V2);
	char *v1 = tree("4:memory:/kubepods/pod1/abc\n",
		MOUNT_ROOT
		"35 30 0:31 /kubepods/pod1/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup "
		"rw,memory\n");
	char want[8192];
	struct memlimit m;
	uint64_t v = 7, margin = memlimit_use_margin(4 * GiB);
	uint64_t margin_v1 = memlimit_use_margin(GiB / 2), margin_ram = memlimit_use_margin(RAM);

	(void)state;
	put(root, "/sys/fs/cgroup/system.slice/wcached.service/memory.max", "max\n");
	put(root, "/sys/fs/cgroup/system.slice/memory.max", "4294967296\n");
	put(root, "/sys/fs/cgroup/system.slice/memory.stat",
		"anon 1000\nfile 99999\nanon_thp 5\nshmem_thp 6\nshmem 24\n");
	expect(root, &m, MEMLIMIT_CGROUP_V2, 4 * GiB, NULL);
	snprintf(want, sizeof(want), "%s/sys/fs/cgroup/system.slice/memory.stat", root);
	assert_string_equal(m.use_file, want);
	assert_int_equal(memlimit_use(m.use_file, m.kind, m.limit, &v), 0);
	assert_int_equal(v, 1024 + margin);
	/* Read again each time: the kernel's figure now; v2's kernel memory
	 * counts (memory.max counts it), kernel_stack is another key. */
	assert_int_equal(v2_use(root, &m, "shmem 1\nkernel_stack 99\nanon 2\nkernel 40\n"),
		43 + margin);
	/* Before Linux 5.18 there is no "kernel": its parts reclaim does not
	 * free, and sock, count instead (review rev189 F6); slab_reclaimable
	 * and file do not. */
	assert_int_equal(v2_use(root, &m, "anon 2\nfile 3\nkernel_stack 100\npagetables 200\n"
		"percpu 400\nsock 800\nshmem 1\nslab_reclaimable 5000\nslab_unreclaimable 1600\n"),
		3103 + margin);
	/* With "kernel" there, it alone counts (it holds them, sock aside). */
	assert_int_equal(v2_use(root, &m, "anon 2\nkernel_stack 100\npagetables 200\n"
		"kernel 7000\nsock 800\nshmem 1\n"), 7003 + margin);
	/* Missing parts are 0, a part that says no number says nothing. */
	v = v2_use(root, &m, "anon 2\nshmem 1\nsock 8\n");
	assert_int_equal(v, 11 + margin);
	put(root, "/sys/fs/cgroup/system.slice/memory.stat", "anon 2\nshmem 1\npercpu x\n");
	assert_int_equal(memlimit_use(m.use_file, m.kind, m.limit, &v), -EBADMSG);
	assert_int_equal(v, 11 + margin);
	put(root, "/sys/fs/cgroup/system.slice/memory.stat", "anon 2\nfile 3\n");
	assert_int_equal(memlimit_use(m.use_file, m.kind, m.limit, &v), -EBADMSG);
	assert_int_equal(v, 11 + margin);
	assert_int_equal(memlimit_use("", m.kind, m.limit, &v), -ENOENT);
	tu_rmtree(root);

	/* v1: total_rss and total_shmem (the subtree's), not mapped_file. */
	put(v1, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n");
	put(v1, "/sys/fs/cgroup/memory/memory.stat",
		"rss 1\nshmem 2\nmapped_file 3\ntotal_rss_huge 4\ntotal_rss 4096\n"
		"total_mapped_file 77\ntotal_shmem 8192\n");
	expect(v1, &m, MEMLIMIT_CGROUP_V1, GiB / 2, NULL);
	assert_int_equal(memlimit_use(m.use_file, m.kind, m.limit, &v), 0);
	assert_int_equal(v, 12288 + margin_v1);

	/* No cgroup limit: the machine's /proc/meminfo (test_meminfo). */
	put(v1, "/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED);
	put(v1, "/proc/meminfo", MEMINFO_ZFS_SWAP);
	expect(v1, &m, MEMLIMIT_RAM, RAM, NULL);
	snprintf(want, sizeof(want), "%s/proc/meminfo", v1);
	assert_string_equal(m.use_file, want);
	assert_int_equal(memlimit_use(m.use_file, m.kind, m.limit, &v), 0);
	assert_true(v == UINT64_C(35695036) * 1024 + margin_ram);
	tu_rmtree(v1);
}

/* memlimit_parse_use() on bytes: the first line of each key decides. */
static void
test_parse_use(void **state)
{
	uint64_t v = 7;
	static const char big[] = "anon 18446744073709551615\nshmem 18446744073709551615\n";

	(void)state;
	assert_int_equal(memlimit_parse_use("", 0, MEMLIMIT_CGROUP_V2, &v), 0);
	assert_int_equal(memlimit_parse_use("anon 1\nshmem x\nshmem 2\n", 23,
		MEMLIMIT_CGROUP_V2, &v), 0);
	assert_int_equal(v, 7);
	assert_int_equal(memlimit_parse_use("anon 1\nshmem 2", 14, MEMLIMIT_CGROUP_V2, &v), 1);
	assert_int_equal(v, 3);
	assert_int_equal(memlimit_parse_use("anon 1 \nshmem 2", 15, MEMLIMIT_CGROUP_V2, &v), 0);
	/* A NUL ends its line. */
	assert_int_equal(memlimit_parse_use("anon 1\0\nshmem 2", 15, MEMLIMIT_CGROUP_V2, &v), 1);
	assert_int_equal(v, 3);
	/* The sum is cut at UINT64_MAX; a figure past 64 bits says nothing. */
	assert_int_equal(memlimit_parse_use(big, sizeof(big) - 1, MEMLIMIT_CGROUP_V2, &v), 1);
	assert_true(v == UINT64_MAX);
	assert_int_equal(memlimit_parse_use("anon 18446744073709551616\nshmem 1\n", 34,
		MEMLIMIT_CGROUP_V2, &v), 0);
	/* v1: no kernel key; v2's, where there, must say a number. */
	assert_int_equal(memlimit_parse_use("total_rss 1\nkernel 5\ntotal_shmem 2\n", 34,
		MEMLIMIT_CGROUP_V1, &v), 1);
	assert_int_equal(v, 3);
	assert_int_equal(memlimit_parse_use("anon 1\nkernel x\nshmem 2\n", 24,
		MEMLIMIT_CGROUP_V2, &v), 0);
	assert_int_equal(v, 3);
	/* meminfo: kB; a kB count past 64 bits in bytes says nothing, and
	 * neither does a key that is there without a number. */
	assert_int_equal(memlimit_parse_use("MemTotal: 9 kB\nMemAvailable:\t4 kB\n", 34,
		MEMLIMIT_RAM, &v), 1);
	assert_int_equal(v, 5120);
	assert_int_equal(memlimit_parse_use("MemTotal: 9\nMemAvailable: 4 kB\n", 31,
		MEMLIMIT_RAM, &v), 0);
	assert_int_equal(memlimit_parse_use("MemTotal: 18014398509481984 kB\n"
		"MemAvailable: 1 kB\n", 50, MEMLIMIT_RAM, &v), 0);
	assert_int_equal(memlimit_parse_use("MemTotal: 9 kB\nMemAvailable: 4 kB\n"
		"SwapFree: -1 kB\n", 50, MEMLIMIT_RAM, &v), 0);
	assert_int_equal(memlimit_parse_use("AnonPages: 4 kB\nShmem: 1 kB\n", 28,
		MEMLIMIT_RAM, &v), 0);
	assert_int_equal(v, 5120);
	/* Free swap takes at most the anonymous memory and shmem that is not
	 * mlocked off what is not available (review rev189 F2). */
	assert_int_equal(memlimit_parse_use("MemTotal: 100 kB\nMemAvailable: 40 kB\n"
		"AnonPages: 30 kB\nShmem: 10 kB\nSwapFree: 1000 kB\nMlocked: 25 kB\n", 100,
		MEMLIMIT_RAM, &v), 1);
	assert_int_equal(v, 45 * 1024);
	assert_int_equal(memlimit_parse_use("MemTotal: 100 kB\nMemAvailable: 40 kB\n"
		"AnonPages: 30 kB\nShmem: 10 kB\nSwapFree: 3 kB\nMlocked: 25 kB\n", 97,
		MEMLIMIT_RAM, &v), 1);
	assert_int_equal(v, 57 * 1024);
	/* Mlocked past AnonPages + Shmem (mlocked page cache): no credit. */
	assert_int_equal(memlimit_parse_use("MemTotal: 100 kB\nMemAvailable: 20 kB\n"
		"AnonPages: 10 kB\nMlocked: 50 kB\nSwapFree: 1000 kB\n", 87, MEMLIMIT_RAM,
		&v), 1);
	assert_int_equal(v, 80 * 1024);
	/* No difference is below 0. */
	assert_int_equal(memlimit_parse_use("MemTotal: 100 kB\nMemAvailable: 90 kB\n"
		"AnonPages: 50 kB\nSwapFree: 1000 kB\n", 72, MEMLIMIT_RAM, &v), 1);
	assert_int_equal(v, 0);
	v = 7;
	assert_int_equal(memlimit_parse_use("MemTotal: 10 kB\nMemAvailable: 90 kB\n", 36,
		MEMLIMIT_RAM, &v), 1);
	assert_int_equal(v, 0);
}

/*
 * Real /proc/meminfo files (reviews rev186 F3, rev189 F2): in use is
 * MemTotal less MemAvailable, which counts mlocked page cache, driver-pinned
 * memory, ramfs, zswap and the kernel's reserves, less the SwapFree that
 * could take AnonPages + Shmem not mlocked. A ZFS ARC still counts as in use.
 */
static void
test_meminfo(void **state)
{
	uint64_t v = 7;

	(void)state;
	/* This machine (Linux 6.18, 24 GiB, no swap), 2026-12-06: 24683748 -
	 * 24074356 kB, no swap to take any of it. */
	assert_int_equal(memlimit_parse_use(MEMINFO_NO_SWAP, strlen(MEMINFO_NO_SWAP),
		MEMLIMIT_RAM, &v), 1);
	assert_true(v == UINT64_C(609392) * 1024);
	/* A ZFS host with 8 GiB of swap, free (htop-dev/htop#1559; its first
	 * lines, to Unaccepted): 65710420 - 26828796 kB, less 2899384 + 287252
	 * - 48 kB of anonymous memory and shmem not mlocked, which the free swap
	 * could all take. The ARC is still in it. */
	assert_int_equal(memlimit_parse_use(MEMINFO_ZFS_SWAP, strlen(MEMINFO_ZFS_SWAP),
		MEMLIMIT_RAM, &v), 1);
	assert_true(v == UINT64_C(35695036) * 1024);
	/* The same, 2 GiB of its anonymous memory mlocked: swap takes 2 GiB
	 * less of it. */
	{
		char text[sizeof(MEMINFO_ZFS_SWAP)];
		char *m;

		memcpy(text, MEMINFO_ZFS_SWAP, sizeof(text));
		m = strstr(text, "Mlocked:              48 kB\n");
		assert_non_null(m);
		memcpy(m, "Mlocked:         2097200 kB\n", 28);
		assert_int_equal(memlimit_parse_use(text, strlen(text), MEMLIMIT_RAM, &v), 1);
		assert_true(v == (UINT64_C(35695036) + 2097152) * 1024);
	}
	/* An older kernel (2016, 1 GiB, no swap). */
	assert_int_equal(memlimit_parse_use(MEMINFO_OLD, strlen(MEMINFO_OLD), MEMLIMIT_RAM, &v), 1);
	assert_int_equal(v / 1024, 1019732 - 710280);
}

/* The margin memlimit_use() adds (review rev186 F5): 256 pages a CPU, at
 * most 1/32 of the limit but never capped below 8 MiB (review rev189 F6:
 * the kernel's own lag is 192 pages a CPU, 48 MiB on 64 CPUs, past the old
 * fixed cap of 8 MiB). */
static void
test_use_margin(void **state)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN), page = sysconf(_SC_PAGESIZE);
	uint64_t want;
	char say[512], want_say[64];

	(void)state;
	assert_true(cpus > 0 && page > 0);
	want = (uint64_t)cpus * 256 * (uint64_t)page;
	assert_true(memlimit_use_margin(0) == (want < 8 * MiB ? want : 8 * MiB));
	assert_true(memlimit_use_margin(64 * GiB) == (want < 2 * GiB ? want : 2 * GiB));
	assert_true(memlimit_use_margin_of((uint64_t)cpus, (uint64_t)page, GiB) ==
		memlimit_use_margin(GiB));
	/* 2 CPUs of 4 KiB pages: 2 MiB, whatever the limit. */
	assert_true(memlimit_use_margin_of(2, 4096, 0) == 2 * MiB);
	assert_true(memlimit_use_margin_of(2, 4096, 64 * MiB) == 2 * MiB);
	assert_true(memlimit_use_margin_of(2, 4096, 64 * GiB) == 2 * MiB);
	/* 64 CPUs: 64 MiB, more than the kernel's 48 MiB, from a limit of
	 * 2 GiB on; 32 MiB at 1 GiB; 8 MiB, no less, under 256 MiB. */
	assert_true(memlimit_use_margin_of(64, 4096, 64 * GiB) == 64 * MiB);
	assert_true(memlimit_use_margin_of(64, 4096, 2 * GiB) == 64 * MiB);
	assert_true(memlimit_use_margin_of(64, 4096, GiB) == 32 * MiB);
	assert_true(memlimit_use_margin_of(64, 4096, 128 * MiB) == 8 * MiB);
	assert_true(memlimit_use_margin_of(64, 4096, 0) == 8 * MiB);
	/* 64 KiB pages (arm64, ppc64le): 16 MiB a CPU's worth of 256. */
	assert_true(memlimit_use_margin_of(4, 65536, 64 * GiB) == 64 * MiB);
	/* Unknown counts: 1 CPU of 4 KiB; a product past 64 bits: the cap. */
	assert_true(memlimit_use_margin_of(0, 0, 0) == MiB);
	assert_true(memlimit_use_margin_of(UINT64_MAX, 4096, 64 * GiB) == 2 * GiB);
	/* The words say the margin of the limit given. */
	memlimit_use_say(MEMLIMIT_CGROUP_V2, 0, 80 << 20, say, sizeof(say));
	snprintf(want_say, sizeof(want_say), "(%" PRIu64 " MiB of it allowed",
		(memlimit_use_margin(0) + MiB - 1) / MiB);
	assert_non_null(strstr(say, want_say));
	memlimit_use_say(MEMLIMIT_CGROUP_V1, GiB, 80 << 20, say, sizeof(say));
	assert_non_null(strstr(say, "wcached's memory cgroup has about 80 MiB of anonymous memory "
		"and shmem in use (memory.stat), which the kernel cannot reclaim without swap ("));
	assert_null(strstr(say, "kernel memory"));
	memlimit_use_say(MEMLIMIT_CGROUP_V2, GiB, 80 << 20, say, sizeof(say));
	assert_non_null(strstr(say, "without swap, and of kernel memory ("));
	memlimit_use_say(MEMLIMIT_RAM, RAM, UINT64_C(900) << 20, say, sizeof(say));
	assert_non_null(strstr(say, "the machine has about 900 MiB in use that the kernel cannot "
		"reclaim (/proc/meminfo: MemTotal less MemAvailable, less the SwapFree that "
		"could take AnonPages and Shmem not Mlocked; "));
	/* Cut to fit, ending in "…". */
	memlimit_use_say(MEMLIMIT_RAM, RAM, 0, say, 40);
	assert_int_equal(strlen(say), 39);
	assert_string_equal(say + 36, "\xe2\x80\xa6");
}

/* The real machine's figure: at most its RAM, never 0 when RAM is known. */
static void
test_this_machine(void **state)
{
	struct memlimit m;
	uint64_t ram = memlimit_ram();

	(void)state;
	assert_true(ram > 0);
	memlimit_read("", ram, &m);
	assert_true(m.limit > 0 && m.limit <= ram);
	assert_true(m.kind == MEMLIMIT_RAM || m.cgroup == m.limit);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_v2_parent_limit),
		cmocka_unit_test(test_v2_unlimited_and_above_ram),
		cmocka_unit_test(test_v2_memory_high),
		cmocka_unit_test(test_v2_cgroup_namespace),
		cmocka_unit_test(test_hybrid_v1_memory),
		cmocka_unit_test(test_v1_container_subtree),
		cmocka_unit_test(test_v1_and_v2_smaller_wins),
		cmocka_unit_test(test_escaped_mountpoint),
		cmocka_unit_test(test_missing_and_garbage),
		cmocka_unit_test(test_parsers_on_bytes),
		cmocka_unit_test(test_no_limit_boundary),
		cmocka_unit_test(test_memory_is_a_whole_word),
		cmocka_unit_test(test_cgroup_outside_namespace),
		cmocka_unit_test(test_outside_warned_once),
		cmocka_unit_test(test_cgroup_not_absolute),
		cmocka_unit_test(test_long_cgroup_path),
		cmocka_unit_test(test_use_of_the_limit),
		cmocka_unit_test(test_parse_use),
		cmocka_unit_test(test_meminfo),
		cmocka_unit_test(test_use_margin),
		cmocka_unit_test(test_this_machine),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
