/*
 * fuzz_wire.c: libFuzzer harness for proto/wire.c, the decoder every byte a
 * peer sends goes through.
 *
 * Properties checked, beyond "no crash, no out-of-bounds read":
 *   - wire_decode() either accepts or returns one of the three documented
 *     codes, and sizes outside [16, WIRE_MAX_MESSAGE] are always -EMSGSIZE;
 *   - on an accepted message exactly one payload getter (the one for its
 *     type, CHANGED, HOLD, HOLD_OK, ORIGINS and ORIGINS_OK included) succeeds and the
 *     others return -EBADMSG;
 *   - what a getter returns is within the protocol's bounds (ATTACH_OK:
 *     flags 0 or WIRE_ATTACH_STATUS, file_count <= WIRE_MAX_FILES; CHANGED:
 *     a name of 1..WIRE_MAX_NAME bytes without NUL; ORIGINS_OK: as many origins
 *     as its file_count leaves from its first, at most WIRE_ORIGINS_PER_REPLY);
 *   - re-encoding what was decoded gives back the input byte for byte (so
 *     the decoder and the encoders agree on every field and the decoder
 *     accepts nothing an encoder could not have produced);
 *   - the input used as an ATTACH name, a CHANGED name or an ERROR text
 *     encodes to a message the decoder accepts and that carries that name or
 *     (a prefix of) text, and the input read as an ATTACH_OK payload encodes
 *     exactly when its flags and file_count are valid.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts, so libFuzzer reports the input, when a property does not hold
 * (unlike assert(), it stays in NDEBUG builds). */
#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			abort();                                                                   \
	} while (0)

static uint8_t out[WIRE_MAX_MESSAGE];

/* Little-endian u32 and u64 at p, independent of the encoder under test. */
static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* Re-encodes an accepted message and compares it with the input. */
static void
check_roundtrip(const uint8_t *data, size_t size, const struct wire_message *m)
{
	const char *name, *text;
	size_t len;
	uint64_t handle, generation;
	struct wire_attach_ok ok;
	struct wire_derive d;
	struct wire_origins_ok origins;
	uint32_t first;
	int32_t code;
	char *copy;
	ssize_t n = -1;
	int hits = 0;

	if (wire_get_attach(m, &name, &len) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_ATTACH);
		n = wire_put_attach(out, sizeof(out), m->h.seq, name, len);
	}
	if (wire_get_release(m, &handle) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_RELEASE);
		n = wire_put_release(out, sizeof(out), m->h.seq, handle);
	}
	if (wire_get_attach_ok(m, &ok) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_ATTACH_OK);
		CHECK(ok.flags == 0 || ok.flags == WIRE_ATTACH_STATUS);
		CHECK(ok.file_count <= WIRE_MAX_FILES);
		n = wire_put_attach_ok(out, sizeof(out), m->h.seq, &ok);
	}
	if (wire_get_changed(m, &generation, &name, &len) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_CHANGED);
		CHECK(len >= 1 && len <= WIRE_MAX_NAME && memchr(name, 0, len) == NULL);
		CHECK(name == (const char *)data + WIRE_HEADER_SIZE + 8);
		CHECK(generation == le64(data + WIRE_HEADER_SIZE));
		/* CHANGED answers no request: the decoder accepts seq 0 only. */
		CHECK(m->h.seq == 0);
		n = wire_put_changed(out, sizeof(out), generation, name, len);
	}
	if (wire_get_hold(m, &generation, &name, &len) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_HOLD);
		CHECK(len >= 1 && len <= WIRE_MAX_NAME && memchr(name, 0, len) == NULL);
		CHECK(generation == le64(data + WIRE_HEADER_SIZE));
		n = wire_put_hold(out, sizeof(out), m->h.seq, generation, name, len);
	}
	if (wire_get_origins(m, &first, &name, &len) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_ORIGINS);
		CHECK(first < WIRE_MAX_FILES && first == le64(data + WIRE_HEADER_SIZE));
		CHECK(len >= 1 && len <= WIRE_MAX_NAME && memchr(name, 0, len) == NULL);
		n = wire_put_origins(out, sizeof(out), m->h.seq, first, name, len);
	}
	if (wire_get_origins_ok(m, &origins) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_ORIGINS_OK);
		CHECK(origins.file_count <= WIRE_MAX_FILES);
		CHECK(origins.file_count == 0 ? origins.first == 0 && origins.n == 0 :
			origins.first < origins.file_count && origins.n >= 1 &&
			origins.n <= WIRE_ORIGINS_PER_REPLY &&
			origins.first + origins.n <= origins.file_count);
		CHECK(m->h.length == WIRE_ORIGINS_FIXED + origins.n * WIRE_ORIGIN_SIZE);
		n = wire_put_origins_ok(out, sizeof(out), m->h.seq, &origins);
	}
	if (wire_get_hold_ok(m, &handle) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_HOLD_OK);
		n = wire_put_hold_ok(out, sizeof(out), m->h.seq, handle);
	}
	if (wire_get_error(m, &code, &text, &len) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_ERROR);
		/* The encoder takes a C string; the decoder guarantees no NUL. */
		copy = malloc(len + 1);
		CHECK(copy != NULL);
		memcpy(copy, text, len);
		copy[len] = '\0';
		n = wire_put_error(out, sizeof(out), m->h.seq, code, copy);
		free(copy);
	}
	if (wire_get_derive(m, &d) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_DERIVE);
		CHECK(wire_key_valid(d.key, d.key_len));
		CHECK(d.name_len >= 1 && d.name_len <= WIRE_MAX_NAME &&
			memchr(d.name, 0, d.name_len) == NULL);
		CHECK(d.name == d.key + d.key_len);
		n = wire_put_derive(out, sizeof(out), m->h.seq, &d);
	}
	if (wire_get_publish(m, &handle) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_PUBLISH);
		n = wire_put_publish(out, sizeof(out), m->h.seq, handle);
	}
	if (wire_get_abandon(m, &handle, &text, &len) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_ABANDON);
		CHECK(len <= WIRE_MAX_REASON && memchr(text, 0, len) == NULL);
		copy = malloc(len + 1);
		CHECK(copy != NULL);
		memcpy(copy, text, len);
		copy[len] = '\0';
		n = wire_put_abandon(out, sizeof(out), m->h.seq, handle, copy);
		free(copy);
	}
	if (wire_get_build(m, &ok, &handle) == 0) {
		hits++;
		CHECK(m->h.type == WIRE_BUILD);
		CHECK(ok.flags == 0 || ok.flags == WIRE_ATTACH_STATUS);
		CHECK(ok.file_count <= WIRE_MAX_FILES);
		n = wire_put_build(out, sizeof(out), m->h.seq, &ok, handle);
	}
	if (m->h.type == WIRE_RELEASE_OK) {
		hits++;
		n = wire_put_release_ok(out, sizeof(out), m->h.seq);
	}
	CHECK(hits == 1);
	CHECK(n >= 0 && (size_t)n == size);
	CHECK(memcmp(out, data, size) == 0);
}

/* Uses the input as a CHANGED name (the same rules as an ATTACH name, after
 * an 8-byte generation, always seq 0). */
static void
check_changed_encoder(const uint8_t *data, size_t size)
{
	struct wire_message m;
	const char *got;
	size_t got_len;
	uint64_t generation = size >= 8 ? le64(data) : (uint64_t)size;
	uint64_t got_generation;
	ssize_t n;

	n = wire_put_changed(out, sizeof(out), generation, (const char *)data, size);
	if (size >= 1 && size <= WIRE_MAX_NAME && memchr(data, 0, size) == NULL) {
		CHECK(n == (ssize_t)(WIRE_HEADER_SIZE + 8 + size));
		CHECK(le32(out + 12) == 0);
		CHECK(wire_decode(out, (size_t)n, &m) == 0);
		CHECK(m.h.type == WIRE_CHANGED && m.h.seq == 0);
		CHECK(wire_get_changed(&m, &got_generation, &got, &got_len) == 0);
		CHECK(got_generation == generation);
		CHECK(got_len == size && memcmp(got, data, size) == 0);
		CHECK(wire_put_changed(out, (size_t)n - 1, generation, (const char *)data, size) ==
		        -EMSGSIZE);
	} else {
		CHECK(n == -EINVAL);
	}
}

/* Reads the first 40 input bytes as an ATTACH_OK payload: the encoder takes
 * it exactly when flags and file_count are valid, and the decoder agrees. */
static void
check_attach_ok_encoder(const uint8_t *data, size_t size)
{
	struct wire_attach_ok ok, got;
	struct wire_message m;
	ssize_t n;

	if (size < 40)
		return;
	ok.generation = le64(data);
	ok.handle = le64(data + 8);
	ok.index_size = le64(data + 16);
	ok.file_count = le32(data + 24);
	ok.flags = le32(data + 28);
	ok.status_slot = le64(data + 32);
	n = wire_put_attach_ok(out, sizeof(out), 4, &ok);
	if ((ok.flags == 0 || ok.flags == WIRE_ATTACH_STATUS) && ok.file_count <= WIRE_MAX_FILES) {
		CHECK(n == (ssize_t)(WIRE_HEADER_SIZE + 40));
		CHECK(memcmp(out + WIRE_HEADER_SIZE, data, 40) == 0);
		CHECK(wire_decode(out, (size_t)n, &m) == 0);
		CHECK(wire_get_attach_ok(&m, &got) == 0);
		CHECK(got.generation == ok.generation && got.handle == ok.handle &&
		        got.index_size == ok.index_size && got.file_count == ok.file_count &&
		        got.flags == ok.flags && got.status_slot == ok.status_slot);
	} else {
		CHECK(n == -EINVAL);
	}
}

/* Uses the input as an ATTACH name and as an ERROR text. */
static void
check_encoders(const uint8_t *data, size_t size)
{
	struct wire_message m;
	const char *got;
	size_t got_len;
	int32_t code;
	char *text;
	ssize_t n;

	n = wire_put_attach(out, sizeof(out), 1, (const char *)data, size);
	if (size >= 1 && size <= WIRE_MAX_NAME && memchr(data, 0, size) == NULL) {
		CHECK(n == (ssize_t)(WIRE_HEADER_SIZE + size));
		CHECK(wire_decode(out, (size_t)n, &m) == 0);
		CHECK(wire_get_attach(&m, &got, &got_len) == 0);
		CHECK(got_len == size && memcmp(got, data, size) == 0);
		/* One byte less room is -EMSGSIZE. */
		CHECK(wire_put_attach(out, (size_t)n - 1, 1, (const char *)data, size) ==
		        -EMSGSIZE);
	} else {
		CHECK(n == -EINVAL);
	}

	text = malloc(size + 1);
	CHECK(text != NULL);
	memcpy(text, data, size);
	text[size] = '\0';
	n = wire_put_error(out, sizeof(out), 2, EIO, text);
	CHECK(n >= (ssize_t)(WIRE_HEADER_SIZE + 4) && (size_t)n <= WIRE_MAX_MESSAGE);
	CHECK(wire_decode(out, (size_t)n, &m) == 0);
	CHECK(wire_get_error(&m, &code, &got, &got_len) == 0);
	CHECK(code == EIO);
	CHECK(memcmp(got, text, got_len) == 0);
	CHECK(wire_put_error(out, (size_t)n - 1, 2, EIO, text) == -EMSGSIZE);
	/* Cut only when it had to be, and by less than one UTF-8 character
	 * (or exactly at the limit, for text that is not UTF-8 there). */
	{
		size_t full = strlen(text);
		size_t room = WIRE_MAX_MESSAGE - WIRE_HEADER_SIZE - 4;

		if (full <= room)
			CHECK(got_len == full);
		else
			CHECK(got_len <= room && got_len + 3 >= room);
	}
	free(text);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wire_message m, m2;
	struct wire_refusal why;
	int rc;

	rc = wire_decode(data, size, &m);
	if (size < WIRE_HEADER_SIZE || size > WIRE_MAX_MESSAGE)
		CHECK(rc == -EMSGSIZE);
	/* wire_decode_why() decides the same and, refusing, says why; the
	 * header it reports is the one in the message. */
	CHECK(wire_decode_why(data, size, &m2, &why) == rc);
	if (rc < 0) {
		CHECK(why.reason != NULL && why.reason[0] != '\0');
		CHECK(!why.has_header || (size >= WIRE_HEADER_SIZE && why.h.magic == WIRE_MAGIC));
		CHECK(rc != -EPROTO || (why.has_header && why.h.version != WIRE_VERSION));
	}
	if (rc == 0) {
		CHECK(m.payload == data + WIRE_HEADER_SIZE);
		CHECK(m.h.length == size - WIRE_HEADER_SIZE);
		check_roundtrip(data, size, &m);
	} else {
		CHECK(rc == -EMSGSIZE || rc == -EBADMSG || rc == -EPROTO);
	}
	check_encoders(data, size);
	check_changed_encoder(data, size);
	check_attach_ok_encoder(data, size);
	return 0;
}
