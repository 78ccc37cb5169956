/*
 * fuzz_attach.c: the client's handling of the daemon's reply to ATTACH
 * (client/attach_reply.c): the ATTACH_OK message, the index memfd, the
 * model files and the status page, all hostile. Each input becomes real
 * descriptors (memfds, sealed or not, and read-only reopens of them), so
 * the checks run against the kernel as in a worker. The reply must end in
 * an error or a model whose every tensor lies inside its mapping; every
 * descriptor is closed either way (the fuzzer's own fd count would grow
 * otherwise, and -rss_limit_mb catches leaked mappings).
 *
 * Input layout (little-endian):
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

#define MODE_RAW 1u
#define MODE_FIX 2u
#define MODE_STATUS 4u
#define MODE_SEAL 8u
#define MODE_WRITABLE 16u
#define MODE_PIPE 32u
#define MODE_DERIVE 64u
#define MODE_BUILD 128u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads n bytes at *p, or fails when fewer are left. */
static const uint8_t *
take(const uint8_t **p, size_t *left, size_t n)
{
	const uint8_t *at = *p;

	if (*left < n)
		return NULL;
	*p += n;
	*left -= n;
	return at;
}

static unsigned
le16(const uint8_t *p)
{
	return (unsigned)p[0] | (unsigned)p[1] << 8;
}

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

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *mode_b, *nf_b, *len_b, *index, *payload;
	size_t left = size, msg_len, index_len, nfds = 0;
	uint8_t msg[WIRE_MAX_MESSAGE];
	int fds[8];
	unsigned mode, nfiles;
	struct attach_cache cache = { NULL, NULL };
	struct attach_model am = { NULL, 0, NULL, NULL };
	struct attach_grant grant;
	int unusable;

	if ((mode_b = take(&p, &left, 1)) == NULL || (nf_b = take(&p, &left, 1)) == NULL ||
		(len_b = take(&p, &left, 2)) == NULL ||
		(index = take(&p, &left, index_len = le16(len_b))) == NULL)
		return 0;
	mode = *mode_b;
	nfiles = *nf_b % 4;
	if (mode & MODE_RAW) {
		if ((len_b = take(&p, &left, 2)) == NULL ||
			(payload = take(&p, &left,
				msg_len = le16(len_b) % (WIRE_MAX_MESSAGE + 1))) == NULL)
			return 0;
		memcpy(msg, payload, msg_len);
	} else {
		static const uint8_t head[16] = { 0x57, 0x43, 0x50, 0x31, 1, 0, 129, 0, 40, 0, 0,
			0, 1, 0, 0, 0 };
		size_t plen = (mode & MODE_BUILD) ? 48 : 40;

		if ((payload = take(&p, &left, plen)) == NULL)
			return 0;
		memcpy(msg, head, 16);
		if (mode & MODE_BUILD) {
			msg[6] = WIRE_BUILD;
			msg[8] = 48;
		}
		memcpy(msg + 16, payload, plen);
		if (mode & MODE_FIX) {
			for (int i = 0; i < 8; i++)
				msg[16 + 16 + i] = (uint8_t)((uint64_t)index_len >> (8 * i));
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
			return 0;
		close(pipe_fds[1]);
		fds[nfds++] = pipe_fds[0];
	} else {
		fds[nfds++] = memfd_with("fuzz-index", index, index_len,
			(mode & MODE_SEAL) ? INDEX_SEALS : 0);
	}
	for (unsigned i = 0; i < nfiles; i++) {
		const uint8_t *sz = take(&p, &left, 2);
		int fd = memfd_with("fuzz-file", NULL, sz != NULL ? le16(sz) : 0, 0);

		fds[nfds++] = (i == 0 && (mode & MODE_WRITABLE)) ? fd : read_only(fd);
	}
	if (mode & MODE_STATUS)
		fds[nfds++] = read_only(memfd_with("fuzz-status", p, left,
			STATUS_PAGE_CLIENT_SEALS));
	for (size_t i = 0; i < nfds; i++)
		if (fds[i] < 0) {
			for (size_t j = 0; j < nfds; j++)
				if (fds[j] >= 0)
					close(fds[j]);
			return 0;
		}

	if ((mode & (MODE_DERIVE | MODE_BUILD)) ?
		attach_reply_grant(ATTACH_REQUEST_DERIVE, "fuzz", "key-v1", "the fuzzer", msg,
			msg_len, fds, nfds, &cache, &unusable, &am, &grant) >= 0 :
		attach_reply("fuzz", "the fuzzer", msg, msg_len, fds, nfds, &cache, &unusable,
			&am) == 0) {
		use_model(am.model);
		attach_model_free(&am);
	}
	attach_cache_clear(&cache);
	return 0;
}
