/*
 * dtype.h: the table of element types, with their safetensors spelling,
 * their WEIG code and their size in bits.
 */
#ifndef WC_DTYPE_H
#define WC_DTYPE_H

#include <errno.h>
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

/* The table, indexed by WEIG code. */
extern const struct dtype_info dtype_table[DTYPE_COUNT];

/* Lookup by WEIG code; NULL if unknown. Inline: every tensor lookup of a
 * worker goes through it. */
static inline const struct dtype_info *
dtype_by_code(uint32_t code)
{
	return code < DTYPE_COUNT ? &dtype_table[code] : NULL;
}

/*
 * Element count and byte size of a tensor of this type and shape, with
 * overflow checks. An empty shape is a scalar of one element. Returns 0,
 * -EOVERFLOW when the count or size does not fit 64 bits, or -EINVAL when
 * the bit count is not a multiple of 8 (sub-byte types). Inline for the
 * same reason.
 *
 * The overflow rule does not depend on the order of the dimensions: the
 * product of the non-zero dimensions (and its size in bits) must fit 64
 * bits even when a zero dimension makes the tensor empty, so [0, 2^40, 2^40]
 * and [2^40, 2^40, 0] are both refused. (Upstream safetensors multiplies
 * left to right with checked_mul and so accepts the first and refuses the
 * second; we take the strict rule, in every reader.)
 */
static inline int
dtype_nbytes(const struct dtype_info *t, const uint64_t *shape, uint32_t ndim,
	uint64_t *elements, uint64_t *nbytes)
{
	uint64_t count = 1, nonzero = 1, bits;

	for (uint32_t i = 0; i < ndim; i++) {
		count *= shape[i]; /* wraps only if nonzero overflows below */
		if (shape[i] != 0 && __builtin_mul_overflow(nonzero, shape[i], &nonzero))
			return -EOVERFLOW;
	}
	if (__builtin_mul_overflow(nonzero, (uint64_t)t->bits, &bits))
		return -EOVERFLOW;
	bits = count * (uint64_t)t->bits; /* count <= nonzero: no overflow */
	if (bits % 8 != 0)
		return -EINVAL;
	*elements = count;
	*nbytes = bits / 8;
	return 0;
}

#endif
