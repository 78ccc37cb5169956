/*
 * shards.h: sharded safetensors checkpoints (shards.c): the shard index
 * document, the opener of a sharded model, and finding the model in a
 * directory.
 *
 * shards.c is the multi-file opener of source.c's table of formats. It
 * opens each shard through open.c with the safetensors reader; it calls
 * nothing above it (source.c opens what shards_find_model() finds).
 */
#ifndef WC_SHARDS_H
#define WC_SHARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/open.h"

/* One entry of a shard index's weight_map. Strings point into storage the
 * shard_map owns. */
struct shard_map {
	char **shards;       /* distinct shard file names, in first-seen order */
	size_t nshards;
	char **tensors;      /* tensor names */
	uint32_t *tensor_shard; /* index into shards for each tensor */
	size_t ntensors;
	uint64_t total_size; /* metadata.total_size, 0 if absent (advisory) */
	int has_total_size;
};

/* Parses and validates a shard index document (JSON text of len bytes);
 * name is for messages. */
int shards_parse_index(const char *name, const char *json, size_t len, struct shard_map *out);
void shard_map_free(struct shard_map *m);

/* The comparisons of two names that this thread's shard index checks have
 * made (finding each entry's shard, the weight_map's duplicate check,
 * shards_open()'s cross check): what the unit tests count to bound their
 * cost without a clock. */
extern _Thread_local unsigned long shards_name_compares;

/*
 * Reads and parses the shard index file index_path as shards_open() does
 * (inside the model's tree, at most 64 MiB), without opening a shard:
 * out->shards are the files a load of it opens, in its order (file k of
 * the model is shards[k]). 0, or -errno with the message; *out is set on
 * success only (shard_map_free() it).
 */
int shards_read_index(const char *index_path, struct shard_map *out);

/* Opens a shard index file and every shard it names, cross-checks them. */
int shards_open(const char *index_path, struct model_source *out);

/*
 * Finds the model in the directory dir: exactly one *.safetensors.index.json
 * (*is_index set), else exactly one *.safetensors file. *path gets the
 * malloc'd path of that file, which the caller opens; on failure nothing is
 * set and the message says what dir holds (nothing, or too many). Under
 * shards_name_rule only the names it takes count.
 */
int shards_find_model(const char *dir, char **path, bool *is_index);
/* The same in the directory open as dfd (an O_PATH descriptor will do; not
 * closed), named dir (for messages and *path): listed from the descriptor,
 * its path never looked up (wcached's staging lists the directory its
 * judged walk reached). */
int shards_find_model_at(int dfd, const char *dir, char **path, bool *is_index);

/*
 * wcached's say on a model file's name that shards_find_model finds in a
 * directory (NULL, libwcache's: every name counts): judge(run, dfd, name,
 * why, len) with dfd the directory, 0 when the name counts, or -errno with
 * why (one line) when it is no file of the model (a mount on it, another
 * owner's: review rev202 H1). A name not taken is named in the message
 * when no model is found. *run is the listing's, NULL at its start, for
 * what judge keeps from one name to the next (wcached's: the mount table,
 * read once per listing, review rev208 M3); end(run) is called once the
 * listing is done when judge left *run set.
 */
struct shards_name_rule {
	int (*judge)(void **run, int dfd, const char *name, char *why, size_t len);
	void (*end)(void *run);
};
extern const struct shards_name_rule *shards_name_rule;

#endif
