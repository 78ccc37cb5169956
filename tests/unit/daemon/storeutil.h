/*
 * storeutil.h: helpers for the unit tests of the warm restart
 * (test_restore_store, test_restore): a service manager with a file
 * descriptor store of the test's own (a datagram socket at
 * $NOTIFY_SOCKET that the test reads when it chooses, takes away and
 * brings back), and handing what it stores to restore_take() as systemd
 * hands it to the next process (the descriptors at 3.., LISTEN_PID,
 * LISTEN_FDS, LISTEN_FDNAMES).
 */
#ifndef WC_STOREUTIL_H
#define WC_STOREUTIL_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "notify.h"

struct fdstore_desc;

/* One message the manager received. */
struct su_received {
	int store;                        /* FDSTORE=1, else FDSTOREREMOVE=1 */
	char name[NOTIFY_MAX_FDNAME + 1];
	int fd;                           /* a store's first descriptor (the manager's), or -1 */
};

#define SU_MAX_RECEIVED 256

/* The manager: its socket, where it listens, and what it received, in
 * order. */
struct su_manager {
	int sock;
	struct sockaddr_un addr;
	size_t n;
	struct su_received got[SU_MAX_RECEIVED];
};

/* Binds m at dir/notify.sock, points $NOTIFY_SOCKET there and opens the
 * notifications (notify_init). */
void su_manager_start(struct su_manager *m, const char *dir);

/* Binds m's socket at its address again, after su_manager_gone(). */
void su_manager_listen(struct su_manager *m);

/* The manager goes away (as while it re-executes): sends to its address
 * fail until su_manager_listen(). */
void su_manager_gone(struct su_manager *m);

/* Reads what the manager has, without waiting, into m->got. */
void su_manager_read(struct su_manager *m);

/* How many of the messages from from on are stores (store 1) or removals
 * (0) of name. */
unsigned su_received(const struct su_manager *m, size_t from, int store, const char *name);

/* The description m received last, decoded (fdstore_free it); fails the
 * test when there is none. */
struct fdstore_desc *su_last_description(const struct su_manager *m);

/* Closes the notifications and m, and every descriptor it received. */
void su_manager_stop(struct su_manager *m);

/* How many descriptors su_manager_pass() can place at 3.. */
#define SU_LOW_FDS 16

/* Holds the free descriptor numbers among 3 .. 3 + SU_LOW_FDS - 1 (with
 * /dev/null) until su_manager_pass() places the store there; the first call
 * moves what the test runner left there out of the way. Call it first in
 * main(), before libuv's first loop, whose process-wide signal pipe would
 * take 3 and 4 for good, and again before each su_manager_pass(). */
void su_hold_low_fds(void);

/*
 * What m stores now (each name's last store, unless a removal came after
 * it) handed to the next process as systemd does: m stops
 * (su_manager_stop), and each descriptor is at 3, 4, ... (those numbers
 * must be free then, or held by su_hold_low_fds(): assert), with
 * LISTEN_PID our pid, LISTEN_FDS and LISTEN_FDNAMES. Returns how many.
 */
size_t su_manager_pass(struct su_manager *m);

#endif
