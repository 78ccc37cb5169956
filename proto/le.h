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

/* The low n (1..8) bytes of v, least significant first, at p. */
static inline void
put_le_n(void *p, uint64_t v, size_t n)
{
	uint8_t b[8];

	put_le64(b, v);
	memcpy(p, b, n);
}

/* n (1..8) little-endian bytes at p as an unsigned integer. */
static inline uint64_t
get_le_n(const void *p, size_t n)
{
	uint8_t b[8] = { 0 };

	memcpy(b, p, n);
	return get_le64(b);
}

#endif
