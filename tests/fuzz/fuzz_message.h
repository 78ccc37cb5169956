/*
 * fuzz_message.h: what every wc_errmsg() message promises, for the harnesses
 * of parsers whose messages quote what a file chose (names, paths): it is
 * escaped (base/error.c, base/escape.h), so nothing in it is a control a
 * terminal acts on, and it is one line.
 */
#ifndef WC_FUZZ_MESSAGE_H
#define WC_FUZZ_MESSAGE_H

#include <stdbool.h>
#include <string.h>

#include "base/escape.h"

/* Whether every piece of s is one that escape_step() keeps as it is. */
static inline bool
fuzz_message_harmless(const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	char out[ESCAPE_STEP_MAX];
	size_t k, out_len;

	for (; p < end; p += k) {
		k = escape_step(p, end, out, &out_len);
		if (out_len != k || memcmp(out, p, k) != 0)
			return false;
	}
	return true;
}

#endif /* WC_FUZZ_MESSAGE_H */
