/*
 * inifile.c: wcache's INI reader over inih (see inifile.h).
 *
 * inih parses every line: comments, the byte order mark, whitespace, section
 * headers and "key = value" splitting, with the options set in
 * inih_configure(). Around it, for what Debian's build of inih cannot give:
 *
 * - Line numbers: its handler has no line number (INI_HANDLER_LINENO is 0
 *   in <ini.h>), so the file reaches ini_parse_stream() through our reader,
 *   which counts lines: it returns one whole line per call (inih's buffer
 *   holds the longest line allowed), so the handler's line is the reader's.
 * - Sections: inih calls its handler only for keys (an empty section would
 *   go unseen) and cuts section names at 49 bytes (wcached's model names
 *   may have 128). inih stops at the first error, so when it asks for the
 *   next line it has accepted the previous one: if that was a header, the
 *   reader reports it then, with the name taken from our copy of the line.
 * - Reasons: inih reports a bad line by its number only; the reason is
 *   worded here from the line ('[' without ']', or no '=' or ':').
 * - Stricter than inih: text after a header's ']' that is not a comment, an
 *   empty key, a NUL byte and an over-long line are errors (inih ignores
 *   the first, accepts the second and cuts lines at the others).
 * - Only a regular file is read, opened so that a FIFO or a terminal cannot
 *   block the open (open_regular()).
 */
#include "base/inifile.h"

#include "base/error.h"
#include "base/file.h"
#include "base/path.h"


#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* inih's line buffer: the longest line and the NUL (inih's "3 more than the
 * longest line" counts a '\r' and a '\n' the limit already includes). */
#define INIH_BUFFER (INIFILE_LINE_MAX + 3)

struct inifile {
	const char *path;
	FILE *fp;
	const struct inifile_handler *h;
	void *arg;
	int line;           /* lines read so far: the current line */
	char *raw;          /* the current line as read: INIFILE_LINE_MAX bytes and a NUL */
	char *start;        /* in raw: the line without BOM and surrounding whitespace */
	bool header;        /* the current line is a header inih has not yet taken */
	int err;            /* first error (negative), 0 while all is well */
};

/* Sets inih's process-wide options (Debian's libinih makes its INI_* build
 * options variables) to the syntax of inifile.h. */
static void
inih_configure(void)
{
	ini_allow_multiline = false; /* leading whitespace is indentation */
	ini_allow_bom = true;
	ini_start_comment_prefixes = (char *)";#";
	ini_allow_inline_comments = true;
	ini_inline_comment_prefixes = (char *)";";
	ini_allow_no_value = false;
	ini_stop_on_first_error = true;
	ini_use_stack = false; /* a heap buffer of a whole line, one reader call per line */
	ini_allow_realloc = false;
	ini_initial_alloc = INIH_BUFFER;
	ini_max_line = INIH_BUFFER;
}

/* ---- errors ----------------------------------------------------------- */

static int __attribute__((format(printf, 4, 0)))
inifile_verror(struct inifile *f, int line, int code, const char *fmt, va_list ap)
{
	char reason[1024];

	if (f->err != 0)
		return code;
	vsnprintf(reason, sizeof(reason), fmt, ap);
	if (line > 0)
		f->err = error_set(code, "%s:%d: %s", f->path, line, reason);
	else
		f->err = error_set(code, "%s: %s", f->path, reason);
	return code;
}

int
inifile_error(struct inifile *f, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	code = inifile_verror(f, f->line, code, fmt, ap);
	va_end(ap);
	return code;
}

int
inifile_error_at(struct inifile *f, int line, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	code = inifile_verror(f, line, code, fmt, ap);
	va_end(ap);
	return code;
}

const char *
inifile_path(const struct inifile *f)
{
	return f->path;
}

int
inifile_line(const struct inifile *f)
{
	return f->line;
}

/* A callback's result: its error, or a generic one if it recorded none. */
static int
callback_result(struct inifile *f, int r)
{
	if (r < 0 && f->err == 0)
		inifile_error(f, r, "%s", strerror(-r));
	return r < 0 ? f->err : 0;
}

/* ---- around inih ------------------------------------------------------ */

/* Reports the header on the current line, which inih has accepted: there
 * is a ']' before any comment. */
static int
section_begin(struct inifile *f)
{
	char *end = strchr(f->start, ']'), *name = f->start + 1, *rest;

	f->header = false;
	if (end == NULL) /* not after inih's check; kept for safety */
		return inifile_error(f, -EINVAL, "section header without closing ']'");
	rest = end + 1;
	while (*rest == ' ' || *rest == '\t')
		rest++;
	if (*rest != '\0' && *rest != ';' && *rest != '#')
		return inifile_error(f, -EINVAL, "unexpected text after section header: \"%s\"",
			rest);
	*end = '\0';
	while (*name == ' ' || *name == '\t')
		name++;
	while (end > name && (end[-1] == ' ' || end[-1] == '\t'))
		*--end = '\0';
	return callback_result(f, f->h->section(f, name, f->arg));
}

/*
 * Reads the next line into f->raw, newline included, NUL-terminated: its
 * length, 0 at the end of the file, or -1 after an error (recorded in f).
 * Never holds more than INIFILE_LINE_MAX bytes, however long the line in
 * the file (a config of one endless line, /dev/zero): a line too long, a
 * NUL byte and a read error each end the read with their own message.
 */
static ssize_t
read_line(struct inifile *f)
{
	size_t len = 0;
	int c = 0;

	while (len < INIFILE_LINE_MAX && (c = getc_unlocked(f->fp)) != EOF) {
		if (c == '\0') {
			f->line++;
			inifile_error(f, -EINVAL, "line contains a NUL byte");
			return -1;
		}
		f->raw[len++] = (char)c;
		if (c == '\n')
			break;
	}
	if (len == INIFILE_LINE_MAX && c != '\n' && getc_unlocked(f->fp) != EOF) {
		f->line++;
		inifile_error(f, -EINVAL, "line too long (more than %d bytes)", INIFILE_LINE_MAX);
		return -1;
	}
	if (ferror(f->fp)) {
		int code = errno != 0 ? errno : EIO;

		inifile_error_at(f, 0, -code, "read error: %s", strerror(code));
		return -1;
	}
	f->raw[len] = '\0';
	return (ssize_t)len;
}

/* inih's reader: the next line of the file in str (num bytes), or NULL at
 * the end of the file or after the first error. */
static char *
inifile_reader(char *str, int num, void *stream)
{
	struct inifile *f = stream;
	ssize_t len;
	char *s, *e;

	/* inih took the previous line (it stops at an error): a header on it
	 * starts a section now. */
	if (f->header && section_begin(f) < 0)
		return NULL;
	if (f->err != 0)
		return NULL;
	errno = 0;
	if ((len = read_line(f)) <= 0)
		return NULL;
	f->line++;
	if (len >= num) { /* not with inih's buffer: INIH_BUFFER holds a whole line */
		inifile_error(f, -EINVAL, "line too long (%zd bytes, max %d)", len, num - 1);
		return NULL;
	}
	memcpy(str, f->raw, (size_t)len + 1);

	/* Our view of the line, for headers and messages: what inih parses
	 * (inih skips the same BOM and whitespace). */
	s = f->raw;
	if (f->line == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
		s += 3;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	while (isspace((unsigned char)*s))
		s++;
	f->start = s;
	f->header = *s == '[';
	return str;
}

/* inih's handler, for each "key = value" line: the current line. Returns 0
 * to stop inih after an error. */
static int
inifile_handler(void *user, const char *section, const char *name, const char *value)
{
	struct inifile *f = user;

	(void)section; /* cut at 49 bytes; the section callback had the whole name */
	if (*name == '\0') {
		inifile_error(f, -EINVAL, "missing key name before '%c'", *f->start);
		return 0;
	}
	return callback_result(f, f->h->key(f, name, value, f->arg)) == 0;
}

/* ---- opening ---------------------------------------------------------- */

/* The error for path, which is not a regular file (its type in mode): a
 * directory is -EISDIR, anything else -EINVAL. */
static int
not_regular(const char *path, mode_t mode)
{
	return error_set(S_ISDIR(mode) ? -EISDIR : -EINVAL, "%s: not a regular file (%s)", path,
		path_file_kind(mode));
}

/*
 * Opens path for reading as a regular file: a stream, or NULL with the
 * message set and *code its error. O_NONBLOCK, so that a FIFO with no
 * writer (or a terminal, a device) is refused by the type check, not
 * waited on for ever: wcached --check, wcachectl, and a reload's read on
 * wcached's work queue would each hang there (the reload holding a
 * thread, each later reload, and a stop for 30 s). A config must be a
 * regular file: a reload reads it again, which a pipe cannot give.
 * O_NONBLOCK is cleared before the stream reads.
 */
static FILE *
open_regular(const char *path, int *code)
{
	struct stat st;
	FILE *fp;
	int fd, fl;

	fd = file_openat(AT_FDCWD, path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd == -1) {
		int e = errno;

		/* A socket or a device without a driver: "No such device or
		 * address" says less than what it is. */
		if ((e == ENXIO || e == ENODEV) && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
			*code = not_regular(path, st.st_mode);
		else
			*code = error_set(-e, "%s: %s", path, strerror(e));
		return NULL;
	}
	if (file_fstat(fd, &st) == -1) {
		*code = error_set(-errno, "%s: fstat: %s", path, strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		*code = not_regular(path, st.st_mode);
	} else if ((fl = fcntl(fd, F_GETFL)) == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1) {
		*code = error_set(-errno, "%s: fcntl: %s", path, strerror(errno));
	} else if ((fp = fdopen(fd, "r")) == NULL) {
		*code = error_set(-errno, "%s: %s", path, strerror(errno));
	} else {
		return fp; /* owns fd */
	}
	close(fd);
	return NULL;
}

/* ---- reading ---------------------------------------------------------- */

int
inifile_read(const char *path, const struct inifile_handler *h, void *arg)
{
	struct inifile f;
	int r;

	if (path[0] == '\0') /* open() would say only "No such file or directory" */
		return error_set(-ENOENT, "\"\": an empty path names no file");
	memset(&f, 0, sizeof(f));
	f.path = path;
	f.h = h;
	f.arg = arg;
	if ((f.raw = malloc(INIFILE_LINE_MAX + 1)) == NULL)
		return error_set(-ENOMEM, "%s: out of memory", path);
	if ((f.fp = open_regular(path, &r)) == NULL) {
		free(f.raw);
		return r;
	}

	inih_configure();
	r = ini_parse_stream(inifile_reader, &f, inifile_handler, &f);
	if (f.err == 0) {
		if (r > 0 && *f.start == '[')
			inifile_error_at(&f, r, -EINVAL, "section header without closing ']'");
		else if (r > 0)
			inifile_error_at(&f, r, -EINVAL,
				"expected \"key = value\", a [section] or a comment, got \"%s\"",
				f.start);
		else if (r == -2)
			inifile_error_at(&f, 0, -ENOMEM, "out of memory");
		else if (r < 0)
			inifile_error_at(&f, 0, -EIO, "cannot parse (inih error %d)", r);
		else if (h->end != NULL)
			callback_result(&f, h->end(&f, arg));
	}
	fclose(f.fp);
	free(f.raw);
	return f.err;
}

/* ---- paths ------------------------------------------------------------ */

/* s without its leading "./" components. */
static const char *
skip_dot_slash(const char *s)
{
	while (s[0] == '.' && s[1] == '/') {
		s += 2;
		while (*s == '/')
			s++;
	}
	return s;
}

int
inifile_dir(const char *path, char **out)
{
	char *abs, *slash;

	if (path[0] == '/') {
		abs = strdup(path);
	} else {
		char *cwd = getcwd(NULL, 0);

		if (cwd == NULL)
			return error_set(-errno, "%s: cannot get the current directory: %s", path,
				strerror(errno));
		path = skip_dot_slash(path);
		if (asprintf(&abs, "%s%s%s", cwd, strcmp(cwd, "/") == 0 ? "" : "/", path) < 0)
			abs = NULL;
		free(cwd);
	}
	if (abs == NULL)
		return error_set(-ENOMEM, "out of memory");
	slash = strrchr(abs, '/');
	if (slash == abs)
		slash[1] = '\0'; /* the file is in "/" */
	else
		*slash = '\0';
	*out = abs;
	return 0;
}

int
inifile_join(const char *dir, const char *value, char **out)
{
	char *p = path_join(dir, value);

	if (p == NULL)
		return -ENOMEM;
	*out = p;
	return 0;
}
