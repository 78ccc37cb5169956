/*
 * le.h: little-endian loads and stores, the one set every reader and writer
 * of wcache's byte formats uses (the wire protocol, the index, safetensors,
 * WEIG).
 *
 * Each copies through memcpy into a local, so p needs no alignment and a
 * pointer into a mapping is never dereferenced as a wider type; the compiler
 * turns each into a single load or store on a little-endian machine.
 */
#ifndef WC_LE_H
#define WC_LE_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t
get_le16(const void *p)
{
	uint16_t v;

	memcpy(&v, p, sizeof(v));
	return le16toh(v);
}

static inline uint32_t
get_le32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return le32toh(v);
}

static inline uint64_t
get_le64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

static inline void
put_le16(void *p, uint16_t v)
{
	v = htole16(v);
	memcpy(p, &v, sizeof(v));
}

static inline void
put_le32(void *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, sizeof(v));
}

static inline void
put_le64(void *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, sizeof(v));
}

#endif
