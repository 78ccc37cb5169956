/*
 * test_writer.c: the writers (client/lib/writer*.c, outfile.c). Round trips safetensors ->
 * WEIG -> safetensors must keep names, dtypes, shapes, metadata and every
 * data byte; big-endian WEIG files must come out little-endian with each
 * element swapped by its dtype's size; and a failed write must leave no
 * output and no temporary file behind. writer_safetensors_fd() must write
 * the caller's tensors as a file the library's reader accepts, and refuse
 * tensors it would not.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "format/index.h"
#include "format/source.h"
#include "format/weig.h"
#include "testutil.h"
#include "lib/outfile.h"
#include "lib/wcache.h"
#include "lib/writer.h"

/* ---- fault injection ---- */

/*
 * The system calls of a commit, wrapped (tests/CMakeLists.txt links this test
 * with -Wl,--wrap=open,--wrap=fsync,--wrap=close,--wrap=rename): while a
 * counter is above 0, the call fails with EINTR as a signal makes it on a
 * network or FUSE file system, and the counter goes down. open fails only
 * for O_EXCL (the temporary file's), before creating anything; close only
 * for the descriptor fsync was last called on, after closing it, as Linux
 * does. The __real_ symbols are weak, so a build without the options still
 * links; the test that needs them then reports SKIPPED.
 */
static int eintr_open, eintr_fsync, eintr_close, eintr_rename, fsync_fd = -1;
static int fchmod_errno; /* != 0: the next fchmod() fails with it */

int __real_open(const char *path, int flags, ...) __attribute__((weak));
int __real_fsync(int fd) __attribute__((weak));
int __real_close(int fd) __attribute__((weak));
int __real_rename(const char *from, const char *to) __attribute__((weak));
int __real_fchmod(int fd, mode_t mode) __attribute__((weak));
ssize_t __real_write(int fd, const void *buf, size_t n) __attribute__((weak));
int __wrap_fchmod(int fd, mode_t mode);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
int __wrap_open(const char *path, int flags, ...);
int __wrap_fsync(int fd);
int __wrap_close(int fd);
int __wrap_rename(const char *from, const char *to);

int
__wrap_open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;

	if (flags & (O_CREAT | O_TMPFILE)) {
		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	if ((flags & O_EXCL) && eintr_open > 0) {
		eintr_open--;
		errno = EINTR;
		return -1;
	}
	return __real_open(path, flags, mode);
}

int
__wrap_fsync(int fd)
{
	fsync_fd = fd;
	if (eintr_fsync > 0) {
		eintr_fsync--;
		errno = EINTR;
		return -1;
	}
	return __real_fsync(fd);
}

int
__wrap_close(int fd)
{
	int rc = __real_close(fd);

	if (rc == 0 && fd == fsync_fd && eintr_close > 0) {
		eintr_close--;
		fsync_fd = -1;
		errno = EINTR;
		return -1;
	}
	return rc;
}

int
__wrap_rename(const char *from, const char *to)
{
	if (eintr_rename > 0) {
		eintr_rename--;
		errno = EINTR;
		return -1;
	}
	return __real_rename(from, to);
}

int
__wrap_fchmod(int fd, mode_t mode)
{
	if (fchmod_errno != 0) {
		errno = fchmod_errno;
		fchmod_errno = 0;
		return -1;
	}
	return __real_fchmod(fd, mode);
}

/* The largest write(2) asked of write_watch_fd since it was set (-1: none
 * watched). */
static int write_watch_fd = -1;
static size_t write_largest;

ssize_t
__wrap_write(int fd, const void *buf, size_t n)
{
	if (fd == write_watch_fd && n > write_largest)
		write_largest = n;
	return __real_write(fd, buf, n);
}

/* ---- helpers ---- */

/* Reads a whole file into a malloc'd buffer. */
static uint8_t *
slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	rewind(f);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static char *
join(const char *dir, const char *name)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

/* Checks that two models hold the same tensors (names, dtypes, shapes, every
 * byte) and the same metadata. */
static void
assert_same_model(const wc_model *a, const wc_model *b)
{
	const char *ka, *va, *kb, *vb;
	size_t i;

	assert_int_equal(wc_model_count(a), wc_model_count(b));
	for (i = 0; i < wc_model_count(a); i++) {
		wc_tensor x, y;

		assert_int_equal(wc_model_tensor(a, i, &x), 0);
		assert_int_equal(wc_model_tensor(b, i, &y), 0);
		assert_string_equal(x.name, y.name);
		assert_string_equal(x.dtype, y.dtype);
		assert_int_equal(x.ndim, y.ndim);
		for (uint32_t d = 0; d < x.ndim; d++)
			assert_int_equal(x.shape[d], y.shape[d]);
		assert_int_equal(x.nbytes, y.nbytes);
		if (x.nbytes > 0)
			assert_memory_equal(x.data, y.data, x.nbytes);
	}
	for (i = 0; wc_model_metadata_at(a, i, &ka, &va) == 0; i++) {
		assert_int_equal(wc_model_metadata_at(b, i, &kb, &vb), 0);
		assert_string_equal(ka, kb);
		assert_string_equal(va, vb);
	}
	assert_int_equal(wc_model_metadata_at(b, i, &kb, &vb), -ERANGE);
}

/* Validates a WEIG file with the reader and checks the writer's alignment
 * promises: data region at a multiple of 4096, each tensor at 64. */
static void
assert_weig_layout(const char *path)
{
	struct model_source s;
	struct index_header h;
	struct index_tensor t;
	uint64_t data_offset;

	assert_int_equal(source_open(path, &s), 0);
	memcpy(&data_offset, s.files[0].base + 24, 8);
	data_offset = le64toh(data_offset);
	assert_int_equal(data_offset % 4096, 0);
	assert_int_equal(index_open(s.index, s.index_len, &h), 0);
	for (uint64_t i = 0; i < h.tensor_count; i++) {
		assert_int_equal(index_tensor_at(s.index, &h, i, &t), 0);
		assert_int_equal(t.offset % 64, 0);
		assert_true(t.offset >= data_offset);
	}
	/* The trailer. */
	assert_memory_equal(s.files[0].base + s.files[0].size - 16, "WEIGTAIL", 8);
	source_close(&s);
}

/* The safetensors test model: dtypes of every size, a scalar, an empty
 * tensor, a sub-byte type, names that need escaping, listed unsorted. */
static const char st_header[] =
	"{\"z.last\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
	"\"__metadata__\":{\"format\":\"pt\",\"quote\":\"a\\\"b\\\\c\\n\",\"uni\":\"\xc3\xa9\"},"
	"\"a.first\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
	"\"m.scalar\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[22,30]},"
	"\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[30,30]},"
	"\"c64\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[30,38]},"
	"\"f4\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[38,40]},"
	"\"q\\\"uote\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[40,41]},"
	"\"\xc3\xa9\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[41,43]}}";

/* ---- round trips ---- */

static void
test_roundtrip(void **state)
{
	char *dir = tu_tmpdir(), *in, *weig, *st, *st2;
	wc_model *m0 = NULL, *m1 = NULL, *m2 = NULL, *m3 = NULL;
	uint8_t *img, *a, *b;
	size_t len, alen, blen;
	uint64_t hlen;
	int fds = tu_count_fds();

	img = tu_safetensors(st_header, 43, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	weig = join(dir, "out.weig");
	st = join(dir, "back.safetensors");
	st2 = join(dir, "again.safetensors");
	if (wc_open_file(in, &m0) != 0)
		fail_msg("%s", wc_errmsg());
	assert_int_equal(wc_model_count(m0), 8);

	/* safetensors -> WEIG */
	if (writer_weig(m0, weig) != 0)
		fail_msg("%s", wc_errmsg());
	assert_weig_layout(weig);
	assert_int_equal(wc_open_file(weig, &m1), 0);
	assert_same_model(m0, m1);
	assert_string_equal(wc_model_metadata(m1, "quote"), "a\"b\\c\n");

	/* WEIG -> safetensors */
	if (writer_safetensors(m1, st) != 0)
		fail_msg("%s", wc_errmsg());
	assert_int_equal(wc_open_file(st, &m2), 0);
	assert_same_model(m0, m2);

	/* The header: __metadata__ first, padded with spaces to 8 bytes, data
	 * in upstream's order: by dtype, widest first, then by name ("m.scalar",
	 * the only I64, first; "f4", the only F4, last), each tensor at a
	 * multiple of its element size in the file. */
	a = slurp(st, &alen);
	memcpy(&hlen, a, 8);
	hlen = le64toh(hlen);
	assert_int_equal(hlen % 8, 0);
	assert_true(8 + hlen <= alen);
	assert_memory_equal(a + 8, "{\"__metadata__\":{\"format\":\"pt\",", 31);
	assert_true(a[8 + hlen - 1] == ' ' || a[8 + hlen - 1] == '}');
	assert_int_equal(alen, 8 + hlen + 43);
	{
		const uint8_t *prev = NULL;
		wc_tensor t;

		static const char *const file_order[] = { "m.scalar", "c64", "empty", "z.last",
			"a.first", "\xc3\xa9", "q\"uote", "f4" };
		static const unsigned element_size[] = { 8, 8, 4, 4, 2, 1, 1, 1 };
		const uint8_t *base = NULL;

		for (size_t i = 0; i < 8; i++) {
			assert_int_equal(wc_model_find(m2, file_order[i], &t), 0);
			if (i == 0)
				base = (const uint8_t *)t.data - 8 - hlen;
			if (t.nbytes == 0) /* "empty": no data to place */
				continue;
			assert_true(prev == NULL || (const uint8_t *)t.data >= prev);
			assert_int_equal(((const uint8_t *)t.data - base) % element_size[i], 0);
			prev = t.data;
		}
		assert_int_equal(wc_model_find(m2, "m.scalar", &t), 0);
		assert_memory_equal(t.data, a + 8 + hlen, t.nbytes); /* first in the data */
		assert_int_equal(wc_model_find(m2, "f4", &t), 0);
		assert_ptr_equal((const uint8_t *)t.data + t.nbytes, base + alen); /* last */
	}

	/* Writing the same model again gives the same bytes. */
	assert_int_equal(writer_safetensors(m2, st2), 0);
	assert_int_equal(wc_open_file(st2, &m3), 0);
	b = slurp(st2, &blen);
	assert_int_equal(alen, blen);
	assert_memory_equal(a, b, alen);

	/* A new output file gets 0666 minus the umask, as open(O_CREAT) gives. */
	{
		struct stat sb;
		mode_t mask = umask(022);

		umask(mask);
		assert_int_equal(stat(weig, &sb), 0);
		assert_int_equal(sb.st_mode & 07777, 0666 & ~mask);
	}
	/* Only the four files, no temporaries. */
	assert_int_equal(tu_count_entries(dir), 4);

	wc_release(m0);
	wc_release(m1);
	wc_release(m2);
	wc_release(m3);
	assert_int_equal(tu_count_fds(), fds);
	free(a);
	free(b);
	free(img);
	free(in);
	free(weig);
	free(st);
	free(st2);
	tu_rmtree(dir);
}

static void
test_roundtrip_no_metadata(void **state)
{
	static const char hdr[] =
		"{\"w\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]}}";
	char *dir = tu_tmpdir(), *in, *weig, *st;
	wc_model *m0 = NULL, *m1 = NULL;
	uint8_t *img, *a;
	size_t len, alen;
	uint64_t flags;

	img = tu_safetensors(hdr, 10, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	weig = join(dir, "out.weig");
	st = join(dir, "back.safetensors");
	assert_int_equal(wc_open_file(in, &m0), 0);
	assert_int_equal(writer_weig(m0, weig), 0);
	a = slurp(weig, &alen);
	memcpy(&flags, a + 40, 8);
	assert_int_equal(flags, 0); /* no metadata flag, reserved 0 */
	free(a);
	assert_int_equal(wc_open_file(weig, &m1), 0);
	assert_int_equal(writer_safetensors(m1, st), 0);
	a = slurp(st, &alen);
	assert_null(memmem(a, alen, "__metadata__", 12));
	assert_memory_equal(a + 8,
		"{\"w\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]}}", 54);
	assert_memory_equal(a + alen - 10, img + len - 10, 10);
	free(a);
	wc_release(m0);
	wc_release(m1);
	free(img);
	free(in);
	free(weig);
	free(st);
	tu_rmtree(dir);
}

/* An empty model survives both ways. */
static void
test_roundtrip_empty(void **state)
{
	char *dir = tu_tmpdir(), *in, *weig, *st;
	wc_model *m0 = NULL, *m1 = NULL, *m2 = NULL;
	uint8_t *img;
	size_t len;

	img = tu_safetensors("{\"__metadata__\":{\"k\":\"v\"}}", 0, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	weig = join(dir, "out.weig");
	st = join(dir, "back.safetensors");
	assert_int_equal(wc_open_file(in, &m0), 0);
	assert_int_equal(writer_weig(m0, weig), 0);
	assert_int_equal(wc_open_file(weig, &m1), 0);
	assert_int_equal(writer_safetensors(m1, st), 0);
	assert_int_equal(wc_open_file(st, &m2), 0);
	assert_int_equal(wc_model_count(m2), 0);
	assert_string_equal(wc_model_metadata(m2, "k"), "v");
	wc_release(m0);
	wc_release(m1);
	wc_release(m2);
	free(img);
	free(in);
	free(weig);
	free(st);
	tu_rmtree(dir);
}

/* ---- big-endian WEIG ---- */

struct be_tensor {
	const char *name;
	uint32_t dtype;
	uint32_t ndim;
	uint64_t shape[2];
	uint64_t nbytes;
	const uint8_t *data; /* in the file's byte order */
};

/*
 * Writes a WEIG image (layout as in proto/FORMAT.md) in either byte order,
 * with the given data bytes. Tensors must be sorted by name.
 */
static uint8_t *
make_weig(const struct be_tensor *t, size_t n, const char *const *meta, size_t nmeta, int be,
	size_t *len)
{
	uint64_t off = 64 + 48 * n + 16 * nmeta, data, cur, size;
	uint64_t shape_off[16] = { 0 }, name_off[16] = { 0 }, data_off[16] = { 0 };
	uint64_t key_off[8] = { 0 }, value_off[8] = { 0 };
	uint8_t *buf;

#define PUT64(p, v)                                                          \
	do {                                                                 \
		uint64_t v_ = be ? htobe64(v) : htole64(v);                  \
		memcpy(buf + (p), &v_, 8);                                   \
	} while (0)
#define PUT32(p, v)                                                          \
	do {                                                                 \
		uint32_t v_ = be ? htobe32(v) : htole32(v);                  \
		memcpy(buf + (p), &v_, 4);                                   \
	} while (0)
	assert_true(n <= 16 && nmeta <= 8);
	for (size_t i = 0; i < n; i++) {
		shape_off[i] = off;
		off += 8 * (uint64_t)t[i].ndim;
	}
	for (size_t i = 0; i < n; i++) {
		name_off[i] = off;
		off += strlen(t[i].name) + 1;
	}
	for (size_t i = 0; i < nmeta; i++) {
		key_off[i] = off;
		off += strlen(meta[2 * i]) + 1;
		value_off[i] = off;
		off += strlen(meta[2 * i + 1]) + 1;
	}
	data = (off + 4095) / 4096 * 4096;
	cur = data;
	for (size_t i = 0; i < n; i++) {
		cur = (cur + 63) / 64 * 64;
		data_off[i] = cur;
		cur += t[i].nbytes;
	}
	size = (cur + 7) / 8 * 8 + 16;
	buf = calloc(1, size);
	assert_non_null(buf);
	PUT32(0, WEIG_MAGIC);
	PUT32(4, 1);
	PUT64(8, n);
	PUT64(16, 64);
	PUT64(24, data);
	PUT64(32, size);
	if (nmeta > 0) {
		PUT64(40, 1);
		PUT64(48, 64 + 48 * n);
		PUT64(56, nmeta);
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t r = 64 + 48 * i;

		PUT64(r, name_off[i]);
		PUT32(r + 8, t[i].dtype);
		PUT64(r + 16, shape_off[i]);
		PUT64(r + 24, t[i].ndim);
		PUT64(r + 32, data_off[i]);
		PUT64(r + 40, t[i].nbytes);
		for (uint32_t d = 0; d < t[i].ndim; d++)
			PUT64(shape_off[i] + 8 * (uint64_t)d, t[i].shape[d]);
		memcpy(buf + name_off[i], t[i].name, strlen(t[i].name) + 1);
		memcpy(buf + data_off[i], t[i].data, t[i].nbytes);
	}
	for (size_t i = 0; i < nmeta; i++) {
		PUT64(64 + 48 * n + 16 * i, key_off[i]);
		PUT64(64 + 48 * n + 16 * i + 8, value_off[i]);
		memcpy(buf + key_off[i], meta[2 * i], strlen(meta[2 * i]) + 1);
		memcpy(buf + value_off[i], meta[2 * i + 1], strlen(meta[2 * i + 1]) + 1);
	}
	/* The trailer: the magic's 8 bytes (no NUL), then the file's size. */
	memcpy(buf + size - WEIG_TRAILER_SIZE, WEIG_TRAILER_MAGIC, sizeof(uint64_t));
	PUT64(size - 8, size);
#undef PUT64
#undef PUT32
	*len = size;
	return buf;
}

/* Big-endian bytes of known values, and what they must become. */
static const uint8_t be_bf16[] = { 0x3f, 0x80, 0xc0, 0x00 };              /* 1.0, -2.0 */
static const uint8_t be_c64[] = { 0x3f, 0xc0, 0, 0, 0xc0, 0, 0, 0 };      /* 1.5 - 2i */
static const uint8_t be_f64[] = { 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18 }; /* pi */
static const uint8_t be_f4[] = { 0x12, 0x34 };
static const uint8_t be_i8[] = { 1, 0xfe, 3 };
static const uint8_t be_u16[] = { 0x01, 0x02, 0xa0, 0xb0 };
static const uint8_t be_u64[] = { 1, 2, 3, 4, 5, 6, 7, 8 };
static const uint8_t be_bool[] = { 1, 0, 1 };

/* A large F32 tensor (more than the writer's 1 MiB buffer, and not a
 * multiple of it) with element i = i in big-endian. */
#define BIG_COUNT ((3u << 18) + 3u)

static uint8_t *
big_f32(void)
{
	uint8_t *p = malloc(4 * (size_t)BIG_COUNT);

	assert_non_null(p);
	for (uint32_t i = 0; i < BIG_COUNT; i++) {
		uint32_t v = htobe32(i);

		memcpy(p + 4 * (size_t)i, &v, 4);
	}
	return p;
}

/* Checks the converted values through the library. */
static void
check_swapped(const wc_model *m)
{
	wc_tensor t;
	uint16_t u16[2];
	uint32_t u32[2];
	uint64_t u64;
	double pi;

	assert_int_equal(wc_model_find(m, "bf16", &t), 0);
	memcpy(u16, t.data, 4);
	assert_int_equal(u16[0], 0x3f80);
	assert_int_equal(u16[1], 0xc000);
	assert_int_equal(wc_model_find(m, "c64", &t), 0);
	assert_string_equal(t.dtype, "C64");
	memcpy(u32, t.data, 8);
	assert_int_equal(u32[0], 0x3fc00000); /* each half swapped on its own */
	assert_int_equal(u32[1], 0xc0000000);
	assert_int_equal(wc_model_find(m, "f64", &t), 0);
	memcpy(&pi, t.data, 8);
	assert_true(pi > 3.14159 && pi < 3.1416);
	assert_int_equal(wc_model_find(m, "f4", &t), 0);
	assert_memory_equal(t.data, be_f4, 2);
	assert_int_equal(wc_model_find(m, "i8", &t), 0);
	assert_memory_equal(t.data, be_i8, 3);
	assert_int_equal(wc_model_find(m, "bool", &t), 0);
	assert_memory_equal(t.data, be_bool, 3);
	assert_int_equal(wc_model_find(m, "u16", &t), 0);
	memcpy(u16, t.data, 4);
	assert_int_equal(u16[0], 0x0102);
	assert_int_equal(u16[1], 0xa0b0);
	assert_int_equal(wc_model_find(m, "u64", &t), 0);
	memcpy(&u64, t.data, 8);
	assert_int_equal(u64, 0x0102030405060708ull);
	assert_int_equal(wc_model_find(m, "w.big", &t), 0);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 1);
	assert_int_equal(t.shape[1], BIG_COUNT);
	for (uint32_t i = 0; i < BIG_COUNT; i += 4097) {
		uint32_t v;

		memcpy(&v, (const uint8_t *)t.data + 4 * (size_t)i, 4);
		assert_int_equal(v, i);
	}
	memcpy(u32, (const uint8_t *)t.data + 4 * (size_t)(BIG_COUNT - 1), 4);
	assert_int_equal(u32[0], BIG_COUNT - 1);
	assert_string_equal(wc_model_metadata(m, "endian"), "big");
}

static void
test_big_endian(void **state)
{
	uint8_t *big = big_f32();
	const struct be_tensor t[] = {
		{ "bf16", 2, 1, { 2 }, 4, be_bf16 },
		{ "bool", 12, 1, { 3 }, 3, be_bool },
		{ "c64", 21, 1, { 1 }, 8, be_c64 },
		{ "f4", 18, 1, { 4 }, 2, be_f4 },
		{ "f64", 6, 0, { 0 }, 8, be_f64 },
		{ "i8", 3, 1, { 3 }, 3, be_i8 },
		{ "u16", 11, 1, { 2 }, 4, be_u16 },
		{ "u64", 8, 1, { 1 }, 8, be_u64 },
		{ "u8.odd", 4, 1, { 1 }, 1, be_i8 }, /* puts w.big at an odd offset */
		{ "w.big", 0, 2, { 1, BIG_COUNT }, 4 * (uint64_t)BIG_COUNT, big },
	};
	static const char *const meta[] = { "endian", "big" };
	char *dir = tu_tmpdir(), *in, *weig, *st;
	wc_model *m = NULL, *m2 = NULL;
	uint8_t *img;
	size_t len;
	int fds = tu_count_fds();

	img = make_weig(t, 10, meta, 1, 1, &len);
	in = tu_write(dir, "be.weig", img, len);
	weig = join(dir, "le.weig");
	st = join(dir, "le.safetensors");

	/* The library refuses it... */
	assert_int_equal(wc_open_file(in, &m), -EPROTO);
	assert_non_null(strstr(wc_errmsg(), "big-endian"));

	/* ...the converter makes a little-endian copy. */
	if (writer_from_big_endian(in, WRITER_WEIG, weig) != 0)
		fail_msg("%s", wc_errmsg());
	assert_weig_layout(weig);
	assert_int_equal(wc_open_file(weig, &m), 0);
	check_swapped(m);

	/* And straight to safetensors. */
	assert_int_equal(writer_from_big_endian(in, WRITER_SAFETENSORS, st), 0);
	assert_int_equal(wc_open_file(st, &m2), 0);
	check_swapped(m2);
	assert_same_model(m, m2);
	wc_release(m);
	wc_release(m2);

	/* The same image little-endian (data still big-endian bytes) is not
	 * big-endian: the converter says so and writes nothing. */
	free(img);
	img = make_weig(t, 10, meta, 1, 0, &len);
	free(in);
	in = tu_write(dir, "le-in.weig", img, len);
	free(weig);
	weig = join(dir, "nothing.weig");
	assert_int_equal(writer_from_big_endian(in, WRITER_WEIG, weig), -EPROTO);
	assert_non_null(strstr(wc_errmsg(), "little-endian"));
	assert_int_equal(access(weig, F_OK), -1);
	assert_int_equal(tu_count_entries(dir), 4);
	assert_int_equal(tu_count_fds(), fds);

	free(big);
	free(img);
	free(in);
	free(weig);
	free(st);
	tu_rmtree(dir);
}

static void
test_swap_helpers(void **state)
{
	uint8_t buf[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 }, out[16];
	static const uint8_t s2[] = { 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15 };
	static const uint8_t s4[] = { 4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13 };
	static const uint8_t s8[] = { 8, 7, 6, 5, 4, 3, 2, 1, 16, 15, 14, 13, 12, 11, 10, 9 };

	writer_swap_elements(out, buf, 16, 2);
	assert_memory_equal(out, s2, 16);
	writer_swap_elements(out, buf, 16, 4);
	assert_memory_equal(out, s4, 16);
	writer_swap_elements(out, buf, 16, 8);
	assert_memory_equal(out, s8, 16);
	writer_swap_elements(out, buf, 16, 1);
	assert_memory_equal(out, buf, 16);
	writer_swap_elements(buf, buf, 16, 8); /* in place */
	assert_memory_equal(buf, s8, 16);

	assert_int_equal(writer_swap_size(0), 4);  /* F32 */
	assert_int_equal(writer_swap_size(1), 2);  /* F16 */
	assert_int_equal(writer_swap_size(2), 2);  /* BF16 */
	assert_int_equal(writer_swap_size(3), 1);  /* I8 */
	assert_int_equal(writer_swap_size(6), 8);  /* F64 */
	assert_int_equal(writer_swap_size(12), 1); /* BOOL */
	assert_int_equal(writer_swap_size(13), 1); /* F8_E4M3 */
	assert_int_equal(writer_swap_size(18), 1); /* F4 */
	assert_int_equal(writer_swap_size(20), 1); /* F6_E3M2 */
	assert_int_equal(writer_swap_size(21), 4); /* C64: two F32 */
	assert_int_equal(writer_swap_size(22), 0); /* unknown */
}

/* A WEIG tensor called "__metadata__" cannot become safetensors. */
static void
test_reserved_name(void **state)
{
	static const uint8_t one[4] = { 0 };
	const struct be_tensor t[] = { { "__metadata__", 0, 1, { 1 }, 4, one } };
	char *dir = tu_tmpdir(), *in, *st;
	wc_model *m = NULL;
	uint8_t *img;
	size_t len;

	img = make_weig(t, 1, NULL, 0, 0, &len);
	in = tu_write(dir, "in.weig", img, len);
	st = join(dir, "out.safetensors");
	assert_int_equal(wc_open_file(in, &m), 0);
	assert_int_equal(writer_safetensors(m, st), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), st));
	assert_non_null(strstr(wc_errmsg(), "reserved"));
	assert_int_equal(tu_count_entries(dir), 1);
	wc_release(m);
	free(img);
	free(in);
	free(st);
	tu_rmtree(dir);
}

/* ---- never a partial output ---- */

/* The data bytes of a one-tensor U8 safetensors file at path. */
static uint8_t
first_byte_of_data(const char *path)
{
	wc_model *m = NULL;
	wc_tensor t;
	uint8_t b;

	assert_int_equal(wc_open_file(path, &m), 0);
	assert_int_equal(wc_model_tensor(m, 0, &t), 0);
	b = *(const uint8_t *)t.data;
	wc_release(m);
	return b;
}

/*
 * Replacing a file keeps what a write in place (upstream's File::create)
 * keeps: a 0600 file stays 0600 (it became 0644), its owner stays (as
 * root), and a symlink stays a symlink whose target gets the new bytes
 * (it was replaced by a regular file), also a link to a file not there yet.
 */
static void
test_replace_keeps_mode_owner_and_symlink(void **state)
{
	static const char hdr[] = "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
	char *dir = tu_tmpdir(), *in, *secret, *blobs, *snap, *blob, *link, *dangling, *made;
	wc_model *m = NULL;
	uint8_t *img;
	size_t len;
	struct stat sb;
	int fds = tu_count_fds();

	(void)state;
	img = tu_safetensors(hdr, 4, &len);
	memset(img + len - 4, 7, 4);
	in = tu_write(dir, "in.safetensors", img, len);
	assert_int_equal(wc_open_file(in, &m), 0);

	secret = tu_write(dir, "secret.safetensors", "old", 3);
	assert_int_equal(chmod(secret, 0600), 0);
	if (geteuid() == 0)
		assert_int_equal(chown(secret, 4321, 4321), 0);
	assert_int_equal(writer_safetensors(m, secret), 0);
	assert_int_equal(stat(secret, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0600);
	if (geteuid() == 0) {
		assert_int_equal(sb.st_uid, 4321);
		assert_int_equal(sb.st_gid, 4321);
	}
	assert_int_equal(first_byte_of_data(secret), 7);
	/* A directory in the way fails before anything is written. */
	{
		char *sub = join(dir, "subdir");
		int before = tu_count_entries(dir);

		assert_int_equal(mkdir(sub, 0755), 0);
		assert_int_equal(writer_safetensors(m, sub), -EISDIR);
		assert_non_null(strstr(error_get(), "subdir: Is a directory"));
		assert_int_equal(tu_count_entries(dir), before + 1);
		assert_int_equal(rmdir(sub), 0);
		free(sub);
	}
	/* Set-id bits go, as a write in place would clear them. */
	assert_int_equal(chmod(secret, 06750), 0);
	assert_int_equal(writer_safetensors(m, secret), 0);
	assert_int_equal(stat(secret, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0750);

	blobs = join(dir, "blobs");
	snap = join(dir, "snapshots");
	assert_int_equal(mkdir(blobs, 0755), 0);
	assert_int_equal(mkdir(snap, 0755), 0);
	blob = tu_write(blobs, "abc", "old", 3);
	assert_int_equal(chmod(blob, 0640), 0);
	link = join(snap, "model.safetensors");
	assert_int_equal(symlink("../blobs/abc", link), 0);
	assert_int_equal(writer_safetensors(m, link), 0);
	assert_int_equal(lstat(link, &sb), 0);
	assert_true(S_ISLNK(sb.st_mode));
	assert_int_equal(stat(blob, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0640);
	assert_int_equal(first_byte_of_data(blob), 7);

	dangling = join(snap, "new.safetensors");
	made = join(blobs, "def");
	assert_int_equal(symlink("../blobs/def", dangling), 0);
	assert_int_equal(writer_weig(m, dangling), 0);
	assert_int_equal(lstat(dangling, &sb), 0);
	assert_true(S_ISLNK(sb.st_mode));
	assert_weig_layout(made);
	/* No temporary left anywhere. */
	assert_int_equal(tu_count_entries(blobs), 2);
	assert_int_equal(tu_count_entries(snap), 2);
	assert_int_equal(tu_count_entries(dir), 4);

	wc_release(m);
	assert_int_equal(tu_count_fds(), fds);
	free(img);
	free(in);
	free(secret);
	free(blobs);
	free(snap);
	free(blob);
	free(link);
	free(dangling);
	free(made);
	tu_rmtree(dir);
}

static void
test_no_partial_output(void **state)
{
	char *dir = tu_tmpdir(), *in, *out, *bad, *sub, *missing;
	static const char hdr[] =
		"{\"w\":{\"dtype\":\"U8\",\"shape\":[200000],\"data_offsets\":[0,200000]}}";
	struct rlimit old, small;
	void (*old_handler)(int);
	wc_model *m = NULL;
	uint8_t *img, *got;
	size_t len, glen;
	int fds = tu_count_fds(), rc;

	img = tu_safetensors(hdr, 200000, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	out = tu_write(dir, "out.weig", "old", 3);
	assert_int_equal(wc_open_file(in, &m), 0);

	/* The file system refuses more than 64 KiB mid-write (EFBIG): OUT keeps
	 * its old content and the temporary file is gone. */
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	small = old;
	small.rlim_cur = 65536;
	old_handler = signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
	rc = writer_weig(m, out);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, old_handler);
	assert_int_equal(rc, -EFBIG);
	assert_non_null(strstr(wc_errmsg(), out));
	got = slurp(out, &glen);
	assert_int_equal(glen, 3);
	assert_memory_equal(got, "old", 3);
	free(got);
	assert_int_equal(tu_count_entries(dir), 2);

	/* The same for safetensors. */
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
	old_handler = signal(SIGXFSZ, SIG_IGN);
	rc = writer_safetensors(m, out);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, old_handler);
	assert_int_equal(rc, -EFBIG);
	assert_int_equal(tu_count_entries(dir), 2);

	/* The new file cannot be given the mode of the one it replaces: the
	 * message says so and names the call (before, "OUT: Input/output
	 * error", as if OUT could not be written: found by an strace fault
	 * sweep of wcachectl convert), OUT is kept and no temporary left. */
	if (__real_fchmod != NULL) {
		fchmod_errno = EIO;
		assert_int_equal(writer_weig(m, out), -EIO);
		assert_int_equal(fchmod_errno, 0);
		assert_non_null(strstr(wc_errmsg(), out));
		assert_non_null(strstr(wc_errmsg(), "fchmod: Input/output error"));
		got = slurp(out, &glen);
		assert_int_equal(glen, 3);
		free(got);
		assert_int_equal(tu_count_entries(dir), 2);
	}

	/* A directory that does not exist: nothing is created. */
	missing = join(dir, "no/such/dir/out.weig");
	assert_int_equal(writer_weig(m, missing), -ENOENT);
	assert_non_null(strstr(wc_errmsg(), missing));
	assert_non_null(strstr(wc_errmsg(), "temporary file"));

	/* OUT is a directory: the rename fails and the temporary goes. */
	sub = join(dir, "sub");
	assert_int_equal(mkdir(sub, 0755), 0);
	assert_true(writer_weig(m, sub) < 0);
	assert_non_null(strstr(wc_errmsg(), sub));
	assert_int_equal(tu_count_entries(dir), 3);
	assert_int_equal(tu_count_entries(sub), 0);
	free(sub);
	sub = join(dir, "sub/");
	assert_int_equal(writer_weig(m, sub), -EISDIR);

	/* A directory we may not write to (root may write anywhere). */
	if (geteuid() != 0) {
		char *ro = join(dir, "x.weig");

		assert_int_equal(chmod(dir, 0555), 0);
		assert_int_equal(writer_weig(m, ro), -EACCES);
		assert_int_equal(chmod(dir, 0755), 0);
		assert_int_equal(access(ro, F_OK), -1);
		free(ro);
	}

	/* A damaged big-endian input: nothing written. */
	bad = tu_write(dir, "bad.weig", "WEIG\0\0\0\1", 8);
	assert_int_equal(writer_from_big_endian(bad, WRITER_WEIG, out), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), bad));
	got = slurp(out, &glen);
	assert_int_equal(glen, 3);
	free(got);
	assert_int_equal(tu_count_entries(dir), 4);

	wc_release(m);
	assert_int_equal(tu_count_fds(), fds);
	free(img);
	free(in);
	free(out);
	free(bad);
	free(sub);
	free(missing);
	tu_rmtree(dir);
}

/* ---- writing the caller's tensors to a descriptor ---- */

/* Copies what fd holds into dir/name and opens it with the library. */
static wc_model *
open_fd_copy(const char *dir, const char *name, int fd)
{
	struct stat st;
	uint8_t *buf;
	char *path;
	wc_model *m = NULL;

	assert_int_equal(fstat(fd, &st), 0);
	buf = malloc((size_t)st.st_size);
	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
	path = tu_write(dir, name, buf, (size_t)st.st_size);
	if (wc_open_file(path, &m) != 0)
		fail_msg("the written file does not open: %s", wc_errmsg());
	free(buf);
	free(path);
	return m;
}

/*
 * writer_safetensors_fd() writes a valid safetensors file into a memfd:
 * every tensor's bytes (one of them over the 1 MiB buffer, written
 * straight from the caller's memory), sorted names, metadata; the
 * descriptor stays open.
 */
static void
test_safetensors_fd(void **state)
{
	char *dir = tu_tmpdir();
	static const uint64_t big_shape[] = { 3, 1 << 18 }, small_shape[] = { 5 };
	const uint64_t big_n = 3u << 18;
	uint16_t *big = malloc(big_n * 2);
	int8_t small[5] = { -2, -1, 0, 1, 2 };
	const char *meta[] = { "quant", "int8-rowwise", "format", "pt" };
	wc_tensor t[3], got;
	wc_model *m;
	int fd, fds = tu_count_fds();

	(void)state;
	assert_non_null(big);
	for (uint64_t i = 0; i < big_n; i++)
		big[i] = (uint16_t)(i * 31);
	t[0] = (wc_tensor){ "z.big", "BF16", 2, big_shape, big, big_n * 2 };
	t[1] = (wc_tensor){ "a.small", "I8", 1, small_shape, small, sizeof(small) };
	t[2] = (wc_tensor){ "m.scalar", "F32", 0, NULL, "\0\0\x80\x3f", 4 };
	fd = memfd_create("wctest-artifact", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(writer_safetensors_fd(t, 3, meta, 2, fd, "artifact"), 0);
	assert_int_equal(fcntl(fd, F_GETFD), FD_CLOEXEC); /* still open, the caller's */

	m = open_fd_copy(dir, "out.safetensors", fd);
	assert_int_equal(wc_model_count(m), 3);
	assert_int_equal(wc_model_tensor(m, 0, &got), 0);
	assert_string_equal(got.name, "a.small");
	assert_string_equal(got.dtype, "I8");
	assert_memory_equal(got.data, small, sizeof(small));
	assert_int_equal(wc_model_find(m, "z.big", &got), 0);
	assert_string_equal(got.dtype, "BF16");
	assert_int_equal(got.ndim, 2);
	assert_int_equal(got.shape[1], 1 << 18);
	assert_int_equal(got.nbytes, big_n * 2);
	assert_memory_equal(got.data, big, big_n * 2);
	assert_int_equal(wc_model_find(m, "m.scalar", &got), 0);
	assert_int_equal(got.ndim, 0);
	assert_memory_equal(got.data, "\0\0\x80\x3f", 4);
	/* Upstream's order, by dtype then name: the F32 first, then the BF16,
	 * the I8 last, so that every tensor is aligned to its element size in
	 * the mapping a worker gets (review rev113 #3: in name order the F32 sat
	 * at data offset 5). */
	assert_int_equal((uintptr_t)got.data % 4, 0);
	{
		wc_tensor z;

		assert_int_equal(wc_model_find(m, "z.big", &z), 0);
		assert_ptr_equal(z.data, (const uint8_t *)got.data + 4);
		assert_int_equal(wc_model_find(m, "a.small", &z), 0);
		assert_ptr_equal(z.data, (const uint8_t *)got.data + 4 + big_n * 2);
	}
	assert_string_equal(wc_model_metadata(m, "quant"), "int8-rowwise");
	assert_string_equal(wc_model_metadata(m, "format"), "pt");
	wc_release(m);
	close(fd);

	/* No tensors at all is a valid (empty) file too. */
	fd = memfd_create("wctest-artifact", MFD_CLOEXEC);
	assert_int_equal(writer_safetensors_fd(NULL, 0, NULL, 0, fd, "artifact"), 0);
	m = open_fd_copy(dir, "empty.safetensors", fd);
	assert_int_equal(wc_model_count(m), 0);
	wc_release(m);
	close(fd);

	free(big);
	assert_int_equal(tu_count_fds(), fds);
	tu_rmtree(dir);
}

/* Tensors a reader would refuse are refused before anything is written,
 * naming the output and the tensor; a failing write names the output. */
static void
test_safetensors_fd_refuses(void **state)
{
	static const uint64_t shape[] = { 2, 2 };
	float d[4] = { 0 };
	const char *meta_null[] = { "k", NULL };
	wc_tensor t[2];
	struct stat st;
	int fd = memfd_create("wctest-artifact", MFD_CLOEXEC), ro, fds;
	char *dir = tu_tmpdir(), *path;

	(void)state;
	fds = tu_count_fds();
	t[0] = (wc_tensor){ "w", "F32", 2, shape, d, 12 };
	assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), "out: tensor \"w\": 12 bytes"));
	t[0] = (wc_tensor){ "w", "F33", 2, shape, d, 16 };
	assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), "unknown dtype"));
	t[0] = (wc_tensor){ "w", "F32", 2, NULL, d, 16 };
	assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
	t[0] = (wc_tensor){ "w", "F32", 2, shape, NULL, 16 };
	assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), "no data"));
	t[0] = (wc_tensor){ NULL, "F32", 2, shape, d, 16 };
	assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
	t[0] = (wc_tensor){ "w", "F32", 2, shape, d, 16 };
	t[1] = t[0];
	assert_int_equal(writer_safetensors_fd(t, 2, NULL, 0, fd, "out"), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), "duplicate"));
	t[1].name = "__metadata__";
	assert_int_equal(writer_safetensors_fd(t, 2, NULL, 0, fd, "out"), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), "reserved"));
	assert_int_equal(writer_safetensors_fd(t, 1, meta_null, 1, fd, "out"), -EINVAL);
	assert_non_null(strstr(wc_errmsg(), "metadata pair 0"));
	/* Names the reader refuses, refused before anything is written (review
	 * rev113 #14: the whole artifact was built, then its publication
	 * refused): empty, over 4096 bytes, not UTF-8; and metadata that is not
	 * UTF-8. A name of exactly 4096 bytes is fine. */
	{
		char *long_name = malloc(4098);
		const char *meta_bad[] = { "k", "v\xff" };

		assert_non_null(long_name);
		memset(long_name, 'n', 4097);
		long_name[4097] = '\0';
		t[0] = (wc_tensor){ "", "F32", 2, shape, d, 16 };
		assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
		assert_non_null(strstr(wc_errmsg(), "out: tensor 0 has an empty name"));
		t[0].name = long_name;
		assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
		assert_non_null(strstr(wc_errmsg(), "name of 4097 bytes is longer than 4096"));
		t[0].name = "w\xc3";
		assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), -EINVAL);
		assert_non_null(strstr(wc_errmsg(), "name is not valid UTF-8"));
		t[0].name = "w";
		assert_int_equal(writer_safetensors_fd(t, 1, meta_bad, 1, fd, "out"), -EINVAL);
		assert_non_null(strstr(wc_errmsg(), "metadata key \"k\": the key or its value"));
		assert_int_equal(fstat(fd, &st), 0);
		assert_int_equal(st.st_size, 0);
		long_name[4096] = '\0';
		t[0].name = long_name;
		assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, fd, "out"), 0);
		assert_int_equal(ftruncate(fd, 0), 0);
		assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
		free(long_name);
		t[0] = (wc_tensor){ "w", "F32", 2, shape, d, 16 };
	}
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, 0); /* nothing was written */

	/* A descriptor open for reading only: the write fails, named. */
	path = tu_write(dir, "ro", "", 0);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(ro >= 0);
	assert_int_equal(writer_safetensors_fd(t, 1, NULL, 0, ro, "out"), -EBADF);
	assert_non_null(strstr(wc_errmsg(), "out: write"));
	close(ro);
	free(path);
	assert_int_equal(tu_count_fds(), fds);
	close(fd);
	tu_rmtree(dir);
}

/*
 * An output path that is a FIFO (or a device: /dev/null, a terminal) is
 * written into, as a shell's redirection would: before, a temporary file
 * beside it was renamed over it, which replaced the FIFO with a regular
 * file (and, as root, /dev/null with one: devtmpfs lets root create files).
 * The bytes that go through are those of a converted regular file.
 */
/* A block far past the buffer goes out in write(2)s of 64 MiB at most, so
 * that wcachectl convert's progress (the write counter of /proc/self/io,
 * which moves when a write returns) moves during it: 1 GiB writes left it
 * at 0% for the first GiB. All of the block arrives, in order. */
static void
test_big_block_in_bounded_writes(void **state)
{
	const size_t size = 130 * MiB + 3, step = 4096;
	uint8_t *block;
	struct outfile o;
	struct stat st;
	char *dir = tu_tmpdir(), *path = join(dir, "out");
	int fd;

	(void)state;
	if (__real_write == NULL)
		skip();
	block = malloc(size);
	assert_non_null(block);
	for (size_t i = 0; i < size; i += step)
		block[i] = (uint8_t)(i / step);
	block[size - 1] = 0xa5;
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(outfile_begin_fd(fd, path, &o), 0);
	assert_int_equal(outfile_put(&o, "x", 1), 0);
	write_watch_fd = fd;
	write_largest = 0;
	assert_int_equal(outfile_put(&o, block, size), 0);
	assert_int_equal(outfile_flush(&o), 0);
	write_watch_fd = -1;
	outfile_abort(&o);
	assert_true(write_largest > 0);
	if (write_largest > 64 * MiB)
		fail_msg("one write(2) of %zu bytes (64 MiB at most)", write_largest);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, size + 1);
	for (size_t i = 0; i < size; i += 64 * step) {
		uint8_t b;

		assert_int_equal(pread(fd, &b, 1, (off_t)(i + 1)), 1);
		assert_int_equal(b, block[i]);
	}
	close(fd);
	free(block);
	free(path);
	tu_rmtree(dir);
}

static void
test_output_that_is_not_a_regular_file(void **state)
{
	static const char hdr[] =
		"{\"w\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]}}";
	char *dir = tu_tmpdir(), *in, *fifo, *file, *link;
	uint8_t *img, *want, got[4096];
	size_t len, wlen, glen = 0;
	wc_model *m = NULL;
	struct stat st;
	ssize_t n;
	int rd;

	(void)state;
	img = tu_safetensors(hdr, 10, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	fifo = join(dir, "out.fifo");
	file = join(dir, "out.safetensors");
	link = join(dir, "link.safetensors");
	assert_int_equal(wc_open_file(in, &m), 0);
	assert_int_equal(writer_safetensors(m, file), 0);
	want = slurp(file, &wlen);
	assert_true(wlen < sizeof(got)); /* fits the pipe: the writer never waits */

	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_int_equal(symlink("out.fifo", link), 0);
	for (int i = 0; i < 2; i++) {
		/* A reader first, so that the writer's open does not wait. */
		rd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		assert_true(rd >= 0);
		assert_int_equal(writer_safetensors(m, i == 0 ? fifo : link), 0);
		glen = 0;
		while ((n = read(rd, got + glen, sizeof(got) - glen)) > 0)
			glen += (size_t)n;
		close(rd);
		assert_int_equal(lstat(fifo, &st), 0);
		assert_true(S_ISFIFO(st.st_mode));
		assert_int_equal(glen, wlen);
		assert_memory_equal(got, want, wlen);
	}
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));

	/* A pipe by its /proc/self/fd link, as /dev/stdout is one. */
	{
		char proc[64];
		int p[2];

		assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", p[1]);
		assert_int_equal(writer_safetensors(m, proc), 0);
		close(p[1]);
		glen = 0;
		while ((n = read(p[0], got + glen, sizeof(got) - glen)) > 0)
			glen += (size_t)n;
		close(p[0]);
		assert_int_equal(glen, wlen);
		assert_memory_equal(got, want, wlen);
	}

	wc_release(m);
	free(want);
	free(img);
	free(in);
	free(fifo);
	free(file);
	free(link);
	tu_rmtree(dir);
}

/* What test_check_before_commit's check saw and does. */
struct check_probe {
	const char *dir;
	int calls;
	int entries;        /* in dir when the check ran: the temporary file is there */
	int after_removal;  /* in dir after writer_remove_temporaries() */
	int remove, fail;
};

/* A writer_check_fn: counts, looks at the directory, may remove the
 * temporary as a signal handler would, and may fail. */
static int
probe_check(void *ctx)
{
	struct check_probe *p = ctx;

	p->calls++;
	p->entries = tu_count_entries(p->dir);
	if (p->remove) {
		writer_remove_temporaries();
		p->after_removal = tu_count_entries(p->dir);
	}
	return p->fail ? error_set(-ESTALE, "probe: input changed") : 0;
}

/*
 * writer_model_checked() calls its check once, after the data and before
 * the commit: a failing check leaves OUT as it was and no temporary file;
 * writer_remove_temporaries() (what convert's signal handler calls) finds
 * the temporary of a write in progress, also after many writes have come
 * and gone (their slots are freed), and a finished write leaves it nothing.
 */
static void
test_check_before_commit(void **state)
{
	char *dir = tu_tmpdir(), *in, *out;
	static const char hdr[] =
		"{\"w\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	struct check_probe p = { .dir = dir };
	wc_model *m = NULL;
	uint8_t *img, *got;
	size_t len, glen;

	(void)state;
	img = tu_safetensors(hdr, 3, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	out = tu_write(dir, "out.weig", "old", 3);
	assert_int_equal(wc_open_file(in, &m), 0);

	/* A failing check: OUT untouched, no temporary. */
	p.fail = 1;
	assert_int_equal(writer_model_checked(m, WRITER_WEIG, out, probe_check, &p), -ESTALE);
	assert_int_equal(p.calls, 1);
	assert_int_equal(p.entries, 3); /* in, out and the temporary */
	assert_non_null(strstr(wc_errmsg(), "input changed"));
	got = slurp(out, &glen);
	assert_int_equal(glen, 3);
	assert_memory_equal(got, "old", 3);
	free(got);
	assert_int_equal(tu_count_entries(dir), 2);

	/* A passing one: both formats are written. */
	p.fail = 0;
	assert_int_equal(writer_model_checked(m, WRITER_SAFETENSORS, out, probe_check, &p), 0);
	assert_int_equal(writer_model_checked(m, WRITER_WEIG, out, probe_check, &p), 0);
	assert_int_equal(p.calls, 3);
	assert_int_equal(writer_model_checked(m, (enum writer_format)7, out, NULL, NULL),
		-EINVAL);

	/* Twenty writes free their slots; then a write in progress is found. */
	for (int i = 0; i < 20; i++)
		assert_int_equal(writer_weig(m, out), 0);
	writer_remove_temporaries(); /* nothing in progress: nothing removed */
	assert_int_equal(tu_count_entries(dir), 2);
	p.remove = 1;
	p.fail = 1;
	assert_int_equal(writer_model_checked(m, WRITER_WEIG, out, probe_check, &p), -ESTALE);
	assert_int_equal(p.entries, 3);
	assert_int_equal(p.after_removal, 2);
	assert_int_equal(tu_count_entries(dir), 2);
	wc_release(m);
	assert_int_equal(wc_open_file(out, &m), 0); /* the last complete write */
	wc_release(m);
	free(img);
	free(in);
	free(out);
	tu_rmtree(dir);
}

/*
 * A signal during the commit is no failure: the temporary file's open, its
 * fsync and the rename are tried again, and a close interrupted after the
 * fsync (the descriptor is gone, the data written) is success. Found by an
 * strace fault sweep of wcachectl convert (fsync, close, rename and openat
 * with error=EINTR each failed the conversion: "fsync: Interrupted system
 * call"). OUT is then the whole new file, and no temporary is left.
 */
static void
test_commit_interrupted(void **state)
{
	char *dir = tu_tmpdir(), *in, *out;
	static const char hdr[] =
		"{\"w\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	wc_model *m = NULL, *got = NULL;
	uint8_t *img;
	size_t len;
	int fds = tu_count_fds();

	(void)state;
	if (__real_open == NULL || __real_fsync == NULL || __real_close == NULL ||
		__real_rename == NULL)
		skip();
	img = tu_safetensors(hdr, 3, &len);
	in = tu_write(dir, "in.safetensors", img, len);
	out = tu_write(dir, "out.weig", "old", 3);
	assert_int_equal(wc_open_file(in, &m), 0);
	for (int format = 0; format < 2; format++) {
		eintr_open = 2;
		eintr_fsync = 2;
		eintr_close = 1;
		eintr_rename = 2;
		if (format == 0 && writer_weig(m, out) != 0)
			fail_msg("writer_weig: %s", wc_errmsg());
		if (format == 1 && writer_safetensors(m, out) != 0)
			fail_msg("writer_safetensors: %s", wc_errmsg());
		assert_int_equal(eintr_open + eintr_fsync + eintr_close + eintr_rename, 0);
		assert_int_equal(tu_count_entries(dir), 2);
		assert_int_equal(wc_open_file(out, &got), 0);
		assert_int_equal(wc_model_count(got), 1);
		wc_release(got);
	}
	wc_release(m);
	assert_int_equal(tu_count_fds(), fds);
	free(img);
	free(in);
	free(out);
	tu_rmtree(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_roundtrip_no_metadata),
		cmocka_unit_test(test_roundtrip_empty),
		cmocka_unit_test(test_big_endian),
		cmocka_unit_test(test_swap_helpers),
		cmocka_unit_test(test_reserved_name),
		cmocka_unit_test(test_no_partial_output),
		cmocka_unit_test(test_replace_keeps_mode_owner_and_symlink),
		cmocka_unit_test(test_safetensors_fd),
		cmocka_unit_test(test_safetensors_fd_refuses),
		cmocka_unit_test(test_big_block_in_bounded_writes),
		cmocka_unit_test(test_output_that_is_not_a_regular_file),
		cmocka_unit_test(test_check_before_commit),
		cmocka_unit_test(test_commit_interrupted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
