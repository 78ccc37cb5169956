/*
 * fuzz_control.c: libFuzzer harness for the control socket's request lines:
 * control_split() (daemon/control.c) and ctl_parse_request()
 * (daemon/control_cmd.c), the two functions every byte a control client
 * sends goes through before a command runs. No socket, no event loop.
 *
 * The input is cut at '\n' into lines as the connection cuts it, each at
 * most CONTROL_LINE_MAX bytes, and each line goes into a heap buffer of
 * exactly len + 1 bytes (so ASan sees any write past the room the contract
 * gives). Properties checked, beyond "no crash, no out-of-bounds access":
 *   - control_split() returns -EINVAL with a message, or 0..max words that
 *     lie inside the line, in order, without overlap, NUL-terminated;
 *   - a line with a control character (other than tab) or that is not UTF-8
 *     (jansson's json_stringn() is the independent judge: overlong forms,
 *     surrogates and code points above U+10FFFF are invalid) is refused, and
 *     for that reason (the first bad byte's, when there are both); a valid
 *     line is never refused for its bytes;
 *   - the words are the ones an independent splitter (in this file, into
 *     new strings rather than in place) finds, and a line is refused for
 *     its syntax exactly when that splitter refuses it;
 *   - words quoted again the way wcachectl quotes them (double quotes when a
 *     word is empty or holds a space, tab, quote or backslash; \" and \\
 *     inside) split back into the same words (the daemon and its client
 *     agree on quoting);
 *   - ctl_parse_request() accepts exactly when the words name a command with
 *     an allowed number of arguments (this harness's own copy of the ranges
 *     control.h documents is the oracle, so a change to the table of
 *     proto/control_cmds.h that nobody meant shows here), returns the id of
 *     the command named, and refuses with one of its four documented messages,
 *     "bad request: ..." exactly when control_split() refuses.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "control.h"
#include "control_internal.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The commands and their argument ranges as control.h documents them. */
static const struct {
	const char *name;
	int min_args, max_args;
} oracle[] = {
	{ "status", 0, 0 }, { "load", 2, 3 }, { "unload", 1, 1 }, { "reload", 0, 1 },
	{ "pin", 1, 1 }, { "unpin", 1, 1 }, { "evict", 1, 1 }, { "metrics", 0, 0 },
	{ "drop", 1, 2 }, { "help", 0, 0 },
};

/* A copy of len bytes in a buffer of exactly len + 1 bytes. */
static char *
copy_line(const uint8_t *p, size_t len)
{
	char *s = malloc(len + 1);

	CHECK(s != NULL);
	memcpy(s, p, len);
	s[len] = (char)0xa5; /* control_split writes the NUL itself */
	return s;
}

/* Whether the bytes hold a control character other than tab. */
static int
has_control(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f)
			return 1;
	return 0;
}

/* Whether the bytes are UTF-8, by jansson's rules (no NUL here: callers
 * check control characters first). */
static int
is_utf8(const uint8_t *p, size_t len)
{
	json_t *s = json_stringn((const char *)p, len);

	json_decref(s);
	return s != NULL;
}

/* Quotes words as wcachectl does and joins them with single spaces into a
 * new buffer with one byte of room; *len is the length. */
static char *
requote(char **words, int n, size_t *len)
{
	size_t cap = 1, k = 0;
	char *out;

	for (int i = 0; i < n; i++)
		cap += 3 + 2 * strlen(words[i]);
	out = malloc(cap);
	CHECK(out != NULL);
	for (int i = 0; i < n; i++) {
		const char *w = words[i];
		int quote = w[0] == '\0' || strpbrk(w, " \t\"\\") != NULL;

		if (i > 0)
			out[k++] = ' ';
		if (quote)
			out[k++] = '"';
		for (; *w != '\0'; w++) {
			if (quote && (*w == '"' || *w == '\\'))
				out[k++] = '\\';
			out[k++] = *w;
		}
		if (quote)
			out[k++] = '"';
	}
	CHECK(k < cap);
	*len = k;
	return out;
}

/*
 * The oracle splitter: the quoting rules of control.h, read again into new
 * strings instead of in place. Returns the number of words (stored as
 * malloc'd strings in out, max entries) or -1 for a line control_split()
 * must refuse for its syntax. The bytes themselves are checked elsewhere.
 */
static int
oracle_split(const char *s, size_t len, int max, char **out)
{
	size_t i = 0;
	int n = 0;

	for (;;) {
		char *w;
		size_t k = 0;

		while (i < len && (s[i] == ' ' || s[i] == '\t'))
			i++;
		if (i == len)
			return n;
		if (n == max)
			goto fail;
		w = out[n++] = malloc(len + 1);
		CHECK(w != NULL);
		if (s[i] == '"') {
			for (i++; i < len && s[i] != '"'; i++) {
				if (s[i] == '\\') {
					if (i + 1 == len || (s[i + 1] != '"' && s[i + 1] != '\\'))
						goto fail;
					i++;
				}
				w[k++] = s[i];
			}
			if (i == len)
				goto fail; /* unterminated */
			i++;
			if (i < len && s[i] != ' ' && s[i] != '\t')
				goto fail;
		} else {
			for (; i < len && s[i] != ' ' && s[i] != '\t'; i++) {
				if (s[i] == '"' || s[i] == '\\')
					goto fail;
				w[k++] = s[i];
			}
		}
		w[k] = '\0';
	}
fail:
	while (n > 0)
		free(out[--n]);
	return -1;
}

/* Checks control_split() on one line with room for max words; returns its
 * result, with the words in words (which has max entries). */
static int
check_split(const uint8_t *p, size_t len, int max, char *line, char **words)
{
	char err[160], *want[CONTROL_MAX_WORDS];
	int n, m, bytes_bad;

	memset(err, 0x5a, sizeof(err));
	n = control_split(line, len, words, max, err, sizeof(err));
	if (n < 0) {
		CHECK(n == -EINVAL);
		CHECK(memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0');
		/* The first bad byte decides when there are both kinds. */
		bytes_bad = strncmp(err, "control character", 17) == 0 ||
			strncmp(err, "not UTF-8", 9) == 0;
		if (has_control(p, len) && is_utf8(p, len))
			CHECK(strncmp(err, "control character", 17) == 0);
		else if (!has_control(p, len) && !is_utf8(p, len))
			CHECK(strncmp(err, "not UTF-8", 9) == 0);
		else
			CHECK(bytes_bad == (has_control(p, len) || !is_utf8(p, len)));
		if (!bytes_bad)
			CHECK(oracle_split((const char *)p, len, max, want) < 0);
		return n;
	}
	CHECK(!has_control(p, len) && is_utf8(p, len));
	CHECK(n <= max);
	m = oracle_split((const char *)p, len, max, want);
	if (m != n) {
		fprintf(stderr, "fuzz_control: control_split says %d words, the oracle %d\n", n, m);
		abort();
	}
	for (int i = 0; i < n; i++) {
		if (strcmp(words[i], want[i]) != 0) {
			fprintf(stderr, "fuzz_control: word %d is \"%s\", the oracle says \"%s\"\n",
				i, words[i], want[i]);
			abort();
		}
		free(want[i]);
	}
	CHECK(line[len] == '\0');
	for (int i = 0; i < n; i++) {
		size_t wl;

		CHECK(words[i] >= line && words[i] <= line + len);
		wl = strlen(words[i]);
		CHECK(words[i] + wl <= line + len);
		if (i > 0)
			CHECK(words[i] > words[i - 1] + strlen(words[i - 1]));
	}
	return n;
}

/* Splits the re-quoted words and compares them with the first split. */
static void
check_requote(char **words, int n)
{
	char *again[CONTROL_MAX_WORDS], err[160];
	size_t len;
	char *q = requote(words, n, &len);
	int m = control_split(q, len, again, CONTROL_MAX_WORDS, err, sizeof(err));

	if (m != n) {
		fprintf(stderr, "fuzz_control: re-quoted line \"%s\" splits into %d words, not %d "
			"(%s)\n", q, m, n, m < 0 ? err : "");
		abort();
	}
	for (int i = 0; i < n; i++)
		CHECK(strcmp(words[i], again[i]) == 0);
	free(q);
}

/* Checks ctl_parse_request() on one line against the split and the
 * oracle table. */
static void
check_request(const uint8_t *p, size_t len)
{
	char *line = copy_line(p, len), *split_line;
	char *words[CONTROL_MAX_WORDS], *split_words[CONTROL_MAX_WORDS];
	enum control_cmd_id cmd = CONTROL_CMD_COUNT; /* untouched */
	char err[CTL_REQUEST_ERROR_MAX];
	size_t split_len = len > 0 && p[len - 1] == '\r' ? len - 1 : len;
	int n, s;

	/* The split the parser does, on its own copy, for comparison. */
	split_line = copy_line(p, split_len);
	s = control_split(split_line, split_len, split_words, CONTROL_MAX_WORDS, err,
		sizeof(err));

	memset(err, 0x5a, sizeof(err));
	n = ctl_parse_request(line, len, words, &cmd, err, sizeof(err));
	if (s < 0) {
		CHECK(n == -EINVAL && strncmp(err, "bad request: ", 13) == 0);
	} else if (s == 0) {
		CHECK(n == -EINVAL && strncmp(err, "empty request", 13) == 0);
	} else {
		size_t i = 0;

		while (i < sizeof(oracle) / sizeof(oracle[0]) &&
			strcmp(oracle[i].name, split_words[0]) != 0)
			i++;
		if (i == sizeof(oracle) / sizeof(oracle[0])) {
			CHECK(n == -EINVAL && strncmp(err, "unknown command ", 16) == 0);
		} else if (s - 1 < oracle[i].min_args || s - 1 > oracle[i].max_args) {
			CHECK(n == -EINVAL &&
				strncmp(err, oracle[i].name, strlen(oracle[i].name)) == 0 &&
				strncmp(err + strlen(oracle[i].name), ": usage: ", 9) == 0);
		} else {
			CHECK(n == s && cmd < CONTROL_CMD_COUNT &&
				strcmp(control_cmds[cmd].name, split_words[0]) == 0);
			for (int k = 0; k < n; k++)
				CHECK(strcmp(words[k], split_words[k]) == 0);
		}
	}
	if (n < 0) {
		CHECK(cmd == CONTROL_CMD_COUNT);
		CHECK(memchr(err, '\0', sizeof(err)) != NULL);
	}
	free(split_line);
	free(line);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;

	while (p < end) {
		const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);
		/* Fewer words of room than the daemon gives, sometimes: the
		 * "more than max words" path with small numbers. */
		int max = len > 0 && p[0] == ' ' ? 1 + (int)(len % CONTROL_MAX_WORDS) :
						    CONTROL_MAX_WORDS;

		if (len <= CONTROL_LINE_MAX) {
			char *line = copy_line(p, len);
			char **words = calloc((size_t)max, sizeof(*words));
			int n;

			CHECK(words != NULL);
			n = check_split(p, len, max, line, words);
			if (n >= 0)
				check_requote(words, n);
			free(words);
			free(line);
			check_request(p, len);
		}
		p += len + (nl != NULL);
	}
	return 0;
}
