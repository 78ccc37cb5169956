/*
 * error.c: the thread-local error message of the client code and the daemon
 * (libwcache returns it as wc_errmsg(), lib/errmsg.c).
 *
 * One fixed buffer per thread: setting a message never allocates, so even
 * -ENOMEM paths can leave one.
 *
 * Every message is escaped as it is set (base/escape.h): messages quote
 * what files and peers chose (a shard's name from a model's index, a tensor
 * name, metadata, a path, the daemon's error text), and a worker logs
 * wc_errmsg() as it is, so an escape sequence or a newline in them must not
 * reach its terminal or its log as a control. Escaping here, once for every
 * message, leaves no message that forgets to; escaped text escapes to
 * itself, so the daemon's log and wcachectl, which escape what they show,
 * show it the same.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/escape.h"

static _Thread_local char error_message[ERROR_MAX];

void
error_format(const char *fmt, ...)
{
	char raw[ERROR_MAX];
	va_list ap;

	/* Formatted apart from error_message, which an argument may be
	 * (error_get()), then escaped into it. */
	va_start(ap, fmt);
	vsnprintf(raw, sizeof(raw), fmt, ap);
	va_end(ap);
	escape_string(error_message, sizeof(error_message), raw, strlen(raw));
}

void
error_prefix(const char *prefix)
{
	char shown[ERROR_MAX - 2];
	size_t plen, mlen = strlen(error_message);

	/* The prefix escaped as the message was (a model's name). */
	plen = strlen(escape_string(shown, sizeof(shown), prefix, strlen(prefix)));

	/* Shift the message right and write the prefix in front; a message
	 * that no longer fits is cut at the end, before a character (it is
	 * escaped: ASCII and whole UTF-8 characters). */
	if (plen + 2 + mlen >= ERROR_MAX) {
		mlen = ERROR_MAX - 1 - plen - 2;
		while (mlen > 0 && ((unsigned char)error_message[mlen] & 0xc0) == 0x80)
			mlen--;
	}
	memmove(error_message + plen + 2, error_message, mlen);
	memcpy(error_message, shown, plen);
	memcpy(error_message + plen, ": ", 2);
	error_message[plen + 2 + mlen] = '\0';
}

const char *
error_get(void)
{
	return error_message;
}
