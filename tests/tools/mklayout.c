/*
 * mklayout.c: writes a checkpoint with the layout of today's largest
 * models and almost no data, for the benchmarks of attach, header parsing
 * and index size at scale (issue 13): many tensors (up to millions) in one
 * safetensors file, or spread over many shards with a
 * model.safetensors.index.json, as DeepSeek-V3 ships (163 files, about
 * 90,000 tensors). Only the header and the index matter there, so every
 * tensor is a tiny BF16 vector and nothing large is written or committed.
 *
 *   mklayout --tensors N [--shards S] [--elements E] [--sorted] OUT
 *
 * With S = 1 (the default) OUT is the safetensors file. With S > 1 OUT is
 * a directory, created if missing, that receives
 * model-0000K-of-0000S.safetensors and model.safetensors.index.json (the
 * path to give wcached and wc_open_file). Names are MoE-like:
 * model.layers.L.mlp.experts.X.{gate,up,down}_proj.weight, in generation
 * order (layer by layer, not sorted) or, with --sorted, each file's header
 * and data in name order, as the safetensors library writes them. Files are
 * written beside their final name and renamed into place.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPERTS 256 /* experts per layer, as DeepSeek-V3 */

static const char *const proj[] = { "gate_proj", "up_proj", "down_proj" };

/* The name of tensor i, DeepSeek-V3 style. */
static void
tensor_name(uint64_t i, char *buf, size_t cap)
{
	uint64_t per_layer = (uint64_t)EXPERTS * 3;

	snprintf(buf, cap, "model.layers.%" PRIu64 ".mlp.experts.%" PRIu64 ".%s.weight",
		i / per_layer, (i % per_layer) / 3, proj[i % 3]);
}

/* A growable string, enough for a header of millions of tensors. */
struct text {
	char *p;
	size_t len, cap;
};

static void
text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
text_add(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		/* An empty text has no buffer yet: measure only (NULL + 0 is
		 * undefined behaviour). */
		n = t->p == NULL ? vsnprintf(NULL, 0, fmt, ap) :
				   vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
		va_end(ap);
		if (t->p != NULL && n >= 0 && (size_t)n < t->cap - t->len)
			break;
		t->cap = t->cap * 2 + (size_t)n + 64;
		if ((t->p = realloc(t->p, t->cap)) == NULL) {
			fprintf(stderr, "mklayout: out of memory\n");
			exit(1);
		}
	}
	t->len += (size_t)n;
}

/* Writes data to path through path.tmp and a rename. */
static void
write_file(const char *path, const void *a, size_t alen, const void *b, size_t blen)
{
	char tmp[4200];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((f = fopen(tmp, "wb")) == NULL || fwrite(a, 1, alen, f) != alen ||
		(blen > 0 && fwrite(b, 1, blen, f) != blen) || fclose(f) != 0 ||
		rename(tmp, path) != 0) {
		fprintf(stderr, "mklayout: %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

#define NAME_BYTES 96

static int
by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* Shard k of nshards: tensors [first, last), in generation order or, with
 * sorted, in name order (as the safetensors library writes a file). */
static void
write_shard(const char *path, uint64_t first, uint64_t last, uint64_t elements, int sorted)
{
	struct text h = { 0 };
	uint64_t nbytes = elements * 2, off = 0, n = last - first;
	uint8_t lenbuf[8], *data;
	char *names = malloc(n * NAME_BYTES);
	size_t dlen;

	if (names == NULL) {
		fprintf(stderr, "mklayout: out of memory\n");
		exit(1);
	}
	for (uint64_t i = 0; i < n; i++)
		tensor_name(first + i, names + i * NAME_BYTES, NAME_BYTES);
	if (sorted)
		qsort(names, n, NAME_BYTES, by_name);
	text_add(&h, "12345678{\"__metadata__\":{\"format\":\"pt\"}"); /* 8: the length */
	for (uint64_t i = 0; i < n; i++, off += nbytes)
		text_add(&h, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64 "],"
			"\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", names + i * NAME_BYTES,
			elements, off, off + nbytes);
	free(names);
	text_add(&h, "}");
	while ((h.len - 8) % 8 != 0)
		text_add(&h, " ");
	dlen = (size_t)off;
	if ((data = calloc(1, dlen ? dlen : 1)) == NULL) {
		fprintf(stderr, "mklayout: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < dlen; i += 2)
		data[i + 1] = 0x3f; /* BF16 0.5: 0x3f00 */
	/* 8-byte little-endian header length, then the header, then data. */
	for (int i = 0; i < 8; i++)
		lenbuf[i] = (uint8_t)((uint64_t)(h.len - 8) >> (8 * i));
	memcpy(h.p, lenbuf, 8);
	write_file(path, h.p, h.len, data, dlen);
	free(data);
	free(h.p);
}

static void
usage(void)
{
	fprintf(stderr, "usage: mklayout --tensors N [--shards S] [--elements E] [--sorted] OUT\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	uint64_t tensors = 0, shards = 1, elements = 4;
	const char *out = NULL;
	int sorted = 0;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t *dst = NULL;

		if (strcmp(argv[i], "--tensors") == 0)
			dst = &tensors;
		else if (strcmp(argv[i], "--shards") == 0)
			dst = &shards;
		else if (strcmp(argv[i], "--elements") == 0)
			dst = &elements;
		else if (strcmp(argv[i], "--sorted") == 0)
			sorted = 1;
		else if (argv[i][0] != '-' && out == NULL)
			out = argv[i];
		else
			usage();
		if (dst != NULL) {
			char *end;

			if (v == NULL)
				usage();
			*dst = strtoull(v, &end, 10);
			if (*end != '\0')
				usage();
			i++;
		}
	}
	if (out == NULL || tensors == 0 || shards == 0 || shards > tensors || elements == 0 ||
		strlen(out) > 4000)
		usage();
	if (shards == 1) {
		write_shard(out, 0, tensors, elements, sorted);
		return 0;
	}
	if (mkdir(out, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "mklayout: %s: %s\n", out, strerror(errno));
		return 1;
	}
	struct text index = { 0 };
	char path[4200], name[160];

	text_add(&index, "{\"metadata\":{\"total_size\":%" PRIu64 "},\"weight_map\":{",
		tensors * elements * 2);
	for (uint64_t k = 0; k < shards; k++) {
		uint64_t first = tensors * k / shards, last = tensors * (k + 1) / shards;
		char file[64];

		snprintf(file, sizeof(file), "model-%05" PRIu64 "-of-%05" PRIu64 ".safetensors",
			k + 1, shards);
		snprintf(path, sizeof(path), "%s/%s", out, file);
		write_shard(path, first, last, elements, sorted);
		for (uint64_t i = first; i < last; i++) {
			tensor_name(i, name, sizeof(name));
			text_add(&index, "%s\"%s\":\"%s\"", i ? "," : "", name, file);
		}
	}
	text_add(&index, "}}\n");
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", out);
	write_file(path, index.p, index.len, NULL, 0);
	free(index.p);
	return 0;
}
