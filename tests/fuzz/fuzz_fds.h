/*
 * fuzz_fds.h: the descriptors this process holds, for the harnesses that
 * check that every descriptor an input made or received was closed (the
 * count after the input is the count before it).
 */
#ifndef WC_FUZZ_FDS_H
#define WC_FUZZ_FDS_H

#include <dirent.h>
#include <stdlib.h>

#include "fuzz_check.h"

/* This process's open descriptors (counted in /proc/self/fd); the highest
 * one in *highest unless it is NULL. */
static inline int
count_fds(int *highest)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0, top = -1;

	CHECK(d != NULL);
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		n++;
		if (atoi(e->d_name) > top && atoi(e->d_name) != dirfd(d))
			top = atoi(e->d_name);
	}
	closedir(d);
	if (highest != NULL)
		*highest = top;
	return n - 1; /* the directory's own descriptor */
}

#endif /* WC_FUZZ_FDS_H */
