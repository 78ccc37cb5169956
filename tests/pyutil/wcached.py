"""The one way the tests, the benchmarks and the demo run a real wcached:
a configuration file, the client and control sockets and the log in one
directory, optionally as an unprivileged user without capabilities; start()
returns once the client socket accepts (a condition with a deadline, never
a bare sleep), stop() sends SIGTERM and returns the exit status.

Users: tests/integration/conftest.py (its Daemon), tests/python/pyhelpers.py
(its Daemon), tests/bench/*.py and tests/demo.py. Import it with

    sys.path.append(<tests>/pyutil); from wcached import Wcached

Failures (a missing binary, a daemon that exits or does not answer in time)
raise WcachedError, an AssertionError, so that pytest reports a failed test
with the daemon's log; the benchmarks and the demo let it end the run.
"""
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Every Wcached started in this process, for left_running().
_started = []


class WcachedError(AssertionError):
    """wcached could not be run, or did not do what was waited for in time."""


def build_dir():
    """The build directory: $WCACHE_BUILD, else <repo>/build."""
    return os.path.abspath(os.environ.get("WCACHE_BUILD") or os.path.join(REPO, "build"))


def build_binary(name, build=None):
    """The path of the build's program name (in BUILD/bin)."""
    path = os.path.join(build or build_dir(), "bin", name)
    if not os.access(path, os.X_OK):
        raise WcachedError(f"{path} is missing: build first (WCACHE_BUILD={build or build_dir()})")
    return path


def wait_until(cond, timeout=60.0, what="condition", interval=0.01):
    """Polls cond() until it returns something true, which it returns, or
    the deadline passes (WcachedError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise WcachedError(f"timed out after {timeout}s waiting for {what}")


def connectable(path):
    """Whether something accepts connections on the seqpacket socket path."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(str(path))
        s.close()
        return True
    except OSError:
        return False


def parse_user(text):
    """"UID:GID" (or "UID", the group then the same number) as (uid, gid)."""
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def as_user(uid, gid, groups=()):
    """The command prefix that runs a program as uid:gid with no capability
    and only the given supplementary groups."""
    extra = [f"--groups={','.join(str(g) for g in groups)}"] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", *extra, "--inh-caps=-all",
            "--bounding-set=-all"]


def open_to(path, uid, gid):
    """Lets uid:gid into path: the directory becomes theirs, and every parent
    directory traversable (pytest's temporary root is 0700)."""
    path = os.path.abspath(str(path))
    os.chown(path, uid, gid)
    os.chmod(path, 0o755)
    parent = os.path.dirname(path)
    while parent != "/":
        mode = os.stat(parent).st_mode
        if mode & 0o001 == 0:
            os.chmod(parent, (mode & 0o7777) | 0o011)
        parent = os.path.dirname(parent)


class Wcached:
    """A wcached process with its config, sockets and log in one directory.

    models maps a model name to its path, or to (path, {key: value, ...})
    for the model's other keys (pin, warm, ...); extra is text for the
    [wcached] section. user (uid, gid) runs the daemon unprivileged (the
    directory is opened to it); nofile sets its RLIMIT_NOFILE (one number
    for both limits, or (soft, hard)), nproc its RLIMIT_NPROC (tasks of its
    user, threads included); cgroup is a cgroup directory (v1 or v2) it
    starts in; wcached is the program to run
    (default: the build's). The log is the file self.log;
    wait_for_log() waits for a line in it and tells when it first saw it.
    """

    def __init__(self, directory, models, extra="", *, prefetch_threads=2, log_level="debug",
                 user=None, nofile=None, nproc=None, wcached=None, cgroup=None):
        self.dir = directory
        self.cgroup = cgroup
        self.user = user
        self.nofile = nofile
        self.nproc = nproc
        self.wcached = wcached
        if self.user is not None:
            open_to(directory, *self.user)
        self.prefetch_threads = prefetch_threads
        self.log_level = log_level
        self.socket = os.path.join(str(directory), "wcached.sock")
        self.control = os.path.join(str(directory), "control.sock")
        self.conf = os.path.join(str(directory), "wcached.conf")
        self.log = os.path.join(str(directory), "wcached.log")
        self.write_config(models, extra)
        self.proc = None
        self.logf = None
        self.started = None
        self.lines = []     # (monotonic time first seen, line) of the log
        self._log_offset, self._log_tail = 0, b""

    def write_config(self, models, extra=""):
        """(Re)writes the configuration file; models and extra as for __init__."""
        text = (f"[wcached]\nsocket = {self.socket}\ncontrol = {self.control}\n"
                f"prefetch_threads = {self.prefetch_threads}\nlog_level = {self.log_level}\n"
                f"{extra}\n")
        for name, spec in models.items():
            path, keys = (spec, {}) if isinstance(spec, (str, os.PathLike)) else spec
            text += f"[model {name}]\npath = {path}\n"
            text += "".join(f"{k} = {v}\n" for k, v in keys.items()) + "\n"
        with open(self.conf, "w") as f:
            f.write(text)

    def start(self, env=None, timeout=60.0, args=()):
        """Starts wcached (env: its environment, default ours; args: more
        options) and returns self once its client socket accepts
        connections."""
        self.logf = open(self.log, "w")
        self.lines, self._log_offset, self._log_tail = [], 0, b""
        cmd = [self.wcached or build_binary("wcached"), "-c", self.conf, *args]
        if self.user is not None:
            cmd = as_user(*self.user) + cmd
        nofile, nproc, cgroup = self.nofile, self.nproc, self.cgroup

        def before_exec():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE,
                                   nofile if isinstance(nofile, tuple) else (nofile, nofile))
            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if cgroup is not None:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write("0")
        prepare = before_exec if (nofile, nproc, cgroup) != (None, None, None) else None
        self.started = time.monotonic()
        # stdout to the log too, not the caller's: a daemon left behind by a
        # caller that died before stop() held the caller's stdout open, and
        # a `| tail` after it waited until the daemon was killed (rev163 #4).
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=self.logf, env=env,
                                     preexec_fn=prepare)
        _started.append(self)
        self.wait_listening(timeout)
        return self

    def wait_listening(self, timeout=60.0):
        """Waits until the client socket accepts (reading the log meanwhile,
        so that wait_for_log's times are those of the lines' arrival)."""
        def up():
            self._follow_log()
            return self.proc.poll() is not None or connectable(self.socket)
        wait_until(up, timeout, what=f"wcached to listen on {self.socket}")
        if self.proc.poll() is not None:
            raise WcachedError(f"wcached exited with {self.proc.returncode}:\n{self.read_log()}")

    def _follow_log(self):
        """Reads the log's new complete lines into self.lines, stamped now
        (starting over when the log was truncated: a new start)."""
        try:
            with open(self.log, "rb") as f:
                if os.fstat(f.fileno()).st_size < self._log_offset:
                    self.lines, self._log_offset, self._log_tail = [], 0, b""
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return
        self._log_offset += len(data)
        *complete, self._log_tail = (self._log_tail + data).split(b"\n")
        now = time.monotonic()
        self.lines += [(now, line.decode(errors="replace")) for line in complete]

    def wait_for_log(self, pattern, timeout=60.0):
        """Waits for a log line matching the regular expression pattern;
        returns (monotonic time it was first seen, line). The daemon
        exiting first is a WcachedError."""
        rx = re.compile(pattern)
        seen = 0

        def found():
            nonlocal seen
            running = self.proc.poll() is None
            self._follow_log()
            for item in self.lines[seen:]:
                if rx.search(item[1]):
                    return item
            seen = len(self.lines)
            if not running:
                raise WcachedError(f"wcached exited with {self.proc.returncode} before logging "
                                   f"a line matching {pattern!r}:\n{self.read_log()}")
            return None
        return wait_until(found, timeout, what=f"a log line matching {pattern!r}",
                          interval=0.002)

    def read_log(self):
        with open(self.log) as f:
            return f.read()

    def stop(self, timeout=60.0):
        """SIGTERM, then SIGKILL after timeout seconds; returns the exit
        status (that of the earlier exit if it had already exited)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.logf is not None:
            self.logf.close()
        return self.proc.returncode


def left_running():
    """The configuration files of the daemons this process started that still
    run, each killed (SIGKILL) and waited for: the test suites' sessions end
    with it (conftest.py's pytest_sessionfinish), and fail when it names any,
    so that a test that forgets stop() cannot leave a daemon behind its run
    (one did, with parent 1, after every run)."""
    left = []
    for d in _started:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
            left.append(d.conf)
    _started.clear()
    return left


def pytest_sessionfinish(session, exitstatus):
    """The pytest hook both test suites' conftest.py import: a daemon a test
    started and did not stop fails the run (left_running() kills it)."""
    import pytest
    left = left_running()
    if left:
        sys.stderr.write("\nwcached left running by a test, killed at the session's end: "
                         + ", ".join(left) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get("WCACHE_PYTEST_TMP_ON_PASS") == "remove" and session.exitstatus == 0:
        remove_basetemp(session.config.option.basetemp)


def mounts_beneath(top):
    """The mount points at or beneath directory top, from /proc/self/mounts
    (its octal escapes undone)."""
    top = os.path.realpath(top)
    found = []
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            if len(fields) < 2:
                continue
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
            if point == top or point.startswith(top + "/"):
                found.append(point)
    return found


def remove_basetemp(basetemp):
    """Removes a passed session's --basetemp (ctest's entries ask it with
    WCACHE_PYTEST_TMP_ON_PASS=remove: their models, a few GiB a build, would
    otherwise stay in /tmp after every passing `make test`; a failed one's
    stay to be looked at). Kept, with one line saying why, while anything is
    mounted beneath it: shutil.rmtree would go on into the mount."""
    if not basetemp or not os.path.isdir(basetemp):
        return
    left = mounts_beneath(basetemp)
    if left:
        sys.stderr.write(f"\n{basetemp} kept: still mounted beneath it: {', '.join(left)}\n")
        return
    shutil.rmtree(basetemp, ignore_errors=True)
