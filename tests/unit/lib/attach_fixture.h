/*
 * attach_fixture.h: the fixture of the unit tests of libwcache's attach
 * path (test_attach, test_attach_reply, test_attach_connection) against
 * the fake, hostile wcached of fakedaemon.c.
 *
 * Each test listens on a SOCK_SEQPACKET socket in a temporary directory and
 * runs the fake daemon in a thread. setup() scripts the reply wcached
 * sends: ATTACH_OK with a real sealed index memfd (built with
 * client/format/index.h's builder), real model files (a.bin, b.bin) and the
 * daemon's status page; a test changes the script before fake_start(). The
 * checks here are the exact code and a substring of wc_errmsg()
 * (assert_error), that the process holds as many descriptors afterwards as
 * before (tu_count_fds) and that no mapping of the index, a model file or
 * a bad status page is left behind (/proc/self/maps), which is how a leak
 * on an error path would show.
 *
 * The fake daemon (fakedaemon.c) never uses cmocka's assertions (they
 * longjmp, which cannot cross threads): fake_finish() asserts that it
 * recorded no failure, and every wait it does has a deadline, so a broken
 * client fails a test instead of hanging it.
 *
 * The knobs of the fault injection live here, so that setup() can reset
 * them; each wrapper lives in the one test linked with its --wrap option
 * (tests/CMakeLists.txt): __wrap_mmap and __wrap_fstat in
 * test_attach_reply.c, __wrap_recvmsg and __wrap_connect in
 * test_attach_connection.c. test_attach_reply's __wrap_fcntl is the one
 * test_server uses too, tests/unit/fcntl_fault.c, with its knob.
 */
#ifndef WC_ATTACH_FIXTURE_H
#define WC_ATTACH_FIXTURE_H

#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fakedaemon.h"
#include "lib/wcache.h"

#define MODEL "llama"
#define GENERATION 7u
#define HANDLE 42u
#define SLOT 3u
#define A_SIZE 256u /* a.bin: tensors alpha (F32 4x4 at 0) and gamma (I16 2x8 at 128) */
#define B_SIZE 96u  /* b.bin: tensor beta (U8 32 at 64) */
#define PAGE_SIZE_BYTES 4096u
#define DEADLINE_MS FAKE_DEADLINE_MS
#define KERNEL_SCM_MAX_FD FAKE_SCM_MAX_FD

/* What the wrappers do (mmap_ knobs: __wrap_mmap, recv_ knobs:
 * __wrap_recvmsg, connect_: __wrap_connect, fstat_: __wrap_fstat; fcntl's
 * are fcntl_fault.h's), and
 * the semaphores through which the fake daemon and the client's receive
 * wait for each other; setup() clears them. */
struct af_fault {
	int mmap_fail_at;    /* > 0: fail the Nth file-backed mmap() from now on */
	int mmap_calls;      /* file-backed mmap() calls while armed */
	int mmap_failed;     /* the number of the call that was failed, 0 if none */
	int connect_eintr;   /* > 0: so many connect() calls from now on fail with EINTR */
	int connect_delay_ms; /* > 0: the next connect() waits so long first */
	ino_t fstat_ino;     /* != 0: the client thread's next fstat() of this inode fails, */
	int fstat_errno;     /* ... with this errno */
	pthread_t client;    /* the thread whose recvmsg() the hooks below apply to */
	int recv_wait_close; /* before its next recvmsg(): wait until the fake closed */
	int recv_post_read;  /* after its next recvmsg(): post fault.read */
	int recv_hold;       /* after its next recvmsg() that got descriptors: post
			      * fault.read, then wait for fault.go */
	int recv_eagain;     /* > 0: so many of its recvmsg() from now on fail with EAGAIN */
	int send_errno;      /* != 0: its next send_count sendmsg() fail with this errno */
	int send_count;
	sem_t closed;        /* posted by the fake daemon when it has closed */
	sem_t read;          /* posted by the client's hooked recvmsg() */
	sem_t go;            /* posted by a test to let a held recvmsg() return */
};

extern struct af_fault fault;

struct fixture {
	char *dir;
	char *sock;
	char *file_path[2]; /* dir/a.bin, dir/b.bin */
	int file_fd[2];     /* the daemon's O_RDONLY descriptors */
	uint8_t *index;     /* the good index */
	size_t index_len;
	int index_fd;       /* ... in a sealed memfd */
	int status_fd;      /* the daemon's status page, sealed */
	uint64_t *status;   /* the daemon's writable mapping of it */
	struct fake fake;
	wc_client *client;  /* cleaned up by teardown when a test failed early */
	wc_model *model;
	int extra[32];      /* descriptors a test made, closed by teardown */
	size_t nextra;
};

/* The bytes of a.bin and b.bin, so that a test can tell which file and
 * which offset a tensor's data came from. */
uint8_t a_byte(size_t i);
uint8_t b_byte(size_t i);

/* Keeps fd for teardown to close; returns it. */
int keep(struct fixture *f, int fd);

/* A memfd called name holding data, with seals added (none if 0; without
 * MFD_ALLOW_SEALING when seals is -1). */
int memfd_make(const char *name, const void *data, size_t len, int seals);

/* The cmocka setup: a temporary directory with a.bin and b.bin, their
 * read-only descriptors, the good index in a sealed memfd, the status page
 * (GENERATION in SLOT), the listening socket, the script of a good reply
 * and the fault knobs cleared. teardown() undoes it and whatever a failed
 * test left behind. */
int setup(void **state);
int teardown(void **state);

/* Starts the fake daemon with the current script and fresh results. */
void fake_start(struct fixture *f);

/* Joins the fake daemon and asserts that it saw nothing wrong. */
void fake_finish(struct fixture *f);

/* Sets the n descriptors (ints) the fake sends with its reply. */
void fake_fds(struct fixture *f, size_t n, ...);

/* Asserts how many mappings of the index memfds, of the model files and of
 * the status page (the fake's own included) this process holds, and that
 * no bad status page is mapped. */
void assert_maps(struct fixture *f, int index, int files, int status);

/* Asserts code r and a message holding want. */
void assert_error(int r, int code, const char *want);

/* Disconnects, joins the fake and asserts that the process holds the
 * descriptors it held before and no mapping of the model. */
void finish(struct fixture *f, int fds_before);

/* Connects to the fake running the current script and attaches MODEL,
 * expecting code and a message holding want, with nothing left behind. */
void attach_fails(struct fixture *f, int code, const char *want);

/* As attach_fails(), for a reply that puts the client out of step with the
 * daemon: the second attach, over a new connection, must fail the same
 * way. */
void attach_fails_out_of_step(struct fixture *f, int code, const char *want);

/* Connects and attaches MODEL, which must succeed (the model in f->model);
 * returns the descriptor count from before. */
int attach_ok(struct fixture *f);

/* Checks every tensor of m against the files' bytes. */
void check_tensors(const wc_model *m);

/* Checks the tensors of f->model, releases it and finish()es: the end of a
 * test whose attach worked. */
void release_and_finish(struct fixture *f, int fds_before);

/* Sets slot of the fake's status page to value, as wcached would. */
void set_slot(struct fixture *f, uint64_t slot, uint64_t value);

/* Skips the calling test (cmocka's skip()) unless wrapped: the binary was
 * linked with the --wrap option it needs, named by option. */
void af_need_wrap(int wrapped, const char *option);

/* Waits for the child pid, which must exit with 0. */
void af_child_ok(pid_t pid);

/* A forked child lets the parent's f->model and f->client go, after (with
 * reuse) closing the connection's number, as closefrom() does, and putting
 * a socket of its own on it: that socket must stay open; without reuse
 * the inherited connection must be closed. Waits for it (af_child_ok). */
void af_child_closes_from(struct fixture *f, int reuse);

#endif
