/*
 * uidtally.h: a count per user id, for the client socket's descriptors in
 * flight per uid (server.c), in constant time whatever the number of
 * connections.
 *
 * An open-addressing hash table (linear probing) of the uids whose count is
 * not zero: a uid is added with its first count and removed when its count
 * drops to zero, so the table holds only the users that have something in
 * flight. It grows, never shrinks, and is at most half full. Growing is the
 * only thing that allocates, and uidtally_reserve() does it ahead, so that
 * the add that follows a send that succeeded cannot fail. Not thread-safe
 * (the event loop's thread only).
 */
#ifndef WC_UIDTALLY_H
#define WC_UIDTALLY_H

#include <sys/types.h>

struct uidtally_slot {
	uid_t uid;
	unsigned count; /* 0: the slot is empty */
};

struct uidtally {
	struct uidtally_slot *slots; /* cap entries, NULL while cap is 0 */
	unsigned cap;                /* 0 or a power of two */
	unsigned used;               /* uids with a count */
};

/* The initial state is all zeros: { 0 } or calloc. */

/* Makes room for one more uid (grows the table when it would be more than
 * half full). Returns 0, or -ENOMEM with the table unchanged. */
int uidtally_reserve(struct uidtally *t);

/* uid's count; 0 for a uid not in the table. */
unsigned uidtally_get(const struct uidtally *t, uid_t uid);

/* Adds n to uid's count, adding uid when it had none. Never fails for a uid
 * already counted, nor after uidtally_reserve(); otherwise it may have to
 * grow: returns 0, or -ENOMEM with nothing counted. n 0 is a no-op. */
int uidtally_add(struct uidtally *t, uid_t uid, unsigned n);

/* Takes n from uid's count (at most what it has: the count stops at 0) and
 * removes uid when it reaches 0. */
void uidtally_sub(struct uidtally *t, uid_t uid, unsigned n);

/* Frees the table; t is all zeros again. */
void uidtally_free(struct uidtally *t);

#endif
