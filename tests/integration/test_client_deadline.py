"""libwcache against a real wcached: the client's deadline (WCACHE_TIMEOUT)
with a stopped daemon, and releases that get no reply (RELEASE with seq 0)."""
import json
import os
import signal
import socket
import struct
import subprocess
import time

from conftest import binary, wait_until

HEADER = struct.Struct("<IHHII")
MAGIC = 0x31504357


def attach(d, name, env_extra=None, timeout=60):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([binary("wcachectl"), "attach", name, "--socket", d.socket],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_attach_to_stopped_daemon_times_out(daemon):
    assert attach(daemon, "small").returncode == 0
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = attach(daemon, "small", {"WCACHE_TIMEOUT": "0.5"})
        waited = time.monotonic() - t0
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    assert r.returncode != 0
    assert daemon.socket in r.stderr, r.stderr
    assert "did not answer within 0.5 s" in r.stderr, r.stderr
    assert waited < 30, waited  # the 30 s default was not used
    # Resumed, the daemon serves again.
    assert attach(daemon, "small").returncode == 0


def test_bad_timeout_is_an_error(daemon):
    r = attach(daemon, "small", {"WCACHE_TIMEOUT": "thirty"})
    assert r.returncode != 0
    assert "WCACHE_TIMEOUT=thirty" in r.stderr, r.stderr


def status(d):
    r = subprocess.run([binary("wcachectl"), "status", "--json", "--control", d.control],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 3), r.stderr  # 3: a model is not ready (yet)
    return json.loads(r.stdout)


def test_release_without_reply(daemon):
    """A RELEASE of seq 0 ends the attach and gets no reply, even for an
    unknown handle; the next request's reply is the next message."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(daemon.socket)
    name = b"small"
    s.send(HEADER.pack(MAGIC, 1, 1, len(name), 1) + name)
    msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(8 * 4))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            for fd in struct.unpack(f"{len(data) // 4}i", data[:len(data) // 4 * 4]):
                os.close(fd)
    assert HEADER.unpack(msg[:16])[2] == 129
    handle = struct.unpack("<Q", msg[24:32])[0]
    wait_until(lambda: status(daemon)["models"][0]["attached"] == 1, what="one attach")
    s.send(HEADER.pack(MAGIC, 1, 2, 8, 0) + struct.pack("<Q", handle))
    s.send(HEADER.pack(MAGIC, 1, 2, 8, 0) + struct.pack("<Q", 999999))
    # A reply-wanting release of the same (now unknown) handle: its ERROR is
    # the next message, so neither quiet release was answered.
    s.send(HEADER.pack(MAGIC, 1, 2, 8, 7) + struct.pack("<Q", handle))
    reply = s.recv(4096)
    mtype, seq = HEADER.unpack(reply[:16])[2], HEADER.unpack(reply[:16])[4]
    assert (mtype, seq) == (255, 7), reply
    assert status(daemon)["models"][0]["attached"] == 0
    s.close()
