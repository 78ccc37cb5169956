/*
 * attach_reply.h: turning the daemon's reply to ATTACH into a model
 * (attach_reply.c), and the mappings a client shares with the models
 * attached through it.
 *
 * Layering: model.c < attach_reply.c < attach.c. attach_reply.c makes a
 * model with model.c and knows nothing of clients or sockets; attach.c
 * keeps the client's attach_cache and owns each attached model's
 * attach_model, which it frees from the model's release hook.
 */
#ifndef WC_ATTACH_REPLY_H
#define WC_ATTACH_REPLY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/model.h"

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

/*
 * A model made from an ATTACH_OK, and what it holds that is not its own:
 * a reference to the index mapping (the model's index is borrowed from it)
 * and to the status page its status_word points into. Both must outlive the
 * model: attach_model_free() frees the model first.
 */
struct attach_model {
	wc_model *model;
	uint64_t handle;               /* the daemon's, for RELEASE */
	struct attach_index *index;
	struct attach_status *status;  /* NULL when the page failed its checks */
	/* What wcached said the files were copied from (attach.c,
	 * wc_model_file_origin, asked once): origins (one per file), or
	 * origins_none when they are not staged copies; set once, under
	 * attach.c's clients_lock. */
	wc_file_identity *origins;
	int origins_none;
};

/* Drop one reference to a status page or an index mapping, unmapping it
 * with the last; NULL is fine. */
void attach_status_unref(struct attach_status *s);
void attach_index_unref(struct attach_index *x);

/* Drops what a client keeps between attaches. */
void attach_cache_clear(struct attach_cache *cache);

/*
 * Makes a model of the daemon's reply to ATTACH (buf, len) and its
 * descriptors, checking all of it (PROTOCOL.md, "What a client checks after
 * ATTACH_OK"). Closes every descriptor, on every path. name is the model as
 * requested, where names the daemon in messages ("wcached at PATH"). cache
 * is the client's: its status page and index mapping are used when they
 * match the reply, and replaced or set from a good reply otherwise.
 * *unusable is set to 1 when the reply was not one wcached would send, so
 * the connection cannot be trusted any more. On success *out holds the
 * model (its generation from the reply, no release hook) and the handle;
 * the caller frees it with attach_model_free() or hands it to a release
 * hook that will.
 */
int attach_reply(const char *name, const char *where, const uint8_t *buf, size_t len, int *fds,
	size_t nfds, struct attach_cache *cache, int *unusable, struct attach_model *out);

/* The request a reply answers, which decides what it may be. */
enum attach_request {
	ATTACH_REQUEST_ATTACH = 1, /* ATTACH_OK or ERROR */
	ATTACH_REQUEST_ATTACH_FDS, /* the same; the model keeps its files' descriptors */
	ATTACH_REQUEST_DERIVE,     /* ATTACH_OK of an artifact (one file), BUILD, or ERROR */
	ATTACH_REQUEST_PUBLISH,    /* ATTACH_OK of an artifact (one file), or ERROR */
};

/*
 * What a reply granted: set whenever it was a valid ATTACH_OK or BUILD on a
 * connection that stays usable, whether or not a model could then be made
 * of it. A mapping this process cannot make (mmap's ENOMEM under
 * RLIMIT_AS, out of memory, a failing fcntl) fails the call, but the
 * daemon has made the attach (handle), and for a BUILD has made this
 * process the builder (token): the caller, which keeps the connection,
 * abandons the build and releases the attach.
 */
struct attach_grant {
	int granted;     /* 0: nothing to undo (the other fields are 0) */
	int build;       /* a BUILD: token names the build */
	uint64_t handle; /* the attach the daemon counts, for RELEASE */
	uint64_t token;
};

/*
 * attach_reply() for the reply to req, saying in *grant what the reply
 * granted (above). key (NULL for ATTACH) names the derived artifact in
 * messages and in the model's name ("NAME [KEY]"). Returns 0 when *out is
 * the model or artifact asked for; 1 for a BUILD (only to DERIVE): *out is
 * the source generation (named name) and grant->token the build's token;
 * or a negative errno as attach_reply(). Any other reply, and an artifact
 * of more than one file, is malformed (-EBADMSG, *unusable set). Closes
 * every descriptor, on every path, but those a model takes when it is made
 * (an artifact's file's, every file's for ATTACH_REQUEST_ATTACH_FDS: for
 * wc_model_fd(); model_free() closes them).
 */
int attach_reply_grant(enum attach_request req, const char *name, const char *key,
	const char *where, const uint8_t *buf, size_t len, int *fds, size_t nfds,
	struct attach_cache *cache, int *unusable, struct attach_model *out,
	struct attach_grant *grant);

/* Frees the model (model_free(): its files are unmapped first), then drops
 * its index and status page references; zeroes a; safe on a zeroed one. */
void attach_model_free(struct attach_model *a);

#endif
