/*
 * weig.c: the reader of WEIG, wcache's native model format (proto/FORMAT.md).
 *
 * A WEIG file is laid out like the compiled index: a 64-byte header, a table
 * of 48-byte tensor records sorted by name, an optional metadata table, the
 * names and shapes, then the data region (aligned to 4096) and a 16-byte
 * trailer that makes a truncated or incompletely written copy detectable.
 *
 * The reader validates every field it reads (never the data bytes) before a
 * tensor reaches the index builder, so the daemon and the workers can trust
 * the offsets in the index without looking at the file again. It reads a
 * private copy of the tables and the trailer (file_read_bytes() in file.c),
 * never the file's mapping, which whoever can write the file could change
 * under it (erase a name's NUL, truncate it). Every field is read with
 * memcpy and converted from the file's byte order. A file whose magic
 * reads byte-swapped is big-endian: weig_parse() refuses it (its data cannot
 * be served zero-copy on a little-endian host) and weig_parse_big_endian()
 * reads it for `wcachectl convert`.
 *
 * Error codes: -EPROTO for a big-endian file given to weig_parse() (or a
 * little-endian one given to weig_parse_big_endian()), -ENOTSUP for a
 * version or flag this reader does not know, -ENOMEM, and -EINVAL for
 * everything else that is wrong with the file.
 *
 * Layering: a reader (reader.h) only parses. This file opens nothing and
 * calls nothing above it; source.c lists weig_reader in its table, and
 * lib/writer_big_endian.c opens a big-endian file through open.c with
 * weig_big_endian_reader.
 */
#include <byteswap.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/dtype.h"
#include "base/error.h"
#include "format/index.h"
#include "proto/le.h"
#include "base/json.h"
#include "format/weig.h"

/* Header field offsets. */
enum {
	H_MAGIC = 0,
	H_VERSION = 4,
	H_TENSOR_COUNT = 8,
	H_META_OFFSET = 16,
	H_DATA_OFFSET = 24,
	H_FILE_SIZE = 32,
	H_FLAGS = 40,
	H_RESERVED0 = 48,
	H_RESERVED1 = 56,
};

/* Record field offsets. */
enum {
	R_NAME_OFFSET = 0,
	R_DTYPE = 8,
	R_PAD = 12,
	R_SHAPE_OFFSET = 16,
	R_SHAPE_COUNT = 24,
	R_DATA_OFFSET = 32,
	R_DATA_SIZE = 40,
};

/* The state of one parse: the file, its byte order, and the two areas every
 * offset must fall in. */
struct weig_reader {
	const char *name;     /* for messages */
	const uint8_t *file;  /* private copy of file[0..head_len) */
	size_t head_len;
	const uint8_t *tail;  /* private copy of the last tail_len bytes */
	size_t tail_len;
	uint64_t size;        /* of the whole file */
	int big_endian;
	uint64_t area_end;    /* end of the table/name/shape area = data_offset */
	uint64_t data_start;  /* header data_offset */
	uint64_t data_end;    /* size - trailer */
};

/* One tensor's data range, for the overlap check. */
struct weig_range {
	uint64_t offset;
	uint64_t size;
	const char *name;
};

/* Reads a u32 at off (the caller has checked the bounds). */
static uint32_t
rd32(const struct weig_reader *r, uint64_t off)
{
	uint32_t v = get_le32(r->file + off);

	return r->big_endian ? bswap_32(v) : v;
}

/* Reads a u64 at off (the caller has checked the bounds). */
static uint64_t
rd64(const struct weig_reader *r, uint64_t off)
{
	uint64_t v = get_le64(r->file + off);

	return r->big_endian ? bswap_64(v) : v;
}

/*
 * Checks that [off, off + count * elem) lies inside the table area
 * [WEIG_HEADER_SIZE, area_end) and that off is aligned to 8. what names the
 * table for messages ("record table", "tensor record 3: shape").
 */
static int
check_area(const struct weig_reader *r, const char *what, uint64_t off, uint64_t count,
	uint64_t elem)
{
	uint64_t len;

	if (__builtin_mul_overflow(count, elem, &len))
		return error_set(-EINVAL, "%s: %s: %" PRIu64 " entries of %" PRIu64
			" bytes overflow 64 bits", r->name, what, count, elem);
	if (off < WEIG_HEADER_SIZE || off > r->area_end || len > r->area_end - off)
		return error_set(-EINVAL, "%s: %s [%" PRIu64 ", +%" PRIu64 ") is outside the"
			" table area [%u, %" PRIu64 ")", r->name, what, off, len,
			WEIG_HEADER_SIZE, r->area_end);
	if (off % 8 != 0)
		return error_set(-EINVAL, "%s: %s offset %" PRIu64 " is not a multiple of 8",
			r->name, what, off);
	return 0;
}

/*
 * Reads the NUL-terminated string at off: it must start inside the table area,
 * end with a NUL inside it, hold at most max bytes and be valid UTF-8. what
 * names the string for messages.
 */
static int
read_string(const struct weig_reader *r, const char *what, uint64_t off, size_t max,
	const char **s, size_t *len)
{
	uint64_t room;
	const uint8_t *p, *nul;

	if (off < WEIG_HEADER_SIZE || off >= r->area_end)
		return error_set(-EINVAL, "%s: %s offset %" PRIu64 " is outside the table area"
			" [%u, %" PRIu64 ")", r->name, what, off, WEIG_HEADER_SIZE, r->area_end);
	room = r->area_end - off;
	if (room > (uint64_t)max + 1)
		room = (uint64_t)max + 1;
	p = r->file + off;
	nul = memchr(p, 0, (size_t)room);
	if (nul == NULL) {
		if (room == (uint64_t)max + 1)
			return error_set(-EINVAL, "%s: %s at offset %" PRIu64 " is longer than %zu"
				" bytes", r->name, what, off, max);
		return error_set(-EINVAL, "%s: %s at offset %" PRIu64 " has no NUL before the"
			" end of the table area (%" PRIu64 ")", r->name, what, off, r->area_end);
	}
	if (!json_utf8_valid(p, (size_t)(nul - p)))
		return error_set(-EINVAL, "%s: %s at offset %" PRIu64 " is not valid UTF-8",
			r->name, what, off);
	*s = (const char *)p;
	*len = (size_t)(nul - p);
	return 0;
}

/*
 * Checks the header: magic and byte order, version, file size, trailer,
 * flags, and that the data region and the two tables lie where they must.
 * Fills r's areas and returns the counts and offsets of the tables.
 */
static int
check_header(struct weig_reader *r, int want_big_endian, uint64_t *tensor_count,
	uint64_t *record_offset, uint64_t *meta_count, uint64_t *meta_table)
{
	uint32_t magic;
	uint64_t file_size, data_offset, flags, res0, res1, trailer_size;
	const uint8_t *trailer;

	if (r->size < 4 || r->head_len < 4)
		return error_set(-EINVAL, "%s: file is %" PRIu64 " bytes, too small for a WEIG"
			" header", r->name, r->size < 4 ? r->size : (uint64_t)r->head_len);
	magic = get_le32(r->file);
	if (magic == bswap_32(WEIG_MAGIC)) {
		r->big_endian = 1;
	} else if (magic == WEIG_MAGIC) {
		r->big_endian = 0;
	} else {
		return error_set(-EINVAL, "%s: not a WEIG file (magic 0x%08" PRIx32
			", expected 0x%08" PRIx32 ")", r->name, magic, WEIG_MAGIC);
	}
	if (r->big_endian && !want_big_endian)
		return error_set(-EPROTO, "%s: WEIG file is big-endian: it cannot be served"
			" zero-copy on this little-endian host; `wcachectl convert %s OUT.weig`"
			" makes a little-endian copy", r->name, r->name);
	if (!r->big_endian && want_big_endian)
		return error_set(-EPROTO, "%s: WEIG file is little-endian, not big-endian",
			r->name);
	if (r->size < WEIG_HEADER_SIZE + WEIG_TRAILER_SIZE)
		return error_set(-EINVAL, "%s: file is %" PRIu64 " bytes, too small for a WEIG"
			" header and trailer (%u bytes): truncated", r->name, r->size,
			WEIG_HEADER_SIZE + WEIG_TRAILER_SIZE);
	if (r->head_len < WEIG_HEADER_SIZE || r->tail_len != WEIG_TRAILER_SIZE)
		return error_set(-EIO, "%s: file changed while being read: %zu header bytes and"
			" %zu trailer bytes read", r->name, r->head_len, r->tail_len);
	if (rd32(r, H_VERSION) != WEIG_VERSION)
		return error_set(-ENOTSUP, "%s: WEIG version %" PRIu32 " is not supported (this"
			" reader knows version %u)", r->name, rd32(r, H_VERSION), WEIG_VERSION);
	file_size = rd64(r, H_FILE_SIZE);
	if (file_size != r->size)
		return error_set(-EINVAL, "%s: header says file_size %" PRIu64 " but the file is"
			" %" PRIu64 " bytes (%s)", r->name, file_size, r->size,
			file_size > r->size ? "truncated" : "data appended");

	/* The trailer: magic bytes, then the file size again. */
	trailer = r->tail;
	trailer_size = get_le64(trailer + 8);
	if (r->big_endian)
		trailer_size = bswap_64(trailer_size);
	if (memcmp(trailer, WEIG_TRAILER_MAGIC, 8) != 0 || trailer_size != r->size)
		return error_set(-EINVAL, "%s: the trailer at offset %" PRIu64 " is missing or"
			" damaged: the file is truncated or was not completely written", r->name,
			r->size - WEIG_TRAILER_SIZE);

	flags = rd64(r, H_FLAGS);
	res0 = rd64(r, H_RESERVED0);
	res1 = rd64(r, H_RESERVED1);
	if (flags & ~(uint64_t)WEIG_FLAGS_KNOWN)
		return error_set(-ENOTSUP, "%s: unknown flags 0x%" PRIx64 " (this reader knows"
			" 0x%x)", r->name, flags & ~(uint64_t)WEIG_FLAGS_KNOWN, WEIG_FLAGS_KNOWN);
	if (!(flags & WEIG_FLAG_METADATA) && (res0 != 0 || res1 != 0))
		return error_set(-EINVAL, "%s: reserved fields are %" PRIu64 " and %" PRIu64
			" but must be 0 when the metadata flag is clear", r->name, res0, res1);

	data_offset = rd64(r, H_DATA_OFFSET);
	r->data_end = r->size - WEIG_TRAILER_SIZE;
	if (data_offset % WEIG_DATA_ALIGN != 0 || data_offset < WEIG_HEADER_SIZE ||
		data_offset > r->data_end)
		return error_set(-EINVAL, "%s: data_offset %" PRIu64 " must be a multiple of %u"
			" between %u and the trailer at %" PRIu64, r->name, data_offset,
			WEIG_DATA_ALIGN, WEIG_HEADER_SIZE, r->data_end);
	if (data_offset > r->head_len)
		return error_set(-EIO, "%s: file changed while being read: the tables end at"
			" %" PRIu64 " but %zu bytes were read", r->name, data_offset, r->head_len);
	r->area_end = data_offset;
	r->data_start = data_offset;

	*tensor_count = rd64(r, H_TENSOR_COUNT);
	*record_offset = rd64(r, H_META_OFFSET);
	if (check_area(r, "record table", *record_offset, *tensor_count, WEIG_RECORD_SIZE) < 0)
		return -EINVAL;
	*meta_count = 0;
	*meta_table = 0;
	if (flags & WEIG_FLAG_METADATA) {
		uint64_t rec_end = *record_offset + *tensor_count * WEIG_RECORD_SIZE;

		if (check_area(r, "metadata table", res0, res1, WEIG_META_ENTRY_SIZE) < 0)
			return -EINVAL;
		/* Both tables are inside the area, so these cannot overflow. */
		if (res1 > 0 && *tensor_count > 0 && res0 < rec_end &&
			*record_offset < res0 + res1 * WEIG_META_ENTRY_SIZE)
			return error_set(-EINVAL, "%s: metadata table at %" PRIu64 " overlaps the"
				" record table [%" PRIu64 ", %" PRIu64 ")", r->name, res0,
				*record_offset, rec_end);
		*meta_count = res1;
		*meta_table = res0;
	}
	return 0;
}

/*
 * Reads and checks record i: name, dtype, pad, shape, size and data range.
 * prev is the previous record's name (NULL for the first), for the order
 * check. Adds the tensor to b and its data range to *range.
 */
static int
parse_record(const struct weig_reader *r, uint64_t rec, uint64_t i, const char *prev,
	uint32_t file_no, struct index_builder *b, struct weig_range *range)
{
	uint64_t name_off = rd64(r, rec + R_NAME_OFFSET);
	uint32_t dtype = rd32(r, rec + R_DTYPE);
	uint32_t pad = rd32(r, rec + R_PAD);
	uint64_t shape_off = rd64(r, rec + R_SHAPE_OFFSET);
	uint64_t ndim = rd64(r, rec + R_SHAPE_COUNT);
	uint64_t data_off = rd64(r, rec + R_DATA_OFFSET);
	uint64_t data_size = rd64(r, rec + R_DATA_SIZE);
	uint64_t shape[INDEX_MAX_NDIM], elements, nbytes;
	const struct dtype_info *t;
	char what[64], shape_text[128], q[160], qprev[160];
	const char *name;
	size_t name_len;
	int rc;

	snprintf(what, sizeof(what), "tensor record %" PRIu64 ": name", i);
	if ((rc = read_string(r, what, name_off, INDEX_MAX_NAME, &name, &name_len)) < 0)
		return rc;
	if (name_len == 0)
		return error_set(-EINVAL, "%s: tensor record %" PRIu64 ": name is empty",
			r->name, i);
	json_quote(q, sizeof(q), name, name_len);
	if (prev != NULL) {
		int c = strcmp(prev, name);

		if (c == 0)
			return error_set(-EINVAL, "%s: tensor %s: duplicate name", r->name, q);
		json_quote(qprev, sizeof(qprev), prev, strlen(prev));
		if (c > 0)
			return error_set(-EINVAL, "%s: tensor %s: records are not sorted by name"
				" (%s comes before it)", r->name, q, qprev);
	}
	if (pad != 0)
		return error_set(-EINVAL, "%s: tensor %s: pad is %" PRIu32 ", must be 0",
			r->name, q, pad);
	t = dtype_by_code(dtype);
	if (t == NULL)
		return error_set(-EINVAL, "%s: tensor %s: unknown dtype code %" PRIu32,
			r->name, q, dtype);
	if (ndim > INDEX_MAX_NDIM)
		return error_set(-EINVAL, "%s: tensor %s: %" PRIu64 " dimensions, more than"
			" %d", r->name, q, ndim, INDEX_MAX_NDIM);
	snprintf(what, sizeof(what), "tensor record %" PRIu64 ": shape", i);
	if ((rc = check_area(r, what, shape_off, ndim, 8)) < 0)
		return rc;
	for (uint64_t d = 0; d < ndim; d++)
		shape[d] = rd64(r, shape_off + 8 * d);
	index_format_shape(shape_text, sizeof(shape_text), shape, (uint32_t)ndim);
	rc = dtype_nbytes(t, shape, (uint32_t)ndim, &elements, &nbytes);
	if (rc == -EOVERFLOW)
		return error_set(-EINVAL, "%s: tensor %s: shape %s of %s overflows 64 bits",
			r->name, q, shape_text, t->name);
	if (rc < 0)
		return error_set(-EINVAL, "%s: tensor %s: shape %s of %s is not a whole"
			" number of bytes", r->name, q, shape_text, t->name);
	if (nbytes != data_size)
		return error_set(-EINVAL, "%s: tensor %s: data_size %" PRIu64 " does not"
			" match shape %s of %s (%" PRIu64 " bytes)", r->name, q, data_size,
			shape_text, t->name, nbytes);
	if (data_off < r->data_start || data_off > r->data_end ||
		data_size > r->data_end - data_off)
		return error_set(-EINVAL, "%s: tensor %s: data [%" PRIu64 ", +%" PRIu64 ") is"
			" outside the data region [%" PRIu64 ", %" PRIu64 ")", r->name, q,
			data_off, data_size, r->data_start, r->data_end);
	if (data_off % WEIG_TENSOR_ALIGN != 0)
		return error_set(-EINVAL, "%s: tensor %s: data offset %" PRIu64 " is not a"
			" multiple of %u", r->name, q, data_off, WEIG_TENSOR_ALIGN);
	if ((rc = index_add_tensor(b, name, name_len, dtype, file_no, shape, (uint32_t)ndim,
		     data_off, data_size)) < 0)
		return rc;
	range->offset = data_off;
	range->size = data_size;
	range->name = name;
	return 0;
}

/* Orders data ranges by offset (then size, so empty ranges sort first). */
static int
range_cmp(const void *a, const void *b)
{
	const struct weig_range *x = a, *y = b;

	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	if (x->size != y->size)
		return x->size < y->size ? -1 : 1;
	return 0;
}

/* Checks that no two non-empty data ranges overlap (sorts ranges). */
static int
check_overlap(const struct weig_reader *r, struct weig_range *ranges, uint64_t n)
{
	const struct weig_range *last = NULL;
	char q[160], qlast[160];

	if (n > 1)
		qsort(ranges, (size_t)n, sizeof(*ranges), range_cmp);
	for (uint64_t i = 0; i < n; i++) {
		if (ranges[i].size == 0)
			continue;
		/* last->offset + last->size cannot overflow: both lie in the file. */
		if (last != NULL && ranges[i].offset < last->offset + last->size) {
			json_quote(q, sizeof(q), ranges[i].name, strlen(ranges[i].name));
			json_quote(qlast, sizeof(qlast), last->name, strlen(last->name));
			return error_set(-EINVAL, "%s: tensor %s: data [%" PRIu64 ", +%" PRIu64
				") overlaps tensor %s [%" PRIu64 ", +%" PRIu64 ")", r->name, q,
				ranges[i].offset, ranges[i].size, qlast, last->offset, last->size);
		}
		last = &ranges[i];
	}
	return 0;
}

/* Reads and checks the metadata table: strings, and keys sorted and unique. */
static int
parse_metadata(const struct weig_reader *r, uint64_t table, uint64_t count,
	struct index_builder *b)
{
	const char *prev = NULL;

	for (uint64_t i = 0; i < count; i++) {
		uint64_t entry = table + i * WEIG_META_ENTRY_SIZE;
		const char *key, *value;
		size_t key_len, value_len;
		char what[64];
		int rc;

		snprintf(what, sizeof(what), "metadata entry %" PRIu64 ": key", i);
		if ((rc = read_string(r, what, rd64(r, entry), SIZE_MAX - 1, &key, &key_len)) < 0)
			return rc;
		snprintf(what, sizeof(what), "metadata entry %" PRIu64 ": value", i);
		if ((rc = read_string(r, what, rd64(r, entry + 8), SIZE_MAX - 1, &value,
			     &value_len)) < 0)
			return rc;
		if (prev != NULL) {
			int c = strcmp(prev, key);
			char q[160], qprev[160];

			json_quote(q, sizeof(q), key, key_len);
			json_quote(qprev, sizeof(qprev), prev, strlen(prev));
			if (c == 0)
				return error_set(-EINVAL, "%s: metadata key %s: duplicate key",
					r->name, q);
			if (c > 0)
				return error_set(-EINVAL, "%s: metadata key %s: entries are "
					"not sorted by key (%s comes before it)", r->name, q,
					qprev);
		}
		if ((rc = index_add_meta(b, key, key_len, value, value_len)) < 0)
			return rc;
		prev = key;
	}
	return 0;
}

/*
 * The parser behind weig_parse() and weig_parse_big_endian(): checks the
 * header, every record (adding its tensor to b), the data ranges and the
 * metadata. On failure b holds part of the file and must be discarded.
 */
static int
parse(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b, int big_endian)
{
	struct weig_reader r = { .name = name, .file = in->head, .head_len = in->head_len,
		.tail = in->tail, .tail_len = in->tail_len, .size = in->size };
	/* Zeroed for gcc, which cannot see that check_header() sets them all
	 * whenever it returns 0. */
	uint64_t count = 0, records = 0, meta_count = 0, meta_table = 0;
	struct weig_range *ranges = NULL;
	const char *prev = NULL;
	int rc;

	if ((rc = check_header(&r, big_endian, &count, &records, &meta_count, &meta_table)) < 0)
		return rc;
	/* The record table lies inside the file, so count < size / 48. */
	if (count > 0) {
		ranges = calloc((size_t)count, sizeof(*ranges));
		if (ranges == NULL)
			return error_set(-ENOMEM, "%s: out of memory for %" PRIu64 " tensors", name,
				count);
	}
	for (uint64_t i = 0; i < count; i++) {
		rc = parse_record(&r, records + i * WEIG_RECORD_SIZE, i, prev, file_no, b,
			&ranges[i]);
		if (rc < 0)
			goto out;
		prev = ranges[i].name;
	}
	if ((rc = check_overlap(&r, ranges, count)) < 0)
		goto out;
	rc = parse_metadata(&r, meta_table, meta_count, b);
out:
	free(ranges);
	return rc;
}

int
weig_parse_bytes(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b)
{
	return parse(name, in, file_no, b, 0);
}

/* weig_parse_bytes() for a big-endian file (the converter's reader). */
static int
weig_parse_big_endian_bytes(const char *name, const struct file_bytes *in, uint32_t file_no,
	struct index_builder *b)
{
	return parse(name, in, file_no, b, 1);
}

int
weig_parse(const char *name, const uint8_t *file, uint64_t size, uint32_t file_no,
	struct index_builder *b)
{
	struct file_bytes in = file_bytes_of(file, size);

	return parse(name, &in, file_no, b, 0);
}

int
weig_parse_big_endian(const char *name, const uint8_t *file, uint64_t size,
	uint32_t file_no, struct index_builder *b)
{
	struct file_bytes in = file_bytes_of(file, size);

	return parse(name, &in, file_no, b, 1);
}

/*
 * The head a WEIG parse needs: everything before the data region (header,
 * tables, names, shapes), as the header's data_offset says in either byte
 * order; the prefix when the header is not plausible (the parser explains).
 */
static uint64_t
weig_head_len(const uint8_t *prefix, size_t len, uint64_t size)
{
	uint32_t magic;
	uint64_t off;

	if (len < WEIG_HEADER_SIZE)
		return len;
	magic = get_le32(prefix + H_MAGIC);
	off = get_le64(prefix + H_DATA_OFFSET);
	if (magic == bswap_32(WEIG_MAGIC))
		off = bswap_64(off);
	else if (magic != WEIG_MAGIC)
		return len;
	return off <= size ? off : len;
}

const struct format_reader weig_reader = {
	.head_len = weig_head_len,
	.max_head = WEIG_MAX_TABLES,
	.parse = weig_parse_bytes,
};

const struct format_reader weig_big_endian_reader = {
	.head_len = weig_head_len,
	.max_head = WEIG_MAX_TABLES,
	.parse = weig_parse_big_endian_bytes,
};
