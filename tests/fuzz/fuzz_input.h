/*
 * fuzz_input.h: reading a harness's input field by field, for the harnesses
 * whose inputs are laid out as records (fuzz_attach.c, fuzz_roundtrip.c).
 */
#ifndef WC_FUZZ_INPUT_H
#define WC_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

/* Reads n bytes at *p, or fails (NULL) when fewer are left. */
static inline const uint8_t *
take(const uint8_t **p, size_t *left, size_t n)
{
	const uint8_t *at = *p;

	if (*left < n)
		return NULL;
	*p += n;
	*left -= n;
	return at;
}

/* The little-endian u16 at p. */
static inline unsigned
le16(const uint8_t *p)
{
	return (unsigned)p[0] | (unsigned)p[1] << 8;
}

#endif /* WC_FUZZ_INPUT_H */
