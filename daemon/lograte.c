/*
 * lograte.c: at most one warning per uid per minute (lograte.h). A table of
 * LOGRATE_UIDS uids, searched in order: small, because it only has to hold
 * the uids that misbehave at once, and a uid it has no room for is counted
 * in the next line logged rather than logged.
 */
#include "lograte.h"

#include <inttypes.h>
#include <stdio.h>

bool
lograte_allow(struct lograte *lr, uid_t uid, uint64_t now_ms, uint64_t *unlogged)
{
	return lograte_allow_burst(lr, uid, now_ms, 1, unlogged);
}

bool
lograte_allow_burst(struct lograte *lr, uid_t uid, uint64_t now_ms, unsigned burst,
	uint64_t *unlogged)
{
	struct lograte_uid *r = NULL;

	for (unsigned i = 0; i < lr->nuids && r == NULL; i++)
		if (lr->uids[i].uid == uid)
			r = &lr->uids[i];
	if (r != NULL && now_ms - r->warned_ms < LOGRATE_WARN_MS) {
		if (r->logged < burst) {
			r->logged++;
			*unlogged = r->unlogged + lr->unlogged;
			r->unlogged = lr->unlogged = 0;
			return true;
		}
		r->unlogged++;
		return false;
	}
	if (r == NULL && lr->nuids < LOGRATE_UIDS)
		r = &lr->uids[lr->nuids++];
	for (unsigned i = 0; i < lr->nuids && r == NULL; i++)
		if (now_ms - lr->uids[i].warned_ms >= LOGRATE_WARN_MS)
			r = &lr->uids[i]; /* another uid's, quiet for a minute */
	if (r == NULL) {
		lr->unlogged++;
		return false;
	}
	if (r->uid != uid) {
		lr->unlogged += r->unlogged;
		*r = (struct lograte_uid){ .uid = uid };
	}
	*unlogged = r->unlogged + lr->unlogged;
	r->unlogged = lr->unlogged = 0;
	r->warned_ms = now_ms;
	r->logged = 1;
	return true;
}

const char *
lograte_more(char *buf, size_t size, uint64_t unlogged, const char *what)
{
	if (size > 0)
		buf[0] = '\0';
	if (unlogged > 0)
		snprintf(buf, size, " (%" PRIu64 " more %s not logged since the last warning)",
			unlogged, what);
	return buf;
}

bool
lograte_check(struct lograte *lr, uid_t uid, uint64_t now_ms, unsigned burst, char *more,
	size_t size, const char *what)
{
	uint64_t unlogged = 0;

	if (!lograte_allow_burst(lr, uid, now_ms, burst, &unlogged))
		return false;
	lograte_more(more, size, unlogged, what);
	return true;
}
