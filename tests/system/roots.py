#!/usr/bin/python3
"""Makes the two Debian 12 roots of the system tests ahead of them:
BUILD/system (run.py's) and BUILD/kube (kube.py's base image), each with
rootfs.ensure_root and the same packages the suites ask for, so that
`make test` can debootstrap them beside the ctest phases instead of after.

    tests/system/roots.py --build BUILD [--debs DIR]

Only the roots: nothing is booted or imported. A root already made is
kept. Where a suite would skip (not root, debootstrap missing, the
archive unreachable) this says so on one line and exits 0: the suite
then says it again itself. A failed debootstrap exits 1 with the log's
name; the suite tries again and fails or passes on its own. ensure_root
holds a lock on its folder, so a suite that starts before a root is
finished waits for it instead of starting another.
"""
import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kube  # noqa: E402
import kube_image  # noqa: E402
import rootfs  # noqa: E402
import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="the build folder (root caches)")
    ap.add_argument("--debs", help="where make deb put the .deb files (default BUILD/deb)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    debs = run.find_debs(args.debs or os.path.join(build, "deb"))
    if os.geteuid() != 0:
        print("roots: not root: the system tests make their roots themselves (or skip)")
        return 0
    if shutil.which("debootstrap") is None:
        print("roots: debootstrap missing: the system tests say so themselves")
        return 0
    wanted = [
        (os.path.join(build, "system"), rootfs.packages_for(debs.values())),
        (os.path.join(build, "kube"),
         kube_image.base_packages([p for k, p in debs.items() if k in kube.PACKAGES])),
    ]
    status = 0
    for cache, packages in wanted:
        t = time.monotonic()
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, "debootstrap.log"), "a") as log:
            try:
                root, built = rootfs.ensure_root(cache, rootfs.apt_mirror(), packages, log)
            except rootfs.Unavailable as e:
                print(f"roots: {e}")
                return 0
            except (RuntimeError, OSError) as e:
                print(f"roots: {cache}: {e}")
                status = 1
                continue
        print(f"roots: {root} ({'debootstrapped' if built else 'cached'},"
              f" {time.monotonic() - t:.0f} s)", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
