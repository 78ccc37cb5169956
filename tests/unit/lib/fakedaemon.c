/*
 * fakedaemon.c: the fake wcached of the client library's tests (see
 * fakedaemon.h).
 */
#include "fakedaemon.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto/fdpass.h"
#include "proto/memfds.h"

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

int
fake_listen(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 8) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

int
fake_status_page(size_t bytes, uint64_t slot, uint64_t generation, uint64_t **map)
{
	int fd = memfd_create("wctest-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint64_t *p;

	if (fd < 0)
		return -1;
	if (slot >= bytes / 8 || ftruncate(fd, (off_t)bytes) < 0 ||
		(p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		close(fd);
		return -1;
	}
	__atomic_store_n(&p[0], STATUS_MAGIC, __ATOMIC_RELEASE);
	__atomic_store_n(&p[slot], generation, __ATOMIC_RELEASE);
	if (fcntl(fd, F_ADD_SEALS, STATUS_PAGE_SEALS) < 0) {
		munmap(p, bytes);
		close(fd);
		return -1;
	}
	*map = p;
	return fd;
}

void
fake_join(struct fake *k)
{
	if (k->started) {
		pthread_join(k->thread, NULL);
		k->started = 0;
	}
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

/* Sends the scripted reply of kind to a request of sequence number seq,
 * preceded by the scripted CHANGED messages. Returns 1 when the
 * connection is to be closed now, else 0. */
static int
fake_reply(struct fake *k, int conn, uint32_t seq, enum reply_kind kind)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n = -EINVAL;

	for (int i = 0; i < k->changed_before; i++) {
		n = wire_put_changed(buf, sizeof(buf), k->changed_generation, k->model,
			strlen(k->model));
		if (n > 0 && k->changed_echo)
			memcpy(buf + 12, &seq, 4); /* the header's seq, little-endian host */
		if (n < 0 || fake_raw_send(conn, buf, (size_t)n, &k->changed_fd,
				 k->changed_fd >= 0 ? 1 : 0) < 0) {
			if (n < 0 || !client_gone())
				fake_fail(k, "cannot send CHANGED");
			return 1;
		}
	}
	switch (kind) {
	case REPLY_ATTACH_OK: {
		struct wire_attach_ok ok = k->ok;

		ok.handle += (uint64_t)__atomic_load_n(&k->accepted, __ATOMIC_ACQUIRE) - 1;
		n = wire_put_attach_ok(buf, sizeof(buf), seq + k->seq_delta, &ok);
		break;
	}
	case REPLY_BUILD: {
		struct wire_attach_ok ok = k->ok;

		ok.handle += (uint64_t)__atomic_load_n(&k->accepted, __ATOMIC_ACQUIRE) - 1;
		n = wire_put_build(buf, sizeof(buf), seq + k->seq_delta, &ok, k->token);
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

/* Keeps what a PUBLISH brought: its seals and its bytes; closes fd. */
static void
fake_take_published(struct fake *k, int fd)
{
	struct stat st;
	size_t len;

	k->published_seals = fcntl(fd, F_GET_SEALS);
	free(k->published);
	k->published = NULL;
	k->published_len = 0;
	if (fstat(fd, &st) == 0 && st.st_size >= 0) {
		k->published_len = (size_t)st.st_size;
		len = k->published_len < FAKE_PUBLISHED_MAX ? k->published_len : FAKE_PUBLISHED_MAX;
		k->published = malloc(len > 0 ? len : 1);
		if (k->published == NULL || pread(fd, k->published, len, 0) != (ssize_t)len)
			fake_fail(k, "cannot read the published memfd");
	}
	close(fd);
}

/* Answers PUBLISH as k->publish says. Returns 1 when the connection is to
 * be closed now. */
static int
fake_publish_reply(struct fake *k, int conn, uint32_t seq)
{
	const struct fake_publish *p = &k->publish;
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n;

	switch (p->kind) {
	case REPLY_ATTACH_OK:
		n = wire_put_attach_ok(buf, sizeof(buf), seq, &p->ok);
		break;
	case REPLY_ERROR:
		n = wire_put_error(buf, sizeof(buf), seq, p->err_code, p->err_text);
		break;
	case REPLY_RAW:
		if (p->raw_len > sizeof(buf))
			return 1;
		memcpy(buf, p->raw, p->raw_len);
		n = (ssize_t)p->raw_len;
		break;
	default:
		return 1;
	}
	if (n < 0 || fake_raw_send(conn, buf, (size_t)n, p->fds, p->nfds) < 0) {
		if (n < 0 || !client_gone())
			fake_fail(k, "cannot answer PUBLISH");
		return 1;
	}
	return 0;
}

/* Answers ABANDON: RELEASE_OK, a HOLD_OK (abandon_err_code -1), or the
 * scripted ERROR. */
static int
fake_abandon_reply(struct fake *k, int conn, uint32_t seq)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	ssize_t n = k->abandon_err_code == 0 ? wire_put_release_ok(buf, sizeof(buf), seq) :
		k->abandon_err_code == -1 ? wire_put_hold_ok(buf, sizeof(buf), seq, 1) :
		wire_put_error(buf, sizeof(buf), seq, k->abandon_err_code, "build 9 ended");

	if (n < 0 || fdp_send(conn, buf, (size_t)n, NULL, 0) < 0) {
		fake_fail(k, "cannot answer ABANDON");
		return 1;
	}
	return 0;
}

/* Answers ATTACH and DERIVE as scripted, RELEASE with RELEASE_OK (none to
 * a RELEASE of seq 0, as wcached), HOLD as hold_handle says, PUBLISH and
 * ABANDON as publish and abandon_err_code say, until the client closes
 * the connection. Only PUBLISH may carry a descriptor (exactly one). */
static void
fake_serve(struct fake *k, int conn)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	struct wire_message msg;
	struct wire_derive d;
	const char *name;
	size_t nfds, len;
	ssize_t n;
	int fds[2];
	uint64_t token;
	int first = __atomic_load_n(&k->accepted, __ATOMIC_ACQUIRE) == 1, attaches = 0;

	for (;;) {
		if (fake_wait_readable(conn) <= 0) {
			fake_fail(k, "no request within the deadline");
			return;
		}
		n = fdp_recv(conn, buf, sizeof(buf), fds, 2, &nfds);
		/* The end, or a reset: a client that reconnects closes its old
		 * socket with our reply possibly unread. */
		if (n == 0 || n == -ECONNRESET)
			return;
		if (n < 0 || wire_decode(buf, (size_t)n, &msg) < 0 ||
			nfds != (msg.h.type == WIRE_PUBLISH ? 1u : 0u)) {
			if (n > 0)
				fdp_close_all(fds, nfds);
			fake_fail(k, "malformed request (%zd, %zu descriptors)", n,
				n > 0 ? nfds : 0);
			return;
		}
		if (msg.h.type == WIRE_PUBLISH && wire_get_publish(&msg, &token) == 0) {
			k->publishes++;
			k->published_token = token;
			fake_take_published(k, fds[0]);
			if (fake_publish_reply(k, conn, msg.h.seq))
				return;
		} else if (msg.h.type == WIRE_ABANDON &&
			wire_get_abandon(&msg, &token, &name, &len) == 0) {
			k->abandons++;
			k->abandoned_token = token;
			memcpy(k->reason, name, len);
			k->reason[len] = '\0';
			if (fake_abandon_reply(k, conn, msg.h.seq))
				return;
		} else if (msg.h.type == WIRE_DERIVE && wire_get_derive(&msg, &d) == 0) {
			memcpy(k->name, d.name, d.name_len);
			k->name[d.name_len] = '\0';
			memcpy(k->key, d.key, d.key_len);
			k->key[d.key_len] = '\0';
			k->wait_ms = d.wait_ms;
			k->derives++;
			if (fake_reply(k, conn, msg.h.seq, k->derive_build &&
				(k->derive_builds == 0 || k->derives <= k->derive_builds) ?
				REPLY_BUILD : k->kind))
				return;
		} else if (msg.h.type == WIRE_ATTACH && wire_get_attach(&msg, &name, &len) == 0) {
			memcpy(k->name, name, len);
			k->name[len] = '\0';
			k->attaches++;
			if (first && ++attaches == k->first_close_at)
				return; /* as a daemon that dies holding the request */
			if (k->gate != NULL) {
				sem_post(k->at_gate);
				if (fake_sem_wait(k->gate) < 0) {
					fake_fail(k, "the gate did not open within the deadline");
					return;
				}
			}
			if (fake_reply(k, conn, msg.h.seq, k->kind))
				return;
			if (first && k->stall_after > 0 && attaches == k->stall_after) {
				sem_post(k->stalled);
				if (fake_sem_wait(k->resume) < 0) {
					fake_fail(k, "not resumed within the deadline");
					return;
				}
			}
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
			if (k->gone_at_hold) {
				close(k->listen_fd);
				k->listen_fd = -1;
			}
			if (k->hold_handle == -1) {
				/* As a wcached that does not know HOLD: "malformed",
				 * seq 0, and the connection closed. */
				n = wire_put_error(buf, sizeof(buf), 0, EBADMSG,
					"unexpected message type 3");
				if (n > 0)
					(void)fdp_send(conn, buf, (size_t)n, NULL, 0);
				return;
			}
			if (k->hold_handle == -2)
				n = wire_put_release_ok(buf, sizeof(buf), msg.h.seq);
			else if (k->hold_handle > 0)
				n = wire_put_hold_ok(buf, sizeof(buf), msg.h.seq,
					(uint64_t)k->hold_handle);
			else
				n = wire_put_error(buf, sizeof(buf), msg.h.seq, ENOENT,
					"generation 1 was not taken over");
			/* A client whose HOLD timed out has closed. */
			if (n < 0 || fdp_send(conn, buf, (size_t)n, NULL, 0) < 0) {
				if (n < 0 || !client_gone())
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
		(void)fake_reply(k, conn, 0, k->kind);
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
		(void)fake_reply(k, conn, 0, k->kind);
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
