/*
 * fakedaemon.h: a fake, scriptable, hostile wcached for the client
 * library's tests (test_attach.c, test_attach_reply.c,
 * test_attach_connection.c on attach_fixture.c, and test_derive.c).
 *
 * fake_main() runs in a thread: it accepts one connection on listen_fd (or
 * `connections` of them, one after the other, as a daemon that restarts
 * would see its clients come back) and answers as the script in struct
 * fake says (a good ATTACH_OK with the given descriptors, descriptors of
 * the wrong kind or number, wrong seqs, garbage, errors, refusals,
 * silence). It never uses cmocka's assertions (they longjmp, which cannot
 * cross threads): it records its first failure in failure[] for the test
 * to assert empty after joining, and every wait has a deadline, so a
 * broken client fails a test instead of hanging it.
 */
#ifndef WC_FAKEDAEMON_H
#define WC_FAKEDAEMON_H

#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/wire.h"

#define FAKE_DEADLINE_MS 10000
#define FAKE_SCM_MAX_FD 253 /* Linux: the most descriptors one sendmsg() carries */


enum fake_mode {
	FAKE_SERVE,         /* answer requests as scripted until the client closes */
	FAKE_REFUSE_EARLY,  /* send the reply (seq 0) right after accept and close */
	FAKE_REFUSE_UNREAD, /* wait for the client's packet, leave it unread, reply, close */
	FAKE_REFUSE_LATE,   /* as UNREAD, but close only once the client has received */
	FAKE_SILENT,        /* read the request, never answer, wait for the client to close */
};

enum reply_kind {
	REPLY_ATTACH_OK, /* wire_put_attach_ok(ok) */
	REPLY_BUILD,     /* wire_put_build(ok, token) */
	REPLY_ERROR,     /* wire_put_error(err_code, err_text) */
	REPLY_RAW,       /* raw[0..raw_len) as it is */
	REPLY_CLOSE,     /* no reply: close the connection */
};

/* The reply to PUBLISH (test_derive.c): an ATTACH_OK of the artifact with
 * fds, or an ERROR, or raw bytes with fds. */
struct fake_publish {
	enum reply_kind kind;
	struct wire_attach_ok ok;
	int fds[4];                 /* owned by the fixture */
	size_t nfds;
	int32_t err_code;
	const char *err_text;
	uint8_t raw[64];
	size_t raw_len;
};

#define FAKE_PUBLISHED_MAX (4u << 20) /* bytes of a published memfd the fake keeps */

struct fake {
	/* The script, set before fake_start(). */
	enum fake_mode mode;
	enum reply_kind kind;
	struct wire_attach_ok ok;
	int fds[FAKE_SCM_MAX_FD]; /* sent with the reply; owned by the fixture */
	size_t nfds;
	uint32_t seq_delta;         /* added to the request's seq in the reply */
	int32_t err_code;
	const char *err_text;
	uint8_t raw[2 * WIRE_MAX_MESSAGE];
	size_t raw_len;
	int changed_before;         /* CHANGED messages sent before the reply */
	int changed_fd;             /* sent with each of them when >= 0 */
	int changed_echo;           /* they carry the request's seq instead of 0 */
	uint64_t changed_generation; /* the generation they announce */
	const char *model;          /* the name they announce */
	int connections;            /* served one after another; 0 means 1 */
	int first_close_at;         /* the Nth ATTACH on the first connection is
				     * answered by closing it (0: never) */
	uint64_t token;             /* the build token of REPLY_BUILD */
	int derive_build;           /* DERIVE is answered with REPLY_BUILD, ATTACH as
				     * kind says */
	int derive_builds;          /* > 0, with derive_build: only the first so many
				     * DERIVEs are; the later ones as kind says */
	struct fake_publish publish; /* how PUBLISH is answered */
	int32_t abandon_err_code;   /* ABANDON: RELEASE_OK when 0, -1: HOLD_OK (the
				     * answer of another request), else this ERROR */
	int64_t hold_handle;        /* HOLD: answered HOLD_OK with this handle; 0:
				     * ERROR ENOENT (a cold daemon); -1: an ERROR
				     * of seq 0 and the connection closed (a
				     * daemon without HOLD); -2: RELEASE_OK of the
				     * HOLD's seq (the answer of another request) */
	int gone_at_hold;           /* the listening socket is closed (listen_fd -1)
				     * before a HOLD is answered: nobody accepts
				     * a connection from then on */
	sem_t *closed;              /* posted when the fake has closed the connection */
	sem_t *read;                /* waited for by FAKE_REFUSE_LATE before closing */
	sem_t *gate, *at_gate;      /* if gate is set, an ATTACH's reply waits for
				     * it, with at_gate posted on arrival */
	int stall_after;            /* > 0: once the Nth ATTACH on the first
				     * connection is answered, post stalled and
				     * read nothing until resume is posted (as a
				     * SIGSTOPped wcached) */
	sem_t *stalled, *resume;
	/* What the fake saw; read after fake_finish(). */
	int attaches;
	int releases;
	uint64_t released_handle;
	uint32_t released_seq;      /* of the last RELEASE */
	int holds;                  /* HOLDs received */
	uint64_t held_generation;   /* of the last one */
	int accepted;               /* connections accepted so far (atomic) */
	char name[WIRE_MAX_NAME + 1];
	int derives;                /* DERIVEs received */
	uint32_t wait_ms;           /* of the last one */
	char key[WIRE_MAX_KEY + 1]; /* of the last one */
	int publishes;              /* PUBLISHes received */
	uint64_t published_token;
	int published_seals;        /* F_GET_SEALS of its memfd, -1 if not a memfd */
	uint8_t *published;         /* its bytes (malloc'd, up to FAKE_PUBLISHED_MAX;
				     * the test frees it) */
	size_t published_len;       /* the memfd's whole size */
	int abandons;               /* ABANDONs received */
	uint64_t abandoned_token;
	char reason[WIRE_MAX_REASON + 1]; /* of the last one */
	char failure[256];
	/* Internal. */
	int listen_fd;
	int conn; /* the accepted connection while open, else -1 (atomic) */
	pthread_t thread;
	int started;
};

/* The fake daemon's thread (arg: struct fake): its connections, then exit.
 * The handle of an ATTACH_OK is ok.handle plus the number of connections
 * accepted before this one, so a test can tell which connection a RELEASE
 * came over. */
void *fake_main(void *arg);

/* Records the fake's first failure, for the test to assert after joining. */
void fake_fail(struct fake *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Waits until fd is readable (or hung up); > 0, or <= 0 at the deadline. */
int fake_wait_readable(int fd);

/* Sends len bytes and n descriptors with a plain sendmsg(), bypassing
 * fdp_send()'s checks (n up to the kernel's limit, len 0 allowed), as a
 * hostile daemon would. */
ssize_t fake_raw_send(int sock, const void *buf, size_t len, const int *fds, size_t n);

/* Waits for s with the deadline; 0 or -1. */
int fake_sem_wait(sem_t *s);

/* A SOCK_SEQPACKET socket listening at path, for listen_fd; -1 on failure. */
int fake_listen(const char *path);

/* The daemon's status page as wcached makes it: a sealed memfd called
 * "wctest-status" of bytes bytes, magic in slot 0 and generation in slot,
 * with the daemon's writable mapping (made before the seals) in *map, to
 * announce new generations through. Returns the memfd, or -1. */
int fake_status_page(size_t bytes, uint64_t slot, uint64_t generation, uint64_t **map);

/* Joins the fake's thread if it was started. */
void fake_join(struct fake *k);

#endif
