/*
 * ctl_http_parse.c: what `wcachectl metrics --http` makes of the bytes a
 * scraper sent (ctl_http.c does the I/O). Kept apart, with no I/O and no
 * allocation, so that tests/fuzz/fuzz_http.c can run it on anything: these
 * are the only bytes from the network that wcache parses.
 */
#include <stdbool.h>
#include <string.h>

#include "ctl/internal.h"

/* Whether buf holds a whole request head (internal.h). */
bool
ctl_http_head_complete(const char *buf, size_t len)
{
	/* The head ends with an empty line: CRLF CRLF, or bare LFs. */
	for (size_t i = 0; i + 1 < len; i++)
		if (buf[i] == '\n' && (buf[i + 1] == '\n' ||
			(buf[i + 1] == '\r' && i + 2 < len && buf[i + 2] == '\n')))
			return true;
	return false;
}

/* Is every byte of s[0..n) a visible ASCII character (a token or target)? */
static bool
visible(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
			return false;
	return n > 0;
}

/* Does s[0..n) start with the ASCII text prefix, in any case? */
static bool
starts_nocase(const char *s, size_t n, const char *prefix)
{
	size_t k = strlen(prefix);

	if (n < k)
		return false;
	for (size_t i = 0; i < k; i++) {
		char c = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] - 'A' + 'a') : s[i];

		if (c != prefix[i])
			return false;
	}
	return true;
}

/* Is target[0..n) /metrics, with or without a query string: in origin form
 * ("/metrics?x") or absolute form ("http://host:port/metrics", which a
 * server must accept, RFC 9112 3.2.2; the authority is not checked: the
 * socket decides who is asked)? */
static bool
is_metrics(const char *target, size_t n)
{
	size_t skip = starts_nocase(target, n, "http://") ? 7 :
		starts_nocase(target, n, "https://") ? 8 : 0;

	if (skip > 0) {
		/* The authority runs to the path, the query, or the end. */
		while (skip < n && target[skip] != '/' && target[skip] != '?')
			skip++;
		target += skip;
		n -= skip;
	}
	return n >= 8 && memcmp(target, "/metrics", 8) == 0 && (n == 8 || target[8] == '?');
}

/* The status a request head gets (internal.h). */
int
ctl_http_classify(const char *buf, size_t len, bool *head)
{
	const char *nl = memchr(buf, '\n', len), *sp1, *sp2, *target, *version;
	size_t line_len, method_len, target_len;

	if (nl == NULL)
		return 400;
	/* Request line: METHOD SP TARGET SP HTTP/1.x, then CRLF (or LF). */
	line_len = (size_t)(nl - buf);
	if (line_len > 0 && buf[line_len - 1] == '\r')
		line_len--;
	sp1 = memchr(buf, ' ', line_len);
	sp2 = sp1 != NULL ? memchr(sp1 + 1, ' ', line_len - (size_t)(sp1 + 1 - buf)) : NULL;
	if (sp1 == NULL || sp2 == NULL)
		return 400;
	method_len = (size_t)(sp1 - buf);
	target = sp1 + 1;
	target_len = (size_t)(sp2 - target);
	version = sp2 + 1;
	if (!visible(buf, method_len) || !visible(target, target_len) ||
		(size_t)(buf + line_len - version) != 8 || memcmp(version, "HTTP/1.", 7) != 0 ||
		(version[7] != '0' && version[7] != '1'))
		return 400;
	*head = method_len == 4 && memcmp(buf, "HEAD", 4) == 0;
	if (!*head && (method_len != 3 || memcmp(buf, "GET", 3) != 0))
		return 405;
	if (!is_metrics(target, target_len))
		return 404;
	return 200;
}
