/*
 * dtype.c: element types. The codes are the WEIG codes of proto/FORMAT.md;
 * the names are safetensors' spellings, matched case-sensitively.
 */
#include <errno.h>
#include <string.h>

#include "format/dtype.h"

const struct dtype_info dtype_table[DTYPE_COUNT] = {
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
		if (strlen(dtype_table[i].name) == len &&
			memcmp(dtype_table[i].name, name, len) == 0)
			return &dtype_table[i];
	return NULL;
}
