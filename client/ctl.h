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

#endif
