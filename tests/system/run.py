#!/usr/bin/python3
"""The system test suite: the project's .deb files installed in a Debian 12
container booted with the real systemd, and the packaged service checked
as an operator and a worker use it (see checks.py for the list).

    tests/system/run.py --build BUILD [--debs DIR] [--keep-logs]

Builds the root once with debootstrap under BUILD/system (rootfs.py),
boots a copy with systemd-nspawn (container.py), installs the packages,
traces the service manager with strace to learn every system call the
daemon makes (syscalls.py; paused for the checks that measure time),
runs the checks, keeps the boot's journal in BUILD/system/journal.log,
and always tears the container down. Skips, on one line starting with "SKIP system tests:",
only when the container cannot be booted here: not root, no
systemd-nspawn/debootstrap/nsenter/strace/cc, or the Debian archive
unreachable. A check that cannot be done on this runner (it lacks what
the check needs, such as CAP_SYS_RESOURCE) says "skip NAME: why" after
checking what it can. Ends with "N passed, N failed" (", N skipped" when
any was); exit status 1 when any check failed, 0 otherwise (a skip
included).
"""
import argparse
import glob
import os
import shutil
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rootfs  # noqa: E402
import syscalls  # noqa: E402
from checks import UNIT, Checks, Failure, Skipped  # noqa: E402
from container import Container  # noqa: E402

PACKAGES = ("wcached", "libwcache0", "libwcache-dev", "python3-wcache")
TOOLS = ("systemd-nspawn", "debootstrap", "nsenter", "strace", "dpkg-deb", "cp", "cc")


def skip(reason):
    print(f"SKIP system tests: {reason}", flush=True)
    sys.exit(0)


def find_debs(directory):
    debs = {}
    for pkg in PACKAGES:
        found = sorted(glob.glob(os.path.join(directory, f"{pkg}_*.deb")))
        if not found:
            raise SystemExit(f"system tests: no {pkg}_*.deb in {directory}: run make deb")
        debs[pkg] = found[-1]
    return debs


def on_signal(signum, frame):
    raise SystemExit(f"system tests: interrupted by signal {signum}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="the build folder (root cache, logs)")
    ap.add_argument("--debs", help="where make deb put the .deb files (default BUILD/deb)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    work = os.path.join(build, "system")
    debs = find_debs(args.debs or os.path.join(build, "deb"))

    if os.geteuid() != 0:
        skip("not root (systemd-nspawn needs root): run as root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        skip(f"{', '.join(missing)} missing: make deps installs systemd-container, "
             "debootstrap, strace and gcc")
    os.makedirs(work, exist_ok=True)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    t0 = time.monotonic()
    with open(os.path.join(work, "debootstrap.log"), "a") as log:
        try:
            mirror = rootfs.apt_mirror()
            root, built = rootfs.ensure_root(work, mirror, rootfs.packages_for(debs.values()),
                                             log)
        except rootfs.Unavailable as e:
            skip(str(e))
    t_root = time.monotonic() - t0
    print(f"system tests: root {root} ({'debootstrapped' if built else 'cached'}, "
          f"{t_root:.0f} s)", flush=True)

    passed, failed, skipped = [], [], []
    nspawn_log = open(os.path.join(work, "nspawn.log"), "w")
    c = Container(root, work, nspawn_log)
    tracing = None
    try:
        t = time.monotonic()
        c.prepare()
        print(f"system tests: copied the root in {time.monotonic() - t:.1f} s", flush=True)
        t = time.monotonic()
        os.makedirs(c.path("/root/debs"), exist_ok=True)
        for path in debs.values():
            shutil.copy(path, c.path("/root/debs"))
        # Installing must not start services: the checks start them.
        with open(c.path("/usr/sbin/policy-rc.d"), "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(c.path("/usr/sbin/policy-rc.d"), 0o755)
        try:
            state = c.boot()
            tracing = syscalls.Tracing(c.pid1, os.path.join(work, "pid1.strace"))
        except (RuntimeError, TimeoutError, OSError) as e:
            nspawn_log.flush()
            with open(nspawn_log.name, errors="replace") as f:
                tail = "".join(f.readlines()[-20:])
            failed.append("boot")
            print(f"FAIL boot: {e}\n--- {nspawn_log.name} (last 20 lines) ---\n{tail}")
        else:
            print(f"system tests: container booted ({state}) in {time.monotonic() - t:.1f} s, "
                  f"PID1 is host PID {c.pid1}, given {', '.join(c.capabilities) or 'nothing'}"
                  + (f" ({', '.join(c.missing)}: not in this runner's bounding set)"
                     if c.missing else ""), flush=True)
            run_checks(c, debs, passed, failed, skipped, tracing)
            tracing.pause()
            check_syscalls(c, tracing.logs, passed, failed)
            with open(os.path.join(work, "journal.log"), "w") as f:
                f.write(c.run(["journalctl", "--no-pager", "-b", "-o", "short-monotonic"],
                              check=False).stdout)
            if failed:
                tail = c.run(["journalctl", "--no-pager", "-b", "-u", UNIT, "-n", "40"],
                             check=False).stdout
                print("--- journal of wcached.service (last 40 lines; all of the boot's in "
                      f"{work}/journal.log) ---\n" + tail, flush=True)
    finally:
        t = time.monotonic()
        if tracing is not None:
            tracing.pause()
        c.close()
        nspawn_log.close()
        print(f"system tests: container removed in {time.monotonic() - t:.1f} s", flush=True)
    return finish(t0, t_root, passed, failed, skipped)


def run_checks(c, debs, passed, failed, skipped, tracing):
    """Runs Checks.ORDER, each followed by the daemon's invariant, printing
    a line each and appending its name to PASSED, FAILED or SKIPPED. TRACING
    (the strace of PID1) pauses for the checks in Checks.UNTRACED."""
    checks = Checks(c, [os.path.basename(p) for p in debs.values()])
    for name in Checks.ORDER:
        t = time.monotonic()
        try:
            if name in Checks.UNTRACED:
                tracing.pause()
            try:
                detail = getattr(checks, name)()
            except Skipped as e:
                detail = e
            finally:
                tracing.resume()
            if name not in Checks.NO_INVARIANT:
                checks.invariant()
        except (Failure, RuntimeError, TimeoutError, OSError) as e:
            failed.append(name)
            print(f"FAIL {name}: {e}", flush=True)
            # Later checks build on these two: without them the rest
            # would only repeat the failure.
            if name in ("install", "socket_activation"):
                return
            continue
        except Exception:
            failed.append(name)
            print(f"FAIL {name}: {traceback.format_exc()}", flush=True)
            continue
        if isinstance(detail, Skipped):
            skipped.append(name)
            print(f"skip {name} ({time.monotonic() - t:.1f} s): {detail}", flush=True)
            continue
        passed.append(name)
        print(f"ok   {name} ({time.monotonic() - t:.1f} s{'; ' + detail if detail else ''})",
              flush=True)


def check_syscalls(c, log_paths, passed, failed):
    """Every call the daemon made (LOG_PATHS, the strace of PID1) is one the
    unit's filter permits, or a known probe (syscalls.PROBES), and none is
    answered ENOSYS but a probe or one glibc falls back from
    (syscalls.FALLBACKS)."""
    name = "syscall_filter"
    try:
        allow, names = syscalls.unit_filter(c, UNIT)
        calls = syscalls.daemon_calls(log_paths)
        if not calls:
            raise Failure(f"the strace of PID1 shows no wcached process ({', '.join(log_paths)})")
        bad = syscalls.refused(calls, allow, names)
        probes = {n: bad.pop(n) for n in list(bad)
                  if n in syscalls.PROBES.values() or
                  (n.startswith("syscall_") and int(n[8:]) in syscalls.PROBES)}
        if bad:
            raise Failure("the unit's filter refuses calls wcached makes: " + ", ".join(
                f"{n} ({k}x)" for n, k in sorted(bad.items())))
        enosys = {n: k for n, k in syscalls.failed_with(calls, "ENOSYS").items()
                  if n not in probes and n not in syscalls.FALLBACKS}
        if enosys:
            raise Failure("calls wcached makes are answered ENOSYS under the unit (a sandbox "
                          "setting takes them away): " + ", ".join(
                              f"{n} ({k}x)" for n, k in sorted(enosys.items())))
    except (Failure, RuntimeError, OSError) as e:
        failed.append(name)
        print(f"FAIL {name}: {e}", flush=True)
        return
    passed.append(name)
    note = (", refused as expected: " + ", ".join(
        f"{n if n in syscalls.PROBES.values() else syscalls.PROBES[int(n[8:])]} ({k}x)"
        for n, k in probes.items()) if probes else "")
    fallbacks = syscalls.failed_with({n: calls[n] for n in syscalls.FALLBACKS if n in calls},
                                     "ENOSYS")
    note += (", ENOSYS where glibc falls back: " + ", ".join(
        f"{n} ({k}x)" for n, k in sorted(fallbacks.items())) if fallbacks else "")
    print(f"ok   {name} ({len(calls)} distinct calls, all permitted{note})", flush=True)


def finish(t0, t_root, passed, failed, skipped=()):
    print(f"system tests: {time.monotonic() - t0:.0f} s in all ({t_root:.0f} s for the root)")
    print(f"{len(passed)} passed, {len(failed)} failed"
          + (f", {len(skipped)} skipped ({', '.join(skipped)})" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
