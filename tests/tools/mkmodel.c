/*
 * mkmodel.c: writes a synthetic safetensors model shaped and named like a
 * decoder-only LLM (llama layout), for the demo, the tests and the
 * benchmarks. The weights are deterministic pseudo-random BF16/F16/F32
 * values of modest magnitude (no NaN or infinity) from pattern.h, with the
 * seed in the metadata, so a reader can check every byte it sees.
 *
 *   mkmodel [--layers N] [--hidden H] [--ffn F] [--vocab V] [--dtype D]
 *           [--seed S] [--min-bytes B] OUT
 *
 * --min-bytes grows the layer count until the file holds at least B bytes
 * of data. The file is written beside OUT and renamed into place.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pattern.h"

struct spec {
	char name[128];
	uint64_t shape[2];
	int ndim;
};

struct params {
	uint64_t layers, hidden, ffn, vocab, min_bytes, seed;
	const char *dtype;
	unsigned elem;
};

static size_t
layer_specs(const struct params *p, struct spec *s, uint64_t layer)
{
	static const char *const attn[] = { "q_proj", "k_proj", "v_proj", "o_proj" };
	size_t n = 0;

	snprintf(s[n].name, sizeof(s[n].name), "model.layers.%" PRIu64 ".input_layernorm.weight",
		layer);
	s[n].ndim = 1, s[n].shape[0] = p->hidden, n++;
	for (int i = 0; i < 4; i++) {
		snprintf(s[n].name, sizeof(s[n].name),
			"model.layers.%" PRIu64 ".self_attn.%s.weight", layer, attn[i]);
		s[n].ndim = 2, s[n].shape[0] = p->hidden, s[n].shape[1] = p->hidden, n++;
	}
	snprintf(s[n].name, sizeof(s[n].name),
		"model.layers.%" PRIu64 ".post_attention_layernorm.weight", layer);
	s[n].ndim = 1, s[n].shape[0] = p->hidden, n++;
	snprintf(s[n].name, sizeof(s[n].name), "model.layers.%" PRIu64 ".mlp.gate_proj.weight",
		layer);
	s[n].ndim = 2, s[n].shape[0] = p->ffn, s[n].shape[1] = p->hidden, n++;
	snprintf(s[n].name, sizeof(s[n].name), "model.layers.%" PRIu64 ".mlp.up_proj.weight",
		layer);
	s[n].ndim = 2, s[n].shape[0] = p->ffn, s[n].shape[1] = p->hidden, n++;
	snprintf(s[n].name, sizeof(s[n].name), "model.layers.%" PRIu64 ".mlp.down_proj.weight",
		layer);
	s[n].ndim = 2, s[n].shape[0] = p->hidden, s[n].shape[1] = p->ffn, n++;
	return n;
}

static uint64_t
spec_bytes(const struct params *p, const struct spec *s)
{
	uint64_t n = p->elem;

	for (int d = 0; d < s->ndim; d++)
		n *= s->shape[d];
	return n;
}

/* All tensors in file order: embeddings, layers, norm, lm_head. */
static struct spec *
all_specs(const struct params *p, size_t *count)
{
	size_t cap = 3 + 9 * p->layers, n = 0;
	struct spec *s = calloc(cap, sizeof(*s));

	if (s == NULL)
		return NULL;
	snprintf(s[n].name, sizeof(s[n].name), "model.embed_tokens.weight");
	s[n].ndim = 2, s[n].shape[0] = p->vocab, s[n].shape[1] = p->hidden, n++;
	for (uint64_t l = 0; l < p->layers; l++)
		n += layer_specs(p, s + n, l);
	snprintf(s[n].name, sizeof(s[n].name), "model.norm.weight");
	s[n].ndim = 1, s[n].shape[0] = p->hidden, n++;
	snprintf(s[n].name, sizeof(s[n].name), "lm_head.weight");
	s[n].ndim = 2, s[n].shape[0] = p->vocab, s[n].shape[1] = p->hidden, n++;
	*count = n;
	return s;
}

/* Writes everything, through short writes and EINTR. Its own loop, not
 * base/path.h's fd_write_all: tests/system builds this file alone, as a
 * user of the packages would. */
static int
write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void
usage(void)
{
	fprintf(stderr, "usage: mkmodel [--layers N] [--hidden H] [--ffn F] [--vocab V] "
			"[--dtype BF16|F16|F32] [--seed S] [--min-bytes B] OUT\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	struct params p = { 2, 256, 688, 1000, 0, 1, "BF16", 2 };
	const char *out = NULL;
	struct spec *specs;
	size_t count, hlen, hcap;
	uint64_t off = 0, data = 0, state;
	char *header, tmp[4096];
	uint8_t *buf;
	int fd;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (a[0] != '-') {
			out = a;
			continue;
		}
		if (v == NULL)
			usage();
		i++;
		if (strcmp(a, "--layers") == 0)
			p.layers = strtoull(v, NULL, 0);
		else if (strcmp(a, "--hidden") == 0)
			p.hidden = strtoull(v, NULL, 0);
		else if (strcmp(a, "--ffn") == 0)
			p.ffn = strtoull(v, NULL, 0);
		else if (strcmp(a, "--vocab") == 0)
			p.vocab = strtoull(v, NULL, 0);
		else if (strcmp(a, "--seed") == 0)
			p.seed = strtoull(v, NULL, 0);
		else if (strcmp(a, "--min-bytes") == 0)
			p.min_bytes = strtoull(v, NULL, 0);
		else if (strcmp(a, "--dtype") == 0)
			p.dtype = v;
		else
			usage();
	}
	if (out == NULL)
		usage();
	if (strcmp(p.dtype, "F32") == 0)
		p.elem = 4;
	else if (strcmp(p.dtype, "BF16") != 0 && strcmp(p.dtype, "F16") != 0)
		usage();
	if (p.min_bytes > 0) {
		uint64_t per_layer = p.elem * (4 * p.hidden * p.hidden + 3 * p.ffn * p.hidden +
						      2 * p.hidden);
		uint64_t fixed = p.elem * (2 * p.vocab * p.hidden + p.hidden);

		p.layers = p.min_bytes > fixed ?
			(p.min_bytes - fixed + per_layer - 1) / per_layer : 1;
	}
	if ((specs = all_specs(&p, &count)) == NULL)
		return 1;

	hcap = 256 + count * 256;
	if ((header = malloc(hcap)) == NULL)
		return 1;
	hlen = (size_t)snprintf(header, hcap,
		"{\"__metadata__\":{\"format\":\"pt\",\"generator\":\"wcache mkmodel\","
		"\"seed\":\"%" PRIu64 "\"}", p.seed);
	for (size_t i = 0; i < count; i++) {
		uint64_t n = spec_bytes(&p, &specs[i]);

		hlen += (size_t)snprintf(header + hlen, hcap - hlen,
			",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRIu64, specs[i].name, p.dtype,
			specs[i].shape[0]);
		if (specs[i].ndim == 2)
			hlen += (size_t)snprintf(header + hlen, hcap - hlen, ",%" PRIu64,
				specs[i].shape[1]);
		hlen += (size_t)snprintf(header + hlen, hcap - hlen,
			"],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + n);
		off += n;
	}
	hlen += (size_t)snprintf(header + hlen, hcap - hlen, "}");
	while (hlen % 8 != 0)
		header[hlen++] = ' ';
	data = off;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", out, (int)getpid());
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) == -1) {
		fprintf(stderr, "mkmodel: %s: %s\n", tmp, strerror(errno));
		return 1;
	}
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
	if ((buf = malloc(8 << 20)) == NULL || write_all(fd, len8, 8) < 0 ||
		write_all(fd, header, hlen) < 0)
		goto fail;
	state = p.seed;
	for (uint64_t left = data; left > 0;) {
		size_t n = left < (8u << 20) ? (size_t)left : (8u << 20);

		pattern_fill(buf, n, p.elem, &state);
		if (write_all(fd, buf, n) < 0)
			goto fail;
		left -= n;
	}
	/* Write beside, fsync, rename: the update procedure the README asks
	 * of every model writer (and clean pages can be evicted at once). */
	if (fsync(fd) == -1 || close(fd) == -1 || rename(tmp, out) == -1) {
		fprintf(stderr, "mkmodel: %s: %s\n", out, strerror(errno));
		unlink(tmp);
		return 1;
	}
	printf("%s: %zu tensors, %" PRIu64 " layers, %" PRIu64 " bytes of %s data\n", out, count,
		p.layers, data, p.dtype);
	free(buf);
	free(header);
	free(specs);
	return 0;
fail:
	fprintf(stderr, "mkmodel: writing %s: %s\n", tmp, strerror(errno));
	close(fd);
	unlink(tmp);
	return 1;
}
