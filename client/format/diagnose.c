/*
 * diagnose.c: recognising files that are not safetensors by their magic
 * bytes (see diagnose.h). Called by the safetensors reader before it reads
 * the header length, so wc_open_file(), `wcachectl inspect` and the
 * daemon's load errors all give the same diagnosis.
 *
 * What we recognise, and how:
 * - a zip archive ("PK\3\4"): PyTorch's torch.save() format since 1.6 when
 *   its first entry is ".../data.pkl" (or any entry name ending in .pkl),
 *   a NumPy .npz archive when it is an ".npy" entry, else a zip archive;
 * - a pickle (0x80, protocol 2 to 5): the legacy torch.save() format when
 *   it starts with the pickled magic number torch writes first, else a
 *   Python pickle;
 * - a WEIG file ("GIEW", or "WEIG" big-endian), which reaches the
 *   safetensors reader only as a directory's file or a shard;
 * - GGUF ("GGUF"), NumPy .npy ("\x93NUMPY"), HDF5 (its 8-byte signature at
 *   offset 0, 512, 1024 or 2048, where the HDF5 spec allows a user block).
 * Only magic bytes are read, from the start of the file (the private copy
 * the safetensors reader made), bounds-checked,
 * and only when the bytes after the header length, past JSON whitespace,
 * do not open a JSON object (a safetensors header).
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "format/diagnose.h"
#include "base/error.h"

/* The legacy torch.save() stream: pickle protocol 2, then the magic number
 * 0x1950a86a20f9469cfc6c pickled as a LONG1 of 10 bytes. */
static const uint8_t torch_legacy_magic[] = {
	0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
};

static int
starts_with(const uint8_t *file, uint64_t size, const void *magic, size_t len)
{
	return size >= len && memcmp(file, magic, len) == 0;
}

static int
ends_with(const uint8_t *s, size_t n, const char *suffix)
{
	size_t m = strlen(suffix);

	return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/*
 * True if the bytes after the 8-byte header length open a JSON object: '{'
 * after any JSON whitespace (space, tab, CR, LF), within the header the
 * length announces and the size bytes we have.
 */
static bool
opens_json_object(const uint8_t *file, uint64_t size)
{
	uint64_t header_len = 0, end, i = 8;

	if (size <= 8)
		return false;
	for (int k = 7; k >= 0; k--)
		header_len = header_len << 8 | file[k];
	end = header_len < size - 8 ? 8 + header_len : size;
	while (i < end && (file[i] == ' ' || file[i] == '\t' || file[i] == '\r' ||
		file[i] == '\n'))
		i++;
	return i < end && file[i] == '{';
}

/* Names what a zip archive holds from its first local file header. */
static int
diagnose_zip(const char *name, const uint8_t *file, uint64_t size)
{
	size_t len = 0;
	const uint8_t *entry = NULL;

	/* Local file header: the name length is a u16 at offset 26, the name
	 * starts at offset 30. */
	if (size >= 30) {
		len = (size_t)file[26] | (size_t)file[27] << 8;
		if (len <= size - 30)
			entry = file + 30;
	}
	if (entry != NULL && (ends_with(entry, len, "data.pkl") || ends_with(entry, len, ".pkl")))
		return error_set(-EINVAL,
			"%s: is a PyTorch checkpoint (torch.save zip archive holding a pickle), "
			"not a safetensors file: convert it with `" DIAGNOSE_CONVERTER
			" %s OUT.safetensors` (also installed as wcache-convert)", name, name);
	if (entry != NULL && ends_with(entry, len, ".npy"))
		return error_set(-EINVAL,
			"%s: is a NumPy .npz archive, not a safetensors file: load it with "
			"numpy.load() and write it with wcache.numpy.save_file()", name);
	return error_set(-EINVAL, "%s: is a zip archive, not a safetensors file", name);
}

int
diagnose_format(const char *name, const uint8_t *file, uint64_t size)
{
	static const uint8_t hdf5[] = { 0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n' };
	static const uint64_t hdf5_at[] = { 0, 512, 1024, 2048 };

	/* A file whose header length is followed by a JSON object is left to
	 * the safetensors reader, whatever its first bytes happen to be (a
	 * 640-byte header starts with 0x80 0x02, as a pickle does). The
	 * header may start with JSON whitespace, as upstream and our reader
	 * accept. */
	if (opens_json_object(file, size))
		return 0;
	if (starts_with(file, size, "PK\x03\x04", 4))
		return diagnose_zip(name, file, size);
	if (starts_with(file, size, torch_legacy_magic, sizeof(torch_legacy_magic)))
		return error_set(-EINVAL,
			"%s: is a PyTorch checkpoint (legacy torch.save pickle format), not a "
			"safetensors file: convert it with `" DIAGNOSE_CONVERTER
			" %s OUT.safetensors` (also installed as wcache-convert)", name, name);
	if (size >= 2 && file[0] == 0x80 && file[1] >= 2 && file[1] <= 5)
		return error_set(-EINVAL,
			"%s: is a Python pickle (protocol %u), not a safetensors file; if it holds "
			"a PyTorch state dict, convert it with `" DIAGNOSE_CONVERTER
			" %s OUT.safetensors`", name, (unsigned)file[1], name);
	/* A WEIG file (proto/FORMAT.md: "GIEW", or "WEIG" written big-endian)
	 * is recognised by its magic when it is named, whatever its name; the
	 * safetensors reader gets one only as the .safetensors file of a
	 * directory or as a shard, which must be safetensors. */
	if (starts_with(file, size, "GIEW", 4) || starts_with(file, size, "WEIG", 4))
		return error_set(-EINVAL,
			"%s: is a WEIG file, not a safetensors file: a shard or the "
			".safetensors file of a directory must be safetensors; name the WEIG "
			"file itself as the model (or convert it: wcachectl convert %s "
			"OUT.safetensors)", name, name);
	if (starts_with(file, size, "GGUF", 4))
		return error_set(-EINVAL,
			"%s: is a GGUF file (llama.cpp), not a safetensors file; wcache serves "
			"safetensors and WEIG: use the model's safetensors release", name);
	if (starts_with(file, size, "\x93NUMPY", 6))
		return error_set(-EINVAL,
			"%s: is a NumPy .npy array, not a safetensors file: load it with "
			"numpy.load() and write it with wcache.numpy.save_file()", name);
	for (size_t i = 0; i < sizeof(hdf5_at) / sizeof(hdf5_at[0]); i++)
		if (size >= hdf5_at[i] + sizeof(hdf5) &&
			memcmp(file + hdf5_at[i], hdf5, sizeof(hdf5)) == 0)
			return error_set(-EINVAL,
				"%s: is an HDF5 file (Keras/TensorFlow .h5), not a safetensors "
				"file", name);
	return 0;
}

/*
 * Recognises files that are not safetensors at all and explains them;
 * returns 0 when the file may be safetensors.
 */
int
diagnose_not_safetensors(const char *name, const uint8_t *file, uint64_t size)
{
	static const char lfs[] = "version https://git-lfs";
	uint64_t i = 0;
	int r;

	if (size == 0)
		return error_set(-EINVAL, "%s: file is empty (0 bytes), not a safetensors file",
			name);
	if (size >= sizeof(lfs) - 1 && memcmp(file, lfs, sizeof(lfs) - 1) == 0)
		return error_set(-EINVAL,
			"%s: is a Git LFS pointer, not the model data: run `git lfs pull` in "
			"its repository to fetch the file", name);
	if (size >= 3 && memcmp(file, "\xef\xbb\xbf", 3) == 0)
		i = 3;
	while (i < size && i < 1024 &&
		(file[i] == ' ' || file[i] == '\t' || file[i] == '\r' || file[i] == '\n'))
		i++;
	if ((size - i >= 9 && strncasecmp((const char *)file + i, "<!doctype", 9) == 0) ||
		(size - i >= 5 && strncasecmp((const char *)file + i, "<html", 5) == 0))
		return error_set(-EINVAL,
			"%s: looks like an HTML page, not a safetensors file (a failed "
			"download?)", name);
	if ((r = diagnose_format(name, file, size)) < 0)
		return r;
	if (size < 8)
		return error_set(-EINVAL,
			"%s: %llu bytes, too short for a safetensors file (8-byte header "
			"length, then the header)", name, (unsigned long long)size);
	return 0;
}

/* True if the 8 bytes at p are printable ASCII or whitespace (a text file). */
bool
diagnose_looks_like_text(const uint8_t *p)
{
	for (int i = 0; i < 8; i++)
		if (!((p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\t' || p[i] == '\n' ||
			    p[i] == '\r'))
			return false;
	return true;
}
