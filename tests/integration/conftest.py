"""Shared fixtures of the integration tests: the build's binaries, small
models made with mkmodel, and a real wcached on sockets in a temporary
directory. Waits are conditions with deadlines, never bare sleeps."""
import os
import resource
import signal
import socket
import subprocess
import time

import pytest

BUILD = os.environ.get("WCACHE_BUILD") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
BIN = os.path.abspath(os.path.join(BUILD, "bin"))


# WCACHE_TEST_USER=UID:GID runs every test daemon as that unprivileged user,
# without capabilities, as wcached.service does (tests that need root's
# powers skip themselves). Root is needed to switch.
TEST_USER = os.environ.get("WCACHE_TEST_USER")


# For tests that need the daemon to be root (it creates sockets where only
# root may, switches users itself, ...): skipped in the unprivileged run.
root_daemon = pytest.mark.skipif(TEST_USER is not None,
                                 reason="needs wcached to run as root (WCACHE_TEST_USER is set)")


def parse_user(text):
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


def binary(name):
    path = os.path.join(BIN, name)
    assert os.path.exists(path), f"{path} is missing: build first"
    return path


def wait_until(cond, timeout=60.0, what="condition"):
    """Polls cond() until it is true or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def mkmodel(path, layers=2, hidden=64, ffn=128, vocab=100, seed=1, dtype="BF16"):
    subprocess.run([binary("mkmodel"), "--layers", str(layers), "--hidden", str(hidden),
                    "--ffn", str(ffn), "--vocab", str(vocab), "--seed", str(seed),
                    "--dtype", dtype, str(path)], check=True, stdout=subprocess.DEVNULL)
    return str(path)


def connectable(path):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(str(path))
        s.close()
        return True
    except OSError:
        return False


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fd_count(pid, timeout=60.0):
    """The daemon's descriptor count once it stops changing (connections
    that just closed are released from the event loop a moment later)."""
    deadline = time.monotonic() + timeout
    last, same = fd_count(pid), 0
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = fd_count(pid)
        same = same + 1 if now == last else 0
        last = now
        if same >= 10:
            return now
    raise AssertionError("the daemon's descriptor count never settled")


class Daemon:
    """A wcached process with its config, sockets and log in one directory."""

    def __init__(self, tmp, models, extra="", prefetch_threads=2, user=None, nofile=None):
        self.dir = tmp
        # user: (uid, gid) to run as, unprivileged; default WCACHE_TEST_USER.
        self.user = user if user is not None else (parse_user(TEST_USER) if TEST_USER else None)
        self.nofile = nofile
        if self.user is not None:
            open_to(tmp, *self.user)
        self.prefetch_threads = prefetch_threads
        self.socket = str(tmp / "wcached.sock")
        self.control = str(tmp / "control.sock")
        self.conf = str(tmp / "wcached.conf")
        self.log = str(tmp / "wcached.log")
        self.write_config(models, extra)
        self.proc = None

    def write_config(self, models, extra=""):
        text = (f"[wcached]\nsocket = {self.socket}\ncontrol = {self.control}\n"
                f"prefetch_threads = {self.prefetch_threads}\nlog_level = debug\n{extra}\n")
        for name, path in models.items():
            text += f"[model {name}]\npath = {path}\n\n"
        with open(self.conf, "w") as f:
            f.write(text)

    def start(self, env=None):
        self.logf = open(self.log, "w")
        cmd = [binary("wcached"), "-c", self.conf]
        if self.user is not None:
            cmd = as_user(*self.user) + cmd
        nofile = self.nofile

        def limits():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.proc = subprocess.Popen(cmd, stderr=self.logf, env=env, preexec_fn=limits)
        wait_until(lambda: self.proc.poll() is not None or connectable(self.socket),
                   what="wcached to listen")
        assert self.proc.poll() is None, self.read_log()
        return self

    def read_log(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        """SIGTERM; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        self.logf.close()
        return status

    def attach(self, name, *extra):
        return subprocess.run([binary("wcachectl"), "attach", name, "--socket", self.socket,
                               *extra], capture_output=True, text=True, timeout=60)


@pytest.fixture
def model(tmp_path):
    return mkmodel(tmp_path / "small.safetensors")


@pytest.fixture
def daemon(tmp_path, model):
    d = Daemon(tmp_path, {"small": model}).start()
    yield d
    status = d.stop()
    assert status == 0, f"wcached exited with {status}:\n{d.read_log()}"
