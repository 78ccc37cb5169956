"""Shared fixtures of the integration tests: the build's binaries, small
models made with mkmodel, and a real wcached on sockets in a temporary
directory (tests/pyutil/wcached.py runs it). Waits are conditions with
deadlines, never bare sleeps."""
import os
import subprocess
import sys
import time

import pytest

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
# as_user, connectable, open_to and wait_until are the test files' too (from conftest import ...)
from wcached import (Wcached, as_user, build_binary, build_dir, connectable,  # noqa: E402,F401
                     open_to, parse_user, pytest_sessionfinish, wait_until)

BUILD = build_dir()
BIN = os.path.join(BUILD, "bin")


# WCACHE_TEST_USER=UID:GID runs every test daemon as that unprivileged user,
# without capabilities, as wcached.service does (tests that need root's
# powers skip themselves). Root is needed to switch.
TEST_USER = os.environ.get("WCACHE_TEST_USER")

# The exit status of a run that WCACHE_TEST_USER asks of a user who cannot
# switch to it: ctest's integration_unprivileged counts it as skipped
# (SKIP_RETURN_CODE in tests/CMakeLists.txt).
SKIPPED_NOT_ROOT = 77


def pytest_configure(config):
    """Ends a run with WCACHE_TEST_USER set by a user other than root before
    any test: each daemon would be started as that user, which only root can
    do (every test would fail in its chown). Such a user's run of the suite
    without WCACHE_TEST_USER (ctest's integration entries) already runs
    every daemon unprivileged, as that user."""
    if TEST_USER and os.geteuid() != 0:
        pytest.exit(f"skipped: WCACHE_TEST_USER={TEST_USER} runs each wcached as that user, "
                    f"which needs root (this is uid {os.geteuid()}); the suite run without "
                    "it runs them unprivileged as this user", returncode=SKIPPED_NOT_ROOT)


# For tests that need the daemon to be root (it creates sockets where only
# root may, switches users itself, ...): skipped in the unprivileged run.
root_daemon = pytest.mark.skipif(TEST_USER is not None,
                                 reason="needs wcached to run as root (WCACHE_TEST_USER is set)")


def binary(name):
    return build_binary(name, BUILD)


def mkmodel(path, layers=2, hidden=64, ffn=128, vocab=100, seed=1, dtype="BF16"):
    subprocess.run([binary("mkmodel"), "--layers", str(layers), "--hidden", str(hidden),
                    "--ffn", str(ffn), "--vocab", str(vocab), "--seed", str(seed),
                    "--dtype", dtype, str(path)], check=True, stdout=subprocess.DEVNULL)
    return str(path)


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


# The kernel functions a close(2) on FUSE waits in for its server (its
# wchan): for the answer (request_wait_answer, or what it is inlined into:
# __fuse_request_send, fuse_simple_request), or for a request slot while
# the connection is blocked, the server answering nothing (fuse_get_req).
FUSE_WAIT = ("request_wait_answer", "__fuse_request_send", "fuse_simple_request",
             "fuse_get_req")


def threads_in_close(pid, waiting_in=None):
    """Threads of pid blocked in close(2) now (x86-64 syscall 3); with
    waiting_in, only those sleeping in one of those kernel functions (their wchan):
    FUSE_WAIT for a close that waits on a FUSE server, not one that happens
    to be in a quick close of something else."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                if f.read().split()[0] != "3":
                    continue
            if waiting_in is not None:
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    if f.read().strip() not in waiting_in:
                        continue
            n += 1
        except (OSError, IndexError):
            pass
    return n


def still_closing(pid, waiting_in=None, timeout=10.0):
    """Whether a thread of pid is blocked in close(2) as threads_in_close
    counts, now or within timeout: one snapshot can miss a close that goes
    on, its thread woken for a moment (a SIGSTOP of wcached wakes a FUSE
    wait, which then sleeps again) and still on the run queue of a loaded
    machine (its syscall file then says "running", its wchan 0). A close
    that ended does not come back."""
    deadline = time.monotonic() + timeout
    while threads_in_close(pid, waiting_in) < 1:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


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


class Daemon(Wcached):
    """tests/pyutil/wcached.py's Wcached, run as $WCACHE_TEST_USER when that
    is set, with wcachectl attach at hand."""

    def __init__(self, tmp, models, extra="", prefetch_threads=2, user=None, nofile=None,
                 nproc=None, cgroup=None, log_level="debug"):
        # user: (uid, gid) to run as, unprivileged; default WCACHE_TEST_USER.
        user = user if user is not None else (parse_user(TEST_USER) if TEST_USER else None)
        super().__init__(tmp, models, extra, prefetch_threads=prefetch_threads, user=user,
                         nofile=nofile, nproc=nproc, cgroup=cgroup, log_level=log_level)

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
