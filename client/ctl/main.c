/*
 * ctl_main.c: wcachectl, the command-line tool of wcache. This file parses
 * the global options, dispatches to the subcommands (ctl.h) and prints the
 * overall help.
 *
 * Two kinds of commands: those that work on files or attach like a worker
 * (inspect, convert, attach: they take their own options), and those that
 * drive a running wcached through its control socket (ctl_control.c), which
 * the global options -c, --control and --json configure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl/ctl.h"
#include "proto/defaults.h"


static const struct {
	const char *name;
	int (*run)(int, char **); /* NULL: a control command */
	const char *summary;
} commands[] = {
	{ "status", NULL, "show the daemon, its models and their generations" },
	{ "load", NULL, "serve a model, or swap a served one to a new path" },
	{ "unload", NULL, "stop serving a model" },
	{ "reload", NULL, "re-check a model's files, or re-read the configuration" },
	{ "pin", NULL, "lock every page of a model in memory" },
	{ "unpin", NULL, "lock only a model's index and headers" },
	{ "evict", NULL, "drop a model's files from the page cache" },
	{ "metrics", NULL, "print metrics in the Prometheus text format" },
	{ "inspect", ctl_inspect, "validate a model file and list its tensors" },
	{ "convert", ctl_convert, "convert between safetensors and WEIG" },
	{ "attach", ctl_attach, "attach a model through wcached and time it" },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void
usage(FILE *f)
{
	fprintf(f, "usage: wcachectl [-c CONFIG | --control PATH] [--json] COMMAND [ARGS...]\n\n"
		   "Drives wcached, the shared weight cache daemon, and works with model files.\n\n"
		   "commands that talk to wcached's control socket:\n");
	for (size_t i = 0; i < NCOMMANDS; i++) {
		if (i > 0 && commands[i].run != NULL && commands[i - 1].run == NULL)
			fprintf(f, "\nother commands (they take their own options):\n");
		fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	}
	fprintf(f, "\noptions of the control commands (before or after COMMAND):\n"
		   "  -c, --config CONFIG  use the control socket CONFIG names (the `control`\n"
		   "                       key of its [wcached] section)\n"
		   "      --control PATH   the control socket (default $WCACHE_CONTROL, else\n"
		   "                       " DEFAULT_CONTROL_PATH ")\n"
		   "      --json           print wcached's JSON reply instead of a table\n\n"
		   "Exit status: 0 on success; 1 when wcached reports an error or cannot be\n"
		   "reached (the reason is on stderr); 2 for a usage error; status also\n"
		   "exits 3 when a model is not ready and 4 for a name it does not serve.\n\n"
		   "'wcachectl COMMAND --help' describes a command.\n");
}

double
ctl_monotonic(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Takes the value of an option written "--opt VALUE", "--opt=VALUE" or
 * "-c VALUE"; NULL (and a message) when it is missing. */
static const char *
option_value(int argc, char **argv, int *i, const char *name)
{
	size_t n = strlen(name);

	if (strncmp(argv[*i], name, n) == 0 && argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (*i + 1 < argc)
		return argv[++*i];
	ctl_usage_error(NULL, "%s needs a value", name);
	return NULL;
}

static int
is_option(const char *arg, const char *name)
{
	size_t n = strlen(name);

	return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

int
main(int argc, char **argv)
{
	const char *config = NULL, *control = NULL;
	int json = 0, i;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(argv[i], "--version") == 0) {
			printf("wcachectl %s\n", WCACHE_VERSION);
			return 0;
		} else if (strcmp(argv[i], "-c") == 0 || is_option(argv[i], "--config")) {
			if ((config = option_value(argc, argv, &i, "--config")) == NULL)
				return 2;
		} else if (is_option(argv[i], "--control")) {
			if ((control = option_value(argc, argv, &i, "--control")) == NULL)
				return 2;
		} else if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else {
			return ctl_usage_error(NULL, "unknown option \"%s\"", argv[i]);
		}
	}
	if (config != NULL && control != NULL)
		return ctl_usage_error(NULL, "give -c CONFIG or --control PATH, not both");
	if (i == argc)
		return ctl_usage_error(NULL, "missing COMMAND");
	if (strcmp(argv[i], "help") == 0) {
		usage(stdout);
		return 0;
	}
	for (size_t k = 0; k < NCOMMANDS; k++) {
		if (strcmp(argv[i], commands[k].name) != 0)
			continue;
		if (commands[k].run == NULL)
			return ctl_control(argc - i, argv + i, config, control, json);
		if (config != NULL || control != NULL || json)
			return ctl_usage_error(commands[k].name, "-c, --control and --json go with "
				"the control commands, not %s", commands[k].name);
		return commands[k].run(argc - i, argv + i);
	}
	return ctl_usage_error(NULL, "unknown command \"%s\"", argv[i]);
}
