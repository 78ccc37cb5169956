/*
 * writer.h: writing models to disk (safetensors and WEIG). The WEIG layout
 * the writer shares with the reader is format/weig.h's.
 *
 * Writers to a path never leave a partial output: they write a temporary
 * file in the output's directory, fsync it and rename it over the output
 * path; on any failure they unlink the temporary file and the output path is
 * untouched. writer_safetensors_fd() writes to the caller's descriptor.
 * Errors follow error.h: a negative errno code and a message naming the file.
 * What the writer's files share is writer_internal.h; the output file they
 * all write through is outfile.h.
 */
#ifndef WC_WRITER_H
#define WC_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "format/index.h"
#include "format/weig.h"
#include "lib/wcache.h"

/* ---- writers (writer_weig.c, writer_safetensors.c, writer_big_endian.c) ---- */

enum writer_format {
	WRITER_WEIG = 1,
	WRITER_SAFETENSORS,
};

/*
 * Writes m as a WEIG file: records sorted by name, metadata when m has any,
 * data region at a multiple of 4096, each tensor at a multiple of 64, trailer.
 */
int writer_weig(const wc_model *m, const char *out_path);

/*
 * Writes m as a standard safetensors file: a JSON header (with __metadata__
 * when m has metadata) padded with spaces to a multiple of 8 bytes, then the
 * tensors' data back to back in upstream's order (by dtype, widest first,
 * then by name in byte order), which starts every tensor at a multiple of
 * its element size.
 */
int writer_safetensors(const wc_model *m, const char *out_path);

/*
 * A check the writer makes once it has read and written every tensor's
 * data, before the output replaces its path: 0, or a negative errno code
 * with the message set (error.h), which fails the write and leaves the path
 * as it was. wcachectl convert's checks that no input file changed while
 * its data was copied.
 */
typedef int writer_check_fn(void *ctx);

/*
 * As writer_weig() (fmt WRITER_WEIG) or writer_safetensors(), calling
 * check(ctx) after the data and before the commit; check may be NULL.
 */
int writer_model_checked(const wc_model *m, enum writer_format fmt, const char *out_path,
	writer_check_fn *check, void *ctx);

/*
 * Writes the caller's tensors, and nmeta metadata pairs (metadata[2i] the
 * key, metadata[2i + 1] the value), as a standard safetensors file (as
 * writer_safetensors() lays it out) to fd from its current offset, for a
 * memfd that is then published. Checks each tensor (known dtype, at most
 * INDEX_MAX_NDIM dimensions, nbytes that of its shape, data when not
 * empty, no duplicate or reserved name); what names the output in
 * messages. fd stays the caller's, open, whatever happens; after a failure
 * it may hold part of the file.
 */
int writer_safetensors_fd(const wc_tensor *tensors, size_t n, const char *const *metadata,
	size_t nmeta, int fd, const char *what);

/* As writer_safetensors_fd(), calling written(i, arg) (when not NULL) as
 * soon as tensors[i]'s data has been read, in the order the file holds
 * them (upstream's: by dtype, widest first, then by name), each once;
 * never for a tensor not yet read, so a failed write leaves some
 * uncalled. */
int writer_safetensors_fd_each(const wc_tensor *tensors, size_t n, const char *const *metadata,
	size_t nmeta, int fd, const char *what, wc_written_fn *written, void *arg);

/*
 * Reads the big-endian WEIG file in_path, validates it completely and writes
 * it to out_path in format fmt, little-endian: every element is byte-swapped
 * according to its dtype's size (2, 4 or 8 bytes; C64 as two 4-byte floats;
 * 1-byte and sub-byte types unchanged). An in_path written in place while
 * its data is copied (size or mtime changed) fails the write, out_path as
 * it was.
 */
int writer_from_big_endian(const char *in_path, enum writer_format fmt, const char *out_path);

/*
 * Unlinks the temporary files of the writes to a path now in progress in
 * this process (outfile_remove_temporaries()), so that a signal handler
 * that is about to end the process (wcachectl convert's, on SIGINT or
 * SIGTERM) leaves no temporary file beside the output. Async-signal-safe.
 */
void writer_remove_temporaries(void);

/* Byte-swaps n bytes from src into dst, elements of elem_size bytes (1, 2,
 * 4 or 8; 1 copies). n must be a multiple of elem_size; src and dst may be
 * the same buffer. Exposed for the tests. */
void writer_swap_elements(uint8_t *dst, const uint8_t *src, size_t n, unsigned elem_size);

/* Size of the elements a big-endian to little-endian conversion swaps for
 * this WEIG dtype code: 1 (nothing to swap), 2, 4 or 8; 0 for an unknown
 * code. */
unsigned writer_swap_size(uint32_t dtype);

#endif
