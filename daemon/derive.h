/*
 * derive.h: derived artifacts: a model's generation transformed by a key
 * (proto/PROTOCOL.md, "Derived artifacts"), computed by one worker and
 * served to all.
 *
 * The table keeps, per (model, source generation, key), either the
 * artifact (a generation of its own whose one file is wcached's sealed copy
 * of the memfd the builder published) or the build in progress: its builder
 * (a connection of the server, opaque here), its token and deadline, and
 * the connections waiting for it, oldest first. Single flight: at most one
 * build of a key runs at a time. When a builder publishes, the memfd is
 * sealed, copied into a memfd of wcached's own (whose pages the kernel
 * charges to wcached's memory cgroup, not the builder's; where the copy
 * would pass the memory limit in force, artifacts nobody holds are dropped
 * first, least recently used first, so that only what workers hold can
 * refuse a publication room), validated with
 * the readers every model goes through and compiled; then every waiter is
 * answered. When it goes away (hang-up before its PUBLISH,
 * derive_timeout) the oldest waiter that may build takes over; a hang-up
 * after its PUBLISH leaves the check running for the waiters. When it
 * fails for good
 * (ABANDON, a refused publication, the model unloaded) every waiter gets
 * the error.
 *
 * An artifact belongs to its source generation: after a swap a request
 * builds anew, and the old artifact is dropped once nobody holds it. Its
 * bytes count against memory_budget (registry.h: derived_bytes, and the
 * drop_derived hook, which drops those nobody holds, least recently used
 * first).
 *
 * Below the warm restart (restore.c keeps artifacts in the fd store:
 * derive_stored_each, derive_adopt) and above the registry (it calls
 * registry_find_for, registry_attach_generation, registry_release) and
 * generation.c; the server calls it and is told the outcome for its
 * waiting connections through struct derive_hooks.
 * Everything runs on the event loop thread but the check of a publication
 * (seal, read, compile: a 100 MB header takes most of a second), which runs
 * on the work queue (workq.h) while the build and its builder wait.
 */
#ifndef WC_DERIVE_H
#define WC_DERIVE_H

#include <fcntl.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "lograte.h"
#include "memlimit.h"
#include "proto/wire.h"
#include "registry.h"

struct derived;
struct derive_build;

/* Bytes kept of the words that say where the memory limit comes from
 * (memlimit_source: a longer cgroup path is cut, and says so). */
#define DERIVE_MEM_SOURCE 256

/* The seals of a published artifact's memfd (derive_publish adds those
 * missing); a warm restart takes back only a memfd that has them all. */
#define DERIVE_ARTIFACT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

struct stat;

/*
 * Whether an artifact's memfd, as fstat gave st, has memory behind every
 * byte: a hole costs its builder nothing, weighs its full size in
 * memory_budget and becomes shmem zeros, kept while wcached keeps the
 * artifact, when a worker reads it. PUBLISH and a warm restart's taking
 * back both ask this. 0, or -EBADMSG with "the memfd is sparse: ..." in
 * why (why_size bytes).
 */
int derive_memfd_whole(const struct stat *st, char *why, size_t why_size);

/* Artifacts of its current generation and builds in progress one model
 * may have at once (a held copy of an older generation, never attached
 * again, takes no place: its holders bound it). Each artifact keeps
 * descriptors open in wcached (its memfd and its sealed index), so
 * without a bound one builder publishing under key after key would fill
 * wcached's descriptor table. A build past it first drops the model's
 * artifact nobody holds that was used least recently; with none, it is
 * refused (ENOSPC). */
#define DERIVE_MAX_PER_MODEL 64u

/* Of those, what one builder uid may have: its artifacts of the current
 * generation (held or not) and its builds in progress. A builder past it
 * first drops its own artifact of the model nobody holds that was used
 * least recently; with none it is refused (ENOSPC), and other builders
 * keep their places: one user cannot
 * take every place of a model (by building, or by holding what it built). */
#define DERIVE_MAX_PER_BUILDER 16u

/* What one publication may cost wcached beyond its memfd: the head its
 * check reads and parses (a safetensors header, a WEIG file's tables) and
 * the compiled index wcached keeps for it, each at most this many bytes
 * (16 MiB: some 150,000 tensors of llama-like names). The check of a larger
 * one is refused before it parses (head) or before its index is sealed
 * (index), so a check's memory is a few times this at most, and at most
 * DERIVE_CHECKS_AT_ONCE run. The index's bytes count with the artifact's in
 * derived_bytes, against memory_budget and the bound of one artifact. */
#define DERIVE_MAX_HEAD (16u << 20)
#define DERIVE_MAX_INDEX (16u << 20)

/* The head the reader of fd's format would read and parse before anything
 * else (the safetensors header, a WEIG file's tables), from fd's first
 * bytes (size: the file's): 0 where fewer than 4 bytes are there. Compared
 * with DERIVE_MAX_HEAD by a PUBLISH and by a warm restart. */
uint64_t derive_head_len(int fd, uint64_t size);

/* How long a publication's copy waits for the artifacts dropped to make
 * room for it to be let go in the closer's lanes (of wcached's own for
 * their builders, closer.h): then the kernel decides whether there is room
 * (derive_publish.c). */
#define DERIVE_CLOSES_WAIT_MS 30000

/* Lines of the log a builder's requests cause (a build started, handed on,
 * failed or abandoned, a publication and its check) per builder uid per
 * minute (lograte.h); the rest are counted in the next line logged. A
 * DERIVE -> BUILD -> ABANDON loop wrote 10,900 lines a second. */
#define DERIVE_LOG_BURST 32u

/* How the outcome reaches a waiting connection (the server's). Each is
 * called once per waiter, which is no longer waiting when it is called. */
struct derive_hooks {
	/* The artifact is published: attach it (derive_attach). */
	void (*ready)(void *conn, uint32_t seq, struct derived *a);
	/* The same for its builder, which waited for its PUBLISH to be checked. */
	void (*published)(void *conn, uint32_t seq, struct derived *a);
	/* The builder went away and conn is next: it builds now (derive_attach_source,
	 * then a BUILD with derive_token). */
	void (*build)(void *conn, uint32_t seq, struct derive_build *b);
	/* The build failed for good, or the wait timed out: an ERROR. */
	void (*fail)(void *conn, uint32_t seq, int err, const char *msg);
};

struct derive_stats {
	uint64_t builds;        /* builds started (each builder, first or next) */
	uint64_t published;     /* artifacts published */
	uint64_t published_bytes;
	uint64_t waits;         /* DERIVEs that waited for a build */
	uint64_t failures;      /* builds that failed for good */
	uint64_t builders_lost; /* builders that disconnected or timed out */
	uint64_t attaches;      /* attaches of artifacts */
	uint64_t dropped;       /* artifacts dropped (nobody held them) */
};

/* Who abandoned a build lately (derive_abandon), kept for the build's
 * derive_timeout: a new build of that key and generation counts the uid as
 * one that lost it, so that when it abandons again a waiter of another user
 * that may build takes it over instead of every waiter failing. Otherwise a
 * builder that sent ABANDON and a new DERIVE in one burst was the builder
 * again before any waiter heard of the failure, for ever (rev181 F2).
 * DERIVE_ABANDONED are kept. A full list forgets the one of another uid
 * that ends first, or, once the uid has DERIVE_ABANDONED_PER_UID, that
 * uid's own newest: a uid that abandons many other keys churns its own
 * places and cannot flush out its first, nor other uids' (review rev181
 * F2: 64 abandons of other keys made a builder forget it had abandoned
 * the key it held hostage). */
#define DERIVE_ABANDONED 64
#define DERIVE_ABANDONED_PER_UID 16
struct derive_abandoned {
	uint64_t entry_id;
	uint64_t source;
	uint64_t until_ms;       /* 0: an empty place */
	uid_t uid;
	char key[WIRE_MAX_KEY + 1];
};

/* Builds taken from their builder at derive_timeout, or failed by a
 * reload, lately, by token: a late PUBLISH or ABANDON with one is told that
 * (rev181 F3: it was told "no build in progress has token X (it was
 * published, abandoned, timed out or never given)", never the setting to
 * raise, nor the reload). DERIVE_ENDED_TOKENS are kept, the oldest
 * forgotten first: twice what can end at once, a reload ending every build
 * of a model (derive_drop_unallowed, derive_fail_derive_off: at most
 * DERIVE_MAX_PER_MODEL), so that neither those nor the ones ended just
 * before push each other out (review rev193 F5: 16 lost the why of all
 * but 16). A reload that ends the builds of several models at once may
 * still push out the oldest: their builders are told "no build in
 * progress". */
#define DERIVE_ENDED_TOKENS (2 * DERIVE_MAX_PER_MODEL)
struct derive_ended {
	uint64_t token;          /* 0: an empty place */
	uint64_t timeout_s;
	char what[WIRE_MAX_NAME + WIRE_MAX_KEY + 64]; /* model "m": derived "k" of generation G */
	char why[128];           /* "": taken at derive_timeout; else why it failed
				  * (a reload that narrowed derive_groups or
				  * turned derive off) */
};

struct derive_table {
	struct registry *r;
	struct derived *artifacts;
	struct derive_build *builds;
	uint64_t next_token;
	uv_timer_t timer;          /* the next deadline of a builder or a waiter */
	struct derive_hooks hooks;
	struct derive_stats stats;
	struct closer *closer;     /* closes what builders pass (closer.h); NULL: close() */
	/* Publication checks (derive_publish.c): those on the work queue, at
	 * most DERIVE_CHECKS_AT_ONCE and one per builder uid (checks_closing
	 * below counts for its uid too), and those that wait for a place,
	 * first come first served. */
	struct derive_check *checks_running, *checks_waiting;
	unsigned nchecks_running;
	struct lograte lines;      /* DERIVE_LOG_BURST lines per builder uid a minute */
	/* The memory limit in force (memlimit.h: RAM, or wcached's cgroup
	 * limit when smaller) and where it comes from, in words, as the last
	 * read of it set them (derive_set_memory_limit): without a
	 * memory_budget it bounds an artifact. 0: not known, no bound. */
	uint64_t mem_limit;
	char mem_source[DERIVE_MEM_SOURCE];
	/* 1: that limit is the machine's RAM, which holds a publication twice
	 * while wcached copies it (the builder's memfd and wcached's copy). */
	int mem_ram;
	/* Where the kernel says how much of that limit is in use, and in
	 * which format (memlimit_use): before its copy, a check asks it, since
	 * wcached cannot see who else maps its artifacts (review rev184 F1). */
	char mem_use_file[MEMLIMIT_PATH_CAP * 2];
	enum memlimit_kind mem_kind;
	/* The last reason (-errno) that file could not be read for, logged
	 * once (the checks' threads: __atomic); 0 again at each reload. */
	int use_unread_err;
	/* Bytes the checks running have reserved and not copied yet (the
	 * rest of their copies is in what the kernel says is in use): the
	 * checks' threads add and take (__atomic). */
	uint64_t uncopied;
	/* Checks whose copy waits for the artifacts dropped to make room for
	 * it to be let go in the closer's lanes (derive_publish.c: closer_then,
	 * at most DERIVE_CLOSES_WAIT_MS): closes_async wakes the loop from a
	 * lane (closes_async_state: 0 not made yet, 1 open, -1 closed or could
	 * not be made), closes_timer ends the wait. */
	struct derive_check *checks_closing;
	uv_async_t closes_async;
	int closes_async_state;
	uv_timer_t closes_timer;
	/* derived_bytes (registry.h) plus what the checks running have
	 * reserved for their copies (derive_publish.c: check_reserve): the
	 * memory wcached's artifacts take or are about to take, which the
	 * checks' threads read and add to (__atomic); changed with
	 * derived_bytes by derive_count. */
	uint64_t charged;
	struct derive_abandoned abandoned[DERIVE_ABANDONED];
	struct derive_ended ended[DERIVE_ENDED_TOKENS];
	unsigned next_ended;       /* the place the next one takes */
	int closed;
};

struct memlimit;

/* Takes the memory limit in force from m (after derive_init, and at each
 * read of it: reload_memory_budget). */
void derive_set_memory_limit(struct derive_table *t, const struct memlimit *m);

/* What derive_request() decided. */
enum derive_outcome {
	DERIVE_READY = 0, /* *artifact: attach it */
	DERIVE_BUILD = 1, /* *build: conn is its builder (derive_attach_source) */
	DERIVE_WAIT = 2,  /* conn waits; a hook answers it later */
};

/* Sets up t for r (and r's drop_derived hook); 0 or -errno. */
int derive_init(struct derive_table *t, struct registry *r, const struct derive_hooks *hooks);

/* Fails every waiter and build, drops every artifact nobody holds (those
 * held close with their last holder), closes the timer. Before
 * registry_close(). */
void derive_close(struct derive_table *t);

/*
 * A DERIVE of d from conn (peer's credentials, request seq): checks access
 * to the model and that it has derive = yes, then finds the artifact of its
 * current generation and d's key, the build in progress, or starts one
 * when peer may build. Returns an enum derive_outcome (filling *artifact or
 * *build), or -errno with the client's message in msg: -ENOENT, -EACCES,
 * -EPERM, -EIO, -ESTALE, -EAGAIN (wait_ms 0 and a build runs), -ENOMEM.
 */
int derive_request(struct derive_table *t, const struct wire_derive *d,
	const struct registry_peer *peer, void *conn, uint32_t seq, struct derived **artifact,
	struct derive_build **build, char *msg, size_t msg_size);

/* Attaches artifact a for a client: a reference and the descriptors. */
void derive_attach(struct derive_table *t, struct derived *a, struct registry_attachment *out);

/* Attaches b's source generation for its builder. */
void derive_attach_source(struct derive_table *t, struct derive_build *b,
	struct registry_attachment *out);

/* The token that names b in PUBLISH and ABANDON. */
uint64_t derive_token(const struct derive_build *b);

/* A builder's groups as its connection's peer credentials gave them (what
 * registry_may_build judges): its gid and supplementary groups. gid
 * (gid_t)-1, no groups: not known (an artifact taken back from a store
 * that did not record them, fdstore.h). */
struct derive_cred {
	gid_t gid;
	gid_t *groups;           /* ngroups of them; malloc'd where it is owned */
	uint32_t ngroups;
};

/*
 * PUBLISH of token by conn (of uid owner, request seq) with memfd (always
 * taken: kept on success, otherwise closed in owner's lane of t->closer).
 * Returns 0 when the memfd is being checked: on the work queue it is sealed,
 * validated with the readers every model goes through and compiled, and
 * then conn is answered by a hook: hooks.published (and every waiter by
 * hooks.ready), or hooks.fail, and then the build has ended for good and
 * every waiter gets the error too. No deadline runs while it is checked.
 * If conn goes away meanwhile (derive_conn_gone), the check goes on without
 * it (the memfd and what the check makes are the check's): the waiters get
 * the artifact; refused, the build goes to the oldest waiter that may build,
 * or every waiter gets EHOSTDOWN, with the reason.
 * Its copy is reserved under the memory limit in force first: where it
 * would pass it, the artifacts nobody holds are dropped, least recently used
 * first, when that makes room (each logged with the bytes no longer kept),
 * and the check goes on once their memory is let go in the closer's lanes
 * (at most DERIVE_CLOSES_WAIT_MS); the publication is refused (ENOMEM)
 * when what workers hold and the other checks reserved leave no room, and
 * when the kernel says the copy would pass the limit after all (what
 * wcached's memory cgroup, or the machine, has in use that it cannot
 * reclaim: a dropped artifact a worker still maps is) and dropping, once,
 * that much more of what nobody holds would not make room (or did not).
 * Past that wait the kernel has the same word.
 * A check holds memory of the order of the artifact's header (a 100 MB
 * safetensors header: a few hundred MB while it is parsed): at most
 * DERIVE_CHECKS_AT_ONCE run at once, one per builder uid (one that waits
 * for closes holds its uid's place too), so that one user
 * publishing from many connections cannot multiply that; the others wait
 * their turn (logged), in order.
 * Or -errno with msg, answered now: -ESTALE (no such build in progress),
 * -EPERM (another connection's), -ENOMEM.
 * cred: the groups of conn's peer, copied: the artifact keeps them, and a
 * warm restart judges derive_groups by them (restore_rules.c).
 */
int derive_publish(struct derive_table *t, void *conn, uid_t owner,
	const struct derive_cred *cred, uint32_t seq, uint64_t token, int memfd, char *msg,
	size_t msg_size);

/* ABANDON of token by conn with a reason: the build ends for good. 0, or
 * -ESTALE / -EPERM as for derive_publish. */
int derive_abandon(struct derive_table *t, void *conn, uint64_t token, const char *reason,
	char *msg, size_t msg_size);

/* conn closed: it waits no more, and the builds it ran go to the next
 * waiter that may build; one whose PUBLISH it sent is checked still, and
 * the check answers the waiters (derive_publish). */
void derive_conn_gone(struct derive_table *t, void *conn);

/* Releases a reference a client of uid held on g (any generation: derive's
 * or a model's; REGISTRY_NO_UID: one of derive's own), and drops g's
 * artifact when that was the last holder of an artifact whose source is
 * no longer current. */
void derive_release(struct derive_table *t, struct generation *g, uid_t uid);

/* Drops the artifacts nobody holds whose source generation is no longer
 * its model's current one (after a swap or an unload). */
void derive_collect(struct derive_table *t);

/* For status: calls fn for every artifact of the model called model_name. */
struct derive_info {
	const char *key;
	uint64_t source;      /* source generation */
	uint64_t bytes;
	uint64_t attach_count;
	unsigned holders;
	double build_seconds;
	uid_t builder_uid;
	pid_t builder_pid;
	const char *format;   /* "safetensors" or "weig" */
	int building;         /* 1: a build in progress (bytes etc. are 0) */
	int checking;         /* a build whose publication is being checked */
	int builder_gone;     /* a build whose builder disconnected (after its PUBLISH) */
	int withdrawn;        /* dropped while held (derive_drop): attached no more, it
			       * goes when its last holder releases it */
	unsigned waiting;     /* a build's waiters */
};
void derive_each(const struct derive_table *t, const char *model_name,
	void (*fn)(const struct derive_info *, void *), void *arg);

/* For the warm restart (restore.h), which keeps artifacts in the
 * manager's fd store like generations: every artifact of the model entry
 * m, with its generation (file 0 is the sealed artifact memfd, index_fd
 * its sealed index). */
struct derive_stored {
	const char *key;
	uint64_t source;
	struct generation *gen;
	uid_t builder_uid;
	pid_t builder_pid;
	double build_seconds;
	struct derive_cred builder_cred; /* its groups (not owned; derive_adopt copies them) */
};
void derive_stored_each(const struct derive_table *t, const struct model_entry *m,
	void (*fn)(const struct derive_stored *, void *), void *arg);

/* What derive_drop() did. */
struct derive_dropped {
	unsigned dropped;  /* nobody held them: gone, their memory freed */
	unsigned held;     /* withdrawn: they go when their last holder releases them */
	unsigned building; /* builds in progress of them, left alone */
};

/*
 * `wcachectl drop`: withdraws model_name's artifacts (of every source
 * generation), only those of key when key is not NULL. Those nobody holds
 * are dropped now; a held one is attached no more, takes no place, is not
 * kept for a warm restart, and goes when its last holder releases it (the
 * next DERIVE of its key builds anew). Builds in progress are left alone
 * (counted in building): what they publish is served. -ENOENT when nothing
 * (no artifact, no build) matches key; 0 otherwise, with *out filled.
 */
int derive_drop(struct derive_table *t, const char *model_name, const char *key,
	struct derive_dropped *out);

/*
 * A reload changed model_name's derive_groups to builders (review rev181
 * F6): withdraws, as derive_drop does (logged "(derive_groups)"), each of
 * its artifacts whose builder may not build under builders now, judged as
 * a warm restart judges it (restore_rules.c): its uid and the gid and
 * groups its connection had at its PUBLISH, as a connection of them would
 * be (root and self_uid always may). One whose groups are not recorded
 * (taken back from a version 6 store) is kept: the next restart asks the
 * user database, which the loop does not. The waiters' right to take a
 * build over is judged again under builders. A build in progress whose
 * builder may not build under builders now (its uid and its connection's
 * gid and groups) is taken from it, unless its publication is being
 * checked (the check judges it again): the oldest waiter that may build
 * takes it over, as when a builder goes away; with none every waiter gets
 * EHOSTDOWN (one line naming the model, the key, the builder's pid and uid
 * and derive_groups). Its builder learns why at its PUBLISH or ABANDON
 * (EPERM). Those left are counted (building).
 */
void derive_drop_unallowed(struct derive_table *t, const char *model_name,
	const struct access_list *builders, uid_t self_uid, struct derive_dropped *out);

/*
 * A reload turned model_name's derive off (review rev190 D1): each build in
 * progress of it fails for every waiter (EPERM, one line naming the model,
 * the key, the builder's pid and uid and derive = no), unless its
 * publication is being checked (the check refuses it); its builder learns
 * why at its PUBLISH or ABANDON (EPERM). Returns how many failed. Before,
 * the builds went on, and a waiter was handed one when its builder left.
 */
unsigned derive_fail_derive_off(struct derive_table *t, const char *model_name);

/* Lists g, an artifact taken back from the store (made with gen_new() as
 * the key's artifact of m's generation source, READY, checked: seals and
 * the reader), as if it had been published. Takes g on success only: 0,
 * -EEXIST (that key of that generation is already there), -ENOMEM. */
int derive_adopt(struct derive_table *t, struct model_entry *m, const struct derive_stored *s);

#endif
