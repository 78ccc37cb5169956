/*
 * test_shards.c: sharded checkpoints and directory resolution
 * (client/format/shards.c).
 *
 * The shard index parser is tested on documents; shards_open() and
 * source_open() of a directory (shards_find_model()) on real files in a
 * temporary directory, checking what reaches the index and that failures
 * name the shard and the tensor and leak no descriptor.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/fnv.h"
#include "format/index.h"
#include "format/shards.h"
#include "format/source.h"
#include "testutil.h"

#define INDEX_NAME "model.safetensors.index.json"

/* ---- the index document ---- */

static int
parse_doc(const char *doc, struct shard_map *m)
{
	error_set(0, "%s", "");
	return shards_parse_index(INDEX_NAME, doc, strlen(doc), m);
}

static void
assert_msg(const char *want)
{
	const char *msg = error_get();

	if (strstr(msg, want) == NULL)
		fail_msg("message \"%s\" lacks \"%s\"", msg, want);
	if (strchr(msg, '\n') != NULL)
		fail_msg("message \"%s\" is not one line", msg);
}

#define EXPECT(doc, code, want)                                                          \
	do {                                                                             \
		struct shard_map m_ = { 0 };                                             \
		assert_int_equal(parse_doc(doc, &m_), (code));                           \
		assert_null(m_.tensors);                                                 \
		assert_msg(want);                                                        \
		assert_non_null(strstr(error_get(), INDEX_NAME));                        \
	} while (0)

static void
test_parse_valid(void **state)
{
	const char *doc = "{\n  \"metadata\": {\"total_size\": 1234, \"format\": \"pt\", "
			  "\"x\": [1]},\n"
			  "  \"weight_map\": {\n"
			  "    \"a\": \"model-00002-of-00002.safetensors\",\n"
			  "    \"b\": \"model-00001-of-00002.safetensors\",\n"
			  "    \"c\\u00e9\": \"model-00002-of-00002.safetensors\"\n"
			  "  },\n  \"other\": {\"ignored\": true}\n}\n";
	struct shard_map m = { 0 };

	assert_int_equal(parse_doc(doc, &m), 0);
	assert_int_equal(m.ntensors, 3);
	assert_int_equal(m.nshards, 2);
	assert_string_equal(m.shards[0], "model-00002-of-00002.safetensors");
	assert_string_equal(m.shards[1], "model-00001-of-00002.safetensors");
	assert_string_equal(m.tensors[0], "a");
	assert_string_equal(m.tensors[2], "c\xc3\xa9");
	assert_int_equal(m.tensor_shard[0], 0);
	assert_int_equal(m.tensor_shard[1], 1);
	assert_int_equal(m.tensor_shard[2], 0);
	assert_true(m.has_total_size);
	assert_int_equal(m.total_size, 1234);
	shard_map_free(&m);
	assert_null(m.tensors);
	shard_map_free(&m); /* twice is harmless */

	/* metadata is optional */
	assert_int_equal(parse_doc("{\"weight_map\":{\"a\":\"x.safetensors\"}}", &m), 0);
	assert_false(m.has_total_size);
	assert_int_equal(m.nshards, 1);
	shard_map_free(&m);
	/* a shard name may be escaped */
	assert_int_equal(parse_doc("{\"weight_map\":{\"a\":\"\\u0078.safetensors\"}}", &m), 0);
	assert_string_equal(m.shards[0], "x.safetensors");
	shard_map_free(&m);
}

static void
test_parse_document_errors(void **state)
{
	EXPECT("", -EINVAL, "invalid JSON at line 1, column 1");
	EXPECT("[]", -EINVAL, "not a shard index: expected a JSON object");
	EXPECT("{}", -EINVAL, "not a shard index: no weight_map");
	EXPECT("{\"metadata\":{}}", -EINVAL, "no weight_map");
	EXPECT("{\"weight_map\":{\"a\":\"x.safetensors\"}} x", -EINVAL,
		"unexpected data after the JSON value");
	EXPECT("{\n\"weight_map\":{\n\"a\":\"x.safetensors\",\n}}", -EINVAL,
		"weight_map: invalid JSON at line 4, column 1");
	EXPECT("{\"weight_map\":[]}", -EINVAL, "weight_map is not an object");
	EXPECT("{\"weight_map\":{}}", -EINVAL, "weight_map is empty");
	EXPECT("{\"weight_map\":{\"a\":1}}", -EINVAL,
		"weight_map: tensor \"a\": shard is not a string");
	EXPECT("{\"weight_map\":{\"a\":\"x.safetensors\"},"
	       "\"weight_map\":{\"a\":\"x.safetensors\"}}",
		-EINVAL, "duplicate weight_map");
	EXPECT("{\"metadata\":{},\"metadata\":{},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		-EINVAL, "duplicate metadata");
	EXPECT("{\"metadata\":[],\"weight_map\":{\"a\":\"x.safetensors\"}}", -EINVAL,
		"metadata is not an object");
	EXPECT("{\"weight_map\":{\"a\":\"x.safetensors\",\"b\":\"x.safetensors\","
	       "\"a\":\"y.safetensors\"}}",
		-EINVAL, "weight_map: tensor \"a\" is listed twice");
	EXPECT("{\"weight_map\":{\"ab\":\"x.safetensors\",\"a\\u0062\":\"x.safetensors\"}}",
		-EINVAL, "tensor \"ab\" is listed twice");
	/* of several, the one the weight_map repeats first */
	EXPECT("{\"weight_map\":{\"b\":\"x.safetensors\",\"a\":\"x.safetensors\","
	       "\"b\":\"x.safetensors\",\"a\":\"x.safetensors\"}}",
		-EINVAL, "tensor \"b\" is listed twice");
	EXPECT("{\"weight_map\":{\"c\":\"x.safetensors\",\"b\":\"x.safetensors\","
	       "\"a\":\"x.safetensors\",\"b\":\"x.safetensors\",\"c\":\"x.safetensors\","
	       "\"a\":\"x.safetensors\",\"c\":\"x.safetensors\"}}",
		-EINVAL, "tensor \"b\" is listed twice");
	EXPECT("{\"weight_map\":{\"\":\"x.safetensors\"}}", -EINVAL,
		"weight_map: tensor name \"\" is empty");
	EXPECT("{\"weight_map\":{\"a\\u0000\":\"x.safetensors\"}}", -EINVAL,
		"tensor name \"a\\u0000\" contains a NUL character");
	EXPECT("{\"weight_map\":{\"a\":\"x\xff.safetensors\"}}", -EINVAL, "invalid UTF-8");
}

/*
 * total_size is advisory: transformers reads only the weight_map, so an
 * index whose total_size is a float, null, a string, negative or given
 * twice loads there and must load here (review rev113 #11). A non-negative
 * integer is recorded, the first of two.
 */
static void
test_parse_total_size(void **state)
{
	static const char *const accepted[] = {
		"{\"metadata\":{\"total_size\":-1},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		"{\"metadata\":{\"total_size\":8.0},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		"{\"metadata\":{\"total_size\":1e3},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		"{\"metadata\":{\"total_size\":null},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		"{\"metadata\":{\"total_size\":\"12\"},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		"{\"metadata\":{\"total_size\":{\"x\":[1]}},"
		"\"weight_map\":{\"a\":\"x.safetensors\"}}",
		"{\"metadata\":{\"total_size\":18446744073709551616},"
		"\"weight_map\":{\"a\":\"x.safetensors\"}}",
	};
	struct shard_map m = { 0 };

	(void)state;
	for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
		if (parse_doc(accepted[i], &m) != 0)
			fail_msg("%s: %s", accepted[i], error_get());
		assert_false(m.has_total_size);
		assert_string_equal(m.tensors[0], "a");
		shard_map_free(&m);
	}
	assert_int_equal(parse_doc("{\"metadata\":{\"total_size\":18446744073709551615},"
		"\"weight_map\":{\"a\":\"x.safetensors\"}}", &m), 0);
	assert_true(m.has_total_size);
	assert_true(m.total_size == UINT64_MAX);
	shard_map_free(&m);
	assert_int_equal(parse_doc("{\"metadata\":{\"total_size\":\"x\",\"total_size\":5,"
		"\"total_size\":6},\"weight_map\":{\"a\":\"x.safetensors\"}}", &m), 0);
	assert_true(m.has_total_size);
	assert_int_equal(m.total_size, 5);
	shard_map_free(&m);
	/* Still a JSON document: a broken value is refused. */
	EXPECT("{\"metadata\":{\"total_size\":1.},\"weight_map\":{\"a\":\"x.safetensors\"}}",
		-EINVAL, "metadata: invalid JSON");
}

static void
test_parse_shard_names(void **state)
{
	static const struct {
		const char *doc, *want;
	} cases[] = {
		{ "{\"weight_map\":{\"t\":\"../x.safetensors\"}}",
			"weight_map: tensor \"t\": shard name \"../x.safetensors\" contains '/'" },
		{ "{\"weight_map\":{\"t\":\"a/b.safetensors\"}}",
			"shard name \"a/b.safetensors\" contains '/'" },
		{ "{\"weight_map\":{\"t\":\"/abs.safetensors\"}}", "contains '/'" },
		{ "{\"weight_map\":{\"t\":\"x.bin\"}}",
			"shard name \"x.bin\" does not end in .safetensors" },
		{ "{\"weight_map\":{\"t\":\"x.safetensors.bak\"}}",
			"does not end in .safetensors" },
		{ "{\"weight_map\":{\"t\":\".safetensors\"}}",
			"shard name \".safetensors\" has no name before .safetensors" },
		{ "{\"weight_map\":{\"t\":\"safetensors\"}}", "does not end in .safetensors" },
		{ "{\"weight_map\":{\"t\":\".\"}}", "shard name \".\" is not a file name" },
		{ "{\"weight_map\":{\"t\":\"..\"}}", "shard name \"..\" is not a file name" },
		{ "{\"weight_map\":{\"t\":\"\"}}", "shard name \"\" is empty" },
		{ "{\"weight_map\":{\"t\":\"a\\u0000.safetensors\"}}",
			"shard name \"a\\u0000.safetensors\" contains a NUL character" },
		{ "{\"weight_map\":{\"t\":\"a\\/b.safetensors\"}}", "contains '/'" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		EXPECT(cases[i].doc, -EINVAL, cases[i].want);
	{
		char doc[400], name[300];

		memset(name, 'n', 256 - 12);
		memcpy(name + 256 - 12, ".safetensors", sizeof(".safetensors"));
		snprintf(doc, sizeof(doc), "{\"weight_map\":{\"t\":\"%s\"}}", name);
		EXPECT(doc, -EINVAL, "is longer than 255 bytes");
	}
}

/* More distinct shards than one model may have files. */
static void
test_parse_too_many_shards(void **state)
{
	size_t cap = (size_t)64 * (INDEX_MAX_FILES + 2), p = 0;
	char *doc = malloc(cap);

	p += (size_t)snprintf(doc + p, cap - p, "{\"weight_map\":{");
	for (int i = 0; i <= INDEX_MAX_FILES; i++)
		p += (size_t)snprintf(doc + p, cap - p, "%s\"t%d\":\"s%d.safetensors\"",
			i ? "," : "", i, i);
	snprintf(doc + p, cap - p, "}}");
	EXPECT(doc, -E2BIG, "weight_map names more than 250 shards");
	free(doc);
}

/*
 * Which shard an entry names is found at a cost the names cannot raise:
 * 250 shard names of 255 bytes that differ only at their end, and entries
 * that alternate between the last two, cost O(log 250) comparisons each
 * (before, each entry compared its shard name with every shard named
 * before it: 64 MiB of such entries took 8.1 s of CPU to parse).
 */
static void
test_parse_many_shard_names(void **state)
{
	size_t cap = 300 * 280 + 4096 * 300, p = 0;
	char *doc = malloc(cap), pre[241];
	struct shard_map m = { 0 };
	unsigned entries = 0;

	(void)state;
	assert_non_null(doc);
	memset(pre, 'x', sizeof(pre) - 1);
	pre[sizeof(pre) - 1] = '\0';
	p += (size_t)snprintf(doc + p, cap - p, "{\"weight_map\":{");
	for (unsigned i = 0; i < 250 + 4096; i++, entries++)
		p += (size_t)snprintf(doc + p, cap - p, "%s\"t%u\":\"%s%03u.safetensors\"",
			i ? "," : "", i, pre, i < 250 ? i : 248 + i % 2);
	assert_true(p + 3 < cap);
	snprintf(doc + p, cap - p, "}}");
	shards_name_compares = 0;
	assert_int_equal(parse_doc(doc, &m), 0);
	assert_int_equal(m.nshards, 250);
	assert_int_equal(m.ntensors, entries);
	assert_string_equal(m.shards[249] + 240, "249.safetensors");
	assert_int_equal(m.tensor_shard[250], 248);
	assert_int_equal(m.tensor_shard[251], 249);
	print_message("name comparisons for %u entries of 250 shards: %lu\n", entries,
		shards_name_compares);
	/* per entry, about log2(250) = 8 to find its shard and log2(entries) = 12
	 * for the duplicate check's sort; before, 250 to find its shard */
	assert_true(shards_name_compares <= 40ul * entries);
	shard_map_free(&m);
	free(doc);
}

/* ---- opening sharded models ---- */

static int
teardown(void **state)
{
	const struct tu_dir *f = *state;

	/* no test may leak a descriptor, whether it succeeded or failed */
	assert_int_equal(tu_count_fds(), f->fds);
	return tu_dir_teardown(state);
}

/*
 * Writes dir/name: a safetensors file holding the comma-separated tensors
 * (each F32 [2], 8 bytes, in order) and the given __metadata__ JSON (or
 * NULL).
 */
static void
write_shard(const char *dir, const char *name, const char *tensors, const char *meta)
{
	char h[4096], list[1024], *save = NULL, *t;
	size_t p = 0, len;
	uint64_t off = 0;
	uint8_t *img;

	snprintf(list, sizeof(list), "%s", tensors);
	p += (size_t)snprintf(h + p, sizeof(h) - p, "{");
	if (meta != NULL)
		p += (size_t)snprintf(h + p, sizeof(h) - p, "\"__metadata__\":%s", meta);
	for (t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
		p += (size_t)snprintf(h + p, sizeof(h) - p,
			"%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%" PRIu64
			",%" PRIu64 "]}", (p > 1) ? "," : "", t, off, off + 8);
		off += 8;
	}
	snprintf(h + p, sizeof(h) - p, "}");
	img = tu_safetensors(h, off, &len);
	free(tu_write(dir, name, img, len));
	free(img);
}

static void
write_text(const char *dir, const char *name, const char *text)
{
	free(tu_write(dir, name, text, strlen(text)));
}

static char *
path_of(const char *dir, const char *name)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

#define S1 "model-00001-of-00003.safetensors"
#define S2 "model-00002-of-00003.safetensors"
#define S3 "model-00003-of-00003.safetensors"

/* The standard three-shard model of these tests. */
static void
write_model(const char *dir)
{
	write_shard(dir, S1, "embed,layers.0.w", "{\"format\":\"pt\",\"shard\":\"1\"}");
	write_shard(dir, S2, "layers.1.w,layers.2.w", "{\"format\":\"pt\",\"shard\":\"2\"}");
	write_shard(dir, S3, "lm_head", NULL);
	write_text(dir, INDEX_NAME,
		"{\"metadata\":{\"total_size\":999},\"weight_map\":{"
		"\"embed\":\"" S1 "\",\"layers.0.w\":\"" S1 "\","
		"\"layers.1.w\":\"" S2 "\",\"layers.2.w\":\"" S2 "\","
		"\"lm_head\":\"" S3 "\"}}");
}

/* Checks the source of the standard model. */
static void
check_model(const struct model_source *src)
{
	struct index_header h;
	struct index_tensor t;
	const char *name, *v;
	uint64_t size;

	assert_int_equal(src->format, FORMAT_SHARDED);
	assert_int_equal(src->nfiles, 3);
	assert_int_equal(index_open(src->index, src->index_len, &h), 0);
	assert_int_equal(h.tensor_count, 5);
	assert_int_equal(h.file_count, 3);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(index_file_at(src->index, &h, i, &name, &size), 0);
		assert_string_equal(name, i == 0 ? S1 : i == 1 ? S2 : S3);
		assert_int_equal(size, src->files[i].size);
		assert_non_null(strstr(src->files[i].path, name));
	}
	assert_int_equal(index_find(src->index, &h, "layers.2.w", &t), 0);
	assert_int_equal(t.file, 1);
	assert_int_equal(t.nbytes, 8);
	/* the second tensor of its shard: 8 bytes into the data */
	assert_int_equal(t.offset, src->files[1].size - 8);
	assert_int_equal(index_find(src->index, &h, "lm_head", &t), 0);
	assert_int_equal(t.file, 2);
	/* metadata is the first shard's */
	assert_int_equal(h.meta_count, 2);
	assert_int_equal(index_meta_find(src->index, &h, "shard", &v), 0);
	assert_string_equal(v, "1");
}

static void
test_open_valid(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), 0);
	check_model(&src);
	source_close(&src);
	free(p);
	/* total_size 999 is wrong, and that is fine (advisory) */
}

/*
 * index_st is the index as shards_open() read it (wcached asks its owner,
 * registry_load.c's opened_owner): a file renamed over the index's path
 * afterwards changes nothing in it.
 */
static void
test_open_index_st(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	struct stat was, now;
	char *p, *other;

	write_model(f->dir);
	p = path_of(f->dir, INDEX_NAME);
	other = path_of(f->dir, "other.json");
	assert_int_equal(stat(p, &was), 0);
	assert_int_equal(shards_open(p, &src), 0);
	write_text(f->dir, "other.json", "{}");
	assert_int_equal(rename(other, p), 0);
	assert_int_equal(stat(p, &now), 0);
	assert_true(now.st_ino != was.st_ino);
	assert_int_equal(src.index_st.st_dev, was.st_dev);
	assert_int_equal(src.index_st.st_ino, was.st_ino);
	assert_int_equal(src.index_st.st_uid, was.st_uid);
	source_close(&src);
	free(other);
	free(p);
}

/*
 * shards_read_index() lists the files a load of the index opens, in its
 * order, without opening one (a shard removed does not matter), and reads
 * the index as a load does: a symlinked index that leaves the model's
 * tree is refused.
 */
static void
test_read_index(void **state)
{
	struct tu_dir *f = *state;
	struct shard_map m = { 0 };
	char *p, *s2, *outside, *link;

	write_model(f->dir);
	s2 = path_of(f->dir, S2);
	assert_int_equal(unlink(s2), 0);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_read_index(p, &m), 0);
	assert_int_equal(m.nshards, 3);
	assert_string_equal(m.shards[0], S1);
	assert_string_equal(m.shards[1], S2);
	assert_string_equal(m.shards[2], S3);
	shard_map_free(&m);
	/* The index a link to a file outside the tree: refused, *out untouched. */
	outside = tu_tmpdir();
	write_model(outside);
	link = path_of(outside, INDEX_NAME);
	assert_int_equal(unlink(p), 0);
	assert_int_equal(symlink(link, p), 0);
	assert_true(shards_read_index(p, &m) < 0);
	assert_null(m.shards);
	tu_rmtree(outside);
	free(link);
	free(p);
	free(s2);
}

/* An index named by a relative path with no directory part. */
static void
test_open_relative(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char cwd[4096];

	write_model(f->dir);
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(f->dir), 0);
	assert_int_equal(shards_open(INDEX_NAME, &src), 0);
	assert_int_equal(chdir(cwd), 0);
	check_model(&src);
	source_close(&src);
}

static void
test_open_missing_shard(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	p = path_of(f->dir, S2);
	assert_int_equal(unlink(p), 0);
	free(p);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -ENOENT);
	assert_msg(S2 ": shard " S2 " named by ");
	assert_msg("does not exist");
	free(p);
}

/* What no message may hold: the bytes a terminal acts on (ESC, BEL, C1 CSI
 * as UTF-8, a bidirectional override). */
static void
assert_no_controls(const char *msg)
{
	static const char *const raw[] = { "\x1b", "\x07", "\xc2\x9b", "\xe2\x80\xae" };

	for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++)
		if (strstr(msg, raw[i]) != NULL)
			fail_msg("message \"%s\" holds a raw control", msg);
}

/* A hostile index names shards whose names are escape sequences: the
 * messages that quote them (a missing shard, a tensor in the wrong shard)
 * show them escaped (base/escape.h), never raw, in wc_errmsg(). */
#define EVIL "\x1b]0;PWNED\x07\x1b[2J\xc2\x9b" "31m\xe2\x80\xaeshard.safetensors"
/* EVIL as a JSON string's text (a JSON string holds no raw C0 control) */
#define EVIL_JSON "\\u001b]0;PWNED\\u0007\\u001b[2J\\u009b31m\\u202eshard.safetensors"
#define EVIL_SHOWN "\\x1b]0;PWNED\\x07\\x1b[2J\\u009b31m\\u202eshard.safetensors"

static void
test_open_hostile_shard_names(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p = path_of(f->dir, INDEX_NAME);

	/* Missing. */
	write_shard(f->dir, S1, "a", NULL);
	write_text(f->dir, INDEX_NAME,
		"{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" EVIL_JSON "\"}}");
	assert_int_equal(shards_open(p, &src), -ENOENT);
	assert_no_controls(error_get());
	assert_msg(EVIL_SHOWN ": shard " EVIL_SHOWN " named by ");

	/* Present, but the map puts its tensor elsewhere. */
	write_shard(f->dir, EVIL, "b,c", NULL);
	write_text(f->dir, INDEX_NAME, "{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" EVIL_JSON "\","
		"\"c\":\"" S1 "\"}}");
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_no_controls(error_get());
	assert_msg("tensor \"c\" is in shard " EVIL_SHOWN " but the weight_map of ");

	/* A tensor name in a shard's header, quoted by the reader. */
	write_shard(f->dir, EVIL, "b,x\\u001b[2J\\u009b", NULL);
	write_text(f->dir, INDEX_NAME,
		"{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" EVIL_JSON "\"}}");
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_no_controls(error_get());
	assert_msg("is not in the weight_map of ");
	free(p);
}

static void
test_open_wrong_shard(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	/* layers.2.w moves to shard 3, the map still says shard 2 */
	write_shard(f->dir, S2, "layers.1.w", NULL);
	write_shard(f->dir, S3, "lm_head,layers.2.w", NULL);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg(S3 ": tensor \"layers.2.w\" is in shard " S3 " but the weight_map of ");
	assert_msg("puts it in " S2);
	free(p);
}

static void
test_open_tensor_not_in_map(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	write_shard(f->dir, S3, "lm_head,extra.bias", NULL);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg(S3 ": tensor \"extra.bias\" is not in the weight_map of ");
	free(p);
}

static void
test_open_tensor_missing_from_shard(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	write_shard(f->dir, S1, "embed", NULL);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg(S1 ": tensor \"layers.0.w\" is missing: the weight_map of ");
	assert_msg("puts it in this shard");
	free(p);
}

static void
test_open_tensor_in_two_shards(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	write_shard(f->dir, S3, "lm_head,embed", NULL);
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg("duplicate tensor name \"embed\"");
	free(p);
}

static void
test_open_bad_shard(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_model(f->dir);
	write_text(f->dir, S2, "version https://git-lfs.github.com/spec/v1\noid sha256:00\n");
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg(S2 ": is a Git LFS pointer");
	free(p);
}

static void
test_open_bad_index(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;
	FILE *fp;

	write_model(f->dir);
	write_text(f->dir, INDEX_NAME, "{\"weight_map\":{\"t\":\"../" S1 "\"}}");
	p = path_of(f->dir, INDEX_NAME);
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg(INDEX_NAME ": weight_map: tensor \"t\": shard name \"../" S1 "\" contains '/'");
	/* larger than 64 MiB (sparse: nothing is written) */
	fp = fopen(p, "w");
	assert_non_null(fp);
	assert_int_equal(ftruncate(fileno(fp), (64 << 20) + 1), 0);
	fclose(fp);
	assert_int_equal(shards_open(p, &src), -EFBIG);
	assert_msg("larger than the 64 MiB a shard index may be");
	/* empty */
	write_text(f->dir, INDEX_NAME, "");
	assert_int_equal(shards_open(p, &src), -EINVAL);
	assert_msg("invalid JSON");
	free(p);
	p = path_of(f->dir, "nope.safetensors.index.json");
	assert_int_equal(shards_open(p, &src), -ENOENT);
	free(p);
}

/* ---- names chosen to collide (review rev224 M2) ---- */

/*
 * Tensor names are the model file's to choose. FNV-1a's low k bits depend
 * only on the low k bits of its state (an xor of a byte, a multiply modulo
 * 2^64), so two 8-byte blocks whose hashes agree in their low COLLIDE_BITS
 * lead to the same low bits whatever follows; COLLIDE_K such pairs, one
 * after the other, give 2^COLLIDE_K names that agree there (Joux's
 * multicollision), each pair found by Floyd's cycle finding. 38 bits are
 * what an unkeyed FNV-1a table of 2^(COLLIDE_K + 1) slots bucketed by
 * (h ^ h >> 29), as shards.c's was, puts in one bucket. The random names
 * are as long and share the prefix.
 */
#define COLLIDE_K 8
#define COLLIDE_N (1u << COLLIDE_K)
#define COLLIDE_BITS 38
#define COLLIDE_MASK ((UINT64_C(1) << COLLIDE_BITS) - 1)
#define COLLIDE_PREFIX "layer.0."
#define COLLIDE_LEN (sizeof(COLLIDE_PREFIX) - 1 + (size_t)8 * COLLIDE_K)

static void
name_block(uint64_t x, char b[8])
{
	static const char abc[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.";

	for (int i = 0; i < 8; i++)
		b[i] = abc[(x >> (6 * i)) & 63];
}

/* The low bits of the state s with the block of x hashed in. */
static uint64_t
block_step(uint64_t s, uint64_t x)
{
	char b[8];

	name_block(x, b);
	return fnv_mix_bytes(s, b, 8) & COLLIDE_MASK;
}

/* names[i] (COLLIDE_LEN + 1 bytes each) for i < COLLIDE_N: colliding, or
 * random ones. */
static void
make_names(char (*names)[COLLIDE_LEN + 1], bool colliding)
{
	char pair[COLLIDE_K][2][8];
	uint64_t s = fnv_mix_bytes(FNV_OFFSET_BASIS, COLLIDE_PREFIX, 8);
	uint64_t r = UINT64_C(88172645463325252);

	for (int k = 0; k < COLLIDE_K && colliding; k++) {
		for (uint64_t x0 = (uint64_t)k + 1;; x0 += 1000) {
			uint64_t t = block_step(s, x0), h = block_step(s, t), pt = 0, ph = 0;

			while (t != h) {
				t = block_step(s, t);
				h = block_step(s, block_step(s, h));
			}
			for (t = x0; t != h; t = block_step(s, t), h = block_step(s, h)) {
				pt = t;
				ph = h;
			}
			if (pt != ph) { /* else x0 was on the cycle: no pair */
				name_block(pt, pair[k][0]);
				name_block(ph, pair[k][1]);
				break;
			}
		}
		/* either block of the pair leads on: their low bits agree */
		assert_int_equal(fnv_mix_bytes(s, pair[k][0], 8) & COLLIDE_MASK,
			fnv_mix_bytes(s, pair[k][1], 8) & COLLIDE_MASK);
		s = fnv_mix_bytes(s, pair[k][0], 8);
	}
	for (uint32_t i = 0; i < COLLIDE_N; i++) {
		char *p = names[i] + sizeof(COLLIDE_PREFIX) - 1;

		memcpy(names[i], COLLIDE_PREFIX, sizeof(COLLIDE_PREFIX) - 1);
		for (int k = 0; k < COLLIDE_K; k++, p += 8) {
			if (colliding) {
				memcpy(p, pair[k][(i >> k) & 1], 8);
				continue;
			}
			r ^= r << 13;
			r ^= r >> 7;
			r ^= r << 17;
			name_block(r, p);
		}
		*p = '\0';
	}
}

/* Writes a one-shard model of the names (each F32 [2]) and its index. */
static void
write_named_model(const char *dir, char (*names)[COLLIDE_LEN + 1])
{
	size_t cap = COLLIDE_N * (COLLIDE_LEN + 100), h = 0, m = 0, len;
	char *header = malloc(cap), *map = malloc(cap);
	uint8_t *img;

	assert_non_null(header);
	assert_non_null(map);
	h += (size_t)snprintf(header + h, cap - h, "{");
	m += (size_t)snprintf(map + m, cap - m, "{\"weight_map\":{");
	for (uint32_t i = 0; i < COLLIDE_N; i++) {
		h += (size_t)snprintf(header + h, cap - h,
			"%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%u,%u]}",
			i ? "," : "", names[i], 8 * i, 8 * i + 8);
		m += (size_t)snprintf(map + m, cap - m, "%s\"%s\":\"" S1 "\"", i ? "," : "",
			names[i]);
		assert_true(h < cap && m < cap);
	}
	snprintf(header + h, cap - h, "}");
	snprintf(map + m, cap - m, "}}");
	img = tu_safetensors(header, (size_t)8 * COLLIDE_N, &len);
	free(tu_write(dir, S1, img, len));
	write_text(dir, INDEX_NAME, map);
	free(img);
	free(map);
	free(header);
}

/* The name comparisons of shards_open() of a model of the names. */
static unsigned long
open_compares(const char *dir, bool colliding)
{
	char (*names)[COLLIDE_LEN + 1] = calloc(COLLIDE_N, sizeof(*names));
	struct model_source src;
	unsigned long n;
	char *p;

	assert_non_null(names);
	make_names(names, colliding);
	write_named_model(dir, names);
	p = path_of(dir, INDEX_NAME);
	shards_name_compares = 0;
	assert_int_equal(shards_open(p, &src), 0);
	n = shards_name_compares;
	source_close(&src);
	free(p);
	free(names);
	return n;
}

/*
 * The weight_map's names are checked (no name twice, every name in its
 * shard) at a cost that the names cannot raise: 2^8 names built to
 * collide in an unkeyed FNV-1a table cost no more comparisons than random
 * ones, and O(n log n) of them (review rev224 M2: with that table they cost
 * n^2 / 2 in each check, 13.95 s of CPU for 2^16 names).
 */
static void
test_open_colliding_names(void **state)
{
	struct tu_dir *f = *state;
	unsigned long colliding = open_compares(f->dir, true);
	unsigned long random = open_compares(f->dir, false);

	print_message("name comparisons for %u names: %lu colliding, %lu random\n",
		COLLIDE_N, colliding, random);
	assert_true(colliding <= 8ul * COLLIDE_N * COLLIDE_K);
	assert_true(colliding <= 2 * random);
}

/* ---- directories ---- */

static void
test_dir_sharded(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;

	write_model(f->dir);
	write_text(f->dir, "config.json", "{}");
	assert_int_equal(source_open(f->dir, &src), 0);
	check_model(&src);
	source_close(&src);
}

static void
test_dir_single(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *d;

	write_shard(f->dir, "model.safetensors", "a,b", NULL);
	write_text(f->dir, "config.json", "{}");
	write_text(f->dir, "README.md", "hi");
	assert_int_equal(source_open(f->dir, &src), 0);
	assert_int_equal(src.format, FORMAT_SAFETENSORS);
	assert_int_equal(src.nfiles, 1);
	source_close(&src);
	/* a trailing slash works too */
	assert_true(asprintf(&d, "%s/", f->dir) > 0);
	assert_int_equal(source_open(d, &src), 0);
	source_close(&src);
	free(d);
}

static void
test_dir_ambiguous(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;

	assert_int_equal(source_open(f->dir, &src), -ENOENT);
	assert_msg("no model found: no *.safetensors.index.json and no *.safetensors file");
	write_text(f->dir, "notes.txt", "x");
	assert_int_equal(source_open(f->dir, &src), -ENOENT);
	write_shard(f->dir, "b.safetensors", "x", NULL);
	write_shard(f->dir, "a.safetensors", "y", NULL);
	assert_int_equal(source_open(f->dir, &src), -EINVAL);
	assert_msg("2 *.safetensors files (a.safetensors, b.safetensors) and no "
		   "*.safetensors.index.json");
	/* an index decides, whatever other safetensors files lie around */
	write_model(f->dir);
	assert_int_equal(source_open(f->dir, &src), 0);
	check_model(&src);
	source_close(&src);
	write_text(f->dir, "other.safetensors.index.json", "{}");
	assert_int_equal(source_open(f->dir, &src), -EINVAL);
	assert_msg("2 shard indexes (model.safetensors.index.json, other.safetensors.index.json)");
	{
		char *p = path_of(f->dir, "missing-dir");

		assert_int_equal(source_open(p, &src), -ENOENT);
		assert_msg("missing-dir");
		free(p);
	}
}

/* A directory of many candidates (its owner chooses how many): the
 * message lists the first 8 in order and says how many there are, and
 * only those 8 names are ever kept. */
/* A name rule that refuses names beginning "zz": as wcached's refuses a
 * name with a remote mount on it (mountrule.c). Its listing's run counts
 * the names it was asked about; its end keeps the count (zz_asked). */
static int zz_asked;

static int
refuse_zz(void **run, int dfd, const char *name, char *why, size_t len)
{
	assert_true(dfd >= 0);
	if (*run == NULL)
		assert_non_null(*run = calloc(1, sizeof(int)));
	++*(int *)*run;
	if (strncmp(name, "zz", 2) != 0)
		return 0;
	snprintf(why, len, "fuse is mounted on it");
	return -EXDEV;
}

static void
zz_end(void *run)
{
	zz_asked = *(int *)run;
	free(run);
}

static const struct shards_name_rule zz_rule = { refuse_zz, zz_end };

/* Under shards_name_rule a name it refuses is no model file: the
 * directory's one other file is the model, and where none is left the
 * message names the name refused and why (review rev202 H1). */
static void
test_dir_name_rule(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char *p;

	write_shard(f->dir, "model.safetensors", "a,b", NULL);
	write_text(f->dir, "zz.safetensors.index.json", "{}");
	assert_int_equal(source_open(f->dir, &src), -EINVAL); /* bob's index taken */
	shards_name_rule = &zz_rule;
	zz_asked = 0;
	assert_int_equal(source_open(f->dir, &src), 0);
	assert_int_equal(zz_asked, 2); /* one run for the listing, ended */
	assert_int_equal(src.format, FORMAT_SAFETENSORS);
	assert_int_equal(src.nfiles, 1);
	source_close(&src);
	p = path_of(f->dir, "model.safetensors");
	assert_int_equal(unlink(p), 0);
	free(p);
	assert_int_equal(source_open(f->dir, &src), -ENOENT);
	assert_msg("no *.safetensors file (zz.safetensors.index.json not taken: fuse is "
		   "mounted on it)");
	shards_name_rule = NULL;
}

static void
test_dir_many_files(void **state)
{
	struct tu_dir *f = *state;
	struct model_source src;
	char name[32];

	for (int i = 299; i >= 0; i--) {
		snprintf(name, sizeof(name), "s%03d.safetensors", i);
		write_text(f->dir, name, "x");
	}
	assert_int_equal(source_open(f->dir, &src), -EINVAL);
	assert_msg("300 *.safetensors files (s000.safetensors, s001.safetensors, s002.safetensors, "
		   "s003.safetensors, s004.safetensors, s005.safetensors, s006.safetensors, "
		   "s007.safetensors, ... (300 in all)) and no *.safetensors.index.json");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_valid),
		cmocka_unit_test(test_parse_document_errors),
		cmocka_unit_test(test_parse_total_size),
		cmocka_unit_test(test_parse_shard_names),
		cmocka_unit_test(test_parse_too_many_shards),
		cmocka_unit_test(test_parse_many_shard_names),
		cmocka_unit_test_setup_teardown(test_open_valid, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_relative, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_missing_shard, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_wrong_shard, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_hostile_shard_names, tu_dir_setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_open_tensor_not_in_map, tu_dir_setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_open_tensor_missing_from_shard, tu_dir_setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_open_tensor_in_two_shards, tu_dir_setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_open_bad_shard, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_bad_index, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_index_st, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_colliding_names, tu_dir_setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_read_index, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_name_rule, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_sharded, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_single, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_many_files, tu_dir_setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_ambiguous, tu_dir_setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
