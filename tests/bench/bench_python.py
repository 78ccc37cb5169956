"""tests/bench/bench_python.py --build BUILD: the Python package's benchmark.

It lives with the other benchmarks, not in the installed package: it needs
a build tree (mkmodel, wcached, bench_load) and torch, which no user of the
package has reason to ship. The package it measures is the one Python
imports: run.sh puts this tree's client/python first on PYTHONPATH.

On a checkpoint of about 1 GiB (BF16, llama-like shapes, written by the
build's ``mkmodel``), with every file in the page cache, it times the
alternatives side by side in one run:

- ``wcache.safe_open`` of a model wcached serves (daemon up and warm): a
  full state dict of torch tensors;
- ``wcache.open_file`` of the same file in this process (no daemon);
- ``torch.load`` of the equivalent ``.pt`` (``torch.save`` of the same
  tensors).

Each is timed to "state dict ready" and to "state dict ready and every
page read once" (zero-copy loading defers the reads to first use, so the
second figure is the fair one for a worker's first request). The median of
--repeat runs is shown.

Then memory: --workers pre-forked workers (forked from one parent that has
imported torch and wcache), each attaching the model through wcached and
reading every page, and the sum of their PSS next to the model size; the
same with torch.load in each worker; and a baseline of workers that load
nothing, whose PSS is subtracted to get what the model costs.

Prints ratios and PASS/MISS against the issue's targets (100 times faster
than torch.load, 8 workers under 1.1 times the model size); exits 0 either
way, like tests/bench/run.sh (only a broken setup fails).
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import wcache
from wcache import _lib
from wcache._pss import file_pss_kib, pss_kib

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from wcached import Wcached, build_binary  # noqa: E402 (path set just above)

GiB = 1 << 30
MiB = 1 << 20


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def read_all(path):
    """Reads path once so it is in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MiB):
            pass


def touch(state):
    """Reads one byte of every page of every tensor; returns a checksum."""
    total = 0
    for t in state.values():
        if t.numel():
            total += int(t.reshape(-1).view(torch.uint8)[::4096].sum())
    return total


def make_model(build, directory, size, hidden, ffn, vocab):
    path = os.path.join(directory, f"py-bench-{hidden}x{ffn}.safetensors")
    stamp = path + ".json"
    want = {"size": size, "hidden": hidden, "ffn": ffn, "vocab": vocab}
    try:
        with open(stamp) as f:
            if json.load(f) == want and os.path.exists(path):
                return path
    except (OSError, ValueError):
        pass
    log(f"writing {path} (mkmodel, {size / GiB:.2f} GiB)")
    subprocess.run([os.path.join(build, "bin", "mkmodel"), "--hidden", str(hidden), "--ffn",
                    str(ffn), "--vocab", str(vocab), "--min-bytes", str(size), path],
                   check=True, stdout=subprocess.DEVNULL)
    with open(stamp, "w") as f:
        json.dump(want, f)
    return path


def make_pt(model, pt):
    if os.path.exists(pt) and os.path.getmtime(pt) >= os.path.getmtime(model):
        return pt
    log(f"writing {pt} (torch.save of the same tensors)")
    with wcache.open_file(model) as m:
        torch.save({k: m.torch(k) for k in m.keys()}, pt + ".tmp")
    os.replace(pt + ".tmp", pt)
    return pt


def start_daemon(build, models, tmp):
    """A running wcached on sockets in tmp serving models {name: path}."""
    return Wcached(tmp, models, log_level="info",
                   wcached=build_binary("wcached", build)).start()


def load_safe_open(model):
    with wcache.safe_open(model, framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
        source = f.model.source
    return state, source


def load_open_file(model):
    with wcache.open_file(model) as m:
        return {k: m.torch(k) for k in m.keys()}, m.source


def load_torch(pt):
    return torch.load(pt, map_location="cpu", weights_only=True), "torch.load"


def timed(fn, arg, repeat):
    """Median seconds to the state dict and to state dict + pages read."""
    ready, touched, source = [], [], None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        state, source = fn(arg)
        t1 = time.perf_counter()
        touch(state)
        t2 = time.perf_counter()
        ready.append(t1 - t0)
        touched.append(t2 - t0)
        del state
    return statistics.median(ready), statistics.median(touched), source


def forked_pss(n, loader, arg, model):
    """Forks n workers that each load (loader(arg)) and read every page,
    then returns (summed PSS, summed PSS of the model file's mappings) in
    bytes, measured while all n are alive."""
    kids = []
    for _ in range(n):
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(ready_r)
                os.close(go_w)
                state = loader(arg)[0] if loader else {}
                touch(state)
                os.write(ready_w, b"r")
                os.read(go_r, 1)
            except BaseException as e:
                print(f"bench: worker: {e!r}", file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        os.close(ready_w)
        os.close(go_r)
        kids.append((pid, ready_r, go_w))
    try:
        for pid, r, _ in kids:
            if os.read(r, 1) != b"r":
                raise SystemExit(f"bench: worker {pid} failed")
        pss = sum(pss_kib(pid) for pid, _, _ in kids) * 1024
        fpss = sum(file_pss_kib(pid, model) for pid, _, _ in kids) * 1024
    finally:
        for pid, r, w in kids:
            os.close(w)
            os.close(r)
        for pid, _, _ in kids:
            os.waitpid(pid, 0)
    return pss, fpss


# --- per-tensor cost (issue 10) ----------------------------------------------
#
# safe_open + keys() + get_tensor() of every tensor of a model wcached serves,
# against torch's own floor for making as many tensors: one unbind() of one
# buffer into N views. Models: mkmodel with tiny hidden sizes (9 tensors a
# layer), 1,000 / 50,000 / 200,000 tensors. "fresh" runs each measurement in
# a new process (imports done, nothing else: what a worker's first load
# costs); "repeated" alternates both in one process and keeps the best. Times
# are CPU time of the process (time.process_time), which other processes on a
# busy machine do not inflate; wall time is printed too. The C path:
# bench_load's attach (wc_attach + wc_model_tensor of every tensor).

PER_TENSOR_COUNTS = (1000, 50000, 200000)
PER_TENSOR_TARGET = 2.5
PER_TENSOR_TARGET_FROM = 50000  # tensors


def _floor(n):
    """Seconds (cpu, wall) for torch to make n tensor views in bulk."""
    buf = torch.empty(n * 16, dtype=torch.uint8)
    c0, w0 = time.process_time(), time.perf_counter()
    views = buf.view(n, 16).unbind(0)
    c1, w1 = time.process_time(), time.perf_counter()
    assert len(views) == n
    return c1 - c0, w1 - w0


def _wcache_all(name):
    """Seconds (cpu, wall) for safe_open + keys + get_tensor of every tensor."""
    c0, w0 = time.process_time(), time.perf_counter()
    with wcache.safe_open(name, framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
        source = f.model.source
    c1, w1 = time.process_time(), time.perf_counter()
    if source != "wcached":
        raise SystemExit(f"bench: {name} was not attached through wcached")
    return c1 - c0, w1 - w0, len(state)


def _child(kind, arg):
    """bench_python.py --child KIND ARG: one fresh measurement."""
    gc.collect()
    if kind == "floor":
        c, w = _floor(int(arg))
        n = int(arg)
    else:
        c, w, n = _wcache_all(arg)
    print(json.dumps({"cpu": c, "wall": w, "n": n}))
    return 0


def _fresh(kind, arg, env):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, str(arg)],
                       env=env, check=True, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def per_tensor(build, directory, repeat):
    """Prints the per-tensor table with ratios and PASS/MISS."""
    mkmodel = os.path.join(build, "bin", "mkmodel")
    models = {}
    for n in PER_TENSOR_COUNTS:
        path = os.path.join(directory, f"py-tensors-{n}.safetensors")
        if not os.path.exists(path):
            log(f"writing {path} (mkmodel, about {n} tensors)")
            subprocess.run([mkmodel, "--layers", str(max(1, n // 9)), "--hidden", "8", "--ffn",
                            "16", "--vocab", "16", path + ".tmp"], check=True,
                           stdout=subprocess.DEVNULL)
            os.replace(path + ".tmp", path)
        models[n] = path
    rows = []
    with tempfile.TemporaryDirectory(prefix="wcache-bench.") as tmp:
        daemon = start_daemon(build, {f"t{n}": path for n, path in models.items()}, tmp)
        # Fresh processes find wcache's bytecode compiled, as an installed
        # package has it (python3-wcache compiles it at install), even where
        # PYTHONDONTWRITEBYTECODE is set: one untimed run writes it.
        env = dict(os.environ, WCACHE_SOCKET=daemon.socket,
                   PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["WCACHE_SOCKET"] = daemon.socket
        try:
            _fresh("wcache", f"t{PER_TENSOR_COUNTS[0]}", env)
            for n, path in models.items():
                name = f"t{n}"
                fresh_w = [_fresh("wcache", name, env) for _ in range(3)]
                fresh_f = [_fresh("floor", fresh_w[0]["n"], env) for _ in range(3)]
                ntensors = fresh_w[0]["n"]
                rep_w, rep_f = [], []
                for _ in range(repeat):
                    gc.collect()
                    rep_f.append(_floor(ntensors))
                    gc.collect()
                    rep_w.append(_wcache_all(name)[:2])
                c = subprocess.run([os.path.join(build, "bin", "bench_load"), "run", "attach",
                                    path, "--socket", daemon.socket, "--model", name,
                                    "--no-touch"], check=True, capture_output=True, text=True)
                cpath = json.loads(c.stdout.strip().splitlines()[-1])
                rows.append((ntensors,
                             statistics.median(x["cpu"] for x in fresh_w),
                             statistics.median(x["cpu"] for x in fresh_f),
                             min(x[0] for x in rep_w), min(x[0] for x in rep_f),
                             statistics.median(x["wall"] for x in fresh_w),
                             statistics.median(x["wall"] for x in fresh_f), cpath))
        finally:
            daemon.stop()
    print()
    print(f"per-tensor cost: safe_open + keys() + get_tensor() of every tensor through "
          f"wcached, against torch {torch.__version__}'s floor (one unbind() into as many "
          f"views); CPU time, us per tensor; fresh = median of 3 new processes, repeated = "
          f"best of {repeat} in one process")
    print(f"{'tensors':>9}{'fresh wcache':>14}{'floor':>8}{'ratio':>7}{'repeated':>10}"
          f"{'floor':>8}{'ratio':>7}{'C attach+all':>14}  target <= {PER_TENSOR_TARGET}x (fresh "
          f"and repeated) from {PER_TENSOR_TARGET_FROM:,} tensors")
    for n, fw, ff, rw, rf, ww, wf, cpath in rows:
        c_us = cpath["addressable_cpu_s"] * 1e6 / n
        worst = max(fw / ff, rw / rf)
        # The target is for large models (issue 10: 50,000 and 200,000
        # tensors); at 1,000 the fixed cost of a first call dominates.
        verdict = "(no target)" if n < PER_TENSOR_TARGET_FROM else \
            "PASS" if worst <= PER_TENSOR_TARGET else "MISS"
        print(f"{n:>9}{fw * 1e6 / n:>14.2f}{ff * 1e6 / n:>8.2f}{fw / ff:>7.2f}"
              f"{rw * 1e6 / n:>10.2f}{rf * 1e6 / n:>8.2f}{rw / rf:>7.2f}{c_us:>14.3f}  "
              f"{verdict} (wall, fresh: {ww * 1e6 / n:.2f} vs {wf * 1e6 / n:.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="build directory (bin/mkmodel, "
                    "bin/wcached, lib/libwcache.so.0)")
    ap.add_argument("--dir", help="where to keep the model files (default BUILD/bench-python)")
    ap.add_argument("--size", type=float, default=1.0, help="model size in GiB")
    ap.add_argument("--hidden", type=int, default=2048,
                    help="mkmodel --hidden (2048, --ffn 5632: 75 tensors per GiB; "
                         "640 and 1792: about 1,000)")
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-torch-pss", action="store_true",
                    help="skip the torch.load workers (they need workers x size of memory)")
    ap.add_argument("--per-tensor-only", action="store_true",
                    help="only the per-tensor cost at 1,000 / 50,000 / 200,000 tensors")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(*args.child)
    build = os.path.abspath(args.build)
    os.environ.setdefault("WCACHE_LIB", os.path.join(build, "lib", "libwcache.so.0"))
    directory = os.path.abspath(args.dir or os.path.join(build, "bench-python"))
    os.makedirs(directory, exist_ok=True)
    torch.set_num_threads(1)
    if args.per_tensor_only:
        per_tensor(build, directory, args.repeat)
        return 0

    model = make_model(build, directory, int(args.size * GiB), args.hidden, args.ffn, args.vocab)
    pt = make_pt(model, model[:-len(".safetensors")] + ".pt")
    size = os.path.getsize(model)
    read_all(model)
    read_all(pt)

    with tempfile.TemporaryDirectory(prefix="wcache-bench.") as tmp:
        daemon = start_daemon(build, {"bench": model}, tmp)
        os.environ["WCACHE_SOCKET"] = daemon.socket
        try:
            # warm: the daemon has validated and mapped it; every page resident
            state, source = load_safe_open(model)
            if source != "wcached":
                raise SystemExit("bench: safe_open did not attach through wcached")
            ref = load_torch(pt)[0]
            assert sorted(state) == sorted(ref)
            for k in ref:  # the three loaders agree
                assert torch.equal(state[k], ref[k]), k
            ntensors = len(ref)
            del state, ref
            gc.collect()

            results = [("wcache.safe_open (wcached)",) + timed(load_safe_open, model,
                                                                args.repeat),
                       ("wcache.open_file (in-process)",) + timed(load_open_file, model,
                                                                   args.repeat),
                       ("torch.load (.pt)",) + timed(load_torch, pt, args.repeat)]

            base_pss, _ = forked_pss(args.workers, None, None, model)
            wc_pss, wc_fpss = forked_pss(args.workers, load_safe_open, model, model)
            tl_pss = None
            if not args.no_torch_pss:
                tl_pss, _ = forked_pss(args.workers, load_torch, pt, model)
            daemon_fpss = file_pss_kib(daemon.proc.pid, model) * 1024
        finally:
            daemon.stop()

    print(f"model: {model}: {size / GiB:.3f} GiB, {ntensors} tensors (BF16), in page cache")
    cow = "wc_model_cow" if getattr(_lib.lib(), "wc_model_cow", None) \
        else "private remap (no wc_model_cow)"
    print(f"torch {torch.__version__}, libwcache {wcache.library_path()}, median of "
          f"{args.repeat}; torch copy-on-write through {cow}")
    print(f"{'loader':<32}{'state dict':>14}{'+ every page':>16}")
    for name, ready, touched, _src in results:
        print(f"{name:<32}{ready * 1e3:>11.3f} ms{touched * 1e3:>13.3f} ms")
    tl = results[2]
    for name, ready, touched, _src in results[:2]:
        print(f"torch.load / {name}: {tl[1] / ready:,.0f}x to the state dict, "
              f"{tl[2] / touched:,.1f}x with every page read")
    speedup = tl[1] / results[0][1]
    print(f"target: safe_open (wcached) >= 100x faster than torch.load to the state dict: "
          f"{speedup:,.0f}x {'PASS' if speedup >= 100 else 'MISS'}")
    n = args.workers
    print(f"{n} pre-forked workers, every page read (summed PSS; baseline = {n} workers "
          f"that load nothing: {base_pss / MiB:.1f} MiB):")
    wc_extra = wc_pss - base_pss
    print(f"  wcache.safe_open: {wc_pss / MiB:,.1f} MiB, {wc_extra / MiB:,.1f} MiB over "
          f"baseline = {wc_extra / size:.3f} x model size; the model file's mappings "
          f"{wc_fpss / MiB:,.1f} MiB = {wc_fpss / size:.3f} x (wcached's own mapping holds "
          f"{daemon_fpss / MiB:,.1f} MiB more)")
    print(f"target: {n} workers under 1.1 x model size: {wc_extra / size:.3f} x "
          f"{'PASS' if wc_extra / size < 1.1 else 'MISS'}")
    if tl_pss is not None:
        tl_extra = tl_pss - base_pss
        print(f"  torch.load:       {tl_pss / MiB:,.1f} MiB, {tl_extra / MiB:,.1f} MiB over "
              f"baseline = {tl_extra / size:.3f} x model size")
    per_tensor(build, directory, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
