/*
 * file.h: opening and mapping one model file.
 *
 * A wc_file owns its descriptor and its mapping. Files are opened
 * O_RDONLY | O_CLOEXEC, must be regular files, and are mapped whole with
 * PROT_READ, MAP_PRIVATE | MAP_NORESERVE (an empty file has no mapping):
 * for reading that is the same page cache every other process maps, as
 * MAP_SHARED would be, and wc_model_cow() can make it copy-on-write.
 */
#ifndef WC_FILE_H
#define WC_FILE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

struct wc_file {
	int fd;               /* -1 once closed or handed over */
	const uint8_t *base;  /* NULL for an empty file */
	uint64_t size;
	char *path;           /* as opened, for messages */
	struct stat st;       /* fstat at open, to detect in-place changes */
};

/* Opens, checks and maps path. On failure *out is untouched and the message
 * names the path. */
int file_open(const char *path, struct wc_file *out);

/* Maps an already open descriptor (taking ownership of fd on success only);
 * path is for messages. */
int file_from_fd(int fd, const char *path, struct wc_file *out);

/* The last component of path, as a model's index records its files. */
const char *file_basename(const char *path);

/* Whether name ends in suffix with at least one byte before it (a file
 * named only ".json" has no extension). */
bool file_has_suffix(const char *name, const char *suffix);

/* Unmaps and closes (fd -1 means handed over); safe on a zeroed or
 * already closed file. */
void file_close(struct wc_file *f);

#endif
