/*
 * writer_internal.h: what the writer's files share. writer.c gathers a
 * model (a library model, a caller's tensors, or a big-endian file's index)
 * into a list of tensors sorted by name, struct wt_model, and writes their
 * data; writer_weig.c lays out and writes WEIG files, writer_safetensors.c
 * safetensors files; writer_big_endian.c swaps bytes and converts
 * big-endian WEIG files. All of them write through outfile.h. Not for other
 * modules: they use writer.h.
 */
#ifndef WC_WRITER_INTERNAL_H
#define WC_WRITER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "lib/outfile.h"
#include "lib/wcache.h"
#include "lib/writer.h"

struct dtype_info;

/* One tensor to write. name is NUL-terminated; data is read-only. */
struct wt_tensor {
	const char *name;
	size_t name_len;
	const struct dtype_info *type;
	uint32_t ndim;
	const uint64_t *shape;
	const uint8_t *data;
	uint64_t nbytes;
	uint64_t out_offset;   /* WEIG: absolute; safetensors: from the data start */
	uint64_t name_offset;  /* WEIG only */
	uint64_t shape_offset; /* WEIG only */
	size_t index;          /* the caller's index (wt_from_tensors) */
};

/* One metadata entry to write; strings are NUL-terminated. */
struct wt_meta {
	const char *key;
	const char *value;
	size_t key_len;
	size_t value_len;
	uint64_t key_offset;   /* WEIG only */
	uint64_t value_offset; /* WEIG only */
};

/* A model gathered for writing; it owns the arrays, not what they point to. */
struct wt_model {
	struct wt_tensor *t;
	size_t n;
	struct wt_meta *meta;
	size_t nmeta;
	int swap; /* 1: the data is big-endian, swap each element */
	writer_check_fn *check; /* or NULL: called by wt_write_data() after the data */
	void *check_ctx;
	/* or NULL: called by wt_write_data() once each tensor's data is read,
	 * with its index (wc_build_publish_each) */
	wc_written_fn *written;
	void *written_arg;
};

/* writer.c: frees what a wt_model owns; safe on a zeroed one. */
void wt_free(struct wt_model *wm);

/* writer.c: gathers the tensors and metadata of a library model. */
int wt_from_model(const wc_model *m, const char *out_path, struct wt_model *wm);

/*
 * writer.c: gathers a caller's tensors and metadata pairs (metadata[2i] the
 * key, metadata[2i + 1] the value) for writing, checking what a reader would
 * refuse: a missing, empty, too long (over INDEX_MAX_NAME bytes) or not
 * UTF-8 name, a missing or unknown dtype, too many dimensions, a byte count
 * that is not the shape's, data missing for a non-empty tensor, metadata
 * that is not UTF-8 (duplicates: wt_sort). The arrays point at the caller's
 * strings and data.
 */
int wt_from_tensors(const wc_tensor *tensors, size_t n, const char *const *metadata, size_t nmeta,
	const char *what, struct wt_model *wm);

/*
 * writer.c: gathers the tensors of a validated big-endian WEIG file through
 * its compiled index: names, shapes and metadata come from the index
 * (already converted to host order by the parser); data points into the
 * file.
 */
int wt_from_index(const uint8_t *blob, size_t len, const struct wc_file *f,
	struct wt_model *wm);

/* writer.c: appends each tensor's data at its offset (zero padding
 * between, when aligned), swapped when wm->swap says the data is
 * big-endian; then calls wm->check, whose failure fails the write. */
int wt_write_data(struct outfile *o, const struct wt_model *wm, int aligned);

/* writer_weig.c: writes wm as WEIG to out_path, atomically. */
int wt_write_weig(struct wt_model *wm, const char *out_path);

/* writer_safetensors.c: writes wm as safetensors to out_path, atomically. */
int wt_write_safetensors(struct wt_model *wm, const char *out_path);

#endif
