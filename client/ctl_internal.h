/*
 * ctl_internal.h: what ctl_control.c (the control commands: socket,
 * request, options, the fields every reply has) and ctl_status.c (the
 * status table) share. Private to wcachectl; the subcommands themselves
 * are declared in ctl.h.
 *
 * The readers take a value at the cursor of json.h's strict reader and
 * return 0 or a negative errno-style code (the reader's own on malformed
 * JSON); ctl_malformed() turns such a code into one line on stderr.
 */
#ifndef WC_CTL_INTERNAL_H
#define WC_CTL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json.h"

/* ---- ctl_control.c ---------------------------------------------------- */

/* Reads a string value into a malloc'd, NUL-terminated copy in *out (the
 * old one freed) and its length in *len when len is not NULL. */
int ctl_read_string(struct jr *j, char **out, size_t *len);

/* Reads true or false, or skips a value of another type and leaves *out. */
int ctl_read_bool(struct jr *j, int *out);

/* Reads an integer, or skips a value of another type and leaves *out. */
int ctl_read_u64(struct jr *j, uint64_t *out);

/* Prints the reader's error about the reply (code r) and returns -1. */
int ctl_malformed(const struct jr *j, int r);

/* Writes s with control characters as \xNN, for a terminal. */
void ctl_print_safe(FILE *f, const char *s);

/* ---- ctl_status.c ----------------------------------------------------- */

/* Parses a status reply (len bytes) and prints it as a table on stdout.
 * Returns 0, or -1 after printing why the reply is malformed. */
int ctl_status_print(const char *line, size_t len);

#endif /* WC_CTL_INTERNAL_H */
