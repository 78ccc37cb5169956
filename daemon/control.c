/*
 * control.c: the control socket (see control.h for the protocol).
 *
 * The listening socket and each connection are libuv pipes: the control
 * protocol is a plain byte stream and passes no descriptors, so libuv's
 * stream code (reads, queued writes, shutdown) does the work. A connection
 * reads into a fixed buffer of one maximal line and handles one request at
 * a time: while a request waits for the registry (load, reload), the
 * connection is not read, so the lines behind it keep their order and a
 * client cannot make the daemon buffer without bound. Replies are queued
 * with uv_write; a client that does not read its replies stops being read
 * once CONTROL_MAX_QUEUED bytes wait for it.
 *
 * Lifetimes. A connection is freed in its close callback; libuv runs the
 * callbacks of its pending writes and shutdown first (with UV_ECANCELED), so
 * they may still use it. A request the registry completes later is a small
 * struct of its own that points back to the connection; the connection
 * clears that pointer when it closes, so a reply whose client has gone is
 * dropped, never written to freed memory. The registry guarantees one call
 * of the done callback, which frees the request. After a reply to such a
 * request, the next buffered line is handled from an idle callback rather
 * than inside the registry's callback, so no command runs nested inside
 * another's completion.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "control.h"
#include "listen.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "metrics.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13; older headers lack it */
#endif

#define CONTROL_READ_CAP (CONTROL_LINE_MAX + 1) /* a maximal line and its '\n' */
#define CONTROL_MAX_QUEUED (4u << 20)           /* reply bytes waiting for a client */
#define CONTROL_MAX_GROUPS 65536                /* SO_PEERGROUPS entries we accept */

struct ctl_conn;

/* A request the registry completes later (load, reload). */
struct ctl_request {
	struct ctl_conn *conn; /* NULL once the connection has closed */
	char command[8];       /* "load" or "reload", for messages */
	char name[CONFIG_MODEL_NAME_MAX + 1]; /* "" for reload of the configuration */
};

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
	struct ctl_conn *next, **prevp;
	char buf[CONTROL_READ_CAP + 1];
};

struct control {
	uv_loop_t *loop;
	uv_pipe_t listener;
	uv_idle_t idle;          /* resumes connections after a completed request */
	uv_pipe_t spare;         /* accepts and drops a connection when out of memory */
	bool spare_busy;
	unsigned handles;        /* open handles; the struct is freed at 0 */
	struct control_context *ctx;
	uint64_t started_ms;
	struct ctl_conn *conns;
	unsigned nconns;
	bool stopping;
};

/* A reply under construction in a memory stream. */
struct reply {
	FILE *f;
	char *buf;
	size_t len;
};

struct write_req {
	uv_write_t req;
	char *buf;
};

static void conn_process(struct ctl_conn *c);
static void conn_close(struct ctl_conn *c);
static void on_idle(uv_idle_t *idle);

/* ---- lifetimes ---------------------------------------------------------- */

static void
control_handle_closed(uv_handle_t *h)
{
	struct control *ctl = h->data;

	if (h == (uv_handle_t *)&ctl->spare)
		ctl->spare_busy = false;
	if (--ctl->handles == 0)
		free(ctl);
}

static void
conn_free(uv_handle_t *h)
{
	struct ctl_conn *c = h->data;

	free(c);
}

/* Closes the connection now: pending writes are cancelled, a request in
 * flight loses its way back. */
static void
conn_close(struct ctl_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	if (c->req != NULL) {
		c->req->conn = NULL;
		c->req = NULL;
	}
	*c->prevp = c->next;
	if (c->next != NULL)
		c->next->prevp = c->prevp;
	c->ctl->nconns--;
	uv_close((uv_handle_t *)&c->pipe, conn_free);
}

static void
on_shutdown(uv_shutdown_t *req, int status)
{
	conn_close(req->data);
}

/* Closes the connection once every queued reply is written. */
static void
conn_end(struct ctl_conn *c)
{
	if (c->ending || c->closing)
		return;
	c->ending = true;
	if (c->reading) {
		uv_read_stop((uv_stream_t *)&c->pipe);
		c->reading = false;
	}
	c->shutdown.data = c;
	if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->pipe, on_shutdown) < 0)
		conn_close(c);
}

/* ---- replies ------------------------------------------------------------ */

static void
on_written(uv_write_t *req, int status)
{
	struct write_req *w = (struct write_req *)req;
	struct ctl_conn *c = req->data;

	free(w->buf);
	free(w);
	if (c->closing)
		return;
	if (status < 0) {
		log_debug("control: uid %u pid %d: write: %s", (unsigned)c->uid, (int)c->pid,
			uv_strerror(status));
		conn_close(c);
		return;
	}
	/* A throttled connection reads again once its replies drain. */
	if (!c->ending && c->req == NULL)
		conn_process(c);
}

/* Queues buf (len bytes, malloc'd, a whole line) for the client; takes
 * ownership of buf. */
static void
conn_send(struct ctl_conn *c, char *buf, size_t len)
{
	struct write_req *w;
	uv_buf_t b;
	int r;

	if (c->closing || c->ending || (w = malloc(sizeof(*w))) == NULL) {
		free(buf);
		if (!c->closing && !c->ending)
			conn_close(c);
		return;
	}
	w->buf = buf;
	w->req.data = c;
	b = uv_buf_init(buf, (unsigned)len);
	if ((r = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, on_written)) < 0) {
		log_debug("control: uid %u pid %d: write: %s", (unsigned)c->uid, (int)c->pid,
			uv_strerror(r));
		free(buf);
		free(w);
		conn_close(c);
	}
}

/* Starts a reply: {"ok":true or {"ok":false. NULL when out of memory. */
static FILE *
reply_begin(struct reply *r, bool ok)
{
	r->buf = NULL;
	r->len = 0;
	if ((r->f = open_memstream(&r->buf, &r->len)) == NULL)
		return NULL;
	fputs(ok ? "{\"ok\":true" : "{\"ok\":false", r->f);
	return r->f;
}

/* Closes the object, ends the line and sends it. */
static void
reply_end(struct ctl_conn *c, struct reply *r)
{
	static const char oom[] = "{\"ok\":false,\"error\":\"wcached is out of memory\"}\n";
	int bad;

	fputs("}\n", r->f);
	bad = ferror(r->f);
	if (fclose(r->f) != 0 || bad || r->buf == NULL) {
		free(r->buf);
		r->buf = strdup(oom);
		r->len = sizeof(oom) - 1;
		if (r->buf == NULL) {
			conn_close(c);
			return;
		}
	}
	conn_send(c, r->buf, r->len);
}

/* Sends {"ok":false,"error":MESSAGE}. */
static void conn_error(struct ctl_conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void
conn_error(struct ctl_conn *c, const char *fmt, ...)
{
	struct reply r;
	char text[8192]; /* room for a maximal path and its reason */
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (reply_begin(&r, false) == NULL) {
		conn_close(c);
		return;
	}
	fputs(",\"error\":", r.f);
	json_write_string(r.f, text, strlen(text));
	reply_end(c, &r);
}

/* Sends {"ok":true,"message":MESSAGE}. */
static void
conn_ok(struct ctl_conn *c, const char *message)
{
	struct reply r;

	if (reply_begin(&r, true) == NULL) {
		conn_close(c);
		return;
	}
	fputs(",\"message\":", r.f);
	json_write_string(r.f, message, strlen(message));
	reply_end(c, &r);
}

/* The message a registry call left, or strerror when it left none. Call
 * error_set(0, "%s", "") before the call. */
static const char *
registry_message(int err)
{
	const char *m = error_get();

	return m[0] != '\0' ? m : strerror(-err);
}

/* ---- request lines ------------------------------------------------------ */

/*
 * Length of the UTF-8 sequence at s[0..n), or 0 when it is not valid:
 * overlong forms, UTF-16 surrogates and code points above U+10FFFF are
 * invalid, as in RFC 3629.
 */
static size_t
utf8_sequence(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t len;
	uint32_t cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1fu;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0fu;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07u;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3fu);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
		(cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

int
control_split(char *line, size_t len, char **words, int max, char *err, size_t errlen)
{
	const unsigned char *u = (const unsigned char *)line;
	char *p = line, *end = line + len;
	int n = 0;

	for (size_t i = 0; i < len;) {
		size_t k;

		if ((u[i] < 0x20 && u[i] != '\t') || u[i] == 0x7f) {
			snprintf(err, errlen, "control character 0x%02x at byte %zu", u[i], i);
			return -EINVAL;
		}
		if ((k = utf8_sequence(u + i, len - i)) == 0) {
			snprintf(err, errlen, "not UTF-8 text (byte %zu)", i);
			return -EINVAL;
		}
		i += k;
	}
	line[len] = '\0';
	for (;;) {
		char *start, *out;

		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		if (p == end)
			return n;
		if (n == max) {
			snprintf(err, errlen, "more than %d words", max);
			return -EINVAL;
		}
		start = out = p;
		if (*p == '"') {
			for (p++;; p++) {
				if (p == end) {
					snprintf(err, errlen, "unterminated quote at byte %zu",
						(size_t)(start - line));
					return -EINVAL;
				}
				if (*p == '"')
					break;
				if (*p == '\\') {
					if (p + 1 == end || (p[1] != '"' && p[1] != '\\')) {
						snprintf(err, errlen, "bad escape at byte %zu "
							"(only \\\" and \\\\ may follow a backslash)",
							(size_t)(p - line));
						return -EINVAL;
					}
					p++;
				}
				*out++ = *p;
			}
			p++; /* the closing quote */
			if (p < end && *p != ' ' && *p != '\t') {
				snprintf(err, errlen, "no space after the quoted word at byte %zu",
					(size_t)(start - line));
				return -EINVAL;
			}
		} else {
			while (p < end && *p != ' ' && *p != '\t') {
				if (*p == '"' || *p == '\\') {
					snprintf(err, errlen, "'%c' inside a word at byte %zu: quote the "
						"word (\"...\", with \\\" and \\\\)", *p,
						(size_t)(p - line));
					return -EINVAL;
				}
				p++;
			}
			out = p;
		}
		if (p < end)
			p++;
		*out = '\0';
		words[n++] = start[0] == '"' ? start + 1 : start;
	}
}

/* ---- commands ----------------------------------------------------------- */

/* Model names follow the configuration's rule (config.h). */
static bool
valid_model_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > CONFIG_MODEL_NAME_MAX || s[0] == '.' || s[0] == '-')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
			    (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' ||
			    s[i] == '-'))
			return false;
	return true;
}

/* The daemon-wide figures of status and metrics. */
static struct metrics_daemon
daemon_figures(const struct control *ctl)
{
	uint64_t now = uv_now(ctl->loop);

	return (struct metrics_daemon){
		.clients = ctl->ctx->server != NULL ? server_clients(ctl->ctx->server) : 0,
		.control_clients = ctl->nconns,
		.uptime_seconds = now > ctl->started_ms ?
			(double)(now - ctl->started_ms) / 1000.0 : 0.0,
	};
}

static void
write_str_field(FILE *f, const char *key, const char *value)
{
	fprintf(f, ",\"%s\":", key);
	json_write_string(f, value, strlen(value));
}

static void
cmd_status(struct ctl_conn *c, int argc, char **argv)
{
	struct control *ctl = c->ctl;
	struct metrics_daemon daemon = daemon_figures(ctl);
	struct reply r;

	log_debug("control: uid %u pid %d: status", (unsigned)c->uid, (int)c->pid);
	if (reply_begin(&r, true) == NULL) {
		conn_close(c);
		return;
	}
	metrics_status_json(r.f, ctl->ctx->reg, &daemon);
	reply_end(c, &r);
}

static void
cmd_metrics(struct ctl_conn *c, int argc, char **argv)
{
	struct control *ctl = c->ctl;
	struct metrics_daemon daemon = daemon_figures(ctl);
	struct reply r;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	int bad;

	if (f == NULL) {
		conn_error(c, "metrics: out of memory");
		return;
	}
	log_debug("control: uid %u pid %d: metrics", (unsigned)c->uid, (int)c->pid);
	metrics_write(f, ctl->ctx->reg, &daemon);
	bad = ferror(f);
	if (fclose(f) != 0 || bad || text == NULL) {
		free(text);
		conn_error(c, "metrics: out of memory");
		return;
	}
	if (reply_begin(&r, true) == NULL) {
		free(text);
		conn_close(c);
		return;
	}
	fputs(",\"content_type\":\"text/plain; version=0.0.4\",\"text\":", r.f);
	json_write_string(r.f, text, len);
	free(text);
	reply_end(c, &r);
}

/*
 * The registry's answer to a load or reload: replies to the connection if
 * it is still there, then lets the idle callback handle its next line.
 */
static void
request_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct ctl_request *q = arg;
	struct ctl_conn *c = q->conn;
	struct reply r;

	if (c != NULL) {
		c->req = NULL;
		if (status < 0 && q->name[0] != '\0')
			conn_error(c, "%s: model \"%s\": %s", q->command, q->name, message);
		else if (status < 0)
			conn_error(c, "%s: %s", q->command, message);
		else if (reply_begin(&r, true) == NULL)
			conn_close(c);
		else {
			if (q->name[0] != '\0')
				write_str_field(r.f, "model", q->name);
			if (generation > 0)
				fprintf(r.f, ",\"generation\":%" PRIu64, generation);
			write_str_field(r.f, "message", message);
			reply_end(c, &r);
		}
		if (!c->closing) {
			c->resume = true;
			uv_idle_start(&c->ctl->idle, on_idle);
		}
	}
	free(q);
}

/* Makes the request record for an asynchronous command; NULL (and an error
 * reply) when out of memory. */
static struct ctl_request *
request_new(struct ctl_conn *c, const char *command, const char *name)
{
	struct ctl_request *q = calloc(1, sizeof(*q));

	if (q == NULL) {
		conn_error(c, "%s: out of memory", command);
		return NULL;
	}
	q->conn = c;
	snprintf(q->command, sizeof(q->command), "%s", command);
	snprintf(q->name, sizeof(q->name), "%s", name != NULL ? name : "");
	c->req = q;
	return q;
}

/* After an asynchronous call: when it failed without calling done, replies
 * with its error and forgets the request. */
static void
request_started(struct ctl_conn *c, struct ctl_request *q, int err)
{
	if (err >= 0 || c->req != q)
		return; /* queued, or done already ran */
	c->req = NULL;
	conn_error(c, "%s: %s", q->command, registry_message(err)); /* names the model */
	free(q);
}

static int
parse_pin(const char *s, enum pin_mode *out)
{
	if (strcmp(s, "none") == 0)
		*out = PIN_NONE;
	else if (strcmp(s, "metadata") == 0)
		*out = PIN_METADATA;
	else if (strcmp(s, "all") == 0)
		*out = PIN_ALL;
	else
		return -EINVAL;
	return 0;
}

static void
cmd_load(struct ctl_conn *c, int argc, char **argv)
{
	struct registry *reg = c->ctl->ctx->reg;
	const char *name = argv[1], *path = argv[2];
	struct model_entry *m;
	struct ctl_request *q;
	enum pin_mode pin = PIN_METADATA;
	int warm = 1, have_pin = 0;
	char quoted[80];

	if (!valid_model_name(name)) {
		conn_error(c, "load: invalid model name %s: use 1 to %d letters, digits, '.', '_' "
			      "or '-', not starting with '.' or '-'",
			json_quote(quoted, sizeof(quoted), name, strlen(name)),
			CONFIG_MODEL_NAME_MAX);
		return;
	}
	if (path[0] != '/') {
		conn_error(c, "load: PATH must be absolute, not %s",
			json_quote(quoted, sizeof(quoted), path, strlen(path)));
		return;
	}
	if (argc == 4) {
		if (strncmp(argv[3], "pin=", 4) != 0 || parse_pin(argv[3] + 4, &pin) < 0) {
			conn_error(c, "load: bad option %s: use pin=none, pin=metadata or pin=all",
				json_quote(quoted, sizeof(quoted), argv[3], strlen(argv[3])));
			return;
		}
		have_pin = 1;
	}
	/* A model that exists keeps its settings unless told otherwise. */
	if ((m = registry_find(reg, name)) != NULL && strcmp(m->name, name) == 0) {
		if (!have_pin)
			pin = m->pin;
		warm = m->warm;
	}
	log_info("control: uid %u: load \"%s\" from %s (pin %s)", (unsigned)c->uid, name, path,
		pin_mode_name(pin));
	if ((q = request_new(c, "load", name)) == NULL)
		return;
	error_set(0, "%s", "");
	request_started(c, q, registry_load(reg, name, path, pin, warm, request_done, q));
}

static void
cmd_reload(struct ctl_conn *c, int argc, char **argv)
{
	struct control_context *ctx = c->ctl->ctx;
	struct ctl_request *q;
	int err;

	if (argc == 1 && ctx->reload_config == NULL) {
		conn_error(c, "reload: this wcached cannot re-read its configuration; "
			      "use reload NAME");
		return;
	}
	log_info("control: uid %u: reload%s%s", (unsigned)c->uid, argc == 2 ? " " : "",
		argc == 2 ? argv[1] : "");
	if ((q = request_new(c, "reload", argc == 2 ? argv[1] : NULL)) == NULL)
		return;
	error_set(0, "%s", "");
	if (argc == 2)
		err = registry_reload(ctx->reg, argv[1], request_done, q);
	else
		err = ctx->reload_config(ctx->arg, request_done, q);
	request_started(c, q, err);
}

static void
cmd_unload(struct ctl_conn *c, int argc, char **argv)
{
	int err;

	log_info("control: uid %u: unload \"%s\"", (unsigned)c->uid, argv[1]);
	error_set(0, "%s", "");
	if ((err = registry_unload(c->ctl->ctx->reg, argv[1])) < 0) {
		conn_error(c, "unload: %s", registry_message(err));
		return;
	}
	conn_ok(c, "unloaded; clients that hold it keep it until they release it");
}

static void
cmd_pin(struct ctl_conn *c, int argc, char **argv)
{
	bool pin = strcmp(argv[0], "pin") == 0;
	int err;

	log_info("control: uid %u: %s \"%s\"", (unsigned)c->uid, argv[0], argv[1]);
	error_set(0, "%s", "");
	if ((err = registry_pin(c->ctl->ctx->reg, argv[1], pin ? PIN_ALL : PIN_METADATA)) < 0) {
		conn_error(c, "%s: %s", argv[0], registry_message(err));
		return;
	}
	conn_ok(c, pin ? "pinned: every page is locked in memory" :
			 "unpinned: only the index and headers stay locked");
}

static void
cmd_evict(struct ctl_conn *c, int argc, char **argv)
{
	int err;

	log_info("control: uid %u: evict \"%s\"", (unsigned)c->uid, argv[1]);
	error_set(0, "%s", "");
	if ((err = registry_evict(c->ctl->ctx->reg, argv[1])) < 0) {
		conn_error(c, "evict: %s", registry_message(err));
		return;
	}
	conn_ok(c, "evicted: pages no process maps were dropped from the page cache");
}

static void cmd_help(struct ctl_conn *c, int argc, char **argv);

static const struct command {
	const char *name;
	int min_args, max_args; /* words after the command */
	const char *usage;
	const char *summary;
	void (*run)(struct ctl_conn *c, int argc, char **argv);
} commands[] = {
	{ "status", 0, 0, "status", "daemon and per-model state", cmd_status },
	{ "load", 2, 3, "load NAME PATH [pin=none|metadata|all]",
		"serve PATH as NAME, or as NAME's next generation", cmd_load },
	{ "unload", 1, 1, "unload NAME", "stop serving NAME", cmd_unload },
	{ "reload", 0, 1, "reload [NAME]",
		"re-check NAME's files; without NAME re-read the configuration", cmd_reload },
	{ "pin", 1, 1, "pin NAME", "lock every page of NAME in memory", cmd_pin },
	{ "unpin", 1, 1, "unpin NAME", "lock only NAME's index and headers", cmd_pin },
	{ "evict", 1, 1, "evict NAME", "drop NAME's files from the page cache", cmd_evict },
	{ "metrics", 0, 0, "metrics", "Prometheus text exposition, in \"text\"", cmd_metrics },
	{ "help", 0, 0, "help", "this list", cmd_help },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void
cmd_help(struct ctl_conn *c, int argc, char **argv)
{
	struct reply r;

	if (reply_begin(&r, true) == NULL) {
		conn_close(c);
		return;
	}
	fputs(",\"commands\":[", r.f);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		fputs(i ? ",{\"usage\":" : "{\"usage\":", r.f);
		json_write_string(r.f, commands[i].usage, strlen(commands[i].usage));
		write_str_field(r.f, "summary", commands[i].summary);
		fputc('}', r.f);
	}
	fputc(']', r.f);
	reply_end(c, &r);
}

/* Handles one request line (len bytes, no '\n'; line has room for a NUL). */
static void
handle_line(struct ctl_conn *c, char *line, size_t len)
{
	char *words[CONTROL_MAX_WORDS];
	char err[160], quoted[48];
	int n;

	if (len > 0 && line[len - 1] == '\r')
		len--;
	if ((n = control_split(line, len, words, CONTROL_MAX_WORDS, err, sizeof(err))) < 0) {
		conn_error(c, "bad request: %s", err);
		return;
	}
	if (n == 0) {
		conn_error(c, "empty request (try \"help\")");
		return;
	}
	for (size_t i = 0; i < NCOMMANDS; i++) {
		const struct command *cmd = &commands[i];

		if (strcmp(words[0], cmd->name) != 0)
			continue;
		if (n - 1 < cmd->min_args || n - 1 > cmd->max_args) {
			conn_error(c, "%s: usage: %s", cmd->name, cmd->usage);
			return;
		}
		cmd->run(c, n, words);
		return;
	}
	conn_error(c, "unknown command %s (try \"help\")",
		json_quote(quoted, sizeof(quoted), words[0], strlen(words[0])));
}

/* ---- reading ------------------------------------------------------------ */

static void
on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct ctl_conn *c = h->data;

	buf->base = c->buf + c->len;
	buf->len = CONTROL_READ_CAP - c->len;
}

static void
on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct ctl_conn *c = s->data;

	if (nread == UV_EOF) {
		c->eof = true;
		uv_read_stop(s);
		c->reading = false;
	} else if (nread < 0) {
		log_debug("control: uid %u pid %d: read: %s", (unsigned)c->uid, (int)c->pid,
			uv_strerror((int)nread));
		conn_close(c);
		return;
	} else {
		c->len += (size_t)nread;
	}
	conn_process(c);
}

/*
 * Handles the complete lines in the buffer one at a time, until one starts
 * an asynchronous request, the client is slow to read its replies, or the
 * buffer holds no complete line; then reads again, or ends the connection
 * after EOF or an overlong line.
 */
static void
conn_process(struct ctl_conn *c)
{
	char line[CONTROL_READ_CAP + 1];
	bool throttled = false;

	while (!c->closing && !c->ending && c->req == NULL) {
		char *nl = memchr(c->buf, '\n', c->len);
		size_t n, used;

		if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CONTROL_MAX_QUEUED) {
			throttled = true;
			break;
		}
		if (nl != NULL)
			n = (size_t)(nl - c->buf), used = n + 1;
		else if (c->eof && c->len > 0)
			n = used = c->len; /* the last line may end at EOF */
		else
			break;
		memcpy(line, c->buf, n);
		memmove(c->buf, c->buf + used, c->len - used);
		c->len -= used;
		handle_line(c, line, n);
	}
	if (c->closing || c->ending)
		return;
	if (c->req == NULL && c->len == CONTROL_READ_CAP && memchr(c->buf, '\n', c->len) == NULL) {
		log_warnx("control: uid %u pid %d: request longer than %d bytes; closing",
			(unsigned)c->uid, (int)c->pid, CONTROL_LINE_MAX);
		conn_error(c, "request longer than %d bytes", CONTROL_LINE_MAX);
		conn_end(c);
		return;
	}
	if (c->eof && c->len == 0 && c->req == NULL) {
		conn_end(c);
		return;
	}
	if (c->req == NULL && !throttled && !c->eof) {
		if (!c->reading && uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
			c->reading = true;
	} else if (c->reading) {
		uv_read_stop((uv_stream_t *)&c->pipe);
		c->reading = false;
	}
}

/* Runs once per loop iteration while connections wait to be resumed after
 * an asynchronous request. */
static void
on_idle(uv_idle_t *idle)
{
	struct control *ctl = idle->data;
	struct ctl_conn *next;

	uv_idle_stop(idle);
	for (struct ctl_conn *c = ctl->conns; c != NULL; c = next) {
		next = c->next;
		if (c->resume) {
			c->resume = false;
			conn_process(c); /* may close c, never another connection */
		}
	}
}

/* ---- accepting ---------------------------------------------------------- */

/* True when the peer's groups (SO_PEERGROUPS) include group. */
static bool
peer_in_group(int fd, gid_t group)
{
	gid_t small[64], *groups = small;
	socklen_t len = sizeof(small);
	bool found = false;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == -1) {
		if (errno != ERANGE || len == 0 || len > CONTROL_MAX_GROUPS * sizeof(gid_t))
			return false;
		if ((groups = malloc(len)) == NULL)
			return false;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == -1) {
			free(groups);
			return false;
		}
	}
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == group)
			found = true;
	if (groups != small)
		free(groups);
	return found;
}

/* Reads the peer's credentials; returns whether it may control wcached. */
static bool
peer_allowed(struct ctl_conn *c, const struct control_context *ctx)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int fd;

	if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
		getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1 || len != sizeof(cred))
		return false;
	c->pid = cred.pid;
	c->uid = cred.uid;
	if (cred.uid == 0 || cred.uid == ctx->daemon_uid)
		return true;
	return ctx->has_group && (cred.gid == ctx->group || peer_in_group(fd, ctx->group));
}

/* Out of memory for a connection: accepts it into the spare handle and
 * closes it, so the listener keeps accepting. */
static void
drop_connection(struct control *ctl)
{
	if (ctl->spare_busy || uv_pipe_init(ctl->loop, &ctl->spare, 0) < 0)
		return;
	ctl->spare_busy = true;
	ctl->handles++;
	ctl->spare.data = ctl;
	(void)uv_accept((uv_stream_t *)&ctl->listener, (uv_stream_t *)&ctl->spare);
	uv_close((uv_handle_t *)&ctl->spare, control_handle_closed);
}

static void
on_connection(uv_stream_t *listener, int status)
{
	struct control *ctl = listener->data;
	struct ctl_conn *c;
	int r;

	if (status < 0) {
		log_warnx("control: accept: %s", uv_strerror(status));
		return;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		log_warnx("control: out of memory; dropping a connection");
		drop_connection(ctl);
		return;
	}
	c->ctl = ctl;
	c->uid = (uid_t)-1;
	c->pid = -1;
	uv_pipe_init(ctl->loop, &c->pipe, 0);
	c->pipe.data = c;
	c->next = ctl->conns;
	if (ctl->conns != NULL)
		ctl->conns->prevp = &c->next;
	c->prevp = &ctl->conns;
	ctl->conns = c;
	ctl->nconns++;
	if ((r = uv_accept(listener, (uv_stream_t *)&c->pipe)) < 0) {
		log_warnx("control: accept: %s", uv_strerror(r));
		conn_close(c);
		return;
	}
	if (!peer_allowed(c, ctl->ctx)) {
		log_warnx("control: refused uid %d pid %d: only root, uid %u%s may control "
			  "wcached", (int)c->uid, (int)c->pid, (unsigned)ctl->ctx->daemon_uid,
			ctl->ctx->has_group ? " and members of control_group" : "");
		conn_error(c, "permission denied: uid %d may not control wcached (root, uid %u%s "
			      "may)", (int)c->uid, (unsigned)ctl->ctx->daemon_uid,
			ctl->ctx->has_group ? " and members of control_group" : "");
		conn_end(c);
		return;
	}
	if (ctl->nconns > CONTROL_MAX_CONNECTIONS) {
		log_warnx("control: refused uid %u pid %d: %d control connections open",
			(unsigned)c->uid, (int)c->pid, CONTROL_MAX_CONNECTIONS);
		conn_error(c, "too many control connections (%d)", CONTROL_MAX_CONNECTIONS);
		conn_end(c);
		return;
	}
	conn_process(c);
}

/* ---- the public functions ------------------------------------------------ */

int
control_listen_path(const char *path, mode_t mode, gid_t group)
{
	return listen_unix(path, SOCK_STREAM, mode, group);
}

int
control_start(uv_loop_t *loop, int listen_fd, struct control_context *ctx,
	struct control **out)
{
	struct control *ctl;
	int type = 0, listening = 0, r;
	socklen_t len = sizeof(type);

	if (getsockopt(listen_fd, SOL_SOCKET, SO_TYPE, &type, &len) == -1) {
		r = -errno;
		close(listen_fd);
		return error_set(r, "control socket: %s", strerror(-r));
	}
	len = sizeof(listening);
	if (type != SOCK_STREAM ||
		getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == -1 ||
		!listening) {
		close(listen_fd);
		return error_set(-EPROTOTYPE, "control socket: not a listening stream socket");
	}
	if ((ctl = calloc(1, sizeof(*ctl))) == NULL) {
		close(listen_fd);
		return error_set(-ENOMEM, "control socket: out of memory");
	}
	ctl->loop = loop;
	ctl->ctx = ctx;
	ctl->started_ms = ctx->started_ms != 0 ? ctx->started_ms : uv_now(loop);
	uv_pipe_init(loop, &ctl->listener, 0);
	uv_idle_init(loop, &ctl->idle);
	ctl->listener.data = ctl->idle.data = ctl;
	ctl->handles = 2;
	if ((r = uv_pipe_open(&ctl->listener, listen_fd)) < 0 ||
		(r = uv_listen((uv_stream_t *)&ctl->listener, SOMAXCONN, on_connection)) < 0) {
		/* uv_pipe_open took the fd only when it succeeded. */
		if (uv_fileno((uv_handle_t *)&ctl->listener, &(int){ 0 }) < 0)
			close(listen_fd);
		ctl->stopping = true;
		uv_close((uv_handle_t *)&ctl->listener, control_handle_closed);
		uv_close((uv_handle_t *)&ctl->idle, control_handle_closed);
		return error_set(r, "control socket: %s", uv_strerror(r));
	}
	*out = ctl;
	return 0;
}

void
control_stop(struct control *ctl)
{
	if (ctl == NULL || ctl->stopping)
		return;
	ctl->stopping = true;
	while (ctl->conns != NULL)
		conn_close(ctl->conns);
	uv_close((uv_handle_t *)&ctl->listener, control_handle_closed);
	uv_close((uv_handle_t *)&ctl->idle, control_handle_closed);
}
