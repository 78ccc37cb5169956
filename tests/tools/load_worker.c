/*
 * load_worker.c: workers that attach a model, check every byte and release
 * it in a loop while wcached restarts under them, for tests/system's
 * restart_under_load (no sleeps: the driver waits for each line).
 *
 *   load_worker [--socket PATH] --keep N --connect N --seed S MODEL
 *
 * Forks N + N workers. A "keep" worker connects once and keeps its
 * wc_client across restarts (libwcache reconnects by itself); a "connect"
 * worker calls wc_connect() before each attach and wc_disconnect() after
 * the release (during a restart its connect waits in wcached.socket's
 * backlog). Each attach's bytes must be the pattern of seed S
 * (tests/tools/pattern.h, as mkmodel --seed S writes it, BF16 or F16) and
 * its generation the one the worker's first attach got; anything else, or
 * any error of wc_connect() or wc_attach(), is a failure, counted and
 * reported with its message. A worker that cannot attach at all at first
 * reports "error" and exits.
 *
 * Lines on stdout, each written whole by one write(2) of at most PIPE_BUF
 * bytes, so that the workers' lines do not mix:
 *   ready W MODE PID NOW GEN        after W's first checked attach
 *   error W MODE MESSAGE            W's first attach failed; W exits 1
 * and, once the driver writes "stop" (or closes stdin), from each worker:
 *   a W MODE T0 DUR GEN             one line per attach: its start and how
 *                                   long wc_connect() (in mode connect) and
 *                                   wc_attach() took, in ns of CLOCK_MONOTONIC
 *   fail W MODE T0 DUR CODE MESSAGE one line per failed attach (first 20)
 *   end W MODE ATTACHES FAILED
 * and last, from the parent once every worker has exited, "done OK N":
 * the number of workers that exited 0, of N. The parent exits 0 when all
 * did. The workers stop when the parent's end of a pipe closes, so they
 * also stop when the parent dies.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"
#include "wcache.h"

#define MAX_WORKERS 256
#define MAX_FAIL_LINES 20
#define LINE_MAX_BYTES 4096 /* PIPE_BUF on Linux: one write(2), not interleaved */

struct sample {
	uint64_t t0, dur, generation;
	int code;               /* 0, or the failure's negative errno */
	char *message;          /* the failure's message, malloc'd; NULL when ok */
};

struct worker {
	int index;
	const char *mode;       /* "keep" or "connect" */
	const char *sock, *name;
	uint64_t seed, generation;
	uint8_t *want;          /* the pattern's bytes, want_len of them */
	size_t want_len;
	unsigned elem;
	struct sample *samples;
	size_t n, cap;
	char out[LINE_MAX_BYTES];
	size_t out_len;
};

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Writes everything, through short writes and EINTR. Its own loop, not
 * base/path.h's fd_write_all: tests/system builds this file alone, as a
 * user of the packages would. */
static void
write_all(const char *p, size_t len)
{
	while (len > 0) {
		ssize_t n = write(STDOUT_FILENO, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			_exit(3); /* the driver is gone: nothing to report to */
		p += n;
		len -= (size_t)n;
	}
}

static void
flush_lines(struct worker *w)
{
	write_all(w->out, w->out_len);
	w->out_len = 0;
}

/* Appends one line to w's buffer, writing the buffer first when the line
 * would not fit, so that every write(2) holds whole lines only. */
__attribute__((format(printf, 2, 3))) static void
line(struct worker *w, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (w->out_len + (size_t)n > sizeof(w->out))
		flush_lines(w);
	memcpy(w->out + w->out_len, buf, (size_t)n);
	w->out_len += (size_t)n;
}

/*
 * Checks that m's tensors tile exactly the pattern of w's seed: each
 * tensor's bytes are the pattern at its offset in the data region (its
 * distance from the lowest tensor's data, one mapping for one file), and
 * the tensors' sizes add up to the whole pattern. Returns 0, or -EIO with
 * a message in msg.
 */
static int
check_bytes(const struct worker *w, const wc_model *m, char *msg, size_t msg_len)
{
	const char *seed = wc_model_metadata(m, "seed");
	size_t count = wc_model_count(m);
	const uint8_t *base = NULL;
	uint64_t total = 0;
	wc_tensor t;

	if (seed == NULL || strtoull(seed, NULL, 10) != w->seed) {
		snprintf(msg, msg_len, "model \"%s\": metadata seed %s, expected %" PRIu64, w->name,
			seed ? seed : "(none)", w->seed);
		return -EIO;
	}
	for (size_t i = 0; i < count; i++)
		if (wc_model_tensor(m, i, &t) == 0 &&
			(base == NULL || (const uint8_t *)t.data < base))
			base = t.data;
	for (size_t i = 0; i < count; i++) {
		size_t off;

		if (wc_model_tensor(m, i, &t) < 0) {
			snprintf(msg, msg_len, "model \"%s\": tensor %zu: %s", w->name, i,
				wc_errmsg());
			return -EIO;
		}
		off = (size_t)((const uint8_t *)t.data - base);
		if (off > w->want_len || t.nbytes > w->want_len - off ||
			memcmp(t.data, w->want + off, (size_t)t.nbytes) != 0) {
			snprintf(msg, msg_len, "model \"%s\" generation %" PRIu64 ": tensor \"%s\" "
					"(%" PRIu64 " bytes at data offset %zu) does not "
					"hold seed %" PRIu64 "'s bytes", w->name,
				wc_model_generation(m), t.name, t.nbytes, off, w->seed);
			return -EIO;
		}
		total += t.nbytes;
	}
	if (total != w->want_len) {
		snprintf(msg, msg_len, "model \"%s\": its tensors hold %" PRIu64 " bytes, the "
				"pattern %zu", w->name, total, w->want_len);
		return -EIO;
	}
	return 0;
}

/* Fills w->want with the pattern for the model's size and element size,
 * from its first attach. */
static int
make_pattern(struct worker *w, const wc_model *m)
{
	uint64_t total = 0, state = w->seed;
	wc_tensor t;

	for (size_t i = 0; i < wc_model_count(m); i++) {
		if (wc_model_tensor(m, i, &t) < 0)
			return -EIO;
		total += t.nbytes;
		w->elem = strcmp(t.dtype, "F32") == 0 ? 4 : 2;
	}
	if (total == 0 || total > SIZE_MAX || (w->want = malloc((size_t)total)) == NULL)
		return -ENOMEM;
	w->want_len = (size_t)total;
	pattern_fill(w->want, w->want_len, w->elem, &state);
	return 0;
}

/*
 * One attach as the worker's mode makes it: connect first when the mode
 * is "connect"; then check the bytes and release. *wait is the time the
 * connect and the attach took, to their return (the check is not counted).
 * On success returns 0 with the generation in *gen; else a negative errno
 * with the message in msg.
 */
static int
attach_once(struct worker *w, wc_client **c, uint64_t *gen, uint64_t *wait, char *msg,
	size_t msg_len)
{
	uint64_t t0 = now_ns();
	wc_model *m;
	int r;

	if (*c == NULL && (r = wc_connect(w->sock, c)) < 0) {
		*wait = now_ns() - t0;
		snprintf(msg, msg_len, "wc_connect: %s", wc_errmsg());
		return r;
	}
	r = wc_attach(*c, w->name, &m);
	*wait = now_ns() - t0;
	if (r < 0) {
		snprintf(msg, msg_len, "wc_attach: %s", wc_errmsg());
	} else {
		if (w->want == NULL && (r = make_pattern(w, m)) < 0)
			snprintf(msg, msg_len, "model \"%s\": cannot make its pattern", w->name);
		else
			r = check_bytes(w, m, msg, msg_len);
		*gen = wc_model_generation(m);
		if (r == 0 && w->generation != 0 && *gen != w->generation) {
			snprintf(msg, msg_len, "model \"%s\": generation %" PRIu64 ", the "
					"first attach got %" PRIu64, w->name, *gen,
				w->generation);
			r = -ESTALE;
		}
		wc_release(m);
	}
	if (strcmp(w->mode, "connect") == 0) {
		wc_disconnect(*c);
		*c = NULL;
	}
	return r;
}

static int
record(struct worker *w, uint64_t t0, uint64_t dur, uint64_t gen, int code, const char *msg)
{
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 4096;
		struct sample *s = realloc(w->samples, cap * sizeof(*s));

		if (s == NULL)
			return -ENOMEM;
		w->samples = s, w->cap = cap;
	}
	w->samples[w->n] = (struct sample){ t0, dur, gen, code, NULL };
	if (code != 0 && (w->samples[w->n].message = strdup(msg)) == NULL)
		return -ENOMEM;
	w->n++;
	return 0;
}

/* True once the parent closed its end of the stop pipe. */
static int
told_to_stop(int stop_fd)
{
	struct pollfd p = { .fd = stop_fd, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

/* A worker's life; returns its exit status. */
static int
run_worker(struct worker *w, int stop_fd)
{
	wc_client *c = NULL;
	char msg[512];
	uint64_t gen = 0, t0, wait, failed = 0;
	int r, printed = 0;

	t0 = now_ns();
	if (attach_once(w, &c, &gen, &wait, msg, sizeof(msg)) < 0) {
		line(w, "error %d %s %s", w->index, w->mode, msg);
		flush_lines(w);
		wc_disconnect(c);
		return 1;
	}
	w->generation = gen;
	if (record(w, t0, wait, gen, 0, NULL) < 0)
		return 1;
	line(w, "ready %d %s %d %" PRIu64 " %" PRIu64, w->index, w->mode, (int)getpid(), now_ns(),
		gen);
	flush_lines(w);
	while (!told_to_stop(stop_fd)) {
		t0 = now_ns();
		gen = 0;
		r = attach_once(w, &c, &gen, &wait, msg, sizeof(msg));
		if (record(w, t0, wait, gen, r, msg) < 0)
			break;
	}
	wc_disconnect(c);
	for (size_t i = 0; i < w->n; i++) {
		const struct sample *s = &w->samples[i];

		line(w, "a %d %s %" PRIu64 " %" PRIu64 " %" PRIu64, w->index, w->mode, s->t0,
			s->dur, s->generation);
		if (s->code != 0) {
			failed++;
			if (printed++ < MAX_FAIL_LINES)
				line(w, "fail %d %s %" PRIu64 " %" PRIu64 " %d %s", w->index,
					w->mode, s->t0, s->dur, s->code, s->message);
		}
		free(s->message);
	}
	line(w, "end %d %s %zu %" PRIu64, w->index, w->mode, w->n, failed);
	flush_lines(w);
	free(w->samples);
	free(w->want);
	return failed == 0 ? 0 : 1;
}

static void
usage(void)
{
	fprintf(stderr, "usage: load_worker [--socket PATH] --keep N --connect N --seed S MODEL\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	static struct worker w; /* the child's one worker: its output buffer is large */
	const char *sock = NULL, *name = NULL;
	unsigned long keep = 0, connect = 0;
	uint64_t seed = 0;
	pid_t pids[MAX_WORKERS];
	int stop[2], ok = 0, n = 0;
	char buf[256];

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (a[0] != '-') {
			name = a;
			continue;
		}
		if (v == NULL)
			usage();
		i++;
		if (strcmp(a, "--socket") == 0)
			sock = v;
		else if (strcmp(a, "--keep") == 0)
			keep = strtoul(v, NULL, 10);
		else if (strcmp(a, "--connect") == 0)
			connect = strtoul(v, NULL, 10);
		else if (strcmp(a, "--seed") == 0)
			seed = strtoull(v, NULL, 10);
		else
			usage();
	}
	if (name == NULL || keep + connect == 0 || keep + connect > MAX_WORKERS)
		usage();
	if (pipe(stop) == -1) {
		perror("load_worker: pipe");
		return 1;
	}
	for (unsigned long i = 0; i < keep + connect; i++) {
		pid_t pid = fork();

		if (pid == -1) {
			perror("load_worker: fork");
			break;
		}
		if (pid == 0) {
			close(stop[1]);
			w = (struct worker){ .index = (int)i, .mode = i < keep ? "keep" : "connect",
				.sock = sock, .name = name, .seed = seed };
			_exit(run_worker(&w, stop[0]));
		}
		pids[n++] = pid;
	}
	close(stop[0]);
	/* Until "stop" or the end of stdin: then the workers see the pipe close. */
	while (n == (int)(keep + connect) && fgets(buf, sizeof(buf), stdin) != NULL &&
		strcmp(buf, "stop\n") != 0)
		;
	close(stop[1]);
	for (int i = 0; i < n; i++) {
		int status = 0;
		pid_t r;

		while ((r = waitpid(pids[i], &status, 0)) == -1 && errno == EINTR)
			;
		ok += r == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0;
	}
	printf("done %d %lu\n", ok, keep + connect);
	return ok == (int)(keep + connect) ? 0 : 1;
}
