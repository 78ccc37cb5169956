/*
 * fuzz_shards_open.c: libFuzzer harness for opening a sharded model from
 * disk (client/format/shards.c: shards_find_model(), shards_open() with
 * load_index() and cross_check(), through source_open() as wcached and
 * libwcache call it), beyond the index parser alone that fuzz_shards
 * covers: the shards the index names, read with the safetensors reader into
 * one index, and the two-way check between them and the weight_map.
 *
 * Input layout: one flags byte, then up to four sections separated by
 * SEPARATOR (a fourth separator and what follows stay in the last shard):
 * the shard index JSON, written as model.safetensors.index.json, then one to
 * three shards, written as a.safetensors, b.safetensors and c.safetensors,
 * into a temporary directory made once per process (the files are written
 * without fsync and removed after each input). A separator, unlike lengths
 * in front of each section, survives libFuzzer's insertions and erasures.
 * Flags: bit 0 opens the directory with source_open() (shards_find_model()
 * first) instead of shards_open() on the index; bit 1 writes no index (the
 * directory then holds shards alone); bit 2 rewrites each shard's 8-byte
 * header length so that its header runs to the shard's last '}' (and the
 * spaces of its padding), as fuzz_safetensors does (random bytes almost
 * never hold a consistent one).
 *
 * Checks, beyond "no crash, no undefined behaviour, no leak": a refused
 * model leaves *out untouched and a message that names a path in the
 * directory, with one of the codes the openers document. (Not one line: a
 * shard name from the index, which may hold a newline, appears in it as it
 * is, and wcachectl and wcached's log escape messages when they print them;
 * tests/integration/test_ctl_escape.py.) An accepted sharded model: its
 * index section parses with shards_parse_index(); the opened files are the
 * weight_map's shards, in its order, with the sizes written; the index
 * agrees with the weight_map both ways (every tensor of the index is in the
 * weight_map, in the shard whose file holds it, and every tensor of the
 * weight_map is in the index, in that shard's file); every tensor's bytes
 * lie inside its file. An accepted directory without an index held one
 * shard, opened as one safetensors file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "format/index.h"
#include "format/shards.h"
#include "format/source.h"
#include "fuzz_check.h"
#include "fuzz_message.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SEPARATOR "\n--shard--\n"
#define INDEX_NAME "model.safetensors.index.json"
#define NSECTIONS 4 /* the index and three shards */

#define FLAG_OPEN_DIR 1
#define FLAG_NO_INDEX 2
#define FLAG_FIX_LENGTH 4

/* The files a section goes to: the index, then the shards. */
static const char *const file_names[NSECTIONS] = {
	INDEX_NAME, "a.safetensors", "b.safetensors", "c.safetensors",
};

static char dir[64];

/* Removes the directory when the fuzzer exits (its files are removed after
 * each input). */
static void
remove_dir(void)
{
	rmdir(dir);
}

/* Makes the directory the models are written into, once per process. */
int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	snprintf(dir, sizeof(dir), "/tmp/fuzz_shards_open.XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dir);
	return 0;
}

/* The path of name in the directory. */
static void
path_of(const char *name, char *out, size_t cap)
{
	CHECK((size_t)snprintf(out, cap, "%s/%s", dir, name) < cap);
}

/* Writes len bytes to the file name of the directory. */
static void
write_file(const char *name, const uint8_t *p, size_t len)
{
	char path[128];
	int fd;

	path_of(name, path, sizeof(path));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	CHECK(len == 0 || write(fd, p, len) == (ssize_t)len);
	CHECK(close(fd) == 0);
}

/* A section of the input: the bytes of one file. */
struct section {
	const uint8_t *p;
	size_t len;
};

/* Cuts data at the first NSECTIONS - 1 separators; returns the number of
 * sections (1 to NSECTIONS). */
static size_t
split(const uint8_t *data, size_t size, struct section *s)
{
	size_t n = 0, at = 0, seplen = strlen(SEPARATOR);

	while (n + 1 < NSECTIONS) {
		const uint8_t *hit = memmem(data + at, size - at, SEPARATOR, seplen);

		if (hit == NULL)
			break;
		s[n++] = (struct section){ data + at, (size_t)(hit - (data + at)) };
		at = (size_t)(hit - data) + seplen;
	}
	s[n++] = (struct section){ data + at, size - at };
	return n;
}

/* Sets the 8-byte header length of a shard (len >= 8 bytes) so that its
 * header ends at the last '}' and the spaces after it (writers pad headers
 * with spaces to a multiple of 8 bytes). */
static void
fix_length(uint8_t *p, size_t len)
{
	size_t end = len;
	uint64_t n;

	while (end > 8 && p[end - 1] != '}')
		end--;
	while (end > 8 && end < len && p[end] == ' ')
		end++;
	n = end - 8;
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(n >> (8 * i));
}

/* qsort() and bsearch() order of tensor numbers of a shard_map, by name. */
static const struct shard_map *sorted_map;

static int
by_tensor_name(const void *a, const void *b)
{
	return strcmp(sorted_map->tensors[*(const size_t *)a],
		sorted_map->tensors[*(const size_t *)b]);
}

/* bsearch() of a name among the sorted tensor numbers. */
static int
name_vs_tensor(const void *key, const void *elem)
{
	return strcmp(key, sorted_map->tensors[*(const size_t *)elem]);
}

/* The size the file name was written with (it was written). */
static size_t
written_size(const char *name, const struct section *s, size_t nshards)
{
	size_t i = 0;

	CHECK(nshards < NSECTIONS);
	while (i < nshards && strcmp(name, file_names[1 + i]) != 0)
		i++;
	CHECK(i < nshards);
	return s[1 + i].len;
}

/* Checks an accepted sharded model against its weight_map. */
static void
check_sharded(const struct model_source *src, const struct section *s, size_t nshards)
{
	struct shard_map m = { 0 };
	struct index_header h;
	struct index_tensor x;
	size_t *order;

	CHECK(shards_parse_index(INDEX_NAME, (const char *)s[0].p, s[0].len, &m) == 0);
	CHECK(m.ntensors >= 1); /* shards_parse_index() refuses an empty weight_map */
	CHECK(src->nfiles == m.nshards && m.nshards <= nshards);
	CHECK(index_open(src->index, src->index_len, &h) == 0);
	CHECK(h.file_count == m.nshards && h.tensor_count == m.ntensors);
	for (size_t i = 0; i < m.nshards; i++) {
		const char *name;
		uint64_t size;

		CHECK(index_file_at(src->index, &h, i, &name, &size) == 0);
		CHECK(strcmp(name, m.shards[i]) == 0);
		CHECK(size == written_size(name, s, nshards) && size == src->files[i].size);
	}
	/* Every tensor of the weight_map is in the index, in its shard's file. */
	for (size_t i = 0; i < m.ntensors; i++) {
		CHECK(index_find(src->index, &h, m.tensors[i], &x) == 0);
		CHECK(x.file == m.tensor_shard[i]);
	}
	/* Every tensor of the index is in the weight_map, in the shard of its
	 * file, and its bytes lie inside that file. */
	order = malloc(m.ntensors * sizeof(*order));
	CHECK(order != NULL);
	for (size_t i = 0; i < m.ntensors; i++)
		order[i] = i;
	sorted_map = &m;
	qsort(order, m.ntensors, sizeof(*order), by_tensor_name);
	for (uint64_t k = 0; k < h.tensor_count; k++) {
		const size_t *e;
		uint64_t size;

		CHECK(index_tensor_at(src->index, &h, k, &x) == 0);
		e = bsearch(x.name, order, m.ntensors, sizeof(*order), name_vs_tensor);
		CHECK(e != NULL && m.tensor_shard[*e] == x.file);
		CHECK(x.file < src->nfiles);
		size = src->files[x.file].size;
		CHECK(x.offset <= size && x.nbytes <= size - x.offset);
	}
	sorted_map = NULL;
	free(order);
	shard_map_free(&m);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct section s[NSECTIONS];
	struct model_source src, untouched;
	char index_path[128];
	size_t n, nshards;
	unsigned flags;
	int rc;

	if (size == 0)
		return 0;
	flags = data[0];
	n = split(data + 1, size - 1, s);
	nshards = n - 1;
	if (!(flags & FLAG_NO_INDEX))
		write_file(INDEX_NAME, s[0].p, s[0].len);
	for (size_t i = 0; i < nshards; i++) {
		uint8_t *copy;

		if (!(flags & FLAG_FIX_LENGTH) || s[1 + i].len < 8) {
			write_file(file_names[1 + i], s[1 + i].p, s[1 + i].len);
			continue;
		}
		copy = malloc(s[1 + i].len);
		CHECK(copy != NULL);
		memcpy(copy, s[1 + i].p, s[1 + i].len);
		fix_length(copy, s[1 + i].len);
		write_file(file_names[1 + i], copy, s[1 + i].len);
		free(copy);
	}

	memset(&src, 0xa5, sizeof(src));
	untouched = src;
	error_set(0, "%s", "");
	path_of(INDEX_NAME, index_path, sizeof(index_path));
	rc = flags & FLAG_OPEN_DIR ? source_open(dir, &src) : shards_open(index_path, &src);
	if (rc < 0) {
		const char *msg = error_get();

		CHECK(rc == -EINVAL || rc == -ENOENT || rc == -E2BIG || rc == -EFBIG ||
			rc == -ENOMEM);
		CHECK(src.format == untouched.format && src.files == untouched.files &&
			src.nfiles == untouched.nfiles && src.index == untouched.index &&
			src.index_len == untouched.index_len);
		CHECK(strncmp(msg, dir, strlen(dir)) == 0 && msg[strlen(dir)] != '\0');
		CHECK(fuzz_message_harmless(msg));
	} else if (flags & FLAG_NO_INDEX) {
		/* Only source_open() of the directory gets here: one shard. */
		CHECK(flags & FLAG_OPEN_DIR);
		CHECK(src.format == FORMAT_SAFETENSORS && src.nfiles == 1);
		source_close(&src);
	} else {
		CHECK(src.format == FORMAT_SHARDED);
		check_sharded(&src, s, nshards);
		source_close(&src);
	}

	for (size_t i = 0; i < NSECTIONS; i++) {
		char path[128];

		path_of(file_names[i], path, sizeof(path));
		CHECK(unlink(path) == 0 || errno == ENOENT);
	}
	return 0;
}
