/*
 * test_wire_decode.c: unit tests of proto/wire.c's decoder: every rejection
 * wire_decode() makes, each asserting its code and that the output is left
 * alone, on messages built by hand (wire_fixture.h).
 *
 * Sizes below a header and above WIRE_MAX_MESSAGE; magic, version and type,
 * and the order of those checks; a length field that disagrees with the
 * packet; the exact payload layout of ATTACH, RELEASE, ATTACH_OK (the one
 * flag bit, file_count bounded by WIRE_MAX_FILES), RELEASE_OK, ERROR and
 * CHANGED; and the getters, which refuse a message of another type or one
 * that lies about its payload and leave their outputs alone. Then what
 * wire_decode_why() says of a refusal: which check failed, and the header
 * (its seq) once the magic was right.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/wire.h"
#include "wire_fixture.h"

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

	/* A message's 4 bytes, a NUL inside, at the end, or none at all.
	 * NOLINTBEGIN(bugprone-not-null-terminated-result) */
	memcpy(payload + 4, "ab\0d", 4);
	len = good(buf, WIRE_ERROR, payload, 8);
	expect_reject(buf, len, -EBADMSG);
	memcpy(payload + 4, "abc\0", 4);
	len = good(buf, WIRE_ERROR, payload, 8);
	expect_reject(buf, len, -EBADMSG);
	memcpy(payload + 4, "abcd", 4);
	/* NOLINTEND(bugprone-not-null-terminated-result) */
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
		n = wire_put_attach_ok(buf, sizeof(buf), 1,
			&(struct wire_attach_ok){.file_count = 1});
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

/* Asserts wire_decode_why() refuses buf[0..len) with code and reason, and
 * reports the header's seq (has_header) or none. */
static void
expect_why(const uint8_t *buf, size_t len, int code, const char *reason, int has_header,
	uint32_t seq)
{
	struct wire_message m = { 0 };
	struct wire_refusal why;

	assert_int_equal(wire_decode_why(buf, len, &m, &why), code);
	assert_null(m.payload);
	assert_string_equal(why.reason, reason);
	assert_int_equal(why.has_header, has_header);
	if (has_header)
		assert_int_equal(why.h.seq, seq);
}

/* Which check refused a message, and the seq to echo, in the order the
 * checks run: before the magic nothing of the header is trusted. */
static void
test_refusal_reasons(void **state)
{
	uint8_t buf[64] = { 0 }, handle[8] = { 1 }, nul[3] = { 'a', 0, 'b' };
	uint8_t derive[16] = { 0 };
	struct wire_message m;
	struct wire_refusal why;
	size_t len;

	(void)state;
	expect_why(buf, 15, -EMSGSIZE, "shorter than the 16-byte header", 0, 0);
	len = raw(buf, 0x12345678, 1, WIRE_RELEASE, 8, 42, handle, 8);
	expect_why(buf, len, -EBADMSG, "not a wcache message (wrong magic)", 0, 0);
	len = raw(buf, WIRE_MAGIC, 2, WIRE_RELEASE, 8, 42, handle, 8);
	expect_why(buf, len, -EPROTO, "protocol version mismatch", 1, 42);
	assert_int_equal(wire_decode_why(buf, len, &m, &why), -EPROTO);
	assert_int_equal(why.h.version, 2);
	len = raw(buf, WIRE_MAGIC, 1, 77, 8, 42, handle, 8);
	expect_why(buf, len, -EBADMSG, "unknown message type", 1, 42);
	len = raw(buf, WIRE_MAGIC, 1, WIRE_RELEASE, 5, 42, handle, 8);
	expect_why(buf, len, -EBADMSG, "the length field is not the size of the payload", 1, 42);
	len = raw(buf, WIRE_MAGIC, 1, WIRE_RELEASE, 7, 42, handle, 7);
	expect_why(buf, len, -EBADMSG, "payload is not 8 bytes", 1, 42);
	len = raw(buf, WIRE_MAGIC, 1, WIRE_ATTACH, 3, 42, nul, 3);
	expect_why(buf, len, -EBADMSG, "model name holds a NUL byte", 1, 42);
	len = raw(buf, WIRE_MAGIC, 1, WIRE_CHANGED, 9, 42, "12345678x", 9);
	expect_why(buf, len, -EBADMSG, "CHANGED with a seq other than 0", 1, 42);
	put32(derive + 4, 65);
	len = raw(buf, WIRE_MAGIC, 1, WIRE_DERIVE, 16, 42, derive, 16);
	expect_why(buf, len, -EBADMSG, "key_len is not 1..64", 1, 42);
	put32(derive + 4, 2);
	derive[8] = 'k';
	derive[9] = '/'; /* not a key character */
	memset(derive + 10, 'n', 6);
	len = raw(buf, WIRE_MAGIC, 1, WIRE_DERIVE, 16, 42, derive, 16);
	expect_why(buf, len, -EBADMSG, "the key holds a byte other than letters, digits and ._+-",
		1, 42);
	/* Accepted: nothing to say. */
	len = good(buf, WIRE_RELEASE, handle, 8);
	assert_int_equal(wire_decode_why(buf, len, &m, &why), 0);
	assert_null(why.reason);
	assert_string_equal(wire_type_name(WIRE_HOLD), "HOLD");
	assert_null(wire_type_name(77));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reject_size),
		cmocka_unit_test(test_reject_header),
		cmocka_unit_test(test_reject_length_mismatch),
		cmocka_unit_test(test_reject_attach),
		cmocka_unit_test(test_reject_release),
		cmocka_unit_test(test_reject_attach_ok),
		cmocka_unit_test(test_reject_release_ok),
		cmocka_unit_test(test_reject_error),
		cmocka_unit_test(test_reject_changed),
		cmocka_unit_test(test_getter_wrong_type),
		cmocka_unit_test(test_refusal_reasons),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
