/*
 * model.h: what a wc_model is inside the library.
 *
 * A model is an index (malloc'd by wc_open_file, or a mapping of the
 * daemon's sealed memfd) and one read-only mapping per file. It owns all of
 * them. A model attached through wcached also remembers its client and the
 * daemon's handle, so wc_release() can tell the daemon.
 */
#ifndef WC_MODEL_H
#define WC_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "format/index.h"
#include "lib/wcache.h"

/*
 * The daemon's status page as a client maps it: once per client, shared by
 * the client and every model attached through it, unmapped when the last of
 * them lets go (models outlive their client).
 */
struct attach_status {
	const uint64_t *page;
	size_t len;
	unsigned refs; /* atomic */
};

/*
 * An index memfd as a client maps it, shared by the models of one
 * generation attached through the client and kept by the client between
 * attaches while it is current (the daemon keeps it anyway), so attaching
 * the same generation again maps nothing. Identified by the memfd's inode.
 */
struct attach_index {
	const uint8_t *base;
	size_t len;
	dev_t dev;
	ino_t ino;
	unsigned refs; /* atomic */
};

/* What a client keeps from one attach to the next: the status page and the
 * last index; attach_reply() uses and updates both. */
struct attach_cache {
	struct attach_status *status;
	struct attach_index *index;
};

struct model_map {
	const uint8_t *base; /* NULL for an empty file */
	uint64_t size;
};

struct wc_model {
	const uint8_t *index;
	size_t index_len;
	int index_mapped;          /* 1: munmap, 0: free */
	struct index_header header;
	struct model_map *maps;    /* header.file_count entries */
	uint64_t generation;
	/* Attached models only. */
	struct wc_client *client;  /* NULL once the client is gone */
	uint64_t handle;
	uint64_t connection;       /* the client's connection number it came over */
	pid_t pid;                 /* the process that attached */
	struct wc_model *next;     /* in the client's list */
	struct wc_model **prevp;
	char *name;                /* the model name, for messages */
	struct attach_status *status; /* the client's status page, or NULL */
	struct attach_index *shared_index; /* attached: the index mapping, else NULL */
	const uint64_t *status_word;  /* this model's slot in it */
};

/*
 * Makes a model of an index and its file mappings, taking ownership of
 * both on success only. index_mapped says how to free the index. maps has
 * one entry per file of the index, in order, each as large as the index
 * says. what names the model in messages.
 */
int model_new(const char *what, const uint8_t *index, size_t index_len, int index_mapped,
	struct model_map *maps, size_t nmaps, wc_model **out);

/* Frees what model_new() took, without any daemon bookkeeping. */
void model_free(wc_model *m);

#endif

/* attach.c: unlinks an attached model from its client and returns the
 * daemon's handle to release, or 0 when nothing is to be sent (a model from
 * wc_open_file(), or one attached by another process before fork()), and
 * in *connection the client's connection it came over. Then, after the
 * model is unmapped, attach_send_release(client, handle, connection) tells the
 * daemon: unmapping first means the daemon never acts on a release (an
 * eviction of a cold model, say) while this process still maps the pages;
 * it sends nothing when the client has reconnected since (see attach.c). */
uint64_t attach_forget(wc_model *m, uint64_t *connection);
void attach_send_release(wc_client *c, uint64_t handle, uint64_t connection);

/* attach_reply.c: drop one reference to a status page or an index
 * mapping, unmapping it with the last; NULL is fine. */
void attach_status_unref(struct attach_status *s);
void attach_index_unref(struct attach_index *x);

/* attach_reply.c: drops what a client keeps between attaches. */
void attach_cache_clear(struct attach_cache *cache);

/*
 * attach_reply.c: makes a model of the daemon's reply to ATTACH (buf, len)
 * and its descriptors, checking all of it (PROTOCOL.md, "What a client
 * checks after ATTACH_OK"). Closes every descriptor, on every path. name is
 * the model as requested, where names the daemon in messages ("wcached at
 * PATH"). cache is the client's: its status page and index mapping are
 * used when they match the reply, and replaced or set from a good reply
 * otherwise. *unusable is set to 1 when
 * the reply was not one wcached would send, so the connection cannot be
 * trusted any more. The model's generation and handle come from the reply;
 * the caller links it to its client.
 */
int attach_reply(const char *name, const char *where, const uint8_t *buf, size_t len, int *fds,
	size_t nfds, struct attach_cache *cache, int *unusable, wc_model **out);
