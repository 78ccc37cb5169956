/*
 * fuzz_notify.c: libFuzzer harness for the parsers of the service manager's
 * environment in daemon/notify.c: notify_parse_address() ($NOTIFY_SOCKET)
 * and listen_fds_parse() ($LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES). No
 * socket is opened and the environment is not touched.
 *
 * Input: a flags byte, then up to five NUL-separated strings: NOTIFY_SOCKET,
 * LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES and the name asked for. Flag bit k
 * (k = 1..3) set means LISTEN_PID, LISTEN_FDS or LISTEN_FDNAMES is unset
 * (NULL); a string missing from the input is empty. The process id is
 * FUZZ_SELF, so seeds say LISTEN_PID=4242.
 *
 * Properties checked, beyond "no crash, no out-of-bounds access":
 *   - notify_parse_address() accepts exactly "/..." shorter than sun_path
 *     and "@x..." whose name fits in sun_path after the leading NUL; the
 *     address it makes holds the value byte for byte and its length is the
 *     one sendmsg() needs (path and NUL, or exactly the abstract name);
 *     on refusal it leaves its outputs untouched and says NOTIFY_SOCKET;
 *   - listen_fds_parse() agrees with this file's own reading of the rules
 *     (a reimplementation with strtoull and strsep): the same verdict, the
 *     same fd, an untouched *fd when it returns 0 or fails, a message that
 *     names the variable at fault.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "listen.h"
#include "notify.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_SELF 4242

/* Checks notify_parse_address() on value. */
static void
check_address(const char *value)
{
	struct sockaddr_un addr, untouched;
	socklen_t len = 12345;
	size_t n = strlen(value);
	size_t off = offsetof(struct sockaddr_un, sun_path);
	int r;

	memset(&addr, 0x5a, sizeof(addr));
	untouched = addr;
	r = notify_parse_address(value, &addr, &len);
	if (value[0] == '/' && n < sizeof(addr.sun_path)) {
		CHECK(r == 0);
		CHECK(addr.sun_family == AF_UNIX);
		CHECK(len == off + n + 1);
		CHECK(memcmp(addr.sun_path, value, n + 1) == 0);
	} else if (value[0] == '@' && n >= 2 && n <= sizeof(addr.sun_path)) {
		CHECK(r == 0);
		CHECK(addr.sun_family == AF_UNIX);
		CHECK(len == off + n && len <= sizeof(addr));
		CHECK(addr.sun_path[0] == '\0');
		CHECK(memcmp(addr.sun_path + 1, value + 1, n - 1) == 0);
	} else {
		CHECK(r == -EINVAL);
		CHECK(len == 12345 && memcmp(&addr, &untouched, sizeof(addr)) == 0);
		CHECK(strncmp(error_get(), "NOTIFY_SOCKET=", 14) == 0);
	}
}

/* The oracle's number: all digits (at least one), value <= max. */
static int
oracle_number(const char *s, unsigned long long max, unsigned long long *out)
{
	unsigned long long v;
	char *end;

	if (s[0] < '0' || s[0] > '9' || s[strspn(s, "0123456789")] != '\0')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE || v > max)
		return -1;
	*out = v;
	return 0;
}

/* The oracle for listen_fds_parse(): the rules of notify.h, written again
 * another way. Returns what listen_fds_parse() must, with the fd in *fd. */
static int
oracle_listen(const char *pid_s, const char *fds_s, const char *names, const char *name,
	int *fd, const char **culprit)
{
	unsigned long long pid, count, i = 0;
	long long found = -1;
	char *copy, *rest, *entry;

	if (pid_s == NULL || fds_s == NULL)
		return 0;
	if (oracle_number(pid_s, INT_MAX, &pid) < 0) {
		*culprit = "LISTEN_PID=";
		return -EINVAL;
	}
	if (pid != FUZZ_SELF)
		return 0;
	if (oracle_number(fds_s, INT_MAX - 3, &count) < 0) {
		*culprit = "LISTEN_FDS=";
		return -EINVAL;
	}
	if (count == 0)
		return 0;
	if (names == NULL) {
		if (strcmp(name, "unknown") != 0)
			return 0;
		*fd = 3;
		return 1;
	}
	copy = strdup(names);
	CHECK(copy != NULL);
	rest = copy;
	while ((entry = strsep(&rest, ":")) != NULL) {
		if (found < 0 && strcmp(entry, name) == 0)
			found = (long long)i;
		i++;
	}
	free(copy);
	if (i != count) {
		*culprit = "LISTEN_FDNAMES=";
		return -EINVAL;
	}
	if (found < 0)
		return 0;
	*fd = 3 + (int)found;
	return 1;
}

/* Checks listen_fds_parse() against the oracle. */
static void
check_listen(const char *pid_s, const char *fds_s, const char *names, const char *name)
{
	const char *culprit = NULL;
	int fd = -77, want_fd = -77;
	int r = listen_fds_parse(pid_s, fds_s, names, name, FUZZ_SELF, &fd);
	int want = oracle_listen(pid_s, fds_s, names, name, &want_fd, &culprit);

	if (r != want || fd != want_fd) {
		fprintf(stderr, "fuzz_notify: listen_fds_parse says %d (fd %d), the oracle %d "
			"(fd %d): %s\n", r, fd, want, want_fd, error_get());
		abort();
	}
	if (r < 0)
		CHECK(strncmp(error_get(), culprit, strlen(culprit)) == 0);
	if (r == 1)
		CHECK(fd >= 3);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf, *p, *end, *field[5];

	if (size < 1)
		return 0;
	/* The strings after the flags byte, with a NUL after the last one. */
	buf = malloc(size);
	CHECK(buf != NULL);
	memcpy(buf, data + 1, size - 1);
	end = buf + size - 1;
	*end = '\0';
	p = buf;
	for (int i = 0; i < 5; i++) {
		field[i] = p;
		p += strlen(p); /* at a separator, or at end: then "" from here on */
		if (p < end)
			p++;
	}
	check_address(field[0]);
	check_listen(data[0] & 2 ? NULL : field[1], data[0] & 4 ? NULL : field[2],
		data[0] & 8 ? NULL : field[3], field[4]);
	free(buf);
	return 0;
}
