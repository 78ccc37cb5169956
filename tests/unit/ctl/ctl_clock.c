/*
 * ctl_clock.c: ctl_monotonic() (ctl.h) for the tests and fuzz harnesses
 * that link wcachectl's sources but main.c, which defines it there.
 */
#include <time.h>

#include "ctl/ctl.h"

double
ctl_monotonic(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
