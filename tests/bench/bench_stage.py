#!/usr/bin/python3
"""The staging benchmark (issue 22): what copying a model to stage_dir
costs against warming it where it is, on the same file, in one run.

The file is bench_cold.py's ~2 GiB model (cached in <build>/bench-models),
evicted from the page cache before every run (posix_fadvise(DONTNEED) on
that file alone, checked with mincore). Interleaved, RUNS times each:

  warm-up       stage = no: wcached's warm-up of the file where it is, its
                "generation N warm: B bytes in S s" line;
  staging       stage = yes: wcached's copy to a stage_dir on the same
                filesystem, its "staged ... (B in S s, R MB/s)" line, then
                the warm-up of the copy (mostly in the page cache already:
                the copy wrote it there);
and, where tests/tools/remotefs is built and FUSE is usable (root), the
same two through a remotefs mount of the file's directory (a FUSE
filesystem: stage = auto stages there).

Prints MB/s (10^6 bytes per second) best and median, the ratio of staging
to the warm-up, the copy's size on disk (st_blocks) and the seconds from
the daemon's start to the model served. Never fails on a figure.
"""
import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from bench import Bench, fs_type, machine  # noqa: E402
from bench_cold import MODEL  # noqa: E402
from wcached import Wcached  # noqa: E402

RUNS = 2


def run(b, tmp, path, stage):
    """One daemon serving path with stage = stage; its figures."""
    stage_dir = os.path.join(tmp, "staged")
    d = Wcached(tmp, {"m": (path, {"pin": "none", "stage": stage})},
                extra=f"stage_dir = {stage_dir}\n", log_level="info",
                wcached=b.binary("wcached")).start()
    out = {}
    try:
        if stage in ("yes", "auto"):
            line = d.wait_for_log(r'generation \d+ staged from ', 600)[1]
            m = re.search(r"staged from (\S+) to (\S+) \(.* in ([0-9.]+) s, (\d+) MB/s\)", line)
            out["from"], copy = m.group(1), m.group(2)
            out["stage_rate"] = int(m.group(4)) * 1e6  # exact; the seconds are rounded
            disk = 0
            for name in os.listdir(copy):
                disk += os.stat(os.path.join(copy, name)).st_blocks * 512
            out["disk"] = disk
        line = d.wait_for_log(r'generation \d+ warm: ', 600)
        m = re.search(r"warm: (\d+) bytes in ([0-9.]+) s", line[1])
        out["bytes"], out["warm_s"] = int(m.group(1)), float(m.group(2))
        out["served_s"] = line[0] - d.started
    finally:
        status = d.stop()
    if status != 0:
        raise SystemExit(f"bench: wcached exited with {status}:\n{d.read_log()}")
    return out


def part(b, label, path, size, runs, evict, tmp):
    warm, stage, stage_warm, disk, served = [], [], [], [], {"no": [], "yes": []}
    for _ in range(runs):
        for mode in ("no", "yes"):
            if not evict(path):
                raise SystemExit(f"bench: cannot evict {path}")
            r = run(b, tmp, path, mode)
            served[mode].append(r["served_s"])
            if mode == "no":
                warm.append(size / r["warm_s"])
            else:
                stage.append(r["stage_rate"])
                stage_warm.append(size / r["warm_s"])
                disk.append(r["disk"])
    print(f"  {label}: {path} ({fs_type(path)}), {size / 1e9:.2f} GB, {runs} runs each")
    print(f"    {'':<30} {'best MB/s':>10} {'median MB/s':>12}")
    for name, v in (("warm-up where it is (no)", warm), ("staging copy (yes)", stage),
                    ("warm-up of the copy (yes)", stage_warm)):
        print(f"    {name:<30} {max(v) / 1e6:>10.0f} {statistics.median(v) / 1e6:>12.0f}")
    print(f"    staging / warm-up: {max(stage) / max(warm):.2f}x (best), "
          f"{statistics.median(stage) / statistics.median(warm):.2f}x (median)")
    print(f"    copy on disk: {max(disk) / 1e9:.2f} GB ({max(disk) / size:.3f}x the model)")
    print(f"    start to served and warm: stage = no {statistics.median(served['no']):.2f} s, "
          f"stage = yes {statistics.median(served['yes']):.2f} s (medians)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=None, help="model cache (default BUILD/bench-models)")
    ap.add_argument("--runs", type=int, default=RUNS)
    args = ap.parse_args()
    model_dir = os.path.abspath(args.models or os.path.join(args.build, "bench-models"))
    os.makedirs(model_dir, exist_ok=True)
    b = Bench(args.build, model_dir)
    print("\n== Staging: copying a model to stage_dir against warming it where it is "
          "(issue 22) ==")
    print(f"  machine: {machine()}; load {os.getloadavg()[0]:.1f} at start")
    path = b.model(*MODEL)
    size = os.path.getsize(path)
    tmp = tempfile.mkdtemp(prefix="wcache-stage-", dir=os.path.dirname(path))

    def evict_local(p):
        return b.cache("evict", p)["resident_after"] <= size // 100
    try:
        part(b, "local", path, size, args.runs, evict_local, tmp)
        os.environ.setdefault("WCACHE_BUILD", os.path.abspath(args.build))
        import remotefs
        reason = remotefs.skip_reason(os.path.abspath(args.build))
        if reason:
            print(f"  remote: skipped ({reason})")
            return
        # The backing directory holds a hard link of the model (no copy).
        backing = os.path.join(tmp, "backing")
        os.makedirs(backing)
        os.link(path, os.path.join(backing, os.path.basename(path)))
        with remotefs.RemoteFS(backing, os.path.join(tmp, "mnt"),
                               build=os.path.abspath(args.build)) as fs:
            remote = fs.path(os.path.basename(path))

            def evict_remote(p):
                evict_local(path)
                return remotefs.drop_cache(p) == 0
            part(b, "remote (remotefs, FUSE)", remote, size, args.runs, evict_remote, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"  (load {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
