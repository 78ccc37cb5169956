/*
 * ctl_attach.c: `wcachectl attach NAME`: attaches a model through wcached,
 * as a worker would, and reports what it got and how long it took. With
 * --touch it also reads every page of every tensor, which shows whether the
 * daemon's warming left the pages resident.
 *
 * NAME and the library's messages (which carry the daemon's, quoting a
 * model's paths) are printed escaped (escape_print(), ctl_error()).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "proto/control_proto.h"
#include "proto/defaults.h"
#include "base/escape.h"
#include "lib/wcache.h"

/* Prints `wcachectl attach --help`. */
static void
attach_usage(FILE *f)
{
	fprintf(f, "usage: wcachectl attach NAME [--socket PATH] [--touch] [--json]\n\n"
		   "Attaches the model wcached serves as NAME (or at that configured path) and\n"
		   "prints its tensor count, bytes, generation and the attach time.\n\n"
		   "  --socket PATH  wcached's client socket (default $WCACHE_SOCKET, else\n"
		   "                 " DEFAULT_SOCKET_PATH ")\n"
		   "  --touch        also read every page of every tensor and time it\n"
		   "  --json         print one JSON object, \"ok\":true and \"protocol\":1 in it,\n"
		   "                 on a failure too:\n"
		   "                 {\"ok\":false,\"protocol\":1,\"error\":\"...\"}\n");
}

/* Reads one byte of every page of every tensor; returns a checksum so the
 * reads cannot be optimised away. */
static uint64_t
touch_all(const wc_model *m, uint64_t *bytes)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t sum = 0;
	wc_tensor t;

	*bytes = 0;
	for (size_t i = 0; i < wc_model_count(m); i++) {
		if (wc_model_tensor(m, i, &t) < 0)
			continue;
		const volatile uint8_t *p = t.data;

		for (uint64_t off = 0; off < t.nbytes; off += (uint64_t)page)
			sum += p[off];
		*bytes += t.nbytes;
	}
	return sum;
}

/* `wcachectl attach` (ctl.h). */
int
ctl_attach(int argc, char **argv)
{
	const char *name = NULL, *socket_path = NULL;
	int touch = 0, json = ctl_file_json(argc, argv, "--socket");
	double t0, t_attach, t_touch = 0;
	uint64_t bytes = 0, sum = 0;
	wc_client *c;
	wc_model *m;
	wc_tensor t;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
			socket_path = argv[++i];
		} else if (strcmp(argv[i], "--touch") == 0) {
			touch = 1;
		} else if (strcmp(argv[i], "--json") == 0) {
			continue; /* ctl_file_json() read it */
		} else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			attach_usage(stdout);
			return 0;
		} else if (strcmp(argv[i], "--socket") == 0) {
			return ctl_json_usage(json, ctl_usage_error("attach",
				"--socket needs a value"));
		} else if (argv[i][0] == '-') {
			return ctl_json_usage(json, ctl_usage_error("attach",
				"unknown option \"%s\"", argv[i]));
		} else if (name == NULL) {
			name = argv[i];
		} else {
			return ctl_json_usage(json, ctl_usage_error("attach",
				"unexpected argument \"%s\": attach takes one NAME", argv[i]));
		}
	}
	if (name == NULL)
		return ctl_json_usage(json, ctl_usage_error("attach", "missing NAME"));
	if (wc_connect(socket_path, &c) < 0)
		return ctl_fail(json, "%s", wc_errmsg());
	t0 = ctl_monotonic();
	if (wc_attach(c, name, &m) < 0) {
		ctl_fail(json, "%s", wc_errmsg());
		wc_disconnect(c);
		return CTL_EXIT_FAILURE;
	}
	t_attach = ctl_monotonic() - t0;
	for (size_t i = 0; i < wc_model_count(m); i++)
		if (wc_model_tensor(m, i, &t) == 0)
			bytes += t.nbytes;
	if (touch) {
		t0 = ctl_monotonic();
		sum = touch_all(m, &bytes);
		t_touch = ctl_monotonic() - t0;
	}
	if (json) {
		printf("{\"ok\":true,\"protocol\":%d,\"model\":", CONTROL_PROTOCOL_VERSION);
		ctl_json_string(stdout, name, strlen(name));
		printf(",\"generation\":%" PRIu64 ",\"tensors\":%zu,\"bytes\":%" PRIu64
		       ",\"attach_seconds\":%.9f", wc_model_generation(m), wc_model_count(m),
			bytes, t_attach);
		if (touch)
			printf(",\"touch_seconds\":%.6f,\"checksum\":%" PRIu64, t_touch, sum);
		printf("}\n");
	} else {
		printf("model ");
		escape_print(stdout, name);
		printf(": generation %" PRIu64 ", %zu tensors, %" PRIu64
		       " bytes, attached in %.1f us\n", wc_model_generation(m),
			wc_model_count(m), bytes, t_attach * 1e6);
		if (touch)
			printf("touched every page in %.3f s (%.0f MB/s)\n", t_touch,
				t_touch > 0 ? (double)bytes / t_touch / 1e6 : 0.0);
	}
	wc_release(m);
	wc_disconnect(c);
	return 0; /* a failed write to stdout: main() says so (ctl_finish_output()) */
}
