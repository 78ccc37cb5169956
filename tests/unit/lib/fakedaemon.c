/*
 * fakedaemon.c: the fake wcached of the client library's tests (see
 * fakedaemon.h).
 */
#include "fakedaemon.h"
#include "testutil.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proto/fdpass.h"

int
fake_sem_wait(sem_t *s)
{
	struct timespec ts;
	int r;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += FAKE_DEADLINE_MS / 1000;
	do
		r = sem_timedwait(s, &ts);
	while (r == -1 && errno == EINTR);
	return r;
}


void
fake_fail(struct fake *k, const char *fmt, ...)
{
	va_list ap;

	if (k->failure[0] != '\0')
		return;
	va_start(ap, fmt);
	vsnprintf(k->failure, sizeof(k->failure), fmt, ap);
	va_end(ap);
}

int
fake_wait_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r;

	do
		r = poll(&p, 1, FAKE_DEADLINE_MS);
	while (r == -1 && errno == EINTR);
	return r;
}

ssize_t
fake_raw_send(int sock, const void *buf, size_t len, const int *fds, size_t n)
{
	return tu_raw_send(sock, buf, len, fds, n);
}

/* Whether a send failed because the client has hung up, which it may do
 * as soon as one of our messages is malformed: not the fake's failure. */
static int
client_gone(void)
{
	return errno == EPIPE || errno == ECONNRESET;
}

/* Sends the scripted reply to a request of sequence number seq, preceded by
 * the scripted CHANGED messages. Returns 1 when the connection is to be
 * closed now, else 0. */
static int
fake_reply(struct fake *k, int conn, uint32_t seq)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n = -EINVAL;

	for (int i = 0; i < k->changed_before; i++) {
		n = wire_put_changed(buf, sizeof(buf), k->changed_generation, k->model, strlen(k->model));
		if (n > 0 && k->changed_echo)
			memcpy(buf + 12, &seq, 4); /* the header's seq, little-endian host */
		if (n < 0 || fake_raw_send(conn, buf, (size_t)n, &k->changed_fd,
				 k->changed_fd >= 0 ? 1 : 0) < 0) {
			if (n < 0 || !client_gone())
				fake_fail(k, "cannot send CHANGED");
			return 1;
		}
	}
	switch (k->kind) {
	case REPLY_ATTACH_OK: {
		struct wire_attach_ok ok = k->ok;

		ok.handle += (uint64_t)__atomic_load_n(&k->accepted, __ATOMIC_ACQUIRE) - 1;
		n = wire_put_attach_ok(buf, sizeof(buf), seq + k->seq_delta, &ok);
		break;
	}
	case REPLY_ERROR:
		n = wire_put_error(buf, sizeof(buf), seq + k->seq_delta, k->err_code, k->err_text);
		break;
	case REPLY_RAW:
		if (fake_raw_send(conn, k->raw, k->raw_len, k->fds, k->nfds) < 0) {
			if (!client_gone())
				fake_fail(k, "cannot send the raw reply: %s", strerror(errno));
			return 1;
		}
		return 0;
	case REPLY_CLOSE:
		return 1;
	}
	if (n < 0) {
		fake_fail(k, "cannot encode the reply: %zd", n);
		return 1;
	}
	if (fake_raw_send(conn, buf, (size_t)n, k->fds, k->nfds) < 0) {
		if (!client_gone())
			fake_fail(k, "cannot send the reply: %s", strerror(errno));
		return 1;
	}
	return 0;
}

/* Answers ATTACH as scripted, RELEASE with RELEASE_OK (none to a RELEASE
 * of seq 0, as wcached) and HOLD as hold_handle says, until the client
 * closes the connection. */
static void
fake_serve(struct fake *k, int conn)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message msg;
	const char *name;
	size_t nfds, len;
	ssize_t n;
	int first = __atomic_load_n(&k->accepted, __ATOMIC_ACQUIRE) == 1, attaches = 0;

	for (;;) {
		if (fake_wait_readable(conn) <= 0) {
			fake_fail(k, "no request within the deadline");
			return;
		}
		n = fdp_recv(conn, buf, sizeof(buf), NULL, 0, &nfds);
		/* The end, or a reset: a client that reconnects closes its old
		 * socket with our reply possibly unread. */
		if (n == 0 || n == -ECONNRESET)
			return;
		if (n < 0 || wire_decode(buf, (size_t)n, &msg) < 0) {
			fake_fail(k, "malformed request (%zd)", n);
			return;
		}
		if (msg.h.type == WIRE_ATTACH && wire_get_attach(&msg, &name, &len) == 0) {
			memcpy(k->name, name, len);
			k->name[len] = '\0';
			k->attaches++;
			if (first && ++attaches == k->first_close_at)
				return; /* as a daemon that dies holding the request */
			if (fake_reply(k, conn, msg.h.seq))
				return;
		} else if (msg.h.type == WIRE_RELEASE &&
			wire_get_release(&msg, &k->released_handle) == 0) {
			k->releases++;
			k->released_seq = msg.h.seq;
			if (msg.h.seq == 0)
				continue; /* the client wants no reply */
			n = wire_put_release_ok(buf, sizeof(buf), msg.h.seq);
			if (n < 0 || fdp_send(conn, buf, (size_t)n, NULL, 0) < 0) {
				fake_fail(k, "cannot send RELEASE_OK");
				return;
			}
		} else if (msg.h.type == WIRE_HOLD &&
			wire_get_hold(&msg, &k->held_generation, &name, &len) == 0) {
			k->holds++;
			if (k->hold_handle < 0) {
				/* As a wcached that does not know HOLD: "malformed",
				 * seq 0, and the connection closed. */
				n = wire_put_error(buf, sizeof(buf), 0, EBADMSG,
					"unexpected message type 3");
				if (n > 0)
					(void)fdp_send(conn, buf, (size_t)n, NULL, 0);
				return;
			}
			n = k->hold_handle > 0 ?
				wire_put_hold_ok(buf, sizeof(buf), msg.h.seq,
					(uint64_t)k->hold_handle) :
				wire_put_error(buf, sizeof(buf), msg.h.seq, ENOENT,
					"generation 1 was not taken over");
			if (n < 0 || fdp_send(conn, buf, (size_t)n, NULL, 0) < 0) {
				fake_fail(k, "cannot answer HOLD");
				return;
			}
		} else {
			fake_fail(k, "unexpected request of type %u", msg.h.type);
			return;
		}
	}
}

/* Serves one accepted connection as the script says, then closes it. */
static void
fake_connection(struct fake *k, int conn)
{
	__atomic_store_n(&k->conn, conn, __ATOMIC_RELEASE);
	switch (k->mode) {
	case FAKE_SERVE:
		fake_serve(k, conn);
		break;
	case FAKE_REFUSE_EARLY:
		(void)fake_reply(k, conn, 0);
		break;
	case FAKE_SILENT: {
		uint8_t buf[WIRE_MAX_MESSAGE];
		size_t nfds;
		ssize_t n = 1;

		/* The request, then nothing until the client hangs up. */
		while (n > 0) {
			if (fake_wait_readable(conn) <= 0) {
				fake_fail(k, "the client did not close within the deadline");
				break;
			}
			if ((n = fdp_recv(conn, buf, sizeof(buf), NULL, 0, &nfds)) > 0)
				k->attaches++;
		}
		break;
	}
	case FAKE_REFUSE_UNREAD:
	case FAKE_REFUSE_LATE:
		if (fake_wait_readable(conn) <= 0) {
			fake_fail(k, "the client sent nothing within the deadline");
			break;
		}
		(void)fake_reply(k, conn, 0);
		if (k->mode == FAKE_REFUSE_LATE && fake_sem_wait(k->read) < 0)
			fake_fail(k, "the client never received the refusal");
		break;
	}
	__atomic_store_n(&k->conn, -1, __ATOMIC_RELEASE);
	close(conn);
}

void *
fake_main(void *arg)
{
	struct fake *k = arg;
	int conn, want = k->connections > 0 ? k->connections : 1;

	for (int i = 0; i < want && k->failure[0] == '\0'; i++) {
		if (fake_wait_readable(k->listen_fd) <= 0) {
			fake_fail(k, "no client connected within the deadline (connection %d)",
				i + 1);
			break;
		}
		if ((conn = accept4(k->listen_fd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
			fake_fail(k, "accept: %s", strerror(errno));
			break;
		}
		__atomic_add_fetch(&k->accepted, 1, __ATOMIC_ACQ_REL);
		fake_connection(k, conn);
	}
	sem_post(k->closed);
	return NULL;
}
