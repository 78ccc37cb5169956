/*
 * fuzz_reply.c: libFuzzer harness for wcachectl's reading of wcached's
 * replies, the bytes a wedged or impersonated daemon (or a --control path
 * that leads elsewhere) sends: reading the reply line off the socket and
 * its common fields (exchange() and reply_parse() in client/ctl/control.c,
 * over ctl_parse_reply() and ctl_read_object()), the status reader and its
 * table and --json printers (client/ctl/status.c), the other commands'
 * printers, and the metrics endpoint's reader (ctl_http_read_reply() in
 * client/ctl/http.c).
 *
 * The input is what the daemon's side of the connection sends before it
 * stops writing: its first line is the reply (an input without '\n' is a
 * daemon that closed without a reply). The harness listens on a control
 * socket in a temporary directory made once per process, and wcachectl's
 * connect() is wrapped (--wrap=connect) to accept the connection in the
 * same thread, queue the input on it and shut down the daemon's writing
 * side: no thread, no wait. Each input answers real wcachectl commands, run
 * with ctl_control() as main() runs them, with stdout and stderr captured
 * in memory streams so that the printers run too: status (the table),
 * status --json with names (one served in the seeds, one not), metrics (the
 * exposition), load and unload (a sentence each) and reload --json (the
 * reply as it came).
 * The reply line also goes, in a buffer of exactly its size, to the
 * endpoint's reader and to ctl_status_show().
 *
 * Checks, beyond "no crash, no undefined behaviour, no leak":
 *   - each command ends in an exit status it documents (0 or 1; status
 *     also 3 or 4, never 2), and a failure says why on stderr;
 *   - stderr holds only "wcachectl: " lines, and stdout (but for the
 *     exposition, which goes to a file or scraper as it came) nothing a
 *     terminal acts on: what the daemon sent is escaped (base/escape.h);
 *   - with --json, stdout holds exactly one JSON object (jansson judges),
 *     whatever the reply; status --json's "ready" agrees with the exit
 *     status;
 *   - a reply that is not one JSON object (the endpoint's reader refuses
 *     it) fails every command with "malformed reply from wcached" (or "out
 *     of memory"), and no reply line at all with "wcached closed the control
 *     connection";
 *   - metrics writes the reply's "text" exactly (jansson decodes it too);
 *   - the endpoint's reader leaves its out-parameters alone when it
 *     refuses, and a NUL-terminated text otherwise.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "base/escape.h"
#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "fuzz_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MALFORMED "wcachectl: malformed reply from wcached: "
#define NO_MEMORY "wcachectl: out of memory\n"
#define NO_REPLY "wcachectl: wcached closed the control connection "

/* The longest input tried: it must fit a socket's buffer (the kernel's
 * default is 208 KiB), which the harness fills before wcachectl reads. */
#define INPUT_MAX (64u << 10)

/* The commands each input answers: the words as wcachectl takes them, and
 * its global --json. */
static const struct {
	const char *words;
	int json;
} commands[] = {
	{ "status", 0 },
	{ "status small nosuch", 1 },
	{ "metrics", 0 },
	{ "load small /models/small.safetensors", 0 },
	{ "unload small", 0 },
	{ "reload", 1 },
};

/* The harness's control socket, and the reply its connections get. */
static struct {
	const uint8_t *reply; /* the current input, while a command runs */
	size_t len;
	int served;           /* the daemon's end of the last connection, or -1 */
	char dir[64];
	char path[96];
	int fd;
} fake = { .served = -1, .fd = -1 };

int __real_connect(int fd, const struct sockaddr *sa, socklen_t len);
int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len);

/*
 * wcachectl's connect() (linked with --wrap=connect): connects, then plays
 * the daemon in the same thread. The connection waits in the listener's
 * backlog, so it is accepted at once, and the input is queued on it before
 * wcachectl sends its request (it fits the socket's buffer: INPUT_MAX);
 * then the daemon's end stops writing (wcachectl reads EOF after it) but
 * stays open, its request unread, until the command has returned.
 */
int
__wrap_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int rc = __real_connect(fd, sa, len);

	if (rc < 0)
		return rc;
	CHECK(fake.served < 0);
	CHECK((fake.served = accept4(fake.fd, NULL, NULL, SOCK_CLOEXEC)) >= 0);
	CHECK(fake.len == 0 || send(fake.served, fake.reply, fake.len, MSG_DONTWAIT) ==
		(ssize_t)fake.len);
	CHECK(shutdown(fake.served, SHUT_WR) == 0);
	return rc;
}

/* Removes the socket and its directory when the fuzzer exits. */
static void
remove_socket(void)
{
	unlink(fake.path);
	rmdir(fake.dir);
}

/* Makes the control socket, once per process. */
int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	(void)argc;
	(void)argv;
	snprintf(fake.dir, sizeof(fake.dir), "/tmp/fuzz_reply.XXXXXX");
	CHECK(mkdtemp(fake.dir) != NULL);
	snprintf(fake.path, sizeof(fake.path), "%s/control.sock", fake.dir);
	CHECK(strlen(fake.path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, fake.path, strlen(fake.path) + 1);
	CHECK((fake.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	CHECK(bind(fake.fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(fake.fd, 4) == 0);
	atexit(remove_socket);
	return 0;
}

/* Does s[0..n) hold nothing a terminal acts on, '\n' aside: every piece of
 * it one that escape_step() keeps as it is? */
static bool
harmless(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + n;
	char out[ESCAPE_STEP_MAX];
	size_t k, out_len;

	for (; p < end; p += k) {
		k = 1;
		if (*p == '\n')
			continue;
		k = escape_step(p, end, out, &out_len);
		if (out_len != k || memcmp(out, p, k) != 0)
			return false;
	}
	return true;
}

/* Every line of stderr is wcachectl's, and harmless. */
static void
check_stderr(const char *s, size_t n)
{
	CHECK(harmless(s, n));
	CHECK(n == 0 || s[n - 1] == '\n');
	for (size_t at = 0; at < n; at = (size_t)((const char *)memchr(s + at, '\n',
		n - at) - s) + 1)
		CHECK(n - at > 11 && memcmp(s + at, "wcachectl: ", 11) == 0);
}

/* With --json: one JSON object on stdout. jansson may refuse a number the
 * strict reader skipped (an unread member's 1e999), or a key holding \u0000
 * (valid JSON; jansson allows NUL in values only): that cannot be judged.
 * Returns the object, or NULL then. */
static json_t *
check_one_object(const char *s, size_t n)
{
	json_error_t err;
	json_t *v = json_loadb(s, n, JSON_ALLOW_NUL, &err);

	if (v == NULL) {
		CHECK(json_error_code(&err) == json_error_numeric_overflow ||
			json_error_code(&err) == json_error_null_byte_in_key);
		return NULL;
	}
	CHECK(json_is_object(v));
	CHECK(json_object_get(v, "ok") != NULL);
	return v;
}

/* What one command printed and returned. */
struct run {
	int status;
	char *out, *err;
	size_t out_len, err_len;
};

/* Runs wcachectl's command words (with --json when json) against the
 * harness's socket, stdout and stderr captured in r. */
static void
run_command(const char *words, int json, struct run *r)
{
	char *copy = strdup(words), *argv[8], *save = NULL;
	FILE *saved_out = stdout, *saved_err = stderr, *out, *err;
	struct ctl_control_cmd cmd;
	int argc = 0;

	CHECK(copy != NULL);
	for (char *w = strtok_r(copy, " ", &save); w != NULL; w = strtok_r(NULL, " ", &save))
		argv[argc++] = w;
	argv[argc] = NULL;
	CHECK(ctl_control_find(argv[0], &cmd) == 0);
	memset(r, 0, sizeof(*r));
	out = open_memstream(&r->out, &r->out_len);
	err = open_memstream(&r->err, &r->err_len);
	CHECK(out != NULL && err != NULL);
	stdout = out;
	stderr = err;
	r->status = ctl_control(&cmd, argc, argv, NULL, fake.path, json);
	stdout = saved_out;
	stderr = saved_err;
	CHECK(fake.served >= 0); /* every command connected */
	close(fake.served);
	fake.served = -1;
	CHECK(fclose(out) == 0 && fclose(err) == 0);
	free(copy);
}

/* The member "text" of the reply as jansson decodes it (the last one, as
 * wcachectl keeps), or NULL; *v is the document, to json_decref(). */
static const char *
jansson_text(const char *line, size_t len, json_t **v, size_t *text_len)
{
	json_t *text;

	*v = json_loadb(line, len, JSON_ALLOW_NUL, NULL);
	if (*v == NULL || !json_is_object(*v))
		return NULL;
	text = json_object_get(*v, "text");
	if (!json_is_string(text))
		return NULL;
	*text_len = json_string_length(text);
	return json_string_value(text);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nl = memchr(data, '\n', size);
	size_t len = nl != NULL ? (size_t)(nl - data) : size, text_len = 0, jtext_len = 0;
	char *line, *text = NULL;
	char *names[] = { "small", "nosuch" };
	const char *jtext;
	json_t *doc;
	int ok = 7, rc;
	FILE *saved_out = stdout, *saved_err = stderr, *sink;

	if (size > INPUT_MAX)
		return 0;
	line = malloc(len ? len : 1);
	CHECK(line != NULL);
	memcpy(line, data, len);
	fake.reply = data;
	fake.len = size;

	/* The endpoint's reader: the oracle of "one JSON object". */
	rc = ctl_http_read_reply(line, len, &ok, &text, &text_len);
	if (rc < 0) {
		CHECK(rc == -EINVAL || rc == -E2BIG || rc == -EDOM || rc == -ENOMEM);
		CHECK(ok == 7 && text == NULL && text_len == 0);
	} else {
		CHECK(ok == -1 || ok == 0 || ok == 1);
		CHECK(text == NULL || text[text_len] == '\0');
	}
	free(text);
	jtext = jansson_text(line, len, &doc, &jtext_len);

	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		bool status = strncmp(commands[i].words, "status", 6) == 0;
		bool metrics = strcmp(commands[i].words, "metrics") == 0;
		struct run r;

		run_command(commands[i].words, commands[i].json, &r);
		CHECK(r.status == 0 || r.status == 1 ||
			(status && (r.status == 3 || r.status == 4)));
		check_stderr(r.err, r.err_len);
		if (r.status == 1)
			CHECK(r.err_len > 0);
		if (nl == NULL)
			CHECK(r.status == 1 && strncmp(r.err, NO_REPLY, strlen(NO_REPLY)) == 0);
		else if (rc < 0)
			CHECK(r.status == 1 &&
				(strncmp(r.err, MALFORMED, strlen(MALFORMED)) == 0 ||
					strcmp(r.err, NO_MEMORY) == 0));
		if (commands[i].json) {
			json_t *v = check_one_object(r.out, r.out_len);

			if (v != NULL && status && r.status != 1)
				CHECK(json_is_boolean(json_object_get(v, "ready")) &&
					json_is_true(json_object_get(v, "ready")) ==
						(r.status == 0));
			json_decref(v);
		} else if (!metrics) {
			CHECK(harmless(r.out, r.out_len));
		} else if (r.status == 0 && jtext != NULL && !isatty(STDOUT_FILENO)) {
			CHECK(r.out_len == jtext_len && memcmp(r.out, jtext, jtext_len) == 0);
		}
		free(r.out);
		free(r.err);
	}
	json_decref(doc);

	/* The status reader on a buffer of exactly the line's size. */
	sink = fopen("/dev/null", "w");
	CHECK(sink != NULL);
	stdout = sink;
	stderr = sink;
	rc = ctl_status_show(line, len, names, 1, 0);
	stdout = saved_out;
	stderr = saved_err;
	fclose(sink);
	CHECK(rc == 0 || rc == 1 || rc == 3 || rc == 4);
	free(line);
	return 0;
}
