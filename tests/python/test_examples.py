"""The pre-fork example serves through wcache, and the PSS script runs."""
import json
import os
import subprocess
import sys
import urllib.request

from pyhelpers import PYDIR, mkmodel

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
                        "--workers", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "wcache" in r.stdout and "torch.load" in r.stdout and "summed PSS" in r.stdout
