/*
 * control.h: wcached's control socket, the one wcachectl talks to.
 *
 * A SOCK_STREAM Unix socket (default /run/wcached/control.sock, mode 0600).
 * The protocol is text, so that socat and shell scripts can use it too: the
 * client writes one request line, the daemon answers with one line holding
 * one JSON object, {"ok":true,...} or {"ok":false,"error":"..."}. A
 * connection may send several requests; each gets its reply, in order. A
 * request that takes a while (load, reload) is answered when it completes;
 * requests sent meanwhile wait their turn.
 *
 * A request line is at most CONTROL_LINE_MAX bytes before its '\n' (a
 * trailing '\r' is ignored; the last line may end at EOF instead). It must
 * be UTF-8 without control characters other than tab. Words are separated
 * by spaces or tabs; a word holding spaces, quotes or backslashes is written
 * in double quotes, with \" and \\ inside (wcachectl quotes paths this way).
 * Errors in a line (empty, not UTF-8, a control character, unknown command,
 * wrong arguments) get an error reply and the connection stays open; a line
 * longer than CONTROL_LINE_MAX gets an error reply and the connection is
 * closed.
 *
 * Commands: the table in proto/control_cmds.c (name, words, usage, summary)
 * is the list; control_cmd.c holds a handler for each, and `help` answers
 * with the table.
 *
 * Who may control: the peer's credentials are read at accept (SO_PEERCRED,
 * and SO_PEERGROUPS for supplementary groups). Root, the daemon's own uid
 * and, when control_group is configured, members of that group (primary or
 * supplementary) are served; anyone else gets one error line and is closed
 * (counted in wcached_control_refused_total; logged once a minute per uid).
 *
 * Limits, so that wcachectl always gets in: at most CONTROL_MAX_PER_UID
 * connections of one uid and CONTROL_MAX_CONNECTIONS in all. A connection
 * over either pushes out the one of them idle the longest (an error line,
 * then closed; wcached_control_evicted_total). At most one fewer of them
 * may have a request in flight (load, reload, pin, unpin, evict): one more
 * such request gets an error reply (wcached_control_refused_total), so an
 * idle one is always there to push out, and status, metrics and help, which
 * are answered at once, always get in. A connection whose client has gone
 * (closed its socket, not only shut down its writing) while its request is
 * in flight is closed within a second, or at the next connection: the
 * request goes on, its reply is dropped.
 *
 * Everything here runs on the event loop thread. The process must ignore
 * SIGPIPE: libuv writes replies with write(2), and a client that has gone
 * away makes that fail with EPIPE (the connection is then closed).
 */
#ifndef WC_CONTROL_H
#define WC_CONTROL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "proto/control_proto.h" /* CONTROL_LINE_MAX */
#include "registry.h"
#include "server.h"

#define CONTROL_MAX_CONNECTIONS 64 /* control connections at once */
#define CONTROL_MAX_PER_UID 16     /* control connections of one uid at once */
/* A connection must finish a request line within this long of connecting or
 * of its previous request (and read its replies as fast): else it is
 * closed. A request the daemon is working on (load, reload) has no limit. */
#define CONTROL_IDLE_TIMEOUT_MS 10000
#define CONTROL_MAX_WORDS 8        /* words in a request line */

struct control;

/*
 * What the control socket needs from the daemon. The struct is borrowed:
 * it must outlive the control (main.c keeps it in its daemon struct).
 */
struct control_context {
	struct registry *reg;
	struct server *server;     /* for the client count; may be NULL */
	const struct derive_table *derive; /* derived artifacts, for status; may be NULL */
	const struct memlimit *mem; /* the memory limit in force, for status; may be NULL */
	uint64_t started_ms;       /* uv_now(loop) when the daemon started; 0: when
	                            * control_start() ran */
	/*
	 * "reload" without a model name: re-read the configuration and apply it,
	 * as SIGHUP does. Returns 0 when the reload started, and then calls
	 * done(status, message, 0, done_arg) exactly once when it is over (it may
	 * do so before returning); or returns -errno without calling done (the
	 * message in error_get(), if any). NULL: "reload" without a name is
	 * refused.
	 */
	int (*reload_config)(void *arg, registry_done_fn done, void *done_arg);
	void *arg;                 /* for reload_config */
	uid_t daemon_uid;          /* may control, besides root (geteuid()) */
	int has_group;             /* nonzero: members of group may control */
	gid_t group;               /* control_group resolved */
};

/*
 * Creates, binds and listens on a SOCK_STREAM socket at path with the given
 * mode (0600; 0660 when a control group is configured) and, when group is
 * not (gid_t)-1, gives the socket file that group. The mode and group are
 * set before listen(), so nobody can connect while the file is looser. A
 * stale socket file (nobody accepts on it) is replaced; a live daemon on the
 * same path is -EADDRINUSE; a path that exists and is not a socket is
 * -EEXIST. Returns the fd (O_CLOEXEC, non-blocking) or -errno with the
 * message in error_get(), "control socket PATH: reason".
 */
int control_listen_path(const char *path, mode_t mode, gid_t group);

/*
 * Serves the control protocol on listen_fd, a listening SOCK_STREAM socket
 * (made by control_listen_path() or passed by systemd). The control owns
 * listen_fd from this call on, whether it succeeds or fails. Returns 0 and
 * the control in *out, or -errno with the message in error_get(), "control
 * socket PATH: reason" with the path listen_fd is bound to (-ENOTSOCK or
 * -EPROTOTYPE when listen_fd is not a listening stream socket).
 */
int control_start(uv_loop_t *loop, int listen_fd, struct control_context *ctx,
	struct control **out);

/*
 * Closes the listening socket and every control connection. Requests still
 * running (a load) complete in the registry, but their replies are dropped.
 * Memory is freed from libuv close callbacks: run the loop afterwards.
 * Accepts NULL.
 */
void control_stop(struct control *c);

/*
 * Splits a request line (len bytes, no '\n') into at most max words, in
 * place: words are separated by spaces and tabs, and a word in double quotes
 * may hold anything but control characters, with \" and \\ escaped. Checks
 * that the line is UTF-8 without control characters (tab allowed). Returns
 * the number of words (0 for a blank line), or -EINVAL with a reason in err
 * (errlen bytes). line must have room for len + 1 bytes: words end with NUL.
 * Exposed for the unit tests.
 */
int control_split(char *line, size_t len, char **words, int max, char *err, size_t errlen);

#endif
