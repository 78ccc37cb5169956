/*
 * ctl_inspect.c: `wcachectl inspect [--json] PATH`: validates a model with
 * the same readers the daemon uses and lists its tensors, in byte order of
 * names, with the absolute offset of each tensor's data in the file that
 * holds it.
 *
 * Everything the model file says (tensor names, metadata, shard file names,
 * messages that quote them) is hostile: the table prints it through
 * ctl_print_safe() (control characters as \xNN) and --json through
 * json_write_string(), so a file cannot send a terminal escape sequence.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "format/dtype.h"
#include "base/error.h"
#include "base/json.h"
#include "format/source.h"

static void
inspect_usage(FILE *f)
{
	fprintf(f, "usage: wcachectl inspect [--json] PATH\n\n"
		   "Validates PATH (a safetensors file, a shard index, a directory holding one,\n"
		   "or a WEIG file) and lists its tensors: name, dtype, shape, bytes and the\n"
		   "byte offset of the data in its file. Exits 0 for a valid model, 1 with a\n"
		   "one-line reason otherwise.\n\n"
		   "  --json   print one JSON object: format, metadata, tensors\n");
}

/* Prints s as ctl_print_safe() does, then spaces up to width columns (the
 * bytes printf's "%-*s" would count). */
static void
print_safe_padded(const char *s, int width)
{
	int shown = 0;

	ctl_print_safe(stdout, s);
	for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++)
		shown += *p < 0x20 || *p == 0x7f ? 4 : 1;
	if (shown < width)
		printf("%*s", width - shown, "");
}

/* "wcachectl: [WHAT: ]MESSAGE" on stderr, control characters escaped: a
 * message may quote a name from the file. */
static void
inspect_error(const char *what, const char *message)
{
	fputs("wcachectl: ", stderr);
	if (what != NULL) {
		ctl_print_safe(stderr, what);
		fputs(": ", stderr);
	}
	ctl_print_safe(stderr, message);
	fputc('\n', stderr);
}

static void
print_shape(FILE *f, const struct index_tensor *t, int json)
{
	fputc('[', f);
	for (uint32_t d = 0; d < t->ndim; d++)
		fprintf(f, "%s%" PRIu64, d ? (json ? "," : ", ") : "", t->shape[d]);
	fputc(']', f);
}

static int
print_json(const struct model_source *s, const struct index_header *h)
{
	const char *key, *value;
	struct index_tensor t;
	int r;

	printf("{\"format\":\"%s\",\"metadata\":{", source_format_name(s->format));
	for (uint64_t i = 0; i < h->meta_count; i++) {
		if ((r = index_meta_at(s->index, h, i, &key, &value)) < 0)
			return r;
		if (i > 0)
			putchar(',');
		json_write_string(stdout, key, strlen(key));
		putchar(':');
		json_write_string(stdout, value, strlen(value));
	}
	printf("},\"tensors\":[");
	for (uint64_t i = 0; i < h->tensor_count; i++) {
		if ((r = index_tensor_at(s->index, h, i, &t)) < 0)
			return r;
		printf("%s{\"name\":", i ? "," : "");
		json_write_string(stdout, t.name, strlen(t.name));
		printf(",\"dtype\":\"%s\",\"shape\":", dtype_by_code(t.dtype)->name);
		print_shape(stdout, &t, 1);
		printf(",\"offset\":%" PRIu64 ",\"nbytes\":%" PRIu64 ",\"file\":", t.offset,
			t.nbytes);
		json_write_string(stdout, s->files[t.file].path, strlen(s->files[t.file].path));
		putchar('}');
	}
	printf("]}\n");
	return 0;
}

static int
print_table(const struct model_source *s, const struct index_header *h)
{
	struct index_tensor t;
	uint64_t total = 0;
	const char *key, *value;
	int r;

	for (uint64_t i = 0; i < h->meta_count; i++) {
		if ((r = index_meta_at(s->index, h, i, &key, &value)) < 0)
			return r;
		fputs("metadata ", stdout);
		ctl_print_safe(stdout, key);
		fputs(" = ", stdout);
		ctl_print_safe(stdout, value);
		putchar('\n');
	}
	printf("%-48s %-11s %-20s %14s %14s%s\n", "NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET",
		s->nfiles > 1 ? "  FILE" : "");
	for (uint64_t i = 0; i < h->tensor_count; i++) {
		if ((r = index_tensor_at(s->index, h, i, &t)) < 0)
			return r;
		char shape[256];
		FILE *mf = fmemopen(shape, sizeof(shape), "w");

		if (mf != NULL) {
			print_shape(mf, &t, 0);
			fclose(mf);
		} else {
			strcpy(shape, "?");
		}
		print_safe_padded(t.name, 48);
		printf(" %-11s %-20s %14" PRIu64 " %14" PRIu64, dtype_by_code(t.dtype)->name,
			shape, t.nbytes, t.offset);
		if (s->nfiles > 1) {
			fputs("  ", stdout);
			ctl_print_safe(stdout, s->files[t.file].path);
		}
		putchar('\n');
		total += t.nbytes;
	}
	printf("%" PRIu64 " tensors, %" PRIu64 " bytes of data in %zu file%s (%s)\n",
		h->tensor_count, total, s->nfiles, s->nfiles == 1 ? "" : "s",
		source_format_name(s->format));
	return 0;
}

int
ctl_inspect(int argc, char **argv)
{
	struct model_source s;
	struct index_header h;
	const char *path = NULL;
	int json = 0, r;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			inspect_usage(stdout);
			return 0;
		} else if (argv[i][0] == '-' && argv[i][1] != '\0') {
			return ctl_usage_error("inspect", "unknown option \"%s\"", argv[i]);
		} else if (path == NULL) {
			path = argv[i];
		} else {
			return ctl_usage_error("inspect",
				"unexpected argument \"%s\": inspect takes one PATH", argv[i]);
		}
	}
	if (path == NULL)
		return ctl_usage_error("inspect", "missing PATH");
	if (source_open(path, &s) < 0) {
		inspect_error(NULL, error_get());
		return 1;
	}
	if ((r = index_open(s.index, s.index_len, &h)) == 0)
		r = json ? print_json(&s, &h) : print_table(&s, &h);
	if (r < 0)
		inspect_error(path, error_get());
	source_close(&s);
	if (fflush(stdout) != 0)
		r = -1;
	return r < 0 ? 1 : 0;
}
