/*
 * control_internal.h: what control.c (the socket, connections, line
 * framing, credentials, replies) and control_cmd.c (the dispatcher and the
 * handlers) share. Private to daemon/control*.c; everyone else uses
 * control.h.
 *
 * Everything here runs on the event loop thread.
 */
#ifndef WC_CONTROL_INTERNAL_H
#define WC_CONTROL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"
#include "control.h"
#include "lograte.h"
#include "proto/control_cmds.h"
#include "proto/control_proto.h"

#define CONTROL_READ_CAP (CONTROL_LINE_MAX + 1) /* a maximal line and its '\n' */

struct ctl_conn;

/* A request the registry completes later (load, reload). */
struct ctl_request {
	struct ctl_conn *conn; /* NULL once the connection has closed */
	char command[8];       /* "load", "reload", "pin", "unpin" or "evict", for messages */
	char name[CONFIG_MODEL_NAME_MAX + 1]; /* "" for reload of the configuration */
	struct registry *reg;  /* for a load that added name: forgets it on failure */
	uint64_t new_entry;    /* that entry's entry_id; 0: name was served before */
};

/* One control connection. Its buffer holds what was read and not yet
 * handled: at most one maximal line and its '\n'. */
struct ctl_conn {
	uv_pipe_t pipe;
	uv_shutdown_t shutdown;
	struct control *ctl;
	pid_t pid;
	uid_t uid;
	struct ctl_request *req; /* in flight, or NULL */
	size_t len;              /* bytes in buf */
	bool reading;
	bool eof;                /* the client will send nothing more */
	bool ending;             /* shutting down after the queued replies */
	bool closing;
	bool resume;             /* process buffered lines from the idle callback */
	uint64_t active_ms;      /* accepted, or last request handled (loop time) */
	struct ctl_conn *next, **prevp;
	char buf[CONTROL_READ_CAP + 1];
};

/* How long the listener is not watched after accept(2) failed for another
 * reason than an empty backlog (EMFILE, ENFILE, ENOMEM, ENOBUFS): watched
 * at once, the level-triggered listener would find the same connection
 * waiting and fail again, on every turn of the loop. */
#define CTL_ACCEPT_PAUSE_MS 100
#define CTL_ACCEPTS_PER_WAKEUP 16 /* accepts per wakeup, as the server's */


/* The control socket: the listener and its connections. */
struct control {
	uv_loop_t *loop;
	int listen_fd;           /* the listening socket, ours */
	uv_poll_t listener;      /* watches listen_fd; accept(2) is ours too */
	uv_idle_t idle;          /* resumes connections after a completed request */
	uv_timer_t sweep;        /* closes connections idle past CONTROL_IDLE_TIMEOUT_MS */
	uv_timer_t resume;       /* watches the listener again after a failed accept */
	bool accept_paused;      /* a failed accept was logged; cleared by the next one */
	unsigned handles;        /* open handles; the struct is freed at 0 */
	struct control_context *ctx;
	uint64_t started_ms;
	struct ctl_conn *conns;
	unsigned nconns;         /* in the list: ending ones too */
	bool stopping;
	uint64_t timeouts;       /* connections closed by the sweep */
	uint64_t evicted;        /* idle connections closed to make room for a new one */
	uint64_t refused;        /* connections and requests refused (see control.h) */
	uint64_t accept_pauses;  /* times the listener was left for CTL_ACCEPT_PAUSE_MS */
	struct lograte refusals; /* logs the refusal of a uid once a minute */
};

/* A reply under construction in a memory stream. */
struct ctl_reply {
	FILE *f;
	char *buf;
	size_t len;
};

/* ---- control.c -------------------------------------------------------- */

/* Closes the connection now: pending writes are cancelled, a request in
 * flight loses its way back (its conn pointer is cleared). The memory is
 * freed from the close callback. */
void ctl_conn_close(struct ctl_conn *c);

/* Starts a reply, {"ok":true or {"ok":false, in r; the caller writes more
 * fields to r->f. NULL when out of memory (the caller then closes). */
FILE *ctl_reply_begin(struct ctl_reply *r, bool ok);

/* Closes the object, ends the line and queues it for the client (an
 * out-of-memory error reply instead when the stream failed). */
void ctl_reply_end(struct ctl_conn *c, struct ctl_reply *r);

/* Sends {"ok":false,"error":MESSAGE}. */
void ctl_conn_error(struct ctl_conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Sends {"ok":true,"message":MESSAGE}. */
void ctl_conn_ok(struct ctl_conn *c, const char *message);

/* After the reply to a request the registry completed: has the connection's
 * next buffered line handled from the idle callback. */
void ctl_conn_resume(struct ctl_conn *c);

/*
 * Before a command the registry completes later (load, reload, pin, unpin,
 * evict) runs on c: whether it may. At most CONTROL_MAX_PER_UID - 1 of a
 * uid's connections and CONTROL_MAX_CONNECTIONS - 1 of all have a request
 * in flight, so that a new connection always finds an idle one to push out
 * and status gets in. When it may not, replies with the error and counts
 * the refusal. Closes nothing but (when out of memory) c.
 */
bool ctl_request_room(struct ctl_conn *c, const char *command);

/* Control connections open and served: not those refused, pushed out or
 * finishing their last replies. For status and metrics. */
unsigned ctl_clients(const struct control *ctl);

/* ---- control_cmd.c ---------------------------------------------------- */

/* Handles one request line (len bytes without its '\n'; line has room for
 * len + 1 bytes): replies, or leaves c->req set when the registry will
 * complete the request later. */
void ctl_handle_line(struct ctl_conn *c, char *line, size_t len);

/* A command's handler: argv holds the request's argc words (argv[0] the
 * command), their number already checked against proto/control_cmds.h. It
 * replies exactly once, or leaves c->req for the registry to complete. */
typedef void ctl_handler(struct ctl_conn *c, int argc, char **argv);

/* The handler of command id, NULL for an id out of range. Exposed for the
 * unit test that every command has one. */
ctl_handler *ctl_command_handler(enum control_cmd_id id);

/* Room for any error message of ctl_parse_request(), NUL included. */
#define CTL_REQUEST_ERROR_MAX 256

/*
 * Parses one request line (len bytes without its '\n'; line has room for
 * len + 1 bytes, and is split in place) into words and the command they
 * name, with no I/O: a trailing '\r' is dropped, control_split() makes at
 * most CONTROL_MAX_WORDS words, the first must name a command of
 * proto/control_cmds.h and the number of words after it must be within that
 * command's range. Returns the number of words (at least 1) and the
 * command's id in *command; or -EINVAL with the text
 * of the error reply in err (errlen bytes, CTL_REQUEST_ERROR_MAX is enough):
 * "bad request: REASON", "empty request ...", "CMD: usage: ..." or
 * "unknown command ...". *command is untouched on failure. Exposed for the
 * fuzzer.
 */
int ctl_parse_request(char *line, size_t len, char **words, enum control_cmd_id *command,
	char *err, size_t errlen);

#endif /* WC_CONTROL_INTERNAL_H */
