/*
 * control_cmds.h: the commands of wcached's control socket, in one table
 * that both sides read: wcached's dispatcher (daemon/control_cmd.c) finds
 * a request's command and checks its number of words here, and answers
 * "help" from it; wcachectl (client/ctl/) takes its control commands, their
 * synopses and its help's list from it. A new command is one entry here,
 * one handler in the daemon and one description in wcachectl's help; the
 * unit tests (tests/unit/daemon/test_control.c, tests/unit/ctl/
 * test_commands.c) fail while either side lacks it.
 *
 * The protocol itself (framing, quoting, replies) is in proto/PROTOCOL.md,
 * section "Control protocol".
 */
#ifndef WC_CONTROL_CMDS_H
#define WC_CONTROL_CMDS_H

#include <stddef.h>

/* The commands, in the order help lists them. */
enum control_cmd_id {
	CONTROL_CMD_STATUS,
	CONTROL_CMD_LOAD,
	CONTROL_CMD_UNLOAD,
	CONTROL_CMD_RELOAD,
	CONTROL_CMD_PIN,
	CONTROL_CMD_UNPIN,
	CONTROL_CMD_EVICT,
	CONTROL_CMD_DROP,
	CONTROL_CMD_METRICS,
	CONTROL_CMD_HELP,
	CONTROL_CMD_COUNT
};

/* One command as it goes over the socket. */
struct control_cmd {
	const char *name;       /* the request's first word */
	int min_args, max_args; /* how many words may follow it */
	const char *args;       /* their synopsis, "NAME PATH [pin=...]"; "" for none */
	const char *summary;    /* one line for help, lower case, no full stop */
};

/* The table, indexed by enum control_cmd_id. */
extern const struct control_cmd control_cmds[CONTROL_CMD_COUNT];

/* The id of the command called name (exactly: commands are lower case), or
 * -ENOENT. */
int control_cmd_find(const char *name);

/* Writes the command's usage, its name and synopsis ("load NAME PATH
 * [pin=none|metadata|all]", "status"), into buf (size bytes, truncated to
 * fit, NUL-terminated when size > 0). Returns the length of the whole
 * usage, as snprintf does. */
int control_cmd_usage(const struct control_cmd *cmd, char *buf, size_t size);

#endif /* WC_CONTROL_CMDS_H */
