/*
 * ctl_inspect.c: `wcachectl inspect [--json] PATH`: validates a model with
 * the same readers the daemon uses and lists its tensors, in byte order of
 * names, with the absolute offset of each tensor's data in the file that
 * holds it.
 *
 * Everything the model file says (tensor names, metadata, shard file names,
 * messages that quote them) is hostile: the table prints it through
 * escape_print() (C0 controls, DEL and bytes that are not UTF-8 as \xNN, C1
 * controls and bidirectional overrides as \uNNNN: base/escape.h), errors
 * through ctl_error(), which does the same, and --json through
 * ctl_json_string() (JSON escapes), so a file cannot send a terminal escape
 * sequence.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "format/dtype.h"
#include "base/error.h"
#include "base/escape.h"
#include "format/source.h"
#include "proto/control_proto.h"

/* Prints `wcachectl inspect --help`. */
static void
inspect_usage(FILE *f)
{
	fprintf(f, "usage: wcachectl inspect [--json] PATH\n\n"
		   "Validates PATH (a safetensors file, a shard index, a directory holding one,\n"
		   "or a WEIG file) and lists its tensors: name, dtype, shape, bytes and the\n"
		   "byte offset of the data in its file. Exits 0 for a valid model, 1 with a\n"
		   "one-line reason otherwise.\n\n"
		   "  --json   print one JSON object: \"ok\":true, \"protocol\":1, format,\n"
		   "           metadata, tensors; on a failure\n"
		   "           {\"ok\":false,\"protocol\":1,\"error\":\"...\"}\n");
}

/* Prints s escaped (escape_print()), then spaces up to width columns of
 * the escaped text (escape_width()). */
static void
print_safe_padded(const char *s, size_t width)
{
	size_t shown = escape_width(s);

	escape_print(stdout, s);
	if (shown < width)
		printf("%*s", (int)(width - shown), "");
}

/* Writes a tensor's shape, "[2, 3]" (json: "[2,3]"). */
static void
print_shape(FILE *f, const struct index_tensor *t, int json)
{
	fputc('[', f);
	for (uint32_t d = 0; d < t->ndim; d++)
		fprintf(f, "%s%" PRIu64, d ? (json ? "," : ", ") : "", t->shape[d]);
	fputc(']', f);
}

/* --json: one object with the format, the metadata and the tensors. */
static int
print_json(const struct model_source *s, const struct index_header *h)
{
	const char *key, *value;
	struct index_tensor t;
	int r;

	printf("{\"ok\":true,\"protocol\":%d,\"format\":\"%s\",\"metadata\":{",
	       CONTROL_PROTOCOL_VERSION, source_format_name(s->format));
	for (uint64_t i = 0; i < h->meta_count; i++) {
		if ((r = index_meta_at(s->index, h, i, &key, &value)) < 0)
			return r;
		if (i > 0)
			putchar(',');
		ctl_json_string(stdout, key, strlen(key));
		putchar(':');
		ctl_json_string(stdout, value, strlen(value));
	}
	printf("},\"tensors\":[");
	for (uint64_t i = 0; i < h->tensor_count; i++) {
		if ((r = index_tensor_at(s->index, h, i, &t)) < 0)
			return r;
		printf("%s{\"name\":", i ? "," : "");
		ctl_json_string(stdout, t.name, strlen(t.name));
		printf(",\"dtype\":\"%s\",\"shape\":", dtype_by_code(t.dtype)->name);
		print_shape(stdout, &t, 1);
		printf(",\"offset\":%" PRIu64 ",\"nbytes\":%" PRIu64 ",\"file\":", t.offset,
			t.nbytes);
		ctl_json_string(stdout, s->files[t.file].path, strlen(s->files[t.file].path));
		putchar('}');
	}
	printf("]}\n");
	return 0;
}

/* The widths of the table's columns: at least the usual ones, wider where a
 * name, shape or number is (the escaped text counted as it shows). */
struct inspect_widths {
	size_t name, shape, bytes, offset;
};

/* A tensor's shape as the table shows it, "[2, 3]", in buf (a shape of
 * INDEX_MAX_NDIM dimensions whose non-zero ones multiply to 64 bits at
 * most is far shorter than INSPECT_SHAPE_MAX). */
#define INSPECT_SHAPE_MAX 2048

static void
shape_text(const struct index_tensor *t, char *buf, size_t cap)
{
	FILE *mf = fmemopen(buf, cap, "w");

	if (mf == NULL) {
		snprintf(buf, cap, "?");
		return;
	}
	print_shape(mf, t, 0);
	fclose(mf);
}

/* The number of decimal digits of v. */
static size_t
digits(uint64_t v)
{
	size_t n = 1;

	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

/* A first pass over the tensors: the widths every row fits in. */
static int
table_widths(const struct model_source *s, const struct index_header *h,
	struct inspect_widths *w)
{
	struct index_tensor t;
	char shape[INSPECT_SHAPE_MAX];
	int r;

	*w = (struct inspect_widths){ .name = 48, .shape = 20, .bytes = 14, .offset = 14 };
	for (uint64_t i = 0; i < h->tensor_count; i++) {
		size_t n;

		if ((r = index_tensor_at(s->index, h, i, &t)) < 0)
			return r;
		shape_text(&t, shape, sizeof(shape));
		if ((n = escape_width(t.name)) > w->name)
			w->name = n;
		if ((n = strlen(shape)) > w->shape)
			w->shape = n;
		if ((n = digits(t.nbytes)) > w->bytes)
			w->bytes = n;
		if ((n = digits(t.offset)) > w->offset)
			w->offset = n;
	}
	return 0;
}

/* The metadata, then a table of the tensors and a summary line. Every
 * column is as wide as its widest entry, so a long name or shape does not
 * push the rest of its row out of line. */
static int
print_table(const struct model_source *s, const struct index_header *h)
{
	struct index_tensor t;
	struct inspect_widths w;
	uint64_t total = 0;
	const char *key, *value;
	int r;

	if ((r = table_widths(s, h, &w)) < 0)
		return r;
	for (uint64_t i = 0; i < h->meta_count; i++) {
		if ((r = index_meta_at(s->index, h, i, &key, &value)) < 0)
			return r;
		fputs("metadata ", stdout);
		escape_print(stdout, key);
		fputs(" = ", stdout);
		escape_print(stdout, value);
		putchar('\n');
	}
	printf("%-*s %-11s %-*s %*s %*s%s\n", (int)w.name, "NAME", "DTYPE", (int)w.shape,
		"SHAPE", (int)w.bytes, "BYTES", (int)w.offset, "OFFSET",
		s->nfiles > 1 ? "  FILE" : "");
	for (uint64_t i = 0; i < h->tensor_count; i++) {
		char shape[INSPECT_SHAPE_MAX];

		if ((r = index_tensor_at(s->index, h, i, &t)) < 0)
			return r;
		shape_text(&t, shape, sizeof(shape));
		print_safe_padded(t.name, w.name);
		printf(" %-11s %-*s %*" PRIu64 " %*" PRIu64, dtype_by_code(t.dtype)->name,
			(int)w.shape, shape, (int)w.bytes, t.nbytes, (int)w.offset, t.offset);
		if (s->nfiles > 1) {
			fputs("  ", stdout);
			escape_print(stdout, s->files[t.file].path);
		}
		putchar('\n');
		total += t.nbytes;
	}
	printf("%" PRIu64 " tensor%s, %" PRIu64 " bytes of data in %zu file%s (%s)\n",
		h->tensor_count, h->tensor_count == 1 ? "" : "s", total, s->nfiles,
		s->nfiles == 1 ? "" : "s", source_format_name(s->format));
	return 0;
}

/* `wcachectl inspect` (ctl.h). */
int
ctl_inspect(int argc, char **argv)
{
	struct model_source s;
	struct index_header h;
	const char *path = NULL;
	int json = ctl_file_json(argc, argv, NULL), options = 1, r;

	for (int i = 1; i < argc; i++) {
		if (options && strcmp(argv[i], "--") == 0) {
			options = 0; /* as convert: a PATH that starts with '-' follows */
		} else if (options && strcmp(argv[i], "--json") == 0) {
			continue; /* ctl_file_json() read it */
		} else if (options && (strcmp(argv[i], "--help") == 0 ||
			strcmp(argv[i], "-h") == 0)) {
			inspect_usage(stdout);
			return 0;
		} else if (options && argv[i][0] == '-' && argv[i][1] != '\0') {
			return ctl_json_usage(json, ctl_usage_error("inspect",
				"unknown option \"%s\"", argv[i]));
		} else if (path == NULL) {
			path = argv[i];
		} else {
			return ctl_json_usage(json, ctl_usage_error("inspect",
				"unexpected argument \"%s\": inspect takes one PATH", argv[i]));
		}
	}
	if (path == NULL)
		return ctl_json_usage(json, ctl_usage_error("inspect", "missing PATH"));
	if (source_open(path, &s) < 0)
		return ctl_fail(json, "%s", error_get());
	if ((r = index_open(s.index, s.index_len, &h)) < 0)
		ctl_fail(json, "%s: %s", path, error_get());
	/* index_open() checked every entry that the printers read again: a
	 * failure there (none expected) ends what was printed, with no object. */
	else if ((r = json ? print_json(&s, &h) : print_table(&s, &h)) < 0)
		ctl_error("%s: %s", path, error_get());
	source_close(&s);
	/* A failed write to stdout: main() says so (ctl_finish_output()). */
	return r < 0 ? 1 : 0;
}
