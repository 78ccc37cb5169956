/*
 * ctl_main.c: wcachectl, the command-line tool of wcache. This file parses
 * the global options and hands the command to ctl_run() (commands.c, which
 * holds the list of commands and the overall help).
 *
 * Two kinds of commands: those that work on files or attach like a worker
 * (inspect, convert, attach: they take their own options), and those that
 * drive a running wcached through its control socket (ctl_control.c), which
 * the global options -c, --control and --json configure.
 *
 * Whatever the command, main() ends by checking that standard output was
 * written: a full disk or a closed stdout is an error, not a silent exit 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"

/* Seconds on the monotonic clock (ctl.h). */
double
ctl_monotonic(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Takes the value of an option written "--opt VALUE", "--opt=VALUE" or
 * "-c VALUE", a path; NULL (and a message) when it is missing or empty. */
static const char *
option_value(int argc, char **argv, int *i, const char *name)
{
	size_t n = strlen(name);
	const char *value = NULL;

	if (strncmp(argv[*i], name, n) == 0 && argv[*i][n] == '=')
		value = argv[*i] + n + 1;
	else if (*i + 1 < argc)
		value = argv[++*i];
	if (value == NULL)
		ctl_usage_error(NULL, "%s needs a value", name);
	else if (value[0] == '\0')
		ctl_usage_error(NULL, "%s needs a path, not an empty one", name);
	return value != NULL && value[0] != '\0' ? value : NULL;
}

/* Is arg the long option name, alone or as "name=VALUE"? */
static int
is_option(const char *arg, const char *name)
{
	size_t n = strlen(name);

	return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* Whether --json is given, before COMMAND or after it (where a control
 * command takes it too), wherever: a usage error found before it is read
 * still owes stdout its one JSON object. */
static int
json_asked(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			return 1;
		if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0 ||
		    strcmp(argv[i], "--control") == 0)
			i++; /* its value, whatever it looks like */
	}
	return 0;
}


/* Parses the global options and runs the command; returns the exit
 * status. */
static int
run(int argc, char **argv)
{
	const char *config = NULL, *control = NULL;
	int json = json_asked(argc, argv), global_json = 0, i;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			ctl_help(stdout);
			return 0;
		} else if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
			printf("wcachectl %s\n", WCACHE_VERSION);
			return 0;
		} else if (strcmp(argv[i], "-c") == 0 || is_option(argv[i], "--config")) {
			if ((config = option_value(argc, argv, &i, "--config")) == NULL)
				return ctl_json_usage(json, 2);
		} else if (is_option(argv[i], "--control")) {
			if ((control = option_value(argc, argv, &i, "--control")) == NULL)
				return ctl_json_usage(json, 2);
		} else if (strcmp(argv[i], "--json") == 0) {
			global_json = 1;
		} else {
			return ctl_json_usage(json, ctl_usage_error(NULL, "unknown option \"%s\"",
				argv[i]));
		}
	}
	if (config != NULL && control != NULL)
		return ctl_json_usage(json, ctl_usage_error(NULL,
			"give -c CONFIG or --control PATH, not both"));
	if (i == argc)
		return ctl_json_usage(json, ctl_usage_error(NULL, "missing COMMAND"));
	/* The command reads its own options, --json after it included. */
	return ctl_run(argc - i, argv + i, config, control, global_json);
}

/* Every command, --help and --version included, ends with the check that
 * what it wrote to stdout was written (ctl_finish_output()). */
int
main(int argc, char **argv)
{
	return ctl_finish_output(run(argc, argv));
}
