/*
 * statuspage.h: the status page workers read (proto/memfds.h): one u64 per
 * model slot holding its current generation (0: not served), after the
 * magic in slot 0. wcached maps it read-write; workers get a read-only
 * reopen and see a swap or a withdrawal without asking.
 *
 * A slot belongs to a model name for the life of the process (and, through
 * the manager's store, across restarts), so that a model unloaded and
 * loaded again finds its slot and its generation numbers keep growing;
 * only a name that never served a generation (a load of a new name that
 * failed) gives its slot back, for the next new name.
 *
 * The registry owns one (struct registry's page); it calls nothing above.
 * Everything here runs on the event loop thread, or before it runs.
 */
#ifndef WC_STATUSPAGE_H
#define WC_STATUSPAGE_H

#include <stdbool.h>
#include <stdint.h>

struct statuspage {
	int fd;                   /* read-write memfd, owned */
	int ro_fd;                /* read-only reopen, passed to clients, owned */
	uint64_t *map;            /* read-write mapping */
	int stored;               /* for the manager's store: the next process writes it too */
	struct status_slot {
		char *name;               /* owns the slot forever ("" in a gap) */
		uint64_t last_generation; /* so numbers grow across unload and load */
		bool free;                /* given back (statuspage_release_slot) */
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

/* The slot of name: the one it had before, or a given-back one, or a new
 * one, in *slot. 0, or -ENOSPC when all STATUS_SLOTS - 1 are taken (each
 * by a name served since the start, warm restarts included: a cold start
 * frees those no longer configured), -ENOMEM; the message says which. */
int statuspage_slot_for(struct statuspage *p, const char *name, unsigned *slot);

/* Gives slot back when its name never had a generation (last_generation
 * 0): no worker can hold a number of it. Nothing otherwise. */
void statuspage_release_slot(struct statuspage *p, unsigned slot);

/* Gives slot (1 .. STATUS_SLOTS - 1) to name with last_generation, as the
 * previous process had it; before any model is added. 0, -EINVAL, -ENOMEM. */
int statuspage_restore_slot(struct statuspage *p, unsigned slot, const char *name,
	uint64_t last_generation);

/* The last generation number given out for slot (0 for slot 0), and
 * setting it. */
uint64_t statuspage_last_generation(const struct statuspage *p, unsigned slot);
void statuspage_set_last_generation(struct statuspage *p, unsigned slot, uint64_t number);

/* Publishes generation (0: not served) in slot; nothing for slot 0. */
void statuspage_publish(struct statuspage *p, unsigned slot, uint64_t generation);

/* Unmaps and closes the page and frees the slots; accepts a page that
 * failed to initialise. */
void statuspage_close(struct statuspage *p);

#endif
