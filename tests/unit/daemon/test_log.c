/*
 * test_log.c: daemon/log.c, one line per call whatever the message holds:
 * a hostile name's newline, terminal escapes (C0, C1 as UTF-8, a raw C1
 * byte), bidirectional overrides and invalid UTF-8 are escaped, UTF-8
 * text passes; a message too long for a line ends in "..." without
 * splitting an escape; $JOURNAL_STREAM read only as systemd writes it.
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
#include <sys/stat.h>
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

/* $JOURNAL_STREAM as systemd writes it ("DEV:INO" in decimal) and as it
 * does not: each of those is refused, both numbers untouched. */
static void
test_journal_stream_parse(void **state)
{
	static const char *const bad[] = {
		"", "8", "8:", ":1", ":", "8:abc", "abc:1", "8::1", "8:1:2", "-1:1", "8:-1",
		"+8:1", "8:+1", " 8:1", "8: 1", "8:1 ", "8:1\n", "0x8:1",
		"18446744073709551616:1", "8:18446744073709551616",
		"99999999999999999999999:1",
	};
	uint64_t dev = 7, ino = 7;

	(void)state;
	assert_int_equal(log_journal_stream_parse("8:1", 3, &dev, &ino), 0);
	assert_true(dev == 8 && ino == 1);
	assert_int_equal(log_journal_stream_parse("18446744073709551615:0", 22, &dev, &ino), 0);
	assert_true(dev == UINT64_MAX && ino == 0);
	/* len bytes only, and a NUL is no digit. */
	assert_int_equal(log_journal_stream_parse("8:123", 4, &dev, &ino), 0);
	assert_true(dev == 8 && ino == 12);
	dev = ino = 7;
	assert_int_equal(log_journal_stream_parse("8:1\0002", 5, &dev, &ino), -EINVAL);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = log_journal_stream_parse(bad[i], strlen(bad[i]), &dev, &ino);

		if (rc != -EINVAL || dev != 7 || ino != 7)
			fail_msg("\"%s\": %d, %llu:%llu; expected -EINVAL, untouched", bad[i], rc,
				(unsigned long long)dev, (unsigned long long)ino);
	}
}

/* log_init() takes stderr for the journal only when $JOURNAL_STREAM spells
 * its device and inode as systemd does: sscanf(3)'s leniency (a sign,
 * blanks) does not make another spelling of the same numbers count. */
static void
test_journal_stream_spelled_otherwise(void **state)
{
	char path[] = "/tmp/wctest-log-XXXXXX", value[128], taken[128] = "";
	/* What comes before the device, and between it and the inode. */
	static const char *const spelling[][2] = { { " ", ":" }, { "+", ":" }, { "", ": " },
		{ "", ":+" }, { "", ":\t" }, { "\n", ":" } };
	int fd = mkstemp(path), saved = dup(STDERR_FILENO), exact;
	struct stat st;

	(void)state;
	assert_true(fd >= 0 && saved >= 0);
	unlink(path);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	assert_int_equal(fstat(STDERR_FILENO, &st), 0);
	snprintf(value, sizeof(value), "%llu:%llu", (unsigned long long)st.st_dev,
		(unsigned long long)st.st_ino);
	assert_int_equal(setenv("JOURNAL_STREAM", value, 1), 0);
	log_init(LOG_LEVEL_INFO, "wcached");
	exact = log_to_journal();
	for (size_t i = 0; i < sizeof(spelling) / sizeof(spelling[0]); i++) {
		snprintf(value, sizeof(value), "%s%llu%s%llu", spelling[i][0],
			(unsigned long long)st.st_dev, spelling[i][1],
			(unsigned long long)st.st_ino);
		assert_int_equal(setenv("JOURNAL_STREAM", value, 1), 0);
		log_init(LOG_LEVEL_INFO, "wcached");
		if (log_to_journal() != 0 && taken[0] == '\0')
			snprintf(taken, sizeof(taken), "%s", value);
	}
	unsetenv("JOURNAL_STREAM");
	log_init(LOG_LEVEL_INFO, "wcached");
	/* stderr back before any failure is said. */
	assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	close(saved);
	close(fd);
	assert_int_equal(exact, 1);
	if (taken[0] != '\0')
		fail_msg("JOURNAL_STREAM=\"%s\" taken for stderr's device and inode", taken);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hostile_text_stays_one_inert_line),
		cmocka_unit_test(test_a_long_line_is_cut_between_escapes),
		cmocka_unit_test(test_journal_stream_parse),
		cmocka_unit_test(test_journal_stream_spelled_otherwise),
	};

	unsetenv("JOURNAL_STREAM");
	log_init(LOG_LEVEL_INFO, "wcached");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
