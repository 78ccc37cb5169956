/*
 * wire_fixture.h: the helpers of the unit tests of proto/wire.c
 * (test_wire, test_wire_decode, test_wire_derive): little-endian readers
 * and writers for checking an encoder's output byte by byte, messages
 * built by hand (no encoder) so that the decoder meets bytes the encoders
 * would never produce, and the two outcomes of wire_decode(): refused with
 * a code and the output left alone, or accepted with the payload in place.
 */
#ifndef WC_WIRE_FIXTURE_H
#define WC_WIRE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

#define FILL 0xA5 /* sentinel for "the function did not write here" */

/* Little-endian field readers for checking encoder output byte by byte. */
uint32_t le32(const uint8_t *p);
uint64_t le64(const uint8_t *p);

/* Writes v at p, little-endian. */
void put32(uint8_t *p, uint32_t v);

/* Builds a raw message by hand (no encoder), so the decoder is tested
 * against bytes the encoders would never produce. Returns its length. */
size_t raw(uint8_t *buf, uint32_t magic, uint16_t version, uint16_t type, uint32_t length,
	uint32_t seq, const void *payload, size_t n);

/* A well-formed message of type with an n-byte payload. */
size_t good(uint8_t *buf, uint16_t type, const void *payload, size_t n);

/* Asserts wire_decode() refuses buf[0..len) with code and leaves out alone. */
void expect_reject(const uint8_t *buf, size_t len, int code);

/* Asserts wire_decode() accepts buf[0..len). */
void expect_accept(const uint8_t *buf, size_t len, struct wire_message *m);

#endif
