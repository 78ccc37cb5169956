/*
 * testutil.h: helpers shared by the unit tests: temporary directories and
 * files, and byte buffers for building hostile inputs.
 */
#ifndef WC_TESTUTIL_H
#define WC_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Sizes in bytes, of type size_t, so that a product such as 4 * MiB is
 * computed in size_t (clang-tidy's bugprone-implicit-widening-of-
 * multiplication-result), never in int or unsigned. */
#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* Creates a fresh temporary directory; returns its malloc'd path. */
char *tu_tmpdir(void);

/* Removes a directory tree created by tu_tmpdir(); frees path. */
void tu_rmtree(char *path);

/* A cmocka fixture of a fresh temporary directory: tu_dir_setup() sets
 * *state to a calloc'd struct tu_dir whose dir tu_tmpdir() made (path NULL,
 * fds what tu_count_fds() counted then); tu_dir_teardown() removes the
 * directory and frees path and the struct. */
struct tu_dir {
	char *dir;  /* the directory, removed by tu_dir_teardown() */
	char *path; /* a file the test keeps in dir (malloc'd), or NULL */
	int fds;    /* this process's open descriptors at setup */
};
int tu_dir_setup(void **state);
int tu_dir_teardown(void **state);

/* Writes len bytes to dir/name; returns the malloc'd full path. */
char *tu_write(const char *dir, const char *name, const void *data, size_t len);

/* Builds a safetensors file image from a JSON header string (no padding):
 * 8-byte length, header, then data_len bytes of data (pattern i & 0xff).
 * Returns a malloc'd buffer of *len bytes. */
uint8_t *tu_safetensors(const char *header, size_t data_len, size_t *len);

/* Counts the entries of dir but . and ..; -1 when it cannot be read. */
int tu_count_entries(const char *dir);

/* Counts this process's open descriptors. */
int tu_count_fds(void);

/* 1 when fd is an open, read-only, close-on-exec descriptor of the file
 * other is open on (the same device and inode), else 0. */
int tu_fd_is_readonly_of(int fd, int other);

/* Seconds on the monotonic clock, for intervals. */
double tu_now(void);

/* Linux: the most descriptors one sendmsg() carries (SCM_MAX_FD). */
#define TU_SCM_MAX_FD 253

/* Sends len bytes and n (at most TU_SCM_MAX_FD) descriptors with a raw
 * sendmsg(), bypassing fdp_send()'s checks, as a hostile peer would. */
ssize_t tu_raw_send(int sock, const void *buf, size_t len, const int *fds, size_t n);

#endif
