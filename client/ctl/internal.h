/*
 * ctl_internal.h: what ctl_control.c (the control commands: socket,
 * request, options, the fields every reply has), ctl_commands.c (the
 * control commands' table as wcachectl takes it, and the help) and
 * ctl_status.c (the status table) share. Private to wcachectl; the subcommands themselves
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/json.h"
#include "proto/control_cmds.h"

struct ctl_control_cmd; /* commands.c */

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

/*
 * Connects to the control socket at path, sends the request line (len
 * bytes, '\n' included) and reads the reply line. Returns it malloc'd and
 * NUL-terminated without its '\n' (its length in *reply_len), or NULL after
 * ctl_error() (with a hint when path is a packet socket, such as wcached's
 * client socket).
 */
char *ctl_request(const char *path, const char *request, size_t len, size_t *reply_len);

/* Runs the control command cmd (ctl_control_find() found it) with the
 * arguments after it in argv (argv[0] is its name). config and control are
 * the global -c and --control options (or NULL), json the global --json.
 * Returns the exit status. */
int ctl_control(const struct ctl_control_cmd *cmd, int argc, char **argv, const char *config,
	const char *control, int json);

/* ---- ctl_status.c ----------------------------------------------------- */

/*
 * Shows a successful status reply (len bytes) for the models named (all of
 * them when nnames is 0): a table on stdout, or with json the reply with
 * "ready", "not_ready" and "unknown" added. Returns the exit status: 0 when
 * every model asked about is ready, CTL_EXIT_NOT_READY when one is not,
 * CTL_EXIT_UNKNOWN when a name is not served, CTL_EXIT_FAILURE after
 * printing why the reply is malformed.
 */
int ctl_status_show(const char *line, size_t len, char *const *names, size_t nnames, int json);

/* ---- ctl_commands.c --------------------------------------------------- */

/* A control command as wcachectl takes it: its entry in proto/control_cmds.h
 * and what wcachectl adds to it. */
struct ctl_control_cmd {
	enum control_cmd_id id;
	const struct control_cmd *wire; /* name, the request's words, summary */
	int min_args, max_args;         /* the words wcachectl takes */
	const char *args;               /* their synopsis, for --help and errors */
	bool filter;                    /* the words are NAMEs to show, not sent */
	const char *help;               /* the description of --help; NULL: none yet */
};

/* Fills *out for the control command called name. Returns 0, or -ENOENT
 * when there is none, or when it is one wcachectl answers itself (help). */
int ctl_control_find(const char *name, struct ctl_control_cmd *out);

/* Prints `wcachectl COMMAND --help` for a control command: usage, its
 * description and the options of the control commands. */
void ctl_control_usage(FILE *f, const struct ctl_control_cmd *cmd);

/* Prints "wcachectl: MESSAGE" on stderr and keeps MESSAGE for
 * ctl_json_error(). MESSAGE is escaped here (escape_print()): callers pass
 * names, paths and messages from a file or the daemon as they came, and
 * escape nothing themselves. wcachectl's errors go through here or
 * ctl_usage_error(), but for the journal lines of `metrics --http`
 * (http.c), which escape what they quote themselves. */
void ctl_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints {"ok":false,"protocol":N,"error":LAST} on stdout, LAST being the
 * message of the last ctl_error() or ctl_usage_error(): --json's object
 * when the daemon's reply never came. */
void ctl_json_error(void);

/* Whether the options of a file command (inspect, attach: argv[0] is its
 * name) hold --json, before "--" and not as the value of value_option
 * (NULL: none takes one): a usage error found before --json is read still
 * owes stdout its one JSON object. */
int ctl_file_json(int argc, char **argv, const char *value_option);

/* ctl_error(), then with json ctl_json_error()'s object on stdout; returns
 * CTL_EXIT_FAILURE. For the file commands' --json, whose output is one
 * JSON object whatever happens, as the control commands' is. */
int ctl_fail(int json, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A usage error's exit status (status, from ctl_usage_error()); with
 * --json (json set), after ctl_json_error()'s object. */
int ctl_json_usage(int json, int status);

/*
 * Writes text (len bytes of valid JSON: a reply the strict reader
 * accepted, or json_write_string()'s output) to f, the same JSON to a
 * reader, with what a terminal would act on inside its strings written as
 * JSON escapes: DEL as \u007f, C1 controls and bidirectional overrides as
 * \uNNNN (escape.h). JSON escapes C0 controls already.
 */
void ctl_json_text(FILE *f, const char *text, size_t len);

/* Writes s[0..len) as a JSON string literal: json_write_string()'s, through
 * ctl_json_text(). */
void ctl_json_string(FILE *f, const char *s, size_t len);

/* ---- ctl_http.c ------------------------------------------------------- */

/* Seconds for the whole request: a scraper sends it as it connects; an
 * idle connection holds one of the socket unit's places until then. */
#define CTL_HTTP_TIMEOUT 3.0
#define CTL_HTTP_REQUEST_MAX 8192 /* bytes of request line and headers */

/*
 * `wcachectl metrics --http`: reads one HTTP/1.1 request on standard input
 * and answers it on standard output (see the metrics help in ctl_control.c),
 * asking wcached's control socket at control_path for the metrics (NULL:
 * unknown, answered 503). Gives up after timeout seconds. Returns 0 when
 * the metrics were served, 1 otherwise (the reason on stderr).
 */
int ctl_http_metrics(const char *control_path, double timeout);

/*
 * Reads the reply line (len bytes) to "metrics" as the endpoint does:
 * *ok is 1 when "ok" is true, 0 when it is anything else, -1 when absent;
 * *text is a malloc'd copy of the first string "text" when *ok is 1, else
 * of the first string "error" (NUL-terminated, its length without the NUL
 * in *text_len; it may hold a NUL), or NULL. Returns 0, or a negative
 * errno-style code for a reply that is not one JSON object (out-parameters
 * untouched).
 */
int ctl_http_read_reply(const char *line, size_t len, int *ok, char **text, size_t *text_len);

/* ---- ctl_convert.c ---------------------------------------------------- */

/* The write counter in /proc/self/io's text (len bytes, not terminated):
 * the first line that starts with "wchar: " decides, and holds the number
 * as the kernel writes it (proc_pid_io_accounting: "wchar: %llu"): decimal
 * digits of 64 bits at most, then the end of the line. 0 with it in *out;
 * -EINVAL when no line starts so or that line holds anything else (a
 * sign, a blank, a value past 2^64 - 1, nothing), *out untouched. The
 * fuzzer (tests/fuzz/fuzz_kernel.c) gives it any bytes. */
int ctl_convert_io_wchar(const char *text, size_t len, uint64_t *out);

/* ---- ctl_http_parse.c ------------------------------------------------- */

/* Does buf[0..len) hold a whole request head (up to its empty line)? */
bool ctl_http_head_complete(const char *buf, size_t len);

/* The status a request head (len bytes, as ctl_http_head_complete() found
 * it) gets: 200 for GET or HEAD of /metrics (a query string is ignored; the
 * target in origin form or absolute form, http://HOST/metrics) in HTTP/1.0
 * or 1.1, 404 for another target, 405 for another method, 400 when the
 * request line is malformed. *head: whether the method is HEAD (set unless
 * 400). Reads nothing outside buf[0..len). */
int ctl_http_classify(const char *buf, size_t len, bool *head);

#endif /* WC_CTL_INTERNAL_H */
