/*
 * lograte.h: warnings that a peer can cause, at most one per uid per
 * minute. A local user who loops on connect(), or sends garbage, must not
 * be able to flood the log with a line per attempt (journald's default
 * RateLimitBurst would then drop every other line of wcached, real load
 * errors included); the metrics still count every event. The control
 * socket's refusals and the client socket's warnings use it.
 */
#ifndef WC_LOGRATE_H
#define WC_LOGRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define LOGRATE_UIDS 8           /* uids whose warnings are limited one by one */
#define LOGRATE_WARN_MS 60000    /* one warning per uid in this long */

/* When one uid's warnings were last logged, and how many have not been since. */
struct lograte_uid {
	uid_t uid;
	uint64_t warned_ms;  /* the first line of its minute */
	unsigned logged;     /* lines logged in that minute */
	uint64_t unlogged;
};

/* A limiter; zero-initialised is ready to use. */
struct lograte {
	struct lograte_uid uids[LOGRATE_UIDS];
	unsigned nuids;      /* uids[] in use */
	uint64_t unlogged;   /* of uids uids[] had no room for */
};

/*
 * Whether to log a warning about uid now (now_ms: the loop's clock): once
 * per uid per LOGRATE_WARN_MS, for LOGRATE_UIDS uids at a time (a slot
 * quiet for a minute is taken over; when none is, the warning is not
 * logged, only counted). When it returns true, *unlogged is the number of
 * warnings of this uid, and of uids there was no room for, not logged since
 * the last one; the caller says so in its line (lograte_more()).
 */
bool lograte_allow(struct lograte *lr, uid_t uid, uint64_t now_ms, uint64_t *unlogged);

/* lograte_allow() with burst (at least 1) lines per uid per LOGRATE_WARN_MS
 * instead of one: for lines a peer causes that an operator wants to see a
 * few of (derived artifacts' builds). lograte_allow() is burst 1. */
bool lograte_allow_burst(struct lograte *lr, uid_t uid, uint64_t now_ms, unsigned burst,
	uint64_t *unlogged);

/* " (N more WHAT not logged since the last warning)" for unlogged > 0,
 * else "", in buf (size bytes); returns buf. */
const char *lograte_more(char *buf, size_t size, uint64_t unlogged, const char *what);

/* What every caller does: lograte_allow_burst() and, when it allows the
 * line, lograte_more() into more (size bytes) with what. */
bool lograte_check(struct lograte *lr, uid_t uid, uint64_t now_ms, unsigned burst, char *more,
	size_t size, const char *what);

#endif
