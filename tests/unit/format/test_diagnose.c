/*
 * test_diagnose.c: diagnose_format() names the formats a safetensors reader
 * is often given by mistake, by their magic bytes, and leaves everything
 * else (including a safetensors file whose first bytes look like a pickle)
 * to the safetensors reader.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "format/diagnose.h"
#include "lib/wcache.h"

/* Checks that file (len bytes) is diagnosed with a message holding want. */
static void
expect(const void *file, size_t len, const char *want)
{
	assert_int_equal(diagnose_format("x.bin", file, len), -EINVAL);
	if (strstr(wc_errmsg(), want) == NULL || strstr(wc_errmsg(), "x.bin") == NULL)
		fail_msg("message \"%s\" lacks \"%s\" or the file name", wc_errmsg(), want);
}

static void
test_pytorch_zip_and_legacy(void **state)
{
	uint8_t zip[64] = "PK\x03\x04";
	static const uint8_t legacy[] = { 0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9,
		0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e };
	static const char entry[] = "archive/data.pkl";

	(void)state;
	zip[26] = (uint8_t)strlen(entry);
	/* A zip entry's name has no NUL.
	 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
	memcpy(zip + 30, entry, strlen(entry));
	expect(zip, sizeof(zip), "PyTorch checkpoint (torch.save zip");
	expect(zip, sizeof(zip), DIAGNOSE_CONVERTER " x.bin");
	expect(legacy, sizeof(legacy), "legacy torch.save pickle");
	expect("\x80\x04\x95\x00\x00\x00\x00\x00\x00", 9, "Python pickle (protocol 4)");
}

static void
test_other_formats(void **state)
{
	uint8_t npz[64] = "PK\x03\x04", h5[600] = { 0 };
	static const uint8_t sig[] = { 0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n' };

	(void)state;
	npz[26] = 5;
	/* NOLINTNEXTLINE(bugprone-not-null-terminated-result): a zip entry's name */
	memcpy(npz + 30, "x.npy", 5);
	expect(npz, sizeof(npz), "NumPy .npz");
	npz[26] = 60; /* the entry name runs past the end: just a zip */
	expect(npz, sizeof(npz), "is a zip archive");
	expect("GGUF\x03\x00\x00\x00\x00\x00", 10, "GGUF");
	/* WEIG, either byte order: a directory's file or a shard (review rev113
	 * #10; the header length was "5759125831 exceeds the maximum"). */
	expect("GIEW\x01\x00\x00\x00\x00\x00", 10, "is a WEIG file, not a safetensors");
	expect("WEIG\x00\x00\x00\x01\x00\x00", 10, "is a WEIG file, not a safetensors");
	expect("\x93NUMPY\x01\x00v\x00", 10, "NumPy .npy");
	memcpy(h5 + 512, sig, sizeof(sig));
	expect(h5, sizeof(h5), "HDF5");
}

static void
test_leaves_safetensors_alone(void **state)
{
	/* A 640-byte header: its length starts 0x80 0x02, as a pickle does. */
	static const uint8_t st[] = { 0x80, 0x02, 0, 0, 0, 0, 0, 0, '{', '}' };

	(void)state;
	assert_int_equal(diagnose_format("x", st, sizeof(st)), 0);
	assert_int_equal(diagnose_format("x", (const uint8_t *)"", 0), 0);
	assert_int_equal(diagnose_format("x", (const uint8_t *)"PK", 2), 0);
}

/*
 * A header may start with JSON whitespace (upstream and our reader accept
 * it): a 640, 896, 1152 or 1408-byte header that does (its length 0x80 0x02
 * to 0x80 0x05, a pickle's start) is safetensors, and so is a header of
 * 67,324,752 bytes (its length "PK\3\4") after whitespace (review rev113 #9).
 */
static void
test_whitespace_before_the_header(void **state)
{
	uint8_t st[32] = { 0x80, 0x02, 0, 0, 0, 0, 0, 0, ' ', '\t', '\r', '\n', '{', '}' };
	static const uint8_t zip[] = { 'P', 'K', 3, 4, 0, 0, 0, 0, '\n', '{', '}' };

	(void)state;
	for (uint8_t v = 2; v <= 5; v++) {
		st[1] = v;
		assert_int_equal(diagnose_format("x", st, sizeof(st)), 0);
	}
	assert_int_equal(diagnose_format("x", zip, sizeof(zip)), 0);
	/* Whitespace and then no object: still the pickle. */
	st[1] = 0x02;
	st[12] = 'x';
	expect(st, sizeof(st), "Python pickle (protocol 2)");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pytorch_zip_and_legacy),
		cmocka_unit_test(test_other_formats),
		cmocka_unit_test(test_leaves_safetensors_alone),
		cmocka_unit_test(test_whitespace_before_the_header),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
