/*
 * bench_load.c: one loading strategy, measured in a fresh process, for the
 * loading benchmark (tests/bench/bench.py runs it, issue 3).
 *
 *   bench_load run VARIANT FILE [--socket PATH --model NAME] [--repeat N]
 *                                [--hold] [--no-touch]
 *   bench_load evict FILE       drop FILE from the page cache, say how much stayed
 *   bench_load resident FILE    say how much of FILE is in the page cache
 *
 * VARIANT is one of
 *   read    the traditional loader: read the header with read(2), parse it
 *           with jansson, then malloc a buffer per tensor and pread(2) the
 *           tensor into it, in file order;
 *   open    wc_open_file(): map the file and validate it in this process;
 *   attach  wc_connect() + wc_attach() through a running wcached;
 *   mmap    the bare baseline: open + mmap the file, no parsing at all.
 *
 * It measures the time until every tensor is addressable (the loading call,
 * then one pointer per tensor collected: wc_model_tensor() for open and
 * attach), then the time to touch every page of every tensor (one byte per
 * 4 KiB page, in file order: the pointers are sorted by address first,
 * untimed, so the walk is the same as the bare mmap's), the peak RSS
 * (VmHWM) after each step, and the resident memory by kind after touching.
 * Each time is taken as wall time and as the process's CPU time, which does
 * not grow while other processes hold the CPU. The process is fresh, so VmHWM is
 * this variant's alone. With --repeat N it then repeats the loading call N
 * times (open: wc_open_file + wc_release; attach: wc_attach + wc_release on
 * the same connection) and reports the best and median call times; and
 * --repeat-full M times (default min(N, 5)) the whole load: until the state
 * dict is ready (a pointer per tensor) and until every page is read. It
 * prints one JSON line. With --hold it then waits for a line (or EOF) on
 * stdin before releasing anything, so a driver can sum the PSS of several
 * workers holding the model at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"
#include <wcache.h>

#define PAGE 4096u
#define MAX_REPEAT 10000

/* One tensor as a loader holds it: where its bytes are. */
struct held {
	const uint8_t *data;
	uint64_t nbytes;
	uint64_t offset; /* read: file offset of the data, for ordering */
};

/* What a run holds and measured. */
struct run {
	const char *variant;
	const char *file;
	const char *socket;
	const char *model_name;
	struct held *t;
	size_t n;
	uint64_t bytes;
	/* read */
	void **buffers;
	/* open, attach */
	wc_model *m;
	wc_client *c;
	/* mmap */
	const uint8_t *map;
	uint64_t size;
	/* figures */
	double connect_s, call_s, addressable_s, touch_s, parse_s;
	double call_cpu_s, addressable_cpu_s, touch_cpu_s; /* CPU time of this process */
	uint64_t pages;
};

static volatile uint64_t sink;

/* CPU time of this (single-threaded) process: what the step cost without
 * the time spent waiting for a CPU on a busy machine. */
static double
cpu_now(void)
{
	return bench_clock(CLOCK_PROCESS_CPUTIME_ID);
}

static int
by_offset(const void *a, const void *b)
{
	const struct held *x = a, *y = b;

	return (x->offset > y->offset) - (x->offset < y->offset);
}

static int
by_address(const void *a, const void *b)
{
	const struct held *x = a, *y = b;

	return (x->data > y->data) - (x->data < y->data);
}

/* A "Name:   123 kB" field of /proc/self/status, in KiB; -1 if absent. */
static long
status_kib(const char *field)
{
	char line[256];
	size_t flen = strlen(field);
	long v = -1;
	FILE *f = fopen("/proc/self/status", "re");

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
			v = strtol(line + flen + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

static int
pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t got = pread(fd, p, len, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -errno : -EIO;
		p += got;
		len -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}

/*
 * The traditional loader: read the header, parse it with a JSON library,
 * then one malloc'd buffer per tensor filled with pread(2), in file order.
 */
static int
load_read(struct run *r)
{
	uint8_t len8[8];
	uint64_t hlen;
	char *header = NULL;
	json_t *root = NULL;
	json_error_t jerr;
	const char *key;
	json_t *value;
	size_t i = 0;
	int fd, err = -EINVAL;
	double t0 = bench_now();

	if ((fd = open(r->file, O_RDONLY | O_CLOEXEC)) == -1)
		return -errno;
	if (pread_all(fd, len8, 8, 0) < 0)
		goto out;
	hlen = bench_le64(len8);
	if (hlen > 100000000 || (header = malloc((size_t)hlen)) == NULL ||
		pread_all(fd, header, (size_t)hlen, 8) < 0)
		goto out;
	if ((root = json_loadb(header, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr)) == NULL ||
		!json_is_object(root)) {
		fprintf(stderr, "bench_load: %s: %s\n", r->file, jerr.text);
		goto out;
	}
	r->n = json_object_size(root);
	if ((r->t = calloc(r->n ? r->n : 1, sizeof(*r->t))) == NULL ||
		(r->buffers = calloc(r->n ? r->n : 1, sizeof(void *))) == NULL) {
		err = -ENOMEM;
		goto out;
	}
	json_object_foreach(root, key, value) {
		json_t *off = json_object_get(value, "data_offsets");
		uint64_t b, e;

		if (strcmp(key, "__metadata__") == 0)
			continue;
		if (!json_is_array(off) || json_array_size(off) != 2)
			goto out;
		b = (uint64_t)json_integer_value(json_array_get(off, 0));
		e = (uint64_t)json_integer_value(json_array_get(off, 1));
		if (e < b)
			goto out;
		r->t[i].offset = 8 + hlen + b;
		r->t[i].nbytes = e - b;
		i++;
	}
	r->n = i;
	r->parse_s = bench_now() - t0;
	qsort(r->t, r->n, sizeof(*r->t), by_offset);
	for (i = 0; i < r->n; i++) {
		uint8_t *buf = malloc(r->t[i].nbytes ? (size_t)r->t[i].nbytes : 1);

		if (buf == NULL) {
			err = -ENOMEM;
			goto out;
		}
		r->buffers[i] = buf;
		if ((err = pread_all(fd, buf, (size_t)r->t[i].nbytes, r->t[i].offset)) < 0)
			goto out;
		r->t[i].data = buf;
		r->bytes += r->t[i].nbytes;
	}
	err = 0;
out:
	json_decref(root);
	free(header);
	close(fd);
	return err;
}

/* After wc_open_file or wc_attach: one pointer per tensor, in file order. */
static int
collect(struct run *r)
{
	wc_tensor t;

	r->n = wc_model_count(r->m);
	if ((r->t = calloc(r->n ? r->n : 1, sizeof(*r->t))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < r->n; i++) {
		if (wc_model_tensor(r->m, i, &t) < 0)
			return -EBADMSG;
		r->t[i].data = t.data;
		r->t[i].nbytes = t.nbytes;
		r->bytes += t.nbytes;
	}
	return 0;
}

/* The bare baseline: open + mmap, nothing else. */
static int
load_mmap(struct run *r)
{
	struct stat st;
	void *p;
	int fd = open(r->file, O_RDONLY | O_CLOEXEC);

	if (fd == -1)
		return -errno;
	if (fstat(fd, &st) == -1) {
		close(fd);
		return -errno;
	}
	r->size = (uint64_t)st.st_size;
	p = mmap(NULL, (size_t)r->size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -errno;
	r->map = p;
	r->bytes = r->size;
	return 0;
}

/* Loads and collects; fills call_s (and connect_s) and addressable_s. */
static int
load(struct run *r)
{
	double c0 = cpu_now(), t0 = bench_now(), t1;
	int err;

	if (strcmp(r->variant, "read") == 0) {
		err = load_read(r);
		r->call_s = bench_now() - t0;
		r->call_cpu_s = cpu_now() - c0;
	} else if (strcmp(r->variant, "mmap") == 0) {
		err = load_mmap(r);
		r->call_s = bench_now() - t0;
		r->call_cpu_s = cpu_now() - c0;
	} else if (strcmp(r->variant, "open") == 0) {
		err = wc_open_file(r->file, &r->m);
		r->call_s = bench_now() - t0;
		r->call_cpu_s = cpu_now() - c0;
		if (err == 0)
			err = collect(r);
	} else if (strcmp(r->variant, "attach") == 0) {
		if ((err = wc_connect(r->socket, &r->c)) < 0)
			return err;
		t1 = bench_now();
		r->connect_s = t1 - t0;
		err = wc_attach(r->c, r->model_name, &r->m);
		r->call_s = bench_now() - t0;
		r->call_cpu_s = cpu_now() - c0;
		if (err == 0)
			err = collect(r);
	} else {
		return -EINVAL;
	}
	r->addressable_s = bench_now() - t0;
	r->addressable_cpu_s = cpu_now() - c0;
	return err;
}

/*
 * Reads one byte of every page of every tensor, in file (address) order:
 * the first byte of the tensor and the first byte of each later page it
 * covers. The mmap baseline reads one byte of every page of the file.
 */
static void
touch(struct run *r)
{
	uint64_t sum = 0, pages = 0;
	double t0, c0;

	if (r->t != NULL && r->variant[0] != 'r')
		qsort(r->t, r->n, sizeof(*r->t), by_address);
	c0 = cpu_now();
	t0 = bench_now();
	if (r->map != NULL) {
		for (uint64_t off = 0; off < r->size; off += PAGE, pages++)
			sum += r->map[off];
	} else {
		for (size_t i = 0; i < r->n; i++) {
			const volatile uint8_t *p = r->t[i].data;
			uintptr_t a = (uintptr_t)p, end = a + r->t[i].nbytes;

			if (r->t[i].nbytes == 0)
				continue;
			sum += *p;
			pages++;
			for (a = (a | (PAGE - 1)) + 1; a < end; a += PAGE, pages++)
				sum += *(const volatile uint8_t *)a;
		}
	}
	r->touch_s = bench_now() - t0;
	r->touch_cpu_s = cpu_now() - c0;
	r->pages = pages;
	sink += sum;
}

/* Best and median of n timings (sorted in place). */
struct spread {
	double best, median;
};

static struct spread
spread_of(double *t, int n)
{
	qsort(t, (size_t)n, sizeof(t[0]), bench_compare_double);
	return (struct spread){ t[0], t[n / 2] };
}

/*
 * The whole load again, n times, in this warm process: the loading call,
 * one pointer per tensor ("state dict ready"), then one byte of every page
 * of every tensor ("every page read"; the pointers sorted by address first,
 * untimed, as in the first run), then the release. Returns the number of
 * rounds or -errno.
 */
static int
repeat_full(struct run *r, int n, struct spread *ready, struct spread *all_read)
{
	static double tr[MAX_REPEAT], ta[MAX_REPEAT];
	struct held *h;
	int k;

	if ((h = calloc(r->n ? r->n : 1, sizeof(*h))) == NULL)
		return -ENOMEM;
	for (k = 0; k < n; k++) {
		wc_model *m = NULL;
		uint64_t sum = 0;
		double t0 = bench_now(), t1;
		size_t count;
		int err;
		wc_tensor t;

		err = r->c != NULL ? wc_attach(r->c, r->model_name, &m) : wc_open_file(r->file, &m);
		if (err < 0) {
			free(h);
			return err;
		}
		count = wc_model_count(m) < r->n ? wc_model_count(m) : r->n;
		for (size_t i = 0; i < count; i++) {
			if (wc_model_tensor(m, i, &t) < 0) {
				wc_release(m);
				free(h);
				return -EBADMSG;
			}
			h[i].data = t.data;
			h[i].nbytes = t.nbytes;
		}
		t1 = bench_now();
		tr[k] = t1 - t0;
		qsort(h, count, sizeof(*h), by_address);
		t1 = bench_now() - t1; /* the sort, untimed */
		for (size_t i = 0; i < count; i++) {
			uintptr_t a = (uintptr_t)h[i].data, end = a + h[i].nbytes;

			if (h[i].nbytes == 0)
				continue;
			sum += *(const volatile uint8_t *)a;
			for (a = (a | (PAGE - 1)) + 1; a < end; a += PAGE)
				sum += *(const volatile uint8_t *)a;
		}
		ta[k] = bench_now() - t0 - t1;
		sink += sum;
		wc_release(m);
	}
	free(h);
	if (k > 0) {
		*ready = spread_of(tr, k);
		*all_read = spread_of(ta, k);
	}
	return k;
}

/* Repeats the loading call; returns the number of timed calls or -errno. */
static int
repeat(struct run *r, int n, double *best, double *median)
{
	static double t[MAX_REPEAT];
	int k;

	for (k = 0; k < n; k++) {
		wc_model *m = NULL;
		double t0 = bench_now();
		int err;

		if (r->c != NULL)
			err = wc_attach(r->c, r->model_name, &m);
		else
			err = wc_open_file(r->file, &m);
		t[k] = bench_now() - t0;
		if (err < 0)
			return err;
		wc_release(m);
	}
	if (k == 0)
		return 0;
	*best = spread_of(t, k).best;
	*median = t[k / 2];
	return k;
}

/* Frees the buffers, releases the model, unmaps the file. */
static void
release(struct run *r)
{
	if (r->buffers != NULL)
		for (size_t i = 0; i < r->n; i++)
			free(r->buffers[i]);
	free(r->buffers);
	free(r->t);
	wc_release(r->m);
	wc_disconnect(r->c);
	if (r->map != NULL)
		munmap((void *)r->map, (size_t)r->size);
}

/* bench_load run: loads, touches, measures, prints one JSON line, holds. */
static int
cmd_run(int argc, char **argv)
{
	struct run r = { 0 };
	int hold = 0, do_touch = 1, nrepeat = 0, nfull = -1, k = 0, kf = 0, err;
	long hwm_addr, hwm, anon, file, shmem;
	double best = 0, median = 0;
	struct spread ready = { 0, 0 }, all_read = { 0, 0 };
	char line[64];

	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
			r.socket = argv[++i];
		else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			r.model_name = argv[++i];
		else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
			nrepeat = atoi(argv[++i]);
		else if (strcmp(argv[i], "--repeat-full") == 0 && i + 1 < argc)
			nfull = atoi(argv[++i]);
		else if (strcmp(argv[i], "--hold") == 0)
			hold = 1;
		else if (strcmp(argv[i], "--no-touch") == 0)
			do_touch = 0;
		else if (r.variant == NULL)
			r.variant = argv[i];
		else if (r.file == NULL)
			r.file = argv[i];
		else
			return 2;
	}
	if (nfull < 0)
		nfull = nrepeat < 5 ? nrepeat : 5;
	if (r.variant == NULL || r.file == NULL || nrepeat < 0 || nrepeat > MAX_REPEAT ||
		nfull > MAX_REPEAT ||
		(strcmp(r.variant, "attach") == 0 && r.model_name == NULL))
		return 2;
	if ((err = load(&r)) < 0) {
		fprintf(stderr, "bench_load: %s %s: %s (%s)\n", r.variant, r.file, strerror(-err),
			wc_errmsg());
		return 1;
	}
	hwm_addr = status_kib("VmHWM");
	if (do_touch)
		touch(&r);
	hwm = status_kib("VmHWM");
	anon = status_kib("RssAnon");
	file = status_kib("RssFile");
	shmem = status_kib("RssShmem");
	if (nrepeat > 0 && (r.m != NULL) && (k = repeat(&r, nrepeat, &best, &median)) < 0) {
		fprintf(stderr, "bench_load: repeat: %s\n", wc_errmsg());
		return 1;
	}
	if (nfull > 0 && r.m != NULL && (kf = repeat_full(&r, nfull, &ready, &all_read)) < 0) {
		fprintf(stderr, "bench_load: repeat: %s\n", wc_errmsg());
		return 1;
	}
	printf("{\"variant\":\"%s\",\"pid\":%d,\"tensors\":%zu,\"bytes\":%" PRIu64
	       ",\"connect_s\":%.9f,\"call_s\":%.9f,\"parse_s\":%.9f,\"addressable_s\":%.9f"
	       ",\"touch_s\":%.9f,\"touched_s\":%.9f,\"pages\":%" PRIu64
	       ",\"hwm_addressable_kib\":%ld,\"hwm_kib\":%ld,\"rss_anon_kib\":%ld"
	       ",\"rss_file_kib\":%ld,\"rss_shmem_kib\":%ld,\"repeats\":%d"
	       ",\"repeat_best_s\":%.9f,\"repeat_median_s\":%.9f,\"generation\":%" PRIu64
	       ",\"call_cpu_s\":%.9f,\"addressable_cpu_s\":%.9f,\"touch_cpu_s\":%.9f"
	       ",\"touched_cpu_s\":%.9f,\"repeats_full\":%d,\"repeat_ready_best_s\":%.9f"
	       ",\"repeat_ready_median_s\":%.9f,\"repeat_read_best_s\":%.9f"
	       ",\"repeat_read_median_s\":%.9f}\n",
		r.variant, (int)getpid(), r.map != NULL ? (size_t)0 : r.n, r.bytes, r.connect_s,
		r.call_s, r.parse_s, r.addressable_s, r.touch_s, r.addressable_s + r.touch_s,
		r.pages, hwm_addr, hwm, anon, file, shmem, k, best, median,
		r.m != NULL ? wc_model_generation(r.m) : 0, r.call_cpu_s, r.addressable_cpu_s,
		r.touch_cpu_s, r.addressable_cpu_s + r.touch_cpu_s, kf, ready.best, ready.median,
		all_read.best, all_read.median);
	fflush(stdout);
	if (hold && fgets(line, sizeof(line), stdin) == NULL && ferror(stdin))
		return 1;
	release(&r);
	return 0;
}

/* Bytes of the file resident in the page cache, by mincore(2) over a
 * fresh mapping (mapping does not read anything in). */
static int
resident(int fd, uint64_t size, uint64_t *out)
{
	unsigned char vec[4096];
	const size_t span = sizeof(vec) * (size_t)PAGE;
	uint64_t count = 0;
	void *p;

	*out = 0;
	if (size == 0)
		return 0;
	if ((p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
		return -errno;
	for (uint64_t off = 0; off < size; off += span) {
		size_t len = size - off < span ? (size_t)(size - off) : span;

		if (mincore((uint8_t *)p + off, len, vec) == -1) {
			int e = errno;

			munmap(p, (size_t)size);
			return -e;
		}
		for (size_t i = 0; i < (len + PAGE - 1) / PAGE; i++)
			count += vec[i] & 1;
	}
	munmap(p, (size_t)size);
	count *= PAGE;
	*out = count < size ? count : size;
	return 0;
}

/* bench_load evict / resident: drops FILE from the page cache (evict, with
 * up to three tries) and prints how many bytes were resident before and
 * after. POSIX_FADV_DONTNEED leaves pages that some process maps. */
static int
cmd_cache(int argc, char **argv, int evict)
{
	struct stat st;
	uint64_t before = 0, after = 0;
	int fd, err, tries = 0;

	if (argc != 3)
		return 2;
	if ((fd = open(argv[2], O_RDONLY | O_CLOEXEC)) == -1 || fstat(fd, &st) == -1) {
		fprintf(stderr, "bench_load: %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	if ((err = resident(fd, (uint64_t)st.st_size, &before)) < 0)
		goto fail;
	after = before;
	/* Dirty pages cannot be dropped: write them back first. */
	while (evict && after > 0 && tries++ < 3) {
		if (fdatasync(fd) == -1 && errno != EINVAL) {
			err = -errno;
			goto fail;
		}
		if ((err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)) != 0) {
			err = -err;
			goto fail;
		}
		if ((err = resident(fd, (uint64_t)st.st_size, &after)) < 0)
			goto fail;
	}
	close(fd);
	printf("{\"file\":\"%s\",\"size\":%lld,\"resident_before\":%" PRIu64
	       ",\"resident_after\":%" PRIu64 "}\n",
		argv[2], (long long)st.st_size, before, after);
	return 0;
fail:
	fprintf(stderr, "bench_load: %s: %s\n", argv[2], strerror(-err));
	close(fd);
	return 1;
}

int
main(int argc, char **argv)
{
	int r = 2;

	if (argc >= 2 && strcmp(argv[1], "run") == 0)
		r = cmd_run(argc, argv);
	else if (argc >= 2 && strcmp(argv[1], "evict") == 0)
		r = cmd_cache(argc, argv, 1);
	else if (argc >= 2 && strcmp(argv[1], "resident") == 0)
		r = cmd_cache(argc, argv, 0);
	if (r == 2)
		fprintf(stderr,
			"usage: bench_load run read|open|attach|mmap FILE "
			"[--socket PATH --model NAME]\n"
			"                  [--repeat N] [--repeat-full M] [--hold] [--no-touch]\n"
			"       bench_load evict FILE\n"
			"       bench_load resident FILE\n");
	return r;
}
