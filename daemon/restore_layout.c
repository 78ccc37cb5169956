/*
 * restore_layout.c: at a warm restart, does the model's configured path
 * still list the files its stored current generation has (restore.h)?
 *
 * restore_check.c checks each stored file against the file of its name in
 * the model's directory. For a model of one file that is enough: its path
 * names that file. A model configured as a shard index or a directory is
 * more: its files are whatever the index (or the directory) lists, and the
 * README's way to update a sharded model writes the new shards under new
 * names and renames the new index over the old one last, leaving every
 * old shard in place and unchanged. So the list is made again here, as a
 * load makes it (source.c: a directory's model is what shards_find_model()
 * finds, a path ending in ".json" is a shard index, read by
 * shards_read_index() without opening a shard), and compared with the
 * stored generation's file names, in the index's order: when they differ,
 * the generation is not restored and the model loads afresh. Reading the
 * index asks the model's filesystem: on the work queue, never the loop.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/file.h"
#include "fdstore.h"
#include "format/index.h"
#include "format/shards.h"
#include "mountrule.h"
#include "restore_internal.h"

/*
 * The first file where the list a load makes now (names, n) and the
 * stored index (blob, h) differ, said in why (len bytes): 1, or 0 when
 * they list the same files in the same order. -EINVAL when the stored
 * index cannot say a file's name (checked already: not expected).
 */
static int
first_difference(char *const *names, size_t n, const uint8_t *blob,
	const struct index_header *h, char *why, size_t len)
{
	const char *stored;
	uint64_t size;

	if (n != h->file_count) {
		snprintf(why, len, "%zu file%s; %" PRIu64 " %s stored", n, n == 1 ? "" : "s",
			h->file_count, h->file_count == 1 ? "was" : "were");
		return 1;
	}
	for (size_t k = 0; k < n; k++) {
		if (index_file_at(blob, h, k, &stored, &size) < 0)
			return error_set(-EINVAL, "its stored index does not name file %zu", k);
		if (strcmp(names[k], stored) != 0) {
			snprintf(why, len, "file %zu of %zu is %s; %s was stored", k + 1, n,
				names[k], stored);
			return 1;
		}
	}
	return 0;
}

/* The names of the files the shard index at index lists, as a load reads
 * them, compared with the stored index; says where the list came from
 * (what) when they differ. 0, or -ESTALE (or another -errno) with why. */
static int
check_index(const char *index, const char *what, const uint8_t *blob,
	const struct index_header *h)
{
	struct shard_map m = { 0 };
	char diff[600];
	int r;

	if (shards_read_index(index, &m) < 0) {
		char prefix[1100];

		snprintf(prefix, sizeof(prefix), "%s cannot be read again", what);
		error_prefix(prefix);
		return -ESTALE;
	}
	r = first_difference(m.shards, m.nshards, blob, h, diff, sizeof(diff));
	shard_map_free(&m);
	if (r < 0)
		return r;
	if (r > 0)
		return error_set(-ESTALE, "%s now lists other files (%s)", what, diff);
	return 0;
}

/* The model in the directory dir, found as a load finds it, compared with
 * the stored index (blob, h). */
static int
check_dir(const char *dir, const uint8_t *blob, const struct index_header *h)
{
	char *found = NULL, what[1024], diff[600];
	const char *name;
	bool is_index = false;
	int r;

	if (shards_find_model(dir, &found, &is_index) < 0) {
		error_prefix("its directory changed since it was stored");
		return -ESTALE;
	}
	name = file_basename(found);
	if (is_index) {
		snprintf(what, sizeof(what), "its directory %s holds the shard index %s, which",
			dir, name);
		r = check_index(found, what, blob, h);
		free(found);
		return r;
	}
	r = first_difference((char *const *)&name, 1, blob, h, diff, sizeof(diff));
	if (r > 0)
		r = error_set(-ESTALE, "its directory %s now holds the one model file %s (%s)", dir,
			name, diff);
	free(found);
	return r;
}

int
restore_check_layout(struct restore_prepared *p, const char *path)
{
	const struct fdstore_generation *g = p->g;
	struct index_header h;
	struct stat st;
	void *map = NULL;
	char what[1024], why[MOUNTRULE_WHY];
	bool is_dir;
	int r;

	/* Before the files are listed: a shard index renamed over after this
	 * (or a directory changed) is a change its watch sees, even before
	 * it is armed (watch.c compares the path with this stat). */
	if (mountrule_stat(NULL, path, &st, why, sizeof(why)) == -1)
		return errno == EXDEV ? error_set(-ESTALE, "%s", why) :
			error_set(-ESTALE, "%s: %s", path, strerror(errno));
	p->path_st = st;
	p->path_known = true;
	/* A path of one file names it: restore_check.c compared it. */
	is_dir = S_ISDIR(st.st_mode);
	if (!is_dir && !file_has_suffix(path, ".json"))
		return 0;
	if ((r = restore_check_index(p->index_fd, g->index_fdname, g->index_size, g->nfiles, &h,
		     &map)) < 0)
		return r;
	if (is_dir) {
		r = check_dir(path, map, &h);
	} else {
		snprintf(what, sizeof(what), "its shard index %s", path);
		r = check_index(path, what, map, &h);
	}
	munmap(map, (size_t)g->index_size);
	return r;
}
