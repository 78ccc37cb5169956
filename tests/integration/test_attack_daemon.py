"""Neighbours attacking wcached through what it hands out (issue 18), against
the real daemon:

  - a worker sets O_DIRECT, O_NONBLOCK and O_APPEND on every descriptor it
    received and moves their offsets, then the model is evicted and warmed
    again: the daemon reads through descriptions of its own, so the model
    stays ready and another worker reads every byte (with the daemon's own
    descriptions handed out, the re-warm's unaligned last read failed with
    EINVAL and the model failed for everyone);
  - a model file whose mtime lies past the year 2262 (more nanoseconds than
    an int64 holds) is stored and restored across a warm restart without
    the sanitized daemon aborting on the overflow.

Each asserts what the old code got wrong, so it fails there."""
import fcntl
import os
import socket
import stat
import struct
import subprocess

import test_warm_restart as warm
from conftest import Daemon, binary, mkmodel, wait_until
from ctlutil import ctl, model_entry
from fakemanager import FakeManager
from test_regressions import ATTACH, ATTACH_OK, HEADER, message, raw_client, ready
from test_regressions import start  # noqa: F401 (the fixture, used by name)

ATTACK_FLAGS = os.O_DIRECT | os.O_NONBLOCK | os.O_APPEND


def attach_keeping_fds(s, name):
    """ATTACH name on s; returns the descriptors of the ATTACH_OK, open."""
    s.send(message(ATTACH, name.encode()))
    data, ancdata, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(4 * 256))
    fds = []
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [fd for (fd,) in struct.iter_unpack("i", cdata[:len(cdata) // 4 * 4])]
    assert HEADER.unpack_from(data)[2] == ATTACH_OK, data
    return fds


def verify(d, path, name):
    r = subprocess.run([binary("demo_worker"), "--socket", d.socket, "--verify", path, name],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_worker_flags_do_not_reach_the_daemon(start, tmp_path):
    path = mkmodel(tmp_path / "m.safetensors", layers=3, hidden=96, ffn=200, vocab=77)
    size = os.stat(path).st_size
    assert size % 512 != 0, size  # a last chunk O_DIRECT cannot read
    d = start({"m": path})
    ready(d, "m")
    s = raw_client(d)
    fds = attach_keeping_fds(s, "m")
    try:
        model_ino = os.stat(path).st_ino
        flagged = 0
        for fd in fds:
            st = os.fstat(fd)
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | ATTACK_FLAGS)
            except OSError:
                # memfds refuse O_DIRECT; the model file must take it.
                assert st.st_ino != model_ino or not stat.S_ISREG(st.st_mode)
                continue
            os.lseek(fd, 12345, os.SEEK_SET)
            flagged += st.st_ino == model_ino
        assert flagged == 1, "the model file's descriptor took the flags"
        r = ctl(d, "evict", "m")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_until(lambda: model_entry(d, "m")["state"] == "cold", what="m evicted")
        # An attach while cold warms it again, through the daemon's own
        # description: it must read to the end and serve.
        verify(d, path, "m")
        ready(d, "m")
        assert model_entry(d, "m")["state"] == "ready"
        out = verify(d, path, "m")
        assert '"generation":1' in out.replace(" ", ""), out
        assert "-> failed" not in d.read_log(), d.read_log()
    finally:
        for fd in fds:
            os.close(fd)
        s.close()


def test_mtime_past_2262_survives_a_warm_restart(tmp_path):
    path = mkmodel(tmp_path / "a.safetensors", seed=7)
    year_2300_ns = (2300 - 1970) * 31_556_952 * 10**9  # over INT64_MAX
    assert year_2300_ns > 2**63
    os.utime(path, ns=(year_2300_ns, year_2300_ns))
    assert os.stat(path).st_mtime_ns == year_2300_ns, "the filesystem keeps such times"
    mgr = FakeManager(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, {"a": path})
    try:
        warm.start(d, mgr)
        wait_until(lambda: warm.ready(d, "a"), what="a ready")
        mgr.wait_for(lambda m: "wc-desc" in m.store and "wc-1-1-i" in m.store,
                     what="the generation and the description stored")
        assert d.stop() == 0, d.read_log()
        fds, names = mgr.listen_fds()
        warm.start(d, mgr, fds, names)
        wait_until(lambda: warm.ready(d, "a"), what="a after the restart")
        log = d.read_log()
        assert 'model "a": generation 1 restored from the file descriptor store' in log, log
        assert "runtime error" not in log, log
        warm.finish(warm.worker(d, path, "a"))
    finally:
        code = d.stop()
        mgr.close()
    assert code == 0, d.read_log()
