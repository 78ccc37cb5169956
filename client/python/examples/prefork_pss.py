#!/usr/bin/python3
"""What pre-fork workers cost in memory: summed PSS next to the model size,
with wcache and with torch.load.

    prefork_pss.py MODEL.safetensors [--pt MODEL.pt] [--workers 4]

Runs prefork_server.py three times with --touch (every worker reads every
page of the model before it reports ready): with --loader none (the
interpreter and torch alone, the baseline), --loader wcache and --loader
torch (a .pt with the same tensors; written next to a temporary copy when
--pt is not given). For each it sums the workers' PSS (proportional set
size: a page shared by N processes counts 1/N in each, so the sum is what
the workers really cost) from /proc/PID/smaps_rollup, checks that /infer
answers, and prints the sums next to the model's size.

With wcache the workers map the page cache: the model counts about once
for all of them (a share goes to wcached's own mapping when it serves the
model). With torch.load every worker holds its own copy.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the wcache package beside examples/

from wcache._pss import file_pss_kib, pss_kib  # noqa: E402


def run(model, loader, workers, pt=None, timeout=600):
    cmd = [sys.executable, os.path.join(HERE, "prefork_server.py"), model, "--port", "0",
           "--workers", str(workers), "--loader", loader, "--touch"]
    if pt:
        cmd += ["--pt", pt]
    # its own process group, so that nothing of it outlives this run (a worker left
    # behind would keep serving and hold our stderr open)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    ready = []
    late = threading.Event()

    def too_late():
        late.set()
        os.killpg(proc.pid, signal.SIGKILL)  # readline() below then ends

    watchdog = threading.Timer(timeout, too_late)
    watchdog.start()
    try:
        while len(ready) < workers:
            line = proc.stdout.readline()
            if late.is_set():
                raise SystemExit(f"prefork_pss: server ({loader}): workers not ready "
                                 f"in {timeout} s")
            if not line:
                raise SystemExit(f"prefork_pss: server ({loader}) exited with "
                                 f"{proc.wait()}")
            ready.append(json.loads(line))
        watchdog.cancel()
        pids = [r["worker"] for r in ready]
        pss = sum(pss_kib(p) for p in pids) * 1024
        fpss = sum(file_pss_kib(p, model) for p in pids) * 1024 if loader == "wcache" else 0
        answer = None
        if loader != "none":
            url = f"http://127.0.0.1:{ready[0]['port']}/infer?seed=1"
            with urllib.request.urlopen(url, timeout=30) as r:
                answer = json.loads(r.read())
        return {"pss": pss, "file_pss": fpss, "ready": ready, "answer": answer}
    finally:
        watchdog.cancel()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        finally:
            try:  # a worker the server failed to stop
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def write_pt(model, out):
    import torch
    import wcache
    with wcache.open_file(model) as m:
        torch.save({k: m.torch(k) for k in m.keys()}, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a safetensors file")
    ap.add_argument("--pt", help="the same tensors as a torch.save checkpoint")
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    size = os.path.getsize(args.model)
    tmp = None
    pt = args.pt
    if pt is None:
        tmp = tempfile.TemporaryDirectory(prefix="prefork_pss.")
        pt = os.path.join(tmp.name, "model.pt")
        write_pt(args.model, pt)
    try:
        base = run(args.model, "none", args.workers)
        wc = run(args.model, "wcache", args.workers)
        tl = run(args.model, "torch", args.workers, pt=pt)
    finally:
        if tmp:
            tmp.cleanup()
    mib = 1 << 20
    n = args.workers
    print(f"model: {args.model}: {size / mib:.1f} MiB; {n} workers")
    print(f"{'loader':<12}{'summed PSS':>14}{'minus baseline':>16}{'x model':>9}"
          f"{'load s (max)':>14}  source")
    for name, r in (("none", base), ("wcache", wc), ("torch.load", tl)):
        extra = r["pss"] - base["pss"]
        load = max(x["load_seconds"] for x in r["ready"])
        print(f"{name:<12}{r['pss'] / mib:>11.1f} MiB{extra / mib:>12.1f} MiB"
              f"{extra / size:>9.2f}{load:>14.4f}  {r['ready'][0]['source']}")
    print(f"wcache: the model file's mappings in the {n} workers: "
          f"{wc['file_pss'] / mib:.1f} MiB PSS ({wc['file_pss'] / size:.2f} x model)")
    print(f"answer from a worker: {wc['answer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
