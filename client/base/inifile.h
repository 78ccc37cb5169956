/*
 * inifile.h: the reader of wcache's INI files (wcached's configuration),
 * shared by wcached and wcachectl so that both read one file the same way.
 * The syntax is inih's, configured in inifile.c; the meaning of sections and
 * keys is the caller's (daemon/config.c for wcached, client/ctl/control.c
 * for wcachectl's -c CONFIG).
 *
 * The syntax (daemon/config.h shows a file):
 * - "[NAME]" starts a section; only a comment may follow the ']'. Spaces
 *   and tabs around NAME are not part of it.
 * - "key = value" or "key: value"; whitespace around both is not part of
 *   them; the value may be empty, the key may not.
 * - ';' or '#' at the start of a line, or ';' after whitespace inside one,
 *   starts a comment.
 * - Any leading whitespace (isspace(), vertical tab and form feed included)
 *   is indentation: there are no continuation lines.
 * - A UTF-8 byte order mark may start the file; CRLF line ends are fine.
 * - A line holds at most INIFILE_LINE_MAX bytes, newline included, and no
 *   NUL byte.
 * Anything else is an error, and the first error ends the read.
 *
 * This is not part of libwcache: workers never read INI files, and the
 * library stays free of inih. wcached and wcachectl link it as the static
 * library wcini.
 */
#ifndef WC_INIFILE_H
#define WC_INIFILE_H

#include "proto/bounds.h" /* CONFIG_LINE_MAX: the longest line accepted, newline included */

#define INIFILE_LINE_MAX CONFIG_LINE_MAX

/* A file being read; handlers get it to report errors and ask the line. */
struct inifile;

/*
 * What a file's lines mean, called in file order. Each callback returns 0
 * to go on, or a negative errno-style code after recording its error with
 * inifile_error() or inifile_error_at(), which ends the read.
 */
struct inifile_handler {
	/* A "[NAME]" line (the current line). */
	int (*section)(struct inifile *f, const char *name, void *arg);
	/* A "key = value" line (the current line): key is not empty. Keys
	 * before the first header come with no section call before them. */
	int (*key)(struct inifile *f, const char *key, const char *value, void *arg);
	/* The end of a file read without error, for checks that need all of
	 * it; NULL when there are none. */
	int (*end)(struct inifile *f, void *arg);
};

/*
 * Reads the INI file at path, calling h's callbacks with arg. Returns 0, or
 * the first error's negative errno-style code with the thread's message
 * (error_get()) set: "PATH: reason" for the open or a read error (-errno),
 * "PATH: not a regular file (a FIFO)" for anything but a regular file, a
 * FIFO without a writer refused at once, never waited on (-EISDIR for a
 * directory, else -EINVAL),
 * "PATH:LINE: reason" for a line (-EINVAL for its syntax, or the handler's
 * code), or -ENOMEM.
 *
 * inih's options are process-wide in Debian's libinih, so this sets them
 * before every read: two reads must not run at once on two threads, and
 * nothing else in a process that uses this may use inih.
 */
int inifile_read(const char *path, const struct inifile_handler *h, void *arg);

/* The path being read, as inifile_read() got it. */
const char *inifile_path(const struct inifile *f);

/* The line being handled (1-based); the last line in the end callback. */
int inifile_line(const struct inifile *f);

/* Records the read's first error as "PATH:LINE: reason", at the current
 * line, and returns code; later errors are ignored. */
int inifile_error(struct inifile *f, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The same at a given line; line 0 gives "PATH: reason". */
int inifile_error_at(struct inifile *f, int line, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Relative paths in an INI file are relative to the file's directory. */

/* The absolute directory of the file at path (the current directory joined
 * with a relative path, "./" dropped, no symlink resolved), new in *out.
 * Returns 0, or a negative errno-style code with the message set. */
int inifile_dir(const char *path, char **out);

/* value joined with dir (from inifile_dir()): value itself when absolute,
 * else dir/value with leading "./" dropped ("." or "./" alone is dir). New
 * in *out. Returns 0 or -ENOMEM (no message: the caller names the key). */
int inifile_join(const char *dir, const char *value, char **out);

#endif /* WC_INIFILE_H */
