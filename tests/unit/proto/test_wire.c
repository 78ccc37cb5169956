/*
 * test_wire.c: unit tests of proto/wire.c, the wcache client protocol's
 * message encoders.
 *
 * Round trips of the messages of attaching (ATTACH, RELEASE, ATTACH_OK,
 * CHANGED, RELEASE_OK, ERROR, and HOLD and HOLD_OK with their layout
 * errors), with the exact little-endian bytes on the wire checked, not just
 * encoder and decoder agreeing with each other; an ERROR's text cut to
 * fit; the argument checks and cap checks of the encoders; decoding at any
 * alignment. The status page flag of ATTACH_OK and the unsolicited CHANGED
 * message get the same treatment as the rest: the one flag bit accepted,
 * every other bit refused, file_count bounded by WIRE_MAX_FILES.
 *
 * Every rejection wire_decode() makes is tested in test_wire_decode.c, the
 * messages of derived artifacts in test_wire_derive.c; the helpers the
 * three share are wire_fixture.h's.
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

/* ORIGINS: the first file wanted (a u64, below 250), then a name (HOLD's
 * layout); ORIGINS_OK: generation, file_count, first, then exactly the
 * origins left from first, at most 100 (0 and none when file_count is 0).
 * Every other length, count and first refused, by the decoder and the
 * encoder, and no other getter reads them. */
static void
test_origins(void **state)
{
	static uint8_t buf[WIRE_MAX_MESSAGE];
	static uint8_t payload[WIRE_ORIGINS_FIXED + 101 * WIRE_ORIGIN_SIZE];
	static struct wire_origins_ok ok, got;
	struct wire_message m;
	uint64_t generation;
	const char *name = NULL;
	size_t name_len = 0, len;
	uint32_t first = 9;
	ssize_t n;

	(void)state;
	n = wire_put_origins(buf, sizeof(buf), 42, 0, "llama", 5);
	assert_int_equal(n, 16 + 8 + 5);
	assert_int_equal(buf[6], 7);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_origins(&m, &first, &name, &name_len), 0);
	assert_int_equal(first, 0);
	assert_int_equal(name_len, 5);
	assert_ptr_equal(name, buf + 24);
	assert_int_equal(wire_get_hold(&m, &generation, &name, &name_len), -EBADMSG);
	assert_int_equal(wire_put_origins(buf, sizeof(buf), 1, 250, "llama", 5), -EINVAL);
	assert_int_equal(wire_put_origins(buf, sizeof(buf), 1, 0, "", 0), -EINVAL);
	assert_int_equal(wire_put_origins(buf, 16 + 8 + 4, 1, 0, "llama", 5), -EMSGSIZE);
	memset(payload, 0, sizeof(payload));
	memcpy(payload + 8, "llama", 5);
	payload[0] = 249;
	expect_accept(buf, good(buf, WIRE_ORIGINS, payload, 13), &m);
	payload[0] = 250; /* no model has file 250 */
	expect_reject(buf, good(buf, WIRE_ORIGINS, payload, 13), -EBADMSG);
	payload[0] = 0;
	payload[7] = 1; /* 2^56 */
	expect_reject(buf, good(buf, WIRE_ORIGINS, payload, 13), -EBADMSG);
	payload[7] = 0;
	expect_reject(buf, good(buf, WIRE_ORIGINS, payload, 8), -EBADMSG);

	/* 250 files: pages from 0 (100), 100 (100), 200 (50). */
	ok.generation = 0x1122334455667788ull;
	ok.file_count = 250;
	for (uint32_t f = 0; f < 250; f += WIRE_ORIGINS_PER_REPLY) {
		ok.first = f;
		ok.n = wire_origins_in_reply(250, f);
		assert_int_equal(ok.n, f < 200 ? 100 : 50);
		for (size_t i = 0; i < ok.n; i++)
			ok.origins[i] = (struct wire_origin){ .dev = f + i, .ino = ~(uint64_t)i,
				.size = i << 40, .mtime_ns = -(int64_t)i,
				.ctime_ns = INT64_MIN + (int64_t)i };
		n = wire_put_origins_ok(buf, sizeof(buf), 42, &ok);
		assert_int_equal(n, (ssize_t)(16 + 16 + ok.n * 40));
		assert_int_equal(buf[6], 134);
		expect_accept(buf, (size_t)n, &m);
		memset(&got, 0xff, sizeof(got));
		assert_int_equal(wire_get_origins_ok(&m, &got), 0);
		assert_true(got.generation == ok.generation && got.file_count == 250 &&
			got.first == f && got.n == ok.n);
		assert_memory_equal(got.origins, ok.origins, ok.n * sizeof(ok.origins[0]));
		assert_int_equal(wire_get_hold_ok(&m, &generation), -EBADMSG);
		assert_int_equal(wire_put_origins_ok(buf, (size_t)n - 1, 42, &ok), -EMSGSIZE);
		ok.n--;
		assert_int_equal(wire_put_origins_ok(buf, sizeof(buf), 42, &ok), -EINVAL);
	}
	/* None: file_count 0, first 0, nothing after. */
	ok = (struct wire_origins_ok){ .generation = 3 };
	n = wire_put_origins_ok(buf, sizeof(buf), 42, &ok);
	assert_int_equal(n, 32);
	expect_accept(buf, (size_t)n, &m);
	assert_int_equal(wire_get_origins_ok(&m, &got), 0);
	assert_true(got.file_count == 0 && got.n == 0 && got.generation == 3);
	ok.first = 1;
	assert_int_equal(wire_put_origins_ok(buf, sizeof(buf), 42, &ok), -EINVAL);
	ok = (struct wire_origins_ok){ .file_count = 251, .n = 100 };
	assert_int_equal(wire_put_origins_ok(buf, sizeof(buf), 42, &ok), -EINVAL);
	ok = (struct wire_origins_ok){ .file_count = 2, .first = 2, .n = 0 };
	assert_int_equal(wire_put_origins_ok(buf, sizeof(buf), 42, &ok), -EINVAL);

	/* The decoder: each count, first and length that does not fit. */
	memset(payload, 0, sizeof(payload));
	payload[8] = 2; /* file_count 2, first 0: two origins */
	expect_accept(buf, good(buf, WIRE_ORIGINS_OK, payload, 16 + 80), &m);
	for (len = 0; len < 16 + 80 + 40; len += 8)
		if (len != 16 + 80)
			expect_reject(buf, good(buf, WIRE_ORIGINS_OK, payload, len), -EBADMSG);
	payload[12] = 2; /* first 2 of 2 */
	expect_reject(buf, good(buf, WIRE_ORIGINS_OK, payload, 16), -EBADMSG);
	payload[12] = 1; /* first 1 of 2: one */
	expect_accept(buf, good(buf, WIRE_ORIGINS_OK, payload, 16 + 40), &m);
	payload[8] = 0; /* file_count 0 with first 1 */
	expect_reject(buf, good(buf, WIRE_ORIGINS_OK, payload, 16), -EBADMSG);
	payload[12] = 0;
	expect_accept(buf, good(buf, WIRE_ORIGINS_OK, payload, 16), &m);
	expect_reject(buf, good(buf, WIRE_ORIGINS_OK, payload, 16 + 40), -EBADMSG);
	payload[8] = 251;
	expect_reject(buf, good(buf, WIRE_ORIGINS_OK, payload, 16 + 4000), -EBADMSG);
	payload[8] = 250; /* 250 files from 0: 100, not 101 */
	expect_accept(buf, good(buf, WIRE_ORIGINS_OK, payload, 16 + 4000), &m);
	expect_reject(buf, good(buf, WIRE_ORIGINS_OK, payload, 16 + 4040), -EBADMSG);
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
		cmocka_unit_test(test_hold),
		cmocka_unit_test(test_origins),
		cmocka_unit_test(test_unaligned),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
