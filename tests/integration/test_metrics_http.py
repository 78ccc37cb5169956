"""The Prometheus endpoint: `wcachectl metrics --http`, the per-connection
responder of wcached-metrics.socket, answering raw HTTP requests on its
standard input and output; the same responder behind
systemd-socket-activate (Accept=yes, inetd protocol, as the socket unit
runs it) scraped by a real Prometheus server on loopback, whose HTTP API
says the target is up and has the wcache series; and the two units checked
with systemd-analyze."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import binary, wait_until
from ctlutil import FakeControl, ctl, wait_for_control

SRC = os.environ.get("WCACHE_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
ACTIVATE = shutil.which("systemd-socket-activate")
ANALYZE = shutil.which("systemd-analyze")
PROMETHEUS = shutil.which("prometheus")
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
def daemon(daemon):
    """conftest's daemon once "small" is ready: the control socket answers
    while the configured models still load (metrics would say 0 bytes) and
    warm (state "warming")."""
    wait_for_control(daemon)
    wait_until(lambda: ctl(daemon, "status").returncode == 0, what="small ready")
    return daemon


def respond(d, request, *extra, control=None):
    """Runs the responder on request (bytes) with pipes as its connection;
    returns (status code, headers dict, body bytes, exit status)."""
    r = subprocess.run([binary("wcachectl"), "--control", control or d.control, "metrics",
                        "--http", *extra], input=request, capture_output=True, timeout=60)
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    if not lines[0]:
        return None, {}, b"", r.returncode
    version, code, _ = lines[0].split(" ", 2)
    assert version == "HTTP/1.1"
    headers = dict(l.split(": ", 1) for l in lines[1:])
    assert int(headers["Content-Length"]) == len(body)
    assert headers["Connection"] == "close"
    return int(code), headers, body, r.returncode


def test_get_metrics(daemon, model):
    code, headers, body, rc = respond(
        daemon, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n")
    assert code == 200 and rc == 0
    assert headers["Content-Type"] == EXPOSITION
    text = body.decode()
    assert f'wcached_model_bytes{{model="small"}} {os.path.getsize(model)}' in text
    assert "# TYPE wcached_model_bytes gauge" in text and text.endswith("\n")
    # A query string, HTTP/1.0 and bare LF line ends are fine.
    assert respond(daemon, b"GET /metrics?x=1 HTTP/1.0\n\n")[0] == 200
    # The absolute form, which a server must accept (RFC 9112 3.2.2; a
    # client talking to a proxy sends it). Before: 404.
    for target in (b"http://localhost:9571/metrics", b"HTTP://h/metrics?x=1",
                   b"https://[::1]:9571/metrics", b"http:///metrics"):
        code, _, body, rc = respond(daemon, b"GET " + target + b" HTTP/1.1\r\n\r\n")
        assert code == 200 and rc == 0 and b"wcached_model_bytes" in body, target
    for target in (b"http://h/", b"http://h", b"http://h?/metrics", b"http://h/x/metrics",
                   b"ftp://h/metrics"):
        assert respond(daemon, b"GET " + target + b" HTTP/1.1\r\n\r\n")[0] == 404, target


def test_head_metrics(daemon):
    """HEAD gets GET's head, Content-Length included, and no body (RFC 9110
    9.3.2: every general-purpose server supports GET and HEAD). Before:
    405."""
    r = subprocess.run([binary("wcachectl"), "--control", daemon.control, "metrics", "--http"],
                       input=b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                       capture_output=True, timeout=60)
    head, sep, body = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(l.split(": ", 1) for l in lines[1:])
    assert r.returncode == 0 and lines[0] == "HTTP/1.1 200 OK" and sep and body == b""
    assert headers["Content-Type"] == EXPOSITION
    got = respond(daemon, b"GET /metrics HTTP/1.1\r\n\r\n")[2]
    # The metrics move between the two requests (uptime): about the same size.
    assert abs(int(headers["Content-Length"]) - len(got)) < 64, (headers, len(got))
    r = subprocess.run([binary("wcachectl"), "--control", daemon.control, "metrics", "--http"],
                       input=b"HEAD / HTTP/1.1\r\n\r\n", capture_output=True, timeout=60)
    assert r.stdout.startswith(b"HTTP/1.1 404 ") and r.stdout.endswith(b"\r\n\r\n")


def test_everything_else_is_refused(daemon):
    cases = ((b"GET / HTTP/1.1\r\n\r\n", 404), (b"GET /metricsx HTTP/1.1\r\n\r\n", 404),
             (b"GET /status HTTP/1.1\r\n\r\n", 404),
             (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
             (b"PUT /metrics HTTP/1.1\r\n\r\n", 405), (b"get /metrics HTTP/1.1\r\n\r\n", 405),
             (b"GET /metrics\r\n\r\n", 400), (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
             (b"GET  /metrics HTTP/1.1\r\n\r\n", 400), (b"\x16\x03\x01\x02\x00\r\n\r\n", 400),
             (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", 400),            # ends mid-head
             (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 400))
    for request, expected in cases:
        code, headers, body, rc = respond(daemon, request)
        assert code == expected, (request[:40], code)
        assert rc == 1 and b"wcached_" not in body
        if expected == 405:
            assert headers["Allow"] == "GET, HEAD"
    # A connection that sends nothing gets nothing.
    assert respond(daemon, b"") == (None, {}, b"", 1)


def test_deadline_and_daemon_down(daemon, tmp_path):
    # Nothing complete within the timeout: 408, well before the test's own.
    w = subprocess.Popen([binary("wcachectl"), "--control", daemon.control, "metrics", "--http",
                          "--timeout", "0.5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    w.stdin.write(b"GET /metr")
    w.stdin.flush()
    out = w.stdout.read()  # until the responder exits; stdin stays open
    w.stdin.close()
    w.wait(timeout=30)
    # The 408 is the deadline met: without it the exchange's alarm (the
    # timeout + 5 s) ends wcachectl with nothing written, so no clock here.
    assert out.startswith(b"HTTP/1.1 408 "), out
    # By default 3 s (as the unit runs it): an idle connection holds one of
    # the socket unit's 16 places that long, not 10 s as before.
    w = subprocess.Popen([binary("wcachectl"), "--control", daemon.control, "metrics", "--http"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    start = time.monotonic()
    out = w.stdout.read()
    took = time.monotonic() - start
    w.stdin.close()
    w.wait(timeout=30)
    # At least the 3 s (measured from before wcachectl started), and well
    # under the 10 s of before, however loaded the machine.
    assert out.startswith(b"HTTP/1.1 408 ") and 2.5 < took < 9, (out, took)
    # A head that reaches the 8 KiB cap, then stops: 400 at once (the cap
    # is reached), not 408 at the deadline as before.
    w = subprocess.Popen([binary("wcachectl"), "--control", daemon.control, "metrics", "--http",
                          "--timeout", "20"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    w.stdin.write(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (8192 - 26))
    w.stdin.flush()
    out = w.stdout.read()
    w.stdin.close()
    w.wait(timeout=30)
    # A 400 is the cap deciding; the deadline (20 s) would have given 408.
    assert out.startswith(b"HTTP/1.1 400 ") and b"request header too large" in out, out
    code, _, body, rc = respond(daemon, b"GET /metrics HTTP/1.1\r\n\r\n",
                                control=str(tmp_path / "none.sock"))
    assert code == 503 and rc == 1 and b"cannot be reached" in body
    r = subprocess.run([binary("wcachectl"), "metrics", "--timeout", "1"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "--timeout goes with --http" in r.stderr


def test_only_an_ok_reply_is_served(tmp_path):
    """The metrics come from a reply's "text" only when it says "ok":true;
    otherwise its "error" is the 503's reason, whichever key comes first.
    Before, the first of "text" and "error" was taken: {"ok":true,"error":
    ...,"text":...} served the error as the metrics, with 200."""
    cases = ((b'{"ok":true,"error":"not this","text":"m 1\\n"}\n', 200, b"m 1\n"),
             (b'{"text":"m 2\\n","ok":true}\n', 200, b"m 2\n"),
             (b'{"ok":false,"text":"m 3\\n","error":"broken"}\n', 503, b"broken\n"),
             (b'{"ok":true,"error":"no text"}\n', 503, b"wcached sent no metrics\n"),
             (b'{"text":"m 4\\n"}\n', 503, b"wcached sent no metrics\n"))
    for i, (reply, expected, body) in enumerate(cases):
        fake = FakeControl(tmp_path / f"c{i}.sock", reply)
        try:
            r = subprocess.run([binary("wcachectl"), "--control", fake.path, "metrics",
                                "--http"], input=b"GET /metrics HTTP/1.1\r\n\r\n",
                               capture_output=True, timeout=60)
        finally:
            fake.close()
        head, _, got = r.stdout.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % expected) and got == body, (reply, r.stdout)
        assert r.returncode == (0 if expected == 200 else 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers, r.read()


@pytest.fixture
def endpoint(daemon):
    """The responder on loopback TCP, one process per connection, as
    wcached-metrics.socket runs it: under systemd-socket-activate --inetd
    --accept."""
    if ACTIVATE is None:
        pytest.skip("systemd-socket-activate is missing")
    port = free_port()
    proc = subprocess.Popen([ACTIVATE, "--listen", f"127.0.0.1:{port}", "--accept", "--inetd",
                             binary("wcachectl"), "--control", daemon.control, "metrics",
                             "--http"], stderr=subprocess.PIPE)

    def listening():
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    try:
        wait_until(listening, what="systemd-socket-activate to listen")
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_endpoint_over_tcp(endpoint, model):
    status, headers, body = http_get(f"http://127.0.0.1:{endpoint}/metrics")
    assert status == 200 and headers["Content-Type"] == EXPOSITION
    assert b'wcached_model_state{model="small",state="ready"}' in body
    with pytest.raises(urllib.error.HTTPError) as e:
        http_get(f"http://127.0.0.1:{endpoint}/")
    assert e.value.code == 404
    # Many scrapes in a row: each connection gets its own responder.
    for _ in range(20):
        assert http_get(f"http://127.0.0.1:{endpoint}/metrics")[0] == 200


def test_prometheus_scrapes_the_endpoint(endpoint, tmp_path, model):
    if PROMETHEUS is None:
        pytest.skip("prometheus is missing (Debian package prometheus): not scraped")
    web = free_port()
    conf = tmp_path / "prometheus.yml"
    conf.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: wcached\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{endpoint}']\n")
    log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={conf}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    api = f"http://127.0.0.1:{web}/api/v1"

    def query(expr):
        try:
            _, _, body = http_get(f"{api}/query?" + urllib.parse.urlencode({"query": expr}))
        except OSError:
            return []
        reply = json.loads(body)
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def target_up():
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
        try:
            _, _, body = http_get(f"{api}/targets")
        except OSError:
            return None
        targets = json.loads(body)["data"]["activeTargets"]
        return targets and targets[0]["health"] == "up" and targets[0]
    try:
        target = wait_until(target_up, timeout=120, what="Prometheus to scrape wcached")
        assert target["scrapeUrl"] == f"http://127.0.0.1:{endpoint}/metrics"
        assert target["lastError"] == ""
        size = os.path.getsize(model)
        series = wait_until(lambda: query('wcached_model_bytes{model="small"}'), timeout=60,
                            what="the wcache series in Prometheus")
        assert float(series[0]["value"][1]) == size
        assert series[0]["metric"]["job"] == "wcached"
        up = query('up{job="wcached"}')
        assert up and up[0]["value"][1] == "1"
        for name in ("wcached_uptime_seconds", "wcached_model_resident_bytes",
                     "wcached_model_attaches_total", "wcached_build_info"):
            assert query(name), name
        state = query('wcached_model_state{model="small",state="ready"}')
        assert state and state[0]["value"][1] == "1"
    finally:
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(timeout=60)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()


# ---- the units (test_systemd.py rates their security) ----------------------

@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is missing")
def test_metrics_units_verify(tmp_path):
    for unit in ("wcached-metrics.socket", "wcached-metrics@.service"):
        text = open(os.path.join(SRC, "systemd", unit)).read()
        text = text.replace("/usr/local/bin/wcachectl ", binary("wcachectl") + " ")
        text = "\n".join(l for l in text.splitlines() if not l.startswith("Documentation="))
        (tmp_path / unit).write_text(text + "\n")
    # A template is verified through an instance.
    os.symlink(tmp_path / "wcached-metrics@.service", tmp_path / "wcached-metrics@0.service")
    r = subprocess.run([ANALYZE, "verify", str(tmp_path / "wcached-metrics.socket"),
                        str(tmp_path / "wcached-metrics@0.service")], capture_output=True,
                       text=True, timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines()
                if "wcached-metrics" in l and "man " not in l]
    assert not problems, r.stdout + r.stderr
    text = open(os.path.join(SRC, "systemd", "wcached-metrics.socket")).read()
    assert "ListenStream=127.0.0.1:9571" in text and "Accept=yes" in text
    # A loop of connects must not fail the socket for good (the trigger
    # limit counts refused connections too), and peers are loopback only.
    assert "TriggerLimitIntervalSec=0" in text
    assert "IPAddressAllow=localhost" in text and "IPAddressDeny=any" in text
    # Every loopback peer is the one source 127.0.0.1: a cap per source is a
    # cap for all, and 8 connections of any local user refused a local
    # Prometheus (review 173, F11). MaxConnections= is the only cap.
    assert "MaxConnections=16" in text.splitlines()
    assert not [l for l in text.splitlines() if l.startswith("MaxConnectionsPerSource=")]
