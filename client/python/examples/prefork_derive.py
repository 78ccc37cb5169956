#!/usr/bin/python3
"""Pre-fork workers (the gunicorn way) that each ask for derived weights:
one builds, the others attach, and all of them share one copy.

    prefork_derive.py MODEL [--workers 4] [--key f32-v1] [--socket PATH]

The parent forks the workers before touching any weights. Each worker calls
``wcache.derived(MODEL, KEY, to_f32)`` at the same time: wcached makes the
first one the builder (it converts the model to F32 and publishes it) and
holds the others until the artifact is there, then every worker maps the
same sealed memfd. Each worker reads every tensor once and reports one JSON
line: its pid, whether it built, its PSS (proportional set size, from
/proc/PID/smaps_rollup: a page shared by N processes counts 1/N in each)
and a digest of the weights. The parent prints those lines and a summary:
how many workers built (1 through wcached; every one without it, in
process) and the summed PSS next to the artifact's size.
"""
import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the wcache package beside examples/

import torch  # noqa: E402

import wcache  # noqa: E402
from wcache._pss import pss_kib  # noqa: E402


def to_f32(source):
    return {k: v.float() if v.is_floating_point() else v for k, v in source.items()}


def worker(args, out):
    """Runs in a forked child: derive, touch every page, report."""
    built = []

    def build(source):
        built.append(True)
        return to_f32(source)

    weights = wcache.derived(args.model, args.key, build, socket=args.socket, timeout=0)
    h = hashlib.sha256()
    nbytes = 0
    for name in sorted(weights):
        t = weights[name]
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.nelement() else b"")
        nbytes += t.nelement() * t.element_size()
    line = {"worker": os.getpid(), "built": bool(built), "pss_kib": pss_kib(os.getpid()),
            "bytes": nbytes, "digest": h.hexdigest()}
    os.write(out, (json.dumps(line) + "\n").encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--key", default="f32-v1")
    ap.add_argument("--socket", default=None)
    args = ap.parse_args()

    r, w = os.pipe()
    pids = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                worker(args, w)
            except BaseException as e:  # report, never return into the parent's code
                print(f"worker {os.getpid()}: {type(e).__name__}: {e}", file=sys.stderr)
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(w)
    with os.fdopen(r) as f:
        lines = [json.loads(x) for x in f]
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    for line in lines:
        print(json.dumps(line))
    built = sum(x["built"] for x in lines)
    digests = {x["digest"] for x in lines}
    size = lines[0]["bytes"] if lines else 0
    print(f"workers: {len(lines)}, built: {built}, same weights: {len(digests) == 1}, "
          f"artifact: {size / 2**20:.1f} MiB, summed PSS: "
          f"{sum(x['pss_kib'] for x in lines) / 1024:.1f} MiB")
    return 1 if failed or len(digests) != 1 else 0


if __name__ == "__main__":
    sys.exit(main())
