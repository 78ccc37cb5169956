/*
 * error.h: the thread-local error message behind wc_errmsg().
 *
 * Library code never prints. A function that fails sets the message with
 * error_set() and returns the negative errno-style code it was given, so the
 * common failure path is one line: return error_set(-EINVAL, "%s: ...", path);
 */
#ifndef WC_ERROR_H
#define WC_ERROR_H

/* The longest message kept, its NUL included: a copy of error_get() in a
 * buffer this size is the whole message. */
#define ERROR_MAX 1024

/* Formats the message for the calling thread (never allocates). */
void error_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Sets the message and evaluates to code. code is evaluated once, before the
 * message is formatted, so error_set(-errno, "%s: %s", path, strerror(errno))
 * returns the errno of the failure. A macro over error_format(), so that
 * compilers and analysers see what it returns: a caller's error path is
 * visibly an error path, and its out-parameters visibly untouched.
 */
#define error_set(code, ...) __extension__({ \
	int error_set_code_ = (code); \
	error_format(__VA_ARGS__); \
	error_set_code_; \
})

/* Prefixes the current message with "prefix: " (for callers that add the
 * name of the thing, such as a model name, to a lower layer's message). */
void error_prefix(const char *prefix);

/* The current message ("" when none); same as wc_errmsg(). */
const char *error_get(void);

#endif
