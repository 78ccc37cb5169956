/*
 * stage_fixture.c: the fixture of the tests of the stage module (see
 * stage_fixture.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "base/file.h"
#include "base/path.h"
#include "format/shards.h"
#include "stage.h"
#include "stage_fixture.h"
#include "testutil.h"

int (*copy_hook)(unsigned call); /* returns an errno to fail with, or 0 */
unsigned copy_calls, sendfile_calls;
int sendfile_errno;              /* nonzero: sendfile fails with it */
uint64_t statvfs_free;           /* nonzero: the free bytes statvfs reports */
const char *stat_fail_path;      /* a look at this path fails with stat_errno */
int stat_errno;
int stat_failures;               /* ... this many times (-1: every time) */
int (*unlink_hook)(const char *name);

struct fixture *fx;

int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	f->tmp = tu_tmpdir();
	f->src = path_join(f->tmp, "src");
	f->stage_dir = path_join(f->tmp, "staged");
	assert_int_equal(mkdir(f->src, 0700), 0);
	copy_hook = NULL;
	copy_calls = sendfile_calls = 0;
	sendfile_errno = 0;
	statvfs_free = 0;
	stat_fail_path = NULL;
	stat_errno = stat_failures = 0;
	unlink_hook = NULL;
	fx = f;
	*state = f;
	return 0;
}

int
teardown(void **state)
{
	struct fixture *f = *state;

	unlink_hook = NULL; /* tu_rmtree removes what is left */
	for (size_t i = 0; i < f->nfiles; i++)
		file_close(&f->files[i]);
	stage_request_clear(&f->req);
	free(f->src);
	free(f->stage_dir);
	tu_rmtree(f->tmp);
	free(f);
	return 0;
}

/* A file of len pseudo-random bytes (seeded) at f->src/name, opened as the
 * next source file. */
void
add_source(struct fixture *f, const char *name, size_t len, unsigned seed)
{
	uint8_t *buf = malloc(len ? len : 1);
	char *path;

	assert_non_null(buf);
	for (size_t i = 0; i < len; i++) {
		seed = seed * 1103515245u + 12345u;
		buf[i] = (uint8_t)(seed >> 16);
	}
	path = tu_write(f->src, name, buf, len);
	free(buf);
	assert_int_equal(file_open(path, &f->files[f->nfiles]), 0);
	f->nfiles++;
	free(path);
}

/* Fills f->req for the model "m", generation 3, at model_path. */
void
make_request(struct fixture *f, const char *model_path)
{
	struct stat st;
	char *index = NULL;
	bool is_index = false;

	f->req = (struct stage_request){
		.stage_dir = f->stage_dir, .model = "m", .number = 3, .model_path = model_path,
		.files = f->files, .nfiles = f->nfiles, .cancel = &f->cancel,
	};
	if (stat(model_path, &st) == 0 && S_ISDIR(st.st_mode)) {
		if (shards_find_model(model_path, &index, &is_index) == 0 && is_index &&
			stat(index, &f->index_st) == 0)
			f->req.index_st = &f->index_st;
		free(index);
	} else if (file_has_suffix(model_path, ".json") && stat(model_path, &f->index_st) == 0) {
		f->req.index_st = &f->index_st;
	}
}

/* dir/name has exactly the bytes and mtime of src. */
void
assert_same_file(const char *dir, const char *name, const struct wc_file *src)
{
	char *path = path_join(dir, name);
	struct wc_file c;

	assert_int_equal(file_open(path, &c), 0);
	assert_int_equal(c.size, src->size);
	if (c.size > 0)
		assert_memory_equal(c.base, src->base, c.size);
	assert_int_equal(c.st.st_mtim.tv_sec, src->st.st_mtim.tv_sec);
	assert_int_equal(c.st.st_mtim.tv_nsec, src->st.st_mtim.tv_nsec);
	assert_int_equal(c.st.st_mode & 07777, 0400);
	file_close(&c);
	free(path);
}
