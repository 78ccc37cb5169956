/*
 * shards.c: sharded safetensors checkpoints (a model.safetensors.index.json
 * and the shard files it names), and finding the model in a directory.
 *
 * The shard index says which shard holds each tensor:
 *   {"metadata": {"total_size": N, ...}, "weight_map": {"tensor": "shard", ...}}
 * Shards are plain file names in the index's directory, opened inside the
 * model's tree (tree.h: a symlinked shard must not lead out of it), and
 * parsed from private copies of their headers (file_read_bytes()). We parse every
 * shard into one index builder (shard k is file k, in first-seen order of
 * the weight_map) and then check both directions: every tensor of the
 * weight_map is in the shard it names, and every tensor of a shard is in
 * the weight_map. total_size is advisory (tools disagree on whether it
 * counts headers), so a mismatch is not an error.
 *
 * Metadata: a sharded model's metadata is the __metadata__ of its first
 * shard (file 0; st_parse adds metadata for file 0 only). Every shard's
 * __metadata__ is still validated. The index's own "metadata" object holds
 * only bookkeeping (total_size) and is not exposed.
 *
 * Layering: the multi-file opener of source.c's table of formats. It reads
 * each shard with open_read_file() (open.c) and the safetensors reader,
 * and calls nothing above it: shards_find_model() only finds the file a
 * directory holds, and source.c opens it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/json.h"
#include "base/path.h"

#include "format/open.h"
#include "format/safetensors.h"
#include "format/shards.h"
#include "format/tree.h"

#define SHARDS_MAX_INDEX (64u << 20) /* bytes of shard index JSON we read */
#define SHARD_MAX_NAME 255           /* NAME_MAX */
#define SHARD_SUFFIX ".safetensors"
#define INDEX_SUFFIX ".safetensors.index.json"

/* ---- tensor names in strcmp order ---- */

/*
 * The weight_map's checks (no name twice, each name in the shard it names)
 * sort the names' numbers and look names up by binary search: O(n log n)
 * comparisons whatever the names are. They are the model file's to choose,
 * and a hash table of them with no key is a table their writer can make
 * into one chain, quadratic (review rev224 M2: an FNV-1a table did, 2^16
 * names chosen to collide took 9.7 s of CPU to parse).
 */

_Thread_local unsigned long shards_name_compares;

/* strcmp() of two names (tensors' or shards'), counted for the tests. */
static int
compare_names(const char *a, const char *b)
{
	shards_name_compares++;
	return strcmp(a, b);
}

/* Orders the numbers of tensors of the names at arg by name, equal names
 * by number (in weight_map order). */
static int
compare_numbers(const void *x, const void *y, void *arg)
{
	const char *const *names = arg;
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
	int c = compare_names(names[a], names[b]);

	return c != 0 ? c : (a > b) - (a < b);
}

/* The numbers 0 to n - 1 of names[] in compare_numbers() order, malloc'd;
 * NULL when out of memory. */
static uint32_t *
sort_names(char *const *names, size_t n)
{
	uint32_t *order = malloc((n ? n : 1) * sizeof(*order));

	if (order == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++)
		order[i] = (uint32_t)i;
	qsort_r(order, n, sizeof(*order), compare_numbers, (void *)(uintptr_t)names);
	return order;
}

/*
 * Binary search for name among n names in strcmp order, the k-th of which
 * is name_at(arg, k): true with *at its position if it is there, false with
 * *at the position it would be inserted at. One comparison per step, as
 * the weight_map's checks and the shard lookup count them.
 */
static bool
search_names(const char *name, size_t n, const char *(*name_at)(const void *arg, size_t k),
	const void *arg, size_t *at)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = compare_names(name, name_at(arg, mid));

		if (c == 0) {
			*at = mid;
			return true;
		}
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	*at = lo;
	return false;
}

/* Tensor names and their numbers in sort_names() order. */
struct sorted_names {
	char *const *names;
	const uint32_t *order;
};

/* The k-th tensor name in sort_names() order (search_names()'s name_at). */
static const char *
sorted_name_at(const void *arg, size_t k)
{
	const struct sorted_names *s = arg;

	return s->names[s->order[k]];
}

/* The number of the tensor named name among the n unique names in
 * sort_names() order, or -1. */
static long
find_name(char *const *names, const uint32_t *order, size_t n, const char *name)
{
	struct sorted_names s = { names, order };
	size_t at;

	return search_names(name, n, sorted_name_at, &s, &at) ? (long)order[at] : -1;
}

/* ---- the shard index document ---- */

/* Says where a JSON error is, by line and column (index files are usually
 * pretty-printed); json_fail() below returns -EINVAL after it. */
__attribute__((format(printf, 5, 6))) static void
json_fail_message(const char *name, const struct jr *j, const char *buf, size_t len,
	const char *fmt, ...)
{
	size_t off = jr_erroff(j), line = 1, col = 1;
	char what[300] = "";
	va_list ap;

	if (fmt != NULL) {
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
	}
	for (size_t i = 0; i < off && i < len; i++) {
		if (buf[i] == '\n') {
			line++;
			col = 1;
		} else {
			col++;
		}
	}
	if (j->code == -EDOM)
		error_format("%s: %s%s%s", name, what, *what ? ": " : "", jr_errmsg(j));
	else
		error_format("%s: %s%sinvalid JSON at line %zu, column %zu: %s", name, what,
			*what ? ": " : "", line, col, jr_errmsg(j));
}

/* Leaves the message and evaluates to -EINVAL (a macro, as error_set()). */
#define json_fail(...) (json_fail_message(__VA_ARGS__), -EINVAL)

/* Checks a shard file name: a plain name in the same directory. */
static const char *
bad_shard_name(const char *s, size_t len, bool has_nul)
{
	if (len == 0)
		return "is empty";
	if (has_nul)
		return "contains a NUL character";
	if (memchr(s, '/', len) != NULL)
		return "contains '/' (shards must be in the directory of the index)";
	if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
		return "is not a file name";
	if (len > SHARD_MAX_NAME)
		return "is longer than 255 bytes";
	if (len < strlen(SHARD_SUFFIX) ||
		memcmp(s + len - strlen(SHARD_SUFFIX), SHARD_SUFFIX, strlen(SHARD_SUFFIX)) != 0)
		return "does not end in .safetensors";
	if (len == strlen(SHARD_SUFFIX))
		return "has no name before .safetensors";
	return NULL;
}

/* The weight_map while it is read: views into the document. */
struct map_entry {
	struct jr_str tensor;
	uint32_t shard;
};

struct map_reader {
	const char *name;
	struct map_entry *entries;
	size_t n, cap;
	struct jr_str shards[INDEX_MAX_FILES];
	char shard_names[INDEX_MAX_FILES][SHARD_MAX_NAME + 1]; /* decoded */
	uint8_t by_name[INDEX_MAX_FILES]; /* shard numbers in strcmp order */
	size_t nshards;
	size_t last_shard;
};

_Static_assert(INDEX_MAX_FILES <= 256, "map_reader.by_name holds shard numbers in a byte");

/* Copies decoded strings into one block: an array of n pointers followed by
 * the NUL-terminated strings; the pointers point into the block. */
static char **
pack_strings(const struct jr_str *const *strs, size_t n)
{
	size_t total = n * sizeof(char *);
	char **out, *at;

	for (size_t i = 0; i < n; i++)
		total += strs[i]->len + 1; /* bounded by the document size */
	if ((out = malloc(total ? total : 1)) == NULL)
		return NULL;
	at = (char *)(out + n);
	for (size_t i = 0; i < n; i++) {
		out[i] = at;
		if (jr_str_decode(strs[i], at, strs[i]->len + 1) < 0) {
			free(out);
			return NULL;
		}
		at += strs[i]->len + 1;
	}
	return out;
}

/* The k-th shard name in strcmp order (search_names()'s name_at). */
static const char *
shard_name_at(const void *arg, size_t k)
{
	const struct map_reader *r = arg;

	return r->shard_names[r->by_name[k]];
}

/*
 * Returns the number of shard name s (decoded: name), adding it if new.
 * The shards are looked up by binary search of their decoded names: the
 * names are the model file's, and a lookup that compared each entry's with
 * every shard's (up to 250 names of 255 bytes alike but for their end)
 * made a 64 MiB index take 8.1 s of CPU.
 */
static int
shard_number(struct map_reader *r, const struct jr_str *s, const char *name, uint32_t *out)
{
	size_t at, i;

	/* Weight maps list tensors shard by shard: try the last one first. */
	if (r->nshards > 0 && r->shards[r->last_shard].len == s->len &&
		r->shards[r->last_shard].raw_len == s->raw_len &&
		memcmp(r->shards[r->last_shard].raw, s->raw, s->raw_len) == 0) {
		*out = (uint32_t)r->last_shard;
		return 0;
	}
	if (search_names(name, r->nshards, shard_name_at, r, &at)) {
		r->last_shard = r->by_name[at];
		*out = (uint32_t)r->last_shard;
		return 0;
	}
	if (r->nshards == INDEX_MAX_FILES)
		return error_set(-E2BIG, "%s: weight_map names more than %d shards", r->name,
			INDEX_MAX_FILES);
	i = r->nshards++;
	r->shards[i] = *s;
	memcpy(r->shard_names[i], name, s->len + 1);
	memmove(&r->by_name[at + 1], &r->by_name[at], (i - at) * sizeof(r->by_name[0]));
	r->by_name[at] = (uint8_t)i;
	r->last_shard = i;
	*out = (uint32_t)i;
	return 0;
}

/* Reads the weight_map object. */
static int
read_weight_map(struct map_reader *r, struct jr *j, const char *buf, size_t len)
{
	struct jr_str key, value;
	char q1[300], q2[300], shard[SHARD_MAX_NAME + 1];
	enum jr_type t;
	int rc;

	if ((t = jr_peek(j)) != JR_OBJECT)
		return t == JR_INVALID ? json_fail(r->name, j, buf, len, "weight_map") :
			error_set(-EINVAL, "%s: weight_map is not an object", r->name);
	if (jr_object_begin(j) < 0)
		return json_fail(r->name, j, buf, len, "weight_map");
	while ((rc = jr_object_next(j, &key)) == 1) {
		struct map_entry *e;
		const char *why;

		if ((t = jr_peek(j)) != JR_STRING) {
			if (t == JR_INVALID)
				return json_fail(r->name, j, buf, len, "weight_map");
			return error_set(-EINVAL,
				"%s: weight_map: tensor %s: shard is not a string",
				r->name, json_quote_str(q1, sizeof(q1), &key));
		}
		if (jr_string(j, &value) < 0)
			return json_fail(r->name, j, buf, len, "weight_map");
		if (key.len == 0 || key.len > INDEX_MAX_NAME || key.has_nul)
			return error_set(-EINVAL, "%s: weight_map: tensor name %s %s", r->name,
				json_quote_str(q1, sizeof(q1), &key),
				key.len == 0 ? "is empty" :
				key.has_nul ? "contains a NUL character" :
				"is longer than 4096 bytes");
		if (value.len > SHARD_MAX_NAME)
			why = "is longer than 255 bytes";
		else if (jr_str_decode(&value, shard, sizeof(shard)) < 0)
			why = "cannot be decoded";
		else
			why = bad_shard_name(shard, value.len, value.has_nul);
		if (why != NULL)
			return error_set(-EINVAL, "%s: weight_map: tensor %s: shard name %s %s",
				r->name, json_quote_str(q1, sizeof(q1), &key),
				json_quote_str(q2, sizeof(q2), &value), why);
		if (r->n == r->cap) {
			size_t ncap = r->cap ? r->cap * 2 : 1024;

			if ((e = realloc(r->entries, ncap * sizeof(*e))) == NULL)
				return error_set(-ENOMEM, "%s: out of memory", r->name);
			r->entries = e;
			r->cap = ncap;
		}
		e = &r->entries[r->n];
		e->tensor = key;
		if ((rc = shard_number(r, &value, shard, &e->shard)) < 0)
			return rc;
		r->n++;
	}
	if (rc < 0)
		return json_fail(r->name, j, buf, len, "weight_map");
	if (r->n == 0)
		return error_set(-EINVAL, "%s: weight_map is empty", r->name);
	return 0;
}

/*
 * Reads the metadata object. Every field may hold anything, total_size too:
 * it is advisory, nothing here uses it, and transformers, which reads only
 * the weight_map, loads a model whose total_size is a float, null or a
 * string; such a field must not make the model unloadable. A total_size
 * that is a non-negative integer is recorded (the first one); any other is
 * skipped.
 */
static int
read_metadata(const char *name, struct jr *j, const char *buf, size_t len,
	struct shard_map *m)
{
	struct jr_str key;
	enum jr_type t;
	int rc;

	if ((t = jr_peek(j)) != JR_OBJECT)
		return t == JR_INVALID ? json_fail(name, j, buf, len, "metadata") :
			error_set(-EINVAL, "%s: metadata is not an object", name);
	if (jr_object_begin(j) < 0)
		return json_fail(name, j, buf, len, "metadata");
	while ((rc = jr_object_next(j, &key)) == 1) {
		if (!jr_str_eq(&key, "total_size", 10)) {
			if (jr_skip(j) < 0)
				return json_fail(name, j, buf, len, "metadata");
			continue;
		}
		if (!m->has_total_size && jr_peek(j) == JR_NUMBER) {
			struct jr before = *j; /* jr_u64 refuses 4.0 or -1 as an error */

			if (jr_u64(j, &m->total_size) == 0) {
				m->has_total_size = 1;
				continue;
			}
			*j = before;
		}
		if (jr_skip(j) < 0)
			return json_fail(name, j, buf, len, "metadata");
	}
	if (rc < 0)
		return json_fail(name, j, buf, len, "metadata");
	return 0;
}

/* Rejects a tensor listed twice in the weight_map, naming the one it
 * repeats first: sorted, equal names are neighbours in weight_map order,
 * and the second of a pair is the repetition. */
static int
check_unique(const char *name, const struct shard_map *m)
{
	uint32_t *order = sort_names(m->tensors, m->ntensors);
	size_t twice = SIZE_MAX;
	char q[300];

	if (order == NULL)
		return error_set(-ENOMEM, "%s: out of memory", name);
	for (size_t i = 1; i < m->ntensors; i++)
		if (order[i] < twice &&
			compare_names(m->tensors[order[i - 1]], m->tensors[order[i]]) == 0)
			twice = order[i];
	free(order);
	if (twice == SIZE_MAX)
		return 0;
	return error_set(-EINVAL, "%s: weight_map: tensor %s is listed twice", name,
		json_quote(q, sizeof(q), m->tensors[twice], strlen(m->tensors[twice])));
}

int
shards_parse_index(const char *name, const char *json, size_t len, struct shard_map *out)
{
	struct map_reader *r;
	struct shard_map m = { 0 };
	bool seen_meta = false, seen_map = false;
	const struct jr_str **strs = NULL;
	struct jr_str key;
	struct jr j;
	enum jr_type t;
	int rc;

	if ((r = calloc(1, sizeof(*r))) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", name);
	r->name = name;
	jr_init(&j, json, len);
	if ((t = jr_peek(&j)) != JR_OBJECT) {
		rc = t == JR_INVALID ? json_fail(name, &j, json, len, NULL) :
			error_set(-EINVAL, "%s: not a shard index: expected a JSON object", name);
		goto out;
	}
	if (jr_object_begin(&j) < 0) {
		rc = json_fail(name, &j, json, len, NULL);
		goto out;
	}
	while ((rc = jr_object_next(&j, &key)) == 1) {
		if (jr_str_eq(&key, "weight_map", 10)) {
			if (seen_map) {
				rc = error_set(-EINVAL, "%s: duplicate weight_map", name);
				goto out;
			}
			seen_map = true;
			rc = read_weight_map(r, &j, json, len);
		} else if (jr_str_eq(&key, "metadata", 8)) {
			if (seen_meta) {
				rc = error_set(-EINVAL, "%s: duplicate metadata", name);
				goto out;
			}
			seen_meta = true;
			rc = read_metadata(name, &j, json, len, &m);
		} else if ((rc = jr_skip(&j)) < 0) { /* other fields: tolerated */
			rc = json_fail(name, &j, json, len, NULL);
		}
		if (rc < 0)
			goto out;
	}
	if (rc < 0 || jr_finish(&j) < 0) {
		rc = json_fail(name, &j, json, len, NULL);
		goto out;
	}
	if (!seen_map) {
		rc = error_set(-EINVAL, "%s: not a shard index: no weight_map", name);
		goto out;
	}

	/* Copy the names out of the document. */
	m.ntensors = r->n;
	m.nshards = r->nshards;
	/* An array of pointers: each element is sizeof(*strs), one pointer.
	 * NOLINTNEXTLINE(bugprone-sizeof-expression) */
	if ((strs = malloc(r->n * sizeof(*strs))) == NULL)
		goto nomem;
	for (size_t i = 0; i < r->n; i++)
		strs[i] = &r->entries[i].tensor;
	if ((m.tensors = pack_strings(strs, r->n)) == NULL)
		goto nomem;
	for (size_t i = 0; i < r->nshards; i++)
		strs[i] = &r->shards[i];
	if ((m.shards = pack_strings(strs, r->nshards)) == NULL)
		goto nomem;
	if ((m.tensor_shard = malloc(r->n * sizeof(*m.tensor_shard))) == NULL)
		goto nomem;
	for (size_t i = 0; i < r->n; i++)
		m.tensor_shard[i] = r->entries[i].shard;
	if ((rc = check_unique(name, &m)) < 0)
		goto out;
	*out = m;
	memset(&m, 0, sizeof(m));
	rc = 0;
	goto out;
nomem:
	rc = error_set(-ENOMEM, "%s: out of memory", name);
out:
	shard_map_free(&m);
	free(strs);
	free(r->entries);
	free(r);
	return rc;
}

void
shard_map_free(struct shard_map *m)
{
	if (m == NULL)
		return;
	free(m->shards);
	free(m->tensors);
	free(m->tensor_shard);
	memset(m, 0, sizeof(*m));
}

/* ---- opening a sharded model ---- */

/* Reads (a private copy, at most SHARDS_MAX_INDEX bytes) and parses the
 * shard index file, opened inside the model's tree; *st gets its fstat as
 * opened (model_source's index_st), *acl (where not NULL) its access ACL
 * (model_source's index_acl_value; the caller frees its value). */
static int
load_index(const struct model_tree *tree, const char *index_path, struct shard_map *m,
	struct stat *st, struct source_acl *acl)
{
	struct wc_file f;
	uint8_t *json = NULL;
	int rc;

	if ((rc = tree_open_file(tree, file_basename(index_path), index_path, &f)) < 0)
		return rc;
	if (f.size > SHARDS_MAX_INDEX)
		rc = error_set(-EFBIG,
			"%s: %llu bytes, larger than the %u MiB a shard index may be",
			index_path, (unsigned long long)f.size, SHARDS_MAX_INDEX >> 20);
	else if ((rc = file_read_exact(f.fd, index_path, "shard index", 0, f.size, 0,
			  SHARDS_MAX_INDEX, &json)) == 0 &&
		(rc = shards_parse_index(index_path, (const char *)json, (size_t)f.size, m)) == 0 &&
		(rc = file_check_unchanged(&f)) < 0)
		shard_map_free(m);
	if (rc == 0) {
		*st = f.st;
		if (acl != NULL)
			acl->state = file_acl_value(f.fd, &acl->value, &acl->len, &acl->nfs4);
	}
	free(json);
	file_close(&f);
	return rc;
}

/*
 * Opens the model's tree, the directory of index_path, and reads its shard
 * index inside it (load_index()): what shards_read_index() and
 * shards_open() both start with. On success *tree is open and *dir is the
 * malloc'd directory, both the caller's (tree_close(), free()), and *m,
 * *st (the index's fstat as opened) and *acl are set; on failure nothing is left
 * open and nothing is set.
 */
static int
open_index(const char *index_path, struct model_tree *tree, char **dir, struct shard_map *m,
	struct stat *st, struct source_acl *acl)
{
	struct model_tree t = { .fd = -1 };
	struct shard_map parsed = { 0 };
	char *d;
	int rc;

	if ((d = path_dir(index_path)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", index_path);
	if ((rc = tree_open(d, &t)) < 0 ||
	    (rc = load_index(&t, index_path, &parsed, st, acl)) < 0) {
		shard_map_free(&parsed); /* empty on failure; said for the analyser */
		tree_close(&t);
		free(d);
		return rc;
	}
	*tree = t;
	*dir = d;
	*m = parsed;
	return 0;
}

int
shards_read_index(const char *index_path, struct shard_map *out)
{
	struct model_tree tree;
	struct stat st;
	char *dir;
	int rc;

	if ((rc = open_index(index_path, &tree, &dir, out, &st, NULL)) < 0)
		return rc;
	tree_close(&tree);
	free(dir);
	return 0;
}

/*
 * Checks the shards against the weight_map in both directions, using the
 * built index (whose tensor names are unique) and the map.
 */
static int
cross_check(const char *index_path, const struct shard_map *m, char *const *paths,
	const uint8_t *blob, size_t len)
{
	struct index_header h;
	uint32_t *order = NULL;
	uint8_t *found = NULL;
	char q[300];
	int rc;

	if ((rc = index_open(blob, len, &h)) < 0)
		return rc;
	if ((order = sort_names(m->tensors, m->ntensors)) == NULL ||
		(found = calloc(m->ntensors, 1)) == NULL) {
		free(order);
		return error_set(-ENOMEM, "%s: out of memory", index_path);
	}
	for (uint64_t i = 0; i < h.tensor_count; i++) {
		struct index_tensor x;
		long e;

		if ((rc = index_tensor_at(blob, &h, i, &x)) < 0)
			goto out;
		e = find_name(m->tensors, order, m->ntensors, x.name);
		if (e < 0) {
			rc = error_set(-EINVAL, "%s: tensor %s is not in the weight_map of %s",
				paths[x.file], json_quote(q, sizeof(q), x.name, strlen(x.name)),
				index_path);
			goto out;
		}
		if (m->tensor_shard[e] != x.file) {
			rc = error_set(-EINVAL,
				"%s: tensor %s is in shard %s but the weight_map of %s puts it "
				"in %s", paths[x.file],
				json_quote(q, sizeof(q), x.name, strlen(x.name)), m->shards[x.file],
				index_path, m->shards[m->tensor_shard[e]]);
			goto out;
		}
		found[e] = 1;
	}
	for (size_t i = 0; i < m->ntensors; i++)
		if (!found[i]) {
			rc = error_set(-EINVAL,
				"%s: tensor %s is missing: the weight_map of %s puts it in this "
				"shard", paths[m->tensor_shard[i]],
				json_quote(q, sizeof(q), m->tensors[i], strlen(m->tensors[i])),
				index_path);
			goto out;
		}
	rc = 0;
out:
	free(order);
	free(found);
	return rc;
}

int
shards_open(const char *index_path, struct model_source *out)
{
	struct model_tree tree = { .fd = -1 };
	struct shard_map m = { 0 };
	struct stat index_st;
	struct source_acl index_acl = { .state = -1 };
	struct index_builder *b = NULL;
	struct wc_file *files = NULL;
	char **paths = NULL, *dir = NULL;
	uint8_t *blob = NULL;
	size_t len = 0;
	int rc;

	if ((rc = open_index(index_path, &tree, &dir, &m, &index_st, &index_acl)) < 0)
		return rc;
	/* shards_parse_index refuses an empty weight_map; said again here for
	 * the analyser, which cannot see it across the call. */
	if (m.nshards == 0) {
		rc = error_set(-EINVAL, "%s: weight_map names no shard", index_path);
		goto fail;
	}
	if ((files = calloc(m.nshards, sizeof(*files))) == NULL ||
		(paths = calloc(m.nshards, sizeof(*paths))) == NULL) {
		rc = error_set(-ENOMEM, "%s: out of memory", index_path);
		goto fail;
	}
	for (size_t i = 0; i < m.nshards; i++)
		files[i].fd = -1;
	if ((rc = index_builder_new(&b)) < 0)
		goto fail;
	for (size_t i = 0; i < m.nshards; i++) {
		uint32_t file_no;

		if ((paths[i] = path_join(dir, m.shards[i])) == NULL) {
			rc = error_set(-ENOMEM, "%s: out of memory", index_path);
			goto fail;
		}
		if ((rc = tree_open_file(&tree, m.shards[i], paths[i], &files[i])) < 0) {
			if (rc == -ENOENT)
				rc = error_set(rc, "%s: shard %s named by %s does not exist",
					paths[i], m.shards[i], index_path);
			goto fail;
		}
		if ((rc = index_add_file(b, m.shards[i], files[i].size, &file_no)) < 0 ||
			(rc = open_read_file(&files[i], &st_reader, file_no, b)) < 0)
			goto fail;
	}
	if ((rc = index_build(b, index_path, &blob, &len)) < 0 ||
		(rc = cross_check(index_path, &m, paths, blob, len)) < 0)
		goto fail;
	index_builder_free(b);
	for (size_t i = 0; i < m.nshards; i++)
		free(paths[i]);
	free(paths);
	free(dir);
	tree_close(&tree);
	memset(out, 0, sizeof(*out));
	out->format = FORMAT_SHARDED;
	out->files = files;
	out->nfiles = m.nshards;
	out->index = blob;
	out->index_len = len;
	out->index_st = index_st;
	out->index_acl = index_acl.state < 0 || (index_acl.state > 0 && !index_acl.nfs4);
	out->index_acl_value = index_acl;
	shard_map_free(&m);
	return 0;
fail:
	free(blob);
	index_builder_free(b);
	if (files != NULL)
		for (size_t i = 0; i < m.nshards; i++)
			file_close(&files[i]);
	free(files);
	if (paths != NULL)
		for (size_t i = 0; i < m.nshards; i++)
			free(paths[i]);
	free(paths);
	free(dir);
	free(index_acl.value);
	tree_close(&tree);
	shard_map_free(&m);
	return rc;
}

/* ---- finding the model in a directory ---- */

/* Names of one kind found in a directory: how many, and the first
 * NAMES_KEPT of them in strcmp order (what a message lists). A directory
 * may hold millions of names, and its owner chooses them: only these few
 * are kept. */
#define NAMES_KEPT 8

struct names {
	char *first[NAMES_KEPT];
	size_t kept, count;
};

/* Counts name and keeps it when it is among the first NAMES_KEPT; 0 or
 * -ENOMEM. */
static int
names_add(struct names *n, const char *name)
{
	size_t at = n->kept;
	char *copy;

	n->count++;
	while (at > 0 && strcmp(name, n->first[at - 1]) < 0)
		at--;
	if (at == NAMES_KEPT)
		return 0;
	if ((copy = strdup(name)) == NULL)
		return -ENOMEM;
	if (n->kept == NAMES_KEPT)
		free(n->first[--n->kept]);
	for (size_t i = n->kept; i > at; i--)
		n->first[i] = n->first[i - 1];
	n->first[at] = copy;
	n->kept++;
	return 0;
}

static void
names_free(struct names *n)
{
	for (size_t i = 0; i < n->kept; i++)
		free(n->first[i]);
}

/* Lists the names kept, comma-separated, into dst, and how many there
 * are in all when not every one is listed. */
static const char *
list_names(char *dst, size_t cap, const struct names *n)
{
	size_t pos = 0;

	dst[0] = '\0';
	for (size_t i = 0; i < n->kept && pos < cap; i++)
		pos += (size_t)snprintf(dst + pos, cap - pos, "%s%s", i ? ", " : "", n->first[i]);
	if (n->count > n->kept && pos < cap)
		snprintf(dst + pos, cap - pos, ", ... (%zu in all)", n->count);
	return dst;
}

const struct shards_name_rule *shards_name_rule;

/* shards_find_model's listing of the directory open as d (closed here),
 * named dir. */
static int
find_model_in(DIR *d, const char *dir, char **path, bool *is_index)
{
	struct names idx = { 0 }, st = { 0 };
	char *found, list[600], why[160], skipped[512] = "";
	struct dirent *e;
	void *run = NULL;
	int rc;

	errno = 0;
	while ((e = readdir(d)) != NULL) {
		if ((file_has_suffix(e->d_name, INDEX_SUFFIX) ||
			    file_has_suffix(e->d_name, SHARD_SUFFIX)) && shards_name_rule != NULL &&
			shards_name_rule->judge(&run, dirfd(d), e->d_name, why, sizeof(why)) < 0) {
			if (skipped[0] == '\0')
				snprintf(skipped, sizeof(skipped), " (%s not taken: %s)", e->d_name,
					why);
			errno = 0;
			continue;
		}
		if (file_has_suffix(e->d_name, INDEX_SUFFIX))
			rc = names_add(&idx, e->d_name);
		else if (file_has_suffix(e->d_name, SHARD_SUFFIX))
			rc = names_add(&st, e->d_name);
		else
			continue;
		if (rc < 0)
			goto nomem;
		errno = 0;
	}
	if (errno != 0) {
		rc = error_set(-errno, "%s: %s", dir, strerror(errno));
		goto out;
	}
	if (idx.count > 1) {
		rc = error_set(-EINVAL, "%s: %zu shard indexes (%s): open one of them by its path",
			dir, idx.count, list_names(list, sizeof(list), &idx));
		goto out;
	}
	if (idx.count == 0 && st.count != 1) {
		if (st.count == 0)
			rc = error_set(-ENOENT,
				"%s: no model found: no *.safetensors.index.json and no "
				"*.safetensors file%s", dir, skipped);
		else
			rc = error_set(-EINVAL,
				"%s: %zu *.safetensors files (%s) and no *.safetensors.index.json "
				"to say how they form a model: open one file by its path%s", dir,
				st.count, list_names(list, sizeof(list), &st), skipped);
		goto out;
	}
	if ((found = path_join(dir, idx.count == 1 ? idx.first[0] : st.first[0])) == NULL)
		goto nomem;
	*path = found;
	*is_index = idx.count == 1;
	rc = 0;
	goto out;
nomem:
	rc = error_set(-ENOMEM, "%s: out of memory", dir);
out:
	if (run != NULL)
		shards_name_rule->end(run);
	closedir(d);
	names_free(&idx);
	names_free(&st);
	return rc;
}

int
shards_find_model(const char *dir, char **path, bool *is_index)
{
	DIR *d;

	if ((d = opendir(dir)) == NULL)
		return error_set(-errno, "%s: %s", dir, strerror(errno));
	return find_model_in(d, dir, path, is_index);
}

int
shards_find_model_at(int dfd, const char *dir, char **path, bool *is_index)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd == -1)
		return error_set(-errno, "%s: %s", dir, strerror(errno));
	if ((d = fdopendir(fd)) == NULL) {
		int e = errno;

		close(fd);
		return error_set(-e, "%s: %s", dir, strerror(e));
	}
	return find_model_in(d, dir, path, is_index);
}
