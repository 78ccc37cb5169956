/*
 * storeutil.c: see storeutil.h.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "storeutil.h"
#include "fdstore.h"

void
su_manager_listen(struct su_manager *m)
{
	m->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(m->sock >= 0);
	assert_int_equal(bind(m->sock, (const struct sockaddr *)&m->addr, sizeof(m->addr)), 0);
}

void
su_manager_start(struct su_manager *m, const char *dir)
{
	memset(m, 0, sizeof(*m));
	m->addr.sun_family = AF_UNIX;
	snprintf(m->addr.sun_path, sizeof(m->addr.sun_path), "%s/notify.sock", dir);
	su_manager_listen(m);
	assert_int_equal(setenv("NOTIFY_SOCKET", m->addr.sun_path, 1), 0);
	assert_int_equal(notify_init(), 1);
}

void
su_manager_gone(struct su_manager *m)
{
	close(m->sock);
	m->sock = -1;
	assert_int_equal(unlink(m->addr.sun_path), 0);
}

/* The descriptors one message carried: the first in *fd, the others
 * closed. */
static void
take_fds(struct msghdr *msg, int *fd)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		for (size_t i = 0; i < k; i++) {
			int got;

			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*fd < 0)
				*fd = got;
			else
				close(got);
		}
	}
}

void
su_manager_read(struct su_manager *m)
{
	char buf[NOTIFY_MAX_MESSAGE + 1];
	union {
		struct cmsghdr align;
		unsigned char buf[CMSG_SPACE(sizeof(int) * NOTIFY_MAX_STORE_FDS)];
	} control;
	ssize_t n;

	for (;;) {
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) - 1 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = control.buf, .msg_controllen = sizeof(control.buf) };
		struct su_received *r;
		const char *name;
		int fd = -1;

		if ((n = recvmsg(m->sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC)) < 0)
			break;
		buf[n] = '\0';
		take_fds(&msg, &fd);
		assert_true(m->n < SU_MAX_RECEIVED);
		assert_non_null(name = strstr(buf, "FDNAME="));
		r = &m->got[m->n++];
		r->store = strncmp(buf, "FDSTORE=1\n", 10) == 0;
		r->fd = fd;
		snprintf(r->name, sizeof(r->name), "%s", name + 7);
	}
}

unsigned
su_received(const struct su_manager *m, size_t from, int store, const char *name)
{
	unsigned k = 0;

	for (size_t i = from; i < m->n; i++)
		k += m->got[i].store == store && strcmp(m->got[i].name, name) == 0;
	return k;
}

struct fdstore_desc *
su_last_description(const struct su_manager *m)
{
	struct fdstore_desc *d = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;

	for (size_t i = m->n; i-- > 0;)
		if (m->got[i].store && strcmp(m->got[i].name, FDSTORE_NAME_DESC) == 0) {
			assert_int_equal(fdstore_memfd_read(m->got[i].fd, &buf, &len), 0);
			assert_int_equal(fdstore_decode(buf, len, &d), 0);
			free(buf);
			return d;
		}
	fail_msg("no description received");
	return NULL;
}

void
su_manager_stop(struct su_manager *m)
{
	notify_close();
	unsetenv("NOTIFY_SOCKET");
	for (size_t i = 0; i < m->n; i++)
		if (m->got[i].fd >= 0)
			close(m->got[i].fd);
	m->n = 0;
	if (m->sock >= 0)
		close(m->sock);
	m->sock = -1;
}

/* The numbers su_hold_low_fds() holds: 1 where it put /dev/null. */
static int held_low[SU_LOW_FDS];

void
su_hold_low_fds(void)
{
	static int first = 1;

	for (int i = 0; i < SU_LOW_FDS; i++) {
		int fd;

		/* The first time, what the test runner left there moves up
		 * (nothing here knows it by its number). */
		if (first && !held_low[i] && fcntl(3 + i, F_GETFD) != -1) {
			assert_true(fcntl(3 + i, F_DUPFD_CLOEXEC, 100) >= 0);
			close(3 + i);
		}
		if (held_low[i] || fcntl(3 + i, F_GETFD) != -1)
			continue;
		fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		assert_true(fd >= 0);
		if (fd != 3 + i) {
			assert_int_equal(dup3(fd, 3 + i, O_CLOEXEC), 3 + i);
			close(fd);
		}
		held_low[i] = 1;
	}
	first = 0;
}

/* Is m->got[i] what the manager stores under its name now (its last store,
 * with no removal of the name after it)? */
static int
still_stored(const struct su_manager *m, size_t i)
{
	if (!m->got[i].store || m->got[i].fd < 0)
		return 0;
	for (size_t k = i + 1; k < m->n; k++)
		if (strcmp(m->got[k].name, m->got[i].name) == 0)
			return 0;
	return 1;
}

size_t
su_manager_pass(struct su_manager *m)
{
	char names[SU_MAX_RECEIVED * (NOTIFY_MAX_FDNAME + 1)] = "", count[16], pid[16];
	int high[SU_MAX_RECEIVED];
	size_t n = 0, len = 0;

	/* Copies out of the way first: the manager's may sit at 3.. */
	for (size_t i = 0; i < m->n; i++) {
		if (!still_stored(m, i))
			continue;
		high[n] = fcntl(m->got[i].fd, F_DUPFD_CLOEXEC, 500);
		assert_true(high[n] >= 0);
		len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", n > 0 ? ":" : "",
			m->got[i].name);
		n++;
	}
	/* The manager's own go, and the notifications: as for a new process. */
	su_manager_stop(m);
	assert_true(n <= SU_LOW_FDS);
	for (size_t i = 0; i < n; i++) {
		if (held_low[i]) {
			close(3 + (int)i);
			held_low[i] = 0;
		}
		assert_true(fcntl(3 + (int)i, F_GETFD) == -1); /* free */
		assert_int_equal(dup2(high[i], 3 + (int)i), 3 + (int)i);
		close(high[i]);
	}
	snprintf(count, sizeof(count), "%zu", n);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	assert_int_equal(setenv("LISTEN_PID", pid, 1), 0);
	assert_int_equal(setenv("LISTEN_FDS", count, 1), 0);
	assert_int_equal(setenv("LISTEN_FDNAMES", names, 1), 0);
	return n;
}
