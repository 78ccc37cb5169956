"""libwcache against a real wcached: the client's deadline (WCACHE_TIMEOUT)
with a stopped daemon, and releases that get no reply (RELEASE with seq 0)."""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

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


# A worker on libwcache (through ctypes): attaches KEEP + RELEASE models of
# "small" on one client with a 0.3 s deadline, its socket's send buffer made
# small (a few RELEASEs fill it), says "attached"; on a line (the daemon is
# stopped by then) releases RELEASE of them, with SIGALRM every 20 ms (a
# handler, no SA_RESTART, as Python installs it) when TIMER is 1, and prints
# each release's seconds; on the next line (the daemon resumed) attaches once
# more and prints the result; on the next, exits without disconnecting.
RELEASE_WORKER = r"""
import ctypes, json, os, signal, socket, sys, time
sock, keep, release, timer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
lib = ctypes.CDLL(os.environ["WCACHE_LIB"])
lib.wc_errmsg.restype = ctypes.c_char_p
lib.wc_connect_timeout.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
lib.wc_client_fd.argtypes = [ctypes.c_void_p]
lib.wc_attach.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
lib.wc_release.argtypes = [ctypes.c_void_p]
c = ctypes.c_void_p()
if lib.wc_connect_timeout(sock.encode(), 300, ctypes.byref(c)) != 0:
    sys.exit("connect: " + lib.wc_errmsg().decode())
s = socket.fromfd(lib.wc_client_fd(c), socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
s.close()
models = []
for _ in range(keep + release):
    m = ctypes.c_void_p()
    if lib.wc_attach(c, b"small", ctypes.byref(m)) != 0:
        sys.exit("attach: " + lib.wc_errmsg().decode())
    models.append(m)
print("attached", flush=True)
sys.stdin.readline()
if timer:
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
times = []
for m in models[keep:]:
    t0 = time.monotonic()
    lib.wc_release(m)
    times.append(time.monotonic() - t0)
signal.setitimer(signal.ITIMER_REAL, 0)
print(json.dumps(times), flush=True)
sys.stdin.readline()
m = ctypes.c_void_p()
r = lib.wc_attach(c, b"small", ctypes.byref(m))
print(json.dumps([r, lib.wc_errmsg().decode()]), flush=True)
sys.stdin.readline()
os._exit(0)
"""


def read_line(proc, timeout):
    """The worker's next line, or an AssertionError after timeout seconds."""
    import select
    if not select.select([proc.stdout], [], [], timeout)[0]:
        raise AssertionError(f"the worker said nothing within {timeout} s")
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return line


def library_env():
    """The environment of a Python worker loading this build's libwcache:
    under a sanitizer build, with the ASan runtime preloaded (the library
    expects the program to bring it)."""
    env = dict(os.environ)
    build = os.path.dirname(os.path.dirname(binary("wcached")))
    env["WCACHE_LIB"] = os.path.join(build, "lib", "libwcache.so")
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        sanitized = "WCACHE_SANITIZE:BOOL=ON" in f.read()
    if sanitized:
        try:
            runtime = subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.so"],
                                     capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            runtime = ""
        if not os.path.isabs(runtime):
            pytest.skip("a sanitizer build, and no ASan runtime to preload into Python")
        env["LD_PRELOAD"] = runtime
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"),
                                                     "detect_leaks=0"]))
    return env


@pytest.mark.parametrize("timer", [False, True], ids=["quiet", "interval_timer"])
def test_release_to_stopped_daemon_closes_the_connection(daemon, timer):
    """Releases while wcached is stopped, once the worker's socket buffer is
    full (review rev141 #1, #2). The release that finds it full returns at
    the 0.3 s deadline, even with a timer's signal every 20 ms: before, the
    send was restarted after each signal with the whole SO_SNDTIMEO, and the
    release never returned. Its RELEASE is lost, so it closes the
    connection: the releases after it return at once (before: 0.3 s each),
    and the daemon, resumed, counts no attach of that connection (before:
    those whose RELEASE was lost stayed attached until the worker
    disconnected). The next attach connects again."""
    keep, release = 2, 40
    proc = subprocess.Popen([sys.executable, "-c", RELEASE_WORKER, daemon.socket, str(keep),
                             str(release), "1" if timer else "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=library_env())
    try:
        assert read_line(proc, 60).strip() == "attached"
        assert status(daemon)["models"][0]["attached"] == keep + release
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            times = json.loads(read_line(proc, 30))
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        assert max(times) >= 0.25, times  # one found the buffer full and waited
        assert max(times) < 0.3 + 1.0, times
        assert sum(times) < 0.3 + 2.0, times
        wait_until(lambda: status(daemon)["models"][0]["attached"] == 0, timeout=10,
                   what="the closed connection's attaches released")
        proc.stdin.write("attach\n")
        proc.stdin.flush()
        assert json.loads(read_line(proc, 30))[0] == 0
        # Only the new attach: the HOLDs of the two kept models are refused
        # (this daemon took no generation over from a previous process), as
        # after any connection the client closed; they stay mapped.
        wait_until(lambda: status(daemon)["models"][0]["attached"] == 1, timeout=10,
                   what="the new attach counted")
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# A peer that closes as wcached does (daemon/server.c: shutdown(SHUT_RD)
# first, the close later from the closer's thread) with the worker's next
# request still unread: the worker's send of it fails with EPIPE, and the
# receive that follows gets ECONNRESET.
RESET_PEER = r"""
import ctypes, os, socket, struct, sys, threading, time
path = sys.argv[1]
lib = ctypes.CDLL(os.environ["WCACHE_LIB"])
lib.wc_errmsg.restype = ctypes.c_char_p
lib.wc_connect_timeout.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
lib.wc_attach.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
srv.bind(path)
srv.listen(4)
step = threading.Event()

def error(seq, code, text):
    t = text.encode()
    return struct.pack("<IHHII", 0x31504357, 1, 255, 4 + len(t), seq) + struct.pack("<i", code) + t

def peer():
    conn, _ = srv.accept()
    req = conn.recv(4096, socket.MSG_PEEK)  # the first request stays unread
    conn.send(error(struct.unpack_from("<I", req, 12)[0], 2, 'model "a" is not served'))
    step.wait()
    conn.shutdown(socket.SHUT_RD)
    srv.close()
    os.unlink(path)  # stopped: no reconnect
    time.sleep(0.5)
    conn.close()

t = threading.Thread(target=peer)
t.start()
c = ctypes.c_void_p()
assert lib.wc_connect_timeout(path.encode(), 5000, ctypes.byref(c)) == 0
m = ctypes.c_void_p()
assert lib.wc_attach(c, b"a", ctypes.byref(m)) == -2, lib.wc_errmsg()
step.set()
time.sleep(0.2)
r = lib.wc_attach(c, b"b", ctypes.byref(m))
print(r, lib.wc_errmsg().decode())
t.join()
"""


def test_a_reset_by_the_daemon_is_not_called_libwcaches_own_close(tmp_path):
    """wcached's close of a connection with a request of the worker's still
    unread gives the worker's receive ECONNRESET: that is the daemon's close,
    and the message says so (review rev159 #2: it recorded "libwcache closed
    the connection ... because a reply could not be received", which a build
    on that connection would then have repeated)."""
    sock = str(tmp_path / "peer.sock")
    r = subprocess.run([sys.executable, "-c", RESET_PEER, sock], capture_output=True,
                       text=True, timeout=60, env=library_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "libwcache closed" not in r.stdout, r.stdout
    assert f"wcached at {sock} closed the connection" in r.stdout, r.stdout
