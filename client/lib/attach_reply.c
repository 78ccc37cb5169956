/*
 * attach_reply.c: turning the daemon's reply to ATTACH into a model
 * (proto/PROTOCOL.md, "What a client checks after ATTACH_OK").
 *
 * No socket here: the reply's bytes and descriptors come in, a model or an
 * error comes out, and every descriptor is closed on every path. That is
 * what tests/fuzz/fuzz_attach.c drives with hostile replies.
 *
 * Nothing in an attach is proportional to the model's tensor count, and
 * little to its file count: every descriptor is checked (fstat, seals or
 * access mode) and then the index and all the files are mapped into one
 * reserved range of address space, so that a release is a single munmap()
 * however many shards the model has. The index is not pre-faulted: its
 * pages are the daemon's, resident in the memfd, and a lookup faults in the
 * few it touches. The status page is mapped once per client and shared by
 * every model attached through it; so is the index of the generation the
 * client last attached, which it keeps while that generation is current
 * (see attach.c), so attaching it again maps no index at all.
 *
 * The replies to DERIVE and PUBLISH are made into models here too
 * (attach_reply_grant()): an artifact's ATTACH_OK is a model of one file,
 * named "NAME [KEY]", which keeps that file's descriptor (wc_model_fd():
 * a memfd has no path to map it through again), and a BUILD is the
 * source's ATTACH_OK with a token. A model from wc_attach_fds() keeps
 * every file's descriptor the same way.
 *
 * Layering: model.c < attach_reply.c < attach.c. A model made here borrows
 * its index from the attach_index mapping; the attach_model that holds
 * both (attach_reply.h) belongs to the caller, attach.c.
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
#include "base/file.h"
#include "proto/memfds.h"
#include "lib/attach_reply.h"
#include "lib/model.h"
#include "proto/wire.h"

/*
 * The index memfd fd, mapped: the client's cached mapping when fd is the
 * same inode (checked and sealed when it was first mapped, and seals
 * cannot be removed: F_SEAL_SEAL), else a new mapping after the checks (a
 * sealed regular file of want bytes, at least an index header). *out gets
 * a reference for the model; *fresh says it is a new mapping, which the
 * caller makes the cached one once the attach has succeeded.
 */
static int
use_index(int fd, uint64_t want, const char *what, const struct attach_index *cached,
	struct attach_index **out, int *fresh)
{
	struct attach_index *x;
	struct stat st;
	int seals;
	void *p;

	if (fstat(fd, &st) == -1)
		return error_set(-errno, "%s: index: fstat: %s", what, strerror(errno));
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != want)
		return error_set(-EBADMSG, "%s: received descriptor is not a %llu-byte file",
			what, (unsigned long long)want);
	if (cached != NULL && cached->dev == st.st_dev && cached->ino == st.st_ino &&
		cached->len == want) {
		x = (struct attach_index *)cached;
		__atomic_add_fetch(&x->refs, 1, __ATOMIC_RELAXED);
		*out = x;
		*fresh = 0;
		return 0;
	}
	/* EINVAL: not a file that can be sealed. Any other failure is the
	 * error, not a claim about the descriptor (whose -EBADMSG would
	 * also drop a connection to a wcached that did nothing wrong). */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals == -1 && errno != EINVAL)
		return error_set(-errno, "%s: index: fcntl: %s", what, strerror(errno));
	if (seals == -1 || (seals & INDEX_SEALS) != INDEX_SEALS)
		return error_set(-EBADMSG, "%s: index is not sealed", what);
	if (want < INDEX_HEADER_SIZE)
		return error_set(-EBADMSG, "model \"%s\": wcached sent a damaged index (index: "
			"%llu bytes, shorter than its header)", what, (unsigned long long)want);
	if ((x = calloc(1, sizeof(*x))) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", what);
	/* Not populated: the pages are the daemon's, resident in the memfd; a
	 * lookup faults in the few it touches, and nothing on attach or
	 * release is proportional to the tensor count. */
	if ((p = mmap(NULL, (size_t)want, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		free(x);
		return error_set(-errno, "%s: index: mmap: %s", what, strerror(errno));
	}
	x->base = p;
	x->len = (size_t)want;
	x->dev = st.st_dev;
	x->ino = st.st_ino;
	x->refs = 1;
	*out = x;
	*fresh = 1;
	return 0;
}

void
attach_index_unref(struct attach_index *x)
{
	if (x == NULL || __atomic_sub_fetch(&x->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	munmap((void *)x->base, x->len);
	free(x);
}

void
attach_cache_clear(struct attach_cache *cache)
{
	attach_status_unref(cache->status);
	attach_index_unref(cache->index);
	cache->status = NULL;
	cache->index = NULL;
}

/*
 * Maps the daemon's status page, checked as PROTOCOL.md says: a sealed
 * memfd that cannot shrink (so reading it never faults) with the magic in
 * slot 0. NULL when a check fails: the model works, only its stale checks
 * say 0.
 */
static struct attach_status *
map_status(int fd)
{
	struct attach_status *s;
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);
	void *p;

	if (seals == -1 || (seals & STATUS_PAGE_CLIENT_SEALS) != STATUS_PAGE_CLIENT_SEALS ||
		fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) ||
		st.st_size < STATUS_PAGE_MIN_BYTES || (uint64_t)st.st_size > STATUS_PAGE_MAX_BYTES)
		return NULL;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (__atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE) != STATUS_MAGIC ||
		(s = calloc(1, sizeof(*s))) == NULL) {
		munmap(p, (size_t)st.st_size);
		return NULL;
	}
	s->page = p;
	s->len = (size_t)st.st_size;
	s->refs = 1; /* the client's */
	return s;
}

void
attach_status_unref(struct attach_status *s)
{
	if (s == NULL || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	munmap((void *)s->page, s->len);
	free(s);
}

/*
 * Gives the model of a the status page of its client: the client's mapping
 * when it has one (every attach on a connection passes the same page, so
 * the new descriptor is not even looked at), else a new one that becomes
 * the client's when its slot is in it.
 */
static void
use_status(struct attach_model *a, int fd, uint64_t slot, struct attach_status **cache)
{
	struct attach_status *s = *cache;

	if (s == NULL && (s = map_status(fd)) == NULL)
		return;
	if (slot == 0 || slot >= s->len / 8) {
		/* A page the slot is not in fails the check (PROTOCOL.md); a
		 * page the client already holds stays for the next attach. */
		if (s != *cache)
			attach_status_unref(s);
		return;
	}
	*cache = s;
	__atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
	a->status = s;
	a->model->status_word = s->page + slot;
}

/* The name of file i for a message, without trusting the index. */
static const char *
file_name(const uint8_t *index, const struct index_header *h, uint32_t i)
{
	const char *name;
	uint64_t size;

	return index_file_at(index, h, i, &name, &size) == 0 ? name : "(damaged file name)";
}

/*
 * Builds a model from ATTACH_OK's descriptors: fds[0] is the index. With
 * keep_fds (a derived artifact: one memfd, no path; wc_attach_fds()), the
 * model takes the files' descriptors on success (those fds set to -1) for
 * wc_model_fd(): O_RDONLY (checked below), received close-on-exec
 * (fdp_recv); an artifact's is the memfd wcached sealed against writes,
 * shrinking and growing. A model from wc_attach() has paths to open
 * instead, and keeps none.
 */
static int
model_from_fds(const char *name, const struct wire_attach_ok *ok, int *fds, size_t nfds,
	int keep_fds, struct attach_cache *cache, struct attach_model *out)
{
	struct index_header h;
	struct model_map *maps = NULL;
	wc_file_identity *ids = NULL;
	int *kept = NULL;
	struct attach_index *xi = NULL;
	const uint8_t *index;
	size_t want = 1 + (size_t)ok->file_count + ((ok->flags & WIRE_ATTACH_STATUS) ? 1 : 0);
	size_t isize = (size_t)ok->index_size;
	uint32_t mapped = 0;
	int r, fresh = 0;
	void *p;

	if (nfds != want || ok->file_count > WIRE_MAX_FILES || ok->index_size > INDEX_MAX_SIZE)
		return error_set(-EBADMSG,
			"model \"%s\": wcached sent %zu descriptors for %u files",
			name, nfds, ok->file_count);
	if ((r = use_index(fds[0], ok->index_size, name, cache->index, &xi, &fresh)) < 0 ||
		xi == NULL)
		return r < 0 ? r : -EIO;
	index = xi->base;
	if ((r = index_open(index, isize, &h)) < 0 || h.file_count != ok->file_count) {
		char why[256];

		snprintf(why, sizeof(why), "%s", r < 0 ? error_get() : "file count differs");
		r = r < 0 ? r : -EBADMSG;
		error_set(r, "model \"%s\": wcached sent a damaged index (%s)", name, why);
		goto fail;
	}
	if ((maps = calloc(h.file_count, sizeof(*maps))) == NULL ||
		(ids = calloc(h.file_count ? h.file_count : 1, sizeof(*ids))) == NULL ||
		(keep_fds && (kept = calloc(h.file_count ? h.file_count : 1, sizeof(*kept))) ==
			NULL)) {
		r = error_set(-ENOMEM, "model \"%s\": out of memory", name);
		goto fail;
	}
	for (; mapped < h.file_count; mapped++) {
		uint32_t i = mapped;
		const char *fname;
		struct stat st;
		int flags;

		if (fstat(fds[1 + i], &st) == -1) {
			r = error_set(-errno, "model \"%s\": %s: fstat: %s", name,
				file_name(index, &h, i), strerror(errno));
			goto fail;
		}
		/* index_build() keeps the file names together: one page. */
		if ((r = index_file_at(index, &h, i, &fname, &maps[i].size)) < 0) {
			error_prefix(name);
			goto fail;
		}
		if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != maps[i].size) {
			r = error_set(-EBADMSG, "%s: %s: received descriptor is not a %llu-byte "
				"file", name, fname, (unsigned long long)maps[i].size);
			goto fail;
		}
		ids[i] = (wc_file_identity){ .dev = (uint64_t)st.st_dev,
			.ino = (uint64_t)st.st_ino, .size = (uint64_t)st.st_size,
			.mtime_ns = file_time_ns(&st.st_mtim),
			.ctime_ns = file_time_ns(&st.st_ctim) };
		/* wcached passes model files read-only; anything else is not
		 * from wcached. */
		if ((flags = fcntl(fds[1 + i], F_GETFL)) == -1) {
			r = error_set(-errno, "%s: %s: fcntl: %s", name, fname, strerror(errno));
			goto fail;
		}
		if ((flags & O_ACCMODE) != O_RDONLY) {
			r = error_set(-EBADMSG, "%s: %s: received a writable descriptor", name,
				fname);
			goto fail;
		}
		if (maps[i].size == 0)
			continue;
		/* Model files MAP_PRIVATE (see wc_model_cow()); reading them is
		 * the same page cache as MAP_SHARED. */
		p = mmap(NULL, (size_t)maps[i].size, PROT_READ, MAP_PRIVATE | MAP_NORESERVE,
			fds[1 + i], 0);
		if (p == MAP_FAILED) {
			r = error_set(-errno, "%s: %s: mmap: %s", name, fname, strerror(errno));
			goto fail;
		}
		maps[i].base = p;
	}
	if ((r = model_new(name, index, isize, MODEL_INDEX_BORROWED, maps, h.file_count,
		     &out->model)) < 0)
		goto fail;
	out->model->file_ids = ids;
	if (kept != NULL) {
		for (uint32_t i = 0; i < h.file_count; i++) {
			kept[i] = fds[1 + i];
			fds[1 + i] = -1;
		}
		model_keep_fds(out->model, kept);
	}
	out->index = xi;
	if (fresh) {
		/* The new generation's index is the one to keep. */
		attach_index_unref(cache->index);
		__atomic_add_fetch(&xi->refs, 1, __ATOMIC_RELAXED);
		cache->index = xi;
	}
	if (ok->flags & WIRE_ATTACH_STATUS)
		use_status(out, fds[1 + ok->file_count], ok->status_slot, &cache->status);
	return 0;
fail:
	for (uint32_t i = 0; i < mapped; i++)
		if (maps[i].base != NULL)
			munmap((void *)maps[i].base, (size_t)maps[i].size);
	free(maps);
	free(ids);
	free(kept);
	attach_index_unref(xi);
	return r;
}

int
attach_reply_grant(enum attach_request req, const char *name, const char *key,
	const char *where, const uint8_t *buf, size_t len, int *fds, size_t nfds,
	struct attach_cache *cache, int *unusable, struct attach_model *out,
	struct attach_grant *grant)
{
	struct wire_message msg;
	struct wire_attach_ok ok;
	struct attach_model a = { 0 };
	/* How messages name what was asked, and the name of what came. */
	char what[WIRE_MAX_NAME + WIRE_MAX_KEY + 32], model[WIRE_MAX_NAME + WIRE_MAX_KEY + 8];
	uint64_t build_token = 0;
	int r, is_build;
	int is_attach = req == ATTACH_REQUEST_ATTACH || req == ATTACH_REQUEST_ATTACH_FDS;

	*unusable = 1;
	memset(grant, 0, sizeof(*grant));
	if (key == NULL || is_attach) {
		snprintf(what, sizeof(what), "model \"%s\"", name);
		snprintf(model, sizeof(model), "%s", name);
	} else {
		snprintf(what, sizeof(what), "model \"%s\", key \"%s\"", name, key);
		snprintf(model, sizeof(model), "%s [%s]", name, key);
	}
	if ((r = wire_decode(buf, len, &msg)) < 0) {
		model_close_fds(fds, nfds);
		return error_set(r, "%s sent a malformed reply%s", where,
			r == -EPROTO ? " (protocol version mismatch: update libwcache or "
				       "wcached)" : "");
	}
	if (msg.h.type == WIRE_ERROR) {
		int32_t code;
		const char *text;
		size_t tlen;

		model_close_fds(fds, nfds);
		*unusable = 0;
		if (wire_get_error(&msg, &code, &text, &tlen) < 0)
			return error_set(-EBADMSG, "%s: malformed error from %s", what, where);
		code = -code; /* the wire carries positive errno values */
		if (code == -ENOENT && req != ATTACH_REQUEST_PUBLISH)
			return error_set(code, "model \"%s\" is not served by %s", name, where);
		return error_set(code, "%s: %.*s (%s)", what, (int)tlen, text, where);
	}
	/* BUILD answers only DERIVE; an artifact is one file. */
	is_build = msg.h.type == WIRE_BUILD && req == ATTACH_REQUEST_DERIVE;
	if (is_build ? wire_get_build(&msg, &ok, &build_token) < 0 :
		       msg.h.type != WIRE_ATTACH_OK || wire_get_attach_ok(&msg, &ok) < 0) {
		model_close_fds(fds, nfds);
		return error_set(-EBADMSG, "%s: unexpected reply from %s", what, where);
	}
	if (!is_build && !is_attach && ok.file_count != 1) {
		model_close_fds(fds, nfds);
		return error_set(-EBADMSG, "%s: %s sent an artifact of %u files, not 1", what,
			where, ok.file_count);
	}
	r = model_from_fds(is_build ? name : model, &ok, fds, nfds,
		!is_build && req != ATTACH_REQUEST_ATTACH, cache, &a);
	model_close_fds(fds, nfds);
	if (r < 0 || a.model == NULL) {
		r = r < 0 ? r : -EIO;
		*unusable = r == -EBADMSG; /* not a reply from wcached */
	} else {
		*unusable = 0;
	}
	if (!*unusable)
		*grant = (struct attach_grant){ .granted = 1, .build = is_build,
			.handle = ok.handle, .token = build_token };
	if (r < 0)
		return r;
	a.model->generation = ok.generation;
	a.handle = ok.handle;
	*out = a;
	return is_build;
}

int
attach_reply(const char *name, const char *where, const uint8_t *buf, size_t len, int *fds,
	size_t nfds, struct attach_cache *cache, int *unusable, struct attach_model *out)
{
	struct attach_grant grant;

	return attach_reply_grant(ATTACH_REQUEST_ATTACH, name, NULL, where, buf, len, fds, nfds,
		cache, unusable, out, &grant);
}

void
attach_model_free(struct attach_model *a)
{
	if (a == NULL)
		return;
	model_free(a->model);
	attach_index_unref(a->index);
	attach_status_unref(a->status);
	free(a->origins);
	memset(a, 0, sizeof(*a));
}
