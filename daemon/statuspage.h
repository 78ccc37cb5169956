/*
 * statuspage.h: the status page workers read (proto/memfds.h): one u64 per
 * model slot holding its current generation (not served: 0, or the last
 * number with STATUS_SLOT_RETIRED, below), after the magic in slot 0.
 * wcached maps it read-write; workers get a read-only reopen and see a
 * swap or a withdrawal without asking.
 *
 * A slot belongs to a model name for the life of the process (and, through
 * the manager's store, across restarts for the names the store carries),
 * so that a model unloaded and loaded again finds its slot and its
 * generation numbers keep growing; only a name that never served a
 * generation (a load of a new name that failed) gives its slot back, for
 * the next new name. After a warm restart a slot whose name the store did
 * not carry (unloaded before the restart) is free too.
 *
 * What makes a slot safe for a new name is its word: a worker of the old
 * name reads it (wc_model_stale() compares it with the number it holds),
 * so the new name's numbers must never equal one the old name gave out.
 * A slot that is not served reads 0 until its name first serves, and from
 * then on STATUS_SLOT_RETIRED | the last generation number given out in
 * it (every holder reads stale, as with 0: no number reaches 2^63). The
 * word is on the page, which the store keeps, so after a warm restart a
 * new name that takes a slot, free or never used, numbers its generations
 * from what the word says (without the bit): above every number a worker
 * can hold of it, whatever the restart carried.
 *
 * The registry owns one (struct registry's page); it calls nothing above.
 * Everything here runs on the event loop thread, or before it runs.
 */
#ifndef WC_STATUSPAGE_H
#define WC_STATUSPAGE_H

#include <stdbool.h>
#include <stdint.h>

/* The bit of a slot's word that says "not served, and the rest is the
 * last generation number given out in it" (see above). */
#define STATUS_SLOT_RETIRED (UINT64_C(1) << 63)

struct statuspage {
	int fd;                   /* read-write memfd, owned */
	int ro_fd;                /* read-only reopen, passed to clients, owned */
	uint64_t *map;            /* read-write mapping */
	int stored;               /* for the manager's store: the next process writes it too */
	struct status_slot {
		char *name;               /* owns the slot forever ("" in a gap) */
		uint64_t last_generation; /* so numbers grow across unload and load */
		uint64_t first;           /* what the word said when a new name took it */
		bool free;                /* given back, or a gap a restart left */
	} *slots;
	unsigned nslots;
};

/*
 * Creates the status page: sealed so it can never shrink (no SIGBUS in
 * workers) and, unless stored is set, never mapped writable again
 * (F_SEAL_FUTURE_WRITE). A page for the manager's store (stored 1) stays
 * writable for the next process: no F_SEAL_FUTURE_WRITE, and mode 0600.
 * 0, or -errno with the message.
 */
int statuspage_init(struct statuspage *p, int stored);

/*
 * Takes the page the previous process stored, after checking it is one
 * statuspage_init(p, 1) makes: a memfd of STATUS_PAGE_BYTES with exactly
 * STATUS_PAGE_STORED_SEALS, owned by our euid, neither group- nor
 * world-writable, open read-write, with the magic. Takes fd on success
 * only; -EINVAL naming what failed.
 */
int statuspage_adopt(struct statuspage *p, int fd);

/* The slot of name: the one it had before, or a free one (given back, or
 * a gap a warm restart left), or a new one, in *slot; a slot new to name
 * starts from the last generation its word says (0 on a fresh page). 0,
 * or -ENOSPC when all STATUS_SLOTS - 1 are taken (each by a name that has
 * served since the start, or that the warm restart carried: a restart
 * frees the slots of names not loaded when it stopped), -ENOMEM; the
 * message says which. */
int statuspage_slot_for(struct statuspage *p, const char *name, unsigned *slot);

/* Gives slot back when its name never had a generation (no number given
 * out since it took the slot): no worker can hold a number of it. Nothing
 * otherwise. */
void statuspage_release_slot(struct statuspage *p, unsigned slot);

/* Gives slot (1 .. STATUS_SLOTS - 1) to name with last_generation, as the
 * previous process had it (or what the slot's word says, if more); before
 * any model is added. The slots below it that no name takes are gaps, free
 * for new names. 0, -EINVAL, -ENOMEM. */
int statuspage_restore_slot(struct statuspage *p, unsigned slot, const char *name,
	uint64_t last_generation);

/* The last generation number given out for slot (0 for slot 0), and
 * setting it. */
uint64_t statuspage_last_generation(const struct statuspage *p, unsigned slot);
void statuspage_set_last_generation(struct statuspage *p, unsigned slot, uint64_t number);

/* Publishes generation in slot; nothing for slot 0. 0 (not served) writes
 * 0 while the slot's name has never served, else STATUS_SLOT_RETIRED | its
 * last generation. */
void statuspage_publish(struct statuspage *p, unsigned slot, uint64_t generation);

/* Unmaps and closes the page and frees the slots; accepts a page that
 * failed to initialise. */
void statuspage_close(struct statuspage *p);

#endif
