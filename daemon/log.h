/*
 * log.h: wcached's logging, in the style of the OpenBSD daemons.
 *
 * Every message is one line on stderr, written with a single write(2) so
 * that lines from several threads (the warm threads log too) never interleave.
 * When stderr is connected to the systemd journal ($JOURNAL_STREAM names the
 * device and inode of fd 2), each line starts with the sd-daemon priority
 * prefix ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug, "<2>" fatal)
 * and journald records the priority; otherwise each line starts with
 * "PROGNAME: " and a tag ("wcached: warning: ...", "wcached: error: ...";
 * info lines carry no tag).
 *
 * Control characters in a message (a newline in a tensor name from a hostile
 * file, say) are written as "\xNN", and C1 controls, bidirectional overrides
 * and bytes that are not UTF-8 escaped too (base/escape.h), so one call is
 * always one line and a terminal showing the log is never driven by it.
 *
 * Only the daemon's top layers log. Library code (client/, proto/) never
 * prints: it returns an error code and leaves the message for error_get().
 *
 * Names: the levels are LOG_LEVEL_*, which do not clash with <syslog.h>'s
 * LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG macros.
 *
 * Every function here preserves errno.
 */
#ifndef WC_LOG_H
#define WC_LOG_H

#include <stddef.h>
#include <stdint.h>

/* Verbosity, most severe first. A message is written when its level is at or
 * below the configured level; fatal() and fatalx() are always written. */
enum log_level {
	LOG_LEVEL_ERROR = 0,
	LOG_LEVEL_WARN = 1,
	LOG_LEVEL_INFO = 2,
	LOG_LEVEL_DEBUG = 3,
};

/* Sets the level and the program name used in the plain prefix (NULL means
 * "wcached"; the string must outlive the logger, argv[0]'s basename is fine)
 * and checks $JOURNAL_STREAM against stderr. Call it once at start-up, before
 * any thread starts. Logging before log_init() works: level info, name
 * "wcached", no journal prefixes. */
void log_init(int level, const char *progname);

/* Changes the level at run time (for example after SIGHUP reloads the
 * configuration). Safe to call while other threads log. Values outside
 * LOG_LEVEL_ERROR..LOG_LEVEL_DEBUG are clamped. */
void log_setlevel(int level);

/* The current level. */
int log_getlevel(void);

/* Parses "error", "warn", "info" or "debug" (exact, lowercase; "warning" is
 * accepted as a synonym of "warn"). Returns the level, or -EINVAL for any
 * other string (no message is set: the caller names the file and line). */
int log_level_parse(const char *name);

/* "error", "warn", "info" or "debug"; "?" for a value out of range. */
const char *log_level_name(int level);

/* $JOURNAL_STREAM's value (text, len bytes; a NUL is no digit) as systemd
 * writes it: "DEV:INO", stderr's device and inode in decimal, each of 64
 * bits at most, with no sign, blank or anything after. 0 with them in *dev
 * and *ino, else -EINVAL and both untouched. log_init() compares them with
 * fstat(2) of fd 2; the fuzzer (tests/fuzz/fuzz_kernel.c) gives it any
 * bytes. */
int log_journal_stream_parse(const char *text, size_t len, uint64_t *dev, uint64_t *ino);

/* Nonzero when log_init() found that stderr is the journal. */
int log_to_journal(void);

/* Error level: something failed and wcached carries on (a model failed to
 * load, a reload was refused). log_error appends ": strerror(errno)" with the
 * errno at the time of the call; log_errorx does not. */
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_errorx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Warning level. log_warn appends ": strerror(errno)"; log_warnx does not. */
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Info and debug levels; no errno. */
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Logs at the highest priority and exits with status 1. fatal appends
 * ": strerror(errno)"; fatalx does not. For the unrecoverable only: start-up
 * failures and broken invariants, never a client's or a file's fault. */
_Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
_Noreturn void fatalx(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif /* WC_LOG_H */
