/*
 * memlimit.h: how much memory wcached may really use: the smaller of the
 * machine's RAM and the memory limit of the cgroup it runs in.
 *
 * The kernel charges a page of the page cache to the cgroup of the process
 * that first reads it, so every model wcached warms is charged to wcached's
 * own cgroup: a limit there (systemd's MemoryMax=, a container's memory
 * limit) caps the warm set, whatever the machine's RAM. Percent budgets
 * (memory_budget = 80%) are of this figure.
 *
 * The limit is the smallest of: cgroup v2 `memory.max` and `memory.high`
 * (above which the kernel reclaims the cgroup's page cache and throttles
 * it) of the daemon's cgroup and of each ancestor visible in the mount,
 * memory.max named first where they are equal; cgroup v1
 * `memory.limit_in_bytes` of the same, and the v1 `memory.stat`
 * `hierarchical_memory_limit` (which includes ancestors a container cannot
 * see). The cgroups are found as the kernel lists them: /proc/self/cgroup
 * (which cgroup, per hierarchy) and /proc/self/mountinfo (where each
 * hierarchy is mounted, and which part of it: a container sees a subtree).
 * Hybrid machines (v1 memory controller, v2 without it) work: a file that
 * is not there is no limit. "max" and v1's "unlimited" (a page count near
 * 2^63) are no limit, and so is a cgroup path that is not absolute (the
 * kernel writes none).
 */
#ifndef WC_MEMLIMIT_H
#define WC_MEMLIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest path memlimit keeps, with its NUL: PATH_MAX, the most the
 * kernel writes for a cgroup in /proc/self/cgroup. */
#define MEMLIMIT_PATH_CAP 4096

enum memlimit_kind {
	MEMLIMIT_RAM,       /* no cgroup limit below the RAM */
	MEMLIMIT_CGROUP_V2, /* memory.max or memory.high */
	MEMLIMIT_CGROUP_V1, /* memory.limit_in_bytes or hierarchical_memory_limit */
};

struct memlimit {
	uint64_t ram;             /* bytes of RAM (0: unknown) */
	uint64_t cgroup;          /* the smallest cgroup limit found; 0: none */
	uint64_t limit;           /* min(ram, cgroup): what percent budgets are of */
	enum memlimit_kind kind;  /* where limit came from */
	/* the cgroup whose limit it is ("/system.slice/x"), whole: the kernel
	 * writes none longer than PATH_MAX - 1 in /proc/self/cgroup (one that
	 * would not fit is cut and ends in "…") */
	char cgroup_path[MEMLIMIT_PATH_CAP];
	char file[40];            /* and its file ("memory.max", "memory.high") */
	/* The file memlimit_use() reads for what of limit is in use: that
	 * cgroup's memory.stat (root prepended), or /proc/meminfo for the RAM;
	 * "" where it is not known (a path that would not fit). */
	char use_file[MEMLIMIT_PATH_CAP * 2];
};

/*
 * Reads the limit in force for the calling process into *out. root is
 * prepended to every path read ("" on a real system; a fake tree in the
 * unit tests), ram is the machine's RAM in bytes (0: unknown). Never fails:
 * what cannot be read is no limit, and then out->limit is ram. It logs a
 * warning for a cgroup path it cannot read through (memlimit_cgroup_rel)
 * once, not at every reload: it remembers the last such path of each
 * hierarchy, so it runs on one thread at a time.
 */
void memlimit_read(const char *root, uint64_t ram, struct memlimit *out);

/* Where out's limit came from, in words: "RAM", or "cgroup v2 memory.max of
 * /system.slice/wcached.service", into buf (len bytes): words that do not
 * fit are cut and end in "…" (UTF-8, cut between characters), so a cut
 * path never reads as another cgroup's. Returns buf. */
const char *memlimit_source(const struct memlimit *m, char *buf, size_t len);

/* Whether what the models keep warm fits under m's limit: models bytes
 * served, of which a memory budget (0: none) keeps at most budget warm,
 * but never less than the pinned bytes (pin = all: the budget evicts no
 * pinned model). 1 when there is no limit. The start's warning and
 * status's "fits" both ask this. */
int memlimit_fits(const struct memlimit *m, uint64_t models, uint64_t pinned, uint64_t budget);

/*
 * What of the limit in force is taken by memory the kernel cannot reclaim,
 * read now from use_file (m->kind's format), and a margin for what the
 * kernel has yet to add up: an estimate. For a cgroup, its memory.stat's
 * anonymous memory and shmem, which it cannot reclaim without swap (v2
 * "anon" + "shmem", v1 "total_rss" + "total_shmem", both counting the
 * cgroup's descendants), and on v2 its kernel memory ("kernel", since
 * Linux 5.18: slab, page tables, stacks and the like, which memory.max
 * counts too; before 5.18, which has no "kernel", the sum of the parts it
 * cannot reclaim: "kernel_stack" + "pagetables" + "slab_unreclaimable" +
 * "percpu" + "sock", review rev189 F6; v1 counts kernel memory apart, in
 * memory.kmem.usage_in_bytes); v1's "total_mapped_file" is left out: it is
 * page cache the kernel can take
 * back, and mapped shmem is in it too (counted twice otherwise). The shmem
 * is every memfd page charged to the cgroup, wcached's copies of derived
 * artifacts among them, for as long as anyone maps them or keeps a
 * descriptor of them: a worker that released an artifact may still do so.
 * For the RAM, /proc/meminfo's MemTotal less MemAvailable (what the kernel
 * says is not available: mlocked and driver-pinned pages, ramfs, zswap and
 * its reserves too, review rev189 F2) less what free swap could take of it:
 * SwapFree, at most AnonPages + Shmem less Mlocked (review rev186 F3; a swap
 * device in RAM, zram, would take less). A cache the kernel does not know it
 * can shrink (the ZFS ARC) still counts as in use. The margin,
 * memlimit_use_margin(limit) (limit: the limit in force, 0: unknown), is
 * added to what the file says. 0 with *out, -errno when the file cannot be read,
 * -EBADMSG when it does not say. Any thread (it reads one file).
 */
int memlimit_use(const char *use_file, enum memlimit_kind kind, uint64_t limit, uint64_t *out);

/*
 * Pages per online CPU that memlimit_use() adds to what the kernel's files
 * say (review rev186 F5). They are per-CPU counts added up in batches: a
 * memory cgroup's (memcontrol.c) keeps up to MEMCG_CHARGE_BATCH (64) pages
 * of changes per CPU before it counts them for a flush, and a read of
 * memory.stat flushes only once more than 64 per online CPU are pending
 * (every 2 s otherwise); each CPU's charge stock holds up to 64 pages
 * charged to the limit that no statistic shows yet. That is 192 pages per
 * CPU; /proc/meminfo's counters (vmstat) keep up to 125 pages of changes per
 * CPU each. 256 covers either when they do not all peak at once. The margin
 * is at most 1/MEMLIMIT_USE_SLACK_SHARE of the limit, but that cap is never
 * below MEMLIMIT_USE_SLACK_CAP_MIN: on a machine of many CPUs a small limit
 * would otherwise be all margin, and a fixed cap (8 MiB before review rev189
 * F6) is below the kernel's own lag from 11 CPUs on (48 MiB at 64). Where
 * the cap cuts it, the figure can still lag by more, for at most the 2 s
 * between the kernel's periodic flushes.
 */
#define MEMLIMIT_USE_SLACK_PAGES 256
#define MEMLIMIT_USE_SLACK_SHARE 32
#define MEMLIMIT_USE_SLACK_CAP_MIN (UINT64_C(8) << 20)

/* The margin memlimit_use() adds under a limit of limit bytes (0: unknown),
 * in bytes: MEMLIMIT_USE_SLACK_PAGES pages for each online CPU, at most the
 * larger of limit / MEMLIMIT_USE_SLACK_SHARE and MEMLIMIT_USE_SLACK_CAP_MIN
 * (2 MiB on 2 CPUs with 4 KiB pages; 64 MiB on 64 CPUs under a limit of
 * 2 GiB or more, 8 MiB under 256 MiB). */
uint64_t memlimit_use_margin(uint64_t limit);

/* memlimit_use_margin() for cpus online CPUs of page bytes a page (each 0:
 * unknown, taken as 1 CPU of 4 KiB), which the unit tests give. */
uint64_t memlimit_use_margin_of(uint64_t cpus, uint64_t page, uint64_t limit);

/* What memlimit_use() measured for kind under limit, used bytes of it
 * (its margin, memlimit_use_margin(limit), said), in words for a
 * refusal into buf (len bytes, cut as memlimit_source() cuts): "wcached's
 * memory cgroup has about 80 MiB of anonymous memory and shmem in use
 * (memory.stat), which the kernel cannot reclaim without swap (2 MiB of it
 * allowed for the kernel's per-CPU counts not yet added up)", or for the
 * RAM "the machine has about 900 MiB in use that the kernel cannot reclaim
 * (/proc/meminfo: ...)". Returns buf. */
const char *memlimit_use_say(enum memlimit_kind kind, uint64_t limit, uint64_t used, char *buf,
	size_t len);

/* The word metrics label the kind with: "ram", "cgroup_v2", "cgroup_v1". */
const char *memlimit_kind_name(enum memlimit_kind k);

/* The machine's RAM in bytes (sysconf), 0 when unknown. */
uint64_t memlimit_ram(void);

/*
 * The parsers of the files the kernel writes that memlimit_read() reads,
 * on bytes copied out of them: memlimit_read() gives them each line as
 * getline(3) reads it, the fuzzer (tests/fuzz/fuzz_kernel.c) whole files.
 * text is len bytes, not terminated; a NUL ends its line early, as it ends
 * a C string. Each returns -ENOMEM when it cannot copy text.
 */

/* A limit at or above this is "unlimited" (v1 writes 2^63 rounded down to
 * a page; no machine has 4 EiB). */
#define MEMLIMIT_NO_LIMIT (UINT64_C(1) << 62)

/* One hierarchy the process is in: which cgroup, and where it is mounted.
 * Each string is cut to fit and terminated. */
struct memlimit_hierarchy {
	bool found;                         /* /proc/self/cgroup names it */
	char cgroup[MEMLIMIT_PATH_CAP];     /* its cgroup there */
	char root[MEMLIMIT_PATH_CAP];       /* the part of the hierarchy the mount shows */
	char mountpoint[MEMLIMIT_PATH_CAP]; /* "" until a mount of it is found */
};

/* Lines of /proc/self/cgroup: the v2 cgroup ("0::/path") into v2, the v1
 * memory controller's ("N:...,memory,...:/path") into v1; a later line
 * replaces an earlier one. 0 or -ENOMEM. */
int memlimit_parse_cgroups(const char *text, size_t len, struct memlimit_hierarchy *v2,
	struct memlimit_hierarchy *v1);

/* Lines of /proc/self/mountinfo: the root and mount point (octal escapes
 * undone) of the first cgroup2 mount into v2 and of the first cgroup mount
 * with the memory option into v1, each only once its found is set. 0 or
 * -ENOMEM. */
int memlimit_parse_mounts(const char *text, size_t len, struct memlimit_hierarchy *v2,
	struct memlimit_hierarchy *v1);

/* The path of h's cgroup below its mount point into rel (cap bytes, cut to
 * fit): "" for the mount's top, "/a/b" below it; a cgroup outside the
 * mount's root is its top. 0, or -1 when that path has a ".." component:
 * the kernel writes "/../x" inside a cgroup namespace for a cgroup outside
 * the namespace's root, which lies outside the mount, and memlimit_read()
 * reads no limit of that hierarchy then (it logs a warning saying so, once
 * for that path). */
int memlimit_cgroup_rel(const struct memlimit_hierarchy *h, char *rel, size_t cap);

/* A cgroup limit file's text (memory.max, memory.high,
 * memory.limit_in_bytes; memory.stat with key "hierarchical_memory_limit"):
 * 1 with the limit in bytes in *out when text holds the line that says it
 * (the first line; with key, the first "KEY VALUE" line), which is 0 when
 * it says no limit ("max", MEMLIMIT_NO_LIMIT or more) or no decimal number;
 * 0 when text has no such line, -ENOMEM; *out is set only on 1. */
int memlimit_parse_limit(const char *text, size_t len, const char *key, uint64_t *out);

/* The text of memlimit_use()'s file, whole, in kind's format, without its
 * margin: 1 with the bytes in use in *out when the first line of each key it
 * reads ("KEY N" in memory.stat; "KEY: N kB" in /proc/meminfo, blanks
 * before N) says a decimal number of bytes (of kB) that fits 64 bits: the
 * first two keys (v2 anon, shmem; v1 total_rss, total_shmem; meminfo
 * MemTotal, MemAvailable) must be there, a later one (v2 kernel,
 * kernel_stack, pagetables, slab_unreclaimable, percpu, sock; meminfo
 * AnonPages, Shmem, SwapFree, Mlocked) that is not there is 0, v2's kernel
 * where it is not there the sum of the five after it; sums cut at
 * UINT64_MAX, differences at 0, SwapFree taking at most AnonPages + Shmem -
 * Mlocked off MemTotal - MemAvailable. 0 when
 * a key's first line does not say a number or a first two is missing (*out
 * untouched), -ENOMEM. */
int memlimit_parse_use(const char *text, size_t len, enum memlimit_kind kind, uint64_t *out);

#endif
