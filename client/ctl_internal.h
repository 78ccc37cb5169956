/*
 * ctl_internal.h: what ctl_control.c (the control commands: socket,
 * request, options, the fields every reply has) and ctl_status.c (the
 * status table) share. Private to wcachectl; the subcommands themselves
 * are declared in ctl.h.
 *
 * Both read a reply the same way: a table of ctl_field names the members
 * of a JSON object and where each value goes in the caller's struct, and
 * ctl_read_object() walks the object with json.h's strict reader, filling
 * them. The readers return 0 or a negative errno-style code (the reader's
 * own on malformed JSON); ctl_parse_reply() turns such a code into one line
 * on stderr.
 */
#ifndef WC_CTL_INTERNAL_H
#define WC_CTL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json.h"

/* ---- ctl_control.c ---------------------------------------------------- */

/* What a member's value is and how it is stored. A value of another JSON
 * type is skipped and leaves the member as it was, except for a string
 * member, where it is an error. */
enum ctl_type {
	CTL_STRING, /* char *: a malloc'd, NUL-terminated copy (the old one freed) */
	CTL_U64,    /* uint64_t: an integer */
	CTL_BOOL,   /* int: true or false as 1 or 0 */
	CTL_DOUBLE, /* double: a number that may have a fraction */
};

/* One member of a JSON object: its key, and the offset of the member of
 * the caller's struct (offsetof) that receives its value. */
struct ctl_field {
	const char *key;
	enum ctl_type type;
	size_t offset;
};

/* Reads the value of a member that no ctl_field names, or skips it. */
typedef int ctl_member_fn(struct jr *j, const struct jr_str *key, void *dst);

/*
 * Reads the object at the cursor into dst: the value of each member named
 * in fields (nfields of them) is stored as its ctl_field says; any other
 * member goes to other, or is skipped when other is NULL. Returns 0 or a
 * negative errno-style code; dst may then hold part of the object.
 */
int ctl_read_object(struct jr *j, const struct ctl_field *fields, size_t nfields, void *dst,
	ctl_member_fn *other);

/*
 * Parses a reply line (len bytes) that must be one JSON object and nothing
 * else, with ctl_read_object(). Returns 0, or -1 after printing why the
 * reply is malformed; dst may then hold part of the reply, for the caller
 * to free.
 */
int ctl_parse_reply(const char *line, size_t len, const struct ctl_field *fields,
	size_t nfields, void *dst, ctl_member_fn *other);

/* Writes s with control characters as \xNN, for a terminal. */
void ctl_print_safe(FILE *f, const char *s);

/* ---- ctl_status.c ----------------------------------------------------- */

/* Parses a status reply (len bytes) and prints it as a table on stdout.
 * Returns 0, or -1 after printing why the reply is malformed. */
int ctl_status_print(const char *line, size_t len);

#endif /* WC_CTL_INTERNAL_H */
