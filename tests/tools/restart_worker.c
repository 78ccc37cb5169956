/*
 * restart_worker.c: a worker that keeps one wc_client across restarts of
 * wcached, driven line by line on stdin, for tests/integration/
 * test_restart.py (no sleeps: the test waits for each answer).
 *
 *   restart_worker --socket PATH MODEL
 *
 * Connects and attaches MODEL, then answers each command with one line:
 *   attach       attach MODEL again on the same client (after a restart:
 *                the client reconnects by itself); every model held is
 *                read end to end first, so a mapping that broke shows
 *   dispatch     wc_client_dispatch(): announcements read
 *   release N    release the N-th model attached (0 is the first)
 *   quit         release what is held, disconnect, exit 0
 * Answers: "attached GEN FD", "dispatched COUNT FD", "released N", or
 * "error CODE MESSAGE" (then exit 1). FD is wc_client_fd() after the call.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wcache.h"

#define MAX_MODELS 64

/* Reads every byte of every tensor of m; returns their sum (so the reads
 * are not optimised away). */
static uint64_t
read_all(const wc_model *m)
{
	uint64_t sum = 0;
	wc_tensor t;

	for (size_t i = 0; i < wc_model_count(m); i++) {
		if (wc_model_tensor(m, i, &t) < 0)
			continue;
		for (uint64_t b = 0; b < t.nbytes; b++)
			sum += ((const uint8_t *)t.data)[b];
	}
	return sum;
}

static int
fail(int r)
{
	printf("error %d %s\n", r, wc_errmsg());
	fflush(stdout);
	return 1;
}

int
main(int argc, char **argv)
{
	wc_model *held[MAX_MODELS] = { 0 };
	uint64_t sums[MAX_MODELS] = { 0 };
	const char *sock = NULL, *name = NULL;
	char line[256];
	wc_client *c;
	size_t n = 0;
	int r, rc = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
			sock = argv[++i];
		else
			name = argv[i];
	}
	if (name == NULL) {
		fprintf(stderr, "usage: restart_worker --socket PATH MODEL\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((r = wc_connect(sock, &c)) < 0)
		return fail(r); /* nothing held yet */
	strcpy(line, "attach\n");
	do {
		line[strcspn(line, "\n")] = '\0';
		if (strcmp(line, "attach") == 0) {
			for (size_t i = 0; i < n; i++)
				if (held[i] != NULL && read_all(held[i]) != sums[i]) {
					printf("error %d model %zu changed under the worker\n",
						-EIO, i);
					rc = 1;
				}
			if (rc != 0)
				break;
			if (n == MAX_MODELS) {
				rc = fail(-ENOSPC);
				break;
			}
			if ((r = wc_attach(c, name, &held[n])) < 0) {
				rc = fail(r);
				break;
			}
			sums[n] = read_all(held[n]);
			printf("attached %" PRIu64 " %d\n", wc_model_generation(held[n]),
				wc_client_fd(c));
			n++;
		} else if (strcmp(line, "dispatch") == 0) {
			if ((r = wc_client_dispatch(c)) < 0) {
				rc = fail(r);
				break;
			}
			printf("dispatched %d %d\n", r, wc_client_fd(c));
		} else if (strncmp(line, "release ", 8) == 0) {
			size_t i = strtoul(line + 8, NULL, 10);

			if (i >= n || held[i] == NULL) {
				rc = fail(-EINVAL);
				break;
			}
			wc_release(held[i]);
			held[i] = NULL;
			printf("released %zu\n", i);
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error %d unknown command \"%s\"\n", -EINVAL, line);
			rc = 1;
			break;
		}
	} while (fgets(line, sizeof(line), stdin) != NULL);
	/* On every path: what is held goes (a leak checker runs the tests). */
	for (size_t i = 0; i < n; i++)
		wc_release(held[i]);
	wc_disconnect(c);
	return rc;
}
