#!/usr/bin/python3
"""The loading benchmark of `make bench` (issue 3), and its summary.

Runs, side by side in one run, on a ~1.2 GiB model of ~1,000 tensors and a
~1.2 GiB model of ~50,000 tensors (both made with mkmodel and cached in
<build>/bench-models):

  warm page cache, each variant in fresh processes (bench_load run):
    (a) read    the traditional loader: read() every tensor into its own
                malloc'd buffer (header parsed with jansson)
    (b) open    wc_open_file(): map and validate in-process
    (c) attach  wc_attach() through a real wcached this script starts on a
                socket in a temporary directory (tests/pyutil/wcached.py)
    mmap        bare open + mmap + touch of the file: the floor for touching
  time until every tensor is addressable, until every page is touched, peak
  RSS; then 8 workers holding the model at once and their summed PSS.

  cold page cache: the file evicted with posix_fadvise(DONTNEED) (checked
  with mincore), then `cat FILE > /dev/null` against wcached's warm-up
  (warm = yes; figures from its "generation N warm: B bytes in S s" line).

Prints absolute figures, ratios, and each target with PASS or MISS. It
never fails because a target is missed (exit 0); only a broken setup (a
missing binary, a daemon that does not start) is an error.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from wcached import Wcached, build_binary  # noqa: E402 (path set just above)

RUNS_WARM = 5     # fresh processes per variant, warm page cache
RUNS_READ = 3     # for (a), which takes seconds
RUNS_COLD = 3     # cold runs of cat and of the daemon's warm-up, each
WORKERS = 8
REPEAT = 50       # repeated open/attach calls inside one process
MODELS = [
    # name, mkmodel arguments, description
    ("load-1k", ["--layers", "111", "--hidden", "640", "--ffn", "1792", "--vocab", "32000"],
     "~1,000 tensors"),
    ("load-50k", ["--layers", "5555", "--hidden", "96", "--ffn", "256", "--vocab", "1000"],
     "~50,000 tensors"),
]
GIB = 1 << 30
MIB = 1 << 20


def mib(n):
    return n / MIB


def fmt_t(s):
    """Seconds as a short human figure."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def verdict(ok):
    return "PASS" if ok else "MISS"


class Bench:
    def __init__(self, build, model_dir):
        self.build = os.path.abspath(build)
        self.model_dir = model_dir
        self.targets = []  # (description, figure, PASS/MISS)

    def binary(self, name):
        return build_binary(name, self.build)

    def target(self, what, figure, ok):
        """Records a target for the summary; ok None means not measurable here."""
        self.targets.append((what, figure, verdict(ok) if ok is not None else "N/A"))

    # ---- models ----

    def model(self, name, args):
        """Path of a cached model; made with mkmodel when missing or invalid."""
        path = os.path.join(self.model_dir, name + ".safetensors")
        stamp = path + ".args"
        want = " ".join(args)
        ok = os.path.exists(path) and os.path.exists(stamp)
        if ok:
            with open(stamp) as f:
                ok = f.read() == want
        if ok:
            ok = subprocess.run([self.binary("wcachectl"), "inspect", path],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                                ).returncode == 0
        if not ok:
            t0 = time.monotonic()
            subprocess.run([self.binary("mkmodel"), *args, path], check=True,
                           stdout=subprocess.DEVNULL)
            with open(stamp, "w") as f:
                f.write(want)
            print(f"  generated {path} in {time.monotonic() - t0:.1f} s")
        return path

    # ---- bench_load ----

    def bench_load(self, *args):
        """Runs bench_load with args; returns its JSON line as a dict."""
        cmd = [self.binary("bench_load"), *args]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
        return json.loads(p.stdout)

    def run(self, variant, path, sock=None, name=None, repeat=0):
        args = ["run", variant, path]
        if variant == "attach":
            args += ["--socket", sock, "--model", name]
        if repeat:
            args += ["--repeat", str(repeat)]
        return self.bench_load(*args)

    def cache(self, what, path):
        return self.bench_load(what, path)

    # ---- the daemon ----

    def start_daemon(self, tmp, models, warm=True, pin="metadata"):
        """A running wcached on sockets in tmp serving models {name: path}."""
        keys = {"pin": pin, "warm": "yes" if warm else "no"}
        return Wcached(tmp, {name: (path, keys) for name, path in models.items()},
                       log_level="info", wcached=self.binary("wcached")).start()

    # ---- the parts ----

    def warm_variants(self, path, name, sock, size):
        """(a), (b), (c) and bare mmap in fresh processes, interleaved: times
        are the best run (least disturbed by other processes), memory the
        median."""
        res = {v: [] for v in ("mmap", "read", "open", "attach")}
        for i in range(RUNS_WARM):
            for v in res:
                if v == "read" and i >= RUNS_READ:
                    continue
                res[v].append(self.run(v, path, sock, name,
                                       REPEAT if v in ("open", "attach") else 0))
        agg = {}
        for v, runs in res.items():
            agg[v] = {}
            for k, x in runs[0].items():
                if not isinstance(x, (int, float)):
                    continue
                vals = [r[k] for r in runs]
                agg[v][k] = min(vals) if k.endswith("_s") else statistics.median(vals)
            agg[v]["runs"] = len(runs)
        a, b, c, m = agg["read"], agg["open"], agg["attach"], agg["mmap"]
        print(f"\n  warm page cache, fresh process per run, interleaved; times: best of "
              f"{RUNS_WARM} ((a): {RUNS_READ}); memory: median, MiB; load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"  {'':<27} {'load call':>10} {'dict ready':>12} {'touch':>9} "
              f"{'every page':>12} {'x mmap':>7} {'cpu':>9} {'x mmap':>7} "
              f"{'peakRSS@addr':>13} {'peakRSS':>8} {'anon':>7}")
        rows = [("(a) read() into malloc", a), ("(b) wc_open_file", b),
                ("(c) wc_attach via wcached", c), ("bare mmap + touch", m)]
        for label, r in rows:
            print(f"  {label:<27} {fmt_t(r['call_s']):>10} {fmt_t(r['addressable_s']):>12} "
                  f"{fmt_t(r['touch_s']):>9} {fmt_t(r['touched_s']):>12} "
                  f"{r['touched_s'] / m['touched_s']:>6.2f}x "
                  f"{fmt_t(r['touched_cpu_s']):>9} "
                  f"{r['touched_cpu_s'] / m['touched_cpu_s']:>6.2f}x "
                  f"{r['hwm_addressable_kib'] / 1024:>13.1f} {r['hwm_kib'] / 1024:>8.1f} "
                  f"{r['rss_anon_kib'] / 1024:>7.1f}")
        print("  (load call: the loading call; dict ready: state dict ready, + one pointer "
              "per tensor; every page: every page read, + one byte of every page; cpu: every "
              "page read, in CPU time)")
        print(f"  (a): header parse (read + jansson) {fmt_t(a['parse_s'])}, then "
              f"{a['tensors']:.0f} mallocs + preads of {mib(a['bytes']):.0f} MiB")
        print(f"  (c): wc_connect {fmt_t(c['connect_s'])} + wc_attach "
              f"{fmt_t(c['call_s'] - c['connect_s'])} (cpu {fmt_t(c['call_cpu_s'])}); then "
              f"wc_model_tensor x {c['tensors']:.0f} "
              f"{fmt_t(c['addressable_s'] - c['call_s'])}")
        print(f"  same process, repeated (best / median of {REPEAT}): wc_open_file "
              f"{fmt_t(b['repeat_best_s'])} / {fmt_t(b['repeat_median_s'])}, wc_attach "
              f"{fmt_t(c['repeat_best_s'])} / {fmt_t(c['repeat_median_s'])}")
        for label, r in (("(b) wc_open_file", b), ("(c) wc_attach", c)):
            print(f"  same process, repeated, {label} (best / median of "
                  f"{r['repeats_full']:.0f}): state dict ready "
                  f"{fmt_t(r['repeat_ready_best_s'])} / {fmt_t(r['repeat_ready_median_s'])}, "
                  f"every page read {fmt_t(r['repeat_read_best_s'])} / "
                  f"{fmt_t(r['repeat_read_median_s'])}")
        print(f"  ratios: addressable (a)/(c) {a['addressable_s'] / c['addressable_s']:.0f}x, "
              f"(b)/(c) {b['addressable_s'] / c['addressable_s']:.1f}x; load call (b)/(c) "
              f"{b['call_s'] / c['call_s']:.1f}x in a fresh process, "
              f"{b['repeat_best_s'] / c['repeat_best_s']:.0f}x repeated")
        return agg

    def workers(self, variant, path, sock, name):
        """WORKERS processes holding the model at once; their PSS."""
        cmd = [self.binary("bench_load"), "run", variant, path, "--hold"]
        if variant == "attach":
            cmd += ["--socket", sock, "--model", name]
        total = {"Pss": 0, "Rss": 0, "Pss_Anon": 0, "Pss_File": 0, "Pss_Shmem": 0,
                 "FilePmdMapped": 0}
        t0 = time.monotonic()
        procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True) for _ in range(WORKERS)]
        try:
            for p in procs:
                line = p.stdout.readline()
                if not line:
                    raise SystemExit(f"bench: worker {p.pid} failed ({p.wait()})")
            wall = time.monotonic() - t0
            for p in procs:
                roll = smaps_rollup(p.pid)
                for k in total:
                    total[k] += roll.get(k, 0) * 1024
        finally:
            for p in procs:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            for p in procs:
                p.wait()
                p.stdout.close()
        total["wall_s"] = wall
        return total

    def warm_up(self, tmp, path):
        """wcached's warm-up of path as a model (warm = yes), from its log:
        bytes, logged seconds, seconds from the load line and from start."""
        d = self.start_daemon(tmp, {"cold": path}, warm=True, pin="none")
        try:
            loaded = d.wait_for_log(r'generation \d+ from ', 300)
            line = d.wait_for_log(r'generation \d+ warm: ', 300)
        finally:
            status = d.stop()
        if status != 0:
            raise SystemExit(f"bench: wcached exited with {status}:\n{d.read_log()}")
        m = re.search(r'warm: (\d+) bytes in ([0-9.]+) s', line[1])
        return {"bytes": int(m.group(1)), "logged_s": float(m.group(2)),
                "observed_s": line[0] - loaded[0], "from_start_s": line[0] - d.started}

    def cold(self, path, size, tmp):
        """cat against wcached's warm-up on the evicted file, RUNS_COLD times each."""
        cat, warm = [], []
        evicted_ok = True
        for i in range(RUNS_COLD):
            e = self.cache("evict", path)
            if e["resident_after"] > size // 100:
                evicted_ok = False
            t0 = time.monotonic()
            subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
            cat.append(time.monotonic() - t0)

            e = self.cache("evict", path)
            if e["resident_after"] > size // 100:
                evicted_ok = False
            warm.append(self.warm_up(tmp, path))
            if i == 0:
                after = self.cache("resident", path)
                warm[-1]["resident_after"] = after["resident_after"]
        return cat, warm, evicted_ok


def smaps_rollup(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                out[parts[0][:-1]] = int(parts[1])
    return out


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    return f"{os.cpu_count()} CPUs ({cpu}), {mem / GIB:.0f} GiB RAM, Linux {os.uname().release}"


def fs_type(path):
    out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def warm_part(b, paths, tmp):
    """Warm page cache: (a), (b), (c) and bare mmap, then 8 workers at once."""
    # One daemon serves both models. The files are evicted first so that the
    # page cache holds them as wcached's warm-up leaves them, whatever wrote
    # or read them before: touching a mapping costs up to 10x more when the
    # cache holds small folios (as after writing the file) than when it holds
    # the large ones sequential reads make, which can be mapped 2 MiB at a time.
    for p in paths.values():
        b.cache("evict", p)
    d = b.start_daemon(tmp, paths, warm=True, pin="metadata")
    try:
        for name in paths:
            d.wait_for_log(rf'model "{re.escape(name)}": generation \d+ warm: ', 300)
        print("  page cache filled by wcached's own warm-up, after evicting the files")
        for name, mk, what in MODELS:
            path = paths[name]
            size = os.path.getsize(path)
            res = b.cache("resident", path)
            print(f"\n-- {name}: {what}, {mib(size):.0f} MiB ({size / GIB:.2f} GiB); "
                  f"page cache holds {100 * res['resident_after'] / size:.0f}% of it")
            med = b.warm_variants(path, name, d.socket, size)
            bb, c, m = med["open"], med["attach"], med["mmap"]
            first = f"connect + attach, first call in a fresh process, best of {RUNS_WARM}"
            if name == "load-50k":
                b.target(f"(c) wc_attach < 1 ms ({name}; {first})", fmt_t(c["call_s"]),
                         c["call_s"] < 1e-3)
                b.target(f"(c) attach >= 10x faster than (b) wc_open_file ({name}; "
                         f"{first})", f"{bb['call_s'] / c['call_s']:.0f}x "
                         f"({fmt_t(c['call_s'])} vs {fmt_t(bb['call_s'])})",
                         bb["call_s"] / c["call_s"] >= 10)
            else:
                b.target(f"(c) wc_attach < 1 ms ({name}; {first})", fmt_t(c["call_s"]),
                         c["call_s"] < 1e-3)
            ratio = c["touched_s"] / m["touched_s"]
            cpu_ratio = c["touched_cpu_s"] / m["touched_cpu_s"]
            b.target(f"(c) attach + every tensor's pointer + touch every page <= 1.2x "
                     f"bare mmap + touch ({name})",
                     f"{ratio:.2f}x ({fmt_t(c['touched_s'])} vs {fmt_t(m['touched_s'])}; "
                     f"touch pass alone {c['touch_s'] / m['touch_s']:.2f}x; CPU time "
                     f"{cpu_ratio:.2f}x)", ratio <= 1.2)

            print(f"\n  {WORKERS} workers holding the model at once "
                  f"(summed /proc/PID/smaps_rollup; model {mib(size):.0f} MiB)")
            print(f"  {'variant':<28} {'sum PSS':>10} {'x model':>8} {'PSS anon':>9} "
                  f"{'PSS file':>9} {'PSS shmem':>9} {'sum RSS':>9} {'2M-mapped':>9} "
                  f"{'all ready':>10}")
            need = WORKERS * size * 1.2 + 2 * GIB
            for v, label in (("attach", "(c) wc_attach via wcached"),
                             ("open", "(b) wc_open_file"),
                             ("read", "(a) read() into malloc")):
                if v == "read" and mem_available() < need:
                    print(f"  {label:<28} skipped: needs {need / GIB:.1f} GiB free, "
                          f"{mem_available() / GIB:.1f} available")
                    continue
                t = b.workers(v, path, d.socket, name)
                print(f"  {label:<28} {mib(t['Pss']):>10.1f} {t['Pss'] / size:>7.2f}x "
                      f"{mib(t['Pss_Anon']):>9.1f} {mib(t['Pss_File']):>9.1f} "
                      f"{mib(t['Pss_Shmem']):>9.1f} {mib(t['Rss']):>9.0f} "
                      f"{100 * t['FilePmdMapped'] / max(t['Rss'], 1):>8.0f}% "
                      f"{fmt_t(t['wall_s']):>10}")
                if v == "attach":
                    b.target(f"{WORKERS} workers via (c): summed PSS < 1.1x model ({name})",
                             f"{t['Pss'] / size:.3f}x", t["Pss"] < 1.1 * size)
            print("  (2M-mapped: share of the RSS mapped by 2 MiB page-table entries; "
                  "all ready: from spawning the workers until all hold the model, every "
                  "page touched)")
            dp = smaps_rollup(d.proc.pid)
            print(f"  (wcached itself: PSS {dp.get('Pss', 0) / 1024:.1f} MiB, "
                  f"RSS {dp.get('Rss', 0) / 1024:.1f} MiB)")
    finally:
        status = d.stop()
    if status != 0:
        raise SystemExit(f"bench: wcached exited with {status}:\n{d.read_log()}")


def cold_part(b, paths, tmp):
    """Cold page cache: cat against wcached's warm-up on the evicted file."""
    print(f"\n-- cold page cache: evicted with posix_fadvise(DONTNEED) before every "
          f"run (checked with mincore); {RUNS_COLD} runs each, interleaved; "
          f"best (median)")
    print(f"  {'model':<9} {'cat':>17} {'cat MB/s':>9} {'wcached warm-up':>18} "
          f"{'warm MB/s':>10} {'x cat':>6} {'load->warm line':>16} "
          f"{'start->warm line':>17}")
    for name, mk, what in MODELS:
        path = paths[name]
        size = os.path.getsize(path)
        cat, warm, ok = b.cold(path, size, tmp)
        if not ok:
            print(f"  {name:<9} the filesystem ({fs_type(path)}) did not drop the "
                  f"file's pages: no cold figures")
            b.target(f"cold warm-up >= 0.9x cat throughput ({name})",
                     "cannot evict on " + fs_type(path), None)
            continue
        logged = [w["logged_s"] for w in warm]
        observed = [w["observed_s"] for w in warm]
        from_start = [w["from_start_s"] for w in warm]
        cat_tp = size / min(cat)
        warm_tp = warm[0]["bytes"] / min(logged)
        med_ratio = (warm[0]["bytes"] / statistics.median(logged)) / (
            size / statistics.median(cat))

        def both(x):
            return f"{fmt_t(min(x))} ({fmt_t(statistics.median(x))})"
        print(f"  {name:<9} {both(cat):>17} {cat_tp / 1e6:>9.0f} {both(logged):>18} "
              f"{warm_tp / 1e6:>10.0f} {warm_tp / cat_tp:>5.2f}x "
              f"{both(observed):>16} {both(from_start):>17}")
        print(f"  {'':<9} runs: cat {', '.join(fmt_t(x) for x in cat)}; warm-up "
              f"{', '.join(fmt_t(x) for x in logged)}; medians ratio "
              f"{med_ratio:.2f}x; resident after warm-up "
              f"{100 * warm[0]['resident_after'] / size:.0f}%")
        b.target(f"cold warm-up >= 0.9x cat throughput ({name}; wcached's logged "
                 f"time, best of {RUNS_COLD} each)",
                 f"{warm_tp / cat_tp:.2f}x ({warm_tp / 1e6:.0f} vs "
                 f"{cat_tp / 1e6:.0f} MB/s; medians {med_ratio:.2f}x)",
                 warm_tp / cat_tp >= 0.9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=None, help="model cache (default BUILD/bench-models)")
    ap.add_argument("--part", choices=("all", "warm", "cold"), default="all",
                    help="run only the warm-cache or only the cold-cache part")
    args = ap.parse_args()
    model_dir = os.path.abspath(args.models or os.path.join(args.build, "bench-models"))
    os.makedirs(model_dir, exist_ok=True)
    b = Bench(args.build, model_dir)
    start = time.monotonic()

    print("\n== Loading (issue 3) ==")
    print(f"  machine: {machine()}")
    print(f"  models in {model_dir} ({fs_type(model_dir)}); load average "
          f"{os.getloadavg()[0]:.1f} at start")
    paths = {}
    for name, mk, what in MODELS:
        paths[name] = b.model(name, mk)
    tmp = tempfile.mkdtemp(prefix="wcache-bench-")
    try:
        if args.part != "cold":
            warm_part(b, paths, tmp)
        if args.part != "warm":
            cold_part(b, paths, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n== Targets (loading; {time.monotonic() - start:.0f} s; load average "
          f"{os.getloadavg()[0]:.1f} at the end) ==")
    for what, figure, v in b.targets:
        print(f"  {v:<4}  {what}: {figure}")


if __name__ == "__main__":
    main()
