/*
 * fnv.h: the FNV-1a hash (Fowler, Noll, Vo), 64 bits: its constants and
 * its step, the one definition of it for the hash table and digests that
 * use it: the registry's chains of model names (names the operator gives,
 * in wcached.conf or through the control socket), and digests compared
 * only with one another in one process: a generation's inodes, what the
 * daemon's warm restart description depends on, the warnings
 * restore_store.c says once.
 *
 * FNV-1a has no key: whoever chooses a table's keys can make any number of
 * them share one chain (its low k bits depend only on the low k bits of
 * its state, so a collision of those bits survives any common suffix).
 * Not for names someone else chooses, such as a model file's: shards.c's
 * table of tensor names made a crafted shard index quadratic to parse
 * (review rev224 M2) and was replaced by a sort.
 */
#ifndef WC_FNV_H
#define WC_FNV_H

#include <stddef.h>
#include <stdint.h>

#define FNV_OFFSET_BASIS UINT64_C(14695981039346656037)
#define FNV_PRIME UINT64_C(1099511628211)

/* h with v hashed in: one FNV-1a step, the xor and then the multiply,
 * modulo 2^64. v is taken whole: for a byte it is FNV-1a's own step. */
static inline uint64_t
fnv_mix(uint64_t h, uint64_t v)
{
	return (h ^ v) * FNV_PRIME;
}

/* h with v[0] to v[n - 1] hashed in, in that order. */
static inline uint64_t
fnv_mix_words(uint64_t h, const uint64_t *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = fnv_mix(h, v[i]);
	return h;
}

/* h with the n bytes at p hashed in. */
static inline uint64_t
fnv_mix_bytes(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = fnv_mix(h, b[i]);
	return h;
}

/* h with the bytes of s hashed in, up to its NUL. */
static inline uint64_t
fnv_mix_string(uint64_t h, const char *s)
{
	for (; *s != '\0'; s++)
		h = fnv_mix(h, (unsigned char)*s);
	return h;
}

#endif
