/*
 * fdstore_name.c: the names of the descriptors wcached keeps in systemd's
 * file descriptor store (see fdstore.h): making them
 * (fdstore_name_index(), _file(), _artifact(), _artifact_index()) and
 * parsing them back (fdstore_name_parse()).
 *
 * The name scheme is a concern of its own, apart from the description's
 * encoding: restore_store.c makes a name for each descriptor it hands to
 * the store, restore.c parses the names of what the store hands back, and
 * fdstore_check.c holds a derived artifact's two names to its model's slot
 * with the parser. Parsing is strict (decimal without leading zeros or
 * overflow, numbers in range) so that a name parses only when printing its
 * parts gives the same name back: one name for each stored descriptor.
 */
#include "fdstore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/decimal.h"
#include "base/error.h"

static int
name_result(int n, size_t cap)
{
	if (n < 0 || (size_t)n >= cap)
		return error_set(-ENAMETOOLONG, "fdstore: a %zu-byte buffer is too small for "
			"a name", cap);
	return n;
}

int
fdstore_name_index(char *buf, size_t cap, uint64_t slot, uint64_t gen)
{
	return name_result(snprintf(buf, cap, "wc-%" PRIu64 "-%" PRIu64 "-i", slot, gen), cap);
}

int
fdstore_name_file(char *buf, size_t cap, uint64_t slot, uint64_t gen, uint32_t k)
{
	return name_result(snprintf(buf, cap, "wc-%" PRIu64 "-%" PRIu64 "-%" PRIu32, slot, gen,
		k), cap);
}

int
fdstore_name_artifact(char *buf, size_t cap, uint64_t slot, uint64_t n)
{
	return name_result(snprintf(buf, cap, "wc-%" PRIu64 "-d%" PRIu64 "-a", slot, n), cap);
}

int
fdstore_name_artifact_index(char *buf, size_t cap, uint64_t slot, uint64_t n)
{
	return name_result(snprintf(buf, cap, "wc-%" PRIu64 "-d%" PRIu64 "-i", slot, n), cap);
}

/* A decimal number at *p up to the next byte that is not a digit, without
 * leading zeros (a name has one spelling), at most max (decimal_u64());
 * advances *p past it. */
static int
name_number(const char **p, uint64_t max, uint64_t *out)
{
	size_t len = strspn(*p, "0123456789");
	uint64_t v;

	if ((len > 1 && **p == '0') || decimal_u64(*p, len, &v) < 0 || v > max)
		return -1;
	*p += len;
	*out = v;
	return 0;
}

int
fdstore_name_parse(const char *name, struct fdstore_name *out)
{
	struct fdstore_name n = { 0 };
	const char *p = name;
	uint64_t k;

	if (strcmp(name, FDSTORE_NAME_STATUS) == 0) {
		out->kind = FDSTORE_NAME_KIND_STATUS;
		return 0;
	}
	if (strcmp(name, FDSTORE_NAME_DESC) == 0) {
		out->kind = FDSTORE_NAME_KIND_DESC;
		return 0;
	}
	if (strncmp(p, FDSTORE_NAME_PREFIX, strlen(FDSTORE_NAME_PREFIX)) != 0)
		return error_set(-EINVAL, "fdstore: \"%.64s\": not a name of wcached's", name);
	p += strlen(FDSTORE_NAME_PREFIX);
	if (name_number(&p, UINT64_MAX, &n.slot) < 0 || n.slot == 0 || *p++ != '-')
		return error_set(-EINVAL, "fdstore: \"%.64s\": not wc-<slot>-<generation>-...",
			name);
	/* A derived artifact's: wc-<slot>-d<n>-a or -i. */
	if (*p == 'd') {
		p++;
		if (name_number(&p, UINT64_MAX, &n.artifact) < 0 || n.artifact == 0 ||
			p[0] != '-' || (p[1] != 'a' && p[1] != 'i') || p[2] != '\0')
			return error_set(-EINVAL, "fdstore: \"%.64s\": not wc-<slot>-d<artifact>-a "
				"or -i", name);
		n.kind = p[1] == 'a' ? FDSTORE_NAME_KIND_ARTIFACT :
			FDSTORE_NAME_KIND_ARTIFACT_INDEX;
		*out = n;
		return 0;
	}
	if (name_number(&p, UINT64_MAX, &n.generation) < 0 || n.generation == 0 || *p++ != '-')
		return error_set(-EINVAL, "fdstore: \"%.64s\": not wc-<slot>-<generation>-...",
			name);
	if (p[0] == 'i' && p[1] == '\0') {
		n.kind = FDSTORE_NAME_KIND_INDEX;
	} else if (name_number(&p, FDSTORE_MAX_FILES - 1, &k) == 0 && *p == '\0') {
		n.kind = FDSTORE_NAME_KIND_FILE;
		n.file = (uint32_t)k;
	} else {
		return error_set(-EINVAL, "fdstore: \"%.64s\": ends in neither \"i\" nor a file "
			"number below %u", name, FDSTORE_MAX_FILES);
	}
	*out = n;
	return 0;
}
