"""How far a model has warmed, as status and metrics report it: a percentage
and an estimate of the time left while it warms, 100 and 0 once ready; the
warm log line, which gives a rate only when it has one; and the start-up
line, which counts the warm-ups that failed before wcached served."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import Daemon, binary, mkmodel, wait_until
from ctlutil import ctl, model_entry
from test_control import tracer
from test_regressions import drop_page_cache

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from remotefs import RemoteFS, skip_reason  # noqa: E402


def make_big(tmp_path):
    """A 256 MiB model, written back and dropped from the page cache."""
    path = str(tmp_path / "big.safetensors")
    subprocess.run([binary("mkmodel"), "--hidden", "256", "--ffn", "512", "--vocab", "1000",
                    "--min-bytes", str(256 << 20), path], check=True,
                   stdout=subprocess.DEVNULL)
    drop_page_cache(path)
    return path


def test_warm_percent_eta_and_log(tmp_path):
    path = make_big(tmp_path)
    d = Daemon(tmp_path, {"big": path}).start()
    try:
        seen = []

        def ready():
            m = model_entry(d, "big")
            seen.append((m["state"], m["warm_percent"], m["warm_eta_seconds"]))
            return m["state"] == "ready"
        wait_until(ready, timeout=120, what="big ready")
        for state, percent, eta in seen:
            assert 0 <= percent <= 100, seen
            if state == "warming":
                assert percent < 100 and (eta is None or eta >= 0), seen
        # Percentages only grow while one generation warms.
        warming = [p for s, p, _ in seen if s == "warming"]
        assert warming == sorted(warming), seen
        m = model_entry(d, "big")
        assert m["warm_percent"] == 100 and m["warm_eta_seconds"] == 0, m
        metrics = ctl(d, "metrics").stdout
        assert re.search(r'^wcached_model_warm_percent\{model="big"\} 100$', metrics, re.M), \
            metrics
        assert re.search(r'^wcached_model_warm_eta_seconds\{model="big"\} 0$', metrics, re.M)
        log = d.read_log()
        line = re.search(r'generation \d+ warm: (\d+) bytes in ([0-9.]+) s(.*)', log)
        assert line, log
        assert "(0 MB/s)" not in log
        if float(line.group(2)) > 0:
            assert re.match(r" \(\d+ MB/s\)", line.group(3)), line.group(0)
    finally:
        assert d.stop() == 0, d.read_log()


def test_the_start_line_counts_a_warm_up_that_failed_before_serving(tmp_path):
    """Model "a"'s warm-up fails (every sendfile(2) of wcached fails with
    EIO, injected by strace) while the start-up batch still waits for model
    "r", whose file lies on a frozen remote filesystem: wcached serves only
    once the filesystem thaws, after a's failure, so the start-up line comes
    after it every time. It counts it: "0 models failed to load, 1 failed
    while warming" (status says a is failed). Before, it said "0 models
    failed to load" and nothing more."""
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-qq", "-o", "/dev/null", "true"]).returncode:
        pytest.skip("needs strace, and ptrace allowed, to make a warm-up fail")
    if skip_reason():
        pytest.skip(skip_reason())
    (tmp_path / "backing").mkdir()
    (tmp_path / "mnt").mkdir()
    (tmp_path / "d").mkdir()
    os.chmod(tmp_path, 0o755)
    a = mkmodel(tmp_path / "a.safetensors", seed=1)
    remote_src = mkmodel(tmp_path / "r.safetensors", seed=2)
    # -D: strace runs beside wcached, which is the daemon's process itself;
    # -I1: killing strace detaches it (LeakSanitizer cannot run under ptrace).
    wrapper = tmp_path / "wcached-eio"
    wrapper.write_text(f"#!/bin/sh\nexec {strace} -I1 -D -f -qq -o /dev/null -e trace=sendfile "
                       f"-e inject=sendfile:error=EIO {binary('wcached')} \"$@\"\n")
    wrapper.chmod(0o755)
    with RemoteFS(tmp_path / "backing", tmp_path / "mnt", attr_timeout=0.1) as fs:
        with open(remote_src, "rb") as f:
            fs.replace("r.safetensors", f.read())
        fs.wait_visible("r.safetensors")
        d = Daemon(tmp_path / "d", {"a": a, "r": (fs.path("r.safetensors"),
                                                  {"stage": "no", "warm": "no"})},
                   extra="start_wait_seconds = 300\n")
        d.wcached = str(wrapper)
        fs.freeze()
        try:
            d.start()
            d.wait_for_log(r'model "a": warming generation 1 failed: Input/output error')
            assert "serving on" not in d.read_log(), d.read_log()
        finally:
            fs.thaw()
        try:
            _, line = d.wait_for_log(r"serving on ")
            assert line.endswith(" (0 models failed to load, 1 failed while warming)"), line
            assert model_entry(d, "a")["state"] == "failed"
            assert model_entry(d, "r")["state"] == "ready"
            os.kill(tracer(d.proc.pid), signal.SIGTERM)
            wait_until(lambda: tracer(d.proc.pid) == 0, what="strace detached")
        finally:
            assert d.stop() == 0, d.read_log()
