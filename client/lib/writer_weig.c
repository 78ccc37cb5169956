/*
 * writer_weig.c: writes a gathered model (writer_internal.h) as a WEIG
 * file, the native format whose tensor records the compiled index shares
 * (proto/FORMAT.md; the constants are format/weig.h's, which the reader
 * uses too, so the two cannot drift apart).
 *
 * Everything before the data region (header, records, metadata table,
 * shapes, strings) is laid out first and built in memory, its offsets
 * checked for 64-bit overflow; then the data is streamed after it: the
 * data region starts on a page (4096), so it can be mapped, locked and
 * advised without the tables, and each tensor on a multiple of 64 (a cache
 * line, what SIMD loads want). The file appears at its path only when
 * complete (outfile.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "format/dtype.h"
#include "format/weig.h"
#include "lib/outfile.h"
#include "lib/writer.h"
#include "lib/writer_internal.h"
#include "proto/le.h"

/* *acc += v, or -EOVERFLOW. */
static int
add_u64(uint64_t *acc, uint64_t v)
{
	return __builtin_add_overflow(*acc, v, acc) ? -EOVERFLOW : 0;
}

/* Rounds *v up to a multiple of align (a power of two), or -EOVERFLOW. */
static int
align_u64(uint64_t *v, uint64_t align)
{
	if (add_u64(v, align - 1) < 0)
		return -EOVERFLOW;
	*v &= ~(align - 1);
	return 0;
}

/*
 * Lays out a WEIG file: records at 64, the metadata table after them, the
 * shapes (8-aligned), the strings, then the data region at the next multiple
 * of 4096 with each tensor at a multiple of 64, then the trailer at a multiple
 * of 8. Fills the offsets in wm and returns the data region's offset and the
 * file's size.
 */
static int
lay_out(struct wt_model *wm, uint64_t *data_offset, uint64_t *file_size)
{
	uint64_t off = WEIG_HEADER_SIZE, cur;
	int rc = 0;

	rc |= add_u64(&off, (uint64_t)wm->n * WEIG_RECORD_SIZE);
	rc |= add_u64(&off, (uint64_t)wm->nmeta * WEIG_META_ENTRY_SIZE);
	for (size_t i = 0; i < wm->n; i++) {
		wm->t[i].shape_offset = off;
		rc |= add_u64(&off, (uint64_t)wm->t[i].ndim * 8);
	}
	for (size_t i = 0; i < wm->n; i++) {
		wm->t[i].name_offset = off;
		rc |= add_u64(&off, (uint64_t)wm->t[i].name_len + 1);
	}
	for (size_t i = 0; i < wm->nmeta; i++) {
		wm->meta[i].key_offset = off;
		rc |= add_u64(&off, (uint64_t)wm->meta[i].key_len + 1);
		wm->meta[i].value_offset = off;
		rc |= add_u64(&off, (uint64_t)wm->meta[i].value_len + 1);
	}
	rc |= align_u64(&off, WEIG_DATA_ALIGN);
	*data_offset = off;
	cur = off;
	for (size_t i = 0; i < wm->n; i++) {
		rc |= align_u64(&cur, WEIG_TENSOR_ALIGN);
		wm->t[i].out_offset = cur;
		rc |= add_u64(&cur, wm->t[i].nbytes);
	}
	rc |= align_u64(&cur, 8);
	rc |= add_u64(&cur, WEIG_TRAILER_SIZE);
	*file_size = cur;
	return rc != 0 ? -EOVERFLOW : 0;
}

/*
 * Builds everything before the data region: header, records, metadata table,
 * shapes and strings. Returns a malloc'd block of data_offset bytes.
 */
static uint8_t *
build_head(const struct wt_model *wm, uint64_t data_offset, uint64_t file_size)
{
	uint8_t *h = calloc(1, (size_t)data_offset);
	uint64_t meta_table = WEIG_HEADER_SIZE + (uint64_t)wm->n * WEIG_RECORD_SIZE;

	if (h == NULL)
		return NULL;
	put_le32(h + 0, WEIG_MAGIC);
	put_le32(h + 4, WEIG_VERSION);
	put_le64(h + 8, wm->n);
	put_le64(h + 16, WEIG_HEADER_SIZE);
	put_le64(h + 24, data_offset);
	put_le64(h + 32, file_size);
	if (wm->nmeta > 0) {
		put_le64(h + 40, WEIG_FLAG_METADATA);
		put_le64(h + 48, meta_table);
		put_le64(h + 56, wm->nmeta);
	}
	for (size_t i = 0; i < wm->n; i++) {
		const struct wt_tensor *t = &wm->t[i];
		uint8_t *rec = h + WEIG_HEADER_SIZE + i * WEIG_RECORD_SIZE;

		put_le64(rec + 0, t->name_offset);
		put_le32(rec + 8, t->type->code);
		put_le32(rec + 12, 0);
		put_le64(rec + 16, t->shape_offset);
		put_le64(rec + 24, t->ndim);
		put_le64(rec + 32, t->out_offset);
		put_le64(rec + 40, t->nbytes);
		for (size_t d = 0; d < t->ndim; d++)
			put_le64(h + t->shape_offset + 8 * d, t->shape[d]);
		memcpy(h + t->name_offset, t->name, t->name_len + 1);
	}
	for (size_t i = 0; i < wm->nmeta; i++) {
		const struct wt_meta *e = &wm->meta[i];
		uint8_t *ent = h + meta_table + i * WEIG_META_ENTRY_SIZE;

		put_le64(ent + 0, e->key_offset);
		put_le64(ent + 8, e->value_offset);
		memcpy(h + e->key_offset, e->key, e->key_len + 1);
		memcpy(h + e->value_offset, e->value, e->value_len + 1);
	}
	return h;
}

int
wt_write_weig(struct wt_model *wm, const char *out_path)
{
	struct outfile o;
	uint64_t data_offset, file_size;
	uint8_t trailer[WEIG_TRAILER_SIZE], *head;
	int rc;

	if (lay_out(wm, &data_offset, &file_size) < 0)
		return error_set(-EOVERFLOW, "%s: model too large for 64-bit offsets", out_path);
	if (data_offset > SIZE_MAX)
		return error_set(-EFBIG, "%s: tables of %" PRIu64 " bytes do not fit memory",
			out_path, data_offset);
	head = build_head(wm, data_offset, file_size);
	if (head == NULL)
		return error_set(-ENOMEM, "%s: out of memory for %" PRIu64 " bytes of tables",
			out_path, data_offset);
	memcpy(trailer, WEIG_TRAILER_MAGIC, 8);
	put_le64(trailer + 8, file_size);
	if ((rc = outfile_begin(out_path, &o)) == 0) {
		if ((rc = outfile_put(&o, head, data_offset)) == 0 &&
			(rc = wt_write_data(&o, wm, 1)) == 0 &&
			(rc = outfile_zeros(&o, file_size - WEIG_TRAILER_SIZE - o.pos)) == 0 &&
			(rc = outfile_put(&o, trailer, sizeof(trailer))) == 0)
			rc = outfile_commit(&o);
		outfile_abort(&o); /* unlinks the temporary file unless it was renamed */
	}
	free(head);
	return rc;
}

int
writer_weig(const wc_model *m, const char *out_path)
{
	struct wt_model wm;
	int rc;

	if ((rc = wt_from_model(m, out_path, &wm)) < 0)
		return rc;
	rc = wt_write_weig(&wm, out_path);
	wt_free(&wm);
	return rc;
}
