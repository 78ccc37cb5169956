/*
 * derive_internal.h: what derive.c (the table: requests, waits, builds,
 * artifacts) and derive_publish.c (a PUBLISH checked on the work queue,
 * then served) share. Not for other modules: they use derive.h.
 */
#ifndef WC_DERIVE_INTERNAL_H
#define WC_DERIVE_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "derive.h"
#include "proto/wire.h"

struct derive_check;

struct derived {
	uint64_t entry_id;       /* the model entry it was built for */
	char *model_name;
	uint64_t source;         /* source generation number */
	char key[WIRE_MAX_KEY + 1];
	struct generation *gen;  /* file 0: wcached's sealed copy of the builder's
				  * memfd; kept while listed */
	uid_t builder_uid;
	pid_t builder_pid;
	struct derive_cred builder_cred; /* the groups it published with: owned */
	double build_seconds;
	uint64_t attach_count;
	uint64_t last_use;       /* the registry's attach_seq, for the LRU */
	int withdrawn;           /* `wcachectl drop` while held: never attached
				  * again, takes no place, goes with its last
				  * holder (derive_drop) */
	struct derived *next;
};

struct derive_waiter {
	void *conn;
	uint32_t seq;
	uint64_t deadline_ms;    /* UINT64_MAX: none */
	int may_build;
	pid_t pid;
	uid_t uid;
	gid_t gid;               /* its connection's gid and groups (not owned: */
	const gid_t *groups;     /* the connection outlives its wait), what a */
	uint32_t ngroups;        /* reload judges may_build by again */
	struct derive_waiter *next;
};

/* Builder uids that lost a build (timed out, or left before publishing)
 * that it remembers: their waiters take it over only while nobody else
 * waits (derive_builder_lost). */
#define DERIVE_LOST_UIDS 8

struct derive_build {
	uint64_t entry_id;
	char *model_name;
	uint64_t source;
	char key[WIRE_MAX_KEY + 1];
	struct generation *src;  /* a reference held for the build's life */
	uint64_t token;
	void *builder;           /* the builder's connection; NULL once it went
				  * away after its PUBLISH, while that is checked */
	pid_t builder_pid;
	uid_t builder_uid;
	struct derive_cred builder_cred; /* its connection's gid and groups (what
					  * derive_groups judged it by at its DERIVE
					  * and judges again at its PUBLISH, a reload
					  * and its check's end; gid (gid_t)-1: not
					  * known), owned */
	uint64_t started_ms;     /* this builder's start */
	uint64_t deadline_ms;
	uint64_t timeout_ms;
	struct derive_waiter *waiters; /* oldest first */
	uid_t lost_uids[DERIVE_LOST_UIDS]; /* builders of it that lost it */
	unsigned nlost;
	struct derive_check *check;    /* its publication, while it is checked */
	struct derive_build *next;
};

/* derive.c */
uint64_t derive_now_ms(const struct derive_table *t);
/* *dst (whose groups it frees) becomes a copy of from: 0, or -ENOMEM with
 * *dst untouched. */
int derive_cred_copy(struct derive_cred *dst, const struct derive_cred *from);
void derive_cred_clear(struct derive_cred *c);
/* Whether b's builder (its uid, and the gid and groups of b->builder_cred)
 * may still build b's model under its derive_groups now (registry_may_build:
 * root and wcached's own uid always may): 1 where it may, where its model is
 * gone or (derive on) its groups are not known; else 0 with the reason in
 * why (derive = no: nobody may). PUBLISH
 * and the end of its check ask it, since a reload may have narrowed
 * derive_groups after the DERIVE that judged it. */
int derive_builder_may(struct derive_table *t, const struct derive_build *b, char *why,
	size_t why_size);
/* What artifact g weighs in derived_bytes (and so in memory_budget): its
 * memfd and the compiled index wcached keeps for it. */
uint64_t derive_weight(const struct generation *g);
/* Adds bytes to (add 1) or takes them from (add 0) derived_bytes and
 * t->charged, on the loop. */
void derive_count(struct derive_table *t, uint64_t bytes, int add);
/* Bytes (derive_weight) of the artifacts no worker holds: what
 * derive_drop_unheld could free at most. */
uint64_t derive_unheld_bytes(const struct derive_table *t);
/* Drops artifacts no worker holds, least recently used (attached,
 * released or published) first, until want bytes went or none is left,
 * each with a line of the log that names it, why and the bytes no longer
 * kept (freed once nobody maps them: a worker that released one may still
 * map it). Returns the bytes dropped; with lanes (cap places), the lanes
 * of the closer their memory is let go in (their builders' uids), each
 * once, into lanes[0 .. *nlanes) (the rest left out where cap is short).
 * On the loop: the memory budget (the registry's drop_derived hook) and a
 * publication short of room (derive_publish.c). */
uint64_t derive_drop_unheld(struct derive_table *t, uint64_t want, const char *why,
	uid_t *lanes, size_t cap, size_t *nlanes);
/* The model entry an artifact or build was made for, if still there. */
struct model_entry *derive_entry_of(struct derive_table *t, const char *name, uint64_t entry_id);
/* Whether a line a builder of uid caused may be logged now
 * (DERIVE_LOG_BURST): 1 with the count of those that were not in more
 * (" (N more ... not logged ...)" or ""), else 0. */
int derive_may_log(struct derive_table *t, uid_t uid, char *more, size_t size);
/* Arms the timer for the earliest deadline of a builder or a waiter. */
void derive_rearm(struct derive_table *t);
void derive_unlink_build(struct derive_table *t, struct derive_build *b);
/* Frees b (already unlinked, no waiters left), its source reference, and
 * cancels its check. */
void derive_build_free(struct derive_table *t, struct derive_build *b);
/* The build ends for good: every waiter gets err with text. */
void derive_build_fail(struct derive_table *t, struct derive_build *b, int err, const char *text);
/* The builder went away (why, after "the builder (pid P uid U) "), or its
 * publication was refused after it had gone: the oldest waiter that may
 * build (as its DERIVE judged it and as the model's derive and
 * derive_groups do now), of a uid that has not lost this build, takes over; one of a uid
 * that has, only when every waiter is of such a uid; else every waiter gets
 * EHOSTDOWN with why. */
void derive_builder_lost(struct derive_table *t, struct derive_build *b, const char *why);
/* The build of token, if conn runs it: 0, or -ESTALE / -EPERM with msg. */
int derive_build_of_token(struct derive_table *t, void *conn, uint64_t token,
	struct derive_build **out, char *msg, size_t msg_size);

/* derive_publish.c: the check's result will be dropped (its build ended
 * some other way); one still waiting for its place is freed at once.
 * Accepts NULL. */
void derive_check_cancel(struct derive_check *c);

#endif
