/*
 * fuzz_bytes.h: file bytes as a parser sees them when the file changed
 * between the reads that copied them (client/file.h, struct file_bytes), for
 * the format harnesses. The head is cut at cut bytes and the tail taken from
 * the image's end, each in a malloc'd block of exactly its size, so ASan
 * reports any read of the parser past what was copied.
 */
#ifndef WC_FUZZ_BYTES_H
#define WC_FUZZ_BYTES_H

#include <stdlib.h>
#include <string.h>

#include "base/file.h"

/* Fills *in with copies of data[0..cut) and the last bytes of data[0..size);
 * returns 0, or -1 when out of memory. Free with fuzz_bytes_free(). */
static inline int
fuzz_bytes_cut(const uint8_t *data, size_t size, size_t cut, struct file_bytes *in)
{
	size_t tail = size < FILE_TAIL_MAX ? size : FILE_TAIL_MAX;
	uint8_t *h = malloc(cut ? cut : 1), *t = malloc(tail ? tail : 1);

	if (h == NULL || t == NULL) {
		free(h);
		free(t);
		return -1;
	}
	memcpy(h, data, cut);
	memcpy(t, data + size - tail, tail);
	*in = (struct file_bytes){ .head = h, .head_len = cut, .tail = t, .tail_len = tail,
		.size = size };
	return 0;
}

static inline void
fuzz_bytes_free(struct file_bytes *in)
{
	free((void *)(uintptr_t)in->head);
	free((void *)(uintptr_t)in->tail);
}

#endif /* WC_FUZZ_BYTES_H */
