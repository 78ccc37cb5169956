/*
 * fuzz_http.c: libFuzzer harness for the request parser of the Prometheus
 * endpoint (client/ctl_http_parse.c), the only bytes wcache reads from the
 * network.
 *
 * The input is copied into a buffer of exactly its size, so that ASan sees
 * any read past it. Checks: the verdict is one of 200, 400, 404, 405; 200
 * only for a request line "GET|HEAD TARGET HTTP/1.0|1.1" whose TARGET is
 * /metrics[?...], or that after http(s)://AUTHORITY; HEAD said so; the verdict
 * depends on the first line only (what follows it cannot change it); and
 * ctl_http_head_complete() agrees with a plain search for the empty line.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* Is t[0..n) /metrics or /metrics?..., after "http://AUTHORITY" or
 * "https://AUTHORITY" (the scheme in any case) or nothing: checked
 * without the parser's code, by trying every place /metrics can start. */
static bool
metrics_target(const char *t, size_t n)
{
	for (size_t at = 0; at + 8 <= n; at++) {
		bool origin = at == 0, absolute = false;

		if (memcmp(t + at, "/metrics", 8) != 0 || (at + 8 < n && t[at + 8] != '?'))
			continue;
		for (size_t s = 7; s <= 8 && !origin; s++) {
			if (at < s || strncasecmp(t, s == 7 ? "http://" : "https://", s) != 0)
				continue;
			absolute = memchr(t + s, '/', at - s) == NULL &&
				memchr(t + s, '?', at - s) == NULL;
			if (absolute)
				break;
		}
		if (origin || absolute)
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
	bool head = false, head2 = false;

	if (buf == NULL)
		return 0;
	memcpy(buf, data, size);
	CHECK(ctl_http_head_complete(buf, size) == has_empty_line(buf, size));
	verdict = ctl_http_classify(buf, size, &head);
	CHECK(verdict == 200 || verdict == 400 || verdict == 404 || verdict == 405);
	nl = memchr(buf, '\n', size);
	if (verdict != 400)
		CHECK(head == (size >= 5 && memcmp(buf, "HEAD ", 5) == 0));
	if (verdict == 200) {
		size_t line = (size_t)(nl - buf), method = head ? 5 : 4;

		if (line > 0 && buf[line - 1] == '\r')
			line--;
		CHECK(head || (size >= 4 && memcmp(buf, "GET ", 4) == 0));
		CHECK(line >= method + 8 + 9 && memcmp(buf + line - 9, " HTTP/1.", 8) == 0);
		CHECK(metrics_target(buf + method, line - 9 - method));
	}
	/* Bytes after the first line do not change the verdict. */
	if (nl != NULL && (longer = malloc(size + 5)) != NULL) {
		memcpy(longer, buf, size);
		/* A header line after the request's bytes, no NUL.
		 * NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
		memcpy(longer + size, "X: y\n", 5);
		CHECK(ctl_http_classify(longer, size + 5, &head2) == verdict);
		CHECK(verdict == 400 || head2 == head);
		free(longer);
	}
	free(buf);
	return 0;
}
