/*
 * ctl.h: the subcommands of wcachectl. Each takes the arguments after the
 * subcommand name (argv[0] is the subcommand) and returns the process exit
 * status: 0 on success, 1 on a failure it reported on stderr, 2 on a usage
 * error. Errors are one line on stderr: "wcachectl: " and the message.
 */
#ifndef WC_CTL_H
#define WC_CTL_H

int ctl_inspect(int argc, char **argv);
int ctl_convert(int argc, char **argv);
int ctl_attach(int argc, char **argv);

/* The commands that talk to wcached's control socket (status, load, ...):
 * config and control are the -c and --control options (NULL when absent),
 * json the --json flag. */
int ctl_control(int argc, char **argv, const char *config, const char *control, int json);

#endif
