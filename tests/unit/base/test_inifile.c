/*
 * test_inifile.c: client/base/inifile.c, the INI reader of wcached and
 * wcachectl, on what the path names: a regular file (directly and through a
 * symlink) is read; a FIFO, with or without a writer, a directory, a
 * character device (/dev/null, /dev/zero) and a socket are refused at once
 * with one line that names the path and what it is, and leave no
 * descriptor open. The syntax is test_config.c's (daemon/config.c reads
 * its files with this reader).
 *
 * Each read runs in a child process that the test waits for with a
 * deadline: before the type check, a FIFO without a writer blocked the
 * open for ever, and the test must fail then, not hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/inifile.h"
#include "testutil.h"

/* How long a read may take: a refusal is at once, a hang is for ever. */
#define READ_DEADLINE_MS 5000

/* What a read gave: its code, its message, what the callbacks saw, and
 * whether the child's descriptors were as many after the read as before. */
struct result {
	int code;
	int fds_leaked;
	char message[512];
	char seen[512];
};

static int
on_section(struct inifile *f, const char *name, void *arg)
{
	struct result *r = arg;
	size_t len = strlen(r->seen);

	(void)f;
	snprintf(r->seen + len, sizeof(r->seen) - len, "[%s]", name);
	return 0;
}

static int
on_key(struct inifile *f, const char *key, const char *value, void *arg)
{
	struct result *r = arg;
	size_t len = strlen(r->seen);

	snprintf(r->seen + len, sizeof(r->seen) - len, "%d:%s=%s;", inifile_line(f), key,
		value);
	return 0;
}

static const struct inifile_handler handler = { on_section, on_key, NULL };

/*
 * inifile_read(path) in a child process, its result in *out; fails the
 * test when the read has not returned within READ_DEADLINE_MS (the child is
 * killed).
 */
static void
read_within_deadline(const char *path, struct result *out)
{
	int p[2], status;
	struct pollfd pfd;
	ssize_t n;
	pid_t pid;

	memset(out, 0, sizeof(*out));
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct result r = { 0 };
		int before;

		close(p[0]);
		before = tu_count_fds();
		r.code = inifile_read(path, &handler, &r);
		r.fds_leaked = tu_count_fds() != before;
		snprintf(r.message, sizeof(r.message), "%s", r.code < 0 ? error_get() : "");
		_exit(write(p[1], &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 1);
	}
	close(p[1]);
	pfd = (struct pollfd){ .fd = p[0], .events = POLLIN };
	if (poll(&pfd, 1, READ_DEADLINE_MS) != 1) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		close(p[0]);
		fail_msg("inifile_read(\"%s\") has not returned after %d ms", path,
			READ_DEADLINE_MS);
	}
	n = read(p[0], out, sizeof(*out));
	close(p[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(n, (ssize_t)sizeof(*out));
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Reads path and checks that it is refused with code and the one line
 * "PATH: not a regular file (KIND)". */
static void
check_refused(const char *path, int code, const char *kind)
{
	struct result r;
	char want[600];

	read_within_deadline(path, &r);
	snprintf(want, sizeof(want), "%s: not a regular file (%s)", path, kind);
	if (r.code != code || strcmp(r.message, want) != 0)
		fail_msg("%s: got %d \"%s\", expected %d \"%s\"", path, r.code, r.message, code,
			want);
	assert_string_equal(r.seen, ""); /* nothing was read */
	assert_false(r.fds_leaked);
}

/* A regular file is read, and through a symlink too. */
static void
test_regular_file_is_read(void **state)
{
	struct tu_dir *f = *state;
	static const char text[] = "; comment\n[wcached]\nsocket = /s.sock\n\n[model a]\n"
				   "path: /m\n";
	char *path = tu_write(f->dir, "wcached.conf", text, sizeof(text) - 1), *link;
	struct result r;

	read_within_deadline(path, &r);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.seen, "[wcached]3:socket=/s.sock;[model a]6:path=/m;");
	assert_false(r.fds_leaked);

	assert_true(asprintf(&link, "%s/link.conf", f->dir) > 0);
	assert_int_equal(symlink(path, link), 0);
	read_within_deadline(link, &r);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.seen, "[wcached]3:socket=/s.sock;[model a]6:path=/m;");
	free(link);
	free(path);
}

/* A FIFO nobody writes is refused at once: before, the open waited for a
 * writer for ever (wcached --check, wcachectl, a reload's read). */
static void
test_fifo_without_writer(void **state)
{
	struct tu_dir *f = *state;
	char *fifo;

	assert_true(asprintf(&fifo, "%s/fifo.conf", f->dir) > 0);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	check_refused(fifo, -EINVAL, "a FIFO");
	free(fifo);
}

/* A FIFO with a writer (what `--config <(...)` names through /dev/fd/N)
 * is refused too: a reload could not read it again. Its bytes are left
 * to whoever reads it next. */
static void
test_fifo_with_writer(void **state)
{
	struct tu_dir *f = *state;
	static const char text[] = "[wcached]\nsocket = /s.sock\n";
	char *fifo, left[64];
	int rd, wr;

	assert_true(asprintf(&fifo, "%s/fifo.conf", f->dir) > 0);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_true((rd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) >= 0);
	assert_true((wr = open(fifo, O_WRONLY | O_CLOEXEC)) >= 0);
	assert_int_equal(write(wr, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
	check_refused(fifo, -EINVAL, "a FIFO");
	assert_int_equal(read(rd, left, sizeof(left)), (ssize_t)sizeof(text) - 1);
	close(wr);
	close(rd);
	free(fifo);
}

/* A directory: before, it opened and its read failed ("read error: Is a
 * directory"). */
static void
test_directory(void **state)
{
	struct tu_dir *f = *state;

	check_refused(f->dir, -EISDIR, "a directory");
}

/* Character devices: /dev/null read as an empty config (0, "no models"),
 * /dev/zero was read up to its first NUL byte. */
static void
test_character_devices(void **state)
{
	(void)state;
	check_refused("/dev/null", -EINVAL, "a character device");
	check_refused("/dev/zero", -EINVAL, "a character device");
}

/* A socket cannot be opened (ENXIO, "No such device or address"): the
 * message says what it is instead. */
static void
test_socket(void **state)
{
	struct tu_dir *f = *state;
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int s;

	assert_true((size_t)snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/s.sock", f->dir) <
		sizeof(sun.sun_path));
	assert_true((s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	assert_int_equal(bind(s, (struct sockaddr *)&sun, sizeof(sun)), 0);
	check_refused(sun.sun_path, -EINVAL, "a socket");
	close(s);
}

/* What is not there, and the empty path, keep their messages. */
static void
test_missing_and_empty(void **state)
{
	struct tu_dir *f = *state;
	struct result r;
	char *missing, want[600];

	assert_true(asprintf(&missing, "%s/missing.conf", f->dir) > 0);
	read_within_deadline(missing, &r);
	assert_int_equal(r.code, -ENOENT);
	snprintf(want, sizeof(want), "%s: No such file or directory", missing);
	assert_string_equal(r.message, want);
	free(missing);

	read_within_deadline("", &r);
	assert_int_equal(r.code, -ENOENT);
	assert_string_equal(r.message, "\"\": an empty path names no file");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_regular_file_is_read, tu_dir_setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_fifo_without_writer, tu_dir_setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_fifo_with_writer, tu_dir_setup,
			tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_directory, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test(test_character_devices),
		cmocka_unit_test_setup_teardown(test_socket, tu_dir_setup, tu_dir_teardown),
		cmocka_unit_test_setup_teardown(test_missing_and_empty, tu_dir_setup,
			tu_dir_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
