"""tests/bench/bench_shards.py --build BUILD [--shards N]: what safe_open of a
file by its own path costs when wcached serves its directory (the shards of a
Hugging Face model, as transformers opens them: wcache/_shards.py), and what
the fallback of a file nobody serves costs while wcached runs.

Part of `make bench` (tests/bench/run.sh). Runs in a process that has
imported torch (about 1,700 mappings, as a worker has; no /proc/self/maps is
read to tell the files apart since 2c3d528). The package measured is the one Python imports; run it with
PYTHONPATH at another checkout's client/python for a before/after. Each
figure is the best of --rounds passes over N files, in µs per open + close:

- a file in a directory wcached does not serve (N files), and the part of
  that spent on the directory (served_file() alone), with the "not served"
  answer remembered (NOT_SERVED_FOR) and asked each time;
- a shard of an N-shard model served as its directory: each handle closed
  before the next open (the directory is attached anew for each, and
  released), and all kept open (attached once);
- the same shards each configured as a model of its own, by path (one
  wcached per layout);
- wc_open_file of a shard in this process, for scale.
"""
import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch  # a worker's process: its mappings are what the shard match reads

import wcache
import wcache._safe_open as so

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from wcached import Wcached  # noqa: E402 (path set just above)


def write_file(path, tensors):
    """A safetensors file of tensors [(name, float32 array)] with {"format": "pt"}."""
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, a in tensors:
        b = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def per_open(paths, keep, rounds):
    """(best µs per open + close over rounds passes, the last model's source,
    the first pass's µs)."""
    best, source, first = None, None, None
    for _ in range(rounds):
        held = []
        t = time.perf_counter()
        for p in paths:
            h = wcache.safe_open(p)
            source = h.model._source
            if keep:
                held.append(h)
            else:
                h.close()
        dt = (time.perf_counter() - t) / len(paths) * 1e6
        for h in held:
            h.close()
        del held, h
        best = dt if best is None else min(best, dt)
        first = dt if first is None else first
    return best, source, first


def serve(base, name, models, work):
    """Runs work() with safe_open pointed at a wcached serving models."""
    directory = os.path.join(base, name)
    os.makedirs(directory)
    d = Wcached(directory, models, log_level="info").start()
    os.environ["WCACHE_SOCKET"] = d.socket
    so._shared = None
    try:
        work()
    finally:
        so._shared = None
        d.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shards", type=int, default=163)
    ap.add_argument("--tensors", type=int, default=32, help="per shard")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ["WCACHE_BUILD"] = os.path.abspath(args.build)
    logging.disable(logging.CRITICAL)  # the INFO line of each unserved directory
    base = tempfile.mkdtemp(prefix="bench-shards-")
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(args, base):
    n = args.shards
    model = os.path.join(base, "model")
    other = os.path.join(base, "other")
    os.makedirs(model)
    os.makedirs(other)
    shards, weight_map = [], {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensors = [(f"model.layers.{i}.t{k}", np.zeros(256, np.float32))
                   for k in range(args.tensors)]
        write_file(os.path.join(model, name), tensors)
        write_file(os.path.join(other, name), tensors)
        weight_map.update({t[0]: name for t in tensors})
        shards.append(os.path.join(model, name))
    with open(os.path.join(model, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    unserved = [os.path.join(other, os.path.basename(p)) for p in shards]
    with open("/proc/self/maps") as f:
        lines = sum(1 for _ in f)
    print(f"{n} shards of {args.tensors} tensors; this process (torch {torch.__version__}): "
          f"{lines} mappings; package {os.path.dirname(wcache.__file__)}")
    r = args.rounds

    def directory():
        wcache.safe_open(unserved[0]).close()  # connects
        print("file in a directory nobody serves:        %8.1f µs/open (%s; first %.1f)"
              % per_open(unserved, False, r))
        shards_mod = sys.modules.get("wcache._shards")
        if shards_mod is not None:
            kept, shards_mod.NOT_SERVED_FOR = shards_mod.NOT_SERVED_FOR, 0.0
            shards_mod._dirs.clear()
            print("  the same, the directory asked each time: %8.1f µs/open (%s; first %.1f)"
                  % per_open(unserved, False, r))
            client = so._client()
            for label, keep in (("remembered", kept), ("asked", 0.0)):
                shards_mod.NOT_SERVED_FOR = keep
                shards_mod._dirs.clear()
                best = None
                for _ in range(r):
                    t = time.perf_counter()
                    for p in unserved:
                        shards_mod.served_file(client, p)
                    dt = (time.perf_counter() - t) / n * 1e6
                    best = dt if best is None else min(best, dt)
                print(f"  of which the directory's part, {label}: %8.1f µs" % best)
            shards_mod.NOT_SERVED_FOR = kept
        for label, keep in (("closed:   ", False), ("kept open:", True)):
            if shards_mod is not None:
                shards_mod._dirs.clear()  # the first pass finds the files anew
            got[keep] = per_open(shards, keep, r)
            print(f"shard of the served directory, {label} %8.1f µs/open (%s; first %.1f)"
                  % got[keep])
    got = {}
    serve(base, "d1", {"model": model}, directory)

    def each():
        wcache.safe_open(shards[0]).close()
        got["own"] = per_open(shards, False, r)
        print("shard configured as its own model:        %8.1f µs/open (%s; first %.1f)"
              % got["own"])
    serve(base, "d2", {f"s{i}": p for i, p in enumerate(shards)}, each)

    t = time.perf_counter()
    for p in shards:
        wcache.open_file(p).close()
    print("wcache.open_file of a shard, in-process:  %8.1f µs/open"
          % ((time.perf_counter() - t) / n * 1e6))
    # Targets: a loader that keeps the shards open (transformers) pays at
    # most twice what it pays with each shard configured as a model, once
    # the files are known, and on the first pass over a generation's files.
    own, kept = got["own"], got[True]
    for what, mine, theirs in (("known files", kept[0], own[0]),
                               ("first pass ", kept[2], own[2])):
        ratio = mine / theirs
        print(f"target: served directory, kept open, {what} <= 2x own models: "
              f"{ratio:.1f}x ({mine:.0f} vs {theirs:.0f} µs) {'PASS' if ratio <= 2 else 'MISS'}")


if __name__ == "__main__":
    main()
