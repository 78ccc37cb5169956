/*
 * control_cmds.c: the table of the control socket's commands (see
 * control_cmds.h), and its lookups.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "proto/control_cmds.h"

const struct control_cmd control_cmds[CONTROL_CMD_COUNT] = {
	[CONTROL_CMD_STATUS] = { "status", 0, 0, "",
		"show the daemon, its models and their generations" },
	[CONTROL_CMD_LOAD] = { "load", 2, 3, "NAME PATH [pin=none|metadata|all]",
		"serve a model, or swap a served one to a new path" },
	[CONTROL_CMD_UNLOAD] = { "unload", 1, 1, "NAME", "stop serving a model" },
	[CONTROL_CMD_RELOAD] = { "reload", 0, 1, "[NAME]",
		"re-check a model's files, or re-read the configuration" },
	[CONTROL_CMD_PIN] = { "pin", 1, 1, "NAME", "lock every page of a model in memory" },
	[CONTROL_CMD_UNPIN] = { "unpin", 1, 1, "NAME", "lock only a model's index and headers" },
	[CONTROL_CMD_EVICT] = { "evict", 1, 1, "NAME", "drop a model's files from the page cache" },
	[CONTROL_CMD_DROP] = { "drop", 1, 2, "NAME [KEY]",
		"drop a model's derived artifacts (all, or KEY's)" },
	[CONTROL_CMD_METRICS] = { "metrics", 0, 0, "",
		"print metrics in the Prometheus text format" },
	[CONTROL_CMD_HELP] = { "help", 0, 0, "", "list the commands" },
};

/* Finds a command by name (control_cmds.h). */
int
control_cmd_find(const char *name)
{
	for (int id = 0; id < CONTROL_CMD_COUNT; id++)
		if (strcmp(name, control_cmds[id].name) == 0)
			return id;
	return -ENOENT;
}

/* Formats a command's usage (control_cmds.h). */
int
control_cmd_usage(const struct control_cmd *cmd, char *buf, size_t size)
{
	return snprintf(buf, size, "%s%s%s", cmd->name, cmd->args[0] != '\0' ? " " : "",
		cmd->args);
}
