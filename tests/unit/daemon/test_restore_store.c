/*
 * test_restore_store.c: unit tests of daemon/restore_store.c, keeping the
 * service manager's file descriptor store in step with the registry
 * (restore_sync), against a manager of our own (storeutil.h): a datagram
 * socket that this test reads when it chooses, and that it can take away
 * and bring back. On a real libuv loop and small model files in /tmp
 * (daemonutil.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemonutil.h"
#include "base/error.h"
#include "fdstore.h"
#include "notify.h"
#include "restore.h"
#include "restore_internal.h"
#include "storeutil.h"
#include "testutil.h"

struct fixture {
	struct du *t;
	struct su_manager m;
};

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	f->t = du_new(false);
	memset(&restore_state, 0, sizeof(restore_state));
	su_manager_start(&f->m, f->t->dir);
	f->t->reg.fdstore = 1;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;
	void *t = f->t;

	su_manager_stop(&f->m);
	memset(&restore_state, 0, sizeof(restore_state));
	free(f);
	return du_free(&t);
}

static const struct registry_peer root_peer = { .pid = 1, .uid = 0, .gid = 0 };

/* FDSTORE=1 of a name that starts so fails as a store error other than a
 * full queue would ("" : none). */
static char fail_prefix[32];

ssize_t __real_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);

/* sendmsg, but FDSTORE=1 of the names fail_prefix starts fails with
 * ETOOMANYREFS (descriptors in flight past the kernel's limit), every
 * time: a store error that waiting does not cure. */
ssize_t
__wrap_sendmsg(int fd, const struct msghdr *msg, int flags)
{
	static const char store[] = "FDSTORE=1\nFDNAME=";
	const char *text = msg->msg_iovlen > 0 ? msg->msg_iov[0].iov_base : "";
	size_t len = msg->msg_iovlen > 0 ? msg->msg_iov[0].iov_len : 0;
	size_t want = strlen(fail_prefix);

	if (want > 0 && len >= sizeof(store) - 1 + want &&
		memcmp(text, store, sizeof(store) - 1) == 0 &&
		memcmp(text + sizeof(store) - 1, fail_prefix, want) == 0) {
		errno = ETOOMANYREFS;
		return -1;
	}
	return __real_sendmsg(fd, msg, flags);
}

/*
 * The description is replaced only after the manager has been asked to
 * drop the one before: a removal that failed (the manager was away) leaves
 * the old one in the store, so nothing is stored beside it (the next start
 * would find two and load every model afresh), and the next round asks
 * again, then stores.
 */
static void
test_description_replaced_after_its_removal(void **state)
{
	struct fixture *f = *state;
	struct du *t = f->t;
	char *a = du_model(t, "a.safetensors", 1024), msg[128];
	struct registry_attachment at;
	size_t from;

	assert_int_equal(du_load(t, "m", a, PIN_METADATA, 0), 0);
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	assert_int_equal(su_received(&f->m, 0, 1, FDSTORE_NAME_DESC), 1);
	assert_int_equal(su_received(&f->m, 0, 1, FDSTORE_NAME_STATUS), 1);
	assert_true(restore_state.desc_in_store);

	/* The description changes (a holder) while the manager is away. */
	su_manager_gone(&f->m);
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &at, msg, sizeof(msg)), 0);
	restore_sync(&t->reg);
	assert_true(restore_state.desc_in_store); /* still the old one's */

	/* It is back: the old description goes, then the new one comes. */
	su_manager_listen(&f->m);
	from = f->m.n;
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	assert_int_equal(f->m.n - from, 2);
	assert_int_equal(su_received(&f->m, from, 0, FDSTORE_NAME_DESC), 1);
	assert_false(f->m.got[from].store);
	assert_int_equal(su_received(&f->m, from + 1, 1, FDSTORE_NAME_DESC), 1);
	assert_true(restore_state.desc_in_store);
	registry_release(&t->reg, at.gen, 0);
	free(a);
}

/* How many times needle occurs in haystack. */
static unsigned
occurrences(const char *haystack, const char *needle)
{
	unsigned n = 0;

	for (const char *p = haystack; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

/*
 * One model's generation that the manager refuses for good (not a full
 * queue): the other model's generation and the description still go in
 * (the refused one described without generations: it alone loads afresh
 * after a restart), and the warning says so once, not at every
 * restore_sync() (every 200 ms in wcached). Before, the first refusal
 * ended the round: nothing after it, the description included, was ever
 * stored, and the warning came every time.
 */
static void
test_one_refused_generation_stores_the_rest(void **state)
{
	struct fixture *f = *state;
	struct du *t = f->t;
	char *a = du_model(t, "a.safetensors", 1024), *b = du_model(t, "b.safetensors", 2048);
	char name[FDSTORE_MAX_FDNAME + 1], *log;
	struct fdstore_desc *d;
	unsigned slot_m, slot_n;

	assert_int_equal(du_load(t, "m", a, PIN_METADATA, 0), 0);
	assert_int_equal(du_load(t, "n", b, PIN_METADATA, 0), 0);
	slot_m = registry_find(&t->reg, "m")->slot;
	slot_n = registry_find(&t->reg, "n")->slot;
	snprintf(fail_prefix, sizeof(fail_prefix), "wc-%u-", slot_n);
	du_log_start(t);
	for (int i = 0; i < 5; i++)
		restore_sync(&t->reg);
	log = du_log_stop(t);
	fail_prefix[0] = '\0';
	su_manager_read(&f->m);
	assert_true(fdstore_name_index(name, sizeof(name), slot_m, 1) > 0);
	assert_int_equal(su_received(&f->m, 0, 1, name), 1);
	assert_int_equal(su_received(&f->m, 0, 1, FDSTORE_NAME_DESC), 1);
	d = su_last_description(&f->m);
	assert_int_equal(d->nmodels, 2);
	for (uint32_t i = 0; i < d->nmodels; i++)
		assert_int_equal(d->models[i].ngenerations, strcmp(d->models[i].name, "m") == 0);
	fdstore_free(d);
	assert_int_equal(occurrences(log, "warning: model \"n\": generation 1 is not stored ("),
		1);
	free(log);

	/* The manager takes it now: stored, and described again. */
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	d = su_last_description(&f->m);
	for (uint32_t i = 0; i < d->nmodels; i++)
		assert_int_equal(d->models[i].ngenerations, 1);
	fdstore_free(d);
	free(a);
	free(b);
}

/*
 * Held generations past FDSTORE_MAX_GENERATIONS of one model are left out
 * of the description, oldest first, and named in what it leaves out (the
 * warning). Before, they were skipped without a word.
 */
static void
test_held_past_the_limit_are_named(void **state)
{
	struct fixture *f = *state;
	struct du *t = f->t;
	enum { HELD = FDSTORE_MAX_GENERATIONS + 1 };
	struct registry_attachment at[HELD];
	char *a = du_model(t, "a.safetensors", 1024), left[1024], msg[128];
	struct fdstore_desc *d = NULL;

	/* More retired generations open than a reload allows (rev173 F9):
	 * the store's own limit is what this checks. */
	t->reg.retired_max = HELD + 1;
	assert_int_equal(du_load(t, "m", a, PIN_NONE, 0), 0);
	/* Generations 1 .. HELD held by attaches, HELD + 1 current. */
	for (int i = 0; i < HELD; i++) {
		char *next = du_model(t, "n.safetensors", 2048 + 16 * (size_t)i);

		assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &at[i], msg,
			sizeof(msg)), 0);
		assert_int_equal(rename(next, a), 0);
		assert_int_equal(du_reload(t, "m"), 0);
		free(next);
	}
	assert_int_equal(du_current(t, "m")->number, HELD + 1);
	for (struct generation *g = t->reg.generations; g != NULL; g = g->next) {
		g->stored_slot = g->model->slot;
		g->stored_done = 1;
	}
	assert_int_equal(restore_describe(&t->reg, FDSTORE_MAX_FDS, &d, left, sizeof(left)), 0);
	assert_int_equal(d->models[0].ngenerations, FDSTORE_MAX_GENERATIONS);
	assert_string_equal(left, "held generations left out: \"m\" 2, \"m\" 1");
	assert_int_equal(fdstore_check(d), 0);
	fdstore_free(d);
	for (int i = 0; i < HELD; i++)
		registry_release(&t->reg, at[i].gen, 0);
	free(a);
}

/*
 * A pin changed at run time (a reload, wcachectl pin) makes no new
 * generation, but the description says it: the next start compares the
 * configured pin with what was stored. Before, the description stayed as
 * it was (its hash left the pin out) until something else changed.
 */
static void
test_pin_change_stores_the_description(void **state)
{
	struct fixture *f = *state;
	struct du *t = f->t;
	char *a = du_model(t, "a.safetensors", 1024);
	struct fdstore_desc *d;
	size_t from;

	assert_int_equal(du_load(t, "m", a, PIN_METADATA, 0), 0);
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	d = su_last_description(&f->m);
	assert_int_equal(d->nmodels, 1);
	assert_int_equal(d->models[0].ngenerations, 1);
	assert_int_equal(d->models[0].generations[0].pin, PIN_METADATA);
	fdstore_free(d);

	assert_int_equal(registry_pin(&t->reg, "m", PIN_NONE), 0);
	du_settle(t);
	from = f->m.n;
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	assert_int_equal(su_received(&f->m, from, 0, FDSTORE_NAME_DESC), 1);
	assert_int_equal(su_received(&f->m, from, 1, FDSTORE_NAME_DESC), 1);
	d = su_last_description(&f->m);
	assert_int_equal(d->models[0].generations[0].pin, PIN_NONE);
	fdstore_free(d);
	free(a);
}

/*
 * The store's limit: FDSTORE_MAX_FDS (the unit's FileDescriptorStoreMax=),
 * or $FDSTORE when it is a smaller number (systemd 254 and later set it to
 * FileDescriptorStoreMax=, which a drop-in may have lowered); anything but
 * digits is no number. A store of fewer than 2 (the status page and the
 * description) is none. Before, $FDSTORE was read as on ("0": off) only.
 */
static void
test_store_max_reads_fdstore(void **state)
{
	static const struct {
		const char *value;
		size_t max;
	} cases[] = {
		{ "8", 8 }, { "0", 0 }, { "16383", 16383 }, { "16384", FDSTORE_MAX_FDS },
		{ "99999999999999999999999", FDSTORE_MAX_FDS },
		{ "", FDSTORE_MAX_FDS }, { "8x", FDSTORE_MAX_FDS },
		{ "-1", FDSTORE_MAX_FDS }, { " 8", FDSTORE_MAX_FDS },
	};

	(void)state;
	assert_int_equal(unsetenv("FDSTORE"), 0);
	assert_int_equal(restore_store_max(), FDSTORE_MAX_FDS);
	assert_true(restore_enabled()); /* $NOTIFY_SOCKET: the fixture's manager */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(setenv("FDSTORE", cases[i].value, 1), 0);
		assert_int_equal(restore_store_max(), cases[i].max);
	}
	assert_int_equal(setenv("FDSTORE", "0", 1), 0);
	assert_false(restore_enabled());
	assert_int_equal(setenv("FDSTORE", "1", 1), 0);
	assert_false(restore_enabled());
	assert_int_equal(setenv("FDSTORE", "2", 1), 0);
	assert_true(restore_enabled());
	assert_int_equal(unsetenv("FDSTORE"), 0);
}

/* The most descriptors the manager held at once from message from on, as
 * systemd counts them (one per name here: each store is of one), given
 * held before it; each name's store counted once until its removal. */
static size_t
most_held(const struct su_manager *m, size_t from, size_t held)
{
	size_t most = held;

	for (size_t i = from; i < m->n; i++) {
		int had = 0;

		for (size_t k = 0; k < i; k++)
			if (strcmp(m->got[k].name, m->got[i].name) == 0)
				had = m->got[k].store;
		if (m->got[i].store && !had)
			held++;
		else if (!m->got[i].store && had)
			held--;
		if (held > most)
			most = held;
	}
	return most;
}

/* The generations the description d gives model name (-1: not described). */
static int
described_generations(const struct fdstore_desc *d, const char *name)
{
	for (uint32_t i = 0; i < d->nmodels; i++)
		if (strcmp(d->models[i].name, name) == 0)
			return (int)d->models[i].ngenerations;
	return -1;
}

/* d describes model name with no generation and, in their place, the one
 * file path (its owner, device and inode) as its tree's kept file, its path
 * having named a file (format version 10, review rev209 M1); or, with a
 * generation, no kept file. */
static void
assert_kept_file(const struct fdstore_desc *d, const char *name, const char *path)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	for (uint32_t i = 0; i < d->nmodels; i++) {
		const struct fdstore_tree *tr = &d->models[i].tree;

		if (strcmp(d->models[i].name, name) != 0)
			continue;
		assert_non_null(tr->root);
		if (d->models[i].ngenerations > 0) {
			assert_int_equal(tr->nkept, 0);
			return;
		}
		assert_int_equal(tr->nkept, 1);
		assert_int_equal(tr->kept[0].uid, st.st_uid);
		assert_int_equal(tr->kept[0].dev, st.st_dev);
		assert_int_equal(tr->kept[0].ino, st.st_ino);
		assert_int_equal(tr->named, FDSTORE_NAMED_FILE);
		return;
	}
	fail_msg("model \"%s\" not described", name);
}

/*
 * Under FileDescriptorStoreMax=6 ($FDSTORE=6), of one-file models (2
 * descriptors a generation): the status page and the description count
 * too, so 2 generations fit. What the description leaves out is not stored,
 * and what was stored and no longer fits is removed first: a held
 * generation once a new model comes, then the oldest model's current one
 * once a third comes. At no point does the manager hold more than 6, and
 * the warning names exactly what is left out. Before, the limit was
 * FDSTORE_MAX_FDS whatever $FDSTORE said, left out wc-status and wc-desc,
 * and every current generation was stored (a held one left out stayed):
 * the manager would have refused the last ones without a reply.
 */
static void
test_store_within_fdstore(void **state)
{
	struct fixture *f = *state;
	struct du *t = f->t;
	char *a = du_model(t, "a.safetensors", 1024), *b = du_model(t, "b.safetensors", 2048);
	char *c = du_model(t, "c.safetensors", 3072), *next = du_model(t, "n.safetensors", 4096);
	char name[FDSTORE_MAX_FDNAME + 1], msg[128], *log;
	struct registry_attachment at;
	struct fdstore_desc *d;
	unsigned slot_m;
	size_t from;

	assert_int_equal(setenv("FDSTORE", "6", 1), 0);
	assert_int_equal(du_load(t, "m", a, PIN_NONE, 0), 0);
	slot_m = registry_find(&t->reg, "m")->slot;
	restore_sync(&t->reg);
	/* Generation 1 of m held, 2 current: 2 + 2 + 2 = 6, all stored. */
	assert_int_equal(registry_attach(&t->reg, "m", &root_peer, &at, msg, sizeof(msg)), 0);
	assert_int_equal(rename(next, a), 0);
	assert_int_equal(du_reload(t, "m"), 0);
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	d = su_last_description(&f->m);
	assert_int_equal(described_generations(d, "m"), 2);
	fdstore_free(d);
	assert_int_equal(most_held(&f->m, 0, 0), 6);

	/* n comes: m's held generation 1 leaves the store, first. */
	assert_int_equal(du_load(t, "n", b, PIN_NONE, 0), 0);
	from = f->m.n;
	du_log_start(t);
	restore_sync(&t->reg);
	log = du_log_stop(t);
	su_manager_read(&f->m);
	assert_true(fdstore_name_index(name, sizeof(name), slot_m, 1) > 0);
	assert_int_equal(su_received(&f->m, from, 0, name), 1);
	assert_true(fdstore_name_file(name, sizeof(name), slot_m, 1, 0) > 0);
	assert_int_equal(su_received(&f->m, from, 0, name), 1);
	assert_non_null(strstr(log, "warning: warm restart: the file descriptor store holds at "
				    "most 6 descriptors (FileDescriptorStoreMax=), the status page "
				    "and the description among them, and a model at most 64 "
				    "generations; not stored: held generations left out: \"m\" 1; "
				    "a restart loads them afresh"));
	free(log);
	d = su_last_description(&f->m);
	assert_int_equal(described_generations(d, "m"), 1);
	assert_int_equal(described_generations(d, "n"), 1);
	fdstore_free(d);
	assert_int_equal(most_held(&f->m, 0, 0), 6);

	/* o comes (the newest model first): m's current generation leaves. */
	assert_int_equal(du_load(t, "o", c, PIN_NONE, 0), 0);
	from = f->m.n;
	du_log_start(t);
	restore_sync(&t->reg);
	log = du_log_stop(t);
	su_manager_read(&f->m);
	assert_true(fdstore_name_index(name, sizeof(name), slot_m, 2) > 0);
	assert_int_equal(su_received(&f->m, from, 0, name), 1);
	assert_non_null(strstr(log, "not stored: models left out whole: \"m\"; a restart"));
	free(log);
	d = su_last_description(&f->m);
	assert_int_equal(d->nmodels, 3);
	assert_int_equal(described_generations(d, "m"), 0);
	assert_int_equal(described_generations(d, "n"), 1);
	assert_int_equal(described_generations(d, "o"), 1);
	/* m's tree records the file it served, in its descriptors' place. */
	assert_kept_file(d, "m", a);
	assert_kept_file(d, "n", b);
	fdstore_free(d);
	assert_int_equal(most_held(&f->m, 0, 0), 6);

	/* Nothing left to store: a sync stores nothing more. */
	from = f->m.n;
	restore_sync(&t->reg);
	su_manager_read(&f->m);
	assert_int_equal(f->m.n, from);
	assert_int_equal(unsetenv("FDSTORE"), 0);
	registry_release(&t->reg, at.gen, 0);
	free(a);
	free(b);
	free(c);
	free(next);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_description_replaced_after_its_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_pin_change_stores_the_description, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_one_refused_generation_stores_the_rest, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_held_past_the_limit_are_named, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_store_max_reads_fdstore, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_within_fdstore, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
