/*
 * test_commands.c: unit tests of wcachectl's command list
 * (client/ctl/commands.c) against the control socket's table in
 * proto/control_cmds.h: every command of the table is one wcachectl runs
 * (help excepted: wcachectl answers it itself) and describes in its
 * `COMMAND --help`, and wcachectl's help lists every one with the table's
 * summary. Linked with wcachectl's sources but main.c.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "proto/control_cmds.h"

/* What print(f, arg) writes, malloc'd in *text. */
static void
capture(void (*print)(FILE *f, const void *arg), const void *arg, char **text)
{
	size_t len = 0;
	FILE *f = open_memstream(text, &len);

	assert_non_null(f);
	print(f, arg);
	assert_int_equal(fclose(f), 0);
}

static void
print_help(FILE *f, const void *arg)
{
	(void)arg;
	ctl_help(f);
}

static void
print_usage(FILE *f, const void *arg)
{
	ctl_control_usage(f, arg);
}

/* Each control command is wcachectl's, with the table's words (status takes
 * NAMEs of its own), and has its description in commands.c. */
static void
every_command_is_described(void **state)
{
	for (int id = 0; id < CONTROL_CMD_COUNT; id++) {
		const struct control_cmd *wire = &control_cmds[id];
		struct ctl_control_cmd cmd;
		char want[256], *text;

		if (id == CONTROL_CMD_HELP) {
			assert_int_equal(ctl_control_find(wire->name, &cmd), -ENOENT);
			continue;
		}
		assert_int_equal(ctl_control_find(wire->name, &cmd), 0);
		assert_int_equal(cmd.id, id);
		assert_ptr_equal(cmd.wire, wire);
		if (cmd.help == NULL) {
			fail_msg("wcachectl has no description of \"%s\" (client/ctl/commands.c)",
				wire->name);
			return; /* not reached (fail_msg ends the test), but the analyzer
				   does not know that: no strstr(text, NULL) below */
		}
		if (cmd.filter) {
			assert_int_equal(cmd.min_args, 0);
		} else {
			assert_int_equal(cmd.min_args, wire->min_args);
			assert_int_equal(cmd.max_args, wire->max_args);
		}
		capture(print_usage, &cmd, &text);
		snprintf(want, sizeof(want), "usage: wcachectl [-c CONFIG | --control PATH] "
			"[--json] %s%s%s\n\n", wire->name, cmd.args[0] ? " " : "", cmd.args);
		assert_int_equal(strncmp(text, want, strlen(want)), 0);
		assert_non_null(strstr(text, cmd.help));
		assert_non_null(strstr(text, "--control PATH"));
		free(text);
	}
	{
		struct ctl_control_cmd cmd;

		assert_int_equal(ctl_control_find("inspect", &cmd), -ENOENT);
		assert_int_equal(ctl_control_find("Status", &cmd), -ENOENT);
	}
}

/* wcachectl's help lists every control command with the table's summary,
 * in the table's order, before the other commands. */
static void
help_lists_every_command(void **state)
{
	static const char *const file_commands[] = { "inspect", "convert", "attach" };
	char *text = NULL;
	const char *others, *prev;

	capture(print_help, NULL, &text);
	others = strstr(text, "\nother commands");
	prev = text;
	assert_non_null(others);
	for (int id = 0; id < CONTROL_CMD_COUNT; id++) {
		char line[256];
		const char *at;

		if (id == CONTROL_CMD_HELP)
			continue; /* that is this text */
		snprintf(line, sizeof(line), "\n  %-10s %s\n", control_cmds[id].name,
			control_cmds[id].summary);
		if ((at = strstr(text, line)) == NULL)
			fail_msg("wcachectl --help does not list \"%s\":\n%s",
				control_cmds[id].name, text);
		assert_true(at > prev && at < others);
		prev = at;
	}
	for (size_t i = 0; i < sizeof(file_commands) / sizeof(file_commands[0]); i++) {
		char start[32];
		const char *at;

		snprintf(start, sizeof(start), "\n  %-10s ", file_commands[i]);
		assert_non_null(at = strstr(text, start));
		assert_true(at > others);
	}
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_command_is_described),
		cmocka_unit_test(help_lists_every_command),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
