"""Models on "remote" storage for the tests: a RemoteFS mounts a directory
(BACKING) at a mount point through tests/tools/remotefs.c, a FUSE
filesystem that behaves as NFS does when another host writes: what is done
in BACKING raises no inotify event on the mount, shows there only once the
kernel's cached entries and attributes expire (attr_timeout), and a file
freed in BACKING (removed, or renamed over) fails the reads of handles
opened before (EIO, or ESTALE), so a mapping's touch of an uncached page
gets SIGBUS. The header comment of tests/tools/remotefs.c says exactly what
it does.

    sys.path.append(<tests>/pyutil)
    from remotefs import RemoteFS, skip_reason
    if skip_reason(): pytest.skip(skip_reason())
    with RemoteFS(tmp_path / "backing", tmp_path / "mnt") as fs:
        fs.replace("model.safetensors", data)       # "another host" renames
        fs.wait_visible("model.safetensors")
        ...

Dropping pages (what was measured here, kernel 6.18):
- drop_cache(path_or_fd): posix_fadvise(POSIX_FADV_DONTNEED) on a
  descriptor of the file. It drops every cached page of the file that no
  process has mapped (the same as writing 1 to /proc/sys/vm/drop_caches,
  without touching the rest of the machine); mapped pages stay. Returns
  the pages still resident (mincore), so a test can assert 0.
- drop_stale(): SIGUSR1 to remotefs, which has the kernel drop every
  cached page of every freed inode, mapped or not (FUSE's inode
  invalidation unmaps them): an old mapping's next touch then reads
  through remotefs, which fails it, and the process gets SIGBUS whatever
  it touched before. drop_all() (SIGUSR2) does it for every file.

A slow server: RemoteFS(read_rate=BYTES) mounts with every read throttled
to BYTES per second for the whole mount (remotefs --read-rate), so reading
N bytes through it takes about N / BYTES seconds, whatever the request
sizes and however many are in flight; throttle(BYTES) sets the rate while
mounted and unthrottle() ends it (SIGRTMIN with the rate as its value).
With it a staging copy of a few MiB takes seconds: long enough to act on
it while it runs, without sleeps.

A server that flushes: RemoteFS(flush=True) (remotefs --flush) opens files
so that every close(2) of one on the mount sends FUSE's FLUSH and waits for
the answer, as on gcsfuse, s3fs or sshfs; while frozen (freeze()) every such
close then blocks until thaw(). By default closes send nothing.

Failures raise RemoteFSError, an AssertionError, with remotefs's log.
Standard library only (Debian's /usr/bin/python3).
"""
import contextlib
import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import signal
import subprocess
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

FUSE_SUPER_MAGIC = 0x65735546   # statfs(2)'s f_type of every FUSE mount
FSTYPE = "fuse.remotefs"        # the mount's type in /proc/self/mountinfo


class RemoteFSError(AssertionError):
    """remotefs could not be run, or did not do what was waited for in time."""


def build_dir():
    """The build directory: $WCACHE_BUILD, else <repo>/build (as wcached.py)."""
    return os.path.abspath(os.environ.get("WCACHE_BUILD") or os.path.join(REPO, "build"))


def binary(build=None):
    """The path of the build's remotefs (BUILD/bin/remotefs), or RemoteFSError."""
    path = os.path.join(build or build_dir(), "bin", "remotefs")
    if not os.access(path, os.X_OK):
        raise RemoteFSError(f"{path} is missing: {_why_not_built(build)}")
    return path


def _why_not_built(build):
    return (f"build first (WCACHE_BUILD={build or build_dir()}); it is built only where "
            "libfuse3 >= 3.12 is found (Debian: libfuse3-dev)")


def skip_reason(build=None):
    """Why remotefs cannot run here (one line, for pytest.skip), or None."""
    path = os.path.join(build or build_dir(), "bin", "remotefs")
    if not os.access(path, os.X_OK):
        return f"remotefs: {path} is not built ({_why_not_built(build)})"
    if os.geteuid() != 0:
        return "remotefs: the tests mount it with allow_other, which needs root"
    if not os.path.exists("/dev/fuse"):
        return "remotefs: no /dev/fuse (no FUSE in this kernel or container)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return f"remotefs: cannot open /dev/fuse: {e.strerror}"
    if shutil.which("fusermount3") is None:
        return "remotefs: fusermount3 is missing (Debian: fuse3)"
    return None


def mount_entry(mount):
    """The /proc/self/mountinfo fields of what is mounted at mount (a
    dict: 'dev' as "MAJOR:MINOR", 'fstype', 'source', 'options'), or None."""
    mount = os.path.realpath(str(mount))
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            point = fields[4].encode().decode("unicode_escape")
            if point == mount and len(tail) >= 3:
                # The last entry for a point is the one on top.
                found = {"dev": fields[2], "fstype": tail[0], "source": tail[1],
                         "options": tail[2]}
    return found


def _wait(cond, timeout, what, interval=0.005):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RemoteFSError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _all_stopped(pid):
    """Whether every thread of pid is stopped (state T)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] != "T":
                    return False
        except FileNotFoundError:
            pass  # a thread that ended
    return True


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


class _Sigval(ctypes.Union):
    """union sigval: what sigqueue(3) sends with a signal."""
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]


_libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, _Sigval]


@contextlib.contextmanager
def _opened(path, flags):
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _with_fd(path_or_fd, fn):
    """fn(fd) with path_or_fd itself when it is a descriptor, else with a
    read-only descriptor of that path, closed after."""
    if isinstance(path_or_fd, int):
        return fn(path_or_fd)
    with _opened(str(path_or_fd), os.O_RDONLY) as fd:
        return fn(fd)


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


_SYS_CACHESTAT = {"x86_64": 451, "aarch64": 451}.get(os.uname().machine)


def resident_pages(path_or_fd):
    """How many of the file's pages are in the page cache. path_or_fd: a
    path, or an open descriptor (the way to ask about a file replaced since
    it was opened). cachestat(2) (Linux 6.5), which needs no stat(): an
    fstat() of a freed inode fails with ESTALE; else mincore(2) on a fresh
    mapping that touches nothing."""
    def count(fd):
        if _SYS_CACHESTAT is not None:
            rng, cs = _CachestatRange(0, 0), _Cachestat()
            if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(cs), 0) == 0:
                return cs.nr_cache
            if ctypes.get_errno() != errno.ENOSYS:
                e = ctypes.get_errno()
                raise OSError(e, f"cachestat: {os.strerror(e)}")
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            e = ctypes.get_errno()
            raise OSError(e, f"mmap: {os.strerror(e)}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"mincore: {os.strerror(e)}")
            return sum(b & 1 for b in vec)
        finally:
            _libc.munmap(addr, size)
    return _with_fd(path_or_fd, count)


def drop_cache(path_or_fd, settle=0.5):
    """Drops the file's cached pages that no process maps
    (POSIX_FADV_DONTNEED) and returns how many pages stay resident: 0
    unless some are mapped (see drop_stale for those). Pages locked by a
    read still in flight (the readahead a read started, failing on a freed
    inode) are skipped too, so it tries again until none is left or settle
    seconds have passed. path_or_fd as for resident_pages."""
    def drop(fd):
        deadline = time.monotonic() + settle
        while True:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            left = resident_pages(fd)
            if left == 0 or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)
    return _with_fd(path_or_fd, drop)


class RemoteFS:
    """remotefs serving backing at mount, as a context manager.

    backing and mount are directories (created when missing; backing 0755
    so that other users may read through the mount). attr_timeout: seconds
    the kernel caches entries and attributes (remotefs --attr-timeout);
    stale: "eio", "estale" or "keep" (--stale); keep_cache: --keep-cache;
    allow_other: let every user in (root's tests' daemons run
    unprivileged); options: more -o mount options; read_ahead_kb: the
    mount's readahead window, set once mounted (the kernel gives a FUSE
    mount 128 KiB, so sequential reads go to remotefs 128 KiB at a time;
    1024 lets them take 1 MiB, FUSE's largest request, and read about 1.5x
    faster here); read_rate: bytes per second every read is throttled to
    (remotefs --read-rate; None: not throttled; throttle() and unthrottle()
    change it while mounted); flush: every close of a file on the mount
    waits for remotefs's answer to a FLUSH (remotefs --flush); bad_range:
    (FROM, TO), every read overlapping those bytes of a file fails with
    EIO (remotefs --bad-range; None: none); build: the
    build directory (default $WCACHE_BUILD or <repo>/build). remotefs's
    stderr goes to the file self.log (default: a file beside mount).

    Another user reads through the mount (allow_other) what the backing
    files' modes let it read (replace() writes 0644 by default), once it
    can reach the mount point: pytest's tmp_path is 0700, so open the
    parents to it first (conftest's open_to).
    """

    def __init__(self, backing, mount, *, attr_timeout=1.0, stale="eio", keep_cache=False,
                 allow_other=True, options=(), read_ahead_kb=None, read_rate=None, flush=False,
                 bad_range=None, build=None, log=None):
        self.backing = os.path.abspath(str(backing))
        self.mount = os.path.abspath(str(mount))
        self.attr_timeout = float(attr_timeout)
        self.stale = stale
        self.keep_cache = keep_cache
        self.allow_other = allow_other
        self.options = list(options)
        self.read_ahead_kb = read_ahead_kb
        self.read_rate = int(read_rate) if read_rate else None
        self.flush = flush
        self.bad_range = tuple(bad_range) if bad_range else None
        self.build = build
        self.log = os.path.abspath(str(log)) if log else self.mount.rstrip("/") + ".remotefs.log"
        self.proc = None
        self.frozen = False
        self._logf = None
        self._writers = []

    # -- the mount -------------------------------------------------------

    def command(self):
        """The remotefs command line start() runs."""
        cmd = [binary(self.build), "-f", "--attr-timeout", repr(self.attr_timeout),
               f"--stale={self.stale}"]
        if self.keep_cache:
            cmd.append("--keep-cache")
        if self.read_rate:
            cmd += ["--read-rate", str(self.read_rate)]
        if self.flush:
            cmd.append("--flush")
        if self.bad_range:
            cmd += ["--bad-range", "%d-%d" % self.bad_range]
        opts = (["allow_other"] if self.allow_other else []) + self.options
        if opts:
            cmd += ["-o", ",".join(opts)]
        return cmd + [self.backing, self.mount]

    def start(self, timeout=30.0):
        """Mounts and returns self once mountinfo shows fuse.remotefs at
        mount; remotefs exiting first, or not mounting in time, is a
        RemoteFSError with its log."""
        if not os.path.isdir(self.backing):
            os.makedirs(self.backing)
            os.chmod(self.backing, 0o755)
        os.makedirs(self.mount, exist_ok=True)
        if self.mounted():
            raise RemoteFSError(f"{self.mount}: something is mounted there already")
        self._logf = open(self.log, "w")
        # Under ASan, what libfuse3 allocated for a request left hanging at
        # the unmount is no leak of ours (tests/tools/remotefs-lsan.supp).
        supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                            "remotefs-lsan.supp")
        lsan = os.environ.get("LSAN_OPTIONS", "")
        env = dict(os.environ, LSAN_OPTIONS=(lsan + ":" if lsan else "") +
                   "suppressions=" + os.path.normpath(supp))
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                     stdout=self._logf, stderr=self._logf, env=env)

        def up():
            return self.proc.poll() is not None or self.mounted()
        try:
            _wait(up, timeout, f"remotefs to mount {self.mount}")
        except RemoteFSError:
            self.stop()
            raise RemoteFSError(f"remotefs did not mount {self.mount} within {timeout}s:\n"
                                f"{self.read_log()}") from None
        if self.proc.poll() is not None:
            status = self.stop()
            raise RemoteFSError(f"remotefs exited with {status} before mounting "
                                f"{self.mount}:\n{self.read_log()}")
        if self.read_ahead_kb is not None:
            bdi = f"/sys/class/bdi/{mount_entry(self.mount)['dev']}/read_ahead_kb"
            try:
                with open(bdi, "w") as f:
                    f.write(str(int(self.read_ahead_kb)))
            except OSError as e:
                self.stop()
                raise RemoteFSError(f"{bdi}: {e.strerror}") from None
        return self

    def mounted(self):
        """Whether mountinfo shows this remotefs (fuse.remotefs) at mount."""
        entry = mount_entry(self.mount)
        return entry is not None and entry["fstype"] == FSTYPE

    def connection(self):
        """The mount's FUSE connection directory in /sys/fs/fuse/connections
        (its number is the minor of the mount's device), or None."""
        entry = mount_entry(self.mount)
        if entry is None or entry["fstype"] != FSTYPE:
            return None
        path = f"/sys/fs/fuse/connections/{entry['dev'].split(':')[1]}"
        return path if os.path.isdir(path) else None

    def stop(self, timeout=30.0):
        """Unmounts and waits for remotefs; returns its exit status. Works
        whatever state things are in: fusermount3 -u, else (busy: a
        descriptor or a mapping is still open, or remotefs is gone) a lazy
        umount -l; a lazily unmounted filesystem is served as long as it
        is in use, so if remotefs does not end by itself its FUSE connection
        is aborted (/sys/fs/fuse/connections, where fusectl is mounted),
        then it gets SIGTERM, and last SIGKILL. Idempotent."""
        if self.frozen:
            self.thaw()
        if self.read_rate and self.proc is not None and self.proc.poll() is None:
            # Reads still waiting their turn go at once: unmounting does not
            # wait for a slow copy.
            try:
                self.unthrottle(timeout=5.0)
            except (RemoteFSError, OSError):
                pass
        self._join_writers()
        conn = self.connection()
        lazy = False
        if self.mounted():
            r = subprocess.run(["fusermount3", "-u", self.mount], capture_output=True)
            if r.returncode != 0 or self.mounted():
                subprocess.run(["umount", "-l", self.mount], capture_output=True)
                lazy = True
        status = None
        if self.proc is not None:
            # An unmount that worked ends remotefs at once; a lazy one only
            # once the last user lets go. Then: abort the FUSE connection
            # (where fusectl is mounted), SIGTERM, and last SIGKILL.
            steps = [min(timeout, 2.0 if lazy else 10.0)]
            if conn is not None:
                steps.append(2.0)
            steps.append(timeout)
            for i, wait in enumerate(steps):
                try:
                    status = self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if i == len(steps) - 1:
                    self.proc.kill()
                    status = self.proc.wait()
                elif conn is not None and i == 0:
                    try:
                        with open(os.path.join(conn, "abort"), "w") as f:
                            f.write("1")
                    except OSError:
                        pass
                else:
                    self.proc.terminate()
        if self._logf is not None:
            self._logf.close()
            self._logf = None
        if self.mounted():
            raise RemoteFSError(f"{self.mount} is still mounted after stop()")
        return status if status is not None else 0

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        status = self.stop()
        # A crash of remotefs (a signal, an ASan report) fails the test that
        # used it; a clean unmount exits 0.
        if exc[0] is None and status != 0:
            raise RemoteFSError(f"remotefs exited with {status}:\n{self.read_log()}")
        return False

    def read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # -- paths -----------------------------------------------------------

    def path(self, name=""):
        """name's path through the mount (what this host sees)."""
        return os.path.join(self.mount, name)

    def backing_path(self, name=""):
        """name's path in BACKING (what the other host writes)."""
        return os.path.join(self.backing, name)

    # -- what "another host" does ----------------------------------------

    def replace(self, name, data_or_writer, mode=0o644):
        """Replaces name atomically, as a careful remote writer does: a
        temporary file beside it in BACKING, written, fsynced, then renamed
        over name. data_or_writer: bytes, or a function given the open
        binary file to write. Returns the new file's backing inode number
        (what stat() through the mount reports once it shows)."""
        path = self.backing_path(name)
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.remote-{os.getpid()}-"
                                      f"{threading.get_ident()}")
        try:
            with open(tmp, "xb") as f:
                if callable(data_or_writer):
                    data_or_writer(f)
                else:
                    f.write(data_or_writer)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.rename(tmp, path)
        finally:
            if os.path.lexists(tmp):     # only when something above failed
                os.unlink(tmp)
        with _opened(directory, os.O_RDONLY | os.O_DIRECTORY) as dfd:
            os.fsync(dfd)
        return os.stat(path).st_ino

    def remove(self, name):
        """Removes name in BACKING (its inode is then freed: stale)."""
        os.unlink(self.backing_path(name))

    def write_slowly(self, name, data, seconds, chunks=20):
        """Writes data over name in place in BACKING (truncating it first),
        in chunks spread over about seconds, fsyncing each: a half-written
        file for that long. Runs in a thread, returned started; join() it,
        then check .error (None, or the exception that ended it). stop()
        joins it too."""
        path = self.backing_path(name)
        chunks = max(1, min(int(chunks), max(1, len(data))))
        step = (len(data) + chunks - 1) // chunks

        def write():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    start = time.monotonic()
                    for i, off in enumerate(range(0, len(data), step)):
                        os.write(fd, data[off:off + step])
                        os.fsync(fd)
                        # Pacing, not synchronisation: spread the writes.
                        pause = start + seconds * (i + 1) / chunks - time.monotonic()
                        if pause > 0:
                            time.sleep(pause)
                finally:
                    os.close(fd)
            except BaseException as e:     # reported through .error
                thread.error = e

        thread = threading.Thread(target=write, name=f"write_slowly {name}", daemon=True)
        thread.error = None
        self._writers.append(thread)
        thread.start()
        return thread

    def _join_writers(self):
        for t in self._writers:
            t.join()
        self._writers = []

    # -- what this host sees ---------------------------------------------

    def wait_visible(self, name, timeout=None):
        """Waits until stat() through the mount shows the backing file's
        current inode and size (the kernel's cache expired) and returns the
        seconds waited. Default timeout: 2 x attr_timeout + 5 s."""
        timeout = 2 * self.attr_timeout + 5.0 if timeout is None else timeout
        want = os.stat(self.backing_path(name))
        start = time.monotonic()

        def seen():
            try:
                st = os.stat(self.path(name))
            except FileNotFoundError:
                return False
            return st.st_ino == want.st_ino and st.st_size == want.st_size
        _wait(seen, timeout, f"{self.path(name)} to show inode {want.st_ino}")
        return time.monotonic() - start

    def drop_cache(self, path_or_fd):
        """drop_cache() of this module: unmapped pages; returns the pages
        still resident."""
        return drop_cache(path_or_fd)

    def _signal_and_wait(self, send, marker, timeout, what):
        """send() a signal, then waits for one more line of remotefs's log
        starting with marker (its acknowledgement); returns that line."""
        if self.proc is None or self.proc.poll() is not None:
            raise RemoteFSError("remotefs is not running")

        def lines():
            return [ln for ln in self.read_log().splitlines() if ln.startswith(marker)]
        before = len(lines())
        send()
        _wait(lambda: len(lines()) > before, timeout, what)
        return lines()[-1]

    def _drop(self, sig, timeout):
        marker = "remotefs: dropped the cached pages of "
        line = self._signal_and_wait(lambda: self.proc.send_signal(sig), marker, timeout,
                                     "remotefs to drop the cached pages")
        return int(line[len(marker):].split()[0])

    def drop_stale(self, timeout=30.0):
        """Has the kernel drop every cached page, mapped or not, of every
        inode freed in BACKING (SIGUSR1); returns how many inodes it
        dropped. An old mapping's next touch of them gets SIGBUS."""
        return self._drop(signal.SIGUSR1, timeout)

    def freeze(self, timeout=10.0):
        """Stops remotefs (SIGSTOP): every request to the mount then waits,
        as on an NFS server that hangs; a stat there blocks until thaw().
        Returns once every thread of remotefs is stopped: a SIGSTOP wakes one
        thread, which stops the others when it runs, and until then, on a
        busy machine, another may still answer a request (2 of 25 reads got
        through a bare SIGSTOP under load, 0 of 25 after this wait)."""
        if self.proc is None or self.proc.poll() is not None:
            raise RemoteFSError("remotefs is not running")
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True
        _wait(lambda: _all_stopped(self.proc.pid), timeout,
              "every thread of remotefs to stop after SIGSTOP")

    def thaw(self):
        """Lets a frozen remotefs go on (SIGCONT): the waiting requests are served."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def drop_all(self, timeout=30.0):
        """Has the kernel drop every cached page, mapped or not, of every
        file of the mount (SIGUSR2); returns how many inodes it dropped."""
        return self._drop(signal.SIGUSR2, timeout)

    def throttle(self, bytes_per_second, timeout=30.0):
        """Throttles every read through the mount to bytes_per_second (1 to
        2**31 - 1) from now on, as a slow server would (SIGRTMIN with the rate
        as its value; remotefs --read-rate says how); returns once remotefs
        says so. Reads already waiting their turn go at once."""
        rate = int(bytes_per_second)
        if not 0 < rate < 2**31:
            raise ValueError(f"throttle: {bytes_per_second} bytes/s is not from 1 to 2**31 - 1")
        self._set_read_rate(rate, timeout)

    def unthrottle(self, timeout=30.0):
        """Ends the read throttle: reads go at the backing's speed again,
        the waiting ones at once; returns once remotefs says so."""
        self._set_read_rate(0, timeout)

    def _set_read_rate(self, rate, timeout):
        want = (f"remotefs: reads throttled to {rate} bytes/s" if rate else
                "remotefs: reads not throttled")

        def send():
            if _libc.sigqueue(self.proc.pid, signal.SIGRTMIN, _Sigval(sival_int=rate)) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"sigqueue: {os.strerror(e)}")
        line = self._signal_and_wait(send, "remotefs: reads ", timeout,
                                     "remotefs to change its read rate")
        if line != want:
            raise RemoteFSError(f"remotefs said {line!r}, not {want!r}:\n{self.read_log()}")
        self.read_rate = rate or None


@contextlib.contextmanager
def config_on_a_hung_server(tmp, make_daemon, text_after=None):
    """A wcached whose configuration lies on a RemoteFS mount (tmp/mnt over
    tmp/backing) whose server then hangs, as an NFS server that stops
    answering (NSS waiting on LDAP or sssd holds a reload's read the same
    way). make_daemon(DIR) gives the wcached, not started, in DIR = tmp/d
    (wcached.py's Wcached or a subclass): its configuration is moved onto
    the mount and it starts from there. text_after, when given, maps the
    configuration's text to its new text, written on the server's side
    before it hangs. Yields (d, fs), the server frozen; thaws it and
    removes the mount at the end, passed or failed; the caller stops d.
    (The caller skips first where skip_reason() says why.)"""
    with RemoteFS(os.path.join(tmp, "backing"), os.path.join(tmp, "mnt"),
                  attr_timeout=0.1) as fs:
        os.mkdir(os.path.join(tmp, "d"))
        d = make_daemon(os.path.join(tmp, "d"))
        with open(d.conf) as f:
            text = f.read()
        fs.replace("wcached.conf", text.encode())
        fs.wait_visible("wcached.conf")
        d.conf = fs.path("wcached.conf")
        d.start()
        try:
            if text_after is not None:
                fs.replace("wcached.conf", text_after(text).encode())
            fs.freeze()  # returns once every thread of remotefs is stopped
            yield d, fs
        finally:
            fs.thaw()
