/*
 * daemonutil.h: helpers for the unit tests of the daemon's state machine
 * (test_registry, test_registry_attach, test_generation, test_server,
 * test_watch): a libuv loop with a warm pool and a registry, loads that
 * wait for their answer, small real model files, and capturing the log.
 *
 * Every wait runs the loop until a condition holds, bounded by a deadline
 * (a failed assertion, never a hang): no sleeps.
 */
#ifndef WC_DAEMONUTIL_H
#define WC_DAEMONUTIL_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "generation.h"
#include "registry.h"
#include "warm.h"

struct du {
	uv_loop_t loop;
	struct warm_pool *pool; /* NULL: no warming */
	struct registry reg;
	char *dir;              /* temporary directory, removed at the end */
	/* the last load's answer */
	int done_calls;
	int status;
	uint64_t generation;
	char message[512];
	int log_fd;             /* capture file while capturing, else -1 */
	int saved_stderr;
};

/* Sets up t: loop, registry, a temporary directory, and a warm pool unless
 * pool is false. pace (bytes per second, 0: unlimited) slows warming so a
 * test can act while it runs. */
void du_setup(struct du *t, bool pool, uint64_t pace);

/* Closes the registry and the pool, runs the loop until everything is
 * freed, checks uv_loop_close() succeeds, removes the directory. */
void du_teardown(struct du *t);

/* A set-up struct du (malloc'd) with or without a warm pool, and the
 * cmocka teardown that tears it down and frees *state. */
struct du *du_new(bool pool);
int du_free(void **state);

/* Writes a safetensors model of one F32 tensor of floats floats to
 * t->dir/name; returns the malloc'd path. */
char *du_model(struct du *t, const char *name, size_t floats);

/* The kinds of path a model is loaded by (du_model_kind): a safetensors
 * file, a directory holding one, a shard index naming one shard, and a
 * symbolic link to each, beside what it names. */
enum du_kind { DU_FILE, DU_DIR, DU_INDEX, DU_LINK_FILE, DU_LINK_DIR, DU_LINK_INDEX, DU_KINDS };

/* The kind's name, for a failing test's message. */
const char *du_kind_name(enum du_kind kind);

/* Makes a model of kind in t->dir/sub (made here) and returns the path to
 * load it by (malloc'd). */
char *du_model_kind(struct du *t, const char *sub, enum du_kind kind);

/* Renames a new version over what that path names (the file, directory or
 * index; a link's target): another inode is there after. */
void du_model_kind_replace(struct du *t, const char *sub, enum du_kind kind);

/* Takes every free descriptor below below into fill (their count in *n),
 * asserting that below itself is free: with the registry's fd_limit 400,
 * a one-file model's load from 333 on then reaches into the 64 descriptors
 * wcached keeps free for its clients. */
void du_fill_below(int *fill, int *n, int below);

/* Runs the loop until cond(arg) is true; fails the test after 20 s. */
void du_run_until(struct du *t, bool (*cond)(struct du *t, void *arg), void *arg);

/* Loads path as name and runs the loop until the load is answered; returns
 * its status (the message is in t->message, the number in t->generation). */
int du_load(struct du *t, const char *name, const char *path, enum pin_mode pin, int warm);

/* Reload of name, waited for like du_load. */
int du_reload(struct du *t, const char *name);

/* Runs the loop until the model's current generation (or pending, if
 * pending is true) is in state s, or no page operation and no warming job is
 * left when s is -1. Returns that generation. */
struct generation *du_wait_state(struct du *t, const char *name, bool pending, int s);

/* Runs the loop until no generation of the registry has a warming job or a
 * page operation left. */
void du_settle(struct du *t);

/* The current generation of name (asserted to exist). */
struct generation *du_current(struct du *t, const char *name);

/* Number of open generations in the registry. */
unsigned du_generations(struct du *t);

/* Starts sending the log (stderr) to a file, at debug level. */
void du_log_start(struct du *t);

/* Stops capturing and returns what was logged (malloc'd). */
char *du_log_stop(struct du *t);

/* mountrule.h's real paths, for the tests that wrap them (-Wl,--wrap=). */
struct mountrule_walk;
char *__real_mountrule_realpath(struct mountrule_walk *w, const char *path, char *why,
	size_t len);
char *__wrap_mountrule_realpath(struct mountrule_walk *w, const char *path, char *why,
	size_t len);
char *__real_mountrule_fd_realpath(struct mountrule_walk *w, int fd, const char *path,
	char *why, size_t len);
char *__wrap_mountrule_fd_realpath(struct mountrule_walk *w, int fd, const char *path,
	char *why, size_t len);

#endif
