/*
 * decimal.h: the strict decimal number the daemon and wcachectl read from
 * text others write ($JOURNAL_STREAM, /proc/self/io, $LISTEN_FDS, config
 * values): one definition, so each reader refuses the same things.
 */
#ifndef WC_DECIMAL_H
#define WC_DECIMAL_H

#include <stddef.h>
#include <stdint.h>

/*
 * The number the len bytes at s spell in decimal: digits only (no sign,
 * blank, prefix or other byte, a NUL included), at least one, leading
 * zeros allowed. 0 with it in *out; -EINVAL when a byte is not a digit or
 * len is 0, -ERANGE when the number passes UINT64_MAX (whichever the bytes
 * meet first, left to right). *out is untouched on error.
 */
int decimal_u64(const char *s, size_t len, uint64_t *out);

#endif
