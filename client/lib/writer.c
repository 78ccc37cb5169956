/*
 * writer.c: gathers what is to be written into a flat list of tensors
 * sorted by name (struct wt_model, writer_internal.h), and writes their
 * data; the format writers (writer_weig.c, writer_safetensors.c) lay the
 * rest of a file out around it (proto/FORMAT.md).
 *
 * A model comes from one of three places: a library model (wt_from_model,
 * for writer_weig() and writer_safetensors()), a caller's tensors
 * (wt_from_tensors, for writer_safetensors_fd(), checked as a reader would
 * check them), or the compiled index of a big-endian WEIG file
 * (wt_from_index, for writer_from_big_endian()). Every tensor's data points
 * into memory the caller keeps (a model's read-only mappings, or the
 * caller's own tensors): gathering copies no data, and the writers copy it
 * to the file in large writes, byte-swapped through the output buffer when
 * a big-endian file is converted; a caller's check (writer_model_checked())
 * runs once all the data is written, before the commit. Sorting here, once, gives every format
 * the same order and finds duplicate names, which the writer does not
 * trust its callers to have ruled out.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json.h"
#include "format/dtype.h"
#include "format/index.h"
#include "lib/outfile.h"
#include "lib/writer.h"
#include "lib/writer_internal.h"

/* ---- gathering a model ---- */

void
wt_free(struct wt_model *wm)
{
	free(wm->t);
	free(wm->meta);
	memset(wm, 0, sizeof(*wm));
}

/* Orders tensors by name, in byte order. */
static int
wt_tensor_cmp(const void *a, const void *b)
{
	return strcmp(((const struct wt_tensor *)a)->name, ((const struct wt_tensor *)b)->name);
}

/* Orders metadata entries by key, in byte order. */
static int
wt_meta_cmp(const void *a, const void *b)
{
	return strcmp(((const struct wt_meta *)a)->key, ((const struct wt_meta *)b)->key);
}

/* Sorts the tensors and metadata and rejects duplicates (which a model from
 * the library cannot have, but the writer does not rely on it). */
static int
wt_sort(struct wt_model *wm, const char *what)
{
	char q[160];

	qsort(wm->t, wm->n, sizeof(*wm->t), wt_tensor_cmp);
	qsort(wm->meta, wm->nmeta, sizeof(*wm->meta), wt_meta_cmp);
	for (size_t i = 1; i < wm->n; i++)
		if (strcmp(wm->t[i - 1].name, wm->t[i].name) == 0)
			return error_set(-EINVAL, "%s: tensor %s: duplicate name", what,
				json_quote(q, sizeof(q), wm->t[i].name, wm->t[i].name_len));
	for (size_t i = 1; i < wm->nmeta; i++)
		if (strcmp(wm->meta[i - 1].key, wm->meta[i].key) == 0)
			return error_set(-EINVAL, "%s: metadata key %s: duplicate key", what,
				json_quote(q, sizeof(q), wm->meta[i].key, wm->meta[i].key_len));
	return 0;
}

int
wt_from_model(const wc_model *m, const char *out_path, struct wt_model *wm)
{
	size_t n = wc_model_count(m), nmeta = 0;
	const char *key, *value;
	char q[160];
	int rc;

	memset(wm, 0, sizeof(*wm));
	while (wc_model_metadata_at(m, nmeta, &key, &value) == 0)
		nmeta++;
	wm->t = calloc(n > 0 ? n : 1, sizeof(*wm->t));
	wm->meta = calloc(nmeta > 0 ? nmeta : 1, sizeof(*wm->meta));
	if (wm->t == NULL || wm->meta == NULL) {
		wt_free(wm);
		return error_set(-ENOMEM, "%s: out of memory for %zu tensors", out_path, n);
	}
	for (size_t i = 0; i < n; i++) {
		struct wt_tensor *t = &wm->t[i];
		wc_tensor ten;

		if ((rc = wc_model_tensor(m, i, &ten)) < 0)
			goto fail;
		t->name = ten.name;
		t->name_len = strlen(ten.name);
		t->type = dtype_by_name(ten.dtype, strlen(ten.dtype));
		if (t->type == NULL) {
			rc = error_set(-EINVAL, "%s: tensor %s: unknown dtype %s", out_path,
				json_quote(q, sizeof(q), t->name, t->name_len), ten.dtype);
			goto fail;
		}
		t->ndim = ten.ndim;
		t->shape = ten.shape;
		t->data = ten.data;
		t->nbytes = ten.nbytes;
	}
	wm->n = n;
	for (size_t i = 0; i < nmeta; i++) {
		struct wt_meta *e = &wm->meta[i];

		if ((rc = wc_model_metadata_at(m, i, &e->key, &e->value)) < 0)
			goto fail;
		e->key_len = strlen(e->key);
		e->value_len = strlen(e->value);
	}
	wm->nmeta = nmeta;
	if ((rc = wt_sort(wm, out_path)) < 0)
		goto fail;
	return 0;
fail:
	wt_free(wm);
	return rc;
}

int
wt_from_tensors(const wc_tensor *tensors, size_t n, const char *const *metadata, size_t nmeta,
	const char *what, struct wt_model *wm)
{
	char q[160];
	int rc = 0;

	memset(wm, 0, sizeof(*wm));
	if ((n > 0 && tensors == NULL) || (nmeta > 0 && metadata == NULL))
		return error_set(-EINVAL, "%s: no tensors or metadata given", what);
	if (nmeta > SIZE_MAX / 2)
		return error_set(-EINVAL, "%s: %zu metadata pairs", what, nmeta);
	wm->t = calloc(n > 0 ? n : 1, sizeof(*wm->t));
	wm->meta = calloc(nmeta > 0 ? nmeta : 1, sizeof(*wm->meta));
	if (wm->t == NULL || wm->meta == NULL) {
		wt_free(wm);
		return error_set(-ENOMEM, "%s: out of memory for %zu tensors", what, n);
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		const wc_tensor *ten = &tensors[i];
		struct wt_tensor *t = &wm->t[i];
		uint64_t elements, nbytes;

		if (ten->name == NULL || ten->dtype == NULL) {
			rc = error_set(-EINVAL, "%s: tensor %zu has no name or no dtype", what, i);
			break;
		}
		t->name = ten->name;
		t->name_len = strlen(ten->name);
		json_quote(q, sizeof(q), t->name, t->name_len);
		t->type = dtype_by_name(ten->dtype, strlen(ten->dtype));
		/* The names the reader refuses (safetensors.c): refused here,
		 * before a byte is written rather than after the whole file. */
		if (t->name_len == 0)
			rc = error_set(-EINVAL, "%s: tensor %zu has an empty name", what, i);
		else if (t->name_len > INDEX_MAX_NAME)
			rc = error_set(-EINVAL, "%s: tensor %s: name of %zu bytes is longer "
				"than %d", what, q, t->name_len, INDEX_MAX_NAME);
		else if (!json_utf8_valid(t->name, t->name_len))
			rc = error_set(-EINVAL, "%s: tensor %s: name is not valid UTF-8", what, q);
		else if (t->type == NULL)
			rc = error_set(-EINVAL, "%s: tensor %s: unknown dtype \"%.32s\"", what, q,
				ten->dtype);
		else if (ten->ndim > INDEX_MAX_NDIM || (ten->ndim > 0 && ten->shape == NULL))
			rc = error_set(-EINVAL, "%s: tensor %s: %u dimensions (at most %u, with a "
				"shape)", what, q, ten->ndim, INDEX_MAX_NDIM);
		else if (dtype_nbytes(t->type, ten->shape, ten->ndim, &elements, &nbytes) < 0 ||
			nbytes != ten->nbytes)
			rc = error_set(-EINVAL, "%s: tensor %s: %" PRIu64 " bytes of data do not "
				"make its shape of %s", what, q, ten->nbytes, t->type->name);
		else if (ten->data == NULL && ten->nbytes > 0)
			rc = error_set(-EINVAL, "%s: tensor %s: no data", what, q);
		t->ndim = ten->ndim;
		t->shape = ten->shape;
		t->data = ten->data;
		t->nbytes = ten->nbytes;
		t->index = i;
	}
	wm->n = n;
	for (size_t i = 0; i < nmeta && rc == 0; i++) {
		struct wt_meta *e = &wm->meta[i];

		e->key = metadata[2 * i];
		e->value = metadata[2 * i + 1];
		if (e->key == NULL || e->value == NULL) {
			rc = error_set(-EINVAL, "%s: metadata pair %zu has no key or no value",
				what, i);
			break;
		}
		e->key_len = strlen(e->key);
		e->value_len = strlen(e->value);
		if (!json_utf8_valid(e->key, e->key_len) ||
			!json_utf8_valid(e->value, e->value_len))
			rc = error_set(-EINVAL, "%s: metadata key %s: the key or its value is "
				"not valid UTF-8", what,
				json_quote(q, sizeof(q), e->key, e->key_len));
	}
	wm->nmeta = nmeta;
	if (rc == 0)
		rc = wt_sort(wm, what);
	if (rc < 0)
		wt_free(wm);
	return rc;
}

int
wt_from_index(const uint8_t *blob, size_t len, const struct wc_file *f, struct wt_model *wm)
{
	struct index_header h;
	int rc;

	memset(wm, 0, sizeof(*wm));
	if ((rc = index_open(blob, len, &h)) < 0)
		return rc;
	wm->t = calloc(h.tensor_count > 0 ? (size_t)h.tensor_count : 1, sizeof(*wm->t));
	wm->meta = calloc(h.meta_count > 0 ? (size_t)h.meta_count : 1, sizeof(*wm->meta));
	if (wm->t == NULL || wm->meta == NULL) {
		wt_free(wm);
		return error_set(-ENOMEM, "%s: out of memory", f->path);
	}
	wm->swap = 1;
	for (uint64_t i = 0; i < h.tensor_count; i++) {
		struct wt_tensor *t = &wm->t[i];
		struct index_tensor it;

		if ((rc = index_tensor_at(blob, &h, i, &it)) < 0)
			goto fail;
		/* weig_parse_big_endian checked the range against the file. */
		t->name = it.name;
		t->name_len = strlen(it.name);
		t->type = dtype_by_code(it.dtype);
		t->ndim = it.ndim;
		t->shape = it.shape;
		t->data = f->base + it.offset;
		t->nbytes = it.nbytes;
		if (t->type == NULL || it.offset > f->size || it.nbytes > f->size - it.offset) {
			char q[160];

			rc = error_set(-EINVAL, "%s: tensor %s: inconsistent index", f->path,
				json_quote(q, sizeof(q), it.name, strlen(it.name)));
			goto fail;
		}
		wm->n++;
	}
	for (uint64_t i = 0; i < h.meta_count; i++) {
		struct wt_meta *e = &wm->meta[i];

		if ((rc = index_meta_at(blob, &h, i, &e->key, &e->value)) < 0)
			goto fail;
		e->key_len = strlen(e->key);
		e->value_len = strlen(e->value);
		wm->nmeta++;
	}
	if ((rc = wt_sort(wm, f->path)) < 0)
		goto fail;
	return 0;
fail:
	wt_free(wm);
	return rc;
}

/* ---- writing the data ---- */

int
wt_write_data(struct outfile *o, const struct wt_model *wm, int aligned)
{
	int rc;

	for (size_t i = 0; i < wm->n; i++) {
		const struct wt_tensor *t = &wm->t[i];
		unsigned esize = wm->swap ? writer_swap_size(t->type->code) : 1;

		if (aligned && (rc = outfile_zeros(o, t->out_offset - o->pos)) < 0)
			return rc;
		if ((rc = outfile_put_converted(o, t->data, t->nbytes, esize,
			writer_swap_elements)) < 0)
			return rc;
		/* Written, or copied into the buffer: the caller may free it. */
		if (wm->written != NULL)
			wm->written(t->index, wm->written_arg);
	}
	/* Every byte of data has been read: what the inputs hold now no longer
	 * matters, what they held while it was read does. */
	if (wm->check != NULL && (rc = wm->check(wm->check_ctx)) < 0)
		return rc;
	return 0;
}

int
writer_model_checked(const wc_model *m, enum writer_format fmt, const char *out_path,
	writer_check_fn *check, void *ctx)
{
	struct wt_model wm;
	int rc;

	if (fmt != WRITER_WEIG && fmt != WRITER_SAFETENSORS)
		return error_set(-EINVAL, "%s: unknown output format %d", out_path, (int)fmt);
	if ((rc = wt_from_model(m, out_path, &wm)) < 0)
		return rc;
	wm.check = check;
	wm.check_ctx = ctx;
	rc = fmt == WRITER_WEIG ? wt_write_weig(&wm, out_path) :
		wt_write_safetensors(&wm, out_path);
	wt_free(&wm);
	return rc;
}

/* ---- interruption ---- */

void
writer_remove_temporaries(void)
{
	outfile_remove_temporaries();
}
