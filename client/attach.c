/*
 * attach.c: attaching models through wcached (wc_connect, wc_attach,
 * wc_disconnect) and telling it when they are released.
 *
 * One request, one reply: the client sends ATTACH with the model's name on
 * a SOCK_SEQPACKET socket and receives ATTACH_OK with the sealed index memfd
 * and one read-only descriptor per model file. Every received descriptor is
 * checked (type, size, seals), mapped, and closed: the model keeps only the
 * mappings, which outlive the descriptors, the connection and the daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "error.h"
#include "fdpass.h"
#include "model.h"
#include "wire.h"

_Static_assert(INDEX_MAX_FILES == WIRE_MAX_FILES, "an attach passes the index, every file and the status page");

#define DEFAULT_SOCKET "/run/wcached/wcached.sock"
#define REQUIRED_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define STATUS_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)
#define STATUS_MAGIC 0x54534357u /* "WCST" in slot 0 */
#define STATUS_MAX_BYTES (1u << 20)

struct wc_client {
	int fd;
	pid_t pid;            /* the process that connected */
	uint32_t seq;
	char *path;
	pthread_mutex_t lock; /* one request at a time on the socket */
	wc_model *models;     /* attached through this client, still held */
};

int
wc_connect(const char *socket_path, wc_client **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	wc_client *c;
	int fd;

	if (out == NULL)
		return error_set(-EINVAL, "wc_connect: no output");
	if (socket_path == NULL)
		socket_path = getenv("WCACHE_SOCKET");
	if (socket_path == NULL || *socket_path == '\0')
		socket_path = DEFAULT_SOCKET;
	if (strlen(socket_path) >= sizeof(sa.sun_path))
		return error_set(-ENAMETOOLONG, "%s: socket path longer than %zu bytes",
			socket_path, sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, socket_path, strlen(socket_path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) == -1)
		return error_set(-errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == -1) {
		int e = errno;

		close(fd);
		if (e == ENOENT || e == ECONNREFUSED)
			return error_set(-e, "wcached is not running at %s (%s)", socket_path,
				strerror(e));
		return error_set(-e, "cannot connect to wcached at %s: %s", socket_path,
			strerror(e));
	}
	if ((c = calloc(1, sizeof(*c))) == NULL || (c->path = strdup(socket_path)) == NULL) {
		free(c);
		close(fd);
		return error_set(-ENOMEM, "wc_connect: out of memory");
	}
	c->fd = fd;
	c->pid = getpid();
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

/*
 * Sends one request and receives its reply (matching seq) into buf, with up
 * to maxfds descriptors, which pass to the caller. Replies to other requests
 * (there should be none) are dropped with their descriptors closed.
 */
static ssize_t
roundtrip(wc_client *c, const uint8_t *req, size_t req_len, uint32_t seq, uint8_t *buf,
	size_t cap, int *fds, size_t maxfds, size_t *nfds, struct wire_message *msg)
{
	ssize_t n;
	int r;

	/*
	 * A daemon that refuses a connection (too many clients) sends one
	 * ERROR and closes. Our request may then fail to send, and the first
	 * receive report ECONNRESET before the queued ERROR: read on, so the
	 * caller sees the daemon's reason rather than a bare reset.
	 */
	int reset = 0;

	if ((n = fdp_send(c->fd, req, req_len, NULL, 0)) < 0) {
		if (n != -EPIPE && n != -ECONNRESET)
			return error_set((int)n, "wcached at %s: send: %s", c->path,
				strerror((int)-n));
		reset = 1;
	}
	for (;;) {
		n = fdp_recv(c->fd, buf, cap, fds, maxfds, nfds);
		if (n == -ECONNRESET && !reset) {
			reset = 1;
			continue;
		}
		if (reset && n >= 0 && wire_decode(buf, (size_t)n, msg) == 0 &&
			msg->h.type == WIRE_ERROR)
			return n; /* the refusal, whatever its seq */
		if (reset && n >= 0) {
			fdp_close_all(fds, *nfds);
			n = 0;
		}
		if (n == 0)
			return error_set(-ECONNRESET, "wcached at %s closed the connection",
				c->path);
		if (n < 0) {
			shutdown(c->fd, SHUT_RDWR);
			return error_set((int)n, "wcached at %s: receive: %s", c->path,
				strerror((int)-n));
		}
		if ((r = wire_decode(buf, (size_t)n, msg)) < 0) {
			fdp_close_all(fds, *nfds);
			/* Out of step with the daemon: no later reply can be
			 * trusted on this connection. */
			shutdown(c->fd, SHUT_RDWR);
			return error_set(r, "wcached at %s sent a malformed reply%s", c->path,
				r == -EPROTO ? " (protocol version mismatch: update libwcache or "
					       "wcached)" : "");
		}
		/* An ERROR with seq 0 answers no request in particular: the
		 * daemon refused the connection or could not read a header. */
		if (msg->h.type != WIRE_CHANGED && (msg->h.seq == seq ||
							   (msg->h.type == WIRE_ERROR && msg->h.seq == 0)))
			return n;
		fdp_close_all(fds, *nfds);
		if (msg->h.type != WIRE_CHANGED) {
			shutdown(c->fd, SHUT_RDWR);
			return error_set(-EBADMSG, "wcached at %s answered request %u with %u",
				c->path, seq, msg->h.seq);
		}
		/* An announcement: drop it; the status page says what changed. */
	}
}

/* Checks a received descriptor and maps it whole, read-only. */
static int
map_fd(int fd, uint64_t want, int memfd, const char *what, const uint8_t **base)
{
	struct stat st;
	void *p;

	if (fstat(fd, &st) == -1)
		return error_set(-errno, "%s: fstat: %s", what, strerror(errno));
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != want)
		return error_set(-EBADMSG, "%s: received descriptor is not a %llu-byte file",
			what, (unsigned long long)want);
	if (memfd) {
		int seals = fcntl(fd, F_GET_SEALS);

		if (seals == -1 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS)
			return error_set(-EBADMSG, "%s: index is not sealed", what);
	} else if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY) {
		/* wcached passes model files read-only; anything else is not
		 * from wcached. */
		return error_set(-EBADMSG, "%s: received a writable descriptor", what);
	}
	if (want == 0) {
		*base = NULL;
		return 0;
	}
	/* Model files MAP_PRIVATE (see file.c and wc_model_cow()); the sealed
	 * index stays MAP_SHARED and is populated now: one call maps its pages
	 * (0.3 ms for 50,000 tensors) instead of a fault per page on the first
	 * lookups, which cost more in total. */
	p = mmap(NULL, (size_t)want, PROT_READ,
		memfd ? MAP_SHARED | MAP_POPULATE : MAP_PRIVATE | MAP_NORESERVE,
		fd, 0);
	if (p == MAP_FAILED)
		return error_set(-errno, "%s: mmap: %s", what, strerror(errno));
	*base = p;
	return 0;
}

/*
 * Maps the daemon's status page for wc_model_stale(). The page must be a
 * sealed memfd that cannot shrink (so reading it never faults) with the
 * magic in slot 0. A page that fails a check is ignored: the model works,
 * only its stale checks say 0.
 */
static void
map_status(wc_model *m, int fd, uint64_t slot)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);
	void *p;

	if (slot == 0 || seals == -1 || (seals & STATUS_SEALS) != STATUS_SEALS ||
		fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
		(uint64_t)st.st_size > STATUS_MAX_BYTES || slot >= (uint64_t)st.st_size / 8)
		return;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return;
	if (__atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE) != STATUS_MAGIC) {
		munmap(p, (size_t)st.st_size);
		return;
	}
	m->status_page = p;
	m->status_len = (size_t)st.st_size;
	m->status_word = (const uint64_t *)p + slot;
}

/* Builds a model from ATTACH_OK's descriptors: fds[0] is the index. */
static int
model_from_fds(const char *name, const struct wire_attach_ok *ok, const int *fds, size_t nfds,
	wc_model **out)
{
	struct index_header h;
	struct model_map *maps = NULL;
	const uint8_t *index = NULL;
	size_t mapped = 0;
	int r;

	size_t want = 1 + (size_t)ok->file_count + ((ok->flags & WIRE_ATTACH_STATUS) ? 1 : 0);

	if (nfds != want || ok->index_size > INDEX_MAX_SIZE)
		return error_set(-EBADMSG, "model \"%s\": wcached sent %zu descriptors for %u files",
			name, nfds, ok->file_count);
	if ((r = map_fd(fds[0], ok->index_size, 1, name, &index)) < 0)
		return r;
	if ((r = index_open(index, (size_t)ok->index_size, &h)) < 0 ||
		h.file_count != ok->file_count) {
		char why[256];

		snprintf(why, sizeof(why), "%s", r < 0 ? error_get() : "file count differs");
		r = r < 0 ? r : -EBADMSG;
		error_set(r, "model \"%s\": wcached sent a damaged index (%s)", name, why);
		goto fail;
	}
	if ((maps = calloc(h.file_count, sizeof(*maps))) == NULL) {
		r = error_set(-ENOMEM, "model \"%s\": out of memory", name);
		goto fail;
	}
	for (; mapped < h.file_count; mapped++) {
		const char *fname;

		if ((r = index_file_at(index, &h, mapped, &fname, &maps[mapped].size)) < 0 ||
			(r = map_fd(fds[1 + mapped], maps[mapped].size, 0, fname,
				 &maps[mapped].base)) < 0) {
			error_prefix(name);
			goto fail;
		}
	}
	if ((r = model_new(name, index, (size_t)ok->index_size, 1, maps, mapped, out)) < 0)
		goto fail;
	if (ok->flags & WIRE_ATTACH_STATUS)
		map_status(*out, fds[1 + ok->file_count], ok->status_slot);
	return 0;
fail:
	for (size_t i = 0; i < mapped; i++)
		if (maps[i].base != NULL)
			munmap((void *)maps[i].base, (size_t)maps[i].size);
	free(maps);
	if (index != NULL)
		munmap((void *)index, (size_t)ok->index_size);
	return r;
}

int
wc_attach(wc_client *c, const char *model, wc_model **out)
{
	uint8_t req[WIRE_MAX_MESSAGE], buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0, len;
	struct wire_message msg;
	struct wire_attach_ok ok;
	wc_model *m;
	ssize_t n;
	uint32_t seq;
	int r;

	if (c == NULL || model == NULL || out == NULL)
		return error_set(-EINVAL, "wc_attach: no client or model name");
	if (c->pid != getpid())
		return error_set(-ECHILD, "model \"%s\": this client was connected by process %d; "
			"call wc_connect() again after fork()", model, (int)c->pid);
	len = strlen(model);
	if (len == 0 || len > WIRE_MAX_NAME)
		return error_set(-EINVAL, "model \"%.64s\": name must be 1 to %u bytes", model,
			WIRE_MAX_NAME);

	pthread_mutex_lock(&c->lock);
	seq = ++c->seq;
	n = wire_put_attach(req, sizeof(req), seq, model, len);
	if (n >= 0)
		n = roundtrip(c, req, (size_t)n, seq, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds,
			&msg);
	if (n < 0) {
		pthread_mutex_unlock(&c->lock);
		return (int)n;
	}
	if (msg.h.type == WIRE_ERROR) {
		int32_t code;
		const char *text;
		size_t tlen;

		fdp_close_all(fds, nfds);
		pthread_mutex_unlock(&c->lock);
		if (wire_get_error(&msg, &code, &text, &tlen) < 0)
			return error_set(-EBADMSG, "model \"%s\": malformed error from wcached at %s",
				model, c->path);
		code = -code; /* the wire carries positive errno values */
		if (code == -ENOENT)
			return error_set(code, "model \"%s\" is not served by wcached at %s", model,
				c->path);
		return error_set(code, "model \"%s\": %.*s (wcached at %s)", model, (int)tlen,
			text, c->path);
	}
	if (msg.h.type != WIRE_ATTACH_OK || wire_get_attach_ok(&msg, &ok) < 0) {
		fdp_close_all(fds, nfds);
		shutdown(c->fd, SHUT_RDWR);
		pthread_mutex_unlock(&c->lock);
		return error_set(-EBADMSG, "model \"%s\": unexpected reply from wcached at %s",
			model, c->path);
	}
	r = model_from_fds(model, &ok, fds, nfds, &m);
	fdp_close_all(fds, nfds);
	if (r == -EBADMSG)
		shutdown(c->fd, SHUT_RDWR); /* a reply we cannot use: not wcached */
	if (r < 0) {
		pthread_mutex_unlock(&c->lock);
		return r;
	}
	m->generation = ok.generation;
	m->handle = ok.handle;
	m->pid = c->pid;
	m->client = c;
	m->next = c->models;
	if (c->models != NULL)
		c->models->prevp = &m->next;
	m->prevp = &c->models;
	c->models = m;
	pthread_mutex_unlock(&c->lock);
	*out = m;
	return 0;
}

/* Unlinks m from its client's list; the client's lock is held. */
static void
unlink_model(wc_model *m)
{
	*m->prevp = m->next;
	if (m->next != NULL)
		m->next->prevp = m->prevp;
	m->client = NULL;
	m->next = NULL;
	m->prevp = NULL;
}

void
attach_forget(wc_model *m)
{
	wc_client *c = m->client;
	uint8_t req[64], buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0;
	struct wire_message msg;
	uint32_t seq;
	ssize_t n;

	if (c == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	unlink_model(m);
	/* Only the process that attached holds the daemon's handle; a child
	 * after fork() shares the socket and must stay silent on it. */
	if (m->pid == getpid() && c->pid == getpid()) {
		seq = ++c->seq;
		n = wire_put_release(req, sizeof(req), seq, m->handle);
		if (n >= 0 && roundtrip(c, req, (size_t)n, seq, buf, sizeof(buf), fds,
				      WIRE_MAX_FDS, &nfds, &msg) >= 0)
			fdp_close_all(fds, nfds);
	}
	pthread_mutex_unlock(&c->lock);
}

int
wc_client_fd(const wc_client *c)
{
	return c == NULL ? -1 : c->fd;
}

int
wc_client_dispatch(wc_client *c)
{
	uint8_t buf[WIRE_MAX_MESSAGE];
	int fds[WIRE_MAX_FDS];
	size_t nfds = 0;
	struct wire_message msg;
	ssize_t n;
	int count = 0;

	if (c == NULL)
		return error_set(-EINVAL, "wc_client_dispatch: no client");
	pthread_mutex_lock(&c->lock);
	for (;;) {
		/* Only announcements can be waiting: replies are read by the
		 * request that caused them, under the same lock. */
		n = recv(c->fd, buf, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			pthread_mutex_unlock(&c->lock);
			return error_set(n == 0 ? -ECONNRESET : -errno,
				"wcached at %s closed the connection", c->path);
		}
		n = fdp_recv(c->fd, buf, sizeof(buf), fds, WIRE_MAX_FDS, &nfds);
		if (n == -EAGAIN)
			break;
		if (n <= 0) {
			pthread_mutex_unlock(&c->lock);
			return error_set(n == 0 ? -ECONNRESET : (int)n,
				"wcached at %s: receive: %s", c->path,
				strerror(n == 0 ? ECONNRESET : (int)-n));
		}
		fdp_close_all(fds, nfds);
		if (wire_decode(buf, (size_t)n, &msg) == 0 && msg.h.type == WIRE_CHANGED)
			count++;
	}
	pthread_mutex_unlock(&c->lock);
	return count;
}

void
wc_disconnect(wc_client *c)
{
	if (c == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	/* The models outlive the client: detach them all at once. */
	for (wc_model *m = c->models, *next; m != NULL; m = next) {
		next = m->next;
		m->client = NULL;
		m->next = NULL;
		m->prevp = NULL;
	}
	c->models = NULL;
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	close(c->fd);
	free(c->path);
	free(c);
}
