/*
 * memfds.h: the two memfds wcached passes with ATTACH_OK (PROTOCOL.md), as
 * the daemon makes them and as a client checks them. Both sides include this
 * header, so the seals, the magic and the page size are one definition.
 *
 * The index memfd holds one generation's compiled index (FORMAT.md). The
 * daemon writes it, then seals it with INDEX_SEALS; a client refuses an index
 * whose seals do not include all of them, so nobody can change the index
 * after the client has validated it, nor unseal it.
 *
 * The status page is one memfd for all models: an array of u64 slots in the
 * host's byte order, slot 0 holding STATUS_MAGIC and slot N the current
 * generation of the model given slot N (not served: 0 until its name first
 * serves, then 2^63 + the last generation number given out in it, never a
 * generation number, so every holder reads stale). The daemon makes it
 * STATUS_PAGE_BYTES long and seals it with STATUS_PAGE_SEALS; a client needs
 * only STATUS_PAGE_CLIENT_SEALS (its size can never change, so reading it
 * never faults) and maps a page of STATUS_PAGE_MIN_BYTES to
 * STATUS_PAGE_MAX_BYTES, whatever size the daemon chose.
 */
#ifndef WC_MEMFDS_H
#define WC_MEMFDS_H

#include <fcntl.h>

#define INDEX_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

#define STATUS_MAGIC 0x54534357u /* "WCST" as bytes on a little-endian host */
#define STATUS_PAGE_BYTES 65536u /* what wcached makes: the magic and 8191 slots */
#define STATUS_SLOTS (STATUS_PAGE_BYTES / 8u)
#define STATUS_PAGE_MIN_BYTES 16u /* the magic and one slot */
#define STATUS_PAGE_MAX_BYTES (1u << 20) /* the most a client agrees to map */

/* Shrink and grow: no mapping can point past the end. Future write: only the
 * daemon's mapping, made before the seal, can change it. Seal: for good. */
#define STATUS_PAGE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
#define STATUS_PAGE_CLIENT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)
/* A page kept in systemd's fd store for the next daemon process: that one
 * must map it writable again, so it lacks F_SEAL_FUTURE_WRITE (and the memfd
 * is mode 0600). Still what a client needs. */
#define STATUS_PAGE_STORED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
_Static_assert((STATUS_PAGE_STORED_SEALS & STATUS_PAGE_CLIENT_SEALS) == STATUS_PAGE_CLIENT_SEALS,
	"a stored status page must be one a client accepts");

_Static_assert(STATUS_PAGE_BYTES % 8u == 0 && STATUS_PAGE_BYTES >= STATUS_PAGE_MIN_BYTES &&
		STATUS_PAGE_BYTES <= STATUS_PAGE_MAX_BYTES,
	"wcached's status page is one a client accepts");

#endif
