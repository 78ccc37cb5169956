/*
 * benchutil.h: what the benchmark programs (bench_header, bench_load,
 * bench_attach) share: reading a clock in seconds, the qsort() order their
 * timings are sorted in for the best, median and percentiles, and the
 * safetensors header length that the plain-read(2) loaders decode
 * themselves.
 *
 * Static inline, so each program compiles what it uses and the benchmarks
 * need no library of their own.
 */
#ifndef WC_BENCHUTIL_H
#define WC_BENCHUTIL_H

#include <stdint.h>
#include <time.h>

/* The time of clock in seconds: CLOCK_MONOTONIC for wall time, or one of
 * the CPU-time clocks, which do not advance while other processes hold the
 * CPU. */
static inline double
bench_clock(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wall time in seconds since an arbitrary start, for intervals. */
static inline double
bench_now(void)
{
	return bench_clock(CLOCK_MONOTONIC);
}

/* qsort() order of doubles: smallest first. */
static inline int
bench_compare_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The little-endian u64 at p: a safetensors file's header length. */
static inline uint64_t
bench_le64(const uint8_t *p)
{
	uint64_t n = 0;

	for (int i = 0; i < 8; i++)
		n |= (uint64_t)p[i] << (8 * i);
	return n;
}

#endif /* WC_BENCHUTIL_H */
