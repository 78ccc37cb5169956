/*
 * writer.c: writes models as WEIG or safetensors files, and converts
 * big-endian WEIG files to little-endian (proto/FORMAT.md).
 *
 * Every writer first gathers the model into a flat list of tensors sorted by
 * name (struct wt_model) whose data point into read-only mappings, then lays
 * the output out and streams it through a buffered output file. The output
 * is never partial: it is written to a temporary file in the same directory
 * (so rename is atomic), fsync'd, and renamed over the output path; any
 * failure unlinks the temporary file and leaves the output path as it was.
 * Data is copied from the mappings in large writes, byte-swapped through the
 * buffer when a big-endian file is converted.
 *
 * writer_safetensors_fd() is the other way out: a derived artifact's
 * builder (derive.c) writes the caller's tensors straight into a memfd it
 * then hands to wcached. There is no temporary name and nothing to rename;
 * tensors of a megabyte or more go from the caller's memory to the
 * descriptor in write(2)s of up to 1 GiB, smaller ones through the buffer,
 * so the file is never assembled in memory.
 */
#include <byteswap.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/dtype.h"
#include "base/error.h"
#include "base/file.h"
#include "format/index.h"
#include "proto/le.h"
#include "base/json.h"
#include "format/open.h"
#include "format/safetensors.h"
#include "format/source.h"
#include "lib/writer.h"

#define OUT_BUFFER_SIZE (1u << 20)     /* multiple of 8: swapped chunks fit whole */
#define OUT_MAX_WRITE (1u << 30)       /* one write(2) at most */

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
};

/* An output file being written under a temporary name, or a descriptor
 * the caller owns (out_begin_fd: no temporary name, never closed here). */
struct out_file {
	const char *path; /* the final path (or what the descriptor is), for messages */
	char *tmp;        /* the temporary path, NULL once renamed or for a descriptor */
	int fd;
	int borrowed;     /* 1: fd is the caller's; out_abort() leaves it open */
	uint8_t *buf;
	size_t used;
	uint64_t pos;     /* bytes written so far, buffered ones included */
};

/* ---- byte swapping ---- */

void
writer_swap_elements(uint8_t *dst, const uint8_t *src, size_t n, unsigned elem_size)
{
	size_t i;

	switch (elem_size) {
	case 2:
		for (i = 0; i + 2 <= n; i += 2) {
			uint16_t v;

			memcpy(&v, src + i, 2);
			v = bswap_16(v);
			memcpy(dst + i, &v, 2);
		}
		break;
	case 4:
		for (i = 0; i + 4 <= n; i += 4) {
			uint32_t v;

			memcpy(&v, src + i, 4);
			v = bswap_32(v);
			memcpy(dst + i, &v, 4);
		}
		break;
	case 8:
		for (i = 0; i + 8 <= n; i += 8) {
			uint64_t v;

			memcpy(&v, src + i, 8);
			v = bswap_64(v);
			memcpy(dst + i, &v, 8);
		}
		break;
	default:
		if (dst != src)
			memmove(dst, src, n);
		break;
	}
}

unsigned
writer_swap_size(uint32_t dtype)
{
	const struct dtype_info *t = dtype_by_code(dtype);

	if (t == NULL)
		return 0;
	/* A complex number is two 4-byte floats, each in the file's byte order. */
	if (strcmp(t->name, "C64") == 0)
		return 4;
	if (t->bits == 16 || t->bits == 32 || t->bits == 64)
		return t->bits / 8;
	return 1; /* bytes and packed sub-byte types have no byte order */
}

/* ---- the output file ---- */

/*
 * Creates a temporary file beside path (".NAME.XXXXXX" in path's directory),
 * O_CLOEXEC, mode 0644.
 */
static int
out_begin(const char *path, struct out_file *o)
{
	const char *slash = strrchr(path, '/');
	const char *base = slash != NULL ? slash + 1 : path;
	int e;

	memset(o, 0, sizeof(*o));
	o->path = path;
	o->fd = -1;
	if (*base == '\0')
		return error_set(-EISDIR, "%s: output path names a directory", path);
	/* Keep the temporary name within NAME_MAX whatever the base's length. */
	if (asprintf(&o->tmp, "%.*s.%.200s.XXXXXX", (int)(base - path), path, base) < 0) {
		o->tmp = NULL;
		return error_set(-ENOMEM, "%s: out of memory", path);
	}
	o->fd = mkostemp(o->tmp, O_CLOEXEC);
	if (o->fd < 0) {
		e = errno;
		free(o->tmp);
		o->tmp = NULL;
		return error_set(-e, "%s: cannot create a temporary file beside it: %s", path,
			strerror(e));
	}
	if (fchmod(o->fd, 0644) < 0) {
		e = errno;
		goto fail;
	}
	o->buf = malloc(OUT_BUFFER_SIZE);
	if (o->buf == NULL) {
		e = ENOMEM;
		goto fail;
	}
	return 0;
fail:
	close(o->fd);
	unlink(o->tmp);
	free(o->tmp);
	o->tmp = NULL;
	o->fd = -1;
	return error_set(-e, "%s: %s", path, strerror(e));
}

/* Closes and unlinks the temporary file; safe after out_commit() and on a
 * zeroed or failed out_file. */
static void
out_abort(struct out_file *o)
{
	if (o->fd >= 0 && !o->borrowed)
		close(o->fd);
	if (o->tmp != NULL)
		unlink(o->tmp);
	free(o->tmp);
	free(o->buf);
	o->fd = -1;
	o->tmp = NULL;
	o->buf = NULL;
}

/*
 * Starts writing to the caller's descriptor fd, at its current offset; what
 * names it in messages. Nothing is renamed or synced: out_finish_fd()
 * flushes, and out_abort() frees the buffer and leaves fd open.
 */
static int
out_begin_fd(int fd, const char *what, struct out_file *o)
{
	memset(o, 0, sizeof(*o));
	o->path = what;
	o->fd = fd;
	o->borrowed = 1;
	if ((o->buf = malloc(OUT_BUFFER_SIZE)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", what);
	return 0;
}

/* Writes all of p[0..n) to the file, unbuffered. */
static int
out_write_all(const struct out_file *o, const uint8_t *p, uint64_t n)
{
	while (n > 0) {
		size_t chunk = n > OUT_MAX_WRITE ? OUT_MAX_WRITE : (size_t)n;
		ssize_t w = write(o->fd, p, chunk);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return error_set(-errno, "%s: write: %s", o->path, strerror(errno));
		}
		if (w == 0)
			return error_set(-EIO, "%s: write returned 0", o->path);
		p += w;
		n -= (uint64_t)w;
	}
	return 0;
}

/* Writes out the buffer. */
static int
out_flush(struct out_file *o)
{
	int rc = out_write_all(o, o->buf, o->used);

	o->used = 0;
	return rc;
}

/* Appends p[0..n); large blocks bypass the buffer. */
static int
out_put(struct out_file *o, const void *p, uint64_t n)
{
	int rc;

	if (n > OUT_BUFFER_SIZE - o->used) {
		if ((rc = out_flush(o)) < 0)
			return rc;
		if (n >= OUT_BUFFER_SIZE) {
			o->pos += n;
			return out_write_all(o, p, n);
		}
	}
	if (n > 0)
		memcpy(o->buf + o->used, p, (size_t)n);
	o->used += (size_t)n;
	o->pos += n;
	return 0;
}

/* Appends n zero bytes. */
static int
out_zeros(struct out_file *o, uint64_t n)
{
	int rc;

	while (n > 0) {
		size_t chunk;

		if (o->used == OUT_BUFFER_SIZE && (rc = out_flush(o)) < 0)
			return rc;
		chunk = OUT_BUFFER_SIZE - o->used;
		if (chunk > n)
			chunk = (size_t)n;
		memset(o->buf + o->used, 0, chunk);
		o->used += chunk;
		o->pos += chunk;
		n -= chunk;
	}
	return 0;
}

/* Appends p[0..n) with each elem_size-byte element byte-swapped. */
static int
out_put_swapped(struct out_file *o, const uint8_t *p, uint64_t n, unsigned elem_size)
{
	int rc;

	if (elem_size <= 1)
		return out_put(o, p, n);
	if (n % elem_size != 0)
		return error_set(-EINVAL, "%s: %" PRIu64 " bytes are not whole %u-byte elements",
			o->path, n, elem_size);
	while (n > 0) {
		size_t chunk = OUT_BUFFER_SIZE - o->used;

		chunk -= chunk % elem_size;
		if (chunk == 0) {
			if ((rc = out_flush(o)) < 0)
				return rc;
			continue;
		}
		if (chunk > n)
			chunk = (size_t)n;
		writer_swap_elements(o->buf + o->used, p, chunk, elem_size);
		o->used += chunk;
		o->pos += chunk;
		p += chunk;
		n -= chunk;
	}
	return 0;
}

/*
 * Flushes, fsyncs and closes the temporary file and renames it over the
 * output path, then fsyncs the directory so the rename is durable too.
 */
static int
out_commit(struct out_file *o)
{
	const char *slash = strrchr(o->path, '/');
	char *dir;
	int rc, dfd;

	if ((rc = out_flush(o)) < 0)
		return rc;
	if (fsync(o->fd) < 0)
		return error_set(-errno, "%s: fsync: %s", o->path, strerror(errno));
	rc = close(o->fd);
	o->fd = -1;
	if (rc < 0)
		return error_set(-errno, "%s: close: %s", o->path, strerror(errno));
	if (rename(o->tmp, o->path) < 0)
		return error_set(-errno, "%s: rename from %s: %s", o->path, o->tmp,
			strerror(errno));
	free(o->tmp);
	o->tmp = NULL;
	/* Best effort: the file is complete; a failing directory fsync (some
	 * filesystems refuse it) does not make it less so. */
	if (slash == NULL)
		dir = strdup(".");
	else if (slash == o->path)
		dir = strdup("/");
	else
		dir = strndup(o->path, (size_t)(slash - o->path));
	if (dir != NULL) {
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			(void)fsync(dfd);
			close(dfd);
		}
		free(dir);
	}
	return 0;
}

/* ---- gathering a model ---- */

/* Frees what a wt_model owns; safe on a zeroed one. */
static void
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

/* Gathers the tensors and metadata of a library model. */
static int
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

/* ---- WEIG ---- */

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
weig_layout(struct wt_model *wm, uint64_t *data_offset, uint64_t *file_size)
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
weig_head(const struct wt_model *wm, uint64_t data_offset, uint64_t file_size)
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

/* Appends each tensor's data at its offset (zero padding between), swapped
 * when wm->swap says the data is big-endian. */
static int
write_data(struct out_file *o, const struct wt_model *wm, int aligned)
{
	int rc;

	for (size_t i = 0; i < wm->n; i++) {
		const struct wt_tensor *t = &wm->t[i];
		unsigned esize = wm->swap ? writer_swap_size(t->type->code) : 1;

		if (aligned && (rc = out_zeros(o, t->out_offset - o->pos)) < 0)
			return rc;
		if ((rc = out_put_swapped(o, t->data, t->nbytes, esize)) < 0)
			return rc;
	}
	return 0;
}

/* Writes wm as WEIG to out_path, atomically. */
static int
write_weig(struct wt_model *wm, const char *out_path)
{
	struct out_file o;
	uint64_t data_offset, file_size;
	uint8_t trailer[WEIG_TRAILER_SIZE], *head;
	int rc;

	if (weig_layout(wm, &data_offset, &file_size) < 0)
		return error_set(-EOVERFLOW, "%s: model too large for 64-bit offsets", out_path);
	if (data_offset > SIZE_MAX)
		return error_set(-EFBIG, "%s: tables of %" PRIu64 " bytes do not fit memory",
			out_path, data_offset);
	head = weig_head(wm, data_offset, file_size);
	if (head == NULL)
		return error_set(-ENOMEM, "%s: out of memory for %" PRIu64 " bytes of tables",
			out_path, data_offset);
	memcpy(trailer, WEIG_TRAILER_MAGIC, 8);
	put_le64(trailer + 8, file_size);
	if ((rc = out_begin(out_path, &o)) == 0) {
		if ((rc = out_put(&o, head, data_offset)) == 0 &&
			(rc = write_data(&o, wm, 1)) == 0 &&
			(rc = out_zeros(&o, file_size - WEIG_TRAILER_SIZE - o.pos)) == 0 &&
			(rc = out_put(&o, trailer, sizeof(trailer))) == 0)
			rc = out_commit(&o);
		out_abort(&o); /* unlinks the temporary file unless it was renamed */
	}
	free(head);
	return rc;
}

/* ---- safetensors ---- */

/*
 * Builds the safetensors JSON header of wm (with __metadata__ when there is
 * metadata, tensors in wm's order, data back to back from 0), padded with
 * spaces to a multiple of 8 bytes. Returns a malloc'd buffer.
 */
static int
st_header(struct wt_model *wm, const char *out_path, char **out, size_t *out_len)
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
 * within 64 bits) and builds its header; what names the output. */
static int
st_prepare(struct wt_model *wm, const char *what, char **header, size_t *header_len)
{
	uint64_t total = 0;
	char q[160];

	for (size_t i = 0; i < wm->n; i++) {
		if (strcmp(wm->t[i].name, "__metadata__") == 0)
			return error_set(-EINVAL, "%s: tensor %s cannot be written to safetensors"
				" (the name is reserved)", what,
				json_quote(q, sizeof(q), wm->t[i].name, wm->t[i].name_len));
		if (add_u64(&total, wm->t[i].nbytes) < 0)
			return error_set(-EOVERFLOW, "%s: model too large for 64-bit offsets",
				what);
	}
	return st_header(wm, what, header, header_len);
}

/* Appends the whole file: the header's length, the header, the data. */
static int
st_put(struct out_file *o, const struct wt_model *wm, const char *header, size_t header_len)
{
	uint8_t prefix[8];
	int rc;

	put_le64(prefix, header_len);
	if ((rc = out_put(o, prefix, sizeof(prefix))) < 0 ||
		(rc = out_put(o, header, header_len)) < 0)
		return rc;
	return write_data(o, wm, 0);
}

/* Writes wm as safetensors to out_path, atomically. */
static int
write_safetensors(struct wt_model *wm, const char *out_path)
{
	struct out_file o;
	char *header = NULL;
	size_t header_len = 0;
	int rc;

	if ((rc = st_prepare(wm, out_path, &header, &header_len)) < 0)
		return rc;
	if ((rc = out_begin(out_path, &o)) == 0) {
		if ((rc = st_put(&o, wm, header, header_len)) == 0)
			rc = out_commit(&o);
		out_abort(&o); /* unlinks the temporary file unless it was renamed */
	}
	free(header);
	return rc;
}

/*
 * Gathers a caller's tensors and metadata pairs (metadata[2i] the key,
 * metadata[2i + 1] the value) for writing, checking what a reader would
 * refuse: a missing name or dtype, an unknown dtype, too many dimensions,
 * a byte count that is not the shape's, data missing for a non-empty
 * tensor. The arrays point at the caller's strings and data.
 */
static int
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
		if (t->type == NULL)
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
	}
	wm->nmeta = nmeta;
	if (rc == 0)
		rc = wt_sort(wm, what);
	if (rc < 0)
		wt_free(wm);
	return rc;
}

int
writer_safetensors_fd(const wc_tensor *tensors, size_t n, const char *const *metadata,
	size_t nmeta, int fd, const char *what)
{
	struct wt_model wm;
	struct out_file o;
	char *header = NULL;
	size_t header_len = 0;
	int rc;

	if ((rc = wt_from_tensors(tensors, n, metadata, nmeta, what, &wm)) < 0)
		return rc;
	if ((rc = st_prepare(&wm, what, &header, &header_len)) == 0 &&
		(rc = out_begin_fd(fd, what, &o)) == 0) {
		if ((rc = st_put(&o, &wm, header, header_len)) == 0)
			rc = out_flush(&o);
		out_abort(&o); /* frees the buffer; fd stays the caller's */
	}
	free(header);
	wt_free(&wm);
	return rc;
}

/* ---- entry points ---- */

int
writer_weig(const wc_model *m, const char *out_path)
{
	struct wt_model wm;
	int rc;

	if ((rc = wt_from_model(m, out_path, &wm)) < 0)
		return rc;
	rc = write_weig(&wm, out_path);
	wt_free(&wm);
	return rc;
}

int
writer_safetensors(const wc_model *m, const char *out_path)
{
	struct wt_model wm;
	int rc;

	if ((rc = wt_from_model(m, out_path, &wm)) < 0)
		return rc;
	rc = write_safetensors(&wm, out_path);
	wt_free(&wm);
	return rc;
}

/*
 * Gathers the tensors of a validated big-endian WEIG file through its
 * compiled index: names, shapes and metadata come from the index (already
 * converted to host order by the parser); data points into the file.
 */
static int
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

int
writer_from_big_endian(const char *in_path, enum writer_format fmt, const char *out_path)
{
	struct model_source s;
	struct wt_model wm = { 0 };
	int rc;

	if ((rc = open_model_file(in_path, FORMAT_WEIG, &weig_big_endian_reader, &s)) < 0)
		return rc;
	if ((rc = wt_from_index(s.index, s.index_len, &s.files[0], &wm)) < 0)
		goto out;
	if (fmt == WRITER_WEIG)
		rc = write_weig(&wm, out_path);
	else if (fmt == WRITER_SAFETENSORS)
		rc = write_safetensors(&wm, out_path);
	else
		rc = error_set(-EINVAL, "%s: unknown output format %d", out_path, (int)fmt);
out:
	wt_free(&wm);
	source_close(&s);
	return rc;
}
