/*
 * log.c: one-line, one-write(2) logging to stderr with journald priority
 * prefixes when stderr is the journal (see log.h).
 *
 * Each call formats the whole line into a buffer on its own stack and writes
 * it with a single write(2), so lines from concurrent threads never mix. The
 * level is an atomic so that SIGHUP can change it while warm threads log.
 * The program name and the journal flag are set once by log_init() before
 * threads start and only read afterwards.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/decimal.h"
#include "base/escape.h"
#include "base/path.h"

/* Longest line written, prefix and newline included; longer messages are
 * cut and end in "...". */
#define LOG_LINE_MAX 4096

/* The message kinds: the four levels plus fatal, which is always written. */
enum log_kind {
	KIND_FATAL,
	KIND_ERROR,
	KIND_WARN,
	KIND_INFO,
	KIND_DEBUG,
};

static atomic_int log_level = LOG_LEVEL_INFO;
static const char *log_progname = "wcached";
static int log_journal;

/* sd-daemon(3) priority prefixes (syslog priorities: crit, err, warning,
 * info, debug) and the plain-text tags, indexed by enum log_kind. */
static const char *const kind_prefix[] = {"<2>", "<3>", "<4>", "<6>", "<7>"};
static const char *const kind_tag[] = {"fatal: ", "error: ", "warning: ", "", "debug: "};

int
log_journal_stream_parse(const char *text, size_t len, uint64_t *dev, uint64_t *ino)
{
	const char *colon = memchr(text, ':', len);
	uint64_t d, i;

	if (colon == NULL || decimal_u64(text, (size_t)(colon - text), &d) < 0 ||
		decimal_u64(colon + 1, len - (size_t)(colon - text) - 1, &i) < 0)
		return -EINVAL;
	*dev = d;
	*ino = i;
	return 0;
}

/* Returns nonzero when $JOURNAL_STREAM ("DEV:INO") names the device and inode
 * of fd 2, which is how systemd says stderr is connected to the journal. */
static int
stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	uint64_t dev, ino;
	struct stat st;

	if (env == NULL || log_journal_stream_parse(env, strlen(env), &dev, &ino) < 0)
		return 0;
	if (fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;
}

static int
clamp_level(int level)
{
	if (level < LOG_LEVEL_ERROR)
		return LOG_LEVEL_ERROR;
	if (level > LOG_LEVEL_DEBUG)
		return LOG_LEVEL_DEBUG;
	return level;
}

void
log_init(int level, const char *progname)
{
	int saved = errno;

	atomic_store(&log_level, clamp_level(level));
	log_progname = progname != NULL && *progname != '\0' ? progname : "wcached";
	log_journal = stderr_is_journal();
	errno = saved;
}

void
log_setlevel(int level)
{
	atomic_store(&log_level, clamp_level(level));
}

int
log_getlevel(void)
{
	return atomic_load(&log_level);
}

int
log_to_journal(void)
{
	return log_journal;
}

int
log_level_parse(const char *name)
{
	if (name == NULL)
		return -EINVAL;
	if (strcmp(name, "error") == 0)
		return LOG_LEVEL_ERROR;
	if (strcmp(name, "warn") == 0 || strcmp(name, "warning") == 0)
		return LOG_LEVEL_WARN;
	if (strcmp(name, "info") == 0)
		return LOG_LEVEL_INFO;
	if (strcmp(name, "debug") == 0)
		return LOG_LEVEL_DEBUG;
	return -EINVAL;
}

const char *
log_level_name(int level)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};

	if (level < LOG_LEVEL_ERROR || level > LOG_LEVEL_DEBUG)
		return "?";
	return names[level];
}

/* Appends src to buf at *pos, escaped (base/escape.h: controls, C1, bidi
 * overrides, invalid UTF-8) so that the result stays on one line and
 * cannot drive a terminal that shows the log, up to limit and never in the
 * middle of an escape or a character. Returns 1 when src did not fit. */
static int
append_escaped(char *buf, size_t *pos, size_t limit, const char *src)
{
	const unsigned char *p = (const unsigned char *)src, *end = p + strlen(src);
	char out[ESCAPE_STEP_MAX];
	size_t len;

	while (p < end) {
		p += escape_step(p, end, out, &len);
		if (limit - *pos < len)
			return 1;
		memcpy(buf + *pos, out, len);
		*pos += len;
	}
	return 0;
}

/* Appends a plain string without escaping (our own prefixes). */
static void
append_raw(char *buf, size_t *pos, size_t limit, const char *src)
{
	size_t n = strnlen(src, limit - *pos); /* what fits; buf is not a C string */

	memcpy(buf + *pos, src, n);
	*pos += n;
}

/* Formats and writes one line: prefix, message, optionally ": strerror(err)"
 * (err >= 0), newline. */
static void __attribute__((format(printf, 3, 0)))
log_line(enum log_kind kind, int err, const char *fmt, va_list ap)
{
	char msg[LOG_LINE_MAX];
	char line[LOG_LINE_MAX + 8];
	/* Room for "...\n" at the end of a truncated line. */
	const size_t limit = LOG_LINE_MAX - 4;
	size_t pos = 0;
	int n, cut;

	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	if (n < 0)
		snprintf(msg, sizeof(msg), "(bad log format \"%s\")", fmt);

	if (log_journal) {
		append_raw(line, &pos, limit, kind_prefix[kind]);
	} else {
		append_raw(line, &pos, limit, log_progname);
		append_raw(line, &pos, limit, ": ");
		append_raw(line, &pos, limit, kind_tag[kind]);
	}
	cut = append_escaped(line, &pos, limit, msg);
	if (err >= 0 && !cut) {
		char ebuf[128];
		const char *es = strerror_r(err, ebuf, sizeof(ebuf));

		append_raw(line, &pos, limit, ": ");
		cut = append_escaped(line, &pos, limit, es);
	}
	if (cut || pos >= limit || (size_t)n >= sizeof(msg))
		append_raw(line, &pos, sizeof(line) - 1, "...");
	line[pos++] = '\n';
	(void)fd_write_all(STDERR_FILENO, line, pos);
}

/* Whether a message of this kind passes the current level. */
static int
enabled(enum log_kind kind)
{
	int level = atomic_load_explicit(&log_level, memory_order_relaxed);

	switch (kind) {
	case KIND_FATAL:
		return 1;
	case KIND_ERROR:
		return level >= LOG_LEVEL_ERROR;
	case KIND_WARN:
		return level >= LOG_LEVEL_WARN;
	case KIND_INFO:
		return level >= LOG_LEVEL_INFO;
	case KIND_DEBUG:
		return level >= LOG_LEVEL_DEBUG;
	}
	return 0;
}

/* The body of every public function: saves errno, filters by level, logs
 * with or without strerror, restores errno. */
#define LOG_BODY(kind, with_errno)                                                 \
	do {                                                                       \
		int saved_errno = errno;                                           \
		va_list ap;                                                        \
		if (enabled(kind)) {                                               \
			va_start(ap, fmt);                                         \
			log_line(kind, (with_errno) ? saved_errno : -1, fmt, ap); \
			va_end(ap);                                                \
		}                                                                  \
		errno = saved_errno;                                               \
	} while (0)

void
log_error(const char *fmt, ...)
{
	LOG_BODY(KIND_ERROR, 1);
}

void
log_errorx(const char *fmt, ...)
{
	LOG_BODY(KIND_ERROR, 0);
}

void
log_warn(const char *fmt, ...)
{
	LOG_BODY(KIND_WARN, 1);
}

void
log_warnx(const char *fmt, ...)
{
	LOG_BODY(KIND_WARN, 0);
}

void
log_info(const char *fmt, ...)
{
	LOG_BODY(KIND_INFO, 0);
}

void
log_debug(const char *fmt, ...)
{
	LOG_BODY(KIND_DEBUG, 0);
}

void
fatal(const char *fmt, ...)
{
	LOG_BODY(KIND_FATAL, 1);
	exit(1);
}

void
fatalx(const char *fmt, ...)
{
	LOG_BODY(KIND_FATAL, 0);
	exit(1);
}
