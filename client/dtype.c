/*
 * dtype.c: element types. The codes are the WEIG codes of proto/FORMAT.md;
 * the names are safetensors' spellings, matched case-sensitively.
 */
#include <errno.h>
#include <string.h>

#include "dtype.h"

static const struct dtype_info dtypes[DTYPE_COUNT] = {
	{ "F32", 0, 32 },	  { "F16", 1, 16 },	    { "BF16", 2, 16 },
	{ "I8", 3, 8 },		  { "U8", 4, 8 },	    { "I32", 5, 32 },
	{ "F64", 6, 64 },	  { "I64", 7, 64 },	    { "U64", 8, 64 },
	{ "U32", 9, 32 },	  { "I16", 10, 16 },	    { "U16", 11, 16 },
	{ "BOOL", 12, 8 },	  { "F8_E4M3", 13, 8 },	    { "F8_E5M2", 14, 8 },
	{ "F8_E8M0", 15, 8 },	  { "F8_E4M3FNUZ", 16, 8 }, { "F8_E5M2FNUZ", 17, 8 },
	{ "F4", 18, 4 },	  { "F6_E2M3", 19, 6 },	    { "F6_E3M2", 20, 6 },
	{ "C64", 21, 64 },
};

const struct dtype_info *
dtype_by_name(const char *name, size_t len)
{
	for (size_t i = 0; i < DTYPE_COUNT; i++)
		if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, name, len) == 0)
			return &dtypes[i];
	return NULL;
}

const struct dtype_info *
dtype_by_code(uint32_t code)
{
	/* The table is indexed by code. */
	if (code >= DTYPE_COUNT)
		return NULL;
	return &dtypes[code];
}

int
dtype_nbytes(const struct dtype_info *t, const uint64_t *shape, uint32_t ndim,
	uint64_t *elements, uint64_t *nbytes)
{
	uint64_t count = 1, bits;

	for (uint32_t i = 0; i < ndim; i++)
		if (__builtin_mul_overflow(count, shape[i], &count))
			return -EOVERFLOW;
	if (__builtin_mul_overflow(count, (uint64_t)t->bits, &bits))
		return -EOVERFLOW;
	if (bits % 8 != 0)
		return -EINVAL;
	*elements = count;
	*nbytes = bits / 8;
	return 0;
}
