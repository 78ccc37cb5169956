/*
 * model.c: the wc_model API over a compiled index and file mappings.
 *
 * Both ways of getting a model end here: wc_open_file() validates the files
 * in-process and compiles an index; wc_attach() maps the index and files the
 * daemon passed. Lookups go through the index reader, which checks every
 * offset it follows, and through a bounds check of each tensor against its
 * file's mapping, so even a damaged index cannot make us read outside a
 * mapping.
 *
 * Layering: the bottom of libwcache (model.c < attach_reply.c < attach.c).
 * This file calls format/ and base/ only. An attached model's release goes
 * through the hook the attach code set (model.h); nothing here knows of
 * clients, handles or connections.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/dtype.h"
#include "base/error.h"
#include "lib/model.h"
#include "format/source.h"
#include "proto/fdpass.h"

int
model_new(const char *what, const uint8_t *index, size_t index_len,
	enum model_index_owner owner, struct model_map *maps, size_t nmaps, wc_model **out)
{
	wc_model *m;
	struct index_header h;
	int r;

	if ((r = index_open(index, index_len, &h)) < 0) {
		error_prefix(what);
		return r;
	}
	if (h.file_count != nmaps)
		return error_set(-EBADMSG, "%s: index names %llu files, %zu given", what,
			(unsigned long long)h.file_count, nmaps);
	for (size_t i = 0; i < nmaps; i++) {
		const char *name;
		uint64_t size;

		if ((r = index_file_at(index, &h, i, NULL, &size)) < 0) {
			error_prefix(what);
			return r;
		}
		if (size != maps[i].size) {
			if (index_file_at(index, &h, i, &name, &size) < 0)
				name = "(damaged name)";
			return error_set(-EBADMSG, "%s: file %s is %llu bytes, index says %llu",
				what, name, (unsigned long long)maps[i].size,
				(unsigned long long)size);
		}
	}
	if ((m = calloc(1, sizeof(*m))) == NULL || (m->name = strdup(what)) == NULL) {
		free(m);
		return error_set(-ENOMEM, "%s: out of memory", what);
	}
	m->index = index;
	m->index_len = index_len;
	m->index_owner = owner;
	m->header = h;
	m->maps = maps;
	*out = m;
	return 0;
}

/* A mapping model_free() unmaps. */
struct range {
	uintptr_t start, end; /* end rounded up to a page */
};

static int
range_order(const void *a, const void *b)
{
	const struct range *x = a, *y = b;

	return (x->start > y->start) - (x->start < y->start);
}

/*
 * Unmaps the model's files with as few munmap() calls as there are runs of
 * adjacent mappings: the kernel places consecutive mappings next to each
 * other, so a model of 163 shards usually goes in one call. Every byte of
 * a run is one of the model's mappings, so the call unmaps nothing else.
 */
static void
unmap_all(wc_model *m)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	struct range stack[16], *r = stack;
	size_t n = 0, cap = m->header.file_count;

	if (cap > sizeof(stack) / sizeof(stack[0]) && (r = malloc(cap * sizeof(*r))) == NULL) {
		/* No memory to sort: one call per mapping. */
		for (uint64_t i = 0; i < m->header.file_count; i++)
			if (m->maps[i].base != NULL)
				munmap((void *)m->maps[i].base, (size_t)m->maps[i].size);
		return;
	}
	for (uint64_t i = 0; i < m->header.file_count; i++)
		if (m->maps[i].base != NULL)
			r[n++] = (struct range){ (uintptr_t)m->maps[i].base,
				((uintptr_t)m->maps[i].base + (uintptr_t)m->maps[i].size +
					page - 1) & ~(page - 1) };
	qsort(r, n, sizeof(*r), range_order);
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		uintptr_t end = r[i].end;

		while (j < n && r[j].start == end)
			end = r[j++].end;
		munmap((void *)r[i].start, end - r[i].start);
		i = j;
	}
	if (r != stack)
		free(r);
}

void
model_close_fds(int *fds, size_t n)
{
	size_t i;

	for (i = 1; i < n; i++)
		if (fds[i] != fds[0] + (int)i)
			break;
	if (n > 1 && i == n && fds[0] >= 0 &&
		close_range((unsigned)fds[0], (unsigned)fds[n - 1], 0) == 0) {
		for (i = 0; i < n; i++)
			fds[i] = -1;
		return;
	}
	fdp_close_all(fds, n);
}

/*
 * The models of this process that keep descriptors (file_fds), linked
 * through kept_next. The kernel gives a new model's descriptors numbers
 * that were free, so a live model that recorded one of those numbers lost
 * it (closed behind its back: closefrom() in a daemonizing child) and
 * forgets it (model_keep_fds): no two models close the same number, even
 * when both kept the same file there (a re-attach gets wcached's same open
 * file of a staged copy, the same device and inode: review rev174 F2).
 * kept_lock guards the list and every registered model's file_fds; it is
 * held only for loads, stores, fstat() and close(), never while waiting,
 * and fork() waits for it to be free, so a child never inherits it held.
 *
 * A receive in flight (model_receive_begin() to model_receive_end()) holds
 * descriptors the kernel gave it that no model has registered yet: numbers
 * a model that lost them cannot tell from its own when they are of the
 * same file (a re-attach on another thread). So while one is in flight a
 * kept descriptor is not closed but marked to be (kept_pending()): the
 * last receive to end closes those marked that no model got since and
 * that are still their file. A model released meanwhile waits for that on
 * kept_released, with only its descriptors and their identities.
 */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t kept_atfork_once = PTHREAD_ONCE_INIT;
static wc_model *kept_models;
static wc_model *kept_released; /* released while a receive was in flight */
static unsigned kept_receiving; /* receives in flight */
static int kept_marked;         /* a descriptor is marked to be closed */

/* A kept descriptor marked to be closed is stored as kept_pending(fd), which
 * is below -1: wc_model_fd() lends none, and the number is kept_number(). */
static int
kept_pending(int fd)
{
	return -2 - fd;
}

static int
kept_number(int stored)
{
	return stored >= 0 ? stored : stored <= -2 ? -2 - stored : -1;
}

static void
kept_lock_take(void)
{
	pthread_mutex_lock(&kept_lock);
}

static void
kept_lock_give(void)
{
	pthread_mutex_unlock(&kept_lock);
}

/* In a child, no receive of the parent's other threads goes on. */
static void
kept_lock_child(void)
{
	kept_receiving = 0;
	pthread_mutex_unlock(&kept_lock);
}

static void
kept_atfork(void)
{
	(void)pthread_atfork(kept_lock_take, kept_lock_give, kept_lock_child);
}

/* Forgets each descriptor of a model on list whose number is one of
 * fds[0 .. n), all between lo and hi; kept_lock is held. */
static void
forget_numbers(wc_model *list, const int *fds, size_t n, int lo, int hi)
{
	for (wc_model *o = list; o != NULL; o = o->kept_next)
		for (uint64_t j = 0; j < o->header.file_count; j++) {
			int fd = kept_number(o->file_fds[j]);

			if (fd < lo || fd > hi)
				continue;
			for (size_t i = 0; i < n; i++)
				if (fds[i] == fd) {
					o->file_fds[j] = -1;
					break;
				}
		}
}

void
model_keep_fds(wc_model *m, int *fds)
{
	size_t n = (size_t)m->header.file_count;
	int lo = INT_MAX, hi = -1;

	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0) {
			lo = fds[i] < lo ? fds[i] : lo;
			hi = fds[i] > hi ? fds[i] : hi;
		}
	pthread_once(&kept_atfork_once, kept_atfork);
	pthread_mutex_lock(&kept_lock);
	forget_numbers(kept_models, fds, n, lo, hi);
	forget_numbers(kept_released, fds, n, lo, hi);
	m->file_fds = fds;
	m->kept_next = kept_models;
	kept_models = m;
	pthread_mutex_unlock(&kept_lock);
}

/*
 * Forgets (sets to -1) each kept descriptor that is no longer the file the
 * model got: one the process closed without asking the model (closefrom(),
 * close_range() in a daemonizing child) whose number was given to another
 * file since (fstat names another device or inode), or that is closed
 * (EBADF). Closing those would close someone else's descriptor (review
 * rev172 F4); a number another model got since is forgotten already
 * (model_keep_fds). A descriptor whose fstat fails otherwise (ESTALE, EIO:
 * a file another host replaced on NFS or FUSE) is still the model's open
 * file and is closed (review rev174 F4: it leaked). A model without
 * identities closes what it holds, as before. For kept descriptor i (one
 * marked to be closed too); called with kept_lock held.
 */
static void
forget_foreign_fd(wc_model *m, uint64_t i)
{
	struct stat st;
	int fd = kept_number(m->file_fds[i]);

	if (m->file_ids == NULL || fd < 0)
		return;
	if (fstat(fd, &st) == -1 ? errno == EBADF :
		(uint64_t)st.st_dev != m->file_ids[i].dev ||
		(uint64_t)st.st_ino != m->file_ids[i].ino)
		m->file_fds[i] = -1;
}

/*
 * Closes m's kept descriptors first .. first + n that are still its own
 * (forget_foreign_fd), or, while a receive is in flight, marks them to be
 * closed when the last one ends; returns how many are marked. kept_lock
 * is held.
 */
static size_t
close_kept(wc_model *m, uint64_t first, uint64_t n)
{
	size_t marked = 0;

	for (uint64_t i = first; i < first + n; i++) {
		forget_foreign_fd(m, i);
		m->file_fds[i] = kept_number(m->file_fds[i]);
		if (kept_receiving > 0 && m->file_fds[i] >= 0) {
			m->file_fds[i] = kept_pending(m->file_fds[i]);
			marked++;
		}
	}
	if (marked > 0)
		kept_marked = 1;
	else
		model_close_fds(&m->file_fds[first], (size_t)n);
	return marked;
}

/* Closes the descriptors marked to be closed (close_kept) and frees the
 * models released meanwhile; no receive is in flight, kept_lock is held. */
static void
close_marked(void)
{
	if (!kept_marked)
		return;
	kept_marked = 0;
	for (wc_model *m = kept_models; m != NULL; m = m->kept_next)
		for (uint64_t i = 0; i < m->header.file_count; i++)
			if (m->file_fds[i] <= -2)
				close_kept(m, i, 1);
	for (wc_model *m = kept_released, *next; m != NULL; m = next) {
		next = m->kept_next;
		close_kept(m, 0, m->header.file_count);
		free(m->file_fds);
		free(m->file_ids);
		free(m);
	}
	kept_released = NULL;
}

void
model_receive_begin(void)
{
	pthread_once(&kept_atfork_once, kept_atfork);
	pthread_mutex_lock(&kept_lock);
	kept_receiving++;
	pthread_mutex_unlock(&kept_lock);
}

void
model_receive_end(void)
{
	pthread_mutex_lock(&kept_lock);
	if (kept_receiving > 0 && --kept_receiving == 0)
		close_marked();
	pthread_mutex_unlock(&kept_lock);
}

/* Takes m off the list of models that keep descriptors and closes those
 * it still owns; returns 1 when some wait for the receives in flight, m
 * then on kept_released (close_marked() frees it). */
static int
model_drop_fds(wc_model *m)
{
	int waits = 0;

	pthread_mutex_lock(&kept_lock);
	for (wc_model **p = &kept_models; *p != NULL; p = &(*p)->kept_next)
		if (*p == m) {
			*p = m->kept_next;
			break;
		}
	if (kept_receiving == 0)
		close_marked(); /* a child's, after fork() in a receive */
	if (close_kept(m, 0, m->header.file_count) > 0) {
		m->kept_next = kept_released;
		kept_released = m;
		waits = 1;
	}
	pthread_mutex_unlock(&kept_lock);
	return waits;
}

void
model_free(wc_model *m)
{
	if (m == NULL)
		return;
	unmap_all(m);
	if (m->index_owner == MODEL_INDEX_OWNED)
		free((void *)m->index);
	free(m->maps);
	free(m->name);
	m->index = NULL;
	m->maps = NULL;
	m->name = NULL;
	if (m->file_fds != NULL && model_drop_fds(m))
		return; /* the rest waits for the receives in flight */
	free(m->file_fds);
	free(m->file_ids);
	free(m);
}

/* Makes a model over an opened source's index and mappings, taking
 * neither (the caller gives them or keeps them); owner is what the model
 * will do with the index. */
static int
model_over_source(const char *what, const struct model_source *s,
	enum model_index_owner owner, wc_model **out)
{
	struct model_map *maps;
	int r;

	if ((maps = calloc(s->nfiles ? s->nfiles : 1, sizeof(*maps))) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", what);
	for (size_t i = 0; i < s->nfiles; i++) {
		maps[i].base = s->files[i].base;
		maps[i].size = s->files[i].size;
	}
	if ((r = model_new(what, s->index, s->index_len, owner, maps, s->nfiles, out)) < 0)
		free(maps);
	return r;
}

/* Makes the model of an opened source: it takes the source's index and
 * mappings and closes the rest of the source, descriptors included (a
 * worker does not need them once mapped), whether or not it succeeds. */
static int
model_of_source(const char *what, struct model_source *s, wc_model **out)
{
	int r;

	if ((r = model_over_source(what, s, MODEL_INDEX_OWNED, out)) < 0) {
		source_close(s);
		return r;
	}
	for (size_t i = 0; i < s->nfiles; i++)
		s->files[i].base = NULL;
	s->index = NULL;
	source_close(s);
	return 0;
}

/* A view's release: the mappings and the index are the source's. */
static void
view_release(wc_model *m, void *ctx)
{
	(void)ctx;
	for (uint64_t i = 0; i < m->header.file_count; i++)
		m->maps[i].base = NULL;
	model_free(m);
}

int
model_view_source(const char *what, const struct model_source *s, wc_model **out)
{
	int r;

	if ((r = model_over_source(what, s, MODEL_INDEX_BORROWED, out)) < 0)
		return r;
	(*out)->release = view_release;
	return 0;
}

int
wc_open_file(const char *path, wc_model **out)
{
	struct model_source s;
	int r;

	if (path == NULL || out == NULL)
		return error_set(-EINVAL, "wc_open_file: no path");
	if ((r = source_open(path, &s)) < 0)
		return r;
	return model_of_source(path, &s, out);
}

int
wc_open_fd(int fd, const char *label, wc_model **out)
{
	struct model_source s;
	int r;

	if (fd < 0 || label == NULL || out == NULL)
		return error_set(-EINVAL, "wc_open_fd: no descriptor or no label");
	if ((r = source_open_fd(fd, label, &s)) < 0)
		return r;
	s.files[0].fd = -1; /* the caller's, before and after */
	return model_of_source(label, &s, out);
}

/* An attached model's release is its hook's (attach.c: unmap, then tell the
 * daemon); a model from wc_open_file() has none and is only freed. */
void
wc_release(wc_model *m)
{
	if (m == NULL)
		return;
	if (m->release != NULL)
		m->release(m, m->release_ctx);
	else
		model_free(m);
}

size_t
wc_model_count(const wc_model *m)
{
	return m == NULL ? 0 : (size_t)m->header.tensor_count;
}

/* Turns an index tensor into a wc_tensor, checking it lies in its file. */
static int
make_tensor(const wc_model *m, const struct index_tensor *t, wc_tensor *out)
{
	const struct model_map *f = &m->maps[t->file];
	static const uint8_t empty[1];

	if (t->offset > f->size || t->nbytes > f->size - t->offset)
		return error_set(-EBADMSG, "%s: tensor \"%s\" lies outside its file", m->name,
			t->name);
	out->name = t->name;
	out->dtype = t->type->name;
	out->ndim = t->ndim;
	out->shape = t->shape;
	out->data = f->base != NULL ? f->base + t->offset : empty;
	out->nbytes = t->nbytes;
	return 0;
}

int
wc_model_tensor(const wc_model *m, size_t i, wc_tensor *out)
{
	struct index_tensor t;
	int r;

	if (m == NULL || out == NULL)
		return error_set(-EINVAL, "wc_model_tensor: no model");
	if (i >= m->header.tensor_count)
		return error_set(-ERANGE, "%s: tensor %zu of %llu", m->name, i,
			(unsigned long long)m->header.tensor_count);
	if ((r = index_tensor_at(m->index, &m->header, i, &t)) < 0) {
		error_prefix(m->name);
		return r;
	}
	return make_tensor(m, &t, out);
}

int
wc_model_tensors(const wc_model *m, size_t first, wc_tensor *out, size_t n)
{
	struct index_tensor t;
	size_t k;
	int r;

	if (m == NULL || (out == NULL && n > 0))
		return error_set(-EINVAL, "wc_model_tensors: no model or no array");
	if (first >= m->header.tensor_count)
		return 0;
	k = (size_t)(m->header.tensor_count - first);
	if (k > n)
		k = n;
	if (k > INT_MAX)
		k = INT_MAX;
	for (size_t i = 0; i < k; i++) {
		if ((r = index_tensor_at(m->index, &m->header, first + i, &t)) < 0) {
			error_prefix(m->name);
			return r;
		}
		if ((r = make_tensor(m, &t, &out[i])) < 0)
			return r;
	}
	return (int)k;
}

int
wc_model_find(const wc_model *m, const char *name, wc_tensor *out)
{
	struct index_tensor t;
	int r;

	if (m == NULL || name == NULL || out == NULL)
		return error_set(-EINVAL, "wc_model_find: no model or name");
	if ((r = index_find(m->index, &m->header, name, &t)) < 0) {
		error_prefix(m->name);
		return r;
	}
	return make_tensor(m, &t, out);
}

const char *
wc_model_metadata(const wc_model *m, const char *key)
{
	const char *value;

	if (m == NULL || key == NULL || index_meta_find(m->index, &m->header, key, &value) < 0)
		return NULL;
	return value;
}

int
wc_model_metadata_at(const wc_model *m, size_t i, const char **key, const char **value)
{
	const char *k, *v;
	int r;

	if (m == NULL)
		return error_set(-EINVAL, "wc_model_metadata_at: no model");
	if ((r = index_meta_at(m->index, &m->header, i, &k, &v)) < 0)
		return r == -ERANGE ? error_set(r, "%s: metadata entry %zu of %llu", m->name, i,
			(unsigned long long)m->header.meta_count) : r;
	if (key != NULL)
		*key = k;
	if (value != NULL)
		*value = v;
	return 0;
}

int
wc_model_stale(const wc_model *m)
{
	if (m == NULL || m->status_word == NULL)
		return 0;
	return __atomic_load_n(m->status_word, __ATOMIC_ACQUIRE) != m->generation;
}

uint64_t
wc_model_generation(const wc_model *m)
{
	return m == NULL ? 0 : m->generation;
}

/* 0 when m is a model and file one of its file numbers; else -EINVAL with
 * no_model, or -ERANGE naming the file and the count (wc_model_fd,
 * wc_model_close_fd and wc_model_file_identity). */
static int
check_file(const wc_model *m, size_t file, const char *no_model)
{
	if (m == NULL)
		return error_set(-EINVAL, "%s", no_model);
	if (file >= m->header.file_count)
		return error_set(-ERANGE, "%s: file %zu of %llu", m->name, file,
			(unsigned long long)m->header.file_count);
	return 0;
}

/* The descriptors are the model's own (model.h, file_fds): lent, never
 * given; a model that is neither a derived artifact nor from
 * wc_attach_fds() keeps none, so an ordinary model costs no descriptor
 * while it is mapped. */
int
wc_model_fd(const wc_model *m, size_t file)
{
	int fd = -1, r;

	if ((r = check_file(m, file, "wc_model_fd: no model")) < 0)
		return r;
	if (m->file_fds != NULL) {
		pthread_mutex_lock(&kept_lock);
		fd = m->file_fds[file];
		pthread_mutex_unlock(&kept_lock);
	}
	if (fd < 0)
		return error_set(-ENOENT, "%s: file %zu: no descriptor kept (only a derived "
			"artifact's and wc_attach_fds()'s are; open the file by its path)", m->name,
			file);
	return fd;
}

/* A descriptor is the model's until it closes it (model.h, file_fds):
 * closing one here is the model's own close, which wc_release() then
 * skips; one that is no longer its file is forgotten, not closed, as
 * wc_release() does (forget_foreign_fd). */
int
wc_model_close_fd(wc_model *m, size_t file)
{
	int r;

	if ((r = check_file(m, file, "wc_model_close_fd: no model")) < 0)
		return r;
	if (m->file_fds != NULL) {
		pthread_mutex_lock(&kept_lock);
		close_kept(m, file, 1);
		pthread_mutex_unlock(&kept_lock);
	}
	return 0;
}

int
wc_model_file_identity(const wc_model *m, size_t file, wc_file_identity *out)
{
	int r;

	if (out == NULL)
		return error_set(-EINVAL, "wc_model_file_identity: no identity");
	if ((r = check_file(m, file, "wc_model_file_identity: no model")) < 0)
		return r;
	if (m->file_ids == NULL)
		return error_set(-ENOENT, "%s: file %zu: no identity (only a model made of "
			"wcached's descriptors has one; fstat the file)", m->name, file);
	*out = m->file_ids[file];
	return 0;
}

size_t
wc_model_file_count(const wc_model *m)
{
	return m == NULL ? 0 : (size_t)m->header.file_count;
}

/* index_file_at() checks that the name is a NUL-terminated string inside
 * the index (an attached model's index is wcached's sealed memfd, a
 * compiled one this process's): a damaged record reads as NULL. */
const char *
wc_model_file_name(const wc_model *m, size_t file)
{
	const char *name;
	uint64_t size;

	if (m == NULL || file >= m->header.file_count ||
		index_file_at(m->index, &m->header, file, &name, &size) < 0)
		return NULL;
	return name;
}

int
wc_model_cow(wc_model *m)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

	if (m == NULL)
		return error_set(-EINVAL, "wc_model_cow: no model");
	for (uint64_t i = 0; i < m->header.file_count; i++) {
		const struct model_map *f = &m->maps[i];
		size_t len;

		if (f->base == NULL)
			continue;
		len = (size_t)((f->size + page - 1) & ~(uint64_t)(page - 1));
		if (mprotect((void *)f->base, len, PROT_READ | PROT_WRITE) == -1) {
			int e = errno;

			if (e == EACCES)
				return error_set(-ENOTSUP, "%s: model files are mapped shared and "
					"cannot be made copy-on-write", m->name);
			return error_set(-e, "%s: file %llu: mprotect: %s", m->name,
				(unsigned long long)i, strerror(e));
		}
	}
	return 0;
}
