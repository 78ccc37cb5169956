/*
 * commands.c: wcachectl's commands, the help that lists them, and what
 * every command's output goes through: its errors, its JSON, and the check
 * that standard output was written.
 *
 * Two kinds: the control commands, which are those of wcached's control
 * socket (the table of proto/control_cmds.h gives their names, words and
 * one-line summaries; control.c runs them), and the commands that work on
 * files or attach like a worker (inspect, convert, attach), which take
 * their own options. This file adds to each control command what only
 * wcachectl needs: the description its --help prints and, where wcachectl
 * takes other words than it sends, its own synopsis. A command the table
 * gains runs here at once; its description is all this file needs, and the
 * unit test (tests/unit/ctl/test_commands.c) fails until it is written.
 *
 * Every string wcachectl prints for a person that came from a model file,
 * from wcached or from the command line goes through escape_print()
 * (base/escape.h): an escape sequence in a model's name, a path or an error
 * that quotes them is shown as text (\x1b, \u009b), never sent to the
 * terminal. Errors are escaped once, here, in ctl_error() and
 * ctl_usage_error(), so their callers pass the text as it came. JSON output
 * goes through ctl_json_text() or ctl_json_string(), which escape what a
 * terminal acts on inside JSON strings too.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "base/escape.h"
#include "base/json.h"
#include "proto/control_cmds.h"
#include "proto/control_proto.h"
#include "proto/defaults.h"

/* The commands that do not talk to the control socket, and where each
 * takes --json: the usage error for a --json before the command says so. */
static const struct {
	const char *name;
	int (*run)(int, char **);
	const char *summary;
	const char *json; /* the command line with its --json; NULL: none */
} file_commands[] = {
	{ "inspect", ctl_inspect, "validate a model file and list its tensors",
		"wcachectl inspect --json PATH" },
	{ "convert", ctl_convert, "convert between safetensors and WEIG", NULL },
	{ "attach", ctl_attach, "attach a model through wcached and time it",
		"wcachectl attach NAME --json" },
};

#define NFILE_COMMANDS (sizeof(file_commands) / sizeof(file_commands[0]))

/*
 * What wcachectl adds to each control command, by id: the description of
 * `wcachectl COMMAND --help`, and for status and metrics the synopsis of
 * what wcachectl takes (status's NAMEs choose the rows to show and are not
 * sent; metrics takes --http). help has none: wcachectl answers it itself,
 * with ctl_help().
 */
static const struct {
	const char *args; /* NULL: the request's synopsis */
	bool filter;      /* any number of NAMEs, kept by wcachectl */
	const char *help;
} control_details[CONTROL_CMD_COUNT] = {
	[CONTROL_CMD_STATUS] = { "[NAME...]", true,
		"Shows wcached's version, uptime and client count, then one row per model\n"
		"(only the NAMEs given, when there are any): its current generation, state\n"
		"(loading, warming with the percent warmed, ready, cold, modified, failed),\n"
		"size, bytes resident in the page cache, what is locked in memory (PINNED:\n"
		"none, metadata or all, as applied; a note below says when it is less than\n"
		"asked for) and the clients attached to the current generation. Below the\n"
		"table: other generations still open (a replacement warming, old ones that\n"
		"clients still hold, those of unloaded models) and each model's last load\n"
		"error.\n\n"
		"Exit status, like systemctl is-active: 0 when every NAME (without NAMEs:\n"
		"every model) is ready; 3 when one is not (loading, warming, cold, modified\n"
		"or failed); 4 when a NAME is not served (it wins over 3); 1 when wcached\n"
		"cannot be reached or fails; 2 for a usage error. With --json, stdout holds\n"
		"exactly one JSON object whatever happens: the daemon's reply with \"ready\",\n"
		"\"not_ready\" and \"unknown\" added, or {\"ok\":false,\"error\":...}.\n" },
	[CONTROL_CMD_LOAD] = { NULL, false,
		"Serves the model at PATH (a safetensors file, a shard index, a directory\n"
		"holding one, or a WEIG file) as NAME. When NAME is served already, PATH\n"
		"becomes its next generation: it is validated and warmed while the current\n"
		"one keeps serving, and replaces it when warm; clients holding the old\n"
		"generation keep it until they release it. A relative PATH is taken from\n"
		"the current directory. pin= sets what stays locked in memory (default:\n"
		"the model's current setting, or metadata). Waits until the daemon has\n"
		"validated PATH and prints the new generation's number; a PATH that fails\n"
		"validation is an error, the current generation keeps serving, and a NAME\n"
		"that was not served before is not added.\n\n"
		"A load lasts until wcached restarts: it is not written to the\n"
		"configuration file, which decides what a restart serves. Add a\n"
		"[model NAME] section to keep it.\n" },
	[CONTROL_CMD_UNLOAD] = { NULL, false,
		"Stops serving NAME: new attaches fail. Clients that hold it keep their\n"
		"mappings; its generations close when they release them. Like load, this\n"
		"lasts until wcached restarts or re-reads a configuration that changed NAME.\n" },
	[CONTROL_CMD_RELOAD] = { NULL, false,
		"With NAME: re-checks the model's files and, when one was replaced (or the\n"
		"model had failed), loads them as the next generation. Without NAME:\n"
		"re-reads the configuration file, as SIGHUP does, adding, dropping and\n"
		"reloading models. Waits until the reload has finished.\n" },
	[CONTROL_CMD_PIN] = { NULL, false,
		"Locks every page of NAME's current generation in memory (mlock), within\n"
		"RLIMIT_MEMLOCK, so memory pressure never evicts it. Waits until every\n"
		"page is locked; exits 1 when the kernel refused the lock.\n" },
	[CONTROL_CMD_UNPIN] = { NULL, false,
		"Unlocks NAME's pages except its index and file headers (pin=metadata).\n"
		"Waits until they are unlocked.\n" },
	[CONTROL_CMD_EVICT] = { NULL, false,
		"Drops NAME's files from the page cache (pages that no process maps); the\n"
		"model shows as cold until a client attaches it again, or ready while\n"
		"every byte stays resident (another model of the same file, or workers,\n"
		"map it all). Waits until the pages are gone, so status right after shows\n"
		"the new figure. Refused for a pinned model.\n" },
	[CONTROL_CMD_DROP] = { NULL, false,
		"Drops NAME's derived artifacts (every key, or only KEY), e.g. ones a bad\n"
		"builder published: those no worker holds go at once and their memory is\n"
		"freed; a held one is attached no more, is not kept for a warm restart,\n"
		"and goes when its last holder releases it. The next DERIVE of the key\n"
		"builds it anew. A build of it in progress is left alone, and what it\n"
		"publishes is served (drop again after it). An unknown NAME, or a KEY\n"
		"with no artifact and no build, is an error.\n" },
	[CONTROL_CMD_METRICS] = { "[--http [--timeout SECONDS]]", false,
		"Prints wcached's metrics in the Prometheus text exposition format: per\n"
		"model bytes, resident bytes, generation, attached clients, attach, error\n"
		"and swap counters, warm-up seconds; daemon uptime and clients. With\n"
		"--json (not with --http), the daemon's reply holds the text in \"text\".\n\n"
		"With --http: answers one HTTP/1.1 request read from standard input on\n"
		"standard output, as an inetd-style service (wcached-metrics@.service of\n"
		"wcached-metrics.socket runs it): GET /metrics gets the exposition (the\n"
		"target also as http://HOST:PORT/metrics), HEAD /metrics its head alone,\n"
		"any other path 404, any other method 405, a malformed or oversized\n"
		"request 400, a request not complete within SECONDS (default 3) 408,\n"
		"and 503 when wcached cannot be reached or does not send the metrics.\n" },
};

/* Finds a control command as wcachectl takes it (internal.h). */
int
ctl_control_find(const char *name, struct ctl_control_cmd *out)
{
	int id = control_cmd_find(name);

	if (id < 0 || id == CONTROL_CMD_HELP)
		return -ENOENT;
	out->id = (enum control_cmd_id)id;
	out->wire = &control_cmds[id];
	out->filter = control_details[id].filter;
	out->min_args = out->filter ? 0 : out->wire->min_args;
	out->max_args = out->filter ? INT_MAX : out->wire->max_args;
	out->args = control_details[id].args != NULL ? control_details[id].args : out->wire->args;
	out->help = control_details[id].help;
	return 0;
}

/* The options every control command takes, for its --help. */
static const char options_help[] =
	"  -c, --config CONFIG  find the control socket in CONFIG's [wcached] section\n"
	"      --control PATH   the control socket (default $WCACHE_CONTROL, else\n"
	"                       " DEFAULT_CONTROL_PATH ")\n"
	"      --json           print the daemon's JSON reply as it came (one JSON\n"
	"                       object on stdout, errors included)\n"
	"  -h, --help           this help\n";

/* Prints `wcachectl COMMAND --help` (internal.h). */
void
ctl_control_usage(FILE *f, const struct ctl_control_cmd *cmd)
{
	fprintf(f, "usage: wcachectl [-c CONFIG | --control PATH] [--json] %s%s%s\n\n",
		cmd->wire->name, cmd->args[0] ? " " : "", cmd->args);
	if (cmd->help != NULL)
		fprintf(f, "%s\n", cmd->help);
	else /* a command whose description is still to be written here */
		fprintf(f, "%c%s.\n\n", toupper((unsigned char)cmd->wire->summary[0]),
			cmd->wire->summary + 1);
	fputs(options_help, f);
}

/* Prints wcachectl's help (ctl.h). */
void
ctl_help(FILE *f)
{
	fprintf(f, "usage: wcachectl [-c CONFIG | --control PATH] [--json] COMMAND [ARGS...]\n\n"
		   "Drives wcached, the shared weight cache daemon, and works with model files.\n\n"
		   "commands that talk to wcached's control socket:\n");
	for (int id = 0; id < CONTROL_CMD_COUNT; id++)
		if (id != CONTROL_CMD_HELP) /* this text */
			fprintf(f, "  %-10s %s\n", control_cmds[id].name, control_cmds[id].summary);
	fprintf(f, "\nother commands (they take their own options):\n");
	for (size_t i = 0; i < NFILE_COMMANDS; i++)
		fprintf(f, "  %-10s %s\n", file_commands[i].name, file_commands[i].summary);
	fprintf(f, "\noptions of the control commands (before or after COMMAND):\n"
		   "  -c, --config CONFIG  use the control socket CONFIG names (the `control`\n"
		   "                       key of its [wcached] section)\n"
		   "      --control PATH   the control socket (default $WCACHE_CONTROL, else\n"
		   "                       " DEFAULT_CONTROL_PATH ")\n"
		   "      --json           print wcached's JSON reply instead of a table\n\n"
		   "options of wcachectl itself (before COMMAND):\n"
		   "  -h, --help           this help\n"
		   "  -V, --version        print wcachectl's version\n\n"
		   "Exit status: 0 on success; 1 when wcached reports an error or cannot be\n"
		   "reached (the reason is on stderr); 2 for a usage error; status also\n"
		   "exits 3 when a model is not ready and 4 for a name it does not serve.\n\n"
		   "'wcachectl COMMAND --help' describes a command.\n");
}


/* Runs the command argv[0] (ctl.h). */
int
ctl_run(int argc, char **argv, const char *config, const char *control, int json)
{
	struct ctl_control_cmd cmd;

	if (strcmp(argv[0], "help") == 0) {
		ctl_help(stdout);
		return CTL_EXIT_OK;
	}
	if (ctl_control_find(argv[0], &cmd) == 0)
		return ctl_control(&cmd, argc, argv, config, control, json);
	for (size_t k = 0; k < NFILE_COMMANDS; k++) {
		if (strcmp(argv[0], file_commands[k].name) != 0)
			continue;
		if (config != NULL || control != NULL)
			return ctl_json_usage(json, ctl_usage_error(file_commands[k].name, "-c and "
				"--control go with the control commands, not %s",
				file_commands[k].name));
		if (json && file_commands[k].json != NULL)
			return ctl_json_usage(json, ctl_usage_error(file_commands[k].name, "--json "
				"goes after the command here, as one of its own options: %s",
				file_commands[k].json));
		if (json)
			return ctl_json_usage(json, ctl_usage_error(file_commands[k].name,
				"%s has no --json output", file_commands[k].name));
		return file_commands[k].run(argc, argv);
	}
	return ctl_json_usage(json, ctl_usage_error(NULL, "unknown command \"%s\"", argv[0]));
}

/* ---- what every command prints ---------------------------------------- */

/* The last message of ctl_error() or ctl_usage_error(), unescaped, for
 * --json's error object. */
static char last_error[8192];

/* Keeps the message in last_error and prints it, escaped, on stderr. */
static void __attribute__((format(printf, 1, 0)))
print_error(const char *fmt, va_list ap)
{
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	fputs("wcachectl: ", stderr);
	escape_print(stderr, last_error);
	fputc('\n', stderr);
}

/* Prints an error (internal.h). */
void
ctl_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	print_error(fmt, ap);
	va_end(ap);
}

/* Whether a file command's own options hold --json (internal.h). */
int
ctl_file_json(int argc, char **argv, const char *value_option)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (strcmp(argv[i], "--json") == 0)
			return 1;
		if (value_option != NULL && strcmp(argv[i], value_option) == 0)
			i++; /* its value, whatever it looks like */
	}
	return 0;
}

/* Prints an error and, with --json, its error object (internal.h). */
int
ctl_fail(int json, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	print_error(fmt, ap);
	va_end(ap);
	if (json)
		ctl_json_error();
	return CTL_EXIT_FAILURE;
}

/* Prints a usage error (ctl.h). */
int
ctl_usage_error(const char *command, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	fprintf(stderr, "wcachectl%s%s: ", command != NULL ? " " : "",
		command != NULL ? command : "");
	escape_print(stderr, last_error);
	fprintf(stderr, " (see 'wcachectl %s%s--help')\n", command != NULL ? command : "",
		command != NULL ? " " : "");
	return CTL_EXIT_USAGE;
}

/* A usage error's status, after --json's object (internal.h). */
int
ctl_json_usage(int json, int status)
{
	if (json)
		ctl_json_error();
	return status;
}

/* Prints --json's error object (internal.h). */
void
ctl_json_error(void)
{
	printf("{\"ok\":false,\"protocol\":%d,\"error\":", CONTROL_PROTOCOL_VERSION);
	ctl_json_string(stdout, last_error, strlen(last_error));
	printf("}\n");
}

/* Writes JSON text with what a terminal acts on escaped (internal.h). */
void
ctl_json_text(FILE *f, const char *text, size_t len)
{
	const unsigned char *p = (const unsigned char *)text, *end = p + len, *run = p;
	char out[ESCAPE_STEP_MAX];
	size_t n, out_len;

	for (; p < end; p += n) {
		n = escape_step(p, end, out, &out_len);
		/* Kept as they are: what escape_step() keeps, and C0 controls,
		 * which valid JSON holds only as whitespace between tokens. */
		if (out_len == n || *p < 0x20)
			continue;
		ctl_fwrite(run, (size_t)(p - run), f);
		run = p + n;
		if (out_len == ESCAPE_STEP_MAX) /* "\uNNNN", in JSON's syntax too */
			ctl_fwrite(out, out_len, f);
		else if (*p == 0x7f)
			fputs("\\u007f", f);
		else /* not UTF-8, which the strict reader and json_write_string()
		      * never let through: the replacement character */
			fputs("\\ufffd", f);
	}
	ctl_fwrite(run, (size_t)(p - run), f);
}

/* Writes a JSON string literal with what a terminal acts on escaped
 * (internal.h): json_write_string()'s literal, through ctl_json_text(). */
void
ctl_json_string(FILE *f, const char *s, size_t len)
{
	char *literal = NULL;
	size_t literal_len = 0;
	FILE *m = open_memstream(&literal, &literal_len);

	if (m == NULL) { /* still valid JSON, only less careful of terminals */
		json_write_string(f, s, len);
		return;
	}
	json_write_string(m, s, len);
	if (fclose(m) == 0)
		ctl_json_text(f, literal, literal_len);
	else
		json_write_string(f, s, len);
	free(literal);
}

/* The errno of the first write to stdout that ctl_fwrite() saw fail. */
static int out_errno;

/* Writes to f, keeping a failed stdout write's errno (ctl.h). */
void
ctl_fwrite(const void *p, size_t n, FILE *f)
{
	if (fwrite(p, 1, n, f) != n && f == stdout && out_errno == 0)
		out_errno = errno != 0 ? errno : EIO;
}

/* Ends a command: checks that its standard output was written (ctl.h). */
int
ctl_finish_output(int status)
{
	int e = 0;
	int flushed = fflush(stdout);

	if (out_errno != 0)
		e = out_errno;
	else if (flushed != 0)
		e = errno;
	else if (ferror(stdout))
		e = EIO; /* an earlier write failed, and its errno is gone */
	if (e == 0)
		return status;
	ctl_error("writing the output: %s", strerror(e));
	return CTL_EXIT_FAILURE;
}
