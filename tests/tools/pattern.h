/*
 * pattern.h: the deterministic tensor data mkmodel writes, so a reader can
 * regenerate what any generation of a test model must hold from the seed
 * in its metadata. The data region is one stream: splitmix64 from the
 * seed, shaped into small finite values of the element size.
 */
#ifndef WC_PATTERN_H
#define WC_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t
pattern_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fills buf with the next len bytes of the stream for elements of elem
 * bytes (2 or 4). len must be a multiple of 8 except at the very end. */
static inline void
pattern_fill(uint8_t *buf, size_t len, unsigned elem, uint64_t *state)
{
	size_t i = 0;

	while (i < len) {
		uint64_t r = pattern_next(state);

		for (int k = 0; k < 4 && i < len; k++, r >>= 16) {
			uint16_t v = (uint16_t)r;

			if (elem == 2) /* BF16 or F16: sign, exponent near 1.0, mantissa */
				v = (uint16_t)((v & 0x807f) |
					((uint16_t)(0x3c + (v >> 13 & 3)) << 7));
			buf[i++] = (uint8_t)v;
			if (i < len)
				buf[i++] = (uint8_t)(v >> 8);
		}
	}
	if (elem == 4) /* F32: clear the exponent's top bits for finite values */
		for (size_t j = 3; j < len; j += 4)
			buf[j] = (uint8_t)((buf[j] & 0x80) | 0x3c | (buf[j] & 1));
}

#endif
