/*
 * ctl_http.c: `wcachectl metrics --http`, the Prometheus endpoint's
 * responder. wcached itself never listens on the network (its unit has
 * PrivateNetwork=yes); instead wcached-metrics.socket listens on loopback
 * TCP with Accept=yes and starts one wcached-metrics@.service per
 * connection, which runs this with the connection as standard input and
 * output (the inetd protocol). It reads one HTTP/1.1 request, asks the
 * control socket for "metrics" and answers:
 *
 *   GET /metrics (a query string is ignored)    200, the text exposition
 *   HEAD /metrics                               200, the same head, no body
 *   another path                                404
 *   another method                              405, Allow: GET, HEAD
 *   a malformed request, or one over CTL_HTTP_REQUEST_MAX bytes   400
 *   no complete request within the timeout      408
 *   wcached unreachable or failing              503, the reason as text
 *
 * and nothing else: one request per connection (Connection: close), no
 * request body read, no keep-alive, no TLS. The whole exchange has a
 * deadline (alarm(2) ends a process stuck on a write or on the control
 * socket). Errors go to standard error, which the unit sends to the journal.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "ctl/internal.h"
#include "base/escape.h"
#include "base/json.h"
#include "base/path.h"

#define EXPOSITION_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Whether the request is HEAD: responses carry their head alone. */
static bool head_only;

/* Sends a whole response: status line, headers, body (not to HEAD). */
static int
respond(int code, const char *reason, const char *type, const char *extra_header,
	const char *body, size_t len)
{
	char head[512];
	int n = snprintf(head, sizeof(head),
		"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
		"Cache-Control: no-store\r\nConnection: close\r\n\r\n",
		code, reason, type, len, extra_header != NULL ? extra_header : "");

	if (n < 0 || (size_t)n >= sizeof(head) ||
		fd_write_all(STDOUT_FILENO, head, (size_t)n) < 0 ||
		(!head_only && fd_write_all(STDOUT_FILENO, body, len) < 0)) {
		fprintf(stderr, "wcachectl metrics --http: writing the response: %s\n",
			strerror(errno));
		return -1;
	}
	return 0;
}

/* A response whose body is one line of text. */
static int
respond_text(int code, const char *reason, const char *extra_header, const char *text)
{
	char body[1200];
	int n = snprintf(body, sizeof(body), "%s\n", text);

	return respond(code, reason, "text/plain; charset=utf-8", extra_header, body,
		n < 0 ? 0 : (size_t)n >= sizeof(body) ? sizeof(body) - 1 : (size_t)n);
}

/*
 * Reads the request line and headers into buf (cap bytes, their length in
 * *len) until the empty line that ends them. Returns 1 when complete, 0 at
 * EOF before any byte, -1 when the peer closed mid-request, -2 at the size
 * cap, -3 at the deadline.
 */
static int
read_request(char *buf, size_t cap, size_t *len, double deadline)
{
	size_t n = 0;

	for (;;) {
		struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
		double left = deadline - ctl_monotonic();
		ssize_t r;
		int pr;

		if (left <= 0)
			return -3;
		pr = poll(&p, 1, (int)(left * 1000) + 1);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr == 0)
			return -3;
		if (n == cap)
			return -2;
		r = read(STDIN_FILENO, buf + n, cap - n);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			return n == 0 ? 0 : -1;
		n += (size_t)r;
		*len = n;
		if (ctl_http_head_complete(buf, n))
			return 1;
		if (n == cap)
			return -2; /* not a 408 for a client that stops there */
	}
}

/* Reads the metrics reply (internal.h). */
int
ctl_http_read_reply(const char *line, size_t len, int *ok, char **text, size_t *text_len)
{
	/* [0]: the first "text", [1]: the first "error" */
	char *t[2] = { NULL, NULL };
	size_t t_len[2] = { 0, 0 };
	struct jr j;
	struct jr_str key;
	int is_ok = -1, rc, k;

	/* {"ok":true,...,"text":"..."}: only ok, error and text matter. */
	jr_init(&j, line, len);
	rc = jr_object_begin(&j);
	while (rc >= 0 && (rc = jr_object_next(&j, &key)) == 1) {
		struct jr_str v;

		k = jr_str_eq(&key, "text", 4) ? 0 : jr_str_eq(&key, "error", 5) ? 1 : -1;
		if (jr_str_eq(&key, "ok", 2)) {
			is_ok = jr_peek(&j) == JR_TRUE;
			rc = jr_skip(&j);
		} else if (k >= 0 && jr_peek(&j) == JR_STRING && t[k] == NULL) {
			if ((rc = jr_string(&j, &v)) < 0)
				break;
			if ((t[k] = malloc(v.len + 1)) == NULL) {
				rc = -ENOMEM;
				break;
			}
			if ((rc = jr_str_decode(&v, t[k], v.len + 1)) < 0)
				break;
			t_len[k] = v.len;
		} else {
			rc = jr_skip(&j);
		}
	}
	if (rc >= 0)
		rc = jr_finish(&j);
	/* Metrics only from a reply that says ok; its error otherwise. */
	k = is_ok == 1 ? 0 : 1;
	free(t[1 - k]);
	if (rc < 0) {
		free(t[k]);
		return rc;
	}
	*ok = is_ok;
	*text = t[k];
	*text_len = t_len[k];
	return 0;
}

/* Asks the control socket for the metrics and answers with them. */
static int
serve_metrics(const char *control_path)
{
	char req[] = "metrics\n", *line, *text = NULL;
	size_t len = 0, text_len = 0;
	int ok = -1, rc;

	if (control_path == NULL) {
		respond_text(503, "Service Unavailable", NULL,
			"wcached's control socket is unknown (see the journal)");
		return 1;
	}
	if ((line = ctl_request(control_path, req, sizeof(req) - 1, &len)) == NULL) {
		respond_text(503, "Service Unavailable", NULL,
			"wcached cannot be reached through its control socket (see the journal)");
		return 1;
	}
	rc = ctl_http_read_reply(line, len, &ok, &text, &text_len);
	free(line);
	if (rc < 0 || ok != 1 || text == NULL) {
		/* The daemon's error, escaped: one line of the journal. */
		fputs("wcachectl metrics --http: wcached's reply: ", stderr);
		escape_print(stderr, rc < 0 ? "malformed" : text != NULL ? text : "no text");
		fputc('\n', stderr);
		respond_text(503, "Service Unavailable", NULL,
			rc < 0 ? "malformed reply from wcached" :
			text != NULL ? text : "wcached sent no metrics");
		free(text);
		return 1;
	}
	rc = respond(200, "OK", EXPOSITION_TYPE, NULL, text, text_len);
	free(text);
	return rc < 0 ? 1 : 0;
}

/*
 * After the response: no more writes, then read (and drop) what the client
 * still sends for a moment, so that closing with unread bytes does not
 * reset the connection before the client has read the response.
 */
static void
linger(void)
{
	char sink[4096];
	double deadline = ctl_monotonic() + 1.0;

	if (shutdown(STDOUT_FILENO, SHUT_WR) < 0)
		return; /* not a socket (a test's pipe) */
	for (size_t total = 0; total < (64u << 10);) {
		struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
		double left = deadline - ctl_monotonic();
		ssize_t r;

		if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0)
			return;
		if ((r = read(STDIN_FILENO, sink, sizeof(sink))) <= 0)
			return;
		total += (size_t)r;
	}
}

/* `wcachectl metrics --http` (internal.h). */
int
ctl_http_metrics(const char *control_path, double timeout)
{
	char buf[CTL_HTTP_REQUEST_MAX];
	size_t len = 0;
	int r, status = 1;

	signal(SIGPIPE, SIG_IGN);
	/* The deadline of the whole exchange; the request's own is checked
	 * with poll() below so that it gets a 408 instead. */
	alarm((unsigned)timeout + 5);
	r = read_request(buf, sizeof(buf), &len, ctl_monotonic() + timeout);
	if (r == 0)
		return 1; /* a connection that sent nothing: nothing to answer */
	if (r == -3) {
		respond_text(408, "Request Timeout", NULL, "request not complete in time");
		goto out;
	}
	if (r < 0) {
		respond_text(400, "Bad Request", NULL, r == -2 ? "request header too large" :
			"incomplete request");
		goto out;
	}
	switch (ctl_http_classify(buf, len, &head_only)) {
	case 200:
		status = serve_metrics(control_path);
		break;
	case 404:
		respond_text(404, "Not Found", NULL, "not found: only /metrics is served");
		break;
	case 405:
		respond_text(405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
			"only GET and HEAD are served");
		break;
	default:
		respond_text(400, "Bad Request", NULL, "malformed request line");
		break;
	}
out:
	linger();
	return status;
}
