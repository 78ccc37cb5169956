/*
 * server_budget.c: the client socket's descriptor budget (see
 * server_internal.h): the descriptors wcached's replies have in flight, per
 * connection, per uid and in all, confirmed received with SIOCOUTQ, and the
 * limits derived from RLIMIT_NOFILE that hold back the replies of clients
 * that leave theirs unread, so that they never use up the kernel's in-flight
 * quota every other client's replies need; and the time limit on a reply
 * held back while the client reads nothing (unread_reply_ms).
 */
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "log.h"
#include "server_internal.h"
#include "uidtally.h"
#include "proto/wire.h"

/* Descriptors the connections of uid have in flight (constant time). */
static unsigned
inflight_of_uid(const struct server *s, uid_t uid)
{
	return uidtally_get(&s->inflight_by_uid, uid);
}

/* Counts n more descriptors in flight on c: for c, its uid and in all.
 * fd_budget_allows() reserved the uid's place in the tally beforehand, so
 * this cannot fail after the send that it follows. */
void
inflight_add(struct conn *c, unsigned n)
{
	struct server *s = c->srv;

	if (uidtally_add(&s->inflight_by_uid, c->uid, n) < 0)
		log_warnx("client pid %d uid %u: out of memory counting descriptors in flight",
			(int)c->pid, (unsigned)c->uid);
	c->inflight_fds += n;
	s->inflight_total += n;
	if (n > 0)
		s->sent_since_sweep = 1;
}

/* Forgets every descriptor c has in flight (received, or gone with it). */
void
inflight_forget(struct conn *c)
{
	struct server *s = c->srv;

	uidtally_sub(&s->inflight_by_uid, c->uid, c->inflight_fds);
	s->inflight_total -= c->inflight_fds;
	c->inflight_fds = 0;
}

/*
 * Forgets the descriptors of c's earlier replies once the peer has received
 * them all: SIOCOUTQ on a unix socket counts what the peer has not yet
 * read, so 0 means every descriptor sent on it left the kernel's in-flight
 * count.
 */
void
conn_confirm(struct conn *c)
{
	int unread;

	if (c->inflight_fds == 0 || ioctl(c->fd, SIOCOUTQ, &unread) != 0 || unread != 0)
		return;
	inflight_forget(c);
}

/*
 * May c send a reply carrying nfds descriptors now? Never past fd_hard in
 * all; never past fd_uid_cap for the connections of c's uid together
 * (unless none of them has anything in flight, so that one reply larger
 * than the cap can still go); and a connection that leaves replies unread
 * (pipelining without reading) also only up to fd_conn_cap of its own and
 * fd_soft in all. A client that reads each reply before its next request,
 * as libwcache does, has nothing in flight when it asks, so non-readers
 * never use up the kernel's quota that its replies need. Also makes room
 * for c's uid in the per-uid tally (no room, no memory: not now).
 */
static int
budget_has_room(struct conn *c, size_t nfds)
{
	struct server *s = c->srv;
	unsigned of_uid;

	if (s->inflight_total + nfds > s->fd_hard)
		return 0;
	of_uid = s->inflight_total > 0 ? inflight_of_uid(s, c->uid) : 0;
	if (of_uid > 0 && of_uid + nfds > s->fd_uid_cap)
		return 0;
	if (of_uid == 0 && uidtally_reserve(&s->inflight_by_uid) < 0)
		return 0;
	return c->inflight_fds == 0 || (c->inflight_fds + nfds <= s->fd_conn_cap &&
						s->inflight_total + nfds <= s->fd_soft);
}

int
fd_budget_allows(struct conn *c, size_t nfds)
{
	struct server *s = c->srv;

	conn_confirm(c);
	if (budget_has_room(c, nfds))
		return 1;
	/* The tallies may still count replies other connections have read
	 * since: a connection is confirmed only when it sends again, and a
	 * worker that holds its attach never does. Confirm them all before
	 * holding c back, at most once per loop tick unless descriptors were
	 * sent since the last sweep (a retry every DEFER_RETRY_MS otherwise),
	 * so that no client ever waits on descriptors already received: a
	 * reply sent and read within one millisecond of the last sweep is
	 * confirmed too. */
	if (s->confirmed_at == uv_now(s->loop) + 1 && !s->sent_since_sweep)
		return 0;
	s->confirmed_at = uv_now(s->loop) + 1;
	s->sent_since_sweep = 0;
	for (struct conn *o = s->conns; o != NULL; o = o->next)
		conn_confirm(o);
	return budget_has_room(c, nfds);
}

/* Bytes of what c was sent that its peer has not read (SIOCOUTQ); 0 when
 * the kernel does not say. */
static int
conn_unread_bytes(const struct conn *c)
{
	int unread;

	return ioctl(c->fd, SIOCOUTQ, &unread) == 0 ? unread : 0;
}

/*
 * Looks at every connection with a reply held back: one whose peer has
 * read nothing of what it was sent for unread_reply_ms is closed. One that
 * read something, or everything (its reply waits for descriptors other
 * clients have in flight: not its doing), starts its time again.
 */
static void
on_unread(uv_timer_t *t)
{
	struct server *s = t->data;
	uint64_t now = uv_now(s->loop) + 1;
	struct conn *c, *next;
	char more[96];
	int unread;

	for (c = s->conns; c != NULL; c = next) {
		next = c->next;
		if (c->held_ms == 0 || c->closing)
			continue;
		if ((unread = conn_unread_bytes(c)) == 0 || unread < c->held_unread) {
			c->held_ms = now;
			c->held_unread = unread;
			continue;
		}
		if (now - c->held_ms < s->unread_reply_ms)
			continue;
		s->stats.unread_closed++;
		if (server_may_warn(s, c->uid, more, sizeof(more)))
			log_warnx("client pid %d uid %u: %d bytes of the replies it was sent "
				  "unread for %u s, and the next one held back; closing the "
				  "connection (unread_reply_seconds)%s", (int)c->pid,
				(unsigned)c->uid, unread, s->unread_reply_ms / 1000, more);
		conn_close(c);
	}
}

/*
 * A reply of c is held back: while it is, wcached reads nothing more from
 * c, so a hang-up is the only way it ends, and a client can make sure none
 * ever comes: it queues a message passing its own end of the socket and
 * exits (the unread message keeps that end open, in wcached's receive
 * queue, where the kernel's garbage collector does not look). Its
 * attaches, its place under max_clients and the old generations it holds
 * then stay until wcached stops. So a connection whose peer reads nothing
 * for unread_reply_ms is closed (on_unread).
 */
void
conn_hold(struct conn *c)
{
	struct server *s = c->srv;
	uint64_t every = s->unread_reply_ms < 2000 ? s->unread_reply_ms / 2 : 1000;

	if (c->held_ms != 0)
		return;
	c->held_ms = uv_now(s->loop) + 1;
	c->held_unread = conn_unread_bytes(c);
	if (s->nheld++ == 0)
		uv_timer_start(&s->unread_timer, on_unread, every, every);
}

/* c's reply went, or c closes. */
void
conn_unhold(struct conn *c)
{
	struct server *s = c->srv;

	if (c->held_ms == 0)
		return;
	c->held_ms = 0;
	if (--s->nheld == 0)
		uv_timer_stop(&s->unread_timer);
}

/* The highest descriptor number open now: what the daemon already uses. */
static int
highest_open_fd(void)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (fd >= 0)
		close(fd);
	return fd;
}

/*
 * Derives the descriptor reserve and the in-flight budget from
 * RLIMIT_NOFILE, and warns when the limit cannot serve max_clients. The
 * kernel's in-flight quota is RLIMIT_NOFILE itself (per sending user), so
 * the hard cap leaves a quarter of it unused, non-readers together get at
 * most half, one uid an eighth, one connection at most 256 (and always
 * enough for two of the largest replies, WIRE_MAX_FDS each).
 */
void
fd_budget_init(struct server *s)
{
	unsigned limit = s->fd_limit > 0 ? (unsigned)s->fd_limit : 1u << 20;
	int room;

	/* Kept free for the control socket, logs and what wcached opens
	 * itself: a connection that would eat into them is refused, and so is
	 * a load (registry_fd_reserve(), one size for both). */
	s->fd_reserve = s->fd_limit > 0 ? (int)registry_fd_reserve((rlim_t)s->fd_limit) :
					  REGISTRY_FD_RESERVE;
	s->fd_hard = limit - limit / 4;
	s->fd_soft = limit / 2;
	s->fd_uid_cap = limit / 8;
	s->fd_conn_cap = s->fd_uid_cap < 256 ? s->fd_uid_cap : 256;
	if (s->fd_conn_cap < 2 * WIRE_MAX_FDS)
		s->fd_conn_cap = 2 * WIRE_MAX_FDS;
	if (s->fd_limit <= 0)
		return;
	room = s->fd_limit - s->fd_reserve - highest_open_fd();
	if (room <= 0)
		log_warnx("RLIMIT_NOFILE is %d: with the %d descriptors wcached keeps in reserve "
			  "there is room for no client at all; raise LimitNOFILE= (or ulimit -n)",
			s->fd_limit, s->fd_reserve);
	else if ((unsigned)room < s->max_clients)
		log_warnx("RLIMIT_NOFILE is %d: room for about %d clients, fewer than max_clients "
			  "= %u; raise LimitNOFILE= (or ulimit -n) or lower max_clients",
			s->fd_limit, room, s->max_clients);
}
