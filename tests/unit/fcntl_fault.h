/*
 * fcntl_fault.h: fcntl() failing once on demand, for the unit tests linked
 * with fcntl_fault.c and -Wl,--wrap=fcntl (tests/CMakeLists.txt):
 * test_server (the client socket's F_GETFL at start) and test_attach_reply
 * (libwcache's F_GET_SEALS and F_GETFL of the descriptors it receives).
 */
#ifndef WC_FCNTL_FAULT_H
#define WC_FCNTL_FAULT_H

#include <stdbool.h>

/* What __wrap_fcntl does: the next fcntl() with the command cmd, in any
 * thread and on any descriptor, fails with err, once; then cmd is 0 again
 * (a test that armed it reads 0 back once the failure happened). cmd 0:
 * every call goes through. */
struct fcntl_fault {
	int cmd;
	int err;
};

extern struct fcntl_fault fcntl_fault;

/* Whether the test was linked with -Wl,--wrap=fcntl. The __real_ symbol is
 * weak, so a build without the option still links; the tests that need it
 * then skip. */
bool fcntl_fault_wrapped(void);

#endif
