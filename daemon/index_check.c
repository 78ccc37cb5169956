/*
 * index_check.c: every record of a stored index, checked once (see
 * index_check.h). Only the index reader's own functions touch the blob, so
 * this reads nothing they would not: each offset is checked before use.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "index_check.h"

/* The file records: names readable, sizes those of the files. */
static int
check_files(const uint8_t *blob, const struct index_header *h, const uint64_t *file_size)
{
	for (uint64_t k = 0; k < h->file_count; k++) {
		const char *name;
		uint64_t size;

		if (index_file_at(blob, h, k, &name, &size) < 0)
			return -EBADMSG;
		if (size != file_size[k])
			return error_set(-EBADMSG, "index: file %" PRIu64 " (%s): %" PRIu64
						   " bytes, the file has %" PRIu64, k, name, size,
				file_size[k]);
	}
	return 0;
}

/* The tensor records, in order; first[] gets each file's first data. */
static int
check_tensors(const uint8_t *blob, const struct index_header *h, const uint64_t *file_size,
	uint64_t *first)
{
	const char *prev = NULL;

	for (uint64_t i = 0; i < h->tensor_count; i++) {
		struct index_tensor t;
		uint64_t size;

		if (index_tensor_at(blob, h, i, &t) < 0)
			return -EBADMSG;
		size = file_size[t.file];
		if (t.offset > size || t.nbytes > size - t.offset)
			return error_set(-EBADMSG,
				"index: tensor \"%s\": data [%" PRIu64 ", +%" PRIu64 ") lies "
				"outside file %" PRIu32 " (%" PRIu64 " bytes)",
				t.name, t.offset, t.nbytes, t.file, size);
		if (prev != NULL && strcmp(prev, t.name) >= 0)
			return error_set(-EBADMSG,
				"index: tensor record %" PRIu64 " (\"%s\") is not after \"%s\": "
				"the records are not sorted by name", i, t.name, prev);
		prev = t.name;
		if (t.offset < first[t.file])
			first[t.file] = t.offset;
	}
	return 0;
}

/* The metadata records, keys in order. */
static int
check_meta(const uint8_t *blob, const struct index_header *h)
{
	const char *prev = NULL;

	for (uint64_t i = 0; i < h->meta_count; i++) {
		const char *key, *value;

		if (index_meta_at(blob, h, i, &key, &value) < 0)
			return -EBADMSG;
		if (prev != NULL && strcmp(prev, key) >= 0)
			return error_set(-EBADMSG,
				"index: metadata record %" PRIu64 " (\"%s\") is not after \"%s\": "
				"the keys are not sorted", i, key, prev);
		prev = key;
	}
	return 0;
}

int
index_check(const uint8_t *blob, const struct index_header *h, const uint64_t *file_size,
	size_t nfiles, uint64_t *first_data)
{
	uint64_t *first;
	int err;

	if (h->file_count != nfiles)
		return error_set(-EBADMSG, "index: %" PRIu64 " files, the model has %zu",
			h->file_count, nfiles);
	if ((first = malloc(nfiles * sizeof(*first))) == NULL)
		return error_set(-ENOMEM, "index check: out of memory");
	memcpy(first, file_size, nfiles * sizeof(*first));
	if ((err = check_files(blob, h, file_size)) == 0 &&
		(err = check_tensors(blob, h, file_size, first)) == 0 &&
		(err = check_meta(blob, h)) == 0 && first_data != NULL)
		memcpy(first_data, first, nfiles * sizeof(*first));
	free(first);
	return err;
}
