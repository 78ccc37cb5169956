/*
 * ctl_control.c: the wcachectl commands that talk to wcached's control
 * socket: status, load, unload, reload, pin, unpin, evict, metrics.
 *
 * Each command is one request line and one reply line holding a JSON object
 * (daemon/control.h describes the protocol). wcachectl finds the socket
 * (--control, the `control` key of -c CONFIG, $WCACHE_CONTROL, or the
 * default), sends the line, waits for the reply, which for load and reload
 * comes when the daemon has finished, and shows it: a table or a sentence by
 * default, the reply itself with --json, the exposition text for metrics.
 * The exit status is 0 when the reply says ok, 1 with the daemon's error on
 * stderr otherwise (or when the daemon cannot be reached), 2 for a usage
 * error.
 *
 * Replies are parsed with the strict reader of json.h. Strings from the
 * daemon are printed with control characters escaped, so a hostile model
 * file's name cannot drive the terminal.
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
#include <sys/un.h>
#include <unistd.h>

#include "bounds.h" /* CONTROL_LINE_MAX, CONFIG_LINE_MAX */
#include "ctl.h"
#include "ctl_internal.h"
#include "defaults.h"
#include "json.h"

#define REPLY_MAX (256u << 20)      /* a status of thousands of models fits */

/* ---- finding the socket ------------------------------------------------- */

/* Trims spaces and tabs at both ends of s, in place. */
static char *
trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
		*--e = '\0';
	return s;
}

/*
 * Reads the `control` key of the [wcached] section of the configuration at
 * path, with the syntax of daemon/config.h (comments with ';' or '#' at the
 * start of a line, ';' after whitespace inside one); a relative value is
 * joined with the configuration's directory. Stores a malloc'd path, or NULL
 * when the file sets none. Returns 0, or -1 after printing the error.
 */
static int
control_from_config(const char *path, char **out)
{
	FILE *f = fopen(path, "re");
	char *line = malloc(CONFIG_LINE_MAX), *value = NULL;
	bool in_wcached = false;
	unsigned lineno = 0;

	*out = NULL;
	if (f == NULL || line == NULL) {
		fprintf(stderr, "wcachectl: %s: %s\n", path, strerror(f == NULL ? errno : ENOMEM));
		if (f != NULL)
			fclose(f);
		free(line);
		return -1;
	}
	while (fgets(line, CONFIG_LINE_MAX, f) != NULL) {
		char *s = trim(line), *eq, *v;

		lineno++;
		if (*s == '\0' || *s == ';' || *s == '#')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');

			if (end == NULL)
				continue; /* the daemon reports it; we only need one key */
			*end = '\0';
			in_wcached = strcmp(trim(s + 1), "wcached") == 0;
			continue;
		}
		if (!in_wcached || (eq = strchr(s, '=')) == NULL)
			continue;
		*eq = '\0';
		if (strcmp(trim(s), "control") != 0)
			continue;
		v = eq + 1;
		for (char *p = v; *p != '\0'; p++)
			if (*p == ';' && p > v && (p[-1] == ' ' || p[-1] == '\t')) {
				*p = '\0';
				break;
			}
		v = trim(v);
		if (*v == '\0') {
			fprintf(stderr, "wcachectl: %s:%u: empty control path\n", path, lineno);
			goto fail;
		}
		free(value);
		if ((value = strdup(v)) == NULL)
			goto oom;
	}
	if (ferror(f)) {
		fprintf(stderr, "wcachectl: %s: %s\n", path, strerror(errno));
		goto fail;
	}
	if (value != NULL && value[0] != '/') {
		/* Relative to the directory of the configuration file. */
		const char *slash = strrchr(path, '/');
		char cwd[PATH_MAX], *joined;
		size_t need;

		if (path[0] != '/' && getcwd(cwd, sizeof(cwd)) == NULL) {
			fprintf(stderr, "wcachectl: getcwd: %s\n", strerror(errno));
			goto fail;
		}
		need = strlen(cwd) + strlen(path) + strlen(value) + 3;
		if ((joined = malloc(need)) == NULL)
			goto oom;
		if (path[0] == '/')
			snprintf(joined, need, "%.*s/%s", (int)(slash - path), path, value);
		else if (slash != NULL)
			snprintf(joined, need, "%s/%.*s/%s", cwd, (int)(slash - path), path, value);
		else
			snprintf(joined, need, "%s/%s", cwd, value);
		free(value);
		value = joined;
	}
	fclose(f);
	free(line);
	*out = value;
	return 0;
oom:
	fprintf(stderr, "wcachectl: out of memory\n");
fail:
	fclose(f);
	free(line);
	free(value);
	return -1;
}

/* ---- talking to the daemon ---------------------------------------------- */

/* Connects to the control socket; prints why not and returns -1. */
static int
control_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "wcachectl: %s: control socket path longer than %zu bytes\n", path,
			sizeof(sa.sun_path) - 1);
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) == -1) {
		fprintf(stderr, "wcachectl: socket: %s\n", strerror(errno));
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return fd;
	e = errno;
	close(fd);
	if (e == ENOENT || e == ECONNREFUSED)
		fprintf(stderr, "wcachectl: wcached is not running: no control socket at %s (%s)\n",
			path, strerror(e));
	else if (e == EACCES || e == EPERM)
		fprintf(stderr, "wcachectl: %s: permission denied: the control socket is for "
				"root, wcached's user and its control_group\n", path);
	else
		fprintf(stderr, "wcachectl: cannot connect to wcached's control socket %s: %s\n",
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
		fprintf(stderr, "wcachectl: out of memory\n");
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
				fprintf(stderr, "wcachectl: reply from %s longer than %u bytes\n",
					path, REPLY_MAX);
				free(buf);
				return NULL;
			}
			if ((bigger = realloc(buf, cap * 2)) == NULL) {
				fprintf(stderr, "wcachectl: out of memory\n");
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

			fprintf(stderr, "wcachectl: wcached closed the control connection %s "
					"without a reply%s%s\n", path, e ? ": " : "",
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
	jr_str_decode(&s, copy);
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
			fprintf(stderr, "wcachectl: out of memory\n");
		else
			fprintf(stderr, "wcachectl: malformed reply from wcached: %s at byte %zu\n",
				jr_errmsg(&j)[0] ? jr_errmsg(&j) : "unexpected value", jr_erroff(&j));
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
		fprintf(stderr, "wcachectl: malformed reply from wcached: no \"ok\"%s\n",
			out->ok == 0 ? " or no \"error\"" : "");
		return -1;
	}
	return 0;
}

/* Writes s with control characters as \xNN, for a terminal. */
void
ctl_print_safe(FILE *f, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
		if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\x%02x", *p);
		else
			fputc(*p, f);
	}
}

/* ---- the commands ------------------------------------------------------- */

static const struct control_command {
	const char *name;
	int min_args, max_args;
	const char *args;
	const char *help;
} control_commands[] = {
	{ "status", 0, 0, "",
		"Shows wcached's version, uptime and client count, then one row per model:\n"
		"its current generation, state (loading, warming, ready, cold, modified,\n"
		"failed), size, bytes resident in the page cache, pin mode and the clients\n"
		"attached to the current generation. Below the table: other generations\n"
		"still open (a replacement warming, old ones that clients still hold,\n"
		"those of unloaded models) and each model's last load error.\n" },
	{ "load", 2, 3, "NAME PATH [pin=none|metadata|all]",
		"Serves the model at PATH (a safetensors file, a shard index, a directory\n"
		"holding one, or a WEIG file) as NAME. When NAME is served already, PATH\n"
		"becomes its next generation: it is validated and warmed while the current\n"
		"one keeps serving, and replaces it when warm; clients holding the old\n"
		"generation keep it until they release it. A relative PATH is taken from\n"
		"the current directory. pin= sets what stays locked in memory (default:\n"
		"the model's current setting, or metadata). Waits until the daemon has\n"
		"validated PATH and prints the new generation's number; a PATH that fails\n"
		"validation is an error and the current generation keeps serving.\n" },
	{ "unload", 1, 1, "NAME",
		"Stops serving NAME: new attaches fail. Clients that hold it keep their\n"
		"mappings; its generations close when they release them.\n" },
	{ "reload", 0, 1, "[NAME]",
		"With NAME: re-checks the model's files and, when one was replaced (or the\n"
		"model had failed), loads them as the next generation. Without NAME:\n"
		"re-reads the configuration file, as SIGHUP does, adding, dropping and\n"
		"reloading models. Waits until the reload has finished.\n" },
	{ "pin", 1, 1, "NAME",
		"Locks every page of NAME's current generation in memory (mlock), within\n"
		"RLIMIT_MEMLOCK, so memory pressure never evicts it.\n" },
	{ "unpin", 1, 1, "NAME",
		"Unlocks NAME's pages except its index and file headers (pin=metadata).\n" },
	{ "evict", 1, 1, "NAME",
		"Drops NAME's files from the page cache (pages that no process maps); the\n"
		"model shows as cold until a client attaches it again. Refused for a\n"
		"pinned model.\n" },
	{ "metrics", 0, 0, "",
		"Prints wcached's metrics in the Prometheus text exposition format: per\n"
		"model bytes, resident bytes, generation, attached clients, attach, error\n"
		"and swap counters, warm-up seconds; daemon uptime and clients. With\n"
		"--json, the daemon's reply holds the text in \"text\".\n" },
};

#define NCONTROL (sizeof(control_commands) / sizeof(control_commands[0]))

static const char options_help[] =
	"  -c, --config CONFIG  find the control socket in CONFIG's [wcached] section\n"
	"      --control PATH   the control socket (default $WCACHE_CONTROL, else\n"
	"                       " DEFAULT_CONTROL_PATH ")\n"
	"      --json           print the daemon's JSON reply as it came\n"
	"  -h, --help           this help\n";

static void
command_usage(FILE *f, const struct control_command *cmd)
{
	fprintf(f, "usage: wcachectl [-c CONFIG | --control PATH] [--json] %s%s%s\n\n%s\n%s",
		cmd->name, cmd->args[0] ? " " : "", cmd->args, cmd->help, options_help);
}

/* Appends word to the request, in double quotes when it needs them.
 * Returns -1 (printed) for a control character or an overlong request. */
static int
append_word(char *req, size_t *len, const char *word)
{
	bool quote = word[0] == '\0' || strpbrk(word, " \t\"\\") != NULL;
	size_t n = *len, need = (n > 0) + (quote ? 2 : 0);

	for (const unsigned char *p = (const unsigned char *)word; *p != '\0'; p++) {
		if (*p < 0x20 || *p == 0x7f) {
			fprintf(stderr, "wcachectl: argument \"");
			ctl_print_safe(stderr, word);
			fprintf(stderr, "\" holds a control character\n");
			return -1;
		}
		need += *p == '"' || *p == '\\' ? 2 : 1;
	}
	if (need > CONTROL_LINE_MAX - n) {
		fprintf(stderr, "wcachectl: request longer than %d bytes\n", CONTROL_LINE_MAX);
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
		fprintf(stderr, "wcachectl: getcwd: %s\n", strerror(errno));
		return NULL;
	}
	need = strlen(cwd) + strlen(path) + 2;
	if ((out = malloc(need)) != NULL)
		snprintf(out, need, "%s/%s", cwd, path);
	return out;
}

/* Shows a successful reply of a command other than status and metrics. */
static void
print_result(const struct control_command *cmd, const struct reply *r, char **args)
{
	if (strcmp(cmd->name, "load") == 0 || (strcmp(cmd->name, "reload") == 0 && r->model)) {
		printf("model ");
		ctl_print_safe(stdout, r->model != NULL ? r->model : args[0]);
		printf(": ");
	} else if (cmd->min_args == 1) {
		printf("model ");
		ctl_print_safe(stdout, args[0]);
		printf(": ");
	}
	ctl_print_safe(stdout, r->message != NULL ? r->message : "ok");
	putchar('\n');
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
	} else if (config != NULL) {
		if (control_from_config(config, &path) < 0)
			return NULL;
		if (path == NULL) /* the daemon's default, whatever the environment says */
			path = strdup(DEFAULT_CONTROL_PATH);
	} else {
		path = strdup(env != NULL && env[0] != '\0' ? env : DEFAULT_CONTROL_PATH);
	}
	if (path == NULL)
		fprintf(stderr, "wcachectl: out of memory\n");
	return path;
}

/*
 * Runs the control command argv[0] with its arguments. config and control
 * are the global -c and --control options (or NULL), json the global --json.
 * Returns the exit status.
 */
int
ctl_control(int argc, char **argv, const char *config, const char *control, int json)
{
	const struct control_command *cmd = NULL;
	char *args[4], req[CONTROL_LINE_MAX + 2], *path = NULL, *reply_line = NULL, *abs = NULL;
	size_t nargs = 0, len = 0, reply_len = 0;
	struct reply r;
	int fd = -1, status = 1;

	for (size_t i = 0; i < NCONTROL; i++)
		if (strcmp(argv[0], control_commands[i].name) == 0)
			cmd = &control_commands[i];
	if (cmd == NULL) {
		fprintf(stderr, "wcachectl: unknown command \"%s\"\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			command_usage(stdout, cmd);
			return 0;
		} else if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "--control") == 0 || strcmp(argv[i], "-c") == 0 ||
			strcmp(argv[i], "--config") == 0) {
			if (i + 1 == argc) {
				fprintf(stderr, "wcachectl: %s needs a value\n", argv[i]);
				return 2;
			}
			if (strcmp(argv[i], "--control") == 0)
				control = argv[++i];
			else
				config = argv[++i];
		} else if (strncmp(argv[i], "--config=", 9) == 0) {
			config = argv[i] + 9;
		} else if (strncmp(argv[i], "--control=", 10) == 0) {
			control = argv[i] + 10;
		} else if (strcmp(argv[i], "--") == 0) {
			while (++i < argc && nargs < 4)
				args[nargs++] = argv[i];
			if (i < argc)
				nargs = 5; /* too many */
			break;
		} else if (argv[i][0] == '-' && argv[i][1] != '\0') {
			fprintf(stderr, "wcachectl %s: unknown option \"%s\"\n\n", cmd->name, argv[i]);
			command_usage(stderr, cmd);
			return 2;
		} else if (nargs < 4) {
			args[nargs++] = argv[i];
		} else {
			nargs = 5;
		}
	}
	if ((int)nargs < cmd->min_args || (int)nargs > cmd->max_args) {
		command_usage(stderr, cmd);
		return 2;
	}
	if (config != NULL && control != NULL) {
		fprintf(stderr, "wcachectl: give -c CONFIG or --control PATH, not both\n");
		return 2;
	}
	if (strcmp(cmd->name, "load") == 0) {
		if ((abs = absolute_path(args[1])) == NULL)
			return 1;
		args[1] = abs;
	}
	if (append_word(req, &len, cmd->name) < 0)
		goto out;
	for (size_t i = 0; i < nargs; i++)
		if (append_word(req, &len, args[i]) < 0)
			goto out;
	req[len++] = '\n';
	if ((path = socket_path(config, control)) == NULL || (fd = control_connect(path)) < 0)
		goto out;
	if ((reply_line = exchange(fd, path, req, len, &reply_len)) == NULL)
		goto out;
	if (reply_parse(reply_line, reply_len, &r) < 0)
		goto out;
	status = r.ok ? 0 : 1;
	if (!r.ok) {
		fprintf(stderr, "wcachectl: ");
		ctl_print_safe(stderr, r.error);
		fputc('\n', stderr);
		if (json)
			printf("%s\n", reply_line);
	} else if (json) {
		printf("%s\n", reply_line);
	} else if (strcmp(cmd->name, "metrics") == 0) {
		if (r.text != NULL)
			fwrite(r.text, 1, r.text_len, stdout);
	} else if (strcmp(cmd->name, "status") == 0) {
		if (ctl_status_print(reply_line, reply_len) < 0)
			status = 1;
	} else {
		print_result(cmd, &r, args);
	}
	reply_free(&r);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "wcachectl: writing the output: %s\n", strerror(errno));
		status = 1;
	}
out:
	if (fd >= 0)
		close(fd);
	free(reply_line);
	free(path);
	free(abs);
	return status;
}
