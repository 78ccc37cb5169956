/*
 * test_log.c: daemon/log.c, one line per call whatever the message holds:
 * a hostile name's newline, terminal escapes (C0, C1 as UTF-8, a raw C1
 * byte), bidirectional overrides and invalid UTF-8 are escaped, UTF-8
 * text passes; a message too long for a line ends in "..." without
 * splitting an escape.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* What log_warnx("%s", msg) writes to stderr, in a buffer the caller frees. */
static char *
logged(const char *msg)
{
	char path[] = "/tmp/wctest-log-XXXXXX", *buf;
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);
	off_t len;

	assert_true(fd >= 0 && saved >= 0);
	unlink(path);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	log_warnx("%s", msg);
	assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	close(saved);
	len = lseek(fd, 0, SEEK_END);
	assert_true(len > 0);
	buf = calloc(1, (size_t)len + 1);
	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, (size_t)len, 0), len);
	close(fd);
	return buf;
}

static void
check(const char *msg, const char *want)
{
	char *got = logged(msg), *expect;

	assert_true(asprintf(&expect, "wcached: warning: %s\n", want) > 0);
	if (strcmp(got, expect) != 0)
		fail_msg("logged \"%s\", expected \"%s\"", got, expect);
	free(expect);
	free(got);
}

static void
test_hostile_text_stays_one_inert_line(void **state)
{
	(void)state;
	check("tensor \"a\nwcached: error: forged\"", "tensor \"a\\x0awcached: error: forged\"");
	check("\x1b]0;PWNED\x07\x1b[2J", "\\x1b]0;PWNED\\x07\\x1b[2J");
	check("x\xc2\x9b" "31m", "x\\u009b31m");
	check("raw \x9b" "2J", "raw \\x9b2J");
	check("a\xe2\x80\xae" "b", "a\\u202eb");
	check("caf\xc3\xa9 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xf0\x9f\x98\x80");
}

static void
test_a_long_line_is_cut_between_escapes(void **state)
{
	char msg[10000], *got;
	size_t len;

	(void)state;
	memset(msg, 0x1b, sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	got = logged(msg);
	len = strlen(got);
	assert_true(len > 100);
	assert_string_equal(got + len - 4, "...\n");
	/* Whole escapes only: "wcached: warning: " then "\x1b" repeated. */
	assert_int_equal((len - 4 - strlen("wcached: warning: ")) % 4, 0);
	assert_null(memchr(got, 0x1b, len));
	free(got);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hostile_text_stays_one_inert_line),
		cmocka_unit_test(test_a_long_line_is_cut_between_escapes),
	};

	unsetenv("JOURNAL_STREAM");
	log_init(LOG_LEVEL_INFO, "wcached");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
