"""A lock RLIMIT_MEMLOCK refuses is named with its real cause, in the log
and in status (issue 21): wcached runs as an unprivileged user without
capabilities, as the packaged unit runs it, and its soft RLIMIT_MEMLOCK is
set from outside while it serves (prlimit(1) as the daemon's own user, who
may move it up to the hard limit: root may not without CAP_SYS_RESOURCE), so
each lock is refused for a known reason:

- a limit just above what is locked: `pin` of the whole model is refused
  with ENOMEM, and the message says the limit, the bytes locked and asked,
  and the LimitMEMLOCK= that would do;
- a limit of 0: the metadata lock after an `unpin` is refused with EPERM,
  and the message blames the limit of 0 and the missing CAP_IPC_LOCK (not a
  seccomp filter: tests/system checks that case under the packaged unit).

Once the limit is raised again, a pin that holds clears the error. Every
wait is a condition with a deadline.
"""
import os
import re
import subprocess

import pytest

from conftest import Daemon, TEST_USER, as_user, mkmodel, parse_user, wait_until
from ctlutil import ctl, model_entry, wait_for_control
from test_budget import locked_bytes

DAEMON_UID, GROUP = 64101, 64100

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: runs wcached as another user, prlimit")


def memlock(pid):
    """RLIMIT_MEMLOCK of process pid: (soft, hard), None for unlimited."""
    with open(f"/proc/{pid}/limits") as f:
        m = re.search(r"^Max locked memory\s+(\S+)\s+(\S+)", f.read(), re.M)
    return tuple(None if v == "unlimited" else int(v) for v in m.groups())


def set_soft_memlock(pid, user, soft):
    """Sets process pid's soft RLIMIT_MEMLOCK as user (its own), keeping the
    hard limit."""
    subprocess.run(as_user(*user) + ["prlimit", f"--pid={pid}",
                                     f"--memlock={'unlimited' if soft is None else soft}:"],
                   check=True, capture_output=True, text=True)


def pin_error(d, name, pattern):
    """Waits until model name's pin_error matches pattern; returns the entry."""
    return wait_until(lambda: (lambda m: m["pin_error"] is not None
                               and re.search(pattern, m["pin_error"]) and m)(
                                   model_entry(d, name)),
                      what=f"{name}'s pin_error to match {pattern!r}")


def log_lines(d, text):
    return [line for line in d.read_log().splitlines() if text in line]


def test_refused_pins_name_the_cause(tmp_path):
    # About 3.5 MiB: far more than the limits set below, less than the 8 MiB
    # a user gets by default.
    path = mkmodel(tmp_path / "m.safetensors", layers=2, hidden=256, ffn=512, vocab=1000)
    os.chmod(path, 0o644)
    size = os.path.getsize(path)
    user = parse_user(TEST_USER) if TEST_USER else (DAEMON_UID, GROUP)
    d = Daemon(tmp_path, {"m": path}, user=user).start()
    try:
        wait_for_control(d)
        pid = d.proc.pid
        m = wait_until(lambda: (lambda m: m["state"] == "ready" and m["pin_applied"] == "metadata"
                                and m)(model_entry(d, "m")), what="m ready, metadata locked")
        assert m["pin_error"] is None, m
        assert not log_lines(d, "cannot lock"), d.read_log()
        with open(f"/proc/{pid}/status") as f:
            assert re.search(r"^CapEff:\s+0+$", f.read(), re.M), "wcached holds capabilities"
        hard = memlock(pid)[1]

        # ENOMEM: room for what is locked and 64 KiB more, not for the model.
        locked = locked_bytes(pid)
        limit = locked + (64 << 10)
        set_soft_memlock(pid, user, limit)
        # Whether the reply waits for the lock and reports its failure is
        # the control command's business: what is checked here is what
        # status and the log say.
        ctl(d, "pin", "m")
        m = pin_error(d, "m", "ENOMEM")
        want = (f"cannot lock {path} ({size} bytes) in memory: mlock: ENOMEM: RLIMIT_MEMLOCK "
                f"is {limit} bytes, {locked} bytes were locked and {size} more asked; raise "
                f"LimitMEMLOCK= in wcached.service (or ulimit -l) to at least "
                f"{-(-(locked + size) // (1 << 20))}M, or pin less")
        assert m["pin_error"] == want
        assert m["pinned"] == "all" and m["pin_applied"] == "metadata", m
        lines = log_lines(d, "cannot lock")
        assert len(lines) == 1 and lines[0].endswith(f'model "m": {want}'), d.read_log()
        r = ctl(d, "status", "m")
        assert r.returncode == 0, r.stderr
        assert f"m: pin = all asked, metadata locked: {want}" in r.stdout, r.stdout
        assert locked_bytes(pid) == locked

        # A pin that holds clears it.
        if hard is not None and hard < locked + size:
            pytest.skip(f"the hard RLIMIT_MEMLOCK ({hard} bytes) is below the model's "
                        f"{locked + size}: no pin of it can hold")
        set_soft_memlock(pid, user, hard)
        assert ctl(d, "pin", "m").returncode == 0
        m = wait_until(lambda: (lambda m: m["pin_applied"] == "all" and m)(model_entry(d, "m")),
                       what="m locked whole")
        assert m["pin_error"] is None, m
        assert locked_bytes(pid) >= size
        assert "pins:" not in ctl(d, "status", "m").stdout

        # EPERM: a limit of 0, without CAP_IPC_LOCK. The unpin unlocks the
        # whole model, then locks the metadata again, which is refused.
        set_soft_memlock(pid, user, 0)
        ctl(d, "unpin", "m")
        m = pin_error(d, "m", "EPERM")
        index = re.match(r"cannot lock its index \((\d+) bytes\) in memory: ", m["pin_error"])
        assert index and m["pin_error"][index.end():] == (
            "mlock: EPERM: RLIMIT_MEMLOCK is 0 and wcached lacks CAP_IPC_LOCK; raise "
            "LimitMEMLOCK= in wcached.service (or ulimit -l), or use pin = none"), m
        assert m["pinned"] == "metadata" and m["pin_applied"] == "none", m
        assert "seccomp" not in m["pin_error"]
        wait_until(lambda: locked_bytes(pid) == 0, what="wcached to hold nothing locked")
        lines = log_lines(d, "cannot lock")
        assert len(lines) == 2 and lines[1].endswith(f'model "m": {m["pin_error"]}'), lines
    finally:
        code = d.stop()
    assert code == 0, f"wcached exited with {code}:\n{d.read_log()}"
