/*
 * model.h: what a wc_model is inside the library.
 *
 * A model is an index and one read-only mapping per file. It owns the
 * mappings, the index when wc_open_file() compiled it, and the
 * descriptors it keeps of its files (wc_model_fd(): a derived artifact's
 * memfd, the files of a wc_attach_fds() model). It knows nothing
 * of clients, connections or the daemon: a model attached through wcached
 * (attach.c) carries a release hook, which wc_release() calls instead of
 * model_free(), and which tells the daemon and drops what the model shared
 * with its client (the index mapping, the status page).
 *
 * Layering: model.c < attach_reply.c < attach.c. model.c calls only
 * format/ and base/; the attach code sets the hook and calls model.c.
 */
#ifndef WC_MODEL_H
#define WC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "format/index.h"
#include "lib/wcache.h"

struct model_map {
	const uint8_t *base; /* NULL for an empty file */
	uint64_t size;
};

/* Who frees a model's index. */
enum model_index_owner {
	MODEL_INDEX_OWNED = 1, /* malloc'd (wc_open_file): model_free() frees it */
	MODEL_INDEX_BORROWED,  /* kept alive by whoever set the release hook, which
				* drops it after model_free() (an attached model's
				* index mapping, shared with its client) */
};

/*
 * A release hook: wc_release() calls fn(m, ctx) instead of model_free(m).
 * fn owns the release from then on: it must call model_free(m) (before
 * telling anyone the model's pages are free) and drop ctx.
 */
typedef void (*model_release_fn)(wc_model *m, void *ctx);

struct wc_model {
	const uint8_t *index;
	size_t index_len;
	enum model_index_owner index_owner;
	struct index_header header;
	struct model_map *maps;    /* header.file_count entries */
	char *name;                /* the model name, for messages */
	/* Set by the attach code; 0 and NULL for a model from wc_open_file(). */
	uint64_t generation;
	const uint64_t *status_word;  /* this model's slot in a status page that
				       * outlives the model (the hook drops it) */
	model_release_fn release;
	void *release_ctx;
	/* The descriptors kept for wc_model_fd(), one per file (header.
	 * file_count entries, each -1 or a descriptor), or NULL: those of a
	 * derived artifact's memfd, which has no path another mapping could
	 * be made through, and of a model from wc_attach_fds() (attach_reply.c
	 * keeps the O_RDONLY, close-on-exec descriptors wcached sent). The
	 * model owns them: model_free() closes them, each only while it is
	 * still the file file_ids names and no model got its number since.
	 * Set by model_keep_fds() only; read and written under its lock; an
	 * entry below -1 is one marked to be closed (model.c). */
	int *file_fds;
	struct wc_model *kept_next; /* the next model that keeps descriptors */
	/* What fstat() said of each file's descriptor when the model got it
	 * (header.file_count entries), for wc_model_file_identity(): set by
	 * the attach code for every model made of wcached's descriptors
	 * (attach_reply.c), NULL for a model from wc_open_file/fd(). */
	wc_file_identity *file_ids;
};

/*
 * Makes a model of an index and its file mappings, taking ownership of
 * the mappings, and of the index when owner is MODEL_INDEX_OWNED, on
 * success only. maps has one entry per file of the index, in order, each as
 * large as the index says. what names the model in messages. The model
 * keeps no descriptor (file_fds NULL) until its maker gives it some.
 */
int model_new(const char *what, const uint8_t *index, size_t index_len,
	enum model_index_owner owner, struct model_map *maps, size_t nmaps, wc_model **out);

/* Closes the descriptors fds[0 .. n) that are not -1 and sets each to -1:
 * one close_range() when they are consecutive numbers (the kernel installs
 * received descriptors lowest-first, so they usually are; every number in
 * the range is then one of them), else one close() each. */
void model_close_fds(int *fds, size_t n);

/*
 * Gives m the descriptors fds (header.file_count entries, each -1 or a
 * descriptor the kernel just gave this process), which m then owns: any
 * other live model that recorded one of those numbers lost it (closed
 * behind its back) and forgets it, so its release cannot close m's.
 */
void model_keep_fds(wc_model *m, int *fds);

/*
 * A receive of descriptors begins, and ends once every descriptor it got
 * is a model's (model_keep_fds) or closed: meanwhile no kept descriptor is
 * closed (a model that lost its number cannot tell it from the receive's
 * of the same file) but marked, and the last receive to end closes those
 * still the models' (model.c). request.c begins one just before a
 * recvmsg() under a client's lock, once a message waits (never for the
 * wait, which may last as long as a build), and ends it at once when
 * that got no descriptor or closed them, else when it gives the lock
 * back. A child after fork() has none in flight.
 */
void model_receive_begin(void);
void model_receive_end(void);

/* Unmaps the files, closes file_fds (each only while it is still the
 * device and inode file_ids recorded, or its fstat fails otherwise than
 * with EBADF: a descriptor this process closed behind the model's back
 * and whose number now names another file is left alone, as is one
 * another model got since; while a receive is in flight, when the last
 * one ends) and frees what model_new() took; calls no release hook. NULL
 * is fine. */
void model_free(wc_model *m);

struct model_source;

/*
 * Makes a model that reads the opened source s (format/source.h) without
 * taking anything from it: s stays open and must outlive the model, which
 * wc_release() frees. For a caller that needs the files it read from as
 * opened (wcachectl convert checks them after the copy): wc_open_file()
 * would open them a second time, perhaps other files by then.
 */
int model_view_source(const char *what, const struct model_source *s, wc_model **out);

#endif
