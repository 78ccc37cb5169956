/*
 * ctl_control.c: the wcachectl commands that talk to wcached's control
 * socket: those of the table in proto/control_cmds.h (status, load, unload,
 * reload, pin, unpin, evict, drop, metrics), which commands.c finds and describes.
 *
 * Each command is one request line and one reply line holding a JSON object
 * (daemon/control.h describes the protocol). wcachectl finds the socket
 * (--control, the `control` key of -c CONFIG, $WCACHE_CONTROL, or the
 * default), sends the line, waits for the reply, which for load and reload
 * comes when the daemon has finished, and shows it: a table or a sentence by
 * default, the reply itself with --json, the exposition text for metrics.
 * The exit status is 0 when the reply says ok, 1 with the daemon's error on
 * stderr otherwise (or when the daemon cannot be reached), 2 for a usage
 * error; status adds 3 and 4 (ctl.h). With --json, stdout holds exactly one
 * JSON object whatever happens: the reply, or ctl_json_error()'s.
 *
 * Replies are parsed with the strict reader of json.h. Strings from the
 * daemon are printed with escape_print() (base/escape.h), so a hostile
 * model file's name cannot drive the terminal; the metrics exposition is
 * escaped so only when standard output is a terminal, and goes as it is to
 * a scraper or a file.
 *
 * This file finds the socket, makes the request from the options and
 * arguments, talks to the daemon and reads the fields every reply has,
 * with the table-driven object reader (ctl_read_object()) that the status
 * table in ctl_status.c uses too; the two share ctl_internal.h.
 */
#include <errno.h>
#include <limits.h>
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

#include "ctl/ctl.h"
#include "proto/control_proto.h"
#include "ctl/internal.h"
#include "proto/defaults.h"
#include "proto/model_name.h"
#include "proto/pin.h"
#include "proto/wire.h"
#include "base/error.h"
#include "base/escape.h"
#include "base/inifile.h"
#include "base/json.h"
#include "base/path.h"

#define REPLY_MAX (256u << 20)      /* a status of thousands of models fits */

/* ---- finding the socket ------------------------------------------------- */

/* What control_from_config() gathers while inifile_read() runs. */
struct control_key {
	bool in_wcached; /* the current line is in [wcached] */
	char *value;     /* the last control key of [wcached], or NULL */
};

/* inifile's section callback: notes whether the lines are in [wcached]. */
static int
control_section(struct inifile *f, const char *name, void *arg)
{
	struct control_key *c = arg;

	c->in_wcached = strcmp(name, "wcached") == 0;
	return 0;
}

/* inifile's key callback: keeps [wcached]'s control key, ignores the rest
 * (wcached checks it; wcachectl needs one key). */
static int
control_key(struct inifile *f, const char *key, const char *value, void *arg)
{
	struct control_key *c = arg;
	char *copy;

	if (!c->in_wcached || strcmp(key, "control") != 0)
		return 0;
	if (*value == '\0')
		return inifile_error(f, -EINVAL, "empty control path");
	if ((copy = strdup(value)) == NULL)
		return inifile_error(f, -ENOMEM, "out of memory");
	free(c->value);
	c->value = copy;
	return 0;
}

/*
 * Reads the `control` key of the [wcached] section of the configuration at
 * path with wcached's reader (client/base/inifile.h), which also joins a relative
 * value with the configuration's directory as wcached does. Stores a
 * malloc'd path, or NULL when the file sets none. Returns 0, or -1 after
 * printing the error.
 */
static int
control_from_config(const char *path, char **out)
{
	static const struct inifile_handler handler = { control_section, control_key, NULL };
	struct control_key c = { .in_wcached = false, .value = NULL };
	char *dir = NULL, *joined = NULL;

	*out = NULL;
	if (inifile_read(path, &handler, &c) < 0) {
		ctl_error("%s", error_get());
		free(c.value);
		return -1;
	}
	if (c.value == NULL)
		return 0;
	if (inifile_dir(path, &dir) < 0) {
		ctl_error("%s", error_get());
		free(c.value);
		return -1;
	}
	if (inifile_join(dir, c.value, &joined) < 0)
		ctl_error("out of memory");
	free(dir);
	free(c.value);
	*out = joined;
	return joined != NULL ? 0 : -1;
}

/* ---- talking to the daemon ---------------------------------------------- */

/*
 * Says that path is wcached's client socket, not its control socket, and
 * which control socket to use: the one beside it (where its daemon keeps
 * it, as the default layout does: control.sock in the client socket's
 * directory) when a socket is there, else the compiled-in default, with
 * -c CONFIG for a daemon whose config names another.
 */
static void
client_socket_hint(const char *path)
{
	const char *slash = strrchr(path, '/');
	const char *base = strrchr(DEFAULT_CONTROL_PATH, '/') + 1;
	char *beside = NULL;
	struct stat st;

	if (asprintf(&beside, "%.*s%s", slash != NULL ? (int)(slash - path + 1) : 0,
		     path, base) < 0)
		beside = NULL;
	if (beside != NULL && strcmp(beside, path) != 0 && stat(beside, &st) == 0 &&
	    S_ISSOCK(st.st_mode))
		ctl_error("%s looks like wcached's client socket, not its control socket; use "
			  "--control %s (the control socket beside it) or -c CONFIG", path,
			  beside);
	else
		ctl_error("%s looks like wcached's client socket, not its control socket; give "
			  "--control with the `control` path of wcached's config (default "
			  DEFAULT_CONTROL_PATH "), or -c CONFIG", path);
	free(beside);
}

/* Where the control socket's path came from, for the message when nothing
 * listens there: the configuration file of -c (NULL otherwise) or what
 * else named it, and whether the command is a reload of the configuration. */
static struct {
	const char *config;
	const char *named_by; /* "--control", "$WCACHE_CONTROL", NULL: the default */
	bool reload;
} path_from;

/*
 * The error when connect(2) to path failed with ENOENT or ECONNREFUSED:
 * wcached is not running there, or path is no socket at all (connect(2)
 * gives ECONNREFUSED for a regular file: `--control /etc/wcached.conf`
 * meant for -c).
 */
static void
not_running(const char *path, int e)
{
	const char *config = path_from.config;
	struct stat st;

	if (e == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
		if (config != NULL)
			ctl_error("%s, the `control` of %s, is not a socket (%s): it must name "
				  "wcached's control socket", path, config,
				path_file_kind(st.st_mode));
		else if (path_from.named_by != NULL)
			ctl_error("%s is not a socket (%s): %s names wcached's control socket%s",
				path, path_file_kind(st.st_mode), path_from.named_by,
				strcmp(path_from.named_by, "--control") == 0 ?
				"; -c takes a configuration file" : "");
		else
			ctl_error("%s is not a socket (%s)", path, path_file_kind(st.st_mode));
	} else if (config != NULL && path_from.reload) {
		/* systemctl reload after an edit of `control =`: the running
		 * wcached keeps its socket until it restarts. */
		ctl_error("wcached is not running: no control socket at %s (%s), the `control` of "
			  "%s (if you changed `control` since wcached started, it applies at the "
			  "next restart: until then give --control the path it listens on)", path,
			strerror(e), config);
	} else if (config != NULL) {
		ctl_error("wcached is not running: no control socket at %s (%s), the `control` of "
			  "%s", path, strerror(e), config);
	} else {
		ctl_error("wcached is not running: no control socket at %s (%s)",
			path, strerror(e));
	}
}

/* Connects to the control socket; prints why not and returns -1. */
static int
control_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		ctl_error("%s: control socket path longer than %zu bytes", path,
			sizeof(sa.sun_path) - 1);
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) == -1) {
		ctl_error("socket: %s", strerror(errno));
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return fd;
	e = errno;
	close(fd);
	if (e == EPROTOTYPE)
		/* A SOCK_SEQPACKET socket: wcached's client socket, most likely. */
		client_socket_hint(path);
	else if (e == ENOENT || e == ECONNREFUSED)
		not_running(path, e);
	else if (e == EACCES || e == EPERM)
		ctl_error("%s: permission denied: the control socket is for "
				"root, wcached's user and its control_group", path);
	else
		ctl_error("cannot connect to wcached's control socket %s: %s",
			path, strerror(e));
	return -1;
}

/*
 * Sends the request and reads the reply line (without its '\n', NUL-
 * terminated, malloc'd). A failed send is not final: a daemon that refuses
 * the connection has written its reason first, so the reply is still read.
 */
static char *
exchange(int fd, const char *path, const char *req, size_t len, size_t *reply_len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap), *nl = NULL;
	int send_errno = 0;

	if (buf == NULL) {
		ctl_error("out of memory");
		return NULL;
	}
	for (size_t off = 0; off < len;) {
		ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			send_errno = errno;
			break;
		}
		off += (size_t)w;
	}
	while (nl == NULL) {
		ssize_t r;

		if (n == cap) {
			char *bigger;

			if (cap >= REPLY_MAX) {
				ctl_error("reply from %s longer than %u bytes",
					path, REPLY_MAX);
				free(buf);
				return NULL;
			}
			if ((bigger = realloc(buf, cap * 2)) == NULL) {
				ctl_error("out of memory");
				free(buf);
				return NULL;
			}
			buf = bigger;
			cap *= 2;
		}
		r = recv(fd, buf + n, cap - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int e = r < 0 ? errno : send_errno;

			ctl_error("wcached closed the control connection %s "
					"without a reply%s%s", path, e ? ": " : "",
				e ? strerror(e) : "");
			free(buf);
			return NULL;
		}
		nl = memchr(buf + n, '\n', (size_t)r);
		n += (size_t)r;
	}
	*nl = '\0';
	*reply_len = (size_t)(nl - buf);
	return buf;
}

/* ---- reading replies ---------------------------------------------------- */

/* The fields every reply may have. Strings are malloc'd, NULL if absent. */
struct reply {
	int ok;              /* -1: no "ok" */
	char *error;
	char *message;
	char *model;
	char *text;
	size_t text_len;
	uint64_t generation;
};

/* Frees the strings of a reply (its struct is the caller's). */
static void
reply_free(struct reply *r)
{
	free(r->error);
	free(r->message);
	free(r->model);
	free(r->text);
}

/* Reads a string value into a malloc'd, NUL-terminated copy in *out (the
 * old one freed) and its length in *len when len is not NULL. */
static int
read_string(struct jr *j, char **out, size_t *len)
{
	struct jr_str s;
	char *copy;
	int r;

	if ((r = jr_string(j, &s)) < 0)
		return r;
	if ((copy = malloc(s.len + 1)) == NULL)
		return -ENOMEM;
	if ((r = jr_str_decode(&s, copy, s.len + 1)) < 0) {
		free(copy);
		return r;
	}
	free(*out);
	*out = copy;
	if (len != NULL)
		*len = s.len;
	return 0;
}

/*
 * Reads a number that may have a fraction (uptime_seconds), or skips a
 * value of another type and leaves *out. The reader has no float accessor,
 * so the number's text is taken from the cursor's position around
 * jr_skip(), which validates its grammar.
 */
static int
read_double(struct jr *j, double *out)
{
	const char *start;
	char text[64];
	int r;

	if (jr_peek(j) != JR_NUMBER)
		return jr_skip(j);
	start = jr_pos(j);
	if ((r = jr_skip(j)) < 0)
		return r;
	snprintf(text, sizeof(text), "%.*s", (int)(jr_pos(j) - start), start);
	*out = strtod(text, NULL);
	return 0;
}

/* Reads one member's value into the struct at dst as field says. */
static int
read_field(struct jr *j, const struct ctl_field *field, void *dst)
{
	void *member = (char *)dst + field->offset;
	enum jr_type t;

	switch (field->type) {
	case CTL_STRING:
		if (jr_peek(j) == JR_NULL) /* absent: stays NULL */
			return jr_skip(j);
		return read_string(j, member, NULL);
	case CTL_U64:
		if (jr_peek(j) != JR_NUMBER)
			return jr_skip(j);
		return jr_u64(j, member);
	case CTL_BOOL:
		t = jr_peek(j);
		if (t == JR_TRUE || t == JR_FALSE)
			*(int *)member = t == JR_TRUE;
		return jr_skip(j);
	case CTL_DOUBLE:
		return read_double(j, member);
	}
	return jr_skip(j);
}

/* Reads an object into dst by a table of fields (see ctl_internal.h). */
int
ctl_read_object(struct jr *j, const struct ctl_field *fields, size_t nfields, void *dst,
	ctl_member_fn *other)
{
	struct jr_str key;
	int r;

	if ((r = jr_object_begin(j)) < 0)
		return r;
	while ((r = jr_object_next(j, &key)) == 1) {
		const struct ctl_field *f = NULL;

		for (size_t i = 0; i < nfields && f == NULL; i++)
			if (jr_str_eq(&key, fields[i].key, strlen(fields[i].key)))
				f = &fields[i];
		if (f != NULL)
			r = read_field(j, f, dst);
		else if (other != NULL)
			r = other(j, &key, dst);
		else
			r = jr_skip(j);
		if (r < 0)
			return r;
	}
	return r;
}

/* Parses a reply line that is one object; prints why not (ctl_internal.h). */
int
ctl_parse_reply(const char *line, size_t len, const struct ctl_field *fields, size_t nfields,
	void *dst, ctl_member_fn *other)
{
	struct jr j;
	int r;

	jr_init(&j, line, len);
	if ((r = ctl_read_object(&j, fields, nfields, dst, other)) < 0 || (r = jr_finish(&j)) < 0) {
		if (r == -ENOMEM)
			ctl_error("out of memory");
		else
			ctl_error("malformed reply from wcached: %s at byte %zu",
				jr_errmsg(&j)[0] ? jr_errmsg(&j) : "unexpected value",
				jr_erroff(&j));
		return -1;
	}
	return 0;
}

/* "text" (the metrics exposition) keeps its length: it is written as is. */
static int
reply_member(struct jr *j, const struct jr_str *key, void *dst)
{
	struct reply *out = dst;

	if (jr_str_eq(key, "text", 4))
		return read_string(j, &out->text, &out->text_len);
	return jr_skip(j);
}

/* Parses the common fields of a reply. Returns 0 or -1 (printed). */
static int
reply_parse(const char *line, size_t len, struct reply *out)
{
	static const struct ctl_field fields[] = {
		{ "ok", CTL_BOOL, offsetof(struct reply, ok) },
		{ "error", CTL_STRING, offsetof(struct reply, error) },
		{ "message", CTL_STRING, offsetof(struct reply, message) },
		{ "model", CTL_STRING, offsetof(struct reply, model) },
		{ "generation", CTL_U64, offsetof(struct reply, generation) },
	};

	memset(out, 0, sizeof(*out));
	out->ok = -1;
	if (ctl_parse_reply(line, len, fields, sizeof(fields) / sizeof(fields[0]), out,
		reply_member) < 0) {
		reply_free(out);
		return -1;
	}
	if (out->ok < 0 || (!out->ok && out->error == NULL)) {
		reply_free(out);
		ctl_error("malformed reply from wcached: no \"ok\"%s",
			out->ok == 0 ? " or no \"error\"" : "");
		return -1;
	}
	return 0;
}

/* ---- the commands ------------------------------------------------------- */

/* Appends word to the request, in double quotes when it needs them.
 * Returns -1 (printed) for a control character or an overlong request. */
static int
append_word(char *req, size_t *len, const char *word)
{
	bool quote = word[0] == '\0' || strpbrk(word, " \t\"\\") != NULL;
	size_t n = *len, need = (n > 0) + (quote ? 2 : 0);

	for (const unsigned char *p = (const unsigned char *)word; *p != '\0'; p++) {
		if (*p < 0x20 || *p == 0x7f) {
			ctl_error("argument \"%s\" holds a control character", word);
			return -1;
		}
		need += *p == '"' || *p == '\\' ? 2 : 1;
	}
	if (need > CONTROL_LINE_MAX - n) {
		ctl_error("request longer than %d bytes", CONTROL_LINE_MAX);
		return -1;
	}
	if (n > 0)
		req[n++] = ' ';
	if (quote)
		req[n++] = '"';
	for (const char *p = word; *p != '\0'; p++) {
		if (*p == '"' || *p == '\\')
			req[n++] = '\\';
		req[n++] = *p;
	}
	if (quote)
		req[n++] = '"';
	*len = n;
	return 0;
}

/* Makes a relative PATH absolute (without resolving symlinks: the daemon
 * re-checks the path as given on reload). Returns malloc'd or NULL. */
static char *
absolute_path(const char *path)
{
	char cwd[PATH_MAX], *out;
	size_t need;

	if (path[0] == '/')
		return strdup(path);
	if (getcwd(cwd, sizeof(cwd)) == NULL) {
		ctl_error("getcwd: %s", strerror(errno));
		return NULL;
	}
	need = strlen(cwd) + strlen(path) + 2;
	if ((out = malloc(need)) != NULL)
		snprintf(out, need, "%s/%s", cwd, path);
	return out;
}

/* Shows a successful reply of a command other than status and metrics. */
static void
print_result(const struct ctl_control_cmd *cmd, const struct reply *r, char **args)
{
	if (cmd->id == CONTROL_CMD_LOAD || (cmd->id == CONTROL_CMD_RELOAD && r->model)) {
		printf("model ");
		escape_print(stdout, r->model != NULL ? r->model : args[0]);
		printf(": ");
	} else if (cmd->wire->min_args == 1 && args[0] != NULL) {
		printf("model ");
		escape_print(stdout, args[0]);
		printf(": ");
	}
	escape_print(stdout, r->message != NULL ? r->message : "ok");
	putchar('\n');
}

/* --json: the daemon's reply line as it came, but for what a terminal acts
 * on inside its strings (ctl_json_text()). */
static void
print_reply(const char *line, size_t len)
{
	ctl_json_text(stdout, line, len);
	putchar('\n');
}

/*
 * The metrics exposition (len bytes, which may hold a NUL): as it is when
 * standard output is not a terminal, for the scraper or file that reads
 * it; on a terminal, every control character but the newlines that end its
 * lines escaped (escape_step()), as the daemon's other strings are.
 */
static void
print_exposition(const char *text, size_t len)
{
	const unsigned char *p = (const unsigned char *)text, *end = p + len;
	char out[ESCAPE_STEP_MAX];
	size_t n, out_len;

	if (!isatty(STDOUT_FILENO)) {
		ctl_fwrite(text, len, stdout);
		return;
	}
	for (; p < end; p += n) {
		if (*p == '\n') {
			ctl_fwrite("\n", 1, stdout);
			n = 1;
			continue;
		}
		n = escape_step(p, end, out, &out_len);
		ctl_fwrite(out, out_len, stdout);
	}
}

/* Resolves the control socket's path: --control; else -c CONFIG's control
 * key (the default when CONFIG sets none); else $WCACHE_CONTROL; else the
 * default. Returns malloc'd, or NULL (printed). */
static char *
socket_path(const char *config, const char *control)
{
	const char *env = getenv(CONTROL_ENV);
	char *path = NULL;

	if (control != NULL) {
		path = strdup(control);
		path_from.named_by = "--control";
	} else if (config != NULL) {
		if (control_from_config(config, &path) < 0)
			return NULL;
		path_from.config = config;
		if (path == NULL) /* the daemon's default, whatever the environment says */
			path = strdup(DEFAULT_CONTROL_PATH);
	} else {
		path = strdup(env != NULL && env[0] != '\0' ? env : DEFAULT_CONTROL_PATH);
		path_from.named_by = env != NULL && env[0] != '\0' ? "$" CONTROL_ENV : NULL;
	}
	if (path == NULL)
		ctl_error("out of memory");
	return path;
}

/* One request and its reply on a new connection (internal.h). */
char *
ctl_request(const char *path, const char *request, size_t len, size_t *reply_len)
{
	int fd = control_connect(path);
	char *reply;

	if (fd < 0)
		return NULL;
	reply = exchange(fd, path, request, len, reply_len);
	close(fd);
	return reply;
}

/* The argument of args a usage error names: the placeholders of the
 * command's synopsis ("NAME PATH [pin=...]") from the first missing one. */
static void
missing_args(const struct ctl_control_cmd *cmd, size_t given, char *out, size_t cap)
{
	const char *p = cmd->args;

	for (size_t i = 0; i < given && *p != '\0'; i++) {
		p += strcspn(p, " ");
		p += strspn(p, " ");
	}
	/* Only the mandatory words: up to the first optional "[". */
	snprintf(out, cap, "%.*s", (int)strcspn(p, "["), p);
	for (size_t n = strlen(out); n > 0 && out[n - 1] == ' '; n--)
		out[n - 1] = '\0';
}

/* Parsed command line of a control command. */
struct control_args {
	const char *config, *control;
	int json, http;
	double timeout;
	char **words;  /* the arguments, malloc'd array of pointers into argv */
	size_t nwords;
};

/*
 * Parses the options and arguments after the command name. Returns 0, 1
 * after --help (printed), or 2 after a usage error (one line on stderr,
 * and the error object on stdout with --json).
 */
static int
parse_args(const struct ctl_control_cmd *cmd, int argc, char **argv, struct control_args *a)
{
	bool options = true;

	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];

		if (options && (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0)) {
			ctl_control_usage(stdout, cmd);
			return 1;
		} else if (options && strcmp(s, "--json") == 0) {
			a->json = 1;
		} else if (options && cmd->id == CONTROL_CMD_METRICS && strcmp(s, "--http") == 0) {
			a->http = 1;
		} else if (options && (strcmp(s, "--control") == 0 || strcmp(s, "-c") == 0 ||
			strcmp(s, "--config") == 0 || (cmd->id == CONTROL_CMD_METRICS &&
			strcmp(s, "--timeout") == 0))) {
			if (i + 1 == argc)
				return ctl_usage_error(cmd->wire->name, "%s needs a value", s);
			if (strcmp(s, "--control") == 0)
				a->control = argv[++i];
			else if (strcmp(s, "--timeout") == 0) {
				char *end;

				a->timeout = strtod(argv[++i], &end);
				if (*end != '\0' || !(a->timeout > 0 && a->timeout <= 3600))
					return ctl_usage_error(cmd->wire->name, "--timeout takes "
						"seconds, more than 0 and at most 3600, not \"%s\"",
						argv[i]);
			} else
				a->config = argv[++i];
		} else if (options && strncmp(s, "--config=", 9) == 0) {
			a->config = s + 9;
		} else if (options && strncmp(s, "--control=", 10) == 0) {
			a->control = s + 10;
		} else if (options && strcmp(s, "--") == 0) {
			options = false;
		} else if (options && s[0] == '-' && s[1] != '\0') {
			return ctl_usage_error(cmd->wire->name, "unknown option \"%s\"", s);
		} else if ((int)a->nwords >= cmd->max_args) {
			return ctl_usage_error(cmd->wire->name,
				"unexpected argument \"%s\": %s takes %s",
				s, cmd->wire->name, cmd->args[0] ? cmd->args : "no arguments");
		} else {
			a->words[a->nwords++] = argv[i];
		}
	}
	if ((a->config != NULL && a->config[0] == '\0') ||
		(a->control != NULL && a->control[0] == '\0'))
		return ctl_usage_error(cmd->wire->name, "%s needs a path, not an empty one",
			a->control != NULL && a->control[0] == '\0' ? "--control" : "--config");
	if ((int)a->nwords < cmd->min_args) {
		char what[128];

		missing_args(cmd, a->nwords, what, sizeof(what));
		return ctl_usage_error(cmd->wire->name, "missing %s", what);
	}
	if (a->config != NULL && a->control != NULL)
		return ctl_usage_error(cmd->wire->name,
			"give -c CONFIG or --control PATH, not both");
	if (a->timeout > 0 && !a->http)
		return ctl_usage_error(cmd->wire->name, "--timeout goes with --http");
	if (a->json && a->http) /* its output is an HTTP reply, for a scraper */
		return ctl_usage_error(cmd->wire->name, "--json does not go with --http (its "
			"output is an HTTP reply)");
	return 0;
}

/*
 * Checks the words wcached would refuse by their syntax alone, by the rules
 * it checks them with (proto/): load's NAME and pin= option, drop's KEY.
 * Returns 0, or CTL_EXIT_USAGE after the usage error: a mistyped word is
 * the command line's fault, said so whether or not wcached runs.
 */
static int
check_words(const struct ctl_control_cmd *cmd, char **words, size_t nwords)
{
	const char *name = cmd->wire->name;
	enum pin_mode pin;

	if (cmd->id == CONTROL_CMD_LOAD && nwords >= 1 && !model_name_valid(words[0]))
		return ctl_usage_error(name, "invalid model name \"%s\": use 1 to %d letters, "
			"digits, '.', '_' or '-', not starting with '.' or '-'", words[0],
			MODEL_NAME_MAX);
	if (cmd->id == CONTROL_CMD_LOAD && nwords >= 3 && (strncmp(words[2], "pin=", 4) != 0 ||
		pin_mode_parse(words[2] + 4, &pin) < 0))
		return ctl_usage_error(name, "bad option \"%s\": use pin=none, pin=metadata or "
			"pin=all", words[2]);
	if (cmd->id == CONTROL_CMD_DROP && nwords >= 2 &&
		!wire_key_valid(words[1], strlen(words[1])))
		return ctl_usage_error(name, "invalid key \"%s\": a derived artifact's key is 1 "
			"to %u of A-Z a-z 0-9 . _ + -", words[1], WIRE_MAX_KEY);
	return 0;
}

/* Builds the request line from the command and its arguments. */
static int
make_request(const struct ctl_control_cmd *cmd, char **words, size_t nwords, char *req,
	size_t *len)
{
	*len = 0;
	if (append_word(req, len, cmd->wire->name) < 0)
		return -1;
	/* status NAME... is answered from the whole status. */
	for (size_t i = 0; !cmd->filter && i < nwords; i++)
		if (append_word(req, len, words[i]) < 0)
			return -1;
	req[(*len)++] = '\n';
	return 0;
}

/* Runs a control command (internal.h). */
int
ctl_control(const struct ctl_control_cmd *cmd, int argc, char **argv, const char *config,
	const char *control, int json)
{
	struct control_args a = { .config = config, .control = control, .json = json };
	char req[CONTROL_LINE_MAX + 2], *path = NULL, *reply_line = NULL, *abs = NULL;
	size_t len = 0, reply_len = 0;
	struct reply r;
	int status = CTL_EXIT_FAILURE;

	if ((a.words = calloc((size_t)argc + 1, sizeof(*a.words))) == NULL) {
		ctl_error("out of memory");
		return CTL_EXIT_FAILURE;
	}
	if ((status = parse_args(cmd, argc, argv, &a)) != 0) {
		if (status == CTL_EXIT_USAGE && a.json)
			ctl_json_error();
		free(a.words);
		return status == 1 ? 0 : status;
	}
	if ((status = check_words(cmd, a.words, a.nwords)) != 0) {
		status = ctl_json_usage(a.json, status);
		goto out;
	}
	status = CTL_EXIT_FAILURE;
	if (cmd->id == CONTROL_CMD_LOAD) {
		/* parse_args() required the table's two words; said again for
		 * the analyser, which cannot see the table. */
		if (a.nwords < 2)
			goto out;
		/* An empty word (an unset variable: load llama "$NEWPATH")
		 * would be the current directory, and swap the model to it. */
		if (a.words[1][0] == '\0') {
			status = ctl_json_usage(a.json, ctl_usage_error(cmd->wire->name,
				"PATH is empty"));
			goto out;
		}
		if ((abs = absolute_path(a.words[1])) == NULL)
			goto out;
		a.words[1] = abs;
	}
	if (make_request(cmd, a.words, a.nwords, req, &len) < 0)
		goto out;
	path_from.reload = cmd->id == CONTROL_CMD_RELOAD && a.nwords == 0;
	path = socket_path(a.config, a.control);
	if (a.http) { /* answers 503 when path is NULL */
		status = ctl_http_metrics(path, a.timeout > 0 ? a.timeout : CTL_HTTP_TIMEOUT);
		goto out;
	}
	if (path == NULL || (reply_line = ctl_request(path, req, len, &reply_len)) == NULL ||
		reply_parse(reply_line, reply_len, &r) < 0)
		goto out;
	status = r.ok ? CTL_EXIT_OK : CTL_EXIT_FAILURE;
	if (!r.ok) {
		ctl_error("%s", r.error);
		if (a.json)
			print_reply(reply_line, reply_len);
	} else if (cmd->id == CONTROL_CMD_STATUS) {
		status = ctl_status_show(reply_line, reply_len, a.words, a.nwords, a.json);
	} else if (a.json) {
		print_reply(reply_line, reply_len);
	} else if (cmd->id == CONTROL_CMD_METRICS) {
		if (r.text != NULL)
			print_exposition(r.text, r.text_len);
	} else {
		print_result(cmd, &r, a.words);
	}
	reply_free(&r);
	free(reply_line);
	free(path);
	free(abs);
	free(a.words);
	return status;
out:
	/* Nothing came from the daemon: the error object is ours. */
	if (a.json && !a.http && status == CTL_EXIT_FAILURE)
		ctl_json_error();
	free(reply_line);
	free(path);
	free(abs);
	free(a.words);
	return status;
}
