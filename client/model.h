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

#include "index.h"
#include "wcache.h"

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
	pid_t pid;                 /* the process that attached */
	struct wc_model *next;     /* in the client's list */
	struct wc_model **prevp;
	char *name;                /* the model name, for messages */
	const uint64_t *status_page;  /* mapping of the daemon's status page, or NULL */
	size_t status_len;
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

/* attach.c: tells the daemon an attached model is released (when this
 * process attached it and its client is still connected) and unlinks it
 * from its client. A no-op for models from wc_open_file(). */
void attach_forget(wc_model *m);
