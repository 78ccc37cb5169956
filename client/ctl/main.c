/*
 * ctl_main.c: wcachectl, the command-line tool of wcache. This file parses
 * the global options and hands the command to ctl_run() (commands.c, which
 * holds the list of commands and the overall help).
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
			ctl_help(stdout);
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
	return ctl_run(argc - i, argv + i, config, control, json);
}
