/*
 * warm_fault.c: fault injection for the tests of the warming pool
 * (test_warm, test_warm_jobs). It defines pread() and sendfile() itself:
 * the executable's definitions win over libc's for warm.o from the static
 * wcdaemon library, as in test_fdpass.c. They forward to the kernel unless
 * a test asked for EINTR, EIO or (sendfile) EINVAL through the knobs in
 * warm_fixture.h (struct warm_fault), and count their calls.
 */
#include <errno.h>
#include <stdatomic.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "warm_fixture.h"

/* A read of a filesystem whose server hangs: returns once fault.hang is
 * cleared. */
static void
maybe_hang(void)
{
	while (atomic_load(&fault.hang))
		usleep(1000);
}

ssize_t
sendfile(int out, int in, off_t *off, size_t n)
{
	atomic_fetch_add(&fault.sendfiles, 1);
	maybe_hang();
	if (atomic_load(&fault.sendfile_einval) > 0) {
		atomic_fetch_sub(&fault.sendfile_einval, 1);
		errno = EINVAL;
		return -1;
	}
	if (atomic_load(&fault.sendfile_eio) > 0) {
		atomic_fetch_sub(&fault.sendfile_eio, 1);
		errno = EIO;
		return -1;
	}
	return syscall(SYS_sendfile, out, in, off, n);
}

ssize_t
pread(int fd, void *buf, size_t n, off_t off)
{
	atomic_fetch_add(&fault.preads, 1);
	maybe_hang();
	if (atomic_load(&fault.eintr) > 0) {
		atomic_fetch_sub(&fault.eintr, 1);
		errno = EINTR;
		return -1;
	}
	if (atomic_load(&fault.eio_after) > 0 && atomic_fetch_sub(&fault.eio_after, 1) == 1) {
		errno = EIO;
		return -1;
	}
	return syscall(SYS_pread64, fd, buf, n, off);
}
