#!/usr/bin/python3
"""Polling models on shared storage (issue 22): what one poll of a model's
paths costs wcached, and whether that stays flat as models are added.

A real wcached polls (watch = poll, poll_interval 0.1 s) a one-file model
and a 163-shard layout (mklayout, as bench_scale.py), on the local
filesystem and through tests/tools/remotefs (FUSE standing in for NFS; root
only); its status gives polls and their seconds. Then 1, 16 and 64
one-file models on remotefs, polled every 0.5 s: a remote rename of one of
them, and how long until polling saw it, next to the per-poll cost. Last
(root only, in a mount namespace of its own: unshare -m), the 163-shard
layout on a tmpfs of its own (a model on a volume: each walk from "/"
crosses its mount, daemon/mountrule.h), polled with the namespace's few
mounts and again with 500 more (a Kubernetes node has hundreds): a poll
judges each mount it crosses from the mount table, read once per poll.
Then (root, unshare -m) a load of a directory model in a 1777 directory
where a neighbour mounted a filesystem (tmpfs with a 4000-byte source, a
long table line) on LISTING_MOUNTS of its *.safetensors names, next to
one with 2 such names and as many mounts elsewhere: the listing reads the
mount table once, not once per mounted name (review rev208 M3: 11 s).

    tests/bench/bench_poll.py --build BUILD --models DIR

Targets: a remote rename seen within 2 x poll_interval with 64 models
polled; the per-model poll cost with 64 models at most 2x that with 1; a
poll of 163 shards with 500 more mounts at most 2x that with few; a load
of a directory with 300 mounted names at most 2x one with 2.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))

from bench import Bench, fmt_t  # noqa: E402
from bench_scale import layout  # noqa: E402
from remotefs import RemoteFS, skip_reason  # noqa: E402
from wcached import Wcached, wait_until  # noqa: E402

POLL_FAST = "0.1"
POLL_FLAT = 0.5
MORE_MOUNTS = 500
LISTING_MOUNTS = 300


def status(b, d):
    r = subprocess.run([b.binary("wcachectl"), "--control", d.control, "--json", "status"],
                       capture_output=True, text=True)
    return {m["name"]: m for m in json.loads(r.stdout)["models"]}


def per_poll(b, tmp, models, seconds=3.0):
    """{name: seconds per poll} of models {name: path}, polled every 0.1 s."""
    d = Wcached(tmp, {n: (p, {"watch": "poll", "poll_interval": POLL_FAST, "stage": "no"})
                      for n, p in models.items()}, log_level="info",
                wcached=b.binary("wcached")).start()
    try:
        wait_until(lambda: all(m["state"] == "ready" for m in status(b, d).values()),
                   what="models ready")
        first = status(b, d)
        time.sleep(seconds)
        last = status(b, d)
        return {n: ((last[n]["poll_seconds"] - first[n]["poll_seconds"]) /
                    max(1, last[n]["polls"] - first[n]["polls"]), last[n]["polls"] -
                    first[n]["polls"]) for n in models}
    finally:
        d.stop()


def cost_part(b, tmp, fs):
    one = b.model("poll-one", ["--layers", "2", "--hidden", "64", "--ffn", "128",
                               "--vocab", "100"])
    shards = layout(b, "163 shards", 90000, 163)
    rows = [("1 file, local", {"m": one}), ("163 shards, local", {"m": shards})]
    if fs is not None:
        remote_one = os.path.join(fs.backing, "one.safetensors")
        subprocess.run(["cp", one, remote_one], check=True)
        remote_shards = os.path.join(fs.backing, "shards")
        subprocess.run(["cp", "-r", os.path.dirname(shards), remote_shards], check=True)
        rows += [("1 file, remotefs", {"m": fs.path("one.safetensors")}),
                 ("163 shards, remotefs",
                  {"m": os.path.join(fs.path("shards"), os.path.basename(shards))})]
    print("\n  one poll (a stat of the model's path and of each file's, on the work queue)")
    figures = {}
    for i, (label, models) in enumerate(rows):
        d = os.path.join(tmp, f"cost{i}")
        os.mkdir(d)
        cost, n = per_poll(b, d, models)["m"]
        figures[label] = cost
        print(f"  {label:<22} {fmt_t(cost):>9} per poll ({n} polls)")
    if fs is not None:
        print(f"  163 shards / 1 file on remotefs: "
              f"{figures['163 shards, remotefs'] / figures['1 file, remotefs']:.0f}x")
    return figures


def flat_part(b, tmp, fs):
    src1, src2 = (b.model(f"poll-seed{s}", ["--seed", str(s), "--layers", "2", "--hidden", "64",
                                             "--ffn", "128", "--vocab", "100"]) for s in (1, 2))
    with open(src1, "rb") as f:
        data1 = f.read()
    with open(src2, "rb") as f:
        data2 = f.read()
    print(f"\n  a remote rename of one model among N polled every {POLL_FLAT} s (remotefs)")
    results = {}
    for n in (1, 16, 64):
        for i in range(n):
            fs.replace(f"f{i}.safetensors", data1)
        fs.wait_visible(f"f{n - 1}.safetensors")
        d = os.path.join(tmp, f"flat{n}")
        os.mkdir(d)
        w = Wcached(d, {f"f{i}": (fs.path(f"f{i}.safetensors"),
                                  {"poll_interval": str(POLL_FLAT), "stage": "no"})
                        for i in range(n)}, log_level="info", wcached=b.binary("wcached")).start()
        try:
            wait_until(lambda: all(m["state"] == "ready" and m["polls"] >= 3
                                   for m in status(b, w).values()), what="models polled")
            t = time.monotonic()
            fs.replace("f0.safetensors", data2)
            seen, _ = w.wait_for_log(r'model "f0": .* changed on fuse \(seen by polling\)',
                                     timeout=30)
            m = status(b, w)
            cost = sum(x["poll_seconds"] for x in m.values()) / sum(x["polls"] for x in m.values())
            results[n] = (seen - t, cost)
            print(f"  {n:>3} models: seen after {fmt_t(seen - t):>9}, {fmt_t(cost):>9} per "
                  f"model per poll")
        finally:
            w.stop()
    ok_seen = results[64][0] <= 2 * POLL_FLAT + fs.attr_timeout
    b.target(f"remote rename seen within 2 x poll_interval ({2 * POLL_FLAT:.1f} s + "
             f"{fs.attr_timeout} s attribute cache), 64 models", fmt_t(results[64][0]), ok_seen)
    ratio = results[64][1] / results[1][1]
    b.target("per-model poll cost, 64 models / 1 model <= 2x", f"{ratio:.2f}x", ratio <= 2)
    return results


def mounts_here(b, tmp):
    """In a mount namespace of this process's own (mounts_part): the
    163-shard layout copied onto a tmpfs of its own, polled with the
    namespace's mounts and with MORE_MOUNTS more. Prints the figures and
    the ratio as one line of JSON last."""
    shards = layout(b, "163 shards", 90000, 163)
    vol = os.path.join(tmp, "vol")
    os.mkdir(vol)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "vol", vol], check=True)
    subprocess.run(["cp", "-r", os.path.dirname(shards), os.path.join(vol, "m")], check=True)
    path = os.path.join(vol, "m", os.path.basename(shards))
    figures = {}
    for label, more in (("few", 0), ("many", MORE_MOUNTS)):
        for i in range(more):
            m = os.path.join(tmp, "more", str(i))
            os.makedirs(m)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", f"more{i}", m], check=True)
        with open("/proc/self/mountinfo") as f:
            n = sum(1 for _ in f)
        d = os.path.join(tmp, f"mounts-{label}")
        os.mkdir(d)
        cost, polls = per_poll(b, d, {"m": path})["m"]
        figures[label] = (n, cost, polls)
    print(json.dumps(figures))


def in_own_mounts(b, tmp, name, flag):
    """This script again with flag and the directory tmp/name, in a private
    mount namespace (unshare -m: the mounts it makes go with it): the JSON
    of its last line, or None (said) where it cannot run."""
    if os.geteuid() != 0:
        print("  (not root: no mount namespace of our own; skipped)")
        return None
    d = os.path.join(tmp, name)
    os.mkdir(d)
    p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable,
                        os.path.abspath(__file__), "--build", b.build, "--models", b.model_dir,
                        flag, d], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"  (unshare -m failed: {p.stderr.strip()[-300:]}; skipped)")
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def mounts_part(b, tmp):
    """mounts_here in a private mount namespace (in_own_mounts)."""
    print("\n  one poll of 163 shards on a tmpfs of their own (a volume), by the number of "
          "mounts")
    figures = in_own_mounts(b, tmp, "mounts", "--mounts-here")
    if figures is None:
        return None
    for label in ("few", "many"):
        n, cost, polls = figures[label]
        print(f"  {n:>4} mounts              {fmt_t(cost):>9} per poll ({polls} polls)")
    ratio = figures["many"][1] / figures["few"][1]
    b.target(f"a poll of 163 shards with {MORE_MOUNTS} more mounts / with few <= 2x",
             f"{ratio:.2f}x", ratio <= 2)
    return figures


def listing_here(b, tmp):
    """In a mount namespace of this process's own (listing_part): the
    seconds of `wcachectl load` of a directory model whose directory has
    2, then LISTING_MOUNTS, names with a mount on them (the rest of the
    LISTING_MOUNTS mounts elsewhere: the same table). Each load fails (the
    mounts are local: their names count, several files), after the
    listing. One line of JSON last."""
    src = "\\" * 4000
    figures = {}
    for label, on_names in (("few", 2), ("many", LISTING_MOUNTS)):
        top = os.path.join(tmp, f"listing-{label}")
        m, elsewhere = os.path.join(top, "m"), os.path.join(top, "elsewhere")
        os.makedirs(m)
        os.chmod(m, 0o1777)
        os.makedirs(elsewhere)
        mounted = []
        for i in range(LISTING_MOUNTS):
            d = os.path.join(m, f"b{i}.safetensors") if i < on_names else \
                os.path.join(elsewhere, str(i))
            os.mkdir(d)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", src, d], check=True)
            mounted.append(d)
        d = os.path.join(top, "daemon")
        os.mkdir(d)
        w = Wcached(d, {}, log_level="info", wcached=b.binary("wcached")).start()
        try:
            t = time.monotonic()
            subprocess.run([b.binary("wcachectl"), "--control", w.control, "load", "m", m],
                           capture_output=True)
            figures[label] = time.monotonic() - t
        finally:
            w.stop()
        with open("/proc/self/mountinfo") as f:
            figures["table"] = max(figures.get("table", 0), len(f.read()))
        for d in mounted:
            subprocess.run(["umount", d], check=True)
    print(json.dumps(figures))


def listing_part(b, tmp):
    """listing_here in a private mount namespace (in_own_mounts)."""
    print(f"\n  a load of a directory model with {LISTING_MOUNTS} / 2 mounted names in its "
          "directory")
    figures = in_own_mounts(b, tmp, "listing", "--listing-here")
    if figures is None:
        return None
    print(f"  {2:>4} mounted names         {fmt_t(figures['few']):>9} a load")
    print(f"  {LISTING_MOUNTS:>4} mounted names         {fmt_t(figures['many']):>9} a load")
    ratio = figures["many"] / figures["few"]
    b.target(f"a load with {LISTING_MOUNTS} mounted names / with 2 <= 2x", f"{ratio:.2f}x",
             ratio <= 2)
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=None)
    ap.add_argument("--mounts-here", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--listing-here", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--only-mounts", action="store_true",
                    help="only the parts with many mounts (a poll, a listing)")
    args = ap.parse_args()
    b = Bench(args.build, os.path.abspath(args.models or os.path.join(args.build,
                                                                         "bench-models")))
    os.makedirs(b.model_dir, exist_ok=True)
    if args.mounts_here:
        mounts_here(b, args.mounts_here)
        return
    if args.listing_here:
        listing_here(b, args.listing_here)
        return
    if args.only_mounts:
        with tempfile.TemporaryDirectory(prefix="wcache-bench-poll-") as tmp:
            os.chmod(tmp, 0o755)
            mounts_part(b, tmp)
            listing_part(b, tmp)
        for what, figure, verdict in b.targets:
            print(f"  {verdict}  {what}: {figure}")
        return
    print("== Polling models on shared storage (watch = poll; remotefs stands in for NFS) ==")
    with tempfile.TemporaryDirectory(prefix="wcache-bench-poll-") as tmp:
        os.chmod(tmp, 0o755)
        reason = skip_reason(b.build)
        if reason:
            print(f"  (no remotefs: {reason}; local figures only)")
            cost_part(b, tmp, None)
        else:
            os.mkdir(os.path.join(tmp, "backing"))
            os.mkdir(os.path.join(tmp, "mnt"))
            with RemoteFS(os.path.join(tmp, "backing"), os.path.join(tmp, "mnt"),
                          attr_timeout=0.1, build=b.build) as fs:
                cost_part(b, tmp, fs)
                flat_part(b, tmp, fs)
        mounts_part(b, tmp)
        listing_part(b, tmp)
    for what, figure, verdict in b.targets:
        print(f"  {verdict}  {what}: {figure}")


if __name__ == "__main__":
    main()
