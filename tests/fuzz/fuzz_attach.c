/*
 * fuzz_attach.c: the client's handling of the daemon's reply to ATTACH
 * (client/attach_reply.c): the ATTACH_OK message, the index memfd, the
 * model files and the status page, all hostile. Each input becomes real
 * descriptors (memfds, sealed or not, and read-only reopens of them), so
 * the checks run against the kernel as in a worker. The reply must end in
 * an error or a model whose every tensor lies inside its mapping; every
 * descriptor is closed either way (the process holds as many after the
 * input as before, counted in /proc/self/fd; -rss_limit_mb catches leaked
 * mappings).
 *
 * An input is one reply, or two split at the first SEPARATOR, made through
 * one attach_cache as a client makes every attach after its first: the
 * second can pass the first one's index memfd again, which use_index()
 * takes from the cache by inode and size without the seal check, and
 * gets the cached status page with its own slot (use_status()). Inputs
 * without the separator (the corpus before it) are one reply, as before.
 *
 * One reply's layout (little-endian):
 *   u8  mode     bit 0: the message is raw bytes (else ATTACH_OK is built
 *                from the payload below with a good header); bit 1: fix
 *                index_size and file_count to what is sent; bit 2: send a
 *                status page; bit 3: seal the index; bit 4: pass file 0
 *                writable; bit 5: the index descriptor is a pipe; bit 6:
 *                the reply answers DERIVE (attach_reply_grant: an artifact's
 *                ATTACH_OK, or BUILD); bit 7: built as BUILD (48 bytes:
 *                the ATTACH_OK payload and a token), answering DERIVE
 *   u8  nfiles   model files sent (mod 4)
 *   u16 n, then n bytes: the index
 *   raw: u16 n, then n bytes: the message; else 40 (BUILD: 48) bytes: the
 *        payload
 *   nfiles x u16: each file's size
 *   the rest: the status page's bytes
 *
 * After SEPARATOR: u8 again, then the second reply in the same layout.
 *   again bits 0-1: the second's index descriptor: 0 a memfd of its own
 *                index bytes; 1 the first's index descriptor again (a dup:
 *                the same open file, as wcached passes one memfd to every
 *                attach of a generation); 2 a read-only reopen of it (the
 *                same inode, another open file); 3 a new memfd of the
 *                first's index bytes (another inode), sealed as the
 *                second's mode says. With 1 to 3, bit 1 of the second's
 *                mode fixes index_size to the first's index length.
 *   bit 2: the second's status page descriptor is the first's again (its
 *          own when the first sent none)
 *   bit 3: the first model is released before the second reply (else
 *          both are held, as a worker holds them)
 *   bit 4: the cached index is dropped before the second reply, as
 *          wc_client_dispatch() does on CHANGED
 *
 * Checked beyond that: a second reply given the cached index's inode and
 * size that succeeds uses the cached mapping, one given another inode maps
 * its own (which becomes the cached one), and a model of the second reply
 * with a status page uses the page the client already maps.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/memfds.h"
#include "lib/attach_reply.h"
#include "lib/wcache.h"
#include "proto/wire.h"
#include "fuzz_check.h"
#include "fuzz_fds.h"
#include "fuzz_input.h"

#define MODE_RAW 1u
#define MODE_FIX 2u
#define MODE_STATUS 4u
#define MODE_SEAL 8u
#define MODE_WRITABLE 16u
#define MODE_PIPE 32u
#define MODE_DERIVE 64u
#define MODE_BUILD 128u

#define SEPARATOR "#second#"
#define SEPARATOR_LEN (sizeof(SEPARATOR) - 1)

#define AGAIN_INDEX 3u         /* the second's index descriptor: one of the below */
#define AGAIN_INDEX_OWN 0u
#define AGAIN_INDEX_DUP 1u
#define AGAIN_INDEX_REOPEN 2u
#define AGAIN_INDEX_COPY 3u
#define AGAIN_STATUS 4u
#define AGAIN_RELEASE 8u
#define AGAIN_STALE 16u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the first reply leaves for the second: its index descriptor and
 * status page descriptor (duplicates, -1 when it had none) and its index
 * bytes. */
struct first_reply {
	int index_fd;
	int status_fd;
	const uint8_t *index;
	size_t index_len;
};

/* A memfd holding bytes (or size zero bytes when bytes is NULL), sealed
 * with seals. */
static int
memfd_with(const char *name, const uint8_t *bytes, size_t size, unsigned seals)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)size) != 0 ||
		(bytes != NULL && size > 0 && pwrite(fd, bytes, size, 0) != (ssize_t)size) ||
		(seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A read-only reopen of fd (as wcached passes model files); closes fd. */
static int
read_only(int fd)
{
	char path[64];
	int ro;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	close(fd);
	return ro;
}

/* A read-only reopen of the first reply's index descriptor, which it keeps:
 * non-blocking, so that a pipe without a writer opens at once. */
static int
reopen_index(int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
}

/* A duplicate of fd, or -1 for none. */
static int
dup_of(int fd)
{
	return fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

/* Uses every tensor of an accepted model as a worker would. */
static void
use_model(wc_model *m)
{
	size_t n = wc_model_count(m);
	volatile uint8_t sink = 0;
	wc_tensor t, u;

	for (size_t i = 0; i < n && i < 4096; i++) {
		if (wc_model_tensor(m, i, &t) != 0)
			continue;
		if (t.nbytes > 0)
			sink ^= ((const uint8_t *)t.data)[0] ^
				((const uint8_t *)t.data)[t.nbytes - 1];
		(void)wc_model_find(m, t.name, &u);
	}
	(void)wc_model_stale(m);
	(void)sink;
}

/*
 * Makes one reply of data (the layout above) and hands it to attach_reply()
 * or attach_reply_grant() with cache. For the second reply, first and again
 * say which of the first's descriptors it passes again; for the first,
 * keep (when not NULL) gets duplicates of its index and status page
 * descriptors and its index bytes. Returns 0 with *out the model, or -1.
 */
static int
one_reply(const uint8_t *data, size_t size, const struct first_reply *first, unsigned again,
	struct attach_cache *cache, struct first_reply *keep, struct attach_model *out)
{
	const uint8_t *p = data, *mode_b, *nf_b, *len_b, *index, *payload;
	size_t left = size, msg_len, index_len, nfds = 0, sent_index_len;
	uint8_t msg[WIRE_MAX_MESSAGE];
	int fds[8];
	unsigned mode, nfiles, source = first != NULL ? again & AGAIN_INDEX : AGAIN_INDEX_OWN;
	struct attach_grant grant;
	int unusable;

	if ((mode_b = take(&p, &left, 1)) == NULL || (nf_b = take(&p, &left, 1)) == NULL ||
		(len_b = take(&p, &left, 2)) == NULL ||
		(index = take(&p, &left, index_len = le16(len_b))) == NULL)
		return -1;
	mode = *mode_b;
	nfiles = *nf_b % 4;
	/* The index the reply passes: its own, or the first's. */
	sent_index_len = source == AGAIN_INDEX_OWN ? index_len : first->index_len;
	if (mode & MODE_RAW) {
		if ((len_b = take(&p, &left, 2)) == NULL ||
			(payload = take(&p, &left,
				msg_len = le16(len_b) % (WIRE_MAX_MESSAGE + 1))) == NULL)
			return -1;
		memcpy(msg, payload, msg_len);
	} else {
		static const uint8_t head[16] = { 0x57, 0x43, 0x50, 0x31, 1, 0, 129, 0, 40, 0, 0,
			0, 1, 0, 0, 0 };
		size_t plen = (mode & MODE_BUILD) ? 48 : 40;

		if ((payload = take(&p, &left, plen)) == NULL)
			return -1;
		memcpy(msg, head, 16);
		if (mode & MODE_BUILD) {
			msg[6] = WIRE_BUILD;
			msg[8] = 48;
		}
		memcpy(msg + 16, payload, plen);
		if (mode & MODE_FIX) {
			for (int i = 0; i < 8; i++)
				msg[16 + 16 + i] = (uint8_t)((uint64_t)sent_index_len >> (8 * i));
			for (int i = 0; i < 4; i++)
				msg[16 + 24 + i] = (uint8_t)(nfiles >> (8 * i));
			msg[16 + 28] = (mode & MODE_STATUS) ? 1 : 0;
			msg[16 + 29] = msg[16 + 30] = msg[16 + 31] = 0;
		}
		msg_len = 16 + plen;
	}

	/* The descriptors, in ATTACH_OK's order. */
	if (mode & MODE_PIPE) {
		int pipe_fds[2];

		if (pipe2(pipe_fds, O_CLOEXEC) != 0)
			return -1;
		close(pipe_fds[1]);
		fds[nfds++] = pipe_fds[0];
	} else if (source == AGAIN_INDEX_DUP) {
		fds[nfds++] = dup_of(first->index_fd);
	} else if (source == AGAIN_INDEX_REOPEN) {
		fds[nfds++] = reopen_index(first->index_fd);
	} else {
		fds[nfds++] = memfd_with("fuzz-index",
			source == AGAIN_INDEX_COPY ? first->index : index, sent_index_len,
			(mode & MODE_SEAL) ? INDEX_SEALS : 0);
	}
	for (unsigned i = 0; i < nfiles; i++) {
		const uint8_t *sz = take(&p, &left, 2);
		int fd = memfd_with("fuzz-file", NULL, sz != NULL ? le16(sz) : 0, 0);

		fds[nfds++] = (i == 0 && (mode & MODE_WRITABLE)) ? fd : read_only(fd);
	}
	if (mode & MODE_STATUS)
		fds[nfds++] = (first != NULL && (again & AGAIN_STATUS) && first->status_fd >= 0) ?
			dup_of(first->status_fd) :
			read_only(memfd_with("fuzz-status", p, left, STATUS_PAGE_CLIENT_SEALS));
	for (size_t i = 0; i < nfds; i++)
		if (fds[i] < 0) {
			for (size_t j = 0; j < nfds; j++)
				if (fds[j] >= 0)
					close(fds[j]);
			return -1;
		}
	if (keep != NULL) {
		keep->index_fd = dup_of(fds[0]);
		keep->status_fd = (mode & MODE_STATUS) ? dup_of(fds[nfds - 1]) : -1;
		keep->index = index;
		keep->index_len = index_len;
		CHECK(keep->index_fd >= 0 && (keep->status_fd >= 0 || !(mode & MODE_STATUS)));
	}

	if ((mode & (MODE_DERIVE | MODE_BUILD)) ?
		attach_reply_grant(ATTACH_REQUEST_DERIVE, "fuzz", "key-v1", "the fuzzer", msg,
			msg_len, fds, nfds, cache, &unusable, out, &grant) >= 0 :
		attach_reply("fuzz", "the fuzzer", msg, msg_len, fds, nfds, cache, &unusable,
			out) == 0) {
		use_model(out->model);
		return 0;
	}
	return -1;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *sep = memmem(data, size, SEPARATOR, SEPARATOR_LEN);
	size_t first_len = sep != NULL ? (size_t)(sep - data) : size;
	struct attach_cache cache = { NULL, NULL };
	struct attach_model a1 = { .model = NULL }, a2 = { .model = NULL };
	struct first_reply first = { -1, -1, NULL, 0 };
	const struct attach_index *cached_index;
	const struct attach_status *cached_status;
	int before = count_fds(NULL);
	unsigned again, source;

	if (one_reply(data, first_len, NULL, 0, &cache, sep != NULL ? &first : NULL, &a1) == 0)
		/* A good reply's index is the one the client keeps. */
		CHECK(cache.index == a1.index);
	if (sep != NULL && size - first_len > SEPARATOR_LEN && first.index_fd >= 0) {
		again = sep[SEPARATOR_LEN];
		source = again & AGAIN_INDEX;
		if (again & AGAIN_RELEASE)
			attach_model_free(&a1);
		if (again & AGAIN_STALE) {
			attach_index_unref(cache.index);
			cache.index = NULL;
		}
		cached_index = cache.index;
		cached_status = cache.status;
		if (one_reply(sep + SEPARATOR_LEN + 1, size - first_len - SEPARATOR_LEN - 1, &first,
			    again, &cache, NULL, &a2) == 0) {
			/* The first's inode again: the cached mapping, checked
			 * and sealed when the first was attached (use_index());
			 * another inode: a mapping of its own, kept from now on. */
			if (cached_index != NULL &&
				(source == AGAIN_INDEX_DUP || source == AGAIN_INDEX_REOPEN))
				CHECK(a2.index == cached_index);
			else
				CHECK(a2.index != cached_index && cache.index == a2.index);
			/* One status page per client, whatever each reply passes. */
			if (cached_status != NULL)
				CHECK(a2.status == NULL || a2.status == cached_status);
			if (a1.model != NULL)
				use_model(a1.model);
		}
	}
	attach_model_free(&a1);
	attach_model_free(&a2);
	attach_cache_clear(&cache);
	if (first.index_fd >= 0)
		close(first.index_fd);
	if (first.status_fd >= 0)
		close(first.status_fd);
	CHECK(count_fds(NULL) == before);
	return 0;
}
