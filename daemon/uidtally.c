/*
 * uidtally.c: a count per uid in an open-addressing hash table (see
 * uidtally.h). Linear probing; removal shifts the entries that follow back
 * (no tombstones), so a lookup stops at the first empty slot and the table
 * never fills with dead entries however many uids come and go.
 */
#include "uidtally.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#define UIDTALLY_MIN_CAP 16u

/* The home slot of uid: Fibonacci hashing, so uids that differ in their
 * low bits only (consecutive system users) spread over the table. */
static unsigned
home(const struct uidtally *t, uid_t uid)
{
	uint32_t h = (uint32_t)uid * 2654435769u;

	return (unsigned)(h ^ (h >> 16)) & (t->cap - 1);
}

/* The slot holding uid, or the empty slot where it would go. cap > 0, and
 * the table is never full (at most half), so the probe ends. */
static unsigned
probe(const struct uidtally *t, uid_t uid)
{
	unsigned i = home(t, uid);

	while (t->slots[i].count != 0 && t->slots[i].uid != uid)
		i = (i + 1) & (t->cap - 1);
	return i;
}

/* Moves every entry into a table of cap slots. Returns 0 or -ENOMEM. */
static int
resize(struct uidtally *t, unsigned cap)
{
	struct uidtally old = *t;

	if ((t->slots = calloc(cap, sizeof(*t->slots))) == NULL) {
		*t = old;
		return -ENOMEM;
	}
	t->cap = cap;
	for (unsigned i = 0; i < old.cap; i++)
		if (old.slots[i].count != 0)
			t->slots[probe(t, old.slots[i].uid)] = old.slots[i];
	free(old.slots);
	return 0;
}

int
uidtally_reserve(struct uidtally *t)
{
	if (t->cap == 0)
		return resize(t, UIDTALLY_MIN_CAP);
	if ((t->used + 1) * 2 <= t->cap)
		return 0;
	if (t->cap > UINT32_MAX / 4)
		return -ENOMEM;
	return resize(t, t->cap * 2);
}

unsigned
uidtally_get(const struct uidtally *t, uid_t uid)
{
	return t->cap == 0 ? 0 : t->slots[probe(t, uid)].count;
}

int
uidtally_add(struct uidtally *t, uid_t uid, unsigned n)
{
	unsigned i;
	int err;

	if (n == 0)
		return 0;
	if (t->cap > 0 && t->slots[i = probe(t, uid)].count != 0) {
		t->slots[i].count += n;
		return 0;
	}
	if ((err = uidtally_reserve(t)) < 0)
		return err;
	i = probe(t, uid);
	t->slots[i].uid = uid;
	t->slots[i].count = n;
	t->used++;
	return 0;
}

void
uidtally_sub(struct uidtally *t, uid_t uid, unsigned n)
{
	unsigned mask, i, j;

	if (t->cap == 0 || n == 0 || t->slots[i = probe(t, uid)].count == 0)
		return;
	if (t->slots[i].count > n) {
		t->slots[i].count -= n;
		return;
	}
	/* Remove: pull back each following entry whose home slot is not in
	 * (i, j], so that every entry stays reachable from its home. */
	mask = t->cap - 1;
	t->slots[i].count = 0;
	t->used--;
	for (j = (i + 1) & mask; t->slots[j].count != 0; j = (j + 1) & mask) {
		unsigned h = home(t, t->slots[j].uid);

		if (((j - h) & mask) >= ((j - i) & mask)) {
			t->slots[i] = t->slots[j];
			t->slots[j].count = 0;
			i = j;
		}
	}
}

void
uidtally_free(struct uidtally *t)
{
	free(t->slots);
	t->slots = NULL;
	t->cap = 0;
	t->used = 0;
}
