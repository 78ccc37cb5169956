"""tests/gpu/gpubench.py against the library versions the GPU run has and
this machine does not (transformers 5): what can be checked without them.
The --cpu run of the whole script is test_gpu_script.py."""
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))

import gpubench  # noqa: E402


def test_save_arguments_follow_the_signature():
    """transformers 4's save_pretrained has safe_serialization; 5's has not
    (it takes **kwargs and hands them on), so it is passed only to 4's."""
    def save_v4(save_directory, max_shard_size="5GB", safe_serialization=True, **kwargs):
        pass

    def save_v5(save_directory, max_shard_size="50GB", save_original_format=True, **kwargs):
        pass

    assert gpubench._save_arguments(save_v4, "64KB") == {"max_shard_size": "64KB",
                                                         "safe_serialization": True}
    assert gpubench._save_arguments(save_v5, "500MB") == {"max_shard_size": "500MB"}
    assert gpubench._save_arguments(print, "1GB") == {"max_shard_size": "1GB"}


def test_register_ranges_lie_in_the_data_in_whole_pages():
    """8 ranges of 256 MiB from the first page boundary in the model's data,
    back to back; a smaller model gets 8 equal shares of whole pages; one
    without 8 pages, none (SystemExit)."""
    import pytest
    page, mib = gpubench.PAGE, gpubench.MIB
    lo = 0x7f0000000000 + 123  # data start inside a page
    ranges = gpubench.register_ranges(lo, lo + (8 << 30))
    first = lo - 123 + page
    assert ranges == [(first + k * 256 * mib, first + (k + 1) * 256 * mib) for k in range(8)]
    ranges = gpubench.register_ranges(lo, lo + 20 * mib)
    size = ranges[0][1] - ranges[0][0]
    assert len(ranges) == 8 and size % page == 0 and 0 < size <= (20 * mib - page) // 8
    assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:]))
    assert ranges[0][0] == first and ranges[-1][1] <= lo + 20 * mib
    with pytest.raises(SystemExit, match="no 8 whole pages"):
        gpubench.register_ranges(lo, lo + 8 * page)


def _report(tmp_path, rows):
    import argparse
    import json
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gpubench.cmd_report(argparse.Namespace(results=str(results), cpu=False))


def test_report_has_the_informational_rows(tmp_path, capsys):
    """The get_tensor loops are rows of the table with their ms per tensor
    (and wcache's the engine's figures), registration a line of its own
    with the ratio and what it means; none is a target: the PASS/MISS/n/a
    lines are the same 9 with them as without."""
    rows = [{"method": "upstream_get_tensor", "bytes": 8 << 30, "seconds": 2.0, "gbps": 4.29,
             "path": "", "tensors": 451, "ms_per_tensor": 4.4346},
            {"method": "wcache_get_tensor", "bytes": 8 << 30, "seconds": 1.0, "gbps": 8.59,
             "path": "register,tensor", "tensors": 451, "ms_per_tensor": 2.2173,
             "engine_tensors": 300, "view_s": 0.01, "register_s": 0.5, "copy_s": 0.4,
             "unregister_s": 0.05, "why": "cuda: source registered read-only"},
            {"method": "register_threads", "backend": "cuda", "ranges": 8, "range_mib": 256.0,
             "bytes": 2 << 30, "threads": 4, "views": True, "seconds_1": 0.8, "seconds_n": 0.25,
             "unregister_s_1": 0.1, "unregister_s_n": 0.1, "gbps_1": 2.68, "gbps_n": 8.59,
             "ratio": 3.2, "threads_used": 4}]
    _report(tmp_path, rows)
    out = capsys.readouterr().out.splitlines()
    at = out.index(next(x for x in out if x.startswith("get_tensor loop, safetensors safe_open")))
    assert out[at].split()[-2:] == ["2.000", "-"], out[at]
    assert out[at + 1] == "    451 tensors, 4.435 ms per tensor (informational, no target)"
    at = out.index(next(x for x in out if x.startswith("get_tensor loop, wcache.safe_open")))
    assert out[at].split()[-4:] == ["8.59", "1.000", "-", "register,tensor"], out[at]
    assert out[at + 1] == "    451 tensors, 2.217 ms per tensor, 300 of them through the " \
        "engine (informational, no target)"
    assert out[at + 2].startswith("    view 0.010 s, register 0.500 s, copy 0.400 s")
    at = out.index(next(x for x in out if x.startswith("registration, 1 thread vs 4")))
    assert out[at][44:].startswith(" 0.800 s vs 0.250 s: 3.20x (4x if the driver pins in "
                                   "parallel, 1x if it serialises)"), out[at]
    assert out[at + 1].startswith("    8 x 256 MiB of the model's mapping (shared views"), out
    verdicts = [x for x in out if x[:5].strip() in ("PASS", "MISS", "n/a")]
    assert len(verdicts) == 9 and all(x.startswith("n/a") for x in verdicts), verdicts
    rows[2] = {k: rows[2][k] for k in ("method", "backend", "ranges", "range_mib", "bytes",
                                       "threads", "views")}
    rows[2]["refused"] = "cudaHostRegister(read-only): operation not supported (801)"
    _report(tmp_path, rows)
    out = capsys.readouterr().out
    assert "registration, 1 thread vs 4                  refused: cudaHostRegister(read-only): " \
        "operation not supported (801)\n" in out, out
    _report(tmp_path, [])
    out = capsys.readouterr().out
    for label in ("get_tensor loop, safetensors safe_open", "get_tensor loop, wcache.safe_open",
                  "registration, 1 thread vs 4"):
        assert f"\n{label:44} {'skipped':>8}\n" in out, (label, out)
