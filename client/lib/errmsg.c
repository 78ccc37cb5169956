/*
 * errmsg.c: wc_errmsg(), libwcache's public view of the thread-local message
 * that every layer below sets with error_set() (base/error.h).
 */
#include "base/error.h"
#include "lib/wcache.h"

const char *
wc_errmsg(void)
{
	return error_get();
}
