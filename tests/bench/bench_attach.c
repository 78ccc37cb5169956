/*
 * bench_attach.c: attach latency through wcached, as a worker sees it.
 *
 *   bench_attach SOCKET MODEL SECONDS
 *   bench_attach --fresh SOCKET MODEL [--pairs SECONDS] [--hold]
 *
 * The first form attaches and releases MODEL on one connection for
 * SECONDS, timing each wc_attach, and prints one JSON line: count, p50,
 * p99, p99.9 and max in microseconds, and how many distinct generations it
 * saw (to show swaps happened while it ran).
 *
 * --fresh is the first attach of a fresh process (run it as a new process
 * each time): it times wc_connect, the first wc_attach, the first lookup
 * of a tensor by name (a binary search of the index, so the pages it
 * faults in), and the first wc_release; then with --pairs it attaches and
 * releases in a loop for SECONDS and reports pairs per second and this
 * process's CPU time per pair (which, unlike the rate, other processes on
 * a busy machine barely change). With --hold
 * it prints its line while it still holds the attach and waits for a line
 * (or EOF) on stdin, so a driver can measure the daemon with many clients.
 * Times are wall-clock microseconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include <wcache.h>

/* The loop of the first form. */
static int
loop(const char *sock, const char *model, double seconds)
{
	size_t cap = 1 << 16, n = 0, generations = 0;
	double *lat, end, t0;
	uint64_t last = 0;
	wc_client *c;
	wc_model *m;

	if ((lat = malloc(cap * sizeof(*lat))) == NULL || wc_connect(sock, &c) < 0) {
		fprintf(stderr, "bench_attach: %s\n", wc_errmsg());
		return 1;
	}
	end = bench_now() + seconds;
	while (bench_now() < end) {
		t0 = bench_now();
		if (wc_attach(c, model, &m) < 0) {
			fprintf(stderr, "bench_attach: %s\n", wc_errmsg());
			return 1;
		}
		if (n == cap) {
			double *more = realloc(lat, 2 * cap * sizeof(*lat));

			if (more == NULL)
				return 1;
			lat = more;
			cap *= 2;
		}
		lat[n++] = (bench_now() - t0) * 1e6;
		if (wc_model_generation(m) != last) {
			last = wc_model_generation(m);
			generations++;
		}
		wc_release(m);
	}
	qsort(lat, n, sizeof(*lat), bench_compare_double);
	printf("{\"count\":%zu,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,"
	       "\"generations\":%zu}\n", n, lat[n / 2], lat[n * 99 / 100], lat[n * 999 / 1000],
		lat[n - 1], generations);
	wc_disconnect(c);
	free(lat);
	return 0;
}

/* The --fresh form. */
static int
fresh(const char *sock, const char *model, double pair_seconds, int hold)
{
	double t0, t1, t2, t3, t4, end, rate = 0, c0, cpu = 0;
	unsigned long pairs = 0;
	wc_tensor t, probe;
	wc_client *c;
	wc_model *m;
	size_t count;
	char name[4096];

	t0 = bench_now();
	if (wc_connect(sock, &c) < 0)
		goto fail;
	t1 = bench_now();
	if (wc_attach(c, model, &m) < 0)
		goto fail;
	t2 = bench_now();
	/* Untimed: the name of a tensor in the middle, copied out. */
	count = wc_model_count(m);
	if (count == 0 || wc_model_tensor(m, count / 2, &probe) < 0)
		goto fail;
	snprintf(name, sizeof(name), "%s", probe.name);
	t3 = bench_now();
	if (wc_model_find(m, name, &t) < 0)
		goto fail;
	t3 = bench_now() - t3;
	if (hold) {
		printf("{\"connect_us\":%.1f,\"attach_us\":%.1f,\"tensors\":%zu}\n",
			(t1 - t0) * 1e6, (t2 - t1) * 1e6, count);
		fflush(stdout);
		while (fgets(name, sizeof(name), stdin) != NULL && name[0] != '\n')
			;
	}
	t4 = bench_now();
	wc_release(m);
	t4 = bench_now() - t4;
	if (pair_seconds > 0) {
		double start = bench_now();

		c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
		end = start + pair_seconds;
		while (bench_now() < end) {
			if (wc_attach(c, model, &m) < 0)
				goto fail;
			wc_release(m);
			pairs++;
		}
		rate = (double)pairs / (bench_now() - start);
		cpu = pairs ? (bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0) / (double)pairs : 0;
	}
	wc_disconnect(c);
	if (!hold)
		printf("{\"connect_us\":%.1f,\"attach_us\":%.1f,\"find_us\":%.1f,"
		       "\"release_us\":%.1f,\"pairs\":%lu,\"pairs_per_s\":%.0f,"
		       "\"cpu_us_per_pair\":%.2f,\"tensors\":%zu}\n",
			(t1 - t0) * 1e6, (t2 - t1) * 1e6, t3 * 1e6, t4 * 1e6, pairs, rate,
			cpu * 1e6, count);
	return 0;
fail:
	fprintf(stderr, "bench_attach: %s\n", wc_errmsg());
	return 1;
}

int
main(int argc, char **argv)
{
	if (argc >= 4 && strcmp(argv[1], "--fresh") == 0) {
		double pairs = 0;
		int hold = 0;

		for (int i = 4; i < argc; i++) {
			if (strcmp(argv[i], "--pairs") == 0 && i + 1 < argc)
				pairs = strtod(argv[++i], NULL);
			else if (strcmp(argv[i], "--hold") == 0)
				hold = 1;
			else
				goto usage;
		}
		return fresh(argv[2], argv[3], pairs, hold);
	}
	if (argc == 4)
		return loop(argv[1], argv[2], strtod(argv[3], NULL));
usage:
	fprintf(stderr, "usage: bench_attach SOCKET MODEL SECONDS\n"
			"       bench_attach --fresh SOCKET MODEL [--pairs SECONDS] [--hold]\n");
	return 2;
}
