#!/usr/bin/python3
"""The cold-read benchmark of `make bench` (issue 13): what the device can
deliver against what wcached's warm-up gets, on the same file, in one run.

The file (a ~2 GiB model made with mkmodel, cached in <build>/bench-models)
is evicted from the page cache before every run with posix_fadvise(DONTNEED)
on that file alone (bench_load evict, checked with mincore; the machine's
other caches are never dropped). Then, interleaved, RUNS times each:

  fio        sequential direct-I/O reads (O_DIRECT: the page cache is not
             involved), io_uring and libaio, 1 and 8 MiB blocks, queue depth
             4 and 16, 1 and 2 jobs (each job its half of the file); the
             best of all is "the device's best";
  cat        cat FILE > /dev/null
  dd         dd if=FILE of=/dev/null bs=8M
  vmtouch    vmtouch -qt FILE
  wcached    the daemon's warm-up of the file as a model (warm = yes): its
             own "generation N warm: B bytes in S s" log line.

Prints MB/s (10^6 bytes per second) for each, best and median, the ratio of
the warm-up to fio's best (target >= 0.9x) with PASS or MISS, and the load
average. A missing fio or vmtouch is reported and its row skipped. Never
fails because of a missed target.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Bench, fs_type, machine  # noqa: E402

RUNS = 3
MODEL = ("cold-2g", ["--layers", "24", "--hidden", "2048", "--ffn", "5632", "--vocab", "32000",
                     "--min-bytes", str(2 << 30)])
FIO_GRID = [
    # ioengine, block size, iodepth, jobs
    ("io_uring", "8M", 4, 1),
    ("io_uring", "8M", 16, 1),
    ("io_uring", "1M", 16, 1),
    ("io_uring", "8M", 8, 2),
    ("libaio", "8M", 16, 1),
    ("libaio", "1M", 16, 2),
    ("io_uring", "4M", 32, 2),
]


def load():
    return f"load {os.getloadavg()[0]:.1f}"


def evict(b, path, size):
    e = b.cache("evict", path)
    return e["resident_after"] <= size // 100


def fio(path, size, engine, bs, depth, jobs):
    """One fio run; returns bytes per second. Each job reads its share of
    the file, aligned to 8 MiB as O_DIRECT needs."""
    share = size // jobs // (8 << 20) * (8 << 20)
    cmd = ["fio", "--name=seq", f"--filename={path}", "--readonly", "--rw=read",
           f"--bs={bs}", "--direct=1", f"--ioengine={engine}", f"--iodepth={depth}",
           f"--numjobs={jobs}", f"--size={share}", f"--offset_increment={share}",
           "--group_reporting", "--output-format=json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    data = json.loads(p.stdout[p.stdout.index("{"):])
    job = data["jobs"][0]["read"]
    return job["bw_bytes"] if job.get("bw_bytes") else job["bw"] * 1024


def timed(cmd):
    t0 = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=None, help="model cache (default BUILD/bench-models)")
    ap.add_argument("--runs", type=int, default=RUNS)
    args = ap.parse_args()
    model_dir = os.path.abspath(args.models or os.path.join(args.build, "bench-models"))
    os.makedirs(model_dir, exist_ok=True)
    b = Bench(args.build, model_dir)
    print("\n== Cold reads: the device's best (fio, direct I/O) against wcached's warm-up "
          "(issue 13) ==")
    print(f"  machine: {machine()}; {load()} at start")
    path = b.model(*MODEL)
    size = os.path.getsize(path)
    print(f"  file {path} ({fs_type(path)}), {size / 1e9:.2f} GB; evicted with "
          f"posix_fadvise(DONTNEED) before every run; {args.runs} runs each, interleaved")
    have_fio, have_vmtouch = shutil.which("fio"), shutil.which("vmtouch")
    res = {"fio": [], "cat": [], "dd bs=8M": [], "vmtouch -t": [], "wcached warm-up": []}
    fio_best = {}
    tmp = tempfile.mkdtemp(prefix="wcache-cold-")
    try:
        for _ in range(args.runs):
            if have_fio:
                for cfg in FIO_GRID:
                    bw = fio(path, size, *cfg)
                    if bw is not None:
                        fio_best[cfg] = max(fio_best.get(cfg, 0), bw)
                        res["fio"].append(bw)
            for name, cmd in (("cat", ["cat", path]),
                              ("dd bs=8M", ["dd", f"if={path}", "of=/dev/null", "bs=8M"]),
                              ("vmtouch -t", ["vmtouch", "-qt", path])):
                if name == "vmtouch -t" and not have_vmtouch:
                    continue
                if not evict(b, path, size):
                    raise SystemExit(f"bench: cannot evict {path} on {fs_type(path)}")
                res[name].append(size / timed(cmd))
            if not evict(b, path, size):
                raise SystemExit(f"bench: cannot evict {path} on {fs_type(path)}")
            w = b.warm_up(tmp, path)
            res["wcached warm-up"].append(w["bytes"] / w["logged_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"  {'reader':<18} {'best MB/s':>10} {'median MB/s':>12}  runs")
    for name, v in res.items():
        if not v:
            print(f"  {name:<18} {'skipped (not installed)':>24}")
            continue
        print(f"  {name:<18} {max(v) / 1e6:>10.0f} {statistics.median(v) / 1e6:>12.0f}  "
              f"{len(v)}")
    if fio_best:
        print("  fio by configuration (best MB/s): " + "; ".join(
            f"{e} bs={bs} qd={d} jobs={j}: {bw / 1e6:.0f}"
            for (e, bs, d, j), bw in fio_best.items()))
    print(f"  ({load()} at the end)")
    if res["fio"] and res["wcached warm-up"]:
        best, warm = max(res["fio"]), max(res["wcached warm-up"])
        ok = warm >= 0.9 * best
        print(f"\n  {'PASS' if ok else 'MISS'}  cold warm-up >= 0.9x fio's best sequential "
              f"read: {warm / best:.2f}x ({warm / 1e6:.0f} vs {best / 1e6:.0f} MB/s, best of "
              f"{args.runs}; medians {statistics.median(res['wcached warm-up']) / 1e6:.0f} vs "
              f"{statistics.median(res['fio']) / 1e6:.0f}; {load()})")


if __name__ == "__main__":
    main()
