/*
 * ctl_convert.c: `wcachectl convert [--to safetensors|weig] IN OUT`: rewrites
 * a model in the other format (or the same one, normalised): safetensors
 * (single or sharded) to WEIG so wcached can serve it with aligned data,
 * WEIG back to safetensors for other tools, and a big-endian WEIG file to a
 * little-endian one, the only form that can be mapped zero-copy here.
 *
 * IN is validated completely by the same readers wcached uses before a byte
 * is written; OUT is written to a temporary file and renamed, so it is either
 * the whole new file or untouched. A file of IN written in place while its
 * data is copied fails the conversion (inputs_unchanged()), as it fails a
 * load. An OUT that is IN, or one of IN's files
 * (the same inode, by any path), is refused before anything is opened for
 * writing.
 *
 * A signal that ends the conversion (SIGINT, SIGTERM, SIGHUP, SIGQUIT, or a
 * SIGBUS when an input file shrinks under its mapping) removes the
 * temporary file before the process ends by it: writer_remove_temporaries().
 *
 * A long conversion shows its progress on a terminal (standard error): bytes
 * written, rate and time left, measured by a thread from the process's own
 * write counter (/proc/self/io), so the writers need no hook. A one-line
 * summary goes to standard output at the end.
 *
 * The readers' messages quote names and paths from IN (a sharded index
 * names its shards): they, and OUT, are printed escaped (ctl_error(),
 * escape_print()).
 */
#include <byteswap.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "base/deadline.h"
#include "base/decimal.h"
#include "base/error.h"
#include "base/escape.h"
#include "base/file.h"
#include "format/index.h"
#include "format/source.h"
#include "format/weig.h"
#include "lib/model.h"
#include "lib/outfile.h"
#include "lib/wcache.h"
#include "lib/writer.h"

/* What IN holds, as far as choosing a conversion goes. */
enum convert_input {
	INPUT_SAFETENSORS, /* anything wc_open_file reads that is not WEIG */
	INPUT_WEIG,
	INPUT_WEIG_BIG_ENDIAN,
};

/* Prints `wcachectl convert --help`. */
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
 * readers explain what is wrong with an unreadable IN. src is IN as opened,
 * NULL when it did not open: an opened IN's format is the one its readers
 * found, not what a second read of its magic says (one that failed once
 * would take a WEIG file for safetensors, and pick the wrong default
 * target). */
static enum convert_input
classify_input(const char *path, const struct model_source *src)
{
	struct stat st;
	uint32_t magic;

	if (src != NULL)
		return src->format == FORMAT_WEIG ? INPUT_WEIG : INPUT_SAFETENSORS;
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

/* True if name ends in suffix, in any case (OUT.WEIG as OUT.weig, as --to
 * takes WEIG for weig). */
static bool
has_suffix_any_case(const char *name, const char *suffix)
{
	size_t n = strlen(name), m = strlen(suffix);

	return n >= m && strcasecmp(name + n - m, suffix) == 0;
}

/* The default target: OUT's extension (in any case), else the format IN is
 * not in. */
static enum writer_format
default_format(enum convert_input in, const char *out)
{
	if (has_suffix_any_case(out, ".weig"))
		return WRITER_WEIG;
	if (has_suffix_any_case(out, ".safetensors"))
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

/*
 * The writer's check before the commit (writer_check_fn): no file of IN
 * (src, opened before the conversion) changed size or modification time
 * while its data was copied; a file written in place meanwhile would give
 * OUT a mix of old and new bytes that no reader could tell from a model.
 */
static int
inputs_unchanged(void *ctx)
{
	const struct model_source *src = ctx;
	int rc;

	for (size_t i = 0; i < src->nfiles; i++)
		if ((rc = file_check_unchanged(&src->files[i])) < 0)
			return rc;
	return 0;
}

/* Writes src (IN, opened and validated by the library's readers) in format
 * fmt, its files checked to be unchanged at the end: those read from, not
 * a second opening of IN's path, which a rename meanwhile would make
 * other files. */
static int
convert_model(const char *in, const char *out, enum writer_format fmt,
	const struct model_source *src)
{
	wc_model *m = NULL;
	int rc;

	if ((rc = model_view_source(in, src, &m)) < 0)
		return rc;
	rc = writer_model_checked(m, fmt, out, inputs_unchanged, (void *)src);
	wc_release(m);
	return rc;
}

/* ---- refusing to overwrite the input ---------------------------------- */

/* Are a and b the same file? */
static bool
same_inode(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/*
 * The shard index of a directory IN is no file of the opened model
 * (src->files holds the shards), but replacing it destroys IN as surely:
 * fails (-EEXIST, message set) when so, the file out (stat so) is any
 * *.safetensors.index.json that the directory in holds, by any path.
 */
static int
refuse_shard_index(const char *in, const char *out, const struct stat *so)
{
	static const char suffix[] = ".safetensors.index.json";
	const size_t suffix_len = sizeof(suffix) - 1;
	struct dirent *e;
	struct stat st;
	DIR *d;
	int rc = 0;

	if (stat(in, &st) < 0 || !S_ISDIR(st.st_mode) || (d = opendir(in)) == NULL)
		return 0;
	while (rc == 0 && (e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);

		if (len < suffix_len || strcmp(e->d_name + len - suffix_len, suffix) != 0)
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && same_inode(&st, so))
			rc = error_set(-EEXIST, "%s: the output is %s/%s, the shard index of the "
				"input %s: write the conversion to another path", out, in,
				e->d_name, in);
	}
	closedir(d);
	return rc;
}

/*
 * Fails (-EEXIST, message set) when out names in itself or one of the files
 * of the model at in (a shard of a sharded model, the file a directory
 * holds, a directory's shard index), by any path: a symlink, a hard link,
 * "./x" for "x". src is the input as opened, or zeroed where it did not
 * open.
 */
static int
refuse_same_file(const char *in, const char *out, const struct model_source *src)
{
	struct stat so, si;

	if (stat(out, &so) < 0)
		return 0; /* OUT does not exist yet (or cannot be seen): not IN */
	if (stat(in, &si) == 0 && same_inode(&si, &so))
		return error_set(-EEXIST, "%s: the output is the input %s: write the "
			"conversion to another path", out, in);
	for (size_t i = 0; i < src->nfiles; i++)
		if (same_inode(&src->files[i].st, &so))
			return error_set(-EEXIST, "%s: the output is %s, a file of the input %s: "
				"write the conversion to another path", out, src->files[i].path,
				in);
	return refuse_shard_index(in, out, &so);
}

/* ---- interruption ------------------------------------------------------------ */

/* The signals that end a conversion and whose handler removes its temporary
 * file first. SIGXFSZ is a write past the file size limit (ulimit -f): by
 * its default action it ended the process with the temporary file, as large
 * as the limit, left behind. */
static const int convert_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGBUS, SIGXFSZ };

/*
 * Removes the temporary file, then ends the process by the same signal
 * (SA_RESETHAND restored the default action; the signal is blocked in the
 * handler, so it is delivered when the handler returns, and a SIGBUS from a
 * fault is raised again by the faulting access). Async-signal-safe.
 */
static void
convert_on_signal(int sig)
{
	static const char shrank[] = "wcachectl: convert: an input file shrank while it was "
		"read (SIGBUS); the output was not written\n";
	static const char too_large[] = "wcachectl: convert: the output reached the file "
		"size limit (ulimit -f, SIGXFSZ); the output was not written\n";
	int saved = errno;

	writer_remove_temporaries();
	if (sig == SIGBUS)
		(void)!write(STDERR_FILENO, shrank, sizeof(shrank) - 1);
	else if (sig == SIGXFSZ)
		(void)!write(STDERR_FILENO, too_large, sizeof(too_large) - 1);
	(void)raise(sig);
	errno = saved;
}

/* Installs convert_on_signal() for convert_signals, except where a signal
 * is ignored (as nohup and a shell's background jobs ignore some): the
 * conversion must not end where it would not have. */
static void
convert_catch_signals(void)
{
	struct sigaction sa, old;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = convert_on_signal;
	sa.sa_flags = SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(convert_signals) / sizeof(convert_signals[0]); i++)
		if (sigaction(convert_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
			(void)sigaction(convert_signals[i], &sa, NULL);
}

/* ---- progress -------------------------------------------------------------- */

#define PROGRESS_AFTER 1.0     /* seconds before the first progress line */
#define PROGRESS_INTERVAL_MS 250      /* milliseconds between progress lines */

/* The progress thread's state; the mutex guards done. */
struct progress {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done, shown;
	uint64_t total, base;  /* bytes to write; write counter at the start */
	double start;
	char *out;             /* OUT, escaped (escape_print()), malloc'd */
};

int
ctl_convert_io_wchar(const char *text, size_t len, uint64_t *out)
{
	static const char name[] = "wchar: ";
	const size_t nlen = sizeof(name) - 1;

	for (size_t at = 0; at < len;) {
		const char *line = text + at, *nl = memchr(line, '\n', len - at);
		size_t n = nl != NULL ? (size_t)(nl - line) : len - at;

		if (n < nlen || memcmp(line, name, nlen) != 0) {
			at += n + 1;
			continue;
		}
		return decimal_u64(line + nlen, n - nlen, out) == 0 ? 0 : -EINVAL;
	}
	return -EINVAL;
}

/* The process's write counter: bytes it has written with write(2) and the
 * like (wchar of /proc/self/io, whose text is copied here first). -1 when
 * unknown. */
static int
bytes_written(uint64_t *out)
{
	char text[512]; /* the kernel writes seven lines of about 30 bytes */
	size_t used = 0;
	int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	while (used < sizeof(text)) {
		ssize_t n = read(fd, text + used, sizeof(text) - used);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		used += (size_t)n;
	}
	close(fd);
	return ctl_convert_io_wchar(text, used, out) == 0 ? 0 : -1;
}

/* "1.5 GiB" */
static const char *
human(uint64_t b, char *buf, size_t cap)
{
	if (b >= (1ull << 30))
		snprintf(buf, cap, "%.1f GiB", (double)b / (double)(1ull << 30));
	else if (b >= (1u << 20))
		snprintf(buf, cap, "%.1f MiB", (double)b / (double)(1u << 20));
	else
		snprintf(buf, cap, "%" PRIu64 " bytes", b);
	return buf;
}

/* Rewrites the progress line on the terminal. */
static void
progress_line(struct progress *p)
{
	uint64_t now_bytes, done = 0;
	double elapsed = ctl_monotonic() - p->start, rate;
	char a[32], b[32], left[48] = "";

	if (elapsed < PROGRESS_AFTER || bytes_written(&now_bytes) < 0)
		return;
	done = now_bytes > p->base ? now_bytes - p->base : 0;
	if (done > p->total)
		done = p->total;
	rate = (double)done / elapsed;
	if (done >= p->total)
		snprintf(left, sizeof(left), ", syncing to disk");
	else if (rate > 0)
		snprintf(left, sizeof(left), ", %.0f s left", (double)(p->total - done) / rate);
	fputs("\rwcachectl: writing ", stderr);
	escape_print(stderr, p->out);
	fprintf(stderr, ": %s of %s (%.0f%%), %.0f MB/s%s\033[K",
		human(done, a, sizeof(a)), human(p->total, b, sizeof(b)),
		p->total > 0 ? (double)done * 100.0 / (double)p->total : 100.0, rate / 1e6, left);
	p->shown = true;
}

/* The progress thread: a line every PROGRESS_INTERVAL_MS until done, then
 * the line cleared. */
static void *
progress_main(void *arg)
{
	struct progress *p = arg;
	struct timespec ts;

	pthread_mutex_lock(&p->lock);
	while (!p->done) {
		ts = deadline_in_ms(CLOCK_REALTIME, PROGRESS_INTERVAL_MS);
		if (pthread_cond_timedwait(&p->cond, &p->lock, &ts) != 0 && !p->done)
			progress_line(p);
	}
	if (p->shown)
		fputs("\r\033[K", stderr); /* the summary replaces it */
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* OUT as the progress line shows it: escaped, malloc'd; NULL when out of
 * memory. */
static char *
escaped_copy(const char *s)
{
	char *copy = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&copy, &len);

	if (f == NULL)
		return NULL;
	escape_print(f, s);
	if (fclose(f) != 0) {
		free(copy);
		return NULL;
	}
	return copy;
}

/* Starts the progress thread when standard error is a terminal. Returns
 * whether it runs. */
static bool
progress_start(struct progress *p, uint64_t total, const char *out)
{
	sigset_t all, old;
	bool started;

	memset(p, 0, sizeof(*p));
	if (!isatty(STDERR_FILENO) || bytes_written(&p->base) < 0 ||
		(p->out = escaped_copy(out)) == NULL)
		return false;
	p->total = total;
	p->start = ctl_monotonic();
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	/* The thread blocks every signal: a kill or a Ctrl-C goes to the main
	 * thread, which blocks them while a temporary file has no slot yet
	 * (outfile.c), so the handler never runs here in that moment. */
	sigfillset(&all);
	(void)pthread_sigmask(SIG_BLOCK, &all, &old);
	started = pthread_create(&p->thread, NULL, progress_main, p) == 0;
	(void)pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!started) {
		pthread_cond_destroy(&p->cond);
		pthread_mutex_destroy(&p->lock);
		free(p->out);
		return false;
	}
	return true;
}

/* Stops the progress thread and frees what progress_start() set up. */
static void
progress_stop(struct progress *p)
{
	pthread_mutex_lock(&p->lock);
	p->done = true;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->thread, NULL);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->out);
}

/* ---- the command ------------------------------------------------------------- */

/*
 * "wrote OUT: WEIG, 291 tensors, 1.5 GiB in 6.8 s (236 MB/s)" on stdout; on
 * stderr, and without the size it cannot know, for an OUT written into (a
 * FIFO or a device, or stdout's own file: /dev/stdout piped on or redirected
 * is the model's stream itself).
 */
static void
print_summary(const char *out, enum writer_format fmt, const struct model_source *src,
	double seconds)
{
	struct index_header h;
	struct stat st;
	char size[32], tensors[48] = "";
	const char *kind = fmt == WRITER_WEIG ? "WEIG" : "safetensors";

	if (src->index != NULL && index_open(src->index, src->index_len, &h) == 0)
		snprintf(tensors, sizeof(tensors), " %" PRIu64 " tensor%s,", h.tensor_count,
			h.tensor_count == 1 ? "" : "s");
	if (stat(out, &st) < 0) {
		st.st_mode = S_IFREG;
		st.st_size = 0;
	}
	if (!S_ISREG(st.st_mode) || outfile_is_stdout(&st)) {
		tensors[strcspn(tensors, ",")] = '\0';
		fputs("wrote ", stderr);
		escape_print(stderr, out);
		fprintf(stderr, ": %s%s%s in %.1f s\n", kind, tensors[0] != '\0' ? "," : "",
			tensors, seconds);
		return;
	}
	printf("wrote ");
	escape_print(stdout, out);
	printf(": %s,%s %s in %.1f s (%.0f MB/s)\n", kind, tensors,
		human((uint64_t)st.st_size, size, sizeof(size)), seconds,
		seconds > 0 ? (double)st.st_size / seconds / 1e6 : 0.0);
}

/* `wcachectl convert` (ctl.h). */
int
ctl_convert(int argc, char **argv)
{
	const char *paths[2] = { NULL, NULL };
	enum writer_format fmt = 0;
	enum convert_input in;
	struct model_source src;
	struct progress progress;
	char *why = NULL;
	uint64_t total = 0;
	double start;
	bool shown;
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

			if (v == NULL)
				return ctl_usage_error("convert", "--to needs safetensors or weig");
			if ((fmt = parse_format(v)) == 0)
				return ctl_usage_error("convert", "--to needs safetensors or weig, "
					"not \"%s\"", v);
		} else if (options && a[0] == '-' && a[1] != '\0') {
			return ctl_usage_error("convert", "unknown option \"%s\"", a);
		} else if (npaths < 2) {
			paths[npaths++] = a;
		} else {
			return ctl_usage_error("convert",
				"unexpected argument \"%s\": convert takes IN and OUT", a);
		}
	}
	if (npaths < 2)
		return ctl_usage_error("convert", "missing %s", npaths == 0 ? "IN OUT" : "OUT");
	/* IN is opened once: refuse_same_file() compares its files with OUT,
	 * the conversion reads them, and they are checked after it. */
	if ((rc = source_open(paths[0], &src)) < 0) {
		memset(&src, 0, sizeof(src));
		why = strdup(error_get());
	}
	if (refuse_same_file(paths[0], paths[1], &src) < 0) {
		ctl_error("%s", error_get());
		source_close(&src);
		free(why);
		return 1;
	}
	in = classify_input(paths[0], rc == 0 ? &src : NULL);
	if (rc < 0 && in != INPUT_WEIG_BIG_ENDIAN) { /* that one is swapped, not read */
		ctl_error("%s", why != NULL ? why : strerror(-rc));
		free(why);
		return 1;
	}
	free(why);
	if (fmt == 0)
		fmt = default_format(in, paths[1]);
	for (size_t i = 0; i < src.nfiles; i++)
		total += src.files[i].size;
	if (total == 0) { /* a big-endian WEIG file: the readers refuse it */
		struct stat st;

		if (stat(paths[0], &st) == 0)
			total = (uint64_t)st.st_size;
	}
	convert_catch_signals();
	start = ctl_monotonic();
	shown = progress_start(&progress, total, paths[1]);
	if (in == INPUT_WEIG_BIG_ENDIAN)
		rc = writer_from_big_endian(paths[0], fmt, paths[1]);
	else
		rc = convert_model(paths[0], paths[1], fmt, &src);
	if (shown)
		progress_stop(&progress);
	if (rc < 0) {
		ctl_error("%s", error_get());
		source_close(&src);
		return 1;
	}
	print_summary(paths[1], fmt, &src, ctl_monotonic() - start);
	source_close(&src);
	return 0; /* a failed write to stdout: main() says so (ctl_finish_output()) */
}
