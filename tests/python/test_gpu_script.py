"""tests/gpu/run.sh in its --cpu mode (every step but the CUDA calls, small
sizes, the copy engine on its CPU backend), and the report's PASS/MISS
rules."""
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))

import gpubench  # noqa: E402

pytest.importorskip("torch")


def _rows(**gbps):
    return [{"method": m, "gbps": v} for m, v in gbps.items()]


def test_targets_pass_and_miss():
    verdicts = dict((label, v) for label, v, _ in gpubench.targets(
        _rows(pinned=50.0, wcache=41.0, upstream=20.0, concurrent4=40.5) +
        [{"method": "logits", "equal": True, "max_abs_diff": 0.0},
         {"method": "transformers_wcache", "seconds": 1.0, "sources": "wcached"}]))
    assert set(verdicts.values()) == {"PASS"}
    verdicts = dict((label, v) for label, v, _ in gpubench.targets(
        _rows(pinned=50.0, wcache=39.0, upstream=20.0, concurrent4=41.0) +
        [{"method": "logits", "equal": False, "max_abs_diff": 0.5},
         {"method": "transformers_wcache", "seconds": 1.0, "sources": "file"}]))
    assert verdicts["new path >= 0.8x pinned limit"] == "MISS"
    assert verdicts["new path >= 2x upstream safetensors"] == "MISS"
    assert verdicts["4 processes together >= 0.8x limit"] == "PASS"
    assert verdicts["transformers logits equal"] == "MISS"
    assert verdicts["transformers loaded through wcached"] == "MISS"
    verdicts = dict((label, v) for label, v, _ in gpubench.targets(_rows(pinned=50.0)))
    assert set(verdicts.values()) == {"n/a"}


def test_layout_leaves_tensors_misaligned():
    tensors = gpubench.layout(8 << 20)
    assert len(tensors) >= 8
    assert any(dtype == "I8" and shape == (3,) for _, dtype, shape in tensors)


def test_run_sh_cpu_mode(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, STEP_TIMEOUT="120")
    work = tmp_path / "work"
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu", "--gib", "0.02",
                        "--work", str(work)], env=env, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "FAILED" not in out and "TIMEOUT" not in out
    table = {line[:44].strip(): line[44:].split() for line in r.stdout.splitlines()
             if len(line) > 44}
    assert float(table["pinned anonymous memory (the limit)"][0]) > 0
    assert table["wcache, new path"][-1] == "register"
    assert table["wcache, new path, staging forced"][-1] == "staging"
    assert table["wcache, old per-tensor path"][-1] == "tensor"
    assert table["wcache, new path, 4 processes together"][-1] == "register"
    assert "new path >= 0.8x pinned limit" in r.stdout
    assert not work.exists(), "the work directory is removed without --keep"
    # wcached was stopped: no daemon left with our config
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(work) not in ps


def test_run_sh_reports_a_failed_step_and_goes_on(tmp_path):
    """A measurement that fails is named at the end, after the report of
    the others, and the script exits 1."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *wcache_staging*) exit 3 ;; esac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    env = dict(os.environ, PYTHON=str(wrapper), STEP_TIMEOUT="120")
    r = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh"), "--cpu", "--gib", "0.01",
                        "--work", str(tmp_path / "work")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED step: wcache, new path, staging forced" in r.stdout
    assert "wcache, new path, 4 processes together" in r.stdout  # the run went on
    lines = [x for x in r.stdout.splitlines() if x.startswith("wcache, new path, staging")]
    assert lines and "skipped" in lines[0]
