/*
 * fcntl_fault.c: __wrap_fcntl for the unit tests that make one fcntl()
 * fail (fcntl_fault.h): it forwards every call to the real fcntl(), the
 * argument, if any, passed on as glibc does, but the one a test armed.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>

#include "fcntl_fault.h"

struct fcntl_fault fcntl_fault;

int __real_fcntl(int fd, int cmd, ...) __attribute__((weak));
int __wrap_fcntl(int fd, int cmd, ...);

int
__wrap_fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (fcntl_fault.cmd != 0 && cmd == fcntl_fault.cmd) {
		fcntl_fault.cmd = 0;
		errno = fcntl_fault.err;
		return -1;
	}
	return __real_fcntl(fd, cmd, arg);
}

bool
fcntl_fault_wrapped(void)
{
	return __real_fcntl != NULL;
}
