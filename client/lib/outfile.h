/*
 * outfile.h: a buffered output file that nobody ever sees partial
 * (outfile.c). The writers (writer.c and the writer_*.c files) stream every
 * file they make through it; writer_safetensors_fd() streams a derived
 * artifact into the memfd derive.c hands it.
 *
 * A file named by a path is written under a temporary name in the same
 * directory (so that rename is atomic), fsync'd and renamed over the path
 * by outfile_commit(); outfile_abort() unlinks the temporary file, so the
 * path holds either what it held before or the complete new file. A path
 * that is a symlink stays one: the file it points at is replaced; a file
 * replaced keeps its mode (and owner, where allowed). A
 * descriptor the caller owns (outfile_begin_fd) has no temporary name and
 * nothing to rename: the caller decides what a complete file is. Nor has a
 * path that is not a regular file (a FIFO, /dev/null, a terminal): it is
 * written into, not replaced.
 *
 * Small writes gather in a 1 MiB buffer; blocks of a megabyte or more go
 * from the caller's memory to the file in write(2)s of up to 64 MiB, so no
 * file is ever assembled in memory. outfile_put_converted() converts
 * through the buffer (the big-endian conversion's byte swapping).
 *
 * Errors follow error.h: a negative errno code and a message naming the
 * output. Layering: the bottom of the writer; it knows nothing of models,
 * formats or byte order, and calls only error.
 */
#ifndef WC_OUTFILE_H
#define WC_OUTFILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/*
 * An output file being written under a temporary name, or a descriptor
 * the caller owns (outfile_begin_fd: no temporary name, never closed here).
 * Callers read pos (where the next byte goes); the rest is outfile.c's.
 */
struct outfile {
	const char *path; /* the final path (or what the descriptor is), for messages */
	char *tmp;        /* the temporary path; NULL once renamed, for a descriptor, or for a
			   * path that is not a regular file (written into) */
	char *target;     /* what the rename replaces: path, symlinks followed; or NULL */
	int fd;
	int borrowed;     /* 1: fd is the caller's; outfile_abort() leaves it open */
	int live;         /* 1 + the slot naming tmp to outfile_remove_temporaries(); 0: none */
	uint8_t *buf;
	size_t used;
	uint64_t pos;     /* bytes written so far, buffered ones included */
};

/*
 * Starts the output file path: creates a temporary file beside it
 * (".NAME.XXXXXX" in its directory; beside the file a symlink points at,
 * for a link), O_CLOEXEC, with the mode (and owner, where allowed) of the
 * file it replaces, else open()'s 0666 minus the umask, and its buffer.
 * o owns the temporary file's descriptor until outfile_commit() closes it
 * or outfile_abort() closes and unlinks it; path must outlive o. A path
 * that is a FIFO or a device (after symlinks) is opened for writing instead
 * (a FIFO's open waits for a reader, as a shell's redirection does), and
 * outfile_commit() only flushes and closes it; so is a path naming the
 * regular file standard output writes to (/dev/stdout after '>' or '>>'),
 * written through a duplicate of descriptor 1 (its offset and O_APPEND).
 * On failure nothing is left behind and outfile_abort() is still safe.
 */
int outfile_begin(const char *path, struct outfile *o);

/* Whether st (stat(2) of a path) is the file this process's standard
 * output writes to: outfile_begin() writes such a path into, through
 * descriptor 1, and a caller's own messages go to stderr then. */
int outfile_is_stdout(const struct stat *st);

/*
 * Starts writing to the caller's descriptor fd, at its current offset; what
 * names it in messages. Nothing is renamed or synced: outfile_flush()
 * writes the buffer out, and outfile_abort() frees the buffer and leaves fd
 * open. fd stays the caller's whatever happens.
 */
int outfile_begin_fd(int fd, const char *what, struct outfile *o);

/* Appends p[0..n); large blocks bypass the buffer. */
int outfile_put(struct outfile *o, const void *p, uint64_t n);

/* Appends n zero bytes. */
int outfile_zeros(struct outfile *o, uint64_t n);

/* How outfile_put_converted() turns n bytes of src into dst: elements of
 * elem_size bytes, n a multiple of it (writer_swap_elements() is one). */
typedef void outfile_convert_fn(uint8_t *dst, const uint8_t *src, size_t n,
	unsigned elem_size);

/*
 * Appends p[0..n) with each elem_size-byte element converted by convert,
 * through the buffer, never splitting an element between two chunks.
 * elem_size 0 or 1 appends p as it is; n must be a multiple of elem_size.
 */
int outfile_put_converted(struct outfile *o, const uint8_t *p, uint64_t n, unsigned elem_size,
	outfile_convert_fn *convert);

/* Writes out the buffer. */
int outfile_flush(struct outfile *o);

/*
 * Flushes, fsyncs and closes the temporary file and renames it over the
 * output path, then fsyncs the directory so the rename is durable too.
 * Call outfile_abort() afterwards in any case: it frees the buffer, and
 * unlinks the temporary file when the commit failed before the rename.
 */
int outfile_commit(struct outfile *o);

/* Closes and unlinks the temporary file; safe after outfile_commit() and on
 * a zeroed or failed outfile. Leaves a borrowed descriptor open. */
void outfile_abort(struct outfile *o);

/*
 * Unlinks the temporary file of every outfile of this process that is
 * between outfile_begin() and its commit or abort, for a signal handler
 * that then ends the process (SIGINT, SIGTERM, a SIGBUS from an input that
 * shrank): async-signal-safe, it only reads fixed buffers and calls
 * unlink(2). Up to eight files at once are known (OUTFILE_LIVE_SLOTS; more
 * may be written, but are not removed here); a temporary path longer than PATH_MAX
 * cannot be, nor one created relative to a working directory changed
 * since.
 */
void outfile_remove_temporaries(void);

#endif
