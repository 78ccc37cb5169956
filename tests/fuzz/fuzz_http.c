/*
 * fuzz_http.c: libFuzzer harness for the request parser of the Prometheus
 * endpoint (client/ctl_http_parse.c), the only bytes wcache reads from the
 * network.
 *
 * The input is copied into a buffer of exactly its size, so that ASan sees
 * any read past it. Checks: the verdict is one of 200, 400, 404, 405; 200
 * only for a request line "GET /metrics[?...] HTTP/1.0|1.1"; the verdict
 * depends on the first line only (what follows it cannot change it); and
 * ctl_http_head_complete() agrees with a plain search for the empty line.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "fuzz_http: check failed at line %d: %s\n", __LINE__, \
				#cond);                                                  \
			abort();                                                         \
		}                                                                        \
	} while (0)

/* The empty line that ends a head, found the slow way. */
static bool
has_empty_line(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '\n')
			continue;
		if (i + 1 < n && s[i + 1] == '\n')
			return true;
		if (i + 2 < n && s[i + 1] == '\r' && s[i + 2] == '\n')
			return true;
	}
	return false;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size ? size : 1), *longer;
	const char *nl;
	int verdict;

	if (buf == NULL)
		return 0;
	memcpy(buf, data, size);
	CHECK(ctl_http_head_complete(buf, size) == has_empty_line(buf, size));
	verdict = ctl_http_classify(buf, size);
	CHECK(verdict == 200 || verdict == 400 || verdict == 404 || verdict == 405);
	nl = memchr(buf, '\n', size);
	if (verdict == 200) {
		size_t line = (size_t)(nl - buf);

		if (line > 0 && buf[line - 1] == '\r')
			line--;
		CHECK(line >= 21 && memcmp(buf, "GET /metrics", 12) == 0);
		CHECK(buf[12] == ' ' || buf[12] == '?');
		CHECK(memcmp(buf + line - 9, " HTTP/1.", 8) == 0);
	}
	/* Bytes after the first line do not change the verdict. */
	if (nl != NULL && (longer = malloc(size + 5)) != NULL) {
		memcpy(longer, buf, size);
		memcpy(longer + size, "X: y\n", 5);
		CHECK(ctl_http_classify(longer, size + 5) == verdict);
		free(longer);
	}
	free(buf);
	return 0;
}
