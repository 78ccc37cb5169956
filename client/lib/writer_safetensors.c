/*
 * writer_safetensors.c: writes a gathered model (writer_internal.h) as a
 * standard safetensors file: an 8-byte little-endian header length, a JSON
 * header with __metadata__ when there is metadata, padded with spaces to a
 * multiple of 8 bytes, then the tensors' data back to back in upstream's
 * order: by dtype, widest first in the order of upstream's Dtype enum
 * (safetensors/src/tensor.rs prepare(): "sorting by descending dtype
 * alignment, then by name"), then by name in byte order. The data starts at
 * a multiple of 8 and each dtype's tensors fill whole elements, so every
 * tensor starts at a multiple of its element size: the layout upstream's
 * save_file gives the same tensors (tensor order and offsets; upstream
 * writes __metadata__'s keys in a HashMap's order, we sort them), and the
 * bytes our Python writer (_serialize.py) writes, but for an empty
 * metadata map, which is not written here.
 *
 * The header is built in memory (open_memstream) and held to the limit the
 * reader enforces (ST_MAX_HEADER, format/safetensors.h), so that we never
 * write a file our own reader refuses. writer_safetensors() goes to a path
 * through a temporary file (outfile_begin); writer_safetensors_fd() goes to
 * the memfd a derived artifact's builder (derive.c) hands it, with no
 * temporary name and nothing to rename: tensors of a megabyte or more go
 * from the caller's memory to the descriptor in write(2)s of up to 1 GiB,
 * smaller ones through the buffer, so the file is never assembled in memory.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "lib/outfile.h"
#include "lib/writer.h"
#include "lib/writer_internal.h"
#include "proto/le.h"

/*
 * The dtypes in the order of upstream's Dtype enum (safetensors/src/tensor.rs,
 * "in increasing alignment order"); its writer lays tensors out in the
 * reverse of this order. _serialize.py's _ORDER is the same list.
 */
static const char *const upstream_order[DTYPE_COUNT] = {
	"BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
	"F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
	"F64", "I64", "U64",
};

/*
 * Puts wm's tensors, which wt_sort() left in byte order of names, in
 * upstream's order: the tensors of each dtype, widest dtype first, each
 * group keeping the name order (a stable partition, one pass per dtype).
 */
static int
order_like_upstream(struct wt_model *wm, const char *what)
{
	struct wt_tensor *sorted;
	size_t k = 0;

	if (wm->n < 2)
		return 0;
	if ((sorted = calloc(wm->n, sizeof(*sorted))) == NULL)
		return error_set(-ENOMEM, "%s: out of memory for %zu tensors", what, wm->n);
	for (size_t r = DTYPE_COUNT; r-- > 0;) {
		const struct dtype_info *type = dtype_by_name(upstream_order[r],
			strlen(upstream_order[r]));

		for (size_t i = 0; i < wm->n; i++)
			if (type != NULL && wm->t[i].type->code == type->code)
				sorted[k++] = wm->t[i];
	}
	if (k != wm->n) { /* a dtype missing from upstream_order: a bug here */
		free(sorted);
		return error_set(-EINVAL, "%s: a dtype has no place in the safetensors order",
			what);
	}
	free(wm->t);
	wm->t = sorted;
	return 0;
}

/*
 * Builds the safetensors JSON header of wm (with __metadata__ when there is
 * metadata, tensors in wm's order, data back to back from 0), padded with
 * spaces to a multiple of 8 bytes. Returns a malloc'd buffer.
 */
static int
build_header(struct wt_model *wm, const char *out_path, char **out, size_t *out_len)
{
	char *buf = NULL;
	size_t len = 0;
	uint64_t cur = 0;
	FILE *f = open_memstream(&buf, &len);
	int bad;

	if (f == NULL)
		return error_set(-ENOMEM, "%s: out of memory", out_path);
	fputc('{', f);
	if (wm->nmeta > 0) {
		fputs("\"__metadata__\":{", f);
		for (size_t i = 0; i < wm->nmeta; i++) {
			if (i > 0)
				fputc(',', f);
			json_write_string(f, wm->meta[i].key, wm->meta[i].key_len);
			fputc(':', f);
			json_write_string(f, wm->meta[i].value, wm->meta[i].value_len);
		}
		fputc('}', f);
	}
	for (size_t i = 0; i < wm->n; i++) {
		struct wt_tensor *t = &wm->t[i];

		if (i > 0 || wm->nmeta > 0)
			fputc(',', f);
		json_write_string(f, t->name, t->name_len);
		fprintf(f, ":{\"dtype\":\"%s\",\"shape\":[", t->type->name);
		for (uint32_t d = 0; d < t->ndim; d++)
			fprintf(f, "%s%" PRIu64, d ? "," : "", t->shape[d]);
		/* The caller checked that the sizes add up within 64 bits. */
		t->out_offset = cur;
		cur += t->nbytes;
		fprintf(f, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t->out_offset, cur);
	}
	fputc('}', f);
	while (ftell(f) % 8 != 0)
		fputc(' ', f);
	bad = ferror(f);
	if (fclose(f) != 0 || bad || buf == NULL) {
		free(buf);
		return error_set(-ENOMEM, "%s: out of memory for the JSON header", out_path);
	}
	if (len > ST_MAX_HEADER) {
		free(buf);
		return error_set(-EFBIG, "%s: JSON header of %zu bytes exceeds the %llu-byte"
			" limit", out_path, len, ST_MAX_HEADER);
	}
	*out = buf;
	*out_len = len;
	return 0;
}

/* Checks that wm can be a safetensors file (no reserved name, offsets
 * within 64 bits), puts its tensors in upstream's order and builds its
 * header; what names the output. */
static int
prepare_header(struct wt_model *wm, const char *what, char **header, size_t *header_len)
{
	uint64_t total = 0;
	char q[160];
	int rc;

	for (size_t i = 0; i < wm->n; i++) {
		if (strcmp(wm->t[i].name, "__metadata__") == 0)
			return error_set(-EINVAL, "%s: tensor %s cannot be written to safetensors"
				" (the name is reserved)", what,
				json_quote(q, sizeof(q), wm->t[i].name, wm->t[i].name_len));
		if (__builtin_add_overflow(total, wm->t[i].nbytes, &total))
			return error_set(-EOVERFLOW, "%s: model too large for 64-bit offsets",
				what);
	}
	if ((rc = order_like_upstream(wm, what)) < 0)
		return rc;
	return build_header(wm, what, header, header_len);
}

/* Appends the whole file: the header's length, the header, the data. */
static int
put_file(struct outfile *o, const struct wt_model *wm, const char *header, size_t header_len)
{
	uint8_t prefix[8];
	int rc;

	put_le64(prefix, header_len);
	if ((rc = outfile_put(o, prefix, sizeof(prefix))) < 0 ||
		(rc = outfile_put(o, header, header_len)) < 0)
		return rc;
	return wt_write_data(o, wm, 0);
}

int
wt_write_safetensors(struct wt_model *wm, const char *out_path)
{
	struct outfile o;
	char *header = NULL;
	size_t header_len = 0;
	int rc;

	if ((rc = prepare_header(wm, out_path, &header, &header_len)) < 0)
		return rc;
	if ((rc = outfile_begin(out_path, &o)) == 0) {
		if ((rc = put_file(&o, wm, header, header_len)) == 0)
			rc = outfile_commit(&o);
		outfile_abort(&o); /* unlinks the temporary file unless it was renamed */
	}
	free(header);
	return rc;
}

int
writer_safetensors(const wc_model *m, const char *out_path)
{
	struct wt_model wm;
	int rc;

	if ((rc = wt_from_model(m, out_path, &wm)) < 0)
		return rc;
	rc = wt_write_safetensors(&wm, out_path);
	wt_free(&wm);
	return rc;
}

int
writer_safetensors_fd(const wc_tensor *tensors, size_t n, const char *const *metadata,
	size_t nmeta, int fd, const char *what)
{
	return writer_safetensors_fd_each(tensors, n, metadata, nmeta, fd, what, NULL, NULL);
}

int
writer_safetensors_fd_each(const wc_tensor *tensors, size_t n, const char *const *metadata,
	size_t nmeta, int fd, const char *what, wc_written_fn *written, void *arg)
{
	struct wt_model wm;
	struct outfile o;
	char *header = NULL;
	size_t header_len = 0;
	int rc;

	if ((rc = wt_from_tensors(tensors, n, metadata, nmeta, what, &wm)) < 0)
		return rc;
	wm.written = written;
	wm.written_arg = arg;
	if ((rc = prepare_header(&wm, what, &header, &header_len)) == 0 &&
		(rc = outfile_begin_fd(fd, what, &o)) == 0) {
		if ((rc = put_file(&o, &wm, header, header_len)) == 0)
			rc = outfile_flush(&o);
		outfile_abort(&o); /* frees the buffer; fd stays the caller's */
	}
	free(header);
	wt_free(&wm);
	return rc;
}
