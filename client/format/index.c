/*
 * index.c: the compiled tensor index (see index.h and proto/FORMAT.md).
 *
 * The builder gathers what a format reader validated into growable arrays
 * (strings and shapes in arenas, addressed by offset so growth may move
 * them), then sorts and writes one contiguous little-endian block. The
 * reader trusts nothing in a block: every access checks the offsets it
 * follows, so a worker can map an index from the daemon in O(1) and still
 * never read outside it.
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/dtype.h"
#include "base/error.h"
#include "format/index.h"
#include "proto/le.h"

/* Shapes are handed out as pointers into the block: native u64 must be LE. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wcache needs a little-endian host");

struct builder_tensor {
	size_t name;     /* offset in strings */
	size_t name_len;
	uint32_t dtype;
	uint32_t file;
	uint32_t ndim;
	size_t shape;    /* index in shapes */
	uint64_t offset;
	uint64_t nbytes;
};

struct builder_pair {
	size_t key, key_len; /* offsets in strings */
	size_t value, value_len;
};

struct builder_file {
	size_t name, name_len;
	uint64_t size;
};

struct index_builder {
	struct builder_tensor *tensors;
	size_t ntensors, tensors_cap;
	struct builder_pair *meta;
	size_t nmeta, meta_cap;
	struct builder_file *files;
	size_t nfiles, files_cap;
	char *strings;
	size_t strings_len, strings_cap;
	uint64_t *shapes;
	size_t shapes_len, shapes_cap;
};

/* Grows *array (of elem-sized items) so it holds at least need items. */
static int
grow(void *array, size_t *cap, size_t need, size_t elem)
{
	void **p = array;
	size_t ncap = *cap ? *cap : 16;
	void *n;

	if (need <= *cap)
		return 0;
	while (ncap < need) {
		if (ncap > SIZE_MAX / 2 / elem)
			return -ENOMEM;
		ncap *= 2;
	}
	if ((n = realloc(*p, ncap * elem)) == NULL)
		return -ENOMEM;
	*p = n;
	*cap = ncap;
	return 0;
}

/* Copies len bytes plus a NUL into the string arena; *at gets the offset. */
static int
add_string(struct index_builder *b, const char *s, size_t len, size_t *at)
{
	if (len > SIZE_MAX - 1 - b->strings_len ||
		grow(&b->strings, &b->strings_cap, b->strings_len + len + 1, 1) < 0)
		return error_set(-ENOMEM, "index: out of memory");
	memcpy(b->strings + b->strings_len, s, len);
	b->strings[b->strings_len + len] = '\0';
	*at = b->strings_len;
	b->strings_len += len + 1;
	return 0;
}

int
index_builder_new(struct index_builder **out)
{
	struct index_builder *b = calloc(1, sizeof(*b));

	if (b == NULL)
		return error_set(-ENOMEM, "index: out of memory");
	*out = b;
	return 0;
}

void
index_builder_free(struct index_builder *b)
{
	if (b == NULL)
		return;
	free(b->tensors);
	free(b->meta);
	free(b->files);
	free(b->strings);
	free(b->shapes);
	free(b);
}

int
index_builder_reserve(struct index_builder *b, size_t tensors, size_t string_bytes)
{
	/* Two dimensions per tensor is the common case; more grows as usual. */
	if (grow(&b->tensors, &b->tensors_cap, b->ntensors + tensors, sizeof(*b->tensors)) < 0 ||
		grow(&b->shapes, &b->shapes_cap, b->shapes_len + 2 * tensors,
			sizeof(uint64_t)) < 0 ||
		grow(&b->strings, &b->strings_cap, b->strings_len + string_bytes, 1) < 0)
		return error_set(-ENOMEM, "index: out of memory");
	return 0;
}

size_t
index_builder_count(const struct index_builder *b)
{
	return b->ntensors;
}

int
index_add_file(struct index_builder *b, const char *name, uint64_t size, uint32_t *file_no)
{
	struct builder_file f = { .name_len = strlen(name), .size = size };

	if (b->nfiles >= INDEX_MAX_FILES)
		return error_set(-E2BIG, "%s: more than %d files in one model", name,
			INDEX_MAX_FILES);
	if (grow(&b->files, &b->files_cap, b->nfiles + 1, sizeof(f)) < 0)
		return error_set(-ENOMEM, "index: out of memory");
	if (add_string(b, name, f.name_len, &f.name) < 0)
		return -ENOMEM;
	*file_no = (uint32_t)b->nfiles;
	b->files[b->nfiles++] = f;
	return 0;
}

int
index_add_tensor(struct index_builder *b, const char *name, size_t name_len, uint32_t dtype,
	uint32_t file_no, const uint64_t *shape, uint32_t ndim, uint64_t offset, uint64_t nbytes)
{
	struct builder_tensor t = { .name_len = name_len, .dtype = dtype, .file = file_no,
		.ndim = ndim, .offset = offset, .nbytes = nbytes };

	if (name_len == 0 || name_len > INDEX_MAX_NAME || memchr(name, '\0', name_len) != NULL)
		return error_set(-EINVAL, "index: invalid tensor name");
	if (ndim > INDEX_MAX_NDIM || file_no >= b->nfiles || dtype_by_code(dtype) == NULL)
		return error_set(-EINVAL, "index: invalid tensor \"%.*s\"", (int)name_len, name);
	if (grow(&b->tensors, &b->tensors_cap, b->ntensors + 1, sizeof(t)) < 0 ||
		grow(&b->shapes, &b->shapes_cap, b->shapes_len + ndim, sizeof(uint64_t)) < 0)
		return error_set(-ENOMEM, "index: out of memory");
	if (add_string(b, name, name_len, &t.name) < 0)
		return -ENOMEM;
	t.shape = b->shapes_len;
	if (ndim > 0)
		memcpy(b->shapes + b->shapes_len, shape, ndim * sizeof(uint64_t));
	b->shapes_len += ndim;
	b->tensors[b->ntensors++] = t;
	return 0;
}

int
index_add_meta(struct index_builder *b, const char *key, size_t key_len, const char *value,
	size_t value_len)
{
	struct builder_pair p = { .key_len = key_len, .value_len = value_len };

	if (memchr(key, '\0', key_len) != NULL || memchr(value, '\0', value_len) != NULL)
		return error_set(-EINVAL, "index: metadata \"%.*s\" contains a NUL byte",
			(int)key_len, key);
	if (grow(&b->meta, &b->meta_cap, b->nmeta + 1, sizeof(p)) < 0)
		return error_set(-ENOMEM, "index: out of memory");
	if (add_string(b, key, key_len, &p.key) < 0 ||
		add_string(b, value, value_len, &p.value) < 0)
		return -ENOMEM;
	b->meta[b->nmeta++] = p;
	return 0;
}

/* Byte order of two arena strings of known lengths (strcmp order, as no name
 * holds a NUL). */
static int
compare_names(const char *a, size_t alen, const char *b, size_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);

	if (c != 0)
		return c;
	return (alen > blen) - (alen < blen);
}

static int
compare_tensors(const void *x, const void *y, void *arg)
{
	const struct builder_tensor *a = x, *b = y;
	const char *s = arg;

	return compare_names(s + a->name, a->name_len, s + b->name, b->name_len);
}

/*
 * Sorting tensors by name. Comparison sorts of the records spend most of
 * their time in memcmp() over the long prefixes that checkpoint names share
 * ("model.layers.12.mlp.experts.7.") and in moving 56-byte records. Instead
 * an order (tensor numbers) is sorted by 8-byte keys: the name's bytes at a
 * depth, big-endian, zero-padded past the end (no name holds a NUL, so this
 * is strcmp order). The first depth is the prefix all names share; a radix
 * sort orders the keys, and each run of equal keys whose names go on is
 * sorted again at depth + 8. Small runs use insertion sort on whole names.
 */
struct sort_item {
	uint64_t key;
	uint32_t tensor;
};

#define SORT_SMALL 32

/* What every level of sort_run() shares: the histogram is used only before
 * a level recurses, so one serves all levels, and the stack stays small
 * however long the names (up to 512 levels of 8 bytes). */
struct sort_ctx {
	const struct index_builder *b;
	uint32_t count[256];
};

/* The 8 bytes of tensor t's name at depth, big-endian, zero-padded. */
static uint64_t
name_key(const struct index_builder *b, uint32_t t, size_t depth)
{
	const struct builder_tensor *x = &b->tensors[t];
	const unsigned char *s = (const unsigned char *)b->strings + x->name + depth;
	uint64_t k = 0;

	if (depth + 8 <= x->name_len) {
		memcpy(&k, s, 8);
		return be64toh(k);
	}
	for (size_t i = 0; i < 8; i++)
		k = k << 8 | (depth + i < x->name_len ? s[i] : 0);
	return k;
}

/* Whole-name order of two tensors whose names agree before depth. */
static int
compare_from(const struct index_builder *b, uint32_t x, uint32_t y, size_t depth)
{
	const struct builder_tensor *a = &b->tensors[x], *c = &b->tensors[y];
	size_t al = a->name_len - (depth < a->name_len ? depth : a->name_len);
	size_t cl = c->name_len - (depth < c->name_len ? depth : c->name_len);

	return compare_names(b->strings + a->name + (a->name_len - al), al,
		b->strings + c->name + (c->name_len - cl), cl);
}

/* Whether item x sorts before y, their keys taken at depth. A key whose
 * last byte is 0 holds the end of the name: equal keys then mean equal
 * names (duplicates, which index_build reports). */
static int
item_before(const struct index_builder *b, const struct sort_item *x, const struct sort_item *y,
	size_t depth)
{
	if (x->key != y->key)
		return x->key < y->key;
	return (x->key & 0xff) != 0 && compare_from(b, x->tensor, y->tensor, depth + 8) < 0;
}

/* Sorts items[0..n) (names equal before depth) using tmp's room. */
static void
sort_run(struct sort_ctx *ctx, struct sort_item *it, struct sort_item *tmp, size_t n,
	size_t depth)
{
	const struct index_builder *b = ctx->b;
	struct sort_item *src = it, *dst = tmp;
	uint64_t all = ~(uint64_t)0, any = 0, varies;

	for (size_t i = 0; i < n; i++) {
		uint64_t k = it[i].key = name_key(b, it[i].tensor, depth);

		all &= k;
		any |= k;
	}
	if (n <= SORT_SMALL) {
		for (size_t i = 1; i < n; i++) {
			struct sort_item v = it[i];
			size_t j = i;

			while (j > 0 && item_before(b, &v, &it[j - 1], depth)) {
				it[j] = it[j - 1];
				j--;
			}
			it[j] = v;
		}
		return;
	}
	/* Least significant byte first, only the bytes that differ. */
	varies = all ^ any;
	for (int d = 0; d < 8; d++) {
		uint32_t *count = ctx->count, sum = 0;

		if (((varies >> (8 * d)) & 0xff) == 0)
			continue;
		memset(ctx->count, 0, sizeof(ctx->count));
		for (size_t i = 0; i < n; i++)
			count[(src[i].key >> (8 * d)) & 0xff]++;
		for (int v = 0; v < 256; v++) {
			uint32_t c = count[v];

			count[v] = sum;
			sum += c;
		}
		for (size_t i = 0; i < n; i++)
			dst[count[(src[i].key >> (8 * d)) & 0xff]++] = src[i];
		struct sort_item *swap = src;

		src = dst;
		dst = swap;
	}
	if (src != it)
		memcpy(it, src, n * sizeof(*it));
	/* Runs of one key: the names agree on 8 more bytes. */
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;

		while (j < n && it[j].key == it[i].key)
			j++;
		if (j - i > 1 && (it[i].key & 0xff) != 0)
			sort_run(ctx, it + i, tmp, j - i, depth + 8);
		i = j;
	}
}

/* The tensors' order by name, as a malloc'd array of tensor numbers
 * (items), or NULL when out of memory. */
static struct sort_item *
sort_tensors(const struct index_builder *b)
{
	size_t n = b->ntensors, depth = SIZE_MAX;
	/* calloc: for a large n these are fresh zero pages anyway. */
	struct sort_item *it = calloc(2 * (n ? n : 1), sizeof(*it));
	struct sort_ctx *ctx = malloc(sizeof(*ctx));
	const char *first = b->strings + (n ? b->tensors[0].name : 0);

	if (it == NULL || ctx == NULL) {
		free(it);
		free(ctx);
		return NULL;
	}
	ctx->b = b;
	/* Checkpoints written by the safetensors library list a file's tensors
	 * sorted (by dtype, then name): one pass finds that out, and stops at
	 * the first name out of order otherwise. */
	{
		size_t i = 1;

		while (i < n && compare_tensors(&b->tensors[i - 1], &b->tensors[i], b->strings) < 0)
			i++;
		if (i >= n) {
			for (i = 0; i < n; i++)
				it[i].tensor = (uint32_t)i;
			free(ctx);
			return it;
		}
	}
	for (size_t i = 0; i < n; i++) {
		const struct builder_tensor *t = &b->tensors[i];
		size_t l = 0, max = t->name_len < depth ? t->name_len : depth;

		while (l < max && b->strings[t->name + l] == first[l])
			l++;
		depth = l;
		it[i].tensor = (uint32_t)i;
	}
	sort_run(ctx, it, it + n, n, n ? depth : 0);
	free(ctx);
	return it;
}

static int
compare_pairs(const void *x, const void *y, void *arg)
{
	const struct builder_pair *a = x, *b = y;
	const char *s = arg;

	return compare_names(s + a->key, a->key_len, s + b->key, b->key_len);
}

int
index_build(struct index_builder *b, const char *what, uint8_t **blob, size_t *len)
{
	size_t tensor_off = INDEX_HEADER_SIZE, file_off, meta_off, shape_off, string_off, total;
	size_t names_len = 0, arena_off, at;
	struct sort_item *order;
	uint8_t *out, *p;

	if (b->ntensors > UINT32_MAX)
		return error_set(-E2BIG, "%s: more than %u tensors", what, UINT32_MAX);
	if ((order = sort_tensors(b)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", what);
	if (b->nmeta > 1)
		qsort_r(b->meta, b->nmeta, sizeof(*b->meta), compare_pairs, b->strings);
	for (size_t i = 1; i < b->ntensors; i++)
		if (compare_tensors(&b->tensors[order[i - 1].tensor],
			    &b->tensors[order[i].tensor], b->strings) == 0) {
			int r = error_set(-EINVAL, "%s: duplicate tensor name \"%s\"", what,
				b->strings + b->tensors[order[i].tensor].name);

			free(order);
			return r;
		}
	for (size_t i = 1; i < b->nmeta; i++)
		if (compare_pairs(&b->meta[i - 1], &b->meta[i], b->strings) == 0) {
			int r = error_set(-EINVAL, "%s: duplicate metadata key \"%s\"", what,
				b->strings + b->meta[i].key);

			free(order);
			return r;
		}

	/* Sizes are bounded by what the arrays already hold in memory, so
	 * these sums cannot overflow size_t on a 64-bit host. */
	file_off = tensor_off + b->ntensors * INDEX_RECORD_SIZE;
	meta_off = file_off + b->nfiles * INDEX_FILE_SIZE;
	shape_off = meta_off + b->nmeta * INDEX_META_SIZE;
	string_off = shape_off + b->shapes_len * sizeof(uint64_t);
	/* The file names first, together, so that a reader that checks every
	 * file (attach) touches one page for them rather than one per file
	 * (in the arena each lies before its shard's tensor names); then the
	 * arena as built. */
	for (size_t i = 0; i < b->nfiles; i++)
		names_len += b->files[i].name_len + 1;
	arena_off = string_off + names_len;
	total = arena_off + b->strings_len;
	if ((out = calloc(1, total)) == NULL) {
		free(order);
		return error_set(-ENOMEM, "%s: out of memory for an index of %zu bytes", what,
			total);
	}

	put_le32(out + 0, INDEX_MAGIC);
	put_le32(out + 4, INDEX_VERSION);
	put_le64(out + 8, b->ntensors);
	put_le64(out + 16, tensor_off);
	put_le64(out + 24, b->nfiles);
	put_le64(out + 32, file_off);
	put_le64(out + 40, b->nmeta);
	put_le64(out + 48, meta_off);
	put_le64(out + 56, total);

	for (size_t i = 0; i < b->ntensors; i++) {
		const struct builder_tensor *t = &b->tensors[order[i].tensor];

		p = out + tensor_off + i * INDEX_RECORD_SIZE;
		put_le64(p + 0, arena_off + t->name);
		put_le32(p + 8, t->dtype);
		put_le32(p + 12, t->file);
		put_le64(p + 16, shape_off + t->shape * sizeof(uint64_t));
		put_le64(p + 24, t->ndim);
		put_le64(p + 32, t->offset);
		put_le64(p + 40, t->nbytes);
	}
	at = string_off;
	for (size_t i = 0; i < b->nfiles; i++) {
		p = out + file_off + i * INDEX_FILE_SIZE;
		put_le64(p + 0, at);
		put_le64(p + 8, b->files[i].size);
		memcpy(out + at, b->strings + b->files[i].name, b->files[i].name_len + 1);
		at += b->files[i].name_len + 1;
	}
	for (size_t i = 0; i < b->nmeta; i++) {
		p = out + meta_off + i * INDEX_META_SIZE;
		put_le64(p + 0, arena_off + b->meta[i].key);
		put_le64(p + 8, arena_off + b->meta[i].value);
	}
	for (size_t i = 0; i < b->shapes_len; i++)
		put_le64(out + shape_off + i * sizeof(uint64_t), b->shapes[i]);
	if (b->strings_len > 0)
		memcpy(out + arena_off, b->strings, b->strings_len);

	free(order);
	*blob = out;
	*len = total;
	return 0;
}

/* ---- reading ---- */

/* Checks that count records of size bytes at off lie inside len bytes. */
static int
table_fits(uint64_t off, uint64_t count, uint64_t size, uint64_t len)
{
	uint64_t bytes;

	if (__builtin_mul_overflow(count, size, &bytes))
		return 0;
	return off % 8 == 0 && off <= len && bytes <= len - off;
}

int
index_open(const uint8_t *blob, size_t len, struct index_header *out)
{
	struct index_header h;

	if (len < INDEX_HEADER_SIZE)
		return error_set(-EBADMSG, "index: %zu bytes, shorter than its header", len);
	h.magic = get_le32(blob);
	h.version = get_le32(blob + 4);
	h.tensor_count = get_le64(blob + 8);
	h.tensor_offset = get_le64(blob + 16);
	h.file_count = get_le64(blob + 24);
	h.file_offset = get_le64(blob + 32);
	h.meta_count = get_le64(blob + 40);
	h.meta_offset = get_le64(blob + 48);
	h.total_size = get_le64(blob + 56);
	if (h.magic != INDEX_MAGIC)
		return error_set(-EBADMSG, "index: bad magic 0x%08x", h.magic);
	if (h.version != INDEX_VERSION)
		return error_set(-EPROTO, "index: version %u, this library reads %u", h.version,
			INDEX_VERSION);
	if (h.total_size != len)
		return error_set(-EBADMSG, "index: size %llu, header says %llu",
			(unsigned long long)len, (unsigned long long)h.total_size);
	if (!table_fits(h.tensor_offset, h.tensor_count, INDEX_RECORD_SIZE, len) ||
		!table_fits(h.file_offset, h.file_count, INDEX_FILE_SIZE, len) ||
		!table_fits(h.meta_offset, h.meta_count, INDEX_META_SIZE, len))
		return error_set(-EBADMSG, "index: a table lies outside the index");
	if (h.file_count == 0 || h.file_count > INDEX_MAX_FILES)
		return error_set(-EBADMSG, "index: %llu files", (unsigned long long)h.file_count);
	*out = h;
	return 0;
}

/* A NUL-terminated string at off, at most max bytes before the NUL. */
static const char *
string_at(const uint8_t *blob, uint64_t len, uint64_t off, size_t max)
{
	const uint8_t *nul;
	uint64_t room;

	if (off >= len)
		return NULL;
	room = len - off;
	nul = memchr(blob + off, '\0', room < max + 1 ? (size_t)room : max + 1);
	return nul == NULL ? NULL : (const char *)(blob + off);
}

int
index_tensor_at(const uint8_t *blob, const struct index_header *h, uint64_t i,
	struct index_tensor *out)
{
	const uint8_t *p;
	struct index_tensor t;
	const struct dtype_info *dt;
	uint64_t shape_off, ndim, elements, nbytes;

	if (i >= h->tensor_count)
		return error_set(-ERANGE, "index: tensor %llu of %llu", (unsigned long long)i,
			(unsigned long long)h->tensor_count);
	p = blob + h->tensor_offset + i * INDEX_RECORD_SIZE;
	t.name = string_at(blob, h->total_size, get_le64(p), INDEX_MAX_NAME);
	t.dtype = get_le32(p + 8);
	t.file = get_le32(p + 12);
	shape_off = get_le64(p + 16);
	ndim = get_le64(p + 24);
	t.offset = get_le64(p + 32);
	t.nbytes = get_le64(p + 40);
	if (t.name == NULL || (dt = dtype_by_code(t.dtype)) == NULL || t.file >= h->file_count ||
		ndim > INDEX_MAX_NDIM || !table_fits(shape_off, ndim, 8, h->total_size) ||
		(uintptr_t)(blob + shape_off) % 8 != 0)
		return error_set(-EBADMSG, "index: tensor record %llu is damaged",
			(unsigned long long)i);
	t.type = dt;
	t.ndim = (uint32_t)ndim;
	t.shape = (const uint64_t *)(const void *)(blob + shape_off);
	if (dtype_nbytes(dt, t.shape, t.ndim, &elements, &nbytes) < 0 || nbytes != t.nbytes)
		return error_set(-EBADMSG, "index: tensor \"%s\": size does not match its shape",
			t.name);
	*out = t;
	return 0;
}

/* Name of record i, or NULL when damaged. */
static const char *
record_name(const uint8_t *blob, const struct index_header *h, uint64_t i)
{
	return string_at(blob, h->total_size,
		get_le64(blob + h->tensor_offset + i * INDEX_RECORD_SIZE), INDEX_MAX_NAME);
}

int
index_find(const uint8_t *blob, const struct index_header *h, const char *name,
	struct index_tensor *out)
{
	uint64_t lo = 0, hi = h->tensor_count;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		const char *s = record_name(blob, h, mid);
		int c;

		if (s == NULL)
			return error_set(-EBADMSG, "index: tensor record %llu is damaged",
				(unsigned long long)mid);
		c = strcmp(name, s);
		if (c == 0)
			return index_tensor_at(blob, h, mid, out);
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return error_set(-ENOENT, "no tensor \"%s\"", name);
}

int
index_file_at(const uint8_t *blob, const struct index_header *h, uint64_t i, const char **name,
	uint64_t *size)
{
	const uint8_t *p;
	const char *s;

	if (i >= h->file_count)
		return error_set(-ERANGE, "index: file %llu of %llu", (unsigned long long)i,
			(unsigned long long)h->file_count);
	p = blob + h->file_offset + i * INDEX_FILE_SIZE;
	if (name != NULL) {
		if ((s = string_at(blob, h->total_size, get_le64(p), INDEX_MAX_NAME)) == NULL)
			return error_set(-EBADMSG, "index: file record %llu is damaged",
				(unsigned long long)i);
		*name = s;
	}
	*size = get_le64(p + 8);
	return 0;
}

int
index_meta_at(const uint8_t *blob, const struct index_header *h, uint64_t i, const char **key,
	const char **value)
{
	const uint8_t *p;
	const char *k, *v;

	if (i >= h->meta_count)
		return -ERANGE;
	p = blob + h->meta_offset + i * INDEX_META_SIZE;
	k = string_at(blob, h->total_size, get_le64(p), h->total_size);
	v = string_at(blob, h->total_size, get_le64(p + 8), h->total_size);
	if (k == NULL || v == NULL)
		return error_set(-EBADMSG, "index: metadata record %llu is damaged",
			(unsigned long long)i);
	*key = k;
	*value = v;
	return 0;
}

int
index_meta_find(const uint8_t *blob, const struct index_header *h, const char *key,
	const char **value)
{
	uint64_t lo = 0, hi = h->meta_count;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		const char *k, *v;
		int c, r;

		if ((r = index_meta_at(blob, h, mid, &k, &v)) < 0)
			return r;
		c = strcmp(key, k);
		if (c == 0) {
			*value = v;
			return 0;
		}
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -ENOENT;
}

const char *
index_format_shape(char *dst, size_t cap, const uint64_t *shape, uint32_t ndim)
{
	size_t pos = 0;

	pos += (size_t)snprintf(dst, cap, "[");
	for (uint32_t i = 0; i < ndim && pos < cap; i++) {
		if (pos + 28 > cap) {
			snprintf(dst + pos, cap - pos, "...");
			pos = cap;
			break;
		}
		pos += (size_t)snprintf(dst + pos, cap - pos, "%s%llu", i ? ", " : "",
			(unsigned long long)shape[i]);
	}
	if (pos < cap)
		snprintf(dst + pos, cap - pos, "]");
	return dst;
}
