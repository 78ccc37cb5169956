"""tools.py: the C tools of tests/tools the system checks run, compiled on
the host (Debian 12, as the container) with cc, and a watch on model files
that sees every open(2) and read(2) of them.

mkmodel needs only the C library. load_worker and restart_worker are built
the way a user of the packages builds a worker: against the wcache.h and
libwcache.so that libwcache-dev installed in the container (a copy of the
header in its own folder, so that no other wcache.h on the host is found
first), and they run there against the installed libwcache0.
"""
import ctypes
import glob
import os
import shutil
import struct
import subprocess

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools")
CFLAGS = ["-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"]


def compile_tool(name, out, extra=()):
    """Compiles tests/tools/NAME.c into OUT; raises RuntimeError with the
    compiler's messages when it fails."""
    cmd = ["cc", *CFLAGS, "-I", SRC, "-o", out, os.path.join(SRC, f"{name}.c"), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {r.returncode}:\n{r.stderr}")
    return out


def build_mkmodel(workdir):
    """mkmodel, to run on the host: it writes models into the container's
    root from outside."""
    return compile_tool("mkmodel", os.path.join(workdir, "mkmodel"))


def build_worker(container, workdir, name, inside):
    """tests/tools/NAME.c (a worker) at INSIDE (a path in the container),
    built against the installed libwcache-dev."""
    include = os.path.join(workdir, "libwcache-dev-include")
    os.makedirs(include, exist_ok=True)
    shutil.copy(container.path("/usr/include/wcache.h"), include)
    libs = glob.glob(container.path("/usr/lib/*/libwcache.so"))
    if len(libs) != 1:
        raise RuntimeError(f"libwcache-dev installed {len(libs)} libwcache.so in the container")
    return compile_tool(name, container.path(inside), ["-I", include, libs[0]])


# inotify(7): what a read of a file cannot avoid. Opening a file is
# IN_OPEN; read(2), pread(2), readv(2) and sendfile(2) from it are
# IN_ACCESS. Pages mapped and faulted in are neither (no system call reads).
IN_ACCESS = 0x1
IN_OPEN = 0x20
IN_Q_OVERFLOW = 0x4000  # events were lost: counted as a read, to fail safe
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class AccessWatch:
    """inotify watches for IN_OPEN and IN_ACCESS on host PATHS. The watch is
    on the inode, so it sees every process, in any mount namespace."""

    def __init__(self, paths):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.paths = {}
        try:
            for path in paths:
                wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path),
                                                  IN_OPEN | IN_ACCESS)
                if wd < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
                self.paths[wd] = path
        except OSError:
            os.close(self.fd)
            raise

    def events(self):
        """{path: {"open": N, "access": N}} of the events since the last
        call (reads everything queued)."""
        out = {}
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            off = 0
            while off < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, off)
                off += _EVENT.size + length
                counts = out.setdefault(self.paths.get(wd, f"watch {wd}"),
                                        {"open": 0, "access": 0})
                counts["open"] += bool(mask & IN_OPEN)
                counts["access"] += bool(mask & (IN_ACCESS | IN_Q_OVERFLOW))

    def close(self):
        os.close(self.fd)
