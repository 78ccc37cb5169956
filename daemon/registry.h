/*
 * registry.h: the models wcached serves and their generations.
 *
 * A model name points to its current generation: the open files of one
 * version of the model, their mappings, the sealed index memfd, and a
 * number that only grows. Clients hold references to generations, not to
 * models: a generation stays open until it is no longer current, no client
 * holds it, and no warming job reads it; then its files are unmapped and
 * closed and the kernel may free their pages.
 *
 * Everything here runs on the event loop thread.
 */
#ifndef WC_REGISTRY_H
#define WC_REGISTRY_H

#include <stdint.h>
#include <sys/types.h>

#include "source.h"
#include "warm.h"

enum pin_mode { PIN_NONE = 0, PIN_METADATA, PIN_ALL };

enum gen_state {
	GEN_WARMING, /* being read into the page cache; attachable */
	GEN_READY,   /* warm */
	GEN_MODIFIED,/* a file was changed in place: no new attaches */
	GEN_FAILED,  /* warming failed (I/O error, truncated file) */
};

struct model_entry;

struct generation {
	uint64_t number;
	struct model_entry *model;  /* NULL once the model is unloaded */
	char *model_name;           /* for messages after unload */
	struct model_source source; /* files: fds and mappings, owned */
	int index_fd;               /* sealed memfd, owned */
	const uint8_t *index;       /* read-only mapping of index_fd */
	size_t index_size;
	uint64_t bytes;             /* sum of file sizes */
	enum gen_state state;
	unsigned attached;          /* client references */
	unsigned warm_pending;      /* warming jobs not yet done */
	uint64_t warm_bytes;        /* read by finished jobs */
	double warm_seconds;        /* longest job's time */
	int warm_error;             /* first job error, 0 if none */
	int pinned;                 /* PIN_* actually applied */
	struct warm_job **jobs;     /* one per file while it warms, else NULL */
	struct registry *registry;
	struct generation *next;    /* in the registry's list */
};

struct model_entry {
	char *name;
	char *path;
	enum pin_mode pin;
	int warm;
	struct generation *current; /* NULL when the model failed to load */
	uint64_t last_generation;
	char *error;                /* last load error, NULL if none */
	uint64_t attach_count;      /* successful attaches */
	uint64_t error_count;       /* refused attaches */
	struct model_entry *next;
};

struct registry {
	struct model_entry *models;
	struct generation *generations; /* every open generation */
	struct warm_pool *pool;         /* NULL: warming disabled */
	void (*changed)(struct registry *); /* called when warming progresses or ends */
	void *owner;
};

/* Initialises an empty registry; pool may be NULL. */
void registry_init(struct registry *r, struct warm_pool *pool);

/*
 * Opens and validates path and makes it the current generation of the
 * model name (adding the model if it is new). On failure the model is kept
 * with its error (so status can show it) and -errno is returned with the
 * message in error_get(); a previous current generation keeps serving.
 */
int registry_load(struct registry *r, const char *name, const char *path, enum pin_mode pin,
	int warm);

/* Stops serving name; its generations close when released. -ENOENT. */
int registry_unload(struct registry *r, const char *name);

/* The model called name, or whose configured path is name; NULL if none. */
struct model_entry *registry_find(struct registry *r, const char *name);

/* Takes and drops a client reference on a generation. */
void generation_ref(struct generation *g);
void generation_unref(struct registry *r, struct generation *g);

/* Unloads every model; generations still held by clients stay open until
 * released. Then registry_close() frees what is left (at shutdown, after all
 * clients are gone). */
void registry_close(struct registry *r);

/* Warming totals over all current generations, for status lines. */
void registry_progress(const struct registry *r, uint64_t *done, uint64_t *total,
	unsigned *warming, unsigned *models);

const char *gen_state_name(enum gen_state s);

#endif
