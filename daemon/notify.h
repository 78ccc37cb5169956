/*
 * notify.h: the two systemd service protocols wcached speaks, implemented
 * directly (no libsystemd):
 *
 * - sd_notify: state strings ("READY=1", "RELOADING=1", "STOPPING=1",
 *   "STATUS=...") sent as datagrams to the AF_UNIX socket named by
 *   $NOTIFY_SOCKET. A value starting with '/' is a filesystem socket; one
 *   starting with '@' is an abstract socket (the '@' stands for the leading
 *   NUL byte; the name's length is exact, with no trailing NUL). Anything else
 *   is an error.
 *
 * - socket activation: the listening sockets systemd passes as fds 3, 4, ...
 *   described by $LISTEN_PID, $LISTEN_FDS and $LISTEN_FDNAMES (the
 *   FileDescriptorName= of each socket in the .socket unit): listen.h.
 *
 * Conventions as elsewhere: 0 or a positive count on success, a negative
 * errno-style code on failure with the message in error_get(). No function
 * here logs.
 */
#ifndef WC_NOTIFY_H
#define WC_NOTIFY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "proto/fdpass.h"

/* Longest state string notify_send() sends, in bytes (systemd reads at most
 * this much of each datagram). */
#define NOTIFY_MAX_MESSAGE 4096

/* Reads $NOTIFY_SOCKET and opens the datagram socket used by notify_send()
 * (SOCK_CLOEXEC; owned by this module until notify_close()). Returns 1 when
 * notifications will be sent, 0 when $NOTIFY_SOCKET is unset or empty (not
 * run by systemd, or Type= is not notify: notify_send() does nothing), or
 * -EINVAL when the value is not a usable address (relative, too long for
 * sun_path, "@" alone), or the error of socket(). Calling it again closes the
 * previous socket first. The variable is left in the environment. Call it
 * before starting threads. */
int notify_init(void);

/* Formats the whole state string, e.g. notify_send("READY=1\nSTATUS=serving
 * %zu models", n), and sends it as one datagram with sendmsg(MSG_NOSIGNAL).
 * Never blocks: when the manager's queue is full, or something kept waits,
 * the datagram is kept for notify_flush() (notify.c says in what order):
 * a state change in order, in a queue of 8; a STATUS=-only one replaces the
 * STATUS= kept before it, which counts as dropped. READY=1 and STOPPING=1
 * are never dropped: with the queue full they wait as flags, sent after it
 * (the rest of their datagram is dropped), and until they have gone any
 * other state change is dropped rather than sent before them.
 * Returns 1 when sent, 2 when kept, 0 when notifications are off
 * (notify_init() returned 0 or was not called), -EMSGSIZE when the string is
 * longer than NOTIFY_MAX_MESSAGE, -EAGAIN when it had to be dropped (8 state
 * changes wait already, or READY=1 or STOPPING=1 does), -ENOMEM, or the
 * error of sendmsg() (for example -ECONNREFUSED when the manager is gone).
 * Safe to call from any thread. */
int notify_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Sends what notify_send() and notify_remove_fds() kept, as far as the
 * manager reads. Returns 1 when nothing waits any more, 0 when something
 * still does (call again later), or a negative errno when a send failed
 * otherwise than with a full queue (that datagram is dropped and counted;
 * the others were still tried). Never blocks. */
int notify_flush(void);

/* notify_flush() until nothing waits or timeout_ms passed: for shutdown,
 * so STOPPING=1 reaches a manager that is merely slow. Blocks. */
int notify_flush_wait(int timeout_ms);

/* Datagrams dropped so far (STATUS= replaced by a newer one, a state
 * change that found the queue full, what a READY=1 or STOPPING=1 kept as
 * a flag said besides, a kept one whose send failed, or one there was no
 * memory to keep). */
uint64_t notify_dropped_count(void);

/* Closes the notification socket and forgets what waits; notify_send()
 * becomes a no-op. */
void notify_close(void);

/* Longest FDNAME= systemd takes. */
#define NOTIFY_MAX_FDNAME 255

/* Whether s (len bytes) is a valid FDNAME=: 1 to NOTIFY_MAX_FDNAME bytes of
 * printable ASCII other than ':' (systemd's fdname_is_valid(), and ':'
 * separates the names in $LISTEN_FDNAMES). 1 or 0. */
int notify_fdname_valid(const char *s, size_t len);

/* Most descriptors one notify_store_fds() passes (the kernel's SCM_MAX_FD). */
#define NOTIFY_MAX_STORE_FDS ((int)FDP_MAX_FDS)

/*
 * Hands fds[0 .. n) to the manager's file descriptor store under name
 * ("FDSTORE=1\nFDNAME=name" with SCM_RIGHTS, sd_pid_notify_with_fds(3)):
 * systemd keeps them across restarts of the service and passes them back
 * in $LISTEN_FDS/$LISTEN_FDNAMES (the unit needs FileDescriptorStoreMax=).
 * The manager receives its own copies; fds stay the caller's. name must be
 * a valid FDNAME (1 to 255 printable ASCII bytes, no ':'); n 1 to
 * NOTIFY_MAX_STORE_FDS.
 *
 * Never blocks, and never queues: a descriptor that waited in our queue
 * could be closed or reused by its owner before it went, so when the
 * manager's queue is full this returns -EAGAIN and the caller decides
 * (log it and try again later, or store nothing: a restart then loads that
 * generation afresh). Whatever was kept (notify_flush) goes first, and
 * while some of it still waits this is -EAGAIN too: a removal of name
 * asked before never reaches the manager after the store and removes it.
 * Returns 1 when sent, 0 when notifications are off, -EINVAL for a bad
 * name or count, -EAGAIN, or the error of sendmsg(). Safe to call from
 * any thread.
 */
int notify_store_fds(const char *name, const int *fds, size_t n);

/* Asks the manager to close every descriptor it stores under name
 * ("FDSTOREREMOVE=1\nFDNAME=name"). Never dropped for a full queue: when
 * the manager does not read, or something kept waits, it is kept in a list
 * of its own, in order and as long as it takes (one per name ever stored,
 * at most), and notify_flush() sends it (before any later
 * notify_store_fds()). Returns 1 when sent, 2 when kept, 0 when
 * notifications are off, -EINVAL for a bad name, -ENOMEM (not kept), or
 * the error of sendmsg() other than a full queue (not sent). Safe to call
 * from any thread. */
int notify_remove_fds(const char *name);

/* The parser of the variable above, a pure function for the fuzzer and the
 * unit tests; notify_init() calls it. */

/* Parses a $NOTIFY_SOCKET value ("/path" or "@abstract") into a socket
 * address and its exact length for sendmsg(). Returns 0, or -EINVAL with the
 * message in error_get() (relative, "@" alone, too long for sun_path); addr
 * and *len are untouched on failure. */
int notify_parse_address(const char *value, struct sockaddr_un *addr, socklen_t *len);

#endif /* WC_NOTIFY_H */
