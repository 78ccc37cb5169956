/*
 * listen.h: wcached's listening Unix sockets (client and control): taking
 * the ones systemd passes (socket activation: $LISTEN_PID, $LISTEN_FDS and
 * $LISTEN_FDNAMES, the FileDescriptorName= of each socket in the .socket
 * unit), or creating them. Conventions as elsewhere: 0 or a positive count
 * on success, a negative errno-style code with the message in error_get().
 */
#ifndef WC_LISTEN_H
#define WC_LISTEN_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Creates, binds and listens on a non-blocking socket of type (SOCK_STREAM,
 * SOCK_SEQPACKET) at path, with mode and, unless group is (gid_t)-1, that
 * group. A stale socket file (nobody accepts on it) is replaced; a live
 * daemon on the path is -EADDRINUSE; any other file there is -EEXIST.
 * Returns the descriptor, or -errno with the message in error_get(), which
 * begins "WHAT PATH: " (what: "control socket", "client socket").
 */
int listen_unix(const char *what, const char *path, int type, mode_t mode, gid_t group);

/* ---- socket activation ---- */

/* Takes the socket-activated fd whose name in $LISTEN_FDNAMES is name.
 *
 * Returns 1 and stores the fd in *fd when $LISTEN_PID is this process,
 * $LISTEN_FDS counts the fds from 3 on and one of them is called name; the
 * fd is then an AF_UNIX socket of the given type (SOCK_STREAM,
 * SOCK_SEQPACKET or SOCK_DGRAM), listening when the type is connection
 * oriented, and has FD_CLOEXEC set. The caller owns it from then on (its
 * O_NONBLOCK flag is as systemd left it: set it if the event loop needs it).
 * Returns 0 and leaves *fd untouched when there is no activation (LISTEN_PID
 * unset or another process's, LISTEN_FDS unset or 0) or no fd of that name:
 * the caller creates its own socket. Returns -EINVAL when the variables are
 * malformed (a count that does not match the number of names) or the fd is
 * not what it must be (wrong family or type, not listening), -EBADF when the
 * fd is not open; the message names the fd and the variable.
 *
 * When $LISTEN_FDNAMES is unset every fd is called "unknown", as in
 * sd_listen_fds_with_names(). The first fd with a matching name wins.
 *
 * Call it once per name: the environment is left alone so that the daemon
 * can take its client socket and its control socket with two calls. Call
 * listen_fds_unset() after the last one so that child processes do not see
 * the variables. Fds that nobody takes stay open without FD_CLOEXEC; the
 * .socket unit should name exactly the sockets the daemon takes. */
int listen_fds_take(const char *name, int type, int *fd);

/* Most descriptors listen_fds_list() takes (the store's FileDescriptorStoreMax=
 * and the sockets, with room to spare). */
#define LISTEN_FDS_MAX 65536

/* One descriptor passed by the manager, with its name. */
struct listen_fd {
	int fd;     /* 3, 4, ... */
	char *name; /* from $LISTEN_FDNAMES, "unknown" when unset; malloc'd */
};

/*
 * Every descriptor the manager passed, with its name: the sockets of the
 * .socket unit ("client", "control") and, after a restart, what the
 * daemon put in the file descriptor store ("wc-status", "wc-desc",
 * "wc-<slot>-<gen>-..."), which listen_fds_take() cannot list. Returns the
 * count (0 without activation, *list then NULL) and a malloc'd array in
 * *list, in fd order, for listen_fds_free(); each fd is checked open and
 * made FD_CLOEXEC, and from then on belongs to the caller, who closes the
 * ones it does not keep. -EINVAL when the variables are malformed or count
 * more than LISTEN_FDS_MAX, -EBADF
 * when a counted fd is not open (the message names it), -ENOMEM. Leaves
 * the environment alone.
 */
int listen_fds_list(struct listen_fd **list, size_t *n);

/* Frees what listen_fds_list() or listen_fds_parse_all() returned (the
 * names and the array; no descriptor is closed). Accepts NULL. */
void listen_fds_free(struct listen_fd *list, size_t n);

/* Removes LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES from the environment
 * (like sd_listen_fds(1)). Not thread-safe (setenv/unsetenv): call it at
 * start-up. */
void listen_fds_unset(void);

/* The parsers of the variables above, pure functions for the fuzzer and the
 * unit tests; the functions above call them. */

/* Parses the values of $LISTEN_PID, $LISTEN_FDS and $LISTEN_FDNAMES (each
 * NULL when unset) for the process self, with listen_fds_take()'s rules,
 * without looking at any descriptor. Returns 1 and the number of the fd
 * called name (3, 4, ...) in *fd; 0 with *fd untouched when there is no
 * activation for self or no fd of that name; or -EINVAL with the message in
 * error_get() when a value is malformed (LISTEN_PID not a number, LISTEN_FDS
 * not a count, a number of names that is not LISTEN_FDS). */
int listen_fds_parse(const char *pid_s, const char *fds_s, const char *names, const char *name,
	long long self, int *fd);

/* listen_fds_list() without descriptors: the fds that the values name,
 * numbered from 3, with their names, for the process self. Returns the
 * count and the array as listen_fds_list() (0 and NULL without activation
 * for self), or -EINVAL with the message in error_get() when a value is
 * malformed, or -ENOMEM. */
int listen_fds_parse_all(const char *pid_s, const char *fds_s, const char *names,
	long long self, struct listen_fd **list, size_t *n);

#endif
