#!/usr/bin/python3
"""make demo: wcache end to end.

Generates a demo model (a BF16 safetensors file shaped like a decoder-only
LLM, at least 512 MiB), starts wcached on sockets in a temporary directory
(tests/pyutil/wcached.py),
starts 4 worker processes that attach the model through the daemon and check
every byte against the file read with plain read(2), prints what each worker
paid and what the 4 (and wcached) together cost in memory (summed PSS next to the model
size), and shuts everything down cleanly.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyutil"))
from wcached import Wcached  # noqa: E402 (path set just above)

WORKERS = 4


def wait_warm(bindir, conf, proc, deadline):
    """Waits until `wcachectl status` reports the model ready (warm)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"demo: wcached exited with status {proc.returncode}")
        r = subprocess.run([f"{bindir}/wcachectl", "-c", conf, "--json", "status"],
                           capture_output=True, text=True)
        if r.returncode == 0 and all(m["state"] == "ready"
                                     for m in json.loads(r.stdout)["models"]):
            return
        time.sleep(0.05)
    raise SystemExit("demo: the model did not become ready in time")


def pss_kib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Pss"].split()[0]), int(fields["Rss"].split()[0])


def mib(n):
    return n / (1 << 20)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model-dir", default=None, help="where to keep the demo model")
    args = ap.parse_args()
    bindir = os.path.abspath(os.path.join(args.build, "bin"))
    model_dir = os.path.abspath(args.model_dir or os.path.join(args.build, "demo"))
    os.makedirs(model_dir, exist_ok=True)
    model = os.path.join(model_dir, "demo-llm.safetensors")

    print("== wcache demo ==")
    if not os.path.exists(model) or subprocess.run(
            [f"{bindir}/wcachectl", "inspect", model], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL).returncode != 0:
        print("generating the demo model (BF16, llama layout, >= 512 MiB) ...")
        subprocess.run([f"{bindir}/mkmodel", "--hidden", "1024", "--ffn", "2816",
                        "--vocab", "32000", "--min-bytes", str(560 << 20), model], check=True)
    size = os.path.getsize(model)
    summary = subprocess.run([f"{bindir}/wcachectl", "inspect", model], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"model: {model}\n       {summary}")

    tmp = tempfile.mkdtemp(prefix="wcache-demo-")
    wcached = Wcached(tmp, {"demo-llm": (model, {"pin": "metadata", "warm": "yes"})},
                      log_level="info", wcached=f"{bindir}/wcached")
    sock = wcached.socket
    workers = []
    ok = False
    try:
        daemon = wcached.start().proc
        print(f"wcached: pid {daemon.pid}, socket {sock}")
        t0 = time.monotonic()
        wait_warm(bindir, wcached.conf, daemon, t0 + 300)
        print(f"wcached: model validated and warm after {time.monotonic() - t0:.2f} s "
              f"(wcachectl status says ready)")
        for _ in range(WORKERS):
            workers.append(subprocess.Popen(
                [f"{bindir}/demo_worker", "--socket", sock, "--verify", model, "--touch",
                 "--sync", "--hold", "demo-llm"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True))
        # All four attach at once; then all verify (CPU-bound on 2 cores),
        # so the attach times do not include waiting for another's memcmp.
        for w in workers:
            if not w.stdout.readline():
                raise SystemExit(f"demo: worker {w.pid} failed (status {w.wait()})")
        for w in workers:
            w.stdin.write("verify\n")
            w.stdin.flush()
        results = []
        for w in workers:
            line = w.stdout.readline()
            if not line:
                raise SystemExit(f"demo: worker {w.pid} failed (status {w.wait()})")
            results.append(json.loads(line))
        # All workers hold the model now: measure what they cost together.
        total_pss = 0
        print()
        print(f"{'worker':>8} {'attach':>10} {'verified':>12} {'verify':>8} "
              f"{'RSS':>10} {'PSS':>10}")
        for w, r in zip(workers, results):
            pss, rss = pss_kib(w.pid)
            total_pss += pss * 1024
            print(f"{r['pid']:>8} {r['attach_us']:>8.0f}us {mib(r['verified']):>9.1f}MiB "
                  f"{r['verify_s']:>7.2f}s {mib(rss * 1024):>7.1f}MiB {mib(pss * 1024):>7.1f}MiB")
            if r["verified"] != r["bytes"]:
                raise SystemExit("demo: a worker did not verify every byte")
        # wcached maps every page of a warm model too (so no client can drop
        # them): it is the fifth sharer of the one copy.
        daemon_pss = pss_kib(daemon.pid)[0] * 1024
        print(f"{'wcached':>8} {'':>10} {'':>12} {'':>8} {'':>10} {mib(daemon_pss):>7.1f}MiB")
        print()
        print(f"model file:        {mib(size):8.1f} MiB")
        print(f"4 workers + wcached, PSS: {mib(total_pss + daemon_pss):8.1f} MiB  "
              f"({(total_pss + daemon_pss) / size:.2f}x the model; 4 private copies would be "
              f"{4 * mib(size):.0f} MiB)")
        for w in workers:
            w.stdin.close()
        for w in workers:
            if w.wait(timeout=30) != 0:
                raise SystemExit(f"demo: worker {w.pid} exited with {w.returncode}")
        ok = True
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        status = wcached.stop(timeout=30)
        if not ok or status != 0 or os.path.exists(sock):
            sys.stderr.write(wcached.read_log())
        shutil.rmtree(tmp, ignore_errors=True)
    if status != 0:
        raise SystemExit(f"demo: wcached exited with status {status}")
    print("wcached stopped cleanly (exit 0, socket removed). demo ok")


if __name__ == "__main__":
    main()
