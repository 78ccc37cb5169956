/*
 * dtype.h: the table of element types, with their safetensors spelling,
 * their WEIG code and their size in bits.
 */
#ifndef WC_DTYPE_H
#define WC_DTYPE_H

#include <stddef.h>
#include <stdint.h>

struct dtype_info {
	const char *name; /* safetensors spelling, e.g. "BF16" */
	uint32_t code;    /* WEIG and index code (proto/FORMAT.md) */
	uint32_t bits;    /* bits per element: 4 (F4), 6 (F6_*), 8, 16, ... */
};

#define DTYPE_COUNT 22

/* Lookup by exact, case-sensitive spelling; NULL if unknown. */
const struct dtype_info *dtype_by_name(const char *name, size_t len);

/* Lookup by WEIG code; NULL if unknown. */
const struct dtype_info *dtype_by_code(uint32_t code);

/*
 * Element count and byte size of a tensor of this type and shape, with
 * overflow checks. An empty shape is a scalar of one element. Returns 0,
 * -EOVERFLOW when the count or size does not fit 64 bits, or -EINVAL when
 * the bit count is not a multiple of 8 (sub-byte types).
 */
int dtype_nbytes(const struct dtype_info *t, const uint64_t *shape, uint32_t ndim,
	uint64_t *elements, uint64_t *nbytes);

#endif
