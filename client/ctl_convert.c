/*
 * ctl_convert.c: `wcachectl convert [--to safetensors|weig] IN OUT`: rewrites
 * a model in the other format (or the same one, normalised): safetensors
 * (single or sharded) to WEIG so wcached can serve it with aligned data,
 * WEIG back to safetensors for other tools, and a big-endian WEIG file to a
 * little-endian one, the only form that can be mapped zero-copy here.
 *
 * IN is validated completely by the same readers wcached uses before a byte
 * is written; OUT is written to a temporary file and renamed, so it is either
 * the whole new file or untouched.
 */
#include <byteswap.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ctl.h"
#include "error.h"
#include "file.h"
#include "source.h"
#include "wcache.h"
#include "writer.h"

/* What IN holds, as far as choosing a conversion goes. */
enum convert_input {
	INPUT_SAFETENSORS, /* anything wc_open_file reads that is not WEIG */
	INPUT_WEIG,
	INPUT_WEIG_BIG_ENDIAN,
};

static void
convert_usage(FILE *f)
{
	fprintf(f, "usage: wcachectl convert [--to safetensors|weig] IN OUT\n\n"
		   "Validates IN (a safetensors file, a shard index, a directory holding one,\n"
		   "or a WEIG file of either byte order) and writes it to OUT as safetensors or\n"
		   "WEIG: names, dtypes, shapes, metadata and every data byte are kept. A\n"
		   "big-endian WEIG file is written little-endian, each element byte-swapped.\n"
		   "OUT is written to a temporary file beside it and renamed: it is never\n"
		   "left partial.\n\n"
		   "  --to FORMAT  safetensors or weig; by default OUT's extension decides\n"
		   "               (.weig, .safetensors), else the format IN is not in\n"
		   "               (a big-endian WEIG file becomes a little-endian WEIG)\n");
}

/* Tells WEIG (by its magic, in either byte order) from everything else; the
 * readers explain what is wrong with an unreadable IN. */
static enum convert_input
classify_input(const char *path)
{
	struct stat st;
	uint32_t magic;

	if (stat(path, &st) == -1 || !S_ISREG(st.st_mode))
		return INPUT_SAFETENSORS;
	magic = source_magic(path);
	if (magic == WEIG_MAGIC)
		return INPUT_WEIG;
	if (magic == bswap_32(WEIG_MAGIC))
		return INPUT_WEIG_BIG_ENDIAN;
	return INPUT_SAFETENSORS;
}

/* Parses a --to argument; 0 if unknown. */
static enum writer_format
parse_format(const char *s)
{
	if (strcmp(s, "weig") == 0 || strcmp(s, "WEIG") == 0)
		return WRITER_WEIG;
	if (strcmp(s, "safetensors") == 0)
		return WRITER_SAFETENSORS;
	return 0;
}

/* The default target: OUT's extension, else the format IN is not in. */
static enum writer_format
default_format(enum convert_input in, const char *out)
{
	if (file_has_suffix(out, ".weig"))
		return WRITER_WEIG;
	if (file_has_suffix(out, ".safetensors"))
		return WRITER_SAFETENSORS;
	switch (in) {
	case INPUT_WEIG:
		return WRITER_SAFETENSORS;
	case INPUT_WEIG_BIG_ENDIAN:
	case INPUT_SAFETENSORS:
		break;
	}
	return WRITER_WEIG;
}

/* Opens IN with the library's readers and writes it in format fmt. */
static int
convert_model(const char *in, const char *out, enum writer_format fmt)
{
	wc_model *m = NULL;
	int rc;

	if ((rc = wc_open_file(in, &m)) < 0)
		return rc;
	rc = fmt == WRITER_WEIG ? writer_weig(m, out) : writer_safetensors(m, out);
	wc_release(m);
	return rc;
}

int
ctl_convert(int argc, char **argv)
{
	const char *paths[2] = { NULL, NULL };
	enum writer_format fmt = 0;
	enum convert_input in;
	int npaths = 0, options = 1, rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (options && strcmp(a, "--") == 0) {
			options = 0;
		} else if (options && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
			convert_usage(stdout);
			return 0;
		} else if (options && (strcmp(a, "--to") == 0 || strncmp(a, "--to=", 5) == 0)) {
			const char *v = a[4] == '=' ? a + 5 : (i + 1 < argc ? argv[++i] : NULL);

			if (v == NULL || (fmt = parse_format(v)) == 0) {
				fprintf(stderr, "wcachectl convert: --to needs safetensors or weig%s%s\n",
					v != NULL ? ", not " : "", v != NULL ? v : "");
				convert_usage(stderr);
				return 2;
			}
		} else if (options && a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "wcachectl convert: unknown option %s\n", a);
			convert_usage(stderr);
			return 2;
		} else if (npaths < 2) {
			paths[npaths++] = a;
		} else {
			fprintf(stderr, "wcachectl convert: too many arguments\n");
			convert_usage(stderr);
			return 2;
		}
	}
	if (npaths != 2) {
		convert_usage(stderr);
		return 2;
	}
	in = classify_input(paths[0]);
	if (fmt == 0)
		fmt = default_format(in, paths[1]);
	if (in == INPUT_WEIG_BIG_ENDIAN)
		rc = writer_from_big_endian(paths[0], fmt, paths[1]);
	else
		rc = convert_model(paths[0], paths[1], fmt);
	if (rc < 0) {
		fprintf(stderr, "wcachectl: %s\n", error_get());
		return 1;
	}
	return 0;
}
