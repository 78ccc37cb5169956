/*
 * wire_fixture.c: the helpers of the unit tests of proto/wire.c (see
 * wire_fixture.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/wire.h"
#include "wire_fixture.h"

/* Little-endian field readers for checking encoder output byte by byte. */
uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t
le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

void
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
size_t
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
size_t
good(uint8_t *buf, uint16_t type, const void *payload, size_t n)
{
	return raw(buf, WIRE_MAGIC, WIRE_VERSION, type, (uint32_t)n, 7, payload, n);
}

/* Asserts wire_decode() refuses buf[0..len) with code and leaves out alone. */
void
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
void
expect_accept(const uint8_t *buf, size_t len, struct wire_message *m)
{
	assert_int_equal(wire_decode(buf, len, m), 0);
	assert_ptr_equal(m->payload, buf + 16);
	assert_int_equal(m->h.length, len - 16);
}
