/*
 * demo_worker.c: a stand-in for an inference worker, for the demo, the
 * integration tests and the benchmarks.
 *
 *   demo_worker [--socket PATH] [--verify FILE] [--touch] [--hold] MODEL
 *   demo_worker --open FILE [--verify FILE] [--touch] [--hold]
 *   demo_worker [--socket PATH] --repeat N [--check] MODEL
 *   demo_worker [--socket PATH] --loop SECONDS MODEL
 *
 * Attaches MODEL through wcached (or maps FILE in-process with --open),
 * optionally reads every byte of every tensor and compares it with the
 * bytes of the safetensors FILE read with plain read(2) (so the check does
 * not trust any wcache code path), and prints one JSON line. With --hold it
 * then waits for a line (or EOF) on stdin before releasing, so a driver can
 * measure memory while all workers hold the model. --repeat N attaches and
 * releases the model N times on one connection first (for leak checks);
 * with --check it instead checks every byte against the "seed" pattern
 * after each attach and prints the attach latencies (p50, p99, max).
 * --sync prints {"attached": ...} right after attaching and waits for a line
 * on stdin before verifying, so a driver can time attaches apart from the
 * CPU the verification of other workers takes.
 * --loop checks every byte of the model against the pattern its "seed"
 * metadata names (tests/tools/pattern.h) over and over for SECONDS, moving to
 * each new generation when wc_model_stale() says so (for hot-swap tests).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"
#include "wcache.h"

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
by_address(const void *a, const void *b)
{
	const wc_tensor *x = a, *y = b;

	return (x->data > y->data) - (x->data < y->data);
}

/*
 * Reads the safetensors file's data region with read(2) and compares it,
 * in file order, with the tensors' mapped bytes. In a single safetensors
 * file the tensors tile the data region, so this checks every byte.
 */
static int
verify(const wc_model *m, const char *path, uint64_t *checked)
{
	size_t n = wc_model_count(m), chunk = 8u << 20;
	wc_tensor *t = calloc(n ? n : 1, sizeof(*t));
	uint8_t *buf = malloc(chunk), len8[8];
	uint64_t hlen = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), ok = -1;

	*checked = 0;
	if (t == NULL || buf == NULL || fd == -1 || read(fd, len8, 8) != 8)
		goto out;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)len8[i] << (8 * i);
	if (lseek(fd, (off_t)(8 + hlen), SEEK_SET) == -1)
		goto out;
	for (size_t i = 0; i < n; i++)
		if (wc_model_tensor(m, i, &t[i]) < 0)
			goto out;
	qsort(t, n, sizeof(*t), by_address);
	for (size_t i = 0; i < n; i++) {
		const uint8_t *p = t[i].data;

		for (uint64_t done = 0; done < t[i].nbytes;) {
			size_t want = t[i].nbytes - done < chunk ?
				(size_t)(t[i].nbytes - done) : chunk;
			ssize_t got = read(fd, buf, want);

			if (got <= 0)
				goto out;
			if (memcmp(buf, p + done, (size_t)got) != 0) {
				fprintf(stderr, "demo_worker: tensor \"%s\" differs from %s at "
					"byte %" PRIu64 "\n", t[i].name, path, done);
				goto out;
			}
			done += (uint64_t)got;
			*checked += (uint64_t)got;
		}
	}
	ok = 0;
out:
	if (fd != -1)
		close(fd);
	free(buf);
	free(t);
	return ok;
}

/*
 * Checks every byte of m against the pattern of its "seed" metadata, in
 * file order. Returns 0, or -1 with a message.
 */
static int
check_pattern(const wc_model *m)
{
	const char *seed_text = wc_model_metadata(m, "seed");
	size_t n = wc_model_count(m);
	wc_tensor *t = calloc(n ? n : 1, sizeof(*t));
	uint64_t state, total = 0;
	uint8_t *want = NULL;
	int ok = -1;

	if (seed_text == NULL || t == NULL) {
		fprintf(stderr, "demo_worker: model has no seed metadata\n");
		goto out;
	}
	state = strtoull(seed_text, NULL, 10);
	for (size_t i = 0; i < n; i++) {
		if (wc_model_tensor(m, i, &t[i]) < 0)
			goto out;
		total += t[i].nbytes;
	}
	qsort(t, n, sizeof(*t), by_address);
	if ((want = malloc(total ? total : 1)) == NULL)
		goto out;
	pattern_fill(want, (size_t)total, strcmp(t[0].dtype, "F32") == 0 ? 4 : 2, &state);
	for (size_t i = 0, off = 0; i < n; off += t[i].nbytes, i++)
		if (memcmp(t[i].data, want + off, (size_t)t[i].nbytes) != 0) {
			fprintf(stderr, "demo_worker: generation %" PRIu64 ": tensor \"%s\" does "
					"not hold seed %s's bytes\n", wc_model_generation(m),
				t[i].name, seed_text);
			goto out;
		}
	ok = 0;
out:
	free(want);
	free(t);
	return ok;
}

static int
by_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Attaches name and checks it for seconds, following new generations. */
static int
loop_checks(const char *sock, const char *name, double seconds)
{
	wc_client *c;
	wc_model *m, *next;
	uint64_t checks = 0, swaps = 0, first;
	double end = now() + seconds;

	if (wc_connect(sock, &c) < 0 || wc_attach(c, name, &m) < 0) {
		fprintf(stderr, "demo_worker: %s\n", wc_errmsg());
		return 1;
	}
	first = wc_model_generation(m);
	while (now() < end) {
		if (check_pattern(m) < 0)
			return 1;
		checks++;
		if (!wc_model_stale(m))
			continue;
		if (wc_attach(c, name, &next) < 0) {
			fprintf(stderr, "demo_worker: reattach: %s\n", wc_errmsg());
			return 1;
		}
		if (wc_model_generation(next) != wc_model_generation(m))
			swaps++;
		wc_release(m);
		m = next;
	}
	printf("{\"checks\":%" PRIu64 ",\"swaps\":%" PRIu64 ",\"first\":%" PRIu64
	       ",\"last\":%" PRIu64 "}\n", checks, swaps, first, wc_model_generation(m));
	wc_release(m);
	wc_disconnect(c);
	return 0;
}

/* Reads one byte per page of every tensor. */
static uint64_t
touch(const wc_model *m)
{
	uint64_t sum = 0;
	wc_tensor t;

	for (size_t i = 0; i < wc_model_count(m); i++) {
		if (wc_model_tensor(m, i, &t) < 0)
			continue;
		const volatile uint8_t *p = t.data;

		for (uint64_t off = 0; off < t.nbytes; off += 4096)
			sum += p[off];
	}
	return sum;
}

int
main(int argc, char **argv)
{
	const char *sock = NULL, *file = NULL, *open_path = NULL, *name = NULL;
	int do_touch = 0, hold = 0, sync = 0, check = 0;
	long repeat = 0;
	double loop = 0;
	double t0, t_attach, t_verify = 0, t_touch = 0;
	uint64_t checked = 0, bytes = 0;
	wc_client *c = NULL;
	wc_model *m;
	wc_tensor t;
	char line[64];

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
			sock = argv[++i];
		else if (strcmp(argv[i], "--verify") == 0 && i + 1 < argc)
			file = argv[++i];
		else if (strcmp(argv[i], "--open") == 0 && i + 1 < argc)
			open_path = argv[++i];
		else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
			repeat = strtol(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--loop") == 0 && i + 1 < argc)
			loop = strtod(argv[++i], NULL);
		else if (strcmp(argv[i], "--touch") == 0)
			do_touch = 1;
		else if (strcmp(argv[i], "--sync") == 0)
			sync = 1;
		else if (strcmp(argv[i], "--check") == 0)
			check = 1;
		else if (strcmp(argv[i], "--hold") == 0)
			hold = 1;
		else if (argv[i][0] != '-' && name == NULL)
			name = argv[i];
		else {
			fprintf(stderr, "usage: demo_worker [--socket PATH] [--verify FILE] "
					"[--touch] [--hold] MODEL | --open FILE ...\n");
			return 2;
		}
	}
	if (name == NULL && open_path == NULL) {
		fprintf(stderr, "demo_worker: no model\n");
		return 2;
	}
	if (name != NULL && loop > 0)
		return loop_checks(sock, name, loop);
	if (name != NULL && repeat > 0) {
		if (wc_connect(sock, &c) < 0) {
			fprintf(stderr, "demo_worker: %s\n", wc_errmsg());
			return 1;
		}
		double *lat = calloc((size_t)repeat, sizeof(*lat));

		if (lat == NULL)
			return 1;
		for (long i = 0; i < repeat; i++) {
			t0 = now();
			if (wc_attach(c, name, &m) < 0) {
				fprintf(stderr, "demo_worker: attach %ld: %s\n", i, wc_errmsg());
				return 1;
			}
			lat[i] = now() - t0;
			if (check && check_pattern(m) < 0)
				return 1;
			wc_release(m);
		}
		wc_disconnect(c);
		c = NULL;
		if (check) {
			/* --repeat N --check: the latencies, for the neighbour tests. */
			qsort(lat, (size_t)repeat, sizeof(*lat), by_double);
			printf("{\"attaches\":%ld,\"p50_us\":%.1f,\"p99_us\":%.1f,"
				"\"max_us\":%.1f}\n", repeat, lat[repeat / 2] * 1e6,
				lat[repeat * 99 / 100] * 1e6, lat[repeat - 1] * 1e6);
			free(lat);
			return 0;
		}
		free(lat);
	}
	t0 = now();
	if (open_path != NULL) {
		if (wc_open_file(open_path, &m) < 0) {
			fprintf(stderr, "demo_worker: %s\n", wc_errmsg());
			return 1;
		}
	} else if (wc_connect(sock, &c) < 0 || wc_attach(c, name, &m) < 0) {
		fprintf(stderr, "demo_worker: %s\n", wc_errmsg());
		wc_disconnect(c); /* NULL when the connect failed */
		return 1;
	}
	t_attach = now() - t0;
	if (sync) {
		printf("{\"attached_us\":%.1f}\n", t_attach * 1e6);
		fflush(stdout);
		if (fgets(line, sizeof(line), stdin) == NULL)
			return 1;
	}
	for (size_t i = 0; i < wc_model_count(m); i++)
		if (wc_model_tensor(m, i, &t) == 0)
			bytes += t.nbytes;
	if (file != NULL) {
		t0 = now();
		if (verify(m, file, &checked) < 0 || checked != bytes) {
			fprintf(stderr, "demo_worker: verification against %s failed\n", file);
			return 1;
		}
		t_verify = now() - t0;
	}
	if (do_touch) {
		t0 = now();
		(void)touch(m);
		t_touch = now() - t0;
	}
	printf("{\"pid\":%d,\"generation\":%" PRIu64 ",\"tensors\":%zu,\"bytes\":%" PRIu64
	       ",\"verified\":%" PRIu64 ",\"attach_us\":%.1f,\"verify_s\":%.3f,\"touch_s\":%.3f}\n",
		(int)getpid(), wc_model_generation(m), wc_model_count(m), bytes, checked,
		t_attach * 1e6, t_verify, t_touch);
	fflush(stdout);
	if (hold && fgets(line, sizeof(line), stdin) == NULL && ferror(stdin))
		return 1;
	wc_release(m);
	wc_disconnect(c);
	return 0;
}
