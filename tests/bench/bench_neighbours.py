#!/usr/bin/python3
"""Neighbour benchmark (issue 9): a well-behaved client's attach latency
while 64 connections of another user pipeline ATTACH and never read, next
to its latency on a quiet daemon, in the same run.

wcached runs as an unprivileged user without capabilities and with
RLIMIT_NOFILE 1024, as a packaged daemon with a small limit would (root
hides the kernel's per-user quota of descriptors in flight). The good
client (a third user) attaches, checks every byte and releases 1,000 times
(demo_worker --repeat 1000 --check). Target: 0 errors and its p99 within 3x
the quiet p99. Needs root (to run as other users); skipped otherwise.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("== neighbours: SKIP (needs root to run wcached and clients as other users) ==")
        return 0
    os.environ["WCACHE_BUILD"] = os.path.abspath(args.build)
    import conftest
    from test_neighbours import BAD_UID, DAEMON_UID, GROUP, NON_READER, good_worker

    tmp = Path(tempfile.mkdtemp(prefix="wcache-bench-neighbours-"))
    model = conftest.mkmodel(tmp / "small.safetensors")
    d = conftest.Daemon(tmp, {"small": model}, user=(DAEMON_UID, GROUP), nofile=1024).start()
    try:
        good_worker(d, model, 200)  # warm up the path
        quiet = good_worker(d, model, 1000)
        bad = subprocess.Popen(conftest.as_user(BAD_UID, GROUP) +
                               ["/usr/bin/python3", "-c", NON_READER, d.socket, "small", "64"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = bad.stdout.readline().split()
            busy = good_worker(d, model, 1000)
        finally:
            bad.stdin.close()
            bad.wait(timeout=60)
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    ratio = busy["p99_us"] / quiet["p99_us"] if quiet["p99_us"] > 0 else float("inf")
    load = os.getloadavg()[0]
    print(f"== neighbours (wcached unprivileged, RLIMIT_NOFILE 1024; load average {load:.1f}) ==")
    print(f"64 non-reading connections pipelined {ready[1]} ATTACH requests")
    print(f"good client, 1000 attach+check+release: quiet p50/p99 {quiet['p50_us']:.0f}/"
          f"{quiet['p99_us']:.0f} us; with non-readers {busy['p50_us']:.0f}/"
          f"{busy['p99_us']:.0f} us; errors 0")
    print(f"p99 with non-readers / quiet p99: {ratio:.2f}x (target within 3x: "
          f"{'PASS' if ratio <= 3 else 'MISS'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
