/*
 * escape.c: text made safe to print on a terminal or a log line (see
 * escape.h). Built on json_utf8_seq(), the one UTF-8 check of the
 * project, so that what is "valid UTF-8" here is what the JSON reader and
 * the WEIG reader accept.
 */
#include <locale.h>
#include <string.h>
#include <wchar.h>

#include "base/escape.h"
#include "base/json.h"

/* The code point of the valid UTF-8 sequence p[0 .. n). */
static unsigned
code_point(const unsigned char *p, size_t n)
{
	static const unsigned lead_mask[] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
	unsigned cp = p[0] & lead_mask[n];

	for (size_t i = 1; i < n; i++)
		cp = cp << 6 | (p[i] & 0x3fu);
	return cp;
}

/* Whether cp is a character a terminal acts on rather than shows. */
static int
is_control(unsigned cp)
{
	return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
	       (cp >= 0x2066 && cp <= 0x2069);
}

size_t
escape_step(const unsigned char *p, const unsigned char *end, char out[ESCAPE_STEP_MAX],
	size_t *out_len)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = json_utf8_seq(p, end);
	unsigned cp;

	if (n == 1 && *p >= 0x20 && *p != 0x7f) {
		out[0] = (char)*p;
		*out_len = 1;
		return 1;
	}
	if (n <= 1) { /* a C0 control, DEL, or a byte that is not UTF-8 */
		out[0] = '\\';
		out[1] = 'x';
		out[2] = hex[*p >> 4];
		out[3] = hex[*p & 0xf];
		*out_len = 4;
		return 1;
	}
	if (is_control(cp = code_point(p, n))) {
		out[0] = '\\';
		out[1] = 'u';
		for (int i = 0; i < 4; i++)
			out[2 + i] = hex[cp >> (12 - 4 * i) & 0xf];
		*out_len = 6;
		return n;
	}
	memcpy(out, p, n);
	*out_len = n;
	return n;
}

void
escape_print(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	char out[ESCAPE_STEP_MAX];
	size_t len;

	while (p < end) {
		p += escape_step(p, end, out, &len);
		fwrite(out, 1, len, f);
	}
}

/* The columns code point cp takes on a terminal, by wcwidth() in C.UTF-8
 * (*utf8: made at the first call, freed by the caller); 1 where that locale
 * cannot be had or the character is not printable there. Thread-safe: the
 * locale is this thread's only for the call (uselocale()). */
static size_t
char_width(unsigned cp, locale_t *utf8)
{
	locale_t was;
	int w;

	if (*utf8 == (locale_t)0 &&
	    (*utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0)) == (locale_t)0)
		return 1;
	was = uselocale(*utf8);
	w = wcwidth((wchar_t)cp);
	uselocale(was);
	return w < 0 ? 1 : (size_t)w;
}

size_t
escape_width(const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	char out[ESCAPE_STEP_MAX];
	size_t len, width = 0;
	locale_t utf8 = (locale_t)0;

	while (p < end) {
		size_t n = escape_step(p, end, out, &len);

		/* An escape (never as long as what it stands for) is as wide
		 * as its text; an ASCII character one column, another what
		 * wcwidth() says in C.UTF-8, whatever the caller's locale: the
		 * text is UTF-8 (checked), and a terminal shows a CJK character
		 * in two columns. One column where C.UTF-8 is missing or does
		 * not know the character. */
		if (len != n)
			width += len;
		else if (n == 1)
			width += 1;
		else
			width += char_width(code_point(p, n), &utf8);
		p += n;
	}
	if (utf8 != (locale_t)0)
		freelocale(utf8);
	return width;
}

char *
escape_string(char *dst, size_t cap, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	char out[ESCAPE_STEP_MAX];
	size_t pos = 0, n;

	while (p < end) {
		size_t step = escape_step(p, end, out, &n);

		if (n >= cap - pos) /* no room for it and the NUL */
			break;
		memcpy(dst + pos, out, n);
		pos += n;
		p += step;
	}
	dst[pos] = '\0';
	return dst;
}
