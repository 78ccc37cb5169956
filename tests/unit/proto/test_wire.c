/*
 * test_wire.c: unit tests of proto/wire.c, the wcache client protocol's
 * message encoders and decoder.
 *
 * Round trips of every message type (with the exact little-endian bytes on
 * the wire checked, not just encoder and decoder agreeing with each other),
 * then every rejection wire_decode() makes, each asserting its code, and the
 * argument checks and cap checks of the encoders. The status page flag of
 * ATTACH_OK and the unsolicited CHANGED message get the same treatment as
 * the rest: the one flag bit accepted, every other bit refused, file_count
 * bounded by WIRE_MAX_FILES, every CHANGED layout error refused.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "proto/wire.h"

#define FILL 0xA5 /* sentinel for "the function did not write here" */

/* Little-endian field readers for checking encoder output byte by byte. */
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

static void
put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void
put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/*
 * Builds a raw message by hand (no encoder), so the decoder is tested
 * against bytes the encoders would never produce. Returns its length.
 */
static size_t
raw(uint8_t *buf, uint32_t magic, uint16_t version, uint16_t type, uint32_t length, uint32_t seq,
        const void *payload, size_t n)
{
	put32(buf, magic);
	put16(buf + 4, version);
	put16(buf + 6, type);
	put32(buf + 8, length);
	put32(buf + 12, seq);
	if (n > 0)
		memcpy(buf + 16, payload, n);
	return 16 + n;
}

/* A well-formed message of type with an n-byte payload. */
static size_t
good(uint8_t *buf, uint16_t type, const void *payload, size_t n)
{
	return raw(buf, WIRE_MAGIC, WIRE_VERSION, type, (uint32_t)n, 7, payload, n);
}

/* Asserts wire_decode() refuses buf[0..len) with code and leaves out alone. */
static void
expect_reject(const uint8_t *buf, size_t len, int code)
{
	struct wire_message m;
	struct wire_message before;

	memset(&m, FILL, sizeof(m));
	memcpy(&before, &m, sizeof(m));
	assert_int_equal(wire_decode(buf, len, &m), code);
	assert_memory_equal(&m, &before, sizeof(m));
}

/* Asserts wire_decode() accepts buf[0..len). */
static void
expect_accept(const uint8_t *buf, size_t len, struct wire_message *m)
{
	assert_int_equal(wire_decode(buf, len, m), 0);
	assert_ptr_equal(m->payload, buf + 16);
	assert_int_equal(m->h.length, len - 16);
}

/* ATTACH: bytes on the wire, decode, getter; shortest and longest names. */
static void
test_roundtrip_attach(void **state)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	char name[WIRE_MAX_NAME];
	struct wire_message m;
	const char *got;
	size_t got_len;
	ssize_t n;

	n = wire_put_attach(buf, sizeof(buf), 0x01020304u, "llama", 5);
	assert_int_equal(n, 21);
	assert_memory_equal(buf, "WCP1", 4);
	assert_int_equal(buf[4], 1);
	assert_int_equal(buf[5], 0);
	assert_int_equal(buf[6], WIRE_ATTACH);
	assert_int_equal(buf[7], 0);
	assert_int_equal(le32(buf + 8), 5);
	assert_int_equal(buf[12], 0x04); /* seq little-endian */
	assert_int_equal(buf[15], 0x01);
	assert_memory_equal(buf + 16, "llama", 5);

	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(m.h.magic, WIRE_MAGIC);
	assert_int_equal(m.h.version, WIRE_VERSION);
	assert_int_equal(m.h.type, WIRE_ATTACH);
	assert_int_equal(m.h.seq, 0x01020304u);
	assert_int_equal(wire_get_attach(&m, &got, &got_len), 0);
	assert_int_equal(got_len, 5);
	assert_memory_equal(got, "llama", 5);

	/* One byte, and WIRE_MAX_NAME bytes (not NUL-terminated in memory). */
	n = wire_put_attach(buf, sizeof(buf), 1, "x", 1);
	assert_int_equal(n, 17);
	expect_accept(buf, (size_t)n, &m);
	memset(name, 'n', sizeof(name));
	n = wire_put_attach(buf, sizeof(buf), 2, name, sizeof(name));
	assert_int_equal(n, 16 + WIRE_MAX_NAME);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_attach(&m, &got, &got_len), 0);
	assert_int_equal(got_len, WIRE_MAX_NAME);
	assert_memory_equal(got, name, WIRE_MAX_NAME);
}

/* RELEASE: the handle as 8 little-endian bytes. */
static void
test_roundtrip_release(void **state)
{
	uint8_t buf[64];
	struct wire_message m;
	uint64_t handle = 0;
	ssize_t n;

	n = wire_put_release(buf, sizeof(buf), 9, 0x0807060504030201ull);
	assert_int_equal(n, 24);
	assert_int_equal(buf[6], WIRE_RELEASE);
	assert_int_equal(le32(buf + 8), 8);
	for (int i = 0; i < 8; i++)
		assert_int_equal(buf[16 + i], i + 1);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(m.h.seq, 9);
	assert_int_equal(wire_get_release(&m, &handle), 0);
	assert_int_equal(handle, 0x0807060504030201ull);

	n = wire_put_release(buf, sizeof(buf), 0, UINT64_MAX);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_release(&m, &handle), 0);
	assert_true(handle == UINT64_MAX);
}

/* ATTACH_OK: every field at its documented offset, with the status page
 * flag and the most files one message can carry. */
static void
test_roundtrip_attach_ok(void **state)
{
	uint8_t buf[64];
	struct wire_attach_ok ok = {
	        .generation = 0x1112131415161718ull,
	        .handle = 0x2122232425262728ull,
	        .index_size = 0x3132333435363738ull,
	        .file_count = WIRE_MAX_FILES,
	        .flags = WIRE_ATTACH_STATUS,
	        .status_slot = 0x4142434445464748ull,
	};
	struct wire_attach_ok got;
	struct wire_message m;
	ssize_t n;

	n = wire_put_attach_ok(buf, sizeof(buf), 0xFFFFFFFFu, &ok);
	assert_int_equal(n, 56);
	assert_int_equal(buf[6], WIRE_ATTACH_OK & 0xff);
	assert_int_equal(buf[7], 0);
	assert_int_equal(le32(buf + 8), 40);
	assert_true(le64(buf + 16) == ok.generation);
	assert_true(le64(buf + 24) == ok.handle);
	assert_true(le64(buf + 32) == ok.index_size);
	assert_int_equal(le32(buf + 40), 250);
	assert_int_equal(le32(buf + 44), 1); /* WIRE_ATTACH_STATUS */
	assert_true(le64(buf + 48) == ok.status_slot);

	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(m.h.seq, 0xFFFFFFFFu);
	memset(&got, 0, sizeof(got));
	assert_int_equal(wire_get_attach_ok(&m, &got), 0);
	assert_true(got.generation == ok.generation);
	assert_true(got.handle == ok.handle);
	assert_true(got.index_size == ok.index_size);
	assert_int_equal(got.file_count, WIRE_MAX_FILES);
	assert_int_equal(got.flags, WIRE_ATTACH_STATUS);
	assert_true(got.status_slot == ok.status_slot);

	/* Without the status page: flags 0 on the wire and back. */
	ok.flags = 0;
	ok.status_slot = 0;
	ok.file_count = 0;
	n = wire_put_attach_ok(buf, sizeof(buf), 3, &ok);
	assert_int_equal(n, 56);
	assert_int_equal(le32(buf + 40), 0);
	assert_int_equal(le32(buf + 44), 0);
	assert_true(le64(buf + 48) == 0);
	expect_accept(buf, (size_t)n, &m);
	memset(&got, FILL, sizeof(got));
	assert_int_equal(wire_get_attach_ok(&m, &got), 0);
	assert_int_equal(got.flags, 0);
	assert_int_equal(got.file_count, 0);
	assert_true(got.status_slot == 0);
}

/* CHANGED: sequence number 0, the generation as 8 little-endian bytes, then
 * the name; generation 0 (no longer served); shortest and longest names. */
static void
test_roundtrip_changed(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE];
	static char name[WIRE_MAX_NAME];
	struct wire_message m;
	uint64_t generation = 99;
	const char *got = NULL;
	size_t got_len = 0;
	ssize_t n;

	n = wire_put_changed(buf, sizeof(buf), 0x0807060504030201ull, "llama", 5);
	assert_int_equal(n, 16 + 8 + 5);
	assert_memory_equal(buf, "WCP1", 4);
	assert_int_equal(buf[4], 1);
	assert_int_equal(buf[5], 0);
	assert_int_equal(buf[6], 131);
	assert_int_equal(buf[7], 0);
	assert_int_equal(le32(buf + 8), 13);
	assert_int_equal(le32(buf + 12), 0); /* unsolicited: seq 0 */
	for (int i = 0; i < 8; i++)
		assert_int_equal(buf[16 + i], i + 1);
	assert_memory_equal(buf + 24, "llama", 5);

	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(m.h.type, WIRE_CHANGED);
	assert_int_equal(m.h.seq, 0);
	assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), 0);
	assert_true(generation == 0x0807060504030201ull);
	assert_int_equal(got_len, 5);
	assert_ptr_equal(got, buf + 24); /* a view into the buffer, no copy */
	assert_memory_equal(got, "llama", 5);

	/* Generation 0: the model is no longer served. One-byte name. */
	n = wire_put_changed(buf, sizeof(buf), 0, "x", 1);
	assert_int_equal(n, 25);
	for (int i = 0; i < 8; i++)
		assert_int_equal(buf[16 + i], 0);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), 0);
	assert_true(generation == 0);
	assert_int_equal(got_len, 1);
	assert_int_equal(got[0], 'x');

	/* WIRE_MAX_NAME bytes, not NUL-terminated in memory; largest generation. */
	memset(name, 'n', sizeof(name));
	n = wire_put_changed(buf, sizeof(buf), UINT64_MAX, name, sizeof(name));
	assert_int_equal(n, 16 + 8 + WIRE_MAX_NAME);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), 0);
	assert_true(generation == UINT64_MAX);
	assert_int_equal(got_len, WIRE_MAX_NAME);
	assert_memory_equal(got, name, WIRE_MAX_NAME);

	/* NUL bytes in the generation are fine: only the name is text. */
	n = wire_put_changed(buf, sizeof(buf), 0x0100000000000000ull, "a", 1);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), 0);
	assert_true(generation == 0x0100000000000000ull);

	/* NULL out-parameters. */
	assert_int_equal(wire_get_changed(&m, NULL, &got, &got_len), -EINVAL);
	assert_int_equal(wire_get_changed(&m, &generation, NULL, &got_len), -EINVAL);
	assert_int_equal(wire_get_changed(&m, &generation, &got, NULL), -EINVAL);
	assert_int_equal(wire_get_changed(NULL, &generation, &got, &got_len), -EINVAL);
}

/* RELEASE_OK: a header alone. */
static void
test_roundtrip_release_ok(void **state)
{
	uint8_t buf[16];
	struct wire_message m;
	ssize_t n;

	n = wire_put_release_ok(buf, sizeof(buf), 42);
	assert_int_equal(n, 16);
	assert_int_equal(buf[6], WIRE_RELEASE_OK & 0xff);
	assert_int_equal(le32(buf + 8), 0);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(m.h.type, WIRE_RELEASE_OK);
	assert_int_equal(m.h.seq, 42);
}

/* ERROR: code then text; an empty text is allowed. */
static void
test_roundtrip_error(void **state)
{
	uint8_t buf[256];
	struct wire_message m;
	const char *text;
	size_t text_len;
	int32_t code = 0;
	ssize_t n;

	n = wire_put_error(buf, sizeof(buf), 5, ENOENT, "llama: no such model");
	assert_int_equal(n, 16 + 4 + 20);
	assert_int_equal(buf[6], WIRE_ERROR & 0xff);
	assert_int_equal(le32(buf + 16), ENOENT);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_error(&m, &code, &text, &text_len), 0);
	assert_int_equal(code, ENOENT);
	assert_int_equal(text_len, 20);
	assert_memory_equal(text, "llama: no such model", 20);

	n = wire_put_error(buf, sizeof(buf), 5, EPROTO, "");
	assert_int_equal(n, 20);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_error(&m, &code, &text, &text_len), 0);
	assert_int_equal(code, EPROTO);
	assert_int_equal(text_len, 0);

	/* Largest code allowed. */
	n = wire_put_error(buf, sizeof(buf), 5, 4095, "x");
	expect_accept(buf, (size_t)n, &m);
}

/* An overlong error text is cut to fit WIRE_MAX_MESSAGE, at a UTF-8
 * character boundary, instead of failing. */
static void
test_error_truncation(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE + 64];
	static char text[6000];
	const size_t room = WIRE_MAX_MESSAGE - 16 - 4; /* 4076 text bytes */
	struct wire_message m;
	const char *got;
	size_t got_len;
	int32_t code;
	ssize_t n;

	/* Exactly fits: not cut. */
	memset(text, 'a', room);
	text[room] = '\0';
	n = wire_put_error(buf, sizeof(buf), 1, EIO, text);
	assert_int_equal(n, WIRE_MAX_MESSAGE);
	expect_accept(buf, (size_t)n, &m);

	/* ASCII, far too long: cut at the limit. */
	memset(text, 'b', sizeof(text) - 1);
	text[sizeof(text) - 1] = '\0';
	n = wire_put_error(buf, sizeof(buf), 1, EIO, text);
	assert_int_equal(n, WIRE_MAX_MESSAGE);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_error(&m, &code, &got, &got_len), 0);
	assert_int_equal(got_len, room);

	/* A 3-byte character straddling the limit is dropped whole. */
	memset(text, 'a', room - 1);
	memcpy(text + room - 1, "\xE2\x82\xACtail", 8);
	n = wire_put_error(buf, sizeof(buf), 1, EIO, text);
	assert_int_equal(n, WIRE_MAX_MESSAGE - 1);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_error(&m, &code, &got, &got_len), 0);
	assert_int_equal(got_len, room - 1);
	assert_int_equal(got[got_len - 1], 'a');

	/* A 4-byte character whose third byte is at the limit. */
	memset(text, 'a', room - 2);
	memcpy(text + room - 2, "\xF0\x9F\x98\x80tail", 9);
	n = wire_put_error(buf, sizeof(buf), 1, EIO, text);
	assert_int_equal(n, WIRE_MAX_MESSAGE - 2);

	/* A 2-byte character that ends exactly at the limit is kept. */
	memset(text, 'a', room - 2);
	memcpy(text + room - 2, "\xC3\xA9tail", 7);
	n = wire_put_error(buf, sizeof(buf), 1, EIO, text);
	assert_int_equal(n, WIRE_MAX_MESSAGE);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_error(&m, &code, &got, &got_len), 0);
	assert_memory_equal(got + room - 2, "\xC3\xA9", 2);

	/* Not UTF-8 at all (continuation bytes only): still cut, still valid. */
	memset(text, 0x80, sizeof(text) - 1);
	n = wire_put_error(buf, sizeof(buf), 1, EIO, text);
	assert_int_equal(n, WIRE_MAX_MESSAGE);
	expect_accept(buf, (size_t)n, &m);

	/* A cap smaller than the cut message is still -EMSGSIZE. */
	memset(text, 'c', sizeof(text) - 1);
	assert_int_equal(wire_put_error(buf, WIRE_MAX_MESSAGE - 1, 1, EIO, text), -EMSGSIZE);
}

/* Every encoder returns -EMSGSIZE for a cap one byte short and leaves the
 * buffer untouched; the exact size works. */
static void
test_encoder_cap(void **state)
{
	uint8_t buf[128], before[128];
	struct wire_attach_ok ok = {.file_count = 1};

	memset(buf, FILL, sizeof(buf));
	memcpy(before, buf, sizeof(buf));
	assert_int_equal(wire_put_attach(buf, 20, 1, "llama", 5), -EMSGSIZE);
	assert_int_equal(wire_put_attach(buf, 0, 1, "llama", 5), -EMSGSIZE);
	assert_int_equal(wire_put_release(buf, 23, 1, 5), -EMSGSIZE);
	assert_int_equal(wire_put_attach_ok(buf, 55, 1, &ok), -EMSGSIZE);
	assert_int_equal(wire_put_release_ok(buf, 15, 1), -EMSGSIZE);
	assert_int_equal(wire_put_error(buf, 22, 1, EIO, "abc"), -EMSGSIZE);
	assert_int_equal(wire_put_error(buf, 3, 1, EIO, ""), -EMSGSIZE);
	assert_int_equal(wire_put_changed(buf, 28, 2, "llama", 5), -EMSGSIZE);
	assert_int_equal(wire_put_changed(buf, 16, 2, "llama", 5), -EMSGSIZE);
	assert_int_equal(wire_put_changed(buf, 0, 2, "llama", 5), -EMSGSIZE);
	ok.flags = WIRE_ATTACH_STATUS;
	assert_int_equal(wire_put_attach_ok(buf, 55, 1, &ok), -EMSGSIZE);
	ok.flags = 0;
	assert_memory_equal(buf, before, sizeof(buf));

	assert_int_equal(wire_put_attach(buf, 21, 1, "llama", 5), 21);
	assert_int_equal(wire_put_release(buf, 24, 1, 5), 24);
	assert_int_equal(wire_put_attach_ok(buf, 56, 1, &ok), 56);
	assert_int_equal(wire_put_release_ok(buf, 16, 1), 16);
	assert_int_equal(wire_put_error(buf, 23, 1, EIO, "abc"), 23);
	assert_int_equal(wire_put_changed(buf, 29, 2, "llama", 5), 29);
}

/* Encoders refuse what the decoder would refuse, with -EINVAL. */
static void
test_encoder_invalid(void **state)
{
	uint8_t buf[WIRE_MAX_MESSAGE + 16];
	char name[WIRE_MAX_NAME + 1];
	struct wire_attach_ok ok = {0};

	memset(name, 'n', sizeof(name));
	assert_int_equal(wire_put_attach(buf, sizeof(buf), 1, "x", 0), -EINVAL);
	assert_int_equal(wire_put_attach(buf, sizeof(buf), 1, name, sizeof(name)), -EINVAL);
	assert_int_equal(wire_put_attach(buf, sizeof(buf), 1, "ab\0c", 4), -EINVAL);
	assert_int_equal(wire_put_attach(buf, sizeof(buf), 1, "abc", 4), -EINVAL); /* NUL last */
	assert_int_equal(wire_put_attach(buf, sizeof(buf), 1, NULL, 3), -EINVAL);
	assert_int_equal(wire_put_attach(NULL, sizeof(buf), 1, "abc", 3), -EINVAL);

	assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, NULL), -EINVAL);
	assert_int_equal(wire_put_attach_ok(NULL, sizeof(buf), 1, &ok), -EINVAL);
	/* The status flag is the one known bit; every other bit is refused,
	 * alone or beside it. */
	ok.flags = WIRE_ATTACH_STATUS;
	assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, &ok), 56);
	static const uint32_t bad_flags[] = {2, 3, 4, 0x100, 0x80000000u, 0x80000001u,
	        0xFFFFFFFEu, 0xFFFFFFFFu};
	for (size_t i = 0; i < sizeof(bad_flags) / sizeof(bad_flags[0]); i++) {
		ok.flags = bad_flags[i];
		assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, &ok), -EINVAL);
	}
	/* file_count: WIRE_MAX_FILES fits beside the index and the status page,
	 * with or without the flag; one more does not. */
	for (uint32_t flags = 0; flags <= WIRE_ATTACH_STATUS; flags++) {
		ok.flags = flags;
		ok.file_count = WIRE_MAX_FILES;
		assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, &ok), 56);
		ok.file_count = WIRE_MAX_FILES + 1;
		assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, &ok), -EINVAL);
		ok.file_count = WIRE_MAX_FDS;
		assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, &ok), -EINVAL);
		ok.file_count = UINT32_MAX;
		assert_int_equal(wire_put_attach_ok(buf, sizeof(buf), 1, &ok), -EINVAL);
	}

	/* CHANGED: the name follows ATTACH's rules. */
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, "x", 0), -EINVAL);
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, name, WIRE_MAX_NAME + 1), -EINVAL);
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, name, WIRE_MAX_NAME),
	        16 + 8 + WIRE_MAX_NAME);
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, name, SIZE_MAX), -EINVAL);
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, "\0bc", 3), -EINVAL);
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, "a\0c", 3), -EINVAL);
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, "abc", 4), -EINVAL); /* NUL last */
	assert_int_equal(wire_put_changed(buf, sizeof(buf), 1, NULL, 3), -EINVAL);
	assert_int_equal(wire_put_changed(NULL, sizeof(buf), 1, "abc", 3), -EINVAL);
	/* Argument errors win over a cap that is too small. */
	assert_int_equal(wire_put_changed(buf, 0, 1, "x", 0), -EINVAL);
	ok.flags = 2;
	ok.file_count = 0;
	assert_int_equal(wire_put_attach_ok(buf, 0, 1, &ok), -EINVAL);

	assert_int_equal(wire_put_error(buf, sizeof(buf), 1, 0, "x"), -EINVAL);
	assert_int_equal(wire_put_error(buf, sizeof(buf), 1, -ENOENT, "x"), -EINVAL);
	assert_int_equal(wire_put_error(buf, sizeof(buf), 1, 4096, "x"), -EINVAL);
	assert_int_equal(wire_put_error(buf, sizeof(buf), 1, EIO, NULL), -EINVAL);
	assert_int_equal(wire_put_release(NULL, 64, 1, 1), -EINVAL);
	assert_int_equal(wire_put_release_ok(NULL, 64, 1), -EINVAL);
}

/* Messages shorter than a header or longer than WIRE_MAX_MESSAGE. */
static void
test_reject_size(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE + 16];
	static uint8_t name[WIRE_MAX_MESSAGE];
	size_t len;

	len = good(buf, WIRE_RELEASE_OK, NULL, 0);
	expect_accept(buf, len, &(struct wire_message){0});
	expect_reject(buf, 0, -EMSGSIZE);
	expect_reject(buf, 1, -EMSGSIZE);
	expect_reject(buf, 15, -EMSGSIZE);

	/* A message of WIRE_MAX_MESSAGE + 1 bytes whose header agrees with its
	 * size: refused by size before anything else. */
	memset(name, 'e', sizeof(name));
	put32(name, EIO);
	len = good(buf, WIRE_ERROR, name, WIRE_MAX_MESSAGE - 16 + 1);
	assert_int_equal(len, WIRE_MAX_MESSAGE + 1);
	expect_reject(buf, len, -EMSGSIZE);
	/* One byte less is the largest message there is. */
	len = good(buf, WIRE_ERROR, name, WIRE_MAX_MESSAGE - 16);
	expect_accept(buf, len, &(struct wire_message){0});

	/* NULL arguments. */
	assert_int_equal(wire_decode(NULL, 16, &(struct wire_message){0}), -EINVAL);
	assert_int_equal(wire_decode(buf, len, NULL), -EINVAL);
}

/* Magic, version and type, and the order the checks run in. */
static void
test_reject_header(void **state)
{
	uint8_t buf[64];
	uint8_t handle[8] = {1};
	size_t len;

	len = raw(buf, WIRE_MAGIC ^ 1, WIRE_VERSION, WIRE_RELEASE, 8, 1, handle, 8);
	expect_reject(buf, len, -EBADMSG);
	len = raw(buf, 0x50435731u /* "1WCP": byte-swapped */, WIRE_VERSION, WIRE_RELEASE, 8, 1,
	        handle, 8);
	expect_reject(buf, len, -EBADMSG);

	len = raw(buf, WIRE_MAGIC, 0, WIRE_RELEASE, 8, 1, handle, 8);
	expect_reject(buf, len, -EPROTO);
	len = raw(buf, WIRE_MAGIC, 2, WIRE_RELEASE, 8, 1, handle, 8);
	expect_reject(buf, len, -EPROTO);
	len = raw(buf, WIRE_MAGIC, 0x0100, WIRE_RELEASE, 8, 1, handle, 8); /* big-endian 1 */
	expect_reject(buf, len, -EPROTO);

	static const uint16_t unknown[] = {0, 4, 128, 133, 254, 256, 0x8101, 0x8301, 0xFFFF};
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		len = raw(buf, WIRE_MAGIC, WIRE_VERSION, unknown[i], 8, 1, handle, 8);
		expect_reject(buf, len, -EBADMSG);
	}

	/* Order: a bad magic hides a bad version; a bad version (a peer of
	 * another protocol version) is reported before an unknown type or a
	 * length it would lay out differently. */
	len = raw(buf, WIRE_MAGIC ^ 1, 2, WIRE_RELEASE, 8, 1, handle, 8);
	expect_reject(buf, len, -EBADMSG);
	len = raw(buf, WIRE_MAGIC, 2, 77, 3, 1, handle, 8);
	expect_reject(buf, len, -EPROTO);
}

/* The length field must equal the payload size exactly, both ways. */
static void
test_reject_length_mismatch(void **state)
{
	uint8_t buf[64];
	uint8_t payload[16] = {1, 2, 3, 4, 5, 6, 7, 8};
	size_t len;

	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_RELEASE, 9, 1, payload, 8);
	expect_reject(buf, len, -EBADMSG); /* says more than there is */
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_RELEASE, 7, 1, payload, 8);
	expect_reject(buf, len, -EBADMSG); /* says less: trailing bytes */
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_RELEASE, 8, 1, payload, 9);
	expect_reject(buf, len, -EBADMSG); /* a RELEASE with a trailing byte */
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_RELEASE_OK, 0xFFFFFFFFu, 1, NULL, 0);
	expect_reject(buf, len, -EBADMSG);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_ATTACH, 0x80000003u, 1, "abc", 3);
	expect_reject(buf, len, -EBADMSG); /* high bits set */
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_ATTACH, 3, 1, "abc", 3);
	expect_reject(buf, len - 1, -EBADMSG); /* the packet was cut short */
	expect_accept(buf, len, &(struct wire_message){0});
}

/* ATTACH: 1..WIRE_MAX_NAME bytes, no NUL anywhere. */
static void
test_reject_attach(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE];
	static char name[WIRE_MAX_NAME + 1];
	struct wire_message m;
	size_t len;

	len = good(buf, WIRE_ATTACH, NULL, 0);
	expect_reject(buf, len, -EBADMSG);
	memset(name, 'n', sizeof(name));
	len = good(buf, WIRE_ATTACH, name, WIRE_MAX_NAME + 1);
	expect_reject(buf, len, -EBADMSG);
	len = good(buf, WIRE_ATTACH, name, WIRE_MAX_NAME);
	expect_accept(buf, len, &m);

	len = good(buf, WIRE_ATTACH, "\0bc", 3);
	expect_reject(buf, len, -EBADMSG);
	len = good(buf, WIRE_ATTACH, "a\0c", 3);
	expect_reject(buf, len, -EBADMSG);
	len = good(buf, WIRE_ATTACH, "ab\0", 3);
	expect_reject(buf, len, -EBADMSG);
	len = good(buf, WIRE_ATTACH, "\0", 1);
	expect_reject(buf, len, -EBADMSG);
	len = good(buf, WIRE_ATTACH, "/srv/models/llama.safetensors", 29);
	expect_accept(buf, len, &m);
}

/* RELEASE: exactly 8 bytes. */
static void
test_reject_release(void **state)
{
	uint8_t buf[64];
	uint8_t payload[16] = {0};

	for (size_t n = 0; n <= 16; n++) {
		size_t len = good(buf, WIRE_RELEASE, payload, n);

		if (n == 8)
			expect_accept(buf, len, &(struct wire_message){0});
		else
			expect_reject(buf, len, -EBADMSG);
	}
}

/* ATTACH_OK: exactly 40 bytes, flags 0 or WIRE_ATTACH_STATUS, file_count at
 * most WIRE_MAX_FILES. */
static void
test_reject_attach_ok(void **state)
{
	uint8_t buf[128];
	uint8_t payload[48] = {0};
	struct wire_attach_ok got;
	struct wire_message m;
	size_t len;

	for (size_t n = 0; n <= 48; n++) {
		len = good(buf, WIRE_ATTACH_OK, payload, n);
		if (n == 40)
			expect_accept(buf, len, &(struct wire_message){0});
		else
			expect_reject(buf, len, -EBADMSG);
	}

	/* flags (offset 28): bit 0 is the status page, any other bit is
	 * malformed, also beside bit 0. Each byte of the field is checked. */
	put32(payload + 28, WIRE_ATTACH_STATUS);
	put32(payload + 32, 7); /* status_slot */
	len = good(buf, WIRE_ATTACH_OK, payload, 40);
	expect_accept(buf, len, &m);
	assert_int_equal(wire_get_attach_ok(&m, &got), 0);
	assert_int_equal(got.flags, WIRE_ATTACH_STATUS);
	assert_true(got.status_slot == 7);
	static const uint32_t bad_flags[] = {2, 3, 0x100, 0x101, 0x10000, 0x1000000, 0x80000000u,
	        0x80000001u, 0xFFFFFFFFu};
	for (size_t i = 0; i < sizeof(bad_flags) / sizeof(bad_flags[0]); i++) {
		put32(payload + 28, bad_flags[i]);
		len = good(buf, WIRE_ATTACH_OK, payload, 40);
		expect_reject(buf, len, -EBADMSG);
	}

	/* file_count (offset 24): up to WIRE_MAX_FILES, with and without the
	 * status page (whose descriptor is the 252nd). */
	for (uint32_t flags = 0; flags <= WIRE_ATTACH_STATUS; flags++) {
		put32(payload + 28, flags);
		put32(payload + 24, WIRE_MAX_FILES);
		len = good(buf, WIRE_ATTACH_OK, payload, 40);
		expect_accept(buf, len, &m);
		assert_int_equal(wire_get_attach_ok(&m, &got), 0);
		assert_int_equal(got.file_count, 250);
		put32(payload + 24, WIRE_MAX_FILES + 1);
		len = good(buf, WIRE_ATTACH_OK, payload, 40);
		expect_reject(buf, len, -EBADMSG);
		put32(payload + 24, WIRE_MAX_FDS);
		len = good(buf, WIRE_ATTACH_OK, payload, 40);
		expect_reject(buf, len, -EBADMSG);
		put32(payload + 24, 0x100u + WIRE_MAX_FILES); /* high byte set */
		len = good(buf, WIRE_ATTACH_OK, payload, 40);
		expect_reject(buf, len, -EBADMSG);
		put32(payload + 24, 0xFFFFFFFFu);
		len = good(buf, WIRE_ATTACH_OK, payload, 40);
		expect_reject(buf, len, -EBADMSG);
	}

	/* status_slot is the receiver's to check against the page: any value
	 * decodes, with or without the flag. */
	put32(payload + 24, 1);
	put32(payload + 28, 0);
	memset(payload + 32, 0xFF, 8);
	len = good(buf, WIRE_ATTACH_OK, payload, 40);
	expect_accept(buf, len, &m);
	put32(payload + 28, WIRE_ATTACH_STATUS);
	len = good(buf, WIRE_ATTACH_OK, payload, 40);
	expect_accept(buf, len, &m);
	assert_int_equal(wire_get_attach_ok(&m, &got), 0);
	assert_true(got.status_slot == UINT64_MAX);
}

/* CHANGED: the 8-byte generation, then a name of 1..WIRE_MAX_NAME bytes with
 * no NUL. Built by hand with seq 0, as the daemon sends it. */
static void
test_reject_changed(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE];
	static uint8_t payload[8 + WIRE_MAX_NAME + 1];
	struct wire_message m;
	uint64_t generation;
	const char *name;
	size_t name_len;
	size_t len;

	/* Short: no room for the generation, or a generation and no name. */
	put32(payload, 5);
	put32(payload + 4, 0);
	memset(payload + 8, 'n', WIRE_MAX_NAME + 1);
	for (size_t n = 0; n <= 8; n++) {
		len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, (uint32_t)n, 0, payload, n);
		expect_reject(buf, len, -EBADMSG);
	}
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 9, 0, payload, 9);
	expect_accept(buf, len, &m);
	assert_int_equal(wire_get_changed(&m, &generation, &name, &name_len), 0);
	assert_true(generation == 5);
	assert_int_equal(name_len, 1);

	/* Too long: WIRE_MAX_NAME is the longest name. */
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 8 + WIRE_MAX_NAME, 0, payload,
	        8 + WIRE_MAX_NAME);
	expect_accept(buf, len, &m);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 8 + WIRE_MAX_NAME + 1, 0, payload,
	        8 + WIRE_MAX_NAME + 1);
	expect_reject(buf, len, -EBADMSG);

	/* A NUL anywhere in the name: first, middle, last, alone. */
	memcpy(payload + 8, "\0bc", 3);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 11, 0, payload, 11);
	expect_reject(buf, len, -EBADMSG);
	memcpy(payload + 8, "a\0c", 3);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 11, 0, payload, 11);
	expect_reject(buf, len, -EBADMSG);
	memcpy(payload + 8, "ab\0", 3);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 11, 0, payload, 11);
	expect_reject(buf, len, -EBADMSG);
	payload[8] = '\0';
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 9, 0, payload, 9);
	expect_reject(buf, len, -EBADMSG);
	/* A NUL at the end of a name of WIRE_MAX_NAME bytes. */
	memset(payload + 8, 'n', WIRE_MAX_NAME);
	payload[8 + WIRE_MAX_NAME - 1] = '\0';
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 8 + WIRE_MAX_NAME, 0, payload,
	        8 + WIRE_MAX_NAME);
	expect_reject(buf, len, -EBADMSG);

	/* The length field must match the packet for CHANGED too. */
	memcpy(payload + 8, "abc", 3);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 12, 0, payload, 11);
	expect_reject(buf, len, -EBADMSG);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 10, 0, payload, 11);
	expect_reject(buf, len, -EBADMSG);
	len = raw(buf, WIRE_MAGIC, WIRE_VERSION, WIRE_CHANGED, 11, 0, payload, 11);
	expect_accept(buf, len, &m);
	/* Another version: -EPROTO, as for every type. */
	len = raw(buf, WIRE_MAGIC, 2, WIRE_CHANGED, 11, 0, payload, 11);
	expect_reject(buf, len, -EPROTO);
}

/* HOLD: the client's seq, the generation it maps, then the name (CHANGED's
 * layout, any seq); HOLD_OK: the handle alone (RELEASE's layout). Every
 * layout error refused, and neither getter reads the other's type. */
static void
test_hold(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE];
	static uint8_t payload[8 + WIRE_MAX_NAME + 1];
	struct wire_message m;
	uint64_t generation = 0, handle = 0;
	const char *got = NULL;
	size_t got_len = 0, len;
	ssize_t n;

	(void)state;
	n = wire_put_hold(buf, sizeof(buf), 42, 7, "llama", 5);
	assert_int_equal(n, 16 + 8 + 5);
	assert_int_equal(buf[6], 3);
	assert_int_equal(le32(buf + 8), 13);
	assert_int_equal(le32(buf + 12), 42);
	assert_true(le64(buf + 16) == 7);
	assert_memory_equal(buf + 24, "llama", 5);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_hold(&m, &generation, &got, &got_len), 0);
	assert_true(generation == 7);
	assert_int_equal(got_len, 5);
	assert_ptr_equal(got, buf + 24);
	assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
	assert_int_equal(wire_get_hold_ok(&m, &handle), -EBADMSG);
	assert_int_equal(wire_put_hold(buf, sizeof(buf), 1, 7, "", 0), -EINVAL);
	assert_int_equal(wire_put_hold(buf, sizeof(buf), 1, 7, "a\0b", 3), -EINVAL);
	assert_int_equal(wire_put_hold(buf, 16 + 8 + 4, 1, 7, "llama", 5), -EMSGSIZE);

	/* No name, a NUL in it, one byte too long. */
	memset(payload, 'n', sizeof(payload));
	for (size_t k = 0; k <= 8; k++) {
		len = good(buf, WIRE_HOLD, payload, k);
		expect_reject(buf, len, -EBADMSG);
	}
	payload[10] = '\0';
	len = good(buf, WIRE_HOLD, payload, 12);
	expect_reject(buf, len, -EBADMSG);
	payload[10] = 'n';
	len = good(buf, WIRE_HOLD, payload, 8 + WIRE_MAX_NAME);
	expect_accept(buf, len, &m);
	len = good(buf, WIRE_HOLD, payload, 8 + WIRE_MAX_NAME + 1);
	expect_reject(buf, len, -EBADMSG);

	n = wire_put_hold_ok(buf, sizeof(buf), 42, 0x1122334455667788ull);
	assert_int_equal(n, 24);
	assert_int_equal(buf[6], 132);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_hold_ok(&m, &handle), 0);
	assert_true(handle == 0x1122334455667788ull);
	assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
	assert_int_equal(wire_put_hold_ok(buf, 23, 42, 1), -EMSGSIZE);
	for (size_t k = 0; k <= 16; k++)
		if (k != 8) {
			len = good(buf, WIRE_HOLD_OK, payload, k);
			expect_reject(buf, len, -EBADMSG);
		}
}

/* RELEASE_OK: empty. */
static void
test_reject_release_ok(void **state)
{
	uint8_t buf[64];
	size_t len;

	len = good(buf, WIRE_RELEASE_OK, "x", 1);
	expect_reject(buf, len, -EBADMSG);
	len = good(buf, WIRE_RELEASE_OK, "\0\0\0\0\0\0\0\0", 8);
	expect_reject(buf, len, -EBADMSG);
}

/* ERROR: at least the 4-byte code, code in 1..4095, no NUL in the text. */
static void
test_reject_error(void **state)
{
	uint8_t buf[64];
	uint8_t payload[16];
	size_t len;

	put32(payload, ENOENT);
	for (size_t n = 0; n < 4; n++) {
		len = good(buf, WIRE_ERROR, payload, n);
		expect_reject(buf, len, -EBADMSG);
	}
	len = good(buf, WIRE_ERROR, payload, 4);
	expect_accept(buf, len, &(struct wire_message){0});

	memcpy(payload + 4, "ab\0d", 4);
	len = good(buf, WIRE_ERROR, payload, 8);
	expect_reject(buf, len, -EBADMSG);
	memcpy(payload + 4, "abc\0", 4);
	len = good(buf, WIRE_ERROR, payload, 8);
	expect_reject(buf, len, -EBADMSG);
	memcpy(payload + 4, "abcd", 4);
	len = good(buf, WIRE_ERROR, payload, 8);
	expect_accept(buf, len, &(struct wire_message){0});

	/* Codes that a client returning -code would misread. */
	static const uint32_t bad[] = {0, 0xFFFFFFFEu /* -2 */, 0x80000000u, 4096};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		put32(payload, bad[i]);
		len = good(buf, WIRE_ERROR, payload, 8);
		expect_reject(buf, len, -EBADMSG);
	}
	put32(payload, 4095);
	len = good(buf, WIRE_ERROR, payload, 8);
	expect_accept(buf, len, &(struct wire_message){0});
}

/* Getters refuse a message of another type and leave their outputs alone. */
static void
test_getter_wrong_type(void **state)
{
	uint8_t buf[64];
	struct wire_message m;
	struct wire_attach_ok ok, ok_before;
	const char *name = NULL;
	size_t name_len = 99;
	uint64_t handle = 99;
	int32_t code = 99;
	ssize_t n;

	n = wire_put_release(buf, sizeof(buf), 1, 5);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_attach(&m, &name, &name_len), -EBADMSG);
	assert_int_equal(wire_get_error(&m, &code, &name, &name_len), -EBADMSG);
	memset(&ok, FILL, sizeof(ok));
	ok_before = ok;
	assert_int_equal(wire_get_attach_ok(&m, &ok), -EBADMSG);
	assert_memory_equal(&ok, &ok_before, sizeof(ok));
	assert_null(name);
	assert_int_equal(name_len, 99);
	assert_int_equal(code, 99);

	n = wire_put_release_ok(buf, sizeof(buf), 1);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
	assert_int_equal(handle, 99);

	/* Same payload size as the type asked for, other type: still refused. */
	n = wire_put_attach(buf, sizeof(buf), 1, "abcdefgh", 8);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
	n = wire_put_error(buf, sizeof(buf), 1, EIO, "abcd");
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
	assert_int_equal(handle, 99);

	/* CHANGED is refused by every other getter, and its getter refuses every
	 * other type, leaving its outputs alone. A CHANGED whose payload is 40
	 * bytes (ATTACH_OK's size) is still not an ATTACH_OK. */
	{
		static const char name32[] = "abcdefghijklmnopqrstuvwxyz012345";
		uint64_t generation = 99;
		const char *got = NULL;
		size_t got_len = 99;

		n = wire_put_changed(buf, sizeof(buf), 3, name32, 32);
		assert_int_equal(n, 56);
		expect_accept(buf, (size_t)n, &m);
		assert_int_equal(wire_get_attach(&m, &name, &name_len), -EBADMSG);
		assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
		assert_int_equal(wire_get_attach_ok(&m, &ok), -EBADMSG);
		assert_memory_equal(&ok, &ok_before, sizeof(ok));
		assert_int_equal(wire_get_error(&m, &code, &name, &name_len), -EBADMSG);
		assert_null(name);
		assert_int_equal(name_len, 99);
		assert_int_equal(handle, 99);
		assert_int_equal(code, 99);

		n = wire_put_attach(buf, sizeof(buf), 1, "llama", 5);
		expect_accept(buf, (size_t)n, &m);
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		n = wire_put_error(buf, sizeof(buf), 1, EIO, "llama");
		expect_accept(buf, (size_t)n, &m);
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		n = wire_put_attach_ok(buf, sizeof(buf), 1, &(struct wire_attach_ok){.file_count = 1});
		expect_accept(buf, (size_t)n, &m);
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		n = wire_put_release(buf, sizeof(buf), 1, 5);
		expect_accept(buf, (size_t)n, &m);
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		n = wire_put_release_ok(buf, sizeof(buf), 1);
		expect_accept(buf, (size_t)n, &m);
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		assert_true(generation == 99);
		assert_null(got);
		assert_int_equal(got_len, 99);

		/* A hand-built CHANGED that lies about its payload. */
		n = wire_put_changed(buf, sizeof(buf), 3, "ab", 2);
		expect_accept(buf, (size_t)n, &m);
		m.h.length = 8; /* no name */
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		m.h.length = 0xFFFFFFFFu;
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EBADMSG);
		m.h.length = 10;
		m.payload = NULL;
		assert_int_equal(wire_get_changed(&m, &generation, &got, &got_len), -EINVAL);
		assert_true(generation == 99);
		assert_null(got);
		assert_int_equal(got_len, 99);
	}

	/* A hand-built message that lies about its payload is refused too. */
	n = wire_put_release(buf, sizeof(buf), 1, 5);
	expect_accept(buf, (size_t)n, &m);
	m.h.length = 7;
	assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
	m.h.length = 0xFFFFFFFFu;
	assert_int_equal(wire_get_release(&m, &handle), -EBADMSG);
	assert_int_equal(handle, 99);
	assert_int_equal(wire_get_release(NULL, &handle), -EINVAL);
}

/* Decoding works at any alignment (no pointer casts into the buffer; UBSan
 * would flag a misaligned load). */
static void
test_unaligned(void **state)
{
	uint8_t space[128];
	struct wire_attach_ok ok = {
	        .generation = 3, .handle = 4, .index_size = 4096, .file_count = 2};
	struct wire_attach_ok got;
	struct wire_message m;

	for (size_t off = 1; off < 8; off++) {
		ssize_t n = wire_put_attach_ok(space + off, sizeof(space) - off, 1, &ok);

		assert_int_equal(n, 56);
		expect_accept(space + off, (size_t)n, &m);
		assert_int_equal(wire_get_attach_ok(&m, &got), 0);
		assert_true(got.generation == 3 && got.handle == 4 && got.index_size == 4096);
		assert_int_equal(got.file_count, 2);
	}
	for (size_t off = 1; off < 8; off++) {
		ssize_t n = wire_put_changed(space + off, sizeof(space) - off,
		        0x0102030405060708ull, "llama", 5);
		uint64_t generation;
		const char *name;
		size_t name_len;

		assert_int_equal(n, 29);
		expect_accept(space + off, (size_t)n, &m);
		assert_int_equal(wire_get_changed(&m, &generation, &name, &name_len), 0);
		assert_true(generation == 0x0102030405060708ull);
		assert_int_equal(name_len, 5);
	}
}

/* DERIVE: exact bytes, the round trip, and every layout error refused. */
static void
test_derive(void **state)
{
	uint8_t buf[WIRE_MAX_MESSAGE], payload[WIRE_MAX_MESSAGE];
	struct wire_derive d = { .wait_ms = 30000, .key = "f32-v1", .key_len = 6,
		.name = "llama", .name_len = 5 };
	struct wire_derive got;
	struct wire_message m;
	char longkey[WIRE_MAX_KEY + 2];
	ssize_t n;

	(void)state;
	n = wire_put_derive(buf, sizeof(buf), 9, &d);
	assert_int_equal(n, 16 + 8 + 6 + 5);
	assert_int_equal(le32(buf + 6) & 0xffff, WIRE_DERIVE);
	assert_int_equal(le32(buf + 16), 30000);
	assert_int_equal(le32(buf + 20), 6);
	assert_memory_equal(buf + 24, "f32-v1llama", 11);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_derive(&m, &got), 0);
	assert_int_equal(got.wait_ms, 30000);
	assert_int_equal(got.key_len, 6);
	assert_memory_equal(got.key, "f32-v1", 6);
	assert_int_equal(got.name_len, 5);
	assert_memory_equal(got.name, "llama", 5);

	/* Keys: letters, digits and "._+-", 1..64 bytes. */
	assert_true(wire_key_valid("int8-rowwise_v2.1+x", 19));
	assert_false(wire_key_valid("a/b", 3));
	assert_false(wire_key_valid("a b", 3));
	assert_false(wire_key_valid("", 0));
	memset(longkey, 'k', sizeof(longkey));
	assert_true(wire_key_valid(longkey, WIRE_MAX_KEY));
	assert_false(wire_key_valid(longkey, WIRE_MAX_KEY + 1));
	d.key = longkey;
	d.key_len = WIRE_MAX_KEY + 1;
	assert_int_equal(wire_put_derive(buf, sizeof(buf), 1, &d), -EINVAL);
	d.key = "a/b";
	d.key_len = 3;
	assert_int_equal(wire_put_derive(buf, sizeof(buf), 1, &d), -EINVAL);
	d.key = "k";
	d.key_len = 1;
	d.name_len = 0;
	assert_int_equal(wire_put_derive(buf, sizeof(buf), 1, &d), -EINVAL);
	d.name_len = 5;
	assert_int_equal(wire_put_derive(buf, 16 + 8 + 1 + 4, 1, &d), -EMSGSIZE);

	/* Hand-made payloads the encoder never writes. */
	put32(payload, 0);
	put32(payload + 4, 0); /* key_len 0 */
	memcpy(payload + 8, "kname", 5);
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 13), -EBADMSG);
	put32(payload + 4, 5); /* the key takes everything: no name */
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 13), -EBADMSG);
	put32(payload + 4, 0xffffffffu); /* a length that would wrap */
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 13), -EBADMSG);
	put32(payload + 4, 1);
	payload[8] = '/'; /* a key character outside the set */
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 13), -EBADMSG);
	payload[8] = 'k';
	payload[10] = '\0'; /* a NUL in the name */
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 13), -EBADMSG);
	payload[10] = 'a';
	expect_accept(buf, good(buf, WIRE_DERIVE, payload, 13), &m);
	memset(payload + 9, 'n', WIRE_MAX_NAME + 1); /* a name one byte too long */
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 9 + WIRE_MAX_NAME + 1), -EBADMSG);
	expect_reject(buf, good(buf, WIRE_DERIVE, payload, 9), -EBADMSG);
}

/* PUBLISH, ABANDON and BUILD: exact bytes, round trips, refusals. */
static void
test_build_messages(void **state)
{
	uint8_t buf[WIRE_MAX_MESSAGE], payload[WIRE_MAX_MESSAGE];
	struct wire_attach_ok ok = { .generation = 3, .handle = 4, .index_size = 4096,
		.file_count = 2, .flags = WIRE_ATTACH_STATUS, .status_slot = 1 }, got;
	struct wire_message m;
	char reason[WIRE_MAX_REASON + 10];
	const char *text;
	uint64_t token;
	size_t len;
	ssize_t n;

	(void)state;
	n = wire_put_publish(buf, sizeof(buf), 5, 0x1122334455667788ull);
	assert_int_equal(n, 24);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_publish(&m, &token), 0);
	assert_true(token == 0x1122334455667788ull);
	expect_reject(buf, good(buf, WIRE_PUBLISH, payload, 7), -EBADMSG);

	n = wire_put_build(buf, sizeof(buf), 6, &ok, 77);
	assert_int_equal(n, 16 + 48);
	assert_int_equal(le64(buf + 16), 3);
	assert_int_equal(le64(buf + 16 + 40), 77);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_build(&m, &got, &token), 0);
	assert_memory_equal(&got, &ok, sizeof(ok));
	assert_int_equal(token, 77);
	assert_int_equal(wire_get_attach_ok(&m, &got), -EBADMSG);
	buf[16 + 28] = 4; /* an unknown flag */
	expect_reject(buf, (size_t)n, -EBADMSG);
	ok.file_count = WIRE_MAX_FILES + 1;
	assert_int_equal(wire_put_build(buf, sizeof(buf), 6, &ok, 77), -EINVAL);
	ok.file_count = 2;
	assert_int_equal(wire_put_build(buf, 16 + 47, 6, &ok, 77), -EMSGSIZE);

	n = wire_put_abandon(buf, sizeof(buf), 8, 99, "ValueError: out of range");
	assert_int_equal(n, 16 + 8 + 24);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_abandon(&m, &token, &text, &len), 0);
	assert_int_equal(token, 99);
	assert_int_equal(len, 24);
	assert_memory_equal(text, "ValueError: out of range", 24);
	n = wire_put_abandon(buf, sizeof(buf), 8, 99, "");
	assert_int_equal(n, 24);
	/* A longer reason is cut, never refused. */
	memset(reason, 'r', sizeof(reason) - 1);
	reason[sizeof(reason) - 1] = '\0';
	n = wire_put_abandon(buf, sizeof(buf), 8, 99, reason);
	assert_int_equal(n, 16 + 8 + WIRE_MAX_REASON);
	expect_accept(buf, (size_t)n, &m);
	memset(payload, 'r', sizeof(payload));
	expect_reject(buf, good(buf, WIRE_ABANDON, payload, 8 + WIRE_MAX_REASON + 1), -EBADMSG);
	payload[9] = '\0';
	expect_reject(buf, good(buf, WIRE_ABANDON, payload, 12), -EBADMSG);
	expect_reject(buf, good(buf, WIRE_ABANDON, payload, 7), -EBADMSG);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_roundtrip_attach),
	        cmocka_unit_test(test_roundtrip_release),
	        cmocka_unit_test(test_roundtrip_attach_ok),
	        cmocka_unit_test(test_roundtrip_changed),
	        cmocka_unit_test(test_roundtrip_release_ok),
	        cmocka_unit_test(test_roundtrip_error),
	        cmocka_unit_test(test_error_truncation),
	        cmocka_unit_test(test_encoder_cap),
	        cmocka_unit_test(test_encoder_invalid),
	        cmocka_unit_test(test_reject_size),
	        cmocka_unit_test(test_reject_header),
	        cmocka_unit_test(test_reject_length_mismatch),
	        cmocka_unit_test(test_reject_attach),
	        cmocka_unit_test(test_reject_release),
	        cmocka_unit_test(test_reject_attach_ok),
	        cmocka_unit_test(test_reject_release_ok),
	        cmocka_unit_test(test_reject_error),
	        cmocka_unit_test(test_reject_changed),
	        cmocka_unit_test(test_hold),
	        cmocka_unit_test(test_getter_wrong_type),
	        cmocka_unit_test(test_unaligned),
	        cmocka_unit_test(test_derive),
	        cmocka_unit_test(test_build_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
