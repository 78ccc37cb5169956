/*
 * fuzz_roundtrip.c: libwcache's reply loop (client/lib/request.c): which
 * received message request_exchange() takes for the reply (the request's
 * seq, an ERROR of seq 0, after a reset an ERROR of any seq), what it drops
 * (CHANGED) and what makes it close the connection (a malformed message,
 * one of another seq, a deadline), and wc_client_dispatch()'s reading of
 * announcements and its reconnect of a connection the daemon closed. The
 * harness is the daemon: a real wc_client connects to its listening
 * SOCK_SEQPACKET socket (a listener rather than a socketpair, so that
 * dispatch's reconnect has a path to connect to), and the input becomes
 * the messages, each with 0 to 2 memfds, queued on the accepted connection
 * before the call. Not reached from one thread: a receive that says
 * ECONNRESET after the request was sent (the daemon closing in between),
 * and EMFILE.
 *
 * Input layout:
 *   u8 flags  bits 0-1: the daemon's end after its messages: 0 shut down for
 *             writing (the client reads end of stream after them); 1 left
 *             open (the client's deadline, 2 ms, runs out); 2 closed before
 *             the request (its send fails: the reset path); 3 closed with a
 *             message of the client's unread (the kernel reports a reset)
 *             bit 2: wc_client_dispatch() instead of a request
 *             bit 3: the request carries a descriptor
 *             bit 4: a second request follows the first on the connection
 *             bit 5: the client's seq starts next to its wrap (0 is skipped)
 *   then up to 8 messages, each:
 *     u8 kind   bits 0-1: memfds it carries (3: 2); bit 2: raw bytes;
 *               bits 3-5: its seq: 0 the request's, 1 zero, 2 the second
 *               request's, 3 the request's - 1, 4 the request's + 2,
 *               5 0xffffffff, 6-7 the request's
 *     raw:   u16 n, then n bytes (n modulo WIRE_MAX_MESSAGE + 65: longer
 *            than a reply may be, up to 64 bytes)
 *     built: u8 type (0-6: ERROR, CHANGED, ATTACH_OK, RELEASE_OK, HOLD_OK,
 *            BUILD, ATTACH; else itself), u8 n, then n bytes of payload,
 *            after a good header of that type, length and seq
 *
 * Checked: every result is the one the loop's rules predict from the queue
 * (computed here, message by message, with wire_decode()); a reply is the
 * very message queued, bytes and descriptors (each memfd carries a tag of
 * its message and place) close-on-exec; request_closed_why() is set exactly
 * when libwcache closed the connection itself; a request on a connection
 * libwcache closed reads nothing; dispatch counts the CHANGED it read and
 * reconnects exactly when the daemon closed; and the descriptors of every
 * message read and dropped are closed at once (the process holds as many
 * after a call as before it, plus the reply's), all of them after the input.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "lib/attach.h"
#include "lib/request.h"
#include "lib/wcache.h"
#include "proto/fdpass.h"
#include "proto/wire.h"
#include "fuzz_check.h"
#include "fuzz_fds.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define END_SHUT_WR 0u  /* the daemon's end after its messages (flags bits 0-1) */
#define END_OPEN 1u
#define END_CLOSED 2u
#define END_UNREAD 3u
#define F_DISPATCH 4u
#define F_SEND_FD 8u
#define F_SECOND 16u
#define F_WRAP 32u

#define KIND_RAW 4u
#define MAX_QUEUED 8
#define MAX_RAW (WIRE_MAX_MESSAGE + 64) /* longer than a reply may be */
#define OPEN_END_MS 2                   /* the deadline when the daemon stays silent */
#define CLOSED_END_MS 5000              /* never waited for: the loop ends first */
#define TAG 0x5a                        /* a queued memfd's first byte */

/* A message the daemon queued: its bytes and how many memfds went with it. */
struct queued {
	uint8_t bytes[MAX_RAW];
	size_t len;
	unsigned nfds;
};

static struct queued queue[MAX_QUEUED];
static size_t queued;

/* The daemon's listening socket, in a directory of its own. */
static char dir[64], sock_path[128];
static int listener = -1;

/* What the rules say a request call ends with. */
struct expect {
	int reply;         /* the reply is queue[index]; else the error code */
	size_t index;
	int code;
	int ours;          /* an error where libwcache closed the connection itself */
	int dropped_news;  /* a CHANGED was dropped first: its deadline may pass there */
	size_t next;       /* the first message the call did not read */
};

static void
cleanup(void)
{
	if (listener >= 0)
		close(listener);
	unlink(sock_path);
	rmdir(dir);
}

/* Makes the daemon's listening socket, once. */
static void
listen_once(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	if (listener >= 0)
		return;
	snprintf(dir, sizeof(dir), "/tmp/fuzz_roundtrip.XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(sock_path, sizeof(sock_path), "%s/wcached.sock", dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	CHECK(listener >= 0);
	CHECK(bind(listener, (const struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(listener, 8) == 0);
	atexit(cleanup);
}

/* The connection a client made to the listener, or -1 when none waits. */
static int
accept_one(void)
{
	return accept4(listener, NULL, NULL, SOCK_CLOEXEC);
}

/* The seq after seq, as request_next_seq() counts (0 is skipped). */
static uint32_t
seq_after(uint32_t seq)
{
	return seq + 1 == 0 ? 1 : seq + 1;
}

/* The seq a message kind chooses, for a request of seq. */
static uint32_t
seq_of(unsigned kind, uint32_t seq)
{
	switch ((kind >> 3) & 7) {
	case 1:
		return 0;
	case 2:
		return seq_after(seq);
	case 3:
		return seq - 1;
	case 4:
		return seq + 2;
	case 5:
		return UINT32_MAX;
	default:
		return seq;
	}
}

static void
put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Decodes the input's messages into queue (seq: the request's). */
static void
decode_queue(const uint8_t *p, size_t left, uint32_t seq)
{
	static const uint16_t types[] = { WIRE_ERROR, WIRE_CHANGED, WIRE_ATTACH_OK,
		WIRE_RELEASE_OK, WIRE_HOLD_OK, WIRE_BUILD, WIRE_ATTACH };
	const uint8_t *kind_b, *len_b, *type_b, *bytes;

	for (queued = 0; queued < MAX_QUEUED; queued++) {
		struct queued *m = &queue[queued];
		size_t n;

		if ((kind_b = take(&p, &left, 1)) == NULL)
			return;
		m->nfds = (*kind_b & 3) == 3 ? 2 : *kind_b & 3;
		if (*kind_b & KIND_RAW) {
			if ((len_b = take(&p, &left, 2)) == NULL ||
				(bytes = take(&p, &left, n = le16(len_b) % (MAX_RAW + 1))) == NULL)
				return;
			memcpy(m->bytes, bytes, n);
			m->len = n;
			continue;
		}
		if ((type_b = take(&p, &left, 1)) == NULL || (len_b = take(&p, &left, 1)) == NULL ||
			(bytes = take(&p, &left, n = *len_b)) == NULL)
			return;
		memset(m->bytes, 0, WIRE_HEADER_SIZE);
		put32(m->bytes, WIRE_MAGIC);
		m->bytes[4] = WIRE_VERSION;
		m->bytes[6] = (uint8_t)(*type_b < sizeof(types) / sizeof(types[0]) ?
			types[*type_b] : *type_b);
		put32(m->bytes + 8, (uint32_t)n);
		put32(m->bytes + 12, seq_of(*kind_b, seq));
		memcpy(m->bytes + WIRE_HEADER_SIZE, bytes, n);
		m->len = WIRE_HEADER_SIZE + n;
	}
}

/* Sends queue[i] on d with its memfds, each tagged (TAG, i, its place).
 * Returns 0, or -1 when the socket takes no more. */
static int
send_queued(int d, size_t i)
{
	union {
		struct cmsghdr align;
		unsigned char buf[CMSG_SPACE(2 * sizeof(int))];
	} control;
	struct iovec iov = { .iov_base = queue[i].bytes, .iov_len = queue[i].len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	const unsigned k = queue[i].nfds < 2 ? queue[i].nfds : 2;
	int fds[2] = { -1, -1 };
	ssize_t n;

	for (unsigned j = 0; j < k; j++) {
		uint8_t tag[3] = { TAG, (uint8_t)i, (uint8_t)j };

		fds[j] = memfd_create("fuzz-reply", MFD_CLOEXEC);
		CHECK(fds[j] >= 0 && write(fds[j], tag, sizeof(tag)) == (ssize_t)sizeof(tag));
	}
	if (k > 0) {
		struct cmsghdr *c;

		memset(&control, 0, sizeof(control));
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(k * sizeof(int));
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(k * sizeof(int));
		memcpy(CMSG_DATA(c), fds, k * sizeof(int));
	}
	n = sendmsg(d, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	for (unsigned j = 0; j < k; j++)
		close(fds[j]);
	return n == (ssize_t)queue[i].len ? 0 : -1;
}

/*
 * What a request of seq ends with when the loop starts reading at
 * queue[pos] (request.c, roundtrip()): reset when its send failed because
 * the daemon closed (then only an ERROR, of any seq, is a reply), open_end
 * when the daemon stays silent after its messages.
 */
static void
expect_request(size_t pos, uint32_t seq, int reset, int open_end, struct expect *e)
{
	memset(e, 0, sizeof(*e));
	for (; pos < queued; pos++) {
		const struct queued *m = &queue[pos];
		struct wire_message wm;
		int r;

		e->next = pos + 1;
		if (m->len == 0) { /* an empty packet reads as the end of stream */
			e->code = -ECONNRESET;
			return;
		}
		if (m->len > WIRE_MAX_MESSAGE) { /* cut off: fdp_recv()'s -EMSGSIZE */
			e->code = -EMSGSIZE;
			e->ours = 1;
			return;
		}
		r = wire_decode(m->bytes, m->len, &wm);
		if (reset) {
			e->reply = r == 0 && wm.h.type == WIRE_ERROR;
			e->index = pos;
			e->code = e->reply ? 0 : -ECONNRESET;
			return;
		}
		if (r < 0) {
			e->code = r;
			e->ours = 1;
			return;
		}
		if (wm.h.type != WIRE_CHANGED &&
			(wm.h.seq == seq || (wm.h.type == WIRE_ERROR && wm.h.seq == 0))) {
			e->reply = 1;
			e->index = pos;
			return;
		}
		if (wm.h.type != WIRE_CHANGED) {
			e->code = -EBADMSG;
			e->ours = 1;
			return;
		}
		e->dropped_news = 1;
	}
	e->next = pos;
	e->code = open_end ? -ETIMEDOUT : -ECONNRESET;
	e->ours = open_end;
}

/* Checks a reply: queue[index]'s bytes and its memfds, in order. */
static void
check_reply(size_t index, const uint8_t *buf, ssize_t n, const int *fds, size_t nfds)
{
	CHECK(n >= 0 && (size_t)n == queue[index].len && memcmp(buf, queue[index].bytes,
		(size_t)n) == 0);
	CHECK(nfds == queue[index].nfds);
	for (size_t j = 0; j < nfds; j++) {
		uint8_t tag[3];
		int fl = fcntl(fds[j], F_GETFD);

		CHECK(fl >= 0 && (fl & FD_CLOEXEC));
		CHECK(pread(fds[j], tag, sizeof(tag), 0) == (ssize_t)sizeof(tag));
		CHECK(tag[0] == TAG && tag[1] == index && tag[2] == j);
	}
}

/* Whether a failed call left no descriptor to its caller: it may leave
 * *nfds as a message it dropped set it, but every one of those is closed
 * (-1), as fdp_close_all() leaves them. */
static int
none_left(const int *fds, size_t nfds)
{
	for (size_t j = 0; j < nfds && j < WIRE_MAX_FDS; j++)
		if (fds[j] != -1)
			return 0;
	return nfds <= WIRE_MAX_FDS;
}

/*
 * One request of seq on c, checked against the rules from queue[*pos]:
 * returns with *pos at the first message it did not read.
 */
static void
one_request(wc_client *c, uint32_t seq, int send_fd, unsigned end, size_t *pos)
{
	static uint8_t buf[WIRE_MAX_MESSAGE];
	uint8_t req[WIRE_HEADER_SIZE + 8];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0;
	struct wire_message msg;
	struct expect e;
	int was_closed = request_closed_why(c, c->connection) != NULL;
	int before = count_fds(NULL);
	ssize_t len = wire_put_attach(req, sizeof(req), seq, "fuzz", 4), n;

	CHECK(len > 0);
	for (size_t j = 0; j < WIRE_MAX_FDS; j++)
		fds[j] = -7;
	expect_request(*pos, seq, end == END_CLOSED || end == END_UNREAD, end == END_OPEN, &e);
	pthread_mutex_lock(&c->lock);
	n = request_exchange(c, req, (size_t)len, seq, send_fd, buf, sizeof(buf), fds, &nfds,
		&msg);
	request_unlock(c);
	/* Every message read and dropped had its descriptors closed. */
	CHECK(count_fds(NULL) == before + (n >= 0 ? (int)nfds : 0));
	if (was_closed) {
		/* A connection libwcache closed is not read again: what is
		 * still queued on it answers nothing. */
		CHECK(n == -ECONNRESET && none_left(fds, nfds));
		CHECK(strncmp(wc_errmsg(), "libwcache closed the connection", 31) == 0);
		return;
	}
	if (n < 0 && e.dropped_news && n == -ETIMEDOUT &&
		request_closed_why(c, c->connection) != NULL) {
		/* The deadline passed among the announcements: closed. */
		CHECK(none_left(fds, nfds));
		return;
	}
	if (e.reply) {
		check_reply(e.index, buf, n, fds, nfds);
		CHECK(msg.payload == buf + WIRE_HEADER_SIZE);
		fdp_close_all(fds, nfds);
	} else {
		CHECK(n == e.code && none_left(fds, nfds));
		if (e.code == -ECONNRESET && !e.ours)
			CHECK(strstr(wc_errmsg(), " closed the connection") != NULL &&
				strncmp(wc_errmsg(), "libwcache", 9) != 0);
	}
	/* Set exactly when libwcache closed the connection itself. */
	CHECK((request_closed_why(c, c->connection) != NULL) == (!e.reply && e.ours));
	*pos = e.next;
}

/*
 * wc_client_dispatch() on c, checked: it reads (and drops) the queued
 * messages up to an empty one (the end of stream to it) or one too long,
 * counts the CHANGED among them, and connects again exactly when it met
 * the daemon's close.
 */
static void
one_dispatch(wc_client *c, unsigned end)
{
	uint64_t connection = c->connection;
	int before = count_fds(NULL), want = 0, reconnects = end != END_OPEN, r, fd;
	size_t pos = 0;

	if (end == END_UNREAD) /* the kernel reports the reset before the queue */
		pos = queued;
	for (; pos < queued; pos++) {
		struct wire_message wm;

		if (queue[pos].len == 0) {
			reconnects = 1;
			break;
		}
		if (queue[pos].len > WIRE_MAX_MESSAGE) {
			want = -EMSGSIZE;
			reconnects = 0;
			break;
		}
		if (wire_decode(queue[pos].bytes, queue[pos].len, &wm) == 0 &&
			wm.h.type == WIRE_CHANGED)
			want++;
	}
	r = wc_client_dispatch(c);
	CHECK(r == want);
	CHECK(count_fds(NULL) == before);
	CHECK(c->connection == connection + (uint64_t)reconnects);
	/* The new connection is the listener's to accept; none otherwise. */
	fd = accept_one();
	CHECK((fd >= 0) == reconnects);
	if (fd >= 0)
		close(fd);
	CHECK(request_closed_why(c, connection) == NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	wc_client *c = NULL;
	unsigned flags, end;
	uint32_t seq;
	size_t pos = 0;
	int before, d, send_fd = -1;

	if (size < 1)
		return 0;
	listen_once();
	before = count_fds(NULL);
	flags = data[0];
	end = flags & 3;
	CHECK(wc_connect_timeout(sock_path, end == END_OPEN ? OPEN_END_MS : CLOSED_END_MS,
		      &c) == 0);
	CHECK((d = accept_one()) >= 0);
	c->seq = (flags & F_WRAP) ? UINT32_MAX - 1 : 41;
	seq = seq_after(c->seq);
	decode_queue(data + 1, size - 1, seq);
	for (size_t i = 0; i < queued; i++)
		if (send_queued(d, i) < 0) {
			queued = i;
			break;
		}
	if (end == END_SHUT_WR)
		CHECK(shutdown(d, SHUT_WR) == 0);
	if (end == END_UNREAD)
		CHECK(send(c->fd, "x", 1, MSG_NOSIGNAL) == 1);
	if (end == END_CLOSED || end == END_UNREAD) {
		close(d);
		d = -1;
	}

	if (flags & F_DISPATCH) {
		one_dispatch(c, end);
	} else {
		if (flags & F_SEND_FD)
			CHECK((send_fd = memfd_create("fuzz-request", MFD_CLOEXEC)) >= 0);
		CHECK(request_next_seq(c) == seq);
		one_request(c, seq, send_fd, end, &pos);
		if (flags & F_SECOND) {
			seq = request_next_seq(c);
			one_request(c, seq, send_fd, end, &pos);
		}
		if (send_fd >= 0)
			close(send_fd);
	}
	wc_disconnect(c);
	if (d >= 0)
		close(d);
	CHECK(count_fds(NULL) == before);
	return 0;
}
