#!/usr/bin/python3
"""Hot-swap benchmark (issue 4): how long from replacing a model to its new
generation being current, next to the new file's warm-up time; and attach
latency while swaps happen, next to the latency without them.

Each swap copies a different model (same size, another seed) beside the
live one, writes it to disk and evicts it from the page cache (a new file
arrives cold), renames it over the live path and asks wcached to reload.
The time to "current" is measured by a worker spinning on wc_model_stale()
(the status page: no system call), the warm-up by wcached's own log line.
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from wcached import Wcached, build_binary  # noqa: E402 (path set just above)

SWAPS = 6


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def control(path, line):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(line.encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    s.close()
    return json.loads(reply)


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.005)
    raise SystemExit(f"bench_swap: timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=None)
    ap.add_argument("--mib", type=int, default=256, help="model size")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    binary = lambda name: build_binary(name, build)  # noqa: E731
    models = os.path.abspath(args.models or os.path.join(build, "bench-models"))
    os.makedirs(models, exist_ok=True)

    lib = ctypes.CDLL(os.path.join(build, "lib", "libwcache.so.0"))
    lib.wc_errmsg.restype = ctypes.c_char_p
    lib.wc_model_stale.argtypes = [ctypes.c_void_p]
    lib.wc_model_generation.restype = ctypes.c_uint64
    lib.wc_model_generation.argtypes = [ctypes.c_void_p]
    lib.wc_release.argtypes = [ctypes.c_void_p]
    lib.wc_attach.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.wc_connect.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.wc_disconnect.argtypes = [ctypes.c_void_p]

    sources = []
    for seed in range(1, SWAPS + 2):
        path = os.path.join(models, f"swap-{args.mib}m-{seed}.safetensors")
        if not os.path.exists(path):
            subprocess.run([binary("mkmodel"), "--hidden", "1024", "--ffn", "2816", "--vocab",
                            "8000", "--seed", str(seed), "--min-bytes", str(args.mib << 20),
                            path], check=True, stdout=subprocess.DEVNULL)
        sources.append(path)
    size = os.path.getsize(sources[0])

    tmp = tempfile.mkdtemp(prefix="wcache-bench-swap-", dir=models)
    live = os.path.join(tmp, "live.safetensors")
    shutil.copy(sources[0], live)
    daemon = Wcached(tmp, {"swap": live}, log_level="info", wcached=binary("wcached"))
    sock, ctl = daemon.socket, daemon.control
    try:
        daemon.start()
        wait_for(lambda: os.path.exists(ctl) and
                 control(ctl, "status")["models"][0]["state"] == "ready", 60, "warm")
        print(f"== Hot swap (issue 4): {SWAPS} swaps of a {size / 2**20:.0f} MiB model, "
              f"each new file cold (evicted) ==")

        quiet = json.loads(subprocess.run([binary("bench_attach"), sock, "swap", "3"],
                                          check=True, capture_output=True,
                                          text=True).stdout)

        client, model = ctypes.c_void_p(), ctypes.c_void_p()
        if lib.wc_connect(sock.encode(), ctypes.byref(client)) < 0 or \
                lib.wc_attach(client, b"swap", ctypes.byref(model)) < 0:
            raise SystemExit(f"bench_swap: {lib.wc_errmsg().decode()}")
        rows = []
        for i in range(SWAPS):
            nxt = os.path.join(tmp, ".next.safetensors")
            shutil.copy(sources[1 + i], nxt)
            evict(nxt)
            os.rename(nxt, live)
            t0 = time.perf_counter()
            reply = control(ctl, "reload swap")
            t_valid = time.perf_counter() - t0
            if not reply.get("ok"):
                raise SystemExit(f"bench_swap: reload: {reply}")
            while not lib.wc_model_stale(model):
                pass
            t_current = time.perf_counter() - t0
            old = model
            model = ctypes.c_void_p()
            lib.wc_attach(client, b"swap", ctypes.byref(model))
            lib.wc_release(old)
            gen = lib.wc_model_generation(model)
            line = daemon.wait_for_log(rf"generation {gen} warm: \d+ bytes in ([\d.]+) s", 30)[1]
            warm = float(re.search(r"warm: \d+ bytes in ([\d.]+) s", line).group(1))
            rows.append((gen, t_valid, warm, t_current))
        # Attach latency while swaps run back to back.
        busy = swap_window(binary, sock, ctl, live, tmp, sources, lib)
        lib.wc_release(model)
        lib.wc_disconnect(client)

        print(f"  {'gen':>4} {'reload reply':>13} {'warm-up':>9} {'rename->current':>16} "
              f"{'switch adds':>12}")
        adds = []
        for gen, t_valid, warm, t_current in rows:
            add = t_current - warm
            adds.append(add)
            print(f"  {gen:>4} {t_valid * 1e3:>10.1f} ms {warm * 1e3:>6.0f} ms "
                  f"{t_current * 1e3:>13.0f} ms {add * 1e3:>9.1f} ms")
        print(f"  (reload reply: validated and installed; warm-up: wcached's log; "
              f"switch adds: rename->current minus warm-up)")
        print()
        print(f"  attach latency      {'count':>7} {'p50':>8} {'p99':>8} {'p99.9':>8} {'max':>8}")
        for label, r in (("quiet", quiet), (f"during {busy['swaps']} swaps", busy)):
            print(f"  {label:<19} {r['count']:>7} {r['p50_us']:>6.0f}us {r['p99_us']:>6.0f}us "
                  f"{r['p999_us']:>6.0f}us {r['max_us']:>6.0f}us")
        med_add = statistics.median(adds)
        ratio = busy["p50_us"] / quiet["p50_us"]
        print()
        print(f"  {'PASS' if med_add < 0.010 else 'MISS'}  switching adds < 10 ms to the "
              f"warm-up: median {med_add * 1e3:.1f} ms (max {max(adds) * 1e3:.1f} ms)")
        print(f"  {'PASS' if ratio <= 2 else 'MISS'}  attach latency during swaps within 2x "
              f"quiet: p50 {ratio:.2f}x ({busy['p50_us']:.0f} vs {quiet['p50_us']:.0f} us), "
              f"p99 {busy['p99_us'] / quiet['p99_us']:.2f}x")
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def swap_window(binary, sock, ctl, live, tmp, sources, lib):
    """Attach latency measured while swaps run back to back."""
    proc = subprocess.Popen([binary("bench_attach"), sock, "swap", "4"], stdout=subprocess.PIPE,
                            text=True)
    swaps = 0
    end = time.monotonic() + 3.5
    i = 0
    while time.monotonic() < end:
        nxt = os.path.join(tmp, ".next.safetensors")
        shutil.copy(sources[i % len(sources)], nxt)
        evict(nxt)
        os.rename(nxt, live)
        if control(ctl, "reload swap").get("ok"):
            swaps += 1
        i += 1
    out, _ = proc.communicate(timeout=60)
    r = json.loads(out)
    r["swaps"] = swaps
    return r


if __name__ == "__main__":
    main()
