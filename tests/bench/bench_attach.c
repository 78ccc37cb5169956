/*
 * bench_attach.c: attach latency through wcached, as a worker sees it.
 *
 *   bench_attach SOCKET MODEL SECONDS
 *
 * Attaches and releases MODEL on one connection for SECONDS, timing each
 * wc_attach, and prints one JSON line: count, p50, p99, p99.9 and max in
 * microseconds, and how many distinct generations it saw (to show swaps
 * happened while it ran).
 */
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "wcache.h"

int
main(int argc, char **argv)
{
	size_t cap = 1 << 16, n = 0, generations = 0;
	double *lat, end, t0;
	uint64_t last = 0;
	wc_client *c;
	wc_model *m;

	if (argc != 4) {
		fprintf(stderr, "usage: bench_attach SOCKET MODEL SECONDS\n");
		return 2;
	}
	if ((lat = malloc(cap * sizeof(*lat))) == NULL || wc_connect(argv[1], &c) < 0) {
		fprintf(stderr, "bench_attach: %s\n", wc_errmsg());
		return 1;
	}
	end = bench_now() + strtod(argv[3], NULL);
	while (bench_now() < end) {
		t0 = bench_now();
		if (wc_attach(c, argv[2], &m) < 0) {
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
