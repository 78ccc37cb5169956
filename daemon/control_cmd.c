/*
 * control_cmd.c: the commands of the control socket (see control.h for the
 * protocol): the dispatcher, and one handler per command that checks
 * its words, calls the registry and writes the reply. The commands, their
 * argument counts and their usage are the table of proto/control_cmds.h;
 * this file holds a handler for each.
 *
 * control.c owns the socket and the connections and hands each request line
 * to ctl_handle_line(). A handler replies exactly once, with
 * ctl_conn_error(), ctl_conn_ok() or ctl_reply_begin()/ctl_reply_end(),
 * except for load, reload, pin, unpin and evict: the registry completes
 * those later (pin, unpin and evict once their page work has ended), so they
 * leave a struct ctl_request on the connection, and request_done() replies
 * when the registry calls it (or drops the reply when the connection has
 * closed meanwhile), then lets control.c read the connection's next line.
 * ctl_handle_line() lets those five start only while control.c's
 * ctl_request_room() says a place stays free for status.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "control_internal.h"
#include "derive.h"
#include "base/error.h"
#include "base/json.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "proto/control_cmds.h"

/* ---- helpers ------------------------------------------------------------ */

/* The message a registry call left, or strerror when it left none. Call
 * error_set(0, "%s", "") before the call. */
static const char *
registry_message(int err)
{
	const char *m = error_get();

	return m[0] != '\0' ? m : strerror(-err);
}

/* The daemon-wide figures of status and metrics. */
static struct metrics_daemon
daemon_figures(const struct control *ctl)
{
	uint64_t now = uv_now(ctl->loop);

	struct metrics_daemon d = {
		.clients = ctl->ctx->server != NULL ? server_clients(ctl->ctx->server) : 0,
		.control_clients = ctl_clients(ctl),
		.uptime_seconds = now > ctl->started_ms ?
			(double)(now - ctl->started_ms) / 1000.0 : 0.0,
		.control_timeouts = ctl->timeouts,
		.control_evicted = ctl->evicted,
		.control_refused = ctl->refused,
		.control_accept_pauses = ctl->accept_pauses,
		.control_accept_pause_ms = CTL_ACCEPT_PAUSE_MS,
		.notify_dropped = notify_dropped_count(),
		.derive = ctl->ctx->derive,
		.mem = ctl->ctx->mem,
	};

	if (ctl->ctx->server != NULL)
		server_get_stats(ctl->ctx->server, &d.server);
	return d;
}

/* ---- commands ----------------------------------------------------------- */

/* Status and metrics report each model's residency as last measured (off
 * the loop, after every page operation and every 5 s); a figure this old
 * is measured again after the reply, for the next request. */
#define CTL_RESIDENT_MAX_AGE_MS 250

/* status: the daemon's figures and every model's state, as JSON (metrics.c
 * writes it). */
static void
cmd_status(struct ctl_conn *c, int argc, char **argv)
{
	struct control *ctl = c->ctl;
	struct metrics_daemon daemon = daemon_figures(ctl);
	struct ctl_reply r;

	log_debug("control: uid %u pid %d: status", (unsigned)c->uid, (int)c->pid);
	if (ctl_reply_begin(&r, true) == NULL) {
		ctl_conn_close(c);
		return;
	}
	metrics_status_json(r.f, ctl->ctx->reg, &daemon);
	ctl_reply_end(c, &r);
	registry_refresh_residency(ctl->ctx->reg, CTL_RESIDENT_MAX_AGE_MS);
}

/* metrics: the Prometheus text exposition, as a string in "text". */
static void
cmd_metrics(struct ctl_conn *c, int argc, char **argv)
{
	struct control *ctl = c->ctl;
	struct metrics_daemon daemon = daemon_figures(ctl);
	struct ctl_reply r;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	int bad;

	if (f == NULL) {
		ctl_conn_error(c, "metrics: out of memory");
		return;
	}
	log_debug("control: uid %u pid %d: metrics", (unsigned)c->uid, (int)c->pid);
	metrics_write(f, ctl->ctx->reg, &daemon);
	registry_refresh_residency(ctl->ctx->reg, CTL_RESIDENT_MAX_AGE_MS);
	bad = ferror(f);
	if (fclose(f) != 0 || bad || text == NULL) {
		free(text);
		ctl_conn_error(c, "metrics: out of memory");
		return;
	}
	if (ctl_reply_begin(&r, true) == NULL) {
		free(text);
		ctl_conn_close(c);
		return;
	}
	fputs(",\"content_type\":\"text/plain; version=0.0.4\",\"text\":", r.f);
	json_write_string(r.f, text, len);
	free(text);
	ctl_reply_end(c, &r);
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
	struct ctl_reply r;
	/* A runtime load of a new name that failed leaves nothing behind: no
	 * model in status and metrics that was never served. Said only when
	 * this removed it: an unload may have (its message says so), or a
	 * newer load now owns the entry. */
	bool forgotten = status < 0 && q->new_entry != 0 &&
		registry_forget(q->reg, q->name, q->new_entry) == 0;

	if (forgotten)
		log_info("model \"%s\": not added, its load failed", q->name);
	if (c != NULL) {
		c->req = NULL;
		if (forgotten)
			ctl_conn_error(c, "%s: model \"%s\": %s; the model was not added",
				q->command, q->name, message);
		else if (status < 0 && q->name[0] != '\0')
			ctl_conn_error(c, "%s: model \"%s\": %s", q->command, q->name, message);
		else if (status < 0)
			ctl_conn_error(c, "%s: %s", q->command, message);
		else if (ctl_reply_begin(&r, true) == NULL)
			ctl_conn_close(c);
		else {
			if (q->name[0] != '\0')
				json_write_field(r.f, "model", q->name);
			if (generation > 0)
				fprintf(r.f, ",\"generation\":%" PRIu64, generation);
			if (strcmp(q->command, "load") == 0) {
				/* Runtime changes are not written anywhere: say so. */
				char text[512];

				snprintf(text, sizeof(text), "%s; until wcached restarts (add the "
					 "model to the configuration file to keep it)", message);
				fputs(",\"persistent\":false", r.f);
				json_write_field(r.f, "message", text);
			} else {
				json_write_field(r.f, "message", message);
			}
			ctl_reply_end(c, &r);
		}
		ctl_conn_resume(c);
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
		ctl_conn_error(c, "%s: out of memory", command);
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
	ctl_conn_error(c, "%s: %s", q->command, registry_message(err)); /* names the model */
	free(q);
}

/* load NAME PATH [pin=...]: serves PATH as NAME, or as NAME's next
 * generation; answered when the registry has validated PATH. */
static void
cmd_load(struct ctl_conn *c, int argc, char **argv)
{
	struct registry *reg = c->ctl->ctx->reg;
	const char *name = argv[1], *path = argv[2];
	struct model_entry *m;
	struct ctl_request *q;
	enum pin_mode pin = PIN_METADATA;
	int warm = 1, have_pin = 0, err;
	bool existed = false;
	char quoted[80];

	if (!model_name_valid(name)) {
		ctl_conn_error(c, "load: invalid model name %s: use 1 to %d letters, digits, "
				  "'.', '_' or '-', not starting with '.' or '-'",
			json_quote(quoted, sizeof(quoted), name, strlen(name)),
			CONFIG_MODEL_NAME_MAX);
		return;
	}
	if (path[0] != '/') {
		ctl_conn_error(c, "load: PATH must be absolute, not %s",
			json_quote(quoted, sizeof(quoted), path, strlen(path)));
		return;
	}
	if (argc == 4) {
		if (strncmp(argv[3], "pin=", 4) != 0 || pin_mode_parse(argv[3] + 4, &pin) < 0) {
			ctl_conn_error(c,
				"load: bad option %s: use pin=none, pin=metadata or pin=all",
				json_quote(quoted, sizeof(quoted), argv[3], strlen(argv[3])));
			return;
		}
		have_pin = 1;
	}
	/* A model that exists keeps its settings unless told otherwise. */
	if ((m = registry_find(reg, name)) != NULL && strcmp(m->name, name) == 0) {
		existed = true;
		if (!have_pin)
			pin = m->pin;
		warm = m->warm;
	}
	log_info("control: uid %u: load \"%s\" from %s (pin %s)", (unsigned)c->uid, name, path,
		pin_mode_name(pin));
	if ((q = request_new(c, "load", name)) == NULL)
		return;
	error_set(0, "%s", "");
	err = registry_load(reg, name, path, pin, warm, request_done, q);
	/* The load added name: remember which entry, to forget it if it fails
	 * (q is still ours: the registry answers later, never from the call). */
	if (err >= 0 && c->req == q && !existed && (m = registry_find(reg, name)) != NULL &&
		strcmp(m->name, name) == 0) {
		q->reg = reg;
		q->new_entry = m->entry_id;
	}
	request_started(c, q, err);
}

/* reload [NAME]: re-checks NAME's files, or re-reads the configuration;
 * answered when the reload is over. */
static void
cmd_reload(struct ctl_conn *c, int argc, char **argv)
{
	struct control_context *ctx = c->ctl->ctx;
	struct ctl_request *q;
	int err;

	if (argc == 1 && ctx->reload_config == NULL) {
		ctl_conn_error(c, "reload: this wcached cannot re-read its configuration; "
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

/* unload NAME: stops serving NAME. */
static void
cmd_unload(struct ctl_conn *c, int argc, char **argv)
{
	int err;

	log_info("control: uid %u: unload \"%s\"", (unsigned)c->uid, argv[1]);
	error_set(0, "%s", "");
	if ((err = registry_unload(c->ctl->ctx->reg, argv[1])) < 0) {
		ctl_conn_error(c, "unload: %s", registry_message(err));
		return;
	}
	ctl_conn_ok(c, "unloaded; clients that hold it keep it until they release it");
}

/*
 * The registry's answer to pin, unpin or evict once their page work has
 * ended: what it left, from the model's current generation (the residency
 * figure each page operation measures as it ends), so that a status right
 * after the reply shows the same.
 */
static void
pages_done(int status, const char *message, uint64_t generation, void *arg)
{
	struct ctl_request *q = arg;
	struct ctl_conn *c = q->conn;
	const struct model_entry *m;
	const struct generation *g;
	struct ctl_reply r;
	uint64_t resident = 0, bytes = 0;
	char text[256];

	if (c == NULL) {
		free(q);
		return;
	}
	c->req = NULL;
	m = registry_find(c->ctl->ctx->reg, q->name);
	if ((g = m != NULL ? m->current : NULL) != NULL) {
		resident = g->resident.bytes;
		bytes = g->bytes;
	}
	if (status < 0) {
		ctl_conn_error(c, "%s: model \"%s\": %s", q->command, q->name, message);
	} else if (ctl_reply_begin(&r, true) == NULL) {
		ctl_conn_close(c);
	} else {
		if (strcmp(q->command, "evict") == 0 && resident >= bytes)
			snprintf(text, sizeof(text), "nothing evicted: all %" PRIu64 " bytes stay "
				 "resident (a process maps or locks them: another model of the "
				 "same file, or workers); status shows it ready while they stay",
				 bytes);
		else if (strcmp(q->command, "evict") == 0)
			snprintf(text, sizeof(text), "evicted: %" PRIu64 " of %" PRIu64
				 " bytes still resident (pages a process maps or locks stay)",
				 resident, bytes);
		else if (strcmp(q->command, "pin") == 0)
			snprintf(text, sizeof(text), "pinned: every page is locked in memory "
				 "(%" PRIu64 " of %" PRIu64 " bytes resident)", resident, bytes);
		else
			snprintf(text, sizeof(text), "unpinned: only the index and headers stay "
				 "locked (%" PRIu64 " of %" PRIu64 " bytes resident)", resident,
				 bytes);
		json_write_field(r.f, "model", q->name);
		fprintf(r.f, ",\"generation\":%" PRIu64 ",\"resident_bytes\":%" PRIu64, generation,
			resident);
		json_write_field(r.f, "message", text);
		ctl_reply_end(c, &r);
	}
	ctl_conn_resume(c);
	free(q);
}

/* Answers c's pin, unpin or evict of name when its page work has ended. */
static void
wait_pages(struct ctl_conn *c, const char *command, const char *name)
{
	struct ctl_request *q = request_new(c, command, name);

	if (q == NULL)
		return;
	error_set(0, "%s", "");
	request_started(c, q, registry_pages_wait(c->ctl->ctx->reg, name, pages_done, q));
}

/* pin NAME, unpin NAME: locks every page of NAME, or only its metadata;
 * answered when the locking is done. */
static void
cmd_pin(struct ctl_conn *c, int argc, char **argv)
{
	bool pin = strcmp(argv[0], "pin") == 0;
	int err;

	log_info("control: uid %u: %s \"%s\"", (unsigned)c->uid, argv[0], argv[1]);
	error_set(0, "%s", "");
	if ((err = registry_pin(c->ctl->ctx->reg, argv[1], pin ? PIN_ALL : PIN_METADATA)) < 0) {
		ctl_conn_error(c, "%s: %s", argv[0], registry_message(err));
		return;
	}
	wait_pages(c, argv[0], argv[1]);
}

/* evict NAME: drops NAME's files from the page cache; answered when the
 * pages are gone. */
static void
cmd_evict(struct ctl_conn *c, int argc, char **argv)
{
	int err;

	log_info("control: uid %u: evict \"%s\"", (unsigned)c->uid, argv[1]);
	error_set(0, "%s", "");
	if ((err = registry_evict(c->ctl->ctx->reg, argv[1])) < 0) {
		ctl_conn_error(c, "evict: %s", registry_message(err));
		return;
	}
	wait_pages(c, "evict", argv[1]);
}

/* drop NAME [KEY]: drops NAME's derived artifacts (derive_drop): those
 * nobody holds now, held ones when their last holder releases them; builds
 * in progress are left alone, and the reply says so. */
static void
cmd_drop(struct ctl_conn *c, int argc, char **argv)
{
	struct derive_table *t = c->ctl->ctx->reg->derive_owner;
	const char *key = argc > 2 ? argv[2] : NULL;
	int served = registry_find(c->ctl->ctx->reg, argv[1]) != NULL;
	struct derive_dropped d = { 0 };
	char quoted[2 * WIRE_MAX_KEY + 8], text[320];
	int n, err;

	log_info("control: uid %u: drop \"%s\"%s%s", (unsigned)c->uid, argv[1],
		key != NULL ? " " : "", key != NULL ? key : "");
	err = t != NULL ? derive_drop(t, argv[1], key, &d) : key != NULL ? -ENOENT : 0;
	if (!served && d.dropped + d.held + d.building == 0) {
		ctl_conn_error(c, "drop: no model \"%s\" is served", argv[1]);
		return;
	}
	if (err < 0 && key != NULL) {
		ctl_conn_error(c, "drop: model \"%s\" has no derived artifact or build of key %s",
			argv[1], json_quote(quoted, sizeof(quoted), key, strlen(key)));
		return;
	}
	n = snprintf(text, sizeof(text), "dropped %u derived artifact%s", d.dropped + d.held,
		d.dropped + d.held == 1 ? "" : "s");
	if (d.held > 0)
		n += snprintf(text + n, sizeof(text) - (size_t)n, " (%u of them still held by "
			      "workers: %s when released)", d.held,
			d.held == 1 ? "it goes" : "they go");
	if (d.building > 0)
		snprintf(text + n, sizeof(text) - (size_t)n, "; %u build%s in progress left "
			 "alone: what %s publishes is served", d.building,
			d.building == 1 ? "" : "s", d.building == 1 ? "it" : "they");
	ctl_conn_ok(c, text);
}

/* help: each command's usage and summary, from the table of
 * proto/control_cmds.h. */
static void
cmd_help(struct ctl_conn *c, int argc, char **argv)
{
	struct ctl_reply r;
	char usage[128];

	if (ctl_reply_begin(&r, true) == NULL) {
		ctl_conn_close(c);
		return;
	}
	fputs(",\"commands\":[", r.f);
	for (int id = 0; id < CONTROL_CMD_COUNT; id++) {
		int n = control_cmd_usage(&control_cmds[id], usage, sizeof(usage));

		fputs(id ? ",{\"usage\":" : "{\"usage\":", r.f);
		json_write_string(r.f, usage,
			n < (int)sizeof(usage) ? (size_t)n : sizeof(usage) - 1);
		json_write_field(r.f, "summary", control_cmds[id].summary);
		fputc('}', r.f);
	}
	fputc(']', r.f);
	ctl_reply_end(c, &r);
}

/* The handler of each command of proto/control_cmds.h, indexed by its id:
 * a command the table gains without a handler here fails to compile (the
 * size) or the unit test (a gap). */
static ctl_handler *const handlers[] = {
	[CONTROL_CMD_STATUS] = cmd_status,
	[CONTROL_CMD_LOAD] = cmd_load,
	[CONTROL_CMD_UNLOAD] = cmd_unload,
	[CONTROL_CMD_RELOAD] = cmd_reload,
	[CONTROL_CMD_PIN] = cmd_pin,
	[CONTROL_CMD_UNPIN] = cmd_pin,
	[CONTROL_CMD_EVICT] = cmd_evict,
	[CONTROL_CMD_DROP] = cmd_drop,
	[CONTROL_CMD_METRICS] = cmd_metrics,
	[CONTROL_CMD_HELP] = cmd_help,
};

_Static_assert(sizeof(handlers) / sizeof(handlers[0]) == CONTROL_CMD_COUNT,
	"one handler per command of proto/control_cmds.h");

/* The commands whose handler leaves a request for the registry to complete
 * (struct ctl_request): each is let run only while ctl_request_room() says
 * there is room, checked before it changes anything. */
static const bool completed_later[CONTROL_CMD_COUNT] = {
	[CONTROL_CMD_LOAD] = true,
	[CONTROL_CMD_RELOAD] = true,
	[CONTROL_CMD_PIN] = true,
	[CONTROL_CMD_UNPIN] = true,
	[CONTROL_CMD_EVICT] = true,
};

/* The handler of a command id (control_internal.h). */
ctl_handler *
ctl_command_handler(enum control_cmd_id id)
{
	return (unsigned)id < CONTROL_CMD_COUNT ? handlers[id] : NULL;
}

/* Parses a request line into its words and command, without I/O: the
 * rules are in control_internal.h. Declared there for ctl_handle_line()
 * and the fuzzer. */
int
ctl_parse_request(char *line, size_t len, char **words, enum control_cmd_id *command,
	char *err, size_t errlen)
{
	char why[160], quoted[48], usage[128];
	const struct control_cmd *cmd;
	int n, id;

	if (len > 0 && line[len - 1] == '\r')
		len--;
	if ((n = control_split(line, len, words, CONTROL_MAX_WORDS, why, sizeof(why))) < 0) {
		snprintf(err, errlen, "bad request: %s", why);
		return -EINVAL;
	}
	if (n == 0) {
		snprintf(err, errlen, "empty request (try \"help\")");
		return -EINVAL;
	}
	if ((id = control_cmd_find(words[0])) < 0) {
		snprintf(err, errlen, "unknown command %s (try \"help\")",
			json_quote(quoted, sizeof(quoted), words[0], strlen(words[0])));
		return -EINVAL;
	}
	cmd = &control_cmds[id];
	if (n - 1 < cmd->min_args || n - 1 > cmd->max_args) {
		control_cmd_usage(cmd, usage, sizeof(usage));
		snprintf(err, errlen, "%s: usage: %s", cmd->name, usage);
		return -EINVAL;
	}
	*command = (enum control_cmd_id)id;
	return n;
}

/* Handles one request line (len bytes, no '\n'; line has room for a NUL):
 * parses it and runs its command, or replies with the parse error.
 * Declared in control_internal.h for control.c. */
void
ctl_handle_line(struct ctl_conn *c, char *line, size_t len)
{
	char *words[CONTROL_MAX_WORDS];
	char err[CTL_REQUEST_ERROR_MAX];
	enum control_cmd_id id = CONTROL_CMD_HELP;
	int n;

	if ((n = ctl_parse_request(line, len, words, &id, err, sizeof(err))) < 0) {
		ctl_conn_error(c, "%s", err);
		return;
	}
	if (completed_later[id] && !ctl_request_room(c, words[0]))
		return;
	handlers[id](c, n, words);
}
