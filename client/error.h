/*
 * error.h: the thread-local error message behind wc_errmsg().
 *
 * Library code never prints. A function that fails sets the message with
 * error_set() and returns the negative errno-style code it was given, so the
 * common failure path is one line: return error_set(-EINVAL, "%s: ...", path);
 */
#ifndef WC_ERROR_H
#define WC_ERROR_H

/* Formats the message for the calling thread and returns code. */
int error_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __clang_analyzer__
/*
 * For the static analyser only (clang-tidy, scan-build). It does not look into
 * a variadic function, so it believes `return error_set(-EINVAL, ...)` may
 * return anything, follows error paths as if they had succeeded and reports
 * the out-parameters they leave unset. This spells out what error_set() does:
 * the call, then code (evaluated once, before the call, as for the function).
 * Compiled code never sees it.
 */
#define error_set(code, ...) __extension__ ({ \
	int error_set_code_ = (code); \
	(void)error_set(error_set_code_, __VA_ARGS__); \
	error_set_code_; \
})
#endif

/* Prefixes the current message with "prefix: " (for callers that add the
 * name of the thing, such as a model name, to a lower layer's message). */
void error_prefix(const char *prefix);

/* The current message ("" when none); same as wc_errmsg(). */
const char *error_get(void);

#endif
