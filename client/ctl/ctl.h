/*
 * ctl.h: the subcommands of wcachectl. Each takes the arguments after the
 * subcommand name (argv[0] is the subcommand) and returns the process exit
 * status: 0 on success, 1 on a failure it reported on stderr, 2 on a usage
 * error. Errors are one line on stderr: "wcachectl: " and the message.
 */
#ifndef WC_CTL_H
#define WC_CTL_H

#include <stdio.h>

/* Exit statuses; status's follow systemctl is-active (man/wcachectl.1). */
#define CTL_EXIT_OK 0
#define CTL_EXIT_FAILURE 1   /* reported on stderr */
#define CTL_EXIT_USAGE 2
#define CTL_EXIT_NOT_READY 3 /* status: a model asked about is not ready */
#define CTL_EXIT_UNKNOWN 4   /* status: a name asked about is not served */

/* Prints a usage error in one line, "wcachectl COMMAND: MESSAGE (see
 * 'wcachectl COMMAND --help')" (command NULL: the global one), MESSAGE
 * escaped (escape_print()), and returns CTL_EXIT_USAGE. */
int ctl_usage_error(const char *command, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Ends every command (main() calls it with the command's exit status):
 * flushes stdout and, when a write to it failed, prints "wcachectl: writing
 * the output: REASON" and returns CTL_EXIT_FAILURE; else returns status. */
int ctl_finish_output(int status);

/* fwrite()s n bytes of p to f; when f is stdout and the write falls short,
 * keeps its errno for ctl_finish_output(), since a later fflush() may find
 * the buffer empty and only ferror() left (a large write that failed). */
void ctl_fwrite(const void *p, size_t n, FILE *f);

/* Seconds on the monotonic clock, for durations. */
double ctl_monotonic(void);

int ctl_inspect(int argc, char **argv);
int ctl_convert(int argc, char **argv);
int ctl_attach(int argc, char **argv);

/* Prints wcachectl's help: its commands (the control commands from
 * proto/control_cmds.h, then the others) and the global options. */
void ctl_help(FILE *f);

/* Runs the command argv[0] (commands.c): "help", a control command, or one
 * of the others. config and control are the global -c and --control options
 * (NULL when absent), json the global --json flag, which go with the control
 * commands only. */
int ctl_run(int argc, char **argv, const char *config, const char *control, int json);

#endif
