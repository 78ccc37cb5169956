/*
 * ctl_main.c: wcachectl, the command-line tool of wcache. This file only
 * dispatches to the subcommands (ctl.h) and prints the overall help.
 */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

static const struct {
	const char *name;
	int (*run)(int, char **);
	const char *summary;
} commands[] = {
	{ "inspect", ctl_inspect, "validate a model file and list its tensors" },
	{ "convert", ctl_convert, "convert between safetensors and WEIG" },
	{ "attach", ctl_attach, "attach a model through wcached and time it" },
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: wcachectl COMMAND [ARGS...]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\n'wcachectl COMMAND --help' describes a command.\n");
}

int
main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
		strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("wcachectl %s\n", WCACHE_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[1], commands[i].name) == 0)
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "wcachectl: unknown command \"%s\" (see wcachectl --help)\n", argv[1]);
	return 2;
}
