#!/usr/bin/python3
"""Restart benchmark (issue 12): how long workers cannot attach across a
restart of wcached, with the file descriptor store (warm restart) and
without it (cold start), for 10 models of about 1,000 and of about 50,000
tensors, in the same run.

A fake service manager (tests/integration/test_warm_restart.py's, which
keeps what wcached stores with FDSTORE=1 and hands it to the next process in
$LISTEN_FDS, as systemd does) stands in for systemd. The outage is measured
from SIGTERM of the running daemon to the moment a client, retrying, has
attached every one of the 10 models through the new process (libwcache over
ctypes, in this process). Target: the warm restart under 100 ms, whatever
the tensor count. The page cache is warm in both cases: what the cold start
pays is opening, validating and compiling every model again.
"""
import argparse
import ctypes
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

MODELS = 10
RUNS = 5


def attach_all(lib, sock, names, deadline):
    """Connects and attaches every model, retrying until deadline; returns
    the time it succeeded."""
    c = ctypes.c_void_p()
    m = ctypes.c_void_p()
    while time.monotonic() < deadline:
        if lib.wc_connect(sock.encode(), ctypes.byref(c)) == 0:
            ok = True
            for n in names:
                if lib.wc_attach(c, n.encode(), ctypes.byref(m)) != 0:
                    ok = False
                    break
                lib.wc_release(m)
            lib.wc_disconnect(c)
            if ok:
                return time.monotonic()
        time.sleep(0.0005)
    raise RuntimeError("the models never became attachable")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    os.environ["WCACHE_BUILD"] = os.path.abspath(args.build)
    import conftest
    from test_warm_restart import FakeManager, start

    lib = ctypes.CDLL(os.path.join(os.path.abspath(args.build), "lib", "libwcache.so.0"))
    lib.wc_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.wc_attach.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    lib.wc_release.argtypes = [ctypes.c_void_p]
    lib.wc_disconnect.argtypes = [ctypes.c_void_p]
    os.environ["WCACHE_TIMEOUT"] = "5"
    print(f"== restart (10 models; outage = SIGTERM to every model attached again; median of "
          f"{RUNS}; load average {os.getloadavg()[0]:.1f}) ==")
    rows = []
    for label, layers in (("~1,000 tensors each", 111), ("~50,000 tensors each", 5555)):
        tmp = Path(tempfile.mkdtemp(prefix="wcache-bench-restart-"))
        models = {f"m{i}": conftest.mkmodel(tmp / f"m{i}.safetensors", layers=layers, hidden=8,
                                            ffn=16, vocab=16, seed=i + 1)
                  for i in range(MODELS)}
        names = list(models)
        mgr = FakeManager(str(tmp / "notify.sock"))
        d = conftest.Daemon(tmp, models)
        result = {}
        try:
            start(d, mgr)
            attach_all(lib, d.socket, names, time.monotonic() + 120)
            mgr.wait_for(lambda m: sum(k.endswith("-i") for k in m.store) == MODELS and
                         "wc-desc" in m.store, what="every generation stored")
            for kind in ("warm", "cold"):
                outages = []
                for _ in range(RUNS):
                    t0 = time.monotonic()
                    d.proc.send_signal(signal.SIGTERM)
                    d.proc.wait(timeout=60)
                    d.logf.close()
                    fds, fdnames = mgr.listen_fds() if kind == "warm" else ((), ())
                    start(d, mgr, fds, fdnames)
                    t1 = attach_all(lib, d.socket, names, time.monotonic() + 120)
                    outages.append(t1 - t0)
                    if kind == "warm":
                        assert "restored from the file descriptor store" in d.read_log()
                    else:
                        mgr.wait_for(lambda m: sum(k.endswith("-i") for k in m.store) >=
                                     MODELS, what="every generation stored again")
                result[kind] = median(outages)
        finally:
            d.stop()
            mgr.close()
            os.system(f"rm -rf {tmp}")
        rows.append((label, result))
        print(f"{label}: warm restart {result['warm'] * 1e3:.1f} ms, cold start "
              f"{result['cold'] * 1e3:.1f} ms ({result['cold'] / result['warm']:.1f}x)")
    worst = max(r["warm"] for _, r in rows)
    print(f"warm restart outage, worst of both: {worst * 1e3:.1f} ms (target under 100 ms: "
          f"{'PASS' if worst < 0.1 else 'MISS'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
