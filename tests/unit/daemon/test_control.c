/*
 * test_control.c: unit tests of daemon/control.c, daemon/control_cmd.c and
 * daemon/metrics.c.
 *
 * The request-line splitter, the command table of proto/control_cmds.h as
 * the dispatcher reads it (every command has a handler, its word counts and
 * usage are the ones requests are checked against) and the exposition's
 * label escaping are tested as functions. The socket is tested for real: control_listen_path() in a
 * temporary directory, and control_start() on a libuv loop with an empty
 * registry, driven by a non-blocking client socket in the same thread. The
 * loop runs one event at a time (UV_RUN_ONCE) until the reply line is there,
 * bounded by a timer deadline, so nothing sleeps. The "reload" hook of the
 * control context is a fake that completes at once, fails, or keeps its
 * done callback for the test to call later: after the client has gone, or
 * after control_stop(), which is where lifetimes go wrong (ASan watches).
 * Kept requests also fill a uid's places: clients that hang up while theirs
 * is in flight must give their place back, and one place always stays for
 * status. calloc is wrapped (--wrap=calloc) to refuse a connection its
 * memory: every connection must still be taken, or the socket goes dead.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "control.h"
#include "control_internal.h"
#include "base/error.h"
#include "metrics.h"
#include "registry.h"
#include "testutil.h"

#define DEADLINE_MS 10000
#define KEPT_MAX 64

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

/* While set, calloc fails for a control connection (struct ctl_conn). */
static bool fail_conn_calloc;

/* calloc, failing for a control connection while fail_conn_calloc is set. */
void *
__wrap_calloc(size_t n, size_t size)
{
	if (fail_conn_calloc && n == 1 && size == sizeof(struct ctl_conn)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_calloc(n, size);
}

int __real_getsockopt(int fd, int level, int name, void *value, socklen_t *len);
int __wrap_getsockopt(int fd, int level, int name, void *value, socklen_t *len);

/* The option __wrap_getsockopt fails once, with ENOMEM; 0: none. */
static int fail_sockopt;

/* While not (uid_t)-1, the uid SO_PEERCRED says every peer has. */
static uid_t peer_uid = (uid_t)-1;

/* getsockopt, failing once for the option fail_sockopt; SO_PEERCRED with
 * peer_uid's uid. */
int
__wrap_getsockopt(int fd, int level, int name, void *value, socklen_t *len)
{
	int r;

	if (fail_sockopt != 0 && level == SOL_SOCKET && name == fail_sockopt) {
		fail_sockopt = 0;
		errno = ENOMEM;
		return -1;
	}
	r = __real_getsockopt(fd, level, name, value, len);
	if (r == 0 && level == SOL_SOCKET && name == SO_PEERCRED && peer_uid != (uid_t)-1)
		((struct ucred *)value)->uid = peer_uid;
	return r;
}

/* ---- control_split --------------------------------------------------------- */

/* Splits text (copied, so the test's literal stays intact) and checks the
 * words; expect NULL-terminated. */
static void
check_split(const char *text, const char *const *expect)
{
	char line[256], err[128], *words[CONTROL_MAX_WORDS];
	size_t len = strlen(text);
	int n, want = 0;

	memcpy(line, text, len + 1);
	n = control_split(line, len, words, CONTROL_MAX_WORDS, err, sizeof(err));
	while (expect[want] != NULL)
		want++;
	if (n != want) {
		fail_msg("\"%s\": %d words, want %d (%s)", text, n, want, n < 0 ? err : "");
		return; /* not reached (fail_msg ends the test); the analyzer does
			   not know that, and would read expect past its end */
	}
	for (int i = 0; i < n; i++)
		assert_string_equal(words[i], expect[i]);
}

static void
split_words(void **state)
{
	check_split("status", (const char *const[]){ "status", NULL });
	check_split("  load\tm  /a/b.safetensors  pin=all ",
		(const char *const[]){ "load", "m", "/a/b.safetensors", "pin=all", NULL });
	check_split("", (const char *const[]){ NULL });
	check_split(" \t ", (const char *const[]){ NULL });
	check_split("load m \"/a b/c\"",
		(const char *const[]){ "load", "m", "/a b/c", NULL });
	check_split("load m \"/q\\\"uote\\\\back\"",
		(const char *const[]){ "load", "m", "/q\"uote\\back", NULL });
	check_split("x \"\" y", (const char *const[]){ "x", "", "y", NULL });
	/* A quoted word that starts with an escaped quote keeps it (found by
	 * fuzz_control: the leading '"' was dropped, naming another model). */
	check_split("pin \"\\\"llama\"", (const char *const[]){ "pin", "\"llama", NULL });
	check_split("load m \"/caf\xc3\xa9 \xf0\x9f\x98\x80\"",
		(const char *const[]){ "load", "m", "/caf\xc3\xa9 \xf0\x9f\x98\x80", NULL });
}

/* Checks that text (len bytes, may hold NUL) is refused with reason. */
static void
check_refused(const char *text, size_t len, const char *reason)
{
	char line[256], err[128], *words[CONTROL_MAX_WORDS];

	memcpy(line, text, len);
	assert_int_equal(control_split(line, len, words, CONTROL_MAX_WORDS, err, sizeof(err)),
		-EINVAL);
	if (strstr(err, reason) == NULL)
		fail_msg("refusing \"%.*s\": \"%s\" does not say \"%s\"", (int)len, text, err,
			reason);
}

static void
split_errors(void **state)
{
	check_refused("sta\0tus", 7, "control character 0x00 at byte 3");
	check_refused("status\r", 7, "control character 0x0d");
	check_refused("a\x1b[2J", 5, "control character 0x1b");
	check_refused("a\x7f", 2, "control character 0x7f");
	check_refused("\xff", 1, "not UTF-8 text (byte 0)");
	check_refused("ab\xc0\xaf", 4, "not UTF-8 text (byte 2)");       /* overlong '/' */
	check_refused("\xe0\x80\xaf", 3, "not UTF-8");                   /* overlong */
	check_refused("\xed\xa0\x80", 3, "not UTF-8");                   /* surrogate */
	check_refused("\xf4\x90\x80\x80", 4, "not UTF-8");               /* > U+10FFFF */
	check_refused("x \xe2\x82", 4, "not UTF-8 text (byte 2)");       /* truncated */
	check_refused("load m \"/a", 10, "unterminated quote at byte 7");
	check_refused("load m \"/a\\x\"", 13, "bad escape at byte 10");
	check_refused("load m \"/a\"b", 12, "no space after the quoted word");
	check_refused("load m /a\"b", 11, "'\"' inside a word at byte 9");
	check_refused("load m /a\\b", 11, "'\\' inside a word");
	check_refused("a b c d e f g h i", 17, "more than 8 words");
}

/* ---- the command table ----------------------------------------------------- */

/* Every command of proto/control_cmds.h has a handler and a well-formed
 * entry: a name that finds it again, a word range a request can hold, and
 * a usage and summary that help writes without escapes and that fit the
 * dispatcher's buffers. */
static void
every_command_has_a_handler(void **state)
{
	char usage[128], err[CTL_REQUEST_ERROR_MAX];

	for (int id = 0; id < CONTROL_CMD_COUNT; id++) {
		const struct control_cmd *cmd = &control_cmds[id];
		int n;

		assert_non_null(cmd->name);
		if (ctl_command_handler((enum control_cmd_id)id) == NULL)
			fail_msg("command \"%s\" has no handler in daemon/control_cmd.c",
				cmd->name);
		assert_int_equal(control_cmd_find(cmd->name), id);
		assert_true(cmd->name[0] != '\0' &&
			strspn(cmd->name, "abcdefghijklmnopqrstuvwxyz") == strlen(cmd->name));
		assert_true(0 <= cmd->min_args && cmd->min_args <= cmd->max_args);
		assert_true(cmd->max_args < CONTROL_MAX_WORDS);
		assert_non_null(cmd->args);
		assert_non_null(cmd->summary);
		assert_true(cmd->summary[0] != '\0');
		n = control_cmd_usage(cmd, usage, sizeof(usage));
		assert_true(n > 0 && (size_t)n < sizeof(usage));
		assert_int_equal(strncmp(usage, cmd->name, strlen(cmd->name)), 0);
		assert_true(snprintf(err, sizeof(err), "%s: usage: %s", cmd->name, usage) <
			(int)sizeof(err));
		assert_null(strpbrk(usage, "\"\\"));
		assert_null(strpbrk(cmd->summary, "\"\\"));
	}
	assert_null(ctl_command_handler(CONTROL_CMD_COUNT));
	assert_int_equal(control_cmd_find("STATUS"), -ENOENT);
	assert_int_equal(control_cmd_find(""), -ENOENT);
}

/* Parses a request of name and nargs words "w"; returns ctl_parse_request()'s
 * result, its command in *id and its error in err. */
static int
parse_with_args(const char *name, int nargs, enum control_cmd_id *id, char *err, size_t errlen)
{
	char line[256], *words[CONTROL_MAX_WORDS];
	int len = snprintf(line, sizeof(line), "%s", name);

	for (int i = 0; i < nargs; i++)
		len += snprintf(line + len, sizeof(line) - (size_t)len, " w");
	return ctl_parse_request(line, (size_t)len, words, id, err, errlen);
}

/* Requests are checked against the table: each command's own word range is
 * accepted and names it; one word fewer or more is refused with its usage. */
static void
requests_follow_the_table(void **state)
{
	char usage[128], want[CTL_REQUEST_ERROR_MAX], err[CTL_REQUEST_ERROR_MAX];

	for (int id = 0; id < CONTROL_CMD_COUNT; id++) {
		const struct control_cmd *cmd = &control_cmds[id];
		enum control_cmd_id got;

		for (int n = cmd->min_args; n <= cmd->max_args; n++) {
			got = CONTROL_CMD_COUNT;
			assert_int_equal(parse_with_args(cmd->name, n, &got, err, sizeof(err)),
				n + 1);
			assert_int_equal(got, id);
		}
		control_cmd_usage(cmd, usage, sizeof(usage));
		snprintf(want, sizeof(want), "%s: usage: %s", cmd->name, usage);
		got = CONTROL_CMD_COUNT;
		if (cmd->min_args > 0) {
			assert_int_equal(parse_with_args(cmd->name, cmd->min_args - 1, &got, err,
				sizeof(err)), -EINVAL);
			assert_string_equal(err, want);
		}
		if (cmd->max_args + 2 <= CONTROL_MAX_WORDS) {
			assert_int_equal(parse_with_args(cmd->name, cmd->max_args + 1, &got, err,
				sizeof(err)), -EINVAL);
			assert_string_equal(err, want);
		}
		assert_int_equal(got, CONTROL_CMD_COUNT); /* untouched on failure */
	}
}

/* ---- metrics ------------------------------------------------------------- */

static char *
label(const char *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	metrics_label_value(f, s);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void
label_escaping(void **state)
{
	char *s;

	s = label("/a\\b\"c\nd e");
	assert_string_equal(s, "/a\\\\b\\\"c\\nd e");
	free(s);
	s = label("");
	assert_string_equal(s, "");
	free(s);
}

/* ---- the socket ------------------------------------------------------------ */

struct fixture {
	char *dir;
	char path[200];
	uv_loop_t loop;
	uv_timer_t deadline;
	int timed_out;
	struct registry reg;
	struct control_context ctx;
	struct control *ctl;
	/* The fake reload hook. */
	int reload_mode;   /* 0: complete at once, 1: fail, 2: keep done for later */
	int reload_calls;
	registry_done_fn kept_done;
	void *kept_arg;
	registry_done_fn kept_dones[KEPT_MAX]; /* every kept one, by call */
	void *kept_args[KEPT_MAX];
	int fds_before;
};

static int
fake_reload(void *arg, registry_done_fn done, void *done_arg)
{
	struct fixture *f = arg;

	f->reload_calls++;
	switch (f->reload_mode) {
	case 0:
		done(0, "configuration reloaded", 0, done_arg);
		return 0;
	case 1:
		return error_set(-EINVAL, "%s", "wcached.conf:3: unknown key \"x\"");
	default:
		f->kept_done = done;
		f->kept_arg = done_arg;
		assert_true(f->reload_calls <= KEPT_MAX);
		f->kept_dones[f->reload_calls - 1] = done;
		f->kept_args[f->reload_calls - 1] = done_arg;
		return 0;
	}
}

static void
on_deadline(uv_timer_t *t)
{
	struct fixture *f = t->data;

	f->timed_out = 1;
}

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	int fd;

	if (f == NULL)
		return -1;
	f->fds_before = tu_count_fds();
	f->dir = tu_tmpdir();
	snprintf(f->path, sizeof(f->path), "%s/control.sock", f->dir);
	if (uv_loop_init(&f->loop) < 0 || registry_init(&f->reg, &f->loop, NULL) < 0)
		return -1;
	uv_timer_init(&f->loop, &f->deadline);
	f->deadline.data = f;
	uv_unref((uv_handle_t *)&f->deadline);
	f->ctx = (struct control_context){
		.reg = &f->reg,
		.reload_config = fake_reload,
		.arg = f,
		.daemon_uid = geteuid(),
	};
	if ((fd = control_listen_path(f->path, 0600, (gid_t)-1)) < 0)
		return -1;
	if (control_start(&f->loop, fd, &f->ctx, &f->ctl) < 0)
		return -1;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	control_stop(f->ctl);
	registry_close(&f->reg);
	uv_close((uv_handle_t *)&f->deadline, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	tu_rmtree(f->dir);
	assert_int_equal(tu_count_fds(), f->fds_before);
	free(f);
	return 0;
}

/* A control client: a non-blocking socket and what it has read. */
struct client {
	int fd;
	size_t len;
	char buf[1u << 16];
};

static struct client *
client(struct fixture *f)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct client *c = calloc(1, sizeof(*c));

	assert_non_null(c);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	assert_true(c->fd >= 0);
	assert_true(strlen(f->path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, f->path, strlen(f->path) + 1);
	assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return c;
}

static void
client_close(struct client *c)
{
	close(c->fd);
	free(c);
}

static void
send_text(struct client *c, const char *text)
{
	assert_int_equal(send(c->fd, text, strlen(text), MSG_NOSIGNAL), (ssize_t)strlen(text));
}

/*
 * Runs the loop until a whole reply line has arrived, and returns it
 * (malloc'd, without '\n'); or NULL when the daemon closed the connection.
 * The loop runs one event at a time, bounded by the deadline timer.
 */
static char *
reply(struct fixture *f, struct client *c)
{
	f->timed_out = 0;
	uv_timer_start(&f->deadline, on_deadline, DEADLINE_MS, 0);
	for (;;) {
		char *nl = memchr(c->buf, '\n', c->len);
		ssize_t r;

		if (nl != NULL) {
			char *line = strndup(c->buf, (size_t)(nl - c->buf));

			c->len -= (size_t)(nl + 1 - c->buf);
			memmove(c->buf, nl + 1, c->len);
			uv_timer_stop(&f->deadline);
			return line;
		}
		assert_true(c->len < sizeof(c->buf));
		r = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
		if (r > 0) {
			c->len += (size_t)r;
			continue;
		}
		if (r == 0 || (r < 0 && errno == ECONNRESET)) {
			uv_timer_stop(&f->deadline);
			return NULL;
		}
		assert_int_equal(errno, EAGAIN);
		if (f->timed_out)
			fail_msg("no reply within %d ms (have \"%.*s\")", DEADLINE_MS,
				(int)c->len, c->buf);
		uv_run(&f->loop, UV_RUN_ONCE);
	}
}

/* Asserts that the next reply equals want. */
static void
expect_reply(struct fixture *f, struct client *c, const char *want)
{
	char *got = reply(f, c);

	assert_non_null(got);
	assert_string_equal(got, want);
	free(got);
}

/* Asserts that the next reply holds part. */
static void
expect_reply_has(struct fixture *f, struct client *c, const char *part)
{
	char *got = reply(f, c);

	assert_non_null(got);
	if (strstr(got, part) == NULL)
		fail_msg("reply \"%s\" does not hold \"%s\"", got, part);
	free(got);
}

/* Control connections open, from a status request on a new connection
 * (which counts itself). */
static int
control_clients(struct fixture *f)
{
	struct client *c = client(f);
	char *r, *p;
	int n;

	send_text(c, "status\n");
	r = reply(f, c);
	assert_non_null(r);
	assert_non_null(p = strstr(r, "\"control_clients\":"));
	n = atoi(p + strlen("\"control_clients\":"));
	free(r);
	client_close(c);
	return n;
}

/* Runs the loop until cond(f) holds (bounded by the deadline). */
static void
run_until(struct fixture *f, int (*cond)(struct fixture *))
{
	f->timed_out = 0;
	uv_timer_start(&f->deadline, on_deadline, DEADLINE_MS, 0);
	while (!cond(f)) {
		if (f->timed_out)
			fail_msg("condition not reached within %d ms", DEADLINE_MS);
		uv_run(&f->loop, UV_RUN_ONCE);
	}
	uv_timer_stop(&f->deadline);
}

static int
reload_called(struct fixture *f)
{
	return f->reload_calls > 0;
}

static void
listen_path_modes(void **state)
{
	struct fixture *f = *state;
	struct stat st;
	char other[256];
	int fd;

	assert_int_equal(stat(f->path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	/* A live daemon: refused, and the socket file stays. */
	assert_int_equal(control_listen_path(f->path, 0600, (gid_t)-1), -EADDRINUSE);
	assert_non_null(strstr(error_get(), "another wcached"));
	assert_int_equal(stat(f->path, &st), 0);
	/* A live daemon that does not accept, its backlog full: refused at
	 * once, not held in connect(). */
	{
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), c[64];
		size_t n = 0;

		snprintf(other, sizeof(other), "%s/full.sock", f->dir);
		memcpy(sa.sun_path, other, strlen(other) + 1);
		assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
		assert_int_equal(listen(s, 0), 0);
		while (n < 64) {
			c[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (connect(c[n], (struct sockaddr *)&sa, sizeof(sa)) != 0) {
				assert_int_equal(errno, EAGAIN);
				close(c[n]);
				break;
			}
			n++;
		}
		assert_true(n < 64);
		alarm(10);
		assert_int_equal(control_listen_path(other, 0600, (gid_t)-1), -EADDRINUSE);
		alarm(0);
		assert_non_null(strstr(error_get(), "backlog is full"));
		while (n > 0)
			close(c[--n]);
		close(s);
		unlink(other);
	}
	/* A regular file is not replaced. */
	snprintf(other, sizeof(other), "%s/file", f->dir);
	free(tu_write(f->dir, "file", "x", 1));
	assert_int_equal(control_listen_path(other, 0600, (gid_t)-1), -EEXIST);
	/* A stale socket is replaced; the group and mode are applied. */
	snprintf(other, sizeof(other), "%s/stale.sock", f->dir);
	{
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

		assert_true(strlen(other) < sizeof(sa.sun_path));
		memcpy(sa.sun_path, other, strlen(other) + 1);
		assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
		close(s);
	}
	fd = control_listen_path(other, 0660, getegid());
	assert_true(fd >= 0);
	assert_int_equal(stat(other, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0660);
	assert_int_equal(st.st_gid, getegid());
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
}

static void
start_refuses_non_listening(void **state)
{
	struct fixture *f = *state;
	struct control *c = NULL;
	int sv[2], before = tu_count_fds();

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	close(sv[1]);
	assert_int_equal(control_start(&f->loop, sv[0], &f->ctx, &c), -EPROTOTYPE);
	assert_null(c);
	sv[0] = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(sv[0] >= 0);
	assert_int_equal(control_start(&f->loop, sv[0], &f->ctx, &c), -EPROTOTYPE);
	assert_null(c);
	assert_int_equal(tu_count_fds(), before);
}

/* SO_ACCEPTCONN cannot be read (found by a syscall fault sweep of wcached):
 * the start fails with that reason, where it said "not a listening stream
 * socket" of a listening one. */
static void
start_names_a_failed_getsockopt(void **state)
{
	struct fixture *f = *state;
	struct control *c = NULL;
	char *path, *want;
	int fd, before;

	assert_true(asprintf(&path, "%s/c2", f->dir) > 0);
	assert_true(asprintf(&want, "control socket %s: Cannot allocate memory", path) > 0);
	fd = control_listen_path(path, 0600, (gid_t)-1);
	assert_true(fd >= 0);
	before = tu_count_fds();
	fail_sockopt = SO_ACCEPTCONN;
	assert_int_equal(control_start(&f->loop, fd, &f->ctx, &c), -ENOMEM);
	assert_null(c);
	/* It names the socket, by the path it is bound to. */
	assert_string_equal(error_get(), want);
	assert_int_equal(tu_count_fds(), before - 1);
	free(want);
	free(path);
}

/* A path that cannot be bound: the error says it is the control socket,
 * with the path and the reason; before, only "PATH: reason". */
static void
listen_path_names_the_control_socket(void **state)
{
	struct fixture *f = *state;
	char *path, *want;

	assert_true(asprintf(&path, "%s/missing/c.sock", f->dir) > 0);
	assert_true(asprintf(&want, "control socket %s: No such file or directory", path) > 0);
	assert_int_equal(control_listen_path(path, 0600, (gid_t)-1), -ENOENT);
	assert_string_equal(error_get(), want);
	free(want);
	free(path);
}

static void
requests_and_errors(void **state)
{
	struct fixture *f = *state;
	struct client *c = client(f);
	char *r, want[160];

	send_text(c, "status\n");
	r = reply(f, c);
	assert_non_null(r);
	assert_non_null(strstr(r, "{\"ok\":true,\"protocol\":1,\"version\":\""));
	assert_non_null(strstr(r, "\"models\":[],\"unloaded\":[]}"));
	free(r);
	send_text(c, "\nfoo bar\nload x\nunload nope\nload -x /p\nload x rel\n"
		      "load x /p pin=most\npin\n");
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"empty request "
			    "(try \\\"help\\\")\"}");
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"unknown command \\\"foo\\\" "
			    "(try \\\"help\\\")\"}");
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"load: usage: load NAME PATH "
			    "[pin=none|metadata|all]\"}");
	r = reply(f, c);
	assert_non_null(strstr(r, "\"ok\":false,\"protocol\":1,\"error\":\"unload: "));
	assert_non_null(strstr(r, "nope"));
	free(r);
	r = reply(f, c);
	assert_non_null(strstr(r, "load: invalid model name \\\"-x\\\""));
	free(r);
	r = reply(f, c);
	assert_non_null(strstr(r, "load: PATH must be absolute"));
	free(r);
	r = reply(f, c);
	assert_non_null(strstr(r, "load: bad option \\\"pin=most\\\""));
	free(r);
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"pin: usage: pin NAME\"}");
	/* The metrics text is one JSON string holding the exposition. */
	send_text(c, "metrics\n");
	r = reply(f, c);
	assert_non_null(strstr(r, "\"text\":\"# HELP wcached_build_info "));
	assert_non_null(strstr(r, "# TYPE wcached_model_swaps_total counter\\n"));
	/* The accept pauses' help texts name the pauses in force. */
	snprintf(want, sizeof(want), "# HELP wcached_accept_pauses_total Times the client socket "
		 "was left unwatched for %d ms: ", SERVER_ACCEPT_PAUSE_MS);
	assert_non_null(strstr(r, want));
	snprintf(want, sizeof(want), "# HELP wcached_control_accept_pauses_total Times the control "
		 "socket was left unwatched for %d ms: ", CTL_ACCEPT_PAUSE_MS);
	assert_non_null(strstr(r, want));
	free(r);
	/* A line at EOF without '\n' is a request; then the daemon closes. */
	send_text(c, "help");
	shutdown(c->fd, SHUT_WR);
	r = reply(f, c);
	assert_non_null(strstr(r,
		"{\"ok\":true,\"protocol\":1,\"commands\":[{\"usage\":\"status\""));
	for (int id = 0; id < CONTROL_CMD_COUNT; id++) {
		char usage[128], entry[512];

		control_cmd_usage(&control_cmds[id], usage, sizeof(usage));
		snprintf(entry, sizeof(entry), "{\"usage\":\"%s\",\"summary\":\"%s\"}", usage,
			control_cmds[id].summary);
		if (strstr(r, entry) == NULL)
			fail_msg("help does not list %s in %s", entry, r);
	}
	free(r);
	assert_null(reply(f, c));
	client_close(c);
}

static void
overlong_line(void **state)
{
	struct fixture *f = *state;
	char big[CONTROL_LINE_MAX + 2], *r;
	struct client *c = client(f);

	memset(big, 'a', sizeof(big));
	/* Exactly the maximum is fine. */
	big[CONTROL_LINE_MAX] = '\n';
	assert_int_equal(send(c->fd, big, CONTROL_LINE_MAX + 1, 0), CONTROL_LINE_MAX + 1);
	r = reply(f, c);
	assert_non_null(strstr(r,
		"{\"ok\":false,\"protocol\":1,\"error\":\"unknown command \\\"aaaa"));
	free(r);
	/* One more byte is not, and closes the connection. */
	big[CONTROL_LINE_MAX] = 'a';
	big[CONTROL_LINE_MAX + 1] = '\n';
	assert_int_equal(send(c->fd, big, sizeof(big), 0), (ssize_t)sizeof(big));
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"request longer than "
			    "4096 bytes\"}");
	assert_null(reply(f, c));
	client_close(c);
}

static void
reload_completes_at_once(void **state)
{
	struct fixture *f = *state;
	struct client *c = client(f);

	f->reload_mode = 0;
	send_text(c, "reload\nreload\n");
	expect_reply(f, c, "{\"ok\":true,\"protocol\":1,\"message\":\"configuration reloaded\"}");
	expect_reply(f, c, "{\"ok\":true,\"protocol\":1,\"message\":\"configuration reloaded\"}");
	assert_int_equal(f->reload_calls, 2);
	f->reload_mode = 1;
	send_text(c, "reload\n");
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"reload: wcached.conf:3: "
			    "unknown key \\\"x\\\"\"}");
	client_close(c);
}

static void
reload_later_keeps_order(void **state)
{
	struct fixture *f = *state;
	struct client *c = client(f);
	char byte;

	f->reload_mode = 2;
	send_text(c, "reload\nhelp\n");
	run_until(f, reload_called);
	/* The help behind the reload waits for it. */
	uv_run(&f->loop, UV_RUN_NOWAIT);
	assert_int_equal(recv(c->fd, &byte, 1, MSG_PEEK), -1);
	assert_int_equal(errno, EAGAIN);
	f->kept_done(-EIO, "configuration reloaded; some models failed to load", 0,
		f->kept_arg);
	expect_reply(f, c, "{\"ok\":false,\"protocol\":1,\"error\":\"reload: configuration "
			    "reloaded; some models failed to load\"}");
	free(reply(f, c)); /* help */
	client_close(c);
}

static void
reload_done_after_client_left(void **state)
{
	struct fixture *f = *state;
	struct client *c = client(f);
	int tries = 0;

	f->reload_mode = 2;
	send_text(c, "reload\nstatus\n");
	run_until(f, reload_called);
	client_close(c);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	/* The reply goes nowhere; the connection closes, nothing leaks. */
	f->kept_done(0, "configuration reloaded", 0, f->kept_arg);
	while (control_clients(f) != 1)
		assert_true(++tries < 100);
}

static void
reload_done_after_stop(void **state)
{
	struct fixture *f = *state;
	struct client *c = client(f);

	f->reload_mode = 2;
	send_text(c, "reload\n");
	run_until(f, reload_called);
	control_stop(f->ctl);
	f->ctl = NULL;
	uv_run(&f->loop, UV_RUN_NOWAIT);
	f->kept_done(0, "configuration reloaded", 0, f->kept_arg);
	assert_null(reply(f, c)); /* closed without a reply */
	client_close(c);
}

/* run_until's condition: the fake has seen want_calls reloads. */
static int want_calls;

static int
reloads_reached(struct fixture *f)
{
	return f->reload_calls >= want_calls;
}

/* n clients of this uid, each with a reload in flight (kept by the fake). */
static void
reloads_in_flight(struct fixture *f, struct client **c, int n)
{
	int before = f->reload_calls;

	f->reload_mode = 2;
	for (int i = 0; i < n; i++) {
		c[i] = client(f);
		send_text(c[i], "reload\n");
	}
	want_calls = before + n;
	run_until(f, reloads_reached);
}

/*
 * Clients that hang up while their request is in flight (wcachectl killed
 * by a timeout during a slow load) give their places back: 15 such, then 15
 * more reloads all start, and status gets in. Before, they held their
 * places until the requests ended, and the uid was locked out ("too many
 * control connections from this uid (16), all busy"). Their requests still
 * complete, their replies dropped (ASan: nothing used after it was freed,
 * nothing leaks). A half-closed client keeps its connection and gets its
 * reply; one that hung up with another request behind the first is closed
 * too (the failed write of the first reply closed it before).
 */
static void
departed_clients_give_their_places_back(void **state)
{
	struct fixture *f = *state;
	struct client *gone[CONTROL_MAX_PER_UID - 1], *live[CONTROL_MAX_PER_UID - 1];
	struct client *half, *queued;
	int n = CONTROL_MAX_PER_UID - 1, half_at = 2 * n, queued_at = half_at + 1;

	reloads_in_flight(f, gone, n);
	for (int i = 0; i < n; i++)
		client_close(gone[i]);
	reloads_in_flight(f, live, n);
	assert_int_equal(f->reload_calls, 2 * n);
	assert_int_equal(control_clients(f), n + 1);
	/* The first ones' replies go nowhere. */
	for (int i = 0; i < n; i++)
		f->kept_dones[i](0, "configuration reloaded", 0, f->kept_args[i]);
	for (int i = 0; i < n; i++) {
		f->kept_dones[n + i](0, "configuration reloaded", 0, f->kept_args[n + i]);
		expect_reply(f, live[i], "{\"ok\":true,\"protocol\":1,\"message\":"
				    "\"configuration reloaded\"}");
		client_close(live[i]);
	}
	/* Half-closed: still waits for its reply, so the next connection's
	 * count keeps it. Hung up with a request behind the one in flight:
	 * closed. */
	reloads_in_flight(f, &half, 1);
	shutdown(half->fd, SHUT_WR);
	queued = client(f);
	send_text(queued, "reload\nreload\n");
	want_calls = f->reload_calls + 1;
	run_until(f, reloads_reached);
	client_close(queued);
	assert_int_equal(control_clients(f), 2); /* half and the status itself */
	f->kept_dones[queued_at](0, "configuration reloaded", 0, f->kept_args[queued_at]);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	assert_int_equal(f->reload_calls, queued_at + 1); /* its second reload never ran */
	f->kept_dones[half_at](0, "configuration reloaded", 0, f->kept_args[half_at]);
	expect_reply_has(f, half, "configuration reloaded");
	assert_null(reply(f, half));
	client_close(half);
}

/*
 * At most CONTROL_MAX_PER_UID - 1 requests of a uid are in flight: one more
 * is refused with an error (its connection stays), so that a new
 * connection always finds an idle one to push out, and status gets in
 * while the uid's loads wait. Before, the 16th waited too and the 17th
 * connection was refused.
 */
static void
one_place_stays_for_status(void **state)
{
	struct fixture *f = *state;
	struct client *busy[CONTROL_MAX_PER_UID - 1], *extra, *probe;
	int n = CONTROL_MAX_PER_UID - 1;

	reloads_in_flight(f, busy, n);
	extra = client(f);
	send_text(extra, "reload\n");
	expect_reply_has(f, extra, "{\"ok\":false,\"protocol\":1,\"error\":\"reload: too many "
			 "requests in flight from this uid (at most 15");
	assert_int_equal(f->reload_calls, n);
	probe = client(f);
	send_text(probe, "status\n");
	expect_reply_has(f, probe, "{\"ok\":true,");
	client_close(probe);
	client_close(extra);
	for (int i = 0; i < n; i++) {
		f->kept_dones[i](0, "configuration reloaded", 0, f->kept_args[i]);
		free(reply(f, busy[i]));
		client_close(busy[i]);
	}
}

/* c answers a status. */
static void
expect_status(struct fixture *f, struct client *c)
{
	send_text(c, "status\n");
	expect_reply_has(f, c, "{\"ok\":true,");
}

/* A connection of uid (SO_PEERCRED says so), accepted and, with command,
 * its reply read; with "reload" it stays in flight (kept by the fake). */
static struct client *
client_of(struct fixture *f, uid_t uid, const char *command)
{
	int before = f->reload_calls;
	struct client *c;

	peer_uid = uid;
	c = client(f);
	if (strcmp(command, "reload") == 0) {
		send_text(c, "reload\n");
		want_calls = before + 1;
		run_until(f, reloads_reached);
	} else {
		expect_status(f, c);
	}
	peer_uid = (uid_t)-1;
	return c;
}

/*
 * At the limit of all control connections (64: four uids, each with 15
 * requests in flight and one idle), a newcomer whose uid is at its own
 * limit pushes out that uid's idle connection and is let in: nobody loses a
 * connection to a newcomer refused after all (review rev181: make_room's
 * uid check runs before the global one). One of a fifth uid pushes out an
 * idle connection of another uid and is let in too.
 */
static void
the_global_limit_evicts_only_for_a_newcomer_let_in(void **state)
{
	struct fixture *f = *state;
	enum { UIDS = CONTROL_MAX_CONNECTIONS / CONTROL_MAX_PER_UID };
	struct client *busy[UIDS][CONTROL_MAX_PER_UID - 1], *idle[UIDS], *mine, *other;
	int n = CONTROL_MAX_PER_UID - 1;
	uid_t base = 70000;

	_Static_assert(UIDS * (CONTROL_MAX_PER_UID - 1) <= KEPT_MAX, "reloads kept");
	f->ctx.has_group = true; /* uids other than ours, in our group */
	f->ctx.group = getegid();
	f->reload_mode = 2;
	for (int u = 0; u < UIDS; u++) {
		for (int i = 0; i < n; i++)
			busy[u][i] = client_of(f, base + (uid_t)u, "reload");
		idle[u] = client_of(f, base + (uid_t)u, "status");
	}
	/* The first uid again: its idle connection makes room, and only it. */
	mine = client_of(f, base, "status");
	expect_reply_has(f, idle[0], "closed: too many control connections from this uid");
	assert_null(reply(f, idle[0]));
	/* Nobody else's went (each answers, in the order they came, the
	 * first now idle the longest). */
	for (int u = 1; u < UIDS; u++)
		expect_status(f, idle[u]);
	expect_status(f, mine);
	/* A fifth uid: the connection idle the longest, of another uid, makes
	 * room; the others stay. */
	other = client_of(f, base + UIDS, "status");
	expect_reply_has(f, idle[1], "closed: too many control connections and this one was idle");
	assert_null(reply(f, idle[1]));
	for (int u = 2; u < UIDS; u++)
		expect_status(f, idle[u]);
	expect_status(f, mine);
	client_close(mine);
	client_close(other);
	for (int u = 0; u < UIDS; u++) {
		client_close(idle[u]);
		for (int i = 0; i < n; i++) {
			int k = u * n + i;

			f->kept_dones[k](0, "configuration reloaded", 0, f->kept_args[k]);
			expect_reply_has(f, busy[u][i], "configuration reloaded");
			client_close(busy[u][i]);
		}
	}
}

/*
 * Connections that arrive with no memory for them are accepted and closed,
 * all of them, and the socket goes on. Two in one go: the second found the
 * spare handle (which drops the first) still closing, was left unaccepted,
 * and libuv, which watches the listener again only once the connection it
 * holds is accepted, never did: the control socket was dead for good.
 */
static void
connections_without_memory_are_dropped(void **state)
{
	struct fixture *f = *state;
	struct client *a = client(f), *b = client(f), *c;

	fail_conn_calloc = true;
	assert_null(reply(f, a));
	assert_null(reply(f, b));
	fail_conn_calloc = false;
	client_close(a);
	client_close(b);
	c = client(f);
	send_text(c, "status\n");
	expect_reply_has(f, c, "{\"ok\":true,");
	client_close(c);
}

static void
many_pipelined_requests(void **state)
{
	struct fixture *f = *state;
	struct client *c = client(f);
	int sent = 0, replies = 0;
	char *r;

	/* 2000 metrics replies are more than CONTROL_MAX_QUEUED: the daemon
	 * stops reading this client instead of queueing without bound, and
	 * carries on as the client reads. */
	while (sent < 2000) {
		ssize_t n = send(c->fd, "metrics\n", 8, MSG_NOSIGNAL);

		if (n == 8) {
			sent++;
			continue;
		}
		assert_int_equal(errno, EAGAIN);
		r = reply(f, c);
		assert_non_null(r);
		free(r);
		replies++;
	}
	shutdown(c->fd, SHUT_WR);
	while ((r = reply(f, c)) != NULL) {
		assert_non_null(strstr(r, "{\"ok\":true,"));
		free(r);
		replies++;
	}
	assert_int_equal(replies, 2000);
	client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(split_words),
		cmocka_unit_test(split_errors),
		cmocka_unit_test(every_command_has_a_handler),
		cmocka_unit_test(requests_follow_the_table),
		cmocka_unit_test(label_escaping),
		cmocka_unit_test_setup_teardown(listen_path_modes, setup, teardown),
		cmocka_unit_test_setup_teardown(start_refuses_non_listening, setup, teardown),
		cmocka_unit_test_setup_teardown(start_names_a_failed_getsockopt, setup, teardown),
		cmocka_unit_test_setup_teardown(listen_path_names_the_control_socket, setup,
			teardown),
		cmocka_unit_test_setup_teardown(requests_and_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(overlong_line, setup, teardown),
		cmocka_unit_test_setup_teardown(reload_completes_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(reload_later_keeps_order, setup, teardown),
		cmocka_unit_test_setup_teardown(reload_done_after_client_left, setup, teardown),
		cmocka_unit_test_setup_teardown(reload_done_after_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(many_pipelined_requests, setup, teardown),
		cmocka_unit_test_setup_teardown(departed_clients_give_their_places_back, setup,
			teardown),
		cmocka_unit_test_setup_teardown(one_place_stays_for_status, setup, teardown),
		cmocka_unit_test_setup_teardown(the_global_limit_evicts_only_for_a_newcomer_let_in,
			setup, teardown),
		cmocka_unit_test_setup_teardown(connections_without_memory_are_dropped, setup,
			teardown),
	};

	uv_loop_t warmup;

	/* As in wcached: replies to a client that has gone fail with EPIPE
	 * (libuv writes streams with write(2), which cannot say MSG_NOSIGNAL). */
	signal(SIGPIPE, SIG_IGN);
	/* libuv opens a process-wide pipe at its first loop; open it now so
	 * the fixtures' descriptor counts see only what the tests open. */
	if (uv_loop_init(&warmup) != 0 || uv_loop_close(&warmup) != 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
