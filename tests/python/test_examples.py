"""The pre-fork example serves through wcache, the PSS script runs, and the
derived-weights examples build once and attach after (with a daemon) or
compute in process (without)."""
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from pyhelpers import PYDIR, Daemon, mkmodel

EXAMPLES = os.path.join(PYDIR, "examples")


def test_prefork_server_answers(daemon, model_path):
    proc = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "prefork_server.py"),
                             model_path, "--port", "0", "--workers", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = [json.loads(proc.stdout.readline()) for _ in range(4)]
        assert len({r["worker"] for r in ready}) == 4
        assert all(r["source"] == "wcached" for r in ready), ready
        port = ready[0]["port"]
        answers = []
        for seed in range(8):
            url = f"http://127.0.0.1:{port}/infer?seed={seed % 2}"
            with urllib.request.urlopen(url, timeout=30) as r:
                answers.append(json.loads(r.read()))
        # the same input gives the same output, whichever worker answers
        assert len({a["sum"] for a in answers[0::2]}) == 1
        assert len({a["sum"] for a in answers[1::2]}) == 1
        assert {a["pid"] for a in answers} <= {r["worker"] for r in ready}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
            assert json.loads(r.read())["source"] == "wcached"
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()


def test_prefork_pss_script(tmp_path, no_daemon):
    model = mkmodel(tmp_path / "m.safetensors", layers=2, hidden=256, ffn=512, vocab=1000)
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "prefork_pss.py"), model,
                        "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "wcache" in r.stdout and "torch.load" in r.stdout and "summed PSS" in r.stdout


# ---- derived weights (wcache.derived) ----

@pytest.fixture
def derive_daemon(tmp_path, model_path, monkeypatch):
    """wcached serving model_path as "small" with derive = yes."""
    import wcache._safe_open as so
    d = Daemon(tmp_path, {"small": (model_path, {"derive": "yes"})}).start()
    monkeypatch.setenv("WCACHE_SOCKET", d.socket)
    so._shared = None
    yield d
    so._shared = None
    assert d.stop() == 0, d.read_log()


def run_example(name, *args, timeout=300):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r


def test_derive_int8_builds_then_attaches(derive_daemon):
    first = json.loads(run_example("derive_int8.py", "small").stdout)
    again = json.loads(run_example("derive_int8.py", "small").stdout)
    assert first["built_here"] and not again["built_here"]
    assert first["quantized"] == again["quantized"] > 0
    assert first["tensors"] == again["tensors"]
    assert first["max_row_error"] <= 0.5 / 127 + 1e-6, first  # half a step of the scale


def test_derive_int8_without_daemon(no_daemon, model_path):
    r = run_example("derive_int8.py", model_path)
    out = json.loads(r.stdout)
    assert out["built_here"] and out["quantized"] > 0
    assert "computed in this process" in r.stderr


def test_derive_f32_server(derive_daemon):
    servers = []
    try:
        for _ in range(2):
            p = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "derive_f32_server.py"),
                                  "small", "--port", "0"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            servers.append(p)
            servers[-1].ready = json.loads(p.stdout.readline())
        assert [s.ready["built_here"] for s in servers] == [True, False]
        sums = []
        for s in servers:
            url = f"http://127.0.0.1:{s.ready['port']}/infer?seed=3"
            with urllib.request.urlopen(url, timeout=30) as r:
                answer = json.loads(r.read())
            assert answer["dtype"] == "float32"
            sums.append(answer["sum"])
        assert sums[0] == sums[1]
    finally:
        for s in servers:
            s.terminate()
            s.wait(timeout=60)


def test_prefork_derive_one_builder(derive_daemon):
    r = run_example("prefork_derive.py", "small", "--workers", "3")
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 3
    assert sum(x["built"] for x in lines) == 1, r.stdout
    assert len({x["digest"] for x in lines}) == 1
    assert "built: 1" in r.stdout


def test_prefork_derive_without_daemon(no_daemon, model_path):
    r = run_example("prefork_derive.py", model_path, "--workers", "2")
    assert "built: 2" in r.stdout and "same weights: True" in r.stdout
