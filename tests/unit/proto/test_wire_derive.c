/*
 * test_wire_derive.c: unit tests of proto/wire.c for the messages of
 * derived artifacts (proto/PROTOCOL.md, "Derived artifacts"): DERIVE and
 * the rules of its key, PUBLISH, ABANDON (a reason too long is cut, never
 * refused) and BUILD, each with its exact bytes, its round trip and its
 * layout errors refused (wire_fixture.h).
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
		cmocka_unit_test(test_derive),
		cmocka_unit_test(test_build_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
