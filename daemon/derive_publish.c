/*
 * derive_publish.c: a PUBLISH of a derived artifact (derive.h): the memfd is
 * checked on the work queue, then served, and the builder and every waiter
 * answered; or the build fails for good.
 *
 * Checking means sealing the memfd, copying it into a sealed memfd of
 * wcached's own (copy_artifact: the kernel charges a memfd's pages to the
 * memory cgroup of whoever wrote them, for as long as they live, so the
 * builder's would stay charged to the builder for as long as wcached keeps
 * the artifact, rev181 F7), reading the copy's index with the readers every
 * model goes through and sealing the compiled index: for a 100 MB
 * safetensors header, most of a second (several under a sanitizer), and
 * for a 256 MiB memfd up to a second of copying, which on the event loop
 * every client would wait for. The build waits instead (derive_build.check:
 * no deadline runs meanwhile), and so does the builder's connection. A
 * builder that goes away meanwhile (it published and exited) does not end
 * the build: the check owns the memfd and what it makes, and answers the
 * waiters when it ends (a refusal then hands the build on, as a builder
 * gone before publishing does). A build that ends
 * some other way while its check runs (wcached stopping) cancels it, and the
 * result is dropped when the check ends.
 *
 * The copy is memory wcached's cgroup cannot give back: before it, the check
 * reserves its room under the memory limit in force (check_reserve). Where
 * there is none, the check ends, the loop (which owns the artifacts)
 * reserves it and drops artifacts nobody holds, least recently used first,
 * if that makes room (make_copy_room), and queues the check again, once,
 * when their memory is let go in the closer's lanes of wcached's own for
 * their builders (wait_for_closes: at most DERIVE_CLOSES_WAIT_MS, then it
 * goes all the same); when what workers hold and the other checks
 * reserved leave no room it is refused. Then, just before the copy, the
 * kernel has the last word (check_kernel_room): a dropped artifact a
 * worker still maps is charged to wcached all the same. Where it finds no
 * room, the loop drops
 * that much more of what nobody holds, once (make_kernel_room: less what it
 * dropped for other checks the kernel refused whose memory this one's read
 * did not see go), and the check goes again, after the same wait (for
 * those others' closes too); else it is refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "closer.h"
#include "derive_internal.h"
#include "format/source.h"
#include "format/weig.h"
#include "generation.h"
#include "log.h"
#include "memlimit.h"
#include "proto/le.h"
#include "workq.h"

/*
 * A publication being checked on the work queue: sealing the memfd, reading
 * and compiling its index (up to a gigabyte of WEIG tables, a 100 MB
 * safetensors header: seconds that must not stall the loop). The build
 * waits for it (build->check, and no deadline runs meanwhile); the builder's
 * connection (build->builder, NULL once it went away) waits for its answer.
 * Nothing here belongs to that connection: the memfd is the check's, and
 * its closes go to the builder uid's lane (owner). build is NULL once the
 * build ended some other way (wcached stopping): the result is dropped, and
 * the copy stops at its next chunk (cancelled).
 */
/* Publication checks on the work queue at once (derive.h). */
#define DERIVE_CHECKS_AT_ONCE 2

/* The most lanes of the closer (builders) a check's copy waits on for the
 * artifacts dropped for it; those of further builders are not waited for,
 * and the kernel's word on what is in use (check_kernel_room) stands. */
#define DERIVE_DROP_LANES 8

/* Why the kernel may count more in use than wcached keeps. */
#define STILL_CHARGED "an artifact dropped to make room stays charged to wcached while a " \
	"worker that released it still maps it or keeps its descriptor"

/* Where a check stands with the room its copy takes in t->charged
 * (check_reserve). The one change from ROOM_WANTED is the loop's
 * (make_copy_room); the others are the check's thread's. */
enum check_room {
	ROOM_UNASKED = 0, /* check_reserve has not run */
	ROOM_WANTED,      /* it found none: on the loop, room is reserved and
			   * artifacts nobody holds dropped if that makes room, and
			   * the check is queued again once their memory is let
			   * go; else it is refused */
	ROOM_RESERVED,    /* c->reserved is in t->charged (0: no limit known) */
	ROOM_SHORT,       /* reserved, but the kernel says c->short_by more is in
			   * use than wcached counts (check_kernel_room): on the
			   * loop, that much of what nobody holds is dropped, once
			   * (make_kernel_room), and the check queued again once
			   * its memory is let go; else it is refused */
};

struct derive_check {
	struct workq_job job;
	struct derive_check *next; /* in t->checks_running or t->checks_waiting */
	int waiting;             /* in t->checks_waiting: not queued yet */
	struct derive_table *t;
	struct derive_build *build;
	uint32_t seq;            /* the PUBLISH's, for the builder's answer */
	uid_t owner;
	uint64_t budget;         /* memory_budget when it was queued */
	uint64_t limit;          /* the memory limit in force (0: unknown): the bound
				    without one, and where it comes from */
	int limit_ram;           /* 1: that limit is the RAM (derive_table.mem_ram) */
	char limit_source[DERIVE_MEM_SOURCE];
	enum memlimit_kind limit_kind; /* and where the kernel says what of it */
	char use_file[MEMLIMIT_PATH_CAP * 2]; /* is in use (memlimit_use; "": unknown) */
	char label[WIRE_MAX_NAME + WIRE_MAX_KEY + 16];
	int fd;                  /* the builder's memfd, then wcached's copy */
	int fd_copy;             /* 1: fd is wcached's copy, charged to wcached's
				  * memory: let go in the builder's own lane of
				  * wcached's, never one the builder can hold up
				  * (review rev193 F1) */
	uint64_t size;           /* the memfd's, once sealed and checked (check_open):
				  * a check queued again starts at its copy */
	enum check_room room;
	double copy_s;           /* how long copy_artifact took */
	uint64_t reserved;       /* added to t->charged by check_reserve (or by
				  * make_copy_room, on the loop), taken back by
				  * check_free (on the loop) */
	uint64_t uncopied;       /* added to t->uncopied before the copy, taken
				  * back as it is copied and by check_free */
	/* What make_copy_room dropped for it, and the lanes of the closer
	 * their memory is let go in: its copy waits there (closer_then) until
	 * closes_deadline_ms (closing: in t->checks_closing; closes_through:
	 * closer_then's done ran, on a lane's thread: atomic). */
	unsigned dropped;
	uint64_t dropped_bytes;
	uid_t lanes[DERIVE_DROP_LANES];
	size_t nlanes;
	int closing;
	int closes_through;
	uint64_t closes_since_ms, closes_deadline_ms;
	/* The time it waited for closes in vain (closes_late), and what the
	 * kernel's refusal found: what of the limit was in use (kernel_used)
	 * and by how much the copy passed it (short_by); kernel_dropped: the
	 * loop dropped that much more for it already (once a check), when the
	 * kernel's figure was used_at_drop, and the bytes that should come off
	 * it (what it and the others it counted on dropped: to_come_off,
	 * review rev189 F5). */
	uint64_t late_ms;
	uint64_t kernel_used, short_by, used_at_drop, to_come_off;
	/* For the other checks the kernel refused in the same while (review
	 * rev189 F3): when check_kernel_room last read what is in use
	 * (kernel_read_ns, CLOCK_MONOTONIC), the bytes make_kernel_room dropped
	 * for it that it has not measured since (kernel_dropping: cleared by
	 * that read, on its thread: atomic), when its last wait's closes came
	 * through (let_go_ns, set by closes_then on a lane's thread: atomic; 0:
	 * not yet), and what of others' drops it counted on (kernel_others).
	 * kernel_again: refused again after it counted on others' drops, it
	 * dropped up to that much more of its own, once (review rev192 P2). */
	uint64_t kernel_read_ns;
	uint64_t kernel_dropping;
	uint64_t let_go_ns;
	uint64_t kernel_others;
	int kernel_dropped;
	int kernel_again;
	int cancelled;           /* set on the loop (derive_check_cancel), read
				  * by the copy between chunks: atomic */
	/* What the check made: the source, its served descriptors and the
	 * sealed index; or err with why. */
	struct model_source src;
	int *served;
	int index_fd;
	const uint8_t *index;
	int err;
	/* A kernel refusal's reasons run past ERROR_MAX (memlimit_use_say,
	 * the limit's source, what was dropped, the wait in vain); the
	 * builder's answer has the rest of WIRE_MAX_MESSAGE. */
	char why[WIRE_MAX_MESSAGE / 2];
};

/* CLOCK_MONOTONIC in ns, on any thread: orders a kernel check's read of
 * what is in use against the closes of others' drops (make_kernel_room). */
static uint64_t
mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Seals fd for good: 0, or -errno with why. */
static int
seal_artifact(int fd, char *why, size_t why_size)
{
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals == -1) {
		snprintf(why, why_size, "the descriptor is not a memfd that can be sealed (%s); "
			 "make it with memfd_create(MFD_ALLOW_SEALING)", strerror(errno));
		return -EINVAL;
	}
	if ((seals & F_SEAL_SEAL) && (seals & DERIVE_ARTIFACT_SEALS) != DERIVE_ARTIFACT_SEALS) {
		snprintf(why, why_size, "the memfd is already sealed against sealing (F_SEAL_SEAL) "
			 "without F_SEAL_WRITE, F_SEAL_SHRINK and F_SEAL_GROW");
		return -EINVAL;
	}
	if ((seals & DERIVE_ARTIFACT_SEALS) != DERIVE_ARTIFACT_SEALS &&
		fcntl(fd, F_ADD_SEALS, DERIVE_ARTIFACT_SEALS & ~seals) == -1) {
		int e = errno;

		/* The kernel counts every MAP_SHARED mapping made through a
		 * writable descriptor, PROT_READ ones too: mprotect() could
		 * make them writable after the seal. */
		if (e == EBUSY)
			snprintf(why, why_size, "the memfd still has a shared mapping made through "
				 "a writable descriptor, read-only ones included: munmap it "
				 "before publishing");
		else
			snprintf(why, why_size, "sealing the memfd: %s", strerror(e));
		return -e;
	}
	return 0;
}

/* Drops what c made (or holds) and frees it. */
static void
check_free(struct derive_check *c)
{
	/* Perhaps the last reference to gigabytes (wcached's reopens, once
	 * checked, or the received descriptor) and to an index as large as
	 * the builder's header made it: freed off the loop, mappings too. */
	closer_unmap_close(c->t->closer, c->owner, (void *)c->index,
		c->index != NULL ? c->src.index_len : 0, c->index_fd);
	gen_close_files_in(c->t->r, c->owner, c->served, &c->src);
	if (c->fd_copy)
		closer_unmap_close(c->t->closer, c->owner, NULL, 0, c->fd);
	else
		closer_close(c->t->closer, c->owner, c->fd);
	/* Published, its weight is in derived_bytes and t->charged by now
	 * (make_artifact); else the reservation was all there was. */
	if (c->reserved != 0)
		__atomic_sub_fetch(&c->t->charged, c->reserved, __ATOMIC_RELAXED);
	if (c->uncopied != 0)
		__atomic_sub_fetch(&c->t->uncopied, c->uncopied, __ATOMIC_RELAXED);
	if (c->closing) {
		/* No done of closer_then() for c runs from here on. */
		closer_forget(c->t->closer, c);
		for (struct derive_check **pp = &c->t->checks_closing; *pp != NULL;
			pp = &(*pp)->next)
			if (*pp == c) {
				*pp = c->next;
				break;
			}
	}
	free(c);
}

void
derive_set_memory_limit(struct derive_table *t, const struct memlimit *m)
{
	t->mem_limit = m->limit;
	t->mem_ram = m->kind == MEMLIMIT_RAM;
	memlimit_source(m, t->mem_source, sizeof(t->mem_source));
	memcpy(t->mem_use_file, m->use_file, sizeof(t->mem_use_file));
	t->mem_kind = m->kind;
	__atomic_store_n(&t->use_unread_err, 0, __ATOMIC_RELAXED);
}

int
derive_memfd_whole(const struct stat *st, char *why, size_t why_size)
{
	/* st_blocks counts tmpfs's allocated pages, fallocated ones too
	 * (SEEK_HOLE calls those holes until written). */
	if ((uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size) {
		snprintf(why, why_size, "the memfd is sparse: only %" PRIu64 " of its %" PRIu64
			 " bytes have memory behind them", (uint64_t)st->st_blocks * 512,
			(uint64_t)st->st_size);
		return -EBADMSG;
	}
	return 0;
}

/* Whether bytes (the memfd, and what follows in words: "" or the index too)
 * is more than memory_budget or, without one, the memory limit in force
 * (RAM, or wcached's cgroup's when smaller: it also bounds the artifact's
 * mapping in wcached's address space): -EFBIG with c->why, else 0. */
static int
over_bound(struct derive_check *c, uint64_t bytes, const char *what)
{
	if (c->budget != 0 && bytes > c->budget)
		snprintf(c->why, sizeof(c->why), "%" PRIu64 " MiB%s is more than memory_budget (%"
			 PRIu64 " MiB)", bytes >> 20, what, c->budget >> 20);
	else if (c->budget == 0 && c->limit != 0 && bytes > c->limit)
		snprintf(c->why, sizeof(c->why), "%" PRIu64 " MiB%s is more than the memory limit "
			 "in force (%" PRIu64 " MiB, %s), the most an artifact may be without a "
			 "memory_budget", bytes >> 20, what, c->limit >> 20, c->limit_source);
	else
		return 0;
	return c->err = -EFBIG;
}

/* What c's copy of its memfd (c->size bytes) takes of the memory limit in
 * force: twice the size where that limit is the RAM, which holds the
 * builder's memfd too while it is copied. */
static uint64_t
check_need(const struct derive_check *c)
{
	return c->limit_ram ? 2 * c->size : c->size;
}

/* Reserves the memory c's copy takes (check_need) in t->charged: 0, or
 * -ENOMEM (ROOM_WANTED, nothing kept reserved) when the artifacts wcached
 * keeps, the copies of the other checks running and this one would pass
 * the memory limit in force. The kernel charges wcached's copies to
 * wcached's memory cgroup and cannot reclaim them without swap: past its
 * limit the cgroup's OOM killer would kill wcached (review rev183 F1), and
 * past the RAM the machine's would. Artifacts nobody holds count too, but
 * the loop drops them to make room before it refuses (make_copy_room): the
 * registry and the artifacts are the loop's. */
static int
check_reserve(struct derive_check *c)
{
	uint64_t need = check_need(c), now = __atomic_load_n(&c->t->charged, __ATOMIC_RELAXED);

	c->room = ROOM_RESERVED;
	if (c->limit == 0)
		return 0;
	/* Added only where it fits: no other thread (nor the loop's
	 * make_copy_room) ever sees a reservation that is then taken back
	 * (review rev184 F3). */
	do {
		if (now + need > c->limit) {
			c->room = ROOM_WANTED;
			return c->err = -ENOMEM;
		}
	} while (!__atomic_compare_exchange_n(&c->t->charged, &now, now + need, 1,
		__ATOMIC_RELAXED, __ATOMIC_RELAXED));
	c->reserved = need;
	return 0;
}

/* The head fd's reader would read and parse (the safetensors header, or a
 * WEIG file's tables), from its first bytes, before anything is parsed,
 * into *head_out (0: none read): -EFBIG with c->why past DERIVE_MAX_HEAD,
 * else 0 (a head the reader finds implausible is its to explain). */
uint64_t
derive_head_len(int fd, uint64_t size)
{
	uint8_t prefix[WEIG_HEADER_SIZE];
	ssize_t n;

	while ((n = pread(fd, prefix, sizeof(prefix), 0)) < 0 && errno == EINTR)
		;
	if (n < 4)
		return 0;
	/* The reader source_open_fd() takes next (WEIG's reads either byte
	 * order). */
	return source_file_reader(get_le32(prefix))->head_len(prefix, (size_t)n, size);
}

static int
check_head(struct derive_check *c, int fd, uint64_t size, uint64_t *head_out)
{
	uint64_t head = derive_head_len(fd, size);

	*head_out = 0;
	if (head <= DERIVE_MAX_HEAD) {
		*head_out = head;
		return 0;
	}
	snprintf(c->why, sizeof(c->why), "its header is %.1f MiB, more than the %u MiB a "
		 "derived artifact's header may be (its tensors and metadata are indexed in "
		 "wcached's memory)", (double)head / 1048576.0, DERIVE_MAX_HEAD >> 20);
	return c->err = -EFBIG;
}

/* The compiled index c made, past DERIVE_MAX_INDEX: -EFBIG with c->why;
 * with the memfd's size, past the bound of one artifact (over_bound);
 * else 0. */
static int
check_index(struct derive_check *c, uint64_t size)
{
	uint64_t len = c->src.index_len, tensors = 0;
	char what[96];

	if (len >= INDEX_HEADER_SIZE)
		tensors = get_le64(c->src.index + offsetof(struct index_header, tensor_count));
	if (len > DERIVE_MAX_INDEX) {
		snprintf(c->why, sizeof(c->why), "its compiled index (%" PRIu64 " tensors) would "
			 "be %.1f MiB of wcached's memory, more than the %u MiB one derived "
			 "artifact's index may be", tensors, (double)len / 1048576.0,
			DERIVE_MAX_INDEX >> 20);
		return c->err = -EFBIG;
	}
	snprintf(what, sizeof(what), " (%" PRIu64 " MiB of memfd and %" PRIu64 " KiB of "
		 "compiled index)", size >> 20, len >> 10);
	return over_bound(c, size + len, what);
}

/* Bytes copy_artifact copies per call: a cancelled check stops within one
 * (1 to 4 ms at the 280 to 1200 MB/s README's "Lifecycle" measures). */
#define COPY_CHUNK (1u << 20)

/* The name wcached's copies of artifacts go by (/proc/PID/fd: memfd:NAME). */
#define COPY_NAME "wcache-artifact"

/* copy_artifact failed (err, -errno) at byte done of size: c->err, c->why. */
static int
copy_failed(struct derive_check *c, int err, const char *what, uint64_t done, uint64_t size)
{
	snprintf(c->why, sizeof(c->why), "wcached could not copy the memfd into memory of its "
		 "own (which wcached's memory cgroup pays for): %s: %s, at byte %" PRIu64 " of %"
		 PRIu64, what, strerror(-err), done, size);
	return c->err = err;
}

/* Whether copy_file_range's err (-errno), before any byte was copied,
 * says only that it cannot copy between these two files (another
 * filesystem: a hugetlbfs memfd; a kernel or seccomp filter without it),
 * so that pread and pwrite copy instead. */
static int
copy_range_unusable(int err)
{
	return err == -EXDEV || err == -EINVAL || err == -ENOSYS || err == -EOPNOTSUPP ||
		err == -EPERM;
}

/* Writes len bytes of buf at off of fd: 0 or -errno. */
static int
pwrite_all(int fd, const char *buf, size_t len, uint64_t off)
{
	while (len > 0) {
		ssize_t w = pwrite(fd, buf, len, (off_t)off);

		if (w == -1 && errno == EINTR)
			continue;
		if (w <= 0)
			return w == 0 ? -EIO : -errno;
		buf += w;
		len -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/*
 * Work queue thread: copies the size bytes of src (a read-only reopen of the
 * builder's sealed memfd) into a memfd of wcached's own, COPY_CHUNK bytes a
 * call, seals it (DERIVE_ARTIFACT_SEALS) and reopens it read-only: that
 * reopen, or -errno with c->why (ENOMEM, ENOSPC: no memory for the copy;
 * ECANCELED: the check was cancelled). Written by this thread, the copy's
 * pages are charged to wcached's memory cgroup; the builder's are freed
 * once wcached closes src and the builder its own descriptors.
 */
static int
copy_artifact(struct derive_check *c, int src, uint64_t size)
{
	char *buf = NULL;
	uint64_t done = 0;
	int fd, ro, by_read = 0, err = 0;
	const char *what = "copy_file_range";

	if ((fd = memfd_create(COPY_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING)) == -1)
		return copy_failed(c, -errno, "memfd_create", 0, size);
	while (done < size && err == 0) {
		size_t want = size - done < COPY_CHUNK ? (size_t)(size - done) : COPY_CHUNK;
		ssize_t n;

		if (__atomic_load_n(&c->cancelled, __ATOMIC_RELAXED)) {
			err = -ECANCELED;
			what = "the build ended while it was copied";
			break;
		}
		if (!by_read) {
			loff_t in = (loff_t)done, out = (loff_t)done;

			n = copy_file_range(src, &in, fd, &out, want, 0);
			if (n == -1 && done == 0 && copy_range_unusable(-errno)) {
				by_read = 1;
				what = "read";
				if ((buf = malloc(COPY_CHUNK)) == NULL) {
					err = -ENOMEM;
					what = "a buffer to copy through";
				}
				continue;
			}
		} else {
			n = pread(src, buf, want, (off_t)done);
			if (n > 0 && (err = pwrite_all(fd, buf, (size_t)n, done)) < 0) {
				what = "write";
				break;
			}
		}
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1)
			err = -errno;
		else if (n == 0)
			err = -EIO; /* sealed against shrinking: never */
		else
			done += (uint64_t)n;
		if (n > 0 && c->uncopied >= (uint64_t)n) {
			/* In what the kernel says is in use from here on. */
			c->uncopied -= (uint64_t)n;
			__atomic_sub_fetch(&c->t->uncopied, (uint64_t)n, __ATOMIC_RELAXED);
		}
	}
	free(buf);
	if (err == 0 && fcntl(fd, F_ADD_SEALS, DERIVE_ARTIFACT_SEALS) == -1) {
		err = -errno;
		what = "sealing the copy";
	}
	if (err < 0) {
		close(fd);
		return copy_failed(c, err, what, done, size);
	}
	ro = fd_reopen_read_only(fd, COPY_NAME);
	close(fd);
	if (ro < 0) {
		snprintf(c->why, sizeof(c->why), "%s", error_get());
		return c->err = ro;
	}
	return ro;
}

/* Work queue thread: seals the memfd for good, reopens it read-only (the
 * received descriptor is the builder's open file description, its offset
 * and flags the builder's to change), closes the builder's, and checks its
 * size (the bound of one artifact) and that it is whole: c->size, or
 * c->err with why. */
static int
check_open(struct derive_check *c)
{
	struct stat st;
	int fd;

	if ((c->err = seal_artifact(c->fd, c->why, sizeof(c->why))) < 0)
		return c->err;
	if ((fd = fd_reopen_read_only(c->fd, c->label)) < 0) {
		snprintf(c->why, sizeof(c->why), "%s", error_get());
		return c->err = fd;
	}
	closer_close(c->t->closer, c->owner, c->fd);
	c->fd = fd;
	/* A failed fstat is its own reason, not an empty artifact the builder
	 * would look for in its own code. */
	if (fstat(fd, &st) == -1) {
		c->err = -errno;
		snprintf(c->why, sizeof(c->why), "the memfd: fstat: %s", strerror(-c->err));
		return c->err;
	}
	if (st.st_size <= 0) {
		snprintf(c->why, sizeof(c->why), "the memfd is empty");
		return c->err = -EBADMSG;
	}
	/* The memfd alone first (its index is counted once compiled). Without
	 * a budget, against the RAM, twice over: the builder's memfd and
	 * wcached's copy of it are both there while it is copied (a cgroup
	 * limit of wcached's is charged the copy alone). */
	if (c->budget == 0 && c->limit_ram) {
		if (over_bound(c, 2 * (uint64_t)st.st_size, " (the memfd twice: the builder's "
			 "and wcached's copy of it, while it is copied)") < 0)
			return c->err;
	} else if (over_bound(c, (uint64_t)st.st_size, "") < 0) {
		return c->err;
	}
	/* Every page must have memory behind it, paid for by the builder; the
	 * seals forbid punching holes from here on. */
	if ((c->err = derive_memfd_whole(&st, c->why, sizeof(c->why))) < 0) {
		size_t n = strlen(c->why);

		snprintf(c->why + n, sizeof(c->why) - n, "; write (or fallocate) every byte "
			 "before publishing");
		return c->err;
	}
	c->size = (uint64_t)st.st_size;
	return 0;
}

/* Work queue thread: what the kernel says is in use of the limit could not
 * be read (err, -errno of memlimit_use): said once a reload (and again
 * when the reason changes), not once a publication. */
static void
use_unread(struct derive_check *c, int err)
{
	if (__atomic_exchange_n(&c->t->use_unread_err, err, __ATOMIC_RELAXED) == err)
		return;
	if (c->use_file[0] == '\0')
		log_warnx("derived artifacts: wcached found no file that says what of the memory "
			  "limit in force (%" PRIu64 " MiB, %s) is in use: publications are "
			  "checked against wcached's own count only (an artifact dropped while a "
			  "worker still maps it is not in it)", c->limit >> 20, c->limit_source);
	else
		log_warnx("derived artifacts: %s: %s: publications are checked against "
			  "wcached's own count only, not what the kernel says is in use of the "
			  "memory limit in force (%" PRIu64 " MiB, %s; an artifact dropped while "
			  "a worker still maps it is not in that count)", c->use_file,
			err == -EBADMSG ? "it does not say what is in use (no such keys)" :
					  strerror(-err), c->limit >> 20, c->limit_source);
}

/*
 * Work queue thread, before the copy: what the kernel says is in use of the
 * memory limit in force (memlimit_use: an estimate, with a margin, of what
 * the kernel cannot reclaim in wcached's memory cgroup or the machine), with the
 * copies the checks running have yet to make (t->uncopied, this one's
 * included: added once a check) and room for the header the readers parse
 * and its compiled index (twice the header, at most DERIVE_MAX_INDEX: an
 * estimate), must fit under it: -ENOMEM with c->why where not (ROOM_SHORT:
 * the loop drops as much of what nobody holds, once, or refuses it,
 * make_kernel_room). t->charged counts only what wcached keeps, and wcached
 * cannot see who else maps its memfds: an artifact dropped to make room
 * stays charged to wcached's cgroup while a worker that released it still
 * maps it, keeps its descriptor, or a forked child does (review rev184 F1);
 * past the limit the OOM killer would kill wcached. Where the kernel does
 * not say (no such file), the reservation alone stands (logged: use_unread).
 */
static int
check_kernel_room(struct derive_check *c, uint64_t head)
{
	uint64_t used, pending, index_room, others;
	char whose[320], copying[80] = "";
	int err;

	if (c->limit == 0)
		return 0;
	if (c->uncopied == 0) {
		c->uncopied = c->size;
		pending = __atomic_add_fetch(&c->t->uncopied, c->size, __ATOMIC_RELAXED);
	} else {
		pending = __atomic_load_n(&c->t->uncopied, __ATOMIC_RELAXED);
	}
	/* Its own drops for the kernel are in this read from here on: the
	 * other checks count them no more (make_kernel_room). */
	__atomic_store_n(&c->kernel_dropping, 0, __ATOMIC_RELAXED);
	err = memlimit_use(c->use_file, c->limit_kind, c->limit, &used);
	/* Stamped once the read is done: closes that came through while it
	 * read count as seen in it (review rev192 P2: stamped before, they
	 * counted as still to come, and the check dropped that much less). */
	c->kernel_read_ns = mono_ns();
	if (err < 0) {
		use_unread(c, err);
		return 0;
	}
	index_room = head + (2 * head < DERIVE_MAX_INDEX ? 2 * head : DERIVE_MAX_INDEX);
	if (used <= c->limit && pending + index_room <= c->limit - used)
		return 0;
	others = pending - c->size;
	memlimit_use_say(c->limit_kind, c->limit, used, whose, sizeof(whose));
	if (others != 0)
		snprintf(copying, sizeof(copying), ", other publications have %" PRIu64 " MiB yet "
			 "to copy", others >> 20);
	snprintf(c->why, sizeof(c->why), "%s%s, and this one's copy of %" PRIu64 " MiB and "
		 "about %" PRIu64 " KiB for its header and index would pass the memory limit in "
		 "force (%" PRIu64 " MiB, %s), which its copy is charged to: no room for it now, "
		 "though wcached's own count had some", whose, copying, c->size >> 20,
		(index_room + 1023) >> 10, c->limit >> 20, c->limit_source);
	c->kernel_used = used;
	c->short_by = used + pending + index_room - c->limit;
	c->room = ROOM_SHORT;
	return c->err = -ENOMEM;
}

/* Work queue thread: seals and checks the memfd (check_open: once; a check
 * queued again after the loop made room for it starts at its copy),
 * reserves the memory of its copy (check_reserve), checks its header's
 * size and that the kernel agrees there is room (check_kernel_room),
 * copies it into a memfd
 * of wcached's own (copy_artifact: wcached's cgroup pays for what it keeps,
 * not the builder's), closes the builder's, validates the copy with the
 * readers every model goes through and seals its index. */
static void
check_run(struct workq_job *job)
{
	struct derive_check *c = job->arg;
	struct timespec t0, t1;
	uint64_t head;
	int fd;

	if (c->size == 0 && check_open(c) < 0)
		return;
	if (c->room != ROOM_RESERVED && check_reserve(c) < 0)
		return;
	/* The builder's sealed memfd has the copy's bytes. */
	if (check_head(c, c->fd, c->size, &head) < 0 || check_kernel_room(c, head) < 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if ((fd = copy_artifact(c, c->fd, c->size)) < 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	c->copy_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	/* The builder's memory goes with its own last descriptor. */
	closer_close(c->t->closer, c->owner, c->fd);
	c->fd = fd;
	c->fd_copy = 1;
	if ((c->err = source_open_fd(fd, c->label, &c->src)) < 0) {
		snprintf(c->why, sizeof(c->why), "%s", error_get());
		if (c->err != -ENOMEM)
			c->err = -EBADMSG;
		return;
	}
	c->fd = -1; /* the source's now */
	if (check_index(c, c->size) < 0)
		return;
	if ((c->err = gen_open_served(&c->src, &c->served)) < 0 ||
		(c->err = gen_seal_index(c->src.index, c->src.index_len, &c->index_fd,
			 &c->index)) < 0)
		snprintf(c->why, sizeof(c->why), "%s", error_get());
}

/* Makes the artifact of b from what c checked: 0 and *out, or -errno with
 * c->why. Takes c's source, descriptors and index on success. */
static int
make_artifact(struct derive_table *t, struct derive_build *b, struct derive_check *c,
	struct derived **out)
{
	struct derived *a;
	struct generation *g;

	if (derive_entry_of(t, b->model_name, b->entry_id) == NULL) {
		snprintf(c->why, sizeof(c->why), "the model is no longer served");
		return -ENOENT;
	}
	if ((a = calloc(1, sizeof(*a))) == NULL ||
		(a->model_name = strdup(b->model_name)) == NULL ||
		(g = gen_new(t->r, b->model_name, b->source, &c->src, c->served, c->index_fd,
			 c->index, c->src.index_len)) == NULL) {
		int e = a != NULL && a->model_name != NULL ? errno : ENOMEM;

		/* gen_new's reason (the index memfd not reopened, EMFILE) too. */
		snprintf(c->why, sizeof(c->why), "%s", e == ENOMEM ? "out of memory" : error_get());
		if (a != NULL)
			free(a->model_name);
		free(a);
		return -e;
	}
	/* The generation's now. */
	memset(&c->src, 0, sizeof(c->src));
	c->served = NULL;
	c->index_fd = -1;
	c->index = NULL;
	/* The index lives on in the sealed memfd. */
	free(g->source.index);
	g->source.index = NULL;
	gen_set_state(g, GEN_READY, "published");
	g->kept = 1;
	g->artifact = 1;
	g->builder_uid = b->builder_uid;
	a->entry_id = b->entry_id;
	a->source = b->source;
	memcpy(a->key, b->key, sizeof(a->key));
	a->gen = g;
	a->builder_uid = b->builder_uid;
	a->builder_pid = b->builder_pid;
	a->builder_cred = b->builder_cred; /* the artifact's now */
	b->builder_cred = (struct derive_cred){ .gid = (gid_t)-1 };
	a->build_seconds = (double)(derive_now_ms(t) - b->started_ms) / 1000.0;
	a->last_use = ++t->r->attach_seq;
	a->next = t->artifacts;
	t->artifacts = a;
	derive_count(t, derive_weight(g), 1);
	t->stats.published++;
	t->stats.published_bytes += g->bytes;
	*out = a;
	/* The warm restart keeps the store in step (restore_sync). */
	if (t->r->changed != NULL)
		t->r->changed(t->r);
	return 0;
}

/* The publication of b, whose builder has gone, was refused (why): unless
 * no builder could mend that (the model is no longer served, wcached
 * stops), the build goes on with the oldest waiter that may build, as when
 * a builder goes away before publishing, and the waiters learn the reason. */
static void
refused_after_builder_left(struct derive_table *t, struct derive_build *b, int status,
	const char *why)
{
	char text[WIRE_MAX_MESSAGE];

	if (status >= 0 && derive_entry_of(t, b->model_name, b->entry_id) != NULL) {
		snprintf(text, sizeof(text), "disconnected after publishing, and its publication "
			 "was refused: %s", why);
		derive_builder_lost(t, b, text);
		return;
	}
	snprintf(text, sizeof(text), "model \"%s\": derived \"%s\" of generation %" PRIu64
		 ": the publication by pid %d (which has disconnected) was refused: %s",
		b->model_name, b->key, b->source, (int)b->builder_pid, why);
	derive_build_fail(t, b, -ECANCELED, text);
}

/* On the loop: the check of c ended (status UV_ECANCELED: it never ran,
 * wcached is stopping). Serves the artifact and answers the builder (if
 * still there) and every waiter, or fails the build for good (or, its
 * builder gone, hands it on). */
static void
check_finish(struct derive_check *c, int status)
{
	struct derive_table *t = c->t;
	struct derive_build *b = c->build;
	struct derive_waiter *w, *next;
	struct derived *a = NULL;
	struct generation *g;
	char text[WIRE_MAX_MESSAGE], more[128];
	int err = c->err;
	uint32_t seq;
	double copy_s;
	void *builder;

	if (b == NULL) {
		check_free(c);
		return;
	}
	b->check = NULL;
	builder = b->builder; /* NULL: it went away after its PUBLISH */
	if (status < 0) {
		err = -ECANCELED;
		snprintf(c->why, sizeof(c->why), "wcached is stopping");
	}
	/* A reload may have narrowed derive_groups while it was checked. */
	if (err == 0 && !derive_builder_may(t, b, c->why, sizeof(c->why)))
		err = -EPERM;
	if (err == 0)
		err = make_artifact(t, b, c, &a);
	if ((err < 0 || a == NULL) && builder == NULL) {
		refused_after_builder_left(t, b, status, c->why);
		check_free(c);
		return;
	}
	if (err < 0 || a == NULL) {
		snprintf(text, sizeof(text), "model \"%s\": derived \"%s\" of generation %" PRIu64
			 ": the publication by pid %d was refused: %s", b->model_name, b->key,
			b->source, (int)b->builder_pid, c->why);
		/* The build ends for good first: the builder's answer may close
		 * its connection, and then no waiter must take the build over. */
		derive_build_fail(t, b, -ECANCELED, text);
		t->hooks.fail(builder, c->seq, err < 0 ? err : -EIO, text);
		check_free(c);
		return;
	}
	seq = c->seq;
	copy_s = c->copy_s;
	check_free(c);
	if (derive_may_log(t, a->builder_uid, more, sizeof(more)))
		log_info("model \"%s\": derived \"%s\" of generation %" PRIu64 " published by pid "
			 "%d uid %u%s: %" PRIu64 " bytes (%s), built in %.1f s, copied into "
			 "wcached's memory in %.3f s; %s%s",
			a->model_name, a->key, a->source, (int)a->builder_pid,
			(unsigned)a->builder_uid,
			builder == NULL ? " (which has disconnected)" : "", a->gen->bytes,
			source_format_name(a->gen->source.format), a->build_seconds, copy_s,
			b->waiters != NULL ? "answering its waiters" : "nobody waited", more);
	derive_unlink_build(t, b);
	w = b->waiters;
	b->waiters = NULL;
	/* Held until every answer is out: an answer whose send fails closes
	 * that connection at once, and its release, or the memory budget when
	 * the builder could not attach (too many attaches), would drop a while
	 * waiters still need it. The release drops it if it is superseded and
	 * nobody else holds it; the budget then counts it as it is. */
	g = a->gen;
	gen_ref(t->r, g);
	if (builder != NULL)
		t->hooks.published(builder, seq, a);
	for (; w != NULL; w = next) {
		next = w->next;
		t->hooks.ready(w->conn, w->seq, a);
		free(w);
	}
	derive_build_free(t, b);
	derive_release(t, g, REGISTRY_NO_UID); /* a may be gone from here on */
	registry_enforce_budget(t->r);
	derive_rearm(t);
}

/* Unlinks c from the list at *head; whether it was there. */
static int
check_unlink(struct derive_check **head, const struct derive_check *c)
{
	for (struct derive_check **pp = head; *pp != NULL; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			return 1;
		}
	return 0;
}

/* Whether a check of a builder of uid owner may go to the work queue now
 * (derive.h: DERIVE_CHECKS_AT_ONCE, one per uid). */
static int
check_may_start(const struct derive_table *t, uid_t owner)
{
	if (t->nchecks_running >= DERIVE_CHECKS_AT_ONCE)
		return 0;
	for (const struct derive_check *r = t->checks_running; r != NULL; r = r->next)
		if (r->owner == owner)
			return 0;
	/* One waiting for closes too: it holds a reservation and dropped
	 * others' artifacts (review rev186 F6). */
	for (const struct derive_check *r = t->checks_closing; r != NULL; r = r->next)
		if (r->owner == owner)
			return 0;
	return 1;
}

static void check_done(struct workq_job *job, int status);
static void closes_late(uv_timer_t *h);

/* Queues c's check on the work queue: 0, or -errno (nothing queued). */
static int
check_start(struct derive_table *t, struct derive_check *c)
{
	int err = workq_submit(&t->r->workq, &c->job, WORKQ_LOCAL, NULL, check_run, check_done);

	if (err < 0)
		return err;
	c->waiting = 0;
	c->next = t->checks_running;
	t->checks_running = c;
	t->nchecks_running++;
	return 0;
}

/*
 * Whether c's builder may still build (derive_builder_may); where a reload
 * shut it out since its PUBLISH, c is refused with EPERM and why
 * (check_finish answers the builder and the waiters; its reservation goes
 * with it) and this is 0. Asked before c makes room (dropping artifacts
 * nobody holds, other users' too), takes a place or copies: before, a
 * publication already checked when the reload came did all that, only to
 * be refused at the end of its check (review rev190 D3).
 */
static int
builder_still_may(struct derive_check *c)
{
	if (c->build == NULL || derive_builder_may(c->t, c->build, c->why, sizeof(c->why)))
		return 1;
	c->err = -EPERM;
	check_finish(c, 0);
	return 0;
}

/* Starts the first waiting checks that may start, in order. A check that
 * cannot be queued ends as one wcached stops for (check_finish), which may
 * cancel others: the walk starts again from the first each time. */
static void
check_pump(struct derive_table *t)
{
	struct derive_check *c;

	for (c = t->checks_waiting; c != NULL;) {
		if (!check_may_start(t, c->owner)) {
			c = c->next;
			continue;
		}
		check_unlink(&t->checks_waiting, c);
		c->waiting = 0;
		if (builder_still_may(c) && check_start(t, c) < 0)
			check_finish(c, UV_ECANCELED);
		c = t->checks_waiting;
	}
}

/*
 * On the loop: c found no room for its copy (ROOM_WANTED). Reserves it first
 * (so that no check's thread takes the room meanwhile, review rev184 F3),
 * and where that passes the memory limit in force and dropping artifacts
 * nobody holds makes room, drops them, least recently used first
 * (derive_drop_unheld: one line each; c->lanes: where their memory is let
 * go): 1, and c is to be queued again once it is. Else 0 with nothing
 * reserved or dropped, and c->err and c->why: what workers hold and what
 * the other checks reserved leave no room.
 */
static int
make_copy_room(struct derive_check *c)
{
	struct derive_table *t = c->t;
	const struct derive_build *b = c->build;
	uint64_t need = check_need(c), unheld, before, held, copying;
	char why[WIRE_MAX_KEY + 200], kept[96];

	if (derive_entry_of(t, b->model_name, b->entry_id) == NULL) {
		snprintf(c->why, sizeof(c->why), "the model is no longer served");
		c->err = -ENOENT;
		return 0;
	}
	/* t->charged holds every artifact's weight (derived_bytes), so it is
	 * never below what is unheld; the checks' threads add to it only
	 * where that fits (check_reserve), and nothing else changes it off
	 * the loop: once past the limit, only the drops here lower it. */
	before = __atomic_fetch_add(&t->charged, need, __ATOMIC_RELAXED);
	unheld = derive_unheld_bytes(t);
	if (before + need <= c->limit || before + need - unheld <= c->limit) {
		c->reserved = need;
		c->room = ROOM_RESERVED;
		c->err = 0;
		if (before + need > c->limit) {
			snprintf(why, sizeof(why), "the publication of \"%s\" (%" PRIu64 " MiB) "
				 "needed room under the memory limit in force, and nobody held it",
				b->key, c->size >> 20);
			c->dropped_bytes = derive_drop_unheld(t, before + need - c->limit, why,
				c->lanes, DERIVE_DROP_LANES, &c->nlanes);
			c->dropped = 1;
		}
		return 1;
	}
	__atomic_sub_fetch(&t->charged, need, __ATOMIC_RELAXED);
	held = t->r->derived_bytes - unheld;
	copying = before > t->r->derived_bytes ? before - t->r->derived_bytes : 0;
	if (unheld != 0)
		snprintf(kept, sizeof(kept), "and dropping the %" PRIu64 " MiB nobody holds would "
			 "not make it", unheld >> 20);
	else
		snprintf(kept, sizeof(kept), "even with every artifact nobody held dropped");
	snprintf(c->why, sizeof(c->why), "wcached keeps %" PRIu64 " MiB of derived artifacts "
		 "that workers hold and has %" PRIu64 " MiB reserved for the copies of other "
		 "publications%s, and this one's %" PRIu64 " MiB%s would pass the memory limit in "
		 "force (%" PRIu64 " MiB, %s), which its copy is charged to: no room for it now, "
		 "%s (room comes back as workers release artifacts: one nobody holds is dropped "
		 "when a publication needs its room)", held >> 20, copying >> 20,
		c->limit_ram && copying != 0 ? " (each twice its size)" : "", c->size >> 20,
		c->limit_ram ? " twice (the builder's memfd and wcached's copy)" : "",
		c->limit >> 20, c->limit_source, kept);
	c->err = -ENOMEM;
	return 0;
}

/* Ends c->why (the kernel's refusal, check_kernel_room) with what of the
 * memory in use wcached no longer keeps (at most: what is in use less the
 * margin and the artifacts kept also holds wcached's own memory and the
 * copies of the checks, review rev189 F7), what dropping the unheld
 * (unheld bytes) would do, and the wait for closes that was in vain. */
static void
kernel_refusal(struct derive_check *c, uint64_t unheld)
{
	uint64_t kept = c->t->r->derived_bytes, margin = memlimit_use_margin(c->limit);
	/* What the kernel counted, less memlimit_use()'s margin. */
	uint64_t charged = c->kernel_used > margin ? c->kernel_used - margin : 0;
	uint64_t gone = charged > kept ? charged - kept : 0;
	size_t n = strlen(c->why);
	char drop[160], vain[256];

	if (c->kernel_dropped && c->kernel_others != 0)
		snprintf(drop, sizeof(drop), "even after wcached dropped %" PRIu64 " MiB nobody "
			 "held for it and %" PRIu64 " MiB for other publications the kernel "
			 "refused room", c->dropped_bytes >> 20, c->kernel_others >> 20);
	else if (c->kernel_dropped)
		snprintf(drop, sizeof(drop), "even after wcached dropped %" PRIu64 " MiB nobody "
			 "held for it", c->dropped_bytes >> 20);
	else if (unheld != 0)
		snprintf(drop, sizeof(drop), "and dropping the %" PRIu64 " MiB nobody holds would "
			 "not make it", unheld >> 20);
	else
		snprintf(drop, sizeof(drop), "even with every artifact nobody held dropped");
	/* Its closes came through, yet less than half of what should have
	 * come off did: what was dropped is still mapped, most likely (other
	 * memory may have come meanwhile too). A wait in vain says its own. */
	vain[0] = '\0';
	if (c->kernel_dropped && c->late_ms == 0 &&
		c->kernel_used + c->to_come_off / 2 > c->used_at_drop)
		snprintf(vain, sizeof(vain), ": what the kernel counts in use went from %" PRIu64
			 " to %" PRIu64 " MiB meanwhile, so what was dropped for it is likely "
			 "still mapped by workers that released it, and those drops were in "
			 "vain", c->used_at_drop >> 20, c->kernel_used >> 20);
	if (c->limit_kind == MEMLIMIT_RAM)
		n += (size_t)snprintf(c->why + n, sizeof(c->why) - n, " (of that memory in use, "
				      "wcached keeps %" PRIu64 " MiB of derived artifacts; %s",
			kept >> 20, STILL_CHARGED);
	else
		n += (size_t)snprintf(c->why + n, sizeof(c->why) - n, " (of the memory in use, "
				      "at most %" PRIu64 " MiB is charged to wcached but no longer "
				      "kept by it, wcached's own memory and the copies of "
				      "publications being checked included: %s", gone >> 20,
			STILL_CHARGED);
	if (n < sizeof(c->why))
		n += (size_t)snprintf(c->why + n, sizeof(c->why) - n, "), %s%s", drop, vain);
	if (c->late_ms != 0 && n < sizeof(c->why))
		snprintf(c->why + n, sizeof(c->why) - n, "; wcached dropped %" PRIu64 " MiB of "
			 "artifacts nobody held to make room for its copy, and waited %.0f s "
			 "for their memory to be let go in their builders' lanes of wcached's "
			 "closer, in vain (a close there is held up, closer.h)",
			c->dropped_bytes >> 20, (double)c->late_ms / 1000.0);
}

/* Adds uid to c->lanes unless it is there (DERIVE_DROP_LANES at most). */
static void
wait_in_lane(struct derive_check *c, uid_t uid)
{
	for (size_t i = 0; i < c->nlanes; i++)
		if (c->lanes[i] == uid)
			return;
	if (c->nlanes < DERIVE_DROP_LANES)
		c->lanes[c->nlanes++] = uid;
}

/* Adds to c's what make_kernel_room dropped for the checks in list (but c)
 * that c's kernel check did not see go (review rev189 F3): dropped, not yet
 * measured by their own checks, and not let go before c read what is in
 * use. Their lanes become c's where that memory is not let go yet. */
static uint64_t
others_dropping(struct derive_check *c, const struct derive_check *list)
{
	uint64_t bytes = 0;

	for (const struct derive_check *o = list; o != NULL; o = o->next) {
		uint64_t dropping = __atomic_load_n(&o->kernel_dropping, __ATOMIC_RELAXED);
		uint64_t let_go = __atomic_load_n(&o->let_go_ns, __ATOMIC_ACQUIRE);

		if (o == c || dropping == 0 || (let_go != 0 && let_go <= c->kernel_read_ns))
			continue;
		bytes += dropping;
		if (let_go == 0)
			for (size_t i = 0; i < o->nlanes; i++)
				wait_in_lane(c, o->lanes[i]);
	}
	return bytes;
}

/*
 * On the loop: the kernel found c->short_by more in use than there is room
 * for (ROOM_SHORT, check_kernel_room), beyond what wcached counts: an
 * artifact dropped while a worker still maps it is still charged to
 * wcached. The first time for c, drops what of that the drops for other
 * checks the kernel refused (others_dropping: not in c's read yet) leave,
 * of the artifacts nobody holds, least recently used first (never one a
 * worker holds; c's own is no artifact yet), where they weigh that much:
 * 1, and c is queued again once their memory, and the others', is let go
 * (review rev186 F1, rev189 F3: two checks refused at once each dropped
 * the whole shortfall). Refused again where it counted on others' drops,
 * it drops up to what it counted on of its shortfall itself, once more
 * (review rev192 P2: those drops may free nothing, and its one retry rode
 * on them). Else 0, nothing dropped, and c->why says why (kernel_refusal;
 * or that the model is no longer served).
 */
static int
make_kernel_room(struct derive_check *c)
{
	struct derive_table *t = c->t;
	uint64_t unheld = derive_unheld_bytes(t), others, want, dropped;
	char why[WIRE_MAX_KEY + 200];

	if (derive_entry_of(t, c->build->model_name, c->build->entry_id) == NULL) {
		snprintf(c->why, sizeof(c->why), "the model is no longer served");
		c->err = -ENOENT;
		return 0;
	}
	if (c->kernel_dropped && (c->kernel_again || c->kernel_others == 0)) {
		kernel_refusal(c, unheld);
		return 0;
	}
	c->nlanes = 0;
	if (c->kernel_dropped) {
		/* Others' drops it counted on did not make the room (a worker
		 * may still map them, review rev192 P2): up to that much of its
		 * shortfall it drops itself now, once, as it would have had it
		 * not counted on them. */
		others = 0;
		want = c->short_by < c->kernel_others ? c->short_by : c->kernel_others;
		c->kernel_again = 1;
	} else {
		others = others_dropping(c, t->checks_running) +
			others_dropping(c, t->checks_closing) +
			others_dropping(c, t->checks_waiting);
		want = c->short_by > others ? c->short_by - others : 0;
		c->kernel_others = others;
	}
	if (unheld < want) {
		kernel_refusal(c, unheld);
		return 0;
	}
	snprintf(why, sizeof(why), "the publication of \"%s\" (%" PRIu64 " MiB) needed room "
		 "under the memory limit in force that the kernel still counted in use, and "
		 "nobody held it", c->build->key, c->size >> 20);
	c->used_at_drop = c->kernel_used;
	dropped = derive_drop_unheld(t, want, why, c->lanes, DERIVE_DROP_LANES, &c->nlanes);
	__atomic_store_n(&c->kernel_dropping, dropped, __ATOMIC_RELAXED);
	c->to_come_off = dropped + others;
	c->dropped_bytes += dropped;
	c->dropped = 1;
	c->kernel_dropped = 1;
	c->room = ROOM_RESERVED;
	c->err = 0;
	c->why[0] = '\0';
	return 1;
}

/* Queues c, whose room is reserved, again: at once where a place is free,
 * else first among those that wait. Where it cannot be queued, it is
 * refused with the reason (check_finish). */
static void
check_again(struct derive_table *t, struct derive_check *c)
{
	int err;

	/* A reload may have shut its builder out while it waited for the
	 * closes: refused now, it takes no place and copies nothing. */
	if (!builder_still_may(c))
		return;
	if (!check_may_start(t, c->owner)) {
		c->waiting = 1;
		c->next = t->checks_waiting;
		t->checks_waiting = c;
		return;
	}
	if ((err = check_start(t, c)) == 0)
		return;
	snprintf(c->why, sizeof(c->why), "its check could not be queued again after room was "
		 "made for its copy: %s", strerror(-err));
	c->err = err;
	check_finish(c, 0); /* its reservation goes with it (check_free) */
}

/* Unlinks c from t->checks_closing; it waits no more. */
static void
closes_unlink(struct derive_table *t, struct derive_check *c)
{
	check_unlink(&t->checks_closing, c);
	c->closing = 0;
}

/* On the loop, woken from a lane (closes_then): the checks whose dropped
 * artifacts are let go go on to their copies. Each check_again may end
 * others (a refusal fails a build): the walk starts again each time. */
static void
closes_through(uv_async_t *h)
{
	struct derive_table *t = h->data;
	struct derive_check *c;

	for (c = t->checks_closing; c != NULL;) {
		if (!__atomic_load_n(&c->closes_through, __ATOMIC_ACQUIRE)) {
			c = c->next;
			continue;
		}
		closes_unlink(t, c);
		check_again(t, c);
		c = t->checks_closing;
	}
	check_pump(t);
}

/* closer_then()'s done: on a lane's thread under the closer's lock (or at
 * once, on the loop): only says so. */
static void
closes_then(void *arg)
{
	struct derive_check *c = arg;

	__atomic_store_n(&c->let_go_ns, mono_ns(), __ATOMIC_RELEASE);
	__atomic_store_n(&c->closes_through, 1, __ATOMIC_RELEASE);
	uv_async_send(&c->t->closes_async);
}

/* Arms closes_timer for the first deadline of the checks that wait, those
 * whose closes came through left out (closes_through takes them), and never
 * at 0: closes_late re-arms from inside the timer, and libuv before 1.48
 * runs a timer started at 0 there again in the same pass, for ever
 * (review rev189 F1); 1 ms on puts the next run past the poll phase. */
static void
closes_rearm(struct derive_table *t)
{
	uint64_t first = UINT64_MAX, now = derive_now_ms(t);

	for (const struct derive_check *c = t->checks_closing; c != NULL; c = c->next)
		if (c->closes_deadline_ms < first &&
			!__atomic_load_n(&c->closes_through, __ATOMIC_ACQUIRE))
			first = c->closes_deadline_ms;
	if (first == UINT64_MAX)
		uv_timer_stop(&t->closes_timer);
	else
		uv_timer_start(&t->closes_timer, closes_late, first > now ? first - now : 1, 0);
}

/* On the loop: the checks whose dropped artifacts were not let go within
 * DERIVE_CLOSES_WAIT_MS (a close in the lanes of wcached's own for their
 * builders is slow, or only queued behind a slow one: what was dropped
 * may have had nothing to close yet) wait no more: each is queued again,
 * and the kernel says whether there is room for its copy after all
 * (check_kernel_room, which may drop more of what nobody holds, once,
 * review rev186 F2). Those whose closes came through meanwhile go on here
 * too, as closes_through's would: left in the list they kept the timer due
 * (review rev189 F1). */
static void
closes_late(uv_timer_t *h)
{
	struct derive_table *t = h->data;
	uint64_t now = derive_now_ms(t);
	struct derive_check *c;

	for (c = t->checks_closing; c != NULL;) {
		bool through = __atomic_load_n(&c->closes_through, __ATOMIC_ACQUIRE);

		if (c->closes_deadline_ms > now && !through) {
			c = c->next;
			continue;
		}
		closes_unlink(t, c);
		if (!through) {
			closer_forget(t->closer, c);
			c->late_ms += now - c->closes_since_ms;
		}
		check_again(t, c);
		c = t->checks_closing;
	}
	closes_rearm(t);
	check_pump(t);
}

/*
 * On the loop: make_copy_room reserved c's room and dropped artifacts for
 * it: its copy must not start before their memory is let go, which is in
 * the closer's lanes of wcached's own for their builders (generation.c),
 * which nothing a builder passes holds up (review rev189 F4: a lingering
 * socket it passed held them before): it waits there (closer_then),
 * at most DERIVE_CLOSES_WAIT_MS, then goes on all the same (closes_late),
 * and check_kernel_room decides. Without a wake-up from the lanes it goes
 * at once, and check_kernel_room stands.
 */
static void
wait_for_closes(struct derive_table *t, struct derive_check *c)
{
	char more[128];
	int err;

	if (t->closes_async_state == 0) {
		if ((err = uv_async_init(t->r->loop, &t->closes_async, closes_through)) < 0) {
			log_warnx("derived artifacts: closer wake-up: uv_async_init: %s; a"
				  " publication that dropped artifacts for its copy goes on at"
				  " once, checked against what the kernel says is in use",
				uv_strerror(err));
			t->closes_async_state = -1;
		} else {
			t->closes_async.data = t;
			t->closes_async_state = 1;
		}
	}
	if (t->closes_async_state < 0 || t->closed) {
		check_again(t, c);
		return;
	}
	c->closing = 1;
	c->closes_through = 0;
	c->let_go_ns = 0;
	c->closes_since_ms = derive_now_ms(t);
	c->closes_deadline_ms = c->closes_since_ms + DERIVE_CLOSES_WAIT_MS;
	c->next = t->checks_closing;
	t->checks_closing = c;
	closes_rearm(t);
	if (derive_may_log(t, c->owner, more, sizeof(more)))
		log_info("model \"%s\": derived \"%s\": the copy of its publication waits for "
			 "the %" PRIu64 " MiB dropped for it to be let go in the closer (at most "
			 "%u s)%s", c->build->model_name, c->build->key, c->dropped_bytes >> 20,
			DERIVE_CLOSES_WAIT_MS / 1000, more);
	/* done may run at once, here: closes_through then runs on the loop's
	 * next turn. */
	closer_then(t->closer, c->lanes, c->nlanes, closes_then, c);
}

/* On the loop: c's job ended; its place goes to the next that waits. A
 * check that found no room goes again, once, where make_copy_room made
 * some: after the memory of what it dropped is let go (wait_for_closes). */
static void
check_done(struct workq_job *job, int status)
{
	struct derive_check *c = job->arg;
	struct derive_table *t = c->t;

	if (check_unlink(&t->checks_running, c))
		t->nchecks_running--;
	/* A builder a reload shut out makes no room: refused here. */
	if (status == 0 && (c->room == ROOM_WANTED || c->room == ROOM_SHORT) &&
		!builder_still_may(c)) {
		check_pump(t);
		return;
	}
	if (status == 0 && c->build != NULL && ((c->room == ROOM_WANTED && make_copy_room(c)) ||
		(c->room == ROOM_SHORT && make_kernel_room(c)))) {
		if (c->dropped)
			wait_for_closes(t, c);
		else
			check_again(t, c);
		check_pump(t);
		return;
	}
	check_finish(c, status);
	check_pump(t);
}

int
derive_publish(struct derive_table *t, void *conn, uid_t owner,
	const struct derive_cred *cred, uint32_t seq, uint64_t token, int memfd, char *msg,
	size_t msg_size)
{
	struct derive_build *b = NULL;
	struct derive_check *c;
	char more[128];
	int err;

	if ((err = derive_build_of_token(t, conn, token, &b, msg, msg_size)) < 0 || b == NULL) {
		closer_close(t->closer, owner, memfd);
		return err < 0 ? err : -ESTALE;
	}
	/* The groups derive_groups judged the builder by: the artifact's
	 * (make_artifact), for a warm restart's check. */
	if ((c = calloc(1, sizeof(*c))) == NULL || derive_cred_copy(&b->builder_cred, cred) < 0) {
		free(c);
		closer_close(t->closer, owner, memfd);
		snprintf(msg, msg_size, "wcached is out of memory");
		return -ENOMEM;
	}
	/* Judged at its DERIVE: a reload may have narrowed derive_groups
	 * since. Refused, the build ends for good, as a refused publication. */
	if (!derive_builder_may(t, b, c->why, sizeof(c->why))) {
		snprintf(msg, msg_size, "model \"%s\": derived \"%s\" of generation %" PRIu64
			 ": the publication by pid %d was refused: %s", b->model_name, b->key,
			b->source, (int)b->builder_pid, c->why);
		free(c);
		closer_close(t->closer, owner, memfd);
		derive_build_fail(t, b, -ECANCELED, msg);
		return -EPERM;
	}
	c->t = t;
	c->build = b;
	c->seq = seq;
	c->owner = owner;
	c->budget = t->r->memory_budget;
	c->limit = t->mem_limit;
	c->limit_ram = t->mem_ram;
	memcpy(c->limit_source, t->mem_source, sizeof(c->limit_source));
	c->limit_kind = t->mem_kind;
	memcpy(c->use_file, t->mem_use_file, sizeof(c->use_file));
	c->fd = memfd;
	c->index_fd = -1;
	snprintf(c->label, sizeof(c->label), "%s derived %s", b->model_name, b->key);
	c->job.arg = c;
	if (!check_may_start(t, owner)) {
		/* Its turn comes when a check ends (check_done). */
		if (derive_may_log(t, owner, more, sizeof(more)))
			log_info("model \"%s\": derived \"%s\": the check of its publication by "
				 "pid %d uid %u waits for %s%s", b->model_name, b->key,
				(int)b->builder_pid, (unsigned)owner,
				t->nchecks_running >= DERIVE_CHECKS_AT_ONCE ?
				"a place (two are checked at once)" :
				"another of the same user's to end", more);
		c->waiting = 1;
		c->next = NULL;
		{
			struct derive_check **tail = &t->checks_waiting;

			while (*tail != NULL)
				tail = &(*tail)->next;
			*tail = c;
		}
	} else if ((err = check_start(t, c)) < 0) {
		snprintf(msg, msg_size, "cannot queue the check of the memfd: %s", strerror(-err));
		check_free(c);
		return err;
	}
	b->check = c;
	derive_rearm(t); /* no deadline while it is checked */
	return 0;
}

void
derive_check_cancel(struct derive_check *c)
{
	if (c == NULL)
		return;
	if (c->waiting) {
		/* Never queued: nothing runs that needs it. */
		check_unlink(&c->t->checks_waiting, c);
		check_free(c);
		return;
	}
	if (c->closing) {
		/* Waits for closes on the loop (wait_for_closes): nothing runs
		 * that needs it, and closer_then() calls back no more. A check
		 * of its uid that waited for it starts on the loop's next turn
		 * (closes_late pumps). */
		struct derive_table *t = c->t;

		check_free(c);
		if (!t->closed)
			uv_timer_start(&t->closes_timer, closes_late, 1, 0);
		return;
	}
	c->build = NULL;
	__atomic_store_n(&c->cancelled, 1, __ATOMIC_RELAXED);
}
