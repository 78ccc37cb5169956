"""systemd integration without systemd: socket activation through
systemd-socket-activate, the sd_notify protocol on a fake $NOTIFY_SOCKET,
and the unit files checked with systemd-analyze."""
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import Daemon, binary, wait_until

SRC = os.environ.get("WCACHE_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
ACTIVATE = shutil.which("systemd-socket-activate")
ANALYZE = shutil.which("systemd-analyze")


class Notify:
    """A fake $NOTIFY_SOCKET: collects the daemon's datagrams."""

    def __init__(self, address):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.messages = []

    def wait_for(self, text, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, m in enumerate(self.messages):
                if text in m.split("\n"):
                    del self.messages[:i + 1]
                    return m
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                pass
        raise AssertionError(f"no {text!r} from wcached; got {self.messages}")

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("abstract", [False, True])
def test_notify_protocol(tmp_path, model, abstract):
    if abstract:
        address = f"\0wcache-test-{os.getpid()}-{time.monotonic_ns()}"
        env_value = "@" + address[1:]
    else:
        address = str(tmp_path / "notify.sock")
        env_value = address
    n = Notify(address)
    d = Daemon(tmp_path, {"small": model})
    try:
        d.start(env=dict(os.environ, NOTIFY_SOCKET=env_value))
        n.wait_for("READY=1")
        # STATUS= lines carry progress; one follows READY=1.
        status = None
        deadline = time.monotonic() + 30
        while status is None and time.monotonic() < deadline:
            n.sock.settimeout(5)
            m = n.sock.recv(4096).decode()
            if m.startswith("STATUS="):
                status = m
        assert status and ("serving" in status or "warming" in status), status
        d.proc.send_signal(signal.SIGHUP)
        n.wait_for("RELOADING=1")
        n.wait_for("READY=1")
        assert d.attach("small").returncode == 0
        d.proc.send_signal(signal.SIGTERM)
        n.wait_for("STOPPING=1")
        assert d.proc.wait(timeout=30) == 0
    finally:
        d.stop()
        n.close()


def test_reload_command_waits_and_notifies(tmp_path, model):
    address = str(tmp_path / "notify.sock")
    n = Notify(address)
    d = Daemon(tmp_path, {"small": model})
    try:
        d.start(env=dict(os.environ, NOTIFY_SOCKET=address))
        n.wait_for("READY=1")
        other = tmp_path / "other.safetensors"
        shutil.copy(model, other)
        d.write_config({"small": model, "other": str(other)})
        r = subprocess.run([binary("wcachectl"), "--control", d.control, "reload"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        # When reload returns, the new model is loaded.
        assert d.attach("other").returncode == 0
        n.wait_for("RELOADING=1")
        n.wait_for("READY=1")
    finally:
        assert d.stop() == 0, d.read_log()
        n.close()


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is missing")
def test_socket_activation(tmp_path, model):
    sock = str(tmp_path / "activated.sock")
    d = Daemon(tmp_path, {"small": model})
    # The configured socket path differs: the daemon must use the passed one.
    log = open(d.log, "w")
    proc = subprocess.Popen([ACTIVATE, "--seqpacket", "-l", sock, "--fdname=client",
                             binary("wcached"), "-c", d.conf], stderr=log)
    try:
        # Its line, not the socket's name: the name is there from bind(2),
        # before listen(2), and a connect in between is refused (seen once
        # in CI under load).
        wait_until(lambda: "Listening on" in open(d.log).read(),
                   what="systemd-socket-activate to listen")
        # The worker starts before the daemon: it waits instead of failing.
        r = subprocess.run([binary("wcachectl"), "attach", "small", "--socket", sock],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr + open(d.log).read()
        assert not os.path.exists(d.socket)  # it did not create its own
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, open(d.log).read()
        # It never removes a socket it did not create.
        assert os.path.exists(sock)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is missing")
def test_socket_activation_wrong_type_is_an_error(tmp_path, model):
    sock = str(tmp_path / "stream.sock")
    d = Daemon(tmp_path, {"small": model})
    proc = subprocess.Popen([ACTIVATE, "-l", sock, "--fdname=client", binary("wcached"),
                             "-c", d.conf], stderr=subprocess.PIPE, text=True)
    try:
        # The path appears at bind(2), before listen(2): a connect in
        # between is refused, so retry until it is accepted.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

        def connected():
            try:
                c.connect(sock)
                return True
            except (FileNotFoundError, ConnectionRefusedError):
                return False
        wait_until(connected, what="systemd-socket-activate to listen")
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert '("client") has socket type 1, expected 5' in err, err
        c.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is missing")
@pytest.mark.parametrize("unit", ["wcached.service", "wcached-metrics@.service"])
def test_unit_security_rating(unit):
    r = subprocess.run([ANALYZE, "security", "--offline=yes",
                        os.path.join(SRC, "systemd", unit)],
                       capture_output=True, text=True, timeout=60)
    line = [l for l in r.stdout.splitlines() if "Overall exposure level" in l][0]
    exposure = float(line.split(":")[1].split()[0])
    assert exposure <= 1.5, r.stdout


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is missing")
def test_units_verify(tmp_path):
    # verify checks ExecStart= binaries exist: point a copy at this build.
    for unit in ("wcached.service", "wcached.socket"):
        text = open(os.path.join(SRC, "systemd", unit)).read()
        text = text.replace("/usr/local/bin/wcached ", binary("wcached") + " ")
        text = text.replace("/usr/local/bin/wcachectl ", binary("wcachectl") + " ")
        text = "\n".join(l for l in text.splitlines() if not l.startswith("Documentation="))
        (tmp_path / unit).write_text(text + "\n")
    r = subprocess.run([ANALYZE, "verify", str(tmp_path / "wcached.service"),
                        str(tmp_path / "wcached.socket")], capture_output=True, text=True,
                       timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines()
                if "wcached" in l and "man " not in l]
    assert r.returncode == 0 or not problems, r.stdout + r.stderr
