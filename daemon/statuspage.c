/*
 * statuspage.c: the status page (see statuspage.h): creating and sealing
 * it, taking back the one the previous process stored after checking it,
 * the slots that belong to model names, and publishing generations.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/path.h"
#include "proto/memfds.h"
#include "statuspage.h"

/* Maps the status page fd read-write and opens the read-only reopen that
 * workers get; takes fd on success. */
static int
map_page(struct statuspage *p, int fd)
{
	void *map;

	map = mmap(NULL, STATUS_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return error_set(-errno, "status page: mmap: %s", strerror(errno));
	if ((p->ro_fd = fd_reopen_read_only(fd, "status page")) < 0) {
		int e = p->ro_fd;

		p->ro_fd = -1;
		munmap(map, STATUS_PAGE_BYTES);
		return e;
	}
	p->fd = fd;
	p->map = map;
	return 0;
}

/*
 * Creates the status page: a memfd the daemon maps read-write and sealed so
 * it can never shrink (no SIGBUS in workers) nor be mapped writable again
 * (F_SEAL_FUTURE_WRITE); workers get a read-only reopen of it. A page kept
 * in the manager's store must stay writable for the next process: no
 * F_SEAL_FUTURE_WRITE, and mode 0600, so only wcached's user (who could
 * ptrace wcached anyway) can reopen it writable.
 */
int
statuspage_init(struct statuspage *p, int stored)
{
	int fd, seals = stored ? STATUS_PAGE_STORED_SEALS : STATUS_PAGE_SEALS;

	memset(p, 0, sizeof(*p));
	p->fd = p->ro_fd = -1;
	p->stored = stored;

	/* Sealed below, once mapped: F_SEAL_FUTURE_WRITE forbids the
	 * writable mapping after it. */
	fd = memfd_sealed("wcache-status", NULL, STATUS_PAGE_BYTES, 0, p->stored ? 0600 : 0);
	if (fd < 0) {
		error_prefix("status page");
		return fd;
	}
	if (map_page(p, fd) < 0) {
		close(fd);
		return -EINVAL;
	}
	if (fcntl(fd, F_ADD_SEALS, seals) == -1) {
		int e = errno;

		munmap(p->map, STATUS_PAGE_BYTES);
		close(p->ro_fd);
		close(fd);
		p->map = NULL;
		p->fd = p->ro_fd = -1;
		return error_set(-e, "status page: sealing: %s", strerror(e));
	}
	__atomic_store_n(&p->map[0], STATUS_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

/*
 * Takes the status page the previous process stored, after checking that
 * it is one statuspage_init(p, 1) makes for the store: a memfd (only shmem
 * files take seals, and a tmpfs file starts sealed against more) of
 * STATUS_PAGE_BYTES with exactly STATUS_PAGE_STORED_SEALS, and, because it
 * lacks F_SEAL_FUTURE_WRITE, one that only wcached's user can reopen
 * writable through the read-only descriptor workers get: owned by our
 * euid, neither group- nor world-writable. Anything else could let a
 * worker announce false generations to the others.
 */
int
statuspage_adopt(struct statuspage *p, int fd)
{
	struct stat st;
	int seals;

	memset(p, 0, sizeof(*p));
	p->fd = p->ro_fd = -1;
	p->stored = 1;

	if (fstat(fd, &st) == -1)
		return error_set(-errno, "stored status page: fstat: %s", strerror(errno));
	if (!S_ISREG(st.st_mode) || st.st_size != (off_t)STATUS_PAGE_BYTES)
		return error_set(-EINVAL, "stored status page: not a %u-byte file",
			STATUS_PAGE_BYTES);
	if ((seals = fcntl(fd, F_GET_SEALS)) == -1 || seals != STATUS_PAGE_STORED_SEALS)
		return error_set(-EINVAL, "stored status page: seals 0x%x, not 0x%x "
			"(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)", seals,
			STATUS_PAGE_STORED_SEALS);
	if (st.st_uid != geteuid())
		return error_set(-EINVAL, "stored status page: owned by uid %u, not wcached's "
			"uid %u", (unsigned)st.st_uid, (unsigned)geteuid());
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
		return error_set(-EINVAL, "stored status page: mode %04o is group- or "
			"world-writable (a fresh page is 0600)", (unsigned)(st.st_mode & 07777));
	if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR)
		return error_set(-EINVAL, "stored status page: not open read-write");
	if (map_page(p, fd) < 0)
		return -EINVAL;
	if (__atomic_load_n(&p->map[0], __ATOMIC_ACQUIRE) != STATUS_MAGIC) {
		munmap(p->map, STATUS_PAGE_BYTES);
		close(p->ro_fd);
		p->map = NULL;
		p->fd = p->ro_fd = -1;
		return error_set(-EINVAL, "stored status page: slot 0 is not the magic");
	}
	return 0;
}

/* The last generation number slot's word says was given out in it: what
 * a previous process left there (a generation it served, or a retired
 * slot's), 0 on a fresh page. */
static uint64_t
word_floor(const struct statuspage *p, unsigned slot)
{
	if (p->map == NULL || slot == 0 || slot >= STATUS_SLOTS)
		return 0;
	return __atomic_load_n(&p->map[slot], __ATOMIC_ACQUIRE) & ~STATUS_SLOT_RETIRED;
}

int
statuspage_slot_for(struct statuspage *p, const char *name, unsigned *slot)
{
	struct status_slot *slots;
	unsigned given_back = 0;
	char *n;

	for (unsigned i = 1; i < p->nslots; i++) {
		if (p->slots[i].free) {
			given_back = given_back != 0 ? given_back : i;
		} else if (strcmp(p->slots[i].name, name) == 0) {
			*slot = i;
			return 0;
		}
	}
	if ((n = strdup(name)) == NULL)
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	if (given_back != 0) {
		free(p->slots[given_back].name);
		p->slots[given_back] = (struct status_slot){ .name = n,
			.last_generation = word_floor(p, given_back),
			.first = word_floor(p, given_back) };
		*slot = given_back;
		return 0;
	}
	if (p->nslots == 0)
		p->nslots = 1; /* slot 0 holds the magic */
	if (p->nslots >= STATUS_SLOTS) {
		free(n);
		return error_set(-ENOSPC, "model \"%s\": the status page has no slot left: "
			"each of its %u belongs to a model name that has served since wcached "
			"started or that a warm restart carried (a restart, warm or cold, "
			"frees the slots of the names not loaded when it stops)", name,
			STATUS_SLOTS - 1);
	}
	if ((slots = realloc(p->slots, (p->nslots + 1) * sizeof(*slots))) == NULL) {
		free(n);
		return error_set(-ENOMEM, "model \"%s\": out of memory", name);
	}
	p->slots = slots;
	slots[p->nslots] = (struct status_slot){ .name = n,
		.last_generation = word_floor(p, p->nslots),
		.first = word_floor(p, p->nslots) };
	*slot = p->nslots++;
	return 0;
}

void
statuspage_release_slot(struct statuspage *p, unsigned slot)
{
	if (slot == 0 || slot >= p->nslots ||
		p->slots[slot].last_generation != p->slots[slot].first)
		return;
	p->slots[slot].free = true;
}

int
statuspage_restore_slot(struct statuspage *p, unsigned slot, const char *name,
	uint64_t last_generation)
{
	struct status_slot *slots;
	char *n;

	if (slot == 0 || slot >= STATUS_SLOTS ||
	    (slot < p->nslots && !p->slots[slot].free && p->slots[slot].name[0] != 0))
		return error_set(-EINVAL, "status slot %u of model \"%s\": taken or out of range",
			slot, name);
	if (slot >= p->nslots) {
		unsigned first = p->nslots == 0 ? 1 : p->nslots;

		if ((slots = realloc(p->slots, (slot + 1) * sizeof(*slots))) == NULL)
			return error_set(-ENOMEM, "status slots: out of memory");
		p->slots = slots;
		for (unsigned i = first; i <= slot; i++) {
			/* A gap: a slot nobody owns, named "" (no model is),
			 * free for a new name, which numbers from its word. */
			slots[i] = (struct status_slot){ .free = true };
			if ((slots[i].name = strdup("")) == NULL) {
				p->nslots = i;
				return error_set(-ENOMEM, "status slots: out of memory");
			}
		}
		p->nslots = slot + 1;
	}
	if ((n = strdup(name)) == NULL)
		return error_set(-ENOMEM, "status slots: out of memory");
	free(p->slots[slot].name);
	/* The word may say more: a generation served after the description
	 * was stored, by a process that did not stop. */
	if (word_floor(p, slot) > last_generation)
		last_generation = word_floor(p, slot);
	p->slots[slot] = (struct status_slot){ .name = n, .last_generation = last_generation };
	return 0;
}

uint64_t
statuspage_last_generation(const struct statuspage *p, unsigned slot)
{
	return slot != 0 && slot < p->nslots ? p->slots[slot].last_generation : 0;
}

void
statuspage_set_last_generation(struct statuspage *p, unsigned slot, uint64_t number)
{
	if (slot != 0 && slot < p->nslots)
		p->slots[slot].last_generation = number;
}

void
statuspage_publish(struct statuspage *p, unsigned slot, uint64_t generation)
{
	/* Not served, once its name has served: the last number with the
	 * bit, so that a restart that does not carry the name can give the
	 * slot to a new one numbered above it (statuspage.h). */
	if (generation == 0 && slot < p->nslots && p->slots[slot].last_generation != 0)
		generation = STATUS_SLOT_RETIRED | p->slots[slot].last_generation;
	if (slot != 0 && p->map != NULL)
		__atomic_store_n(&p->map[slot], generation, __ATOMIC_RELEASE);
}

void
statuspage_close(struct statuspage *p)
{
	for (unsigned i = 1; i < p->nslots; i++)
		free(p->slots[i].name);
	free(p->slots);
	p->slots = NULL;
	p->nslots = 0;
	if (p->map != NULL)
		munmap(p->map, STATUS_PAGE_BYTES);
	if (p->fd >= 0)
		close(p->fd);
	if (p->ro_fd >= 0)
		close(p->ro_fd);
	p->map = NULL;
	p->fd = p->ro_fd = -1;
}
