/*
 * test_derive_publish.c: unit tests of daemon/derive_publish.c, the check of
 * a PUBLISH of a derived artifact, on a real libuv loop, registry, work
 * queue and model (daemonutil.c), driven through derive.h as the server
 * drives it: a DERIVE, then a PUBLISH of a memfd; its hooks record the
 * answers. The table has no closer (closes happen at once).
 *
 * Wrapped (tests/CMakeLists.txt):
 *   uv_now: the registry's clock (registry_now_ms, derive's) runs
 *     clock_skip ms ahead of the loop's, so that a test can pass the closes
 *     deadline (DERIVE_CLOSES_WAIT_MS) without waiting for it;
 *   uv_timer_start: the arms of the table's closes_timer are counted, those
 *     at 0 apart, and a run of them in one loop pass is broken after
 *     SPIN_BOUND (armed at 1 ms instead) so that a loop that would spin
 *     for ever fails the test instead of hanging it;
 *   closer_then: while hold_then is set, its done is kept for the test to
 *     call (the lanes let go when the test says: let_go), not called at
 *     once;
 *   memlimit_use: a read of gate_file waits on its work thread while
 *     gate_shut is set (gate_waiting says it does), so that a test can
 *     keep a check between its read's start and its end.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "closer.h"
#include "daemonutil.h"
#include "derive.h"
#include "memlimit.h"
#include "registry.h"
#include "testutil.h"

/* ---- wrapped: the registry's clock, the closes timer, closer_then ---- */

uint64_t __real_uv_now(const uv_loop_t *loop);
uint64_t __wrap_uv_now(const uv_loop_t *loop);
int __real_uv_timer_start(uv_timer_t *h, uv_timer_cb cb, uint64_t timeout, uint64_t repeat);
int __wrap_uv_timer_start(uv_timer_t *h, uv_timer_cb cb, uint64_t timeout, uint64_t repeat);
void __real_closer_then(struct closer *cl, const uid_t *owners, size_t n,
	void (*done)(void *), void *arg);
void __wrap_closer_then(struct closer *cl, const uid_t *owners, size_t n,
	void (*done)(void *), void *arg);
int __real_memlimit_use(const char *use_file, enum memlimit_kind kind, uint64_t limit,
	uint64_t *out);
int __wrap_memlimit_use(const char *use_file, enum memlimit_kind kind, uint64_t limit,
	uint64_t *out);

/* Arms of closes_timer at 0 in a row, past which one is armed at 1 ms. */
#define SPIN_BOUND 1000

static uint64_t clock_skip;
static uv_timer_t *closes_timer; /* the table's, once set up */
static uv_timer_cb closes_cb;    /* what derive_publish.c arms it with */
static unsigned closes_arms, closes_zero_arms;
static bool hold_then;
static struct {
	void (*done)(void *);
	void *arg;
} held[4];
static unsigned nheld;
static char gate_file[4096];
static int gate_shut, gate_waiting; /* atomic: a work thread reads them */

uint64_t
__wrap_uv_now(const uv_loop_t *loop)
{
	return __real_uv_now(loop) + clock_skip;
}

int
__wrap_uv_timer_start(uv_timer_t *h, uv_timer_cb cb, uint64_t timeout, uint64_t repeat)
{
	if (h == closes_timer) {
		closes_cb = cb;
		closes_arms++;
		if (timeout == 0 && ++closes_zero_arms >= SPIN_BOUND)
			timeout = 1;
	}
	return __real_uv_timer_start(h, cb, timeout, repeat);
}

void
__wrap_closer_then(struct closer *cl, const uid_t *owners, size_t n, void (*done)(void *),
	void *arg)
{
	if (hold_then) {
		assert_true(nheld < sizeof(held) / sizeof(held[0]));
		held[nheld].done = done;
		held[nheld++].arg = arg;
		return;
	}
	__real_closer_then(cl, owners, n, done, arg);
}

int
__wrap_memlimit_use(const char *use_file, enum memlimit_kind kind, uint64_t limit, uint64_t *out)
{
	if (strcmp(use_file, gate_file) == 0 && __atomic_load_n(&gate_shut, __ATOMIC_ACQUIRE)) {
		__atomic_add_fetch(&gate_waiting, 1, __ATOMIC_RELEASE);
		while (__atomic_load_n(&gate_shut, __ATOMIC_ACQUIRE))
			usleep(1000);
		__atomic_sub_fetch(&gate_waiting, 1, __ATOMIC_RELEASE);
	}
	return __real_memlimit_use(use_file, kind, limit, out);
}

/* ---- the fixture: a loop, a registry with model "m", a derive table ---- */

/* What the hooks were told, per connection (the tests' connections are
 * struct conn, opaque to derive). */
struct conn {
	int published, ready, fail;
	int err;
	char msg[WIRE_MAX_MESSAGE];
};

struct fx {
	struct du du;
	struct derive_table dt;
};

static void
hook_ready(void *conn, uint32_t seq, struct derived *a)
{
	(void)seq;
	(void)a;
	((struct conn *)conn)->ready++;
}

static void
hook_published(void *conn, uint32_t seq, struct derived *a)
{
	(void)seq;
	(void)a;
	((struct conn *)conn)->published++;
}

static void
hook_build(void *conn, uint32_t seq, struct derive_build *b)
{
	(void)conn;
	(void)seq;
	(void)b;
	fail_msg("no build is handed on in these tests");
}

static void
hook_fail(void *conn, uint32_t seq, int err, const char *msg)
{
	struct conn *c = conn;

	(void)seq;
	c->fail++;
	c->err = err;
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
}

static const struct derive_hooks hooks = { .ready = hook_ready, .published = hook_published,
	.build = hook_build, .fail = hook_fail };

/* The tensors (F32) of model "m" and of each artifact the tests publish. */
#define FLOATS ((size_t)64 * 1024)

static int
fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char *path;

	assert_non_null(f);
	clock_skip = 0;
	closes_arms = closes_zero_arms = 0;
	hold_then = false;
	nheld = 0;
	gate_file[0] = '\0';
	__atomic_store_n(&gate_shut, 0, __ATOMIC_RELEASE);
	du_setup(&f->du, false, 0);
	path = du_model(&f->du, "m.safetensors", 16);
	assert_int_equal(du_load(&f->du, "m", path, PIN_NONE, 0), 0);
	free(path);
	assert_int_equal(registry_set_derive(&f->du.reg, "m", 1, NULL, 0, 600), 0);
	assert_int_equal(derive_init(&f->dt, &f->du.reg, &hooks), 0);
	closes_timer = &f->dt.closes_timer;
	*state = f;
	return 0;
}

static int
fx_teardown(void **state)
{
	struct fx *f = *state;

	__atomic_store_n(&gate_shut, 0, __ATOMIC_RELEASE);
	derive_close(&f->dt);
	closes_timer = NULL;
	du_teardown(&f->du);
	free(f);
	return 0;
}

/* A DERIVE of key by conn, a peer of uid uid (this process but its uid):
 * it builds. */
static struct derive_build *
fx_build_as(struct fx *f, const char *key, struct conn *conn, uid_t uid)
{
	struct wire_derive d = { .wait_ms = 0, .key = key, .key_len = strlen(key), .name = "m",
		.name_len = 1 };
	struct registry_peer peer = { .pid = getpid(), .uid = uid, .gid = getgid(),
		.self_uid = getuid() };
	struct derive_build *b = NULL;
	struct derived *a = NULL;
	char msg[512];

	assert_int_equal(derive_request(&f->dt, &d, &peer, conn, 1, &a, &b, msg, sizeof(msg)),
		DERIVE_BUILD);
	assert_non_null(b);
	return b;
}

/* A DERIVE of key by conn (this process's peer): it builds. */
static struct derive_build *
fx_build(struct fx *f, const char *key, struct conn *conn)
{
	return fx_build_as(f, key, conn, getuid());
}

/* The bytes of an artifact the tests publish: a safetensors file of FLOATS
 * floats, in *len. */
static uint8_t *
artifact_bytes(size_t *len)
{
	char header[128];

	snprintf(header, sizeof(header),
		"{\"w\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", FLOATS,
		FLOATS * 4);
	return tu_safetensors(header, FLOATS * 4, len);
}

/* PUBLISH by conn (lane and uid place owner) of b, an artifact_bytes()
 * memfd. */
static void
fx_publish(struct fx *f, struct derive_build *b, struct conn *conn, uid_t owner)
{
	struct derive_cred cred = { .gid = getgid() };
	size_t len;
	uint8_t *bytes = artifact_bytes(&len);
	int fd = memfd_create("artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	char msg[512];

	assert_true(fd >= 0);
	assert_int_equal(write(fd, bytes, len), (ssize_t)len);
	free(bytes);
	assert_int_equal(derive_publish(&f->dt, conn, owner, &cred, 2, derive_token(b), fd, msg,
				 sizeof(msg)), 0);
}

static bool
answered(struct du *du, void *arg)
{
	const struct conn *c = arg;

	(void)du;
	return c->published + c->fail > 0;
}

/* Whether *arg closer_then()s are held. */
static bool
then_held(struct du *du, void *arg)
{
	(void)du;
	return nheld >= *(const unsigned *)arg;
}

/* The lanes let go: each held done runs (on the loop's thread, between its
 * runs, as a lane's thread would call it). */
static void
let_go(void)
{
	for (unsigned i = 0; i < nheld; i++)
		held[i].done(held[i].arg);
	nheld = 0;
}

/* Publishes key by conn and waits for its answer: published. */
static void
fx_published(struct fx *f, const char *key, struct conn *conn, uid_t owner)
{
	fx_publish(f, fx_build(f, key, conn), conn, owner);
	du_run_until(&f->du, answered, conn);
	assert_int_equal(conn->fail, 0);
	assert_int_equal(conn->published, 1);
}

/* Sets the memory limit in force to limit bytes, a cgroup v2 limit whose
 * memory.stat is use_file ("": not known). */
static void
fx_limit(struct fx *f, uint64_t limit, const char *use_file)
{
	struct memlimit m = { .limit = limit, .cgroup = limit, .kind = MEMLIMIT_CGROUP_V2 };

	snprintf(m.cgroup_path, sizeof(m.cgroup_path), "/test");
	snprintf(m.file, sizeof(m.file), "memory.max");
	snprintf(m.use_file, sizeof(m.use_file), "%s", use_file);
	derive_set_memory_limit(&f->dt, &m);
}

/* ---- rev189 F1: the closes deadline and closes that came through ---- */

/*
 * k1's publication finds no room for its copy (the limit holds k0 or k1,
 * not both): k0, which nobody holds, is dropped for it and its copy waits
 * for k0's memory to be let go in the closer. The loop is busy when the
 * deadline passes (the registry's clock skips past it) and the lane lets go
 * meanwhile (closes_then: closes_through set, the async sent); then the
 * deadline's timer runs before the loop polls (libuv runs timers first).
 * Before f249361, closes_late left such a check listed and re-armed
 * closes_timer at 0 from inside its own callback, which libuv before 1.48
 * runs again in the same pass, for ever: one uv_run() never returned (the
 * wrap breaks the run after SPIN_BOUND arms). Now the check goes on at
 * once (queued again) and closes_timer is never armed at 0; k1 is
 * published.
 */
static void
test_closes_through_at_the_deadline_goes_on(void **state)
{
	struct fx *f = *state;
	struct conn c0 = { 0 }, c1 = { 0 };
	unsigned one = 1;
	uint64_t w0;

	fx_published(f, "k0", &c0, 1001);
	w0 = f->du.reg.derived_bytes;
	assert_true(w0 > FLOATS * 4);
	/* Room for k0 or for k1 (each w0, its index included), not both. */
	fx_limit(f, w0 + w0 / 2, "");
	hold_then = true;
	fx_publish(f, fx_build(f, "k1", &c1), &c1, 1002);
	du_run_until(&f->du, then_held, &one);
	assert_int_equal(f->dt.stats.dropped, 1);
	assert_non_null(f->dt.checks_closing);
	assert_non_null(closes_cb);

	/* The loop busy past the deadline; the lane lets go meanwhile. */
	clock_skip = DERIVE_CLOSES_WAIT_MS + 1000;
	let_go();
	/* The deadline's timer is due (it is not re-armed: the test does it,
	 * as libuv would once DERIVE_CLOSES_WAIT_MS passed). */
	closes_arms = closes_zero_arms = 0;
	assert_int_equal(__real_uv_timer_start(closes_timer, closes_cb, 0, 0), 0);
	uv_run(&f->du.loop, UV_RUN_NOWAIT);
	if (closes_zero_arms != 0)
		fail_msg("closes_timer was armed at 0 %u times in one loop pass (%u arms in all): "
			 "from inside its own callback, libuv before 1.48 runs it again in the "
			 "same pass%s", closes_zero_arms, closes_arms,
			closes_zero_arms >= SPIN_BOUND ? ", for ever (the test broke the spin)" :
							 "");
	assert_null(f->dt.checks_closing);
	du_run_until(&f->du, answered, &c1);
	assert_int_equal(c1.fail, 0);
	assert_int_equal(c1.published, 1);
}

/* ---- rev189 F3: two checks the kernel refused room at once ---- */

/* Writes use_file, a cgroup v2 memory.stat that says anon bytes in use
 * (the rest 0); returns what memlimit_use() makes of it (its margin
 * added). */
static uint64_t
fx_use(const char *use_file, uint64_t anon, uint64_t limit)
{
	FILE *fp = fopen(use_file, "w");
	uint64_t used = 0;

	assert_non_null(fp);
	fprintf(fp, "anon %" PRIu64 "\nfile 0\nkernel 0\nshmem 0\n", anon);
	assert_int_equal(fclose(fp), 0);
	assert_int_equal(memlimit_use(use_file, MEMLIMIT_CGROUP_V2, limit, &used), 0);
	return used;
}

/*
 * Six artifacts nobody holds, w bytes each (the memfd and its index), and
 * then k6 and k7 published by two users at once: wcached's own count has
 * room for both copies, but the kernel says half an artifact more than the
 * limit is in use, which no drop changes until the lanes let go. Each
 * check reads that and is refused: the first to read is short by 1.5 w
 * (its copy), the second by 2.5 w (both copies are pending). Before, each
 * dropped its whole shortfall, 2 + 3 = 5 artifacts; now the one that comes
 * second to the loop drops only what the first one's drop leaves (2.5 w
 * less 2 w, or 1.5 w less 3 w): 3 artifacts in all, whichever order the
 * checks came in. Both are published once the lanes let go (the kernel's
 * figure then has room).
 */
static void
test_kernel_refusals_at_once_drop_once(void **state)
{
	struct fx *f = *state;
	struct conn kept[6] = { 0 }, c6 = { 0 }, c7 = { 0 };
	const uint64_t limit = (uint64_t)(256 * MiB);
	unsigned two = 2;
	uint64_t w, margin;
	char *use_file, key[8];
	size_t size;

	for (unsigned i = 0; i < 6; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		fx_published(f, key, &kept[i], 1001);
	}
	w = f->du.reg.derived_bytes / 6;
	free(artifact_bytes(&size));
	assert_true(w > size && w - size < 4 * KiB);
	assert_int_equal(asprintf(&use_file, "%s/memory.stat", f->du.dir) > 0, 1);
	margin = fx_use(use_file, 0, limit);
	/* In use: the limit and half an artifact (a check's index room is a
	 * few hundred bytes more). */
	fx_use(use_file, limit + w / 2 - margin, limit);
	fx_limit(f, limit, use_file);
	hold_then = true;
	fx_publish(f, fx_build(f, "k6", &c6), &c6, 2001);
	fx_publish(f, fx_build(f, "k7", &c7), &c7, 2002);
	du_run_until(&f->du, then_held, &two);
	assert_int_equal(c6.fail + c7.fail, 0);
	if (f->dt.stats.dropped != 3)
		fail_msg("%" PRIu64 " artifacts of %" PRIu64 " bytes were dropped for two "
			 "publications the kernel found 1.5 and 2.5 of them short at once: 3 "
			 "make the room", f->dt.stats.dropped, w);
	/* The lanes let go: the kernel has room now. */
	fx_use(use_file, 0, limit);
	hold_then = false;
	let_go();
	du_run_until(&f->du, answered, &c6);
	du_run_until(&f->du, answered, &c7);
	assert_int_equal(c6.fail + c7.fail, 0);
	assert_int_equal(c6.published + c7.published, 2);
	assert_int_equal(f->dt.stats.dropped, 3);
	free(use_file);
}

/* Runs the loop until a check's read of gate_file waits at the gate (60 s
 * at most: the check is queued from the loop). */
static void
until_gated(struct fx *f)
{
	for (int i = 0; i < 60 * 1000 && __atomic_load_n(&gate_waiting, __ATOMIC_ACQUIRE) == 0;
		i++) {
		uv_run(&f->du.loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	if (__atomic_load_n(&gate_waiting, __ATOMIC_ACQUIRE) == 0)
		fail_msg("no check read %s within 60 s", gate_file);
}

/* Six artifacts nobody holds, published by uid 1001 (kept); k6's
 * publication by uid 2001 (c6), under a memory.stat (*use6; *use7 is
 * another, for k7) that says the limit and half an artifact are in use, is
 * refused by the kernel, 1.5 artifacts short: 2 dropped, its closes held.
 * Returns the bytes of an artifact, with memlimit_use()'s margin in
 * *margin. */
static uint64_t
fx_k6_refused(struct fx *f, struct conn kept[6], struct conn *c6, uint64_t limit, char **use6,
	char **use7, uint64_t *margin)
{
	unsigned one = 1;
	uint64_t w;
	char key[8];

	for (unsigned i = 0; i < 6; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		fx_published(f, key, &kept[i], 1001);
	}
	w = f->du.reg.derived_bytes / 6;
	assert_int_equal(asprintf(use6, "%s/memory6.stat", f->du.dir) > 0, 1);
	assert_int_equal(asprintf(use7, "%s/memory7.stat", f->du.dir) > 0, 1);
	*margin = fx_use(*use6, 0, limit);
	fx_use(*use6, limit + w / 2 - *margin, limit);
	fx_limit(f, limit, *use6);
	hold_then = true;
	fx_publish(f, fx_build(f, "k6", c6), c6, 2001);
	du_run_until(&f->du, then_held, &one);
	assert_int_equal(f->dt.stats.dropped, 2);
	return w;
}

/*
 * Review rev192 P1: a drop stops counting for other checks once its own
 * check measures again, or once its memory was let go before the other
 * check read what is in use. Six artifacts nobody holds; k6 (uid 2001) is
 * refused by the kernel, 1.5 artifacts short: 2 dropped, its lanes let go,
 * and its check reads again (held there: its figure now has room). Then
 * k7 (uid 2002), under a fresh shortfall of its own (another memory.stat),
 * is refused while k6's check still runs: it must drop its whole 2.5
 * artifacts (k6's copy is pending too), 3 more, not count k6's 2 as still
 * to come (1 more). Both are published.
 */
static void
test_kernel_drop_counts_until_measured(void **state)
{
	struct fx *f = *state;
	struct conn kept[6] = { 0 }, c6 = { 0 }, c7 = { 0 };
	const uint64_t limit = (uint64_t)(256 * MiB);
	unsigned one = 1;
	uint64_t w, margin;
	char *use6, *use7;

	w = fx_k6_refused(f, kept, &c6, limit, &use6, &use7, &margin);
	/* What k6 dropped came off; its check reads again, and waits there. */
	fx_use(use6, 0, limit);
	snprintf(gate_file, sizeof(gate_file), "%s", use6);
	__atomic_store_n(&gate_shut, 1, __ATOMIC_RELEASE);
	let_go();
	until_gated(f);
	/* k7: short by 1.5 artifacts of its own, 2.5 with k6's copy pending. */
	fx_use(use7, limit + w / 2 - margin, limit);
	fx_limit(f, limit, use7);
	fx_publish(f, fx_build(f, "k7", &c7), &c7, 2002);
	du_run_until(&f->du, then_held, &one);
	if (f->dt.stats.dropped != 5)
		fail_msg("k7's check, 2.5 artifacts short, dropped %" PRIu64 " of %" PRIu64
			 " bytes, not 3: it counted k6's drop, whose memory its read had seen let "
			 "go and k6's check had measured since", f->dt.stats.dropped - 2, w);
	/* k7's drops came off too; both go on. */
	fx_use(use7, 0, limit);
	hold_then = false;
	__atomic_store_n(&gate_shut, 0, __ATOMIC_RELEASE);
	let_go();
	du_run_until(&f->du, answered, &c6);
	du_run_until(&f->du, answered, &c7);
	assert_int_equal(c6.fail + c7.fail, 0);
	assert_int_equal(c6.published + c7.published, 2);
	free(use6);
	free(use7);
}

/* Whether c is answered or a closer_then() is held. */
static bool
answered_or_held(struct du *du, void *arg)
{
	unsigned one = 1;

	return answered(du, arg) || then_held(du, &one);
}

/*
 * Review rev192 P2: a check whose whole shortfall others' drops covered
 * dropped nothing, and its one retry rode on them. k6 (uid 2001) is
 * refused, 1.5 artifacts short: 2 dropped. k7 (uid 2002), refused
 * meanwhile 1.5 artifacts short (another memory.stat; k6's copy pending
 * too), counts k6's drop, drops nothing and waits for it. k6's drop frees
 * what k6's figure counts, not k7's (as when a worker still maps what was
 * dropped): k6 is published; k7, still 0.5 to 1.5 artifacts short (k6's
 * copy done or not), now drops that itself (1 or 2 more), once, and is
 * published when that comes off. Before, k7 was refused
 * ("even after wcached dropped 0 MiB nobody held for it and 2 MiB for
 * other publications").
 */
static void
test_kernel_counted_on_others_drops_itself(void **state)
{
	struct fx *f = *state;
	struct conn kept[6] = { 0 }, c6 = { 0 }, c7 = { 0 };
	const uint64_t limit = (uint64_t)(256 * MiB);
	unsigned two = 2;
	uint64_t w, margin;
	char *use6, *use7;

	w = fx_k6_refused(f, kept, &c6, limit, &use6, &use7, &margin);
	/* k7: 1.5 artifacts short with both copies pending, less than k6's
	 * drop; half an artifact short with its own alone. */
	fx_use(use7, limit - w / 2 - margin, limit);
	fx_limit(f, limit, use7);
	fx_publish(f, fx_build(f, "k7", &c7), &c7, 2002);
	du_run_until(&f->du, then_held, &two);
	assert_int_equal(f->dt.stats.dropped, 2);
	/* k6's drop came off k6's figure only. */
	fx_use(use6, 0, limit);
	let_go();
	du_run_until(&f->du, answered, &c6);
	assert_int_equal(c6.fail, 0);
	du_run_until(&f->du, answered_or_held, &c7);
	if (c7.fail != 0)
		fail_msg("k7, which counted on k6's drop that freed nothing it counts, was refused "
			 "without dropping its own shortfall: %s", c7.msg);
	assert_true(f->dt.stats.dropped == 3 || f->dt.stats.dropped == 4);
	fx_use(use7, 0, limit);
	hold_then = false;
	let_go();
	du_run_until(&f->du, answered, &c7);
	assert_int_equal(c7.fail, 0);
	assert_int_equal(c7.published, 1);
	free(use6);
	free(use7);
}

/* ---- rev189 F7: what the kernel's refusal says wcached no longer keeps ---- */

/*
 * The kernel says the whole limit is in use and wcached keeps no artifact:
 * k0's publication is refused, nothing to drop. The figure it names (what
 * is in use less the margin and the artifacts wcached keeps) is at most
 * what is charged to wcached but no longer kept: wcached's own memory and
 * the copies being checked are in it too. Before, it said "about".
 */
static void
test_kernel_refusal_says_at_most(void **state)
{
	struct fx *f = *state;
	struct conn c0 = { 0 };
	const uint64_t limit = (uint64_t)(256 * MiB);
	char *use_file, want[256];

	/* memlimit_use() adds its margin; the refusal takes it off again. */
	assert_int_equal(asprintf(&use_file, "%s/memory.stat", f->du.dir) > 0, 1);
	fx_use(use_file, limit, limit);
	fx_limit(f, limit, use_file);
	fx_publish(f, fx_build(f, "k0", &c0), &c0, 1001);
	du_run_until(&f->du, answered, &c0);
	assert_int_equal(c0.fail, 1);
	assert_int_equal(c0.err, -ENOMEM);
	snprintf(want, sizeof(want), "(of the memory in use, at most %" PRIu64 " MiB is charged "
		 "to wcached but no longer kept by it, wcached's own memory and the copies of "
		 "publications being checked included: ", limit >> 20);
	if (strstr(c0.msg, want) == NULL)
		fail_msg("the refusal does not say \"%s\": %s", want, c0.msg);
	assert_non_null(strstr(c0.msg, "even with every artifact nobody held dropped"));
	free(use_file);
}

/* ---- rev189 F5: drops the kernel's figure does not see ---- */

/*
 * Two artifacts nobody holds; the kernel says half of one more than the
 * limit is in use, and dropping them changes nothing it counts (as when a
 * worker that released them still maps them). k2's check drops both (1.5
 * artifacts short), asks again, and is refused; the refusal says what the
 * kernel counted before and after the drops: they were in vain. Nothing
 * more is dropped.
 */
static void
test_kernel_refusal_says_drops_in_vain(void **state)
{
	struct fx *f = *state;
	struct conn kept[2] = { 0 }, c2 = { 0 };
	const uint64_t limit = (uint64_t)(256 * MiB);
	uint64_t w, margin, used;
	char *use_file, want[160];

	fx_published(f, "k0", &kept[0], 1001);
	fx_published(f, "k1", &kept[1], 1001);
	w = f->du.reg.derived_bytes / 2;
	assert_int_equal(asprintf(&use_file, "%s/memory.stat", f->du.dir) > 0, 1);
	margin = fx_use(use_file, 0, limit);
	used = fx_use(use_file, limit + w / 2 - margin, limit);
	fx_limit(f, limit, use_file);
	fx_publish(f, fx_build(f, "k2", &c2), &c2, 2001);
	du_run_until(&f->du, answered, &c2);
	assert_int_equal(c2.fail, 1);
	assert_int_equal(c2.err, -ENOMEM);
	assert_int_equal(f->dt.stats.dropped, 2);
	snprintf(want, sizeof(want), ": what the kernel counts in use went from %" PRIu64 " to %"
		 PRIu64 " MiB meanwhile, so what was dropped for it is likely still mapped",
		used >> 20, used >> 20);
	if (strstr(c2.msg, want) == NULL || strstr(c2.msg, "those drops were in vain") == NULL)
		fail_msg("the refusal does not say the drops were in vain (\"%s\"): %s", want,
			c2.msg);
	free(use_file);
}

/* ---- rev193 F5: a reload that fails many builds at once ---- */

/* The builds a reload can fail at once: every build of a model. */
#define ENDED_AT_ONCE DERIVE_MAX_PER_MODEL

/*
 * A reload turns derive off while ENDED_AT_ONCE builds of model "m" are in
 * progress (DERIVE_MAX_PER_BUILDER each, of several uids): each builder's
 * PUBLISH, the first build's included, is told why (EPERM, "may no longer
 * build it"). Before, only the last 16 were: the others were told "no build
 * in progress has token" (ESTALE), the reload not named.
 */
static void
test_reload_fails_every_build_and_each_is_told(void **state)
{
	struct fx *f = *state;
	static struct conn builders[ENDED_AT_ONCE];
	uint64_t tokens[ENDED_AT_ONCE];
	struct derive_cred cred = { .gid = getgid() };
	char key[16], msg[WIRE_MAX_MESSAGE];
	gid_t gid = getgid();

	/* Their group may build (the builders are of other uids). */
	assert_int_equal(registry_set_derive(&f->du.reg, "m", 1, &gid, 1, 600), 0);
	memset(builders, 0, sizeof(builders));
	for (unsigned i = 0; i < ENDED_AT_ONCE; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		tokens[i] = derive_token(fx_build_as(f, key, &builders[i],
			(uid_t)(3000 + i / DERIVE_MAX_PER_BUILDER)));
	}
	assert_int_equal(derive_fail_derive_off(&f->dt, "m"), ENDED_AT_ONCE);
	for (unsigned i = 0; i < ENDED_AT_ONCE; i++) {
		int fd = memfd_create("artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		int err;

		assert_true(fd >= 0);
		err = derive_publish(&f->dt, &builders[i], 3000 + i / DERIVE_MAX_PER_BUILDER, &cred,
			2, tokens[i], fd, msg, sizeof(msg));
		if (err != -EPERM || strstr(msg, "may no longer build it: a configuration reload "
			"turned derive off") == NULL)
			fail_msg("build %u of %u a reload failed at once: its PUBLISH got %d, not "
				 "EPERM saying why: %s", i + 1, ENDED_AT_ONCE, err, msg);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_closes_through_at_the_deadline_goes_on,
			fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_kernel_refusals_at_once_drop_once,
			fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_kernel_drop_counts_until_measured, fx_setup,
			fx_teardown),
		cmocka_unit_test_setup_teardown(test_kernel_counted_on_others_drops_itself,
			fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_kernel_refusal_says_at_most, fx_setup,
			fx_teardown),
		cmocka_unit_test_setup_teardown(test_kernel_refusal_says_drops_in_vain, fx_setup,
			fx_teardown),
		cmocka_unit_test_setup_teardown(test_reload_fails_every_build_and_each_is_told,
			fx_setup, fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
