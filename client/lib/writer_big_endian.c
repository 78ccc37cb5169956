/*
 * writer_big_endian.c: converts a big-endian WEIG file (proto/FORMAT.md)
 * into a little-endian WEIG or safetensors file, and the byte swapping that
 * takes.
 *
 * A big-endian file cannot be served zero-copy on a little-endian host, so
 * the readers refuse it and `wcachectl convert` makes a little-endian copy
 * once, on disk, instead of each worker swapping its own. The file is
 * opened and validated completely through the WEIG reader's big-endian
 * variant (format/open.h, weig_big_endian_reader), gathered through its
 * compiled index (wt_from_index), and written by the format writers with
 * each element swapped as it passes through the output buffer: the size of
 * an element is its dtype's (2, 4 or 8 bytes; a C64 is two 4-byte floats;
 * bytes and packed sub-byte types have no byte order).
 */
#include <byteswap.h>
#include <errno.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "format/dtype.h"
#include "format/open.h"
#include "format/source.h"
#include "format/weig.h"
#include "lib/writer.h"
#include "lib/writer_internal.h"

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

/* ---- converting a big-endian file ---- */

/* The writer's check before the commit (writer_check_fn): the input file
 * ctx is as it was opened, so OUT is not a mix of its old and new bytes. */
static int
input_unchanged(void *ctx)
{
	return file_check_unchanged(ctx);
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
	wm.check = input_unchanged;
	wm.check_ctx = &s.files[0];
	if (fmt == WRITER_WEIG)
		rc = wt_write_weig(&wm, out_path);
	else if (fmt == WRITER_SAFETENSORS)
		rc = wt_write_safetensors(&wm, out_path);
	else
		rc = error_set(-EINVAL, "%s: unknown output format %d", out_path, (int)fmt);
out:
	wt_free(&wm);
	source_close(&s);
	return rc;
}
