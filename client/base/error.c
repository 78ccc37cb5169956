/*
 * error.c: the thread-local error message of the client code and the daemon
 * (libwcache returns it as wc_errmsg(), lib/errmsg.c).
 *
 * One fixed buffer per thread: setting a message never allocates, so even
 * -ENOMEM paths can leave one.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

#define ERROR_MAX 1024

static _Thread_local char error_message[ERROR_MAX];

void
error_format(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(error_message, sizeof(error_message), fmt, ap);
	va_end(ap);
}

void
error_prefix(const char *prefix)
{
	size_t plen = strlen(prefix), mlen = strlen(error_message);

	/* Shift the message right and write the prefix in front; a message
	 * that no longer fits is cut at the end. */
	if (plen + 2 >= ERROR_MAX)
		plen = ERROR_MAX - 3;
	if (plen + 2 + mlen >= ERROR_MAX)
		mlen = ERROR_MAX - 1 - plen - 2;
	memmove(error_message + plen + 2, error_message, mlen);
	memcpy(error_message, prefix, plen);
	memcpy(error_message + plen, ": ", 2);
	error_message[plen + 2 + mlen] = '\0';
}

const char *
error_get(void)
{
	return error_message;
}
