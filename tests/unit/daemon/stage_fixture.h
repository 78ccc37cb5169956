/*
 * stage_fixture.h: the fixture of the unit tests of the stage module
 * (test_stage, test_stage_changed, test_stage_remove): a temporary
 * directory holding the model's sources (src/) and stage_dir (staged/),
 * source files of pseudo-random bytes, a stage_request for them, and the
 * check that a copy is exact.
 *
 * The knobs of the fault injection live here, so that setup() can reset
 * them; stage_fault.c, linked (with the linker's --wrap) only into the
 * tests that copy, wraps copy_file_range, sendfile, statvfs, stat and
 * unlinkat and obeys them.
 */
#ifndef WC_STAGE_FIXTURE_H
#define WC_STAGE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "stage.h"
#include "testutil.h"

/* What stage_fault.c's wrappers do; each forwards to the real call unless
 * a knob says otherwise. */
extern int (*copy_hook)(unsigned call); /* returns an errno to fail with, or 0 */
extern unsigned copy_calls, sendfile_calls;
extern int sendfile_errno;              /* nonzero: sendfile fails with it */
extern uint64_t statvfs_free;           /* nonzero: the free bytes statvfs reports */
extern const char *stat_fail_path;      /* a look at this path (the walk: mountrule_open,
                                           mountrule_stat) fails with stat_errno (EXDEV:
                                           refused, its why set) */
extern int stat_errno;
extern int stat_failures;               /* ... this many times (-1: every time) */
/* Called with each name unlinkat() removes (an entry of a copy, or a copy
 * itself), before it does: a stop that comes during a removal. Returns an
 * errno for unlinkat to fail with, or 0. */
extern int (*unlink_hook)(const char *name);

struct fixture {
	char *tmp;          /* the test's directory */
	char *src;          /* tmp/src: the model's directory */
	char *stage_dir;    /* tmp/staged */
	struct wc_file files[3];
	size_t nfiles;
	struct stage_request req;
	struct stat index_st; /* req.index_st: the index make_request found */
	int cancel;
};

extern struct fixture *fx; /* for the hooks */

/* The cmocka setup and teardown: the directories (stage_dir not made
 * yet), the knobs cleared; teardown closes the sources, clears the
 * request and removes the directory. */
int setup(void **state);
int teardown(void **state);

/* A file of len pseudo-random bytes (seeded) at f->src/name, opened as the
 * next source file. */
void add_source(struct fixture *f, const char *name, size_t len, unsigned seed);

/* Fills f->req for the model "m", generation 3, at model_path; its
 * index_st is the shard index found at model_path now (as the registry's
 * validation found it), or NULL when there is none. */
void make_request(struct fixture *f, const char *model_path);

/* dir/name has exactly the bytes and mtime of src. */
void assert_same_file(const char *dir, const char *name, const struct wc_file *src);

#endif
