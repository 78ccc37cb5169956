/*
 * pin.c: the pin words (see pin.h).
 */
#include "proto/pin.h"

#include <errno.h>
#include <string.h>

static const char *const pin_names[] = {
	[PIN_NONE] = "none",
	[PIN_METADATA] = "metadata",
	[PIN_ALL] = "all",
};

int
pin_mode_parse(const char *s, enum pin_mode *out)
{
	for (size_t i = 0; i < sizeof(pin_names) / sizeof(pin_names[0]); i++) {
		if (strcmp(s, pin_names[i]) == 0) {
			*out = (enum pin_mode)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *
pin_mode_name(enum pin_mode p)
{
	return (unsigned)p < sizeof(pin_names) / sizeof(pin_names[0]) ? pin_names[p] : "metadata";
}
