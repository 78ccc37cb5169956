"""Helpers for the control socket tests: running wcachectl against a Daemon's
control socket (as root or as another user), raw control connections, and
reading a worker's mapping of a model file through /proc."""
import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile

from conftest import binary, fd_count, wait_until


def ctl(d, *args, user=None, env=None, timeout=120):
    """Runs `wcachectl --control SOCKET ARGS...`; returns the CompletedProcess.
    user: argv prefix that runs it as someone else (see as_user)."""
    argv = [binary("wcachectl"), "--control", d.control, *args]
    if user is not None:
        argv = [*user, shared_wcachectl(), "--control", d.control, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def status(d, timeout=120):
    """The daemon's status reply as a dict (asserts success)."""
    r = ctl(d, "--json", "status", timeout=timeout)
    # 3: some model is not ready (loading, warming, failed...); still a reply.
    assert r.returncode in (0, 3), r.stderr
    reply = json.loads(r.stdout)
    assert reply["ok"] is True
    return reply


def model_entry(d, name):
    """The status entry of model name, or None."""
    for m in status(d)["models"]:
        if m["name"] == name:
            return m
    return None


_shared = {}


def shared_dir():
    """A directory every user can enter (pytest's tmp_path is 0700 root):
    for sockets and binaries another user must reach."""
    if "dir" not in _shared:
        _shared["dir"] = tempfile.mkdtemp(prefix="wcache-ctl-")
        os.chmod(_shared["dir"], 0o755)
        atexit.register(shutil.rmtree, _shared["dir"], True)
    return _shared["dir"]


def shared_wcachectl():
    """A copy of wcachectl in shared_dir(), executable by anyone."""
    path = os.path.join(shared_dir(), "wcachectl")
    if not os.path.exists(path):
        shutil.copy(binary("wcachectl"), path)
        os.chmod(path, 0o755)
    return path


def as_user(user="nobody", group="nogroup", groups=None):
    """An argv prefix running a command as user with primary group group and
    the supplementary groups given (none by default)."""
    argv = ["setpriv", f"--reuid={user}", f"--regid={group}"]
    argv.append(f"--groups={','.join(groups)}" if groups else "--clear-groups")
    return argv


class Control:
    """A raw connection to the control socket."""

    def __init__(self, d, timeout=30):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(d.control)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def reply(self):
        """The next reply line as a dict; None when the daemon closed."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, line):
        self.send(line + b"\n")
        return self.reply()

    def close(self):
        self.sock.close()


class FakeControl:
    """A control socket that answers every request with one canned reply:
    for what wcachectl shows of states a real daemon passes through too
    quickly to catch (warming), cannot reach as root (a refused mlock), or
    would never send (a hostile name, 1e999). reply: an object, sent as
    JSON with non-ASCII characters raw, as wcached writes them; or bytes,
    sent as they are."""

    def __init__(self, path, reply):
        import threading
        if not isinstance(reply, bytes):
            reply = (json.dumps(reply, ensure_ascii=False) + "\n").encode()
        self.path = str(path)
        self.reply = reply
        self.closing = False
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                if self.closing:
                    return
                c.settimeout(10)  # a client that never sends ends no test
                try:
                    c.recv(4096)
                    c.sendall(self.reply)
                except OSError:
                    pass

    def close(self):
        """Ends the serving thread, then closes the socket. Closed under a
        thread still in accept(), the descriptor's number could be a later
        test's FakeControl's by the time that thread called accept() again
        (on a loaded host): it answered that test's wcachectl with this
        reply (seen once in CI: test_every_command_reports_a_full_disk got
        test_a_daemons_error_is_escaped's error). shutdown(2) of the
        listening socket makes a waiting accept() fail at once (EINVAL on
        Linux), with no connection that could block or find the path gone."""
        self.closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), f"{self.path}: its serving thread did not end"
        self.sock.close()


def wait_for_control(d):
    """Waits until the daemon answers on its control socket. Daemon.start()
    waits for the client socket, which wcached opens first: until the
    control socket listens (its mode set) and the loop runs, a test would
    race the start-up."""
    def answers():
        try:
            c = Control(d)
        except OSError:
            return False
        try:
            reply = c.request(b"help")
            return reply is not None and reply["ok"]
        except OSError:
            return False
        finally:
            c.close()
    wait_until(answers, what="the control socket to answer")
    return d


def daemons(make):
    """The body of a `start` fixture: yields start(models, *args, **kw),
    which makes a daemon with make(models, *args, **kw), starts it and
    waits for its control socket; at teardown every daemon started must
    exit 0 on SIGTERM (under ASan: no leak, no report)."""
    started = []

    def run(*args, **kw):
        d = make(*args, **kw)
        started.append(d)
        return wait_for_control(d.start())

    try:
        yield run
    except BaseException:
        # A test failed inside running_daemons(): stop them all, and let
        # its failure be the one reported.
        for d in started:
            d.stop()
        raise
    for d in started:
        code = d.stop()
        assert code == 0, f"wcached exited with {code}:\n{d.read_log()}"


# The same as a context manager, for daemons started inside a test:
# `with running_daemons(make) as start: ...`.
running_daemons = contextlib.contextmanager(daemons)


def quiet_fd_count(d):
    """The daemon's descriptor count with no control connection open but
    ours (the others, wcachectl runs that just exited, close asynchronously):
    counted while ours is the only one, then ours is closed."""
    c = Control(d)
    try:
        wait_until(lambda: c.request(b"status")["control_clients"] == 1,
                   what="other control connections to close")
        return fd_count(d.proc.pid)
    finally:
        c.close()


def mapped_bytes(pid, path, offset, length):
    """Reads length bytes at file offset of path as process pid maps it,
    through /proc/PID/mem: proves the mapping still reads, whatever the
    daemon did since."""
    real = os.path.realpath(path)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[5].strip().replace(" (deleted)", "") != real:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            file_off = int(fields[2], 16)
            if file_off <= offset and offset + length <= file_off + (end - start):
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(start + offset - file_off)
                    return mem.read(length)
    raise AssertionError(f"pid {pid} does not map {path} at [{offset}, {offset + length})")
