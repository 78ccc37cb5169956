/*
 * escape.h: text from a file, a socket or a peer made safe to print on a
 * terminal or on one log line. A model's file names, tensor names and
 * paths, and every message that quotes them, are chosen by whoever wrote
 * the file: printed raw, an escape sequence in them could clear an
 * operator's screen, retitle the terminal, or hide text (bidirectional
 * overrides), and a newline could forge a log line.
 *
 * What is escaped: C0 controls and DEL as \xNN; C1 controls (U+0080 to
 * U+009F, which terminals that honour them read as ESC sequences: U+009B
 * is CSI) and the bidirectional embeddings, overrides and isolates
 * (U+202A to U+202E, U+2066 to U+2069) as \uNNNN; every byte that is not
 * part of valid UTF-8 as \xNN. Everything else, printable ASCII and other
 * UTF-8 characters, is written as it is.
 *
 * A backslash is written as it is, not as "\\": so the text "\x1b" and a
 * real ESC print alike. That is on purpose: escaped text is printable ASCII
 * and characters kept as they are, so escaping it again changes nothing
 * (escape_string(escape_string(s)) is escape_string(s)), and the layers
 * that each escape what they show (every wc_errmsg() message, error.c; the
 * daemon's log line; wcachectl's output) show a message once, not with its
 * backslashes doubled at each layer. What escaping is for, a terminal that
 * only shows text and a log line that stays one line, holds either way;
 * the exact bytes of names are in the --json outputs (messages are
 * escaped where they are made).
 */
#ifndef WC_ESCAPE_H
#define WC_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

/* Room escape_step() needs in out: the longest escape ("\u202e") or one
 * UTF-8 character (4 bytes), without a terminating NUL. */
#define ESCAPE_STEP_MAX 6

/*
 * The next piece of p[0 .. end) (p before end): writes to out what is to
 * be printed for it (the bytes themselves or their escape; not a C
 * string), sets *out_len to its length, and returns how many bytes of p
 * it stands for (1 to 4).
 */
size_t escape_step(const unsigned char *p, const unsigned char *end, char out[ESCAPE_STEP_MAX],
	size_t *out_len);

/* Writes s (a C string), escaped, to f. */
void escape_print(FILE *f, const char *s);

/* The number of terminal columns escape_print() of s takes: an escape as
 * wide as its text, a character as wide as wcwidth() says in C.UTF-8 (two
 * for a CJK ideograph, none for a combining mark), one where C.UTF-8 is
 * missing. */
size_t escape_width(const char *s);

/*
 * Writes s[0 .. len), escaped, into dst (cap bytes, cap >= 1) as a C string
 * and returns dst. What does not fit is left out at the end, cut between
 * two pieces (never inside an escape or a character). error.c escapes
 * every wc_errmsg() message with it.
 */
char *escape_string(char *dst, size_t cap, const char *s, size_t len);

#endif
