/*
 * test_model.c: the wc_model API over wc_open_file, wc_open_fd and
 * model_view_source: lookups, metadata, file names, errors, lifetime across fork(), and
 * wc_model_cow() writes that stay private to this process.
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"
#include "base/file.h"
#include "format/source.h"
#include "lib/model.h"
#include "lib/wcache.h"

/* Two F32 tensors (a: 2x2, b: 4) and one scalar U8 named with a byte > 0x7f. */
static int
setup(void **state)
{
	struct tu_dir *f;
	const char *header = "{\"__metadata__\":{\"format\":\"pt\",\"author\":\"x\"},"
			     "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]},"
			     "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
			     "\"\xc3\xa9t\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[],"
			     "\"data_offsets\":[32,33]}}";
	size_t len;
	uint8_t *img;

	if (tu_dir_setup(state) != 0)
		return -1;
	f = *state;
	img = tu_safetensors(header, 33, &len);
	f->path = tu_write(f->dir, "m.safetensors", img, len);
	free(img);
	return 0;
}

static void
test_lookups(void **state)
{
	struct tu_dir *f = *state;
	wc_model *m;
	wc_tensor t;
	const char *k, *v;

	assert_int_equal(wc_open_file(f->path, &m), 0);
	assert_int_equal(wc_model_count(m), 3);
	assert_int_equal(wc_model_generation(m), 0);
	assert_int_equal(wc_model_stale(m), 0);
	assert_int_equal(wc_model_tensor(m, 0, &t), 0);
	assert_string_equal(t.name, "a"); /* byte order of names */
	assert_string_equal(t.dtype, "F32");
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 2);
	assert_int_equal(t.nbytes, 16);
	assert_int_equal(((const uint8_t *)t.data)[5], 5); /* data byte i is i & 0xff */
	assert_int_equal(wc_model_tensor(m, 2, &t), 0);
	assert_string_equal(t.name, "\xc3\xa9t\xc3\xa9");
	assert_int_equal(t.ndim, 0);
	assert_int_equal(*(const uint8_t *)t.data, 32);
	assert_int_equal(wc_model_tensor(m, 3, &t), -ERANGE);
	assert_int_equal(wc_model_find(m, "b", &t), 0);
	assert_int_equal(((const uint8_t *)t.data)[0], 16);
	assert_int_equal(wc_model_find(m, "c", &t), -ENOENT);
	assert_non_null(strstr(wc_errmsg(), "\"c\""));
	assert_string_equal(wc_model_metadata(m, "format"), "pt");
	assert_null(wc_model_metadata(m, "nope"));
	assert_int_equal(wc_model_metadata_at(m, 0, &k, &v), 0);
	assert_string_equal(k, "author");
	assert_int_equal(wc_model_metadata_at(m, 2, &k, &v), -ERANGE);
	/* One file, named by its base name; none past it; no descriptor. */
	assert_int_equal(wc_model_file_count(m), 1);
	assert_string_equal(wc_model_file_name(m, 0), "m.safetensors");
	assert_null(wc_model_file_name(m, 1));
	assert_int_equal(wc_model_fd(m, 0), -ENOENT);
	wc_release(m);
	wc_release(NULL);
}

/* A sharded model's files are named as its weight map names the shards. */
static void
test_file_names_of_shards(void **state)
{
	struct tu_dir *f = *state;
	const char *h1 = "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
	const char *h2 = "{\"y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	const char *map = "{\"metadata\":{},\"weight_map\":{"
			  "\"x\":\"part-1.safetensors\",\"y\":\"part-2.safetensors\"}}";
	char *sub, *p1, *p2, *pj;
	const char *n0, *n1;
	size_t len;
	uint8_t *img;
	wc_model *m;

	assert_true(asprintf(&sub, "%s/sharded", f->dir) > 0);
	assert_int_equal(mkdir(sub, 0700), 0);
	img = tu_safetensors(h1, 2, &len);
	p1 = tu_write(sub, "part-1.safetensors", img, len);
	free(img);
	img = tu_safetensors(h2, 3, &len);
	p2 = tu_write(sub, "part-2.safetensors", img, len);
	free(img);
	pj = tu_write(sub, "model.safetensors.index.json", map, strlen(map));
	assert_int_equal(wc_open_file(sub, &m), 0);
	assert_int_equal(wc_model_file_count(m), 2);
	n0 = wc_model_file_name(m, 0);
	n1 = wc_model_file_name(m, 1);
	assert_non_null(n0);
	assert_non_null(n1);
	assert_true((strcmp(n0, "part-1.safetensors") == 0 &&
			    strcmp(n1, "part-2.safetensors") == 0) ||
		(strcmp(n0, "part-2.safetensors") == 0 && strcmp(n1, "part-1.safetensors") == 0));
	assert_null(wc_model_file_name(m, 2));
	wc_release(m);
	free(p1);
	free(p2);
	free(pj);
	free(sub);
}

/* model_view_source() reads the files as the source opened them, though
 * another file was renamed over the path since (wc_open_file() would read
 * that one), and its release leaves the source open and mapped. */
static void
test_view_reads_the_source_as_opened(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	wc_model *m;
	wc_tensor t;
	const char *header = "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	size_t len;
	uint8_t *img = tu_safetensors(header, 3, &len);
	char *other = tu_write(f->dir, "other.safetensors", img, len);

	free(img);
	assert_int_equal(source_open(f->path, &src), 0);
	assert_int_equal(rename(other, f->path), 0);
	assert_int_equal(model_view_source("view", &src, &m), 0);
	assert_int_equal(wc_model_count(m), 3);
	assert_int_equal(wc_model_find(m, "b", &t), 0);
	assert_int_equal(((const uint8_t *)t.data)[15], 31);
	wc_release(m);
	assert_int_equal(src.files[0].base[src.files[0].size - 1], 32); /* still mapped */
	assert_int_equal(file_check_unchanged(&src.files[0]), 0);
	source_close(&src);
	assert_int_equal(wc_open_file(f->path, &m), 0); /* the path's file now */
	assert_int_equal(wc_model_count(m), 1);
	wc_release(m);
	free(other);
}

static void
test_errors_name_the_file(void **state)
{
	struct tu_dir *f = *state;
	wc_model *m = (wc_model *)0x1;
	char *missing;

	assert_int_equal(asprintf(&missing, "%s/none.safetensors", f->dir) > 0, 1);
	assert_int_equal(wc_open_file(missing, &m), -ENOENT);
	assert_ptr_equal(m, (wc_model *)0x1); /* untouched on failure */
	assert_non_null(strstr(wc_errmsg(), missing));
	free(missing);
	assert_int_equal(wc_open_file(NULL, &m), -EINVAL);
}

/* wc_open_fd reads the model fd refers to and leaves fd the caller's,
 * whether it succeeds or not; errors name the label. */
static void
test_open_fd_keeps_the_descriptor(void **state)
{
	struct tu_dir *f = *state;
	wc_model *m = (wc_model *)0x1;
	wc_tensor t;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	int bad = open(f->dir, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
	char byte;

	assert_true(fd >= 0 && bad >= 0);
	assert_int_equal(wc_open_fd(bad, "a directory", &m), -EISDIR);
	assert_ptr_equal(m, (wc_model *)0x1);
	assert_non_null(strstr(wc_errmsg(), "a directory: "));
	assert_int_equal(fcntl(bad, F_GETFD), FD_CLOEXEC);
	assert_int_equal(wc_open_fd(-1, "x", &m), -EINVAL);
	assert_int_equal(wc_open_fd(fd, NULL, &m), -EINVAL);
	assert_int_equal(wc_open_fd(fd, "my bytes", &m), 0);
	assert_int_equal(pread(fd, &byte, 1, 0), 1); /* still open */
	assert_int_equal(close(fd), 0);
	assert_int_equal(close(bad), 0);
	assert_int_equal(wc_model_count(m), 3);
	assert_int_equal(wc_model_find(m, "b", &t), 0); /* mapped: fd is not needed */
	assert_int_equal(((const uint8_t *)t.data)[15], 31);
	assert_int_equal(wc_model_find(m, "c", &t), -ENOENT);
	assert_non_null(strstr(wc_errmsg(), "my bytes"));
	wc_release(m);
}

static void
test_valid_in_child_after_fork(void **state)
{
	struct tu_dir *f = *state;
	wc_model *m;
	wc_tensor t;
	int status;
	pid_t pid;

	assert_int_equal(wc_open_file(f->path, &m), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int ok = wc_model_find(m, "b", &t) == 0 && ((const uint8_t *)t.data)[15] == 31;
		wc_release(m);
		_exit(ok ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(wc_model_find(m, "b", &t), 0); /* the parent's is intact */
	wc_release(m);
}

static void
test_cow_writes_stay_private(void **state)
{
	struct tu_dir *f = *state;
	wc_model *m, *other;
	wc_tensor t, u;
	uint8_t byte;
	int fd;

	assert_int_equal(wc_open_file(f->path, &m), 0);
	assert_int_equal(wc_open_file(f->path, &other), 0);
	assert_int_equal(wc_model_cow(m), 0);
	assert_int_equal(wc_model_find(m, "a", &t), 0);
	((uint8_t *)t.data)[0] = 0xee; /* would be SIGSEGV without cow */
	assert_int_equal(((const uint8_t *)t.data)[0], 0xee);
	/* Another mapping and the file itself still hold the original byte. */
	assert_int_equal(wc_model_find(other, "a", &u), 0);
	assert_int_equal(((const uint8_t *)u.data)[0], 0);
	fd = open(f->path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	{
		uint8_t len8[8];
		uint64_t hlen = 0;

		assert_int_equal(pread(fd, len8, 8, 0), 8);
		for (int i = 0; i < 8; i++)
			hlen |= (uint64_t)len8[i] << (8 * i);
		assert_int_equal(pread(fd, &byte, 1, (off_t)(8 + hlen)), 1);
		assert_int_equal(byte, 0);
	}
	close(fd);
	wc_release(m);
	wc_release(other);
	assert_int_equal(wc_model_cow(NULL), -EINVAL);
}

/* wc_model_tensors() fills what wc_model_tensor() gives, clipped to the end. */
static void
test_bulk_matches_one_by_one(void **state)
{
	struct tu_dir *f = *state;
	wc_model *m;
	wc_tensor one, all[4];

	assert_int_equal(wc_open_file(f->path, &m), 0);
	assert_int_equal(wc_model_tensors(m, 0, all, 4), 3);
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(wc_model_tensor(m, i, &one), 0);
		assert_ptr_equal(all[i].name, one.name);
		assert_ptr_equal(all[i].dtype, one.dtype);
		assert_int_equal(all[i].ndim, one.ndim);
		assert_ptr_equal(all[i].shape, one.shape);
		assert_ptr_equal(all[i].data, one.data);
		assert_int_equal(all[i].nbytes, one.nbytes);
	}
	assert_int_equal(wc_model_tensors(m, 1, all, 1), 1);
	assert_string_equal(all[0].name, "b");
	assert_int_equal(wc_model_tensors(m, 3, all, 4), 0);
	assert_int_equal(wc_model_tensors(m, 99, NULL, 0), 0);
	assert_int_equal(wc_model_tensors(NULL, 0, all, 4), -EINVAL);
	wc_release(m);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_lookups, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_file_names_of_shards, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_bulk_matches_one_by_one, setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_view_reads_the_source_as_opened, setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_errors_name_the_file, setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_open_fd_keeps_the_descriptor, setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_valid_in_child_after_fork, setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_cow_writes_stay_private, setup,
			tu_dir_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
